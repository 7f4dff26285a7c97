/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Capabilities of sandbox root, inside its own user namespace: Docker's
 * default set without CAP_NET_RAW (docs/security.md promise 3, docs/design.md §4).
 *
 * Order in the clone child (the filter does not set no_new_privs, so loading
 * it needs CAP_SYS_ADMIN in the sandbox user namespace):
 *     ... mounts, pivot_root ...
 *     seccomp_filter_load()   needs CAP_SYS_ADMIN
 *     caps_apply_child()      needs CAP_SETPCAP; prctl and capset are allowed
 *     execveat(hutch-init)
 * Nothing that needs a dropped capability may run after caps_apply_child().
 *
 * Securebits stay at their default, so uid 0 in the sandbox regains exactly
 * the bounding set on every exec (and a setuid-root sudo gives it back to
 * sandbox root, never more).
 */

#include <errno.h>
#include <linux/capability.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/caps.h"
#include "util/macro.h"

#define CAP_BIT(c) (UINT64_C(1) << (c))

/* Docker's default list minus CAP_NET_RAW (raw sockets and AF_PACKET, a
 * rich source of kernel CVEs, and ARP/ICMP spoofing of peers). */
#define CAPS_SANDBOX_MASK                                                                          \
        (CAP_BIT(CAP_CHOWN) | CAP_BIT(CAP_DAC_OVERRIDE) | CAP_BIT(CAP_FOWNER) |                    \
         CAP_BIT(CAP_FSETID) | CAP_BIT(CAP_KILL) | CAP_BIT(CAP_SETGID) | CAP_BIT(CAP_SETUID) |     \
         CAP_BIT(CAP_SETPCAP) | CAP_BIT(CAP_NET_BIND_SERVICE) | CAP_BIT(CAP_SYS_CHROOT) |          \
         CAP_BIT(CAP_AUDIT_WRITE) | CAP_BIT(CAP_SETFCAP))

/* Capability numbers fit in the 64 bits of two capset() words; the kernel
 * answers EINVAL past CAP_LAST_CAP. */
#define CAPS_MAX 64

uint64_t caps_sandbox_mask(void) {
        return CAPS_SANDBOX_MASK;
}

/* Runs in the CLONE_VM child: raw syscalls and prctl() only, no allocation,
 * errno read right after each call. */
int caps_apply_child(bool no_new_privs) {
        const uint64_t mask = CAPS_SANDBOX_MASK;
        struct __user_cap_header_struct header = {
                .version = _LINUX_CAPABILITY_VERSION_3,
                .pid = 0,
        };
        struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};

        /* Bounding set first: dropping needs CAP_SETPCAP in the effective
         * set, which capset() below may be asked to narrow. Walk all 64 bits
         * rather than read /proc/sys/kernel/cap_last_cap (no file I/O here);
         * EINVAL means the kernel has no such capability. */
        for (unsigned cap = 0; cap < CAPS_MAX; cap++) {
                if (mask & CAP_BIT(cap))
                        continue;
                if (prctl(PR_CAPBSET_DROP, (unsigned long) cap, 0UL, 0UL, 0UL) < 0) {
                        if (errno == EINVAL)
                                break;
                        return -errno;
                }
        }

        /* Ambient caps would survive exec into a non-root uid. EINVAL: the
         * kernel predates ambient capabilities (< 4.3), nothing to clear. */
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0UL, 0UL, 0UL) < 0 && errno != EINVAL)
                return -errno;

        /* Effective = permitted = the mask; inheritable stays empty, as in
         * Docker since CVE-2022-24769: a non-empty inheritable set would let a
         * non-root sandbox user gain capabilities from a file with inheritable
         * file capabilities. */
        for (unsigned i = 0; i < _LINUX_CAPABILITY_U32S_3; i++) {
                uint32_t word = (uint32_t) (mask >> (32 * i));
                data[i].effective = word;
                data[i].permitted = word;
                data[i].inheritable = 0;
        }
        if (syscall(SYS_capset, &header, data) < 0)
                return -errno;

        if (no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1UL, 0UL, 0UL, 0UL) < 0)
                return -errno;

        return 0;
}
