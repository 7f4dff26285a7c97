/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ingress: requests to a port of a sandbox (docs/api.md "Sandbox ports").
 *
 * A request names the port with E2b-Sandbox-Id + E2b-Sandbox-Port, or with
 * Host "<port>-<id>.<sandbox-domain>". libmicrohttpd parses the client's
 * request as for every other route; the daemon opens a TCP connection to
 * 127.0.0.1:<port> *inside the sandbox's network namespace* (setns into it,
 * socket(), setns back: the socket lives there, the daemon holds it), writes
 * a request head of its own making and the body as it arrives, and relays
 * the answer as it comes. Nothing is buffered whole: each direction has a
 * bounded buffer, and a full one suspends the other side (the client's MHD
 * connection, or the upstream socket's EPOLLIN). Upgrades (WebSocket, ...)
 * get the upstream's 101 and then the two sockets are joined on the loop.
 *
 * The sandbox gets no route out of this: the socket is the daemon's, made in
 * the sandbox's netns and connected to its loopback; the sandbox sees an
 * accepted connection from 127.0.0.1, and nothing in its netns changes.
 *
 * Framing is never relayed: the daemon frames the request body itself
 * (Content-Length as MHD read it, or chunked anew) and decodes the
 * upstream's framing (daemon/ingress_http.c, strict, fuzzed) so that MHD
 * frames the response anew. A request the two sides could read two ways
 * never reaches the sandbox (two Content-Lengths, a Transfer-Encoding
 * other than chunked, CR/LF inside a field).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/hmac.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/ingress.h"
#include "daemon/ingress_http.h"
#include "daemon/ingress_h2.h"
#include "daemon/route.h"
#include "daemon/server.h"
#include "sandbox/initproto.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/log.h"

#define BUF_CAP (256 * 1024)                   /* per direction */
#define UPGRADED_TURN (1024 * 1024)            /* read per direction per call, upgraded */
#define GVISOR_INIT_PATH INITPROTO_GVISOR_INIT /* hutch-init inside a gvisor sandbox */

enum {
        ST_CONNECTING = 1,
        ST_SENDING,    /* connected: the request goes out, the head is awaited */
        ST_HEAD,       /* the response head is here; MHD's final call queues it */
        ST_RESPONDING, /* queued: MHD pulls the body */
        ST_UPGRADED,   /* 101: two sockets joined */
        ST_FAILED,     /* no response: a 502 at the final call */
};

typedef struct ibuf {
        char *p;
        size_t off, len, cap;
} ibuf;

struct ingress_conn {
        server *srv;
        char sbx_id[HUTCH_ID_LEN + 1];
        unsigned port;
        request *req; /* NULL once MHD freed the request */
        struct MHD_Connection *conn;
        int state;
        watcher uw; /* upstream socket (gvisor: the connector's stdout, read) */
        watcher ww; /* gvisor: the connector's stdin, written; fd -1 on ns (uw both ways) */
        int parked_wfd;
        watcher cw; /* the client's socket, once upgraded */
        bool suspended;
        bool req_chunked, req_done, head_request;
        bool up_eof, up_wr_dead, body_done, body_error;
        bool resp_alive; /* the MHD response (its reader) holds us */
        bool cut;
        bool closed; /* fds closed, off the live list */
        bool c_eof;  /* upgraded: the client's side ended */
        bool c_shut, u_shut;
        int fail_kind; /* ST_FAILED: 0 closed port, 1 bad response, 2 gone */
        ibuf out;      /* to the upstream */
        ibuf in;       /* from the upstream: the head, then the decoded body */
        ingress_resp_head *head;
        ingress_chunked ck;
        uint64_t body_left;
        struct MHD_UpgradeResponseHandle *urh;
        int parked_fd; /* the upstream between the 101 and the upgrade handler */
        bool reused;   /* the upstream came from the idle pool */
        bool leftover; /* the upstream sent bytes after its response: never reused */
        bool up_close; /* the response says the upstream closes (or HTTP/1.0) */
        ibuf replay;   /* a reused upstream's request so far, resent once if it was gone */
        bool replay_on;
        ingress_conn *next, *prev;
        ingress_conn *next_zombie;
        bool zombie;
};

static ingress_conn *live;
static ingress_conn *zombies;
static int self_netns = -1;

/* Idle upstream connections, kept after a cleanly framed response so that
 * the next request to the same port of the same sandbox skips the connect
 * (and the server's accept). Any byte or hang-up while idle closes one: a
 * server that writes unasked would otherwise answer the next request. */
#define POOL_PER_PORT 8
typedef struct idle_up {
        watcher w; /* the read end (the socket on ns) */
        int wfd;   /* gvisor: the connector's stdin; -1 on ns */
        char sbx_id[HUTCH_ID_LEN + 1];
        unsigned port;
        struct idle_up *next, *prev;
} idle_up;
static idle_up *idle;
static idle_up *idle_zombies;

/* gvisor: a connector costs a spawn, which blocks the loop for a while
 * (~100 ms on ptrace), and a port needs no key: a port found closed is
 * answered from here for a second, so that a flood of requests to closed
 * ports of a known sandbox cannot keep the daemon spawning. */
#define CLOSED_CACHE 64
#define CLOSED_CACHE_MS 1000
static struct closed_port {
        char sbx_id[HUTCH_ID_LEN + 1];
        unsigned port;
        int64_t until_ms;
} closed_cache[CLOSED_CACHE];
static unsigned closed_next;

static void closed_note(const char *sbx_id, unsigned port) {
        struct closed_port *c = &closed_cache[closed_next++ % CLOSED_CACHE];
        memcpy(c->sbx_id, sbx_id, sizeof c->sbx_id);
        c->port = port;
        c->until_ms = wall_ms() + CLOSED_CACHE_MS;
}

/* gvisor: connectors of one sandbox, in use or pooled, are at most this many */
#define CONNECTORS_MAX 64

static unsigned connectors_of(const char *sbx_id);

static bool closed_recently(const char *sbx_id, unsigned port) {
        int64_t now = wall_ms();
        for (unsigned i = 0; i < CLOSED_CACHE; i++)
                if (closed_cache[i].until_ms > now && closed_cache[i].port == port &&
                    streq(closed_cache[i].sbx_id, sbx_id))
                        return true;
        return false;
}

static void idle_drop(server *srv, idle_up *u) {
        int fd = u->w.fd;
        loop_del(srv, &u->w);
        safe_close(fd);
        safe_close(u->wfd);
        if (u->prev)
                u->prev->next = u->next;
        else
                idle = u->next;
        if (u->next)
                u->next->prev = u->prev;
        /* an event of it may still be in this batch of the loop: freed
         * after it (ingress_reap) */
        u->w.cb = NULL;
        u->prev = NULL;
        u->next = idle_zombies;
        idle_zombies = u;
}

static void on_idle(server *srv, watcher *w, uint32_t revents) {
        idle_drop(srv, w->data);
}

static void pool_put(server *srv, const char *sbx_id, unsigned port, int fd, int wfd) {
        unsigned n = 0;
        for (idle_up *u = idle; u; u = u->next)
                n += u->port == port && streq(u->sbx_id, sbx_id);
        idle_up *u = n < POOL_PER_PORT ? calloc(1, sizeof *u) : NULL;
        if (!u) {
                close(fd);
                safe_close(wfd);
                return;
        }
        u->wfd = wfd;
        memcpy(u->sbx_id, sbx_id, sizeof u->sbx_id);
        u->port = port;
        u->w.cb = on_idle;
        u->w.data = u;
        if (loop_add(srv, &u->w, fd, EPOLLIN | EPOLLRDHUP) < 0) {
                close(fd);
                safe_close(wfd);
                free(u);
                return;
        }
        u->next = idle;
        if (idle)
                idle->prev = u;
        idle = u;
}

static int pool_take(server *srv, const char *sbx_id, unsigned port, int *ret_wfd) {
        *ret_wfd = -1;
        for (idle_up *u = idle; u; u = u->next) {
                if (u->port != port || !streq(u->sbx_id, sbx_id))
                        continue;
                int fd = u->w.fd, wfd = u->wfd;
                loop_del(srv, &u->w);
                u->w.fd = u->wfd = -1;
                idle_drop(srv, u);
                /* still open, and quiet (a socket or a pipe alike) */
                struct pollfd pf = { .fd = fd, .events = POLLIN | POLLRDHUP };
                if (poll(&pf, 1, 0) == 0) {
                        *ret_wfd = wfd;
                        return fd;
                }
                close(fd); /* closed, or bytes nobody asked for */
                safe_close(wfd);
                return -1;
        }
        return -1;
}

static unsigned connectors_of(const char *sbx_id) {
        unsigned n = 0;
        for (idle_up *u = idle; u; u = u->next)
                n += u->wfd >= 0 && streq(u->sbx_id, sbx_id);
        for (ingress_conn *ic = live; ic; ic = ic->next)
                n += (ic->ww.fd >= 0 || ic->parked_wfd >= 0) && streq(ic->sbx_id, sbx_id);
        return n + ingress_h2_connectors_of(sbx_id);
}

static void pool_cut(server *srv, const char *sbx_id) {
        for (idle_up *u = idle, *next; u; u = next) {
                next = u->next;
                if (!sbx_id || streq(u->sbx_id, sbx_id))
                        idle_drop(srv, u);
        }
}

/* ------------------------------------------------------------- buffers */

static size_t ib_pending(const ibuf *b) {
        return b->len - b->off;
}

static int ib_reserve(ibuf *b, size_t more) {
        if (b->off == b->len)
                b->off = b->len = 0;
        if (b->len + more <= b->cap)
                return 0;
        if (b->off > 0) {
                memmove(b->p, b->p + b->off, b->len - b->off);
                b->len -= b->off;
                b->off = 0;
                if (b->len + more <= b->cap)
                        return 0;
        }
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + more)
                cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
                return -ENOMEM;
        b->p = p;
        b->cap = cap;
        return 0;
}

