/* SPDX-License-Identifier: Apache-2.0 */
/* Reading the audit trail: filters, queries, export formats, verification. */
#include <errno.h>
#include <limits.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "audit/audit-internal.h"
#include "util/macro.h"
#include "util/parse.h"

/* ------------------------------------------------------------- filters */

void audit_filter_init(audit_filter *f) {
        memset(f, 0, sizeof *f);
        f->team = -1;
}

static bool all_digits(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (*s < '0' || *s > '9')
                        return false;
        return true;
}

int audit_time_parse(const char *s, int64_t now_ms, int64_t *ret) {
        if (!s || !*s || strlen(s) > 64)
                return -EINVAL;
        uint64_t v;
        if (all_digits(s)) { /* unix milliseconds */
                if (parse_u64(s, INT64_MAX, &v) < 0)
                        return -EINVAL;
                *ret = (int64_t) v;
                return 0;
        }
        if (s[0] >= '0' && s[0] <= '9' && !strchr(s, '-') && !strchr(s, ':')) { /* "1h": that long ago */
                if (parse_duration_ms(s, &v) < 0 || v > (uint64_t) now_ms)
                        return -EINVAL;
                *ret = now_ms - (int64_t) v;
                return 0;
        }
        /* RFC 3339 (UTC "Z" or ±hh:mm), or a bare date YYYY-MM-DD */
        struct tm tm = { 0 };
        const char *p = strptime(s, "%Y-%m-%d", &tm);
        if (!p)
                return -EINVAL;
        int64_t frac = 0, off = 0;
        if (*p == 'T' || *p == 't' || *p == ' ') {
                p = strptime(p + 1, "%H:%M:%S", &tm);
                if (!p)
                        return -EINVAL;
                if (*p == '.') {
                        int digits = 0;
                        for (p++; *p >= '0' && *p <= '9'; p++)
                                if (digits < 3) {
                                        frac = frac * 10 + (*p - '0');
                                        digits++;
                                }
                        if (digits == 0)
                                return -EINVAL;
                        while (digits++ < 3)
                                frac *= 10;
                }
                if (*p == 'Z' || *p == 'z')
                        p++;
                else if (*p == '+' || *p == '-') {
                        int sign = *p == '-' ? -1 : 1;
                        for (int i = 1; i <= 5; i++)
                                if (i == 3 ? p[i] != ':' : !(p[i] >= '0' && p[i] <= '9'))
                                        return -EINVAL;
                        int hh = (p[1] - '0') * 10 + (p[2] - '0'),
                            mm = (p[4] - '0') * 10 + (p[5] - '0');
                        if (hh > 23 || mm > 59)
                                return -EINVAL;
                        off = sign * (hh * 3600 + mm * 60);
                        p += 6;
                } else
                        return -EINVAL;
        }
        if (*p)
                return -EINVAL;
        time_t t = timegm(&tm);
        if (t == (time_t) -1 || t < 0)
                return -EINVAL;
        *ret = ((int64_t) t - off) * 1000 + frac;
        return 0;
}

static bool kind_ok(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '.' || *s == '_'))
                        return false;
        return true;
}

static bool sandbox_ok(const char *s) {
        if (!*s)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                      (*s >= '0' && *s <= '9') || *s == '-' || *s == '_'))
                        return false;
        return true;
}

