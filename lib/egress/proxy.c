/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The egress proxy: listeners inside sandbox netns, the per-connection state
 * machine, the DNS client and the relay. proxy.h has the contract; the
 * parsers it calls (proxyreq, socks5, chunked, tlshello, dns) are pure and
 * fuzzed separately, so everything here is I/O and bookkeeping.
 *
 * A connection goes through:
 *
 *   SNIFF ── 0x05 ──> SOCKS ──┐
 *     └──── else ──> HEAD ────┴─> decide ─> RESOLVE (names) ─> CONNECTING
 *        ─> RELAY (CONNECT/SOCKS: client bytes held until the TLS peek
 *           passes; HTTP: rewritten head, one framed body, then only the
 *           response) ─> closed, recorded
 *
 * Level-triggered epoll; each fd's interest is recomputed from the state by
 * conn_arm() after every step, so no step has to remember to re-arm.
 */
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "egress/chunked.h"
#include "egress/dns.h"
#include "egress/inject.h"
#include "egress/proxy.h"
#include "egress/proxyreq.h"
#include "egress/socks5.h"
#include "egress/tlshello.h"
#include "egress/tlsmint.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/macro.h"

#define BUF_SIZE 65536        /* each direction; also the most a TLS peek holds */
#define READ_CHUNK 16384      /* per read: one busy connection cannot hog a dispatch */
#define HEAD_TIMEOUT_MS 30000 /* to send a complete request head */
#define DNS_TRY_MS 2000       /* per query attempt */
#define DNS_TRIES 2           /* per nameserver */
#define DNS_LINGER_MS 100     /* wait for the other family once one answered */
#define CONNECT_TIMEOUT_MS 10000
#define PEEK_TIMEOUT_MS 30000
#define THROTTLE_MS 20
#define ACCEPTS_PER_WAKE 32
#define DNS_ADDRS_TRY 8
#define MASK_VALUE_MAX EGRESS_MASK_VALUE_MAX

enum ev_kind { EV_LISTEN = 1, EV_CLIENT, EV_UPSTREAM, EV_DNS, EV_DNS_TCP, EV_TIMER };
enum { ICPT_HEAD = 1, ICPT_BODY, ICPT_RESPONSE };

typedef struct ev {
        uint8_t kind;
        void *obj;
        int fd;
        uint32_t events; /* registered interest, 0 = not registered */
} ev;

typedef enum conn_state {
        S_SNIFF = 1,
        S_HEAD,
        S_SOCKS,
        S_RESOLVE,
        S_CONNECTING,
        S_RELAY,
} conn_state;

typedef struct buf {
        uint8_t *data;
        size_t off, len; /* bytes [off, off+len) wait to be written */
} buf;

typedef struct conn conn;
struct conn {
        egress_site *site;
        conn *next, *prev;
        bool dead;     /* closed; freed at the end of the dispatch round */
        ev cl, up, dns, dns_tcp;
        conn_state state;
        egress_kind kind;
        int64_t started_ms, started_real_ms, deadline_ms;

        proxyreq *req; /* S_HEAD and, for HTTP, until the upstream head is built */
        socks5 *socks;
        char method[PROXYREQ_METHOD_MAX + 1];

        bool decided;
        egress_host host;
        uint16_t port;
        egress_decision decision;

        /* resolution */
        uint16_t qid[2];   /* A, AAAA */
        bool qdone[2];
        bool qtrunc[2];    /* truncated over UDP: asked again over TCP */
        int tcp_q;         /* the query on dns_tcp, or -1 */
        bool tcp_sent;
        uint8_t *tcp_buf;  /* its answer: 2 length bytes, then the message */
        size_t tcp_have, tcp_want;
        unsigned ns_index, tries;
        int64_t try_deadline_ms;
        egress_addr addrs[DNS_ADDRS_TRY];
        size_t n_addrs, addr_next;
        bool any_denied;
        egress_decision denied_decision;
        char denied_address[46];
        const char *dns_error;

        /* the dial */
        struct sockaddr_storage sa;
        socklen_t sa_len;
        char address[46];
        int last_connect_errno;

        /* relay */
        buf c2u, u2c;
        uint8_t *uphead; /* HTTP: the rewritten head, written before c2u */
        size_t uphead_off, uphead_len;
        bool peeking;    /* tunnel: hold c2u until the first bytes are judged */
        bool client_eof, upstream_eof;
        bool up_shut, cl_shut;
        bool fwd;        /* forward semantics: one rewritten request, one framed body, the response
                            (an http:// request, or plain HTTP inside a tunnel) */
        bool body_done;  /* HTTP: the one request body has been taken */
        bool body_chunked;
        uint64_t body_left;
        chunked *framer;
        bool stalled[2]; /* 0: client reads (up), 1: upstream reads (down) */
        uint64_t bytes_out, bytes_in;

        char injected[1024];       /* secrets and rules applied */
        /* Secret values sent upstream on this connection: masked ('*', same
         * length, so framing holds) wherever they come back in the
         * response. The last mask_max - 1 bytes wait until more arrive. */
        char *mask[EGRESS_INJECT_VALUES_MAX];
        size_t mask_len[EGRESS_INJECT_VALUES_MAX];
        size_t n_mask, mask_max;
        uint8_t *hold; /* interception: plaintext held back */
        size_t hold_len;

        /* TLS interception (hosts with credential rules): the proxy is the
         * TLS server to the sandbox and a verifying TLS client upstream.
         * Ciphertext moves between the sockets and memory BIOs; c2u/u2c
         * then hold ciphertext bound for the upstream / the client. */
        bool icpt;
        SSL *tcl, *tup;
        BIO *tcl_in, *tcl_out, *tup_in, *tup_out; /* owned by their SSL */
        bool tcl_ready, tup_ready;
        int icpt_phase;     /* ICPT_HEAD, ICPT_BODY, ICPT_RESPONSE */
        bool icpt_failed;   /* an answer to the client is queued; close once it is out */
        bool tup_eof;       /* the upstream's TLS stream ended (read out to its end) */
        bool tup_clean;     /* ... with close_notify: the response is whole */
        const char *tup_error;
        proxyreq *oreq;     /* the origin-form head inside the tunnel */
        const char *error_reason; /* set when the proxy refused or failed */
        bool refused_after_allow;  /* the policy allowed it, then the tunnel's first bytes did not pass */
        char error_detail[160];
};

struct egress_site {
        egress_proxy *proxy;
        egress_site *next, *prev;
        char sandbox_id[64];
        ev listen;
        egress_policy *policy;
        egress_inject *inject;
        conn *conns;
        unsigned n_conns;
        uint64_t refused_full;
        int64_t refused_full_logged_ms;
        /* bandwidth tokens: 0 up, 1 down */
        int64_t tok[2];
        int64_t tok_ms;
        /* record rate limit */
        double rec_tokens;
        int64_t rec_ms;
        uint64_t suppressed;
};

struct egress_proxy {
        egress_proxy_config cfg;
        bool dispatching;       /* inside egress_proxy_dispatch(): the graveyard waits for the round's end */
        int epfd;
        int self_netns;
        ev timer;
        int64_t timer_armed_ms; /* 0: disarmed */
        egress_site *sites;
        unsigned n_conns;       /* every site's */
        int64_t accept_paused_until; /* out of fds: listeners rest until then */
        conn *graveyard;        /* closed connections: an event of this round may still name them */
        bool throttled;         /* some connection waits for tokens */
};

/* ------------------------------------------------------------------ util */

static int64_t real_ms(void) {
        return clock_ns(CLOCK_REALTIME) / 1000000;
}

const char *egress_kind_to_string(egress_kind k) {
        switch (k) {
        case EGRESS_KIND_HTTP:
                return "http";
        case EGRESS_KIND_CONNECT:
                return "connect";
        case EGRESS_KIND_SOCKS5:
                return "socks5";
        }
        return "unknown";
}

static int ev_set(egress_proxy *p, ev *e, uint32_t events) {
        if (e->fd < 0 || e->events == events)
                return 0;
        struct epoll_event ee = { .events = events, .data.ptr = e };
        int op = e->events == 0 ? EPOLL_CTL_ADD : events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
        if (epoll_ctl(p->epfd, op, e->fd, op == EPOLL_CTL_DEL ? NULL : &ee) < 0)
                return -errno;
        e->events = events;
        return 0;
}

static void ev_close(egress_proxy *p, ev *e) {
        if (e->fd < 0)
                return;
        if (e->events)
                (void) epoll_ctl(p->epfd, EPOLL_CTL_DEL, e->fd, NULL);
        close(e->fd);
        e->fd = -1;
        e->events = 0;
}

static void timer_want(egress_proxy *p, int64_t at_ms) {
        if (at_ms <= 0 || (p->timer_armed_ms && p->timer_armed_ms <= at_ms))
                return;
        int64_t now = now_ms();
        int64_t in = at_ms > now ? at_ms - now : 1;
        struct itimerspec its = { .it_value = { .tv_sec = in / 1000, .tv_nsec = (in % 1000) * 1000000 } };
        if (timerfd_settime(p->timer.fd, 0, &its, NULL) == 0)
                p->timer_armed_ms = at_ms;
}

/* ---------------------------------------------------------------- records */

static void conn_record(conn *c) {
        egress_site *s = c->site;
        egress_proxy *p = s->proxy;
        if (!p->cfg.on_record)
                return;

        /* Rate limit: records_per_second, a burst of ten seconds' worth. */
        int64_t now = now_ms();
        double rate = p->cfg.records_per_second ? p->cfg.records_per_second : 50;
        s->rec_tokens = MIN(rate * 10, s->rec_tokens + (double) (now - s->rec_ms) * rate / 1000.0);
        s->rec_ms = now;
        if (s->rec_tokens < 1) {
                s->suppressed++;
                return;
        }
        s->rec_tokens -= 1;

        char hosttext[EGRESS_NAME_MAX + 1] = "";
        if (c->decided)
                snprintf(hosttext, sizeof hosttext, "%s", c->host.text);
        const char *reason, *rule = "", *address = c->address;
        bool allowed = c->decided && c->decision.verdict == EGRESS_ALLOW;
        if (!c->decided) {
                reason = c->error_reason ? c->error_reason : "closed before a request";
        } else if (c->refused_after_allow) {
                allowed = false;
                reason = c->error_reason;
                rule = c->decision.rule;
        } else if (c->decision.verdict == EGRESS_DENY) {
                reason = egress_reason_to_string(c->decision.reason);
                rule = c->decision.rule;
                if (c->any_denied && !c->address[0])
                        address = c->denied_address;
        } else {
                reason = egress_reason_to_string(c->decision.reason);
                rule = c->decision.rule;
        }
        egress_record r = {
                .sandbox_id = s->sandbox_id,
                .kind = c->kind,
                .method = c->method,
                .host = hosttext,
                .port = c->port,
                .address = address,
                .allowed = allowed,
                .reason = reason,
                .rule = rule,
                .error = allowed && c->error_reason ? c->error_detail[0] ? c->error_detail : c->error_reason
                                                      : "",
                .bytes_out = c->bytes_out,
                .bytes_in = c->bytes_in,
                .started_ms = c->started_real_ms,
                .duration_ms = now - c->started_ms,
                .suppressed = s->suppressed,
                .injected = c->injected,
        };
        char both[sizeof c->error_detail + 96];
        if (c->refused_after_allow && c->error_detail[0]) {
                snprintf(both, sizeof both, "%s: %s", c->error_reason, c->error_detail);
                r.reason = both;
        } else if (!allowed && c->decided && c->decision.detail) {
                snprintf(both, sizeof both, "%s (%s)", reason, c->decision.detail);
                r.reason = both;
        } else if (!c->decided && c->error_detail[0]) {
                snprintf(both, sizeof both, "%s: %s", reason, c->error_detail);
                r.reason = both;
        }
        s->suppressed = 0;
        p->cfg.on_record(p->cfg.userdata, &r);
}

