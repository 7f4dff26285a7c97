/* SPDX-License-Identifier: Apache-2.0 */
/* What the ledger's two tables (meter.c: sandboxes, storage.c: volumes and
 * snapshots) share: SQLite errors as hutch errors, statement cleanup, and
 * a text column copied out. */
#pragma once

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>

#include "util/error.h"

static inline int meter_fail(sqlite3 *db, hutch_error *err, const char *what) {
        int rc = sqlite3_errcode(db) & 0xff;
        return hutch_error_set(err, rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? -EBUSY : -EIO, "%s: %s", what,
                               sqlite3_errmsg(db));
}

static inline void meter_finalizep(sqlite3_stmt **s) {
        (void) sqlite3_finalize(*s);
}

static inline void meter_text(sqlite3_stmt *s, int col, char *dst, size_t n) {
        const unsigned char *v = sqlite3_column_text(s, col);
        snprintf(dst, n, "%s", v ? (const char *) v : "");
}
