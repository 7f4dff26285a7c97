/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gvisor relay's seccomp filter (docs/security.md, "The relay's
 * filter"). The relay (init/relay.c) is the host process that parses the
 * mux frames coming out of a gVisor sandbox; a compromised hutch-init can
 * send it anything, so once its set-up is done it keeps only the system
 * calls its loop makes, with their arguments narrowed where the loop's use
 * allows.
 *
 * The list was derived from strace of relays through a gvisor sandbox's
 * whole life (create, commands, stdin, pty, files, watch, metrics, egress
 * connections, pause/resume, snapshot, fork, restore, kill, a daemon
 * restart), and checked against what musl (static, 1.2) calls under the
 * relay's functions: mallocng (brk, mmap, munmap, mremap, madvise, mprotect
 * of its metadata pages), stdio on stderr (writev), posix_openpt/
 * unlockpt/ptsname_r/tcgetattr/tcsetattr (open, ioctl), sleep (nanosleep).
 *
 * Anything else kills the relay (SECCOMP_RET_KILL_PROCESS), not EPERM: the
 * relay's answer to anything unexpected from the guest is already to end
 * (and runsc with it, by PR_SET_PDEATHSIG), a relay that carries on after a
 * refused call would be one running code nobody meant it to run, and a kill
 * is loud (the kernel logs it; the sandbox stops answering) where an errno
 * would be a quiet misbehaviour. Foreign ABIs are killed by a prefix of our
 * own, as in seccomp.c.
 *
 * Compiled at build time by seccomp-gen --relay into a C array that
 * hutch-init's static binary carries (init/relay-seccomp.h); the relay loads
 * it with one raw seccomp() call after its set-up, before it reads a byte
 * of the guest's.
 */

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <seccomp.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "sandbox/seccomp-internal.h"
#include "sandbox/seccomp.h"
#include "util/error.h"
#include "util/macro.h"

/* Allowed without argument checks: what the relay's loop does with the
 * descriptors it holds (init/relay.c, init/muxlink.c, lib/util/fdutil.c). */
static const char *const relay_allowed[] = {
        /* the loop */
        "epoll_pwait", /* musl's epoll_wait */
        "epoll_ctl",
        "read",
        "write",
        "writev",   /* musl's stdio: the relay's messages on stderr */
        "pwrite64", /* disk-used */
        "lseek",    /* a FILE stream rewound before it is passed on */
        "fstat",    /* oom-kills' size */
        "close",
        /* clients on the control socket, and the descriptors passed to them */
        "accept4",
        "recvmsg",
        "sendmsg",
        "shutdown",
        /* OUT and IN streams */
        "pipe2",
        /* an egress connection, inside the relay's own network namespace
         * (loopback and the daemon's proxy listener only) */
        "connect",
        /* runsc's processes: reaped (the relay is their subreaper) */
        "wait4",
        "exit_group",
        /* memory (mmap and mprotect are below: never executable) */
        "brk",
        "munmap",
        "mremap",
        "madvise",
        /* loop_run's back-off (sleep); restart_syscall resumes it after a stop */
        "nanosleep",
        "restart_syscall",
};

/* Exact values compared on an argument's low 32 bits (the kernel reads
 * these arguments as int or unsigned int). */
typedef struct RelayArgRule {
        const char *name;
        unsigned arg;
        uint32_t values[4];
        size_t n_values;
} RelayArgRule;

static const RelayArgRule relay_arg_rules[] = {
        /* O_NONBLOCK on the descriptors it pumps, FD_CLOEXEC on fds 3 and 4 */
        { "fcntl", 1, { F_GETFL, F_SETFL, F_SETFD }, 3 },
        /* a PTY stream: unlockpt, ptsname_r, tcgetattr, tcsetattr(TCSANOW) */
        { "ioctl", 1, { TIOCSPTLCK, TIOCGPTN, TCGETS, TCSETS }, 4 },
        /* an egress connection is TCP over IPv4 loopback */
        { "socket", 0, { AF_INET }, 1 },
};

/* A bit of an argument that must be clear (compared on the low 32 bits). */
typedef struct RelayMaskRule {
        const char *name;
        unsigned arg;
        uint32_t must_be_clear;
} RelayMaskRule;

static const RelayMaskRule relay_mask_rules[] = {
        /* Nothing executable is ever mapped after start (W^X for the relay). */
        { "mmap", 2, PROT_EXEC },
        { "mprotect", 2, PROT_EXEC },
        /* open: the pty's master and slave (posix_openpt, ptsname);
         * openat: O_TMPFILE files in the scratch dir. Nothing is created by
         * name or truncated: oom-kills and disk-used are opened at set-up. */
        { "open", 1, O_CREAT | O_TRUNC },
        { "openat", 2, O_CREAT | O_TRUNC },
};

static inline void seccomp_releasep(scmp_filter_ctx *ctx) {
        if (*ctx)
                seccomp_release(*ctx);
}

static int relay_resolve(const char *name, hutch_error *err) {
        int nr = seccomp_syscall_resolve_name(name);
        if (nr < 0)
                return hutch_error_set(err, -ENOENT, "seccomp (relay): %s is unknown on this arch",
                                       name);
        return nr;
}

