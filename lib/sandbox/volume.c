/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Named volumes: storage that outlives sandboxes (docs/volumes.md).
 *
 * One sparse ext4 image per volume, DATA_DIR/volumes/<id>.img, formatted
 * with a journal (its data must survive a crash of the host) and its root
 * owned by 1000:1000, so that a sandbox's `user` can write at the mount
 * point. On-disk ids are 0..65535: every mount is id-mapped into the
 * mounting sandbox's own range, nothing is ever chowned.
 *
 * One file system per volume, whoever uses it: the image is attached to at
 * most one loop device, which a later user finds again by the image's
 * inode (LOOP_GET_STATUS64) under DATA_DIR/volumes/.lock, and a mount of
 * the same block device is the same superblock. So every sandbox (and the
 * content helper, volfs.c) sees one ext4 file system, with its usual
 * coherence between processes. The users are counted by the kernel: each
 * sandbox's mount holds the superblock, the superblock holds the loop
 * device, the loop device the image; when the last mount goes (the last
 * sandbox's mount namespace dies) the loop device clears itself
 * (LO_FLAGS_AUTOCLEAR). A daemon restart loses no count: there is none of
 * ours to lose. Removing a volume unlinks its image: sandboxes that mount
 * it keep the file until the last one is gone, and nobody can find it
 * again.
 */
#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

bool hutch_volume_id_valid(const char *id) {
        if (!id || strlen(id) != HUTCH_VOLUME_ID_LEN)
                return false;
        for (size_t i = 0; i < HUTCH_VOLUME_ID_LEN; i++) {
                char c = id[i];
                if (i == 8 || i == 13 || i == 18 || i == 23) {
                        if (c != '-')
                                return false;
                } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
                        return false;
        }
        return true;
}

/* What the engine mounts or synthesizes itself: a volume may not cover
 * these nor be mounted inside them. */
static const char *const reserved_paths[] = { "/proc", "/dev", "/sys", "/etc", "/run/hutch", NULL };

const char *hutch_volume_path_check(const char *path) {
        if (!path || !*path)
                return "path cannot be empty";
        if (path[0] != '/')
                return "path must be absolute";
        size_t n = strlen(path);
        if (n > HUTCH_VOLUME_PATH_MAX)
                return "path is too long";
        if (n == 1)
                return "path cannot be the root";
        if (path[n - 1] == '/')
                return "path must not contain any '.' or '..' components";
        for (const char *p = path; *p;) {
                const char *s = p + 1, *e = strchrnul(s, '/');
                size_t len = (size_t) (e - s);
                if (len == 0 || (len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
                        return "path must not contain any '.' or '..' components";
                for (const char *c = s; c < e; c++)
                        if ((unsigned char) *c < 0x20 || *c == 0x7f)
                                return "path must not contain control characters";
                p = e;
        }
        for (const char *const *r = reserved_paths; *r; r++) {
                size_t k = strlen(*r);
                if (strncmp(path, *r, k) == 0 && (path[k] == 0 || path[k] == '/'))
                        return "path is inside a directory hutch sets up itself (/proc, /dev, /sys, /etc, /run/hutch)";
                if (strncmp(*r, path, n) == 0 && (*r)[n] == '/')
                        return "path would cover a directory hutch sets up itself (/proc, /dev, /sys, /etc, /run/hutch)";
        }
        return NULL;
}

static int volumes_dir(hutch_ctx *ctx, char *buf, size_t n) {
        return snprintf(buf, n, "%s/volumes", ctx->data_dir) < (int) n ? 0 : -ENAMETOOLONG;
}

static int image_path(hutch_ctx *ctx, const char *id, char *buf, size_t n) {
        if (!hutch_volume_id_valid(id))
                return -EINVAL;
        return snprintf(buf, n, "%s/volumes/%s.img", ctx->data_dir, id) < (int) n ? 0 : -ENAMETOOLONG;
}

static int volumes_lock(hutch_ctx *ctx, hutch_error *err) {
        char dir[PATH_MAX];
        int r = volumes_dir(ctx, dir, sizeof dir);
        if (r < 0)
                return hutch_error_set(err, r, "data dir path too long");
        if ((r = mkdir_p(dir, 0700)) < 0)
                return hutch_error_set(err, r, "creating %s: %s", dir, strerror(-r));
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", dir);
        int lfd = lock_file_take(dfd, ".lock");
        if (lfd < 0)
                return hutch_error_set(err, lfd, "locking %s/.lock: %s", dir, strerror(-lfd));
        return lfd;
}

static int volume_mount_locked(hutch_ctx *ctx, const char *id, int *ret_fd, int *ret_loop_fd,
                               hutch_error *err);

int hutch_volume_create(hutch_ctx *ctx, const char *id, uint64_t bytes, hutch_error *err) {
        if (!hutch_volume_id_valid(id))
                return hutch_error_set(err, -EINVAL, "invalid volume id '%s'", id ? id : "");
        if (bytes < HUTCH_VOLUME_MIN_BYTES || bytes > HUTCH_MAX_DISK)
                return hutch_error_set(err, -EINVAL, "a volume's size must be between 8M and 1T");
        bytes &= ~(uint64_t) 4095;
        if (access("/dev/loop-control", R_OK | W_OK) != 0 || !have_tool("mkfs.ext4"))
                return hutch_error_set(err, -ENODEV,
                                       "volumes need /dev/loop-control and mkfs.ext4 (e2fsprogs)");
        _cleanup_close_ int lfd = volumes_lock(ctx, err);
        if (lfd < 0)
                return lfd;
        char img[PATH_MAX], tmp[PATH_MAX + 8];
        int r = image_path(ctx, id, img, sizeof img);
        if (r < 0)
                return hutch_error_set(err, r, "volume path too long");
        struct stat st;
        if (lstat(img, &st) == 0)
                return hutch_error_set(err, -EEXIST, "volume %s already has an image", id);
        snprintf(tmp, sizeof tmp, "%s.new", img);
        (void) unlink(tmp);
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                                      0600);
        if (fd < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", tmp);
        if (ftruncate(fd, (off_t) bytes) < 0) {
                r = hutch_error_set(err, -errno, "sizing %s: %m", tmp);
                unlink(tmp);
                return r;
        }
        /* A journal (the data outlives crashes), no reserved blocks (the
         * whole size is the user's), lazily initialised inode tables and
         * journal (the image stays sparse), the root owned by "user". */
        const char *argv[] = { "mkfs.ext4",
                               "-q",
                               "-F",
                               "-m",
                               "0",
                               "-E",
                               "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=1000:1000",
                               "-L",
                               "hutch-volume",
                               tmp,
                               NULL };
        if ((r = run_tool(argv)) < 0) {
                unlink(tmp);
                return hutch_error_set(err, r, "mkfs.ext4 of a %llu-byte volume failed",
                                       (unsigned long long) bytes);
        }
        if (fsync(fd) < 0 || rename(tmp, img) < 0) {
                r = hutch_error_set(err, -errno, "installing %s: %m", img);
                unlink(tmp);
                return r;
        }
        /* mkfs's lost+found is no file of the user's */
        _cleanup_close_ int mnt = -1;
        if ((r = volume_mount_locked(ctx, id, &mnt, NULL, err)) < 0) {
                unlink(img);
                return r;
        }
        (void) unlinkat(mnt, "lost+found", AT_REMOVEDIR);
        return 0;
}

/* The loop device already backed by the image (dev, ino), opened, or -ENOENT. */
static int loop_find(dev_t dev, ino_t ino, int *ret_fd) {
        DIR *d = opendir("/sys/block");
        if (!d)
                return -errno;
        struct dirent *de;
        int found = -ENOENT;
        while ((de = readdir(d))) {
                if (strncmp(de->d_name, "loop", 4) != 0)
                        continue;
                char *end;
                unsigned long n = strtoul(de->d_name + 4, &end, 10);
                if (*end || end == de->d_name + 4)
                        continue;
                char p[64];
                snprintf(p, sizeof p, "/dev/loop%lu", n);
                /* opened first, checked second: a device cleared and reused
                 * for another image in between is seen as that image's */
                int fd = open(p, O_RDWR | O_CLOEXEC);
                if (fd < 0)
                        continue;
                struct loop_info64 li;
                if (ioctl(fd, LOOP_GET_STATUS64, &li) == 0 && li.lo_device == (uint64_t) dev &&
                    li.lo_inode == (uint64_t) ino) {
                        *ret_fd = fd;
                        found = (int) n;
                        break;
                }
                close(fd);
        }
        closedir(d);
        return found;
}

/* A detached mount of the file system on the loop device n (the volume's
 * one superblock while another mount holds it). */
static int volume_mount_dev(const char *id, int n, int *ret_fd, hutch_error *err) {
        char dev[64];
        snprintf(dev, sizeof dev, "/dev/loop%d", n);
        _cleanup_close_ int fsfd = sys_fsopen("ext4", FSOPEN_CLOEXEC);
        /* noinit_itable: the kernel would otherwise zero every inode
         * table in the background, filling the sparse image (1.6 GiB for
         * 100 GiB); its holes read as zeros already */
        if (fsfd < 0 || sys_fsconfig(fsfd, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                return hutch_error_set(err, -errno, "volume %s: mounting its file system (%s): %m",
                                       id, dev);
        int mnt = sys_fsmount(fsfd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        if (mnt < 0)
                return hutch_error_set(err, -errno, "volume %s: fsmount: %m", id);
        *ret_fd = mnt;
        return 0;
}

/* A detached mount of the volume's one file system (lock held by the
 * caller); with ret_loop_fd, the loop device too, opened. */
static int volume_mount_locked(hutch_ctx *ctx, const char *id, int *ret_fd, int *ret_loop_fd,
                               hutch_error *err) {
        char img[PATH_MAX];
        int r = image_path(ctx, id, img, sizeof img);
        if (r < 0)
                return hutch_error_set(err, r, "invalid volume id '%s'", id ? id : "");
        _cleanup_close_ int imgfd = open(img, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (imgfd < 0 || fstat(imgfd, &st) < 0)
                return hutch_error_set(err, errno == ENOENT ? -ENOENT : -errno, "volume %s: %s: %m",
                                       id, errno == ENOENT ? "no image" : "opening its image");
        if (!S_ISREG(st.st_mode))
                return hutch_error_set(err, -EINVAL, "volume %s: its image is not a regular file",
                                       id);
        _cleanup_close_ int loopfd = -1;
        int n = loop_find(st.st_dev, st.st_ino, &loopfd);
        if (n == -ENOENT)
                n = loop_attach(imgfd, &loopfd);
        if (n < 0)
                return hutch_error_set(err, n, "volume %s: attaching its image to a loop device: %s",
                                       id, strerror(-n));
        if ((r = volume_mount_dev(id, n, ret_fd, err)) < 0)
                return r;
        if (ret_loop_fd)
                *ret_loop_fd = TAKE_FD(loopfd);
        return 0;
}

int volume_hold_loop(hutch_ctx *ctx, const char *id, int *ret_fd, int *ret_loop_fd, hutch_error *err) {
        _cleanup_close_ int lfd = volumes_lock(ctx, err);
        if (lfd < 0)
                return lfd;
        return volume_mount_locked(ctx, id, ret_fd, ret_loop_fd, err);
}

int volume_mount_loop(const char *id, int loop_fd, int *ret_fd, hutch_error *err) {
        struct stat st;
        if (fstat(loop_fd, &st) < 0 || !S_ISBLK(st.st_mode))
                return hutch_error_set(err, -EBADF, "volume %s: its loop device is gone", id);
        return volume_mount_dev(id, (int) minor(st.st_rdev), ret_fd, err);
}

int volume_mount_idmapped(hutch_ctx *ctx, const char *id, int userns_fd, int *ret_fd,
                          hutch_error *err) {
        _cleanup_close_ int lfd = volumes_lock(ctx, err);
        if (lfd < 0)
                return lfd;
        _cleanup_close_ int mnt = -1;
        int r = volume_mount_locked(ctx, id, &mnt, NULL, err);
        if (r < 0)
                return r;
        struct mount_attr attr = {
                .attr_set = MOUNT_ATTR_IDMAP,
                .userns_fd = (uint64_t) userns_fd,
        };
        if (sys_mount_setattr(mnt, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
                return hutch_error_set(err, -errno, "volume %s: id-mapping its mount: %m", id);
        *ret_fd = TAKE_FD(mnt);
        return 0;
}

int hutch_volume_hold(hutch_ctx *ctx, const char *id, int *ret_fd, hutch_error *err) {
        _cleanup_close_ int lfd = volumes_lock(ctx, err);
        if (lfd < 0)
                return lfd;
        return volume_mount_locked(ctx, id, ret_fd, NULL, err);
}

int hutch_volume_remove(hutch_ctx *ctx, const char *id, hutch_error *err) {
        char img[PATH_MAX];
        int r = image_path(ctx, id, img, sizeof img);
        if (r < 0)
                return hutch_error_set(err, r, "invalid volume id '%s'", id ? id : "");
        _cleanup_close_ int lfd = volumes_lock(ctx, err);
        if (lfd < 0)
                return lfd;
        if (unlink(img) < 0)
                return hutch_error_set(
                        err, -errno, errno == ENOENT ? "volume %s has no image" : "removing %s: %m",
                        errno == ENOENT ? id : img);
        return 0;
}

int hutch_volume_usage(hutch_ctx *ctx, const char *id, uint64_t *ret_size, uint64_t *ret_used,
                       hutch_error *err) {
        char img[PATH_MAX];
        int r = image_path(ctx, id, img, sizeof img);
        if (r < 0)
                return hutch_error_set(err, r, "invalid volume id '%s'", id ? id : "");
        struct stat st;
        if (lstat(img, &st) < 0)
                return hutch_error_set(err, -errno, "volume %s: %m", id);
        *ret_size = (uint64_t) st.st_size;
        *ret_used = (uint64_t) st.st_blocks * 512;
        return 0;
}

int volume_state_write(const char *sandbox_dir, const hutch_volume_mount *v, size_t n,
                       hutch_error *err) {
        char path[PATH_MAX];
        char buf[HUTCH_VOLUMES_MAX * (HUTCH_VOLUME_ID_LEN + HUTCH_VOLUME_PATH_MAX + 4)];
        size_t len = 0;
        if (n > HUTCH_VOLUMES_MAX)
                return hutch_error_set(err, -E2BIG, "too many volumes");
        for (size_t i = 0; i < n; i++)
                len += (size_t) snprintf(buf + len, sizeof buf - len, "%s %s\n", v[i].volume,
                                         v[i].path);
        snprintf(path, sizeof path, "%s/volumes", sandbox_dir);
        int r = write_file_atomic(path, buf, len, 0600);
        if (r < 0)
                return hutch_error_set(err, r, "writing %s: %s", path, strerror(-r));
        return 0;
}
