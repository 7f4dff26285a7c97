/* SPDX-License-Identifier: Apache-2.0 */
/* Request-head rewriting for credential injection: inject.h has the
 * contract. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "egress/inject.h"
#include "util/macro.h"

#define HEAD_OUT_MAX (256 * 1024)
#define SECRET_REF_OPEN "${e2b.secrets."

typedef struct header_set {
        char *name, *value;
} header_set;

typedef struct transform {
        egress_rule host;
        header_set headers[EGRESS_HEADERS_MAX];
        size_t n_headers;
} transform;

typedef struct placeholder {
        char text[EGRESS_PLACEHOLDER_LEN + 1];
        char name[EGRESS_SECRET_NAME_MAX + 1];
        egress_rule *hosts;
        size_t n_hosts;
} placeholder;

struct egress_inject {
        transform *t;
        size_t n_t;
        placeholder *p;
        size_t n_p;
};

int egress_inject_new(egress_inject **ret) {
        egress_inject *x = calloc(1, sizeof *x);
        if (!x)
                return -ENOMEM;
        *ret = x;
        return 0;
}

egress_inject *egress_inject_free(egress_inject *x) {
        if (!x)
                return NULL;
        for (size_t i = 0; i < x->n_t; i++)
                for (size_t j = 0; j < x->t[i].n_headers; j++) {
                        free(x->t[i].headers[j].name);
                        free(x->t[i].headers[j].value);
                }
        free(x->t);
        for (size_t i = 0; i < x->n_p; i++)
                free(x->p[i].hosts);
        free(x->p);
        free(x);
        return NULL;
}

bool egress_inject_empty(const egress_inject *x) {
        return !x || (x->n_t == 0 && x->n_p == 0);
}

static bool is_tchar(unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool value_ok(const char *v) {
        for (const unsigned char *c = (const unsigned char *) v; *c; c++)
                if ((*c < 0x20 && *c != '\t') || *c == 0x7f)
                        return false;
        return true;
}

bool egress_secret_name_valid(const char *n, size_t len) {
        if (len == 0 || len > EGRESS_SECRET_NAME_MAX)
                return false;
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char) n[i];
                if (c < 0x20 || c == 0x7f || c == '{' || c == '}')
                        return false;
        }
        return true;
}

/* Every ${e2b.secrets.NAME} in v is well formed. */
static bool refs_ok(const char *v) {
        for (const char *p = strstr(v, SECRET_REF_OPEN); p; p = strstr(p, SECRET_REF_OPEN)) {
                p += strlen(SECRET_REF_OPEN);
                const char *e = strchr(p, '}');
                if (!e || !egress_secret_name_valid(p, (size_t) (e - p)))
                        return false;
                p = e + 1;
        }
        return true;
}

int egress_inject_add_transform(egress_inject *x, const char *host, const char *header, const char *value,
                                char *why, size_t whylen) {
        egress_rule r;
        if (egress_rule_parse(host, &r, why, whylen) < 0)
                return -EINVAL;
        if ((r.kind != EGRESS_RULE_NAME && r.kind != EGRESS_RULE_SUFFIX) || r.n_ports) {
                snprintf(why, whylen, "rules key \"%.64s\": a DNS name or *.name without a port", host);
                return -EINVAL;
        }
        size_t hl = strlen(header);
        bool tok = hl > 0 && hl <= 256;
        for (size_t i = 0; tok && i < hl; i++)
                tok = is_tchar((unsigned char) header[i]);
        if (!tok) {
                snprintf(why, whylen, "rules[\"%.64s\"]: header name \"%.64s\" is not an HTTP token", host, header);
                return -EINVAL;
        }
        static const char *const forbidden[] = { "host", "content-length", "transfer-encoding", "connection",
                                                 "proxy-connection", "keep-alive", "te", "trailer", "upgrade" };
        for (size_t i = 0; i < ELEMENTSOF(forbidden); i++)
                if (strcasecmp(header, forbidden[i]) == 0) {
                        snprintf(why, whylen, "rules[\"%.64s\"]: the %s header cannot be set", host, header);
                        return -EINVAL;
                }
        if (strlen(value) > EGRESS_HEADER_VALUE_MAX || !value_ok(value) || !refs_ok(value)) {
                snprintf(why, whylen,
                         "rules[\"%.64s\"].%.64s: the value must be printable, at most %d bytes, and name "
                         "secrets as ${e2b.secrets.NAME}",
                         host, header, EGRESS_HEADER_VALUE_MAX);
                return -EINVAL;
        }
        transform *t = NULL;
        for (size_t i = 0; i < x->n_t; i++)
                if (egress_rule_equal(&x->t[i].host, &r))
                        t = &x->t[i];
        if (!t) {
                if (x->n_t + x->n_p >= EGRESS_INJECT_MAX) {
                        snprintf(why, whylen, "at most %d rules and secrets per sandbox", EGRESS_INJECT_MAX);
                        return -E2BIG;
                }
                transform *nt = reallocarray(x->t, x->n_t + 1, sizeof *nt);
                if (!nt)
                        return -ENOMEM;
                x->t = nt;
                t = &x->t[x->n_t++];
                memset(t, 0, sizeof *t);
                t->host = r;
        }
        for (size_t i = 0; i < t->n_headers; i++)
                if (strcasecmp(t->headers[i].name, header) == 0) {
                        char *v = strdup(value);
                        if (!v)
                                return -ENOMEM;
                        free(t->headers[i].value);
                        t->headers[i].value = v;
                        return 0;
                }
        if (t->n_headers == EGRESS_HEADERS_MAX) {
                snprintf(why, whylen, "rules[\"%.64s\"]: at most %d headers", host, EGRESS_HEADERS_MAX);
                return -E2BIG;
        }
        char *n = strdup(header), *v = strdup(value);
        if (!n || !v) {
                free(n);
                free(v);
                return -ENOMEM;
        }
        t->headers[t->n_headers++] = (header_set){ n, v };
        return 0;
}

