/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The audit trail (docs/audit.md): an append-only, hash-chained log of
 * security-relevant events in the store's database (tables audit_log and
 * audit_checkpoints, store migration 8), with Ed25519-signed checkpoints.
 *
 * Record i carries hash_i = SHA-256(hash_{i-1} || seq || ts || team ||
 * sandbox || kind || detail) (record_hash() below has the exact encoding);
 * a checkpoint signs (n, ts, seq, hash_seq, pruned_seq, hash_pruned_seq)
 * with the key in DATA_DIR/audit.key, and the newest checkpoint is also
 * written to DATA_DIR/audit.head, so that a database cut back to an older
 * state is told from one that never had more.
 *
 * One writer: the daemon. Others (the CLI's `hutch key`) write the store's
 * events table, which the writer folds into the chain at its next flush,
 * as it folds the egress log.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "hutch/hutch.h"
#include "store/store.h"

#define AUDIT_KIND_MAX 64
#define AUDIT_SANDBOX_MAX 64

typedef struct audit_log audit_log;

/* The writer. Loads DATA_DIR/audit.key, creating it (0600) when absent. */
int audit_open(hutch_store *st, const char *data_dir, audit_log **ret, hutch_error *err);
void audit_close(audit_log *a);

/* Queue one record (copied; ts_ms 0 = now). detail_json must be a JSON
 * object (NULL: {}). Written by the next audit_flush(). -ENOMEM only. */
int audit_append(audit_log *a, int64_t ts_ms, int64_t team, const char *sandbox, const char *kind,
                 const char *detail_json);
size_t audit_queued(const audit_log *a);
/* The last flush folded as many store records as one transaction takes:
 * more are waiting (flush again soon). */
bool audit_fold_pending(const audit_log *a);

/* Write what is queued, after folding in the store's new events and egress
 * records, in one transaction. Returns the number of records written; on
 * an error (a CLI holding the write lock) nothing is lost: the queue stays
 * for the next call. */
int audit_flush(audit_log *a, hutch_error *err);

/* Flush, then sign a checkpoint of the chain's head (none when nothing was
 * written since the last one, unless force). */
int audit_checkpoint(audit_log *a, bool force, hutch_error *err);

/* Retention: remove the signed records older than before_ms and sign a
 * checkpoint saying where the chain now starts. Returns the number removed. */
int64_t audit_prune(audit_log *a, int64_t before_ms, hutch_error *err);

/* What the previous writer left: whether it stopped cleanly (its last
 * records are daemon.stop and the checkpoint after it), the chain's last
 * sequence number and the last signed one. */
typedef struct audit_start_state {
        bool empty, clean;
        int64_t last_seq, signed_seq;
} audit_start_state;
void audit_start_state_get(const audit_log *a, audit_start_state *ret);

/* ----------------------------------------------------------- reading */

/* Filters of `hutch audit export` and GET /events (client bytes: fuzzed,
 * fuzz/fuzz-audit-filter.c). */
typedef struct audit_filter {
        int64_t since_ms, until_ms; /* ts in [since, until); 0 = open */
        int64_t team;               /* -1 = any */
        char sandbox[AUDIT_SANDBOX_MAX];
        char kind[AUDIT_KIND_MAX]; /* a kind ("process.start") or prefix ending in '.' ("process.") */
        int64_t after_seq;         /* records after this one (paging) */
        unsigned limit;            /* 0 = no limit */
} audit_filter;

void audit_filter_init(audit_filter *f);
/* One key=value: since, until (RFC 3339, unix ms, or a duration back from
 * now_ms such as "1h"), team (an id), sandbox, kind, after, limit (1..max_limit). */
int audit_filter_set(audit_filter *f, const char *key, const char *value, int64_t now_ms,
                     unsigned max_limit, hutch_error *err);
/* A time as above: 0 and *ret, or -EINVAL. */
int audit_time_parse(const char *s, int64_t now_ms, int64_t *ret);

typedef struct audit_record {
        int64_t seq, ts_ms, team;
        const char *sandbox, *kind, *detail; /* valid during the callback */
        uint8_t prev[32], hash[32];
} audit_record;

/* Records matching f, by seq; cb returns < 0 to stop (returned). */
int audit_query(hutch_store *st, const audit_filter *f, int (*cb)(void *arg, const audit_record *r),
                void *arg, hutch_error *err);

/* Verification (`hutch audit verify`): problems are reported through
 * problem(), one call each, with the sequence number or checkpoint they
 * are about; the result sums what was seen. pubkey_pem NULL: the key's
 * public half from DATA_DIR/audit.key. Returns the number of problems
 * (0: intact), or < 0 when verification could not run. */
typedef struct audit_verify_result {
        int64_t records, first_seq, last_seq;
        int64_t checkpoints, signed_seq, signed_ts_ms, pruned_seq;
        int64_t unsigned_records; /* after the last checkpoint, not counting its own record */
        bool head_checked;        /* audit.head was there and compared */
} audit_verify_result;
int audit_verify(hutch_store *st, const char *data_dir, const char *pubkey_pem,
                 void (*problem)(void *arg, int64_t seq, const char *msg), void *arg,
                 audit_verify_result *ret, hutch_error *err);

/* The public key as PEM (SubjectPublicKeyInfo), from DATA_DIR/audit.key.
 * Free with free(). */
int audit_pubkey_pem(const char *data_dir, char **ret, hutch_error *err);

/* JSON of a record: {"seq","ts","time","team","sandbox","kind","detail","hash"}. */
char *audit_record_json(const audit_record *r);
/* CSV of a record: seq,time,team,sandbox,kind,detail,hash (RFC 4180 quoting). */
void audit_record_csv(FILE *f, const audit_record *r);
void audit_csv_header(FILE *f);
