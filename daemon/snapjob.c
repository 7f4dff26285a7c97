/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot work off the loop (issues #16, #19): copying a sandbox's layer,
 * sealing it (zstd, AES-256-GCM, fsync) and unsealing it take seconds for a
 * large layer. On the loop they held every other tenant's requests for that
 * long (7.2 s for 800 MB). A job runs that part in a worker process forked
 * from the daemon (lib/util/worker.h: its own descriptors only, no
 * database, no HTTP server, dies with the daemon), while the request that
 * asked for it waits with its connection suspended. The worker reports
 * through a pipe (SNAPJOB_READ once the layer is copied, SNAPJOB_DONE at
 * the end); its pidfd says when it is gone. What must happen on the loop
 * (the thaw, the database row, events, the answer) happens there, in the
 * kind's callbacks (daemon/snapshots.c).
 *
 * While a job copies a sandbox's layer (reads_sandbox), the sandbox is
 * frozen (or paused) and must stay so: it is marked snapshotting, so that
 * pause and resume answer 409 and its data-plane requests wait here
 * (parked) instead of asking its frozen init, which could not answer. A
 * kill cancels such a job.
 *
 * Bounds: snapshot-jobs workers at once, snapshot-jobs-per-team of one
 * team, one job per sandbox (429, 409 beyond). Requests that want what a
 * running job makes (the same snapshot restored by several creates) join
 * it instead of starting another.
 *
 * Nothing leaks: a client that goes away (EPOLLRDHUP on its socket; a
 * suspended connection is not watched by libmicrohttpd) leaves the job,
 * and a job nobody waits for any more is cancelled; a cancelled worker is
 * killed and reaped, its files removed and its sandbox thawed; at a stop
 * every worker is ended so and its clients answered 503; a kill -9 of the
 * daemon kills the workers (PR_SET_PDEATHSIG), and the next start sweeps
 * their temporary files (snapshots_setup) and thaws what they had frozen
 * (re-adoption).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "daemon/snapjob.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/syscalls.h"
#include "util/worker.h"

struct snapjob_waiter {
        snapjob *job;
        request *req;
        watcher gone_w;    /* its socket while it waits: EPOLLRDHUP, the client went away */
        int resume_action; /* parked: what it does when resumed */
        bool holding;      /* uses the job's result (snapjob_hold) */
        snapjob_waiter *next;
};

static snapjob *jobs;
/* Freed after the loop's current batch of events, which may still hold
 * one for their watchers (their callbacks are cleared at once). */
static snapjob *dead_jobs;
static snapjob_waiter *dead_waiters;

static void waiter_free(snapjob_waiter *w) {
        w->gone_w.cb = NULL;
        w->next = dead_waiters;
        dead_waiters = w;
}

/* A watcher of the job's own descriptor: unwatched and closed. */
static void watch_close(server *srv, watcher *w) {
        int fd = w->fd;
        loop_del(srv, w);
        safe_close(fd);
        w->cb = NULL;
}

/* ------------------------------------------------------------ the worker */

void snapjob_send(int msg_fd, int step, int r, uint64_t bytes, uint64_t aux, const char *why) {
        snapjob_msg m = { .step = step, .r = r, .bytes = bytes, .aux = aux };
        snprintf(m.why, sizeof m.why, "%s", why ? why : "");
        (void) fd_write_all(msg_fd, &m, sizeof m);
}

/* ------------------------------------------------------------ bookkeeping */

static void running_counts(int64_t team, unsigned *ret_all, unsigned *ret_team) {
        unsigned all = 0, mine = 0;
        for (snapjob *j = jobs; j; j = j->next)
                if (j->running) {
                        all++;
                        if (j->team == team)
                                mine++;
                }
        *ret_all = all;
        *ret_team = mine;
}

static snapjob *job_of_sandbox(const char *id) {
        for (snapjob *j = jobs; j; j = j->next)
                if (j->running && j->sbx_id[0] && streq(j->sbx_id, id))
                        return j;
        return NULL;
}

static void job_unlink(snapjob *j) {
        for (snapjob **pp = &jobs; *pp; pp = &(*pp)->next)
                if (*pp == j) {
                        *pp = j->next;
                        return;
                }
}

static void job_free(server *srv, snapjob *j) {
        job_unlink(j);
        if (j->ops->release)
                j->ops->release(srv, j);
        for (int i = 0; i < SNAPJOB_FDS; i++)
                j->fds[i] = safe_close(j->fds[i]);
        if (j->msg_w.fd >= 0)
                watch_close(srv, &j->msg_w);
        if (j->pid_w.fd >= 0)
                watch_close(srv, &j->pid_w);
        j->msg_w.cb = j->pid_w.cb = NULL;
        j->next = dead_jobs;
        dead_jobs = j;
}

void snapjobs_reap(server *srv) {
        while (dead_jobs) {
                snapjob *j = dead_jobs;
                dead_jobs = j->next;
                free(j);
        }
        while (dead_waiters) {
                snapjob_waiter *w = dead_waiters;
                dead_waiters = w->next;
                free(w);
        }
}

int snapjob_admit(server *srv, request *req, int64_t team, const char *sbx_id) {
        if (sbx_id && sbx_id[0] && job_of_sandbox(sbx_id)) {
                http_reply_error(req->conn, 409,
                                 "sandbox \"%s\" is busy: a snapshot or fork of it is being taken",
                                 sbx_id);
                return -EBUSY;
        }
        unsigned all, mine;
        running_counts(team, &all, &mine);
        if (all >= srv->cfg.snapshot_jobs) {
                http_reply_429(req->conn, 1,
                               "%u snapshots, forks and restores are being made, the daemon's limit (snapshot-jobs): "
                               "try again later",
                               all);
                return -EBUSY;
        }
        if (mine >= srv->cfg.snapshot_jobs_per_team) {
                http_reply_429(req->conn, 1,
                               "the team has %u snapshots, forks or restores being made, its limit "
                               "(snapshot-jobs-per-team): try again later",
                               mine);
                return -EBUSY;
        }
        return 0;
}

snapjob *snapjob_new(const snapjob_ops *ops, int64_t team, const char *sbx_id) {
        snapjob *j = calloc(1, sizeof *j);
        if (!j)
                return NULL;
        j->ops = ops;
        j->team = team;
        snprintf(j->sbx_id, sizeof j->sbx_id, "%s", sbx_id ? sbx_id : "");
        for (int i = 0; i < SNAPJOB_FDS; i++)
                j->fds[i] = -1;
        j->pid_w.fd = j->msg_w.fd = -1;
        return j;
}

snapjob *snapjob_find(server *srv, const char *key) {
        for (snapjob *j = jobs; j; j = j->next)
                if (j->key[0] && streq(j->key, key) && !j->cancelled && (j->running || j->holds > 0))
                        return j;
        return NULL;
}

/* ------------------------------------------------------------ waiters */

static void waiter_unlink(snapjob_waiter **list, snapjob_waiter *w) {
        for (snapjob_waiter **pp = list; *pp; pp = &(*pp)->next)
                if (*pp == w) {
                        *pp = w->next;
                        return;
                }
}

static void waiter_unwatch(server *srv, snapjob_waiter *w) {
        if (w->gone_w.fd >= 0)
                loop_del(srv, &w->gone_w); /* the socket is libmicrohttpd's: not closed here */
        w->gone_w.fd = -1;
        w->gone_w.cb = NULL;
}

static void job_cancel(server *srv, snapjob *j, unsigned status, const char *msg);

/* The client of a waiting request closed its side: it leaves the job, its
 * connection is resumed to be closed, and a job nobody waits for ends. */
static void on_waiter_gone(server *srv, watcher *wt, uint32_t revents) {
        snapjob_waiter *w = wt->data;
        snapjob *j = w->job;
        waiter_unwatch(srv, w);
        waiter_unlink(&j->waiters, w);
        request *req = w->req;
        req->snap_wait = NULL;
        req->resume_action = RESUME_CLOSE;
        waiter_free(w);
        log_info("%s: the client went away while it waited%s", j->ops->what,
                 j->waiters ? "" : ": cancelled");
        http_resume(req);
        if (!j->waiters)
                job_cancel(srv, j, 0, NULL);
}

static int waiter_add(server *srv, snapjob *j, request *req) {
        snapjob_waiter *w = calloc(1, sizeof *w);
        if (!w)
                return -ENOMEM;
        w->job = j;
        w->req = req;
        w->gone_w.fd = -1;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
                req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) {
                w->gone_w.cb = on_waiter_gone;
                w->gone_w.data = w;
                /* EPOLLRDHUP only: a pipelined request (EPOLLIN) is not a goodbye */
                if (loop_add(srv, &w->gone_w, ci->connect_fd, EPOLLRDHUP) < 0)
                        w->gone_w.fd = -1;
        }
        w->next = j->waiters;
        j->waiters = w;
        req->snap_wait = w;
        MHD_suspend_connection(req->conn);
        return 0;
}

