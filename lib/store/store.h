/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The store: hutch's one SQLite database (DATA_DIR/hutch.db, WAL). This is the
 * only code that talks to SQLite (docs/style.md: one owner per resource).
 *
 * Conventions as in hutch.h: >= 0 on success, a negative errno on failure with
 * SQLite's message in err; ret_* are written only on success. Errors map as
 * -ENOENT (no such row, or a foreign key to a missing team), -EEXIST (a unique
 * or primary key clash), -EINVAL (a value the schema refuses: bad state, JSON
 * that is not an object, over-long text), -EBUSY (locked past the busy
 * timeout), -ENOMEM, -ENOSPC, -EROFS, and -EIO for the rest.
 *
 * One thread: a hutch_store is used by the thread that opened it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct hutch_store hutch_store;

/* ----------------------------------------------------------------- open */

/* Open (create) the database at path: mode 0600 (enforced on the file and its
 * -wal/-shm), WAL, foreign keys on, busy timeout, schema migrations (table
 * schema_version; each migration in its own transaction). A database written
 * by a newer hutch (schema version above this code's) is refused with -EPROTO. */
int store_open(const char *path, hutch_store **ret, hutch_error *err);
void store_close(hutch_store *st); /* accepts NULL */

/* Schema version this code migrates to (addition, for tests and `hutch info`). */
int store_schema_version(void);

/* ------------------------------------------------------- teams and keys */

/* An API key: "e2b_" + 40 lowercase hex digits from RAND_bytes. Only
 * SHA-256(key) is stored, plus the first STORE_KEY_PREFIX_LEN characters so
 * that a listing can tell keys apart. */
#define STORE_KEY_LEN 44
#define STORE_KEY_PREFIX_LEN 12
#define STORE_NAME_MAX 127 /* team names and key labels, in bytes */

/* -EEXIST if a team has that name; -EINVAL for an empty or over-long name. */
int store_team_create(hutch_store *st, const char *name, int64_t *ret_team_id, hutch_error *err);
int store_team_find(hutch_store *st, const char *name, int64_t *ret_team_id,
                    hutch_error *err); /* -ENOENT */
int store_team_count(hutch_store *st, int64_t *ret, hutch_error *err);

/* label may be NULL. -ENOENT for an unknown team. ret_key is NUL-terminated. */
int store_key_create(hutch_store *st, int64_t team_id, const char *label, char ret_key[45],
                     int64_t *ret_key_id, hutch_error *err);
/* -ENOENT for unknown or revoked keys, and for any string that is not a
 * well-formed key (NULL included). Also updates last_used (at most once a
 * minute; best effort: a failure to record it does not fail the lookup). */
int store_key_lookup(hutch_store *st, const char *key, int64_t *ret_team_id, hutch_error *err);
/* The same, and the key's id (for the audit trail). */
int store_key_lookup_id(hutch_store *st, const char *key, int64_t *ret_team_id, int64_t *ret_key_id,
                        hutch_error *err);

typedef struct store_key_info {
        int64_t id, team_id;
        char team[128];
        char prefix[16];
        char label[128];
        int64_t created_ms, last_used_ms, revoked_ms; /* unix ms; 0 = never */
} store_key_info;
/* Every key, revoked ones included, by id. Free *ret with free(); with no
 * keys *ret is NULL and *ret_n 0. */
int store_key_list(hutch_store *st, store_key_info **ret, size_t *ret_n, hutch_error *err);
/* -ENOENT for an unknown key id. Revoking a revoked key succeeds and keeps
 * the first revocation time. */
int store_key_revoke(hutch_store *st, int64_t key_id, hutch_error *err);

/* ------------------------------------------------------------ sandboxes */

enum { STORE_SBX_RUNNING = 1, STORE_SBX_PAUSED = 2, STORE_SBX_KILLED = 3 };

typedef struct store_sandbox {
        char id[21];
        int64_t team_id;
        char template_id[64];
        char alias[64];
        int state;                            /* STORE_SBX_* */
        int64_t started_ms, end_ms, ended_ms; /* unix ms; ended_ms 0 while live */
        char *metadata_json;                  /* JSON object text (heap), never NULL after get */
        char *env_json;                       /* JSON object text (heap) */
        char *extra_json; /* JSON object text (heap): lifecycle, network, anything else the daemon keeps */
        int64_t cpu_count, memory_mb, disk_mb;
        char token_nonce[33]; /* hex nonce the envd access token is derived from */
        char token_hash[65];  /* hex SHA-256 of the token */
        char end_reason[32];  /* "killed", "timeout", "lost", ... */
        bool unanswered;      /* its create's answer has not been sent yet */
} store_sandbox;

