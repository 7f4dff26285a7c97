/* SPDX-License-Identifier: Apache-2.0 */
/*
 * probe: one escape attempt per run, for the hostile tests (bubblewrap's
 * try-syscall.c is the model).
 *
 *     probe NAME [ARG]     run attempt NAME
 *     probe list           print every NAME with a one-line description
 *
 * Prints one line "NAME: errno N (strerror)" on stdout and exits with N:
 * 0 means the call succeeded, which in a hostile test is the failure. A
 * probe that runs its attempt in a child reports "NAME: killed by signal S
 * (SIGNAME)" and exits 128+S. read-file prints the file on stdout and its
 * status line on stderr. Usage errors exit 255.
 *
 * In test builds the sandbox's seccomp filter answers
 * HUTCH_SECCOMP_DENY_ERRNO, so a refusal by the filter is told apart from a
 * kernel that lacks a feature or refuses for another reason.
 *
 * Meant to run inside a sandbox. Every attempt is chosen so that running it
 * by mistake as host root does no lasting harm: invalid magic numbers and
 * flags where the call itself would act (reboot, kexec, modules, umount),
 * opens without writes (core_pattern, sysrq-trigger), a fresh UTS namespace
 * before sethostname, and so on. clock-settime and settimeofday set the
 * clock to the time just read.
 *
 * Static; glibc and kernel headers only.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/bpf.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/seccomp.h>
#include <linux/filter.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/quota.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef HUTCH_SECCOMP_DENY_ERRNO
#define HUTCH_SECCOMP_DENY_ERRNO 1
#endif

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef AF_ALG
#define AF_ALG 38
#endif
#ifndef AF_TIPC
#define AF_TIPC 30
#endif
#ifndef TIOCLINUX
#define TIOCLINUX 0x541C
#endif
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#define X32_SYSCALL_BIT 0x40000000UL
#define HIGH_BITS 0xffffffff00000000UL

/* Syscall numbers since 424 are shared by every architecture but alpha. */
#define NR_clone3 435
#define NR_open_tree 428
#define NR_move_mount 429
#define NR_fsopen 430
#define NR_fsconfig 431
#define NR_fsmount 432
#define NR_fspick 433
#define NR_pidfd_open 434
#define NR_pidfd_getfd 438
#define NR_mount_setattr 442
#define NR_landlock_create_ruleset 444
#define NR_fchmodat2 452
#define NR_statmount 457
#define NR_listmount 458
#define NR_lsm_list_modules 461
#define NR_listns 470
#ifdef __x86_64__
/* x86_64 only (Linux 6.11, 6.17); glibc 2.36's headers do not name them */
#define NR_uretprobe 335
#define NR_uprobe 336
#endif
#define NR_unknown 1000

#define PROBE_DIR "/tmp/hutch-probe"

static const char *probe_name = "probe";
static int probe_signal; /* set when the attempt ran in a child that a signal killed */
static FILE *status_stream;

static int err_of(long r) {
        return r < 0 ? errno : 0;
}

static void ensure_dir(const char *p) {
        (void) mkdir(PROBE_DIR, 0755);
        if (p)
                (void) mkdir(p, 0755);
}

/* Run fn in a forked child (for attempts that may kill the process or must
 * not change the probe itself) and turn its fate into an exit code. */
static int in_child(int (*fn)(void)) {
        int status;
        pid_t pid;

        fflush(NULL);
        pid = fork();
        if (pid < 0)
                return errno;
        if (pid == 0)
                _exit(fn() & 0xff);
        if (waitpid(pid, &status, 0) < 0)
                return errno;
        if (WIFSIGNALED(status)) {
                probe_signal = WTERMSIG(status);
                return 128 + probe_signal;
        }
        return WEXITSTATUS(status);
}

static long need_pid_arg(int argc, char **argv) {
        if (argc < 3) {
                fprintf(stderr, "%s: needs a pid argument\n", probe_name);
                exit(255);
        }
        return strtol(argv[2], NULL, 10);
}

static const char *need_path_arg(int argc, char **argv) {
        if (argc < 3) {
                fprintf(stderr, "%s: needs a path argument\n", probe_name);
                exit(255);
        }
        return argv[2];
}

/* ------------------------------------------------------------ namespaces */

static const struct {
        const char *suffix;
        unsigned long flag;
} ns_flags[] = {
        { "user", CLONE_NEWUSER },     { "net", CLONE_NEWNET },   { "mount", CLONE_NEWNS },
        { "pid", CLONE_NEWPID },       { "ipc", CLONE_NEWIPC },   { "uts", CLONE_NEWUTS },
        { "cgroup", CLONE_NEWCGROUP }, { "time", CLONE_NEWTIME }, { "files", CLONE_FILES },
};

static unsigned long ns_flag(const char *name, const char *prefix) {
        const char *suffix = name + strlen(prefix);
        for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]); i++)
                if (strcmp(ns_flags[i].suffix, suffix) == 0)
                        return ns_flags[i].flag;
        fprintf(stderr, "%s: unknown namespace\n", name);
        exit(255);
}

static int probe_unshare(int argc, char **argv) {
        return err_of(unshare((int) ns_flag(argv[1], "unshare-")));
}

/* Raw clone without a new stack: the child runs on a copy of ours, like fork. */
static int raw_clone(unsigned long flags) {
        long pid = syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, 0UL);
        if (pid < 0)
                return errno;
        if (pid == 0)
                syscall(SYS_exit_group, 0);
        (void) waitpid((pid_t) pid, NULL, 0);
        return 0;
}

