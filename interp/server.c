/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch-interp: the code interpreter's server inside a sandbox. It answers
 * what @e2b/code-interpreter sends to sandbox port 49999 (docs/interpreter.md):
 * /execute streams NDJSON events, /contexts creates, lists, restarts and
 * removes contexts, /health says whether the default kernel is up. Each
 * context is one Jupyter kernel process, spoken to with the Jupyter
 * messaging protocol over ZeroMQ (HMAC-SHA256-signed messages, a
 * connection file per kernel).
 *
 * One thread, one zmq_poll() loop over the listening socket, the clients,
 * and each kernel's shell, control and iopub sockets and pidfd. It runs as
 * the sandbox's user, started by the code-interpreter template's start
 * command; what it buffers is paid for by the sandbox's memory.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ibody.h"
#include "ihttp.h"
#include "jmsg.h"
#include "jresult.h"

#define MAX_BODY (16u << 20)
/* E2B's server sends one after 5 s of silence. A client's close is seen
 * only by a write (the daemon's proxy learns of it when it writes, and TCP
 * answers the first write after a close with the RST the second meets), so
 * a cell whose client gave up is interrupted about two keepalives later:
 * every second, not every five. */
#define KEEPALIVE_MS 1000
#define KERNEL_START_MS 60000
#define INTERRUPT_GRACE_MS 3000
#define MAX_CLIENTS 256
#define MAX_CONTEXTS 64

extern char **environ;

/* Output bounds (docs/interpreter.md "Interrupts, dead kernels, limits"): stream text per execution,
 * and the size of one result; HUTCH_INTERP_OUTPUT_LIMIT overrides. */
static size_t output_limit = 64u << 20;
static const char *interp_dir = ".";
static int verbose;

static int64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define logf(...)                                                                                  \
        do {                                                                                       \
                if (verbose)                                                                       \
                        fprintf(stderr, "hutch-interp: " __VA_ARGS__);                             \
        } while (0)

typedef struct client client;
typedef struct exec exec;
typedef struct kctx kctx;

struct exec {
        exec *next; /* in its context's queue */
        kctx *ctx;
        client *cl; /* NULL once the client went away */
        char *code;
        json_t *env;
        char msg_id[64];
        bool started, got_idle, got_reply, error_sent, cut_noted;
        int64_t interrupted_ms, reply_ms;
        size_t out_bytes;
};

struct client {
        client *next;
        int fd;
        char *rbuf;
        size_t rlen, rcap;
        char *wbuf;
        size_t woff, wlen, wcap;
        exec *ex;
        bool close_after, dead, eof;
        int64_t last_event_ms;
};

enum { K_STARTING, K_READY, K_FAILED };

struct kctx {
        kctx *next;
        char id[37], lang[IX_LANG_MAX], cwd[IX_CWD_MAX];
        char key[65], session[37], conn_file[PATH_MAX];
        int ports[5]; /* shell, iopub, stdin, control, hb */
        /* ipc: the kernel's sockets are Unix sockets "<ipc>-<port>" rather
         * than TCP ports on 127.0.0.1 (kernel_spawn) */
        char ipc[PATH_MAX];
        pid_t pid;
        int pidfd;
        void *shell, *iopub, *control;
        int state;
        int64_t started_ms, last_kinfo_ms;
        unsigned deaths; /* at start, in a row */
        exec *cur, *qhead;
        bool dead;         /* removed: freed at the end of the turn */
        bool is_default;   /* its language's default context */
        bool envs_applied; /* the claim's envs (claim_envs_load) were set in this kernel */
};

static void *zctx;
static int listen_fd = -1;
static client *clients;
static kctx *contexts;
static char conn_dir[] = "/tmp/hutch-interp.XXXXXX";
static char **base_env; /* the server's environment, what envs are restored to */
/* A sandbox from the daemon's warm pool was started before a create
 * claimed it: the daemon writes that create's envs here, and each kernel
 * gets them before its first cell (docs/interpreter.md). */
#define CLAIM_ENVS_FILE "/run/hutch-interp/envs.json"
static json_t *claim_envs;

/* ------------------------------------------------------------ clients */

static void buf_append(char **b, size_t *len, size_t *cap, const void *p, size_t n) {
        if (*len + n > *cap) {
                size_t c = *cap ? *cap : 4096;
                while (c < *len + n)
                        c *= 2;
                char *nb = realloc(*b, c);
                if (!nb)
                        abort();
                *b = nb;
                *cap = c;
        }
        memcpy(*b + *len, p, n);
        *len += n;
}

static void client_flush(client *cl) {
        while (!cl->dead && cl->woff < cl->wlen) {
                ssize_t k = send(cl->fd, cl->wbuf + cl->woff, cl->wlen - cl->woff,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                break;
                        cl->dead = true;
                        return;
                }
                cl->woff += (size_t) k;
        }
        if (cl->woff == cl->wlen)
                cl->woff = cl->wlen = 0;
        /* a client that reads nothing while a cell prints: cut at 4 limits */
        if (cl->wlen - cl->woff > 4 * output_limit + (1u << 20))
                cl->dead = true;
        if (cl->close_after && cl->wlen == 0 && !cl->ex)
                cl->dead = true;
}

static void client_write(client *cl, const void *p, size_t n) {
        if (cl->dead)
                return;
        buf_append(&cl->wbuf, &cl->wlen, &cl->wcap, p, n);
        client_flush(cl);
}

static const char *status_text(int status) {
        switch (status) {
        case 200:
                return "OK";
        case 400:
                return "Bad Request";
        case 404:
                return "Not Found";
        case 405:
                return "Method Not Allowed";
        case 413:
                return "Payload Too Large";
        case 431:
                return "Request Header Fields Too Large";
        case 500:
                return "Internal Server Error";
        case 501:
                return "Not Implemented";
        case 503:
                return "Service Unavailable";
        default:
                return "Error";
        }
}

static void reply(client *cl, int status, const char *ctype, const char *body, bool keep) {
        char head[256];
        size_t n = strlen(body);
        int k = snprintf(head, sizeof head,
                         "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n",
                         status, status_text(status), ctype, n, keep ? "" : "Connection: close\r\n");
        client_write(cl, head, (size_t) k);
        client_write(cl, body, n);
        if (!keep)
                cl->close_after = true;
}

static void reply_text(client *cl, int status, const char *text, bool keep) {
        reply(cl, status, "text/plain; charset=utf-8", text, keep);
}

static void reply_json(client *cl, int status, json_t *j, bool keep) {
        char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(j);
        reply(cl, status, "application/json", s ? s : "null", keep);
        free(s);
}

/* One NDJSON line as one HTTP chunk: the SDK decodes each read on its own,
 * so a line is never split by us (docs/interpreter.md "The wire (port 49999)"). */
