/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The root runsc serves a gvisor sandbox of an image template or of a
 * built template. runsc's gofer serves one host directory, read-only
 * (--overlay2=none, "readonly": true), so the layers are stacked on the
 * host side: an overlayfs mount with lower layers only (no upper layer, so
 * it cannot be written, and it is mounted read-only as well), made in a
 * mount namespace of the relay's own:
 *
 *   gvtop/root   the mount points of runsc's spec (/proc, /sys, /dev, /tmp,
 *                /run/hutch/init, /run/hutch/layer) and the statx shim
 *                (init/gvisor-compat.c): a few entries written into the
 *                sandbox's state dir, so that runsc's gofer never has to
 *                create one in a template layer
 *   layer/upper  a built template's layer: the build's writable-layer
 *                stream imported into this sandbox's own image (as the ns
 *                backend imports it into its writable layer), its files
 *                moved to the ids the build saw, mounted read-only
 *   lower        the template's own top layer (hutch's /etc pieces)
 *   l0..lN-1     the image's layers, top first: bound, never copied
 *
 * with the sandbox's writable layer above it inside the sentry, as for the
 * host template (init/layer.c). The layer store holds the image's own ids
 * (0..65535) and runsc's gofer, which runs without a user namespace of the
 * container's, presents host ids as they are, as it does for the host
 * template's root-owned /usr: a file of uid 1000 in the image is 1000
 * inside, with no id mapping.
 *
 * A sandbox that mounts volumes (docs/volumes.md) always has a stacked
 * root, the host template's too (lower = its rootfs): gvtop/root holds the
 * volumes' mount points in runsc's root, /run/hutch/vol/0.. (runsc's root
 * is read-only and the gofer must not make a directory in a template).
 * Each volume's ext4, un-mapped (on-disk ids are the ids inside, which
 * this gofer presents as they are, as for the layers), is attached at
 * vol/<i> of the sandbox dir in the relay's namespace, and runsc's spec
 * binds it from there; hutch-init binds it to its path inside
 * (init/layer.c). Those mounts stay while runsc runs.
 *
 * The mounts live in the relay's mount namespace only, a slave of the
 * host's (nothing propagates back), and the binds the overlay was made
 * from are unmounted again once it holds its own clones of them: the
 * relay and runsc see the merged root and nothing of the layer store. They
 * go with the last process of the sandbox's runtime, a kill -9 included;
 * the build layer's loop device clears itself when its file system goes
 * (LO_FLAGS_AUTOCLEAR). Every launch (create, the restore after a
 * checkpoint, a resume) makes the same root again from the list kept in
 * the state dir (gvroot).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox-internal.h"
#include "template/template.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/error.h"
#include "util/macro.h"
#include "util/syscalls.h"

/* init/gvisor-compat.so, embedded by the build (init/embed.sh) */
extern const unsigned char hutch_gvisor_compat_start[];
extern const unsigned char hutch_gvisor_compat_end[];

#define GVROOT_FILE "gvroot"
#define GVTOP "gvtop/root"
#define GVROOT_MAX (HUTCH_MAX_LAYERS + 1)

static int mkdir_mode(int dfd, const char *name, mode_t mode) {
        if (mkdirat(dfd, name, mode) < 0 && errno != EEXIST)
                return -errno;
        /* the umask must not change a mount point's mode (/tmp's 01777) */
        return fchmodat(dfd, name, mode, 0) < 0 ? -errno : 0;
}

