/* SPDX-License-Identifier: Apache-2.0 */
/* Sealed streams (lib/snapshot/seal.c). First the format itself, decoded by
 * an independent reader written from seal.h (HKDF from two HMACs, GCM by
 * hand), so the documentation and the code cannot drift apart; then round
 * trips over memory, files and pipes; then every way to damage a file: each
 * bit flipped, each truncation, chunks swapped, duplicated, dropped, spliced
 * from another file, header fields changed, a file relabelled for another
 * team, the wrong key, a decompression bomb and garbage. Every refusal also
 * checks what reached the output: only the plaintext of the chunks that
 * come before the damage, never a byte of the damaged chunk. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include "tap.h"
#include "snapshot/seal.h"
#include "util/macro.h"

#define CTX "team:12 snapshot:snap_abc"
#define MIB (1u << 20)

static const uint8_t key1[SEAL_KEY_LEN] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
static const uint8_t key2[SEAL_KEY_LEN] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 11 };

/* ------------------------------------------------------------- helpers */

/* Deterministic bytes: random-looking (incompressible) or text-like. */
static void fill(uint8_t *p, size_t n, uint64_t seed, bool text) {
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
        for (size_t i = 0; i < n; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                p[i] = text ? (uint8_t) ("snapshot of a sandbox \n"[x % 23]) : (uint8_t) x;
        }
}

static uint8_t *data_new(size_t n, uint64_t seed, bool text) {
        uint8_t *p = malloc(n ? n : 1);
        if (!p)
                abort();
        fill(p, n, seed, text);
        return p;
}

static uint8_t *seal_mem(const void *in, size_t n, bool compress, uint32_t chunk, size_t *ret_len) {
        uint8_t *out = NULL;
        char why[256] = "";
        int r = seal_write_buf(in, n, key1, CTX, compress, chunk, &out, ret_len, why, sizeof why);
        if (r < 0) {
                printf("# seal_write_buf: %d %s\n", r, why);
                abort();
        }
        return out;
}

static int memfd_with(const void *data, size_t n) {
        int fd = memfd_create("seal-test", MFD_CLOEXEC);
        if (fd < 0 || (n > 0 && write(fd, data, n) != (ssize_t) n) || lseek(fd, 0, SEEK_SET) != 0)
                abort();
        return fd;
}

/* All of a file, from offset 0. */
static uint8_t *fd_contents(int fd, size_t *ret_len) {
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < 0)
                abort();
        uint8_t *p = malloc((size_t) end + 1);
        if (!p || pread(fd, p, (size_t) end, 0) != (ssize_t) end)
                abort();
        *ret_len = (size_t) end;
        return p;
}

/* A pipe whose other end a child fills with data, then closes. */
static int pipe_feeder(const void *data, size_t n, pid_t *ret_pid) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                abort();
        pid_t pid = fork();
        if (pid < 0)
                abort();
        if (pid == 0) {
                close(p[0]);
                const uint8_t *d = data;
                while (n > 0) {
                        ssize_t k = write(p[1], d, n);
                        if (k <= 0)
                                _exit(1);
                        d += k;
                        n -= (size_t) k;
                }
                _exit(0);
        }
        close(p[1]);
        *ret_pid = pid;
        return p[0];
}

