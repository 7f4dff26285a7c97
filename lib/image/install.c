/* SPDX-License-Identifier: Apache-2.0 */
/*
 * image_install: a verified manifest, its config and its layers become a
 * template version. image_import: the same from a `docker save` archive or
 * an OCI image layout (a directory, or a tar of one), read in place.
 */
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/image-internal.h"
#include "image/layer.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

static void progress(const image_progress *p, const char *phase, const char *digest, uint64_t done,
                     uint64_t total, unsigned layer, unsigned n) {
        if (!p || !p->fn)
                return;
        image_progress_event ev = { phase, digest, done, total, layer, n };
        p->fn(p->arg, &ev);
}

/* A small blob (manifest, config), read whole and checked against digest
 * and size before it is parsed. */
static int read_small_blob(image_blob_open_fn open_blob, void *arg, const char *digest,
                           int64_t size, uint8_t **ret, size_t *ret_len, hutch_error *err) {
        int fd = -1;
        int r = open_blob(arg, digest, &fd, err);
        if (r < 0)
                return r;
        _cleanup_close_ int cfd = fd;
        struct stat st;
        if (fstat(cfd, &st) < 0 || !S_ISREG(st.st_mode))
                return hutch_error_set(err, -EINVAL, "blob %s is not a regular file", digest);
        if (st.st_size > (off_t) IMAGE_MAX_MANIFEST || (size >= 0 && st.st_size != size))
                return hutch_error_set(err, -EBADMSG, "blob %s is %lld bytes, the manifest says %lld",
                                       digest, (long long) st.st_size, (long long) size);
        uint8_t *buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        ssize_t n = pread(cfd, buf, (size_t) st.st_size + 1, 0);
        if (n != st.st_size) {
                free(buf);
                return hutch_error_set(err, -EIO, "reading blob %s: short read", digest);
        }
        if (digest) {
                EVP_MD_CTX *md = EVP_MD_CTX_new();
                char hex[65] = "";
                if (md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1)
                        EVP_DigestUpdate(md, buf, (size_t) n), sha256_hex_final(md, hex);
                EVP_MD_CTX_free(md);
                if (!streq(hex, digest + 7)) {
                        free(buf);
                        return hutch_error_set(err, -EBADMSG,
                                               "blob %s has digest sha256:%s: refused", digest, hex);
                }
        }
        *ret = buf;
        *ret_len = (size_t) n;
        return 0;
}

int layer_store_hold(const char *data_dir, hutch_error *err) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/layers", data_dir);
        int r = mkdir_p(p, 0700);
        if (r >= 0 && chmod(p, 0700) < 0)
                r = -errno;
        snprintf(p, sizeof p, "%s/layers/sha256", data_dir);
        if (r >= 0)
                r = mkdir_p(p, 0700);
        if (r < 0)
                return hutch_error_set(err, r, "creating %s: %s", p, strerror(-r));
        snprintf(p, sizeof p, "%s/layers/sha256/.busy", data_dir);
        int fd = open(p, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", p);
        while (flock(fd, LOCK_SH) < 0)
                if (errno != EINTR) {
                        close(fd);
                        return hutch_error_set(err, -errno, "locking %s: %m", p);
                }
        return fd;
}

typedef struct layer_src {
        const char *key;         /* what open_blob is asked for */
        const char *blob_digest; /* NULL: the blob is the uncompressed tar (docker save) */
        uint64_t size;           /* UINT64_MAX: unknown */
} layer_src;