int snapjob_join(server *srv, snapjob *j, request *req) {
        return waiter_add(srv, j, req);
}

int snapjob_hold(server *srv, snapjob *j, request *req) {
        snapjob_waiter *w = req->snap_wait;
        if (!w || w->job != j) {
                w = calloc(1, sizeof *w);
                if (!w)
                        return -ENOMEM;
                w->job = j;
                w->req = req;
                w->gone_w.fd = -1;
                w->next = j->waiters;
                j->waiters = w;
                req->snap_wait = w;
        }
        if (!w->holding) {
                w->holding = true;
                j->holds++;
        }
        return 0;
}

snapjob *snapjob_held(request *req) {
        return req->snap_wait && req->snap_wait->holding ? req->snap_wait->job : NULL;
}

void snapjob_unhold(server *srv, request *req) {
        snapjob_waiter *w = req->snap_wait;
        if (!w || !w->holding)
                return;
        snapjob *j = w->job;
        waiter_unlink(&j->waiters, w);
        req->snap_wait = NULL;
        waiter_free(w);
        if (--j->holds == 0 && !j->running)
                job_free(srv, j);
}

/* ------------------------------------------------------------ the sandbox */

/* The layer is copied (or the copy abandoned): the sandbox may run again,
 * and what waited for it goes on. */
