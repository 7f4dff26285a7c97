/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NVIDIA GPUs in ns sandboxes (docs/gpu.md): what the host has, which
 * sandbox holds which GPU, and what the clone child is handed.
 *
 *   discovery    the device nodes <dev dir>/nvidiaN and the driver's
 *                control nodes; its user-space libraries and programs
 *                under the driver root, found where the dynamic loader
 *                and nvidia-container-toolkit look (the multiarch and lib64
 *                directories, Debian's nvidia/current, ld.so.conf.d), each
 *                resolved inside the root (openat2 RESOLVE_IN_ROOT)
 *   allocation   run_dir/gpus/<MAJ>.<MIN>.<sandbox id>, one file per GPU
 *                and holder, made under the directory's flock, so that the
 *                daemon and every `hutch run` on the run dir never hand one
 *                GPU to two sandboxes (unless sharing is on); a reservation
 *                whose sandbox directory, or whose sandbox's init, is gone
 *                is stale
 *   the child    detached read-only binds of each file and node, made here
 *                (as host root, so that the driver root's modes do not
 *                matter) before the clone; the child attaches them
 *   NVML         libnvidia-ml, loaded at run time (no build dependency),
 *                for the GPU memory of a sandbox's processes
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

#if defined(__x86_64__)
#define MULTIARCH "x86_64-linux-gnu"
#elif defined(__aarch64__)
#define MULTIARCH "aarch64-linux-gnu"
#else
#error "the driver's multiarch directory is unknown for this architecture"
#endif

/* ------------------------------------------------------------ the request */

enum { GPU_REQ_NONE, GPU_REQ_COUNT, GPU_REQ_ALL, GPU_REQ_IDS };

typedef struct gpu_request {
        int kind;
        uint32_t count;               /* COUNT */
        uint32_t ids[HUTCH_GPUS_MAX]; /* IDS */
        size_t n_ids;
} gpu_request;

/* An id as the node's number: 0..253 (255 is nvidiactl's minor, 254 nvidia-modeset's). */
#define GPU_ID_MAX 253

static int parse_ids(const char *s, gpu_request *ret, hutch_error *err) {
        ret->kind = GPU_REQ_IDS;
        ret->n_ids = 0;
        for (const char *p = s; *p;) {
                if (*p < '0' || *p > '9')
                        return hutch_error_set(
                                err, -EINVAL,
                                "gpus '%s': expected GPU ids (numbers) between the commas", s);
                uint32_t v = 0;
                size_t digits = 0;
                for (; *p >= '0' && *p <= '9'; p++, digits++)
                        if ((v = v * 10 + (uint32_t) (*p - '0')) > GPU_ID_MAX || digits > 3)
                                return hutch_error_set(err, -EINVAL, "gpus '%s': a GPU id is 0 to %d",
                                                       s, GPU_ID_MAX);
                for (size_t i = 0; i < ret->n_ids; i++)
                        if (ret->ids[i] == v)
                                return hutch_error_set(err, -EINVAL,
                                                       "gpus '%s': GPU %u is named twice", s, v);
                if (ret->n_ids == HUTCH_GPUS_MAX)
                        return hutch_error_set(err, -EINVAL, "gpus '%s': at most %d GPUs", s,
                                               HUTCH_GPUS_MAX);
                ret->ids[ret->n_ids++] = v;
                if (*p == ',')
                        p++;
                else if (*p)
                        return hutch_error_set(err, -EINVAL,
                                               "gpus '%s': expected GPU ids separated by commas", s);
        }
        if (ret->n_ids == 0)
                return hutch_error_set(err, -EINVAL, "gpus '%s': no GPU id", s);
        return 0;
}

/* "N" a count, "all", "ID,ID..." (a comma makes a list: "1," is GPU 1) or
 * "device=ID[,ID...]" (docker's spelling). */
static int gpu_request_parse(const char *spec, gpu_request *ret, hutch_error *err) {
        gpu_request r = { .kind = GPU_REQ_NONE };
        if (!spec || !*spec) {
                *ret = r;
                return 0;
        }
        if (strlen(spec) > 512)
                return hutch_error_set(err, -EINVAL, "gpus: longer than 512 bytes");
        if (streq(spec, "all"))
                r.kind = GPU_REQ_ALL;
        else if (startswith(spec, "device="))
                return parse_ids(spec + strlen("device="), ret, err);
        else if (strchr(spec, ','))
                return parse_ids(spec, ret, err);
        else {
                size_t n = strspn(spec, "0123456789");
                if (n == 0 || spec[n] || n > 3)
                        return hutch_error_set(
                                err, -EINVAL,
                                "gpus '%s': expected a count (N), all, GPU ids (0,1 or device=1)",
                                spec);
                r.count = (uint32_t) strtoul(spec, NULL, 10);
                if (r.count > HUTCH_GPUS_MAX)
                        return hutch_error_set(err, -EINVAL, "gpus '%s': at most %d GPUs", spec,
                                               HUTCH_GPUS_MAX);
                r.kind = r.count ? GPU_REQ_COUNT : GPU_REQ_NONE;
        }
        *ret = r;
        return 0;
}

int hutch_gpu_spec_check(const char *spec, hutch_error *err) {
        gpu_request r;
        int k = gpu_request_parse(spec, &r, err);
        if (k < 0)
                return k;
        return r.kind != GPU_REQ_NONE;
}

/* -------------------------------------------------------------- the nodes */

typedef struct gpu_node {
        char name[32]; /* under the dev dir */
        dev_t rdev;
        mode_t mode;
} gpu_node;

typedef struct gpu_devs {
        gpu_node gpus[HUTCH_GPUS_MAX]; /* ascending by id */
        uint32_t ids[HUTCH_GPUS_MAX];
        size_t n_gpus;
        gpu_node ctl[GPU_CTL_MAX];
        size_t n_ctl;
        bool have_ctl; /* nvidiactl among ctl */
} gpu_devs;

static const char *const ctl_names[GPU_CTL_MAX] = { "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                                    "nvidia-modeset" };

static int gpu_node_id(const char *name, uint32_t *ret) {
        if (!startswith(name, "nvidia"))
                return -EINVAL;
        const char *d = name + strlen("nvidia");
        size_t n = strspn(d, "0123456789");
        if (n == 0 || n > 3 || d[n] || (n > 1 && d[0] == '0'))
                return -EINVAL;
        unsigned long v = strtoul(d, NULL, 10);
        if (v > GPU_ID_MAX)
                return -EINVAL;
        *ret = (uint32_t) v;
        return 0;
}

static int devs_scan(const hutch_ctx *ctx, gpu_devs *ret, hutch_error *err) {
        gpu_devs g = { .n_gpus = 0 };
        _cleanup_close_ int dfd = open(ctx->gpu_dev_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening the GPU device directory %s: %m",
                                       ctx->gpu_dev_dir);
        int dup_fd = dup(dfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return hutch_error_set(err, -errno, "reading %s: %m", ctx->gpu_dev_dir);
        }
        for (struct dirent *de; (de = readdir(d));) {
                uint32_t id;
                if (gpu_node_id(de->d_name, &id) < 0)
                        continue;
                struct stat st;
                if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISCHR(st.st_mode))
                        continue;
                if (g.n_gpus == HUTCH_GPUS_MAX)
                        break;
                /* insertion, ascending by id */
                size_t i = g.n_gpus++;
                for (; i > 0 && g.ids[i - 1] > id; i--) {
                        g.ids[i] = g.ids[i - 1];
                        g.gpus[i] = g.gpus[i - 1];
                }
                g.ids[i] = id;
                snprintf(g.gpus[i].name, sizeof g.gpus[i].name, "%s", de->d_name);
                g.gpus[i].rdev = st.st_rdev;
                g.gpus[i].mode = st.st_mode;
        }
        closedir(d);
        for (size_t i = 0; i < GPU_CTL_MAX; i++) {
                struct stat st;
                if (fstatat(dfd, ctl_names[i], &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISCHR(st.st_mode))
                        continue;
                gpu_node *c = &g.ctl[g.n_ctl++];
                snprintf(c->name, sizeof c->name, "%s", ctl_names[i]);
                c->rdev = st.st_rdev;
                c->mode = st.st_mode;
                if (i == 0)
                        g.have_ctl = true;
        }
        *ret = g;
        return 0;
}

int hutch_gpu_count(hutch_ctx *ctx) {
        gpu_devs g;
        return devs_scan(ctx, &g, NULL) < 0 ? 0 : (int) g.n_gpus;
}

/* The sandbox's users are not the nodes' owner (host root, unmapped
 * inside: nobody), so only the "other" bits count; the driver makes them
 * 0666 unless told otherwise (NVreg_DeviceFileMode). */
static bool node_usable(const gpu_node *n) {
        return (n->mode & 0006) == 0006;
}

/* ----------------------------------------------------------- reservations */

typedef struct holders {
        unsigned n[HUTCH_GPUS_MAX];     /* sandboxes holding each GPU of devs */
        bool exclusive[HUTCH_GPUS_MAX]; /* one of them holds it alone */
        char who[HUTCH_GPUS_MAX][HUTCH_ID_LEN + 1];
} holders;

static int gpus_dir_open(hutch_ctx *ctx, bool create, int *ret_dfd, int *ret_lock) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/gpus", ctx->run_dir);
        if (create) {
                int r = mkdir_p(path, 0700);
                if (r < 0)
                        return r;
        }
        _cleanup_close_ int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        int lfd = lock_file_take(dfd, ".lock");
        if (lfd < 0)
                return lfd;
        *ret_dfd = TAKE_FD(dfd);
        *ret_lock = lfd;
        return 0;
}

/* "<maj>.<min>.<id>" */
static bool reservation_parse(const char *name, unsigned *maj, unsigned *min,
                              char id[HUTCH_ID_LEN + 1]) {
        int used = 0;
        if (sscanf(name, "%u.%u.%n", maj, min, &used) != 2 || used == 0)
                return false;
        if (sandbox_validate_id(name + used) < 0)
                return false;
        memcpy(id, name + used, HUTCH_ID_LEN + 1);
        return true;
}

static bool sandbox_dir_exists(hutch_ctx *ctx, const char *id) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/sandboxes/%s", ctx->run_dir, id);
        return !(stat(path, &st) < 0 && errno == ENOENT);
}

