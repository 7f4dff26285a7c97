/* SPDX-License-Identifier: Apache-2.0 */
/* Credential injection (lib/egress/inject.c) on request heads a sandbox
 * program sends. The first byte chooses the destination (bits 0-2), the port
 * (bits 3-4), the parser mode (bit 5: origin-form, as inside an intercepted
 * tunnel) and whether the proxy holds TLS to the destination (bit 6); the
 * rest is the head, fed to proxyreq, in which the bytes 0x01..0x07 stand for
 * the placeholders of the fixed set (control bytes a head cannot hold
 * otherwise). Heads proxyreq refuses are skipped.
 *
 * Invariants, not just "no crash": a rewritten head starts with the method,
 * ends with CRLF CRLF, and every line between is "name: value" without CR or
 * LF; no header value holds a placeholder, and no placeholder of a secret
 * not bound to the destination appears at all; a secret's value appears only
 * inside TLS, for a destination it is bound to, when its placeholder was sent
 * or the destination's rule names it (or the head carried those bytes
 * itself); each secret is looked up at most once, and only then; every value
 * put into the head is kept for masking and the response asked for
 * uncompressed and whole; a refusal leaves no head and has a cause in the
 * input. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "egress/inject.h"
#include "egress/policy.h"
#include "egress/proxyreq.h"
#include "util/macro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { S_GH, S_STRIPE, S_BAD, S_GONE, S_V6, S_TEAM, S_HUGE, N_SECRETS };

/* "<huge-hhh...>": longer than the proxy can mask in a response */
#define HUGE_VALUE_LEN (EGRESS_MASK_VALUE_MAX + 1)
static char huge_value[HUGE_VALUE_LEN + 1];

static const struct {
        const char *name, *placeholder;
        const char *value; /* NULL: deleted, resolve fails */
        const char *hosts[2];
        size_t n_hosts;
} secrets[N_SECRETS] = {
        /* values start with '<' and end with '>' and hold neither inside, so
         * no value can be spelt by the end of another plus client bytes */
        [S_GH] = { "gh", "hsp_1041179cbdda366fd7b0347f09255f775170e103", "<gh-value-1>",
                   { "api.fuzz.test", "*.deep.fuzz.test" }, 2 },
        [S_STRIPE] = { "stripe", "hsp_2fcb5a43a42afa8e99726c9487c367f84548e3f8", "<stripe-value-2>",
                       { "api.fuzz.test:443", "10.0.0.0/8" }, 2 },
        [S_BAD] = { "bad", "hsp_1902e3d6fc4e78a0bcc50ba12b882769afbf4a8c", "<bad-\n-value-5>",
                    { "bad.fuzz.test" }, 1 },
        [S_GONE] = { "gone", "hsp_a6dfdeaa3a44a4c52d44284847d7160892b4017e", NULL, { "api.fuzz.test" }, 1 },
        [S_V6] = { "v6", "hsp_391b6629d9b645d3073c6f5ad432c40537646604", "<v6-value-4>", { "2001:db8::/32" }, 1 },
        [S_TEAM] = { "team", "hsp_a7c664ee9eff58a85c4e418aa7706242c5ce03ad", "<team-value-3>",
                     { "x.fuzz.test:80" }, 1 },
        [S_HUGE] = { "huge", "hsp_f2104f95264636b0abb0da2ae9f2baa6cf183fdd", huge_value, { "2001:db8::/32" }, 1 },
};

static const struct {
        const char *host, *header, *value;
} rules[] = {
        { "api.fuzz.test", "Authorization", "Bearer ${e2b.secrets.gh}" },
        { "api.fuzz.test", "X-Api-Version", "2" },
        { "*.fuzz.test", "X-Team", "t-${e2b.secrets.team}" },
        { "*.deep.fuzz.test", "X-Team", "deep" },
        { "gone.fuzz.test", "X-Gone", "${e2b.secrets.gone}" },
};

