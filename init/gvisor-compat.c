/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gvisor-compat.so: preloaded (/etc/ld.so.preload, written by hutch-init
 * under gVisor only) into the dynamically linked programs of a gvisor
 * sandbox. This runsc refuses AT_NO_AUTOMOUNT in statx(2) and fstatat(2)
 * with EINVAL, and coreutils' ls and stat pass it on every call, so the
 * first commands users type failed. There are no automount points in a
 * sandbox, so the flag changes nothing there: these wrappers drop it and
 * make the system call themselves.
 *
 * It runs inside the sandbox, in the sandbox's own processes, and changes
 * no boundary: the sentry still sees and checks every call. A program may
 * remove the preload (its own business); static programs never see it
 * (Go and musl binaries do not pass the flag).
 *
 * Built with the host's C compiler against the host's C library (the host
 * template's /usr), without the sanitizers of the build it belongs to.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef AT_NO_AUTOMOUNT
#define AT_NO_AUTOMOUNT 0x800
#endif

int statx(int dirfd, const char *restrict path, int flags, unsigned int mask, struct statx *restrict buf);
int statx(int dirfd, const char *restrict path, int flags, unsigned int mask, struct statx *restrict buf) {
        return (int) syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

int fstatat(int dirfd, const char *restrict path, struct stat *restrict st, int flags) {
        return (int) syscall(SYS_newfstatat, dirfd, path, st, flags & ~AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *restrict path, struct stat64 *restrict st, int flags);
int fstatat64(int dirfd, const char *restrict path, struct stat64 *restrict st, int flags) {
        return (int) syscall(SYS_newfstatat, dirfd, path, st, flags & ~AT_NO_AUTOMOUNT);
}