/* -------------------------------------------------------------- lifetime */

static void conn_free(conn *c, bool record) {
        egress_site *s = c->site;
        egress_proxy *p = s->proxy;
        if (record)
                conn_record(c);
        ev_close(p, &c->cl);
        ev_close(p, &c->up);
        ev_close(p, &c->dns);
        ev_close(p, &c->dns_tcp);
        if (c->prev)
                c->prev->next = c->next;
        else
                s->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        s->n_conns--;
        p->n_conns--;
        /* Its ev structs stay readable (fd -1) until the round ends. */
        c->dead = true;
        c->site = NULL;
        c->next = p->graveyard;
        p->graveyard = c;
}

static void proxy_bury(egress_proxy *p) {
        while (p->graveyard) {
                conn *c = p->graveyard;
                p->graveyard = c->next;
                free(c->req);
                free(c->socks);
                free(c->framer);
                free(c->tcp_buf);
                free(c->c2u.data);
                free(c->u2c.data);
                for (size_t i = 0; i < c->n_mask; i++) {
                        explicit_bzero(c->mask[i], c->mask_len[i]);
                        free(c->mask[i]);
                }
                if (c->hold) {
                        explicit_bzero(c->hold, MASK_VALUE_MAX);
                        free(c->hold);
                }
                SSL_free(c->tcl);
                SSL_free(c->tup);
                free(c->oreq);
                if (c->uphead)
                        explicit_bzero(c->uphead, c->uphead_len); /* may hold a secret */
                free(c->uphead);
                free(c);
        }
}

/* Best effort, non-blocking: the socket's send buffer is empty at this point
 * (nothing else was written to the client), and these answers are small. */
static void send_client(conn *c, const void *data, size_t len) {
        if (c->cl.fd >= 0)
                (void) send(c->cl.fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Refuse or fail before a tunnel exists: answer in the client's protocol,
 * record, close. reason is static text; detail (may be NULL) is specific. */
static void conn_refuse(conn *c, int http_status, uint8_t socks_rep, const char *reason, const char *detail) {
        c->error_reason = reason;
        if (detail)
                snprintf(c->error_detail, sizeof c->error_detail, "%s", detail);

        if (c->state == S_RELAY) {
                /* the tunnel's 200 / SOCKS success is out: only closing is left */
        } else if (c->kind == EGRESS_KIND_SOCKS5 || c->state == S_SOCKS) {
                uint8_t rep[SOCKS5_REPLY_MAX];
                int n = socks5_reply(socks_rep ? socks_rep : SOCKS5_REP_GENERAL_FAILURE, NULL, 0, rep, sizeof rep);
                if (n > 0)
                        send_client(c, rep, (size_t) n);
        } else if (http_status) {
                const char *status = http_status == 403   ? "Forbidden"
                                     : http_status == 400 ? "Bad Request"
                                     : http_status == 502 ? "Bad Gateway"
                                     : http_status == 504 ? "Gateway Timeout"
                                     : http_status == 503 ? "Service Unavailable"
                                     : http_status == 505 ? "HTTP Version Not Supported"
                                                          : "Error";
                char body[512], msg[1024];
                int bl = snprintf(body, sizeof body, "hutch egress proxy: %s%s%s%s%s\n",
                                  http_status == 403 ? "denied: " : "", reason, detail ? " (" : "",
                                  detail ? detail : "", detail ? ")" : "");
                if (bl < 0 || (size_t) bl >= sizeof body)
                        bl = (int) strlen(body);
                int ml = snprintf(msg, sizeof msg,
                                  "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                                  "X-Hutch-Egress: %s\r\nConnection: close\r\n\r\n%s",
                                  http_status, status, bl, http_status == 403 ? "denied" : "error", body);
                if (ml > 0 && (size_t) ml < sizeof msg)
                        send_client(c, msg, (size_t) ml);
        }
        conn_free(c, true);
}

static void conn_deny(conn *c) {
        char detail[EGRESS_RULE_TEXT_MAX + 96];
        const char *what = egress_reason_to_string(c->decision.reason);
        if (c->decision.rule[0])
                snprintf(detail, sizeof detail, "%s:%u, %s %s", c->host.text, c->port, what, c->decision.rule);
        else
                snprintf(detail, sizeof detail, "%s:%u, %s", c->host.text, c->port, what);
        if (c->any_denied && c->denied_address[0] && strlen(detail) + strlen(c->denied_address) + 16 < sizeof detail) {
                strcat(detail, " at ");
                strcat(detail, c->denied_address);
        }
        conn_refuse(c, 403, SOCKS5_REP_NOT_ALLOWED, "not allowed by policy", detail);
}

/* ---------------------------------------------------------------- arming */

static bool site_throttles(const egress_site *s) {
        return s->proxy->cfg.bandwidth_bytes > 0;
}

static size_t conn_held(const conn *c);

/* Recompute both fds' interest from the state. */
static void conn_arm(conn *c) {
        egress_proxy *p = c->site->proxy;
        uint32_t cl = 0, up = 0;

        switch (c->state) {
        case S_SNIFF:
        case S_HEAD:
        case S_SOCKS:
                cl = EPOLLIN;
                break;
        case S_RESOLVE:
                break;
        case S_CONNECTING:
                up = EPOLLOUT;
                break;
        case S_RELAY: {
                /* the read functions compact, so what counts is the length */
                bool want_client = !c->client_eof && c->c2u.len < BUF_SIZE && !c->stalled[0] &&
                                   !(c->fwd && c->body_done);
                if (want_client)
                        cl |= EPOLLIN;
                if (c->u2c.len > conn_held(c))
                        cl |= EPOLLOUT;
                if (!c->upstream_eof && c->u2c.len < BUF_SIZE && !c->stalled[1])
                        up |= EPOLLIN;
                if (c->uphead_len > c->uphead_off || (c->c2u.len && !c->peeking))
                        up |= EPOLLOUT;
                break;
        }
        }
        /* No interest: not registered at all, so a hang-up that nothing
         * can act on yet does not wake the loop over and over. */
        (void) ev_set(p, &c->cl, cl);
        (void) ev_set(p, &c->up, up);
}

/* ---------------------------------------------------------------- tokens */

static void site_refill(egress_site *s, int64_t now) {
        uint64_t rate = s->proxy->cfg.bandwidth_bytes;
        if (!rate)
                return;
        int64_t burst = (int64_t) MAX(rate / 4, (uint64_t) READ_CHUNK);
        int64_t add = (now - s->tok_ms) * (int64_t) MIN(rate, (uint64_t) INT64_MAX / 1000000) / 1000;
        if (add <= 0)
                return;
        s->tok_ms = now;
        for (int d = 0; d < 2; d++)
                s->tok[d] = MIN(burst, s->tok[d] + add);
}

/* How much direction d may read now (0: stall until the timer refills). */
static size_t site_allowance(egress_site *s, int d, size_t want) {
        if (!site_throttles(s))
                return want;
        site_refill(s, now_ms());
        return s->tok[d] > 0 ? MIN(want, (size_t) s->tok[d]) : 0;
}

static void site_spend(egress_site *s, int d, size_t n) {
        if (site_throttles(s))
                s->tok[d] -= (int64_t) n;
}

/* ------------------------------------------------------------------ relay */

static int buf_alloc(buf *b) {
        if (b->data)
                return 0;
        b->data = malloc(BUF_SIZE);
        return b->data ? 0 : -ENOMEM;
}

static void buf_compact(buf *b) {
        if (b->off && b->len)
                memmove(b->data, b->data + b->off, b->len);
        b->off = b->len ? 0 : 0;
        if (!b->len)
                b->off = 0;
}

static void conn_maybe_finish(conn *c);

/* The first bytes of a tunnel: judge them before anything goes upstream. */
static void icpt_start(conn *c);

static void peek_refuse(conn *c, const char *reason, const char *detail) {
        c->refused_after_allow = true;
        conn_refuse(c, 0, 0, reason, detail);
}

static int conn_build_uphead(conn *c);
static int conn_frame_body(conn *c, size_t start, size_t n);

/* The framing of the one request body relayed after head r: chunked, or
 * Content-Length (none: no body). -ENOMEM. */
static int body_begin(conn *c, const proxyreq *r) {
        if (r->chunked) {
                c->body_chunked = true;
                c->framer = malloc(sizeof *c->framer);
                if (!c->framer)
                        return -ENOMEM;
                chunked_init(c->framer);
                c->body_done = false;
        } else {
                c->body_left = r->has_content_length ? r->content_length : 0;
                c->body_done = c->body_left == 0;
        }
        return 0;
}

/* How many of the n bytes at d still belong to the body (*ret_take; what
 * follows is never relayed); sets body_done at its end. A framing error is
 * negative, with error_detail set. */
static int body_take(conn *c, const uint8_t *d, size_t n, size_t *ret_take) {
        if (c->body_done) {
                *ret_take = 0;
                return 0;
        }
        if (c->body_chunked) {
                size_t used = 0;
                int k = chunked_feed(c->framer, d, n, &used);
                if (k < 0) {
                        snprintf(c->error_detail, sizeof c->error_detail, "%s",
                                 c->framer->why ? c->framer->why : "bad chunked body");
                        return k;
                }
                c->body_done = k == CHUNKED_DONE;
                *ret_take = used;
                return 0;
        }
        size_t take = (size_t) MIN((uint64_t) n, c->body_left);
        c->body_left -= take;
        c->body_done = c->body_left == 0;
        *ret_take = take;
        return 0;
}

/* Plain HTTP/1.x inside a tunnel (CONNECT host:80, or SOCKS5 carrying
 * http://) gets the forward proxy's treatment: its Host must be the tunnel's
 * (no virtual-host fronting on a shared address), it is rewritten
 * (Connection: close, no secrets in plain HTTP), one body is relayed, and
 * nothing after it. Returns 0 when the bytes are not HTTP (another
 * protocol), 1 when waiting for more or when c was handled (refused, or
 * switched to forward mode). */
static int tunnel_http(conn *c) {
        const uint8_t *d = c->c2u.data + c->c2u.off;
        size_t n = c->c2u.len;
        if (d[0] < 'A' || d[0] > 'Z')
                return 0;
        const uint8_t *eol = memchr(d, '\n', MIN(n, (size_t) 8192));
        if (!eol) {
                if (n < 8192 && !c->client_eof)
                        return 1; /* the request line is not complete yet */
                return 0;
        }
        size_t ll = (size_t) (eol - d);
        if (ll < 10 || d[ll - 1] != '\r' ||
            (memcmp(d + ll - 10, " HTTP/1.1\r", 10) != 0 && memcmp(d + ll - 10, " HTTP/1.0\r", 10) != 0))
                return 0; /* SMTP, IMAP, ...: not HTTP */
        proxyreq *r = malloc(sizeof *r);
        if (!r) {
                peek_refuse(c, "out of memory", NULL);
                return 1;
        }
        proxyreq_init_origin(r);
        size_t used = 0;
        int k = proxyreq_feed(r, d, n, &used);
        if (k == PROXYREQ_NEED_MORE) {
                free(r);
                if (n >= BUF_SIZE || c->client_eof) {
                        peek_refuse(c, "HTTP request head inside the tunnel incomplete", NULL);
                        return 1;
                }
                return 1;
        }
        if (k < 0) {
                char why[128];
                snprintf(why, sizeof why, "%s", r->why ? r->why : "malformed");
                free(r);
                peek_refuse(c, "bad HTTP request inside the tunnel", why);
                return 1;
        }
        egress_host hh;
        if (egress_host_parse_n(r->host, r->host_len, &hh) < 0 || !egress_host_equal(&hh, &c->host) ||
            (r->port && r->port != c->port)) {
                free(r);
                peek_refuse(c, "the request's Host is not the tunnel's host", NULL);
                return 1;
        }
        /* now a forward request to the tunnel's (already dialled) host */
        c->fwd = true;
        c->req = r;
        snprintf(c->method, sizeof c->method, "%s", r->method);
        if (body_begin(c, r) < 0) {
                peek_refuse(c, "out of memory", NULL);
                return 1;
        }
        if (conn_build_uphead(c) < 0)
                return 1; /* refused (and freed) */
        free(c->req);
        c->req = NULL;
        size_t rest = n - used;
        memmove(c->c2u.data, d + used, rest);
        c->c2u.off = 0;
        c->c2u.len = rest;
        c->peeking = false;
        c->deadline_ms = 0;
        if (conn_frame_body(c, 0, rest) < 0) {
                peek_refuse(c, "bad request body framing", c->error_detail);
                return 1;
        }
        return 1;
}

static void conn_peek(conn *c) {
        if (!c->peeking)
                return;
        if (!c->c2u.len) {
                /* a tunnel closed before its first byte: nothing to judge */
                if (c->client_eof) {
                        c->error_reason = "the sandbox closed the tunnel before sending";
                        conn_free(c, true);
                }
                return;
        }
        tlshello h;
        int k = tlshello_parse(c->c2u.data + c->c2u.off, c->c2u.len, &h);
        if (k == TLSHELLO_NEED_MORE) {
                if (c->c2u.len >= BUF_SIZE || c->client_eof)
                        return peek_refuse(c, "TLS ClientHello incomplete", NULL);
                return;
        }
        if (k == -EINVAL) {
                if (c->port == 443)
                        return peek_refuse(c, "port 443 carries only TLS with SNI",
                                           "the first bytes are not a TLS ClientHello");
                int h1 = tunnel_http(c);
                if (h1 != 0)
                        return; /* waiting for more, refused, or now a forward request */
                if (egress_inject_has_placeholder(c->site->inject, c->c2u.data + c->c2u.off, c->c2u.len))
                        return peek_refuse(c, "secret placeholder refused",
                                           "a placeholder in a tunnel the proxy does not rewrite");
                c->peeking = false; /* another protocol: nothing to compare */
                return;
        }
        if (k < 0)
                return peek_refuse(c, "malformed TLS ClientHello", h.why);
        /* An ECH extension is let through when the outer SNI matches:
         * browsers send a GREASE one that cannot be told from a real one,
         * and a real one carries the ECH provider's public name as outer
         * SNI, which the check below compares with the CONNECT host like
         * any other (docs/egress.md). */
        if (!h.has_sni) {
                if (c->host.kind == EGRESS_HOST_NAME)
                        return peek_refuse(c, "TLS without SNI to a named host",
                                           "the ClientHello must name the CONNECT host");
        } else {
                egress_host sni;
                if (egress_host_parse_n(h.sni, h.sni_len, &sni) < 0 || !egress_host_equal(&sni, &c->host)) {
                        char d[160];
                        snprintf(d, sizeof d, "SNI '%.*s' is not '%s'", (int) MIN(h.sni_len, (size_t) 64),
                                 egress_host_parse_n(h.sni, h.sni_len, &sni) < 0 ? "(invalid)" : h.sni,
                                 c->host.text);
                        return peek_refuse(c, "TLS SNI does not match the tunnel's host", d);
                }
        }
        c->peeking = false;
        if (c->site->proxy->cfg.mint && egress_inject_wants(c->site->inject, &c->host, c->port))
                icpt_start(c);
}

/* Take n client bytes just appended at c2u's end through the HTTP body
 * framing; bytes past the one request are dropped. */
static int conn_frame_body(conn *c, size_t start, size_t n) {
        if (!c->fwd)
                return 0;
        size_t keep = 0;
        int k = body_take(c, c->c2u.data + start, n, &keep);
        /* after an error none of this read goes anywhere: what follows a
         * framing error could be a smuggled request */
        c->c2u.len = start + (k < 0 ? 0 : keep) - c->c2u.off;
        return k;
}

/* Take the values an injection used (res keeps the rest). */
static void conn_take_values(conn *c, egress_inject_result *res) {
        for (size_t i = 0; i < res->n_values; i++) {
                if (res->value_lens[i] > MASK_VALUE_MAX || c->n_mask == EGRESS_INJECT_VALUES_MAX)
                        continue;
                c->mask[c->n_mask] = res->values[i];
                c->mask_len[c->n_mask++] = res->value_lens[i];
                c->mask_max = MAX(c->mask_max, res->value_lens[i]);
                res->values[i] = NULL;
                res->value_lens[i] = 0;
        }
}

static void mask_region(conn *c, uint8_t *data, size_t len) {
        for (size_t i = 0; i < c->n_mask; i++) {
                uint8_t *p = data, *end = data + len;
                while (p < end) {
                        uint8_t *f = memmem(p, (size_t) (end - p), c->mask[i], c->mask_len[i]);
                        if (!f)
                                break;
                        memset(f, '*', c->mask_len[i]);
                        p = f + c->mask_len[i];
                }
        }
}

/* Response bytes that may not leave yet: the start of a value could be
 * among them. */
static size_t conn_held(const conn *c) {
        if (!c->n_mask || c->upstream_eof || c->icpt)
                return 0;
        return MIN(c->mask_max - 1, c->u2c.len);
}

static void upstream_broken(conn *c);

/* How much direction d (0: from the client into c2u, 1: from the upstream
 * into u2c) may read now, after compacting its buffer; 0 with the
 * connection stalled when the site's bandwidth tokens ran out. */
static size_t conn_read_room(conn *c, int d) {
        buf *b = d ? &c->u2c : &c->c2u;
        if (b->off && b->off + b->len >= BUF_SIZE)
                buf_compact(b);
        size_t space = BUF_SIZE - b->off - b->len;
        size_t want = site_allowance(c->site, d, MIN(space, (size_t) READ_CHUNK));
        if (want == 0 && space) {
                c->stalled[d] = true;
                c->site->proxy->throttled = true;
                timer_want(c->site->proxy, now_ms() + THROTTLE_MS);
        }
        return want;
}

static void conn_read_client(conn *c) {
        buf *b = &c->c2u;
        size_t want = conn_read_room(c, 0);
        if (want == 0)
                return;
        ssize_t n = recv(c->cl.fd, b->data + b->off + b->len, want, MSG_DONTWAIT);
        if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                        return;
                c->client_eof = true;
                c->error_reason = "client connection error";
                return;
        }
        if (n == 0) {
                c->client_eof = true;
                return;
        }
        site_spend(c->site, 0, (size_t) n);
        size_t start = b->off + b->len;
        b->len += (size_t) n;
        if (conn_frame_body(c, start, (size_t) n) < 0) {
                c->error_reason = "bad request body framing";
                c->client_eof = true;
                c->body_done = true;
                upstream_broken(c); /* the request is cut: the upstream gets nothing more */
        }
}

static void conn_read_upstream(conn *c) {
        buf *b = &c->u2c;
        size_t want = conn_read_room(c, 1);
        if (want == 0)
                return;
        ssize_t n = recv(c->up.fd, b->data + b->off + b->len, want, MSG_DONTWAIT);
        if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                        return;
                c->upstream_eof = true;
                return;
        }
        if (n == 0) {
                c->upstream_eof = true;
                return;
        }
        site_spend(c->site, 1, (size_t) n);
        size_t at = b->off + b->len;
        b->len += (size_t) n;
        c->bytes_in += (uint64_t) n;
        if (c->n_mask) {
                size_t start = at >= b->off + c->mask_max - 1 ? at - (c->mask_max - 1) : b->off;
                mask_region(c, b->data + start, b->off + b->len - start);
        }
}

