/* SPDX-License-Identifier: Apache-2.0 */
/* Streaming multipart/form-data parser: see multipart.h for what it accepts. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/multipart.h"
#include "util/macro.h"

enum mp_state {
        MP_PREAMBLE,    /* before the first delimiter: discarded */
        MP_AFTER_DELIM, /* transport padding after a delimiter, then CRLF */
        MP_EXPECT_LF,   /* CR seen after a delimiter */
        MP_HEADERS,
        MP_DATA,
        MP_EPILOGUE, /* after the close delimiter: discarded */
        MP_ERROR,
};

enum mp_step {
        STEP_MORE,  /* the byte extends the match */
        STEP_FAIL,  /* not a delimiter: what was held back is data */
        STEP_DELIM, /* "CRLF--boundary" + padding/CR: a delimiter (byte not consumed) */
        STEP_CLOSE, /* "CRLF--boundary--": the close delimiter (byte consumed) */
};

struct multipart_parser {
        multipart_callbacks cb;
        void *ud;
        enum mp_state state;
        int error; /* sticky once state == MP_ERROR */
        char errmsg[160];

        /* "\r\n--" boundary "-": the delimiter, then the first dash of a close
         * delimiter, so that delim[0..match) is always what is held back. */
        char delim[4 + MULTIPART_BOUNDARY_MAX + 1 + 1];
        size_t delim_len; /* without the trailing '-' */
        size_t match;     /* delimiter bytes matched so far, held back */
        /* The first two bytes of the match are the CRLF that the start of
         * the body or of a part's data stands for: they are not data. */
        bool phantom_crlf;

        unsigned n_parts;
        size_t hdr_len;    /* bytes in hdr */
        size_t line_start; /* where the current header line begins in hdr */
        char hdr[MULTIPART_HEADERS_MAX];
        /* Decoded parameter values; each is no longer than its raw form, and
         * only three are kept, so the header limit bounds them too. */
        char strings[MULTIPART_HEADERS_MAX + 8];
};

static int mp_fail(multipart_parser *p, int code, const char *fmt, ...) _printf_(3, 4);

static int mp_fail(multipart_parser *p, int code, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->errmsg, sizeof p->errmsg, fmt, ap);
        va_end(ap);
        p->state = MP_ERROR;
        p->error = code;
        return code;
}

static int mp_callback_failed(multipart_parser *p, int r, const char *which) {
        return mp_fail(p, r, "%s callback failed: %s", which, strerror(-r));
}

/* RFC 7230 tchar */
static bool is_tchar(unsigned char c) {
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                return true;
        return c && strchr("!#$%&'*+-.^_`|~", c);
}

/* RFC 2045 tspecials: what a backslash may escape inside a quoted-string. */
static bool is_tspecial(unsigned char c) {
        return c && strchr("()<>@,;:\\\"/[]?=", c);
}

/* RFC 2046 bchars; a space may not be last (checked by the caller). */
static bool is_bchar(unsigned char c) {
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                return true;
        return c && strchr("'()+_,-./:=? ", c);
}

static const char *skip_ows(const char *s) {
        while (*s == ' ' || *s == '\t')
                s++;
        return s;
}

static const char *skip_token(const char *s) {
        while (is_tchar((unsigned char) *s))
                s++;
        return s;
}

/* One `; name=value` parameter (RFC 2045 §5.1). Returns 1 with the name
 * (ret_name, ret_name_len; not terminated) and the value decoded into out
 * (NUL-terminated), 0 at the end of the string, -EBADMSG when malformed.
 * A trailing ';' is tolerated. Unquoted values are read leniently: anything
 * up to whitespace or ';' except '"' and controls (clients send
 * filename=/tmp/a.txt unquoted). */
