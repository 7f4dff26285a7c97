/* SPDX-License-Identifier: Apache-2.0 */
/* hutch template import|ls|rm|prune (and pull|push|login, from cli/template-pull.c). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "daemon/serve.h"
#include "image/image.h"
#include "store/store.h"
#include "template/interp-template.h"
#include "template/template.h"
#include "util/error.h"
#include "util/log.h"

static void usage(FILE *f) {
        fputs("usage: hutch template VERB [OPTIONS]\n"
              "\n"
              "  import FILE [--name NAME] [--json]   a `docker save` archive or an OCI image layout\n"
              "                                       (a directory or a tar of one) becomes template NAME\n"
              "  pull REF [--name NAME]               from a registry (when built with it)\n"
              "  push NAME REF                        template NAME to a registry as image REF (another\n"
              "                                       node pulls it: docs/scale-out.md)\n"
              "  login REGISTRY                       registry credentials (when built with it)\n"
              "  ls [--json]                          the templates: name, kind, layers, size, created\n"
              "  rm [--force] NAME...                 remove templates (a live sandbox keeps its version\n"
              "                                       until it ends; --force: even one that snapshots\n"
              "                                       restore over)\n"
              "  prune                                remove template versions and layers nothing uses\n"
              "  build FILE [--name NAME[:TAG]]       build a template from a build file, each step in a\n"
              "                                       sandbox (`hutch template build --help`)\n"
              "  base [--mirror URL] [--suite SUITE]  build `base` from Debian packages with mmdebstrap\n"
              "       [--packages LIST] [--force]     (`hutch template base --help`); without it, or\n"
              "                                       after `rm base`, base is the host template\n"
              "  interpreter [--packages LIST] ...    build `code-interpreter` (what @e2b/code-interpreter\n"
              "                                       starts) from Debian packages the same way; without\n"
              "                                       it, the interpreter runs on the host template\n"
              "\n"
              "Templates live in $HUTCH_DATA_DIR/templates, layers once in $HUTCH_DATA_DIR/layers.\n",
              f);
}

const char *cli_template_data_dir(void) {
        const char *d = getenv("HUTCH_DATA_DIR");
        return d && *d ? d : "/var/lib/hutch";
}

static const char *data_dir(void) {
        return cli_template_data_dir();
}

/* ---------------------------------------------------------------- progress */

typedef struct progress_state {
        bool tty, json;
        int64_t t0;
} progress_state;