int audit_filter_set(audit_filter *f, const char *key, const char *value, int64_t now_ms,
                     unsigned max_limit, hutch_error *err) {
        if (!key || !value)
                return hutch_error_set(err, -EINVAL, "empty filter");
        uint64_t v;
        if (streq(key, "since") || streq(key, "until")) {
                int64_t t;
                if (audit_time_parse(value, now_ms, &t) < 0)
                        return hutch_error_set(
                                err, -EINVAL,
                                "%s: expected an RFC 3339 time, a date, unix milliseconds or a "
                                "duration such as 1h",
                                key);
                *(streq(key, "since") ? &f->since_ms : &f->until_ms) = t;
                return 0;
        }
        if (streq(key, "team")) {
                if (parse_u64(value, INT64_MAX, &v) < 0)
                        return hutch_error_set(err, -EINVAL, "team: expected a team id");
                f->team = (int64_t) v;
                return 0;
        }
        if (streq(key, "after")) {
                if (parse_u64(value, INT64_MAX, &v) < 0)
                        return hutch_error_set(err, -EINVAL, "after: expected a sequence number");
                f->after_seq = (int64_t) v;
                return 0;
        }
        if (streq(key, "limit")) {
                if (parse_u64(value, max_limit, &v) < 0 || v == 0)
                        return hutch_error_set(err, -EINVAL, "limit: expected 1..%u", max_limit);
                f->limit = (unsigned) v;
                return 0;
        }
        if (streq(key, "sandbox")) {
                if (strlen(value) >= sizeof f->sandbox || !sandbox_ok(value))
                        return hutch_error_set(err, -EINVAL, "sandbox: not a sandbox id");
                snprintf(f->sandbox, sizeof f->sandbox, "%s", value);
                return 0;
        }
        if (streq(key, "kind")) {
                if (strlen(value) >= sizeof f->kind || !kind_ok(value))
                        return hutch_error_set(err, -EINVAL,
                                               "kind: expected a kind such as process.start, or a "
                                               "prefix such as process.");
                snprintf(f->kind, sizeof f->kind, "%s", value);
                return 0;
        }
        return hutch_error_set(err, -EINVAL, "unknown filter '%.64s'", key);
}

/* --------------------------------------------------------------- query */

static void fill_record(sqlite3_stmt *s, audit_record *r) {
        r->seq = sqlite3_column_int64(s, 0);
        r->ts_ms = sqlite3_column_int64(s, 1);
        r->team = sqlite3_column_int64(s, 2);
        r->sandbox = (const char *) sqlite3_column_text(s, 3);
        r->kind = (const char *) sqlite3_column_text(s, 4);
        r->detail = (const char *) sqlite3_column_text(s, 5);
        if (!r->sandbox)
                r->sandbox = "";
        if (!r->kind)
                r->kind = "";
        if (!r->detail)
                r->detail = "{}";
        const void *p = sqlite3_column_blob(s, 6), *h = sqlite3_column_blob(s, 7);
        memset(r->prev, 0, 32);
        memset(r->hash, 0, 32);
        if (p && sqlite3_column_bytes(s, 6) == 32)
                memcpy(r->prev, p, 32);
        if (h && sqlite3_column_bytes(s, 7) == 32)
                memcpy(r->hash, h, 32);
}

int audit_query(hutch_store *st, const audit_filter *f, int (*cb)(void *arg, const audit_record *r),
                void *arg, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        char kind_hi[AUDIT_KIND_MAX + 1];
        size_t kl = strlen(f->kind);
        bool prefix = kl > 0 && f->kind[kl - 1] == '.';
        /* a prefix as a range: "process." <= kind < "process/" */
        snprintf(kind_hi, sizeof kind_hi, "%s", f->kind);
        if (prefix)
                kind_hi[kl - 1] = '/';
        _cleanup_(audit_finalizep) sqlite3_stmt *s = NULL;
        int r = audit_prepare(
                db,
                "SELECT seq, ts_ms, team_id, sandbox_id, kind, detail, prev, hash FROM audit_log"
                " WHERE seq > ?1 AND (?2 = 0 OR ts_ms >= ?2) AND (?3 = 0 OR ts_ms < ?3)"
                " AND (?4 < 0 OR team_id = ?4) AND (?5 = '' OR sandbox_id = ?5)"
                " AND (?6 = '' OR (?7 AND kind >= ?6 AND kind < ?8) OR (NOT ?7 AND kind = ?6))"
                " ORDER BY seq LIMIT ?9",
                &s, err);
        if (r < 0)
                return r;
        sqlite3_bind_int64(s, 1, f->after_seq);
        sqlite3_bind_int64(s, 2, f->since_ms);
        sqlite3_bind_int64(s, 3, f->until_ms);
        sqlite3_bind_int64(s, 4, f->team);
        sqlite3_bind_text(s, 5, f->sandbox, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 6, f->kind, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 7, prefix);
        sqlite3_bind_text(s, 8, kind_hi, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 9, f->limit ? (int64_t) f->limit : -1);
        int rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                audit_record rec;
                fill_record(s, &rec);
                r = cb(arg, &rec);
                if (r < 0)
                        return r;
        }
        if (rc != SQLITE_DONE)
                return audit_db_fail(db, err, "reading the audit trail");
        return 0;
}

