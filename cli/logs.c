/* SPDX-License-Identifier: Apache-2.0 */
/* hutch logs ID: what happened in one sandbox of a daemon's data dir, from
 * its audit trail (docs/audit.md), one line a record; -f follows it until
 * the sandbox ends. `e2b sandbox logs` and `docker logs` for hutch: the
 * daemon does not keep the processes' output, so these are the sandbox's
 * events (its processes, files, network, lifecycle), not their output. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "audit/audit.h"
#include "cli/cli.h"
#include "daemon/serve.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/log.h"

static void logs_usage(FILE *f) {
        fputs("usage: hutch logs [-f] [--since TIME] [--kind KIND] [--json] [--data-dir DIR] SANDBOX_ID\n"
              "\n"
              "What happened in a sandbox of a `hutch serve` data dir, oldest first, from its\n"
              "audit trail: processes started and how they ended, files written and removed\n"
              "through the API, egress decisions, secrets used, pause, resume, snapshots and\n"
              "its end (the processes' output is not kept: it went to the client that ran them).\n"
              "\n"
              "  -f, --follow     keep printing new records until the sandbox ends (or Ctrl-C)\n"
              "  --since TIME     records at or after TIME (RFC 3339, YYYY-MM-DD, unix ms, or a\n"
              "                   duration back from now such as 10m)\n"
              "  --kind KIND      one kind (process.start) or a prefix ending in '.' (process.)\n"
              "  --json           the records as JSON lines, as `hutch audit export` writes them\n"
              "  --data-dir DIR   the daemon's data dir (default $HUTCH_DATA_DIR or /var/lib/hutch)\n",
              f);
}

typedef struct logs_ctx {
        bool json;
        bool ended; /* a sandbox.end was printed */
        int64_t last_seq;
} logs_ctx;

static const char *str(json_t *o, const char *k) {
        const char *s = json_string_value(json_object_get(o, k));
        return s ? s : "";
}

static long long num(json_t *o, const char *k) {
        return (long long) json_integer_value(json_object_get(o, k));
}

/* The record's detail in a few words a person reads at a glance; the
 * kinds without a rule of their own print their detail as it is. */
static void summary(const char *kind, json_t *d, const char *raw) {
        if (streq(kind, "process.start")) {
                printf("pid %lld as %s in %s%s:", num(d, "pid"), str(d, "user"), str(d, "cwd"),
                       json_is_true(json_object_get(d, "pty")) ? " (pty)" : "");
                size_t i;
                json_t *a;
                json_array_foreach(json_object_get(d, "argv"), i, a)
                        printf(" %s", json_string_value(a) ?: "");
        } else if (streq(kind, "process.end")) {
                printf("pid %lld ", num(d, "pid"));
                if (num(d, "signal"))
                        printf("killed by signal %lld", num(d, "signal"));
                else
                        printf("exited %lld", num(d, "exit_code"));
                if (json_object_get(d, "duration_ms"))
                        printf(" after %lld ms", num(d, "duration_ms"));
                if (json_object_get(d, "cpu_ms"))
                        printf(", %lld ms of CPU", num(d, "cpu_ms"));
        } else if (streq(kind, "file.write")) {
                printf("%s (%lld bytes, sha256 %.12s…)", str(d, "path"), num(d, "size"),
                       str(d, "sha256"));
        } else if (startswith(kind, "egress.")) {
                printf("%s:%lld", str(d, "host"), num(d, "port"));
                if (*str(d, "reason"))
                        printf(" (%s)", str(d, "reason"));
                if (json_object_get(d, "bytes_out"))
                        printf(", %lld bytes out, %lld in", num(d, "bytes_out"), num(d, "bytes_in"));
        } else if (streq(kind, "sandbox.end")) {
                printf("%s", *str(d, "reason") ? str(d, "reason") : raw);
        } else
                printf("%s", raw);
}

