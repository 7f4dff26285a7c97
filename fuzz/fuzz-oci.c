/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The image manifest, index and config parsers (lib/image/oci.c): bytes
 * from a registry or an archive. Byte 0 picks the media type the caller
 * claims (none, OCI/Docker manifest or index); the rest is parsed as a
 * manifest, as a config and as a snapshot's artifact manifest. A parse
 * that succeeds must be consistent.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "image/layer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static const char *const types[] = { NULL, IMAGE_MEDIA_OCI_MANIFEST, IMAGE_MEDIA_OCI_INDEX,
                                             IMAGE_MEDIA_DOCKER_MANIFEST, IMAGE_MEDIA_DOCKER_LIST };
        if (size < 1)
                return 0;
        const char *mt = types[data[0] % 5];
        data++, size--;
        image_manifest m;
        hutch_error err = { 0 };
        if (image_manifest_parse(data, size, mt, &m, &err) == 0) {
                if (m.is_index) {
                        if (!layer_digest_valid(m.chosen.digest) || m.chosen.size < 0)
                                abort();
                } else {
                        if (!layer_digest_valid(m.config.digest) || m.n_layers > IMAGE_MAX_LAYERS)
                                abort();
                        for (size_t i = 0; i < m.n_layers; i++)
                                if (!layer_digest_valid(m.layers[i].digest) || m.layers[i].size < 0)
                                        abort();
                }
                image_manifest_clear(&m);
        } else if (!err.msg[0])
                abort(); /* every refusal says why */
        image_config c;
        if (image_config_parse(data, size, &c, &err) == 0) {
                size_t n = 0;
                for (char **d = c.diff_ids; d && *d; d++, n++)
                        if (!layer_digest_valid(*d))
                                abort();
                if (n != c.n_diff_ids || n > IMAGE_MAX_LAYERS)
                        abort();
                for (char **e = c.env; e && *e; e++)
                        if (!strchr(*e, '=') || **e == '=')
                                abort();
                if (c.workdir && c.workdir[0] && c.workdir[0] != '/')
                        abort();
                image_config_clear(&c);
        }
        /* as a snapshot's artifact (lib/image/push.h) */
        image_descriptor cd, ld;
        if (image_artifact_parse(data, size, "application/vnd.hutch.snapshot.config.v1+json",
                                 "application/vnd.hutch.snapshot.sealed.v1", &cd, &ld, &err) == 0) {
                if (!layer_digest_valid(cd.digest) || !layer_digest_valid(ld.digest) ||
                    cd.size < 0 || ld.size < 0)
                        abort();
                free(cd.media_type);
                free(cd.digest);
                free(ld.media_type);
                free(ld.digest);
        } else if (cd.digest || ld.digest)
                abort(); /* nothing is left on a refusal */
        return 0;
}
