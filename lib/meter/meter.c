/* SPDX-License-Identifier: Apache-2.0 */
/* The usage ledger's rows (lib/meter/meter.h). */
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "meter/meter-internal.h"
#include "meter/meter.h"
#include "util/macro.h"

#define COLS                                                                                                         \
        "sandbox_id, team_id, template_id, backend, started_ms, ended_ms, updated_ms, cpu_ns, memory_mb,"            \
        " memory_reserved_mib_ms, memory_peak_bytes, disk_kib_ms, disk_peak_bytes, pids_peak, processes, oom_kills," \
        " egress_allowed, egress_denied, egress_allowed_out, egress_allowed_in, egress_denied_out, egress_denied_in," \
        " gpus, gpu_ms, gpu_memory_peak_bytes"


static void fill(sqlite3_stmt *s, meter_row *r) {
        memset(r, 0, sizeof *r);
        meter_text(s, 0, r->sandbox_id, sizeof r->sandbox_id);
        r->team = sqlite3_column_int64(s, 1);
        meter_text(s, 2, r->template_id, sizeof r->template_id);
        meter_text(s, 3, r->backend, sizeof r->backend);
        int64_t *v[] = { &r->started_ms,         &r->ended_ms,
                         &r->updated_ms,         &r->cpu_ns,
                         &r->memory_mb,          &r->memory_reserved_mib_ms,
                         &r->memory_peak_bytes,  &r->disk_kib_ms,
                         &r->disk_peak_bytes,    &r->pids_peak,
                         &r->processes,          &r->oom_kills,
                         &r->egress_allowed,     &r->egress_denied,
                         &r->egress_allowed_out, &r->egress_allowed_in,
                         &r->egress_denied_out,  &r->egress_denied_in };
        for (size_t i = 0; i < ELEMENTSOF(v); i++)
                *v[i] = sqlite3_column_int64(s, (int) i + 4);
        r->gpus = sqlite3_column_int64(s, 22);
        r->gpu_ms = sqlite3_column_int64(s, 23);
        r->gpu_memory_peak_bytes = sqlite3_column_type(s, 24) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 24);
}

int meter_get(hutch_store *st, const char *sandbox_id, meter_row *ret, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        _cleanup_(meter_finalizep) sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(db, "SELECT " COLS " FROM usage WHERE sandbox_id = ?1", -1, &s,
                               NULL) != SQLITE_OK)
                return meter_fail(db, err, "reading usage");
        sqlite3_bind_text(s, 1, sandbox_id, -1, SQLITE_STATIC);
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
                return hutch_error_set(err, -ENOENT, "no usage row for %s", sandbox_id);
        if (rc != SQLITE_ROW)
                return meter_fail(db, err, "reading usage");
        fill(s, ret);
        return 0;
}

/* the egress columns: sums over the sandbox's egress records (an index
 * range: egress_log_sandbox) */
static const char meter_put_sql[] = "INSERT OR REPLACE INTO usage (" COLS
                                    ") SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,"
                                    " ?11, ?12, ?13, ?14, ?15, ?16,"
                                    " coalesce(sum(allowed = 1), 0), coalesce(sum(allowed = 0), 0),"
                                    " coalesce(sum(CASE WHEN allowed = 1 THEN bytes_out END), 0),"
                                    " coalesce(sum(CASE WHEN allowed = 1 THEN bytes_in END), 0),"
                                    " coalesce(sum(CASE WHEN allowed = 0 THEN bytes_out END), 0),"
                                    " coalesce(sum(CASE WHEN allowed = 0 THEN bytes_in END), 0),"
                                    " ?17, ?18, ?19"
                                    " FROM egress_log WHERE sandbox_id = ?1";

static void meter_resetp(sqlite3_stmt **s) {
        if (*s) {
                (void) sqlite3_reset(*s);
                (void) sqlite3_clear_bindings(*s);
        }
}

