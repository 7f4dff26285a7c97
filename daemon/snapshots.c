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
 * Everything here runs on the loop, synchronously: a snapshot of a large
 * layer holds every other request for as long as it takes (docs).
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
#include "daemon/usage.h"
#include "snapshot/seal.h"
#include "util/log.h"
#include "util/macro.h"

#define SNAP_PREFIX "snap_"
#define RESTORE_MAX_BYTES ((1ull << 42) + (1ull << 30)) /* the largest layer stream (storage.c) and its framing */
#define FORK_MAX 16

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

bool data_disk_has_room(server *srv, const char *dir, uint64_t bytes) {
        struct statvfs vfs;
        return statvfs(dir, &vfs) != 0 ||
               (uint64_t) vfs.f_bavail * vfs.f_frsize >= bytes * 2 + (uint64_t) srv->cfg.snapshot_reserve_bytes;
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
        /* the rename itself must survive a crash: sync the directory */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", final);
        char *slash = strrchr(dir, '/');
        if (slash)
                *slash = 0;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
                (void) fsync(dfd);
                close(dfd);
        }
        return 0;
}

/* Seal sb's layer into a new snapshot file; *ret filled. */
static int snapshot_take(server *srv, sbx *sb, const char *name, store_snapshot *ret, hutch_error *err) {
        store_snapshot sn = { 0 };
        /* bounded: per team, and never into the host's last free space
         * (layers, the database and other tenants share this disk) */
        int64_t have = 0;
        if (store_snapshot_count(srv->store, sb->team_id, &have, err) < 0)
                return -EIO;
        if ((uint64_t) have >= srv->cfg.max_snapshots_per_team)
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
        snap_id_new(sn.id);
        node_id_stamp(srv, sn.id + strlen(SNAP_PREFIX)); /* a router finds the snapshot's node by its id */
        sn.team_id = sb->team_id;
        snprintf(sn.sandbox_id, sizeof sn.sandbox_id, "%s", sb->id);
        snprintf(sn.name, sizeof sn.name, "%s", name ? name : "");
        snprintf(sn.template_id, sizeof sn.template_id, "%s", sb->template_id);
        sn.created_ms = wall_ms();

        char tmpl[PATH_MAX], final[PATH_MAX];
        snprintf(tmpl, sizeof tmpl, "%s/snapshots/.layer-XXXXXX", srv->cfg.data_dir);
        int lfd = mkostemp(tmpl, O_CLOEXEC);
        if (lfd < 0)
                return hutch_error_set(err, -errno, "temporary file: %m");
        unlink(tmpl); /* anonymous: gone with the fd whatever happens */

        /* gvisor: a memory checkpoint (processes, memory, files), taken
         * while the sandbox runs on; ns: frozen while the layer is read,
         * nothing may write meanwhile */
        bool was_paused = sb->paused;
        bool gv = hutch_sandbox_backend(sb->h) == HUTCH_BACKEND_GVISOR;
        int r = was_paused || gv ? 0 : hutch_sandbox_freeze(sb->h, err);
        uint64_t bytes = 0;
        if (gv && hutch_sandbox_is_suspended(sb->h)) {
                /* paused to disk: that checkpoint is the snapshot */
                r = sbx_pause_image_read(srv, sb, lfd, err);
                off_t end = r >= 0 ? lseek(lfd, 0, SEEK_END) : -1;
                bytes = end > 0 ? (uint64_t) end : 0;
        } else if (gv) {
                r = hutch_sandbox_checkpoint(sb->h, lfd, &bytes, err);
                /* the sandbox goes on through a new relay: a new control
                 * connection, and the old one's streams have ended */
                if (hutch_sandbox_fd(sb->h) >= 0 && sbx_reattach(srv, sb) < 0)
                        log_error("sandbox %s: watching its control connection again failed", sb->id);
        }
        else if (r >= 0) {
                r = hutch_sandbox_layer_export(sb->h, lfd, &bytes, err);
                if (!was_paused) {
                        hutch_error e2 = { 0 };
                        if (hutch_sandbox_thaw(sb->h, &e2) < 0)
                                log_error("sandbox %s: thawing after a snapshot failed: %s", sb->id, e2.msg);
                }
        }
        sbx_mark_dirty(sb);
        if (r < 0) {
                close(lfd);
                return r;
        }
        snap_path(srv, sn.id, final, sizeof final);
        char ctx[160], why[256] = "";
        snap_context(sn.team_id, sn.id, ctx, sizeof ctx);
        uint64_t sealed = 0;
        r = sealed_file_write(srv, lfd, final, ctx, &sealed, why, sizeof why);
        close(lfd);
        if (r < 0)
                return hutch_error_set(err, r, "sealing the snapshot: %s", why);
        sn.bytes = (int64_t) sealed;
        sn.disk_mb = sb->disk_mb;
        if ((r = store_snapshot_insert(srv->store, &sn, err)) < 0) {
                unlink(final);
                return r;
        }
        usage_storage_changed(srv);
        *ret = sn;
        return 0;
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

/* An answer that says what the client can act on, never a host path. */
static enum MHD_Result snapshot_error(request *req, sbx *sb, int r, const hutch_error *err) {
        if (r == -EOPNOTSUPP)
                return http_reply_error(req->conn, 409, "%s", err->msg);
        if (r == -EDQUOT)
                return http_reply_error(req->conn, 429, "%s", err->msg);
        if (r == -ENOSPC)
                return http_reply_error(req->conn, 507, "%s", err->msg);
        log_error("sandbox %s: snapshot: %s", sb->id, err->msg);
        return http_reply_error(req->conn, 500, "the snapshot failed (the daemon's log has why)");
}

/* POST /sandboxes/{id}/snapshots {name?} */
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
        store_snapshot sn;
        hutch_error err = { 0 };
        int r = snapshot_take(srv, sb, name, &sn, &err);
        json_decref(body);
        if (r < 0)
                return snapshot_error(req, sb, r, &err);
        char detail[128];
        snprintf(detail, sizeof detail, "{\"snapshot\":\"%s\"}", sn.id);
        (void) store_event_add(srv->store, sb->team_id, sb->id, "sandbox.snapshot", detail, &err);
        json_t *j = snapshot_json(&sn);
        return http_reply_json(req->conn, 201, j);
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
        if (unlink(path) < 0 && errno != ENOENT)
                log_warning("snapshot %s: removing %s: %m", id, path);
        char detail[128];
        snprintf(detail, sizeof detail, "{\"snapshot\":\"%s\"}", id);
        (void) store_event_add(srv->store, req->team, NULL, "snapshot.delete", detail, &err);
        return http_reply_empty(req->conn, 204);
}

