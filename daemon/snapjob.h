/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshot work off the loop (daemon/snapjob.c): a job is one worker
 * process (lib/util/worker.h) that copies, seals or unseals, and the
 * requests that wait for it, their connections suspended. The kinds of
 * job (snapshot, fork, restore) are daemon/snapshots.c's.
 */
#pragma once

#include <stdint.h>

#include "daemon/server.h"

/* What a worker tells the loop: one message per step, each smaller than
 * PIPE_BUF, so that every write arrives whole. */
enum {
        SNAPJOB_READ = 1, /* the sandbox's layer is copied: it may run (and be written) again */
        SNAPJOB_DONE = 2, /* the work is done (r < 0: it failed) */
};
typedef struct snapjob_msg {
        int32_t step;
        int32_t r; /* >= 0, or -errno */
        uint64_t bytes;
        uint64_t aux;  /* the kind's */
        char why[232]; /* what failed, for the log; no host path reaches a client */
} snapjob_msg;

#define SNAPJOB_FDS 20 /* a fork's: its stream, the layer's root and image, and 16 new images */

typedef struct snapjob snapjob;
typedef struct snapjob_ops {
        const char *what; /* "snapshot", "fork", "restore": in logs */
        /* In the worker, which holds only j->fds (renumbered) and msg_fd:
         * the blocking part. Sends its messages (snapjob_send). */
        int (*work)(snapjob *j, int msg_fd);
        /* On the loop, once the worker is gone and was not cancelled: m is
         * its last message (a DONE, or a failure made up when it died
         * without one). What happens once whoever waits: rows, events. */
        void (*done)(server *srv, snapjob *j, const snapjob_msg *m);
        /* On the loop, per waiting request, its replies deferred: queue the
         * answer, or take a hold on the job's result (snapjob_hold) and set
         * req->resume_action = RESUME_DISPATCH. */
        void (*answer)(server *srv, snapjob *j, request *req);
        /* Last, on the loop: temporary files and j->data. */
        void (*release)(server *srv, snapjob *j);
} snapjob_ops;

typedef struct snapjob_waiter snapjob_waiter;

struct snapjob {
        const snapjob_ops *ops;
        int64_t team;
        char sbx_id[HUTCH_ID_LEN + 1]; /* the sandbox it copies ("" none): one job at a time each */
        char key[96];         /* what it makes, for requests that want the same ("" none) */
        bool reads_sandbox;   /* until its READ the sandbox's layer is read: nothing may write
                                  to it or thaw it, its data-plane requests wait (parked) */
        bool thaw;            /* it froze the sandbox: thaw it at the READ */
        int fds[SNAPJOB_FDS]; /* what the worker gets (-1: none); closed here once it has them */
        void *data;           /* the kind's */
        /* the runner's */
        server *srv;
        pid_t pid;
        watcher pid_w, msg_w;
        bool running;
        bool cancelled;
        unsigned cancel_status; /* 0: the client went away, no answer */
        char cancel_msg[160];
        bool got_done;
        snapjob_msg last;
        snapjob_waiter *waiters, *parked;
        unsigned holds;
        snapjob *next;
};

/* in the worker */
void snapjob_send(int msg_fd, int step, int r, uint64_t bytes, uint64_t aux, const char *why);

/* A job for sbx_id ("" or NULL: none) of team may start now: 0; or its
 * answer is queued (409 while another job copies that sandbox, 429 past
 * snapshot-jobs or snapshot-jobs-per-team) and -EBUSY. */
int snapjob_admit(server *srv, request *req, int64_t team, const char *sbx_id);
snapjob *snapjob_new(const snapjob_ops *ops, int64_t team, const char *sbx_id);
/* Start j's worker; req (may be NULL) waits for it, suspended. On failure
 * j is discarded (below), and nothing waits. */
int snapjob_start(server *srv, snapjob *j, request *req, hutch_error *err);
/* A job that never started: its sandbox thawed (j->thaw), its kind's
 * release called, its descriptors closed, freed. */
void snapjob_discard(server *srv, snapjob *j);
/* A job making key: running (join it) or done and still held (use it). */
snapjob *snapjob_find(server *srv, const char *key);
int snapjob_join(server *srv, snapjob *j, request *req);
/* req uses j's result until snapjob_unhold (or its end). */
int snapjob_hold(server *srv, snapjob *j, request *req);
snapjob *snapjob_held(request *req);
void snapjob_unhold(server *srv, request *req);
