/* SPDX-License-Identifier: Apache-2.0 */
/* The layer store's paths, markers, listing, disk use and collection. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/image-internal.h"
#include "image/layer.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"

bool layer_digest_valid(const char *digest) {
        if (!digest || strncmp(digest, "sha256:", 7) != 0 || strlen(digest) != 7 + 64)
                return false;
        for (const char *p = digest + 7; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static bool hex_name_valid(const char *n) {
        char d[80];
        snprintf(d, sizeof d, "sha256:%s", n);
        return strlen(n) == 64 && layer_digest_valid(d);
}

int layer_path(const char *data_dir, const char *digest, char *buf, size_t n) {
        if (!layer_digest_valid(digest))
                return -EINVAL;
        char done[PATH_MAX];
        snprintf(done, sizeof done, "%s/layers/sha256/%s.done", data_dir, digest + 7);
        if ((size_t) snprintf(buf, n, "%s/layers/sha256/%s", data_dir, digest + 7) >= n)
                return -ENAMETOOLONG;
        struct stat st;
        if (lstat(done, &st) < 0 || lstat(buf, &st) < 0 || !S_ISDIR(st.st_mode))
                buf[0] = 0;
        return 0;
}

static int teams_path(const char *data_dir, const char *diff_id, char *buf, size_t n) {
        if (!layer_digest_valid(diff_id))
                return -EINVAL;
        return (size_t) snprintf(buf, n, "%s/layers/sha256/%s.teams", data_dir, diff_id + 7) >= n ? -ENAMETOOLONG : 0;
}

int layer_private_allows(const char *data_dir, const char *diff_id, int64_t team) {
        char p[PATH_MAX];
        int r = teams_path(data_dir, diff_id, p, sizeof p);
        if (r < 0)
                return r;
        FILE *f = fopen(p, "re");
        if (!f)
                return errno == ENOENT ? 1 : -errno;
        char line[32];
        bool listed = false;
        while (!listed && team > 0 && fgets(line, sizeof line, f))
                listed = strtoll(line, NULL, 10) == team;
        fclose(f);
        return listed ? 1 : 0;
}

int layer_private_grant(const char *data_dir, const char *diff_id, int64_t team) {
        char p[PATH_MAX];
        int r = teams_path(data_dir, diff_id, p, sizeof p);
        if (r < 0)
                return r;
        if (team <= 0)
                return unlink(p) < 0 && errno != ENOENT ? -errno : 0;
        if (layer_private_allows(data_dir, diff_id, team) == 1 && access(p, F_OK) == 0)
                return 0;
        _cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        char line[32];
        int n = snprintf(line, sizeof line, "%lld\n", (long long) team);
        return write(fd, line, (size_t) n) == n ? 0 : -EIO;
}

int layer_mark_done(int sfd, const char *hex) {
        char name[80];
        snprintf(name, sizeof name, "%s.done", hex);
        _cleanup_close_ int fd = openat(sfd, name, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        /* the directory's rename reaches the disk before its marker does */
        (void) fsync(sfd);
        return 0;
}

static int open_store(const char *data_dir, hutch_error *err) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/layers/sha256", data_dir);
        int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 && errno != ENOENT)
                return hutch_error_set(err, -errno, "opening %s: %m", p);
        return fd < 0 ? -ENOENT : fd;
}

