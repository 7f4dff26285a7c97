/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Admission of heavy control-plane requests (issue #19 item 2). A create, a
 * resume of a paused sandbox, a pause, a snapshot, a fork and a volume's
 * create run the engine synchronously on the loop: a create takes tens of
 * milliseconds on ns when the warm pool is empty, a gvisor one up to a
 * second. Run where libmicrohttpd hands them over, twenty creates of one
 * team read in one MHD_run() held every other team's requests, /health and
 * the envd streams included, until the last was made.
 *
 * So such a request is not run where it is read. Its connection is
 * suspended into its team's FIFO, and at the end of a loop turn (server.c,
 * after the turn served every ready event) admission_turn() resumes one,
 * taking the teams round-robin; libmicrohttpd calls the handler again in
 * the next turn's MHD_run(), which runs it there as before (its 201 is
 * still queued in the call that made the sandbox: docs/api.md "A create
 * cut by a crash"). A team's burst waits behind itself; another team's
 * request waits for at most one operation per team ahead of it in the
 * round.
 *
 * After one ran, the next waits until a turn found nothing ready (the loop
 * has caught up with what arrived meanwhile) or SPACING turns passed:
 * what another client does takes several turns (a process's start, its
 * exit, the end of its stream), and back to back creates put one into
 * each of them. SPACING bounds the wait when the loop is never idle.
 *
 * A team may have max-queued-per-team such requests waiting or running,
 * the daemon max-queued: beyond, 429 with Retry-After at once, never after
 * a wait. A waiting request whose client goes away (EPOLLRDHUP on its
 * socket, or found at its turn) is dropped without running. A stop answers
 * every waiting one 503.
 */
#include <poll.h>
#include <stdlib.h>
#include <sys/epoll.h>

#include "daemon/metrics.h"
#include "daemon/route.h"
#include "daemon/server.h"
#include "util/clock.h"
#include "util/log.h"

typedef struct adm_team {
        int64_t id;
        request *head, *tail; /* waiting, oldest first */
        unsigned n;
        struct adm_team *next; /* the round: teams with requests waiting */
} adm_team;

#define SPACING 8

static adm_team *round_head, *round_tail;
static unsigned n_queued;
static request *admitted;                  /* resumed for its turn, not run yet */
static unsigned turns_since_run = SPACING; /* loop turns since one ran, up to SPACING */

static adm_team *team_find(int64_t id) {
        for (adm_team *t = round_head; t; t = t->next)
                if (t->id == id)
                        return t;
        return NULL;
}

static void round_remove(adm_team *t) {
        adm_team *prev = NULL;
        for (adm_team *x = round_head; x; prev = x, x = x->next)
                if (x == t) {
                        if (prev)
                                prev->next = t->next;
                        else
                                round_head = t->next;
                        if (round_tail == t)
                                round_tail = prev;
                        t->next = NULL;
                        return;
                }
}

static void round_append(adm_team *t) {
        t->next = NULL;
        if (round_tail)
                round_tail->next = t;
        else
                round_head = t;
        round_tail = t;
}

/* Takes req out of its team's queue; a team left with none leaves the round. */
static void queue_unlink(request *req) {
        adm_team *t = team_find(req->adm.team);
        if (!t)
                return;
        request *prev = NULL;
        for (request *x = t->head; x; prev = x, x = x->adm.next)
                if (x == req) {
                        if (prev)
                                prev->adm.next = req->adm.next;
                        else
                                t->head = req->adm.next;
                        if (t->tail == req)
                                t->tail = prev;
                        req->adm.next = NULL;
                        t->n--;
                        n_queued--;
                        break;
                }
        if (t->n == 0) {
                round_remove(t);
                free(t);
        }
}

static void watch_stop(server *srv, request *req) {
        loop_del(srv, &req->adm.gone_w);
}

static void resume(server *srv, request *req) {
        srv->resumes++;
        MHD_resume_connection(req->conn);
}

/* Resumed without running: the handler closes the connection (http.c). */
static void drop(server *srv, request *req, const char *why) {
        log_debug("%s %s: dropped while it waited its turn: %s", req->method, req->url, why);
        req->adm.state = ADM_DROPPED;
        resume(srv, req);
}

static void on_gone(server *srv, watcher *w, uint32_t revents) {
        request *req = w->data;
        watch_stop(srv, req);
        queue_unlink(req);
        drop(srv, req, "the client went away");
}

/* The peer closed (or reset) its side. A client that half-closes after its
 * request is taken as gone, as libmicrohttpd itself does on EOF. */
static bool client_gone(request *req) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
                req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci)
                return false;
        struct pollfd p = { .fd = ci->connect_fd, .events = POLLRDHUP };
        return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

