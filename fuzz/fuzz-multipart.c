/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The multipart/form-data parser (POST /files bodies). An input is
 *
 *     4 bytes     where to cut the body into slices
 *     line        the Content-Type header value, up to '\n'
 *     rest        the body
 *
 * The body is parsed whole, in slices cut where the first bytes say, and one
 * byte at a time: the parts, their data and the result must not depend on
 * how the body was sliced. The callbacks check the order of events.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What a parse produced, as one byte string. */
typedef struct mp_log {
        uint8_t *buf;
        size_t len, cap;
        size_t data_at; /* where the length of the current data run is, 0 if none */
        bool in_part;
} mp_log;

static void log_put(mp_log *l, const void *p, size_t n) {
        if (l->len + n > l->cap) {
                size_t cap = (l->len + n) * 2 + 64;
                uint8_t *b = realloc(l->buf, cap);
                if (!b)
                        abort();
                l->buf = b;
                l->cap = cap;
        }
        memcpy(l->buf + l->len, p, n);
        l->len += n;
}

static void log_str(mp_log *l, char tag, const char *s) {
        log_put(l, &tag, 1);
        if (!s)
                return;
        if (strchr(s, '\r') || strchr(s, '\n'))
                abort(); /* names never carry CR or LF */
        log_put(l, s, strlen(s) + 1);
}

static int on_begin(void *ud, const multipart_part *p) {
        mp_log *l = ud;
        if (l->in_part || !p->name)
                abort();
        l->in_part = true;
        l->data_at = 0;
        log_str(l, 'B', p->name);
        log_str(l, p->filename ? 'F' : 'f', p->filename);
        log_str(l, p->content_type ? 'C' : 'c', p->content_type);
        /* A callback error must come back out of feed, whatever the slicing. */
        return strcmp(p->name, "stop") == 0 ? -ECANCELED : 0;
}

static int on_data(void *ud, const void *data, size_t len) {
        mp_log *l = ud;
        if (!l->in_part || len == 0)
                abort();
        if (l->data_at == 0) {
                uint64_t zero = 0;
                log_put(l, "D", 1);
                l->data_at = l->len;
                log_put(l, &zero, sizeof zero);
        }
        uint64_t n;
        memcpy(&n, l->buf + l->data_at, sizeof n);
        n += len;
        memcpy(l->buf + l->data_at, &n, sizeof n);
        log_put(l, data, len);
        return 0;
}

static int on_end(void *ud) {
        mp_log *l = ud;
        if (!l->in_part)
                abort();
        l->in_part = false;
        l->data_at = 0;
        log_put(l, "E", 1);
        return 0;
}

static const multipart_callbacks callbacks = {
        .part_begin = on_begin,
        .part_data = on_data,
        .part_end = on_end,
};

static bool same(const mp_log *a, const mp_log *b) {
        return a->len == b->len && (a->len == 0 || memcmp(a->buf, b->buf, a->len) == 0);
}

/* Parse body cut at cuts[0..n_cuts) (ascending); step 1 = one byte at a time. */
static int parse(const char *ct, const uint8_t *body, size_t len, const size_t *cuts, size_t n_cuts,
                 size_t step, mp_log *l) {
        multipart_parser *p = NULL;
        char err[128];
        int r = multipart_parser_new(ct, &callbacks, l, &p, err, sizeof err);
        if (r < 0) {
                if (r != -EINVAL || !err[0])
                        abort();
                log_put(l, &r, sizeof r);
                return r;
        }
        size_t at = 0;
        for (size_t k = 0; k <= n_cuts && r >= 0; k++) {
                size_t end = k < n_cuts ? cuts[k] : len;
                while (at < end && r >= 0) {
                        size_t n = step ? step : end - at;
                        if (n > end - at)
                                n = end - at;
                        r = multipart_parser_feed(p, body + at, n);
                        at += n;
                }
                if (r >= 0 && at == end)
                        r = multipart_parser_feed(p, body + at, 0); /* empty slices are fine */
        }
        if (r >= 0)
                r = multipart_parser_finish(p);
        if (r < 0) {
                if (r == -EBADMSG && !multipart_parser_error(p)[0])
                        abort(); /* every malformation says why */
                if (multipart_parser_feed(p, "x", 1) != r || multipart_parser_finish(p) != r)
                        abort(); /* errors are sticky */
        }
        log_put(l, &r, sizeof r);
        multipart_parser_free(p);
        return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 5 || size > 1024 * 1024)
                return 0;
        const uint8_t *nl = memchr(data + 4, '\n', size - 4 < 512 ? size - 4 : 512);
        if (!nl)
                return 0;
        size_t ct_len = (size_t) (nl - (data + 4));
        char *ct = malloc(ct_len + 1);
        if (!ct)
                abort();
        memcpy(ct, data + 4, ct_len);
        ct[ct_len] = '\0';
        const uint8_t *body = nl + 1;
        size_t len = size - (size_t) (body - data);

        size_t cuts[4];
        for (size_t k = 0; k < 4; k++)
                cuts[k] = (size_t) data[k] * (len + 1) / 256;
        for (size_t a = 0; a < 4; a++) /* ascending */
                for (size_t b = a + 1; b < 4; b++)
                        if (cuts[b] < cuts[a]) {
                                size_t t = cuts[a];
                                cuts[a] = cuts[b];
                                cuts[b] = t;
                        }

        mp_log whole = { 0 }, sliced = { 0 }, bytes = { 0 };
        int r1 = parse(ct, body, len, NULL, 0, 0, &whole);
        int r2 = parse(ct, body, len, cuts, 4, 0, &sliced);
        if (r1 != r2 || !same(&whole, &sliced))
                abort();
        if (len <= 64 * 1024) {
                int r3 = parse(ct, body, len, NULL, 0, 1, &bytes);
                if (r1 != r3 || !same(&whole, &bytes))
                        abort();
        }
        free(whole.buf);
        free(sliced.buf);
        free(bytes.buf);
        free(ct);
        return 0;
}
