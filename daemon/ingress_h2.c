/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HTTP/2 (h2c with prior knowledge) to sandbox ports; see ingress_h2.h.
 *
 * A connection goes through these states:
 *   SNIFF    accepted, nothing decided: its first bytes are peeked (never
 *            read) until they are or cannot be the preface; not the
 *            preface: handed to libmicrohttpd, bytes untouched.
 *   HEAD     the preface and the frames up to the first request's header
 *            block (SETTINGS, WINDOW_UPDATE, PRIORITY, PING) are read and
 *            kept; the block is decoded, the port named, access checked.
 *   CONNECT  ns: the upstream socket, made in the sandbox's netns,
 *            connects. gvisor has no such state: the upstream is a
 *            connector spawned in the sandbox (hutch-init --ingress-connect,
 *            as HTTP/1.1 ingress uses), whose stdin and stdout are two
 *            pipes, and the relay begins at once; a connector that exits
 *            before the sandbox's server sent a byte found the port closed.
 *   RELAY    everything kept goes to the upstream intact, then both ways:
 *            the client's frames are parsed (DATA and the rest stream
 *            through, header blocks are held until whole and decoded so
 *            that the HPACK table stays in step), the upstream's only
 *            delimited, so that a GOAWAY of ours lands between frames.
 *   DRAIN    an answer or GOAWAY of ours is written; then the write side
 *            is shut and the client's bytes read and dropped until it
 *            closes (closing with unread bytes would send a RST, which can
 *            destroy the answer before the client reads it), at most 2 s.
 *
 * Every later request on the connection must name the same sandbox port
 * (by :authority or the e2b-sandbox-* fields) and carry the traffic token
 * when one is needed; one that does not ends the connection with GOAWAY
 * before its frames reach the sandbox. HTTP/2 lets a client reuse a
 * connection for another authority that resolves to the same address
 * (RFC 9113 §9.1.1); relaying that request to the port the connection was
 * authorised for would answer it from the wrong server, and re-routing
 * streams would mean one upstream per stream: refused instead.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/ingress.h"
#include "daemon/ingress_h2.h"
#include "daemon/ingress_http.h"
#include "daemon/route.h"
#include "net/hpack.h"
#include "util/fdutil.h"
#include "util/log.h"

#define PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define PREFACE_LEN 24
#define FRAME_HDR 9
#define FRAME_MAX_FIRST 16384  /* SETTINGS_MAX_FRAME_SIZE until the server raises it */
#define HEADER_FRAME_MAX 65536 /* a HEADERS or CONTINUATION frame */
#define BLOCK_MAX 65536        /* a header block, its CONTINUATIONs joined */
#define BLOCK_FRAMES_MAX 32    /* CONTINUATIONs of one block (floods) */
#define LIST_MAX 65536         /* decoded header list (RFC 9113 §6.5.2 measure) */
#define TABLE_LIMIT 65536      /* the largest HPACK table a client may ask for */
#define HEAD_FRAMES_MAX 64     /* frames before the first HEADERS */
#define BUF_CAP (256 * 1024)   /* per direction */
#define DRAIN_MS 2000

enum {
        F_DATA,
        F_HEADERS,
        F_PRIORITY,
        F_RST,
        F_SETTINGS,
        F_PUSH,
        F_PING,
        F_GOAWAY,
        F_WINDOW,
        F_CONT
};
enum { FL_END_STREAM = 0x1, FL_END_HEADERS = 0x4, FL_PADDED = 0x8, FL_PRIORITY = 0x20 };
enum { E_NO_ERROR = 0, E_PROTOCOL = 1, E_FRAME_SIZE = 6, E_CALM = 0xb };
enum { S_SNIFF = 1, S_HEAD, S_CONNECT, S_RELAY, S_DRAIN };

typedef struct hbuf {
        uint8_t *p;
        size_t off, len, cap;
} hbuf;

typedef struct h2conn {
        server *srv;
        int state;
        watcher cw, uw; /* client, upstream (gvisor: the connector's stdout, read) */
        watcher ww;     /* gvisor: the connector's stdin, written; fd -1 on ns */
        struct sockaddr_storage addr;
        socklen_t addrlen;
        int64_t deadline_ms; /* SNIFF, HEAD, DRAIN */
        char sbx_id[HUTCH_ID_LEN + 1];
        unsigned port;
        uint32_t first_stream; /* the first request's: a closed port is answered on it */
        bool browser;          /* its user-agent: a closed port is answered in HTML */
        bool u_got;            /* a byte came from the upstream */
        hpack_decoder hp;
        hbuf craw;            /* client bytes read, not yet parsed */
        hbuf to_up;           /* checked client bytes for the upstream */
        hbuf to_cl;           /* for the client */
        hbuf hraw;            /* a header block's frames, raw, until END_HEADERS */
        hbuf hblock;          /* its fragments, joined */
        uint32_t hstream;     /* the stream of the block being collected */
        unsigned hframes;     /* its frames */
        uint64_t c_left;      /* payload bytes of the client's current frame to pass */
        size_t head_parsed;   /* HEAD, CONNECT: bytes at craw's front parsed and kept */
        uint32_t last_stream; /* the highest client stream seen */
        unsigned head_frames;
        /* the upstream's frames, delimited: where the last whole one ends
         * in to_cl's count of bytes ever appended */
        uint8_t s_hdr[FRAME_HDR];
        unsigned s_have;
        uint64_t s_left, to_cl_total, to_cl_boundary, to_cl_sent;
        bool split; /* gvisor: uw and ww are the connector's two pipes */
        /* maskRequestHost: every header block goes to the upstream
         * re-encoded (literals without indexing, so the server's HPACK
         * table stays empty and in step), :authority and host replaced */
        bool mask;
        char mask_host[300];
        uint8_t hflags;         /* the block's HEADERS flags (END_STREAM) */
        size_t first_block_at;  /* HEAD: where the first block's frames begin in craw */
        hbuf fields;            /* the block's fields re-encoded, :authority and host left out */
        hbuf first_block;       /* the first block's frames, masked, for relay_begin */
        bool c_eof, u_eof, closed;
        struct h2conn *next, *prev, *next_zombie;
} h2conn;

