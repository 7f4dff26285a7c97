/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Template builds the E2B way (docs/templates.md "Building", docs/api.md
 * "Templates"): the SDK's Template.build() requests a build, uploads the
 * COPY archives through a self-authorising link, triggers the build and
 * polls its status and log.
 *
 * A build runs off the loop, in a child process (`hutch template build
 * --job DIR`, cli/template-build.c) that runs every step in a hutch sandbox
 * and prints one JSON object per line: log lines, then the result. The
 * loop reads those lines from a pipe, appends them to the build's log in the
 * store and, at the end, points the build's tags at it. The child dies with
 * the daemon (PR_SET_PDEATHSIG); the next start fails the builds it left
 * and sweeps what it left on disk.
 *
 * On disk, DATA_DIR/builds/:
 *   files/<templateID>/<hash>   the uploaded COPY archives (gzip or tar)
 *   layers/<key>.layer, .json   the step cache: a layer stream and the
 *                               context after the step, by cache key
 *   jobs/<buildID>/job.json     a running build's input
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/buildspec.h"
#include "daemon/route.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "daemon/templates.h"
#include "image/pull.h"
#include "template/interp-template.h"
#include "template/template.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"

extern char **environ;

#define UPLOAD_TTL_S 1800
#define UPLOAD_MAX_BYTES (4ull << 30)
#define BUILDS_MAX_RUNNING 4
#define BUILD_LINE_MAX (256u << 10)
#define BUILD_LOG_MAX 20000 /* log lines kept per build: a step's output flood is cut there */

static const char *const level_names[] = { "debug", "info", "warn", "error" };

typedef struct build_job {
        server *srv;
        int64_t team;
        char bid[40], tid[32];
        pid_t pid;
        watcher out_w, pid_w;
        char *buf;
        size_t len;
        bool done, out_eof, exited, canceled;
        int64_t n_logs; /* lines in its log so far */
        bool log_cut;
        int status;
        struct build_job *next;
} build_job;

static build_job *jobs;

/* ----------------------------------------------------------------- paths */

static void builds_path(server *srv, char *buf, size_t n, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
static void builds_path(server *srv, char *buf, size_t n, const char *fmt, ...) {
        int k = snprintf(buf, n, "%s/builds/", srv->cfg.data_dir);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf + k, n - (size_t) k, fmt, ap);
        va_end(ap);
}

static int rm_rf_at(int dfd, const char *name) {
        int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return unlinkat(dfd, name, 0) < 0 ? -errno : 0;
        DIR *d = fdopendir(fd);
        if (!d) {
                close(fd);
                return -errno;
        }
        struct dirent *de;
        while ((de = readdir(d)))
                if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                        (void) rm_rf_at(dirfd(d), de->d_name);
        closedir(d);
        return unlinkat(dfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

static void rm_rf(const char *path) {
        (void) rm_rf_at(AT_FDCWD, path);
}

/* Files whose name starts with '.' or ends in .tmp: what a crash left. */
/* The build sandbox a builder recorded in its job dir: removed, whatever
 * state the builder left it in (killed builders leave it to us). */
static void job_sandbox_remove(server *srv, const char *jobdir) {
        char p[PATH_MAX + 16], id[HUTCH_ID_LEN + 2] = "";
        snprintf(p, sizeof p, "%s/sandbox", jobdir);
        FILE *f = fopen(p, "re");
        if (!f)
                return;
        bool ok = fgets(id, sizeof id, f) != NULL;
        fclose(f);
        if (!ok || !route_sandbox_id_valid(id))
                return;
        hutch_error e = { 0 };
        (void) hutch_sandbox_remove(srv->ctx, id, &e);
}

static unsigned sweep_tmp(const char *dir, bool recurse) {
        DIR *d = opendir(dir);
        if (!d)
                return 0;
        unsigned n = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                const char *nm = de->d_name;
                if (streq(nm, ".") || streq(nm, ".."))
                        continue;
                size_t l = strlen(nm);
                if (nm[0] == '.' || (l > 4 && streq(nm + l - 4, ".tmp"))) {
                        if (rm_rf_at(dirfd(d), nm) == 0)
                                n++;
                } else if (recurse && de->d_type == DT_DIR) {
                        char sub[PATH_MAX];
                        snprintf(sub, sizeof sub, "%s/%s", dir, nm);
                        n += sweep_tmp(sub, false);
                }
        }
        closedir(d);
        return n;
}

static void strv_free(char **v) {
        for (char **p = v; p && *p; p++)
                free(*p);
        free(v);
}

static bool strv_has(char **v, const char *s) {
        for (; v && *v; v++)
                if (streq(*v, s))
                        return true;
        return false;
}

/* The step cache's collection: entries (<key>.json) a build of only_tid
 * made (a deleted template's), or else those unused since before_ms, go,
 * unless a ready build's result is their layer; then every <key>.layer no
 * remaining entry and no ready build names. Never while a build runs (it
 * may be about to start on a layer). Returns how many files it removed. */
static bool builds_running(void) {
        for (build_job *j = jobs; j; j = j->next)
                if (!j->exited)
                        return true;
        return false;
}

/* Deleted templates whose cache collection waits for the running builds. */
static char *gc_pending[16];

static unsigned cache_gc(server *srv, const char *only_tid, int64_t before_ms) {
        if (builds_running()) {
                for (size_t i = 0; only_tid && i < ELEMENTSOF(gc_pending); i++)
                        if (!gc_pending[i]) {
                                gc_pending[i] = strdup(only_tid);
                                break;
                        }
                return 0;
        }
        char **keep = NULL;
        hutch_error e = { 0 };
        if (store_build_ready_layers(srv->store, &keep, &e) < 0) {
                log_warning("builds: the cache collection cannot list layers: %s", e.msg);
                return 0;
        }
        char dir[PATH_MAX];
        builds_path(srv, dir, sizeof dir, "layers");
        DIR *d = opendir(dir);
        unsigned removed = 0;
        char **used = calloc(1, sizeof *used);
        size_t n_used = 0;
        if (!d || !used)
                goto out;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l != 64 + 5 || !streq(de->d_name + 64, ".json"))
                        continue;
                char p[PATH_MAX];
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                struct stat st;
                json_t *o = json_load_file(p, 0, NULL);
                const char *layer = json_string_value(json_object_get(o, "layer"));
                const char *tid = json_string_value(json_object_get(o, "templateID"));
                bool drop = stat(p, &st) == 0 &&
                        (only_tid ? tid && streq(tid, only_tid)
                                  : (int64_t) st.st_mtim.tv_sec * 1000 < before_ms) &&
                        !(layer && strv_has(keep, layer));
                if (drop && unlinkat(dirfd(d), de->d_name, 0) == 0)
                        removed++;
                else if (layer && *layer) {
                        char **nv = reallocarray(used, n_used + 2, sizeof *used);
                        if (nv) {
                                used = nv;
                                used[n_used] = strdup(layer);
                                if (used[n_used])
                                        n_used++;
                                used[n_used] = NULL;
                        }
                }
                json_decref(o);
        }
        rewinddir(d);
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l != 64 + 6 || !streq(de->d_name + 64, ".layer"))
                        continue;
                char key[65];
                snprintf(key, sizeof key, "%.64s", de->d_name);
                if (!strv_has(keep, key) && !strv_has(used, key) &&
                    unlinkat(dirfd(d), de->d_name, 0) == 0)
                        removed++;
        }
out:
        if (d)
                closedir(d);
        strv_free(used);
        strv_free(keep);
        return removed;
}

int templates_setup(server *srv) {
        static const char *const dirs[] = { "", "files", "layers", "jobs" };
        for (size_t i = 0; i < ELEMENTSOF(dirs); i++) {
                char p[PATH_MAX];
                builds_path(srv, p, sizeof p, "%s", dirs[i]);
                if (mkdir(p, 0700) < 0 && errno != EEXIST)
                        return log_error_errno(-errno, "%s: %m", p);
        }
        /* a previous daemon's builds: failed, their inputs and partial files gone */
        hutch_error err = { 0 };
        int failed = store_build_fail_unfinished(srv->store, &err);
        if (failed < 0)
                return log_error_errno(failed, "database: %s", err.msg);
        char p[PATH_MAX];
        builds_path(srv, p, sizeof p, "jobs");
        DIR *d = opendir(p);
        unsigned removed = 0;
        if (d) {
                struct dirent *de;
                while ((de = readdir(d))) {
                        if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                                continue;
                        char jd[PATH_MAX];
                        snprintf(jd, sizeof jd, "%s/%s", p, de->d_name);
                        job_sandbox_remove(srv, jd);
                        if (rm_rf_at(dirfd(d), de->d_name) == 0)
                                removed++;
                }
                closedir(d);
        }
        builds_path(srv, p, sizeof p, "layers");
        removed += sweep_tmp(p, false);
        /* step cache entries unused for two weeks */
        removed += cache_gc(srv, NULL, wall_ms() - 14ll * 24 * 3600 * 1000);
        builds_path(srv, p, sizeof p, "files");
        removed += sweep_tmp(p, true);
        if (failed > 0 || removed > 0)
                log_info("builds: %d unfinished build(s) failed, %u leftover file(s) removed",
                         failed, removed);
        return 0;
}