static void chunk_line(client *cl, const char *line, size_t n) {
        char head[32];
        int k = snprintf(head, sizeof head, "%zx\r\n", n + 1);
        client_write(cl, head, (size_t) k);
        client_write(cl, line, n);
        client_write(cl, "\n\r\n", 3);
        cl->last_event_ms = now_ms();
}

/* ------------------------------------------------------------- events */

static void emit(exec *e, json_t *ev) {
        if (!e->cl) {
                json_decref(ev);
                return;
        }
        char *s = json_dumps(ev, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(ev);
        if (!s)
                return;
        chunk_line(e->cl, s, strlen(s));
        free(s);
}

/* A Jupyter traceback (a list of lines) as one string, lines joined by
 * newlines; NULL when there is none. */
static char *traceback_join(json_t *tb) {
        char *tbs = NULL;
        size_t tl = 0, tc = 0, i;
        json_t *line;
        json_array_foreach(tb, i, line) {
                const char *s = json_string_value(line);
                if (!s)
                        continue;
                if (tl)
                        buf_append(&tbs, &tl, &tc, "\n", 1);
                buf_append(&tbs, &tl, &tc, s, strlen(s));
        }
        if (tbs)
                buf_append(&tbs, &tl, &tc, "", 1);
        return tbs;
}

static void emit_error(exec *e, const char *name, const char *value, const char *tb) {
        if (e->error_sent)
                return;
        e->error_sent = true;
        emit(e,
             json_pack("{s:s, s:s, s:s, s:s}", "type", "error", "name", name, "value", value,
                       "traceback", tb));
}

static void emit_stream(exec *e, const char *name, const char *text, const char *date) {
        size_t n = strlen(text);
        if (e->out_bytes >= output_limit) {
                if (!e->cut_noted) {
                        e->cut_noted = true;
                        char msg[160];
                        snprintf(msg, sizeof msg,
                                 "\n[hutch: output cut: this cell printed more than %zu bytes]\n",
                                 output_limit);
                        emit(e,
                             json_pack("{s:s, s:s, s:s}", "type", "stderr", "text", msg,
                                       "timestamp", date));
                }
                return;
        }
        if (n > output_limit - e->out_bytes) {
                /* cut at a UTF-8 boundary */
                size_t keep = output_limit - e->out_bytes;
                while (keep > 0 && ((unsigned char) text[keep] & 0xc0) == 0x80)
                        keep--;
                char *t = strndup(text, keep);
                if (!t)
                        return;
                e->out_bytes = output_limit;
                emit(e, json_pack("{s:s, s:s, s:s}", "type", name, "text", t, "timestamp", date));
                free(t);
                emit_stream(e, name, "", date);
                return;
        }
        e->out_bytes += n;
        emit(e, json_pack("{s:s, s:s, s:s}", "type", name, "text", text, "timestamp", date));
}

/* A Jupyter MIME bundle as E2B's result event (docs/interpreter.md), the
 * kernel's buffers spliced in (jresult.h). */
static void emit_result(exec *e, const jmsg *m, bool main_result) {
        size_t n = 0;
        char *s = jresult_line(m->content, m->buffers, m->n_buffers, main_result, &n);
        if (!s)
                return;
        if (n > output_limit) {
                free(s);
                char msg[200];
                snprintf(msg, sizeof msg, "[hutch: result cut: %zu bytes, over the %zu-byte limit]",
                         n, output_limit);
                json_t *data = json_pack("{s:s}", "text/plain", msg);
                emit(e, jresult_event(data, main_result));
                json_decref(data);
                return;
        }
        if (e->cl)
                chunk_line(e->cl, s, n);
        free(s);
}

/* ------------------------------------------------------------- kernels */

static int pick_port(void) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t l = sizeof a;
        int r = bind(fd, (struct sockaddr *) &a, sizeof a) < 0 ||
                        getsockname(fd, (struct sockaddr *) &a, &l) < 0
                ? -errno
                : ntohs(a.sin_port);
        close(fd);
        return r;
}

static void hexrand(char *out, size_t bytes) {
        unsigned char b[64];
        if (bytes > sizeof b || getrandom(b, bytes, 0) != (ssize_t) bytes)
                abort();
        for (size_t i = 0; i < bytes; i++)
                snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void uuid_new(char out[37]) {
        char h[33];
        hexrand(h, 16);
        h[12] = '4';
        h[16] = "89ab"[h[16] % 4];
        snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16, h + 20);
}

static void *zsock(const kctx *c, int type, int port, const char *ident) {
        void *s = zmq_socket(zctx, type);
        if (!s)
                return NULL;
        int zero = 0;
        /* No ZMQ_MAXMSGSIZE: past it ZeroMQ drops the connection, and the
         * message with it, unmarked. A huge result is received (into the
         * sandbox's memory, where the kernel made it first; the kernels are
         * the OOM killer's first choice, kernel_spawn) and then cut with a
         * marker (emit_result). */
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        if (ident)
                zmq_setsockopt(s, ZMQ_ROUTING_ID, ident, strlen(ident));
        if (type == ZMQ_SUB)
                zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
        char ep[PATH_MAX + 32];
        if (c->ipc[0])
                snprintf(ep, sizeof ep, "ipc://%s-%d", c->ipc, port);
        else
                snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
        if (zmq_connect(s, ep) < 0) {
                zmq_close(s);
                return NULL;
        }
        return s;
}

static void kernel_close_sockets(kctx *c) {
        if (c->shell)
                zmq_close(c->shell);
        if (c->iopub)
                zmq_close(c->iopub);
        if (c->control)
                zmq_close(c->control);
        c->shell = c->iopub = c->control = NULL;
}

/* The kernel's command line for a language. {cf} is the connection file. */
static int kernel_argv(const kctx *c, char *argv[16], char bufs[4][PATH_MAX + 64]) {
        int n = 0;
        if (strcmp(c->lang, "python") == 0) {
                /* ipykernel's own kernel, started through our launcher
                 * (hutch_kernels.py: its IOPub pipe on a Unix socket) */
                snprintf(bufs[0], sizeof bufs[0], "--IPKernelApp.exec_files=['%s/e2b_startup.py']",
                         interp_dir);
                snprintf(bufs[1], sizeof bufs[1], "%s/hutch_kernels.py", interp_dir);
                argv[n++] = "/usr/bin/python3";
                argv[n++] = bufs[1];
                argv[n++] = "python";
                argv[n++] = (char *) c->conn_file;
                argv[n++] = "--InteractiveShell.colors=NoColor";
                argv[n++] = "--PlainTextFormatter.max_seq_length=0";
                argv[n++] = "--IPKernelApp.matplotlib=inline";
                argv[n++] = bufs[0];
        } else if (strcmp(c->lang, "r") == 0) {
                argv[n++] = "/usr/bin/R";
                argv[n++] = "--slave";
                argv[n++] = "-e";
                argv[n++] = "IRkernel::main()";
                argv[n++] = "--args";
                argv[n++] = (char *) c->conn_file;
        } else {
                /* our wrapper kernels (kernels.py): bash, node, jshell */
                const char *kind = strcmp(c->lang, "bash") == 0 ? "bash"
                        : strcmp(c->lang, "java") == 0          ? "java"
                        : strcmp(c->lang, "typescript") == 0    ? "typescript"
                                                                : "javascript";
                snprintf(bufs[0], sizeof bufs[0], "%s/hutch_kernels.py", interp_dir);
                argv[n++] = "/usr/bin/python3";
                argv[n++] = bufs[0];
                argv[n++] = (char *) kind;
                argv[n++] = (char *) c->conn_file;
        }
        argv[n] = NULL;
        return n;
}