static void job_sandbox_done(server *srv, snapjob *j) {
        if (!j->reads_sandbox)
                return;
        j->reads_sandbox = false;
        sbx *sb = sbx_find(srv, j->sbx_id);
        if (sb) {
                sb->snapshotting = false;
                if (j->thaw) {
                        hutch_error err = { 0 };
                        if (hutch_sandbox_thaw(sb->h, &err) < 0)
                                log_error("sandbox %s: thawing after its %s failed: %s", sb->id,
                                          j->ops->what, err.msg);
                        sbx_mark_dirty(sb);
                }
        }
        j->thaw = false;
        while (j->parked) {
                snapjob_waiter *w = j->parked;
                j->parked = w->next;
                w->req->snap_wait = NULL;
                w->req->resume_action = w->resume_action;
                http_resume(w->req);
                waiter_free(w);
        }
}

bool snapjob_park(server *srv, request *req, sbx *sb, int resume_action) {
        if (!sb->snapshotting)
                return false;
        snapjob *j = job_of_sandbox(sb->id);
        snapjob_waiter *w = j ? calloc(1, sizeof *w) : NULL;
        if (!w) {
                /* marked with no job: a bug; never leave the request stuck */
                if (!j)
                        sb->snapshotting = false;
                return false;
        }
        w->job = j;
        w->req = req;
        w->gone_w.fd = -1;
        w->resume_action = resume_action;
        w->next = j->parked;
        j->parked = w;
        req->snap_wait = w;
        MHD_suspend_connection(req->conn);
        return true;
}

void snapjob_sandbox_killed(server *srv, sbx *sb) {
        snapjob *j = job_of_sandbox(sb->id);
        if (!j || !j->reads_sandbox)
                return; /* its layer is copied: the job goes on without it */
        char msg[160];
        snprintf(msg, sizeof msg, "sandbox \"%s\" was killed while its layer was copied", sb->id);
        job_cancel(srv, j, 409, msg);
}

/* ------------------------------------------------------------ the end */

/* Every waiting request answered (the kind's answer, or the cancel's),
 * its connection resumed. */