static int64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void human(uint64_t b, char *buf, size_t n) {
        const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
        double v = (double) b;
        int i = 0;
        while (v >= 1024 && i < 4)
                v /= 1024, i++;
        snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void on_progress(void *arg, const image_progress_event *ev) {
        progress_state *s = arg;
        char sz[32] = "";
        if (s->json) {
                printf("{\"phase\":\"%s\",\"digest\":%s%s%s,\"layer\":%u,\"layers\":%u,\"done\":%llu,\"total\":%llu}\n",
                       ev->phase, ev->digest ? "\"" : "", ev->digest ? ev->digest : "null",
                       ev->digest ? "\"" : "", ev->layer, ev->n_layers, (unsigned long long) ev->done,
                       (unsigned long long) (ev->total == UINT64_MAX ? 0 : ev->total));
                fflush(stdout);
                return;
        }
        const char *d = ev->digest ? ev->digest + 7 : "";
        if (streq(ev->phase, "layer-done")) {
                human(ev->done, sz, sizeof sz);
                double secs = (double) (now_ms() - s->t0) / 1000.0;
                if (s->tty) {
                        int w = 30, fill = ev->n_layers ? (int) (w * ev->layer / ev->n_layers) : w;
                        fprintf(stderr, "\r[%.*s%*s] layer %u/%u %.12s %s (%.1fs)\033[K", fill,
                                "##############################", w - fill, "", ev->layer,
                                ev->n_layers, d, sz, secs);
                } else
                        fprintf(stderr, "layer %u/%u %.12s unpacked (%s)\n", ev->layer,
                                ev->n_layers, d, sz);
        } else if (streq(ev->phase, "exists")) {
                if (s->tty)
                        fprintf(stderr, "\rlayer %u/%u %.12s already in the store\033[K", ev->layer,
                                ev->n_layers, d);
                else
                        fprintf(stderr, "layer %u/%u %.12s already in the store\n", ev->layer,
                                ev->n_layers, d);
        } else if (streq(ev->phase, "layer") && s->tty) {
                fprintf(stderr, "\rlayer %u/%u %.12s unpacking...\033[K", ev->layer, ev->n_layers, d);
        } else if (streq(ev->phase, "done") && s->tty)
                fputc('\n', stderr);
}

/* ------------------------------------------------------------------ verbs */

static int do_import(int argc, char **argv) {
        static const struct option opts[] = { { "name", required_argument, NULL, 'n' },
                                              { "json", no_argument, NULL, 'j' },
                                              { "help", no_argument, NULL, 'h' },
                                              {} };
        const char *name = NULL;
        progress_state ps = { .tty = isatty(STDERR_FILENO), .t0 = now_ms() };
        int c;
        optind = 1;
        while ((c = getopt_long(argc, argv, "n:jh", opts, NULL)) != -1) {
                if (c == 'n')
                        name = optarg;
                else if (c == 'j')
                        ps.json = true;
                else if (c == 'h') {
                        printf("usage: hutch template import FILE [--name NAME] [--json]\n");
                        return 0;
                } else
                        return EXIT_USAGE;
        }
        if (optind + 1 != argc)
                return log_error("usage: hutch template import FILE [--name NAME] [--json]"),
                       EXIT_USAGE;
        if (name && (template_validate_name(name) < 0 || streq(name, "host") || streq(name, "base") ||
                     template_is_interp(name)))
                return log_error("invalid --name '%s' (a-z, 0-9, then - _ .; at most 63; not host, base or "
                                 "code-interpreter, which `hutch template base` and `interpreter` build)",
                                 name),
                       EXIT_USAGE;
        hutch_error err = { 0 };
        image_progress p = { on_progress, &ps };
        char *got = NULL;
        int r = image_import(data_dir(), argv[optind], name, &p, &got, &err);
        if (r < 0) {
                if (ps.tty && !ps.json)
                        fputc('\n', stderr);
                log_error("import of %s failed: %s", argv[optind], err.msg);
                return EXIT_HUTCH;
        }
        cli_audit_note(data_dir(), "template.import",
                       json_pack("{s:s, s:s, s:s}", "file", argv[optind], "image", got, "by", "cli"));
        if (ps.json)
                printf("{\"phase\":\"imported\",\"name\":\"%s\"}\n", got);
        else
                printf("%s\n", got);
        free(got);
        return 0;
}

static void json_escape(const char *s) {
        putchar('"');
        for (const unsigned char *c = (const unsigned char *) s; *c; c++) {
                if (*c == '"' || *c == '\\')
                        printf("\\%c", *c);
                else if (*c < 0x20)
                        printf("\\u%04x", *c);
                else
                        putchar(*c);
        }
        putchar('"');
}

static int do_ls(int argc, char **argv) {
        bool json = argc > 1 && streq(argv[1], "--json");
        if (argc > (json ? 2 : 1))
                return log_error("usage: hutch template ls [--json]"), EXIT_USAGE;
        template_info *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (template_list(data_dir(), &v, &n, &err) < 0)
                return log_error("%s", err.msg), EXIT_HUTCH;
        if (json) {
                putchar('[');
                for (size_t i = 0; i < n; i++) {
                        printf("%s{\"name\":", i ? "," : "");
                        json_escape(v[i].name);
                        printf(",\"kind\":");
                        json_escape(v[i].kind);
                        printf(",\"source\":");
                        json_escape(v[i].source);
                        printf(",\"layers\":%zu,\"size\":%llu,\"created_ms\":%lld}", v[i].n_layers,
                               (unsigned long long) v[i].size, (long long) v[i].created_ms);
                }
                printf("]\n");
        } else {
                printf("%-24s %-8s %6s %10s  %s\n", "NAME", "KIND", "LAYERS", "SIZE", "CREATED");
                for (size_t i = 0; i < n; i++) {
                        char sz[32], when[32] = "-";
                        human(v[i].size, sz, sizeof sz);
                        time_t t = (time_t) (v[i].created_ms / 1000);
                        struct tm tm;
                        if (v[i].created_ms > 0 && gmtime_r(&t, &tm))
                                strftime(when, sizeof when, "%Y-%m-%d %H:%M:%SZ", &tm);
                        printf("%-24s %-8s %6zu %10s  %s\n", v[i].name, v[i].kind, v[i].n_layers,
                               sz, when);
                }
        }
        template_info_free(v, n);
        return 0;
}

/* Collect now: versions no sandbox uses, then layers no version names. */
static int collect(bool quiet) {
        hutch_ctx *ctx = NULL;
        if (cli_ctx(&ctx) < 0)
                return EXIT_HUTCH;
        hutch_error err = { 0 };
        int r = hutch_template_gc(ctx, &err);
        hutch_ctx_free(ctx);
        if (r < 0)
                return log_error("collecting template versions: %s", err.msg), EXIT_HUTCH;
        if (!quiet)
                printf("removed %d template versions and layers\n", r);
        return 0;
}

/* Snapshots the daemon took from sandboxes of a template restore over it
 * (by name): how many there are, 0 without a database. */
static int snapshots_of(const char *name, int64_t *ret) {
        char db[4200];
        struct stat st;
        *ret = 0;
        snprintf(db, sizeof db, "%s/hutch.db", data_dir());
        if (stat(db, &st) < 0)
                return 0;
        hutch_store *sto = NULL;
        if (server_open_store(data_dir(), &sto) < 0)
                return -EIO;
        hutch_error err = { 0 };
        int r = store_snapshot_count_template(sto, name, ret, &err);
        store_close(sto);
        if (r < 0)
                log_error("%s", err.msg);
        return r;
}

static int do_rm(int argc, char **argv) {
        bool force = false;
        int status = 0, c;
        static const struct option opts[] = { { "force", no_argument, NULL, 'f' },
                                              { "help", no_argument, NULL, 'h' },
                                              {} };
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, ":fh", opts, NULL)) != -1) {
                if (c == 'f')
                        force = true;
                else if (c == 'h') {
                        printf("usage: hutch template rm [-f|--force] NAME...\n");
                        return 0;
                } else
                        return cli_getopt_error("template rm", c, argv);
        }
        if (optind >= argc)
                return log_error("usage: hutch template rm [--force] NAME..."), EXIT_USAGE;
        for (int i = optind; i < argc; i++) {
                int64_t snaps = 0;
                if (!force && snapshots_of(argv[i], &snaps) >= 0 && snaps > 0) {
                        log_error("template '%s' is the base of %lld snapshot(s), which restore over it: "
                                  "`hutch template rm --force %s` removes it anyway (they then cannot be restored)",
                                  argv[i], (long long) snaps, argv[i]);
                        status = EXIT_HUTCH;
                        continue;
                }
                hutch_error err = { 0 };
                if (template_remove(data_dir(), argv[i], &err) < 0) {
                        log_error("%s", err.msg);
                        status = EXIT_HUTCH;
                } else
                        cli_audit_note(data_dir(), "template.delete",
                                       json_pack("{s:s, s:b, s:s}", "image", argv[i], "force", force, "by", "cli"));
        }
        int r = collect(true);
        return status ? status : r;
}

