/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch run: one command in a fresh sandbox, streamed, then nothing left.
 */
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>

#include "cli/cli.h"
#include "template/template.h"
#include "egress/policy.h"
#include "egress/proxy.h"
#include "template/interp-template.h"
#include "template/template.h"

/* How long the command has to end after a forwarded SIGINT/SIGTERM/SIGHUP
 * before the sandbox is destroyed (a second signal does it at once). */
#define SIGNAL_GRACE_NS (5ll * 1000000000)
#include "util/clock.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/parse.h"

#define MAX_ENV 1024

static void run_usage(FILE *f) {
        fputs("usage: hutch run [OPTIONS] -- CMD [ARG...]\n"
              "\n"
              "  --template NAME      template for the root filesystem (default: host)\n"
              "  --backend ns|gvisor  isolation: namespaces around the host kernel (ns, the default:\n"
              "                       $HUTCH_BACKEND) or runsc's user-space kernel (gvisor)\n"
              "  --memory SIZE        memory limit, swap off (default: 512M)\n"
              "  --pids N             process/thread limit (default: 512)\n"
              "  --cpus N             CPU quota, fractions allowed (default: 2)\n"
              "  --disk SIZE          size of the writable layer (default: 1G)\n"
              "  --inodes N           inodes of the writable layer (default: 262144; ns only)\n"
              "  --net POLICY         egress: deny (the default: loopback only, no proxy), allow\n"
              "                       (every public destination), or rules: example.com,\n"
              "                       *.example.com:443, 10.1.2.0/24, !bad.example.com (docs/egress.md)\n"
              "  --net-open CIDR,...  reserved ranges (private, link-local, ...) the rules may reach\n"
              "  --dns IP,...         nameservers of the egress proxy (default: /etc/resolv.conf's)\n"
              "  --net-log            print every egress decision as a JSON line on stderr\n"
              "  --env K=V            set an environment variable (repeatable)\n"
              "  --user user|root|UID run as this user (default: user, uid 1000)\n"
              "  --workdir DIR        working directory (default: the user's home)\n"
              "  --timeout DURATION   kill the sandbox after this long: 500ms, 10s, 2m, 1h\n"
              "  --no-new-privs       set no_new_privs (sudo and setuid binaries stop working)\n"
              "  --json               print a JSON summary as the last line of stderr\n"
              "  --tty (-t)           give the command a terminal: ours goes raw, keys (Ctrl-C,\n"
              "                       Ctrl-Z) reach the command's terminal, its size follows ours\n"
              "  --interactive (-i)   accepted for docker habits: stdin is always passed through\n"
              "  --volume NAME:PATH   mount the volume NAME (hutch volume create) read-write at PATH\n"
              "                       (absolute; repeatable, at most 8; the default team's volumes)\n"
              "  --gpus all|N|ID,...  NVIDIA GPUs for the sandbox (ns only): every GPU, N free ones, or\n"
              "                       these ids (0,1 or device=1: the N of /dev/nvidiaN); never one\n"
              "                       another sandbox holds unless $HUTCH_GPU_SHARE=1 (docs/gpu.md)\n"
              "\n"
              "Exit status: the command's; 128+N when killed by signal N; 124 on timeout;\n"
              "126 not executable; 127 not found; 2 usage error; 125 hutch failed.\n",
              f);
}

enum {
        OPT_TEMPLATE = 256,
        OPT_BACKEND,
        OPT_MEMORY,
        OPT_PIDS,
        OPT_CPUS,
        OPT_DISK,
        OPT_INODES,
        OPT_NET,
        OPT_NET_OPEN,
        OPT_DNS,
        OPT_NET_LOG,
        OPT_ENV,
        OPT_USER,
        OPT_WORKDIR,
        OPT_TIMEOUT,
        OPT_NNP,
        OPT_JSON,
        OPT_VOLUME,
        OPT_GPUS,
        OPT_HELP,
};



/* Set or replace NAME=... in env (n entries, owned strings). */
static int env_set(char **env, size_t *n, const char *kv) {
        size_t klen = (size_t) (strchr(kv, '=') - kv);
        char *dup = strdup(kv);
        if (!dup)
                return -ENOMEM;
        for (size_t i = 0; i < *n; i++)
                if (strncmp(env[i], kv, klen + 1) == 0) {
                        free(env[i]);
                        env[i] = dup;
                        return 0;
                }
        if (*n >= MAX_ENV) {
                free(dup);
                return -E2BIG;
        }
        env[(*n)++] = dup;
        env[*n] = NULL;
        return 0;
}

typedef struct run_opts {
        hutch_sandbox_config sb;
        char *env[MAX_ENV + 1];
        size_t n_env;
        uid_t uid;
        gid_t gid;
        const char *workdir;
        bool user_set;
        char **tpl_env;    /* an image template's Env (defaults under --env) */
        char *tpl_workdir; /* its WorkingDir */
        bool tpl_image;    /* a template of image layers */
        uint64_t timeout_ms;
        bool json;
        bool tty; /* -t: a pseudo-terminal, ours in raw mode */
        const char *net;      /* NULL or "deny": no network */
        const char *net_open;
        const char *dns;
        bool net_log;
        char **cmd;
        /* --volume NAME:PATH: names here, ids resolved before the create */
        char *vol_names[HUTCH_VOLUMES_MAX];
        char vol_ids[HUTCH_VOLUMES_MAX][HUTCH_VOLUME_ID_LEN + 1];
        hutch_volume_mount vols[HUTCH_VOLUMES_MAX];
        size_t n_vols;
} run_opts;

