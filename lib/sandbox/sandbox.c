/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine: what a sandbox has whatever backend isolates it. Create
 * (allocate the id, state dir, uid range and cgroup, then the backend's
 * create op starts init), attach by id, destroy (kill, remove every trace),
 * and the context that holds what is shared between sandboxes (cgroup
 * layout, storage, the sealed hutch-init memfd). The backends (backend-ns.c,
 * gvisor.c) are reached only through their operations tables.
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "sandbox/sandbox-internal.h"
#include "template/template.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

extern const unsigned char hutch_init_start[];
extern const unsigned char hutch_init_end[];

/* ------------------------------------------------------------------- context */

static char *dup_or(const char *v, const char *env, const char *def) {
        const char *e = env ? getenv(env) : NULL;
        return strdup(v && *v ? v : e && *e ? e : def);
}

int hutch_ctx_new(const hutch_ctx_config *cfg, hutch_ctx **ret_ctx, hutch_error *err) {
        hutch_ctx_config none = { 0 };
        if (!cfg)
                cfg = &none;
        hutch_ctx *ctx = calloc(1, sizeof *ctx);
        if (!ctx)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        ctx->init_memfd = -1;
        ctx->run_dir = dup_or(cfg->run_dir, "HUTCH_RUN_DIR", "/run/hutch");
        ctx->data_dir = dup_or(cfg->data_dir, "HUTCH_DATA_DIR", "/var/lib/hutch");
        ctx->cgroup_root = dup_or(cfg->cgroup_root, "HUTCH_CGROUP_ROOT", "hutch");
        ctx->storage_kind = dup_or(cfg->storage, "HUTCH_STORAGE", "auto");
        ctx->runsc = dup_or(cfg->runsc, "HUTCH_RUNSC", "");
        ctx->gvisor_platform = dup_or(cfg->gvisor_platform, "HUTCH_GVISOR_PLATFORM", "ptrace");
        ctx->gpu_dev_dir = dup_or(cfg->gpu_dev_dir, "HUTCH_GPU_DEV_DIR", "/dev");
        ctx->gpu_driver_root = dup_or(cfg->gpu_driver_root, "HUTCH_GPU_DRIVER_ROOT", "/");
        ctx->gpu_proc_dir = dup_or(cfg->gpu_proc_dir, "HUTCH_GPU_PROC_DIR", "/proc/driver/nvidia");
        {
                const char *share = getenv("HUTCH_GPU_SHARE");
                ctx->gpu_share = cfg->gpu_share > 0 || (cfg->gpu_share == 0 && share && streq(share, "1"));
        }
        ctx->trash_dir = cfg->trash_dir ? strdup(cfg->trash_dir) : NULL;
        ctx->uid_base = cfg->uid_base ? cfg->uid_base : 0x40000000u;
        ctx->uid_slots = cfg->uid_slots ? cfg->uid_slots : 4096;
        int r;
        if (!ctx->run_dir || !ctx->data_dir || !ctx->cgroup_root || !ctx->storage_kind || !ctx->runsc ||
            !ctx->gvisor_platform || !ctx->gpu_dev_dir || !ctx->gpu_driver_root || !ctx->gpu_proc_dir ||
            (cfg->trash_dir && !ctx->trash_dir)) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto fail;
        }
        if (ctx->run_dir[0] != '/' || ctx->data_dir[0] != '/' || strlen(ctx->run_dir) > 1024 ||
            strlen(ctx->data_dir) > 1024) {
                r = hutch_error_set(err, -EINVAL, "run and data directories must be absolute paths of at most 1024 bytes");
                goto fail;
        }
        if (!streq(ctx->storage_kind, "auto") && !streq(ctx->storage_kind, "ext4") && !streq(ctx->storage_kind, "tmpfs")) {
                r = hutch_error_set(err, -EINVAL, "storage must be auto, ext4 or tmpfs, not '%s'", ctx->storage_kind);
                goto fail;
        }
        if (!streq(ctx->gvisor_platform, "ptrace") && !streq(ctx->gvisor_platform, "systrap") &&
            !streq(ctx->gvisor_platform, "kvm")) {
                r = hutch_error_set(err, -EINVAL, "gvisor platform must be ptrace, systrap or kvm, not '%s'",
                                    ctx->gvisor_platform);
                goto fail;
        }
        if (ctx->gpu_dev_dir[0] != '/' || ctx->gpu_driver_root[0] != '/' || ctx->gpu_proc_dir[0] != '/' ||
            strlen(ctx->gpu_dev_dir) > 1024 || strlen(ctx->gpu_driver_root) > 1024 || strlen(ctx->gpu_proc_dir) > 1024) {
                r = hutch_error_set(err, -EINVAL, "the GPU device dir, driver root and proc dir must be absolute paths");
                goto fail;
        }
        if (*ctx->runsc && (ctx->runsc[0] != '/' || strlen(ctx->runsc) > 1024)) {
                r = hutch_error_set(err, -EINVAL, "runsc must be an absolute path, not '%s'", ctx->runsc);
                goto fail;
        }
        /* The uid ranges must stay clear of host uid 0 and of (uid_t)-1. */
        if (ctx->uid_base < HUTCH_IDMAP_SIZE ||
            (uint64_t) ctx->uid_base + (uint64_t) ctx->uid_slots * HUTCH_IDMAP_SIZE > 0xFFFFFFFEull) {
                r = hutch_error_set(err, -EINVAL, "uid range %u + %u x 65536 is not valid", ctx->uid_base, ctx->uid_slots);
                goto fail;
        }
        r = cgroup_detect(getenv("HUTCH_CGROUP"), &ctx->cg_version, &ctx->cg_mount, err);
        if (r < 0)
                goto fail;
        *ret_ctx = ctx;
        return 0;
fail:
        hutch_ctx_free(ctx);
        return r;
}

hutch_ctx *hutch_ctx_free(hutch_ctx *ctx) {
        if (!ctx)
                return NULL;
        free(ctx->run_dir);
        free(ctx->data_dir);
        free(ctx->cgroup_root);
        free(ctx->cg_mount);
        free(ctx->storage_kind);
        free(ctx->storage_mnt);
        free(ctx->runsc);
        free(ctx->gvisor_platform);
        free(ctx->gpu_dev_dir);
        free(ctx->gpu_driver_root);
        free(ctx->gpu_proc_dir);
        free(ctx->trash_dir);
        gpu_nvml_free(ctx);
        safe_close(ctx->init_memfd);
        free(ctx);
        return NULL;
}

const char *hutch_ctx_cgroup_backend(const hutch_ctx *ctx) {
        return ctx->cg_version == CGROUP_V2 ? "v2" : "v1";
}

const char *hutch_ctx_storage_backend(const hutch_ctx *ctx) {
        return ctx->storage_kind;
}

int sandbox_storage_ensure(hutch_ctx *ctx, hutch_error *err) {
        if (ctx->storage_mnt)
                return 0;
        return storage_init(ctx, err);
}

/* hutch-init's bytes in a sealed memfd: executing it never touches a host
 * file a sandbox could reach or replace (CVE-2019-5736). */