static int ib_append(ibuf *b, const void *p, size_t n) {
        int r = ib_reserve(b, n);
        if (r < 0)
                return r;
        memcpy(b->p + b->len, p, n);
        b->len += n;
        return 0;
}

static int ib_printf(ibuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ib_printf(ibuf *b, const char *fmt, ...) {
        char tmp[512];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t) n >= sizeof tmp)
                return -E2BIG;
        return ib_append(b, tmp, (size_t) n);
}

/* ------------------------------------------------------------ lifecycle */

#define REPLAY_MAX (128 * 1024)

static void replay_add(ingress_conn *ic, const void *p, size_t n) {
        if (!ic->replay_on)
                return;
        if (ic->replay.len + n > REPLAY_MAX || ib_append(&ic->replay, p, n) < 0) {
                ic->replay_on = false;
                free(ic->replay.p);
                ic->replay = (ibuf) { 0 };
        }
}

static void ic_suspend(ingress_conn *ic) {
        if (!ic->suspended && ic->conn) {
                ic->suspended = true;
                MHD_suspend_connection(ic->conn);
        }
}

static void ic_resume(ingress_conn *ic) {
        if (ic->suspended && ic->conn) {
                ic->suspended = false;
                ic->srv->resumes++;
                MHD_resume_connection(ic->conn);
        }
}

static bool up_split(const ingress_conn *ic) {
        return ic->ww.fd >= 0; /* gvisor: a connector's two pipes */
}

static void up_close_fds(ingress_conn *ic) {
        watcher *ws[2] = { &ic->uw, &ic->ww };
        for (int i = 0; i < 2; i++)
                if (ws[i]->fd >= 0) {
                        int fd = ws[i]->fd;
                        loop_del(ic->srv, ws[i]);
                        close(fd);
                }
}

static void ic_close_fds(ingress_conn *ic) {
        up_close_fds(ic);
        ic->uw.cb = NULL;
        ic->ww.cb = NULL;
        ic->parked_fd = safe_close(ic->parked_fd);
        ic->parked_wfd = safe_close(ic->parked_wfd);
        if (ic->cw.fd >= 0)
                loop_del(ic->srv, &ic->cw); /* MHD's socket: MHD closes it */
        ic->cw.cb = NULL;
        if (ic->urh) {
                struct MHD_UpgradeResponseHandle *urh = ic->urh;
                ic->urh = NULL;
                MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
        }
}

/* Freed after the loop's event batch (ingress_reap): an event for one of
 * its watchers may still be in that batch. */
static void ic_maybe_free(ingress_conn *ic) {
        if (ic->req || ic->resp_alive || !ic->closed || ic->urh)
                return;
        if (ic->zombie)
                return;
        ic->zombie = true;
        ic->next_zombie = zombies;
        zombies = ic;
}

static void ic_close(ingress_conn *ic) {
        if (!ic->closed) {
                ic->closed = true;
                ic_close_fds(ic);
                if (ic->prev)
                        ic->prev->next = ic->next;
                else if (live == ic)
                        live = ic->next;
                if (ic->next)
                        ic->next->prev = ic->prev;
                ic->next = ic->prev = NULL;
        }
        ic_maybe_free(ic);
}

void ingress_reap(server *srv) {
        ingress_h2_reap();
        while (idle_zombies) {
                idle_up *u = idle_zombies;
                idle_zombies = u->next;
                free(u);
        }
        while (zombies) {
                ingress_conn *ic = zombies;
                zombies = ic->next_zombie;
                free(ic->out.p);
                free(ic->in.p);
                free(ic->head);
                free(ic->replay.p);
                free(ic);
        }
}

static void up_finish(ingress_conn *ic);

void ingress_request_gone(ingress_conn *ic) {
        /* MHD stops calling the reader once a known length is sent: the
         * upstream's response may be complete without an END_OF_STREAM */
        if (ic->state == ST_RESPONDING && ic->body_done && ib_pending(&ic->in) == 0 && !ic->closed)
                up_finish(ic);
        ic->req = NULL;
        ic->conn = NULL;
        ic->suspended = false;
        if (ic->state != ST_UPGRADED)
                ic_close(ic);
        else
                ic_maybe_free(ic);
}

void ingress_sbx_cut(server *srv, sbx *sb) {
        pool_cut(srv, sb->id);
        ingress_h2_sbx_cut(srv, sb->id);
        for (ingress_conn *ic = live, *next; ic; ic = next) {
                next = ic->next;
                if (!streq(ic->sbx_id, sb->id))
                        continue;
                ic->cut = true;
                ic_resume(ic);
                ic_close(ic);
        }
}

void ingress_stop(server *srv) {
        pool_cut(srv, NULL);
        ingress_h2_stop(srv);
        for (ingress_conn *ic = live, *next; ic; ic = next) {
                next = ic->next;
                ic->cut = true;
                ic_resume(ic);
                ic_close(ic);
        }
}

/* ------------------------------------------------------------ answers */

static bool client_is_browser(struct MHD_Connection *c) {
        const char *ua = http_header(c, "User-Agent");
        return ua && strncmp(ua, "Mozilla/", 8) == 0;
}