static int parse_args(int argc, char **argv, run_opts *o) {
        static const struct option longopts[] = {
                { "template", required_argument, NULL, OPT_TEMPLATE },
                { "backend", required_argument, NULL, OPT_BACKEND },
                { "memory", required_argument, NULL, OPT_MEMORY },
                { "pids", required_argument, NULL, OPT_PIDS },
                { "cpus", required_argument, NULL, OPT_CPUS },
                { "disk", required_argument, NULL, OPT_DISK },
                { "inodes", required_argument, NULL, OPT_INODES },
                { "net", required_argument, NULL, OPT_NET },
                { "net-open", required_argument, NULL, OPT_NET_OPEN },
                { "dns", required_argument, NULL, OPT_DNS },
                { "net-log", no_argument, NULL, OPT_NET_LOG },
                { "env", required_argument, NULL, OPT_ENV },
                { "user", required_argument, NULL, OPT_USER },
                { "workdir", required_argument, NULL, OPT_WORKDIR },
                { "timeout", required_argument, NULL, OPT_TIMEOUT },
                { "no-new-privs", no_argument, NULL, OPT_NNP },
                { "json", no_argument, NULL, OPT_JSON },
                { "volume", required_argument, NULL, OPT_VOLUME },
                { "gpus", required_argument, NULL, OPT_GPUS },
                { "tty", no_argument, NULL, 't' },
                { "interactive", no_argument, NULL, 'i' },
                { "help", no_argument, NULL, OPT_HELP },
                {},
        };
        const char *user = "user";
        int c, r;
        const char *env_backend = getenv("HUTCH_BACKEND");
        if (env_backend && *env_backend) {
                if ((r = hutch_backend_from_name(env_backend)) < 0)
                        return log_error("invalid HUTCH_BACKEND '%s' (expected ns or gvisor)", env_backend), -EINVAL;
                o->sb.backend = r;
        }
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, "+e:u:w:hti", longopts, NULL)) != -1) {
                switch (c) {
                case OPT_TEMPLATE:
                        o->sb.template_name = optarg;
                        break;
                case OPT_BACKEND:
                        if ((r = hutch_backend_from_name(optarg)) < 0)
                                return log_error("invalid --backend '%s' (expected ns or gvisor)", optarg), -EINVAL;
                        o->sb.backend = r;
                        break;
                case OPT_MEMORY:
                        /* the engine's bounds, checked here so that every bad value is a
                         * usage error (2) naming its bound, not a failure (125) */
                        if (parse_size(optarg, &o->sb.limits.memory_bytes) < 0 || o->sb.limits.memory_bytes < HUTCH_MIN_MEMORY)
                                return log_error("invalid --memory '%s' (expected a size of at least 4M, like 512M or 2G)", optarg), -EINVAL;
                        break;
                case OPT_DISK:
                        if (parse_size(optarg, &o->sb.limits.disk_bytes) < 0 || o->sb.limits.disk_bytes < HUTCH_MIN_DISK ||
                            o->sb.limits.disk_bytes > HUTCH_MAX_DISK)
                                return log_error("invalid --disk '%s' (expected a size from 1M to 1T, like 1G)", optarg), -EINVAL;
                        break;
                case OPT_PIDS:
                        if (parse_u64(optarg, HUTCH_MAX_PIDS, &o->sb.limits.pids) < 0 || o->sb.limits.pids == 0)
                                return log_error("invalid --pids '%s' (expected a number from 1 to 4194304)", optarg), -EINVAL;
                        break;
                case OPT_INODES:
                        if (parse_u64(optarg, HUTCH_MAX_INODES, &o->sb.limits.disk_inodes) < 0 ||
                            o->sb.limits.disk_inodes < HUTCH_MIN_INODES)
                                return log_error("invalid --inodes '%s' (expected a number from 64 to 4294967296)", optarg), -EINVAL;
                        break;
                case OPT_CPUS:
                        if (parse_cpus_millis(optarg, &o->sb.limits.cpu_millis) < 0)
                                return log_error("invalid --cpus '%s' (expected a number like 2 or 0.5)", optarg), -EINVAL;
                        break;
                case OPT_NET: {
                        /* checked here, so that a typo is a usage error */
                        egress_policy *p = NULL;
                        char why[256];
                        if (egress_policy_new(&p) < 0)
                                return -ENOMEM;
                        r = streq(optarg, "deny") || streq(optarg, "allow")
                                    ? 0
                                    : egress_policy_add_rules(p, optarg, why, sizeof why);
                        egress_policy_free(p);
                        if (r < 0)
                                return log_error("invalid --net: %s", why), -EINVAL;
                        o->net = streq(optarg, "deny") ? NULL : optarg;
                        break;
                }
                case OPT_NET_OPEN:
                        o->net_open = optarg;
                        break;
                case OPT_DNS:
                        o->dns = optarg;
                        break;
                case OPT_NET_LOG:
                        o->net_log = true;
                        break;
                case 'e':
                case OPT_ENV:
                        if (!cli_env_name_valid(optarg))
                                return log_error("invalid --env '%s' (expected NAME=VALUE)", optarg), -EINVAL;
                        if ((r = env_set(o->env, &o->n_env, optarg)) < 0)
                                return log_error("too many --env options"), r;
                        break;
                case 'u':
                case OPT_USER:
                        user = optarg;
                        o->user_set = true;
                        break;
                case 'w':
                case OPT_WORKDIR:
                        if (optarg[0] != '/')
                                return log_error("invalid --workdir '%s' (must be an absolute path)", optarg), -EINVAL;
                        o->workdir = optarg;
                        break;
                case OPT_TIMEOUT:
                        if (parse_duration_ms(optarg, &o->timeout_ms) < 0 || o->timeout_ms == 0)
                                return log_error("invalid --timeout '%s' (expected a duration like 500ms, 10s, 2m)", optarg), -EINVAL;
                        break;
                case OPT_NNP:
                        o->sb.no_new_privs = true;
                        break;
                case OPT_JSON:
                        o->json = true;
                        break;
                case OPT_VOLUME: {
                        char *colon = strchr(optarg, ':');
                        if (!colon || colon == optarg)
                                return log_error("invalid --volume '%s' (expected NAME:/PATH)", optarg), -EINVAL;
                        if (o->n_vols >= HUTCH_VOLUMES_MAX)
                                return log_error("at most %d --volume options", HUTCH_VOLUMES_MAX), -EINVAL;
                        *colon = 0;
                        const char *why = hutch_volume_path_check(colon + 1);
                        if (!cli_volume_name_valid(optarg))
                                return log_error("invalid --volume name '%s'", optarg), -EINVAL;
                        if (why)
                                return log_error("invalid --volume path '%s': %s", colon + 1, why), -EINVAL;
                        for (size_t i = 0; i < o->n_vols; i++)
                                if (streq(o->vols[i].path, colon + 1))
                                        return log_error("--volume: path '%s' is already used", colon + 1), -EINVAL;
                        o->vol_names[o->n_vols] = optarg;
                        o->vols[o->n_vols].path = colon + 1;
                        o->vols[o->n_vols].volume = o->vol_ids[o->n_vols];
                        o->n_vols++;
                        break;
                }
                case OPT_GPUS: {
                        hutch_error e = { 0 };
                        if (!*optarg)
                                return log_error("invalid --gpus '': expected all, a count or GPU ids"), -EINVAL;
                        if (hutch_gpu_spec_check(optarg, &e) < 0)
                                return log_error("invalid --gpus: %s", e.msg), -EINVAL;
                        o->sb.gpus = optarg;
                        break;
                }
                case 't':
                        o->tty = true;
                        break;
                case 'i':
                        break; /* stdin is always passed through */
                case 'h':
                case OPT_HELP:
                        run_usage(stdout);
                        return 1;
                case '?':
                default:
                        if (optopt && optopt < 256)
                                log_error("unknown option '-%c' (see `hutch run --help`)", optopt);
                        else if (optopt)
                                log_error("option '%s' needs a value (see `hutch run --help`)", argv[optind - 1]);
                        else
                                log_error("unknown option '%s' (see `hutch run --help`)", argv[optind - 1]);
                        return -EINVAL;
                }
        }
        /* runsc's tmpfs (the gvisor layer) has no inode limit to set
         * (nr_inodes is EINVAL): refuse rather than ignore it */
        if (o->sb.limits.disk_inodes && o->sb.backend == HUTCH_BACKEND_GVISOR)
                return log_error("--inodes is not supported on the gvisor backend: its writable layer (a tmpfs in "
                                 "runsc's sentry) has no inode limit; only --disk and --memory bound it "
                                 "(docs/gvisor.md)"),
                       -EINVAL;
        if (o->sb.gpus && hutch_gpu_spec_check(o->sb.gpus, NULL) > 0 && o->sb.backend == HUTCH_BACKEND_GVISOR)
                return log_error("--gpus is not supported on the gvisor backend: runsc reaches a GPU only through its "
                                 "nvproxy (runsc --nvproxy), which hutch does not set up (docs/gpu.md); use --backend ns"),
                       -EINVAL;
        if (optind < argc && streq(argv[optind], "--"))
                optind++;
        if (optind >= argc)
                return log_error("no command given (usage: hutch run [OPTIONS] -- CMD [ARG...])"), -EINVAL;
        o->cmd = argv + optind;

        uint64_t uid;
        if (streq(user, "user"))
                o->uid = o->gid = 1000;
        else if (streq(user, "root"))
                o->uid = o->gid = 0;
        else if (parse_u64(user, 65535, &uid) == 0)
                o->uid = o->gid = (uid_t) uid;
        else
                return log_error("invalid --user '%s' (expected user, root or a uid from 0 to 65535)", user), -EINVAL;
        return 0;
}