static h2conn *conns, *zombies;
static unsigned n_conns;
static watcher listen_w = { .fd = -1 };

/* ------------------------------------------------------------ buffers */

static size_t hb_pending(const hbuf *b) {
        return b->len - b->off;
}

static int hb_reserve(hbuf *b, size_t more) {
        if (b->off == b->len)
                b->off = b->len = 0;
        if (b->len + more <= b->cap)
                return 0;
        if (b->off) {
                memmove(b->p, b->p + b->off, b->len - b->off);
                b->len -= b->off;
                b->off = 0;
                if (b->len + more <= b->cap)
                        return 0;
        }
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + more)
                cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
                return -ENOMEM;
        b->p = p;
        b->cap = cap;
        return 0;
}

static int hb_append(hbuf *b, const void *p, size_t n) {
        if (n == 0)
                return 0; /* an empty frame's payload may be NULL */
        int r = hb_reserve(b, n);
        if (r < 0)
                return r;
        memcpy(b->p + b->len, p, n);
        b->len += n;
        return 0;
}

/* A literal field without indexing (RFC 7541 §6.2.2), appended to b. */
static int hb_put_field(hbuf *b, const char *n, size_t nl, const char *v, size_t vl) {
        /* besides name and value: a byte, and two lengths of at most 10 */
        if (hb_reserve(b, nl + vl + 24) < 0)
                return -ENOMEM;
        ssize_t k = hpack_put_field(b->p + b->len, b->cap - b->len, n, nl, v, vl);
        if (k < 0)
                return -ENOMEM;
        b->len += (size_t) k;
        return 0;
}

static void hb_free(hbuf *b) {
        free(b->p);
        *b = (hbuf) { 0 };
}

/* ------------------------------------------------------------ lifecycle */

static void h2_close(h2conn *h) {
        if (h->closed)
                return;
        h->closed = true;
        watcher *ws[3] = { &h->cw, &h->uw, &h->ww };
        for (int i = 0; i < 3; i++)
                if (ws[i]->fd >= 0) {
                        int fd = ws[i]->fd;
                        loop_del(h->srv, ws[i]);
                        close(fd);
                        ws[i]->fd = -1;
                }
        h->cw.cb = h->uw.cb = h->ww.cb = NULL;
        if (h->prev)
                h->prev->next = h->next;
        else if (conns == h)
                conns = h->next;
        if (h->next)
                h->next->prev = h->prev;
        n_conns--;
        /* an event of it may still be in this batch of the loop */
        h->next_zombie = zombies;
        zombies = h;
}

void ingress_h2_reap(void) {
        while (zombies) {
                h2conn *h = zombies;
                zombies = h->next_zombie;
                hpack_decoder_done(&h->hp);
                hb_free(&h->craw);
                hb_free(&h->to_up);
                hb_free(&h->to_cl);
                hb_free(&h->hraw);
                hb_free(&h->hblock);
                hb_free(&h->fields);
                hb_free(&h->first_block);
                free(h);
        }
}

static void h2_update(h2conn *h);

/* ------------------------------------------------------------ frames out */

static void put_frame_hdr(uint8_t *o, size_t len, uint8_t type, uint8_t flags, uint32_t sid) {
        o[0] = (uint8_t) (len >> 16);
        o[1] = (uint8_t) (len >> 8);
        o[2] = (uint8_t) len;
        o[3] = type;
        o[4] = flags;
        o[5] = (uint8_t) (sid >> 24 & 0x7f);
        o[6] = (uint8_t) (sid >> 16);
        o[7] = (uint8_t) (sid >> 8);
        o[8] = (uint8_t) sid;
}

static void queue_frame(h2conn *h, uint8_t type, uint8_t flags, uint32_t sid, const void *p,
                        size_t n) {
        uint8_t hdr[FRAME_HDR];
        put_frame_hdr(hdr, n, type, flags, sid);
        (void) hb_append(&h->to_cl, hdr, sizeof hdr);
        (void) hb_append(&h->to_cl, p, n);
        h->to_cl_total += sizeof hdr + n;
}

static void queue_goaway(h2conn *h, uint32_t last, uint32_t code, const char *debug) {
        uint8_t p[8 + 128];
        size_t dl = strlen(debug);
        if (dl > 128)
                dl = 128;
        for (int i = 0; i < 4; i++) {
                p[i] = (uint8_t) (last >> (24 - 8 * i));
                p[4 + i] = (uint8_t) (code >> (24 - 8 * i));
        }
        memcpy(p + 8, debug, dl);
        queue_frame(h, F_GOAWAY, 0, 0, p, 8 + dl);
}

static void watcher_close(h2conn *h, watcher *w) {
        if (w->fd < 0)
                return;
        int fd = w->fd;
        loop_del(h->srv, w);
        close(fd);
        w->fd = -1;
}

static void start_drain(h2conn *h) {
        h->state = S_DRAIN;
        h->deadline_ms = wall_ms() + DRAIN_MS;
        watcher_close(h, &h->uw);
        watcher_close(h, &h->ww);
        h2_update(h);
}

/* No stream to answer on (or after the relay began): GOAWAY, then close.
 * Before the relay the server preface (an empty SETTINGS) comes first, as
 * RFC 9113 §3.4 wants of every server. */
static void h2_goaway(h2conn *h, uint32_t code, const char *why) {
        log_debug("ingress h2: GOAWAY %u: %s", code, why);
        if (h->state == S_DRAIN)
                return;
        if (h->state == S_RELAY) {
                /* drop the upstream's partial frame not yet sent; if part of
                 * it already went, no frame of ours can follow: just close */
                uint64_t partial = h->to_cl_total - h->to_cl_boundary;
                if (h->to_cl_sent > h->to_cl_boundary) {
                        h2_close(h);
                        return;
                }
                h->to_cl.len -= partial;
                h->to_cl_total = h->to_cl_boundary;
        } else
                queue_frame(h, F_SETTINGS, 0, 0, NULL, 0);
        queue_goaway(h, h->last_stream, code, why);
        start_drain(h);
}

/* An answer of the daemon's own to the first request (stream sid): the
 * same status and body as HTTP/1.1 gets, then GOAWAY. */
