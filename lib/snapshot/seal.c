/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sealed streams (seal.h has the format and the contract). One writer and
 * one reader, each over a small I/O interface with a file-descriptor and a
 * memory implementation, so the fd and buffer forms cannot drift apart.
 */
#include <errno.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "snapshot/seal.h"
#include "util/macro.h"

#define NONCE_LEN 12
#define AAD_LEN (SHA256_DIGEST_LENGTH + 8 + 1)
#define FRAME_HEAD 4
#define HKDF_LABEL "hutch seal v1"
/* The reader's ciphertext buffer starts at this size and doubles while the
 * input keeps coming, so a forged length field costs no memory by itself. */
#define READ_GROW_MIN (64u << 10)

/* ---------------------------------------------------------------- errors */

static int why_set(char *why, size_t whylen, int code, const char *fmt, ...) _printf_(4, 5);
static int why_set(char *why, size_t whylen, int code, const char *fmt, ...) {
        if (why && whylen > 0) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(why, whylen, fmt, ap);
                va_end(ap);
        }
        return code;
}

/* ---------------------------------------------------------------- I/O */

/* read() fills buf up to n bytes and is short only at EOF (returns the count,
 * or -errno); write() writes all of buf (0 or -errno). */
typedef struct seal_io seal_io;
struct seal_io {
        ssize_t (*read)(seal_io *io, void *buf, size_t n);
        int (*write)(seal_io *io, const void *buf, size_t n);
        int in_fd, out_fd;
        const uint8_t *in;
        size_t in_len, in_off;
        uint8_t *out;
        size_t out_len, out_cap;
};

