/* SPDX-License-Identifier: Apache-2.0 */
/* HPACK decoding (RFC 7541); see hpack.h for the bounds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "net/hpack.h"
#include "util/macro.h"

struct hpack_entry {
        size_t name_len, value_len;
        char data[]; /* name, then value */
};

/* ------------------------------------------------------------ static table */

static const struct {
        const char *name, *value;
} static_table[] = {
        { ":authority", "" },
        { ":method", "GET" },
        { ":method", "POST" },
        { ":path", "/" },
        { ":path", "/index.html" },
        { ":scheme", "http" },
        { ":scheme", "https" },
        { ":status", "200" },
        { ":status", "204" },
        { ":status", "206" },
        { ":status", "304" },
        { ":status", "400" },
        { ":status", "404" },
        { ":status", "500" },
        { "accept-charset", "" },
        { "accept-encoding", "gzip, deflate" },
        { "accept-language", "" },
        { "accept-ranges", "" },
        { "accept", "" },
        { "access-control-allow-origin", "" },
        { "age", "" },
        { "allow", "" },
        { "authorization", "" },
        { "cache-control", "" },
        { "content-disposition", "" },
        { "content-encoding", "" },
        { "content-language", "" },
        { "content-length", "" },
        { "content-location", "" },
        { "content-range", "" },
        { "content-type", "" },
        { "cookie", "" },
        { "date", "" },
        { "etag", "" },
        { "expect", "" },
        { "expires", "" },
        { "from", "" },
        { "host", "" },
        { "if-match", "" },
        { "if-modified-since", "" },
        { "if-none-match", "" },
        { "if-range", "" },
        { "if-unmodified-since", "" },
        { "last-modified", "" },
        { "link", "" },
        { "location", "" },
        { "max-forwards", "" },
        { "proxy-authenticate", "" },
        { "proxy-authorization", "" },
        { "range", "" },
        { "referer", "" },
        { "refresh", "" },
        { "retry-after", "" },
        { "server", "" },
        { "set-cookie", "" },
        { "strict-transport-security", "" },
        { "transfer-encoding", "" },
        { "user-agent", "" },
        { "vary", "" },
        { "via", "" },
        { "www-authenticate", "" },
};
#define STATIC_N ELEMENTSOF(static_table)

/* ---------------------------------------------------------------- Huffman */

/* The code length of each symbol, 0..255 and EOS (256), from RFC 7541
 * Appendix B. The code is canonical (codes of one length are consecutive,
 * in symbol order, and shorter codes come first), so the lengths alone
 * define it: the decoder rebuilds the first code of each length. */
static const uint8_t huff_len[257] = {
        13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28,
        30, 28, 28, 28, 28, 28, 28, 28, 28, 28, 6,  10, 10, 12, 13, 6,  8,  11, 10, 10, 8,  11,
        8,  6,  6,  6,  5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8,  15, 6,  12, 10, 13, 6,
        7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,
        8,  7,  8,  13, 19, 13, 14, 6,  15, 5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,
        6,  5,  6,  7,  6,  5,  5,  6,  7,  7,  7,  7,  7,  15, 11, 14, 13, 28, 20, 22, 20, 20,
        22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21,
        22, 23, 22, 23, 23, 24, 22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
        21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23,
        22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26,
        28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, 26, 27,
        26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
};

#define HUFF_MIN 5
#define HUFF_MAX 30
#define HUFF_EOS 256

static struct {
        bool ready;
        uint32_t first[HUFF_MAX + 1];  /* the first code of each length */
        uint16_t count[HUFF_MAX + 1];  /* codes of each length */
        uint16_t offset[HUFF_MAX + 1]; /* index in sorted[] of that first code */
        uint16_t sorted[257];          /* symbols by (length, symbol) */
} huff;

/* Built on first use from huff_len; pure computation, so a race of two
 * threads would write the same values (only the daemon's loop and the
 * single-threaded tests call it). */
