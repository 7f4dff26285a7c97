/* SPDX-License-Identifier: Apache-2.0 */
/* The gvisor relay's seccomp filter (lib/sandbox/seccomp-relay.c), as
 * compiled at build time into hutch-init: each case loads it in a forked
 * child and makes one raw system call. The calls the relay's loop makes
 * must pass (whatever the kernel answers); anything else, or an argument
 * the relay never uses, must kill the child with SIGSYS. No root needed:
 * the child sets no_new_privs, as the relay does. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "relay-seccomp.h"
#include "tap.h"

/* Descriptors the cases use, made before the filter (as the relay's are). */
static int pipe_fds[2], epfd, sock_fd;

/* A case returns what the call returned; the child exits 0 whatever it is
 * (a killed child is the refusal). */
typedef long (*relay_case)(void);

static int run_case(relay_case fn) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
                return -1;
        if (pid == 0) {
                struct relay_bpf_prog prog = { .len = relay_seccomp_filter_len,
                                               .filter = relay_seccomp_filter };
                if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
                    syscall(SYS_seccomp, RELAY_SECCOMP_SET_MODE_FILTER,
                            RELAY_SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
                        syscall(SYS_exit_group, 100);
                (void) fn();
                syscall(SYS_exit_group, 0);
        }
        int st;
        if (waitpid(pid, &st, 0) < 0)
                return -1;
        /* 0: passed; a signal number: killed by it; 1000 + status: other exit */
        return WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st) == 0 ? 0 : 1000 + WEXITSTATUS(st);
}

#define PASSES(fn, what) ok(run_case(fn) == 0, "allowed: %s", what)
#define KILLED(fn, what) ok(run_case(fn) == SIGSYS, "killed: %s", what)

