/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gzip decoder (Content-Encoding: gzip request bodies), with a small
 * output limit so that bombs are cheap. Byte 0 says where to cut the rest;
 * the rest is decoded whole, in two slices, and one byte at a time: success
 * and the output must not depend on the slicing. What decodes is encoded
 * again and must decode back to itself, and so must the raw input.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/gzipstream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_OUTPUT (64 * 1024)

typedef struct sink {
        uint8_t *buf;
        size_t len, cap;
} sink;

static int sink_put(void *ud, const void *p, size_t n) {
        sink *s = ud;
        if (n == 0)
                abort();
        if (s->len + n > s->cap) {
                size_t cap = (s->len + n) * 2 + 64;
                uint8_t *b = realloc(s->buf, cap);
                if (!b)
                        abort();
                s->buf = b;
                s->cap = cap;
        }
        memcpy(s->buf + s->len, p, n);
        s->len += n;
        return 0;
}

static bool same(const sink *a, const sink *b) {
        return a->len == b->len && (a->len == 0 || memcmp(a->buf, b->buf, a->len) == 0);
}

/* Decode in[0..len) cut at cut, or in steps of step bytes. */
static int inflate_all(const uint8_t *in, size_t len, size_t cut, size_t step, sink *s) {
        gzip_stream *g = NULL;
        int r = gzip_inflate_new(MAX_OUTPUT, &g);
        if (r < 0)
                abort();
        size_t at = 0;
        while (r >= 0 && at < len) {
                size_t n = step ? step : (at < cut ? cut - at : len - at);
                if (n > len - at)
                        n = len - at;
                r = gzip_stream_feed(g, in + at, n, false, sink_put, s);
                at += n;
        }
        if (r >= 0)
                r = gzip_stream_feed(g, NULL, 0, true, sink_put, s);
        if (gzip_stream_total_out(g) > MAX_OUTPUT || gzip_stream_total_out(g) != s->len)
                abort();
        if (r < 0 && r != -EBADMSG && r != -EFBIG)
                abort();
        gzip_stream_free(g);
        return r;
}

static void deflate_all(const uint8_t *in, size_t len, int level, size_t cut, sink *s) {
        gzip_stream *g = NULL;
        if (gzip_deflate_new(level, &g) < 0)
                abort();
        if (gzip_stream_feed(g, in, cut, false, sink_put, s) < 0 ||
            gzip_stream_flush(g, sink_put, s) < 0 ||
            gzip_stream_feed(g, in ? in + cut : NULL, len - cut, true, sink_put, s) < 0)
                abort();
        gzip_stream_free(g);
}

static void roundtrip(const uint8_t *in, size_t len, int level, size_t cut) {
        sink z = { 0 }, back = { 0 };
        deflate_all(in, len, level, cut, &z);
        if (inflate_all(z.buf, z.len, z.len / 2, 0, &back) != 0 || back.len != len ||
            (len > 0 && memcmp(back.buf, in, len) != 0))
                abort();
        free(z.buf);
        free(back.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 256 * 1024)
                return 0;
        const uint8_t *in = data + 1;
        size_t len = size - 1, cut = (size_t) data[0] * (len + 1) / 256;
        int level = data[0] % 11 - 1;

        sink whole = { 0 }, sliced = { 0 }, bytes = { 0 };
        int r1 = inflate_all(in, len, len, 0, &whole);
        int r2 = inflate_all(in, len, cut, 0, &sliced);
        if ((r1 == 0) != (r2 == 0))
                abort();
        if (r1 == 0 && !same(&whole, &sliced))
                abort();
        if (len <= 4096) {
                int r3 = inflate_all(in, len, 0, 1, &bytes);
                if ((r1 == 0) != (r3 == 0))
                        abort();
                if (r1 == 0 && !same(&whole, &bytes))
                        abort();
        }
        if (r1 == 0)
                roundtrip(whole.buf, whole.len, level, whole.len / 3);
        if (len <= MAX_OUTPUT)
                roundtrip(in, len, level, cut);
        free(whole.buf);
        free(sliced.buf);
        free(bytes.buf);
        return 0;
}