static void huff_build(void) {
        if (huff.ready)
                return;
        memset(&huff, 0, sizeof huff);
        for (unsigned s = 0; s < 257; s++)
                huff.count[huff_len[s]]++;
        uint32_t code = 0;
        uint16_t off = 0;
        for (unsigned l = 1; l <= HUFF_MAX; l++) {
                code = (code + (l > 1 ? huff.count[l - 1] : 0)) << 1;
                if (l == 1)
                        code = 0;
                huff.first[l] = code;
                huff.offset[l] = off;
                off = (uint16_t) (off + huff.count[l]);
        }
        uint16_t fill[HUFF_MAX + 1];
        memcpy(fill, huff.offset, sizeof fill);
        for (unsigned s = 0; s < 257; s++)
                huff.sorted[fill[huff_len[s]]++] = (uint16_t) s;
        huff.ready = true;
}

ssize_t hpack_huffman_decode(const uint8_t *in, size_t len, char *out, size_t cap) {
        huff_build();
        size_t o = 0;
        uint32_t code = 0;
        unsigned bits = 0; /* bits in code: those of the symbol being read */
        bool all_ones = true;
        for (size_t i = 0; i < len; i++)
                for (int b = 7; b >= 0; b--) {
                        unsigned bit = (in[i] >> b) & 1;
                        code = (code << 1) | bit;
                        bits++;
                        all_ones = all_ones && bit;
                        if (bits > HUFF_MAX)
                                return -EBADMSG;
                        if (bits < HUFF_MIN)
                                continue;
                        uint32_t k = code - huff.first[bits];
                        if (code < huff.first[bits] || k >= huff.count[bits])
                                continue;
                        unsigned sym = huff.sorted[huff.offset[bits] + k];
                        if (sym == HUFF_EOS) /* §5.2: a decoded EOS is an error */
                                return -EBADMSG;
                        if (o >= cap)
                                return -E2BIG;
                        out[o++] = (char) sym;
                        code = 0;
                        bits = 0;
                        all_ones = true;
                }
        /* §5.2: padding is under 8 bits and the most significant bits of
         * EOS (all ones); anything else is an error */
        if (bits > 7 || !all_ones)
                return -EBADMSG;
        return (ssize_t) o;
}

/* ---------------------------------------------------------------- integers */

/* RFC 7541 §5.1. Values above 2^28 are refused: nothing a bounded block
 * holds can be that long, and it keeps the shifts far from overflow. */
#define INT_MAX_VALUE (1u << 28)

static int get_int(const uint8_t *in, size_t len, size_t *pos, unsigned prefix_bits, uint32_t *ret) {
        if (*pos >= len)
                return -EBADMSG;
        uint32_t mask = (1u << prefix_bits) - 1;
        uint32_t v = in[(*pos)++] & mask;
        if (v < mask) {
                *ret = v;
                return 0;
        }
        for (unsigned shift = 0;; shift += 7) {
                if (*pos >= len || shift > 21)
                        return -EBADMSG;
                uint8_t b = in[(*pos)++];
                v += (uint32_t) (b & 0x7f) << shift;
                if (v > INT_MAX_VALUE)
                        return -EBADMSG;
                if (!(b & 0x80))
                        break;
        }
        *ret = v;
        return 0;
}

ssize_t hpack_put_int(uint8_t *out, size_t cap, uint8_t flags, unsigned prefix_bits, uint64_t v) {
        uint64_t mask = (1u << prefix_bits) - 1;
        size_t o = 0;
        if (cap < 1)
                return -E2BIG;
        if (v < mask) {
                out[o++] = (uint8_t) (flags | v);
                return (ssize_t) o;
        }
        out[o++] = (uint8_t) (flags | mask);
        v -= mask;
        while (v >= 128) {
                if (o >= cap)
                        return -E2BIG;
                out[o++] = (uint8_t) (0x80 | (v & 0x7f));
                v >>= 7;
        }
        if (o >= cap)
                return -E2BIG;
        out[o++] = (uint8_t) v;
        return (ssize_t) o;
}

ssize_t hpack_put_literal(uint8_t *out, size_t cap, const char *name, const char *value,
                          size_t value_len) {
        return hpack_put_field(out, cap, name, strlen(name), value, value_len);
}

