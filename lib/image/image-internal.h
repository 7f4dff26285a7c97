/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdint.h>
#include <openssl/evp.h>

#include "image/image.h"
#include "image/layer.h"

/* The host ids the unpacker runs as: 65536 ids right below the sandboxes'
 * default range (hutch_ctx uid_base 0x40000000), used by no sandbox. The
 * unpacker runs only hutch's code (on authenticated bytes), never an
 * image's, so concurrent unpacks may share it. */
#define IMAGE_UNPACK_UID_BASE 0x3FFF0000u

int sha256_hex_final(EVP_MD_CTX *md, char out[65]);
/* sha256 of a whole file (pread from 0), at most max bytes (-EFBIG). */
int image_hash_fd(int fd, uint64_t max, char hex[65], uint64_t *ret_size);
/* The tar stream on data_fd into the tree at rootfd (-1: check only, the
 * fuzz target): every check of the unpacker. msg says why on failure. */
int unpack_tar(int rootfd, int data_fd, char *msg, size_t msglen);
/* <hex>.done next to the layer directory (in layers/sha256, sfd). */
int layer_mark_done(int sfd, const char *hex);