#ifndef HUTCH_CLI_LEAN
/* --volume names to ids (volume.c). */
static int resolve_volumes(run_opts *o) {
        int r = cli_volume_resolve((const char *const *) o->vol_names, o->n_vols, o->vol_ids);
        if (r < 0)
                return r;
        o->sb.volumes = o->vols;
        o->sb.n_volumes = o->n_vols;
        return 0;
}

/* --net-log: one JSON line per decision on stderr. */
static void json_str(FILE *f, const char *k, const char *v, bool comma) {
        fprintf(f, "\"%s\":\"", k);
        for (const unsigned char *c = (const unsigned char *) v; *c; c++) {
                if (*c == '"' || *c == '\\')
                        fprintf(f, "\\%c", *c);
                else if (*c < 0x20 || *c >= 0x7f)
                        fprintf(f, "\\u%04x", *c);
                else
                        fputc(*c, f);
        }
        fprintf(f, "\"%s", comma ? "," : "");
}

static void on_net_record(void *userdata, const egress_record *rec) {
        if (!*(bool *) userdata)
                return;
        fputs("{\"egress\":{", stderr);
        json_str(stderr, "kind", rec->kind ? egress_kind_to_string(rec->kind) : "", true);
        json_str(stderr, "method", rec->method, true);
        json_str(stderr, "host", rec->host, true);
        fprintf(stderr, "\"port\":%u,", rec->port);
        json_str(stderr, "address", rec->address, true);
        json_str(stderr, "decision", rec->allowed ? "allow" : "deny", true);
        json_str(stderr, "reason", rec->reason, true);
        json_str(stderr, "rule", rec->rule, true);
        json_str(stderr, "error", rec->error, true);
        fprintf(stderr, "\"bytesOut\":%llu,\"bytesIn\":%llu,\"durationMs\":%lld}}\n",
                (unsigned long long) rec->bytes_out, (unsigned long long) rec->bytes_in,
                (long long) rec->duration_ms);
}

