/* SPDX-License-Identifier: Apache-2.0 */
/* Teams and API keys. A key is shown once, at creation; the database keeps
 * only its SHA-256, so a copy of the file does not hand out working keys.
 * Keys carry 160 random bits, so an unsalted fast hash is enough: there is
 * no dictionary to try. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <string.h>

#include "store/store-internal.h"

#define KEY_PREFIX "e2b_"
#define KEY_RANDOM_BYTES 20 /* 40 hex digits */
#define KEY_TOUCH_INTERVAL_MS 60000

/* ---------------------------------------------------------------- teams */

int store_team_create(hutch_store *st, const char *name, int64_t *ret_team_id, hutch_error *err) {
        int r = store_check_text(name, STORE_NAME_MAX + 1, false, "team name", err);
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        r = store_stmt(st, STMT_TEAM_CREATE, "INSERT INTO teams (name, created_ms) VALUES (?1, ?2)",
                       &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, name);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, store_wall_ms());
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "creating team");
        if (r == -EEXIST)
                return hutch_error_set(err, r, "a team named \"%s\" exists already", name);
        if (r < 0)
                return r;
        if (ret_team_id)
                *ret_team_id = sqlite3_last_insert_rowid(st->db);
        return 0;
}

int store_team_find(hutch_store *st, const char *name, int64_t *ret_team_id, hutch_error *err) {
        if (!name)
                return hutch_error_set(err, -ENOENT, "no team name");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_TEAM_FIND, "SELECT id FROM teams WHERE name = ?1", &s, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(s, 1, name);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_row(st, s, err, "finding team");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "no team named \"%s\"", name);
        if (ret_team_id)
                *ret_team_id = sqlite3_column_int64(s, 0);
        return 0;
}

int store_team_count(hutch_store *st, int64_t *ret, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_TEAM_COUNT, "SELECT count(*) FROM teams", &s, err);
        if (r < 0)
                return r;
        r = store_step_row(st, s, err, "counting teams");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -EIO, "counting teams: no result");
        *ret = sqlite3_column_int64(s, 0);
        return 0;
}

/* ----------------------------------------------------------------- keys */

static bool key_is_wellformed(const char *key) {
        if (!key || strncmp(key, KEY_PREFIX, strlen(KEY_PREFIX)) != 0)
                return false;
        const char *p = key + strlen(KEY_PREFIX);
        for (size_t i = 0; i < 2 * KEY_RANDOM_BYTES; i++)
                if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
                        return false; /* also stops at the NUL of a short string */
        return p[2 * KEY_RANDOM_BYTES] == 0;
}

static int key_hash(const char *key, uint8_t ret[32], hutch_error *err) {
        unsigned len = 0;
        if (EVP_Digest(key, strlen(key), ret, &len, EVP_sha256(), NULL) != 1 || len != 32)
                return hutch_error_set(err, -EIO, "SHA-256 failed");
        return 0;
}

static int key_insert(hutch_store *st, int64_t team_id, const char *label, const char *key,
                      int64_t *ret_key_id, hutch_error *err) {
        uint8_t hash[32];
        char prefix[STORE_KEY_PREFIX_LEN + 1];
        memcpy(prefix, key, STORE_KEY_PREFIX_LEN);
        prefix[STORE_KEY_PREFIX_LEN] = 0;
        int r = key_hash(key, hash, err);
        if (r < 0)
                return r;

        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        r = store_stmt(st, STMT_KEY_CREATE,
                       "INSERT INTO api_keys (team_id, hash, prefix, label, created_ms)"
                       " VALUES (?1, ?2, ?3, ?4, ?5)",
                       &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_blob(s, 2, hash, sizeof hash, SQLITE_STATIC);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 3, prefix);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 4, label ? label : "");
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 5, store_wall_ms());
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "creating key");
        if (r == -ENOENT)
                return hutch_error_set(err, r, "no team with id %lld", (long long) team_id);
        if (r < 0)
                return r;
        *ret_key_id = sqlite3_last_insert_rowid(st->db);
        return 0;
}

int store_key_create(hutch_store *st, int64_t team_id, const char *label, char ret_key[45],
                     int64_t *ret_key_id, hutch_error *err) {
        _Static_assert(STORE_KEY_LEN == sizeof KEY_PREFIX - 1 + 2 * KEY_RANDOM_BYTES, "key length");
        int r = store_check_text(label, STORE_NAME_MAX + 1, true, "key label", err);
        if (r < 0)
                return r;

        static const char hex[] = "0123456789abcdef";
        const size_t plen = strlen(KEY_PREFIX);
        uint8_t rnd[KEY_RANDOM_BYTES];
        char key[STORE_KEY_LEN + 1];
        if (RAND_bytes(rnd, sizeof rnd) != 1)
                return hutch_error_set(err, -EIO, "RAND_bytes failed");
        memcpy(key, KEY_PREFIX, plen);
        for (size_t i = 0; i < sizeof rnd; i++) {
                key[plen + 2 * i] = hex[rnd[i] >> 4];
                key[plen + 2 * i + 1] = hex[rnd[i] & 15];
        }
        key[STORE_KEY_LEN] = 0;
        OPENSSL_cleanse(rnd, sizeof rnd);

        int64_t key_id = 0;
        r = key_insert(st, team_id, label, key, &key_id, err);
        if (r >= 0) {
                memcpy(ret_key, key, sizeof key);
                if (ret_key_id)
                        *ret_key_id = key_id;
                /* for the audit trail: which key, never the key */
                char detail[256];
                char prefix[16];
                snprintf(prefix, sizeof prefix, "%.*s", STORE_KEY_PREFIX_LEN, key);
                snprintf(detail, sizeof detail, "{\"key_id\":%lld,\"prefix\":\"%s\"}", (long long) key_id,
                         prefix);
                (void) store_event_add(st, team_id, NULL, "key.create", detail, NULL);
        }
        OPENSSL_cleanse(key, sizeof key);
        return r;
}

