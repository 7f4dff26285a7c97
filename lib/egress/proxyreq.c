/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The head of a forward-proxy request, parsed without I/O. Strict on purpose:
 * the proxy sits between a hostile program and servers that may read the
 * same bytes differently, so every shape two HTTP implementations disagree
 * on (RFC 9112 §11.2 request smuggling: bare LF, obs-fold, CL+TE, duplicate
 * lengths, odd codings) is refused rather than normalised. docs/egress.md
 * ("Proxy request parsing") lists the refusals.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "egress/proxyreq.h"
#include "util/macro.h"

static int fail(proxyreq *r, int code, const char *why) {
        r->error = code;
        r->why = why;
        return code;
}

void proxyreq_init(proxyreq *r) {
        memset(r, 0, offsetof(proxyreq, buf));
        r->buf[0] = 0;
}

void proxyreq_init_origin(proxyreq *r) {
        proxyreq_init(r);
        r->origin_form = true;
}

/* RFC 9110 §5.6.2 tchar */
static bool is_tchar(unsigned char c) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                return true;
        return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

static bool name_is(const char *a, size_t an, const char *b) {
        return an == strlen(b) && strncasecmp(a, b, an) == 0;
}

/* host [":" port] (RFC 9110 §4.2.1 without userinfo). The host is copied
 * raw; egress_host_parse_n() judges it. Ports are strict decimal: no sign,
 * no leading zero, 1..65535. Without a port, *ret_port is default_port, or
 * the authority is refused when default_port < 0. */
static int parse_authority(const char *a, size_t n, int default_port, char *host,
                           size_t *ret_host_len, uint16_t *ret_port, const char **why) {
        const char *end = a + n, *hostend, *p;
        size_t hlen;
        unsigned long v = 0;

        if (n == 0)
                return *why = "empty authority", -EINVAL;
        if (memchr(a, '@', n))
                return *why = "userinfo ('@') in the authority", -EINVAL;
        if (a[0] == '[') {
                const char *close = memchr(a, ']', n);
                if (!close)
                        return *why = "unclosed '[' in the authority", -EINVAL;
                hostend = close + 1;
        } else {
                hostend = memchr(a, ':', n);
                if (!hostend)
                        hostend = end;
        }
        hlen = (size_t) (hostend - a);
        if (hlen == 0)
                return *why = "empty host", -EINVAL;
        if (hlen > EGRESS_HOST_INPUT_MAX)
                return *why = "host over 255 bytes", -EINVAL;
        if (hostend == end) {
                if (default_port < 0)
                        return *why = "CONNECT without a port", -EINVAL;
                v = (unsigned long) default_port;
        } else {
                if (*hostend != ':')
                        return *why = "unexpected character after the host", -EINVAL;
                p = hostend + 1;
                if (p == end)
                        return *why = "empty port", -EINVAL;
                for (const char *q = p; q < end; q++)
                        if (!is_digit(*q))
                                return *why = "port is not a decimal number", -EINVAL;
                if (end - p > 1 && *p == '0')
                        return *why = "port with a leading zero", -EINVAL;
                if (end - p > 5)
                        return *why = "port over 65535", -EINVAL;
                for (; p < end; p++)
                        v = v * 10 + (unsigned long) (*p - '0');
                if (v == 0)
                        return *why = "port 0", -EINVAL;
                if (v > 65535)
                        return *why = "port over 65535", -EINVAL;
        }
        memcpy(host, a, hlen);
        host[hlen] = 0;
        *ret_host_len = hlen;
        *ret_port = (uint16_t) v;
        return 0;
}

/* Inside a tunnel whose TLS the proxy terminated, the sandbox talks to the
 * origin server itself: origin-form (RFC 9112 §3.2.1), or asterisk-form for
 * OPTIONS (§3.2.4). A target naming a host, or a CONNECT, would give the
 * request a second destination besides the tunnel's. */
static int parse_origin_target(proxyreq *r, char *t) {
        if (r->connect)
                return fail(r, -EINVAL, "CONNECT inside an intercepted tunnel");
        if (t[0] == '*') {
                if (t[1] != 0)
                        return fail(r, -EINVAL, "request target is not origin-form");
                /* methods are case-sensitive (RFC 9110 §9.1) */
                if (!streq(r->method, "OPTIONS"))
                        return fail(r, -EINVAL, "'*' target with a method other than OPTIONS");
        } else if (t[0] != '/') {
                if (strstr(t, "://"))
                        return fail(r, -EINVAL, "absolute-form inside an intercepted tunnel");
                return fail(r, -EINVAL, "request target is not origin-form");
        }
        if (strchr(t, '#'))
                return fail(r, -EINVAL, "fragment in the request target");
        r->path = t;
        r->path_len = strlen(t);
        return 0;
}

