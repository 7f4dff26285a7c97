/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HTTP/1.1 chunked framing (RFC 9112 §7.1), one byte at a time so that any
 * split of the same bytes is judged the same. Strict on purpose, like
 * proxyreq.c: every shape two implementations read differently (bare LF,
 * "0x"/"+"/" " before a size, oversized sizes, extensions with whitespace,
 * missing CRLF after data, obs-fold in trailers) is refused rather than
 * normalised, because the proxy relays the bytes verbatim and the server
 * behind it must find the same end of the body. docs/egress.md.
 */
#include <errno.h>
#include <string.h>

#include "egress/chunked.h"
#include "util/macro.h"

enum {
        S_SIZE_FIRST,      /* first hex digit of a chunk-size */
        S_SIZE,            /* more digits, ';' or CR */
        S_EXT_NAME_FIRST,  /* after ';' */
        S_EXT_NAME,        /* token, then '=', ';' or CR */
        S_EXT_VALUE_FIRST, /* after '=': token or '"' */
        S_EXT_TOKEN,       /* token value, then ';' or CR */
        S_EXT_QUOTED,      /* inside a quoted-string */
        S_EXT_QUOTED_PAIR, /* after '\' inside a quoted-string */
        S_EXT_QUOTED_END,  /* after the closing '"': ';' or CR */
        S_SIZE_LF,         /* LF ending the chunk line */
        S_DATA,
        S_DATA_CR, /* CRLF after chunk-data */
        S_DATA_LF,
        S_TRAILER_FIRST, /* first byte of a trailer line, or CR of the last CRLF */
        S_TRAILER_NAME,
        S_TRAILER_VALUE,
        S_TRAILER_LF,
        S_FINAL_LF,
        S_DONE,
};

/* The largest chunk-size: what a server reading it into int64_t can hold. */
#define CHUNK_SIZE_MAX UINT64_C(0x7fffffffffffffff)

void chunked_init(chunked *c) {
        memset(c, 0, sizeof *c);
        c->state = S_SIZE_FIRST;
}

static int fail(chunked *c, int code, const char *why) {
        c->error = code;
        c->why = why;
        return code;
}