static void h2_answer(h2conn *h, uint32_t sid, unsigned status, const char *ctype, const char *body) {
        uint8_t block[512];
        size_t bl = 0, n = strlen(body);
        char st[8], cl[24];
        snprintf(st, sizeof st, "%u", status);
        snprintf(cl, sizeof cl, "%zu", n);
        ssize_t k = hpack_put_literal(block, sizeof block, ":status", st, strlen(st));
        bl += (size_t) k;
        k = hpack_put_literal(block + bl, sizeof block - bl, "content-type", ctype, strlen(ctype));
        bl += (size_t) k;
        k = hpack_put_literal(block + bl, sizeof block - bl, "content-length", cl, strlen(cl));
        bl += (size_t) k;
        queue_frame(h, F_SETTINGS, 0, 0, NULL, 0);
        queue_frame(h, F_HEADERS, FL_END_HEADERS | (n ? 0 : FL_END_STREAM), sid, block, bl);
        if (n)
                queue_frame(h, F_DATA, FL_END_STREAM, sid, body, n);
        queue_goaway(h, sid, E_NO_ERROR, "");
        start_drain(h);
}

static void h2_answer_json(h2conn *h, uint32_t sid, unsigned status, json_t *j) {
        char *s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        h2_answer(h, sid, status, "application/json", s ? s : "{}");
        free(s);
}

/* ------------------------------------------------------------ requests */

typedef struct req_fields {
        char authority[256], host[256], sid[HUTCH_ID_LEN + 8], sport[16], token[96], ua[16];
        bool has_authority, has_host, has_sid, has_sport, has_token, bad;
        hbuf *enc; /* when set: every field but :authority and host, re-encoded */
} req_fields;

static void copy_field(char *dst, size_t cap, bool *has, bool *bad, const char *v, size_t vl) {
        if (*has || vl >= cap || memchr(v, 0, vl)) {
                *bad = true; /* repeated, too long, or a NUL: refused */
                return;
        }
        memcpy(dst, v, vl);
        dst[vl] = 0;
        *has = true;
}

static bool name_is(const char *n, size_t nl, const char *want) {
        return nl == strlen(want) && memcmp(n, want, nl) == 0;
}

static int on_field(void *ud, const char *n, size_t nl, const char *v, size_t vl) {
        req_fields *f = ud;
        /* RFC 9113 §8.2.1: names are lowercase on the wire; an uppercase
         * e2b-sandbox-id must not slip past the comparison below */
        for (size_t i = 0; i < nl; i++)
                if (n[i] >= 'A' && n[i] <= 'Z')
                        f->bad = true;
        if (name_is(n, nl, ":authority"))
                copy_field(f->authority, sizeof f->authority, &f->has_authority, &f->bad, v, vl);
        else if (name_is(n, nl, "host"))
                copy_field(f->host, sizeof f->host, &f->has_host, &f->bad, v, vl);
        else if (name_is(n, nl, "e2b-sandbox-id"))
                copy_field(f->sid, sizeof f->sid, &f->has_sid, &f->bad, v, vl);
        else if (name_is(n, nl, "e2b-sandbox-port"))
                copy_field(f->sport, sizeof f->sport, &f->has_sport, &f->bad, v, vl);
        else if (name_is(n, nl, "e2b-traffic-access-token"))
                copy_field(f->token, sizeof f->token, &f->has_token, &f->bad, v, vl);
        else if (name_is(n, nl, "user-agent") && vl >= 8 && !f->ua[0])
                memcpy(f->ua, v, 8);
        if (f->enc && !name_is(n, nl, ":authority") && !name_is(n, nl, "host"))
                return hb_put_field(f->enc, n, nl, v, vl);
        return 0;
}

/* The block whose fields are in h->fields, for the upstream: :authority
 * (when the client sent one) first, as a pseudo-field must be, host last,
 * both maskRequestHost; as HEADERS and CONTINUATION frames of at most the
 * size every HTTP/2 server takes (16384), END_STREAM as the client set it. */
static int masked_block(h2conn *h, const req_fields *f, uint32_t sid, hbuf *out) {
        size_t ml = strlen(h->mask_host);
        hbuf b = { 0 };
        int r = f->has_authority
                ? hb_put_field(&b, ":authority", strlen(":authority"), h->mask_host, ml)
                : 0;
        if (r >= 0)
                r = hb_append(&b, h->fields.p + h->fields.off, hb_pending(&h->fields));
        if (r >= 0 && f->has_host)
                r = hb_put_field(&b, "host", strlen("host"), h->mask_host, ml);
        size_t off = 0, n = hb_pending(&b);
        while (r >= 0) {
                size_t len = n - off < FRAME_MAX_FIRST ? n - off : FRAME_MAX_FIRST;
                uint8_t hdr[FRAME_HDR];
                uint8_t flags = off + len == n ? FL_END_HEADERS : 0;
                if (off == 0)
                        flags |= h->hflags & FL_END_STREAM;
                put_frame_hdr(hdr, len, off == 0 ? F_HEADERS : F_CONT, flags, sid);
                r = hb_append(out, hdr, sizeof hdr);
                if (r >= 0)
                        r = hb_append(out, b.p + b.off + off, len);
                off += len;
                if (off == n)
                        break;
        }
        hb_free(&b);
        return r < 0 ? -ENOMEM : 0;
}

/* The port a request names, as api_begin reads an HTTP/1.1 one: the
 * e2b-sandbox-* fields, else :authority (or host) "<port>-<id>.<domain>".
 * 0, or -EINVAL when it names none, -EBADMSG for a bad port value. */
static int route_of(server *srv, const req_fields *f, char id[HUTCH_ID_LEN + 1], unsigned *ret_port) {
        if (f->has_sport) {
                if (ingress_port_parse(f->sport, ret_port) < 0)
                        return -EBADMSG;
                if (!f->has_sid || strlen(f->sid) > HUTCH_ID_LEN)
                        return -EINVAL;
                memcpy(id, f->sid, strlen(f->sid) + 1);
                return 0;
        }
        const char *host = f->has_authority ? f->authority : f->has_host ? f->host : NULL;
        if (host && ingress_host_parse(host, srv->cfg.sandbox_domain, ret_port, id) == 0)
                return 0;
        return -EINVAL;
}

