/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The router's parsers, free of I/O so that they are fuzzed
 * (fuzz/fuzz-router.c): the head of a node's HTTP/1.1 response (its framing,
 * so the router relays exactly one response and knows where it ends), where
 * a client's request goes (rroute_decide), and the merge of the nodes' list
 * pages (rmerge_*). Client request heads are parsed with lib/egress's
 * proxyreq (origin-form), which is fuzzed on its own.
 *
 * Conventions as in lib/: >= 0 on success, -errno on failure.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RHEAD_MAX 16384   /* status line + headers + final CRLF */
#define RHEAD_HEADERS 100 /* header lines */
#define ROUTER_NODE_ID_LEN 4
#define ROUTER_SANDBOX_ID_LEN 20

/* ------------------------------------------------------- response heads */

typedef struct rhead_header {
        const char *name, *value; /* NUL-terminated, point into buf */
} rhead_header;

typedef struct rhead {
        /* results, valid after RHEAD_DONE */
        unsigned status;   /* 100..999 */
        int version_minor; /* HTTP/1.<0|1> */
        rhead_header headers[RHEAD_HEADERS];
        size_t n_headers;
        bool has_content_length;
        uint64_t content_length;
        bool chunked;    /* Transfer-Encoding: chunked (the only coding taken) */
        bool conn_close; /* Connection: close, or HTTP/1.0 without keep-alive */
        size_t head_len; /* bytes of the head, final CRLF included */
        const char *why; /* after an error: a static English reason */
        /* state */
        int error;
        bool done;
        size_t len;
        char buf[RHEAD_MAX + 1];
} rhead;

enum { RHEAD_NEED_MORE = 0, RHEAD_DONE = 1 };

void rhead_init(rhead *h);
/* Like proxyreq_feed: RHEAD_NEED_MORE (all taken), RHEAD_DONE
 * (*ret_consumed bytes ended the head), or -EINVAL / -E2BIG with why.
 * Sticky; the same answer for any split of the same bytes. */
int rhead_feed(rhead *h, const void *data, size_t n, size_t *ret_consumed);
const char *rhead_get(const rhead *h, const char *name); /* first, case-insensitive */
/* Whether the response to a request with this method has no body whatever
 * its headers say: HEAD, 1xx, 204, 304. */
bool rhead_bodyless(const rhead *h, const char *method);
/* A hop-by-hop header the router does not relay (RFC 9110 §7.6.1):
 * Connection, Keep-Alive, Proxy-*, TE, Trailer, Upgrade, and what a
 * Connection header names. */
bool rhead_hop_by_hop(const char *name, const char *connection_value);

/* ------------------------------------------------------------- routing */

enum {
        RR_BAD = 0,      /* 400: a malformed id in a routing header or Host */
        RR_HEALTH,       /* the router's own /health */
        RR_METRICS,      /* the router's own /metrics */
        RR_SANDBOX,      /* forward to the node named by id */
        RR_CREATE,       /* POST /sandboxes, /v2/sandboxes: placement */
        RR_LIST,         /* GET /sandboxes, /v2/sandboxes: every node, merged */
        RR_SNAPSHOTS,    /* GET /snapshots: every node, merged */
        RR_BROADCAST,    /* a write of team-wide state (secrets): every node */
        RR_ANY,          /* node-independent (GET /secrets…): any one node */
        RR_SIGNED_FILES, /* /files with a signature and no id: the node whose sandbox signed it */
};

typedef struct rroute {
        int kind;
        bool data_plane; /* E2b-Sandbox-Port or Host routing: errors in envd's shape */
        char id[64];     /* RR_SANDBOX: the sandbox or snapshot id */
        char node[ROUTER_NODE_ID_LEN + 1]; /* RR_SANDBOX: the node id in it */
} rroute;

/* target: the request target as sent; host, sandbox_id, sandbox_port: the
 * headers, or NULL. */
int rroute_decide(const char *method, const char *target, const char *host, const char *sandbox_id,
                  const char *sandbox_port, rroute *ret);
/* A sandbox id [a-z0-9]{20}. */
bool rroute_sandbox_id_valid(const char *s, size_t n);

/* --------------------------------------------------------------- merge */

/* Merge list pages of several nodes (JSON arrays as the nodes sent them):
 * snapshots=false: GET /v2/sandboxes items by (startedAt, sandboxID), desc
 * unless asc; snapshots=true: GET /snapshots by (createdAtUnixMs,
 * snapshotID) desc. Takes the first limit; *ret_token is the page token of
 * the last item taken when more remain (more_hint: some node said it had
 * more), "" otherwise. -EBADMSG for a page that is not an array of such
 * objects. */
int rmerge(json_t *const *pages, size_t n, bool snapshots, bool asc, size_t limit, bool more_hint,
           json_t **ret, char ret_token[96]);
