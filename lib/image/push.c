/* SPDX-License-Identifier: Apache-2.0 */
/* A template pushed to a registry as an OCI image (lib/image/push.h). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "image/image.h"
#include "image/layer.h"
#include "image/push.h"
#include "image/reference.h"
#include "image/registry.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/macro.h"

void image_push_result_clear(image_push_result *r) {
        free(r->target);
        *r = (image_push_result) { 0 };
}

static void progress(const image_progress *p, const char *phase, const char *digest, uint64_t done,
                     uint64_t total, unsigned layer, unsigned n) {
        if (p && p->fn)
                p->fn(p->arg,
                      &(image_progress_event) { .phase = phase,
                                                .digest = digest,
                                                .done = done,
                                                .total = total,
                                                .layer = layer,
                                                .n_layers = n });
}

static void hex_of(const unsigned char *md, char out[72]) {
        strcpy(out, "sha256:");
        for (int i = 0; i < 32; i++)
                sprintf(out + 7 + 2 * i, "%02x", md[i]);
}

static void client_freep(registry_client **c) {
        registry_client_free(*c);
}

typedef struct push_blob {
        char digest[72];  /* of the gzip */
        char diff_id[72]; /* of the tar */
        uint64_t size;
        char host[256], repository[256]; /* where a push put it last ("" unknown) */
        int fd;                          /* the gzip, -1 until made */
} push_blob;

/* tar (the layer's canonical tar, at 0) -> gz: both digests on the way. */
static int gzip_fd(int tar, int gz, push_blob *b, hutch_error *err) {
        EVP_MD_CTX *ht = EVP_MD_CTX_new(), *hg = EVP_MD_CTX_new();
        z_stream zs = { 0 };
        /* windowBits 31: a gzip header, its time 0 and no name (deterministic);
         * level 1: a push is CPU-bound, and the size barely moves (+8% on
         * binaries against level 6, at a third of the time) */
        bool zok = deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) == Z_OK;
        int r = 0;
        if (!ht || !hg || !zok || !EVP_DigestInit_ex(ht, EVP_sha256(), NULL) ||
            !EVP_DigestInit_ex(hg, EVP_sha256(), NULL))
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        static unsigned char in[1 << 16], out[1 << 16];
        uint64_t total = 0, off = 0;
        bool eof = false;
        while (r == 0) {
                if (zs.avail_in == 0 && !eof) {
                        ssize_t k = pread(tar, in, sizeof in, (off_t) off);
                        if (k < 0) {
                                r = hutch_error_set(err, -errno, "reading the layer's tar: %m");
                                break;
                        }
                        off += (uint64_t) k;
                        eof = k == 0;
                        EVP_DigestUpdate(ht, in, (size_t) k);
                        zs.next_in = in;
                        zs.avail_in = (uInt) k;
                }
                zs.next_out = out;
                zs.avail_out = sizeof out;
                int z = deflate(&zs, eof ? Z_FINISH : Z_NO_FLUSH);
                if (z == Z_STREAM_ERROR) {
                        r = hutch_error_set(err, -EIO, "gzip failed");
                        break;
                }
                size_t have = sizeof out - zs.avail_out;
                if (have) {
                        int k = fd_write_all(gz, out, have);
                        if (k < 0) {
                                r = hutch_error_set(err, k, "writing the layer's gzip: %s",
                                                    strerror(-k));
                                break;
                        }
                        EVP_DigestUpdate(hg, out, have);
                        total += have;
                }
                if (z == Z_STREAM_END)
                        break;
        }
        if (r == 0) {
                unsigned char md[32];
                unsigned ml = 0;
                EVP_DigestFinal_ex(ht, md, &ml);
                hex_of(md, b->diff_id);
                EVP_DigestFinal_ex(hg, md, &ml);
                hex_of(md, b->digest);
                b->size = total;
        }
        if (zok)
                deflateEnd(&zs);
        EVP_MD_CTX_free(ht);
        EVP_MD_CTX_free(hg);
        return r;
}

