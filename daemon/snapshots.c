/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Snapshots and forks for the namespace backend (issue #5, docs/snapshots.md):
 * a snapshot is the sandbox's writable layer (hutch_sandbox_layer_export,
 * taken while the sandbox is frozen), sealed (lib/snapshot/seal.c: AES-256-GCM
 * per chunk, a key derived per file from DATA_DIR/secrets.key and bound to the
 * team and the snapshot id, zstd inside) into DATA_DIR/snapshots/<id>.seal.
 * Creating a sandbox from a snapshot id unseals it (a tampered or foreign file
 * is refused) and starts a sandbox on that layer. Processes and memory are
 * not part of a snapshot on this backend: they are what the gVisor backend
 * adds.
 *
 * What takes as long as the layer is large runs off the loop, in a worker
 * process (daemon/snapjob.c), while the request waits suspended: the copy
 * of the frozen layer and its sealing (a snapshot), the copy (a fork), the
 * unsealing (a create from a snapshot). On the loop stay the checks, the
 * freeze and thaw, the rename and row of a sealed file, the creates of a
 * fork (each imports the layer into its new image) and, on gvisor, runsc's
 * checkpoint (docs/snapshots.md "Off the loop").
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/node.h"
#include "daemon/server.h"
#include "daemon/snapjob.h"
#include "daemon/usage.h"
#include "snapshot/seal.h"
#include "util/log.h"
#include "util/macro.h"

#define SNAP_PREFIX "snap_"
#define RESTORE_MAX_BYTES ((1ull << 42) + (1ull << 30)) /* the largest layer stream (storage.c) and its framing */
#define FORK_MAX 16
_Static_assert(3 + FORK_MAX <= SNAPJOB_FDS, "a fork's worker gets an image per fork");

/* What a crash can leave: temporary files (one of them an unsealed layer),
 * sealed files without a row, rows without a file. Swept at every start. */
static void snapshots_sweep(server *srv, const char *dir) {
        DIR *d = opendir(dir);
        if (!d)
                return;
        struct dirent *de;
        unsigned removed = 0;
        while ((de = readdir(d))) {
                const char *n = de->d_name;
                if (streq(n, ".") || streq(n, ".."))
                        continue;
                bool drop = n[0] == '.';
                size_t l = strlen(n);
                if (!drop && l > 4 && streq(n + l - 4, ".tmp"))
                        drop = true;
                if (!drop && l > 5 && streq(n + l - 5, ".seal")) {
                        char id[64];
                        snprintf(id, sizeof id, "%.*s", (int) MIN(l - 5, sizeof id - 1), n);
                        store_snapshot sn;
                        hutch_error e = { 0 };
                        drop = !snapshot_id_valid(id) || store_snapshot_find(srv->store, id, &sn, &e) < 0;
                }
                if (drop && unlinkat(dirfd(d), n, 0) == 0)
                        removed++;
        }
        closedir(d);
        int rows = store_snapshot_prune_missing(srv->store, dir);
        if (removed || rows > 0)
                log_info("snapshots: removed %u leftover file(s) and %d row(s) without a file", removed, MAX(rows, 0));
}

int snapshots_setup(server *srv) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/snapshots", srv->cfg.data_dir);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return log_error_errno(-errno, "%s: %m", dir);
        snapshots_sweep(srv, dir);
        return 0;
}

bool snapshot_id_valid(const char *s) {
        if (strncmp(s, SNAP_PREFIX, strlen(SNAP_PREFIX)) != 0 || strlen(s) != strlen(SNAP_PREFIX) + 20)
                return false;
        for (const char *p = s + strlen(SNAP_PREFIX); *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
                        return false;
        return true;
}

static void snap_id_new(char id[32]) {
        static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
        strcpy(id, SNAP_PREFIX);
        size_t n = strlen(SNAP_PREFIX);
        for (size_t i = 0; i < 20; i++) {
                uint8_t b;
                do {
                        if (RAND_bytes(&b, 1) != 1)
                                abort();
                } while (b >= 252);
                id[n + i] = alphabet[b % 36];
        }
        id[n + 20] = 0;
}

static void snap_path(server *srv, const char *id, char *buf, size_t n) {
        snprintf(buf, n, "%s/snapshots/%s.seal", srv->cfg.data_dir, id);
}

static void snap_context(int64_t team, const char *id, char *buf, size_t n) {
        snprintf(buf, n, "hutch snapshot team:%lld id:%s", (long long) team, id);
}

void snapshot_file(server *srv, const char *id, char *buf, size_t n) {
        snap_path(srv, id, buf, n);
}

void snapshot_seal_context(int64_t team, const char *id, char *buf, size_t n) {
        snap_context(team, id, buf, n);
}

bool data_disk_has_room(server *srv, const char *dir, uint64_t bytes) {
        struct statvfs vfs;
        return statvfs(dir, &vfs) != 0 ||
               (uint64_t) vfs.f_bavail * vfs.f_frsize >= bytes * 2 + (uint64_t) srv->cfg.snapshot_reserve_bytes;
}

/* The fsync of the directory after a rename: the rename must survive a
 * crash as the file's data does. */
static void dir_sync_of(const char *path) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
                *slash = 0;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
                (void) fsync(dfd);
                close(dfd);
        }
}

