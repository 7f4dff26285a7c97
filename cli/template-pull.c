/* SPDX-License-Identifier: Apache-2.0 */
/* `hutch template pull`, `push` and `login` (lib/image/pull.h, lib/image/push.h). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "image/pull.h"
#include "image/push.h"
#include "image/reference.h"
#include "image/registry.h"
#include "util/fsutil.h"
#include "util/log.h"
#include "util/parse.h"

#define DEFAULT_DATA_DIR "/var/lib/hutch"

static const char pull_usage[] =
        "usage: hutch template pull [OPTIONS] REF\n"
        "\n"
        "Pull an image from an OCI distribution registry into template NAME\n"
        "(default: the last path component and the tag, python:3.12 -> python-3.12).\n"
        "A short name (python:3.12) resolves through registries.conf (search and\n"
        "mirror lines, docs/templates.md); layers already in the layer store are\n"
        "not downloaded again.\n"
        "\n"
        "  --name NAME              the template to write\n"
        "  --json                   one JSON object a line on stdout (progress, then the result)\n"
        "  --registries-conf FILE   instead of $HUTCH_REGISTRIES_CONF or DATA_DIR/registries.conf\n"
        "  --ca-file FILE           trust FILE's CAs too, for every registry\n"
        "  --parallel N             blobs downloaded at once (1-16, default 4)\n"
        "  --configured-only        refuse a registry registries.conf does not name (search,\n"
        "                           mirror, allow lines), as hutch serve does for its clients\n"
        "\n"
        "Prints the template's name on stdout. Exit status: 0 pulled, 2 usage or an\n"
        "invalid reference, 125 the pull failed (the message says why).\n";

static const char push_usage[] =
        "usage: hutch template push [OPTIONS] NAME REF\n"
        "\n"
        "Push template NAME to an OCI distribution registry as the image REF\n"
        "(REGISTRY/REPOSITORY[:TAG], default tag latest): its layers (each the\n"
        "canonical tar of its directory in the layer store, gzip), a config with\n"
        "its Env, WorkingDir, User, Cmd and its start and ready commands (labels\n"
        "dev.hutch.start-cmd, dev.hutch.ready-cmd), a manifest. `hutch template\n"
        "pull REF` on another host, or a node with template-registry, makes the\n"
        "same template of it. Blobs the registry has are not uploaded again.\n"
        "Credentials: `hutch template login REGISTRY`; TLS and plain HTTP as for\n"
        "pulls (registries.conf). Refused: the host template (the host's own\n"
        "/usr: nothing to push), a template one team owns.\n"
        "\n"
        "  --json                   one JSON object a line on stdout (progress, then the result)\n"
        "  --registries-conf FILE   instead of $HUTCH_REGISTRIES_CONF or DATA_DIR/registries.conf\n"
        "  --ca-file FILE           trust FILE's CAs too, for every registry\n"
        "\n"
        "Prints REGISTRY/REPOSITORY:TAG@DIGEST on stdout. Exit status: 0 pushed,\n"
        "2 usage or an invalid reference, 125 the push failed (the message says why).\n";

static const char login_usage[] =
        "usage: hutch template login [--username USER] [--remove] REGISTRY\n"
        "\n"
        "Store credentials for REGISTRY (HOST[:PORT], as references name it) in\n"
        "DATA_DIR/registries.auth (mode 0600); the password is read from stdin\n"
        "(one line, never an argument). --remove forgets them.\n";

static const char *data_dir(void) {
        const char *d = getenv("HUTCH_DATA_DIR");
        return d && *d ? d : DEFAULT_DATA_DIR;
}

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

typedef struct pull_view {
        bool json, tty;
        const char *ref;
        uint64_t start_ms, last_dl_ms, dl_start_ms;
        bool line_open, dl_started, dl_finished;
} pull_view;

static void human(uint64_t v, char *buf, size_t n) {
        if (v >= (1ull << 30))
                snprintf(buf, n, "%.2f GiB", (double) v / (1ull << 30));
        else if (v >= (1ull << 20))
                snprintf(buf, n, "%.1f MiB", (double) v / (1ull << 20));
        else if (v >= 1024)
                snprintf(buf, n, "%.1f KiB", (double) v / 1024);
        else
                snprintf(buf, n, "%llu B", (unsigned long long) v);
}

static void view_close_line(pull_view *v) {
        if (v->line_open) {
                fputc('\n', stderr);
                v->line_open = false;
        }
}

static void on_progress(void *arg, const image_progress_event *ev) {
        pull_view *v = arg;
        uint64_t t = now_ms();
        bool is_dl = streq(ev->phase, "download");
        /* download ticks arrive between the layer events (layers unpack while
         * the next ones download): the download's own state is kept apart */
        bool first_dl = is_dl && !v->dl_started;
        if (first_dl) {
                v->dl_started = true;
                v->dl_start_ms = t;
        }
        bool final_dl = is_dl && ev->done == ev->total && ev->layer == ev->n_layers;
        if (is_dl && v->dl_finished)
                return;
        if (is_dl && !first_dl && !final_dl && t - v->last_dl_ms < 100)
                return; /* at most 10 a second, and the last one */
        v->dl_finished |= final_dl;
        if (is_dl)
                v->last_dl_ms = t;
        double secs = (double) (t - v->dl_start_ms) / 1000.0;
        double rate = secs > 0.05 ? (double) ev->done / secs : 0;
        if (v->json) {
                json_t *j = json_pack("{s:s, s:I, s:I, s:i, s:i}", "phase", ev->phase, "done",
                                      (json_int_t) ev->done, "total", (json_int_t) ev->total,
                                      "layer", (int) ev->layer, "n_layers", (int) ev->n_layers);
                if (ev->digest)
                        json_object_set_new(j, "digest", json_string(ev->digest));
                if (is_dl)
                        json_object_set_new(j, "bytes_per_s", json_integer((json_int_t) rate));
                char *s = json_dumps(j, JSON_COMPACT);
                if (s)
                        printf("%s\n", s);
                fflush(stdout);
                free(s);
                json_decref(j);
                return;
        }
        char a[32], b[32], r[32];
        human(ev->done, a, sizeof a);
        human(ev->total, b, sizeof b);
        human((uint64_t) rate, r, sizeof r);
        if (is_dl && v->tty) {
                unsigned pct = ev->total ? (unsigned) (ev->done * 100 / ev->total) : 100;
                char bar[21];
                unsigned fill = pct / 5;
                for (unsigned i = 0; i < 20; i++)
                        bar[i] = i < fill ? '#' : '.';
                bar[20] = '\0';
                fprintf(stderr, "\r\033[Kdownloading [%s] %3u%% %s / %s, %u/%u blobs, %s/s", bar,
                        pct, a, b, ev->layer, ev->n_layers, r);
                v->line_open = true;
                if (final_dl)
                        view_close_line(v);
                return;
        }
        if (is_dl) {
                if (first_dl)
                        fprintf(stderr, "downloading %u blobs, %s\n", ev->n_layers, b);
                if (final_dl)
                        fprintf(stderr, "downloaded %s in %.1f s (%s/s)\n", a, secs, r);
                return;
        }
        view_close_line(v);
        if (streq(ev->phase, "resolve") && ev->digest)
                fprintf(stderr, "resolved %s to %s\n", v->ref, ev->digest);
        else if (streq(ev->phase, "layer") || streq(ev->phase, "exists"))
                fprintf(stderr, "layer %u/%u %.19s %s\n", ev->layer, ev->n_layers,
                        ev->digest ? ev->digest : "",
                        streq(ev->phase, "exists") ? "already in the store" : "unpacking");
}