/* -------------------------------------------------------------- formats */

static void format_time(int64_t ms, char buf[40]) {
        time_t t = (time_t) (ms / 1000);
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t n = strftime(buf, 40, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(buf + n, 40 - n, ".%03dZ", (int) (ms % 1000));
}

/* JSON string body of s (no quotes) appended to a growing buffer */
typedef struct sbuf {
        char *p;
        size_t n, cap;
        bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
        if (b->oom)
                return;
        if (b->n + n + 1 > b->cap) {
                size_t cap = b->cap ? b->cap : 256;
                while (cap < b->n + n + 1)
                        cap *= 2;
                char *p = realloc(b->p, cap);
                if (!p) {
                        b->oom = true;
                        return;
                }
                b->p = p;
                b->cap = cap;
        }
        memcpy(b->p + b->n, s, n);
        b->n += n;
        b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) {
        sb_put(b, "\"", 1);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                char e[8];
                if (*p == '"' || *p == '\\') {
                        e[0] = '\\';
                        e[1] = (char) *p;
                        sb_put(b, e, 2);
                } else if (*p < 0x20) {
                        snprintf(e, sizeof e, "\\u%04x", *p);
                        sb_put(b, e, 6);
                } else
                        sb_put(b, (const char *) p, 1);
        }
        sb_put(b, "\"", 1);
}

char *audit_record_json(const audit_record *r) {
        sbuf b = { 0 };
        char num[64], t[40], h[65];
        format_time(r->ts_ms, t);
        audit_hex(r->hash, 32, h);
        snprintf(num, sizeof num, "{\"seq\":%lld,\"ts\":%lld,\"time\":", (long long) r->seq,
                 (long long) r->ts_ms);
        sb_put(&b, num, strlen(num));
        sb_str(&b, t);
        snprintf(num, sizeof num, ",\"team\":%lld,\"sandbox\":", (long long) r->team);
        sb_put(&b, num, strlen(num));
        sb_str(&b, r->sandbox);
        sb_put(&b, ",\"kind\":", 8);
        sb_str(&b, r->kind);
        /* the detail is JSON the daemon wrote; a row edited into something
         * else is exported as a string, never as broken JSON */
        sb_put(&b, ",\"detail\":", 10);
        size_t dl = strlen(r->detail);
        if (dl >= 2 && r->detail[0] == '{' && r->detail[dl - 1] == '}' && !strpbrk(r->detail, "\n\r"))
                sb_put(&b, r->detail, dl);
        else
                sb_str(&b, r->detail);
        sb_put(&b, ",\"hash\":", 8);
        sb_str(&b, h);
        sb_put(&b, "}", 1);
        if (b.oom) {
                free(b.p);
                return NULL;
        }
        return b.p;
}

static void csv_field(FILE *f, const char *s) {
        fputc('"', f);
        for (; *s; s++) {
                if (*s == '"')
                        fputc('"', f);
                fputc(*s, f);
        }
        fputc('"', f);
}

void audit_csv_header(FILE *f) {
        fputs("seq,time,team,sandbox,kind,detail,hash\r\n", f);
}

