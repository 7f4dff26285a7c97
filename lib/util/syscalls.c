/* SPDX-License-Identifier: Apache-2.0 */
#include <unistd.h>

#include "util/syscalls.h"

#ifndef SYS_quotactl_fd
#define SYS_quotactl_fd 443
#endif

long sys_clone3(struct clone_args *args, size_t size) {
        return syscall(SYS_clone3, args, size);
}
int sys_pidfd_open(pid_t pid, unsigned flags) {
        return (int) syscall(SYS_pidfd_open, pid, flags);
}
int sys_pidfd_send_signal(int pidfd, int sig, siginfo_t *info, unsigned flags) {
        return (int) syscall(SYS_pidfd_send_signal, pidfd, sig, info, flags);
}
int sys_open_tree(int dfd, const char *path, unsigned flags) {
        return (int) syscall(SYS_open_tree, dfd, path, flags);
}
int sys_mount_setattr(int dfd, const char *path, unsigned flags, struct mount_attr *attr, size_t size) {
        return (int) syscall(SYS_mount_setattr, dfd, path, flags, attr, size);
}
int sys_move_mount(int from_dfd, const char *from_path, int to_dfd, const char *to_path, unsigned flags) {
        return (int) syscall(SYS_move_mount, from_dfd, from_path, to_dfd, to_path, flags);
}
int sys_fsopen(const char *fsname, unsigned flags) {
        return (int) syscall(SYS_fsopen, fsname, flags);
}
int sys_fsconfig(int fd, unsigned cmd, const char *key, const void *value, int aux) {
        return (int) syscall(SYS_fsconfig, fd, cmd, key, value, aux);
}
int sys_fsmount(int fd, unsigned flags, unsigned attr_flags) {
        return (int) syscall(SYS_fsmount, fd, flags, attr_flags);
}
int sys_close_range(unsigned first, unsigned last, unsigned flags) {
        return (int) syscall(SYS_close_range, first, last, flags);
}
int sys_openat2(int dfd, const char *path, struct open_how *how, size_t size) {
        return (int) syscall(SYS_openat2, dfd, path, how, size);
}
int sys_pivot_root(const char *new_root, const char *put_old) {
        return (int) syscall(SYS_pivot_root, new_root, put_old);
}
int sys_quotactl_fd(int fd, unsigned cmd, int id, void *addr) {
        return (int) syscall(SYS_quotactl_fd, fd, cmd, id, addr);
}
int sys_memfd_create(const char *name, unsigned flags) {
        return (int) syscall(SYS_memfd_create, name, flags);
}
int sys_ioprio_set_self(int ioprio_class, int level) {
        return (int) syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, ioprio_class << 13 | level);
}