static int write_some(int fd, const uint8_t *data, size_t len, size_t *ret) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
                if (errno == EAGAIN || errno == EINTR) {
                        *ret = 0;
                        return 0;
                }
                return -errno;
        }
        *ret = (size_t) n;
        return 0;
}

/* The upstream refuses more bytes: what the client still sends has nowhere
 * to go, but what the upstream already sent is still delivered. */
static void upstream_broken(conn *c) {
        c->upstream_eof = c->client_eof = true;
        c->c2u.len = c->c2u.off = 0;
        c->uphead_off = c->uphead_len;
}

static void conn_write_upstream(conn *c) {
        size_t n = 0;
        if (c->uphead_off < c->uphead_len) {
                if (write_some(c->up.fd, c->uphead + c->uphead_off, c->uphead_len - c->uphead_off, &n) < 0) {
                        upstream_broken(c);
                        return;
                }
                c->uphead_off += n;
                c->bytes_out += n;
                if (c->uphead_off < c->uphead_len)
                        return;
        }
        if (c->peeking || !c->c2u.len)
                return;
        if (write_some(c->up.fd, c->c2u.data + c->c2u.off, c->c2u.len, &n) < 0) {
                upstream_broken(c);
                return;
        }
        c->c2u.off += n;
        c->c2u.len -= n;
        c->bytes_out += n;
        if (!c->c2u.len)
                c->c2u.off = 0;
}

static void conn_write_client(conn *c) {
        size_t n = 0;
        size_t ready = c->u2c.len - conn_held(c);
        if (!ready)
                return;
        if (write_some(c->cl.fd, c->u2c.data + c->u2c.off, ready, &n) < 0) {
                c->client_eof = c->upstream_eof = true;
                c->u2c.len = 0;
                return;
        }
        c->u2c.off += n;
        c->u2c.len -= n;
        if (!c->u2c.len)
                c->u2c.off = 0;
}

/* Half-closes and the end of a relay. HTTP: the connection ends with the
 * response (or when the client hangs up). Tunnels: each side's EOF is passed
 * on once its buffered bytes are out; both EOFs end it. */
