/* SPDX-License-Identifier: Apache-2.0 */
/* The usage ledger's hooks, flush and report (daemon/usage.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "audit/audit.h"
#include "daemon/audit.h"
#include "daemon/metrics.h"
#include "daemon/serve.h"
#include "daemon/usage.h"
#include "meter/meter.h"
#include "util/clock.h"
#include "util/log.h"

#define USAGE_FLUSH_MS 1000

typedef struct live {
        meter_row row;
        bool dirty;
        struct live *next;
} live;

struct daemon_usage {
        live *rows;
        int64_t next_flush_ms;
        int64_t next_storage_ms; /* the storage ledger's next sample */
        bool orphans_closed;
};

static struct daemon_usage *U(server *srv) {
        if (!srv->usage)
                srv->usage = calloc(1, sizeof *srv->usage);
        return srv->usage;
}

/* The sandbox's row: in memory, else the database's (a re-adopted
 * sandbox: its counters go on from there), else a new one. */
/* lookup false: a sandbox just created, whose row cannot exist yet (ids
 * are never reused), so the database is not read for it */
static live *live_find(server *srv, const sbx *sb, bool lookup) {
        struct daemon_usage *u = U(srv);
        if (!u || sb->pooled)
                return NULL;
        for (live *l = u->rows; l; l = l->next)
                if (streq(l->row.sandbox_id, sb->id))
                        return l;
        live *l = calloc(1, sizeof *l);
        if (!l)
                return NULL;
        hutch_error err = { 0 };
        if (!lookup || meter_get(srv->store, sb->id, &l->row, &err) < 0) {
                meter_row *r = &l->row;
                snprintf(r->sandbox_id, sizeof r->sandbox_id, "%s", sb->id);
                r->team = sb->team_id;
                snprintf(r->template_id, sizeof r->template_id, "%s", sb->template_id);
                snprintf(r->backend, sizeof r->backend, "%s", hutch_backend_name(sb->backend));
                r->started_ms = sb->started_ms;
                r->updated_ms = sb->started_ms;
                r->memory_mb = sb->memory_mb;
                r->gpus = sb->h ? (int64_t) hutch_sandbox_gpus(sb->h, NULL) : 0;
                r->gpu_memory_peak_bytes = -1; /* until NVML says */
                l->dirty = true;
        }
        l->next = u->rows;
        u->rows = l;
        return l;
}

static live *live_get(server *srv, const sbx *sb) {
        return live_find(srv, sb, true);
}

static void live_free(server *srv, live *l) {
        struct daemon_usage *u = srv->usage;
        for (live **pp = &u->rows; *pp; pp = &(*pp)->next)
                if (*pp == l) {
                        *pp = l->next;
                        free(l);
                        break;
                }
}

/* Counters up to now: the kernel's are absolute, the integral runs from
 * the last update with the value read now (so a restart's gap is covered
 * once, by the first sample after it). */
static void advance(live *l, const hutch_stats *s, int64_t now) {
        meter_row *r = &l->row;
        if (s) {
                if ((int64_t) s->cpu_usage_ns > r->cpu_ns)
                        r->cpu_ns = (int64_t) s->cpu_usage_ns;
                r->memory_peak_bytes = MAX(r->memory_peak_bytes,
                                           (int64_t) MAX(s->memory_peak, s->memory_current));
                r->disk_peak_bytes = MAX(r->disk_peak_bytes, (int64_t) s->disk_used);
                r->pids_peak = MAX(r->pids_peak, (int64_t) s->pids_current);
                r->oom_kills = MAX(r->oom_kills, (int64_t) s->oom_kills);
                if (now > r->updated_ms)
                        r->disk_kib_ms += (now - r->updated_ms) * (int64_t) (s->disk_used >> 10);
                if ((int64_t) s->gpus > r->gpus)
                        r->gpus = (int64_t) s->gpus;
                if (s->gpu_memory_measured)
                        r->gpu_memory_peak_bytes = MAX(r->gpu_memory_peak_bytes, (int64_t) s->gpu_memory_used);
        }
        if (now > r->updated_ms)
                r->updated_ms = now;
        r->memory_reserved_mib_ms = r->memory_mb * MAX(0, r->updated_ms - r->started_ms);
        /* the GPUs are reserved for its whole life, as its memory limit */
        r->gpu_ms = r->gpus * MAX(0, r->updated_ms - r->started_ms);
        l->dirty = true;
}

void usage_sandbox_start(server *srv, const sbx *sb) {
        live *l = live_find(srv, sb, false);
        if (!l)
                return;
        hutch_error err = { 0 };
        if (meter_put(srv->store, &l->row, &err) < 0)
                log_debug("usage: %s", err.msg);
        else
                l->dirty = false;
}