/* Strip a HEADERS frame's padding and priority: the block fragment. */
static int headers_fragment(const uint8_t *p, size_t n, uint8_t flags, const uint8_t **ret,
                            size_t *ret_len) {
        size_t pad = 0, off = 0;
        if (flags & FL_PADDED) {
                if (n < 1)
                        return -EBADMSG;
                pad = p[0];
                off = 1;
        }
        if (flags & FL_PRIORITY)
                off += 5;
        if (off + pad > n)
                return -EBADMSG;
        *ret = p + off;
        *ret_len = n - off - pad;
        return 0;
}

static uint32_t frame_len(const uint8_t *p) {
        return (uint32_t) p[0] << 16 | (uint32_t) p[1] << 8 | p[2];
}

static uint32_t frame_sid(const uint8_t *p) {
        return ((uint32_t) p[5] << 24 | (uint32_t) p[6] << 16 | (uint32_t) p[7] << 8 | p[8]) &
                0x7fffffffu;
}

static void on_up(server *srv, watcher *w, uint32_t revents);
static void parse_client(h2conn *h);

/* The port named by the connection's first request refused the connection
 * (or, on gvisor, the connector found it closed): as HTTP/1.1 answers it. */
static void answer_closed_port(h2conn *h, uint32_t sid) {
        if (h->browser) {
                char html[1024];
                snprintf(html, sizeof html,
                         "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Closed Port "
                         "Error</title></head><body><h1>Closed Port Error</h1><p>The sandbox %s is "
                         "running but there is no service running on port %u.</p></body></html>",
                         h->sbx_id, h->port);
                h2_answer(h, sid, 502, "text/html; charset=utf-8", html);
                return;
        }
        h2_answer_json(h, sid, 502,
                       json_pack("{s:s, s:s, s:i, s:i}", "sandboxId", h->sbx_id, "message",
                                 "The sandbox is running but port is not open", "port",
                                 (int) h->port, "code", 502));
}

/* The upstream is there (connected, or a connector spawned): everything
 * read so far, preface first, goes intact, then the relay. */
static void relay_begin(h2conn *h) {
        h->state = S_RELAY;
        h->deadline_ms = 0;
        h->hraw.len = h->hraw.off = 0;
        /* masked: the first block's frames are replaced by first_block */
        size_t intact = h->mask ? h->first_block_at : h->head_parsed;
        if (hb_append(&h->to_up, h->craw.p + h->craw.off, intact) < 0 ||
            (h->mask && hb_append(&h->to_up, h->first_block.p, h->first_block.len) < 0)) {
                h2_close(h);
                return;
        }
        hb_free(&h->first_block);
        h->craw.off += h->head_parsed;
        h->head_parsed = 0;
        parse_client(h); /* what came after the first block */
}

/* gvisor: the sandbox's loopback is inside the sentry; a connector spawned
 * there (the one HTTP/1.1 ingress uses, never a pooled one: those carry an
 * HTTP/1.1 connection) joins its stdin and stdout to the port. */
static void gvisor_upstream(h2conn *h, sbx *sb, uint32_t sid) {
        int fd, wfd;
        int r = ingress_connector(h->srv, sb, h->port, &fd, &wfd);
        if (r == -ECONNREFUSED) {
                answer_closed_port(h, sid);
                return;
        }
        if (r == -EUSERS) {
                h2_answer_json(h, sid, 503,
                               json_pack("{s:s, s:s, s:i}", "sandboxId", sb->id, "message",
                                         "too many open connections to this sandbox's ports",
                                         "code", 503));
                return;
        }
        if (r < 0) {
                h2_answer_json(h, sid, 502,
                               json_pack("{s:s, s:s, s:i}", "sandboxId", sb->id, "message",
                                         "The sandbox was not found", "code", 502));
                return;
        }
        h->split = true;
        h->uw.cb = h->ww.cb = on_up;
        h->uw.data = h->ww.data = h;
        if (loop_add(h->srv, &h->uw, fd, EPOLLIN | EPOLLRDHUP) < 0) {
                h->uw.fd = -1;
                close(fd);
                close(wfd);
                h2_close(h);
                return;
        }
        if (loop_add(h->srv, &h->ww, wfd, EPOLLOUT) < 0) {
                h->ww.fd = -1;
                close(wfd);
                h2_close(h);
                return;
        }
        relay_begin(h);
        h2_update(h);
}

