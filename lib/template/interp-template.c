/* SPDX-License-Identifier: Apache-2.0 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "template/interp-template.h"
#include "template/template.h"
#include "util/error.h"
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

int template_interp_resolve(const char *data_dir, const char *name, hutch_template **ret,
                            hutch_error *err) {
        char dir[PATH_MAX];
        if (interp_host_dir(dir, sizeof dir) < 0)
                return hutch_error_set(
                        err, -ENOENT,
                        "template '%s': hutch-interp is not installed (looked in $HUTCH_INTERP_DIR, "
                        "next to this binary and in %s)",
                        name, HUTCH_INTERP_INSTALL_DIR);
        hutch_template *t = NULL;
        int r = template_resolve(data_dir, "host", &t, err);
        if (r < 0)
                return r;
        const char *in = interp_dir_visible(dir) ? dir : INTERP_SANDBOX_DIR;
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
