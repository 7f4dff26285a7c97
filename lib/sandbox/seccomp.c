/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sandbox's seccomp filter (docs/security.md promise 3, docs/design.md §4).
 *
 * An allowlist: every syscall not named below answers deny_errno (EPERM in
 * normal builds, a distinctive value in test builds). The list starts from
 * the one Docker/moby and crun ship for a container whose root has Docker's
 * default capabilities, then removes what a hostile tenant has no business
 * calling (io_uring, modify_ldt, name_to_handle_at, adjtimex, ...). The
 * reasons for each refusal are in docs/security.md.
 *
 * The program is compiled once with libseccomp, exported to memory, and
 * prefixed with a few hand-written instructions (runc does the same in
 * patchbpf) for what libseccomp cannot say:
 *   - ioctl(TIOCSTI/TIOCLINUX) is refused by comparing the low 32 bits of the
 *     command only (the kernel truncates it to unsigned int, so high bits
 *     must not help a caller slip past). libseccomp refuses a conditional
 *     rule whose action equals the default action (-EACCES), so "allow ioctl
 *     except these two" cannot be written as rules.
 *   - syscall numbers above the newest one this file knows answer ENOSYS, so
 *     a future libc falls back the way it does on an older kernel instead of
 *     failing on EPERM (the bug Docker hit with clone3 and faccessat2).
 *   - foreign ABIs: another audit arch, and on x86_64 any number with
 *     __X32_SYSCALL_BIT, kill the process. libseccomp's own program checks
 *     the same, this makes the rule independent of its code generator.
 *
 * The loader runs in the clone child (CLONE_VM, no allocation): it only
 * calls seccomp(SECCOMP_SET_MODE_FILTER) on the cached program. It does not
 * set no_new_privs: the child still holds CAP_SYS_ADMIN in the sandbox user
 * namespace when it loads the filter, and caps_apply_child() runs afterwards
 * (prctl and capset are on the allowlist for that reason).
 */

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.h"
#include "sandbox/seccomp-internal.h"
#include "sandbox/seccomp.h"
#include "util/error.h"
#include "util/macro.h"

#ifndef TIOCLINUX
#define TIOCLINUX 0x541C
#endif

/* Newest syscall number this file has an opinion on (listns, Linux 6.19).
 * Since 424 every architecture but alpha shares one numbering. Anything
 * above answers ENOSYS; raise this when adding newer syscalls below. */
#define SECCOMP_NR_MAX_KNOWN 470

/* Any of these in clone()'s flags creates a namespace. CLONE_NEWTIME (0x80)
 * is not listed: clone() reads that bit as part of the exit signal (CSIGNAL),
 * only clone3() and unshare() take it, and both are refused outright. */
#define SECCOMP_CLONE_NEW_MASK                                                                     \
        (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |             \
         CLONE_NEWPID | CLONE_NEWNET)

/* Allowed without argument checks. x86_64 names; a name the running
 * libseccomp does not know on the native arch is skipped (missing means
 * denied, never allowed). */
