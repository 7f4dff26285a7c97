/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ingress (daemon/ingress.c) parses two things a sandbox writes: the head
 * of an HTTP/1.x response from a server inside it, and a chunked response
 * body, which it decodes so that libmicrohttpd frames the body to the client
 * anew (the daemon never relays a sandbox's framing verbatim). Both are
 * pure and fuzzed (fuzz/fuzz-ingress.c), and strict: whatever could be read
 * two ways by two parsers is refused, and the client gets a 502.
 *
 * Also here, pure for the same reason: the Host form of a sandbox port,
 * "<port>-<id>.<domain>[:port]", checked against the sandbox domain.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hutch/hutch.h"

#define INGRESS_HEAD_MAX (64 * 1024) /* bytes of a response head, interim ones included */
#define INGRESS_HEADERS_MAX 128      /* field lines of one response head */

enum {
        INGRESS_BODY_NONE = 0,    /* HEAD, 1xx, 204, 304: no body whatever the head says */
        INGRESS_BODY_LENGTH = 1,  /* Content-Length bytes */
        INGRESS_BODY_CHUNKED = 2, /* chunked (decoded by ingress_chunked_decode) */
        INGRESS_BODY_CLOSE = 3,   /* until the server closes */
};

typedef struct ingress_field {
        const char *name, *value; /* into the parsed buffer; not NUL-terminated */
        size_t name_len, value_len;
} ingress_field;

typedef struct ingress_resp_head {
        unsigned status; /* 100..999 */
        unsigned minor;  /* HTTP/1.minor */
        size_t head_len; /* bytes of the head, its blank line included */
        size_t n_fields;
        ingress_field fields[INGRESS_HEADERS_MAX];
        int body;                /* INGRESS_BODY_* */
        uint64_t content_length; /* INGRESS_BODY_LENGTH */
        bool interim; /* a 1xx other than 101: drop head_len bytes and parse the next head */
} ingress_resp_head;

/* Parse the response head at the front of buf. head_request: the request
 * was a HEAD (no body follows, whatever the head says). Returns 1 with
 * *ret filled (its fields point into buf), 0 when the head is not complete
 * yet, -EBADMSG when it is malformed or ambiguous (bare LF or CR, obs-fold,
 * a control byte, a bad status line, conflicting or bad Content-Length,
 * Transfer-Encoding on a response that cannot have a body), -E2BIG past
 * INGRESS_HEAD_MAX or INGRESS_HEADERS_MAX. */
int ingress_resp_head_parse(const char *buf, size_t len, bool head_request, ingress_resp_head *ret);

/* Whether a field name is hop-by-hop for this head (RFC 9110 §7.6.1): the
 * fixed list, and every name its Connection fields list. */
bool ingress_resp_field_is_hop(const ingress_resp_head *h, const char *name, size_t name_len);

/* Whether the comma-separated list in value (a Connection field) holds the
 * token tok, case-insensitively. */
bool ingress_list_has(const char *value, size_t value_len, const char *tok);

typedef struct ingress_chunked {
        int state;
        uint64_t left; /* of the chunk's data, or its size while read */
        unsigned digits;
        size_t count; /* bytes of the chunk extension or trailer line */
        unsigned n_trailers;
        bool done;
} ingress_chunked;

void ingress_chunked_init(ingress_chunked *c);
/* Decode the chunked bytes buf[0..n) in place: the chunk data moves to the
 * front of buf. Returns the data bytes now at buf's front, or -EBADMSG
 * (malformed) / -E2BIG (a chunk-size, extension or trailer over its
 * bound). *ret_used: the input bytes taken, n unless the body ended (then
 * c->done, and what follows is not this body's). Errors are sticky. */
ssize_t ingress_chunked_decode(ingress_chunked *c, uint8_t *buf, size_t n, size_t *ret_used);

/* Host "<port>-<id>.<domain>[:port]": 0 with the port and id when host
 * names a sandbox port under domain (case-insensitive; a domain with its
 * own ":port" must match it exactly, one without matches any port); an
 * empty domain accepts any. -EINVAL otherwise. */
int ingress_host_parse(const char *host, const char *domain, unsigned *ret_port,
                       char ret_id[HUTCH_ID_LEN + 1]);

/* An E2b-Sandbox-Port value: 1..65535 in decimal, nothing else. */
int ingress_port_parse(const char *s, unsigned *ret);
