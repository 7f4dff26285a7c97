/* SPDX-License-Identifier: Apache-2.0 */
/*
 * OCI image manifests and indexes, Docker schema 2 manifests and manifest
 * lists, and image configs: parsed strictly (duplicate keys, wrong types,
 * bad digests and absurd sizes are refused), because every byte comes from
 * whoever made the image.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "image/image-internal.h"
#include "image/layer.h"
#include "util/error.h"

#define MAX_ENV 1024u
#define MAX_STR (32u << 10)

const char *image_host_arch(void) {
#if defined(__x86_64__)
        return "amd64";
#elif defined(__aarch64__)
        return "arm64";
#elif defined(__arm__)
        return "arm";
#elif defined(__i386__)
        return "386";
#elif defined(__riscv) && __riscv_xlen == 64
        return "riscv64";
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        return "ppc64le";
#elif defined(__s390x__)
        return "s390x";
#else
        return "unknown";
#endif
}

const char *image_host_variant(void) {
#if defined(__aarch64__)
        return "v8";
#elif defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7
        return "v7";
#elif defined(__arm__)
        return "v6";
#else
        return NULL;
#endif
}

static void desc_clear(image_descriptor *d) {
        free(d->media_type);
        free(d->digest);
        *d = (image_descriptor) { 0 };
}

void image_manifest_clear(image_manifest *m) {
        if (!m)
                return;
        desc_clear(&m->config);
        desc_clear(&m->chosen);
        for (size_t i = 0; i < m->n_layers; i++)
                desc_clear(&m->layers[i]);
        free(m->layers);
        *m = (image_manifest) { 0 };
}

static void strv_free(char **v) {
        for (char **p = v; p && *p; p++)
                free(*p);
        free(v);
}

void image_config_clear(image_config *c) {
        if (!c)
                return;
        strv_free(c->diff_ids);
        strv_free(c->env);
        strv_free(c->cmd);
        free(c->workdir);
        free(c->user);
        free(c->os);
        free(c->architecture);
        free(c->variant);
        free(c->start_cmd);
        free(c->ready_cmd);
        *c = (image_config) { 0 };
}

static json_t *load(const uint8_t *buf, size_t len, const char *what, hutch_error *err) {
        if (len > IMAGE_MAX_MANIFEST) {
                hutch_error_set(err, -EFBIG, "%s is larger than %u bytes", what, IMAGE_MAX_MANIFEST);
                return NULL;
        }
        json_error_t je;
        json_t *j = json_loadb((const char *) buf, len, JSON_REJECT_DUPLICATES, &je);
        if (!j)
                hutch_error_set(err, -EBADMSG, "%s is not valid JSON: %s (line %d)", what, je.text,
                                je.line);
        else if (!json_is_object(j)) {
                json_decref(j);
                j = NULL;
                hutch_error_set(err, -EBADMSG, "%s is not a JSON object", what);
        }
        return j;
}

static bool is_layer_type(const char *t, bool *foreign) {
        static const char *const ok[] = {
                "application/vnd.oci.image.layer.v1.tar",
                "application/vnd.oci.image.layer.v1.tar+gzip",
                "application/vnd.oci.image.layer.v1.tar+zstd",
                "application/vnd.docker.image.rootfs.diff.tar",
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "application/vnd.docker.image.rootfs.diff.tar.zstd",
                NULL,
        };
        *foreign = strstr(t, "foreign") || strstr(t, "nondistributable");
        for (const char *const *p = ok; *p; p++)
                if (streq(t, *p))
                        return true;
        return false;
}

static int desc_parse(json_t *j, const char *what, image_descriptor *d, hutch_error *err) {
        json_t *mt = json_object_get(j, "mediaType"), *dg = json_object_get(j, "digest"),
               *sz = json_object_get(j, "size");
        if (!json_is_object(j))
                return hutch_error_set(err, -EBADMSG, "%s is not an object", what);
        if (mt && !json_is_string(mt))
                return hutch_error_set(err, -EBADMSG, "%s: mediaType is not a string", what);
        if (!json_is_string(dg) || !layer_digest_valid(json_string_value(dg)))
                return hutch_error_set(err, -EBADMSG,
                                       "%s: digest is missing or not sha256:<64 hex>", what);
        if (!json_is_integer(sz) || json_integer_value(sz) < 0)
                return hutch_error_set(err, -EBADMSG, "%s: size is missing or negative", what);
        d->media_type = strdup(mt ? json_string_value(mt) : "");
        d->digest = strdup(json_string_value(dg));
        d->size = json_integer_value(sz);
        if (!d->media_type || !d->digest)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        return 0;
}

static bool platform_matches(json_t *p, char *desc, size_t dl) {
        const char *os = json_string_value(json_object_get(p, "os")),
                   *arch = json_string_value(json_object_get(p, "architecture")),
                   *var = json_string_value(json_object_get(p, "variant"));
        snprintf(desc, dl, "%.20s/%.20s%s%.10s", os ? os : "?", arch ? arch : "?", var ? "/" : "",
                 var ? var : "");
        if (!os || !arch || !streq(os, "linux") || !streq(arch, image_host_arch()))
                return false;
        const char *hv = image_host_variant();
        /* arm64 images mostly say nothing or v8; 32-bit arm must match */
        if (var && hv && !streq(var, hv) && !(streq(hv, "v7") && streq(var, "v6")))
                return false;
        return true;
}