static bool reaped_ok(pid_t pid) {
        int status;
        return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* seal_read_fd() over memfds: the code, and what it wrote (even on failure). */
static int read_partial(const uint8_t *sealed, size_t n, const uint8_t *key, const char *ctx,
                        uint64_t max, uint8_t **ret_out, size_t *ret_out_len, char *why,
                        size_t whylen) {
        int in = memfd_with(sealed, n), out = memfd_create("seal-out", MFD_CLOEXEC);
        if (out < 0)
                abort();
        int r = seal_read_fd(in, out, key, ctx, max, why, whylen);
        *ret_out = fd_contents(out, ret_out_len);
        close(in);
        close(out);
        return r;
}

/* The layout of a sealed file, parsed from seal.h's description: header
 * length, and for each chunk where it ends and its flag. */
typedef struct layout {
        size_t header_len;
        size_t n_chunks;
        size_t start[64], end[64];
        bool final[64];
} layout;

static void layout_of(const uint8_t *s, size_t n, layout *l) {
        memset(l, 0, sizeof *l);
        if (n < SEAL_HEADER_FIXED)
                abort();
        l->header_len = SEAL_HEADER_FIXED + s[30];
        size_t off = l->header_len;
        while (off < n) {
                if (l->n_chunks == 64 || n - off < 4 + SEAL_TAG_LEN)
                        abort();
                uint32_t w = (uint32_t) s[off] << 24 | (uint32_t) s[off + 1] << 16 |
                        (uint32_t) s[off + 2] << 8 | s[off + 3];
                l->start[l->n_chunks] = off;
                l->final[l->n_chunks] = w >> 31;
                off += 4 + (w & 0x7fffffff) + SEAL_TAG_LEN;
                l->end[l->n_chunks++] = off;
        }
        if (off != n)
                abort();
}

/* What a reader may have written before refusing a file damaged at byte
 * `at` (or cut there): the plaintext of the non-final chunks that end at or
 * before it, chunk_size bytes each. */
static size_t allowed_before(const layout *l, size_t at, uint32_t chunk) {
        size_t k = 0;
        for (size_t i = 0; i < l->n_chunks; i++)
                if (l->end[i] <= at && !l->final[i])
                        k++;
        return k * chunk;
}

/* A new file from pieces of others: a list of (pointer, length). */
static uint8_t *join_parts(size_t *ret_len, size_t n_parts, const uint8_t *const *parts,
                           const size_t *lens) {
        size_t total = 0;
        for (size_t i = 0; i < n_parts; i++)
                total += lens[i];
        uint8_t *p = malloc(total + 1), *q = p;
        if (!p)
                abort();
        for (size_t i = 0; i < n_parts; i++) {
                memcpy(q, parts[i], lens[i]);
                q += lens[i];
        }
        *ret_len = total;
        return p;
}

/* The file s refused with code, nothing of it written; why says so. */
static void refused(const uint8_t *s, size_t n, const uint8_t *key, const char *ctx, int code,
                    size_t allowed, const uint8_t *plain, const char *what) {
        char why[256] = "";
        uint8_t *out = NULL;
        size_t out_len = 0;
        int r = read_partial(s, n, key, ctx, SEAL_NO_LIMIT, &out, &out_len, why, sizeof why);
        uint8_t *mem = (uint8_t *) "x";
        size_t mem_len = 7;
        int r2 = seal_read_buf(s, n, key, ctx, SEAL_NO_LIMIT, &mem, &mem_len, NULL, 0);
        ok(r == code && r2 == code && out_len == allowed &&
                   (!allowed || memcmp(out, plain, allowed) == 0) && why[0] && mem_len == 7,
           "%s: refused with %d, %zu bytes out (got %d/%d, %zu: %s)", what, code, allowed, r, r2,
           out_len, why);
        free(out);
}

/* ------------------------------------------------------------- the format, independently */

static void hmac256(const uint8_t *k, size_t klen, const uint8_t *m, size_t mlen, uint8_t out[32]) {
        unsigned len = 32;
        if (!HMAC(EVP_sha256(), k, (int) klen, m, mlen, out, &len) || len != 32)
                abort();
}

/* RFC 5869 for one block of output: PRK = HMAC(salt, IKM), OKM = HMAC(PRK, info || 1). */
static void hkdf256(const uint8_t *ikm, const uint8_t *salt, size_t salt_len, const uint8_t *info,
                    size_t info_len, uint8_t okm[32]) {
        uint8_t prk[32], msg[300];
        hmac256(salt, salt_len, ikm, 32, prk);
        memcpy(msg, info, info_len);
        msg[info_len] = 1;
        hmac256(prk, 32, msg, info_len + 1, okm);
}

static bool spec_decrypt(const uint8_t *key, const uint8_t *hash, uint64_t i, bool final,
                         const uint8_t *ct, size_t n, const uint8_t *tag, uint8_t *pt) {
        uint8_t nonce[12] = { 0 }, aad[41];
        for (int b = 0; b < 8; b++) {
                nonce[4 + b] = (uint8_t) (i >> (56 - 8 * b));
                aad[32 + b] = (uint8_t) (i >> (56 - 8 * b));
        }
        memcpy(aad, hash, 32);
        aad[40] = final;
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        int l = 0;
        bool good = c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
                EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, 12, NULL) == 1 &&
                EVP_DecryptInit_ex(c, NULL, NULL, key, nonce) == 1 &&
                EVP_DecryptUpdate(c, NULL, &l, aad, 41) == 1 &&
                EVP_DecryptUpdate(c, pt, &l, ct, (int) n) == 1 &&
                EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, 16, (void *) tag) == 1 &&
                EVP_DecryptFinal_ex(c, pt + l, &l) == 1;
        EVP_CIPHER_CTX_free(c);
        return good;
}

/* Decode a sealed file following seal.h only; returns the plaintext length or -1. */
static long spec_decode(const uint8_t *s, size_t n, const uint8_t *master, uint8_t *out, size_t cap) {
        if (n < 31 || memcmp(s, "HUTCHSL1", 8) != 0 || s[8] != 1 || (s[9] & ~1))
                return -1;
        bool z = s[9] & 1;
        uint32_t chunk = (uint32_t) s[10] << 24 | (uint32_t) s[11] << 16 | (uint32_t) s[12] << 8 |
                s[13];
        size_t hl = 31 + s[30];
        uint8_t info[300], key[32], hash[32];
        memcpy(info, "hutch seal v1", 13);
        memcpy(info + 13, s + 31, s[30]);
        hkdf256(master, s + 14, 16, info, 13 + (size_t) s[30], key);
        SHA256(s, hl, hash);

        size_t off = hl, total = 0;
        uint8_t *pt = malloc(ZSTD_compressBound(chunk) + 1);
        for (uint64_t i = 0;; i++) {
                if (off + 4 > n)
                        goto bad;
                uint32_t w = (uint32_t) s[off] << 24 | (uint32_t) s[off + 1] << 16 |
                        (uint32_t) s[off + 2] << 8 | s[off + 3];
                bool final = w >> 31;
                size_t len = w & 0x7fffffff;
                if (off + 4 + len + 16 > n || len > ZSTD_compressBound(chunk) ||
                    !spec_decrypt(key, hash, i, final, s + off + 4, len, s + off + 4 + len, pt))
                        goto bad;
                size_t plen = len;
                if (z) {
                        plen = ZSTD_decompress(out + total, cap - total, pt, len);
                        if (ZSTD_isError(plen))
                                goto bad;
                } else {
                        if (len > cap - total)
                                goto bad;
                        memcpy(out + total, pt, len);
                }
                if (final ? plen >= chunk : plen != chunk)
                        goto bad;
                total += plen;
                off += 4 + len + 16;
                if (final)
                        break;
        }
        free(pt);
        return off == n ? (long) total : -1;
bad:
        free(pt);
        return -1;
}

static void test_format(void) {
        for (int z = 0; z <= 1; z++) {
                size_t n = 1000, len;
                uint8_t *in = data_new(n, 7, z), out[1100];
                uint8_t *s = seal_mem(in, n, z, 64, &len);
                layout l;
                layout_of(s, len, &l);
                bool header = memcmp(s, "HUTCHSL1", 8) == 0 && s[8] == 1 && s[9] == z &&
                        s[10] == 0 && s[11] == 0 && s[12] == 0 && s[13] == 64 &&
                        s[30] == strlen(CTX) && memcmp(s + 31, CTX, strlen(CTX)) == 0;
                bool flags = l.n_chunks == 1000 / 64 + 1;
                for (size_t i = 0; i < l.n_chunks; i++)
                        flags = flags && l.final[i] == (i + 1 == l.n_chunks);
                long got = spec_decode(s, len, key1, out, sizeof out);
                ok(header && flags && got == (long) n && memcmp(out, in, n) == 0,
                   "%s: header as documented, %zu chunks, only the last final, decoded from seal.h "
                   "alone (got %ld)",
                   z ? "zstd" : "plain", l.n_chunks, got);
                ok(spec_decode(s, len, key2, out, sizeof out) == -1,
                   "%s: the independent decoder refuses the wrong key", z ? "zstd" : "plain");
                if (!z)
                        ok(len == 31 + strlen(CTX) + n + (n / 64 + 1) * (4 + 16),
                           "plain: size = header + plaintext + 20 bytes per chunk (%zu)", len);
                free(in);
                free(s);
        }
}

