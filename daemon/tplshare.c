/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Templates shared between nodes through a registry (issue #18,
 * docs/scale-out.md "Templates through a registry"). With the
 * template-registry setting (REGISTRY/PATH), a create naming an image
 * template this node does not have pulls REGISTRY/PATH/<name>:latest
 * first, then runs as if the template had always been there. What is
 * there was put there by `hutch template push` (lib/image/push.h) on any
 * node.
 *
 * The pull runs off the loop, as a snapshot's restore does: a snapjob
 * (daemon/snapjob.c) whose worker calls image_pull() (the same code as
 * `hutch template pull`: registries.conf's insecure and ca lines,
 * registries.auth's credentials, the layer store's dedup), the create's
 * connection suspended meanwhile. Creates of one missing template share
 * one job (its key names the template), whichever teams they come from:
 * such a template is every team's, as one pulled by `hutch template pull`
 * is. When it is done each waiting create is dispatched again and finds the
 * template, or is answered: 404 in E2B's shape when the registry has no
 * such image, 502 when the registry cannot be asked or refuses.
 *
 * At most TPLSHARE_PULLS_MAX pulls of different templates run at once
 * (429 with Retry-After beyond): a client that names many templates the
 * registry lacks costs the node that many manifest requests, not that many
 * workers at once.
 *
 * Snapshots travel the same way (below, "snapshots"): pushed when sealed,
 * pulled by a create from one this node has no row for.
 *
 * Only names that could be an image template are pulled: not host, base
 * or the code interpreter's names, not a snapshot id, not a template the
 * team built (those live in this node's database), and only when the
 * create would otherwise pass the team's sandbox limit.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/metrics.h"
#include "daemon/server.h"
#include "daemon/snapjob.h"
#include "daemon/templates.h"
#include "daemon/usage.h"
#include "image/pull.h"
#include "image/push.h"
#include "image/reference.h"
#include "snapshot/seal.h"
#include "store/store.h"
#include "template/interp-template.h"
#include "template/template.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"

#define TPLSHARE_PULLS_MAX 8

typedef struct pull_job {
        char name[64];
        char ref[1400];
        int64_t team; /* of the create that started it: its audit record's */
        /* the worker's, set before it is forked (j->srv is not, then) */
        const char *data_dir;
        image_pull_opts opts;
        int r;
        unsigned status;
        char msg[600];
} pull_job;

static int pull_work(snapjob *j, int msg_fd) {
        pull_job *pj = j->data;
        hutch_error e = { 0 };
        image_pull_result res = { 0 };
        int r = image_pull(pj->data_dir, pj->ref, pj->name, &pj->opts, NULL, &res, &e);
        snapjob_send(msg_fd, SNAPJOB_DONE, r, res.bytes_downloaded, res.blobs_downloaded,
                     r < 0 ? e.msg : NULL);
        image_pull_result_clear(&res);
        return r;
}

static void pull_done(server *srv, snapjob *j, const snapjob_msg *m) {
        pull_job *pj = j->data;
        pj->r = m->r;
        if (m->r >= 0) {
                log_info("template-registry: pulled %s as template %s (%llu bytes downloaded)",
                         pj->ref, pj->name, (unsigned long long) m->bytes);
                metrics_template_pull(srv, (int64_t) m->bytes);
                json_t *d = json_pack("{s:s, s:s, s:I, s:s}", "ref", pj->ref, "image", pj->name,
                                      "bytes_downloaded", (json_int_t) m->bytes, "by",
                                      "template-registry");
                char *txt = d ? json_dumps(d, JSON_COMPACT) : NULL;
                json_decref(d);
                hutch_error e = { 0 };
                if (txt && store_event_add(srv->store, pj->team, NULL, "template.pull", txt, &e) < 0)
                        log_warning("template.pull: database: %s", e.msg);
                free(txt);
                return;
        }
        if (m->r == -ENOENT) {
                pj->status = 404;
                snprintf(pj->msg, sizeof pj->msg,
                         "template '%s' not found (not on this node, and the template registry has no %s)",
                         pj->name, pj->ref);
                log_info("template-registry: %s: %s", pj->ref, m->why);
                return;
        }
        pj->status = 502;
        snprintf(pj->msg, sizeof pj->msg,
                 "template '%s' is not on this node and pulling it from the template registry failed: %s",
                 pj->name, m->why);
        log_error("template-registry: pulling %s: %s", pj->ref, m->why);
}

static void pull_answer(server *srv, snapjob *j, request *req) {
        pull_job *pj = j->data;
        if (pj->r < 0) {
                http_reply_error(req->conn, pj->status, "%s", pj->msg);
                return;
        }
        /* the create again, the template there (nothing to hold: it stays,
         * and the next look finds it) */
        req->resume_action = RESUME_DISPATCH;
}

static unsigned n_pulls; /* jobs started and not yet released */

static void pull_release(server *srv, snapjob *j) {
        if (j->data)
                n_pulls--;
        free(j->data);
        j->data = NULL;
}

static const snapjob_ops pull_ops = {
        .what = "template pull",
        .work = pull_work,
        .done = pull_done,
        .answer = pull_answer,
        .release = pull_release,
};

bool tplshare_on(const server *srv) {
        return !streq(srv->cfg.template_registry, "-");
}

/* Whether a create of name would find no template here and could find one
 * in the registry. */
static bool wanted(server *srv, int64_t team, const char *name) {
        if (template_validate_name(name) < 0 || template_names_host(srv->cfg.data_dir, name) ||
            template_is_interp(name) || snapshot_id_valid(name) || streq(name, "host") ||
            streq(name, "base"))
                return false;
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/templates/%s", srv->cfg.data_dir, name);
        if (lstat(path, &st) == 0)
                return false; /* it is here (or something is: the create says what) */
        char tid[32], alias[64];
        json_t *built = NULL;
        hutch_error e = { 0 };
        if (templates_resolve(srv, team, name, tid, alias, &built, &e) == 0) {
                json_decref(built);
                return false;
        }
        return true;
}

/* ------------------------------------------------------------- snapshots
 *
 * A snapshot sealed on this node is pushed, in the background, as
 * REGISTRY/PATH/snapshots:<id>: an OCI artifact whose one layer is the
 * sealed file as it is (AES-256-GCM under this node's secrets.key) and
 * whose config says what the row says, the team by name and the context
 * the file is sealed under. A create from a snapshot this node has no row
 * for pulls it: the team in the config must be the creating key's team
 * (by name: team ids differ between nodes), the file is opened with this
 * node's key under the origin's context and sealed again under this
 * node's, the row written, and the create restores it as any other. So
 * every node needs the same secrets.key (docs/scale-out.md). */

#define SNAP_CONFIG_TYPE "application/vnd.hutch.snapshot.config.v1+json"
#define SNAP_LAYER_TYPE "application/vnd.hutch.snapshot.sealed.v1"
#define SNAP_PULL_MAX_BYTES (1ull << 42)

typedef struct snap_push_job {
        char id[32], ref[1400];
        char tombstone[PATH_MAX]; /* a delete's marker, removed once pushed ("" a snapshot) */
        const char *data_dir;
        image_push_opts opts;
        char *config;
} snap_push_job;

enum { SP_FD_SEALED };

static void tombstone_path(server *srv, const char *id, char *buf, size_t n);
static void tombstone_push(server *srv, const char *id);

static int snap_push_work(snapjob *j, int msg_fd) {
        snap_push_job *sj = j->data;
        hutch_error e = { 0 };
        char digest[72];
        int r = image_push_artifact(sj->data_dir, sj->ref, &sj->opts, SNAP_CONFIG_TYPE, sj->config,
                                    SNAP_LAYER_TYPE, j->fds[SP_FD_SEALED], digest, &e);
        snapjob_send(msg_fd, SNAPJOB_DONE, r, 0, 0, r < 0 ? e.msg : NULL);
        return r;
}

static void snap_push_done(server *srv, snapjob *j, const snapjob_msg *m) {
        snap_push_job *sj = j->data;
        if (sj->tombstone[0]) {
                if (m->r < 0)
                        log_error("template-registry: marking snapshot %s deleted at %s: %s (this "
                                  "node keeps refusing it; other nodes may still restore it)",
                                  sj->id, sj->ref, m->why);
                else {
                        log_info("template-registry: snapshot %s marked deleted at %s", sj->id,
                                 sj->ref);
                        (void) unlink(sj->tombstone);
                }
                return;
        }
        if (m->r < 0)
                log_error("template-registry: pushing snapshot %s to %s: %s (it is restored on "
                          "this node only)",
                          sj->id, sj->ref, m->why);
        else
                log_info("template-registry: pushed snapshot %s as %s", sj->id, sj->ref);
        /* deleted while it was pushed: the tombstone goes after it */
        char tomb[PATH_MAX];
        tombstone_path(srv, sj->id, tomb, sizeof tomb);
        if (m->r >= 0 && access(tomb, F_OK) == 0)
                tombstone_push(srv, sj->id);
}

static void snap_push_answer(server *srv, snapjob *j, request *req) {
}

static void snap_push_release(server *srv, snapjob *j) {
        snap_push_job *sj = j->data;
        if (sj)
                free(sj->config);
        free(sj);
        j->data = NULL;
}

static const snapjob_ops snap_push_ops = {
        .what = "snapshot push",
        .work = snap_push_work,
        .done = snap_push_done,
        .answer = snap_push_answer,
        .release = snap_push_release,
};

/* A job that pushes layer_fd (taken) with config c (taken) as
 * PATH/snapshots:<id>; what says what for the log. NULL (logged, layer_fd
 * closed) when it cannot be made. */
static snapjob *snap_push_job_new(server *srv, const char *id, json_t *c, int layer_fd,
                                  const char *key_verb, const char *what) {
        snap_push_job *sj = calloc(1, sizeof *sj);
        snapjob *j = sj ? snapjob_new(&snap_push_ops, 0, NULL) : NULL;
        if (sj)
                sj->config = c ? json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(c);
        if (!j || !sj->config) {
                if (sj)
                        free(sj->config);
                free(sj);
                free(j);
                safe_close(layer_fd);
                log_error("template-registry: snapshot %s: out of memory: %s", id, what);
                return NULL;
        }
        j->data = sj;
        snprintf(sj->id, sizeof sj->id, "%s", id);
        snprintf(sj->ref, sizeof sj->ref, "%s/snapshots:%s", srv->cfg.template_registry, id);
        snprintf(j->key, sizeof j->key, "%s %s", key_verb, id);
        sj->data_dir = srv->cfg.data_dir;
        sj->opts.conf_path = streq(srv->cfg.registries_conf, "-") ? NULL : srv->cfg.registries_conf;
        sj->opts.ca_file = streq(srv->cfg.registry_ca, "-") ? NULL : srv->cfg.registry_ca;
        j->fds[SP_FD_SEALED] = layer_fd;
        return j;
}

void tplshare_snapshot_push(server *srv, const store_snapshot *sn, const char *ctx) {
        if (!tplshare_on(srv))
                return;
        char team[STORE_NAME_MAX + 1];
        hutch_error e = { 0 };
        if (store_team_name(srv->store, sn->team_id, team, sizeof team, &e) < 0) {
                log_error("template-registry: snapshot %s: %s: not pushed", sn->id, e.msg);
                return;
        }
        char path[PATH_MAX];
        snapshot_file(srv, sn->id, path, sizeof path);
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
                log_error("template-registry: snapshot %s: %s: %m: not pushed", sn->id, path);
                return;
        }
        json_t *c = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:s}", "id", sn->id,
                              "team", team, "context", ctx, "template", sn->template_id, "sandbox",
                              sn->sandbox_id, "name", sn->name, "diskMB", (json_int_t) sn->disk_mb,
                              "bytes", (json_int_t) sn->bytes, "createdMs",
                              (json_int_t) sn->created_ms, "node", srv->cfg.node_id);
        snapjob *j = snap_push_job_new(srv, sn->id, c, fd, "snappush", "not pushed");
        if (j && snapjob_start(srv, j, NULL, &e) < 0)
                log_error("template-registry: snapshot %s: %s: not pushed", sn->id, e.msg);
}