/* <hex>.pushed beside a store layer: what its gzip was, last time. */
static bool pushed_read(const char *data_dir, const char *diff_id, push_blob *b) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/layers/sha256/%s.pushed", data_dir, diff_id + 7);
        json_error_t je;
        json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        const char *d = json_string_value(json_object_get(j, "digest"));
        const char *t = json_string_value(json_object_get(j, "diff_id"));
        json_t *sz = json_object_get(j, "size");
        bool ok = d && t && layer_digest_valid(d) && layer_digest_valid(t) && json_is_integer(sz) &&
                json_integer_value(sz) > 0;
        if (ok) {
                snprintf(b->digest, sizeof b->digest, "%s", d);
                snprintf(b->diff_id, sizeof b->diff_id, "%s", t);
                b->size = (uint64_t) json_integer_value(sz);
                const char *h = json_string_value(json_object_get(j, "host"));
                const char *rp = json_string_value(json_object_get(j, "repository"));
                snprintf(b->host, sizeof b->host, "%s", h && rp ? h : "");
                snprintf(b->repository, sizeof b->repository, "%s", h && rp ? rp : "");
        }
        json_decref(j);
        return ok;
}

static void pushed_write(const char *data_dir, const char *diff_id, const push_blob *b,
                         const char *host, const char *repository) {
        char path[PATH_MAX], tmp[PATH_MAX + 8];
        snprintf(path, sizeof path, "%s/layers/sha256/%s.pushed", data_dir, diff_id + 7);
        /* a crash's leftover: layer_gc removes .tmp-* */
        snprintf(tmp, sizeof tmp, "%s/layers/sha256/.tmp-%s.pushed", data_dir, diff_id + 7);
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s}", "digest", b->digest, "diff_id", b->diff_id,
                              "size", (json_int_t) b->size, "host", host, "repository", repository);
        if (j && json_dump_file(j, tmp, JSON_COMPACT) == 0 && rename(tmp, path) < 0)
                (void) unlink(tmp);
        json_decref(j);
}