/* The first request's block is decoded: route it, check it, connect. */
static void first_request(h2conn *h, uint32_t sid, const req_fields *f) {
        server *srv = h->srv;
        char id[HUTCH_ID_LEN + 1];
        unsigned port;
        int r = route_of(srv, f, id, &port);
        if (f->bad || r == -EBADMSG) {
                h2_answer_json(h, sid, 400,
                               json_pack("{s:s, s:i}", "message",
                                         f->bad ? "malformed request fields"
                                                : "e2b-sandbox-port must be a port number, 1 to 65535",
                                         "code", 400));
                return;
        }
        if (r < 0) {
                h2_answer_json(h, sid, 400,
                               json_pack("{s:s, s:i}", "message",
                                         "HTTP/2 is served for sandbox ports only: name one by "
                                         ":authority <port>-<id>.<domain> or e2b-sandbox-id and "
                                         "e2b-sandbox-port",
                                         "code", 400));
                return;
        }
        sbx *sb = route_sandbox_id_valid(id) ? sbx_find(srv, id) : NULL;
        json_t *not_found = json_pack("{s:s, s:s, s:i}", "sandboxId", id, "message",
                                      "The sandbox was not found", "code", 502);
        if (!sb) {
                h2_answer_json(h, sid, 502, not_found);
                return;
        }
        if (port != ENVD_PORT && !ingress_public(sb) &&
            !ingress_token_ok(srv, sb, f->has_token ? f->token : NULL)) {
                json_decref(not_found);
                h2_answer_json(h, sid, 403,
                               json_pack("{s:s, s:s, s:i}", "sandboxId", sb->id, "message",
                                         f->has_token ? "the sandbox is private: invalid "
                                                        "e2b-traffic-access-token"
                                                      : "the sandbox is private: the request has "
                                                        "no e2b-traffic-access-token header",
                                         "code", 403));
                return;
        }
        if (sb->paused && ingress_auto_resume(srv, sb) < 0) {
                h2_answer_json(h, sid, 502, not_found);
                return;
        }
        json_decref(not_found);
        if (port == ENVD_PORT) {
                h2_answer_json(h, sid, 421,
                               json_pack("{s:s, s:s, s:i, s:i}", "sandboxId", sb->id, "message",
                                         "envd's port speaks HTTP/1.1 only", "port", (int) port, "code",
                                         421));
                return;
        }
        h->mask = ingress_masked_host(sb, port, h->mask_host, sizeof h->mask_host);
        if (h->mask && masked_block(h, f, sid, &h->first_block) < 0) {
                h2_close(h);
                return;
        }
        memcpy(h->sbx_id, sb->id, sizeof h->sbx_id);
        h->port = port;
        h->first_stream = sid;
        h->browser = strncmp(f->ua, "Mozilla/", 8) == 0;
        if (hutch_backend_caps(hutch_sandbox_backend(sb->h)) & HUTCH_BACKEND_OWN_NETSTACK) {
                gvisor_upstream(h, sb, sid);
                return;
        }
        int fd;
        if ((r = ingress_up_socket(sb, &fd)) < 0) {
                log_warning("sandbox %s: ingress h2 socket: %s", sb->id, strerror(-r));
                h2_answer_json(h, sid, 502,
                               json_pack("{s:s, s:s, s:i}", "sandboxId", sb->id, "message",
                                         "The sandbox was not found", "code", 502));
                return;
        }
        struct sockaddr_in sin = { .sin_family = AF_INET,
                                   .sin_port = htons((uint16_t) port),
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (connect(fd, (struct sockaddr *) &sin, sizeof sin) < 0 && errno != EINPROGRESS) {
                close(fd);
                answer_closed_port(h, sid);
                return;
        }
        h->uw.cb = on_up;
        h->uw.data = h;
        if (loop_add(srv, &h->uw, fd, EPOLLOUT) < 0) {
                h->uw.fd = -1; /* loop_add set it */
                close(fd);
                h2_close(h);
                return;
        }
        h->state = S_CONNECT;
        h->deadline_ms = 0;
        h2_update(h);
}

/* A later request's block: it must name the connection's port. */
static bool later_request_ok(h2conn *h, const req_fields *f) {
        char id[HUTCH_ID_LEN + 1];
        unsigned port;
        if (f->bad || route_of(h->srv, f, id, &port) < 0 || port != h->port ||
            strcasecmp(id, h->sbx_id) != 0)
                return false;
        sbx *sb = sbx_find(h->srv, h->sbx_id);
        if (!sb)
                return false;
        return ingress_public(sb) || ingress_token_ok(h->srv, sb, f->has_token ? f->token : NULL);
}

/* A whole header block is in hblock (its frames in hraw): decode it. */
static int block_done(h2conn *h) {
        req_fields f = { 0 };
        /* the first block may have to be masked: known once it is routed */
        h->fields.off = h->fields.len = 0;
        if (h->state == S_HEAD || h->mask)
                f.enc = &h->fields;
        int r = hpack_decode(&h->hp, h->hblock.p, h->hblock.len, LIST_MAX, on_field, &f);
        h->hblock.len = h->hblock.off = 0;
        if (r < 0) {
                h2_goaway(h, r == -E2BIG ? E_CALM : 9 /* COMPRESSION_ERROR */,
                          r == -E2BIG ? "header list too large" : "bad header block");
                return -1;
        }
        bool trailers = h->hstream <= h->last_stream;
        uint32_t prev = h->last_stream;
        if (!trailers)
                h->last_stream = h->hstream;
        if (h->state == S_HEAD) {
                first_request(h, h->hstream, &f);
                return 1; /* no more parsing until connected */
        }
        /* trailers name nothing: a block on an open stream that does is
         * refused too, whatever the server would make of it */
        if (trailers && (f.has_authority || f.has_host || f.has_sid || f.has_sport)) {
                h2_goaway(h, E_PROTOCOL, "trailers that name a host");
                return -1;
        }
        if (!trailers && !later_request_ok(h, &f)) {
                h->last_stream = prev; /* the refused stream never went */
                h2_goaway(h, E_PROTOCOL,
                          "a stream named another sandbox port, or lacked the access token");
                return -1;
        }
        if (h->mask ? masked_block(h, &f, h->hstream, &h->to_up) < 0
                    : hb_append(&h->to_up, h->hraw.p + h->hraw.off, hb_pending(&h->hraw)) < 0) {
                h2_close(h);
                return -1;
        }
        h->hraw.off = h->hraw.len = 0;
        return 0;
}

/* Parse the client's bytes in craw. In HEAD everything parsed stays in
 * craw (forwarded whole once connected); in RELAY parsed bytes move to
 * to_up, header blocks only once whole and checked. */
static void parse_client(h2conn *h) {
        while (h->state == S_HEAD || h->state == S_RELAY) {
                size_t keep = h->state == S_HEAD ? h->head_parsed : 0;
                uint8_t *p = h->craw.p + h->craw.off + keep;
                size_t avail = hb_pending(&h->craw) - keep;
                if (h->state == S_RELAY && h->c_left > 0) {
                        size_t n = avail < h->c_left ? avail : (size_t) h->c_left;
                        if (n == 0 || hb_pending(&h->to_up) >= BUF_CAP)
                                return;
                        if (hb_append(&h->to_up, p, n) < 0) {
                                h2_close(h);
                                return;
                        }
                        h->craw.off += n;
                        h->c_left -= n;
                        continue;
                }
                if (avail < FRAME_HDR)
                        return;
                uint32_t len = frame_len(p), sid = frame_sid(p);
                uint8_t type = p[3], flags = p[4];
                bool in_block = h->hframes > 0;
                if (in_block && (type != F_CONT || sid != h->hstream)) {
                        h2_goaway(h, E_PROTOCOL, "a header block interrupted (RFC 9113 §6.10)");
                        return;
                }
                if (type == F_HEADERS || type == F_CONT) {
                        if (len > HEADER_FRAME_MAX || (h->state == S_HEAD && len > FRAME_MAX_FIRST)) {
                                h2_goaway(h, E_FRAME_SIZE, "header frame too large");
                                return;
                        }
                        if (avail < FRAME_HDR + len)
                                return; /* wait for the whole frame */
                        if (type == F_CONT && !in_block) {
                                h2_goaway(h, E_PROTOCOL, "CONTINUATION without HEADERS");
                                return;
                        }
                        const uint8_t *frag = p + FRAME_HDR;
                        size_t fl = len;
                        if (type == F_HEADERS) {
                                if (sid == 0 || !(sid & 1) ||
                                    headers_fragment(p + FRAME_HDR, len, flags, &frag, &fl) < 0) {
                                        h2_goaway(h, E_PROTOCOL, "bad HEADERS frame");
                                        return;
                                }
                                h->hstream = sid;
                                h->hflags = flags;
                                if (h->state == S_HEAD)
                                        h->first_block_at = h->head_parsed;
                        }
                        if (++h->hframes > BLOCK_FRAMES_MAX || h->hblock.len + fl > BLOCK_MAX) {
                                h2_goaway(h, E_CALM, "header block too large (CONTINUATION flood)");
                                return;
                        }
                        if (hb_append(&h->hblock, frag, fl) < 0 ||
                            (h->state == S_RELAY && hb_append(&h->hraw, p, FRAME_HDR + len) < 0)) {
                                h2_close(h);
                                return;
                        }
                        if (h->state == S_HEAD)
                                h->head_parsed += FRAME_HDR + len;
                        else
                                h->craw.off += FRAME_HDR + len;
                        if (!(flags & FL_END_HEADERS))
                                continue;
                        h->hframes = 0;
                        if (block_done(h) != 0)
                                return;
                        continue;
                }
                if (h->state == S_HEAD) {
                        /* before the first request only connection-level
                         * frames make sense; and the server has not yet
                         * raised the frame size */
                        if ((type != F_SETTINGS && type != F_WINDOW && type != F_PRIORITY &&
                             type != F_PING) ||
                            len > FRAME_MAX_FIRST || ++h->head_frames > HEAD_FRAMES_MAX) {
                                h2_goaway(h, E_PROTOCOL, "unexpected frame before the first request");
                                return;
                        }
                        if (avail < FRAME_HDR + len)
                                return;
                        h->head_parsed += FRAME_HDR + len;
                        continue;
                }
                /* RELAY: the frame's header goes, its payload streams */
                if (hb_pending(&h->to_up) >= BUF_CAP)
                        return;
                if (hb_append(&h->to_up, p, FRAME_HDR) < 0) {
                        h2_close(h);
                        return;
                }
                h->craw.off += FRAME_HDR;
                h->c_left = len;
        }
}

/* The upstream's bytes just appended to to_cl: move the frame boundary. */
static void delimit_upstream(h2conn *h, const uint8_t *p, size_t n) {
        while (n > 0) {
                if (h->s_left > 0) {
                        size_t k = n < h->s_left ? n : (size_t) h->s_left;
                        h->s_left -= k;
                        p += k;
                        n -= k;
                } else {
                        size_t k = FRAME_HDR - h->s_have;
                        if (k > n)
                                k = n;
                        memcpy(h->s_hdr + h->s_have, p, k);
                        h->s_have += (unsigned) k;
                        p += k;
                        n -= k;
                        if (h->s_have < FRAME_HDR)
                                break;
                        h->s_have = 0;
                        h->s_left = frame_len(h->s_hdr);
                }
                if (h->s_left == 0 && h->s_have == 0)
                        h->to_cl_boundary = h->to_cl_total - n;
        }
}

/* ------------------------------------------------------------ I/O */

static void h2_update(h2conn *h) {
        if (h->closed)
                return;
        uint32_t ce = h->c_eof ? 0 : EPOLLRDHUP;
        bool c_read = !h->c_eof &&
                (h->state == S_HEAD || h->state == S_DRAIN ||
                 (h->state == S_RELAY && hb_pending(&h->to_up) < BUF_CAP &&
                  hb_pending(&h->craw) < BUF_CAP));
        if (c_read)
                ce |= EPOLLIN;
        if (hb_pending(&h->to_cl) > 0)
                ce |= EPOLLOUT;
        if (h->cw.fd >= 0 && h->cw.events != ce)
                (void) loop_mod(h->srv, &h->cw, ce);
        bool to_up = h->state == S_RELAY && hb_pending(&h->to_up) > 0;
        if (h->uw.fd >= 0) {
                uint32_t ue = h->state == S_CONNECT ? EPOLLOUT : EPOLLRDHUP;
                if (h->state == S_RELAY) {
                        if (!h->u_eof && hb_pending(&h->to_cl) < BUF_CAP)
                                ue |= EPOLLIN;
                        if (to_up && !h->split)
                                ue |= EPOLLOUT;
                }
                if (h->uw.events != ue)
                        (void) loop_mod(h->srv, &h->uw, ue);
        }
        if (h->ww.fd >= 0) {
                uint32_t we = to_up ? EPOLLOUT : 0;
                if (h->ww.events != we)
                        (void) loop_mod(h->srv, &h->ww, we);
        }
}

static bool flush(int fd, hbuf *b, uint64_t *sent, bool is_pipe) {
        while (hb_pending(b) > 0) {
                ssize_t n = is_pipe ? write(fd, b->p + b->off, hb_pending(b))
                                    : send(fd, b->p + b->off, hb_pending(b), MSG_NOSIGNAL);
                if (n < 0)
                        return errno == EAGAIN || errno == EINTR;
                b->off += (size_t) n;
                if (sent)
                        *sent += (uint64_t) n;
        }
        return true;
}

/* gvisor: the connector stopped reading (or the client's side ended):
 * what is left for it is dropped; its stdout still says the rest. */
static void up_write_side_gone(h2conn *h) {
        watcher_close(h, &h->ww);
        h->to_up.off = h->to_up.len = 0;
}

/* The checked client bytes to the upstream. false: the sandbox's server
 * closed (ns; on gvisor that shows as the connector's stdout ending). */
static bool up_flush(h2conn *h) {
        if (h->split) {
                if (h->ww.fd < 0)
                        h->to_up.off = h->to_up.len = 0;
                else if (!flush(h->ww.fd, &h->to_up, NULL, true))
                        up_write_side_gone(h);
                return true;
        }
        return h->uw.fd < 0 || flush(h->uw.fd, &h->to_up, NULL, false);
}

/* Both sides done and everything written: the end. */
static void relay_check_end(h2conn *h) {
        if (h->state == S_RELAY && h->u_eof && hb_pending(&h->to_cl) == 0)
                h2_close(h);
        else if (h->state == S_RELAY && h->c_eof && hb_pending(&h->to_up) == 0) {
                if (h->split)
                        watcher_close(h, &h->ww); /* the connector shuts its socket's write side */
                else if (h->uw.fd >= 0)
                        (void) shutdown(h->uw.fd, SHUT_WR);
        }
}

static void on_up(server *srv, watcher *w, uint32_t revents) {
        h2conn *h = w->data;
        if (h->closed)
                return;
        if (w == &h->ww) {
                /* gvisor: the connector's stdin */
                if (revents & (EPOLLERR | EPOLLHUP))
                        up_write_side_gone(h);
                else if (revents & EPOLLOUT) {
                        (void) up_flush(h);
                        parse_client(h);
                        if (h->closed)
                                return;
                }
                if (h->state == S_RELAY)
                        relay_check_end(h);
                h2_update(h);
                return;
        }
        if (h->state == S_CONNECT) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                        soerr = errno;
                if (soerr) {
                        watcher_close(h, &h->uw);
                        answer_closed_port(h, h->first_stream);
                        return;
                }
                relay_begin(h);
                if (h->closed || h->state != S_RELAY) {
                        h2_update(h);
                        return;
                }
        }
        if ((revents & EPOLLOUT) && !h->split) {
                if (!up_flush(h)) {
                        h2_goaway(h, E_NO_ERROR, "the sandbox's server closed");
                        return;
                }
                parse_client(h);
                if (h->closed || h->state != S_RELAY) {
                        h2_update(h);
                        return;
                }
        }
        if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
                while (!h->u_eof && hb_pending(&h->to_cl) < BUF_CAP) {
                        if (hb_reserve(&h->to_cl, 16384) < 0) {
                                h2_close(h);
                                return;
                        }
                        ssize_t n = read(h->uw.fd, h->to_cl.p + h->to_cl.len,
                                         h->to_cl.cap - h->to_cl.len);
                        if (n < 0) {
                                if (errno == EAGAIN || errno == EINTR)
                                        break;
                                h->u_eof = true;
                                break;
                        }
                        if (n == 0) {
                                h->u_eof = true;
                                break;
                        }
                        h->u_got = true;
                        h->to_cl.len += (size_t) n;
                        h->to_cl_total += (uint64_t) n;
                        delimit_upstream(h, h->to_cl.p + h->to_cl.len - n, (size_t) n);
                }
                if (h->u_eof && h->split && !h->u_got) {
                        /* the connector exited without a byte of the
                         * server's: it found the port closed (init/connect.c) */
                        ingress_closed_note(h->sbx_id, h->port);
                        watcher_close(h, &h->uw);
                        watcher_close(h, &h->ww);
                        answer_closed_port(h, h->first_stream);
                        return;
                }
                if (h->u_eof && h->uw.fd >= 0) {
                        /* nothing more comes; what the client still sends
                         * has nowhere to go */
                        watcher_close(h, &h->uw);
                        watcher_close(h, &h->ww);
                        h->to_up.off = h->to_up.len = 0;
                }
                if (h->cw.fd >= 0 && !flush(h->cw.fd, &h->to_cl, &h->to_cl_sent, false)) {
                        h2_close(h);
                        return;
                }
        }
        relay_check_end(h);
        h2_update(h);
}

