/* SPDX-License-Identifier: Apache-2.0 */
/* The one home of raw syscalls that glibc 2.36 does not wrap (docs/style.md). */
#pragma once

#include <linux/mount.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

long sys_clone3(struct clone_args *args, size_t size);
int sys_pidfd_open(pid_t pid, unsigned flags);
int sys_pidfd_send_signal(int pidfd, int sig, siginfo_t *info, unsigned flags);
int sys_open_tree(int dfd, const char *path, unsigned flags);
int sys_mount_setattr(int dfd, const char *path, unsigned flags, struct mount_attr *attr, size_t size);
int sys_move_mount(int from_dfd, const char *from_path, int to_dfd, const char *to_path, unsigned flags);
int sys_fsopen(const char *fsname, unsigned flags);
int sys_fsconfig(int fd, unsigned cmd, const char *key, const void *value, int aux);
int sys_fsmount(int fd, unsigned flags, unsigned attr_flags);
int sys_close_range(unsigned first, unsigned last, unsigned flags);
int sys_openat2(int dfd, const char *path, struct open_how *how, size_t size);
int sys_pivot_root(const char *new_root, const char *put_old);
int sys_quotactl_fd(int fd, unsigned cmd, int id, void *addr);
int sys_memfd_create(const char *name, unsigned flags);
/* ioprio_set(IOPRIO_WHO_PROCESS, 0, class << 13 | level) for the caller. */
int sys_ioprio_set_self(int ioprio_class, int level);
