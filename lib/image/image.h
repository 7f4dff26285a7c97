/* SPDX-License-Identifier: Apache-2.0 */
/*
 * OCI images become templates: manifests (OCI image manifest and index,
 * Docker schema 2 manifest and manifest list), configs, platform
 * selection, and the install of an image's layers into the layer store
 * (lib/image/layer.h) under a template version (lib/template/template.h).
 *
 * Everything here reads attacker-controlled bytes: digests are verified
 * before anything is used, sizes are bounded, and a manifest or config
 * that lies is refused with a clear message.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hutch/hutch.h"

#define IMAGE_MEDIA_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define IMAGE_MEDIA_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define IMAGE_MEDIA_OCI_CONFIG "application/vnd.oci.image.config.v1+json"
#define IMAGE_MEDIA_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define IMAGE_MEDIA_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define IMAGE_MEDIA_DOCKER_CONFIG "application/vnd.docker.container.image.v1+json"

#define IMAGE_MAX_MANIFEST (4u << 20) /* a manifest, index or config */
#define IMAGE_MAX_LAYERS ((unsigned) HUTCH_MAX_LAYERS)

/* Opens the blob with that digest for reading (a regular file, positioned
 * at 0); the caller verifies the digest while it reads. */
typedef int (*image_blob_open_fn)(void *arg, const char *digest, int *ret_fd, hutch_error *err);

typedef struct image_progress_event {
        const char *phase;  /* "resolve", "config", "layer", "exists", "done" */
        const char *digest; /* the blob, or NULL */
        uint64_t done, total;
        unsigned layer, n_layers;
} image_progress_event;
typedef struct image_progress {
        void (*fn)(void *arg, const image_progress_event *ev);
        void *arg;
} image_progress;

/* Verify and install an image (an OCI/Docker manifest or index, bytes as
 * served; an index selects the host's platform) as template NAME: layers
 * already in the store are not read again. media_type may be NULL (taken
 * from the manifest's mediaType). source is recorded in template.json. */
int image_install(const char *data_dir, const char *name, const char *source,
                  const uint8_t *manifest, size_t len, const char *media_type,
                  image_blob_open_fn open_blob, void *arg, const image_progress *p, hutch_error *err);
/* The same, the template owned by team (0: every team's). */
int image_install_team(const char *data_dir, const char *name, int64_t team, const char *source,
                       const uint8_t *manifest, size_t len, const char *media_type,
                       image_blob_open_fn open_blob, void *arg, const image_progress *p,
                       hutch_error *err);

/* Import a `docker save` archive or an OCI image layout (a directory or a
 * tar of one) at path as template name (NULL: from the archive's tag). */
int image_import(const char *data_dir, const char *path, const char *name, const image_progress *p,
                 char **ret_name, hutch_error *err);

/* The plain (uncompressed) tar at fd into the layer store, named by its
 * sha256 (its diff_id, to ret_digest); unpacked like any image layer (the
 * tar is untrusted). *ret_existed: the store had it already. The caller
 * holds layer_store_hold() until a template names the layer. */
int image_tar_layer(const char *data_dir, int fd, char ret_digest[72], bool *ret_existed,
                    hutch_error *err);

/* The bound on what one layer's stream may expand to (0: the default,
 * LAYER_MAX_EXPANSION); `hutch template` takes it from HUTCH_IMAGE_MAX_BYTES. */
void image_set_max_expansion(uint64_t bytes);

/* ---- the parsers (exposed for the fuzz targets and unit tests) ---- */

typedef struct image_descriptor {
        char *media_type;
        char *digest;
        int64_t size;
} image_descriptor;

typedef struct image_manifest {
        bool is_index;
        image_descriptor config;
        image_descriptor *layers; /* bottom first */
        size_t n_layers;
        /* an index: the manifest chosen for the host's platform */
        image_descriptor chosen;
} image_manifest;

typedef struct image_config {
        char **diff_ids; /* bottom first */
        size_t n_diff_ids;
        char **env; /* NULL-terminated */
        char *workdir;
        char *user;
        char **cmd; /* Entrypoint + Cmd, NULL-terminated, or NULL */
        char *os, *architecture, *variant;
        /* Labels dev.hutch.start-cmd and dev.hutch.ready-cmd: a pushed
         * template's start and ready commands (lib/image/push.h) */
        char *start_cmd, *ready_cmd;
} image_config;

/* The host's platform: "amd64", "arm64" (and the arm variant) as OCI names them. */
const char *image_host_arch(void);
const char *image_host_variant(void);

int image_manifest_parse(const uint8_t *buf, size_t len, const char *media_type,
                         image_manifest *ret, hutch_error *err);
void image_manifest_clear(image_manifest *m);
int image_config_parse(const uint8_t *buf, size_t len, image_config *ret, hutch_error *err);

/* An OCI image manifest used as an artifact of hutch's (a snapshot, lib/
 * image/push.h): its config of config_type and exactly one layer of
 * layer_type, each digest valid and size >= 0. Fuzzed (fuzz/fuzz-oci.c). */
int image_artifact_parse(const uint8_t *buf, size_t len, const char *config_type,
                         const char *layer_type, image_descriptor *ret_config,
                         image_descriptor *ret_layer, hutch_error *err);
void image_config_clear(image_config *c);