int meter_put(hutch_store *st, const meter_row *r, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        /* prepared once: every sandbox's create and end writes a row */
        _cleanup_(meter_resetp) sqlite3_stmt *s = NULL;
        int k = store_stmt_extern(st, meter_put_sql, &s, err);
        if (k < 0)
                return k;
        sqlite3_bind_text(s, 1, r->sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, r->team);
        sqlite3_bind_text(s, 3, r->template_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, r->backend, -1, SQLITE_STATIC);
        const int64_t v[] = { r->started_ms,        r->ended_ms,
                              r->updated_ms,        r->cpu_ns,
                              r->memory_mb,         r->memory_reserved_mib_ms,
                              r->memory_peak_bytes, r->disk_kib_ms,
                              r->disk_peak_bytes,   r->pids_peak,
                              r->processes,         r->oom_kills };
        for (size_t i = 0; i < ELEMENTSOF(v); i++)
                sqlite3_bind_int64(s, (int) i + 5, v[i]);
        sqlite3_bind_int64(s, 17, r->gpus);
        sqlite3_bind_int64(s, 18, r->gpu_ms);
        if (r->gpu_memory_peak_bytes >= 0)
                sqlite3_bind_int64(s, 19, r->gpu_memory_peak_bytes);
        else
                sqlite3_bind_null(s, 19);
        if (sqlite3_step(s) != SQLITE_DONE)
                return meter_fail(db, err, "writing usage");
        return 0;
}

int meter_close_orphans(hutch_store *st, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        /* the memory reservation runs to the sandbox's end; the counters
         * stay as last read (the cgroup is gone) */
        if (sqlite3_exec(
                    db,
                    "UPDATE usage SET ended_ms = s.ended_ms, updated_ms = s.ended_ms,"
                    " memory_reserved_mib_ms = usage.memory_mb * max(0, s.ended_ms - usage.started_ms),"
                    " gpu_ms = usage.gpus * max(0, s.ended_ms - usage.started_ms)"
                    " FROM sandboxes s WHERE usage.ended_ms = 0 AND s.id = usage.sandbox_id AND s.state = 3",
                    NULL, NULL, NULL) != SQLITE_OK)
                return meter_fail(db, err, "closing usage rows");
        return sqlite3_changes(db);
}

int meter_query(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms,
                int (*cb)(void *arg, const meter_row *r), void *arg, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        _cleanup_(meter_finalizep) sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(
                    db,
                    "SELECT " COLS " FROM usage WHERE (?1 < 0 OR team_id = ?1)"
                    " AND (?2 = 0 OR ended_ms = 0 OR ended_ms >= ?2) AND (?3 = 0 OR started_ms < ?3)"
                    " ORDER BY started_ms, sandbox_id",
                    -1, &s, NULL) != SQLITE_OK)
                return meter_fail(db, err, "reading usage");
        sqlite3_bind_int64(s, 1, team);
        sqlite3_bind_int64(s, 2, since_ms);
        sqlite3_bind_int64(s, 3, until_ms);
        int rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                meter_row r;
                fill(s, &r);
                int k = cb(arg, &r);
                if (k < 0)
                        return k;
        }
        if (rc != SQLITE_DONE)
                return meter_fail(db, err, "reading usage");
        return 0;
}

int meter_begin(hutch_store *st, hutch_error *err) {
        return store_begin(st, err);
}

int meter_commit(hutch_store *st, bool ok, hutch_error *err) {
        if (ok)
                return store_commit(st, err);
        store_rollback(st);
        return 0;
}

void meter_row_add(meter_row *sum, const meter_row *r) {
        sum->cpu_ns += r->cpu_ns;
        sum->memory_reserved_mib_ms += r->memory_reserved_mib_ms;
        sum->memory_peak_bytes = MAX(sum->memory_peak_bytes, r->memory_peak_bytes);
        sum->disk_kib_ms += r->disk_kib_ms;
        sum->disk_peak_bytes = MAX(sum->disk_peak_bytes, r->disk_peak_bytes);
        sum->pids_peak = MAX(sum->pids_peak, r->pids_peak);
        sum->processes += r->processes;
        sum->oom_kills += r->oom_kills;
        sum->egress_allowed += r->egress_allowed;
        sum->egress_denied += r->egress_denied;
        sum->egress_allowed_out += r->egress_allowed_out;
        sum->egress_allowed_in += r->egress_allowed_in;
        sum->egress_denied_out += r->egress_denied_out;
        sum->egress_denied_in += r->egress_denied_in;
        sum->gpu_ms += r->gpu_ms;
        /* a peak is the largest measured one; not measured (-1) only when none was */
        sum->gpu_memory_peak_bytes = MAX(sum->gpu_memory_peak_bytes, r->gpu_memory_peak_bytes);
}
