/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "ihttp.h"

static bool is_tchar(unsigned char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static const char *find_crlf(const char *p, const char *end) {
        for (; p + 1 < end; p++)
                if (p[0] == '\r' && p[1] == '\n')
                        return p;
        return NULL;
}

/* "   value  " -> trimmed [*s, *e) */
static void trim(const char **s, const char **e) {
        while (*s < *e && (**s == ' ' || **s == '\t'))
                (*s)++;
        while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
                (*e)--;
}

static bool token_eq(const char *s, const char *e, const char *want) {
        size_t n = strlen(want);
        return (size_t) (e - s) == n && strncasecmp(s, want, n) == 0;
}

/* Does the comma-separated list [s, e) hold token want? */
static bool list_has(const char *s, const char *e, const char *want) {
        while (s < e) {
                const char *c = memchr(s, ',', (size_t) (e - s));
                const char *te = c ? c : e, *ts = s;
                trim(&ts, &te);
                if (token_eq(ts, te, want))
                        return true;
                s = c ? c + 1 : e;
        }
        return false;
}

int ih_parse_head(const char *buf, size_t len, size_t max_body, ih_request *ret) {
        /* the end of the head: the first empty line */
        const char *end = NULL;
        size_t scan = len < IH_MAX_HEAD ? len : IH_MAX_HEAD;
        /* tolerate (and skip) empty lines before the request line, as RFC 9112 2.2 allows */
        size_t lead = 0;
        while (lead + 1 < scan && buf[lead] == '\r' && buf[lead + 1] == '\n')
                lead += 2;
        for (size_t i = lead; i + 3 < scan; i++)
                if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
                        end = buf + i + 2; /* the last header line's CRLF included */
                        break;
                }
        if (!end)
                return len >= IH_MAX_HEAD ? -E2BIG : 0;

        ih_request r = { 0 };
        r.head_len = (size_t) (end - buf) + 2;
        const char *p = buf + lead;
        const char *le = find_crlf(p, end);
        if (!le)
                return -EBADMSG;
        /* request line: METHOD SP target SP HTTP/1.x */
        const char *sp1 = memchr(p, ' ', (size_t) (le - p));
        if (!sp1 || sp1 == p || (size_t) (sp1 - p) >= sizeof r.method)
                return -EBADMSG;
        for (const char *q = p; q < sp1; q++)
                if (!is_tchar((unsigned char) *q))
                        return -EBADMSG;
        memcpy(r.method, p, (size_t) (sp1 - p));
        const char *tgt = sp1 + 1;
        const char *sp2 = memchr(tgt, ' ', (size_t) (le - tgt));
        if (!sp2 || sp2 == tgt)
                return -EBADMSG;
        const char *ver = sp2 + 1;
        if (le - ver != 8 || memcmp(ver, "HTTP/1.", 7) != 0 || (ver[7] != '0' && ver[7] != '1'))
                return -EBADMSG;
        bool http11 = ver[7] == '1';
        r.keep_alive = http11;
        /* origin form only ("/path?query"); an absolute form's path is taken too */
        const char *ps = tgt, *pe = sp2;
        if (*ps != '/') {
                const char *sch = NULL;
                if ((size_t) (pe - ps) > 7 && strncasecmp(ps, "http://", 7) == 0)
                        sch = ps + 7;
                else if ((size_t) (pe - ps) > 8 && strncasecmp(ps, "https://", 8) == 0)
                        sch = ps + 8;
                if (!sch)
                        return -EBADMSG;
                ps = memchr(sch, '/', (size_t) (pe - sch));
                if (!ps)
                        return -EBADMSG;
        }
        const char *q = memchr(ps, '?', (size_t) (pe - ps));
        if (q)
                pe = q;
        if ((size_t) (pe - ps) >= sizeof r.path)
                return -EBADMSG;
        for (const char *c = ps; c < pe; c++)
                if ((unsigned char) *c <= 0x20 || *c == 0x7f)
                        return -EBADMSG;
        memcpy(r.path, ps, (size_t) (pe - ps));

        bool have_cl = false, have_te = false;
        for (p = le + 2; p < end;) {
                le = find_crlf(p, end + 2);
                if (!le || le > end)
                        return -EBADMSG;
                const char *colon = memchr(p, ':', (size_t) (le - p));
                if (!colon || colon == p)
                        return -EBADMSG; /* obs-fold and junk lines are refused */
                for (const char *c = p; c < colon; c++)
                        if (!is_tchar((unsigned char) *c))
                                return -EBADMSG;
                const char *vs = colon + 1, *ve = le;
                for (const char *c = vs; c < ve; c++)
                        if (*c == 0 || *c == '\r' || *c == '\n')
                                return -EBADMSG;
                trim(&vs, &ve);
                if (token_eq(p, colon, "content-length")) {
                        uint64_t v = 0;
                        if (vs == ve)
                                return -EBADMSG;
                        for (const char *c = vs; c < ve; c++) {
                                if (*c < '0' || *c > '9' || v > (UINT64_MAX - 9) / 10)
                                        return -EBADMSG;
                                v = v * 10 + (uint64_t) (*c - '0');
                        }
                        /* two different lengths are a smuggling attempt */
                        if (have_cl && v != r.content_length)
                                return -EBADMSG;
                        if (v > max_body)
                                return -EFBIG;
                        have_cl = true;
                        r.content_length = (size_t) v;
                } else if (token_eq(p, colon, "transfer-encoding")) {
                        if (!token_eq(vs, ve, "chunked"))
                                return list_has(vs, ve, "chunked") ? -EOPNOTSUPP : -EOPNOTSUPP;
                        if (have_te)
                                return -EBADMSG;
                        have_te = true;
                        r.chunked = true;
                } else if (token_eq(p, colon, "connection")) {
                        if (list_has(vs, ve, "close"))
                                r.keep_alive = false;
                        else if (list_has(vs, ve, "keep-alive"))
                                r.keep_alive = true;
                } else if (token_eq(p, colon, "expect")) {
                        if (!token_eq(vs, ve, "100-continue"))
                                return -EBADMSG;
                        r.expect_continue = http11;
                }
                p = le + 2;
        }
        /* RFC 9112 6.1: both framings is an error a server must not guess about */
        if (have_cl && have_te)
                return -EBADMSG;
        if (r.chunked && !http11)
                return -EBADMSG;
        *ret = r;
        return 1;
}

