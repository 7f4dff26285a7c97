/* SPDX-License-Identifier: Apache-2.0 */
/* The proxy request parsers (lib/egress/proxyreq.c, lib/egress/socks5.c):
 * every request is fed whole and one byte at a time, and both must agree;
 * origin-form heads are also fed in every two-piece split.
 * Hosts go through egress_host_parse_n() as the proxy will pass them. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "egress/policy.h"
#include "egress/proxyreq.h"
#include "egress/socks5.h"
#include "util/macro.h"

/* ------------------------------------------------------------- helpers */

/* Test names are one TAP line: bytes outside printable ASCII as \xNN. */
static const char *show_n(const char *s, size_t n) {
        static char bufs[4][256];
        static int next;
        char *b = bufs[next++ % 4];
        size_t o = 0;
        for (size_t i = 0; i < n && o + 8 < sizeof bufs[0]; i++) {
                unsigned char c = (unsigned char) s[i];
                if (c >= 0x20 && c < 0x7f)
                        b[o++] = (char) c;
                else
                        o += (size_t) snprintf(b + o, sizeof bufs[0] - o, "\\x%02x", c);
        }
        b[o] = 0;
        return b;
}

static proxyreq whole, bytewise;

/* Feed s to both parsers; returns the whole-feed result, and whether the
 * byte-by-byte feed agreed (code, consumed, reason). */
static int feed_both(const char *s, size_t n, size_t *ret_consumed, bool *ret_agree) {
        size_t c1 = 0, c2 = 0, c;
        int k1, k2 = PROXYREQ_NEED_MORE;

        proxyreq_init(&whole);
        proxyreq_init(&bytewise);
        k1 = proxyreq_feed(&whole, s, n, &c1);
        for (size_t i = 0; i < n && k2 == PROXYREQ_NEED_MORE; i++) {
                k2 = proxyreq_feed(&bytewise, s + i, 1, &c);
                c2 += c;
        }
        *ret_consumed = c1;
        *ret_agree = k1 == k2 && c1 == c2 &&
                (k1 >= 0 || (whole.why && bytewise.why && streq(whole.why, bytewise.why)));
        return k1;
}

static void req_ok(const char *in, const char *method, const char *host, unsigned port,
                   const char *path) {
        size_t n = strlen(in), consumed;
        bool agree;
        int k = feed_both(in, n, &consumed, &agree);
        bool good = k == PROXYREQ_DONE && agree && consumed == whole.head_len &&
                streq(whole.method, method) && streq(whole.host, host) &&
                whole.host_len == strlen(host) && whole.port == port &&
                (path ? whole.path && streq(whole.path, path) && whole.path_len == strlen(path)
                      : whole.path == NULL) &&
                streq(bytewise.host, host) && bytewise.port == port &&
                whole.connect == streq(method, "CONNECT");
        ok(good, "request \"%s\" -> %s %s %u %s (got %d %s)", show_n(in, n), method, host, port,
           path ? path : "-", k, k < 0 ? whole.why : "");
}

static void req_bad(const char *in, size_t n, int code, const char *why_part) {
        size_t consumed;
        bool agree;
        int k = feed_both(in, n, &consumed, &agree);
        ok(k == code && agree && consumed <= n && whole.why && strstr(whole.why, why_part),
           "request \"%s\" refused: %s (got %d %s)", show_n(in, n), why_part, k,
           whole.why ? whole.why : "");
}

#define BAD(in, code, why) req_bad(in, sizeof(in) - 1, code, why)

/* Origin-form mode: fed whole, one byte at a time and in every two-piece
 * split; all must give the same code, consumed count, reason and results. */
static proxyreq split;

static bool same_answer(const proxyreq *a, const proxyreq *b, int ka, int kb, size_t ca, size_t cb) {
        if (ka != kb || ca != cb)
                return false;
        if (ka < 0)
                return a->why && b->why && streq(a->why, b->why);
        if (ka == PROXYREQ_NEED_MORE)
                return true;
        return a->origin_form == b->origin_form && a->connect == b->connect &&
                streq(a->method, b->method) && streq(a->host, b->host) &&
                a->host_len == b->host_len && a->port == b->port && a->path_len == b->path_len &&
                streq(a->path, b->path) && a->n_headers == b->n_headers &&
                a->has_content_length == b->has_content_length &&
                a->content_length == b->content_length && a->chunked == b->chunked &&
                a->head_len == b->head_len;
}

static int origin_feed(const char *s, size_t n, size_t *ret_consumed, bool *ret_agree) {
        size_t c1 = 0, c2 = 0, c;
        int k1, k2 = PROXYREQ_NEED_MORE;
        bool agree;

        proxyreq_init_origin(&whole);
        proxyreq_init_origin(&bytewise);
        k1 = proxyreq_feed(&whole, s, n, &c1);
        for (size_t i = 0; i < n && k2 == PROXYREQ_NEED_MORE; i++) {
                k2 = proxyreq_feed(&bytewise, s + i, 1, &c);
                c2 += c;
        }
        agree = same_answer(&whole, &bytewise, k1, k2, c1, c2);
        for (size_t cut = 1; cut < n && agree; cut++) {
                size_t a = 0, b = 0;
                int k;
                proxyreq_init_origin(&split);
                k = proxyreq_feed(&split, s, cut, &a);
                if (k == PROXYREQ_NEED_MORE)
                        k = proxyreq_feed(&split, s + cut, n - cut, &b);
                agree = same_answer(&whole, &split, k1, k, c1, a + b);
        }
        *ret_consumed = c1;
        *ret_agree = agree;
        return k1;
}

static void origin_ok(const char *in, const char *method, const char *host, unsigned port,
                      const char *path) {
        size_t n = strlen(in), consumed;
        bool agree;
        int k = origin_feed(in, n, &consumed, &agree);
        bool good = k == PROXYREQ_DONE && agree && consumed == whole.head_len &&
                whole.origin_form && !whole.connect && streq(whole.method, method) &&
                streq(whole.host, host) && whole.host_len == strlen(host) && whole.port == port &&
                whole.path && streq(whole.path, path) && whole.path_len == strlen(path);
        ok(good, "origin-form \"%s\" -> %s %s %u %s (got %d %s)", show_n(in, n), method, host, port,
           path, k, k < 0 ? whole.why : "");
}

static void origin_bad(const char *in, size_t n, int code, const char *why_part) {
        size_t consumed;
        bool agree;
        int k = origin_feed(in, n, &consumed, &agree);
        ok(k == code && agree && consumed <= n && whole.why && strstr(whole.why, why_part),
           "origin-form \"%s\" refused: %s (got %d %s)", show_n(in, n), why_part, k,
           whole.why ? whole.why : "");
}

#define OBAD(in, code, why) origin_bad(in, sizeof(in) - 1, code, why)