void usage_sample(server *srv, const sbx *sb, const hutch_stats *s, int64_t now) {
        live *l = live_get(srv, sb);
        if (l)
                advance(l, s, now);
}

void usage_proc_started(server *srv, const sbx *sb) {
        live *l = live_get(srv, sb);
        if (l) {
                l->row.processes++;
                l->dirty = true;
        }
}

void usage_sandbox_end(server *srv, const sbx *sb) {
        live *l = live_get(srv, sb);
        if (!l)
                return;
        hutch_stats s;
        hutch_error err = { 0 };
        bool have = sb->h && hutch_sandbox_stats(sb->h, &s, &err) == 0;
        advance(l, have ? &s : NULL, wall_ms());
        l->row.ended_ms = l->row.updated_ms;
        audit_sandbox_final(srv, sb, &l->row);
        if (meter_put(srv->store, &l->row, &err) < 0)
                log_warning("usage: sandbox %s: %s (its row is closed at the next start)", sb->id,
                            err.msg);
        live_free(srv, l);
}

void usage_sandbox_forget(server *srv, const sbx *sb) {
        struct daemon_usage *u = U(srv);
        for (live *l = u ? u->rows : NULL; l; l = l->next)
                if (streq(l->row.sandbox_id, sb->id)) {
                        live_free(srv, l);
                        return;
                }
}

/* A volume's bytes on the host's disk: its sparse image's allocated
 * blocks (what the team's files, and ext4's own metadata, really take). */
static int64_t object_bytes(void *arg, const char *kind, const char *id) {
        server *srv = arg;
        char p[PATH_MAX];
        if (streq(kind, "volume")) {
                struct stat st;
                snprintf(p, sizeof p, "%s/volumes/%s.img", srv->cfg.data_dir, id);
                if (stat(p, &st) < 0)
                        return -1;
                return (int64_t) st.st_blocks * 512;
        }
        /* a paused sandbox: billed only while its memory and layer are a
         * checkpoint on disk (gvisor); an ns pause keeps them in RAM */
        sbx *sb = sbx_find(srv, id);
        if (!sb || !sb->paused || !sb->h || !hutch_sandbox_is_suspended(sb->h))
                return -1;
        sbx_pause_image_path(srv, id, p, sizeof p);
        struct stat st;
        return stat(p, &st) < 0 ? -1 : (int64_t) st.st_blocks * 512;
}

void usage_storage_changed(server *srv) {
        struct daemon_usage *u = U(srv);
        if (u)
                u->next_storage_ms = 0;
}

static void storage_tick(server *srv, struct daemon_usage *u, int64_t now) {
        now = MIN(now, wall_ms()); /* GET /usage flushes "a second ahead"; storage is sampled as of now */
        if (now < u->next_storage_ms)
                return;
        u->next_storage_ms = now + (int64_t) srv->cfg.metrics_interval_s * 1000;
        hutch_error err = { 0 };
        int64_t t0 = clock_ns(CLOCK_MONOTONIC);
        if (meter_storage_sample(srv->store, now, object_bytes, srv, &err) < 0) {
                log_debug("usage: storage: %s (trying again)", err.msg);
                u->next_storage_ms = now + USAGE_FLUSH_MS;
        } else
                metrics_store_write(srv, "usage", clock_ns(CLOCK_MONOTONIC) - t0);
}

int64_t usage_tick(server *srv, int64_t now) {
        struct daemon_usage *u = U(srv);
        if (!u)
                return -1;
        hutch_error err = { 0 };
        storage_tick(srv, u, now);
        if (!u->orphans_closed) {
                /* after re-adoption: rows of sandboxes that ended while no
                 * daemon ran (or whose end was not written) */
                int n = meter_close_orphans(srv->store, &err);
                if (n < 0)
                        log_warning("usage: %s", err.msg);
                else if (n > 0)
                        log_info("usage: closed %d row(s) of sandboxes that ended while no daemon ran",
                                 n);
                u->orphans_closed = true;
        }
        if (now < u->next_flush_ms)
                return MIN(u->next_flush_ms, u->next_storage_ms);
        u->next_flush_ms = now + USAGE_FLUSH_MS;
        bool any = false;
        for (live *l = u->rows; l; l = l->next)
                any |= l->dirty;
        if (!any)
                return MIN(u->next_flush_ms, u->next_storage_ms);
        int64_t t0 = clock_ns(CLOCK_MONOTONIC);
        int r = meter_begin(srv->store, &err);
        for (live *l = u->rows; l && r >= 0; l = l->next)
                if (l->dirty)
                        r = meter_put(srv->store, &l->row, &err);
        r = meter_commit(srv->store, r >= 0, &err) < 0 ? -1 : r;
        if (r < 0)
                log_debug("usage: %s (trying again)", err.msg);
        else
                for (live *l = u->rows; l; l = l->next)
                        l->dirty = false;
        if (r >= 0)
                metrics_store_write(srv, "usage", clock_ns(CLOCK_MONOTONIC) - t0);
        return MIN(u->next_flush_ms, u->next_storage_ms);
}