static int parse_target(proxyreq *r, char *t, size_t tlen) {
        const char *why = NULL;
        char *auth, *end;
        int k;

        if (r->origin_form)
                return parse_origin_target(r, t);
        if (r->connect) {
                /* RFC 9110 §9.3.6: authority-form only, and the port is required */
                if (strpbrk(t, "/?#"))
                        return fail(r, -EINVAL, "CONNECT target with a path");
                k = parse_authority(t, tlen, -1, r->host, &r->host_len, &r->port, &why);
                return k < 0 ? fail(r, k, why) : 0;
        }

        if (t[0] == '/')
                return fail(r, -EINVAL, "origin-form target: a proxy needs http://host/path");
        if (strncasecmp(t, "https://", 8) == 0)
                return fail(r, -EPROTONOSUPPORT, "https:// through a forward proxy: use CONNECT");
        if (strncasecmp(t, "http://", 7) != 0) {
                if (strstr(t, "://"))
                        return fail(r, -EPROTONOSUPPORT, "scheme other than http://");
                return fail(r, -EINVAL, "request target is not absolute-form");
        }
        if (strchr(t, '#'))
                return fail(r, -EINVAL, "fragment in the request target");
        auth = t + 7;
        end = auth + strcspn(auth, "/?");
        k = parse_authority(auth, (size_t) (end - auth), 80, r->host, &r->host_len, &r->port, &why);
        if (k < 0)
                return fail(r, k, why);
        if (*end != '/') {
                /* "http://h?q" and "http://h" re-send as "/?q" and "/". The
                 * host is copied out, so its last byte can hold the '/'. */
                end--;
                *end = '/';
        }
        r->path = end;
        r->path_len = strlen(end);
        return 0;
}

static int parse_request_line(proxyreq *r, char *line, char *eol) {
        char *sp, *t, *v;
        size_t vlen;

        for (sp = line; sp < eol && is_tchar((unsigned char) *sp); sp++)
                ;
        if (sp == line || sp >= eol || *sp != ' ')
                return fail(r, -EINVAL, "malformed method");
        if (sp - line > PROXYREQ_METHOD_MAX)
                return fail(r, -EINVAL, "method over 32 bytes");
        *sp = 0;
        r->method = line;
        r->connect = streq(line, "CONNECT");

        t = sp + 1;
        for (sp = t; sp<eol && * sp> 0x20 && *sp < 0x7f; sp++)
                ;
        if (sp == t || sp >= eol || *sp != ' ')
                return fail(r, -EINVAL, "malformed request target");
        *sp = 0;

        v = sp + 1;
        vlen = (size_t) (eol - v);
        if (vlen == 8 && memcmp(v, "HTTP/1.", 7) == 0 && (v[7] == '0' || v[7] == '1'))
                r->version_minor = v[7] - '0';
        else if (vlen == 8 && memcmp(v, "HTTP/", 5) == 0 && is_digit(v[5]) && v[6] == '.' &&
                 is_digit(v[7]))
                return fail(r, -EPROTONOSUPPORT, "HTTP version other than 1.0 or 1.1");
        else
                return fail(r, -EINVAL, "malformed HTTP version");

        return parse_target(r, t, (size_t) (sp - t));
}

/* Content-Length: 1*DIGIT, at most 18 digits so it fits; no list form. */
static int parse_length(const char *v, size_t n, uint64_t *ret) {
        uint64_t x = 0;
        if (n == 0 || n > 18)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                if (!is_digit(v[i]))
                        return -EINVAL;
                x = x * 10 + (uint64_t) (v[i] - '0');
        }
        *ret = x;
        return 0;
}

/* A Connection header may not list the headers that frame the message or
 * name its destination: a proxy that dropped them would change what the
 * next hop reads. */
static int check_connection(proxyreq *r, const proxyreq_header *h) {
        const char *p = h->value, *end = h->value + h->value_len;
        while (p < end) {
                const char *s;
                while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
                        p++;
                for (s = p; p < end && is_tchar((unsigned char) *p); p++)
                        ;
                if (p < end && *p != ' ' && *p != '\t' && *p != ',')
                        return fail(r, -EINVAL, "malformed Connection header");
                if (name_is(s, (size_t) (p - s), "host") ||
                    name_is(s, (size_t) (p - s), "content-length") ||
                    name_is(s, (size_t) (p - s), "transfer-encoding"))
                        return fail(r, -EINVAL, "Connection header names a framing header");
        }
        return 0;
}

/* RFC 3986 unreserved, '%' and the IP-literal and port punctuation. The
 * sub-delims a reg-name may also hold (",;=!$&'()*+") are refused: no
 * resolvable host has them, and "a.test,b.test" reads as a list. */
