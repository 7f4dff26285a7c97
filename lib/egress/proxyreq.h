/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a sandbox program says to the egress proxy (issue #4), parsed without
 * I/O: the head of an HTTP/1.1 forward-proxy request (CONNECT authority-form
 * or http:// absolute-form; SOCKS5 is egress/socks5.h), or, in origin-form
 * mode, of a request inside a CONNECT tunnel whose TLS the proxy terminated
 * ("GET /path" + Host, one head after another). The proxy feeds bytes
 * as they arrive, in any split; the parser keeps bounded state and answers the
 * same for any split of the same bytes.
 * The proxy (proxy.c) parses every request head with it.
 * docs/egress.md ("Proxy request parsing") explains every refusal.
 *
 * The host each parser returns is the text the sandbox wrote; it is not
 * checked here beyond framing. The caller passes it to egress_host_parse_n()
 * and uses that parsed value for the decision and the dial.
 *
 * Conventions as elsewhere in lib/: -errno on failure, ret_* written only on
 * success.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/policy.h"

/* ------------------------------------------------------------ HTTP heads */

#define PROXYREQ_HEAD_MAX 16384  /* request line + headers + final CRLF */
#define PROXYREQ_HEADERS_MAX 100 /* header lines */
#define PROXYREQ_METHOD_MAX 32

enum {
        PROXYREQ_NEED_MORE = 0, /* every byte fed was taken; feed more */
        PROXYREQ_DONE = 1,      /* the head is complete; see ret_consumed */
};

typedef struct proxyreq_header {
        const char *name; /* NUL-terminated, points into the parser */
        size_t name_len;
        const char *value; /* without surrounding whitespace, NUL-terminated */
        size_t value_len;
} proxyreq_header;

/* One request head. Large (about 18 KiB) and not movable once DONE: the
 * strings point into buf. Initialise with proxyreq_init() (forward proxy) or
 * proxyreq_init_origin() (inside an intercepted tunnel), and again with the
 * same function for the next head. */
typedef struct proxyreq {
        /* mode, set by the init function */
        bool origin_form; /* proxyreq_init_origin(): origin-form heads only */

        /* results, valid after PROXYREQ_DONE */
        bool connect;                         /* CONNECT host:port; never in origin-form mode */
        const char *method;                   /* "CONNECT", "GET", ... (case kept) */
        char host[EGRESS_HOST_INPUT_MAX + 1]; /* raw text, "[v6]" kept; for egress_host_parse_n;
                                                 origin-form: from the Host header */
        size_t host_len;
        uint16_t port;    /* 1..65535; 80 when absolute-form names none;
                             origin-form: 0 when the Host header names none */
        const char *path; /* absolute-form: "/path?query" to re-send; CONNECT: NULL;
                             origin-form: the target as sent, "/..." or "*" (OPTIONS only) */
        size_t path_len;
        int version_minor; /* HTTP/1.<0|1> */
        proxyreq_header headers[PROXYREQ_HEADERS_MAX];
        size_t n_headers;
        bool has_content_length; /* body framing (absolute-form and origin-form) */
        uint64_t content_length;
        bool chunked;    /* Transfer-Encoding: chunked */
        size_t head_len; /* bytes of the head, final CRLF included */

        /* after an error: a static English reason */
        const char *why;

        /* parser state */
        int error; /* sticky: 0, or the -errno returned */
        bool done;
        size_t len;
        char buf[PROXYREQ_HEAD_MAX + 1];
} proxyreq;

void proxyreq_init(proxyreq *r);

/* Origin-form mode, for the requests a sandbox sends inside a CONNECT tunnel
 * once the proxy has terminated its TLS: "GET /path?q HTTP/1.1" or
 * "OPTIONS * HTTP/1.1", with exactly one Host header, which is required even
 * in HTTP/1.0. Header rules, framing and limits are those of the forward
 * mode. CONNECT and absolute-form targets are refused (-EINVAL). host and
 * port come from the Host header, raw: the caller checks that it names the
 * tunnel's host (and, when port != 0, its port). For keep-alive, call this
 * again after each request's body and feed what follows. */
void proxyreq_init_origin(proxyreq *r);

/* Feed the next bytes. Returns PROXYREQ_NEED_MORE (all n taken),
 * PROXYREQ_DONE (*ret_consumed bytes of data ended the head; the rest is body
 * or tunnel data), or a negative errno with r->why set: -EINVAL (malformed
 * or ambiguous), -E2BIG (head or header count over the limit),
 * -EPROTONOSUPPORT (https:// absolute-form, other schemes, other HTTP
 * versions; in origin-form mode only other HTTP versions). Errors and DONE
 * are sticky: feeding again returns the same code and consumes nothing.
 * ret_consumed (may be NULL) is written on every return, errors included:
 * the bytes taken. */
int proxyreq_feed(proxyreq *r, const void *data, size_t n, size_t *ret_consumed);

/* The first header with this name (ASCII case-insensitive), or NULL. */
const proxyreq_header *proxyreq_find_header(const proxyreq *r, const char *name);

/* Proxy-Authorization (at most one is accepted), or NULL. */
const proxyreq_header *proxyreq_proxy_authorization(const proxyreq *r);

/* Whether header i must be dropped before the request is sent upstream:
 * Connection, Proxy-Connection, Keep-Alive, Proxy-Authorization,
 * Proxy-Authenticate, TE, Trailer, Upgrade, and every name a Connection
 * header lists. Transfer-Encoding is kept: the body is relayed as framed. */
bool proxyreq_header_is_hop_by_hop(const proxyreq *r, size_t i);