void usage_teardown(server *srv) {
        struct daemon_usage *u = srv->usage;
        if (!u)
                return;
        u->next_flush_ms = 0;
        u->next_storage_ms = 0;
        (void) usage_tick(srv, wall_ms());
        while (u->rows) {
                live *l = u->rows;
                u->rows = l->next;
                free(l);
        }
        free(u);
        srv->usage = NULL;
}

/* ------------------------------------------------------------------ report */

static json_t *counters_json(const meter_row *r) {
        json_t *o = json_pack(
                "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I}}",
                "cpu_ns", (json_int_t) r->cpu_ns, "memory_reserved_mib_ms",
                (json_int_t) r->memory_reserved_mib_ms, "memory_peak_bytes",
                (json_int_t) r->memory_peak_bytes, "disk_kib_ms", (json_int_t) r->disk_kib_ms,
                "disk_peak_bytes", (json_int_t) r->disk_peak_bytes, "pids_peak",
                (json_int_t) r->pids_peak, "processes", (json_int_t) r->processes, "oom_kills",
                (json_int_t) r->oom_kills, "egress", "allowed", (json_int_t) r->egress_allowed,
                "denied", (json_int_t) r->egress_denied, "allowed_bytes_out",
                (json_int_t) r->egress_allowed_out, "allowed_bytes_in",
                (json_int_t) r->egress_allowed_in, "denied_bytes_out",
                (json_int_t) r->egress_denied_out, "denied_bytes_in",
                (json_int_t) r->egress_denied_in);
        json_object_set_new(o, "gpu_ms", json_integer(r->gpu_ms));
        json_object_set_new(o, "gpu_memory_peak_bytes",
                            r->gpu_memory_peak_bytes >= 0 ? json_integer(r->gpu_memory_peak_bytes) : json_null());
        return o;
}

typedef struct report {
        bool by_day;
        json_t *rows; /* key -> {key, …, _sum} built in order */
        meter_row *sums;
        char (*keys)[64];
        meter_row *first; /* by sandbox: the row itself */
        size_t n, cap;
        meter_row total;
} report;

static int report_add(void *arg, const meter_row *r) {
        report *x = arg;
        char key[64];
        if (x->by_day) {
                time_t t = (time_t) (r->started_ms / 1000);
                struct tm tm;
                gmtime_r(&t, &tm);
                strftime(key, sizeof key, "%Y-%m-%d", &tm);
        } else
                snprintf(key, sizeof key, "%s", r->sandbox_id);
        size_t i = 0;
        for (; i < x->n; i++)
                if (streq(x->keys[i], key))
                        break;
        if (i == x->n) {
                if (x->n == x->cap) {
                        size_t cap = x->cap ? x->cap * 2 : 64;
                        meter_row *s = realloc(x->sums, cap * sizeof *s);
                        if (s)
                                x->sums = s;
                        meter_row *f = realloc(x->first, cap * sizeof *f);
                        if (f)
                                x->first = f;
                        char(*k)[64] = realloc(x->keys, cap * sizeof *k);
                        if (k)
                                x->keys = k;
                        if (!s || !f || !k)
                                return -ENOMEM;
                        x->cap = cap;
                }
                memset(&x->sums[i], 0, sizeof x->sums[i]);
                x->sums[i].gpu_memory_peak_bytes = -1;
                x->first[i] = *r;
                snprintf(x->keys[i], sizeof x->keys[i], "%s", key);
                x->n++;
        }
        meter_row_add(&x->sums[i], r);
        meter_row_add(&x->total, r);
        return 0;
}

static json_t *storage_counters_json(int64_t kib_ms, int64_t bytes_peak) {
        return json_pack("{s:I, s:I}", "kib_ms", (json_int_t) kib_ms, "bytes_peak", (json_int_t) bytes_peak);
}

typedef struct storage_report {
        json_t *rows;
        int64_t kib_ms[3], peak[3]; /* [0] volumes, [1] snapshots, [2] paused sandboxes' checkpoints */
} storage_report;

