/* SPDX-License-Identifier: Apache-2.0 */
/* Sandbox records: what a restart needs to re-adopt live sandboxes, and what
 * the API reports about ended ones. An ended sandbox keeps its row (state
 * KILLED, ended_ms, end_reason) until the retention removes it
 * (store-prune.c); ids are 20 random characters, never reused in practice. */
#include <string.h>

#include "store/store-internal.h"

#define SANDBOX_COLUMNS                                                                            \
        "id, team_id, template_id, alias, state, started_ms, end_ms, ended_ms,"                    \
        " metadata_json, env_json, extra_json, cpu_count, memory_mb, disk_mb,"                     \
        " token_nonce, token_hash, end_reason, unanswered"

void store_sandbox_clear(store_sandbox *s) {
        if (!s)
                return;
        free(s->metadata_json);
        free(s->env_json);
        free(s->extra_json);
        s->metadata_json = s->env_json = s->extra_json = NULL;
}

void store_sandbox_array_free(store_sandbox *v, size_t n) {
        if (!v)
                return;
        for (size_t i = 0; i < n; i++)
                store_sandbox_clear(&v[i]);
        free(v);
}

static void store_sandbox_clearp(store_sandbox *s) {
        store_sandbox_clear(s);
}

static int column_json(hutch_store *st, sqlite3_stmt *s, int col, char **ret, hutch_error *err) {
        const unsigned char *v = sqlite3_column_text(s, col);
        if (!v && sqlite3_errcode(st->db) == SQLITE_NOMEM)
                return hutch_error_set(err, -ENOMEM, "reading column %d: out of memory", col);
        char *c = strdup(v ? (const char *) v : "{}");
        if (!c)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        *ret = c;
        return 0;
}

/* One row of SANDBOX_COLUMNS into *ret (written only on success). */
static int sandbox_from_row(hutch_store *st, sqlite3_stmt *s, store_sandbox *ret, hutch_error *err) {
        _cleanup_(store_sandbox_clearp) store_sandbox sb = {
                .team_id = sqlite3_column_int64(s, 1),
                .state = sqlite3_column_int(s, 4),
                .started_ms = sqlite3_column_int64(s, 5),
                .end_ms = sqlite3_column_int64(s, 6),
                .ended_ms = sqlite3_column_int64(s, 7),
                .cpu_count = sqlite3_column_int64(s, 11),
                .memory_mb = sqlite3_column_int64(s, 12),
                .disk_mb = sqlite3_column_int64(s, 13),
                .unanswered = sqlite3_column_int(s, 17) != 0,
        };
        int r = store_column_copy(st, s, 0, sb.id, sizeof sb.id, err);
        if (r >= 0)
                r = store_column_copy(st, s, 2, sb.template_id, sizeof sb.template_id, err);
        if (r >= 0)
                r = store_column_copy(st, s, 3, sb.alias, sizeof sb.alias, err);
        if (r >= 0)
                r = column_json(st, s, 8, &sb.metadata_json, err);
        if (r >= 0)
                r = column_json(st, s, 9, &sb.env_json, err);
        if (r >= 0)
                r = column_json(st, s, 10, &sb.extra_json, err);
        if (r >= 0)
                r = store_column_copy(st, s, 14, sb.token_nonce, sizeof sb.token_nonce, err);
        if (r >= 0)
                r = store_column_copy(st, s, 15, sb.token_hash, sizeof sb.token_hash, err);
        if (r >= 0)
                r = store_column_copy(st, s, 16, sb.end_reason, sizeof sb.end_reason, err);
        if (r < 0)
                return r;
        *ret = sb;
        sb.metadata_json = sb.env_json = sb.extra_json = NULL; /* handed over */
        return 0;
}

static int state_check(int state, hutch_error *err) {
        if (state != STORE_SBX_RUNNING && state != STORE_SBX_PAUSED && state != STORE_SBX_KILLED)
                return hutch_error_set(err, -EINVAL, "bad sandbox state %d", state);
        return 0;
}

