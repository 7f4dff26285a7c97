/* SPDX-License-Identifier: Apache-2.0 */
/* The audit trail's writer: the queue, the chain, checkpoints, retention. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "audit/audit-internal.h"
#include "util/clock.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/macro.h"

typedef struct queued {
        int64_t ts_ms, team;
        char *sandbox, *kind, *detail;
} queued;

struct audit_log {
        hutch_store *st;
        sqlite3 *db;
        EVP_PKEY *key;
        char head_path[PATH_MAX];
        queued *q;
        size_t n, cap;
        int64_t last_seq; /* the chain's head, as committed */
        uint8_t last_hash[32];
        int64_t last_n;     /* newest checkpoint */
        int64_t signed_seq; /* what it covers */
        int64_t pruned_seq;
        uint8_t pruned_hash[32];
        int64_t changes_seen; /* sqlite3_total_changes() at the last fold */
        int64_t version_seen; /* PRAGMA data_version then: other connections' commits */
        bool fold_more;       /* the last fold stopped at FOLD_MAX rows: fold again */
        sqlite3_stmt *data_version;
        sqlite3_stmt *stmts[5]; /* the writer's statements, prepared once (stmt_get) */
        audit_start_state start;
};

int64_t audit_now_ms(void) {
        return clock_ns(CLOCK_REALTIME) / 1000000;
}

static void put_u64(uint8_t *p, uint64_t v) {
        for (int i = 7; i >= 0; i--) {
                p[i] = (uint8_t) v;
                v >>= 8;
        }
}

static void put_str(EVP_MD_CTX *c, const char *s) {
        size_t n = s ? strlen(s) : 0;
        uint8_t len[8];
        put_u64(len, n);
        EVP_DigestUpdate(c, len, sizeof len);
        if (n)
                EVP_DigestUpdate(c, s, n);
}

int audit_record_hash(const uint8_t prev[32], int64_t seq, int64_t ts_ms, int64_t team,
                      const char *sandbox, const char *kind, const char *detail, uint8_t out[32]) {
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        if (!c)
                return -ENOMEM;
        uint8_t nums[24];
        put_u64(nums, (uint64_t) seq);
        put_u64(nums + 8, (uint64_t) ts_ms);
        put_u64(nums + 16, (uint64_t) team);
        int ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
                EVP_DigestUpdate(c, "hutch-audit-v1", 14) && EVP_DigestUpdate(c, prev, 32) &&
                EVP_DigestUpdate(c, nums, sizeof nums);
        if (ok) {
                put_str(c, sandbox);
                put_str(c, kind);
                put_str(c, detail);
                unsigned len = 32;
                ok = EVP_DigestFinal_ex(c, out, &len);
        }
        EVP_MD_CTX_free(c);
        return ok ? 0 : -EIO;
}

size_t audit_checkpoint_message(const audit_checkpoint_row *c, uint8_t out[AUDIT_CKPT_MSG_LEN]) {
        memcpy(out, "hutch-audit-checkpoint-v1", 25);
        put_u64(out + 25, (uint64_t) c->n);
        put_u64(out + 33, (uint64_t) c->ts_ms);
        put_u64(out + 41, (uint64_t) c->seq);
        memcpy(out + 49, c->hash, 32);
        put_u64(out + 81, (uint64_t) c->pruned_seq);
        memcpy(out + 89, c->pruned_hash, 32);
        return AUDIT_CKPT_MSG_LEN;
}

/* ------------------------------------------------------------- the key */

static int key_path(const char *data_dir, char *buf, size_t n) {
        if ((size_t) snprintf(buf, n, "%s/audit.key", data_dir) >= n)
                return -ENAMETOOLONG;
        return 0;
}