void templates_teardown(server *srv) {
        /* the next start fails these builds and removes their files */
        while (jobs) {
                build_job *j = jobs;
                jobs = j->next;
                if (!j->exited && j->pid > 0) {
                        kill(j->pid, SIGKILL);
                        (void) waitpid(j->pid, NULL, 0);
                }
                safe_close(j->out_w.fd);
                safe_close(j->pid_w.fd);
                free(j->buf);
                free(j);
        }
        for (size_t i = 0; i < ELEMENTSOF(gc_pending); i++) {
                free(gc_pending[i]); /* the next start's age collection has the rest */
                gc_pending[i] = NULL;
        }
}

/* ------------------------------------------------------------ utilities */

static void uuid_new(char ret[40]) {
        uint8_t b[16];
        if (RAND_bytes(b, sizeof b) != 1)
                abort();
        b[6] = (uint8_t) ((b[6] & 0x0f) | 0x40);
        b[8] = (uint8_t) ((b[8] & 0x3f) | 0x80);
        snprintf(ret, 40, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                 b[13], b[14], b[15]);
}

static bool tid_valid(const char *s) {
        return route_sandbox_id_valid(s);
}

static json_t *rfc3339(int64_t ms) {
        char b[40];
        format_rfc3339(ms, b);
        return json_string(b);
}

static int team_slug(server *srv, int64_t team, char ret[128]) {
        hutch_error e = { 0 };
        if (store_team_name(srv->store, team, ret, 128, &e) < 0)
                snprintf(ret, 128, "team-%lld", (long long) team);
        return 0;
}

/* A template of the team by its ID or "[ns/]alias"; tag_ret gets the tag
 * ("" = none). -ENOENT: not the team's (or unknown); -EINVAL: bad name
 * (why says). */
static int resolve_ref(server *srv, int64_t team, const char *ref, store_build_template *ret,
                       char tag_ret[129], char *why, size_t whylen) {
        hutch_error e = { 0 };
        if (tag_ret)
                tag_ret[0] = 0;
        if (tid_valid(ref) && store_btemplate_get(srv->store, ref, ret, &e) == 0)
                return ret->team_id == team ? 0 : -ENOENT;
        tpl_name nm;
        int r = tpl_name_parse(ref, &nm, why, whylen);
        if (r < 0)
                return r;
        if (nm.ns[0]) {
                char slug[128];
                team_slug(srv, team, slug);
                if (!streq(nm.ns, slug)) {
                        snprintf(why, whylen, "template '%s' not found", ref);
                        return -ENOENT;
                }
        }
        if (store_btemplate_find(srv->store, team, nm.alias, ret, &e) < 0) {
                snprintf(why, whylen, "template '%s' not found", ref);
                return -ENOENT;
        }
        if (tag_ret)
                snprintf(tag_ret, 129, "%s", nm.tag);
        return 0;
}

int templates_resolve(server *srv, int64_t team, const char *ref, char ret_tid[32],
                      char ret_alias[64], json_t **ret_result, hutch_error *err) {
        store_build_template t;
        char tag[129], why[256];
        int r = resolve_ref(srv, team, ref, &t, tag, why, sizeof why);
        if (r < 0)
                return hutch_error_set(err, -ENOENT, "template '%s' not found", ref);
        char bid[40];
        if (store_build_tag_get(srv->store, t.id, tag[0] ? tag : "default", bid, err) < 0)
                return hutch_error_set(err, -ENOENT, "template '%s' has no ready build%s%s", ref,
                                       tag[0] ? " tagged " : "", tag);
        store_build b = { 0 };
        if ((r = store_build_get(srv->store, bid, &b, err)) < 0)
                return r;
        json_t *res = streq(b.status, "ready") ? json_loads(b.result_json, 0, NULL) : NULL;
        store_build_clear(&b);
        if (!json_is_object(res)) {
                json_decref(res);
                return hutch_error_set(err, -ENOENT, "template '%s' has no ready build", ref);
        }
        snprintf(ret_tid, 32, "%s", t.id);
        snprintf(ret_alias, 64, "%s", t.alias);
        *ret_result = res;
        return 0;
}

int templates_snapshot_base(server *srv, int64_t team, const char *template_id, char *buf, size_t n,
                            char *layer, size_t layer_n) {
        store_build_template t;
        hutch_error e = { 0 };
        if (!tid_valid(template_id) || store_btemplate_get(srv->store, template_id, &t, &e) < 0 ||
            t.team_id != team)
                return -ENOENT;
        char tid[32], alias[64];
        json_t *res = NULL;
        const char *base = NULL;
        if (layer)
                layer[0] = 0;
        if (templates_resolve(srv, team, template_id, tid, alias, &res, &e) == 0) {
                base = json_string_value(json_object_get(res, "baseTemplate"));
                const char *l = json_string_value(json_object_get(res, "layer"));
                if (layer && l && *l && templates_layer_path(srv, l, layer, layer_n) < 0)
                        layer[0] = 0;
        }
        snprintf(buf, n, "%s", base && *base ? base : "host");
        json_decref(res);
        return 0;
}

int templates_layer_path(server *srv, const char *layer, char *buf, size_t n) {
        if (!layer || !tpl_hash_valid(layer))
                return -EINVAL;
        builds_path(srv, buf, n, "layers/%s.layer", layer);
        return access(buf, R_OK) == 0 ? 0 : -ENOENT;
}

const char *templates_sbx_default(sbx *sb, const char *what) {
        const char *v = json_string_value(
                json_object_get(json_object_get(sb->extra, "template"), what));
        if (!v || !*v)
                return NULL;
        if (streq(what, "user") && !streq(v, "root") && !streq(v, "user"))
                return NULL;
        return v;
}

/* ------------------------------------------- start and ready at create */

#define START_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* The build's env (ENV values reach the start and ready commands, not the
 * sandbox's other processes), then the sandbox's own. */
static char **start_envp(sbx *sb, json_t *t, const char *user, const char *home) {
        json_t *env = json_pack("{s:s, s:s, s:s, s:s, s:s}", "PATH", START_PATH, "HOME", home,
                                "USER", user, "LOGNAME", user, "LANG", "C.UTF-8");
        json_t *benv = json_object_get(t, "env");
        const char *path = json_string_value(json_object_get(benv, "PATH"));
        if (json_is_object(benv))
                json_object_update(env, benv);
        if (path) {
                char *p = NULL;
                if (asprintf(&p, "%s:%s", path, START_PATH) >= 0)
                        json_object_set_new(env, "PATH", json_string(p));
                free(p);
        }
        if (json_is_object(sb->envs))
                json_object_update(env, sb->envs);
        char **v = calloc(json_object_size(env) + 1, sizeof *v);
        size_t i = 0;
        const char *k;
        json_t *val;
        json_object_foreach(env, k, val) {
                if (v && json_is_string(val) && *k && !strchr(k, '=') &&
                    asprintf(&v[i], "%s=%s", k, json_string_value(val)) >= 0)
                        i++;
        }
        json_decref(env);
        return v;
}

/* cmd as E2B runs a template's commands: through a login bash (an image
 * without bash: its sh), as one shell word for /bin/sh -c. */
static char *login_wrap(const char *cmd) {
        size_t n = 0;
        for (const char *p = cmd; *p; p++)
                n += *p == '\'' ? 4 : 1;
        char *q = malloc(n + 3), *o = q;
        if (!q)
                return NULL;
        *o++ = '\'';
        for (const char *p = cmd; *p; p++)
                if (*p == '\'') {
                        memcpy(o, "'\\''", 4);
                        o += 4;
                } else
                        *o++ = *p;
        *o++ = '\'';
        *o = 0;
        char *r = NULL;
        if (asprintf(&r, "if [ -x /bin/bash ]; then exec /bin/bash -l -c %s; fi; exec /bin/sh -l -c %s", q, q) < 0)
                r = NULL;
        free(q);
        return r;
}

