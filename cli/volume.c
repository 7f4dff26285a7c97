/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch volume create|ls|rm: named volumes of a data dir (docs/volumes.md).
 *
 * Safe while a daemon serves the same data dir: the daemon keeps no volume
 * state of its own in memory. Rows are written through the store (SQLite,
 * which serialises writers), images under DATA_DIR/volumes/.lock, and a
 * delete marks the row before the image goes, exactly as the API's does.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "cli/cli.h"
#include "daemon/serve.h"
#include "util/log.h"
#include "util/parse.h"

#define DEFAULT_VOLUME_SIZE (1ull << 30)

static void volume_usage(FILE *f) {
        fputs("usage: hutch volume create NAME [--size SIZE] [--team NAME] [--data-dir DIR]\n"
              "       hutch volume ls [--team NAME] [--data-dir DIR]\n"
              "       hutch volume rm NAME [--team NAME] [--data-dir DIR]\n"
              "\n"
              "  --size SIZE      the volume's size limit (default: 1G; from 8M to 1T)\n"
              "  --team NAME      the team that owns it (default: default, the team of `hutch key create`)\n"
              "  --data-dir DIR   the data dir (default: $HUTCH_DATA_DIR, else /var/lib/hutch)\n"
              "\n"
              "Mount one with `hutch run --volume NAME:/path` or the E2B SDK's volumeMounts.\n",
              f);
}

int cli_volume_new_id(char out[HUTCH_VOLUME_ID_LEN + 1]) {
        uint8_t b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t) sizeof b)
                return -errno;
        b[6] = (uint8_t) ((b[6] & 0x0f) | 0x40);
        b[8] = (uint8_t) ((b[8] & 0x3f) | 0x80);
        snprintf(out, HUTCH_VOLUME_ID_LEN + 1,
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                 b[15]);
        return 0;
}

int cli_volume_team(hutch_store *st, const char *team, bool create, int64_t *ret, hutch_error *err) {
        int r = store_team_find(st, team, ret, err);
        if (r == -ENOENT && create)
                r = store_team_create(st, team, ret, err);
        return r;
}

int cli_volume_resolve(const char *const *names, size_t n, char (*ret_ids)[HUTCH_VOLUME_ID_LEN + 1]) {
        const char *data_dir = getenv("HUTCH_DATA_DIR") ? getenv("HUTCH_DATA_DIR") : "/var/lib/hutch";
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return -EIO;
        hutch_error err = { 0 };
        int64_t team;
        int r = cli_volume_team(st, "default", false, &team, &err);
        if (r == -ENOENT)
                hutch_error_set(&err, r, "no volumes exist yet (hutch volume create NAME)");
        for (size_t i = 0; r >= 0 && i < n; i++) {
                store_volume v;
                r = store_volume_find(st, team, names[i], &v, &err);
                if (r >= 0)
                        memcpy(ret_ids[i], v.id, HUTCH_VOLUME_ID_LEN + 1);
                else if (r == -ENOENT)
                        hutch_error_set(
                                &err, r,
                                "volume '%s' not found (create it with `hutch volume create %s`)",
                                names[i], names[i]);
        }
        store_close(st);
        if (r < 0)
                log_error("%s", err.msg);
        return r;
}