/* The other direction: a file written from seal.h alone. The same encoder
 * also writes what no correct writer writes, under the right key: chunks
 * that authenticate but hold the wrong amount, or no zstd frame at all. */
typedef struct spec_chunk {
        const void *payload; /* the bytes to encrypt: plaintext, or a zstd frame */
        size_t len;
        bool final;
} spec_chunk;

static bool spec_encrypt(const uint8_t *key, const uint8_t *hash, uint64_t i, bool final,
                         const uint8_t *pt, size_t n, uint8_t *ct, uint8_t *tag) {
        uint8_t nonce[12] = { 0 }, aad[41];
        for (int b = 0; b < 8; b++) {
                nonce[4 + b] = (uint8_t) (i >> (56 - 8 * b));
                aad[32 + b] = (uint8_t) (i >> (56 - 8 * b));
        }
        memcpy(aad, hash, 32);
        aad[40] = final;
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        int l = 0;
        bool good = c && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, nonce) == 1 &&
                EVP_EncryptUpdate(c, NULL, &l, aad, 41) == 1 &&
                (n == 0 || EVP_EncryptUpdate(c, ct, &l, pt, (int) n) == 1) &&
                EVP_EncryptFinal_ex(c, ct + n, &l) == 1 &&
                EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
        EVP_CIPHER_CTX_free(c);
        return good;
}

static uint8_t *spec_encode(bool zstd, uint32_t chunk, const spec_chunk *c, size_t n,
                            size_t *ret_len) {
        size_t total = 31 + strlen(CTX);
        for (size_t i = 0; i < n; i++)
                total += 4 + c[i].len + 16;
        uint8_t *s = malloc(total), info[300], key[32], hash[32];
        if (!s)
                abort();
        memcpy(s, "HUTCHSL1", 8);
        s[8] = 1;
        s[9] = zstd;
        s[10] = (uint8_t) (chunk >> 24);
        s[11] = (uint8_t) (chunk >> 16);
        s[12] = (uint8_t) (chunk >> 8);
        s[13] = (uint8_t) chunk;
        if (RAND_bytes(s + 14, 16) != 1)
                abort();
        s[30] = (uint8_t) strlen(CTX);
        memcpy(s + 31, CTX, strlen(CTX));
        memcpy(info, "hutch seal v1", 13);
        memcpy(info + 13, CTX, strlen(CTX));
        hkdf256(key1, s + 14, 16, info, 13 + strlen(CTX), key);
        SHA256(s, 31 + strlen(CTX), hash);
        size_t off = 31 + strlen(CTX);
        for (size_t i = 0; i < n; i++) {
                uint32_t w = (uint32_t) c[i].len | (c[i].final ? 0x80000000u : 0);
                s[off] = (uint8_t) (w >> 24);
                s[off + 1] = (uint8_t) (w >> 16);
                s[off + 2] = (uint8_t) (w >> 8);
                s[off + 3] = (uint8_t) w;
                if (!spec_encrypt(key, hash, i, c[i].final, c[i].payload, c[i].len, s + off + 4,
                                  s + off + 4 + c[i].len))
                        abort();
                off += 4 + c[i].len + 16;
        }
        *ret_len = total;
        return s;
}

/* A zstd frame of the first n bytes of p, in static buffer number `which`. */
static const uint8_t *frame_of(const uint8_t *p, size_t n, size_t *ret_len, int which) {
        static uint8_t bufs[8][256];
        size_t k = ZSTD_compress(bufs[which], sizeof bufs[which], p, n, 3);
        if (ZSTD_isError(k))
                abort();
        *ret_len = k;
        return bufs[which];
}

/* A file from spec_encode() is refused, with only `allowed` bytes out. */
static void spec_bad(bool zstd, const spec_chunk *c, size_t n, size_t allowed, const char *why_part,
                     const char *what) {
        char why[256] = "";
        size_t len, out_len;
        uint8_t *out, *s = spec_encode(zstd, 16, c, n, &len);
        int r = read_partial(s, len, key1, CTX, SEAL_NO_LIMIT, &out, &out_len, why, sizeof why);
        ok(r == -EBADMSG && out_len == allowed && strstr(why, why_part),
           "%s: refused, %zu bytes out (got %d %zu: %s)", what, allowed, r, out_len, why);
        free(s);
        free(out);
}

