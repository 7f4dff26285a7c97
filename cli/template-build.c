/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The template builder (docs/templates.md "Building"): one build's steps,
 * each run in a hutch sandbox with every isolation rule of any sandbox and
 * no network, each step's result a layer in the step cache.
 *
 *   hutch template build FILE [--name NAME]   a build file (below), against
 *                                             the data dir, as the CLI
 *   hutch template build --job DIR --parent PID
 *                                             the daemon's builder process
 *                                             (daemon/templates.c): DIR/job.json
 *                                             in, one JSON object per line out
 *
 * A step's result is the build sandbox's writable layer after it (the
 * layer stream hutch_sandbox_layer_export() writes), so a later build or a
 * sandbox starts on it. Each step has a cache key, sha256 over the previous
 * step's key, its type, its arguments and its files' hash: a key that is in
 * DATA_DIR/builds/layers is not run again (CACHED in the log).
 *
 * Untrusted bytes are only read inside the sandbox: the COPY archives are
 * unpacked there by tar, as the sandbox's root; the host only streams them.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "daemon/buildspec.h"
#include "daemon/serve.h"
#include "egress/policy.h"
#include "egress/proxy.h"
#include "store/store.h"
#include "image/pull.h"
#include "template/template.h"
#include "util/log.h"
#include "util/macro.h"

#define STEP_TIMEOUT_MS (30 * 60 * 1000)
#define READY_TIMEOUT_MS (10 * 60 * 1000)
#define CAPTURE_MAX (64u << 10)
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

typedef struct builder {
        json_t *job;
        bool json_out;
        const char *data_dir, *tid, *bid;
        char jobdir[PATH_MAX];
        hutch_ctx *ctx;
        hutch_sandbox *sb;
        char layer[65]; /* the current layer: a cache key whose .layer exists, or "" (none) */
        char key[65];   /* the last step's cache key */
        char user[64];
        char workdir[4096]; /* "" = the user's home */
        json_t *env;
        size_t n_steps;
        char step[16]; /* the step being run, for the log */
        pid_t start_pid;
        bool start_exited;
        int start_code;
        int64_t t0;
        char last_error[1024];  /* the reason a failed build gives */
        char base_template[64]; /* the template under the layers: host or an image one */
        egress_proxy *proxy;    /* the build sandbox's egress proxy, when build-egress allows any */
        char proxy_env[8][64];  /* HTTP_PROXY and friends for every step's process */
        int n_proxy_env;
} builder;

/* ------------------------------------------------------------------ log */

__attribute__((format(printf, 3, 4))) static void emit(builder *b, const char *level,
                                                       const char *fmt, ...) {
        char msg[8192];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (streq(level, "error"))
                snprintf(b->last_error, sizeof b->last_error, "%s", msg);
        if (b->json_out) {
                json_t *o = json_pack("{s:s, s:s, s:s}", "level", level, "step", b->step, "message",
                                      msg);
                char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
                json_decref(o);
                if (s) {
                        fprintf(stdout, "%s\n", s);
                        fflush(stdout);
                }
                free(s);
        } else if (!streq(level, "debug"))
                fprintf(stderr, "%s%s\n", streq(level, "error") ? "error: " : "", msg);
}

static int64_t mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --------------------------------------------------------------- hashing */

static void sha256_parts(char ret[65], size_t n, const char *const *parts) {
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        if (!c)
                abort();
        EVP_DigestInit_ex(c, EVP_sha256(), NULL);
        for (size_t i = 0; i < n; i++) {
                const char *p = parts[i] ? parts[i] : "";
                EVP_DigestUpdate(c, p, strlen(p) + 1); /* the NUL separates the parts */
        }
        uint8_t md[32];
        unsigned ml = 0;
        EVP_DigestFinal_ex(c, md, &ml);
        EVP_MD_CTX_free(c);
        for (int i = 0; i < 32; i++)
                snprintf(ret + 2 * i, 3, "%02x", md[i]);
}
#define SHA256(ret, ...)                                                                           \
        sha256_parts(ret, sizeof((const char *const[]) { __VA_ARGS__ }) / sizeof(const char *),    \
                     (const char *const[]) { __VA_ARGS__ })

/* ------------------------------------------------------------ the cache */

static void cache_path(builder *b, const char *key, const char *ext, char *buf, size_t n) {
        snprintf(buf, n, "%s/builds/layers/%s.%s", b->data_dir, key, ext);
}

/* The context after the step with this key, if it is in the cache. */
static bool cache_load(builder *b, const char *key) {
        char p[PATH_MAX];
        cache_path(b, key, "json", p, sizeof p);
        json_t *o = json_load_file(p, 0, NULL);
        if (!json_is_object(o)) {
                json_decref(o);
                return false;
        }
        const char *layer = json_string_value(json_object_get(o, "layer"));
        const char *user = json_string_value(json_object_get(o, "user"));
        const char *wd = json_string_value(json_object_get(o, "workdir"));
        json_t *env = json_object_get(o, "env");
        char lp[PATH_MAX];
        bool ok = layer && user && wd && json_is_object(env);
        if (ok && *layer) {
                cache_path(b, layer, "layer", lp, sizeof lp);
                ok = access(lp, R_OK) == 0;
        }
        if (ok) {
                snprintf(b->layer, sizeof b->layer, "%s", layer);
                snprintf(b->user, sizeof b->user, "%s", user);
                snprintf(b->workdir, sizeof b->workdir, "%s", wd);
                json_decref(b->env);
                b->env = json_deep_copy(env);
                snprintf(b->key, sizeof b->key, "%s", key);
                (void) utimensat(AT_FDCWD, p, NULL, 0); /* used now: kept by the collection */
        }
        json_decref(o);
        return ok;
}

