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

/* Run argv in the sandbox and wait for it, at most until deadline_ms
 * (wall clock). Other exits seen meanwhile go to their processes. Returns
 * its exit status (>= 0, 128+N for a signal) or -ETIMEDOUT / -errno. */
static int run_wait(server *srv, sbx *sb, const char *const *argv, const char *const *envp,
                    uid_t uid, int64_t deadline_ms, hutch_error *err) {
        hutch_spawn_config sc = {
                .argv = argv,
                .envp = envp,
                .cwd = uid ? "/home/user" : "/",
                .uid = uid,
                .gid = uid,
                .stdin_mode = HUTCH_STDIN_NULL,
        };
        hutch_process hp;
        int r = hutch_sandbox_spawn(sb->h, &sc, &hp, err);
        sbx_mark_dirty(sb);
        if (r < 0)
                return r;
        safe_close(hp.stdin_fd);
        safe_close(hp.stdout_fd);
        safe_close(hp.stderr_fd);
        for (;;) {
                int64_t left = deadline_ms - wall_ms();
                hutch_exit ex;
                if (left <= 0 || (r = hutch_sandbox_wait(sb->h, (int) left, &ex, err)) < 0) {
                        hutch_error e2 = { 0 };
                        (void) hutch_sandbox_signal(sb->h, hp.pid, SIGKILL, true, &e2);
                        return left <= 0 || r == -ETIMEDOUT ? -ETIMEDOUT : r;
                }
                if (ex.pid == hp.pid)
                        return ex.signal ? 128 + ex.signal : ex.exit_code;
                proc_on_exit(srv, sb, &ex);
        }
}

/* The interpreter's files into INTERP_SANDBOX_DIR, root's and read-only
 * to the sandbox's user. */
static int copy_interp_files(server *srv, sbx *sb, const char *dir, int64_t deadline_ms,
                             hutch_error *err) {
        static const hutch_fs_user root = { 0, 0 };
        for (const char *const *f = interp_files; *f; f++) {
                char src[PATH_MAX], dst[PATH_MAX];
                snprintf(src, sizeof src, "%s/%s", dir, *f);
                snprintf(dst, sizeof dst, "%s/%s", INTERP_SANDBOX_DIR, *f);
                _cleanup_free_ char *data = NULL;
                int r = read_file_at(AT_FDCWD, src, 8 << 20, &data);
                if (r < 0)
                        return hutch_error_set(err, r, "reading %s: %s", src, strerror(-r));
                if ((r = hutch_fs_write_buffer(sb->h, &root, dst, data, (size_t) r, err)) < 0)
                        return r;
        }
        static const char *const chmod_argv[] = { "/bin/chmod", "0755",
                                                  INTERP_SANDBOX_DIR "/hutch-interp", NULL };
        static const char *const envp[] = { "PATH=" START_PATH, NULL };
        int r = run_wait(srv, sb, chmod_argv, envp, 0, deadline_ms, err);
        if (r != 0)
                return hutch_error_set(err, r < 0 ? r : -EIO,
                                       "making the interpreter executable failed (%d)", r);
        return 0;
}

int sbx_start_commands(server *srv, sbx *sb, const char *template_name, hutch_error *err) {
        if (!template_is_interp(template_name))
                return 0;
        hutch_template *t = NULL;
        int r = template_resolve(srv->cfg.data_dir, template_name, &t, err);
        if (r < 0)
                return r;
        int64_t t0 = wall_ms(), deadline = t0 + (int64_t) srv->cfg.ready_timeout_s * 1000;
        char dir[PATH_MAX];
        if (interp_host_dir(dir, sizeof dir) == 0 && !interp_dir_visible(dir) &&
            (r = copy_interp_files(srv, sb, dir, deadline, err)) < 0)
                goto out;
        char **envp = start_env(srv, sb);
        if (!envp) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        /* the start command in the background: its output to a log in /tmp */
        _cleanup_free_ char *start = NULL;
        if (asprintf(&start, "exec </dev/null >>/tmp/.hutch-start.log 2>&1; %s", t->start_cmd) < 0) {
                strv_free(envp);
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        const char *sargv[] = { "/bin/sh", "-c", start, NULL };
        hutch_spawn_config sc = {
                .argv = sargv,
                .envp = (const char *const *) envp,
                .cwd = "/home/user",
                .uid = 1000,
                .gid = 1000,
                .stdin_mode = HUTCH_STDIN_NULL,
                .tag = "start_cmd",
        };
        hutch_process hp;
        r = hutch_sandbox_spawn(sb->h, &sc, &hp, err);
        sbx_mark_dirty(sb);
        if (r < 0) {
                strv_free(envp);
                hutch_error_wrap(err, r, "the template's start command");
                goto out;
        }
        safe_close(hp.stdin_fd);
        safe_close(hp.stdout_fd);
        safe_close(hp.stderr_fd);
        /* the ready command until it exits 0 */
        int last = -1;
        if (t->ready_cmd && *t->ready_cmd) {
                const char *rargv[] = { "/bin/sh", "-c", t->ready_cmd, NULL };
                for (;;) {
                        hutch_error e2 = { 0 };
                        last = run_wait(srv, sb, rargv, (const char *const *) envp, 1000, deadline,
                                        &e2);
                        if (last == 0)
                                break;
                        if (last == -ETIMEDOUT || wall_ms() + READY_RETRY_MS >= deadline) {
                                strv_free(envp);
                                r = hutch_error_set(
                                        err, -ETIMEDOUT,
                                        "template '%s': its ready command did not succeed within %llu s "
                                        "(last: %s%d); see /tmp/.hutch-start.log in the sandbox",
                                        template_name, (unsigned long long) srv->cfg.ready_timeout_s,
                                        last == -ETIMEDOUT ? "still running, " : "exit status ",
                                        last == -ETIMEDOUT ? 0 : last);
                                goto out;
                        }
                        struct timespec ts = { 0, READY_RETRY_MS * 1000000L };
                        nanosleep(&ts, NULL);
                }
        }
        strv_free(envp);
        log_debug("sandbox %s: template %s ready after %lld ms", sb->id, template_name,
                  (long long) (wall_ms() - t0));
        r = 0;
out:
        template_free(t);
        return r;
}
