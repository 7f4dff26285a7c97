/* SPDX-License-Identifier: Apache-2.0 */
/* The store against a real database in a temporary directory: migrations,
 * keys, sandboxes, templates, events, the master secret, file modes, secrets.
 * SQLite is opened directly only to look behind the store's back. */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store.h"
#include "tap.h"
#include "util/fsutil.h"
#include "util/macro.h"

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

/* The raw value blob of a team's live secret (malloc'ed), or NULL. */
static uint8_t *raw_value(int64_t team, const char *name, size_t *ret_len) {
        sqlite3 *db = NULL;
        sqlite3_stmt *s = NULL;
        uint8_t *v = NULL;
        if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK &&
            sqlite3_prepare_v2(db, "SELECT value FROM secrets WHERE team_id = ?1 AND name = ?2 AND deleted_ms = 0",
                               -1, &s, NULL) == SQLITE_OK &&
            sqlite3_bind_int64(s, 1, team) == SQLITE_OK &&
            sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW &&
            sqlite3_column_type(s, 0) == SQLITE_BLOB) {
                size_t n = (size_t) sqlite3_column_bytes(s, 0);
                v = malloc(n ? n : 1);
                if (v) {
                        memcpy(v, sqlite3_column_blob(s, 0), n);
                        *ret_len = n;
                }
        }
        sqlite3_finalize(s);
        sqlite3_close(db);
        return v;
}

/* Overwrite the value blob of a team's live secret behind the store's back
 * (NULL stores SQL NULL). */
static bool raw_set_value(int64_t team, const char *name, const uint8_t *v, size_t len) {
        sqlite3 *db = NULL;
        sqlite3_stmt *s = NULL;
        bool done = false;
        if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK &&
            sqlite3_prepare_v2(db, "UPDATE secrets SET value = ?3 WHERE team_id = ?1 AND name = ?2 AND deleted_ms = 0",
                               -1, &s, NULL) == SQLITE_OK &&
            sqlite3_bind_int64(s, 1, team) == SQLITE_OK &&
            sqlite3_bind_text(s, 2, name, -1, SQLITE_STATIC) == SQLITE_OK &&
            (v ? sqlite3_bind_blob(s, 3, v, (int) len, SQLITE_TRANSIENT) : sqlite3_bind_null(s, 3)) == SQLITE_OK &&
            sqlite3_step(s) == SQLITE_DONE)
                done = sqlite3_changes(db) == 1;
        sqlite3_finalize(s);
        sqlite3_close(db);
        return done;
}

/* Whether the file at db_path + suffix holds these bytes anywhere. */
static bool file_holds(const char *suffix, const void *needle, size_t len) {
        char p[600];
        snprintf(p, sizeof p, "%s%s", db_path, suffix);
        FILE *f = fopen(p, "rbe");
        if (!f)
                return false;
        size_t cap = 1 << 20, n = 0, k;
        char *buf = malloc(cap);
        while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
                n += k;
                if (n == cap) {
                        char *b = realloc(buf, cap * 2);
                        if (!b)
                                break;
                        buf = b;
                        cap *= 2;
                }
        }
        fclose(f);
        bool found = buf && memmem(buf, n, needle, len) != NULL;
        free(buf);
        return found;
}