/* Who holds each GPU of g (stale reservations removed). */
static int holders_read(hutch_ctx *ctx, int dfd, const gpu_devs *g, holders *ret) {
        memset(ret, 0, sizeof *ret);
        int dup_fd = dup(dfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return -errno;
        }
        for (struct dirent *de; (de = readdir(d));) {
                unsigned maj, min;
                char id[HUTCH_ID_LEN + 1];
                if (!reservation_parse(de->d_name, &maj, &min, id))
                        continue;
                /* gone, or its init is: every process that could hold the
                 * GPU is (a `hutch run` killed with SIGKILL leaves its
                 * directory to `hutch gc`, and must not leave its GPU) */
                if (!sandbox_dir_exists(ctx, id) || sandbox_init_gone(ctx, id)) {
                        (void) unlinkat(dfd, de->d_name, 0);
                        continue;
                }
                _cleanup_free_ char *mode = NULL;
                bool excl = read_file_at(dfd, de->d_name, 32, &mode) < 0 ||
                        !startswith(mode, "shared");
                for (size_t i = 0; i < g->n_gpus; i++)
                        if (major(g->gpus[i].rdev) == maj && minor(g->gpus[i].rdev) == min) {
                                if (ret->n[i]++ == 0 || excl)
                                        memcpy(ret->who[i], id, sizeof ret->who[i]);
                                ret->exclusive[i] |= excl;
                        }
        }
        closedir(d);
        return 0;
}

