/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Template start and ready commands (docs/interpreter.md "Start and ready
 * commands"): on a create from a template with a start command, the
 * daemon starts it in the background as the sandbox's user, then runs the
 * ready command until it exits 0, and only then answers the create. A
 * ready command that does not succeed before the deadline fails the
 * create; the caller kills the sandbox.
 *
 * For the code-interpreter template the interpreter's files are copied in
 * first when the sandbox cannot see them through the host's /usr (a build
 * tree: lib/template/interp-template.c).
 *
 * As built it waits on the loop (as a reboot does, sbx_cold_boot): the
 * warm sandboxes of such templates are the way to keep it off a create's
 * path (docs/design.md §9).
 */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "server.h"
#include "template/interp-template.h"
#include "template/template.h"
#include "daemon/templates.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/log.h"
#include "util/macro.h"

#define START_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define READY_RETRY_MS 50

static void strv_free(char **v) {
        if (!v)
                return;
        for (char **p = v; *p; p++)
                free(*p);
        free(v);
}

/* The start command's environment: what envd gives a command of the
 * sandbox's user, with the sandbox's envs (so runCode sees them). */
static char **start_env(server *srv, sbx *sb) {
        json_t *env = json_object();
        json_object_set_new(env, "PATH", json_string(START_PATH));
        json_object_set_new(env, "HOME", json_string("/home/user"));
        json_object_set_new(env, "USER", json_string("user"));
        json_object_set_new(env, "LOGNAME", json_string("user"));
        json_object_set_new(env, "LANG", json_string("C.UTF-8"));
        json_object_set_new(env, "E2B_SANDBOX", json_string("true"));
        json_object_set_new(env, "E2B_SANDBOX_ID", json_string(sb->id));
        json_object_set_new(env, "E2B_TEMPLATE_ID", json_string(sb->template_id));
        egress_sbx_env(srv, sb, env);
        if (json_is_object(sb->envs))
                json_object_update(env, sb->envs);
        char **v = calloc(json_object_size(env) + 1, sizeof *v);
        size_t i = 0;
        const char *k;
        json_t *val;
        json_object_foreach(env, k, val) {
                const char *s = json_string_value(val);
                if (!v || !s || !*k || strchr(k, '='))
                        continue;
                if (asprintf(&v[i], "%s=%s", k, s) < 0)
                        break;
                i++;
        }
        json_decref(env);
        return v;
}

/* ------------------------------------------------- the wait for ready */

/* A create whose answer waits for its template's ready command: the
 * connection is suspended, the ready command's exit comes as an event
 * (startcmd_on_exit), and the answer is queued when the connection is
 * resumed (http.c's deferred reply). */
typedef struct ready_wait {
        struct ready_wait *next;
        request *req;
        char sbx_id[HUTCH_ID_LEN + 1];
        char template_name[64];
        char *ready_cmd;
        char **envp;
        char *cwd;   /* the template's user and workdir run both commands */
        uid_t uid;
        gid_t gid;
        pid_t pid; /* the ready command running now, or 0 */
        int last;  /* its last exit status, -1 none yet */
        int64_t started_ms, deadline_ms, retry_ms;
} ready_wait;

static ready_wait *waits;

/* A live sandbox, claimed or in the warm pool. */
static sbx *find_any(server *srv, const char *id) {
        sbx *sb = sbx_find(srv, id);
        for (sbx *p = srv->pool; !sb && p; p = p->next)
                if (!p->dead && streq(p->id, id))
                        sb = p;
        return sb;
}

static void wait_free(ready_wait *w) {
        free(w->ready_cmd);
        strv_free(w->envp);
        free(w->cwd);
        free(w);
}

static void wait_unlink(ready_wait *w) {
        for (ready_wait **pp = &waits; *pp; pp = &(*pp)->next)
                if (*pp == w) {
                        *pp = w->next;
                        return;
                }
}