/* The layer's gzip, made now into gz (a temporary file of the store). */
static int layer_blob(const char *data_dir, const char *diff_id, int gz, push_blob *b,
                      hutch_error *err) {
        char dir[PATH_MAX], sdir[PATH_MAX];
        int r = layer_path(data_dir, diff_id, dir, sizeof dir);
        if (r < 0 || !dir[0])
                return hutch_error_set(err, r < 0 ? r : -ENOENT, "layer %s is not in the store",
                                       diff_id);
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening layer %s: %m", diff_id);
        snprintf(sdir, sizeof sdir, "%s/layers/sha256", data_dir);
        _cleanup_close_ int tar = open(sdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (tar < 0)
                return hutch_error_set(err, -errno, "creating a temporary file in %s: %m", sdir);
        if ((r = layer_tar_dir(dfd, 0, tar, err)) < 0)
                return r;
        return gzip_fd(tar, gz, b, err);
}

/* What a blob maker tells the push: one write, smaller than PIPE_BUF. */
typedef struct blob_msg {
        int32_t i, r;
        char digest[72], diff_id[72];
        uint64_t size;
        char msg[512];
} blob_msg;

/* The blobs of the layers in need[], each made by a child process (the
 * tar and its gzip are CPU-bound: one layer a CPU, up to PUSH_PARALLEL at
 * once), into temporary files made here. */
#define PUSH_PARALLEL 4
static int make_blobs(const char *data_dir, json_t *layers, push_blob *blobs, const bool *need,
                      size_t n, const image_progress *p, hutch_error *err) {
        char sdir[PATH_MAX];
        snprintf(sdir, sizeof sdir, "%s/layers/sha256", data_dir);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        size_t par = cpus < 1 ? 1 : cpus > PUSH_PARALLEL ? PUSH_PARALLEL : (size_t) cpus;
        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) < 0)
                return hutch_error_set(err, -errno, "pipe: %m");
        (void) fd_set_nonblock(pfd[0], true);
        bool *got = calloc(n, sizeof *got);
        if (!got) {
                close(pfd[0]);
                close(pfd[1]);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        size_t next = 0, running = 0;
        int r = 0;
        for (;;) {
                while (r >= 0 && running < par && next < n) {
                        size_t i = next++;
                        if (!need[i])
                                continue;
                        const char *d = json_string_value(json_array_get(layers, i));
                        progress(p, "layer", d, 0, 0, (unsigned) i + 1, (unsigned) n);
                        blobs[i].fd = open(sdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                        if (blobs[i].fd < 0) {
                                r = hutch_error_set(err, -errno,
                                                    "creating a temporary file in %s: %m", sdir);
                                break;
                        }
                        pid_t pid = fork();
                        if (pid < 0) {
                                r = hutch_error_set(err, -errno, "fork: %m");
                                break;
                        }
                        if (pid == 0) {
                                blob_msg m = { .i = (int32_t) i };
                                hutch_error e = { 0 };
                                push_blob b = { .fd = -1 };
                                m.r = layer_blob(data_dir, d, blobs[i].fd, &b, &e);
                                memcpy(m.digest, b.digest, sizeof m.digest);
                                memcpy(m.diff_id, b.diff_id, sizeof m.diff_id);
                                m.size = b.size;
                                snprintf(m.msg, sizeof m.msg, "%s", e.msg);
                                _exit(write(pfd[1], &m, sizeof m) == (ssize_t) sizeof m ? 0 : 1);
                        }
                        running++;
                }
                if (running == 0)
                        break;
                /* a child wrote its one message before it exited: once it
                 * is reaped, what it said is in the pipe */
                int st;
                pid_t w = wait(&st);
                if (w > 0)
                        running--;
                else if (w < 0 && errno == ECHILD)
                        running = 0; /* none left (never: each fork counted) */
                blob_msg m;
                while (read(pfd[0], &m, sizeof m) == (ssize_t) sizeof m) {
                        if (m.i < 0 || (size_t) m.i >= n)
                                continue;
                        got[m.i] = true;
                        if (m.r < 0) {
                                if (r >= 0)
                                        r = hutch_error_set(err, m.r, "%s", m.msg);
                                continue;
                        }
                        push_blob *b = &blobs[m.i];
                        memcpy(b->digest, m.digest, sizeof b->digest);
                        memcpy(b->diff_id, m.diff_id, sizeof b->diff_id);
                        b->size = m.size;
                }
        }
        for (size_t i = 0; r >= 0 && i < n; i++)
                if (need[i] && !got[i])
                        r = hutch_error_set(err, -EIO,
                                            "the maker of layer %zu's blob ended without an answer",
                                            i + 1);
        free(got);
        close(pfd[0]);
        close(pfd[1]);
        return r;
}

static json_t *strv_json(json_t *a) {
        return json_is_array(a) && json_array_size(a) ? json_deep_copy(a) : NULL;
}

/* template.json of the version t is, read beside its rootfs */
static int template_json(const hutch_template *t, json_t **ret, hutch_error *err) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s", t->rootfs);
        char *slash = strrchr(path, '/');
        if (!slash)
                return hutch_error_set(err, -EINVAL, "template %s: no version directory", t->name);
        snprintf(slash, sizeof path - (size_t) (slash - path), "/template.json");
        json_error_t je;
        json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (!j || !json_is_array(json_object_get(j, "layers"))) {
                json_decref(j);
                return hutch_error_set(err, -EBADMSG, "template %s: %s: %s", t->name, path, je.text);
        }
        *ret = j;
        return 0;
}

static int push_one(registry_client *c, push_blob *b, const image_progress *p, unsigned i,
                    unsigned n, image_push_result *res, hutch_error *err) {
        int k = registry_blob_exists(c, b->digest, err);
        if (k < 0)
                return k;
        if (k == 1) {
                res->blobs_present++;
                progress(p, "exists", b->digest, b->size, b->size, i, n);
                return 0;
        }
        progress(p, "upload", b->digest, 0, b->size, i, n);
        return 1;
}

