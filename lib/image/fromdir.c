/* SPDX-License-Identifier: Apache-2.0 */
/*
 * layer_from_dir: a sandbox's writable layer (overlay upper format) becomes
 * a store layer. The tree was written by untrusted code: it is walked with
 * *at calls that follow no symlink, written out as a canonical tar (names
 * sorted, ids shifted back into 0..65535, overlay whiteouts and opaque
 * directories turned into OCI ones), and that tar then goes through the
 * same unpacker as any image layer (layer_unpack), so the store only ever
 * holds what the unpacker wrote.
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "image/image-internal.h"
#include "image/layer.h"
#include "util/error.h"
#include "util/fdutil.h"

typedef struct walk {
        struct archive *a;
        uid_t shift;
        uint64_t entries;
        /* hardlinks: the first path of each inode with more than one link */
        struct {
                dev_t dev;
                ino_t ino;
                char *path;
        } * links;
        size_t n_links;
        hutch_error *err;
} walk;

static int cmp_names(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static int entry_ids(walk *w, const struct stat *st, const char *path, la_int64_t *uid,
                     la_int64_t *gid) {
        if (st->st_uid < w->shift || st->st_uid - w->shift > 65535 || st->st_gid < w->shift ||
            st->st_gid - w->shift > 65535)
                return hutch_error_set(w->err, -ERANGE,
                                       "%s is owned by %u:%u, outside the sandbox's range", path,
                                       (unsigned) st->st_uid, (unsigned) st->st_gid);
        *uid = st->st_uid - w->shift;
        *gid = st->st_gid - w->shift;
        return 0;
}

static int write_header(walk *w, struct archive_entry *e, const char *path) {
        if (archive_write_header(w->a, e) != ARCHIVE_OK)
                return hutch_error_set(w->err, -EIO, "writing the tar entry %s: %s", path,
                                       archive_error_string(w->a));
        return 0;
}

static int add_plain(walk *w, const char *path, mode_t type, mode_t mode) {
        struct archive_entry *e = archive_entry_new();
        if (!e)
                return hutch_error_set(w->err, -ENOMEM, "out of memory");
        archive_entry_set_pathname(e, path);
        archive_entry_set_filetype(e, type);
        archive_entry_set_perm(e, mode);
        int r = write_header(w, e, path);
        archive_entry_free(e);
        return r;
}

static int walk_dir(walk *w, int dfd, const char *prefix, unsigned depth);

static int add_entry(walk *w, int dfd, const char *name, const char *prefix, unsigned depth) {
        char path[LAYER_MAX_PATH + 1];
        if ((size_t) snprintf(path, sizeof path, "%s%s", prefix, name) >= sizeof path)
                return hutch_error_set(w->err, -ENAMETOOLONG,
                                       "a path in the layer is longer than %u bytes", LAYER_MAX_PATH);
        if (++w->entries > LAYER_MAX_ENTRIES)
                return hutch_error_set(w->err, -E2BIG, "the layer has more than %u entries",
                                       LAYER_MAX_ENTRIES);
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return hutch_error_set(w->err, -errno, "%s: %m", path);
        /* an overlay whiteout becomes an OCI one */
        if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
                char wh[LAYER_MAX_PATH + 8];
                snprintf(wh, sizeof wh, "%s.wh.%s", prefix, name);
                return add_plain(w, wh, AE_IFREG, 0644);
        }
        if (S_ISSOCK(st.st_mode))
                return 0; /* not kept in images */
        if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
                return hutch_error_set(w->err, -EPERM, "%s is a device node", path);
        la_int64_t uid = 0, gid = 0;
        int r = entry_ids(w, &st, path, &uid, &gid);
        if (r < 0)
                return r;
        struct archive_entry *e = archive_entry_new();
        if (!e)
                return hutch_error_set(w->err, -ENOMEM, "out of memory");
        archive_entry_set_pathname(e, path);
        archive_entry_set_uid(e, uid);
        archive_entry_set_gid(e, gid);
        archive_entry_set_perm(e, st.st_mode & 07777);
        archive_entry_set_mtime(e, st.st_mtim.tv_sec, 0);
        _cleanup_close_ int fd = -1;
        if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
                for (size_t i = 0; i < w->n_links; i++)
                        if (w->links[i].dev == st.st_dev && w->links[i].ino == st.st_ino) {
                                archive_entry_set_filetype(e, AE_IFREG);
                                archive_entry_set_hardlink(e, w->links[i].path);
                                archive_entry_set_size(e, 0);
                                r = write_header(w, e, path);
                                archive_entry_free(e);
                                return r;
                        }
                void *nl = reallocarray(w->links, w->n_links + 1, sizeof *w->links);
                char *p = strdup(path);
                if (!nl || !p) {
                        free(p);
                        if (nl)
                                w->links = nl;
                        archive_entry_free(e);
                        return hutch_error_set(w->err, -ENOMEM, "out of memory");
                }
                w->links = nl;
                w->links[w->n_links].dev = st.st_dev;
                w->links[w->n_links].ino = st.st_ino;
                w->links[w->n_links].path = p;
                w->n_links++;
        }
        if (S_ISREG(st.st_mode)) {
                fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
                struct stat fst;
                if (fd < 0 || fstat(fd, &fst) < 0 || fst.st_ino != st.st_ino ||
                    !S_ISREG(fst.st_mode)) {
                        archive_entry_free(e);
                        return hutch_error_set(w->err, -EIO, "%s changed while it was read", path);
                }
                archive_entry_set_filetype(e, AE_IFREG);
                archive_entry_set_size(e, fst.st_size);
                /* user.* xattrs only, and never the overlay's own */
                char names[4096];
                ssize_t nl = flistxattr(fd, names, sizeof names);
                for (ssize_t off = 0; nl > 0 && off < nl; off += (ssize_t) strlen(names + off) + 1) {
                        const char *xn = names + off;
                        if (!startswith(xn, "user.") || startswith(xn, "user.overlay."))
                                continue;
                        char val[4096];
                        ssize_t vl = fgetxattr(fd, xn, val, sizeof val);
                        if (vl >= 0)
                                archive_entry_xattr_add_entry(e, xn, val, (size_t) vl);
                }
                if ((r = write_header(w, e, path)) < 0) {
                        archive_entry_free(e);
                        return r;
                }
                archive_entry_free(e);
                char buf[65536];
                off_t left = fst.st_size;
                while (left > 0) {
                        ssize_t n = read(fd, buf, (size_t) MIN((off_t) sizeof buf, left));
                        if (n <= 0)
                                return hutch_error_set(w->err, n < 0 ? -errno : -EIO,
                                                       "%s changed while it was read", path);
                        if (archive_write_data(w->a, buf, (size_t) n) != n)
                                return hutch_error_set(w->err, -EIO, "writing %s: %s", path,
                                                       archive_error_string(w->a));
                        left -= n;
                }
                return 0;
        }
        if (S_ISLNK(st.st_mode)) {
                char target[LAYER_MAX_PATH];
                ssize_t n = readlinkat(dfd, name, target, sizeof target - 1);
                if (n <= 0) {
                        archive_entry_free(e);
                        return hutch_error_set(w->err, n < 0 ? -errno : -EINVAL,
                                               "%s: unreadable symlink", path);
                }
                target[n] = 0;
                archive_entry_set_filetype(e, AE_IFLNK);
                archive_entry_set_symlink(e, target);
                r = write_header(w, e, path);
                archive_entry_free(e);
                return r;
        }
        if (S_ISFIFO(st.st_mode)) {
                archive_entry_set_filetype(e, AE_IFIFO);
                r = write_header(w, e, path);
                archive_entry_free(e);
                return r;
        }
        if (!S_ISDIR(st.st_mode)) {
                archive_entry_free(e);
                return 0;
        }
        if (depth >= LAYER_MAX_DEPTH) {
                archive_entry_free(e);
                return hutch_error_set(w->err, -ELOOP, "%s is deeper than %u directories", path,
                                       LAYER_MAX_DEPTH);
        }
        fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
                archive_entry_free(e);
                return hutch_error_set(w->err, -errno, "%s: %m", path);
        }
        char dirpath[LAYER_MAX_PATH + 2];
        snprintf(dirpath, sizeof dirpath, "%s/", path);
        archive_entry_set_pathname(e, dirpath);
        archive_entry_set_filetype(e, AE_IFDIR);
        r = write_header(w, e, dirpath);
        archive_entry_free(e);
        if (r < 0)
                return r;
        char v[2];
        if ((fgetxattr(fd, "user.overlay.opaque", v, sizeof v) == 1 ||
             fgetxattr(fd, "trusted.overlay.opaque", v, sizeof v) == 1) &&
            v[0] == 'y') {
                char opq[LAYER_MAX_PATH + 16];
                snprintf(opq, sizeof opq, "%s.wh..wh..opq", dirpath);
                if ((r = add_plain(w, opq, AE_IFREG, 0644)) < 0)
                        return r;
        }
        return walk_dir(w, fd, dirpath, depth + 1);
}