/* <id>.deleted beside the snapshots: a snapshot deleted here whose
 * tombstone the registry does not hold yet, so it is never pulled back */
static void tombstone_path(server *srv, const char *id, char *buf, size_t n) {
        snprintf(buf, n, "%s/snapshots/%s.deleted", srv->cfg.data_dir, id);
}

void tplshare_snapshot_deleted(server *srv, const char *id) {
        if (!tplshare_on(srv))
                return;
        char tomb[PATH_MAX], key[96];
        tombstone_path(srv, id, tomb, sizeof tomb);
        int fd = open(tomb, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0)
                close(fd);
        snprintf(key, sizeof key, "snappush %s", id);
        snapjob *pj = snapjob_find(srv, key);
        if (pj && pj->running)
                return; /* its push is still on the way: the tombstone follows it */
        tombstone_push(srv, id);
}

static void tombstone_push(server *srv, const char *id) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/snapshots", srv->cfg.data_dir);
        /* the layer: nothing */
        int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
                log_error("template-registry: snapshot %s: %s: %m: not marked deleted", id, dir);
                return;
        }
        snapjob *j = snap_push_job_new(srv, id, json_pack("{s:s, s:b}", "id", id, "deleted", 1), fd,
                                       "snapdel", "not marked deleted");
        if (!j)
                return;
        snap_push_job *sj = j->data;
        tombstone_path(srv, id, sj->tombstone, sizeof sj->tombstone);
        hutch_error e = { 0 };
        if (snapjob_start(srv, j, NULL, &e) < 0)
                log_error("template-registry: snapshot %s: %s: not marked deleted", id, e.msg);
}

