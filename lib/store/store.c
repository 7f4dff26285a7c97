/* SPDX-License-Identifier: Apache-2.0 */
/* Opening the database, the schema and its migrations, the statement cache,
 * error mapping, the master secret and the event log. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "store/store-internal.h"
#include "util/clock.h"

/* The migrations, oldest first; migrations[i] takes the schema from version i
 * to i + 1. Append only: a released migration is never edited.
 *
 * JSON columns are checked to hold objects; json_valid() guards json_type(),
 * which raises an error on malformed text instead of returning NULL. */
#define JSON_OBJECT_CHECK(col)                                                                     \
        "CHECK (CASE WHEN json_valid(" col ") THEN json_type(" col ") = 'object' ELSE 0 END)"

static const char *const migrations[] = {
        /* 1: teams, keys, sandboxes, templates, events, meta */
        "CREATE TABLE meta ("
        "  key TEXT PRIMARY KEY NOT NULL,"
        "  value BLOB NOT NULL"
        ") WITHOUT ROWID;"

        "CREATE TABLE teams ("
        "  id INTEGER PRIMARY KEY,"
        "  name TEXT NOT NULL UNIQUE CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 127),"
        "  created_ms INTEGER NOT NULL"
        ");"

        /* AUTOINCREMENT: a revoked key's id is never handed out again */
        "CREATE TABLE api_keys ("
        "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
        "  team_id INTEGER NOT NULL REFERENCES teams(id),"
        "  hash BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),"
        "  prefix TEXT NOT NULL,"
        "  label TEXT NOT NULL DEFAULT '' CHECK (length(CAST(label AS BLOB)) <= 127),"
        "  created_ms INTEGER NOT NULL,"
        "  last_used_ms INTEGER NOT NULL DEFAULT 0,"
        "  revoked_ms INTEGER NOT NULL DEFAULT 0"
        ");"
        "CREATE INDEX api_keys_team ON api_keys(team_id);"

        "CREATE TABLE sandboxes ("
        "  id TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 20),"
        "  team_id INTEGER NOT NULL REFERENCES teams(id),"
        "  template_id TEXT NOT NULL,"
        "  alias TEXT NOT NULL DEFAULT '',"
        "  state INTEGER NOT NULL CHECK (state IN (1, 2, 3)),"
        "  started_ms INTEGER NOT NULL,"
        "  end_ms INTEGER NOT NULL DEFAULT 0,"
        "  ended_ms INTEGER NOT NULL DEFAULT 0,"
        "  metadata_json TEXT NOT NULL DEFAULT '{}' " JSON_OBJECT_CHECK(
                "metadata_json") ","
                                 "  env_json TEXT NOT NULL DEFAULT '{}' " JSON_OBJECT_CHECK(
                                         "env_json") ","
                                                     "  extra_json TEXT NOT NULL DEFAULT '{}' " JSON_OBJECT_CHECK(
                                                             "extra_json") ","
                                                                           "  cpu_count INTEGER NOT NULL DEFAULT 0,"
                                                                           "  memory_mb INTEGER NOT NULL DEFAULT 0,"
                                                                           "  disk_mb INTEGER NOT NULL DEFAULT 0,"
                                                                           "  token_nonce TEXT NOT NULL DEFAULT '',"
                                                                           "  token_hash TEXT NOT NULL DEFAULT '',"
                                                                           "  end_reason TEXT NOT NULL DEFAULT ''"
                                                                           ") WITHOUT ROWID;"
                                                                           /* partial indexes: the queries say "state <> 3" to use them */
                                                                           "CREATE INDEX sandboxes_live ON sandboxes(started_ms) WHERE state <> 3;"
                                                                           "CREATE INDEX sandboxes_team_live ON sandboxes(team_id) WHERE state <> 3;"

                                                                           "CREATE TABLE templates ("
                                                                           "  id TEXT PRIMARY KEY NOT NULL CHECK (id <> ''),"
                                                                           "  alias TEXT NOT NULL DEFAULT '',"
                                                                           "  created_ms INTEGER NOT NULL,"
                                                                           "  team_id INTEGER NOT NULL DEFAULT 0" /* 0 = public, so no foreign key */
                                                                           ") WITHOUT ROWID;"
                                                                           "CREATE UNIQUE INDEX templates_alias ON templates(alias) WHERE alias <> '';"

                                                                           /* AUTOINCREMENT: ids only grow, for the audit chain built on them */
                                                                           "CREATE TABLE events ("
                                                                           "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
                                                                           "  ts_ms INTEGER NOT NULL,"
                                                                           "  team_id INTEGER NOT NULL DEFAULT 0,"
                                                                           "  sandbox_id TEXT,"
                                                                           "  kind TEXT NOT NULL CHECK (kind <> ''),"
                                                                           "  detail_json TEXT NOT NULL DEFAULT '{}' " JSON_OBJECT_CHECK(
                                                                                   "detail_json") ");"
                                                                                                  "CREATE INDEX events_sandbox ON events(sandbox_id) WHERE sandbox_id IS NOT NULL;",

        /* 2: the egress proxy's decisions, one row per connection */
        "CREATE TABLE egress_log ("
        "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
        "  sandbox_id TEXT NOT NULL,"
        "  team_id INTEGER NOT NULL DEFAULT 0,"
        "  ts_ms INTEGER NOT NULL,"
        "  kind TEXT NOT NULL,"
        "  method TEXT NOT NULL DEFAULT '',"
        "  host TEXT NOT NULL DEFAULT '',"
        "  port INTEGER NOT NULL DEFAULT 0,"
        "  address TEXT NOT NULL DEFAULT '',"
        "  allowed INTEGER NOT NULL CHECK (allowed IN (0, 1)),"
        "  reason TEXT NOT NULL DEFAULT '',"
        "  rule TEXT NOT NULL DEFAULT '',"
        "  error TEXT NOT NULL DEFAULT '',"
        "  bytes_out INTEGER NOT NULL DEFAULT 0,"
        "  bytes_in INTEGER NOT NULL DEFAULT 0,"
        "  duration_ms INTEGER NOT NULL DEFAULT 0,"
        "  suppressed INTEGER NOT NULL DEFAULT 0,"
        "  injected TEXT NOT NULL DEFAULT ''"
        ");"
        "CREATE INDEX egress_log_sandbox ON egress_log(sandbox_id, id);",

        /* 3: secrets, encrypted with a per-team key derived from the master
         * secret (store-secret.c); the value column is nonce || ciphertext ||
         * tag, and a deleted secret keeps its row (names stay unique among
         * live ones) without its value */
        "CREATE TABLE secrets ("
        "  id TEXT PRIMARY KEY NOT NULL,"
        "  team_id INTEGER NOT NULL REFERENCES teams(id),"
        "  name TEXT NOT NULL CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 128),"
        "  version INTEGER NOT NULL DEFAULT 1,"
        "  value BLOB,"
        "  hosts_json TEXT NOT NULL DEFAULT '[]',"
        "  metadata_json TEXT NOT NULL DEFAULT '{}' " JSON_OBJECT_CHECK("metadata_json") ","
        "  created_ms INTEGER NOT NULL,"
        "  updated_ms INTEGER NOT NULL,"
        "  deleted_ms INTEGER NOT NULL DEFAULT 0"
        ") WITHOUT ROWID;"
        "CREATE UNIQUE INDEX secrets_team_name ON secrets(team_id, name) WHERE deleted_ms = 0;",

        /* 4: snapshots (the sealed files live in DATA_DIR/snapshots) */
        "CREATE TABLE snapshots ("
        "  id TEXT PRIMARY KEY NOT NULL,"
        "  team_id INTEGER NOT NULL REFERENCES teams(id),"
        "  sandbox_id TEXT NOT NULL,"
        "  name TEXT NOT NULL DEFAULT '',"
        "  template_id TEXT NOT NULL,"
        "  disk_mb INTEGER NOT NULL,"
        "  bytes INTEGER NOT NULL,"
        "  created_ms INTEGER NOT NULL"
        ") WITHOUT ROWID;"
        "CREATE INDEX snapshots_team ON snapshots(team_id, created_ms);",

        /* 5: retention and unanswered creates. A create's row is marked
         * unanswered until its 201 has been sent (a restart removes the
         * sandboxes whose create never was); the indexes let the pruning of
         * ended rows, old events and old egress records find them without
         * scanning the tables (store_prune) */
        "ALTER TABLE sandboxes ADD COLUMN unanswered INTEGER NOT NULL DEFAULT 0 CHECK (unanswered IN (0, 1));"
        "CREATE INDEX sandboxes_ended ON sandboxes(ended_ms) WHERE state = 3;"
        "CREATE INDEX events_ts ON events(ts_ms);"
        "CREATE INDEX egress_log_ts ON egress_log(ts_ms);"
        "CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id);",

        /* 6: volumes (the ext4 images live in DATA_DIR/volumes). A delete
         * marks the row deleting (no new mount, no content access) before
         * the image goes, then removes it; names are unique per team among
         * the live ones. token_hash: SHA-256 of the content-plane token */
        "CREATE TABLE volumes ("
        "  id TEXT PRIMARY KEY NOT NULL CHECK (length(id) = 36),"
        "  team_id INTEGER NOT NULL REFERENCES teams(id),"
        "  name TEXT NOT NULL CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 128),"
        "  size_bytes INTEGER NOT NULL CHECK (size_bytes > 0),"
        "  created_ms INTEGER NOT NULL,"
        "  deleting_ms INTEGER NOT NULL DEFAULT 0,"
        "  token_hash BLOB CHECK (token_hash IS NULL OR length(token_hash) = 32)"
        ") WITHOUT ROWID;"
        "CREATE UNIQUE INDEX volumes_team_name ON volumes(team_id, name) WHERE deleting_ms = 0;",
        /* 7: template builds (store-build.c). A built template is a team's
         * alias; each build request is a row, its log lines are rows in
         * order, and a tag names the ready build it points at. The COPY
         * archives and the layers are files under DATA_DIR/builds. */
        "CREATE TABLE build_templates ("
        "  id TEXT PRIMARY KEY NOT NULL,"
        "  team_id INTEGER NOT NULL REFERENCES teams(id),"
        "  alias TEXT NOT NULL CHECK (length(alias) BETWEEN 1 AND 128),"
        "  created_ms INTEGER NOT NULL,"
        "  UNIQUE (team_id, alias)"
        ") WITHOUT ROWID;"
        "CREATE TABLE builds ("
        "  id TEXT PRIMARY KEY NOT NULL,"
        "  template_id TEXT NOT NULL,"
        "  team_id INTEGER NOT NULL,"
        "  status TEXT NOT NULL CHECK (status IN ('waiting', 'building', 'ready', 'error')),"
        "  triggered INTEGER NOT NULL DEFAULT 0,"
        "  tags_json TEXT NOT NULL DEFAULT '[]',"
        "  reason TEXT NOT NULL DEFAULT '',"
        "  reason_step TEXT NOT NULL DEFAULT '',"
        "  result_json TEXT NOT NULL DEFAULT '{}',"
        "  cpu_count INTEGER NOT NULL DEFAULT 0,"
        "  memory_mb INTEGER NOT NULL DEFAULT 0,"
        "  created_ms INTEGER NOT NULL,"
        "  updated_ms INTEGER NOT NULL"
        ") WITHOUT ROWID;"
        "CREATE INDEX builds_template ON builds(template_id, created_ms);"
        "CREATE TABLE build_logs ("
        "  build_id TEXT NOT NULL,"
        "  seq INTEGER NOT NULL,"
        "  ts_ms INTEGER NOT NULL,"
        "  level INTEGER NOT NULL CHECK (level BETWEEN 0 AND 3),"
        "  step TEXT NOT NULL DEFAULT '',"
        "  message TEXT NOT NULL,"
        "  PRIMARY KEY (build_id, seq)"
        ") WITHOUT ROWID;"
        "CREATE TABLE build_tags ("
        "  template_id TEXT NOT NULL,"
        "  tag TEXT NOT NULL,"
        "  build_id TEXT NOT NULL,"
        "  created_ms INTEGER NOT NULL,"
        "  PRIMARY KEY (template_id, tag)"
        ") WITHOUT ROWID;",

        /* 8: the audit trail (lib/audit/, docs/audit.md): records chained by
         * SHA-256, checkpoints signed with Ed25519, and how far the store's
         * events and egress log have been folded into the chain */
        "CREATE TABLE audit_log ("
        "  seq INTEGER PRIMARY KEY,"
        "  ts_ms INTEGER NOT NULL,"
        "  team_id INTEGER NOT NULL DEFAULT 0,"
        "  sandbox_id TEXT NOT NULL DEFAULT '',"
        "  kind TEXT NOT NULL CHECK (kind <> ''),"
        "  detail TEXT NOT NULL DEFAULT '{}',"
        "  prev BLOB NOT NULL CHECK (length(prev) = 32),"
        "  hash BLOB NOT NULL CHECK (length(hash) = 32)"
        ");"
        "CREATE INDEX audit_log_ts ON audit_log(ts_ms);"
        "CREATE INDEX audit_log_team ON audit_log(team_id, seq);"
        "CREATE INDEX audit_log_sandbox ON audit_log(sandbox_id, seq) WHERE sandbox_id <> '';"
        "CREATE TABLE audit_checkpoints ("
        "  n INTEGER PRIMARY KEY,"
        "  ts_ms INTEGER NOT NULL,"
        "  seq INTEGER NOT NULL,"
        "  hash BLOB NOT NULL,"
        "  pruned_seq INTEGER NOT NULL DEFAULT 0,"
        "  pruned_hash BLOB NOT NULL,"
        "  sig BLOB NOT NULL"
        ");"
        "CREATE TABLE audit_fold ("
        "  id INTEGER PRIMARY KEY CHECK (id = 1),"
        "  events_id INTEGER NOT NULL DEFAULT 0,"
        "  egress_id INTEGER NOT NULL DEFAULT 0"
        ");"
        "INSERT INTO audit_fold (id) VALUES (1);"
        /* the usage ledger (lib/meter/): one row per sandbox, counters as
         * absolute values (cumulative kernel counters, integrals up to
         * updated_ms) so that writing a row again never counts twice */
        "CREATE TABLE usage ("
        "  sandbox_id TEXT PRIMARY KEY NOT NULL,"
        "  team_id INTEGER NOT NULL,"
        "  template_id TEXT NOT NULL DEFAULT '',"
        "  backend TEXT NOT NULL DEFAULT '',"
        "  started_ms INTEGER NOT NULL,"
        "  ended_ms INTEGER NOT NULL DEFAULT 0,"
        "  updated_ms INTEGER NOT NULL,"
        "  cpu_ns INTEGER NOT NULL DEFAULT 0,"
        "  memory_mb INTEGER NOT NULL DEFAULT 0,"
        "  memory_reserved_mib_ms INTEGER NOT NULL DEFAULT 0,"
        "  memory_peak_bytes INTEGER NOT NULL DEFAULT 0,"
        "  disk_kib_ms INTEGER NOT NULL DEFAULT 0,"
        "  disk_peak_bytes INTEGER NOT NULL DEFAULT 0,"
        "  pids_peak INTEGER NOT NULL DEFAULT 0,"
        "  processes INTEGER NOT NULL DEFAULT 0,"
        "  oom_kills INTEGER NOT NULL DEFAULT 0,"
        "  egress_allowed INTEGER NOT NULL DEFAULT 0,"
        "  egress_denied INTEGER NOT NULL DEFAULT 0,"
        "  egress_allowed_out INTEGER NOT NULL DEFAULT 0,"
        "  egress_allowed_in INTEGER NOT NULL DEFAULT 0,"
        "  egress_denied_out INTEGER NOT NULL DEFAULT 0,"
        "  egress_denied_in INTEGER NOT NULL DEFAULT 0"
        ") WITHOUT ROWID;"
        "CREATE INDEX usage_team ON usage(team_id, started_ms);"
        "CREATE INDEX usage_open ON usage(sandbox_id) WHERE ended_ms = 0;",

        /* 9: the storage ledger (lib/meter/storage.c): one row per volume
         * and per snapshot a team holds, its bytes on the host's disk
         * integrated over its life (KiB·ms), kept after the object is
         * deleted, as the usage rows are after their sandbox ends */
        "CREATE TABLE storage_usage ("
        "  kind TEXT NOT NULL CHECK (kind IN ('volume', 'snapshot')),"
        "  object_id TEXT NOT NULL,"
        "  team_id INTEGER NOT NULL,"
        "  name TEXT NOT NULL DEFAULT '',"
        "  started_ms INTEGER NOT NULL,"
        "  ended_ms INTEGER NOT NULL DEFAULT 0,"
        "  updated_ms INTEGER NOT NULL,"
        "  bytes INTEGER NOT NULL DEFAULT 0,"
        "  bytes_peak INTEGER NOT NULL DEFAULT 0,"
        "  kib_ms INTEGER NOT NULL DEFAULT 0,"
        "  PRIMARY KEY (kind, object_id)"
        ") WITHOUT ROWID;"
        "CREATE INDEX storage_usage_team ON storage_usage(team_id, started_ms);",

        /* 10: GPUs in the usage ledger (docs/gpu.md): how many the sandbox
         * held, GPUs × lifetime (ms), and the most GPU memory its processes
         * held, NULL where it was not measured (no NVML) */
        "ALTER TABLE usage ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;"
        "ALTER TABLE usage ADD COLUMN gpu_ms INTEGER NOT NULL DEFAULT 0;"
        "ALTER TABLE usage ADD COLUMN gpu_memory_peak_bytes INTEGER;",

        /* 11: the storage ledger also bills the sealed checkpoint a paused
         * gvisor sandbox is on disk (kind 'checkpoint', the sandbox's id):
         * SQLite changes a CHECK only by making the table again */
        "CREATE TABLE storage_usage_new ("
        "  kind TEXT NOT NULL CHECK (kind IN ('volume', 'snapshot', 'checkpoint')),"
        "  object_id TEXT NOT NULL,"
        "  team_id INTEGER NOT NULL,"
        "  name TEXT NOT NULL DEFAULT '',"
        "  started_ms INTEGER NOT NULL,"
        "  ended_ms INTEGER NOT NULL DEFAULT 0,"
        "  updated_ms INTEGER NOT NULL,"
        "  bytes INTEGER NOT NULL DEFAULT 0,"
        "  bytes_peak INTEGER NOT NULL DEFAULT 0,"
        "  kib_ms INTEGER NOT NULL DEFAULT 0,"
        "  PRIMARY KEY (kind, object_id)"
        ") WITHOUT ROWID;"
        "INSERT INTO storage_usage_new SELECT kind, object_id, team_id, name, started_ms, ended_ms, updated_ms,"
        "  bytes, bytes_peak, kib_ms FROM storage_usage;"
        "DROP TABLE storage_usage;"
        "ALTER TABLE storage_usage_new RENAME TO storage_usage;"
        "CREATE INDEX storage_usage_team ON storage_usage(team_id, started_ms);",
};