static const char *const seccomp_allowed[] = {
        /* files and directories */
        "access",
        "chdir",
        "chmod",
        "chown",
        "close",
        "close_range",
        "copy_file_range",
        "creat",
        "dup",
        "dup2",
        "dup3",
        "faccessat",
        "faccessat2",
        "fadvise64",
        "fallocate",
        "fchdir",
        "fchmod",
        "fchmodat",
        "fchown",
        "fchownat",
        "fcntl",
        "fdatasync",
        "fgetxattr",
        "flistxattr",
        "flock",
        "fremovexattr",
        "fsetxattr",
        "fstat",
        "fstatfs",
        "fsync",
        "ftruncate",
        "futimesat",
        "getcwd",
        "getdents",
        "getdents64",
        "getxattr",
        "lchown",
        "lgetxattr",
        "link",
        "linkat",
        "listxattr",
        "llistxattr",
        "lremovexattr",
        "lseek",
        "lsetxattr",
        "lstat",
        "mkdir",
        "mkdirat",
        "mknod",
        "mknodat",
        "newfstatat",
        "open",
        "openat",
        "openat2",
        "pread64",
        "preadv",
        "preadv2",
        "pwrite64",
        "pwritev",
        "pwritev2",
        "read",
        "readahead",
        "readlink",
        "readlinkat",
        "readv",
        "removexattr",
        "rename",
        "renameat",
        "renameat2",
        "rmdir",
        "sendfile",
        "setxattr",
        "splice",
        "stat",
        "statfs",
        "statx",
        "symlink",
        "symlinkat",
        "sync",
        "sync_file_range",
        "syncfs",
        "tee",
        "truncate",
        "umask",
        "unlink",
        "unlinkat",
        "utime",
        "utimensat",
        "utimes",
        "vmsplice",
        "write",
        "writev",
        /* chroot needs CAP_SYS_CHROOT, which sandbox root keeps (Docker allows it too);
         * it only narrows the view inside the sandbox's own mount namespace. */
        "chroot",
        /* event and notification fds */
        "epoll_create",
        "epoll_create1",
        "epoll_ctl",
        "epoll_pwait",
        "epoll_pwait2",
        "epoll_wait",
        "eventfd",
        "eventfd2",
        "pipe",
        "pipe2",
        "inotify_add_watch",
        "inotify_init",
        "inotify_init1",
        "inotify_rm_watch",
        "poll",
        "ppoll",
        "pselect6",
        "select",
        "signalfd",
        "signalfd4",
        "timerfd_create",
        "timerfd_gettime",
        "timerfd_settime",
        /* Kernel AIO (io_setup & co.) is not here: fs.aio-max-nr is one
         * host-wide budget a single sandbox could exhaust. It answers ENOSYS
         * (below), and libaio users fall back to threads. */
        /* memory */
        "brk",
        "madvise",
        "membarrier",
        "memfd_create",
        "memfd_secret",
        "mincore",
        "mlock",
        "mlock2",
        "mlockall",
        "mmap",
        "mprotect",
        "mremap",
        "msync",
        "munlock",
        "munlockall",
        "munmap",
        "pkey_alloc",
        "pkey_free",
        "pkey_mprotect",
        "remap_file_pages",
        /* processes, threads, signals ("clone" is below, with its flags checked) */
        "arch_prctl",
        "execve",
        "execveat",
        "exit",
        "exit_group",
        "fork",
        "get_robust_list",
        "get_thread_area",
        "getpgid",
        "getpgrp",
        "getpid",
        "getppid",
        "getpriority",
        "getrusage",
        "getsid",
        "gettid",
        "kill",
        "pause",
        "pidfd_getfd",
        "pidfd_open",
        "pidfd_send_signal",
        "prctl",
        "prlimit64",
        "process_mrelease",
        "restart_syscall",
        "rseq",
        "rt_sigaction",
        "rt_sigpending",
        "rt_sigprocmask",
        "rt_sigqueueinfo",
        "rt_sigreturn",
        "rt_sigsuspend",
        "rt_sigtimedwait",
        "rt_tgsigqueueinfo",
        "set_robust_list",
        "set_thread_area",
        "set_tid_address",
        "setpgid",
        "setpriority",
        "setrlimit",
        "setsid",
        "sigaltstack",
        "tgkill",
        "tkill",
        "vfork",
        "wait4",
        "waitid",
        "getrlimit",
        /* tracing inside the sandbox: the pid namespace hides every process outside, and
         * hutch-init makes itself non-dumpable (Docker allows these since Linux 4.8, when
         * seccomp started re-checking syscalls after a tracer rewrote them). */
        "kcmp",
        "process_vm_readv",
        "process_vm_writev",
        "ptrace",
        /* credentials (capset/capget: caps_apply_child runs after the filter is loaded) */
        "capget",
        "capset",
        "getegid",
        "geteuid",
        "getgid",
        "getgroups",
        "getresgid",
        "getresuid",
        "getuid",
        "setfsgid",
        "setfsuid",
        "setgid",
        "setgroups",
        "setregid",
        "setresgid",
        "setresuid",
        "setreuid",
        "setuid",
        /* scheduling (real-time policies still need CAP_SYS_NICE, which is bounded away) */
        "getcpu",
        "ioprio_get",
        "ioprio_set",
        "sched_get_priority_max",
        "sched_get_priority_min",
        "sched_getaffinity",
        "sched_getattr",
        "sched_getparam",
        "sched_getscheduler",
        "sched_rr_get_interval",
        "sched_setaffinity",
        "sched_setattr",
        "sched_setparam",
        "sched_setscheduler",
        "sched_yield",
        /* time (reading and sleeping only) */
        "alarm",
        "clock_getres",
        "clock_gettime",
        "clock_nanosleep",
        "getitimer",
        "gettimeofday",
        "nanosleep",
        "setitimer",
        "time",
        "timer_create",
        "timer_delete",
        "timer_getoverrun",
        "timer_gettime",
        "timer_settime",
        "times",
        /* sockets ("socket" and "socketpair" are below, with the family checked) */
        "accept",
        "accept4",
        "bind",
        "connect",
        "getpeername",
        "getsockname",
        "getsockopt",
        "listen",
        "recvfrom",
        "recvmmsg",
        "recvmsg",
        "sendmmsg",
        "sendmsg",
        "sendto",
        "setsockopt",
        "shutdown",
        /* System V and POSIX IPC: the sandbox has its own IPC namespace */
        "mq_getsetattr",
        "mq_notify",
        "mq_open",
        "mq_timedreceive",
        "mq_timedsend",
        "mq_unlink",
        "msgctl",
        "msgget",
        "msgrcv",
        "msgsnd",
        "semctl",
        "semget",
        "semop",
        "semtimedop",
        "shmat",
        "shmctl",
        "shmdt",
        "shmget",
        /* misc */
        "futex",
        "futex_waitv",
        "getrandom",
        "ioctl",
        "sysinfo",
        "uname",
        /* stacking a further filter only narrows (and needs no_new_privs without
         * CAP_SYS_ADMIN); landlock likewise can only restrict its caller. */
        "seccomp",
        "landlock_add_rule",
        "landlock_create_ruleset",
        "landlock_restrict_self",
};

