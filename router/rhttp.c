/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "router/rhttp.h"

/* ------------------------------------------------------- response heads */

void rhead_init(rhead *h) {
        memset(h, 0, offsetof(rhead, buf));
        h->buf[0] = 0;
}

static int fail(rhead *h, int r, const char *why) {
        h->error = r;
        h->why = why;
        return r;
}

static bool is_tchar(int c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool token_in_list(const char *list, const char *tok) {
        /* comma-separated, optional whitespace, case-insensitive */
        size_t tl = strlen(tok);
        const char *p = list;
        while (*p) {
                while (*p == ' ' || *p == '\t' || *p == ',')
                        p++;
                const char *s = p;
                while (*p && *p != ',')
                        p++;
                const char *e = p;
                while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
                        e--;
                if ((size_t) (e - s) == tl && strncasecmp(s, tok, tl) == 0)
                        return true;
        }
        return false;
}

/* buf[0..len) holds the whole head, ending CRLF CRLF */
static int parse_head(rhead *h) {
        char *p = h->buf, *end = h->buf + h->len;
        /* status line: HTTP/1.x SP 3DIGIT SP reason CRLF */
        if (h->len < 14 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ')
                return fail(h, -EINVAL, "not an HTTP/1.x status line");
        h->version_minor = p[7] - '0';
        if (!(p[9] >= '1' && p[9] <= '9' && p[10] >= '0' && p[10] <= '9' && p[11] >= '0' &&
              p[11] <= '9'))
                return fail(h, -EINVAL, "bad status code");
        h->status = (unsigned) ((p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0'));
        if (p[12] != ' ' && p[12] != '\r')
                return fail(h, -EINVAL, "bad status line");
        char *eol = memchr(p, '\r', (size_t) (end - p));
        if (!eol || eol[1] != '\n')
                return fail(h, -EINVAL, "bad status line");
        for (char *q = p + 12; q < eol; q++)
                if ((unsigned char) *q < 0x20 && *q != '\t')
                        return fail(h, -EINVAL, "control byte in the status line");
        p = eol + 2;
        const char *te = NULL, *conn = NULL;
        bool keep_alive = false;
        while (p < end) {
                eol = memchr(p, '\r', (size_t) (end - p));
                if (!eol || eol + 1 >= end || eol[1] != '\n')
                        return fail(h, -EINVAL, "header line not ended by CRLF");
                if (eol == p)
                        break; /* the empty line */
                if (h->n_headers >= RHEAD_HEADERS)
                        return fail(h, -E2BIG, "too many header lines");
                char *colon = p;
                while (colon < eol && is_tchar((unsigned char) *colon))
                        colon++;
                if (colon == p || colon >= eol || *colon != ':')
                        return fail(h, -EINVAL, "bad header name");
                *colon = 0;
                char *v = colon + 1;
                while (v < eol && (*v == ' ' || *v == '\t'))
                        v++;
                char *ve = eol;
                while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                        ve--;
                for (char *q = v; q < ve; q++)
                        if (((unsigned char) *q < 0x20 && *q != '\t') || *q == 0x7f)
                                return fail(h, -EINVAL, "control byte in a header value");
                *ve = 0;
                h->headers[h->n_headers].name = p;
                h->headers[h->n_headers].value = v;
                h->n_headers++;
                if (strcasecmp(p, "Content-Length") == 0) {
                        if (h->has_content_length)
                                return fail(h, -EINVAL, "two Content-Length headers");
                        if (!*v || strlen(v) > 18)
                                return fail(h, -EINVAL, "bad Content-Length");
                        uint64_t cl = 0;
                        for (const char *q = v; *q; q++) {
                                if (*q < '0' || *q > '9')
                                        return fail(h, -EINVAL, "bad Content-Length");
                                cl = cl * 10 + (uint64_t) (*q - '0');
                        }
                        h->has_content_length = true;
                        h->content_length = cl;
                } else if (strcasecmp(p, "Transfer-Encoding") == 0) {
                        if (te)
                                return fail(h, -EINVAL, "two Transfer-Encoding headers");
                        te = v;
                } else if (strcasecmp(p, "Connection") == 0) {
                        if (conn)
                                return fail(h, -EINVAL, "two Connection headers");
                        conn = v;
                }
                p = eol + 2;
        }
        if (te) {
                if (strcasecmp(te, "chunked") != 0)
                        return fail(h, -EINVAL, "a transfer coding other than chunked");
                if (h->has_content_length)
                        return fail(h, -EINVAL, "both Content-Length and Transfer-Encoding");
                h->chunked = true;
        }
        if (conn) {
                h->conn_close = token_in_list(conn, "close");
                keep_alive = token_in_list(conn, "keep-alive");
        }
        if (h->version_minor == 0 && !keep_alive)
                h->conn_close = true;
        return 0;
}

int rhead_feed(rhead *h, const void *data, size_t n, size_t *ret_consumed) {
        if (ret_consumed)
                *ret_consumed = 0;
        if (h->error)
                return h->error;
        if (h->done)
                return RHEAD_DONE;
        const char *d = data;
        for (size_t i = 0; i < n; i++) {
                if (h->len >= RHEAD_MAX) {
                        if (ret_consumed)
                                *ret_consumed = i;
                        return fail(h, -E2BIG, "response head over 16 KiB");
                }
                if (d[i] == 0) {
                        if (ret_consumed)
                                *ret_consumed = i;
                        return fail(h, -EINVAL, "NUL byte in the response head");
                }
                h->buf[h->len++] = d[i];
                /* a bare LF is refused by parse_head (every line must end in CRLF) */
                if (h->len >= 4 && memcmp(h->buf + h->len - 4, "\r\n\r\n", 4) == 0) {
                        h->buf[h->len] = 0;
                        h->head_len = h->len;
                        if (ret_consumed)
                                *ret_consumed = i + 1;
                        int r = parse_head(h);
                        if (r < 0)
                                return r;
                        h->done = true;
                        return RHEAD_DONE;
                }
        }
        if (ret_consumed)
                *ret_consumed = n;
        return RHEAD_NEED_MORE;
}

const char *rhead_get(const rhead *h, const char *name) {
        for (size_t i = 0; i < h->n_headers; i++)
                if (strcasecmp(h->headers[i].name, name) == 0)
                        return h->headers[i].value;
        return NULL;
}

bool rhead_bodyless(const rhead *h, const char *method) {
        return strcmp(method, "HEAD") == 0 || (h->status >= 100 && h->status < 200) ||
                h->status == 204 || h->status == 304;
}

bool rhead_hop_by_hop(const char *name, const char *connection_value) {
        static const char *const hop[] = {
                "Connection",          "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
                "Proxy-Authorization", "TE",         "Trailer",          "Upgrade"
        };
        for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
                if (strcasecmp(name, hop[i]) == 0)
                        return true;
        return connection_value && token_in_list(connection_value, name);
}

/* ------------------------------------------------------------- routing */

bool rroute_sandbox_id_valid(const char *s, size_t n) {
        if (n != ROUTER_SANDBOX_ID_LEN)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')))
                        return false;
        return true;
}

static bool snapshot_id_valid(const char *s, size_t n) {
        return n == 5 + ROUTER_SANDBOX_ID_LEN && memcmp(s, "snap_", 5) == 0 &&
                rroute_sandbox_id_valid(s + 5, n - 5);
}

static void set_sandbox(rroute *r, const char *id, size_t n, size_t node_off) {
        r->kind = RR_SANDBOX;
        memcpy(r->id, id, n);
        r->id[n] = 0;
        memcpy(r->node, id + node_off, ROUTER_NODE_ID_LEN);
        r->node[ROUTER_NODE_ID_LEN] = 0;
}

static bool path_is(const char *path, size_t pl, const char *lit) {
        return strlen(lit) == pl && memcmp(path, lit, pl) == 0;
}

int rroute_decide(const char *method, const char *target, const char *host, const char *sandbox_id,
                  const char *sandbox_port, rroute *ret) {
        rroute r = { 0 };
        size_t pl = strcspn(target, "?");
        const char *query = target[pl] == '?' ? target + pl + 1 : "";
        bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

        /* 1. the envd plane's routing headers */
        if (sandbox_id || sandbox_port) {
                r.data_plane = true;
                if (!sandbox_id || !rroute_sandbox_id_valid(sandbox_id, strlen(sandbox_id))) {
                        r.kind = RR_BAD;
                        *ret = r;
                        return 0;
                }
                set_sandbox(&r, sandbox_id, ROUTER_SANDBOX_ID_LEN, 0);
                *ret = r;
                return 0;
        }
        /* 2. Host: <port>-<id>.<domain> */
        if (host) {
                size_t d = 0;
                while (host[d] >= '0' && host[d] <= '9' && d < 6)
                        d++;
                if (d > 0 && d <= 5 && host[d] == '-') {
                        const char *id = host + d + 1;
                        size_t n = strcspn(id, ".");
                        char low[ROUTER_SANDBOX_ID_LEN + 1];
                        if (n == ROUTER_SANDBOX_ID_LEN && id[n] == '.' && id[n + 1]) {
                                for (size_t i = 0; i < n; i++)
                                        low[i] = (char) ((id[i] >= 'A' && id[i] <= 'Z') ? id[i] + 32
                                                                                        : id[i]);
                                if (rroute_sandbox_id_valid(low, n)) {
                                        r.data_plane = true;
                                        set_sandbox(&r, low, n, 0);
                                        *ret = r;
                                        return 0;
                                }
                        }
                }
        }
        /* 3. the router's own */
        if (path_is(target, pl, "/health") && get) {
                r.kind = RR_HEALTH;
                *ret = r;
                return 0;
        }
        if (path_is(target, pl, "/metrics") && get) {
                r.kind = RR_METRICS;
                *ret = r;
                return 0;
        }
        /* 4. the control plane */
        if (path_is(target, pl, "/sandboxes") || path_is(target, pl, "/v2/sandboxes")) {
                r.kind = strcmp(method, "POST") == 0 ? RR_CREATE : get ? RR_LIST : RR_ANY;
                *ret = r;
                return 0;
        }
        if (path_is(target, pl, "/snapshots")) {
                r.kind = get ? RR_SNAPSHOTS : RR_ANY;
                *ret = r;
                return 0;
        }
        static const char *const by_id[] = { "/sandboxes/", "/v2/sandboxes/", "/templates/",
                                             "/v1/templates/", "/v2/templates/" };
        for (size_t i = 0; i < sizeof by_id / sizeof by_id[0]; i++) {
                size_t bl = strlen(by_id[i]);
                if (pl <= bl || memcmp(target, by_id[i], bl) != 0)
                        continue;
                const char *id = target + bl;
                size_t n = strcspn(id, "/?");
                if (rroute_sandbox_id_valid(id, n))
                        set_sandbox(&r, id, n, 0);
                else if (snapshot_id_valid(id, n))
                        set_sandbox(&r, id, n, 5);
                else if (i < 2) {
                        /* a sandbox path whose id no node could have made */
                        r.kind = RR_BAD;
                        *ret = r;
                        return 0;
                } else
                        r.kind = RR_ANY;
                *ret = r;
                return 0;
        }
        if ((pl == strlen("/secrets") || (pl > strlen("/secrets/") && target[8] == '/')) &&
            memcmp(target, "/secrets", 8) == 0) {
                r.kind = get ? RR_ANY : RR_BROADCAST;
                *ret = r;
                return 0;
        }
        if (path_is(target, pl, "/files") && (strstr(query, "signature=") != NULL)) {
                r.kind = RR_SIGNED_FILES;
                *ret = r;
                return 0;
        }
        r.kind = RR_ANY;
        *ret = r;
        return 0;
}

/* --------------------------------------------------------------- merge */

typedef struct item {
        json_t *v;
        int64_t ms;
        const char *id;
} item;

static int item_key(json_t *o, bool snapshots, int64_t *ms, const char **id) {
        if (!json_is_object(o))
                return -EBADMSG;
        if (snapshots) {
                json_t *t = json_object_get(o, "createdAtUnixMs");
                *id = json_string_value(json_object_get(o, "snapshotID"));
                if (!json_is_integer(t) || !*id)
                        return -EBADMSG;
                *ms = json_integer_value(t);
                return 0;
        }
        const char *s = json_string_value(json_object_get(o, "startedAt"));
        *id = json_string_value(json_object_get(o, "sandboxID"));
        if (!s || !*id)
                return -EBADMSG;
        /* YYYY-MM-DDTHH:MM:SS[.mmm]Z, as the daemon writes it */
        struct tm tm = { 0 };
        const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
        if (!p)
                return -EBADMSG;
        int64_t frac = 0;
        if (*p == '.') {
                p++;
                int digits = 0;
                while (*p >= '0' && *p <= '9') {
                        if (digits < 3) {
                                frac = frac * 10 + (*p - '0');
                                digits++;
                        }
                        p++;
                }
                while (digits++ < 3)
                        frac *= 10;
        }
        if (*p != 'Z' || p[1])
                return -EBADMSG;
        *ms = (int64_t) timegm(&tm) * 1000 + frac;
        return 0;
}

static int cmp_item(const void *a, const void *b, void *arg) {
        const item *x = a, *y = b;
        bool merge_asc = *(const bool *) arg;
        int c = x->ms != y->ms ? (x->ms < y->ms ? -1 : 1) : strcmp(x->id, y->id);
        return merge_asc ? c : -c;
}

int rmerge(json_t *const *pages, size_t n, bool snapshots, bool asc, size_t limit, bool more_hint,
           json_t **ret, char ret_token[96]) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++) {
                if (!json_is_array(pages[i]))
                        return -EBADMSG;
                total += json_array_size(pages[i]);
        }
        item *v = calloc(total ? total : 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
                size_t j;
                json_t *o;
                json_array_foreach(pages[i], j, o) {
                        if (item_key(o, snapshots, &v[k].ms, &v[k].id) < 0) {
                                free(v);
                                return -EBADMSG;
                        }
                        v[k++].v = o;
                }
        }
        bool order_asc = snapshots ? false : asc;
        qsort_r(v, k, sizeof *v, cmp_item, &order_asc);
        json_t *out = json_array();
        size_t take = k < limit ? k : limit;
        for (size_t i = 0; i < take; i++)
                json_array_append(out, v[i].v);
        ret_token[0] = 0;
        if (take > 0 && (k > take || more_hint))
                snprintf(ret_token, 96, "%lld.%s", (long long) v[take - 1].ms, v[take - 1].id);
        free(v);
        *ret = out;
        return 0;
}
