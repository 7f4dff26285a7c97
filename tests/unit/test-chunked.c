/* SPDX-License-Identifier: Apache-2.0 */
/* The chunked body framer (lib/egress/chunked.c). Every body is fed whole,
 * one byte at a time, in fixed steps and split in two at every offset, and
 * all must agree on the answer, the bytes consumed, the reason and the
 * payload counted. The refusals are the request-smuggling shapes of RFC 9112
 * §11.2 and the ones servers are known to read differently. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "egress/chunked.h"
#include "util/macro.h"

/* ------------------------------------------------------------- helpers */

/* Test names are one short TAP line: CR, LF, HTAB as \r \n \t, other
 * bytes outside printable ASCII as \xNN, long inputs cut with "...". */
static const char *show_n(const char *s, size_t n) {
        static char bufs[4][128];
        static int next;
        char *b = bufs[next++ % 4];
        size_t o = 0, i;
        for (i = 0; i < n && o + 8 < sizeof bufs[0]; i++) {
                unsigned char c = (unsigned char) s[i];
                const char *esc = c == '\r' ? "\\r" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : NULL;
                if (esc)
                        o += (size_t) snprintf(b + o, sizeof bufs[0] - o, "%s", esc);
                else if (c >= 0x20 && c < 0x7f)
                        b[o++] = (char) c;
                else
                        o += (size_t) snprintf(b + o, sizeof bufs[0] - o, "\\x%02x", c);
        }
        if (i < n)
                memcpy(b + o - 3, "...", 3);
        b[o] = 0;
        return b;
}

static chunked whole;

/* Feed s[0..n) in pieces: first `first` bytes, then `step` at a time (0:
 * the rest at once), until an answer other than NEED_MORE. */
static int feed_pieces(chunked *c, const char *s, size_t n, size_t first, size_t step,
                       size_t *ret_consumed) {
        size_t off = 0, taken;
        int k = CHUNKED_NEED_MORE;

        chunked_init(c);
        while (off < n) {
                size_t len = off == 0 && first ? first : step ? step : n - off;
                len = MIN(len, n - off);
                k = chunked_feed(c, s + off, len, &taken);
                if (taken > len || (k == CHUNKED_NEED_MORE && taken != len))
                        return -EFAULT; /* the contract itself is broken */
                off += taken;
                if (k != CHUNKED_NEED_MORE)
                        break;
        }
        *ret_consumed = off;
        return k;
}

static bool same(const chunked *a, int ka, size_t ca, const chunked *b, int kb, size_t cb) {
        return ka == kb && ca == cb && a->body_bytes == b->body_bytes &&
                a->n_chunks == b->n_chunks && a->n_trailers == b->n_trailers &&
                (ka >= 0 || (a->why && b->why && streq(a->why, b->why)));
}

/* Feed whole, byte by byte, in steps of 2..7 and split at every offset;
 * returns the whole answer (in `whole`), and whether all agreed. */
static int feed_all(const char *s, size_t n, size_t *ret_consumed, bool *ret_agree) {
        chunked other;
        size_t c0, c;
        int k0 = feed_pieces(&whole, s, n, 0, 0, &c0), k;

        *ret_agree = true;
        for (size_t step = 1; step <= 7; step++) {
                k = feed_pieces(&other, s, n, 0, step, &c);
                if (!same(&whole, k0, c0, &other, k, c)) {
                        printf("#   step %zu: %d %zu %s\n", step, k, c, other.why ? other.why : "");
                        *ret_agree = false;
                }
        }
        for (size_t at = 1; at < n; at++) {
                k = feed_pieces(&other, s, n, at, 0, &c);
                if (!same(&whole, k0, c0, &other, k, c)) {
                        printf("#   split at %zu: %d %zu %s\n", at, k, c, other.why ? other.why : "");
                        *ret_agree = false;
                }
        }
        *ret_consumed = c0;
        return k0;
}

static void body_ok_n(const char *in, size_t n, size_t consumed, uint64_t body_bytes) {
        size_t c;
        bool agree;
        int k = feed_all(in, n, &c, &agree);

        ok(k == CHUNKED_DONE && agree && c == consumed && whole.body_bytes == body_bytes && !whole.why,
           "body \"%s\": DONE after %zu bytes, %" PRIu64 " of payload (got %d %zu %" PRIu64 " %s)",
           show_n(in, n), consumed, body_bytes, k, c, whole.body_bytes, whole.why ? whole.why : "");
}