/* E2B's answer for a port nothing listens on (its SDK tests read it). */
static enum MHD_Result reply_closed_port(struct MHD_Connection *c, const char *id, unsigned port) {
        if (client_is_browser(c)) {
                char html[1024];
                snprintf(html, sizeof html,
                         "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Closed Port Error</title></head>"
                         "<body><h1>Closed Port Error</h1><p>The sandbox %s is running but there is no service "
                         "running on port %u.</p></body></html>",
                         id, port);
                return http_reply_text(c, 502, "text/html; charset=utf-8", html);
        }
        return http_reply_json(c, 502,
                               json_pack("{s:s, s:s, s:i, s:i}", "sandboxId", id, "message",
                                         "The sandbox is running but port is not open", "port",
                                         (int) port, "code", 502));
}

static enum MHD_Result reply_failed(ingress_conn *ic) {
        struct MHD_Connection *c = ic->conn;
        if (ic->fail_kind == 2)
                return http_reply_502(c, ic->sbx_id);
        if (ic->fail_kind == 1)
                return http_reply_json(
                        c, 502,
                        json_pack("{s:s, s:s, s:i, s:i}", "sandboxId", ic->sbx_id, "message",
                                  "The sandbox's server on this port sent no valid HTTP response",
                                  "port", (int) ic->port, "code", 502));
        return reply_closed_port(c, ic->sbx_id, ic->port);
}

static void ic_fail(ingress_conn *ic, int kind) {
        if (ic->state >= ST_HEAD && ic->state != ST_FAILED) {
                /* mid-body: the client's response ends with an error */
                ic->body_error = true;
                ic_close(ic);
                ic_resume(ic);
                return;
        }
        ic->state = ST_FAILED;
        ic->fail_kind = kind;
        if (kind == 0 && up_split(ic))
                closed_note(ic->sbx_id, ic->port);
        up_close_fds(ic);
        ic->out.off = ic->out.len = 0;
        ic_resume(ic);
}

/* ------------------------------------------------------------- upstream */

static void up_update(ingress_conn *ic);
static bool up_retry(ingress_conn *ic);


static void up_events(ingress_conn *ic, uint32_t ev) {
        if (up_split(ic)) {
                (void) loop_mod(ic->srv, &ic->ww, ev & EPOLLOUT);
                ev &= ~(uint32_t) EPOLLOUT;
        }
        if (ic->uw.fd >= 0)
                (void) loop_mod(ic->srv, &ic->uw, ev);
}

static ssize_t up_send(ingress_conn *ic, const void *p, size_t n) {
        if (up_split(ic))
                return write(ic->ww.fd, p, n);
        if (ic->uw.fd < 0) {
                errno = EPIPE;
                return -1;
        }
        return send(ic->uw.fd, p, n, MSG_NOSIGNAL);
}

/* Decode what was just read at in.p[in.len .. in.len + n) into the body. */
static int body_take(ingress_conn *ic, size_t n) {
        char *at = ic->in.p + ic->in.len;
        switch (ic->head->body) {
        case INGRESS_BODY_NONE:
                ic->body_done = true;
                if (n > 0)
                        ic->leftover = true;
                return 0; /* anything after a bodiless response is dropped */
        case INGRESS_BODY_LENGTH:
                if (n > ic->body_left) {
                        n = (size_t) ic->body_left;
                        ic->leftover = true;
                }
                ic->body_left -= n;
                ic->in.len += n;
                if (ic->body_left == 0)
                        ic->body_done = true;
                return 0;
        case INGRESS_BODY_CHUNKED: {
                size_t used;
                ssize_t d = ingress_chunked_decode(&ic->ck, (uint8_t *) at, n, &used);
                if (d < 0)
                        return (int) d;
                ic->in.len += (size_t) d;
                if (ic->ck.done) {
                        ic->body_done = true;
                        if (used < n)
                                ic->leftover = true;
                }
                return 0;
        }
        default:
                ic->in.len += n;
                return 0;
        }
}

static void head_arrived(ingress_conn *ic) {
        /* the fields point into in, which stays as it is until the final
         * call copies them into the MHD response (body_start then moves
         * the bytes after the head to in's front) */
        ic->state = ST_HEAD;
        if (ic->head->body == INGRESS_BODY_LENGTH) {
                ic->body_left = ic->head->content_length;
                if (ic->body_left == 0)
                        ic->body_done = true;
        }
        if (ic->head->body == INGRESS_BODY_NONE && ic->head->status != 101)
                ic->body_done = true;
        ic_resume(ic);
}

static int up_read_head(ingress_conn *ic) {
        for (;;) {
                if (ib_reserve(&ic->in, 16384) < 0)
                        return -ENOMEM;
                if (ic->in.len >= INGRESS_HEAD_MAX + 16384)
                        return -E2BIG;
                ssize_t n = read(ic->uw.fd, ic->in.p + ic->in.len, ic->in.cap - ic->in.len);
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                return 0;
                        return -errno;
                }
                if (n == 0)
                        return -ECONNRESET;
                ic->in.len += (size_t) n;
                for (;;) {
                        int r = ingress_resp_head_parse(ic->in.p + ic->in.off,
                                                        ic->in.len - ic->in.off, ic->head_request,
                                                        ic->head);
                        if (r < 0)
                                return r;
                        if (r == 0)
                                break;
                        if (ic->head->interim) {
                                ic->in.off += ic->head->head_len;
                                continue;
                        }
                        /* the head at in's front, so that its fields stay put */
                        if (ic->in.off) {
                                memmove(ic->in.p, ic->in.p + ic->in.off, ic->in.len - ic->in.off);
                                ic->in.len -= ic->in.off;
                                ic->in.off = 0;
                                r = ingress_resp_head_parse(ic->in.p, ic->in.len, ic->head_request,
                                                            ic->head);
                                if (r <= 0)
                                        return -EBADMSG;
                        }
                        return 1;
                }
        }
}

/* After the head was copied into the response: the body bytes that came
 * with it, decoded, at in's front. */
static int body_start(ingress_conn *ic) {
        size_t hl = ic->head->head_len, rest = ic->in.len - hl;
        memmove(ic->in.p, ic->in.p + hl, rest);
        ic->in.off = 0;
        ic->in.len = 0;
        /* a 101: what came with its head is the new protocol's, raw (the
         * state is not ST_UPGRADED yet when queue_response calls this; a
         * server that speaks first, as an h2c one does, loses its first
         * bytes otherwise) */
        if (ic->state == ST_UPGRADED || ic->head->status == 101) {
                ic->in.len = rest; /* raw bytes of the new protocol */
                return 0;
        }
        return body_take(ic, rest);
}

static int up_read_body(ingress_conn *ic) {
        while (!ic->body_done && !ic->up_eof) {
                /* bounded: a slow client stops the upstream here */
                if (ib_pending(&ic->in) >= BUF_CAP)
                        return 0;
                if (ib_reserve(&ic->in, 16384) < 0)
                        return -ENOMEM;
                size_t room = ic->in.cap - ic->in.len;
                if (room > BUF_CAP)
                        room = BUF_CAP;
                ssize_t n = read(ic->uw.fd, ic->in.p + ic->in.len, room);
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                return 0;
                        return -errno;
                }
                if (n == 0) {
                        ic->up_eof = true;
                        if (ic->head->body == INGRESS_BODY_CLOSE)
                                ic->body_done = true;
                        else if (!ic->body_done)
                                return -ECONNRESET; /* cut short */
                        return 0;
                }
                int r = body_take(ic, (size_t) n);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int up_write(ingress_conn *ic) {
        while (ib_pending(&ic->out) > 0) {
                ssize_t n = up_send(ic, ic->out.p + ic->out.off, ib_pending(&ic->out));
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                return 0;
                        return -errno;
                }
                ic->out.off += (size_t) n;
        }
        ic->out.off = ic->out.len = 0;
        return 0;
}