static ssize_t fd_read(seal_io *io, void *buf, size_t n) {
        uint8_t *p = buf;
        size_t got = 0;
        while (got < n) {
                ssize_t k = read(io->in_fd, p + got, n - got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return negative_errno();
                if (k == 0)
                        break;
                got += (size_t) k;
        }
        return (ssize_t) got;
}

static int fd_write(seal_io *io, const void *buf, size_t n) {
        const uint8_t *p = buf;
        while (n > 0) {
                ssize_t k = write(io->out_fd, p, n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return negative_errno();
                if (k == 0)
                        return -EIO;
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

static ssize_t mem_read(seal_io *io, void *buf, size_t n) {
        size_t k = MIN(n, io->in_len - io->in_off);
        if (k > 0)
                memcpy(buf, io->in + io->in_off, k);
        io->in_off += k;
        return (ssize_t) k;
}

static int mem_write(seal_io *io, const void *buf, size_t n) {
        if (n > SIZE_MAX - io->out_len)
                return -ENOMEM;
        if (io->out_len + n > io->out_cap) {
                size_t cap = MAX(io->out_cap, (size_t) 4096);
                while (cap < io->out_len + n)
                        cap = cap > SIZE_MAX / 2 ? io->out_len + n : cap * 2;
                uint8_t *p = realloc(io->out, cap);
                if (!p)
                        return -ENOMEM;
                io->out = p;
                io->out_cap = cap;
        }
        if (n > 0)
                memcpy(io->out + io->out_len, buf, n);
        io->out_len += n;
        return 0;
}

/* ---------------------------------------------------------------- crypto */

static void cctx_freep(ZSTD_CCtx **z) {
        ZSTD_freeCCtx(*z);
}
static void dctx_freep(ZSTD_DCtx **z) {
        ZSTD_freeDCtx(*z);
}
/* Buffers that held plaintext or keys are wiped before they are freed. */
typedef struct secret_buf {
        uint8_t *p;
        size_t len;
} secret_buf;
static void secret_buf_freep(secret_buf *b) {
        if (b->p)
                OPENSSL_clear_free(b->p, b->len);
}

static void put_be32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t) (v >> 24);
        p[1] = (uint8_t) (v >> 16);
        p[2] = (uint8_t) (v >> 8);
        p[3] = (uint8_t) v;
}

static uint32_t get_be32(const uint8_t *p) {
        return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

static void put_be64(uint8_t *p, uint64_t v) {
        put_be32(p, (uint32_t) (v >> 32));
        put_be32(p + 4, (uint32_t) v);
}

/* 1..SEAL_CONTEXT_MAX printable ASCII bytes: it is shown in listings and
 * logs, and compared as bytes. */
static bool context_valid(const char *s, size_t n) {
        if (n < 1 || n > SEAL_CONTEXT_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (s[i] < 0x20 || s[i] > 0x7e)
                        return false;
        return true;
}

static bool context_arg_valid(const char *s, size_t *ret_len) {
        if (!s)
                return false;
        size_t n = strnlen(s, SEAL_CONTEXT_MAX + 1);
        if (!context_valid(s, n))
                return false;
        *ret_len = n;
        return true;
}

typedef struct seal_header {
        uint8_t flags;
        uint32_t chunk_size;
        size_t context_len;
} seal_header;

/* The fixed part of a header: everything but the context bytes. */
static int header_parse_fixed(const uint8_t *h, seal_header *ret, char *why, size_t whylen) {
        if (memcmp(h, SEAL_MAGIC, SEAL_MAGIC_LEN) != 0)
                return why_set(why, whylen, -EBADMSG, "not a sealed stream (bad magic)");
        if (h[8] != SEAL_VERSION)
                return why_set(why, whylen, -EBADMSG, "sealed stream version %u is not supported",
                               h[8]);
        if (h[9] & ~SEAL_FLAG_ZSTD)
                return why_set(why, whylen, -EBADMSG, "sealed stream has unknown flags 0x%02x", h[9]);
        uint32_t c = get_be32(h + 10);
        if (c < SEAL_CHUNK_MIN || c > SEAL_CHUNK_MAX)
                return why_set(why, whylen, -EBADMSG, "sealed stream has chunk size %u", c);
        if (h[30] == 0)
                return why_set(why, whylen, -EBADMSG, "sealed stream has an empty context");
        ret->flags = h[9];
        ret->chunk_size = c;
        ret->context_len = h[30];
        return 0;
}

static size_t header_build(uint8_t h[SEAL_HEADER_MAX], bool compress, uint32_t chunk_size,
                           const uint8_t salt[SEAL_SALT_LEN], const char *context, size_t n) {
        memcpy(h, SEAL_MAGIC, SEAL_MAGIC_LEN);
        h[8] = SEAL_VERSION;
        h[9] = compress ? SEAL_FLAG_ZSTD : 0;
        put_be32(h + 10, chunk_size);
        memcpy(h + 14, salt, SEAL_SALT_LEN);
        h[30] = (uint8_t) n;
        memcpy(h + SEAL_HEADER_FIXED, context, n);
        return SEAL_HEADER_FIXED + n;
}

static int file_key(const uint8_t master[SEAL_KEY_LEN], const uint8_t salt[SEAL_SALT_LEN],
                    const char *context, size_t n, uint8_t key[SEAL_KEY_LEN]) {
        uint8_t info[sizeof HKDF_LABEL - 1 + SEAL_CONTEXT_MAX];
        size_t info_len = sizeof HKDF_LABEL - 1 + n;
        memcpy(info, HKDF_LABEL, sizeof HKDF_LABEL - 1);
        memcpy(info + sizeof HKDF_LABEL - 1, context, n);

        EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
        EVP_KDF_CTX *kctx = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
        OSSL_PARAM params[] = {
                OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *) "SHA256", 0),
                OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *) master, SEAL_KEY_LEN),
                OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *) salt, SEAL_SALT_LEN),
                OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, info_len),
                OSSL_PARAM_construct_end(),
        };
        bool good = kctx && EVP_KDF_derive(kctx, key, SEAL_KEY_LEN, params) == 1;
        EVP_KDF_CTX_free(kctx);
        EVP_KDF_free(kdf);
        return good ? 0 : -EIO;
}

/* The state both directions share: the cipher, keyed once per file, and the
 * header's hash that goes into every chunk's AAD. */
typedef struct sealer {
        EVP_CIPHER_CTX *c;
        uint8_t header_hash[SHA256_DIGEST_LENGTH];
} sealer;

static void sealer_done(sealer *s) {
        EVP_CIPHER_CTX_free(s->c);
        s->c = NULL;
}

static int sealer_init(sealer *s, bool encrypt, const uint8_t master[SEAL_KEY_LEN],
                       const uint8_t *header, size_t header_len) {
        const uint8_t *salt = header + 14;
        const char *context = (const char *) header + SEAL_HEADER_FIXED;
        uint8_t key[SEAL_KEY_LEN];
        int r = file_key(master, salt, context, header_len - SEAL_HEADER_FIXED, key);
        if (r < 0)
                return r;
        SHA256(header, header_len, s->header_hash);
        s->c = EVP_CIPHER_CTX_new();
        bool good = s->c &&
                (encrypt ? EVP_EncryptInit_ex(s->c, EVP_aes_256_gcm(), NULL, key, NULL)
                         : EVP_DecryptInit_ex(s->c, EVP_aes_256_gcm(), NULL, key, NULL)) == 1;
        OPENSSL_cleanse(key, sizeof key);
        return good ? 0 : -EIO;
}