/* RFC 9110 §5.6.2 tchar */
static bool is_tchar(unsigned char ch) {
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
                return true;
        return ch != 0 && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static int hex_value(unsigned char ch) {
        if (ch >= '0' && ch <= '9')
                return ch - '0';
        if (ch >= 'a' && ch <= 'f')
                return ch - 'a' + 10;
        if (ch >= 'A' && ch <= 'F')
                return ch - 'A' + 10;
        return -1;
}

/* RFC 9110 §5.6.4 qdtext: HTAB, SP, VCHAR but '"' and '\', obs-text */
static bool is_qdtext(unsigned char ch) {
        return ch == '\t' || ch == ' ' || ch == 0x21 || (ch >= 0x23 && ch <= 0x5b) ||
                (ch >= 0x5d && ch <= 0x7e) || ch >= 0x80;
}

/* field-vchar, SP, HTAB (RFC 9110 §5.5) */
static bool is_field_char(unsigned char ch) {
        return ch == '\t' || ch == ' ' || (ch >= 0x21 && ch <= 0x7e) || ch >= 0x80;
}

/* Where a chunk line ends (CR) or a new extension starts (';'). */
static int ext_next(chunked *c, unsigned char ch) {
        if (ch == ';') {
                c->state = S_EXT_NAME_FIRST;
                return 0;
        }
        if (ch == '\r') {
                c->state = S_SIZE_LF;
                return 0;
        }
        if (ch == ' ' || ch == '\t')
                return fail(c, -EINVAL, "whitespace in a chunk line");
        return fail(c, -EINVAL, "malformed chunk extension");
}

/* One byte outside chunk-data: 0, CHUNKED_DONE or -errno. */
static int step(chunked *c, unsigned char ch) {
        int d;

        /* LF is only ever the second half of a CRLF */
        if (ch == '\n' && c->state != S_SIZE_LF && c->state != S_DATA_LF &&
            c->state != S_TRAILER_LF && c->state != S_FINAL_LF)
                return fail(c, -EINVAL,
                            c->state == S_DATA_CR ? "chunk data not followed by CRLF"
                                                  : "bare LF line ending");

        if (c->state >= S_EXT_NAME_FIRST && c->state <= S_EXT_QUOTED_END && ch != '\r' &&
            ++c->count > CHUNKED_EXT_MAX)
                return fail(c, -E2BIG, "chunk extensions over 1024 bytes");
        if (c->state >= S_TRAILER_NAME && c->state <= S_TRAILER_VALUE && ch != '\r' &&
            ++c->count > CHUNKED_TRAILER_LINE_MAX)
                return fail(c, -E2BIG, "trailer field over 4096 bytes");

        switch (c->state) {
        case S_SIZE_FIRST:
        case S_SIZE:
                d = hex_value(ch);
                if (d >= 0) {
                        if (c->count == CHUNKED_SIZE_DIGITS_MAX)
                                return fail(c, -E2BIG, "chunk size over 16 hex digits");
                        if (c->size > (CHUNK_SIZE_MAX - (uint64_t) d) / 16)
                                return fail(c, -E2BIG, "chunk size over 2^63-1");
                        c->size = c->size * 16 + (uint64_t) d;
                        c->count++;
                        c->state = S_SIZE;
                        return 0;
                }
                if (ch == ' ' || ch == '\t')
                        return fail(c, -EINVAL, "whitespace in a chunk line");
                if (c->state == S_SIZE_FIRST)
                        return fail(c, -EINVAL, "chunk size is not a hex number");
                if (ch == ';' || ch == '\r') {
                        c->count = ch == ';';
                        return ext_next(c, ch);
                }
                return fail(c, -EINVAL, "chunk size is not a hex number");

        case S_EXT_NAME_FIRST:
                if (is_tchar(ch)) {
                        c->state = S_EXT_NAME;
                        return 0;
                }
                if (ch == ' ' || ch == '\t')
                        return fail(c, -EINVAL, "whitespace in a chunk line");
                return fail(c, -EINVAL, "malformed chunk extension");

        case S_EXT_NAME:
                if (is_tchar(ch))
                        return 0;
                if (ch == '=') {
                        c->state = S_EXT_VALUE_FIRST;
                        return 0;
                }
                return ext_next(c, ch);

        case S_EXT_VALUE_FIRST:
                if (is_tchar(ch)) {
                        c->state = S_EXT_TOKEN;
                        return 0;
                }
                if (ch == '"') {
                        c->state = S_EXT_QUOTED;
                        return 0;
                }
                if (ch == ' ' || ch == '\t')
                        return fail(c, -EINVAL, "whitespace in a chunk line");
                return fail(c, -EINVAL, "malformed chunk extension");

        case S_EXT_TOKEN:
                if (is_tchar(ch))
                        return 0;
                return ext_next(c, ch);

        case S_EXT_QUOTED:
                if (ch == '"')
                        c->state = S_EXT_QUOTED_END;
                else if (ch == '\\')
                        c->state = S_EXT_QUOTED_PAIR;
                else if (!is_qdtext(ch))
                        return fail(c, -EINVAL, "control character in a chunk extension");
                return 0;

        case S_EXT_QUOTED_PAIR:
                /* HTAB, SP, VCHAR, obs-text: what qdtext allows, and '"', '\' */
                if (!is_qdtext(ch) && ch != '"' && ch != '\\')
                        return fail(c, -EINVAL, "control character in a chunk extension");
                c->state = S_EXT_QUOTED;
                return 0;

        case S_EXT_QUOTED_END:
                return ext_next(c, ch);

        case S_SIZE_LF:
                if (ch != '\n')
                        return fail(c, -EINVAL, "CR not followed by LF");
                c->count = 0;
                if (c->size == 0) {
                        c->state = S_TRAILER_FIRST;
                        return 0;
                }
                if (c->size > UINT64_MAX - c->body_bytes)
                        return fail(c, -E2BIG, "body over 2^64-1 bytes");
                c->n_chunks++;
                c->state = S_DATA;
                return 0;

        case S_DATA_CR:
                if (ch != '\r')
                        return fail(c, -EINVAL, "chunk data not followed by CRLF");
                c->state = S_DATA_LF;
                return 0;

        case S_DATA_LF:
                if (ch != '\n')
                        return fail(c, -EINVAL, "chunk data not followed by CRLF");
                c->state = S_SIZE_FIRST;
                return 0;

        case S_TRAILER_FIRST:
                if (ch == '\r') {
                        c->state = S_FINAL_LF;
                        return 0;
                }
                if (ch == ' ' || ch == '\t')
                        return fail(c, -EINVAL, "obs-fold continuation line in the trailer");
                if (!is_tchar(ch))
                        return fail(c, -EINVAL, "malformed trailer field name");
                if (c->n_trailers == CHUNKED_TRAILERS_MAX)
                        return fail(c, -E2BIG, "more than 32 trailer fields");
                c->n_trailers++;
                c->count = 1;
                c->state = S_TRAILER_NAME;
                return 0;

        case S_TRAILER_NAME:
                if (is_tchar(ch))
                        return 0;
                if (ch == ':') {
                        c->state = S_TRAILER_VALUE;
                        return 0;
                }
                if (ch == ' ' || ch == '\t')
                        return fail(c, -EINVAL, "whitespace before the colon in a trailer field");
                if (ch == '\r')
                        return fail(c, -EINVAL, "trailer field without a colon");
                return fail(c, -EINVAL, "malformed trailer field name");

        case S_TRAILER_VALUE:
                if (ch == '\r') {
                        c->state = S_TRAILER_LF;
                        return 0;
                }
                if (!is_field_char(ch))
                        return fail(c, -EINVAL, "control character in a trailer field");
                return 0;

        case S_TRAILER_LF:
                if (ch != '\n')
                        return fail(c, -EINVAL, "CR not followed by LF");
                c->count = 0;
                c->state = S_TRAILER_FIRST;
                return 0;

        case S_FINAL_LF:
                if (ch != '\n')
                        return fail(c, -EINVAL, "CR not followed by LF");
                c->state = S_DONE;
                return CHUNKED_DONE;

        default:
                return fail(c, -EINVAL, "chunked parser in a bad state");
        }
}

int chunked_feed(chunked *c, const void *data, size_t n, size_t *ret_consumed) {
        const unsigned char *p = data;
        size_t i = 0;
        int k = CHUNKED_NEED_MORE;

        if (c->error || c->state == S_DONE) {
                if (ret_consumed)
                        *ret_consumed = 0;
                return c->error ? c->error : CHUNKED_DONE;
        }
        while (i < n) {
                if (c->state == S_DATA) {
                        /* chunk-data is opaque: take as much of it as is here */
                        size_t take = (size_t) MIN((uint64_t) (n - i), c->size);
                        i += take;
                        c->size -= take;
                        c->body_bytes += take;
                        if (c->size == 0)
                                c->state = S_DATA_CR;
                        continue;
                }
                k = step(c, p[i]);
                if (k < 0)
                        break;
                i++;
                if (k == CHUNKED_DONE)
                        break;
        }
        if (ret_consumed)
                *ret_consumed = i;
        return k;
}