/* A client of dest's registry and repository, with the pulls' credentials,
 * TLS settings and blob store (push: one that may upload). */
static int push_client(const char *data_dir, const image_push_opts *opts, const registries_conf *conf,
                       const image_candidate *dest, bool push, registry_client **ret,
                       hutch_error *err) {
        char blob_dir[PATH_MAX], auth_path[4096];
        snprintf(blob_dir, sizeof blob_dir, "%s/images/blobs/sha256", data_dir);
        registry_auth_path(data_dir, auth_path, sizeof auth_path);
        registry_client_opts co = {
                .conf = conf,
                .auth_path = auth_path,
                .ca_file = opts->ca_file,
                .blob_dir = blob_dir,
                .push = push,
        };
        return registry_client_new(dest->host, dest->repository, &co, ret, err);
}

/* The registries' configuration, and where a push of rf goes: its own
 * registry, or a short name's first search registry; never a mirror (they
 * serve, they are not written). *ret_dest NULL when there is none. */
static int push_dest(const char *data_dir, const image_push_opts *opts, const image_reference *rf,
                     registries_conf *conf, image_candidate **ret_cands, size_t *ret_n,
                     const image_candidate **ret_dest, hutch_error *err) {
        char conf_path[4096];
        registries_conf_path(data_dir, opts->conf_path, conf_path, sizeof conf_path);
        int r = registries_conf_load(conf_path, conf, err);
        if (r < 0)
                return r;
        if ((r = image_reference_candidates(rf, conf, ret_cands, ret_n, err)) < 0)
                return r;
        *ret_dest = NULL;
        for (size_t i = 0; i < *ret_n && !*ret_dest; i++)
                if (!(*ret_cands)[i].mirror)
                        *ret_dest = &(*ret_cands)[i];
        return 0;
}