static const char *errno_name(int r) {
        switch (-r) {
        case ENOENT:
                return "not_found";
        case EACCES:
                return "unauthorized";
        case EBADMSG:
                return "digest_mismatch";
        case EFBIG:
                return "too_large";
        case EHOSTUNREACH:
        case ECONNREFUSED:
        case ETIMEDOUT:
                return "network";
        case EPROTO:
                return "tls";
        case EINVAL:
                return "invalid";
        case EPERM:
                return "not_allowed";
        default:
                return "failed";
        }
}

int template_pull_main(int argc, char **argv) {
        const char *ref = NULL, *name = NULL;
        image_pull_opts opts = { 0 };
        bool json = false;
        static const struct option longopts[] = {
                { "json", no_argument, NULL, 'j' },
                { "name", required_argument, NULL, 'n' },
                { "registries-conf", required_argument, NULL, 'r' },
                { "configured-only", no_argument, NULL, 'o' },
                { "ca-file", required_argument, NULL, 'c' },
                { "parallel", required_argument, NULL, 'p' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
                switch (c) {
                case 'j':
                        json = true;
                        break;
                case 'n':
                        name = optarg;
                        break;
                case 'r':
                        opts.conf_path = optarg;
                        break;
                case 'o':
                        opts.configured_only = true;
                        break;
                case 'c':
                        opts.ca_file = optarg;
                        break;
                case 'p': {
                        uint64_t n;
                        if (parse_u64(optarg, REGISTRY_MAX_PARALLEL, &n) < 0 || n == 0) {
                                log_error("--parallel wants 1-%u", REGISTRY_MAX_PARALLEL);
                                return EXIT_USAGE;
                        }
                        opts.parallel = (unsigned) n;
                        break;
                }
                case 'h':
                        fputs(pull_usage, stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("template pull", c, argv);
                        fputs(pull_usage, stderr);
                        return EXIT_USAGE;
                }
        }
        if (optind < argc)
                ref = argv[optind++];
        if (optind < argc) {
                log_error("one reference only ('%s', then '%s')", ref, argv[optind]);
                return EXIT_USAGE;
        }
        if (!ref) {
                fputs(pull_usage, stderr);
                return EXIT_USAGE;
        }
        image_reference parsed = { 0 };
        hutch_error err = { 0 };
        if (image_reference_parse(ref, &parsed, &err) < 0) {
                log_error("pull %s: %s", ref, err.msg);
                return EXIT_USAGE;
        }
        image_reference_clear(&parsed);
        pull_view v = {
                .json = json, .tty = !json && isatty(STDERR_FILENO), .ref = ref, .start_ms = now_ms()
        };
        image_progress p = { .fn = on_progress, .arg = &v };
        image_pull_result res = { 0 };
        int r = image_pull(data_dir(), ref, name, &opts, &p, &res, &err);
        view_close_line(&v);
        if (r < 0) {
                if (json) {
                        json_t *j = json_pack("{s:s, s:s, s:s}", "phase", "error", "error",
                                              errno_name(r), "message", err.msg);
                        char *s = json_dumps(j, JSON_COMPACT);
                        if (s)
                                printf("%s\n", s);
                        free(s);
                        json_decref(j);
                }
                log_error("pull %s: %s", ref, err.msg);
                return EXIT_HUTCH;
        }
        double secs = (double) (now_ms() - v.start_ms) / 1000.0;
        cli_audit_note(data_dir(), "template.pull",
                       json_pack("{s:s, s:s?, s:s, s:I, s:s}", "ref", ref, "source", res.source, "image", res.name,
                                 "bytes_downloaded", (json_int_t) res.bytes_downloaded, "by", "cli"));
        if (json) {
                json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:i, s:i, s:i, s:i}", "phase",
                                      "pulled", "name", res.name, "source", res.source, "host",
                                      res.host, "bytes_downloaded", (json_int_t) res.bytes_downloaded,
                                      "blobs_downloaded", (int) res.blobs_downloaded, "layers",
                                      (int) res.layers, "layers_present", (int) res.layers_present,
                                      "ms", (int) (secs * 1000));
                char *s = json_dumps(j, JSON_COMPACT);
                if (s)
                        printf("%s\n", s);
                free(s);
                json_decref(j);
        } else {
                char b[32];
                human(res.bytes_downloaded, b, sizeof b);
                fprintf(stderr,
                        "pulled %s as template %s: %u layers (%u already stored), %s downloaded in %.1f s\n",
                        res.source, res.name, res.layers, res.layers_present, b, secs);
                printf("%s\n", res.name);
        }
        image_pull_result_clear(&res);
        return 0;
}

