/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The live sandbox table. The database is the truth for what should exist;
 * the kernel (hutch-init answering on its socket) is the truth for what is
 * alive (docs/design.md §6). Freed objects are only unlinked here and released at
 * the top of the next loop turn, because an epoll batch may still hold
 * events for their descriptors.
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/node.h"
#include "daemon/requests.h"
#include "daemon/ingress.h"
#include "daemon/server.h"
#include "daemon/templates.h"
#include "daemon/audit.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "daemon/usage.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"
#include "snapshot/seal.h"
#include "template/template.h"
#include "template/interp-template.h"


static void hex(const uint8_t *b, size_t n, char *out) {
        static const char digits[] = "0123456789abcdef";
        for (size_t i = 0; i < n; i++) {
                out[2 * i] = digits[b[i] >> 4];
                out[2 * i + 1] = digits[b[i] & 15];
        }
        out[2 * n] = 0;
}

/* envd access tokens are derived, not stored: HMAC(master, id:nonce). A copy
 * of the database alone does not reveal them; only their hash is kept. */
void sbx_token_derive(server *srv, const char *id, const char *nonce, char ret[64]) {
        char msg[128];
        int n = snprintf(msg, sizeof msg, "envd-token:%s:%s", id, nonce);
        uint8_t mac[32];
        unsigned maclen = sizeof mac;
        HMAC(EVP_sha256(), srv->master, sizeof srv->master, (const uint8_t *) msg, (size_t) n, mac, &maclen);
        memcpy(ret, "tok_", 4);
        hex(mac, 20, ret + 4);
}

static void sha256_hex(const char *s, char out[65]) {
        uint8_t d[32];
        SHA256((const uint8_t *) s, strlen(s), d);
        hex(d, 32, out);
}

sbx *sbx_find(server *srv, const char *id) {
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && streq(sb->id, id))
                        return sb;
        return NULL;
}

sbx *sbx_find_team(server *srv, const char *id, int64_t team) {
        sbx *sb = sbx_find(srv, id);
        return sb && sb->team_id == team ? sb : NULL;
}

int sbx_live_count(server *srv, int64_t team) {
        int n = 0;
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && sb->team_id == team)
                        n++;
        return n;
}

void sbx_mark_dirty(sbx *sb) {
        sb->dirty = true;
}

static void on_init_readable(server *srv, watcher *w, uint32_t revents) {
        sbx *sb = w->data;
        sbx_drain(srv, sb);
}

void sbx_drain(server *srv, sbx *sb) {
        sb->dirty = false;
        /* gvisor, paused to disk: no init to hear from until its resume */
        if (sb->dead || hutch_sandbox_is_suspended(sb->h))
                return;
        for (unsigned guard = 0; guard < 4096; guard++) {
                hutch_event ev = { 0 };
                hutch_error err = { 0 };
                int r = hutch_sandbox_next_event(sb->h, &ev, &err);
                if (r == 0)
                        return;
                if (r < 0) {
                        log_info("sandbox %s: lost its init (%s); removing it", sb->id, err.msg);
                        sbx_kill(srv, sb, "lost");
                        return;
                }
                if (ev.type == HUTCH_EVENT_EXIT)
                        proc_on_exit(srv, sb, &ev.exit);
                else if (ev.type == HUTCH_EVENT_WATCH)
                        stream_on_watch_event(srv, sb, &ev);
                hutch_event_clear(&ev);
                if (sb->dead)
                        return;
        }
        sb->dirty = true; /* more next turn: one chatty sandbox must not starve the loop */
}

static int register_init(server *srv, sbx *sb) {
        sb->w.cb = on_init_readable;
        sb->w.data = sb;
        return loop_add(srv, &sb->w, hutch_sandbox_fd(sb->h), EPOLLIN);
}

static sbx *sbx_alloc(server *srv) {
        sbx *sb = calloc(1, sizeof *sb);
        if (!sb)
                return NULL;
        sb->srv = srv;
        sb->w.fd = -1;
        sb->gone_w.fd = -1;
        return sb;
}

static void sbx_link(server *srv, sbx *sb) {
        sb->next = srv->sandboxes;
        srv->sandboxes = sb;
}

static json_t *extra_json(sbx *sb, json_t *body) {
        json_t *e = json_object();
        json_object_set_new(e, "onTimeout", json_string(sb->on_timeout_pause ? "pause" : "kill"));
        json_object_set_new(e, "autoResume", json_boolean(sb->auto_resume));
        json_object_set_new(e, "autoPauseMemory", json_boolean(sb->pause_keep_memory));
        json_object_set_new(e, "coldResume", json_boolean(sb->cold_resume));
        json_object_set_new(e, "backend", json_string(hutch_backend_name(sb->backend)));
        if (body) {
                json_t *net = json_object_get(body, "network");
                if (net)
                        json_object_set(e, "network", net);
                json_t *aia = json_object_get(body, "allow_internet_access");
                if (json_is_boolean(aia))
                        json_object_set(e, "allowInternetAccess", aia);
        }
        return e;
}

/* What E2B's sandboxes carry about themselves, besides the environment
 * variables set in every process: /run/e2b/.E2B_SANDBOX and friends. */
static int sbx_write_identity(sbx *sb, hutch_error *err) {
        static const hutch_fs_user root = { 0, 0 };
        const struct {
                const char *name, *value;
        } files[] = {
                { "/run/e2b/.E2B_SANDBOX", "true" },
                { "/run/e2b/.E2B_SANDBOX_ID", sb->id },
                { "/run/e2b/.E2B_TEMPLATE_ID", sb->template_id[0] ? sb->template_id : "host" },
        };
        for (size_t i = 0; i < ELEMENTSOF(files); i++) {
                int r = hutch_fs_write_buffer(sb->h, &root, files[i].name, files[i].value, strlen(files[i].value), err);
                if (r < 0)
                        return r;
        }
        sbx_mark_dirty(sb);
        return 0;
}

/* The engine's sandbox for sb (its limits from sb), its init in the loop,
 * its identity files. On failure nothing of it is left and sb->h is NULL. */
static int sbx_engine_start(server *srv, sbx *sb, const char *template_name, const char *layer_from,
                            const char *build_layer, const char *layer_image, uint32_t image_base, bool checkpoint,
                            hutch_error *err) {
        /* hutch ps names the daemon (its data dir) and, once claimed, the team */
        char owner[128];
        if (sb->team_id)
                snprintf(owner, sizeof owner, "hutch serve %s team %lld", srv->cfg.data_dir, (long long) sb->team_id);
        else
                snprintf(owner, sizeof owner, "hutch serve %s", srv->cfg.data_dir);
        hutch_volume_mount vols[HUTCH_VOLUMES_MAX];
        size_t n_vols = volumes_mounts_config(json_object_get(sb->extra, "volumeMounts"), vols, HUTCH_VOLUMES_MAX);
        hutch_sandbox_config sc = {
                .volumes = vols,
                .n_volumes = n_vols,
                /* a cold resume (a new engine sandbox) asks for them again */
                .gpus = json_string_value(json_object_get(sb->extra, "gpus")),
                .owner = owner,
                .template_name = template_name,
                /* a gvisor checkpoint of a built template's sandbox restores
                 * over the build's layer, read-only under its own */
                .layer_from = checkpoint ? build_layer : layer_from,
                .layer_image = checkpoint ? NULL : layer_image,
                .layer_image_uid_base = image_base,
                .checkpoint_from = checkpoint ? layer_from : NULL,
                .id = sb->id,
                .backend = sb->backend,
                .egress_port = (uint16_t) srv->cfg.egress_port,
                .limits = {
                        .memory_bytes = (uint64_t) sb->memory_mb << 20,
                        .cpu_millis = (uint64_t) sb->cpu_count * 1000,
                        .disk_bytes = (uint64_t) sb->disk_mb << 20,
                },
        };
        int r = hutch_sandbox_create(srv->ctx, &sc, &sb->h, err);
        if (r < 0)
                return r;
        r = register_init(srv, sb);
        if (r < 0)
                hutch_error_set(err, r, "epoll: %s", strerror(-r));
        else
                r = sbx_write_identity(sb, err);
        if (r >= 0)
                r = egress_sbx_install_ca(srv, sb, err);
        if (r < 0) {
                hutch_error e2 = { 0 };
                loop_del(srv, &sb->w);
                (void) hutch_sandbox_destroy(sb->h, &e2);
                sb->h = hutch_sandbox_unref(sb->h);
        }
        return r;
}

/* ------------------------------------------------------------- warm pool */

static void sbx_release(sbx *sb);

/* The ids of pooled sandboxes, rewritten whenever the pool changes: they
 * have no row, so after a crash this file is how the next start knows
 * them as its own (and not `hutch run`'s) and removes them. */
static void pool_save(server *srv) {
        srv->pool_dirty = false;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/pool-ids", srv->cfg.data_dir);
        size_t cap = (size_t) (srv->n_pool + 1) * (HUTCH_ID_LEN + 1) + 1, n = 0;
        char *buf = malloc(cap);
        if (!buf)
                return;
        for (sbx *p = srv->pool; p; p = p->next)
                if (!p->dead)
                        n += (size_t) snprintf(buf + n, cap - n, "%s\n", p->id);
        /* No fsync: the file only matters after a crash of the daemon, when
         * the page cache survives; after a host crash no sandbox does. */
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        bool ok = fd >= 0 && write(fd, buf, n) == (ssize_t) n;
        if (fd >= 0)
                close(fd);
        if (!ok || rename(tmp, path) < 0)
                log_warning("writing %s: %m", path);
        free(buf);
}

/* What a create without templateID starts, and so what the pool holds
 * besides code-interpreter sandboxes: the built base (its version, the
 * target of DATA_DIR/templates/base, to ver), else the host template. */
static const char *pool_default_read(server *srv, char *ver, size_t n) {
        return template_base_version(srv->cfg.data_dir, ver, n) ? "base" : "host";
}

/* Whether a value read at *read_ms (-1: never) is to be read again: a
 * second later, or when the clock went back; then *read_ms is now. The
 * loop asks the pool's questions every turn; their file system answers
 * are read at most once a second. */
static bool reread_due(int64_t *read_ms) {
        int64_t now = wall_ms();
        if (*read_ms >= 0 && now - *read_ms < 1000 && now >= *read_ms)
                return false;
        *read_ms = now;
        return true;
}

/* pool_default_read() at most once a second; a claim (pool_take) reads it
 * afresh. */
static const char *pool_default(server *srv, char *ver, size_t n) {
        static int64_t read_ms = -1;
        static const char *tpl;
        static char cached[96];
        if (reread_due(&read_ms))
                tpl = pool_default_read(srv, cached, sizeof cached);
        snprintf(ver, n, "%s", cached);
        return tpl;
}

