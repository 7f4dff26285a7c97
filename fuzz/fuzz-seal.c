/* SPDX-License-Identifier: Apache-2.0 */
/* Sealed streams (lib/snapshot/seal.c) under one fixed key and context. The
 * first byte chooses:
 *
 * bit 0 clear, "read": the rest is a sealed stream to open, with bits 2-3
 *  choosing max_plain_bytes (none, 0, 100, 4096). Only documented codes; the
 *  fd and memory readers agree; the memory one returns nothing on failure;
 *  what the fd one wrote before failing is whole chunks (a multiple of the
 *  header's chunk size) and within the limit, and nothing at all when the
 *  header was refused; peek agrees with the reader about the header. A
 *  stream that opens is refused one byte shorter or longer, and re-seals to
 *  the same plaintext.
 *
 * bit 0 set, "damage": the fuzzer seals a plaintext itself and then damages
 *  it, so it knows which chunks are intact. byte 1: bit 0 zstd, bits 1-3 the
 *  chunk size, bit 4 seal through seal_write_fd() (1 MiB chunks); bytes 2-3
 *  a position (a byte offset or a chunk index); byte 4 the damage (low 3
 *  bits: a cut, a XOR, a chunk dropped, duplicated, swapped with the next,
 *  made final with the rest dropped, taken from another file, bytes
 *  appended); byte 5 its value; the rest is the plaintext. The undamaged
 *  stream round-trips; a damaged one is refused, and the reader wrote
 *  exactly the plaintext of the non-final chunks that end before the first
 *  byte that differs: never a byte of a damaged chunk or of the final one. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snapshot/seal.h"
#include "util/macro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CTX "team:1 snapshot:snap_fuzz"
static const uint8_t key[SEAL_KEY_LEN] = { 'f', 'u', 'z', 'z', 0x42, [31] = 0x17 };

/* ------------------------------------------------------------- helpers */

static int fd_in = -1, fd_out = -1;

static void fds_open(void) {
        if (fd_in >= 0)
                return;
        fd_in = memfd_create("fuzz-seal-in", MFD_CLOEXEC);
        fd_out = memfd_create("fuzz-seal-out", MFD_CLOEXEC);
        if (fd_in < 0 || fd_out < 0)
                abort();
}

static void fd_reset(int fd, const uint8_t *d, size_t n) {
        if (ftruncate(fd, 0) < 0 || (n > 0 && pwrite(fd, d, n, 0) != (ssize_t) n) ||
            lseek(fd, 0, SEEK_SET) != 0)
                abort();
}

/* seal_read_fd() on d[0..n); returns the code, and what it wrote in *ret
 * (malloc'd) and *ret_len, whatever the code. */
static int read_fd(const uint8_t *d, size_t n, uint64_t max, uint8_t **ret, size_t *ret_len) {
        fds_open();
        fd_reset(fd_in, d, n);
        fd_reset(fd_out, NULL, 0);
        int r = seal_read_fd(fd_in, fd_out, key, CTX, max, NULL, 0);
        off_t end = lseek(fd_out, 0, SEEK_END);
        if (end < 0)
                abort();
        uint8_t *p = malloc((size_t) end + 1);
        if (!p || pread(fd_out, p, (size_t) end, 0) != (ssize_t) end)
                abort();
        *ret = p;
        *ret_len = (size_t) end;
        return r;
}

static bool code_documented(int r) {
        return r == 0 || r == -EBADMSG || r == -EPERM || r == -E2BIG;
}

