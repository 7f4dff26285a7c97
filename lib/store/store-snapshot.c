/* SPDX-License-Identifier: Apache-2.0 */
/* Snapshots: one row per sealed layer file in DATA_DIR/snapshots. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store-internal.h"

#define SNAP_COLUMNS "id, team_id, sandbox_id, name, template_id, disk_mb, bytes, created_ms"

static void copy_col(sqlite3_stmt *s, int i, char *buf, size_t n) {
        const unsigned char *t = sqlite3_column_text(s, i);
        snprintf(buf, n, "%s", t ? (const char *) t : "");
}

static void from_row(sqlite3_stmt *s, store_snapshot *r) {
        memset(r, 0, sizeof *r);
        copy_col(s, 0, r->id, sizeof r->id);
        r->team_id = sqlite3_column_int64(s, 1);
        copy_col(s, 2, r->sandbox_id, sizeof r->sandbox_id);
        copy_col(s, 3, r->name, sizeof r->name);
        copy_col(s, 4, r->template_id, sizeof r->template_id);
        r->disk_mb = sqlite3_column_int64(s, 5);
        r->bytes = sqlite3_column_int64(s, 6);
        r->created_ms = sqlite3_column_int64(s, 7);
}

int store_snapshot_insert(hutch_store *st, const store_snapshot *sn, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SNAP_INSERT,
                           "INSERT INTO snapshots (" SNAP_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, sn->id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, sn->team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 3, sn->sandbox_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 4, sn->name);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 5, sn->template_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 6, sn->disk_mb);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 7, sn->bytes);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 8, sn->created_ms);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "recording a snapshot");
}

int store_snapshot_get(hutch_store *st, int64_t team_id, const char *id, store_snapshot *ret, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SNAP_GET, "SELECT " SNAP_COLUMNS " FROM snapshots WHERE id = ?1 AND team_id = ?2",
                           &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, team_id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_row(st, s, err, "reading a snapshot");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "snapshot %s not found", id);
        from_row(s, ret);
        return 0;
}

int store_snapshot_delete(hutch_store *st, int64_t team_id, const char *id, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SNAP_DELETE, "DELETE FROM snapshots WHERE id = ?1 AND team_id = ?2", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, team_id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "deleting a snapshot");
        if (r < 0)
                return r;
        return sqlite3_changes(st->db) > 0 ? 0 : hutch_error_set(err, -ENOENT, "snapshot %s not found", id);
}

int store_snapshot_list(hutch_store *st, int64_t team_id, const char *sandbox_id, const char *name, int64_t before_ms,
                        const char *before_id, unsigned limit, store_snapshot **ret, size_t *ret_n, hutch_error *err) {
        if (limit < 1 || limit > 1000)
                return hutch_error_set(err, -EINVAL, "limit must be 1..1000");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SNAP_LIST,
                           "SELECT " SNAP_COLUMNS " FROM snapshots WHERE team_id = ?1"
                           " AND (?2 IS NULL OR sandbox_id = ?2) AND (?3 IS NULL OR name = ?3)"
                           " AND (?4 IS NULL OR created_ms < ?4 OR (created_ms = ?4 AND id < ?5))"
                           " ORDER BY created_ms DESC, id DESC LIMIT ?6",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, sandbox_id && *sandbox_id ? sandbox_id : NULL);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 3, name && *name ? name : NULL);
        if (rc == SQLITE_OK)
                rc = before_id ? sqlite3_bind_int64(s, 4, before_ms) : sqlite3_bind_null(s, 4);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 5, before_id ? before_id : "");
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(s, 6, (int) limit);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        store_snapshot *v = calloc(limit, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t n = 0;
        while (n < limit) {
                r = store_step_row(st, s, err, "listing snapshots");
                if (r < 0) {
                        free(v);
                        return r;
                }
                if (r == 0)
                        break;
                from_row(s, &v[n++]);
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

int store_snapshot_find(hutch_store *st, const char *id, store_snapshot *ret, hutch_error *err) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(st->db, "SELECT " SNAP_COLUMNS " FROM snapshots WHERE id = ?1", -1, &s, NULL);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 1, id);
        if (rc != SQLITE_OK) {
                sqlite3_finalize(s);
                return store_fail(st, rc, err, "reading a snapshot");
        }
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW)
                from_row(s, ret);
        sqlite3_finalize(s);
        return rc == SQLITE_ROW ? 0 : hutch_error_set(err, -ENOENT, "snapshot %s not found", id);
}

int store_snapshot_count(hutch_store *st, int64_t team_id, int64_t *ret, hutch_error *err) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(st->db, "SELECT count(*) FROM snapshots WHERE team_id = ?1", -1, &s, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW) {
                *ret = sqlite3_column_int64(s, 0);
                sqlite3_finalize(s);
                return 0;
        }
        sqlite3_finalize(s);
        return store_fail(st, rc == SQLITE_OK ? SQLITE_ERROR : rc, err, "counting snapshots");
}

int store_snapshot_count_template(hutch_store *st, const char *template_id, int64_t *ret,
                                  hutch_error *err) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(st->db, "SELECT count(*) FROM snapshots WHERE template_id = ?1",
                                    -1, &s, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_text(s, 1, template_id, -1, SQLITE_TRANSIENT);
        if (rc == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW) {
                *ret = sqlite3_column_int64(s, 0);
                sqlite3_finalize(s);
                return 0;
        }
        sqlite3_finalize(s);
        return store_fail(st, rc == SQLITE_OK ? SQLITE_ERROR : rc, err, "counting snapshots");
}

int store_snapshot_prune_missing(hutch_store *st, const char *dir) {
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(st->db, "SELECT id FROM snapshots", -1, &s, NULL) != SQLITE_OK)
                return -EIO;
        char (*gone)[32] = NULL;
        size_t n = 0;
        while (sqlite3_step(s) == SQLITE_ROW) {
                const unsigned char *id = sqlite3_column_text(s, 0);
                char path[4096];
                snprintf(path, sizeof path, "%s/%s.seal", dir, id ? (const char *) id : "");
                if (id && access(path, F_OK) < 0 && errno == ENOENT) {
                        char(*g)[32] = realloc(gone, (n + 1) * sizeof *gone);
                        if (!g)
                                break;
                        gone = g;
                        snprintf(gone[n++], 32, "%s", (const char *) id);
                }
        }
        sqlite3_finalize(s);
        int removed = 0;
        for (size_t i = 0; i < n; i++) {
                sqlite3_stmt *d = NULL;
                if (sqlite3_prepare_v2(st->db, "DELETE FROM snapshots WHERE id = ?1", -1, &d, NULL) == SQLITE_OK &&
                    store_bind_text(d, 1, gone[i]) == SQLITE_OK && sqlite3_step(d) == SQLITE_DONE)
                        removed++;
                sqlite3_finalize(d);
        }
        free(gone);
        return removed;
}