/* The code-interpreter template's version as a create would start it now:
 * the built one's (template_interp_version), or "" on the host template.
 * At most one readlink a second, as pool_default. */
static const char *pool_interp_version(server *srv, bool fresh) {
        static int64_t read_ms = -1;
        static char cached[96];
        if (reread_due(&read_ms) || fresh)
                (void) template_interp_version(srv->cfg.data_dir, cached, sizeof cached);
        return cached;
}

/* Whether a pooled sandbox may still be handed out: one of the default
 * template (tpl, ver) as it is now, or a code-interpreter one of the
 * interpreter's template as it is now (iver). One from the host template
 * after a base (or an interpreter template) was built, or from one since
 * rebuilt or removed, is stale: the next fill removes it. */
static bool pool_current(const sbx *p, const char *tpl, const char *ver, const char *iver) {
        if (template_is_interp(p->template_id))
                return streq(p->pool_version, iver);
        return streq(p->template_id, tpl) && streq(p->pool_version, ver);
}

/* ------------------------------------------------- interpreter checkpoint */

/* gvisor (issue #14): a code-interpreter create that the warm pool cannot
 * serve restores a checkpoint of a started interpreter (its python and
 * javascript kernels up) instead of starting Python's kernel again. The
 * checkpoint is taken once an interpreter was wanted (a code-interpreter
 * create that found none, or an interpreter warm pool), from a pooled
 * interpreter once it is ready (the pool keeps one starting while none
 * exists), which the checkpoint stops: it then leaves the pool.
 *
 * One file, DATA_DIR/interp-checkpoints/<key>.ckpt, root's, 0600; the key
 * is over everything a restored sandbox must match: the interpreter
 * template's version, hutch-interp's files, the limits every create gets.
 * A new key (a rebuilt template, another hutch) makes a new checkpoint,
 * which replaces the others. A restore that fails removes the file, and
 * that create starts its kernels. */
#define INTERP_CKPT_DIR "interp-checkpoints"
#define INTERP_CKPT_RECIPE "hutch-interp-ckpt-1"

static bool interp_ckpt_on(server *srv) {
        return srv->cfg.interp_checkpoint && hutch_backend_from_name(srv->cfg.backend) == HUTCH_BACKEND_GVISOR;
}

static int interp_ckpt_key(server *srv, char *out, size_t n) {
        hutch_template *t = NULL;
        hutch_error e = { 0 };
        if (template_resolve(srv->cfg.data_dir, "code-interpreter-v1", &t, &e) < 0)
                return e.code ? e.code : -ENOENT;
        char in[8192], dir[PATH_MAX];
        int k = snprintf(in, sizeof in, "%s\n%s\n%s\n%llu %llu %llu %llu\n", INTERP_CKPT_RECIPE,
                         t->version ? t->version : "", t->start_cmd ? t->start_cmd : "",
                         (unsigned long long) srv->cfg.memory_mb, (unsigned long long) srv->cfg.cpu_count,
                         (unsigned long long) srv->cfg.disk_mb, (unsigned long long) srv->cfg.egress_port);
        template_free(t);
        if (interp_host_dir(dir, sizeof dir) == 0)
                for (const char *const *f = interp_files; *f && k > 0 && (size_t) k < sizeof in; f++) {
                        char fp[PATH_MAX];
                        struct stat st;
                        snprintf(fp, sizeof fp, "%s/%s", dir, *f);
                        if (stat(fp, &st) == 0)
                                k += snprintf(in + k, sizeof in - (size_t) k, "%s %lld %lld.%09ld\n", *f,
                                              (long long) st.st_size, (long long) st.st_mtim.tv_sec,
                                              st.st_mtim.tv_nsec);
                }
        char key[65];
        sha256_hex(in, key);
        snprintf(out, n, "%s/%s/%s.ckpt", srv->cfg.data_dir, INTERP_CKPT_DIR, key);
        return 0;
}

/* The checkpoint a code-interpreter create would restore now (it may not
 * exist yet), worked out at most once a second; false when checkpoints
 * are off or the interpreter's template does not resolve. */
static bool interp_ckpt_path(server *srv, char *buf, size_t n) {
        static int64_t read_ms = -1;
        static char cached[PATH_MAX];
        static bool ok;
        if (!interp_ckpt_on(srv))
                return false;
        if (reread_due(&read_ms))
                ok = interp_ckpt_key(srv, cached, sizeof cached) == 0;
        snprintf(buf, n, "%s", cached);
        return ok;
}

/* Whether a checkpoint should be taken: on, wanted, not backing off, and
 * none for the current key. */
static bool interp_ckpt_missing(server *srv) {
        char p[PATH_MAX];
        struct stat st;
        return (srv->interp_ckpt_wanted || srv->cfg.interp_pool_size > 0) &&
                wall_ms() >= srv->interp_ckpt_backoff_ms && interp_ckpt_path(srv, p, sizeof p) &&
                stat(p, &st) < 0;
}

/* A ready pooled interpreter of the checkpointing backend, or NULL. */
static sbx *interp_ckpt_source(server *srv) {
        for (sbx *p = srv->pool; p; p = p->next)
                if (!p->dead && p->h && template_is_interp(p->template_id) && p->start_done &&
                    p->backend == HUTCH_BACKEND_GVISOR)
                        return p;
        return NULL;
}

static void pool_remove(server *srv, sbx *sb);

/* Every file of the directory but keep (an older key's checkpoint, or what
 * a crash left of a write). */
static void interp_ckpt_sweep(server *srv, const char *keep) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", srv->cfg.data_dir, INTERP_CKPT_DIR);
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = dfd < 0 ? NULL : fdopendir(dup(dfd));
        if (!d)
                return;
        const char *base = strrchr(keep, '/');
        base = base ? base + 1 : keep;
        for (struct dirent *de; (de = readdir(d));)
                if (de->d_name[0] != '.' && !streq(de->d_name, base) && unlinkat(dfd, de->d_name, 0) == 0)
                        log_info("interpreter checkpoint: removed %s/%s, of another template or hutch", dir,
                                 de->d_name);
        closedir(d);
}

/* Checkpoint sb (a ready pooled interpreter), which stops it: the file is
 * written under a temporary name, synced and renamed; sb leaves the pool.
 * On the loop, as every runsc checkpoint (docs/design.md §9): seconds,
 * once per key. */
static void interp_ckpt_take(server *srv, sbx *sb) {
        char path[PATH_MAX], tmp[PATH_MAX + 8], dir[PATH_MAX];
        if (!interp_ckpt_path(srv, path, sizeof path))
                return;
        snprintf(dir, sizeof dir, "%s/%s", srv->cfg.data_dir, INTERP_CKPT_DIR);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int64_t t0 = wall_ms();
        uint64_t bytes = 0;
        hutch_error err = { 0 };
        int r = 0;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                r = hutch_error_set(&err, -errno, "%s: %m", dir);
        _cleanup_close_ int fd = r < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (r >= 0 && fd < 0)
                r = hutch_error_set(&err, -errno, "%s: %m", tmp);
        if (r >= 0)
                r = hutch_sandbox_suspend(sb->h, fd, &bytes, &err);
        if (r >= 0 && fsync(fd) < 0)
                r = hutch_error_set(&err, -errno, "syncing %s: %m", tmp);
        if (r >= 0 && rename(tmp, path) < 0)
                r = hutch_error_set(&err, -errno, "renaming %s: %m", tmp);
        if (r < 0) {
                unlink(tmp);
                srv->interp_ckpt_backoff_ms = wall_ms() + 600000;
                log_warning("interpreter checkpoint of %s: %s; code-interpreter creates start their kernels "
                            "(the next try in 10 minutes)",
                            sb->id, err.msg);
                /* a failure after runsc stopped it restores it at once:
                 * then it stays in the pool, ready */
                if (!hutch_sandbox_is_suspended(sb->h))
                        return;
        } else {
                log_info("interpreter checkpoint: %s (%.1f MiB) from %s in %lld ms", path,
                         (double) bytes / 1048576.0, sb->id, (long long) (wall_ms() - t0));
                interp_ckpt_sweep(srv, path);
        }
        /* stopped by the checkpoint: it cannot be handed out */
        pool_remove(srv, sb);
}

/* sb, already unlinked from the pool's list: destroyed unless its init
 * died, then freed */
static void pool_drop(server *srv, sbx *sb) {
        srv->n_pool--;
        if (!sb->dead) {
                loop_del(srv, &sb->w);
                hutch_error e2 = { 0 };
                if (hutch_sandbox_destroy(sb->h, &e2) < 0)
                        log_warning("warm pool: destroying %s: %s", sb->id, e2.msg);
        }
        sbx_release(sb);
}

/* sb out of the pool, destroyed and freed, pool-ids rewritten */
static void pool_remove(server *srv, sbx *sb) {
        for (sbx **pp = &srv->pool; *pp; pp = &(*pp)->next)
                if (*pp == sb) {
                        *pp = sb->next;
                        pool_drop(srv, sb);
                        pool_save(srv);
                        return;
                }
}

/* How many of each kind the pool holds: default ones (pool_default), and
 * code-interpreter ones (started or starting). */
static void pool_counts(server *srv, unsigned *ret_host, unsigned *ret_interp) {
        char ver[96];
        const char *tpl = pool_default(srv, ver, sizeof ver);
        const char *iver = pool_interp_version(srv, false);
        unsigned h = 0, i = 0;
        for (sbx *p = srv->pool; p; p = p->next)
                if (!p->dead && pool_current(p, tpl, ver, iver)) {
                        if (template_is_interp(p->template_id))
                                i++;
                        else
                                h++;
                }
        *ret_host = h;
        *ret_interp = i;
}

/* The code interpreters the pool keeps: interp-pool-size, and one while a
 * checkpoint is wanted (it becomes the checkpoint once ready). */
static unsigned interp_target(server *srv, bool ckpt_missing) {
        unsigned t = (unsigned) srv->cfg.interp_pool_size;
        return t == 0 && ckpt_missing ? 1 : t;
}

bool sbx_pool_short(server *srv) {
        unsigned h, i;
        pool_counts(srv, &h, &i);
        bool missing = interp_ckpt_missing(srv);
        return h < srv->cfg.pool_size || i < interp_target(srv, missing) ||
                (missing && interp_ckpt_source(srv));
}

/* A pooled sandbox of template_name ("host", "base" or a code-interpreter
 * one) that is current (pool_current), out of the pool; NULL if none. */