static void conn_maybe_finish(conn *c) {
        if (c->dead || c->state != S_RELAY)
                return;
        if (c->fwd) {
                if (c->client_eof || (c->upstream_eof && !c->u2c.len))
                        return conn_free(c, true);
                return conn_arm(c);
        }
        if (c->client_eof && !c->peeking && !c->c2u.len && !c->up_shut && !c->upstream_eof) {
                (void) shutdown(c->up.fd, SHUT_WR);
                c->up_shut = true;
        }
        if (c->upstream_eof && !c->u2c.len && !c->cl_shut && !c->client_eof) {
                (void) shutdown(c->cl.fd, SHUT_WR);
                c->cl_shut = true;
        }
        if (c->client_eof && c->upstream_eof && !c->u2c.len)
                return conn_free(c, true);
        conn_arm(c);
}

/* ------------------------------------------------------------ the dial */

static void conn_start_relay(conn *c);
static void conn_try_next_address(conn *c);

static void conn_dial(conn *c, const egress_addr *a) {
        egress_proxy *p = c->site->proxy;
        egress_host lit;
        memset(&lit, 0, sizeof lit);
        lit.kind = a->family == AF_INET ? EGRESS_HOST_IPV4 : EGRESS_HOST_IPV6;
        lit.addr = *a;
        if (egress_host_sockaddr(&lit, c->port, &c->sa, &c->sa_len) < 0)
                return conn_try_next_address(c);
        (void) egress_addr_format(a, c->address, sizeof c->address);

        int fd = socket(a->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                c->last_connect_errno = errno;
                return conn_try_next_address(c);
        }
        int one = 1;
        (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, (struct sockaddr *) &c->sa, c->sa_len) < 0 && errno != EINPROGRESS) {
                c->last_connect_errno = errno;
                close(fd);
                return conn_try_next_address(c);
        }
        c->up = (ev){ .kind = EV_UPSTREAM, .obj = c, .fd = fd };
        c->state = S_CONNECTING;
        c->deadline_ms = now_ms() + CONNECT_TIMEOUT_MS;
        timer_want(p, c->deadline_ms);
        conn_arm(c);
}

static void conn_try_next_address(conn *c) {
        egress_proxy *p = c->site->proxy;
        ev_close(p, &c->up);
        c->address[0] = 0;
        while (c->addr_next < c->n_addrs) {
                const egress_addr *a = &c->addrs[c->addr_next++];
                egress_host lit;
                memset(&lit, 0, sizeof lit);
                lit.kind = a->family == AF_INET ? EGRESS_HOST_IPV4 : EGRESS_HOST_IPV6;
                lit.addr = *a;
                struct sockaddr_storage ss;
                socklen_t sl;
                if (egress_host_sockaddr(&lit, c->port, &ss, &sl) < 0)
                        continue;
                egress_decision d;
                if (egress_decide_address(c->site->policy, &c->host, (struct sockaddr *) &ss, sl, c->port, &d) < 0 ||
                    d.verdict != EGRESS_ALLOW) {
                        if (!c->any_denied) {
                                c->any_denied = true;
                                c->denied_decision = d;
                                (void) egress_addr_format(a, c->denied_address, sizeof c->denied_address);
                        }
                        continue;
                }
                c->decision = d;
                return conn_dial(c, a);
        }
        /* Nothing left to try. */
        if (c->last_connect_errno) {
                char d[128];
                snprintf(d, sizeof d, "connect %s: %s", c->host.text, strerror(c->last_connect_errno));
                return conn_refuse(c, 502, c->last_connect_errno == ECONNREFUSED ? SOCKS5_REP_CONNECTION_REFUSED
                                           : c->last_connect_errno == ETIMEDOUT  ? SOCKS5_REP_TTL_EXPIRED
                                           : c->last_connect_errno == ENETUNREACH
                                                   ? SOCKS5_REP_NETWORK_UNREACHABLE
                                                   : SOCKS5_REP_HOST_UNREACHABLE,
                                   "upstream connection failed", d);
        }
        if (c->any_denied) {
                c->decision = c->denied_decision;
                return conn_deny(c);
        }
        char d[300];
        snprintf(d, sizeof d, "%s: %s", c->host.text, c->dns_error ? c->dns_error : "no address");
        conn_refuse(c, 502, SOCKS5_REP_HOST_UNREACHABLE, "name resolution failed", d);
}

static void conn_connected(conn *c) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(c->up.fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
                err = errno;
        if (err) {
                c->last_connect_errno = err;
                return conn_try_next_address(c);
        }
        conn_start_relay(c);
}

/* ---------------------------------------------------------------- DNS */

static void conn_dns_send(conn *c);
static void conn_dns_tcp_start(conn *c);

static const uint16_t dns_qtypes[2] = { DNS_TYPE_A, DNS_TYPE_AAAA };

static void conn_dns_tcp_close(conn *c) {
        ev_close(c->site->proxy, &c->dns_tcp);
        free(c->tcp_buf);
        c->tcp_buf = NULL;
        c->tcp_have = c->tcp_want = 0;
        c->tcp_sent = false;
        c->tcp_q = -1;
}

static void conn_dns_done(conn *c) {
        ev_close(c->site->proxy, &c->dns);
        conn_dns_tcp_close(c);
        c->addr_next = 0;
        conn_try_next_address(c);
}

/* The nameserver idx as a connected, non-blocking socket of type (UDP:
 * only its datagrams are received; TCP: the connect is under way). */