static int param_next(const char **cursor, const char **ret_name, size_t *ret_name_len, char *out,
                      size_t outsz) {
        const char *s = skip_ows(*cursor);
        size_t n = 0;

        if (*s == '\0')
                return 0;
        if (*s != ';')
                return -EBADMSG;
        s = skip_ows(s + 1);
        if (*s == '\0') {
                *cursor = s;
                return 0;
        }
        const char *name = s;
        s = skip_token(s);
        if (s == name)
                return -EBADMSG;
        size_t name_len = (size_t) (s - name);
        s = skip_ows(s);
        if (*s != '=')
                return -EBADMSG;
        s = skip_ows(s + 1);

        if (*s == '"') {
                for (s++;; s++) {
                        unsigned char c = (unsigned char) *s;
                        if (c == '\0')
                                return -EBADMSG; /* unterminated */
                        if (c == '"')
                                break;
                        if (c == '\\' && is_tspecial((unsigned char) s[1]))
                                c = (unsigned char) *++s;
                        if (n + 1 >= outsz)
                                return -EBADMSG;
                        out[n++] = (char) c;
                }
                s++;
        } else {
                for (;; s++) {
                        unsigned char c = (unsigned char) *s;
                        if (c <= ' ' || c == ';' || c == 0x7f)
                                break;
                        if (c == '"')
                                return -EBADMSG;
                        if (n + 1 >= outsz)
                                return -EBADMSG;
                        out[n++] = (char) c;
                }
                if (n == 0)
                        return -EBADMSG;
        }
        out[n] = '\0';
        *ret_name = name;
        *ret_name_len = name_len;
        *cursor = s;
        return 1;
}

static bool name_is(const char *name, size_t len, const char *want) {
        return strlen(want) == len && strncasecmp(name, want, len) == 0;
}