int templates_start_spec(sbx *sb, templates_start *ret) {
        memset(ret, 0, sizeof *ret);
        json_t *t = json_object_get(sb->extra, "template");
        const char *start = json_string_value(json_object_get(t, "startCmd"));
        const char *ready = json_string_value(json_object_get(t, "readyCmd"));
        if (!start || !*start)
                return 0;
        const char *user = templates_sbx_default(sb, "user");
        const char *home;
        if (!user || user_resolve(user, &ret->user, &home) < 0)
                (void) user_resolve(user = "user", &ret->user, &home);
        const char *wd = json_string_value(json_object_get(t, "workdir"));
        ret->start = login_wrap(start);
        ret->ready = ready && *ready ? login_wrap(ready) : strdup("true");
        ret->cwd = strdup(wd && *wd ? wd : home);
        ret->envp = start_envp(sb, t, user, home);
        if (!ret->start || !ret->ready || !ret->cwd || !ret->envp) {
                templates_start_clear(ret);
                return -ENOMEM;
        }
        return 1;
}

void templates_start_clear(templates_start *s) {
        free(s->start);
        free(s->ready);
        free(s->cwd);
        if (s->envp)
                for (char **p = s->envp; *p; p++)
                        free(*p);
        free(s->envp);
        memset(s, 0, sizeof *s);
}

/* ----------------------------------------------------- POST /v3/templates */

static enum MHD_Result tpl_request(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        const char *name = json_string_value(json_object_get(body, "name"));
        if (!name || !*name)
                name = json_string_value(json_object_get(body, "alias"));
        char why[256];
        tpl_name nm;
        if (!name || tpl_name_parse(name, &nm, why, sizeof why) < 0) {
                json_decref(body);
                return http_reply_error(c, 400, "%s", name ? why : "Name is required");
        }
        char slug[128];
        team_slug(srv, req->team, slug);
        if (nm.ns[0] && !streq(nm.ns, slug)) {
                json_decref(body);
                return http_reply_error(c, 400,
                                        "Invalid name: namespace '%s' is not your team's ('%s')",
                                        nm.ns, slug);
        }
        if (streq(nm.alias, "base") || streq(nm.alias, "host")) {
                json_decref(body);
                return http_reply_error(c, 400, "Invalid name: '%s' is a built-in template",
                                        nm.alias);
        }
        json_t *tags = json_array();
        if (nm.tag[0])
                json_array_append_new(tags, json_string(nm.tag));
        /* the build sandbox's size: cpuCount >= 1, memoryMB >= 128 (2.45
         * always sends 2 and 1024), bounded by what a sandbox may have */
        json_t *jc = json_object_get(body, "cpuCount"), *jm = json_object_get(body, "memoryMB");
        if ((jc && !json_is_null(jc) &&
             (!json_is_integer(jc) || json_integer_value(jc) < 1 || json_integer_value(jc) > 64)) ||
            (jm && !json_is_null(jm) &&
             (!json_is_integer(jm) || json_integer_value(jm) < 128 ||
              json_integer_value(jm) > 65536))) {
                json_decref(tags);
                json_decref(body);
                return http_reply_error(c, 400, "cpuCount must be 1..64 and memoryMB 128..65536");
        }
        int64_t cpu = json_integer_value(jc), mem = json_integer_value(jm);
        json_t *extra = json_object_get(body, "tags");
        if (extra && !json_is_array(extra) && !json_is_null(extra)) {
                json_decref(tags);
                json_decref(body);
                return http_reply_error(c, 400, "tags must be an array of strings");
        }
        size_t i;
        json_t *v;
        json_array_foreach(extra, i, v) {
                char t[TPL_NAME_MAX + 1];
                if (!json_is_string(v) ||
                    tpl_tag_parse(json_string_value(v), t, why, sizeof why) < 0) {
                        json_decref(tags);
                        json_decref(body);
                        return http_reply_error(
                                c, 400, "%s", json_is_string(v) ? why : "Invalid tag: not a string");
                }
                bool dup = false;
                for (size_t k = 0; k < json_array_size(tags); k++)
                        dup |= streq(json_string_value(json_array_get(tags, k)), t);
                if (!dup)
                        json_array_append_new(tags, json_string(t));
        }
        json_decref(body);
        if (json_array_size(tags) > BUILD_MAX_TAGS) {
                json_decref(tags);
                return http_reply_error(c, 400, "at most %d tags", BUILD_MAX_TAGS);
        }
        if (json_array_size(tags) == 0)
                json_array_append_new(tags, json_string("default"));

        hutch_error err = { 0 };
        store_build_template t;
        if (store_btemplate_find(srv->store, req->team, nm.alias, &t, &err) < 0) {
                store_build_template other;
                if (tid_valid(nm.alias) &&
                    store_btemplate_get(srv->store, nm.alias, &other, &err) == 0) {
                        json_decref(tags);
                        return http_reply_error(c, 409, "Alias '%s' is already used", nm.alias);
                }
                memset(&t, 0, sizeof t);
                if (hutch_sandbox_id_new(t.id) < 0)
                        abort();
                t.team_id = req->team;
                snprintf(t.alias, sizeof t.alias, "%s", nm.alias);
                t.created_ms = wall_ms();
                if (store_btemplate_create(srv->store, &t, &err) < 0) {
                        json_decref(tags);
                        return http_reply_error(c, 500, "database: %s", err.msg);
                }
        }
        store_build b = { 0 };
        uuid_new(b.id);
        snprintf(b.template_id, sizeof b.template_id, "%s", t.id);
        b.team_id = req->team;
        snprintf(b.status, sizeof b.status, "waiting");
        b.tags_json = json_dumps(tags, JSON_COMPACT);
        b.cpu_count = cpu;
        b.memory_mb = mem;
        b.created_ms = b.updated_ms = wall_ms();
        int r = store_build_insert(srv->store, &b, &err);
        free(b.tags_json);
        if (r < 0) {
                json_decref(tags);
                return http_reply_error(c, 500, "database: %s", err.msg);
        }
        (void) store_build_supersede(srv->store, t.id, b.id, &err);
        char fullname[300];
        snprintf(fullname, sizeof fullname, "%s/%s", slug, t.alias);
        return http_reply_json(c, 202,
                               json_pack("{s:s, s:s, s:b, s:[s], s:[s], s:o}", "templateID", t.id,
                                         "buildID", b.id, "public", 0, "names", fullname, "aliases",
                                         t.alias, "tags", tags));
}

/* ------------------------------------------------ files and the upload */

static void upload_token(server *srv, const char *tid, const char *hash, long long expires,
                         char ret[65]) {
        uint8_t key[32];
        unsigned kl = sizeof key;
        static const char label[] = "hutch build upload v1";
        HMAC(EVP_sha256(), srv->data_key, sizeof srv->data_key, (const uint8_t *) label,
             sizeof label - 1, key, &kl);
        char msg[256];
        int n = snprintf(msg, sizeof msg, "%s/%s/%lld", tid, hash, expires);
        uint8_t mac[32];
        unsigned ml = sizeof mac;
        HMAC(EVP_sha256(), key, sizeof key, (const uint8_t *) msg, (size_t) n, mac, &ml);
        for (int i = 0; i < 32; i++)
                snprintf(ret + 2 * i, 3, "%02x", mac[i]);
}

static enum MHD_Result tpl_files(server *srv, request *req, const route *rt) {
        struct MHD_Connection *c = req->conn;
        store_build_template t;
        char why[256];
        if (resolve_ref(srv, req->team, rt->secret, &t, NULL, why, sizeof why) < 0)
                return http_reply_error(c, 404, "template '%s' not found", rt->secret);
        if (!tpl_hash_valid(rt->arg))
                return http_reply_error(c, 400, "Invalid files hash");
        char p[PATH_MAX];
        builds_path(srv, p, sizeof p, "files/%s/%s", t.id, rt->arg);
        bool present = access(p, F_OK) == 0;
        const char *host = http_header(c, "Host");
        if (!host || !*host || strlen(host) > 255 || strpbrk(host, "/?#@\\ \t\r\n"))
                return http_reply_error(c, 400, "a Host header is required");
        long long expires = (long long) time(NULL) + UPLOAD_TTL_S;
        char tok[65];
        upload_token(srv, t.id, rt->arg, expires, tok);
        char url[1024];
        snprintf(url, sizeof url, "%s://%s/upload/%s/%s?expires=%lld&token=%s",
                 streq(srv->cfg.tls_cert, "-") || !srv->cfg.tls_cert[0] ? "http" : "https", host,
                 t.id, rt->arg, expires, tok);
        return http_reply_json(c, 201, json_pack("{s:b, s:s}", "present", present, "url", url));
}

