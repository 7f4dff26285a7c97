/* SPDX-License-Identifier: Apache-2.0 */
/* hutch audit verify|export|pubkey: the audit trail of a data dir
 * (docs/audit.md). Reads the database beside a running daemon (SQLite's
 * WAL lets readers be), never its serve.lock. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "audit/audit.h"
#include "cli/cli.h"
#include "daemon/serve.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/log.h"

static void audit_usage(FILE *f) {
        fputs("usage: hutch audit verify [--data-dir DIR] [--pubkey FILE]\n"
              "       hutch audit export [--data-dir DIR] [--since TIME] [--until TIME] [--team NAME|ID]\n"
              "                          [--sandbox ID] [--kind KIND] [--format jsonl|csv]\n"
              "       hutch audit pubkey [--data-dir DIR]\n"
              "\n"
              "  verify   check the hash chain and the signed checkpoints; names each changed,\n"
              "           removed, reordered or truncated record and each replayed checkpoint\n"
              "           (exit 0: intact, 1: tampered)\n"
              "  export   the records as JSON lines (default) or CSV, oldest first\n"
              "  pubkey   the Ed25519 public key that checks the checkpoints (PEM)\n"
              "\n"
              "  --data-dir DIR    the daemon's data dir (default $HUTCH_DATA_DIR or /var/lib/hutch)\n"
              "  --pubkey FILE     verify with this public key instead of the data dir's key\n"
              "  --since TIME      records at or after TIME: RFC 3339, YYYY-MM-DD, unix ms, or a\n"
              "                    duration back from now (1h, 7d is 168h)\n"
              "  --until TIME      records before TIME\n"
              "  --team NAME|ID    one team's records\n"
              "  --sandbox ID      one sandbox's records\n"
              "  --kind KIND       one kind (process.start) or a prefix ending in '.' (process.)\n"
              "  --format FMT      jsonl (default) or csv\n",
              f);
}

static void on_problem(void *arg, int64_t seq, const char *msg) {
        (void) arg;
        (void) seq;
        printf("TAMPERED: %s\n", msg);
}

typedef struct export_ctx {
        bool csv;
} export_ctx;

static int on_record(void *arg, const audit_record *r) {
        export_ctx *x = arg;
        if (x->csv) {
                audit_record_csv(stdout, r);
                return 0;
        }
        char *s = audit_record_json(r);
        if (!s)
                return -ENOMEM;
        puts(s);
        free(s);
        return ferror(stdout) ? -EIO : 0;
}

static char *read_small_file(const char *path) {
        FILE *f = fopen(path, "re");
        if (!f)
                return NULL;
        char *buf = calloc(1, 16384);
        size_t n = buf ? fread(buf, 1, 16383, f) : 0;
        (void) n;
        fclose(f);
        return buf;
}

/* The CLI's template work on a data dir (pull, import, rm, `template
 * build`) reaches the audit trail as the daemon's does: an event in the
 * store's events table, which the daemon folds into the signed chain at
 * its next write (as `hutch key create` beside it). Only where a daemon
 * has made the store: the CLI does not create a database for it. Steals
 * detail; a failure is a warning, never the command's. */
void cli_audit_note(const char *data_dir, const char *kind, json_t *detail) {
        char db[PATH_MAX];
        snprintf(db, sizeof db, "%s/hutch.db", data_dir);
        char *d = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
        json_decref(detail);
        hutch_store *st = NULL;
        if (access(db, F_OK) == 0 && server_open_store(data_dir, &st) >= 0) {
                hutch_error err = { 0 };
                int64_t team = 0;
                (void) store_team_find(st, "default", &team, &err);
                if (store_event_add(st, team, NULL, kind, d ? d : "{}", &err) < 0)
                        log_warning("%s: not in the audit trail: %s", kind, err.msg);
                store_close(st);
        }
        free(d);
}