static bool gpu_free_for(const holders *h, size_t i, bool share) {
        return h->n[i] == 0 || (share && !h->exclusive[i]);
}

/* Which GPUs of g the request gets (indexes into g), given the holders. */
static int pick(hutch_ctx *ctx, const gpu_request *rq, const gpu_devs *g, const holders *h,
                size_t *ret_idx, size_t *ret_n, hutch_error *err) {
        bool share = ctx->gpu_share;
        size_t n = 0;
        if (g->n_gpus == 0)
                return hutch_error_set(err, -ENODEV,
                                       "no NVIDIA GPU on this host (no %s/nvidia0, nvidia1, ...)",
                                       ctx->gpu_dev_dir);
        if (!g->have_ctl)
                return hutch_error_set(err, -ENODEV,
                                       "%s/nvidiactl is missing: is the NVIDIA driver loaded?",
                                       ctx->gpu_dev_dir);
        switch (rq->kind) {
        case GPU_REQ_ALL:
                for (size_t i = 0; i < g->n_gpus; i++) {
                        if (!gpu_free_for(h, i, share))
                                return hutch_error_set(err, -EBUSY,
                                                       "gpus all: GPU %u is held by sandbox %s%s",
                                                       g->ids[i], h->who[i], share ? " alone" : "");
                        ret_idx[n++] = i;
                }
                break;
        case GPU_REQ_IDS:
                for (size_t k = 0; k < rq->n_ids; k++) {
                        size_t i = 0;
                        while (i < g->n_gpus && g->ids[i] != rq->ids[k])
                                i++;
                        if (i == g->n_gpus)
                                return hutch_error_set(err, -ENODEV,
                                                       "no GPU %u on this host (no %s/nvidia%u)",
                                                       rq->ids[k], ctx->gpu_dev_dir, rq->ids[k]);
                        if (!gpu_free_for(h, i, share))
                                return hutch_error_set(err, -EBUSY, "GPU %u is held by sandbox %s%s",
                                                       g->ids[i], h->who[i], share ? " alone" : "");
                        ret_idx[n++] = i;
                }
                break;
        case GPU_REQ_COUNT: {
                if (rq->count > g->n_gpus)
                        return hutch_error_set(err, -ENODEV, "%u GPUs asked for: this host has %zu",
                                               rq->count, g->n_gpus);
                /* the least shared first, then by id: with sharing on, the load spreads */
                for (unsigned load = 0; n < rq->count && load <= UINT16_MAX; load++) {
                        bool more = false;
                        for (size_t i = 0; i < g->n_gpus && n < rq->count; i++) {
                                if (h->n[i] > load)
                                        more = true;
                                if (h->n[i] == load && gpu_free_for(h, i, share))
                                        ret_idx[n++] = i;
                        }
                        if (!more || !share)
                                break;
                }
                if (n < rq->count) {
                        size_t busy = 0;
                        while (busy < g->n_gpus && gpu_free_for(h, busy, share))
                                busy++;
                        return hutch_error_set(
                                err, -EBUSY,
                                "%u GPU%s asked for, %zu free of %zu (GPU %u is held by sandbox %s)",
                                rq->count, rq->count == 1 ? "" : "s", n, g->n_gpus,
                                busy < g->n_gpus ? g->ids[busy] : 0,
                                busy < g->n_gpus ? h->who[busy] : "?");
                }
                /* ascending ids, whatever the load order */
                for (size_t a = 1; a < n; a++)
                        for (size_t b = a; b > 0 && ret_idx[b - 1] > ret_idx[b]; b--) {
                                size_t t = ret_idx[b];
                                ret_idx[b] = ret_idx[b - 1];
                                ret_idx[b - 1] = t;
                        }
                break;
        }
        default:
                break;
        }
        /* every node the sandbox will open must be open to its users */
        for (size_t k = 0; k < n; k++)
                if (!node_usable(&g->gpus[ret_idx[k]]))
                        return hutch_error_set(
                                err, -EACCES,
                                "%s/%s is mode %04o: the sandbox's users could not open it (the driver's "
                                "default is 0666, NVreg_DeviceFileMode)",
                                ctx->gpu_dev_dir, g->gpus[ret_idx[k]].name,
                                (unsigned) (g->gpus[ret_idx[k]].mode & 07777));
        if (!node_usable(&g->ctl[0]))
                return hutch_error_set(
                        err, -EACCES,
                        "%s/nvidiactl is mode %04o: the sandbox's users could not open it",
                        ctx->gpu_dev_dir, (unsigned) (g->ctl[0].mode & 07777));
        *ret_n = n;
        return 0;
}

/* Parse, scan and pick; with dfd >= 0 (the run dir's gpus/, locked) the
 * current holders count, else none. */
static int gpu_choose(hutch_ctx *ctx, const char *spec, int dfd, gpu_devs *ret_devs,
                      size_t *ret_idx, size_t *ret_n, hutch_error *err) {
        gpu_request rq;
        int r = gpu_request_parse(spec, &rq, err);
        if (r < 0)
                return r;
        if (rq.kind == GPU_REQ_NONE) {
                *ret_n = 0;
                return 0;
        }
        if ((r = devs_scan(ctx, ret_devs, err)) < 0)
                return r == -ENOENT
                        ? hutch_error_set(err, -ENODEV, "no NVIDIA GPU on this host (%s is missing)",
                                          ctx->gpu_dev_dir)
                        : r;
        holders h = { { 0 } };
        if (dfd >= 0 && (r = holders_read(ctx, dfd, ret_devs, &h)) < 0)
                return hutch_error_set(err, r, "reading GPU reservations in %s/gpus: %s",
                                       ctx->run_dir, strerror(-r));
        return pick(ctx, &rq, ret_devs, &h, ret_idx, ret_n, err);
}