static int unhex(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* RFC 8187 ext-value, decoded in place: charset'language'pct-encoded.
 * UTF-8 only (RFC 8187 §3.2.1 dropped ISO-8859-1). */
static int decode_ext_value(multipart_parser *p, char *v) {
        char *q1 = strchr(v, '\'');
        char *q2 = q1 ? strchr(q1 + 1, '\'') : NULL;
        if (!q2)
                return mp_fail(p, -EBADMSG, "malformed filename* parameter");
        if (q1 - v != 5 || strncasecmp(v, "utf-8", 5) != 0)
                return mp_fail(p, -EBADMSG, "filename* charset is not UTF-8");
        char *w = v;
        for (const char *s = q2 + 1; *s; s++) {
                int c = (unsigned char) *s;
                if (c == '%') {
                        int hi = unhex(s[1]), lo = hi < 0 ? -1 : unhex(s[2]);
                        if (lo < 0)
                                return mp_fail(p, -EBADMSG, "bad percent-encoding in filename*");
                        c = hi * 16 + lo;
                        s += 2;
                }
                if (c < 0x20 || c == 0x7f)
                        return mp_fail(p, -EBADMSG, "control character in filename*");
                *w++ = (char) c;
        }
        *w = '\0';
        return 0;
}

/* Content-Disposition: form-data; name="..."; filename="..." (RFC 7578 §4.2) */
static int parse_disposition(multipart_parser *p, const char *value, multipart_part *part) {
        const char *s = skip_ows(value), *type = s;
        size_t used = 0;
        const char *filename = NULL, *filename_ext = NULL;
        bool have_name = false;

        s = skip_token(s);
        if (!name_is(type, (size_t) (s - type), "form-data"))
                return mp_fail(p, -EBADMSG, "part Content-Disposition is not form-data");

        for (;;) {
                const char *pname;
                size_t pname_len;
                char *out = p->strings + used;
                int r = param_next(&s, &pname, &pname_len, out, sizeof p->strings - used);
                if (r < 0)
                        return mp_fail(p, -EBADMSG, "malformed part Content-Disposition");
                if (r == 0)
                        break;
                size_t out_len = strlen(out) + 1;
                if (name_is(pname, pname_len, "name")) {
                        if (have_name)
                                return mp_fail(p, -EBADMSG, "duplicate name parameter");
                        have_name = true;
                        part->name = out;
                } else if (name_is(pname, pname_len, "filename")) {
                        if (filename)
                                return mp_fail(p, -EBADMSG, "duplicate filename parameter");
                        filename = out;
                } else if (name_is(pname, pname_len, "filename*")) {
                        if (filename_ext)
                                return mp_fail(p, -EBADMSG, "duplicate filename* parameter");
                        r = decode_ext_value(p, out);
                        if (r < 0)
                                return r;
                        filename_ext = out;
                } else
                        continue; /* unknown parameter: its bytes are reused */
                used += out_len;
        }
        part->filename = filename_ext ? filename_ext : filename;
        return 0;
}

/* hdr[0..line_start) holds the part's header lines, each ending in LF. They
 * are validated, unfolded and NUL-terminated in place, then read. */
static int parse_headers(multipart_parser *p, multipart_part *part) {
        char *h = p->hdr;
        size_t n = p->line_start, w = 0;
        unsigned n_lines = 0;
        bool have_disposition = false;

        for (size_t r = 0; r < n;) {
                const char *nl = memchr(h + r, '\n', n - r);
                size_t e = (size_t) (nl - h), le = e;
                if (le > r && h[le - 1] == '\r')
                        le--;
                if (h[r] == ' ' || h[r] == '\t') {
                        /* obs-fold (RFC 5322 §2.2.3): joins the previous line */
                        if (n_lines == 0)
                                return mp_fail(p, -EBADMSG,
                                               "part headers begin with a continuation line");
                        h[w - 1] = ' ';
                } else if (++n_lines > MULTIPART_HEADER_LINES_MAX)
                        return mp_fail(p, -EBADMSG, "more than %d part headers",
                                       MULTIPART_HEADER_LINES_MAX);
                for (size_t k = r; k < le; k++) {
                        unsigned char c = (unsigned char) h[k];
                        if ((c < 0x20 && c != '\t') || c == 0x7f)
                                return mp_fail(p, -EBADMSG, "control character in part header");
                        h[w++] = (char) c;
                }
                h[w++] = '\0';
                r = e + 1;
        }

        *part = (multipart_part) { .name = "" };
        for (char *line = h, *next; line < h + w; line = next) {
                next = line + strlen(line) + 1;
                char *colon = (char *) skip_token(line);
                if (colon == line || *colon != ':')
                        return mp_fail(p, -EBADMSG, "malformed part header");
                *colon = '\0';
                char *value = (char *) skip_ows(colon + 1);
                size_t vl = strlen(value);
                while (vl > 0 && (value[vl - 1] == ' ' || value[vl - 1] == '\t'))
                        value[--vl] = '\0';

                if (strcasecmp(line, "content-disposition") == 0) {
                        if (have_disposition)
                                return mp_fail(p, -EBADMSG, "duplicate part Content-Disposition");
                        have_disposition = true;
                        int r = parse_disposition(p, value, part);
                        if (r < 0)
                                return r;
                } else if (strcasecmp(line, "content-type") == 0) {
                        if (part->content_type)
                                return mp_fail(p, -EBADMSG, "duplicate part Content-Type");
                        part->content_type = value;
                }
        }
        if (!have_disposition)
                return mp_fail(p, -EBADMSG, "part without Content-Disposition");
        return 0;
}

static int mp_headers_done(multipart_parser *p) {
        multipart_part part;
        int r = parse_headers(p, &part);
        if (r < 0)
                return r;
        p->state = MP_DATA;
        /* Like Go's mime/multipart, a delimiter may start the data without
         * its CRLF (an empty part from a sender that left it out). */
        p->match = 2;
        p->phantom_crlf = true;
        if (p->cb.part_begin) {
                r = p->cb.part_begin(p->ud, &part);
                if (r < 0)
                        return mp_callback_failed(p, r, "part_begin");
        }
        return 0;
}

static int mp_part_start(multipart_parser *p) {
        if (p->n_parts >= MULTIPART_PARTS_MAX)
                return mp_fail(p, -EBADMSG, "more than %d parts", MULTIPART_PARTS_MAX);
        p->n_parts++;
        p->state = MP_HEADERS;
        p->hdr_len = p->line_start = 0;
        return 0;
}

/* Part data, or preamble (dropped). */
static int mp_emit(multipart_parser *p, const void *data, size_t len) {
        if (len == 0 || p->state != MP_DATA || !p->cb.part_data)
                return 0;
        int r = p->cb.part_data(p->ud, data, len);
        return r < 0 ? mp_callback_failed(p, r, "part_data") : 0;
}

static int mp_delimiter(multipart_parser *p, bool close) {
        if (p->state == MP_DATA && p->cb.part_end) {
                int r = p->cb.part_end(p->ud);
                if (r < 0)
                        return mp_callback_failed(p, r, "part_end");
        }
        p->state = close ? MP_EPILOGUE : MP_AFTER_DELIM;
        return 0;
}

static enum mp_step delim_step(const multipart_parser *p, unsigned char c) {
        if (p->match < p->delim_len)
                return c == (unsigned char) p->delim[p->match] ? STEP_MORE : STEP_FAIL;
        if (p->match == p->delim_len) {
                if (c == '-')
                        return STEP_MORE;
                if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
                        return STEP_DELIM;
                return STEP_FAIL;
        }
        return c == '-' ? STEP_CLOSE : STEP_FAIL;
}

/* Scan part data (or the preamble) for the next delimiter from d[*pos].
 * Data is handed on in one call per contiguous run of this slice. A match
 * that runs past the slice's end is held back (as p->match bytes of
 * p->delim) until the next slice decides. The boundary has no CR, so a
 * failed match can only restart at a later CR: no KMP table is needed. */
static int mp_scan(multipart_parser *p, const uint8_t *d, size_t len, size_t *pos) {
        size_t i = *pos, start = i, cand = i;
        size_t carried = p->match; /* held from earlier slices */
        int r;

        while (i < len) {
                if (p->match == 0) {
                        const uint8_t *cr = memchr(d + i, '\r', len - i);
                        if (!cr) {
                                i = len;
                                break;
                        }
                        cand = i = (size_t) (cr - d);
                        p->match = 1;
                        i++;
                        continue;
                }
                enum mp_step step = delim_step(p, d[i]);
                if (step == STEP_MORE) {
                        p->match++;
                        i++;
                        continue;
                }
                if (step == STEP_FAIL) {
                        /* Held bytes of this slice are already in [start, i);
                         * those of earlier slices go first. d[i] is looked at
                         * again: it may be a CR. */
                        if (carried > 0) {
                                size_t skip = p->phantom_crlf ? 2 : 0;
                                r = mp_emit(p, p->delim + skip, carried - skip);
                                if (r < 0)
                                        return r;
                                carried = 0;
                        }
                        p->match = 0;
                        p->phantom_crlf = false;
                        continue;
                }
                if (step == STEP_CLOSE)
                        i++;
                if (carried == 0) {
                        r = mp_emit(p, d + start, cand - start);
                        if (r < 0)
                                return r;
                }
                p->match = 0;
                p->phantom_crlf = false;
                *pos = i;
                return mp_delimiter(p, step == STEP_CLOSE);
        }

        *pos = len;
        if (p->match == 0)
                return mp_emit(p, d + start, len - start);
        if (carried == 0)
                return mp_emit(p, d + start, cand - start);
        return 0; /* the whole slice continues a match begun earlier */
}

static int mp_headers_feed(multipart_parser *p, const uint8_t *d, size_t len, size_t *pos) {
        size_t i = *pos;
        const uint8_t *nl = memchr(d + i, '\n', len - i);
        size_t end = nl ? (size_t) (nl - d) : len;

        if (end - i > sizeof p->hdr - p->hdr_len)
                return mp_fail(p, -EBADMSG, "part headers longer than %d bytes",
                               MULTIPART_HEADERS_MAX);
        memcpy(p->hdr + p->hdr_len, d + i, end - i);
        p->hdr_len += end - i;
        if (!nl) {
                *pos = len;
                return 0;
        }
        *pos = end + 1;

        size_t ll = p->hdr_len - p->line_start;
        if (ll == 0 || (ll == 1 && p->hdr[p->line_start] == '\r'))
                return mp_headers_done(p); /* the empty line */
        if (p->hdr_len >= sizeof p->hdr)
                return mp_fail(p, -EBADMSG, "part headers longer than %d bytes",
                               MULTIPART_HEADERS_MAX);
        p->hdr[p->hdr_len++] = '\n';
        p->line_start = p->hdr_len;
        return 0;
}

int multipart_parser_feed(multipart_parser *p, const void *data, size_t len) {
        const uint8_t *d = data;
        size_t i = 0;
        int r = 0;

        if (!p || (!d && len > 0))
                return -EINVAL;
        if (p->state == MP_ERROR)
                return p->error;

        while (i < len && r >= 0) {
                switch (p->state) {
                case MP_PREAMBLE:
                case MP_DATA:
                        r = mp_scan(p, d, len, &i);
                        break;
                case MP_AFTER_DELIM: {
                        uint8_t c = d[i++];
                        if (c == '\r')
                                p->state = MP_EXPECT_LF;
                        else if (c == '\n') /* bare LF, as Go accepts */
                                r = mp_part_start(p);
                        else if (c != ' ' && c != '\t')
                                r = mp_fail(p, -EBADMSG, "unexpected bytes after a boundary");
                        break;
                }
                case MP_EXPECT_LF:
                        if (d[i++] == '\n')
                                r = mp_part_start(p);
                        else
                                r = mp_fail(p, -EBADMSG, "CR without LF after a boundary");
                        break;
                case MP_HEADERS:
                        r = mp_headers_feed(p, d, len, &i);
                        break;
                case MP_EPILOGUE:
                        i = len;
                        break;
                case MP_ERROR:
                        return p->error;
                }
        }
        return r < 0 ? r : 0;
}

int multipart_parser_finish(multipart_parser *p) {
        if (!p)
                return -EINVAL;
        if (p->state == MP_ERROR)
                return p->error;
        if (p->state != MP_EPILOGUE)
                return mp_fail(p, -EBADMSG, "body ended before the closing boundary");
        return 0;
}

const char *multipart_parser_error(const multipart_parser *p) {
        return p ? p->errmsg : "";
}

unsigned multipart_parser_parts(const multipart_parser *p) {
        return p ? p->n_parts : 0;
}

void multipart_parser_free(multipart_parser *p) {
        free(p);
}

static int set_err(char *err, size_t errlen, const char *msg) {
        if (err && errlen > 0)
                snprintf(err, errlen, "%s", msg);
        return -EINVAL;
}

int multipart_parser_new(const char *content_type, const multipart_callbacks *cb, void *ud,
                         multipart_parser **ret, char *err, size_t errlen) {
        if (!content_type || !ret)
                return set_err(err, errlen, "no Content-Type");

        /* type "/" subtype *( OWS ";" OWS parameter ) (RFC 7231 §3.1.1.1) */
        const char *s = skip_ows(content_type), *type = s;
        s = skip_token(s);
        size_t type_len = (size_t) (s - type);
        const char *subtype = *s == '/' ? s + 1 : s;
        s = skip_token(subtype);
        if (!name_is(type, type_len, "multipart") ||
            !name_is(subtype, (size_t) (s - subtype), "form-data"))
                return set_err(err, errlen, "Content-Type is not multipart/form-data");

        size_t vsz = strlen(s) + 1;
        _cleanup_free_ char *value = malloc(vsz);
        char boundary[MULTIPART_BOUNDARY_MAX + 1];
        bool have_boundary = false;
        if (!value)
                return -ENOMEM;
        for (;;) {
                const char *pname;
                size_t pname_len;
                int r = param_next(&s, &pname, &pname_len, value, vsz);
                if (r < 0)
                        return set_err(err, errlen, "malformed Content-Type parameters");
                if (r == 0)
                        break;
                if (!name_is(pname, pname_len, "boundary"))
                        continue;
                if (have_boundary)
                        return set_err(err, errlen, "Content-Type has two boundary parameters");
                size_t bl = strlen(value);
                if (bl == 0 || bl > MULTIPART_BOUNDARY_MAX)
                        return set_err(err, errlen, "multipart boundary must be 1 to 70 characters");
                for (size_t k = 0; k < bl; k++)
                        if (!is_bchar((unsigned char) value[k]))
                                return set_err(err, errlen,
                                               "invalid character in multipart boundary");
                if (value[bl - 1] == ' ')
                        return set_err(err, errlen, "multipart boundary ends in a space");
                memcpy(boundary, value, bl + 1);
                have_boundary = true;
        }
        if (!have_boundary)
                return set_err(err, errlen, "multipart/form-data without a boundary");

        multipart_parser *p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        if (cb)
                p->cb = *cb;
        p->ud = ud;
        p->state = MP_PREAMBLE;
        p->delim_len = (size_t) snprintf(p->delim, sizeof p->delim, "\r\n--%s-", boundary) - 1;
        /* The body's start counts as the CRLF before the first delimiter. */
        p->match = 2;
        p->phantom_crlf = true;
        *ret = p;
        return 0;
}