int verb_audit(int argc, char **argv) {
        if (argc < 2 || streq(argv[1], "--help") || streq(argv[1], "-h") || streq(argv[1], "help")) {
                audit_usage(argc < 2 ? stderr : stdout);
                return argc < 2 ? EXIT_USAGE : 0;
        }
        const char *sub = argv[1];
        if (!streq(sub, "verify") && !streq(sub, "export") && !streq(sub, "pubkey")) {
                log_error("audit: unknown subcommand '%s'", sub);
                audit_usage(stderr);
                return EXIT_USAGE;
        }
        const char *data_dir = getenv("HUTCH_DATA_DIR") ? getenv("HUTCH_DATA_DIR") : "/var/lib/hutch";
        const char *pubkey = NULL, *team = NULL, *format = "jsonl";
        audit_filter f;
        audit_filter_init(&f);
        int64_t now = clock_ns(CLOCK_REALTIME) / 1000000;
        hutch_error err = { 0 };
        static const struct option longopts[] = {
                { "data-dir", required_argument, NULL, 'd' },
                { "pubkey", required_argument, NULL, 'p' },
                { "format", required_argument, NULL, 'f' },
                { "team", required_argument, NULL, 't' },
                { "since", required_argument, NULL, 'S' },
                { "until", required_argument, NULL, 'U' },
                { "sandbox", required_argument, NULL, 'x' },
                { "kind", required_argument, NULL, 'k' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c, li = -1;
        opterr = 0;
        optind = 1;
        bool verify = streq(sub, "verify"), export = streq(sub, "export");
        while ((c = getopt_long(argc - 1, argv + 1, ":h", longopts, &li)) != -1) {
                /* which options each subcommand takes */
                if ((c == 'p' && !verify) || (c != 'd' && c != 'p' && c != 'h' && c != '?' && c != ':' && !export)) {
                        log_error("audit %s: unknown option '--%s' (see `hutch audit --help`)", sub, longopts[li].name);
                        audit_usage(stderr);
                        return EXIT_USAGE;
                }
                switch (c) {
                case 'd':
                        data_dir = optarg;
                        break;
                case 'p':
                        pubkey = optarg;
                        break;
                case 'f':
                        if (!streq(optarg, "jsonl") && !streq(optarg, "csv")) {
                                log_error("audit export: --format is jsonl or csv, not '%s'", optarg);
                                return EXIT_USAGE;
                        }
                        format = optarg;
                        break;
                case 't':
                        team = optarg;
                        break;
                case 'S':
                case 'U':
                case 'x':
                case 'k':
                        if (audit_filter_set(&f, longopts[li].name, optarg, now, 0, &err) < 0) {
                                log_error("audit export: --%s", err.msg);
                                return EXIT_USAGE;
                        }
                        break;
                case 'h':
                        audit_usage(stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("audit", c, argv + 1);
                        audit_usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (optind < argc - 1) {
                log_error("audit %s: unexpected argument '%s'", sub, argv[1 + optind]);
                audit_usage(stderr);
                return EXIT_USAGE;
        }
        struct stat sb;
        if (stat(data_dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
                log_error("audit: %s is not a data dir (--data-dir)", data_dir);
                return 1;
        }
        if (streq(sub, "pubkey")) {
                char *pem = NULL;
                if (audit_pubkey_pem(data_dir, &pem, &err) < 0) {
                        log_error("audit pubkey: %s (the daemon creates the key at its first start)",
                                  err.msg);
                        return 1;
                }
                fputs(pem, stdout);
                free(pem);
                return 0;
        }
        _cleanup_free_ char *pem = NULL;
        if (pubkey && !(pem = read_small_file(pubkey))) {
                log_error("audit verify: reading %s: %m", pubkey);
                return 1;
        }
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return 1;
        int r;
        if (streq(sub, "verify")) {
                audit_verify_result res;
                r = audit_verify(st, data_dir, pem, on_problem, NULL, &res, &err);
                store_close(st);
                if (r < 0) {
                        log_error("audit verify: %s", err.msg);
                        return 1;
                }
                if (r > 0) {
                        printf("the audit trail of %s has %d problem(s)\n", data_dir, r);
                        return 1;
                }
                char t[40] = "never";
                if (res.signed_ts_ms)
                        format_rfc3339(res.signed_ts_ms, t);
                printf("ok: %lld records (seq %lld..%lld), %lld checkpoints; signed up to seq %lld at %s; "
                       "%lld record(s) after it not yet signed%s%s\n",
                       (long long) res.records, (long long) res.first_seq, (long long) res.last_seq,
                       (long long) res.checkpoints, (long long) res.signed_seq, t,
                       (long long) res.unsigned_records,
                       res.pruned_seq ? "; retention removed records before the first" : "",
                       res.head_checked ? "" : "; no audit.head to compare with");
                return 0;
        }
        /* export */
        if (team) {
                int64_t id;
                char *e = NULL;
                long long n = strtoll(team, &e, 10);
                if (*team && !*e && n >= 0)
                        id = n;
                else if ((r = store_team_find(st, team, &id, &err)) < 0) {
                        log_error("audit export: team %s: %s", team, err.msg);
                        store_close(st);
                        return 1;
                }
                f.team = id;
        }
        export_ctx x = { .csv = streq(format, "csv") };
        if (x.csv)
                audit_csv_header(stdout);
        r = audit_query(st, &f, on_record, &x, &err);
        store_close(st);
        if (r < 0) {
                log_error("audit export: %s", r == -EIO && !err.msg[0] ? "write error" : err.msg);
                return 1;
        }
        return fflush(stdout) == 0 ? 0 : 1;
}