/* Syscalls newer than libseccomp 2.5.4, by number (shared by every arch but
 * alpha since 424). */
typedef struct SeccompRawSyscall {
        int nr;
        const char *name;
} SeccompRawSyscall;

static const SeccompRawSyscall seccomp_allowed_raw[] = {
        { 451, "cachestat" },    { 452, "fchmodat2" },     { 453, "map_shadow_stack" },
        { 454, "futex_wake" },   { 455, "futex_wait" },    { 456, "futex_requeue" },
        { 462, "mseal" },        { 463, "setxattrat" },    { 464, "getxattrat" },
        { 465, "listxattrat" },  { 466, "removexattrat" }, { 468, "file_getattr" },
        { 469, "file_setattr" },
};

/* Refused with ENOSYS rather than deny_errno: libc and tools treat ENOSYS
 * as "old kernel" and fall back (clone3 -> clone, whose flags the filter can
 * read; statmount/listmount/listns -> /proc/self/mountinfo and /proc). */
static const SeccompRawSyscall seccomp_enosys_raw[] = {
        { __NR_io_setup, "io_setup" },
        { __NR_io_destroy, "io_destroy" },
        { __NR_io_getevents, "io_getevents" },
        { __NR_io_submit, "io_submit" },
        { __NR_io_cancel, "io_cancel" },
        { __NR_io_pgetevents, "io_pgetevents" },
        { 435, "clone3" },
        { 457, "statmount" },
        { 458, "listmount" },
        { 470, "listns" },
};

/* Refused on purpose (deny_errno, by the default action). Not used to build
 * the filter: seccomp_filter_build() checks that none of these is allowed. */
