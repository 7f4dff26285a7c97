/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's body parsers: multipart/form-data (POST /files) fed whole, in
 * slices and byte by byte, including the bytes undici sends; malformed
 * bodies; and gzip streams (round trips, concatenated members, bombs,
 * truncation, garbage). Prints TAP.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "daemon/gzipstream.h"
#include "daemon/multipart.h"
#include "tap.h"

/* ---- multipart ------------------------------------------------------- */

#define UNDICI_CT "multipart/form-data; boundary=----formdata-undici-032350027135"

/* The body of conn#3 in docs/protocol.md §e.1, in the chunks undici sent. */
static const char *const undici_chunks[] = {
        "------formdata-undici-032350027135\r\n"
        "Content-Disposition: form-data; name=\"file\"; filename=\"/tmp/a.txt\"\r\n"
        "Content-Type: application/octet-stream\r\n"
        "\r\n",
        "x",
        "\r\n",
        "------formdata-undici-032350027135--\r\n",
};

#define MAX_PARTS 1100
#define MIN_SZ(a, b) ((size_t) (a) < (size_t) (b) ? (size_t) (a) : (size_t) (b))

typedef struct rec_part {
        char name[256], filename[256], content_type[256];
        bool has_filename, has_content_type, ended;
        uint8_t *data;
        size_t len, cap;
} rec_part;

typedef struct rec {
        rec_part parts[MAX_PARTS];
        size_t n;
        size_t data_calls;
        bool in_part, bad_order;
        int fail_begin; /* part_begin returns this for the part named "stop" */
} rec;

static int rec_begin(void *ud, const multipart_part *p) {
        rec *r = ud;
        if (r->in_part || r->n >= MAX_PARTS) {
                r->bad_order = true;
                return -EIO;
        }
        rec_part *rp = &r->parts[r->n++];
        memset(rp, 0, sizeof *rp);
        snprintf(rp->name, sizeof rp->name, "%s", p->name);
        rp->has_filename = p->filename != NULL;
        if (p->filename)
                snprintf(rp->filename, sizeof rp->filename, "%s", p->filename);
        rp->has_content_type = p->content_type != NULL;
        if (p->content_type)
                snprintf(rp->content_type, sizeof rp->content_type, "%s", p->content_type);
        r->in_part = true;
        if (r->fail_begin && strcmp(p->name, "stop") == 0)
                return r->fail_begin;
        return 0;
}

static int rec_data(void *ud, const void *data, size_t len) {
        rec *r = ud;
        if (!r->in_part || len == 0) {
                r->bad_order = true;
                return -EIO;
        }
        rec_part *rp = &r->parts[r->n - 1];
        if (rp->len + len > rp->cap) { /* geometric: byte-by-byte feeds stay linear */
                size_t cap = (rp->len + len) * 2;
                uint8_t *b = realloc(rp->data, cap);
                if (!b)
                        abort();
                rp->data = b;
                rp->cap = cap;
        }
        memcpy(rp->data + rp->len, data, len);
        rp->len += len;
        r->data_calls++;
        return 0;
}

static int rec_end(void *ud) {
        rec *r = ud;
        if (!r->in_part) {
                r->bad_order = true;
                return -EIO;
        }
        r->parts[r->n - 1].ended = true;
        r->in_part = false;
        return 0;
}

static const multipart_callbacks rec_cb = {
        .part_begin = rec_begin,
        .part_data = rec_data,
        .part_end = rec_end,
};

static rec *rec_new(void) {
        rec *r = calloc(1, sizeof *r);
        if (!r)
                abort();
        return r;
}

static void rec_free(rec *r) {
        if (!r)
                return;
        for (size_t i = 0; i < r->n; i++)
                free(r->parts[i].data);
        free(r);
}

/* Parse body in slices of step bytes (0: whole); returns feed/finish's result. */
static int parse_body(const char *ct, const void *body, size_t len, size_t step, rec *r,
                      char *errbuf, size_t errlen) {
        multipart_parser *p = NULL;
        int k = multipart_parser_new(ct, &rec_cb, r, &p, errbuf, errlen);
        if (k < 0)
                return k;
        const uint8_t *b = body;
        for (size_t at = 0; at < len && k >= 0;) {
                size_t n = step && step < len - at ? step : len - at;
                k = multipart_parser_feed(p, b + at, n);
                at += n;
        }
        if (k >= 0)
                k = multipart_parser_finish(p);
        if (k < 0 && errbuf)
                snprintf(errbuf, errlen, "%s", multipart_parser_error(p));
        multipart_parser_free(p);
        return k;
}

static bool part_is(const rec *r, size_t i, const char *name, const char *filename, const char *ct,
                    const void *data, size_t len) {
        if (i >= r->n)
                return false;
        const rec_part *p = &r->parts[i];
        if (strcmp(p->name, name) != 0 || !p->ended || p->len != len)
                return false;
        if (len > 0 && memcmp(p->data, data, len) != 0)
                return false;
        if (filename ? !p->has_filename || strcmp(p->filename, filename) != 0 : p->has_filename)
                return false;
        if (ct ? !p->has_content_type || strcmp(p->content_type, ct) != 0 : p->has_content_type)
                return false;
        return true;
}