static int kernel_spawn(kctx *c) {
        /* ipykernel's kernels (python, and our wrappers) on Unix sockets in
         * our private directory: no TCP port of the sandbox's loopback is
         * a kernel's, and gVisor can checkpoint a sandbox whose kernels
         * are connected (its runsc refuses to save a connected TCP
         * endpoint that a thread waits on). IRkernel names ipc endpoints
         * its own way, so R stays on TCP. */
        bool ipc = strcmp(c->lang, "r") != 0;
        c->ipc[0] = 0;
        if (ipc)
                snprintf(c->ipc, sizeof c->ipc, "%s/k-%s", conn_dir, c->id);
        for (int i = 0; i < 5; i++) {
                int p = ipc ? i + 1 : pick_port();
                if (p < 0)
                        return p;
                c->ports[i] = p;
        }
        FILE *f = fopen(c->conn_file, "we");
        if (!f)
                return -errno;
        fprintf(f,
                "{\"transport\":\"%s\",\"ip\":\"%s\",\"shell_port\":%d,\"iopub_port\":%d,\"stdin_port\":%d,"
                "\"control_port\":%d,\"hb_port\":%d,\"key\":\"%s\",\"signature_scheme\":\"hmac-sha256\","
                "\"kernel_name\":\"%s\"}\n",
                ipc ? "ipc" : "tcp", ipc ? c->ipc : "127.0.0.1", c->ports[0], c->ports[1], c->ports[2],
                c->ports[3], c->ports[4], c->key, c->lang);
        if (fclose(f) != 0)
                return -errno;
        char *argv[16], bufs[4][PATH_MAX + 64];
        kernel_argv(c, argv, bufs);
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                setsid();
                /* a kernel ends with its server: one started again (hutch-init
                 * restarts a server that was killed) starts its own */
                if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() == 1)
                        _exit(126);
                sigset_t s;
                sigemptyset(&s);
                sigprocmask(SIG_SETMASK, &s, NULL);
                signal(SIGPIPE, SIG_DFL);
                int nul = open("/dev/null", O_RDONLY);
                if (nul >= 0)
                        dup2(nul, 0);
                /* the kernel's own chatter: a log beside its connection file */
                char logp[PATH_MAX + 8];
                snprintf(logp, sizeof logp, "%.*s.log", (int) (strlen(c->conn_file) - 5),
                         c->conn_file);
                int lg = verbose ? 2 : open(logp, O_WRONLY | O_CREAT | O_APPEND, 0600);
                if (lg >= 0) {
                        dup2(lg, 1);
                        dup2(lg, 2);
                }
                if (chdir(c->cwd) < 0)
                        _exit(126);
                /* out of memory, a kernel goes before the server: the cell
                 * then ends with KernelDied instead of a server gone */
                int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
                if (oom >= 0) {
                        (void) !write(oom, "500", 3);
                        close(oom);
                }
                execve(argv[0], argv, base_env);
                _exit(127);
        }
        c->pid = pid;
        c->pidfd = (int) syscall(SYS_pidfd_open, pid, 0);
        c->shell = zsock(c, ZMQ_DEALER, c->ports[0], c->session);
        c->iopub = zsock(c, ZMQ_SUB, c->ports[1], NULL);
        c->control = zsock(c, ZMQ_DEALER, c->ports[3], c->session);
        c->state = K_STARTING;
        c->envs_applied = false;
        c->started_ms = now_ms();
        c->last_kinfo_ms = 0;
        /* gVisor has no pidfd_open: then ctx_tick asks waitpid() */
        if (!c->shell || !c->iopub || !c->control)
                return -EIO;
        logf("context %s (%s): kernel pid %d\n", c->id, c->lang, pid);
        return 0;
}

