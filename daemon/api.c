/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Routing (docs/protocol.md §a.4) and the control plane (§b).
 *
 *   no E2b-Sandbox-Port header          → control plane, X-API-KEY
 *   E2b-Sandbox-Port: 49983             → envd of E2b-Sandbox-Id, X-Access-Token
 *   /files?signature=… without headers  → envd of the sandbox whose token signs it
 *   unknown / killed / paused sandbox   → 502 with E2B's body
 *
 * Another team's sandbox answers exactly like one that never existed.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "daemon/ingress.h"
#include "daemon/ingress_http.h"
#include "daemon/keysfile.h"
#include "daemon/node.h"
#include "daemon/route.h"
#include "daemon/audit.h"
#include "daemon/server.h"
#include "daemon/templates.h"
#include "template/interp-template.h"
#include "daemon/usage.h"
#include "util/error.h"
#include "util/log.h"

static enum MHD_Result not_found_sbx(struct MHD_Connection *c, const char *id) {
        return http_reply_error(c, 404, "sandbox \"%s\" doesn't exist or you don't have access to it", id);
}

/* --------------------------------------------------------------- routing */

enum MHD_Result api_begin(server *srv, request *req, bool *ret_responded) {
        struct MHD_Connection *c = req->conn;
        const char *port = http_header(c, "E2b-Sandbox-Port");
        const char *id = http_header(c, "E2b-Sandbox-Id");
        /* Clients that reach us through wildcard DNS instead of
         * E2B_SANDBOX_URL: Host "<port>-<id>.<sandbox-domain>"
         * (docs/api.md "Sandbox ports") */
        char host_port[8], host_id[HUTCH_ID_LEN + 1];
        unsigned hp;
        const char *host = http_header(c, "Host");
        if (!port && host && ingress_host_parse(host, srv->cfg.sandbox_domain, &hp, host_id) == 0) {
                snprintf(host_port, sizeof host_port, "%u", hp);
                port = host_port;
                id = host_id;
        }
        bool is_files = streq(req->url, "/files");
        sbx *sb = NULL;
        *ret_responded = true;

        /* the volume content plane: its own token, never an API key */
        if (!port && startswith(req->url, "/volumecontent/")) {
                const char *cl = http_header(c, "Content-Length");
                if (!streq(req->method, "PUT") && cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes)
                        return http_reply_error(c, 413, "request body exceeds %llu bytes",
                                                (unsigned long long) srv->cfg.max_body_bytes);
                return volumes_content_begin(srv, req, ret_responded);
        }

        if (port) {
                req->data_plane = true;
                unsigned pn;
                if (ingress_port_parse(port, &pn) < 0)
                        return http_reply_error(c, 400, "E2b-Sandbox-Port must be a port number, 1 to 65535");
                if (!id || !route_sandbox_id_valid(id))
                        return http_reply_502(c, id && strlen(id) <= HUTCH_ID_LEN ? id : "");
                sb = sbx_find(srv, id);
                if (!sb)
                        return http_reply_502(c, id);
                /* a private sandbox's ports take its traffic token, before
                 * anything (auto-resume included) happens */
                if (ingress_check_access(srv, req, sb, pn) < 0)
                        return ingress_reply_forbidden(c, sb->id,
                                                       !http_header(c, "E2b-Traffic-Access-Token"));
                if (sb->paused && ingress_auto_resume(srv, sb) < 0)
                        return http_reply_502(c, id);
                if (pn != ENVD_PORT) {
                        memcpy(req->sbx_id, sb->id, sizeof req->sbx_id);
                        return ingress_begin(srv, req, sb, pn, ret_responded);
                }
        } else if (is_files && http_query(c, "signature")) {
                req->data_plane = true;
                sb = files_signed_sandbox(srv, c, streq(req->method, "POST"));
                if (!sb)
                        return http_reply_error(c, 401, "invalid signature");
                if (sb->paused)
                        return http_reply_502(c, sb->id);
        }

