/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch exec: run a command in a live sandbox of this host (one of `hutch
 * run`'s or of a daemon's on this run dir), the way `docker exec` does.
 * It connects to the sandbox's hutch-init as a second client (init takes
 * several) and spawns the command there; the sandbox lives on after it.
 *
 * -t gives the command a pseudo-terminal and puts ours in raw mode, so
 * that Ctrl-C, Ctrl-Z and every other key reach the command's terminal
 * (its line discipline inside the sandbox makes the signals, job control
 * included); the window size follows ours (SIGWINCH). Without -t the
 * command gets pipes and our SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded
 * to its process group; a second one ends the command with SIGKILL.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/parse.h"

#define EXEC_MAX_ENV 1024

static void exec_usage(FILE *f) {
        fputs("usage: hutch exec [OPTIONS] ID -- CMD [ARG...]\n"
              "\n"
              "Runs CMD in a live sandbox of this host (see `hutch ps`); ID may be a unique\n"
              "prefix. The sandbox lives on when CMD ends.\n"
              "\n"
              "  -i, --interactive    pass our stdin to CMD (without it CMD reads /dev/null)\n"
              "  -t, --tty            give CMD a terminal: ours goes raw, keys (Ctrl-C, Ctrl-Z)\n"
              "                       reach CMD's terminal and the window size follows ours\n"
              "  -e, --env K=V        set an environment variable (repeatable)\n"
              "  -u, --user user|root|UID\n"
              "                       run as this user (default: user, uid 1000)\n"
              "  -w, --workdir DIR    working directory (default: the user's home)\n"
              "\n"
              "Exit status: CMD's; 128+N when killed by signal N; 126 not executable;\n"
              "127 not found; 2 usage error; 1 no such sandbox; 125 hutch failed.\n",
              f);
}

typedef struct exec_opts {
        bool interactive, tty;
        const char *env[EXEC_MAX_ENV + 1];
        size_t n_env;
        uid_t uid;
        const char *workdir;
        const char *id;
        char **cmd;
} exec_opts;

/* 0, 1 after --help, -EINVAL after a usage error (printed) */
static int exec_parse(int argc, char **argv, exec_opts *o) {
        static const struct option longopts[] = {
                { "interactive", no_argument, NULL, 'i' },
                { "tty", no_argument, NULL, 't' },
                { "env", required_argument, NULL, 'e' },
                { "user", required_argument, NULL, 'u' },
                { "workdir", required_argument, NULL, 'w' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *user = "user";
        int c;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, "+ite:u:w:h", longopts, NULL)) != -1) {
                switch (c) {
                case 'i':
                        o->interactive = true;
                        break;
                case 't':
                        o->tty = true;
                        break;
                case 'e':
                        if (!cli_env_name_valid(optarg))
                                return log_error("invalid --env '%s' (expected NAME=VALUE)", optarg),
                                       -EINVAL;
                        if (o->n_env >= EXEC_MAX_ENV)
                                return log_error("too many --env options (at most %d)", EXEC_MAX_ENV),
                                       -EINVAL;
                        o->env[o->n_env++] = optarg;
                        break;
                case 'u':
                        user = optarg;
                        break;
                case 'w':
                        if (optarg[0] != '/')
                                return log_error("invalid --workdir '%s' (must be an absolute path)",
                                                 optarg),
                                       -EINVAL;
                        o->workdir = optarg;
                        break;
                case 'h':
                        exec_usage(stdout);
                        return 1;
                default:
                        if (optopt && optopt < 256)
                                log_error("unknown option '-%c' (see `hutch exec --help`)", optopt);
                        else if (optopt)
                                log_error("option '%s' needs a value (see `hutch exec --help`)",
                                          argv[optind - 1]);
                        else
                                log_error("unknown option '%s' (see `hutch exec --help`)",
                                          argv[optind - 1]);
                        return -EINVAL;
                }
        }
        if (optind >= argc)
                return log_error("no sandbox given (usage: hutch exec [OPTIONS] ID -- CMD [ARG...])"),
                       -EINVAL;
        o->id = argv[optind++];
        if (optind < argc && streq(argv[optind], "--"))
                optind++;
        if (optind >= argc)
                return log_error("no command given (usage: hutch exec [OPTIONS] ID -- CMD [ARG...])"),
                       -EINVAL;
        o->cmd = argv + optind;
        uint64_t uid;
        if (streq(user, "user"))
                o->uid = 1000;
        else if (streq(user, "root"))
                o->uid = 0;
        else if (parse_u64(user, 65535, &uid) == 0)
                o->uid = (uid_t) uid;
        else
                return log_error("invalid --user '%s' (expected user, root or a uid from 0 to 65535)",
                                 user),
                       -EINVAL;
        return 0;
}