static int ksend(kctx *c, void *sock, const char *type, json_t *content, char ret_id[64]) {
        char *fr[5];
        size_t fl[5];
        char id[64];
        int r = jmsg_encode(c->key, c->session, type, content, fr, fl, id);
        json_decref(content);
        if (r < 0)
                return r;
        r = zmq_send(sock, "<IDS|MSG>", 9, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ? -errno : 0;
        for (int i = 0; i < 5; i++) {
                if (r >= 0 &&
                    zmq_send(sock, fr[i], fl[i], (i < 4 ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
                        r = -errno;
                free(fr[i]);
        }
        if (ret_id)
                snprintf(ret_id, 64, "%s", id);
        return r;
}

static void execute_silent(kctx *c, const char *code) {
        (void) ksend(c, c->shell, "execute_request",
                     json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", code, "silent", 1,
                               "store_history", 0, "user_expressions", "allow_stdin", 0,
                               "stop_on_error", 0),
                     NULL);
}

/* --------------------------------------------------------- executions */

static void exec_free(exec *e) {
        free(e->code);
        json_decref(e->env);
        free(e);
}

static void client_next_request(client *cl);

/* The stream ends: its last line, then the chunked terminator. */
static void exec_finish(exec *e) {
        client *cl = e->cl;
        if (cl) {
                chunk_line(cl, "{\"type\": \"end_of_execution\"}",
                           strlen("{\"type\": \"end_of_execution\"}"));
                client_write(cl, "0\r\n\r\n", 5);
                cl->ex = NULL;
                e->cl = NULL;
                client_next_request(cl);
        }
}

/* A snippet that sets (value) or restores the variable k in the language. */
static char *env_code(const char *lang, const char *k, const char *v, bool unset) {
        json_t *js = json_string(v ? v : "");
        char *q = json_dumps(js, JSON_ENCODE_ANY);
        json_decref(js);
        char *out = NULL;
        if (!q)
                return NULL;
        int r;
        if (strcmp(lang, "python") == 0)
                r = unset ? asprintf(&out, "__import__('os').environ.pop('%s', None)\n", k)
                          : asprintf(&out, "__import__('os').environ['%s'] = %s\n", k, q);
        else if (strcmp(lang, "javascript") == 0 || strcmp(lang, "typescript") == 0)
                r = unset ? asprintf(&out, "delete process.env['%s'];\n", k)
                          : asprintf(&out, "process.env['%s'] = %s;\n", k, q);
        else if (strcmp(lang, "r") == 0)
                r = unset ? asprintf(&out, "invisible(Sys.unsetenv('%s'))\n", k)
                          : asprintf(&out, "invisible(Sys.setenv('%s' = %s))\n", k, q);
        else if (strcmp(lang, "java") == 0)
                r = unset ? asprintf(&out, "System.clearProperty(\"%s\");\n", k)
                          : asprintf(&out, "System.setProperty(\"%s\", %s);\n", k, q);
        else {
                /* bash: single quotes, each ' as '\'' */
                size_t n = strlen(v ? v : "");
                char *sq = malloc(4 * n + 3), *p = sq;
                if (!sq) {
                        free(q);
                        return NULL;
                }
                *p++ = '\'';
                for (const char *c = v ? v : ""; *c; c++) {
                        if (*c == '\'') {
                                memcpy(p, "'\\''", 4);
                                p += 4;
                        } else
                                *p++ = *c;
                }
                *p++ = '\'';
                *p = 0;
                r = unset ? asprintf(&out, "unset %s\n", k) : asprintf(&out, "export %s=%s\n", k, sq);
                free(sq);
        }
        free(q);
        return r < 0 ? NULL : out;
}

static const char *base_getenv(const char *k) {
        const char *v = json_string_value(json_object_get(claim_envs, k));
        if (v)
                return v;
        size_t n = strlen(k);
        for (char **e = base_env; *e; e++)
                if (strncmp(*e, k, n) == 0 && (*e)[n] == '=')
                        return *e + n + 1;
        return NULL;
}

/* One silent execution for all of them: each is a round trip through the
 * kernel (about 0.2 s on gVisor's ptrace platform, where a claim's dozen
 * envs made the first cell wait seconds). */
static void env_apply(kctx *c, json_t *env, bool restore) {
        const char *k;
        json_t *v;
        char *all = NULL;
        size_t len = 0;
        json_object_foreach(env, k, v) {
                const char *val = restore ? base_getenv(k) : json_string_value(v);
                char *code = env_code(c->lang, k, val, restore && !val);
                size_t n = code ? strlen(code) : 0;
                char *grown = code ? realloc(all, len + n + 1) : NULL;
                if (grown) {
                        memcpy(grown + len, code, n + 1);
                        all = grown;
                        len += n;
                } else if (code) { /* out of memory: this one alone */
                        execute_silent(c, code);
                }
                free(code);
        }
        if (all)
                execute_silent(c, all);
        free(all);
}

/* The claim's envs, read again while there are none (the file appears
 * when a create claims the sandbox; it does not change after). */
static json_t *claim_envs_load(void) {
        if (!claim_envs) {
                json_error_t je;
                json_t *j = json_load_file(CLAIM_ENVS_FILE, JSON_REJECT_DUPLICATES, &je);
                if (json_is_object(j)) {
                        /* strings with names a shell would take, only */
                        const char *k;
                        json_t *v, *tmp;
                        json_object_foreach_safe(j, tmp, k, v) {
                                bool ok = *k && json_is_string(v) &&
                                        strlen(json_string_value(v)) == json_string_length(v);
                                for (const char *p = k; ok && *p; p++)
                                        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                                                *p == '_' || (p > k && *p >= '0' && *p <= '9');
                                if (!ok)
                                        json_object_del(j, k);
                        }
                        claim_envs = j;
                } else
                        json_decref(j);
        }
        return claim_envs;
}

static void ctx_pump(kctx *c) {
        while (c->state == K_READY && !c->cur && c->qhead) {
                exec *e = c->qhead;
                c->qhead = e->next;
                e->next = NULL;
                if (!e->cl) { /* gave up while it waited */
                        exec_free(e);
                        continue;
                }
                c->cur = e;
                e->started = true;
                if (!c->envs_applied) {
                        c->envs_applied = true;
                        json_t *ce = claim_envs_load();
                        if (ce)
                                env_apply(c, ce, false);
                        /* a claimed kernel was started before its create: on
                         * gVisor it may be one of many restored from one
                         * checkpoint, all with the same generators' state
                         * (os.urandom is the kernel's, and fresh) */
                        if (ce && strcmp(c->lang, "python") == 0)
                                execute_silent(c, "__import__('random').seed()\n"
                                                  "if 'numpy' in __import__('sys').modules:\n"
                                                  "    __import__('sys').modules['numpy'].random.seed()\n");
                }
                if (e->env)
                        env_apply(c, e->env, false);
                json_t *content = json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", e->code,
                                            "silent", 0, "store_history", 1, "user_expressions",
                                            "allow_stdin", 0, "stop_on_error", 1);
                if (ksend(c, c->shell, "execute_request", content, e->msg_id) < 0) {
                        emit_error(e, "WebSocketError", "Failed to send execution request", "");
                        exec_finish(e);
                        c->cur = NULL;
                        exec_free(e);
                }
        }
}

static void exec_done(kctx *c) {
        exec *e = c->cur;
        if (!e)
                return;
        c->cur = NULL;
        /* the restore goes first: finishing may start a pipelined cell */
        if (e->env && c->state == K_READY)
                env_apply(c, e->env, true);
        exec_finish(e);
        exec_free(e);
        ctx_pump(c);
}

/* Everything waiting on a context ends with this error (removal, a kernel
 * that cannot start). */
static void ctx_fail_all(kctx *c, const char *name, const char *value) {
        if (c->cur) {
                emit_error(c->cur, name, value, "");
                exec *e = c->cur;
                c->cur = NULL;
                exec_finish(e);
                exec_free(e);
        }
        while (c->qhead) {
                exec *e = c->qhead;
                c->qhead = e->next;
                if (e->cl) {
                        emit_error(e, name, value, "");
                        exec_finish(e);
                }
                exec_free(e);
        }
}

static void kernel_kill(kctx *c) {
        if (c->pid > 0) {
                kill(-c->pid, SIGKILL);
                kill(c->pid, SIGKILL);
                while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        }
        c->pid = 0;
        if (c->pidfd >= 0)
                close(c->pidfd);
        c->pidfd = -1;
        kernel_close_sockets(c);
}

static void kernel_restart(kctx *c, const char *name, const char *value) {
        if (c->cur) {
                emit_error(c->cur, name, value, "");
                exec *e = c->cur;
                c->cur = NULL;
                exec_finish(e);
                exec_free(e);
        }
        kernel_kill(c);
        if (kernel_spawn(c) < 0) {
                c->state = K_FAILED;
                ctx_fail_all(c, "KernelStartError", "The context's kernel could not be started");
        }
}

static kctx *ctx_new(const char *lang, const char *cwd) {
        unsigned n = 0;
        for (kctx *c = contexts; c; c = c->next)
                n += !c->dead;
        if (n >= MAX_CONTEXTS)
                return NULL;
        kctx *c = calloc(1, sizeof *c);
        if (!c)
                return NULL;
        uuid_new(c->id);
        uuid_new(c->session);
        hexrand(c->key, 32);
        snprintf(c->lang, sizeof c->lang, "%s", lang);
        snprintf(c->cwd, sizeof c->cwd, "%s", cwd);
        snprintf(c->conn_file, sizeof c->conn_file, "%s/kernel-%s.json", conn_dir, c->id);
        c->pidfd = -1;
        if (kernel_spawn(c) < 0) {
                kernel_kill(c);
                unlink(c->conn_file);
                free(c);
                return NULL;
        }
        c->next = contexts;
        contexts = c;
        return c;
}

static kctx *ctx_find(const char *id) {
        for (kctx *c = contexts; c; c = c->next)
                if (!c->dead && strcmp(c->id, id) == 0)
                        return c;
        return NULL;
}

/* The default context of a language (made at start, or by the first
 * /execute that names the language). */
static kctx *ctx_default(const char *lang) {
        for (kctx *c = contexts; c; c = c->next)
                if (!c->dead && c->is_default && strcmp(c->lang, lang) == 0)
                        return c;
        return NULL;
}

static bool dir_ok(const char *p);

static kctx *ctx_default_new(const char *lang) {
        kctx *c = ctx_new(lang, dir_ok("/home/user") ? "/home/user" : "/");
        if (c)
                c->is_default = true;
        return c;
}

/* ------------------------------------------------------ kernel messages */

static int recv_frames(void *sock, zmq_msg_t *msgs, size_t *n) {
        *n = 0;
        for (;;) {
                zmq_msg_t m;
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
                        zmq_msg_close(&m);
                        return *n ? -EBADMSG : -errno;
                }
                bool more = zmq_msg_more(&m);
                if (*n < JMSG_MAX_FRAMES)
                        msgs[(*n)++] = m;
                else
                        zmq_msg_close(&m);
                if (!more)
                        return 0;
        }
}

/* The default javascript context is made once the python one is up: the
 * two kernels starting together slowed python's start, which a create
 * waits for (/health), by about half. */
static bool js_default_pending;

static void on_iopub(kctx *c, const jmsg *m) {
        if (c->state == K_STARTING) {
                c->state = K_READY;
                c->deaths = 0;
                if (js_default_pending && c->is_default && strcmp(c->lang, "python") == 0) {
                        js_default_pending = false;
                        if (!ctx_default("javascript") && !ctx_default_new("javascript"))
                                fprintf(stderr,
                                        "hutch-interp: the javascript kernel did not start\n");
                }
                logf("context %s (%s): ready after %lld ms\n", c->id, c->lang,
                     (long long) (now_ms() - c->started_ms));
                ctx_pump(c);
        }
        exec *e = c->cur;
        if (!e || strcmp(m->parent_id, e->msg_id) != 0)
                return;
        json_t *ct = m->content;
        const char *t = m->msg_type;
        if (strcmp(t, "status") == 0) {
                const char *st = json_string_value(json_object_get(ct, "execution_state"));
                if (st && strcmp(st, "idle") == 0)
                        e->got_idle = true;
        } else if (strcmp(t, "execute_input") == 0) {
                json_t *n = json_object_get(ct, "execution_count");
                if (json_is_integer(n))
                        emit(e,
                             json_pack("{s:s, s:I}", "type", "number_of_executions",
                                       "execution_count", json_integer_value(n)));
        } else if (strcmp(t, "stream") == 0) {
                const char *name = json_string_value(json_object_get(ct, "name"));
                const char *text = json_string_value(json_object_get(ct, "text"));
                if (name && text)
                        emit_stream(e, strcmp(name, "stderr") == 0 ? "stderr" : "stdout", text,
                                    m->date);
        } else if (strcmp(t, "execute_result") == 0) {
                emit_result(e, m, true);
        } else if (strcmp(t, "display_data") == 0 || strcmp(t, "update_display_data") == 0) {
                emit_result(e, m, false);
        } else if (strcmp(t, "error") == 0) {
                const char *en = json_string_value(json_object_get(ct, "ename"));
                const char *ev = json_string_value(json_object_get(ct, "evalue"));
                char *tbs = traceback_join(json_object_get(ct, "traceback"));
                emit_error(e, en ? en : "Error", ev ? ev : "", tbs ? tbs : "");
                free(tbs);
        }
        if (e->got_idle && e->got_reply)
                exec_done(c);
}

static void on_shell(kctx *c, const jmsg *m) {
        exec *e = c->cur;
        if (!e || strcmp(m->parent_id, e->msg_id) != 0 || strcmp(m->msg_type, "execute_reply") != 0)
                return;
        e->got_reply = true;
        e->reply_ms = now_ms();
        const char *st = json_string_value(json_object_get(m->content, "status"));
        if (st && strcmp(st, "error") == 0 && !e->error_sent) {
                /* the reply can come before iopub's error message (the two
                 * sockets race, more so on a loaded machine): ipykernel's
                 * reply carries the same traceback, so the client gets it
                 * whichever comes first */
                const char *en = json_string_value(json_object_get(m->content, "ename"));
                const char *ev = json_string_value(json_object_get(m->content, "evalue"));
                char *tbs = traceback_join(json_object_get(m->content, "traceback"));
                emit_error(e, en ? en : "Error", ev ? ev : "", tbs ? tbs : "");
                free(tbs);
        } else if (st && strcmp(st, "abort") == 0)
                emit_error(e, "ExecutionAborted", "Execution was aborted", "");
        if (e->got_idle)
                exec_done(c);
}

static void kernel_readable(kctx *c, void *sock) {
        for (unsigned batch = 0;
             batch < 256 && !c->dead && (sock == c->shell || sock == c->iopub || sock == c->control);
             batch++) {
                zmq_msg_t msgs[JMSG_MAX_FRAMES];
                size_t n = 0;
                int r = recv_frames(sock, msgs, &n);
                if (r < 0 && n == 0)
                        return;
                jframe fr[JMSG_MAX_FRAMES];
                for (size_t i = 0; i < n; i++)
                        fr[i] = (jframe) { zmq_msg_data(&msgs[i]), zmq_msg_size(&msgs[i]) };
                jmsg m;
                if (r == 0 && jmsg_decode(c->key, fr, n, &m) == 0) {
                        if (sock == c->iopub)
                                on_iopub(c, &m);
                        else if (sock == c->shell)
                                on_shell(c, &m);
                        jmsg_clear(&m);
                } else
                        logf("context %s: a kernel message that does not decode (dropped)\n", c->id);
                for (size_t i = 0; i < n; i++)
                        zmq_msg_close(&msgs[i]);
        }
}

static void kernel_died(kctx *c) {
        int status = 0;
        pid_t p;
        while ((p = waitpid(c->pid, &status, WNOHANG)) < 0 && errno == EINTR)
                ;
        if (p != c->pid)
                return;
        c->pid = 0;
        char why[200];
        if (WIFSIGNALED(status))
                snprintf(why, sizeof why,
                         "The kernel died (signal %d%s) and was restarted: the context's state is lost",
                         WTERMSIG(status), WTERMSIG(status) == SIGKILL ? ", out of memory?" : "");
        else
                snprintf(why, sizeof why,
                         "The kernel exited (status %d) and was restarted: the context's state is lost",
                         WEXITSTATUS(status));
        logf("context %s: %s\n", c->id, why);
        if (c->state == K_STARTING && ++c->deaths >= 3) {
                kernel_kill(c);
                c->state = K_FAILED;
                ctx_fail_all(c, "KernelStartError", "The context's kernel exits as it starts");
                return;
        }
        kernel_restart(c, "KernelDied", why);
}

static void ctx_tick(kctx *c, int64_t now) {
        if (c->pidfd < 0 && c->pid > 0) {
                kernel_died(c); /* a no-op while it runs */
                if (c->dead)
                        return;
        }
        if (js_default_pending && c->is_default && strcmp(c->lang, "python") == 0 &&
            c->state != K_STARTING) {
                js_default_pending = false; /* python failed: javascript all the same */
                if (!ctx_default("javascript"))
                        (void) ctx_default_new("javascript");
                return; /* the context list changed under the caller */
        }
        if (c->state == K_STARTING) {
                if (now - c->started_ms > KERNEL_START_MS) {
                        kernel_kill(c);
                        c->state = K_FAILED;
                        ctx_fail_all(c, "KernelStartError",
                                     "The context's kernel did not start in time");
                } else if (now - c->last_kinfo_ms >= 200) {
                        c->last_kinfo_ms = now;
                        (void) ksend(c, c->shell, "kernel_info_request", json_object(), NULL);
                }
        }
        exec *e = c->cur;
        if (!e)
                return;
        /* the client went away: interrupt, and escalate to a restart */
        if (!e->cl && !e->interrupted_ms) {
                e->interrupted_ms = now;
                logf("context %s: the client went away: interrupting\n", c->id);
                if (c->pid > 0)
                        kill(c->pid, SIGINT);
        } else if (!e->cl && now - e->interrupted_ms > INTERRUPT_GRACE_MS) {
                kernel_restart(c, "ExecutionAborted", "interrupted");
                return;
        }
        /* an idle that got lost (a dropped message): the reply ends it */
        if (e->got_reply && !e->got_idle && now - e->reply_ms > 2000) {
                exec_done(c);
                return;
        }
        if (e->cl && now - e->cl->last_event_ms >= KEEPALIVE_MS)
                chunk_line(e->cl, "{\"type\": \"keepalive\"}", strlen("{\"type\": \"keepalive\"}"));
}

/* ----------------------------------------------------------- requests */

static json_t *ctx_json(const kctx *c) {
        return json_pack("{s:s, s:s, s:s}", "id", c->id, "language", c->lang, "cwd", c->cwd);
}

static bool dir_ok(const char *p) {
        struct stat st;
        return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void handle_execute(client *cl, const char *body, size_t len, bool keep) {
        ix_execute x;
        char why[256];
        int r = ix_parse_execute(body, len, &x, why, sizeof why);
        if (r < 0) {
                reply_text(cl, r == -ESRCH ? 404 : 400, why, keep);
                return;
        }
        kctx *c;
        if (x.context_id[0]) {
                c = ctx_find(x.context_id);
                if (!c) {
                        snprintf(why, sizeof why, "Context %s not found", x.context_id);
                        reply_text(cl, 404, why, keep);
                        ix_execute_clear(&x);
                        return;
                }
        } else {
                const char *lang = x.language[0] ? x.language : "python";
                c = ctx_default(lang);
                if (!c && !(c = ctx_default_new(lang))) {
                        snprintf(why, sizeof why, "Failed to create a %s context", lang);
                        reply_text(cl, 500, why, keep);
                        ix_execute_clear(&x);
                        return;
                }
        }
        if (c->state == K_FAILED) {
                /* a new try for a kernel that could not start */
                c->deaths = 0;
                kernel_kill(c);
                if (kernel_spawn(c) < 0) {
                        c->state = K_FAILED;
                        reply_text(cl, 500, "The context's kernel cannot be started", keep);
                        ix_execute_clear(&x);
                        return;
                }
        }
        exec *e = calloc(1, sizeof *e);
        if (!e)
                abort();
        e->ctx = c;
        e->cl = cl;
        e->code = x.code;
        e->env = json_object_size(x.env_vars) ? json_incref(x.env_vars) : NULL;
        x.code = NULL;
        ix_execute_clear(&x);
        /* the headers at once: the SDK's request timeout covers only them */
        static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                                   "Transfer-Encoding: chunked\r\nCache-Control: no-store\r\n";
        client_write(cl, head, sizeof head - 1);
        client_write(cl, keep ? "\r\n" : "Connection: close\r\n\r\n", keep ? 2 : 21);
        if (!keep)
                cl->close_after = true;
        cl->ex = e;
        cl->last_event_ms = now_ms();
        exec **pp = &c->qhead;
        while (*pp)
                pp = &(*pp)->next;
        *pp = e;
        ctx_pump(c);
}

static void handle(client *cl, const ih_request *rq, const char *body, size_t len) {
        bool keep = rq->keep_alive;
        const char *m = rq->method, *p = rq->path;
        char why[256];
        if (strcmp(p, "/health") == 0) {
                if (strcmp(m, "GET"))
                        return reply_text(cl, 405, "Method Not Allowed", keep);
                kctx *py = ctx_default("python");
                if (py && py->state == K_READY)
                        return reply(cl, 200, "application/json", "\"OK\"", keep);
                return reply_text(cl, 503, "the default python kernel is starting", keep);
        }
        if (strcmp(p, "/execute") == 0) {
                if (strcmp(m, "POST"))
                        return reply_text(cl, 405, "Method Not Allowed", keep);
                return handle_execute(cl, body, len, keep);
        }
        if (strcmp(p, "/contexts") == 0) {
                if (strcmp(m, "GET") == 0) {
                        json_t *a = json_array();
                        /* oldest first */
                        kctx *v[MAX_CONTEXTS * 2];
                        size_t n = 0;
                        for (kctx *c = contexts; c && n < MAX_CONTEXTS * 2; c = c->next)
                                if (!c->dead)
                                        v[n++] = c;
                        while (n--)
                                json_array_append_new(a, ctx_json(v[n]));
                        return reply_json(cl, 200, a, keep);
                }
                if (strcmp(m, "POST"))
                        return reply_text(cl, 405, "Method Not Allowed", keep);
                char lang[IX_LANG_MAX], cwd[IX_CWD_MAX];
                int r = ix_parse_context(body, len, lang, cwd, why, sizeof why);
                if (r < 0)
                        return reply_text(cl, 400, why, keep);
                if (!dir_ok(cwd)) {
                        snprintf(why, sizeof why, "cwd %.900s: %s", cwd,
                                 strerror(errno ? errno : ENOTDIR));
                        return reply_text(cl, 400, why, keep);
                }
                kctx *c = ctx_new(lang, cwd);
                if (!c)
                        return reply_text(
                                cl, 500,
                                "Failed to create the context (too many contexts, or the kernel did not start)",
                                keep);
                return reply_json(cl, 200, ctx_json(c), keep);
        }
        if (strncmp(p, "/contexts/", 10) == 0) {
                char id[IX_CTX_ID_MAX] = "";
                const char *rest = p + 10, *slash = strchr(rest, '/');
                size_t n = slash ? (size_t) (slash - rest) : strlen(rest);
                if (n < sizeof id)
                        memcpy(id, rest, n), id[n] = 0;
                bool restart = slash && strcmp(slash, "/restart") == 0;
                if (slash && !restart)
                        return reply_text(cl, 404, "Not Found", keep);
                kctx *c = *id ? ctx_find(id) : NULL;
                if ((restart && strcmp(m, "POST")) || (!restart && strcmp(m, "DELETE")))
                        return reply_text(cl, 405, "Method Not Allowed", keep);
                if (!c) {
                        snprintf(why, sizeof why, "Context %.100s not found", *id ? id : rest);
                        return reply_text(cl, 404, why, keep);
                }
                if (restart) {
                        c->deaths = 0;
                        kernel_restart(c, "ContextRestarting", "Context was restarted");
                        return reply(cl, 200, "application/json", "null", keep);
                }
                ctx_fail_all(c, "ContextRemoved", "The context was removed");
                kernel_kill(c);
                unlink(c->conn_file);
                c->dead = true;
                return reply(cl, 200, "application/json", "null", keep);
        }
        return reply_text(cl, 404, "Not Found", keep);
}

/* Parse what the client sent; answer every complete request in order. */
static void client_next_request(client *cl) {
        while (!cl->dead && !cl->ex && !cl->close_after && cl->rlen > 0) {
                ih_request rq;
                int r = ih_parse_head(cl->rbuf, cl->rlen, MAX_BODY, &rq);
                if (r == 0)
                        return;
                if (r < 0) {
                        int st = r == -E2BIG       ? 431
                                : r == -EFBIG      ? 413
                                : r == -EOPNOTSUPP ? 501
                                                   : 400;
                        reply_text(cl, st,
                                   st == 413           ? "Request body too large"
                                           : st == 431 ? "Request header too large"
                                           : st == 501 ? "Unsupported transfer coding"
                                                       : "Malformed HTTP request",
                                   false);
                        cl->rlen = 0;
                        return;
                }
                size_t blen = 0, used = 0;
                char *body = NULL;
                if (rq.chunked) {
                        r = ih_chunked_scan(cl->rbuf + rq.head_len, cl->rlen - rq.head_len,
                                            MAX_BODY, &blen, &used);
                        if (r == 0 && rq.expect_continue && !cl->eof) {
                                client_write(cl, "HTTP/1.1 100 Continue\r\n\r\n", 25);
                                rq.expect_continue = false;
                        }
                        if (r == 0)
                                return;
                        if (r < 0) {
                                reply_text(cl, r == -EFBIG ? 413 : 400,
                                           r == -EFBIG ? "Request body too large"
                                                       : "Malformed chunked body",
                                           false);
                                cl->rlen = 0;
                                return;
                        }
                        body = malloc(blen + 1);
                        if (!body)
                                abort();
                        ih_chunked_copy(cl->rbuf + rq.head_len, used, body);
                } else {
                        if (cl->rlen - rq.head_len < rq.content_length)
                                return;
                        blen = used = rq.content_length;
                        body = malloc(blen + 1);
                        if (!body)
                                abort();
                        memcpy(body, cl->rbuf + rq.head_len, blen);
                }
                body[blen] = 0;
                size_t total = rq.head_len + used;
                memmove(cl->rbuf, cl->rbuf + total, cl->rlen - total);
                cl->rlen -= total;
                handle(cl, &rq, body, blen);
                free(body);
        }
}

static void client_readable(client *cl) {
        char buf[65536];
        for (;;) {
                ssize_t k = recv(cl->fd, buf, sizeof buf, MSG_DONTWAIT);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno != EAGAIN)
                                cl->dead = true;
                        break;
                }
                if (k == 0) {
                        cl->eof = true;
                        /* a streaming client that closes has given up */
                        if (cl->ex || cl->rlen == 0)
                                cl->dead = true;
                        break;
                }
                /* bounded: a head plus the largest body, chunk framing included */
                if (cl->rlen + (size_t) k > MAX_BODY + IH_MAX_HEAD + (MAX_BODY / 8) + 65536) {
                        if (!cl->ex)
                                reply_text(cl, 413, "Request body too large", false);
                        cl->rlen = 0;
                        cl->close_after = true;
                        break;
                }
                buf_append(&cl->rbuf, &cl->rlen, &cl->rcap, buf, (size_t) k);
                if ((size_t) k < sizeof buf)
                        break;
        }
        client_next_request(cl);
        if (cl->eof && !cl->ex && cl->wlen == 0)
                cl->dead = true;
}