int audit_key_load(const char *data_dir, bool create, EVP_PKEY **ret, hutch_error *err) {
        char path[PATH_MAX];
        if (key_path(data_dir, path, sizeof path) < 0)
                return hutch_error_set(err, -ENAMETOOLONG, "%s: path too long", data_dir);
        for (int attempt = 0; attempt < 2; attempt++) {
                FILE *f = fopen(path, "re");
                if (f) {
                        EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
                        fclose(f);
                        if (!k || EVP_PKEY_id(k) != EVP_PKEY_ED25519) {
                                EVP_PKEY_free(k);
                                return hutch_error_set(err, -EBADMSG,
                                                       "%s is not an Ed25519 private key (PEM)",
                                                       path);
                        }
                        *ret = k;
                        return 0;
                }
                if (errno != ENOENT || !create)
                        return hutch_error_set(err, negative_errno(), "opening %s: %m", path);
                EVP_PKEY *k = NULL;
                EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
                if (!pc || EVP_PKEY_keygen_init(pc) <= 0 || EVP_PKEY_keygen(pc, &k) <= 0) {
                        EVP_PKEY_CTX_free(pc);
                        return hutch_error_set(err, -EIO, "generating the audit key failed");
                }
                EVP_PKEY_CTX_free(pc);
                /* O_EXCL: a second writer racing us keeps the first key */
                char tmp[PATH_MAX + 16];
                snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long) getpid());
                int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0) {
                        EVP_PKEY_free(k);
                        return hutch_error_set(err, negative_errno(), "creating %s: %m", tmp);
                }
                FILE *w = fdopen(fd, "w");
                int ok = w && PEM_write_PrivateKey(w, k, NULL, NULL, 0, NULL, NULL) == 1;
                ok = ok && fflush(w) == 0 && fsync(fd) == 0;
                if (w)
                        fclose(w);
                else
                        close(fd);
                EVP_PKEY_free(k);
                if (!ok) {
                        unlink(tmp);
                        return hutch_error_set(err, -EIO, "writing %s failed", tmp);
                }
                /* link: never replaces a key that appeared meanwhile */
                if (link(tmp, path) < 0 && errno != EEXIST) {
                        int e = negative_errno();
                        unlink(tmp);
                        return hutch_error_set(err, e, "creating %s: %m", path);
                }
                unlink(tmp);
        }
        return hutch_error_set(err, -EIO, "%s vanished after it was written", path);
}

int audit_pubkey_pem(const char *data_dir, char **ret, hutch_error *err) {
        EVP_PKEY *k = NULL;
        int r = audit_key_load(data_dir, false, &k, err);
        if (r < 0)
                return r;
        BIO *b = BIO_new(BIO_s_mem());
        if (!b || PEM_write_bio_PUBKEY(b, k) != 1) {
                BIO_free(b);
                EVP_PKEY_free(k);
                return hutch_error_set(err, -EIO, "encoding the public key failed");
        }
        EVP_PKEY_free(k);
        char *p = NULL;
        long n = BIO_get_mem_data(b, &p);
        char *s = n > 0 ? strndup(p, (size_t) n) : NULL;
        BIO_free(b);
        if (!s)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        *ret = s;
        return 0;
}

static int sign(EVP_PKEY *k, const uint8_t *msg, size_t len, uint8_t sig[64]) {
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        size_t sl = 64;
        int ok = c && EVP_DigestSignInit(c, NULL, NULL, NULL, k) == 1 &&
                EVP_DigestSign(c, sig, &sl, msg, len) == 1 && sl == 64;
        EVP_MD_CTX_free(c);
        return ok ? 0 : -EIO;
}

bool audit_sig_ok(EVP_PKEY *k, const uint8_t *msg, size_t len, const uint8_t *sig, size_t sl) {
        if (sl != 64)
                return false;
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        bool ok = c && EVP_DigestVerifyInit(c, NULL, NULL, NULL, k) == 1 &&
                EVP_DigestVerify(c, sig, sl, msg, len) == 1;
        EVP_MD_CTX_free(c);
        return ok;
}

/* ------------------------------------------------------------- SQL bits */