static int on_record(void *arg, const audit_record *r) {
        logs_ctx *x = arg;
        x->last_seq = r->seq;
        if (streq(r->kind, "sandbox.end"))
                x->ended = true;
        if (x->json) {
                char *s = audit_record_json(r);
                if (!s)
                        return -ENOMEM;
                puts(s);
                free(s);
        } else {
                char t[40];
                format_rfc3339(r->ts_ms, t);
                printf("%s  %-16s ", t, r->kind);
                json_t *d = json_loads(r->detail ? r->detail : "{}", 0, NULL);
                summary(r->kind, d, r->detail ? r->detail : "");
                json_decref(d);
                putchar('\n');
        }
        return ferror(stdout) ? -EIO : 0;
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
        (void) sig;
        interrupted = 1;
}

int verb_logs(int argc, char **argv) {
        const char *data_dir = getenv("HUTCH_DATA_DIR") ? getenv("HUTCH_DATA_DIR") : "/var/lib/hutch";
        bool follow = false;
        logs_ctx x = { 0 };
        audit_filter f;
        audit_filter_init(&f);
        int64_t now = clock_ns(CLOCK_REALTIME) / 1000000;
        hutch_error err = { 0 };
        static const struct option longopts[] = {
                { "follow", no_argument, NULL, 'f' },
                { "since", required_argument, NULL, 's' },
                { "kind", required_argument, NULL, 'k' },
                { "json", no_argument, NULL, 'j' },
                { "data-dir", required_argument, NULL, 'd' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, ":fh", longopts, NULL)) != -1) {
                switch (c) {
                case 'f':
                        follow = true;
                        break;
                case 'j':
                        x.json = true;
                        break;
                case 'd':
                        data_dir = optarg;
                        break;
                case 's':
                case 'k':
                        if (audit_filter_set(&f, c == 's' ? "since" : "kind", optarg, now, 0, &err) <
                            0) {
                                log_error("logs: --%s", err.msg);
                                return EXIT_USAGE;
                        }
                        break;
                case 'h':
                        logs_usage(stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("logs", c, argv);
                        logs_usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (optind != argc - 1) {
                if (optind < argc - 1)
                        log_error("logs: unexpected argument '%s'", argv[optind + 1]);
                else
                        log_error("logs: wants a SANDBOX_ID (see `hutch ps` or the API's list)");
                logs_usage(stderr);
                return EXIT_USAGE;
        }
        const char *id = argv[optind];
        if (audit_filter_set(&f, "sandbox", id, now, 0, &err) < 0) {
                log_error("logs: %s", err.msg);
                return EXIT_USAGE;
        }
        struct stat sb;
        char db[4200];
        snprintf(db, sizeof db, "%s/hutch.db", data_dir);
        if (stat(db, &sb) < 0) {
                log_error("logs: %s is not the data dir of a daemon (no hutch.db; --data-dir)",
                          data_dir);
                return 1;
        }
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return 1;
        store_sandbox s = { 0 };
        if (store_sandbox_get(st, id, &s, &err) < 0) {
                log_error("logs: no sandbox %s in %s (hutch run sandboxes have no trail: the daemon's do)",
                          id, data_dir);
                store_close(st);
                return 1;
        }
        bool ended_before = s.ended_ms != 0;
        store_sandbox_clear(&s);
        struct sigaction sa = { .sa_handler = on_sigint };
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        int r;
        for (;;) {
                r = audit_query(st, &f, on_record, &x, &err);
                fflush(stdout);
                if (r < 0 || !follow || x.ended || interrupted)
                        break;
                /* an end the trail missed (records dropped, or a daemon
                 * that died): the store's own row says so */
                if (ended_before) {
                        log_info("sandbox %s has ended", id);
                        break;
                }
                if (store_sandbox_get(st, id, &s, &err) >= 0) {
                        ended_before = s.ended_ms != 0;
                        store_sandbox_clear(&s);
                }
                f.after_seq = x.last_seq;
                for (int i = 0; i < 5 && !interrupted; i++)
                        usleep(100 * 1000);
                if (interrupted)
                        break;
        }
        store_close(st);
        if (r < 0) {
                log_error("logs: %s", err.msg[0] ? err.msg : strerror(-r));
                return 1;
        }
        return 0;
}