static void on_push_progress(void *arg, const image_progress_event *ev) {
        pull_view *v = arg;
        if (v->json) {
                json_t *j = json_pack("{s:s, s:I, s:i, s:i}", "phase", ev->phase, "size",
                                      (json_int_t) ev->total, "layer", (int) ev->layer, "n_layers",
                                      (int) ev->n_layers);
                if (ev->digest)
                        json_object_set_new(j, "digest", json_string(ev->digest));
                char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
                if (s)
                        printf("%s\n", s);
                fflush(stdout);
                free(s);
                json_decref(j);
                return;
        }
        char b[32];
        human(ev->total, b, sizeof b);
        if (streq(ev->phase, "layer"))
                fprintf(stderr, "layer %u/%u %.19s: tar and gzip\n", ev->layer, ev->n_layers,
                        ev->digest ? ev->digest : "");
        else if (streq(ev->phase, "exists"))
                fprintf(stderr, "layer %u/%u %.19s (%s) already in the registry\n", ev->layer,
                        ev->n_layers, ev->digest ? ev->digest : "", b);
        else if (streq(ev->phase, "mounted"))
                fprintf(stderr, "layer %u/%u %.19s (%s) mounted from another repository\n",
                        ev->layer, ev->n_layers, ev->digest ? ev->digest : "", b);
        else if (streq(ev->phase, "upload"))
                fprintf(stderr, "layer %u/%u %.19s uploading %s\n", ev->layer, ev->n_layers,
                        ev->digest ? ev->digest : "", b);
}