/* ------------------------------------------------------------- HTTP heads */

static void test_http_happy(void) {
        egress_host h;
        size_t consumed;
        bool agree;

        req_ok("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "CONNECT",
               "example.com", 443, NULL);
        req_ok("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n", "CONNECT", "[2001:db8::1]", 8443, NULL);
        req_ok("CONNECT 10.0.0.1:1 HTTP/1.0\r\n\r\n", "CONNECT", "10.0.0.1", 1, NULL);
        req_ok("CONNECT a.test:65535 HTTP/1.1\r\n\r\n", "CONNECT", "a.test", 65535, NULL);
        req_ok("GET http://example.com/a?b=c HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t\r\n\r\n",
               "GET", "example.com", 80, "/a?b=c");
        req_ok("POST http://Example.COM:8080/x HTTP/1.1\r\nHost: example.com:8080\r\n"
               "Content-Length: 5\r\n\r\n",
               "POST", "Example.COM", 8080, "/x");
        req_ok("GET http://example.com HTTP/1.0\r\n\r\n", "GET", "example.com", 80, "/");
        req_ok("GET http://example.com?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n", "GET",
               "example.com", 80, "/?q=1");
        req_ok("GET HTTP://example.com:80/ HTTP/1.1\r\nHost: example.com\r\n\r\n", "GET",
               "example.com", 80, "/");
        req_ok("DELETE http://[::1]:81/r HTTP/1.1\r\nHost: [::1]:81\r\n\r\n", "DELETE", "[::1]", 81,
               "/r");
        req_ok("PATCH http://127.1/ HTTP/1.1\r\nHost: 127.1\r\nX-Empty:\r\n\r\n", "PATCH", "127.1",
               80, "/");

        /* the host text goes to egress_host_parse_n() */
        feed_both("GET http://127.1:81/ HTTP/1.1\r\nHost: 127.1:81\r\n\r\n", 49, &consumed, &agree);
        ok(egress_host_parse_n(whole.host, whole.host_len, &h) == 0 && h.kind == EGRESS_HOST_IPV4 &&
                   streq(h.text, "127.0.0.1"),
           "absolute-form host 127.1 -> egress host 127.0.0.1");
        feed_both("CONNECT [2001:DB8::1]:443 HTTP/1.1\r\n\r\n", 38, &consumed, &agree);
        ok(egress_host_parse_n(whole.host, whole.host_len, &h) == 0 && h.kind == EGRESS_HOST_IPV6 &&
                   streq(h.text, "2001:db8::1"),
           "CONNECT host [2001:DB8::1] -> egress host 2001:db8::1");
        feed_both("CONNECT Example.COM.:443 HTTP/1.1\r\n\r\n", 37, &consumed, &agree);
        ok(egress_host_parse_n(whole.host, whole.host_len, &h) == 0 && h.kind == EGRESS_HOST_NAME &&
                   streq(h.text, "example.com"),
           "CONNECT host Example.COM. -> egress host example.com");
        feed_both("CONNECT a%2e.test:443 HTTP/1.1\r\n\r\n", 34, &consumed, &agree);
        ok(whole.done && egress_host_parse_n(whole.host, whole.host_len, &h) == -EINVAL,
           "CONNECT host with '%%' framed, refused by egress_host_parse_n");

        /* what follows the head is not consumed; DONE is sticky */
        static const char tls[] = "CONNECT a.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01";
        size_t c = 99;
        int k = feed_both(tls, sizeof tls - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && consumed == sizeof tls - 4 && whole.head_len == consumed,
           "CONNECT followed by TLS bytes: head only consumed (%zu)", consumed);
        k = proxyreq_feed(&whole, "x", 1, &c);
        ok(k == PROXYREQ_DONE && c == 0, "feeding after DONE consumes nothing");

        static const char post[] = "POST http://a.test/u HTTP/1.1\r\nHost: a.test\r\n"
                                   "Content-Length: 5\r\ncontent-length:  5\t\r\n\r\nhello";
        k = feed_both(post, sizeof post - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.has_content_length && whole.content_length == 5 &&
                   !whole.chunked && consumed == sizeof post - 6,
           "POST with equal duplicate Content-Length, body left unconsumed");

        static const char chunk[] = "POST http://a.test/u HTTP/1.1\r\nHost: a.test\r\n"
                                    "Transfer-Encoding: Chunked\r\n\r\n";
        k = feed_both(chunk, sizeof chunk - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.chunked && !whole.has_content_length,
           "POST with Transfer-Encoding: chunked");

        /* header values: whitespace trimmed, HTAB and obs-text kept */
        static const char hdr[] = "GET http://a.test/ HTTP/1.1\r\nHost:a.test\r\n"
                                  "X-A: \t one\ttwo \xc3\xa9  \r\n\r\n";
        k = feed_both(hdr, sizeof hdr - 1, &consumed, &agree);
        const proxyreq_header *xa = proxyreq_find_header(&whole, "x-a");
        ok(k == PROXYREQ_DONE && agree && xa && streq(xa->value, "one\ttwo \xc3\xa9") &&
                   xa->value_len == 10 && streq(xa->name, "X-A") && whole.n_headers == 2,
           "header value trimmed, inner HTAB and obs-text kept");
}

static void test_http_helpers(void) {
        static const char req[] = "GET http://a.test/ HTTP/1.1\r\n"
                                  "Host: a.test\r\n"
                                  "Proxy-Authorization: Basic dXNlcjpwYXNz\r\n"
                                  "Connection: keep-alive, X-Secret\r\n"
                                  "X-Secret: 1\r\n"
                                  "Proxy-Connection: keep-alive\r\n"
                                  "Keep-Alive: 5\r\n"
                                  "TE: trailers\r\n"
                                  "Upgrade: h2c\r\n"
                                  "Accept: */*\r\n"
                                  "Content-Length: 0\r\n"
                                  "\r\n";
        size_t consumed;
        bool agree;
        int k = feed_both(req, sizeof req - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree, "request with hop-by-hop headers parses");
        const proxyreq_header *pa = proxyreq_proxy_authorization(&whole);
        ok(pa && streq(pa->value, "Basic dXNlcjpwYXNz"), "Proxy-Authorization found");
        static const bool hop[] = { false, true, true, true, true, true, true, true, false, false };
        for (size_t i = 0; i < ELEMENTSOF(hop); i++)
                ok(proxyreq_header_is_hop_by_hop(&whole, i) == hop[i], "header %s hop-by-hop: %s",
                   whole.headers[i].name, hop[i] ? "yes" : "no");
        ok(!proxyreq_header_is_hop_by_hop(&whole, 99), "index out of range is not hop-by-hop");
        ok(proxyreq_find_header(&whole, "x-missing") == NULL, "missing header: NULL");

        feed_both("CONNECT a.test:443 HTTP/1.1\r\n\r\n", 31, &consumed, &agree);
        ok(proxyreq_proxy_authorization(&whole) == NULL, "no Proxy-Authorization: NULL");
}

