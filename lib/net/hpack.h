/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HPACK (RFC 7541): the header compression of HTTP/2. Ingress reads the
 * header blocks an HTTP/2 client sends (daemon/ingress_h2.c) to route its
 * connection and to keep every later stream on the port it was authorised
 * for, so this decoder sees hostile bytes: pure, bounded, fuzzed
 * (fuzz/fuzz-hpack.c).
 *
 * Bounds: the dynamic table never holds more than the size the decoder was
 * made with (a size update above it is an error, as RFC 7541 §4.2 wants);
 * a decoded header list over list_max bytes (RFC 9113 §6.5.2's measure:
 * name + value + 32 a field) stops the block with -E2BIG, so a few bytes
 * that index a large entry over and over (an "HPACK bomb") cost nothing.
 * The encoder side is not here: hutch only writes literal fields, without
 * indexing (hpack_put_literal, hpack_put_field): its own answers, and the
 * blocks ingress re-encodes for maskRequestHost.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HPACK_TABLE_DEFAULT 4096 /* SETTINGS_HEADER_TABLE_SIZE's initial value */
#define HPACK_ENTRY_OVERHEAD 32  /* RFC 7541 §4.1 */

typedef struct hpack_entry hpack_entry;

typedef struct hpack_decoder {
        hpack_entry **ring; /* newest at ring[(head + n - 1) % cap] */
        size_t cap, head, n;
        size_t size;     /* sum of the entries' sizes */
        size_t max_size; /* the table's size now (size updates move it) */
        size_t limit;    /* the most a size update may ask for */
        bool broken;     /* an error leaves the table unusable: sticky */
        const char *why; /* the last error, for logs and tests */
} hpack_decoder;

/* limit: the largest table a size update may set (the SETTINGS value the
 * peer decoding with us was told). The table starts at
 * min(HPACK_TABLE_DEFAULT, limit). Returns 0 or -ENOMEM. */
int hpack_decoder_init(hpack_decoder *d, size_t limit);
void hpack_decoder_done(hpack_decoder *d);

/* Called once a field, in block order. name and value are valid only
 * during the call and are not NUL-terminated (a value may hold NUL: the
 * caller judges field syntax). A negative return stops the block and is
 * returned by hpack_decode. */
typedef int (*hpack_field_cb)(void *userdata, const char *name, size_t name_len, const char *value,
                              size_t value_len);

/* Decode one complete header block (a HEADERS frame's fragment and its
 * CONTINUATIONs, joined). Returns the field count, -EBADMSG for a
 * malformed block (bad index, bad integer, bad Huffman, a size update
 * after a field or above the limit, truncation), -E2BIG past list_max,
 * -ENOMEM, or the callback's error. Every error is sticky: the table may
 * be half-updated, so the connection it belongs to must end. */
int hpack_decode(hpack_decoder *d, const uint8_t *in, size_t len, size_t list_max,
                 hpack_field_cb cb, void *userdata);

/* Decode a Huffman-coded string (RFC 7541 §5.2, Appendix B) into out
 * (room for cap bytes). Returns the length, -EBADMSG (EOS, bad padding,
 * padding over 7 bits) or -E2BIG (out too small). */
ssize_t hpack_huffman_decode(const uint8_t *in, size_t len, char *out, size_t cap);

/* Encode integer v with an n-bit prefix whose high bits are flags, into
 * out (room for cap bytes). Returns the bytes written, or -E2BIG. */
ssize_t hpack_put_int(uint8_t *out, size_t cap, uint8_t flags, unsigned prefix_bits, uint64_t v);

/* A literal field without indexing and without Huffman (RFC 7541 §6.2.2),
 * for the daemon's own answers. Returns the bytes written, or -E2BIG. */
ssize_t hpack_put_literal(uint8_t *out, size_t cap, const char *name, const char *value,
                          size_t value_len);

/* The same with a name of name_len bytes (not NUL-terminated): how ingress
 * re-encodes a client's decoded fields when it must change one. */
ssize_t hpack_put_field(uint8_t *out, size_t cap, const char *name, size_t name_len, const char *value,
                        size_t value_len);
