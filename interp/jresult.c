/* SPDX-License-Identifier: Apache-2.0 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jresult.h"

/* Jupyter MIME types and the E2B result fields they fill; any other type
 * goes to the event's "extra". */
static const struct {
        const char *mime, *field;
} fields[] = {
        { "text/plain", "text" },        { "text/html", "html" },
        { "text/markdown", "markdown" }, { "image/svg+xml", "svg" },
        { "image/png", "png" },          { "image/jpeg", "jpeg" },
        { "application/pdf", "pdf" },    { "text/latex", "latex" },
        { "application/json", "json" },  { "application/javascript", "javascript" },
        { "e2b/data", "data" },          { "e2b/chart", "chart" },
};

static const char *field_of(const char *mime) {
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
                if (strcmp(mime, fields[i].mime) == 0)
                        return fields[i].field;
        return NULL;
}

/* text/plain is a repr: a quoted string loses its quotes (E2B's text) */
static void unquote(const char **s, size_t *n) {
        if (*n >= 2 &&
            (((*s)[0] == '\'' && (*s)[*n - 1] == '\'') || ((*s)[0] == '"' && (*s)[*n - 1] == '"'))) {
                (*s)++;
                *n -= 2;
        }
}

json_t *jresult_event(json_t *data, bool main_result) {
        json_t *ev = json_object(), *extra = json_object();
        json_object_set_new(ev, "type", json_string("result"));
        const char *mime;
        json_t *v;
        json_object_foreach(data, mime, v) {
                if (json_is_null(v))
                        continue;
                const char *field = field_of(mime);
                if (!field) {
                        json_object_set(extra, mime, v);
                        continue;
                }
                if (strcmp(field, "text") == 0 && json_is_string(v)) {
                        const char *s = json_string_value(v);
                        size_t n = json_string_length(v);
                        unquote(&s, &n);
                        json_object_set_new(ev, "text", json_stringn(s, n));
                        continue;
                }
                json_object_set(ev, field, v);
        }
        json_object_set_new(ev, "extra", extra);
        json_object_set_new(ev, "is_main_result", json_boolean(main_result));
        return ev;
}

/* ------------------------------------------------ escaping, in one pass */

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
#define HAS_ZERO(w) (((w) -ONES) & ~(w) &HIGHS)
#define HAS_LESS(w, n) (((w) -ONES * (n)) & ~(w) &HIGHS)

/* Eight bytes that JSON takes as they are: ASCII, no control character,
 * no quote, no backslash (the common case, a base64 image's). */
static bool plain8(const unsigned char *p) {
        uint64_t w;
        memcpy(&w, p, 8);
        return !((w & HIGHS) | HAS_LESS(w, 0x20) | HAS_ZERO(w ^ (ONES * '"')) |
                 HAS_ZERO(w ^ (ONES * '\\')));
}

/* The length of the UTF-8 sequence at p (at most n bytes left) and its
 * code point, 0 when it is not one (overlong forms, surrogates, above
 * U+10FFFF: RFC 3629). */
static size_t utf8_seq(const unsigned char *p, size_t n, uint32_t *ret_cp) {
        unsigned char c = p[0];
        size_t k;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf)
                k = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
                k = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
                k = 4, cp = c & 0x07;
        else
                return 0;
        if (n < k)
                return 0;
        for (size_t i = 1; i < k; i++) {
                if ((p[i] & 0xc0) != 0x80)
                        return 0;
                cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
                return 0;
        *ret_cp = cp;
        return k;
}

static size_t u_escape(uint32_t u, char *out) {
        static const char hex[] = "0123456789abcdef";
        out[0] = '\\';
        out[1] = 'u';
        for (int i = 0; i < 4; i++)
                out[2 + i] = hex[(u >> (12 - 4 * i)) & 15];
        return 6;
}

/* One walk for both: with out NULL it only counts. All of the output is
 * ASCII: what is not goes as \u escapes (a surrogate pair above U+FFFF).
 * @e2b/code-interpreter decodes each read of the response on its own
 * (readLines, a new TextDecoder per read), so a character whose UTF-8
 * bytes fall in two reads would reach it as two U+FFFD. */