struct tpl_upload {
        int fd;
        char tmp[PATH_MAX], final[PATH_MAX];
        uint64_t expected, got;
        uint8_t head[512];
        size_t head_len;
        bool failed;
};

void templates_upload_free(struct tpl_upload *u) {
        if (!u)
                return;
        if (u->fd >= 0) {
                close(u->fd);
                unlink(u->tmp);
        }
        free(u);
}

enum MHD_Result templates_upload_begin(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        if (!streq(req->method, "PUT"))
                return http_reply_error(c, 405, "method %s not allowed on an upload link",
                                        req->method);
        const char *p = req->url + strlen("/upload/");
        char tid[32], hash[80];
        size_t tl = strcspn(p, "/");
        if (tl >= sizeof tid || !p[tl])
                return http_reply_error(c, 404, "no such upload link");
        snprintf(tid, sizeof tid, "%.*s", (int) tl, p);
        snprintf(hash, sizeof hash, "%s", p + tl + 1);
        const char *exp = http_query(c, "expires"), *tok = http_query(c, "token");
        if (!tid_valid(tid) || !tpl_hash_valid(hash) || !exp || !tok)
                return http_reply_error(c, 401, "invalid upload link");
        char *end;
        long long e = strtoll(exp, &end, 10);
        char want[65];
        upload_token(srv, tid, hash, e, want);
        if (*end || !const_time_eq(tok, want))
                return http_reply_error(c, 401, "invalid upload link");
        if (e < (long long) time(NULL))
                return http_reply_error(c, 401, "the upload link expired");
        http_conn_authenticated(req);
        const char *cl = http_header(c, "Content-Length");
        if (!cl)
                return http_reply_error(c, 411, "an upload needs a Content-Length");
        unsigned long long n = strtoull(cl, &end, 10);
        if (*end || n > UPLOAD_MAX_BYTES)
                return http_reply_error(c, 413, "an archive is at most %llu bytes",
                                        (unsigned long long) UPLOAD_MAX_BYTES);
        store_build_template t;
        hutch_error err = { 0 };
        if (store_btemplate_get(srv->store, tid, &t, &err) < 0)
                return http_reply_error(c, 404, "template '%s' not found", tid);
        char dir[PATH_MAX];
        builds_path(srv, dir, sizeof dir, "files");
        /* the archive (once) and the free space the operator keeps */
        if (!data_disk_has_room(srv, dir, n / 2 + 1))
                return http_reply_error(c, 507, "not enough free disk for an archive of %llu bytes",
                                        n);
        builds_path(srv, dir, sizeof dir, "files/%s", tid);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return http_reply_error(c, 500, "%s: %s", dir, strerror(errno));
        struct tpl_upload *u = calloc(1, sizeof *u);
        if (!u)
                return http_reply_error(c, 500, "out of memory");
        uint8_t rnd[8];
        if (RAND_bytes(rnd, sizeof rnd) != 1)
                abort();
        snprintf(u->tmp, sizeof u->tmp, "%s/.%s.%02x%02x%02x%02x%02x%02x%02x%02x.tmp", dir, hash,
                 rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
        snprintf(u->final, sizeof u->final, "%s/%s", dir, hash);
        u->expected = n;
        u->fd = open(u->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (u->fd < 0) {
                int r = errno;
                free(u);
                return http_reply_error(c, 500, "creating the archive: %s", strerror(r));
        }
        req->tpl_upload = u;
        req->body_mode = BODY_TPL_UPLOAD;
        return MHD_YES;
}

enum MHD_Result templates_upload_body(server *srv, request *req, const char *data, size_t *size) {
        struct tpl_upload *u = req->tpl_upload;
        size_t n = *size;
        *size = 0;
        if (u->failed)
                return MHD_YES;
        if (u->got + n > u->expected) {
                u->failed = true;
                return MHD_YES;
        }
        if (u->head_len < sizeof u->head) {
                size_t k = MIN(n, sizeof u->head - u->head_len);
                memcpy(u->head + u->head_len, data, k);
                u->head_len += k;
        }
        for (size_t off = 0; off < n;) {
                ssize_t w = write(u->fd, data + off, n - off);
                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        u->failed = true;
                        return MHD_YES;
                }
                off += (size_t) w;
        }
        u->got += n;
        return MHD_YES;
}

enum MHD_Result templates_upload_finish(server *srv, request *req) {
        struct tpl_upload *u = req->tpl_upload;
        req->responded = true;
        struct MHD_Connection *c = req->conn;
        bool gz = u->head_len >= 2 && u->head[0] == 0x1f && u->head[1] == 0x8b;
        bool tar = u->head_len == 512 && memcmp(u->head + 257, "ustar", 5) == 0;
        enum MHD_Result mr;
        if (u->failed || u->got != u->expected)
                mr = http_reply_error(c, 400, "the upload was cut or failed (%llu of %llu bytes)",
                                      (unsigned long long) u->got, (unsigned long long) u->expected);
        else if (!gz && !(tar && u->got % 512 == 0))
                mr = http_reply_error(c, 400, "the archive is neither gzip nor a tar");
        else if (fsync(u->fd) < 0 || rename(u->tmp, u->final) < 0)
                mr = http_reply_error(c, 500, "storing the archive: %s", strerror(errno));
        else {
                close(u->fd);
                u->fd = -1;
                mr = http_reply_empty(c, 200);
        }
        templates_upload_free(u);
        req->tpl_upload = NULL;
        return mr;
}

/* ------------------------------------------------------- running a build */

static void job_free(build_job *j) {
        for (build_job **pp = &jobs; *pp; pp = &(*pp)->next)
                if (*pp == j) {
                        *pp = j->next;
                        break;
                }
        char p[PATH_MAX];
        builds_path(j->srv, p, sizeof p, "jobs/%s", j->bid);
        job_sandbox_remove(j->srv, p);
        rm_rf(p);
        free(j->buf);
        free(j);
}

/* A template event in the store's events table, which the audit trail
 * folds into its chain (docs/audit.md): who built, pulled or deleted what. */
static void tpl_event(server *srv, int64_t team, const char *kind, json_t *detail) {
        char *d = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
        json_decref(detail);
        hutch_error e = { 0 };
        if (store_event_add(srv->store, team, NULL, kind, d ? d : "{}", &e) < 0)
                log_warning("%s: database: %s", kind, e.msg);
        free(d);
}

static void job_log(build_job *j, int level, const char *step, const char *msg) {
        hutch_error e = { 0 };
        if (store_build_log_add(j->srv->store, j->bid, j->n_logs, wall_ms(), level, step, msg, &e) < 0)
                log_warning("build %s: %s", j->bid, e.msg);
        else
                j->n_logs++;
}

static void job_finish(build_job *j, const char *status, const char *reason, const char *step,
                       json_t *result) {
        if (j->done)
                return;
        j->done = true;
        server *srv = j->srv;
        hutch_error e = { 0 };
        char *res = result ? json_dumps(result, JSON_COMPACT) : NULL;
        if (store_build_set(srv->store, j->bid, status, reason, step, res, &e) < 0)
                log_warning("build %s: %s", j->bid, e.msg);
        free(res);
        tpl_event(srv, j->team, "template.build_end",
                  json_pack("{s:s, s:s, s:s, s:s?, s:s?}", "template", j->tid, "build", j->bid, "status",
                            status, "reason", reason, "step", step && *step ? step : NULL));
        if (!streq(status, "ready"))
                return;
        store_build b = { 0 };
        if (store_build_get(srv->store, j->bid, &b, &e) < 0)
                return;
        json_t *tags = json_loads(b.tags_json, 0, NULL);
        size_t i;
        json_t *v;
        json_array_foreach(tags, i, v) {
                if (store_build_tag_set(srv->store, b.template_id, json_string_value(v), j->bid,
                                        &e) < 0)
                        log_warning("build %s: %s", j->bid, e.msg);
        }
        json_decref(tags);
        store_build_clear(&b);
}

static void job_line(build_job *j, char *line) {
        json_t *o = json_loads(line, 0, NULL);
        if (!json_is_object(o)) {
                json_decref(o);
                return;
        }
        const char *done = json_string_value(json_object_get(o, "done"));
        const char *step = json_string_value(json_object_get(o, "step"));
        const char *msg = json_string_value(json_object_get(o, "message"));
        json_t *pulled = json_object_get(o, "pulled");
        if (json_is_object(pulled)) {
                /* the builder pulled a fromImage base: what, from where, how much */
                json_t *d = json_pack("{s:s, s:s, s:O?, s:O?, s:O?, s:O?}", "template", j->tid, "build",
                                      j->bid, "ref", json_object_get(pulled, "ref"), "source",
                                      json_object_get(pulled, "source"), "image",
                                      json_object_get(pulled, "image"), "bytes_downloaded",
                                      json_object_get(pulled, "bytes_downloaded"));
                if (json_is_true(json_object_get(pulled, "credentials")))
                        json_object_set_new(d, "credentials", json_true()); /* never their values */
                metrics_template_pull(j->srv, (int64_t) json_integer_value(json_object_get(pulled, "bytes_downloaded")));
                tpl_event(j->srv, j->team, "template.pull", d);
                json_decref(o);
                return;
        }
        if (done && streq(done, "ready"))
                job_finish(j, "ready", NULL, NULL, json_object_get(o, "result"));
        else if (done)
                job_finish(j, "error", msg ? msg : "the build failed", step ? step : "", NULL);
        else if (msg) {
                const char *lv = json_string_value(json_object_get(o, "level"));
                int level = 1;
                for (int k = 0; lv && k < 4; k++)
                        if (streq(lv, level_names[k]))
                                level = k;
                /* the errors always; other lines up to the bound, then one note */
                if (j->n_logs < BUILD_LOG_MAX || level == 3)
                        job_log(j, level, step, msg);
                else if (!j->log_cut) {
                        j->log_cut = true;
                        job_log(j, 2, step, "the build log is cut here: too many lines");
                }
        }
        json_decref(o);
}

static void job_maybe_free(build_job *j) {
        if (!j->out_eof || !j->exited)
                return;
        if (!j->done) {
                char why[128];
                if (j->canceled)
                        snprintf(why, sizeof why,
                                 "The build was canceled because it was superseded by a newer one.");
                else if (WIFSIGNALED(j->status))
                        snprintf(why, sizeof why, "the builder was killed by signal %d",
                                 WTERMSIG(j->status));
                else
                        snprintf(why, sizeof why, "the builder exited with status %d",
                                 WEXITSTATUS(j->status));
                job_log(j, 3, "finalize", why);
                job_finish(j, "error", why, "finalize", NULL);
        }
        server *srv = j->srv;
        job_free(j);
        /* the collections deletes put off, now that no build runs */
        for (size_t i = 0; !builds_running() && i < ELEMENTSOF(gc_pending); i++)
                if (gc_pending[i]) {
                        char *tid = gc_pending[i];
                        gc_pending[i] = NULL;
                        (void) cache_gc(srv, tid, 0);
                        free(tid);
                }
}

static void on_job_out(server *srv, watcher *w, uint32_t revents) {
        build_job *j = w->data;
        for (;;) {
                char chunk[16384];
                ssize_t n = read(w->fd, chunk, sizeof chunk);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && errno == EAGAIN)
                        return;
                if (n <= 0) {
                        loop_del(srv, w);
                        close(w->fd);
                        w->fd = -1;
                        j->out_eof = true;
                        job_maybe_free(j);
                        return;
                }
                char *nb = realloc(j->buf, j->len + (size_t) n + 1);
                if (!nb)
                        return;
                j->buf = nb;
                memcpy(j->buf + j->len, chunk, (size_t) n);
                j->len += (size_t) n;
                j->buf[j->len] = 0;
                char *s = j->buf, *nl;
                while ((nl = memchr(s, '\n', j->len - (size_t) (s - j->buf)))) {
                        *nl = 0;
                        job_line(j, s);
                        s = nl + 1;
                }
                size_t left = j->len - (size_t) (s - j->buf);
                memmove(j->buf, s, left);
                j->len = left;
                if (j->len > BUILD_LINE_MAX)
                        j->len = 0; /* a line that long is the builder's bug: dropped */
        }
}