static void test_spec_writer(void) {
        uint8_t in[64], *out = NULL;
        size_t len, out_len = 0, f0, f1, f2, f_short, f_full, f_over;
        fill(in, sizeof in, 11, false);

        spec_chunk plain[] = { { in, 16, false }, { in + 16, 16, false }, { in + 32, 5, true } };
        uint8_t *s = spec_encode(false, 16, plain, ELEMENTSOF(plain), &len);
        int r = seal_read_buf(s, len, key1, CTX, SEAL_NO_LIMIT, &out, &out_len, NULL, 0);
        ok(r == 0 && out_len == 37 && memcmp(out, in, 37) == 0,
           "plain: a file written from seal.h alone is read back (got %d %zu)", r, out_len);
        free(s);
        free(out);

        const uint8_t *z0 = frame_of(in, 16, &f0, 0), *z1 = frame_of(in + 16, 16, &f1, 1);
        const uint8_t *z2 = frame_of(in + 32, 0, &f2, 2);
        spec_chunk zs[] = { { z0, f0, false }, { z1, f1, false }, { z2, f2, true } };
        s = spec_encode(true, 16, zs, ELEMENTSOF(zs), &len);
        r = seal_read_buf(s, len, key1, CTX, SEAL_NO_LIMIT, &out, &out_len, NULL, 0);
        ok(r == 0 && out_len == 32 && memcmp(out, in, 32) == 0,
           "zstd: a file written from seal.h alone is read back (got %d %zu)", r, out_len);
        free(s);
        free(out);

        /* authentic, but not what a writer makes */
        const uint8_t *short0 = frame_of(in, 15, &f_short, 3), *full = frame_of(in, 16, &f_full, 4);
        const uint8_t *over = frame_of(in, 17, &f_over, 5);
        spec_bad(true, (spec_chunk[]) { { "not zstd", 8, true } }, 1, 0, "does not decompress",
                 "zstd: a chunk that is no zstd frame");
        spec_bad(true,
                 (spec_chunk[]) { { z0, f0, false }, { short0, f_short, false }, { z2, f2, true } },
                 3, 16, "holds 15", "zstd: a non-final chunk of 15 bytes");
        spec_bad(true, (spec_chunk[]) { { full, f_full, true } }, 1, 0, "holds 16",
                 "zstd: a final chunk of 16 bytes");
        spec_bad(true, (spec_chunk[]) { { over, f_over, false }, { z2, f2, true } }, 2, 0,
                 "does not decompress", "zstd: a chunk of 17 bytes");
        spec_bad(false, (spec_chunk[]) { { in, 16, true } }, 1, 0, "has length 16",
                 "plain: a final chunk of 16 bytes");
        spec_bad(false, (spec_chunk[]) { { in, 3, true }, { in, 3, true } }, 2, 0,
                 "after its final chunk", "plain: two final chunks");
}

/* ------------------------------------------------------------- round trips */

static void round_trip_buf(size_t n, bool z, uint32_t chunk) {
        size_t len, out_len = 0;
        uint8_t *in = data_new(n, n + chunk, z), *out = NULL;
        uint8_t *s = seal_mem(in, n, z, chunk, &len);
        char why[256] = "";
        int r = seal_read_buf(s, len, key1, CTX, SEAL_NO_LIMIT, &out, &out_len, why, sizeof why);
        bool size_ok = z || len == 31 + strlen(CTX) + n + (n / chunk + 1) * 20;
        ok(r == 0 && out && out_len == n && (n == 0 || memcmp(out, in, n) == 0) && size_ok,
           "memory, %s, chunk %u: %zu bytes back (got %d %zu %s)", z ? "zstd" : "plain", chunk, n,
           r, out_len, why);
        free(in);
        free(s);
        free(out);
}

/* in_pipe: the plaintext comes through a pipe, and so does the sealed
 * stream on the way back. */
static void round_trip_fd(size_t n, bool z, bool text, bool in_pipe) {
        uint8_t *in = data_new(n, n, text);
        char why[256] = "";
        uint64_t plain = 0;
        pid_t pid = 0;
        int src = in_pipe ? pipe_feeder(in, n, &pid) : memfd_with(in, n);
        int sealed = memfd_create("sealed", MFD_CLOEXEC), out = memfd_create("out", MFD_CLOEXEC);
        int r = seal_write_fd(src, sealed, key1, CTX, z, &plain, why, sizeof why);
        bool fed = !in_pipe || reaped_ok(pid);
        close(src);

        size_t len, out_len;
        uint8_t *s = fd_contents(sealed, &len);
        int r2 = -1;
        if (in_pipe) {
                src = pipe_feeder(s, len, &pid);
                r2 = seal_read_fd(src, out, key1, CTX, SEAL_NO_LIMIT, why, sizeof why);
                fed = fed && reaped_ok(pid);
                close(src);
        } else if (lseek(sealed, 0, SEEK_SET) == 0) {
                r2 = seal_read_fd(sealed, out, key1, CTX, SEAL_NO_LIMIT, why, sizeof why);
        }
        uint8_t *o = fd_contents(out, &out_len);
        layout l;
        layout_of(s, len, &l);
        bool chunks = l.n_chunks == n / SEAL_CHUNK_DEFAULT + 1 && s[13] == 0 &&
                s[11] == SEAL_CHUNK_DEFAULT >> 16;
        ok(r == 0 && r2 == 0 && fed && plain == n && out_len == n && memcmp(o, in, n) == 0 && chunks,
           "fd%s, %s%s: %zu bytes sealed in %zu chunks of 1 MiB and back (got %d %d, %zu: %s)",
           in_pipe ? " via pipes" : "", z ? "zstd" : "plain", text ? ", text" : "", n, l.n_chunks,
           r, r2, out_len, why);
        if (z && text && n > MIB)
                ok(len < n / 2, "zstd: text of %zu bytes sealed in %zu", n, len);
        close(sealed);
        close(out);
        free(in);
        free(s);
        free(o);
}