enum { D_API, D_X, D_DEEP, D_GONE, D_BAD, D_OTHER, D_V4, D_V6 };
static const char *const dests[8] = {
        "api.fuzz.test", "x.fuzz.test", "a.deep.fuzz.test", "gone.fuzz.test",
        "bad.fuzz.test", "other.test",  "10.1.2.3",         "2001:db8::1",
};
static const char *const host_lines[8][4] = {
        /* ports 443, 80, 8443, 8080 */
        { "api.fuzz.test", "api.fuzz.test", "api.fuzz.test:8443", "api.fuzz.test:8080" },
        { "x.fuzz.test", "x.fuzz.test", "x.fuzz.test:8443", "x.fuzz.test:8080" },
        { "a.deep.fuzz.test", "a.deep.fuzz.test", "a.deep.fuzz.test:8443", "a.deep.fuzz.test:8080" },
        { "gone.fuzz.test", "gone.fuzz.test", "gone.fuzz.test:8443", "gone.fuzz.test:8080" },
        { "bad.fuzz.test", "bad.fuzz.test", "bad.fuzz.test:8443", "bad.fuzz.test:8080" },
        { "other.test", "other.test", "other.test:8443", "other.test:8080" },
        { "10.1.2.3", "10.1.2.3", "10.1.2.3:8443", "10.1.2.3:8080" },
        { "[2001:db8::1]", "[2001:db8::1]", "[2001:db8::1]:8443", "[2001:db8::1]:8080" },
};
static const uint16_t ports[4] = { 443, 80, 8443, 8080 };

/* What the set above means, written out independently of inject.c. */
static bool bound(int s, int d, uint16_t port) {
        switch (s) {
        case S_GH:
                return d == D_API || d == D_DEEP;
        case S_STRIPE:
                return (d == D_API && port == 443) || d == D_V4;
        case S_BAD:
                return d == D_BAD;
        case S_GONE:
                return d == D_API;
        case S_V6:
        case S_HUGE:
                return d == D_V6;
        case S_TEAM:
                return d == D_X && port == 80;
        }
        return false;
}

/* The secrets the destination's rule names (inside TLS only). */
static bool in_transform(int s, int d) {
        return (s == S_GH && d == D_API) || (s == S_TEAM && (d == D_X || d == D_BAD)) || (s == S_GONE && d == D_GONE);
}

static egress_inject *set;
static proxyreq req;

typedef struct lookups {
        const egress_host *h;
        uint16_t port;
        int d;
        unsigned calls;
        unsigned asked[N_SECRETS];
} lookups;

/* As the daemon answers: a deleted secret does not exist, and a secret with
 * hosts resolves only for them. */
static int resolve(void *userdata, const char *name, const egress_host *h, uint16_t port, char **ret,
                   size_t *ret_len) {
        lookups *l = userdata;
        l->calls++;
        if (!egress_host_equal(h, l->h) || port != l->port)
                abort();
        for (int s = 0; s < N_SECRETS; s++)
                if (streq(secrets[s].name, name)) {
                        l->asked[s]++;
                        if (!secrets[s].value)
                                return -ENOENT;
                        if (!bound(s, l->d, port))
                                return -EACCES;
                        *ret = strdup(secrets[s].value);
                        if (!*ret)
                                return -ENOMEM;
                        *ret_len = strlen(secrets[s].value);
                        return 0;
                }
        abort(); /* inject.c asked for a name the set never mentions */
}

static void build_set(void) {
        char why[256];
        memset(huge_value, 'h', HUGE_VALUE_LEN);
        memcpy(huge_value, "<huge-", 6);
        huge_value[HUGE_VALUE_LEN - 1] = '>';
        if (egress_inject_new(&set) < 0)
                abort();
        for (size_t i = 0; i < ELEMENTSOF(rules); i++)
                if (egress_inject_add_transform(set, rules[i].host, rules[i].header, rules[i].value, why, sizeof why) <
                    0)
                        abort();
        for (int s = 0; s < N_SECRETS; s++)
                if (egress_inject_add_placeholder(set, secrets[s].placeholder, secrets[s].name, secrets[s].hosts,
                                                  secrets[s].n_hosts, why, sizeof why) < 0)
                        abort();
}