/* upgraded: the upstream → client and client → upstream pumps */
static void upgraded_pump(ingress_conn *ic);

static void on_up(server *srv, watcher *w, uint32_t revents) {
        ingress_conn *ic = w->data;
        if (ic->closed)
                return;
        if (w == &ic->ww && (revents & (EPOLLERR | EPOLLHUP))) {
                /* the connector stopped reading: what is left of the request is dropped */
                int fd = ic->ww.fd;
                loop_del(srv, &ic->ww);
                close(fd);
                ic->up_wr_dead = true;
                ic->u_shut = true;
                ic->out.off = ic->out.len = 0;
                if (ic->state == ST_UPGRADED)
                        ic->c_eof = true;
                return;
        }
        if (ic->state == ST_UPGRADED) {
                upgraded_pump(ic);
                return;
        }
        if (ic->state == ST_CONNECTING) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                        soerr = errno;
                if (soerr) {
                        ic_fail(ic, 0);
                        return;
                }
                if (!(revents & (EPOLLOUT | EPOLLIN | EPOLLHUP | EPOLLERR)))
                        return;
                ic->state = ST_SENDING;
        }
        if (!ic->up_wr_dead && ib_pending(&ic->out) > 0) {
                int r = up_write(ic);
                if (r < 0) {
                        /* the server stopped reading (it may have answered
                         * already): drop the rest of the request */
                        ic->up_wr_dead = true;
                        ic->out.off = ic->out.len = 0;
                }
                if (ib_pending(&ic->out) < BUF_CAP / 2)
                        ic_resume(ic); /* more of the request body */
        }
        if (ic->state == ST_SENDING && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                int r = up_read_head(ic);
                if (r < 0) {
                        /* closed before a byte: nothing serves the port
                         * (really: the listener went away); else a bad answer */
                        bool silent = (r == -ECONNRESET || r == -ECONNREFUSED) && ic->in.len == 0;
                        if (silent && up_retry(ic))
                                return;
                        ic_fail(ic, silent ? 0 : 1);
                        return;
                }
                if (r == 1)
                        head_arrived(ic);
        } else if (ic->state == ST_RESPONDING && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                int r = up_read_body(ic);
                if (r < 0) {
                        ic_fail(ic, 2);
                        return;
                }
                ic_resume(ic);
        }
        up_update(ic);
}

static void up_update(ingress_conn *ic) {
        if (ic->closed || ic->uw.fd < 0 || ic->state == ST_UPGRADED)
                return;
        uint32_t ev = 0;
        if (ic->state == ST_CONNECTING || (!ic->up_wr_dead && ib_pending(&ic->out) > 0))
                ev |= EPOLLOUT;
        if (ic->state == ST_SENDING)
                ev |= EPOLLIN;
        if (ic->state == ST_RESPONDING && !ic->body_done && !ic->up_eof &&
            ib_pending(&ic->in) < BUF_CAP)
                ev |= EPOLLIN;
        up_events(ic, ev);
}

/* The upstream socket, made in the sandbox's netns: the sandbox gains no
 * route, the daemon gets a socket whose loopback is the sandbox's. */
static int up_socket(sbx *sb, int *ret_fd) {
        if (self_netns < 0) {
                self_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
                if (self_netns < 0)
                        return -errno;
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/net", (int) hutch_sandbox_init_pid(sb->h));
        _cleanup_close_ int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0)
                return -errno;
        if (setns(ns, CLONE_NEWNET) < 0)
                return -errno;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int r = fd < 0 ? -errno : 0;
        if (setns(self_netns, CLONE_NEWNET) < 0) {
                log_error_errno(-errno, "ingress: cannot return to the daemon's netns: %m");
                abort();
        }
        if (r < 0)
                return r;
        int one = 1;
        (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        *ret_fd = fd;
        return 0;
}

/* gvisor: the sandbox's loopback is inside the sentry. A connector
 * (hutch-init --ingress-connect PORT, init/connect.c) spawned in the
 * sandbox joins its stdin and stdout, which the relay carries as mux
 * streams, to 127.0.0.1:PORT there. Returns the read and write ends. */
static int up_connector(server *srv, sbx *sb, unsigned port, int *ret_rfd, int *ret_wfd) {
        char ps[8];
        snprintf(ps, sizeof ps, "%u", port);
        const char *argv[] = { GVISOR_INIT_PATH, "--ingress-connect", ps, NULL };
        const char *envp[] = { "PATH=/usr/bin:/bin", NULL };
        hutch_spawn_config cfg = { .argv = argv,
                                   .envp = envp,
                                   .cwd = "/",
                                   .uid = 0,
                                   .gid = 0,
                                   .stdin_mode = HUTCH_STDIN_PIPE,
                                   .tag = INGRESS_CONNECTOR_TAG };
        hutch_process pr = { .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1 };
        hutch_error err = { 0 };
        int r = hutch_sandbox_spawn(sb->h, &cfg, &pr, &err);
        sbx_mark_dirty(sb); /* events may have come with the reply */
        if (r < 0) {
                log_warning("sandbox %s: ingress connector: %s", sb->id, err.msg);
                return r;
        }
        safe_close(pr.stderr_fd);
        int fds[2] = { pr.stdout_fd, pr.stdin_fd };
        for (int i = 0; i < 2; i++) {
                int fl = fcntl(fds[i], F_GETFL);
                if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) < 0) {
                        safe_close(pr.stdout_fd);
                        safe_close(pr.stdin_fd);
                        return -errno;
                }
        }
        *ret_rfd = pr.stdout_fd;
        *ret_wfd = pr.stdin_fd;
        return 0;
}

/* ------------------------------------------------------------- upgrade */

static void upgraded_finish_if_done(ingress_conn *ic) {
        /* both directions ended and flushed, or one failed */
        if (ic->c_eof && ic->up_eof && ib_pending(&ic->in) == 0 && ib_pending(&ic->out) == 0)
                ic_close(ic);
}