static struct MHD_Response *json_response(json_t *body) {
        char *s = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        struct MHD_Response *resp = s
                ? MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE)
                : NULL;
        if (!resp) {
                free(s);
                return NULL;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        return resp;
}

/* The answer, then the connection back to libmicrohttpd. */
static void wait_finish(server *srv, ready_wait *w, unsigned status, const char *message) {
        sbx *sb = find_any(srv, w->sbx_id);
        if (!w->req) {
                /* a pooled sandbox: ready to hand out, or gone */
                if (status == 201 && sb && !sb->dead) {
                        sb->start_pending = false;
                        sb->start_done = true;
                        log_info("warm pool: %s (%s) ready after %lld ms", sb->id, w->template_name,
                                 (long long) (wall_ms() - w->started_ms));
                } else {
                        log_warning("warm pool: %s: %s; trying again in 10 s", w->sbx_id,
                                    message ? message : "it ended while its kernels started");
                        if (sb && !sb->dead)
                                sbx_kill(srv, sb, "warm pool: not ready");
                        srv->pool_backoff_ms = wall_ms() + 10000;
                }
                wait_unlink(w);
                wait_free(w);
                return;
        }
        struct MHD_Response *resp;
        if (status == 201 && sb && !sb->dead) {
                resp = json_response(sandbox_created_json(sb));
                log_debug("sandbox %s: template %s ready after %lld ms", sb->id, w->template_name,
                          (long long) (wall_ms() - w->started_ms));
        } else {
                if (status == 201)
                        status = 500,
                        message = "the sandbox ended while its template's ready command ran";
                log_info("sandbox %s: %s", w->sbx_id, message);
                if (sb && !sb->dead)
                        sbx_kill(srv, sb, "create failed: not ready");
                resp = json_response(
                        json_pack("{s:i, s:s}", "code", (int) status, "message", message));
        }
        if (resp) {
                w->req->deferred = resp;
                w->req->deferred_status = status;
                if (status == 201)
                        sbx_create_queued(srv, w->req);
        }
        srv->resumes++;
        MHD_resume_connection(w->req->conn);
        wait_unlink(w);
        wait_free(w);
}

static void wait_fail(server *srv, ready_wait *w, const char *why) {
        char msg[512];
        snprintf(msg, sizeof msg, "template '%s': %s; see /tmp/.hutch-start.log in the sandbox",
                 w->template_name, why);
        wait_finish(srv, w, 504, msg);
}

static void ready_spawn(server *srv, sbx *sb, ready_wait *w) {
        const char *argv[] = { "/bin/sh", "-c", w->ready_cmd, NULL };
        hutch_spawn_config sc = {
                .argv = argv,
                .envp = (const char *const *) w->envp,
                .cwd = w->cwd,
                .uid = w->uid,
                .gid = w->gid,
                .stdin_mode = HUTCH_STDIN_NULL,
        };
        hutch_process hp;
        hutch_error err = { 0 };
        int r = hutch_sandbox_spawn(sb->h, &sc, &hp, &err);
        sbx_mark_dirty(sb);
        if (r < 0) {
                char why[300];
                snprintf(why, sizeof why, "its ready command could not be started: %s", err.msg);
                wait_fail(srv, w, why);
                return;
        }
        safe_close(hp.stdin_fd);
        safe_close(hp.stdout_fd);
        safe_close(hp.stderr_fd);
        w->pid = hp.pid;
}

bool startcmd_on_exit(server *srv, sbx *sb, const hutch_exit *ex) {
        for (ready_wait *w = waits; w; w = w->next) {
                if (w->pid != ex->pid || !streq(w->sbx_id, sb->id))
                        continue;
                w->pid = 0;
                w->last = ex->signal ? 128 + ex->signal : ex->exit_code;
                if (w->last == 0)
                        wait_finish(srv, w, 201, NULL);
                else
                        w->retry_ms = wall_ms() + READY_RETRY_MS;
                return true;
        }
        return false;
}

