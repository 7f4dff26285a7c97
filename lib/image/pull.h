/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pull an image from an OCI distribution registry into a template: the
 * reference is resolved through registries.conf (lib/image/reference.h),
 * the manifest (an index: the host platform's) fetched, the blobs the
 * layer store lacks downloaded in parallel into the blob cache
 * (lib/image/registry.h), and the image installed with image_install()
 * (lib/image/image.h). `hutch template pull` and the daemon (a build's
 * fromImage) both come here, with the same registries.conf.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "hutch/hutch.h"
#include "image/image.h"

typedef struct image_pull_opts {
        const char *conf_path; /* registries.conf; NULL: $HUTCH_REGISTRIES_CONF, else DATA_DIR/registries.conf */
        const char *ca_file; /* an extra CA bundle for every registry, or NULL */
        unsigned parallel;   /* concurrent blob downloads; 0: 4 */
        /* only the registries registries.conf names (search, mirror, allow
         * lines): for a reference an API client chose (the daemon sets it),
         * so that it cannot make the host connect where it likes */
        bool configured_only;
        /* a build's own credentials (fromImageRegistry), or NULL: sent to
         * the reference's registry only (a short name: the first search
         * registry; never a mirror), in place of registries.auth's. The
         * template then belongs to team (its name gets ".team<ID>"), and
         * the image's config leaves the blob cache, so that nothing
         * pulled with them is found by a pull without them. */
        const char *user, *pass;
        int64_t team;
        /* user and pass are an AWS access key for this region: exchanged
         * for ECR's basic credentials (registry_ecr_login()), for a
         * reference whose registry is ECR's in that region only */
        const char *aws_region;
} image_pull_opts;

typedef struct image_pull_result {
        char *name;   /* the template written */
        char *source; /* "REGISTRY/REPO:TAG@sha256:..." as template.json records it */
        char *host;   /* where it came from (a mirror, or the registry) */
        uint64_t bytes_downloaded;
        unsigned blobs_downloaded, layers, layers_present;
} image_pull_result;
void image_pull_result_clear(image_pull_result *r);

/* Pull ref as template name (NULL: image_reference_template_name()). p
 * gets "download" events (done/total bytes, layer = blobs done of
 * n_layers to download) before image_install's own. ret may be NULL.
 * -EINVAL bad reference, -ENOENT no such image on any candidate,
 * -EACCES refused, -EBADMSG a digest or size that lies, -EHOSTUNREACH /
 * -ECONNREFUSED / -ETIMEDOUT network, -EPROTO TLS. */
int image_pull(const char *data_dir, const char *ref, const char *name, const image_pull_opts *opts,
               const image_progress *p, image_pull_result *ret, hutch_error *err);

/* The blob cache's directory and its garbage (.partial files no pull holds). */
int image_blob_dir(const char *data_dir, char *buf, size_t n);
int image_pull_gc(const char *data_dir, hutch_error *err);