int verb_volume(int argc, char **argv) {
        if (argc < 2 || streq(argv[1], "-h") || streq(argv[1], "--help")) {
                volume_usage(argc < 2 ? stderr : stdout);
                return argc < 2 ? EXIT_USAGE : 0;
        }
        const char *sub = argv[1];
        const char *data_dir = getenv("HUTCH_DATA_DIR") ? getenv("HUTCH_DATA_DIR") : "/var/lib/hutch";
        const char *team = "default", *name = NULL;
        uint64_t size = DEFAULT_VOLUME_SIZE;
        static const struct option longopts[] = {
                { "data-dir", required_argument, NULL, 'd' },
                { "team", required_argument, NULL, 't' },
                { "size", required_argument, NULL, 's' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        /* argv[1] is the subcommand: options and the NAME follow it */
        while ((c = getopt_long(argc - 1, argv + 1, ":h", longopts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        data_dir = optarg;
                        break;
                case 't':
                        team = optarg;
                        break;
                case 's':
                        if (parse_size(optarg, &size) < 0 || size < HUTCH_VOLUME_MIN_BYTES ||
                            size > HUTCH_MAX_DISK) {
                                log_error("volume: invalid --size '%s' (expected a size from 8M to 1T, like 1G)",
                                          optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case 'h':
                        volume_usage(stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("volume", c, argv + 1);
                        volume_usage(stderr);
                        return EXIT_USAGE;
                }
        }
        if (optind < argc - 1)
                name = argv[1 + optind++];
        if (optind < argc - 1) {
                log_error("volume %s: unexpected argument '%s'", sub, argv[1 + optind]);
                volume_usage(stderr);
                return EXIT_USAGE;
        }
        bool is_create = streq(sub, "create"), is_ls = streq(sub, "ls") || streq(sub, "list"),
             is_rm = streq(sub, "rm") || streq(sub, "remove");
        if (!is_create && !is_ls && !is_rm) {
                log_error("volume: unknown subcommand '%s'", sub);
                volume_usage(stderr);
                return EXIT_USAGE;
        }
        if (is_ls && name) {
                log_error("volume ls: unexpected argument '%s'", name);
                return EXIT_USAGE;
        }
        if (!is_ls && !name) {
                log_error("volume %s: wants a NAME", sub);
                volume_usage(stderr);
                return EXIT_USAGE;
        }
        if (name && !cli_volume_name_valid(name)) {
                log_error("volume: invalid name '%s' (letters, digits, '_' and '-', at most 128)",
                          name);
                return EXIT_USAGE;
        }
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return 1;
        hutch_ctx *ctx = NULL;
        hutch_error err = { 0 };
        hutch_ctx_config cc = { .data_dir = data_dir };
        int r = hutch_ctx_new(&cc, &ctx, &err);
        int64_t team_id = 0;
        if (r >= 0)
                r = cli_volume_team(st, team, is_create, &team_id, &err);
        if (r == -ENOENT && !is_create)
                r = hutch_error_set(&err, -ENOENT,
                                    is_ls ? "team '%s' has no volumes" : "volume '%s' not found",
                                    is_ls ? team : name);
        if (r >= 0 && is_create) {
                store_volume v = { .team_id = team_id,
                                   .size_bytes = (int64_t) size,
                                   .created_ms = (int64_t) time(NULL) * 1000 };
                store_volume old;
                hutch_error e2 = { 0 };
                snprintf(v.name, sizeof v.name, "%s", name);
                if (store_volume_find(st, team_id, name, &old, &e2) == 0)
                        r = hutch_error_set(&err, -EEXIST, "volume with name '%s' already exists",
                                            name);
                if (r >= 0 && (r = cli_volume_new_id(v.id)) < 0)
                        hutch_error_set(&err, r, "getrandom: %s", strerror(-r));
                if (r >= 0)
                        r = hutch_volume_create(ctx, v.id, size, &err);
                if (r >= 0 && (r = store_volume_insert(st, &v, &err)) < 0)
                        (void) hutch_volume_remove(ctx, v.id, &e2);
                if (r >= 0)
                        printf("%s\n", v.id);
        } else if (r >= 0 && is_ls) {
                store_volume *v = NULL;
                size_t n = 0;
                if ((r = store_volume_list(st, team_id, &v, &n, &err)) >= 0) {
                        printf("%-36s %-24s %8s %8s\n", "ID", "NAME", "SIZE", "USED");
                        for (size_t i = 0; i < n; i++) {
                                uint64_t sz = 0, used = 0;
                                char a[32], b[32];
                                hutch_error e2 = { 0 };
                                (void) hutch_volume_usage(ctx, v[i].id, &sz, &used, &e2);
                                printf("%-36s %-24s %8s %8s\n", v[i].id, v[i].name,
                                       format_size((uint64_t) v[i].size_bytes, a, sizeof a),
                                       format_size(used, b, sizeof b));
                        }
                        free(v);
                }
        } else if (r >= 0 && is_rm) {
                store_volume v;
                if ((r = store_volume_find(st, team_id, name, &v, &err)) == -ENOENT)
                        hutch_error_set(&err, -ENOENT, "volume '%s' not found", name);
                if (r >= 0)
                        r = store_volume_set_deleting(st, team_id, v.id, &err);
                if (r >= 0) {
                        r = hutch_volume_remove(ctx, v.id, &err);
                        if (r == -ENOENT)
                                r = 0; /* no image: only the row was left */
                }
                if (r >= 0)
                        r = store_volume_delete(st, v.id, &err);
        }
        hutch_ctx_free(ctx);
        store_close(st);
        if (r < 0) {
                log_error("volume %s: %s", sub, err.msg);
                return 1;
        }
        return 0;
}