static void chunk_nonce_aad(const sealer *s, uint64_t index, bool final, uint8_t nonce[NONCE_LEN],
                            uint8_t aad[AAD_LEN]) {
        memset(nonce, 0, 4);
        put_be64(nonce + 4, index);
        memcpy(aad, s->header_hash, SHA256_DIGEST_LENGTH);
        put_be64(aad + SHA256_DIGEST_LENGTH, index);
        aad[SHA256_DIGEST_LENGTH + 8] = final ? 1 : 0;
}

/* in -> out (may be the same buffer), tag after it. */
static int chunk_encrypt(sealer *s, uint64_t index, bool final, const uint8_t *in, size_t n,
                         uint8_t *out, uint8_t tag[SEAL_TAG_LEN]) {
        uint8_t nonce[NONCE_LEN], aad[AAD_LEN];
        int l = 0;
        chunk_nonce_aad(s, index, final, nonce, aad);
        bool good = EVP_EncryptInit_ex(s->c, NULL, NULL, NULL, nonce) == 1 &&
                EVP_EncryptUpdate(s->c, NULL, &l, aad, AAD_LEN) == 1 &&
                (n == 0 || (EVP_EncryptUpdate(s->c, out, &l, in, (int) n) == 1 && (size_t) l == n)) &&
                EVP_EncryptFinal_ex(s->c, out + n, &l) == 1 && l == 0 &&
                EVP_CIPHER_CTX_ctrl(s->c, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_LEN, tag) == 1;
        return good ? 0 : -EIO;
}

/* In place. OpenSSL's GCM writes plaintext before it checks the tag: buf is
 * not to be used unless this returns 0. */
static bool chunk_decrypt(sealer *s, uint64_t index, bool final, uint8_t *buf, size_t n,
                          const uint8_t tag[SEAL_TAG_LEN]) {
        uint8_t nonce[NONCE_LEN], aad[AAD_LEN];
        int l = 0;
        chunk_nonce_aad(s, index, final, nonce, aad);
        return EVP_DecryptInit_ex(s->c, NULL, NULL, NULL, nonce) == 1 &&
                EVP_DecryptUpdate(s->c, NULL, &l, aad, AAD_LEN) == 1 &&
                (n == 0 || (EVP_DecryptUpdate(s->c, buf, &l, buf, (int) n) == 1 && (size_t) l == n)) &&
                EVP_CIPHER_CTX_ctrl(s->c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_LEN, (void *) tag) == 1 &&
                EVP_DecryptFinal_ex(s->c, buf + n, &l) == 1 && l == 0;
}

/* ---------------------------------------------------------------- writer */