int store_schema_version(void) {
        return (int) ELEMENTSOF(migrations);
}

int64_t store_wall_ms(void) {
        return clock_ns(CLOCK_REALTIME) / 1000000;
}

/* ------------------------------------------------------------- helpers */

static int sqlite_to_errno(int rc) {
        switch (rc) {
        case SQLITE_CONSTRAINT_PRIMARYKEY:
        case SQLITE_CONSTRAINT_UNIQUE:
                return -EEXIST;
        case SQLITE_CONSTRAINT_FOREIGNKEY:
                return -ENOENT;
        }
        switch (rc & 0xff) {
        case SQLITE_CONSTRAINT: /* CHECK, NOT NULL */
        case SQLITE_MISMATCH:
        case SQLITE_RANGE:
                return -EINVAL;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
                return -EBUSY;
        case SQLITE_NOMEM:
                return -ENOMEM;
        case SQLITE_FULL:
                return -ENOSPC;
        case SQLITE_READONLY:
                return -EROFS;
        case SQLITE_PERM:
        case SQLITE_AUTH:
                return -EACCES;
        case SQLITE_TOOBIG:
                return -E2BIG;
        default:
                return -EIO;
        }
}

int store_fail(hutch_store *st, int rc, hutch_error *err, const char *fmt, ...) {
        char ctx[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx, sizeof ctx, fmt, ap);
        va_end(ap);
        const char *msg = st && st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc);
        return hutch_error_set(err, sqlite_to_errno(rc), "%s: %s", ctx, msg);
}