static void on_client(server *srv, watcher *w, uint32_t revents) {
        h2conn *h = w->data;
        if (h->closed)
                return;
        if (revents & EPOLLOUT) {
                if (!flush(w->fd, &h->to_cl, &h->to_cl_sent, false)) {
                        h2_close(h);
                        return;
                }
                if (h->state == S_DRAIN && hb_pending(&h->to_cl) == 0)
                        (void) shutdown(w->fd, SHUT_WR);
        }
        if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
                if ((revents & (EPOLLHUP | EPOLLERR)) && h->c_eof) {
                        h2_close(h); /* both ways gone */
                        return;
                }
                while (!h->c_eof && h->state != S_CONNECT) {
                        if (h->state == S_RELAY &&
                            (hb_pending(&h->craw) >= BUF_CAP || hb_pending(&h->to_up) >= BUF_CAP))
                                break;
                        if (h->state == S_HEAD &&
                            hb_pending(&h->craw) > BLOCK_MAX + 4 * FRAME_MAX_FIRST) {
                                h2_goaway(h, E_CALM, "too much before the first request");
                                return;
                        }
                        if (hb_reserve(&h->craw, 16384) < 0) {
                                h2_close(h);
                                return;
                        }
                        ssize_t n = read(w->fd, h->craw.p + h->craw.len, h->craw.cap - h->craw.len);
                        if (n < 0) {
                                if (errno == EAGAIN || errno == EINTR)
                                        break;
                                h->c_eof = true;
                                break;
                        }
                        if (n == 0) {
                                h->c_eof = true;
                                break;
                        }
                        if (h->state == S_DRAIN) {
                                h->craw.len = h->craw.off = 0; /* dropped */
                                continue;
                        }
                        h->craw.len += (size_t) n;
                        if (h->state == S_HEAD || h->state == S_RELAY)
                                parse_client(h);
                        if (h->closed)
                                return;
                }
                if (h->state == S_DRAIN && h->c_eof) {
                        h2_close(h);
                        return;
                }
                if (h->state == S_HEAD && h->c_eof) {
                        h2_close(h);
                        return;
                }
                if (h->state == S_RELAY && hb_pending(&h->to_up) > 0 && !up_flush(h)) {
                        h2_goaway(h, E_NO_ERROR, "the sandbox's server closed");
                        return;
                }
                if (h->state == S_RELAY)
                        parse_client(h);
        }
        if (h->closed)
                return;
        relay_check_end(h);
        h2_update(h);
}