typedef struct snap_pull_job {
        char id[32], ref[1400];
        const char *data_dir;
        image_push_opts opts;
        const uint8_t *key;
        int64_t team;
        char team_name[STORE_NAME_MAX + 1];
        char ctx[160];                         /* this node's context for it */
        char sealed[PATH_MAX], meta[PATH_MAX]; /* named temporary files, "" once gone */
        int r;
        unsigned status;
        char msg[600];
} snap_pull_job;

enum { SPL_FD_DOWNLOAD, SPL_FD_PLAIN, SPL_FD_SEALED, SPL_FD_META };

static int snap_pull_work(snapjob *j, int msg_fd) {
        snap_pull_job *sj = j->data;
        hutch_error e = { 0 };
        char *cfg = NULL;
        char why[240] = "";
        int r = image_pull_artifact(sj->data_dir, sj->ref, &sj->opts, SNAP_CONFIG_TYPE,
                                    SNAP_LAYER_TYPE, SNAP_PULL_MAX_BYTES, &cfg,
                                    j->fds[SPL_FD_DOWNLOAD], &e);
        if (r < 0)
                snprintf(why, sizeof why, "%s", e.msg);
        json_t *c = r >= 0 ? json_loads(cfg, JSON_REJECT_DUPLICATES, NULL) : NULL;
        free(cfg);
        const char *team = json_string_value(json_object_get(c, "team"));
        const char *octx = json_string_value(json_object_get(c, "context"));
        const char *id = json_string_value(json_object_get(c, "id"));
        if (r >= 0 && json_is_true(json_object_get(c, "deleted"))) {
                r = -ENOENT; /* deleted on its node */
                snprintf(why, sizeof why, "%s was deleted", sj->ref);
        }
        if (r >= 0 && (!team || !octx || !id || !streq(id, sj->id) || strlen(octx) >= 160)) {
                r = -EBADMSG;
                snprintf(why, sizeof why, "%s is not a hutch snapshot's artifact", sj->ref);
        }
        if (r >= 0 && !streq(team, sj->team_name)) {
                r = -EACCES; /* another team's: as if there were none */
                snprintf(why, sizeof why, "%s is another team's", sj->ref);
        }
        /* opened with this node's key under the origin's context, sealed
         * again under this node's */
        if (r >= 0 && lseek(j->fds[SPL_FD_DOWNLOAD], 0, SEEK_SET) < 0)
                r = -errno;
        if (r >= 0)
                r = seal_read_fd(j->fds[SPL_FD_DOWNLOAD], j->fds[SPL_FD_PLAIN], sj->key, octx,
                                 SNAP_PULL_MAX_BYTES, why, sizeof why);
        if (r >= 0 && lseek(j->fds[SPL_FD_PLAIN], 0, SEEK_SET) < 0)
                r = -errno;
        if (r >= 0)
                r = seal_write_fd(j->fds[SPL_FD_PLAIN], j->fds[SPL_FD_SEALED], sj->key, sj->ctx,
                                  true, NULL, why, sizeof why);
        if (r >= 0 && fsync(j->fds[SPL_FD_SEALED]) < 0)
                r = -errno;
        char *meta = r >= 0 ? json_dumps(c, JSON_COMPACT) : NULL;
        if (r >= 0 && (!meta || fd_write_all(j->fds[SPL_FD_META], meta, strlen(meta)) < 0))
                r = -EIO;
        free(meta);
        json_decref(c);
        if (r < 0 && !why[0])
                snprintf(why, sizeof why, "%s", strerror(-r));
        snapjob_send(msg_fd, SNAPJOB_DONE, r, 0, 0, r < 0 ? why : NULL);
        return r;
}