int egress_inject_add_placeholder(egress_inject *x, const char *text, const char *name,
                                  const char *const *hosts, size_t n_hosts, char *why, size_t whylen) {
        if (strlen(text) != EGRESS_PLACEHOLDER_LEN || !egress_secret_name_valid(name, strlen(name))) {
                snprintf(why, whylen, "bad placeholder or secret name");
                return -EINVAL;
        }
        if (n_hosts == 0) {
                snprintf(why, whylen, "secret \"%.64s\" is bound to no host: it cannot be used in the environment",
                         name);
                return -EINVAL;
        }
        if (x->n_t + x->n_p >= EGRESS_INJECT_MAX) {
                snprintf(why, whylen, "at most %d rules and secrets per sandbox", EGRESS_INJECT_MAX);
                return -E2BIG;
        }
        egress_rule *rules = calloc(n_hosts, sizeof *rules);
        if (!rules)
                return -ENOMEM;
        for (size_t i = 0; i < n_hosts; i++) {
                if (egress_rule_parse(hosts[i], &rules[i], why, whylen) < 0) {
                        free(rules);
                        return -EINVAL;
                }
                if (rules[i].kind == EGRESS_RULE_ALL) {
                        snprintf(why, whylen, "secret \"%.64s\": a secret cannot be bound to every host", name);
                        free(rules);
                        return -EINVAL;
                }
        }
        placeholder *np = reallocarray(x->p, x->n_p + 1, sizeof *np);
        if (!np) {
                free(rules);
                return -ENOMEM;
        }
        x->p = np;
        placeholder *p = &x->p[x->n_p++];
        memset(p, 0, sizeof *p);
        snprintf(p->text, sizeof p->text, "%s", text);
        snprintf(p->name, sizeof p->name, "%s", name);
        p->hosts = rules;
        p->n_hosts = n_hosts;
        return 0;
}

static bool placeholder_bound(const placeholder *p, const egress_host *h, uint16_t port) {
        for (size_t i = 0; i < p->n_hosts; i++)
                if (egress_rule_matches_host(&p->hosts[i], h, port))
                        return true;
        return false;
}

/* The transform set for h: the exact name, else the longest suffix. */
static const transform *transform_for(const egress_inject *x, const egress_host *h) {
        if (!x || h->kind != EGRESS_HOST_NAME)
                return NULL;
        const transform *best = NULL;
        for (size_t i = 0; i < x->n_t; i++) {
                const transform *t = &x->t[i];
                if (!egress_rule_matches_host(&t->host, h, 0))
                        continue;
                if (t->host.kind == EGRESS_RULE_NAME)
                        return t;
                if (!best || strlen(t->host.name) > strlen(best->host.name))
                        best = t;
        }
        return best;
}