static const char *const seccomp_refused[] = {
        /* namespaces and mounts */
        "unshare",
        "setns",
        "mount",
        "umount2",
        "pivot_root",
        "open_tree",
        "move_mount",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "quotactl",
        "quotactl_fd",
        "sethostname",
        "setdomainname",
        /* kernel attack surface without a sandbox use */
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "fanotify_init",
        "fanotify_mark",
        "modify_ldt",
        "uselib",
        "ustat",
        "sysfs",
        "_sysctl",
        "lookup_dcookie",
        "nfsservctl",
        /* the host: kernel image, modules, devices, time, logs, power */
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "get_kernel_syms",
        "query_module",
        "iopl",
        "ioperm",
        "swapon",
        "swapoff",
        "reboot",
        "acct",
        "syslog",
        "vhangup",
        "clock_settime",
        "clock_adjtime",
        "settimeofday",
        "adjtimex",
        /* file handles bypass path resolution (CVE-2014-3519, "shocker") */
        "open_by_handle_at",
        "name_to_handle_at",
        /* NUMA policy and other processes' memory (Docker: only with CAP_SYS_NICE/PTRACE) */
        "mbind",
        "migrate_pages",
        "move_pages",
        "set_mempolicy",
        "get_mempolicy",
        "set_mempolicy_home_node",
        "process_madvise",
};

static const SeccompRawSyscall seccomp_refused_raw[] = {
        { 459, "lsm_get_self_attr" },
        { 460, "lsm_set_self_attr" },
        { 461, "lsm_list_modules" },
        { 467, "open_tree_attr" },
};

/* Socket families a sandbox may open. AF_VSOCK reaches the hypervisor, AF_ALG
 * the kernel crypto API; the rest (AF_PACKET needs CAP_NET_RAW anyway, TIPC,
 * RDS, CAN, ...) are module-autoloaded attack surface with no sandbox use. */
static const int seccomp_socket_families[] = { AF_UNIX, AF_INET, AF_INET6, AF_NETLINK };

/* personality(2) values Docker allows: PER_LINUX, PER_LINUX32, UNAME26 with
 * either, and the 0xffffffff query. READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE and
 * friends are refused. */
static const uint32_t seccomp_personalities[] = { 0x0, 0x8, 0x20000, 0x20008, 0xffffffff };

static inline void seccomp_releasep(scmp_filter_ctx *ctx) {
        if (*ctx)
                seccomp_release(*ctx);
}

int seccomp_deny_errno(void) {
        return HUTCH_SECCOMP_DENY_ERRNO;
}

static int seccomp_resolve(const char *name) {
        int nr = seccomp_syscall_resolve_name(name);

        /* __NR_SCMP_ERROR for unknown names; other negatives are libseccomp's
         * pseudo-syscalls for names that do not exist on this arch. */
        return nr >= 0 ? nr : -ENOENT;
}

/* Which syscall numbers the rules allow, outright or on conditions. */
typedef struct SeccompAllowedSet {
        bool nr[SECCOMP_NR_MAX_KNOWN + 1];
} SeccompAllowedSet;

static void seccomp_allowed_set_add(SeccompAllowedSet *set, int nr) {
        if (nr >= 0 && nr <= SECCOMP_NR_MAX_KNOWN)
                set->nr[nr] = true;
}

static bool seccomp_allowed_set_has(const SeccompAllowedSet *set, int nr) {
        return nr >= 0 && nr <= SECCOMP_NR_MAX_KNOWN && set->nr[nr];
}