static int probe_clone_new(int argc, char **argv) {
        const char *n = argv[1];
        bool high = strstr(n, "-highbits") != NULL;
        char base[64];

        snprintf(base, sizeof(base), "%s", n);
        if (high)
                *strstr(base, "-highbits") = '\0';
        /* clone() reads the low 32 bits of its flags: high bits must neither
         * hide a CLONE_NEW* flag from the filter nor matter to the kernel. */
        return raw_clone(ns_flag(base, "clone-new") | (high ? HIGH_BITS & ~0x80000000UL : 0));
}

static int probe_clone_plain(int argc, char **argv) {
        return raw_clone(0);
}

struct probe_clone_args {
        uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

static int probe_clone3(int argc, char **argv) {
        struct probe_clone_args args = { .exit_signal = SIGCHLD };
        long pid = syscall(NR_clone3, &args, sizeof(args));
        if (pid < 0)
                return errno;
        if (pid == 0)
                syscall(SYS_exit_group, 0);
        (void) waitpid((pid_t) pid, NULL, 0);
        return 0;
}

static int probe_clone3_newuser(int argc, char **argv) {
        struct probe_clone_args args = { .flags = CLONE_NEWUSER, .exit_signal = SIGCHLD };
        long pid = syscall(NR_clone3, &args, sizeof(args));
        if (pid < 0)
                return errno;
        if (pid == 0)
                syscall(SYS_exit_group, 0);
        (void) waitpid((pid_t) pid, NULL, 0);
        return 0;
}

static int probe_setns(int argc, char **argv) {
        bool user = strcmp(argv[1], "setns-user") == 0;
        const char *path = user ? "/proc/self/ns/user" : "/proc/self/ns/net";
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        /* The filter does not look at the fd: without one the call still
         * shows its verdict (the kernel alone would say EBADF). */
        if (fd < 0)
                fprintf(stderr, "%s: open %s: %s\n", argv[1], path, strerror(errno));
        return err_of(setns(fd, user ? CLONE_NEWUSER : CLONE_NEWNET));
}

/* ---------------------------------------------------------------- mounts */

static int probe_mount_tmpfs(int argc, char **argv) {
        ensure_dir(PROBE_DIR "/mnt");
        int r = err_of(mount("none", PROBE_DIR "/mnt", "tmpfs", 0, NULL));
        if (r == 0)
                (void) umount2(PROBE_DIR "/mnt", MNT_DETACH);
        return r;
}

static int probe_mount_bind(int argc, char **argv) {
        ensure_dir(PROBE_DIR "/bind");
        int r = err_of(mount("/", PROBE_DIR "/bind", NULL, MS_BIND | MS_REC, NULL));
        if (r == 0)
                (void) umount2(PROBE_DIR "/bind", MNT_DETACH);
        return r;
}

/* CVE-2022-0492: mount cgroup v1, write release_agent. We only open it. */
static int probe_mount_cgroup(int argc, char **argv) {
        ensure_dir(PROBE_DIR "/cg");
        if (mount("cgroup", PROBE_DIR "/cg", "cgroup", 0, "rdma") < 0)
                return errno;
        int fd = open(PROBE_DIR "/cg/release_agent", O_WRONLY | O_CLOEXEC);
        int r = fd < 0 ? errno : 0;
        fprintf(stderr, "%s: mounted; opening release_agent: %s\n", argv[1], strerror(r));
        if (fd >= 0)
                close(fd);
        (void) umount2(PROBE_DIR "/cg", MNT_DETACH);
        return 0;
}

static int probe_mount_cgroup2(int argc, char **argv) {
        ensure_dir(PROBE_DIR "/cg2");
        int r = err_of(mount("cgroup2", PROBE_DIR "/cg2", "cgroup2", 0, NULL));
        if (r == 0)
                (void) umount2(PROBE_DIR "/cg2", MNT_DETACH);
        return r;
}

static int probe_umount(int argc, char **argv) {
        return err_of(umount2(PROBE_DIR "/does-not-exist", MNT_EXPIRE));
}

static int probe_pivot_root(int argc, char **argv) {
        return err_of(syscall(SYS_pivot_root, PROBE_DIR "/nonexistent", PROBE_DIR "/nonexistent/old"));
}

static int probe_open_tree(int argc, char **argv) {
        long fd = syscall(NR_open_tree, AT_FDCWD, "/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        return err_of(fd);
}

static int probe_move_mount(int argc, char **argv) {
        return err_of(syscall(NR_move_mount, AT_FDCWD, PROBE_DIR "/none-a", AT_FDCWD,
                              PROBE_DIR "/none-b", 0));
}

static int probe_fsopen(int argc, char **argv) {
        return err_of(syscall(NR_fsopen, "tmpfs", FSOPEN_CLOEXEC));
}

static int probe_fsconfig(int argc, char **argv) {
        return err_of(syscall(NR_fsconfig, -1, FSCONFIG_CMD_CREATE, NULL, NULL, 0));
}

static int probe_fsmount(int argc, char **argv) {
        return err_of(syscall(NR_fsmount, -1, FSMOUNT_CLOEXEC, 0));
}

static int probe_fspick(int argc, char **argv) {
        return err_of(syscall(NR_fspick, AT_FDCWD, "/", FSPICK_CLOEXEC));
}

static int probe_mount_setattr(int argc, char **argv) {
        uint64_t attr[4] = { 0 }; /* struct mount_attr, MOUNT_ATTR_SIZE_VER0 */
        return err_of(syscall(NR_mount_setattr, AT_FDCWD, PROBE_DIR "/none", 0, attr, sizeof(attr)));
}

static int probe_statmount(int argc, char **argv) {
        uint64_t req[3] = { 24, 0, 0 }; /* struct mnt_id_req, size VER0 */
        char buf[512];
        return err_of(syscall(NR_statmount, req, buf, sizeof(buf), 0));
}

static int probe_listmount(int argc, char **argv) {
        uint64_t req[3] = { 24, 0, 0 };
        uint64_t ids[16];
        return err_of(syscall(NR_listmount, req, ids, 16, 0));
}

static int probe_listns(int argc, char **argv) {
        uint64_t req[4] = { 32, 0, 0, 0 };
        uint64_t ids[16];
        return err_of(syscall(NR_listns, req, ids, 16, 0));
}

static int probe_chroot(int argc, char **argv) {
        return err_of(chroot("/"));
}

/* The classic chroot breakout: chroot into a subdirectory while the cwd
 * stays outside, walk up, chroot("."). Inside a sandbox this must end at the
 * sandbox's root: then opening ARG (a host path) fails. */
static int probe_chroot_escape(int argc, char **argv) {
        const char *path = need_path_arg(argc, argv);
        char buf[4096];

        ensure_dir(PROBE_DIR "/jail");
        if (chdir("/") < 0 || chroot(PROBE_DIR "/jail") < 0)
                return errno;
        for (int i = 0; i < 64; i++)
                (void) chdir("..");
        if (chroot(".") < 0)
                return errno;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno;
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0)
                fwrite(buf, 1, (size_t) n, stdout);
        close(fd);
        return 0;
}

/* The same breakout, then create PATH and write a byte to it: what lies
 * outside the sandbox's root must be read-only (on gvisor: runsc's root,
 * the template's layers). */
static int probe_chroot_escape_write(int argc, char **argv) {
        const char *path = need_path_arg(argc, argv);

        ensure_dir(PROBE_DIR "/jail");
        if (chdir("/") < 0 || chroot(PROBE_DIR "/jail") < 0)
                return errno;
        for (int i = 0; i < 64; i++)
                (void) chdir("..");
        if (chroot(".") < 0)
                return errno;
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
                return errno;
        int r = write(fd, "x", 1) == 1 ? 0 : errno;
        close(fd);
        return r;
}

/* ------------------------------------------------------- kernel surfaces */

static int probe_keyctl(int argc, char **argv) {
        return err_of(syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
}

static int probe_add_key(int argc, char **argv) {
        return err_of(syscall(SYS_add_key, "user", "hutch-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING));
}

static int probe_request_key(int argc, char **argv) {
        return err_of(syscall(SYS_request_key, "user", "hutch-probe-none", NULL, 0));
}

static int probe_bpf(int argc, char **argv) {
        union bpf_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.map_type = BPF_MAP_TYPE_ARRAY;
        attr.key_size = 4;
        attr.value_size = 4;
        attr.max_entries = 1;
        return err_of(syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof(attr)));
}

static int probe_perf_event_open(int argc, char **argv) {
        struct perf_event_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.size = sizeof(attr);
        attr.type = PERF_TYPE_SOFTWARE;
        attr.config = PERF_COUNT_SW_CPU_CLOCK;
        attr.disabled = 1;
        attr.exclude_kernel = 1;
        attr.exclude_hv = 1;
        return err_of(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0UL));
}

static int probe_userfaultfd(int argc, char **argv) {
        return err_of(syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
}

static int probe_io_uring_setup(int argc, char **argv) {
        char params[120]; /* struct io_uring_params */
        memset(params, 0, sizeof(params));
        return err_of(syscall(SYS_io_uring_setup, 1, params));
}

static int probe_io_uring_enter(int argc, char **argv) {
        return err_of(syscall(SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0));
}

static int probe_io_uring_register(int argc, char **argv) {
        return err_of(syscall(SYS_io_uring_register, -1, 0, NULL, 0));
}

/* Invalid arch in the flags: the kernel refuses before acting. */
static int probe_kexec_load(int argc, char **argv) {
        return err_of(syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0xffff0000UL));
}

static int probe_kexec_file_load(int argc, char **argv) {
        return err_of(syscall(SYS_kexec_file_load, -1, -1, 0UL, "", ~0UL));
}

static int probe_init_module(int argc, char **argv) {
        return err_of(syscall(SYS_init_module, NULL, 0UL, ""));
}

static int probe_finit_module(int argc, char **argv) {
        return err_of(syscall(SYS_finit_module, -1, "", 0));
}

static int probe_delete_module(int argc, char **argv) {
        return err_of(syscall(SYS_delete_module, "hutch_probe_none", O_NONBLOCK));
}

static int probe_open_by_handle_at(int argc, char **argv) {
        struct {
                unsigned int handle_bytes;
                int handle_type;
                unsigned char f_handle[8];
        } h = { .handle_bytes = 8, .handle_type = 1 };
        return err_of(syscall(SYS_open_by_handle_at, AT_FDCWD, &h, O_RDONLY));
}

static int probe_name_to_handle_at(int argc, char **argv) {
        struct {
                unsigned int handle_bytes;
                int handle_type;
                unsigned char f_handle[128];
        } h = { .handle_bytes = 128 };
        int mount_id;
        return err_of(syscall(SYS_name_to_handle_at, AT_FDCWD, "/", &h, &mount_id, 0));
}

static int probe_clock_settime(int argc, char **argv) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return err_of(clock_settime(CLOCK_REALTIME, &ts));
}

static int probe_settimeofday(int argc, char **argv) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        return err_of(settimeofday(&tv, NULL));
}

