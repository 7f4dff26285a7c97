/* SPDX-License-Identifier: Apache-2.0 */
/* Template records: id, optional alias (unique), owner team (0 = public). */
#include <string.h>

#include "store/store-internal.h"

int store_template_upsert(hutch_store *st, const store_template *t, hutch_error *err) {
        int r = store_check_text(t->id, sizeof t->id, false, "template id", err);
        if (r >= 0)
                r = store_check_text(t->alias, sizeof t->alias, true, "template alias", err);
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        r = store_stmt(st, STMT_TEMPLATE_UPSERT,
                       "INSERT INTO templates (id, alias, created_ms, team_id) VALUES (?1, ?2, ?3, ?4)"
                       " ON CONFLICT (id) DO UPDATE SET alias = excluded.alias,"
                       " created_ms = excluded.created_ms, team_id = excluded.team_id",
                       &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, t->id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, t->alias);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 3, t->created_ms);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 4, t->team_id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "storing template");
        if (r == -EEXIST)
                return hutch_error_set(err, r, "template alias \"%s\" belongs to another template",
                                       t->alias);
        return r;
}

int store_template_find(hutch_store *st, const char *id_or_alias, store_template *ret,
                        hutch_error *err) {
        if (!id_or_alias || !id_or_alias[0])
                return hutch_error_set(err, -ENOENT, "no template id");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        /* an id wins over another template's alias of the same spelling */
        int r = store_stmt(st, STMT_TEMPLATE_FIND,
                           "SELECT id, alias, created_ms, team_id FROM templates"
                           " WHERE id = ?1 OR alias = ?1 ORDER BY id = ?1 DESC LIMIT 1",
                           &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id_or_alias);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_row(st, s, err, "finding template");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "no template %.64s", id_or_alias);
        store_template t = {
                .created_ms = sqlite3_column_int64(s, 2),
                .team_id = sqlite3_column_int64(s, 3),
        };
        r = store_column_copy(st, s, 0, t.id, sizeof t.id, err);
        if (r >= 0)
                r = store_column_copy(st, s, 1, t.alias, sizeof t.alias, err);
        if (r < 0)
                return r;
        *ret = t;
        return 0;
}