static sbx *pool_take(server *srv, const char *template_name) {
        char ver[96];
        const char *tpl = pool_default_read(srv, ver, sizeof ver);
        const char *iver = pool_interp_version(srv, true);
        for (sbx **pp = &srv->pool; *pp; pp = &(*pp)->next) {
                sbx *sb = *pp;
                if (sb->dead || !streq(sb->template_id, template_name) ||
                    !pool_current(sb, tpl, ver, iver) || sb->start_pending)
                        continue;
                /* drain what its init said while it waited (nothing, normally) */
                sbx_drain(srv, sb);
                if (sb->dead)
                        continue;
                *pp = sb->next;
                sb->next = NULL;
                sb->pooled = false;
                srv->n_pool--;
                /* pool-ids is rewritten at the end of the loop's turn
                 * (sbx_pool_sync), after the create's row is committed and
                 * its 201 written: a crash before leaves the id listed, and
                 * the next start finds the row or removes the sandbox */
                srv->pool_dirty = true;
                return sb;
        }
        return NULL;
}

void sbx_pool_fill(server *srv) {
        char ver[96];
        const char *dflt = pool_default(srv, ver, sizeof ver);
        const char *iver = pool_interp_version(srv, false);
        /* release entries whose init died while they waited, and stale ones
         * (a base or interpreter template built, rebuilt or removed since
         * they started) */
        bool changed = false;
        for (sbx **pp = &srv->pool; *pp;) {
                sbx *sb = *pp;
                if (sb->dead || !pool_current(sb, dflt, ver, iver)) {
                        if (!sb->dead)
                                log_info("warm pool: removing %s, a sandbox of %s %s, which creates no longer start",
                                         sb->id, sb->template_id,
                                         sb->pool_version[0] ? sb->pool_version : "");
                        *pp = sb->next;
                        pool_drop(srv, sb);
                        changed = true;
                        continue;
                }
                pp = &sb->next;
        }
        if (changed)
                pool_save(srv);
        /* a ready interpreter, while no checkpoint is: it becomes one */
        bool missing = interp_ckpt_missing(srv);
        sbx *src = missing ? interp_ckpt_source(srv) : NULL;
        if (src) {
                interp_ckpt_take(srv, src);
                return;
        }
        unsigned n_host, n_interp;
        pool_counts(srv, &n_host, &n_interp);
        bool interp = n_host >= srv->cfg.pool_size;
        if (interp && n_interp >= interp_target(srv, missing))
                return;
        const char *tpl = interp ? "code-interpreter-v1" : dflt;
        sbx *sb = sbx_alloc(srv);
        if (!sb)
                return;
        node_sandbox_id_new(srv, sb->id);
        sb->backend = hutch_backend_from_name(srv->cfg.backend);
        sb->pooled = true;
        /* listed before it exists: a crash in between leaves an id to clean */
        sb->next = srv->pool;
        srv->pool = sb;
        srv->n_pool++;
        pool_save(srv);
        hutch_error err = { 0 };
        snprintf(sb->template_id, sizeof sb->template_id, "%s", tpl);
        snprintf(sb->pool_version, sizeof sb->pool_version, "%s", interp ? iver : ver);
        sb->cpu_count = (int64_t) srv->cfg.cpu_count;
        sb->memory_mb = (int64_t) srv->cfg.memory_mb;
        sb->disk_mb = (int64_t) srv->cfg.disk_mb;
        int r = sbx_engine_start(srv, sb, tpl, NULL, NULL, NULL, 0, false, &err);
        /* a code-interpreter one starts its kernels now (startcmd.c) */
        if (r >= 0 && interp && (r = startcmd_pool_begin(srv, sb, &err)) < 0) {
                loop_del(srv, &sb->w);
                hutch_error e2 = { 0 };
                (void) hutch_sandbox_destroy(sb->h, &e2);
                sb->h = hutch_sandbox_unref(sb->h);
        }
        /* its proxy's listener now, bound in its netns, rather than at the
         * claim on the create's path (a failure leaves that to the claim) */
        if (r >= 0 && egress_sbx_pool_open(srv, sb) < 0)
                log_warning("warm pool: sandbox %s: its egress listener waits for its claim", sb->id);
        if (r < 0) {
                log_warning("warm pool: creating a sandbox failed (%s); trying again in 10 s", err.msg);
                srv->pool = sb->next;
                srv->n_pool--;
                sbx_release(sb);
                pool_save(srv);
                srv->pool_backoff_ms = wall_ms() + 10000;
        }
}

void sbx_pool_sync(server *srv) {
        if (srv->pool_dirty)
                pool_save(srv);
}

void sbx_pool_destroy(server *srv) {
        while (srv->pool) {
                sbx *sb = srv->pool;
                srv->pool = sb->next;
                if (!sb->dead) {
                        loop_del(srv, &sb->w);
                        hutch_error err = { 0 };
                        if (hutch_sandbox_destroy(sb->h, &err) < 0)
                                log_warning("warm pool: destroying %s: %s", sb->id, err.msg);
                }
                sbx_release(sb);
        }
        srv->n_pool = 0;
        pool_save(srv);
}

void sbx_pool_cleanup_previous(server *srv) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/pool-ids", srv->cfg.data_dir);
        FILE *f = fopen(path, "re");
        if (!f)
                return;
        char line[64];
        while (fgets(line, sizeof line, f)) {
                line[strcspn(line, "\r\n")] = 0;
                if (strlen(line) != HUTCH_ID_LEN || sbx_find(srv, line))
                        continue;
                store_sandbox row = { 0 };
                hutch_error err = { 0 };
                if (store_sandbox_get(srv->store, line, &row, &err) >= 0) {
                        store_sandbox_clear(&row); /* claimed just before a crash: a real sandbox */
                        continue;
                }
                log_info("warm pool: removing %s, left by a previous run", line);
                (void) hutch_sandbox_remove(srv->ctx, line, &err);
        }
        fclose(f);
        (void) unlink(path);
}

/* NAME=BACKEND,NAME=BACKEND: every entry checked; the backend named for
 * template_name (NULL: check only) to *ret, NULL when none. */
static int template_backends_parse(const char *setting, const char *template_name, const char **ret, char *why,
                                   size_t whylen) {
        *ret = NULL;
        for (const char *p = setting; *p;) {
                const char *end = strchr(p, ',');
                size_t n = end ? (size_t) (end - p) : strlen(p);
                const char *eq = memchr(p, '=', n);
                char tname[32] = "", bname[16] = "";
                if (eq && eq > p && (size_t) (eq - p) < sizeof tname && n - (size_t) (eq - p) - 1 < sizeof bname) {
                        memcpy(tname, p, (size_t) (eq - p));
                        memcpy(bname, eq + 1, n - (size_t) (eq - p) - 1);
                }
                int backend = hutch_backend_from_name(bname);
                if (!streq(tname, "base") && !streq(tname, "host") && !template_is_interp(tname))
                        backend = -EINVAL;
                if (backend < 0) {
                        snprintf(why, whylen,
                                 "'%.*s' is not TEMPLATE=BACKEND (templates: base, host, code-interpreter-v1, "
                                 "code-interpreter; backends: ns, gvisor)",
                                 (int) MIN(n, 64), p);
                        return -EINVAL;
                }
                if (template_name && streq(tname, template_name))
                        *ret = hutch_backend_name(backend);
                p += n + (end ? 1 : 0);
        }
        return 0;
}

int template_backends_check(const char *setting, char *why, size_t whylen) {
        const char *unused;
        return template_backends_parse(setting, NULL, &unused, why, whylen);
}

const char *template_backend(const char *setting, const char *template_name) {
        const char *b;
        char why[160];
        return template_backends_parse(setting, template_name, &b, why, sizeof why) < 0 ? NULL : b;
}

static void tpl_env_free(json_t **j) {
        json_decref(*j);
}

/* A create's sandbox.create event and its ledger row, in one transaction;
 * for a warm sandbox the caller's, which holds its row too. On failure
 * nothing of it is written. */
static int sbx_create_record(server *srv, sbx *sb, uint64_t timeout_s, hutch_error *err) {
        int r = store_begin(srv->store, err);
        if (r < 0)
                return r;
        char detail[128];
        snprintf(detail, sizeof detail, "{\"template\":\"%s\",\"timeout\":%llu}", sb->template_id,
                 (unsigned long long) timeout_s);
        r = store_event_add(srv->store, sb->team_id, sb->id, "sandbox.create", detail, err);
        if (r >= 0)
                usage_sandbox_start(srv, sb); /* a failed write is retried by the next flush */
        if (r >= 0)
                r = store_commit(srv->store, err);
        else
                store_rollback(srv->store);
        if (r < 0)
                usage_sandbox_forget(srv, sb);
        return r;
}

/* A warm sandbox whose create failed before it was answered: nobody may
 * get it now that its id is spoken for. The create's transaction is rolled
 * back (no row, no event, no ledger row); the sandbox is destroyed and
 * released at the next turn, as an epoll batch may still hold an event for
 * it; pool-ids is rewritten without it. */
static void warm_discard(server *srv, sbx *sb) {
        store_rollback(srv->store);
        usage_sandbox_forget(srv, sb);
        hutch_error e2 = { 0 };
        egress_sbx_stop(srv, sb);
        loop_del(srv, &sb->w);
        (void) hutch_sandbox_destroy(sb->h, &e2);
        sb->dead = true;
        sbx_link(srv, sb);
        pool_save(srv);
}

