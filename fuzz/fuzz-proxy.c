/* SPDX-License-Identifier: Apache-2.0 */
/* The proxy request parsers (lib/egress/proxyreq.c, lib/egress/socks5.c) on
 * bytes a sandbox program sends. The first byte chooses the parser (even:
 * HTTP head, odd: SOCKS5), for HTTP the mode (bit 7 set: origin-form, as
 * inside an intercepted tunnel) and, in bits 1-6, a chunk size. Invariants,
 * not just "no crash": the answer is the same fed whole, one byte at a time
 * and in chunks; no feed consumes more than it was given; a DONE head holds
 * only what the parser promises; no head is accepted by both modes. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "egress/policy.h"
#include "egress/proxyreq.h"
#include "egress/socks5.h"
#include "util/macro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static proxyreq reqs[3], other;
static socks5 socks[3];

static int http_run(proxyreq *r, bool origin, const uint8_t *d, size_t n, size_t step,
                    size_t *ret_used) {
        size_t off = 0;
        int k = PROXYREQ_NEED_MORE;

        if (origin)
                proxyreq_init_origin(r);
        else
                proxyreq_init(r);
        while (off < n) {
                size_t len = step && step < n - off ? step : n - off, c = 0;
                k = proxyreq_feed(r, d + off, len, &c);
                if (c > len)
                        abort();
                if (k == PROXYREQ_NEED_MORE && c != len)
                        abort();
                off += c;
                if (k != PROXYREQ_NEED_MORE)
                        break;
        }
        *ret_used = off;
        return k;
}

/* Origin-form: host and port are the Host header's value, split. */
static void origin_check(const proxyreq *r) {
        const proxyreq_header *hh = proxyreq_find_header(r, "host");

        if (r->connect || !r->path || streq(r->method, "CONNECT"))
                abort();
        if (r->path[0] == '*' && (r->path_len != 1 || !streq(r->method, "OPTIONS")))
                abort();
        if (!hh || hh->value_len < r->host_len || memcmp(hh->value, r->host, r->host_len) != 0)
                abort();
        if (hh->value_len == r->host_len ? r->port != 0
                                         : r->port == 0 || hh->value[r->host_len] != ':')
                abort();
        if (strspn(hh->value,
                   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                   "-._~%:[]") != hh->value_len)
                abort();
        for (size_t i = 0; i < r->n_headers; i++)
                if (&r->headers[i] != hh && strcasecmp(r->headers[i].name, "host") == 0)
                        abort();
}

static void http_check(const proxyreq *r, size_t used) {
        egress_host h;

        if (r->head_len != used || r->head_len > PROXYREQ_HEAD_MAX ||
            r->n_headers > PROXYREQ_HEADERS_MAX)
                abort();
        if (!r->method || strlen(r->method) == 0 || strlen(r->method) > PROXYREQ_METHOD_MAX)
                abort();
        if (r->host_len == 0 || r->host_len > EGRESS_HOST_INPUT_MAX ||
            strlen(r->host) != r->host_len || memchr(r->host, '@', r->host_len) ||
            (r->port == 0 && !r->origin_form))
                abort();
        if (r->connect != (r->path == NULL))
                abort();
        if (r->path &&
            ((r->path[0] != '/' && !(r->origin_form && r->path[0] == '*')) ||
             strlen(r->path) != r->path_len || strchr(r->path, '#')))
                abort();
        if (r->origin_form)
                origin_check(r);
        if (r->has_content_length && r->chunked)
                abort();
        for (size_t i = 0; i < r->n_headers; i++) {
                const proxyreq_header *hd = &r->headers[i];
                if (hd->name_len == 0 || strlen(hd->name) != hd->name_len ||
                    strlen(hd->value) != hd->value_len || strpbrk(hd->name, " \t:\r\n") ||
                    strpbrk(hd->value, "\r\n"))
                        abort();
                (void) proxyreq_header_is_hop_by_hop(r, i);
        }
        (void) proxyreq_proxy_authorization(r);
        if (egress_host_parse_n(r->host, r->host_len, &h) == 0 &&
            memchr(h.text, 0, sizeof h.text) == NULL)
                abort();
}