static int install_layers(const char *data_dir, const char *name, int64_t team, const char *source,
                          const image_config *cfg, const layer_src *src, size_t n,
                          image_blob_open_fn open_blob, void *arg, const image_progress *p,
                          hutch_error *err) {
        if (n != cfg->n_diff_ids)
                return hutch_error_set(
                        err, -EBADMSG,
                        "the manifest lists %zu layers, the config's rootfs.diff_ids %zu", n,
                        cfg->n_diff_ids);
        if (cfg->os && !streq(cfg->os, "linux"))
                return hutch_error_set(err, -EPROTONOSUPPORT, "the image is for %.40s, not linux",
                                       cfg->os);
        if (cfg->architecture && *cfg->architecture && !streq(cfg->architecture, image_host_arch()))
                return hutch_error_set(err, -EPROTONOSUPPORT,
                                       "the image is for %.40s, this host is %s", cfg->architecture,
                                       image_host_arch());
        _cleanup_close_ int busy = layer_store_hold(data_dir, err);
        if (busy < 0)
                return busy;
        for (size_t i = 0; i < n; i++) {
                char have[PATH_MAX];
                int r = layer_path(data_dir, cfg->diff_ids[i], have, sizeof have);
                if (r < 0)
                        return hutch_error_set(err, r, "layer %s: %s", cfg->diff_ids[i],
                                               strerror(-r));
                if (have[0]) {
                        progress(p, "exists", cfg->diff_ids[i], 0, 0, (unsigned) i + 1, (unsigned) n);
                        continue; /* never read again */
                }
                progress(p, "layer", cfg->diff_ids[i], 0, src[i].size, (unsigned) i + 1,
                         (unsigned) n);
                int fd = -1;
                if ((r = open_blob(arg, src[i].key, &fd, err)) < 0)
                        return r;
                struct stat st;
                if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                        close(fd);
                        return hutch_error_set(err, -EINVAL, "layer blob %s is not a regular file",
                                               src[i].key);
                }
                r = layer_unpack(data_dir, fd, src[i].blob_digest, cfg->diff_ids[i], src[i].size,
                                 err);
                close(fd);
                if (r < 0)
                        return r;
                progress(p, "layer-done", cfg->diff_ids[i], (uint64_t) st.st_size,
                         (uint64_t) st.st_size, (unsigned) i + 1, (unsigned) n);
        }
        hutch_template_meta meta = {
                .name = name,
                .kind = "image",
                .team = team,
                .source = source,
                .layers = cfg->diff_ids,
                .env = cfg->env,
                .workdir = cfg->workdir,
                .user = cfg->user,
                .cmd = cfg->cmd,
                .start_cmd = cfg->start_cmd && *cfg->start_cmd ? cfg->start_cmd : NULL,
                .ready_cmd = cfg->ready_cmd && *cfg->ready_cmd ? cfg->ready_cmd : NULL,
        };
        int r = template_write(data_dir, &meta, err);
        if (r < 0)
                return r;
        progress(p, "done", NULL, 0, 0, (unsigned) n, (unsigned) n);
        return 0;
}

int image_install(const char *data_dir, const char *name, const char *source, const uint8_t *manifest,
                  size_t len, const char *media_type, image_blob_open_fn open_blob, void *arg,
                  const image_progress *p, hutch_error *err) {
        return image_install_team(data_dir, name, 0, source, manifest, len, media_type, open_blob,
                                  arg, p, err);
}

int image_install_team(const char *data_dir, const char *name, int64_t team, const char *source,
                       const uint8_t *manifest, size_t len, const char *media_type,
                       image_blob_open_fn open_blob, void *arg, const image_progress *p,
                       hutch_error *err) {
        if (template_validate_name(name) < 0 || streq(name, "host") || streq(name, "base"))
                return hutch_error_set(err, -EINVAL, "invalid template name '%s'", name ? name : "");
        image_manifest m = { 0 }, chosen = { 0 };
        image_config cfg = { 0 };
        uint8_t *mbuf = NULL, *cbuf = NULL;
        size_t mlen = 0, clen = 0;
        layer_src *src = NULL;
        progress(p, "resolve", NULL, 0, 0, 0, 0);
        int r = image_manifest_parse(manifest, len, media_type, &m, err);
        if (r < 0)
                goto out;
        const image_manifest *im = &m;
        /* an index may name one more index (an OCI layout's index.json
         * naming a multi-platform image), never deeper */
        for (unsigned depth = 0; im->is_index; depth++) {
                if (depth == 2) {
                        r = hutch_error_set(err, -EBADMSG,
                                            "image indexes nested more than two deep: refused");
                        goto out;
                }
                image_manifest next = { 0 };
                free(mbuf);
                mbuf = NULL;
                if ((r = read_small_blob(open_blob, arg, im->chosen.digest, im->chosen.size, &mbuf,
                                         &mlen, err)) < 0)
                        goto out;
                const char *mt = im->chosen.media_type[0] ? im->chosen.media_type : NULL;
                if ((r = image_manifest_parse(mbuf, mlen, mt, &next, err)) < 0)
                        goto out;
                image_manifest_clear(&chosen);
                chosen = next;
                im = &chosen;
        }
        progress(p, "config", im->config.digest, 0, (uint64_t) im->config.size, 0,
                 (unsigned) im->n_layers);
        if ((r = read_small_blob(open_blob, arg, im->config.digest, im->config.size, &cbuf, &clen,
                                 err)) < 0 ||
            (r = image_config_parse(cbuf, clen, &cfg, err)) < 0)
                goto out;
        src = calloc(im->n_layers ? im->n_layers : 1, sizeof *src);
        if (!src) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        for (size_t i = 0; i < im->n_layers; i++)
                src[i] = (layer_src) { im->layers[i].digest, im->layers[i].digest,
                                       (uint64_t) im->layers[i].size };
        r = install_layers(data_dir, name, team, source, &cfg, src, im->n_layers, open_blob, arg, p,
                           err);
out:
        free(src);
        free(mbuf);
        free(cbuf);
        image_manifest_clear(&m);
        image_manifest_clear(&chosen);
        image_config_clear(&cfg);
        return r;
}