static void on_job_exit(server *srv, watcher *w, uint32_t revents) {
        build_job *j = w->data;
        int st;
        if (waitpid(j->pid, &st, WNOHANG) != j->pid)
                return;
        j->status = st;
        j->exited = true;
        loop_del(srv, w);
        close(w->fd);
        w->fd = -1;
        job_maybe_free(j);
}

/* The local template names an image reference may have: the reference
 * itself, and the name `hutch template pull` gives it (the repository's
 * last component, '-', the tag or "latest", or the digest's first 12). */
static void image_names(const char *ref, char names[2][64]) {
        snprintf(names[0], 64, "%s", ref);
        char r[600];
        snprintf(r, sizeof r, "%s", ref);
        const char *suffix = "latest";
        char *at = strchr(r, '@');
        char dig[16] = "";
        if (at) {
                *at = 0;
                const char *h = strchr(at + 1, ':');
                snprintf(dig, sizeof dig, "%.12s", h ? h + 1 : at + 1);
                suffix = dig;
        }
        char *slash = strrchr(r, '/');
        char *base = slash ? slash + 1 : r;
        char *colon = strchr(base, ':');
        if (colon) {
                *colon = 0;
                if (!at)
                        suffix = colon + 1;
        }
        snprintf(names[1], 64, "%s-%s", base, suffix);
        for (char *p = names[1]; *p; p++) {
                if (*p >= 'A' && *p <= 'Z')
                        *p = (char) (*p - 'A' + 'a');
                else if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' ||
                           *p == '_' || *p == '.'))
                        *p = '-';
        }
}

/* The image template tname of this host as a build's base of kind
 * "image" (named ref), or NULL when it is not there or not the team's. */
static json_t *job_image_template(server *srv, int64_t team, const char *ref, const char *tname) {
        hutch_template *t = NULL;
        hutch_error e = { 0 };
        if (template_resolve(srv->cfg.data_dir, tname, &t, &e) < 0)
                return NULL;
        /* an image template with a team is what a build's own
         * credentials pulled: a build without them never starts on
         * it (the registry is asked), whatever its team */
        if (t->team && (t->team != team || streq(t->kind ?: "", "image"))) {
                template_free(t);
                return NULL;
        }
        json_t *env = template_env_json(t);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s}", "kind", "image", "name", ref,
                              "template", tname, "version", t->version ? t->version : "", "env",
                              env, "workdir", t->workdir ? t->workdir : "");
        template_free(t);
        return o;
}

/* fromImage: an image template on this host (imported or pulled before). */
static json_t *job_image_base(server *srv, int64_t team, const char *ref) {
        char names[2][64];
        image_names(ref, names);
        for (int i = 0; i < 2; i++) {
                if (template_validate_name(names[i]) < 0 || streq(names[i], "host") ||
                    streq(names[i], "base"))
                        continue;
                json_t *o = job_image_template(srv, team, ref, names[i]);
                if (o)
                        return o;
        }
        /* not here: the builder pulls it (image_pull, off the loop) */
        return json_pack("{s:s, s:s}", "kind", "pull", "image", ref);
}

/* The base a build starts from, for the job: the host template, an image
 * template, or a built template's ready build. */
static json_t *job_base(server *srv, int64_t team, json_t *spec, char *why, size_t whylen) {
        const char *from = json_string_value(json_object_get(spec, "fromTemplate"));
        if (!from)
                return job_image_base(srv, team,
                                      json_string_value(json_object_get(spec, "fromImage")));
        if (template_names_host(srv->cfg.data_dir, from))
                return json_pack("{s:s, s:s}", "kind", "host", "name", from);
        if (streq(from, "base")) { /* the built base: an image template */
                json_t *o = job_image_template(srv, team, from, "base");
                if (o)
                        return o;
                snprintf(why, whylen, "the base template was removed during the build's start");
                return json_pack("{s:s, s:s}", "kind", "missing", "message", why);
        }
        char tid[32], alias[64];
        json_t *res = NULL;
        hutch_error e = { 0 };
        if (templates_resolve(srv, team, from, tid, alias, &res, &e) < 0) {
                snprintf(why, whylen, "%s", e.msg);
                return json_pack("{s:s, s:s}", "kind", "missing", "message", e.msg);
        }
        json_object_set_new(res, "kind", json_string("build"));
        json_object_set_new(res, "name", json_string(from));
        return res;
}