static void snap_pull_done(server *srv, snapjob *j, const snapjob_msg *m) {
        snap_pull_job *sj = j->data;
        sj->r = m->r;
        if (m->r == -ENOENT || m->r == -EACCES) {
                sj->status = 404;
                snprintf(sj->msg, sizeof sj->msg, "template '%s' not found", sj->id);
                log_info("template-registry: snapshot %s: %s", sj->id, m->why);
                return;
        }
        if (m->r == -EBADMSG || m->r == -EPERM) {
                sj->status = 422;
                snprintf(sj->msg, sizeof sj->msg,
                         "snapshot %s cannot be restored on this node: %s (every node needs the "
                         "same secrets.key, docs/scale-out.md)",
                         sj->id, m->why);
                log_warning("template-registry: %s", sj->msg);
                return;
        }
        if (m->r < 0) {
                sj->status = 502;
                snprintf(sj->msg, sizeof sj->msg,
                         "snapshot %s is not on this node and pulling it from the template "
                         "registry failed: %s",
                         sj->id, m->why);
                log_error("template-registry: %s", sj->msg);
                return;
        }
        /* the row, from what the origin's row said */
        json_error_t je;
        json_t *c = json_load_file(sj->meta, JSON_REJECT_DUPLICATES, &je);
        store_snapshot sn = { .team_id = sj->team };
        snprintf(sn.id, sizeof sn.id, "%s", sj->id);
        snprintf(sn.sandbox_id, sizeof sn.sandbox_id, "%s",
                 json_string_value(json_object_get(c, "sandbox")) ?: "");
        snprintf(sn.name, sizeof sn.name, "%s", json_string_value(json_object_get(c, "name")) ?: "");
        snprintf(sn.template_id, sizeof sn.template_id, "%s",
                 json_string_value(json_object_get(c, "template")) ?: "");
        sn.disk_mb = json_integer_value(json_object_get(c, "diskMB"));
        sn.bytes = json_integer_value(json_object_get(c, "bytes"));
        sn.created_ms = json_integer_value(json_object_get(c, "createdMs"));
        json_decref(c);
        char final[PATH_MAX];
        snapshot_file(srv, sj->id, final, sizeof final);
        hutch_error e = { 0 };
        int r = rename(sj->sealed, final) < 0 ? -errno : 0;
        if (r == 0) {
                sj->sealed[0] = 0;
                if ((r = store_snapshot_insert(srv->store, &sn, &e)) < 0)
                        unlink(final);
        } else
                snprintf(e.msg, sizeof e.msg, "%s", strerror(-r));
        if (r < 0) {
                sj->r = r;
                sj->status = 500;
                snprintf(sj->msg, sizeof sj->msg, "snapshot %s: %s", sj->id, e.msg);
                log_error("template-registry: %s", sj->msg);
                return;
        }
        log_info("template-registry: pulled snapshot %s from %s", sj->id, sj->ref);
        usage_storage_changed(srv);
        char detail[1600];
        snprintf(detail, sizeof detail, "{\"snapshot\":\"%s\",\"by\":\"template-registry\"}", sj->id);
        (void) store_event_add(srv->store, sj->team, NULL, "snapshot.pull", detail, &e);
}