int layer_list(const char *data_dir, char ***ret, size_t *ret_n, hutch_error *err) {
        *ret = NULL;
        *ret_n = 0;
        int sfd = open_store(data_dir, err);
        if (sfd == -ENOENT)
                return 0;
        if (sfd < 0)
                return sfd;
        DIR *d = fdopendir(sfd);
        if (!d) {
                close(sfd);
                return hutch_error_set(err, -errno, "reading the layer store: %m");
        }
        char **v = NULL;
        size_t n = 0;
        int r = 0;
        for (struct dirent *de; (de = readdir(d));) {
                if (!hex_name_valid(de->d_name))
                        continue;
                char done[80];
                struct stat st;
                snprintf(done, sizeof done, "%s.done", de->d_name);
                if (fstatat(dirfd(d), done, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                char **nv = reallocarray(v, n + 2, sizeof *v);
                if (!nv) {
                        r = -ENOMEM;
                        break;
                }
                v = nv;
                if (asprintf(&v[n], "sha256:%s", de->d_name) < 0) {
                        r = -ENOMEM;
                        break;
                }
                v[++n] = NULL;
        }
        closedir(d);
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        free(v[i]);
                free(v);
                return hutch_error_set(err, r, "out of memory");
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

/* st_blocks of a tree, each hardlinked inode once (a small open-addressed
 * set of inode numbers). */
typedef struct inoset {
        ino_t *v;
        size_t cap, n;
} inoset;

static bool inoset_add(inoset *s, ino_t ino) {
        if (s->n * 2 >= s->cap) {
                size_t nc = s->cap ? s->cap * 2 : 1024;
                ino_t *nv = calloc(nc, sizeof *nv);
                if (!nv)
                        return true;
                for (size_t i = 0; i < s->cap; i++)
                        if (s->v[i]) {
                                size_t h = (size_t) s->v[i] * 0x9E3779B97F4A7C15ull % nc;
                                while (nv[h])
                                        h = (h + 1) % nc;
                                nv[h] = s->v[i];
                        }
                free(s->v);
                s->v = nv;
                s->cap = nc;
        }
        size_t h = (size_t) ino * 0x9E3779B97F4A7C15ull % s->cap;
        while (s->v[h]) {
                if (s->v[h] == ino)
                        return false;
                h = (h + 1) % s->cap;
        }
        s->v[h] = ino;
        s->n++;
        return true;
}

static void du_walk(int dfd, unsigned depth, inoset *seen, uint64_t *total) {
        if (depth > LAYER_MAX_DEPTH + 8)
                return;
        int fd = dup(dfd);
        DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
        if (!d) {
                safe_close(fd);
                return;
        }
        for (struct dirent *de; (de = readdir(d));) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (st.st_nlink > 1 && !S_ISDIR(st.st_mode) && !inoset_add(seen, st.st_ino))
                        continue;
                *total += (uint64_t) st.st_blocks * 512;
                if (S_ISDIR(st.st_mode)) {
                        int sub = openat(dirfd(d), de->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub >= 0) {
                                du_walk(sub, depth + 1, seen, total);
                                close(sub);
                        }
                }
        }
        closedir(d);
}

int layer_disk_usage(const char *data_dir, const char *digest, uint64_t *ret) {
        char p[PATH_MAX];
        int r = layer_path(data_dir, digest, p, sizeof p);
        if (r < 0)
                return r;
        if (!p[0])
                return -ENOENT;
        _cleanup_close_ int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        inoset seen = { 0 };
        uint64_t total = 0;
        du_walk(fd, 0, &seen, &total);
        free(seen.v);
        *ret = total;
        return 0;
}

static bool kept(char *const *keep, size_t n, const char *hex) {
        for (size_t i = 0; i < n; i++)
                if (keep[i] && strlen(keep[i]) == 71 && streq(keep[i] + 7, hex))
                        return true;
        return false;
}

int layer_gc(const char *data_dir, char *const *keep, size_t n_keep, hutch_error *err) {
        int sfd = open_store(data_dir, err);
        if (sfd == -ENOENT)
                return 0;
        if (sfd < 0)
                return sfd;
        _cleanup_close_ int lfd = lock_file_take(sfd, ".lock");
        if (lfd < 0) {
                close(sfd);
                return hutch_error_set(err, lfd, "locking the layer store: %s", strerror(-lfd));
        }
        /* an install in progress holds .busy shared: its unpacked layers
         * are not named by any template yet, and not garbage */
        _cleanup_close_ int bfd = openat(sfd, ".busy", O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                                         0600);
        if (bfd < 0 || flock(bfd, LOCK_EX | LOCK_NB) < 0) {
                close(sfd);
                return 0;
        }
        DIR *d = fdopendir(sfd);
        if (!d) {
                close(sfd);
                return hutch_error_set(err, -errno, "reading the layer store: %m");
        }
        int removed = 0, r = 0;
        for (struct dirent *de; (de = readdir(d));) {
                const char *nm = de->d_name;
                char hex[65] = "";
                bool tmp = startswith(nm, ".tmp-") || startswith(nm, ".trash-");
                size_t l = strlen(nm);
                if (!tmp) {
                        if ((l == 64 + 6 && streq(nm + 64, ".teams")) ||
                            (l == 64 + 7 && streq(nm + 64, ".pushed"))) {
                                /* its layer's list, or what a push made of it
                                 * (lib/image/push.h): goes when the layer is gone */
                                char dir[65];
                                struct stat st;
                                memcpy(dir, nm, 64);
                                dir[64] = 0;
                                if (hex_name_valid(dir) && fstatat(dirfd(d), dir, &st, AT_SYMLINK_NOFOLLOW) < 0 &&
                                    errno == ENOENT)
                                        (void) unlinkat(dirfd(d), nm, 0);
                                continue;
                        }
                        if (l == 64 + 5 && streq(nm + 64, ".done"))
                                memcpy(hex, nm, 64);
                        else if (l == 64)
                                memcpy(hex, nm, 64);
                        else
                                continue;
                        hex[64] = 0;
                        if (!hex_name_valid(hex))
                                continue;
                        char done[80];
                        struct stat st;
                        snprintf(done, sizeof done, "%s.done", hex);
                        bool complete = fstatat(dirfd(d), done, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                                fstatat(dirfd(d), hex, &st, AT_SYMLINK_NOFOLLOW) == 0;
                        if (complete && kept(keep, n_keep, hex))
                                continue;
                        if (l == 64 + 5) { /* the marker goes with (after) its directory */
                                if (fstatat(dirfd(d), hex, &st, AT_SYMLINK_NOFOLLOW) < 0 &&
                                    unlinkat(dirfd(d), nm, 0) == 0)
                                        removed++;
                                continue;
                        }
                        /* unmark first: a half-removed layer is never taken for complete */
                        (void) unlinkat(dirfd(d), done, 0);
                }
                int k = rm_rf_at(dirfd(d), nm);
                if (k < 0) {
                        r = hutch_error_set(err, k, "removing layer %s: %s", nm, strerror(-k));
                        break;
                }
                if (hex[0]) { /* the list of teams that had it goes with it */
                        char teams[80];
                        snprintf(teams, sizeof teams, "%s.teams", hex);
                        (void) unlinkat(dirfd(d), teams, 0);
                }
                removed++;
        }
        closedir(d);
        return r < 0 ? r : removed;
}
