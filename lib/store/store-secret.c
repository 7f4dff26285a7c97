/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Secrets: a team's credentials for the egress proxy (issue #4). Values are
 * encrypted with AES-256-GCM under a per-team key, HMAC-SHA256(secrets key,
 * "hutch secret v1" || team id); the associated data binds the ciphertext to
 * its secret id and version, so a value copied into another row, team or
 * version does not decrypt. The secrets key lives in its own file, not in
 * this database.
 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store-internal.h"

#define NONCE_LEN 12
#define TAG_LEN 16
#define SECRET_COLUMNS "id, team_id, name, version, hosts_json, metadata_json, created_ms, updated_ms"

void store_set_secrets_key(hutch_store *st, const uint8_t key[32]) {
        memcpy(st->secrets_key, key, 32);
        st->has_secrets_key = true;
}

static int need_key(hutch_store *st, hutch_error *err) {
        return st->has_secrets_key ? 0 : hutch_error_set(err, -ENOKEY, "no secrets key loaded");
}

static int team_key(hutch_store *st, int64_t team_id, uint8_t key[32], hutch_error *err) {
        if (!st->has_secrets_key)
                return hutch_error_set(err, -ENOKEY, "no secrets key loaded");
        uint8_t msg[64];
        int n = snprintf((char *) msg, sizeof msg, "hutch secret v1 %lld", (long long) team_id);
        if (n < 0 || (size_t) n >= sizeof msg)
                return hutch_error_set(err, -EIO, "deriving the team's secrets key failed");
        unsigned len = 32;
        if (!HMAC(EVP_sha256(), st->secrets_key, 32, msg, (size_t) n, key, &len) || len != 32)
                return hutch_error_set(err, -EIO, "deriving the team's secrets key failed");
        return 0;
}

static void aad_of(const char *id, int64_t version, int64_t team_id, char aad[96]) {
        snprintf(aad, 96, "%s|%lld|%lld", id, (long long) version, (long long) team_id);
}

/* nonce || ciphertext || tag */
static int seal(hutch_store *st, int64_t team_id, const char *id, int64_t version, const void *pt, size_t len,
                uint8_t **ret, size_t *ret_len, hutch_error *err) {
        uint8_t key[32];
        int r = team_key(st, team_id, key, err);
        if (r < 0)
                return r;
        size_t total = NONCE_LEN + len + TAG_LEN;
        uint8_t *out = malloc(total);
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        char aad[96];
        aad_of(id, version, team_id, aad);
        int l1 = 0, l2 = 0;
        bool ok = out && c && RAND_bytes(out, NONCE_LEN) == 1 &&
                  EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) == 1 &&
                  EVP_EncryptInit_ex(c, NULL, NULL, key, out) == 1 &&
                  EVP_EncryptUpdate(c, NULL, &l1, (const uint8_t *) aad, (int) strlen(aad)) == 1 &&
                  EVP_EncryptUpdate(c, out + NONCE_LEN, &l1, pt, (int) len) == 1 &&
                  EVP_EncryptFinal_ex(c, out + NONCE_LEN + l1, &l2) == 1 &&
                  (size_t) (l1 + l2) == len &&
                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG_LEN, out + NONCE_LEN + len) == 1;
        EVP_CIPHER_CTX_free(c);
        OPENSSL_cleanse(key, sizeof key);
        if (!ok) {
                free(out);
                return hutch_error_set(err, -EIO, "encrypting the secret failed");
        }
        *ret = out;
        *ret_len = total;
        return 0;
}