/* The plaintext is in neither the database nor its WAL. */
static bool on_disk(const char *plain) {
        return file_holds("", plain, strlen(plain)) || file_holds("-wal", plain, strlen(plain));
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

/* Retention (store-prune.c): ended rows, events and egress records older than
 * the cutoff go in batches; live rows, a live sandbox's events and rows a
 * snapshot names stay. Also the unanswered mark of creates. */
static long long wal_size(void) {
        char p[600];
        snprintf(p, sizeof p, "%s-wal", db_path);
        struct stat sb;
        return stat(p, &sb) < 0 ? -1 : (long long) sb.st_size;
}

static void test_retention(hutch_store *st, int64_t team) {
        hutch_error err = { 0 };
        store_sandbox old = sbx("rrrrrrrrrrrrrrrrrrr1", team, 100);
        store_sandbox recent = sbx("rrrrrrrrrrrrrrrrrrr2", team, 100);
        store_sandbox snapped = sbx("rrrrrrrrrrrrrrrrrrr3", team, 100);
        store_sandbox live = sbx("rrrrrrrrrrrrrrrrrrr4", team, 100);
        store_sandbox fresh = sbx("rrrrrrrrrrrrrrrrrrr5", team, 100);
        fresh.unanswered = true;
        ok(store_sandbox_insert(st, &old, &err) == 0 && store_sandbox_insert(st, &recent, &err) == 0 &&
                   store_sandbox_insert(st, &snapped, &err) == 0 && store_sandbox_insert(st, &live, &err) == 0 &&
                   store_sandbox_insert(st, &fresh, &err) == 0,
           "retention rows inserted (%s)", err.msg);

        store_sandbox g = { 0 };
        ok(store_sandbox_get(st, fresh.id, &g, &err) == 0 && g.unanswered, "an unanswered create reads back so");
        store_sandbox_clear(&g);
        ok(store_sandbox_get(st, old.id, &g, &err) == 0 && !g.unanswered, "rows are answered by default");
        store_sandbox_clear(&g);
        const char *one[] = { fresh.id }, *two[] = { fresh.id, old.id }, *nope[] = { "nope" };
        ok(store_sandbox_set_answered(st, one, 1, true, &err) == 0 &&
                   store_sandbox_get(st, fresh.id, &g, &err) == 0 && !g.unanswered,
           "marked answered");
        store_sandbox_clear(&g);
        ok(store_sandbox_set_answered(st, two, 2, false, &err) == 0 &&
                   store_sandbox_get(st, fresh.id, &g, &err) == 0 && g.unanswered,
           "two unanswered again in one transaction");
        store_sandbox_clear(&g);
        ok(store_sandbox_get(st, old.id, &g, &err) == 0 && g.unanswered, "the second one too");
        store_sandbox_clear(&g);
        ok(store_sandbox_set_answered(st, two + 1, 1, true, &err) == 0, "one answered again");
        ok(store_sandbox_set_answered(st, nope, 1, true, &err) == -ENOENT, "answered: unknown id is ENOENT");
        ok(raw_int("UPDATE sandboxes SET unanswered = 2 WHERE id = 'rrrrrrrrrrrrrrrrrrr5'") == -1,
           "the schema refuses an unanswered value other than 0 and 1");

        ok(store_sandbox_end(st, old.id, 1000, "killed", &err) == 1 &&
                   store_sandbox_end(st, recent.id, 9000, "killed", &err) == 1 &&
                   store_sandbox_end(st, snapped.id, 1000, "killed", &err) == 1 &&
                   store_sandbox_end(st, fresh.id, 1000, "create unanswered", &err) == 1,
           "ended three long ago, one recently");
        store_snapshot sn = { .team_id = team, .disk_mb = 1, .bytes = 1, .created_ms = 1 };
        snprintf(sn.id, sizeof sn.id, "snap_rrrrrrrrrrrrrrrrrrrr");
        snprintf(sn.sandbox_id, sizeof sn.sandbox_id, "%s", snapped.id);
        snprintf(sn.template_id, sizeof sn.template_id, "host");
        ok(store_snapshot_insert(st, &sn, &err) == 0, "a snapshot of one of them (%s)", err.msg);

        const char *evs[] = { old.id, old.id, live.id, snapped.id, NULL };
        for (size_t i = 0; i < ELEMENTSOF(evs); i++)
                ok(store_event_add(st, team, evs[i], "retention.test", NULL, &err) == 0, "event %zu", i);
        ok(raw_int("UPDATE events SET ts_ms = 500 WHERE kind = 'retention.test'") == 5, "events made old");
        ok(store_event_add(st, team, old.id, "retention.recent", NULL, &err) == 0, "a recent event");
        for (int i = 0; i < 3; i++) {
                store_egress e = { .team_id = team, .ts_ms = i < 2 ? 500 : 9000, .kind = (char *) "connect",
                                   .host = (char *) "example.com", .port = 443, .allowed = true };
                snprintf(e.sandbox_id, sizeof e.sandbox_id, "%s", i == 1 ? live.id : old.id);
                ok(store_egress_add(st, &e, &err) == 0, "egress record %d", i);
        }

        store_prune_counts c = { 0 }, total = { 0 };
        int calls = 0, r;
        ok(store_prune(st, 5000, 0, &c, &err) == -EINVAL, "limit 0 is EINVAL");
        while ((r = store_prune(st, 5000, 1, &c, &err)) > 0 && calls < 100) {
                ok(c.sandboxes <= 1 && c.events <= 1 && c.egress <= 1, "a batch deletes at most its limit");
                total.sandboxes += c.sandboxes;
                total.events += c.events;
                total.egress += c.egress;
                calls++;
        }
        ok(r == 0 && calls > 1, "batches until nothing is left (%d calls, last %d: %s)", calls, r, err.msg);
        ok(total.sandboxes == 2 && total.events == 4 && total.egress == 2,
           "pruned 2 rows, 4 events, 2 egress records (%lld, %lld, %lld)", (long long) total.sandboxes,
           (long long) total.events, (long long) total.egress);
        ok(store_sandbox_get(st, old.id, &g, &err) == -ENOENT && store_sandbox_get(st, fresh.id, &g, &err) == -ENOENT,
           "rows ended before the cutoff are gone");
        ok(store_sandbox_get(st, recent.id, &g, &err) == 0, "a row ended after the cutoff stays");
        store_sandbox_clear(&g);
        ok(store_sandbox_get(st, snapped.id, &g, &err) == 0, "a row a snapshot names stays");
        store_sandbox_clear(&g);
        ok(store_sandbox_get(st, live.id, &g, &err) == 0 && g.state == STORE_SBX_RUNNING, "a live row stays");
        store_sandbox_clear(&g);
        ok(raw_int("SELECT count(*) FROM events WHERE kind = 'retention.test'") == 1 &&
                   raw_int("SELECT count(*) FROM events WHERE kind = 'retention.test' AND sandbox_id = "
                           "'rrrrrrrrrrrrrrrrrrr4'") == 1,
           "old events go, except a live sandbox's");
        ok(raw_int("SELECT count(*) FROM events WHERE kind = 'retention.recent'") == 1, "recent events stay");
        ok(raw_int("SELECT count(*) FROM egress_log WHERE sandbox_id LIKE 'rrrrrrrrrrrrrrrrrrr%'") == 1 &&
                   raw_int("SELECT ts_ms FROM egress_log WHERE sandbox_id LIKE 'rrrrrrrrrrrrrrrrrrr%'") == 9000,
           "old egress records go, a live sandbox's too; recent ones stay");

        ok(wal_size() > 0, "the WAL holds pages (%lld bytes)", wal_size());
        ok(store_checkpoint(st, &err) == 0, "checkpoint (%s)", err.msg);
        ok(wal_size() == 0, "the WAL is truncated (%lld bytes)", wal_size());
        {
                /* a reader elsewhere: the checkpoint does not wait for it */
                sqlite3 *db = NULL;
                sqlite3_stmt *s = NULL;
                ok(store_event_add(st, team, NULL, "retention.wal", NULL, &err) == 0, "a write after it");
                bool reading = sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
                               sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK &&
                               sqlite3_prepare_v2(db, "SELECT count(*) FROM events", -1, &s, NULL) == SQLITE_OK &&
                               sqlite3_step(s) == SQLITE_ROW;
                ok(reading, "another connection holds a read transaction");
                ok(store_event_add(st, team, NULL, "retention.wal", NULL, &err) == 0, "a write while it reads");
                ok(store_checkpoint(st, &err) == -EBUSY, "checkpoint under a reader is EBUSY at once (%s)", err.msg);
                sqlite3_finalize(s);
                sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
                sqlite3_close(db);
                ok(store_checkpoint(st, &err) == 0 && wal_size() == 0, "and works once it is gone");
        }
        ok(raw_int("DELETE FROM events WHERE kind LIKE 'retention.%'") >= 0 &&
                   store_sandbox_end(st, live.id, 9000, "killed", &err) == 1 &&
                   store_snapshot_delete(st, team, sn.id, &err) == 0,
           "retention rows cleaned up");
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

/* ---------------------------------------------------------------- secrets */

static const uint8_t secrets_key[32] = { 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb,
                                         0xcc, 0xdd, 0xee, 0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                                         0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x12 };

#define CANARY1 "hutch-canary-plaintext-one-7f3a9c1d"
#define CANARY2 "hutch-canary-plaintext-two-b81e44a0"
#define CANARY3 "hutch-canary-plaintext-three-0c5d9e"

static bool id_wellformed(const char *id) {
        if (strlen(id) != 24 || strncmp(id, "sec_", 4) != 0)
                return false;
        for (const char *p = id + 4; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
                        return false;
        return true;
}

/* The current value is exactly want (len bytes). */
static bool value_is(hutch_store *st, int64_t team, const char *name, const void *want, size_t len) {
        hutch_error err = { 0 };
        char *v = NULL;
        size_t n = 0;
        if (store_secret_value(st, team, name, &v, &n, &err) < 0)
                return false;
        bool same = n == len && memcmp(v, want, len) == 0 && v[n] == 0;
        free(v);
        return same;
}

static int value_code(hutch_store *st, int64_t team, const char *name) {
        hutch_error err = { 0 };
        char *v = NULL;
        size_t n = 0;
        int r = store_secret_value(st, team, name, &v, &n, &err);
        free(v);
        return r;
}

/* Without store_set_secrets_key(): every call fails with ENOKEY, also for a
 * secret that exists (name). */
/* Template builds (store-build.c): templates by team and alias, builds and
 * their states, the indexed log with its level filter, tags. */
static void test_builds(hutch_store *st, int64_t team, int64_t other) {
        hutch_error err = { 0 };
        char name[128];
        ok(store_team_name(st, team, name, sizeof name, &err) == 0 && streq(name, "alpha"),
           "team name");
        store_build_template t = {
                .id = "aaaaaaaaaaaaaaaaaaaa", .team_id = team, .alias = "app", .created_ms = 5
        };
        store_build_template u = {
                .id = "bbbbbbbbbbbbbbbbbbbb", .team_id = other, .alias = "app", .created_ms = 6
        };
        store_build_template r;
        ok(store_btemplate_create(st, &t, &err) == 0 && store_btemplate_create(st, &u, &err) == 0,
           "one alias in two teams");
        ok(store_btemplate_create(st, &t, &err) < 0, "the same id twice is refused");
        ok(store_btemplate_find(st, team, "app", &r, &err) == 0 && streq(r.id, t.id),
           "found by team and alias");
        ok(store_btemplate_find(st, team, "nope", &r, &err) == -ENOENT, "unknown alias ENOENT");
        ok(store_btemplate_alias_exists(st, "app", &err) == 1 &&
                   store_btemplate_alias_exists(st, "x", &err) == 0,
           "alias exists somewhere");
        store_build b = { .id = "11111111-1111-4111-8111-111111111111",
                          .team_id = team,
                          .status = "waiting",
                          .tags_json = (char *) "[\"default\"]",
                          .cpu_count = 2,
                          .memory_mb = 512,
                          .created_ms = 1,
                          .updated_ms = 1 };
        snprintf(b.template_id, sizeof b.template_id, "%s", t.id);
        store_build old = b;
        snprintf(old.id, sizeof old.id, "00000000-0000-4000-8000-000000000000");
        ok(store_build_insert(st, &old, &err) == 0 && store_build_insert(st, &b, &err) == 0,
           "two builds");
        ok(store_build_supersede(st, t.id, b.id, &err) == 0, "supersede");
        store_build g = { 0 };
        ok(store_build_get(st, old.id, &g, &err) == 0 && streq(g.status, "error") &&
                   strstr(g.reason, "superseded"),
           "the older waiting build is superseded");
        store_build_clear(&g);
        ok(store_build_get(st, b.id, &g, &err) == 0 && streq(g.status, "waiting") &&
                   g.cpu_count == 2 && g.memory_mb == 512 && streq(g.tags_json, "[\"default\"]"),
           "the newer one waits, with its size and tags");
        store_build_clear(&g);
        ok(store_build_set_triggered(st, b.id, &err) == 0 &&
                   store_build_set(st, b.id, "building", NULL, NULL, NULL, &err) == 0,
           "triggered, building");
        for (int i = 0; i < 6; i++)
                ok(store_build_log_add(st, b.id, i, 100 + i, i % 4, i < 3 ? "1" : "2",
                                       i % 2 ? "odd" : "even", &err) == 0,
                   "log line %d", i);
        ok(store_build_log_add(st, b.id, 3, 0, 1, "", "again", &err) < 0,
           "a line number is written once");
        store_build_log *v = NULL;
        size_t n = 0;
        ok(store_build_logs(st, b.id, 0, 2, 3, &v, &n, &err) == 0 && n == 3 && v[0].ts_ms == 102 &&
                   streq(v[0].step, "1") && v[2].ts_ms == 104,
           "offset and limit");
        store_build_log_array_free(v, n);
        /* levels 0 1 2 3 0 1: at warn and above, lines 2 and 3; offset 1 is line 3 */
        ok(store_build_logs(st, b.id, 2, 1, 100, &v, &n, &err) == 0 && n == 1 && v[0].level == 3 &&
                   v[0].ts_ms == 103,
           "the offset counts over the level-filtered lines");
        store_build_log_array_free(v, n);
        ok(store_build_fail_unfinished(st, &err) == 1, "a restart fails the build in progress");
        ok(store_build_get(st, b.id, &g, &err) == 0 && streq(g.status, "error"), "failed");
        store_build_clear(&g);
        ok(store_build_set(st, b.id, "ready", "", "", "{\"layer\":\"abc\"}", &err) == 0, "ready");
        char **layers = NULL;
        ok(store_build_ready_layers(st, &layers, &err) == 0 && layers[0] &&
                   streq(layers[0], "abc") && !layers[1],
           "the ready builds' layers");
        for (char **p = layers; p && *p; p++)
                free(*p);
        free(layers);
        char bid[40];
        ok(store_build_tag_set(st, t.id, "default", b.id, &err) == 0 &&
                   store_build_tag_set(st, t.id, "v1", old.id, &err) == 0 &&
                   store_build_tag_set(st, t.id, "v1", b.id, &err) == 0,
           "tags set, one moved");
        ok(store_build_tag_get(st, t.id, "v1", bid, &err) == 0 && streq(bid, b.id), "the moved tag");
        store_build_tag *tags = NULL;
        ok(store_build_tags(st, t.id, &tags, &n, &err) == 0 && n == 2 && streq(tags[0].tag, "default"),
           "tags listed");
        free(tags);
        ok(store_build_tag_delete(st, t.id, "v1", &err) == 0 &&
                   store_build_tag_get(st, t.id, "v1", bid, &err) == -ENOENT,
           "tag deleted");
        store_build_template *list = NULL;
        ok(store_btemplate_list(st, team, &list, &n, &err) == 0 && n == 1 && streq(list[0].id, t.id),
           "the team's templates only");
        free(list);
        ok(store_btemplate_delete(st, t.id, &err) == 0 &&
                   store_btemplate_get(st, t.id, &r, &err) == -ENOENT &&
                   store_build_get(st, b.id, &g, &err) == -ENOENT &&
                   raw_int("SELECT count(*) FROM build_logs") == 0 &&
                   raw_int("SELECT count(*) FROM build_tags") == 0,
           "delete takes builds, logs and tags");
        ok(store_btemplate_get(st, u.id, &r, &err) == 0, "the other team's template stays");
}

static void test_secrets_nokey(hutch_store *st, int64_t team, const char *name, const char *what) {
        hutch_error err = { 0 };
        store_secret s = { 0 }, *v = NULL;
        size_t n = 0;
        char *val = NULL;
        int r;

        ok(store_secret_create(st, team, "nokey", "x", 1, NULL, NULL, &s, &err) == -ENOKEY,
           "%s: create is ENOKEY (%s)", what, err.msg);
        r = store_secret_get(st, team, name, &s, &err);
        ok(r == -ENOKEY, "%s: get is ENOKEY (got %d)", what, r);
        if (r == 0)
                store_secret_clear(&s);
        ok(store_secret_update(st, team, name, "y", 1, NULL, NULL, &s, &err) == -ENOKEY,
           "%s: update is ENOKEY (%s)", what, err.msg);
        r = store_secret_list(st, team, NULL, 10, &v, &n, &err);
        ok(r == -ENOKEY, "%s: list is ENOKEY (got %d)", what, r);
        if (r == 0)
                store_secret_array_free(v, n);
        r = store_secret_value(st, team, name, &val, &n, &err);
        ok(r == -ENOKEY, "%s: value is ENOKEY (got %d)", what, r);
        if (r == 0)
                free(val);
        r = store_secret_delete(st, team, name, &err);
        ok(r == -ENOKEY, "%s: delete is ENOKEY (got %d)", what, r);
}

static void test_secrets(hutch_store *st, int64_t team, int64_t other) {
        hutch_error err = { 0 };
        store_secret a = { 0 }, g = { 0 }, u = { 0 }, x = { 0 };
        store_secret *v = NULL;
        size_t n = 0;

        /* create, get by id and by name */
        ok(store_secret_create(st, team, "GitHub_Token", CANARY1, strlen(CANARY1),
                               "[\"api.github.test\",\"*.githubusercontent.test\"]", "{\"owner\":\"ci\"}", &a,
                               &err) == 0,
           "secret created (%s)", err.msg);
        ok(id_wellformed(a.id), "id is sec_ + 20 [a-z0-9]: %s", a.id);
        ok(a.team_id == team && a.name && streq(a.name, "github_token") && a.version == 1,
           "name stored lowercase, version 1 (%s)", a.name ? a.name : "NULL");
        ok(a.hosts_json && streq(a.hosts_json, "[\"api.github.test\",\"*.githubusercontent.test\"]") &&
                   a.metadata_json && streq(a.metadata_json, "{\"owner\":\"ci\"}"),
           "hosts and metadata as given");
        ok(a.created_ms > 1600000000000LL && a.updated_ms == a.created_ms, "created = updated, unix ms");
        ok(store_secret_get(st, team, a.id, &g, &err) == 0 && streq(g.id, a.id) && streq(g.name, "github_token"),
           "get by id (%s)", err.msg);
        store_secret_clear(&g);
        ok(store_secret_get(st, team, "github_token", &g, &err) == 0 && streq(g.id, a.id), "get by name");
        store_secret_clear(&g);
        ok(store_secret_get(st, team, "GITHUB_Token", &g, &err) == 0 && streq(g.id, a.id),
           "get by name is case-insensitive");
        store_secret_clear(&g);
        ok(store_secret_get(st, team, "github", &g, &err) == -ENOENT, "a prefix is not a name (%s)", err.msg);
        ok(store_secret_get(st, team, "sec_aaaaaaaaaaaaaaaaaaaa", &g, &err) == -ENOENT, "unknown id is ENOENT");

        /* defaults, and names */
        ok(store_secret_create(st, team, "bare", "b", 1, NULL, NULL, &x, &err) == 0 && streq(x.hosts_json, "[]") &&
                   streq(x.metadata_json, "{}"),
           "NULL hosts and metadata store [] and {} (%s)", err.msg);
        store_secret_clear(&x);
        ok(store_secret_create(st, team, "github_token", "z", 1, NULL, NULL, &x, &err) == -EEXIST,
           "duplicate name is EEXIST (%s)", err.msg);
        ok(store_secret_create(st, team, "GITHUB_TOKEN", "z", 1, NULL, NULL, &x, &err) == -EEXIST,
           "duplicate name in other case is EEXIST");
        ok(store_secret_create(st, other, "github_token", "other team", 10, NULL, NULL, &x, &err) == 0 &&
                   !streq(x.id, a.id),
           "the same name in another team is another secret (%s)", err.msg);
        store_secret_clear(&x);
        ok(store_secret_create(st, team, "", "z", 1, NULL, NULL, &x, &err) == -EINVAL, "empty name is EINVAL (%s)",
           err.msg);
        char name[200];
        memset(name, 'n', sizeof name);
        name[129] = 0;
        ok(store_secret_create(st, team, name, "z", 1, NULL, NULL, &x, &err) == -EINVAL,
           "a 129-byte name is EINVAL (%s)", err.msg);
        name[128] = 0;
        ok(store_secret_create(st, team, name, "z", 1, NULL, NULL, &x, &err) == 0, "a 128-byte name is taken (%s)",
           err.msg);
        store_secret_clear(&x);
        ok(store_secret_create(st, team, "badmeta", "z", 1, NULL, "[1]", &x, &err) == -EINVAL,
           "metadata that is not an object is EINVAL (%s)", err.msg);
        ok(store_secret_create(st, 99999, "ghost", "z", 1, NULL, NULL, &x, &err) == -ENOENT,
           "a secret for an unknown team is ENOENT (%s)", err.msg);

        /* the value */
        ok(value_is(st, team, "github_token", CANARY1, strlen(CANARY1)), "the value round-trips");
        ok(value_is(st, team, "GitHub_TOKEN", CANARY1, strlen(CANARY1)), "... looked up by name in any case");
        ok(value_is(st, team, a.id, CANARY1, strlen(CANARY1)), "... and by id");
        static const uint8_t bin[] = { 0, 1, 2, 0xff, 0, '\r', '\n', 0x80 };
        ok(store_secret_create(st, team, "binary", bin, sizeof bin, NULL, NULL, &x, &err) == 0 &&
                   value_is(st, team, "binary", bin, sizeof bin),
           "a binary value with NUL bytes round-trips (%s)", err.msg);
        store_secret_clear(&x);
        ok(store_secret_create(st, team, "empty", "", 0, NULL, NULL, &x, &err) == 0 &&
                   value_is(st, team, "empty", "", 0),
           "an empty value round-trips (%s)", err.msg);
        store_secret_clear(&x);
        ok(!on_disk(CANARY1), "the plaintext is in neither the database file nor its WAL");
        {
                size_t bl = 0;
                _cleanup_free_ uint8_t *blob = raw_value(team, "github_token", &bl);
                ok(blob && bl == 12 + strlen(CANARY1) + 16, "stored: nonce, ciphertext, tag (%zu bytes)", bl);
        }

        /* limits */
        char *big = malloc(STORE_SECRET_VALUE_MAX + 1);
        memset(big, 'v', STORE_SECRET_VALUE_MAX + 1);
        ok(store_secret_create(st, team, "toobig", big, STORE_SECRET_VALUE_MAX + 1, NULL, NULL, &x, &err) == -E2BIG,
           "a value over %d bytes is E2BIG (%s)", STORE_SECRET_VALUE_MAX, err.msg);
        ok(store_secret_get(st, team, "toobig", &x, &err) == -ENOENT, "... and nothing was stored");
        ok(store_secret_create(st, team, "max", big, STORE_SECRET_VALUE_MAX, NULL, NULL, &x, &err) == 0 &&
                   value_is(st, team, "max", big, STORE_SECRET_VALUE_MAX),
           "a value of exactly %d bytes round-trips", STORE_SECRET_VALUE_MAX);
        store_secret_clear(&x);
        ok(store_secret_update(st, team, "max", big, STORE_SECRET_VALUE_MAX + 1, NULL, NULL, &x, &err) == -E2BIG,
           "an update over %d bytes is E2BIG", STORE_SECRET_VALUE_MAX);
        free(big);

        /* update: a new version and value; NULL hosts/metadata kept */
        ok(store_secret_update(st, team, "GITHUB_TOKEN", CANARY2, strlen(CANARY2), NULL, NULL, &u, &err) == 0,
           "update (%s)", err.msg);
        ok(streq(u.id, a.id) && u.version == 2 && streq(u.name, "github_token") && u.created_ms == a.created_ms &&
                   u.updated_ms >= a.updated_ms,
           "update: same id and created, version 2 (%lld)", (long long) u.version);
        ok(streq(u.hosts_json, a.hosts_json) && streq(u.metadata_json, a.metadata_json),
           "update with NULL hosts and metadata keeps them");
        ok(value_is(st, team, "github_token", CANARY2, strlen(CANARY2)), "update changes the value");
        store_secret_clear(&u);
        ok(store_secret_update(st, team, a.id, CANARY3, strlen(CANARY3), "[\"api.github.test\"]", "{}", &u, &err) ==
                           0 &&
                   u.version == 3 && streq(u.hosts_json, "[\"api.github.test\"]") && streq(u.metadata_json, "{}"),
           "update by id replaces hosts and metadata, version 3 (%s)", err.msg);
        store_secret_clear(&u);
        ok(store_secret_update(st, team, a.id, "nope", 4, NULL, "[]", &u, &err) == -EINVAL,
           "update with metadata that is not an object is EINVAL (%s)", err.msg);
        ok(store_secret_get(st, team, a.id, &g, &err) == 0 && g.version == 3 &&
                   value_is(st, team, a.id, CANARY3, strlen(CANARY3)),
           "a refused update changes nothing (version %lld)", (long long) g.version);
        store_secret_clear(&g);
        ok(!on_disk(CANARY1) && !on_disk(CANARY2) && !on_disk(CANARY3), "no version's plaintext is on disk");
        ok(store_secret_update(st, team, "nosuch", "v", 1, NULL, NULL, &u, &err) == -ENOENT,
           "update of an unknown secret is ENOENT");

        /* list: by name, paged */
        static const char *const names[] = { "echo", "charlie", "alpha", "delta", "bravo" };
        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                ok(store_secret_create(st, team, names[i], names[i], strlen(names[i]), NULL, NULL, &x, &err) == 0,
                   "create %s", names[i]);
                store_secret_clear(&x);
        }
        ok(store_secret_list(st, team, NULL, 1000, &v, &n, &err) == 0, "list (%s)", err.msg);
        bool sorted = n > 0;
        for (size_t i = 1; i < n; i++)
                sorted &= strcmp(v[i - 1].name, v[i].name) < 0;
        bool mine = true;
        for (size_t i = 0; i < n; i++)
                mine &= v[i].team_id == team && id_wellformed(v[i].id);
        ok(sorted && mine && n == 11, "list: the team's 11 live secrets, by name (%zu)", n);
        ok(n >= 3 && streq(v[0].name, "alpha") && streq(v[1].name, "bare") && streq(v[2].name, "binary"),
           "list starts alpha, bare, binary");
        store_secret_array_free(v, n);
        ok(store_secret_list(st, team, NULL, 2, &v, &n, &err) == 0 && n == 2 && streq(v[0].name, "alpha") &&
                   streq(v[1].name, "bare"),
           "first page of 2");
        store_secret_array_free(v, n);
        ok(store_secret_list(st, team, "bare", 3, &v, &n, &err) == 0 && n == 3 && streq(v[0].name, "binary") &&
                   streq(v[1].name, "bravo") && streq(v[2].name, "charlie"),
           "next page after \"bare\"");
        store_secret_array_free(v, n);
        ok(store_secret_list(st, team, "bravo", 1, &v, &n, &err) == 0 && n == 1 && streq(v[0].name, "charlie"),
           "a page of 1 after \"bravo\"");
        store_secret_array_free(v, n);
        ok(store_secret_list(st, team, "zzz", 10, &v, &n, &err) == 0 && n == 0, "after the last: empty");
        store_secret_array_free(v, n);
        ok(store_secret_list(st, team, NULL, 0, &v, &n, &err) == -EINVAL &&
                   store_secret_list(st, team, NULL, 1001, &v, &n, &err) == -EINVAL,
           "limit 0 and 1001 are EINVAL");
        ok(store_secret_list(st, other, NULL, 10, &v, &n, &err) == 0 && n == 1 && v[0].team_id == other,
           "the other team lists only its own");
        store_secret_array_free(v, n);

        /* delete */
        store_secret c = { 0 };
        ok(store_secret_get(st, team, "charlie", &c, &err) == 0, "get charlie");
        ok(store_secret_delete(st, team, "CHARLIE", &err) == 0, "delete by name (%s)", err.msg);
        ok(store_secret_get(st, team, "charlie", &g, &err) == -ENOENT &&
                   store_secret_get(st, team, c.id, &g, &err) == -ENOENT,
           "deleted: ENOENT by name and by id");
        ok(value_code(st, team, "charlie") == -ENOENT, "deleted: no value");
        ok(store_secret_update(st, team, c.id, "v", 1, NULL, NULL, &u, &err) == -ENOENT,
           "deleted: update is ENOENT");
        ok(store_secret_delete(st, team, c.id, &err) == -ENOENT, "delete twice is ENOENT");
        ok(store_secret_list(st, team, "bravo", 1, &v, &n, &err) == 0 && n == 1 && streq(v[0].name, "delta"),
           "deleted: not listed");
        store_secret_array_free(v, n);
        {
                char q[160];
                snprintf(q, sizeof q, "SELECT count(*) FROM secrets WHERE id = '%s' AND deleted_ms > 0 AND value IS NULL",
                         c.id);
                ok(raw_int(q) == 1, "a deleted secret keeps its row, without its value");
        }
        ok(store_secret_create(st, team, "charlie", "again", 5, NULL, NULL, &x, &err) == 0 && !streq(x.id, c.id) &&
                   x.version == 1 && value_is(st, team, "charlie", "again", 5),
           "the name can be created again: a new id (%s)", err.msg);
        store_secret_clear(&x);
        store_secret_clear(&c);

        /* another team cannot reach it */
        ok(store_secret_get(st, other, a.id, &g, &err) == -ENOENT, "other team: get by id is ENOENT");
        ok(store_secret_get(st, other, "alpha", &g, &err) == -ENOENT, "other team: get by name is ENOENT");
        ok(store_secret_update(st, other, a.id, "stolen", 6, NULL, NULL, &u, &err) == -ENOENT,
           "other team: update is ENOENT");
        ok(store_secret_delete(st, other, a.id, &err) == -ENOENT && store_secret_delete(st, other, "alpha", &err) ==
                                                                           -ENOENT,
           "other team: delete is ENOENT");
        ok(value_code(st, other, a.id) == -ENOENT && value_code(st, other, "alpha") == -ENOENT,
           "other team: value is ENOENT");
        ok(value_is(st, other, "github_token", "other team", 10), "other team: its own secret of that name");
        ok(value_is(st, team, a.id, CANARY3, strlen(CANARY3)) && store_secret_get(st, team, a.id, &g, &err) == 0 &&
                   g.version == 3,
           "... and ours is untouched");
        store_secret_clear(&g);

        /* tampering behind the store's back */
        size_t al = 0, bl = 0;
        uint8_t *alpha = raw_value(team, "alpha", &al), *bravo = raw_value(team, "bravo", &bl);
        ok(alpha && bravo, "raw values read");
        ok(alpha && raw_set_value(team, "bravo", alpha, al) && value_code(st, team, "bravo") == -EBADMSG,
           "a value copied into another row does not authenticate: EBADMSG");
        ok(value_is(st, team, "alpha", "alpha", 5), "the row it came from still does");
        ok(bravo && raw_set_value(team, "bravo", bravo, bl) && value_is(st, team, "bravo", "bravo", 5),
           "restored, it authenticates again");
        {
                size_t tl = 0;
                _cleanup_free_ uint8_t *theirs = raw_value(other, "github_token", &tl);
                size_t ml = 0;
                _cleanup_free_ uint8_t *ours = raw_value(team, "github_token", &ml);
                ok(theirs && raw_set_value(team, "github_token", theirs, tl) &&
                           value_code(st, team, "github_token") == -EBADMSG,
                   "another team's value copied in does not authenticate: EBADMSG");
                ok(ours && raw_set_value(team, "github_token", ours, ml) &&
                           value_is(st, team, "github_token", CANARY3, strlen(CANARY3)),
                   "restored");
        }
        static const struct {
                const char *what;
                size_t at; /* from the start; SIZE_MAX: the last byte */
        } flips[] = { { "nonce", 0 }, { "ciphertext", 14 }, { "tag", SIZE_MAX } };
        for (size_t i = 0; bravo && i < ELEMENTSOF(flips); i++) {
                _cleanup_free_ uint8_t *t = malloc(bl);
                memcpy(t, bravo, bl);
                t[flips[i].at == SIZE_MAX ? bl - 1 : flips[i].at] ^= 0x01;
                ok(raw_set_value(team, "bravo", t, bl) && value_code(st, team, "bravo") == -EBADMSG,
                   "a flipped %s byte: EBADMSG", flips[i].what);
        }
        ok(bravo && raw_set_value(team, "bravo", bravo, bl - 1) && value_code(st, team, "bravo") == -EBADMSG,
           "a truncated value: EBADMSG");
        ok(raw_set_value(team, "bravo", bravo, 27) && value_code(st, team, "bravo") == -EBADMSG,
           "shorter than nonce + tag: EBADMSG");
        ok(raw_set_value(team, "bravo", NULL, 0) && value_code(st, team, "bravo") < 0, "no value at all: refused");
        ok(raw_set_value(team, "bravo", bravo, bl) && value_is(st, team, "bravo", "bravo", 5), "restored");
        {
                char q[160];
                snprintf(q, sizeof q, "UPDATE secrets SET version = 2 WHERE id = '%s'", a.id);
                ok(raw_int(q) == 1 && value_code(st, team, a.id) == -EBADMSG,
                   "the version rolled back: EBADMSG");
                snprintf(q, sizeof q, "UPDATE secrets SET version = 3 WHERE id = '%s'", a.id);
                ok(raw_int(q) == 1 && value_is(st, team, a.id, CANARY3, strlen(CANARY3)), "restored");
        }
        free(alpha);
        free(bravo);

        /* another handle: with another key nothing decrypts, without one
         * nothing works, with the same key everything does */
        hutch_store *st2 = NULL;
        ok(store_open(db_path, &st2, &err) == 0, "second handle (%s)", err.msg);
        if (st2) {
                test_secrets_nokey(st2, team, "bare", "a handle without the key, the secret present");
                ok(value_is(st, team, "bare", "b", 1), "the secret the keyless calls named is still there");
                uint8_t k2[32];
                memcpy(k2, secrets_key, sizeof k2);
                k2[31] ^= 0x80;
                store_set_secrets_key(st2, k2);
                ok(value_code(st2, team, "github_token") == -EBADMSG && value_code(st2, team, "alpha") == -EBADMSG,
                   "another secrets key: EBADMSG");
                store_set_secrets_key(st2, secrets_key);
                ok(value_is(st2, team, "github_token", CANARY3, strlen(CANARY3)), "the same key: the value");
                store_close(st2);
        }
        store_secret_clear(&a);
}

/* Volumes: names unique per team among live ones, team-scoped lookups, the
 * deleting mark hides a volume and frees its name. */
static void test_volumes(hutch_store *st, int64_t team, int64_t other) {
        hutch_error err = { 0 };
        store_volume v = {
                .team_id = team, .size_bytes = 1 << 20, .created_ms = 1000, .has_token_hash = true
        };
        snprintf(v.id, sizeof v.id, "11111111-1111-4111-8111-111111111111");
        snprintf(v.name, sizeof v.name, "data");
        memset(v.token_hash, 7, sizeof v.token_hash);
        ok(store_volume_insert(st, &v, &err) == 0, "insert a volume (%s)", err.msg);
        store_volume dup = v;
        snprintf(dup.id, sizeof dup.id, "22222222-2222-4222-8222-222222222222");
        ok(store_volume_insert(st, &dup, &err) == -EEXIST, "the same name twice in a team: -EEXIST");
        dup.team_id = other;
        ok(store_volume_insert(st, &dup, &err) == 0, "the same name in another team (%s)", err.msg);
        store_volume g;
        ok(store_volume_get(st, team, v.id, &g, &err) == 0 && streq(g.name, "data") &&
                   g.size_bytes == 1 << 20 && g.has_token_hash && g.token_hash[31] == 7,
           "get by id");
        ok(store_volume_get(st, other, v.id, &g, &err) == -ENOENT, "another team's id is not found");
        ok(store_volume_get(st, -1, dup.id, &g, &err) == 0 && g.team_id == other,
           "any team's with team -1");
        ok(store_volume_find(st, other, "data", &g, &err) == 0 && streq(g.id, dup.id),
           "find by name in a team");
        store_volume *list = NULL;
        size_t n = 0;
        ok(store_volume_list(st, team, &list, &n, &err) == 0 && n == 1 && streq(list[0].id, v.id),
           "list the team's");
        free(list);
        ok(store_volume_set_deleting(st, team, v.id, &err) == 0, "mark deleting");
        ok(store_volume_set_deleting(st, team, v.id, &err) == -ENOENT, "twice: -ENOENT");
        ok(store_volume_get(st, team, v.id, &g, &err) == -ENOENT &&
                   store_volume_find(st, team, "data", &g, &err) == -ENOENT,
           "a deleting volume is hidden");
        store_volume again = v;
        snprintf(again.id, sizeof again.id, "33333333-3333-4333-8333-333333333333");
        ok(store_volume_insert(st, &again, &err) == 0, "its name is free again (%s)", err.msg);
        ok(store_volume_list_deleting(st, &list, &n, &err) == 0 && n == 1 && streq(list[0].id, v.id),
           "the deleting ones are listed");
        free(list);
        ok(store_volume_delete(st, v.id, &err) == 0 &&
                   store_volume_list_deleting(st, &list, &n, &err) == 0 && n == 0,
           "and deleted");
        free(list);
}

/* store_begin/store_commit/store_rollback: the writes between them are one
 * commit (another connection sees none of them before it, all after), a
 * rollback leaves none of them, an inner level only counts, and an inner
 * rollback dooms the whole (a create's row, event and ledger row). */
static long long tx_rows(const char *id) {
        char q[256];
        snprintf(q, sizeof q,
                 "SELECT (SELECT count(*) FROM sandboxes WHERE id = '%s') * 10 +"
                 " (SELECT count(*) FROM events WHERE sandbox_id = '%s')",
                 id, id);
        return raw_int(q);
}

static void test_transactions(hutch_store *st, int64_t team) {
        hutch_error err = { 0 };
        store_sandbox g = { 0 };
        store_sandbox a = sbx("txtxtxtxtxtxtxtxtx01", team, 1);
        ok(store_begin(st, &err) == 0, "begin (%s)", err.msg);
        ok(store_sandbox_insert(st, &a, &err) == 0, "a row in the transaction");
        ok(store_event_add(st, team, a.id, "sandbox.create", NULL, &err) == 0, "an event in it");
        ok(tx_rows(a.id) == 0, "another connection sees neither before the commit");
        ok(store_commit(st, &err) == 0, "commit (%s)", err.msg);
        ok(tx_rows(a.id) == 11, "both after it");

        store_sandbox b = sbx("txtxtxtxtxtxtxtxtx02", team, 1);
        ok(store_begin(st, &err) == 0 && store_sandbox_insert(st, &b, &err) == 0 &&
                   store_event_add(st, team, b.id, "sandbox.create", NULL, &err) == 0,
           "a row and an event, then a rollback");
        store_rollback(st);
        ok(tx_rows(b.id) == 0 && store_sandbox_get(st, b.id, &g, &err) == -ENOENT,
           "a rollback leaves no row and no event");

        store_sandbox c = sbx("txtxtxtxtxtxtxtxtx03", team, 1);
        ok(store_begin(st, &err) == 0 && store_begin(st, &err) == 0, "begin twice");
        ok(store_sandbox_insert(st, &c, &err) == 0 && store_commit(st, &err) == 0,
           "the inner level commits");
        ok(tx_rows(c.id) == 0, "an inner commit commits nothing yet");
        ok(store_commit(st, &err) == 0 && tx_rows(c.id) == 10, "the outermost one does");

        store_sandbox d = sbx("txtxtxtxtxtxtxtxtx04", team, 1);
        ok(store_begin(st, &err) == 0 && store_sandbox_insert(st, &d, &err) == 0,
           "an outer level writes");
        ok(store_begin(st, &err) == 0 &&
                   store_event_add(st, team, d.id, "sandbox.create", NULL, &err) == 0,
           "an inner level writes");
        store_rollback(st);
        ok(store_commit(st, &err) == -EIO, "after an inner rollback the outer commit fails (%s)",
           err.msg);
        ok(tx_rows(d.id) == 0, "and leaves nothing of either level");

        store_sandbox e = sbx("txtxtxtxtxtxtxtxtx05", team, 1);
        ok(store_begin(st, &err) == 0 && store_sandbox_insert(st, &e, &err) == 0, "a row");
        ok(store_sandbox_insert(st, &a, &err) == -EEXIST,
           "a failing statement in the same transaction");
        store_rollback(st);
        ok(tx_rows(e.id) == 0, "its caller's rollback takes the row too");

        ok(store_commit(st, &err) == -EINVAL, "a commit with none open is EINVAL");
        store_rollback(st); /* none open: nothing */
        ok(store_sandbox_insert(st, &e, &err) == 0 && tx_rows(e.id) == 10,
           "outside a transaction a write commits on its own again");
        const char *ids[] = { a.id, c.id };
        ok(store_begin(st, &err) == 0 && store_sandbox_set_answered(st, ids, 2, false, &err) == 0,
           "set_answered of several joins an open transaction (%s)", err.msg);
        ok(raw_int("SELECT count(*) FROM sandboxes WHERE id LIKE 'txtx%' AND unanswered = 1") == 0,
           "not committed on its own");
        store_rollback(st);
        ok(store_sandbox_get(st, a.id, &g, &err) == 0 && !g.unanswered, "rolled back with it");
        store_sandbox_clear(&g);
        /* the later checks count rows and events: these go */
        ok(raw_int("DELETE FROM events WHERE sandbox_id LIKE 'txtx%'") == 1 &&
                   raw_int("DELETE FROM sandboxes WHERE id LIKE 'txtx%'") == 3,
           "the transactions' rows removed");
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
        test_transactions(st, team);
        test_templates(st, team);
        test_volumes(st, team, other);
        test_builds(st, team, other);

        test_secrets_nokey(st, team, "keyed", "no secrets key");
        store_set_secrets_key(st, secrets_key);
        test_secrets(st, team, other);

        ok(store_event_add(st, team, "ccccccccccccccccccc3", "sandbox.created",
                           "{\"template\":\"base\"}", &err) == 0,
           "event added");
        ok(store_event_add(st, 0, NULL, "daemon.started", NULL, &err) == 0,
           "event without team or sandbox");
        ok(store_event_add(st, team, NULL, "x", "[1]", &err) == -EINVAL,
           "event detail must be an object");
        ok(store_event_add(st, team, NULL, "", NULL, &err) == -EINVAL, "event kind required");
        ok(raw_int("SELECT count(*) FROM events WHERE kind NOT LIKE 'key.%'") == 2 &&
                   raw_int("SELECT count(*) FROM events WHERE sandbox_id IS NULL AND detail_json = '{}'") ==
                           1,
           "events recorded");
        /* the audit trail folds these in: which key, never the key */
        ok(raw_int("SELECT count(*) FROM events WHERE kind = 'key.create'") >= 1 &&
                   raw_int("SELECT count(*) FROM events WHERE kind = 'key.create' AND"
                           " json_extract(detail_json, '$.key_id') > 0 AND"
                           " length(json_extract(detail_json, '$.prefix')) = 12") ==
                           raw_int("SELECT count(*) FROM events WHERE kind = 'key.create'"),
           "key creations are events, with the key's id and prefix only");

        test_retention(st, team);

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