int64_t startcmd_timers(server *srv, int64_t now) {
        int64_t next = -1;
        for (ready_wait *w = waits, *n; w; w = n) {
                n = w->next;
                sbx *sb = find_any(srv, w->sbx_id);
                if (!sb || sb->dead) {
                        wait_finish(srv, w, 500,
                                    "the sandbox ended while its template's ready command ran");
                        continue;
                }
                if (now >= w->deadline_ms) {
                        char why[200];
                        if (w->pid) {
                                hutch_error e2 = { 0 };
                                (void) hutch_sandbox_signal(sb->h, w->pid, SIGKILL, true, &e2);
                        }
                        snprintf(why, sizeof why,
                                 "its ready command did not succeed within %llu s (%s %d)",
                                 (unsigned long long) srv->cfg.ready_timeout_s,
                                 w->pid ? "still running; last exit status" : "last exit status",
                                 w->last);
                        wait_fail(srv, w, why);
                        continue;
                }
                if (!w->pid && now >= w->retry_ms)
                        ready_spawn(srv, sb, w);
                int64_t due = w->pid ? w->deadline_ms : MIN(w->retry_ms, w->deadline_ms);
                if (next < 0 || due < next)
                        next = due;
        }
        return next;
}

void startcmd_stop(server *srv) {
        while (waits)
                wait_finish(srv, waits, 503, "the daemon is stopping");
}

/* Where a pooled sandbox learns the envs of the create that claimed it:
 * hutch-interp applies them to each context before its first cell. */
#define INTERP_ENVS_FILE "/run/hutch-interp/envs.json"

static int write_claim_envs(server *srv, sbx *sb, hutch_error *err) {
        static const hutch_fs_user root = { 0, 0 };
        json_t *env = json_object();
        json_object_set_new(env, "E2B_SANDBOX_ID", json_string(sb->id));
        json_object_set_new(env, "E2B_TEMPLATE_ID", json_string(sb->template_id));
        egress_sbx_env(srv, sb, env);
        if (json_is_object(sb->envs))
                json_object_update(env, sb->envs);
        char *s = json_dumps(env, JSON_COMPACT);
        json_decref(env);
        if (!s)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        int r = hutch_fs_write_buffer(sb->h, &root, INTERP_ENVS_FILE, s, strlen(s), err);
        sbx_mark_dirty(sb);
        free(s);
        return r;
}

/* The start and ready commands of sb's template: a built template's (its
 * build's result, daemon/templates.c), else the template's own (the code
 * interpreter's). 0 and the commands (malloc'ed), user and cwd. */
static int start_spec(server *srv, sbx *sb, ready_wait *w, char **ret_start, hutch_error *err) {
        templates_start ts;
        int r = templates_start_spec(sb, &ts);
        if (r < 0)
                return hutch_error_set(err, r, "out of memory");
        if (r > 0) {
                *ret_start = TAKE_PTR(ts.start);
                w->ready_cmd = TAKE_PTR(ts.ready);
                w->cwd = TAKE_PTR(ts.cwd);
                w->envp = TAKE_PTR(ts.envp);
                w->uid = ts.user.uid;
                w->gid = ts.user.gid;
                templates_start_clear(&ts);
                return 0;
        }
        hutch_template *t = NULL;
        if ((r = template_resolve(srv->cfg.data_dir, sb->template_id, &t, err)) < 0)
                return r;
        if (!t->start_cmd) {
                template_free(t);
                return hutch_error_set(err, -EINVAL, "template '%s' has no start command", sb->template_id);
        }
        *ret_start = strdup(t->start_cmd);
        w->ready_cmd = strdup(t->ready_cmd ? t->ready_cmd : "true");
        w->cwd = strdup("/home/user");
        w->envp = start_env(srv, sb);
        w->uid = w->gid = 1000;
        template_free(t);
        if (!*ret_start || !w->ready_cmd || !w->cwd || !w->envp)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        return 0;
}

bool startcmd_wanted(sbx *sb) {
        const char *s = json_string_value(json_object_get(json_object_get(sb->extra, "template"), "startCmd"));
        return template_is_interp(sb->template_id) || (s && *s);
}