/* ------------------------------------------------------------ sniffing */

static void to_mhd(h2conn *h) {
        int fd = h->cw.fd;
        loop_del(h->srv, &h->cw);
        h->cw.fd = -1;
        /* MHD closes the socket itself if it cannot take it */
        (void) MHD_add_connection(h->srv->mhd, fd, (struct sockaddr *) &h->addr, h->addrlen);
        h2_close(h);
}

static void on_sniff(server *srv, watcher *w, uint32_t revents) {
        h2conn *h = w->data;
        if (h->closed)
                return;
        char peek[PREFACE_LEN];
        ssize_t n = recv(w->fd, peek, sizeof peek, MSG_PEEK);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n <= 0 || memcmp(peek, PREFACE, (size_t) n) != 0) {
                to_mhd(h); /* not HTTP/2, or closed: MHD's as ever */
                return;
        }
        if (n < PREFACE_LEN)
                return; /* edge-triggered: the next bytes wake us */
        h->state = S_HEAD;
        h->head_parsed = PREFACE_LEN; /* read below, checked here */
        h->deadline_ms = wall_ms() + (int64_t) srv->cfg.unauth_timeout_s * 1000;
        if (hpack_decoder_init(&h->hp, TABLE_LIMIT) < 0) {
                h2_close(h);
                return;
        }
        w->cb = on_client;
        (void) loop_mod(srv, w, EPOLLIN | EPOLLRDHUP);
        on_client(srv, w, EPOLLIN);
}

