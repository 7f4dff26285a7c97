/* SPDX-License-Identifier: Apache-2.0 */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cli/cli.h"
#include "config.h"
#include "util/log.h"

static void usage(FILE *f) {
        fputs("usage: hutch VERB [OPTIONS]\n"
              "\n"
              "  run [OPTIONS] -- CMD [ARG...]   run a command in a fresh sandbox\n"
              "  serve [OPTIONS]                 the E2B-compatible API daemon (--help)\n"
              "  key create|list|revoke          manage the daemon's API keys\n"
              "  volume create|ls|rm             manage named persistent volumes (--help)\n"
              "  audit verify|export|pubkey      check and export the audit trail (--help)\n"
              "  usage [--team T] [--by day]     the usage ledger: what each sandbox used (--help)\n"
              "  ps [-a] [-q] [--filter K=V]     list this host's live sandboxes (-a: dead ones too)\n"
              "  exec [-i] [-t] ID -- CMD        run a command in a live sandbox (--help)\n"
              "  logs [-f] ID                    what happened in a daemon's sandbox, from its audit trail\n"
              "  kill ID...                      destroy sandboxes\n"
              "  router [OPTIONS]                a stateless front end for several daemons (--help)\n"
              "  node drain|undrain|status       stop (or resume) taking creates on this host's daemon\n"
              "  gc                              remove sandboxes whose init died, and unused template versions\n"
              "  template import|ls|rm|prune|build  OCI images and build files as templates (`hutch template help`)\n"
              "  doctor                          check what the kernel offers\n"
              "  version                         print the version\n"
              "\n"
              "Environment: HUTCH_RUN_DIR (default /run/hutch), HUTCH_DATA_DIR (default\n"
              "/var/lib/hutch), HUTCH_STORAGE (auto|ext4|tmpfs), HUTCH_CGROUP (v1|v2),\n"
              "HUTCH_BACKEND (ns|gvisor, for run), HUTCH_DEBUG=1 for debug logs.\n"
              "`hutch run --help` and `hutch serve --help` list their options.\n",
              f);
}

int cli_ctx(hutch_ctx **ret) {
        hutch_error err = { 0 };
        int r = hutch_ctx_new(NULL, ret, &err);
        if (r < 0) {
                log_error("%s", err.msg);
                return r;
        }
        return 0;
}

int cli_getopt_error(const char *verb, int c, char **argv) {
        const char *arg = optind > 0 ? argv[optind - 1] : "";
        if (c == ':')
                log_error("%s: option '%s' needs a value (see `hutch %s --help`)", verb, arg, verb);
        else if (optopt && optopt < 256)
                log_error("%s: unknown option '-%c' (see `hutch %s --help`)", verb, optopt, verb);
        else
                log_error("%s: unknown option '%s' (see `hutch %s --help`)", verb, arg, verb);
        return EXIT_USAGE;
}

char **cli_argv;

int cli_exec_full(void) {
        char exe[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - sizeof "hutch-full");
        char *slash = k > 0 ? memrchr(exe, '/', (size_t) k) : NULL;
        if (!slash) {
                log_error("cannot find hutch-full: /proc/self/exe: %m");
                return EXIT_HUTCH;
        }
        /* next to this binary, as built (build/cli/) and as installed */
        strcpy(slash + 1, "hutch-full");
        execv(exe, cli_argv);
        log_error("%s: %m (hutch-full is installed next to hutch)", exe);
        return EXIT_HUTCH;
}

int main(int argc, char **argv) {
        cli_argv = argv;
        if (argc < 2) {
                usage(stderr);
                return EXIT_USAGE;
        }
        const char *verb = argv[1];
        if (streq(verb, "run"))
                return verb_run(argc - 1, argv + 1);
#ifdef HUTCH_CLI_LEAN
        if (!streq(verb, "version") && !streq(verb, "--version") && !streq(verb, "help") &&
            !streq(verb, "--help") && !streq(verb, "-h"))
                return cli_exec_full();
#else
        /* exec'd by the lean hutch: keep the name that ps, pgrep and the
         * leak checks know */
        (void) prctl(PR_SET_NAME, "hutch");
        if (streq(verb, "doctor"))
                return verb_doctor(argc - 1, argv + 1);
        if (streq(verb, "ps"))
                return verb_ps(argc - 1, argv + 1);
        if (streq(verb, "kill"))
                return verb_kill(argc - 1, argv + 1);
        if (streq(verb, "exec"))
                return verb_exec(argc - 1, argv + 1);
        if (streq(verb, "serve"))
                return verb_serve(argc - 1, argv + 1);
        if (streq(verb, "key"))
                return verb_key(argc - 1, argv + 1);
        if (streq(verb, "volume"))
                return verb_volume(argc - 1, argv + 1);
        if (streq(verb, "template"))
                return verb_template(argc - 1, argv + 1);
        if (streq(verb, "usage"))
                return verb_usage(argc - 1, argv + 1);
        if (streq(verb, "audit"))
                return verb_audit(argc - 1, argv + 1);
        if (streq(verb, "logs"))
                return verb_logs(argc - 1, argv + 1);
        if (streq(verb, "router"))
                return verb_router(argc - 1, argv + 1);
        if (streq(verb, "node"))
                return verb_node(argc - 1, argv + 1);
        if (streq(verb, "gc"))
                return verb_gc(argc - 1, argv + 1);
#endif
        if (streq(verb, "version") || streq(verb, "--version")) {
                if (argc > 2) {
                        log_error("unknown argument '%s' (usage: hutch version)", argv[2]);
                        return EXIT_USAGE;
                }
                printf("hutch %s\n", HUTCH_VERSION);
                return 0;
        }
        if (streq(verb, "help") || streq(verb, "--help") || streq(verb, "-h")) {
                usage(stdout);
                return 0;
        }
        log_error("unknown verb '%s' (try `hutch help`)", verb);
        return EXIT_USAGE;
}