int store_stmt(hutch_store *st, enum store_stmt id, const char *sql, sqlite3_stmt **ret,
               hutch_error *err) {
        int r = store_tx_check(st, err);
        if (r < 0)
                return r;
        if (!st->stmts[id]) {
                int rc = sqlite3_prepare_v3(st->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                                            &st->stmts[id], NULL);
                if (rc != SQLITE_OK) {
                        st->stmts[id] = NULL;
                        return store_fail(st, rc, err, "preparing statement %d", (int) id);
                }
        }
        *ret = st->stmts[id];
        return 0;
}

void store_stmt_resetp(sqlite3_stmt **s) {
        if (!*s)
                return;
        /* reset's return repeats the last step's error, already reported */
        (void) sqlite3_reset(*s);
        (void) sqlite3_clear_bindings(*s);
}

int store_step_done(hutch_store *st, sqlite3_stmt *s, hutch_error *err, const char *what) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_DONE)
                return 0;
        if (rc == SQLITE_ROW)
                return hutch_error_set(err, -EIO, "%s: unexpected row", what);
        return store_fail(st, rc, err, "%s", what);
}

int store_step_row(hutch_store *st, sqlite3_stmt *s, hutch_error *err, const char *what) {
        int rc = sqlite3_step(s);
        if (rc == SQLITE_ROW)
                return 1;
        if (rc == SQLITE_DONE)
                return 0;
        return store_fail(st, rc, err, "%s", what);
}