int audit_db_fail(sqlite3 *db, hutch_error *err, const char *what) {
        int rc = sqlite3_errcode(db);
        int e = (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED ? -EBUSY
                : (rc & 0xff) == SQLITE_FULL                               ? -ENOSPC
                                                                           : -EIO;
        return hutch_error_set(err, e, "%s: %s", what, sqlite3_errmsg(db));
}

static int exec(sqlite3 *db, const char *sql, hutch_error *err) {
        if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
                return audit_db_fail(db, err, sql);
        return 0;
}

static void rollback(sqlite3 *db) {
        if (!sqlite3_get_autocommit(db))
                (void) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

void audit_finalizep(sqlite3_stmt **s) {
        (void) sqlite3_finalize(*s);
}

int audit_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **ret, hutch_error *err) {
        if (sqlite3_prepare_v3(db, sql, -1, 0, ret, NULL) != SQLITE_OK) {
                *ret = NULL;
                return audit_db_fail(db, err, "preparing an audit statement");
        }
        return 0;
}

static void blob32(sqlite3_stmt *s, int col, uint8_t out[32]) {
        const void *b = sqlite3_column_blob(s, col);
        if (b && sqlite3_column_bytes(s, col) == 32)
                memcpy(out, b, 32);
        else
                memset(out, 0, 32);
}

/* ------------------------------------------------------------ the writer */

static int load_head(audit_log *a, hutch_error *err) {
        _cleanup_(audit_finalizep) sqlite3_stmt *s = NULL;
        int r = audit_prepare(
                a->db, "SELECT seq, hash, kind FROM audit_log ORDER BY seq DESC LIMIT 2", &s, err);
        if (r < 0)
                return r;
        char kinds[2][AUDIT_KIND_MAX] = { "", "" };
        int i = 0, rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW && i < 2) {
                if (i == 0) {
                        a->last_seq = sqlite3_column_int64(s, 0);
                        blob32(s, 1, a->last_hash);
                }
                const unsigned char *k = sqlite3_column_text(s, 2);
                snprintf(kinds[i], sizeof kinds[i], "%s", k ? (const char *) k : "");
                i++;
        }
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
                return audit_db_fail(a->db, err, "reading the audit chain's head");
        sqlite3_finalize(TAKE_PTR(s));
        r = audit_prepare(
                a->db,
                "SELECT n, seq, pruned_seq, pruned_hash FROM audit_checkpoints ORDER BY n DESC LIMIT 1",
                &s, err);
        if (r < 0)
                return r;
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
                a->last_n = sqlite3_column_int64(s, 0);
                a->signed_seq = sqlite3_column_int64(s, 1);
                a->pruned_seq = sqlite3_column_int64(s, 2);
                blob32(s, 3, a->pruned_hash);
        } else if (rc != SQLITE_DONE)
                return audit_db_fail(a->db, err, "reading the last audit checkpoint");
        a->start.empty = a->last_seq == 0;
        a->start.last_seq = a->last_seq;
        a->start.signed_seq = a->signed_seq;
        a->start.clean = a->start.empty ||
                (streq(kinds[0], "audit.checkpoint") && streq(kinds[1], "daemon.stop") &&
                 a->signed_seq + 1 == a->last_seq);
        return 0;
}

int audit_open(hutch_store *st, const char *data_dir, audit_log **ret, hutch_error *err) {
        _cleanup_free_ audit_log *a = calloc(1, sizeof *a);
        if (!a)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        a->st = st;
        a->db = store_sqlite(st);
        if ((size_t) snprintf(a->head_path, sizeof a->head_path, "%s/audit.head", data_dir) >=
            sizeof a->head_path)
                return hutch_error_set(err, -ENAMETOOLONG, "%s: path too long", data_dir);
        int r = audit_key_load(data_dir, true, &a->key, err);
        if (r < 0)
                return r;
        r = load_head(a, err);
        if (r < 0) {
                EVP_PKEY_free(a->key);
                return r;
        }
        a->changes_seen = -1; /* fold at the first flush */
        *ret = TAKE_PTR(a);
        return 0;
}

static void queued_free(queued *q) {
        free(q->sandbox);
        free(q->kind);
        free(q->detail);
}

void audit_close(audit_log *a) {
        if (!a)
                return;
        for (size_t i = 0; i < a->n; i++)
                queued_free(&a->q[i]);
        free(a->q);
        EVP_PKEY_free(a->key);
        (void) sqlite3_finalize(a->data_version);
        for (size_t i = 0; i < ELEMENTSOF(a->stmts); i++)
                (void) sqlite3_finalize(a->stmts[i]);
        free(a);
}

void audit_start_state_get(const audit_log *a, audit_start_state *ret) {
        *ret = a->start;
}

size_t audit_queued(const audit_log *a) {
        return a->n;
}