        if (req->data_plane) {
                memcpy(req->sbx_id, sb->id, sizeof req->sbx_id);
                bool token_optional = streq(req->url, "/health") || is_files;
                if (streq(req->url, "/health") && !streq(req->method, "GET") && !streq(req->method, "HEAD"))
                        return http_reply_error(c, 405, "method %s not allowed on /health", req->method);
                const char *tok = http_header(c, "X-Access-Token");
                if (tok) {
                        if (!const_time_eq(tok, sb->token)) {
                                if (is_files)
                                        return http_reply_error(c, 401,
                                                                "access token present in header but does not match");
                                return http_reply_connect_error(c, "unauthenticated", "invalid access token");
                        }
                } else if (!token_optional)
                        return http_reply_connect_error(c, "unauthenticated", "missing access token");
                if (tok || (is_files && http_query(c, "signature")))
                        http_conn_authenticated(req);
                const char *cl = http_header(c, "Content-Length");
                if (!is_files && cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes)
                        return http_reply_error(c, 413, "request body exceeds %llu bytes",
                                                (unsigned long long) srv->cfg.max_body_bytes);
                if (is_files && streq(req->method, "POST")) {
                        /* an upload asks the sandbox's init at once: not while
                         * a worker copies its layer (snapjob.c) */
                        if (snapjob_park(srv, req, sb, RESUME_BEGIN)) {
                                *ret_responded = false;
                                return MHD_YES;
                        }
                        req->body_mode = BODY_FILES;
                        enum MHD_Result mr = files_begin(srv, req, sb);
                        *ret_responded = req->responded;
                        return mr;
                }
                *ret_responded = false;
                return MHD_YES;
        }

        /* control plane */
        if (streq(req->url, "/health")) {
                if (!streq(req->method, "GET") && !streq(req->method, "HEAD"))
                        return http_reply_error(c, 405, "method %s not allowed on /health", req->method);
                *ret_responded = false;
                return MHD_YES;
        }
        if (startswith(req->url, "/upload/")) {
                enum MHD_Result mr = templates_upload_begin(srv, req);
                *ret_responded = req->body_mode != BODY_TPL_UPLOAD;
                return mr;
        }
        const char *key = http_header(c, "X-API-KEY");
        const char *auth = http_header(c, "Authorization");
        char bearer[128] = "";
        if (!key && auth && strncasecmp(auth, "Bearer ", 7) == 0) {
                snprintf(bearer, sizeof bearer, "%s", auth + 7);
                key = bearer;
        }
        if (!key || !*key)
                return http_reply_error(c, 401, "Invalid API key");
        hutch_error err = { 0 };
        int r = keysfile_lookup(srv, key, &req->team, &req->key_id, &err);
        if (r == -ENOENT)
                return http_reply_error(c, 401, "Invalid API key");
        if (r < 0) {
                log_error("API key lookup: %s", err.msg);
                return http_reply_error(c, 500, "internal error");
        }
        http_conn_authenticated(req);
        const char *cl = http_header(c, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes)
                return http_reply_error(c, 413, "request body exceeds %llu bytes",
                                        (unsigned long long) srv->cfg.max_body_bytes);
        *ret_responded = false;
        return MHD_YES;
}

/* ------------------------------------------------------------ control plane */

int api_parse_body(request *req, json_t **ret) {
        if (req->body_len == 0) {
                *ret = json_object();
                return 0;
        }
        json_error_t je;
        json_t *j = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
        if (!j) {
                http_reply_error(req->conn, 400, "invalid JSON body: %s", je.text);
                return -EINVAL;
        }
        if (!json_is_object(j)) {
                json_decref(j);
                http_reply_error(req->conn, 400, "request body must be a JSON object");
                return -EINVAL;
        }
        *ret = j;
        return 0;
}

json_t *sandbox_created_json(sbx *sb) {
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:o, s:o}", "sandboxID", sb->id, "templateID",
                         sb->template_id, "alias", sb->alias, "clientID", "hutch", "envdVersion", ENVD_VERSION,
                         "envdAccessToken", sb->token, "trafficAccessToken", ingress_traffic_token_json(sb),
                         "domain", ingress_domain_json(sb->srv));
}

