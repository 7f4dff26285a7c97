/* SPDX-License-Identifier: Apache-2.0 */
/* Retention: what the database keeps of the past. Without it every create
 * left its row and events forever (issue #19). The daemon decides the age
 * (the `retention` setting) and calls store_prune() in small batches from
 * its loop; the indexes of migration 5 let each batch find its rows without
 * a scan of the table. */
#include <errno.h>

#include "store/store-internal.h"

/* DELETE ... LIMIT is a compile-time option of SQLite; "rowid IN (SELECT
 * ... LIMIT n)" is the portable way to bound one statement. */
static int prune_one(hutch_store *st, enum store_stmt slot, const char *sql, int64_t before_ms,
                     unsigned limit, int64_t *ret, const char *what, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, slot, sql, &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, before_ms);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, (int64_t) limit);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, what);
        if (r < 0)
                return r;
        *ret = sqlite3_changes64(st->db);
        return 0;
}

int store_prune(hutch_store *st, int64_t before_ms, unsigned limit, store_prune_counts *ret,
                hutch_error *err) {
        if (limit == 0)
                return hutch_error_set(err, -EINVAL, "prune limit 0");
        store_prune_counts c = { 0 };
        /* A snapshot names the sandbox it was taken from: that row stays
         * while the snapshot does. Live rows (state <> 3) are never matched. */
        int r = prune_one(
                st, STMT_PRUNE_SANDBOXES,
                "DELETE FROM sandboxes WHERE id IN (SELECT id FROM sandboxes"
                " WHERE state = 3 AND ended_ms < ?1"
                " AND NOT EXISTS (SELECT 1 FROM snapshots WHERE snapshots.sandbox_id = sandboxes.id)"
                " LIMIT ?2)",
                before_ms, limit, &c.sandboxes, "pruning ended sandboxes", err);
        /* a live sandbox's lifecycle stays whole while it lives */
        if (r >= 0)
                r = prune_one(st, STMT_PRUNE_EVENTS,
                              "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE ts_ms < ?1"
                              " AND (sandbox_id IS NULL OR sandbox_id NOT IN"
                              " (SELECT id FROM sandboxes WHERE state <> 3)) LIMIT ?2)",
                              before_ms, limit, &c.events, "pruning events", err);
        /* by age alone: a long-lived sandbox's old decisions go too, which
         * bounds the log by the recording rate times the retention */
        if (r >= 0)
                r = prune_one(st, STMT_PRUNE_EGRESS,
                              "DELETE FROM egress_log WHERE id IN (SELECT id FROM egress_log WHERE ts_ms < ?1"
                              " LIMIT ?2)",
                              before_ms, limit, &c.egress, "pruning the egress log", err);
        if (r < 0)
                return r;
        if (ret)
                *ret = c;
        int64_t total = c.sandboxes + c.events + c.egress;
        return total > INT32_MAX ? INT32_MAX : (int) total;
}

int store_checkpoint(hutch_store *st, hutch_error *err) {
        /* the busy handler would stall the caller's loop while another
         * process (the CLI) holds a transaction: try once instead */
        (void) sqlite3_busy_timeout(st->db, 0);
        int rc = sqlite3_wal_checkpoint_v2(st->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
        (void) sqlite3_busy_timeout(st->db, STORE_BUSY_TIMEOUT_MS);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "checkpointing the WAL");
        return 0;
}
