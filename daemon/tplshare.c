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
 * Only names that could be an image template are pulled: not host, base
 * or the code interpreter's names, not a snapshot id, not a template the
 * team built (those live in this node's database), and only when the
 * create would otherwise pass the team's sandbox limit.
 */
#include <errno.h>
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
#include "image/pull.h"
#include "image/reference.h"
#include "template/interp-template.h"
#include "template/template.h"
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
        if (snapjob_hold(srv, j, req) < 0) {
                http_reply_error(req->conn, 500, "out of memory");
                return;
        }
        req->resume_action = RESUME_DISPATCH; /* the create again, the template there */
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

int tplshare_begin(server *srv, request *req, json_t *body, enum MHD_Result *ret_mr) {
        snapjob *held = snapjob_held(req);
        if (held)
                return 0; /* pulled (or a snapshot's stream): the create goes on */
        if (!tplshare_on(srv))
                return 0;
        const char *name = json_string_value(json_object_get(body, "templateID"));
        if (!name || !wanted(srv, req->team, name) ||
            (uint64_t) sbx_live_count(srv, req->team) >= srv->cfg.max_sandboxes_per_team)
                return 0;
        char key[96];
        snprintf(key, sizeof key, "tplpull %s", name);
        snapjob *j = snapjob_find(srv, key);
        if (j && j->running) {
                *ret_mr = snapjob_join(srv, j, req) < 0
                        ? http_reply_error(req->conn, 500, "out of memory")
                        : MHD_YES;
                return 1;
        }
        if (j)
                return 0; /* done, still held by other creates: the template is there */
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
        snapjob *j = snapjob_held(req);
        if (j && j->ops == &pull_ops)
                snapjob_unhold(srv, req);
}