static enum MHD_Result sandboxes_create(server *srv, request *req) {
        if (node_draining(srv)) /* `hutch node drain`: a router tries another node */
                return http_reply_error(req->conn, 503, "node %s is draining: it takes no new sandboxes", srv->cfg.node_id);
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        char why[160];
        if (ingress_create_check(body, why, sizeof why) < 0) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "%s", why);
        }
        /* the create waits its team's turn; this runs again when it comes */
        bool wait;
        enum MHD_Result gate = admission_gate(srv, req, ROUTE_SANDBOXES_CREATE, &wait);
        if (wait) {
                json_decref(body);
                return gate;
        }
        /* an image template or a snapshot this node lacks: pulled from
         * template-registry off the loop first, then this runs again
         * (tplshare.c) */
        enum MHD_Result restore_mr;
        if (tplshare_begin(srv, req, body, &restore_mr) > 0) {
                json_decref(body);
                return restore_mr;
        }
        /* from a snapshot: it is unsealed off the loop first, then this
         * runs again (snapshots.c) */
        if (snapshot_restore_begin(srv, req, body, &restore_mr) > 0) {
                json_decref(body);
                return restore_mr; /* it waits, or its answer is queued */
        }
        sbx *sb = NULL;
        unsigned status = 500;
        hutch_error err = { 0 };
        int r = sbx_create(srv, req->team, body, &sb, &status, &err);
        snapshot_restore_end(srv, req);
        tplshare_end(srv, req);
        json_decref(body);
        if (r < 0) {
                if (status == 429)
                        return http_reply_429(req->conn, 1, "%s", err.msg);
                if (status >= 500)
                        log_error("create: %s", err.msg);
                return http_reply_error(req->conn, status, "%s", err.msg);
        }
        if (sbx_create_note(req, sb) < 0) {
                sbx_kill(srv, sb, "create failed");
                return http_reply_error(req->conn, 500, "out of memory");
        }
        /* a template with a start command answers once it is ready (startcmd.c) */
        if (startcmd_wanted(sb))
                return sbx_start_answer(srv, req, sb);
        enum MHD_Result mr = http_reply_json(req->conn, 201, sandbox_created_json(sb));
        if (mr == MHD_YES)
                sbx_create_queued(srv, req);
        return mr;
}

static int cmp_started_asc(const void *a, const void *b) {
        const sbx *x = *(sbx *const *) a, *y = *(sbx *const *) b;
        if (x->started_ms != y->started_ms)
                return x->started_ms < y->started_ms ? -1 : 1;
        return strcmp(x->id, y->id);
}

static enum MHD_Result sandboxes_list(server *srv, request *req, bool v2) {
        struct MHD_Connection *c = req->conn;
        const char *md = http_query(c, "metadata");
        const char *state = v2 ? http_query(c, "state") : "running";
        const char *tpl = http_query(c, "template");
        const char *after = http_query(c, "startedAfter");
        const char *order = http_query(c, "order");
        const char *lim = http_query(c, "limit");
        const char *next = http_query(c, "nextToken");
        bool want_running = true, want_paused = v2;
        if (state && *state) {
                want_running = strstr(state, "running") != NULL;
                want_paused = strstr(state, "paused") != NULL;
                char *s = strdup(state), *save = NULL;
                if (!s)
                        return MHD_NO;
                unsigned n_states = 0;
                for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                        if (!streq(t, "running") && !streq(t, "paused")) {
                                enum MHD_Result mr = http_reply_error(c, 400, "unknown state '%.64s'", t);
                                free(s);
                                return mr;
                        }
                        n_states++;
                }
                free(s);
                if (n_states == 0)
                        return http_reply_error(c, 400, "state names no state");
        }
        int64_t after_ms = INT64_MIN;
        if (after && *after && parse_rfc3339(after, &after_ms) < 0)
                return http_reply_error(c, 400, "startedAfter must be an RFC 3339 time");
        bool desc = true; /* newest first, as E2B lists (its SDK tests page that way) */
        if (order && *order) {
                if (streq(order, "asc"))
                        desc = false;
                else if (!streq(order, "desc"))
                        return http_reply_error(c, 400, "order must be asc or desc");
        }
        long limit = 100;
        if (lim && *lim) {
                char *e;
                limit = strtol(lim, &e, 10);
                if (*e || limit < 1 || limit > 100)
                        return http_reply_error(c, 400, "limit must be between 1 and 100");
        }
        /* nextToken = "<startedMs>.<id>" of the last item returned */
        int64_t tok_ms = 0;
        char tok_id[HUTCH_ID_LEN + 1] = "";
        if (next && *next) {
                if (route_page_token_parse(next, &tok_ms, tok_id) < 0)
                        return http_reply_error(c, 400, "invalid nextToken");
        }

        size_t n = 0, cap = 16;
        sbx **v = malloc(cap * sizeof *v);
        if (!v)
                return MHD_NO;
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next) {
                if (sb->dead || sb->team_id != req->team)
                        continue;
                if ((sb->paused && !want_paused) || (!sb->paused && !want_running))
                        continue;
                if (md && *md && !route_metadata_matches(sb->metadata, md))
                        continue;
                if (tpl && *tpl && !streq(tpl, sb->template_id) && !streq(tpl, sb->alias))
                        continue;
                if (sb->started_ms < after_ms)
                        continue;
                if (n == cap) {
                        cap *= 2;
                        sbx **nv = realloc(v, cap * sizeof *v);
                        if (!nv) {
                                free(v);
                                return MHD_NO;
                        }
                        v = nv;
                }
                v[n++] = sb;
        }
        qsort(v, n, sizeof *v, cmp_started_asc);
        if (desc)
                for (size_t i = 0; i < n / 2; i++) {
                        sbx *t = v[i];
                        v[i] = v[n - 1 - i];
                        v[n - 1 - i] = t;
                }
        size_t start = 0;
        if (tok_id[0]) {
                /* first item strictly after the token in this order */
                for (start = 0; start < n; start++) {
                        int cmp = v[start]->started_ms != tok_ms ? (v[start]->started_ms < tok_ms ? -1 : 1)
                                                                  : strcmp(v[start]->id, tok_id);
                        if (desc ? cmp < 0 : cmp > 0)
                                break;
                }
        }
        json_t *arr = json_array();
        size_t i;
        for (i = start; i < n && (long) (i - start) < limit; i++)
                json_array_append_new(arr, sbx_to_json(v[i], false));
        char token[64] = "";
        if (i < n && i > start)
                snprintf(token, sizeof token, "%ld.%s", (long) v[i - 1]->started_ms, v[i - 1]->id);
        free(v);
        return http_reply_json_page(c, arr, token);
}