static void fuzz_http(const uint8_t *d, size_t n, size_t step, bool origin) {
        size_t u[3], uo;
        int k[3];

        k[0] = http_run(&reqs[0], origin, d, n, 0, &u[0]);
        k[1] = http_run(&reqs[1], origin, d, n, 1, &u[1]);
        k[2] = http_run(&reqs[2], origin, d, n, step, &u[2]);
        for (int i = 1; i < 3; i++) {
                if (k[i] != k[0] || u[i] != u[0])
                        abort();
                if (k[0] < 0 && strcmp(reqs[i].why, reqs[0].why) != 0)
                        abort();
                if (k[0] == PROXYREQ_DONE &&
                    (strcmp(reqs[i].host, reqs[0].host) != 0 || reqs[i].port != reqs[0].port ||
                     strcmp(reqs[i].method, reqs[0].method) != 0 ||
                     reqs[i].n_headers != reqs[0].n_headers ||
                     reqs[i].origin_form != reqs[0].origin_form || reqs[i].connect != reqs[0].connect ||
                     (reqs[i].path == NULL) != (reqs[0].path == NULL) ||
                     (reqs[0].path && strcmp(reqs[i].path, reqs[0].path) != 0) ||
                     reqs[i].has_content_length != reqs[0].has_content_length ||
                     reqs[i].content_length != reqs[0].content_length ||
                     reqs[i].chunked != reqs[0].chunked ||
                     memcmp(reqs[i].buf, reqs[0].buf, reqs[0].head_len) != 0))
                        abort();
        }
        if (k[0] < 0 && (!reqs[0].why || u[0] > n))
                abort();
        if (reqs[0].origin_form != origin)
                abort();
        if (k[0] == PROXYREQ_DONE) {
                http_check(&reqs[0], u[0]);
                /* a forward-proxy head and an origin-form head never look
                 * alike: the other mode refuses what this one accepted */
                if (http_run(&other, !origin, d, n, 0, &uo) == PROXYREQ_DONE)
                        abort();
        }
}

static int socks_run(socks5 *s, const uint8_t *d, size_t n, size_t step, size_t *ret_used,
                     int *ret_greeted) {
        size_t off = 0;
        int k = SOCKS5_NEED_MORE;

        socks5_init(s);
        *ret_greeted = 0;
        while (off < n) {
                size_t len = step && step < n - off ? step : n - off, c = 0;
                k = socks5_feed(s, d + off, len, &c);
                if (c > len || (k == SOCKS5_NEED_MORE && c != len))
                        abort();
                off += c;
                if (k == SOCKS5_GREETING_DONE) {
                        if ((*ret_greeted)++)
                                abort();
                        continue;
                }
                if (k != SOCKS5_NEED_MORE)
                        break;
        }
        *ret_used = off;
        return k;
}

static void fuzz_socks5(const uint8_t *d, size_t n, size_t step) {
        size_t u[3];
        int k[3], g[3];
        uint8_t buf[SOCKS5_REPLY_MAX];
        egress_host h;

        k[0] = socks_run(&socks[0], d, n, 0, &u[0], &g[0]);
        k[1] = socks_run(&socks[1], d, n, 1, &u[1], &g[1]);
        k[2] = socks_run(&socks[2], d, n, step, &u[2], &g[2]);
        for (int i = 1; i < 3; i++)
                if (k[i] != k[0] || u[i] != u[0] || g[i] != g[0] ||
                    socks[i].reply_kind != socks[0].reply_kind ||
                    socks[i].reply != socks[0].reply || socks[i].atyp != socks[0].atyp ||
                    socks[i].port != socks[0].port || socks[i].host_len != socks[0].host_len ||
                    memcmp(socks[i].host, socks[0].host, sizeof socks[0].host) != 0 ||
                    memcmp(socks[i].addr, socks[0].addr, sizeof socks[0].addr) != 0)
                        abort();
        if (k[0] < 0) {
                if (!socks[0].why || socks[0].reply_kind < 0 || socks[0].reply_kind > 2)
                        abort();
                if (socks[0].reply_kind == 1 &&
                    socks5_method_reply(socks[0].reply, buf, sizeof buf) != 2)
                        abort();
                if (socks[0].reply_kind == 2 &&
                    socks5_reply(socks[0].reply, NULL, 0, buf, sizeof buf) != 10)
                        abort();
        }
        if (k[0] == SOCKS5_REQUEST_DONE) {
                if (socks[0].port == 0 || !g[0])
                        abort();
                if (socks[0].atyp == SOCKS5_ATYP_DOMAIN &&
                    (socks[0].host_len == 0 || socks[0].host_len > 255))
                        abort();
                int r = socks5_host(&socks[0], &h);
                /* an address always makes a host; a domain only if it parses */
                if (socks[0].atyp != SOCKS5_ATYP_DOMAIN && r != 0)
                        abort();
                if (r == 0 &&
                    (socks5_reply(0, h.kind == EGRESS_HOST_NAME ? NULL : &h.addr, socks[0].port,
                                  buf, sizeof buf) < 10))
                        abort();
        } else if (socks5_host(&socks[0], &h) != -EINVAL) {
                abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        if (data[0] & 1)
                fuzz_socks5(data + 1, size - 1, (size_t) (data[0] >> 1) % 31 + 2);
        else
                fuzz_http(data + 1, size - 1, (size_t) ((data[0] & 0x7f) >> 1) % 31 + 2,
                          data[0] & 0x80);
        return 0;
}