/* The one live sandbox whose id starts with prefix: 0 and its full id in
 * ret, 1 (printed) when none or several match, <0 on a failure. */
static int exec_find(hutch_ctx *ctx, const char *prefix, char ret[HUTCH_ID_LEN + 1]) {
        char **ids = NULL;
        hutch_error err = { 0 };
        int r = hutch_sandbox_list(ctx, &ids, &err);
        if (r < 0)
                return log_error("%s", err.msg), r;
        size_t n = 0;
        for (char **p = ids; p && *p; p++) {
                if (streq(*p, prefix)) { /* an exact id wins over longer ones */
                        n = 1;
                        snprintf(ret, HUTCH_ID_LEN + 1, "%s", *p);
                        break;
                }
                if (*prefix && startswith(*p, prefix) && n++ == 0)
                        snprintf(ret, HUTCH_ID_LEN + 1, "%s", *p);
        }
        hutch_strv_free(ids);
        if (n == 1)
                return 0;
        log_error(n ? "'%s' names %zu sandboxes: give more of the id"
                    : "no sandbox '%s' on this host (see `hutch ps`)",
                  prefix, n);
        return 1;
}

static void exec_env(const exec_opts *o, const char **env, size_t cap) {
        static char home[32], user[32], logname[40], term[80];
        const char *name = o->uid == 0 ? "root" : o->uid == 1000 ? "user" : NULL;
        size_t n = 0;
        env[n++] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        snprintf(home, sizeof home, "HOME=%s",
                 o->uid == 0              ? "/root"
                         : o->uid == 1000 ? "/home/user"
                                          : "/");
        env[n++] = home;
        if (name) {
                snprintf(user, sizeof user, "USER=%s", name);
                snprintf(logname, sizeof logname, "LOGNAME=%s", name);
                env[n++] = user;
                env[n++] = logname;
        }
        env[n++] = "SHELL=/bin/bash";
        env[n++] = "LANG=C.UTF-8";
        const char *t = getenv("TERM");
        if (o->tty && t && strlen(t) < 64 && !strchr(t, '\n')) {
                snprintf(term, sizeof term, "TERM=%s", t);
                env[n++] = term;
        }
        /* the user's --env last: a later NAME= replaces an earlier one */
        for (size_t i = 0; i < o->n_env && n < cap; i++) {
                size_t k = (size_t) (strchr(o->env[i], '=') - o->env[i]) + 1;
                size_t j = 0;
                while (j < n && strncmp(env[j], o->env[i], k) != 0)
                        j++;
                env[j] = o->env[i];
                if (j == n)
                        n++;
        }
        env[n] = NULL;
}

/* Copy what in has to out: 1 more may come, 0 EOF (or a pty's EIO once its
 * last writer is gone), <0 a failure. A closed out (EPIPE) discards. */
static int exec_pump(int in, int out, bool *out_broken) {
        static char buf[65536];
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0)
                return errno == EAGAIN || errno == EINTR ? 1 : errno == EIO ? 0 : -errno;
        if (n == 0)
                return 0;
        if (*out_broken)
                return 1;
        int r = fd_write_all(out, buf, (size_t) n);
        if (r == -EPIPE) {
                *out_broken = true;
                return 1;
        }
        return r < 0 ? r : 1;
}

/* What the pending stdin bytes are written to: the command's stdin pipe or
 * its terminal, both non-blocking, so our stdin is read only when the
 * command took what we had. */