static int probe_clock_adjtime(int argc, char **argv) {
        struct timex tx = { .modes = 0 };
        return err_of(syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx));
}

static int probe_adjtimex(int argc, char **argv) {
        struct timex tx = { .modes = 0 };
        return err_of(adjtimex(&tx));
}

static int probe_personality(int argc, char **argv) {
        unsigned long p = strcmp(argv[1], "personality-addr-no-randomize") == 0 ? ADDR_NO_RANDOMIZE
                                                                                : READ_IMPLIES_EXEC;
        return err_of(personality(p));
}

static int probe_personality_query(int argc, char **argv) {
        return err_of(personality(0xffffffffUL));
}

static int probe_swapon(int argc, char **argv) {
        return err_of(swapon(PROBE_DIR "/no-swapfile", 0));
}

static int probe_swapoff(int argc, char **argv) {
        return err_of(swapoff(PROBE_DIR "/no-swapfile"));
}

/* Wrong magic numbers: refused after the capability check, before acting. */
static int probe_reboot(int argc, char **argv) {
        return err_of(syscall(SYS_reboot, 0, 0, 0, NULL));
}

static int probe_syslog(int argc, char **argv) {
        return err_of(klogctl(10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0));
}

static int probe_acct(int argc, char **argv) {
        return err_of(acct(PROBE_DIR "/no-such-dir/acct"));
}

