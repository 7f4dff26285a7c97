/* SPDX-License-Identifier: Apache-2.0 */
/* The router's parsers of node and client bytes (router/rhttp.c). The first
 * byte picks one:
 *   0: a node's response head, fed whole and byte by byte: the same answer,
 *      consumption and framing either way; a DONE head ends in CRLF CRLF and
 *      never says both Content-Length and chunked.
 *   1: where a request goes: "METHOD\nTARGET\nHOST\nSANDBOX-ID\nPORT" (an
 *      empty field is an absent header); a RR_SANDBOX answer carries a valid
 *      id whose node part is the node it names.
 *   2: list pages as nodes could send them: JSON arrays separated by NUL
 *      bytes, merged; the merge never holds more than the limit, and a
 *      token only when it took something. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "router/rhttp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static rhead h1, h2;

static void fuzz_head(const uint8_t *d, size_t n) {
        rhead_init(&h1);
        rhead_init(&h2);
        size_t u1 = 0;
        int a = rhead_feed(&h1, d, n, &u1);
        size_t off = 0;
        int b = RHEAD_NEED_MORE;
        while (off < n) {
                size_t u;
                b = rhead_feed(&h2, d + off, 1, &u);
                if (u > 1)
                        abort();
                off += u;
                if (b != RHEAD_NEED_MORE)
                        break;
        }
        if (a != b || (a == RHEAD_DONE && u1 != off))
                abort();
        if (a == RHEAD_DONE) {
                if (h1.head_len != u1 || u1 < 4 || memcmp(d + u1 - 4, "\r\n\r\n", 4) != 0)
                        abort();
                if (h1.chunked && h1.has_content_length)
                        abort();
                if (h1.status != h2.status || h1.content_length != h2.content_length ||
                    h1.n_headers != h2.n_headers)
                        abort();
                for (size_t i = 0; i < h1.n_headers; i++)
                        (void) rhead_hop_by_hop(h1.headers[i].name, rhead_get(&h1, "Connection"));
                (void) rhead_bodyless(&h1, "GET");
                /* sticky */
                if (rhead_feed(&h1, "x", 1, NULL) != RHEAD_DONE)
                        abort();
        }
}

static void fuzz_route(const uint8_t *d, size_t n) {
        char *s = malloc(n + 1);
        if (!s)
                return;
        memcpy(s, d, n);
        s[n] = 0;
        char *f[5] = { NULL };
        char *p = s;
        for (int i = 0; i < 5; i++) {
                f[i] = p;
                char *nl = p ? strchr(p, '\n') : NULL;
                if (nl)
                        *nl = 0;
                p = nl ? nl + 1 : NULL;
        }
        const char *method = f[0] ? f[0] : "GET", *target = f[1] ? f[1] : "/";
        const char *host = f[2] && *f[2] ? f[2] : NULL, *sid = f[3] && *f[3] ? f[3] : NULL;
        const char *port = f[4] && *f[4] ? f[4] : NULL;
        rroute r;
        if (rroute_decide(method, target, host, sid, port, &r) < 0)
                abort();
        if (r.kind == RR_SANDBOX) {
                size_t l = strlen(r.id);
                const char *id = strncmp(r.id, "snap_", 5) == 0 ? r.id + 5 : r.id;
                if (!rroute_sandbox_id_valid(id, strlen(id)) || (id != r.id && l != 25) ||
                    memcmp(id, r.node, ROUTER_NODE_ID_LEN) != 0 ||
                    strlen(r.node) != ROUTER_NODE_ID_LEN)
                        abort();
        }
        free(s);
}

static void fuzz_merge(const uint8_t *d, size_t n) {
        json_t *pages[8] = { NULL };
        size_t np = 0, off = 0;
        bool snapshots = n > 0 && (d[0] & 1), asc = n > 0 && (d[0] & 2);
        size_t limit = n > 0 ? (size_t) (d[0] >> 2) % 8 + 1 : 1;
        if (n > 0)
                off = 1;
        while (off < n && np < 8) {
                const uint8_t *e = memchr(d + off, 0, n - off);
                size_t l = e ? (size_t) (e - (d + off)) : n - off;
                json_t *j = json_loadb((const char *) d + off, l, 0, NULL);
                if (j)
                        pages[np++] = j;
                off += l + 1;
        }
        json_t *out = NULL;
        char token[96];
        if (rmerge(pages, np, snapshots, asc, limit, false, &out, token) == 0) {
                if (json_array_size(out) > limit || (token[0] && json_array_size(out) == 0))
                        abort();
                json_decref(out);
        }
        for (size_t i = 0; i < np; i++)
                json_decref(pages[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        switch (data[0] % 3) {
        case 0:
                fuzz_head(data + 1, size - 1);
                break;
        case 1:
                fuzz_route(data + 1, size - 1);
                break;
        default:
                fuzz_merge(data + 1, size - 1);
        }
        return 0;
}
