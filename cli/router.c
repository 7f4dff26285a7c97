/* SPDX-License-Identifier: Apache-2.0 */
/* `hutch router` (router/) and `hutch node drain|undrain|status`. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "router/router.h"
#include "util/log.h"
#include "util/macro.h"

static void router_usage(FILE *f) {
        fputs("usage: hutch router [OPTIONS]\n"
              "\n"
              "A stateless front end for several `hutch serve` nodes: point the E2B SDK at it\n"
              "(E2B_API_URL and E2B_SANDBOX_URL both http://LISTEN) as at one daemon. Requests\n"
              "are forwarded by the node id that begins every sandbox and snapshot id, creates\n"
              "go to the best of --sample nodes, lists are merged from every node. Replicas\n"
              "share nothing: run as many as you like (docs/scale-out.md).\n"
              "\n"
              "  --listen HOST:PORT       address of the router (default 127.0.0.1:49980)\n"
              "  --nodes URL,...          nodes, http://HOST:PORT (https:// with --node-tls-ca),\n"
              "                           comma-separated\n"
              "  --nodes-dns NAME:PORT    every A record of NAME is a node (a Kubernetes headless\n"
              "                           Service), re-resolved every --poll-interval\n"
              "  --dns IP[:PORT]          nameserver for --nodes-dns (default: /etc/resolv.conf's first)\n"
              "  --key-file FILE          a key every node accepts (\"TEAM KEY\" or \"KEY\" lines: the\n"
              "                           first), used only for the nodes' GET /node\n"
              "  --node-tls-ca FILE       speak TLS to every node (each serves --tls-cert) and accept\n"
              "                           only certificates that chain to FILE's (PEM); a node\n"
              "                           whose certificate fails is down (default: plain HTTP)\n"
              "  --node-tls-name NAME     the name every node certificate must carry (a DNS SAN);\n"
              "                           default: the node's address, an IP SAN for an IP\n"
              "  --node-tls-cert FILE     with --node-tls-key: the router's client certificate (PEM\n"
              "                           chain), shown to every node; nodes with tls-client-ca\n"
              "                           (mutual TLS) refuse a router without one they trust\n"
              "  --node-tls-key FILE      the private key of --node-tls-cert (PEM)\n"
              "  --sample K               nodes sampled per create (default 2)\n"
              "  --poll-interval MS       GET /node of every node this often (default 1000)\n"
              "  --connect-timeout MS     a node that does not accept a connection within this is\n"
              "                           marked down (default 1000)\n"
              "  --max-body BYTES         request bodies the router holds: creates, secret writes,\n"
              "                           signed uploads without a sandbox id (default 16777216)\n"
              "  --max-connections N      client connections open at once, one thread each; more are\n"
              "                           closed at once (default 16384)\n"
              "  --max-sandboxes-per-team N\n"
              "                           live sandboxes a team may have across all nodes (429\n"
              "                           beyond; default 0: only each node's own limit)\n"
              "  --max-snapshots-per-team N\n"
              "                           snapshots a team may keep across all nodes (429 at\n"
              "                           createSnapshot beyond; default 0: only each node's own limit)\n",
              f);
}

static int set_u(const char *name, const char *v, unsigned long long min, unsigned long long max,
                 unsigned long long *ret) {
        char *e;
        errno = 0;
        unsigned long long x = strtoull(v, &e, 10);
        if (errno || *e || !*v || x < min || x > max) {
                log_error("router: --%s must be %llu..%llu, not '%s'", name, min, max, v);
                return -EINVAL;
        }
        *ret = x;
        return 0;
}

int verb_router(int argc, char **argv) {
        router_config cfg;
        router_config_defaults(&cfg);
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (streq(a, "-h") || streq(a, "--help")) {
                        router_usage(stdout);
                        return 0;
                }
                if (!startswith(a, "--") || i + 1 >= argc) {
                        log_error("router: unexpected or incomplete argument '%s' (try --help)", a);
                        return EXIT_USAGE;
                }
                const char *v = argv[++i];
                unsigned long long x;
                int r = 0;
                struct {
                        const char *name;
                        char *dst;
                        size_t size;
                } strs[] = { { "--listen", cfg.listen, sizeof cfg.listen },
                             { "--nodes", cfg.nodes, sizeof cfg.nodes },
                             { "--nodes-dns", cfg.nodes_dns, sizeof cfg.nodes_dns },
                             { "--dns", cfg.dns, sizeof cfg.dns },
                             { "--key-file", cfg.key_file, sizeof cfg.key_file },
                             { "--node-tls-ca", cfg.node_tls_ca, sizeof cfg.node_tls_ca },
                             { "--node-tls-name", cfg.node_tls_name, sizeof cfg.node_tls_name },
                             { "--node-tls-cert", cfg.node_tls_cert, sizeof cfg.node_tls_cert },
                             { "--node-tls-key", cfg.node_tls_key, sizeof cfg.node_tls_key } };
                bool done = false;
                for (size_t k = 0; k < ELEMENTSOF(strs); k++)
                        if (streq(a, strs[k].name)) {
                                if (strlen(v) >= strs[k].size) {
                                        log_error("router: %s: too long", a);
                                        return EXIT_USAGE;
                                }
                                snprintf(strs[k].dst, strs[k].size, "%s", v);
                                done = true;
                        }
                if (done)
                        continue;
                if (streq(a, "--sample") && (r = set_u("sample", v, 1, 64, &x)) >= 0)
                        cfg.sample = (unsigned) x;
                else if (streq(a, "--poll-interval") &&
                         (r = set_u("poll-interval", v, 100, 60000, &x)) >= 0)
                        cfg.poll_ms = (unsigned) x;
                else if (streq(a, "--connect-timeout") &&
                         (r = set_u("connect-timeout", v, 10, 60000, &x)) >= 0)
                        cfg.connect_timeout_ms = (unsigned) x;
                else if (streq(a, "--max-connections") &&
                         (r = set_u("max-connections", v, 4, 1000000, &x)) >= 0)
                        cfg.max_connections = (unsigned) x;
                else if (streq(a, "--max-body") &&
                         (r = set_u("max-body", v, 1024, 1ull << 32, &x)) >= 0)
                        cfg.max_body = x;
                else if (streq(a, "--max-sandboxes-per-team") &&
                         (r = set_u("max-sandboxes-per-team", v, 0, 1000000, &x)) >= 0)
                        cfg.max_sandboxes_per_team = (unsigned) x;
                else if (streq(a, "--max-snapshots-per-team") &&
                         (r = set_u("max-snapshots-per-team", v, 0, 1000000, &x)) >= 0)
                        cfg.max_snapshots_per_team = (unsigned) x;
                else {
                        if (r >= 0)
                                log_error("router: unknown option '%s' (try --help)", a);
                        return EXIT_USAGE;
                }
        }
        log_set_prefix("hutch router");
        return router_run(&cfg) < 0 ? 1 : 0;
}

static void node_usage(FILE *f) {
        fputs("usage: hutch node drain|undrain|status [--data-dir DIR]\n"
              "\n"
              "drain: the daemon of DIR (default $HUTCH_DATA_DIR or /var/lib/hutch) answers every\n"
              "create with 503 from now on, so routers place creates elsewhere; its running and\n"
              "paused sandboxes are not touched and keep being served until they end or time out.\n"
              "undrain: creates are taken again. status: says which.\n",
              f);
}

int verb_node(int argc, char **argv) {
        if (argc < 2 || streq(argv[1], "-h") || streq(argv[1], "--help")) {
                node_usage(argc < 2 ? stderr : stdout);
                return argc < 2 ? EXIT_USAGE : 0;
        }
        const char *sub = argv[1];
        const char *dir = getenv("HUTCH_DATA_DIR");
        if (!dir || !*dir)
                dir = "/var/lib/hutch";
        static const struct option longopts[] = {
                { "data-dir", required_argument, NULL, 'd' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc - 1, argv + 1, ":h", longopts, NULL)) != -1) {
                switch (c) {
                case 'd':
                        dir = optarg;
                        break;
                case 'h':
                        node_usage(stdout);
                        return 0;
                default:
                        return cli_getopt_error("node", c, argv + 1);
                }
        }
        if (optind < argc - 1) {
                log_error("node %s: unexpected argument '%s'", sub, argv[1 + optind]);
                return EXIT_USAGE;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/draining", dir);
        if (streq(sub, "drain")) {
                int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
                if (fd < 0) {
                        log_error("node drain: %s: %m", path);
                        return 1;
                }
                close(fd);
                printf("draining: new creates answer 503; running sandboxes are kept until they end\n");
                return 0;
        }
        if (streq(sub, "undrain")) {
                if (unlink(path) < 0 && errno != ENOENT) {
                        log_error("node undrain: %s: %m", path);
                        return 1;
                }
                printf("taking creates\n");
                return 0;
        }
        if (streq(sub, "status")) {
                printf("%s\n", access(path, F_OK) == 0 ? "draining" : "taking creates");
                return 0;
        }
        node_usage(stderr);
        return EXIT_USAGE;
}