static void test_http_limits(void) {
        static char big[PROXYREQ_HEAD_MAX + 64];
        size_t o = 0;

        /* 100 headers pass, 101 do not */
        o = (size_t) snprintf(big, sizeof big, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n");
        for (int i = 1; i < PROXYREQ_HEADERS_MAX; i++)
                o += (size_t) snprintf(big + o, sizeof big - o, "X-%d: v\r\n", i);
        memcpy(big + o, "\r\n", 3);
        size_t consumed;
        bool agree;
        int k = feed_both(big, o + 2, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.n_headers == 100, "100 headers accepted");
        o += (size_t) snprintf(big + o, sizeof big - o, "X-last: v\r\n\r\n");
        req_bad(big, o, -E2BIG, "more than 100 headers");

        /* a head of exactly 16 KiB passes, one byte more does not */
        o = (size_t) snprintf(big, sizeof big, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: ");
        memset(big + o, 'a', PROXYREQ_HEAD_MAX - o - 4);
        memcpy(big + PROXYREQ_HEAD_MAX - 4, "\r\n\r\n", 4);
        k = feed_both(big, PROXYREQ_HEAD_MAX, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.head_len == PROXYREQ_HEAD_MAX,
           "head of exactly 16 KiB accepted");
        memset(big + o, 'a', PROXYREQ_HEAD_MAX - o - 3);
        memcpy(big + PROXYREQ_HEAD_MAX - 3, "\r\n\r\n", 4);
        req_bad(big, PROXYREQ_HEAD_MAX + 1, -E2BIG, "over 16 KiB");

        /* a host longer than egress_host_parse_n() reads */
        o = (size_t) snprintf(big, sizeof big, "CONNECT ");
        memset(big + o, 'a', 256);
        o += 256;
        o += (size_t) snprintf(big + o, sizeof big - o, ":443 HTTP/1.1\r\n\r\n");
        req_bad(big, o, -EINVAL, "host over 255 bytes");
}

static void test_http_refusals(void) {
        /* line endings */
        BAD("GET http://a.test/ HTTP/1.1\nHost: a.test\n\n", -EINVAL, "bare LF");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\n\r\n", -EINVAL, "bare LF");
        BAD("GET http://a.test/ HTTP/1.1\r\nX: a\rb\r\n\r\n", -EINVAL, "CR not followed by LF");
        BAD("GET http://a.test/ HTTP/1.1\r\r\n", -EINVAL, "CR not followed by LF");
        BAD("\r\nGET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "empty request line");
        BAD("\n", -EINVAL, "bare LF");

        /* obs-fold */
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: a\r\n b\r\n\r\n", -EINVAL,
            "obs-fold");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-A: a\r\n\tb\r\n\r\n", -EINVAL,
            "obs-fold");
        BAD("GET http://a.test/ HTTP/1.1\r\n Host: a.test\r\n\r\n", -EINVAL, "obs-fold");

        /* body framing */
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n"
            "Transfer-Encoding: chunked\r\n\r\n",
            -EINVAL, "both Content-Length and Transfer-Encoding");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
            "Content-Length: 3\r\n\r\n",
            -EINVAL, "both Content-Length and Transfer-Encoding");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n"
            "Content-Length: 4\r\n\r\n",
            -EINVAL, "Content-Length headers disagree");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3, 3\r\n\r\n", -EINVAL,
            "Content-Length is not a number");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: +3\r\n\r\n", -EINVAL,
            "Content-Length is not a number");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: -1\r\n\r\n", -EINVAL,
            "Content-Length is not a number");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length:\r\n\r\n", -EINVAL,
            "Content-Length is not a number");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\n"
            "Content-Length: 1234567890123456789\r\n\r\n",
            -EINVAL, "Content-Length is not a number");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            -EINVAL, "Transfer-Encoding other than chunked");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: identity\r\n\r\n",
            -EINVAL, "Transfer-Encoding other than chunked");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            -EINVAL, "Transfer-Encoding other than chunked");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: xchunked\r\n\r\n",
            -EINVAL, "Transfer-Encoding other than chunked");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
            "Transfer-Encoding: chunked\r\n\r\n",
            -EINVAL, "more than one Transfer-Encoding");
        BAD("POST http://a.test/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", -EINVAL,
            "Transfer-Encoding in an HTTP/1.0 request");
        BAD("CONNECT a.test:443 HTTP/1.1\r\nContent-Length: 1\r\n\r\n", -EINVAL,
            "CONNECT with a body");
        BAD("CONNECT a.test:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", -EINVAL,
            "CONNECT with a body");
        BAD("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: Content-Length\r\n"
            "Content-Length: 1\r\n\r\n",
            -EINVAL, "Connection header names a framing header");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close, host\r\n\r\n",
            -EINVAL, "Connection header names a framing header");

        /* header syntax */
        BAD("GET http://a.test/ HTTP/1.1\r\nHost : a.test\r\n\r\n", -EINVAL,
            "whitespace before the colon");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost\t: a.test\r\n\r\n", -EINVAL,
            "whitespace before the colon");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n: v\r\n\r\n", -EINVAL,
            "empty header name");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nNo-colon\r\n\r\n", -EINVAL,
            "malformed header name");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX\"y: v\r\n\r\n", -EINVAL,
            "malformed header name");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX\xc3\xa9: v\r\n\r\n", -EINVAL,
            "malformed header name");

        /* control characters and NUL anywhere */
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: a\x01\r\n\r\n", -EINVAL,
            "control character");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: a\x7f\r\n\r\n", -EINVAL,
            "control character");
        BAD("GET http://a.test/\x1b HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "control character");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\0\r\n\r\n", -EINVAL, "NUL byte");
        BAD("CONNECT a.test\0.evil:443 HTTP/1.1\r\n\r\n", -EINVAL, "NUL byte");
        BAD("GET\thttp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "malformed method");
        BAD("GET http://a.test/\t HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
            "malformed request target");
        BAD("GET http://a.test/\xc3\xa9 HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
            "malformed request target");

        /* request line */
        BAD("GET  http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
            "malformed request target");
        BAD("GET http://a.test/  HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
            "malformed HTTP version");
        BAD("GET http://a.test/ HTTP/1.1 \r\nHost: a.test\r\n\r\n", -EINVAL,
            "malformed HTTP version");
        BAD("GET http://a.test/\r\nHost: a.test\r\n\r\n", -EINVAL, "malformed request target");
        BAD("GET http://a.test/ http/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "malformed HTTP version");
        BAD("GET http://a.test/ HTTP/2.0\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT,
            "HTTP version other than 1.0 or 1.1");
        BAD("GET http://a.test/ HTTP/1.2\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT,
            "HTTP version other than 1.0 or 1.1");
        BAD("GET http://a.test/ HTTP/0.9\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT,
            "HTTP version other than 1.0 or 1.1");
        BAD("CONNECT a.test:443 HTTP/3.0\r\n\r\n", -EPROTONOSUPPORT,
            "HTTP version other than 1.0 or 1.1");
        BAD("GETTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT http://a.test/ HTTP/1.1\r\n\r\n", -EINVAL,
            "method over 32 bytes");

        /* request targets */
        BAD("GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "origin-form");
        BAD("OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "not absolute-form");
        BAD("GET a.test:80 HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "not absolute-form");
        BAD("GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT, "use CONNECT");
        BAD("GET HTTPS://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT, "use CONNECT");
        BAD("GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT,
            "scheme other than http");
        BAD("GET http://a.test/#f HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "fragment");
        BAD("GET http:///x HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "empty authority");
        BAD("GET http://:80/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "empty host");

        /* userinfo */
        BAD("GET http://u:p@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "userinfo");
        BAD("GET http://a.test@b.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n", -EINVAL, "userinfo");
        BAD("CONNECT u@a.test:443 HTTP/1.1\r\n\r\n", -EINVAL, "userinfo");
        BAD("CONNECT a.test:443@b.test:443 HTTP/1.1\r\n\r\n", -EINVAL, "userinfo");

        /* Host against the target */
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n", -EINVAL, "Host header disagrees");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test:8080\r\n\r\n", -EINVAL,
            "Host header disagrees");
        BAD("GET http://a.test:8080/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
            "Host header disagrees");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test.\r\n\r\n", -EINVAL, "Host header disagrees");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: u@a.test\r\n\r\n", -EINVAL,
            "malformed Host header");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost:\r\n\r\n", -EINVAL, "malformed Host header");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n", -EINVAL,
            "more than one Host header");
        BAD("GET http://a.test/ HTTP/1.1\r\n\r\n", -EINVAL, "HTTP/1.1 request without Host");
        BAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: a\r\n"
            "proxy-authorization: b\r\n\r\n",
            -EINVAL, "more than one Proxy-Authorization");

        /* CONNECT targets */
        BAD("CONNECT a.test:443/x HTTP/1.1\r\n\r\n", -EINVAL, "CONNECT target with a path");
        BAD("CONNECT a.test:443?x HTTP/1.1\r\n\r\n", -EINVAL, "CONNECT target with a path");
        BAD("CONNECT http://a.test:443/ HTTP/1.1\r\n\r\n", -EINVAL, "CONNECT target with a path");
        BAD("CONNECT a.test HTTP/1.1\r\n\r\n", -EINVAL, "CONNECT without a port");
        BAD("CONNECT [::1] HTTP/1.1\r\n\r\n", -EINVAL, "CONNECT without a port");
        BAD("CONNECT a.test: HTTP/1.1\r\n\r\n", -EINVAL, "empty port");
        BAD("CONNECT ::1:443 HTTP/1.1\r\n\r\n", -EINVAL, "empty host");
        BAD("CONNECT [::1:443 HTTP/1.1\r\n\r\n", -EINVAL, "unclosed '['");
        BAD("CONNECT [::1]443 HTTP/1.1\r\n\r\n", -EINVAL, "unexpected character after the host");

        /* ports */
        BAD("CONNECT a.test:0 HTTP/1.1\r\n\r\n", -EINVAL, "port 0");
        BAD("CONNECT a.test:65536 HTTP/1.1\r\n\r\n", -EINVAL, "port over 65535");
        BAD("CONNECT a.test:99999 HTTP/1.1\r\n\r\n", -EINVAL, "port over 65535");
        BAD("CONNECT a.test:4294967739 HTTP/1.1\r\n\r\n", -EINVAL, "port over 65535");
        BAD("CONNECT a.test:0443 HTTP/1.1\r\n\r\n", -EINVAL, "leading zero");
        BAD("CONNECT a.test:44a HTTP/1.1\r\n\r\n", -EINVAL, "not a decimal number");
        BAD("CONNECT a.test:443:443 HTTP/1.1\r\n\r\n", -EINVAL, "not a decimal number");
        BAD("CONNECT a.test:+443 HTTP/1.1\r\n\r\n", -EINVAL, "not a decimal number");
        BAD("GET http://a.test:0/ HTTP/1.1\r\nHost: a.test:0\r\n\r\n", -EINVAL, "port 0");
        BAD("GET http://a.test:65536/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "port over 65535");
        BAD("GET http://a.test:/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "empty port");

        /* errors are sticky */
        size_t c = 9;
        ok(proxyreq_feed(&whole, "GET", 3, &c) == -EINVAL && c == 0,
           "feeding after an error returns it again and consumes nothing");
}

/* ------------------------------------------------- origin-form heads */

static void test_origin_happy(void) {
        egress_host h;
        size_t consumed;
        bool agree;
        int k;

        origin_ok("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", "GET", "a.test", 0, "/");
        origin_ok("GET /path?q=1&r=%20 HTTP/1.1\r\nHost: api.example.com:443\r\n"
                  "User-Agent: t\r\n\r\n",
                  "GET", "api.example.com", 443, "/path?q=1&r=%20");
        origin_ok("GET /x HTTP/1.0\r\nHost: [2001:db8::1]:8443\r\n\r\n", "GET", "[2001:db8::1]",
                  8443, "/x");
        origin_ok("GET //x/../y HTTP/1.1\r\nhost:\t A.Test. \r\n\r\n", "GET", "A.Test.", 0,
                  "//x/../y");
        origin_ok("PUT /?a HTTP/1.1\r\nX-A: 1\r\nHOST: 127.1:65535\r\n\r\n", "PUT", "127.1", 65535,
                  "/?a");
        origin_ok("OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n", "OPTIONS", "a.test", 0, "*");
        origin_ok("OPTIONS /* HTTP/1.1\r\nHost: a.test\r\n\r\n", "OPTIONS", "a.test", 0, "/*");
        origin_ok("get /x HTTP/1.1\r\nHost: a.test\r\n\r\n", "get", "a.test", 0, "/x");
        /* the path is the origin server's to read, as in absolute-form */
        origin_ok("GET /a\\..\\b;c=%zz HTTP/1.1\r\nHost: a.test\r\n\r\n", "GET", "a.test", 0,
                  "/a\\..\\b;c=%zz");
        /* forward-proxy credentials are parsed like any header (and dropped
         * as hop-by-hop); the target is what counts */
        origin_ok("GET /x HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic eA==\r\n\r\n",
                  "GET", "a.test", 0, "/x");

        /* the host text goes to egress_host_parse_n() */
        static const char v4[] = "GET / HTTP/1.1\r\nHost: 127.1:8443\r\n\r\n";
        origin_feed(v4, sizeof v4 - 1, &consumed, &agree);
        ok(egress_host_parse_n(whole.host, whole.host_len, &h) == 0 && h.kind == EGRESS_HOST_IPV4 &&
                   streq(h.text, "127.0.0.1") && whole.port == 8443,
           "origin-form Host 127.1:8443 -> egress host 127.0.0.1 port 8443");
        static const char pct[] = "GET / HTTP/1.1\r\nHost: a%2e.test\r\n\r\n";
        origin_feed(pct, sizeof pct - 1, &consumed, &agree);
        ok(whole.done && egress_host_parse_n(whole.host, whole.host_len, &h) == -EINVAL,
           "origin-form Host with '%%' framed, refused by egress_host_parse_n");

        /* body framing; the body is left to the caller */
        static const char post[] = "POST /u HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n"
                                   "content-length: 5\r\n\r\nhello";
        k = origin_feed(post, sizeof post - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.has_content_length && whole.content_length == 5 &&
                   !whole.chunked && consumed == sizeof post - 6 && whole.head_len == consumed,
           "origin-form POST with Content-Length, body left unconsumed");
        static const char chunk[] = "POST /u HTTP/1.1\r\nHost: a.test\r\n"
                                    "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        k = origin_feed(chunk, sizeof chunk - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.chunked && !whole.has_content_length &&
                   consumed == sizeof chunk - 1 - strlen("5\r\nhello\r\n0\r\n\r\n"),
           "origin-form POST with Transfer-Encoding: chunked, body left unconsumed");
        k = origin_feed("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", 32, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && !whole.has_content_length && !whole.chunked,
           "origin-form GET without a body");

        /* hop-by-hop classification is the same as in the forward mode */
        static const char hop_req[] = "GET /x HTTP/1.1\r\n"
                                      "Host: a.test\r\n"
                                      "Connection: keep-alive, X-Secret\r\n"
                                      "X-Secret: 1\r\n"
                                      "Keep-Alive: 5\r\n"
                                      "Upgrade: websocket\r\n"
                                      "Transfer-Encoding: chunked\r\n"
                                      "Accept: */*\r\n"
                                      "\r\n";
        static const bool hop[] = { false, true, true, true, true, false, false };
        k = origin_feed(hop_req, sizeof hop_req - 1, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.n_headers == ELEMENTSOF(hop),
           "origin-form request with hop-by-hop headers parses");
        for (size_t i = 0; i < ELEMENTSOF(hop); i++)
                ok(proxyreq_header_is_hop_by_hop(&whole, i) == hop[i],
                   "origin-form header %s hop-by-hop: %s", whole.headers[i].name,
                   hop[i] ? "yes" : "no");
        const proxyreq_header *hh = proxyreq_find_header(&whole, "HOST");
        ok(hh && streq(hh->value, "a.test"), "origin-form Host header found");
}

/* Keep-alive: one head after another on the same stream, each parsed by a
 * fresh proxyreq_init_origin(). */
static void test_origin_keepalive(void) {
        static const char two[] = "POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\n"
                                  "abc"
                                  "GET /b?c HTTP/1.1\r\nHost: a.test:443\r\n\r\n"
                                  "GET /c HTTP/1.1\r\n";
        proxyreq r;
        size_t c = 0, off = 0;
        int k;

        proxyreq_init_origin(&r);
        k = proxyreq_feed(&r, two, sizeof two - 1, &c);
        ok(k == PROXYREQ_DONE && streq(r.path, "/a") && r.content_length == 3 && c == r.head_len,
           "keep-alive: first head done, %zu bytes", c);
        off = c + r.content_length;
        k = proxyreq_feed(&r, two + off, sizeof two - 1 - off, &c);
        ok(k == PROXYREQ_DONE && c == 0, "keep-alive: DONE sticky until re-initialised");

        proxyreq_init_origin(&r);
        ok(r.origin_form && !r.done && r.n_headers == 0 && r.path == NULL,
           "proxyreq_init_origin() resets the state and keeps the mode");
        k = proxyreq_feed(&r, two + off, sizeof two - 1 - off, &c);
        ok(k == PROXYREQ_DONE && streq(r.path, "/b?c") && streq(r.host, "a.test") &&
                   r.port == 443 && !r.has_content_length,
           "keep-alive: second head done");
        off += c;
        proxyreq_init_origin(&r);
        k = proxyreq_feed(&r, two + off, sizeof two - 1 - off, &c);
        ok(k == PROXYREQ_NEED_MORE && off + c == sizeof two - 1,
           "keep-alive: third head incomplete, need more");

        /* a stray CRLF between requests (RFC 9112 §2.2 "SHOULD ignore") is
         * refused, as in the forward mode */
        OBAD("\r\nGET / HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "empty request line");

        /* the two modes are separate */
        proxyreq_init(&r);
        ok(!r.origin_form, "proxyreq_init() is the forward mode");
        k = proxyreq_feed(&r, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", 32, &c);
        ok(k == -EINVAL && strstr(r.why, "origin-form target"),
           "forward mode still refuses origin-form");
}

static void test_origin_refusals(void) {
        static char big[PROXYREQ_HEAD_MAX + 64];
        size_t o, consumed;
        bool agree;
        int k;

        /* a second destination inside the tunnel */
        OBAD("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", -EINVAL,
             "CONNECT inside an intercepted tunnel");
        OBAD("CONNECT b.test:443 HTTP/1.1\r\n\r\n", -EINVAL, "CONNECT inside an intercepted tunnel");
        OBAD("CONNECT / HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "CONNECT inside an intercepted tunnel");
        OBAD("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "absolute-form inside an intercepted tunnel");
        OBAD("GET https://b.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "absolute-form inside an intercepted tunnel");
        OBAD("GET HTTP://a.test HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "absolute-form inside an intercepted tunnel");
        OBAD("GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "absolute-form inside an intercepted tunnel");
        OBAD("GET a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "request target is not origin-form");
        OBAD("GET x HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "request target is not origin-form");
        OBAD("GET ?x HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "request target is not origin-form");
        OBAD("OPTIONS *x HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "request target is not origin-form");
        OBAD("OPTIONS */ HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "request target is not origin-form");
        OBAD("GET * HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "'*' target with a method other than OPTIONS");
        OBAD("options * HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL,
             "'*' target with a method other than OPTIONS");
        OBAD("GET /a#f HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "fragment in the request target");

        /* Host: required, one, a plain authority */
        OBAD("GET / HTTP/1.1\r\n\r\n", -EINVAL, "origin-form request without Host");
        OBAD("GET / HTTP/1.0\r\n\r\n", -EINVAL, "origin-form request without Host");
        OBAD("GET / HTTP/1.1\r\nX-Host: a.test\r\n\r\n", -EINVAL, "origin-form request without Host");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n", -EINVAL,
             "more than one Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\r\nhost: b.test\r\n\r\n", -EINVAL,
             "more than one Host header");
        OBAD("GET / HTTP/1.1\r\nHost:\r\n\r\n", -EINVAL, "empty Host header");
        OBAD("GET / HTTP/1.1\r\nHost:  \t \r\n\r\n", -EINVAL, "empty Host header");
        OBAD("GET / HTTP/1.1\r\nHost: u@a.test\r\n\r\n", -EINVAL, "userinfo ('@') in the Host");
        OBAD("GET / HTTP/1.1\r\nHost: u:p@a.test:443\r\n\r\n", -EINVAL, "userinfo");
        OBAD("GET / HTTP/1.1\r\nHost: a.test@b.test\r\n\r\n", -EINVAL, "userinfo");
        OBAD("GET / HTTP/1.1\r\nHost: a.test, b.test\r\n\r\n", -EINVAL,
             "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test,b.test\r\n\r\n", -EINVAL,
             "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a test\r\n\r\n", -EINVAL, "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a\ttest\r\n\r\n", -EINVAL, "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test/x\r\n\r\n", -EINVAL, "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test?x\r\n\r\n", -EINVAL, "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test#x\r\n\r\n", -EINVAL, "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\\b.test\r\n\r\n", -EINVAL,
             "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.t\xc3\xa9st\r\n\r\n", -EINVAL,
             "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: \"a.test\"\r\n\r\n", -EINVAL,
             "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test;b\r\n\r\n", -EINVAL, "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\x01\r\n\r\n", -EINVAL, "control character");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\0\r\n\r\n", -EINVAL, "NUL byte");
        OBAD("GET / HTTP/1.1\r\nHost: http://a.test\r\n\r\n", -EINVAL,
             "bad character in the Host header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test:\r\n\r\n", -EINVAL, "empty port");
        OBAD("GET / HTTP/1.1\r\nHost: a.test:0\r\n\r\n", -EINVAL, "port 0");
        OBAD("GET / HTTP/1.1\r\nHost: a.test:0443\r\n\r\n", -EINVAL, "leading zero");
        OBAD("GET / HTTP/1.1\r\nHost: a.test:65536\r\n\r\n", -EINVAL, "port over 65535");
        OBAD("GET / HTTP/1.1\r\nHost: a.test:443:443\r\n\r\n", -EINVAL, "not a decimal number");
        OBAD("GET / HTTP/1.1\r\nHost: a.test:44a\r\n\r\n", -EINVAL, "not a decimal number");
        OBAD("GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", -EINVAL, "empty host");
        OBAD("GET / HTTP/1.1\r\nHost: :443\r\n\r\n", -EINVAL, "empty host");
        OBAD("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", -EINVAL, "unclosed '['");
        OBAD("GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", -EINVAL,
             "unexpected character after the host");
        OBAD("GET / HTTP/1.1\r\nHost : a.test\r\n\r\n", -EINVAL, "whitespace before the colon");
        OBAD("GET / HTTP/1.1\r\nConnection: host\r\nHost: a.test\r\n\r\n", -EINVAL,
             "Connection header names a framing header");

        /* smuggling shapes: the same refusals as the forward mode */
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n"
             "Transfer-Encoding: chunked\r\n\r\n",
             -EINVAL, "both Content-Length and Transfer-Encoding");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
             "Content-Length: 0\r\n\r\n",
             -EINVAL, "both Content-Length and Transfer-Encoding");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
             -EINVAL, "Content-Length headers disagree");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3, 3\r\n\r\n", -EINVAL,
             "Content-Length is not a number");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0x3\r\n\r\n", -EINVAL,
             "Content-Length is not a number");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
             -EINVAL, "Transfer-Encoding other than chunked");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
             "Transfer-Encoding: chunked\r\n\r\n",
             -EINVAL, "more than one Transfer-Encoding");
        OBAD("POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n", -EINVAL,
             "Transfer-Encoding in an HTTP/1.0 request");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding : chunked\r\n\r\n", -EINVAL,
             "whitespace before the colon");
        OBAD("POST / HTTP/1.1\r\nHost: a.test\r\nConnection: Transfer-Encoding\r\n"
             "Transfer-Encoding: chunked\r\n\r\n",
             -EINVAL, "Connection header names a framing header");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\r\nX: a\r\n b\r\n\r\n", -EINVAL, "obs-fold");
        OBAD("GET / HTTP/1.1\r\n Host: b.test\r\nHost: a.test\r\n\r\n", -EINVAL, "obs-fold");
        OBAD("GET / HTTP/1.1\nHost: a.test\n\n", -EINVAL, "bare LF");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\n\r\n", -EINVAL, "bare LF");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\rX: y\r\n\r\n", -EINVAL, "CR not followed by LF");
        OBAD("GET /\x0b HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "control character");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\r\nX\xc3\xa9: v\r\n\r\n", -EINVAL,
             "malformed header name");
        OBAD("GET  / HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "malformed request target");
        OBAD("GET / HTTP/1.1 \r\nHost: a.test\r\n\r\n", -EINVAL, "malformed HTTP version");
        OBAD("GET /\xc3\xa9 HTTP/1.1\r\nHost: a.test\r\n\r\n", -EINVAL, "malformed request target");
        OBAD("GET / HTTP/1.2\r\nHost: a.test\r\n\r\n", -EPROTONOSUPPORT,
             "HTTP version other than 1.0 or 1.1");
        /* the HTTP/2 connection preface, if a client ignored ALPN */
        OBAD("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", -EPROTONOSUPPORT,
             "HTTP version other than 1.0 or 1.1");
        OBAD("GET / HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: a\r\n"
             "Proxy-Authorization: b\r\n\r\n",
             -EINVAL, "more than one Proxy-Authorization");

        /* limits */
        o = (size_t) snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: a.test\r\n");
        for (int i = 1; i < PROXYREQ_HEADERS_MAX; i++)
                o += (size_t) snprintf(big + o, sizeof big - o, "X-%d: v\r\n", i);
        memcpy(big + o, "\r\n", 3);
        k = origin_feed(big, o + 2, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.n_headers == 100,
           "origin-form: 100 headers accepted");
        o += (size_t) snprintf(big + o, sizeof big - o, "X-last: v\r\n\r\n");
        origin_bad(big, o, -E2BIG, "more than 100 headers");

        o = (size_t) snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: a.test\r\nX: ");
        memset(big + o, 'a', PROXYREQ_HEAD_MAX - o - 3);
        memcpy(big + PROXYREQ_HEAD_MAX - 3, "\r\n\r\n", 4);
        origin_bad(big, PROXYREQ_HEAD_MAX + 1, -E2BIG, "over 16 KiB");

        o = (size_t) snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: ");
        memset(big + o, 'a', 256);
        o += 256;
        o += (size_t) snprintf(big + o, sizeof big - o, ":443\r\n\r\n");
        origin_bad(big, o, -EINVAL, "host over 255 bytes");

        /* errors are sticky */
        size_t c = 9;
        ok(proxyreq_feed(&whole, "GET", 3, &c) == -EINVAL && c == 0,
           "origin-form: feeding after an error returns it again and consumes nothing");

        o = (size_t) snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: ");
        memset(big + o, 'a', 255);
        o += 255;
        o += (size_t) snprintf(big + o, sizeof big - o, ":443\r\n\r\n");
        k = origin_feed(big, o, &consumed, &agree);
        ok(k == PROXYREQ_DONE && agree && whole.host_len == 255 && whole.port == 443,
           "origin-form: 255-byte Host accepted");
}

/* ---------------------------------------------------------------- SOCKS5 */

static socks5 s_whole, s_bytes;

/* Run a whole conversation (greeting then request) through a parser, in
 * chunks of `step` bytes (0: all at once). Returns the final code. */
static int socks_run(socks5 *s, const uint8_t *in, size_t n, size_t step, bool *ret_greeted,
                     size_t *ret_used) {
        size_t off = 0;
        int k = SOCKS5_NEED_MORE;

        socks5_init(s);
        *ret_greeted = false;
        while (off < n) {
                size_t len = step ? MIN(step, n - off) : n - off, c = 0;
                k = socks5_feed(s, in + off, len, &c);
                off += c;
                if (k == SOCKS5_GREETING_DONE) {
                        *ret_greeted = true;
                        continue;
                }
                if (k != SOCKS5_NEED_MORE)
                        break;
        }
        *ret_used = off;
        return k;
}

static int socks_both(const uint8_t *in, size_t n, bool *ret_agree) {
        bool g1, g2;
        size_t u1, u2;
        int k1 = socks_run(&s_whole, in, n, 0, &g1, &u1);
        int k2 = socks_run(&s_bytes, in, n, 1, &g2, &u2);
        *ret_agree = k1 == k2 && g1 == g2 && u1 == u2 && s_whole.reply == s_bytes.reply &&
                s_whole.reply_kind == s_bytes.reply_kind && s_whole.port == s_bytes.port &&
                s_whole.host_len == s_bytes.host_len &&
                memcmp(s_whole.host, s_bytes.host, sizeof s_whole.host) == 0 &&
                memcmp(s_whole.addr, s_bytes.addr, sizeof s_whole.addr) == 0;
        return k1;
}

static void socks_ok(const char *what, const uint8_t *in, size_t n, int kind, const char *text,
                     unsigned port) {
        bool agree;
        egress_host h;
        int k = socks_both(in, n, &agree);
        int hk = k == SOCKS5_REQUEST_DONE ? socks5_host(&s_whole, &h) : -1;
        ok(k == SOCKS5_REQUEST_DONE && agree && s_whole.port == port && hk == 0 &&
                   (int) h.kind == kind && streq(h.text, text),
           "socks5 %s -> %s port %u (got %d, host %d %s)", what, text, port, k, hk,
           hk == 0 ? h.text : "");
}

static void socks_bad(const char *what, const uint8_t *in, size_t n, int code, int reply_kind,
                      uint8_t reply) {
        bool agree;
        int k = socks_both(in, n, &agree);
        ok(k == code && agree && s_whole.reply_kind == reply_kind && s_whole.reply == reply &&
                   s_whole.why,
           "socks5 %s refused (got %d, reply %d/0x%02x: %s)", what, k, s_whole.reply_kind,
           s_whole.reply, s_whole.why ? s_whole.why : "");
}

static void socks_host_bad(const char *what, const uint8_t *in, size_t n) {
        bool agree;
        egress_host h;
        int k = socks_both(in, n, &agree);
        ok(k == SOCKS5_REQUEST_DONE && agree && socks5_host(&s_whole, &h) == -EINVAL,
           "socks5 %s framed, refused by egress_host_parse_n", what);
}

#define S(...) ((const uint8_t[]) { __VA_ARGS__ }), sizeof((const uint8_t[]) { __VA_ARGS__ })

static void test_socks5(void) {
        socks_ok("IPv4", S(5, 1, 0, 5, 1, 0, 1, 93, 184, 216, 34, 1, 187), EGRESS_HOST_IPV4,
                 "93.184.216.34", 443);
        socks_ok("several methods", S(5, 3, 2, 1, 0, 5, 1, 0, 1, 1, 1, 1, 1, 0, 80),
                 EGRESS_HOST_IPV4, "1.1.1.1", 80);
        socks_ok("IPv6",
                 S(5, 1, 0, 5, 1, 0, 4, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                   0x20, 0xfb),
                 EGRESS_HOST_IPV6, "2001:db8::1", 8443);
        socks_ok("IPv4-mapped IPv6",
                 S(5, 1, 0, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1, 0, 22),
                 EGRESS_HOST_IPV4, "10.0.0.1", 22);
        socks_ok("domain",
                 S(5, 1, 0, 5, 1, 0, 3, 11, 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', 'm',
                   0, 80),
                 EGRESS_HOST_NAME, "example.com", 80);
        socks_ok("domain, case and trailing dot",
                 S(5, 1, 0, 5, 1, 0, 3, 7, 'A', '.', 'T', 'e', 's', 't', '.', 0xff, 0xff),
                 EGRESS_HOST_NAME, "a.test", 65535);
        socks_ok("domain that is an IPv4 literal",
                 S(5, 1, 0, 5, 1, 0, 3, 5, '1', '2', '7', '.', '1', 0, 80), EGRESS_HOST_IPV4,
                 "127.0.0.1", 80);

        socks_host_bad("domain with NUL",
                       S(5, 1, 0, 5, 1, 0, 3, 8, 'a', 0, '.', 'e', 'v', 'i', 'l', 'x', 0, 80));
        socks_host_bad("domain with '@'",
                       S(5, 1, 0, 5, 1, 0, 3, 8, 'u', '@', 'a', '.', 't', 'e', 's', 't', 0, 80));
        socks_host_bad("domain with '%'",
                       S(5, 1, 0, 5, 1, 0, 3, 8, 'a', '%', '2', 'e', 't', 'e', 's', 't', 0, 80));
        socks_host_bad("domain with a space", S(5, 1, 0, 5, 1, 0, 3, 3, 'a', ' ', 'b', 0, 80));
        socks_host_bad("domain with CRLF", S(5, 1, 0, 5, 1, 0, 3, 3, 'a', '\r', '\n', 0, 80));
        socks_host_bad("domain 1.2.3.4.5",
                       S(5, 1, 0, 5, 1, 0, 3, 9, '1', '.', '2', '.', '3', '.', '4', '.', '5', 0, 80));

        /* a 255-byte domain: framed; too long a name for egress_host_parse_n */
        uint8_t longd[3 + 5 + 255 + 2];
        memcpy(longd, (uint8_t[]) { 5, 1, 0, 5, 1, 0, 3, 255 }, 8);
        memset(longd + 8, 'a', 255);
        for (size_t i = 8 + 60; i < 8 + 255; i += 61)
                longd[i] = '.';
        longd[8 + 255] = 1;
        longd[8 + 256] = 187;
        socks_host_bad("255-byte domain", longd, sizeof longd);
        ok(s_whole.host_len == 255 && s_bytes.host_len == 255, "255-byte domain kept whole");

        socks_bad("version 4 greeting", S(4, 1, 0, 1, 0, 80, 1, 2, 3, 4, 0), -EPROTO, 0, 0);
        socks_bad("empty method list", S(5, 0), -EPROTO, 1, 0xff);
        socks_bad("only username/password", S(5, 1, 2), -ENOTSUP, 1, 0xff);
        socks_bad("only GSSAPI and 0x80", S(5, 2, 1, 0x80), -ENOTSUP, 1, 0xff);
        socks_bad("BIND", S(5, 1, 0, 5, 2, 0, 1, 1, 2, 3, 4, 0, 80), -ENOTSUP, 2, 0x07);
        socks_bad("UDP ASSOCIATE", S(5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0), -ENOTSUP, 2, 0x07);
        socks_bad("command 0", S(5, 1, 0, 5, 0, 0, 1, 1, 2, 3, 4, 0, 80), -ENOTSUP, 2, 0x07);
        socks_bad("address type 2", S(5, 1, 0, 5, 1, 0, 2, 1, 2, 3, 4, 0, 80), -ENOTSUP, 2, 0x08);
        socks_bad("reserved byte 1", S(5, 1, 0, 5, 1, 1, 1, 1, 2, 3, 4, 0, 80), -EPROTO, 2, 0x01);
        socks_bad("request version 4", S(5, 1, 0, 4, 1, 0, 1, 1, 2, 3, 4, 0, 80), -EPROTO, 2, 0x01);
        socks_bad("empty domain", S(5, 1, 0, 5, 1, 0, 3, 0, 0, 80), -EPROTO, 2, 0x01);
        socks_bad("port 0", S(5, 1, 0, 5, 1, 0, 1, 1, 2, 3, 4, 0, 0), -EPROTO, 2, 0x02);

        /* pipelined greeting + request: the greeting consumes only itself */
        static const uint8_t pipe[] = { 5, 1, 0, 5, 1, 0, 1, 1, 2, 3, 4, 0, 80, 0x16, 0x03 };
        socks5 s;
        size_t c = 0;
        socks5_init(&s);
        int k = socks5_feed(&s, pipe, sizeof pipe, &c);
        ok(k == SOCKS5_GREETING_DONE && c == 3, "pipelined: greeting done after 3 bytes");
        size_t c2 = 0;
        k = socks5_feed(&s, pipe + c, sizeof pipe - c, &c2);
        ok(k == SOCKS5_REQUEST_DONE && c2 == 10 && s.atyp == SOCKS5_ATYP_IPV4 && s.port == 80,
           "pipelined: request done after 10 more, tunnel bytes left");
        k = socks5_feed(&s, pipe + 13, 2, &c2);
        ok(k == SOCKS5_REQUEST_DONE && c2 == 0, "feeding after DONE consumes nothing");
        ok(socks5_feed(&s_whole, pipe, 1, &c2) == -EPROTO && c2 == 0, "errors are sticky");

        /* incomplete: nothing decided */
        socks5_init(&s);
        k = socks5_feed(&s, (const uint8_t[]) { 5, 2, 0 }, 3, &c);
        ok(k == SOCKS5_NEED_MORE && c == 3, "greeting missing a method: need more");
        egress_host h;
        ok(socks5_host(&s, &h) == -EINVAL, "socks5_host before DONE: -EINVAL");

        /* replies */
        uint8_t buf[SOCKS5_REPLY_MAX];
        ok(socks5_method_reply(SOCKS5_METHOD_NO_AUTH, buf, sizeof buf) == 2 && buf[0] == 5 &&
                   buf[1] == 0,
           "method reply NO AUTH: 05 00");
        ok(socks5_method_reply(SOCKS5_METHOD_NONE_ACCEPTABLE, buf, sizeof buf) == 2 && buf[1] == 0xff,
           "method reply none acceptable: 05 ff");
        ok(socks5_method_reply(0, buf, 1) == -ENOBUFS, "method reply in 1 byte: -ENOBUFS");
        static const uint8_t refused[] = { 5, 7, 0, 1, 0, 0, 0, 0, 0, 0 };
        ok(socks5_reply(SOCKS5_REP_COMMAND_NOT_SUPPORTED, NULL, 0, buf, sizeof buf) == 10 &&
                   memcmp(buf, refused, 10) == 0,
           "reply 0x07 with no bound address: 05 07 00 01 0.0.0.0:0");
        egress_addr a4 = { .family = AF_INET, .bytes = { 10, 0, 0, 2 } };
        static const uint8_t ok4[] = { 5, 0, 0, 1, 10, 0, 0, 2, 0x9c, 0x40 };
        ok(socks5_reply(SOCKS5_REP_SUCCEEDED, &a4, 40000, buf, sizeof buf) == 10 &&
                   memcmp(buf, ok4, 10) == 0,
           "reply success bound 10.0.0.2:40000");
        egress_addr a6 = { .family = AF_INET6, .bytes = { 0xfd, [15] = 1 } };
        ok(socks5_reply(SOCKS5_REP_SUCCEEDED, &a6, 443, buf, sizeof buf) == 22 && buf[3] == 4 &&
                   buf[4] == 0xfd && buf[19] == 1 && buf[20] == 1 && buf[21] == 187,
           "reply success bound [fd00::1]:443");
        ok(socks5_reply(0, &a6, 1, buf, 21) == -ENOBUFS, "IPv6 reply in 21 bytes: -ENOBUFS");
        ok(socks5_reply(0, NULL, 1, buf, 9) == -ENOBUFS, "IPv4 reply in 9 bytes: -ENOBUFS");
}

int main(void) {
        test_http_happy();
        test_http_helpers();
        test_http_limits();
        test_http_refusals();
        test_origin_happy();
        test_origin_keepalive();
        test_origin_refusals();
        test_socks5();
        return tap_done();
}