/* ------------------------------------------------------------- import */

/* The input: a directory (read with every lookup beneath it, no symlinks)
 * or a tar (each member we need copied out into a private temp file, once,
 * under a name of ours: the archive's names are never used as host paths). */
typedef struct import_src {
        const char *data_dir;
        int dirfd;       /* a directory, or -1 */
        const char *tar; /* a tar file, or NULL */
        char tmpdir[PATH_MAX];
        unsigned seq;
} import_src;

static int normalize(const char *in, char *out, size_t n) {
        while (startswith(in, "./"))
                in += 2;
        if (!*in || in[0] == '/' || strstr(in, "..") || strlen(in) >= n)
                return -EINVAL;
        snprintf(out, n, "%s", in);
        return 0;
}

/* Copy the member named want out of the tar into a temp file; its fd. */
static int tar_member(import_src *s, const char *want, uint64_t max, int *ret_fd, hutch_error *err) {
        struct archive *a = archive_read_new();
        if (!a)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        archive_read_support_format_tar(a);
        archive_read_support_filter_gzip(a);
        archive_read_support_filter_zstd(a);
        int r = -ENOENT;
        if (archive_read_open_filename(a, s->tar, 1 << 16) != ARCHIVE_OK) {
                r = hutch_error_set(err, -EBADMSG, "%s: %s", s->tar, archive_error_string(a));
                archive_read_free(a);
                return r;
        }
        for (unsigned count = 0;; count++) {
                struct archive_entry *e;
                int k = archive_read_next_header(a, &e);
                if (k == ARCHIVE_EOF)
                        break;
                if ((k != ARCHIVE_OK && k != ARCHIVE_WARN) || count > 1000000) {
                        r = hutch_error_set(err, -EBADMSG, "%s: %s", s->tar, archive_error_string(a));
                        break;
                }
                char nm[1024];
                if (archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e) ||
                    normalize(archive_entry_pathname(e) ? archive_entry_pathname(e) : "", nm,
                              sizeof nm) < 0 ||
                    !streq(nm, want))
                        continue;
                if (archive_entry_size(e) < 0 || (uint64_t) archive_entry_size(e) > max) {
                        r = hutch_error_set(err, -EFBIG, "%s: member %s is larger than %llu bytes",
                                            s->tar, want, (unsigned long long) max);
                        break;
                }
                if (!s->tmpdir[0]) {
                        snprintf(s->tmpdir, sizeof s->tmpdir, "%s/layers/sha256/.tmp-import-%d",
                                 s->data_dir, (int) getpid());
                        (void) rm_rf_at(AT_FDCWD, s->tmpdir);
                        int busy = layer_store_hold(s->data_dir, err); /* creates the store, 0700 */
                        if (busy < 0) {
                                r = busy;
                                s->tmpdir[0] = 0;
                                break;
                        }
                        close(busy);
                        if (mkdir(s->tmpdir, 0700) < 0) {
                                r = hutch_error_set(err, -errno, "creating %s: %m", s->tmpdir);
                                s->tmpdir[0] = 0;
                                break;
                        }
                }
                char tp[PATH_MAX];
                snprintf(tp, sizeof tp, "%s/m%u", s->tmpdir, s->seq++);
                int fd = open(tp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0) {
                        r = hutch_error_set(err, -errno, "creating %s: %m", tp);
                        break;
                }
                unlink(tp); /* the fd is all we need */
                r = 0;
                const void *buf;
                size_t len;
                la_int64_t off;
                while ((k = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK)
                        if (pwrite(fd, buf, len, off) != (ssize_t) len) {
                                r = hutch_error_set(err, -errno, "writing %s: %m", tp);
                                break;
                        }
                if (r == 0 && k != ARCHIVE_EOF)
                        r = hutch_error_set(err, -EBADMSG, "%s: member %s: %s", s->tar, want,
                                            archive_error_string(a));
                if (r == 0 && ftruncate(fd, archive_entry_size(e)) < 0)
                        r = hutch_error_set(err, -errno, "writing %s: %m", tp);
                if (r < 0) {
                        close(fd);
                        break;
                }
                *ret_fd = fd;
                break;
        }
        archive_read_free(a);
        if (r == -ENOENT)
                return hutch_error_set(err, -ENOENT, "%s has no %s", s->tar, want);
        return r;
}