int store_bind_text(sqlite3_stmt *s, int idx, const char *v) {
        if (!v)
                return sqlite3_bind_null(s, idx);
        return sqlite3_bind_text(s, idx, v, -1, SQLITE_STATIC);
}

int store_column_copy(hutch_store *st, sqlite3_stmt *s, int col, char *dst, size_t size,
                      hutch_error *err) {
        const unsigned char *v = sqlite3_column_text(s, col);
        if (!v) {
                if (sqlite3_errcode(st->db) == SQLITE_NOMEM)
                        return hutch_error_set(err, -ENOMEM, "reading column %d: out of memory", col);
                dst[0] = 0; /* SQL NULL */
                return 0;
        }
        size_t n = (size_t) sqlite3_column_bytes(s, col);
        if (n >= size)
                return hutch_error_set(err, -EIO, "column %s holds %zu bytes, more than %zu",
                                       sqlite3_column_name(s, col), n, size - 1);
        memcpy(dst, v, n);
        dst[n] = 0;
        return 0;
}

int store_check_text(const char *v, size_t size, bool optional, const char *what, hutch_error *err) {
        if (!v || !v[0]) {
                if (optional)
                        return 0;
                return hutch_error_set(err, -EINVAL, "%s is empty", what);
        }
        if (strnlen(v, size) >= size)
                return hutch_error_set(err, -EINVAL, "%s is longer than %zu bytes", what, size - 1);
        return 0;
}