static ssize_t escape_walk(const unsigned char *p, size_t n, char *out) {
        size_t i = 0, len = 0;
        while (i < n) {
                size_t run = i;
                while (i + 8 <= n && plain8(p + i))
                        i += 8;
                while (i < n && p[i] >= 0x20 && p[i] < 0x80 && p[i] != '"' && p[i] != '\\')
                        i++;
                if (out)
                        memcpy(out + len, p + run, i - run);
                len += i - run;
                if (i == n)
                        break;
                unsigned char c = p[i];
                char esc[12];
                size_t k = 2;
                esc[0] = '\\';
                switch (c) {
                case '"':
                case '\\':
                        esc[1] = (char) c;
                        break;
                case '\b':
                        esc[1] = 'b';
                        break;
                case '\f':
                        esc[1] = 'f';
                        break;
                case '\n':
                        esc[1] = 'n';
                        break;
                case '\r':
                        esc[1] = 'r';
                        break;
                case '\t':
                        esc[1] = 't';
                        break;
                default:
                        if (c < 0x80) {
                                k = u_escape(c, esc);
                                break;
                        }
                        uint32_t cp;
                        size_t sl = utf8_seq(p + i, n - i, &cp);
                        if (!sl)
                                return -1;
                        if (cp < 0x10000)
                                k = u_escape(cp, esc);
                        else {
                                k = u_escape(0xd800 + ((cp - 0x10000) >> 10), esc);
                                k += u_escape(0xdc00 + ((cp - 0x10000) & 0x3ff), esc + 6);
                        }
                        i += sl - 1;
                }
                if (out)
                        memcpy(out + len, esc, k);
                len += k;
                i++;
        }
        return (ssize_t) len;
}

ssize_t json_escaped_len(const unsigned char *p, size_t n) {
        return escape_walk(p, n, NULL);
}

void json_escape(const unsigned char *p, size_t n, char *out) {
        (void) escape_walk(p, n, out);
}

/* ------------------------------------------------------------ the line */

typedef struct spliced {
        const char *field;
        const unsigned char *p;
        size_t n;
        size_t esc; /* its length escaped */
} spliced;

char *jresult_line(json_t *content, const jframe *bufs, size_t n_bufs, bool main_result,
                   size_t *ret_len) {
        json_t *data = json_object_get(content, "data");
        if (!json_is_object(data))
                return NULL;
        json_t *where = json_object_get(content, "hutch_buffers");
        /* the buffered values that are an E2B field are written after the
         * rest of the event: what json_dumps would copy and escape char by
         * char is escaped here once; the others go in as JSON strings */
        spliced sp[sizeof fields / sizeof fields[0]];
        size_t nsp = 0;
        json_t *inline_data = data, *ev = NULL;
        char *head = NULL, *line = NULL;
        if (json_is_object(where) && json_object_size(where) > 0) {
                inline_data = json_copy(data);
                if (!inline_data)
                        return NULL;
                const char *mime;
                json_t *ix;
                json_object_foreach(where, mime, ix) {
                        json_object_del(inline_data, mime);
                        json_int_t i = json_is_integer(ix) ? json_integer_value(ix) : -1;
                        if (i < 0 || (size_t) i >= n_bufs)
                                continue;
                        const unsigned char *p = bufs[i].data;
                        size_t n = bufs[i].len;
                        const char *field = field_of(mime);
                        if (field) {
                                const char *s = (const char *) p;
                                if (strcmp(field, "text") == 0)
                                        unquote(&s, &n);
                                ssize_t esc = json_escaped_len((const unsigned char *) s, n);
                                if (esc >= 0) {
                                        sp[nsp++] = (spliced) { field, (const unsigned char *) s, n,
                                                                (size_t) esc };
                                }
                                continue; /* not UTF-8: left out */
                        }
                        /* another type, for the event's extra: a JSON
                         * string (none if not UTF-8) */
                        json_object_set_new(inline_data, mime, json_stringn((const char *) p, n));
                }
        }
        ev = jresult_event(inline_data, main_result);
        if (inline_data != data)
                json_decref(inline_data);
        head = ev ? json_dumps(ev, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        json_decref(ev);
        if (!head)
                return NULL;
        /* head is "{...}", never "{}": it has type, extra, is_main_result */
        size_t hn = strlen(head) - 1, len = hn;
        for (size_t i = 0; i < nsp; i++)
                len += strlen(sp[i].field) + 6 + sp[i].esc; /* ,"f":"v" */
        line = malloc(len + 2);
        if (!line) {
                free(head);
                return NULL;
        }
        memcpy(line, head, hn);
        free(head);
        size_t o = hn;
        for (size_t i = 0; i < nsp; i++) {
                size_t fl = strlen(sp[i].field);
                memcpy(line + o, ",\"", 2);
                memcpy(line + o + 2, sp[i].field, fl);
                memcpy(line + o + 2 + fl, "\":\"", 3);
                o += fl + 5;
                json_escape(sp[i].p, sp[i].n, line + o);
                o += sp[i].esc;
                line[o++] = '"';
        }
        line[o++] = '}';
        line[o] = 0;
        *ret_len = o;
        return line;
}