static void upgraded_pump(ingress_conn *ic) {
        char buf[65536];
        /* At most UPGRADED_TURN bytes each way per call: a fast pair of
         * ends would otherwise keep this loop, and everyone behind it,
         * here for as long as they talk. The watches are level-triggered:
         * what is left is taken in the next loop turn. */
        size_t budget = UPGRADED_TURN;
        /* client → upstream */
        for (;;) {
                if (!ic->c_eof && ib_pending(&ic->out) < BUF_CAP && budget > 0) {
                        ssize_t n = recv(ic->cw.fd, buf, MIN(sizeof buf, budget), 0);
                        if (n > 0) {
                                budget -= (size_t) n;
                                if (ib_append(&ic->out, buf, (size_t) n) < 0)
                                        goto broken;
                        } else if (n == 0)
                                ic->c_eof = true;
                        else if (errno != EAGAIN && errno != EINTR)
                                goto broken;
                }
                if (ib_pending(&ic->out) > 0) {
                        ssize_t n = up_send(ic, ic->out.p + ic->out.off, ib_pending(&ic->out));
                        if (n > 0) {
                                ic->out.off += (size_t) n;
                                if (ic->out.off == ic->out.len)
                                        ic->out.off = ic->out.len = 0;
                                continue;
                        }
                        if (n < 0 && errno != EAGAIN && errno != EINTR)
                                goto broken;
                }
                break;
        }
        if (ic->c_eof && ib_pending(&ic->out) == 0 && !ic->u_shut) {
                ic->u_shut = true;
                if (up_split(ic)) {
                        int fd = ic->ww.fd;
                        loop_del(ic->srv, &ic->ww);
                        close(fd);
                } else
                        (void) shutdown(ic->uw.fd, SHUT_WR);
        }
        /* upstream → client */
        budget = UPGRADED_TURN;
        for (;;) {
                if (!ic->up_eof && ib_pending(&ic->in) < BUF_CAP && budget > 0) {
                        ssize_t n = read(ic->uw.fd, buf, MIN(sizeof buf, budget));
                        if (n > 0) {
                                budget -= (size_t) n;
                                if (ib_append(&ic->in, buf, (size_t) n) < 0)
                                        goto broken;
                        } else if (n == 0)
                                ic->up_eof = true;
                        else if (errno != EAGAIN && errno != EINTR)
                                goto broken;
                }
                if (ib_pending(&ic->in) > 0) {
                        ssize_t n = send(ic->cw.fd, ic->in.p + ic->in.off, ib_pending(&ic->in),
                                         MSG_NOSIGNAL);
                        if (n > 0) {
                                ic->in.off += (size_t) n;
                                if (ic->in.off == ic->in.len)
                                        ic->in.off = ic->in.len = 0;
                                continue;
                        }
                        if (n < 0 && errno != EAGAIN && errno != EINTR)
                                goto broken;
                }
                break;
        }
        if (ic->up_eof && ib_pending(&ic->in) == 0 && !ic->c_shut) {
                ic->c_shut = true;
                (void) shutdown(ic->cw.fd, SHUT_WR);
        }
        upgraded_finish_if_done(ic);
        if (ic->closed)
                return;
        uint32_t ue = 0, ce = 0;
        if (!ic->up_eof && ib_pending(&ic->in) < BUF_CAP)
                ue |= EPOLLIN;
        if (ib_pending(&ic->out) > 0)
                ue |= EPOLLOUT;
        if (!ic->c_eof && ib_pending(&ic->out) < BUF_CAP)
                ce |= EPOLLIN;
        if (ib_pending(&ic->in) > 0)
                ce |= EPOLLOUT;
        up_events(ic, ue);
        (void) loop_mod(ic->srv, &ic->cw, ce);
        return;
broken:
        ic_close(ic);
}

static void on_client(server *srv, watcher *w, uint32_t revents) {
        ingress_conn *ic = w->data;
        if (!ic->closed)
                upgraded_pump(ic);
}

static void on_upgrade(void *cls, struct MHD_Connection *connection, void *con_cls,
                       const char *extra_in, size_t extra_in_size, MHD_socket sock,
                       struct MHD_UpgradeResponseHandle *urh) {
        ingress_conn *ic = cls;
        ic->urh = urh;
        if (ic->closed || ic->cut) {
                ic->urh = NULL;
                MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE);
                ic_maybe_free(ic);
                return;
        }
        int fl = fcntl(sock, F_GETFL);
        if (fl >= 0)
                (void) fcntl(sock, F_SETFL, fl | O_NONBLOCK);
        /* what the client sent after its request is the new protocol's */
        if (extra_in_size > 0 && ib_append(&ic->out, extra_in, extra_in_size) < 0) {
                ic_close(ic);
                return;
        }
        ic->cw.cb = on_client;
        ic->cw.data = ic;
        if (loop_add(ic->srv, &ic->cw, sock, EPOLLIN | EPOLLOUT) < 0) {
                ic->cw.fd = -1;
                ic_close(ic);
                return;
        }
        int ufd = ic->parked_fd, wfd = ic->parked_wfd;
        ic->parked_fd = ic->parked_wfd = -1;
        if (loop_add(ic->srv, &ic->uw, ufd, wfd >= 0 ? EPOLLIN : EPOLLIN | EPOLLOUT) < 0) {
                ic->uw.fd = -1;
                close(ufd);
                safe_close(wfd);
                ic_close(ic);
                return;
        }
        if (wfd >= 0 && loop_add(ic->srv, &ic->ww, wfd, EPOLLOUT) < 0) {
                ic->ww.fd = -1;
                close(wfd);
                ic_close(ic);
                return;
        }
        upgraded_pump(ic);
}

/* ------------------------------------------------------------- responses */

/* The response is complete: the upstream goes back to the pool when both
 * messages were framed and nothing is left over, else it is closed. */
static void up_finish(ingress_conn *ic) {
        if (ic->uw.fd < 0)
                return;
        int fd = ic->uw.fd, wfd = ic->ww.fd;
        loop_del(ic->srv, &ic->uw);
        loop_del(ic->srv, &ic->ww);
        const ingress_resp_head *h = ic->head;
        bool ok = !ic->up_close && !ic->leftover && !ic->up_eof && !ic->up_wr_dead &&
                ic->req_done && ib_pending(&ic->out) == 0 && h->body != INGRESS_BODY_CLOSE &&
                ic->body_done && !ic->cut;
        if (ok)
                pool_put(ic->srv, ic->sbx_id, ic->port, fd, wfd);
        else {
                close(fd);
                safe_close(wfd);
        }
}

