/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Large files are deleted off the loop. Freeing the blocks of a written-back
 * 1 GiB file (a sealed snapshot, a destroyed sandbox's layer image, an
 * unsealed stream) took 0.3-0.6 s of the loop here (ext4), as long as
 * every other tenant's requests then waited. Such files are renamed into
 * DATA_DIR/trash (a rename is a directory entry: microseconds), the
 * engine's layer images too (hutch_ctx_config.trash_dir), and a worker
 * process (lib/util/worker.h) unlinks what is there. One worker at a time;
 * what comes while it runs is taken by the next. What a crash or a stop
 * leaves there is deleted after the next start.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/server.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/syscalls.h"
#include "util/worker.h"

static char trash_dir[PATH_MAX];
static watcher worker_w = { .fd = -1 };
static bool again; /* files came while the worker ran */

const char *trash_setup(server *srv) {
        snprintf(trash_dir, sizeof trash_dir, "%s/trash", srv->cfg.data_dir);
        if (mkdir(trash_dir, 0700) < 0 && errno != EEXIST) {
                log_warning("%s: %m: large files are deleted on the loop", trash_dir);
                trash_dir[0] = 0;
                return NULL;
        }
        return trash_dir;
}

static bool trash_empty(void) {
        DIR *d = opendir(trash_dir);
        if (!d)
                return true;
        bool empty = true;
        for (struct dirent *de; empty && (de = readdir(d));)
                empty = streq(de->d_name, ".") || streq(de->d_name, "..");
        closedir(d);
        return empty;
}

/* The worker: every file there, unlinked. */
static void trash_work(int dfd) {
        DIR *d = fdopendir(dfd);
        if (!d)
                _exit(1);
        for (struct dirent *de; (de = readdir(d));)
                if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                        (void) unlinkat(dirfd(d), de->d_name, 0);
        _exit(0);
}

static void on_worker_exit(server *srv, watcher *w, uint32_t revents) {
        int status;
        if (worker_reap(w->fd, false, &status) == 0)
                return;
        int fd = w->fd;
        loop_del(srv, w);
        safe_close(fd);
        if (again) {
                again = false;
                trash_kick(srv);
        }
}

void trash_kick(server *srv) {
        if (!trash_dir[0])
                return;
        if (worker_w.fd >= 0) {
                again = true;
                return;
        }
        if (trash_empty())
                return;
        int fds[1] = { open(trash_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
        if (fds[0] < 0)
                return;
        int pidfd = -1;
        pid_t pid = worker_fork("hutch-trash", fds, 1, &pidfd);
        if (pid == 0)
                trash_work(fds[0]);
        close(fds[0]);
        if (pid < 0) {
                log_warning("trash: no worker (%s): its files wait for the next",
                            strerror((int) -pid));
                return;
        }
        worker_w.cb = on_worker_exit;
        if (loop_add(srv, &worker_w, pidfd, EPOLLIN) < 0) {
                /* cannot be watched: wait for it here, rather than leave it */
                int st;
                (void) worker_reap(pidfd, true, &st);
                close(pidfd);
                worker_w.fd = -1;
        }
}

void trash_file(server *srv, const char *path) {
        static unsigned n;
        const char *base = strrchr(path, '/');
        char to[PATH_MAX + 64];
        if (trash_dir[0] &&
            snprintf(to, sizeof to, "%s/%s.%u", trash_dir, base ? base + 1 : path, ++n) <
                    (int) sizeof to &&
            rename(path, to) == 0) {
                trash_kick(srv);
                return;
        }
        if (unlink(path) < 0 && errno != ENOENT)
                log_warning("removing %s: %m", path);
}

void trash_stop(server *srv) {
        if (worker_w.fd < 0)
                return;
        /* what it has not deleted yet, the next start does */
        (void) sys_pidfd_send_signal(worker_w.fd, SIGKILL, NULL, 0);
        int st;
        (void) worker_reap(worker_w.fd, true, &st);
        int fd = worker_w.fd;
        loop_del(srv, &worker_w);
        safe_close(fd);
}