bool audit_fold_pending(const audit_log *a) {
        return a->fold_more;
}

int audit_append(audit_log *a, int64_t ts_ms, int64_t team, const char *sandbox, const char *kind,
                 const char *detail_json) {
        if (!a || !kind || !*kind)
                return -EINVAL;
        if (a->n == a->cap) {
                size_t cap = a->cap ? a->cap * 2 : 64;
                queued *q = realloc(a->q, cap * sizeof *q);
                if (!q)
                        return -ENOMEM;
                a->q = q;
                a->cap = cap;
        }
        queued *q = &a->q[a->n];
        q->ts_ms = ts_ms ? ts_ms : audit_now_ms();
        q->team = team;
        q->sandbox = strndup(sandbox ? sandbox : "", AUDIT_SANDBOX_MAX - 1);
        q->kind = strndup(kind, AUDIT_KIND_MAX - 1);
        q->detail = strdup(detail_json && *detail_json ? detail_json : "{}");
        if (!q->sandbox || !q->kind || !q->detail) {
                queued_free(q);
                return -ENOMEM;
        }
        a->n++;
        return 0;
}

/* One record onto the chain, inside the caller's transaction; advances
 * *seq and hash (the caller commits them to a once COMMIT succeeded). */
static int chain_insert(audit_log *a, sqlite3_stmt *ins, int64_t *seq, uint8_t hash[32], int64_t ts,
                        int64_t team, const char *sandbox, const char *kind, const char *detail,
                        hutch_error *err) {
        uint8_t h[32];
        int64_t n = *seq + 1;
        if (audit_record_hash(hash, n, ts, team, sandbox, kind, detail, h) < 0)
                return hutch_error_set(err, -EIO, "hashing an audit record failed");
        sqlite3_reset(ins);
        int rc = sqlite3_bind_int64(ins, 1, n);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(ins, 2, ts);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(ins, 3, team);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_text(ins, 4, sandbox ? sandbox : "", -1, SQLITE_STATIC);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_text(ins, 5, kind, -1, SQLITE_STATIC);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_text(ins, 6, detail, -1, SQLITE_STATIC);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(ins, 7, hash, 32, SQLITE_TRANSIENT);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(ins, 8, h, 32, SQLITE_TRANSIENT);
        if (rc != SQLITE_OK || sqlite3_step(ins) != SQLITE_DONE)
                return audit_db_fail(a->db, err, "appending an audit record");
        *seq = n;
        memcpy(hash, h, 32);
        return 0;
}

static void resetp(sqlite3_stmt **s) {
        if (*s) {
                (void) sqlite3_reset(*s);
                (void) sqlite3_clear_bindings(*s);
        }
}

/* The cached statement in slot i, prepared from sql on first use; reset by
 * the _cleanup_(resetp) of its user. */
static int stmt_get(audit_log *a, size_t i, const char *sql, sqlite3_stmt **ret, hutch_error *err) {
        if (!a->stmts[i] &&
            sqlite3_prepare_v3(a->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &a->stmts[i], NULL) !=
                    SQLITE_OK) {
                a->stmts[i] = NULL;
                return audit_db_fail(a->db, err, "preparing an audit statement");
        }
        *ret = a->stmts[i];
        return 0;
}

#define INSERT_SQL                                                                                 \
        "INSERT INTO audit_log (seq, ts_ms, team_id, sandbox_id, kind, detail, prev, hash)"        \
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"

/* The store's events and egress records written since the last fold, in
 * id order, onto the chain. */
/* Rows folded per table and transaction: a backlog (a first start after an
 * upgrade, a stretch with audit = off) is worked through over several loop
 * turns instead of in one long transaction. */
#define FOLD_MAX 2000 /* the LIMIT of the two queries below */