static int seal_stream(seal_io *io, const uint8_t master[SEAL_KEY_LEN], const char *context,
                       bool compress, uint32_t chunk_size, uint64_t *ret_plain_bytes, char *why,
                       size_t whylen) {
        size_t context_len;
        if (!master || !context_arg_valid(context, &context_len))
                return why_set(why, whylen, -EINVAL,
                               "a seal context is 1..%d bytes of printable ASCII", SEAL_CONTEXT_MAX);
        if (chunk_size < SEAL_CHUNK_MIN || chunk_size > SEAL_CHUNK_MAX)
                return why_set(why, whylen, -EINVAL, "chunk size %u is out of bounds", chunk_size);

        uint8_t salt[SEAL_SALT_LEN], header[SEAL_HEADER_MAX];
        if (RAND_bytes(salt, sizeof salt) != 1)
                return why_set(why, whylen, -EIO, "no randomness for the salt");
        size_t header_len = header_build(header, compress, chunk_size, salt, context, context_len);

        _cleanup_(sealer_done) sealer s = {};
        int r = sealer_init(&s, true, master, header, header_len);
        if (r < 0)
                return why_set(why, whylen, r, "setting up the cipher failed");

        _cleanup_(cctx_freep) ZSTD_CCtx *cctx = NULL;
        size_t payload_max = chunk_size;
        if (compress) {
                cctx = ZSTD_createCCtx();
                if (!cctx)
                        return why_set(why, whylen, -ENOMEM, "out of memory");
                payload_max = MAX(payload_max, ZSTD_compressBound(chunk_size));
        }
        _cleanup_(secret_buf_freep) secret_buf plain = { malloc(chunk_size), chunk_size };
        _cleanup_(secret_buf_freep) secret_buf frame = {
                malloc(FRAME_HEAD + payload_max + SEAL_TAG_LEN),
                FRAME_HEAD + payload_max + SEAL_TAG_LEN,
        };
        if (!plain.p || !frame.p)
                return why_set(why, whylen, -ENOMEM, "out of memory");

        r = io->write(io, header, header_len);
        if (r < 0)
                return why_set(why, whylen, r, "writing the sealed stream: %s", strerror(-r));

        uint64_t total = 0;
        for (uint64_t i = 0;; i++) {
                ssize_t n = io->read(io, plain.p, chunk_size);
                if (n < 0)
                        return why_set(why, whylen, (int) n, "reading the input: %s",
                                       strerror((int) -n));
                /* A full chunk cannot know whether EOF follows: it is sealed as
                 * not final, and a stream of k*C bytes ends with an empty one. */
                bool final = (size_t) n < chunk_size;
                const uint8_t *payload = plain.p;
                size_t len = (size_t) n;
                if (compress) {
                        len = ZSTD_compressCCtx(cctx, frame.p + FRAME_HEAD, payload_max, plain.p,
                                                (size_t) n, SEAL_ZSTD_LEVEL);
                        if (ZSTD_isError(len))
                                return why_set(why, whylen, -EIO, "zstd: %s", ZSTD_getErrorName(len));
                        payload = frame.p + FRAME_HEAD;
                }
                r = chunk_encrypt(&s, i, final, payload, len, frame.p + FRAME_HEAD,
                                  frame.p + FRAME_HEAD + len);
                if (r < 0)
                        return why_set(why, whylen, r, "encrypting chunk %llu failed",
                                       (unsigned long long) i);
                put_be32(frame.p, (uint32_t) len | (final ? SEAL_FRAME_FINAL : 0));
                r = io->write(io, frame.p, FRAME_HEAD + len + SEAL_TAG_LEN);
                if (r < 0)
                        return why_set(why, whylen, r, "writing the sealed stream: %s", strerror(-r));
                total += (uint64_t) n;
                if (final)
                        break;
        }
        if (ret_plain_bytes)
                *ret_plain_bytes = total;
        return 0;
}

/* ---------------------------------------------------------------- reader */

/* Exactly n bytes into *buf, growing it (up to n) only as input arrives.
 * Returns 0, -EBADMSG at a premature EOF, or -errno. */
static int read_grow(seal_io *io, secret_buf *buf, size_t n) {
        size_t got = 0;
        while (got < n) {
                if (buf->len < n && got == buf->len) {
                        size_t cap = MIN(n, MAX(buf->len * 2, (size_t) READ_GROW_MIN));
                        uint8_t *p = malloc(cap);
                        if (!p)
                                return -ENOMEM;
                        if (got > 0)
                                memcpy(p, buf->p, got);
                        secret_buf_freep(buf);
                        buf->p = p;
                        buf->len = cap;
                }
                size_t want = MIN(n, buf->len) - got;
                ssize_t k = io->read(io, buf->p + got, want);
                if (k < 0)
                        return (int) k;
                got += (size_t) k;
                if ((size_t) k < want)
                        return -EBADMSG;
        }
        return 0;
}

