/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The writable layer of a gVisor sandbox, built by init (PID 1) inside the
 * sentry before anything else runs.
 *
 * runsc's own writable root (--overlay2=root:memory) has no size: a
 * sandbox could fill it up to its memory limit, and its --disk would mean
 * nothing. So the engine starts runsc with the template as a read-only
 * root (--overlay2=none, "readonly": true) and a tmpfs of exactly the disk
 * limit at LAYER_DIR (the sentry's tmpfs enforces size= as ENOSPC), and
 * init, still holding CAP_SYS_ADMIN inside the sentry:
 *
 *  1. unmounts runsc's own /tmp (an unsized tmpfs runsc adds by itself);
 *  2. mounts the sentry's overlay: the read-only root below, LAYER_DIR's
 *     upper/work above, at LAYER_DIR/root;
 *  3. binds the root's other mounts (/proc, /dev, /dev/pts, /dev/shm,
 *     /sys, the template's read-only binds) into it, in mount order;
 *  3b. binds each volume (runsc's bind of it at INITPROTO_GVISOR_VOLUMES/<i>,
 *     lib/sandbox/gvisor-root.c) at its path, the mount point made in the
 *     writable layer where missing, no component of it a symlink (a
 *     template's /mnt -> /proc must not put a volume over /proc), as the
 *     namespace backend does (lib/sandbox/child.c);
 *  4. chroots into it (the sentry refuses pivot_root for a container's
 *     root mount, which has no parent) and drops CAP_SYS_ADMIN from every
 *     set and the bounding set, so that no process of the sandbox ever
 *     holds it.
 *
 * Every writable place a process can reach, even one that leaves the
 * chroot (root may chroot, as in a container), is bounded: the old root is
 * read-only, /dev and /dev/shm are sized tmpfs, and the layer is the layer.
 * Its files live in the sentry's memory and also count against the memory
 * limit, as files in runsc's own overlay did.
 *
 * Usage is reported to the relay once a second when it changed (MUX_DISK),
 * for the host's metrics (diskUsed).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "init.h"
#include "util/parse.h"

#define LAYER_DIR INITPROTO_GVISOR_LAYER
#define LAYER_ROOT LAYER_DIR "/root"
#define CAP_SYS_ADMIN_BIT 21

static bool under(const char *path, const char *dir) {
        size_t n = strlen(dir);
        return strncmp(path, dir, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/* Bind every mount of the old root but the root itself, the layer and
 * init's own binary into the new root, parents before their children (the
 * order of /proc/self/mounts). */
static int bind_mounts(void) {
        FILE *f = fopen("/proc/self/mounts", "re");
        if (!f)
                return negative_errno();
        char line[4096];
        int r = 0;
        while (r == 0 && fgets(line, sizeof line, f)) {
                char *save = NULL, *dev = strtok_r(line, " ", &save), *dir = strtok_r(NULL, " ", &save);
                if (!dev || !dir)
                        continue;
                unescape_octal(dir);
                if (dir[0] != '/' || streq(dir, "/") || under(dir, LAYER_DIR) ||
                    streq(dir, INITPROTO_GVISOR_INIT) || under(dir, INITPROTO_GVISOR_VOLUMES))
                        continue;
                char target[PATH_MAX];
                if (snprintf(target, sizeof target, "%s%s", LAYER_ROOT, dir) >= (int) sizeof target) {
                        r = -ENAMETOOLONG;
                        break;
                }
                if (mount(dir, target, NULL, MS_BIND, NULL) < 0) {
                        r = negative_errno();
                        log_debug("binding %s: %s", dir, strerror(-r));
                }
        }
        fclose(f);
        return r;
}

/* The mount point of a volume at path (absolute, clean: the engine
 * checked it) in the new root, made as root 0755 where missing; every
 * component entered without following a symlink. Nothing else runs in
 * the sandbox yet, so the checked path is the path mounted on. */
static int volume_mount_point(const char *path, char *target, size_t n) {
        if (snprintf(target, n, "%s%s", LAYER_ROOT, path) >= (int) n)
                return -ENAMETOOLONG;
        int dfd = open(LAYER_ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return negative_errno();
        char comp[PATH_MAX];
        int r = 0;
        for (const char *p = path; r == 0 && *p;) {
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
                if (mkdirat(dfd, comp, 0755) < 0 && errno != EEXIST) {
                        r = negative_errno();
                        break;
                }
                int next = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (next < 0)
                        r = negative_errno();
                else {
                        close(dfd);
                        dfd = next;
                }
                p = e;
        }
        close(dfd);
        return r;
}

static int bind_volumes(char *const *paths, size_t n) {
        for (size_t i = 0; i < n; i++) {
                char src[64], target[PATH_MAX];
                snprintf(src, sizeof src, INITPROTO_GVISOR_VOLUMES "/%zu", i);
                int r = volume_mount_point(paths[i], target, sizeof target);
                if (r < 0) {
                        fprintf(stderr, "hutch-init: the mount point of the volume at %s: %s%s\n",
                                paths[i], strerror(-r),
                                r == -ELOOP || r == -ENOTDIR ? " (it crosses a symlink or a file)"
                                                             : "");
                        return r;
                }
                if (mount(src, target, NULL, MS_BIND, NULL) < 0) {
                        r = negative_errno();
                        fprintf(stderr, "hutch-init: binding the volume at %s: %s\n", paths[i],
                                strerror(-r));
                        return r;
                }
        }
        return 0;
}

/* Out of the effective, permitted and inheritable sets, and the bounding
 * set: no process started from here on can have it. */
static int drop_sys_admin(void) {
        struct {
                uint32_t version;
                int pid;
        } hdr = { 0x20080522, 0 }; /* _LINUX_CAPABILITY_VERSION_3 */
        struct {
                uint32_t effective, permitted, inheritable;
        } data[2];
        if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN_BIT, 0, 0, 0) < 0)
                return negative_errno();
        if (syscall(SYS_capget, &hdr, data) < 0)
                return negative_errno();
        uint32_t bit = 1u << CAP_SYS_ADMIN_BIT;
        data[0].effective &= ~bit;
        data[0].permitted &= ~bit;
        data[0].inheritable &= ~bit;
        if (syscall(SYS_capset, &hdr, data) < 0)
                return negative_errno();
        if (prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN_BIT, 0, 0, 0) != 0)
                return -EPERM;
        return 0;
}

/* This runsc refuses AT_NO_AUTOMOUNT (statx, fstatat): EINVAL for every
 * `ls` and `stat`. The template carries a shim that drops the flag
 * (init/gvisor-compat.c); name it in /etc/ld.so.preload, in the writable
 * layer, unless the template has a preload list of its own. Best effort: a
 * template without the shim just runs without it. */
static void preload_compat(void) {
        if (access(INITPROTO_GVISOR_COMPAT, R_OK) < 0)
                return;
        int fd = open("/etc/ld.so.preload", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return;
        static const char line[] = INITPROTO_GVISOR_COMPAT "\n";
        (void) !write(fd, line, sizeof line - 1);
        close(fd);
}

int layer_setup(char *const *vol_paths, size_t n_vols) {
        int r;
        /* runsc's /tmp (not there: nothing to do) */
        if (umount2("/tmp", MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
                return negative_errno();
        if (mkdir(LAYER_DIR "/upper", 0755) < 0 || mkdir(LAYER_DIR "/work", 0700) < 0 ||
            mkdir(LAYER_ROOT, 0755) < 0)
                return negative_errno();
        if (mount("overlay", LAYER_ROOT, "overlay", 0,
                  "lowerdir=/,upperdir=" LAYER_DIR "/upper,workdir=" LAYER_DIR "/work") < 0)
                return negative_errno();
        if ((r = bind_mounts()) < 0 || (r = bind_volumes(vol_paths, n_vols)) < 0)
                return r;
        if (chdir(LAYER_ROOT) < 0 || chroot(".") < 0 || chdir("/") < 0)
                return negative_errno();
        preload_compat();
        return drop_sys_admin();
}

/* ------------------------------------------------------------- usage */

static source timer_src = { .fd = -1 };
static uint64_t reported = UINT64_MAX;

static void timer_dispatch(source *s, uint32_t events) {
        uint64_t ticks;
        (void) !read(s->fd, &ticks, sizeof ticks);
        struct statfs st;
        if (statfs("/", &st) < 0 || st.f_bfree > st.f_blocks)
                return;
        uint64_t used = (uint64_t) (st.f_blocks - st.f_bfree) * (uint64_t) st.f_bsize;
        if (used != reported) {
                reported = used;
                guest_report_disk(used);
        }
}

static void noop_release(source *s) {
}

int layer_watch_setup(void) {
        int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
        if (fd < 0)
                return negative_errno();
        timer_src = (source) { .fd = fd, .dispatch = timer_dispatch, .release = noop_release };
        int r = source_add(&timer_src, EPOLLIN);
        if (r < 0)
                return r;
        struct itimerspec its = { .it_value = { .tv_nsec = 1000 * 1000 }, .it_interval = { .tv_sec = 1 } };
        return timerfd_settime(fd, 0, &its, NULL) < 0 ? negative_errno() : 0;
}

void layer_watch_restored(void) {
        /* a new relay: tell it again at the next tick */
        reported = UINT64_MAX;
}