static int store_exec(hutch_store *st, const char *sql, hutch_error *err, const char *what) {
        int rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "%s", what);
        return 0;
}

/* A failed statement inside a transaction may leave it open (or SQLite may
 * have rolled it back already): ROLLBACK only when one is still open. */
static void rollback_open(hutch_store *st) {
        if (!sqlite3_get_autocommit(st->db))
                (void) sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
}

/* ------------------------------------------------------- transactions */

int store_begin(hutch_store *st, hutch_error *err) {
        if (st->tx_depth > 0) {
                st->tx_depth++;
                return 0;
        }
        int rc = sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "starting a transaction");
        st->tx_depth = 1;
        st->tx_doomed = false;
        return 0;
}

int store_commit(hutch_store *st, hutch_error *err) {
        if (st->tx_depth == 0)
                return hutch_error_set(err, -EINVAL, "committing: no transaction open");
        if (--st->tx_depth > 0)
                return 0;
        if (st->tx_doomed || sqlite3_get_autocommit(st->db)) {
                rollback_open(st);
                return hutch_error_set(err, -EIO, "committing: the transaction was rolled back");
        }
        int rc = sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL);
        if (rc == SQLITE_OK)
                return 0;
        int r = store_fail(st, rc, err, "committing");
        rollback_open(st); /* a COMMIT that failed (SQLITE_BUSY) leaves it open */
        return r;
}