static int unseal_stream(seal_io *io, const uint8_t master[SEAL_KEY_LEN],
                         const char *expected_context, uint64_t max_plain_bytes, char *why,
                         size_t whylen) {
        size_t expected_len;
        if (!master || !context_arg_valid(expected_context, &expected_len))
                return why_set(why, whylen, -EINVAL,
                               "a seal context is 1..%d bytes of printable ASCII", SEAL_CONTEXT_MAX);

        uint8_t header[SEAL_HEADER_MAX];
        seal_header h;
        ssize_t k = io->read(io, header, SEAL_HEADER_FIXED);
        if (k < 0)
                return why_set(why, whylen, (int) k, "reading the sealed stream: %s",
                               strerror((int) -k));
        if (k < SEAL_HEADER_FIXED)
                return why_set(why, whylen, -EBADMSG, "not a sealed stream (%zd bytes)", k);
        int r = header_parse_fixed(header, &h, why, whylen);
        if (r < 0)
                return r;
        k = io->read(io, header + SEAL_HEADER_FIXED, h.context_len);
        if (k < 0)
                return why_set(why, whylen, (int) k, "reading the sealed stream: %s",
                               strerror((int) -k));
        if ((size_t) k < h.context_len)
                return why_set(why, whylen, -EBADMSG, "sealed stream ends in its header");
        const char *context = (const char *) header + SEAL_HEADER_FIXED;
        if (!context_valid(context, h.context_len))
                return why_set(why, whylen, -EBADMSG, "sealed stream has a malformed context");
        if (h.context_len != expected_len || memcmp(context, expected_context, expected_len) != 0)
                return why_set(why, whylen, -EPERM, "sealed stream is for \"%.*s\", not \"%s\"",
                               (int) h.context_len, context, expected_context);

        _cleanup_(sealer_done) sealer s = {};
        r = sealer_init(&s, false, master, header, SEAL_HEADER_FIXED + h.context_len);
        if (r < 0)
                return why_set(why, whylen, r, "setting up the cipher failed");

        bool compressed = h.flags & SEAL_FLAG_ZSTD;
        size_t payload_max = compressed ? ZSTD_compressBound(h.chunk_size) : h.chunk_size;
        _cleanup_(dctx_freep) ZSTD_DCtx *dctx = NULL;
        _cleanup_(secret_buf_freep) secret_buf frame = {};
        _cleanup_(secret_buf_freep) secret_buf plain = {};
        uint64_t total = 0;

        for (uint64_t i = 0;; i++) {
                uint8_t head[FRAME_HEAD];
                k = io->read(io, head, sizeof head);
                if (k < 0)
                        return why_set(why, whylen, (int) k, "reading the sealed stream: %s",
                                       strerror((int) -k));
                if (k == 0)
                        return why_set(why, whylen, -EBADMSG,
                                       "sealed stream is truncated: it ends before its final chunk");
                if (k < FRAME_HEAD)
                        return why_set(why, whylen, -EBADMSG,
                                       "sealed stream is truncated in chunk %llu",
                                       (unsigned long long) i);
                uint32_t word = get_be32(head);
                bool final = word & SEAL_FRAME_FINAL;
                size_t len = word & ~SEAL_FRAME_FINAL;
                /* Bounds before anything is read or allocated for the chunk. */
                bool fits = compressed ? len >= 1 && len <= payload_max
                                       : (final ? len < h.chunk_size : len == h.chunk_size);
                if (!fits)
                        return why_set(why, whylen, -EBADMSG,
                                       "sealed stream chunk %llu has length %zu",
                                       (unsigned long long) i, len);

                r = read_grow(io, &frame, len + SEAL_TAG_LEN);
                if (r == -EBADMSG)
                        return why_set(why, whylen, r, "sealed stream is truncated in chunk %llu",
                                       (unsigned long long) i);
                if (r < 0)
                        return why_set(why, whylen, r, "reading the sealed stream: %s", strerror(-r));
                if (!chunk_decrypt(&s, i, final, frame.p, len, frame.p + len))
                        return why_set(why, whylen, -EBADMSG,
                                       "sealed stream chunk %llu does not authenticate "
                                       "(tampered, reordered, or the wrong key)",
                                       (unsigned long long) i);

                /* Authenticated from here on: the header (chunk size) too. */
                const uint8_t *out = frame.p;
                size_t out_len = len;
                if (compressed) {
                        if (!plain.p) {
                                dctx = ZSTD_createDCtx();
                                plain.p = malloc(h.chunk_size);
                                plain.len = h.chunk_size;
                                if (!dctx || !plain.p)
                                        return why_set(why, whylen, -ENOMEM, "out of memory");
                        }
                        /* Into a buffer of one chunk: a frame that says more
                         * fails here (a bound per chunk); max_plain_bytes
                         * bounds the sum. */
                        out_len = ZSTD_decompressDCtx(dctx, plain.p, h.chunk_size, frame.p, len);
                        if (ZSTD_isError(out_len))
                                return why_set(why, whylen, -EBADMSG,
                                               "sealed stream chunk %llu does not decompress: %s",
                                               (unsigned long long) i, ZSTD_getErrorName(out_len));
                        out = plain.p;
                }
                if (final ? out_len >= h.chunk_size : out_len != h.chunk_size)
                        return why_set(why, whylen, -EBADMSG,
                                       "sealed stream chunk %llu holds %zu bytes",
                                       (unsigned long long) i, out_len);
                if (out_len > max_plain_bytes - total)
                        return why_set(why, whylen, -E2BIG,
                                       "sealed stream holds more than %llu bytes",
                                       (unsigned long long) max_plain_bytes);
                if (final) {
                        uint8_t extra;
                        k = io->read(io, &extra, 1);
                        if (k < 0)
                                return why_set(why, whylen, (int) k,
                                               "reading the sealed stream: %s", strerror((int) -k));
                        if (k > 0)
                                return why_set(why, whylen, -EBADMSG,
                                               "sealed stream has data after its final chunk");
                }
                r = io->write(io, out, out_len);
                if (r < 0)
                        return why_set(why, whylen, r, "writing the plaintext: %s", strerror(-r));
                total += out_len;
                if (final)
                        return 0;
        }
}

