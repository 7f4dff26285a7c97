/* SPDX-License-Identifier: Apache-2.0 */
/* Volumes: one row per ext4 image in DATA_DIR/volumes (docs/volumes.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store-internal.h"

#define VOL_COLUMNS "id, team_id, name, size_bytes, created_ms, deleting_ms, token_hash"

static void copy_col(sqlite3_stmt *s, int i, char *buf, size_t n) {
        const unsigned char *t = sqlite3_column_text(s, i);
        snprintf(buf, n, "%s", t ? (const char *) t : "");
}

static void from_row(sqlite3_stmt *s, store_volume *v) {
        memset(v, 0, sizeof *v);
        copy_col(s, 0, v->id, sizeof v->id);
        v->team_id = sqlite3_column_int64(s, 1);
        copy_col(s, 2, v->name, sizeof v->name);
        v->size_bytes = sqlite3_column_int64(s, 3);
        v->created_ms = sqlite3_column_int64(s, 4);
        v->deleting_ms = sqlite3_column_int64(s, 5);
        if (sqlite3_column_bytes(s, 6) == 32) {
                memcpy(v->token_hash, sqlite3_column_blob(s, 6), 32);
                v->has_token_hash = true;
        }
}

int store_volume_insert(hutch_store *st, const store_volume *v, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_INSERT,
                           "INSERT INTO volumes (" VOL_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6)",
                           &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, v->id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, v->team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 3, v->name);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 4, v->size_bytes);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 5, v->created_ms);
        if (rc == SQLITE_OK)
                rc = v->has_token_hash ? sqlite3_bind_blob(s, 6, v->token_hash, 32, SQLITE_TRANSIENT)
                                       : sqlite3_bind_null(s, 6);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "recording a volume");
}

static int get_one(hutch_store *st, sqlite3_stmt *s, store_volume *ret, const char *what,
                   hutch_error *err) {
        int r = store_step_row(st, s, err, "reading a volume");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "volume %s not found", what);
        from_row(s, ret);
        return 0;
}

int store_volume_get(hutch_store *st, int64_t team_id, const char *id, store_volume *ret,
                     hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_GET,
                           "SELECT " VOL_COLUMNS
                           " FROM volumes WHERE id = ?1 AND (?2 < 0 OR team_id = ?2)"
                           " AND deleting_ms = 0",
                           &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, team_id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return get_one(st, s, ret, id, err);
}

int store_volume_find(hutch_store *st, int64_t team_id, const char *name, store_volume *ret,
                      hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_FIND,
                           "SELECT " VOL_COLUMNS
                           " FROM volumes WHERE team_id = ?1 AND name = ?2 AND deleting_ms = 0",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, name);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return get_one(st, s, ret, name, err);
}

static int list_rows(hutch_store *st, sqlite3_stmt *s, store_volume **ret, size_t *ret_n,
                     hutch_error *err) {
        size_t n = 0, cap = 0;
        store_volume *v = NULL;
        for (;;) {
                int r = store_step_row(st, s, err, "listing volumes");
                if (r < 0) {
                        free(v);
                        return r;
                }
                if (r == 0 || n >= 10000)
                        break;
                if (n == cap) {
                        size_t nc = cap ? cap * 2 : 16;
                        store_volume *nv = reallocarray(v, nc, sizeof *nv);
                        if (!nv) {
                                free(v);
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        }
                        v = nv;
                        cap = nc;
                }
                from_row(s, &v[n++]);
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

int store_volume_list(hutch_store *st, int64_t team_id, store_volume **ret, size_t *ret_n,
                      hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_LIST,
                           "SELECT " VOL_COLUMNS " FROM volumes WHERE team_id = ?1 AND deleting_ms = 0"
                           " ORDER BY created_ms, id",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return list_rows(st, s, ret, ret_n, err);
}

int store_volume_list_deleting(hutch_store *st, store_volume **ret, size_t *ret_n, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_LIST_DELETING,
                           "SELECT " VOL_COLUMNS " FROM volumes WHERE deleting_ms != 0 ORDER BY id",
                           &s, err);
        if (r < 0)
                return r;
        return list_rows(st, s, ret, ret_n, err);
}

int store_volume_set_deleting(hutch_store *st, int64_t team_id, const char *id, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(
                st, STMT_VOL_DELETING,
                "UPDATE volumes SET deleting_ms = ?3 WHERE id = ?1 AND team_id = ?2 AND deleting_ms = 0",
                &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, team_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 3, store_wall_ms());
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "marking a volume deleted");
        if (r < 0)
                return r;
        return sqlite3_changes(st->db) > 0
                ? 0
                : hutch_error_set(err, -ENOENT, "volume %s not found", id);
}

int store_volume_delete(hutch_store *st, const char *id, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_DELETE, "DELETE FROM volumes WHERE id = ?1", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "deleting a volume");
}

int store_volume_set_token_hash(hutch_store *st, const char *id, const uint8_t hash[32],
                                hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_VOL_SET_HASH,
                           "UPDATE volumes SET token_hash = ?2 WHERE id = ?1", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(s, 2, hash, 32, SQLITE_TRANSIENT);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "recording a volume's token");
}
