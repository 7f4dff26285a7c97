/* SPDX-License-Identifier: Apache-2.0 */
/* Credential injection (lib/egress/inject.c) on real request heads: each head
 * is parsed by proxyreq (absolute-form as a forward proxy sees it, or
 * origin-form as inside an intercepted tunnel), rewritten for a destination
 * parsed by egress_host_parse(), and the result is checked line by line.
 * The resolve callback counts its calls: a secret is looked up only when a
 * request to one of its hosts needs it, and a refused request leaves no head
 * behind. */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tap.h"
#include "egress/inject.h"
#include "egress/policy.h"
#include "egress/proxyreq.h"
#include "util/macro.h"

/* "hsp_" + 40 hex, as the daemon makes them (here: "hsp_" + sha1(name)) */
#define P_GH "hsp_1041179cbdda366fd7b0347f09255f775170e103"
#define P_STRIPE "hsp_2fcb5a43a42afa8e99726c9487c367f84548e3f8"
#define P_NET "hsp_391b6629d9b645d3073c6f5ad432c40537646604"
#define P_BAD "hsp_1902e3d6fc4e78a0bcc50ba12b882769afbf4a8c"
#define P_LF "hsp_a7c664ee9eff58a85c4e418aa7706242c5ce03ad"
#define P_NUL "hsp_d97929517d6d6863e3cd8f8018a96e632369a26d"
#define P_GONE "hsp_a6dfdeaa3a44a4c52d44284847d7160892b4017e"
#define P_BIG "hsp_95c4bea12e4edcf8aad730a222793324dc42c29d"
#define P_HUGE "hsp_f2104f95264636b0abb0da2ae9f2baa6cf183fdd"
#define P_EMPTY "hsp_ad87109bfff0765f4dd8cf4943b04d16a4070fea"
#define P_FREE "hsp_4ff88aaddbd209d8026924c2cc2836b408698823" /* never added */

#define V_GH "ghp_value_of_gh"
#define V_STRIPE "sk_live_value_of_stripe"
#define V_NET "net-value"
#define V_RULEKEY "rk_value_of_rulekey"

#define PARSE_FAILED INT_MIN
#define PLAIN false /* plain HTTP through the proxy */
#define TLS true    /* inside an intercepted tunnel */

/* ------------------------------------------------------------- helpers */

/* Test names are one TAP line: bytes outside printable ASCII as \xNN. */
static const char *show(const char *s) {
        static char bufs[4][400];
        static int next;
        char *b = bufs[next++ % 4];
        size_t o = 0;
        for (size_t i = 0; s && s[i] && o + 8 < sizeof bufs[0]; i++) {
                unsigned char c = (unsigned char) s[i];
                if (c >= 0x20 && c < 0x7f)
                        b[o++] = (char) c;
                else
                        o += (size_t) snprintf(b + o, sizeof bufs[0] - o, "\\x%02x", c);
        }
        b[o] = 0;
        return b;
}

/* ------------------------------------------------------------- secrets */

static char big_value[EGRESS_MASK_VALUE_MAX + 1];

/* What the daemon knows: each secret's value and hosts. A secret with hosts
 * resolves only for them (a rule cannot carry it elsewhere); those with a
 * placeholder are bound to the same hosts in the inject set. */
static const struct {
        const char *name, *placeholder, *value;
        size_t len;
        const char *hosts[3];
} secrets[] = {
        { "gh", P_GH, V_GH, sizeof V_GH - 1, { "github.test", "*.githubusercontent.test", "multi.test" } },
        { "stripe", P_STRIPE, V_STRIPE, sizeof V_STRIPE - 1,
          { "api.stripe.test:443", "multi.test", "*.deep.example.test" } },
        { "net", P_NET, V_NET, sizeof V_NET - 1, { "10.0.0.0/8", "2001:db8::/32" } },
        { "bad", P_BAD, "x\r\nX-Injected: 1", 17, { "bad.test" } },
        { "lf", P_LF, "a\nb", 3, { "bad.test" } },
        { "nul", P_NUL, "a\0b", 3, { "bad.test" } },
        { "big", P_BIG, big_value, EGRESS_MASK_VALUE_MAX, { "big.test" } },
        { "huge", P_HUGE, big_value, EGRESS_MASK_VALUE_MAX + 1, { "big.test" } },
        { "empty", P_EMPTY, "", 0, { "big.test" } },
        { "gone", P_GONE, NULL, 0, { "gone.test" } }, /* deleted: resolve says -ENOENT */
        /* named by rules only */
        { "rulekey", NULL, V_RULEKEY, sizeof V_RULEKEY - 1, { NULL } },
        { "badrule", NULL, "a\r\nb", 4, { NULL } },
        { "elsewhere", NULL, "elsewhere-value", 15, { "other.test" } },
};

typedef struct vault {
        unsigned calls;
        char asked[512];   /* names resolved, comma-separated */
        const char *dest;  /* the destination every call must name */
        uint16_t port;
        bool wrong_dest;
} vault;

static bool host_in(const char *const *hosts, const egress_host *h, uint16_t port) {
        for (size_t i = 0; i < 3 && hosts[i]; i++) {
                egress_rule r;
                if (egress_rule_parse(hosts[i], &r, NULL, 0) == 0 && egress_rule_matches_host(&r, h, port))
                        return true;
        }
        return false;
}

static int resolve(void *userdata, const char *name, const egress_host *h, uint16_t port, char **ret,
                   size_t *ret_len) {
        vault *v = userdata;
        size_t l = strlen(v->asked);
        v->calls++;
        snprintf(v->asked + l, sizeof v->asked - l, "%s%s", l ? "," : "", name);
        egress_host want;
        if (!v->dest || egress_host_parse(v->dest, &want) < 0 || !egress_host_equal(&want, h) || port != v->port)
                v->wrong_dest = true;
        /* m1..m9 (and m1-000...): secrets made by the tests, "many-value-N" */
        if (name[0] == 'm' && name[1] >= '1' && name[1] <= '9' && (!name[2] || name[2] == '-')) {
                char *c = strdup("many-value-0");
                if (!c)
                        return -ENOMEM;
                c[11] = name[1];
                *ret = c;
                *ret_len = strlen(c);
                return 0;
        }
        for (size_t i = 0; i < ELEMENTSOF(secrets); i++) {
                if (!streq(secrets[i].name, name))
                        continue;
                if (!secrets[i].value)
                        return -ENOENT;
                if (secrets[i].hosts[0] && !host_in(secrets[i].hosts, h, port))
                        return -EACCES;
                char *c = malloc(secrets[i].len + 1);
                if (!c)
                        return -ENOMEM;
                memcpy(c, secrets[i].value, secrets[i].len);
                c[secrets[i].len] = 0;
                *ret = c;
                *ret_len = secrets[i].len;
                return 0;
        }
        return -ENOENT;
}

static const char *placeholder_of(const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(secrets); i++)
                if (streq(secrets[i].name, name))
                        return secrets[i].placeholder;
        return NULL;
}