static bool is_tchar(unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool holds(const char *buf, size_t len, const char *s) {
        return memmem(buf, len, s, strlen(s)) != NULL;
}

/* The shape every rewritten head has. Returns the start of the header
 * lines. */
static const char *check_shape(const egress_inject_result *res, int d, int pi) {
        const char *h = res->head, *end = h + res->head_len, *eol, *line;
        size_t ml = strlen(req.method);
        char want[300];

        if (!h || strlen(h) != res->head_len || res->head_len < 4 || memcmp(end - 4, "\r\n\r\n", 4) != 0)
                abort();
        if (strncmp(h, req.method, ml) != 0 || h[ml] != ' ')
                abort();
        for (const char *p = h; p < end; p++)
                if ((*p == '\r' && p[1] != '\n') || (*p == '\n' && (p == h || p[-1] != '\r')))
                        abort();
        eol = strstr(h, "\r\n");
        if (eol - h < 9 || memcmp(eol - 9, " HTTP/1.1", 9) != 0)
                abort();
        snprintf(want, sizeof want, "Host: %s\r\n", host_lines[d][pi]);
        if (strncmp(eol + 2, want, strlen(want)) != 0)
                abort();
        const char *headers = eol + 2;
        const char *last = NULL;
        for (line = headers; (eol = strstr(line, "\r\n")) != line; line = eol + 2) {
                const char *c = line;
                while (c < eol && is_tchar((unsigned char) *c))
                        c++;
                if (c == line || c + 1 >= eol || c[0] != ':' || c[1] != ' ')
                        abort();
                if (line != headers && strncasecmp(line, "host:", 5) == 0)
                        abort();
                last = line;
        }
        if (eol + 2 != end || !last || strncmp(last, "Connection: close\r\n", 19) != 0 ||
            last + 19 != eol)
                abort();
        return headers;
}

/* Does any header value (the text after "name: ") hold s? */
static bool in_header_values(const char *headers, const char *s) {
        for (const char *line = headers, *eol; (eol = strstr(line, "\r\n")) != line; line = eol + 2) {
                const char *v = strstr(line, ": ") + 2;
                if (memmem(v, (size_t) (eol - v), s, strlen(s)))
                        return true;
        }
        return false;
}

/* The value of the first header with this name, or NULL; *ret_n its count. */
static const char *header_value(const char *headers, const char *name, size_t *ret_len, unsigned *ret_n) {
        const char *found = NULL;
        size_t nl = strlen(name);
        *ret_n = 0;
        for (const char *line = headers, *eol; (eol = strstr(line, "\r\n")) != line; line = eol + 2)
                if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
                        if (!found) {
                                found = line + nl + 2;
                                *ret_len = (size_t) (eol - found);
                        }
                        (*ret_n)++;
                }
        return found;
}

static bool header_is(const char *headers, const char *name, const char *value) {
        size_t len = 0;
        unsigned n;
        const char *v = header_value(headers, name, &len, &n);
        return v && n == 1 && len == strlen(value) && memcmp(v, value, len) == 0;
}

static unsigned occurrences(const char *buf, size_t len, const char *s) {
        unsigned n = 0;
        size_t sl = strlen(s);
        for (const char *p = buf; (p = memmem(p, len - (size_t) (p - buf), s, sl)); p += sl)
                n++;
        return n;
}

static void check_success(const egress_inject_result *res, const lookups *l, const char *in, size_t in_len,
                          int d, int pi, bool tls) {
        uint16_t port = ports[pi];
        const char *headers = check_shape(res, d, pi);

        for (int s = 0; s < N_SECRETS; s++) {
                bool sent = holds(in, in_len, secrets[s].placeholder);
                bool may_ask = tls && ((sent && bound(s, d, port)) || in_transform(s, d));
                bool may_send = may_ask && bound(s, d, port);
                /* refused otherwise: an unbound placeholder never leaves */
                if (sent && !bound(s, d, port) && holds(res->head, res->head_len, secrets[s].placeholder))
                        abort();
                /* nor does any in a header value: replaced, or refused */
                if (in_header_values(headers, secrets[s].placeholder))
                        abort();
                if (l->asked[s] > 1 || (l->asked[s] && !may_ask))
                        abort();
                if (secrets[s].value && holds(res->head, res->head_len, secrets[s].value) && !may_send &&
                    !holds(in, in_len, secrets[s].value))
                        abort();
                /* a value that went upstream is kept for masking, under its name */
                if (secrets[s].value && l->asked[s]) {
                        bool kept = false;
                        for (size_t i = 0; i < res->n_values; i++)
                                kept |= streq(res->value_names[i], secrets[s].name) &&
                                        res->value_lens[i] == strlen(secrets[s].value) &&
                                        memcmp(res->values[i], secrets[s].value, res->value_lens[i]) == 0;
                        if (!kept)
                                abort();
                }
        }
        if (res->n_values > EGRESS_INJECT_VALUES_MAX || (!tls && (l->calls || res->n_values || res->used[0])))
                abort();
        for (size_t i = 0; i < res->n_values; i++)
                if (!res->values[i] || res->value_lens[i] > EGRESS_MASK_VALUE_MAX ||
                    !memmem(res->head, res->head_len, res->values[i], res->value_lens[i]))
                        abort();
        /* a value sent: the response comes whole and uncompressed */
        if (res->n_values) {
                size_t len = 0;
                unsigned n;
                const char *ae = header_value(headers, "accept-encoding", &len, &n);
                if (!ae || n != 1 || len != 8 || memcmp(ae, "identity", 8) != 0 ||
                    header_value(headers, "range", &len, &n) || header_value(headers, "if-range", &len, &n))
                        abort();
        }
        /* the destination's rule, and only it, was applied (HTTPS only) */
        bool any_transform = tls && d <= D_BAD;
        switch (any_transform ? d : -1) {
        case D_API:
                if (!header_is(headers, "authorization", "Bearer <gh-value-1>") ||
                    !header_is(headers, "x-api-version", "2"))
                        abort();
                break;
        case D_X:
        case D_BAD:
                if (!header_is(headers, "x-team", "t-<team-value-3>"))
                        abort();
                break;
        case D_DEEP:
                if (!header_is(headers, "x-team", "deep"))
                        abort();
                break;
        default:
                break;
        }
        if (any_transform != (strstr(res->used, "rule:") != NULL))
                abort();
        /* nothing to do: nothing looked up */
        bool any_placeholder = egress_inject_has_placeholder(set, in, in_len);
        if (!any_placeholder && !any_transform && (l->calls || res->n_values || res->used[0]))
                abort();
}

