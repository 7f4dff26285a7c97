/* SPDX-License-Identifier: Apache-2.0 */
/* The store against a real database in a temporary directory: migrations,
 * keys, sandboxes, templates, events, the master secret, file modes. SQLite
 * is opened directly only to look behind the store's back. */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store.h"
#include "tap.h"
#include "util/fsutil.h"

static char db_path[512];

static mode_t file_mode(const char *path) {
        struct stat sb;
        if (stat(path, &sb) < 0)
                return (mode_t) -1;
        return sb.st_mode & 07777;
}

static mode_t side_mode(const char *suffix) {
        char p[600];
        snprintf(p, sizeof p, "%s%s", db_path, suffix);
        return file_mode(p);
}

/* Run one statement directly; returns the first column of the first row as
 * an integer (or -1). */
static long long raw_int(const char *sql) {
        sqlite3 *db = NULL;
        long long v = -1;
        if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
                sqlite3_busy_timeout(db, 2000);
                sqlite3_stmt *s = NULL;
                if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK) {
                        int rc = sqlite3_step(s);
                        if (rc == SQLITE_ROW)
                                v = sqlite3_column_int64(s, 0);
                        else if (rc == SQLITE_DONE)
                                v = sqlite3_changes(db);
                }
                sqlite3_finalize(s);
        }
        sqlite3_close(db);
        return v;
}