static int write_file_atomic(const char *final, const void *data, size_t len) {
        char tmp[PATH_MAX + 32];
        /* this process's own: two builds may make the same key at once */
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", final, (long) getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        int r = 0;
        if (write(fd, data, len) != (ssize_t) len || fsync(fd) < 0)
                r = -errno ? -errno : -EIO;
        close(fd);
        if (r == 0 && rename(tmp, final) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}

static int cache_save(builder *b, const char *key) {
        /* templateID: whose build made it, for the daemon's cache collection */
        json_t *o = json_pack("{s:s, s:s, s:s, s:O, s:s}", "layer", b->layer, "user", b->user,
                              "workdir", b->workdir, "env", b->env, "templateID",
                              b->tid ? b->tid : "");
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        char p[PATH_MAX];
        cache_path(b, key, "json", p, sizeof p);
        int r = s ? write_file_atomic(p, s, strlen(s)) : -ENOMEM;
        free(s);
        snprintf(b->key, sizeof b->key, "%s", key);
        return r;
}

/* ---------------------------------------------------------- the sandbox */

#define BUILD_PROXY_PORT 3128

/* The build sandbox's egress, as a `hutch run --net` sandbox's: a proxy of
 * this process in the sandbox's netns, the build-egress rules under the
 * daemon's ceiling (egress-allow, -deny, -open). None when the rules are
 * empty: the sandbox then has loopback only. */
static int build_net_start(builder *b) {
        json_t *eg = json_object_get(b->job, "egress");
        const char *rules = json_string_value(json_object_get(eg, "rules"));
        if (!rules || !*rules)
                return 0;
        char why[256];
        _cleanup_(egress_ceiling_unrefp) egress_ceiling *c = NULL;
        int r = egress_ceiling_new(&c);
        if (r < 0)
                return r;
        static const struct {
                const char *key, *setting;
                int (*add)(egress_ceiling *, const char *, char *, size_t);
        } lists[] = { { "allow", "egress-allow", egress_ceiling_add_allow },
                      { "deny", "egress-deny", egress_ceiling_add_deny },
                      { "open", "egress-open", egress_ceiling_allow_private } };
        for (size_t i = 0; i < ELEMENTSOF(lists); i++) {
                const char *v = json_string_value(json_object_get(eg, lists[i].key));
                if (v && *v &&
                    (r = egress_ceiling_add_list(c, v, lists[i].add, why, sizeof why)) < 0) {
                        emit(b, "error", "%s: %s", lists[i].setting, why);
                        return r;
                }
        }
        if ((r = egress_ceiling_add_host_addresses(c)) < 0)
                return r;
        egress_proxy_config pc = { 0 };
        r = egress_nameservers(json_string_value(json_object_get(eg, "dns")), pc.nameservers,
                               EGRESS_NAMESERVERS_MAX, why, sizeof why);
        if (r < 0) {
                emit(b, "error", "dns: %s", why);
                return r;
        }
        pc.n_nameservers = (size_t) r;
        egress_policy *p = NULL;
        if ((r = egress_policy_new(&p)) < 0)
                return r;
        if ((r = egress_policy_add_rules(p, rules, why, sizeof why)) < 0) {
                egress_policy_free(p);
                emit(b, "error", "build-egress: %s", why);
                return r;
        }
        egress_policy_set_ceiling(p, c);
        if ((r = egress_proxy_new(&pc, &b->proxy)) < 0) {
                egress_policy_free(p);
                return r;
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/net", (int) hutch_sandbox_init_pid(b->sb));
        _cleanup_close_ int nfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0) {
                r = -errno;
                egress_policy_free(p);
                emit(b, "error", "the build sandbox's netns: %s", strerror(-r));
                return r;
        }
        egress_site *site;
        if ((r = egress_site_open(b->proxy, hutch_sandbox_id(b->sb), nfd, BUILD_PROXY_PORT, p,
                                  &site)) < 0) {
                emit(b, "error", "the build sandbox's egress proxy: %s", strerror(-r));
                return r;
        }
        hutch_error err = { 0 };
        if ((r = hutch_sandbox_set_network(b->sb, true, &err)) < 0) {
                emit(b, "error", "the build sandbox's network: %s", err.msg);
                return r;
        }
        b->n_proxy_env = egress_proxy_env(BUILD_PROXY_PORT, b->proxy_env);
        emit(b, "info", "[builder] egress through the proxy: %s", rules);
        return 0;
}

static int sandbox_ensure(builder *b) {
        if (b->sb)
                return 0;
        hutch_error err = { 0 };
        if (!b->ctx) {
                hutch_ctx_config cc = { .data_dir = b->data_dir,
                                        .run_dir = json_string_value(
                                                json_object_get(b->job, "runDir")) };
                if (hutch_ctx_new(&cc, &b->ctx, &err) < 0) {
                        emit(b, "error", "%s", err.msg);
                        return -EIO;
                }
        }
        char id[HUTCH_ID_LEN + 1];
        if (hutch_sandbox_id_new(id) < 0)
                abort();
        if (b->jobdir[0]) {
                /* the daemon removes it when this process dies */
                char p[PATH_MAX + 16];
                snprintf(p, sizeof p, "%s/sandbox", b->jobdir);
                (void) write_file_atomic(p, id, strlen(id));
        }
        char lp[PATH_MAX];
        if (b->layer[0])
                cache_path(b, b->layer, "layer", lp, sizeof lp);
        json_int_t mem = json_integer_value(json_object_get(b->job, "memoryMB"));
        json_int_t cpu = json_integer_value(json_object_get(b->job, "cpuCount"));
        hutch_sandbox_config cfg = {
                .template_name = b->base_template[0] ? b->base_template : "host",
                .id = id,
                .network = false, /* a build step reaches no network (docs/templates.md) */
                .layer_from = b->layer[0] ? lp : NULL,
                .owner = "hutch template build",
                .limits = { .memory_bytes = (uint64_t) (mem >= 128 ? mem : 1024) << 20,
                            .cpu_millis = (uint64_t) (cpu >= 1 && cpu <= 64 ? cpu : 2) * 1000,
                            .disk_bytes = 4ull << 30 },
        };
        if (hutch_sandbox_create(b->ctx, &cfg, &b->sb, &err) < 0 ||
            hutch_sandbox_tie_lifetime(b->sb, &err) < 0) {
                emit(b, "error", "cannot start the build sandbox: %s", err.msg);
                goto fail;
        }
        if (build_net_start(b) < 0) {
        fail:
                egress_proxy_free(b->proxy);
                b->proxy = NULL;
                if (b->sb) {
                        hutch_error e2 = { 0 };
                        (void) hutch_sandbox_destroy(b->sb, &e2);
                        hutch_sandbox_unref(b->sb);
                        b->sb = NULL;
                }
                return -EIO;
        }
        return 0;
}

static void sandbox_drop(builder *b) {
        if (!b->sb)
                return;
        hutch_error err = { 0 };
        (void) hutch_sandbox_destroy(b->sb, &err);
        hutch_sandbox_unref(b->sb);
        b->sb = NULL;
        egress_proxy_free(b->proxy);
        b->proxy = NULL;
        b->n_proxy_env = 0;
}

static int layer_export(builder *b, const char *key) {
        char final[PATH_MAX], tmp[PATH_MAX + 16];
        cache_path(b, key, "layer", final, sizeof final);
        /* this process's own: two builds may make the same key at once */
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", final, (long) getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
                emit(b, "error", "%s: %s", tmp, strerror(errno));
                return -errno;
        }
        hutch_error err = { 0 };
        uint64_t bytes = 0;
        int r = hutch_sandbox_layer_export(b->sb, fd, &bytes, &err);
        if (r >= 0 && fsync(fd) < 0)
                r = -errno;
        close(fd);
        if (r >= 0 && rename(tmp, final) < 0)
                r = -errno;
        if (r < 0) {
                unlink(tmp);
                emit(b, "error", "saving the step's layer: %s", err.msg[0] ? err.msg : strerror(-r));
                return r;
        }
        snprintf(b->layer, sizeof b->layer, "%s", key);
        emit(b, "debug", "layer %.12s: %llu bytes", key, (unsigned long long) bytes);
        return 0;
}

/* ------------------------------------------------------------ processes */

typedef struct outbuf {
        int fd;
        bool open;
        const char *name; /* stdout | stderr */
        char line[8192];
        size_t len;
} outbuf;

typedef struct proc_io {
        const char *log_prefix; /* log lines "<prefix> [stdout]: …"; NULL: not logged */
        char *capture;          /* stdout kept here (malloc'ed) when not NULL-initialised */
        size_t cap_len;
        bool want_capture;
        int in_fd; /* fed to stdin, or -1 */
        int timeout_ms;
} proc_io;

static void out_line(builder *b, proc_io *io, outbuf *o, bool flush) {
        for (;;) {
                char *nl = memchr(o->line, '\n', o->len);
                if (!nl && !flush && o->len < sizeof o->line)
                        return;
                size_t n = nl ? (size_t) (nl - o->line) : o->len;
                if (n == 0 && !nl)
                        return;
                char l[sizeof o->line + 1];
                memcpy(l, o->line, n);
                l[n] = 0;
                size_t drop = nl ? n + 1 : n;
                memmove(o->line, o->line + drop, o->len - drop);
                o->len -= drop;
                /* trimmed, blank lines dropped */
                char *s = l;
                while (*s == ' ' || *s == '\t' || *s == '\r')
                        s++;
                size_t k = strlen(s);
                while (k > 0 && (s[k - 1] == ' ' || s[k - 1] == '\t' || s[k - 1] == '\r'))
                        s[--k] = 0;
                if (*s && io->log_prefix)
                        emit(b, "info", "%s [%s]: %s", io->log_prefix, o->name, s);
        }
}

static void out_read(builder *b, proc_io *io, outbuf *o, bool is_stdout) {
        char buf[16384];
        ssize_t n = read(o->fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n <= 0) {
                out_line(b, io, o, true);
                close(o->fd);
                o->fd = -1;
                o->open = false;
                return;
        }
        if (is_stdout && io->want_capture && io->cap_len + (size_t) n <= CAPTURE_MAX) {
                char *c = realloc(io->capture, io->cap_len + (size_t) n + 1);
                if (c) {
                        memcpy(c + io->cap_len, buf, (size_t) n);
                        io->cap_len += (size_t) n;
                        c[io->cap_len] = 0;
                        io->capture = c;
                }
        }
        for (ssize_t off = 0; off < n;) {
                size_t k = MIN((size_t) (n - off), sizeof o->line - o->len);
                memcpy(o->line + o->len, buf + off, k);
                o->len += k;
                off += (ssize_t) k;
                out_line(b, io, o, false);
        }
}

static void note_exit(builder *b, const hutch_exit *e) {
        if (b->start_pid && e->pid == b->start_pid) {
                b->start_exited = true;
                b->start_code = e->signal ? 128 + e->signal : e->exit_code;
        }
}

/* Run argv in the build sandbox and wait for it: its exit status (128 +
 * signal), or -errno. */