static bool is_host_char(unsigned char c) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                return true;
        return c != 0 && strchr("-._~%:[]", c) != NULL;
}

/* In origin-form the Host header is the request's only name for its
 * destination, and the caller compares it with the tunnel's host. So it is
 * required in HTTP/1.0 as well (RFC 9112 §3.2 requires it in 1.1), and it
 * must be exactly one well-formed authority. */
static int check_origin_host(proxyreq *r, const proxyreq_header *host) {
        const char *why = NULL;
        int k;

        if (!host)
                return fail(r, -EINVAL, "origin-form request without Host");
        if (host->value_len == 0)
                return fail(r, -EINVAL, "empty Host header");
        if (memchr(host->value, '@', host->value_len))
                return fail(r, -EINVAL, "userinfo ('@') in the Host header");
        for (size_t i = 0; i < host->value_len; i++)
                if (!is_host_char((unsigned char) host->value[i]))
                        return fail(r, -EINVAL, "bad character in the Host header");
        /* port 0: the Host header names none; the tunnel's port applies */
        k = parse_authority(host->value, host->value_len, 0, r->host, &r->host_len, &r->port, &why);
        return k < 0 ? fail(r, k, why) : 0;
}

static int check_headers(proxyreq *r) {
        const proxyreq_header *host = NULL, *pauth = NULL;
        bool has_te = false;

        for (size_t i = 0; i < r->n_headers; i++) {
                const proxyreq_header *h = &r->headers[i];
                if (name_is(h->name, h->name_len, "content-length")) {
                        uint64_t v;
                        if (parse_length(h->value, h->value_len, &v) < 0)
                                return fail(r, -EINVAL, "Content-Length is not a number");
                        if (r->has_content_length && v != r->content_length)
                                return fail(r, -EINVAL, "Content-Length headers disagree");
                        r->has_content_length = true;
                        r->content_length = v;
                } else if (name_is(h->name, h->name_len, "transfer-encoding")) {
                        if (has_te)
                                return fail(r, -EINVAL, "more than one Transfer-Encoding header");
                        has_te = true;
                        if (!name_is(h->value, h->value_len, "chunked"))
                                return fail(r, -EINVAL, "Transfer-Encoding other than chunked");
                        r->chunked = true;
                } else if (name_is(h->name, h->name_len, "host")) {
                        if (host)
                                return fail(r, -EINVAL, "more than one Host header");
                        host = h;
                } else if (name_is(h->name, h->name_len, "proxy-authorization")) {
                        if (pauth)
                                return fail(r, -EINVAL, "more than one Proxy-Authorization header");
                        pauth = h;
                } else if (name_is(h->name, h->name_len, "connection")) {
                        int k = check_connection(r, h);
                        if (k < 0)
                                return k;
                }
        }

        if (r->has_content_length && r->chunked)
                return fail(r, -EINVAL, "both Content-Length and Transfer-Encoding");
        if (r->chunked && r->version_minor == 0)
                return fail(r, -EINVAL, "Transfer-Encoding in an HTTP/1.0 request");
        if (r->connect) {
                /* RFC 9110 §9.3.6: CONNECT has no content */
                if (r->chunked || (r->has_content_length && r->content_length > 0))
                        return fail(r, -EINVAL, "CONNECT with a body");
                return 0;
        }
        if (r->origin_form)
                return check_origin_host(r, host);
        if (!host) {
                /* RFC 9112 §3.2: a 1.1 request without Host is a 400 */
                if (r->version_minor == 1)
                        return fail(r, -EINVAL, "HTTP/1.1 request without Host");
                return 0;
        }
        /* RFC 9112 §3.2.2 lets a proxy replace a disagreeing Host; two
         * names for one request is a routing ambiguity, so refuse instead. */
        char hh[EGRESS_HOST_INPUT_MAX + 1];
        size_t hlen;
        uint16_t hport;
        const char *why = NULL;
        if (parse_authority(host->value, host->value_len, 80, hh, &hlen, &hport, &why) < 0)
                return fail(r, -EINVAL, "malformed Host header");
        if (hlen != r->host_len || strncasecmp(hh, r->host, hlen) != 0 || hport != r->port)
                return fail(r, -EINVAL, "Host header disagrees with the request target");
        return 0;
}