static void test_round_trips(void) {
        static const size_t sizes[] = { 0, 1, 15, 16, 17, 63, 64, 65, 128, 1000, 4096 };
        for (int z = 0; z <= 1; z++)
                for (size_t i = 0; i < ELEMENTSOF(sizes); i++) {
                        round_trip_buf(sizes[i], z, 16);
                        round_trip_buf(sizes[i], z, 64);
                }
        round_trip_buf(3 * MIB + 5, true, SEAL_CHUNK_MAX);
        round_trip_buf(SEAL_CHUNK_MAX, false, SEAL_CHUNK_MAX);

        static const size_t fd_sizes[] = { 0, 1, MIB - 1, MIB, MIB + 1, 5 * MIB + 3 };
        for (int z = 0; z <= 1; z++)
                for (size_t i = 0; i < ELEMENTSOF(fd_sizes); i++)
                        round_trip_fd(fd_sizes[i], z, z, false);
        round_trip_fd(5 * MIB + 3, false, false, true);
        round_trip_fd(5 * MIB + 3, true, true, true);
        round_trip_fd(0, true, false, true);
        round_trip_fd(MIB, false, false, true);

        /* the longest context */
        char ctx[SEAL_CONTEXT_MAX + 1];
        memset(ctx, 'c', SEAL_CONTEXT_MAX);
        ctx[SEAL_CONTEXT_MAX] = 0;
        uint8_t *s = NULL, *o = NULL;
        size_t len, olen;
        int r = seal_write_buf("abc", 3, key1, ctx, false, 16, &s, &len, NULL, 0);
        int r2 = r == 0 ? seal_read_buf(s, len, key1, ctx, 3, &o, &olen, NULL, 0) : -1;
        ok(r == 0 && r2 == 0 && olen == 3 && memcmp(o, "abc", 3) == 0,
           "a context of %d bytes round-trips (got %d %d)", SEAL_CONTEXT_MAX, r, r2);
        free(s);
        free(o);

        /* a fresh salt every time: two seals of the same bytes differ */
        size_t l1, l2;
        uint8_t *a = seal_mem("same", 4, false, 16, &l1), *b = seal_mem("same", 4, false, 16, &l2);
        size_t ct = 31 + strlen(CTX) + 4;
        ok(l1 == l2 && memcmp(a + 14, b + 14, 16) != 0 && memcmp(a + ct, b + ct, l1 - ct) != 0,
           "two seals of the same plaintext differ in salt and ciphertext");
        free(a);
        free(b);
}

static void test_peek(void) {
        size_t len;
        uint8_t *s = seal_mem("x", 1, true, 16, &len);
        int fd = memfd_with(s, len);
        char buf[SEAL_CONTEXT_MAX + 1];
        ok(lseek(fd, 5, SEEK_SET) == 5 &&
                   seal_peek_context(fd, buf, sizeof buf) == (int) strlen(CTX) && streq(buf, CTX) &&
                   lseek(fd, 0, SEEK_CUR) == 5,
           "peek: the context, read at offset 0, the file offset left alone");
        ok(seal_peek_context(fd, buf, strlen(CTX)) == -ENOBUFS &&
                   seal_peek_context(fd, buf, strlen(CTX) + 1) == (int) strlen(CTX),
           "peek: a buffer without room for the NUL is -ENOBUFS");
        close(fd);

        fd = memfd_with(s, 40);
        ok(seal_peek_context(fd, buf, sizeof buf) == -EBADMSG, "peek: a cut header is -EBADMSG");
        close(fd);
        fd = memfd_with("HUTCHSL2", 8);
        ok(seal_peek_context(fd, buf, sizeof buf) == -EBADMSG, "peek: another magic is -EBADMSG");
        close(fd);
        s[8] = 2;
        fd = memfd_with(s, len);
        ok(seal_peek_context(fd, buf, sizeof buf) == -EBADMSG, "peek: version 2 is -EBADMSG");
        close(fd);
        pid_t pid;
        fd = pipe_feeder(s, len, &pid);
        ok(seal_peek_context(fd, buf, sizeof buf) == -ESPIPE, "peek: a pipe is -ESPIPE");
        close(fd);
        reaped_ok(pid);
        free(s);
}

/* ------------------------------------------------------------- keys and contexts */

static void test_keys_and_contexts(void) {
        size_t len;
        uint8_t *s = seal_mem("0123456789abcdef0123", 20, false, 16, &len);
        refused(s, len, key2, CTX, -EBADMSG, 0, NULL, "wrong master key");
        refused(s, len, key1, "team:13 snapshot:snap_abc", -EPERM, 0, NULL, "another team's context");
        refused(s, len, key1, "team:12 snapshot:snap_ab", -EPERM, 0, NULL, "a prefix of the context");
        refused(s, len, key1, CTX " ", -EPERM, 0, NULL, "a longer context");

        /* Relabelled: the header says team 13 now. Team 13 is refused by the
         * key (the context is bound into it), team 12 by the label. */
        s[31 + 6] = '3';
        refused(s, len, key1, "team:13 snapshot:snap_abc", -EBADMSG, 0, NULL,
                "relabelled for team 13, read as team 13");
        refused(s, len, key1, CTX, -EPERM, 0, NULL, "relabelled for team 13, read as team 12");
        free(s);

        /* arguments */
        char big[SEAL_CONTEXT_MAX + 2];
        memset(big, 'a', sizeof big - 1);
        big[sizeof big - 1] = 0;
        static const char *const bad[] = { "", "team:1\n", "t\x7f", "caf\xc3\xa9" };
        uint8_t *o = NULL;
        size_t olen;
        char why[256] = "";
        for (size_t i = 0; i <= ELEMENTSOF(bad); i++) {
                const char *c = i < ELEMENTSOF(bad) ? bad[i] : big;
                int w = seal_write_buf("a", 1, key1, c, false, 16, &o, &olen, why, sizeof why);
                int r = seal_read_buf("a", 1, key1, c, SEAL_NO_LIMIT, &o, &olen, NULL, 0);
                int fw = seal_write_fd(0, 1, key1, c, false, NULL, NULL, 0);
                ok(w == -EINVAL && r == -EINVAL && fw == -EINVAL && strstr(why, "context"),
                   "context #%zu (%zu bytes) refused by writers and readers (got %d %d %d)", i,
                   strlen(c), w, r, fw);
        }
        ok(seal_write_buf("a", 1, key1, NULL, false, 16, &o, &olen, NULL, 0) == -EINVAL &&
                   seal_read_buf("a", 1, key1, NULL, 1, &o, &olen, NULL, 0) == -EINVAL &&
                   seal_write_buf("a", 1, NULL, CTX, false, 16, &o, &olen, NULL, 0) == -EINVAL,
           "a NULL context or key is -EINVAL");
        ok(seal_write_buf("a", 1, key1, CTX, false, SEAL_CHUNK_MIN - 1, &o, &olen, NULL, 0) ==
                           -EINVAL &&
                   seal_write_buf("a", 1, key1, CTX, true, SEAL_CHUNK_MAX + 1, &o, &olen, NULL, 0) ==
                           -EINVAL,
           "chunk sizes out of bounds are -EINVAL");
}