static int index_parse(json_t *j, image_manifest *m, hutch_error *err) {
        json_t *ms = json_object_get(j, "manifests");
        if (!json_is_array(ms))
                return hutch_error_set(err, -EBADMSG, "image index without a manifests array");
        if (json_array_size(ms) > 1024)
                return hutch_error_set(err, -E2BIG, "image index lists more than 1024 manifests");
        m->is_index = true;
        char seen[512] = "";
        size_t sl = 0;
        json_t *pick = NULL;
        size_t i;
        json_t *e;
        json_array_foreach(ms, i, e) {
                if (!json_is_object(e))
                        return hutch_error_set(err, -EBADMSG,
                                               "image index entry %zu is not an object", i);
                json_t *p = json_object_get(e, "platform");
                char d[64];
                if (!json_is_object(p)) {
                        /* an OCI layout's index.json names one image without a platform */
                        if (json_array_size(ms) == 1)
                                pick = e;
                        continue;
                }
                if (platform_matches(p, d, sizeof d)) {
                        if (!pick)
                                pick = e;
                } else if (sl + strlen(d) + 3 < sizeof seen && !strstr(seen, d)) {
                        sl += (size_t) snprintf(seen + sl, sizeof seen - sl, "%s%s", sl ? ", " : "",
                                                d);
                }
        }
        if (!pick)
                return hutch_error_set(
                        err, -ENOENT, "the image has no manifest for linux/%s%s%s (it has: %s)",
                        image_host_arch(), image_host_variant() ? "/" : "",
                        image_host_variant() ? image_host_variant() : "", sl ? seen : "none");
        int r = desc_parse(pick, "the chosen manifest", &m->chosen, err);
        if (r < 0)
                return r;
        if (m->chosen.size > (int64_t) IMAGE_MAX_MANIFEST)
                return hutch_error_set(err, -EFBIG, "the chosen manifest is larger than %u bytes",
                                       IMAGE_MAX_MANIFEST);
        return 0;
}