bool egress_inject_wants(const egress_inject *x, const egress_host *h, uint16_t port) {
        if (egress_inject_empty(x))
                return false;
        if (transform_for(x, h))
                return true;
        for (size_t i = 0; i < x->n_p; i++)
                if (placeholder_bound(&x->p[i], h, port))
                        return true;
        return false;
}

bool egress_inject_has_placeholder(const egress_inject *x, const void *buf, size_t len) {
        for (size_t i = 0; x && i < x->n_p; i++)
                if (memmem(buf, len, x->p[i].text, EGRESS_PLACEHOLDER_LEN))
                        return true;
        return false;
}

/* ------------------------------------------------------------- output */

typedef struct out {
        char *buf;
        size_t len, cap;
        bool overflow;
} out;

static void out_add(out *o, const char *s, size_t n) {
        if (o->overflow)
                return;
        if (o->len + n + 1 > HEAD_OUT_MAX) {
                o->overflow = true;
                return;
        }
        if (o->len + n + 1 > o->cap) {
                size_t cap = MAX(o->cap * 2, o->len + n + 1);
                cap = MAX(cap, (size_t) 1024);
                char *b = malloc(cap);
                if (!b) {
                        o->overflow = true;
                        return;
                }
                if (o->buf) {
                        memcpy(b, o->buf, o->len);
                        explicit_bzero(o->buf, o->cap);
                        free(o->buf);
                }
                o->buf = b;
                o->cap = cap;
        }
        memcpy(o->buf + o->len, s, n);
        o->len += n;
        o->buf[o->len] = 0;
}

static void out_str(out *o, const char *s) {
        out_add(o, s, strlen(s));
}

static void out_free(out *o) {
        if (o->buf) {
                explicit_bzero(o->buf, o->cap);
                free(o->buf);
        }
        o->buf = NULL;
}

void egress_inject_result_clear(egress_inject_result *r) {
        if (r->head) {
                explicit_bzero(r->head, r->head_len);
                free(r->head);
        }
        for (size_t i = 0; i < r->n_values; i++) {
                if (!r->values[i])
                        continue; /* taken by the caller */
                explicit_bzero(r->values[i], r->value_lens[i]);
                free(r->values[i]);
        }
        memset(r, 0, sizeof *r);
}

/* Append an item only whole: a record must never name half a secret. */
static void used_add(egress_inject_result *ret, const char *what) {
        size_t l = strlen(ret->used), w = strlen(what);
        if (l + (l ? 1 : 0) + w + 1 > sizeof ret->used)
                return;
        if (l)
                ret->used[l++] = ',';
        memcpy(ret->used + l, what, w + 1);
}

/* The placeholder at v (EGRESS_PLACEHOLDER_LEN bytes available), or NULL. */
static const placeholder *placeholder_at(const egress_inject *x, const char *v) {
        for (size_t k = 0; x && k < x->n_p; k++)
                if (memcmp(v, x->p[k].text, EGRESS_PLACEHOLDER_LEN) == 0)
                        return &x->p[k];
        return NULL;
}

/* The next placeholder of x in v[i..vl), scanning once for its "hsp_"
 * prefix (cost: the length, not the length times the placeholders). */
static const placeholder *next_placeholder(const egress_inject *x, const char *v, size_t vl, size_t i,
                                           size_t *ret_at) {
        while (x && x->n_p && i + EGRESS_PLACEHOLDER_LEN <= vl) {
                const char *f = memmem(v + i, vl - i, "hsp_", 4);
                if (!f || (size_t) (f - v) + EGRESS_PLACEHOLDER_LEN > vl)
                        return NULL;
                const placeholder *p = placeholder_at(x, f);
                if (p) {
                        *ret_at = (size_t) (f - v);
                        return p;
                }
                i = (size_t) (f - v) + 1;
        }
        return NULL;
}

typedef struct apply_ctx {
        const egress_inject *x;
        const egress_host *h;
        uint16_t port;
        bool tls;
        egress_resolve_fn resolve;
        void *ud;
        out *o;
        egress_inject_result *ret;
        unsigned substitutions;
        char *why;
        size_t whylen;
} apply_ctx;

#define SUBSTITUTIONS_MAX 16

/* A secret's value into the output: resolved once per request (a name seen
 * before reuses its copy), and only values the proxy can mask. */
