/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/keysfile.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/macro.h"

#define KEYSFILE_MAX 10000 /* keys in one file */

typedef struct keyent {
        uint8_t hash[32];
        int64_t team;
} keyent;

struct keysfile {
        keyent *v;
        size_t n;
        dev_t dev;
        ino_t ino;
        off_t size;
        struct timespec mtime;
        int64_t checked_ms;
};

static bool key_shape(const char *k) {
        if (strncmp(k, "e2b_", 4) != 0 || strlen(k) != 44)
                return false;
        for (const char *p = k + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static int parse(server *srv, FILE *f, keyent **ret, size_t *ret_n, hutch_error *err) {
        keyent *v = NULL;
        size_t n = 0;
        char line[512];
        unsigned lineno = 0;
        int r = 0;
        while (fgets(line, sizeof line, f)) {
                lineno++;
                char *h = strchr(line, '#');
                if (h)
                        *h = 0;
                char team[STORE_NAME_MAX + 1], key[64], extra[2];
                int k = sscanf(line, "%127s %63s %1s", team, key, extra);
                if (k <= 0)
                        continue;
                if (k != 2 || !key_shape(key)) {
                        r = hutch_error_set(
                                err, -EINVAL,
                                "keys-file line %u: not \"TEAM KEY\" with a key e2b_ + 40 hex",
                                lineno);
                        break;
                }
                if (n >= KEYSFILE_MAX) {
                        r = hutch_error_set(err, -E2BIG, "keys-file: more than %d keys",
                                            KEYSFILE_MAX);
                        break;
                }
                int64_t tid;
                r = store_team_find(srv->store, team, &tid, err);
                if (r == -ENOENT)
                        r = store_team_create(srv->store, team, &tid, err);
                if (r < 0)
                        break;
                keyent *nv = realloc(v, (n + 1) * sizeof *v);
                if (!nv) {
                        r = hutch_error_set(err, -ENOMEM, "out of memory");
                        break;
                }
                v = nv;
                SHA256((const unsigned char *) key, strlen(key), v[n].hash);
                v[n].team = tid;
                n++;
                OPENSSL_cleanse(key, sizeof key);
        }
        OPENSSL_cleanse(line, sizeof line);
        if (r < 0) {
                free(v);
                return r;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

/* 1 reloaded, 0 unchanged, -errno */
static int reload(server *srv, bool force, hutch_error *err) {
        struct keysfile *kf = srv->keys;
        struct stat st;
        if (stat(srv->cfg.keys_file, &st) < 0)
                return hutch_error_set(err, negative_errno(), "keys-file %s: %m", srv->cfg.keys_file);
        if (!force && st.st_dev == kf->dev && st.st_ino == kf->ino && st.st_size == kf->size &&
            st.st_mtim.tv_sec == kf->mtime.tv_sec && st.st_mtim.tv_nsec == kf->mtime.tv_nsec)
                return 0;
        FILE *f = fopen(srv->cfg.keys_file, "re");
        if (!f)
                return hutch_error_set(err, negative_errno(), "keys-file %s: %m", srv->cfg.keys_file);
        keyent *v;
        size_t n;
        int r = parse(srv, f, &v, &n, err);
        fclose(f);
        /* remember this version even when it is bad: logged once, not per request */
        kf->dev = st.st_dev;
        kf->ino = st.st_ino;
        kf->size = st.st_size;
        kf->mtime = st.st_mtim;
        if (r < 0)
                return r;
        free(kf->v);
        kf->v = v;
        kf->n = n;
        return 1;
}

int keysfile_load(server *srv, hutch_error *err) {
        if (streq(srv->cfg.keys_file, "-"))
                return 0;
        srv->keys = calloc(1, sizeof *srv->keys);
        if (!srv->keys)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        int r = reload(srv, true, err);
        if (r < 0)
                return r;
        log_info("keys-file %s: %zu keys", srv->cfg.keys_file, srv->keys->n);
        return 0;
}

int keysfile_lookup(server *srv, const char *key, int64_t *ret_team, int64_t *ret_key_id, hutch_error *err) {
        struct keysfile *kf = srv->keys;
        if (kf) {
                int64_t now = now_ms();
                if (now - kf->checked_ms >= 1000) {
                        kf->checked_ms = now;
                        hutch_error e = { 0 };
                        int r = reload(srv, false, &e);
                        if (r < 0)
                                log_warning("%s; keeping the %zu keys read before", e.msg, kf->n);
                        else if (r > 0)
                                log_info("keys-file %s: reloaded, %zu keys", srv->cfg.keys_file,
                                         kf->n);
                }
                if (key && key_shape(key)) {
                        uint8_t h[32];
                        SHA256((const unsigned char *) key, strlen(key), h);
                        for (size_t i = 0; i < kf->n; i++)
                                if (CRYPTO_memcmp(h, kf->v[i].hash, 32) == 0) {
                                        *ret_team = kf->v[i].team;
                                        *ret_key_id = 0; /* a key of the file, not of the store */
                                        return 0;
                                }
                }
        }
        return store_key_lookup_id(srv->store, key, ret_team, ret_key_id, err);
}

void keysfile_free(server *srv) {
        if (!srv->keys)
                return;
        free(srv->keys->v);
        free(srv->keys);
        srv->keys = NULL;
}
