/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's audit hooks and GET /events (daemon/audit.h). */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit/audit.h"
#include "config.h"
#include "daemon/audit.h"
#include "daemon/metrics.h"
#include "meter/meter.h"
#include "daemon/serve.h"
#include "util/clock.h"
#include "util/log.h"

/* A flush each loop turn; a queue this long is written at once (a burst of
 * process starts within one turn). */
#define AUDIT_QUEUE_FLUSH 512
#define AUDIT_PRUNE_INTERVAL_MS (600 * 1000)
#define EVENTS_PAGE_MAX 1000
#define AUDIT_QUEUE_MAX 100000

typedef struct upload_hash {
        const void *key;
        EVP_MD_CTX *md;
} upload_hash;

struct daemon_audit {
        audit_log *log;
        int64_t next_checkpoint_ms;
        int64_t next_prune_ms;
        bool warned;      /* a failing flush is logged once until it works again */
        uint64_t dropped; /* records not queued (AUDIT_QUEUE_MAX) since the last audit.lost */
        int64_t retry_ms; /* after a failed write: not before then (the store's busy timeout each try) */
        upload_hash *uploads;
        size_t n_uploads;
};

static audit_log *A(server *srv) {
        return srv->audit ? srv->audit->log : NULL;
}

/* Queue a record whose detail is a JSON object (stolen). */
static void put(server *srv, int64_t team, const char *sandbox, const char *kind, json_t *detail) {
        audit_log *a = A(srv);
        if (!a) {
                json_decref(detail);
                return;
        }
        /* a database that refuses every write (a full disk) must not take
         * the daemon's memory with it: beyond the bound, records are
         * counted, and the count is recorded once writing works again */
        if (audit_queued(a) >= AUDIT_QUEUE_MAX) {
                if (srv->audit->dropped++ == 0)
                        log_error("audit: %d records could not be written: dropping further ones (counted)",
                                  AUDIT_QUEUE_MAX);
                json_decref(detail);
                return;
        }
        char *s = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
        json_decref(detail);
        if (audit_append(a, 0, team, sandbox, kind, s ? s : "{}") < 0)
                log_warning("audit: out of memory: a %s record is lost", kind);
        free(s);
        if (audit_queued(a) >= AUDIT_QUEUE_FLUSH && srv->audit->retry_ms <= wall_ms()) {
                hutch_error err = { 0 };
                if (audit_flush(a, &err) < 0)
                        log_debug("audit: %s", err.msg);
        }
}

int audit_setup(server *srv) {
        if (!srv->cfg.audit)
                return 0;
        struct daemon_audit *d = calloc(1, sizeof *d);
        if (!d)
                return log_error_errno(-ENOMEM, "audit: out of memory");
        hutch_error err = { 0 };
        int r = audit_open(srv->store, srv->cfg.data_dir, &d->log, &err);
        if (r < 0) {
                free(d);
                return log_error_errno(r, "audit: %s", err.msg);
        }
        srv->audit = d;
        audit_start_state s;
        audit_start_state_get(d->log, &s);
        json_t *detail = json_pack("{s:s, s:I, s:I, s:b}", "version", HUTCH_VERSION, "last_seq",
                                   (json_int_t) s.last_seq, "signed_seq", (json_int_t) s.signed_seq,
                                   "clean", s.clean);
        if (!s.clean) {
                long long lost = s.last_seq - s.signed_seq;
                log_warning(
                        "audit: the previous daemon stopped without its final checkpoint (killed?): the trail "
                        "ends at record %lld, %lld record(s) after the last signed one (%lld); records it had not "
                        "yet written (at most one loop turn's) are lost",
                        (long long) s.last_seq, lost, (long long) s.signed_seq);
                put(srv, 0, "", "daemon.unclean_stop", json_incref(detail));
        }
        put(srv, 0, "", "daemon.start", detail);
        r = audit_checkpoint(d->log, false, &err);
        if (r < 0)
                log_warning("audit: %s", err.msg);
        int64_t now = wall_ms();
        d->next_checkpoint_ms = now + (int64_t) srv->cfg.audit_checkpoint_interval_s * 1000;
        d->next_prune_ms = now;
        return 0;
}

void audit_teardown(server *srv) {
        struct daemon_audit *d = srv->audit;
        if (!d)
                return;
        put(srv, 0, "", "daemon.stop", json_pack("{s:s}", "on_stop", srv->cfg.on_stop));
        hutch_error err = { 0 };
        if (audit_checkpoint(d->log, false, &err) < 0)
                log_error("audit: the final checkpoint failed: %s (the next start reports an unclean stop)",
                          err.msg);
        for (size_t i = 0; i < d->n_uploads; i++)
                EVP_MD_CTX_free(d->uploads[i].md);
        free(d->uploads);
        audit_close(d->log);
        free(d);
        srv->audit = NULL;
}