static int run_proc(builder *b, const char *const *argv, uid_t uid, gid_t gid, const char *cwd,
                    const char *const *envp, proc_io *io, bool background) {
        hutch_error err = { 0 };
        hutch_spawn_config sc = { .argv = argv,
                                  .envp = envp,
                                  .cwd = cwd,
                                  .uid = uid,
                                  .gid = gid,
                                  .stdin_mode = io->in_fd >= 0 ? HUTCH_STDIN_PIPE : HUTCH_STDIN_NULL };
        hutch_process p;
        int r = hutch_sandbox_spawn(b->sb, &sc, &p, &err);
        if (r < 0) {
                emit(b, "error", "cannot start %s: %s", argv[0], err.msg);
                return r;
        }
        if (background) {
                safe_close(p.stdin_fd);
                safe_close(p.stdout_fd);
                safe_close(p.stderr_fd);
                return p.pid;
        }
        outbuf o[2] = { { .fd = p.stdout_fd, .open = p.stdout_fd >= 0, .name = "stdout" },
                        { .fd = p.stderr_fd, .open = p.stderr_fd >= 0, .name = "stderr" } };
        for (int i = 0; i < 2; i++)
                if (o[i].fd >= 0)
                        (void) fcntl(o[i].fd, F_SETFL, O_NONBLOCK);
        int in = p.stdin_fd;
        char inbuf[65536];
        size_t in_len = 0, in_off = 0;
        bool exited = false;
        hutch_exit ex = { 0 };
        int64_t deadline = mono_ms() + (io->timeout_ms > 0 ? io->timeout_ms : STEP_TIMEOUT_MS),
                drain_until = 0;
        for (;;) {
                if (!exited) {
                        hutch_exit e2;
                        int w = hutch_sandbox_wait(b->sb, 0, &e2, &err);
                        if (w == 0 && e2.pid == p.pid) {
                                ex = e2;
                                exited = true;
                                drain_until = mono_ms() + 500;
                        } else if (w == 0)
                                note_exit(b, &e2);
                        else if (w != -ETIMEDOUT) {
                                emit(b, "error", "the build sandbox went away: %s", err.msg);
                                r = -EIO;
                                break;
                        }
                }
                if (exited && (!(o[0].open || o[1].open) || mono_ms() >= drain_until))
                        break;
                if (in >= 0 && in_len == in_off) {
                        ssize_t n = read(io->in_fd, inbuf, sizeof inbuf);
                        if (n <= 0) {
                                close(in);
                                in = -1;
                                hutch_error e2 = { 0 };
                                (void) hutch_sandbox_close_stdin(b->sb, p.pid, &e2);
                        } else {
                                in_len = (size_t) n;
                                in_off = 0;
                        }
                }
                struct pollfd pf[5];
                int np = 0, ii = -1;
                for (int i = 0; i < 2; i++)
                        if (o[i].open)
                                pf[np++] = (struct pollfd) { .fd = o[i].fd, .events = POLLIN };
                if (in >= 0) {
                        ii = np;
                        pf[np++] = (struct pollfd) { .fd = in, .events = POLLOUT };
                }
                if (!exited)
                        pf[np++] = (struct pollfd) { .fd = hutch_sandbox_fd(b->sb), .events = POLLIN };
                int ip = -1;
                if (b->proxy) {
                        ip = np;
                        pf[np++] = (struct pollfd) { .fd = egress_proxy_fd(b->proxy),
                                                     .events = POLLIN };
                }
                int64_t now = mono_ms();
                if (!exited && now >= deadline) {
                        emit(b, "error", "%s ran for more than %d s: killed", argv[0],
                             (io->timeout_ms > 0 ? io->timeout_ms : STEP_TIMEOUT_MS) / 1000);
                        hutch_error e2 = { 0 };
                        (void) hutch_sandbox_signal(b->sb, p.pid, SIGKILL, true, &e2);
                        deadline = now + 5000;
                }
                int wait = (int) MIN((exited ? drain_until : deadline) - now, 1000);
                if (poll(pf, (nfds_t) np, wait < 0 ? 0 : wait) < 0 && errno != EINTR) {
                        r = -errno;
                        break;
                }
                int k = 0;
                for (int i = 0; i < 2; i++)
                        if (o[i].open) {
                                if (pf[k].revents)
                                        out_read(b, io, &o[i], i == 0);
                                k++;
                        }
                if (ip >= 0 && pf[ip].revents)
                        egress_proxy_dispatch(b->proxy);
                if (ii >= 0 && (pf[ii].revents & (POLLOUT | POLLERR | POLLHUP))) {
                        ssize_t w = write(in, inbuf + in_off, in_len - in_off);
                        if (w > 0)
                                in_off += (size_t) w;
                        else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                                close(in);
                                in = -1;
                        }
                }
        }
        for (int i = 0; i < 2; i++)
                if (o[i].fd >= 0) {
                        out_line(b, io, &o[i], true);
                        close(o[i].fd);
                }
        safe_close(in);
        if (r < 0)
                return r;
        return ex.signal ? 128 + ex.signal : ex.exit_code;
}

static const char *const root_env[] = { "PATH=" DEFAULT_PATH, "HOME=/root",   "USER=root",
                                        "LOGNAME=root",       "LANG=C.UTF-8", NULL };

/* A root shell script with arguments ($1...); its stdout in *out when asked. */
static int root_script(builder *b, const char *script, const char *const *args, size_t n,
                       char **out, const char *log_prefix) {
        const char *argv[16] = { "/bin/sh", "-c", script, "hutch-build" };
        size_t k = 4;
        for (size_t i = 0; i < n && k < ELEMENTSOF(argv) - 1; i++)
                argv[k++] = args[i];
        argv[k] = NULL;
        proc_io io = { .in_fd = -1, .want_capture = out != NULL, .log_prefix = log_prefix };
        int r = run_proc(b, argv, 0, 0, "/", root_env, &io, false);
        if (out)
                *out = io.capture ? io.capture : strdup("");
        else
                free(io.capture);
        return r;
}

typedef struct uinfo {
        uid_t uid;
        gid_t gid;
        char home[1024];
} uinfo;

static int user_lookup(builder *b, const char *name, uinfo *ret) {
        const char *args[] = { name };
        char *out = NULL;
        /* shell builtins only: an image may have nothing but its sh */
        int r = root_script(
                b,
                "while IFS= read -r l; do case $l in \"$1\":*) printf '%s\\n' \"$l\"; exit 0;; esac; "
                "done < /etc/passwd; exit 1",
                args, 1, &out, NULL);
        /* name:x:uid:gid:gecos:home:shell */
        char *f[7] = { 0 };
        size_t nf = 0;
        for (char *p = out, *s; nf < 7 && p && (s = strsep(&p, ":\n"));)
                f[nf++] = s;
        if ((r != 0 || nf < 6) && streq(name, "root")) {
                /* an image without /etc/passwd still has root */
                free(out);
                *ret = (uinfo) { .uid = 0, .gid = 0 };
                snprintf(ret->home, sizeof ret->home, "/root");
                return 0;
        }
        if (r != 0 || nf < 6) {
                free(out);
                emit(b, "error", "user '%s' does not exist in the template", name);
                return -ENOENT;
        }
        ret->uid = (uid_t) strtoul(f[2], NULL, 10);
        ret->gid = (gid_t) strtoul(f[3], NULL, 10);
        snprintf(ret->home, sizeof ret->home, "%s", f[5]);
        free(out);
        return 0;
}

/* The context's environment for a process of user u (NULL-terminated, malloc'ed). */
static char **ctx_envp(builder *b, const char *user, const uinfo *u) {
        size_t n = json_object_size(b->env) + 6 + (size_t) b->n_proxy_env, k = 0;
        char **v = calloc(n, sizeof *v);
        if (!v)
                abort();
        const char *path = json_string_value(json_object_get(b->env, "PATH"));
        if (path) {
                if (asprintf(&v[k++], "PATH=%s:" DEFAULT_PATH, path) < 0)
                        abort();
        } else
                v[k++] = strdup("PATH=" DEFAULT_PATH);
        if (asprintf(&v[k++], "HOME=%s", u->home) < 0 || asprintf(&v[k++], "USER=%s", user) < 0 ||
            asprintf(&v[k++], "LOGNAME=%s", user) < 0)
                abort();
        for (int i = 0; i < b->n_proxy_env; i++) /* the build's egress proxy */
                v[k++] = strdup(b->proxy_env[i]);
        const char *key;
        json_t *val;
        json_object_foreach(b->env, key, val) {
                if (streq(key, "PATH") || streq(key, "HOME") || streq(key, "USER") ||
                    streq(key, "LOGNAME"))
                        continue;
                if (k + 1 >= n)
                        break;
                if (asprintf(&v[k++], "%s=%s", key, json_string_value(val)) < 0)
                        abort();
        }
        v[k] = NULL;
        return v;
}