/* Record that a key was used, at most once a minute: an authenticated
 * request must not cost a write transaction each time. */
static void key_touch(hutch_store *st, int64_t key_id, int64_t now) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        if (store_stmt(st, STMT_KEY_TOUCH, "UPDATE api_keys SET last_used_ms = ?1 WHERE id = ?2",
                       &s, NULL) < 0)
                return;
        int rc = sqlite3_bind_int64(s, 1, now);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, key_id);
        if (rc != SQLITE_OK)
                return;
        /* best effort: a busy database must not turn a valid key away */
        (void) store_step_done(st, s, NULL, "recording key use");
}

int store_key_lookup(hutch_store *st, const char *key, int64_t *ret_team_id, hutch_error *err) {
        return store_key_lookup_id(st, key, ret_team_id, NULL, err);
}

int store_key_lookup_id(hutch_store *st, const char *key, int64_t *ret_team_id, int64_t *ret_key_id,
                        hutch_error *err) {
        /* A malformed string never reaches the database, and the message
         * never echoes what the client sent. */
        if (!key_is_wellformed(key))
                return hutch_error_set(err, -ENOENT, "invalid API key");
        uint8_t hash[32];
        int r = key_hash(key, hash, err);
        if (r < 0)
                return r;

        int64_t key_id = 0, team_id = 0, last_used = 0;
        {
                /* Found by the hash through an index: timing tells nothing
                 * about a key, only about a SHA-256 prefix. */
                _cleanup_stmt_ sqlite3_stmt *s = NULL;
                r = store_stmt(st, STMT_KEY_LOOKUP,
                               "SELECT id, team_id, last_used_ms FROM api_keys"
                               " WHERE hash = ?1 AND revoked_ms = 0",
                               &s, err);
                if (r < 0)
                        return r;
                int rc = sqlite3_bind_blob(s, 1, hash, sizeof hash, SQLITE_STATIC);
                if (rc != SQLITE_OK)
                        return store_fail(st, rc, err, "binding");
                r = store_step_row(st, s, err, "looking up key");
                if (r < 0)
                        return r;
                if (r == 0)
                        return hutch_error_set(err, -ENOENT, "invalid API key");
                key_id = sqlite3_column_int64(s, 0);
                team_id = sqlite3_column_int64(s, 1);
                last_used = sqlite3_column_int64(s, 2);
        }

        int64_t now = store_wall_ms();
        if (now - last_used >= KEY_TOUCH_INTERVAL_MS || now < last_used)
                key_touch(st, key_id, now);
        if (ret_team_id)
                *ret_team_id = team_id;
        if (ret_key_id)
                *ret_key_id = key_id;
        return 0;
}

int store_key_list(hutch_store *st, store_key_info **ret, size_t *ret_n, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_KEY_LIST,
                           "SELECT k.id, k.team_id, t.name, k.prefix, k.label, k.created_ms,"
                           "       k.last_used_ms, k.revoked_ms"
                           " FROM api_keys k JOIN teams t ON t.id = k.team_id ORDER BY k.id",
                           &s, err);
        if (r < 0)
                return r;

        _cleanup_free_ store_key_info *v = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
                r = store_step_row(st, s, err, "listing keys");
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                if (n == cap) {
                        size_t ncap = cap ? cap * 2 : 16;
                        store_key_info *nv = reallocarray(v, ncap, sizeof *v);
                        if (!nv)
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        v = nv;
                        cap = ncap;
                }
                store_key_info *k = &v[n];
                *k = (store_key_info) {
                        .id = sqlite3_column_int64(s, 0),
                        .team_id = sqlite3_column_int64(s, 1),
                        .created_ms = sqlite3_column_int64(s, 5),
                        .last_used_ms = sqlite3_column_int64(s, 6),
                        .revoked_ms = sqlite3_column_int64(s, 7),
                };
                r = store_column_copy(st, s, 2, k->team, sizeof k->team, err);
                if (r >= 0)
                        r = store_column_copy(st, s, 3, k->prefix, sizeof k->prefix, err);
                if (r >= 0)
                        r = store_column_copy(st, s, 4, k->label, sizeof k->label, err);
                if (r < 0)
                        return r;
                n++;
        }
        *ret = TAKE_PTR(v);
        *ret_n = n;
        return 0;
}

int store_key_revoke(hutch_store *st, int64_t key_id, hutch_error *err) {
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_KEY_REVOKE,
                           "UPDATE api_keys SET revoked_ms ="
                           " CASE WHEN revoked_ms = 0 THEN ?1 ELSE revoked_ms END"
                           " WHERE id = ?2",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, store_wall_ms());
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(s, 2, key_id);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_done(st, s, err, "revoking key");
        if (r < 0)
                return r;
        if (sqlite3_changes(st->db) == 0)
                return hutch_error_set(err, -ENOENT, "no key with id %lld", (long long) key_id);
        char detail[64];
        snprintf(detail, sizeof detail, "{\"key_id\":%lld}", (long long) key_id);
        (void) store_event_add(st, 0, NULL, "key.revoke", detail, NULL);
        return 0;
}
