/* SPDX-License-Identifier: Apache-2.0 */
/* Template builds (migration 7): built templates, their builds, log lines
 * and tags. Statements are prepared per call: builds are rare next to the
 * sandbox calls that the cache serves. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store-internal.h"

static void finalizep(sqlite3_stmt **s) {
        if (*s)
                sqlite3_finalize(*s);
}
#define _cleanup_fin_ _cleanup_(finalizep)

static int prep(hutch_store *st, const char *sql, sqlite3_stmt **ret, hutch_error *err) {
        int r = store_tx_check(st, err);
        if (r < 0)
                return r;
        int rc = sqlite3_prepare_v2(st->db, sql, -1, ret, NULL);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "preparing a build statement");
        return 0;
}

static void col(sqlite3_stmt *s, int i, char *buf, size_t n) {
        const unsigned char *t = sqlite3_column_text(s, i);
        snprintf(buf, n, "%s", t ? (const char *) t : "");
}

static char *col_dup(sqlite3_stmt *s, int i) {
        const unsigned char *t = sqlite3_column_text(s, i);
        return strdup(t ? (const char *) t : "");
}

/* Bind text parameters 1..n (NULL entries bind NULL). */
static int bind_texts(hutch_store *st, sqlite3_stmt *s, hutch_error *err, size_t n,
                      const char *const *v) {
        for (size_t i = 0; i < n; i++) {
                int rc = store_bind_text(s, (int) i + 1, v[i]);
                if (rc != SQLITE_OK)
                        return store_fail(st, rc, err, "binding");
        }
        return 0;
}
#define BIND(st, s, err, ...)                                                                        \
        bind_texts(st, s, err, sizeof((const char *const[]) { __VA_ARGS__ }) / sizeof(const char *), \
                   (const char *const[]) { __VA_ARGS__ })

static int exec_done(hutch_store *st, const char *sql, hutch_error *err, const char *what, size_t n,
                     const char *const *v) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, sql, &s, err);
        if (r < 0 || (r = bind_texts(st, s, err, n, v)) < 0)
                return r;
        return store_step_done(st, s, err, what);
}
#define EXEC(st, sql, err, what, ...)                                                              \
        exec_done(st, sql, err, what,                                                              \
                  sizeof((const char *const[]) { __VA_ARGS__ }) / sizeof(const char *),            \
                  (const char *const[]) { __VA_ARGS__ })

int store_team_name(hutch_store *st, int64_t team_id, char *ret, size_t n, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, "SELECT name FROM teams WHERE id = ?1", &s, err);
        if (r < 0)
                return r;
        sqlite3_bind_int64(s, 1, team_id);
        if ((r = store_step_row(st, s, err, "reading a team")) < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "team %lld not found", (long long) team_id);
        col(s, 0, ret, n);
        return 0;
}

/* ------------------------------------------------------------ templates */

#define BT_COLUMNS "id, team_id, alias, created_ms"

static void bt_row(sqlite3_stmt *s, store_build_template *t) {
        memset(t, 0, sizeof *t);
        col(s, 0, t->id, sizeof t->id);
        t->team_id = sqlite3_column_int64(s, 1);
        col(s, 2, t->alias, sizeof t->alias);
        t->created_ms = sqlite3_column_int64(s, 3);
}

int store_btemplate_create(hutch_store *st, const store_build_template *t, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, "INSERT INTO build_templates (" BT_COLUMNS ") VALUES (?1, ?2, ?3, ?4)", &s,
                     err);
        if (r < 0)
                return r;
        store_bind_text(s, 1, t->id);
        sqlite3_bind_int64(s, 2, t->team_id);
        store_bind_text(s, 3, t->alias);
        sqlite3_bind_int64(s, 4, t->created_ms);
        return store_step_done(st, s, err, "recording a template");
}

static int bt_one(hutch_store *st, sqlite3_stmt *s, store_build_template *ret, hutch_error *err,
                  const char *what) {
        int r = store_step_row(st, s, err, "reading a template");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "template '%s' not found", what);
        bt_row(s, ret);
        return 0;
}