/* POST /sandboxes/{id}/fork {count?, timeout?}: a snapshot of the layer,
 * then count sandboxes from it, each with the parent's metadata,
 * environment and network; the snapshot itself is not kept. */
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
        /* the team limit first: no snapshot for forks that cannot be made */
        if ((uint64_t) sbx_live_count(srv, sb->team_id) + (uint64_t) count > srv->cfg.max_sandboxes_per_team)
                return http_reply_error(req->conn, 429, "%lld forks would exceed the team's limit of %llu live sandboxes",
                                        (long long) count, (unsigned long long) srv->cfg.max_sandboxes_per_team);
        store_snapshot sn;
        hutch_error err = { 0 };
        int r = snapshot_take(srv, sb, NULL, &sn, &err);
        if (r < 0)
                return snapshot_error(req, sb, r, &err);
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
        /* unsealed once: every fork's create reads the same verified stream */
        store_snapshot meta;
        if (snapshot_unseal(srv, sn.team_id, sn.id, &meta, srv->fork_stream, sizeof srv->fork_stream, &err) >= 0)
                snprintf(srv->fork_snapshot, sizeof srv->fork_snapshot, "%s", sn.id);
        else
                srv->fork_stream[0] = 0;
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
                int k = sbx_create(srv, sb->team_id, cb, &child, &status, &e2);
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
        if (srv->fork_stream[0])
                unlink(srv->fork_stream);
        srv->fork_stream[0] = srv->fork_snapshot[0] = 0;
        /* the forks have their layers: the snapshot goes (the row first: a
         * crash then leaves a file the next start sweeps, never a row
         * without its file) */
        char path[PATH_MAX];
        snap_path(srv, sn.id, path, sizeof path);
        (void) store_snapshot_delete(srv->store, sn.team_id, sn.id, &err);
        usage_storage_changed(srv);
        unlink(path);
        enum MHD_Result mr = http_reply_json(req->conn, 201, out);
        if (mr == MHD_YES)
                sbx_create_queued(srv, req);
        return mr;
}
