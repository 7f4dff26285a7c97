/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Routing (e2b-protocol.md §a.4) and the control plane (§b).
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

#include "daemon/server.h"
#include "util/error.h"
#include "util/log.h"

static enum MHD_Result not_found_sbx(struct MHD_Connection *c, const char *id) {
        return http_reply_error(c, 404, "sandbox \"%s\" doesn't exist or you don't have access to it", id);
}

static int hexval(int c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        c = tolower(c);
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

/* Percent-decode in place ('+' is a space, as in query strings). */
static void url_decode(char *s) {
        char *o = s;
        for (char *p = s; *p; p++) {
                if (*p == '%' && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
                        *o++ = (char) (hexval(p[1]) * 16 + hexval(p[2]));
                        p += 2;
                } else if (*p == '+')
                        *o++ = ' ';
                else
                        *o++ = *p;
        }
        *o = 0;
}

static bool valid_sandbox_id(const char *s) {
        size_t n = 0;
        for (; s[n]; n++)
                if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9')))
                        return false;
        return n == HUTCH_ID_LEN;
}

/* --------------------------------------------------------------- routing */

enum MHD_Result api_begin(server *srv, request *req, bool *ret_responded) {
        struct MHD_Connection *c = req->conn;
        const char *port = http_header(c, "E2b-Sandbox-Port");
        const char *id = http_header(c, "E2b-Sandbox-Id");
        bool is_files = streq(req->url, "/files");
        sbx *sb = NULL;
        *ret_responded = true;

        if (port) {
                req->data_plane = true;
                if (!id || !valid_sandbox_id(id))
                        return http_reply_502(c, id);
                if (!streq(port, "49983")) {
                        /* Only envd is served; ports of processes inside the
                         * sandbox are not reachable from outside (yet). */
                        return http_reply_json(c, 502,
                                               json_pack("{s:s, s:s, s:i}", "sandboxId", id, "message",
                                                         "The sandbox is running but port is not open", "code", 502));
                }
                sb = sbx_find(srv, id);
                if (!sb || sb->paused)
                        return http_reply_502(c, id);
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
                const char *cl = http_header(c, "Content-Length");
                if (!is_files && cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes)
                        return http_reply_error(c, 413, "request body exceeds %llu bytes",
                                                (unsigned long long) srv->cfg.max_body_bytes);
                if (is_files && streq(req->method, "POST")) {
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
                *ret_responded = false;
                return MHD_YES;
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
        int r = store_key_lookup(srv->store, key, &req->team, &err);
        if (r == -ENOENT)
                return http_reply_error(c, 401, "Invalid API key");
        if (r < 0) {
                log_error("API key lookup: %s", err.msg);
                return http_reply_error(c, 500, "internal error");
        }
        const char *cl = http_header(c, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes)
                return http_reply_error(c, 413, "request body exceeds %llu bytes",
                                        (unsigned long long) srv->cfg.max_body_bytes);
        *ret_responded = false;
        return MHD_YES;
}

/* ------------------------------------------------------------ control plane */

static int parse_body(request *req, json_t **ret) {
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

static json_t *sandbox_created_json(sbx *sb) {
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:n, s:n}", "sandboxID", sb->id, "templateID",
                         sb->template_id, "alias", sb->alias, "clientID", "hutch", "envdVersion", ENVD_VERSION,
                         "envdAccessToken", sb->token, "trafficAccessToken", "domain");
}

static enum MHD_Result sandboxes_create(server *srv, request *req) {
        json_t *body;
        if (parse_body(req, &body) < 0)
                return MHD_YES;
        sbx *sb = NULL;
        unsigned status = 500;
        hutch_error err = { 0 };
        int r = sbx_create(srv, req->team, body, &sb, &status, &err);
        json_decref(body);
        if (r < 0) {
                if (status == 429) {
                        struct MHD_Response *resp;
                        char *s = NULL;
                        json_t *e = json_pack("{s:i, s:s}", "code", 429, "message", err.msg);
                        s = json_dumps(e, JSON_COMPACT);
                        json_decref(e);
                        resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
                        MHD_add_response_header(resp, "Content-Type", "application/json");
                        MHD_add_response_header(resp, "Retry-After", "1");
                        enum MHD_Result mr = MHD_queue_response(req->conn, 429, resp);
                        MHD_destroy_response(resp);
                        return mr;
                }
                if (status >= 500)
                        log_error("create: %s", err.msg);
                return http_reply_error(req->conn, status, "%s", err.msg);
        }
        return http_reply_json(req->conn, 201, sandbox_created_json(sb));
}

/* metadata=k%3Dv%26a%3Db (already decoded once by MHD into "k=v&a=b") */
static bool metadata_matches(json_t *md, const char *query) {
        char *q = strdup(query);
        if (!q)
                return false;
        bool ok = true;
        char *save = NULL;
        for (char *pair = strtok_r(q, "&", &save); pair && ok; pair = strtok_r(NULL, "&", &save)) {
                char *eq = strchr(pair, '=');
                if (!eq)
                        continue;
                *eq = 0;
                /* MHD decoded the parameter once; the SDK encoded each key
                 * and value, then the pair list: two more levels (E2B's API
                 * does ParseQuery, then QueryUnescape) */
                url_decode(pair);
                url_decode(pair);
                url_decode(eq + 1);
                url_decode(eq + 1);
                const char *v = json_string_value(json_object_get(md, pair));
                ok = v && streq(v, eq + 1);
        }
        free(q);
        return ok;
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
        bool desc = false;
        if (order && *order) {
                if (streq(order, "desc"))
                        desc = true;
                else if (!streq(order, "asc"))
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
                if (sscanf(next, "%ld.%20[a-z0-9]", &tok_ms, tok_id) != 2)
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
                if (md && *md && !metadata_matches(sb->metadata, md))
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
        char *s = json_dumps(arr, JSON_COMPACT);
        json_decref(arr);
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, "Content-Type", "application/json");
        if (token[0])
                MHD_add_response_header(resp, "X-Next-Token", token);
        enum MHD_Result r = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return r;
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
        if (parse_body(req, &body) < 0)
                return MHD_YES;
        uint64_t t;
        int r = body_timeout(req, body, "timeout", false, srv->cfg.default_timeout_s, &t);
        json_decref(body);
        if (r < 0)
                return MHD_YES;
        unsigned status = 200;
        if (sb->paused) {
                hutch_error err = { 0 };
                if (sbx_resume(srv, sb, &err) < 0) {
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
        if (parse_body(req, &body) < 0)
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
        if (parse_body(req, &body) < 0)
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
        if (parse_body(req, &body) < 0)
                return MHD_YES;
        json_decref(body);
        if (sb->paused)
                return http_reply_error(req->conn, 409, "sandbox \"%s\" is already paused", sb->id);
        hutch_error err = { 0 };
        int r = sbx_pause(srv, sb, &err);
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
        if (s && *s) {
                long long v = strtoll(s, &x, 10);
                if (*x)
                        return http_reply_error(req->conn, 400, "start must be a unix time in seconds");
                start_ms = v * 1000;
        }
        if (e && *e) {
                long long v = strtoll(e, &x, 10);
                if (*x)
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

static enum MHD_Result control_dispatch(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        const char *m = req->method;
        const char *url = req->url;
        if (streq(url, "/health"))
                return http_reply_json(c, 200, json_pack("{s:s}", "status", "ok"));
        if (streq(url, "/sandboxes") || streq(url, "/v2/sandboxes")) {
                if (streq(m, "POST"))
                        return sandboxes_create(srv, req);
                if (streq(m, "GET"))
                        return sandboxes_list(srv, req, url[1] == 'v');
                return http_reply_error(c, 405, "method %s not allowed on %s", m, url);
        }
        /* /sandboxes/{id}[/action] and /v2/sandboxes/{id}/connect */
        const char *rest = NULL;
        bool v2 = false;
        if (startswith(url, "/sandboxes/"))
                rest = url + strlen("/sandboxes/");
        else if (startswith(url, "/v2/sandboxes/")) {
                rest = url + strlen("/v2/sandboxes/");
                v2 = true;
        }
        if (rest) {
                char id[64];
                size_t idl = strcspn(rest, "/");
                if (idl == 0 || idl >= sizeof id)
                        return http_reply_error(c, 404, "no route for %s %s", m, url);
                memcpy(id, rest, idl);
                id[idl] = 0;
                const char *action = rest[idl] == '/' ? rest + idl + 1 : NULL;
                if (v2 && !(action && streq(action, "connect")))
                        return http_reply_error(c, 404, "no route for %s %s", m, url);
                struct {
                        const char *method, *action;
                } known[] = {
                        { "GET", NULL },        { "DELETE", NULL },     { "POST", "timeout" }, { "POST", "connect" },
                        { "POST", "pause" },    { "POST", "resume" },   { "POST", "refreshes" },
                        { "GET", "metrics" },   { "PUT", "network" },
                };
                bool path_known = false, route = false;
                for (size_t i = 0; i < ELEMENTSOF(known); i++) {
                        bool same_action = (!known[i].action && !action) ||
                                           (known[i].action && action && streq(known[i].action, action));
                        if (same_action) {
                                path_known = true;
                                if (streq(known[i].method, m))
                                        route = true;
                        }
                }
                if (!path_known)
                        return http_reply_error(c, 404, "no route for %s %s", m, url);
                if (!route)
                        return http_reply_error(c, 405, "method %s not allowed on %s", m, url);
                sbx *sb = valid_sandbox_id(id) ? sbx_find_team(srv, id, req->team) : NULL;
                if (!sb)
                        return not_found_sbx(c, id);
                if (!action) {
                        if (streq(m, "GET"))
                                return http_reply_json(c, 200, sbx_to_json(sb, true));
                        sbx_kill(srv, sb, "killed");
                        return http_reply_empty(c, 204);
                }
                if (streq(action, "timeout"))
                        return sandbox_set_timeout(srv, req, sb);
                if (streq(action, "connect"))
                        return sandbox_connect(srv, req, sb);
                if (streq(action, "resume")) {
                        if (!sb->paused)
                                return http_reply_error(c, 409, "sandbox \"%s\" is already running", sb->id);
                        return sandbox_connect(srv, req, sb);
                }
                if (streq(action, "refreshes"))
                        return sandbox_refresh(srv, req, sb);
                if (streq(action, "pause"))
                        return sandbox_pause(srv, req, sb);
                if (streq(action, "metrics"))
                        return sandbox_metrics(srv, req, sb);
                if (streq(action, "network"))
                        return http_reply_error(c, 501,
                                                "changing the network policy of a running sandbox is not "
                                                "supported by this server yet; sandboxes have no egress");
        }
        return http_reply_error(c, 404, "no route for %s %s", m, url);
}

enum MHD_Result api_dispatch(server *srv, request *req) {
        if (req->data_plane) {
                sbx *sb = sbx_find(srv, req->sbx_id);
                if (!sb || sb->paused)
                        return http_reply_502(req->conn, req->sbx_id);
                return envd_dispatch(srv, req, sb);
        }
        return control_dispatch(srv, req);
}