int store_btemplate_get(hutch_store *st, const char *id, store_build_template *ret, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, "SELECT " BT_COLUMNS " FROM build_templates WHERE id = ?1", &s, err);
        if (r < 0 || (r = BIND(st, s, err, id)) < 0)
                return r;
        return bt_one(st, s, ret, err, id);
}

int store_btemplate_find(hutch_store *st, int64_t team_id, const char *alias,
                         store_build_template *ret, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "SELECT " BT_COLUMNS " FROM build_templates WHERE team_id = ?2 AND alias = ?1",
                     &s, err);
        if (r < 0 || (r = BIND(st, s, err, alias)) < 0)
                return r;
        sqlite3_bind_int64(s, 2, team_id);
        return bt_one(st, s, ret, err, alias);
}

int store_btemplate_alias_exists(hutch_store *st, const char *alias, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, "SELECT 1 FROM build_templates WHERE alias = ?1 LIMIT 1", &s, err);
        if (r < 0 || (r = BIND(st, s, err, alias)) < 0)
                return r;
        return store_step_row(st, s, err, "looking up an alias");
}

int store_btemplate_list(hutch_store *st, int64_t team_id, store_build_template **ret,
                         size_t *ret_n, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "SELECT " BT_COLUMNS
                     " FROM build_templates WHERE team_id = ?1 ORDER BY created_ms, id",
                     &s, err);
        if (r < 0)
                return r;
        sqlite3_bind_int64(s, 1, team_id);
        store_build_template *v = NULL;
        size_t n = 0;
        while ((r = store_step_row(st, s, err, "listing templates")) == 1) {
                store_build_template *nv = reallocarray(v, n + 1, sizeof *v);
                if (!nv) {
                        free(v);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                v = nv;
                bt_row(s, &v[n++]);
        }
        if (r < 0) {
                free(v);
                return r;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

int store_btemplate_delete(hutch_store *st, const char *id, hutch_error *err) {
        int r = store_begin(st, err);
        if (r < 0)
                return r;
        if ((r = EXEC(st, "DELETE FROM build_logs WHERE build_id IN (SELECT id FROM builds WHERE template_id = ?1)",
                      err, "deleting build logs", id)) >= 0 &&
            (r = EXEC(st, "DELETE FROM build_tags WHERE template_id = ?1", err, "deleting tags",
                      id)) >= 0 &&
            (r = EXEC(st, "DELETE FROM builds WHERE template_id = ?1", err, "deleting builds", id)) >=
                    0 &&
            (r = EXEC(st, "DELETE FROM build_templates WHERE id = ?1", err, "deleting a template",
                      id)) >= 0)
                return store_commit(st, err);
        store_rollback(st);
        return r;
}

/* --------------------------------------------------------------- builds */

#define B_COLUMNS                                                                                                \
        "id, template_id, team_id, status, triggered, tags_json, reason, reason_step, result_json, created_ms, " \
        "updated_ms, cpu_count, memory_mb"

void store_build_clear(store_build *b) {
        free(b->tags_json);
        free(b->reason);
        free(b->result_json);
        memset(b, 0, sizeof *b);
}

int store_build_insert(hutch_store *st, const store_build *b, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "INSERT INTO builds (" B_COLUMNS
                     ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                     &s, err);
        if (r < 0)
                return r;
        store_bind_text(s, 1, b->id);
        store_bind_text(s, 2, b->template_id);
        sqlite3_bind_int64(s, 3, b->team_id);
        store_bind_text(s, 4, b->status);
        sqlite3_bind_int(s, 5, b->triggered);
        store_bind_text(s, 6, b->tags_json ? b->tags_json : "[]");
        store_bind_text(s, 7, b->reason ? b->reason : "");
        store_bind_text(s, 8, b->reason_step);
        store_bind_text(s, 9, b->result_json ? b->result_json : "{}");
        sqlite3_bind_int64(s, 10, b->created_ms);
        sqlite3_bind_int64(s, 11, b->updated_ms);
        sqlite3_bind_int64(s, 12, b->cpu_count);
        sqlite3_bind_int64(s, 13, b->memory_mb);
        return store_step_done(st, s, err, "recording a build");
}

int store_build_get(hutch_store *st, const char *id, store_build *ret, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, "SELECT " B_COLUMNS " FROM builds WHERE id = ?1", &s, err);
        if (r < 0 || (r = BIND(st, s, err, id)) < 0)
                return r;
        if ((r = store_step_row(st, s, err, "reading a build")) < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "build '%s' not found", id);
        store_build b = { 0 };
        col(s, 0, b.id, sizeof b.id);
        col(s, 1, b.template_id, sizeof b.template_id);
        b.team_id = sqlite3_column_int64(s, 2);
        col(s, 3, b.status, sizeof b.status);
        b.triggered = sqlite3_column_int(s, 4) != 0;
        b.tags_json = col_dup(s, 5);
        b.reason = col_dup(s, 6);
        col(s, 7, b.reason_step, sizeof b.reason_step);
        b.result_json = col_dup(s, 8);
        b.created_ms = sqlite3_column_int64(s, 9);
        b.updated_ms = sqlite3_column_int64(s, 10);
        b.cpu_count = sqlite3_column_int64(s, 11);
        b.memory_mb = sqlite3_column_int64(s, 12);
        if (!b.tags_json || !b.reason || !b.result_json) {
                store_build_clear(&b);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        *ret = b;
        return 0;
}

int store_build_set(hutch_store *st, const char *id, const char *status, const char *reason,
                    const char *step, const char *result_json, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(
                st,
                "UPDATE builds SET status = ?2, reason = coalesce(?3, reason), reason_step = coalesce(?4, "
                "reason_step), result_json = coalesce(?5, result_json), updated_ms = ?6 WHERE id = ?1",
                &s, err);
        if (r < 0 || (r = BIND(st, s, err, id, status, reason, step, result_json)) < 0)
                return r;
        sqlite3_bind_int64(s, 6, store_wall_ms());
        return store_step_done(st, s, err, "updating a build");
}

int store_build_set_triggered(hutch_store *st, const char *id, hutch_error *err) {
        return EXEC(st, "UPDATE builds SET triggered = 1 WHERE id = ?1", err, "updating a build", id);
}

int store_build_supersede(hutch_store *st, const char *template_id, const char *except_id,
                          hutch_error *err) {
        return EXEC(
                st,
                "UPDATE builds SET status = 'error', reason = 'The build was canceled because it was superseded "
                "by a newer one.' WHERE template_id = ?1 AND id <> ?2 AND status = 'waiting' AND triggered = 0",
                err, "superseding builds", template_id, except_id);
}

int store_build_fail_unfinished(hutch_store *st, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "UPDATE builds SET status = 'error', reason = 'the daemon stopped during the build' WHERE status "
                     "= 'building' OR (status = 'waiting' AND triggered = 1)",
                     &s, err);
        if (r < 0 || (r = store_step_done(st, s, err, "failing unfinished builds")) < 0)
                return r;
        return sqlite3_changes(st->db);
}