static void snap_pull_answer(server *srv, snapjob *j, request *req) {
        snap_pull_job *sj = j->data;
        if (sj->r < 0) {
                http_reply_error(req->conn, sj->status, "%s", sj->msg);
                return;
        }
        /* its row is there now: the create restores it as any other */
        req->resume_action = RESUME_DISPATCH;
}

static void snap_pull_release(server *srv, snapjob *j) {
        snap_pull_job *sj = j->data;
        if (!sj)
                return;
        if (sj->sealed[0])
                unlink(sj->sealed);
        if (sj->meta[0])
                unlink(sj->meta);
        n_pulls--;
        free(sj);
        j->data = NULL;
}

static const snapjob_ops snap_pull_ops = {
        .what = "snapshot pull",
        .work = snap_pull_work,
        .done = snap_pull_done,
        .answer = snap_pull_answer,
        .release = snap_pull_release,
};

/* A create from a snapshot no team has here: pulled (1, *ret_mr), or 0. */
static int snapshot_begin(server *srv, request *req, const char *id, enum MHD_Result *ret_mr) {
        store_snapshot have;
        hutch_error e = { 0 };
        if (store_snapshot_find(srv->store, id, &have, &e) == 0)
                return 0; /* here (the team's, or not: the create says 404) */
        char tomb[PATH_MAX];
        tombstone_path(srv, id, tomb, sizeof tomb);
        if (access(tomb, F_OK) == 0)
                return 0; /* deleted here: never pulled back (the create says 404) */
        char key[96];
        snprintf(key, sizeof key, "snappull %lld %s", (long long) req->team, id);
        snapjob *j = snapjob_find(srv, key);
        if (j && j->running) {
                *ret_mr = snapjob_join(srv, j, req) < 0
                        ? http_reply_error(req->conn, 500, "out of memory")
                        : MHD_YES;
                return 1;
        }
        if (n_pulls >= TPLSHARE_PULLS_MAX) {
                *ret_mr = http_reply_429(req->conn, 1,
                                         "%u templates and snapshots are being pulled from the "
                                         "template registry, the most at once: try again later",
                                         n_pulls);
                return 1;
        }
        snap_pull_job *sj = calloc(1, sizeof *sj);
        j = sj ? snapjob_new(&snap_pull_ops, req->team, NULL) : NULL;
        if (!j) {
                free(sj);
                *ret_mr = http_reply_error(req->conn, 500, "out of memory");
                return 1;
        }
        j->data = sj;
        n_pulls++;
        snprintf(j->key, sizeof j->key, "%s", key);
        snprintf(sj->id, sizeof sj->id, "%s", id);
        snprintf(sj->ref, sizeof sj->ref, "%s/snapshots:%s", srv->cfg.template_registry, id);
        sj->data_dir = srv->cfg.data_dir;
        sj->opts.conf_path = streq(srv->cfg.registries_conf, "-") ? NULL : srv->cfg.registries_conf;
        sj->opts.ca_file = streq(srv->cfg.registry_ca, "-") ? NULL : srv->cfg.registry_ca;
        sj->key = srv->data_key;
        sj->team = req->team;
        snapshot_seal_context(req->team, id, sj->ctx, sizeof sj->ctx);
        int r = store_team_name(srv->store, req->team, sj->team_name, sizeof sj->team_name, &e);
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/snapshots", srv->cfg.data_dir);
        if (r >= 0 &&
            ((j->fds[SPL_FD_DOWNLOAD] = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) < 0 ||
             (j->fds[SPL_FD_PLAIN] = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) < 0))
                r = hutch_error_set(&e, -errno, "temporary file in %s: %m", dir);
        snprintf(sj->sealed, sizeof sj->sealed, "%s/.pull-XXXXXX", dir);
        if (r >= 0 && (j->fds[SPL_FD_SEALED] = mkostemp(sj->sealed, O_CLOEXEC)) < 0) {
                sj->sealed[0] = 0;
                r = hutch_error_set(&e, -errno, "temporary file in %s: %m", dir);
        } else if (r < 0)
                sj->sealed[0] = 0;
        snprintf(sj->meta, sizeof sj->meta, "%s/.pull-XXXXXX", dir);
        if (r >= 0 && (j->fds[SPL_FD_META] = mkostemp(sj->meta, O_CLOEXEC)) < 0) {
                sj->meta[0] = 0;
                r = hutch_error_set(&e, -errno, "temporary file in %s: %m", dir);
        } else if (r < 0)
                sj->meta[0] = 0;
        if (r < 0) {
                snapjob_discard(srv, j);
                log_error("create: %s", e.msg);
                *ret_mr = http_reply_error(req->conn, 500, "%s", e.msg);
                return 1;
        }
        log_info("template-registry: snapshot %s is not here: pulling %s", id, sj->ref);
        if (snapjob_start(srv, j, req, &e) < 0) {
                log_error("create: %s", e.msg);
                *ret_mr = http_reply_error(req->conn, 500, "%s", e.msg);
                return 1;
        }
        *ret_mr = MHD_YES;
        return 1;
}