void audit_record_csv(FILE *f, const audit_record *r) {
        char t[40], h[65];
        format_time(r->ts_ms, t);
        audit_hex(r->hash, 32, h);
        fprintf(f, "%lld,%s,%lld,", (long long) r->seq, t, (long long) r->team);
        csv_field(f, r->sandbox);
        fputc(',', f);
        csv_field(f, r->kind);
        fputc(',', f);
        csv_field(f, r->detail);
        fprintf(f, ",%s\r\n", h);
}

/* --------------------------------------------------------------- verify */

typedef struct vctx {
        void (*problem)(void *arg, int64_t seq, const char *msg);
        void *arg;
        int n;
} vctx;

__attribute__((format(printf, 3, 4))) static void problem(vctx *v, int64_t seq, const char *fmt, ...) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        v->n++;
        if (v->problem)
                v->problem(v->arg, seq, msg);
}

static int load_pubkey(const char *data_dir, const char *pem, EVP_PKEY **ret, hutch_error *err) {
        if (!pem)
                return audit_key_load(data_dir, false, ret, err);
        BIO *b = BIO_new_mem_buf(pem, -1);
        EVP_PKEY *k = b ? PEM_read_bio_PUBKEY(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        if (!k || EVP_PKEY_id(k) != EVP_PKEY_ED25519) {
                EVP_PKEY_free(k);
                return hutch_error_set(err, -EBADMSG, "not an Ed25519 public key (PEM)");
        }
        *ret = k;
        return 0;
}

static int hex_decode(const char *s, uint8_t *out, size_t n) {
        if (strlen(s) != 2 * n)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                unsigned v;
                if (sscanf(s + 2 * i, "%2x", &v) != 1)
                        return -EINVAL;
                out[i] = (uint8_t) v;
        }
        return 0;
}

/* DATA_DIR/audit.head: the newest checkpoint, signed, outside the database. */
static int head_read(const char *data_dir, audit_checkpoint_row *c) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/audit.head", data_dir);
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        char line[600], h[80], ph[80], sig[160];
        long long n, ts, seq, ps;
        int r = -EBADMSG;
        if (fgets(line, sizeof line, f) &&
            sscanf(line, "hutch-audit-head-v1 %lld %lld %lld %70s %lld %70s %140s", &n, &ts, &seq,
                   h, &ps, ph, sig) == 7 &&
            hex_decode(h, c->hash, 32) == 0 && hex_decode(ph, c->pruned_hash, 32) == 0 &&
            hex_decode(sig, c->sig, 64) == 0) {
                c->n = n;
                c->ts_ms = ts;
                c->seq = seq;
                c->pruned_seq = ps;
                r = 0;
        }
        fclose(f);
        return r;
}

typedef struct ckpt_list {
        audit_checkpoint_row *v;
        bool *ok; /* signature verified */
        bool *seen_in_chain;
        size_t n;
} ckpt_list;

/* By number: the list is in n order (ORDER BY n, a primary key). */
static ssize_t ckpt_find(const ckpt_list *l, int64_t n) {
        size_t lo = 0, hi = l->n;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (l->v[mid].n == n)
                        return (ssize_t) mid;
                if (l->v[mid].n < n)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return -1;
}