int image_manifest_parse(const uint8_t *buf, size_t len, const char *media_type,
                         image_manifest *ret, hutch_error *err) {
        *ret = (image_manifest) { 0 };
        json_t *j = load(buf, len, "the manifest", err);
        if (!j)
                return err ? err->code : -EBADMSG;
        int r = 0;
        json_t *sv = json_object_get(j, "schemaVersion");
        json_t *mtj = json_object_get(j, "mediaType");
        if (mtj && !json_is_string(mtj)) {
                r = hutch_error_set(err, -EBADMSG, "the manifest's mediaType is not a string");
                goto out;
        }
        const char *mt = media_type && *media_type ? media_type : json_string_value(mtj);
        if (!json_is_integer(sv) || json_integer_value(sv) != 2) {
                r = hutch_error_set(
                        err, -EPROTONOSUPPORT,
                        "manifest schemaVersion is not 2 (Docker schema 1 images are not supported)");
                goto out;
        }
        bool index = mt ? (streq(mt, IMAGE_MEDIA_OCI_INDEX) || streq(mt, IMAGE_MEDIA_DOCKER_LIST))
                        : json_object_get(j, "manifests") != NULL;
        if (mt && !index && !streq(mt, IMAGE_MEDIA_OCI_MANIFEST) &&
            !streq(mt, IMAGE_MEDIA_DOCKER_MANIFEST)) {
                r = hutch_error_set(err, -EPROTONOSUPPORT,
                                    "unsupported manifest media type '%.100s'", mt);
                goto out;
        }
        if (index) {
                r = index_parse(j, ret, err);
                goto out;
        }
        json_t *cfg = json_object_get(j, "config"), *layers = json_object_get(j, "layers");
        if ((r = desc_parse(cfg, "the manifest's config", &ret->config, err)) < 0)
                goto out;
        if (ret->config.media_type[0] && !streq(ret->config.media_type, IMAGE_MEDIA_OCI_CONFIG) &&
            !streq(ret->config.media_type, IMAGE_MEDIA_DOCKER_CONFIG)) {
                r = hutch_error_set(err, -EPROTONOSUPPORT,
                                    "the manifest's config has media type '%.100s', not an image "
                                    "config (an artifact, not an image?)",
                                    ret->config.media_type);
                goto out;
        }
        if (ret->config.size > (int64_t) IMAGE_MAX_MANIFEST) {
                r = hutch_error_set(err, -EFBIG, "the image config is larger than %u bytes",
                                    IMAGE_MAX_MANIFEST);
                goto out;
        }
        if (!json_is_array(layers)) {
                r = hutch_error_set(err, -EBADMSG, "the manifest has no layers array");
                goto out;
        }
        size_t n = json_array_size(layers);
        if (n > IMAGE_MAX_LAYERS) {
                r = hutch_error_set(err, -E2BIG, "the manifest has %zu layers, more than %u", n,
                                    IMAGE_MAX_LAYERS);
                goto out;
        }
        ret->layers = calloc(n ? n : 1, sizeof *ret->layers);
        if (!ret->layers) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        size_t i;
        json_t *e;
        json_array_foreach(layers, i, e) {
                char what[32];
                snprintf(what, sizeof what, "layer %zu", i);
                r = desc_parse(e, what, &ret->layers[i], err);
                ret->n_layers = i + 1;
                if (r < 0)
                        goto out;
                bool foreign = false;
                if (json_object_get(e, "urls") ||
                    !is_layer_type(ret->layers[i].media_type, &foreign)) {
                        r = foreign || json_object_get(e, "urls")
                                ? hutch_error_set(
                                          err, -EPROTONOSUPPORT,
                                          "layer %zu (%s) is a foreign/non-distributable layer (%.100s): "
                                          "it lives outside the registry and cannot be verified with the "
                                          "image (such layers are Windows base layers): refused",
                                          i, ret->layers[i].digest, ret->layers[i].media_type)
                                : hutch_error_set(err, -EPROTONOSUPPORT,
                                                  "layer %zu has unsupported media type '%.100s'",
                                                  i, ret->layers[i].media_type);
                        goto out;
                }
        }
out:
        json_decref(j);
        if (r < 0)
                image_manifest_clear(ret);
        return r;
}

