/* SPDX-License-Identifier: Apache-2.0 */
/* hutch usage: the usage ledger of a data dir (docs/usage.md), read beside
 * a running daemon (never its serve.lock). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "audit/audit.h"
#include "cli/cli.h"
#include "daemon/serve.h"
#include "daemon/usage.h"
#include "util/clock.h"
#include "util/log.h"

static void usage_usage(FILE *f) {
        fputs("usage: hutch usage [--data-dir DIR] [--team NAME|ID] [--since TIME] [--until TIME]\n"
              "                   [--by sandbox|day] [--json]\n"
              "\n"
              "The usage ledger: per sandbox (or per UTC day of their start) CPU time, memory\n"
              "reserved (limit x lifetime) and peak, the writable layer's use over time, processes\n"
              "started, egress by decision, GPU-seconds (GPUs x lifetime) and the GPU memory peak\n"
              "('-': not measured, no NVML), with a TOTAL row that is the exact sum of the rows.\n"
              "\n"
              "  --data-dir DIR   the daemon's data dir (default $HUTCH_DATA_DIR or /var/lib/hutch)\n"
              "  --team NAME|ID   one team (default: every team)\n"
              "  --since TIME     sandboxes that ran at or after TIME (RFC 3339, YYYY-MM-DD, unix ms,\n"
              "                   or a duration back from now such as 24h)\n"
              "  --until TIME     sandboxes that started before TIME\n"
              "  --by KEY         sandbox (default) or day\n"
              "  --json           the report as JSON, counters in their base units\n",
              f);
}

static int64_t geti(json_t *o, const char *k) {
        return (int64_t) json_integer_value(json_object_get(o, k));
}

int verb_usage(int argc, char **argv) {
        const char *data_dir = getenv("HUTCH_DATA_DIR") ? getenv("HUTCH_DATA_DIR") : "/var/lib/hutch";
        const char *team = NULL, *by = "sandbox";
        bool as_json = false;
        int64_t since = 0, until = 0, now = clock_ns(CLOCK_REALTIME) / 1000000;
        static const struct option longopts[] = {
                { "data-dir", required_argument, NULL, 'd' },
                { "team", required_argument, NULL, 't' },
                { "since", required_argument, NULL, 's' },
                { "until", required_argument, NULL, 'u' },
                { "by", required_argument, NULL, 'b' },
                { "json", no_argument, NULL, 'j' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        data_dir = optarg;
                        break;
                case 't':
                        team = optarg;
                        break;
                case 'j':
                        as_json = true;
                        break;
                case 'b':
                        if (!streq(optarg, "sandbox") && !streq(optarg, "day")) {
                                log_error("usage: --by is sandbox or day, not '%s'", optarg);
                                return EXIT_USAGE;
                        }
                        by = optarg;
                        break;
                case 's':
                case 'u':
                        if (audit_time_parse(optarg, now, c == 's' ? &since : &until) < 0) {
                                log_error("usage: --%s: expected an RFC 3339 time, a date, unix ms or a duration",
                                          c == 's' ? "since" : "until");
                                return EXIT_USAGE;
                        }
                        break;
                case 'h':
                        usage_usage(stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("usage", c, argv);
                        usage_usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (optind < argc) {
                log_error("usage: unexpected argument '%s'", argv[optind]);
                usage_usage(stderr);
                return EXIT_USAGE;
        }
        struct stat sb;
        if (stat(data_dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
                log_error("usage: %s is not a data dir (--data-dir)", data_dir);
                return 1;
        }
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return 1;
        hutch_error err = { 0 };
        int64_t team_id = -1;
        if (team) {
                char *e = NULL;
                long long n = strtoll(team, &e, 10);
                if (*team && !*e && n >= 0)
                        team_id = n;
                else if (store_team_find(st, team, &team_id, &err) < 0) {
                        log_error("usage: team %s: %s", team, err.msg);
                        store_close(st);
                        return 1;
                }
        }
        json_t *rep = usage_report(st, team_id, since, until, by, &err);
        store_close(st);
        if (!rep) {
                log_error("usage: %s", err.msg);
                return 1;
        }
        if (as_json) {
                char *s = json_dumps(rep, JSON_INDENT(2));
                puts(s ? s : "null");
                free(s);
                json_decref(rep);
                return 0;
        }
        /* whole units per row; TOTAL is the sum of the printed rows */
        printf("%-22s %10s %12s %9s %12s %6s %12s %12s %8s %8s %12s\n", streq(by, "day") ? "DAY" : "SANDBOX",
               "CPU-MS", "MEM-MIB-S", "PEAK-MIB", "DISK-KIB-S", "PROCS", "EGRESS-OUT", "EGRESS-IN",
               "DENIED", "GPU-S", "GPU-PEAK-MIB");
        int64_t t[8] = { 0 }, gpu_s = 0, gpu_peak = -1;
        size_t i;
        json_t *row;
        json_array_foreach(json_object_get(rep, "rows"), i, row) {
                json_t *eg = json_object_get(row, "egress");
                int64_t v[8] = { geti(row, "cpu_ns") / 1000000,
                                 geti(row, "memory_reserved_mib_ms") / 1000,
                                 geti(row, "memory_peak_bytes") >> 20,
                                 geti(row, "disk_kib_ms") / 1000,
                                 geti(row, "processes"),
                                 geti(eg, "allowed_bytes_out"),
                                 geti(eg, "allowed_bytes_in"),
                                 geti(eg, "denied") };
                const char *key = json_string_value(
                        json_object_get(row, streq(by, "day") ? "day" : "sandboxID"));
                /* GPU memory: a number only where NVML measured it */
                json_t *gp = json_object_get(row, "gpu_memory_peak_bytes");
                int64_t gs = geti(row, "gpu_ms") / 1000, gm = json_is_integer(gp) ? (int64_t) json_integer_value(gp) >> 20 : -1;
                char peak[24] = "-";
                if (gm >= 0)
                        snprintf(peak, sizeof peak, "%lld", (long long) gm);
                printf("%-22s %10lld %12lld %9lld %12lld %6lld %12lld %12lld %8lld %8lld %12s\n", key ? key : "",
                       (long long) v[0], (long long) v[1], (long long) v[2], (long long) v[3],
                       (long long) v[4], (long long) v[5], (long long) v[6], (long long) v[7], (long long) gs, peak);
                for (int k = 0; k < 8; k++)
                        t[k] = k == 2 ? MAX(t[k], v[k]) : t[k] + v[k];
                gpu_s += gs;
                gpu_peak = MAX(gpu_peak, gm);
        }
        char tpeak[24] = "-";
        if (gpu_peak >= 0)
                snprintf(tpeak, sizeof tpeak, "%lld", (long long) gpu_peak);
        printf("%-22s %10lld %12lld %9lld %12lld %6lld %12lld %12lld %8lld %8lld %12s\n", "TOTAL",
               (long long) t[0], (long long) t[1], (long long) t[2], (long long) t[3],
               (long long) t[4], (long long) t[5], (long long) t[6], (long long) t[7], (long long) gpu_s, tpeak);
        /* the storage ledger: volumes and snapshots, one line each */
        json_t *srows = json_object_get(json_object_get(rep, "storage"), "rows");
        if (json_array_size(srows) > 0) {
                printf("\n%-10s %-38s %-20s %14s %12s %s\n", "STORAGE", "ID", "NAME", "KIB-S", "PEAK-KIB",
                       "ENDED");
                int64_t tk = 0, tp = 0;
                json_array_foreach(srows, i, row) {
                        int64_t kib_s = geti(row, "kib_ms") / 1000, peak = geti(row, "bytes_peak") >> 10;
                        const char *ended = json_string_value(json_object_get(row, "endedAt"));
                        printf("%-10s %-38s %-20s %14lld %12lld %s\n",
                               json_string_value(json_object_get(row, "kind")),
                               json_string_value(json_object_get(row, "id")),
                               json_string_value(json_object_get(row, "name")), (long long) kib_s,
                               (long long) peak, ended ? ended : "-");
                        tk += kib_s;
                        tp = MAX(tp, peak);
                }
                printf("%-10s %-38s %-20s %14lld %12lld\n", "TOTAL", "", "", (long long) tk, (long long) tp);
        }
        json_decref(rep);
        return 0;
}