/* The sandbox's egress proxy, for --net other than deny. */
static int net_start(run_opts *o, hutch_sandbox *sb, egress_proxy **ret_proxy) {
        char why[256];
        _cleanup_(egress_ceiling_unrefp) egress_ceiling *c = NULL;
        int r = egress_ceiling_new(&c);
        if (r < 0)
                return r;
        if ((r = egress_ceiling_add_allow(c, "*", why, sizeof why)) < 0)
                return log_error("%s", why), r;
        if (o->net_open && (r = egress_ceiling_add_list(c, o->net_open, egress_ceiling_allow_private, why,
                                                        sizeof why)) < 0)
                return log_error("invalid --net-open: %s", r == -ENOMEM ? "out of memory" : why), r;
        if ((r = egress_ceiling_add_host_addresses(c)) < 0)
                return log_error_errno(r, "getifaddrs: %m");

        egress_proxy_config pc = { .on_record = on_net_record, .userdata = &o->net_log };
        r = egress_nameservers(o->dns, pc.nameservers, EGRESS_NAMESERVERS_MAX, why, sizeof why);
        if (r < 0)
                return log_error("invalid --dns: %s", why), r;
        pc.n_nameservers = (size_t) r;

        egress_policy *p = NULL;
        if ((r = egress_policy_new(&p)) < 0)
                return r;
        r = egress_policy_add_rules(p, streq(o->net, "allow") ? "*" : o->net, why, sizeof why);
        if (r < 0) {
                egress_policy_free(p);
                return log_error("invalid --net: %s", why), r;
        }
        egress_policy_set_ceiling(p, c);

        egress_proxy *px = NULL;
        if ((r = egress_proxy_new(&pc, &px)) < 0) {
                egress_policy_free(p);
                return log_error_errno(r, "egress proxy: %m");
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/net", (int) hutch_sandbox_init_pid(sb));
        _cleanup_close_ int nfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0) {
                egress_policy_free(p);
                egress_proxy_free(px);
                return log_error_errno(-errno, "%s: %m", path);
        }
        egress_site *site;
        if ((r = egress_site_open(px, hutch_sandbox_id(sb), nfd, EGRESS_PROXY_PORT, p, &site)) < 0) {
                egress_proxy_free(px);
                return log_error_errno(r, "egress proxy in the sandbox: %m");
        }
        hutch_error err = { 0 };
        if ((r = hutch_sandbox_set_network(sb, true, &err)) < 0) {
                egress_proxy_free(px);
                return log_error_errno(r, "egress proxy in the sandbox: %s", err.msg);
        }
        *ret_proxy = px;
        return 0;
}
#else
/* The lean `hutch` (cli/meson.build) links neither the egress proxy
 * (OpenSSL) nor the store (SQLite): verb_run hands a run with --net or
 * --volume to hutch-full before either is reached. */
static int resolve_volumes(run_opts *o) {
        return -EOPNOTSUPP;
}
static int net_start(run_opts *o, hutch_sandbox *sb, egress_proxy **ret_proxy) {
        return -EOPNOTSUPP;
}
#define egress_proxy_env(port, vars) 0
#define egress_proxy_fd(proxy) (-1)
#define egress_proxy_dispatch(proxy) ((void) (proxy))
#define egress_proxy_free(proxy) ((void) (proxy))
#endif

