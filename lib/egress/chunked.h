/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The framing of an HTTP/1.1 chunked request body (RFC 9112 §7.1), checked
 * without I/O or allocation, so the forward proxy relays exactly one body
 * and nothing after it (request smuggling, RFC 9112 §11.2). It only frames:
 * the proxy relays the consumed bytes verbatim, extensions and trailers
 * included, and nothing is decoded. Bytes may come in any split; state is a
 * few words. The forward proxy (proxy.c) frames every chunked body it
 * relays with it. docs/egress.md ("Chunked request bodies").
 *
 * Stricter than RFC 9112, because servers disagree on every leniency:
 *   - chunk-size is 1 to 16 hex digits and below 2^63 (no "0x", sign or
 *     whitespace; a server that reads it into an int64_t still agrees);
 *   - no whitespace anywhere in a chunk line, not even the BWS that RFC 9112
 *     §7.1.1 lets come around ';' and '=': no client sends it, and servers
 *     differ on where it may stand;
 *   - a chunk extension is ";" token [ "=" ( token / quoted-string ) ], at
 *     most CHUNKED_EXT_MAX bytes of them per chunk line;
 *   - lines end in CRLF: a bare LF, or a CR not followed by LF, is refused;
 *   - chunk data is followed by CRLF and nothing else;
 *   - trailer fields are "name:" OWS value with no obs-fold (a line that
 *     starts with SP or HTAB), no whitespace before the colon, no control
 *     characters but HTAB; at most CHUNKED_TRAILERS_MAX of them, each line
 *     at most CHUNKED_TRAILER_LINE_MAX bytes.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHUNKED_SIZE_DIGITS_MAX 16    /* hex digits in a chunk-size, leading zeros included */
#define CHUNKED_EXT_MAX 1024          /* chunk-ext bytes on one chunk line */
#define CHUNKED_TRAILERS_MAX 32       /* trailer field lines */
#define CHUNKED_TRAILER_LINE_MAX 4096 /* bytes of one trailer field line, CRLF excluded */

enum {
        CHUNKED_NEED_MORE = 0, /* every byte fed was taken; feed more */
        CHUNKED_DONE = 1,      /* the body ended; see ret_consumed */
};

typedef struct chunked {
        uint64_t body_bytes; /* chunk-data bytes so far (the decoded length) */
        uint64_t n_chunks;   /* chunks so far, the last (zero-size) one excluded */
        size_t n_trailers;   /* trailer field lines */

        /* after an error: a static English reason */
        const char *why;

        /* parser state */
        int error; /* sticky: 0, or the -errno returned */
        int state;
        uint64_t size; /* the chunk-size being read, then the chunk-data left */
        size_t count;  /* digits of the size, bytes of the extensions or trailer line */
} chunked;

void chunked_init(chunked *c);

/* Feed the next bytes of the body (what follows the request head). Returns
 * CHUNKED_NEED_MORE (all n taken), CHUNKED_DONE (*ret_consumed bytes of data
 * ended the body, its final CRLF included; the rest belongs to whatever
 * follows and must not be relayed as this body), or a negative errno with
 * c->why set: -EINVAL (malformed), -E2BIG (over a bound above). Errors and
 * DONE are sticky: feeding again returns the same code and consumes
 * nothing. ret_consumed (may be NULL) is written on every return, errors
 * included: on an error, the bytes before the one refused. The
 * answer, consumed count and reason are the same for any split of the same
 * bytes. */
int chunked_feed(chunked *c, const void *data, size_t n, size_t *ret_consumed);