static int strv_from_json(json_t *a, const char *what, bool env, char ***ret, hutch_error *err) {
        *ret = NULL;
        if (!a || json_is_null(a))
                return 0;
        if (!json_is_array(a) || json_array_size(a) > MAX_ENV)
                return hutch_error_set(err, -EBADMSG,
                                       "the config's %s is not an array of at most %u strings",
                                       what, MAX_ENV);
        char **v = calloc(json_array_size(a) + 1, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t i;
        json_t *e;
        json_array_foreach(a, i, e) {
                const char *s = json_string_value(e);
                size_t l = s ? json_string_length(e) : 0;
                bool ok = s && l <= MAX_STR && strlen(s) == l;
                if (ok && env) {
                        const char *eq = strchr(s, '=');
                        ok = eq && eq != s;
                        for (const char *c = s; ok && c < eq; c++)
                                ok = *c == '_' || (*c >= 'A' && *c <= 'Z') ||
                                        (*c >= 'a' && *c <= 'z') ||
                                        (c > s && *c >= '0' && *c <= '9');
                }
                if (!ok) {
                        strv_free(v);
                        return hutch_error_set(err, -EBADMSG,
                                               "the config's %s entry %zu is not valid", what, i);
                }
                if (!(v[i] = strdup(s))) {
                        strv_free(v);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
        }
        *ret = v;
        return 0;
}

static int str_field(json_t *o, const char *k, char **ret, hutch_error *err) {
        json_t *v = json_object_get(o, k);
        *ret = NULL;
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_string(v) || json_string_length(v) > MAX_STR ||
            strlen(json_string_value(v)) != json_string_length(v))
                return hutch_error_set(err, -EBADMSG, "the config's %s is not a string", k);
        if (!(*ret = strdup(json_string_value(v))))
                return hutch_error_set(err, -ENOMEM, "out of memory");
        return 0;
}

int image_config_parse(const uint8_t *buf, size_t len, image_config *c, hutch_error *err) {
        *c = (image_config) { 0 };
        json_t *j = load(buf, len, "the image config", err);
        if (!j)
                return err ? err->code : -EBADMSG;
        int r = 0;
        json_t *rootfs = json_object_get(j, "rootfs"), *cfg = json_object_get(j, "config");
        if (!json_is_object(rootfs) || !json_is_string(json_object_get(rootfs, "type")) ||
            !streq(json_string_value(json_object_get(rootfs, "type")), "layers")) {
                r = hutch_error_set(err, -EBADMSG, "the image config has no rootfs of type layers");
                goto out;
        }
        if ((r = strv_from_json(json_object_get(rootfs, "diff_ids"), "rootfs.diff_ids", false,
                                &c->diff_ids, err)) < 0)
                goto out;
        for (char **d = c->diff_ids; d && *d; d++, c->n_diff_ids++)
                if (!layer_digest_valid(*d)) {
                        r = hutch_error_set(err, -EBADMSG,
                                            "the config's diff_id '%.80s' is not sha256:<64 hex>",
                                            *d);
                        goto out;
                }
        if (c->n_diff_ids > IMAGE_MAX_LAYERS) {
                r = hutch_error_set(err, -E2BIG, "the config has more than %u layers",
                                    IMAGE_MAX_LAYERS);
                goto out;
        }
        if ((r = str_field(j, "os", &c->os, err)) < 0 ||
            (r = str_field(j, "architecture", &c->architecture, err)) < 0 ||
            (r = str_field(j, "variant", &c->variant, err)) < 0)
                goto out;
        if (cfg && !json_is_null(cfg)) {
                if (!json_is_object(cfg)) {
                        r = hutch_error_set(err, -EBADMSG,
                                            "the image config's config is not an object");
                        goto out;
                }
                char **ep = NULL, **cmd = NULL;
                if ((r = strv_from_json(json_object_get(cfg, "Env"), "Env", true, &c->env, err)) < 0 ||
                    (r = str_field(cfg, "WorkingDir", &c->workdir, err)) < 0 ||
                    (r = str_field(cfg, "User", &c->user, err)) < 0 ||
                    (r = strv_from_json(json_object_get(cfg, "Entrypoint"), "Entrypoint", false,
                                        &ep, err)) < 0 ||
                    (r = strv_from_json(json_object_get(cfg, "Cmd"), "Cmd", false, &cmd, err)) < 0) {
                        strv_free(ep);
                        goto out;
                }
                size_t ne = 0, nc = 0;
                for (char **p = ep; p && *p; p++)
                        ne++;
                for (char **p = cmd; p && *p; p++)
                        nc++;
                if (ne + nc > 0) {
                        c->cmd = calloc(ne + nc + 1, sizeof *c->cmd);
                        if (!c->cmd) {
                                strv_free(ep);
                                strv_free(cmd);
                                r = hutch_error_set(err, -ENOMEM, "out of memory");
                                goto out;
                        }
                        memcpy(c->cmd, ep ? ep : cmd, (ep ? ne : 0) * sizeof *c->cmd);
                        if (ep && cmd)
                                memcpy(c->cmd + ne, cmd, nc * sizeof *c->cmd);
                        else if (cmd)
                                memcpy(c->cmd, cmd, nc * sizeof *c->cmd);
                }
                free(ep);
                free(cmd);
                json_t *labels = json_object_get(cfg, "Labels");
                if (labels && !json_is_null(labels) && !json_is_object(labels)) {
                        r = hutch_error_set(err, -EBADMSG,
                                            "the image config's Labels is not an object");
                        goto out;
                }
                if (labels &&
                    ((r = str_field(labels, "dev.hutch.start-cmd", &c->start_cmd, err)) < 0 ||
                     (r = str_field(labels, "dev.hutch.ready-cmd", &c->ready_cmd, err)) < 0))
                        goto out;
                if (c->workdir && c->workdir[0] && c->workdir[0] != '/') {
                        r = hutch_error_set(err, -EBADMSG,
                                            "the config's WorkingDir '%.100s' is not absolute",
                                            c->workdir);
                        goto out;
                }
        }
out:
        json_decref(j);
        if (r < 0)
                image_config_clear(c);
        return r;
}

int image_artifact_parse(const uint8_t *buf, size_t len, const char *config_type,
                         const char *layer_type, image_descriptor *ret_config,
                         image_descriptor *ret_layer, hutch_error *err) {
        *ret_config = *ret_layer = (image_descriptor) { 0 };
        json_t *j = load(buf, len, "the artifact's manifest", err);
        if (!j)
                return err ? err->code : -EBADMSG;
        int r = 0;
        json_t *sv = json_object_get(j, "schemaVersion");
        const char *mt = json_string_value(json_object_get(j, "mediaType"));
        json_t *cfg = json_object_get(j, "config"), *layers = json_object_get(j, "layers");
        if (!json_is_integer(sv) || json_integer_value(sv) != 2 || !mt ||
            !streq(mt, IMAGE_MEDIA_OCI_MANIFEST) || !json_is_object(cfg) ||
            !json_is_array(layers) || json_array_size(layers) != 1) {
                r = hutch_error_set(err, -EBADMSG,
                                    "the artifact's manifest is not an OCI manifest of one layer");
                goto out;
        }
        if ((r = desc_parse(cfg, "the artifact's config", ret_config, err)) < 0 ||
            (r = desc_parse(json_array_get(layers, 0), "the artifact's layer", ret_layer, err)) < 0)
                goto out;
        if (!ret_config->media_type || !streq(ret_config->media_type, config_type) ||
            !ret_layer->media_type || !streq(ret_layer->media_type, layer_type))
                r = hutch_error_set(err, -EBADMSG, "the artifact is not a %s (its config is %.80s)",
                                    config_type,
                                    ret_config->media_type ? ret_config->media_type : "untyped");
out:
        json_decref(j);
        if (r < 0) {
                desc_clear(ret_config);
                desc_clear(ret_layer);
        }
        return r;
}