/* The build's own registry credentials go to the builder on its stdin
 * ("user\0password"), never through job.json or its argv: a pipe whose
 * buffer (64 KiB) holds them whole, written before the builder starts. */
static int cred_pipe(const build_cred *cred, int *ret_fd) {
        int cp[2];
        if (pipe2(cp, O_CLOEXEC | O_NONBLOCK) < 0)
                return -errno;
        size_t ul = strlen(cred->user), pl = strlen(cred->pass);
        struct iovec iov[3] = { { cred->user, ul }, { (char *) "", 1 }, { cred->pass, pl } };
        ssize_t w = writev(cp[1], iov, 3);
        int r = w < 0 ? -errno : (size_t) w != ul + 1 + pl ? -EMSGSIZE : 0;
        close(cp[1]);
        if (r < 0) {
                close(cp[0]);
                return r;
        }
        *ret_fd = cp[0];
        return 0;
}

static int job_spawn(server *srv, build_job *j, const char *jobdir, const build_cred *cred) {
        int pfd[2], cfd = -1;
        if (cred && cred->user) {
                int r = cred_pipe(cred, &cfd);
                if (r < 0)
                        return r;
        }
        if (pipe2(pfd, O_CLOEXEC) < 0) {
                int r = -errno;
                safe_close(cfd);
                return r;
        }
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        if (cfd >= 0)
                posix_spawn_file_actions_adddup2(&fa, cfd, STDIN_FILENO);
        else
                posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, pfd[1], STDOUT_FILENO);
        char self[32];
        snprintf(self, sizeof self, "%ld", (long) getpid());
        char *const argv[] = { "hutch",         "template", "build", "--job",
                               (char *) jobdir, "--parent", self,    NULL };
        pid_t pid;
        int r = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        close(pfd[1]);
        safe_close(cfd);
        if (r != 0) {
                close(pfd[0]);
                return -r;
        }
        int pidfd = (int) syscall(SYS_pidfd_open, pid, 0);
        if (pidfd < 0) {
                r = -errno;
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                close(pfd[0]);
                return r;
        }
        (void) fcntl(pfd[0], F_SETFL, O_NONBLOCK);
        j->pid = pid;
        j->out_w.cb = on_job_out;
        j->out_w.data = j;
        j->pid_w.cb = on_job_exit;
        j->pid_w.data = j;
        loop_add(srv, &j->out_w, pfd[0], EPOLLIN);
        loop_add(srv, &j->pid_w, pidfd, EPOLLIN);
        return 0;
}

/* The build a /templates/{id}/builds/{bid} request names, with its
 * template: 0, or -1 once its 400 or 404 is queued (*ret_mr). */
static int tpl_find_build(server *srv, request *req, const route *rt, store_build_template *ret_t,
                          store_build *ret_b, enum MHD_Result *ret_mr) {
        struct MHD_Connection *c = req->conn;
        char why[256];
        hutch_error err = { 0 };
        if (!tpl_uuid_valid(rt->arg))
                *ret_mr = http_reply_error(c, 400, "Invalid build ID: %s", rt->arg);
        else if (resolve_ref(srv, req->team, rt->secret, ret_t, NULL, why, sizeof why) < 0)
                *ret_mr = http_reply_error(c, 404, "template '%s' not found", rt->secret);
        else if (store_build_get(srv->store, rt->arg, ret_b, &err) < 0 ||
                 !streq(ret_b->template_id, ret_t->id)) {
                store_build_clear(ret_b);
                *ret_mr = http_reply_error(c, 404, "build '%s' not found", rt->arg);
        } else
                return 0;
        return -1;
}

static enum MHD_Result tpl_build_start(server *srv, request *req, const route *rt) {
        struct MHD_Connection *c = req->conn;
        store_build_template t;
        store_build b = { 0 };
        enum MHD_Result mr;
        if (tpl_find_build(srv, req, rt, &t, &b, &mr) < 0)
                return mr;
        char why[512];
        hutch_error err = { 0 };
        bool waiting = streq(b.status, "waiting") && !b.triggered;
        int64_t cpu = b.cpu_count ? b.cpu_count : (int64_t) srv->cfg.cpu_count;
        int64_t mem = b.memory_mb ? b.memory_mb : (int64_t) srv->cfg.memory_mb;
        store_build_clear(&b);
        if (!waiting)
                return http_reply_error(c, 400, "build is not in waiting state");
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        json_t *spec = build_start_parse(body, why, sizeof why);
        _cleanup_(build_cred_clear) build_cred cred = { 0 };
        bool has_cred = json_object_get(body, "fromImageRegistry") != NULL;
        int cr = spec ? build_cred_parse(body, &cred, why, sizeof why) : 0;
        /* the secrets leave the request's buffers now: jansson's copy and
         * the body as it arrived */
        if (has_cred) {
                build_cred_wipe_body(body);
                explicit_bzero(req->body, req->body_len);
        }
        json_decref(body);
        if (spec && cr < 0) {
                json_decref(spec);
                spec = NULL;
        }
        if (!spec)
                return http_reply_error(c, 400, "%s", why);
        unsigned running = 0;
        for (build_job *j = jobs; j; j = j->next)
                running += !j->exited;
        /* a newer build of the same template cancels the ones in progress */
        for (build_job *j = jobs; j; j = j->next)
                if (streq(j->tid, t.id) && !j->exited && !j->canceled) {
                        j->canceled = true;
                        kill(j->pid, SIGKILL);
                        running--;
                }
        if (running >= BUILDS_MAX_RUNNING) {
                json_decref(spec);
                return http_reply_error(c, 429, "%u builds are running; try again later", running);
        }
        if (cred.user)
                /* always pulled: the registry checks the credentials, and
                 * layers the store has are not downloaded again */
                json_object_set_new(spec, "base",
                                    json_pack("{s:s, s:O, s:b, s:s?}", "kind", "pull", "image",
                                              json_object_get(spec, "fromImage"), "credentials",
                                              true, "awsRegion",
                                              cred.type == BUILD_CRED_AWS ? cred.region : NULL));
        else
                json_object_set_new(spec, "base", job_base(srv, req->team, spec, why, sizeof why));
        json_object_set_new(spec, "templateID", json_string(t.id));
        json_object_set_new(spec, "teamID", json_integer((json_int_t) req->team));
        json_object_set_new(spec, "buildID", json_string(rt->arg));
        json_object_set_new(spec, "dataDir", json_string(srv->cfg.data_dir));
        json_object_set_new(spec, "runDir", json_string(srv->cfg.run_dir));
        json_object_set_new(spec, "memoryMB", json_integer((json_int_t) mem));
        json_object_set_new(spec, "cpuCount", json_integer((json_int_t) cpu));
        /* the steps' egress: the build-egress rules under the operator's ceiling */
        json_object_set_new(spec, "egress",
                            json_pack("{s:s, s:s, s:s, s:s, s:s}", "rules", srv->cfg.build_egress,
                                      "allow", srv->cfg.egress_allow, "deny", srv->cfg.egress_deny,
                                      "open", srv->cfg.egress_open, "dns", srv->cfg.dns));
        /* fromImage: a client's reference, pulled as the daemon's own pulls
         * are (only the registries registries.conf names, its CAs) */
        image_pull_opts po;
        server_pull_opts(srv, &po);
        json_object_set_new(spec, "pull",
                            json_pack("{s:s?, s:s?, s:b}", "conf", po.conf_path, "ca", po.ca_file,
                                      "configuredOnly", po.configured_only));
        char p[PATH_MAX];
        builds_path(srv, p, sizeof p, "files/%s", t.id);
        json_object_set_new(spec, "filesDir", json_string(p));
        char jobdir[PATH_MAX], jobfile[PATH_MAX + 16];
        builds_path(srv, jobdir, sizeof jobdir, "jobs/%s", rt->arg);
        snprintf(jobfile, sizeof jobfile, "%s/job.json", jobdir);
        /* the audit's record of the build, made once it has started */
        json_t *ev = json_pack("{s:s, s:s, s:O?, s:O?, s:I}", "template", t.id, "build", rt->arg, "fromImage",
                               json_object_get(spec, "fromImage"), "fromTemplate",
                               json_object_get(spec, "fromTemplate"), "steps",
                               (json_int_t) json_array_size(json_object_get(spec, "steps")));
        if (json_is_null(json_object_get(ev, "fromImage")))
                json_object_del(ev, "fromImage");
        if (json_is_null(json_object_get(ev, "fromTemplate")))
                json_object_del(ev, "fromTemplate");
        if (cred.type != BUILD_CRED_NONE) /* that they were given, never what */
                json_object_set_new(ev, "credentials", json_string(build_cred_type_name(cred.type)));
        if (mkdir(jobdir, 0700) < 0 || json_dump_file(spec, jobfile, JSON_COMPACT) < 0) {
                int e = errno;
                json_decref(spec);
                json_decref(ev);
                rm_rf(jobdir);
                return http_reply_error(c, 500, "writing the build's job: %s", strerror(e));
        }
        json_decref(spec);
        build_job *j = calloc(1, sizeof *j);
        if (!j) {
                json_decref(ev);
                rm_rf(jobdir);
                return http_reply_error(c, 500, "out of memory");
        }
        j->srv = srv;
        j->team = req->team;
        snprintf(j->bid, sizeof j->bid, "%s", rt->arg);
        snprintf(j->tid, sizeof j->tid, "%s", t.id);
        j->out_w.fd = j->pid_w.fd = -1;
        int r = job_spawn(srv, j, jobdir, &cred);
        if (r < 0) {
                json_decref(ev);
                free(j);
                rm_rf(jobdir);
                return http_reply_error(c, 500, "starting the builder: %s", strerror(-r));
        }
        j->next = jobs;
        jobs = j;
        (void) store_build_set_triggered(srv->store, rt->arg, &err);
        (void) store_build_set(srv->store, rt->arg, "building", NULL, NULL, NULL, &err);
        tpl_event(srv, req->team, "template.build", ev);
        return http_reply_empty(c, 202);
}