static void strv_free(char **v) {
        for (size_t i = 0; v && v[i]; i++)
                free(v[i]);
        free(v);
}

/* Run cmd with bash -l as user in the context's workdir and env. */
static int run_user_cmd(builder *b, const char *cmd, const char *user, const char *log_prefix,
                        bool background, int timeout_ms) {
        uinfo u;
        int r = user_lookup(b, user, &u);
        if (r < 0)
                return r;
        char **envp = ctx_envp(b, user, &u);
        /* bash as E2B runs it; an image without bash gets its sh */
        /* in the workdir; else the user's home, or / for an image without it */
        const char *argv[] = {
                "/bin/sh",
                "-c",
                "cd \"$2\" 2>/dev/null || { [ -z \"$3\" ] && cd /; } || exit 1; "
                "if [ -x /bin/bash ]; then exec /bin/bash -l -c \"$1\"; fi; exec /bin/sh -l -c \"$1\"",
                "hutch-build",
                cmd,
                b->workdir[0] ? b->workdir : u.home,
                b->workdir[0] ? "workdir" : "",
                NULL
        };
        proc_io io = { .in_fd = -1, .log_prefix = log_prefix, .timeout_ms = timeout_ms };
        r = run_proc(b, argv, u.uid, u.gid, "/", (const char *const *) envp, &io, background);
        strv_free(envp);
        free(io.capture);
        return r;
}

/* --------------------------------------------------------------- steps */

static const char copy_script[] =
        "set -e\n"
        "tmp=$1 base=$2 dest=$3 owner=$4 mode=$5\n"
        "src=\"$tmp/$base\"\n"
        "if [ ! -e \"$src\" ] && [ ! -L \"$src\" ]; then echo \"source path does not exist: $base\" >&2; exit 3; fi\n"
        "case $owner in *:*) ;; *) owner=\"$owner:$owner\" ;; esac\n"
        "if [ -d \"$src\" ] && [ ! -L \"$src\" ]; then\n"
        "  chown -R \"$owner\" \"$src\"\n"
        "  if [ -n \"$mode\" ]; then chmod -R \"$mode\" \"$src\"; fi\n"
        "  mkdir -p \"$dest\"\n"
        "  cp -a \"$src/.\" \"$dest/\"\n"
        "else\n"
        "  case $dest in */) mkdir -p \"$dest\"; target=\"$dest$(basename \"$src\")\" ;;\n"
        "    *) mkdir -p \"$(dirname \"$dest\")\"; target=$dest ;; esac\n"
        "  if [ -L \"$src\" ]; then chown -h \"$owner\" \"$src\"; else chown \"$owner\" \"$src\";\n"
        "    if [ -n \"$mode\" ]; then chmod \"$mode\" \"$src\"; fi; fi\n"
        "  rm -rf -- \"$target\"\n"
        "  mv -f -- \"$src\" \"$target\"\n"
        "fi\n"
        "rm -rf -- \"$tmp\"\n";

static int step_copy(builder *b, json_t *st, size_t idx) {
        json_t *args = json_object_get(st, "args");
        const char *src = json_string_value(json_array_get(args, 0));
        const char *dest = json_string_value(json_array_get(args, 1));
        const char *owner = json_string_value(json_array_get(args, 2));
        const char *mode = json_string_value(json_array_get(args, 3));
        const char *hash = json_string_value(json_object_get(st, "filesHash"));
        char base[4096];
        if (build_copy_base(src, base, sizeof base) < 0) {
                emit(b, "error", "COPY source '%s' must be a relative path inside the context", src);
                return -EINVAL;
        }
        char ap[PATH_MAX];
        snprintf(ap, sizeof ap, "%s/%s", json_string_value(json_object_get(b->job, "filesDir")),
                 hash);
        int fd = open(ap, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
                emit(b, "error", "the files of '%s' were not uploaded (hash %s)", src, hash);
                return -ENOENT;
        }
        uint8_t magic[2] = { 0 };
        bool gz = pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
        char tmp[64];
        snprintf(tmp, sizeof tmp, "/.hutch-copy-%zu", idx);
        char script[256];
        snprintf(script, sizeof script,
                 "rm -rf -- \"$1\" && mkdir -m 0700 -- \"$1\" && exec tar -xo%s -C \"$1\" -f -",
                 gz ? "z" : "");
        const char *argv[] = { "/bin/sh", "-c", script, "hutch-build", tmp, NULL };
        char prefix[64];
        snprintf(prefix, sizeof prefix, "[builder %zu/%zu]", idx, b->n_steps);
        proc_io io = { .in_fd = fd, .log_prefix = prefix };
        int r = run_proc(b, argv, 0, 0, "/", root_env, &io, false);
        close(fd);
        free(io.capture);
        if (r != 0) {
                emit(b, "error", "unpacking the files of '%s' failed (tar exit status %d)", src, r);
                return -EIO;
        }
        /* a relative dest is in the workdir, else the user's home */
        char d[8192];
        if (dest[0] == '/')
                snprintf(d, sizeof d, "%s", dest);
        else {
                uinfo u;
                if (!b->workdir[0] && (r = user_lookup(b, b->user, &u)) < 0)
                        return r;
                snprintf(d, sizeof d, "%s/%s", b->workdir[0] ? b->workdir : u.home, dest);
        }
        const char *cargs[] = { tmp, base, d, owner && *owner ? owner : b->user, mode ? mode : "" };
        r = root_script(b, copy_script, cargs, ELEMENTSOF(cargs), NULL, prefix);
        if (r != 0) {
                emit(b, "error", "copying '%s' to '%s' failed", src, dest);
                return -EIO;
        }
        return 0;
}

static const char workdir_script[] = "set -e\n"
                                     "p=$1 u=$2 top=\n"
                                     "q=$p; while [ ! -e \"$q\" ]; do top=$q; q=$(dirname \"$q\"); done\n"
                                     "mkdir -p -- \"$p\"\n"
                                     "if [ -n \"$top\" ]; then chown -R \"$u:$u\" -- \"$top\"; fi\n"
                                     "cd \"$p\" && pwd -P\n";

static const char user_script[] =
        "set -e\n"
        "if ! id -u \"$1\" >/dev/null 2>&1; then\n"
        "  if command -v useradd >/dev/null; then useradd --create-home --shell /bin/bash \"$1\";\n"
        "  else adduser -D \"$1\"; fi; fi\n"
        "if [ \"$2\" = true ]; then usermod -aG sudo \"$1\" 2>/dev/null || true; mkdir -p /etc/sudoers.d;\n"
        "  printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\\n' \"$1\" > \"/etc/sudoers.d/hutch-$1\"; chmod 0440 \"/etc/sudoers.d/hutch-$1\"; fi\n";

static const char finalize_script[] =
        "set -e\n"
        "if ! id -u user >/dev/null 2>&1; then\n"
        "  { if command -v useradd >/dev/null; then useradd --create-home --shell /bin/bash user;\n"
        "    elif command -v adduser >/dev/null; then adduser -D user; fi\n"
        "    usermod -aG sudo user || true; passwd -d user >/dev/null || true\n"
        "    mkdir -p /etc/sudoers.d && printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\\n' > /etc/sudoers.d/hutch-user &&\n"
        "    chmod 0440 /etc/sudoers.d/hutch-user; } 2>/dev/null || true\n"
        "fi\n"
        "printf 'ENV_ID=%s\\nTEMPLATE_ID=%s\\nBUILD_ID=%s\\n' \"$1\" \"$1\" \"$2\" > /.e2b\n";

/* ENV's value as a root login shell's printf "%s" "<value>" prints it, with
 * \, ", ` and $( escaped: $VAR expands, command substitution does not. */
static int env_eval(builder *b, const char *value, char **ret) {
        size_t n = strlen(value);
        char *q = malloc(n * 2 + 32);
        if (!q)
                return -ENOMEM;
        size_t k = 0;
        k += (size_t) sprintf(q, "printf \"%%s\" \"");
        for (size_t i = 0; i < n; i++) {
                char c = value[i];
                if (c == '\\' || c == '"' || c == '`' || (c == '$' && value[i + 1] == '('))
                        q[k++] = '\\';
                q[k++] = c;
        }
        q[k++] = '"';
        q[k] = 0;
        const char *argv[] = {
                "/bin/sh",
                "-c",
                "if [ -x /bin/bash ]; then exec /bin/bash -l -c \"$1\"; fi; exec /bin/sh -l -c \"$1\"",
                "hutch-build",
                q,
                NULL
        };
        proc_io io = { .in_fd = -1, .want_capture = true };
        int r = run_proc(b, argv, 0, 0, "/", root_env, &io, false);
        free(q);
        if (r != 0) {
                free(io.capture);
                return r < 0 ? r : -EIO;
        }
        *ret = io.capture ? io.capture : strdup("");
        return 0;
}