static int storage_add(void *arg, const meter_storage *r) {
        storage_report *x = arg;
        char a[40], b[40] = "";
        format_rfc3339(r->started_ms, a);
        if (r->ended_ms)
                format_rfc3339(r->ended_ms, b);
        json_t *o = storage_counters_json(r->kib_ms, r->bytes_peak);
        json_object_set_new(o, "kind", json_string(r->kind));
        json_object_set_new(o, "id", json_string(r->object_id));
        json_object_set_new(o, "name", json_string(r->name));
        json_object_set_new(o, "teamID", json_integer(r->team));
        json_object_set_new(o, "bytes", json_integer(r->bytes));
        json_object_set_new(o, "startedAt", json_string(a));
        json_object_set_new(o, "endedAt", r->ended_ms ? json_string(b) : json_null());
        if (json_array_append_new(x->rows, o) < 0)
                return -ENOMEM;
        int k = streq(r->kind, "volume") ? 0 : streq(r->kind, "snapshot") ? 1 : 2;
        x->kib_ms[k] += r->kib_ms;
        x->peak[k] = MAX(x->peak[k], r->bytes_peak);
        return 0;
}

/* {"rows": [...], "total": {"volumes": {…}, "snapshots": {…}}} */
static json_t *storage_report_json(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms,
                                   hutch_error *err) {
        storage_report x = { .rows = json_array() };
        if (!x.rows || meter_storage_query(st, team, since_ms, until_ms, wall_ms(), storage_add, &x, err) < 0) {
                json_decref(x.rows);
                return NULL;
        }
        return json_pack("{s:o, s:{s:o, s:o, s:o}}", "rows", x.rows, "total", "volumes",
                         storage_counters_json(x.kib_ms[0], x.peak[0]), "snapshots",
                         storage_counters_json(x.kib_ms[1], x.peak[1]), "checkpoints",
                         storage_counters_json(x.kib_ms[2], x.peak[2]));
}

json_t *usage_report(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms,
                     const char *by, hutch_error *err) {
        report x = { .by_day = streq(by, "day"), .total = { .gpu_memory_peak_bytes = -1 } };
        int r = meter_query(st, team, since_ms, until_ms, report_add, &x, err);
        json_t *out = NULL;
        if (r == -ENOMEM)
                hutch_error_set(err, -ENOMEM, "out of memory");
        if (r >= 0) {
                json_t *rows = json_array();
                for (size_t i = 0; i < x.n; i++) {
                        json_t *o = counters_json(&x.sums[i]);
                        json_object_set_new(o, x.by_day ? "day" : "sandboxID",
                                            json_string(x.keys[i]));
                        if (!x.by_day) {
                                const meter_row *f = &x.first[i];
                                char a[40], b[40] = "";
                                format_rfc3339(f->started_ms, a);
                                if (f->ended_ms)
                                        format_rfc3339(f->ended_ms, b);
                                json_object_set_new(o, "templateID", json_string(f->template_id));
                                json_object_set_new(o, "backend", json_string(f->backend));
                                json_object_set_new(o, "teamID", json_integer(f->team));
                                json_object_set_new(o, "startedAt", json_string(a));
                                json_object_set_new(o, "endedAt",
                                                    f->ended_ms ? json_string(b) : json_null());
                                json_object_set_new(o, "memory_mb", json_integer(f->memory_mb));
                                json_object_set_new(o, "gpus", json_integer(f->gpus));
                        }
                        json_array_append_new(rows, o);
                }
                out = json_pack("{s:s, s:o, s:o}", "by", x.by_day ? "day" : "sandbox", "rows", rows,
                                "total", counters_json(&x.total));
                json_t *storage = out ? storage_report_json(st, team, since_ms, until_ms, err) : NULL;
                if (!storage) {
                        json_decref(out);
                        out = NULL;
                } else
                        json_object_set_new(out, "storage", storage);
        }
        free(x.sums);
        free(x.first);
        free(x.keys);
        return out;
}

enum MHD_Result usage_api(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        int64_t since = 0, until = 0, now = wall_ms();
        const char *s = http_query(c, "since"), *u = http_query(c, "until"),
                   *by = http_query(c, "by");
        if (s && audit_time_parse(s, now, &since) < 0)
                return http_reply_error(
                        c, 400, "since: expected an RFC 3339 time, a date, unix ms or a duration");
        if (u && audit_time_parse(u, now, &until) < 0)
                return http_reply_error(
                        c, 400, "until: expected an RFC 3339 time, a date, unix ms or a duration");
        if (by && !streq(by, "sandbox") && !streq(by, "day"))
                return http_reply_error(c, 400, "by: sandbox or day");
        hutch_error err = { 0 };
        usage_storage_changed(srv); /* the storage ledger up to now, too */
        (void) usage_tick(srv, now + USAGE_FLUSH_MS); /* what the loop holds, first */
        json_t *j = usage_report(srv->store, req->team, since, until, by ? by : "sandbox", &err);
        if (!j)
                return http_reply_error(c, 500, "usage: %s", err.msg);
        return http_reply_json(c, 200, j);
}