static int walk_dir(walk *w, int dfd, const char *prefix, unsigned depth) {
        int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (!d) {
                safe_close(fd);
                return hutch_error_set(w->err, -errno, "reading %s: %m", *prefix ? prefix : "/");
        }
        char **names = NULL;
        size_t n = 0;
        int r = 0;
        for (struct dirent *de; (de = readdir(d));) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                char **nn = reallocarray(names, n + 1, sizeof *names);
                if (!nn || !(nn[n] = strdup(de->d_name))) {
                        names = nn ? nn : names;
                        r = hutch_error_set(w->err, -ENOMEM, "out of memory");
                        break;
                }
                names = nn;
                n++;
        }
        if (r == 0 && n)
                qsort(names, n, sizeof *names, cmp_names);
        for (size_t i = 0; r == 0 && i < n; i++)
                r = add_entry(w, dirfd(d), names[i], prefix, depth);
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        free(names);
        closedir(d);
        return r;
}

int layer_tar_dir(int dirfd, uid_t uid_shift, int out, hutch_error *err) {
        walk w = { .shift = uid_shift, .err = err };
        w.a = archive_write_new();
        if (!w.a || archive_write_set_format_pax_restricted(w.a) != ARCHIVE_OK ||
            archive_write_open_fd(w.a, out) != ARCHIVE_OK) {
                if (w.a)
                        archive_write_free(w.a);
                return hutch_error_set(err, -ENOMEM, "libarchive: cannot write a tar");
        }
        int r = walk_dir(&w, dirfd, "", 0);
        if (archive_write_close(w.a) != ARCHIVE_OK && r == 0)
                r = hutch_error_set(err, -EIO, "writing the layer's tar: %s",
                                    archive_error_string(w.a));
        archive_write_free(w.a);
        for (size_t i = 0; i < w.n_links; i++)
                free(w.links[i].path);
        free(w.links);
        return r;
}