/* ------------------------------------------------------------- status */

static json_t *log_json(const store_build_log *l) {
        json_t *o = json_pack("{s:o, s:s, s:s}", "timestamp", rfc3339(l->ts_ms), "level",
                              level_names[l->level & 3], "message", l->message);
        if (l->step[0])
                json_object_set_new(o, "step", json_string(l->step));
        return o;
}

static enum MHD_Result tpl_build_status(server *srv, request *req, const route *rt) {
        struct MHD_Connection *c = req->conn;
        store_build_template t;
        store_build b = { 0 };
        enum MHD_Result mr;
        if (tpl_find_build(srv, req, rt, &t, &b, &mr) < 0)
                return mr;
        hutch_error err = { 0 };
        const char *qo = http_query(c, "logsOffset"), *ql = http_query(c, "limit"),
                   *qv = http_query(c, "level");
        char *end;
        long long off = 0, lim = 100;
        int level = 0;
        if (qo && *qo && ((off = strtoll(qo, &end, 10)) < 0 || *end)) {
                store_build_clear(&b);
                return http_reply_error(c, 400, "logsOffset must be a number >= 0");
        }
        if (ql && *ql && ((lim = strtoll(ql, &end, 10)) < 0 || lim > 100 || *end)) {
                store_build_clear(&b);
                return http_reply_error(c, 400, "limit must be 0..100");
        }
        if (qv && *qv) {
                level = -1;
                for (int k = 0; k < 4; k++)
                        if (streq(qv, level_names[k]))
                                level = k;
                if (level < 0) {
                        store_build_clear(&b);
                        return http_reply_error(c, 400, "level must be debug, info, warn or error");
                }
        }
        store_build_log *v = NULL;
        size_t n = 0;
        if (store_build_logs(srv->store, b.id, level, off, (unsigned) lim, &v, &n, &err) < 0) {
                store_build_clear(&b);
                return http_reply_error(c, 500, "database: %s", err.msg);
        }
        json_t *entries = json_array();
        for (size_t i = 0; i < n; i++)
                json_array_append_new(entries, log_json(&v[i]));
        json_t *o = json_pack("{s:s, s:s, s:s, s:[], s:o}", "templateID", t.id, "buildID", b.id,
                              "status", b.status, "logs", "logEntries", entries);
        if (streq(b.status, "error") && b.reason[0]) {
                json_t *reason = json_pack("{s:s}", "message", b.reason);
                if (b.reason_step[0]) {
                        json_object_set_new(reason, "step", json_string(b.reason_step));
                        json_t *mine = json_array();
                        for (size_t i = 0; i < n; i++)
                                if (v[i].level >= 2 && streq(v[i].step, b.reason_step))
                                        json_array_append_new(mine, log_json(&v[i]));
                        json_object_set_new(reason, "logEntries", mine);
                }
                json_object_set_new(o, "reason", reason);
        }
        store_build_log_array_free(v, n);
        store_build_clear(&b);
        return http_reply_json(c, 200, o);
}

/* ------------------------------------------------------ aliases and tags */

/* Whether name is a template that a create of this team starts without a
 * build of its own: what sbx_create() accepts besides built templates and
 * snapshots. The host template is never built here (template_resolve() would). */
static bool tpl_alias_builtin(server *srv, int64_t team, const char *name) {
        if (template_names_host(srv->cfg.data_dir, name) || template_is_interp(name))
                return true;
        if (template_validate_name(name) < 0)
                return false;
        hutch_template *t = NULL;
        hutch_error err = { 0 };
        if (template_resolve(srv->cfg.data_dir, name, &t, &err) < 0)
                return false;
        bool ok = !t->team || t->team == team;
        template_free(t);
        return ok;
}

static enum MHD_Result tpl_alias(server *srv, request *req, const route *rt) {
        struct MHD_Connection *c = req->conn;
        tpl_name nm;
        char why[256];
        if (tpl_name_parse(rt->secret, &nm, why, sizeof why) < 0)
                return http_reply_error(c, 400, "%s", why);
        char slug[128];
        team_slug(srv, req->team, slug);
        hutch_error err = { 0 };
        store_build_template t;
        bool mine = (!nm.ns[0] || streq(nm.ns, slug)) &&
                store_btemplate_find(srv->store, req->team, nm.alias, &t, &err) == 0;
        if (!mine) {
                if (store_btemplate_alias_exists(srv->store, nm.alias, &err) == 1 && nm.ns[0] &&
                    !streq(nm.ns, slug))
                        return http_reply_error(c, 403, "template '%s' is not yours", rt->secret);
                /* a template every team may create from (base, host, the
                 * interpreter's, an imported image's) exists too, as E2B's
                 * public ones do */
                if (!nm.ns[0] && !nm.tag[0] && tpl_alias_builtin(srv, req->team, nm.alias))
                        return http_reply_json(
                                c, 200, json_pack("{s:s, s:b}", "templateID", nm.alias, "public", 1));
                return http_reply_error(c, 404, "template '%s' not found", nm.alias);
        }
        char bid[40];
        if (nm.tag[0] && store_build_tag_get(srv->store, t.id, nm.tag, bid, &err) < 0)
                return http_reply_error(c, 404, "tag '%s' does not exist for template '%s'", nm.tag,
                                        nm.alias);
        return http_reply_json(c, 200, json_pack("{s:s, s:b}", "templateID", t.id, "public", 0));
}

static enum MHD_Result tpl_tags_assign(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        const char *target = json_string_value(json_object_get(body, "target"));
        json_t *tags = json_object_get(body, "tags");
        char why[256], tag[129];
        store_build_template t;
        if (!target || !json_is_array(tags) || json_array_size(tags) == 0 ||
            json_array_size(tags) > BUILD_MAX_TAGS) {
                json_decref(body);
                return http_reply_error(c, 400, "target (name:tag) and 1 to %d tags are required",
                                        BUILD_MAX_TAGS);
        }
        int r = resolve_ref(srv, req->team, target, &t, tag, why, sizeof why);
        if (r < 0) {
                json_decref(body);
                return http_reply_error(c, r == -EINVAL ? 400 : 404, "%s", why);
        }
        char bid[40];
        hutch_error err = { 0 };
        if (store_build_tag_get(srv->store, t.id, tag[0] ? tag : "default", bid, &err) < 0) {
                json_decref(body);
                return http_reply_error(c, 404, "Template '%s' with tag '%s' not found", t.alias,
                                        tag[0] ? tag : "default");
        }
        json_t *out = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(tags, i, v) {
                char tg[TPL_NAME_MAX + 1];
                if (!json_is_string(v) ||
                    tpl_tag_parse(json_string_value(v), tg, why, sizeof why) < 0) {
                        json_decref(out);
                        json_decref(body);
                        return http_reply_error(c, 400, "%s",
                                                json_is_string(v) ? why : "Invalid tag");
                }
                json_array_append_new(out, json_string(tg));
        }
        json_decref(body);
        json_array_foreach(out, i, v) {
                if (store_build_tag_set(srv->store, t.id, json_string_value(v), bid, &err) < 0) {
                        json_decref(out);
                        return http_reply_error(c, 500, "database: %s", err.msg);
                }
        }
        return http_reply_json(c, 201, json_pack("{s:s, s:o}", "buildID", bid, "tags", out));
}