static int hexval(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* One chunk header at p: size into *ret, p advanced past its CRLF.
 * 1 done, 0 more, <0 error. */
static int chunk_header(const char **pp, const char *end, uint64_t *ret) {
        const char *p = *pp;
        uint64_t v = 0;
        int digits = 0;
        for (; p < end && hexval(*p) >= 0; p++, digits++) {
                if (digits >= 15)
                        return -EBADMSG;
                v = v * 16 + (uint64_t) hexval(*p);
        }
        if (p == end)
                return 0;
        if (digits == 0)
                return -EBADMSG;
        /* chunk extensions are skipped, to the CRLF (bounded) */
        const char *le = find_crlf(p, end);
        if (!le)
                return end - p > 4096 ? -EBADMSG : 0;
        if (le != p && *p != ';' && *p != ' ' && *p != '\t')
                return -EBADMSG;
        for (const char *c = p; c < le; c++)
                if (*c == '\n' || *c == '\r' || *c == 0)
                        return -EBADMSG;
        *pp = le + 2;
        *ret = v;
        return 1;
}

int ih_chunked_scan(const char *buf, size_t len, size_t max_body, size_t *ret_body_len,
                    size_t *ret_consumed) {
        const char *p = buf, *end = buf + len;
        uint64_t total = 0;
        for (;;) {
                uint64_t n;
                int r = chunk_header(&p, end, &n);
                if (r <= 0)
                        return r;
                if (n == 0)
                        break;
                if (n > max_body || total + n > max_body)
                        return -EFBIG;
                total += n;
                if ((uint64_t) (end - p) < n + 2)
                        return 0;
                p += n;
                if (p[0] != '\r' || p[1] != '\n')
                        return -EBADMSG;
                p += 2;
        }
        /* trailers, to the empty line; bounded */
        for (unsigned lines = 0;; lines++) {
                if (lines > 64)
                        return -EBADMSG;
                const char *le = find_crlf(p, end);
                if (!le)
                        return end - p > 8192 ? -EBADMSG : 0;
                if (le == p) {
                        p += 2;
                        break;
                }
                if (!memchr(p, ':', (size_t) (le - p)))
                        return -EBADMSG;
                p = le + 2;
        }
        *ret_body_len = (size_t) total;
        *ret_consumed = (size_t) (p - buf);
        return 1;
}

void ih_chunked_copy(const char *buf, size_t len, char *out) {
        const char *p = buf, *end = buf + len;
        for (;;) {
                uint64_t n;
                if (chunk_header(&p, end, &n) <= 0 || n == 0)
                        return;
                memcpy(out, p, (size_t) n);
                out += n;
                p += n + 2;
        }
}
