/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The writable layer of each sandbox, with a hard size and inode limit that
 * the sandbox sees as ENOSPC and that can never exhaust the host's disk.
 *
 * Backend "ext4" (preferred): every sandbox gets its own sparse image file,
 * a copy of a pre-formatted "golden" image of the requested size and inode
 * count (formatted once per distinct size with mkfs.ext4; copying its few
 * hundred KiB of metadata with SEEK_DATA/SEEK_HOLE takes well under a ms).
 * The image is attached to a loop device and mounted *detached* with the new
 * mount API (fsopen/fsmount), so the host's mount table never holds it; the
 * child attaches the mount fd inside its own mount namespace. When the last
 * process of the sandbox is gone the file system is unmounted with its
 * namespace, the loop device clears itself (LO_FLAGS_AUTOCLEAR) and the
 * image is unlinked. Disk pages are not charged to the sandbox's memory.
 *
 * Why not one shared file system with project quotas: the kernels hutch
 * must run on (this project's CI included) are built without quota support
 * (CONFIG_QUOTA / CONFIG_XFS_QUOTA), and a per-sandbox image needs neither.
 *
 * Backend "tmpfs" (fallback when no loop device or mkfs.ext4 exists): the
 * child mounts a tmpfs with size= and nr_inodes= in its own mount namespace.
 * Its pages count against the sandbox's memory limit.
 */
#include <dirent.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

extern char **environ;

int run_tool(const char *const argv[]) {
        pid_t pid;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
        int r = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *) argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        if (r != 0)
                return -r;
        int status;
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

bool have_tool(const char *name) {
        static const char *const dirs[] = { "/usr/sbin", "/sbin", "/usr/bin", "/bin", NULL };
        for (const char *const *d = dirs; *d; d++) {
                char p[256];
                snprintf(p, sizeof p, "%s/%s", *d, name);
                if (access(p, X_OK) == 0)
                        return true;
        }
        return false;
}

int storage_init(hutch_ctx *ctx, hutch_error *err) {
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/storage", ctx->data_dir);
        free(ctx->storage_mnt);
        ctx->storage_mnt = strdup(dir);
        if (!ctx->storage_mnt)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        if (streq(ctx->storage_kind, "tmpfs"))
                return 0;

        bool usable = access("/dev/loop-control", R_OK | W_OK) == 0 && have_tool("mkfs.ext4");
        if (!usable) {
                if (streq(ctx->storage_kind, "ext4"))
                        return hutch_error_set(err, -ENODEV, "ext4 layers need /dev/loop-control and mkfs.ext4 (e2fsprogs)");
                free(ctx->storage_kind);
                ctx->storage_kind = strdup("tmpfs"); /* auto: fall back */
                return ctx->storage_kind ? 0 : -ENOMEM;
        }
        char sub[2100];
        int r;
        snprintf(sub, sizeof sub, "%s/golden", dir);
        if ((r = mkdir_p(sub, 0700)) < 0)
                return hutch_error_set(err, r, "creating %s: %s", sub, strerror(-r));
        snprintf(sub, sizeof sub, "%s/layers", dir);
        if ((r = mkdir_p(sub, 0700)) < 0)
                return hutch_error_set(err, r, "creating %s: %s", sub, strerror(-r));
        free(ctx->storage_kind);
        ctx->storage_kind = strdup("ext4");
        return ctx->storage_kind ? 0 : -ENOMEM;
}

/* The golden image for (bytes, inodes), formatted on first use. */
static int golden_path(hutch_ctx *ctx, uint64_t bytes, uint64_t inodes, char *buf, size_t n, hutch_error *err) {
        snprintf(buf, n, "%s/golden/%llu-%llu.img", ctx->storage_mnt, (unsigned long long) bytes,
                 (unsigned long long) inodes);
        struct stat st;
        if (stat(buf, &st) == 0)
                return 0;

        char lockp[2200];
        snprintf(lockp, sizeof lockp, "%s/golden/.lock", ctx->storage_mnt);
        _cleanup_close_ int lfd = lock_file_take(AT_FDCWD, lockp);
        if (lfd < 0)
                return hutch_error_set(err, lfd, "locking %s: %s", lockp, strerror(-lfd));
        if (stat(buf, &st) == 0)
                return 0;

        char tmp[2300], nstr[32];
        snprintf(tmp, sizeof tmp, "%s.new", buf);
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", tmp);
        if (ftruncate(fd, (off_t) bytes) < 0) {
                unlink(tmp);
                return hutch_error_set(err, -errno, "sizing %s: %m", tmp);
        }
        snprintf(nstr, sizeof nstr, "%llu", (unsigned long long) inodes);
        /* No journal (the layer dies with the sandbox), no reserved blocks
         * (the whole limit is the sandbox's), inode tables left for the
         * kernel to treat as zero (the file is sparse). */
        const char *argv[] = { "mkfs.ext4", "-q", "-F", "-m", "0", "-N", nstr, "-O", "^has_journal,^resize_inode",
                               "-E", "lazy_itable_init=1,nodiscard", "-L", "hutch-layer", tmp, NULL };
        int r = run_tool(argv);
        if (r < 0) {
                unlink(tmp);
                return hutch_error_set(err, r, "mkfs.ext4 of a %llu-byte layer failed", (unsigned long long) bytes);
        }
        if (rename(tmp, buf) < 0) {
                unlink(tmp);
                return hutch_error_set(err, -errno, "renaming %s: %m", tmp);
        }
        return 0;
}

/* Copy only the allocated extents: the golden image is almost all hole. */
static int copy_sparse(int src, int dst) {
        struct stat st;
        if (fstat(src, &st) < 0)
                return -errno;
        if (ftruncate(dst, st.st_size) < 0)
                return -errno;
        off_t off = 0;
        for (;;) {
                off_t data = lseek(src, off, SEEK_DATA);
                if (data < 0)
                        return errno == ENXIO ? 0 : -errno;
                off_t hole = lseek(src, data, SEEK_HOLE);
                if (hole < 0)
                        return -errno;
                loff_t in = data, out = data;
                size_t left = (size_t) (hole - data);
                while (left > 0) {
                        ssize_t n = copy_file_range(src, &in, dst, &out, left, 0);
                        if (n < 0)
                                return -errno;
                        if (n == 0)
                                return -EIO;
                        left -= (size_t) n;
                }
                off = hole;
        }
}

int loop_attach(int img_fd, int *ret_loop_fd) {
        _cleanup_close_ int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
        if (ctl < 0)
                return -errno;
        for (int attempt = 0; attempt < 64; attempt++) {
                int n = ioctl(ctl, LOOP_CTL_GET_FREE);
                if (n < 0)
                        return -errno;
                char dev[64];
                snprintf(dev, sizeof dev, "/dev/loop%d", n);
                _cleanup_close_ int lfd = open(dev, O_RDWR | O_CLOEXEC);
                if (lfd < 0)
                        return -errno;
                struct loop_config cfg = {
                        .fd = (uint32_t) img_fd,
                        .info = { .lo_flags = LO_FLAGS_AUTOCLEAR },
                };
                if (ioctl(lfd, LOOP_CONFIGURE, &cfg) == 0) {
                        *ret_loop_fd = TAKE_FD(lfd);
                        return n;
                }
                if (errno != EBUSY)
                        return -errno;
                /* raced with another attacher: take the next free one */
        }
        return -EBUSY;
}

static int layer_image_path(hutch_ctx *ctx, const char *id, char *buf, size_t n) {
        return snprintf(buf, n, "%s/layers/%s.img", ctx->storage_mnt, id) < (int) n ? 0 : -ENAMETOOLONG;
}

int storage_layer_from(hutch_ctx *ctx, const char *stream_path, const char *img, uint32_t *ret_base,
                       uint64_t *ret_size, hutch_error *err);
int storage_shift_owner(int mnt, uid_t from, uid_t to);

/* A prepared image (hutch_layer_import_fds) becomes sandbox id's layer:
 * renamed, or copied from another file system. */
static int layer_take_image(const char *from, const char *img, uint64_t *ret_size, hutch_error *err) {
        struct stat st;
        if (rename(from, img) < 0) {
                if (errno != EXDEV)
                        return hutch_error_set(err, -errno, "taking over %s: %m", from);
                _cleanup_close_ int src = open(from, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (src < 0)
                        return hutch_error_set(err, -errno, "opening %s: %m", from);
                _cleanup_close_ int dst = open(img, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (dst < 0)
                        return hutch_error_set(err, -errno, "creating %s: %m", img);
                int r = copy_sparse(src, dst);
                if (r < 0) {
                        unlink(img);
                        return hutch_error_set(err, r, "copying the layer image: %s", strerror(-r));
                }
        }
        if (stat(img, &st) < 0 || st.st_size <= 0 || !S_ISREG(st.st_mode)) {
                unlink(img);
                return hutch_error_set(err, -EINVAL, "the layer image given is not one");
        }
        *ret_size = (uint64_t) st.st_size;
        return 0;
}

int storage_prepare(hutch_ctx *ctx, const char *id, uid_t owner, const hutch_limits *limits, const char *layer_from,
                    const char *layer_image, uint32_t layer_image_base, int *ret_layer_fd, uint64_t *ret_disk_bytes,
                    hutch_error *err) {
        *ret_layer_fd = -1;
        if (layer_image)
                layer_from = NULL; /* the same layer, imported already */
        if (!streq(ctx->storage_kind, "ext4")) {
                if (layer_from || layer_image)
                        return hutch_error_set(err, -EOPNOTSUPP,
                                               "starting from a layer snapshot needs the ext4 layer backend");
                return 0;
        }
        char golden[2300], img[2300];
        int r;
        if ((r = layer_image_path(ctx, id, img, sizeof img)) < 0)
                return hutch_error_set(err, r, "layer path too long");
        uint32_t from_base = 0;
        _cleanup_close_ int dst = -1;
        if (layer_from || layer_image) {
                uint64_t size = 0;
                if (layer_image) {
                        if ((r = layer_take_image(layer_image, img, &size, err)) < 0)
                                return r;
                        from_base = layer_image_base;
                } else if ((r = storage_layer_from(ctx, layer_from, img, &from_base, &size, err)) < 0)
                        return r;
                *ret_disk_bytes = size;
                dst = open(img, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
                if (dst < 0) {
                        r = hutch_error_set(err, -errno, "opening %s: %m", img);
                        unlink(img);
                        return r;
                }
        } else {
                /* ext4 cannot hold more inodes than blocks; asking for more would
                 * make mkfs fail, so a small disk gets one inode per 4 KiB block. */
                uint64_t inodes = MIN(limits->disk_inodes, MAX(limits->disk_bytes / 4096, 64));
                r = golden_path(ctx, limits->disk_bytes, inodes, golden, sizeof golden, err);
                if (r < 0)
                        return r;
                _cleanup_close_ int src = open(golden, O_RDONLY | O_CLOEXEC);
                if (src < 0)
                        return hutch_error_set(err, -errno, "opening %s: %m", golden);
                dst = open(img, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (dst < 0)
                        return hutch_error_set(err, -errno, "creating %s: %m", img);
                r = copy_sparse(src, dst);
                if (r < 0) {
                        hutch_error_set(err, r, "copying the layer image: %s", strerror(-r));
                        unlink(img);
                        return r;
                }
        }
        _cleanup_close_ int loopfd = -1, fsfd = -1, mnt = -1;
        r = loop_attach(dst, &loopfd);
        if (r < 0) {
                hutch_error_set(err, r, "attaching %s to a loop device: %s", img, strerror(-r));
                goto fail;
        }
        char dev[64];
        snprintf(dev, sizeof dev, "/dev/loop%d", r);
        fsfd = sys_fsopen("ext4", FSOPEN_CLOEXEC);
        /* nobarrier: a cache flush on a loop device is an fsync of the
         * image on the host's file system (a journal commit there, a disk
         * flush under it), and ext4 sends one at every sync and at unmount,
         * i.e. in PID 1's exit path that `hutch run` and a kill wait for.
         * The layer never outlives the host's uptime (a reboot ends every
         * sandbox; a snapshot is a stream written and synced on its own),
         * so durability across a power cut buys it nothing. What a sandbox
         * writes still reaches the image through the host's page cache, so
         * syncfs() and the layer export see it, and the size and inode
         * limits are the file system's, unchanged. */
        if (fsfd < 0 || sys_fsconfig(fsfd, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_SET_FLAG, "noinit_itable", NULL, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_SET_FLAG, "nobarrier", NULL, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
                r = hutch_error_set(err, -errno, "mounting the ext4 layer %s: %m", dev);
                goto fail;
        }
        mnt = sys_fsmount(fsfd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME);
        if (mnt < 0) {
                r = hutch_error_set(err, -errno, "fsmount of the ext4 layer: %m");
                goto fail;
        }
        /* The loop device and file system hold the image now; the mount fd
         * is all that is left to hand over. A restored layer's files move to
         * this sandbox's id range. */
        bool restored = layer_from || layer_image;
        if (restored && (r = storage_shift_owner(mnt, from_base, owner)) < 0) {
                hutch_error_set(err, r, "moving the restored layer to the sandbox's ids: %s", strerror(-r));
                goto fail;
        }
        if ((mkdirat(mnt, "upper", 0755) < 0 && (errno != EEXIST || !restored)) ||
            (mkdirat(mnt, "work", 0700) < 0 && (errno != EEXIST || !restored)) ||
            fchownat(mnt, "upper", owner, owner, AT_SYMLINK_NOFOLLOW) < 0 ||
            fchownat(mnt, "work", owner, owner, AT_SYMLINK_NOFOLLOW) < 0) {
                r = hutch_error_set(err, -errno, "preparing the layer: %m");
                goto fail;
        }
        (void) unlinkat(mnt, "lost+found", AT_REMOVEDIR);
        *ret_layer_fd = TAKE_FD(mnt);
        return 0;
fail:
        unlink(img);
        return r;
}

/* The sandbox's own layer image, mounted read-only and detached: a gvisor
 * sandbox's built-template layer, imported by storage_prepare() at create
 * and stacked under runsc's root at every launch (gvisor-root.c). A
 * read-only descriptor makes a read-only loop device, so nothing can write
 * the image through it; the device clears itself with the last mount. */
int storage_layer_mount_ro(hutch_ctx *ctx, const char *id, int *ret_mnt, hutch_error *err) {
        char img[2300], dev[64];
        if (!ctx->storage_mnt || !streq(ctx->storage_kind, "ext4"))
                return hutch_error_set(err, -EOPNOTSUPP,
                                       "a template's build layer needs the ext4 layer backend");
        if (layer_image_path(ctx, id, img, sizeof img) < 0)
                return hutch_error_set(err, -ENAMETOOLONG, "layer path too long");
        _cleanup_close_ int src = open(img, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (src < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", img);
        _cleanup_close_ int loopfd = -1, fsfd = -1;
        int r = loop_attach(src, &loopfd);
        if (r < 0)
                return hutch_error_set(err, r, "attaching %s to a loop device: %s", img,
                                       strerror(-r));
        snprintf(dev, sizeof dev, "/dev/loop%d", r);
        fsfd = sys_fsopen("ext4", FSOPEN_CLOEXEC);
        if (fsfd < 0 || sys_fsconfig(fsfd, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_SET_FLAG, "ro", NULL, 0) < 0 ||
            sys_fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
                return hutch_error_set(err, -errno, "mounting the layer %s read-only: %m", dev);
        int mnt = sys_fsmount(fsfd, FSMOUNT_CLOEXEC,
                              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                      MOUNT_ATTR_NOATIME);
        if (mnt < 0)
                return hutch_error_set(err, -errno, "fsmount of the layer %s: %m", dev);
        *ret_mnt = mnt;
        return 0;
}

int storage_remove(hutch_ctx *ctx, const char *id, hutch_error *err) {
        if (!ctx->storage_mnt || !streq(ctx->storage_kind, "ext4"))
                return 0;
        char img[2300];
        if (layer_image_path(ctx, id, img, sizeof img) < 0)
                return 0;
        /* into the caller's trash, whose deletion frees the blocks later
         * (the id is unique: no other image of that name can be there) */
        char trashed[2400];
        if (ctx->trash_dir && snprintf(trashed, sizeof trashed, "%s/%s.img", ctx->trash_dir, id) < (int) sizeof trashed &&
            rename(img, trashed) == 0)
                return 0;
        if (unlink(img) < 0 && errno != ENOENT)
                return hutch_error_set(err, -errno, "removing %s: %m", img);
        return 0;
}

int storage_usage(hutch_ctx *ctx, const char *id, uint64_t *ret_bytes) {
        if (!ctx->storage_mnt || !streq(ctx->storage_kind, "ext4"))
                return -EOPNOTSUPP;
        char img[2300];
        struct stat st;
        if (layer_image_path(ctx, id, img, sizeof img) < 0 || stat(img, &st) < 0)
                return -errno;
        *ret_bytes = (uint64_t) st.st_blocks * 512;
        return 0;
}

int storage_prune(hutch_ctx *ctx, char *const *keep, hutch_error *err) {
        if (!ctx->storage_mnt || !streq(ctx->storage_kind, "ext4"))
                return 0;
        char dir[2300];
        snprintf(dir, sizeof dir, "%s/layers", ctx->storage_mnt);
        DIR *d = opendir(dir);
        if (!d)
                return errno == ENOENT ? 0 : hutch_error_set(err, -errno, "listing %s: %m", dir);
        struct dirent *de;
        int r = 0;
        while ((de = readdir(d))) {
                char id[HUTCH_ID_LEN + 1];
                size_t n = strlen(de->d_name);
                if (n != HUTCH_ID_LEN + 4 || !streq(de->d_name + HUTCH_ID_LEN, ".img"))
                        continue;
                memcpy(id, de->d_name, HUTCH_ID_LEN);
                id[HUTCH_ID_LEN] = 0;
                if (sandbox_validate_id(id) < 0)
                        continue;
                bool kept = false;
                for (char *const *k = keep; k && *k; k++)
                        if (streq(*k, id))
                                kept = true;
                if (!kept && unlinkat(dirfd(d), de->d_name, 0) < 0 && errno != ENOENT && r == 0)
                        r = hutch_error_set(err, -errno, "removing stale layer %s: %m", de->d_name);
        }
        closedir(d);
        return r;
}

/* ------------------------------------------------- layer export / import */

/* The stream: "HUTCHLY1", u64 image size, u32 the sandbox's uid base, then
 * extents (u64 offset, u64 length, bytes) in increasing offset order, then
 * an extent with offset UINT64_MAX and length 0. Little-endian. */
#define LAYER_MAGIC "HUTCHLY1"
#define LAYER_SIZE_MAX (1ull << 42)

static int put_u64(int fd, uint64_t v) {
        uint8_t b[8];
        for (int i = 0; i < 8; i++)
                b[i] = (uint8_t) (v >> (8 * i));
        return fd_write_all(fd, b, sizeof b);
}

static int get_u64(int fd, uint64_t *ret) {
        uint8_t b[8];
        if (fd_read_full(fd, b, sizeof b) != (ssize_t) sizeof b)
                return -EBADMSG;
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
                v |= (uint64_t) b[i] << (8 * i);
        *ret = v;
        return 0;
}

int storage_open_image(hutch_ctx *ctx, const char *id, int *ret_fd, hutch_error *err) {
        if (!ctx->storage_mnt || !streq(ctx->storage_kind, "ext4"))
                return hutch_error_set(err, -EOPNOTSUPP, "layer snapshots need the ext4 layer backend (this host uses %s)",
                                       ctx->storage_kind ? ctx->storage_kind : "none");
        char img[2300];
        if (layer_image_path(ctx, id, img, sizeof img) < 0)
                return hutch_error_set(err, -ENAMETOOLONG, "layer path too long");
        int fd = open(img, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", img);
        *ret_fd = fd;
        return 0;
}

/* Only descriptors: it runs in the daemon's snapshot worker (a child
 * process, daemon/snapjob.c) as well as in hutch_sandbox_layer_export. */
int storage_export_fd(int src, uid_t uid_base, int out_fd, uint64_t *ret_bytes, hutch_error *err) {
        struct stat st;
        if (fstat(src, &st) < 0)
                return hutch_error_set(err, -errno, "the layer image: %m");
        uint64_t total = 0;
        int r = fd_write_all(out_fd, LAYER_MAGIC, 8);
        uint8_t base[4] = { (uint8_t) uid_base, (uint8_t) (uid_base >> 8), (uint8_t) (uid_base >> 16),
                            (uint8_t) (uid_base >> 24) };
        if (r >= 0)
                r = put_u64(out_fd, (uint64_t) st.st_size);
        if (r >= 0)
                r = fd_write_all(out_fd, base, sizeof base);
        total += 20;
        static uint8_t buf[1 << 20];
        off_t off = 0;
        while (r >= 0) {
                off_t data = lseek(src, off, SEEK_DATA);
                if (data < 0) {
                        if (errno != ENXIO)
                                r = -errno;
                        break;
                }
                off_t hole = lseek(src, data, SEEK_HOLE);
                if (hole < 0) {
                        r = -errno;
                        break;
                }
                if ((r = put_u64(out_fd, (uint64_t) data)) < 0 || (r = put_u64(out_fd, (uint64_t) (hole - data))) < 0)
                        break;
                total += 16;
                for (off_t p = data; p < hole && r >= 0;) {
                        size_t want = (size_t) MIN((off_t) sizeof buf, hole - p);
                        ssize_t n = pread(src, buf, want, p);
                        if (n <= 0) {
                                r = n < 0 ? -errno : -EIO;
                                break;
                        }
                        r = fd_write_all(out_fd, buf, (size_t) n);
                        p += n;
                        total += (uint64_t) n;
                }
                off = hole;
        }
        if (r >= 0 && (r = put_u64(out_fd, UINT64_MAX)) >= 0)
                r = put_u64(out_fd, 0);
        if (r < 0)
                return hutch_error_set(err, r, "exporting the layer: %s", strerror(-r));
        *ret_bytes = total + 16;
        return 0;
}

/* Read a stream into a new image file dst (sized, sparse). Everything is
 * checked: the stream is authenticated by the caller, but a bug must not
 * write outside the image. */
static int layer_import(int in_fd, int dst, uint32_t *ret_base, uint64_t *ret_size, hutch_error *err) {
        char magic[8];
        if (fd_read_full(in_fd, magic, 8) != 8 || memcmp(magic, LAYER_MAGIC, 8) != 0)
                return hutch_error_set(err, -EBADMSG, "not a layer stream");
        uint64_t size;
        uint8_t b[4];
        if (get_u64(in_fd, &size) < 0 || fd_read_full(in_fd, b, 4) != 4)
                return hutch_error_set(err, -EBADMSG, "layer stream cut short");
        if (size == 0 || size > LAYER_SIZE_MAX || size % 4096)
                return hutch_error_set(err, -EBADMSG, "layer stream: bad image size");
        if (ftruncate(dst, (off_t) size) < 0)
                return hutch_error_set(err, -errno, "sizing the layer image: %m");
        static uint8_t buf[1 << 20];
        uint64_t end = 0;
        for (;;) {
                uint64_t off, len;
                if (get_u64(in_fd, &off) < 0 || get_u64(in_fd, &len) < 0)
                        return hutch_error_set(err, -EBADMSG, "layer stream cut short");
                if (off == UINT64_MAX && len == 0)
                        break;
                if (off < end || len == 0 || off > size || len > size - off)
                        return hutch_error_set(err, -EBADMSG, "layer stream: an extent out of bounds");
                end = off + len;
                while (len > 0) {
                        size_t want = (size_t) MIN((uint64_t) sizeof buf, len);
                        if (fd_read_full(in_fd, buf, want) != (ssize_t) want)
                                return hutch_error_set(err, -EBADMSG, "layer stream cut short");
                        if (pwrite(dst, buf, want, (off_t) off) != (ssize_t) want)
                                return hutch_error_set(err, -errno, "writing the layer image: %m");
                        off += want;
                        len -= want;
                }
        }
        *ret_base = (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 | (uint32_t) b[3] << 24;
        *ret_size = size;
        return 0;
}

/* Files that belonged to the ids [from, from + 65536) now belong to the
 * same ids at `to`: a snapshot restored into another sandbox (another id
 * range). chown clears set-id bits, so the mode is put back. */
static int shift_owner_at(int dirfd, const char *name, const struct stat *st, uid_t from, uid_t to) {
        uid_t u = st->st_uid, g = st->st_gid;
        if (u >= from && u - from < 65536)
                u = to + (u - from);
        if (g >= from && g - from < 65536)
                g = to + (g - from);
        if (u == st->st_uid && g == st->st_gid)
                return 0;
        if (fchownat(dirfd, name, u, g, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if (!S_ISLNK(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID)) &&
            fchmodat(dirfd, name, st->st_mode & 07777, 0) < 0)
                return -errno;
        return 0;
}

static int shift_tree(int dirfd, uid_t from, uid_t to, unsigned depth) {
        if (depth > 4096)
                return -ELOOP;
        int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        DIR *d = fdopendir(fd);
        if (!d) {
                close(fd);
                return -errno;
        }
        int r = 0;
        struct dirent *de;
        while (r >= 0 && (de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                if (strchr(de->d_name, '/')) { /* only a corrupted file system says so */
                        r = -EUCLEAN;
                        break;
                }
                struct stat st;
                if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                        r = -errno;
                        break;
                }
                if (S_ISDIR(st.st_mode)) {
                        int sub = openat(dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub < 0) {
                                r = -errno;
                                break;
                        }
                        r = shift_tree(sub, from, to, depth + 1);
                        close(sub);
                }
                if (r >= 0)
                        r = shift_owner_at(dirfd, de->d_name, &st, from, to);
        }
        closedir(d);
        return r;
}

int storage_layer_from(hutch_ctx *ctx, const char *stream_path, const char *img, uint32_t *ret_base, uint64_t *ret_size,
                       hutch_error *err) {
        _cleanup_close_ int in = open(stream_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", stream_path);
        _cleanup_close_ int dst = open(img, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (dst < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", img);
        int r = layer_import(in, dst, ret_base, ret_size, err);
        if (r < 0)
                unlink(img);
        return r;
}

int hutch_layer_import_fds(int in_fd, int image_fd, uint32_t *ret_uid_base, hutch_error *err) {
        uint64_t size = 0;
        return layer_import(in_fd, image_fd, ret_uid_base, &size, err);
}

int storage_shift_owner(int mnt, uid_t from, uid_t to) {
        if (from == to)
                return 0;
        struct stat st;
        if (fstat(mnt, &st) < 0)
                return -errno;
        int r = shift_tree(mnt, from, to, 0);
        return r;
}
