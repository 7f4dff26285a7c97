/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/fdutil.h"
#include "util/syscalls.h"
#include "util/worker.h"

#define IOPRIO_CLASS_BE 2

int fds_keep_only(int *fds, size_t n) {
        int low = 3 + (int) n;
        /* first above every target, so that no dup below lands on a source */
        for (size_t i = 0; i < n; i++)
                if (fds[i] >= 0 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, low)) < 0)
                        return -errno;
        for (size_t i = 0; i < n; i++) {
                if (fds[i] < 0) {
                        (void) close(3 + (int) i); /* whatever was inherited there */
                        continue;
                }
                if (dup3(fds[i], 3 + (int) i, O_CLOEXEC) < 0)
                        return -errno;
                fds[i] = 3 + (int) i;
        }
        return sys_close_range((unsigned) low, ~0U, 0) < 0 ? -errno : 0;
}

pid_t worker_fork(const char *name, int *fds, size_t n, int *ret_pidfd) {
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                /* dies with the parent; and if the parent died before the
                 * line above took effect, now */
                if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
                        _exit(127);
                (void) prctl(PR_SET_NAME, name);
                /* the parent blocked these for its signalfd */
                sigset_t all;
                sigfillset(&all);
                (void) sigprocmask(SIG_UNBLOCK, &all, NULL);
                if (fds_keep_only(fds, n) < 0)
                        _exit(127);
                /* the loop it relieves comes first, for the CPU and the disk,
                 * and it is not shielded from the OOM killer as the daemon is */
                (void) setpriority(PRIO_PROCESS, 0, 10);
                (void) write_file_at(AT_FDCWD, "/proc/self/oom_score_adj", "0");
                (void) sys_ioprio_set_self(IOPRIO_CLASS_BE, 7);
                return 0;
        }
        int pfd = sys_pidfd_open(pid, 0);
        if (pfd < 0) {
                int r = -errno;
                (void) kill(pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
                return r;
        }
        *ret_pidfd = pfd;
        return pid;
}

int worker_reap(int pidfd, bool wait, int *ret_status) {
        siginfo_t si = { 0 };
        for (;;) {
                if (waitid(P_PIDFD, (id_t) pidfd, &si, WEXITED | (wait ? 0 : WNOHANG)) == 0)
                        break;
                if (errno != EINTR)
                        return -errno;
        }
        if (si.si_pid == 0)
                return 0;
        *ret_status = si.si_code == CLD_EXITED ? si.si_status : 128 + si.si_status;
        return 1;
}