int template_push_main(int argc, char **argv) {
        const char *name = NULL, *ref = NULL;
        image_push_opts opts = { 0 };
        bool json = false;
        static const struct option longopts[] = {
                { "json", no_argument, NULL, 'j' },
                { "registries-conf", required_argument, NULL, 'r' },
                { "ca-file", required_argument, NULL, 'c' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
                switch (c) {
                case 'j':
                        json = true;
                        break;
                case 'r':
                        opts.conf_path = optarg;
                        break;
                case 'c':
                        opts.ca_file = optarg;
                        break;
                case 'h':
                        fputs(push_usage, stdout);
                        return 0;
                default:
                        (void) cli_getopt_error("template push", c, argv);
                        fputs(push_usage, stderr);
                        return EXIT_USAGE;
                }
        }
        if (argc - optind != 2) {
                if (argc - optind > 2)
                        log_error("a template and a reference, nothing more ('%s')", argv[optind + 2]);
                fputs(push_usage, stderr);
                return EXIT_USAGE;
        }
        name = argv[optind];
        ref = argv[optind + 1];
        image_reference parsed = { 0 };
        hutch_error err = { 0 };
        if (image_reference_parse(ref, &parsed, &err) < 0) {
                log_error("push %s: %s", ref, err.msg);
                return EXIT_USAGE;
        }
        image_reference_clear(&parsed);
        pull_view v = { .json = json, .ref = ref, .start_ms = now_ms() };
        image_progress p = { .fn = on_push_progress, .arg = &v };
        image_push_result res = { 0 };
        int r = image_push(data_dir(), name, ref, &opts, &p, &res, &err);
        if (r < 0) {
                if (json) {
                        json_t *j = json_pack("{s:s, s:s, s:s}", "phase", "error", "error",
                                              errno_name(r), "message", err.msg);
                        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
                        if (s)
                                printf("%s\n", s);
                        free(s);
                        json_decref(j);
                }
                log_error("push %s: %s", name, err.msg);
                return r == -EINVAL ? EXIT_USAGE : EXIT_HUTCH;
        }
        double secs = (double) (now_ms() - v.start_ms) / 1000.0;
        cli_audit_note(data_dir(), "template.push",
                       json_pack("{s:s, s:s, s:s?, s:I, s:s}", "template", name, "ref", ref, "target",
                                 res.target, "bytes_uploaded", (json_int_t) res.bytes_uploaded, "by", "cli"));
        if (json) {
                json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:I, s:i}", "phase",
                                      "pushed", "name", name, "target", res.target, "layers",
                                      (int) res.layers, "blobs_uploaded", (int) res.blobs_uploaded,
                                      "blobs_present", (int) res.blobs_present, "blobs_mounted",
                                      (int) res.blobs_mounted, "bytes_uploaded",
                                      (json_int_t) res.bytes_uploaded, "ms", (int) (secs * 1000));
                char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
                if (s)
                        printf("%s\n", s);
                free(s);
                json_decref(j);
        } else {
                char b[32];
                human(res.bytes_uploaded, b, sizeof b);
                fprintf(stderr,
                        "pushed template %s as %s: %u layers, %u blobs uploaded (%s), %u mounted "
                        "from another repository, %u already there, in %.1f s\n",
                        name, res.target, res.layers, res.blobs_uploaded, b, res.blobs_mounted,
                        res.blobs_present, secs);
                printf("%s\n", res.target);
        }
        image_push_result_clear(&res);
        return 0;
}