static int open_sealed(hutch_store *st, int64_t team_id, const char *id, int64_t version, const uint8_t *in,
                       size_t len, char **ret, size_t *ret_len, hutch_error *err) {
        if (len < NONCE_LEN + TAG_LEN)
                return hutch_error_set(err, -EBADMSG, "secret %s: stored value is damaged", id);
        uint8_t key[32];
        int r = team_key(st, team_id, key, err);
        if (r < 0)
                return r;
        size_t n = len - NONCE_LEN - TAG_LEN;
        char *out = malloc(n + 1);
        EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
        char aad[96];
        aad_of(id, version, team_id, aad);
        int l1 = 0, l2 = 0;
        bool ok = out && c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, NONCE_LEN, NULL) == 1 &&
                  EVP_DecryptInit_ex(c, NULL, NULL, key, in) == 1 &&
                  EVP_DecryptUpdate(c, NULL, &l1, (const uint8_t *) aad, (int) strlen(aad)) == 1 &&
                  EVP_DecryptUpdate(c, (uint8_t *) out, &l1, in + NONCE_LEN, (int) n) == 1 &&
                  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG_LEN, (void *) (in + NONCE_LEN + n)) == 1 &&
                  EVP_DecryptFinal_ex(c, (uint8_t *) out + l1, &l2) == 1;
        EVP_CIPHER_CTX_free(c);
        OPENSSL_cleanse(key, sizeof key);
        if (!ok) {
                if (out) {
                        OPENSSL_cleanse(out, n + 1);
                        free(out);
                }
                return hutch_error_set(err, -EBADMSG, "secret %s: the stored value does not authenticate", id);
        }
        out[n] = 0;
        *ret = out;
        *ret_len = n;
        return 0;
}

void store_secret_clear(store_secret *s) {
        free(s->name);
        free(s->hosts_json);
        free(s->metadata_json);
        memset(s, 0, sizeof *s);
}

void store_secret_array_free(store_secret *v, size_t n) {
        for (size_t i = 0; i < n; i++)
                store_secret_clear(&v[i]);
        free(v);
}

static char *col_dup(sqlite3_stmt *s, int i) {
        const unsigned char *t = sqlite3_column_text(s, i);
        return strdup(t ? (const char *) t : "");
}

static int from_row(sqlite3_stmt *s, store_secret *ret, hutch_error *err) {
        memset(ret, 0, sizeof *ret);
        const unsigned char *id = sqlite3_column_text(s, 0);
        snprintf(ret->id, sizeof ret->id, "%s", id ? (const char *) id : "");
        ret->team_id = sqlite3_column_int64(s, 1);
        ret->name = col_dup(s, 2);
        ret->version = sqlite3_column_int64(s, 3);
        ret->hosts_json = col_dup(s, 4);
        ret->metadata_json = col_dup(s, 5);
        ret->created_ms = sqlite3_column_int64(s, 6);
        ret->updated_ms = sqlite3_column_int64(s, 7);
        if (!ret->name || !ret->hosts_json || !ret->metadata_json) {
                store_secret_clear(ret);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        return 0;
}

static int new_id(char id[32]) {
        static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
        uint8_t b[20];
        strcpy(id, "sec_");
        for (size_t i = 0; i < 20; i++) {
                do {
                        if (RAND_bytes(b + i, 1) != 1)
                                return -EIO;
                } while (b[i] >= 252); /* 252 = 7 * 36: unbiased */
                id[4 + i] = alphabet[b[i] % 36];
        }
        id[24] = 0;
        return 0;
}

int store_secret_get(hutch_store *st, int64_t team_id, const char *id_or_name, store_secret *ret,
                     hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SECRET_GET,
                           "SELECT " SECRET_COLUMNS " FROM secrets WHERE team_id = ?1 AND deleted_ms = 0"
                           " AND (id = ?2 OR name = lower(?2)) ORDER BY id = ?2 DESC LIMIT 1",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, id_or_name);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        r = store_step_row(st, s, err, "reading a secret");
        if (r < 0)
                return r;
        if (r == 0)
                return hutch_error_set(err, -ENOENT, "secret %s not found", id_or_name);
        return from_row(s, ret, err);
}