static int seccomp_check_tables(const SeccompAllowedSet *allowed, hutch_error *err) {
        for (size_t i = 0; i < ELEMENTSOF(seccomp_refused); i++)
                if (seccomp_allowed_set_has(allowed, seccomp_resolve(seccomp_refused[i])))
                        return hutch_error_set(err, -EINVAL,
                                               "seccomp: %s is both allowed and refused",
                                               seccomp_refused[i]);
        for (size_t i = 0; i < ELEMENTSOF(seccomp_refused_raw); i++)
                if (seccomp_allowed_set_has(allowed, seccomp_refused_raw[i].nr))
                        return hutch_error_set(err, -EINVAL,
                                               "seccomp: %s is both allowed and refused",
                                               seccomp_refused_raw[i].name);
        for (size_t i = 0; i < ELEMENTSOF(seccomp_enosys_raw); i++)
                if (seccomp_allowed_set_has(allowed, seccomp_enosys_raw[i].nr))
                        return hutch_error_set(err, -EINVAL,
                                               "seccomp: %s is both allowed and refused",
                                               seccomp_enosys_raw[i].name);
        return 0;
}

static int seccomp_add_rules(scmp_filter_ctx ctx, int deny_errno, SeccompAllowedSet *allowed,
                             hutch_error *err) {
        int r;

        for (size_t i = 0; i < ELEMENTSOF(seccomp_allowed); i++) {
                int nr = seccomp_resolve(seccomp_allowed[i]);
                if (nr < 0)
                        continue;
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
                if (r < 0)
                        return hutch_error_set(err, r, "seccomp: allowing %s: %s",
                                               seccomp_allowed[i], strerror(-r));
                seccomp_allowed_set_add(allowed, nr);
        }

        for (size_t i = 0; i < ELEMENTSOF(seccomp_allowed_raw); i++) {
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, seccomp_allowed_raw[i].nr, 0);
                if (r < 0)
                        return hutch_error_set(err, r, "seccomp: allowing %s: %s",
                                               seccomp_allowed_raw[i].name, strerror(-r));
                seccomp_allowed_set_add(allowed, seccomp_allowed_raw[i].nr);
        }

        /* ENOSYS differs from the default action, so these are real rules. */
        if (deny_errno != ENOSYS)
                for (size_t i = 0; i < ELEMENTSOF(seccomp_enosys_raw); i++) {
                        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), seccomp_enosys_raw[i].nr,
                                             0);
                        if (r < 0)
                                return hutch_error_set(err, r, "seccomp: refusing %s: %s",
                                                       seccomp_enosys_raw[i].name, strerror(-r));
                }

        /* clone() without any CLONE_NEW* flag. The kernel reads the low 32
         * bits only; a mask whose high word is zero ignores the high bits the
         * same way, so they can neither hide a flag nor cause a refusal. */
        r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, SECCOMP_CLONE_NEW_MASK, 0));
        if (r < 0)
                return hutch_error_set(err, r, "seccomp: allowing clone: %s", strerror(-r));
        seccomp_allowed_set_add(allowed, SCMP_SYS(clone));

        /* socket(family, ...) for the listed families; family is an int, so
         * compare its low 32 bits like the kernel does. */
        for (size_t i = 0; i < ELEMENTSOF(seccomp_socket_families); i++) {
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
                                     SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu,
                                             (scmp_datum_t) seccomp_socket_families[i]));
                if (r < 0)
                        return hutch_error_set(err, r, "seccomp: allowing socket: %s", strerror(-r));
        }
        seccomp_allowed_set_add(allowed, SCMP_SYS(socket));

        /* socketpair(): AF_UNIX only (AF_TIPC implements it too, and TIPC is
         * an autoloaded module with a history of remote and local CVEs). */
        r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socketpair), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, AF_UNIX));
        if (r < 0)
                return hutch_error_set(err, r, "seccomp: allowing socketpair: %s", strerror(-r));
        seccomp_allowed_set_add(allowed, SCMP_SYS(socketpair));

        for (size_t i = 0; i < ELEMENTSOF(seccomp_personalities); i++) {
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), 1,
                                     SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu,
                                             (scmp_datum_t) seccomp_personalities[i]));
                if (r < 0)
                        return hutch_error_set(err, r, "seccomp: allowing personality: %s",
                                               strerror(-r));
        }
        seccomp_allowed_set_add(allowed, SCMP_SYS(personality));

        return 0;
}