static int body_timeout(request *req, json_t *body, const char *field, bool required, uint64_t def, uint64_t *ret) {
        json_t *t = json_object_get(body, field);
        if (!t || json_is_null(t)) {
                if (required) {
                        http_reply_error(req->conn, 400, "'%s' is required", field);
                        return -EINVAL;
                }
                *ret = def;
                return 0;
        }
        if (!json_is_integer(t) || json_integer_value(t) < 0) {
                http_reply_error(req->conn, 400, "'%s' must be a non-negative integer (seconds)", field);
                return -EINVAL;
        }
        uint64_t v = (uint64_t) json_integer_value(t);
        if (v > req->srv->cfg.max_timeout_s) {
                http_reply_error(req->conn, 400, "'%s' exceeds the maximum of %llu seconds", field,
                                 (unsigned long long) req->srv->cfg.max_timeout_s);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static void save_end(server *srv, sbx *sb) {
        hutch_error err = { 0 };
        if (store_sandbox_set_end(srv->store, sb->id, sb->end_ms, &err) < 0)
                log_error("sandbox %s: database: %s", sb->id, err.msg);
}

static enum MHD_Result sandbox_connect(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        uint64_t t;
        int r = body_timeout(req, body, "timeout", false, srv->cfg.default_timeout_s, &t);
        json_t *mem = json_object_get(body, "memory");
        bool bad_mem = mem && !json_is_null(mem) && !json_is_boolean(mem);
        /* memory:false (the SDK's onResume:"reboot") resumes without the processes */
        bool cold = json_is_false(mem);
        json_decref(body);
        if (r < 0)
                return MHD_YES;
        if (bad_mem)
                return http_reply_error(req->conn, 400, "'memory' must be a boolean");
        unsigned status = 200;
        if (sb->paused && sb->snapshotting)
                return http_reply_error(req->conn, 409, "sandbox \"%s\" is busy: a snapshot of it is being taken",
                                        sb->id);
        if (sb->paused) {
                hutch_error err = { 0 };
                if (sbx_resume(srv, sb, cold, &err) < 0) {
                        log_error("sandbox %s: resume: %s", sb->id, err.msg);
                        return http_reply_error(req->conn, 500, "resuming the sandbox failed: %s", err.msg);
                }
                status = 201;
                sb->end_ms = wall_ms() + (int64_t) t * 1000;
        } else {
                /* connect never shortens the lifetime, only extends it */
                int64_t want = wall_ms() + (int64_t) t * 1000;
                if (want > sb->end_ms)
                        sb->end_ms = want;
        }
        save_end(srv, sb);
        return http_reply_json(req->conn, status, sandbox_created_json(sb));
}

static enum MHD_Result sandbox_set_timeout(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        uint64_t t;
        int r = body_timeout(req, body, "timeout", true, 0, &t);
        json_decref(body);
        if (r < 0)
                return MHD_YES;
        sb->end_ms = wall_ms() + (int64_t) t * 1000;
        save_end(srv, sb);
        return http_reply_empty(req->conn, 204);
}

static enum MHD_Result sandbox_refresh(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        uint64_t t;
        int r = body_timeout(req, body, "duration", false, srv->cfg.default_timeout_s, &t);
        json_decref(body);
        if (r < 0)
                return MHD_YES;
        int64_t want = wall_ms() + (int64_t) t * 1000;
        if (want > sb->end_ms)
                sb->end_ms = want;
        save_end(srv, sb);
        return http_reply_empty(req->conn, 204);
}

static enum MHD_Result sandbox_pause(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        json_t *mem = json_object_get(body, "memory");
        bool bad_mem = mem && !json_is_null(mem) && !json_is_boolean(mem);
        bool keep_memory = !json_is_false(mem);
        json_decref(body);
        if (bad_mem)
                return http_reply_error(req->conn, 400, "'memory' must be a boolean");
        if (sb->paused)
                return http_reply_error(req->conn, 409, "sandbox \"%s\" is already paused", sb->id);
        if (sb->snapshotting)
                return http_reply_error(req->conn, 409, "sandbox \"%s\" is busy: a snapshot of it is being taken",
                                        sb->id);
        hutch_error err = { 0 };
        int r = sbx_pause(srv, sb, keep_memory, &err);
        if (r < 0) {
                log_error("sandbox %s: pause: %s", sb->id, err.msg);
                return http_reply_error(req->conn, 500, "pausing the sandbox failed: %s", err.msg);
        }
        return http_reply_empty(req->conn, 204);
}

static enum MHD_Result sandbox_metrics(server *srv, request *req, sbx *sb) {
        const char *s = http_query(req->conn, "start"), *e = http_query(req->conn, "end");
        int64_t start_ms = INT64_MIN, end_ms = INT64_MAX;
        char *x;
        /* seconds within ±2^40 (far beyond any real time): no overflow below */
        if (s && *s) {
                long long v = strtoll(s, &x, 10);
                if (*x || v < -(1ll << 40) || v > (1ll << 40))
                        return http_reply_error(req->conn, 400, "start must be a unix time in seconds");
                start_ms = v * 1000;
        }
        if (e && *e) {
                long long v = strtoll(e, &x, 10);
                if (*x || v < -(1ll << 40) || v > (1ll << 40))
                        return http_reply_error(req->conn, 400, "end must be a unix time in seconds");
                end_ms = v * 1000 + 999;
        }
        if (!sb->paused && sb->n_samples == 0)
                sbx_sample(srv, sb, wall_ms());
        json_t *arr = json_array();
        for (unsigned i = 0; i < sb->n_samples; i++) {
                unsigned k = (sb->sample_head + SBX_METRICS - sb->n_samples + i) % SBX_METRICS;
                const struct sample *m = &sb->samples[k];
                if (m->ts_ms < start_ms || m->ts_ms > end_ms)
                        continue;
                char ts[40];
                format_rfc3339(m->ts_ms, ts);
                json_array_append_new(arr, json_pack("{s:s, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I}", "timestamp", ts,
                                                     "timestampUnix", (json_int_t) (m->ts_ms / 1000), "cpuUsedPct",
                                                     m->cpu_pct, "cpuCount", (json_int_t) sb->cpu_count, "memUsed",
                                                     (json_int_t) m->mem_used, "memTotal", (json_int_t) m->mem_total,
                                                     "memCache", (json_int_t) m->mem_cache, "diskUsed",
                                                     (json_int_t) m->disk_used, "diskTotal",
                                                     (json_int_t) m->disk_total));
        }
        return http_reply_json(req->conn, 200, arr);
}

/* PUT /sandboxes/{id}/network */
static enum MHD_Result sandbox_network(server *srv, request *req, sbx *sb) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        if (!json_is_object(body)) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "the body must be a JSON object");
        }
        char why[256];
        unsigned closed = 0;
        int r = egress_sbx_update(srv, sb, body, &closed, why, sizeof why);
        json_decref(body);
        if (r < 0)
                return http_reply_error(req->conn, r == -EINVAL || r == -E2BIG ? 400 : 500, "%s", why);
        save_sandbox_extra(srv, sb);
        char detail[64];
        snprintf(detail, sizeof detail, "{\"closed\":%u}", closed);
        hutch_error e2 = { 0 };
        (void) store_event_add(srv->store, sb->team_id, sb->id, "sandbox.network", detail, &e2);
        return http_reply_empty(req->conn, 204);
}