static int write_mode(int dfd, const char *name, const void *data, size_t len, mode_t mode) {
        _cleanup_close_ int fd = openat(dfd, name,
                                        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;
        int r = len ? fd_write_all(fd, data, len) : 0;
        if (r >= 0 && fchmod(fd, mode) < 0)
                r = -errno;
        return r;
}

/* gvtop/root: what the spec's mounts need in the root, owned by root. Its
 * /tmp is world-writable (the sandbox's /tmp takes its mode), so gvtop is
 * root's alone: no host user (nor the relay, once it runs as the sandbox's
 * host uid) can put a file into this lower layer of a live root. */
static int write_top(int dfd) {
        static const struct {
                const char *name;
                mode_t mode;
        } dirs[] = {
                { "gvtop", 0700 },
                { GVTOP, 0755 },
                { GVTOP "/proc", 0555 },
                { GVTOP "/sys", 0555 },
                { GVTOP "/dev", 0755 },
                { GVTOP "/tmp", 01777 },
                { GVTOP "/run", 0755 },
                { GVTOP "/run/hutch", 0755 },
                { GVTOP INITPROTO_GVISOR_LAYER, 0755 },
        };
        int r;
        for (size_t i = 0; i < ELEMENTSOF(dirs); i++)
                if ((r = mkdir_mode(dfd, dirs[i].name, dirs[i].mode)) < 0)
                        return r;
        if ((r = write_mode(dfd, GVTOP INITPROTO_GVISOR_INIT, "", 0, 0444)) < 0)
                return r;
        return write_mode(dfd, GVTOP INITPROTO_GVISOR_COMPAT, hutch_gvisor_compat_start,
                          (size_t) (hutch_gvisor_compat_end - hutch_gvisor_compat_start), 0644);
}

/* The volumes' mount points: GVISOR_VOL_MOUNT_DIR/<i> in runsc's root (gvtop,
 * root's, like the rest of it) and vol/<i> in the sandbox dir, below vol/,
 * root's alone (0700): the relay, once it runs as the sandbox's host uid,
 * cannot reach a volume's host mount through it. An empty vol/<i> is what
 * a stand-in shows (0755, root's, as a mount point the ns backend makes). */
static int write_volume_points(int dfd, size_t n) {
        int r;
        if (n == 0)
                return 0;
        if ((r = mkdir_mode(dfd, GVTOP GVISOR_VOL_MOUNT_DIR, 0755)) < 0 ||
            (r = mkdir_mode(dfd, GVISOR_VOL_DIR, 0700)) < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                char a[64], b[16];
                snprintf(a, sizeof a, GVTOP GVISOR_VOL_MOUNT_DIR "/%zu", i);
                snprintf(b, sizeof b, GVISOR_VOL_DIR "/%zu", i);
                if ((r = mkdir_mode(dfd, a, 0755)) < 0 || (r = mkdir_mode(dfd, b, 0755)) < 0)
                        return r;
        }
        return 0;
}

int gvisor_root_prepare(hutch_sandbox *sb, const hutch_template *tpl, const char *layer_from,
                        const hutch_volume_mount *vols, size_t n_vols, hutch_error *err) {
        if (!tpl->n_layers && !layer_from && !n_vols)
                return 0; /* the host template: runsc serves its rootfs itself */
        if (n_vols > HUTCH_VOLUMES_MAX)
                return hutch_error_set(err, -E2BIG, "at most %d volume mounts per sandbox",
                                       HUTCH_VOLUMES_MAX);
        /* runsc would have to make a mount point below a template's bind
         * of a host directory (read-only, and the host's) */
        for (size_t i = 0; vols && i < n_vols; i++)
                for (size_t j = 0; j < tpl->n_binds; j++) {
                        size_t k = strlen(tpl->binds[j]);
                        if (strncmp(vols[i].path, tpl->binds[j], k) == 0 &&
                            (vols[i].path[k] == '/' || vols[i].path[k] == 0))
                                return hutch_error_set(
                                        err, -EINVAL,
                                        "volume mount path '%s' is inside '%s', which template '%s' "
                                        "binds read-only from the host",
                                        vols[i].path, tpl->binds[j], tpl->name);
                }
        if (tpl->n_layers > HUTCH_MAX_LAYERS)
                return hutch_error_set(err, -E2BIG, "template '%s' has more than %d layers",
                                       tpl->name, HUTCH_MAX_LAYERS);
        _cleanup_close_ int dfd = open(sb->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", sb->dir);
        int r = write_top(dfd);
        if (r >= 0)
                r = write_volume_points(dfd, n_vols);
        if (r < 0)
                return hutch_error_set(err, r, "preparing the root's mount points: %s", strerror(-r));
        for (size_t i = 0; i < tpl->n_layers; i++) {
                char d[16];
                snprintf(d, sizeof d, "l%zu", i);
                if (mkdirat(dfd, d, 0755) < 0)
                        return hutch_error_set(err, -errno, "preparing %s: %m", sb->dir);
        }
        if (layer_from) {
                /* ids as the build saw them (the stream's range moved to
                 * 0..65535), which runsc presents as they are */
                int fd = -1;
                uint64_t size = 0;
                if ((r = storage_prepare(sb->ctx, sb->id, 0, &sb->limits, layer_from, NULL, 0, &fd, &size,
                                         err)) < 0)
                        return r;
                safe_close(fd); /* mounted again read-only at each launch */
        }
        /* the list every launch stacks: "build=0|1", then the lower dirs
         * below it, top first */
        size_t len = 16;
        len += strlen(tpl->rootfs) + 7;
        for (size_t i = 0; i < tpl->n_layers; i++)
                len += strlen(tpl->layers[i]) + 7;
        _cleanup_free_ char *buf = malloc(len);
        if (!buf)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t off = (size_t) snprintf(buf, len, "build=%d\n", layer_from ? 1 : 0);
        for (size_t i = 0; i <= tpl->n_layers; i++) {
                const char *p = i == 0 ? tpl->rootfs : tpl->layers[i - 1];
                if (p[0] != '/' || strchr(p, '\n'))
                        return hutch_error_set(err, -EINVAL,
                                               "template '%s': a layer path hutch cannot record",
                                               tpl->name);
                off += (size_t) snprintf(buf + off, len - off, "lower=%s\n", p);
        }
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/" GVROOT_FILE, sb->dir);
        if ((r = write_file_atomic(path, buf, off, 0600)) < 0)
                return hutch_error_set(err, r, "writing %s: %s", path, strerror(-r));
        return 1;
}

void gvisor_root_done(gvisor_root *g) {
        for (size_t i = 0; i < g->n_binds; i++)
                free(g->src[i]);
        free(g->src);
        free(g->dst);
        free(g->opts);
        g->layer_fd = safe_close(g->layer_fd);
        for (size_t i = 0; i < g->n_vols; i++)
                safe_close(g->vol_fd[i]);
        *g = (gvisor_root) { .layer_fd = -1 };
}

void gvisor_volumes_hold(hutch_sandbox *sb) {
        _cleanup_close_ int dfd = open(sb->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        _cleanup_free_ char *buf = NULL;
        if (dfd < 0 ||
            read_file_at(dfd, "volumes",
                         HUTCH_VOLUMES_MAX * (HUTCH_VOLUME_ID_LEN + HUTCH_VOLUME_PATH_MAX + 4),
                         &buf) < 0)
                return;
        size_t i = 0;
        for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line && i < HUTCH_VOLUMES_MAX;
             line = strtok_r(NULL, "\n", &save), i++) {
                char *sp = strchr(line, ' ');
                if (!sp || sb->vol_loop[i] >= 0)
                        continue;
                *sp = 0;
                int mnt = -1;
                hutch_error e = { 0 };
                if (volume_hold_loop(sb->ctx, line, &mnt, &sb->vol_loop[i], &e) >= 0)
                        safe_close(mnt);
        }
}

void gvisor_volumes_release(hutch_sandbox *sb) {
        for (size_t i = 0; i < HUTCH_VOLUMES_MAX; i++)
                sb->vol_loop[i] = safe_close(sb->vol_loop[i]);
}

int gvisor_standins(const hutch_sandbox *sb) {
        char p[PATH_MAX], buf[8] = "";
        snprintf(p, sizeof p, "%s/" GVISOR_STANDINS_FILE, sb->dir);
        _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 || read(fd, buf, sizeof buf - 1) <= 0)
                return 0;
        int k = atoi(buf);
        return k > 0 && k <= HUTCH_VOLUMES_MAX ? k : 0;
}

size_t gvisor_volume_slots(const hutch_sandbox *sb) {
        int k = gvisor_standins(sb);
        if (k > 0)
                return (size_t) k;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/volumes", sb->dir);
        _cleanup_free_ char *buf = NULL;
        if (read_file_at(AT_FDCWD, p,
                         HUTCH_VOLUMES_MAX * (HUTCH_VOLUME_ID_LEN + HUTCH_VOLUME_PATH_MAX + 4),
                         &buf) < 0)
                return 0;
        size_t n = 0;
        for (const char *c = buf; *c; c++)
                n += *c == '\n';
        return MIN(n, (size_t) HUTCH_VOLUMES_MAX);
}

/* Each volume the state dir records ("<id> <path>" lines, in mount
 * order), mounted detached, un-mapped, into g. */
static int volumes_hold(hutch_sandbox *sb, int dfd, gvisor_root *g, hutch_error *err) {
        _cleanup_free_ char *buf = NULL;
        int k = gvisor_standins(sb);
        if (k > 0) {
                /* a copy restored from a checkpoint of a sandbox with volumes */
                for (g->n_vols = 0; g->n_vols < (size_t) k; g->n_vols++) {
                        g->vol_fd[g->n_vols] = -1;
                        snprintf(g->vol_dst[g->n_vols], sizeof g->vol_dst[0], GVISOR_VOL_DIR "/%zu",
                                 g->n_vols);
                }
                return 0;
        }
        int r = read_file_at(dfd, "volumes",
                             HUTCH_VOLUMES_MAX * (HUTCH_VOLUME_ID_LEN + HUTCH_VOLUME_PATH_MAX + 4),
                             &buf);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return hutch_error_set(err, r, "reading %s/volumes: %s", sb->dir, strerror(-r));
        for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
                char *sp = strchr(line, ' ');
                if (!sp || g->n_vols >= HUTCH_VOLUMES_MAX)
                        return hutch_error_set(err, -EBADMSG, "%s/volumes is damaged", sb->dir);
                *sp = 0;
                hutch_error e = { 0 };
                int *loop = &sb->vol_loop[g->n_vols];
                if (*loop >= 0)
                        r = volume_mount_loop(line, *loop, &g->vol_fd[g->n_vols], &e);
                else
                        r = volume_hold_loop(sb->ctx, line, &g->vol_fd[g->n_vols], loop, &e);
                if (r < 0)
                        return hutch_error_set(err, r, "the volume mounted at %s: %s%s", sp + 1,
                                               e.msg,
                                               r == -ENOENT ? " (the volume was deleted)" : "");
                snprintf(g->vol_dst[g->n_vols], sizeof g->vol_dst[0], GVISOR_VOL_DIR "/%zu",
                         g->n_vols);
                snprintf(g->vol_path[g->n_vols], sizeof g->vol_path[0], "%s", sp + 1);
                g->n_vols++;
        }
        return 0;
}

