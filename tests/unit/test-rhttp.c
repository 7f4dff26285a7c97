/* SPDX-License-Identifier: Apache-2.0 */
/* The router's pure parts (router/rhttp.c): where each request goes, the
 * framing of node response heads, and the merge of list pages across nodes
 * with the page token (a client walking pages sees every item once). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router/rhttp.h"
#include "tap.h"

static rroute R(const char *method, const char *target, const char *host, const char *sid,
                const char *port) {
        rroute r;
        ok(rroute_decide(method, target, host, sid, port, &r) == 0, "decide %s %s", method, target);
        return r;
}

static void routes(void) {
        rroute r = R("POST", "/v2/sandboxes", "router:1", NULL, NULL);
        ok(r.kind == RR_CREATE, "POST /v2/sandboxes: create");
        r = R("GET", "/v2/sandboxes?limit=3&nextToken=5.x", "r", NULL, NULL);
        ok(r.kind == RR_LIST, "GET /v2/sandboxes: list");
        r = R("GET", "/snapshots?limit=3", "r", NULL, NULL);
        ok(r.kind == RR_SNAPSHOTS, "GET /snapshots: merged");
        r = R("POST", "/sandboxes/nd01abcdefghijklmnop/timeout", "r", NULL, NULL);
        ok(r.kind == RR_SANDBOX && strcmp(r.node, "nd01") == 0 && !r.data_plane, "path id: its node");
        r = R("POST", "/v2/sandboxes/nd07abcdefghijklmnop/connect", "r", NULL, NULL);
        ok(r.kind == RR_SANDBOX && strcmp(r.node, "nd07") == 0, "v2 connect: its node");
        r = R("DELETE", "/templates/snap_nd03abcdefghijklmnop", "r", NULL, NULL);
        ok(r.kind == RR_SANDBOX && strcmp(r.node, "nd03") == 0,
           "snapshot id: its node after the prefix");
        r = R("POST", "/process.Process/Start", "r", "nd02abcdefghijklmnop", "49983");
        ok(r.kind == RR_SANDBOX && r.data_plane && strcmp(r.node, "nd02") == 0,
           "envd headers: data plane");
        r = R("GET", "/health", "r", "nd02abcdefghijklmnop", "49983");
        ok(r.kind == RR_SANDBOX, "envd /health goes to the sandbox, not the router");
        r = R("GET", "/", "8080-ND05ABCDEFGHIJKLMNOP.hutch.example", NULL, NULL);
        ok(r.kind == RR_SANDBOX && strcmp(r.node, "nd05") == 0 && r.data_plane,
           "Host <port>-<id>: lowercased");
        r = R("GET", "/health", "r", "bad/../id", "49983");
        ok(r.kind == RR_BAD && r.data_plane, "a malformed E2b-Sandbox-Id is refused");
        r = R("GET", "/health", "r", NULL, "49983");
        ok(r.kind == RR_BAD, "a port without an id is refused");
        r = R("GET", "/sandboxes/short", "r", NULL, NULL);
        ok(r.kind == RR_BAD, "a path id no node made");
        r = R("GET", "/health", "router", NULL, NULL);
        ok(r.kind == RR_HEALTH, "the router's /health");
        r = R("GET", "/metrics", "router", NULL, NULL);
        ok(r.kind == RR_METRICS, "the router's /metrics");
        r = R("POST", "/secrets", "r", NULL, NULL);
        ok(r.kind == RR_BROADCAST, "secret create: every node");
        r = R("DELETE", "/secrets/gh", "r", NULL, NULL);
        ok(r.kind == RR_BROADCAST, "secret delete: every node");
        r = R("GET", "/secrets/gh", "r", NULL, NULL);
        ok(r.kind == RR_ANY, "secret read: one node");
        r = R("GET", "/secretsx", "r", NULL, NULL);
        ok(r.kind == RR_ANY, "/secretsx is not /secrets");
        r = R("GET", "/files?path=%2Fa&signature=v1_x&signature_expiration=1", "r", NULL, NULL);
        ok(r.kind == RR_SIGNED_FILES, "signed /files without an id");
        r = R("GET", "/v3/templates", "r", NULL, NULL);
        ok(r.kind == RR_ANY, "other paths: one node");
}

static void heads(void) {
        static rhead h;
        const char *s = "HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nbody";
        size_t used;
        rhead_init(&h);
        ok(rhead_feed(&h, s, strlen(s), &used) == RHEAD_DONE && used == strlen(s) - 4,
           "a head, the body left");
        ok(h.status == 200 && h.has_content_length && h.content_length == 12 && h.conn_close,
           "its framing");
        const char *bad[] = {
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                "HTTP/1.1 200 OK\nX: y\n\n\r\n\r\n",
                "HTTP/2 200 OK\r\n\r\n",
                "HTTP/1.1 20 OK\r\n\r\n",
                "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
                "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                rhead_init(&h);
                ok(rhead_feed(&h, bad[i], strlen(bad[i]), NULL) < 0 && h.why, "refused: %zu (%s)",
                   i, h.why);
        }
        rhead_init(&h);
        s = "HTTP/1.0 200 OK\r\n\r\n";
        ok(rhead_feed(&h, s, strlen(s), NULL) == RHEAD_DONE && h.conn_close, "HTTP/1.0: closes");
        ok(rhead_hop_by_hop("keep-alive", NULL) && rhead_hop_by_hop("X-A", "close, x-a") &&
                   !rhead_hop_by_hop("Content-Type", "close"),
           "hop-by-hop headers, named ones included");
}

static json_t *sbx(const char *id, const char *started) {
        return json_pack("{s:s, s:s}", "sandboxID", id, "startedAt", started);
}

static void merge(void) {
        /* 3 nodes, 7 sandboxes; walk pages of 3, each node asked for the
         * items after the token as a node does (strictly after, desc) */
        json_t *all[3];
        all[0] = json_pack("[o,o,o]", sbx("nd01aaaaaaaaaaaaaaaa", "2026-12-04T01:00:00.005Z"),
                           sbx("nd01bbbbbbbbbbbbbbbb", "2026-12-04T01:00:00.003Z"),
                           sbx("nd01cccccccccccccccc", "2026-12-04T01:00:00.001Z"));
        all[1] = json_pack("[o,o]", sbx("nd02aaaaaaaaaaaaaaaa", "2026-12-04T01:00:00.004Z"),
                           sbx("nd02bbbbbbbbbbbbbbbb", "2026-12-04T01:00:00.003Z"));
        all[2] = json_pack("[o,o]", sbx("nd03aaaaaaaaaaaaaaaa", "2026-12-04T01:00:00.006Z"),
                           sbx("nd03bbbbbbbbbbbbbbbb", "2026-12-04T01:00:00Z"));
        char token[96] = "";
        char seen[8][24];
        size_t n_seen = 0;
        for (int page = 0; page < 5; page++) {
                long long tms = -1;
                char tid[32] = "";
                if (token[0])
                        sscanf(token, "%lld.%31s", &tms, tid);
                json_t *pages[3];
                bool more = false;
                for (int k = 0; k < 3; k++) {
                        pages[k] = json_array();
                        size_t i;
                        json_t *o;
                        json_array_foreach(all[k], i, o) {
                                const char *id = json_string_value(json_object_get(o, "sandboxID"));
                                const char *st = json_string_value(json_object_get(o, "startedAt"));
                                struct tm tm = { 0 };
                                const char *p = strptime(st, "%Y-%m-%dT%H:%M:%S", &tm);
                                long long ms = (long long) timegm(&tm) * 1000 +
                                        (*p == '.' ? atoi(p + 1) : 0);
                                bool after = tms < 0 || ms < tms ||
                                        (ms == tms && strcmp(id, tid) < 0);
                                if (!after)
                                        continue;
                                if (json_array_size(pages[k]) == 3) {
                                        more = true;
                                        break;
                                }
                                json_array_append(pages[k], o);
                        }
                }
                json_t *out;
                ok(rmerge(pages, 3, false, false, 3, more, &out, token) == 0, "merge page %d", page);
                size_t i;
                json_t *o;
                json_array_foreach(out, i, o)
                        snprintf(seen[n_seen++ % 8], 24, "%s",
                                 json_string_value(json_object_get(o, "sandboxID")));
                json_decref(out);
                for (int k = 0; k < 3; k++)
                        json_decref(pages[k]);
                if (!token[0])
                        break;
        }
        ok(n_seen == 7, "7 items over the pages (%zu)", n_seen);
        const char *want[] = { "nd03aaaaaaaaaaaaaaaa", "nd01aaaaaaaaaaaaaaaa",
                               "nd02aaaaaaaaaaaaaaaa", "nd02bbbbbbbbbbbbbbbb",
                               "nd01bbbbbbbbbbbbbbbb", "nd01cccccccccccccccc",
                               "nd03bbbbbbbbbbbbbbbb" };
        bool order = n_seen == 7;
        for (size_t i = 0; order && i < 7; i++)
                order = strcmp(seen[i], want[i]) == 0;
        ok(order, "newest first, ties by id descending, no repeats");
        for (int k = 0; k < 3; k++)
                json_decref(all[k]);
        json_t *bad = json_pack("[s]", "x");
        json_t *out;
        ok(rmerge(&bad, 1, false, false, 3, false, &out, token) == -EBADMSG,
           "a page of something else");
        json_decref(bad);
}

int main(void) {
        routes();
        heads();
        merge();
        return tap_done();
}
