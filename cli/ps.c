/* SPDX-License-Identifier: Apache-2.0 */
/* hutch ps / hutch kill: the sandboxes of this host, without a daemon. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "util/log.h"
#include "util/parse.h"

int verb_ps(int argc, char **argv) {
        bool json = false;
        for (int i = 1; i < argc; i++) {
                if (streq(argv[i], "--json"))
                        json = true;
                else {
                        log_error("unknown option '%s' (usage: hutch ps [--json])", argv[i]);
                        return EXIT_USAGE;
                }
        }
        hutch_ctx *ctx;
        if (cli_ctx(&ctx) < 0)
                return EXIT_HUTCH;
        hutch_error err = { 0 };
        char **ids = NULL;
        if (hutch_sandbox_list(ctx, &ids, &err) < 0) {
                log_error("%s", err.msg);
                hutch_ctx_free(ctx);
                return EXIT_HUTCH;
        }
        if (json)
                printf("[");
        else
                printf("%-20s  %8s  %-10s  %8s  %10s  %s\n", "ID", "PID", "TEMPLATE", "AGE", "MEMORY", "STATE");
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        bool first = true;
        for (char **id = ids; *id; id++) {
                hutch_sandbox *sb;
                hutch_error e = { 0 };
                bool alive = hutch_sandbox_attach(ctx, *id, &sb, &e) >= 0;
                if (!alive) {
                        if (json)
                                printf("%s{\"id\":\"%s\",\"state\":\"dead\"}", first ? "" : ",", *id);
                        else
                                printf("%-20s  %8s  %-10s  %8s  %10s  %s\n", *id, "-", "-", "-", "-", "dead (hutch kill removes it)");
                        first = false;
                        continue;
                }
                hutch_stats st = { 0 };
                (void) hutch_sandbox_stats(sb, &st, NULL);
                /* created_ns is not public; the age comes from the init's start */
                char path[64];
                snprintf(path, sizeof path, "/proc/%d", hutch_sandbox_init_pid(sb));
                struct stat pst;
                double age = stat(path, &pst) == 0 ? difftime(now.tv_sec, pst.st_mtim.tv_sec) : 0;
                char mem[32];
                /* gvisor, paused to disk: nothing runs until its resume */
                const char *state = hutch_sandbox_is_suspended(sb) ? "suspended" : "running";
                if (json)
                        printf("%s{\"id\":\"%s\",\"state\":\"%s\",\"init_pid\":%d,\"template\":\"%s\",\"memory_bytes\":%llu,"
                               "\"backend\":\"%s\"}",
                               first ? "" : ",", *id, state, hutch_sandbox_init_pid(sb), hutch_sandbox_template(sb),
                               (unsigned long long) st.memory_current, hutch_backend_name(hutch_sandbox_backend(sb)));
                else
                        printf("%-20s  %8d  %-10s  %7.0fs  %10s  %s\n", *id, hutch_sandbox_init_pid(sb),
                               hutch_sandbox_template(sb), age, format_size(st.memory_current, mem, sizeof mem), state);
                first = false;
                hutch_sandbox_unref(sb);
        }
        if (json)
                printf("]\n");
        hutch_strv_free(ids);
        hutch_ctx_free(ctx);
        return 0;
}

int verb_kill(int argc, char **argv) {
        if (argc < 2) {
                log_error("usage: hutch kill ID...");
                return EXIT_USAGE;
        }
        hutch_ctx *ctx;
        if (cli_ctx(&ctx) < 0)
                return EXIT_HUTCH;
        int ret = 0;
        for (int i = 1; i < argc; i++) {
                hutch_error err = { 0 };
                if (hutch_sandbox_remove(ctx, argv[i], &err) < 0) {
                        log_error("%s", err.msg);
                        ret = err.code == -ENOENT ? 1 : EXIT_HUTCH;
                }
        }
        hutch_ctx_free(ctx);
        return ret;
}

int verb_gc(int argc, char **argv) {
        if (argc > 1) {
                log_error("usage: hutch gc");
                return EXIT_USAGE;
        }
        hutch_ctx *ctx;
        if (cli_ctx(&ctx) < 0)
                return EXIT_HUTCH;
        hutch_error err = { 0 };
        int r = hutch_sandbox_gc(ctx, &err);
        if (r < 0 || err.code)
                log_error("%s", err.msg);
        else
                printf("removed %d dead sandbox%s\n", r, r == 1 ? "" : "es");
        /* then the template versions the removed ones may have held */
        hutch_error e2 = { 0 };
        int t = hutch_template_gc(ctx, &e2);
        if (t < 0)
                log_error("%s", e2.msg);
        else if (t > 0)
                printf("removed %d unused template version%s\n", t, t == 1 ? "" : "s");
        hutch_ctx_free(ctx);
        return r < 0 || err.code || t < 0 ? EXIT_HUTCH : 0;
}