static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
        if (a->ss_family != b->ss_family)
                return false;
        if (a->ss_family == AF_INET)
                return ((const struct sockaddr_in *) a)->sin_addr.s_addr ==
                        ((const struct sockaddr_in *) b)->sin_addr.s_addr;
        if (a->ss_family == AF_INET6)
                return memcmp(&((const struct sockaddr_in6 *) a)->sin6_addr,
                              &((const struct sockaddr_in6 *) b)->sin6_addr,
                              sizeof(struct in6_addr)) == 0;
        return false;
}

/* This side's connections (undecided or HTTP/2) from the address of ss:
 * bounded per client as MHD bounds its own, so that idle connections that
 * never send a byte cannot pile up here out of MHD's sight. */
static unsigned conns_from(const struct sockaddr_storage *ss) {
        unsigned n = 0;
        for (h2conn *h = conns; h; h = h->next)
                n += same_address(&h->addr, ss);
        return n;
}

static void on_accept(server *srv, watcher *w, uint32_t revents) {
        for (int i = 0; i < 64; i++) {
                struct sockaddr_storage ss;
                socklen_t sl = sizeof ss;
                int fd = accept4(w->fd, (struct sockaddr *) &ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                        return; /* EAGAIN, or a transient error (EMFILE: MHD would log it) */
                /* TLS (ALPN h2 is not built), or too many undecided or h2
                 * connections: straight to MHD, which applies its limits */
                bool sniff = !srv->tls_pem[0] && n_conns < srv->cfg.max_connections;
                if (sniff && conns_from(&ss) >= srv->cfg.max_connections_per_client) {
                        close(fd);
                        continue;
                }
                h2conn *h = sniff ? calloc(1, sizeof *h) : NULL;
                if (!h) {
                        (void) MHD_add_connection(srv->mhd, fd, (struct sockaddr *) &ss, sl);
                        continue;
                }
                h->srv = srv;
                h->state = S_SNIFF;
                h->addr = ss;
                h->addrlen = sl;
                h->uw.fd = h->ww.fd = -1;
                h->cw.cb = on_sniff;
                h->cw.data = h;
                h->deadline_ms = wall_ms() + (int64_t) srv->cfg.unauth_timeout_s * 1000;
                h->next = conns;
                if (conns)
                        conns->prev = h;
                conns = h;
                n_conns++;
                if (loop_add(srv, &h->cw, fd, EPOLLIN | EPOLLRDHUP | EPOLLET) < 0) {
                        h->cw.fd = -1;
                        close(fd);
                        h2_close(h);
                }
        }
}

int ingress_h2_start(server *srv, int listen_fd) {
        listen_w.cb = on_accept;
        listen_w.data = NULL;
        int r = loop_add(srv, &listen_w, listen_fd, EPOLLIN);
        if (r < 0)
                return r;
        return 0;
}

void ingress_h2_stop(server *srv) {
        if (listen_w.fd >= 0) {
                int fd = listen_w.fd;
                loop_del(srv, &listen_w);
                close(fd);
                listen_w.fd = -1;
        }
        while (conns) {
                h2conn *h = conns;
                if (h->state == S_SNIFF)
                        to_mhd(h);
                else
                        h2_close(h);
        }
}

unsigned ingress_h2_connectors_of(const char *sbx_id) {
        unsigned n = 0;
        for (h2conn *h = conns; h; h = h->next)
                n += h->split && h->uw.fd >= 0 && streq(h->sbx_id, sbx_id);
        return n;
}

void ingress_h2_sbx_cut(server *srv, const char *sbx_id) {
        for (h2conn *h = conns, *next; h; h = next) {
                next = h->next;
                if (h->state >= S_CONNECT && streq(h->sbx_id, sbx_id))
                        h2_close(h);
        }
}

int64_t ingress_h2_tick(server *srv, int64_t now) {
        int64_t next = -1;
        for (h2conn *h = conns, *nx; h; h = nx) {
                nx = h->next;
                if (!h->deadline_ms ||
                    (h->state != S_SNIFF && h->state != S_HEAD && h->state != S_DRAIN))
                        continue;
                if (h->deadline_ms <= now) {
                        if (h->state == S_SNIFF)
                                h2_close(h); /* not a byte in unauth-timeout: as MHD would */
                        else if (h->state == S_HEAD)
                                h2_goaway(h, E_NO_ERROR, "no request in time");
                        else
                                h2_close(h);
                        continue;
                }
                if (next < 0 || h->deadline_ms < next)
                        next = h->deadline_ms;
        }
        return next;
}