void store_sandbox_clear(store_sandbox *s); /* frees the heap strings; accepts NULL */

/* The JSON fields may be NULL ("{}" is stored); each must otherwise be a JSON
 * object (-EINVAL). -EEXIST for an id in use (ended sandboxes included),
 * -ENOENT for an unknown team, -EINVAL for an empty id or a bad state. */
int store_sandbox_insert(hutch_store *st, const store_sandbox *s, hutch_error *err);
/* Any sandbox, ended ones included. *ret is overwritten (not freed first);
 * release it with store_sandbox_clear(). */
int store_sandbox_get(hutch_store *st, const char *id, store_sandbox *ret,
                      hutch_error *err); /* -ENOENT */
/* Only for live sandboxes: -ENOENT for an unknown or ended one. Setting
 * STORE_SBX_KILLED is store_sandbox_end(id, now, "killed"). */
int store_sandbox_set_state(hutch_store *st, const char *id, int state, hutch_error *err);
int store_sandbox_set_end(hutch_store *st, const char *id, int64_t end_ms, hutch_error *err);
/* State KILLED, ended_ms and end_reason (NULL: "killed"). Returns 1 when this
 * call ended the sandbox, 0 when it had ended already (the first end time and
 * reason are kept); -ENOENT for an unknown id. */
int store_sandbox_end(hutch_store *st, const char *id, int64_t ended_ms, const char *reason,
                      hutch_error *err);
/* Clear the unanswered mark of rows inserted with it (their create's answer
 * is on its way), or set it again (it never left); several ids in one
 * transaction. -ENOENT for one unknown id (with several, unknown ones are
 * skipped). */
int store_sandbox_set_answered(hutch_store *st, const char *const *ids, size_t n, bool answered,
                               hutch_error *err);
/* Any sandbox, ended ones included; extra_json NULL stores "{}". */
int store_sandbox_set_extra(hutch_store *st, const char *id, const char *extra_json,
                            hutch_error *err);
/* Live (running or paused) sandboxes, in started order; for restart
 * re-adoption. Free with store_sandbox_array_free(). */
int store_sandbox_list_live(hutch_store *st, store_sandbox **ret, size_t *ret_n, hutch_error *err);
void store_sandbox_array_free(store_sandbox *v, size_t n);
/* Live sandboxes of one team; team_id 0 counts every team's. */
int store_sandbox_count_live(hutch_store *st, int64_t team_id, int64_t *ret, hutch_error *err);

/* --------------------------------------------------------------- secrets */

/* A random 32-byte master secret kept in the database's meta table, created on
 * first open; the daemon derives envd tokens from it
 * (HMAC-SHA256(master, "envd-token:" id ":" nonce)). */
int store_master_secret(hutch_store *st, uint8_t ret[32], hutch_error *err);

/* ------------------------------------------------------------- templates */

typedef struct store_template {
        char id[64];
        char alias[64]; /* "" = none; unique among templates */
        int64_t created_ms;
        int64_t team_id; /* 0 = public */
} store_template;

/* Insert, or replace every field of the template with that id. -EEXIST when
 * the alias belongs to another template; -EINVAL for an empty id. */
int store_template_upsert(hutch_store *st, const store_template *t, hutch_error *err);
/* By id first, then by alias. */
int store_template_find(hutch_store *st, const char *id_or_alias, store_template *ret,
                        hutch_error *err); /* -ENOENT */

/* ---------------------------------------------------------------- events */

/* Append a lifecycle event (ts_ms = now, unix ms). team_id 0 and sandbox_id
 * NULL mean none; kind is 1..63 bytes ("sandbox.created"); detail_json NULL
 * stores "{}", otherwise it must be a JSON object (-EINVAL). Event ids only
 * grow (an audit chain will build on them). */
int store_event_add(hutch_store *st, int64_t team_id, const char *sandbox_id, const char *kind,
                    const char *detail_json, hutch_error *err);

/* ---------------------------------------------------------- transactions */

/* One transaction for several of the functions here: between store_begin()
 * and store_commit() they write into it instead of committing each on its
 * own, and store_rollback() undoes all of them. Nesting-safe: an inner
 * begin/commit pair only counts a level, and the outermost commit is the one
 * that commits; an inner rollback dooms the whole, whose outermost commit
 * then rolls back and fails with -EIO (and the outermost rollback rolls back
 * at once). Statements run while SQLite itself has rolled the transaction
 * back (SQLITE_FULL, an I/O error) fail with -EIO rather than commit on
 * their own. The caller pairs every successful store_begin() with exactly
 * one store_commit() or store_rollback(); a failed store_begin() opened
 * nothing. */