/* The interpreter's files (from a build tree), then the start command in
 * the background, and a wait for its ready command (req NULL: a pooled
 * sandbox). */
static int start_begin(server *srv, sbx *sb, request *req, hutch_error *err) {
        ready_wait *w = calloc(1, sizeof *w);
        if (!w)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        int64_t now = wall_ms();
        w->req = req;
        w->last = -1;
        w->started_ms = now;
        w->deadline_ms = now + (int64_t) srv->cfg.ready_timeout_s * 1000;
        memcpy(w->sbx_id, sb->id, sizeof w->sbx_id);
        snprintf(w->template_name, sizeof w->template_name, "%s", sb->template_id);
        _cleanup_free_ char *start_cmd = NULL;
        int r = start_spec(srv, sb, w, &start_cmd, err);
        if (r >= 0 && template_is_interp(sb->template_id)) {
                r = interp_files_install(sb->h, start_cmd, (int) (w->deadline_ms - now), err);
                sbx_mark_dirty(sb);
        }
        /* A create's envs reach every context as a pooled claim's do, before
         * its first cell: the kernels inherit them anyway, but Java reads them
         * as system properties, which E2B's server sets in each context */
        if (r >= 0 && req && template_is_interp(sb->template_id) && json_object_size(sb->envs) > 0)
                r = write_claim_envs(srv, sb, err);
        _cleanup_free_ char *start = NULL;
        if (r >= 0 &&
            asprintf(&start, "exec </dev/null >>/tmp/.hutch-start.log 2>&1; %s", start_cmd) < 0)
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        if (r >= 0) {
                const char *sargv[] = { "/bin/sh", "-c", start, NULL };
                hutch_spawn_config sc = {
                        .argv = sargv,
                        .envp = (const char *const *) w->envp,
                        .cwd = w->cwd,
                        .uid = w->uid,
                        .gid = w->gid,
                        .stdin_mode = HUTCH_STDIN_NULL,
                        .tag = "start_cmd",
                        /* the code interpreter's server runs as the sandbox's
                         * user, whose `kill -9 -1` or `pkill` ends it: hutch-init
                         * starts it again, as systemd does E2B's (a built
                         * template's own start command runs once, as on E2B) */
                        .keep = template_is_interp(sb->template_id),
                };
                hutch_process hp;
                r = hutch_sandbox_spawn(sb->h, &sc, &hp, err);
                sbx_mark_dirty(sb);
                if (r >= 0) {
                        safe_close(hp.stdin_fd);
                        safe_close(hp.stdout_fd);
                        safe_close(hp.stderr_fd);
                }
        }
        if (r < 0) {
                wait_free(w);
                return r;
        }
        w->next = waits;
        waits = w;
        if (req)
                MHD_suspend_connection(req->conn);
        else
                sb->start_pending = true;
        ready_spawn(srv, sb, w); /* may finish it at once, when it cannot start */
        return 0;
}

int startcmd_pool_begin(server *srv, sbx *sb, hutch_error *err) {
        return start_begin(srv, sb, NULL, err);
}

enum MHD_Result sbx_start_answer(server *srv, request *req, sbx *sb) {
        hutch_error err = { 0 };
        int r = 0;
        /* from the warm pool: its kernels are up; it only learns the envs */
        if (sb->start_done && (r = write_claim_envs(srv, sb, &err)) >= 0) {
                enum MHD_Result mr = http_reply_json(req->conn, 201, sandbox_created_json(sb));
                if (mr == MHD_YES)
                        sbx_create_queued(srv, req);
                return mr;
        }
        if (r >= 0 && (r = start_begin(srv, sb, req, &err)) >= 0)
                return MHD_YES;
        log_error("sandbox %s: the template's start command: %s", sb->id, err.msg);
        sbx_kill(srv, sb, "create failed: start command");
        return http_reply_error(req->conn, 500, "template '%s': its start command failed: %s",
                                sb->template_id, err.msg);
}