static void client_free(client *cl) {
        if (cl->ex) {
                cl->ex->cl = NULL; /* its context interrupts it at the next tick */
                cl->ex = NULL;
        }
        close(cl->fd);
        free(cl->rbuf);
        free(cl->wbuf);
        free(cl);
}

static void accept_clients(void) {
        for (;;) {
                int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                        return;
                unsigned n = 0;
                for (client *c = clients; c; c = c->next)
                        n++;
                if (n >= MAX_CLIENTS) {
                        close(fd);
                        continue;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                client *cl = calloc(1, sizeof *cl);
                if (!cl)
                        abort();
                cl->fd = fd;
                cl->next = clients;
                clients = cl;
        }
}

/* ----------------------------------------------------------------- main */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        (void) st, (void) flag, (void) ftw;
        return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

static volatile sig_atomic_t stop;
static void on_term(int sig) {
        (void) sig;
        stop = 1;
}

static void usage(FILE *f) {
        fprintf(f,
                "Usage: hutch-interp [--port PORT] [--listen ADDR] [--no-defaults] [--verbose]\n"
                "       hutch-interp --wait-ready [--port PORT] [--timeout SECONDS]\n"
                "The code interpreter's server inside a hutch sandbox (docs/interpreter.md).\n");
}

/* The template's ready command: GET /health until it answers 200. */
static int wait_ready(const char *addr, int port, int timeout_s) {
        int64_t deadline = now_ms() + (int64_t) timeout_s * 1000;
        while (now_ms() < deadline) {
                int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t) port) };
                inet_pton(AF_INET, addr, &a.sin_addr);
                if (fd >= 0 && connect(fd, (struct sockaddr *) &a, sizeof a) == 0) {
                        static const char rq[] =
                                "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
                        char buf[64] = "";
                        if (write(fd, rq, sizeof rq - 1) == (ssize_t) sizeof rq - 1 &&
                            read(fd, buf, sizeof buf - 1) > 12 &&
                            strncmp(buf, "HTTP/1.1 200", 12) == 0) {
                                close(fd);
                                return 0;
                        }
                }
                if (fd >= 0)
                        close(fd);
                struct timespec ts = { 0, 20 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        fprintf(stderr, "hutch-interp: the server on %s:%d was not ready after %d s\n", addr, port,
                timeout_s);
        return 1;
}