int store_begin(hutch_store *st, hutch_error *err);
int store_commit(hutch_store *st, hutch_error *err);
void store_rollback(hutch_store *st);

/* A statement prepared once and kept until store_close(), for lib/meter/,
 * which writes its own tables through this connection. sql must be a string
 * literal (its address is the key; at most 4 of them); the caller resets the
 * statement after use (sqlite3_reset, sqlite3_clear_bindings). Inside a
 * store_begin() whose transaction SQLite rolled back it fails with -EIO. */
typedef struct sqlite3_stmt sqlite3_stmt;
int store_stmt_extern(hutch_store *st, const char *sql, sqlite3_stmt **ret, hutch_error *err);

/* The connection itself, for lib/audit/, whose tables (migration 8) live in
 * this file so that a record and the change it describes share a commit. */
typedef struct sqlite3 sqlite3;
sqlite3 *store_sqlite(hutch_store *st);

/* ------------------------------------------------------------- retention */

/* What one store_prune() call deleted. */
typedef struct store_prune_counts {
        int64_t sandboxes, events, egress;
} store_prune_counts;

/* Delete at most limit rows of each kind older than before_ms (unix ms):
 * rows of sandboxes that ended before it (not those a snapshot was taken
 * from, whose rows stay while the snapshot does), events recorded before it
 * (not those of a live sandbox), and egress records of connections accepted
 * before it. Live sandboxes' rows are never deleted. Each kind is one short
 * transaction, so a caller on an event loop calls it again while it returns
 * a positive total (the rows it deleted) and stops at 0. */
int store_prune(hutch_store *st, int64_t before_ms, unsigned limit, store_prune_counts *ret, hutch_error *err);
/* Checkpoint the WAL into the database and truncate it to zero bytes.
 * Never waits for another connection: -EBUSY when one is reading or
 * writing (the next call does it). */
int store_checkpoint(hutch_store *st, hutch_error *err);

/* ------------------------------------------------------------ egress log */

/* One connection through a sandbox's egress proxy (lib/egress/proxy.h's
 * egress_record, as stored). Strings are owned by the row. */
typedef struct store_egress {
        int64_t id;
        char sandbox_id[21];
        int64_t team_id;
        int64_t ts_ms; /* when the connection was accepted, unix ms */
        char *kind, *method, *host, *address, *reason, *rule, *error;
        int port;
        bool allowed;
        int64_t bytes_out, bytes_in, duration_ms, suppressed;
        char *injected; /* secrets and rules applied, comma-separated, or "" */
} store_egress;

/* Strings longer than 1 KiB are cut. */
int store_egress_add(hutch_store *st, const store_egress *e, hutch_error *err);
/* The sandbox's records with id > after_id, oldest first, at most limit
 * (1..1000). */
int store_egress_list(hutch_store *st, const char *sandbox_id, int64_t after_id, unsigned limit,
                      store_egress **ret, size_t *ret_n, hutch_error *err);
void store_egress_array_free(store_egress *v, size_t n);

/* --------------------------------------------------------------- secrets */

/* The key secrets are encrypted with (32 bytes): kept in a file of its own
 * in the data dir, so that the database alone does not reveal them. Until it
 * is set, every secret call fails with -ENOKEY. */
void store_set_secrets_key(hutch_store *st, const uint8_t key[32]);

/* A team's secret, without its value. Names are 1..128 bytes, lowercase,
 * unique among the team's live secrets; ids are "sec_" + 20 [a-z0-9]. */
typedef struct store_secret {
        char id[32];
        int64_t team_id;
        char *name;
        int64_t version;
        char *hosts_json;    /* JSON array of host rules the value may be sent to */
        char *metadata_json; /* JSON object of strings */
        int64_t created_ms, updated_ms;
} store_secret;

#define STORE_SECRET_VALUE_MAX 65536

/* -EEXIST when the team has a live secret of that name. The value is
 * encrypted (AES-256-GCM, a key derived from the master secret and the team,
 * the id and version bound as associated data) before it is stored. */
int store_secret_create(hutch_store *st, int64_t team_id, const char *name, const void *value, size_t len,
                        const char *hosts_json, const char *metadata_json, store_secret *ret, hutch_error *err);
/* By id, or by name. -ENOENT for a missing or deleted one, or another team's. */
int store_secret_get(hutch_store *st, int64_t team_id, const char *id_or_name, store_secret *ret,
                     hutch_error *err);