static void default_env(run_opts *o) {
        const char *home = o->uid == 0 ? "/root" : o->uid == 1000 ? "/home/user" : "/";
        const char *name = o->uid == 0 ? "root" : o->uid == 1000 ? "user" : NULL;
        char buf[256];
        char *user_env[MAX_ENV + 1];
        size_t n_user = o->n_env;
        memcpy(user_env, o->env, sizeof(char *) * n_user);
        o->n_env = 0;
        (void) env_set(o->env, &o->n_env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        snprintf(buf, sizeof buf, "HOME=%s", home);
        (void) env_set(o->env, &o->n_env, buf);
        if (name) {
                snprintf(buf, sizeof buf, "USER=%s", name);
                (void) env_set(o->env, &o->n_env, buf);
                snprintf(buf, sizeof buf, "LOGNAME=%s", name);
                (void) env_set(o->env, &o->n_env, buf);
        }
        (void) env_set(o->env, &o->n_env, "SHELL=/bin/bash");
        (void) env_set(o->env, &o->n_env, "LANG=C.UTF-8");
        (void) env_set(o->env, &o->n_env, "HOSTNAME=hutch");
        if (o->net) {
                char vars[8][64];
                int n = egress_proxy_env(EGRESS_PROXY_PORT, vars);
                for (int i = 0; i < n; i++)
                        (void) env_set(o->env, &o->n_env, vars[i]);
        }
        const char *term = getenv("TERM");
        if (term && strlen(term) < 64) {
                snprintf(buf, sizeof buf, "TERM=%s", term);
                (void) env_set(o->env, &o->n_env, buf);
        }
        for (char **e = o->tpl_env; e && *e; e++)
                if (cli_env_name_valid(*e))
                        (void) env_set(o->env, &o->n_env, *e);
        for (size_t i = 0; i < n_user; i++) {
                (void) env_set(o->env, &o->n_env, user_env[i]);
                free(user_env[i]);
        }
}

/* An image template's defaults (its config's Env, WorkingDir, User), under
 * what the command line says. The host template has none. */
static int template_defaults(run_opts *o) {
        const char *name = o->sb.template_name;
        const char *dd = getenv("HUTCH_DATA_DIR");
        if (!name || !*name || streq(name, "base"))
                name = template_base_target(dd && *dd ? dd : "/var/lib/hutch");
        if (streq(name, "host"))
                return 0;
        hutch_template *t = NULL;
        hutch_error err = { 0 };
        int r = template_resolve(dd && *dd ? dd : "/var/lib/hutch", name, &t, &err);
        if (r < 0)
                return log_error("%s", err.msg), r;
        o->tpl_image = t->n_layers > 0;
        if (!o->user_set && t->uid >= 0) {
                o->uid = (uid_t) t->uid;
                o->gid = (gid_t) t->gid;
        }
        o->tpl_env = TAKE_PTR(t->env);
        o->tpl_workdir = TAKE_PTR(t->workdir);
        template_free(t);
        return 0;
}

typedef struct stream {
        int in, out; /* read from in, write to out */
        bool open;
        bool broken; /* out went away (EPIPE): keep draining, discard */
} stream;

/* Copy what is available from in to out. Returns 0 on EOF, 1 otherwise, 2
 * when out just broke, -errno on a read error. */
/* After a gvisor command's exit: its output still on the way is read for
 * as long as it keeps coming (a pause this long ends it), up to a cap. */
#define GVISOR_DRAIN_QUIET_MS 1000
#define GVISOR_DRAIN_MAX_NS (30 * 1000000000LL)

static int pump(stream *s, char *buf, size_t bufsz) {
        ssize_t n = read(s->in, buf, bufsz);
        if (n < 0)
                return errno == EAGAIN || errno == EINTR ? 1 : -errno;
        if (n == 0) {
                s->open = false;
                return 0;
        }
        if (s->broken)
                return 1;
        int r = fd_write_all(s->out, buf, (size_t) n);
        if (r == -EPIPE) {
                s->broken = true;
                return 2;
        }
        return r < 0 ? r : 1;
}

static void json_summary(const char *id, const hutch_exit *ex, bool exited, bool timed_out, bool oom, int64_t wall_ns,
                         const hutch_stats *st) {
        char code[16] = "null", sig[16] = "null";
        if (exited && ex->signal == 0)
                snprintf(code, sizeof code, "%d", ex->exit_code);
        if (exited && ex->signal != 0)
                snprintf(sig, sizeof sig, "%d", ex->signal);
        fprintf(stderr,
                "{\"sandbox_id\":\"%s\",\"exit_code\":%s,\"signal\":%s,\"timed_out\":%s,\"oom_killed\":%s,"
                "\"wall_ms\":%.3f,\"cpu_ms\":%.3f,\"memory_peak_bytes\":%llu}\n",
                id, code, sig, timed_out ? "true" : "false", oom ? "true" : "false", (double) wall_ns / 1e6,
                (double) st->cpu_usage_ns / 1e6, (unsigned long long) st->memory_peak);
}

int verb_run(int argc, char **argv) {
        run_opts o = { 0 };
        int r = parse_args(argc, argv, &o);
        if (r != 0) {
                for (size_t i = 0; i < o.n_env; i++)
                        free(o.env[i]);
                return r > 0 ? 0 : EXIT_USAGE;
        }
#ifdef HUTCH_CLI_LEAN
        if (o.net || o.n_vols > 0) {
                /* the arguments as they came (parse_args cut NAME:PATH) */
                for (size_t i = 0; i < o.n_vols; i++)
                        o.vol_names[i][strlen(o.vol_names[i])] = ':';
                for (size_t i = 0; i < o.n_env; i++)
                        free(o.env[i]);
                return cli_exec_full();
        }
#endif
        if (template_defaults(&o) < 0) {
                for (size_t i = 0; i < o.n_env; i++)
                        free(o.env[i]);
                return EXIT_HUTCH;
        }
        default_env(&o);
        char owner[64];
        snprintf(owner, sizeof owner, "hutch run pid %ld", (long) getpid());
        o.sb.owner = owner;
        int64_t t0 = clock_ns(CLOCK_MONOTONIC);
        int exit_status = EXIT_HUTCH;
        hutch_ctx *ctx = NULL;
        hutch_sandbox *sb = NULL;
        hutch_error err = { 0 };
        hutch_process proc = { .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1 };
        egress_proxy *proxy = NULL;
        int sfd = -1;

        /* Signals become events: forwarded to the command, or, the second
         * time, the end of the sandbox. SIGPIPE: a closed stdout must not
         * kill us before the sandbox is gone. */
        sfd = cli_signals_open();

        if (cli_ctx(&ctx) < 0)
                goto out;
        if (o.n_vols > 0 && resolve_volumes(&o) < 0)
                goto out;
        if (hutch_sandbox_create(ctx, &o.sb, &sb, &err) < 0) {
                log_error("%s", err.msg);
                goto out;
        }
        log_debug("sandbox %s created in %.3f ms", hutch_sandbox_id(sb), (double) (clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
        if (o.net && net_start(&o, sb, &proxy) < 0)
                goto out;

        /* Our stdin is /dev/null (scripts, CI, `< /dev/null`): the
         * command's is /dev/null too, rather than a pipe that init makes
         * and that we close at once, one round trip each. */
        struct stat in_st;
        bool stdin_null = !o.tty && fstat(STDIN_FILENO, &in_st) == 0 && S_ISCHR(in_st.st_mode) &&
                in_st.st_rdev == makedev(1, 3);
        const char *cwd = o.workdir          ? o.workdir
                          : o.tpl_workdir    ? o.tpl_workdir
                          : o.uid == 1000    ? "/home/user"
                          : o.uid == 0 && !o.tpl_image ? "/root"
                                                       : "/";
        hutch_spawn_config sc = {
                .argv = (const char *const *) o.cmd,
                .envp = (const char *const *) o.env,
                .cwd = cwd,
                .uid = o.uid,
                .gid = o.gid,
                .stdin_mode = o.tty || stdin_null ? HUTCH_STDIN_NULL : HUTCH_STDIN_PIPE,
                .pty = o.tty,
        };
        if (o.tty)
                cli_tty_size(&sc.pty_rows, &sc.pty_cols);
        /* If we die, even by SIGKILL, the sandbox's processes die with us. */
        if (hutch_sandbox_tie_lifetime(sb, &err) < 0) {
                log_error("%s", err.msg);
                goto out;
        }
        /* a template with a start command (code-interpreter): it runs, and
         * is ready, before the command (docs/interpreter.md) */
        if (template_is_interp(o.sb.template_name)) {
                const char *dd = getenv("HUTCH_DATA_DIR");
                hutch_template *t = NULL;
                if (template_resolve(dd && *dd ? dd : "/var/lib/hutch", o.sb.template_name, &t, &err) < 0 ||
                    template_start_commands(sb, t, (const char *const *) o.env, 60000, &err) < 0) {
                        template_free(t);
                        log_error("%s", err.msg);
                        goto out;
                }
                template_free(t);
        }
        r = hutch_sandbox_spawn(sb, &sc, &proc, &err);
        if (r < 0) {
                if (r == -ENOENT && !o.workdir) {
                        log_error("%s: command not found", o.cmd[0]);
                        exit_status = EXIT_NOTFOUND;
                } else if (r == -ENOENT) {
                        log_error("%s", err.msg);
                        exit_status = strstr(err.msg, "chdir") ? EXIT_HUTCH : EXIT_NOTFOUND;
                } else if (r == -EACCES || r == -ENOEXEC || r == -EISDIR) {
                        log_error("%s: %s", o.cmd[0], err.msg);
                        exit_status = EXIT_NOEXEC;
                } else
                        log_error("%s", err.msg);
                goto out;
        }

        /* -t: the terminal's master carries both ways (stdin through a copy
         * of it), and ours goes raw for the session */
        if (o.tty) {
                proc.stdin_fd = fcntl(proc.stdout_fd, F_DUPFD_CLOEXEC, 3);
                if (proc.stdin_fd < 0) {
                        log_error("dup: %m");
                        goto out;
                }
                cli_tty_raw();
        }
        stream sout = { .in = proc.stdout_fd, .out = STDOUT_FILENO, .open = true };
        stream serr = { .in = proc.stderr_fd, .out = STDERR_FILENO, .open = proc.stderr_fd >= 0 };
        /* stdin goes through a buffer: the command's stdin pipe is
         * non-blocking, and we read more from ours only once the command
         * took what we had, so a command that does not read its input
         * never blocks the output streams (no deadlock with `cat`). */
        static char inbuf[65536];
        size_t in_len = 0, in_off = 0;
        bool stdin_done = stdin_null;
        hutch_exit ex = { 0 };
        bool exited = false, timed_out = false, killed_outside = false;
        int signals_seen = 0, first_signal = 0;
        int64_t signal_deadline = 0; /* after a forwarded signal: the sandbox ends then at the latest */
        int64_t deadline = o.timeout_ms ? t0 + (int64_t) o.timeout_ms * 1000000 : 0;
        static char buf[65536];

        /* Until the command exits (or the deadline, or a second signal).
         * What it wrote before exiting is still in the pipes and is drained
         * below, once nothing in the sandbox can write any more. */
        while (!exited) {
                /* The command's exit: read from the control socket when poll
                 * said it is readable, or queued while we awaited a reply. */
                {
                        hutch_exit e2;
                        r = hutch_sandbox_wait(sb, 0, &e2, &err);
                        if (r == 0 && e2.pid == proc.pid) {
                                ex = e2;
                                exited = true;
                        } else if (r < 0 && r != -ETIMEDOUT) {
                                killed_outside = true; /* init went away: someone destroyed the sandbox */
                                log_debug("control connection: %s", err.msg);
                                break;
                        }
                        if (exited)
                                break;
                }
                struct pollfd p[7];
                int np = 0, i_in = -1, i_pipe = -1, i_out = -1, i_err = -1, i_sig = -1, i_net = -1;
                if (!stdin_done && in_len == 0) {
                        i_in = np;
                        p[np++] = (struct pollfd){ .fd = STDIN_FILENO, .events = POLLIN };
                }
                if (!stdin_done && in_len > 0) {
                        i_pipe = np;
                        p[np++] = (struct pollfd){ .fd = proc.stdin_fd, .events = POLLOUT };
                }
                if (sout.open) {
                        i_out = np;
                        p[np++] = (struct pollfd){ .fd = sout.in, .events = POLLIN };
                }
                if (serr.open) {
                        i_err = np;
                        p[np++] = (struct pollfd){ .fd = serr.in, .events = POLLIN };
                }
                p[np++] = (struct pollfd){ .fd = hutch_sandbox_fd(sb), .events = POLLIN };
                if (sfd >= 0) {
                        i_sig = np;
                        p[np++] = (struct pollfd){ .fd = sfd, .events = POLLIN };
                }
                if (proxy) {
                        i_net = np;
                        p[np++] = (struct pollfd){ .fd = egress_proxy_fd(proxy), .events = POLLIN };
                }
                int wait = -1;
                if (deadline) {
                        int64_t left = (deadline - clock_ns(CLOCK_MONOTONIC)) / 1000000;
                        wait = left > 0 ? (int) MIN(left, 1000000) : 0;
                }
                if (signal_deadline) {
                        int64_t left = (signal_deadline - clock_ns(CLOCK_MONOTONIC)) / 1000000;
                        int w = left > 0 ? (int) left : 0;
                        if (wait < 0 || w < wait)
                                wait = w;
                }
                int k = poll(p, (nfds_t) np, wait);
                if (k < 0 && errno != EINTR) {
                        log_error("poll: %m");
                        goto out;
                }
                if (signal_deadline && clock_ns(CLOCK_MONOTONIC) >= signal_deadline) {
                        /* the command did not end on the forwarded signal (a
                         * shell may hold it while it forks): end the sandbox */
                        killed_outside = true;
                        ex.signal = first_signal;
                        goto done;
                }
                if (deadline && clock_ns(CLOCK_MONOTONIC) >= deadline) {
                        timed_out = true;
                        break;
                }
                if (k <= 0)
                        continue;
                if (i_net >= 0 && p[i_net].revents)
                        egress_proxy_dispatch(proxy);
                if (i_in >= 0 && p[i_in].revents) {
                        ssize_t n = read(STDIN_FILENO, inbuf, sizeof inbuf);
                        if (n > 0) {
                                in_len = (size_t) n;
                                in_off = 0;
                        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                                stdin_done = true; /* EOF: the command sees it too */
                                if (o.tty) /* as a Ctrl-D typed on its terminal */
                                        (void) fd_write_all(proc.stdin_fd, "\x04", 1);
                                proc.stdin_fd = safe_close(proc.stdin_fd);
                                (void) hutch_sandbox_close_stdin(sb, proc.pid, NULL);
                        }
                }
                if (i_pipe >= 0 && p[i_pipe].revents) {
                        ssize_t n = write(proc.stdin_fd, inbuf + in_off, in_len - in_off);
                        if (n > 0) {
                                in_off += (size_t) n;
                                if (in_off == in_len)
                                        in_len = in_off = 0;
                        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                                /* the command closed its stdin: stop feeding it */
                                stdin_done = true;
                                in_len = in_off = 0;
                                proc.stdin_fd = safe_close(proc.stdin_fd);
                                (void) hutch_sandbox_close_stdin(sb, proc.pid, NULL);
                        }
                }
                stream *streams[2] = { i_out >= 0 && p[i_out].revents ? &sout : NULL,
                                       i_err >= 0 && p[i_err].revents ? &serr : NULL };
                for (int s = 0; s < 2; s++) {
                        if (!streams[s])
                                continue;
                        r = pump(streams[s], buf, sizeof buf);
                        if (r < 0)
                                streams[s]->open = false;
                        else if (r == 2 && !exited)
                                /* like a shell pipeline: the writer learns its reader left */
                                (void) hutch_sandbox_signal(sb, proc.pid, SIGPIPE, true, NULL);
                }
                /* a readable control socket is read at the top of the loop */
                if (i_sig >= 0 && p[i_sig].revents) {
                        struct signalfd_siginfo si;
                        while (read(sfd, &si, sizeof si) == sizeof si) {
                                if (si.ssi_signo == SIGWINCH) {
                                        uint16_t rows, cols;
                                        cli_tty_size(&rows, &cols);
                                        if (o.tty)
                                                (void) hutch_sandbox_resize(sb, proc.pid, rows, cols, NULL);
                                        continue;
                                }
                                if (++signals_seen > 1 || exited) {
                                        killed_outside = true;
                                        ex.signal = (int) si.ssi_signo;
                                        goto done;
                                }
                                (void) hutch_sandbox_signal(sb, proc.pid, (int) si.ssi_signo, true, NULL);
                                first_signal = (int) si.ssi_signo;
                                signal_deadline = clock_ns(CLOCK_MONOTONIC) + SIGNAL_GRACE_NS;
                        }
                }
        }
done:;
        /* gvisor: the command's output crosses the sentry, hutch-init and
         * the relay's windows before it reaches our pipes, so at its exit
         * some may still be on the way (init sends what it can before the
         * exit, up to the window; the relay's queue and the pipe inside the
         * sentry hold the rest). Destroying the sandbox now would lose it:
         * read on while it comes, until both pipes end (the normal case:
         * nothing else holds them) or nothing came for a moment (a
         * background process holds them), within the deadlines. On the
         * namespace backend the pipes are the command's own: whatever it
         * wrote is in them, and the drain below after the destroy finds it. */
        if (exited && o.sb.backend == HUTCH_BACKEND_GVISOR) {
                int64_t cap = clock_ns(CLOCK_MONOTONIC) + GVISOR_DRAIN_MAX_NS;
                while (sout.open || serr.open) {
                        struct pollfd pf[2];
                        stream *ps[2];
                        nfds_t n = 0;
                        for (stream *s2 = &sout; s2; s2 = s2 == &sout ? &serr : NULL)
                                if (s2->open) {
                                        ps[n] = s2;
                                        pf[n++] = (struct pollfd){ .fd = s2->in, .events = POLLIN };
                                }
                        int64_t now = clock_ns(CLOCK_MONOTONIC);
                        if (now >= cap || (deadline && now >= deadline))
                                break;
                        if (poll(pf, n, GVISOR_DRAIN_QUIET_MS) <= 0)
                                break;
                        for (nfds_t i = 0; i < n; i++)
                                if (pf[i].revents && pump(ps[i], buf, sizeof buf) < 0)
                                        ps[i]->open = false;
                }
        }
        cli_tty_restore();
        log_debug("command ended at %.3f ms", (double) (clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
        hutch_stats st = { 0 };
        /* read only for --json: six cgroup files per run otherwise unused */
        if (o.json)
                (void) hutch_sandbox_stats(sb, &st, NULL);
        bool oom = st.oom_kills > 0;
        /* End the sandbox before draining: background processes that kept
         * writing would otherwise keep us here (past --timeout, forever). */
        if (hutch_sandbox_destroy(sb, &err) < 0)
                log_error("cleaning up sandbox %s: %s", hutch_sandbox_id(sb), err.msg);
        for (stream *s2 = &sout; s2; s2 = s2 == &sout ? &serr : NULL)
                while (s2->open) {
                        /* everything that could write is gone: what is left is
                         * buffered, but never wait for it unbounded */
                        struct pollfd pf = { .fd = s2->in, .events = POLLIN };
                        if (poll(&pf, 1, 2000) <= 0 || pump(s2, buf, sizeof buf) <= 0)
                                break;
                }
        if (timed_out) {
                log_error("timed out after %.3fs; the sandbox was killed", (double) o.timeout_ms / 1000);
                exit_status = EXIT_TIMEOUT;
        } else if (killed_outside) {
                if (ex.signal == 0)
                        log_error("the sandbox was destroyed while the command ran");
                exit_status = 128 + (ex.signal ? ex.signal : SIGKILL);
        } else if (ex.signal)
                exit_status = 128 + ex.signal;
        else
                exit_status = ex.exit_code;
        if (o.json)
                json_summary(hutch_sandbox_id(sb), &ex, exited, timed_out, oom, clock_ns(CLOCK_MONOTONIC) - t0, &st);

out:
        cli_tty_restore();
        safe_close(proc.stdin_fd);
        safe_close(proc.stdout_fd);
        safe_close(proc.stderr_fd);
        if (sb) {
                if (hutch_sandbox_destroy(sb, &err) < 0) {
                        log_error("cleaning up sandbox %s: %s", hutch_sandbox_id(sb), err.msg);
                        if (exit_status == 0)
                                exit_status = EXIT_HUTCH;
                }
                log_debug("sandbox destroyed at %.3f ms", (double) (clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
                hutch_sandbox_unref(sb);
        }
        egress_proxy_free(proxy); /* each open connection recorded */
        hutch_ctx_free(ctx);
        safe_close(sfd);
        for (size_t i = 0; i < o.n_env; i++)
                free(o.env[i]);
        for (char **e = o.tpl_env; e && *e; e++)
                free(*e);
        free(o.tpl_env);
        free(o.tpl_workdir);
        return exit_status;
}