/* ------------------------------------------------------ the relay's own */
static long c_read(void) {
        char b;
        return syscall(SYS_read, pipe_fds[0], &b, 0);
}
static long c_write(void) {
        return syscall(SYS_write, pipe_fds[1], "x", 1);
}
static long c_writev(void) {
        struct iovec v = { "x", 1 };
        return syscall(SYS_writev, pipe_fds[1], &v, 1);
}
static long c_epoll_pwait(void) {
        struct epoll_event ev;
        return syscall(SYS_epoll_pwait, epfd, &ev, 1, 0, NULL, 8);
}
static long c_epoll_ctl(void) {
        struct epoll_event ev = { .events = EPOLLIN };
        return syscall(SYS_epoll_ctl, epfd, EPOLL_CTL_ADD, pipe_fds[0], &ev);
}
static long c_pipe2(void) {
        int p[2];
        return syscall(SYS_pipe2, p, O_CLOEXEC);
}
static long c_fcntl_getfl(void) {
        return syscall(SYS_fcntl, pipe_fds[0], F_GETFL);
}
static long c_fcntl_setfl(void) {
        return syscall(SYS_fcntl, pipe_fds[0], F_SETFL, O_NONBLOCK);
}
static long c_fcntl_setfd(void) {
        return syscall(SYS_fcntl, pipe_fds[0], F_SETFD, FD_CLOEXEC);
}
static long c_ioctl_tcgets(void) {
        struct termios t;
        return syscall(SYS_ioctl, pipe_fds[0], TCGETS, &t); /* ENOTTY, not a kill */
}
static long c_ioctl_tiocgptn(void) {
        unsigned n;
        return syscall(SYS_ioctl, pipe_fds[0], TIOCGPTN, &n);
}
static long c_socket_inet(void) {
        return syscall(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
}
static long c_setsockopt_nodelay(void) {
        int one = 1;
        return syscall(SYS_setsockopt, sock_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}
static long c_getsockopt_error(void) {
        int e;
        socklen_t l = sizeof e;
        return syscall(SYS_getsockopt, sock_fd, SOL_SOCKET, SO_ERROR, &e, &l);
}
static long c_mmap_rw(void) {
        return syscall(SYS_mmap, NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
}
static long c_mprotect_rw(void) {
        void *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return syscall(SYS_mprotect, p, 4096, PROT_READ | PROT_WRITE);
}
static long c_open_rdwr(void) {
        return syscall(SYS_open, "/dev/null", O_RDWR | O_NOCTTY | O_CLOEXEC);
}
static long c_openat_tmpfile(void) {
        return syscall(SYS_openat, AT_FDCWD, "/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
}
static long c_nanosleep(void) {
        struct timespec t = { 0, 1 };
        return syscall(SYS_nanosleep, &t, NULL);
}
static long c_wait4(void) {
        return syscall(SYS_wait4, -1, NULL, WNOHANG, NULL);
}

/* --------------------------------------------------- what it never does */
static long c_getpid(void) {
        return syscall(SYS_getpid);
}
static long c_execve(void) {
        char *argv[] = { (char *) "/bin/true", NULL };
        return syscall(SYS_execve, "/bin/true", argv, NULL);
}
static long c_fork(void) {
        return syscall(SYS_fork);
}
static long c_clone(void) {
        return syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
}
static long c_kill(void) {
        return syscall(SYS_kill, 1, 0);
}
static long c_ptrace(void) {
        return syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, 1, 0, 0);
}
static long c_unshare(void) {
        return syscall(SYS_unshare, CLONE_NEWUSER);
}
static long c_prctl(void) {
        return syscall(SYS_prctl, PR_SET_DUMPABLE, 1, 0, 0, 0);
}
static long c_seccomp(void) {
        return syscall(SYS_seccomp, 0, 0, NULL);
}
static long c_socket_unix(void) {
        return syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0);
}
static long c_socket_inet6(void) {
        return syscall(SYS_socket, AF_INET6, SOCK_STREAM, 0);
}
static long c_socketpair(void) {
        int sv[2];
        return syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM, 0, sv);
}
static long c_bind(void) {
        struct sockaddr_in sa = { .sin_family = AF_INET };
        return syscall(SYS_bind, sock_fd, &sa, sizeof sa);
}
static long c_setsockopt_other(void) {
        int one = 1;
        return syscall(SYS_setsockopt, sock_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
}
static long c_open_creat(void) {
        return syscall(SYS_open, "/tmp/hutch-relay-seccomp-test", O_WRONLY | O_CREAT | O_CLOEXEC,
                       0600);
}
static long c_openat_creat(void) {
        return syscall(SYS_openat, AT_FDCWD, "/tmp/hutch-relay-seccomp-test",
                       O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
}
static long c_openat_trunc(void) {
        return syscall(SYS_openat, AT_FDCWD, "/dev/null", O_WRONLY | O_TRUNC | O_CLOEXEC);
}
static long c_mmap_exec(void) {
        return syscall(SYS_mmap, NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                       0);
}
static long c_mprotect_exec(void) {
        void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return syscall(SYS_mprotect, p, 4096, PROT_READ | PROT_EXEC);
}
static long c_ioctl_tiocsti(void) {
        char c = 'x';
        return syscall(SYS_ioctl, pipe_fds[0], TIOCSTI, &c);
}
static long c_ioctl_tiocsti_highbits(void) {
        /* low 32 bits TIOCSTI: the kernel truncates the command */
        char c = 'x';
        return syscall(SYS_ioctl, pipe_fds[0], 0xffffffff00000000ul | TIOCSTI, &c);
}
static long c_fcntl_dupfd(void) {
        return syscall(SYS_fcntl, pipe_fds[0], F_DUPFD_CLOEXEC, 0);
}
static long c_rt_sigreturn(void) {
        return syscall(SYS_rt_sigreturn);
}
#ifdef __x86_64__
static long c_x32_getpid(void) {
        return syscall(0x40000000 | SYS_getpid);
}

/* uretprobe (335) and uprobe (336): the kernel lets both past every filter
 * (docs/security.md), so the relay's cannot kill a caller for them; what
 * happens without a uprobe trampoline is SIGILL and ENXIO (EPROTO or SIGILL
 * on other kernel versions). The child exits with the errno it got. */
static long c_uretprobe(void) {
        long r = syscall(335);
        return syscall(SYS_exit_group, r < 0 ? errno : 0);
}
static long c_uprobe(void) {
        long r = syscall(336);
        return syscall(SYS_exit_group, r < 0 ? errno : 0);
}
#endif

int main(void) {
        if (pipe2(pipe_fds, O_CLOEXEC) < 0 || (epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
            (sock_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
                printf("1..0 # SKIP cannot make the descriptors the cases use: %s\n",
                       strerror(errno));
                return 77;
        }
        ok(relay_seccomp_filter_len > 0 && relay_seccomp_filter_len <= 4096,
           "the filter has %u instructions", relay_seccomp_filter_len);

        PASSES(c_read, "read");
        PASSES(c_write, "write");
        PASSES(c_writev, "writev (stderr)");
        PASSES(c_epoll_pwait, "epoll_pwait");
        PASSES(c_epoll_ctl, "epoll_ctl");
        PASSES(c_pipe2, "pipe2");
        PASSES(c_fcntl_getfl, "fcntl F_GETFL");
        PASSES(c_fcntl_setfl, "fcntl F_SETFL");
        PASSES(c_fcntl_setfd, "fcntl F_SETFD");
        PASSES(c_ioctl_tcgets, "ioctl TCGETS");
        PASSES(c_ioctl_tiocgptn, "ioctl TIOCGPTN");
        PASSES(c_socket_inet, "socket(AF_INET)");
        PASSES(c_setsockopt_nodelay, "setsockopt(TCP_NODELAY)");
        PASSES(c_getsockopt_error, "getsockopt(SO_ERROR)");
        PASSES(c_mmap_rw, "mmap read-write");
        PASSES(c_mprotect_rw, "mprotect read-write");
        PASSES(c_open_rdwr, "open O_RDWR (a pty)");
        PASSES(c_openat_tmpfile, "openat O_TMPFILE");
        PASSES(c_nanosleep, "nanosleep");
        PASSES(c_wait4, "wait4");

        KILLED(c_getpid, "getpid (not on the list)");
        KILLED(c_execve, "execve");
        KILLED(c_fork, "fork");
        KILLED(c_clone, "clone");
        KILLED(c_kill, "kill");
        KILLED(c_ptrace, "ptrace");
        KILLED(c_unshare, "unshare");
        KILLED(c_prctl, "prctl");
        KILLED(c_seccomp, "seccomp");
        KILLED(c_socket_unix, "socket(AF_UNIX)");
        KILLED(c_socket_inet6, "socket(AF_INET6)");
        KILLED(c_socketpair, "socketpair");
        KILLED(c_bind, "bind");
        KILLED(c_setsockopt_other, "setsockopt(SO_REUSEADDR)");
        KILLED(c_open_creat, "open O_CREAT");
        KILLED(c_openat_creat, "openat O_CREAT");
        KILLED(c_openat_trunc, "openat O_TRUNC");
        KILLED(c_mmap_exec, "mmap PROT_EXEC");
        KILLED(c_mprotect_exec, "mprotect PROT_EXEC");
        KILLED(c_ioctl_tiocsti, "ioctl TIOCSTI");
        KILLED(c_ioctl_tiocsti_highbits, "ioctl TIOCSTI with high bits");
        KILLED(c_fcntl_dupfd, "fcntl F_DUPFD_CLOEXEC");
        KILLED(c_rt_sigreturn, "rt_sigreturn (the relay installs no handler)");
#ifdef __x86_64__
        KILLED(c_x32_getpid, "an x32 syscall");
        int u = run_case(c_uretprobe);
        ok(u == SIGSYS || u == SIGILL,
           "uretprobe: killed by the filter or, past it, SIGILL from the kernel (%d)", u);
        u = run_case(c_uprobe);
        ok(u == SIGSYS || u == SIGILL || u == 1000 + ENXIO || u == 1000 + EPROTO,
           "uprobe: killed by the filter or, past it, refused by the kernel (%d)", u);
#endif
        (void) unlink("/tmp/hutch-relay-seccomp-test");
        return tap_done();
}
