/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sealed streams: the file format of snapshot images at rest (issue #5,
 * docs/design.md §3.4). A stream of any length (a tar of a writable layer, a
 * runsc checkpoint image) is cut into chunks; each is optionally compressed
 * with zstd, then encrypted and authenticated with AES-256-GCM under a key
 * of its own for every file. A reader gets back exactly the bytes sealed,
 * or an error: a flipped bit anywhere, a truncated, reordered, duplicated,
 * dropped or spliced chunk, bytes after the end, a header copied from
 * another file, a file relabelled for another team, or the wrong master key
 * are all refused. Not protected: the context string and the sizes (roughly
 * the compressed size of every chunk) are in clear; a file can be deleted or
 * replaced by another sealed file of the same context (contexts name one
 * snapshot, so use a fresh context per file).
 *
 * Keys. The master key is 32 random bytes the daemon keeps in the data dir;
 * this code never stores it. Every file gets 16 random bytes of salt, and
 *
 *   file key = HKDF-SHA256(IKM = master key, salt = file salt,
 *                          info = "hutch seal v1" || context)     (RFC 5869)
 *
 * so a key is never used for two files (the nonces below may repeat between
 * files), and the context, which names the team ("team:12 snapshot:snap_x"),
 * makes the key per team: a file relabelled with another team's context no
 * longer authenticates.
 *
 * On-disk format, version 1. Integers are big-endian; offsets in bytes.
 *
 *   header (31 + n bytes; n = context length)
 *     0   8  magic "HUTCHSL1"
 *     8   1  version = 1
 *     9   1  flags: bit 0 (SEAL_FLAG_ZSTD) chunks are zstd frames; other
 *            bits 0
 *    10   4  chunk size C: plaintext bytes per chunk,
 *            SEAL_CHUNK_MIN <= C <= SEAL_CHUNK_MAX
 *    14  16  salt (random per file)
 *    30   1  n, 1..SEAL_CONTEXT_MAX
 *    31   n  context: printable ASCII (0x20..0x7e), no terminating NUL
 *
 *   then chunks i = 0, 1, 2, ... (at least one), each
 *     0   4  bit 31: final flag F; bits 0-30: ciphertext length L
 *     4   L  ciphertext
 *   4+L  16  GCM tag
 *
 *   The plaintext P_i of chunk i is exactly C bytes when F = 0, and 0..C-1
 *   bytes when F = 1; exactly the last chunk has F = 1 and nothing follows
 *   it. (A stream of k*C bytes therefore ends with an empty final chunk.)
 *   Without SEAL_FLAG_ZSTD the ciphertext encrypts P_i itself (L = |P_i|);
 *   with it, zstd data that decompresses to P_i (the writer makes one frame
 *   per chunk, level SEAL_ZSTD_LEVEL; 1 <= L <= ZSTD_compressBound(C)).
 *   Chunks are compressed independently, so the bound on one chunk's
 *   expansion is C.
 *
 *   AES-256-GCM per chunk, key = file key,
 *     nonce (12) = 4 zero bytes || u64 i
 *     AAD   (41) = SHA-256(header bytes) || u64 i || u8 F
 *   A counter nonce is safe because the key is never used for another file.
 *   The index in the nonce and AAD catches reordering, duplication and
 *   dropping; F in the AAD catches truncation after any chunk (a chunk sealed
 *   as not final cannot end the stream, and cannot be made final), and so,
 *   independently, does the size rule (only a final chunk is short); the
 *   header hash catches any change of the header (flags and chunk size
 *   included), and the file key, through the salt, catches chunks of
 *   another file.
 *
 * Readers check, in this order: the header's form (magic, version, flags,
 * bounds: -EBADMSG), its context against the one expected (-EPERM), then
 * for each chunk its length against the bounds above, its tag, its size
 * after decompression, max_plain_bytes, and for the final chunk that EOF
 * follows, before any of its plaintext is written. What a reader allocates
 * for a chunk before it authenticates is bounded by the input actually read
 * (at most the larger of 64 KiB and twice that), never by a length field.
 *
 * Conventions as elsewhere in lib/: >= 0 on success, -errno on failure;
 * ret_* are written only on success; why (may be NULL) gets a one-line
 * English reason on failure, safe to log (no key material, no plaintext).
 * The functions block, compress and encrypt: the daemon calls them from a
 * worker, not from its event loop (docs/style.md "The server"). Blocking file
 * descriptors only, read and written from their current offsets; reads and
 * writes are retried on EINTR; no fd is closed. No global state: threads
 * may seal and read different files at once.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SEAL_MAGIC "HUTCHSL1"