typedef struct inbuf {
        char data[65536];
        size_t len, off;
} inbuf;

int verb_exec(int argc, char **argv) {
        exec_opts o = { 0 };
        int r = exec_parse(argc, argv, &o);
        if (r != 0)
                return r > 0 ? 0 : EXIT_USAGE;

        hutch_ctx *ctx = NULL;
        hutch_sandbox *sb = NULL;
        hutch_error err = { 0 };
        hutch_process proc = { .pid = 0, .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1 };
        int status = EXIT_HUTCH, sfd = -1;
        char id[HUTCH_ID_LEN + 1];
        const char *env[EXEC_MAX_ENV + 16];

        sfd = cli_signals_open();

        if (cli_ctx(&ctx) < 0)
                goto out;
        if ((r = exec_find(ctx, o.id, id)) != 0) {
                status = r > 0 ? 1 : EXIT_HUTCH;
                goto out;
        }
        if (hutch_sandbox_attach(ctx, id, &sb, &err) < 0) {
                log_error("%s", err.msg);
                status = err.code == -ENOENT ? 1 : EXIT_HUTCH;
                goto out;
        }
        exec_env(&o, env, EXEC_MAX_ENV + 15);
        hutch_spawn_config sc = {
                .argv = (const char *const *) o.cmd,
                .envp = env,
                .cwd = o.workdir        ? o.workdir
                        : o.uid == 0    ? "/root"
                        : o.uid == 1000 ? "/home/user"
                                        : "/",
                .uid = o.uid,
                .gid = o.uid,
                .stdin_mode = o.interactive && !o.tty ? HUTCH_STDIN_PIPE : HUTCH_STDIN_NULL,
                .pty = o.tty,
        };
        if (o.tty)
                cli_tty_size(&sc.pty_rows, &sc.pty_cols);
        r = hutch_sandbox_spawn(sb, &sc, &proc, &err);
        if (r < 0) {
                if (r == -ENOENT && !strstr(err.msg, "chdir")) {
                        log_error("%s: command not found", o.cmd[0]);
                        status = EXIT_NOTFOUND;
                } else if (r == -EACCES || r == -ENOEXEC || r == -EISDIR) {
                        log_error("%s: %s", o.cmd[0], err.msg);
                        status = EXIT_NOEXEC;
                } else
                        log_error("%s", err.msg);
                goto out;
        }
        if (o.tty && o.interactive)
                cli_tty_raw();

        /* the command's output: its terminal (stdout_fd, read and written) or
         * two pipes; its input: the pipe, or the terminal with -i */
        int out_fd = proc.stdout_fd, err_fd = proc.stderr_fd;
        int in_fd = o.tty ? (o.interactive ? proc.stdout_fd : -1) : proc.stdin_fd;
        bool out_open = out_fd >= 0, err_open = err_fd >= 0, stdin_done = in_fd < 0;
        bool out_broken = false, err_broken = false;
        static inbuf in;
        hutch_exit ex = { 0 };
        bool exited = false, killed = false;
        int signals = 0;

        while (!exited) {
                hutch_exit e2;
                r = hutch_sandbox_wait(sb, 0, &e2, &err);
                if (r == 0 && e2.pid == proc.pid) {
                        ex = e2;
                        exited = true;
                        break;
                }
                if (r < 0 && r != -ETIMEDOUT) {
                        killed = true; /* init went away: the sandbox was destroyed */
                        break;
                }
                struct pollfd p[6];
                int np = 0, i_stdin = -1, i_in = -1, i_out = -1, i_err = -1, i_sig = -1;
                if (!stdin_done && in.len == 0) {
                        i_stdin = np;
                        p[np++] = (struct pollfd) { .fd = STDIN_FILENO, .events = POLLIN };
                }
                if (!stdin_done && in.len > 0) {
                        i_in = np;
                        p[np++] = (struct pollfd) { .fd = in_fd, .events = POLLOUT };
                }
                if (out_open) {
                        i_out = np;
                        p[np++] = (struct pollfd) { .fd = out_fd, .events = POLLIN };
                }
                if (err_open) {
                        i_err = np;
                        p[np++] = (struct pollfd) { .fd = err_fd, .events = POLLIN };
                }
                p[np++] = (struct pollfd) { .fd = hutch_sandbox_fd(sb), .events = POLLIN };
                if (sfd >= 0) {
                        i_sig = np;
                        p[np++] = (struct pollfd) { .fd = sfd, .events = POLLIN };
                }
                if (poll(p, (nfds_t) np, -1) < 0 && errno != EINTR) {
                        log_error("poll: %m");
                        goto out;
                }
                if (i_stdin >= 0 && p[i_stdin].revents) {
                        ssize_t n = read(STDIN_FILENO, in.data, sizeof in.data);
                        if (n > 0) {
                                in.len = (size_t) n;
                                in.off = 0;
                        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                                stdin_done = true;
                                if (o.tty) {
                                        /* the terminal's end of input, as a typed Ctrl-D */
                                        (void) fd_write_all(in_fd, "\x04", 1);
                                } else {
                                        proc.stdin_fd = safe_close(proc.stdin_fd);
                                        (void) hutch_sandbox_close_stdin(sb, proc.pid, NULL);
                                }
                        }
                }
                if (i_in >= 0 && p[i_in].revents) {
                        ssize_t n = write(in_fd, in.data + in.off, in.len - in.off);
                        if (n > 0 && (in.off += (size_t) n) == in.len)
                                in.len = in.off = 0;
                        else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                                stdin_done = true; /* the command closed its input */
                                in.len = in.off = 0;
                                if (!o.tty) {
                                        proc.stdin_fd = safe_close(proc.stdin_fd);
                                        (void) hutch_sandbox_close_stdin(sb, proc.pid, NULL);
                                }
                        }
                }
                if (i_out >= 0 && p[i_out].revents &&
                    exec_pump(out_fd, STDOUT_FILENO, &out_broken) <= 0)
                        out_open = false;
                if (i_err >= 0 && p[i_err].revents &&
                    exec_pump(err_fd, STDERR_FILENO, &err_broken) <= 0)
                        err_open = false;
                if (i_sig >= 0 && p[i_sig].revents) {
                        struct signalfd_siginfo si;
                        while (read(sfd, &si, sizeof si) == sizeof si) {
                                if (si.ssi_signo == SIGWINCH) {
                                        if (o.tty) {
                                                uint16_t rows, cols;
                                                cli_tty_size(&rows, &cols);
                                                (void) hutch_sandbox_resize(sb, proc.pid, rows,
                                                                            cols, NULL);
                                        }
                                        continue;
                                }
                                /* the first is the command's; a second ends it */
                                int sig = ++signals > 1 ? SIGKILL : (int) si.ssi_signo;
                                (void) hutch_sandbox_signal(sb, proc.pid, sig, true, NULL);
                        }
                }
        }
        /* what the command wrote before it ended is still buffered: drain it,
         * bounded (a background process may hold the pipes open) */
        for (int k = 0; k < 2; k++) {
                int fd = k == 0 ? out_fd : err_fd;
                bool *broken = k == 0 ? &out_broken : &err_broken;
                if (!(k == 0 ? out_open : err_open))
                        continue;
                for (;;) {
                        struct pollfd pf = { .fd = fd, .events = POLLIN };
                        if (poll(&pf, 1, exited ? 200 : 0) <= 0 ||
                            exec_pump(fd, k == 0 ? STDOUT_FILENO : STDERR_FILENO, broken) <= 0)
                                break;
                }
        }
        cli_tty_restore();
        if (killed) {
                log_error("sandbox %s ended while the command ran", id);
                status = 128 + SIGKILL;
        } else
                status = ex.signal ? 128 + ex.signal : ex.exit_code;

out:
        cli_tty_restore();
        safe_close(proc.stdin_fd);
        safe_close(proc.stdout_fd);
        safe_close(proc.stderr_fd);
        hutch_sandbox_unref(sb);
        hutch_ctx_free(ctx);
        safe_close(sfd);
        return status;
}
