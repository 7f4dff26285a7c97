/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layer store: DATA_DIR/layers/sha256/<hex>/ holds one unpacked layer
 * (hex = the sha256 of its uncompressed tar, the OCI diff_id), in overlayfs
 * format (whiteouts are 0:0 character devices, opaque directories carry
 * user.overlay.opaque=y, as the engine's `userxattr` overlay reads them),
 * with on-disk uids/gids 0..65535 (the engine id-maps them into each
 * sandbox's range; nothing is ever chowned per sandbox). A layer is
 * complete only when DATA_DIR/layers/sha256/<hex>.done exists; anything
 * else there (a .tmp-* directory, a directory without its marker) is what
 * a crash left and is removed by layer_gc().
 *
 * A layer is unpacked once and shared by every template that names it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "hutch/hutch.h"

#define LAYER_DIGEST_MAX 72 /* "sha256:" + 64 hex + NUL, rounded */

/* Bounds on one layer's tar stream (attacker-controlled input). */
#define LAYER_MAX_ENTRIES 1000000u
#define LAYER_MAX_DEPTH 128u
#define LAYER_MAX_PATH 4096u
#define LAYER_MAX_FILE (16ull << 30)      /* one regular file */
#define LAYER_MAX_EXPANSION (64ull << 30) /* all bytes the stream expands to */

/* Whether digest is "sha256:" + 64 lowercase hex digits. */
bool layer_digest_valid(const char *digest);

/* The host path of a complete layer's directory into buf; "" (and 0) when
 * the layer is not in the store. -ENAMETOOLONG, -EINVAL (bad digest). */
int layer_path(const char *data_dir, const char *digest, char *buf, size_t n);

/* Unpack the tar stream read from fd (plain, gzip or zstd; the compressed
 * bytes are verified against blob_digest when it is not NULL, the
 * uncompressed ones against diff_id) into the store as layer diff_id.
 * Returns 0 when it was unpacked, 1 when it was there already (fd is then
 * not read). Nothing is left behind on failure. The unpacking runs in a
 * child in its own user and mount namespaces, writing through an id-mapped
 * mount (docs/security.md, "Image layers"). */
int layer_unpack(const char *data_dir, int fd, const char *blob_digest, const char *diff_id,
                 uint64_t blob_size, hutch_error *err);

/* Whether the stream read from fd (plain, gzip or zstd) uncompresses to
 * diff_id, with the same bounds as an unpack, writing nothing: a pull's
 * proof that it has a layer the store already holds. 0, or -EBADMSG. */
int layer_verify(int fd, const char *diff_id, hutch_error *err);

/* Layers that a pull with a build's own registry credentials brought into
 * the store are the property of the teams that proved they have them: the
 * store keeps `<hex>.teams` (a team id a line) beside the layer. A pull by
 * another team, or by nobody's credentials, must then download the layer's
 * blob and verify it (layer_verify) before it may use the copy in the
 * store, so knowing a private layer's diff_id is not enough to read it.
 * layer_private_allows: 1 when the layer is public (no list) or lists
 * team (0: no team: only a public layer); 0 when a proof is needed. */
int layer_private_allows(const char *data_dir, const char *diff_id, int64_t team);
/* team proved it has the layer: listed (team > 0), or the list removed
 * (team 0: a pull without a build's credentials got it, so anyone can). */
int layer_private_grant(const char *data_dir, const char *diff_id, int64_t team);

/* Put the directory tree at dirfd (overlay upper format, ids shifted by
 * uid_shift: on-disk uid uid_shift+k becomes k) into the layer store as a
 * new layer; returns its digest "sha256:<hex>" of a canonical tar of it
 * (names sorted, whiteouts and opaque directories in OCI form). The tree
 * is untrusted: it is walked without following a symlink, and the tar goes
 * through layer_unpack like any image layer. Hold layer_store_hold() from
 * before this call until template_write() names the layer, or a GC in
 * between may take it. */
int layer_from_dir(const char *data_dir, int dirfd, uid_t uid_shift,
                   char ret_digest[LAYER_DIGEST_MAX], hutch_error *err);

/* The canonical tar of the tree at dirfd (as layer_from_dir writes it:
 * names sorted, ids shifted back by uid_shift, overlay whiteouts and
 * opaque directories in OCI form) written to out. A push's layer
 * (lib/image/push.c): a store layer with uid_shift 0. */
int layer_tar_dir(int dirfd, uid_t uid_shift, int out, hutch_error *err);

/* The store's busy lock, taken shared (creating the store, 0700): while
 * any holder has it, layer_gc leaves the store alone. Returns the fd. */
int layer_store_hold(const char *data_dir, hutch_error *err);

/* The digests ("sha256:<hex>") the store holds, complete ones only. */
int layer_list(const char *data_dir, char ***ret, size_t *ret_n, hutch_error *err);

/* Disk use of a layer directory in bytes (st_blocks * 512, hardlinks once). */
int layer_disk_usage(const char *data_dir, const char *digest, uint64_t *ret);

/* Remove the layers no name in keep[] refers to, and what a crash left.
 * The caller holds templates/.lock (template_gc). Returns how many. */
int layer_gc(const char *data_dir, char *const *keep, size_t n_keep, hutch_error *err);