static int probe_quotactl(int argc, char **argv) {
        struct dqinfo info;
        return err_of(quotactl(QCMD(Q_GETINFO, USRQUOTA), "/dev/null", 0, (caddr_t) &info));
}

static int probe_lookup_dcookie(int argc, char **argv) {
#ifdef SYS_lookup_dcookie
        char buf[64];
        return err_of(syscall(SYS_lookup_dcookie, 0UL, buf, sizeof(buf)));
#else
        return ENOSYS;
#endif
}

static int probe_fanotify_init(int argc, char **argv) {
        return err_of(fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC, O_RDONLY));
}

static int probe_set_mempolicy(int argc, char **argv) {
        return err_of(syscall(SYS_set_mempolicy, 0 /* MPOL_DEFAULT */, NULL, 0UL));
}

static int probe_mbind(int argc, char **argv) {
        return err_of(syscall(SYS_mbind, NULL, 0UL, 0, NULL, 0UL, 0U));
}

static int probe_migrate_pages(int argc, char **argv) {
        return err_of(syscall(SYS_migrate_pages, 0, 0UL, NULL, NULL));
}

static int probe_move_pages(int argc, char **argv) {
        return err_of(syscall(SYS_move_pages, 0, 0UL, NULL, NULL, NULL, 0));
}

static int probe_lsm_list_modules(int argc, char **argv) {
        uint64_t ids[16];
        uint32_t size = sizeof(ids);
        return err_of(syscall(NR_lsm_list_modules, ids, &size, 0));
}

#ifdef __x86_64__
static int probe_iopl(int argc, char **argv) {
        return err_of(syscall(SYS_iopl, 3));
}

static int probe_ioperm(int argc, char **argv) {
        return err_of(syscall(SYS_ioperm, 0x80UL, 1UL, 1));
}

static int probe_modify_ldt(int argc, char **argv) {
        char buf[16];
        return err_of(syscall(SYS_modify_ldt, 0, buf, sizeof(buf)));
}
#endif

/* In a child with no controlling terminal, so nothing is hung up. */
static int vhangup_child(void) {
        (void) setsid();
        return err_of(vhangup());
}

static int probe_vhangup(int argc, char **argv) {
        return in_child(vhangup_child);
}

/* In a child that first tries a new UTS namespace, so host root running
 * this by mistake renames nothing. */
static int sethostname_child(void) {
        if (unshare(CLONE_NEWUTS) < 0 && getuid() == 0 && errno != HUTCH_SECCOMP_DENY_ERRNO &&
            errno != EPERM)
                return errno;
        return err_of(sethostname("hutch-probe", 11));
}

static int probe_sethostname(int argc, char **argv) {
        return in_child(sethostname_child);
}

/* ---------------------------------------------------------------- ttys */

static int probe_tty_fd(void) {
        char name[128];
        int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0 &&
            ptsname_r(master, name, sizeof(name)) == 0) {
                int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
                if (slave >= 0)
                        return slave;
        }
        /* No pty: the filter does not look at the fd, so any fd still shows
         * its verdict (the kernel alone would say ENOTTY). */
        fprintf(stderr, "%s: no pty (%s), using /dev/null\n", probe_name, strerror(errno));
        return open("/dev/null", O_RDWR | O_CLOEXEC);
}

static int probe_ioctl(unsigned long cmd, void *arg) {
        int fd = probe_tty_fd();
        if (fd < 0)
                return errno;
        return err_of(syscall(SYS_ioctl, fd, cmd, arg));
}

static int probe_tiocsti(int argc, char **argv) {
        char c = '\n';
        bool high = strstr(argv[1], "highbits") != NULL;
        return probe_ioctl((unsigned long) TIOCSTI | (high ? HIGH_BITS : 0), &c);
}

static int probe_tioclinux(int argc, char **argv) {
        char sub = 6; /* TIOCL_GETSHIFTSTATE */
        bool high = strstr(argv[1], "highbits") != NULL;
        return probe_ioctl((unsigned long) TIOCLINUX | (high ? HIGH_BITS : 0), &sub);
}

static int probe_tiocgwinsz(int argc, char **argv) {
        struct winsize ws;
        bool high = strstr(argv[1], "highbits") != NULL;
        return probe_ioctl((unsigned long) TIOCGWINSZ | (high ? HIGH_BITS : 0), &ws);
}

/* --------------------------------------------------------------- sockets */

static int probe_socket_family(int family, int type, bool high) {
        unsigned long f = (unsigned long) (unsigned) family | (high ? HIGH_BITS : 0);
        long fd = syscall(SYS_socket, f, type | SOCK_CLOEXEC, 0);
        return err_of(fd);
}