void store_rollback(hutch_store *st) {
        if (st->tx_depth == 0)
                return;
        if (--st->tx_depth > 0) {
                st->tx_doomed = true;
                return;
        }
        rollback_open(st);
}

/* Inside store_begin(), a transaction that SQLite rolled back on its own
 * must not let the next statements commit one by one. */
int store_tx_check(hutch_store *st, hutch_error *err) {
        if (st->tx_depth > 0 && sqlite3_get_autocommit(st->db))
                return hutch_error_set(err, -EIO, "the transaction was rolled back");
        return 0;
}

int store_stmt_extern(hutch_store *st, const char *sql, sqlite3_stmt **ret, hutch_error *err) {
        int r = store_tx_check(st, err);
        if (r < 0)
                return r;
        size_t i = 0;
        for (; i < ELEMENTSOF(st->extern_stmts) && st->extern_stmts[i].sql; i++)
                if (st->extern_stmts[i].sql == sql) {
                        *ret = st->extern_stmts[i].stmt;
                        return 0;
                }
        if (i == ELEMENTSOF(st->extern_stmts))
                return hutch_error_set(err, -ENOSPC, "no slot for another kept statement");
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v3(st->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, NULL);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "preparing a statement");
        st->extern_stmts[i].sql = sql;
        st->extern_stmts[i].stmt = s;
        *ret = s;
        return 0;
}

/* ---------------------------------------------------------- migrations */

static int schema_version_read(hutch_store *st, int64_t *ret, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SCHEMA_VERSION, "SELECT version FROM schema_version", &s, err);
        if (r < 0)
                return r;
        r = store_step_row(st, s, err, "reading the schema version");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -EIO, "schema_version has no row");
        *ret = sqlite3_column_int64(s, 0);
        return 0;
}

static int schema_version_write(hutch_store *st, int64_t version, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SCHEMA_VERSION_SET, "UPDATE schema_version SET version = ?1",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, version);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "recording the schema version");
}

static int store_migrate(hutch_store *st, hutch_error *err) {
        int64_t version = 0;
        int r = store_exec(st,
                           "BEGIN IMMEDIATE;"
                           "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);"
                           "INSERT INTO schema_version (version)"
                           "  SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version);"
                           "COMMIT;",
                           err, "creating schema_version");
        if (r < 0) {
                rollback_open(st);
                return r;
        }

        for (size_t i = 0; i < ELEMENTSOF(migrations); i++) {
                r = store_exec(st, "BEGIN IMMEDIATE", err, "starting a migration");
                if (r < 0)
                        return r;
                /* read inside the write transaction: another process opening
                 * the same file may have migrated it since */
                r = schema_version_read(st, &version, err);
                if (r < 0)
                        goto fail;
                if (version > (int64_t) ELEMENTSOF(migrations)) {
                        r = hutch_error_set(err, -EPROTO,
                                            "database schema version %lld is newer than this hutch "
                                            "(%zu); refusing to open it",
                                            (long long) version, ELEMENTSOF(migrations));
                        goto fail;
                }
                if (version < 0) {
                        r = hutch_error_set(err, -EIO, "bad schema version %lld",
                                            (long long) version);
                        goto fail;
                }
                if (version > (int64_t) i) {
                        rollback_open(st);
                        continue;
                }
                r = store_exec(st, migrations[i], err, "applying migration");
                if (r < 0) {
                        hutch_error_wrap(err, r, "schema migration %zu", i + 1);
                        goto fail;
                }
                r = schema_version_write(st, (int64_t) i + 1, err);
                if (r < 0)
                        goto fail;
                r = store_exec(st, "COMMIT", err, "committing a migration");
                if (r < 0)
                        goto fail;
        }
        return 0;
fail:
        rollback_open(st);
        return r;
}

/* ------------------------------------------------------ master secret */