static bool recs_equal(const rec *a, const rec *b) {
        if (a->n != b->n || a->bad_order || b->bad_order)
                return false;
        for (size_t i = 0; i < a->n; i++) {
                const rec_part *p = &a->parts[i];
                if (!part_is(b, i, p->name, p->has_filename ? p->filename : NULL,
                             p->has_content_type ? p->content_type : NULL, p->data, p->len) ||
                    p->ended != b->parts[i].ended)
                        return false;
        }
        return true;
}

static void test_content_types(void) {
        static const struct {
                const char *ct;
                bool valid;
        } cases[] = {
                { UNDICI_CT, true },
                { "multipart/form-data; boundary=\"----WebKitFormBoundary7MA4YWxkTrZu0gW\"", true },
                { "Multipart/Form-Data;charset=utf-8;BOUNDARY=abc", true },
                { "multipart/form-data ; boundary = abc ;", true },
                { "multipart/form-data; boundary=\"a b\\\"c\"", false }, /* '"' is no bchar */
                { "multipart/form-data; boundary=\"with space\"", true },
                { "multipart/form-data; boundary=\"ends in space \"", false },
                { "multipart/form-data", false },
                { "multipart/form-data; charset=utf-8", false },
                { "multipart/form-data; boundary=", false },
                { "multipart/form-data; boundary=\"\"", false },
                { "multipart/form-data; boundary=a; boundary=b", false },
                { "multipart/form-data; boundary=\"unterminated", false },
                { "multipart/mixed; boundary=abc", false },
                { "application/octet-stream", false },
                { "", false },
                { "multipart/form-data; boundary=a\x01"
                  "b",
                  false },
                { "multipart/form-data; boundary="
                  "1234567890123456789012345678901234567890123456789012345678901234567890",
                  true },
                { "multipart/form-data; boundary="
                  "12345678901234567890123456789012345678901234567890123456789012345678901",
                  false },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                multipart_parser *p = NULL;
                char err[128] = "";
                int r = multipart_parser_new(cases[i].ct, NULL, NULL, &p, err, sizeof err);
                if (cases[i].valid)
                        ok(r == 0 && p, "Content-Type accepted: %s", cases[i].ct);
                else
                        ok(r == -EINVAL && !p && err[0], "Content-Type rejected: %s (%s)",
                           cases[i].ct, err);
                multipart_parser_free(p);
        }
}

static void test_undici_capture(void) {
        char body[1024] = "";
        for (size_t i = 0; i < 4; i++)
                strcat(body, undici_chunks[i]);
        size_t len = strlen(body);

        /* In the chunks undici sent. */
        rec *r = rec_new();
        multipart_parser *p = NULL;
        int k = multipart_parser_new(UNDICI_CT, &rec_cb, r, &p, NULL, 0);
        for (size_t i = 0; i < 4 && k >= 0; i++)
                k = multipart_parser_feed(p, undici_chunks[i], strlen(undici_chunks[i]));
        if (k >= 0)
                k = multipart_parser_finish(p);
        ok(k == 0 && r->n == 1 && !r->bad_order, "undici capture in its chunks parses (%d)", k);
        ok(part_is(r, 0, "file", "/tmp/a.txt", "application/octet-stream", "x", 1),
           "undici capture: name file, filename /tmp/a.txt, data \"x\"");
        ok(multipart_parser_parts(p) == 1, "one part counted");
        multipart_parser_free(p);

        for (size_t step = 0; step <= 7; step++) {
                rec *s = rec_new();
                k = parse_body(UNDICI_CT, body, len, step, s, NULL, 0);
                ok(k == 0 && recs_equal(r, s), "undici capture in slices of %zu bytes", step);
                rec_free(s);
        }
        rec_free(r);
}

static void test_multiple_files(void) {
        const char *ct = "multipart/form-data; boundary=XyZ";
        const char body[] =
                "preamble to ignore\r\n"
                "--XyZ\r\n"
                "content-disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\n"
                "content-type: text/plain\r\n"
                "\r\n"
                "hello\r\nworld\r\n"
                "--XyZ  \t\r\n" /* transport padding */
                "Content-Disposition: form-data; name=file; filename=b.bin\r\n"
                "\r\n"
                "\r\n\r\n--XyZ\r\n" /* data is one CRLF, then the delimiter's */
                "CONTENT-DISPOSITION: FORM-DATA; NAME=\"empty\"; FILENAME=\"\"\r\n"
                "\r\n"
                "\r\n--XyZ\r\n"
                "Content-Disposition: form-data; name=\"file\"\r\n"
                "\r\n"
                "text\r\n"
                "--XyZ--\r\n"
                "epilogue --XyZ\r\n garbage";
        size_t len = sizeof body - 1;
        rec *whole = rec_new();
        int k = parse_body(ct, body, len, 0, whole, NULL, 0);
        ok(k == 0 && whole->n == 4, "four parts (%d, %zu)", k, whole->n);
        ok(part_is(whole, 0, "file", "/home/user/a.txt", "text/plain", "hello\r\nworld", 12),
           "part 1: data keeps inner CRLF, loses the delimiter's");
        ok(part_is(whole, 1, "file", "b.bin", NULL, "\r\n", 2),
           "part 2: unquoted filename, data is CRLF");
        ok(part_is(whole, 2, "empty", "", NULL, "", 0), "part 3: empty filename and empty data");
        ok(part_is(whole, 3, "file", NULL, NULL, "text", 4),
           "part 4: no filename and no Content-Type (form.append('file','text'))");
        for (size_t step = 1; step <= 5; step++) {
                rec *s = rec_new();
                k = parse_body(ct, body, len, step, s, NULL, 0);
                ok(k == 0 && recs_equal(whole, s), "multiple files in slices of %zu bytes", step);
                rec_free(s);
        }
        rec_free(whole);
}