/* ------------------------------------------------------------- damage */

static void flips_and_cuts(bool z) {
        const uint32_t chunk = 16;
        size_t n = 40, len;
        uint8_t *in = data_new(n, 99, z), *s = seal_mem(in, n, z, chunk, &len);
        layout l;
        layout_of(s, len, &l);
        const size_t ctx_from = 30, ctx_to = 31 + strlen(CTX);

        size_t bad = 0, tried = 0;
        for (size_t at = 0; at < len; at++)
                for (int bit = 0; bit < 8; bit++) {
                        uint8_t *out;
                        size_t out_len;
                        s[at] ^= (uint8_t) (1 << bit);
                        int r = read_partial(s, len, key1, CTX, SEAL_NO_LIMIT, &out, &out_len, NULL,
                                             0);
                        s[at] ^= (uint8_t) (1 << bit);
                        size_t allowed = at < l.header_len ? 0 : allowed_before(&l, at, chunk);
                        bool code = r == -EBADMSG || (r == -EPERM && at >= ctx_from && at < ctx_to);
                        if (!code || out_len != allowed || memcmp(out, in, out_len) != 0) {
                                if (bad++ < 5)
                                        printf("#   flip byte %zu bit %d: %d, %zu bytes out\n", at,
                                               bit, r, out_len);
                        }
                        tried++;
                        free(out);
                }
        ok(bad == 0 && tried == len * 8,
           "%s, %zu chunks: all %zu single-bit flips refused, only earlier chunks written (%zu "
           "wrong)",
           z ? "zstd" : "plain", l.n_chunks, tried, bad);

        bad = 0;
        for (size_t cut = 0; cut < len; cut++) {
                uint8_t *out;
                size_t out_len;
                int r = read_partial(s, cut, key1, CTX, SEAL_NO_LIMIT, &out, &out_len, NULL, 0);
                if (r != -EBADMSG || out_len != allowed_before(&l, cut, chunk) ||
                    memcmp(out, in, out_len) != 0) {
                        if (bad++ < 5)
                                printf("#   cut at %zu: %d, %zu bytes out\n", cut, r, out_len);
                }
                free(out);
        }
        ok(bad == 0, "%s: truncation at each of %zu offsets refused, only whole chunks written",
           z ? "zstd" : "plain", len);
        free(in);
        free(s);
}

static void chunk_games(bool z) {
        const uint32_t chunk = 16;
        size_t n = 53, len, len_b, m;
        const char *zs = z ? "zstd" : "plain";
        char what[128];
        uint8_t *in = data_new(n, 5, z), *s = seal_mem(in, n, z, chunk, &len);
        uint8_t *b = seal_mem(in, n, z, chunk, &len_b); /* same everything, another salt */
        layout l, lb;
        layout_of(s, len, &l);
        layout_of(b, len_b, &lb);
        if (l.n_chunks != 4 || lb.n_chunks != 4)
                abort();
#define PART(f, lay, i) (f) + (lay).start[i], (lay).end[i] - (lay).start[i]
        const uint8_t *p[8];
        size_t pl[8];
        uint8_t *t;
#define BUILD(...)                                                                                 \
        do {                                                                                       \
                struct {                                                                           \
                        const uint8_t *ptr;                                                        \
                        size_t len;                                                                \
                } parts_[] = { __VA_ARGS__ };                                                      \
                for (size_t i_ = 0; i_ < ELEMENTSOF(parts_); i_++) {                               \
                        p[i_] = parts_[i_].ptr;                                                    \
                        pl[i_] = parts_[i_].len;                                                   \
                }                                                                                  \
                t = join_parts(&m, ELEMENTSOF(parts_), p, pl);                                     \
        } while (0)
#define HDR(f, lay) (f), (lay).header_len

        BUILD({ HDR(s, l) }, { PART(s, l, 1) }, { PART(s, l, 0) }, { PART(s, l, 2) },
              { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: chunks 0 and 1 swapped", zs);
        refused(t, m, key1, CTX, -EBADMSG, 0, in, what);
        free(t);
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 1) }, { PART(s, l, 1) },
              { PART(s, l, 2) }, { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: chunk 1 duplicated", zs);
        refused(t, m, key1, CTX, -EBADMSG, 2 * chunk, in, what);
        free(t);
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 2) }, { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: chunk 1 dropped", zs);
        refused(t, m, key1, CTX, -EBADMSG, chunk, in, what);
        free(t);
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 1) }, { PART(s, l, 2) });
        snprintf(what, sizeof what, "%s: the final chunk dropped", zs);
        refused(t, m, key1, CTX, -EBADMSG, 3 * chunk, in, what);
        free(t);
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: the final chunk moved up to index 1", zs);
        refused(t, m, key1, CTX, -EBADMSG, chunk, in, what);
        free(t);
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 1) }, { PART(s, l, 2) },
              { PART(s, l, 3) }, { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: the final chunk twice", zs);
        refused(t, m, key1, CTX, -EBADMSG, 3 * chunk, in, what);
        free(t);
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(b, lb, 1) }, { PART(s, l, 2) },
              { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: chunk 1 from another file of the same key and context", zs);
        refused(t, m, key1, CTX, -EBADMSG, chunk, in, what);
        free(t);
        BUILD({ HDR(b, lb) }, { PART(s, l, 0) }, { PART(s, l, 1) }, { PART(s, l, 2) },
              { PART(s, l, 3) });
        snprintf(what, sizeof what, "%s: the header of another file", zs);
        refused(t, m, key1, CTX, -EBADMSG, 0, in, what);
        free(t);
        BUILD({ s, len }, { (const uint8_t *) "", 1 });
        snprintf(what, sizeof what, "%s: one byte after the final chunk", zs);
        refused(t, m, key1, CTX, -EBADMSG, 3 * chunk, in, what);
        free(t);
        BUILD({ s, len }, { b, len_b });
        snprintf(what, sizeof what, "%s: two sealed files concatenated", zs);
        refused(t, m, key1, CTX, -EBADMSG, 3 * chunk, in, what);
        free(t);

        /* chunk 1 claims to be final, the rest cut: a truncation dressed up */
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 1) });
        t[l.start[1]] |= 0x80;
        snprintf(what, sizeof what, "%s: chunk 1 marked final, the rest dropped", zs);
        refused(t, m, key1, CTX, -EBADMSG, chunk, in, what);
        free(t);
        /* the final chunk marked not final, with a copy of it after */
        BUILD({ HDR(s, l) }, { PART(s, l, 0) }, { PART(s, l, 1) }, { PART(s, l, 2) },
              { PART(s, l, 3) });
        t[l.start[3]] &= 0x7f;
        snprintf(what, sizeof what, "%s: the final chunk marked not final", zs);
        refused(t, m, key1, CTX, -EBADMSG, 3 * chunk, in, what);
        free(t);
