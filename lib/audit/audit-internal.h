/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by lib/audit's files: the encodings that are hashed and signed. */
#pragma once

#include <openssl/evp.h>
#include <sqlite3.h>

#include "audit/audit.h"

#define AUDIT_CKPT_MSG_LEN 121

typedef struct audit_checkpoint_row {
        int64_t n, ts_ms, seq, pruned_seq;
        uint8_t hash[32], pruned_hash[32], sig[64];
} audit_checkpoint_row;

int64_t audit_now_ms(void);
/* SHA-256("hutch-audit-v1" || prev || be64 seq || be64 ts || be64 team ||
 * be64 len || sandbox || be64 len || kind || be64 len || detail). */
int audit_record_hash(const uint8_t prev[32], int64_t seq, int64_t ts_ms, int64_t team,
                      const char *sandbox, const char *kind, const char *detail, uint8_t out[32]);
/* "hutch-audit-checkpoint-v1" || be64 n || be64 ts || be64 seq || hash ||
 * be64 pruned_seq || pruned_hash: what a checkpoint's signature covers. */
size_t audit_checkpoint_message(const audit_checkpoint_row *c, uint8_t out[AUDIT_CKPT_MSG_LEN]);
int audit_key_load(const char *data_dir, bool create, EVP_PKEY **ret, hutch_error *err);
bool audit_sig_ok(EVP_PKEY *k, const uint8_t *msg, size_t len, const uint8_t *sig, size_t sl);
void audit_hex(const uint8_t *b, size_t n, char *out); /* out: 2n+1 */

int audit_db_fail(sqlite3 *db, hutch_error *err, const char *what);
int audit_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **ret, hutch_error *err);
void audit_finalizep(sqlite3_stmt **s);
