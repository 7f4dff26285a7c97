/* SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/macro.h"

int mkdir_p(const char *path, mode_t mode) {
        char buf[PATH_MAX];
        size_t len = strlen(path);
        if (len == 0 || len >= sizeof buf)
                return -EINVAL;
        memcpy(buf, path, len + 1);
        for (char *p = buf + 1; *p; p++) {
                if (*p != '/')
                        continue;
                *p = 0;
                if (mkdir(buf, mode) < 0 && errno != EEXIST)
                        return -errno;
                *p = '/';
        }
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

/* Directories nested deeper than this are moved up to the top directory
 * (same file system, so rename works) and removed from there. */
#define RM_MAX_DEPTH 64

static int rm_children(int dfd, int topfd, dev_t dev, unsigned depth, unsigned long *hoist_seq);

static int rm_entry(int dfd, const char *name, int topfd, dev_t dev, unsigned depth,
                    unsigned long *hoist_seq) {
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISDIR(st.st_mode)) {
                if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
                        return -errno;
                return 0;
        }
        if (st.st_dev != dev)
                return -EXDEV; /* a mount point: never descend into another fs */
        /* an empty directory (most, in a sandbox's state dir) goes at once:
         * rmdir needs no access to the directory itself, only to its parent */
        if (unlinkat(dfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
                return 0;
        if (depth >= RM_MAX_DEPTH && topfd >= 0) {
                char tmp[64];
                snprintf(tmp, sizeof tmp, ".hutch-rm-%lu", (*hoist_seq)++);
                if (renameat(dfd, name, topfd, tmp) < 0)
                        return -errno;
                /* removed when the top-level loop sees it */
                return 0;
        }
        _cleanup_close_ int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (cfd < 0)
                return errno == ENOENT ? 0 : -errno;
        /* Make sure we can enter and empty it even if the sandbox chmod'ed it 000. */
        (void) fchmod(cfd, 0700);
        int r = rm_children(cfd, topfd, dev, depth + 1, hoist_seq);
        if (r < 0)
                return r;
        if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}

static int rm_children(int dfd, int topfd, dev_t dev, unsigned depth, unsigned long *hoist_seq) {
        int dup_fd = dup(dfd);
        if (dup_fd < 0)
                return -errno;
        DIR *d = fdopendir(dup_fd);
        if (!d) {
                close(dup_fd);
                return -errno;
        }
        int r = 0;
        for (;;) {
                errno = 0;
                struct dirent *de = readdir(d);
                if (!de) {
                        if (errno)
                                r = -errno;
                        break;
                }
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                r = rm_entry(dfd, de->d_name, topfd, dev, depth, hoist_seq);
                if (r < 0)
                        break;
        }
        closedir(d);
        return r;
}

int rm_rf_at(int dirfd, const char *name) {
        struct stat st;
        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISDIR(st.st_mode))
                return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;

        _cleanup_close_ int top = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (top < 0)
                return errno == ENOENT ? 0 : -errno;
        (void) fchmod(top, 0700);
        unsigned long seq = 0;
        /* Each pass removes what it can; hoisted subtrees land in `top` and
         * are taken by the next pass. Depth per pass is bounded, so the
         * number of passes is bounded by the tree's depth / RM_MAX_DEPTH. */
        for (unsigned pass = 0; pass < 1u << 20; pass++) {
                unsigned long before = seq;
                int r = rm_children(top, top, st.st_dev, 0, &seq);
                if (r < 0)
                        return r;
                if (seq == before)
                        break;
        }
        if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}

int lock_open(int dirfd, const char *name, int open_flags, bool wait) {
        int fd = openat(dirfd, name, open_flags | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        while (flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) < 0)
                if (errno != EINTR) {
                        int r = errno == EAGAIN ? -EWOULDBLOCK : -errno;
                        close(fd);
                        return r;
                }
        return fd;
}

int lock_file_take(int dirfd, const char *name) {
        return lock_open(dirfd, name, O_RDWR | O_CREAT, true);
}

int lock_file_try(int dirfd, const char *name) {
        return lock_open(dirfd, name, O_RDWR | O_CREAT, false);
}

int write_file_atomic(const char *path, const void *data, size_t len, mode_t mode) {
        char tmp[PATH_MAX];
        if ((size_t) snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, getpid()) >= sizeof tmp)
                return -ENAMETOOLONG;
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;
        int r = fd_write_all(fd, data, len);
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        if (r >= 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}
