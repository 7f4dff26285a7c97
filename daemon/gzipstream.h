/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Streaming gzip (RFC 1952) over zlib: the decoder reads request bodies sent
 * with `Content-Encoding: gzip` (the SDK's `gzip: true` uploads), the encoder
 * writes responses to clients that send `Accept-Encoding: gzip`. Memory is
 * fixed (zlib's state plus a 64 KiB output buffer) whatever the stream size.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gzip_stream gzip_stream;

/* Output sink: return < 0 to abort; gzip_stream_feed returns that value. */
typedef int (*gzip_output_fn)(void *ud, const void *data, size_t len);

/* Decoder. Concatenated gzip members are accepted (RFC 1952 §2.2, like
 * gzip -d and Go's gzip.Reader). feed returns -EFBIG as soon as the output
 * would exceed max_output (a decompression bomb; no byte past the limit is
 * handed on, and at most 64 KiB is inflated beyond it), -EBADMSG on corrupt data or trailing garbage after the
 * last member, and with finish=true -EBADMSG when the stream is truncated; an
 * empty body is not a gzip stream either. -ENOMEM. */
int gzip_inflate_new(uint64_t max_output, gzip_stream **ret);

/* Encoder: level -1 (zlib's default, 6) or 0-9, otherwise -EINVAL. */
int gzip_deflate_new(int level, gzip_stream **ret);

/* Feed input; output is delivered to out(ud, data, len), never with len 0.
 * finish=true ends the stream: the encoder writes the trailer, the decoder
 * checks that the last member is complete. After finish, or after an error
 * (which is sticky), feeding again returns -EINVAL or that error. */
int gzip_stream_feed(gzip_stream *g, const void *in, size_t len, bool finish, gzip_output_fn out,
                     void *ud);

/* Encoder only: push out everything fed so far (Z_SYNC_FLUSH), for streamed
 * responses whose reader must see each piece as it is produced. A no-op on
 * a decoder. */
int gzip_stream_flush(gzip_stream *g, gzip_output_fn out, void *ud);

/* Bytes fed in and handed out so far. */
uint64_t gzip_stream_total_in(const gzip_stream *g);
uint64_t gzip_stream_total_out(const gzip_stream *g);

void gzip_stream_free(gzip_stream *g);

static inline void gzip_stream_freep(gzip_stream **g) {
        gzip_stream_free(*g);
}