int sandbox_init_memfd(hutch_ctx *ctx, hutch_error *err) {
        if (ctx->init_memfd >= 0)
                return ctx->init_memfd;
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif
        int fd = sys_memfd_create("hutch-init", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
        if (fd < 0 && errno == EINVAL)
                fd = sys_memfd_create("hutch-init", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return hutch_error_set(err, -errno, "memfd_create: %m");
        size_t len = (size_t) (hutch_init_end - hutch_init_start);
        int r = fd_write_all(fd, hutch_init_start, len);
        if (r < 0) {
                close(fd);
                return hutch_error_set(err, r, "writing hutch-init to its memfd: %s", strerror(-r));
        }
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
                r = -errno;
                close(fd);
                return hutch_error_set(err, r, "sealing the hutch-init memfd: %s", strerror(-r));
        }
        ctx->init_memfd = fd;
        return fd;
}

/* ------------------------------------------------------------------ helpers */

int sandbox_validate_id(const char *id) {
        if (!id || strlen(id) != HUTCH_ID_LEN)
                return -EINVAL;
        for (const char *p = id; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
                        return -EINVAL;
        return 0;
}

int sandbox_dir_path(hutch_ctx *ctx, const char *id, char **ret) {
        return asprintf(ret, "%s/sandboxes/%s", ctx->run_dir, id) < 0 ? -ENOMEM : 0;
}

int sandbox_busy_take(hutch_sandbox *sb, bool wait) {
        if (sb->busy_fd >= 0)
                return 0; /* this handle holds it already: flock would wait for itself */
        int fd = lock_open(AT_FDCWD, sb->dir, O_RDONLY | O_DIRECTORY, wait);
        if (fd < 0)
                return fd;
        sb->busy_fd = fd;
        return 0;
}

void sandbox_busy_release(hutch_sandbox *sb) {
        if (sb->busy_fd < 0)
                return;
        (void) flock(sb->busy_fd, LOCK_UN);
        sb->busy_fd = safe_close(sb->busy_fd);
}

int hutch_sandbox_id_new(char out[HUTCH_ID_LEN + 1]) {
        static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
        size_t i = 0;
        while (i < HUTCH_ID_LEN) {
                unsigned char buf[32];
                if (getrandom(buf, sizeof buf, 0) != sizeof buf)
                        return -errno;
                for (size_t k = 0; k < sizeof buf && i < HUTCH_ID_LEN; k++)
                        if (buf[k] < 252) /* 252 = 7 * 36: no modulo bias */
                                out[i++] = alphabet[buf[k] % 36];
        }
        out[HUTCH_ID_LEN] = 0;
        return 0;
}

static int random_token(char out[HUTCH_TOKEN_LEN + 1]) {
        unsigned char buf[HUTCH_TOKEN_LEN / 2];
        if (getrandom(buf, sizeof buf, 0) != sizeof buf)
                return -errno;
        for (size_t i = 0; i < sizeof buf; i++)
                snprintf(out + 2 * i, 3, "%02x", buf[i]);
        return 0;
}


/* Field 22 of /proc/<pid>/stat: start time, to tell a pid from its reuse. */
int sandbox_proc_starttime(pid_t pid, uint64_t *ret) {
        char path[64];
        _cleanup_free_ char *buf = NULL;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int r = read_file_at(AT_FDCWD, path, 4096, &buf);
        if (r < 0)
                return r;
        char *p = strrchr(buf, ')');
        if (!p)
                return -EIO;
        p++;
        /* a zombie is gone for us: its parent (a killed `hutch run`) may be
         * an init that reaps late or never */
        if (p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X'))
                return -ESRCH;
        for (int field = 3; field < 22; field++) {
                p = strchr(p + 1, ' ');
                if (!p)
                        return -EIO;
        }
        *ret = strtoull(p + 1, NULL, 10);
        return 0;
}

bool sandbox_init_gone(hutch_ctx *ctx, const char *id) {
        char path[PATH_MAX];
        _cleanup_free_ char *buf = NULL;
        snprintf(path, sizeof path, "%s/sandboxes/%s/state", ctx->run_dir, id);
        if (read_file_at(AT_FDCWD, path, 16384, &buf) < 0)
                return false; /* being created (or damaged): not known to be gone */
        long pid = 0;
        uint64_t want = 0, start;
        bool suspended = false;
        for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (startswith(line, "init_pid="))
                        pid = strtol(line + strlen("init_pid="), NULL, 10);
                else if (startswith(line, "init_starttime="))
                        want = strtoull(line + strlen("init_starttime="), NULL, 10);
                else if (streq(line, "suspended=1"))
                        suspended = true;
        }
        if (suspended || pid <= 1 || want == 0)
                return false;
        return sandbox_proc_starttime((pid_t) pid, &start) < 0 || start != want;
}

/* Sends to init never block for long: a paused or wedged init that stops
 * reading fails the call instead of hanging the caller. */
void sandbox_conn_set_timeouts(int fd) {
        struct timeval tv = { .tv_sec = 30 };
        (void) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static void limits_fill_defaults(hutch_limits *l) {
        if (!l->memory_bytes)
                l->memory_bytes = HUTCH_DEFAULT_MEMORY;
        if (!l->pids)
                l->pids = HUTCH_DEFAULT_PIDS;
        if (!l->cpu_millis)
                l->cpu_millis = HUTCH_DEFAULT_CPU_MILLIS;
        if (!l->disk_bytes)
                l->disk_bytes = HUTCH_DEFAULT_DISK;
        if (!l->disk_inodes)
                l->disk_inodes = HUTCH_DEFAULT_INODES;
        if (!l->nofile)
                l->nofile = HUTCH_DEFAULT_NOFILE;
}

static hutch_sandbox *sandbox_new(hutch_ctx *ctx) {
        hutch_sandbox *sb = calloc(1, sizeof *sb);
        if (!sb)
                return NULL;
        sb->n_ref = 1;
        sb->ctx = ctx;
        sb->conn = -1;
        sb->init_pidfd = -1;
        sb->busy_fd = -1;
        sb->ops = &backend_ns; /* until a state file or a create says otherwise */
        sb->uid_slot = UINT32_MAX;
        sb->next_id = 1;
        for (size_t i = 0; i < HUTCH_VOLUMES_MAX; i++)
                sb->vol_loop[i] = -1;
        sb->rxbuf = malloc(INITPROTO_MAX_FRAME);
        sb->tx = malloc(sizeof *sb->tx);
        if (!sb->rxbuf || !sb->tx) {
                free(sb->rxbuf);
                free(sb->tx);
                free(sb);
                return NULL;
        }
        return sb;
}

/* ------------------------------------------------------------- state file */

int sandbox_state_write(hutch_sandbox *sb, hutch_error *err) {
        char path[PATH_MAX], buf[2600 + PATH_MAX + HUTCH_GPUS_MAX * 4], gpus[HUTCH_GPUS_MAX * 4 + 1] = "";
        for (size_t i = 0, o = 0; i < sb->n_gpus; i++)
                o += (size_t) snprintf(gpus + o, sizeof gpus - o, "%s%u", i ? "," : "", sb->gpu_ids[i]);
        snprintf(path, sizeof path, "%s/state", sb->dir);
        /* template_root: which version of the template its root (ns: the
         * overlay's lower layer; gvisor: runsc's root) is, so that
         * hutch_template_gc() keeps it while the sandbox lives */
        int n = snprintf(buf, sizeof buf,
                         "id=%s\ntemplate=%s\ntemplate_root=%s\ninit_pid=%d\ninit_starttime=%" PRIu64 "\nuid_slot=%u\nuid_base=%u\n"
                         "token=%s\ncreated_ns=%" PRId64 "\nmemory=%" PRIu64 "\npids=%" PRIu64 "\ncpu_millis=%" PRIu64
                         "\ndisk=%" PRIu64 "\ninodes=%" PRIu64 "\nnofile=%" PRIu64 "\nno_new_privs=%d\ncgroup=%s\n"
                         "cgroup_mount=%s\nbackend=%s\negress_port=%u\nsuspended=%d\nowner=%s\ngpus=%s\n",
                         sb->id, sb->template_name, sb->template_root ? sb->template_root : "", sb->init_pid, sb->init_starttime, sb->uid_slot,
                         (unsigned) sb->uid_base, sb->token, sb->created_ns, sb->limits.memory_bytes, sb->limits.pids,
                         sb->limits.cpu_millis, sb->limits.disk_bytes, sb->limits.disk_inodes, sb->limits.nofile,
                         sb->no_new_privs, sb->cg_version == CGROUP_V2 ? "v2" : "v1", sb->cg_mount,
                         hutch_backend_name(sb->backend), (unsigned) sb->egress_port, sb->suspended, sb->owner, gpus);
        int r = write_file_atomic(path, buf, (size_t) n, 0600);
        if (r < 0)
                return hutch_error_set(err, r, "writing %s: %s", path, strerror(-r));
        return 0;
}

static int state_read(hutch_sandbox *sb, hutch_error *err) {
        char path[PATH_MAX];
        _cleanup_free_ char *buf = NULL;
        snprintf(path, sizeof path, "%s/state", sb->dir);
        int r = read_file_at(AT_FDCWD, path, 4096, &buf);
        if (r < 0)
                return hutch_error_set(err, r == -ENOENT ? -ENOENT : r, "sandbox %s: no state (%s)", sb->id, strerror(-r));
        bool have_pid = false;
        for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char *eq = strchr(line, '=');
                if (!eq)
                        continue;
                *eq = 0;
                const char *k = line, *v = eq + 1;
                if (streq(k, "template"))
                        snprintf(sb->template_name, sizeof sb->template_name, "%s", v);
                else if (streq(k, "template_root") && *v && !sb->template_root)
                        sb->template_root = strdup(v); /* best effort: written back as read */
                else if (streq(k, "init_pid")) {
                        sb->init_pid = (pid_t) strtol(v, NULL, 10);
                        have_pid = sb->init_pid > 1;
                } else if (streq(k, "init_starttime"))
                        sb->init_starttime = strtoull(v, NULL, 10);
                else if (streq(k, "uid_slot"))
                        sb->uid_slot = (uint32_t) strtoul(v, NULL, 10);
                else if (streq(k, "uid_base"))
                        sb->uid_base = (uid_t) strtoul(v, NULL, 10);
                else if (streq(k, "token"))
                        snprintf(sb->token, sizeof sb->token, "%s", v);
                else if (streq(k, "created_ns"))
                        sb->created_ns = strtoll(v, NULL, 10);
                else if (streq(k, "memory"))
                        sb->limits.memory_bytes = strtoull(v, NULL, 10);
                else if (streq(k, "pids"))
                        sb->limits.pids = strtoull(v, NULL, 10);
                else if (streq(k, "cpu_millis"))
                        sb->limits.cpu_millis = strtoull(v, NULL, 10);
                else if (streq(k, "disk"))
                        sb->limits.disk_bytes = strtoull(v, NULL, 10);
                else if (streq(k, "inodes"))
                        sb->limits.disk_inodes = strtoull(v, NULL, 10);
                else if (streq(k, "nofile"))
                        sb->limits.nofile = strtoull(v, NULL, 10);
                else if (streq(k, "no_new_privs"))
                        sb->no_new_privs = streq(v, "1");
                else if (streq(k, "cgroup"))
                        sb->cg_version = streq(v, "v2") ? CGROUP_V2 : CGROUP_V1;
                else if (streq(k, "cgroup_mount"))
                        snprintf(sb->cg_mount, sizeof sb->cg_mount, "%s", v);
                else if (streq(k, "egress_port"))
                        sb->egress_port = (uint16_t) strtoul(v, NULL, 10);
                else if (streq(k, "backend")) {
                        int b = hutch_backend_from_name(v);
                        sb->backend = b >= 0 ? b : HUTCH_BACKEND_NS;
                } else if (streq(k, "suspended"))
                        sb->suspended = streq(v, "1");
                else if (streq(k, "owner"))
                        snprintf(sb->owner, sizeof sb->owner, "%s", v);
                else if (streq(k, "gpus"))
                        for (char *save2 = NULL, *g = strtok_r((char *) v, ",", &save2); g && sb->n_gpus < HUTCH_GPUS_MAX;
                             g = strtok_r(NULL, ",", &save2))
                                sb->gpu_ids[sb->n_gpus++] = (uint32_t) strtoul(g, NULL, 10);
        }
        sb->ops = backend_ops(sb->backend);
        /* a suspended sandbox has no init until it is restored */
        if (sb->suspended && sb->ops->resume) {
                sb->init_pid = 0;
                have_pid = true;
        }
        if (!have_pid || sb->uid_slot >= sb->ctx->uid_slots)
                return hutch_error_set(err, -EBADMSG, "sandbox %s: state file is damaged", sb->id);
        return 0;
}

/* ------------------------------------------------------------- teardown */

/* Remove everything a sandbox owns. Safe on a half-created sandbox. */
static int sandbox_teardown(hutch_sandbox *sb, hutch_error *err) {
        hutch_ctx *ctx = sb->ctx;
        int r = 0, k;
        hutch_error e = { 0 };

        sb->conn = safe_close(sb->conn);
        /* PID 1 dying takes the whole pid namespace with it (the kernel
         * kills and reaps every member before init's exit completes), so
         * waiting for init is waiting for all of them. The cgroup kill then
         * only has work when something is left, e.g. init was already gone. */
        bool init_reaped = false;
        if (sb->ops->stop && sb->init_pidfd >= 0) {
                /* gvisor: runsc first, so that the relay reaps its orphans;
                 * it then exits by itself */
                (void) sb->ops->stop(sb);
                struct pollfd p = { .fd = sb->init_pidfd, .events = POLLIN };
                (void) poll(&p, 1, 5000);
        }
        /* ESRCH: already dead (hutch_sandbox_kill_begin ran first): still
         * wait for the pidfd and reap it below */
        if (sb->init_pidfd >= 0 &&
            (sys_pidfd_send_signal(sb->init_pidfd, SIGKILL, NULL, 0) == 0 || errno == ESRCH)) {
                /* A frozen (paused) task does not die of SIGKILL until thawed. */
                if (sb->cg && cgroup_is_frozen(sb->cg) == 1 && cgroup_thaw(sb->cg, NULL) >= 0)
                        sb->frozen = false;
                struct pollfd p = { .fd = sb->init_pidfd, .events = POLLIN };
                int k2;
                do
                        k2 = poll(&p, 1, 10000);
                while (k2 < 0 && errno == EINTR);
                init_reaped = k2 == 1;
                if (init_reaped && sb->is_parent)
                        (void) waitpid(sb->init_pid, NULL, 0);
        }
        if (sb->cg && (!init_reaped || cgroup_count_procs(sb->cg) != 0)) {
                k = cgroup_kill_all(sb->cg, &e);
                if (k < 0 || cgroup_count_procs(sb->cg) != 0) {
                        /* Something of this sandbox may still run: keep its
                         * state and uid range reserved for a later gc/kill, so
                         * the range is never handed to another sandbox. */
                        sb->conn = safe_close(sb->conn);
                        return hutch_error_set(err, k < 0 ? k : -EBUSY, "sandbox %s: processes survived the kill: %s",
                                               sb->id, k < 0 ? e.msg : "still in the cgroup");
                }
        }
        if (sb->is_parent && !init_reaped && sb->init_pid > 0)
                (void) waitpid(sb->init_pid, NULL, WNOHANG);
        sb->init_pidfd = safe_close(sb->init_pidfd);
        if (sb->ops->release)
                sb->ops->release(sb);
        /* not before the create gave it an id: a backend's files outside
         * the dir are found by it (gvisor: an empty id's scratch path is
         * DATA_DIR/gvisor/ itself, every sandbox's) */
        if (sb->ops->remove && sb->id[0] && (k = sb->ops->remove(sb, &e)) < 0 && r == 0)
                r = hutch_error_set(err, k, "%s", e.msg);
        if (ctx->storage_mnt) {
                k = storage_remove(ctx, sb->id, &e);
                if (k < 0 && r == 0)
                        r = hutch_error_set(err, k, "%s", e.msg);
        }
        if (sb->cg) {
                k = cgroup_destroy(sb->cg, &e);
                if (k < 0 && r == 0)
                        r = hutch_error_set(err, k, "%s", e.msg);
                cgroup_free(sb->cg);
                sb->cg = NULL;
        }
        if (sb->dir) {
                char parent[PATH_MAX];
                snprintf(parent, sizeof parent, "%s/sandboxes", ctx->run_dir);
                _cleanup_close_ int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                k = pfd < 0 ? -errno : rm_rf_at(pfd, sb->id);
                if (k < 0 && r == 0)
                        r = hutch_error_set(err, k, "removing %s: %s", sb->dir, strerror(-k));
        }
        /* The GPUs, once every process that could hold them is gone (the
         * cgroup is empty): by the sandbox's id, whatever its state says,
         * unless this handle created the sandbox without asking for any
         * (then nothing was reserved, and the shared lock is not taken) */
        if (!sb->gpus_unasked)
                gpu_release(ctx, sb->id);
        sb->n_gpus = 0;
        /* Last: the uid range may only be reused once nothing of ours is left. */
        if (sb->uid_slot != UINT32_MAX) {
                (void) uidrange_release(ctx, sb->uid_slot, sb->id);
                sb->uid_slot = UINT32_MAX;
        }
        sb->destroyed = true;
        return r;
}

/* --------------------------------------------------------------- create */

/* The mounts a create asks for: known ids, paths a sandbox may have, none
 * twice and none inside another. */
static int volumes_check(const hutch_sandbox_config *cfg, hutch_error *err) {
        if (cfg->n_volumes == 0)
                return 0;
        if (cfg->n_volumes > HUTCH_VOLUMES_MAX || !cfg->volumes)
                return hutch_error_set(err, -E2BIG, "at most %d volume mounts per sandbox",
                                       HUTCH_VOLUMES_MAX);
        for (size_t i = 0; i < cfg->n_volumes; i++) {
                const hutch_volume_mount *v = &cfg->volumes[i];
                if (!hutch_volume_id_valid(v->volume))
                        return hutch_error_set(err, -EINVAL, "invalid volume id '%s'", v->volume ? v->volume : "");
                const char *why = hutch_volume_path_check(v->path);
                if (why)
                        return hutch_error_set(err, -EINVAL, "volume mount path '%s': %s", v->path ? v->path : "", why);
                for (size_t j = 0; j < i; j++) {
                        const char *a = cfg->volumes[j].path, *b = v->path;
                        size_t la = strlen(a), lb = strlen(b);
                        if (streq(a, b))
                                return hutch_error_set(err, -EINVAL, "path '%s' is already used", b);
                        if ((la < lb && strncmp(a, b, la) == 0 && b[la] == '/') ||
                            (lb < la && strncmp(a, b, lb) == 0 && a[lb] == '/'))
                                return hutch_error_set(err, -EINVAL, "volume mount paths '%s' and '%s' are nested", a,
                                                       b);
                }
        }
        return 0;
}


/* ------------------------------------------------------ template versions */

static int users_add_root(template_users *u, const char *root) {
        char **v = reallocarray(u->roots, u->n_roots + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        u->roots = v;
        if (!(v[u->n_roots] = strdup(root)))
                return -ENOMEM;
        u->n_roots++;
        return 0;
}

static int users_add_unknown(template_users *u, int64_t created_ns) {
        int64_t *v = reallocarray(u->unknown_created_ns, u->n_unknown + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        u->unknown_created_ns = v;
        v[u->n_unknown++] = created_ns;
        return 0;
}

/* Which template versions the sandboxes of the run dir use, from their
 * state files. Every hutch sharing the run dir is seen, whatever its data
 * dir: another data dir's roots never match ours. A directory without a
 * state file is a create under way (or one that died, until `hutch gc`):
 * this hutch's creates hold their version locked, but an older hutch's do
 * not, so it keeps every version built before the directory changed last. */
static int template_users_scan(void *arg, template_users *ret, hutch_error *err) {
        hutch_ctx *ctx = arg;
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/sandboxes", ctx->run_dir);
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return errno == ENOENT ? 0 : hutch_error_set(err, -errno, "opening %s: %m", dir);
        int dup_fd = dup(dfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return hutch_error_set(err, -errno, "reading %s: %m", dir);
        }
        template_users u = { 0 };
        int r = 0;
        for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                if (de->d_name[0] == '.')
                        continue;
                char p[NAME_MAX + 16];
                snprintf(p, sizeof p, "%s/state", de->d_name);
                _cleanup_free_ char *buf = NULL;
                if (read_file_at(dfd, p, 16384, &buf) < 0) {
                        struct stat st;
                        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
                                r = users_add_unknown(&u, (int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
                        continue;
                }
                const char *root = NULL;
                int64_t created = 0;
                for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                        if (startswith(line, "template_root="))
                                root = line + strlen("template_root=");
                        else if (startswith(line, "created_ns="))
                                created = strtoll(line + strlen("created_ns="), NULL, 10);
                }
                if (root && *root)
                        r = users_add_root(&u, root);
                else /* written before template_root= existed: every older version may be its */
                        r = users_add_unknown(&u, created > 0 ? created : INT64_MAX);
        }
        closedir(d);
        if (r < 0) {
                template_users_clear(&u);
                return hutch_error_set(err, r, "out of memory");
        }
        *ret = u;
        return 0;
}

int hutch_template_gc(hutch_ctx *ctx, hutch_error *err) {
        return template_gc(ctx->data_dir, template_users_scan, ctx, false, err);
}

/* The create is complete and its state names its template version: let go
 * of the version; after a rebuild, remove the versions nothing uses any more
 * (best effort: the daemon's housekeeping and `hutch gc` do it too). */
static void create_done(hutch_ctx *ctx, hutch_template *tpl) {
        bool rebuilt = tpl->rebuilt;
        template_free(tpl);
        if (rebuilt) {
                hutch_error e = { 0 };
                (void) hutch_template_gc(ctx, &e);
        }
}

/* The config's limits, hostname and owner into sb, refused when out of
 * range; the backend's refusals and the volumes' and GPUs' checks. */
static int create_check(hutch_sandbox *sb, const hutch_sandbox_config *cfg, bool *ret_want_gpus,
                        hutch_error *err) {
        sb->limits = cfg->limits;
        limits_fill_defaults(&sb->limits);
        sb->no_new_privs = cfg->no_new_privs;
        /* one line of the state file: printable bytes only */
        if (cfg->owner) {
                size_t i = 0;
                for (const char *o = cfg->owner; *o && i + 1 < sizeof sb->owner; o++)
                        sb->owner[i++] = (*o >= 0x20 && *o < 0x7f) ? *o : '?';
                sb->owner[i] = 0;
        }
        const char *hostname = cfg->hostname && *cfg->hostname ? cfg->hostname : "hutch";
        if (strlen(hostname) > 63)
                return hutch_error_set(err, -EINVAL, "hostname '%s' is longer than 63 bytes",
                                       hostname);
        if (sb->limits.nofile > HUTCH_MAX_NOFILE || sb->limits.pids > HUTCH_MAX_PIDS ||
            sb->limits.memory_bytes < HUTCH_MIN_MEMORY || sb->limits.disk_bytes < HUTCH_MIN_DISK ||
            sb->limits.disk_bytes > HUTCH_MAX_DISK || sb->limits.disk_inodes < HUTCH_MIN_INODES ||
            sb->limits.disk_inodes > HUTCH_MAX_INODES)
                return hutch_error_set(
                        err, -EINVAL,
                        "limits out of range (memory >= 4M, 1M <= disk <= 1T, 64 <= inodes <= 2^32, "
                        "pids <= 4194304, nofile <= 1048576)");
        /* Raising a hard limit needs CAP_SYS_RESOURCE in the initial user
         * namespace: the child's setrlimit would fail (EPERM) for every
         * create; say which limit instead */
        struct rlimit own;
        if (getrlimit(RLIMIT_NOFILE, &own) == 0 && own.rlim_max != RLIM_INFINITY &&
            sb->limits.nofile > own.rlim_max)
                return hutch_error_set(err, -EMFILE,
                                       "the sandbox's open-files limit (%" PRIu64
                                       ") is above this process's hard "
                                       "limit (%llu): raise it (ulimit -Hn, systemd LimitNOFILE=)",
                                       sb->limits.nofile, (unsigned long long) own.rlim_max);
        sb->backend = cfg->backend;
        if (!(sb->ops = backend_ops(sb->backend))) {
                sb->ops = &backend_ns; /* for the teardown of nothing */
                return hutch_error_set(err, -EINVAL, "unknown backend %d", sb->backend);
        }
        int r;
        if ((r = volumes_check(cfg, err)) < 0)
                return r;
        if ((r = hutch_gpu_spec_check(cfg->gpus, err)) < 0)
                return r;
        *ret_want_gpus = r > 0;
        return 0;
}

/* Its id (the config's or a new one) and the token init will hold. */
static int create_identity(hutch_sandbox *sb, const hutch_sandbox_config *cfg, hutch_error *err) {
        int r;
        if (cfg->id) {
                if (sandbox_validate_id(cfg->id) < 0)
                        return hutch_error_set(err, -EINVAL, "invalid sandbox id '%s'", cfg->id);
                memcpy(sb->id, cfg->id, HUTCH_ID_LEN + 1);
        } else if ((r = hutch_sandbox_id_new(sb->id)) < 0)
                return hutch_error_set(err, r, "getrandom: %s", strerror(-r));
        if ((r = random_token(sb->token)) < 0)
                return hutch_error_set(err, r, "getrandom: %s", strerror(-r));
        return 0;
}

/* The state dir first: it is what makes every later reservation ours. It
 * stays locked until the state file says what the sandbox is; then the uid
 * range and the GPUs, and the dir's common mount points. */
static int create_reserve(hutch_sandbox *sb, const hutch_sandbox_config *cfg, bool want_gpus,
                          int *ret_dfd, hutch_error *err) {
        hutch_ctx *ctx = sb->ctx;
        char sbroot[PATH_MAX];
        int r;
        snprintf(sbroot, sizeof sbroot, "%s/sandboxes", ctx->run_dir);
        if ((r = mkdir_p(sbroot, 0711)) < 0)
                return hutch_error_set(err, r, "creating %s: %s", sbroot, strerror(-r));
        if ((r = sandbox_dir_path(ctx, sb->id, &sb->dir)) < 0)
                return r;
        if (mkdir(sb->dir, 0711) < 0) {
                r = hutch_error_set(err, -errno, errno == EEXIST ? "sandbox %s already exists" : "creating %s: %m",
                                    errno == EEXIST ? sb->id : sb->dir);
                free(sb->dir);
                sb->dir = NULL; /* not ours: never remove it */
                return r;
        }
        if ((r = sandbox_busy_take(sb, false)) < 0)
                return hutch_error_set(err, r, "locking %s: %s", sb->dir, strerror(-r));
        if ((r = uidrange_alloc(ctx, sb->id, &sb->uid_slot, err)) < 0)
                return r;
        sb->uid_base = uidrange_base(ctx, sb->uid_slot);
        if (want_gpus && (r = gpu_alloc(ctx, sb->id, cfg->gpus, sb->gpu_ids, &sb->n_gpus, err)) < 0)
                return r;
        int dfd = open(sb->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || mkdirat(dfd, "root", 0755) < 0 || mkdirat(dfd, "lower", 0755) < 0 ||
            mkdirat(dfd, "layer", 0755) < 0 || mkdirat(dfd, "sock", 0700) < 0 ||
            fchownat(dfd, "sock", sb->uid_base, sb->uid_base, AT_SYMLINK_NOFOLLOW) < 0) {
                r = hutch_error_set(err, -errno, "preparing %s: %m", sb->dir);
                safe_close(dfd);
                return r;
        }
        *ret_dfd = dfd;
        return 0;
}

/* The cgroup with the backend's limits, and the GPUs' device rules and
 * mounts, before any process of the sandbox exists. */
static int create_cgroup(hutch_sandbox *sb, gpu_child **ret_gpu, hutch_error *err) {
        hutch_ctx *ctx = sb->ctx;
        hutch_error e = { 0 };
        int r;
        sb->cg_version = ctx->cg_version;
        snprintf(sb->cg_mount, sizeof sb->cg_mount, "%s", ctx->cg_mount ? ctx->cg_mount : "");
        hutch_limits cg_limits = sb->limits;
        if (sb->ops->cgroup_limits)
                sb->ops->cgroup_limits(&cg_limits);
        if ((r = cgroup_create(ctx->cg_version, ctx->cg_mount, ctx->cgroup_root, sb->id, &cg_limits,
                               &sb->cg, &e)) < 0)
                return hutch_error_set(err, r, "creating the cgroup: %s", e.msg);
        if (sb->n_gpus) {
                /* the nodes and the device cgroup's rules for exactly them */
                _cleanup_free_ char(*rules)[32] = NULL;
                size_t n_rules = 0;
                if ((r = gpu_child_prepare(ctx, sb->gpu_ids, sb->n_gpus, ret_gpu, &rules, &n_rules,
                                           err)) < 0)
                        return r;
                if ((r = cgroup_allow_devices(sb->cg, (const char(*)[32]) rules, n_rules, &e)) < 0)
                        return hutch_error_set(err, r, "allowing the GPUs in the device cgroup: %s",
                                               e.msg);
        }
        return 0;
}

int hutch_sandbox_create(hutch_ctx *ctx, const hutch_sandbox_config *cfg, hutch_sandbox **ret,
                         hutch_error *err) {
        hutch_sandbox_config none = { 0 };
        if (!cfg)
                cfg = &none;
        /* the backend's refusals before anything is made */
        const hutch_backend_ops *ops = backend_ops(cfg->backend);
        int r;
        if (ops && ops->check && (r = ops->check(cfg, err)) < 0)
                return r;
        hutch_template *tpl = NULL;
        _cleanup_close_ int dfd = -1;
        /* The clone child's stack and GPU mounts: unmapped and freed only
         * once the child is known gone (a reused mapping would be
         * scribbled on). */
        sandbox_create_args a = { .cfg = cfg, .stack = MAP_FAILED };
        bool want_gpus = false;

        hutch_sandbox *sb = sandbox_new(ctx);
        if (!sb)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        sb->is_parent = true;
        sb->created_ns = clock_ns(CLOCK_REALTIME);
        if ((r = create_check(sb, cfg, &want_gpus, err)) < 0)
                goto fail;
        sb->gpus_unasked = !want_gpus;
        if ((r = template_resolve(ctx->data_dir, cfg->template_name, &tpl, err)) < 0)
                goto fail;
        snprintf(sb->template_name, sizeof sb->template_name, "%s", tpl->name);
        if (!(sb->template_root = strdup(tpl->rootfs))) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto fail;
        }
        if ((r = create_identity(sb, cfg, err)) < 0 ||
            (r = create_reserve(sb, cfg, want_gpus, &dfd, err)) < 0 ||
            (r = create_cgroup(sb, &a.gpu, err)) < 0)
                goto fail;
        a.tpl = tpl;
        a.hostname = cfg->hostname && *cfg->hostname ? cfg->hostname : "hutch";
        a.dir_fd = dfd;
        if ((r = sb->ops->create(sb, &a, err)) < 0)
                goto fail;
        create_done(ctx, tpl);
        sandbox_busy_release(sb);
        *ret = sb;
        return 0;

fail:
        template_free(tpl);
        (void) sandbox_teardown(sb, NULL);
        if (a.stack != MAP_FAILED && (sb->init_pid <= 0 || sb->destroyed))
                munmap(a.stack, a.stack_size); /* else the child may live on: leak it, never reuse it */
        if (sb->init_pid <= 0 || sb->destroyed || a.stack == MAP_FAILED)
                gpu_child_free(a.gpu);
        hutch_sandbox_unref(sb);
        return r;
}

/* --------------------------------------------------------------- attach */

/* Load a sandbox from its state. With connect_init, it must be alive and
 * we talk to its init; without, whatever is left is opened for removal. */
static int sandbox_open(hutch_ctx *ctx, const char *id, bool connect_init, hutch_sandbox **ret, hutch_error *err) {
        _cleanup_close_ int sockdir = -1;
        if (sandbox_validate_id(id) < 0)
                return hutch_error_set(err, -ENOENT, "sandbox '%s' not found", id ? id : "");
        hutch_sandbox *sb = sandbox_new(ctx);
        if (!sb)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        memcpy(sb->id, id, HUTCH_ID_LEN + 1);
        int r = sandbox_dir_path(ctx, id, &sb->dir);
        if (r < 0)
                goto fail;
        struct stat st;
        if (stat(sb->dir, &st) < 0) {
                r = hutch_error_set(err, -ENOENT, "sandbox '%s' not found", id);
                goto fail;
        }
        r = state_read(sb, err);
        if (r < 0 && connect_init)
                goto fail;
        if (r < 0) {
                /* half-created or damaged: remove what can be found by id */
                sb->uid_slot = UINT32_MAX;
                sb->init_pid = 0;
        }
        uint64_t start;
        bool alive = sb->init_pid > 1 && sandbox_proc_starttime(sb->init_pid, &start) == 0 &&
                start == sb->init_starttime;
        if (alive) {
                sb->init_pidfd = sys_pidfd_open(sb->init_pid, 0);
                /* the pid could have been reused between the check and pidfd_open */
                if (sb->init_pidfd < 0 || sandbox_proc_starttime(sb->init_pid, &start) < 0 ||
                    start != sb->init_starttime) {
                        sb->init_pidfd = safe_close(sb->init_pidfd);
                        alive = false;
                }
        }
        if (!alive && sb->suspended) {
                /* checkpointed to disk: nothing runs, nothing to talk to */
                connect_init = false;
        } else if (!alive) {
                sb->init_pid = 0;
                if (connect_init) {
                        r = hutch_error_set(err, -ESRCH, "sandbox %s is not running (its init is gone)", id);
                        goto fail;
                }
        }
        hutch_error e = { 0 };
        /* the backend the sandbox was created with, whatever this process uses */
        if (!sb->cg_version) {
                sb->cg_version = ctx->cg_version;
                snprintf(sb->cg_mount, sizeof sb->cg_mount, "%s", ctx->cg_mount ? ctx->cg_mount : "");
        }
        r = cgroup_open(sb->cg_version, sb->cg_mount, ctx->cgroup_root, id, &sb->cg, &e);
        if (r < 0 && (connect_init || r != -ENOENT)) {
                hutch_error_set(err, r, "sandbox %s: %s", id, e.msg);
                goto fail;
        }
        if ((r = sandbox_storage_ensure(ctx, err)) < 0)
                goto fail;
        if (connect_init) {
                sb->conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                if (sb->conn < 0) {
                        r = hutch_error_set(err, -errno, "socket: %m");
                        goto fail;
                }
                char sp[PATH_MAX];
                snprintf(sp, sizeof sp, "%s/sock", sb->dir);
                sockdir = open(sp, O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (sockdir < 0) {
                        r = hutch_error_set(err, -errno, "opening %s: %m", sp);
                        goto fail;
                }
                /* through /proc/self/fd, so that a long run_dir still fits sun_path */
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/init.sock", sockdir);
                sandbox_conn_set_timeouts(sb->conn);
                if (connect(sb->conn, (struct sockaddr *) &sa, sizeof sa) < 0) {
                        r = hutch_error_set(err, -errno, "connecting to sandbox %s: %m", id);
                        goto fail;
                }
                /* A paused (frozen) sandbox's init cannot answer: thaw it for
                 * the handshake only, and freeze it again. */
                bool frozen = sb->cg && cgroup_is_frozen(sb->cg) > 0;
                if (frozen && (r = cgroup_thaw(sb->cg, err)) < 0)
                        goto fail;
                r = initconn_hello(sb, INIT_READY_TIMEOUT_MS, err);
                if (frozen) {
                        hutch_error e2 = { 0 };
                        int k = cgroup_freeze(sb->cg, &e2);
                        if (r >= 0 && k < 0) {
                                r = hutch_error_set(err, k, "sandbox %s: freezing again: %s", id, e2.msg);
                                goto fail;
                        }
                        sb->frozen = true;
                }
                if (r < 0)
                        goto fail;
        }
        /* a volume deleted from now on stays for its next launch, as for a
         * sandbox this process created (best effort: one deleted already
         * is found missing then, and the launch says so) */
        if (sb->ops->adopt && (connect_init || sb->suspended))
                sb->ops->adopt(sb);
        *ret = sb;
        return 0;
fail:
        hutch_sandbox_unref(sb);
        return r;
}

int hutch_sandbox_attach(hutch_ctx *ctx, const char *id, hutch_sandbox **ret, hutch_error *err) {
        return sandbox_open(ctx, id, true, ret, err);
}

/* Open a sandbox by id under its busy lock (waiting for it, or -EWOULDBLOCK),
 * so that its state is read after whatever transition held it ended. */
static int sandbox_open_locked(hutch_ctx *ctx, const char *id, bool wait, hutch_sandbox **ret, hutch_error *err) {
        if (sandbox_validate_id(id) < 0)
                return hutch_error_set(err, -ENOENT, "sandbox '%s' not found", id ? id : "");
        _cleanup_free_ char *dir = NULL;
        if (sandbox_dir_path(ctx, id, &dir) < 0)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        _cleanup_close_ int lock = lock_open(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY, wait);
        if (lock == -ENOENT)
                return hutch_error_set(err, -ENOENT, "sandbox '%s' not found", id);
        if (lock < 0)
                return hutch_error_set(err, lock, "sandbox %s: %s", id,
                                       lock == -EWOULDBLOCK ? "busy (being created, checkpointed or removed)"
                                                            : strerror(-lock));
        hutch_sandbox *sb;
        int r = sandbox_open(ctx, id, false, &sb, err);
        if (r < 0) {
                (void) flock(lock, LOCK_UN);
                return r;
        }
        sb->busy_fd = TAKE_FD(lock);
        *ret = sb;
        return 0;
}

int hutch_sandbox_remove(hutch_ctx *ctx, const char *id, hutch_error *err) {
        hutch_sandbox *sb;
        int r = sandbox_open_locked(ctx, id, true, &sb, err);
        if (r < 0)
                return r;
        r = sandbox_teardown(sb, err);
        hutch_sandbox_unref(sb);
        return r;
}

/* ------------------------------------------------------------- destroy etc */

int hutch_sandbox_kill_begin(hutch_sandbox *sb, hutch_error *err) {
        if (!sb || sb->destroyed)
                return hutch_error_set(err, -ESRCH, "sandbox already destroyed");
        if (sb->init_pidfd < 0)
                return hutch_error_set(err, -ESRCH, "sandbox %s: its init is not known", sb->id);
        /* gvisor: runsc goes first and the relay, which reaps it, exits by
         * itself; its pidfd is readable once that happened */
        if (sb->ops->stop) {
                (void) sb->ops->stop(sb);
                sb->conn = safe_close(sb->conn);
                return sb->init_pidfd;
        }
        /* as in teardown: PID 1 dying takes every process of the sandbox */
        if (sys_pidfd_send_signal(sb->init_pidfd, SIGKILL, NULL, 0) < 0 && errno != ESRCH)
                return hutch_error_set(err, -errno, "sandbox %s: killing init: %m", sb->id);
        /* a frozen task does not die of SIGKILL until thawed */
        if (sb->cg && cgroup_is_frozen(sb->cg) == 1 && cgroup_thaw(sb->cg, NULL) >= 0)
                sb->frozen = false;
        sb->conn = safe_close(sb->conn);
        return sb->init_pidfd;
}

int hutch_sandbox_destroy(hutch_sandbox *sb, hutch_error *err) {
        if (!sb || sb->destroyed)
                return 0;
        /* not while another process is about to tear it down too (a gc that
         * saw its init dead); the dir may be gone already: nothing to wait for */
        (void) sandbox_busy_take(sb, true);
        int r = sandbox_teardown(sb, err);
        sandbox_busy_release(sb);
        return r;
}

hutch_sandbox *hutch_sandbox_ref(hutch_sandbox *sb) {
        if (sb)
                sb->n_ref++;
        return sb;
}

hutch_sandbox *hutch_sandbox_unref(hutch_sandbox *sb) {
        if (!sb || --sb->n_ref > 0)
                return NULL;
        sandbox_busy_release(sb);
        safe_close(sb->conn);
        safe_close(sb->init_pidfd);
        if (sb->ops->release)
                sb->ops->release(sb);
        cgroup_free(sb->cg);
        initconn_events_free(sb);
        free(sb->rxbuf);
        free(sb->tx);
        free(sb->template_root);
        free(sb->dir);
        free(sb);
        return NULL;
}

const char *hutch_sandbox_id(const hutch_sandbox *sb) {
        return sb->id;
}
const char *hutch_sandbox_template(const hutch_sandbox *sb) {
        return sb->template_name;
}
const char *hutch_sandbox_owner(const hutch_sandbox *sb) {
        return sb->owner;
}
int hutch_sandbox_backend(const hutch_sandbox *sb) {
        return sb->backend;
}

/* A third backend is a file with its table, and a line here. */
static const hutch_backend_ops *const backends[HUTCH_BACKENDS] = {
        [HUTCH_BACKEND_NS] = &backend_ns,
        [HUTCH_BACKEND_GVISOR] = &backend_gvisor,
};

const hutch_backend_ops *backend_ops(int backend) {
        return backend >= 0 && backend < HUTCH_BACKENDS ? backends[backend] : NULL;
}
int hutch_backend_from_name(const char *name) {
        for (int b = 0; name && b < HUTCH_BACKENDS; b++)
                if (backends[b] && streq(name, backends[b]->name))
                        return b;
        return -EINVAL;
}
const char *hutch_backend_name(int backend) {
        const hutch_backend_ops *ops = backend_ops(backend);
        return ops ? ops->name : "ns";
}
unsigned hutch_backend_caps(int backend) {
        const hutch_backend_ops *ops = backend_ops(backend);
        return ops ? ops->caps : 0;
}
pid_t hutch_sandbox_init_pid(const hutch_sandbox *sb) {
        return sb->init_pid;
}
uid_t hutch_sandbox_uid_base(const hutch_sandbox *sb) {
        return sb->uid_base;
}
const hutch_limits *hutch_sandbox_limits(const hutch_sandbox *sb) {
        return &sb->limits;
}
int hutch_sandbox_fd(const hutch_sandbox *sb) {
        return sb->conn;
}
bool hutch_sandbox_is_suspended(const hutch_sandbox *sb) {
        return sb->suspended;
}

int hutch_sandbox_freeze(hutch_sandbox *sb, hutch_error *err) {
        int r = cgroup_freeze(sb->cg, err);
        if (r >= 0)
                sb->frozen = true;
        return r;
}

int hutch_sandbox_thaw(hutch_sandbox *sb, hutch_error *err) {
        int r = cgroup_thaw(sb->cg, err);
        if (r >= 0)
                sb->frozen = false;
        return r;
}

bool hutch_sandbox_is_frozen(const hutch_sandbox *sb) {
        return sb->frozen;
}

/* The runtime is stopped and a new one restores it: in between the sandbox
 * has no init, so it holds its busy lock (`hutch gc` would take it for dead). */
static int checkpoint(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, bool suspend,
                      hutch_error *err) {
        int r = sandbox_busy_take(sb, true);
        if (r < 0)
                return hutch_error_set(err, r, "sandbox %s: locking its directory: %s", sb->id,
                                       strerror(-r));
        if (sb->ops->checkpoint)
                r = sb->ops->checkpoint(sb, out_fd, ret_bytes, suspend, err);
        else
                r = hutch_error_set(err, -EOPNOTSUPP,
                                    "only gvisor sandboxes have memory checkpoints");
        sandbox_busy_release(sb);
        return r;
}

int hutch_sandbox_checkpoint(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, hutch_error *err) {
        return checkpoint(sb, out_fd, ret_bytes, false, err);
}

int hutch_sandbox_suspend(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, hutch_error *err) {
        return checkpoint(sb, out_fd, ret_bytes, true, err);
}

int hutch_sandbox_resume_from(hutch_sandbox *sb, const char *stream_path, hutch_error *err) {
        if (!sb->ops->resume || !sb->suspended)
                return hutch_error_set(err, -EINVAL, "sandbox %s is not suspended", sb->id);
        int r = sandbox_busy_take(sb, true);
        if (r < 0)
                return hutch_error_set(err, r, "sandbox %s: locking its directory: %s", sb->id,
                                       strerror(-r));
        r = sb->ops->resume(sb, stream_path, err);
        sandbox_busy_release(sb);
        return r;
}

int hutch_sandbox_set_network(hutch_sandbox *sb, bool on, hutch_error *err) {
        return sb->ops->set_network ? sb->ops->set_network(sb, on, err) : 0;
}

void hutch_layer_source_close(hutch_layer_source *src) {
        if (!src)
                return;
        if (src->root_fd > 0)
                close(src->root_fd);
        if (src->image_fd > 0)
                close(src->image_fd);
        src->root_fd = src->image_fd = -1;
}

int hutch_sandbox_layer_open(hutch_sandbox *sb, hutch_layer_source *ret, hutch_error *err) {
        return sb->ops->layer_open(sb, ret, err);
}

int hutch_layer_export_fds(const hutch_layer_source *src, int out_fd, uint64_t *ret_bytes, hutch_error *err) {
        if (syncfs(src->root_fd) < 0)
                return hutch_error_set(err, -errno, "syncing the sandbox's file system: %m");
        return storage_export_fd(src->image_fd, src->uid_base, out_fd, ret_bytes, err);
}

int hutch_sandbox_layer_export(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, hutch_error *err) {
        hutch_layer_source src = { -1, -1, 0 };
        int r = hutch_sandbox_layer_open(sb, &src, err);
        if (r >= 0)
                r = hutch_layer_export_fds(&src, out_fd, ret_bytes, err);
        hutch_layer_source_close(&src);
        return r;
}

int hutch_sandbox_stats(hutch_sandbox *sb, hutch_stats *ret, hutch_error *err) {
        hutch_stats s = { 0 };
        int r = cgroup_stats(sb->cg, &s, err);
        if (r < 0)
                return r;
        s.disk_limit = sb->limits.disk_bytes;
        sb->ops->usage(sb, &s);
        uint64_t used = 0;
        s.gpus = (uint32_t) sb->n_gpus;
        if (sb->n_gpus && gpu_memory_used(sb, &used) >= 0) {
                s.gpu_memory_measured = true;
                s.gpu_memory_used = used;
        }
        *ret = s;
        return 0;
}

int hutch_sandbox_list(hutch_ctx *ctx, char ***ret_ids, hutch_error *err) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/sandboxes", ctx->run_dir);
        size_t n = 0, cap = 16;
        char **v = calloc(cap + 1, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        DIR *d = opendir(path);
        if (!d) {
                if (errno == ENOENT) {
                        *ret_ids = v;
                        return 0;
                }
                free(v);
                return hutch_error_set(err, -errno, "listing %s: %m", path);
        }
        struct dirent *de;
        while ((de = readdir(d))) {
                if (sandbox_validate_id(de->d_name) < 0)
                        continue;
                if (n == cap) {
                        char **nv = realloc(v, (cap * 2 + 1) * sizeof *v);
                        if (!nv)
                                break;
                        v = nv;
                        cap *= 2;
                }
                v[n] = strdup(de->d_name);
                if (v[n])
                        n++;
                v[n] = NULL;
        }
        closedir(d);
        *ret_ids = v;
        return (int) n;
}

void hutch_strv_free(char **v) {
        if (!v)
                return;
        for (char **p = v; *p; p++)
                free(*p);
        free(v);
}

int hutch_sandbox_gc(hutch_ctx *ctx, hutch_error *err) {
        char **ids = NULL;
        int r = hutch_sandbox_list(ctx, &ids, err);
        if (r < 0)
                return r;
        int removed = 0;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        for (char **id = ids; *id; id++) {
                hutch_sandbox *sb;
                /* busy: in the middle of a create, checkpoint or teardown by
                 * another process; its state is not final, leave it */
                if (sandbox_open_locked(ctx, *id, false, &sb, NULL) < 0)
                        continue;
                /* A create holds the lock until its state is written, so an
                 * unlocked directory without state is a create that died;
                 * the grace covers the moment between mkdir and flock. */
                char sp[PATH_MAX];
                struct stat st;
                snprintf(sp, sizeof sp, "%s/state", sb->dir);
                bool has_state = stat(sp, &st) == 0;
                bool old = stat(sb->dir, &st) == 0 && now.tv_sec - st.st_mtim.tv_sec > 5;
                if (sb->init_pid == 0 && !sb->suspended && (has_state || old)) {
                        hutch_error e = { 0 };
                        if (sandbox_teardown(sb, &e) >= 0)
                                removed++;
                        else if (err && !err->code)
                                hutch_error_set(err, e.code, "%s", e.msg);
                }
                hutch_sandbox_unref(sb);
        }
        hutch_strv_free(ids);
        return removed;
}

int sandbox_oom_adjust(pid_t pid) {
        char path[40] = "/proc/self/oom_score_adj";
        if (pid > 0) /* the parent's call; a fork child passes 0 and formats nothing */
                snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int) pid);
        static const char want[] = "500";
        _Static_assert(SANDBOX_OOM_SCORE_ADJ == 500, "want[] spells SANDBOX_OOM_SCORE_ADJ");
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        int r = 0;
        if (write(fd, want, sizeof want - 1) != (ssize_t) sizeof want - 1) {
                r = -errno;
                char cur[16] = "";
                ssize_t n = pread(fd, cur, sizeof cur - 1, 0);
                if (n > 0 && cur[0] != '-')
                        r = 0; /* not protected: the kernel's default choice stands */
        }
        close(fd);
        return r;
}
