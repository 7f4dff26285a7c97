/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Push a template to an OCI distribution registry as an image, so that
 * another node pulls it (`hutch template push`, and the daemon's
 * template-registry: docs/scale-out.md "Templates through a registry").
 *
 * What is pushed: the template's layers, bottom first, each the canonical
 * tar of its directory in the layer store (lib/image/layer.h's
 * layer_tar_dir: names sorted, overlay whiteouts and opaque directories
 * in OCI form) compressed with gzip; an OCI image config whose rootfs
 * names those tars' digests and whose config holds what template.json
 * records (Env, WorkingDir, User, Cmd; the start and ready commands as the
 * labels dev.hutch.start-cmd and dev.hutch.ready-cmd, which
 * image_config_parse reads back); an OCI image manifest, PUT under the
 * reference's tag. hutch's own top layer (mount points, /etc/hosts, the
 * `user` account) is not pushed: a pull makes it again.
 *
 * What is refused: the host template (the host's own /usr, bound at run
 * time: nothing to put in an image), a template owned by one team (pulled
 * with a build's own credentials), a reference with a digest and no tag.
 *
 * A layer's gzip is deterministic (no name, no time in its header): the
 * same layer gives the same blob, so a second push HEADs each blob and
 * uploads none. DATA_DIR/layers/sha256/<hex>.pushed remembers a layer's
 * blob digest and size, so that a push of a layer already pushed
 * somewhere does not tar and compress it again (gone with its layer), and
 * a blob pushed before to another repository of the same registry is
 * mounted from there (POST ?mount=&from=) instead of uploaded.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "hutch/hutch.h"
#include "image/image.h"

#define IMAGE_MEDIA_OCI_LAYER_GZIP "application/vnd.oci.image.layer.v1.tar+gzip"
#define IMAGE_LABEL_START_CMD "dev.hutch.start-cmd"
#define IMAGE_LABEL_READY_CMD "dev.hutch.ready-cmd"

typedef struct image_push_opts {
        const char *conf_path; /* registries.conf; NULL: $HUTCH_REGISTRIES_CONF, else DATA_DIR/registries.conf */
        const char *ca_file; /* an extra CA bundle for every registry, or NULL */
} image_push_opts;

typedef struct image_push_result {
        char *target; /* "REGISTRY/REPO:TAG@sha256:<manifest>" */
        unsigned layers, blobs_uploaded, blobs_present;
        unsigned blobs_mounted; /* from another repository of the registry */
        uint64_t bytes_uploaded;
} image_push_result;
void image_push_result_clear(image_push_result *r);

/* Push template name as ref (a tag; a short name resolves to the first
 * search registry of registries.conf, never a mirror). p gets "layer"
 * (a layer being made into a blob), "upload", "uploaded", "exists" (the
 * registry has the blob), "mounted" and "done" events. -EINVAL bad reference, -EPERM a template
 * that cannot be pushed, -ENOENT no such template, -EACCES refused,
 * network errors as the registry client's. Nothing is left on this host;
 * the registry may keep the blobs uploaded before a failure (a retry
 * finds them), never a manifest naming a blob it lacks. */
int image_push(const char *data_dir, const char *name, const char *ref, const image_push_opts *opts,
               const image_progress *p, image_push_result *ret, hutch_error *err);

/* ---- artifacts: a file and a JSON config under a tag (snapshots shared
 * through a registry, daemon/tplshare.c) */

/* Push the file at fd (from offset 0) as the one layer of layer_type,
 * with config (JSON text) as the config of config_type, in an OCI manifest
 * (artifactType config_type) under REF's tag; ret_digest: the manifest's.
 * Blobs the registry has are not uploaded. */
int image_push_artifact(const char *data_dir, const char *ref, const image_push_opts *opts,
                        const char *config_type, const char *config, const char *layer_type, int fd,
                        char ret_digest[72], hutch_error *err);
/* The artifact REF names: its config (malloc'ed text, at most
 * IMAGE_MAX_MANIFEST bytes) and its layer (at most max_layer bytes, its
 * digest and size verified) written to out_fd. -ENOENT no such tag,
 * -EBADMSG not an artifact of those types, network errors as a pull's. */
int image_pull_artifact(const char *data_dir, const char *ref, const image_push_opts *opts,
                        const char *config_type, const char *layer_type, uint64_t max_layer,
                        char **ret_config, int out_fd, hutch_error *err);
