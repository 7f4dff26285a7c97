/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Streaming multipart/form-data parser (RFC 7578 over RFC 2046 §5.1) for
 * `POST /files` bodies of any size, fed in slices of any size (one byte at a
 * time works). Memory is fixed: the boundary plus one part's headers.
 *
 * What it accepts, and why:
 * - Preamble and epilogue are ignored. The first delimiter may start the body
 *   without a CRLF in front (RFC 2046: the CRLF before a delimiter belongs to
 *   the delimiter, and the body's start counts as one). So may the delimiter
 *   that ends an empty part, as Go's mime/multipart allows.
 * - A delimiter is "CRLF--boundary" followed by "--" (the close delimiter),
 *   or by transport padding (SP/HT) and CRLF. As in Go's mime/multipart (what
 *   real envd uses), "CRLF--boundary" followed by anything else is part data.
 * - Part headers: at most MULTIPART_HEADERS_MAX bytes and
 *   MULTIPART_HEADER_LINES_MAX lines per part, names case-insensitive, lines
 *   end in CRLF (a bare LF is tolerated), obs-fold continuation lines are
 *   unfolded, control characters (NUL, lone CR, ...) are rejected.
 * - Content-Disposition is required, once, of type form-data. Its name and
 *   filename parameters are tokens or quoted-strings; a backslash escapes a
 *   tspecial only (MSIE sent "C:\dir\a.txt" unescaped; Go reads it the same).
 *   WHATWG percent-escapes ("%22") in names are not decoded: browsers, undici
 *   and envd all leave them as they are.
 * - filename*=UTF-8''pct-encoded (RFC 8187, which dropped ISO-8859-1) is
 *   decoded and wins over filename (RFC 6266 §4.3); other charsets are
 *   rejected. RFC 2231 continuations (filename*0=) are unknown parameters and
 *   ignored, like every other parameter. A decoded NUL, CR, LF or other
 *   control character is rejected.
 * - At most MULTIPART_PARTS_MAX parts.
 */
#pragma once

#include <stddef.h>

#define MULTIPART_BOUNDARY_MAX 70 /* RFC 2046 §5.1.1 */
#define MULTIPART_HEADERS_MAX 8192
#define MULTIPART_HEADER_LINES_MAX 32
#define MULTIPART_PARTS_MAX 1000

/* The strings are valid until part_end returns (or the parser is freed). */
typedef struct multipart_part {
        const char *name;         /* form field name, "" if absent */
        const char *filename;     /* NULL if the part has no filename parameter */
        const char *content_type; /* NULL if absent */
} multipart_part;

/* Each callback may be NULL. part_data is never called with len 0; data of
 * one part comes in as few calls as the slices fed allow. A callback that
 * returns < 0 stops the parser: feed returns that value, and so does every
 * later feed and finish. */
typedef struct multipart_callbacks {
        int (*part_begin)(void *ud, const multipart_part *p); /* after a part's headers */
        int (*part_data)(void *ud, const void *data, size_t len);
        int (*part_end)(void *ud);
} multipart_callbacks;

typedef struct multipart_parser multipart_parser;

/* content_type: the request's Content-Type header value; extracts boundary=
 * (token or quoted-string, 1-70 bchars per RFC 2046). -EINVAL with a message
 * in err (errlen bytes, may be NULL/0) when it is not multipart/form-data or
 * has no valid boundary; -ENOMEM. cb may be NULL. */
int multipart_parser_new(const char *content_type, const multipart_callbacks *cb, void *ud,
                         multipart_parser **ret, char *err, size_t errlen);

/* 0 ok, -EBADMSG malformed (message via multipart_parser_error), or a
 * callback's error. Errors are sticky. Bytes after the close delimiter are
 * ignored. */
int multipart_parser_feed(multipart_parser *p, const void *data, size_t len);

/* At the end of the body: 0 if the closing boundary was seen, -EBADMSG
 * otherwise (or the earlier error). A part cut short gets no part_end. */
int multipart_parser_finish(multipart_parser *p);

/* The message of the last error, "" if none. */
const char *multipart_parser_error(const multipart_parser *p);

/* Number of parts whose headers were read so far. */
unsigned multipart_parser_parts(const multipart_parser *p);

void multipart_parser_free(multipart_parser *p);

static inline void multipart_parser_freep(multipart_parser **p) {
        multipart_parser_free(*p);
}