static int64_t detail_int(const char *detail, const char *key) {
        char pat[40];
        snprintf(pat, sizeof pat, "\"%s\":", key);
        const char *p = strstr(detail, pat);
        return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

int audit_verify(hutch_store *st, const char *data_dir, const char *pubkey_pem,
                 void (*problem_cb)(void *arg, int64_t seq, const char *msg), void *arg,
                 audit_verify_result *ret, hutch_error *err) {
        sqlite3 *db = store_sqlite(st);
        vctx v = { .problem = problem_cb, .arg = arg };
        audit_verify_result res = { 0 };
        EVP_PKEY *key = NULL;
        int r = load_pubkey(data_dir, pubkey_pem, &key, err);
        if (r < 0)
                return r;
        /* audit.head before the database: the daemon writes it after each
         * checkpoint's commit, so the snapshot read below is at least as new
         * and a checkpoint signed meanwhile is never taken for a truncation */
        audit_checkpoint_row head;
        int hr = head_read(data_dir, &head);
        /* one read transaction: a daemon appending meanwhile is not seen */
        if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) {
                EVP_PKEY_free(key);
                return audit_db_fail(db, err, "BEGIN");
        }
        ckpt_list cl = { 0 };
        sqlite3_stmt *s = NULL;

        /* checkpoints: each signature, their numbering and order */
        r = audit_prepare(
                db,
                "SELECT n, ts_ms, seq, hash, pruned_seq, pruned_hash, sig FROM audit_checkpoints ORDER BY n",
                &s, err);
        if (r < 0)
                goto out;
        int rc;
        size_t cap = 0;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                if (cl.n == cap) {
                        cap = cap ? cap * 2 : 64;
                        audit_checkpoint_row *nv = realloc(cl.v, cap * sizeof *nv);
                        bool *no = realloc(cl.ok, cap * sizeof *no);
                        bool *ns = no ? realloc(cl.seen_in_chain, cap * sizeof *ns) : NULL;
                        if (nv)
                                cl.v = nv;
                        if (no)
                                cl.ok = no;
                        if (ns)
                                cl.seen_in_chain = ns;
                        if (!nv || !no || !ns) {
                                r = hutch_error_set(err, -ENOMEM, "out of memory");
                                goto out;
                        }
                }
                audit_checkpoint_row *c = &cl.v[cl.n];
                memset(c, 0, sizeof *c);
                c->n = sqlite3_column_int64(s, 0);
                c->ts_ms = sqlite3_column_int64(s, 1);
                c->seq = sqlite3_column_int64(s, 2);
                c->pruned_seq = sqlite3_column_int64(s, 4);
                const void *h = sqlite3_column_blob(s, 3), *ph = sqlite3_column_blob(s, 5),
                           *sg = sqlite3_column_blob(s, 6);
                bool shape = h && ph && sg && sqlite3_column_bytes(s, 3) == 32 &&
                        sqlite3_column_bytes(s, 5) == 32 && sqlite3_column_bytes(s, 6) == 64;
                if (shape) {
                        memcpy(c->hash, h, 32);
                        memcpy(c->pruned_hash, ph, 32);
                        memcpy(c->sig, sg, 64);
                }
                uint8_t msg[AUDIT_CKPT_MSG_LEN];
                size_t ml = audit_checkpoint_message(c, msg);
                cl.ok[cl.n] = shape && audit_sig_ok(key, msg, ml, c->sig, 64);
                cl.seen_in_chain[cl.n] = false;
                cl.n++;
        }
        if (rc != SQLITE_DONE) {
                r = audit_db_fail(db, err, "reading audit checkpoints");
                goto out;
        }
        sqlite3_finalize(s);
        s = NULL;
        const audit_checkpoint_row *last_good = NULL;
        for (size_t i = 0; i < cl.n; i++) {
                audit_checkpoint_row *c = &cl.v[i];
                if (!cl.ok[i]) {
                        /* a signature that is another checkpoint's: a replay */
                        ssize_t same = -1;
                        for (size_t j = 0; j < cl.n; j++)
                                if (j != i && memcmp(cl.v[j].sig, c->sig, 64) == 0)
                                        same = (ssize_t) j;
                        if (same >= 0)
                                problem(&v, c->seq,
                                        "checkpoint %lld: a replay of checkpoint %lld (its signature, another number)",
                                        (long long) c->n, (long long) cl.v[same].n);
                        else
                                problem(&v, c->seq,
                                        "checkpoint %lld: the signature does not verify (changed or forged)",
                                        (long long) c->n);
                        continue;
                }
                if (i > 0 && c->n != cl.v[i - 1].n + 1)
                        problem(&v, c->seq, "checkpoints %lld..%lld are missing (deleted)",
                                (long long) cl.v[i - 1].n + 1, (long long) c->n - 1);
                if (last_good && (c->seq <= last_good->seq || c->ts_ms < last_good->ts_ms))
                        problem(&v, c->seq,
                                "checkpoint %lld: signs seq %lld, not after checkpoint %lld's %lld (replayed or reordered)",
                                (long long) c->n, (long long) c->seq, (long long) last_good->n,
                                (long long) last_good->seq);
                last_good = c;
                res.checkpoints++;
        }
        if (last_good) {
                res.signed_seq = last_good->seq;
                res.signed_ts_ms = last_good->ts_ms;
                res.pruned_seq = last_good->pruned_seq;
        }

        /* the chain */
        r = audit_prepare(
                db,
                "SELECT seq, ts_ms, team_id, sandbox_id, kind, detail, prev, hash FROM audit_log ORDER BY seq",
                &s, err);
        if (r < 0)
                goto out;
        uint8_t prev[32] = { 0 };
        int64_t expect = res.pruned_seq + 1;
        bool first = true;
        size_t next_ck = 0; /* the next good checkpoint to meet */
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                audit_record rec;
                fill_record(s, &rec);
                if (first) {
                        res.first_seq = rec.seq;
                        if (res.pruned_seq > 0 && rec.seq > res.pruned_seq + 1)
                                problem(&v, rec.seq, "records %lld..%lld are missing (deleted)",
                                        (long long) expect, (long long) rec.seq - 1);
                        else if (res.pruned_seq == 0 && rec.seq > 1)
                                problem(&v, rec.seq, "records 1..%lld are missing (deleted)",
                                        (long long) rec.seq - 1);
                        if (rec.seq == res.pruned_seq + 1 && res.pruned_seq > 0)
                                memcpy(prev, last_good->pruned_hash, 32);
                        else if (rec.seq != 1)
                                memcpy(prev, rec.prev,
                                       32); /* not checkable: retention removed the one before */
                        first = false;
                } else if (rec.seq != expect) {
                        problem(&v, rec.seq, "records %lld..%lld are missing (deleted)",
                                (long long) expect, (long long) rec.seq - 1);
                        memcpy(prev, rec.prev, 32);
                }
                if (memcmp(prev, rec.prev, 32) != 0)
                        problem(&v, rec.seq,
                                "record %lld: its link does not match the record before (reordered, or the one before was changed)",
                                (long long) rec.seq);
                uint8_t h[32];
                if (audit_record_hash(rec.prev, rec.seq, rec.ts_ms, rec.team, rec.sandbox, rec.kind,
                                      rec.detail, h) < 0) {
                        r = hutch_error_set(err, -EIO, "hashing failed");
                        goto out;
                }
                if (memcmp(h, rec.hash, 32) != 0)
                        problem(&v, rec.seq,
                                "record %lld (%s): its content does not match its hash (changed)",
                                (long long) rec.seq, rec.kind);
                if (res.pruned_seq > 0 && rec.seq == res.pruned_seq &&
                    memcmp(rec.hash, last_good->pruned_hash, 32) != 0)
                        problem(&v, rec.seq,
                                "record %lld: not the record the retention checkpoint names",
                                (long long) rec.seq);
                /* the checkpoints that sign this point of the chain */
                while (next_ck < cl.n && (!cl.ok[next_ck] || cl.v[next_ck].seq < rec.seq))
                        next_ck++;
                for (size_t i = next_ck; i < cl.n && cl.v[i].seq == rec.seq; i++)
                        if (cl.ok[i] && memcmp(cl.v[i].hash, rec.hash, 32) != 0)
                                problem(&v, rec.seq,
                                        "checkpoint %lld: the chain at seq %lld is not what it signed (records rewritten)",
                                        (long long) cl.v[i].n, (long long) rec.seq);
                if (streq(rec.kind, "audit.checkpoint")) {
                        int64_t n = detail_int(rec.detail, "n"), cseq = detail_int(rec.detail, "seq");
                        ssize_t at = ckpt_find(&cl, n);
                        if (at < 0) {
                                if (cseq > res.pruned_seq)
                                        problem(&v, rec.seq,
                                                "checkpoint %lld (record %lld names it) is missing (deleted)",
                                                (long long) n, (long long) rec.seq);
                        } else if (cl.seen_in_chain[at])
                                problem(&v, rec.seq,
                                        "checkpoint %lld is named twice in the chain (replayed)",
                                        (long long) n);
                        else {
                                cl.seen_in_chain[at] = true;
                                if (cl.ok[at] && cl.v[at].seq != cseq)
                                        problem(&v, rec.seq,
                                                "checkpoint %lld: signs seq %lld, the chain says %lld",
                                                (long long) n, (long long) cl.v[at].seq,
                                                (long long) cseq);
                        }
                }
                memcpy(prev, rec.hash, 32);
                expect = rec.seq + 1;
                res.last_seq = rec.seq;
                res.records++;
        }
        if (rc != SQLITE_DONE) {
                r = audit_db_fail(db, err, "reading the audit trail");
                goto out;
        }
        sqlite3_finalize(s);
        s = NULL;
        if (last_good && res.last_seq < last_good->seq)
                problem(&v, last_good->seq,
                        "truncated: checkpoint %lld signs seq %lld, the chain ends at %lld",
                        (long long) last_good->n, (long long) last_good->seq,
                        (long long) res.last_seq);
        for (size_t i = 0; i < cl.n; i++)
                if (cl.ok[i] && !cl.seen_in_chain[i] && cl.v[i].seq < res.last_seq)
                        problem(&v, cl.v[i].seq,
                                "checkpoint %lld: no record of it in the chain (inserted)",
                                (long long) cl.v[i].n);
        if (last_good) {
                res.unsigned_records = res.last_seq - last_good->seq;
                /* the checkpoint's own record follows it: not news */
                if (res.unsigned_records > 0)
                        res.unsigned_records--;
        } else
                res.unsigned_records = res.records;

        /* the head outside the database: a cut back to an older state */
        if (hr == 0) {
                res.head_checked = true;
                uint8_t msg[AUDIT_CKPT_MSG_LEN];
                size_t ml = audit_checkpoint_message(&head, msg);
                if (!audit_sig_ok(key, msg, ml, head.sig, 64))
                        problem(&v, head.seq,
                                "audit.head: the signature does not verify (changed or forged)");
                else {
                        ssize_t at = ckpt_find(&cl, head.n);
                        if (!last_good || head.n > last_good->n)
                                problem(&v, head.seq,
                                        "truncated: audit.head names checkpoint %lld (seq %lld), the database's newest is %lld (seq %lld)",
                                        (long long) head.n, (long long) head.seq,
                                        last_good ? (long long) last_good->n : 0LL,
                                        last_good ? (long long) last_good->seq : 0LL);
                        else if (at >= 0 && memcmp(cl.v[at].sig, head.sig, 64) != 0)
                                problem(&v, head.seq,
                                        "checkpoint %lld: not the one audit.head holds (replaced)",
                                        (long long) head.n);
                }
        } else if (hr != -ENOENT)
                problem(&v, 0, "audit.head: unreadable (%s)", strerror(-hr));
        else if (cl.n > 0 && cl.v[cl.n - 1].n > 1)
                /* the head is written after each checkpoint's commit: only
                 * the very first may be in the database without it yet */
                problem(&v, 0,
                        "audit.head is missing while the database holds checkpoints (deleted)");
        r = v.n;
out:
        if (s)
                sqlite3_finalize(s);
        (void) sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
        free(cl.v);
        free(cl.ok);
        free(cl.seen_in_chain);
        EVP_PKEY_free(key);
        if (r >= 0 && ret)
                *ret = res;
        return r;
}