int sbx_create(server *srv, int64_t team, json_t *body, sbx **ret, unsigned *ret_status, hutch_error *err) {
        *ret_status = 400;
        create_request cr;
        char why[256];
        int r = create_request_parse(body, srv->cfg.default_timeout_s, srv->cfg.max_timeout_s, &cr, why, sizeof why);
        if (r < 0)
                return hutch_error_set(err, r, "%s", why);
        const char *template_name, *alias;
        char layer_from[PATH_MAX] = "";
        /* an image template's Env, under the create's envVars */
        json_t *tpl_env __attribute__((cleanup(tpl_env_free))) = NULL;
        char tpl_workdir[PATH_MAX] = "";
        store_snapshot snap = { 0 };
        _cleanup_(json_decrefp) json_t *built = NULL; /* a built template's ready build */
        char built_tid[32] = "", built_alias[64] = "", snap_base[64];
        char build_layer[PATH_MAX] = ""; /* a built template's layer under a gvisor checkpoint */
        /* "base": the built base template when there is one (an image
         * template, by the branch for names below), else the host's */
        if (template_names_host(srv->cfg.data_dir, cr.template_id)) {
                template_name = "host";
                alias = cr.template_id;
        } else if (template_is_interp(cr.template_id)) {
                template_name = cr.template_id; /* the host template with start commands */
                alias = cr.template_id;
        } else if (snapshot_id_valid(cr.template_id)) {
                /* from a snapshot: its layer, verified and unsealed now */
                if ((r = store_snapshot_get(srv->store, team, cr.template_id, &snap, err)) < 0) {
                        *ret_status = 404;
                        return hutch_error_set(err, -ENOENT, "template '%s' not found", cr.template_id);
                }
                /* the template it was taken from, when that is an image one:
                 * the snapshot is only its writable layer */
                template_name = "host";
                if (templates_snapshot_base(srv, team, snap.template_id, snap_base,
                                            sizeof snap_base, build_layer, sizeof build_layer) == 0)
                        template_name = snap_base; /* taken from a built template: its base */
                else if (snap.template_id[0] && !streq(snap.template_id, "host") &&
                         !snapshot_id_valid(snap.template_id) &&
                         template_validate_name(snap.template_id) == 0)
                        template_name = snap.template_id;
                alias = cr.template_id;
        } else if (templates_resolve(srv, team, cr.template_id, built_tid, built_alias, &built,
                                     err) == 0) {
                /* a template the team built (templates.c): its base template
                 * (host, or an image one) under the build's cached layer */
                const char *base = json_string_value(json_object_get(built, "baseTemplate"));
                template_name = base && *base ? base : "host";
                alias = built_alias;
                const char *layer = json_string_value(json_object_get(built, "layer"));
                if (layer && *layer && templates_layer_path(srv, layer, layer_from, sizeof layer_from) < 0) {
                        *ret_status = 500;
                        return hutch_error_set(err, -ENOENT, "template '%s': its layer is missing",
                                               cr.template_id);
                }
                const char *wd = json_string_value(json_object_get(built, "workdir"));
                if (wd && *wd)
                        snprintf(tpl_workdir, sizeof tpl_workdir, "%s", wd);
                hutch_template *t = NULL;
                hutch_error e2 = { 0 };
                if (!streq(template_name, "host") && template_resolve(srv->cfg.data_dir, template_name, &t, &e2) == 0) {
                        /* the image's Env, as for a create from the image itself */
                        tpl_env = template_env_json(t);
                        template_free(t);
                }
        } else if (template_validate_name(cr.template_id) == 0) {
                /* an image (build, snapshot) template, by its name: its
                 * Env and WorkingDir become the sandbox's defaults */
                hutch_template *t = NULL;
                hutch_error e2 = { 0 };
                if (template_resolve(srv->cfg.data_dir, cr.template_id, &t, &e2) < 0 ||
                    (t->team && t->team != team)) {
                        if (t)
                                template_free(t);
                        else if (e2.code != -ENOENT)
                                log_warning("template '%s': %s", cr.template_id, e2.msg);
                        *ret_status = 404;
                        return hutch_error_set(err, -ENOENT, "template '%s' not found",
                                               cr.template_id);
                }
                tpl_env = template_env_json(t);
                if (t->workdir)
                        snprintf(tpl_workdir, sizeof tpl_workdir, "%s", t->workdir);
                template_free(t);
                template_name = cr.template_id;
                alias = cr.template_id;
        } else {
                *ret_status = 404;
                return hutch_error_set(err, -ENOENT, "template '%s' not found", cr.template_id);
        }
        uint64_t timeout_s = cr.timeout_s;
        json_t *md = cr.metadata, *envs = cr.env;
        json_t *egress_spec = NULL, *mounts = NULL;
        {
                char vwhy[4096];
                if ((r = volumes_mounts_parse(srv, team, body, &mounts, vwhy, sizeof vwhy)) < 0)
                        return hutch_error_set(err, r, "%s", vwhy);
        }
        if ((r = egress_spec_from_create(srv, body, &egress_spec, why, sizeof why)) < 0) {
                json_decref(mounts);
                return hutch_error_set(err, r, "%s", why);
        }
        /* secret references in envVars: checked now, placeholders once the id is known */
        if (json_is_object(envs)) {
                json_t *copy = json_deep_copy(envs), *names = json_array();
                r = secrets_env_rewrite(srv, team, "check", copy, names, why, sizeof why);
                json_decref(copy);
                json_decref(names);
                if (r < 0) {
                        json_decref(egress_spec);
                        json_decref(mounts);
                        return hutch_error_set(err, r, "%s", why);
                }
        }
        if ((uint64_t) sbx_live_count(srv, team) >= srv->cfg.max_sandboxes_per_team) {
                *ret_status = 429;
                json_decref(egress_spec);
                json_decref(mounts);
                return hutch_error_set(err, -EAGAIN, "team has reached its limit of %llu live sandboxes",
                                       (unsigned long long) srv->cfg.max_sandboxes_per_team);
        }

        bool borrowed = built != NULL; /* a fork's stream, unsealed once for all its sandboxes; a build's layer */
        const char *layer_image = NULL; /* and the image a worker made from it, taken over */
        if (snap.id[0] && srv->fork_stream[0] && streq(srv->fork_snapshot, snap.id)) {
                snprintf(layer_from, sizeof layer_from, "%s", srv->fork_stream);
                borrowed = true;
                if (srv->fork_image[0])
                        layer_image = srv->fork_image;
        } else if (snap.id[0]) {
                r = snapshot_unseal(srv, team, snap.id, &snap, layer_from, sizeof layer_from, err);
                if (r < 0) {
                        *ret_status = r == -EBADMSG ? 422 : 500;
                        json_decref(egress_spec);
                        json_decref(mounts);
                        return r;
                }
        }
        /* a warm sandbox if one is ready: create then only writes a row */
        /* a snapshot says which backend it is for: a gvisor one is a memory
         * checkpoint (it starts where it was), a namespace one a layer */
        bool checkpoint = layer_from[0] && hutch_stream_is_checkpoint(layer_from);
        /* the create's word, else the snapshot's kind, else the template's
         * default, else the operator's */
        const char *tb = snap.id[0] ? NULL : template_backend(srv->cfg.template_backends, alias);
        int backend = hutch_backend_from_name(cr.backend           ? cr.backend
                                                      : snap.id[0] ? (checkpoint ? "gvisor" : "ns")
                                                      : tb         ? tb
                                                                   : srv->cfg.backend);
        if (!checkpoint)
                build_layer[0] = 0; /* an ns snapshot's layer holds the build's files already */
        if (snap.id[0] && checkpoint != !!(hutch_backend_caps(backend) & HUTCH_BACKEND_CHECKPOINTS)) {
                *ret_status = 409;
                json_decref(egress_spec);
                json_decref(mounts);
                if (layer_from[0] && !borrowed)
                        unlink(layer_from);
                return hutch_error_set(err, -EOPNOTSUPP, "snapshot %s is of a %s sandbox; it cannot start a %s one",
                                       snap.id, checkpoint ? "gvisor" : "namespace (ns)", hutch_backend_name(backend));
        }
        /* runsc restores a checkpoint into the mounts it was taken with only
         * (the engine refuses it too; here it is a 409, before anything) */
        if (snap.id[0] && checkpoint && mounts) {
                *ret_status = 409;
                json_decref(egress_spec);
                json_decref(mounts);
                if (layer_from[0] && !borrowed)
                        unlink(layer_from);
                return hutch_error_set(
                        err, -EOPNOTSUPP,
                        "snapshot %s is of a gvisor sandbox: a sandbox restored from it cannot "
                        "mount volumes (docs/volumes.md)",
                        snap.id);
        }
        /* GPUs: refused before anything is written when they cannot be had
         * now, so that such a create changes nothing (a `hutch run` that
         * takes them in between makes the engine's create fail: 409 too) */
        bool want_gpus = hutch_gpu_spec_check(cr.gpus, NULL) > 0;
        if (want_gpus) {
                if (backend == HUTCH_BACKEND_GVISOR)
                        r = hutch_error_set(err, -EOPNOTSUPP,
                                            "gpus are not supported on the gvisor backend: runsc reaches a GPU only "
                                            "through its nvproxy (runsc --nvproxy), which hutch does not set up "
                                            "(docs/gpu.md); use the ns backend");
                else
                        r = hutch_gpu_check(srv->ctx, cr.gpus, err);
                if (r < 0) {
                        *ret_status = r == -EBUSY ? 409 : 400;
                        json_decref(egress_spec);
                        json_decref(mounts);
                        if (layer_from[0] && !borrowed)
                                unlink(layer_from);
                        return r;
                }
        }
        /* the pool holds sandboxes of the operator's default backend */
        bool poolable = (streq(template_name, "host") || streq(template_name, "base") ||
                         template_is_interp(template_name)) &&
                !snap.id[0] && !mounts && !built && !want_gpus &&
                backend == hutch_backend_from_name(srv->cfg.backend);
        sbx *sb = poolable ? pool_take(srv, template_name) : NULL;
        /* gvisor: else a code interpreter from the checkpoint of a started
         * one, when there is one (its kernels are up: the create answers
         * once it has its envs, as a pooled one does) */
        char interp_ckpt[PATH_MAX] = "";
        if (!sb && poolable && template_is_interp(template_name) && backend == HUTCH_BACKEND_GVISOR &&
            interp_ckpt_path(srv, interp_ckpt, sizeof interp_ckpt)) {
                srv->interp_ckpt_wanted = true; /* the pool takes one, if there is none */
                if (access(interp_ckpt, R_OK) == 0) {
                        snprintf(layer_from, sizeof layer_from, "%s", interp_ckpt);
                        checkpoint = borrowed = true;
                } else
                        interp_ckpt[0] = 0;
        } else
                interp_ckpt[0] = 0;
        if (!sb) {
                sb = sbx_alloc(srv);
                if (!sb) {
                        json_decref(egress_spec);
                        json_decref(mounts);
                        if (layer_from[0] && !borrowed)
                                unlink(layer_from);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                node_sandbox_id_new(srv, sb->id);
                sb->backend = backend;
        }
        sb->team_id = team;
        snprintf(sb->template_id, sizeof sb->template_id, "%s", snap.id[0] ? snap.id : built ? built_tid : template_name);
        snprintf(sb->alias, sizeof sb->alias, "%s", alias);
        sb->metadata = json_is_object(md) ? json_deep_copy(md) : json_object();
        sb->envs = json_is_object(envs) ? json_deep_copy(envs) : json_object();
        if (tpl_env) {
                json_object_update(tpl_env, sb->envs);
                json_decref(sb->envs);
                sb->envs = tpl_env;
                tpl_env = NULL;
        }
        sb->on_timeout_pause = cr.on_timeout_pause;
        sb->auto_resume = cr.auto_resume;
        sb->pause_keep_memory = cr.pause_keep_memory;
        sb->extra = extra_json(sb, body);
        json_object_set_new(sb->extra, "timeoutS", json_integer((json_int_t) timeout_s)); /* auto-resume's */
        json_object_set_new(sb->extra, "egress", egress_spec);
        if (mounts)
                json_object_set_new(sb->extra, "volumeMounts", mounts);
        if (want_gpus) /* the request; the engine's state says which GPUs it got */
                json_object_set_new(sb->extra, "gpus", json_string(cr.gpus));
        if (tpl_workdir[0])
                json_object_set_new(sb->extra, "workdir", json_string(tpl_workdir));
        if (built)
                json_object_set(sb->extra, "template", built); /* user, workdir, startCmd, readyCmd */
        {
                json_t *names = json_array();
                if (secrets_env_rewrite(srv, team, sb->id, sb->envs, names, why, sizeof why) < 0)
                        log_warning("sandbox %s: %s", sb->id, why); /* a secret deleted since the check */
                json_object_set_new(sb->extra, "secretRefs", names);
        }
        sb->cpu_count = (int64_t) srv->cfg.cpu_count;
        sb->memory_mb = (int64_t) srv->cfg.memory_mb;
        sb->disk_mb = snap.id[0] ? snap.disk_mb : (int64_t) srv->cfg.disk_mb;
        sb->started_ms = wall_ms();
        sb->end_ms = sb->started_ms + (int64_t) timeout_s * 1000;

        uint8_t nb[16];
        if (getrandom(nb, sizeof nb, 0) != (ssize_t) sizeof nb)
                abort();
        store_sandbox row = { 0 };
        hex(nb, sizeof nb, row.token_nonce);
        sbx_token_derive(srv, sb->id, row.token_nonce, sb->token);
        sha256_hex(sb->token, row.token_hash);
        memcpy(row.id, sb->id, sizeof row.id);
        row.team_id = team;
        snprintf(row.template_id, sizeof row.template_id, "%s", sb->template_id);
        snprintf(row.alias, sizeof row.alias, "%s", sb->alias);
        row.state = STORE_SBX_RUNNING;
        row.started_ms = sb->started_ms;
        row.end_ms = sb->end_ms;
        row.metadata_json = json_dumps(sb->metadata, JSON_COMPACT);
        row.env_json = json_dumps(sb->envs, JSON_COMPACT);
        row.extra_json = json_dumps(sb->extra, JSON_COMPACT);
        row.cpu_count = sb->cpu_count;
        row.memory_mb = sb->memory_mb;
        row.disk_mb = sb->disk_mb;
        /* until the 201 has been sent: a crash before that leaves a sandbox
         * no client knows of, which the next start removes (readopt_one) */
        row.unanswered = true;

        /* A warm one exists already, and pool-ids (rewritten at the end of
         * this turn) still names it: its row, its sandbox.create event and
         * its ledger row are one transaction, and a crash before the commit
         * leaves a listed id without a row, which the next start removes
         * (sbx_pool_cleanup_previous). */
        bool warm = sb->h != NULL;
        r = warm ? store_begin(srv->store, err) : 0;
        /* The row comes first: a crash between here and the engine leaves a
         * row whose sandbox is missing (ended at the next start), never a
         * sandbox that no row owns. */
        if (r >= 0)
                r = store_sandbox_insert(srv->store, &row, err);
        store_sandbox_clear(&row);
        if (r >= 0 && warm)
                r = sbx_create_record(srv, sb, timeout_s, err);
        if (r >= 0 && warm)
                r = store_commit(srv->store, err);
        if (r < 0) {
                *ret_status = 500;
                if (warm) {
                        warm_discard(srv, sb);
                        return r;
                }
                goto fail;
        }
        if (warm)
                goto ready;
        r = sbx_engine_start(srv, sb, template_name, layer_from[0] ? layer_from : NULL,
                             build_layer[0] ? build_layer : NULL, layer_image, srv->fork_image_base, checkpoint, err);
        if (r < 0 && interp_ckpt[0]) {
                /* runsc changed under it, or the file is damaged: gone, and
                 * this create starts its kernels; the pool takes a new one */
                log_warning("sandbox %s: restoring the interpreter checkpoint %s failed (%s): removed; "
                            "this create starts its kernels",
                            sb->id, interp_ckpt, err->msg);
                unlink(interp_ckpt);
                interp_ckpt[0] = layer_from[0] = 0;
                checkpoint = false;
                *err = (hutch_error){ 0 };
                r = sbx_engine_start(srv, sb, template_name, NULL, NULL, NULL, 0, false, err);
        }
        if (r >= 0 && interp_ckpt[0]) {
                sb->start_done = true; /* sbx_start_answer gives it its envs, and answers */
                log_info("sandbox %s: restored from the interpreter checkpoint", sb->id);
        }
        if (layer_image)
                srv->fork_image[0] = 0; /* the engine's now (or removed by its failure) */
        if (layer_from[0]) {
                if (!borrowed)
                        unlink(layer_from); /* the engine copied it into the layer image */
                layer_from[0] = 0;
        }
        if (r < 0) {
                /* out of descriptors is the daemon's limit, not a fault: 503,
                 * and the message says which limit */
                *ret_status = r == -EMFILE || r == -ENFILE ? 503 : r == -EBUSY && want_gpus ? 409 : 500;
                unsigned open_fds = 0, limit = 0;
                if ((r == -EMFILE || r == -ENFILE) && server_fds(&open_fds, &limit) == 0 &&
                    open_fds + SERVER_FDS_RESERVE > limit)
                        hutch_error_wrap(err, r, "the daemon is out of open files (%u of %u in use)", open_fds, limit);
                hutch_error e2 = { 0 };
                (void) store_sandbox_end(srv->store, sb->id, wall_ms(), "create failed", &e2);
                goto fail;
        }
        {
                /* its event and ledger row: one more transaction (best
                 * effort, as they were one by one: the row is what matters) */
                hutch_error e2 = { 0 };
                if (sbx_create_record(srv, sb, timeout_s, &e2) < 0)
                        log_warning("sandbox %s: recording its create: %s", sb->id, e2.msg);
        }
ready:
        sb->next_sample_ms = wall_ms();
        sbx_link(srv, sb);
        if ((r = warm ? egress_sbx_claim(srv, sb) : egress_sbx_start(srv, sb)) < 0) {
                /* its row and sandbox exist: end both the usual way */
                *ret_status = 500;
                hutch_error_set(err, r, "cannot open the sandbox's egress proxy: %s", strerror(-r));
                sbx_kill(srv, sb, "create failed");
                return r;
        }
        /* restored from a memory checkpoint: its processes run; find them */
        if (checkpoint)
                proc_readopt(srv, sb);
        metrics_sandbox_created(srv);
        audit_sandbox_created(srv, sb);
        /* pool-ids is rewritten at the end of the turn, after the 201 has
         * been written (server.c): until then it names this sandbox, whose
         * row the next start finds */
        *ret = sb;
        return 0;
fail:
        if (layer_from[0] && !borrowed)
                unlink(layer_from);
        json_decref(sb->metadata);
        json_decref(sb->envs);
        json_decref(sb->extra);
        hutch_sandbox_unref(sb->h);
        free(sb);
        return r;
}

int sbx_create_note(request *req, const sbx *sb) {
        char(*v)[HUTCH_ID_LEN + 1] = reallocarray(req->created, req->n_created + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        memcpy(v[req->n_created++], sb->id, sizeof v[0]);
        req->created = v;
        return 0;
}

/* When a create counts as answered: once its 201 is queued, which is just
 * before libmicrohttpd writes it (in the same call, after the handler
 * returns). The completion callback, after the write, was the first choice:
 * but a kill -9 between the write and the database write it then makes
 * (about 0.5 ms here) removed, at the next start, a sandbox its client had
 * been told of: 7 of 20 kill -9s sent right after a client got its 201. In
 * this order the database is written before the answer leaves, and what is
 * left is a crash in the microseconds between the two, which leaves a
 * sandbox kept without an answer. */
static void created_set_answered(server *srv, request *req, bool answered) {
        const char *ids[64];
        for (unsigned i = 0; i < req->n_created; i += ELEMENTSOF(ids)) {
                size_t n = MIN(req->n_created - i, ELEMENTSOF(ids));
                for (size_t k = 0; k < n; k++)
                        ids[k] = req->created[i + k];
                hutch_error err = { 0 };
                if (store_sandbox_set_answered(srv->store, ids, n, answered, &err) < 0)
                        log_warning("sandbox %s: database: %s", ids[0], err.msg);
        }
}

void sbx_create_queued(server *srv, request *req) {
        created_set_answered(srv, req, true);
}

void sbx_create_answered(server *srv, request *req, enum MHD_RequestTerminationCode toe) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
                created_set_answered(srv, req, false);
        for (unsigned i = 0; toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && i < req->n_created; i++) {
                const char *id = req->created[i];
                /* the daemon stops with the answer unsent: the sandbox stays
                 * (sandboxes outlive the daemon), the next start removes it */
                if (toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
                        continue;
                sbx *sb = sbx_find(srv, id);
                if (!sb)
                        continue;
                log_info("sandbox %s: its create was never answered (the client went away): removing it", id);
                sbx_kill(srv, sb, "create unanswered");
        }
        req->n_created = 0;
}

void sbx_cut_streams(server *srv, sbx *sb) {
        for (stream *st = srv->streams; st; st = st->next)
                if (st->sb == sb)
                        stream_cut(st);
        ingress_sbx_cut(srv, sb);
}

static void pause_image_remove(server *srv, const char *id);

static void sbx_detach_all(server *srv, sbx *sb) {
        ingress_sbx_cut(srv, sb);
        for (stream *st = srv->streams; st; st = st->next)
                if (st->sb == sb) {
                        stream_cut(st);
                        st->sb = NULL;
                        st->proc = NULL;
                        st->next_in_proc = NULL;
                }
        for (proc *p = sb->procs; p; p = p->next) {
                int out = p->out_w.fd, errfd = p->err_w.fd;
                loop_del(srv, &p->out_w);
                loop_del(srv, &p->err_w);
                safe_close(out);
                safe_close(errfd);
                p->out_eof = p->err_eof = true;
                loop_del(srv, &p->in_w); /* its fd is in_fd, closed by proc_free */
                p->subs = NULL;
                p->timeout_stream = NULL;
        }
        loop_del(srv, &sb->w);
}

static void sbx_finish_destroy(server *srv, sbx *sb) {
        if (sb->dying) {
                loop_del(srv, &sb->gone_w);
                sb->dying = false;
        }
        hutch_error err = { 0 };
        int64_t t0 = wall_ms();
        int r = hutch_sandbox_destroy(sb->h, &err);
        if (wall_ms() - t0 > 100)
                log_warning("sandbox %s: destroy took %lld ms", sb->id, (long long) (wall_ms() - t0));
        if (sb->kill_t0_ns && !sb->pooled) {
                metrics_sandbox_killed(srv, clock_ns(CLOCK_MONOTONIC) - sb->kill_t0_ns);
                sb->kill_t0_ns = 0;
        }
        if (r < 0) {
                log_warning("sandbox %s: destroy: %s (trying remove by id)", sb->id, err.msg);
                hutch_error e2 = { 0 };
                r = hutch_sandbox_remove(srv->ctx, sb->id, &e2);
                if (r < 0)
                        log_error("sandbox %s: %s", sb->id, e2.msg);
        }
        trash_kick(srv); /* its layer image */
}

/* The teardown (layer image, cgroup, state dir: about 100 ms here) is not
 * run in the epoll batch that reports init gone: a team that killed twenty
 * sandboxes at once would hold the loop for all twenty. sbx_reap runs one
 * per loop turn, after the turn's requests were served. */
static void on_init_gone(server *srv, watcher *w, uint32_t revents) {
        sbx *sb = w->data;
        loop_del(srv, &sb->gone_w); /* level-triggered: it would fire again */
        if (sb->dying)
                sb->gone = true;
}

bool sbx_reap(server *srv) {
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (sb->dying && sb->gone) {
                        sbx_finish_destroy(srv, sb);
                        return true;
                }
        return false;
}

int sbx_reattach(server *srv, sbx *sb) {
        sbx_detach_all(srv, sb); /* streams cut, process and init watchers gone */
        while (sb->procs) {
                proc *p = sb->procs;
                sb->procs = p->next;
                proc_free(p);
        }
        int r = register_init(srv, sb);
        if (r >= 0)
                proc_readopt(srv, sb);
        /* gvisor: the new relay has a network namespace of its own, where
         * the proxy's site must listen again (same policy; the old site's
         * connections went with the old relay) */
        egress_sbx_stop(srv, sb);
        if (egress_sbx_start(srv, sb) < 0)
                log_warning("sandbox %s: its egress proxy did not come back", sb->id);
        return r;
}

int sbx_kill(server *srv, sbx *sb, const char *reason) {
        if (sb->dead)
                return 0;
        sb->kill_t0_ns = clock_ns(CLOCK_MONOTONIC);
        snapjob_sandbox_killed(srv, sb); /* a copy of its layer stops here */
        usage_sandbox_end(srv, sb);
        metrics_sandbox_end(srv, sb, reason);
        sbx_detach_all(srv, sb);
        egress_sbx_stop(srv, sb);
        pause_image_remove(srv, sb->id);
        sb->dead = true;
        /* Kill now, clean up when the kernel has taken every process down
         * (tearing down a pid namespace of many processes takes a while):
         * the loop does not wait for it. */
        hutch_error err = { 0 };
        int pfd = sb->pooled ? -1 : hutch_sandbox_kill_begin(sb->h, &err);
        if (pfd >= 0) {
                sb->gone_w.cb = on_init_gone;
                sb->gone_w.data = sb;
                if (loop_add(srv, &sb->gone_w, pfd, EPOLLIN) >= 0) {
                        sb->dying = true;
                        sb->dying_since_ms = wall_ms();
                } else
                        sb->gone_w.fd = -1;
        }
        if (!sb->dying)
                sbx_finish_destroy(srv, sb);
        if (sb->pooled)
                return 0;
        hutch_error e3 = { 0 };
        if (store_sandbox_end(srv->store, sb->id, wall_ms(), reason, &e3) < 0)
                log_error("sandbox %s: database: %s", sb->id, e3.msg);
        char detail[64];
        snprintf(detail, sizeof detail, "{\"reason\":\"%s\"}", reason);
        (void) store_event_add(srv->store, sb->team_id, sb->id, "sandbox.end", detail, &e3);
        log_debug("sandbox %s: ended (%s)", sb->id, reason);
        return 0;
}

void save_sandbox_extra(server *srv, sbx *sb) {
        json_t *old = sb->extra;
        sb->extra = extra_json(sb, NULL);
        /* what create said about the network and the volumes stays */
        const char *keep[] = { "network", "allowInternetAccess", "egress", "secretRefs", "volumeMounts", "timeoutS" };
        for (size_t i = 0; i < ELEMENTSOF(keep); i++) {
                json_t *v = json_object_get(old, keep[i]);
                if (v)
                        json_object_set(sb->extra, keep[i], v);
        }
        json_decref(old);
        char *e = json_dumps(sb->extra, JSON_COMPACT);
        hutch_error err = { 0 };
        if (e && store_sandbox_set_extra(srv->store, sb->id, e, &err) < 0)
                log_warning("sandbox %s: database: %s", sb->id, err.msg);
        free(e);
}

/* ------------------------------------------- gvisor: pause to disk, resume */

/* A paused gvisor sandbox is a memory checkpoint sealed like a snapshot
 * (per-team key, bound to the sandbox's id) under DATA_DIR/paused; its
 * runtime is gone, its memory freed. */
#define PAUSE_IMAGE_MAX (1ull << 42)

void sbx_pause_image_path(server *srv, const char *id, char *buf, size_t n) {
        snprintf(buf, n, "%s/paused/%s.seal", srv->cfg.data_dir, id);
}

static void pause_context(const sbx *sb, char *buf, size_t n) {
        snprintf(buf, n, "hutch pause team:%lld sandbox:%s", (long long) sb->team_id, sb->id);
}

static void pause_image_remove(server *srv, const char *id) {
        char path[PATH_MAX];
        sbx_pause_image_path(srv, id, path, sizeof path);
        (void) unlink(path);
}

int sbx_pause_image_read(server *srv, sbx *sb, int out_fd, hutch_error *err) {
        char path[PATH_MAX], ctx[160], why[256] = "";
        sbx_pause_image_path(srv, sb->id, path, sizeof path);
        pause_context(sb, ctx, sizeof ctx);
        int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return hutch_error_set(err, -errno, "sandbox %s: its paused image: %m", sb->id);
        int r = seal_read_fd(in, out_fd, srv->data_key, ctx, PAUSE_IMAGE_MAX, why, sizeof why);
        close(in);
        if (r == -EBADMSG || r == -EPERM) {
                log_warning("sandbox %s: paused image refused: %s", sb->id, why);
                return hutch_error_set(err, -EBADMSG, "the paused sandbox's image does not authenticate (damaged or altered)");
        }
        if (r < 0)
                return hutch_error_set(err, r, "reading the paused sandbox's image: %s", why[0] ? why : strerror(-r));
        return 0;
}

static int pause_to_disk(server *srv, sbx *sb, hutch_error *err) {
        char dir[PATH_MAX], tmp[PATH_MAX], final[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/paused", srv->cfg.data_dir);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return hutch_error_set(err, -errno, "%s: %m", dir);
        /* never into the host's last free space: the image is about the
         * sandbox's memory, written twice (plain, then sealed) */
        hutch_stats st;
        hutch_error e0 = { 0 };
        uint64_t mem = hutch_sandbox_stats(sb->h, &st, &e0) >= 0 ? st.memory_current : 0;
        if (!data_disk_has_room(srv, dir, mem))
                return hutch_error_set(err, -ENOSPC, "not enough free disk to pause this sandbox with its memory");
        snprintf(tmp, sizeof tmp, "%s/.image-XXXXXX", dir);
        int lfd = mkostemp(tmp, O_CLOEXEC);
        if (lfd < 0)
                return hutch_error_set(err, -errno, "temporary file: %m");
        /* the control connection ends with the runtime */
        loop_del(srv, &sb->w);
        uint64_t bytes = 0;
        int r = hutch_sandbox_suspend(sb->h, lfd, &bytes, err);
        if (r < 0) {
                close(lfd);
                unlink(tmp);
                /* it runs on (never stopped, or restored at once) */
                if (hutch_sandbox_fd(sb->h) >= 0 && sbx_reattach(srv, sb) < 0)
                        log_error("sandbox %s: watching its control connection again failed", sb->id);
                return r;
        }
        /* what ran through the old relay is gone with it */
        sbx_detach_all(srv, sb);
        egress_sbx_stop(srv, sb);
        sbx_pause_image_path(srv, sb->id, final, sizeof final);
        char ctx[160], why[256] = "";
        pause_context(sb, ctx, sizeof ctx);
        r = sealed_file_write(srv, lfd, final, ctx, NULL, why, sizeof why);
        close(lfd);
        if (r < 0) {
                hutch_error_set(err, r, "sealing the paused sandbox's image: %s", why);
                /* no image kept: bring it back from the plain one at once */
                hutch_error e2 = { 0 };
                if (hutch_sandbox_resume_from(sb->h, tmp, &e2) < 0 || sbx_reattach(srv, sb) < 0)
                        log_error("sandbox %s: restoring it after a failed pause: %s", sb->id, e2.msg);
                unlink(tmp);
                return r;
        }
        unlink(tmp);
        log_debug("sandbox %s: paused to disk (%llu bytes of checkpoint)", sb->id, (unsigned long long) bytes);
        return 0;
}

static int resume_from_disk(server *srv, sbx *sb, hutch_error *err) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s/paused/.resume-XXXXXX", srv->cfg.data_dir);
        int out = mkostemp(tmp, O_CLOEXEC);
        if (out < 0)
                return hutch_error_set(err, -errno, "temporary file: %m");
        int r = sbx_pause_image_read(srv, sb, out, err);
        close(out);
        if (r >= 0)
                r = hutch_sandbox_resume_from(sb->h, tmp, err);
        unlink(tmp);
        if (r < 0)
                return r; /* still suspended, its image kept: a later resume may work */
        pause_image_remove(srv, sb->id);
        if (sbx_reattach(srv, sb) < 0)
                log_error("sandbox %s: watching its control connection failed", sb->id);
        sb->procs_pending = false; /* found again just now */
        return 0;
}

int sbx_pause(server *srv, sbx *sb, bool keep_memory, hutch_error *err) {
        if (sb->paused)
                return hutch_error_set(err, -EALREADY, "sandbox %s is already paused", sb->id);
        if (sb->snapshotting)
                return hutch_error_set(err, -EBUSY, "sandbox %s: its layer is being copied", sb->id);
        /* watches go first: a frozen init cannot answer their removal */
        for (stream *st = srv->streams; st; st = st->next)
                if (st->sb == sb && st->kind == STREAM_WATCH && st->watch_id) {
                        hutch_error e = { 0 };
                        (void) hutch_fs_watch_remove(sb->h, st->watch_id, &e);
                        st->watch_id = 0;
                }
        /* a backend that checkpoints (gvisor): to disk, memory freed; else
         * (ns) the cgroup freezer */
        int r = hutch_backend_caps(sb->backend) & HUTCH_BACKEND_CHECKPOINTS
                ? pause_to_disk(srv, sb, err)
                : hutch_sandbox_freeze(sb->h, err);
        if (r < 0)
                return r;
        sb->paused = true;
        usage_storage_changed(srv); /* a gvisor checkpoint on disk is billed from now */
        /* open streams end without an end frame: the SDK reports a timeout */
        sbx_cut_streams(srv, sb);
        for (stream *st = srv->streams; st; st = st->next)
                if (st->sb == sb && st->proc) {
                        stream *s = st;
                        s->proc = NULL;
                }
        for (proc *p = sb->procs; p; p = p->next) {
                p->subs = NULL;
                p->timeout_stream = NULL;
        }
        /* Without memory, the resume reboots: what runs is gone then. The
         * processes stay frozen until that point (their memory is kept as
         * long as the sandbox is paused, like a memory pause). */
        sb->cold_resume = !keep_memory;
        save_sandbox_extra(srv, sb);
        hutch_error e2 = { 0 };
        (void) store_sandbox_set_state(srv->store, sb->id, STORE_SBX_PAUSED, &e2);
        (void) store_event_add(srv->store, sb->team_id, sb->id, "sandbox.pause",
                               keep_memory ? "{\"memory\":true}" : "{\"memory\":false}", &e2);
        return 0;
}

/* A reboot without a new sandbox: every process but init is killed, and
 * the boot id (the sandbox's own, see child.c) changes; the writable layer
 * is kept. Synchronous, so that nothing started after the resume can meet
 * the kill. */
static int sbx_cold_boot(server *srv, sbx *sb, hutch_error *err) {
        static const char *const argv[] = {
                "/bin/sh", "-c", "kill -KILL -1 2>/dev/null; cat /proc/sys/kernel/random/uuid > /run/hutch/boot_id",
                NULL,
        };
        static const char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        hutch_spawn_config sc = {
                .argv = argv, .envp = envp, .cwd = "/", .uid = 0, .gid = 0, .stdin_mode = HUTCH_STDIN_NULL,
        };
        hutch_process hp;
        int r = hutch_sandbox_spawn(sb->h, &sc, &hp, err);
        if (r < 0)
                return r;
        safe_close(hp.stdin_fd);
        safe_close(hp.stdout_fd);
        safe_close(hp.stderr_fd);
        /* bounded: the sandbox owns /bin/sh and could make it slow */
        int64_t deadline = wall_ms() + 2000;
        for (;;) {
                int64_t left = deadline - wall_ms();
                hutch_exit ex;
                if (left <= 0 || (r = hutch_sandbox_wait(sb->h, (int) left, &ex, err)) < 0) {
                        log_warning("sandbox %s: the reboot did not finish in time (%s); killing its group",
                                    sb->id, err->msg);
                        hutch_error e2 = { 0 };
                        (void) hutch_sandbox_signal(sb->h, hp.pid, SIGKILL, true, &e2);
                        break;
                }
                if (ex.pid == hp.pid)
                        break;
                proc_on_exit(srv, sb, &ex); /* one of the killed ones */
        }
        /* whatever the daemon still thinks runs was killed */
        for (proc *p = sb->procs; p; p = p->next)
                if (!p->exited) {
                        hutch_exit ex = { .pid = p->pid, .signal = SIGKILL, .cpu_us = -1 };
                        proc_on_exit(srv, sb, &ex);
                }
        sbx_mark_dirty(sb);
        return 0;
}

int sbx_resume(server *srv, sbx *sb, bool cold, hutch_error *err) {
        if (!sb->paused)
                return 0;
        /* a thaw now would let it write to the layer a worker copies */
        if (sb->snapshotting)
                return hutch_error_set(err, -EBUSY, "sandbox %s: its layer is being copied", sb->id);
        bool from_disk = hutch_sandbox_is_suspended(sb->h);
        int r = from_disk ? resume_from_disk(srv, sb, err) : hutch_sandbox_thaw(sb->h, err);
        if (r < 0)
                return r;
        sb->paused = false;
        usage_storage_changed(srv); /* its checkpoint's row closes */
        if (cold || sb->cold_resume) {
                if (sb->procs_pending)
                        sb->procs_pending = false; /* nothing to find again: it is all killed */
                r = sbx_cold_boot(srv, sb, err);
                if (r < 0)
                        return r;
                sb->cold_resume = false;
                save_sandbox_extra(srv, sb);
        }
        sbx_mark_dirty(sb);
        for (size_t i = 0; i < sb->n_pending_aborts; i++)
                hutch_fs_write_abort(sb->pending_aborts[i]);
        free(sb->pending_aborts);
        sb->pending_aborts = NULL;
        sb->n_pending_aborts = 0;
        for (proc *p = sb->procs; p; p = p->next)
                proc_maybe_unthrottle(srv, p);
        /* a network change while paused reaches a gvisor sandbox's listener
         * now (its frozen init could not answer then; ns: nothing to do;
         * from disk: the reattach opened it with the current policy) */
        hutch_error e3 = { 0 };
        if (!from_disk && hutch_sandbox_set_network(sb->h, sb->egress != NULL, &e3) < 0)
                log_warning("sandbox %s: its way to the egress proxy: %s", sb->id, e3.msg);
        if (sb->procs_pending) {
                sb->procs_pending = false;
                proc_readopt(srv, sb);
        }
        hutch_error e2 = { 0 };
        (void) store_sandbox_set_state(srv->store, sb->id, STORE_SBX_RUNNING, &e2);
        (void) store_event_add(srv->store, sb->team_id, sb->id, "sandbox.resume", "{}", &e2);
        return 0;
}

void sbx_write_abort(server *srv, const char *sbx_id, hutch_fs_write *w) {
        sbx *sb = sbx_find(srv, sbx_id);
        if (sb && sb->paused) {
                hutch_fs_write **v = realloc(sb->pending_aborts, (sb->n_pending_aborts + 1) * sizeof *v);
                if (v) {
                        sb->pending_aborts = v;
                        v[sb->n_pending_aborts++] = w;
                        return;
                }
        }
        /* running, or gone (its connection is closed: this fails at once) */
        hutch_fs_write_abort(w);
}

static void sbx_release(sbx *sb) {
        egress_sbx_stop(sb->srv, sb); /* a pooled one's listener (a claimed one's is closed already) */
        for (size_t i = 0; i < sb->n_pending_aborts; i++)
                hutch_fs_write_abort(sb->pending_aborts[i]);
        free(sb->pending_aborts);
        sbx_pwatches_free(sb);
        while (sb->procs) {
                proc *p = sb->procs;
                sb->procs = p->next;
                proc_free(p);
        }
        json_decref(sb->metadata);
        json_decref(sb->envs);
        json_decref(sb->extra);
        hutch_sandbox_unref(sb->h);
        free(sb);
}

void sbx_kill_all(server *srv, const char *reason) {
        unsigned n = 0;
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && sbx_kill(srv, sb, reason) == 0)
                        n++;
        /* and wait for each teardown: nothing is left for a next start */
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (sb->dying)
                        sbx_finish_destroy(srv, sb);
        if (n)
                log_info("ended %u sandbox(es): %s", n, reason);
}

void sbx_free_all(server *srv) {
        /* the daemon stops; sandboxes keep running and are re-adopted later
         * (on-stop=kill ended them before: sbx_kill_all) */
        while (srv->sandboxes) {
                sbx *sb = srv->sandboxes;
                srv->sandboxes = sb->next;
                if (!sb->dead)
                        sbx_detach_all(srv, sb);
                else if (sb->dying)
                        sbx_finish_destroy(srv, sb);
                sbx_release(sb);
        }
}

void sbx_sample(server *srv, sbx *sb, int64_t now) {
        hutch_stats s;
        hutch_error err = { 0 };
        if (hutch_sandbox_stats(sb->h, &s, &err) < 0) {
                log_debug("sandbox %s: stats: %s", sb->id, err.msg);
                return;
        }
        usage_sample(srv, sb, &s, now);
        double pct = 0;
        if (sb->last_cpu_ms > 0 && now > sb->last_cpu_ms && s.cpu_usage_ns >= sb->last_cpu_ns) {
                double used_ms = (double) (s.cpu_usage_ns - sb->last_cpu_ns) / 1e6;
                pct = 100.0 * used_ms / ((double) (now - sb->last_cpu_ms) * (double) (sb->cpu_count ? sb->cpu_count : 1));
                if (pct > 100.0)
                        pct = 100.0;
        }
        sb->last_cpu_ns = s.cpu_usage_ns;
        sb->last_cpu_ms = now;
        struct sample *smp = &sb->samples[sb->sample_head];
        smp->ts_ms = now;
        smp->cpu_pct = pct;
        smp->mem_used = s.memory_current;
        smp->mem_total = s.memory_limit ? s.memory_limit : (uint64_t) sb->memory_mb << 20;
        smp->mem_cache = 0;
        smp->disk_used = s.disk_used;
        smp->disk_total = s.disk_limit ? s.disk_limit : (uint64_t) sb->disk_mb << 20;
        sb->sample_head = (sb->sample_head + 1) % SBX_METRICS;
        if (sb->n_samples < SBX_METRICS)
                sb->n_samples++;
}

int64_t sbx_timers(server *srv, int64_t now) {
        int64_t next = -1;
        for (sbx **pp = &srv->sandboxes; *pp;) {
                sbx *sb = *pp;
                if (sb->dead && sb->dying) {
                        /* init did not die in 10 s (a task stuck in the kernel?):
                         * the engine's teardown kills what is left by cgroup */
                        if (now - sb->dying_since_ms > 10000)
                                sbx_finish_destroy(srv, sb);
                        else {
                                int64_t due = sb->dying_since_ms + 10001;
                                if (next < 0 || due < next)
                                        next = due;
                        }
                        pp = &sb->next;
                        continue;
                }
                if (sb->dead) {
                        *pp = sb->next;
                        sbx_release(sb);
                        continue;
                }
                if (!sb->paused && sb->end_ms <= now) {
                        /* paused once its layer is copied (the end of the
                         * copy wakes the loop) */
                        if (sb->on_timeout_pause && sb->snapshotting) {
                                pp = &sb->next;
                                continue;
                        }
                        if (sb->on_timeout_pause) {
                                hutch_error err = { 0 };
                                log_debug("sandbox %s: timeout, pausing", sb->id);
                                if (sbx_pause(srv, sb, sb->pause_keep_memory, &err) < 0) {
                                        log_warning("sandbox %s: pause at timeout failed (%s): killing it", sb->id,
                                                    err.msg);
                                        sbx_kill(srv, sb, "timeout");
                                }
                        } else
                                sbx_kill(srv, sb, "timeout");
                        pp = &sb->next;
                        continue;
                }
                if (!sb->paused) {
                        if (sb->next_sample_ms <= now) {
                                sbx_sample(srv, sb, now);
                                sb->next_sample_ms = now + (int64_t) srv->cfg.metrics_interval_s * 1000;
                        }
                        if (next < 0 || sb->end_ms < next)
                                next = sb->end_ms;
                        if (sb->next_sample_ms < next)
                                next = sb->next_sample_ms;
                }
                pp = &sb->next;
        }
        return next;
}

json_t *sbx_to_json(sbx *sb, bool detail) {
        char started[40], end[40];
        format_rfc3339(sb->started_ms, started);
        format_rfc3339(sb->end_ms, end);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:s, s:O}", "sandboxID", sb->id,
                              "templateID", sb->template_id, "alias", sb->alias, "clientID", "hutch", "startedAt",
                              started, "endAt", end, "state", sb->paused ? "paused" : "running", "cpuCount",
                              (json_int_t) sb->cpu_count, "memoryMB", (json_int_t) sb->memory_mb, "diskSizeMB",
                              (json_int_t) sb->disk_mb, "envdVersion", ENVD_VERSION, "metadata", sb->metadata);
        json_t *vm = json_array(), *m;
        size_t vi;
        json_array_foreach(json_object_get(sb->extra, "volumeMounts"), vi, m) {
                json_array_append_new(vm, json_pack("{s:O, s:O}", "name", json_object_get(m, "name"), "path",
                                                    json_object_get(m, "path")));
        }
        json_object_set_new(o, "volumeMounts", vm);
        if (json_object_get(sb->extra, "gpus")) {
                /* hutch's extension: the GPUs it holds now (none while a
                 * pause without memory left it without its engine sandbox) */
                json_t *g = json_array();
                uint32_t ids[HUTCH_GPUS_MAX];
                size_t n = sb->h ? hutch_sandbox_gpus(sb->h, ids) : 0;
                for (size_t i = 0; i < n; i++)
                        json_array_append_new(g, json_integer(ids[i]));
                json_object_set_new(o, "gpus", g);
        }
        if (detail) {
                json_object_set_new(o, "envdAccessToken", json_string(sb->token));
                json_object_set_new(o, "domain", ingress_domain_json(sb->srv));
                json_t *aia = NULL;
                json_object_set_new(o, "network", egress_network_json(sb->srv, sb, &aia));
                json_object_set_new(o, "allowInternetAccess", aia);
                json_object_set_new(o, "lifecycle", json_pack("{s:s, s:b}", "onTimeout",
                                                              sb->on_timeout_pause ? "pause" : "kill", "autoResume",
                                                              sb->auto_resume));
        }
        return o;
}