int64_t audit_tick(server *srv, int64_t now) {
        struct daemon_audit *d = srv->audit;
        if (!d)
                return -1;
        if (d->retry_ms > now)
                return d->retry_ms;
        hutch_error err = { 0 };
        int r;
        int64_t t0 = clock_ns(CLOCK_MONOTONIC);
        if (now >= d->next_checkpoint_ms) {
                r = audit_checkpoint(d->log, false, &err);
                d->next_checkpoint_ms = now + (int64_t) srv->cfg.audit_checkpoint_interval_s * 1000;
        } else
                r = audit_flush(d->log, &err);
        if (r > 0)
                metrics_store_write(srv, "audit", clock_ns(CLOCK_MONOTONIC) - t0);
        if (r < 0) {
                if (!d->warned)
                        log_warning("audit: %s (kept in memory; trying again)", err.msg);
                d->warned = true;
                d->retry_ms = now + 1000;
                return d->retry_ms;
        }
        d->warned = false;
        if (d->dropped) {
                uint64_t n = d->dropped;
                d->dropped = 0;
                put(srv, 0, "", "audit.lost", json_pack("{s:I}", "records", (json_int_t) n));
                log_warning("audit: writing works again; %llu record(s) were dropped meanwhile (an audit.lost "
                            "record says so)",
                            (unsigned long long) n);
        }
        if (srv->cfg.audit_retention_s > 0 && now >= d->next_prune_ms) {
                int64_t half = (int64_t) srv->cfg.audit_retention_s * 500;
                d->next_prune_ms = now +
                        (half < 1000                              ? 1000
                                 : half > AUDIT_PRUNE_INTERVAL_MS ? AUDIT_PRUNE_INTERVAL_MS
                                                                  : half);
                int64_t upto = audit_prune(d->log,
                                           now - (int64_t) srv->cfg.audit_retention_s * 1000, &err);
                if (upto < 0)
                        log_warning("audit: retention: %s", err.msg);
                else if (upto > 0)
                        log_info("audit: retention: records up to %lld removed (older than %llu s)",
                                 (long long) upto, (unsigned long long) srv->cfg.audit_retention_s);
        }
        if (audit_fold_pending(d->log))
                return now; /* a backlog of the store's records: the next batch at once */
        return d->next_checkpoint_ms < d->next_prune_ms || srv->cfg.audit_retention_s == 0
                ? d->next_checkpoint_ms
                : d->next_prune_ms;
}

/* ------------------------------------------------------------------ hooks */

void audit_request_done(server *srv, request *req, struct MHD_Connection *c) {
        if (!req)
                return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
                c, MHD_CONNECTION_INFO_HTTP_STATUS);
        unsigned status = ci ? ci->http_status : 0;
        metrics_request_done(srv, req, status);
        /* the access log, at debug level, under the request's id */
        const char *old = log_set_context(req->rid);
        log_debug("%s %s: %u", req->method, req->url, status);
        log_set_context(old);
        if (!A(srv))
                return;
        if (streq(req->url, "/health") || startswith(req->url, "/metrics"))
                return;
        int64_t team = req->team;
        /* a create names the sandbox it made */
        const char *sandbox = req->n_created ? req->created[0] : req->sbx_id;
        if (req->data_plane) {
                /* envd calls are recorded by what they do (processes, files);
                 * refusals are recorded here */
                if (status < 400 || status == 404)
                        return;
                sbx *sb = sbx_find(srv, req->sbx_id);
                team = sb ? sb->team_id : 0;
        }
        char path[256];
        snprintf(path, sizeof path, "%s", req->url);
        char id[HUTCH_ID_LEN + 1];
        if (!req->data_plane && !sandbox[0]) {
                /* the control plane names its sandbox in the path */
                const char *p = strstr(path, "sandboxes/");
                if (p) {
                        snprintf(id, sizeof id, "%.*s", (int) strcspn(p + 10, "/"), p + 10);
                        sandbox = id;
                }
        }
        json_t *d = json_pack("{s:s, s:s, s:i, s:I, s:b, s:s}", "method", req->method, "path", path,
                              "status", (int) status, "key_id", (json_int_t) req->key_id,
                              "data_plane", req->data_plane, "request_id", req->rid);
        put(srv, team, sandbox, "api.call", d);
}

