/* SPDX-License-Identifier: Apache-2.0 */
/* The storage ledger's rows: volumes and snapshots (lib/meter/meter.h). */
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "meter/meter-internal.h"
#include "meter/meter.h"
#include "util/macro.h"

#define SCOLS "kind, object_id, team_id, name, started_ms, ended_ms, updated_ms, bytes, bytes_peak, kib_ms"


static int sample_objects(sqlite3 *db, int64_t now,
                          int64_t (*object_bytes)(void *arg, const char *kind, const char *id), void *arg,
                          hutch_error *err) {
        _cleanup_(meter_finalizep) sqlite3_stmt *q = NULL, *up = NULL;
        if (sqlite3_prepare_v2(db,
                               "SELECT 'volume', id, team_id, name, created_ms, 0 FROM volumes"
                               " WHERE deleting_ms = 0"
                               " UNION ALL SELECT 'snapshot', id, team_id, name, created_ms, bytes FROM snapshots"
                               /* state 2: paused; a checkpoint row runs from its first sample */
                               " UNION ALL SELECT 'checkpoint', id, team_id, alias, ?1, 0 FROM sandboxes"
                               " WHERE state = 2",
                               -1, &q, NULL) != SQLITE_OK)
                return meter_fail(db, err, "reading volumes and snapshots");
        /* a new row is integrated from the object's creation (a sample
         * comes at most an interval later); an open row from its last
         * sample, with the bytes held now; bytes < 0 keeps the last value */
        if (sqlite3_prepare_v2(
                    db,
                    "INSERT INTO storage_usage (" SCOLS ")"
                    " VALUES (?1, ?2, ?3, ?4, ?5, 0, max(?5, ?6), max(?7, 0), max(?7, 0),"
                    "  max(0, ?6 - ?5) * (max(?7, 0) / 1024))"
                    " ON CONFLICT (kind, object_id) DO UPDATE SET"
                    /* a closed checkpoint row reopens: the sandbox is paused
                     * again, and the time it ran in between costs nothing */
                    "  kib_ms = kib_ms + CASE WHEN ended_ms = 0 THEN max(0, ?6 - updated_ms) * (bytes / 1024)"
                    "   ELSE 0 END,"
                    "  updated_ms = max(updated_ms, ?6),"
                    "  ended_ms = 0,"
                    "  bytes = ?7,"
                    "  bytes_peak = max(bytes_peak, ?7),"
                    "  name = ?4"
                    /* a row is written only when what it holds changed: the
                     * time at the same bytes is added when it is read (and
                     * here, at the next change), so an idle volume or a
                     * snapshot costs no database write a sample */
                    " WHERE ?7 >= 0 AND ((ended_ms = 0 AND (bytes != ?7 OR name != ?4))"
                    "  OR (ended_ms != 0 AND kind = 'checkpoint'))",
                    -1, &up, NULL) != SQLITE_OK)
                return meter_fail(db, err, "writing storage usage");
        int rc;
        sqlite3_bind_int64(q, 1, now);
        while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
                char kind[16], id[64];
                meter_text(q, 0, kind, sizeof kind);
                meter_text(q, 1, id, sizeof id);
                int64_t bytes = sqlite3_column_int64(q, 5);
                if (!streq(kind, "snapshot"))
                        bytes = object_bytes ? object_bytes(arg, kind, id) : -1;
                if (bytes < 0 && streq(kind, "checkpoint"))
                        continue; /* paused with its memory in RAM: no checkpoint to bill */
                sqlite3_reset(up);
                sqlite3_bind_text(up, 1, kind, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(up, 2, id, -1, SQLITE_TRANSIENT);
                sqlite3_bind_int64(up, 3, sqlite3_column_int64(q, 2));
                sqlite3_bind_value(up, 4, sqlite3_column_value(q, 3));
                sqlite3_bind_int64(up, 5, sqlite3_column_int64(q, 4));
                sqlite3_bind_int64(up, 6, now);
                sqlite3_bind_int64(up, 7, bytes);
                if (sqlite3_step(up) != SQLITE_DONE)
                        return meter_fail(db, err, "writing storage usage");
        }
        if (rc != SQLITE_DONE)
                return meter_fail(db, err, "reading volumes and snapshots");
        return 0;
}