int hutch_gpu_check(hutch_ctx *ctx, const char *spec, hutch_error *err) {
        gpu_devs g;
        size_t idx[HUTCH_GPUS_MAX], n = 0;
        _cleanup_close_ int dfd = -1, lfd = -1;
        int r = gpus_dir_open(ctx, false, &dfd, &lfd);
        if (r < 0 && r != -ENOENT)
                return hutch_error_set(err, r, "opening GPU reservations in %s/gpus: %s",
                                       ctx->run_dir, strerror(-r));
        return gpu_choose(ctx, spec, dfd, &g, idx, &n, err);
}

int gpu_alloc(hutch_ctx *ctx, const char *id, const char *spec, uint32_t ret_ids[HUTCH_GPUS_MAX],
              size_t *ret_n, hutch_error *err) {
        gpu_request rq;
        int r = gpu_request_parse(spec, &rq, err);
        if (r < 0)
                return r;
        if (rq.kind == GPU_REQ_NONE) {
                *ret_n = 0;
                return 0;
        }
        _cleanup_close_ int dfd = -1, lfd = -1;
        if ((r = gpus_dir_open(ctx, true, &dfd, &lfd)) < 0)
                return hutch_error_set(err, r, "opening GPU reservations in %s/gpus: %s",
                                       ctx->run_dir, strerror(-r));
        gpu_devs g;
        size_t idx[HUTCH_GPUS_MAX], n = 0;
        if ((r = gpu_choose(ctx, spec, dfd, &g, idx, &n, err)) < 0)
                return r;
        const char *mode = ctx->gpu_share ? "shared\n" : "exclusive\n";
        for (size_t k = 0; k < n; k++) {
                char name[64];
                const gpu_node *node = &g.gpus[idx[k]];
                snprintf(name, sizeof name, "%u.%u.%s", major(node->rdev), minor(node->rdev), id);
                _cleanup_close_ int fd = openat(
                        dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                r = fd < 0 ? -errno : fd_write_all(fd, mode, strlen(mode));
                if (r < 0) {
                        for (size_t j = 0; j <= k; j++) {
                                const gpu_node *o = &g.gpus[idx[j]];
                                snprintf(name, sizeof name, "%u.%u.%s", major(o->rdev),
                                         minor(o->rdev), id);
                                (void) unlinkat(dfd, name, 0);
                        }
                        return hutch_error_set(err, r, "reserving GPU %u: %s", g.ids[idx[k]],
                                               strerror(-r));
                }
                ret_ids[k] = g.ids[idx[k]];
        }
        *ret_n = n;
        return 0;
}

void gpu_release(hutch_ctx *ctx, const char *id) {
        _cleanup_close_ int dfd = -1, lfd = -1;
        if (gpus_dir_open(ctx, false, &dfd, &lfd) < 0)
                return; /* no GPU was ever reserved here */
        int dup_fd = dup(dfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return;
        }
        for (struct dirent *de; (de = readdir(d));) {
                unsigned maj, min;
                char who[HUTCH_ID_LEN + 1];
                if (reservation_parse(de->d_name, &maj, &min, who) && streq(who, id))
                        (void) unlinkat(dfd, de->d_name, 0);
        }
        closedir(d);
}

size_t hutch_sandbox_gpus(const hutch_sandbox *sb, uint32_t ret_ids[HUTCH_GPUS_MAX]) {
        if (ret_ids)
                memcpy(ret_ids, sb->gpu_ids, sb->n_gpus * sizeof *ret_ids);
        return sb->n_gpus;
}

/* -------------------------------------------------------- the driver's files */

static const char *const lib_dirs[] = {
        "usr/lib/" MULTIARCH,
        "lib/" MULTIARCH,
        "usr/lib/" MULTIARCH "/nvidia/current", /* Debian's packages */
        "usr/lib64",
        "lib64",
        "usr/local/nvidia/lib64", /* the runfile, old images */
        "usr/lib",
        NULL,
};
static const char *const bin_dirs[] = { "usr/bin", "bin", "usr/local/nvidia/bin", "usr/sbin", NULL };
/* Programs of the driver a sandbox may run; nvidia-persistenced and the
 * X/installer tools are left out. */
static const char *const driver_bins[] = { "nvidia-smi", "nvidia-debugdump", NULL };

/* The driver's user-space libraries: CUDA's driver API, NVML and the
 * rest of libnvidia-* (JIT compiler, NVVM, allocator, ...), the video
 * codecs. Not nvidia-container-toolkit's own libnvidia-container. */
static bool driver_lib_name(const char *n) {
        if (!strstr(n, ".so") || strlen(n) >= GPU_NAME_MAX - 4 || strchr(n, '/'))
                return false;
        if (startswith(n, "libnvidia-container"))
                return false;
        return startswith(n, "libcuda.so") || startswith(n, "libcudadebugger.so") ||
                startswith(n, "libnvidia-") || startswith(n, "libnvcuvid.so");
}

typedef struct file_list {
        gpu_child *g;
        int root_fd; /* the driver root */
} file_list;

static bool name_taken(const gpu_child *g, const char *name) {
        for (size_t i = 0; i < g->n_files; i++)
                if (streq(g->files[i].name, name))
                        return true;
        for (size_t i = 0; i < g->n_links; i++)
                if (streq(g->links[i].name, name))
                        return true;
        return false;
}

/* A detached bind of the regular file rel (resolved inside the driver
 * root: an absolute symlink there points inside it, as for the loader
 * of a container on that root), read-only, no setuid, no devices. */
static int bind_in_root(int root_fd, const char *rel, int *ret_fd) {
        struct open_how how = { .flags = O_PATH | O_CLOEXEC,
                                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
        _cleanup_close_ int fd = sys_openat2(root_fd, rel, &how, sizeof how);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        _cleanup_close_ int m = sys_open_tree(fd, "",
                                              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        if (m < 0)
                return -errno;
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                           MOUNT_ATTR_NODEV };
        if (sys_mount_setattr(m, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
                return -errno;
        *ret_fd = TAKE_FD(m);
        return 0;
}

static int add_file(file_list *fl, const char *rel, const char *name, hutch_error *err) {
        gpu_child *g = fl->g;
        if (g->n_files == GPU_FILES_MAX)
                return hutch_error_set(err, -E2BIG, "more than %d files of the NVIDIA driver",
                                       GPU_FILES_MAX);
        int fd = -1, r = bind_in_root(fl->root_fd, rel, &fd);
        if (r == -ENOENT || r == -EINVAL || r == -ELOOP || r == -EXDEV)
                return 0; /* a dangling or odd link: nothing to give */
        if (r < 0)
                return hutch_error_set(err, r, "binding the driver's %s: %s", rel, strerror(-r));
        g->files[g->n_files].fd = fd;
        snprintf(g->files[g->n_files].name, GPU_NAME_MAX, "%s", name);
        g->n_files++;
        return 0;
}

/* A directory inside the root (links resolved in it, never out of it):
 * its stream, and in *ret_dfd a descriptor of it for the *at() calls; NULL
 * when it is not there or cannot be read (*ret_dfd then stays -1). */
static DIR *opendir_in_root(int root_fd, const char *rel, int *ret_dfd) {
        struct open_how how = { .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
        _cleanup_close_ int dfd = sys_openat2(root_fd, rel, &how, sizeof how);
        if (dfd < 0)
                return NULL;
        int dup_fd = dup(dfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return NULL;
        }
        *ret_dfd = TAKE_FD(dfd);
        return d;
}

/* Every driver library in one directory (rel to the root), whose names
 * no earlier directory gave: regular files and links out of the
 * directory as binds, links to a sibling driver library as links. */
static int scan_lib_dir(file_list *fl, const char *rel, hutch_error *err) {
        _cleanup_close_ int dfd = -1;
        DIR *d = opendir_in_root(fl->root_fd, rel, &dfd);
        if (!d)
                return 0;
        int r = 0;
        for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                if (!driver_lib_name(de->d_name))
                        continue;
                char name[GPU_NAME_MAX], path[PATH_MAX];
                snprintf(name, sizeof name, "lib/%s", de->d_name);
                if (name_taken(fl->g, name))
                        continue;
                struct stat st;
                if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue;
                if (S_ISLNK(st.st_mode)) {
                        char target[GPU_NAME_MAX];
                        ssize_t n = readlinkat(dfd, de->d_name, target, sizeof target - 1);
                        if (n > 0) {
                                target[n] = 0;
                                if (!strchr(target, '/') && driver_lib_name(target) &&
                                    fstatat(dfd, target, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                                        if (fl->g->n_links == GPU_FILES_MAX) {
                                                r = hutch_error_set(
                                                        err, -E2BIG,
                                                        "more than %d links of the NVIDIA driver",
                                                        GPU_FILES_MAX);
                                                break;
                                        }
                                        snprintf(fl->g->links[fl->g->n_links].name, GPU_NAME_MAX,
                                                 "%s", name);
                                        snprintf(fl->g->links[fl->g->n_links].target, GPU_NAME_MAX,
                                                 "%s", target);
                                        fl->g->n_links++;
                                        continue;
                                }
                        }
                } else if (!S_ISREG(st.st_mode))
                        continue;
                snprintf(path, sizeof path, "%s/%s", rel, de->d_name);
                r = add_file(fl, path, name, err);
        }
        closedir(d);
        return r;
}

/* ld.so.conf.d under the root: each line an absolute directory (include
 * lines and globs are left to the directories above). */
static int scan_ld_conf(file_list *fl, hutch_error *err) {
        _cleanup_close_ int dfd = -1;
        DIR *d = opendir_in_root(fl->root_fd, "etc/ld.so.conf.d", &dfd);
        if (!d)
                return 0;
        int r = 0;
        for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                size_t l = strlen(de->d_name);
                if (l < 6 || !streq(de->d_name + l - 5, ".conf"))
                        continue;
                _cleanup_free_ char *text = NULL;
                if (read_file_at(dfd, de->d_name, 16384, &text) < 0)
                        continue;
                for (char *save = NULL, *line = strtok_r(text, "\n", &save); r >= 0 && line;
                     line = strtok_r(NULL, "\n", &save)) {
                        line += strspn(line, " \t");
                        line[strcspn(line, " \t#")] = 0;
                        if (line[0] != '/' || strpbrk(line, "*?[") || strlen(line) > 512)
                                continue;
                        r = scan_lib_dir(fl, line + 1, err);
                }
        }
        closedir(d);
        return r;
}

static int scan_bins(file_list *fl, hutch_error *err) {
        for (const char *const *b = driver_bins; *b; b++)
                for (const char *const *dir = bin_dirs; *dir; dir++) {
                        char rel[PATH_MAX], name[GPU_NAME_MAX];
                        snprintf(rel, sizeof rel, "%s/%s", *dir, *b);
                        snprintf(name, sizeof name, "bin/%s", *b);
                        size_t before = fl->g->n_files;
                        int r = add_file(fl, rel, name, err);
                        if (r < 0)
                                return r;
                        if (fl->g->n_files > before)
                                break;
                }
        return 0;
}

static int scan_driver_files(hutch_ctx *ctx, gpu_child *g, hutch_error *err) {
        _cleanup_close_ int root = open(ctx->gpu_driver_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0)
                return hutch_error_set(err, -errno, "opening the GPU driver root %s: %m",
                                       ctx->gpu_driver_root);
        file_list fl = { .g = g, .root_fd = root };
        int r = 0;
        for (size_t i = 0; r >= 0 && i < 2; i++) /* the loader's own directories first */
                r = scan_lib_dir(&fl, lib_dirs[i], err);
        if (r >= 0)
                r = scan_ld_conf(&fl, err);
        for (size_t i = 2; r >= 0 && lib_dirs[i]; i++)
                r = scan_lib_dir(&fl, lib_dirs[i], err);
        if (r >= 0)
                r = scan_bins(&fl, err);
        return r;
}

/* ---------------------------------------------------- /proc/driver/nvidia */

/* A PCI address as the driver names its gpus/ entries ("0000:3b:00.0"). */
static bool bus_id_valid(const char *s) {
        size_t n = strlen(s);
        return n > 0 && n < 32 && strspn(s, "0123456789abcdefABCDEF:.") == n;
}

static int scan_proc(hutch_ctx *ctx, const gpu_devs *devs, const uint32_t *ids, size_t n_ids,
                     gpu_child *g, hutch_error *err) {
        _cleanup_close_ int pfd = open(ctx->gpu_proc_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (pfd < 0)
                return 0; /* no driver proc dir: /proc/driver stays masked */
        g->proc = true;
        _cleanup_free_ char *params = NULL, *version = NULL;
        if (read_file_at(pfd, "params", sizeof g->params - 64, &params) >= 0) {
                /* the driver's own node creation (nvidia-modprobe, mknod) must
                 * not be tried: the sandbox has its nodes, and may make none */
                size_t o = 0;
                for (char *save = NULL, *line = strtok_r(params, "\n", &save); line;
                     line = strtok_r(NULL, "\n", &save))
                        o += (size_t) snprintf(g->params + o, sizeof g->params - o, "%s\n",
                                               startswith(line, "ModifyDeviceFiles:")
                                                       ? "ModifyDeviceFiles: 0"
                                                       : line);
        }
        if (read_file_at(pfd, "version", sizeof g->version - 1, &version) >= 0)
                snprintf(g->version, sizeof g->version, "%s", version);
        _cleanup_close_ int gfd = openat(pfd, "gpus", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (gfd < 0)
                return 0;
        int dup_fd = dup(gfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return 0;
        }
        int r = 0;
        for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                if (!bus_id_valid(de->d_name) || g->n_proc_gpus == HUTCH_GPUS_MAX)
                        continue;
                char p[64];
                _cleanup_free_ char *info = NULL;
                snprintf(p, sizeof p, "%s/information", de->d_name);
                if (read_file_at(gfd, p, 8192, &info) < 0)
                        continue;
                const char *m = strstr(info, "Device Minor:");
                if (!m)
                        continue;
                unsigned minor_no = (unsigned) strtoul(m + strlen("Device Minor:"), NULL, 10);
                bool mine = false;
                for (size_t k = 0; k < n_ids && !mine; k++)
                        for (size_t i = 0; i < devs->n_gpus; i++)
                                if (devs->ids[i] == ids[k] && minor(devs->gpus[i].rdev) == minor_no)
                                        mine = true;
                if (!mine)
                        continue;
                int fd = sys_open_tree(gfd, de->d_name,
                                       OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
                struct mount_attr attr = { .attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                                   MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC };
                if (fd < 0 ||
                    sys_mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0) {
                        r = hutch_error_set(err, -errno, "binding %s/gpus/%s: %m",
                                            ctx->gpu_proc_dir, de->d_name);
                        safe_close(fd);
                        break;
                }
                g->proc_gpus[g->n_proc_gpus].fd = fd;
                snprintf(g->proc_gpus[g->n_proc_gpus].name, GPU_NAME_MAX, "%s", de->d_name);
                g->n_proc_gpus++;
        }
        closedir(d);
        return r;
}

/* ------------------------------------------------------------- the child */

/* A detached bind of a device node: no setuid, no exec, and devices
 * allowed whatever the dev dir's mount says (an operator's test tree on
 * a nodev file system; /dev itself is devtmpfs). */
static int bind_node(int dfd, const gpu_node *n, int *ret_fd) {
        _cleanup_close_ int fd = openat(dfd, n->name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISCHR(st.st_mode) || st.st_rdev != n->rdev)
                return -ESTALE; /* replaced since the scan */
        _cleanup_close_ int m = sys_open_tree(fd, "",
                                              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        if (m < 0)
                return -errno;
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
                                   .attr_clr = MOUNT_ATTR_NODEV };
        if (sys_mount_setattr(m, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
                return -errno;
        *ret_fd = TAKE_FD(m);
        return 0;
}

gpu_child *gpu_child_free(gpu_child *g) {
        if (!g)
                return NULL;
        for (size_t i = 0; i < g->n_nodes; i++)
                safe_close(g->nodes[i].fd);
        for (size_t i = 0; i < g->n_files; i++)
                safe_close(g->files[i].fd);
        for (size_t i = 0; i < g->n_proc_gpus; i++)
                safe_close(g->proc_gpus[i].fd);
        free(g);
        return NULL;
}

static void gpu_child_freep(gpu_child **g) {
        gpu_child_free(*g);
}

int gpu_child_prepare(hutch_ctx *ctx, const uint32_t *ids, size_t n, gpu_child **ret,
                      char (**ret_rules)[32], size_t *ret_n_rules, hutch_error *err) {
        gpu_devs devs;
        int r = devs_scan(ctx, &devs, err);
        if (r < 0)
                return r;
        _cleanup_(gpu_child_freep) gpu_child *g = calloc(1, sizeof *g);
        _cleanup_free_ char(*rules)[32] = calloc(HUTCH_GPUS_MAX + GPU_CTL_MAX, sizeof *rules);
        if (!g || !rules)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        _cleanup_close_ int dfd = open(ctx->gpu_dev_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", ctx->gpu_dev_dir);
        size_t n_rules = 0;
        for (size_t k = 0; k <= n; k++) {
                /* the GPUs, then every control node the driver has (uvm,
                 * modeset: those the sandbox's users may open) */
                size_t count = k < n ? 1 : devs.n_ctl;
                for (size_t c = 0; c < count; c++) {
                        const gpu_node *node = NULL;
                        if (k < n) {
                                for (size_t i = 0; i < devs.n_gpus; i++)
                                        if (devs.ids[i] == ids[k])
                                                node = &devs.gpus[i];
                                if (!node)
                                        return hutch_error_set(err, -ENODEV, "GPU %u is gone from %s",
                                                               ids[k], ctx->gpu_dev_dir);
                        } else {
                                node = &devs.ctl[c];
                                if (!node_usable(node))
                                        continue;
                        }
                        gpu_mount *m = &g->nodes[g->n_nodes];
                        if ((r = bind_node(dfd, node, &m->fd)) < 0)
                                return hutch_error_set(err, r, "binding %s/%s: %s",
                                                       ctx->gpu_dev_dir, node->name, strerror(-r));
                        snprintf(m->name, sizeof m->name, "%s", node->name);
                        g->n_nodes++;
                        snprintf(rules[n_rules++], 32, "c %u:%u rw", major(node->rdev),
                                 minor(node->rdev));
                }
        }
        if ((r = scan_driver_files(ctx, g, err)) < 0)
                return r;
        if ((r = scan_proc(ctx, &devs, ids, n, g, err)) < 0)
                return r;
        *ret = TAKE_PTR(g);
        *ret_rules = TAKE_PTR(rules);
        *ret_n_rules = n_rules;
        return 0;
}

/* -------------------------------------------------------- the environment */

static int env_append(char **slot, const char *name, const char *dir) {
        const char *v = *slot ? strchr(*slot, '=') + 1 : NULL;
        if (v) {
                /* already there: leave it where the caller put it */
                size_t l = strlen(dir);
                for (const char *p = v; (p = strstr(p, dir)); p += l)
                        if ((p == v || p[-1] == ':') && (p[l] == 0 || p[l] == ':'))
                                return 0;
        }
        char *s = NULL;
        if (asprintf(&s, "%s=%s%s%s", name, v ? v : "", v && *v ? ":" : "", dir) < 0)
                return -ENOMEM;
        free(*slot);
        *slot = s;
        return 0;
}

char **gpu_env(const char *const *envp) {
        size_t n = 0;
        while (envp && envp[n])
                n++;
        char **v = calloc(n + 3, sizeof *v);
        if (!v)
                return NULL;
        char **path = NULL, **ld = NULL;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
                if (!(v[k] = strdup(envp[i])))
                        goto fail;
                if (startswith(v[k], "PATH="))
                        path = &v[k];
                else if (startswith(v[k], "LD_LIBRARY_PATH="))
                        ld = &v[k];
                k++;
        }
        if (!ld)
                ld = &v[k++];
        if (!path)
                path = &v[k++];
        /* appended: what the caller (an image's own CUDA compat libraries)
         * put first still wins; the loader's defaults come after them */
        if (env_append(ld, "LD_LIBRARY_PATH", HUTCH_GPU_DIR "/lib") < 0 ||
            env_append(path, "PATH", HUTCH_GPU_DIR "/bin") < 0)
                goto fail;
        return v;
fail:
        for (size_t i = 0; i < n + 2; i++)
                free(v[i]);
        free(v);
        return NULL;
}

/* --------------------------------------------------------------- NVML */

/* The parts of nvml.h used here (stable ABI, versioned symbols). */
typedef int nvml_ret;
typedef void *nvml_device;
typedef struct nvml_process {
        unsigned int pid;
        unsigned long long used_gpu_memory; /* ~0ULL: not available */
        unsigned int gpu_instance_id, compute_instance_id;
} nvml_process; /* nvmlProcessInfo_t (v2) */
#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)

struct gpu_nvml {
        void *dl;
        bool ok;
        nvml_ret (*init)(void);
        nvml_ret (*shutdown)(void);
        nvml_ret (*count)(unsigned int *);
        nvml_ret (*by_index)(unsigned int, nvml_device *);
        nvml_ret (*minor_number)(nvml_device, unsigned int *);
        nvml_ret (*procs)(nvml_device, unsigned int *, nvml_process *);
};

/* libnvidia-ml.so.1 of the driver root, once; NULL when absent. */
static struct gpu_nvml *nvml_get(hutch_ctx *ctx) {
        if (ctx->nvml)
                return ctx->nvml->ok ? ctx->nvml : NULL;
        struct gpu_nvml *n = calloc(1, sizeof *n);
        if (!n)
                return NULL;
        ctx->nvml = n;
        _cleanup_close_ int root = open(ctx->gpu_driver_root, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0)
                return NULL;
        for (size_t i = 0; lib_dirs[i] && !n->dl; i++) {
                char rel[PATH_MAX], path[64];
                snprintf(rel, sizeof rel, "%s/libnvidia-ml.so.1", lib_dirs[i]);
                struct open_how how = { .flags = O_RDONLY | O_CLOEXEC,
                                        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
                _cleanup_close_ int fd = sys_openat2(root, rel, &how, sizeof how);
                if (fd < 0)
                        continue;
                snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
                n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
        if (!n->dl)
                return NULL;
        n->init = (nvml_ret(*)(void)) dlsym(n->dl, "nvmlInit_v2");
        n->shutdown = (nvml_ret(*)(void)) dlsym(n->dl, "nvmlShutdown");
        n->count = (nvml_ret(*)(unsigned int *)) dlsym(n->dl, "nvmlDeviceGetCount_v2");
        n->by_index = (nvml_ret(*)(unsigned int, nvml_device *)) dlsym(
                n->dl, "nvmlDeviceGetHandleByIndex_v2");
        n->minor_number = (nvml_ret(*)(nvml_device, unsigned int *)) dlsym(
                n->dl, "nvmlDeviceGetMinorNumber");
        n->procs = (nvml_ret(*)(nvml_device, unsigned int *, nvml_process *)) dlsym(
                n->dl, "nvmlDeviceGetComputeRunningProcesses_v3");
        if (!n->procs)
                n->procs = (nvml_ret(*)(nvml_device, unsigned int *, nvml_process *)) dlsym(
                        n->dl, "nvmlDeviceGetComputeRunningProcesses_v2");
        n->ok = n->init && n->shutdown && n->count && n->by_index && n->minor_number && n->procs &&
                n->init() == NVML_SUCCESS;
        return n->ok ? n : NULL;
}

void gpu_nvml_free(hutch_ctx *ctx) {
        struct gpu_nvml *n = ctx->nvml;
        if (!n)
                return;
        if (n->ok)
                (void) n->shutdown();
        if (n->dl)
                dlclose(n->dl);
        free(n);
        ctx->nvml = NULL;
}

int gpu_memory_used(hutch_sandbox *sb, uint64_t *ret) {
        struct gpu_nvml *n = nvml_get(sb->ctx);
        if (!n || !sb->cg)
                return -ENODEV;
        _cleanup_free_ pid_t *pids = NULL;
        size_t n_pids = 0;
        if (cgroup_list_pids(sb->cg, &pids, &n_pids, NULL) < 0)
                return -ENODEV;
        unsigned int count = 0;
        if (n->count(&count) != NVML_SUCCESS)
                return -ENODEV;
        uint64_t sum = 0;
        size_t seen = 0;
        for (unsigned int i = 0; i < count; i++) {
                nvml_device dev;
                unsigned int minor_no;
                if (n->by_index(i, &dev) != NVML_SUCCESS ||
                    n->minor_number(dev, &minor_no) != NVML_SUCCESS)
                        continue;
                bool mine = false;
                for (size_t k = 0; k < sb->n_gpus; k++)
                        mine |= sb->gpu_ids[k] == minor_no;
                if (!mine)
                        continue;
                nvml_process procs[256];
                unsigned int np = ELEMENTSOF(procs);
                if (n->procs(dev, &np, procs) != NVML_SUCCESS)
                        return -ENODEV; /* more than 256 processes on one GPU: not measured, never guessed */
                seen++;
                for (unsigned int p = 0; p < np && p < ELEMENTSOF(procs); p++) {
                        bool in = false;
                        for (size_t q = 0; q < n_pids && !in; q++)
                                in = (unsigned int) pids[q] == procs[p].pid;
                        if (!in)
                                continue;
                        if (procs[p].used_gpu_memory == NVML_VALUE_NOT_AVAILABLE)
                                return -ENODEV;
                        sum += procs[p].used_gpu_memory;
                }
        }
        if (seen != sb->n_gpus)
                return -ENODEV; /* NVML does not know one of its GPUs */
        *ret = sum;
        return 0;
}

/* ------------------------------------------------------------- doctor */

int hutch_gpu_probe(hutch_ctx *ctx, char *ret_info, size_t n, hutch_error *err) {
        gpu_devs devs;
        int r = devs_scan(ctx, &devs, err);
        if (r < 0)
                return r;
        if (devs.n_gpus == 0)
                return hutch_error_set(err, -ENODEV, "no NVIDIA GPU (no %s/nvidia0, ...)",
                                       ctx->gpu_dev_dir);
        _cleanup_(gpu_child_freep) gpu_child *g = calloc(1, sizeof *g);
        if (!g)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        hutch_error e = { 0 };
        r = scan_driver_files(ctx, g, &e);
        size_t libs = 0, bins = 0;
        for (size_t i = 0; i < g->n_files; i++)
                *(startswith(g->files[i].name, "bin/") ? &bins : &libs) += 1;
        char gpus[256] = "";
        for (size_t i = 0, o = 0; i < devs.n_gpus && o < sizeof gpus; i++)
                o += (size_t) snprintf(gpus + o, sizeof gpus - o, "%s%u", i ? "," : "", devs.ids[i]);
        snprintf(ret_info, n,
                 "%zu GPU%s (ids %s), %s; %zu driver librar%s, %zu program%s under %s%s%s; NVML %s; sharing %s",
                 devs.n_gpus, devs.n_gpus == 1 ? "" : "s", gpus,
                 devs.have_ctl ? "nvidiactl" : "NO nvidiactl", libs + g->n_links,
                 libs + g->n_links == 1 ? "y" : "ies", bins, bins == 1 ? "" : "s",
                 ctx->gpu_driver_root, r < 0 ? ": " : "", r < 0 ? e.msg : "",
                 nvml_get(ctx) ? "loads" : "not loaded", ctx->gpu_share ? "on" : "off");
        if (!devs.have_ctl)
                return hutch_error_set(err, -ENODEV, "%s", ret_info);
        return (int) devs.n_gpus;
}