static void check_refusal(int k, const egress_inject_result *res, const char *in, size_t in_len, int d,
                          uint16_t port, bool tls) {
        bool cause = false;
        unsigned subs = d == D_API ? 1 : (d == D_X || d == D_BAD || d == D_GONE) ? 1 : 0;

        if (res->head || res->head_len || res->n_values || res->values[0])
                abort();
        switch (k) {
        case -EACCES:
                for (int s = 0; s < N_SECRETS; s++)
                        cause |= holds(in, in_len, secrets[s].placeholder) && (!bound(s, d, port) || !tls);
                if (cause && !egress_inject_has_placeholder(set, in, in_len))
                        abort();
                /* a rule naming a secret bound elsewhere */
                cause |= tls && (d == D_BAD || (d == D_X && port != 80));
                break;
        case -ENOENT:
                cause = tls && (d == D_GONE || (d == D_API && holds(in, in_len, secrets[S_GONE].placeholder)));
                break;
        case -EINVAL:
                cause = tls && d == D_BAD && holds(in, in_len, secrets[S_BAD].placeholder);
                break;
        case -E2BIG:
                for (int s = 0; s < N_SECRETS; s++)
                        subs += occurrences(in, in_len, secrets[s].placeholder);
                cause = tls && ((d == D_V6 && holds(in, in_len, secrets[S_HUGE].placeholder)) || subs > 16);
                break;
        }
        if (!cause)
                abort();
}

/* The head with 0x01..0x06 replaced by placeholders. */
static char head[2 * PROXYREQ_HEAD_MAX];

static size_t expand(const uint8_t *d, size_t n) {
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
                const char *s = d[i] >= 1 && d[i] <= N_SECRETS ? secrets[d[i] - 1].placeholder : NULL;
                size_t l = s ? EGRESS_PLACEHOLDER_LEN : 1;
                if (o + l > sizeof head)
                        break;
                if (s)
                        memcpy(head + o, s, l);
                else
                        head[o] = (char) d[i];
                o += l;
        }
        return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        egress_inject_result res;
        egress_host h;
        lookups l = { 0 };
        char why[256];
        size_t used = 0;

        if (size < 1)
                return 0;
        if (!set)
                build_set();
        int d = data[0] & 7, pi = (data[0] >> 3) & 3;
        uint16_t port = ports[pi];
        bool tls = data[0] & 0x40;
        size_t n = expand(data + 1, size - 1);

        if (data[0] & 0x20)
                proxyreq_init_origin(&req);
        else
                proxyreq_init(&req);
        if (proxyreq_feed(&req, head, n, &used) != PROXYREQ_DONE || req.connect)
                return 0;
        if (egress_host_parse(dests[d], &h) < 0)
                abort();

        why[0] = 0;
        l.h = &h;
        l.port = port;
        l.d = d;
        int k = egress_inject_apply(set, &h, port, tls, &req, resolve, &l, &res, why, sizeof why);
        if (k == 0)
                check_success(&res, &l, head, used, d, pi, tls);
        else if (k == -EACCES || k == -ENOENT || k == -EINVAL || k == -E2BIG) {
                if (!why[0])
                        abort();
                check_refusal(k, &res, head, used, d, port, tls);
        } else
                abort();
        egress_inject_result_clear(&res);

        /* no set: the framing rewrite only, nothing looked up */
        memset(&l, 0, sizeof l);
        l.h = &h;
        l.port = port;
        k = egress_inject_apply(NULL, &h, port, tls, &req, resolve, &l, &res, why, sizeof why);
        if (k != 0 || l.calls || res.n_values || res.used[0])
                abort();
        check_shape(&res, d, pi);
        egress_inject_result_clear(&res);
        return 0;
}