static void job_answer(server *srv, snapjob *j) {
        snapjob_waiter *w = j->waiters, *next;
        j->waiters = NULL;
        for (; w; w = next) {
                next = w->next;
                waiter_unwatch(srv, w);
                request *req = w->req;
                if (w->holding) { /* already answered */
                        w->next = j->waiters;
                        j->waiters = w;
                        continue;
                }
                req->snap_wait = NULL;
                waiter_free(w);
                http_defer_begin(req);
                if (j->cancelled && j->cancel_status)
                        http_reply_error(req->conn, j->cancel_status, "%s", j->cancel_msg);
                else if (j->cancelled)
                        req->resume_action = RESUME_CLOSE;
                else
                        j->ops->answer(srv, j, req);
                http_defer_end();
                if (!req->deferred && req->resume_action == RESUME_NONE) {
                        log_error("%s: no answer was made: closing the connection", j->ops->what);
                        req->resume_action = RESUME_CLOSE;
                }
                http_resume(req);
        }
}

static void job_drain_messages(snapjob *j) {
        if (j->msg_w.fd < 0)
                return;
        snapjob_msg m;
        for (;;) {
                ssize_t n = read(j->msg_w.fd, &m, sizeof m);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n != (ssize_t) sizeof m)
                        return; /* EAGAIN, EOF, or a torn message (a bug): the exit decides */
                m.why[sizeof m.why - 1] = 0;
                if (m.step == SNAPJOB_READ) {
                        job_sandbox_done(j->srv, j);
                        if (m.r < 0) {
                                j->got_done = true; /* nothing follows a failed copy */
                                j->last = m;
                        }
                } else if (m.step == SNAPJOB_DONE) {
                        j->got_done = true;
                        j->last = m;
                }
        }
}

static void on_job_message(server *srv, watcher *w, uint32_t revents) {
        snapjob *j = w->data;
        job_drain_messages(j);
        if (revents & (EPOLLHUP | EPOLLERR))
                watch_close(srv, &j->msg_w);
}

/* The worker is gone (reaped, with its exit status). */
static void job_finish(server *srv, snapjob *j, int status) {
        job_drain_messages(j);
        if (j->msg_w.fd >= 0)
                watch_close(srv, &j->msg_w);
        if (j->pid_w.fd >= 0)
                watch_close(srv, &j->pid_w);
        j->running = false;
        job_sandbox_done(srv, j);
        if (!j->cancelled) {
                snapjob_msg m = j->last;
                if (!j->got_done) {
                        m = (snapjob_msg) { .step = SNAPJOB_DONE, .r = -EIO };
                        snprintf(m.why, sizeof m.why,
                                 "its worker ended without finishing (exit status %d)", status);
                }
                j->ops->done(srv, j, &m);
        }
        job_answer(srv, j);
        if (j->holds == 0)
                job_free(srv, j);
}

static void on_job_exit(server *srv, watcher *w, uint32_t revents) {
        snapjob *j = w->data;
        int status = 0;
        int r = worker_reap(j->pid_w.fd, false, &status);
        if (r == 0)
                return; /* not yet */
        if (r < 0)
                log_error("%s: reaping its worker: %s", j->ops->what, strerror(-r));
        job_finish(srv, j, status);
}

static void job_cancel(server *srv, snapjob *j, unsigned status, const char *msg) {
        if (!j->running || j->cancelled)
                return;
        j->cancelled = true;
        j->cancel_status = status;
        snprintf(j->cancel_msg, sizeof j->cancel_msg, "%s", msg ? msg : "");
        if (j->pid_w.fd >= 0)
                (void) sys_pidfd_send_signal(j->pid_w.fd, SIGKILL, NULL, 0);
        /* the copy is abandoned: the sandbox goes on now, not when the
         * worker's exit is seen */
        job_sandbox_done(srv, j);
}

void snapjob_discard(server *srv, snapjob *j) {
        j->srv = srv;
        job_sandbox_done(srv, j);
        job_free(srv, j);
}