/* Instructions run before libseccomp's program; see the comment at the top.
 * Jumps are relative: jt/jf count the instructions to skip. */
enum {
        PREFIX_LD_ARCH,
        PREFIX_JEQ_ARCH,
        PREFIX_LD_NR,
        PREFIX_JEQ_IOCTL,
        PREFIX_LD_IOCTL_CMD,
        PREFIX_JEQ_TIOCSTI,
        PREFIX_JEQ_TIOCLINUX,
        PREFIX_JEQ_SKIPPED, /* nr -1: a tracer cancelled the syscall */
        PREFIX_JGE_X32,
        PREFIX_JGT_MAX_KNOWN,
        PREFIX_RET_ENOSYS,
        PREFIX_RET_DENY,
        PREFIX_RET_BADARCH,
        PREFIX_LEN, /* == first instruction of libseccomp's program */
};

#define PREFIX_TO(from, to) ((to) - (from) -1)

/* Low 32 bits of args[1] (the ioctl command). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SECCOMP_ARG1_LO_OFFSET offsetof(struct seccomp_data, args[1])
#else
#define SECCOMP_ARG1_LO_OFFSET (offsetof(struct seccomp_data, args[1]) + sizeof(uint32_t))
#endif

static void seccomp_prefix_fill(struct sock_filter prefix[static PREFIX_LEN], int deny_errno) {
        const struct sock_filter p[PREFIX_LEN] = {
                [PREFIX_LD_ARCH] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                            offsetof(struct seccomp_data, arch)),
                [PREFIX_JEQ_ARCH] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SECCOMP_NATIVE_AUDIT_ARCH,
                                             0, PREFIX_TO(PREFIX_JEQ_ARCH, PREFIX_RET_BADARCH)),
                [PREFIX_LD_NR] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                [PREFIX_JEQ_IOCTL] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0,
                                              PREFIX_TO(PREFIX_JEQ_IOCTL, PREFIX_JEQ_SKIPPED)),
                [PREFIX_LD_IOCTL_CMD] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SECCOMP_ARG1_LO_OFFSET),
                [PREFIX_JEQ_TIOCSTI] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI,
                                                PREFIX_TO(PREFIX_JEQ_TIOCSTI, PREFIX_RET_DENY), 0),
                [PREFIX_JEQ_TIOCLINUX] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX,
                                                  PREFIX_TO(PREFIX_JEQ_TIOCLINUX, PREFIX_RET_DENY),
                                                  PREFIX_TO(PREFIX_JEQ_TIOCLINUX, PREFIX_LEN)),
                [PREFIX_JEQ_SKIPPED] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, UINT32_MAX,
                                                PREFIX_TO(PREFIX_JEQ_SKIPPED, PREFIX_LEN), 0),
#ifdef SECCOMP_X32_SYSCALL_BIT
                [PREFIX_JGE_X32] = BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, SECCOMP_X32_SYSCALL_BIT,
                                            PREFIX_TO(PREFIX_JGE_X32, PREFIX_RET_BADARCH), 0),
#else
                [PREFIX_JGE_X32] = BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0),
#endif
                [PREFIX_JGT_MAX_KNOWN] = BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, SECCOMP_NR_MAX_KNOWN,
                                                  PREFIX_TO(PREFIX_JGT_MAX_KNOWN, PREFIX_RET_ENOSYS),
                                                  PREFIX_TO(PREFIX_JGT_MAX_KNOWN, PREFIX_LEN)),
                [PREFIX_RET_ENOSYS] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
                [PREFIX_RET_DENY] = BPF_STMT(BPF_RET | BPF_K,
                                             SECCOMP_RET_ERRNO |
                                                     ((uint32_t) deny_errno & SECCOMP_RET_DATA)),
                [PREFIX_RET_BADARCH] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        };

        memcpy(prefix, p, sizeof(p));
}

/* libseccomp 2.5 can only export to an fd; a memfd keeps it in memory. The
 * program lands after prefix_len free instructions, for the caller's own. */