static ssize_t resp_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        ingress_conn *ic = cls;
        (void) pos;
        if (ic->cut || ic->body_error)
                return MHD_CONTENT_READER_END_WITH_ERROR;
        size_t have = ib_pending(&ic->in);
        if (have > 0) {
                size_t n = have < max ? have : max;
                memcpy(buf, ic->in.p + ic->in.off, n);
                ic->in.off += n;
                if (ic->in.off == ic->in.len)
                        ic->in.off = ic->in.len = 0;
                up_update(ic); /* room again: read on */
                return (ssize_t) n;
        }
        if (ic->body_done) {
                up_finish(ic);
                return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (ic->closed || ic->uw.fd < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
        ic_suspend(ic);
        up_update(ic);
        return 0;
}

static void resp_free(void *cls) {
        ingress_conn *ic = cls;
        ic->resp_alive = false;
        ic_maybe_free(ic);
}

static enum MHD_Result queue_response(ingress_conn *ic) {
        const ingress_resp_head *h = ic->head;
        struct MHD_Response *resp;
        bool upgrade = h->status == 101;
        if (upgrade) {
                resp = MHD_create_response_for_upgrade(on_upgrade, ic);
        } else if (h->body == INGRESS_BODY_NONE) {
                if (ic->head_request && h->status != 304 && h->status != 204)
                        resp = MHD_create_response_from_callback(h->content_length, 4096,
                                                                 resp_reader, ic, resp_free);
                else
                        resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        } else {
                uint64_t size = h->body == INGRESS_BODY_LENGTH ? h->content_length : MHD_SIZE_UNKNOWN;
                resp = MHD_create_response_from_callback(size, 64 * 1024, resp_reader, ic, resp_free);
        }
        if (!resp)
                return MHD_NO;
        bool with_reader = !upgrade &&
                (h->body != INGRESS_BODY_NONE ||
                 (ic->head_request && h->status != 304 && h->status != 204));
        char name[256], value[8192];
        for (size_t i = 0; i < h->n_fields; i++) {
                const ingress_field *f = &h->fields[i];
                if (f->name_len >= sizeof name || f->value_len >= sizeof value)
                        continue;
                bool is_upgrade_field = f->name_len == 7 && strncasecmp(f->name, "Upgrade", 7) == 0;
                if (!(upgrade && is_upgrade_field) &&
                    ingress_resp_field_is_hop(h, f->name, f->name_len))
                        continue;
                memcpy(name, f->name, f->name_len);
                name[f->name_len] = 0;
                memcpy(value, f->value, f->value_len);
                value[f->value_len] = 0;
                /* libmicrohttpd sets its own Date */
                if (strcasecmp(name, "Date") == 0)
                        continue;
                (void) MHD_add_response_header(resp, name, value);
        }
        if (upgrade && !MHD_get_response_header(resp, "Upgrade")) {
                MHD_destroy_response(resp);
                ic->state = ST_FAILED;
                ic->fail_kind = 1;
                enum MHD_Result mr = reply_failed(ic);
                ic_close(ic);
                return mr;
        }
        ic->up_close = h->minor == 0;
        for (size_t i = 0; i < h->n_fields; i++) {
                const ingress_field *f = &h->fields[i];
                if (f->name_len == 10 && strncasecmp(f->name, "Connection", 10) == 0) {
                        if (ingress_list_has(f->value, f->value_len, "close"))
                                ic->up_close = true;
                        else if (ingress_list_has(f->value, f->value_len, "keep-alive"))
                                ic->up_close = false;
                }
        }
        /* everything in `in` from here is body; the head was copied */
        int r = body_start(ic);
        enum MHD_Result mr = MHD_queue_response(ic->conn, h->status, resp);
        MHD_destroy_response(resp);
        if (mr != MHD_YES) {
                ic_close(ic);
                return MHD_NO;
        }
        if (with_reader)
                ic->resp_alive = true;
        if (upgrade) {
                ic->state = ST_UPGRADED;
                /* out of the loop until MHD hands the client's socket over
                 * (a hang-up meanwhile would be reported again and again) */
                ic->parked_fd = ic->uw.fd;
                loop_del(ic->srv, &ic->uw);
                if (up_split(ic)) {
                        ic->parked_wfd = ic->ww.fd;
                        loop_del(ic->srv, &ic->ww);
                }
        } else if (!with_reader) {
                ic->state = ST_RESPONDING;
                ic->body_done = true;
                up_finish(ic); /* a bodiless answer: the upstream is done */
                ic_close(ic);
        } else {
                ic->state = ST_RESPONDING;
                if (r < 0)
                        ic->body_error = true;
                up_update(ic);
        }
        return MHD_YES;
}

/* -------------------------------------------------------------- requests */

typedef struct head_ctx {
        ibuf *b;
        const char *conn_value; /* the client's Connection field */
        bool upgrade;
        bool h2c; /* Upgrade: h2c with its HTTP2-Settings */
        int err;
} head_ctx;

static bool req_field_dropped(const head_ctx *hc, const char *key) {
        static const char *const drop[] = {
                "Host",
                "Connection",
                "Keep-Alive",
                "Proxy-Connection",
                "Proxy-Authorization",
                "TE",
                "Trailer",
                "Transfer-Encoding",
                "Upgrade",
                "Content-Length",
                "Expect",
                "E2b-Sandbox-Id",
                "E2b-Sandbox-Port",
                "E2b-Traffic-Access-Token",
        };
        for (size_t i = 0; i < ELEMENTSOF(drop); i++)
                if (strcasecmp(key, drop[i]) == 0)
                        return true;
        /* RFC 7540 §3.2.1: HTTP2-Settings is a connection option of the
         * h2c upgrade, named in Connection, yet the server needs it */
        if (hc->h2c && strcasecmp(key, "HTTP2-Settings") == 0)
                return false;
        return hc->conn_value && ingress_list_has(hc->conn_value, strlen(hc->conn_value), key);
}

static enum MHD_Result head_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                  size_t key_size, const char *value, size_t value_size) {
        head_ctx *hc = cls;
        if (req_field_dropped(hc, key))
                return MHD_YES;
        if (ib_append(hc->b, key, key_size) < 0 || ib_append(hc->b, ": ", 2) < 0 ||
            ib_append(hc->b, value ? value : "", value ? value_size : 0) < 0 ||
            ib_append(hc->b, "\r\n", 2) < 0) {
                hc->err = -ENOMEM;
                return MHD_NO;
        }
        return MHD_YES;
}

static bool is_tchar(unsigned char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

typedef struct check_ctx {
        unsigned n_cl;
        const char *why;
} check_ctx;

/* Every field a name of tchars and a value without CR, LF or other control
 * bytes (they would end a line in the head the daemon writes); at most one
 * Content-Length. */
static enum MHD_Result check_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size) {
        check_ctx *cc = cls;
        if (key_size == 0) {
                cc->why = "an empty header name";
                return MHD_NO;
        }
        for (size_t i = 0; i < key_size; i++)
                if (!is_tchar((unsigned char) key[i])) {
                        cc->why = "a header name with a byte a token cannot hold";
                        return MHD_NO;
                }
        for (size_t i = 0; value && i < value_size; i++) {
                unsigned char c = (unsigned char) value[i];
                if ((c < 0x20 && c != '\t') || c == 0x7f) {
                        cc->why = "a control byte in a header value";
                        return MHD_NO;
                }
        }
        if (strcasecmp(key, "Content-Length") == 0 && ++cc->n_cl > 1) {
                cc->why = "more than one Content-Length";
                return MHD_NO;
        }
        return MHD_YES;
}

static void traffic_token(server *srv, const char *id, char out[65]) {
        char msg[128];
        int n = snprintf(msg, sizeof msg, "traffic-token:%s", id);
        uint8_t mac[32];
        unsigned maclen = sizeof mac;
        HMAC(EVP_sha256(), srv->master, sizeof srv->master, (const uint8_t *) msg, (size_t) n, mac,
             &maclen);
        static const char hexd[] = "0123456789abcdef";
        for (int i = 0; i < 20; i++) {
                out[2 * i] = hexd[mac[i] >> 4];
                out[2 * i + 1] = hexd[mac[i] & 15];
        }
        out[40] = 0;
}

static json_t *sbx_network_create(sbx *sb) {
        json_t *net = json_object_get(sb->extra, "network");
        return json_is_object(net) ? net : NULL;
}

bool ingress_public(sbx *sb) {
        json_t *v = json_object_get(sbx_network_create(sb), "allowPublicTraffic");
        return !json_is_false(v);
}

json_t *ingress_traffic_token_json(sbx *sb) {
        if (ingress_public(sb))
                return json_null();
        char t[65];
        traffic_token(sb->srv, sb->id, t);
        return json_string(t);
}

json_t *ingress_domain_json(server *srv) {
        return srv->cfg.sandbox_domain[0] ? json_string(srv->cfg.sandbox_domain) : json_null();
}

void ingress_network_json(sbx *sb, json_t *network) {
        json_object_set_new(network, "allowPublicTraffic", json_boolean(ingress_public(sb)));
        json_t *m = json_object_get(sbx_network_create(sb), "maskRequestHost");
        json_object_set_new(network, "maskRequestHost",
                            json_is_string(m) ? json_incref(m) : json_null());
}

int ingress_create_check(json_t *body, char *why, size_t wl) {
        json_t *net = json_object_get(body, "network");
        if (!net || json_is_null(net))
                return 0;
        if (!json_is_object(net))
                return 0; /* egress_spec_from_create refuses it */
        json_t *apt = json_object_get(net, "allowPublicTraffic");
        if (apt && !json_is_null(apt) && !json_is_boolean(apt)) {
                snprintf(why, wl, "network.allowPublicTraffic must be a boolean");
                return -EINVAL;
        }
        json_t *m = json_object_get(net, "maskRequestHost");
        if (m && !json_is_null(m)) {
                const char *s = json_string_value(m);
                if (!s || !*s || strlen(s) > 253) {
                        snprintf(why, wl,
                                 "network.maskRequestHost must be a host name (at most 253 bytes)");
                        return -EINVAL;
                }
                for (const char *p = s; *p; p++)
                        if ((unsigned char) *p <= 0x20 || *p == 0x7f || *p == '/' || *p == '@' ||
                            *p == '\\') {
                                snprintf(why, wl,
                                         "network.maskRequestHost holds a byte a host name cannot");
                                return -EINVAL;
                        }
        }
        return 0;
}