static int fold(audit_log *a, sqlite3_stmt *ins, int64_t *seq, uint8_t hash[32], hutch_error *err) {
        a->fold_more = false;
        static const char *const queries[2] = {
                "SELECT e.id, e.ts_ms, e.team_id, coalesce(e.sandbox_id, ''), e.kind, e.detail_json"
                " FROM events e, audit_fold f WHERE f.id = 1 AND e.id > f.events_id ORDER BY e.id"
                " LIMIT 2000",
                "SELECT g.id, g.ts_ms, g.team_id, g.sandbox_id,"
                " CASE WHEN g.allowed THEN 'egress.allow' ELSE 'egress.deny' END,"
                " json_object('kind', g.kind, 'method', g.method, 'host', g.host, 'port', g.port,"
                "  'address', g.address, 'reason', g.reason, 'rule', g.rule, 'error', g.error,"
                "  'bytes_out', g.bytes_out, 'bytes_in', g.bytes_in, 'duration_ms', g.duration_ms,"
                "  'suppressed', g.suppressed, 'injected', g.injected, 'egress_id', g.id)"
                " FROM egress_log g, audit_fold f WHERE f.id = 1 AND g.id > f.egress_id ORDER BY g.id"
                " LIMIT 2000",
        };
        static const char *const updates[2] = {
                "UPDATE audit_fold SET events_id = ?1 WHERE id = 1",
                "UPDATE audit_fold SET egress_id = ?1 WHERE id = 1",
        };
        for (int q = 0; q < 2; q++) {
                _cleanup_(resetp) sqlite3_stmt *s = NULL;
                int r = stmt_get(a, 1 + q, queries[q], &s, err);
                if (r < 0)
                        return r;
                int64_t last = -1;
                unsigned n_rows = 0;
                int rc;
                while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                        last = sqlite3_column_int64(s, 0);
                        n_rows++;
                        const char *sandbox = (const char *) sqlite3_column_text(s, 3);
                        const char *kind = (const char *) sqlite3_column_text(s, 4);
                        const char *detail = (const char *) sqlite3_column_text(s, 5);
                        r = chain_insert(a, ins, seq, hash, sqlite3_column_int64(s, 1),
                                         sqlite3_column_int64(s, 2), sandbox, kind ? kind : "event",
                                         detail ? detail : "{}", err);
                        if (r < 0)
                                return r;
                }
                if (rc != SQLITE_DONE)
                        return audit_db_fail(a->db, err,
                                             "folding the store's records into the audit chain");
                if (n_rows >= FOLD_MAX)
                        a->fold_more = true;
                if (last < 0)
                        continue;
                _cleanup_(resetp) sqlite3_stmt *u = NULL;
                r = stmt_get(a, 3 + q, updates[q], &u, err);
                if (r < 0)
                        return r;
                if (sqlite3_bind_int64(u, 1, last) != SQLITE_OK || sqlite3_step(u) != SQLITE_DONE)
                        return audit_db_fail(a->db, err, "recording the audit fold");
        }
        return 0;
}

/* Runs body(a, ins, &seq, hash, arg) in one write transaction. */
typedef int (*tx_body)(audit_log *a, sqlite3_stmt *ins, int64_t *seq, uint8_t hash[32], void *arg,
                       hutch_error *err);

static int write_tx(audit_log *a, bool do_fold, tx_body body, void *arg, hutch_error *err) {
        int r = exec(a->db, "BEGIN IMMEDIATE", err);
        if (r < 0)
                return r;
        _cleanup_(resetp) sqlite3_stmt *ins = NULL;
        r = stmt_get(a, 0, INSERT_SQL, &ins, err);
        int64_t seq = a->last_seq;
        uint8_t hash[32];
        memcpy(hash, a->last_hash, 32);
        if (r >= 0 && do_fold)
                r = fold(a, ins, &seq, hash, err);
        if (r >= 0)
                for (size_t i = 0; i < a->n && r >= 0; i++)
                        r = chain_insert(a, ins, &seq, hash, a->q[i].ts_ms, a->q[i].team,
                                         a->q[i].sandbox, a->q[i].kind, a->q[i].detail, err);
        if (r >= 0 && body)
                r = body(a, ins, &seq, hash, arg, err);
        resetp(&ins);
        ins = NULL;
        if (r >= 0)
                r = exec(a->db, "COMMIT", err);
        if (r < 0) {
                rollback(a->db);
                return r;
        }
        int written = (int) (seq - a->last_seq);
        a->last_seq = seq;
        memcpy(a->last_hash, hash, 32);
        for (size_t i = 0; i < a->n; i++)
                queued_free(&a->q[i]);
        a->n = 0;
        a->changes_seen = sqlite3_total_changes64(a->db);
        return written;
}