static int emit_secret(apply_ctx *a, const char *name) {
        egress_inject_result *ret = a->ret;
        if (++a->substitutions > SUBSTITUTIONS_MAX) {
                snprintf(a->why, a->whylen, "more than %d secrets in one request", SUBSTITUTIONS_MAX);
                return -E2BIG;
        }
        for (size_t i = 0; i < ret->n_values; i++)
                if (strcmp(ret->value_names[i], name) == 0) {
                        out_add(a->o, ret->values[i], ret->value_lens[i]);
                        return 0;
                }
        if (ret->n_values == EGRESS_INJECT_VALUES_MAX) {
                snprintf(a->why, a->whylen, "more than %d distinct secrets in one request", EGRESS_INJECT_VALUES_MAX);
                return -E2BIG;
        }
        char *val = NULL;
        size_t len = 0;
        int r = a->resolve ? a->resolve(a->ud, name, a->h, a->port, &val, &len) : -ENOENT;
        if (r == -EACCES) {
                snprintf(a->why, a->whylen, "secret \"%s\" is not bound to %s", name, a->h->text);
                return -EACCES;
        }
        if (r < 0) {
                snprintf(a->why, a->whylen, "secret \"%s\" does not exist (any more)", name);
                return -ENOENT;
        }
        int k = 0;
        if (memchr(val, '\r', len) || memchr(val, '\n', len) || memchr(val, 0, len)) {
                snprintf(a->why, a->whylen, "secret \"%s\" holds CR, LF or NUL", name);
                k = -EINVAL;
        } else if (len == 0 || len > EGRESS_MASK_VALUE_MAX) {
                snprintf(a->why, a->whylen, "secret \"%s\" is empty or longer than %d bytes, which responses "
                                            "could not be masked against",
                         name, EGRESS_MASK_VALUE_MAX);
                k = -E2BIG;
        } else {
                out_add(a->o, val, len);
                ret->values[ret->n_values] = val; /* kept, for masking the response */
                ret->value_lens[ret->n_values] = len;
                snprintf(ret->value_names[ret->n_values], sizeof ret->value_names[0], "%s", name);
                ret->n_values++;
                used_add(ret, name);
                return 0;
        }
        explicit_bzero(val, len);
        free(val);
        return k;
}

/* Emit value with every placeholder replaced (bound ones, inside TLS). */
static int emit_value(apply_ctx *a, const char *v, size_t vl) {
        size_t i = 0;
        while (i < vl) {
                size_t at = vl;
                const placeholder *hit = next_placeholder(a->x, v, vl, i, &at);
                out_add(a->o, v + i, (hit ? at : vl) - i);
                if (!hit)
                        break;
                if (!placeholder_bound(hit, a->h, a->port)) {
                        snprintf(a->why, a->whylen,
                                 "the placeholder of secret \"%s\" was sent to %s, which it is not bound to",
                                 hit->name, a->h->text);
                        return -EACCES;
                }
                if (!a->tls) {
                        snprintf(a->why, a->whylen,
                                 "the placeholder of secret \"%s\" in plain HTTP: secrets are sent only inside TLS "
                                 "(use https://)",
                                 hit->name);
                        return -EACCES;
                }
                int r = emit_secret(a, hit->name);
                if (r < 0)
                        return r;
                i = at + EGRESS_PLACEHOLDER_LEN;
        }
        return 0;
}

/* Emit a transform's value template with ${e2b.secrets.NAME} resolved. */
static int emit_template(apply_ctx *a, const char *tpl) {
        const char *p = tpl;
        for (;;) {
                const char *ref = strstr(p, SECRET_REF_OPEN);
                if (!ref) {
                        out_str(a->o, p);
                        return 0;
                }
                out_add(a->o, p, (size_t) (ref - p));
                const char *nm = ref + strlen(SECRET_REF_OPEN), *e = strchr(nm, '}');
                char name[EGRESS_SECRET_NAME_MAX + 1];
                snprintf(name, sizeof name, "%.*s", (int) (e - nm), nm);
                int r = emit_secret(a, name);
                if (r < 0)
                        return r;
                p = e + 1;
        }
}