static int probe_socket(int argc, char **argv) {
        const char *n = argv[1] + strlen("socket-");
        bool high = strstr(n, "-highbits") != NULL;

        if (strncmp(n, "vsock", 5) == 0)
                return probe_socket_family(AF_VSOCK, SOCK_STREAM, high);
        if (strncmp(n, "alg", 3) == 0)
                return probe_socket_family(AF_ALG, SOCK_SEQPACKET, high);
        if (strcmp(n, "packet") == 0)
                return probe_socket_family(AF_PACKET, SOCK_DGRAM, false);
        if (strcmp(n, "tipc") == 0)
                return probe_socket_family(AF_TIPC, SOCK_RDM, false);
        if (strcmp(n, "unix") == 0)
                return probe_socket_family(AF_UNIX, SOCK_STREAM, false);
        if (strcmp(n, "inet") == 0)
                return probe_socket_family(AF_INET, SOCK_STREAM, false);
        if (strcmp(n, "inet6") == 0)
                return probe_socket_family(AF_INET6, SOCK_STREAM, false);
        if (strcmp(n, "netlink") == 0) {
                long fd = syscall(SYS_socket, AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0 /* ROUTE */);
                return err_of(fd);
        }
        fprintf(stderr, "%s: unknown family\n", argv[1]);
        exit(255);
}

static int probe_socketpair(int argc, char **argv) {
        int sv[2];
        int family = strcmp(argv[1], "socketpair-tipc") == 0 ? AF_TIPC : AF_UNIX;
        return err_of(socketpair(family, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
}

/* ------------------------------------------------------ other processes */

static int probe_ptrace_pid(int argc, char **argv) {
        pid_t pid = (pid_t) need_pid_arg(argc, argv);
        if (ptrace(PTRACE_ATTACH, pid, NULL, NULL) < 0)
                return errno;
        (void) waitpid(pid, NULL, __WALL);
        (void) ptrace(PTRACE_DETACH, pid, NULL, NULL);
        return 0;
}

static int probe_kill_pid(int argc, char **argv) {
        pid_t pid = (pid_t) need_pid_arg(argc, argv);
        return err_of(kill(pid, 0));
}

/* With a child of our own to hit, so that the call has a target and
 * returns 0 (kill(-1) skips the caller and the namespace's init). */
static int probe_kill_all(int argc, char **argv) {
        pid_t child = fork();
        if (child < 0)
                return errno;
        if (child == 0) {
                pause();
                _exit(0);
        }
        int r = err_of(kill(-1, SIGKILL));
        (void) waitpid(child, NULL, 0);
        return r;
}

static int probe_process_vm_readv(int argc, char **argv) {
        pid_t pid = argc >= 3 ? (pid_t) strtol(argv[2], NULL, 10) : getpid();
        static char src[16] = "hutch", dst[16];
        struct iovec local = { dst, sizeof(dst) }, remote = { src, sizeof(src) };
        return err_of(process_vm_readv(pid, &local, 1, &remote, 1, 0));
}

static int probe_pidfd_getfd(int argc, char **argv) {
        long pidfd = syscall(NR_pidfd_open, getpid(), 0);
        if (pidfd < 0)
                return errno;
        return err_of(syscall(NR_pidfd_getfd, (int) pidfd, 0, 0));
}

static int probe_kcmp(int argc, char **argv) {
        return err_of(syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0UL, 0UL));
}

/* ------------------------------------------------------------ the host */

static int probe_mknod(int argc, char **argv) {
        const char *n = argv[1];
        const char *path = PROBE_DIR "/node";
        mode_t mode;
        dev_t dev = 0;

        ensure_dir(NULL);
        (void) unlink(path);
        if (strcmp(n, "mknod-block") == 0) {
                mode = S_IFBLK | 0600;
                dev = makedev(8, 0); /* sda */
        } else if (strcmp(n, "mknod-char") == 0) {
                mode = S_IFCHR | 0600;
                dev = makedev(1, 1); /* /dev/mem */
        } else
                mode = S_IFIFO | 0600;
        int r = err_of(mknod(path, mode, dev));
        (void) unlink(path);
        return r;
}

/* Opens only: writing these on a host by mistake would be a disaster.
 * Success on a path masked with /dev/null is said on stderr. */
static int probe_open_write(const char *path) {
        struct stat st;
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return errno;
        if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3))
                fprintf(stderr, "%s: %s is masked (/dev/null)\n", probe_name, path);
        close(fd);
        return 0;
}

static int probe_write_core_pattern(int argc, char **argv) {
        return probe_open_write("/proc/sys/kernel/core_pattern");
}

static int probe_write_sysrq(int argc, char **argv) {
        return probe_open_write("/proc/sysrq-trigger");
}

static int probe_open_write_path(int argc, char **argv) {
        return probe_open_write(need_path_arg(argc, argv));
}

static int probe_read_file(int argc, char **argv) {
        const char *path = need_path_arg(argc, argv);
        char buf[65536];
        ssize_t n;

        status_stream = stderr; /* stdout carries the file */
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno;
        while ((n = read(fd, buf, sizeof(buf))) > 0)
                fwrite(buf, 1, (size_t) n, stdout);
        int r = n < 0 ? errno : 0;
        close(fd);
        return r;
}

/* ------------------------------------------------------- foreign ABIs */

#ifdef __x86_64__
static int x32_child(void) {
        long r = syscall(X32_SYSCALL_BIT | SYS_getpid);
        return err_of(r);
}

static int probe_x32(int argc, char **argv) {
        return in_child(x32_child);
}