static int parse_head(proxyreq *r) {
        char *line = r->buf, *eol;
        int k;

        /* every CR is followed by LF: proxyreq_feed() refuses anything else */
        eol = strchr(line, '\r');
        k = parse_request_line(r, line, eol);
        if (k < 0)
                return k;

        for (line = eol + 2; line[0] != '\r'; line = eol + 2) {
                char *p, *v, *ve;
                eol = strchr(line, '\r');
                if (line[0] == ' ' || line[0] == '\t')
                        return fail(r, -EINVAL, "obs-fold continuation line");
                if (r->n_headers == PROXYREQ_HEADERS_MAX)
                        return fail(r, -E2BIG, "more than 100 headers");
                for (p = line; p < eol && is_tchar((unsigned char) *p); p++)
                        ;
                if (p >= eol || *p != ':') {
                        if (p < eol && (*p == ' ' || *p == '\t'))
                                return fail(r, -EINVAL, "whitespace before the colon");
                        return fail(r, -EINVAL, "malformed header name");
                }
                if (p == line)
                        return fail(r, -EINVAL, "empty header name");
                *p = 0;
                for (v = p + 1; v < eol && (*v == ' ' || *v == '\t'); v++)
                        ;
                for (ve = eol; ve > v && (ve[-1] == ' ' || ve[-1] == '\t'); ve--)
                        ;
                *ve = 0;
                r->headers[r->n_headers++] = (proxyreq_header) {
                        .name = line,
                        .name_len = (size_t) (p - line),
                        .value = v,
                        .value_len = (size_t) (ve - v),
                };
        }
        return check_headers(r);
}

int proxyreq_feed(proxyreq *r, const void *data, size_t n, size_t *ret_consumed) {
        const unsigned char *p = data;
        size_t i;
        int k = PROXYREQ_NEED_MORE;

        if (r->error || r->done) {
                if (ret_consumed)
                        *ret_consumed = 0;
                return r->error ? r->error : PROXYREQ_DONE;
        }
        for (i = 0; i < n; i++) {
                unsigned char c = p[i];
                unsigned char prev = r->len > 0 ? (unsigned char) r->buf[r->len - 1] : 0;

                /* Checked byte by byte, so any split gives the same answer. */
                if (r->len >= PROXYREQ_HEAD_MAX) {
                        k = fail(r, -E2BIG, "request head over 16 KiB");
                        break;
                }
                if (c == 0) {
                        k = fail(r, -EINVAL, "NUL byte in the head");
                        break;
                }
                if (prev == '\r' && c != '\n') {
                        k = fail(r, -EINVAL, "CR not followed by LF");
                        break;
                }
                if (c == '\n' && prev != '\r') {
                        k = fail(r, -EINVAL, "bare LF line ending");
                        break;
                }
                if ((c < 0x20 && c != '\r' && c != '\n' && c != '\t') || c == 0x7f) {
                        k = fail(r, -EINVAL, "control character in the head");
                        break;
                }
                r->buf[r->len++] = (char) c;
                if (c != '\n')
                        continue;
                if (r->len == 2) {
                        k = fail(r, -EINVAL, "empty request line");
                        i++;
                        break;
                }
                if (r->len >= 4 && r->buf[r->len - 3] == '\n') {
                        r->buf[r->len] = 0;
                        r->head_len = r->len;
                        i++;
                        k = parse_head(r);
                        if (k >= 0) {
                                r->done = true;
                                k = PROXYREQ_DONE;
                        }
                        break;
                }
        }
        if (ret_consumed)
                *ret_consumed = i;
        return k;
}

const proxyreq_header *proxyreq_find_header(const proxyreq *r, const char *name) {
        if (!r->done)
                return NULL;
        for (size_t i = 0; i < r->n_headers; i++)
                if (name_is(r->headers[i].name, r->headers[i].name_len, name))
                        return &r->headers[i];
        return NULL;
}

const proxyreq_header *proxyreq_proxy_authorization(const proxyreq *r) {
        return proxyreq_find_header(r, "proxy-authorization");
}

/* Does a Connection header value list this name? */
static bool connection_lists(const proxyreq_header *c, const char *name, size_t len) {
        const char *p = c->value, *end = c->value + c->value_len;
        while (p < end) {
                const char *s;
                while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
                        p++;
                for (s = p; p < end && *p != ' ' && *p != '\t' && *p != ','; p++)
                        ;
                if (p > s && (size_t) (p - s) == len && strncasecmp(s, name, len) == 0)
                        return true;
        }
        return false;
}

bool proxyreq_header_is_hop_by_hop(const proxyreq *r, size_t i) {
        static const char *const hop[] = {
                "connection",
                "proxy-connection",
                "keep-alive",
                "proxy-authorization",
                "proxy-authenticate",
                "te",
                "trailer",
                "upgrade",
        };
        const proxyreq_header *h;

        if (!r->done || i >= r->n_headers)
                return false;
        h = &r->headers[i];
        for (size_t j = 0; j < ELEMENTSOF(hop); j++)
                if (name_is(h->name, h->name_len, hop[j]))
                        return true;
        for (size_t j = 0; j < r->n_headers; j++)
                if (name_is(r->headers[j].name, r->headers[j].name_len, "connection") &&
                    connection_lists(&r->headers[j], h->name, h->name_len))
                        return true;
        return false;
}