static int step_run(builder *b, json_t *st, size_t idx) {
        json_t *args = json_object_get(st, "args");
        const char *type = json_string_value(json_object_get(st, "type"));
        const char *a0 = json_string_value(json_array_get(args, 0));
        const char *a1 = json_string_value(json_array_get(args, 1));
        char prefix[64];
        snprintf(prefix, sizeof prefix, "[builder %zu/%zu]", idx, b->n_steps);
        if (streq(type, "ENV")) {
                for (size_t i = 0; i + 1 < json_array_size(args); i += 2) {
                        char *v = NULL;
                        int r = env_eval(b, json_string_value(json_array_get(args, i + 1)), &v);
                        if (r < 0) {
                                emit(b, "error", "evaluating %s failed",
                                     json_string_value(json_array_get(args, i)));
                                return r;
                        }
                        json_object_set_new(b->env, json_string_value(json_array_get(args, i)),
                                            json_string(v));
                        free(v);
                }
                return 0;
        }
        if (streq(type, "RUN")) {
                int r = run_user_cmd(b, a0, a1 && *a1 ? a1 : b->user, prefix, false, 0);
                if (r != 0) {
                        emit(b, "error", "failed to run command '%s': exit status %d", a0,
                             r < 0 ? 1 : r);
                        return -EIO;
                }
                return 0;
        }
        if (streq(type, "COPY"))
                return step_copy(b, st, idx);
        if (streq(type, "WORKDIR")) {
                char p[8192];
                if (a0[0] == '/')
                        snprintf(p, sizeof p, "%s", a0);
                else
                        snprintf(p, sizeof p, "%s/%s", b->workdir[0] ? b->workdir : "", a0);
                const char *wargs[] = { p, b->user };
                char *out = NULL;
                int r = root_script(b, workdir_script, wargs, 2, &out, prefix);
                size_t n = out ? strlen(out) : 0;
                while (n > 0 && out[n - 1] == '\n')
                        out[--n] = 0;
                if (r != 0 || n == 0 || n >= sizeof b->workdir) {
                        free(out);
                        emit(b, "error", "creating the workdir '%s' failed", a0);
                        return -EIO;
                }
                snprintf(b->workdir, sizeof b->workdir, "%s", out);
                free(out);
                return 0;
        }
        if (streq(type, "USER")) {
                const char *uargs[] = { a0, a1 && streq(a1, "true") ? "true" : "" };
                int r = root_script(b, user_script, uargs, 2, NULL, prefix);
                if (r != 0) {
                        emit(b, "error", "creating the user '%s' failed", a0);
                        return -EIO;
                }
                snprintf(b->user, sizeof b->user, "%s", a0);
                return 0;
        }
        emit(b, "error", "unknown step type %s", type);
        return -EINVAL;
}

static void step_text(json_t *st, char *buf, size_t n) {
        json_t *args = json_object_get(st, "args");
        size_t k = (size_t) snprintf(buf, n, "%s", json_string_value(json_object_get(st, "type")));
        for (size_t i = 0; i < json_array_size(args) && k < n; i++)
                if (*json_string_value(json_array_get(args, i)))
                        k += (size_t) snprintf(buf + k, n - k, " %s",
                                               json_string_value(json_array_get(args, i)));
}

/* The start command in the background, then the ready command every 2 s
 * until it exits 0. */
static int check_ready(builder *b, const char *start, const char *ready) {
        emit(b, "info", "Running start command: %s", start);
        int pid = run_user_cmd(b, start, b->user, NULL, true, 0);
        if (pid < 0)
                return pid;
        b->start_pid = pid;
        emit(b, "info", "Waiting for template to be ready: %s", ready);
        int64_t deadline = mono_ms() + READY_TIMEOUT_MS;
        for (;;) {
                int r = run_user_cmd(b, ready, b->user, NULL, false, 60000);
                if (r == 0)
                        break;
                if (b->start_exited && b->start_code != 0) {
                        emit(b, "error", "start command failed: exit status %d", b->start_code);
                        return -EIO;
                }
                if (mono_ms() >= deadline) {
                        emit(b, "error", "ready command timed out after %d s",
                             READY_TIMEOUT_MS / 1000);
                        return -ETIMEDOUT;
                }
                struct timespec ts = { 2, 0 };
                nanosleep(&ts, NULL);
        }
        emit(b, "info", "Template is ready");
        return 0;
}

/* 0 with the result in *ret, or -errno with the step in b->step. */
/* The image template an image base names, as a base of kind "image"
 * (a new reference), or NULL. */
static json_t *image_base(const char *data_dir, const char *name, const char *ref) {
        hutch_template *t = NULL;
        hutch_error err = { 0 };
        if (template_validate_name(name) < 0 || template_resolve(data_dir, name, &t, &err) < 0)
                return NULL;
        json_t *env = template_env_json(t);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o}", "kind", "image", "name", ref, "template",
                              name, "version", t->version ? t->version : "", "env", env);
        template_free(t);
        return o;
}

/* fromImage of an image this host does not have: pulled now, through the
 * operator's registries.conf and `hutch template login` credentials (off
 * the daemon's loop: this is the builder process). A build the daemon
 * started says how its pulls go (job.json "pull": the daemon's own
 * registries-conf, registry-ca, and only the registries the file names, for
 * the reference is a client's); `hutch template build FILE` is the
 * operator's own and pulls as `hutch template pull` does. */
/* The build's own registry credentials, which the daemon wrote to this
 * process's stdin ("user\0password"; daemon/templates.c cred_pipe()): read
 * whole into buf, stdin then becomes /dev/null. 0, or -EINVAL. */
static int cred_read(char *buf, size_t n, const char **ret_user, const char **ret_pass) {
        size_t len = 0;
        for (;;) {
                ssize_t k = read(STDIN_FILENO, buf + len, n - 1 - len);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        break;
                len += (size_t) k;
                if (len == n - 1)
                        break;
        }
        buf[len] = 0;
        int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (devnull >= 0) {
                (void) dup2(devnull, STDIN_FILENO);
                close(devnull);
        }
        size_t ul = strnlen(buf, len);
        if (ul == 0 || ul + 1 >= len || strlen(buf + ul + 1) != len - ul - 1)
                return -EINVAL;
        *ret_user = buf;
        *ret_pass = buf + ul + 1;
        return 0;
}