/* The Host the server in the sandbox sees: the client's, or maskRequestHost
 * with ${PORT} replaced by the port (E2B's rule). */
static int host_value(sbx *sb, struct MHD_Connection *c, unsigned port, char *out, size_t n) {
        if (!ingress_masked_host(sb, port, out, n)) {
                const char *h = http_header(c, "Host");
                snprintf(out, n, "%s", h ? h : "localhost");
        }
        return 0;
}

static bool upgrade_requested(struct MHD_Connection *c) {
        const char *conn_v = http_header(c, "Connection");
        return http_header(c, "Upgrade") && conn_v &&
                ingress_list_has(conn_v, strlen(conn_v), "upgrade");
}

/* A reused upstream failed before its first response byte: once, a fresh
 * connection gets the same (bodiless) request. */
static bool up_retry(ingress_conn *ic) {
        if (!ic->reused || !ic->replay_on || ic->in.len > 0)
                return false;
        ic->reused = false;
        sbx *sb = sbx_find(ic->srv, ic->sbx_id);
        if (!sb || sb->paused)
                return false;
        bool connector = hutch_backend_caps(hutch_sandbox_backend(sb->h)) &
                HUTCH_BACKEND_OWN_NETSTACK;
        int fd = -1, wfd = -1;
        if (connector ? up_connector(ic->srv, sb, ic->port, &fd, &wfd) < 0 : up_socket(sb, &fd) < 0)
                return false;
        struct sockaddr_in sin = { .sin_family = AF_INET,
                                   .sin_port = htons((uint16_t) ic->port),
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (!connector && connect(fd, (struct sockaddr *) &sin, sizeof sin) < 0 &&
            errno != EINPROGRESS) {
                close(fd);
                return false;
        }
        up_close_fds(ic);
        if (loop_add(ic->srv, &ic->uw, fd, connector ? EPOLLIN : EPOLLOUT | EPOLLIN) < 0) {
                ic->uw.fd = -1;
                close(fd);
                safe_close(wfd);
                return false;
        }
        if (connector && loop_add(ic->srv, &ic->ww, wfd, EPOLLOUT) < 0) {
                ic->ww.fd = -1;
                close(wfd);
                return false;
        }
        ic->out.off = ic->out.len = 0;
        ic->in.off = ic->in.len = 0;
        ic->up_wr_dead = false;
        if (ib_append(&ic->out, ic->replay.p, ic->replay.len) < 0)
                return false;
        ic->state = connector ? ST_SENDING : ST_CONNECTING;
        return true;
}

enum MHD_Result ingress_begin(server *srv, request *req, sbx *sb, unsigned port, bool *ret_responded) {
        struct MHD_Connection *c = req->conn;
        *ret_responded = true;

        check_ctx cc = { 0 };
        MHD_get_connection_values_n(c, MHD_HEADER_KIND, check_field, &cc);
        if (cc.why)
                return http_reply_error(c, 400, "refused: %s", cc.why);
        const char *te = http_header(c, "Transfer-Encoding");
        if (te && strcasecmp(te, "chunked") != 0)
                return http_reply_error(c, 400, "refused: Transfer-Encoding other than chunked");
        const char *cl = http_header(c, "Content-Length");
        if (cl) {
                if (!*cl || strlen(cl) > 18 || strspn(cl, "0123456789") != strlen(cl))
                        return http_reply_error(c, 400, "refused: Content-Length is not a number");
        }
        const char *target = http_raw_uri(c);
        if (!target || target[0] != '/')
                return http_reply_error(c, 400, "the request target must be a path (origin-form)");
        for (const char *p = target; *p; p++)
                if ((unsigned char) *p <= 0x20 || *p == 0x7f)
                        return http_reply_error(c, 400,
                                                "a control byte or space in the request target");

        /* a pooled upstream may be closing as it is taken: only a request
         * that can be sent again (no body, not an upgrade) takes one */
        bool connector = hutch_backend_caps(hutch_sandbox_backend(sb->h)) &
                HUTCH_BACKEND_OWN_NETSTACK;
        /* a pooled upstream may be closing as it is taken: only a request
         * that can be sent again whole (no upgrade, a body of known and
         * small size) takes one */
        int wfd = -1;
        bool poolable = !upgrade_requested(c) && !te &&
                (!cl || strtoull(cl, NULL, 10) <= REPLAY_MAX / 2);
        int fd = poolable ? pool_take(srv, sb->id, port, &wfd) : -1;
        if (fd < 0 && connector && closed_recently(sb->id, port))
                return reply_closed_port(c, sb->id, port);
        if (fd < 0 && connector && connectors_of(sb->id) >= CONNECTORS_MAX)
                return http_reply_json(c, 503,
                                       json_pack("{s:s, s:s, s:i}", "sandboxId", sb->id, "message",
                                                 "too many open connections to this sandbox's ports",
                                                 "code", 503));
        bool reused = fd >= 0;
        int r = reused      ? 0
                : connector ? up_connector(srv, sb, port, &fd, &wfd)
                            : up_socket(sb, &fd);
        connector = wfd >= 0; /* split ends: a connector's pipes, fresh or pooled */
        if (r < 0) {
                log_warning("sandbox %s: ingress socket: %s", sb->id, strerror(-r));
                return http_reply_502(c, sb->id);
        }
        struct sockaddr_in sin = { .sin_family = AF_INET,
                                   .sin_port = htons((uint16_t) port),
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        bool connecting = false;
        if (!reused && !connector && connect(fd, (struct sockaddr *) &sin, sizeof sin) < 0) {
                if (errno != EINPROGRESS) {
                        close(fd);
                        return reply_closed_port(c, sb->id, port);
                }
                connecting = true;
        }

        ingress_conn *ic = calloc(1, sizeof *ic);
        ingress_resp_head *head = calloc(1, sizeof *head);
        if (!ic || !head) {
                free(ic);
                free(head);
                close(fd);
                safe_close(wfd);
                return MHD_NO;
        }
        ic->srv = srv;
        ic->head = head;
        memcpy(ic->sbx_id, sb->id, sizeof ic->sbx_id);
        ic->port = port;
        ic->req = req;
        ic->conn = c;
        ic->cw.fd = -1;
        ic->ww.fd = -1;
        ic->parked_fd = ic->parked_wfd = -1;
        ic->reused = reused;
        ic->state = connecting ? ST_CONNECTING : ST_SENDING;
        ic->head_request = streq(req->method, "HEAD");
        ic->uw.cb = on_up;
        ic->uw.data = ic;
        ic->ww.cb = on_up;
        ic->ww.data = ic;

        /* the request head, the daemon's own */
        const char *conn_v = http_header(c, "Connection");
        const char *upg = http_header(c, "Upgrade");
        bool upgrade = upg && conn_v && ingress_list_has(conn_v, strlen(conn_v), "upgrade");
        char host[300];
        host_value(sb, c, port, host, sizeof host);
        bool h2c = upgrade && strcasecmp(upg, "h2c") == 0 &&
                ingress_list_has(conn_v, strlen(conn_v), "HTTP2-Settings");
        head_ctx hc = { .b = &ic->out, .conn_value = conn_v, .upgrade = upgrade, .h2c = h2c };
        r = ib_printf(&ic->out, "%s ", req->method);
        if (r >= 0)
                r = ib_append(&ic->out, target, strlen(target));
        if (r >= 0)
                r = ib_printf(&ic->out, " HTTP/1.1\r\nHost: %s\r\n", host);
        if (r >= 0) {
                MHD_get_connection_values_n(c, MHD_HEADER_KIND, head_field, &hc);
                r = hc.err;
        }
        if (r >= 0 && upgrade)
                r = ib_printf(&ic->out, "Connection: upgrade%s\r\nUpgrade: %.4000s\r\n",
                              h2c ? ", HTTP2-Settings" : "", upg);
        /* else none: HTTP/1.1 keeps the upstream (or gvisor's connector)
         * open for the pool */
        if (r >= 0 && cl)
                r = ib_printf(&ic->out, "Content-Length: %s\r\n", cl);
        else if (r >= 0 && te) {
                r = ib_printf(&ic->out, "Transfer-Encoding: chunked\r\n");
                ic->req_chunked = true;
        }
        if (r >= 0)
                r = ib_append(&ic->out, "\r\n", 2);
        if (r >= 0 && reused) {
                /* the pooled upstream may have been closed a moment ago:
                 * the request can be sent again on a new one */
                ic->replay_on = true;
                replay_add(ic, ic->out.p, ic->out.len);
        }
        if (r >= 0)
                r = loop_add(srv, &ic->uw, fd, connector ? EPOLLIN : EPOLLOUT | EPOLLIN);
        if (r >= 0 && connector && (r = loop_add(srv, &ic->ww, wfd, EPOLLOUT)) < 0)
                loop_del(srv, &ic->uw);
        if (r < 0) {
                ic->uw.fd = ic->ww.fd = -1;
                close(fd);
                safe_close(wfd);
                free(ic->out.p);
                free(ic->head);
                free(ic);
                return MHD_NO;
        }
        ic->next = live;
        if (live)
                live->prev = ic;
        live = ic;
        req->ingress = ic;
        req->body_mode = BODY_INGRESS;
        *ret_responded = false;
        /* connected already (pooled, or loopback's instant connect): the
         * head goes now, not one loop turn later */
        if (ic->state == ST_SENDING && up_write(ic) == 0)
                up_update(ic);
        return MHD_YES;
}

enum MHD_Result ingress_on_request(server *srv, request *req, const char *data, size_t *size) {
        ingress_conn *ic = req->ingress;
        if (ic->cut)
                return MHD_NO; /* killed or paused: the connection ends now */
        if (*size > 0) {
                if (ic->state == ST_FAILED || ic->up_wr_dead || ic->closed) {
                        *size = 0; /* nobody reads it: dropped */
                        return MHD_YES;
                }
                size_t pend = ib_pending(&ic->out);
                if (pend >= BUF_CAP) {
                        ic_suspend(ic);
                        return MHD_YES;
                }
                size_t n = BUF_CAP - pend;
                if (n > *size)
                        n = *size;
                int r = 0;
                if (ic->req_chunked)
                        r = ib_printf(&ic->out, "%zx\r\n", n);
                size_t from = ic->out.len;
                if (r >= 0)
                        r = ib_append(&ic->out, data, n);
                if (r >= 0 && ic->req_chunked)
                        r = ib_append(&ic->out, "\r\n", 2);
                if (r >= 0 && ic->replay_on)
                        replay_add(ic, ic->out.p + from, ic->out.len - from);
                if (r < 0)
                        return MHD_NO;
                *size -= n;
                if (ic->state != ST_CONNECTING && !ic->closed) {
                        if (up_write(ic) < 0) {
                                ic->up_wr_dead = true;
                                ic->out.off = ic->out.len = 0;
                        }
                        up_update(ic);
                }
                return MHD_YES;
        }
        if (!ic->req_done) {
                ic->req_done = true;
                if (ic->req_chunked && ic->state != ST_FAILED && !ic->up_wr_dead &&
                    ib_append(&ic->out, "0\r\n\r\n", 5) < 0)
                        return MHD_NO;
                up_update(ic);
        }
        if (ic->state == ST_FAILED) {
                enum MHD_Result mr = reply_failed(ic);
                ic_close(ic);
                return mr;
        }
        if (ic->state == ST_HEAD)
                return queue_response(ic);
        if (ic->state >= ST_RESPONDING)
                return MHD_YES; /* already queued */
        ic_suspend(ic);
        return MHD_YES;
}

/* ------------------------------------------------------------- routing */

bool ingress_token_ok(server *srv, sbx *sb, const char *tok) {
        char want[65];
        traffic_token(srv, sb->id, want);
        return tok && const_time_eq(tok, want);
}

bool ingress_masked_host(sbx *sb, unsigned port, char *out, size_t n) {
        const char *mask = json_string_value(json_object_get(sbx_network_create(sb), "maskRequestHost"));
        if (!mask || n == 0)
                return false;
        size_t o = 0;
        for (const char *p = mask; *p && o + 8 < n;) {
                if (strncmp(p, "${PORT}", 7) == 0) {
                        o += (size_t) snprintf(out + o, n - o, "%u", port);
                        p += 7;
                } else
                        out[o++] = *p++;
        }
        out[o] = 0;
        return true;
}

int ingress_up_socket(sbx *sb, int *ret_fd) {
        return up_socket(sb, ret_fd);
}

int ingress_connector(server *srv, sbx *sb, unsigned port, int *ret_rfd, int *ret_wfd) {
        if (closed_recently(sb->id, port))
                return -ECONNREFUSED;
        if (connectors_of(sb->id) >= CONNECTORS_MAX)
                return -EUSERS;
        return up_connector(srv, sb, port, ret_rfd, ret_wfd);
}

void ingress_closed_note(const char *sbx_id, unsigned port) {
        closed_note(sbx_id, port);
}

int ingress_check_access(server *srv, request *req, sbx *sb, unsigned port) {
        if (port == ENVD_PORT || ingress_public(sb))
                return 0;
        const char *t = http_header(req->conn, "E2b-Traffic-Access-Token");
        char want[65];
        traffic_token(srv, sb->id, want);
        if (!t || !const_time_eq(t, want))
                return -EACCES;
        return 0;
}

enum MHD_Result ingress_reply_forbidden(struct MHD_Connection *c, const char *id, bool missing) {
        return http_reply_json(
                c, 403,
                json_pack("{s:s, s:s, s:i}", "sandboxId", id, "message",
                          missing ? "the sandbox is private: the request has no "
                                    "e2b-traffic-access-token header"
                                  : "the sandbox is private: invalid e2b-traffic-access-token",
                          "code", 403));
}

int ingress_auto_resume(server *srv, sbx *sb) {
        if (!sb->paused)
                return 0;
        if (!sb->auto_resume)
                return -EHOSTDOWN;
        hutch_error err = { 0 };
        if (sbx_resume(srv, sb, false, &err) < 0) {
                log_warning("sandbox %s: auto-resume on traffic: %s", sb->id, err.msg);
                return -EIO;
        }
        /* E2B: a fresh timeout from the resume, the one create gave, at
         * least 5 minutes */
        json_t *t = json_object_get(sb->extra, "timeoutS");
        int64_t secs = json_is_integer(t) ? (int64_t) json_integer_value(t)
                                          : (int64_t) srv->cfg.default_timeout_s;
        if (secs < 300)
                secs = 300;
        if ((uint64_t) secs > srv->cfg.max_timeout_s)
                secs = (int64_t) srv->cfg.max_timeout_s;
        sb->end_ms = wall_ms() + secs * 1000;
        hutch_error e2 = { 0 };
        if (store_sandbox_set_end(srv->store, sb->id, sb->end_ms, &e2) < 0)
                log_error("sandbox %s: database: %s", sb->id, e2.msg);
        (void) store_event_add(srv->store, sb->team_id, sb->id, "sandbox.resume",
                               "{\"reason\":\"traffic\"}", &e2);
        log_debug("sandbox %s: resumed by traffic", sb->id);
        return 0;
}