static int master_secret_load(hutch_store *st, hutch_error *err) {
        for (int attempt = 0; attempt < 2; attempt++) {
                {
                        _cleanup_stmt_ sqlite3_stmt *s = NULL;
                        int r = store_stmt(st, STMT_META_GET,
                                           "SELECT value FROM meta WHERE key = ?1", &s, err);
                        if (r < 0)
                                return r;
                        int rc = store_bind_text(s, 1, "master_secret");
                        if (rc != SQLITE_OK)
                                return store_fail(st, rc, err, "binding");
                        r = store_step_row(st, s, err, "reading the master secret");
                        if (r < 0)
                                return r;
                        if (r > 0) {
                                if (sqlite3_column_type(s, 0) != SQLITE_BLOB ||
                                    sqlite3_column_bytes(s, 0) != (int) sizeof st->master)
                                        return hutch_error_set(err, -EIO,
                                                               "the master secret in the database "
                                                               "is not %zu bytes",
                                                               sizeof st->master);
                                memcpy(st->master, sqlite3_column_blob(s, 0), sizeof st->master);
                                return 0;
                        }
                }

                /* First open. OR IGNORE: a second process racing us keeps
                 * whichever secret was written first, and both read it back. */
                uint8_t fresh[32];
                if (RAND_bytes(fresh, sizeof fresh) != 1)
                        return hutch_error_set(err, -EIO, "RAND_bytes failed");
                _cleanup_stmt_ sqlite3_stmt *s = NULL;
                int r = store_stmt(st, STMT_META_INSERT,
                                   "INSERT OR IGNORE INTO meta (key, value) VALUES (?1, ?2)", &s,
                                   err);
                if (r < 0) {
                        OPENSSL_cleanse(fresh, sizeof fresh);
                        return r;
                }
                int rc = store_bind_text(s, 1, "master_secret");
                if (rc == SQLITE_OK)
                        rc = sqlite3_bind_blob(s, 2, fresh, sizeof fresh, SQLITE_TRANSIENT);
                OPENSSL_cleanse(fresh, sizeof fresh);
                if (rc != SQLITE_OK)
                        return store_fail(st, rc, err, "binding");
                r = store_step_done(st, s, err, "storing the master secret");
                if (r < 0)
                        return r;
        }
        return hutch_error_set(err, -EIO, "the master secret vanished after it was written");
}

int store_master_secret(hutch_store *st, uint8_t ret[32], hutch_error *err) {
        if (!st)
                return hutch_error_set(err, -EINVAL, "no store");
        memcpy(ret, st->master, sizeof st->master);
        return 0;
}

/* ------------------------------------------------------------- events */

int store_event_add(hutch_store *st, int64_t team_id, const char *sandbox_id, const char *kind,
                    const char *detail_json, hutch_error *err) {
        int r = store_check_text(kind, 64, false, "event kind", err);
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        r = store_stmt(st, STMT_EVENT_ADD,
                       "INSERT INTO events (ts_ms, team_id, sandbox_id, kind, detail_json)"
                       " VALUES (?1, ?2, ?3, ?4, ?5)",
                       &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, store_wall_ms());
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 3, sandbox_id && sandbox_id[0] ? sandbox_id : NULL);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 4, kind);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 5, detail_json ? detail_json : "{}");
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        return store_step_done(st, s, err, "recording event");
}

sqlite3 *store_sqlite(hutch_store *st) {
        return st ? st->db : NULL;
}

/* --------------------------------------------------------- open/close */

/* Create the file ourselves so that it is born 0600 whatever the umask, and
 * narrow a pre-existing one: it holds key hashes and the master secret.
 * The fd is closed before SQLite opens the file, since closing any fd of a
 * file drops every POSIX lock the process holds on it (SQLite's included). */
static int db_file_prepare(const char *path, hutch_error *err) {
        _cleanup_close_ int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC,
                                      0600);
        if (fd < 0)
                return hutch_error_set(err, negative_errno(), "opening %s: %m", path);
        struct stat sb;
        if (fstat(fd, &sb) < 0)
                return hutch_error_set(err, negative_errno(), "stat %s: %m", path);
        if (!S_ISREG(sb.st_mode))
                return hutch_error_set(err, -EINVAL, "%s is not a regular file", path);
        if ((sb.st_mode & 07777) != 0600 && fchmod(fd, 0600) < 0)
                return hutch_error_set(err, negative_errno(), "chmod %s: %m", path);
        return 0;
}

/* SQLite creates -wal and -shm with the database's mode; narrow ones left
 * from an older run. By path, not by an fd of our own (see above). */
static int db_side_files_narrow(const char *path, hutch_error *err) {
        static const char *const suffixes[] = { "-wal", "-shm" };
        for (size_t i = 0; i < ELEMENTSOF(suffixes); i++) {
                char p[4096];
                if ((size_t) snprintf(p, sizeof p, "%s%s", path, suffixes[i]) >= sizeof p)
                        return hutch_error_set(err, -ENAMETOOLONG, "%s: path too long", path);
                struct stat sb;
                if (lstat(p, &sb) < 0) {
                        if (errno == ENOENT)
                                continue;
                        return hutch_error_set(err, negative_errno(), "stat %s: %m", p);
                }
                if (!S_ISREG(sb.st_mode))
                        return hutch_error_set(err, -EINVAL, "%s is not a regular file", p);
                if ((sb.st_mode & 07777) != 0600 && chmod(p, 0600) < 0)
                        return hutch_error_set(err, negative_errno(), "chmod %s: %m", p);
        }
        return 0;
}

