/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The code interpreter's HTTP/1.1 request parser: pure functions over the
 * bytes a client sent, no I/O (fuzz/fuzz-interp-http.c drives them).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define IH_MAX_HEAD (64 * 1024)
#define IH_MAX_PATH 1024

typedef struct ih_request {
        char method[16];
        char path[IH_MAX_PATH]; /* without the query string, percent-decoding not applied */
        size_t head_len;        /* bytes of the request line and headers, the blank line included */
        size_t content_length;  /* when !chunked */
        bool chunked;
        bool keep_alive;
        bool expect_continue;
} ih_request;

/* Parse a request head from buf[0..len). Returns 1 and fills *ret when the
 * head is complete, 0 when more bytes are needed, -EBADMSG for a malformed
 * head (answer 400), -E2BIG for a head over IH_MAX_HEAD (431), -EFBIG for
 * a Content-Length over max_body (413), -EOPNOTSUPP for a transfer coding
 * other than chunked (501). */
int ih_parse_head(const char *buf, size_t len, size_t max_body, ih_request *ret);

/* A chunked body starting at buf: returns 1 when it is complete (its
 * decoded length in *ret_body_len, the bytes it took, trailers included,
 * in *ret_consumed), 0 when more bytes are needed, -EBADMSG, or -EFBIG
 * past max_body decoded bytes. Only the chunk headers are read, so calling
 * it again on a growing buffer is cheap. */
int ih_chunked_scan(const char *buf, size_t len, size_t max_body, size_t *ret_body_len,
                    size_t *ret_consumed);
/* Copy the decoded body of a complete chunked body (ih_chunked_scan said
 * 1) into out, which has room for body_len bytes. */
void ih_chunked_copy(const char *buf, size_t len, char *out);