/* The 32-bit entry point from a 64-bit process: eax = 20 is i386 getpid. */
static int int80_child(void) {
        long ret;
        __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory", "r8", "r9", "r10", "r11");
        int r = (int) ret;
        if (r < 0 && r >= -4095)
                return -r;
        return 0;
}

static int probe_int80(int argc, char **argv) {
        return in_child(int80_child);
}

/* i386 unshare (310) of a user namespace: the 32-bit ABI must not offer
 * what the 64-bit filter refuses. */
static int int80_unshare_child(void) {
        long ret;
        __asm__ volatile("int $0x80"
                         : "=a"(ret)
                         : "a"(310L), "b"((long) CLONE_NEWUSER)
                         : "memory", "r8", "r9", "r10", "r11");
        int r = (int) ret;
        if (r < 0 && r >= -4095)
                return -r;
        return 0;
}

static int probe_int80_unshare(int argc, char **argv) {
        return in_child(int80_unshare_child);
}
#endif

/* -------------------------------------------------- uprobe syscalls */

#ifdef __x86_64__
/* uretprobe and uprobe are the kernel's own return path from the
 * trampolines it maps into a process when a host tracer probes it. The
 * kernel lets both past every seccomp filter (kernel/seccomp.c, "Our single
 * exception to filtering"), so the filter's errno is not what comes back:
 * called from anywhere else, uretprobe raises SIGILL at its caller, and
 * uprobe answers ENXIO (other kernel versions: EPROTO or SIGILL). In a
 * child: SIGILL ends only the caller. */
static int uretprobe_child(void) {
        return err_of(syscall(NR_uretprobe));
}

static int probe_uretprobe(int argc, char **argv) {
        return in_child(uretprobe_child);
}

static int uprobe_child(void) {
        return err_of(syscall(NR_uprobe));
}

static int probe_uprobe(int argc, char **argv) {
        return in_child(uprobe_child);
}
#endif

/* ------------------------------------------------------------- misc */

static int probe_getpid(int argc, char **argv) {
        return err_of(syscall(SYS_getpid));
}

static int probe_unknown_syscall(int argc, char **argv) {
        return err_of(syscall(NR_unknown, 0, 0, 0, 0, 0, 0));
}