int image_push(const char *data_dir, const char *name, const char *ref, const image_push_opts *opts,
               const image_progress *p, image_push_result *ret, hutch_error *err) {
        static const image_push_opts no_opts = { 0 };
        if (!opts)
                opts = &no_opts;
        _cleanup_(image_reference_clear) image_reference rf = { 0 };
        int r = image_reference_parse(ref, &rf, err);
        if (r < 0)
                return r;
        if (rf.digest)
                return hutch_error_set(err, -EINVAL,
                                       "%s names a digest: a push goes to a tag (REPOSITORY:TAG)",
                                       ref);
        if (template_validate_name(name) < 0)
                return hutch_error_set(err, -EINVAL, "invalid template name '%s'", name);
        if (template_names_host(data_dir, name))
                return hutch_error_set(
                        err, -EPERM,
                        "template %s is the host template (the host's own /usr, bound when a sandbox "
                        "starts): it is no image and cannot be pushed; build `base` from Debian "
                        "packages (`hutch template base`) and push that",
                        name);
        _cleanup_(registries_conf_clear) registries_conf conf = { 0 };
        image_candidate *cands = NULL;
        size_t n_cands = 0;
        const image_candidate *dest = NULL;
        if ((r = push_dest(data_dir, opts, &rf, &conf, &cands, &n_cands, &dest, err)) < 0)
                return r;
        if (!dest) {
                image_candidates_free(cands, n_cands);
                return hutch_error_set(err, -EINVAL, "%s: no registry to push to", ref);
        }

        hutch_template *t = NULL;
        _cleanup_(json_decrefp) json_t *tj = NULL;
        _cleanup_(client_freep) registry_client *client = NULL;
        push_blob *blobs = NULL;
        size_t n = 0;
        _cleanup_free_ char *cfg_txt = NULL, *man_txt = NULL;
        _cleanup_close_ int busy = -1;
        if ((r = template_resolve(data_dir, name, &t, err)) < 0)
                goto out;
        if (!t->layers || !t->kind || streq(t->kind, "host")) {
                r = hutch_error_set(err, -EPERM,
                                    "template %s runs on the host template (the host's own /usr): "
                                    "it is no image and cannot be pushed",
                                    name);
                goto out;
        }
        if (t->team) {
                r = hutch_error_set(err, -EPERM,
                                    "template %s belongs to one team (pulled with a build's own "
                                    "registry credentials): not pushed where others could pull it",
                                    name);
                goto out;
        }
        if ((r = template_json(t, &tj, err)) < 0)
                goto out;
        json_t *layers = json_object_get(tj, "layers");
        n = json_array_size(layers);
        if (n == 0 || n > IMAGE_MAX_LAYERS) {
                r = hutch_error_set(err, -EPERM, "template %s has %zu layers: not pushed", name, n);
                goto out;
        }
        if (!(blobs = calloc(n, sizeof *blobs))) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        for (size_t i = 0; i < n; i++)
                blobs[i].fd = -1;
        if ((busy = layer_store_hold(data_dir, err)) < 0) {
                r = busy;
                goto out;
        }

        if ((r = push_client(data_dir, opts, &conf, dest, true, &client, err)) < 0)
                goto out;

        /* the layers, bottom first: each made into a blob unless a push
         * made it before and the registry has it */
        json_t *diff_ids = json_array();
        json_t *mlayers = json_array();
        json_t *cfg = NULL, *man = NULL;
        if (!diff_ids || !mlayers) {
                json_decref(diff_ids);
                json_decref(mlayers);
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        /* 1: the layers a push made before, that the registry has: nothing to do */
        bool *need = calloc(n, sizeof *need);
        if (!need) {
                json_decref(diff_ids);
                json_decref(mlayers);
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        for (size_t i = 0; i < n && r >= 0; i++) {
                const char *d = json_string_value(json_array_get(layers, i));
                if (!d || !layer_digest_valid(d)) {
                        r = hutch_error_set(err, -EBADMSG, "template %s: layer %zu is not a digest",
                                            name, i);
                        break;
                }
                need[i] = true;
                push_blob *b = &blobs[i];
                if (!pushed_read(data_dir, d, b))
                        continue;
                int k = push_one(client, b, p, (unsigned) i + 1, (unsigned) n, ret, err);
                if (k == 1 && streq(b->host, dest->host) && *b->repository &&
                    !streq(b->repository, dest->repository)) {
                        /* pushed to another repository of this registry:
                         * mounted from there, not uploaded (a registry that
                         * will not mount answers with an upload: done below) */
                        k = registry_blob_mount(client, b->digest, b->repository, err);
                        if (k == 1) {
                                ret->blobs_mounted++;
                                progress(p, "mounted", b->digest, b->size, b->size,
                                         (unsigned) i + 1, (unsigned) n);
                        }
                        k = k == 1 ? 0 : k < 0 ? k : 1;
                }
                if (k < 0)
                        r = k;
                else if (k == 0)
                        pushed_write(data_dir, d, b, dest->host, dest->repository);
                need[i] = k != 0;
        }
        /* 2: the others made into blobs, several at once */
        if (r >= 0)
                r = make_blobs(data_dir, layers, blobs, need, n, p, err);
        /* 3: uploaded, bottom first, unless the registry has them */
        for (size_t i = 0; i < n && r >= 0; i++) {
                push_blob *b = &blobs[i];
                if (need[i]) {
                        int k = push_one(client, b, p, (unsigned) i + 1, (unsigned) n, ret, err);
                        if (k < 0) {
                                r = k;
                                break;
                        }
                        if (k == 1) {
                                if ((r = registry_blob_upload(client, b->fd, NULL, b->size,
                                                              b->digest, err)) < 0)
                                        break;
                                ret->blobs_uploaded++;
                                ret->bytes_uploaded += b->size;
                                progress(p, "uploaded", b->digest, b->size, b->size,
                                         (unsigned) i + 1, (unsigned) n);
                        }
                        pushed_write(data_dir, json_string_value(json_array_get(layers, i)), b,
                                     dest->host, dest->repository);
                }
                json_array_append_new(diff_ids, json_string(b->diff_id));
                json_array_append_new(mlayers,
                                      json_pack("{s:s, s:s, s:I}", "mediaType",
                                                IMAGE_MEDIA_OCI_LAYER_GZIP, "digest", b->digest,
                                                "size", (json_int_t) b->size));
                b->fd = safe_close(b->fd);
        }
        free(need);
        if (r < 0) {
                json_decref(diff_ids);
                json_decref(mlayers);
                goto out;
        }

        /* the config: what template.json says a sandbox of it starts with */
        json_t *c = json_object(), *labels = json_object();
        json_t *v;
        if ((v = strv_json(json_object_get(tj, "env"))))
                json_object_set_new(c, "Env", v);
        if ((v = strv_json(json_object_get(tj, "cmd"))))
                json_object_set_new(c, "Cmd", v);
        const char *s;
        if ((s = json_string_value(json_object_get(tj, "workdir"))) && *s)
                json_object_set_new(c, "WorkingDir", json_string(s));
        if ((s = json_string_value(json_object_get(tj, "user"))) && *s)
                json_object_set_new(c, "User", json_string(s));
        if ((s = json_string_value(json_object_get(tj, "start_cmd"))) && *s)
                json_object_set_new(labels, IMAGE_LABEL_START_CMD, json_string(s));
        if ((s = json_string_value(json_object_get(tj, "ready_cmd"))) && *s)
                json_object_set_new(labels, IMAGE_LABEL_READY_CMD, json_string(s));
        json_object_set_new(labels, "dev.hutch.template", json_string(name));
        json_object_set_new(c, "Labels", labels);
        cfg = json_pack("{s:s, s:s, s:o, s:{s:s, s:o}}", "architecture", image_host_arch(), "os",
                        "linux", "config", c, "rootfs", "type", "layers", "diff_ids", diff_ids);
        if (cfg && image_host_variant())
                json_object_set_new(cfg, "variant", json_string(image_host_variant()));
        cfg_txt = cfg ? json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(cfg);
        if (!cfg_txt) {
                json_decref(mlayers);
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        size_t cfg_len = strlen(cfg_txt);
        char cfg_digest[72];
        {
                unsigned char md[32];
                unsigned ml = 0;
                EVP_Digest(cfg_txt, cfg_len, md, &ml, EVP_sha256(), NULL);
                hex_of(md, cfg_digest);
        }
        int k = registry_blob_exists(client, cfg_digest, err);
        if (k == 0)
                k = registry_blob_upload(client, -1, (const uint8_t *) cfg_txt, cfg_len, cfg_digest,
                                         err);
        if (k < 0) {
                json_decref(mlayers);
                r = k;
                goto out;
        }
        man = json_pack("{s:i, s:s, s:{s:s, s:s, s:I}, s:o, s:{s:s, s:s}}", "schemaVersion", 2,
                        "mediaType", IMAGE_MEDIA_OCI_MANIFEST, "config", "mediaType",
                        IMAGE_MEDIA_OCI_CONFIG, "digest", cfg_digest, "size", (json_int_t) cfg_len,
                        "layers", mlayers, "annotations", "dev.hutch.template", name,
                        "dev.hutch.kind", t->kind);
        man_txt = man ? json_dumps(man, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(man);
        if (!man_txt) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        char mdigest[72];
        if ((r = registry_put_manifest(client, rf.tag, (const uint8_t *) man_txt, strlen(man_txt),
                                       IMAGE_MEDIA_OCI_MANIFEST, mdigest, err)) < 0)
                goto out;
        ret->layers = (unsigned) n;
        ret->target = image_reference_format(dest->registry, dest->repository, rf.tag, mdigest);
        if (!ret->target)
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        progress(p, "done", mdigest, 0, 0, (unsigned) n, (unsigned) n);
out:
        for (size_t i = 0; blobs && i < n; i++)
                safe_close(blobs[i].fd);
        free(blobs);
        if (t)
                template_free(t);
        image_candidates_free(cands, n_cands);
        return r;
}

/* ------------------------------------------------- artifacts (snapshots) */

/* The registry and repository a reference names: its own registry, or a
 * short name's first search registry; never a mirror. */
static int artifact_client(const char *data_dir, const char *ref, const image_push_opts *opts,
                           bool push, registry_client **ret, char **ret_tag, hutch_error *err) {
        static const image_push_opts no_opts = { 0 };
        if (!opts)
                opts = &no_opts;
        _cleanup_(image_reference_clear) image_reference rf = { 0 };
        int r = image_reference_parse(ref, &rf, err);
        if (r < 0)
                return r;
        if (rf.digest)
                return hutch_error_set(err, -EINVAL, "%s names a digest, not a tag", ref);
        _cleanup_(registries_conf_clear) registries_conf conf = { 0 };
        image_candidate *cands = NULL;
        size_t n_cands = 0;
        const image_candidate *dest = NULL;
        if ((r = push_dest(data_dir, opts, &rf, &conf, &cands, &n_cands, &dest, err)) < 0)
                return r;
        if (!dest)
                r = hutch_error_set(err, -EINVAL, "%s: no registry", ref);
        else
                r = push_client(data_dir, opts, &conf, dest, push, ret, err);
        image_candidates_free(cands, n_cands);
        if (r >= 0 && !(*ret_tag = strdup(rf.tag))) {
                *ret = registry_client_free(*ret);
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        }
        return r;
}

static int sha256_fd(int fd, char out[72], uint64_t *ret_size) {
        EVP_MD_CTX *h = EVP_MD_CTX_new();
        if (!h || !EVP_DigestInit_ex(h, EVP_sha256(), NULL)) {
                EVP_MD_CTX_free(h);
                return -ENOMEM;
        }
        static unsigned char buf[1 << 16];
        uint64_t off = 0;
        int r = 0;
        for (;;) {
                ssize_t k = pread(fd, buf, sizeof buf, (off_t) off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0) {
                        r = -errno;
                        break;
                }
                if (k == 0)
                        break;
                EVP_DigestUpdate(h, buf, (size_t) k);
                off += (uint64_t) k;
        }
        unsigned char md[32];
        unsigned ml = 0;
        if (r == 0) {
                EVP_DigestFinal_ex(h, md, &ml);
                hex_of(md, out);
                *ret_size = off;
        }
        EVP_MD_CTX_free(h);
        return r;
}

int image_push_artifact(const char *data_dir, const char *ref, const image_push_opts *opts,
                        const char *config_type, const char *config, const char *layer_type, int fd,
                        char ret_digest[72], hutch_error *err) {
        _cleanup_(client_freep) registry_client *c = NULL;
        _cleanup_free_ char *tag = NULL;
        int r = artifact_client(data_dir, ref, opts, true, &c, &tag, err);
        if (r < 0)
                return r;
        char ldigest[72], cdigest[72];
        uint64_t lsize = 0;
        if ((r = sha256_fd(fd, ldigest, &lsize)) < 0)
                return hutch_error_set(err, r, "reading the artifact: %s", strerror(-r));
        size_t clen = strlen(config);
        {
                unsigned char md[32];
                unsigned ml = 0;
                EVP_Digest(config, clen, md, &ml, EVP_sha256(), NULL);
                hex_of(md, cdigest);
        }
        int k = registry_blob_exists(c, ldigest, err);
        if (k == 0)
                k = registry_blob_upload(c, fd, NULL, lsize, ldigest, err);
        if (k >= 0)
                k = registry_blob_exists(c, cdigest, err);
        if (k == 0)
                k = registry_blob_upload(c, -1, (const uint8_t *) config, clen, cdigest, err);
        if (k < 0)
                return k;
        json_t *man = json_pack("{s:i, s:s, s:s, s:{s:s, s:s, s:I}, s:[{s:s, s:s, s:I}]}",
                                "schemaVersion", 2, "mediaType", IMAGE_MEDIA_OCI_MANIFEST,
                                "artifactType", config_type, "config", "mediaType", config_type,
                                "digest", cdigest, "size", (json_int_t) clen, "layers", "mediaType",
                                layer_type, "digest", ldigest, "size", (json_int_t) lsize);
        _cleanup_free_ char *txt = man ? json_dumps(man, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(man);
        if (!txt)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        return registry_put_manifest(c, tag, (const uint8_t *) txt, strlen(txt),
                                     IMAGE_MEDIA_OCI_MANIFEST, ret_digest, err);
}

int image_pull_artifact(const char *data_dir, const char *ref, const image_push_opts *opts,
                        const char *config_type, const char *layer_type, uint64_t max_layer,
                        char **ret_config, int out_fd, hutch_error *err) {
        _cleanup_(client_freep) registry_client *c = NULL;
        _cleanup_free_ char *tag = NULL;
        int r = artifact_client(data_dir, ref, opts, false, &c, &tag, err);
        if (r < 0)
                return r;
        _cleanup_free_ uint8_t *mbuf = NULL;
        _cleanup_free_ char *mtype = NULL;
        size_t mlen = 0;
        char mdigest[72];
        if ((r = registry_get_manifest(c, tag, &mbuf, &mlen, &mtype, mdigest, err)) < 0)
                return r;
        image_descriptor cd = { 0 }, ld = { 0 };
        if ((r = image_artifact_parse(mbuf, mlen, config_type, layer_type, &cd, &ld, err)) < 0)
                return r;
        char blob_dir[PATH_MAX];
        snprintf(blob_dir, sizeof blob_dir, "%s/images/blobs/sha256", data_dir);
        int cfd = -1, lfd = -1;
        char cpath[PATH_MAX] = "", lpath[PATH_MAX] = "";
        if (cd.size > IMAGE_MAX_MANIFEST || (uint64_t) ld.size > max_layer) {
                r = hutch_error_set(err, -EFBIG, "%s is larger than this node takes", ref);
                goto out;
        }
        registry_blob want[2] = { { cd.digest, cd.size }, { ld.digest, ld.size } };
        if ((r = registry_fetch_blobs(c, want, 2, NULL, NULL, NULL, NULL, err)) < 0)
                goto out;
        /* verified (digest and size) into the cache: taken out of it now */
        if (registry_cache_path(blob_dir, cd.digest, cpath, sizeof cpath) < 0 || !cpath[0] ||
            registry_cache_path(blob_dir, ld.digest, lpath, sizeof lpath) < 0 || !lpath[0] ||
            (cfd = open(cpath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0 ||
            (lfd = open(lpath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0) {
                r = hutch_error_set(err, -EIO, "the artifact's blobs vanished from the cache");
                goto out;
        }
        char *cfg = calloc(1, (size_t) cd.size + 1);
        if (!cfg) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        if (pread(cfd, cfg, (size_t) cd.size, 0) != (ssize_t) cd.size ||
            strlen(cfg) != (size_t) cd.size) {
                free(cfg);
                r = hutch_error_set(err, -EBADMSG, "the artifact's config is not text");
                goto out;
        }
        static unsigned char buf[1 << 16];
        for (uint64_t off = 0;;) {
                ssize_t k = pread(lfd, buf, sizeof buf, (off_t) off);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 || (k > 0 && fd_write_all(out_fd, buf, (size_t) k) < 0)) {
                        free(cfg);
                        r = hutch_error_set(err, -EIO, "copying the artifact: %m");
                        goto out;
                }
                if (k == 0)
                        break;
                off += (uint64_t) k;
        }
        *ret_config = cfg;
out:
        safe_close(cfd);
        safe_close(lfd);
        if (cpath[0])
                (void) unlink(cpath);
        if (lpath[0])
                (void) unlink(lpath);
        free(cd.media_type);
        free(cd.digest);
        free(ld.media_type);
        free(ld.digest);
        return r;
}