void audit_sandbox_created(server *srv, const sbx *sb) {
        if (!A(srv))
                return;
        put(srv, sb->team_id, sb->id, "sandbox.limits",
            json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "template", sb->template_id, "alias",
                      sb->alias, "backend", hutch_backend_name(sb->backend), "cpu_count",
                      (json_int_t) sb->cpu_count, "memory_mb", (json_int_t) sb->memory_mb,
                      "disk_mb", (json_int_t) sb->disk_mb, "end_ms", (json_int_t) sb->end_ms));
}

void audit_sandbox_final(server *srv, const sbx *sb, const meter_row *r) {
        if (!A(srv))
                return;
        put(srv, sb->team_id, sb->id, "sandbox.final",
            json_pack("{s:I, s:I, s:I, s:I, s:I}", "cpu_ns", (json_int_t) r->cpu_ns,
                      "memory_peak_bytes", (json_int_t) r->memory_peak_bytes, "oom_kills",
                      (json_int_t) r->oom_kills, "processes", (json_int_t) r->processes,
                      "lifetime_ms", (json_int_t) (r->ended_ms - r->started_ms)));
}

void audit_proc_start(server *srv, sbx *sb, proc *p, const char *user, const char *cwd) {
        p->started_ms = wall_ms();
        if (!A(srv))
                return;
        json_t *argv = json_array();
        json_t *cfg = p->config;
        json_array_append(argv, json_object_get(cfg, "cmd"));
        json_t *args = json_object_get(cfg, "args"), *v;
        size_t i;
        json_array_foreach(args, i, v) json_array_append(argv, v);
        /* the environment's names, never its values (they may be credentials) */
        json_t *names = json_array();
        const char *k;
        json_object_foreach(json_object_get(cfg, "envs"), k, v)
                json_array_append_new(names, json_string(k));
        put(srv, sb->team_id, sb->id, "process.start",
            json_pack("{s:i, s:o, s:s, s:s, s:o, s:b, s:s?, s:s?}", "pid", (int) p->pid, "argv", argv,
                      "user", user ? user : "", "cwd", cwd ? cwd : "", "env_names", names, "pty",
                      p->pty, "tag", p->tag, "request_id", p->request_id[0] ? p->request_id : NULL));
}

void audit_proc_end(server *srv, sbx *sb, proc *p) {
        if (!A(srv))
                return;
        json_t *d = json_pack("{s:i, s:i, s:i, s:b}", "pid", (int) p->pid, "exit_code",
                              p->exit.exit_code, "signal", p->exit.signal, "core_dumped",
                              p->exit.core_dumped);
        if (p->started_ms > 0)
                json_object_set_new(d, "duration_ms", json_integer(p->exited_ms - p->started_ms));
        if (p->exit.cpu_us >= 0)
                json_object_set_new(d, "cpu_ms", json_integer(p->exit.cpu_us / 1000));
        if (p->request_id[0]) {
                json_object_set_new(d, "request_id", json_string(p->request_id));
                if (p->request_id_from_sandbox) /* the daemon restarted meanwhile */
                        json_object_set_new(d, "request_id_source", json_string("sandbox"));
        }
        put(srv, sb->team_id, sb->id, "process.end", d);
}

void audit_fs(server *srv, sbx *sb, const char *kind, const char *path, const char *path2,
              int result) {
        if (!A(srv))
                return;
        json_t *d = json_pack("{s:s}", "path", path ? path : "");
        if (path2)
                json_object_set_new(d, "destination", json_string(path2));
        if (result < 0)
                json_object_set_new(d, "error", json_string(strerror(-result)));
        put(srv, sb->team_id, sb->id, kind, d);
}

static upload_hash *upload_find(struct daemon_audit *d, const void *key) {
        for (size_t i = 0; i < d->n_uploads; i++)
                if (d->uploads[i].key == key)
                        return &d->uploads[i];
        return NULL;
}

void audit_upload_data(server *srv, const void *key, const void *data, size_t len) {
        struct daemon_audit *d = srv->audit;
        if (!d)
                return;
        upload_hash *u = upload_find(d, key);
        if (!u) {
                upload_hash *nv = realloc(d->uploads, (d->n_uploads + 1) * sizeof *nv);
                if (!nv)
                        return;
                d->uploads = nv;
                u = &d->uploads[d->n_uploads];
                u->key = key;
                u->md = EVP_MD_CTX_new();
                if (!u->md || EVP_DigestInit_ex(u->md, EVP_sha256(), NULL) != 1) {
                        EVP_MD_CTX_free(u->md);
                        return;
                }
                d->n_uploads++;
        }
        EVP_DigestUpdate(u->md, data, len);
}