int seccomp_export_prefixed(scmp_filter_ctx ctx, size_t prefix_len, struct sock_filter **ret_insns,
                            size_t *ret_len, hutch_error *err) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ struct sock_filter *insns = NULL;
        struct stat st;
        size_t len = 0;
        ssize_t n;
        int r;

        fd = memfd_create("hutch-seccomp", MFD_CLOEXEC);
        if (fd < 0)
                return hutch_error_set(err, negative_errno(), "seccomp: memfd_create: %m");

        r = seccomp_export_bpf(ctx, fd);
        if (r < 0)
                return hutch_error_set(err, r, "seccomp: exporting the filter: %s", strerror(-r));

        if (fstat(fd, &st) < 0)
                return hutch_error_set(err, negative_errno(), "seccomp: fstat: %m");
        if (st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) != 0)
                return hutch_error_set(err, -EINVAL, "seccomp: exported filter has odd size %lld",
                                       (long long) st.st_size);
        len = (size_t) st.st_size / sizeof(struct sock_filter);
        if (prefix_len + len > BPF_MAXINSNS)
                return hutch_error_set(err, -E2BIG, "seccomp: filter has %zu instructions, over %d",
                                       prefix_len + len, BPF_MAXINSNS);

        insns = calloc(prefix_len + len, sizeof(struct sock_filter));
        if (!insns)
                return hutch_error_set(err, -ENOMEM, "seccomp: out of memory");

        n = pread(fd, insns + prefix_len, len * sizeof(struct sock_filter), 0);
        if (n < 0)
                return hutch_error_set(err, negative_errno(), "seccomp: reading the filter: %m");
        if ((size_t) n != len * sizeof(struct sock_filter))
                return hutch_error_set(err, -EIO, "seccomp: short read of the filter");

        *ret_insns = TAKE_PTR(insns);
        *ret_len = prefix_len + len;
        return 0;
}

int seccomp_filter_compile(struct sock_fprog *ret, hutch_error *err) {
        _cleanup_(seccomp_releasep) scmp_filter_ctx ctx = NULL;
        struct sock_filter *insns = NULL;
        SeccompAllowedSet allowed = {};
        int deny_errno = seccomp_deny_errno();
        size_t len = 0;
        int r;

        if (deny_errno <= 0 || deny_errno > 4095)
                return hutch_error_set(err, -EINVAL, "seccomp: deny errno %d out of range",
                                       deny_errno);

        /* seccomp_init() adds the native arch only: no SCMP_ARCH_X86/X32. */
        ctx = seccomp_init(SCMP_ACT_ERRNO(deny_errno));
        if (!ctx)
                return hutch_error_set(err, -ENOMEM, "seccomp: seccomp_init failed");

        r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
        if (r < 0)
                return hutch_error_set(err, r, "seccomp: setting the bad-arch action: %s",
                                       strerror(-r));
        /* Not used by our own loader, but keeps the context truthful: the
         * engine decides about no_new_privs (caps_apply_child). */
        r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
        if (r < 0)
                return hutch_error_set(err, r, "seccomp: clearing NNP: %s", strerror(-r));
        /* A binary tree of syscall numbers instead of a linear scan. */
        r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
        if (r < 0)
                return hutch_error_set(err, r, "seccomp: setting the optimizer: %s", strerror(-r));

        /* Refuse to build a filter that allows something a refused table
         * names: an edit to one table must not silently reopen a refusal. */
        r = seccomp_add_rules(ctx, deny_errno, &allowed, err);
        if (r < 0)
                return r;
        r = seccomp_check_tables(&allowed, err);
        if (r < 0)
                return r;

        r = seccomp_export_prefixed(ctx, PREFIX_LEN, &insns, &len, err);
        if (r < 0)
                return r;

        seccomp_prefix_fill(insns, deny_errno);

        *ret = (struct sock_fprog) {
                .len = (unsigned short) len,
                .filter = insns,
        };
        return 0;
}