int store_sandbox_insert(hutch_store *st, const store_sandbox *s, hutch_error *err) {
        int r = store_check_text(s->id, sizeof s->id, false, "sandbox id", err);
        if (r >= 0)
                r = store_check_text(s->template_id, sizeof s->template_id, true, "template id", err);
        if (r >= 0)
                r = store_check_text(s->alias, sizeof s->alias, true, "template alias", err);
        if (r >= 0)
                r = store_check_text(s->token_nonce, sizeof s->token_nonce, true, "token nonce", err);
        if (r >= 0)
                r = store_check_text(s->token_hash, sizeof s->token_hash, true, "token hash", err);
        if (r >= 0)
                r = store_check_text(s->end_reason, sizeof s->end_reason, true, "end reason", err);
        if (r >= 0)
                r = state_check(s->state, err);
        if (r < 0)
                return r;

        _cleanup_stmt_ sqlite3_stmt *q = NULL;
        r = store_stmt(st, STMT_SBX_INSERT,
                       "INSERT INTO sandboxes (" SANDBOX_COLUMNS ")"
                       " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,"
                       " ?16, ?17, ?18)",
                       &q, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(q, 1, s->id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 2, s->team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 3, s->template_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 4, s->alias);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(q, 5, s->state);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 6, s->started_ms);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 7, s->end_ms);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 8, s->ended_ms);
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 9, s->metadata_json ? s->metadata_json : "{}");
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 10, s->env_json ? s->env_json : "{}");
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 11, s->extra_json ? s->extra_json : "{}");
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 12, s->cpu_count);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 13, s->memory_mb);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 14, s->disk_mb);
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 15, s->token_nonce);
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 16, s->token_hash);
        if (rc == SQLITE_OK)
                rc = store_bind_text(q, 17, s->end_reason);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(q, 18, s->unanswered ? 1 : 0);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, q, err, "inserting sandbox");
        if (r == -EEXIST)
                return hutch_error_set(err, r, "sandbox %s exists already", s->id);
        if (r == -ENOENT)
                return hutch_error_set(err, r, "sandbox %s: no team with id %lld", s->id,
                                       (long long) s->team_id);
        return r;
}

int store_sandbox_get(hutch_store *st, const char *id, store_sandbox *ret, hutch_error *err) {
        if (!id)
                return hutch_error_set(err, -ENOENT, "no sandbox id");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SBX_GET,
                           "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE id = ?1", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_row(st, s, err, "reading sandbox");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "no sandbox %.64s", id);
        return sandbox_from_row(st, s, ret, err);
}

/* 1 if a row with that id exists (live or not), 0 if not. */
static int sandbox_exists(hutch_store *st, const char *id, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SBX_EXISTS, "SELECT 1 FROM sandboxes WHERE id = ?1", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_row(st, s, err, "finding sandbox");
}

/* Run an UPDATE of one live sandbox (bound: ?1 value, ?2 id); -ENOENT when
 * no live row matched. */
static int sandbox_update_live(hutch_store *st, enum store_stmt slot, const char *sql,
                               const char *id, int64_t value, const char *what, hutch_error *err) {
        if (!id)
                return hutch_error_set(err, -ENOENT, "no sandbox id");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, slot, sql, &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, value);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, what);
        if (r < 0)
                return r;
        if (sqlite3_changes(st->db) == 0)
                return hutch_error_set(err, -ENOENT, "no live sandbox %.64s", id);
        return 0;
}

int store_sandbox_set_state(hutch_store *st, const char *id, int state, hutch_error *err) {
        int r = state_check(state, err);
        if (r < 0)
                return r;
        if (state == STORE_SBX_KILLED)
                return store_sandbox_end(st, id, store_wall_ms(), "killed", err);
        return sandbox_update_live(st, STMT_SBX_SET_STATE,
                                   "UPDATE sandboxes SET state = ?1 WHERE id = ?2 AND state <> 3",
                                   id, state, "setting sandbox state", err);
}

int store_sandbox_set_end(hutch_store *st, const char *id, int64_t end_ms, hutch_error *err) {
        return sandbox_update_live(st, STMT_SBX_SET_END,
                                   "UPDATE sandboxes SET end_ms = ?1 WHERE id = ?2 AND state <> 3",
                                   id, end_ms, "setting sandbox end time", err);
}