/* ---------------------------------------------------------------- API */

int seal_write_fd(int in_fd, int out_fd, const uint8_t master[SEAL_KEY_LEN], const char *context,
                  bool compress, uint64_t *ret_plain_bytes, char *why, size_t whylen) {
        seal_io io = { .read = fd_read, .write = fd_write, .in_fd = in_fd, .out_fd = out_fd };
        return seal_stream(&io, master, context, compress, SEAL_CHUNK_DEFAULT, ret_plain_bytes, why,
                           whylen);
}

int seal_read_fd(int in_fd, int out_fd, const uint8_t master[SEAL_KEY_LEN],
                 const char *expected_context, uint64_t max_plain_bytes, char *why, size_t whylen) {
        seal_io io = { .read = fd_read, .write = fd_write, .in_fd = in_fd, .out_fd = out_fd };
        return unseal_stream(&io, master, expected_context, max_plain_bytes, why, whylen);
}

/* Hands the output over on success, wipes it on failure (partial plaintext
 * is not returned from memory). */
static int mem_finish(seal_io *io, int r, uint8_t **ret, size_t *ret_len, char *why, size_t whylen) {
        if (r >= 0 && !io->out) {
                io->out = malloc(1);
                if (!io->out)
                        r = why_set(why, whylen, -ENOMEM, "out of memory");
        }
        if (r < 0) {
                if (io->out)
                        OPENSSL_clear_free(io->out, io->out_cap);
                return r;
        }
        *ret = io->out;
        *ret_len = io->out_len;
        return 0;
}

int seal_write_buf(const void *in, size_t len, const uint8_t master[SEAL_KEY_LEN],
                   const char *context, bool compress, uint32_t chunk_size, uint8_t **ret,
                   size_t *ret_len, char *why, size_t whylen) {
        if (!in && len > 0)
                return why_set(why, whylen, -EINVAL, "no input");
        seal_io io = { .read = mem_read, .write = mem_write, .in = in, .in_len = len };
        int r = seal_stream(&io, master, context, compress, chunk_size, NULL, why, whylen);
        return mem_finish(&io, r, ret, ret_len, why, whylen);
}

int seal_read_buf(const void *in, size_t len, const uint8_t master[SEAL_KEY_LEN],
                  const char *expected_context, uint64_t max_plain_bytes, uint8_t **ret,
                  size_t *ret_len, char *why, size_t whylen) {
        if (!in && len > 0)
                return why_set(why, whylen, -EINVAL, "no input");
        seal_io io = { .read = mem_read, .write = mem_write, .in = in, .in_len = len };
        int r = unseal_stream(&io, master, expected_context, max_plain_bytes, why, whylen);
        return mem_finish(&io, r, ret, ret_len, why, whylen);
}

int seal_peek_context(int fd, char *buf, size_t len) {
        uint8_t header[SEAL_HEADER_MAX];
        size_t got = 0, want = SEAL_HEADER_FIXED;
        seal_header h = {};
        while (got < want) {
                ssize_t k = pread(fd, header + got, want - got, (off_t) got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return negative_errno();
                if (k == 0)
                        return -EBADMSG;
                got += (size_t) k;
                if (got == SEAL_HEADER_FIXED && want == SEAL_HEADER_FIXED) {
                        int r = header_parse_fixed(header, &h, NULL, 0);
                        if (r < 0)
                                return r;
                        want += h.context_len;
                }
        }
        const char *context = (const char *) header + SEAL_HEADER_FIXED;
        if (!context_valid(context, h.context_len))
                return -EBADMSG;
        if (!buf || len <= h.context_len)
                return -ENOBUFS;
        memcpy(buf, context, h.context_len);
        buf[h.context_len] = 0;
        return (int) h.context_len;
}
