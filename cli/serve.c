/* SPDX-License-Identifier: Apache-2.0 */
/* `hutch serve` and `hutch key`: parse options, hand over to daemon/. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "daemon/serve.h"
#include "util/error.h"
#include "util/log.h"

static void serve_usage(FILE *f) {
        fputs("usage: hutch serve [--config FILE] [--SETTING VALUE]...\n"
              "\n"
              "Runs the E2B-compatible API on one HTTP port. Point the unmodified E2B SDK at it\n"
              "with E2B_API_URL and E2B_SANDBOX_URL (both http://LISTEN) and E2B_API_KEY (the key\n"
              "written to DATA_DIR/api-key on first start). Settings (also `key = value` lines in\n"
              "--config FILE; flags win over the file):\n\n",
              f);
        server_config_help(f);
}

int verb_serve(int argc, char **argv) {
        server_config cfg;
        server_config_defaults(&cfg);
        hutch_error err = { 0 };
        /* the config file first, so that flags override it */
        for (int i = 1; i < argc; i++) {
                if (streq(argv[i], "--config") && i + 1 < argc) {
                        if (server_config_load_file(&cfg, argv[i + 1], &err) < 0) {
                                log_error("%s", err.msg);
                                return EXIT_USAGE;
                        }
                } else if (startswith(argv[i], "--config=")) {
                        if (server_config_load_file(&cfg, argv[i] + 9, &err) < 0) {
                                log_error("%s", err.msg);
                                return EXIT_USAGE;
                        }
                }
        }
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (streq(a, "-h") || streq(a, "--help")) {
                        serve_usage(stdout);
                        return 0;
                }
                if (!startswith(a, "--")) {
                        log_error("serve: unexpected argument '%s'", a);
                        return EXIT_USAGE;
                }
                char key[64];
                const char *val;
                const char *eq = strchr(a, '=');
                if (eq) {
                        snprintf(key, sizeof key, "%.*s", (int) (eq - a - 2), a + 2);
                        val = eq + 1;
                } else {
                        snprintf(key, sizeof key, "%s", a + 2);
                        if (i + 1 >= argc) {
                                log_error("serve: --%s needs a value", key);
                                return EXIT_USAGE;
                        }
                        val = argv[++i];
                }
                if (streq(key, "config"))
                        continue;
                if (server_config_set(&cfg, key, val, &err) < 0) {
                        log_error("serve: %s", err.msg);
                        return EXIT_USAGE;
                }
        }
        log_set_prefix("hutch serve");
        return server_run(&cfg) < 0 ? 1 : 0;
}

static void key_usage(FILE *f) {
        fputs("usage: hutch key create [--team NAME] [--label TEXT] [--data-dir DIR]\n"
              "       hutch key list [--data-dir DIR]\n"
              "       hutch key revoke KEY_ID [--data-dir DIR]\n",
              f);
}

int verb_key(int argc, char **argv) {
        if (argc < 2 || streq(argv[1], "-h") || streq(argv[1], "--help")) {
                key_usage(argc < 2 ? stderr : stdout);
                return argc < 2 ? EXIT_USAGE : 0;
        }
        const char *sub = argv[1];
        const char *data_dir = getenv("HUTCH_DATA_DIR") ? getenv("HUTCH_DATA_DIR") : "/var/lib/hutch";
        const char *team = NULL, *label = "", *id = NULL;
        static const struct option longopts[] = {
                { "data-dir", required_argument, NULL, 'd' },
                { "team", required_argument, NULL, 't' },
                { "label", required_argument, NULL, 'l' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        /* argv[1] is the subcommand: options and the KEY_ID follow it */
        while ((c = getopt_long(argc - 1, argv + 1, ":h", longopts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        data_dir = optarg;
                        break;
                case 't':
                        team = optarg;
                        break;
                case 'l':
                        label = optarg;
                        break;
                case 'h':
                        key_usage(stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("key", c, argv + 1);
                        key_usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (optind < argc - 1)
                id = argv[1 + optind++];
        if (optind < argc - 1) {
                log_error("key %s: unexpected argument '%s'", sub, argv[1 + optind]);
                key_usage(stderr);
                return EXIT_USAGE;
        }
        /* usage errors change nothing: checked before the store is opened
         * (which creates the data dir and the database) */
        if (!streq(sub, "create") && !streq(sub, "list") && !streq(sub, "revoke")) {
                log_error("key: unknown subcommand '%s'", sub);
                key_usage(stderr);
                return EXIT_USAGE;
        }
        if ((streq(sub, "revoke") && !id) || (!streq(sub, "revoke") && id)) {
                if (id)
                        log_error("key %s: unexpected argument '%s'", sub, id);
                else
                        log_error("key revoke: wants a KEY_ID (see `hutch key list`)");
                key_usage(stderr);
                return EXIT_USAGE;
        }
        if (streq(sub, "revoke")) {
                char *e = NULL;
                (void) strtoll(id, &e, 10);
                if (!*id || *e) {
                        log_error("key revoke: wants a numeric KEY_ID (see `hutch key list`)");
                        key_usage(stderr);
                        return EXIT_USAGE;
                }
        }
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return 1;
        hutch_error err = { 0 };
        int r = 0;
        if (streq(sub, "create")) {
                int64_t team_id;
                const char *tn = team ? team : "default";
                r = store_team_find(st, tn, &team_id, &err);
                if (r == -ENOENT)
                        r = store_team_create(st, tn, &team_id, &err);
                char key[45];
                int64_t key_id;
                if (r >= 0)
                        r = store_key_create(st, team_id, label, key, &key_id, &err);
                if (r >= 0)
                        printf("%s\n", key);
        } else if (streq(sub, "list")) {
                store_key_info *v = NULL;
                size_t n = 0;
                r = store_key_list(st, &v, &n, &err);
                if (r >= 0) {
                        printf("%-6s %-16s %-14s %-8s %s\n", "ID", "TEAM", "PREFIX", "STATE", "LABEL");
                        for (size_t i = 0; i < n; i++)
                                printf("%-6lld %-16s %-14s %-8s %s\n", (long long) v[i].id, v[i].team, v[i].prefix,
                                       v[i].revoked_ms ? "revoked" : "active", v[i].label);
                        free(v);
                }
        } else if (streq(sub, "revoke")) {
                char *e = NULL;
                long long kid = id ? strtoll(id, &e, 10) : 0;
                if (!id || *e) {
                        log_error("key revoke: wants a numeric KEY_ID (see `hutch key list`)");
                        key_usage(stderr);
                        store_close(st);
                        return EXIT_USAGE;
                }
                r = store_key_revoke(st, kid, &err);
        } else {
                log_error("key: unknown subcommand '%s'", sub);
                key_usage(stderr);
                store_close(st);
                return EXIT_USAGE;
        }
        store_close(st);
        if (r < 0) {
                log_error("key %s: %s", sub, err.msg);
                return 1;
        }
        return 0;
}