static int src_open(import_src *s, const char *name, uint64_t max, int *ret_fd, hutch_error *err) {
        char nm[1024];
        if (normalize(name, nm, sizeof nm) < 0)
                return hutch_error_set(err, -EINVAL, "refusing the path '%.200s' in the image", name);
        if (s->tar)
                return tar_member(s, nm, max, ret_fd, err);
        struct open_how how = { .flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
                                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                        RESOLVE_NO_MAGICLINKS };
        int fd = sys_openat2(s->dirfd, nm, &how, sizeof how);
        if (fd < 0)
                return hutch_error_set(err, -errno, "the image has no %s: %m", nm);
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t) st.st_size > max) {
                close(fd);
                return hutch_error_set(err, -EINVAL,
                                       "%s in the image is not a regular file of at most %llu bytes",
                                       nm, (unsigned long long) max);
        }
        *ret_fd = fd;
        return 0;
}

static int src_read(import_src *s, const char *name, char **ret, size_t *ret_len, hutch_error *err) {
        int fd = -1;
        int r = src_open(s, name, IMAGE_MAX_MANIFEST, &fd, err);
        if (r < 0)
                return r;
        struct stat st;
        if (fstat(fd, &st) < 0) {
                close(fd);
                return hutch_error_set(err, -errno, "%s: %m", name);
        }
        char *buf = malloc((size_t) st.st_size + 1);
        ssize_t n = buf ? pread(fd, buf, (size_t) st.st_size, 0) : -1;
        close(fd);
        if (n != st.st_size) {
                free(buf);
                return hutch_error_set(err, -EIO, "reading %s: short read", name);
        }
        buf[n] = 0;
        *ret = buf;
        *ret_len = (size_t) n;
        return 0;
}

/* OCI layout: blobs/sha256/<hex> */
static int oci_open_blob(void *arg, const char *digest, int *ret_fd, hutch_error *err) {
        if (!layer_digest_valid(digest))
                return hutch_error_set(err, -EINVAL, "invalid digest '%.80s'", digest ? digest : "");
        char p[128];
        snprintf(p, sizeof p, "blobs/sha256/%s", digest + 7);
        return src_open(arg, p, LAYER_MAX_EXPANSION, ret_fd, err);
}

/* docker save: blobs are named by the archive's manifest.json */
static int path_open_blob(void *arg, const char *path, int *ret_fd, hutch_error *err) {
        return src_open(arg, path, LAYER_MAX_EXPANSION, ret_fd, err);
}