static int dns_socket(egress_proxy *p, unsigned idx, int type) {
        const egress_addr *ns = &p->cfg.nameservers[idx];
        egress_host lit;
        memset(&lit, 0, sizeof lit);
        lit.kind = ns->family == AF_INET ? EGRESS_HOST_IPV4 : EGRESS_HOST_IPV6;
        lit.addr = *ns;
        struct sockaddr_storage ss;
        socklen_t sl;
        int r = egress_host_sockaddr(&lit, p->cfg.dns_port ? p->cfg.dns_port : 53, &ss, &sl);
        if (r < 0)
                return r;
        int fd = socket(ns->family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (connect(fd, (struct sockaddr *) &ss, sl) < 0 && errno != EINPROGRESS) {
                r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

static void conn_dns_send(conn *c) {
        egress_proxy *p = c->site->proxy;
        ev_close(p, &c->dns);
        conn_dns_tcp_close(c);
        while (c->ns_index < p->cfg.n_nameservers) {
                if (c->tries >= DNS_TRIES) {
                        c->ns_index++;
                        c->tries = 0;
                        continue;
                }
                c->tries++;
                int fd = dns_socket(p, c->ns_index, SOCK_DGRAM);
                if (fd < 0) {
                        c->tries = DNS_TRIES;
                        continue;
                }
                c->dns = (ev) { .kind = EV_DNS, .obj = c, .fd = fd };
                for (int i = 0; i < 2; i++) {
                        if (c->qdone[i])
                                continue;
                        c->qtrunc[i] = false;
                        uint8_t q[DNS_QUERY_MAX];
                        if (getrandom(&c->qid[i], sizeof c->qid[i], 0) != sizeof c->qid[i])
                                c->qid[i] = (uint16_t) (now_ms() ^ (uintptr_t) c);
                        int n = dns_build_query(c->host.text, c->qid[i], dns_qtypes[i], q, sizeof q);
                        if (n < 0 || send(fd, q, (size_t) n, MSG_DONTWAIT | MSG_NOSIGNAL) != n) {
                                c->dns_error = "cannot send the query";
                                continue;
                        }
                }
                (void) ev_set(p, &c->dns, EPOLLIN);
                c->try_deadline_ms = now_ms() + DNS_TRY_MS;
                c->deadline_ms = c->try_deadline_ms;
                timer_want(p, c->deadline_ms);
                return;
        }
        if (!c->dns_error)
                c->dns_error = p->cfg.n_nameservers ? "no answer from the nameservers"
                                                    : "no nameserver configured";
        conn_dns_done(c);
}

/* Query i has its answer (k and res as dns_parse_response() gave them);
 * then, when both have one, the resolution is over. */
static void conn_dns_answer(conn *c, int i, int k, const dns_result *res) {
        c->qdone[i] = true;
        if (k == -ENXIO)
                c->dns_error = "no such name (NXDOMAIN)";
        else if (k == -ENODATA) {
                if (!c->dns_error)
                        c->dns_error = "the name has no address";
        } else if (k == -EMSGSIZE) {
                if (!c->dns_error)
                        c->dns_error = "the answer is too large, over TCP too";
        } else if (k < 0) {
                if (!c->dns_error)
                        c->dns_error = "the nameserver failed (SERVFAIL or similar)";
        }
        for (size_t j = 0; k >= 0 && j < res->n_addrs && c->n_addrs < DNS_ADDRS_TRY; j++)
                c->addrs[c->n_addrs++] = res->addrs[j];
        if (c->qdone[0] && c->qdone[1])
                return conn_dns_done(c);
        if (c->n_addrs && !c->qtrunc[!i]) {
                /* One family answered: give the other a moment. */
                int64_t linger = now_ms() + DNS_LINGER_MS;
                if (linger < c->deadline_ms) {
                        c->deadline_ms = linger;
                        timer_want(c->site->proxy, linger);
                }
        }
}

static void conn_dns_read(conn *c) {
        uint8_t msg[DNS_MSG_MAX];
        for (int rounds = 0; rounds < 8 && c->dns.fd >= 0 && !c->dead && c->state == S_RESOLVE;
             rounds++) {
                ssize_t n = recv(c->dns.fd, msg, sizeof msg, MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == ECONNREFUSED) { /* ICMP: nobody there; next server */
                                c->tries = DNS_TRIES;
                                return conn_dns_send(c);
                        }
                        return;
                }
                for (int i = 0; i < 2; i++) {
                        if (c->qdone[i] || c->qtrunc[i])
                                continue;
                        dns_result res;
                        int k = dns_parse_response(msg, (size_t) n, c->qid[i], c->host.text,
                                                   dns_qtypes[i], &res);
                        if (k == -ENOMSG || k == -EBADMSG)
                                continue; /* not this query's answer (or garbage): keep waiting */
                        if (k == -EMSGSIZE) {
                                /* truncated (TC): ask that nameserver again over TCP (RFC 7766) */
                                c->qtrunc[i] = true;
                                conn_dns_tcp_start(c);
                                break;
                        }
                        conn_dns_answer(c, i, k, &res);
                        break;
                }
        }
}

/* ---------------------------------------------------------- DNS over TCP */

/* The next truncated query over TCP to the nameserver that truncated it,
 * one at a time; the UDP try's deadline bounds it like the UDP answer. */
static void conn_dns_tcp_start(conn *c) {
        egress_proxy *p = c->site->proxy;
        if (c->dns_tcp.fd >= 0)
                return;
        int i = c->qtrunc[0] && !c->qdone[0] ? 0 : c->qtrunc[1] && !c->qdone[1] ? 1 : -1;
        if (i < 0)
                return;
        int fd = dns_socket(p, c->ns_index, SOCK_STREAM);
        if (fd < 0) {
                c->dns_error = "the answer was truncated and TCP to the nameserver failed";
                dns_result none = { .n_addrs = 0 };
                return conn_dns_answer(c, i, -EIO, &none);
        }
        c->dns_tcp = (ev) { .kind = EV_DNS_TCP, .obj = c, .fd = fd };
        c->tcp_q = i;
        (void) ev_set(p, &c->dns_tcp, EPOLLOUT);
}

static void conn_dns_tcp_fail(conn *c, const char *why) {
        int i = c->tcp_q;
        conn_dns_tcp_close(c);
        if (!c->dns_error)
                c->dns_error = why;
        dns_result none = { .n_addrs = 0 };
        conn_dns_answer(c, i, -EIO, &none);
        if (!c->dead && c->state == S_RESOLVE)
                conn_dns_tcp_start(c);
}

static void conn_dns_tcp_event(conn *c) {
        egress_proxy *p = c->site->proxy;
        int i = c->tcp_q;
        if (i < 0)
                return;
        if (!c->tcp_sent) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(c->dns_tcp.fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr)
                        return conn_dns_tcp_fail(
                                c, "the answer was truncated and TCP to the nameserver failed");
                /* the query again, behind its two length bytes: a few hundred
                 * bytes into an empty socket buffer go in one send */
                uint8_t q[2 + DNS_QUERY_MAX];
                int n = dns_build_query(c->host.text, c->qid[i], dns_qtypes[i], q + 2, sizeof q - 2);
                if (n < 0)
                        return conn_dns_tcp_fail(c, "cannot send the query");
                q[0] = (uint8_t) (n >> 8);
                q[1] = (uint8_t) n;
                if (send(c->dns_tcp.fd, q, (size_t) n + 2, MSG_DONTWAIT | MSG_NOSIGNAL) != n + 2)
                        return conn_dns_tcp_fail(
                                c, "the answer was truncated and TCP to the nameserver failed");
                c->tcp_sent = true;
                c->tcp_want = 2;
                c->tcp_buf = malloc(2 + DNS_TCP_MSG_MAX);
                if (!c->tcp_buf)
                        return conn_dns_tcp_fail(c, "out of memory");
                (void) ev_set(p, &c->dns_tcp, EPOLLIN);
                return;
        }
        for (;;) {
                ssize_t n = recv(c->dns_tcp.fd, c->tcp_buf + c->tcp_have, c->tcp_want - c->tcp_have,
                                 MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        return;
                if (n <= 0)
                        return conn_dns_tcp_fail(c, "the nameserver closed TCP before its answer");
                c->tcp_have += (size_t) n;
                if (c->tcp_have < c->tcp_want)
                        continue;
                if (c->tcp_want == 2) {
                        size_t len = (size_t) c->tcp_buf[0] << 8 | c->tcp_buf[1];
                        if (len == 0 || len > DNS_TCP_MSG_MAX)
                                return conn_dns_tcp_fail(c,
                                                         "the nameserver's TCP answer is too large");
                        c->tcp_want = 2 + len;
                        continue;
                }
                dns_result res;
                int k = dns_parse_response(c->tcp_buf + 2, c->tcp_want - 2, c->qid[i], c->host.text,
                                           dns_qtypes[i], &res);
                if (k == -ENOMSG || k == -EBADMSG)
                        return conn_dns_tcp_fail(
                                c, "the nameserver's TCP answer is not one to the query");
                conn_dns_tcp_close(c);
                conn_dns_answer(c, i, k, &res);
                if (!c->dead && c->state == S_RESOLVE)
                        conn_dns_tcp_start(c);
                return;
        }
}

static void conn_dns_timeout(conn *c) {
        if (c->n_addrs || (c->qdone[0] && c->qdone[1]))
                return conn_dns_done(c);
        conn_dns_send(c);
}

/* ------------------------------------------------------------ decisions */

/* The request is in: host text parsed, kind and port known. */
static int conn_build_uphead(conn *c);

static void conn_decide(conn *c, const char *hosttext, size_t hostlen, uint16_t port) {
        if (egress_host_parse_n(hosttext, hostlen, &c->host) < 0) {
                char d[96];
                snprintf(d, sizeof d, "'%.*s'", (int) MIN(hostlen, (size_t) 64), hosttext);
                for (char *q = d; *q; q++)
                        if ((unsigned char) *q < 0x20 || (unsigned char) *q >= 0x7f)
                                *q = '?';
                return conn_refuse(c, 400, SOCKS5_REP_ADDRESS_NOT_SUPPORTED, "invalid destination host", d);
        }
        c->port = port;
        c->decided = true;
        if (egress_decide(c->site->policy, &c->host, port, &c->decision) < 0 || c->decision.verdict != EGRESS_ALLOW) {
                c->decision.verdict = EGRESS_DENY;
                return conn_deny(c);
        }
        /* A forward request's head is rewritten now: a refusal (a secret's
         * placeholder headed elsewhere) sends nothing anywhere, not even a
         * SYN. */
        if (c->kind == EGRESS_KIND_HTTP) {
                if (conn_build_uphead(c) < 0)
                        return; /* refused */
                free(c->req);
                c->req = NULL;
        }
        if (c->host.kind != EGRESS_HOST_NAME) {
                c->addrs[0] = c->host.addr;
                c->n_addrs = 1;
                c->addr_next = 0;
                return conn_try_next_address(c);
        }
        c->state = S_RESOLVE;
        conn_arm(c);
        conn_dns_send(c);
}

/* ---------------------------------------------------- HTTP forward heads */

/* A secret's value, for inject.c: the site's sandbox asks. */
typedef struct resolve_ctx {
        egress_proxy *p;
        const char *sandbox_id;
} resolve_ctx;

static int resolve_shim(void *userdata, const char *name, const egress_host *h, uint16_t port, char **ret,
                        size_t *ret_len) {
        resolve_ctx *rc = userdata;
        if (!rc->p->cfg.resolve)
                return -ENOENT;
        return rc->p->cfg.resolve(rc->p->cfg.userdata, rc->sandbox_id, name, h, port, ret, ret_len);
}

/* The head sent upstream (inject.c): origin-form request line, Host of the
 * parsed target, the client's end-to-end headers with credentials applied,
 * Connection: close. Refusals answer the client. Returns < 0 when c was
 * refused (and freed). */
static int conn_build_uphead(conn *c) {
        resolve_ctx rc = { c->site->proxy, c->site->sandbox_id };
        egress_inject_result res;
        char why[256] = "";
        int r = egress_inject_apply(c->site->inject, &c->host, c->port, false, c->req, resolve_shim, &rc, &res, why,
                                    sizeof why);
        if (r < 0) {
                if (r == -EACCES) {
                        c->refused_after_allow = true;
                        conn_refuse(c, 403, 0, "secret placeholder refused", why);
                } else
                        conn_refuse(c, r == -E2BIG ? 400 : 502, 0, "credential injection failed", why);
                return r;
        }
        snprintf(c->injected, sizeof c->injected, "%s", res.used);
        c->uphead = (uint8_t *) res.head;
        c->uphead_len = res.head_len;
        c->uphead_off = 0;
        res.head = NULL;
        conn_take_values(c, &res);
        egress_inject_result_clear(&res);
        return 0;
}

static void conn_start_relay(conn *c) {
        if (buf_alloc(&c->u2c) < 0)
                return conn_refuse(c, 502, SOCKS5_REP_GENERAL_FAILURE, "out of memory", NULL);
        c->state = S_RELAY;
        c->deadline_ms = 0;
        if (c->kind == EGRESS_KIND_HTTP) {
                /* the head was built before the dial (conn_decide) */
        } else if (c->kind == EGRESS_KIND_CONNECT) {
                static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
                send_client(c, ok, sizeof ok - 1);
                c->peeking = true;
                c->deadline_ms = now_ms() + PEEK_TIMEOUT_MS;
        } else {
                uint8_t rep[SOCKS5_REPLY_MAX];
                egress_addr bound;
                struct sockaddr_storage ss;
                socklen_t sl = sizeof ss;
                int n;
                if (getsockname(c->up.fd, (struct sockaddr *) &ss, &sl) == 0 &&
                    egress_addr_from_sockaddr((struct sockaddr *) &ss, sl, &bound) == 0)
                        n = socks5_reply(SOCKS5_REP_SUCCEEDED, &bound,
                                         ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *) &ss)->sin_port
                                                                       : ((struct sockaddr_in6 *) &ss)->sin6_port),
                                         rep, sizeof rep);
                else
                        n = socks5_reply(SOCKS5_REP_SUCCEEDED, NULL, 0, rep, sizeof rep);
                if (n > 0)
                        send_client(c, rep, (size_t) n);
                c->peeking = true;
                c->deadline_ms = now_ms() + PEEK_TIMEOUT_MS;
        }
        if (c->deadline_ms)
                timer_want(c->site->proxy, c->deadline_ms);
        conn_peek(c);
        if (!c->dead)
                conn_arm(c);
}

/* ------------------------------------------------------- request heads */

static void conn_head_done(conn *c, size_t leftover_at, size_t leftover_len) {
        proxyreq *r = c->req;
        c->kind = r->connect ? EGRESS_KIND_CONNECT : EGRESS_KIND_HTTP;
        c->fwd = c->kind == EGRESS_KIND_HTTP;
        snprintf(c->method, sizeof c->method, "%s", r->method);
        /* Keep what followed the head: the body's start (HTTP) or early
         * tunnel bytes (CONNECT). */
        memmove(c->c2u.data, c->c2u.data + leftover_at, leftover_len);
        c->c2u.off = 0;
        c->c2u.len = leftover_len;
        if (c->kind == EGRESS_KIND_HTTP) {
                if (body_begin(c, r) < 0)
                        return conn_refuse(c, 502, 0, "out of memory", NULL);
                if (conn_frame_body(c, 0, leftover_len) < 0)
                        return conn_refuse(c, 400, 0, "bad request body framing", c->error_detail);
        }
        conn_decide(c, r->host, r->host_len, r->port);
}