static bool key_wellformed(const char *k) {
        if (strlen(k) != STORE_KEY_LEN || strncmp(k, "e2b_", 4) != 0)
                return false;
        for (const char *p = k + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static store_sandbox sbx(const char *id, int64_t team, int64_t started) {
        store_sandbox s = {
                .team_id = team,
                .state = STORE_SBX_RUNNING,
                .started_ms = started,
                .end_ms = started + 300000,
                .cpu_count = 2,
                .memory_mb = 512,
                .disk_mb = 1024,
        };
        snprintf(s.id, sizeof s.id, "%s", id);
        snprintf(s.template_id, sizeof s.template_id, "base");
        snprintf(s.token_nonce, sizeof s.token_nonce, "00112233445566778899aabbccddeeff");
        snprintf(s.token_hash, sizeof s.token_hash, "%064d", 7);
        return s;
}

static void test_keys(hutch_store *st, int64_t team, int64_t other_team, char saved_key[45]) {
        hutch_error err = { 0 };
        char key[45] = { 0 }, key2[45] = { 0 };
        int64_t kid = 0, kid2 = 0, t = 0;

        ok(store_key_create(st, team, "ci runner", key, &kid, &err) == 0 && kid > 0,
           "key created (%s)", err.msg);
        ok(key_wellformed(key), "key is e2b_ + 40 lowercase hex: %s", key);
        ok(store_key_create(st, other_team, NULL, key2, &kid2, &err) == 0 && kid2 > kid,
           "second key, no label");
        ok(strcmp(key, key2) != 0, "keys differ");
        ok(store_key_create(st, 99999, "x", key2, &kid2, &err) == -ENOENT,
           "key for an unknown team is ENOENT (%s)", err.msg);

        ok(store_key_lookup(st, key, &t, &err) == 0 && t == team, "lookup finds the team");
        char q[256];
        snprintf(q, sizeof q,
                 "SELECT count(*) FROM api_keys WHERE prefix = '%.*s' AND hash <> CAST('%s' AS BLOB)",
                 STORE_KEY_PREFIX_LEN, key, key);
        ok(raw_int(q) == 1, "only the prefix and a hash are stored");
        ok(raw_int("SELECT count(*) FROM api_keys WHERE length(hash) = 32") == 2,
           "hashes are SHA-256 sized");

        store_key_info *v = NULL;
        size_t n = 0;
        ok(store_key_list(st, &v, &n, &err) == 0 && n == 2, "two keys listed");
        if (n == 2) {
                ok(v[0].id == kid && v[0].team_id == team && streq(v[0].team, "alpha"),
                   "list: id, team");
                ok(strncmp(v[0].prefix, key, STORE_KEY_PREFIX_LEN) == 0 &&
                           strlen(v[0].prefix) == STORE_KEY_PREFIX_LEN,
                   "list: public prefix %s", v[0].prefix);
                ok(streq(v[0].label, "ci runner") && streq(v[1].label, ""), "list: labels");
                ok(v[0].created_ms > 1600000000000LL && v[0].last_used_ms >= v[0].created_ms,
                   "list: created and last used are unix ms");
                ok(v[1].last_used_ms == 0 && v[0].revoked_ms == 0, "unused key: last_used 0");
        }
        free(v);

        /* malformed strings never match */
        char upper[45];
        memcpy(upper, key, sizeof upper);
        for (char *p = upper + 4; *p; p++)
                if (*p >= 'a' && *p <= 'f') {
                        *p = (char) (*p - 'a' + 'A');
                        break;
                }
        char longer[64], shorter[45], badchar[45], badprefix[45];
        snprintf(longer, sizeof longer, "%s0", key);
        snprintf(shorter, sizeof shorter, "%.43s", key);
        memcpy(badchar, key, sizeof badchar);
        badchar[20] = 'g';
        memcpy(badprefix, key, sizeof badprefix);
        badprefix[0] = 'E';
        const char *bad[] = { NULL,    "",        "e2b_",
                              upper,   longer,    shorter,
                              badchar, badprefix, "e2b_0000000000000000000000000000000000000000" };
        bool all = true;
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                t = -1;
                int r = store_key_lookup(st, bad[i], &t, &err);
                if (r != -ENOENT || t != -1) {
                        all = false;
                        printf("# malformed key %zu gave %d\n", i, r);
                }
        }
        ok(all, "malformed and unknown keys are ENOENT, ret untouched");

        ok(store_key_revoke(st, kid2, &err) == 0, "revoke");
        ok(store_key_lookup(st, key2, &t, &err) == -ENOENT, "revoked key is ENOENT");
        long long revoked = raw_int("SELECT revoked_ms FROM api_keys ORDER BY id DESC LIMIT 1");
        ok(store_key_revoke(st, kid2, &err) == 0 &&
                   raw_int("SELECT revoked_ms FROM api_keys ORDER BY id DESC LIMIT 1") == revoked,
           "revoking twice keeps the first time");
        ok(store_key_revoke(st, 4242, &err) == -ENOENT, "revoking an unknown key is ENOENT");
        ok(store_key_lookup(st, key, &t, &err) == 0, "other key still valid");
        memcpy(saved_key, key, 45);
}

static void test_sandboxes(hutch_store *st, int64_t team, int64_t other_team) {
        hutch_error err = { 0 };
        const char *meta =
                "{\"user\":\"ann\",\"n\":\"1\",\"uni\":\"\xc3\xa9\\u00e9\",\"nested\":{\"a\":[1,2]}}";
        store_sandbox a = sbx("bbbbbbbbbbbbbbbbbbb1", team, 2000);
        a.metadata_json = (char *) meta;
        a.env_json = (char *) "{\"FOO\":\"bar baz\"}";
        a.extra_json =
                (char *) "{\"lifecycle\":{\"on_timeout\":\"pause\"},\"network\":{\"allow_out\":[\"1.1.1.1\"]}}";
        snprintf(a.alias, sizeof a.alias, "my-alias");
        store_sandbox b = sbx("aaaaaaaaaaaaaaaaaaa2", team, 3000); /* later start, earlier id */
        store_sandbox c = sbx("ccccccccccccccccccc3", other_team, 1000);

        ok(store_sandbox_insert(st, &a, &err) == 0, "insert a (%s)", err.msg);
        ok(store_sandbox_insert(st, &b, &err) == 0, "insert b, NULL JSON fields");
        ok(store_sandbox_insert(st, &c, &err) == 0, "insert c");
        ok(store_sandbox_insert(st, &a, &err) == -EEXIST, "duplicate id is EEXIST (%s)", err.msg);

        store_sandbox bad = sbx("ddddddddddddddddddd4", team, 1);
        bad.metadata_json = (char *) "{\"a\":";
        ok(store_sandbox_insert(st, &bad, &err) == -EINVAL,
           "malformed metadata JSON is EINVAL (%s)", err.msg);
        bad.metadata_json = (char *) "[1,2]";
        ok(store_sandbox_insert(st, &bad, &err) == -EINVAL,
           "metadata that is not an object is EINVAL");
        bad.metadata_json = NULL;
        bad.env_json = (char *) "\"str\"";
        ok(store_sandbox_insert(st, &bad, &err) == -EINVAL, "env that is not an object is EINVAL");
        bad.env_json = NULL;
        bad.team_id = 777;
        ok(store_sandbox_insert(st, &bad, &err) == -ENOENT, "unknown team is ENOENT (%s)", err.msg);
        bad.team_id = team;
        bad.state = 9;
        ok(store_sandbox_insert(st, &bad, &err) == -EINVAL, "bad state is EINVAL");
        bad.state = STORE_SBX_RUNNING;
        bad.id[0] = 0;
        ok(store_sandbox_insert(st, &bad, &err) == -EINVAL, "empty id is EINVAL");

        store_sandbox g = { 0 };
        ok(store_sandbox_get(st, a.id, &g, &err) == 0, "get a");
        ok(streq(g.id, a.id) && g.team_id == team && streq(g.template_id, "base") &&
                   streq(g.alias, "my-alias") && g.state == STORE_SBX_RUNNING &&
                   g.started_ms == 2000 && g.end_ms == 302000 && g.ended_ms == 0 && g.cpu_count == 2 &&
                   g.memory_mb == 512 && g.disk_mb == 1024 && streq(g.token_nonce, a.token_nonce) &&
                   streq(g.token_hash, a.token_hash) && streq(g.end_reason, ""),
           "scalar fields round trip");
        ok(g.metadata_json && streq(g.metadata_json, meta),
           "metadata JSON round trips byte for byte");
        ok(g.env_json && streq(g.env_json, a.env_json), "env JSON round trips");
        ok(g.extra_json && streq(g.extra_json, a.extra_json), "extra JSON round trips");
        store_sandbox_clear(&g);
        ok(g.metadata_json == NULL && g.env_json == NULL && g.extra_json == NULL,
           "clear frees and NULLs");
        store_sandbox_clear(NULL);

        ok(store_sandbox_get(st, b.id, &g, &err) == 0 && streq(g.metadata_json, "{}") &&
                   streq(g.env_json, "{}") && streq(g.extra_json, "{}"),
           "NULL JSON reads back as {}");
        store_sandbox_clear(&g);
        g.state = -5;
        ok(store_sandbox_get(st, "nope", &g, &err) == -ENOENT && g.state == -5,
           "get unknown is ENOENT");
        ok(store_sandbox_get(st, NULL, &g, &err) == -ENOENT, "get NULL is ENOENT");

        /* updates */
        ok(store_sandbox_set_state(st, a.id, STORE_SBX_PAUSED, &err) == 0, "pause a");
        ok(store_sandbox_set_end(st, a.id, 999999, &err) == 0, "set end of a");
        ok(store_sandbox_set_extra(st, a.id, "{\"paused_at\":5}", &err) == 0, "set extra of a");
        ok(store_sandbox_set_extra(st, a.id, "not json", &err) == -EINVAL, "bad extra is EINVAL");
        ok(store_sandbox_set_state(st, a.id, 0, &err) == -EINVAL, "state 0 is EINVAL");
        ok(store_sandbox_set_state(st, "nope", STORE_SBX_RUNNING, &err) == -ENOENT,
           "set_state unknown: ENOENT");
        ok(store_sandbox_set_end(st, "nope", 1, &err) == -ENOENT, "set_end unknown: ENOENT");
        ok(store_sandbox_set_extra(st, "nope", "{}", &err) == -ENOENT, "set_extra unknown: ENOENT");
        ok(store_sandbox_get(st, a.id, &g, &err) == 0 && g.state == STORE_SBX_PAUSED &&
                   g.end_ms == 999999 && streq(g.extra_json, "{\"paused_at\":5}") &&
                   streq(g.metadata_json, meta),
           "updates read back, metadata untouched");
        store_sandbox_clear(&g);

        int64_t cnt = -1;
        ok(store_sandbox_count_live(st, team, &cnt, &err) == 0 && cnt == 2, "team has 2 live");
        ok(store_sandbox_count_live(st, other_team, &cnt, &err) == 0 && cnt == 1,
           "other team has 1 live");
        ok(store_sandbox_count_live(st, 0, &cnt, &err) == 0 && cnt == 3, "3 live in all");

        store_sandbox *v = NULL;
        size_t n = 0;
        ok(store_sandbox_list_live(st, &v, &n, &err) == 0 && n == 3, "3 live listed");
        if (n == 3)
                ok(streq(v[0].id, c.id) && streq(v[1].id, a.id) && streq(v[2].id, b.id) &&
                           v[1].state == STORE_SBX_PAUSED && streq(v[1].metadata_json, meta),
                   "listed in started order, with their fields");
        store_sandbox_array_free(v, n);

        /* ending */
        ok(store_sandbox_end(st, a.id, 5555, "timeout", &err) == 1, "end a: 1 (ended now)");
        ok(store_sandbox_end(st, a.id, 6666, "lost", &err) == 0, "end a again: 0, already ended");
        ok(store_sandbox_end(st, "nope", 1, NULL, &err) == -ENOENT, "end unknown: ENOENT");
        ok(store_sandbox_get(st, a.id, &g, &err) == 0 && g.state == STORE_SBX_KILLED &&
                   g.ended_ms == 5555 && streq(g.end_reason, "timeout"),
           "ended sandbox keeps its first end time and reason");
        store_sandbox_clear(&g);
        ok(store_sandbox_set_state(st, a.id, STORE_SBX_RUNNING, &err) == -ENOENT,
           "ended: set_state ENOENT");
        ok(store_sandbox_set_end(st, a.id, 1, &err) == -ENOENT, "ended: set_end ENOENT");
        ok(store_sandbox_set_extra(st, a.id, "{\"final\":true}", &err) == 0,
           "ended: set_extra still works");
        ok(store_sandbox_insert(st, &a, &err) == -EEXIST, "an ended id is not reused");

        ok(store_sandbox_set_state(st, b.id, STORE_SBX_KILLED, &err) >= 0, "set_state KILLED ends b");
        ok(store_sandbox_get(st, b.id, &g, &err) == 0 && g.state == STORE_SBX_KILLED &&
                   g.ended_ms > 0 && streq(g.end_reason, "killed"),
           "b ended with reason killed");
        store_sandbox_clear(&g);

        ok(store_sandbox_count_live(st, team, &cnt, &err) == 0 && cnt == 0, "team has 0 live");
        ok(store_sandbox_list_live(st, &v, &n, &err) == 0 && n == 1 && streq(v[0].id, c.id),
           "only c is live");
        store_sandbox_array_free(v, n);
        store_sandbox_array_free(NULL, 0);
}

static void test_templates(hutch_store *st, int64_t team) {
        hutch_error err = { 0 };
        store_template t = { .id = "tpl-base-0001", .alias = "base", .created_ms = 10, .team_id = 0 };
        store_template u = { .id = "tpl-mine-0002", .alias = "mine", .created_ms = 20, .team_id = team };
        store_template w = { .id = "base", .alias = "", .created_ms = 30, .team_id = team };
        store_template r = { 0 };
        ok(store_template_upsert(st, &t, &err) == 0 && store_template_upsert(st, &u, &err) == 0,
           "templates stored");
        ok(store_template_find(st, "base", &r, &err) == 0 && streq(r.id, t.id) && r.team_id == 0 &&
                   r.created_ms == 10,
           "found by alias");
        ok(store_template_find(st, u.id, &r, &err) == 0 && streq(r.alias, "mine") && r.team_id == team,
           "found by id");
        ok(store_template_upsert(st, &w, &err) == 0, "a template with an empty alias");
        ok(store_template_find(st, "base", &r, &err) == 0 && streq(r.id, "base"),
           "an id wins over an alias");
        store_template clash = { .id = "tpl-x", .alias = "mine", .created_ms = 1 };
        ok(store_template_upsert(st, &clash, &err) == -EEXIST, "alias clash is EEXIST (%s)", err.msg);
        u.created_ms = 40;
        snprintf(u.alias, sizeof u.alias, "mine2");
        ok(store_template_upsert(st, &u, &err) == 0 &&
                   store_template_find(st, "mine2", &r, &err) == 0 && r.created_ms == 40,
           "upsert replaces");
        ok(store_template_find(st, "mine", &r, &err) == -ENOENT, "old alias gone");
        ok(store_template_find(st, "", &r, &err) == -ENOENT, "empty name is ENOENT");
}

int main(void) {
        char tmpl[] = "/tmp/hutch-storetest-XXXXXX";
        char *dir = mkdtemp(tmpl);
        ok(dir != NULL, "temp data dir");
        if (!dir)
                return tap_done();
        snprintf(db_path, sizeof db_path, "%s/hutch.db", dir);
        umask(0); /* the store must not rely on the caller's umask */

        hutch_error err = { 0 };
        hutch_store *st = NULL;
        ok(store_open(db_path, &st, &err) == 0 && st, "open a fresh database (%s)", err.msg);
        if (!st)
                return tap_done();
        ok(raw_int("SELECT version FROM schema_version") == store_schema_version() &&
                   store_schema_version() >= 1,
           "fresh database migrated to version %d", store_schema_version());
        ok(raw_int("SELECT count(*) FROM schema_version") == 1, "schema_version has one row");
        ok(raw_int("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                   "('meta','teams','api_keys','sandboxes','templates','events')") == 6,
           "tables exist");
        ok(file_mode(db_path) == 0600, "database mode 0600 (%o)", (unsigned) file_mode(db_path));
        ok(side_mode("-wal") == 0600 && side_mode("-shm") == 0600, "-wal and -shm mode 0600 (%o, %o)",
           (unsigned) side_mode("-wal"), (unsigned) side_mode("-shm"));
        {
                sqlite3 *db = NULL;
                sqlite3_stmt *s = NULL;
                bool wal = false;
                if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
                    sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL) == SQLITE_OK &&
                    sqlite3_step(s) == SQLITE_ROW)
                        wal = streq((const char *) sqlite3_column_text(s, 0), "wal");
                sqlite3_finalize(s);
                sqlite3_close(db);
                ok(wal, "journal_mode is wal");
        }

        uint8_t secret1[32] = { 0 }, secret2[32] = { 0 }, zero[32] = { 0 };
        ok(store_master_secret(st, secret1, &err) == 0 && memcmp(secret1, zero, 32) != 0,
           "master secret present");

        /* teams */
        int64_t team = 0, other = 0, found = 0, cnt = -1;
        ok(store_team_count(st, &cnt, &err) == 0 && cnt == 0, "no teams yet");
        ok(store_team_create(st, "alpha", &team, &err) == 0 && team > 0, "team created");
        ok(store_team_create(st, "beta", &other, &err) == 0 && other > team, "second team");
        ok(store_team_create(st, "alpha", &found, &err) == -EEXIST, "duplicate team is EEXIST (%s)",
           err.msg);
        ok(store_team_create(st, "", &found, &err) == -EINVAL, "empty team name is EINVAL");
        char longname[200];
        memset(longname, 'x', sizeof longname - 1);
        longname[sizeof longname - 1] = 0;
        ok(store_team_create(st, longname, &found, &err) == -EINVAL, "long team name is EINVAL");
        ok(store_team_find(st, "beta", &found, &err) == 0 && found == other, "team found");
        ok(store_team_find(st, "gamma", &found, &err) == -ENOENT, "unknown team ENOENT");
        ok(store_team_count(st, &cnt, &err) == 0 && cnt == 2, "two teams");

        char key[45] = { 0 };
        test_keys(st, team, other, key);
        test_sandboxes(st, team, other);
        test_templates(st, team);

        ok(store_event_add(st, team, "ccccccccccccccccccc3", "sandbox.created",
                           "{\"template\":\"base\"}", &err) == 0,
           "event added");
        ok(store_event_add(st, 0, NULL, "daemon.started", NULL, &err) == 0,
           "event without team or sandbox");
        ok(store_event_add(st, team, NULL, "x", "[1]", &err) == -EINVAL,
           "event detail must be an object");
        ok(store_event_add(st, team, NULL, "", NULL, &err) == -EINVAL, "event kind required");
        ok(raw_int("SELECT count(*) FROM events") == 2 &&
                   raw_int("SELECT count(*) FROM events WHERE sandbox_id IS NULL AND detail_json = '{}'") ==
                           1,
           "events recorded");

        /* last_used is written at most once a minute */
        int64_t t0 = 0;
        ok(raw_int("UPDATE api_keys SET last_used_ms = 1 WHERE revoked_ms = 0") == 1 &&
                   store_key_lookup(st, key, &t0, &err) == 0 &&
                   raw_int("SELECT last_used_ms FROM api_keys WHERE revoked_ms = 0") > 1600000000000LL,
           "a stale last_used is refreshed");
        long long recent = raw_int("SELECT last_used_ms FROM api_keys WHERE revoked_ms = 0") - 1000;
        char upd[128];
        snprintf(upd, sizeof upd, "UPDATE api_keys SET last_used_ms = %lld WHERE revoked_ms = 0",
                 recent);
        ok(raw_int(upd) == 1 && store_key_lookup(st, key, &t0, &err) == 0 &&
                   raw_int("SELECT last_used_ms FROM api_keys WHERE revoked_ms = 0") == recent,
           "a recent last_used is left alone");

        /* a second handle on the same file (the CLI next to the daemon) */
        hutch_store *st2 = NULL;
        ok(store_open(db_path, &st2, &err) == 0, "second handle opens (%s)", err.msg);
        if (st2) {
                ok(store_master_secret(st2, secret2, &err) == 0 && memcmp(secret1, secret2, 32) == 0,
                   "both handles see one master secret");
                int64_t t2 = 0, g2 = 0;
                ok(store_team_create(st2, "gamma", &t2, &err) == 0 &&
                           store_team_find(st, "gamma", &g2, &err) == 0 && g2 == t2,
                   "a write through one handle is seen by the other");
                store_close(st2);
        }

        /* a write lock held past the busy timeout is EBUSY, not a hang */
        {
                sqlite3 *db = NULL;
                bool locked = sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL) ==
                                SQLITE_OK &&
                        sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK;
                ok(locked, "another connection holds the write lock");
                int64_t tb = 0;
                ok(store_team_create(st, "delta", &tb, &err) == -EBUSY,
                   "write under a held lock is EBUSY (%s)", err.msg);
                ok(store_key_lookup(st, key, &tb, &err) == 0, "reads still work under a write lock");
                sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
                sqlite3_close(db);
                ok(store_team_create(st, "delta", &tb, &err) == 0,
                   "write works once the lock is gone");
        }

        store_close(st);
        st = NULL;
        store_close(NULL);

        /* reopen: no migration runs twice, data and secret persist; a wider
         * mode left on the file is narrowed */
        chmod(db_path, 0644);
        ok(store_open(db_path, &st, &err) == 0, "reopen (%s)", err.msg);
        if (!st)
                return tap_done();
        ok(file_mode(db_path) == 0600, "reopen narrows the mode to 0600");
        ok(raw_int("SELECT version FROM schema_version") == store_schema_version() &&
                   raw_int("SELECT count(*) FROM schema_version") == 1,
           "schema version unchanged by reopen");
        ok(store_master_secret(st, secret2, &err) == 0 && memcmp(secret1, secret2, 32) == 0,
           "master secret stable across reopen");
        int64_t t = 0;
        ok(store_key_lookup(st, key, &t, &err) == 0 && t == team, "key still valid after reopen");
        ok(store_team_count(st, &cnt, &err) == 0 && cnt == 4, "teams persisted");
        store_sandbox *v = NULL;
        size_t n = 0;
        ok(store_sandbox_list_live(st, &v, &n, &err) == 0 && n == 1, "live sandboxes persisted");
        store_sandbox_array_free(v, n);
        store_close(st);
        st = NULL;

        /* a database from a newer hutch is refused */
        ok(raw_int("UPDATE schema_version SET version = 999") == 1, "pretend a newer hutch wrote it");
        ok(store_open(db_path, &st, &err) == -EPROTO && st == NULL,
           "newer schema refused: EPROTO (%s)", err.msg);
        char fix[64];
        snprintf(fix, sizeof fix, "UPDATE schema_version SET version = %d", store_schema_version());
        raw_int(fix);
        ok(store_open(db_path, &st, &err) == 0, "opens again at the right version");
        store_close(st);

        char dirpath[600];
        snprintf(dirpath, sizeof dirpath, "%s/sub", dir);
        mkdir(dirpath, 0700);
        ok(store_open(dirpath, &st, &err) < 0, "a directory is refused (%s)", err.msg);

        rm_rf_at(AT_FDCWD, dir);
        return tap_done();
}