static void cat(char *buf, size_t n, const char *s) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s", s);
}

int gvisor_root_parent(hutch_sandbox *sb, gvisor_root *ret, hutch_error *err) {
        *ret = (gvisor_root) { .layer_fd = -1 };
        _cleanup_close_ int dfd = open(sb->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", sb->dir);
        _cleanup_free_ char *buf = NULL;
        int r = read_file_at(dfd, GVROOT_FILE, 64 + GVROOT_MAX * (PATH_MAX + 8), &buf);
        if (r == -ENOENT)
                return 0; /* the template's rootfs as it is */
        if (r < 0)
                return hutch_error_set(err, r, "reading %s/" GVROOT_FILE ": %s", sb->dir,
                                       strerror(-r));
        gvisor_root g = { .layer_fd = -1, .dir = sb->dir, .stacked = true };
        g.src = calloc(GVROOT_MAX, sizeof *g.src);
        g.dst = calloc(GVROOT_MAX, sizeof *g.dst);
        size_t optsz = 64 + GVROOT_MAX * 8;
        g.opts = malloc(optsz);
        if (!g.src || !g.dst || !g.opts) {
                gvisor_root_done(&g);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        bool build = false;
        r = 0;
        for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line && r >= 0;
             line = strtok_r(NULL, "\n", &save)) {
                if (streq(line, "build=1"))
                        build = true;
                else if (startswith(line, "lower=") && line[6] == '/' && g.n_binds < GVROOT_MAX) {
                        if (!(g.src[g.n_binds] = strdup(line + 6)))
                                r = -ENOMEM;
                        else if (g.n_binds == 0)
                                snprintf(g.dst[0], sizeof g.dst[0], "lower");
                        else
                                snprintf(g.dst[g.n_binds], sizeof g.dst[0], "l%zu", g.n_binds - 1);
                        g.n_binds += r >= 0;
                } else if (!streq(line, "build=0"))
                        r = -EBADMSG;
        }
        if (r >= 0 && g.n_binds == 0)
                r = -EBADMSG;
        if (r < 0) {
                gvisor_root_done(&g);
                return hutch_error_set(err, r, "%s/" GVROOT_FILE " is damaged", sb->dir);
        }
        /* overlayfs resolves these against the child's cwd, the sandbox dir */
        snprintf(g.opts, optsz, "lowerdir=" GVTOP "%s", build ? ":layer/upper" : "");
        for (size_t i = 0; i < g.n_binds; i++) {
                cat(g.opts, optsz, ":");
                cat(g.opts, optsz, g.dst[i]);
        }
        /* opaque directories as the layer store and the ns backend's
         * overlays write them (user.overlay.opaque) */
        cat(g.opts, optsz, ",userxattr");
        if (build && (r = storage_layer_mount_ro(sb->ctx, sb->id, &g.layer_fd, err)) < 0) {
                gvisor_root_done(&g);
                return r;
        }
        if ((r = volumes_hold(sb, dfd, &g, err)) < 0) {
                gvisor_root_done(&g);
                return r;
        }
        *ret = g;
        return 1;
}

/* Whether path, inside the root at rootfd, crosses a symlink or a file
 * where it exists: hutch-init makes the mount point in the writable layer,
 * over this same root, and refuses that (init/layer.c), but its error has
 * no way out, so it is checked here first, where the create's error can
 * say it. */
static int mount_point_check(int rootfd, const char *path) {
        char comp[HUTCH_VOLUME_PATH_MAX + 1];
        int dfd = fcntl(rootfd, F_DUPFD_CLOEXEC, 3);
        if (dfd < 0)
                return -errno;
        int r = 0;
        for (const char *p = path; *p;) {
                while (*p == '/')
                        p++;
                if (!*p)
                        break;
                const char *e = strchrnul(p, '/');
                size_t len = (size_t) (e - p);
                if (len >= sizeof comp) {
                        r = -ENAMETOOLONG;
                        break;
                }
                memcpy(comp, p, len);
                comp[len] = 0;
                int next = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (next < 0) {
                        r = errno == ENOENT ? 0 : -errno; /* made in the layer */
                        break;
                }
                close(dfd);
                dfd = next;
                p = e;
        }
        close(dfd);
        return r;
}

/* In the relay's child, before runsc: raw system calls on what the parent
 * prepared, nothing that allocates. */
int gvisor_root_child(const gvisor_root *g, const char **ret_step) {
#define STEP(call, what)                                                                           \
        do {                                                                                       \
                if ((call) < 0) {                                                                  \
                        *ret_step = (what);                                                        \
                        return -errno;                                                             \
                }                                                                                  \
        } while (0)
        if (!g->stacked)
                return 0;
        STEP(unshare(CLONE_NEWNS), "creating the runtime's mount namespace");
        /* nothing mounted here travels back to the host */
        STEP(mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL), "making / a slave");
        STEP(chdir(g->dir), "entering the sandbox directory");
        for (size_t i = 0; i < g->n_binds; i++)
                STEP(mount(g->src[i], g->dst[i], NULL, MS_BIND, NULL), "binding a template layer");
        if (g->layer_fd >= 0)
                STEP(sys_move_mount(g->layer_fd, "", AT_FDCWD, "layer", MOVE_MOUNT_F_EMPTY_PATH),
                     "attaching the build layer");
        STEP(mount("overlay", "root", "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, g->opts),
             "mounting the root's overlay");
        /* the overlay holds private clones of its layers: without the binds
         * nothing here reaches a layer but through the read-only root */
        for (size_t i = 0; i < g->n_binds; i++)
                STEP(umount2(g->dst[i], MNT_DETACH), "unmounting a layer's bind");
        if (g->layer_fd >= 0)
                STEP(umount2("layer", MNT_DETACH), "unmounting the build layer");
        if (g->n_vols > 0) {
                int rootfd = open("root", O_PATH | O_DIRECTORY | O_CLOEXEC);
                STEP(rootfd, "opening the root");
                for (size_t i = 0; i < g->n_vols; i++) {
                        int k = g->vol_path[i][0] ? mount_point_check(rootfd, g->vol_path[i]) : 0;
                        if (k < 0) {
                                close(rootfd);
                                errno = -k;
                                STEP(-1,
                                     k == -ELOOP || k == -ENOTDIR
                                             ? "a volume's mount path crosses a symlink or a file"
                                             : "checking a volume's mount path");
                        }
                }
                close(rootfd);
        }
        /* the volumes stay: runsc binds them from here */
        for (size_t i = 0; i < g->n_vols; i++) {
                if (g->vol_fd[i] >= 0) {
                        STEP(sys_move_mount(g->vol_fd[i], "", AT_FDCWD, g->vol_dst[i],
                                            MOVE_MOUNT_F_EMPTY_PATH),
                             "attaching a volume");
                        continue;
                }
                /* a stand-in: its empty directory, read-only on the host */
                STEP(mount(g->vol_dst[i], g->vol_dst[i], NULL, MS_BIND, NULL),
                     "binding a volume's stand-in");
                STEP(mount(NULL, g->vol_dst[i], NULL,
                           MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
                     "making a volume's stand-in read-only");
        }
        STEP(chdir("/"), "leaving the sandbox directory");
        return 0;
#undef STEP
}