int snapjob_start(server *srv, snapjob *j, request *req, hutch_error *err) {
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) < 0) {
                int r = hutch_error_set(err, -errno, "pipe: %m");
                snapjob_discard(srv, j);
                return r;
        }
        int fds[SNAPJOB_FDS + 1];
        memcpy(fds, j->fds, sizeof j->fds);
        fds[SNAPJOB_FDS] = pfd[1];
        int pidfd = -1;
        pid_t pid = worker_fork("hutch-snapshot", fds, ELEMENTSOF(fds), &pidfd);
        if (pid == 0) {
                /* the worker */
                memcpy(j->fds, fds, sizeof j->fds);
                int r = j->ops->work(j, fds[SNAPJOB_FDS]);
                _exit(r < 0 ? 1 : 0);
        }
        close(pfd[1]);
        for (int i = 0; i < SNAPJOB_FDS; i++)
                j->fds[i] = safe_close(j->fds[i]); /* the worker's now */
        if (pid < 0) {
                close(pfd[0]);
                int r = hutch_error_set(err, (int) pid, "starting a worker: %s",
                                        strerror((int) -pid));
                snapjob_discard(srv, j);
                return r;
        }
        j->srv = srv;
        j->pid = pid;
        j->running = true;
        (void) fd_set_nonblock(pfd[0], true);
        j->msg_w.cb = on_job_message;
        j->msg_w.data = j;
        j->pid_w.cb = on_job_exit;
        j->pid_w.data = j;
        if (loop_add(srv, &j->msg_w, pfd[0], EPOLLIN) < 0) {
                j->msg_w.fd = -1; /* the exit reads what is left */
                close(pfd[0]);
        }
        if (loop_add(srv, &j->pid_w, pidfd, EPOLLIN) < 0) {
                /* unwatchable: end it here and now */
                (void) sys_pidfd_send_signal(pidfd, SIGKILL, NULL, 0);
                int st;
                (void) worker_reap(pidfd, true, &st);
                close(pidfd);
                j->pid_w.fd = -1;
                j->running = false;
                snapjob_discard(srv, j);
                return hutch_error_set(err, -EIO, "watching a worker failed");
        }
        j->next = jobs;
        jobs = j;
        if (j->reads_sandbox) {
                sbx *sb = sbx_find(srv, j->sbx_id);
                if (sb)
                        sb->snapshotting = true;
        }
        if (req)
                (void) waiter_add(srv, j, req);
        log_debug("%s: worker %d started", j->ops->what, (int) pid);
        return 0;
}

/* ------------------------------------------------------------ requests */

void snapjob_request_gone(server *srv, request *req) {
        snapjob_waiter *w = req->snap_wait;
        if (!w)
                return;
        snapjob *j = w->job;
        if (w->holding) {
                snapjob_unhold(srv, req);
                return;
        }
        /* a suspended request is not freed by libmicrohttpd but at its stop:
         * this is for safety, not a path taken */
        bool parked = false;
        for (snapjob_waiter *p = j->parked; p; p = p->next)
                parked |= p == w;
        waiter_unwatch(srv, w);
        waiter_unlink(parked ? &j->parked : &j->waiters, w);
        req->snap_wait = NULL;
        waiter_free(w);
        if (!parked && !j->waiters && j->running)
                job_cancel(srv, j, 0, NULL);
}

void snapjobs_stop(server *srv) {
        for (snapjob *j = jobs, *next; j; j = next) {
                next = j->next;
                if (!j->running)
                        continue;
                job_cancel(srv, j, 503, "the daemon is stopping");
                int status = 0;
                if (j->pid_w.fd >= 0)
                        (void) worker_reap(j->pid_w.fd, true, &status);
                job_finish(srv, j, status);
        }
        /* done, and held by creates not dispatched again yet: they answer
         * 503 instead of making a sandbox while the daemon stops */
        while (jobs) {
                snapjob *j = jobs;
                snapjob_waiter *w = j->waiters;
                if (!w) {
                        job_free(srv, j);
                        continue;
                }
                request *req = w->req;
                req->resume_action = RESUME_NONE;
                http_defer_begin(req);
                http_reply_error(req->conn, 503, "the daemon is stopping");
                http_defer_end();
                if (w->holding)
                        snapjob_unhold(srv, req); /* the last one frees j */
                else {
                        waiter_unlink(&j->waiters, w);
                        req->snap_wait = NULL;
                        waiter_free(w);
                }
        }
        snapjobs_reap(srv);
}