enum MHD_Result admission_gate(server *srv, request *req, int op, bool *ret_wait) {
        *ret_wait = false;
        if (req->adm.state == ADM_RUN)
                return MHD_YES; /* its turn came */
        *ret_wait = true;
        adm_team *t = team_find(req->team);
        uint64_t held = (t ? t->n : 0) + (admitted && admitted->adm.team == req->team);
        if (held >= srv->cfg.max_queued_per_team) {
                metrics_admission_refused(srv, "team");
                return http_reply_429(
                        req->conn, 1,
                        "the team has %llu requests that create, resume, pause or snapshot "
                        "sandboxes waiting or running, its limit (max-queued-per-team): try again later",
                        (unsigned long long) held);
        }
        if (n_queued + (admitted != NULL) >= srv->cfg.max_queued) {
                metrics_admission_refused(srv, "daemon");
                return http_reply_429(req->conn, 1,
                                      "the daemon has %u requests that create, resume, pause or snapshot "
                                      "sandboxes waiting, its limit (max-queued): try again later",
                                      n_queued + (admitted != NULL));
        }
        if (!t) {
                t = calloc(1, sizeof *t);
                if (!t)
                        return MHD_NO;
                t->id = req->team;
                round_append(t);
        }
        req->adm = (struct admission_entry) {
                .state = ADM_QUEUED,
                .op = op,
                .team = req->team,
                .queued_ns = clock_ns(CLOCK_MONOTONIC),
                .gone_w = { .fd = -1, .cb = on_gone, .data = req },
        };
        if (t->tail)
                t->tail->adm.next = req;
        else
                t->head = req;
        t->tail = req;
        t->n++;
        n_queued++;
        MHD_suspend_connection(req->conn);
        /* libmicrohttpd takes a suspended connection out of its epoll set and
         * reads nothing from it: a client that goes away is seen here */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
                req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || loop_add(srv, &req->adm.gone_w, ci->connect_fd, EPOLLRDHUP) < 0)
                req->adm.gone_w.fd = -1; /* seen at its turn instead (client_gone) */
        log_debug("%s %s: waits its turn (%u of its team's, %u in all)", req->method, req->url,
                  t->n, n_queued);
        return MHD_YES;
}

void admission_resumed(server *srv, request *req) {
        if (req->adm.state != ADM_ADMITTED)
                return;
        req->adm.state = ADM_RUN;
        turns_since_run = 0;
        if (admitted == req)
                admitted = NULL;
        metrics_admission_wait(srv, req->adm.op, clock_ns(CLOCK_MONOTONIC) - req->adm.queued_ns);
}

bool admission_turn(server *srv, bool quiet) {
        if (turns_since_run < SPACING)
                turns_since_run++;
        /* 1: one ran in this very turn, and what came meanwhile is unread */
        if (round_head && !admitted && (turns_since_run < 2 || (!quiet && turns_since_run < SPACING)))
                return true; /* go round without sleeping: the next turn may admit */
        bool resumed = false;
        while (!admitted && round_head) {
                adm_team *t = round_head;
                request *req = t->head;
                t->head = req->adm.next;
                if (!t->head)
                        t->tail = NULL;
                req->adm.next = NULL;
                t->n--;
                n_queued--;
                /* the round goes on with the next team */
                round_remove(t);
                if (t->n)
                        round_append(t);
                else
                        free(t);
                watch_stop(srv, req);
                resumed = true;
                if (client_gone(req)) {
                        drop(srv, req, "the client went away");
                        continue;
                }
                req->adm.state = ADM_ADMITTED;
                admitted = req;
                resume(srv, req);
        }
        return resumed;
}

bool admission_busy(void) {
        return round_head || admitted;
}

unsigned admission_queued(void) {
        return n_queued;
}

void admission_forget(server *srv, request *req) {
        if (req->adm.state == ADM_QUEUED) {
                watch_stop(srv, req);
                queue_unlink(req);
        }
        if (admitted == req)
                admitted = NULL;
        req->adm.state = ADM_NONE;
}

static void answer_stopping(server *srv, request *req) {
        static const char body[] = "{\"code\":503,\"message\":\"the daemon is stopping\"}";
        struct MHD_Response *resp = MHD_create_response_from_buffer(sizeof body - 1, (void *) body,
                                                                    MHD_RESPMEM_PERSISTENT);
        if (resp) {
                MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
                if (req->deferred)
                        MHD_destroy_response(req->deferred);
                req->deferred = resp;
                req->deferred_status = 503;
        }
        /* without a reply (out of memory) it is dropped: the connection closes */
        req->adm.state = ADM_DROPPED;
}

void admission_stop(server *srv) {
        if (admitted) {
                answer_stopping(srv, admitted); /* resumed already: it must not run now */
                admitted = NULL;
        }
        while (round_head) {
                request *req = round_head->head;
                watch_stop(srv, req);
                queue_unlink(req);
                answer_stopping(srv, req);
                resume(srv, req);
        }
}