int layer_from_dir(const char *data_dir, int dirfd, uid_t uid_shift,
                   char ret_digest[LAYER_DIGEST_MAX], hutch_error *err) {
        /* the tar in an unnamed file of the store (a layer can be far larger than memory) */
        _cleanup_close_ int busy = layer_store_hold(data_dir, err);
        if (busy < 0)
                return busy;
        char sdir[PATH_MAX];
        snprintf(sdir, sizeof sdir, "%s/layers/sha256", data_dir);
        int tfd = open(sdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (tfd < 0)
                return hutch_error_set(err, -errno, "creating a temporary file in %s: %m", sdir);
        _cleanup_close_ int out = tfd;
        int r = layer_tar_dir(dirfd, uid_shift, out, err);
        if (r < 0)
                return r;
        char hex[65];
        if ((r = image_hash_fd(out, LAYER_MAX_EXPANSION, hex, NULL)) < 0)
                return hutch_error_set(err, r, "hashing the layer's tar: %s", strerror(-r));
        char digest[LAYER_DIGEST_MAX];
        snprintf(digest, sizeof digest, "sha256:%s", hex);
        r = layer_unpack(data_dir, out, NULL, digest, UINT64_MAX, err);
        if (r < 0)
                return r;
        snprintf(ret_digest, LAYER_DIGEST_MAX, "%s", digest);
        return 0;
}