/* ----------------------------------------------------------------- logs */

int store_build_log_add(hutch_store *st, const char *build_id, int64_t seq, int64_t ts_ms,
                        int level, const char *step, const char *message, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "INSERT INTO build_logs (build_id, seq, ts_ms, level, step, message) VALUES (?1, ?2, ?3, ?4, "
                     "?5, ?6)",
                     &s, err);
        if (r < 0)
                return r;
        store_bind_text(s, 1, build_id);
        sqlite3_bind_int64(s, 2, seq);
        sqlite3_bind_int64(s, 3, ts_ms);
        sqlite3_bind_int(s, 4, level < 0 ? 0 : level > 3 ? 3 : level);
        store_bind_text(s, 5, step ? step : "");
        store_bind_text(s, 6, message);
        return store_step_done(st, s, err, "recording a build log line");
}

void store_build_log_array_free(store_build_log *v, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(v[i].message);
        free(v);
}

int store_build_logs(hutch_store *st, const char *build_id, int min_level, int64_t offset,
                     unsigned limit, store_build_log **ret, size_t *ret_n, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "SELECT ts_ms, level, step, message FROM build_logs WHERE build_id = ?1 AND level >= ?2 ORDER "
                     "BY seq LIMIT ?3 OFFSET ?4",
                     &s, err);
        if (r < 0)
                return r;
        store_bind_text(s, 1, build_id);
        sqlite3_bind_int(s, 2, min_level);
        sqlite3_bind_int(s, 3, (int) limit);
        sqlite3_bind_int64(s, 4, offset);
        store_build_log *v = NULL;
        size_t n = 0;
        while ((r = store_step_row(st, s, err, "reading build logs")) == 1) {
                store_build_log *nv = reallocarray(v, n + 1, sizeof *v);
                char *m = col_dup(s, 3);
                if (!nv || !m) {
                        free(m);
                        store_build_log_array_free(nv ? nv : v, n);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                v = nv;
                v[n].ts_ms = sqlite3_column_int64(s, 0);
                v[n].level = sqlite3_column_int(s, 1);
                col(s, 2, v[n].step, sizeof v[n].step);
                v[n].message = m;
                n++;
        }
        if (r < 0) {
                store_build_log_array_free(v, n);
                return r;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

/* ----------------------------------------------------------------- tags */

int store_build_tag_set(hutch_store *st, const char *template_id, const char *tag,
                        const char *build_id, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(
                st,
                "INSERT INTO build_tags (template_id, tag, build_id, created_ms) VALUES (?1, ?2, ?3, ?4) ON "
                "CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, created_ms = "
                "excluded.created_ms",
                &s, err);
        if (r < 0 || (r = BIND(st, s, err, template_id, tag, build_id)) < 0)
                return r;
        sqlite3_bind_int64(s, 4, store_wall_ms());
        return store_step_done(st, s, err, "setting a tag");
}

int store_build_tag_get(hutch_store *st, const char *template_id, const char *tag,
                        char ret_build[40], hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st, "SELECT build_id FROM build_tags WHERE template_id = ?1 AND tag = ?2", &s,
                     err);
        if (r < 0 || (r = BIND(st, s, err, template_id, tag)) < 0)
                return r;
        if ((r = store_step_row(st, s, err, "reading a tag")) < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "tag '%s' does not exist", tag);
        col(s, 0, ret_build, 40);
        return 0;
}

int store_build_tag_delete(hutch_store *st, const char *template_id, const char *tag,
                           hutch_error *err) {
        return EXEC(st, "DELETE FROM build_tags WHERE template_id = ?1 AND tag = ?2", err,
                    "deleting a tag", template_id, tag);
}

int store_build_tags(hutch_store *st, const char *template_id, store_build_tag **ret, size_t *ret_n,
                     hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(
                st,
                "SELECT tag, build_id, created_ms FROM build_tags WHERE template_id = ?1 ORDER BY tag",
                &s, err);
        if (r < 0 || (r = BIND(st, s, err, template_id)) < 0)
                return r;
        store_build_tag *v = NULL;
        size_t n = 0;
        while ((r = store_step_row(st, s, err, "listing tags")) == 1) {
                store_build_tag *nv = reallocarray(v, n + 1, sizeof *v);
                if (!nv) {
                        free(v);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                v = nv;
                col(s, 0, v[n].tag, sizeof v[n].tag);
                col(s, 1, v[n].build_id, sizeof v[n].build_id);
                v[n].created_ms = sqlite3_column_int64(s, 2);
                n++;
        }
        if (r < 0) {
                free(v);
                return r;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

int store_build_ready_layers(hutch_store *st, char ***ret, hutch_error *err) {
        _cleanup_fin_ sqlite3_stmt *s = NULL;
        int r = prep(st,
                     "SELECT DISTINCT json_extract(result_json, '$.layer') FROM builds WHERE status = 'ready' AND "
                     "json_valid(result_json)",
                     &s, err);
        if (r < 0)
                return r;
        size_t n = 0;
        char **v = calloc(1, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        while ((r = store_step_row(st, s, err, "listing build layers")) == 1) {
                const unsigned char *t = sqlite3_column_text(s, 0);
                if (!t)
                        continue;
                char **nv = reallocarray(v, n + 2, sizeof *v);
                char *d = strdup((const char *) t);
                if (!nv || !d) {
                        free(d);
                        v = nv ? nv : v;
                        for (size_t i = 0; i < n; i++)
                                free(v[i]);
                        free(v);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
                v = nv;
                v[n++] = d;
                v[n] = NULL;
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        free(v[i]);
                free(v);
                return r;
        }
        *ret = v;
        return 0;
}
