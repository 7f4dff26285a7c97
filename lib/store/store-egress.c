/* SPDX-License-Identifier: Apache-2.0 */
/* The egress log: one row per connection a sandbox made through its proxy. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store-internal.h"

#define FIELD_MAX 1024

static int bind_cut(sqlite3_stmt *s, int idx, const char *v) {
        if (!v)
                v = "";
        size_t n = strnlen(v, FIELD_MAX);
        return sqlite3_bind_text(s, idx, v, (int) n, SQLITE_TRANSIENT);
}

int store_egress_add(hutch_store *st, const store_egress *e, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_EGRESS_ADD,
                           "INSERT INTO egress_log (sandbox_id, team_id, ts_ms, kind, method, host, port, address,"
                           " allowed, reason, rule, error, bytes_out, bytes_in, duration_ms, suppressed, injected)"
                           " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                           &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, e->sandbox_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, e->team_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 3, e->ts_ms);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 4, e->kind);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 5, e->method);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 6, e->host);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(s, 7, e->port);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 8, e->address);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(s, 9, e->allowed ? 1 : 0);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 10, e->reason);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 11, e->rule);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 12, e->error);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 13, e->bytes_out);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 14, e->bytes_in);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 15, e->duration_ms);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 16, e->suppressed);
        if (rc == SQLITE_OK)
                rc = bind_cut(s, 17, e->injected);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "recording an egress decision");
}

static char *col_dup(sqlite3_stmt *s, int i) {
        const unsigned char *t = sqlite3_column_text(s, i);
        return strdup(t ? (const char *) t : "");
}

void store_egress_array_free(store_egress *v, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(v[i].kind);
                free(v[i].method);
                free(v[i].host);
                free(v[i].address);
                free(v[i].reason);
                free(v[i].rule);
                free(v[i].error);
                free(v[i].injected);
        }
        free(v);
}

int store_egress_list(hutch_store *st, const char *sandbox_id, int64_t after_id, unsigned limit,
                      store_egress **ret, size_t *ret_n, hutch_error *err) {
        if (limit < 1 || limit > 1000)
                return hutch_error_set(err, -EINVAL, "limit must be 1..1000");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_EGRESS_LIST,
                           "SELECT id, sandbox_id, team_id, ts_ms, kind, method, host, port, address, allowed,"
                           " reason, rule, error, bytes_out, bytes_in, duration_ms, suppressed, injected"
                           " FROM egress_log WHERE sandbox_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
                           &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, sandbox_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, after_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(s, 3, (int) limit);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        store_egress *v = calloc(limit, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t n = 0;
        for (;;) {
                r = store_step_row(st, s, err, "listing egress decisions");
                if (r < 0) {
                        store_egress_array_free(v, n);
                        return r;
                }
                if (r == 0 || n == limit)
                        break;
                store_egress *e = &v[n];
                e->id = sqlite3_column_int64(s, 0);
                const unsigned char *sid = sqlite3_column_text(s, 1);
                snprintf(e->sandbox_id, sizeof e->sandbox_id, "%s", sid ? (const char *) sid : "");
                e->team_id = sqlite3_column_int64(s, 2);
                e->ts_ms = sqlite3_column_int64(s, 3);
                e->kind = col_dup(s, 4);
                e->method = col_dup(s, 5);
                e->host = col_dup(s, 6);
                e->port = sqlite3_column_int(s, 7);
                e->address = col_dup(s, 8);
                e->allowed = sqlite3_column_int(s, 9) != 0;
                e->reason = col_dup(s, 10);
                e->rule = col_dup(s, 11);
                e->error = col_dup(s, 12);
                e->bytes_out = sqlite3_column_int64(s, 13);
                e->bytes_in = sqlite3_column_int64(s, 14);
                e->duration_ms = sqlite3_column_int64(s, 15);
                e->suppressed = sqlite3_column_int64(s, 16);
                e->injected = col_dup(s, 17);
                n++;
                if (!e->kind || !e->method || !e->host || !e->address || !e->reason || !e->rule || !e->error || !e->injected) {
                        store_egress_array_free(v, n);
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
        }
        *ret = v;
        *ret_n = n;
        return 0;
}