ssize_t hpack_put_field(uint8_t *out, size_t cap, const char *name, size_t nl, const char *value,
                        size_t value_len) {
        size_t o = 0;
        if (cap < 1)
                return -E2BIG;
        out[o++] = 0x00; /* literal without indexing, new name */
        ssize_t k = hpack_put_int(out + o, cap - o, 0x00, 7, nl);
        if (k < 0 || cap - o - (size_t) k < nl)
                return -E2BIG;
        o += (size_t) k;
        memcpy(out + o, name, nl);
        o += nl;
        k = hpack_put_int(out + o, cap - o, 0x00, 7, value_len);
        if (k < 0 || cap - o - (size_t) k < value_len)
                return -E2BIG;
        o += (size_t) k;
        memcpy(out + o, value, value_len);
        return (ssize_t) (o + value_len);
}

/* ----------------------------------------------------------- dynamic table */

int hpack_decoder_init(hpack_decoder *d, size_t limit) {
        *d = (hpack_decoder) { 0 };
        d->limit = limit;
        d->max_size = limit < HPACK_TABLE_DEFAULT ? limit : HPACK_TABLE_DEFAULT;
        d->cap = limit / HPACK_ENTRY_OVERHEAD + 1; /* every entry is at least 32 */
        d->ring = calloc(d->cap, sizeof *d->ring);
        return d->ring ? 0 : -ENOMEM;
}

void hpack_decoder_done(hpack_decoder *d) {
        if (!d->ring)
                return;
        for (size_t i = 0; i < d->n; i++)
                free(d->ring[(d->head + i) % d->cap]);
        free(d->ring);
        d->ring = NULL;
        d->n = 0;
}

static size_t entry_size(const hpack_entry *e) {
        return e->name_len + e->value_len + HPACK_ENTRY_OVERHEAD;
}

/* Drop the oldest entries until the table fits in max (§4.4). */
static void evict_to(hpack_decoder *d, size_t max) {
        while (d->size > max && d->n > 0) {
                hpack_entry *e = d->ring[d->head];
                d->size -= entry_size(e);
                free(e);
                d->ring[d->head] = NULL;
                d->head = (d->head + 1) % d->cap;
                d->n--;
        }
}

static int table_add(hpack_decoder *d, const char *name, size_t nl, const char *value, size_t vl) {
        size_t sz = nl + vl + HPACK_ENTRY_OVERHEAD;
        if (sz > d->max_size) {
                /* §4.4: an entry larger than the table empties it, and is
                 * not an error */
                evict_to(d, 0);
                return 0;
        }
        evict_to(d, d->max_size - sz);
        hpack_entry *e = malloc(sizeof *e + nl + vl);
        if (!e)
                return -ENOMEM;
        e->name_len = nl;
        e->value_len = vl;
        memcpy(e->data, name, nl);
        memcpy(e->data + nl, value, vl);
        /* cap > max_size / 32 >= n, so there is always a free slot */
        d->ring[(d->head + d->n) % d->cap] = e;
        d->n++;
        d->size += sz;
        return 0;
}

/* Index 1..61 is the static table, 62.. the dynamic one, newest first. */
static int lookup(const hpack_decoder *d, uint32_t idx, const char **name, size_t *nl,
                  const char **value, size_t *vl) {
        if (idx == 0)
                return -EBADMSG;
        if (idx <= STATIC_N) {
                *name = static_table[idx - 1].name;
                *nl = strlen(*name);
                *value = static_table[idx - 1].value;
                *vl = strlen(*value);
                return 0;
        }
        size_t k = idx - STATIC_N - 1;
        if (k >= d->n)
                return -EBADMSG;
        const hpack_entry *e = d->ring[(d->head + d->n - 1 - k) % d->cap];
        *name = e->data;
        *nl = e->name_len;
        *value = e->data + e->name_len;
        *vl = e->value_len;
        return 0;
}

/* ---------------------------------------------------------------- decoding */