static int relay_add_rules(scmp_filter_ctx ctx, hutch_error *err) {
        int nr, r;

        for (size_t i = 0; i < ELEMENTSOF(relay_allowed); i++) {
                if ((nr = relay_resolve(relay_allowed[i], err)) < 0)
                        return nr;
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
                if (r < 0)
                        return hutch_error_set(err, r, "seccomp (relay): allowing %s: %s",
                                               relay_allowed[i], strerror(-r));
        }

        for (size_t i = 0; i < ELEMENTSOF(relay_arg_rules); i++) {
                const RelayArgRule *a = &relay_arg_rules[i];
                if ((nr = relay_resolve(a->name, err)) < 0)
                        return nr;
                for (size_t v = 0; v < a->n_values; v++) {
                        struct scmp_arg_cmp cmp = { .arg = a->arg,
                                                    .op = SCMP_CMP_MASKED_EQ,
                                                    .datum_a = 0xffffffffu,
                                                    .datum_b = a->values[v] };
                        r = seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, &cmp);
                        if (r < 0)
                                return hutch_error_set(err, r, "seccomp (relay): allowing %s: %s",
                                                       a->name, strerror(-r));
                }
        }

        for (size_t i = 0; i < ELEMENTSOF(relay_mask_rules); i++) {
                const RelayMaskRule *m = &relay_mask_rules[i];
                if ((nr = relay_resolve(m->name, err)) < 0)
                        return nr;
                struct scmp_arg_cmp cmp = { .arg = m->arg,
                                            .op = SCMP_CMP_MASKED_EQ,
                                            .datum_a = m->must_be_clear,
                                            .datum_b = 0 };
                r = seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, &cmp);
                if (r < 0)
                        return hutch_error_set(err, r, "seccomp (relay): allowing %s: %s", m->name,
                                               strerror(-r));
        }

        /* setsockopt(TCP_NODELAY) on an egress connection, getsockopt(SO_ERROR)
         * once its non-blocking connect finished. */
        if ((nr = relay_resolve("setsockopt", err)) < 0)
                return nr;
        r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 2,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, IPPROTO_TCP),
                             SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, TCP_NODELAY));
        if (r < 0)
                return hutch_error_set(err, r, "seccomp (relay): allowing setsockopt: %s",
                                       strerror(-r));
        if ((nr = relay_resolve("getsockopt", err)) < 0)
                return nr;
        r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 2,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, SOL_SOCKET),
                             SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, SO_ERROR));
        if (r < 0)
                return hutch_error_set(err, r, "seccomp (relay): allowing getsockopt: %s",
                                       strerror(-r));
        return 0;
}

/* Before libseccomp's program: another audit arch, and on x86_64 any
 * number with __X32_SYSCALL_BIT, kill the process (libseccomp checks the
 * same; this keeps the rule independent of its code generator). */
enum {
        RPREFIX_LD_ARCH,
        RPREFIX_JEQ_ARCH,
        RPREFIX_LD_NR,
        RPREFIX_JGE_X32,
        RPREFIX_RET_KILL,
        RPREFIX_LEN, /* == first instruction of libseccomp's program */
};

static void relay_prefix_fill(struct sock_filter prefix[static RPREFIX_LEN]) {
        const struct sock_filter p[RPREFIX_LEN] = {
                [RPREFIX_LD_ARCH] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                             offsetof(struct seccomp_data, arch)),
                [RPREFIX_JEQ_ARCH] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SECCOMP_NATIVE_AUDIT_ARCH,
                                              0, RPREFIX_RET_KILL - RPREFIX_JEQ_ARCH - 1),
                [RPREFIX_LD_NR] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                           offsetof(struct seccomp_data, nr)),
#ifdef SECCOMP_X32_SYSCALL_BIT
                [RPREFIX_JGE_X32] = BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, SECCOMP_X32_SYSCALL_BIT, 0,
                                             RPREFIX_LEN - RPREFIX_JGE_X32 - 1),
#else
                [RPREFIX_JGE_X32] = BPF_JUMP(BPF_JMP | BPF_JA, RPREFIX_LEN - RPREFIX_JGE_X32 - 1, 0,
                                             0),
#endif
                [RPREFIX_RET_KILL] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        };

        memcpy(prefix, p, sizeof(p));
}

int seccomp_relay_filter_compile(struct sock_fprog *ret, hutch_error *err) {
        _cleanup_(seccomp_releasep) scmp_filter_ctx ctx = NULL;
        struct sock_filter *insns = NULL;
        size_t len = 0;
        int r;

        /* seccomp_init() adds the native arch only. */
        ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
        if (!ctx)
                return hutch_error_set(err, -ENOMEM, "seccomp (relay): seccomp_init failed");
        r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
        if (r < 0)
                return hutch_error_set(err, r, "seccomp (relay): setting the bad-arch action: %s",
                                       strerror(-r));
        /* The relay has set no_new_privs itself before it loads this. */
        r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
        if (r < 0)
                return hutch_error_set(err, r, "seccomp (relay): clearing NNP: %s", strerror(-r));

        r = relay_add_rules(ctx, err);
        if (r < 0)
                return r;
        r = seccomp_export_prefixed(ctx, RPREFIX_LEN, &insns, &len, err);
        if (r < 0)
                return r;
        relay_prefix_fill(insns);

        *ret = (struct sock_fprog) {
                .len = (unsigned short) len,
                .filter = insns,
        };
        return 0;
}