/* PRAGMA data_version: changes when another connection (`hutch key`)
 * committed to the file; -1 when it cannot be read (then fold anyway). */
static int64_t data_version(audit_log *a) {
        if (!a->data_version &&
            sqlite3_prepare_v3(a->db, "PRAGMA data_version", -1, SQLITE_PREPARE_PERSISTENT,
                               &a->data_version, NULL) != SQLITE_OK)
                return -1;
        int64_t v = sqlite3_step(a->data_version) == SQLITE_ROW
                ? sqlite3_column_int64(a->data_version, 0)
                : -1;
        sqlite3_reset(a->data_version);
        return v;
}

int audit_flush(audit_log *a, hutch_error *err) {
        if (!a)
                return 0;
        /* nothing queued and nobody wrote the store since the last fold
         * (this connection's change count, the others' data_version): no
         * transaction at all */
        int64_t dv = data_version(a);
        bool do_fold = a->fold_more || sqlite3_total_changes64(a->db) != a->changes_seen ||
                dv < 0 || dv != a->version_seen;
        if (a->n == 0 && !do_fold)
                return 0;
        int r = write_tx(a, do_fold, NULL, NULL, err);
        if (r >= 0)
                a->version_seen = dv;
        return r;
}

static int head_write(audit_log *a, const audit_checkpoint_row *c) {
        char line[512], h[65], ph[65], sig[129];
        audit_hex(c->hash, 32, h);
        audit_hex(c->pruned_hash, 32, ph);
        audit_hex(c->sig, 64, sig);
        int n = snprintf(line, sizeof line, "hutch-audit-head-v1 %lld %lld %lld %s %lld %s %s\n",
                         (long long) c->n, (long long) c->ts_ms, (long long) c->seq, h,
                         (long long) c->pruned_seq, ph, sig);
        return write_file_atomic(a->head_path, line, (size_t) n, 0600);
}

typedef struct ckpt_arg {
        int64_t pruned_seq;
        uint8_t pruned_hash[32];
        audit_checkpoint_row row;
} ckpt_arg;

/* Inside the transaction: sign the chain's head as checkpoint n+1, and put
 * a record of it onto the chain (covered by the next checkpoint), so that a
 * deleted checkpoint row leaves a trace in the chain. */
