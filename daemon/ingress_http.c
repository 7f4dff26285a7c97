/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sandbox-facing HTTP parsers of ingress (daemon/ingress_http.h).
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <strings.h>

#include "daemon/ingress_http.h"
#include "daemon/route.h"

static bool is_tchar(unsigned char c) {
        return isalnum(c) || strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* a field value byte: VCHAR, SP, HTAB, obs-text */
static bool is_vbyte(unsigned char c) {
        return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static bool name_is(const ingress_field *f, const char *name) {
        return f->name_len == strlen(name) && strncasecmp(f->name, name, f->name_len) == 0;
}

bool ingress_list_has(const char *value, size_t value_len, const char *tok) {
        size_t tl = strlen(tok), i = 0;
        while (i < value_len) {
                while (i < value_len && (value[i] == ' ' || value[i] == '\t' || value[i] == ','))
                        i++;
                size_t s = i;
                while (i < value_len && value[i] != ',')
                        i++;
                size_t e = i;
                while (e > s && (value[e - 1] == ' ' || value[e - 1] == '\t'))
                        e--;
                if (e - s == tl && strncasecmp(value + s, tok, tl) == 0)
                        return true;
        }
        return false;
}

/* The last coding of a Transfer-Encoding list is chunked. */
static bool list_last_is_chunked(const char *v, size_t n) {
        size_t e = n;
        while (e > 0 && (v[e - 1] == ' ' || v[e - 1] == '\t'))
                e--;
        size_t s = e;
        while (s > 0 && v[s - 1] != ',')
                s--;
        while (s < e && (v[s] == ' ' || v[s] == '\t'))
                s++;
        return e - s == 7 && strncasecmp(v + s, "chunked", 7) == 0;
}

int ingress_resp_head_parse(const char *buf, size_t len, bool head_request, ingress_resp_head *ret) {
        /* the end of the head first: nothing is judged on a partial head
         * but its size */
        const char *end = NULL;
        size_t scan = len < INGRESS_HEAD_MAX ? len : INGRESS_HEAD_MAX;
        for (size_t i = 0; i + 3 < scan; i++)
                if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
                        end = buf + i + 4;
                        break;
                }
        if (!end)
                return len >= INGRESS_HEAD_MAX ? -E2BIG : 0;
        memset(ret, 0, sizeof *ret);
        ret->head_len = (size_t) (end - buf);

        /* status line: HTTP/1.D SP 3DIGIT [SP reason] CRLF */
        const char *p = buf;
        if (ret->head_len < 14 || memcmp(p, "HTTP/1.", 7) != 0 || !isdigit((unsigned char) p[7]) ||
            p[8] != ' ' || !isdigit((unsigned char) p[9]) || !isdigit((unsigned char) p[10]) ||
            !isdigit((unsigned char) p[11]))
                return -EBADMSG;
        ret->minor = (unsigned) (p[7] - '0');
        ret->status = (unsigned) ((p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0'));
        if (ret->status < 100)
                return -EBADMSG;
        p += 12;
        if (*p == ' ') {
                for (p++; *p != '\r'; p++)
                        if (!is_vbyte((unsigned char) *p))
                                return -EBADMSG;
        }
        if (p[0] != '\r' || p[1] != '\n')
                return -EBADMSG;
        p += 2;

        /* field lines */
        bool have_cl = false, have_te = false, te_chunked = false;
        uint64_t cl = 0;
        while (!(p[0] == '\r' && p[1] == '\n')) {
                if (ret->n_fields == INGRESS_HEADERS_MAX)
                        return -E2BIG;
                ingress_field *f = &ret->fields[ret->n_fields];
                f->name = p;
                while (is_tchar((unsigned char) *p))
                        p++;
                f->name_len = (size_t) (p - f->name);
                /* no obs-fold, no space before the colon, no empty name */
                if (f->name_len == 0 || *p != ':')
                        return -EBADMSG;
                p++;
                while (*p == ' ' || *p == '\t')
                        p++;
                f->value = p;
                while (*p != '\r') {
                        if (!is_vbyte((unsigned char) *p))
                                return -EBADMSG; /* a bare LF, NUL or other control byte */
                        p++;
                }
                if (p[1] != '\n')
                        return -EBADMSG;
                const char *ve = p;
                while (ve > f->value && (ve[-1] == ' ' || ve[-1] == '\t'))
                        ve--;
                f->value_len = (size_t) (ve - f->value);
                p += 2;
                ret->n_fields++;

                if (name_is(f, "Content-Length")) {
                        if (f->value_len == 0 || f->value_len > 18)
                                return -EBADMSG;
                        uint64_t v = 0;
                        for (size_t i = 0; i < f->value_len; i++) {
                                if (!isdigit((unsigned char) f->value[i]))
                                        return -EBADMSG; /* "5, 5", "+5", "0x5": one meaning or none */
                                v = v * 10 + (uint64_t) (f->value[i] - '0');
                        }
                        if (have_cl && v != cl)
                                return -EBADMSG;
                        have_cl = true;
                        cl = v;
                } else if (name_is(f, "Transfer-Encoding")) {
                        have_te = true;
                        /* the last field's last coding decides (a list may span fields) */
                        te_chunked = list_last_is_chunked(f->value, f->value_len);
                }
        }
        if (p + 2 != end)
                return -EBADMSG;

        unsigned s = ret->status;
        if (s >= 100 && s < 200 && s != 101) {
                if (have_cl || have_te)
                        return -EBADMSG;
                ret->interim = true;
                ret->body = INGRESS_BODY_NONE;
                return 1;
        }
        if (s == 101 || s == 204 || s == 304 || head_request) {
                /* RFC 9110 §8.6: a 1xx or 204 has no Content-Length; one on a
                 * 304 or a HEAD is the resource's, kept for the client */
                if ((s == 101 || s == 204) && (have_cl || have_te))
                        return -EBADMSG;
                ret->body = INGRESS_BODY_NONE;
                ret->content_length = cl;
                return 1;
        }
        if (have_te) {
                /* RFC 9112 §6.3: Transfer-Encoding overrides Content-Length,
                 * but a sender of both is refused here (§6.1: "ought to be
                 * handled as an error") */
                if (have_cl)
                        return -EBADMSG;
                ret->body = te_chunked ? INGRESS_BODY_CHUNKED : INGRESS_BODY_CLOSE;
        } else if (have_cl) {
                ret->body = INGRESS_BODY_LENGTH;
                ret->content_length = cl;
        } else
                ret->body = INGRESS_BODY_CLOSE;
        return 1;
}

bool ingress_resp_field_is_hop(const ingress_resp_head *h, const char *name, size_t name_len) {
        static const char *const hop[] = { "Connection",         "Keep-Alive", "Proxy-Connection",
                                           "Proxy-Authenticate", "TE",         "Trailer",
                                           "Transfer-Encoding",  "Upgrade",    "Content-Length" };
        for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
                if (name_len == strlen(hop[i]) && strncasecmp(name, hop[i], name_len) == 0)
                        return true;
        char tok[128];
        if (name_len >= sizeof tok)
                return false;
        memcpy(tok, name, name_len);
        tok[name_len] = 0;
        for (size_t i = 0; i < h->n_fields; i++)
                if (name_is(&h->fields[i], "Connection") &&
                    ingress_list_has(h->fields[i].value, h->fields[i].value_len, tok))
                        return true;
        return false;
}

/* ------------------------------------------------------------------ chunked */

enum {
        CK_SIZE = 0, /* hex digits */
        CK_EXT,      /* after ';' up to CR */
        CK_SIZE_LF,
        CK_DATA,
        CK_DATA_CR,
        CK_DATA_LF,
        CK_TRAILER, /* at the start of a trailer line (or the final CRLF) */
        CK_TRAILER_LINE,
        CK_TRAILER_LF,
        CK_FINAL_LF,
        CK_DONE,
        CK_ERROR,
};

#define CK_DIGITS_MAX 16
#define CK_EXT_MAX 1024
#define CK_TRAILERS_MAX 32
#define CK_TRAILER_LINE_MAX 4096

void ingress_chunked_init(ingress_chunked *c) {
        memset(c, 0, sizeof *c);
}

static int hexval(unsigned char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

ssize_t ingress_chunked_decode(ingress_chunked *c, uint8_t *buf, size_t n, size_t *ret_used) {
        size_t in = 0, out = 0;
        int err = 0;
        *ret_used = 0;
        if (c->state == CK_ERROR)
                return -EBADMSG;
        while (in < n && c->state != CK_DONE) {
                unsigned char b = buf[in];
                switch (c->state) {
                case CK_SIZE: {
                        int v = hexval(b);
                        if (v >= 0) {
                                if (++c->digits > CK_DIGITS_MAX || c->left >> 58) {
                                        err = -E2BIG;
                                        goto fail;
                                }
                                c->left = c->left * 16 + (uint64_t) v;
                                in++;
                                break;
                        }
                        if (c->digits == 0 || (b != ';' && b != '\r')) {
                                err = -EBADMSG;
                                goto fail;
                        }
                        c->state = b == ';' ? CK_EXT : CK_SIZE_LF;
                        c->count = 0;
                        in++;
                        break;
                }
                case CK_EXT:
                        if (b == '\r') {
                                c->state = CK_SIZE_LF;
                        } else if (!is_vbyte(b) || ++c->count > CK_EXT_MAX) {
                                err = b == '\n' || !is_vbyte(b) ? -EBADMSG : -E2BIG;
                                goto fail;
                        }
                        in++;
                        break;
                case CK_SIZE_LF:
                        if (b != '\n') {
                                err = -EBADMSG;
                                goto fail;
                        }
                        in++;
                        c->digits = 0;
                        c->state = c->left == 0 ? CK_TRAILER : CK_DATA;
                        break;
                case CK_DATA: {
                        size_t take = n - in;
                        if (take > c->left)
                                take = (size_t) c->left;
                        memmove(buf + out, buf + in, take);
                        out += take;
                        in += take;
                        c->left -= take;
                        if (c->left == 0)
                                c->state = CK_DATA_CR;
                        break;
                }
                case CK_DATA_CR:
                case CK_DATA_LF:
                        if (b != (c->state == CK_DATA_CR ? '\r' : '\n')) {
                                err = -EBADMSG;
                                goto fail;
                        }
                        in++;
                        c->state = c->state == CK_DATA_CR ? CK_DATA_LF : CK_SIZE;
                        break;
                case CK_TRAILER:
                        in++;
                        if (b == '\r') {
                                c->state = CK_FINAL_LF;
                                break;
                        }
                        /* a trailer field: name ':' ... (dropped: not relayed) */
                        if (!is_tchar(b) || ++c->n_trailers > CK_TRAILERS_MAX) {
                                err = is_tchar(b) ? -E2BIG : -EBADMSG;
                                goto fail;
                        }
                        c->count = 1;
                        c->state = CK_TRAILER_LINE;
                        break;
                case CK_TRAILER_LINE:
                        in++;
                        if (b == '\r') {
                                c->state = CK_TRAILER_LF;
                                break;
                        }
                        if (!is_vbyte(b) || ++c->count > CK_TRAILER_LINE_MAX) {
                                err = is_vbyte(b) ? -E2BIG : -EBADMSG;
                                goto fail;
                        }
                        break;
                case CK_TRAILER_LF:
                case CK_FINAL_LF:
                        if (b != '\n') {
                                err = -EBADMSG;
                                goto fail;
                        }
                        in++;
                        c->state = c->state == CK_FINAL_LF ? CK_DONE : CK_TRAILER;
                        break;
                }
        }
        if (c->state == CK_DONE)
                c->done = true;
        *ret_used = in;
        return (ssize_t) out;
fail:
        c->state = CK_ERROR;
        return err;
}

/* -------------------------------------------------------------------- host */

int ingress_host_parse(const char *host, const char *domain, unsigned *ret_port,
                       char ret_id[HUTCH_ID_LEN + 1]) {
        unsigned port;
        char id[HUTCH_ID_LEN + 1];
        if (!host || route_host(host, &port, id) < 0)
                return -EINVAL;
        if (domain && *domain) {
                /* what follows "<port>-<id>." */
                const char *rest = strchr(host, '.') + 1;
                size_t dl = strlen(domain), rl = strlen(rest);
                bool domain_has_port = strchr(domain, ':') != NULL;
                if (!domain_has_port) {
                        const char *colon = strrchr(rest, ':');
                        /* "[::1]" style names never are a sandbox domain */
                        if (colon) {
                                for (const char *d = colon + 1; *d; d++)
                                        if (!isdigit((unsigned char) *d))
                                                return -EINVAL;
                                rl = (size_t) (colon - rest);
                        }
                }
                if (rl != dl || strncasecmp(rest, domain, dl) != 0)
                        return -EINVAL;
        }
        *ret_port = port;
        memcpy(ret_id, id, sizeof id);
        return 0;
}

int ingress_port_parse(const char *s, unsigned *ret) {
        unsigned v = 0;
        size_t i = 0;
        if (!s)
                return -EINVAL;
        for (; s[i]; i++) {
                if (!isdigit((unsigned char) s[i]) || i >= 5)
                        return -EINVAL;
                v = v * 10 + (unsigned) (s[i] - '0');
        }
        if (i == 0 || v == 0 || v > 65535)
                return -EINVAL;
        *ret = v;
        return 0;
}