static int probe_fchmodat2(int argc, char **argv) {
        ensure_dir(NULL);
        int fd = open(PROBE_DIR "/f", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (fd >= 0)
                close(fd);
        return err_of(syscall(NR_fchmodat2, AT_FDCWD, PROBE_DIR "/f", 0600, 0));
}

static int probe_landlock(int argc, char **argv) {
        long v = syscall(NR_landlock_create_ruleset, NULL, 0UL, 1U /* ..._VERSION */);
        return err_of(v);
}

/* Stacking a further allow-all filter with no_new_privs must work. */
static int probe_seccomp_nested(int argc, char **argv) {
        struct sock_filter insn[] = { BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
        struct sock_fprog prog = { .len = 1, .filter = insn };
        if (prctl(PR_SET_NO_NEW_PRIVS, 1UL, 0UL, 0UL, 0UL) < 0)
                return errno;
        return err_of(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog));
}

static int probe_seccomp_status(int argc, char **argv) {
        static const char *const keys[] = {
                "Uid:",    "Gid:",        "CapInh:",  "CapPrm:",          "CapEff:", "CapBnd:",
                "CapAmb:", "NoNewPrivs:", "Seccomp:", "Seccomp_filters:", "NSpid:",
        };
        char line[512];
        FILE *f = fopen("/proc/self/status", "re");
        if (!f)
                return errno;
        while (fgets(line, sizeof(line), f))
                for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
                        if (strncmp(line, keys[i], strlen(keys[i])) == 0)
                                fputs(line, stdout);
        fclose(f);
        return 0;
}

/* ------------------------------------------------------------- table */

typedef struct Probe {
        const char *name;
        int (*fn)(int argc, char **argv);
        const char *help;
} Probe;

static int probe_list(int argc, char **argv);

static const Probe probes[] = {
        { "list", probe_list, "print the probe names" },
        /* namespaces: refused by the filter */
        { "unshare-user", probe_unshare, "unshare(CLONE_NEWUSER)" },
        { "unshare-net", probe_unshare, "unshare(CLONE_NEWNET)" },
        { "unshare-mount", probe_unshare, "unshare(CLONE_NEWNS)" },
        { "unshare-pid", probe_unshare, "unshare(CLONE_NEWPID)" },
        { "unshare-ipc", probe_unshare, "unshare(CLONE_NEWIPC)" },
        { "unshare-uts", probe_unshare, "unshare(CLONE_NEWUTS)" },
        { "unshare-cgroup", probe_unshare, "unshare(CLONE_NEWCGROUP)" },
        { "unshare-time", probe_unshare, "unshare(CLONE_NEWTIME)" },
        { "unshare-files", probe_unshare,
          "unshare(CLONE_FILES): unshare is refused whatever the flags" },
        { "clone-newuser", probe_clone_new, "raw clone(CLONE_NEWUSER)" },
        { "clone-newnet", probe_clone_new, "raw clone(CLONE_NEWNET)" },
        { "clone-newmount", probe_clone_new, "raw clone(CLONE_NEWNS)" },
        { "clone-newpid", probe_clone_new, "raw clone(CLONE_NEWPID)" },
        { "clone-newipc", probe_clone_new, "raw clone(CLONE_NEWIPC)" },
        { "clone-newuts", probe_clone_new, "raw clone(CLONE_NEWUTS)" },
        { "clone-newcgroup", probe_clone_new, "raw clone(CLONE_NEWCGROUP)" },
        { "clone-newuser-highbits", probe_clone_new, "raw clone(CLONE_NEWUSER | high 32 bits set)" },
        { "clone3", probe_clone3, "clone3() plain: ENOSYS so libc falls back to clone" },
        { "clone3-newuser", probe_clone3_newuser, "clone3(CLONE_NEWUSER): ENOSYS" },
        { "setns-net", probe_setns, "setns(/proc/self/ns/net)" },
        { "setns-user", probe_setns, "setns(/proc/self/ns/user)" },
        /* mounts */
        { "mount-tmpfs", probe_mount_tmpfs, "mount -t tmpfs" },
        { "mount-bind", probe_mount_bind, "mount --rbind / " },
        { "mount-cgroup", probe_mount_cgroup, "mount -t cgroup (v1, for release_agent)" },
        { "mount-cgroup2", probe_mount_cgroup2, "mount -t cgroup2" },
        { "umount", probe_umount, "umount2()" },
        { "pivot-root", probe_pivot_root, "pivot_root()" },
        { "open-tree", probe_open_tree, "open_tree(OPEN_TREE_CLONE)" },
        { "move-mount", probe_move_mount, "move_mount()" },
        { "fsopen", probe_fsopen, "fsopen(tmpfs)" },
        { "fsconfig", probe_fsconfig, "fsconfig()" },
        { "fsmount", probe_fsmount, "fsmount()" },
        { "fspick", probe_fspick, "fspick(/)" },
        { "mount-setattr", probe_mount_setattr, "mount_setattr()" },
        { "statmount", probe_statmount, "statmount(): ENOSYS" },
        { "listmount", probe_listmount, "listmount(): ENOSYS" },
        { "listns", probe_listns, "listns(): ENOSYS" },
        { "chroot", probe_chroot, "chroot(/) (allowed: sandbox root keeps CAP_SYS_CHROOT)" },
        { "chroot-escape", probe_chroot_escape, "double-chroot breakout, then open PATH" },
        { "chroot-escape-write", probe_chroot_escape_write, "double-chroot breakout, then write PATH" },
        /* kernel surfaces */
        { "keyctl", probe_keyctl, "keyctl(KEYCTL_GET_KEYRING_ID)" },
        { "add-key", probe_add_key, "add_key(user)" },
        { "request-key", probe_request_key, "request_key(user)" },
        { "bpf", probe_bpf, "bpf(BPF_MAP_CREATE)" },
        { "perf-event-open", probe_perf_event_open, "perf_event_open(sw cpu clock, self)" },
        { "userfaultfd", probe_userfaultfd, "userfaultfd(UFFD_USER_MODE_ONLY)" },
        { "io-uring-setup", probe_io_uring_setup, "io_uring_setup(1)" },
        { "io-uring-enter", probe_io_uring_enter, "io_uring_enter(-1)" },
        { "io-uring-register", probe_io_uring_register, "io_uring_register(-1)" },
        { "kexec-load", probe_kexec_load, "kexec_load (invalid arch)" },
        { "kexec-file-load", probe_kexec_file_load, "kexec_file_load (invalid flags)" },
        { "init-module", probe_init_module, "init_module(NULL, 0)" },
        { "finit-module", probe_finit_module, "finit_module(-1)" },
        { "delete-module", probe_delete_module, "delete_module(nonexistent)" },
        { "open-by-handle-at", probe_open_by_handle_at, "open_by_handle_at (shocker)" },
        { "name-to-handle-at", probe_name_to_handle_at, "name_to_handle_at(/)" },
        { "clock-settime", probe_clock_settime, "clock_settime(REALTIME, now)" },
        { "settimeofday", probe_settimeofday, "settimeofday(now)" },
        { "clock-adjtime", probe_clock_adjtime, "clock_adjtime(REALTIME, read-only)" },
        { "adjtimex", probe_adjtimex, "adjtimex(read-only)" },
        { "personality", probe_personality, "personality(READ_IMPLIES_EXEC)" },
        { "personality-addr-no-randomize", probe_personality, "personality(ADDR_NO_RANDOMIZE)" },
        { "personality-query", probe_personality_query, "personality(0xffffffff) (allowed)" },
        { "swapon", probe_swapon, "swapon()" },
        { "swapoff", probe_swapoff, "swapoff()" },
        { "reboot", probe_reboot, "reboot (bad magic)" },
        { "syslog", probe_syslog, "syslog(SIZE_BUFFER)" },
        { "acct", probe_acct, "acct(path)" },
        { "quotactl", probe_quotactl, "quotactl(Q_GETINFO)" },
        { "lookup-dcookie", probe_lookup_dcookie, "lookup_dcookie()" },
        { "fanotify-init", probe_fanotify_init, "fanotify_init()" },
        { "set-mempolicy", probe_set_mempolicy, "set_mempolicy(MPOL_DEFAULT)" },
        { "mbind", probe_mbind, "mbind()" },
        { "migrate-pages", probe_migrate_pages, "migrate_pages()" },
        { "move-pages", probe_move_pages, "move_pages()" },
        { "lsm-list-modules", probe_lsm_list_modules, "lsm_list_modules()" },
#ifdef __x86_64__
        { "iopl", probe_iopl, "iopl(3)" },
        { "ioperm", probe_ioperm, "ioperm(0x80)" },
        { "modify-ldt", probe_modify_ldt, "modify_ldt(read)" },
#endif
        { "vhangup", probe_vhangup, "vhangup() (in a child without a tty)" },
        { "sethostname", probe_sethostname, "sethostname() (in a child, new UTS ns if possible)" },
        /* ttys */
        { "tiocsti", probe_tiocsti, "ioctl(pty, TIOCSTI)" },
        { "tiocsti-highbits", probe_tiocsti, "ioctl(pty, TIOCSTI | 0xffffffff00000000)" },
        { "tioclinux", probe_tioclinux, "ioctl(pty, TIOCLINUX)" },
        { "tioclinux-highbits", probe_tioclinux, "ioctl(pty, TIOCLINUX | 0xffffffff00000000)" },
        { "tiocgwinsz", probe_tiocgwinsz, "ioctl(pty, TIOCGWINSZ) (allowed)" },
        { "tiocgwinsz-highbits", probe_tiocgwinsz, "ioctl(pty, TIOCGWINSZ | high bits) (allowed)" },
        /* sockets */
        { "socket-vsock", probe_socket, "socket(AF_VSOCK)" },
        { "socket-vsock-highbits", probe_socket, "socket(AF_VSOCK | high bits)" },
        { "socket-alg", probe_socket, "socket(AF_ALG)" },
        { "socket-packet", probe_socket, "socket(AF_PACKET)" },
        { "socket-tipc", probe_socket, "socket(AF_TIPC)" },
        { "socket-unix", probe_socket, "socket(AF_UNIX) (allowed)" },
        { "socket-inet", probe_socket, "socket(AF_INET) (allowed)" },
        { "socket-inet6", probe_socket, "socket(AF_INET6) (allowed)" },
        { "socket-netlink", probe_socket, "socket(AF_NETLINK, ROUTE) (allowed)" },
        { "socketpair-unix", probe_socketpair, "socketpair(AF_UNIX) (allowed)" },
        { "socketpair-tipc", probe_socketpair, "socketpair(AF_TIPC)" },
        /* other processes */
        { "ptrace-pid", probe_ptrace_pid, "PTRACE_ATTACH to PID" },
        { "ptrace-outside", probe_ptrace_pid, "PTRACE_ATTACH to PID (a host pid: ESRCH)" },
        { "kill-pid", probe_kill_pid, "kill(PID, 0)" },
        { "kill-all", probe_kill_all, "kill(-1, SIGKILL)" },
        { "process-vm-readv", probe_process_vm_readv, "process_vm_readv(PID or self)" },
        { "pidfd-getfd", probe_pidfd_getfd, "pidfd_getfd(self, 0) (allowed)" },
        { "kcmp", probe_kcmp, "kcmp(self, self) (allowed)" },
        /* the host */
        { "mknod-block", probe_mknod, "mknod b 8 0 (kernel: EPERM in a user namespace)" },
        { "mknod-char", probe_mknod, "mknod c 1 1 (kernel: EPERM)" },
        { "mknod-fifo", probe_mknod, "mknod p (allowed)" },
        { "write-core-pattern", probe_write_core_pattern,
          "open /proc/sys/kernel/core_pattern O_WRONLY" },
        { "write-sysrq", probe_write_sysrq, "open /proc/sysrq-trigger O_WRONLY" },
        { "open-write", probe_open_write_path, "open PATH O_WRONLY (never writes)" },
        { "read-file", probe_read_file, "print PATH on stdout (status on stderr)" },
#ifdef __x86_64__
        { "x32-syscall", probe_x32, "getpid with __X32_SYSCALL_BIT (in a child)" },
        { "int80-getpid", probe_int80, "i386 getpid via int $0x80 (in a child)" },
        { "int80-unshare", probe_int80_unshare,
          "i386 unshare(CLONE_NEWUSER) via int $0x80 (in a child)" },
        /* past seccomp by the kernel's design */
        { "uretprobe", probe_uretprobe, "syscall 335 uretprobe, outside a trampoline (in a child)" },
        { "uprobe", probe_uprobe, "syscall 336 uprobe, outside a trampoline (in a child)" },
#endif
        /* positive controls */
        { "getpid", probe_getpid, "getpid() (allowed)" },
        { "clone-plain", probe_clone_plain, "raw clone(SIGCHLD) (allowed)" },
        { "unknown-syscall", probe_unknown_syscall, "syscall 1000: ENOSYS" },
        { "fchmodat2", probe_fchmodat2, "fchmodat2() (allowed)" },
        { "landlock", probe_landlock, "landlock_create_ruleset(VERSION) (allowed)" },
        { "seccomp-nested", probe_seccomp_nested, "NNP + stack an allow-all filter (allowed)" },
        { "seccomp-status", probe_seccomp_status, "print Uid/Cap*/NoNewPrivs/Seccomp of self" },
};

static int probe_list(int argc, char **argv) {
        for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++)
                printf("%-32s %s\n", probes[i].name, probes[i].help);
        return 0;
}

static const char *signal_name(int sig) {
        const char *s = sigabbrev_np(sig);
        return s ? s : "?";
}

int main(int argc, char **argv) {
        status_stream = stdout;
        if (argc < 2) {
                fprintf(stderr, "usage: probe NAME [ARG]   (probe list)\n");
                return 255;
        }
        probe_name = argv[1];
        if (strcmp(argv[1], "list") == 0)
                return probe_list(argc, argv);

        for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
                if (strcmp(probes[i].name, argv[1]) != 0)
                        continue;
                errno = 0;
                int r = probes[i].fn(argc, argv);
                if (probe_signal)
                        fprintf(status_stream, "%s: killed by signal %d (SIG%s)\n", argv[1],
                                probe_signal, signal_name(probe_signal));
                else
                        fprintf(status_stream, "%s: errno %d (%s)\n", argv[1], r, strerror(r));
                fflush(NULL);
                return r;
        }
        fprintf(stderr, "probe: unknown probe %s (try: probe list)\n", argv[1]);
        return 255;
}