static int pull_base(builder *b, json_t *base) {
        const char *ref = json_string_value(json_object_get(base, "image"));
        bool given = json_is_true(json_object_get(base, "credentials"));
        emit(b, "info", "[base] pulling %s%s", ref, given ? " with the build's credentials" : "");
        json_t *pj = json_object_get(b->job, "pull");
        image_pull_opts o = {
                .conf_path = json_string_value(json_object_get(pj, "conf")),
                .ca_file = json_string_value(json_object_get(pj, "ca")),
                .configured_only = json_is_true(json_object_get(pj, "configuredOnly")),
                .team = json_integer_value(json_object_get(b->job, "teamID")),
                .aws_region = json_string_value(json_object_get(base, "awsRegion")),
        };
        /* in memory for the pull only, wiped after */
        static char cred[BUILD_CRED_USER_MAX + 1 + BUILD_CRED_PASS_MAX + 2];
        if (given && cred_read(cred, sizeof cred, &o.user, &o.pass) < 0) {
                explicit_bzero(cred, sizeof cred);
                emit(b, "error",
                     "fromImage '%s': the build's credentials did not reach the builder", ref);
                return -EINVAL;
        }
        image_pull_result res = { 0 };
        hutch_error err = { 0 };
        int r = image_pull(b->data_dir, ref, NULL, &o, NULL, &res, &err);
        explicit_bzero(cred, sizeof cred);
        if (r < 0) {
                emit(b, "error", "fromImage '%s': the pull failed: %s", ref, err.msg);
                return r;
        }
        emit(b, "info", "[base] pulled %s as template %s (%llu bytes downloaded)",
             res.source ? res.source : ref, res.name, (unsigned long long) res.bytes_downloaded);
        if (!b->json_out)
                cli_audit_note(b->data_dir, "template.pull",
                               json_pack("{s:s, s:s?, s:s, s:I, s:s}", "ref", ref, "source", res.source, "image",
                                         res.name, "bytes_downloaded", (json_int_t) res.bytes_downloaded, "by",
                                         "cli"));
        else {
                /* for the daemon's audit trail (template.pull) */
                json_t *pj2 = json_pack("{s:{s:s, s:s?, s:s, s:I, s:b}}", "pulled", "ref", ref,
                                        "source", res.source, "image", res.name, "bytes_downloaded",
                                        (json_int_t) res.bytes_downloaded, "credentials", given);
                char *s = pj2 ? json_dumps(pj2, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
                json_decref(pj2);
                if (s) {
                        fprintf(stdout, "%s\n", s);
                        fflush(stdout);
                }
                free(s);
        }
        json_t *ib = image_base(b->data_dir, res.name, ref);
        /* a pull with the build's credentials writes a new version of the
         * team's template each time: the step cache follows the image's
         * digest instead, so that an unchanged image keeps its cached steps */
        if (ib && given && res.source)
                json_object_set_new(ib, "cacheAs", json_string(res.source));
        image_pull_result_clear(&res);
        if (!ib) {
                emit(b, "error", "fromImage '%s': the pulled template cannot be read", ref);
                return -EIO;
        }
        json_object_set_new(b->job, "base", ib);
        return 0;
}

static int build_run(builder *b, json_t **ret) {
        json_t *job = b->job;
        snprintf(b->step, sizeof b->step, "base");
        if (streq(json_string_value(json_object_get(json_object_get(job, "base"), "kind")) ?: "",
                  "pull")) {
                int r = pull_base(b, json_object_get(job, "base"));
                if (r < 0)
                        return r;
        }
        json_t *base = json_object_get(job, "base");
        const char *kind = json_string_value(json_object_get(base, "kind"));
        const char *start = json_string_value(json_object_get(job, "startCmd"));
        const char *ready = json_string_value(json_object_get(job, "readyCmd"));
        bool force = json_is_true(json_object_get(job, "force"));
        b->env = json_object();
        char key[65], team[32];
        /* the cache is the team's: the same inputs of another team never
         * reach its layers (a COPY's hash is the client's word) */
        snprintf(team, sizeof team, "team:%lld",
                 (long long) json_integer_value(json_object_get(job, "teamID")));
        snprintf(b->base_template, sizeof b->base_template, "host");
        if (kind && streq(kind, "host")) {
                SHA256(key, "hutch-build-2", team, "base", "host");
                snprintf(b->user, sizeof b->user, "user");
                emit(b, "info", "[base] FROM %s [%.12s]",
                     json_string_value(json_object_get(base, "name")), key);
        } else if (kind && streq(kind, "build")) {
                const char *pk = json_string_value(json_object_get(base, "key"));
                const char *pl = json_string_value(json_object_get(base, "layer"));
                const char *bt = json_string_value(json_object_get(base, "baseTemplate"));
                SHA256(key, "hutch-build-2", team, "base", "build", pk);
                snprintf(b->layer, sizeof b->layer, "%s", pl ? pl : "");
                snprintf(b->base_template, sizeof b->base_template, "%s", bt && *bt ? bt : "host");
                snprintf(b->user, sizeof b->user, "%s",
                         json_string_value(json_object_get(base, "user")) ?: "user");
                snprintf(b->workdir, sizeof b->workdir, "%s",
                         json_string_value(json_object_get(base, "workdir")) ?: "");
                json_t *env = json_object_get(base, "env");
                if (json_is_object(env))
                        json_object_update(b->env, env);
                if (!start)
                        start = json_string_value(json_object_get(base, "startCmd"));
                if (!ready)
                        ready = json_string_value(json_object_get(base, "readyCmd"));
                emit(b, "info", "[base] FROM %s [%.12s]",
                     json_string_value(json_object_get(base, "name")), key);
        } else if (kind && streq(kind, "image")) {
                /* an image template of this host: its Env, user root, no
                 * workdir; then E2B's hidden step, USER user with sudo */
                const char *tn = json_string_value(json_object_get(base, "template"));
                const char *ver = json_string_value(json_object_get(base, "cacheAs"))
                        ?: json_string_value(json_object_get(base, "version"));
                snprintf(b->base_template, sizeof b->base_template, "%s", tn ? tn : "");
                SHA256(key, "hutch-build-2", team, "base", "image", tn, ver);
                json_t *env = json_object_get(base, "env");
                if (json_is_object(env))
                        json_object_update(b->env, env);
                emit(b, "info", "[base] FROM %s (template %s) [%.12s]",
                     json_string_value(json_object_get(base, "name")), tn ? tn : "", key);
                if (force || !cache_load(b, key)) {
                        snprintf(b->user, sizeof b->user, "root");
                        int r = sandbox_ensure(b);
                        if (r < 0)
                                return r;
                        const char *uargs[] = { "user", "true" };
                        if (root_script(b, user_script, uargs, 2, NULL, "[base]") == 0)
                                snprintf(b->user, sizeof b->user, "user");
                        else
                                emit(b, "warn",
                                     "[base] the image cannot create the user 'user': steps run as root");
                        if ((r = layer_export(b, key)) < 0 || (r = cache_save(b, key)) < 0)
                                return r < 0 ? r : -EIO;
                } else
                        emit(b, "info", "CACHED [base] USER user [%.12s]", key);
        } else {
                const char *m = json_string_value(json_object_get(base, "message"));
                emit(b, "error", "%s", m ? m : "no base for the build");
                return -ENOENT;
        }
        snprintf(b->key, sizeof b->key, "%s", key);
        json_t *steps = json_object_get(job, "steps");
        b->n_steps = json_array_size(steps);
        for (size_t i = 0; i < b->n_steps; i++) {
                json_t *st = json_array_get(steps, i);
                snprintf(b->step, sizeof b->step, "%zu", i + 1);
                force |= json_is_true(json_object_get(st, "force"));
                char text[1024], args_joined[8192] = "";
                step_text(st, text, sizeof text);
                json_t *args = json_object_get(st, "args");
                size_t k = 0;
                for (size_t a = 0; a < json_array_size(args) && k < sizeof args_joined; a++)
                        k += (size_t) snprintf(args_joined + k, sizeof args_joined - k, "%s%s",
                                               a ? " " : "",
                                               json_string_value(json_array_get(args, a)));
                /* the full arguments go into the key, not a bounded copy */
                char *full = NULL;
                size_t flen = 0;
                FILE *f = open_memstream(&full, &flen);
                for (size_t a = 0; f && a < json_array_size(args); a++)
                        fprintf(f, "%s%s", a ? " " : "", json_string_value(json_array_get(args, a)));
                if (f)
                        fclose(f);
                SHA256(key, "hutch-build-2", b->key, json_string_value(json_object_get(st, "type")),
                       full, json_string_value(json_object_get(st, "filesHash")));
                free(full);
                if (!force && cache_load(b, key)) {
                        emit(b, "info", "CACHED [builder %zu/%zu] %s [%.12s]", i + 1, b->n_steps,
                             text, key);
                        continue;
                }
                emit(b, "info", "[builder %zu/%zu] %s [%.12s]", i + 1, b->n_steps, text, key);
                int r = sandbox_ensure(b);
                if (r < 0)
                        return r;
                if ((r = step_run(b, st, i + 1)) < 0)
                        return r;
                const char *type = json_string_value(json_object_get(st, "type"));
                if (!streq(type, "ENV") && (r = layer_export(b, key)) < 0)
                        return r;
                if ((r = cache_save(b, key)) < 0) {
                        emit(b, "error", "saving the step cache: %s", strerror(-r));
                        return r;
                }
        }
        snprintf(b->step, sizeof b->step, "finalize");
        SHA256(key, "hutch-build-2", b->key, "finalize", b->tid, start, ready);
        if (!force && cache_load(b, key))
                emit(b, "info", "CACHED [finalize] [%.12s]", key);
        else {
                emit(b, "info", "[finalize] [%.12s]", key);
                int r = sandbox_ensure(b);
                if (r < 0)
                        return r;
                const char *fargs[] = { b->tid, b->bid };
                if ((r = root_script(b, finalize_script, fargs, 2, NULL, "[finalize]")) != 0) {
                        emit(b, "error", "finalizing the template failed");
                        return -EIO;
                }
                if ((r = layer_export(b, key)) < 0)
                        return r;
                if (start && *start &&
                    (r = check_ready(b, start, ready && *ready ? ready : "sleep 20")) < 0)
                        return r;
                if ((r = cache_save(b, key)) < 0)
                        return r;
        }
        sandbox_drop(b);
        *ret = json_pack("{s:s, s:s, s:s, s:s, s:s, s:O, s:s, s:s}", "key", key, "baseTemplate",
                         b->base_template, "layer", b->layer, "user", b->user, "workdir",
                         b->workdir, "env", b->env, "startCmd", start ? start : "", "readyCmd",
                         ready ? ready : "");
        emit(b, "info", "Build finished, took %.1fs", (double) (mono_ms() - b->t0) / 1000.0);
        return 0;
}

static void builder_free(builder *b) {
        sandbox_drop(b);
        hutch_ctx_free(b->ctx);
        json_decref(b->env);
        json_decref(b->job);
}

/* ------------------------------------------------------------ job mode */

static int job_mode(const char *dir, const char *parent) {
        /* the daemon's child: dies with it */
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (parent && (pid_t) strtol(parent, NULL, 10) != getppid())
                return EXIT_HUTCH;
        signal(SIGPIPE, SIG_IGN);
        builder b = { .json_out = true, .t0 = mono_ms() };
        snprintf(b.jobdir, sizeof b.jobdir, "%s", dir);
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/job.json", dir);
        json_error_t je;
        b.job = json_load_file(p, 0, &je);
        if (!json_is_object(b.job)) {
                fprintf(stdout,
                        "{\"done\":\"error\",\"step\":\"base\",\"message\":\"unreadable job\"}\n");
                return EXIT_HUTCH;
        }
        b.data_dir = json_string_value(json_object_get(b.job, "dataDir"));
        b.tid = json_string_value(json_object_get(b.job, "templateID"));
        b.bid = json_string_value(json_object_get(b.job, "buildID"));
        json_t *res = NULL;
        int r = build_run(&b, &res);
        json_t *o = r < 0
                ? json_pack("{s:s, s:s, s:s}", "done", "error", "step", b.step, "message", "")
                : json_pack("{s:s, s:o}", "done", "ready", "result", res);
        if (r < 0) /* the reason is the last error the build logged */
                json_object_set_new(o, "message",
                                    json_string(b.last_error[0] ? b.last_error : "the build failed"));
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        builder_free(&b);
        fprintf(stdout, "%s\n", s);
        fflush(stdout);
        free(s);
        return r < 0 ? 1 : 0;
}

/* ------------------------------------------------------------ file mode */

/* A COPY source's archive, made by the host's tar from the context (the
 * operator's own files), stored under its hash: sha256 of "COPY src dest"
 * and the archive. */
static int cli_archive(const char *ctxdir, const char *src, const char *dest, const char *files_dir,
                       char ret_hash[65]) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s/.cli-XXXXXX.tmp", files_dir);
        int fd = mkostemps(tmp, 4, O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(-errno, "%s: %m", tmp);
        pid_t pid = fork();
        if (pid < 0) {
                close(fd);
                unlink(tmp);
                return -errno;
        }
        if (pid == 0) {
                dup2(fd, STDOUT_FILENO);
                execlp("tar", "tar", "-C", ctxdir, "-cf", "-", "--", src, (char *) NULL);
                _exit(127);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                close(fd);
                unlink(tmp);
                log_error("COPY %s: tar could not archive it (relative to %s)", src, ctxdir);
                return -EIO;
        }
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        EVP_DigestInit_ex(c, EVP_sha256(), NULL);
        char head[8192];
        int hn = snprintf(head, sizeof head, "COPY %s %s", src, dest);
        EVP_DigestUpdate(c, head, (size_t) hn);
        char buf[65536];
        ssize_t n;
        lseek(fd, 0, SEEK_SET);
        while ((n = read(fd, buf, sizeof buf)) > 0)
                EVP_DigestUpdate(c, buf, (size_t) n);
        close(fd);
        uint8_t md[32];
        EVP_DigestFinal_ex(c, md, NULL);
        EVP_MD_CTX_free(c);
        for (int i = 0; i < 32; i++)
                snprintf(ret_hash + 2 * i, 3, "%02x", md[i]);
        char final[PATH_MAX];
        snprintf(final, sizeof final, "%s/%s", files_dir, ret_hash);
        if (rename(tmp, final) < 0) {
                unlink(tmp);
                return -errno;
        }
        return 0;
}

/* One instruction per line: FROM, RUN, COPY SRC DEST [OWNER [MODE]], ENV
 * K=V..., WORKDIR, USER, START CMD, READY CMD; '#' comments, blank lines. */
static int cli_parse(const char *file, const char *ctxdir, const char *files_dir, json_t *job) {
        FILE *f = fopen(file, "re");
        if (!f)
                return log_error_errno(-errno, "%s: %m", file);
        json_t *steps = json_array();
        json_object_set_new(job, "steps", steps);
        char *line = NULL;
        size_t cap = 0;
        unsigned ln = 0;
        int r = 0;
        while (r == 0 && getline(&line, &cap, f) >= 0) {
                ln++;
                line[strcspn(line, "\r\n")] = 0;
                char *s = line;
                while (*s == ' ' || *s == '\t')
                        s++;
                if (!*s || *s == '#')
                        continue;
                char *rest = s + strcspn(s, " \t");
                if (*rest)
                        *rest++ = 0;
                while (*rest == ' ' || *rest == '\t')
                        rest++;
                json_t *args = json_array();
                const char *type = NULL;
                if (strcasecmp(s, "FROM") == 0 && *rest) {
                        json_object_set_new(job, "fromTemplate", json_string(rest));
                } else if (strcasecmp(s, "RUN") == 0 && *rest) {
                        type = "RUN";
                        json_array_append_new(args, json_string(rest));
                } else if (strcasecmp(s, "START") == 0 && *rest) {
                        json_object_set_new(job, "startCmd", json_string(rest));
                } else if (strcasecmp(s, "READY") == 0 && *rest) {
                        json_object_set_new(job, "readyCmd", json_string(rest));
                } else if (strcasecmp(s, "WORKDIR") == 0 || strcasecmp(s, "USER") == 0 ||
                           strcasecmp(s, "COPY") == 0 || strcasecmp(s, "ENV") == 0) {
                        type = strcasecmp(s, "WORKDIR") == 0 ? "WORKDIR"
                                : strcasecmp(s, "USER") == 0 ? "USER"
                                : strcasecmp(s, "COPY") == 0 ? "COPY"
                                                             : "ENV";
                        char *save = NULL;
                        for (char *w = strtok_r(rest, " \t", &save); w;
                             w = strtok_r(NULL, " \t", &save)) {
                                if (streq(type, "ENV")) {
                                        char *eq = strchr(w, '=');
                                        if (!eq) {
                                                r = -EINVAL;
                                                break;
                                        }
                                        *eq = 0;
                                        json_array_append_new(args, json_string(w));
                                        json_array_append_new(args, json_string(eq + 1));
                                } else
                                        json_array_append_new(args, json_string(w));
                        }
                } else
                        r = -EINVAL;
                if (r == 0 && type) {
                        json_t *st = json_pack("{s:s, s:o, s:b}", "type", type, "args", args,
                                               "force", 0);
                        if (streq(type, "COPY") && json_array_size(args) >= 2) {
                                char hash[65];
                                if ((r = cli_archive(ctxdir,
                                                     json_string_value(json_array_get(args, 0)),
                                                     json_string_value(json_array_get(args, 1)),
                                                     files_dir, hash)) < 0) {
                                        json_decref(st);
                                        break;
                                }
                                json_object_set_new(st, "filesHash", json_string(hash));
                        }
                        json_array_append_new(steps, st);
                } else
                        json_decref(args);
                if (r == -EINVAL)
                        log_error("%s:%u: not an instruction (FROM, RUN, COPY, ENV K=V, WORKDIR, USER, START, READY)",
                                  file, ln);
        }
        free(line);
        fclose(f);
        if (r == 0 && !json_object_get(job, "fromTemplate"))
                json_object_set_new(job, "fromTemplate", json_string("base"));
        return r;
}

static int file_mode(const char *file, const char *name_arg) {
        const char *data_dir = getenv("HUTCH_DATA_DIR") ?: "/var/lib/hutch";
        const char *run_dir = getenv("HUTCH_RUN_DIR") ?: "/run/hutch";
        char name[TPL_NAME_MAX + 1], why[256];
        if (!name_arg) {
                const char *b = strrchr(file, '/');
                snprintf(name, sizeof name, "%s", b ? b + 1 : file);
                name[strcspn(name, ".")] = 0;
        } else
                snprintf(name, sizeof name, "%s", name_arg);
        tpl_name nm;
        if (tpl_name_parse(name, &nm, why, sizeof why) < 0) {
                log_error("--name: %s", why);
                return EXIT_USAGE;
        }
        if (streq(nm.alias, "base") || streq(nm.alias, "host")) {
                /* as the daemon's build API answers (a build named so could
                 * never be started: those names are the built-in ones) */
                log_error("--name: '%s' is a built-in template (`hutch template base` builds base)",
                          nm.alias);
                return EXIT_USAGE;
        }
        hutch_store *st = NULL;
        if (server_open_store(data_dir, &st) < 0)
                return EXIT_HUTCH;
        hutch_error err = { 0 };
        int64_t team;
        if (store_team_find(st, "default", &team, &err) < 0) {
                log_error("no default team in %s: start `hutch serve` on it once", data_dir);
                store_close(st);
                return EXIT_HUTCH;
        }
        store_build_template t;
        if (store_btemplate_find(st, team, nm.alias, &t, &err) < 0) {
                memset(&t, 0, sizeof t);
                if (hutch_sandbox_id_new(t.id) < 0)
                        abort();
                t.team_id = team;
                snprintf(t.alias, sizeof t.alias, "%s", nm.alias);
                t.created_ms = (int64_t) time(NULL) * 1000;
                if (store_btemplate_create(st, &t, &err) < 0) {
                        log_error("%s", err.msg);
                        store_close(st);
                        return EXIT_HUTCH;
                }
        }
        char files_dir[PATH_MAX], ctxdir[PATH_MAX];
        snprintf(files_dir, sizeof files_dir, "%s/builds", data_dir);
        (void) mkdir(files_dir, 0700);
        snprintf(files_dir, sizeof files_dir, "%s/builds/layers", data_dir);
        (void) mkdir(files_dir, 0700);
        snprintf(files_dir, sizeof files_dir, "%s/builds/files", data_dir);
        (void) mkdir(files_dir, 0700);
        snprintf(files_dir, sizeof files_dir, "%s/builds/files/%s", data_dir, t.id);
        (void) mkdir(files_dir, 0700);
        snprintf(ctxdir, sizeof ctxdir, "%s", file);
        char *sl = strrchr(ctxdir, '/');
        if (sl)
                *sl = 0;
        else
                snprintf(ctxdir, sizeof ctxdir, ".");
        store_build bld = { 0 };
        char bid[40];
        {
                uint8_t u[16];
                if (RAND_bytes(u, sizeof u) != 1)
                        abort();
                u[6] = (uint8_t) ((u[6] & 0x0f) | 0x40);
                u[8] = (uint8_t) ((u[8] & 0x3f) | 0x80);
                snprintf(bid, sizeof bid,
                         "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                         u[12], u[13], u[14], u[15]);
        }
        json_t *job = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:I}", "dataDir", data_dir,
                                "runDir", run_dir, "templateID", t.id, "buildID", bid, "filesDir",
                                files_dir, "memoryMB", 1024, "teamID", (json_int_t) team);
        int r = cli_parse(file, ctxdir, files_dir, job);
        if (r < 0) {
                json_decref(job);
                store_close(st);
                return EXIT_USAGE;
        }
        const char *from = json_string_value(json_object_get(job, "fromTemplate"));
        json_t *base = NULL;
        if (template_names_host(data_dir, from))
                base = json_pack("{s:s, s:s}", "kind", "host", "name", from);
        else if (streq(from, "base")) /* the built base: an image template */
                base = image_base(data_dir, "base", "base");
        if (!base && streq(from, "base"))
                base = json_pack("{s:s, s:s}", "kind", "missing", "message",
                                 "FROM base: the base template was removed");
        else if (!base) {
                /* a template built before, by this CLI or the daemon */
                store_build_template pt;
                char pbid[40];
                store_build pb = { 0 };
                tpl_name pn;
                json_t *res = NULL;
                if (tpl_name_parse(from, &pn, why, sizeof why) == 0 &&
                    store_btemplate_find(st, team, pn.alias, &pt, &err) == 0 &&
                    store_build_tag_get(st, pt.id, pn.tag[0] ? pn.tag : "default", pbid, &err) == 0 &&
                    store_build_get(st, pbid, &pb, &err) == 0 && streq(pb.status, "ready"))
                        res = json_loads(pb.result_json, 0, NULL);
                store_build_clear(&pb);
                if (!json_is_object(res)) {
                        /* an image template of this host, else a reference to pull */
                        base = image_base(data_dir, from, from);
                        if (!base && (strchr(from, '/') || strchr(from, ':') || strchr(from, '@')))
                                base = json_pack("{s:s, s:s}", "kind", "pull", "image", from);
                        if (!base)
                                base = json_pack("{s:s, s:s}", "kind", "missing", "message",
                                                 "FROM: no such built or image template");
                }
                if (!json_is_object(res)) {
                        json_decref(res);
                } else {
                        base = res;
                        json_object_set_new(base, "kind", json_string("build"));
                        json_object_set_new(base, "name", json_string(from));
                }
        }
        json_object_set_new(job, "base", base);
        builder b = { .json_out = false,
                      .t0 = mono_ms(),
                      .job = job,
                      .data_dir = data_dir,
                      .tid = t.id,
                      .bid = bid };
        json_t *res = NULL;
        signal(SIGPIPE, SIG_IGN);
        r = build_run(&b, &res);
        snprintf(bld.id, sizeof bld.id, "%s", bid);
        snprintf(bld.template_id, sizeof bld.template_id, "%s", t.id);
        bld.team_id = team;
        snprintf(bld.status, sizeof bld.status, "%s", r < 0 ? "error" : "ready");
        bld.triggered = true;
        bld.tags_json = strdup(nm.tag[0] ? "[]" : "[\"default\"]");
        bld.reason = strdup(r < 0 ? b.last_error : "");
        snprintf(bld.reason_step, sizeof bld.reason_step, "%s", r < 0 ? b.step : "");
        bld.result_json = res ? json_dumps(res, JSON_COMPACT) : strdup("{}");
        bld.created_ms = bld.updated_ms = (int64_t) time(NULL) * 1000;
        int w = store_build_insert(st, &bld, &err);
        if (w >= 0 && r >= 0)
                w = store_build_tag_set(st, t.id, nm.tag[0] ? nm.tag : "default", bid, &err);
        if (w < 0)
                log_error("recording the build: %s", err.msg);
        store_build_clear(&bld);
        json_decref(res);
        builder_free(&b);
        store_close(st);
        if (r < 0 || w < 0)
                return 1;
        printf("%s\n", t.id);
        return 0;
}