static void name_from_tag(const char *tag, char *out, size_t n) {
        /* "docker.io/library/python:3.12" -> "python-3.12" */
        const char *slash = strrchr(tag, '/');
        const char *t = slash ? slash + 1 : tag;
        size_t k = 0;
        for (; *t && k + 1 < n; t++) {
                char c = *t;
                if (c >= 'A' && c <= 'Z')
                        c = (char) (c - 'A' + 'a');
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                      c == '-'))
                        c = '-';
                if (k == 0 && (c == '-' || c == '.' || c == '_'))
                        continue;
                out[k++] = c;
        }
        out[k] = 0;
}

static int import_docker(import_src *s, const char *json, size_t len, const char *name,
                         const char *source, const image_progress *p, char *ret_name, size_t rn,
                         hutch_error *err) {
        json_error_t je;
        json_t *j = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
        int r = 0;
        uint8_t *cbuf = NULL;
        char *craw = NULL;
        size_t clen = 0;
        image_config cfg = { 0 };
        layer_src *src = NULL;
        if (!json_is_array(j) || json_array_size(j) != 1) {
                r = hutch_error_set(
                        err, -EBADMSG,
                        "manifest.json must list exactly one image (docker save of one image)");
                goto out;
        }
        json_t *im = json_array_get(j, 0), *layers = json_object_get(im, "Layers");
        const char *config = json_string_value(json_object_get(im, "Config"));
        const char *tag = json_string_value(json_array_get(json_object_get(im, "RepoTags"), 0));
        if (!config || !json_is_array(layers) || json_array_size(layers) > IMAGE_MAX_LAYERS) {
                r = hutch_error_set(err, -EBADMSG,
                                    "manifest.json: no Config or Layers (or more than %u layers)",
                                    IMAGE_MAX_LAYERS);
                goto out;
        }
        /* the config is named by its digest (the image id): check it */
        const char *base = strrchr(config, '/') ? strrchr(config, '/') + 1 : config;
        char digest[80];
        snprintf(digest, sizeof digest, "sha256:%.64s", base);
        if (!layer_digest_valid(digest)) {
                r = hutch_error_set(err, -EBADMSG,
                                    "manifest.json: Config '%.100s' is not named by its digest",
                                    config);
                goto out;
        }
        if ((r = src_read(s, config, &craw, &clen, err)) < 0)
                goto out;
        {
                int fd = -1;
                char hex[65];
                if ((r = src_open(s, config, IMAGE_MAX_MANIFEST, &fd, err)) < 0)
                        goto out;
                r = image_hash_fd(fd, IMAGE_MAX_MANIFEST, hex, NULL);
                close(fd);
                if (r < 0 || !streq(hex, digest + 7)) {
                        r = hutch_error_set(
                                err, -EBADMSG,
                                "the config %s does not have the digest its name says: refused",
                                config);
                        goto out;
                }
        }
        cbuf = (uint8_t *) craw;
        craw = NULL;
        if ((r = image_config_parse(cbuf, clen, &cfg, err)) < 0)
                goto out;
        size_t n = json_array_size(layers);
        src = calloc(n ? n : 1, sizeof *src);
        if (!src) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                const char *l = json_string_value(json_array_get(layers, i));
                if (!l) {
                        r = hutch_error_set(err, -EBADMSG,
                                            "manifest.json: layer %zu is not a string", i);
                        goto out;
                }
                src[i] = (layer_src) { l, NULL, UINT64_MAX };
        }
        char nm[64];
        if (name)
                snprintf(nm, sizeof nm, "%s", name);
        else
                name_from_tag(tag ? tag : "", nm, sizeof nm);
        if (template_validate_name(nm) < 0 || streq(nm, "host") || streq(nm, "base")) {
                r = hutch_error_set(err, -EINVAL,
                                    "no valid template name from the archive ('%s'): give --name",
                                    nm);
                goto out;
        }
        snprintf(ret_name, rn, "%s", nm);
        char srcdesc[512];
        snprintf(srcdesc, sizeof srcdesc, "%s%s%s", source, tag ? " " : "", tag ? tag : "");
        r = install_layers(s->data_dir, nm, 0, srcdesc, &cfg, src, n,
                           (image_blob_open_fn) path_open_blob, s, p, err);
out:
        json_decref(j);
        free(craw);
        free(cbuf);
        free(src);
        image_config_clear(&cfg);
        return r;
}