/* GET /sandboxes/{id}/egress?after=ID&limit=N: also for ended sandboxes of
 * the team, whose decisions stay readable. */
static enum MHD_Result sandbox_egress_log(server *srv, request *req, const char *id) {
        sbx *sb = sbx_find_team(srv, id, req->team);
        if (!sb) {
                store_sandbox row = { 0 };
                hutch_error e = { 0 };
                bool mine = store_sandbox_get(srv->store, id, &row, &e) >= 0 && row.team_id == req->team;
                store_sandbox_clear(&row);
                if (!mine)
                        return not_found_sbx(req->conn, id);
        }
        const char *a = http_query(req->conn, "after"), *l = http_query(req->conn, "limit");
        int64_t after = 0;
        uint64_t limit = 100;
        char *x;
        if (a && *a) {
                long long v = strtoll(a, &x, 10);
                if (*x || v < 0)
                        return http_reply_error(req->conn, 400, "after must be a record id (a number >= 0)");
                after = v;
        }
        if (l && *l) {
                unsigned long long v = strtoull(l, &x, 10);
                if (*x || v < 1 || v > 1000)
                        return http_reply_error(req->conn, 400, "limit must be 1..1000");
                limit = v;
        }
        store_egress *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (store_egress_list(srv->store, id, after, (unsigned) limit, &v, &n, &err) < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        json_t *arr = egress_log_json(v, n);
        store_egress_array_free(v, n);
        return http_reply_json(req->conn, 200, arr);
}

/* What runs the engine on the loop for as long as it takes (a resume of a
 * paused gvisor sandbox restores its checkpoint; a snapshot seals a layer;
 * a fork makes up to 16 sandboxes) waits its team's turn (admission.c);
 * what only reads or writes a row does not. */
static bool runs_engine(int kind, const sbx *sb) {
        switch (kind) {
        case ROUTE_SANDBOX_CONNECT:
        case ROUTE_SANDBOX_RESUME:
                return sb->paused;
        case ROUTE_SANDBOX_PAUSE:
                return !sb->paused;
        case ROUTE_SANDBOX_SNAPSHOT:
        case ROUTE_SANDBOX_FORK:
                return true;
        default:
                return false;
        }
}

static enum MHD_Result control_dispatch(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        route rt;
        int r = route_control(req->method, req->url, &rt);
        if (r == -EPERM)
                return http_reply_error(c, 405, "method %s not allowed on %s", req->method, req->url);
        if (r < 0)
                return http_reply_error(c, 404, "no route for %s %s", req->method, req->url);
        switch (rt.kind) {
        case ROUTE_HEALTH: {
                /* creates fail without descriptors: say so before they do */
                unsigned open_fds, limit;
                struct rlimit rl;
                if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY &&
                    rl.rlim_max < HUTCH_DEFAULT_NOFILE)
                        return http_reply_json(c, 503,
                                               json_pack("{s:s, s:s, s:i}", "status", "degraded", "message",
                                                         "the daemon's hard open-files limit is below a sandbox's "
                                                         "own: creates fail until it is raised",
                                                         "openFilesLimit", (int) rl.rlim_max));
                if (server_fds(&open_fds, &limit) == 0 && open_fds + SERVER_FDS_RESERVE > limit)
                        return http_reply_json(c, 503,
                                               json_pack("{s:s, s:s, s:i, s:i}", "status", "degraded", "message",
                                                         "the daemon is out of open files: creates fail until "
                                                         "descriptors are freed or the limit is raised",
                                                         "openFiles", (int) open_fds, "openFilesLimit", (int) limit));
                return http_reply_json(c, 200, json_pack("{s:s}", "status", "ok"));
        }
        case ROUTE_SANDBOXES_CREATE:
                return sandboxes_create(srv, req);
        case ROUTE_SANDBOXES_LIST:
                return sandboxes_list(srv, req, rt.v2);
        case ROUTE_SECRETS_LIST:
        case ROUTE_SECRETS_CREATE:
        case ROUTE_SECRET_GET:
        case ROUTE_SECRET_UPDATE:
        case ROUTE_SECRET_DELETE:
                return secrets_dispatch(srv, req, &rt);
        case ROUTE_SNAPSHOTS_LIST:
                return snapshots_list(srv, req);
        case ROUTE_VOLUMES_CREATE:
                /* mkfs.ext4 of the volume's image, on the loop: it waits its team's turn */
                {
                        bool wait;
                        enum MHD_Result mr = admission_gate(srv, req, rt.kind, &wait);
                        if (wait)
                                return mr;
                }
                return volumes_dispatch(srv, req, &rt);
        case ROUTE_VOLUMES_LIST:
        case ROUTE_VOLUME_GET:
        case ROUTE_VOLUME_DELETE:
                return volumes_dispatch(srv, req, &rt);
        case ROUTE_TEMPLATE_DELETE: /* a snapshot or a built template */
        case ROUTE_TPL_REQUEST ... ROUTE_TPL_TAGS_GET:
                return templates_dispatch(srv, req, &rt);
        case ROUTE_USAGE:
                return usage_api(srv, req);
        case ROUTE_EVENTS:
        case ROUTE_SANDBOX_EVENTS:
                return audit_events_api(srv, req, rt.kind == ROUTE_EVENTS ? NULL : rt.id);
        case ROUTE_NODE:
                return node_info(srv, req);
        default:
                break;
        }
        if (rt.kind == ROUTE_SANDBOX_EGRESS)
                return sandbox_egress_log(srv, req, rt.id);
        sbx *sb = rt.id[0] ? sbx_find_team(srv, rt.id, req->team) : NULL;
        if (!sb) {
                /* the id as the client wrote it, bounded */
                const char *p = strstr(req->url, "sandboxes/");
                char shown[64];
                snprintf(shown, sizeof shown, "%.*s", (int) strcspn(p ? p + 10 : "", "/"), p ? p + 10 : "");
                return not_found_sbx(c, shown);
        }
        if (runs_engine(rt.kind, sb)) {
                bool wait;
                enum MHD_Result mr = admission_gate(srv, req, rt.kind, &wait);
                if (wait)
                        return mr;
        }
        switch (rt.kind) {
        case ROUTE_SANDBOX_GET:
                return http_reply_json(c, 200, sbx_to_json(sb, true));
        case ROUTE_SANDBOX_KILL:
                sbx_kill(srv, sb, "killed");
                return http_reply_empty(c, 204);
        case ROUTE_SANDBOX_TIMEOUT:
                return sandbox_set_timeout(srv, req, sb);
        case ROUTE_SANDBOX_CONNECT:
                return sandbox_connect(srv, req, sb);
        case ROUTE_SANDBOX_RESUME:
                if (!sb->paused)
                        return http_reply_error(c, 409, "sandbox \"%s\" is already running", sb->id);
                return sandbox_connect(srv, req, sb);
        case ROUTE_SANDBOX_REFRESHES:
                return sandbox_refresh(srv, req, sb);
        case ROUTE_SANDBOX_PAUSE:
                return sandbox_pause(srv, req, sb);
        case ROUTE_SANDBOX_METRICS:
                return sandbox_metrics(srv, req, sb);
        case ROUTE_SANDBOX_NETWORK:
                return sandbox_network(srv, req, sb);
        case ROUTE_SANDBOX_EGRESS:
                break; /* above */
        case ROUTE_SANDBOX_SNAPSHOT:
                return snapshot_create(srv, req, sb);
        case ROUTE_SANDBOX_FORK:
                return sandbox_fork(srv, req, sb);
        }
        return http_reply_error(c, 404, "no route for %s %s", req->method, req->url);
}

enum MHD_Result api_dispatch(server *srv, request *req) {
        if (req->vol)
                return volumes_content_dispatch(srv, req);
        if (req->data_plane) {
                sbx *sb = sbx_find(srv, req->sbx_id);
                if (!sb || sb->paused)
                        return http_reply_502(req->conn, req->sbx_id);
                if (snapjob_park(srv, req, sb, RESUME_DISPATCH))
                        return MHD_YES; /* its layer is being copied: runs after */
                return envd_dispatch(srv, req, sb);
        }
        return control_dispatch(srv, req);
}
