/* SPDX-License-Identifier: Apache-2.0 */
/* hutch ps / hutch kill: the sandboxes of this host, without a daemon. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "image/pull.h"
#include "util/log.h"
#include "util/parse.h"

static const char ps_usage[] =
        "usage: hutch ps [-a|--all] [-q|--quiet] [--json] [--filter KEY=VALUE]...\n"
        "\n"
        "Lists this host's live sandboxes: those of `hutch run` and of every daemon on\n"
        "this run dir, with who made them (OWNER). -a adds the dead ones (their init is\n"
        "gone: `hutch gc` removes them); -q prints ids only. Filters (all must match):\n"
        "state=running|suspended|dead, backend=ns|gvisor, template=NAME,\n"
        "owner=TEXT (a substring of OWNER), id=PREFIX.\n";

typedef struct ps_filter {
        const char *key, *value;
} ps_filter;

static bool ps_matches(const ps_filter *f, size_t n, const char *id, const char *state, const char *backend,
                       const char *template_name, const char *owner) {
        for (size_t i = 0; i < n; i++) {
                const char *k = f[i].key, *v = f[i].value;
                bool ok = streq(k, "state")      ? streq(state, v)
                          : streq(k, "backend")  ? streq(backend, v)
                          : streq(k, "template") ? streq(template_name, v)
                          : streq(k, "owner")    ? strstr(owner, v) != NULL
                                                 : startswith(id, v); /* id */
                if (!ok)
                        return false;
        }
        return true;
}

/* JSON string contents: the owner comes from a state file */
static void ps_json_str(const char *s) {
        for (const unsigned char *c = (const unsigned char *) s; *c; c++)
                if (*c == '"' || *c == '\\')
                        printf("\\%c", *c);
                else if (*c < 0x20 || *c >= 0x7f)
                        printf("\\u%04x", *c);
                else
                        putchar(*c);
}

int verb_ps(int argc, char **argv) {
        bool json = false, all = false, quiet = false;
        ps_filter filters[16];
        size_t n_filters = 0;
        static const struct option longopts[] = {
                { "json", no_argument, NULL, 'j' },   { "all", no_argument, NULL, 'a' },
                { "quiet", no_argument, NULL, 'q' },  { "filter", required_argument, NULL, 'f' },
                { "help", no_argument, NULL, 'h' },   {},
        };
        int c;
        opterr = 0;
        optind = 1;
        /* getopt: `ps -aq` as in docker */
        while ((c = getopt_long(argc, argv, ":aqf:h", longopts, NULL)) != -1) {
                switch (c) {
                case 'j':
                        json = true;
                        break;
                case 'a':
                        all = true;
                        break;
                case 'q':
                        quiet = true;
                        break;
                case 'h':
                        fputs(ps_usage, stdout);
                        return 0;
                case 'f': {
                        const char *f = optarg;
                        const char *eq = strchr(f, '=');
                        size_t kl = eq ? (size_t) (eq - f) : 0;
                        static const char *const keys[] = { "state", "backend", "template", "owner", "id" };
                        const char *key = NULL;
                        for (size_t k = 0; eq && k < ELEMENTSOF(keys); k++)
                                if (strlen(keys[k]) == kl && strncmp(f, keys[k], kl) == 0)
                                        key = keys[k];
                        if (!key || n_filters >= ELEMENTSOF(filters)) {
                                log_error("invalid --filter '%s' (KEY=VALUE with KEY state, backend, template, owner "
                                          "or id; at most 16)",
                                          f);
                                return EXIT_USAGE;
                        }
                        filters[n_filters++] = (ps_filter) { key, eq + 1 };
                        if (streq(key, "state") && streq(eq + 1, "dead"))
                                all = true;
                        break;
                }
                default:
                        return cli_getopt_error("ps", c, argv);
                }
        }
        if (optind < argc) {
                log_error("ps: unexpected argument '%s' (see `hutch ps --help`)", argv[optind]);
                return EXIT_USAGE;
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
        else if (!quiet)
                printf("%-20s  %8s  %-10s  %-7s  %8s  %10s  %-9s  %s\n", "ID", "PID", "TEMPLATE", "BACKEND", "AGE",
                       "MEMORY", "STATE", "OWNER");
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        bool first = true;
        for (char **id = ids; *id; id++) {
                hutch_sandbox *sb;
                hutch_error e = { 0 };
                bool alive = hutch_sandbox_attach(ctx, *id, &sb, &e) >= 0;
                if (!alive) {
                        if (!all || !ps_matches(filters, n_filters, *id, "dead", "", "", ""))
                                continue;
                        if (quiet)
                                printf("%s\n", *id);
                        else if (json)
                                printf("%s{\"id\":\"%s\",\"state\":\"dead\"}", first ? "" : ",", *id);
                        else
                                printf("%-20s  %8s  %-10s  %-7s  %8s  %10s  %-9s  %s\n", *id, "-", "-", "-", "-", "-",
                                       "dead", "(hutch gc removes it)");
                        first = false;
                        continue;
                }
                /* gvisor, paused to disk: nothing runs until its resume */
                const char *state = hutch_sandbox_is_suspended(sb) ? "suspended" : "running";
                const char *backend = hutch_backend_name(hutch_sandbox_backend(sb));
                const char *owner = hutch_sandbox_owner(sb);
                if (!ps_matches(filters, n_filters, *id, state, backend, hutch_sandbox_template(sb), owner)) {
                        hutch_sandbox_unref(sb);
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
                if (quiet)
                        printf("%s\n", *id);
                else if (json) {
                        printf("%s{\"id\":\"%s\",\"state\":\"%s\",\"init_pid\":%d,\"template\":\"%s\",\"memory_bytes\":%llu,"
                               "\"backend\":\"%s\",\"owner\":\"",
                               first ? "" : ",", *id, state, hutch_sandbox_init_pid(sb), hutch_sandbox_template(sb),
                               (unsigned long long) st.memory_current, backend);
                        ps_json_str(owner);
                        printf("\"}");
                } else
                        printf("%-20s  %8d  %-10s  %-7s  %7.0fs  %10s  %-9s  %s\n", *id, hutch_sandbox_init_pid(sb),
                               hutch_sandbox_template(sb), backend, age, format_size(st.memory_current, mem, sizeof mem),
                               state, *owner ? owner : "?");
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
        for (int i = 1; i < argc; i++)
                if (argv[i][0] == '-') {
                        if (streq(argv[i], "-h") || streq(argv[i], "--help")) {
                                puts("usage: hutch kill ID...\n\nDestroys sandboxes of this host by id (exit 1 when "
                                     "one is not found).");
                                return 0;
                        }
                        log_error("unknown option '%s' (usage: hutch kill ID...)", argv[i]);
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
        if (argc == 2 && (streq(argv[1], "-h") || streq(argv[1], "--help"))) {
                puts("usage: hutch gc\n\nRemoves what is left of sandboxes whose init died.");
                return 0;
        }
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
        /* and the downloads a killed pull left in the blob cache */
        hutch_error e3 = { 0 };
        const char *dd = getenv("HUTCH_DATA_DIR");
        int b = image_pull_gc(dd && *dd ? dd : "/var/lib/hutch", &e3);
        if (b < 0)
                log_error("%s", e3.msg);
        else if (b > 0)
                printf("removed %d interrupted download%s\n", b, b == 1 ? "" : "s");
        hutch_ctx_free(ctx);
        return r < 0 || err.code || t < 0 || b < 0 ? EXIT_HUTCH : 0;
}