static void dir_of_self(char *buf, size_t n) {
        ssize_t k = readlink("/proc/self/exe", buf, n - 1);
        if (k <= 0) {
                snprintf(buf, n, ".");
                return;
        }
        buf[k] = 0;
        char *s = strrchr(buf, '/');
        if (s && s != buf)
                *s = 0;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "port", required_argument, NULL, 'p' },
                { "listen", required_argument, NULL, 'l' },
                { "no-defaults", no_argument, NULL, 'n' },
                { "verbose", no_argument, NULL, 'v' },
                { "wait-ready", no_argument, NULL, 'w' },
                { "timeout", required_argument, NULL, 't' },
                { "help", no_argument, NULL, 'h' },
                { 0 },
        };
        int port = 49999, timeout_s = 60, c;
        const char *addr = "127.0.0.1";
        bool defaults = true, wait = false;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (c) {
                case 'p':
                        port = atoi(optarg);
                        break;
                case 'l':
                        addr = optarg;
                        break;
                case 'n':
                        defaults = false;
                        break;
                case 'v':
                        verbose = 1;
                        break;
                case 'w':
                        wait = true;
                        break;
                case 't':
                        timeout_s = atoi(optarg);
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (port <= 0 || port > 65535 || timeout_s <= 0) {
                usage(stderr);
                return 2;
        }
        if (wait)
                return wait_ready(addr, port, timeout_s);

        static char dir[PATH_MAX];
        dir_of_self(dir, sizeof dir);
        const char *d = getenv("HUTCH_INTERP_DIR");
        interp_dir = d && *d ? d : dir;
        const char *lim = getenv("HUTCH_INTERP_OUTPUT_LIMIT");
        if (lim && atoll(lim) > 1024)
                output_limit = (size_t) atoll(lim);
        if (getenv("HUTCH_INTERP_VERBOSE"))
                verbose = 1;
        base_env = environ;

        signal(SIGPIPE, SIG_IGN);
        struct sigaction sa = { .sa_handler = on_term };
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        if (!mkdtemp(conn_dir)) {
                perror("hutch-interp: mkdtemp");
                return 1;
        }
        zctx = zmq_ctx_new();
        listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t) port) };
        if (inet_pton(AF_INET, addr, &a.sin_addr) != 1 ||
            bind(listen_fd, (struct sockaddr *) &a, sizeof a) < 0 || listen(listen_fd, 128) < 0) {
                fprintf(stderr, "hutch-interp: listening on %s:%d: %s\n", addr, port,
                        strerror(errno));
                return 1;
        }
        if (defaults) {
                /* as E2B's server: python and javascript from the start */
                if (!ctx_default_new("python"))
                        fprintf(stderr, "hutch-interp: the python kernel did not start\n");
                js_default_pending = true;
        }
        logf("listening on %s:%d\n", addr, port);

        while (!stop) {
                enum { T_LISTEN, T_CLIENT, T_SOCK, T_PIDFD };
                static zmq_pollitem_t items[1 + MAX_CLIENTS + MAX_CONTEXTS * 8];
                static struct {
                        int type;
                        void *obj, *sock;
                } what[1 + MAX_CLIENTS + MAX_CONTEXTS * 8];
                size_t n = 0;
                items[n] = (zmq_pollitem_t) { .fd = listen_fd, .events = ZMQ_POLLIN };
                what[n++].type = T_LISTEN;
                for (client *cl = clients; cl; cl = cl->next) {
                        short ev = ZMQ_POLLIN;
                        if (cl->wlen > cl->woff)
                                ev |= ZMQ_POLLOUT;
                        items[n] = (zmq_pollitem_t) { .fd = cl->fd, .events = ev };
                        what[n].type = T_CLIENT;
                        what[n++].obj = cl;
                }
                for (kctx *k = contexts; k; k = k->next) {
                        if (k->dead)
                                continue;
                        void *socks[3] = { k->shell, k->iopub, k->control };
                        for (int i = 0; i < 3; i++)
                                if (socks[i]) {
                                        items[n] = (zmq_pollitem_t) { .socket = socks[i],
                                                                      .events = ZMQ_POLLIN };
                                        what[n].type = T_SOCK;
                                        what[n].obj = k;
                                        what[n++].sock = socks[i];
                                }
                        if (k->pidfd >= 0) {
                                items[n] = (zmq_pollitem_t) { .fd = k->pidfd, .events = ZMQ_POLLIN };
                                what[n].type = T_PIDFD;
                                what[n++].obj = k;
                        }
                }
                int r = zmq_poll(items, (int) n, 100);
                if (r < 0 && errno != EINTR) {
                        perror("hutch-interp: zmq_poll");
                        break;
                }
                for (size_t i = 0; r > 0 && i < n; i++) {
                        if (!items[i].revents)
                                continue;
                        switch (what[i].type) {
                        case T_LISTEN:
                                accept_clients();
                                break;
                        case T_CLIENT: {
                                client *cl = what[i].obj;
                                if (cl->dead)
                                        break;
                                if (items[i].revents & ZMQ_POLLOUT)
                                        client_flush(cl);
                                if (items[i].revents & (ZMQ_POLLIN | ZMQ_POLLERR))
                                        client_readable(cl);
                                break;
                        }
                        case T_SOCK: {
                                kctx *k = what[i].obj;
                                if (!k->dead &&
                                    (what[i].sock == k->shell || what[i].sock == k->iopub ||
                                     what[i].sock == k->control))
                                        kernel_readable(k, what[i].sock);
                                break;
                        }
                        case T_PIDFD: {
                                kctx *k = what[i].obj;
                                if (!k->dead && k->pidfd >= 0)
                                        kernel_died(k);
                                break;
                        }
                        }
                }
                int64_t now = now_ms();
                for (kctx *k = contexts; k; k = k->next)
                        if (!k->dead)
                                ctx_tick(k, now);
                /* dead clients and removed contexts go at the end of the turn */
                for (client **pp = &clients; *pp;) {
                        client *cl = *pp;
                        if (!cl->dead)
                                client_flush(cl);
                        if (cl->dead) {
                                *pp = cl->next;
                                client_free(cl);
                        } else
                                pp = &cl->next;
                }
                for (kctx **pp = &contexts; *pp;) {
                        kctx *k = *pp;
                        if (k->dead) {
                                *pp = k->next;
                                free(k);
                        } else
                                pp = &k->next;
                }
        }
        for (kctx *k = contexts; k; k = k->next)
                if (!k->dead) {
                        kernel_kill(k);
                        unlink(k->conn_file);
                }
        /* connection files, kernel logs, the wrapper kernels' scratch dirs */
        nftw(conn_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        return 0;
}