#undef BUILD
#undef PART
#undef HDR
        free(in);
        free(s);
        free(b);
}

static void header_games(void) {
        size_t len, len_z;
        uint8_t *in = data_new(40, 3, false), *s = seal_mem(in, 40, false, 16, &len);
        uint8_t *sz = seal_mem(in, 40, true, 16, &len_z);
        uint8_t *t = malloc(MAX(len, len_z) + 64);
        struct {
                size_t at;
                uint8_t value;
                bool zstd;
                const char *what;
        } const games[] = {
                { 7, '2', false, "magic HUTCHSL2" },
                { 8, 2, false, "version 2" },
                { 8, 0, false, "version 0" },
                { 9, 1, false, "plain file flagged zstd" },
                { 9, 0, true, "zstd file flagged plain" },
                { 9, 2, false, "an unknown flag" },
                { 9, 0x81, true, "zstd and an unknown flag" },
                { 13, 32, false, "chunk size 16 -> 32, plain" },
                { 13, 32, true, "chunk size 16 -> 32, zstd" },
                { 13, 17, true, "chunk size 16 -> 17, zstd" },
                { 13, 8, false, "chunk size 8 (below the minimum)" },
                { 10, 0x01, false, "chunk size 16 MiB + 16 (above the maximum)" },
                { 10, 0x80, true, "chunk size 2^31 + 16" },
                { 14, 0, false, "salt changed" },
                { 29, 0xff, true, "last salt byte changed" },
                { 30, 0, false, "context length 0" },
                { 31, 0x01, false, "a control byte in the context" },
        };
        for (size_t i = 0; i < ELEMENTSOF(games); i++) {
                size_t n = games[i].zstd ? len_z : len;
                memcpy(t, games[i].zstd ? sz : s, n);
                if (t[games[i].at] == games[i].value)
                        t[games[i].at] ^= 0x55;
                else
                        t[games[i].at] = games[i].value;
                refused(t, n, key1, CTX, -EBADMSG, 0, NULL, games[i].what);
        }
        /* the context length changed: shorter and longer contexts, both
         * matching what the reader expects, cannot authenticate */
        memcpy(t, s, len);
        t[30] = (uint8_t) strlen("team:12 snapshot:snap_ab");
        refused(t, len, key1, "team:12 snapshot:snap_ab", -EBADMSG, 0, NULL,
                "context length one shorter, read with the shorter context");
        memcpy(t, s, 31 + strlen(CTX));
        memcpy(t + 31 + strlen(CTX), "X", 1);
        memcpy(t + 32 + strlen(CTX), s + 31 + strlen(CTX), len - 31 - strlen(CTX));
        t[30]++;
        refused(t, len + 1, key1, CTX "X", -EBADMSG, 0, NULL,
                "context length one longer, read with the longer context");
        free(t);
        free(in);
        free(s);
        free(sz);
}

/* ------------------------------------------------------------- bombs and garbage */

static void test_bomb(void) {
        const size_t n = 64 * MIB;
        int zeros = memfd_create("zeros", MFD_CLOEXEC);
        int sealed = memfd_create("sealed", MFD_CLOEXEC);
        uint64_t plain = 0;
        char why[256] = "";
        if (zeros < 0 || sealed < 0 || ftruncate(zeros, (off_t) n) < 0)
                abort();
        int r = seal_write_fd(zeros, sealed, key1, CTX, true, &plain, why, sizeof why);
        off_t size = lseek(sealed, 0, SEEK_END);
        ok(r == 0 && plain == n && size > 0 && size < 64 * 1024,
           "64 MiB of zeros seal into %lld bytes (got %d %s)", (long long) size, r, why);

        size_t len;
        uint8_t *s = fd_contents(sealed, &len);
        static const struct {
                uint64_t max;
                int code;
                size_t out;
        } limits[] = {
                { 0, -E2BIG, 0 },
                { MIB - 1, -E2BIG, 0 },
                { MIB, -E2BIG, MIB },
                { 3 * MIB + 7, -E2BIG, 3 * MIB },
                { 64 * MIB - 1, -E2BIG, 63 * MIB },
                { 64 * MIB, 0, 64 * MIB },
                { SEAL_NO_LIMIT, 0, 64 * MIB },
        };
        for (size_t i = 0; i < ELEMENTSOF(limits); i++) {
                uint8_t *out = NULL;
                size_t out_len = 0;
                why[0] = 0;
                r = read_partial(s, len, key1, CTX, limits[i].max, &out, &out_len, why, sizeof why);
                bool zero = true;
                for (size_t j = 0; j < out_len && zero; j++)
                        zero = out[j] == 0;
                ok(r == limits[i].code && out_len == limits[i].out && zero &&
                           (r == 0 || strstr(why, "more than")),
                   "max_plain_bytes %llu: %d with %zu bytes out (got %d, %zu: %s)",
                   (unsigned long long) limits[i].max, limits[i].code, limits[i].out, r, out_len,
                   why);
                free(out);
        }
        uint8_t *o = NULL;
        size_t ol = 0;
        r = seal_read_buf(s, len, key1, CTX, 5 * MIB, &o, &ol, NULL, 0);
        ok(r == -E2BIG && !o, "memory: the bomb stops at 5 MiB with nothing returned (got %d)", r);

        /* the empty plaintext fits a limit of 0 */
        uint8_t *e = seal_mem("", 0, true, 16, &len);
        r = seal_read_buf(e, len, key1, CTX, 0, &o, &ol, NULL, 0);
        ok(r == 0 && ol == 0, "an empty plaintext is read with max_plain_bytes 0 (got %d)", r);
        free(o);
        free(e);
        free(s);
        close(zeros);
        close(sealed);
}

