/* SPDX-License-Identifier: Apache-2.0 */
/* Streaming gzip decoder and encoder over zlib: see gzipstream.h. */
#include <errno.h>
#include <stdlib.h>

#define ZLIB_CONST
#include <zlib.h>

#include "daemon/gzipstream.h"
#include "util/macro.h"

/* zlib's windowBits: 15 (32 KiB, the most) + 16 = gzip wrapper only, so a
 * zlib or raw deflate stream is corrupt data, as it is to Go's gzip.Reader. */
#define GZIP_WINDOW_BITS (15 + 16)

/* zlib counts in uInt: larger slices are fed in pieces. */
#define GZIP_MAX_SLICE ((size_t) 1 << 30)

struct gzip_stream {
        z_stream z;
        bool inflate;
        bool finished;
        bool member_done; /* inflate: a member ended; more input begins another */
        int error;        /* sticky */
        uint64_t max_output, total_in, total_out;
        uint8_t buf[64 * 1024];
};

static int gz_deliver(gzip_stream *g, size_t n, gzip_output_fn out, void *ud) {
        if (n == 0)
                return 0;
        if (g->inflate && n > g->max_output - g->total_out)
                return -EFBIG;
        g->total_out += n;
        int r = out ? out(ud, g->buf, n) : 0;
        return r < 0 ? r : 0;
}

static int gz_inflate(gzip_stream *g, bool finish, gzip_output_fn out, void *ud) {
        for (;;) {
                if (g->member_done) {
                        if (g->z.avail_in == 0)
                                break;
                        /* Another member (RFC 1952 §2.2) or trailing garbage,
                         * which fails the next header check. */
                        if (inflateReset(&g->z) != Z_OK)
                                return -EINVAL;
                        g->member_done = false;
                }
                uInt in_before = g->z.avail_in;
                g->z.next_out = g->buf;
                g->z.avail_out = sizeof g->buf;
                int zr = inflate(&g->z, Z_NO_FLUSH);
                size_t n = sizeof g->buf - g->z.avail_out;
                if (zr == Z_NEED_DICT || zr == Z_DATA_ERROR)
                        return -EBADMSG;
                if (zr == Z_MEM_ERROR)
                        return -ENOMEM;
                if (zr == Z_STREAM_ERROR)
                        return -EINVAL;
                int r = gz_deliver(g, n, out, ud);
                if (r < 0)
                        return r;
                if (zr == Z_STREAM_END) {
                        g->member_done = true;
                        continue;
                }
                if (n == 0 && g->z.avail_in == in_before)
                        break; /* Z_BUF_ERROR: needs more input */
        }
        if (finish && !g->member_done)
                return -EBADMSG; /* truncated, or no member at all */
        return 0;
}

static int gz_deflate(gzip_stream *g, int flush, gzip_output_fn out, void *ud) {
        for (;;) {
                g->z.next_out = g->buf;
                g->z.avail_out = sizeof g->buf;
                int zr = deflate(&g->z, flush);
                if (zr == Z_STREAM_ERROR)
                        return -EINVAL;
                int r = gz_deliver(g, sizeof g->buf - g->z.avail_out, out, ud);
                if (r < 0)
                        return r;
                if (flush == Z_FINISH) {
                        if (zr == Z_STREAM_END)
                                return 0;
                } else if (g->z.avail_out != 0)
                        return 0; /* all input taken, and flushed as asked */
        }
}

static int gz_new(bool inflating, int level, uint64_t max_output, gzip_stream **ret) {
        if (!ret)
                return -EINVAL;
        gzip_stream *g = calloc(1, sizeof *g);
        if (!g)
                return -ENOMEM;
        g->inflate = inflating;
        g->max_output = max_output;
        int zr = inflating
                ? inflateInit2(&g->z, GZIP_WINDOW_BITS)
                : deflateInit2(&g->z, level, Z_DEFLATED, GZIP_WINDOW_BITS, 8, Z_DEFAULT_STRATEGY);
        if (zr != Z_OK) {
                free(g);
                return zr == Z_MEM_ERROR ? -ENOMEM : -EINVAL;
        }
        *ret = g;
        return 0;
}

int gzip_inflate_new(uint64_t max_output, gzip_stream **ret) {
        return gz_new(true, 0, max_output, ret);
}

int gzip_deflate_new(int level, gzip_stream **ret) {
        if (level < -1 || level > 9)
                return -EINVAL;
        return gz_new(false, level, 0, ret);
}

int gzip_stream_feed(gzip_stream *g, const void *in, size_t len, bool finish, gzip_output_fn out,
                     void *ud) {
        const uint8_t *p = in;
        int r = 0;

        if (!g || (!in && len > 0))
                return -EINVAL;
        if (g->error)
                return g->error;
        if (g->finished)
                return -EINVAL;
        do {
                size_t n = MIN(len, GZIP_MAX_SLICE);
                bool last = n == len;
                g->z.next_in = p;
                g->z.avail_in = (uInt) n;
                g->total_in += n;
                if (g->inflate)
                        r = gz_inflate(g, finish && last, out, ud);
                else
                        r = gz_deflate(g, finish && last ? Z_FINISH : Z_NO_FLUSH, out, ud);
                if (n > 0) /* p may be NULL when len is 0 */
                        p += n;
                len -= n;
        } while (r >= 0 && len > 0);
        g->z.next_in = NULL; /* the caller's buffer is not ours to keep */
        g->z.avail_in = 0;
        if (r < 0) {
                g->error = r;
                return r;
        }
        if (finish)
                g->finished = true;
        return 0;
}

int gzip_stream_flush(gzip_stream *g, gzip_output_fn out, void *ud) {
        if (!g)
                return -EINVAL;
        if (g->error)
                return g->error;
        if (g->inflate || g->finished)
                return 0;
        int r = gz_deflate(g, Z_SYNC_FLUSH, out, ud);
        if (r < 0)
                g->error = r;
        return r;
}

uint64_t gzip_stream_total_in(const gzip_stream *g) {
        return g ? g->total_in : 0;
}

uint64_t gzip_stream_total_out(const gzip_stream *g) {
        return g ? g->total_out : 0;
}

void gzip_stream_free(gzip_stream *g) {
        if (!g)
                return;
        if (g->inflate)
                inflateEnd(&g->z);
        else
                deflateEnd(&g->z);
        free(g);
}