static enum MHD_Result tpl_tags_delete(server *srv, request *req) {
        struct MHD_Connection *c = req->conn;
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        const char *name = json_string_value(json_object_get(body, "name"));
        json_t *tags = json_object_get(body, "tags");
        char why[256], tag[129];
        store_build_template t;
        if (!name || !json_is_array(tags) || json_array_size(tags) == 0) {
                json_decref(body);
                return http_reply_error(c, 400, "name and tags are required");
        }
        int r = resolve_ref(srv, req->team, name, &t, tag, why, sizeof why);
        if (r < 0 || tag[0]) {
                json_decref(body);
                return http_reply_error(c, r == -ENOENT ? 404 : 400, "%s",
                                        r < 0 ? why : "name must not contain a tag");
        }
        size_t i;
        json_t *v;
        json_array_foreach(tags, i, v) {
                char tg[TPL_NAME_MAX + 1];
                if (!json_is_string(v) ||
                    tpl_tag_parse(json_string_value(v), tg, why, sizeof why) < 0) {
                        json_decref(body);
                        return http_reply_error(c, 400, "%s",
                                                json_is_string(v) ? why : "Invalid tag");
                }
                if (streq(tg, "default")) {
                        json_decref(body);
                        return http_reply_error(c, 400, "Cannot delete the 'default' tag");
                }
        }
        hutch_error err = { 0 };
        json_array_foreach(tags, i, v) {
                char tg[TPL_NAME_MAX + 1];
                (void) tpl_tag_parse(json_string_value(v), tg, why, sizeof why);
                (void) store_build_tag_delete(srv->store, t.id, tg, &err);
        }
        json_decref(body);
        return http_reply_empty(c, 204);
}

static enum MHD_Result tpl_tags_get(server *srv, request *req, const route *rt) {
        store_build_template t;
        char why[256];
        if (resolve_ref(srv, req->team, rt->secret, &t, NULL, why, sizeof why) < 0)
                return http_reply_error(req->conn, 404, "template '%s' not found", rt->secret);
        store_build_tag *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (store_build_tags(srv->store, t.id, &v, &n, &err) < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++)
                json_array_append_new(a,
                                      json_pack("{s:s, s:s, s:o}", "tag", v[i].tag, "buildID",
                                                v[i].build_id, "createdAt", rfc3339(v[i].created_ms)));
        free(v);
        return http_reply_json(req->conn, 200, a);
}

/* ------------------------------------------------------ list, get, delete */

static json_t *tpl_json(server *srv, const store_build_template *t, const char *slug) {
        char full[300], bid[40] = "";
        snprintf(full, sizeof full, "%s/%s", slug, t->alias);
        hutch_error e = { 0 };
        (void) store_build_tag_get(srv->store, t->id, "default", bid, &e);
        store_build b = { 0 };
        bool have = bid[0] && store_build_get(srv->store, bid, &b, &e) == 0;
        json_t *o = json_pack(
                "{s:s, s:s, s:b, s:[s], s:[s], s:o, s:o, s:i, s:i, s:i, s:n, s:n, s:i, s:s, s:s}",
                "templateID", t->id, "buildID", bid, "public", 0, "aliases", t->alias, "names",
                full, "createdAt", rfc3339(t->created_ms), "updatedAt",
                rfc3339(have ? b.updated_ms : t->created_ms), "cpuCount", (int) srv->cfg.cpu_count,
                "memoryMB", (int) srv->cfg.memory_mb, "diskSizeMB", (int) srv->cfg.disk_mb,
                "createdBy", "lastSpawnedAt", "spawnCount", 0, "envdVersion", ENVD_VERSION,
                "buildStatus", have ? b.status : "waiting");
        store_build_clear(&b);
        return o;
}

static enum MHD_Result tpl_list(server *srv, request *req) {
        store_build_template *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (store_btemplate_list(srv->store, req->team, &v, &n, &err) < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        char slug[128];
        team_slug(srv, req->team, slug);
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++)
                json_array_append_new(a, tpl_json(srv, &v[i], slug));
        free(v);
        return http_reply_json(req->conn, 200, a);
}

static enum MHD_Result tpl_get(server *srv, request *req, const route *rt) {
        store_build_template t;
        char why[256];
        if (resolve_ref(srv, req->team, rt->secret, &t, NULL, why, sizeof why) < 0)
                return http_reply_error(req->conn, 404, "template '%s' not found", rt->secret);
        char slug[128];
        team_slug(srv, req->team, slug);
        json_t *o = tpl_json(srv, &t, slug);
        json_t *builds = json_array();
        char bid[40] = "";
        hutch_error e = { 0 };
        store_build b = { 0 };
        if (store_build_tag_get(srv->store, t.id, "default", bid, &e) == 0 &&
            store_build_get(srv->store, bid, &b, &e) == 0)
                json_array_append_new(builds,
                                      json_pack("{s:s, s:s, s:o, s:o}", "buildID", b.id, "status",
                                                b.status, "createdAt", rfc3339(b.created_ms),
                                                "updatedAt", rfc3339(b.updated_ms)));
        store_build_clear(&b);
        json_object_set_new(o, "builds", builds);
        return http_reply_json(req->conn, 200, o);
}

static enum MHD_Result tpl_delete(server *srv, request *req, const route *rt) {
        store_build_template t;
        char why[256];
        if (snapshot_id_valid(rt->secret) ||
            resolve_ref(srv, req->team, rt->secret, &t, NULL, why, sizeof why) < 0)
                return snapshot_delete(srv, req, rt->secret);
        for (build_job *j = jobs; j; j = j->next)
                if (streq(j->tid, t.id) && !j->exited) {
                        j->canceled = true;
                        kill(j->pid, SIGKILL);
                }
        hutch_error err = { 0 };
        if (store_btemplate_delete(srv->store, t.id, &err) < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        tpl_event(srv, req->team, "template.delete", json_pack("{s:s, s:s}", "template", t.id, "alias", t.alias));
        char p[PATH_MAX];
        builds_path(srv, p, sizeof p, "files/%s", t.id);
        rm_rf(p);
        unsigned n = cache_gc(srv, t.id, 0);
        if (n)
                log_info("builds: template %s deleted with %u step cache file(s)", t.id, n);
        return http_reply_empty(req->conn, 204);
}

enum MHD_Result templates_dispatch(server *srv, request *req, const route *rt) {
        switch (rt->kind) {
        case ROUTE_TPL_REQUEST:
                return tpl_request(srv, req);
        case ROUTE_TPL_LIST:
                return tpl_list(srv, req);
        case ROUTE_TPL_GET:
                return tpl_get(srv, req, rt);
        case ROUTE_TEMPLATE_DELETE:
                return tpl_delete(srv, req, rt);
        case ROUTE_TPL_FILES:
                return tpl_files(srv, req, rt);
        case ROUTE_TPL_BUILD_START:
                return tpl_build_start(srv, req, rt);
        case ROUTE_TPL_BUILD_STATUS:
                return tpl_build_status(srv, req, rt);
        case ROUTE_TPL_ALIAS:
                return tpl_alias(srv, req, rt);
        case ROUTE_TPL_TAGS_ASSIGN:
                return tpl_tags_assign(srv, req);
        case ROUTE_TPL_TAGS_DELETE:
                return tpl_tags_delete(srv, req);
        case ROUTE_TPL_TAGS_GET:
                return tpl_tags_get(srv, req, rt);
        default:
                return http_reply_error(req->conn, 404, "no route");
        }
}