int egress_inject_apply(const egress_inject *x, const egress_host *h, uint16_t port, bool tls, const proxyreq *r,
                        egress_resolve_fn resolve, void *userdata, egress_inject_result *ret, char *why,
                        size_t whylen) {
        memset(ret, 0, sizeof *ret);
        /* the request target and header names: placeholders may not leave
         * in them for a host they are not bound to (they are never
         * substituted there) */
        for (size_t i = 0; i <= r->n_headers; i++) {
                const char *v = i == r->n_headers ? r->path : r->headers[i].name;
                size_t vl = i == r->n_headers ? r->path_len : r->headers[i].name_len;
                size_t at = 0, from = 0;
                const placeholder *p;
                while (v && (p = next_placeholder(x, v, vl, from, &at))) {
                        if (!placeholder_bound(p, h, port)) {
                                snprintf(why, whylen,
                                         "the placeholder of secret \"%s\" was sent to %s, which it is not bound to",
                                         p->name, h->text);
                                return -EACCES;
                        }
                        from = at + EGRESS_PLACEHOLDER_LEN;
                }
        }
        /* rules apply to HTTPS only (E2B's "outbound HTTPS requests") */
        const transform *t = tls ? transform_for(x, h) : NULL;
        bool secret_rule = false;
        for (size_t j = 0; t && j < t->n_headers; j++)
                secret_rule |= strstr(t->headers[j].value, SECRET_REF_OPEN) != NULL;
        bool secret_header = false;
        for (size_t i = 0; i < r->n_headers && !secret_header; i++) {
                size_t at;
                secret_header = next_placeholder(x, r->headers[i].value, r->headers[i].value_len, 0, &at) != NULL;
        }
        /* A request that carries a value gets an uncompressed, whole
         * response, so that the value can be masked where it comes back. */
        bool plain_response = tls && (secret_rule || secret_header);

        out o = { 0 };
        apply_ctx a = { .x = x, .h = h, .port = port, .tls = tls, .resolve = resolve, .ud = userdata, .o = &o,
                        .ret = ret, .why = why, .whylen = whylen };
        char hostport[EGRESS_NAME_MAX + 16];
        if (h->kind == EGRESS_HOST_IPV6)
                snprintf(hostport, sizeof hostport, "[%s]", h->text);
        else
                snprintf(hostport, sizeof hostport, "%s", h->text);
        if (port != 80 && port != 443) {
                size_t l = strlen(hostport);
                snprintf(hostport + l, sizeof hostport - l, ":%u", port);
        }
        out_str(&o, r->method);
        out_str(&o, " ");
        out_add(&o, r->path ? r->path : "/", r->path ? r->path_len : 1);
        out_str(&o, " HTTP/1.1\r\nHost: ");
        out_str(&o, hostport);
        out_str(&o, "\r\n");
        int k = 0;
        for (size_t i = 0; i < r->n_headers && k >= 0 && !o.overflow; i++) {
                const proxyreq_header *hd = &r->headers[i];
                if (proxyreq_header_is_hop_by_hop(r, i) || strcasecmp(hd->name, "host") == 0)
                        continue;
                if (plain_response && (strcasecmp(hd->name, "accept-encoding") == 0 ||
                                       strcasecmp(hd->name, "range") == 0 || strcasecmp(hd->name, "if-range") == 0))
                        continue;
                bool replaced = false;
                for (size_t j = 0; t && j < t->n_headers; j++)
                        replaced |= strcasecmp(t->headers[j].name, hd->name) == 0;
                if (replaced)
                        continue;
                out_add(&o, hd->name, hd->name_len);
                out_str(&o, ": ");
                k = emit_value(&a, hd->value, hd->value_len);
                out_str(&o, "\r\n");
        }
        for (size_t j = 0; t && j < t->n_headers && k >= 0 && !o.overflow; j++) {
                out_str(&o, t->headers[j].name);
                out_str(&o, ": ");
                k = emit_template(&a, t->headers[j].value);
                out_str(&o, "\r\n");
        }
        if (k >= 0 && t) {
                char what[EGRESS_RULE_TEXT_MAX + 8];
                (void) egress_rule_format(&t->host, what, sizeof what);
                char tagged[EGRESS_RULE_TEXT_MAX + 16];
                snprintf(tagged, sizeof tagged, "rule:%s", what);
                used_add(ret, tagged);
        }
        if (plain_response)
                out_str(&o, "Accept-Encoding: identity\r\n");
        out_str(&o, "Connection: close\r\n\r\n");
        if (k < 0 || o.overflow) {
                out_free(&o);
                egress_inject_result_clear(ret);
                if (k < 0)
                        return k;
                snprintf(why, whylen, "the rewritten request head is too large");
                return -E2BIG;
        }
        ret->head = o.buf;
        ret->head_len = o.len;
        return 0;
}