/* A string literal (§5.2) into out (cap bytes), *ret_len its length. */
static int get_string(const uint8_t *in, size_t len, size_t *pos, char *out, size_t cap,
                      size_t *ret_len) {
        if (*pos >= len)
                return -EBADMSG;
        bool huffman = in[*pos] & 0x80;
        uint32_t n;
        int r = get_int(in, len, pos, 7, &n);
        if (r < 0)
                return r;
        if (n > len - *pos)
                return -EBADMSG;
        if (huffman) {
                ssize_t k = hpack_huffman_decode(in + *pos, n, out, cap);
                if (k < 0)
                        return (int) k;
                *ret_len = (size_t) k;
        } else {
                if (n > cap)
                        return -E2BIG;
                memcpy(out, in + *pos, n);
                *ret_len = n;
        }
        *pos += n;
        return 0;
}

static int fail(hpack_decoder *d, int r, const char *why) {
        d->broken = true;
        d->why = why;
        return r;
}

int hpack_decode(hpack_decoder *d, const uint8_t *in, size_t len, size_t list_max,
                 hpack_field_cb cb, void *userdata) {
        if (d->broken)
                return fail(d, -EBADMSG, d->why ? d->why : "decoder broken");
        /* A string decodes to at most 8/5 of its bytes (5-bit codes are
         * the shortest), and no string is longer than the block. */
        size_t cap = len / 5 * 8 + 8;
        _cleanup_free_ char *nbuf = malloc(cap), *vbuf = malloc(cap);
        if (!nbuf || !vbuf)
                return fail(d, -ENOMEM, "out of memory");
        size_t pos = 0, list = 0;
        int fields = 0;
        bool may_resize = true; /* §4.2: size updates only at the block's start */

        while (pos < len) {
                uint8_t b = in[pos];
                const char *name, *value;
                size_t nl, vl;
                uint32_t idx;
                int r;
                bool add = false;

                if (b & 0x80) { /* §6.1 indexed field */
                        if (get_int(in, len, &pos, 7, &idx) < 0)
                                return fail(d, -EBADMSG, "bad integer");
                        if (lookup(d, idx, &name, &nl, &value, &vl) < 0)
                                return fail(d, -EBADMSG, "index out of the tables");
                } else if ((b & 0xe0) == 0x20) { /* §6.3 dynamic table size update */
                        if (get_int(in, len, &pos, 5, &idx) < 0)
                                return fail(d, -EBADMSG, "bad integer");
                        if (!may_resize)
                                return fail(d, -EBADMSG, "table size update after a field");
                        if (idx > d->limit)
                                return fail(d, -EBADMSG, "table size update above the limit");
                        d->max_size = idx;
                        evict_to(d, idx);
                        continue;
                } else { /* §6.2 literals: with (01), without (0000), never (0001) indexing */
                        unsigned prefix = (b & 0xc0) == 0x40 ? 6 : 4;
                        add = prefix == 6;
                        if (get_int(in, len, &pos, prefix, &idx) < 0)
                                return fail(d, -EBADMSG, "bad integer");
                        if (idx) {
                                const char *n0, *v0;
                                size_t v0l;
                                if (lookup(d, idx, &n0, &nl, &v0, &v0l) < 0)
                                        return fail(d, -EBADMSG, "index out of the tables");
                                if (nl > cap)
                                        return fail(d, -E2BIG, "name too long");
                                /* copied: adding the field may evict the entry named */
                                memcpy(nbuf, n0, nl);
                        } else if ((r = get_string(in, len, &pos, nbuf, cap, &nl)) < 0)
                                return fail(d, r, "bad name string");
                        if ((r = get_string(in, len, &pos, vbuf, cap, &vl)) < 0)
                                return fail(d, r, "bad value string");
                        name = nbuf;
                        value = vbuf;
                }
                may_resize = false;
                list += nl + vl + HPACK_ENTRY_OVERHEAD;
                if (list > list_max)
                        return fail(d, -E2BIG, "header list too large");
                if (add && (r = table_add(d, name, nl, value, vl)) < 0)
                        return fail(d, r, "out of memory");
                if (cb && (r = cb(userdata, name, nl, value, vl)) < 0)
                        return fail(d, r, "refused by the caller");
                fields++;
        }
        return fields;
}