/* The whole input is the body. */
static void body_ok(const char *in, uint64_t body_bytes) {
        body_ok_n(in, strlen(in), strlen(in), body_bytes);
}

static void body_bad_n(const char *in, size_t n, int code, const char *why) {
        size_t c;
        bool agree;
        int k = feed_all(in, n, &c, &agree);

        ok(k == code && agree && c < n && whole.why && strstr(whole.why, why),
           "body \"%s\" refused: %s (got %d %s)", show_n(in, n), why, k, whole.why ? whole.why : "");
}

#define BAD(in, code, why) body_bad_n(in, sizeof(in) - 1, code, why)

/* ------------------------------------------------------------- the tests */

static void test_bodies(void) {
        body_ok("0\r\n\r\n", 0);
        body_ok("5\r\nhello\r\n0\r\n\r\n", 5);
        body_ok("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 11);
        body_ok("A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n", 20);
        body_ok("0005\r\nhello\r\n000\r\n\r\n", 5);
        body_ok("0000000000000005\r\nhello\r\n0000000000000000\r\n\r\n", 5);
        ok(whole.n_chunks == 1, "leading zeros: one chunk");

        /* chunk data is opaque: CRLF, "0\r\n\r\n", NUL, bare LF inside it */
        body_ok("7\r\n0\r\n\r\nxx\r\n0\r\n\r\n", 7);
        body_ok_n("4\r\n\0\n\r\xff\r\n0\r\n\r\n", 14, 14, 4);

        /* extensions: token and quoted-string values, several per line */
        body_ok("5;name\r\nhello\r\n0;last\r\n\r\n", 5);
        body_ok("5;a=b;c=\"q s\";d=\"\"\r\nhello\r\n0\r\n\r\n", 5);
        body_ok("5;a=\"\\\"x\\\\\";b=!#$%&'*+-.^_`|~\r\nhello\r\n0\r\n\r\n", 5);
        body_ok("5;a=\"\t\xc3\xa9\"\r\nhello\r\n0\r\n\r\n", 5);

        /* trailers */
        body_ok("0\r\nX-Checksum: abc\r\n\r\n", 0);
        body_ok("3\r\nabc\r\n0\r\nA: 1\r\nB:\r\nC:\tx y \xc3\xa9\t\r\n\r\n", 3);
        ok(whole.n_trailers == 3, "three trailer fields counted");

        /* what follows the body is not consumed: the next request, or a
         * smuggled one */
        static const char next[] = "5\r\nhello\r\n0\r\n\r\nGET http://b.test/ HTTP/1.1\r\n\r\n";
        body_ok_n(next, sizeof next - 1, 15, 5);
        static const char next2[] = "0\r\nX: y\r\n\r\n0\r\n\r\n";
        body_ok_n(next2, sizeof next2 - 1, 11, 0);

        /* DONE is sticky */
        size_t c = 99;
        int k = chunked_feed(&whole, "0\r\n\r\n", 5, &c);
        ok(k == CHUNKED_DONE && c == 0, "feeding after DONE consumes nothing");

        /* the count moves as data comes in */
        chunked p;
        chunked_init(&p);
        k = chunked_feed(&p, "a\r\n01234", 8, &c);
        ok(k == CHUNKED_NEED_MORE && c == 8 && p.body_bytes == 5 && p.n_chunks == 1,
           "payload counted mid-chunk");
        k = chunked_feed(&p, NULL, 0, &c);
        ok(k == CHUNKED_NEED_MORE && c == 0, "an empty feed takes nothing");
        k = chunked_feed(&p, "56789\r\n", 7, NULL);
        ok(k == CHUNKED_NEED_MORE && p.body_bytes == 10, "ret_consumed may be NULL");

        /* the largest size: 2^63 - 1 is framed (only its head is fed) */
        chunked_init(&p);
        k = chunked_feed(&p, "7fffffffffffffff\r\nxyz", 21, &c);
        ok(k == CHUNKED_NEED_MORE && c == 21 && p.body_bytes == 3,
           "chunk size 7fffffffffffffff accepted");
}

static void test_line_endings(void) {
        BAD("5\nhello\r\n0\r\n\r\n", -EINVAL, "bare LF");
        BAD("5;a=b\nhello\r\n0\r\n\r\n", -EINVAL, "bare LF");
        BAD("5;a=\"b\nc\"\r\nhello\r\n0\r\n\r\n", -EINVAL, "bare LF");
        BAD("0\n\r\n", -EINVAL, "bare LF");
        BAD("0\r\n\n", -EINVAL, "bare LF");
        BAD("0\r\nX: y\n\r\n", -EINVAL, "bare LF");
        BAD("\n", -EINVAL, "bare LF");
        BAD("5\rhello\r\n0\r\n\r\n", -EINVAL, "CR not followed by LF");
        BAD("5\r\r\nhello\r\n0\r\n\r\n", -EINVAL, "CR not followed by LF");
        BAD("0\r\n\rX", -EINVAL, "CR not followed by LF");
        BAD("0\r\nX: y\rz\r\n\r\n", -EINVAL, "CR not followed by LF");
        BAD("0\r\nX: y\r\r\n\r\n", -EINVAL, "CR not followed by LF");

        /* chunk-data must be followed by exactly CRLF */
        BAD("5\r\nhelloX\r\n0\r\n\r\n", -EINVAL, "chunk data not followed by CRLF");
        BAD("5\r\nhello0\r\n\r\n", -EINVAL, "chunk data not followed by CRLF");
        BAD("5\r\nhello\n0\r\n\r\n", -EINVAL, "chunk data not followed by CRLF");
        BAD("5\r\nhello\r0\r\n\r\n", -EINVAL, "chunk data not followed by CRLF");
        BAD("3\r\nhello\r\n0\r\n\r\n", -EINVAL, "chunk data not followed by CRLF");

        /* an error says how far it got: the bytes before the refused one */
        size_t c = 99;
        chunked p;
        chunked_init(&p);
        int k = chunked_feed(&p, "5\nhello", 7, &c);
        ok(k == -EINVAL && c == 1, "error consumed the bytes before the refused one (%zu)", c);
        k = chunked_feed(&p, "0\r\n\r\n", 5, &c);
        ok(k == -EINVAL && c == 0 && streq(p.why, "bare LF line ending"),
           "errors are sticky and consume nothing");
}

static void test_sizes(void) {
        /* only 1*HEXDIG */
        BAD("0x10\r\n", -EINVAL, "not a hex number");
        BAD("+5\r\nhello\r\n0\r\n\r\n", -EINVAL, "not a hex number");
        BAD("-5\r\n", -EINVAL, "not a hex number");
        BAD("5g\r\n", -EINVAL, "not a hex number");
        BAD("\r\n", -EINVAL, "not a hex number");
        BAD(";a\r\n", -EINVAL, "not a hex number");
        BAD("\xef\xbc\x95\r\n", -EINVAL, "not a hex number"); /* fullwidth 5 */

        /* no whitespace anywhere, not even BWS before ';' */
        BAD(" 5\r\nhello\r\n0\r\n\r\n", -EINVAL, "whitespace");
        BAD("\t5\r\n", -EINVAL, "whitespace");
        BAD("5 \r\nhello\r\n0\r\n\r\n", -EINVAL, "whitespace");
        BAD("5 ;a\r\n", -EINVAL, "whitespace");
        BAD("5\t;a\r\n", -EINVAL, "whitespace");
        BAD("5; a\r\n", -EINVAL, "whitespace");
        BAD("5;a =b\r\n", -EINVAL, "whitespace");
        BAD("5;a= b\r\n", -EINVAL, "whitespace");
        BAD("5;a=b \r\n", -EINVAL, "whitespace");
        BAD("5;a=\"b\" \r\n", -EINVAL, "whitespace");
        BAD("5 5\r\n", -EINVAL, "whitespace");

        /* bounds: 16 digits, below 2^63 */
        BAD("ffffffffffffffffff\r\n", -E2BIG, "chunk size over");
        BAD("8000000000000000\r\n", -E2BIG, "chunk size over 2^63-1");
        BAD("ffffffffffffffff\r\n", -E2BIG, "chunk size over 2^63-1");
        BAD("00000000000000005\r\nhello\r\n0\r\n\r\n", -E2BIG, "over 16 hex digits");
        BAD("00000000000000000\r\n\r\n", -E2BIG, "over 16 hex digits");
        BAD("10000000000000000\r\n", -E2BIG, "chunk size over");
}

static void test_extensions(void) {
        BAD("5;\r\nhello\r\n0\r\n\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;=a\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a=\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a=b=c\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a@b\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a=\"x\"y\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a=\"x\r\n", -EINVAL, "control character in a chunk extension");
        BAD("5;a=\"\\\x01\"\r\n", -EINVAL, "control character in a chunk extension");
        BAD("5;a=\"\x7f\"\r\n", -EINVAL, "control character in a chunk extension");
        BAD("5;a=\xc3\xa9\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a=b,c\r\n", -EINVAL, "malformed chunk extension");
        BAD("5;a\x00\r\n", -EINVAL, "malformed chunk extension");

        /* at most 1024 bytes of extensions on a line */
        static char line[CHUNKED_EXT_MAX + 64];
        size_t o = (size_t) snprintf(line, sizeof line, "5;a=");
        memset(line + o, 'x', CHUNKED_EXT_MAX - o + 1);
        o = CHUNKED_EXT_MAX + 1;
        o += (size_t) snprintf(line + o, sizeof line - o, "\r\nhello\r\n0\r\n\r\n");
        body_ok_n(line, o, o, 5);
        memcpy(line + 1, ";a=x", 4);
        line[CHUNKED_EXT_MAX + 1] = 'x';
        memcpy(line + CHUNKED_EXT_MAX + 2, "\r\nhello\r\n0\r\n\r\n", 14);
        body_bad_n(line, CHUNKED_EXT_MAX + 16, -E2BIG, "chunk extensions over 1024 bytes");
}

static void test_trailers(void) {
        BAD("0\r\nX: a\r\n b\r\n\r\n", -EINVAL, "obs-fold");
        BAD("0\r\nX: a\r\n\tb\r\n\r\n", -EINVAL, "obs-fold");
        BAD("0\r\n X: a\r\n\r\n", -EINVAL, "obs-fold");
        BAD("0\r\nX : a\r\n\r\n", -EINVAL, "whitespace before the colon");
        BAD("0\r\nX\r\n\r\n", -EINVAL, "without a colon");
        BAD("0\r\n: a\r\n\r\n", -EINVAL, "malformed trailer field name");
        BAD("0\r\nX\x80: a\r\n\r\n", -EINVAL, "malformed trailer field name");
        BAD("0\r\nX: a\x01\r\n\r\n", -EINVAL, "control character in a trailer field");
        BAD("0\r\nX: a\x7f\r\n\r\n", -EINVAL, "control character in a trailer field");
        BAD("0\r\nX: a\0b\r\n\r\n", -EINVAL, "control character in a trailer field");

        /* 32 trailer fields pass, 33 do not */
        static char t[CHUNKED_TRAILER_LINE_MAX + 64];
        size_t o = (size_t) snprintf(t, sizeof t, "0\r\n");
        for (int i = 0; i < CHUNKED_TRAILERS_MAX; i++)
                o += (size_t) snprintf(t + o, sizeof t - o, "X-%d: v\r\n", i);
        memcpy(t + o, "\r\n", 2);
        body_ok_n(t, o + 2, o + 2, 0);
        memcpy(t + o, "Y: v\r\n\r\n", 8);
        body_bad_n(t, o + 8, -E2BIG, "more than 32 trailer fields");

        /* a line of 4096 bytes passes, 4097 does not */
        o = (size_t) snprintf(t, sizeof t, "0\r\nX: ");
        memset(t + o, 'v', 3 + CHUNKED_TRAILER_LINE_MAX - o);
        o = 3 + CHUNKED_TRAILER_LINE_MAX;
        memcpy(t + o, "\r\n\r\n", 4);
        body_ok_n(t, o + 4, o + 4, 0);
        t[o] = 'v';
        memcpy(t + o + 1, "\r\n\r\n", 4);
        body_bad_n(t, o + 5, -E2BIG, "trailer field over 4096 bytes");
}

int main(void) {
        test_bodies();
        test_line_endings();
        test_sizes();
        test_extensions();
        test_trailers();
        return tap_done();
}
