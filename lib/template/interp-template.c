/* SPDX-License-Identifier: Apache-2.0 */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "template/interp-template.h"
#include "template/template-internal.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/macro.h"

#ifndef HUTCH_INTERP_INSTALL_DIR
#define HUTCH_INTERP_INSTALL_DIR "/usr/local/libexec/hutch/interp"
#endif

const char *const interp_files[] = {
        "hutch-interp",
        "e2b_startup.py",
        "e2b_charts.py",
        "hutch_kernels.py",
        "jsrepl.js",
        "HutchJShell.java",
        NULL,
};

bool template_is_interp(const char *name) {
        return name &&
                (streq(name, "code-interpreter") || streq(name, "code-interpreter-v1") ||
                 streq(name, "code-interpreter-beta"));
}

static bool has_server(const char *dir) {
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/hutch-interp", dir);
        return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int interp_host_dir(char *buf, size_t n) {
        const char *env = getenv("HUTCH_INTERP_DIR");
        if (env && *env) {
                snprintf(buf, n, "%s", env);
                return has_server(buf) ? 0 : -ENOENT;
        }
        char exe[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (k > 0) {
                exe[k] = 0;
                char *s = strrchr(exe, '/');
                if (s) {
                        *s = 0;
                        s = strrchr(exe, '/');
                        if (s) {
                                *s = 0;
                                snprintf(buf, n, "%s/interp", exe); /* build/cli/hutch -> build/interp */
                                if (has_server(buf))
                                        return 0;
                        }
                }
        }
        snprintf(buf, n, "%s", HUTCH_INTERP_INSTALL_DIR);
        return has_server(buf) ? 0 : -ENOENT;
}

bool interp_dir_visible(const char *dir) {
        return startswith(dir, "/usr/");
}

static int64_t mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Run argv in the sandbox and wait for its exit: its status (128+N for a
 * signal), or -ETIMEDOUT (it is killed then). Other exits are dropped. */
static int run_wait(hutch_sandbox *sb, const char *const *argv, const char *const *envp, uid_t uid,
                    int64_t deadline_ms, hutch_error *err) {
        hutch_spawn_config sc = {
                .argv = argv,
                .envp = envp,
                .cwd = uid ? "/home/user" : "/",
                .uid = uid,
                .gid = uid,
                .stdin_mode = HUTCH_STDIN_NULL,
        };
        hutch_process hp;
        int r = hutch_sandbox_spawn(sb, &sc, &hp, err);
        if (r < 0)
                return r;
        safe_close(hp.stdin_fd);
        safe_close(hp.stdout_fd);
        safe_close(hp.stderr_fd);
        for (;;) {
                int64_t left = deadline_ms - mono_ms();
                hutch_exit ex;
                if (left <= 0 || (r = hutch_sandbox_wait(sb, (int) left, &ex, err)) < 0) {
                        hutch_error e2 = { 0 };
                        (void) hutch_sandbox_signal(sb, hp.pid, SIGKILL, true, &e2);
                        return left <= 0 || r == -ETIMEDOUT ? -ETIMEDOUT : r;
                }
                if (ex.pid == hp.pid)
                        return ex.signal ? 128 + ex.signal : ex.exit_code;
        }
}

int interp_files_install(hutch_sandbox *sb, const char *start_cmd, int timeout_ms, hutch_error *err) {
        static const hutch_fs_user root = { 0, 0 };
        char dir[PATH_MAX];
        /* the start command names where the server is: the host's directory
         * when the sandbox sees it (template_interp_resolve) */
        if (!start_cmd || !startswith(start_cmd, INTERP_SANDBOX_DIR "/"))
                return 0;
        if (interp_host_dir(dir, sizeof dir) < 0)
                return hutch_error_set(err, -ENOENT, "hutch-interp is not installed on the host");
        for (const char *const *f = interp_files; *f; f++) {
                char src[PATH_MAX], dst[PATH_MAX];
                snprintf(src, sizeof src, "%s/%s", dir, *f);
                snprintf(dst, sizeof dst, "%s/%s", INTERP_SANDBOX_DIR, *f);
                _cleanup_free_ char *data = NULL;
                int r = read_file_at(AT_FDCWD, src, 8 << 20, &data);
                if (r < 0)
                        return hutch_error_set(err, r, "reading %s: %s", src, strerror(-r));
                if ((r = hutch_fs_write_buffer(sb, &root, dst, data, (size_t) r, err)) < 0)
                        return r;
        }
        static const char *const chmod_argv[] = { "/bin/chmod", "0755",
                                                  INTERP_SANDBOX_DIR "/hutch-interp", NULL };
        static const char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        int r = run_wait(sb, chmod_argv, envp, 0, mono_ms() + timeout_ms, err);
        if (r != 0)
                return hutch_error_set(err, r < 0 ? r : -EIO,
                                       "making the interpreter executable failed (%d)", r);
        return 0;
}

int template_start_commands(hutch_sandbox *sb, const hutch_template *t, const char *const *envp,
                            int timeout_ms, hutch_error *err) {
        if (!t->start_cmd)
                return 0;
        int64_t deadline = mono_ms() + timeout_ms;
        int r = interp_files_install(sb, t->start_cmd, timeout_ms, err);
        if (r < 0)
                return r;
        _cleanup_free_ char *start = NULL;
        if (asprintf(&start, "exec </dev/null >>/tmp/.hutch-start.log 2>&1; %s", t->start_cmd) < 0)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        const char *sargv[] = { "/bin/sh", "-c", start, NULL };
        hutch_spawn_config sc = {
                .argv = sargv,
                .envp = envp,
                .cwd = "/home/user",
                .uid = 1000,
                .gid = 1000,
                .stdin_mode = HUTCH_STDIN_NULL,
                .tag = "start_cmd",
        };
        hutch_process hp;
        if ((r = hutch_sandbox_spawn(sb, &sc, &hp, err)) < 0)
                return hutch_error_wrap(err, r, "the template's start command");
        safe_close(hp.stdin_fd);
        safe_close(hp.stdout_fd);
        safe_close(hp.stderr_fd);
        if (!t->ready_cmd)
                return 0;
        const char *rargv[] = { "/bin/sh", "-c", t->ready_cmd, NULL };
        int last = -1;
        while (mono_ms() < deadline) {
                hutch_error e2 = { 0 };
                last = run_wait(sb, rargv, envp, 1000, deadline, &e2);
                if (last == 0)
                        return 0;
                struct timespec ts = { 0, 50 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        return hutch_error_set(
                err, -ETIMEDOUT,
                "template '%s': its ready command did not succeed within %d s (last exit status %d); "
                "see /tmp/.hutch-start.log in the sandbox",
                t->name, timeout_ms / 1000, last);
}

int template_interp_resolve(const char *data_dir, const char *name, hutch_template **ret,
                            hutch_error *err) {
        char dir[PATH_MAX];
        if (interp_host_dir(dir, sizeof dir) < 0)
                return hutch_error_set(
                        err, -ENOENT,
                        "template '%s': hutch-interp is not installed (looked in $HUTCH_INTERP_DIR, "
                        "next to this binary and in %s)",
                        name, HUTCH_INTERP_INSTALL_DIR);
        /* built from Debian packages (`hutch template interpreter`): its own
         * /usr, where the host's directory is not, so the server's files
         * are copied in at create; else the host template */
        char ver[8];
        bool built = template_interp_version(data_dir, ver, sizeof ver);
        hutch_template *t = NULL;
        int r;
        if (built) {
                char tpl_root[PATH_MAX];
                snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
                r = image_template_resolve(tpl_root, data_dir, "code-interpreter", &t, err);
        } else
                r = template_resolve(data_dir, "host", &t, err);
        if (r < 0)
                return r;
        const char *in = !built && interp_dir_visible(dir) ? dir : INTERP_SANDBOX_DIR;
        char *nm = strdup(name);
        if (!nm || asprintf(&t->start_cmd, "%s/hutch-interp", in) < 0 ||
            asprintf(&t->ready_cmd, "%s/hutch-interp --wait-ready --timeout 30", in) < 0) {
                free(nm);
                template_free(t);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        free(t->name);
        t->name = nm;
        *ret = t;
        return 0;
}