int store_secret_create(hutch_store *st, int64_t team_id, const char *name, const void *value, size_t len,
                        const char *hosts_json, const char *metadata_json, store_secret *ret, hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        if (len > STORE_SECRET_VALUE_MAX)
                return hutch_error_set(err, -E2BIG, "a secret value is at most %d bytes", STORE_SECRET_VALUE_MAX);
        char id[32];
        if (new_id(id) < 0)
                return hutch_error_set(err, -EIO, "no randomness");
        uint8_t *sealed = NULL;
        size_t sl = 0;
        int r = seal(st, team_id, id, 1, value, len, &sealed, &sl, err);
        if (r < 0)
                return r;
        {
                _cleanup_stmt_ sqlite3_stmt *s = NULL;
                r = store_stmt(st, STMT_SECRET_INSERT,
                               "INSERT INTO secrets (id, team_id, name, version, value, hosts_json, metadata_json,"
                               " created_ms, updated_ms) VALUES (?1, ?2, lower(?3), 1, ?4, ?5, ?6, ?7, ?7)",
                               &s, err);
                if (r >= 0) {
                        int64_t now = store_wall_ms();
                        int rc = store_bind_text(s, 1, id);
                        if (rc == SQLITE_OK)
                                rc = sqlite3_bind_int64(s, 2, team_id);
                        if (rc == SQLITE_OK)
                                rc = store_bind_text(s, 3, name);
                        if (rc == SQLITE_OK)
                                rc = sqlite3_bind_blob(s, 4, sealed, (int) sl, SQLITE_TRANSIENT);
                        if (rc == SQLITE_OK)
                                rc = store_bind_text(s, 5, hosts_json ? hosts_json : "[]");
                        if (rc == SQLITE_OK)
                                rc = store_bind_text(s, 6, metadata_json ? metadata_json : "{}");
                        if (rc == SQLITE_OK)
                                rc = sqlite3_bind_int64(s, 7, now);
                        if (rc != SQLITE_OK)
                                r = store_fail(st, rc, err, "binding");
                        else {
                                rc = sqlite3_step(s);
                                if (rc == SQLITE_CONSTRAINT_UNIQUE)
                                        r = hutch_error_set(err, -EEXIST, "a secret named \"%s\" exists", name);
                                else if (rc != SQLITE_DONE)
                                        r = store_fail(st, rc, err, "creating a secret");
                        }
                }
        }
        free(sealed);
        if (r < 0)
                return r;
        return store_secret_get(st, team_id, id, ret, err);
}

int store_secret_update(hutch_store *st, int64_t team_id, const char *id_or_name, const void *value, size_t len,
                        const char *hosts_json, const char *metadata_json, store_secret *ret, hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        if (len > STORE_SECRET_VALUE_MAX)
                return hutch_error_set(err, -E2BIG, "a secret value is at most %d bytes", STORE_SECRET_VALUE_MAX);
        store_secret cur;
        int r = store_secret_get(st, team_id, id_or_name, &cur, err);
        if (r < 0)
                return r;
        int64_t version = cur.version + 1;
        uint8_t *sealed = NULL;
        size_t sl = 0;
        r = seal(st, team_id, cur.id, version, value, len, &sealed, &sl, err);
        if (r >= 0) {
                _cleanup_stmt_ sqlite3_stmt *s = NULL;
                r = store_stmt(st, STMT_SECRET_UPDATE,
                               "UPDATE secrets SET version = ?2, value = ?3, hosts_json = coalesce(?4, hosts_json),"
                               " metadata_json = coalesce(?5, metadata_json), updated_ms = ?6"
                               " WHERE id = ?1 AND deleted_ms = 0",
                               &s, err);
                if (r >= 0) {
                        int rc = store_bind_text(s, 1, cur.id);
                        if (rc == SQLITE_OK)
                                rc = sqlite3_bind_int64(s, 2, version);
                        if (rc == SQLITE_OK)
                                rc = sqlite3_bind_blob(s, 3, sealed, (int) sl, SQLITE_TRANSIENT);
                        if (rc == SQLITE_OK)
                                rc = store_bind_text(s, 4, hosts_json);
                        if (rc == SQLITE_OK)
                                rc = store_bind_text(s, 5, metadata_json);
                        if (rc == SQLITE_OK)
                                rc = sqlite3_bind_int64(s, 6, store_wall_ms());
                        r = rc != SQLITE_OK ? store_fail(st, rc, err, "binding")
                                            : store_step_done(st, s, err, "updating a secret");
                }
        }
        free(sealed);
        char id[32];
        memcpy(id, cur.id, sizeof id);
        store_secret_clear(&cur);
        if (r < 0)
                return r;
        return store_secret_get(st, team_id, id, ret, err);
}