static int do_prune(int argc, char **argv) {
        if (argc > 1)
                return log_error("usage: hutch template prune"), EXIT_USAGE;
        return collect(false);
}

int verb_template(int argc, char **argv) {
        if (argc < 2) {
                usage(stderr);
                return EXIT_USAGE;
        }
        const char *v = argv[1];
        if (streq(v, "build")) /* cli/template-build.c (owner: build) */
                return verb_template_build(argc - 1, argv + 1);
        if (streq(v, "base")) /* cli/template-base.c */
                return verb_template_base(argc - 1, argv + 1);
        if (streq(v, "interpreter")) /* cli/template-base.c */
                return verb_template_interpreter(argc - 1, argv + 1);
        const char *dd = data_dir();
        if (dd[0] != '/' || strlen(dd) > 1024)
                return log_error("HUTCH_DATA_DIR must be an absolute path of at most 1024 bytes"),
                       EXIT_USAGE;
        const char *mx = getenv("HUTCH_IMAGE_MAX_BYTES");
        if (mx && *mx) {
                char *e;
                unsigned long long b = strtoull(mx, &e, 10);
                if (*e || b == 0)
                        return log_error("invalid HUTCH_IMAGE_MAX_BYTES '%s' (bytes, > 0)", mx),
                               EXIT_USAGE;
                image_set_max_expansion(b);
        }
        if (streq(v, "import"))
                return do_import(argc - 1, argv + 1);
        if (streq(v, "ls") || streq(v, "list"))
                return do_ls(argc - 1, argv + 1);
        if (streq(v, "rm"))
                return do_rm(argc - 1, argv + 1);
        if (streq(v, "prune"))
                return do_prune(argc - 1, argv + 1);
        if (streq(v, "pull") || streq(v, "push") || streq(v, "login")) {
                int (*fn)(int, char **) = streq(v, "pull")   ? template_pull_main
                                        : streq(v, "push") ? template_push_main
                                                           : template_login_main;
                if (!fn)
                        return log_error("`hutch template %s` is not part of this build", v),
                               EXIT_USAGE;
                return fn(argc - 1, argv + 1);
        }
        if (streq(v, "help") || streq(v, "--help") || streq(v, "-h")) {
                usage(stdout);
                return 0;
        }
        log_error("unknown template verb '%s' (try `hutch template help`)", v);
        return EXIT_USAGE;
}