/* A new version of the value; metadata_json / hosts_json NULL: unchanged. */
int store_secret_update(hutch_store *st, int64_t team_id, const char *id_or_name, const void *value, size_t len,
                        const char *hosts_json, const char *metadata_json, store_secret *ret, hutch_error *err);
int store_secret_delete(hutch_store *st, int64_t team_id, const char *id_or_name, hutch_error *err);
/* Live secrets of the team by name, names > after (NULL: from the start),
 * at most limit (1..1000). */
int store_secret_list(hutch_store *st, int64_t team_id, const char *after, unsigned limit, store_secret **ret,
                      size_t *ret_n, hutch_error *err);
/* The decrypted current value (malloc'ed, NUL-terminated for convenience;
 * the caller wipes and frees it). -ENOENT, -EBADMSG when it does not
 * authenticate. */
int store_secret_value(hutch_store *st, int64_t team_id, const char *name, char **ret, size_t *ret_len,
                       hutch_error *err);
/* The same for a secret already looked up (store_secret_get). */
int store_secret_value_of(hutch_store *st, const store_secret *meta, char **ret, size_t *ret_len,
                          hutch_error *err);
void store_secret_clear(store_secret *s);
void store_secret_array_free(store_secret *v, size_t n);

/* ------------------------------------------------------------- snapshots */

typedef struct store_snapshot {
        char id[32];          /* "snap_" + 20 [a-z0-9] */
        int64_t team_id;
        char sandbox_id[21];  /* the sandbox it was taken from */
        char name[129];       /* "" when none was given */
        char template_id[64];
        int64_t disk_mb, bytes, created_ms;
} store_snapshot;

int store_snapshot_insert(hutch_store *st, const store_snapshot *s, hutch_error *err);
/* The team's snapshot by id; -ENOENT otherwise. */
int store_snapshot_get(hutch_store *st, int64_t team_id, const char *id, store_snapshot *ret, hutch_error *err);
int store_snapshot_delete(hutch_store *st, int64_t team_id, const char *id, hutch_error *err);
/* By id whatever the team (the start-up sweep). */
int store_snapshot_find(hutch_store *st, const char *id, store_snapshot *ret, hutch_error *err);
int store_snapshot_count(hutch_store *st, int64_t team_id, int64_t *ret, hutch_error *err);
/* How many snapshots (of every team) were taken from sandboxes of that template. */
int store_snapshot_count_template(hutch_store *st, const char *template_id, int64_t *ret, hutch_error *err);
/* Delete the rows whose file dir/<id>.seal is gone; returns how many. */
int store_snapshot_prune_missing(hutch_store *st, const char *dir);
/* The team's snapshots, newest first, optionally of one sandbox and/or with
 * one name, created before (before_ms, before_id) for paging; at most limit. */
int store_snapshot_list(hutch_store *st, int64_t team_id, const char *sandbox_id, const char *name, int64_t before_ms,
                        const char *before_id, unsigned limit, store_snapshot **ret, size_t *ret_n, hutch_error *err);

/* --------------------------------------------------------------- volumes */

typedef struct store_volume {
        char id[37];          /* UUIDv4 */
        int64_t team_id;
        char name[129];
        int64_t size_bytes, created_ms;
        int64_t deleting_ms;  /* 0: live */
        uint8_t token_hash[32];
        bool has_token_hash;
} store_volume;

/* -EEXIST when the team has a live volume of that name. */
int store_volume_insert(hutch_store *st, const store_volume *v, hutch_error *err);
/* A live volume by id (team_id < 0: any team's), or by name in a team. -ENOENT otherwise. */
int store_volume_get(hutch_store *st, int64_t team_id, const char *id, store_volume *ret, hutch_error *err);
int store_volume_find(hutch_store *st, int64_t team_id, const char *name, store_volume *ret, hutch_error *err);
/* The team's live volumes, oldest first (at most 10000). */
int store_volume_list(hutch_store *st, int64_t team_id, store_volume **ret, size_t *ret_n, hutch_error *err);
/* Mark a live volume deleting; -ENOENT if there is none. */
int store_volume_set_deleting(hutch_store *st, int64_t team_id, const char *id, hutch_error *err);
int store_volume_delete(hutch_store *st, const char *id, hutch_error *err);
/* Rows marked deleting (a delete cut short by a crash: finish it). */
int store_volume_list_deleting(hutch_store *st, store_volume **ret, size_t *ret_n, hutch_error *err);
int store_volume_set_token_hash(hutch_store *st, const char *id, const uint8_t hash[32], hutch_error *err);
/* ------------------------------------------------------ template builds */
/* store-build.c: templates built through the E2B build API (docs/templates.md
 * "Building"). */