static int template_begin(server *srv, request *req, const char *name, enum MHD_Result *ret_mr);

int tplshare_begin(server *srv, request *req, json_t *body, enum MHD_Result *ret_mr) {
        if (snapjob_held(req))
                return 0; /* a snapshot's stream, unsealed: the create goes on */
        if (!tplshare_on(srv))
                return 0;
        const char *name = json_string_value(json_object_get(body, "templateID"));
        if (!name || (uint64_t) sbx_live_count(srv, req->team) >= srv->cfg.max_sandboxes_per_team)
                return 0;
        if (snapshot_id_valid(name)) {
                /* the team's snapshot here: the image template it restores
                 * over, pulled first when it is not; none here: pulled */
                store_snapshot sn;
                hutch_error e = { 0 };
                if (store_snapshot_get(srv->store, req->team, name, &sn, &e) < 0)
                        return snapshot_begin(srv, req, name, ret_mr);
                if (sn.template_id[0] && wanted(srv, req->team, sn.template_id))
                        return template_begin(srv, req, sn.template_id, ret_mr);
                return 0;
        }
        if (!wanted(srv, req->team, name))
                return 0;
        return template_begin(srv, req, name, ret_mr);
}

static int template_begin(server *srv, request *req, const char *name, enum MHD_Result *ret_mr) {
        char key[96];
        snprintf(key, sizeof key, "tplpull %s", name);
        snapjob *j = snapjob_find(srv, key);
        if (j && j->running) {
                *ret_mr = snapjob_join(srv, j, req) < 0
                        ? http_reply_error(req->conn, 500, "out of memory")
                        : MHD_YES;
                return 1;
        }
        /* a name no reference can hold: nothing to ask the registry */
        char ref[sizeof((pull_job *) 0)->ref];
        image_reference ir = { 0 };
        hutch_error e1 = { 0 };
        snprintf(ref, sizeof ref, "%s/%s:latest", srv->cfg.template_registry, name);
        int k = image_reference_parse(ref, &ir, &e1);
        image_reference_clear(&ir);
        if (k < 0)
                return 0;
        if (n_pulls >= TPLSHARE_PULLS_MAX) {
                *ret_mr = http_reply_429(req->conn, 1,
                                         "%u templates are being pulled from the template registry, "
                                         "the most at once: try again later",
                                         n_pulls);
                return 1;
        }
        pull_job *pj = calloc(1, sizeof *pj);
        j = pj ? snapjob_new(&pull_ops, 0, NULL) : NULL;
        if (!j) {
                free(pj);
                *ret_mr = http_reply_error(req->conn, 500, "out of memory");
                return 1;
        }
        j->data = pj;
        snprintf(j->key, sizeof j->key, "%s", key);
        snprintf(pj->name, sizeof pj->name, "%s", name);
        snprintf(pj->ref, sizeof pj->ref, "%s", ref);
        n_pulls++;
        pj->team = req->team;
        pj->data_dir = srv->cfg.data_dir;
        server_pull_opts(srv, &pj->opts);
        /* the operator named this registry: not only registries.conf's */
        pj->opts.configured_only = false;
        log_info("template-registry: template %s is not here: pulling %s", name, pj->ref);
        hutch_error err = { 0 };
        if (snapjob_start(srv, j, req, &err) < 0) {
                log_error("create: %s", err.msg);
                *ret_mr = http_reply_error(req->conn, 500, "%s", err.msg);
                return 1;
        }
        *ret_mr = MHD_YES;
        return 1;
}

void tplshare_end(server *srv, request *req) {
        (void) srv;
        (void) req; /* a pull's result is on disk: nothing held (the restore's is snapshots.c's) */
}