static void conn_read_head(conn *c) {
        buf *b = &c->c2u;
        size_t space = BUF_SIZE - b->len;
        if (!space)
                return conn_refuse(c, 400, 0, "request head too large", NULL);
        ssize_t n = recv(c->cl.fd, b->data + b->len, MIN(space, (size_t) READ_CHUNK), MSG_DONTWAIT);
        if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                        return;
                c->error_reason = "client connection error";
                return conn_free(c, true);
        }
        if (n == 0) {
                c->error_reason = "closed before a complete request";
                return conn_free(c, c->state != S_SNIFF || b->len > 0);
        }
        size_t at = b->len;
        b->len += (size_t) n;

        if (c->state == S_SNIFF) {
                if (b->data[0] == 0x05) {
                        c->state = S_SOCKS;
                        c->socks = malloc(sizeof *c->socks);
                        if (!c->socks)
                                return conn_free(c, false);
                        socks5_init(c->socks);
                } else {
                        c->state = S_HEAD;
                        c->req = malloc(sizeof *c->req);
                        if (!c->req)
                                return conn_free(c, false);
                        proxyreq_init(c->req);
                }
        }

        size_t used = 0;
        if (c->state == S_HEAD) {
                int k = proxyreq_feed(c->req, b->data + at, (size_t) n, &used);
                if (k < 0)
                        return conn_refuse(c, k == -EPROTONOSUPPORT ? 400 : 400, 0, "bad proxy request",
                                           c->req->why);
                if (k == PROXYREQ_DONE)
                        return conn_head_done(c, at + used, (size_t) n - used);
                return;
        }

        /* SOCKS5: greeting, then the request, possibly in one read. */
        size_t off = at;
        while (off < b->len) {
                int k = socks5_feed(c->socks, b->data + off, b->len - off, &used);
                off += used;
                if (k < 0) {
                        uint8_t rep[SOCKS5_REPLY_MAX];
                        int rl = 0;
                        if (c->socks->reply_kind == 1)
                                rl = socks5_method_reply(c->socks->reply, rep, sizeof rep);
                        else if (c->socks->reply_kind == 2)
                                rl = socks5_reply(c->socks->reply, NULL, 0, rep, sizeof rep);
                        if (rl > 0)
                                send_client(c, rep, (size_t) rl);
                        c->kind = EGRESS_KIND_SOCKS5;
                        c->error_reason = "bad SOCKS5 request";
                        snprintf(c->error_detail, sizeof c->error_detail, "%s", c->socks->why ? c->socks->why : "");
                        return conn_free(c, true);
                }
                if (k == SOCKS5_GREETING_DONE) {
                        uint8_t rep[2];
                        if (socks5_method_reply(SOCKS5_METHOD_NO_AUTH, rep, sizeof rep) == 2)
                                send_client(c, rep, 2);
                        continue;
                }
                if (k == SOCKS5_REQUEST_DONE) {
                        c->kind = EGRESS_KIND_SOCKS5;
                        size_t left = b->len - off;
                        memmove(b->data, b->data + off, left);
                        b->off = 0;
                        b->len = left;
                        char text[64];
                        const char *h;
                        size_t hl;
                        if (c->socks->atyp == SOCKS5_ATYP_DOMAIN) {
                                h = c->socks->host;
                                hl = c->socks->host_len;
                        } else {
                                egress_addr a = { .family = c->socks->atyp == SOCKS5_ATYP_IPV4 ? AF_INET : AF_INET6 };
                                memcpy(a.bytes, c->socks->addr, a.family == AF_INET ? 4 : 16);
                                int tl = egress_addr_format(&a, text, sizeof text);
                                h = text;
                                hl = tl > 0 ? (size_t) tl : 0;
                        }
                        return conn_decide(c, h, hl, c->socks->port);
                }
                break; /* NEED_MORE */
        }
        if (off >= b->len && c->state == S_SOCKS) {
                /* all consumed by the parser; nothing to keep */
                b->len = 0;
        }
}


/* ------------------------------------------------------ TLS interception */

static void icpt_start(conn *c);
static void icpt_pump(conn *c);

/* Move ciphertext the SSLs produced into the socket buffers, as far as they
 * have room; the rest waits in the BIOs. */
static void icpt_flush(conn *c) {
        buf *pairs[2] = { &c->u2c, &c->c2u };
        BIO *bios[2] = { c->tcl_out, c->tup_out };
        for (int i = 0; i < 2; i++) {
                buf *b = pairs[i];
                if (!bios[i] || !b->data)
                        continue;
                if (b->off && b->off + b->len >= BUF_SIZE)
                        buf_compact(b);
                size_t space = BUF_SIZE - b->off - b->len;
                if (!space || BIO_ctrl_pending(bios[i]) == 0)
                        continue;
                int n = BIO_read(bios[i], b->data + b->off + b->len, (int) MIN(space, (size_t) INT32_MAX));
                if (n > 0)
                        b->len += (size_t) n;
        }
}

/* Answer the sandbox inside the TLS session (a refusal or an upstream
 * failure), then close once it is out. */
static void icpt_answer(conn *c, int status, const char *reason, const char *detail) {
        c->error_reason = reason;
        if (detail)
                snprintf(c->error_detail, sizeof c->error_detail, "%s", detail);
        if (c->tcl_ready) {
                char body[512], msg[800];
                int bl = snprintf(body, sizeof body, "hutch egress proxy: %s%s%s%s\n", reason, detail ? " (" : "",
                                  detail ? detail : "", detail ? ")" : "");
                if (bl < 0 || (size_t) bl >= sizeof body)
                        bl = (int) strlen(body);
                int ml = snprintf(msg, sizeof msg,
                                  "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                                  "X-Hutch-Egress: %s\r\nConnection: close\r\n\r\n%s",
                                  status, status == 403 ? "Forbidden" : status == 400 ? "Bad Request" : "Bad Gateway",
                                  bl, status == 403 ? "denied" : "error", body);
                if (ml > 0 && (size_t) ml < sizeof msg)
                        (void) SSL_write(c->tcl, msg, ml);
                (void) SSL_shutdown(c->tcl);
        }
        c->icpt_failed = true;
        c->client_eof = true; /* read nothing more from the sandbox */
        icpt_flush(c);
}

static void icpt_start(conn *c) {
        egress_proxy *p = c->site->proxy;
        SSL_CTX *sctx = NULL;
        if (tlsmint_server_ctx(p->cfg.mint, c->host.text, &sctx) < 0)
                return peek_refuse(c, "TLS interception failed", "no certificate for the host");
        c->tcl = SSL_new(sctx);
        SSL_CTX_free(sctx);
        if (!c->tcl || tlsmint_client_ssl(p->cfg.mint, c->host.text, &c->tup) < 0)
                return peek_refuse(c, "TLS interception failed", "out of memory");
        c->tcl_in = BIO_new(BIO_s_mem());
        c->tcl_out = BIO_new(BIO_s_mem());
        c->tup_in = BIO_new(BIO_s_mem());
        c->tup_out = BIO_new(BIO_s_mem());
        if (!c->tcl_in || !c->tcl_out || !c->tup_in || !c->tup_out) {
                BIO_free(c->tcl_in);
                BIO_free(c->tcl_out);
                BIO_free(c->tup_in);
                BIO_free(c->tup_out);
                c->tcl_in = c->tcl_out = c->tup_in = c->tup_out = NULL;
                return peek_refuse(c, "TLS interception failed", "out of memory");
        }
        SSL_set_bio(c->tcl, c->tcl_in, c->tcl_out);
        SSL_set_bio(c->tup, c->tup_in, c->tup_out);
        SSL_set_accept_state(c->tcl);
        SSL_set_connect_state(c->tup);
        c->oreq = malloc(sizeof *c->oreq);
        if (!c->oreq)
                return peek_refuse(c, "TLS interception failed", "out of memory");
        proxyreq_init_origin(c->oreq);
        /* what the client sent so far (its ClientHello) goes to our server side */
        if (c->c2u.len)
                (void) BIO_write(c->tcl_in, c->c2u.data + c->c2u.off, (int) c->c2u.len);
        c->c2u.off = c->c2u.len = 0;
        c->icpt = true;
        c->icpt_phase = ICPT_HEAD;
        c->peeking = false;
        c->deadline_ms = now_ms() + PEEK_TIMEOUT_MS; /* until the request head is in */
        timer_want(p, c->deadline_ms);
        icpt_pump(c);
}

/* Request body bytes inside the tunnel: what belongs to the one body goes
 * upstream; at its end only the response is left. */
static void icpt_body(conn *c, const uint8_t *d, size_t n) {
        size_t take = 0;
        if (body_take(c, d, n, &take) < 0)
                return icpt_answer(c, 400, "bad request body framing", c->error_detail);
        if (take && SSL_write(c->tup, d, (int) take) <= 0)
                return icpt_answer(c, 502, "upstream TLS write failed", NULL);
        c->bytes_out += take;
        if (c->body_done)
                c->icpt_phase = ICPT_RESPONSE;
}

/* The request head inside the tunnel is complete: it must be for the
 * tunnel's host; rewrite it and send it upstream. */
static void icpt_head_done(conn *c, const uint8_t *rest, size_t rest_len) {
        proxyreq *r = c->oreq;
        egress_host hh;
        if (egress_host_parse_n(r->host, r->host_len, &hh) < 0 || !egress_host_equal(&hh, &c->host) ||
            (r->port && r->port != c->port))
                return icpt_answer(c, 400, "the request's Host is not the tunnel's host", NULL);
        snprintf(c->method, sizeof c->method, "%s", r->method);
        resolve_ctx rc = { c->site->proxy, c->site->sandbox_id };
        egress_inject_result res;
        char why[256] = "";
        int k = egress_inject_apply(c->site->inject, &c->host, c->port, true, r, resolve_shim, &rc, &res, why,
                                    sizeof why);
        if (k < 0) {
                if (k == -EACCES)
                        c->refused_after_allow = true;
                return icpt_answer(c, k == -EACCES ? 403 : k == -E2BIG ? 400 : 502,
                                   k == -EACCES ? "secret placeholder refused" : "credential injection failed", why);
        }
        snprintf(c->injected, sizeof c->injected, "%s", res.used);
        int w = SSL_write(c->tup, res.head, (int) res.head_len);
        c->bytes_out += res.head_len;
        conn_take_values(c, &res);
        egress_inject_result_clear(&res);
        if (w <= 0)
                return icpt_answer(c, 502, "upstream TLS write failed", NULL);
        if (body_begin(c, r) < 0)
                return icpt_answer(c, 502, "out of memory", NULL);
        c->icpt_phase = c->body_done ? ICPT_RESPONSE : ICPT_BODY;
        c->deadline_ms = 0;
        if (rest_len)
                icpt_body(c, rest, rest_len); /* body bytes that came with the head */
}

/* Response plaintext to the sandbox, with the secret values masked; the
 * last mask_max - 1 bytes wait in hold for what follows. */
static int icpt_respond(conn *c, const uint8_t *pt, size_t n) {
        if (!c->n_mask)
                return SSL_write(c->tcl, pt, (int) n) > 0 ? 0 : -EIO;
        if (!c->hold && !(c->hold = malloc(MASK_VALUE_MAX)))
                return -ENOMEM;
        size_t total = c->hold_len + n;
        uint8_t *tmp = malloc(total);
        if (!tmp)
                return -ENOMEM;
        memcpy(tmp, c->hold, c->hold_len);
        memcpy(tmp + c->hold_len, pt, n);
        mask_region(c, tmp, total);
        size_t keep = MIN(c->mask_max - 1, total);
        int r = 0;
        if (total > keep && SSL_write(c->tcl, tmp, (int) (total - keep)) <= 0)
                r = -EIO;
        memcpy(c->hold, tmp + total - keep, keep);
        c->hold_len = keep;
        explicit_bzero(tmp, total);
        free(tmp);
        return r;
}

static bool icpt_handshake(conn *c, SSL *ssl, bool *ready, const char **ret_err) {
        if (*ready)
                return true;
        ERR_clear_error();
        int k = SSL_do_handshake(ssl);
        if (k == 1) {
                *ready = true;
                return true;
        }
        int e = SSL_get_error(ssl, k);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                *ret_err = "handshake failed";
        return false;
}