/* Binary data full of CRs, dashes and prefixes of the delimiter. */
static void test_binary_prefixes(void) {
        const char *bnd = "----formdata-undici-032350027135";
        char ct[128];
        snprintf(ct, sizeof ct, "multipart/form-data; boundary=%s", bnd);

        size_t cap = 1 << 20, n = 0;
        uint8_t *data = malloc(cap);
        uint32_t seed = 12345;
        char delim[80];
        int dl = snprintf(delim, sizeof delim, "\r\n--%s", bnd);
        while (n + 128 < cap) {
                seed = seed * 1103515245 + 12345;
                unsigned pick = (seed >> 16) % 8;
                if (pick == 0) { /* a proper prefix of the delimiter */
                        size_t l = 1 + (seed >> 8) % (size_t) (dl - 1);
                        memcpy(data + n, delim, l);
                        n += l;
                } else if (pick == 1) { /* the whole delimiter, then no padding, CRLF or "--" */
                        memcpy(data + n, delim, (size_t) dl);
                        n += (size_t) dl;
                        data[n++] = (seed & 0x100) ? 'X' : '-';
                        data[n++] = 'y';
                } else if (pick == 2) {
                        memcpy(data + n, "\r\r\n\r\n-\r\n--\r", 12);
                        n += 12;
                } else /* no '5': random bytes never complete a delimiter */
                        data[n++] = (uint8_t) (seed >> 8) == '5' ? '4' : (uint8_t) (seed >> 8);
        }
        size_t hdr_len, blen = 0;
        uint8_t *body = malloc(n + 512);
        hdr_len = (size_t) sprintf((char *) body,
                                   "--%s\r\nContent-Disposition: form-data; name=\"file\"; "
                                   "filename=\"bin\"\r\n\r\n",
                                   bnd);
        blen = hdr_len;
        memcpy(body + blen, data, n);
        blen += n;
        blen += (size_t) sprintf((char *) body + blen, "\r\n--%s--\r\n", bnd);

        rec *whole = rec_new();
        int k = parse_body(ct, body, blen, 0, whole, NULL, 0);
        ok(k == 0 && part_is(whole, 0, "file", "bin", NULL, data, n),
           "1 MiB of binary data with delimiter prefixes comes through intact (%d)", k);
        ok(whole->data_calls <= 2, "... in %zu part_data calls when fed whole", whole->data_calls);

        static const size_t steps[] = { 1, 2, 3, 7, 33, 34, 35, 36, 37, 4096, 65536 };
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
                rec *s = rec_new();
                k = parse_body(ct, body, blen, steps[i], s, NULL, 0);
                size_t slices = (blen + steps[i] - 1) / steps[i];
                ok(k == 0 && recs_equal(whole, s) && s->data_calls <= 2 * slices + 1,
                   "binary body in slices of %zu: same data, %zu calls for %zu slices", steps[i],
                   s->data_calls, slices);
                rec_free(s);
        }
        rec_free(whole);
        free(body);
        free(data);
}