int store_sandbox_end(hutch_store *st, const char *id, int64_t ended_ms, const char *reason,
                      hutch_error *err) {
        if (!id)
                return hutch_error_set(err, -ENOENT, "no sandbox id");
        if (!reason || !reason[0])
                reason = "killed";
        int r = store_check_text(reason, sizeof((store_sandbox *) NULL)->end_reason, false,
                                 "end reason", err);
        if (r < 0)
                return r;
        {
                _cleanup_stmt_ sqlite3_stmt *s = NULL;
                r = store_stmt(st, STMT_SBX_END,
                               "UPDATE sandboxes SET state = 3, ended_ms = ?1, end_reason = ?2"
                               " WHERE id = ?3 AND state <> 3",
                               &s, err);
                if (r < 0)
                        return r;
                int rc = sqlite3_bind_int64(s, 1, ended_ms);
                if (rc == SQLITE_OK)
                        rc = store_bind_text(s, 2, reason);
                if (rc == SQLITE_OK)
                        rc = store_bind_text(s, 3, id);
                if (rc != SQLITE_OK)
                        return store_fail(st, rc, err, "binding");
                r = store_step_done(st, s, err, "ending sandbox");
                if (r < 0)
                        return r;
                if (sqlite3_changes(st->db) > 0)
                        return 1;
        }
        r = sandbox_exists(st, id, err);
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "no sandbox %.64s", id);
        return 0; /* ended before */
}

static int set_answered_one(hutch_store *st, const char *id, bool answered, hutch_error *err) {
        if (!id)
                return hutch_error_set(err, -ENOENT, "no sandbox id");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SBX_ANSWERED, "UPDATE sandboxes SET unanswered = ?1 WHERE id = ?2", &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int(s, 1, answered ? 0 : 1);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "marking a create answered");
        if (r < 0)
                return r;
        if (sqlite3_changes(st->db) == 0)
                return hutch_error_set(err, -ENOENT, "no sandbox %.64s", id);
        return 0;
}

int store_sandbox_set_answered(hutch_store *st, const char *const *ids, size_t n, bool answered, hutch_error *err) {
        if (n == 1)
                return set_answered_one(st, ids[0], answered, err);
        /* one commit for all: a fork's sandboxes are answered together */
        int r = store_begin(st, err);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n && r >= 0; i++) {
                r = set_answered_one(st, ids[i], answered, err);
                if (r == -ENOENT)
                        r = 0; /* the others still are */
        }
        if (r < 0) {
                store_rollback(st);
                return r;
        }
        return store_commit(st, err);
}

int store_sandbox_set_extra(hutch_store *st, const char *id, const char *extra_json,
                            hutch_error *err) {
        if (!id)
                return hutch_error_set(err, -ENOENT, "no sandbox id");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SBX_SET_EXTRA,
                           "UPDATE sandboxes SET extra_json = ?1 WHERE id = ?2", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, extra_json ? extra_json : "{}");
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "setting sandbox extra");
        if (r < 0)
                return r;
        if (sqlite3_changes(st->db) == 0)
                return hutch_error_set(err, -ENOENT, "no sandbox %.64s", id);
        return 0;
}

int store_sandbox_list_live(hutch_store *st, store_sandbox **ret, size_t *ret_n, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SBX_LIST_LIVE,
                           "SELECT " SANDBOX_COLUMNS " FROM sandboxes WHERE state <> 3"
                           " ORDER BY started_ms, id",
                           &s, err);
        if (r < 0)
                return r;

        store_sandbox *v = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
                r = store_step_row(st, s, err, "listing live sandboxes");
                if (r < 0)
                        goto fail;
                if (r == 0)
                        break;
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        store_sandbox *nv = reallocarray(v, ncap, sizeof *v);
                        if (!nv) {
                                r = hutch_error_set(err, -ENOMEM, "out of memory");
                                goto fail;
                        }
                        v = nv;
                        cap = ncap;
                }
                r = sandbox_from_row(st, s, &v[n], err);
                if (r < 0)
                        goto fail;
                n++;
        }
        *ret = v;
        *ret_n = n;
        return 0;
fail:
        store_sandbox_array_free(v, n);
        return r;
}

int store_sandbox_count_live(hutch_store *st, int64_t team_id, int64_t *ret, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r;
        if (team_id == 0)
                r = store_stmt(st, STMT_SBX_COUNT_LIVE_ALL,
                               "SELECT count(*) FROM sandboxes WHERE state <> 3", &s, err);
        else
                r = store_stmt(st, STMT_SBX_COUNT_LIVE,
                               "SELECT count(*) FROM sandboxes WHERE team_id = ?1 AND state <> 3",
                               &s, err);
        if (r < 0)
                return r;
        if (team_id != 0) {
                int rc = sqlite3_bind_int64(s, 1, team_id);
                if (rc != SQLITE_OK)
                        return store_fail(st, rc, err, "binding");
        }
        r = store_step_row(st, s, err, "counting live sandboxes");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -EIO, "counting live sandboxes: no result");
        *ret = sqlite3_column_int64(s, 0);
        return 0;
}