typedef struct store_build {
        char id[40];           /* a UUID */
        char template_id[32];
        int64_t team_id;
        char status[12];       /* waiting | building | ready | error */
        bool triggered;        /* POST /v2/templates/{id}/builds/{bid} came */
        char *tags_json;       /* the tags it takes when ready: ["default", ...] */
        char *reason;          /* "" unless failed */
        char reason_step[16];
        char *result_json;     /* ready: {"layer","user","workdir","env","startCmd","readyCmd"} */
        int64_t cpu_count, memory_mb; /* the build sandbox's, as requested; 0: the daemon's */
        int64_t created_ms, updated_ms;
} store_build;
void store_build_clear(store_build *b);

typedef struct store_build_log {
        int64_t ts_ms;
        int level;             /* 0 debug, 1 info, 2 warn, 3 error */
        char step[16];
        char *message;
} store_build_log;
void store_build_log_array_free(store_build_log *v, size_t n);

typedef struct store_build_tag {
        char tag[129];
        char build_id[40];
        int64_t created_ms;
} store_build_tag;

typedef struct store_build_template {
        char id[32];
        int64_t team_id;
        char alias[129];
        int64_t created_ms;
} store_build_template;

/* The team's name (the namespace of its templates). */
int store_team_name(hutch_store *st, int64_t team_id, char *ret, size_t n, hutch_error *err);
int store_btemplate_create(hutch_store *st, const store_build_template *t, hutch_error *err);
/* By id (any team; the caller checks the team) or by the team's alias; -ENOENT. */
int store_btemplate_get(hutch_store *st, const char *id, store_build_template *ret, hutch_error *err);
int store_btemplate_find(hutch_store *st, int64_t team_id, const char *alias, store_build_template *ret,
                         hutch_error *err);
/* By alias in any team: whether it exists for someone else (403 vs 404). */
int store_btemplate_alias_exists(hutch_store *st, const char *alias, hutch_error *err);
int store_btemplate_list(hutch_store *st, int64_t team_id, store_build_template **ret, size_t *ret_n,
                         hutch_error *err);
/* The template with its builds, logs and tags. */
int store_btemplate_delete(hutch_store *st, const char *id, hutch_error *err);

int store_build_insert(hutch_store *st, const store_build *b, hutch_error *err);
int store_build_get(hutch_store *st, const char *id, store_build *ret, hutch_error *err);
/* status and, when not NULL, the reason, its step and the result. */
int store_build_set(hutch_store *st, const char *id, const char *status, const char *reason, const char *step,
                    const char *result_json, hutch_error *err);
int store_build_set_triggered(hutch_store *st, const char *id, hutch_error *err);
/* Fail the template's other builds still waiting untriggered: superseded. */
int store_build_supersede(hutch_store *st, const char *template_id, const char *except_id, hutch_error *err);
/* At start-up: builds a previous daemon left waiting-triggered or building
 * failed ("the daemon stopped during the build"); returns how many. */
int store_build_fail_unfinished(hutch_store *st, hutch_error *err);
/* Append log line number seq (0, 1, ...: the writer counts; the build's
 * one writer is the daemon's job for it). */
int store_build_log_add(hutch_store *st, const char *build_id, int64_t seq, int64_t ts_ms, int level,
                        const char *step, const char *message, hutch_error *err);
/* The lines at level >= min_level, from the offset-th of those, at most limit. */
int store_build_logs(hutch_store *st, const char *build_id, int min_level, int64_t offset, unsigned limit,
                     store_build_log **ret, size_t *ret_n, hutch_error *err);
int store_build_tag_set(hutch_store *st, const char *template_id, const char *tag, const char *build_id,
                        hutch_error *err);
/* -ENOENT when the tag is not set. */
int store_build_tag_get(hutch_store *st, const char *template_id, const char *tag, char ret_build[40],
                        hutch_error *err);
int store_build_tag_delete(hutch_store *st, const char *template_id, const char *tag, hutch_error *err);
int store_build_tags(hutch_store *st, const char *template_id, store_build_tag **ret, size_t *ret_n,
                     hutch_error *err);
/* The layers ready builds' results name (what the step cache must keep): a
 * NULL-terminated malloc'ed array of strings. */
int store_build_ready_layers(hutch_store *st, char ***ret, hutch_error *err);