int image_import(const char *data_dir, const char *path, const char *name, const image_progress *p,
                 char **ret_name, hutch_error *err) {
        import_src s = { .data_dir = data_dir, .dirfd = -1 };
        struct stat st;
        if (stat(path, &st) < 0)
                return hutch_error_set(err, -errno, "%s: %m", path);
        if (S_ISDIR(st.st_mode)) {
                s.dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (s.dirfd < 0)
                        return hutch_error_set(err, -errno, "%s: %m", path);
        } else if (S_ISREG(st.st_mode))
                s.tar = path;
        else
                return hutch_error_set(err, -EINVAL, "%s is neither a directory nor an archive",
                                       path);
        char *buf = NULL, nm[64] = "";
        size_t len = 0;
        hutch_error e2 = { 0 };
        int r;
        /* an OCI layout (docker save of Docker 25+ is one too) */
        if (src_read(&s, "oci-layout", &buf, &len, &e2) >= 0) {
                free(buf);
                buf = NULL;
                if ((r = src_read(&s, "index.json", &buf, &len, err)) < 0)
                        goto out;
                /* the name: --name, else the layout's ref name annotation */
                json_t *j = json_loadb(buf, len, 0, NULL);
                const char *ref = json_string_value(json_object_get(
                        json_object_get(json_array_get(json_object_get(j, "manifests"), 0),
                                        "annotations"),
                        "io.containerd.image.name"));
                if (!ref)
                        ref = json_string_value(json_object_get(
                                json_object_get(json_array_get(json_object_get(j, "manifests"), 0),
                                                "annotations"),
                                "org.opencontainers.image.ref.name"));
                if (name)
                        snprintf(nm, sizeof nm, "%s", name);
                else
                        name_from_tag(ref ? ref : "", nm, sizeof nm);
                json_decref(j);
                if (template_validate_name(nm) < 0 || streq(nm, "host") || streq(nm, "base")) {
                        r = hutch_error_set(
                                err, -EINVAL,
                                "no valid template name from the layout ('%s'): give --name", nm);
                        goto out;
                }
                char source[PATH_MAX + 16];
                snprintf(source, sizeof source, "oci:%s", path);
                r = image_install(data_dir, nm, source, (const uint8_t *) buf, len,
                                  IMAGE_MEDIA_OCI_INDEX, oci_open_blob, &s, p, err);
                goto out;
        }
        if ((r = src_read(&s, "manifest.json", &buf, &len, err)) < 0) {
                hutch_error_set(
                        err, r,
                        "%s is neither an OCI image layout (oci-layout, index.json) nor a docker save "
                        "archive (manifest.json)",
                        path);
                goto out;
        }
        char source[PATH_MAX + 16];
        snprintf(source, sizeof source, "docker-archive:%s", path);
        r = import_docker(&s, buf, len, name, source, p, nm, sizeof nm, err);
out:
        free(buf);
        safe_close(s.dirfd);
        if (s.tmpdir[0])
                (void) rm_rf_at(AT_FDCWD, s.tmpdir);
        if (r >= 0 && ret_name && !(*ret_name = strdup(nm)))
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        return r;
}

/* ------------------------------------------------------- a plain tar */

int image_tar_layer(const char *data_dir, int fd, char ret_digest[LAYER_DIGEST_MAX],
                    bool *ret_existed, hutch_error *err) {
        char hex[65];
        uint64_t size = 0;
        int r = image_hash_fd(fd, LAYER_MAX_EXPANSION, hex, &size);
        if (r < 0)
                return hutch_error_set(err, r, "reading the layer's tar: %s", strerror(-r));
        snprintf(ret_digest, LAYER_DIGEST_MAX, "sha256:%s", hex);
        if (lseek(fd, 0, SEEK_SET) < 0)
                return hutch_error_set(err, -errno, "reading the layer's tar: %m");
        /* the tar is checked like any image layer: its digest again while
         * it streams, and every entry by the unpacker */
        r = layer_unpack(data_dir, fd, NULL, ret_digest, size, err);
        if (r < 0)
                return r;
        *ret_existed = r == 1;
        return 0;
}
