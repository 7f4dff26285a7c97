/* SPDX-License-Identifier: Apache-2.0 */
/* The seccomp program compiled at build time, and loading it. */
#include <errno.h>
#include <linux/seccomp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/seccomp.h"

extern const unsigned short hutch_seccomp_filter_len;
extern const struct sock_filter hutch_seccomp_filter[];

int seccomp_filter_get(const struct sock_fprog **ret, hutch_error *err) {
        static struct sock_fprog prog;
        prog.len = hutch_seccomp_filter_len;
        prog.filter = (struct sock_filter *) hutch_seccomp_filter;
        *ret = &prog;
        return 0;
}

int seccomp_filter_load(const struct sock_fprog *prog) {
        if (!prog || !prog->filter)
                return -EINVAL;
        /* No SECCOMP_FILTER_FLAG_TSYNC: the child is single-threaded. Raw
         * syscall: this runs in the CLONE_VM child. */
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog) < 0)
                return -errno;
        return 0;
}