#define SEAL_MAGIC_LEN 8
#define SEAL_VERSION 1
#define SEAL_FLAG_ZSTD 0x01u
#define SEAL_KEY_LEN 32  /* the master key */
#define SEAL_SALT_LEN 16 /* per file, random */
#define SEAL_TAG_LEN 16  /* GCM tag per chunk */
#define SEAL_CONTEXT_MAX 255
#define SEAL_HEADER_FIXED 31 /* header bytes before the context */
#define SEAL_HEADER_MAX (SEAL_HEADER_FIXED + SEAL_CONTEXT_MAX)
#define SEAL_FRAME_FINAL 0x80000000u  /* in a chunk's length word */
#define SEAL_CHUNK_DEFAULT (1u << 20) /* what seal_write_fd() uses */
#define SEAL_CHUNK_MIN 16u            /* small ones are for tests */
#define SEAL_CHUNK_MAX (16u << 20)    /* bounds what a reader allocates */
#define SEAL_ZSTD_LEVEL 3
#define SEAL_NO_LIMIT UINT64_MAX /* max_plain_bytes: no limit */

/* Seal everything read from in_fd (a file, a pipe or a socket, read to EOF)
 * into out_fd, in chunks of SEAL_CHUNK_DEFAULT bytes, compressed when
 * compress is set. context: 1..SEAL_CONTEXT_MAX printable ASCII bytes,
 * stored in clear and bound into the key; name the team and the snapshot.
 * *ret_plain_bytes (may be NULL): the bytes read from in_fd.
 *
 * Returns 0; -EINVAL for a bad context or a NULL master; -EIO when OpenSSL
 * or zstd fail; -ENOMEM; or the -errno of a read or write. On failure
 * out_fd holds a partial stream, which no reader accepts (it has no final
 * chunk): write to a temporary file and rename it into place on success. */
int seal_write_fd(int in_fd, int out_fd, const uint8_t master[SEAL_KEY_LEN], const char *context,
                  bool compress, uint64_t *ret_plain_bytes, char *why, size_t whylen);

/* Verify the sealed stream read from in_fd (to EOF) and write its plaintext
 * to out_fd. Returns 0 when every chunk authenticated, the final one was
 * seen and nothing followed it; then out_fd holds exactly the plaintext.
 *
 * -EBADMSG: not a sealed stream, an unknown version or flag, a bound broken,
 *  a chunk that does not authenticate (tampered, reordered, from another
 *  file, or the wrong master key: these are indistinguishable by design),
 *  a chunk that does not decompress to its size, a stream that ends before
 *  its final chunk, or bytes after it.
 * -EPERM: the header's context is not expected_context (a snapshot of
 *  another team, or a relabelled file; read from the clear header before any
 *  key is derived; the stream is refused either way).
 * -E2BIG: the plaintext would exceed max_plain_bytes (SEAL_NO_LIMIT for
 *  none): a bound on what a small compressed file may expand to. out_fd
 *  never receives more than max_plain_bytes.
 * -EINVAL: expected_context is not a valid context, or master is NULL.
 * -EIO: OpenSSL failed internally (or a read or write failed with EIO).
 * -ENOMEM, or the -errno of a read or write.
 *
 * The plaintext of a chunk is written to out_fd only after that chunk
 * authenticated (and, for the final chunk, after EOF was seen). A failure
 * in the middle therefore leaves the plaintext of the chunks before it,
 * authenticated but incomplete, in out_fd: write to a temporary file,
 * rename it into place only on success, and delete it on failure. */
int seal_read_fd(int in_fd, int out_fd, const uint8_t master[SEAL_KEY_LEN],
                 const char *expected_context, uint64_t max_plain_bytes, char *why, size_t whylen);

/* The memory forms of the two above, for tests, fuzzers and small blobs.
 * seal_write_buf() also takes the chunk size (SEAL_CHUNK_MIN..MAX, else
 * -EINVAL). Both return a malloc'd buffer in *ret (the caller frees it; never
 * NULL, even for 0 bytes) and its length in *ret_len; on failure nothing is
 * returned, partial plaintext included. Return codes as above. */
int seal_write_buf(const void *in, size_t len, const uint8_t master[SEAL_KEY_LEN],
                   const char *context, bool compress, uint32_t chunk_size, uint8_t **ret,
                   size_t *ret_len, char *why, size_t whylen);
int seal_read_buf(const void *in, size_t len, const uint8_t master[SEAL_KEY_LEN],
                  const char *expected_context, uint64_t max_plain_bytes, uint8_t **ret,
                  size_t *ret_len, char *why, size_t whylen);

/* The context of the sealed file fd, without the key (to list snapshots, or
 * to say whose a file is). Reads the header with pread() at offset 0, so fd
 * must be seekable (-ESPIPE otherwise) and its offset does not move. The
 * context is NOT authenticated by this call: only seal_read_fd() with the
 * right key proves it. Writes it NUL-terminated to buf and returns its
 * length; -EBADMSG if the header is not a valid version 1 header;
 * -ENOBUFS if len is not larger than the context; -errno of pread. */
int seal_peek_context(int fd, char *buf, size_t len);