/* One line from stdin, without echo on a terminal. */
static int read_password(char *buf, size_t n) {
        struct termios old, quiet;
        bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &old) == 0;
        if (tty) {
                fputs("password: ", stderr);
                quiet = old;
                quiet.c_lflag &= ~(tcflag_t) ECHO;
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
        }
        bool got = fgets(buf, (int) n, stdin) != NULL;
        if (tty) {
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
                fputc('\n', stderr);
        }
        if (!got)
                return -ENODATA;
        size_t l = strlen(buf);
        if (l == n - 1 && buf[l - 1] != '\n')
                return -E2BIG;
        while (l && (buf[l - 1] == '\n' || buf[l - 1] == '\r'))
                buf[--l] = '\0';
        return l ? 0 : -ENODATA;
}

int template_login_main(int argc, char **argv) {
        const char *host = NULL, *user = NULL;
        bool remove = false;
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (streq(a, "--help") || streq(a, "-h")) {
                        fputs(login_usage, stdout);
                        return 0;
                } else if ((streq(a, "--username") || streq(a, "-u")) && i + 1 < argc)
                        user = argv[++i];
                else if (streq(a, "--remove"))
                        remove = true;
                else if (a[0] == '-') {
                        log_error("unknown or incomplete option '%s'\n%s", a, login_usage);
                        return EXIT_USAGE;
                } else if (!host)
                        host = a;
                else {
                        log_error("one registry only\n%s", login_usage);
                        return EXIT_USAGE;
                }
        }
        if (!host || (!remove && !user)) {
                log_error("%s", remove || host ? "--username is required\n" : "");
                fputs(login_usage, stderr);
                return EXIT_USAGE;
        }
        if (!image_registry_host_valid(host)) {
                log_error("invalid registry '%s' (HOST[:PORT], as an image reference names it)",
                          host);
                return EXIT_USAGE;
        }
        char path[4096];
        hutch_error err = { 0 };
        if (registry_auth_path(data_dir(), path, sizeof path) < 0) {
                log_error("data dir path too long");
                return EXIT_USAGE;
        }
        int r = mkdir_p(data_dir(), 0755);
        if (r < 0) {
                log_error("creating %s: %s", data_dir(), strerror(-r));
                return EXIT_HUTCH;
        }
        if (remove)
                r = registry_auth_set(path, host, NULL, NULL, &err);
        else {
                char pass[4096];
                r = read_password(pass, sizeof pass);
                if (r < 0) {
                        explicit_bzero(pass, sizeof pass);
                        log_error(r == -E2BIG ? "password longer than 4095 bytes"
                                              : "no password on stdin (one line: printf '%%s\\n' \"$PW\" | hutch template "
                                                "login ...)");
                        return EXIT_USAGE;
                }
                r = registry_auth_set(path, host, user, pass, &err);
                explicit_bzero(pass, sizeof pass);
        }
        if (r < 0) {
                log_error("login %s: %s", host, err.msg);
                return EXIT_HUTCH;
        }
        fprintf(stderr,
                remove ? "removed the credentials for %s from %s\n"
                       : "stored the credentials for %s in %s\n",
                host, path);
        return 0;
}