static void icpt_pump(conn *c) {
        if (c->dead || !c->icpt || c->icpt_failed)
                return;
        const char *err = NULL;
        bool cl_ok = icpt_handshake(c, c->tcl, &c->tcl_ready, &err);
        if (err) {
                icpt_flush(c);
                c->icpt_failed = true;
                c->client_eof = true;
                c->error_reason = "TLS handshake with the sandbox failed";
                return;
        }
        const char *uerr = NULL;
        bool up_ok = icpt_handshake(c, c->tup, &c->tup_ready, &uerr);
        if (uerr) {
                long v = SSL_get_verify_result(c->tup);
                char d[200];
                snprintf(d, sizeof d, "%s: %s", c->host.text,
                         v != X509_V_OK ? X509_verify_cert_error_string(v) : "TLS handshake failed");
                c->tup_error = v != X509_V_OK ? "upstream certificate not trusted" : "upstream TLS failed";
                c->upstream_eof = true;
                if (cl_ok)
                        return icpt_answer(c, 502, c->tup_error, d);
                snprintf(c->error_detail, sizeof c->error_detail, "%s", d);
                icpt_flush(c);
                return; /* answered once the sandbox's handshake completes */
        }
        if (c->tup_error && cl_ok)
                return icpt_answer(c, 502, c->tup_error, c->error_detail);
        if (!cl_ok || !up_ok) {
                icpt_flush(c);
                return;
        }

        uint8_t pt[READ_CHUNK];
        /* sandbox -> upstream: the head, then one body */
        while (c->icpt_phase != ICPT_RESPONSE && BIO_ctrl_pending(c->tup_out) < BUF_SIZE) {
                int n = SSL_read(c->tcl, pt, sizeof pt);
                if (n <= 0) {
                        int e = SSL_get_error(c->tcl, n);
                        if (e != SSL_ERROR_WANT_READ)
                                c->client_eof = true;
                        break;
                }
                if (c->icpt_phase == ICPT_HEAD) {
                        size_t used = 0;
                        int k = proxyreq_feed(c->oreq, pt, (size_t) n, &used);
                        if (k < 0)
                                return icpt_answer(c, 400, "bad request inside the tunnel", c->oreq->why);
                        if (k == PROXYREQ_DONE) {
                                icpt_head_done(c, pt + used, (size_t) n - used);
                                if (c->icpt_failed)
                                        return;
                        }
                        continue;
                }
                icpt_body(c, pt, (size_t) n);
                if (c->icpt_failed)
                        return;
        }
        /* upstream -> sandbox: the response, verbatim */
        while (c->icpt_phase != ICPT_HEAD && !c->tup_eof && BIO_ctrl_pending(c->tcl_out) < BUF_SIZE) {
                int n = SSL_read(c->tup, pt, sizeof pt);
                if (n <= 0) {
                        int e = SSL_get_error(c->tup, n);
                        if (e != SSL_ERROR_WANT_READ) {
                                c->tup_eof = true;
                                c->tup_clean = e == SSL_ERROR_ZERO_RETURN;
                        }
                        break;
                }
                c->bytes_in += (uint64_t) n;
                if (icpt_respond(c, pt, (size_t) n) < 0) {
                        c->client_eof = true;
                        break;
                }
        }
        if (c->tup_eof && !c->icpt_failed) {
                if (c->hold_len && SSL_write(c->tcl, c->hold, (int) c->hold_len) > 0)
                        c->hold_len = 0;
                /* close_notify only for a whole response: an upstream that
                 * just dropped the connection must not look like one that
                 * finished (the sandbox sees the TCP close without it) */
                if (c->tup_clean)
                        (void) SSL_shutdown(c->tcl);
                else
                        c->error_reason = "the upstream closed without finishing TLS";
                c->icpt_failed = true; /* nothing more either way: close once flushed */
        }
        explicit_bzero(pt, sizeof pt);
        icpt_flush(c);
}

/* Socket bytes into the BIOs. */
static void icpt_read(conn *c, bool from_client) {
        int fd = from_client ? c->cl.fd : c->up.fd;
        BIO *in = from_client ? c->tcl_in : c->tup_in;
        uint8_t tmp[READ_CHUNK];
        size_t want = site_allowance(c->site, from_client ? 0 : 1, sizeof tmp);
        if (want == 0) {
                c->stalled[from_client ? 0 : 1] = true;
                c->site->proxy->throttled = true;
                timer_want(c->site->proxy, now_ms() + THROTTLE_MS);
                return;
        }
        ssize_t n = recv(fd, tmp, want, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n <= 0) {
                /* the socket ended: the SSL reads what its BIO still holds,
                 * then sees the end (tup_eof comes from SSL_read) */
                BIO_set_mem_eof_return(in, 0);
                if (from_client)
                        c->client_eof = true;
                else
                        c->upstream_eof = true;
                return;
        }
        site_spend(c->site, from_client ? 0 : 1, (size_t) n);
        (void) BIO_write(in, tmp, (int) n);
}

static void icpt_event(conn *c, ev *e, uint32_t revents) {
        if (e->kind == EV_CLIENT) {
                if (revents & EPOLLOUT)
                        conn_write_client(c);
                if ((revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) && !c->client_eof)
                        icpt_read(c, true);
        } else {
                if (revents & EPOLLOUT)
                        conn_write_upstream(c);
                if ((revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) && !c->upstream_eof)
                        icpt_read(c, false);
        }
        icpt_pump(c);
        if (c->dead)
                return;
        if (c->u2c.len)
                conn_write_client(c);
        if (c->c2u.len)
                conn_write_upstream(c);
        icpt_flush(c);
        /* The end: an answer or the response is out, or the sandbox left. */
        bool out_done = !c->u2c.len && BIO_ctrl_pending(c->tcl_out) == 0;
        if ((c->icpt_failed && out_done) || (c->client_eof && !c->icpt_failed)) {
                if (c->client_eof && !c->icpt_failed && !c->error_reason && c->icpt_phase != ICPT_RESPONSE)
                        c->error_reason = "the sandbox closed the tunnel";
                return conn_free(c, true);
        }
        /* interest: reads while not at an end, writes while ciphertext waits */
        egress_proxy *p = c->site->proxy;
        uint32_t cl = 0, up = 0;
        /* ciphertext waiting in a BIO is bounded like the buffers */
        if (!c->client_eof && !c->stalled[0] && BIO_ctrl_pending(c->tcl_in) < BUF_SIZE)
                cl |= EPOLLIN;
        if (c->u2c.len)
                cl |= EPOLLOUT;
        if (!c->upstream_eof && !c->stalled[1] && BIO_ctrl_pending(c->tup_in) < BUF_SIZE)
                up |= EPOLLIN;
        if (c->c2u.len)
                up |= EPOLLOUT;
        (void) ev_set(p, &c->cl, cl);
        (void) ev_set(p, &c->up, up);
}

/* --------------------------------------------------------------- events */

static void conn_event(conn *c, ev *e, uint32_t revents) {
        if (c->dead)
                return;
        switch (c->state) {
        case S_SNIFF:
        case S_HEAD:
        case S_SOCKS:
                if (e->kind == EV_CLIENT)
                        conn_read_head(c);
                return;
        case S_RESOLVE:
                if (e->kind == EV_DNS)
                        conn_dns_read(c);
                else if (e->kind == EV_DNS_TCP)
                        conn_dns_tcp_event(c);
                return;
        case S_CONNECTING:
                if (e->kind == EV_UPSTREAM)
                        conn_connected(c);
                else if (e->kind == EV_CLIENT && (revents & (EPOLLHUP | EPOLLERR))) {
                        c->error_reason = "the client went away";
                        conn_free(c, true);
                }
                return;
        case S_RELAY:
                break;
        }
        if (c->icpt)
                return icpt_event(c, e, revents);

        if (e->kind == EV_CLIENT) {
                if (revents & EPOLLOUT)
                        conn_write_client(c);
                if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
                        conn_read_client(c);
                if (c->peeking) {
                        conn_peek(c);
                        if (c->dead)
                                return;
                }
        } else {
                if (revents & EPOLLOUT)
                        conn_write_upstream(c);
                if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
                        conn_read_upstream(c);
        }
        /* Move what just arrived without waiting for another wake-up. */
        if (c->u2c.len)
                conn_write_client(c);
        if (!c->peeking && (c->c2u.len || c->uphead_off < c->uphead_len))
                conn_write_upstream(c);
        if (!c->peeking && !c->icpt && c->deadline_ms && !c->fwd)
                c->deadline_ms = 0;
        conn_maybe_finish(c);
}

/* Out of descriptors: a level-triggered listener would wake the loop
 * forever. Every listener rests for a moment; the timer wakes them. */
static void proxy_pause_accepts(egress_proxy *p) {
        int64_t now = now_ms();
        if (p->accept_paused_until > now)
                return;
        p->accept_paused_until = now + 100;
        for (egress_site *s = p->sites; s; s = s->next)
                (void) ev_set(p, &s->listen, 0);
        log_warning("egress: out of file descriptors; accepting again in 100 ms (%u connections open)", p->n_conns);
        timer_want(p, p->accept_paused_until);
}