int verb_template_build(int argc, char **argv) {
        const char *job = NULL, *parent = NULL;
        for (int i = 1; i < argc; i++) {
                if (streq(argv[i], "--job") && i + 1 < argc)
                        job = argv[++i];
                else if (streq(argv[i], "--parent") && i + 1 < argc)
                        parent = argv[++i];
        }
        if (job)
                return job_mode(job, parent);
        const char *file = NULL, *name = NULL;
        for (int i = 1; i < argc; i++) {
                if (streq(argv[i], "--help") || streq(argv[i], "-h")) {
                        fputs("usage: hutch template build FILE [--name NAME[:TAG]]\n"
                              "\n"
                              "Build a template from FILE (one instruction per line: FROM TEMPLATE, RUN CMD,\n"
                              "COPY SRC DEST [OWNER [MODE]], ENV K=V..., WORKDIR DIR, USER NAME, START CMD,\n"
                              "READY CMD) in the data dir (HUTCH_DATA_DIR), each step in a sandbox, and\n"
                              "print its template ID. COPY sources are relative to FILE's directory.\n"
                              "\n"
                              "  --name NAME[:TAG]   the template's name (default: FILE's name up to a '.')\n",
                              stdout);
                        return 0;
                }
                if (streq(argv[i], "--name") && i + 1 < argc)
                        name = argv[++i];
                else if (argv[i][0] == '-' || file) {
                        log_error("usage: hutch template build FILE [--name NAME[:TAG]]");
                        return EXIT_USAGE;
                } else
                        file = argv[i];
        }
        if (!file) {
                log_error("usage: hutch template build FILE [--name NAME[:TAG]]");
                return EXIT_USAGE;
        }
        return file_mode(file, name);
}