/* -------------------------------------------------------- one rewrite */

static proxyreq req;
static egress_inject_result res;
static vault v;
static char why[256];
static bool shape; /* the result is well formed (success) or absent (refusal) */
static char shape_why[128];

static bool is_tchar(unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool bad_shape(const char *what) {
        snprintf(shape_why, sizeof shape_why, "%s", what);
        return false;
}

static unsigned count_in(const char *head, const char *name) {
        unsigned n = 0;
        size_t l = strlen(name);
        for (const char *p = strstr(head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n"))
                if (strncasecmp(p + 2, name, l) == 0 && p[2 + l] == ':')
                        n++;
        return n;
}

/* A successful head: "METHOD target HTTP/1.1", "Host: ...", header lines
 * "name: value" with nothing but the line ends for CR and LF, "Connection:
 * close" last, the empty line, nothing after; no placeholder of a secret
 * listed in used; each value kept for masking is in the head under its
 * name, and then the response is asked for whole and uncompressed. */
static bool check_head(void) {
        const char *h = res.head, *end;
        size_t n_host = 0, n_conn = 0;
        const char *last = NULL;

        if (!h)
                return bad_shape("no head");
        if (strlen(h) != res.head_len)
                return bad_shape("head_len is not the string length");
        end = h + res.head_len;
        if (res.head_len < 4 || memcmp(end - 4, "\r\n\r\n", 4) != 0)
                return bad_shape("does not end with CRLF CRLF");
        if (!startswith(h, req.method) || h[strlen(req.method)] != ' ')
                return bad_shape("does not start with the method");
        for (const char *p = h; p < end; p++)
                if ((*p == '\r' && p[1] != '\n') || (*p == '\n' && (p == h || p[-1] != '\r')))
                        return bad_shape("a bare CR or LF");
        const char *eol = strstr(h, "\r\n");
        if (eol - h < 9 || memcmp(eol - 9, " HTTP/1.1", 9) != 0)
                return bad_shape("request line does not end in HTTP/1.1");
        if (!startswith(eol + 2, "Host: "))
                return bad_shape("Host is not the first header");
        for (const char *line = eol + 2; line < end; line = eol + 2) {
                eol = strstr(line, "\r\n");
                if (eol == line) {
                        if (eol + 2 != end)
                                return bad_shape("bytes after the empty line");
                        break;
                }
                const char *colon = line;
                while (colon < eol && is_tchar((unsigned char) *colon))
                        colon++;
                if (colon == line || colon + 1 >= eol || colon[0] != ':' || colon[1] != ' ')
                        return bad_shape("a header line that is not \"name: value\"");
                if (strncasecmp(line, "host:", 5) == 0)
                        n_host++;
                if (strncasecmp(line, "connection:", 11) == 0)
                        n_conn++;
                last = line;
        }
        if (n_host != 1 || n_conn != 1)
                return bad_shape("not exactly one Host and one Connection");
        if (!last || !startswith(last, "Connection: close\r\n"))
                return bad_shape("Connection: close is not the last header");
        /* the placeholders of applied secrets are all gone from the headers */
        char used[sizeof res.used];
        snprintf(used, sizeof used, "%s", res.used);
        const char *headers = strstr(h, "\r\n") + 2;
        for (char *save = NULL, *name = strtok_r(used, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
                const char *p = placeholder_of(name);
                if (p && strstr(headers, p))
                        return bad_shape("a placeholder of an applied secret is left");
        }
        /* values kept for masking */
        if (res.n_values > EGRESS_INJECT_VALUES_MAX)
                return bad_shape("too many values");
        for (size_t i = 0; i < res.n_values; i++) {
                if (!res.values[i] || !memmem(h, res.head_len, res.values[i], res.value_lens[i]))
                        return bad_shape("a value kept is not in the head");
                if (!strstr(res.used, res.value_names[i]))
                        return bad_shape("a value kept under a name used does not list");
                for (size_t j = 0; j < i; j++)
                        if (streq(res.value_names[i], res.value_names[j]))
                                return bad_shape("a value kept twice");
        }
        if (res.n_values &&
            (count_in(h, "accept-encoding") != 1 || !strstr(h, "\r\nAccept-Encoding: identity\r\n") ||
             count_in(h, "range") || count_in(h, "if-range")))
                return bad_shape("a value was sent without asking for an identity, whole response");
        return true;
}

static void result_clear(void) {
        egress_inject_result_clear(&res);
}

/* Parse head (forward-proxy mode, or origin-form inside a tunnel), then
 * rewrite it for host:port with x. Returns apply's answer, or PARSE_FAILED. */
static int run(const egress_inject *x, const char *host, uint16_t port, bool tls, const char *head, bool origin) {
        egress_host h;
        size_t used = 0;
        int k;

        result_clear();
        memset(&v, 0, sizeof v);
        v.dest = host;
        v.port = port;
        why[0] = shape_why[0] = 0;
        shape = false;
        if (origin)
                proxyreq_init_origin(&req);
        else
                proxyreq_init(&req);
        k = proxyreq_feed(&req, head, strlen(head), &used);
        if (k != PROXYREQ_DONE) {
                printf("# head did not parse (%d %s): %s\n", k, req.why ? req.why : "", show(head));
                return PARSE_FAILED;
        }
        if (egress_host_parse(host, &h) < 0) {
                printf("# host did not parse: %s\n", host);
                return PARSE_FAILED;
        }
        k = egress_inject_apply(x, &h, port, tls, &req, resolve, &v, &res, why, sizeof why);
        if (v.wrong_dest)
                shape = bad_shape("resolve was asked for another destination");
        else if (k == 0)
                shape = check_head();
        else
                shape = (res.head == NULL && res.head_len == 0 && res.n_values == 0 && why[0]) ||
                        bad_shape("a refusal left a head, values or no reason");
        return k;
}

/* The head holds this exact line (without its CRLF). */
static bool has_line(const char *line) {
        char want[1024];
        snprintf(want, sizeof want, "\r\n%s\r\n", line);
        return res.head && strstr(res.head, want);
}

/* How many header lines have this name (case-insensitive). */
static unsigned count_header(const char *name) {
        return res.head ? count_in(res.head, name) : 0;
}

static bool head_has(const char *s) {
        return res.head && strstr(res.head, s);
}

static bool head_is(const char *s) {
        return res.head && streq(res.head, s);
}

/* The result keeps a copy of this value for masking. */
static bool has_value(const char *name, const char *val, size_t len) {
        for (size_t i = 0; i < res.n_values; i++)
                if (streq(res.value_names[i], name) && res.value_lens[i] == len && res.values[i] &&
                    memcmp(res.values[i], val, len) == 0)
                        return true;
        return false;
}

/* --------------------------------------------------------------- setup */

static void test_add_refusals(void) {
        egress_inject *x = NULL;
        char w[256];

        ok(egress_inject_new(&x) == 0 && x, "new");
        ok(egress_inject_empty(x) && egress_inject_empty(NULL), "a new set and NULL are empty");

        static const char *const bad_hosts[] = {
                "*", "0.0.0.0/0", "10.0.0.1", "10.0.0.0/8", "2001:db8::1", "[2001:db8::1]", "::/0",
                "api.example.test:443", "*.example.test:443", "*:443", "", "exa mple.test", "localhost",
                "a.*.example.test",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad_hosts); i++) {
                w[0] = 0;
                int k = egress_inject_add_transform(x, bad_hosts[i], "X-Key", "v", w, sizeof w);
                ok(k == -EINVAL && w[0], "transform host \"%s\" refused (%d: %s)", bad_hosts[i], k, w);
        }

        static const char *const forbidden[] = {
                "Host", "host", "HOST", "Content-Length", "content-length", "Transfer-Encoding", "Connection",
                "Proxy-Connection", "Keep-Alive", "TE", "Trailer", "Upgrade",
        };
        for (size_t i = 0; i < ELEMENTSOF(forbidden); i++) {
                w[0] = 0;
                int k = egress_inject_add_transform(x, "api.example.test", forbidden[i], "v", w, sizeof w);
                ok(k == -EINVAL && w[0], "transform header %s refused (%s)", forbidden[i], w);
        }

        char longname[258];
        memset(longname, 'x', sizeof longname - 1);
        longname[sizeof longname - 1] = 0;
        static const char *const bad_names[] = { "", "X Key", "X:Key", "X-Key\r", "X-Key\n", "K\xc3\xa4se", "(x)" };
        for (size_t i = 0; i < ELEMENTSOF(bad_names); i++)
                ok(egress_inject_add_transform(x, "api.example.test", bad_names[i], "v", w, sizeof w) == -EINVAL,
                   "header name \"%s\" refused", show(bad_names[i]));
        ok(egress_inject_add_transform(x, "api.example.test", longname, "v", w, sizeof w) == -EINVAL,
           "a 257-byte header name refused");

        static const char *const bad_values[] = {
                "a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x7f", "a\x01", "${e2b.secrets.}", "${e2b.secrets.gh",
                "Bearer ${e2b.secrets.a{b}", "${e2b.secrets.ok} ${e2b.secrets.}", "${e2b.secrets.a\tb}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad_values); i++)
                ok(egress_inject_add_transform(x, "api.example.test", "X-Key", bad_values[i], w, sizeof w) ==
                           -EINVAL,
                   "transform value \"%s\" refused (%s)", show(bad_values[i]), w);
        char name129[160];
        snprintf(name129, sizeof name129, "${e2b.secrets.%0129d}", 0);
        ok(egress_inject_add_transform(x, "api.example.test", "X-Key", name129, w, sizeof w) == -EINVAL,
           "a secret name over 128 bytes refused");
        char *huge = malloc(EGRESS_HEADER_VALUE_MAX + 2);
        memset(huge, 'v', EGRESS_HEADER_VALUE_MAX + 1);
        huge[EGRESS_HEADER_VALUE_MAX + 1] = 0;
        ok(egress_inject_add_transform(x, "api.example.test", "X-Key", huge, w, sizeof w) == -EINVAL,
           "a value over %d bytes refused", EGRESS_HEADER_VALUE_MAX);
        ok(egress_inject_empty(x), "refused transforms leave the set empty");

        /* placeholders */
        const char *one[] = { "github.test" };
        const char *star[] = { "github.test", "*" };
        const char *all[] = { "0.0.0.0/0" };
        const char *allport[] = { "*:443" };
        const char *junk[] = { "github.test", "exa mple.test" };
        ok(egress_inject_add_placeholder(x, P_GH, "gh", one, 0, w, sizeof w) == -EINVAL,
           "a secret bound to no host refused (%s)", w);
        ok(egress_inject_add_placeholder(x, P_GH, "gh", star, 2, w, sizeof w) == -EINVAL,
           "a secret bound to \"*\" refused (%s)", w);
        ok(egress_inject_add_placeholder(x, P_GH, "gh", all, 1, w, sizeof w) == -EINVAL,
           "a secret bound to 0.0.0.0/0 refused (%s)", w);
        ok(egress_inject_add_placeholder(x, P_GH, "gh", allport, 1, w, sizeof w) == -EINVAL,
           "a secret bound to *:443 refused (%s)", w);
        ok(egress_inject_add_placeholder(x, P_GH, "gh", junk, 2, w, sizeof w) == -EINVAL,
           "a secret bound to a malformed host refused (%s)", w);
        ok(egress_inject_add_placeholder(x, "hsp_123", "gh", one, 1, w, sizeof w) == -EINVAL &&
                   egress_inject_add_placeholder(x, P_GH "0", "gh", one, 1, w, sizeof w) == -EINVAL,
           "a placeholder of the wrong length refused");
        ok(egress_inject_add_placeholder(x, P_GH, "", one, 1, w, sizeof w) == -EINVAL &&
                   egress_inject_add_placeholder(x, P_GH, "a}b", one, 1, w, sizeof w) == -EINVAL &&
                   egress_inject_add_placeholder(x, P_GH, "a\nb", one, 1, w, sizeof w) == -EINVAL &&
                   egress_inject_add_placeholder(x, P_GH, name129 + 14, one, 1, w, sizeof w) == -EINVAL,
           "bad secret names refused");
        ok(egress_inject_empty(x), "refused placeholders leave the set empty");
        egress_host h;
        ok(egress_host_parse("github.test", &h) == 0 && !egress_inject_wants(x, &h, 443),
           "an empty set wants nothing");

        /* limits */
        w[0] = 0;
        ok(egress_inject_add_transform(x, "api.example.test", "X-Key", huge + 1, w, sizeof w) == 0,
           "a value of exactly %d bytes is taken (%s)", EGRESS_HEADER_VALUE_MAX, w);
        free(huge);
        char hn[32];
        int k = 0;
        for (int i = 1; i < EGRESS_HEADERS_MAX && k == 0; i++) {
                snprintf(hn, sizeof hn, "X-H%d", i);
                k = egress_inject_add_transform(x, "api.example.test", hn, "v", w, sizeof w);
        }
        ok(k == 0, "%d headers for one host", EGRESS_HEADERS_MAX);
        ok(egress_inject_add_transform(x, "api.example.test", "x-h1", "again", w, sizeof w) == 0,
           "setting a header again (other case) replaces it, even at the limit");
        ok(egress_inject_add_transform(x, "api.example.test", "X-One-More", "v", w, sizeof w) == -E2BIG,
           "header %d refused: E2BIG (%s)", EGRESS_HEADERS_MAX + 1, w);

        /* 32 headers of 8 KiB: the head would pass 256 KiB */
        for (int i = 1; i < EGRESS_HEADERS_MAX; i++) {
                char *val = malloc(EGRESS_HEADER_VALUE_MAX + 1);
                memset(val, 'a' + i % 26, EGRESS_HEADER_VALUE_MAX);
                val[EGRESS_HEADER_VALUE_MAX] = 0;
                snprintf(hn, sizeof hn, "X-H%d", i);
                k |= egress_inject_add_transform(x, "api.example.test", hn, val, w, sizeof w);
                free(val);
        }
        ok(k == 0, "32 values of %d bytes", EGRESS_HEADER_VALUE_MAX);
        k = run(x, "api.example.test", 443, TLS, "GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n", true);
        ok(k == -E2BIG && shape, "a head over the output limit: E2BIG, no head (%s)", why);
        egress_inject_free(x);

        ok(egress_inject_new(&x) == 0, "new");
        w[0] = 0;
        k = 0;
        int n = 0;
        for (; n < EGRESS_INJECT_MAX && k == 0; n++) {
                if (n % 2) {
                        snprintf(hn, sizeof hn, "h%d.example.test", n);
                        k = egress_inject_add_transform(x, hn, "X-Key", "v", w, sizeof w);
                } else {
                        char p[EGRESS_PLACEHOLDER_LEN + 1], nm[16], host[32];
                        const char *hosts[] = { host };
                        snprintf(p, sizeof p, "hsp_%040d", n);
                        snprintf(nm, sizeof nm, "s%d", n);
                        snprintf(host, sizeof host, "p%d.example.test", n);
                        k = egress_inject_add_placeholder(x, p, nm, hosts, 1, w, sizeof w);
                }
        }
        ok(k == 0 && n == EGRESS_INJECT_MAX, "%d transforms and placeholders (%s)", n, w);
        ok(egress_inject_add_transform(x, "more.example.test", "X-Key", "v", w, sizeof w) == -E2BIG,
           "one transform more: E2BIG (%s)", w);
        ok(egress_inject_add_placeholder(x, P_GH, "gh", one, 1, w, sizeof w) == -E2BIG,
           "one placeholder more: E2BIG (%s)", w);
        ok(egress_inject_add_transform(x, "h1.example.test", "X-Other", "v", w, sizeof w) == 0,
           "a header for a host already there still fits");
        egress_inject_free(x);
        ok(egress_inject_free(NULL) == NULL, "free(NULL)");
}

/* The set most tests use. */
static egress_inject *make_set(void) {
        egress_inject *x = NULL;
        char w[256] = "";
        int k = egress_inject_new(&x);

        static const struct {
                const char *host, *header, *value;
        } rules[] = {
                { "api.example.test", "Authorization", "Bearer ${e2b.secrets.rulekey}" },
                { "api.example.test", "X-Static", "static-1" },
                { "*.example.test", "X-Suffix", "short" },
                { "*.deep.example.test", "X-Suffix", "long" },
                { "*.deep.example.test", "X-Key", "k-${e2b.secrets.stripe}-${e2b.secrets.rulekey}" },
                { "github.test", "X-Gh-Rule", "on" },
                { "nokey.test", "X-Missing", "${e2b.secrets.missing}" },
                { "badval.test", "X-Bad", "${e2b.secrets.badrule}" },
                { "leak.test", "X-Leak", "${e2b.secrets.elsewhere}" },
        };
        for (size_t i = 0; i < ELEMENTSOF(rules) && k == 0; i++)
                k = egress_inject_add_transform(x, rules[i].host, rules[i].header, rules[i].value, w, sizeof w);
        for (size_t i = 0; i < ELEMENTSOF(secrets) && k == 0; i++) {
                size_t n = 0;
                while (n < 3 && secrets[i].hosts[n])
                        n++;
                if (secrets[i].placeholder)
                        k = egress_inject_add_placeholder(x, secrets[i].placeholder, secrets[i].name,
                                                          secrets[i].hosts, n, w, sizeof w);
        }
        ok(k == 0 && !egress_inject_empty(x), "the test set is built (%s)", w);
        return x;
}

static void test_wants(const egress_inject *x) {
        static const struct {
                const char *host;
                uint16_t port;
                bool want;
        } cases[] = {
                { "api.example.test", 443, true },     /* exact transform */
                { "x.example.test", 80, true },        /* suffix transform */
                { "a.deep.example.test", 8443, true }, /* longer suffix */
                { "example.test", 443, false },        /* "*.x" is below x, not x */
                { "github.test", 1234, true },         /* placeholder, any port */
                { "raw.githubusercontent.test", 443, true },
                { "githubusercontent.test", 443, false },
                { "api.stripe.test", 443, true }, /* port-restricted binding */
                { "api.stripe.test", 80, false },
                { "10.1.2.3", 443, true }, /* CIDR binding */
                { "11.1.2.3", 443, false },
                { "2001:db8::1", 443, true },
                { "2001:db9::1", 443, false },
                { "unrelated.test", 443, false },
                { "nokey.test", 443, true },
        };
        egress_host h;
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                bool parsed = egress_host_parse(cases[i].host, &h) == 0;
                ok(parsed && egress_inject_wants(x, &h, cases[i].port) == cases[i].want, "wants %s:%u: %s",
                   cases[i].host, cases[i].port, cases[i].want ? "yes" : "no");
        }
        ok(egress_host_parse("api.example.test", &h) == 0 && !egress_inject_wants(NULL, &h, 443),
           "the NULL set wants nothing");
}

static void test_has_placeholder(const egress_inject *x) {
        static const char tls[] = "\x16\x03\x01\x00\x05"
                                  "GET / HTTP/1.1\r\nAuthorization: " P_NET "\r\n";
        ok(egress_inject_has_placeholder(x, tls, sizeof tls - 1), "a placeholder after binary bytes is found");
        ok(egress_inject_has_placeholder(x, P_GONE, EGRESS_PLACEHOLDER_LEN), "exactly a placeholder");
        ok(!egress_inject_has_placeholder(x, P_GH, EGRESS_PLACEHOLDER_LEN - 1), "a placeholder cut short is not one");
        ok(!egress_inject_has_placeholder(x, P_FREE, EGRESS_PLACEHOLDER_LEN),
           "a placeholder-like string not in the set is not one");
        ok(!egress_inject_has_placeholder(x, "", 0), "empty buffer");
        ok(!egress_inject_has_placeholder(NULL, P_GH, EGRESS_PLACEHOLDER_LEN), "the NULL set has no placeholders");
}

/* ------------------------------------------------------- placeholders */

static void test_placeholders(const egress_inject *x) {
        int k;

        /* a bound name, origin-form inside an intercepted tunnel */
        k = run(x, "github.test", 443, TLS,
                "GET /user HTTP/1.1\r\nHost: github.test\r\nAuthorization: Bearer " P_GH "\r\nAccept: */*\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("Authorization: Bearer " V_GH) && !head_has(P_GH) && v.calls == 1 &&
                   streq(v.asked, "gh"),
           "placeholder replaced for a bound name (%d %s %s)", k, why, shape_why);
        ok(k == 0 && startswith(res.head, "GET /user HTTP/1.1\r\nHost: github.test\r\n") && has_line("Accept: */*"),
           "request line and Host of the destination");
        ok(k == 0 && streq(res.used, "gh,rule:github.test") && has_line("X-Gh-Rule: on"),
           "used lists the secret and the rule: \"%s\"", res.used);

        /* a *.suffix binding */
        k = run(x, "raw.githubusercontent.test", 443, TLS,
                "GET /a/b HTTP/1.1\r\nHost: raw.githubusercontent.test\r\nX-Token: " P_GH "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-Token: " V_GH) && v.calls == 1 && streq(res.used, "gh"),
           "placeholder replaced for a *.suffix binding (%d %s %s, used \"%s\")", k, why, shape_why, res.used);
        k = run(x, "githubusercontent.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: githubusercontent.test\r\nX-Token: " P_GH "\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0, "*.suffix does not bind the name itself (%d %s)", k, why);

        /* several placeholders and several occurrences in one value: each
         * secret looked up once */
        k = run(x, "multi.test", 443, TLS,
                "POST /x HTTP/1.1\r\nHost: multi.test\r\nContent-Length: 0\r\n"
                "X-All: a " P_GH " b " P_GH P_STRIPE " c " P_STRIPE "\r\n"
                "X-Again: " P_GH "\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("X-All: a " V_GH " b " V_GH V_STRIPE " c " V_STRIPE) &&
                   has_line("X-Again: " V_GH) && has_line("Content-Length: 0") && !head_has(P_GH) &&
                   !head_has(P_STRIPE),
           "every occurrence of every placeholder replaced (%d %s %s)", k, why, shape_why);
        ok(k == 0 && v.calls == 2 && streq(v.asked, "gh,stripe") && streq(res.used, "gh,stripe"),
           "each secret looked up once (%u: %s), used \"%s\"", v.calls, v.asked, res.used);

        /* plain HTTP: no secret ever leaves in it */
        k = run(x, "github.test", 80, PLAIN,
                "GET http://github.test/user HTTP/1.1\r\nHost: github.test\r\nAuthorization: Bearer " P_GH "\r\n\r\n",
                false);
        ok(k == -EACCES && shape && v.calls == 0 && strstr(why, "TLS"),
           "a bound placeholder in plain HTTP: EACCES, no lookup (%s)", why);
        k = run(x, "github.test", 443, PLAIN, "GET / HTTP/1.1\r\nHost: github.test\r\nX-A: " P_GH "\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0, "... on port 443 as well, when the proxy holds no TLS (%s)", why);

        /* port-restricted binding */
        k = run(x, "api.stripe.test", 443, TLS,
                "GET /v1/charges HTTP/1.1\r\nHost: api.stripe.test\r\nAuthorization: Bearer " P_STRIPE "\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("Authorization: Bearer " V_STRIPE) && has_line("Host: api.stripe.test"),
           "port-restricted binding, matching port (%d %s)", k, why);
        k = run(x, "api.stripe.test", 8443, TLS,
                "GET /v1/charges HTTP/1.1\r\nHost: api.stripe.test:8443\r\nAuthorization: Bearer " P_STRIPE
                "\r\n\r\n",
                true);
        ok(k == -EACCES && shape && v.calls == 0 && strstr(why, "stripe"),
           "port-restricted binding, other port: EACCES (%s)", why);

        /* CIDR bindings with address hosts */
        k = run(x, "10.1.2.3", 443, TLS, "GET / HTTP/1.1\r\nHost: 10.1.2.3\r\nX-Net: " P_NET "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-Net: " V_NET) && has_line("Host: 10.1.2.3") && streq(res.used, "net"),
           "CIDR binding, IPv4 host (%d %s)", k, why);
        k = run(x, "10.1.2.3", 8443, TLS, "GET / HTTP/1.1\r\nHost: 10.1.2.3:8443\r\nX-Net: " P_NET "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("Host: 10.1.2.3:8443"), "Host keeps a port other than 80/443");
        k = run(x, "2001:db8::1", 8443, TLS,
                "GET /p HTTP/1.1\r\nHost: [2001:db8::1]:8443\r\nX-Net: " P_NET "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-Net: " V_NET) && has_line("Host: [2001:db8::1]:8443"),
           "CIDR binding, IPv6 host, Host bracketed (%d %s %s)", k, why, show(res.head));
        k = run(x, "2001:db8::1", 443, TLS, "GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\nX-Net: " P_NET "\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("Host: [2001:db8::1]"), "IPv6 on 443: bracketed, no port");
        k = run(x, "11.0.0.1", 443, TLS, "GET / HTTP/1.1\r\nHost: 11.0.0.1\r\nX-Net: " P_NET "\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0, "CIDR binding, address outside it: EACCES (%s)", why);
        k = run(x, "ten.test", 443, TLS, "GET / HTTP/1.1\r\nHost: ten.test\r\nX-Net: " P_NET "\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0, "CIDR binding, a name host: EACCES (%s)", why);

        /* a placeholder for a host it is not bound to */
        k = run(x, "evil.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: evil.test\r\nAccept: */*\r\nX-Exfil: " P_GH "\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0 && strstr(why, "gh") && strstr(why, "evil.test"),
           "placeholder in a header to an unbound host: EACCES, no head, no lookup (%s)", why);
        k = run(x, "evil.test", 80, PLAIN, "GET http://evil.test/?k=" P_GH " HTTP/1.1\r\nHost: evil.test\r\n\r\n",
                false);
        ok(k == -EACCES && shape && v.calls == 0, "placeholder in the request target (absolute-form): EACCES (%s)",
           why);
        k = run(x, "evil.test", 443, TLS, "GET /" P_STRIPE "/x HTTP/1.1\r\nHost: evil.test\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0, "placeholder in the request target (origin-form): EACCES (%s)",
           why);
        k = run(x, "github.test", 443, TLS,
                "GET /?a=" P_GH "&b=" P_STRIPE " HTTP/1.1\r\nHost: github.test\r\n\r\n", true);
        ok(k == -EACCES && shape && v.calls == 0,
           "an unbound placeholder after a bound one in the request target: EACCES (got %d)", k);
        k = run(x, "github.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: github.test\r\nAuthorization: Bearer " P_GH "\r\nX-Other: " P_STRIPE
                "\r\n\r\n",
                true);
        ok(k == -EACCES && shape && strstr(why, "stripe"),
           "one bound and one unbound placeholder: EACCES (%s), %u lookups", why, v.calls);
        k = run(x, "api.example.test", 443, TLS, "GET / HTTP/1.1\r\nHost: api.example.test\r\nX-A: " P_GH "\r\n\r\n",
                true);
        ok(k == -EACCES && shape, "a transform for the host does not bind its placeholders (%s)", why);
        /* a header name is part of the header: a placeholder there is refused too */
        k = run(x, "evil.test", 443, TLS, "GET / HTTP/1.1\r\nHost: evil.test\r\nX-" P_GH ": 1\r\n\r\n", true);
        ok(k == -EACCES && shape && !head_has(P_GH),
           "placeholder in a header name to an unbound host: EACCES (got %d %s)", k, show(res.head));
        /* the request target is only checked: a bound placeholder there is
         * sent as it is (inject.h: "replaced ... in every header value") */
        k = run(x, "github.test", 443, TLS, "GET /repos?token=" P_GH " HTTP/1.1\r\nHost: github.test\r\n\r\n",
                true);
        ok(k == 0 && shape && v.calls == 0, "a bound placeholder in the request target is not refused (%d %s)", k,
           why);

        /* a placeholder-like string that is not in the set is just text */
        k = run(x, "evil.test", 443, TLS, "GET / HTTP/1.1\r\nHost: evil.test\r\nX-A: " P_FREE "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-A: " P_FREE) && v.calls == 0, "an unknown placeholder passes (%s)", why);
        k = run(x, "evil.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: evil.test\r\nX-A: hsp_hsp_" P_FREE "hsp_\r\n\r\n", true);
        ok(k == 0 && shape && v.calls == 0, "\"hsp_\" alone is just text");
        /* the sandbox cannot ask for a secret by reference */
        k = run(x, "evil.test", 443, TLS, "GET / HTTP/1.1\r\nHost: evil.test\r\nX-A: ${e2b.secrets.rulekey}\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("X-A: ${e2b.secrets.rulekey}") && v.calls == 0,
           "${e2b.secrets.X} in a client header is not resolved");
        k = run(x, "github.test", 443, TLS, "GET / HTTP/1.1\r\nHost: github.test\r\nX-A: ${e2b.secrets.gh}\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("X-A: ${e2b.secrets.gh}") && v.calls == 0 && !head_has(V_GH),
           "... not even to a host the secret is bound to (%s)", v.asked);

        /* secrets that cannot be sent */
        k = run(x, "gone.test", 443, TLS, "GET / HTTP/1.1\r\nHost: gone.test\r\nX-A: " P_GONE "\r\n\r\n", true);
        ok(k == -ENOENT && shape && v.calls == 1 && strstr(why, "gone"), "a deleted secret: ENOENT (%s)", why);
        k = run(x, "bad.test", 443, TLS, "GET / HTTP/1.1\r\nHost: bad.test\r\nX-A: " P_BAD "\r\n\r\n", true);
        ok(k == -EINVAL && shape && v.calls == 1, "a value with CR LF: EINVAL, no head (%s)", why);
        k = run(x, "bad.test", 443, TLS, "GET / HTTP/1.1\r\nHost: bad.test\r\nX-A: " P_LF "\r\n\r\n", true);
        ok(k == -EINVAL && shape, "a value with LF: EINVAL (%s)", why);
        k = run(x, "bad.test", 443, TLS, "GET / HTTP/1.1\r\nHost: bad.test\r\nX-A: " P_NUL "\r\n\r\n", true);
        ok(k == -EINVAL && shape, "a value with NUL: EINVAL (%s)", why);
        {
                egress_host h;
                proxyreq_init_origin(&req);
                static const char head[] = "GET / HTTP/1.1\r\nHost: github.test\r\nX-A: " P_GH "\r\n\r\n";
                result_clear();
                int kk = proxyreq_feed(&req, head, sizeof head - 1, NULL) == PROXYREQ_DONE &&
                                egress_host_parse("github.test", &h) == 0
                        ? egress_inject_apply(x, &h, 443, TLS, &req, NULL, NULL, &res, why, sizeof why)
                        : PARSE_FAILED;
                ok(kk == -ENOENT && !res.head, "no resolve callback: ENOENT (%s)", why);
        }

        /* values the proxy could not mask in the response are refused */
        k = run(x, "big.test", 443, TLS, "GET / HTTP/1.1\r\nHost: big.test\r\nX-Big: " P_BIG "\r\n\r\n", true);
        ok(k == 0 && shape && has_value("big", big_value, EGRESS_MASK_VALUE_MAX),
           "a value of exactly %d bytes is sent (%d %s)", EGRESS_MASK_VALUE_MAX, k, why);
        k = run(x, "big.test", 443, TLS, "GET / HTTP/1.1\r\nHost: big.test\r\nX-Big: " P_HUGE "\r\n\r\n", true);
        ok(k == -E2BIG && shape, "a value of %d bytes: E2BIG (%s)", EGRESS_MASK_VALUE_MAX + 1, why);
        k = run(x, "big.test", 443, TLS, "GET / HTTP/1.1\r\nHost: big.test\r\nX-Big: a" P_EMPTY "b\r\n\r\n", true);
        ok(k < 0 && shape, "an empty value is refused (%d %s)", k, why);

        /* at most 16 substitutions */
        char head[4096];
        for (int n = 16; n <= 17; n++) {
                int o = snprintf(head, sizeof head, "GET / HTTP/1.1\r\nHost: github.test\r\n");
                for (int i = 0; i < n; i++)
                        o += snprintf(head + o, sizeof head - (size_t) o, "X-S%d: %s\r\n", i, P_GH);
                snprintf(head + o, sizeof head - (size_t) o, "\r\n");
                k = run(x, "github.test", 443, TLS, head, true);
                if (n == 16)
                        ok(k == 0 && shape && v.calls == 1 && streq(res.used, "gh,rule:github.test"),
                           "16 substitutions, one lookup, used \"%s\" (%d %s)", res.used, k, why);
                else
                        ok(k == -E2BIG && shape, "17 substitutions: E2BIG (%s)", why);
        }

        /* a placeholder in a header that is not sent is not a leak */
        k = run(x, "evil.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: Basic " P_GH "\r\n\r\n", true);
        ok((k == 0 && shape && !head_has(P_GH) && v.calls == 0) || (k == -EACCES && shape),
           "a placeholder in a dropped hop-by-hop header is never sent (%d)", k);
}

/* ---------------------------------------------------------- transforms */

static void test_transforms(const egress_inject *x) {
        int k;

        /* exact name: its set replaces the client's copies, in any case */
        k = run(x, "api.example.test", 443, TLS,
                "GET /v1/x HTTP/1.1\r\nHost: api.example.test\r\nauthorization: Basic b2xk\r\n"
                "X-Keep: 1\r\nAUTHORIZATION: Basic dHdv\r\nx-static: client\r\nX-Suffix: client\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("Authorization: Bearer " V_RULEKEY) && count_header("authorization") == 1 &&
                   !head_has("b2xk") && !head_has("dHdv"),
           "exact transform: Authorization set once, the client's copies dropped (%d %s %s)", k, why, shape_why);
        ok(k == 0 && has_line("X-Static: static-1") && count_header("x-static") == 1 && !head_has("client\r\nX-S"),
           "exact transform: X-Static replaced case-insensitively");
        ok(k == 0 && has_line("X-Suffix: client") && !head_has("short") && !head_has("long") && has_line("X-Keep: 1"),
           "exact beats suffix, sets are not merged: the suffix's header is not added");
        ok(k == 0 && v.calls == 1 && streq(v.asked, "rulekey") && streq(res.used, "rulekey,rule:api.example.test"),
           "one lookup; used \"%s\"", res.used);

        /* rules are for HTTPS only */
        k = run(x, "api.example.test", 80, PLAIN,
                "GET http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Basic mine\r\n\r\n",
                false);
        ok(k == 0 && shape && has_line("Authorization: Basic mine") && !head_has("static-1") && v.calls == 0 &&
                   streq(res.used, ""),
           "plain HTTP: no rule applies, nothing looked up (%d %s)", k, why);

        /* a suffix */
        k = run(x, "x.example.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: x.example.test\r\nAuthorization: Basic mine\r\nAccept-Encoding: gzip\r\n\r\n",
                true);
        ok(k == 0 && shape && has_line("X-Suffix: short") && has_line("Authorization: Basic mine") &&
                   !head_has("static-1") && v.calls == 0 && streq(res.used, "rule:*.example.test"),
           "suffix transform without a secret: no lookup (%d %s, used \"%s\")", k, why, res.used);
        ok(k == 0 && has_line("Accept-Encoding: gzip") && res.n_values == 0,
           "no value sent: the client's Accept-Encoding is kept");

        /* the longest suffix wins */
        k = run(x, "a.deep.example.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: a.deep.example.test\r\nX-Suffix: client\r\nX-Key: client\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-Suffix: long") && count_header("x-suffix") == 1 && !head_has("short") &&
                   has_line("X-Key: k-" V_STRIPE "-" V_RULEKEY) && count_header("x-key") == 1 && !head_has("client"),
           "longest suffix wins; two secrets in one value (%d %s %s)", k, why, show(res.head));
        ok(k == 0 && v.calls == 2 && streq(res.used, "stripe,rulekey,rule:*.deep.example.test"),
           "used \"%s\", lookups %s", res.used, v.asked);
        k = run(x, "deep.example.test", 443, TLS, "GET / HTTP/1.1\r\nHost: deep.example.test\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-Suffix: short") && !head_has("X-Key") && v.calls == 0,
           "the name a suffix is of takes the shorter suffix");
        k = run(x, "example.test", 443, TLS, "GET / HTTP/1.1\r\nHost: example.test\r\n\r\n", true);
        ok(k == 0 && shape && !head_has("X-Suffix") && streq(res.used, ""), "no transform for the apex");

        /* transforms are for names only */
        k = run(x, "10.1.2.3", 443, TLS, "GET / HTTP/1.1\r\nHost: 10.1.2.3\r\n\r\n", true);
        ok(k == 0 && shape && streq(res.used, "") && v.calls == 0, "an address gets no transform");

        /* a transform that cannot be applied */
        k = run(x, "nokey.test", 443, TLS, "GET / HTTP/1.1\r\nHost: nokey.test\r\n\r\n", true);
        ok(k == -ENOENT && shape && v.calls == 1 && strstr(why, "missing"),
           "a rule naming a missing secret: ENOENT, no head (%s)", why);
        k = run(x, "badval.test", 443, TLS, "GET / HTTP/1.1\r\nHost: badval.test\r\n\r\n", true);
        ok(k == -EINVAL && shape && v.calls == 1, "a rule whose secret holds CR LF: EINVAL, no head (%s)", why);
        k = run(x, "leak.test", 443, TLS, "GET / HTTP/1.1\r\nHost: leak.test\r\n\r\n", true);
        ok(k == -EACCES && shape && !head_has("elsewhere-value"),
           "a rule cannot carry a secret to a host it is not bound to: EACCES (%s)", why);
}

/* --------------------------------------------------- values to mask */

static void test_values(const egress_inject *x) {
        int k;

        k = run(x, "multi.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: multi.test\r\nX-A: " P_GH P_GH "\r\nX-B: " P_STRIPE " " P_GH
                "\r\nAccept-Encoding: gzip, br\r\nRange: bytes=0-10\r\nIf-Range: \"x\"\r\nAccept: */*\r\n\r\n",
                true);
        ok(k == 0 && shape && res.n_values == 2 && has_value("gh", V_GH, strlen(V_GH)) &&
                   has_value("stripe", V_STRIPE, strlen(V_STRIPE)),
           "values: each distinct value once, under its name (%zu %s)", res.n_values, shape_why);
        ok(k == 0 && has_line("Accept-Encoding: identity") && count_header("accept-encoding") == 1 &&
                   !count_header("range") && !count_header("if-range") && has_line("Accept: */*"),
           "a request carrying values asks for an identity, whole response");
        k = run(x, "a.deep.example.test", 443, TLS, "GET / HTTP/1.1\r\nHost: a.deep.example.test\r\n\r\n", true);
        ok(k == 0 && res.n_values == 2 && has_value("stripe", V_STRIPE, strlen(V_STRIPE)) &&
                   has_value("rulekey", V_RULEKEY, strlen(V_RULEKEY)) && has_line("Accept-Encoding: identity"),
           "values: a rule's secrets are kept too (%zu)", res.n_values);
        k = run(x, "x.example.test", 443, TLS, "GET / HTTP/1.1\r\nHost: x.example.test\r\nRange: bytes=1-\r\n\r\n",
                true);
        ok(k == 0 && res.n_values == 0 && has_line("Range: bytes=1-") && !head_has("identity"),
           "values: none for a rule without secrets, Range kept");
        k = run(x, "unrelated.test", 443, TLS, "GET / HTTP/1.1\r\nHost: unrelated.test\r\nX-A: " V_GH "\r\n\r\n",
                true);
        ok(k == 0 && res.n_values == 0 && has_line("X-A: " V_GH),
           "values: a value the client wrote itself is not one injected");
        k = run(x, "multi.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: multi.test\r\nX-A: " P_GH "\r\nX-B: " P_BAD "\r\n\r\n", true);
        ok(k == -EACCES && shape && res.n_values == 0 && res.values[0] == NULL,
           "values: a refusal after a substitution keeps none (%d)", k);

        /* nine secrets bound to one host, all sent: every value that went
         * upstream must be masked in the response, or the refusal says why */
        egress_inject *many = NULL;
        char w[256] = "", head[1024];
        const char *hosts[] = { "many.test" };
        int o = snprintf(head, sizeof head, "GET / HTTP/1.1\r\nHost: many.test\r\nX-All:");
        k = egress_inject_new(&many);
        for (int i = 1; i <= 9 && k == 0; i++) {
                char p[EGRESS_PLACEHOLDER_LEN + 1], nm[16];
                snprintf(p, sizeof p, "hsp_%040d", i);
                snprintf(nm, sizeof nm, "m%d", i);
                k = egress_inject_add_placeholder(many, p, nm, hosts, 1, w, sizeof w);
                o += snprintf(head + o, sizeof head - (size_t) o, " %s", p);
        }
        snprintf(head + o, sizeof head - (size_t) o, "\r\n\r\n");
        ok(k == 0, "nine secrets for many.test (%s)", w);
        k = run(many, "many.test", 443, TLS, head, true);
        bool all_kept = true;
        for (int i = 1; i <= 9; i++) {
                char val[32], nm[16];
                snprintf(val, sizeof val, "many-value-%d", i);
                snprintf(nm, sizeof nm, "m%d", i);
                if (k == 0 && head_has(val) && !has_value(nm, val, strlen(val)))
                        all_kept = false;
        }
        ok(k < 0 ? shape : shape && all_kept,
           "nine distinct values sent: each is kept for masking, or the head is refused (got %d, %zu of %d kept)", k,
           res.n_values, EGRESS_INJECT_VALUES_MAX);
        egress_inject_free(many);
}

/* ------------------------------------------------------------- used */

static void test_used(void) {
        /* eight secrets with 40-byte names and a rule, all on one host */
        egress_inject *x = NULL;
        char w[256] = "", head[2048];
        const char *hosts[] = { "names.test" };
        int k = egress_inject_new(&x);
        int o = snprintf(head, sizeof head, "GET / HTTP/1.1\r\nHost: names.test\r\nX-All:");
        k |= egress_inject_add_transform(x, "names.test", "X-R", "on", w, sizeof w);
        for (int i = 1; i <= 8 && k == 0; i++) {
                char p[EGRESS_PLACEHOLDER_LEN + 1], nm[64];
                snprintf(p, sizeof p, "hsp_%040d", i);
                snprintf(nm, sizeof nm, "m%d-%038d", i, 0);
                k = egress_inject_add_placeholder(x, p, nm, hosts, 1, w, sizeof w);
                o += snprintf(head + o, sizeof head - (size_t) o, " %s", p);
        }
        snprintf(head + o, sizeof head - (size_t) o, "\r\n\r\n");
        ok(k == 0, "eight secrets with long names (%s)", w);
        k = run(x, "names.test", 443, TLS, head, true);
        char list[sizeof res.used];
        unsigned items = 0;
        bool whole = true;
        snprintf(list, sizeof list, "%s", res.used);
        for (char *save = NULL, *it = strtok_r(list, ",", &save); it; it = strtok_r(NULL, ",", &save), items++)
                whole &= streq(it, "rule:names.test") || (strlen(it) == 41 && it[0] == 'm');
        ok(k == 0 && whole && items == 9 && strstr(res.used, "rule:names.test"),
           "used names every secret and the rule, whole (got %d: %u items, %zu bytes, ends \"%s\")", k, items,
           strlen(res.used), res.used + (strlen(res.used) > 20 ? strlen(res.used) - 20 : 0));
        egress_inject_free(x);
}

/* ------------------------------------------------- framing, NULL sets */

static void test_framing(const egress_inject *x) {
        static const char hop[] = "POST http://unrelated.test/a?b=c HTTP/1.1\r\nHost: unrelated.test\r\n"
                                  "Connection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n"
                                  "Proxy-Authorization: Basic Zm9vOmJhcg==\r\nTE: trailers\r\nX-Hop: 1\r\nAccept: */*\r\n"
                                  "Content-Length: 3\r\nX-Empty:\r\n\r\n";
        static const char hop_out[] = "POST /a?b=c HTTP/1.1\r\nHost: unrelated.test\r\nAccept: */*\r\n"
                                      "Content-Length: 3\r\nX-Empty: \r\nConnection: close\r\n\r\n";
        const egress_inject *sets[] = { x, NULL };
        egress_inject *empty = NULL;
        int k;

        (void) egress_inject_new(&empty);
        for (size_t i = 0; i < ELEMENTSOF(sets); i++) {
                const char *which = sets[i] ? "the set" : "NULL";
                for (int tls = 0; tls <= 1; tls++) {
                        k = run(sets[i], "unrelated.test", 80, tls, hop, false);
                        ok(k == 0 && shape && head_is(hop_out) && v.calls == 0 && streq(res.used, ""),
                           "%s, %s: hop-by-hop headers dropped, Connection: close, no lookup (%d %s %s)", which,
                           tls ? "TLS" : "plain", k, why, show(res.head));
                }
                k = run(sets[i], "unrelated.test", 8443, TLS,
                        "PUT / HTTP/1.1\r\nHost: Unrelated.TEST:8443\r\nTransfer-Encoding: chunked\r\n\r\n", true);
                ok(k == 0 && shape &&
                           head_is("PUT / HTTP/1.1\r\nHost: unrelated.test:8443\r\nTransfer-Encoding: chunked\r\n"
                                   "Connection: close\r\n\r\n"),
                   "%s: Host rewritten to the destination, chunked kept (%s)", which, show(res.head));
                k = run(sets[i], "unrelated.test", 80, PLAIN, "GET http://unrelated.test/ HTTP/1.0\r\n\r\n", false);
                ok(k == 0 && shape && head_is("GET / HTTP/1.1\r\nHost: unrelated.test\r\nConnection: close\r\n\r\n"),
                   "%s: an HTTP/1.0 head without Host gets one", which);
                k = run(sets[i], "unrelated.test", 443, TLS, "OPTIONS * HTTP/1.1\r\nHost: unrelated.test\r\n\r\n", true);
                ok(k == 0 && shape && startswith(res.head, "OPTIONS * HTTP/1.1\r\n"), "%s: OPTIONS *", which);
        }
        /* with no set, placeholders are just bytes */
        k = run(NULL, "evil.test", 443, TLS,
                "GET /" P_GH " HTTP/1.1\r\nHost: evil.test\r\nX-A: " P_GH "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("X-A: " P_GH) && v.calls == 0, "NULL set: headers pass through untouched");
        k = run(empty, "api.example.test", 443, TLS,
                "GET / HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Basic x\r\n\r\n", true);
        ok(k == 0 && shape && has_line("Authorization: Basic x") && v.calls == 0 && streq(res.used, ""),
           "an empty set: headers pass through untouched");
        /* the destination decides, not the head's own Host */
        k = run(x, "github.test", 443, TLS, "GET / HTTP/1.1\r\nHost: evil.test\r\nX-A: " P_GH "\r\n\r\n", true);
        ok(k == 0 && shape && has_line("Host: github.test") && !head_has("evil.test") && has_line("X-A: " V_GH),
           "Host comes from the destination passed in");
        egress_inject_free(empty);
}

int main(void) {
        memset(big_value, 'B', sizeof big_value);
        for (size_t i = 0; i < ELEMENTSOF(secrets); i++)
                if (secrets[i].placeholder && strlen(secrets[i].placeholder) != EGRESS_PLACEHOLDER_LEN)
                        return printf("Bail out! placeholder %zu is not %d bytes\n", i, EGRESS_PLACEHOLDER_LEN), 1;

        test_add_refusals();
        egress_inject *x = make_set();
        test_wants(x);
        test_has_placeholder(x);
        test_placeholders(x);
        test_transforms(x);
        test_values(x);
        test_used();
        test_framing(x);
        egress_inject_free(x);
        result_clear();
        return tap_done();
}