static void site_accept(egress_site *s) {
        egress_proxy *p = s->proxy;
        unsigned max = p->cfg.max_connections ? p->cfg.max_connections : 256;
        for (int i = 0; i < ACCEPTS_PER_WAKE; i++) {
                int fd = accept4(s->listen.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                                proxy_pause_accepts(p);
                        return;
                }
                unsigned total = p->cfg.max_total_connections ? p->cfg.max_total_connections : 8192;
                if (s->n_conns >= max || p->n_conns >= total) {
                        s->refused_full++;
                        int64_t now = now_ms();
                        if (now - s->refused_full_logged_ms > 60000) {
                                log_info("egress: sandbox %s: at its limit of %u connections; refusing (%llu so far)",
                                         s->sandbox_id, max, (unsigned long long) s->refused_full);
                                s->refused_full_logged_ms = now;
                        }
                        close(fd);
                        continue;
                }
                /* relayed bytes go out as they come: Nagle would hold a
                 * TLS flight behind the sandbox's delayed ACK */
                int one = 1;
                (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                conn *c = calloc(1, sizeof *c);
                if (!c || buf_alloc(&c->c2u) < 0) {
                        free(c);
                        close(fd);
                        return;
                }
                c->site = s;
                c->cl = (ev){ .kind = EV_CLIENT, .obj = c, .fd = fd };
                c->up = (ev){ .kind = EV_UPSTREAM, .obj = c, .fd = -1 };
                c->dns = (ev){ .kind = EV_DNS, .obj = c, .fd = -1 };
                c->dns_tcp = (ev){ .kind = EV_DNS_TCP, .obj = c, .fd = -1 };
                c->tcp_q = -1;
                c->state = S_SNIFF;
                c->started_ms = now_ms();
                c->started_real_ms = real_ms();
                c->deadline_ms = c->started_ms + HEAD_TIMEOUT_MS;
                c->next = s->conns;
                if (s->conns)
                        s->conns->prev = c;
                s->conns = c;
                s->n_conns++;
                p->n_conns++;
                timer_want(p, c->deadline_ms);
                conn_arm(c);
        }
}

static void proxy_timers(egress_proxy *p) {
        uint64_t ticks;
        (void) read(p->timer.fd, &ticks, sizeof ticks);
        p->timer_armed_ms = 0;
        int64_t now = now_ms(), next = 0;
        bool throttled = p->throttled;
        p->throttled = false;

        if (p->accept_paused_until && p->accept_paused_until <= now) {
                p->accept_paused_until = 0;
                for (egress_site *s = p->sites; s; s = s->next)
                        (void) ev_set(p, &s->listen, EPOLLIN);
        } else if (p->accept_paused_until)
                next = p->accept_paused_until;
        for (egress_site *s = p->sites; s; s = s->next) {
                if (throttled)
                        site_refill(s, now);
                conn *c = s->conns;
                while (c) {
                        conn *nx = c->next;
                        if (c->stalled[0] || c->stalled[1]) {
                                c->stalled[0] = c->stalled[1] = false;
                                conn_arm(c);
                        }
                        if (c->deadline_ms && c->deadline_ms <= now) {
                                switch (c->state) {
                                case S_SNIFF:
                                case S_HEAD:
                                case S_SOCKS:
                                        conn_refuse(c, c->state == S_SOCKS ? 0 : 400, 0,
                                                    "timed out waiting for the request", NULL);
                                        break;
                                case S_RESOLVE:
                                        conn_dns_timeout(c);
                                        break;
                                case S_CONNECTING:
                                        c->last_connect_errno = ETIMEDOUT;
                                        conn_try_next_address(c);
                                        break;
                                case S_RELAY:
                                        c->deadline_ms = 0;
                                        if (c->icpt) {
                                                c->error_reason = "timed out inside the intercepted tunnel";
                                                conn_free(c, true);
                                        } else if (c->peeking)
                                                conn_refuse(c, 0, 0, "timed out waiting for the tunnel's first bytes",
                                                            NULL);
                                        break;
                                }
                        }
                        c = nx;
                }
                for (conn *x = s->conns; x; x = x->next)
                        if (x->deadline_ms && (!next || x->deadline_ms < next))
                                next = x->deadline_ms;
        }
        if (p->throttled && (!next || now + THROTTLE_MS < next))
                next = now + THROTTLE_MS;
        if (next)
                timer_want(p, next);
}

void egress_proxy_dispatch(egress_proxy *p) {
        struct epoll_event evs[64];
        p->dispatching = true;
        int n = epoll_wait(p->epfd, evs, ELEMENTSOF(evs), 0);
        for (int i = 0; i < n; i++) {
                ev *e = evs[i].data.ptr;
                if (!e || e->fd < 0)
                        continue; /* closed earlier in this round */
                switch (e->kind) {
                case EV_TIMER:
                        proxy_timers(p);
                        break;
                case EV_LISTEN:
                        site_accept(e->obj);
                        break;
                default:
                        conn_event(e->obj, e, evs[i].events);
                        break;
                }
        }
        p->dispatching = false;
        proxy_bury(p);
}

/* ----------------------------------------------------------- lifecycle */

int egress_proxy_new(const egress_proxy_config *cfg, egress_proxy **ret) {
        egress_proxy *p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        p->cfg = *cfg;
        p->epfd = -1;
        p->self_netns = -1;
        p->timer.fd = -1;
        int r;
        p->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (p->epfd < 0)
                goto fail;
        p->self_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        if (p->self_netns < 0)
                goto fail;
        int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (tfd < 0)
                goto fail;
        p->timer = (ev){ .kind = EV_TIMER, .obj = p, .fd = tfd };
        if ((r = ev_set(p, &p->timer, EPOLLIN)) < 0) {
                errno = -r;
                goto fail;
        }
        *ret = p;
        return 0;
fail:
        r = -errno;
        egress_proxy_free(p);
        return r;
}

egress_proxy *egress_proxy_free(egress_proxy *p) {
        if (!p)
                return NULL;
        while (p->sites)
                egress_site_close(p->sites);
        proxy_bury(p);
        ev_close(p, &p->timer);
        if (p->self_netns >= 0)
                close(p->self_netns);
        if (p->epfd >= 0)
                close(p->epfd);
        free(p);
        return NULL;
}

int egress_proxy_fd(const egress_proxy *p) {
        return p->epfd;
}

int egress_site_open(egress_proxy *p, const char *sandbox_id, int netns_fd, uint16_t port,
                     egress_policy *policy, egress_site **ret) {
        int r, fd = -1;
        if (setns(netns_fd, CLONE_NEWNET) < 0) {
                r = -errno;
                egress_policy_free(policy);
                return r;
        }
        fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        r = fd < 0 ? -errno : 0;
        if (r == 0) {
                int one = 1;
                (void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
                struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port),
                                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
                if (bind(fd, (struct sockaddr *) &sin, sizeof sin) < 0 || listen(fd, 128) < 0)
                        r = -errno;
        }
        /* Back to our own netns before anything else: every other socket
         * must be made there. If this fails the process is unusable. */
        if (setns(p->self_netns, CLONE_NEWNET) < 0) {
                log_error_errno(-errno, "egress: cannot return to the daemon's netns: %m");
                abort();
        }
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                egress_policy_free(policy);
                return r;
        }
        egress_site *s = calloc(1, sizeof *s);
        if (!s) {
                close(fd);
                egress_policy_free(policy);
                return -ENOMEM;
        }
        s->proxy = p;
        snprintf(s->sandbox_id, sizeof s->sandbox_id, "%s", sandbox_id);
        s->policy = policy;
        s->listen = (ev){ .kind = EV_LISTEN, .obj = s, .fd = fd };
        s->tok_ms = s->rec_ms = now_ms();
        s->tok[0] = s->tok[1] = (int64_t) MAX(p->cfg.bandwidth_bytes / 4, (uint64_t) READ_CHUNK);
        s->rec_tokens = (p->cfg.records_per_second ? p->cfg.records_per_second : 50) * 10.0;
        if ((r = ev_set(p, &s->listen, EPOLLIN)) < 0) {
                close(fd);
                egress_policy_free(policy);
                free(s);
                return r;
        }
        s->next = p->sites;
        if (p->sites)
                p->sites->prev = s;
        p->sites = s;
        *ret = s;
        return 0;
}

void egress_site_set_inject(egress_site *s, egress_inject *x) {
        egress_inject_free(s->inject);
        s->inject = x;
}

const egress_policy *egress_site_policy(const egress_site *s) {
        return s->policy;
}

unsigned egress_site_connections(const egress_site *s) {
        return s->n_conns;
}

static void bury_now(egress_proxy *p) {
        /* outside a dispatch round nothing can name a closed connection:
         * free it (with the secret values it holds) at once */
        if (!p->dispatching)
                proxy_bury(p);
}

int egress_site_set_policy(egress_site *s, egress_policy *policy) {
        egress_policy_free(s->policy);
        s->policy = policy;
        int closed = 0;
        conn *c = s->conns;
        while (c) {
                conn *nx = c->next;
                if (c->decided && (c->state == S_CONNECTING || c->state == S_RELAY)) {
                        egress_decision d;
                        bool deny = egress_decide(policy, &c->host, c->port, &d) < 0 || d.verdict != EGRESS_ALLOW;
                        if (!deny && c->sa_len)
                                deny = egress_decide_address(policy, &c->host, (struct sockaddr *) &c->sa, c->sa_len,
                                                             c->port, &d) < 0 ||
                                       d.verdict != EGRESS_ALLOW;
                        if (deny) {
                                c->decision = d;
                                c->decision.verdict = EGRESS_DENY;
                                c->refused_after_allow = true;
                                c->error_reason = "closed: the policy changed";
                                snprintf(c->error_detail, sizeof c->error_detail, "%s%s%s",
                                         egress_reason_to_string(d.reason), d.rule[0] ? " " : "", d.rule);
                                conn_free(c, true);
                                closed++;
                        }
                }
                c = nx;
        }
        bury_now(s->proxy);
        return closed;
}

void egress_site_close(egress_site *s) {
        if (!s)
                return;
        egress_proxy *p = s->proxy;
        while (s->conns) {
                conn *c = s->conns;
                if (!c->error_reason && c->state != S_RELAY)
                        c->error_reason = "the sandbox ended";
                conn_free(c, true);
        }
        ev_close(p, &s->listen);
        egress_policy_free(s->policy);
        egress_inject_free(s->inject);
        bury_now(p);
        if (s->prev)
                s->prev->next = s->next;
        else
                p->sites = s->next;
        if (s->next)
                s->next->prev = s->prev;
        free(s);
}

/* ------------------------------------------------------- set-up helpers */

int egress_ceiling_add_list(egress_ceiling *c, const char *list,
                            int (*add)(egress_ceiling *, const char *, char *, size_t), char *why, size_t whylen) {
        char *copy = strdup(list), *save = NULL;
        if (!copy)
                return -ENOMEM;
        int r = 0;
        for (char *tok = strtok_r(copy, ",", &save); tok && r >= 0; tok = strtok_r(NULL, ",", &save)) {
                while (*tok == ' ')
                        tok++;
                size_t l = strlen(tok);
                while (l && tok[l - 1] == ' ')
                        tok[--l] = 0;
                if (*tok)
                        r = add(c, tok, why, whylen);
        }
        free(copy);
        return r;
}

int egress_ceiling_add_host_addresses(egress_ceiling *c) {
        struct ifaddrs *ifa = NULL;
        if (getifaddrs(&ifa) < 0)
                return -errno;
        int n = 0;
        for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
                if (!i->ifa_addr)
                        continue;
                socklen_t len = i->ifa_addr->sa_family == AF_INET    ? sizeof(struct sockaddr_in)
                                : i->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                     : 0;
                if (!len)
                        continue;
                struct sockaddr_storage ss;
                memcpy(&ss, i->ifa_addr, len);
                if (ss.ss_family == AF_INET6)
                        ((struct sockaddr_in6 *) &ss)->sin6_scope_id = 0; /* link-local: the address itself */
                if (egress_ceiling_add_host_address(c, (struct sockaddr *) &ss, len) >= 0)
                        n++;
        }
        freeifaddrs(ifa);
        return n;
}

int egress_nameservers(const char *list, egress_addr *ret, size_t max, char *why, size_t whylen) {
        size_t n = 0;
        if (list && *list) {
                char *copy = strdup(list), *save = NULL;
                if (!copy)
                        return -ENOMEM;
                int r = 0;
                for (char *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
                        egress_host h;
                        if (egress_host_parse(tok, &h) < 0 || h.kind == EGRESS_HOST_NAME) {
                                snprintf(why, whylen, "nameserver '%.64s' is not an IP address", tok);
                                r = -EINVAL;
                                break;
                        }
                        if (n == max) {
                                snprintf(why, whylen, "at most %zu nameservers", max);
                                r = -E2BIG;
                                break;
                        }
                        ret[n++] = h.addr;
                }
                free(copy);
                return r < 0 ? r : (int) n;
        }
        char text[16384];
        int fd = open("/etc/resolv.conf", O_RDONLY | O_CLOEXEC);
        ssize_t k = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
        if (fd >= 0)
                close(fd);
        if (k <= 0)
                return 0;
        int m = dns_parse_resolv_conf(text, (size_t) k, ret, max);
        return m > 0 ? m : 0;
}

int egress_proxy_env(uint16_t port, char ret[8][64]) {
        static const char *const names[8] = { "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
                                              "ALL_PROXY",  "all_proxy",  "NO_PROXY",    "no_proxy" };
        for (int i = 0; i < 8; i++) {
                if (i < 4)
                        snprintf(ret[i], 64, "%s=http://127.0.0.1:%u", names[i], port);
                else if (i < 6)
                        snprintf(ret[i], 64, "%s=socks5h://127.0.0.1:%u", names[i], port);
                else
                        snprintf(ret[i], 64, "%s=localhost,127.0.0.1,::1,0.0.0.0", names[i]);
        }
        return 8;
}