static int ckpt_body(audit_log *a, sqlite3_stmt *ins, int64_t *seq, uint8_t hash[32], void *arg,
                     hutch_error *err) {
        ckpt_arg *c = arg;
        audit_checkpoint_row *row = &c->row;
        row->n = a->last_n + 1;
        row->ts_ms = audit_now_ms();
        row->seq = *seq;
        memcpy(row->hash, hash, 32);
        row->pruned_seq = c->pruned_seq;
        memcpy(row->pruned_hash, c->pruned_hash, 32);
        uint8_t msg[AUDIT_CKPT_MSG_LEN];
        size_t ml = audit_checkpoint_message(row, msg);
        if (sign(a->key, msg, ml, row->sig) < 0)
                return hutch_error_set(err, -EIO, "signing an audit checkpoint failed");
        _cleanup_(audit_finalizep) sqlite3_stmt *s = NULL;
        int r = audit_prepare(
                a->db,
                "INSERT INTO audit_checkpoints (n, ts_ms, seq, hash, pruned_seq, pruned_hash, sig)"
                " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, row->n);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, row->ts_ms);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 3, row->seq);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(s, 4, row->hash, 32, SQLITE_STATIC);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 5, row->pruned_seq);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(s, 6, row->pruned_hash, 32, SQLITE_STATIC);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(s, 7, row->sig, 64, SQLITE_STATIC);
        if (rc != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
                return audit_db_fail(a->db, err, "recording an audit checkpoint");
        char detail[128];
        snprintf(detail, sizeof detail, "{\"n\":%lld,\"seq\":%lld,\"pruned_seq\":%lld}",
                 (long long) row->n, (long long) row->seq, (long long) row->pruned_seq);
        return chain_insert(a, ins, seq, hash, row->ts_ms, 0, "", "audit.checkpoint", detail, err);
}

static int checkpoint_with(audit_log *a, int64_t pruned_seq, const uint8_t pruned_hash[32],
                           hutch_error *err) {
        ckpt_arg c = { .pruned_seq = pruned_seq };
        memcpy(c.pruned_hash, pruned_hash, 32);
        int r = write_tx(a, true, ckpt_body, &c, err);
        if (r < 0)
                return r;
        a->last_n = c.row.n;
        a->signed_seq = c.row.seq;
        a->pruned_seq = pruned_seq;
        memcpy(a->pruned_hash, pruned_hash, 32);
        /* after the commit: a head newer than the database would read as a
         * truncation; one older (a crash right here) only as unchecked */
        if (head_write(a, &c.row) < 0)
                return hutch_error_set(err, negative_errno(), "writing %s: %m", a->head_path);
        return 0;
}

int audit_checkpoint(audit_log *a, bool force, hutch_error *err) {
        if (!a)
                return 0;
        int r = audit_flush(a, err);
        if (r < 0)
                return r;
        /* the chain's head is the previous checkpoint's own record: nothing new */
        if (!force && a->last_n > 0 && a->last_seq == a->signed_seq + 1)
                return 0;
        if (!force && a->last_seq == 0)
                return 0;
        return checkpoint_with(a, a->pruned_seq, a->pruned_hash, err);
}

int64_t audit_prune(audit_log *a, int64_t before_ms, hutch_error *err) {
        if (!a || a->last_n == 0)
                return 0;
        /* only signed records go, and never the last signed one: the new
         * start must be a record whose predecessor's hash is known */
        int64_t upto = 0;
        uint8_t h[32] = { 0 };
        {
                _cleanup_(audit_finalizep) sqlite3_stmt *s = NULL;
                int r = audit_prepare(a->db,
                                      "SELECT seq, hash FROM audit_log WHERE ts_ms < ?1 AND seq < ?2"
                                      " ORDER BY seq DESC LIMIT 1",
                                      &s, err);
                if (r < 0)
                        return r;
                sqlite3_bind_int64(s, 1, before_ms);
                sqlite3_bind_int64(s, 2, a->signed_seq);
                int rc = sqlite3_step(s);
                if (rc == SQLITE_ROW) {
                        upto = sqlite3_column_int64(s, 0);
                        blob32(s, 1, h);
                } else if (rc != SQLITE_DONE)
                        return audit_db_fail(a->db, err, "finding old audit records");
        }
        if (upto <= a->pruned_seq)
                return 0;
        /* sign the new start first: a crash between the two leaves records
         * that a checkpoint says are pruned, which verify accepts */
        int r = checkpoint_with(a, upto, h, err);
        if (r < 0)
                return r;
        r = exec(a->db, "BEGIN IMMEDIATE", err);
        if (r < 0)
                return r;
        _cleanup_(audit_finalizep) sqlite3_stmt *d1 = NULL, *d2 = NULL;
        r = audit_prepare(a->db, "DELETE FROM audit_log WHERE seq <= ?1", &d1, err);
        if (r >= 0)
                r = audit_prepare(a->db, "DELETE FROM audit_checkpoints WHERE seq <= ?1 AND n < ?2",
                                  &d2, err);
        if (r >= 0) {
                sqlite3_bind_int64(d1, 1, upto);
                sqlite3_bind_int64(d2, 1, upto);
                sqlite3_bind_int64(d2, 2, a->last_n);
                if (sqlite3_step(d1) != SQLITE_DONE || sqlite3_step(d2) != SQLITE_DONE)
                        r = audit_db_fail(a->db, err, "pruning audit records");
        }
        int64_t removed = sqlite3_changes64(a->db);
        if (r >= 0)
                r = exec(a->db, "COMMIT", err);
        if (r < 0) {
                rollback(a->db);
                return r;
        }
        (void) removed;
        return upto;
}

void audit_hex(const uint8_t *b, size_t n, char *out) {
        static const char x[] = "0123456789abcdef";
        for (size_t i = 0; i < n; i++) {
                out[2 * i] = x[b[i] >> 4];
                out[2 * i + 1] = x[b[i] & 15];
        }
        out[2 * n] = 0;
}