int sealed_file_write(server *srv, int plain_fd, const char *final, const char *context, uint64_t *ret_bytes,
                      char *why, size_t whylen) {
        char sealtmp[PATH_MAX + 8];
        snprintf(sealtmp, sizeof sealtmp, "%s.tmp", final);
        int sfd = open(sealtmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (sfd < 0) {
                snprintf(why, whylen, "%s: %s", sealtmp, strerror(errno));
                return -errno;
        }
        int r = lseek(plain_fd, 0, SEEK_SET) < 0 ? -errno
                                                 : seal_write_fd(plain_fd, sfd, srv->data_key, context, true, NULL, why, whylen);
        if (r >= 0 && fsync(sfd) < 0)
                r = -errno;
        struct stat st;
        if (r >= 0 && ret_bytes && fstat(sfd, &st) == 0)
                *ret_bytes = (uint64_t) st.st_size;
        close(sfd);
        if (r >= 0 && rename(sealtmp, final) < 0)
                r = -errno;
        if (r < 0) {
                unlink(sealtmp);
                if (!why[0])
                        snprintf(why, whylen, "%s", strerror(-r));
                return r;
        }
        dir_sync_of(final);
        return 0;
}

/* ------------------------------------------------------------ workers */

/* What the three kinds of job (snapjob.h) hold. Their workers see only
 * their descriptors and these bytes (a copy of the daemon's memory): the
 * key is the daemon's own, read in the worker, never sent anywhere. */

/* An answer that says what the client can act on, never a host path. */
static enum MHD_Result snapshot_error(request *req, const char *sbx_id, int r, const char *msg) {
        if (r == -EOPNOTSUPP)
                return http_reply_error(req->conn, 409, "%s", msg);
        if (r == -EDQUOT)
                return http_reply_error(req->conn, 429, "%s", msg);
        if (r == -ENOSPC)
                return http_reply_error(req->conn, 507, "%s", msg);
        log_error("sandbox %s: snapshot: %s", sbx_id, msg);
        return http_reply_error(req->conn, 500, "the snapshot failed (the daemon's log has why)");
}

/* POST /sandboxes/{id}/snapshots. ns: the worker copies the layer of the
 * frozen sandbox (SNAPJOB_READ: it is thawed), then seals the copy;
 * gvisor: the checkpoint is taken on the loop (runsc), and the worker
 * seals it. The sealed file is written as <id>.seal.tmp and fsynced by the
 * worker; the loop renames it into place, then writes the row. */
enum { TAKE_FD_PLAIN, TAKE_FD_SEALED, TAKE_FD_ROOT, TAKE_FD_IMAGE };
typedef struct take_job {
        store_snapshot sn;
        bool export;          /* ns: copy the layer first (TAKE_FD_ROOT, TAKE_FD_IMAGE) */
        uid_t uid_base;
        const uint8_t *key;   /* srv->data_key */
        char ctx[160];
        char sealtmp[PATH_MAX + 8], final[PATH_MAX];
        int r;                /* the outcome, for the answer */
        char msg[320];
} take_job;

/* In a worker: the layer (its root and image descriptors) exported into
 * out, and the loop told how it went (SNAPJOB_READ: it may thaw now). */
static int export_layer_reported(int root_fd, int image_fd, uid_t uid_base, int out, int msg_fd) {
        hutch_layer_source src = { root_fd, image_fd, uid_base };
        hutch_error e = { 0 };
        uint64_t bytes = 0;
        int r = hutch_layer_export_fds(&src, out, &bytes, &e);
        snapjob_send(msg_fd, SNAPJOB_READ, r, bytes, 0, r < 0 ? e.msg : NULL);
        return r;
}

static int take_work(snapjob *j, int msg_fd) {
        take_job *t = j->data;
        int plain = j->fds[TAKE_FD_PLAIN], sealed = j->fds[TAKE_FD_SEALED];
        if (t->export) {
                int r = export_layer_reported(j->fds[TAKE_FD_ROOT], j->fds[TAKE_FD_IMAGE], t->uid_base, plain, msg_fd);
                if (r < 0)
                        return r;
        }
        char why[200] = "";
        int r = lseek(plain, 0, SEEK_SET) < 0 ? -errno
                                              : seal_write_fd(plain, sealed, t->key, t->ctx, true, NULL, why, sizeof why);
        if (r >= 0 && fsync(sealed) < 0)
                r = -errno;
        struct stat st;
        uint64_t size = r >= 0 && fstat(sealed, &st) == 0 ? (uint64_t) st.st_size : 0;
        char msg[240];
        snprintf(msg, sizeof msg, "sealing the snapshot: %s", why[0] ? why : strerror(-r));
        snapjob_send(msg_fd, SNAPJOB_DONE, r, size, 0, r < 0 ? msg : NULL);
        return r;
}

static void take_done(server *srv, snapjob *j, const snapjob_msg *m) {
        take_job *t = j->data;
        t->r = m->r;
        snprintf(t->msg, sizeof t->msg, "%s", m->why);
        if (m->r < 0)
                return;
        if (rename(t->sealtmp, t->final) < 0) {
                t->r = -errno;
                snprintf(t->msg, sizeof t->msg, "sealing the snapshot: %s", strerror(errno));
                return;
        }
        dir_sync_of(t->final);
        t->sn.bytes = (int64_t) m->bytes;
        hutch_error err = { 0 };
        if ((t->r = store_snapshot_insert(srv->store, &t->sn, &err)) < 0) {
                unlink(t->final);
                snprintf(t->msg, sizeof t->msg, "%s", err.msg);
                return;
        }
        usage_storage_changed(srv);
        char detail[128];
        snprintf(detail, sizeof detail, "{\"snapshot\":\"%s\"}", t->sn.id);
        (void) store_event_add(srv->store, t->sn.team_id, t->sn.sandbox_id, "sandbox.snapshot", detail, &err);
        /* other nodes restore it from the registry (tplshare.c) */
        tplshare_snapshot_push(srv, &t->sn, t->ctx);
}

static json_t *snapshot_json(const store_snapshot *sn);

static void take_answer(server *srv, snapjob *j, request *req) {
        take_job *t = j->data;
        if (t->r < 0)
                snapshot_error(req, j->sbx_id, t->r, t->msg);
        else
                http_reply_json(req->conn, 201, snapshot_json(&t->sn));
}

static void take_release(server *srv, snapjob *j) {
        take_job *t = j->data;
        if (!t)
                return;
        if (t->sealtmp[0])
                trash_file(srv, t->sealtmp); /* renamed already, or cut short */
        free(t);
        j->data = NULL;
}

static const snapjob_ops take_ops = {
        .what = "snapshot", .work = take_work, .done = take_done, .answer = take_answer, .release = take_release,
};

/* What a snapshot of sb must fit in: the team's count, and the disk
 * (layers, the database and other tenants share it). */
static int snapshot_room(server *srv, sbx *sb, bool count, hutch_error *err) {
        int64_t have = 0;
        if (count && store_snapshot_count(srv->store, sb->team_id, &have, err) < 0)
                return -EIO;
        if (count && (uint64_t) have >= srv->cfg.max_snapshots_per_team)
                return hutch_error_set(err, -EDQUOT, "the team has %lld snapshots, its limit (delete some first)",
                                       (long long) have);
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/snapshots", srv->cfg.data_dir);
        uint64_t used = 0;
        hutch_stats stt;
        hutch_error e0 = { 0 };
        if (hutch_sandbox_stats(sb->h, &stt, &e0) >= 0)
                used = stt.disk_used;
        if (!data_disk_has_room(srv, dir, used))
                return hutch_error_set(err, -ENOSPC, "not enough free disk for a snapshot of this sandbox");
        return 0;
}

/* ns: what the worker reads, opened now, and the sandbox frozen for it
 * (unless paused). j->fds[root, image] are set; the caller sets the rest. */
static int layer_job_prepare(sbx *sb, snapjob *j, int fd_root, int fd_image, uid_t *ret_uid_base, hutch_error *err) {
        hutch_layer_source src = { -1, -1, 0 };
        int r = hutch_sandbox_layer_open(sb->h, &src, err);
        if (r < 0)
                return r;
        if (!sb->paused && (r = hutch_sandbox_freeze(sb->h, err)) < 0) {
                hutch_layer_source_close(&src);
                return r;
        }
        sbx_mark_dirty(sb);
        j->thaw = !sb->paused;
        j->reads_sandbox = true; /* paused: its resume waits too */
        j->fds[fd_root] = src.root_fd;
        j->fds[fd_image] = src.image_fd;
        *ret_uid_base = src.uid_base;
        return 0;
}

/* The job of a snapshot of sb, ready to start (the checkpoint of a gvisor
 * sandbox taken). On failure nothing is left: files, frozen cgroup. */
static int take_prepare(server *srv, sbx *sb, const char *name, snapjob **ret, hutch_error *err) {
        int r = snapshot_room(srv, sb, true, err);
        if (r < 0)
                return r;
        take_job *t = calloc(1, sizeof *t);
        snapjob *j = t ? snapjob_new(&take_ops, sb->team_id, sb->id) : NULL;
        if (!j) {
                free(t);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        j->data = t;
        store_snapshot *sn = &t->sn;
        snap_id_new(sn->id);
        node_id_stamp(srv, sn->id + strlen(SNAP_PREFIX)); /* a router finds the snapshot's node by its id */
        sn->team_id = sb->team_id;
        snprintf(sn->sandbox_id, sizeof sn->sandbox_id, "%s", sb->id);
        snprintf(sn->name, sizeof sn->name, "%s", name ? name : "");
        snprintf(sn->template_id, sizeof sn->template_id, "%s", sb->template_id);
        sn->created_ms = wall_ms();
        sn->disk_mb = sb->disk_mb;
        t->key = srv->data_key;
        snap_context(sn->team_id, sn->id, t->ctx, sizeof t->ctx);
        snap_path(srv, sn->id, t->final, sizeof t->final);

        char tmpl[PATH_MAX];
        snprintf(tmpl, sizeof tmpl, "%s/snapshots/.layer-XXXXXX", srv->cfg.data_dir);
        j->fds[TAKE_FD_PLAIN] = mkostemp(tmpl, O_CLOEXEC);
        if (j->fds[TAKE_FD_PLAIN] < 0) {
                r = hutch_error_set(err, -errno, "temporary file: %m");
                goto fail;
        }
        unlink(tmpl); /* anonymous: gone with the last descriptor, whatever happens */
        snprintf(t->sealtmp, sizeof t->sealtmp, "%s.tmp", t->final);
        j->fds[TAKE_FD_SEALED] = open(t->sealtmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (j->fds[TAKE_FD_SEALED] < 0) {
                r = hutch_error_set(err, -errno, "%s: %m", t->sealtmp);
                t->sealtmp[0] = 0;
                goto fail;
        }

        if (!(hutch_backend_caps(hutch_sandbox_backend(sb->h)) & HUTCH_BACKEND_CHECKPOINTS)) {
                t->export = true;
                r = layer_job_prepare(sb, j, TAKE_FD_ROOT, TAKE_FD_IMAGE, &t->uid_base, err);
        } else if (hutch_sandbox_is_suspended(sb->h)) {
                /* paused to disk: that checkpoint is the snapshot (unsealed here) */
                r = sbx_pause_image_read(srv, sb, j->fds[TAKE_FD_PLAIN], err);
        } else {
                /* a memory checkpoint (runsc), taken on the loop while the
                 * sandbox runs on through a new relay: a new control
                 * connection, and the old one's streams have ended */
                uint64_t bytes = 0;
                r = hutch_sandbox_checkpoint(sb->h, j->fds[TAKE_FD_PLAIN], &bytes, err);
                if (hutch_sandbox_fd(sb->h) >= 0 && sbx_reattach(srv, sb) < 0)
                        log_error("sandbox %s: watching its control connection again failed", sb->id);
                sbx_mark_dirty(sb);
        }
        if (r < 0)
                goto fail;
        *ret = j;
        return 0;
fail:
        snapjob_discard(srv, j);
        return r;
}

/* Restoring, as a job: the sealed file is verified and unsealed by the
 * worker into DATA_DIR/snapshots/.restore-XXXXXX and, for a layer (ns),
 * written into a new layer image there (.image-XXXXXX), which the create
 * that asked for it takes over (sbx_create, through srv->fork_stream and
 * fork_image), so that no copy of the layer is made on the loop. Creates
 * of the same snapshot meanwhile join the job: the first takes the image,
 * the others import the stream (on the loop). The stream goes when the
 * last of them is done with it. */
enum { RESTORE_FD_SEALED, RESTORE_FD_PLAIN, RESTORE_FD_IMAGE };
typedef struct restore_job {
        char snap_id[32];
        char path[PATH_MAX];
        char image[PATH_MAX]; /* "" once taken over by a create */
        uint32_t image_base;
        const uint8_t *key;
        char ctx[160];
        int r;
        unsigned status;
        char msg[400];
} restore_job;

#define LAYER_STREAM_MAGIC "HUTCHLY1" /* lib/sandbox/storage.c's, as hutch_stream_is_checkpoint tells */

static int restore_work(snapjob *j, int msg_fd) {
        restore_job *rj = j->data;
        int plain = j->fds[RESTORE_FD_PLAIN];
        char why[200] = "";
        int r = seal_read_fd(j->fds[RESTORE_FD_SEALED], plain, rj->key, rj->ctx, RESTORE_MAX_BYTES, why, sizeof why);
        uint32_t base = 0;
        bool imported = false;
        char magic[8];
        if (r >= 0 && pread(plain, magic, sizeof magic, 0) == (ssize_t) sizeof magic &&
            memcmp(magic, LAYER_STREAM_MAGIC, sizeof magic) == 0) {
                hutch_error e = { 0 };
                /* an image that cannot be made is not the restore's failure:
                 * the create imports the stream */
                imported = lseek(plain, 0, SEEK_SET) == 0 &&
                           hutch_layer_import_fds(plain, j->fds[RESTORE_FD_IMAGE], &base, &e) >= 0 &&
                           fsync(j->fds[RESTORE_FD_IMAGE]) == 0; /* written back here, not by the
                                                                    loop's loop-device attach */
        }
        snapjob_send(msg_fd, SNAPJOB_DONE, r, imported, base, r < 0 ? (why[0] ? why : strerror(-r)) : NULL);
        return r;
}

static void restore_done(server *srv, snapjob *j, const snapjob_msg *m) {
        restore_job *rj = j->data;
        rj->r = m->r;
        if (m->r >= 0 && m->bytes) {
                rj->image_base = (uint32_t) m->aux;
                return;
        }
        trash_file(srv, rj->image); /* a checkpoint, or no image made */
        rj->image[0] = 0;
        if (m->r >= 0)
                return;
        /* nothing of it stays, before anyone is answered */
        trash_file(srv, rj->path);
        rj->path[0] = 0;
        bool refused = m->r == -EBADMSG || m->r == -EPERM;
        if (refused)
                log_warning("snapshot %s: refused: %s", rj->snap_id, m->why);
        rj->status = refused ? 422 : 500;
        snprintf(rj->msg, sizeof rj->msg, "snapshot %s cannot be restored: %s", rj->snap_id,
                 refused ? "it does not authenticate (damaged or altered)" : m->why);
        if (!refused)
                log_error("create: %s", rj->msg);
}

static void restore_answer(server *srv, snapjob *j, request *req) {
        restore_job *rj = j->data;
        if (rj->r < 0) {
                http_reply_error(req->conn, rj->status, "%s", rj->msg);
                return;
        }
        if (snapjob_hold(srv, j, req) < 0) {
                http_reply_error(req->conn, 500, "out of memory");
                return;
        }
        req->resume_action = RESUME_DISPATCH; /* the create again, the stream ready */
}

static void restore_release(server *srv, snapjob *j) {
        restore_job *rj = j->data;
        if (!rj)
                return;
        if (rj->path[0])
                trash_file(srv, rj->path);
        if (rj->image[0])
                trash_file(srv, rj->image);
        free(rj);
        j->data = NULL;
}

static const snapjob_ops restore_ops = {
        .what = "restore", .work = restore_work, .done = restore_done, .answer = restore_answer,
        .release = restore_release,
};

static void restore_use(server *srv, snapjob *j) {
        restore_job *rj = j->data;
        snprintf(srv->fork_stream, sizeof srv->fork_stream, "%s", rj->path);
        snprintf(srv->fork_snapshot, sizeof srv->fork_snapshot, "%s", rj->snap_id);
        snprintf(srv->fork_image, sizeof srv->fork_image, "%s", rj->image);
        srv->fork_image_base = rj->image_base;
}

int snapshot_restore_begin(server *srv, request *req, json_t *body, enum MHD_Result *ret_mr) {
        snapjob *held = snapjob_held(req);
        if (held) {
                if (held->ops == &restore_ops) /* else a template's pull (tplshare.c) */
                        restore_use(srv, held);
                return 0;
        }
        const char *id = json_string_value(json_object_get(body, "templateID"));
        store_snapshot sn;
        hutch_error err = { 0 };
        /* not a snapshot of the team's, or a create refused before any
         * unseal (the team's limit): sbx_create answers as ever */
        if (!id || !snapshot_id_valid(id) || store_snapshot_get(srv->store, req->team, id, &sn, &err) < 0 ||
            (uint64_t) sbx_live_count(srv, req->team) >= srv->cfg.max_sandboxes_per_team)
                return 0;
        char key[96];
        snprintf(key, sizeof key, "restore %lld %s", (long long) req->team, id);
        snapjob *j = snapjob_find(srv, key);
        if (j && j->running) {
                if (snapjob_join(srv, j, req) < 0) {
                        *ret_mr = http_reply_error(req->conn, 500, "out of memory");
                        return 1;
                }
                *ret_mr = MHD_YES;
                return 1;
        }
        if (j && snapjob_hold(srv, j, req) >= 0) {
                restore_use(srv, j); /* unsealed, still held by other creates */
                return 0;
        }
        if (snapjob_admit(srv, req, req->team, NULL) < 0) {
                *ret_mr = MHD_YES;
                return 1;
        }
        restore_job *rj = calloc(1, sizeof *rj);
        j = rj ? snapjob_new(&restore_ops, req->team, NULL) : NULL;
        if (!j) {
                free(rj);
                *ret_mr = http_reply_error(req->conn, 500, "out of memory");
                return 1;
        }
        j->data = rj;
        snprintf(j->key, sizeof j->key, "%s", key);
        snprintf(rj->snap_id, sizeof rj->snap_id, "%s", id);
        rj->key = srv->data_key;
        snap_context(req->team, id, rj->ctx, sizeof rj->ctx);
        char path[PATH_MAX];
        snap_path(srv, id, path, sizeof path);
        int r = 0;
        j->fds[RESTORE_FD_SEALED] = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (j->fds[RESTORE_FD_SEALED] < 0)
                r = hutch_error_set(&err, -errno, "snapshot %s: its file: %m", id);
        snprintf(rj->path, sizeof rj->path, "%s/snapshots/.restore-XXXXXX", srv->cfg.data_dir);
        if (r >= 0 && (j->fds[RESTORE_FD_PLAIN] = mkostemp(rj->path, O_CLOEXEC)) < 0) {
                r = hutch_error_set(&err, -errno, "temporary file: %m");
                rj->path[0] = 0;
        }
        snprintf(rj->image, sizeof rj->image, "%s/snapshots/.image-XXXXXX", srv->cfg.data_dir);
        if (r >= 0 && (j->fds[RESTORE_FD_IMAGE] = mkostemp(rj->image, O_CLOEXEC)) < 0) {
                r = hutch_error_set(&err, -errno, "temporary file: %m");
                rj->image[0] = 0;
        }
        if (j->fds[RESTORE_FD_IMAGE] < 0)
                rj->image[0] = 0;
        if (r < 0) {
                if (j->fds[RESTORE_FD_PLAIN] < 0)
                        rj->path[0] = 0;
                snapjob_discard(srv, j);
        } else
                r = snapjob_start(srv, j, req, &err);
        if (r < 0) {
                log_error("create: %s", err.msg);
                *ret_mr = http_reply_error(req->conn, 500, "%s", err.msg);
                return 1;
        }
        *ret_mr = MHD_YES;
        return 1;
}

void snapshot_restore_end(server *srv, request *req) {
        snapjob *j = snapjob_held(req);
        if (!j || j->ops != &restore_ops)
                return;
        restore_job *rj = j->data;
        if (rj->image[0] && !srv->fork_image[0])
                rj->image[0] = 0; /* taken over by the create */
        srv->fork_stream[0] = srv->fork_snapshot[0] = srv->fork_image[0] = 0;
        snapjob_unhold(srv, req);
}

int snapshot_unseal(server *srv, int64_t team, const char *id, store_snapshot *ret_meta, char *ret_path, size_t pathlen,
                    hutch_error *err) {
        int r = store_snapshot_get(srv->store, team, id, ret_meta, err);
        if (r < 0)
                return r;
        char path[PATH_MAX];
        snap_path(srv, id, path, sizeof path);
        int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return hutch_error_set(err, -errno, "snapshot %s: its file: %m", id);
        snprintf(ret_path, pathlen, "%s/snapshots/.restore-XXXXXX", srv->cfg.data_dir);
        int out = mkostemp(ret_path, O_CLOEXEC);
        if (out < 0) {
                r = -errno;
                close(in);
                return hutch_error_set(err, r, "temporary file: %s", strerror(-r));
        }
        char ctx[160], why[256] = "";
        snap_context(team, id, ctx, sizeof ctx);
        r = seal_read_fd(in, out, srv->data_key, ctx, RESTORE_MAX_BYTES, why, sizeof why);
        close(in);
        close(out);
        if (r < 0) {
                unlink(ret_path);
                if (r == -EBADMSG || r == -EPERM)
                        log_warning("snapshot %s: refused: %s", id, why);
                return hutch_error_set(err, r == -EBADMSG || r == -EPERM ? -EBADMSG : r,
                                       "snapshot %s cannot be restored: %s", id,
                                       r == -EBADMSG || r == -EPERM ? "it does not authenticate (damaged or altered)"
                                                                    : why);
        }
        return 0;
}

static json_t *snapshot_json(const store_snapshot *sn) {
        json_t *names = json_array();
        if (sn->name[0])
                json_array_append_new(names, json_string(sn->name));
        return json_pack("{s:s, s:o, s:s, s:I, s:I}", "snapshotID", sn->id, "names", names, "sandboxID", sn->sandbox_id,
                         "sizeBytes", (json_int_t) sn->bytes, "createdAtUnixMs", (json_int_t) sn->created_ms);
}

/* POST /sandboxes/{id}/snapshots {name?}: answered once the worker is done
 * (take_answer); the connection waits suspended meanwhile. */
enum MHD_Result snapshot_create(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        json_t *nj = json_object_get(body, "name");
        const char *name = json_string_value(nj);
        if ((nj && !json_is_null(nj) && !name) || (name && (strlen(name) > 128 || strchr(name, '/')))) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "name must be a string of at most 128 bytes without '/'");
        }
        if (snapjob_admit(srv, req, sb->team_id, sb->id) < 0) {
                json_decref(body);
                return MHD_YES;
        }
        snapjob *j = NULL;
        hutch_error err = { 0 };
        int r = take_prepare(srv, sb, name, &j, &err);
        json_decref(body);
        if (r >= 0)
                r = snapjob_start(srv, j, req, &err);
        if (r < 0)
                return snapshot_error(req, sb->id, r, err.msg);
        return MHD_YES;
}


/* GET /snapshots?sandboxID=&name=&limit=&nextToken= */
enum MHD_Result snapshots_list(server *srv, request *req) {
        const char *sid = http_query(req->conn, "sandboxID"), *name = http_query(req->conn, "name");
        const char *l = http_query(req->conn, "limit"), *t = http_query(req->conn, "nextToken");
        unsigned limit = 100;
        if (l && *l) {
                char *x;
                unsigned long v = strtoul(l, &x, 10);
                if (*x || v < 1 || v > 100)
                        return http_reply_error(req->conn, 400, "limit must be 1..100");
                limit = (unsigned) v;
        }
        int64_t before_ms = 0;
        char before_id[32] = "";
        if (t && *t) {
                char *dot = strchr(t, '.'), *x;
                long long ms = strtoll(t, &x, 10);
                if (!dot || x != dot || !snapshot_id_valid(dot + 1))
                        return http_reply_error(req->conn, 400, "invalid nextToken");
                before_ms = ms;
                snprintf(before_id, sizeof before_id, "%s", dot + 1);
        }
        store_snapshot *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (store_snapshot_list(srv->store, req->team, sid, name, before_ms, before_id[0] ? before_id : NULL, limit + 1,
                                &v, &n, &err) < 0)
                return http_reply_error(req->conn, 500, "%s", err.msg);
        json_t *arr = json_array();
        for (size_t i = 0; i < n && i < limit; i++)
                json_array_append_new(arr, snapshot_json(&v[i]));
        char token[64] = "";
        if (n > limit)
                snprintf(token, sizeof token, "%lld.%s", (long long) v[limit - 1].created_ms, v[limit - 1].id);
        free(v);
        return http_reply_json_page(req->conn, arr, token);
}

/* DELETE /templates/{snapshotID} */
enum MHD_Result snapshot_delete(server *srv, request *req, const char *id) {
        hutch_error err = { 0 };
        if (!snapshot_id_valid(id))
                return http_reply_error(req->conn, 404, "template not found");
        if (store_snapshot_delete(srv->store, req->team, id, &err) < 0)
                return http_reply_error(req->conn, 404, "template '%s' not found", id);
        usage_storage_changed(srv);
        char path[PATH_MAX];
        snap_path(srv, id, path, sizeof path);
        trash_file(srv, path); /* a gigabyte's blocks are freed off the loop */
        char detail[128];
        snprintf(detail, sizeof detail, "{\"snapshot\":\"%s\"}", id);
        (void) store_event_add(srv->store, req->team, NULL, "snapshot.delete", detail, &err);
        tplshare_snapshot_deleted(srv, id); /* and at the registry (tplshare.c) */
        return http_reply_empty(req->conn, 204);
}

/* POST /sandboxes/{id}/fork {count?, timeout?}: the parent's layer (ns) or
 * checkpoint (gvisor), then count sandboxes from it, each with the
 * parent's metadata, environment and network. No snapshot is kept, and
 * none is sealed: the forks read the plain stream, which lives in a
 * temporary file for the forks' creates only (DATA_DIR/snapshots/.fork-*,
 * swept at start if a crash leaves it). ns: a worker copies the layer while
 * the parent is frozen; the creates then run on the loop (fork_answer). */
typedef struct fork_job {
        char path[PATH_MAX];            /* the stream */
        char images[FORK_MAX][PATH_MAX]; /* one layer image per fork, made from it (.image-*) */
        uint32_t images_base;
        bool imaged;
        uid_t uid_base;
        json_int_t count, timeout;
        int r;
        char msg[320];
} fork_job;
enum { FORK_FD_STREAM, FORK_FD_ROOT, FORK_FD_IMAGE, FORK_FD_NEW };

/* The creates, from the stream at stream_path (and each from its own
 * image made from it, when images is not NULL); the answer queued. */
static enum MHD_Result fork_children(server *srv, request *req, sbx *sb, const char *stream_path,
                                     char (*images)[PATH_MAX], uint32_t images_base, json_int_t count,
                                     json_int_t timeout) {
        /* the creates find the snapshot's kind and size by a row of their
         * own, there while they run (a crash leaves a row without a file,
         * pruned at the next start), and read the stream as a borrowed one */
        store_snapshot sn = { 0 };
        snap_id_new(sn.id);
        node_id_stamp(srv, sn.id + strlen(SNAP_PREFIX));
        sn.team_id = sb->team_id;
        snprintf(sn.sandbox_id, sizeof sn.sandbox_id, "%s", sb->id);
        snprintf(sn.template_id, sizeof sn.template_id, "%s", sb->template_id);
        sn.created_ms = wall_ms();
        sn.disk_mb = sb->disk_mb;
        hutch_error err = { 0 };
        if (store_snapshot_insert(srv->store, &sn, &err) < 0)
                return snapshot_error(req, sb->id, -EIO, err.msg);
        /* The parent's environment holds its own placeholders: the forks get
         * the secret references back, and so placeholders of their own. */
        json_t *envs = json_deep_copy(sb->envs);
        json_t *refs = json_object_get(sb->extra, "secretRefs");
        const char *ek;
        json_t *ev;
        json_object_foreach(envs, ek, ev) {
                const char *val = json_string_value(ev);
                size_t ri;
                json_t *rn;
                json_array_foreach(refs, ri, rn) {
                        const char *name = json_string_value(rn);
                        char ph[45];
                        if (!name || !val)
                                continue;
                        secret_placeholder(srv, sb->id, name, ph);
                        const char *at = strstr(val, ph);
                        if (!at)
                                continue;
                        char *nv = NULL;
                        if (asprintf(&nv, "%.*s${e2b.secrets.%s}%s", (int) (at - val), val, name, at + 44) < 0)
                                continue;
                        json_object_set_new(envs, ek, json_string(nv));
                        free(nv);
                        val = json_string_value(json_object_get(envs, ek));
                }
        }
        snprintf(srv->fork_stream, sizeof srv->fork_stream, "%s", stream_path);
        snprintf(srv->fork_snapshot, sizeof srv->fork_snapshot, "%s", sn.id);
        json_t *out = json_array();
        for (json_int_t i = 0; i < count; i++) {
                json_t *cb = json_pack("{s:s}", "templateID", sn.id);
                if (timeout > 0)
                        json_object_set_new(cb, "timeout", json_integer(timeout));
                json_object_set(cb, "metadata", sb->metadata);
                json_object_set(cb, "envVars", envs);
                /* the GPUs the parent asked for (a count: free ones each;
                 * ids: the parent's, so a 409), unless its metadata asks */
                json_t *gpus = json_object_get(sb->extra, "gpus");
                if (json_is_string(gpus) && !json_object_get(sb->metadata, "hutch.gpus"))
                        json_object_set(cb, "gpus", gpus);
                json_t *spec = json_object_get(sb->extra, "egress");
                if (json_is_object(spec)) {
                        json_t *net = json_object();
                        const char *keys[] = { "allowOut", "denyOut", "rules" };
                        for (size_t k = 0; k < ELEMENTSOF(keys); k++) {
                                json_t *v = json_object_get(spec, keys[k]);
                                if (v)
                                        json_object_set(net, keys[k], v);
                        }
                        json_object_set_new(cb, "network", net);
                        json_t *inet = json_object_get(spec, "internet");
                        if (json_is_boolean(inet))
                                json_object_set(cb, "allow_internet_access", inet);
                }
                sbx *child = NULL;
                unsigned status = 500;
                hutch_error e2 = { 0 };
                if (images) {
                        snprintf(srv->fork_image, sizeof srv->fork_image, "%s", images[i]);
                        srv->fork_image_base = images_base;
                }
                int k = sbx_create(srv, sb->team_id, cb, &child, &status, &e2);
                if (images && !srv->fork_image[0])
                        images[i][0] = 0; /* taken over */
                srv->fork_image[0] = 0;
                json_decref(cb);
                if (k < 0) {
                        if (status >= 500)
                                log_error("sandbox %s: fork: %s", sb->id, e2.msg);
                        json_array_append_new(out, json_pack("{s:{s:i, s:s}}", "error", "code", (int) status, "message",
                                                             status >= 500 ? "the fork failed (the daemon's log has why)"
                                                                           : e2.msg));
                }
                else if (sbx_create_note(req, child) < 0) {
                        sbx_kill(srv, child, "create failed");
                        json_array_append_new(out, json_pack("{s:{s:i, s:s}}", "error", "code", 500, "message",
                                                             "out of memory"));
                } else
                        json_array_append_new(out, json_pack("{s:o}", "sandbox", sandbox_created_json(child)));
        }
        json_decref(envs);
        srv->fork_stream[0] = srv->fork_snapshot[0] = 0;
        (void) store_snapshot_delete(srv->store, sn.team_id, sn.id, &err);
        enum MHD_Result mr = http_reply_json(req->conn, 201, out);
        if (mr == MHD_YES)
                sbx_create_queued(srv, req);
        return mr;
}

static int fork_work(snapjob *j, int msg_fd) {
        fork_job *f = j->data;
        int plain = j->fds[FORK_FD_STREAM];
        int r = export_layer_reported(j->fds[FORK_FD_ROOT], j->fds[FORK_FD_IMAGE], f->uid_base, plain, msg_fd);
        if (r < 0)
                return r;
        /* the forks' layers, so that their creates copy nothing on the loop
         * (an image that cannot be made: they import the stream there) */
        uint32_t base = 0;
        bool imaged = true;
        hutch_error e = { 0 };
        for (json_int_t i = 0; i < f->count && imaged; i++)
                imaged = lseek(plain, 0, SEEK_SET) == 0 &&
                         hutch_layer_import_fds(plain, j->fds[FORK_FD_NEW + i], &base, &e) >= 0 &&
                         fsync(j->fds[FORK_FD_NEW + i]) == 0; /* as a restore's */
        snapjob_send(msg_fd, SNAPJOB_DONE, 0, imaged, base, NULL);
        return 0;
}

static void fork_done(server *srv, snapjob *j, const snapjob_msg *m) {
        fork_job *f = j->data;
        f->r = m->r;
        snprintf(f->msg, sizeof f->msg, "%s", m->why);
        f->imaged = m->r >= 0 && m->bytes;
        f->images_base = (uint32_t) m->aux;
}

static void fork_answer(server *srv, snapjob *j, request *req) {
        fork_job *f = j->data;
        if (f->r < 0) {
                snapshot_error(req, j->sbx_id, f->r, f->msg);
                return;
        }
        sbx *sb = sbx_find_team(srv, j->sbx_id, j->team);
        if (!sb) {
                http_reply_error(req->conn, 409, "sandbox \"%s\" was killed during its fork", j->sbx_id);
                return;
        }
        fork_children(srv, req, sb, f->path, f->imaged ? f->images : NULL, f->images_base, f->count, f->timeout);
}

static void fork_release(server *srv, snapjob *j) {
        fork_job *f = j->data;
        if (!f)
                return;
        if (f->path[0])
                trash_file(srv, f->path);
        for (json_int_t i = 0; i < f->count; i++)
                if (f->images[i][0])
                        trash_file(srv, f->images[i]);
        free(f);
        j->data = NULL;
}

static const snapjob_ops fork_ops = {
        .what = "fork", .work = fork_work, .done = fork_done, .answer = fork_answer, .release = fork_release,
};

enum MHD_Result sandbox_fork(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        json_t *cj = json_object_get(body, "count"), *tj = json_object_get(body, "timeout");
        json_int_t count = cj && !json_is_null(cj) ? json_integer_value(cj) : 1;
        if ((cj && !json_is_null(cj) && !json_is_integer(cj)) || count < 1 || count > FORK_MAX ||
            (tj && !json_is_null(tj) && (!json_is_integer(tj) || json_integer_value(tj) < 0 ||
                                         (uint64_t) json_integer_value(tj) > srv->cfg.max_timeout_s))) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "count must be 1..%d and timeout 0..%llu seconds", FORK_MAX,
                                        (unsigned long long) srv->cfg.max_timeout_s);
        }
        json_int_t timeout = tj && !json_is_null(tj) ? json_integer_value(tj) : 0;
        json_decref(body);
        /* the team limit first: no copy for forks that cannot be made */
        if ((uint64_t) sbx_live_count(srv, sb->team_id) + (uint64_t) count > srv->cfg.max_sandboxes_per_team)
                return http_reply_error(req->conn, 429, "%lld forks would exceed the team's limit of %llu live sandboxes",
                                        (long long) count, (unsigned long long) srv->cfg.max_sandboxes_per_team);
        hutch_error err = { 0 };
        int r = snapshot_room(srv, sb, false, &err);
        if (r < 0)
                return snapshot_error(req, sb->id, r, err.msg);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/snapshots/.fork-XXXXXX", srv->cfg.data_dir);

        if (hutch_backend_caps(hutch_sandbox_backend(sb->h)) & HUTCH_BACKEND_CHECKPOINTS) {
                /* runsc's checkpoint and the restores run on the loop */
                int fd = mkostemp(path, O_CLOEXEC);
                if (fd < 0)
                        return snapshot_error(req, sb->id, -errno, "temporary file for a fork");
                uint64_t bytes = 0;
                if (hutch_sandbox_is_suspended(sb->h))
                        r = sbx_pause_image_read(srv, sb, fd, &err);
                else {
                        r = hutch_sandbox_checkpoint(sb->h, fd, &bytes, &err);
                        if (hutch_sandbox_fd(sb->h) >= 0 && sbx_reattach(srv, sb) < 0)
                                log_error("sandbox %s: watching its control connection again failed", sb->id);
                }
                sbx_mark_dirty(sb);
                close(fd);
                enum MHD_Result mr = r < 0 ? snapshot_error(req, sb->id, r, err.msg)
                                           : fork_children(srv, req, sb, path, NULL, 0, count, timeout);
                trash_file(srv, path);
                return mr;
        }

        if (snapjob_admit(srv, req, sb->team_id, sb->id) < 0)
                return MHD_YES;
        fork_job *f = calloc(1, sizeof *f);
        snapjob *j = f ? snapjob_new(&fork_ops, sb->team_id, sb->id) : NULL;
        if (!j) {
                free(f);
                return http_reply_error(req->conn, 500, "out of memory");
        }
        j->data = f;
        f->count = count;
        f->timeout = timeout;
        snprintf(f->path, sizeof f->path, "%s", path);
        j->fds[FORK_FD_STREAM] = mkostemp(f->path, O_CLOEXEC);
        if (j->fds[FORK_FD_STREAM] < 0) {
                r = hutch_error_set(&err, -errno, "temporary file: %m");
                f->path[0] = 0;
        }
        for (json_int_t i = 0; r >= 0 && i < count; i++) {
                snprintf(f->images[i], sizeof f->images[i], "%s/snapshots/.image-XXXXXX", srv->cfg.data_dir);
                if ((j->fds[FORK_FD_NEW + i] = mkostemp(f->images[i], O_CLOEXEC)) < 0) {
                        r = hutch_error_set(&err, -errno, "temporary file: %m");
                        f->images[i][0] = 0;
                }
        }
        if (r >= 0)
                r = layer_job_prepare(sb, j, FORK_FD_ROOT, FORK_FD_IMAGE, &f->uid_base, &err);
        if (r < 0) {
                snapjob_discard(srv, j);
                return snapshot_error(req, sb->id, r, err.msg);
        }
        if ((r = snapjob_start(srv, j, req, &err)) < 0)
                return snapshot_error(req, sb->id, r, err.msg);
        return MHD_YES;
}