static void test_names(void) {
        const char *ct = "multipart/form-data; boundary=b";
        static const struct {
                const char *disposition;
                const char *name, *filename;
        } cases[] = {
                { "form-data; name=\"a\\\"b\"; filename=\"q\\\\\\\"x\"", "a\"b", "q\\\"x" },
                { "form-data; name=\"f\"; filename=\"C:\\dir\\a.txt\"", "f", "C:\\dir\\a.txt" },
                { "form-data; filename=\"%22quoted%22.txt\"", "", "%22quoted%22.txt" },
                { "form-data; name=\"f\"; filename=\"na\xc3\xafve.txt\"", "f", "na\xc3\xafve.txt" },
                { "form-data; name=\"f\"; filename=\"x.txt\"; filename*=UTF-8''na%C3%AFve%20%E2%82%AC.txt",
                  "f", "na\xc3\xafve \xe2\x82\xac.txt" },
                { "form-data; name=\"f\"; filename*=utf-8'en'a.txt", "f", "a.txt" },
                { "form-data; name=\"f\"; filename*0=\"a\"; filename*1=\"b\"", "f", NULL },
                { "Form-Data ;Name = \"sp\" ; size=3 ;", "sp", NULL },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                char body[512];
                int bl = snprintf(body, sizeof body,
                                  "--b\r\nContent-Disposition: %s\r\n\r\nD\r\n--b--",
                                  cases[i].disposition);
                for (size_t step = 0; step <= 1; step++) {
                        rec *r = rec_new();
                        int k = parse_body(ct, body, (size_t) bl, step, r, NULL, 0);
                        ok(k == 0 && part_is(r, 0, cases[i].name, cases[i].filename, NULL, "D", 1),
                           "disposition %s -> name [%s] filename [%s] (step %zu, %d)",
                           cases[i].disposition, cases[i].name,
                           cases[i].filename ? cases[i].filename : "(null)", step, k);
                        rec_free(r);
                }
        }

        /* Folded header (obs-fold) and headers we do not know. */
        const char folded[] =
                "--b\r\nX-Other: 1\r\nContent-Disposition: form-data;\r\n name=\"folded\";\r\n\t"
                "filename=\"f\"\r\nContent-Type:  text/plain ; charset=utf-8  \r\n\r\n\r\n--b--";
        rec *r = rec_new();
        int k = parse_body(ct, folded, sizeof folded - 1, 1, r, NULL, 0);
        ok(k == 0 && part_is(r, 0, "folded", "f", "text/plain ; charset=utf-8", "", 0),
           "folded Content-Disposition is unfolded, Content-Type trimmed (%d)", k);
        rec_free(r);

        /* Bare LF line ends are tolerated. */
        const char lf[] = "--b\nContent-Disposition: form-data; name=\"lf\"\n\nDATA\r\n--b--\n";
        r = rec_new();
        k = parse_body(ct, lf, sizeof lf - 1, 0, r, NULL, 0);
        ok(k == 0 && part_is(r, 0, "lf", NULL, NULL, "DATA", 4), "bare LF line ends (%d)", k);
        rec_free(r);

        /* A delimiter right after the headers, without its CRLF: an empty
         * part (Go accepts it). Anything else there is data, phantom CRLF
         * not included. */
        static const struct {
                const char *data;
                const char *want;
        } starts[] = {
                { "--b--", "" },         { "--bX\r\n--b--", "--bX" }, { "-x\r\n--b--", "-x" },
                { "--\r\n--b--", "--" }, { "--b-\r\n--b--", "--b-" },
        };
        for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
                for (size_t step = 0; step <= 1; step++) {
                        char body[256];
                        int bl = snprintf(body, sizeof body,
                                          "--b\r\nContent-Disposition: form-data; name=e\r\n\r\n%s",
                                          starts[i].data);
                        r = rec_new();
                        k = parse_body(ct, body, (size_t) bl, step, r, NULL, 0);
                        ok(k == 0 && r->n == 1 &&
                                   part_is(r, 0, "e", NULL, NULL, starts[i].want,
                                           strlen(starts[i].want)),
                           "data after the headers, case %zu: [%s] (step %zu, %d)", i,
                           starts[i].want, step, k);
                        rec_free(r);
                }

        /* A 70-character boundary, and data that extends its delimiter. */
        char b70[71], ct70[128], body70[512];
        memset(b70, 'z', 70);
        b70[70] = '\0';
        snprintf(ct70, sizeof ct70, "multipart/form-data; boundary=%s", b70);
        char want70[256];
        int wl = snprintf(want70, sizeof want70, "\r\n--%s-y\r\n--%sX\r\n--%s", b70, b70, b70);
        wl -= 2; /* the last delimiter lost its last 2 chars below */
        int bl = snprintf(body70, sizeof body70,
                          "--%s\r\nContent-Disposition: form-data; name=z\r\n\r\n%.*s\r\n--%s--",
                          b70, wl, want70, b70);
        for (size_t step = 0; step <= 75; step += 1) {
                r = rec_new();
                k = parse_body(ct70, body70, (size_t) bl, step, r, NULL, 0);
                if (!(k == 0 && part_is(r, 0, "z", NULL, NULL, want70, (size_t) wl)) || step == 75)
                        ok(k == 0 && part_is(r, 0, "z", NULL, NULL, want70, (size_t) wl),
                           "70-character boundary, data extending its delimiter (steps up to %zu, %d)",
                           step, k);
                rec_free(r);
                if (k != 0)
                        break;
        }

        /* Zero parts: the close delimiter right away. */
        r = rec_new();
        k = parse_body(ct, "--b--\r\n", 7, 1, r, NULL, 0);
        ok(k == 0 && r->n == 0, "a body of only the close delimiter has no parts");
        rec_free(r);
}