/* ------------------------------------------------------------ re-adoption */

static int readopt_one(server *srv, const store_sandbox *row) {
        hutch_error err = { 0 };
        if (row->unanswered) {
                /* The daemon died before the client got its 201: nobody
                 * knows this sandbox's id or token, and it would hold one of
                 * its team's sandboxes until its timeout. Removed, whether
                 * its engine had finished or not; the client's create failed
                 * and it creates again. */
                log_info("sandbox %s: its create was never answered; removing it", row->id);
                pause_image_remove(srv, row->id);
                int r = hutch_sandbox_remove(srv->ctx, row->id, &err);
                if (r < 0 && r != -ENOENT)
                        log_warning("sandbox %s: %s", row->id, err.msg);
                hutch_error e2 = { 0 };
                if (store_sandbox_end(srv->store, row->id, wall_ms(), "create unanswered", &e2) < 0)
                        log_error("sandbox %s: database: %s", row->id, e2.msg);
                (void) store_event_add(srv->store, row->team_id, row->id, "sandbox.end",
                                       "{\"reason\":\"create unanswered\"}", &e2);
                return 0;
        }
        sbx *sb = sbx_alloc(srv);
        if (!sb)
                return -ENOMEM;
        memcpy(sb->id, row->id, sizeof sb->id);
        int r = hutch_sandbox_attach(srv->ctx, row->id, &sb->h, &err);
        if (r < 0) {
                log_info("sandbox %s: not alive any more (%s); ending it", row->id, err.msg);
                pause_image_remove(srv, row->id);
                free(sb);
                hutch_error e2 = { 0 };
                (void) hutch_sandbox_remove(srv->ctx, row->id, &e2);
                (void) store_sandbox_end(srv->store, row->id, wall_ms(), "lost", &e2);
                return 0;
        }
        sb->team_id = row->team_id;
        sb->backend = hutch_sandbox_backend(sb->h);
        snprintf(sb->template_id, sizeof sb->template_id, "%s", row->template_id);
        snprintf(sb->alias, sizeof sb->alias, "%s", row->alias);
        sb->started_ms = row->started_ms;
        sb->end_ms = row->end_ms;
        sb->paused = row->state == STORE_SBX_PAUSED;
        sb->cpu_count = row->cpu_count;
        sb->memory_mb = row->memory_mb;
        sb->disk_mb = row->disk_mb;
        sb->metadata = json_loads(row->metadata_json ? row->metadata_json : "{}", 0, NULL);
        sb->envs = json_loads(row->env_json ? row->env_json : "{}", 0, NULL);
        sb->extra = json_loads(row->extra_json ? row->extra_json : "{}", 0, NULL);
        if (!json_is_object(sb->metadata))
                sb->metadata = json_object();
        if (!json_is_object(sb->envs))
                sb->envs = json_object();
        if (!json_is_object(sb->extra))
                sb->extra = json_object();
        const char *ot = json_string_value(json_object_get(sb->extra, "onTimeout"));
        sb->on_timeout_pause = ot && streq(ot, "pause");
        sb->auto_resume = json_is_true(json_object_get(sb->extra, "autoResume"));
        sb->pause_keep_memory = !json_is_false(json_object_get(sb->extra, "autoPauseMemory"));
        sb->cold_resume = json_is_true(json_object_get(sb->extra, "coldResume"));
        sbx_token_derive(srv, sb->id, row->token_nonce, sb->token);
        /* gvisor, paused to disk: nothing runs to watch until its resume */
        bool suspended = hutch_sandbox_is_suspended(sb->h);
        if (suspended)
                sb->paused = true;
        r = suspended ? 0 : register_init(srv, sb);
        if (r < 0) {
                sbx_release(sb);
                return r;
        }
        /* running, yet frozen: the daemon died while a worker copied its
         * layer (or in a pause before its row said so) */
        if (!sb->paused && hutch_sandbox_is_frozen(sb->h)) {
                hutch_error e2 = { 0 };
                if (hutch_sandbox_thaw(sb->h, &e2) < 0)
                        log_error("sandbox %s: thawing it: %s", sb->id, e2.msg);
                else
                        log_info("sandbox %s: thawed (frozen by a snapshot cut short)", sb->id);
        }
        sb->next_sample_ms = wall_ms();
        sbx_link(srv, sb);
        if (!suspended && egress_sbx_start(srv, sb) < 0)
                log_warning("sandbox %s: re-adopted without egress (its proxy port is taken inside it?)", sb->id);
        if (sb->paused)
                sb->procs_pending = true; /* its init is frozen: ask once it runs again */
        else
                proc_readopt(srv, sb);
        sbx_mark_dirty(sb);
        log_info("sandbox %s: re-adopted (%s)", sb->id, sb->paused ? "paused" : "running");
        return 1;
}