static void test_garbage(void) {
        size_t len;
        uint8_t *s = seal_mem("abc", 3, false, 16, &len), *t;
        uint8_t *rnd = data_new(4096, 42, false);
        char why[256];

        refused((const uint8_t *) "", 0, key1, CTX, -EBADMSG, 0, NULL, "an empty input");
        refused((const uint8_t *) "HUTCHSL1", 8, key1, CTX, -EBADMSG, 0, NULL, "the magic alone");
        refused(rnd, 4096, key1, CTX, -EBADMSG, 0, NULL, "4 KiB of random bytes");
        memcpy(rnd, s, 31 + strlen(CTX));
        refused(rnd, 4096, key1, CTX, -EBADMSG, 0, NULL, "a valid header, then random bytes");
        refused(s, 31 + strlen(CTX), key1, CTX, -EBADMSG, 0, NULL, "a header without chunks");

        /* forged lengths: huge, and the largest a zstd chunk may have, with
         * little data after */
        static const uint32_t words[] = { 0x7fffffff, 0xffffffff, 0, 0x80000000 };
        t = malloc(len + 64);
        for (int z = 0; z <= 1; z++)
                for (size_t i = 0; i < ELEMENTSOF(words); i++) {
                        memcpy(t, s, 31 + strlen(CTX));
                        t[9] = (uint8_t) z;
                        size_t o = 31 + strlen(CTX);
                        t[o] = (uint8_t) (words[i] >> 24);
                        t[o + 1] = (uint8_t) (words[i] >> 16);
                        t[o + 2] = (uint8_t) (words[i] >> 8);
                        t[o + 3] = (uint8_t) words[i];
                        memset(t + o + 4, 0xaa, 40);
                        snprintf(why, sizeof why, "%s: a chunk length word 0x%08x",
                                 z ? "zstd" : "plain", words[i]);
                        refused(t, o + 44, key1, CTX, -EBADMSG, 0, NULL, why);
                }
        free(t);

        /* the largest chunk size, and a zstd chunk that claims 16 MiB of
         * ciphertext: the reader runs out of input, not of memory */
        t = malloc(31 + strlen(CTX) + 4 + 1000);
        memcpy(t, s, 31 + strlen(CTX));
        t[9] = SEAL_FLAG_ZSTD;
        t[10] = SEAL_CHUNK_MAX >> 24;
        t[11] = (uint8_t) (SEAL_CHUNK_MAX >> 16);
        t[12] = t[13] = 0;
        size_t o = 31 + strlen(CTX);
        t[o] = 1;
        t[o + 1] = t[o + 2] = t[o + 3] = 0;
        memset(t + o + 4, 0x55, 1000);
        refused(t, o + 4 + 1000, key1, CTX, -EBADMSG, 0, NULL,
                "zstd: a chunk of 16 MiB announced, 1000 bytes there");
        free(t);

        /* garbage through a pipe */
        pid_t pid;
        int in = pipe_feeder(rnd, 4096, &pid), out = memfd_create("out", MFD_CLOEXEC);
        int r = seal_read_fd(in, out, key1, CTX, SEAL_NO_LIMIT, NULL, 0);
        ok(r == -EBADMSG && lseek(out, 0, SEEK_END) == 0, "a pipe of garbage: -EBADMSG (got %d)", r);
        close(in);
        close(out);
        reaped_ok(pid);
        free(rnd);
        free(s);
}

static void test_io_errors(void) {
        size_t len;
        uint8_t *s = seal_mem("abc", 3, false, 16, &len);
        int in = memfd_with(s, len), ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
        char why[256] = "";
        int r = seal_read_fd(in, ro, key1, CTX, SEAL_NO_LIMIT, why, sizeof why);
        ok(r == -EBADF && strstr(why, "writing"), "an output that cannot be written: -EBADF (%s)",
           why);
        r = seal_write_fd(ro, ro, key1, CTX, false, NULL, why, sizeof why);
        ok(r == -EBADF, "sealing into a read-only fd: -EBADF (got %d: %s)", r, why);
        int wo = open("/dev/null", O_WRONLY | O_CLOEXEC);
        r = seal_write_fd(wo, wo, key1, CTX, false, NULL, why, sizeof why);
        ok(r == -EBADF && strstr(why, "reading"), "sealing from a write-only fd: -EBADF (%s)", why);
        r = seal_read_fd(wo, wo, key1, CTX, SEAL_NO_LIMIT, why, sizeof why);
        ok(r == -EBADF, "reading from a write-only fd: -EBADF (got %d)", r);
        close(in);
        close(ro);
        close(wo);
        free(s);
}

int main(void) {
        signal(SIGPIPE, SIG_IGN);
        test_format();
        test_spec_writer();
        test_round_trips();
        test_peek();
        test_keys_and_contexts();
        flips_and_cuts(false);
        flips_and_cuts(true);
        chunk_games(false);
        chunk_games(true);
        header_games();
        test_bomb();
        test_garbage();
        test_io_errors();
        return tap_done();
}