static void test_malformed(void) {
        const char *ct = "multipart/form-data; boundary=b";
        static const struct {
                const char *what, *body;
        } cases[] = {
                { "no closing boundary",
                  "--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\ndata" },
                { "no closing boundary after a delimiter",
                  "--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--b\r\n" },
                { "headers cut short", "--b\r\nContent-Disposition: form-data; name=a\r\n" },
                { "empty body", "" },
                { "no delimiter at all", "just some text\r\n" },
                { "attachment disposition",
                  "--b\r\nContent-Disposition: attachment; filename=a\r\n\r\nx\r\n--b--" },
                { "inline disposition", "--b\r\nContent-Disposition: inline\r\n\r\nx\r\n--b--" },
                { "no disposition", "--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--" },
                { "no headers", "--b\r\n\r\nx\r\n--b--" },
                { "two dispositions",
                  "--b\r\nContent-Disposition: form-data; name=a\r\nContent-Disposition: form-data; name=b\r\n\r\nx\r\n--b--" },
                { "two Content-Types",
                  "--b\r\nContent-Disposition: form-data; name=a\r\nContent-Type: a/b\r\ncontent-type: c/d\r\n\r\nx\r\n--b--" },
                { "two names",
                  "--b\r\nContent-Disposition: form-data; name=a; name=b\r\n\r\nx\r\n--b--" },
                { "unterminated quote",
                  "--b\r\nContent-Disposition: form-data; name=\"a\r\n\r\nx\r\n--b--" },
                { "parameter without value",
                  "--b\r\nContent-Disposition: form-data; name\r\n\r\nx\r\n--b--" },
                { "garbage between parameters",
                  "--b\r\nContent-Disposition: form-data; name=\"a\" x\r\n\r\nx\r\n--b--" },
                { "header without colon", "--b\r\nContent-Disposition form-data\r\n\r\nx\r\n--b--" },
                { "space before colon",
                  "--b\r\nContent-Disposition : form-data; name=a\r\n\r\nx\r\n--b--" },
                { "continuation first",
                  "--b\r\n name=a\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--" },
                { "lone CR in a header",
                  "--b\r\nContent-Disposition: form-data; name=\"a\rb\"\r\n\r\nx\r\n--b--" },
                { "control char in a header",
                  "--b\r\nContent-Disposition: form-data; name=\"a\x01\"\r\n\r\nx\r\n--b--" },
                { "garbage after a delimiter",
                  "--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--b \tx\r\n" },
                { "CR without LF after a delimiter", "--b\rX" },
                { "filename* with another charset",
                  "--b\r\nContent-Disposition: form-data; name=a; filename*=iso-8859-1''%E9\r\n\r\nx\r\n--b--" },
                { "filename* without charset and language",
                  "--b\r\nContent-Disposition: form-data; name=a; filename*=a.txt\r\n\r\nx\r\n--b--" },
                { "filename* with bad percent",
                  "--b\r\nContent-Disposition: form-data; name=a; filename*=UTF-8''%G0\r\n\r\nx\r\n--b--" },
                { "filename* with %00",
                  "--b\r\nContent-Disposition: form-data; name=a; filename*=UTF-8''a%00b\r\n\r\nx\r\n--b--" },
                { "filename* with %0A",
                  "--b\r\nContent-Disposition: form-data; name=a; filename*=UTF-8''a%0Ab\r\n\r\nx\r\n--b--" },
                { "filename* with %0D",
                  "--b\r\nContent-Disposition: form-data; name=a; filename*=UTF-8''a%0db\r\n\r\nx\r\n--b--" },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                for (size_t step = 0; step <= 1; step++) {
                        rec *r = rec_new();
                        char err[160] = "";
                        int k = parse_body(ct, cases[i].body, strlen(cases[i].body), step, r, err,
                                           sizeof err);
                        ok(k == -EBADMSG && err[0] && !r->bad_order, "malformed: %s (step %zu): %s",
                           cases[i].what, step, err);
                        rec_free(r);
                }

        /* NUL in a header: strlen() above cannot carry it. */
        const char nul[] = "--b\r\nContent-Disposition: form-data; name=\"a\0b\"\r\n\r\nx\r\n--b--";
        rec *r = rec_new();
        int k = parse_body(ct, nul, sizeof nul - 1, 0, r, NULL, 0);
        ok(k == -EBADMSG && r->n == 0, "NUL in a part header is rejected");
        rec_free(r);

        /* Header size limit: 8 KiB in all, reached exactly and passed by one. */
        for (int extra = 0; extra <= 1; extra++) {
                const char *pre = "--b\r\n",
                           *cd = "Content-Disposition: form-data; name=big\r\nX-Pad: ";
                size_t fixed = strlen(cd) + 2 /* CRLF after X-Pad */ + 1 /* the blank line's CR */;
                size_t pad = MULTIPART_HEADERS_MAX - fixed + (size_t) extra;
                char *body = malloc(pad + 256);
                if (!body)
                        abort();
                size_t bl = (size_t) sprintf(body, "%s%s", pre, cd);
                memset(body + bl, 'p', pad);
                bl += pad;
                bl += (size_t) sprintf(body + bl, "\r\n\r\nx\r\n--b--");
                for (size_t step = 0; step <= 1; step++) {
                        r = rec_new();
                        char err[160] = "";
                        k = parse_body(ct, body, bl, step, r, err, sizeof err);
                        if (extra)
                                ok(k == -EBADMSG && r->n == 0,
                                   "headers one byte over 8 KiB rejected (step %zu): %s", step, err);
                        else
                                ok(k == 0 && part_is(r, 0, "big", NULL, NULL, "x", 1),
                                   "headers of exactly 8 KiB accepted (step %zu, %d %s)", step, k,
                                   err);
                        rec_free(r);
                }
                free(body);
        }

        /* Header count limit. */
        for (int n_hdr = MULTIPART_HEADER_LINES_MAX; n_hdr <= MULTIPART_HEADER_LINES_MAX + 1;
             n_hdr++) {
                char body[4096];
                size_t bl = (size_t) sprintf(body,
                                             "--b\r\nContent-Disposition: form-data; name=n\r\n");
                for (int i = 1; i < n_hdr; i++)
                        bl += (size_t) sprintf(body + bl, "X-H%d: v\r\n", i);
                bl += (size_t) sprintf(body + bl, "\r\nx\r\n--b--");
                r = rec_new();
                k = parse_body(ct, body, bl, 0, r, NULL, 0);
                ok(n_hdr <= MULTIPART_HEADER_LINES_MAX ? k == 0 : k == -EBADMSG,
                   "%d header lines: %d", n_hdr, k);
                rec_free(r);
        }

        /* Part count limit. */
        for (int n_parts = MULTIPART_PARTS_MAX; n_parts <= MULTIPART_PARTS_MAX + 1; n_parts++) {
                const char *one = "--b\r\nContent-Disposition: form-data; name=p\r\n\r\nx\r\n";
                size_t ol = strlen(one);
                char *body = malloc(ol * (size_t) n_parts + 16);
                size_t bl = 0;
                for (int i = 0; i < n_parts; i++) {
                        memcpy(body + bl, one, ol);
                        bl += ol;
                }
                bl += (size_t) sprintf(body + bl, "--b--\r\n");
                r = rec_new();
                k = parse_body(ct, body, bl, 0, r, NULL, 0);
                ok(n_parts <= MULTIPART_PARTS_MAX ? k == 0 && r->n == (size_t) n_parts
                                                  : k == -EBADMSG && r->n == MULTIPART_PARTS_MAX,
                   "%d parts: %d", n_parts, k);
                rec_free(r);
                free(body);
        }

        /* A callback's error stops the parser, and sticks. */
        const char two[] = "--b\r\nContent-Disposition: form-data; name=stop\r\n\r\nx\r\n--b--";
        r = rec_new();
        r->fail_begin = -ECANCELED;
        multipart_parser *p = NULL;
        k = multipart_parser_new(ct, &rec_cb, r, &p, NULL, 0);
        if (k >= 0)
                k = multipart_parser_feed(p, two, sizeof two - 1);
        ok(k == -ECANCELED && r->n == 1 && r->parts[0].len == 0,
           "part_begin's error comes out of feed");
        ok(multipart_parser_feed(p, "x", 1) == -ECANCELED && multipart_parser_finish(p) == -ECANCELED,
           "... and sticks (%s)", multipart_parser_error(p));
        multipart_parser_free(p);
        rec_free(r);

        multipart_parser_free(NULL);
}

/* Memory stays bounded: 64 MiB in 64 KiB slices, no buffering. */
static size_t big_seen;
static int count_data(void *ud, const void *data, size_t len) {
        big_seen += len;
        return 0;
}

static void test_large_stream(void) {
        const char *ct = "multipart/form-data; boundary=----formdata-undici-000000000001";
        multipart_parser *p = NULL;
        multipart_callbacks cb = { .part_data = count_data };
        int k = multipart_parser_new(ct, &cb, NULL, &p, NULL, 0);
        const char *head = "------formdata-undici-000000000001\r\n"
                           "Content-Disposition: form-data; name=\"file\"; filename=\"big\"\r\n\r\n";
        static uint8_t slice[65536];
        for (size_t i = 0; i < sizeof slice; i++)
                slice[i] = (uint8_t) (i * 7 + (i >> 8));
        if (k >= 0)
                k = multipart_parser_feed(p, head, strlen(head));
        for (int i = 0; i < 1024 && k >= 0; i++)
                k = multipart_parser_feed(p, slice, sizeof slice);
        const char *tail = "\r\n------formdata-undici-000000000001--\r\n";
        if (k >= 0)
                k = multipart_parser_feed(p, tail, strlen(tail));
        if (k >= 0)
                k = multipart_parser_finish(p);
        ok(k == 0 && big_seen == 1024 * sizeof slice, "64 MiB part streamed (%zu bytes)", big_seen);
        multipart_parser_free(p);
}

/* ---- gzip ------------------------------------------------------------ */

typedef struct buf {
        uint8_t *p;
        size_t len, cap;
        size_t calls;
        int fail_after; /* > 0: the nth call fails with -ENOSPC */
} buf;

static int buf_put(void *ud, const void *data, size_t len) {
        buf *b = ud;
        if (len == 0)
                return -EIO;
        b->calls++;
        if (b->fail_after > 0 && (int) b->calls >= b->fail_after)
                return -ENOSPC;
        if (b->len + len > b->cap) {
                size_t cap = (b->len + len) * 2;
                uint8_t *n = realloc(b->p, cap);
                if (!n)
                        abort();
                b->p = n;
                b->cap = cap;
        }
        memcpy(b->p + b->len, data, len);
        b->len += len;
        return 0;
}

static int gz(const void *in, size_t len, int level, buf *out) {
        gzip_stream *g = NULL;
        int r = gzip_deflate_new(level, &g);
        if (r >= 0)
                r = gzip_stream_feed(g, in, len, true, buf_put, out);
        gzip_stream_free(g);
        return r;
}

static int gunzip(const void *in, size_t len, size_t step, uint64_t max, buf *out) {
        gzip_stream *g = NULL;
        int r = gzip_inflate_new(max, &g);
        const uint8_t *b = in;
        for (size_t at = 0; r >= 0 && at < len;) {
                size_t n = step && step < len - at ? step : len - at;
                r = gzip_stream_feed(g, b + at, n, false, buf_put, out);
                at += n;
        }
        if (r >= 0)
                r = gzip_stream_feed(g, NULL, 0, true, buf_put, out);
        gzip_stream_free(g);
        return r;
}

static bool buf_is(const buf *b, const void *p, size_t len) {
        return b->len == len && (len == 0 || memcmp(b->p, p, len) == 0);
}

static void test_gzip(void) {
        size_t n = 1 << 20;
        uint8_t *data = malloc(n);
        uint32_t seed = 1;
        for (size_t i = 0; i < n; i++) {
                seed = seed * 1103515245 + 12345;
                /* half text-like, half noise */
                data[i] = i < n / 2 ? (uint8_t) ("hutch sandbox "[i % 14]) : (uint8_t) (seed >> 16);
        }

        static const int levels[] = { -1, 0, 1, 9 };
        for (size_t l = 0; l < 4; l++) {
                buf z = { 0 }, back = { 0 };
                int r = gz(data, n, levels[l], &z);
                ok(r == 0 && z.len > 18 && z.p[0] == 0x1f && z.p[1] == 0x8b,
                   "deflate level %d: %zu bytes", levels[l], z.len);
                r = gunzip(z.p, z.len, 0, n, &back);
                ok(r == 0 && buf_is(&back, data, n), "inflate level %d whole: round trip (%d)",
                   levels[l], r);
                free(back.p);
                back = (buf) { 0 };
                r = gunzip(z.p, z.len, 1, n, &back);
                ok(r == 0 && buf_is(&back, data, n),
                   "inflate level %d byte by byte: round trip (%d)", levels[l], r);
                free(back.p);
                back = (buf) { 0 };
                r = gunzip(z.p, z.len, 0, n - 1, &back);
                ok(r == -EFBIG && back.len <= n - 1,
                   "limit one byte short of the output: -EFBIG (%d)", r);
                free(back.p);
                free(z.p);
        }

        /* Empty input: a valid 20-byte stream, which decodes to nothing. */
        buf z = { 0 }, back = { 0 };
        int r = gz("", 0, -1, &z);
        ok(r == 0 && z.len == 20, "empty input deflates to 20 bytes (%zu)", z.len);
        r = gunzip(z.p, z.len, 1, 0, &back);
        ok(r == 0 && back.len == 0 && back.calls == 0,
           "... and inflates to nothing with max_output 0");

        /* Truncation at every length. */
        buf hz = { 0 };
        gz("hello, world", 12, 9, &hz);
        bool all = true;
        for (size_t cut = 0; cut < hz.len; cut++) {
                buf o = { 0 };
                if (gunzip(hz.p, cut, 0, 1024, &o) != -EBADMSG)
                        all = false;
                free(o.p);
        }
        ok(all, "every truncation of a gzip stream is -EBADMSG");

        /* Concatenated members, and garbage after them. */
        size_t cl = hz.len * 2 + z.len;
        uint8_t *cat = malloc(cl + 8);
        memcpy(cat, hz.p, hz.len);
        memcpy(cat + hz.len, z.p, z.len);
        memcpy(cat + hz.len + z.len, hz.p, hz.len);
        for (size_t step = 0; step <= 1; step++) {
                buf o = { 0 };
                r = gunzip(cat, cl, step, 1024, &o);
                ok(r == 0 && buf_is(&o, "hello, worldhello, world", 24),
                   "three concatenated members (step %zu)", step);
                free(o.p);
        }
        static const struct {
                const char *what;
                const char *bytes;
                size_t len;
        } tails[] = {
                { "one zero byte", "\0", 1 },      { "four zero bytes", "\0\0\0\0", 4 },
                { "text", "garbage", 7 },          { "a lone gzip magic byte", "\x1f", 1 },
                { "a gzip magic", "\x1f\x8b", 2 },
        };
        for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
                memcpy(cat + cl, tails[i].bytes, tails[i].len);
                buf o = { 0 };
                r = gunzip(cat, cl + tails[i].len, 0, 1024, &o);
                ok(r == -EBADMSG, "trailing %s after the last member: -EBADMSG (%d)", tails[i].what,
                   r);
                free(o.p);
        }
        free(cat);

        /* Corruption. */
        uint8_t *bad = malloc(hz.len);
        memcpy(bad, hz.p, hz.len);
        bad[hz.len - 5] ^= 1; /* CRC32 */
        buf o = { 0 };
        ok(gunzip(bad, hz.len, 0, 1024, &o) == -EBADMSG, "bad CRC: -EBADMSG");
        free(o.p);
        o = (buf) { 0 };
        memcpy(bad, hz.p, hz.len);
        bad[hz.len - 1] ^= 1; /* ISIZE */
        ok(gunzip(bad, hz.len, 0, 1024, &o) == -EBADMSG, "bad ISIZE: -EBADMSG");
        free(o.p);
        o = (buf) { 0 };
        free(bad);
        ok(gunzip("", 0, 0, 1024, &o) == -EBADMSG, "empty body: -EBADMSG");

        /* zlib format (Content-Encoding: deflate) is not gzip. */
        uint8_t zl[64];
        uLongf zll = sizeof zl;
        compress2(zl, &zll, (const Bytef *) "hello", 5, 9);
        ok(gunzip(zl, zll, 0, 1024, &o) == -EBADMSG, "a zlib stream is not gzip: -EBADMSG");
        free(o.p);

        /* A bomb: 1 GiB of zeros is about 1 MiB of gzip; a 4 MiB limit stops
         * it after at most 4 MiB of output, fed in 64 KiB slices. */
        gzip_stream *d = NULL, *e = NULL;
        gzip_deflate_new(9, &e);
        static uint8_t zeros[1 << 20];
        buf bomb = { 0 };
        for (int i = 0; i < 1024; i++)
                gzip_stream_feed(e, zeros, sizeof zeros, i == 1023, buf_put, &bomb);
        gzip_stream_free(e);
        ok(bomb.len < (2 << 20), "1 GiB of zeros deflates to %zu bytes", bomb.len);
        buf sink = { 0 };
        gzip_inflate_new(4 << 20, &d);
        r = 0;
        size_t fed = 0;
        for (; r >= 0 && fed < bomb.len; fed += 65536)
                r = gzip_stream_feed(d, bomb.p + fed, MIN_SZ(65536, bomb.len - fed), false, buf_put,
                                     &sink);
        ok(r == -EFBIG && sink.len <= (4 << 20) && gzip_stream_total_out(d) <= (4 << 20),
           "bomb stopped with -EFBIG after %zu output bytes, %zu input bytes", sink.len, fed);
        ok(gzip_stream_feed(d, "x", 1, true, buf_put, &sink) == -EFBIG, "... and the error sticks");
        gzip_stream_free(d);
        free(sink.p);
        free(bomb.p);

        /* The output callback's error stops the stream. */
        buf failing = { .fail_after = 2 };
        free(z.p);
        z = (buf) { 0 };
        gz(data, n, 0, &z);
        r = gunzip(z.p, z.len, 0, n, &failing);
        ok(r == -ENOSPC && failing.calls == 2,
           "inflate: the output callback's error comes back (%d)", r);
        free(failing.p);
        failing = (buf) { .fail_after = 1 };
        ok(gz(data, n, 0, &failing) == -ENOSPC, "deflate: the output callback's error comes back");
        free(failing.p);

        /* Flush: what was flushed decodes without the trailer. */
        gzip_deflate_new(6, &e);
        buf part = { 0 };
        gzip_stream_feed(e, "line one\n", 9, false, buf_put, &part);
        r = gzip_stream_flush(e, buf_put, &part);
        gzip_inflate_new(1024, &d);
        buf head = { 0 };
        int r2 = gzip_stream_feed(d, part.p, part.len, false, buf_put, &head);
        ok(r == 0 && r2 == 0 && buf_is(&head, "line one\n", 9),
           "a flushed prefix decodes to what was fed");
        ok(gzip_stream_feed(e, NULL, 0, true, buf_put, &part) == 0 &&
                   gzip_stream_feed(e, "x", 1, false, buf_put, &part) == -EINVAL,
           "feeding after finish is -EINVAL");
        gzip_stream_free(e);
        gzip_stream_free(d);
        free(head.p);
        free(part.p);

        ok(gzip_deflate_new(10, &e) == -EINVAL && gzip_deflate_new(-2, &e) == -EINVAL,
           "bad levels rejected");
        gzip_stream_free(NULL);

        free(z.p);
        free(hz.p);
        free(back.p);
        free(data);
}

int main(void) {
        test_content_types();
        test_undici_capture();
        test_multiple_files();
        test_binary_prefixes();
        test_names();
        test_malformed();
        test_large_stream();
        test_gzip();
        return tap_done();
}