/* What a crash in the middle of a pause, resume or checkpoint leaves: the
 * plain checkpoint files (root-only) and sealed images of sandboxes that
 * are not live any more. Runs after re-adoption, when the live ones are
 * known. */
static void leftovers_sweep(server *srv) {
        char dir[PATH_MAX];
        unsigned removed = 0;
        snprintf(dir, sizeof dir, "%s/paused", srv->cfg.data_dir);
        DIR *d = opendir(dir);
        for (struct dirent *de; d && (de = readdir(d));) {
                const char *n = de->d_name;
                size_t l = strlen(n);
                if (streq(n, ".") || streq(n, ".."))
                        continue;
                bool drop = n[0] == '.' || (l > 4 && streq(n + l - 4, ".tmp"));
                if (!drop && l > 5 && streq(n + l - 5, ".seal")) {
                        char id[HUTCH_ID_LEN + 1];
                        snprintf(id, sizeof id, "%.*s", (int) (l - 5), n);
                        drop = l - 5 != HUTCH_ID_LEN || !sbx_find(srv, id);
                }
                if (drop && unlinkat(dirfd(d), n, 0) == 0)
                        removed++;
        }
        if (d)
                closedir(d);
        removed += (unsigned) hutch_checkpoint_leftovers_remove(srv->ctx);
        if (removed)
                log_info("removed %u leftover checkpoint file(s) of earlier pauses and snapshots", removed);
}