static int pragma_text(hutch_store *st, const char *sql, char *ret, size_t size, hutch_error *err) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "%s", sql);
        int r = store_step_row(st, s, err, sql);
        if (r == 0)
                r = hutch_error_set(err, -EIO, "%s: no result", sql);
        if (r > 0) {
                const unsigned char *v = sqlite3_column_text(s, 0);
                snprintf(ret, size, "%s", v ? (const char *) v : "");
                r = 0;
        }
        (void) sqlite3_finalize(s);
        return r;
}

static int store_configure(hutch_store *st, hutch_error *err) {
        int rc = sqlite3_extended_result_codes(st->db, 1);
        if (rc == SQLITE_OK)
                rc = sqlite3_busy_timeout(st->db, STORE_BUSY_TIMEOUT_MS);
        /* Defensive: no writable_schema or other ways to corrupt the file
         * through SQL, should a statement ever be steered. */
        if (rc == SQLITE_OK)
                rc = sqlite3_db_config(st->db, SQLITE_DBCONFIG_DEFENSIVE, 1, NULL);
        /* A misspelt "column" must be an error, not a string literal. */
        if (rc == SQLITE_OK)
                rc = sqlite3_db_config(st->db, SQLITE_DBCONFIG_DQS_DML, 0, NULL);
        if (rc == SQLITE_OK)
                rc = sqlite3_db_config(st->db, SQLITE_DBCONFIG_DQS_DDL, 0, NULL);
        /* The schema's CHECKs call json_valid()/json_type(), which SQLite does
         * not mark innocuous, so a build whose trusted_schema defaults to off
         * would refuse every write. Trusting it costs nothing here: the file
         * is ours (0600) and no application functions are registered. */
        if (rc == SQLITE_OK)
                rc = sqlite3_db_config(st->db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 1, NULL);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "configuring the connection");

        char mode[16];
        int r = pragma_text(st, "PRAGMA journal_mode = WAL", mode, sizeof mode, err);
        if (r < 0)
                return r;
        if (strcmp(mode, "wal") != 0)
                return hutch_error_set(err, -EIO, "the database refused WAL mode (got \"%s\")", mode);

        /* NORMAL in WAL mode never corrupts the file; a power cut may lose the
         * last commits, and takes the sandboxes they describe with it. */
        r = store_exec(st, "PRAGMA synchronous = NORMAL", err, "setting synchronous");
        if (r < 0)
                return r;
        r = store_exec(st, "PRAGMA foreign_keys = ON", err, "enabling foreign keys");
        if (r < 0)
                return r;
        char fk[8];
        r = pragma_text(st, "PRAGMA foreign_keys", fk, sizeof fk, err);
        if (r < 0)
                return r;
        if (strcmp(fk, "1") != 0)
                return hutch_error_set(err, -EIO, "this SQLite cannot enforce foreign keys");
        return 0;
}

void store_close(hutch_store *st) {
        if (!st)
                return;
        for (size_t i = 0; i < ELEMENTSOF(st->stmts); i++)
                (void) sqlite3_finalize(st->stmts[i]); /* NULL is a no-op */
        for (size_t i = 0; i < ELEMENTSOF(st->extern_stmts); i++)
                (void) sqlite3_finalize(st->extern_stmts[i].stmt);
        /* v2: a statement we failed to finalize cannot leak the handle */
        (void) sqlite3_close_v2(st->db);
        OPENSSL_cleanse(st->master, sizeof st->master);
        OPENSSL_cleanse(st->secrets_key, sizeof st->secrets_key);
        free(st);
}

static void store_closep(hutch_store **st) {
        store_close(*st);
}

int store_open(const char *path, hutch_store **ret, hutch_error *err) {
        if (!path || !path[0])
                return hutch_error_set(err, -EINVAL, "no database path");
        int r = db_file_prepare(path, err);
        if (r < 0)
                return r;

        _cleanup_(store_closep) hutch_store *st = calloc(1, sizeof *st);
        if (!st)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        int rc = sqlite3_open_v2(
                path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_EXRESCODE,
                NULL);
        if (rc != SQLITE_OK) {
                if (!st->db)
                        return hutch_error_set(err, -ENOMEM, "opening %s: out of memory", path);
                return store_fail(st, rc, err, "opening %s", path);
        }

        r = store_configure(st, err);
        if (r < 0)
                return hutch_error_wrap(err, r, "%s", path);
        r = store_migrate(st, err);
        if (r < 0)
                return hutch_error_wrap(err, r, "%s", path);
        r = master_secret_load(st, err);
        if (r < 0)
                return hutch_error_wrap(err, r, "%s", path);
        r = db_side_files_narrow(path, err);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(st);
        return 0;
}