int store_secret_delete(hutch_store *st, int64_t team_id, const char *id_or_name, hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        store_secret cur;
        int r = store_secret_get(st, team_id, id_or_name, &cur, err);
        if (r < 0)
                return r;
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        r = store_stmt(st, STMT_SECRET_DELETE,
                       "UPDATE secrets SET value = NULL, deleted_ms = ?2 WHERE id = ?1 AND deleted_ms = 0", &s, err);
        if (r >= 0) {
                int rc = store_bind_text(s, 1, cur.id);
                if (rc == SQLITE_OK)
                        rc = sqlite3_bind_int64(s, 2, store_wall_ms());
                r = rc != SQLITE_OK ? store_fail(st, rc, err, "binding") : store_step_done(st, s, err, "deleting a secret");
        }
        store_secret_clear(&cur);
        return r;
}

int store_secret_list(hutch_store *st, int64_t team_id, const char *after, unsigned limit, store_secret **ret,
                      size_t *ret_n, hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        if (limit < 1 || limit > 1000)
                return hutch_error_set(err, -EINVAL, "limit must be 1..1000");
        _cleanup_stmt_ sqlite3_stmt *s = NULL;
        int r = store_stmt(st, STMT_SECRET_LIST,
                           "SELECT " SECRET_COLUMNS " FROM secrets WHERE team_id = ?1 AND deleted_ms = 0"
                           " AND name > ?2 ORDER BY name LIMIT ?3",
                           &s, err);
        if (r < 0)
                return r;
        int rc = sqlite3_bind_int64(s, 1, team_id);
        if (rc == SQLITE_OK)
                rc = store_bind_text(s, 2, after ? after : "");
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int(s, 3, (int) limit);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "binding");
        store_secret *v = calloc(limit, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        size_t n = 0;
        while (n < limit) {
                r = store_step_row(st, s, err, "listing secrets");
                if (r < 0) {
                        store_secret_array_free(v, n);
                        return r;
                }
                if (r == 0)
                        break;
                if ((r = from_row(s, &v[n], err)) < 0) {
                        store_secret_array_free(v, n);
                        return r;
                }
                n++;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

int store_secret_value_of(hutch_store *st, const store_secret *meta, char **ret, size_t *ret_len,
                          hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        /* the value of exactly that version */
        _cleanup_stmt_ sqlite3_stmt *q = NULL;
        int r = store_stmt(st, STMT_SECRET_VALUE,
                           "SELECT value FROM secrets WHERE id = ?1 AND version = ?2 AND deleted_ms = 0", &q, err);
        if (r < 0)
                return r;
        int rc = store_bind_text(q, 1, meta->id);
        if (rc == SQLITE_OK)
                rc = sqlite3_bind_int64(q, 2, meta->version);
        if (rc != SQLITE_OK)
                return store_fail(st, rc, err, "reading a secret");
        r = store_step_row(st, q, err, "reading a secret");
        if (r < 0)
                return r;
        if (r == 0 || sqlite3_column_type(q, 0) != SQLITE_BLOB)
                return hutch_error_set(err, -ENOENT, "secret %s has no value", meta->id);
        return open_sealed(st, meta->team_id, meta->id, meta->version, sqlite3_column_blob(q, 0),
                           (size_t) sqlite3_column_bytes(q, 0), ret, ret_len, err);
}

int store_secret_value(hutch_store *st, int64_t team_id, const char *name, char **ret, size_t *ret_len,
                       hutch_error *err) {
        if (!st->has_secrets_key)
                return need_key(st, err);
        store_secret cur;
        int r = store_secret_get(st, team_id, name, &cur, err);
        if (r < 0)
                return r;
        r = store_secret_value_of(st, &cur, ret, ret_len, err);
        store_secret_clear(&cur);
        return r;
}