int sbx_readopt_all(server *srv) {
        store_sandbox *rows = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        int r = store_sandbox_list_live(srv->store, &rows, &n, &err);
        if (r < 0)
                return log_error_errno(r, "database: %s", err.msg);
        int adopted = 0;
        for (size_t i = 0; i < n; i++)
                if (readopt_one(srv, &rows[i]) > 0)
                        adopted++;
        store_sandbox_array_free(rows, n);

        /* Leftovers of sandboxes this database knows as ended (a crash in the
         * middle of a kill): remove them. Sandboxes the database does not
         * know belong to `hutch run` or another daemon and are left alone. */
        char **ids = NULL;
        if (hutch_sandbox_list(srv->ctx, &ids, &err) >= 0) {
                for (char **id = ids; id && *id; id++) {
                        if (sbx_find(srv, *id))
                                continue;
                        store_sandbox row = { 0 };
                        hutch_error e2 = { 0 };
                        if (store_sandbox_get(srv->store, *id, &row, &e2) < 0)
                                continue;
                        store_sandbox_clear(&row);
                        log_info("sandbox %s: ended in the database but still present; removing it", *id);
                        (void) hutch_sandbox_remove(srv->ctx, *id, &e2);
                }
                hutch_strv_free(ids);
        }
        if (adopted)
                log_info("re-adopted %d sandbox(es)", adopted);
        leftovers_sweep(srv);
        return adopted;
}