int meter_storage_sample(hutch_store *st, int64_t now,
                         int64_t (*object_bytes)(void *arg, const char *kind, const char *id), void *arg,
                         hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
                return meter_fail(db, err, "BEGIN");
        int r = sample_objects(db, now, object_bytes, arg, err);
        int closed = 0;
        if (r >= 0) {
                /* gone (deleted, or a volume being deleted): closed at now,
                 * the time since the last sample at the last bytes */
                _cleanup_(meter_finalizep) sqlite3_stmt *s = NULL;
                if (sqlite3_prepare_v2(
                            db,
                            "UPDATE storage_usage SET kib_ms = kib_ms + max(0, ?1 - updated_ms) * (bytes / 1024),"
                            " updated_ms = max(updated_ms, ?1), ended_ms = max(updated_ms, ?1)"
                            " WHERE ended_ms = 0 AND ((kind = 'volume' AND object_id NOT IN"
                            "  (SELECT id FROM volumes WHERE deleting_ms = 0))"
                            " OR (kind = 'snapshot' AND object_id NOT IN (SELECT id FROM snapshots))"
                            /* resumed, or ended: its checkpoint is gone */
                            " OR (kind = 'checkpoint' AND object_id NOT IN"
                            "  (SELECT id FROM sandboxes WHERE state = 2)))",
                            -1, &s, NULL) != SQLITE_OK)
                        r = meter_fail(db, err, "closing storage usage");
                else {
                        sqlite3_bind_int64(s, 1, now);
                        if (sqlite3_step(s) != SQLITE_DONE)
                                r = meter_fail(db, err, "closing storage usage");
                        else
                                closed = sqlite3_changes(db);
                }
        }
        if (r >= 0 && sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
                r = meter_fail(db, err, "COMMIT");
        if (r < 0 && !sqlite3_get_autocommit(db))
                (void) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return r < 0 ? r : closed;
}

int meter_storage_query(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms, int64_t now_ms,
                        int (*cb)(void *arg, const meter_storage *r), void *arg, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        _cleanup_(meter_finalizep) sqlite3_stmt *s = NULL;
        /* an open row's integral runs to now at the bytes it last recorded */
        if (sqlite3_prepare_v2(db,
                               "SELECT kind, object_id, team_id, name, started_ms, ended_ms,"
                               " CASE WHEN ended_ms = 0 THEN max(updated_ms, ?4) ELSE updated_ms END, bytes, bytes_peak,"
                               " kib_ms + CASE WHEN ended_ms = 0 THEN max(0, ?4 - updated_ms) * (bytes / 1024) ELSE 0 END"
                               " FROM storage_usage WHERE (?1 < 0 OR team_id = ?1)"
                               " AND (?2 = 0 OR ended_ms = 0 OR ended_ms >= ?2) AND (?3 = 0 OR started_ms < ?3)"
                               " ORDER BY started_ms, kind, object_id",
                               -1, &s, NULL) != SQLITE_OK)
                return meter_fail(db, err, "reading storage usage");
        sqlite3_bind_int64(s, 1, team);
        sqlite3_bind_int64(s, 2, since_ms);
        sqlite3_bind_int64(s, 3, until_ms);
        sqlite3_bind_int64(s, 4, now_ms);
        int rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                meter_storage r = { 0 };
                meter_text(s, 0, r.kind, sizeof r.kind);
                meter_text(s, 1, r.object_id, sizeof r.object_id);
                r.team = sqlite3_column_int64(s, 2);
                meter_text(s, 3, r.name, sizeof r.name);
                int64_t *v[] = { &r.started_ms, &r.ended_ms, &r.updated_ms, &r.bytes, &r.bytes_peak, &r.kib_ms };
                for (size_t i = 0; i < ELEMENTSOF(v); i++)
                        *v[i] = sqlite3_column_int64(s, (int) i + 4);
                int k = cb(arg, &r);
                if (k < 0)
                        return k;
        }
        if (rc != SQLITE_DONE)
                return meter_fail(db, err, "reading storage usage");
        return 0;
}