static uint32_t be32(const uint8_t *p) {
        return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

/* ------------------------------------------------------------- read */

static void fuzz_read(const uint8_t *d, size_t n, uint64_t max) {
        uint8_t *out, sentinel = 0, *mem = &sentinel;
        size_t out_len, mem_len = 7;
        int r = read_fd(d, n, max, &out, &out_len);
        int r2 = seal_read_buf(d, n, key, CTX, max, &mem, &mem_len, NULL, 0);

        if (!code_documented(r) || r2 != r)
                abort();
        if (out_len > max)
                abort();
        if (r < 0 && (mem != &sentinel || mem_len != 7))
                abort();
        if (r == 0 && (mem_len != out_len || memcmp(mem, out, out_len) != 0))
                abort();

        /* peek reads the same header the reader did */
        char ctx[SEAL_CONTEXT_MAX + 1];
        int p = seal_peek_context(fd_in, ctx, sizeof ctx);
        if (p != -EBADMSG && (p < 1 || p > SEAL_CONTEXT_MAX || strlen(ctx) != (size_t) p))
                abort();
        if (p == -EBADMSG && (r != -EBADMSG || out_len != 0))
                abort();
        if (r == -EPERM && (p < 0 || strcmp(ctx, CTX) == 0 || out_len != 0))
                abort();
        if ((r == 0 || r == -E2BIG || out_len > 0) && (p < 0 || strcmp(ctx, CTX) != 0))
                abort();

        /* nothing but whole chunks before a failure */
        if (r < 0 && out_len > 0 && out_len % be32(d + 10) != 0)
                abort();

        if (r == 0) {
                uint8_t *again, *s;
                size_t again_len, s_len;
                /* the stream was read to its end, and only to its end */
                if (seal_read_buf(d, n - 1, key, CTX, max, &again, &again_len, NULL, 0) != -EBADMSG)
                        abort();
                uint8_t *longer = malloc(n + 1);
                if (!longer)
                        abort();
                memcpy(longer, d, n);
                longer[n] = 0;
                if (seal_read_buf(longer, n + 1, key, CTX, max, &again, &again_len, NULL, 0) !=
                    -EBADMSG)
                        abort();
                free(longer);
                /* re-sealed with the same parameters, the same plaintext */
                if (seal_write_buf(mem, mem_len, key, CTX, d[9] & SEAL_FLAG_ZSTD, be32(d + 10), &s,
                                   &s_len, NULL, 0) != 0 ||
                    seal_read_buf(s, s_len, key, CTX, max, &again, &again_len, NULL, 0) != 0 ||
                    again_len != mem_len || memcmp(again, mem, mem_len) != 0)
                        abort();
                free(s);
                free(again);
                free(mem);
        }
        free(out);
}

/* ------------------------------------------------------------- damage */

static const uint32_t chunk_sizes[] = { 16, 17, 31, 64, 100, 256, 1000, 4096 };

typedef struct sealed {
        uint8_t *bytes;
        size_t len, header_len, n_chunks;
        size_t *start, *end; /* of each chunk: its length word, and past its tag */
} sealed;

static void sealed_free(sealed *f) {
        free(f->bytes);
        free(f->start);
        free(f->end);
}

/* Seal, and check the layout is what seal.h says. */
static void seal_checked(const uint8_t *plain, size_t plain_len, bool zstd, bool via_fd,
                         uint32_t chunk, sealed *ret) {
        sealed f = {};
        if (via_fd) {
                uint64_t count = 0;
                fds_open();
                fd_reset(fd_in, plain, plain_len);
                fd_reset(fd_out, NULL, 0);
                int r = seal_write_fd(fd_in, fd_out, key, CTX, zstd, &count, NULL, 0);
                off_t end = lseek(fd_out, 0, SEEK_END);
                if (r != 0 || count != plain_len || end <= 0)
                        abort();
                f.len = (size_t) end;
                f.bytes = malloc(f.len);
                if (!f.bytes || pread(fd_out, f.bytes, f.len, 0) != (ssize_t) f.len)
                        abort();
        } else if (seal_write_buf(plain, plain_len, key, CTX, zstd, chunk, &f.bytes, &f.len, NULL,
                                  0) != 0) {
                abort();
        }

        f.header_len = SEAL_HEADER_FIXED + strlen(CTX);
        f.n_chunks = plain_len / chunk + 1;
        f.start = malloc(f.n_chunks * sizeof *f.start);
        f.end = malloc(f.n_chunks * sizeof *f.end);
        if (!f.start || !f.end || f.len < f.header_len || be32(f.bytes + 10) != chunk ||
            f.bytes[9] != (zstd ? 1 : 0))
                abort();
        size_t at = f.header_len;
        for (size_t i = 0; i < f.n_chunks; i++) {
                if (f.len - at < 4)
                        abort();
                uint32_t w = be32(f.bytes + at);
                if ((w >> 31) != (i + 1 == f.n_chunks))
                        abort();
                if (!zstd && (w & 0x7fffffff) != (i + 1 == f.n_chunks ? plain_len % chunk : chunk))
                        abort();
                f.start[i] = at;
                at += 4 + (w & 0x7fffffff) + SEAL_TAG_LEN;
                if (at > f.len)
                        abort();
                f.end[i] = at;
        }
        if (at != f.len)
                abort();
        *ret = f;
}

/* out = a[0..an) || b[0..bn) || c[0..cn) */
static size_t put3(uint8_t *out, const uint8_t *a, size_t an, const uint8_t *b, size_t bn,
                   const uint8_t *c, size_t cn) {
        if (an)
                memcpy(out, a, an);
        if (bn)
                memcpy(out + an, b, bn);
        if (cn)
                memcpy(out + an + bn, c, cn);
        return an + bn + cn;
}

enum {
        DAMAGE_CUT,     /* the stream ends at pos */
        DAMAGE_XOR,     /* byte pos ^= value (0 taken as 1) */
        DAMAGE_DROP,    /* chunk pos is left out */
        DAMAGE_DUP,     /* chunk pos twice */
        DAMAGE_SWAP,    /* chunks pos and pos + 1 trade places */
        DAMAGE_FINAL,   /* chunk pos's final flag flipped, the chunks after it dropped */
        DAMAGE_FOREIGN, /* chunk pos from another sealing of the same plaintext */
        DAMAGE_APPEND,  /* value bytes appended */
};

static void fuzz_damage(const uint8_t *d, size_t n) {
        if (n < 5)
                return;
        bool zstd = d[0] & 1, via_fd = d[0] & 0x10;
        uint32_t chunk = via_fd ? SEAL_CHUNK_DEFAULT : chunk_sizes[(d[0] >> 1) & 7];
        size_t pos = (size_t) d[1] << 8 | d[2];
        uint8_t op = d[3] & 7, value = d[4];
        const uint8_t *plain = d + 5;
        size_t plain_len = n - 5;

        sealed f;
        seal_checked(plain, plain_len, zstd, via_fd, chunk, &f);
        size_t k = pos % f.n_chunks;
        const uint8_t *b = f.bytes;
        /* every damage fits twice the original plus a little */
        uint8_t *t = malloc(2 * f.len + 256);
        size_t tl = 0;
        if (!t)
                abort();
        switch (op) {
        case DAMAGE_CUT:
                tl = put3(t, b, pos % (f.len + 1), NULL, 0, NULL, 0);
                break;
        case DAMAGE_XOR:
                tl = put3(t, b, f.len, NULL, 0, NULL, 0);
                t[pos % f.len] ^= value ? value : 1;
                break;
        case DAMAGE_DROP:
                tl = put3(t, b, f.start[k], NULL, 0, b + f.end[k], f.len - f.end[k]);
                break;
        case DAMAGE_DUP:
                tl = put3(t, b, f.end[k], b + f.start[k], f.end[k] - f.start[k], b + f.end[k],
                          f.len - f.end[k]);
                break;
        case DAMAGE_SWAP:
                if (f.n_chunks < 2) {
                        tl = put3(t, b, f.len, NULL, 0, NULL, 0); /* nothing to swap */
                        break;
                }
                if (k + 1 == f.n_chunks)
                        k = 0;
                tl = put3(t, b, f.start[k], b + f.start[k + 1], f.end[k + 1] - f.start[k + 1],
                          b + f.start[k], f.end[k] - f.start[k]);
                tl += put3(t + tl, b + f.end[k + 1], f.len - f.end[k + 1], NULL, 0, NULL, 0);
                break;
        case DAMAGE_FINAL:
                tl = put3(t, b, f.end[k], NULL, 0, NULL, 0);
                t[f.start[k]] ^= 0x80;
                break;
        case DAMAGE_FOREIGN: {
                sealed g;
                seal_checked(plain, plain_len, zstd, via_fd, chunk, &g);
                tl = put3(t, b, f.start[k], g.bytes + g.start[k], g.end[k] - g.start[k],
                          b + f.end[k], f.len - f.end[k]);
                sealed_free(&g);
                break;
        }
        case DAMAGE_APPEND:
                tl = put3(t, b, f.len, plain, MIN(plain_len, (size_t) value + 1),
                          (const uint8_t *) "x", 1);
                break;
        }

        /* Where the damaged stream first differs from the original (or ends,
         * or goes on): the chunks that end at or before it are intact, and
         * exactly those that are not final get written. */
        size_t same = 0;
        while (same < tl && same < f.len && t[same] == b[same])
                same++;
        bool damaged = tl != f.len || same != f.len;
        size_t allowed = 0;
        if (same >= f.header_len)
                for (size_t i = 0; i + 1 < f.n_chunks && f.end[i] <= same; i++)
                        allowed += chunk;

        uint8_t *out;
        size_t out_len;
        int r = read_fd(t, tl, SEAL_NO_LIMIT, &out, &out_len);
        if (!damaged) {
                if (r != 0 || out_len != plain_len || memcmp(out, plain, plain_len) != 0)
                        abort();
        } else {
                /* a changed context byte may be a label the reader refuses
                 * (-EPERM) before any key is derived */
                bool in_context = same >= 30 && same < f.header_len && tl > same;
                if (r != -EBADMSG && !(r == -EPERM && in_context))
                        abort();
                if (out_len != allowed || memcmp(out, plain, out_len) != 0)
                        abort();
                uint8_t sentinel = 0, *mem = &sentinel;
                size_t mem_len = 7;
                if (seal_read_buf(t, tl, key, CTX, SEAL_NO_LIMIT, &mem, &mem_len, NULL, 0) != r ||
                    mem != &sentinel || mem_len != 7)
                        abort();
        }
        free(out);
        free(t);
        sealed_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static const uint64_t limits[] = { SEAL_NO_LIMIT, 0, 100, 4096 };
        if (size < 1)
                return 0;
        if (data[0] & 1)
                fuzz_damage(data + 1, size - 1);
        else
                fuzz_read(data + 1, size - 1, limits[(data[0] >> 2) & 3]);
        return 0;
}