void audit_upload_done(server *srv, const char *sbx_id, const void *key, const char *path,
                       uint64_t bytes, int result) {
        struct daemon_audit *d = srv->audit;
        if (!d)
                return;
        upload_hash *u = upload_find(d, key);
        char hex[65] = "";
        if (u) {
                uint8_t h[32];
                unsigned hl = 32;
                if (EVP_DigestFinal_ex(u->md, h, &hl) == 1)
                        for (unsigned i = 0; i < 32; i++)
                                snprintf(hex + 2 * i, 3, "%02x", h[i]);
                EVP_MD_CTX_free(u->md);
                *u = d->uploads[--d->n_uploads];
        } else if (result == -ECANCELED)
                return; /* an abort after its end was recorded */
        else if (bytes == 0) {
                /* an empty part never passed data: the hash of nothing */
                snprintf(hex, sizeof hex,
                         "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        }
        sbx *sb = sbx_find(srv, sbx_id);
        json_t *j = json_pack("{s:s, s:I, s:s}", "path", path ? path : "", "size",
                              (json_int_t) bytes, "sha256", hex);
        if (result < 0)
                json_object_set_new(j, "error", json_string(strerror(-result)));
        put(srv, sb ? sb->team_id : 0, sbx_id, result < 0 ? "file.write_failed" : "file.write", j);
}

void audit_secret_use(server *srv, const char *sbx_id, const char *name, const char *host,
                      unsigned port, int result) {
        if (!A(srv))
                return;
        sbx *sb = sbx_find(srv, sbx_id);
        json_t *d = json_pack("{s:s, s:s, s:i, s:b}", "secret", name ? name : "", "host",
                              host ? host : "", "port", (int) port, "granted", result >= 0);
        if (result < 0)
                json_object_set_new(
                        d, "error",
                        json_string(result == -EACCES ? "host not allowed" : strerror(-result)));
        put(srv, sb ? sb->team_id : 0, sbx_id, "secret.use", d);
}

/* -------------------------------------------------------------------- API */

typedef struct page {
        json_t *arr;
        int64_t last_seq;
} page;

static int page_add(void *arg, const audit_record *r) {
        page *p = arg;
        char t[40];
        format_rfc3339(r->ts_ms, t);
        json_t *detail = json_loads(r->detail, 0, NULL);
        if (!json_is_object(detail)) {
                json_decref(detail);
                detail = json_string(r->detail);
        }
        char h[65];
        for (int i = 0; i < 32; i++)
                snprintf(h + 2 * i, 3, "%02x", r->hash[i]);
        json_array_append_new(p->arr,
                              json_pack("{s:I, s:s, s:s, s:s, s:o, s:s}", "seq",
                                        (json_int_t) r->seq, "timestamp", t, "type", r->kind,
                                        "sandboxID", r->sandbox, "detail", detail, "hash", h));
        p->last_seq = r->seq;
        return 0;
}

enum MHD_Result audit_events_api(server *srv, request *req, const char *sandbox_id) {
        struct MHD_Connection *c = req->conn;
        if (!A(srv))
                return http_reply_error(c, 404,
                                        "the audit trail is off on this daemon (audit = off)");
        audit_filter f;
        audit_filter_init(&f);
        f.limit = 100;
        hutch_error err = { 0 };
        static const char *const keys[] = { "since", "until", "kind", "after", "limit", "sandbox" };
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
                const char *v = http_query(c, keys[i]);
                if (v && audit_filter_set(&f, keys[i], v, wall_ms(), EVENTS_PAGE_MAX, &err) < 0)
                        return http_reply_error(c, 400, "%s", err.msg);
        }
        const char *next = http_query(c, "nextToken");
        if (next && audit_filter_set(&f, "after", next, wall_ms(), EVENTS_PAGE_MAX, &err) < 0)
                return http_reply_error(c, 400, "nextToken: %s", err.msg);
        if (sandbox_id) {
                if (!sandbox_id[0])
                        return http_reply_error(c, 404, "sandbox not found");
                snprintf(f.sandbox, sizeof f.sandbox, "%s", sandbox_id);
        }
        /* a team sees its own records only, whatever it asks */
        f.team = req->team;
        /* what this daemon queued so far, this request's own call excepted */
        if (audit_flush(A(srv), &err) < 0)
                log_debug("audit: %s", err.msg);
        page p = { .arr = json_array() };
        if (audit_query(srv->store, &f, page_add, &p, &err) < 0) {
                json_decref(p.arr);
                return http_reply_error(c, 500, "audit: %s", err.msg);
        }
        char tok[32] = "";
        if (f.limit && json_array_size(p.arr) == f.limit)
                snprintf(tok, sizeof tok, "%lld", (long long) p.last_seq);
        return http_reply_json_page(c, p.arr, tok);
}
