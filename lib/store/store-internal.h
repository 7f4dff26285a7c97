/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the store's files: the handle, the statement cache, and the
 * helpers that turn SQLite result codes into -errno + message. */
#pragma once

#include <sqlite3.h>
#include <stdbool.h>

#include "store/store.h"
#include "util/macro.h"

/* The daemon is one event loop: a lock held longer than this by another
 * process (a CLI run against the same file) fails the call with -EBUSY
 * rather than stalling every client. */
#define STORE_BUSY_TIMEOUT_MS 2000

/* One slot per cached statement. The SQL sits next to the code that runs it;
 * the slot only names where its prepared form is kept. */
enum store_stmt {
        STMT_SCHEMA_VERSION,
        STMT_SCHEMA_VERSION_SET,
        STMT_META_GET,
        STMT_META_INSERT,
        STMT_TEAM_CREATE,
        STMT_TEAM_FIND,
        STMT_TEAM_COUNT,
        STMT_KEY_CREATE,
        STMT_KEY_LOOKUP,
        STMT_KEY_TOUCH,
        STMT_KEY_LIST,
        STMT_KEY_REVOKE,
        STMT_SBX_INSERT,
        STMT_SBX_GET,
        STMT_SBX_SET_STATE,
        STMT_SBX_SET_END,
        STMT_SBX_END,
        STMT_SBX_EXISTS,
        STMT_SBX_SET_EXTRA,
        STMT_SBX_LIST_LIVE,
        STMT_SBX_COUNT_LIVE,
        STMT_SBX_COUNT_LIVE_ALL,
        STMT_SBX_ANSWERED,
        STMT_PRUNE_SANDBOXES,
        STMT_PRUNE_EVENTS,
        STMT_PRUNE_EGRESS,
        STMT_TEMPLATE_UPSERT,
        STMT_TEMPLATE_FIND,
        STMT_EVENT_ADD,
        STMT_EGRESS_ADD,
        STMT_EGRESS_LIST,
        STMT_SECRET_INSERT,
        STMT_SECRET_GET,
        STMT_SECRET_UPDATE,
        STMT_SECRET_DELETE,
        STMT_SECRET_LIST,
        STMT_SECRET_VALUE,
        STMT_SNAP_INSERT,
        STMT_SNAP_GET,
        STMT_SNAP_DELETE,
        STMT_SNAP_LIST,
        STMT_VOL_INSERT,
        STMT_VOL_GET,
        STMT_VOL_FIND,
        STMT_VOL_LIST,
        STMT_VOL_DELETING,
        STMT_VOL_DELETE,
        STMT_VOL_LIST_DELETING,
        STMT_VOL_SET_HASH,
        _STMT_MAX,
};

struct hutch_store {
        sqlite3 *db;
        sqlite3_stmt *stmts[_STMT_MAX];
        uint8_t master[32];
        uint8_t secrets_key[32]; /* from a file beside the database, never in it */
        bool has_secrets_key;
        unsigned tx_depth; /* store_begin() levels open */
        bool tx_doomed;    /* an inner level rolled back: the outermost commit rolls back */
        struct {
                const char *sql; /* the caller's literal, compared by address */
                sqlite3_stmt *stmt;
        } extern_stmts[4]; /* store_stmt_extern() */
};

/* The cached statement for slot id, prepared from sql on first use. Pair it
 * with _cleanup_stmt_ so that every exit path resets it and drops its
 * bindings (a SELECT left mid-way would hold its read transaction open). */
int store_stmt(hutch_store *st, enum store_stmt id, const char *sql, sqlite3_stmt **ret,
               hutch_error *err);
void store_stmt_resetp(sqlite3_stmt **s);
#define _cleanup_stmt_ _cleanup_(store_stmt_resetp)

/* -EIO inside store_begin() once SQLite has rolled the transaction back on
 * its own (every statement's first step: store_stmt() calls it). */
int store_tx_check(hutch_store *st, hutch_error *err);

/* Record SQLite's failure rc (with sqlite3_errmsg) as "<context>: <msg>" and
 * return the matching -errno. */
int store_fail(hutch_store *st, int rc, hutch_error *err, const char *fmt, ...) _printf_(4, 5);

/* Step a statement that returns no rows; SQLITE_DONE is success. */
int store_step_done(hutch_store *st, sqlite3_stmt *s, hutch_error *err, const char *what);
/* Step once: 1 for a row, 0 for none. */
int store_step_row(hutch_store *st, sqlite3_stmt *s, hutch_error *err, const char *what);

/* Bind a C string as TEXT; NULL binds SQL NULL. The caller keeps the string
 * alive until the statement is reset (SQLITE_STATIC). */
int store_bind_text(sqlite3_stmt *s, int idx, const char *v);

/* Copy a TEXT column into a fixed buffer; -EIO when it does not fit (the
 * writers bound every field, so that is a database edited behind our back). */
int store_column_copy(hutch_store *st, sqlite3_stmt *s, int col, char *dst, size_t size,
                      hutch_error *err);

/* Check a caller's string: present (unless optional), shorter than size. */
int store_check_text(const char *v, size_t size, bool optional, const char *what, hutch_error *err);

/* Wall-clock time, unix milliseconds (stored timestamps; never for deadlines). */
int64_t store_wall_ms(void);
