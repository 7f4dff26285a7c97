/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Processes: SPAWN, SIGNAL, RESIZE, CLOSE_STDIN, ATTACH, LIST_PROCS and the
 * reaping of every child (we are PID 1: orphans of the whole sandbox end up
 * here too).
 *
 * init keeps its own copy of every descriptor it hands out for a process, so
 * a client that reconnects (after a daemon restart, say) can ATTACH and get
 * the process's pipes again; those copies are closed when its exit is
 * reported.
 *
 * A process spawned with T_KEEP is started again whenever it ends (a
 * service manager's Restart=always: the code interpreter's server, which
 * runs as the sandbox's user and so dies with its `kill -9 -1`): its exit
 * is reported as any other's, then it waits in `kept` for a timerfd and is
 * spawned anew with the same command line, user, directory and tag, its
 * stdio /dev/null.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <termios.h>
#include <unistd.h>

#include "init.h"
#include "util/parse.h"

#define PROC_MAX_LISTENERS 8

typedef struct proc {
        struct proc *next;
        pid_t pid;
        uint64_t serial; /* spawn order; LIST_PROCS resumes after one */
        char *tag;
        char **argv, **envv;
        char *cwd;
        uid_t uid;
        gid_t gid;
        bool pty;
        char request_id[REQUEST_ID_MAX + 1]; /* the spawn's, or "" */
        bool keep;                           /* T_KEEP: started again when it ends */
        uint32_t keep_wait_ms;               /* the last wait before a restart */
        uint64_t started_ms, due_ms;         /* CLOCK_MONOTONIC */
        /* init's own copies; -1 when absent or closed */
        int stdin_fd, stdout_fd, stderr_fd, master_fd;
        /* who gets the EV_EXIT besides ALL_EXITS subscribers: the spawner
         * and whoever ATTACHed */
        conn *listeners[PROC_MAX_LISTENERS];
} proc;

typedef struct exit_record {
        pid_t pid; /* 0: empty slot */
        int exit_code, signal;
        bool core;
        char *tag;
} exit_record;

static proc *procs, **procs_tail = &procs;
static unsigned n_procs;
static proc *kept; /* T_KEEP processes that ended, waiting to start again */
static uint64_t next_serial = 1;

/* The last exits, for an ATTACH that comes after the exit was reported (or
 * after nobody was connected to receive it). */
static exit_record exits[INIT_MAX_EXIT_RECORDS];
static unsigned exits_next;

/* ----------------------------------------------------------- bookkeeping */

static void strv_free(char **v) {
        if (!v)
                return;
        for (char **p = v; *p; p++)
                free(*p);
        free(v);
}

static char **strv_copy(const char *const *v, size_t n) {
        char **c = calloc(n + 1, sizeof(char *));
        if (!c)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                c[i] = strdup(v[i]);
                if (!c[i]) {
                        strv_free(c);
                        return NULL;
                }
        }
        return c;
}

static proc *proc_free(proc *p) {
        if (!p)
                return NULL;
        free(p->tag);
        strv_free(p->argv);
        strv_free(p->envv);
        free(p->cwd);
        safe_close(p->stdin_fd);
        safe_close(p->stdout_fd);
        safe_close(p->stderr_fd);
        safe_close(p->master_fd);
        free(p);
        return NULL;
}

static void proc_freep(proc **p) {
        *p = proc_free(*p);
}

static proc *proc_find(pid_t pid) {
        for (proc *p = procs; p; p = p->next)
                if (p->pid == pid)
                        return p;
        return NULL;
}

static proc *proc_find_tag(const char *tag) {
        for (proc *p = procs; p; p = p->next)
                if (p->tag && streq(p->tag, tag))
                        return p;
        return NULL;
}

static void proc_unlink(proc *p) {
        for (proc **pp = &procs; *pp; pp = &(*pp)->next)
                if (*pp == p) {
                        *pp = p->next;
                        if (procs_tail == &p->next)
                                procs_tail = pp;
                        n_procs--;
                        return;
                }
}

static void proc_add_listener(proc *p, conn *c) {
        for (size_t i = 0; i < PROC_MAX_LISTENERS; i++)
                if (p->listeners[i] == c)
                        return;
        /* When full, the client still has SUBSCRIBE ALL_EXITS. */
        for (size_t i = 0; i < PROC_MAX_LISTENERS; i++)
                if (!p->listeners[i]) {
                        p->listeners[i] = c;
                        return;
                }
}

static bool proc_has_listener(const proc *p, const conn *c) {
        for (size_t i = 0; i < PROC_MAX_LISTENERS; i++)
                if (p->listeners[i] == c)
                        return true;
        return false;
}

void proc_conn_gone(conn *c) {
        for (proc *p = procs; p; p = p->next)
                for (size_t i = 0; i < PROC_MAX_LISTENERS; i++)
                        if (p->listeners[i] == c)
                                p->listeners[i] = NULL;
}

static exit_record *exit_find(pid_t pid, const char *tag) {
        /* Newest first: pids are reused, the latest exit is the one meant. */
        for (unsigned i = 1; i <= INIT_MAX_EXIT_RECORDS; i++) {
                exit_record *e =
                        &exits[(exits_next + INIT_MAX_EXIT_RECORDS - i) % INIT_MAX_EXIT_RECORDS];
                if (e->pid == 0)
                        continue;
                if (tag ? (e->tag && streq(e->tag, tag)) : e->pid == pid)
                        return e;
        }
        return NULL;
}

static void exit_record_add(const proc *p, int code, int sig, bool core) {
        exit_record *e = &exits[exits_next];
        exits_next = (exits_next + 1) % INIT_MAX_EXIT_RECORDS;
        free(e->tag);
        *e = (exit_record) {
                .pid = p->pid,
                .exit_code = code,
                .signal = sig,
                .core = core,
                .tag = p->tag ? strdup(p->tag) : NULL,
        };
}

/* A new process with a recycled pid must not answer for an old exit. */
static void exit_record_forget(pid_t pid) {
        for (size_t i = 0; i < INIT_MAX_EXIT_RECORDS; i++)
                if (exits[i].pid == pid) {
                        free(exits[i].tag);
                        exits[i] = (exit_record) { 0 };
                }
}

/* ------------------------------------------------------------- reaping */

static void put_exit_fields(initproto_writer *w, pid_t pid, int code, int sig, bool core) {
        initproto_put_u64(w, T_PID, (uint64_t) pid);
        initproto_put_u64(w, T_EXIT_CODE, (uint64_t) code);
        initproto_put_u64(w, T_SIGNAL, (uint64_t) sig);
        initproto_put_u64(w, T_CORE, core);
}

static uint64_t timeval_us(struct timeval tv) {
        return (uint64_t) tv.tv_sec * 1000000u + (uint64_t) tv.tv_usec;
}

static void keep_schedule(proc *p);
static uint64_t now_ms(void);

/* ru: wait4()'s account of the process, which includes the descendants it
 * waited for itself (orphans that init reaped are nobody's). */
static void proc_exited(proc *p, int status, const struct rusage *ru) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
        int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        bool core = WIFSIGNALED(status) && WCOREDUMP(status);

        log_debug("pid %d exited: code %d signal %d%s%s", (int) p->pid, code, sig,
                  p->request_id[0] ? ", spawned for request " : "", p->request_id);
        for (conn *c = all_conns, *next; c; c = next) {
                /* Sending may close c (and unlink it): step first. */
                next = c->next;
                if (!c->authed)
                        continue;
                if (!(c->subscriptions & INITPROTO_SUB_ALL_EXITS) && !proc_has_listener(p, c))
                        continue;
                initproto_writer *w = msg_begin(INITPROTO_EV_EXIT, 0, 0);
                put_exit_fields(w, p->pid, code, sig, core);
                initproto_put_u64(w, T_CPU_US, timeval_us(ru->ru_utime) + timeval_us(ru->ru_stime));
                initproto_put_str(w, T_TAG, p->tag);
                msg_send(c, NULL, 0);
        }
        /* Kept whether or not anybody received it: a client whose
         * connection dropped right after may still ask. */
        exit_record_add(p, code, sig, core);
        proc_unlink(p);
        if (p->keep)
                keep_schedule(p);
        else
                proc_free(p);
}

void proc_reap(void) {
        for (;;) {
                int status;
                struct rusage ru;
                pid_t pid = wait4(-1, &status, WNOHANG, &ru);
                if (pid < 0 && errno == EINTR)
                        continue;
                if (pid <= 0)
                        return;
                proc *p = proc_find(pid);
                if (p)
                        proc_exited(p, status, &ru);
                /* else: an orphan of the sandbox, reaped and forgotten */
        }
}

/* -------------------------------------------------------------- spawning */

/* What the child needs, all prepared by the parent: after fork() the child
 * only makes system calls, so every failure it can hit is reported as
 * (stage, errno) through a CLOEXEC pipe that exec closes on success. */
typedef struct spawn_plan {
        const char *const *argv;
        const char *const *envp;
        const char *cwd;
        uid_t uid;
        gid_t gid;
        int in_fd, out_fd, err_fd; /* become 0, 1, 2 */
        int pty_slave;             /* -1 without a pty */
} spawn_plan;

enum spawn_stage {
        STAGE_SESSION,
        STAGE_STDIO,
        STAGE_SETGROUPS,
        STAGE_SETGID,
        STAGE_SETUID,
        STAGE_CHDIR,
        STAGE_EXEC,
};

typedef struct spawn_failure {
        int stage;
        int err;
} spawn_failure;

static const char *spawn_env_get(const char *const *envp, const char *name) {
        size_t n = strlen(name);
        for (const char *const *e = envp; *e; e++)
                if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
                        return *e + n + 1;
        return NULL;
}

/* execvpe() with the PATH of the child's environment (musl's looks at
 * init's own). Returns -errno; the most telling one, as execvp does:
 * EACCES if some candidate was not executable, else ENOENT. */
static int exec_search(const char *const *argv, const char *const *envp) {
        const char *file = argv[0];
        char buf[INIT_PATH_BUF];
        bool seen_eacces = false;

        if (!*file)
                return -ENOENT;
        if (strchr(file, '/')) {
                execve(file, (char *const *) argv, (char *const *) envp);
                return -errno;
        }

        const char *path = spawn_env_get(envp, "PATH");
        if (!path)
                path = INIT_DEFAULT_PATH;
        for (const char *p = path;; p++) {
                const char *end = strchrnul(p, ':');
                size_t dlen = (size_t) (end - p);
                /* An empty element means the current directory. */
                int n = dlen == 0 ? snprintf(buf, sizeof buf, "%s", file)
                                  : snprintf(buf, sizeof buf, "%.*s/%s", (int) dlen, p, file);
                if (n > 0 && (size_t) n < sizeof buf) {
                        execve(buf, (char *const *) argv, (char *const *) envp);
                        switch (errno) {
                        case EACCES:
                                seen_eacces = true;
                                break;
                        case ENOENT:
                        case ENOTDIR:
                        case ELOOP:
                        case ENAMETOOLONG:
                                break;
                        default:
                                return -errno;
                        }
                }
                if (!*end)
                        break;
                p = end;
        }
        return seen_eacces ? -EACCES : -ENOENT;
}

static _noreturn_ void spawn_fail(int errfd, int stage, int err) {
        spawn_failure f = { .stage = stage, .err = err };
        (void) !write(errfd, &f, sizeof f);
        _exit(127);
}

/* The child's checklist, in order. */
static _noreturn_ void spawn_child(const spawn_plan *p, int errfd) {
        sigset_t none;
        int r;

        /* 1. Signals as a fresh process expects them: init blocks SIGCHLD
         *    and ignores SIGPIPE/SIGTERM/..., and ignored dispositions and
         *    the mask survive execve. */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* every signal, the realtime ones the C library keeps for itself
         * (32-34, which musl's signal() refuses) included: an ignored one
         * inherited from whoever started init would survive execve too */
        struct {
                void (*handler)(int);
                unsigned long flags;
                void (*restorer)(void);
                uint64_t mask;
        } dfl = { .handler = SIG_DFL };
        for (int sig = 1; sig < _NSIG; sig++)
                if (sig != SIGKILL && sig != SIGSTOP)
                        (void) syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);

        /* 2. Its own process group (so SIGNAL with T_GROUP reaches the
         *    whole job), or its own session with the pty as controlling
         *    terminal. */
        if (p->pty_slave >= 0) {
                if (setsid() < 0 || ioctl(p->pty_slave, TIOCSCTTY, 0) < 0)
                        spawn_fail(errfd, STAGE_SESSION, errno);
        } else if (setpgid(0, 0) < 0)
                spawn_fail(errfd, STAGE_SESSION, errno);

        /* 3. stdio. dup2() clears CLOEXEC on the copies. All sources are
         *    above 2 (init keeps 0-2 open on /dev/null). */
        if (dup2(p->in_fd, 0) < 0 || dup2(p->out_fd, 1) < 0 || dup2(p->err_fd, 2) < 0)
                spawn_fail(errfd, STAGE_STDIO, errno);

        /* 4. The user: groups first, while we still may. */
        if (setgroups(1, &p->gid) < 0)
                spawn_fail(errfd, STAGE_SETGROUPS, errno);
        if (setresgid(p->gid, p->gid, p->gid) < 0)
                spawn_fail(errfd, STAGE_SETGID, errno);
        if (setresuid(p->uid, p->uid, p->uid) < 0)
                spawn_fail(errfd, STAGE_SETUID, errno);

        /* 5. As the user, so a directory it cannot enter fails here. */
        if (chdir(p->cwd) < 0)
                spawn_fail(errfd, STAGE_CHDIR, errno);

        /* 6. No descriptor of init's may reach the program (they are all
         *    CLOEXEC, this is the belt to those braces): everything above 2
         *    but the error pipe. */
        if (errfd > 3)
                r = (int) syscall(SYS_close_range, 3U, (unsigned) errfd - 1, 0U);
        else
                r = 0;
        if (r >= 0)
                r = (int) syscall(SYS_close_range, (unsigned) errfd + 1, ~0U, 0U);
        if (r < 0) { /* close_range() refused (old kernel, seccomp) */
                long max = sysconf(_SC_OPEN_MAX);
                for (int fd = 3; fd < (max > 0 ? max : 65536); fd++)
                        if (fd != errfd)
                                close(fd);
        }

        /* 7. exec; only a failure comes back. */
        r = exec_search(p->argv, p->envp);
        spawn_fail(errfd, STAGE_EXEC, -r);
}

/* The parent's half of a spawn: 0 once the child exec'd (EOF on its error
 * pipe), else -1 with why in *ret, the child killed if it hung and reaped,
 * so that no EV_EXIT reports a process that, for the client, never started.
 * The child runs as the target user between fork and exec, so the sandbox
 * could SIGSTOP it there: the wait is bounded. */
static int spawn_wait_exec(pid_t pid, int errfd, spawn_failure *ret) {
        struct pollfd pe = { .fd = errfd, .events = POLLIN };
        ssize_t n;
        int pk;
        do
                pk = poll(&pe, 1, 10000);
        while (pk < 0 && errno == EINTR);
        if (pk == 0) {
                (void) kill(pid, SIGKILL);
                n = -1;
                *ret = (spawn_failure) { .stage = STAGE_EXEC, .err = ETIMEDOUT };
        } else
                do
                        n = read(errfd, ret, sizeof *ret);
                while (n < 0 && errno == EINTR);
        if (n == 0)
                return 0;
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        if (n != sizeof *ret && pk != 0)
                *ret = (spawn_failure) { .stage = STAGE_EXEC, .err = EIO };
        return -1;
}

static void close_fdv(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++)
                fds[i] = safe_close(fds[i]);
}

/* Descriptors for a SPAWN/ATTACH reply, in T_FD_LAYOUT order. */
static size_t proc_fds(const proc *p, int fds[static 3], unsigned *ret_layout) {
        if (p->master_fd >= 0) {
                fds[0] = p->master_fd;
                *ret_layout = INITPROTO_FDS_PTY;
                return 1;
        }
        size_t n = 0;
        if (p->stdin_fd >= 0)
                fds[n++] = p->stdin_fd;
        *ret_layout = n ? INITPROTO_FDS_PIPES_STDIN : INITPROTO_FDS_PIPES;
        /* After an exit these are closed; then nothing is sent at all. */
        if (p->stdout_fd >= 0 && p->stderr_fd >= 0) {
                fds[n++] = p->stdout_fd;
                fds[n++] = p->stderr_fd;
        }
        return n;
}

/* One string of argv or env in a listing: a staged command line's strings
 * may be longer than a field and more than a frame, so each is cut to
 * INITPROTO_MAX_STRING bytes and what does not fit is left out (a listing
 * describes the process; it never re-runs it). false: the frame is full. */
static bool put_listed_str(initproto_writer *w, uint16_t tag, const char *s) {
        size_t n = strnlen(s, INITPROTO_MAX_STRING);
        if (w->len + INITPROTO_FIELD_HEADER_SIZE + n > INITPROTO_MAX_FRAME)
                return false;
        initproto_put_bytes(w, tag, s, n);
        return true;
}

static void put_proc_fields(initproto_writer *w, const proc *p, bool with_env) {
        initproto_put_u64(w, T_PID, (uint64_t) p->pid);
        initproto_put_str(w, T_TAG, p->tag);
        initproto_put_str(w, T_CWD, p->cwd);
        if (p->request_id[0])
                initproto_put_str(w, T_REQUEST_ID, p->request_id);
        initproto_put_u64(w, T_UID, p->uid);
        initproto_put_u64(w, T_GID, p->gid);
        initproto_put_u64(w, T_PTY, p->pty);
        struct winsize ws;
        if (p->master_fd >= 0 && ioctl(p->master_fd, TIOCGWINSZ, &ws) == 0) {
                initproto_put_u64(w, T_PTY_ROWS, ws.ws_row);
                initproto_put_u64(w, T_PTY_COLS, ws.ws_col);
        }
        bool room = true;
        for (char **a = p->argv; room && a && *a; a++)
                room = put_listed_str(w, T_ARG, *a);
        if (with_env)
                for (char **e = p->envv; room && e && *e; e++)
                        room = put_listed_str(w, T_ENV, *e);
}

/* OK{T_PID, T_FD_LAYOUT, T_PTY, process fields} + the process's fds. */
static void reply_proc(conn *c, uint32_t id, const proc *p, bool details) {
        int fds[3];
        unsigned layout;
        size_t n = proc_fds(p, fds, &layout);

        initproto_writer *w = msg_begin(INITPROTO_OK, 0, id);
        initproto_put_u64(w, T_FD_LAYOUT, layout);
        if (details)
                put_proc_fields(w, p, true);
        else {
                initproto_put_u64(w, T_PID, (uint64_t) p->pid);
                initproto_put_u64(w, T_PTY, p->pty);
        }
        if (w->overflow) {
                /* The environment is what makes a frame big; drop it. */
                w = msg_begin(INITPROTO_OK, 0, id);
                initproto_put_u64(w, T_FD_LAYOUT, layout);
                put_proc_fields(w, p, false);
        }
        msg_send(c, fds, n);
}

static const char *stage_name(int stage) {
        switch (stage) {
        case STAGE_SESSION:
                return "setting up the session of";
        case STAGE_STDIO:
                return "setting up stdio of";
        case STAGE_SETGROUPS:
                return "setgroups for";
        case STAGE_SETGID:
                return "setresgid for";
        case STAGE_SETUID:
                return "setresuid for";
        default:
                return "exec";
        }
}

typedef struct spawn_io {
        int child[3];  /* the child's 0, 1, 2 */
        int parent[3]; /* stdin write end, stdout and stderr read ends */
        int master, slave;
} spawn_io;

static void spawn_io_done(spawn_io *io) {
        close_fdv(io->child, 3);
        close_fdv(io->parent, 3);
        io->master = safe_close(io->master);
        io->slave = safe_close(io->slave);
}

static int open_pty(spawn_io *io, uid_t uid, unsigned rows, unsigned cols) {
        char name[64];
        struct winsize ws = { .ws_row = (unsigned short) rows, .ws_col = (unsigned short) cols };

        io->master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (io->master < 0)
                return negative_errno();
        if (grantpt(io->master) < 0 || unlockpt(io->master) < 0)
                return negative_errno();
        int e = ptsname_r(io->master, name, sizeof name); /* returns the errno */
        if (e != 0)
                return -e;
        /* Opened here, not in the child, so a failure is a plain error reply. */
        io->slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (io->slave < 0)
                return negative_errno();
        /* The user owns its terminal (mesg, write, ssh-like tools check). */
        (void) fchown(io->slave, uid, (gid_t) -1);
        (void) fchmod(io->slave, 0620);
        if (ioctl(io->master, TIOCSWINSZ, &ws) < 0)
                return negative_errno();
        for (int i = 0; i < 3; i++)
                io->child[i] = io->slave;
        return 0;
}

static int open_pipes(spawn_io *io, bool stdin_pipe) {
        int p[2];

        if (stdin_pipe) {
                if (pipe2(p, O_CLOEXEC) < 0)
                        return negative_errno();
                io->child[0] = p[0];
                io->parent[0] = p[1];
        } else {
                io->child[0] = open("/dev/null", O_RDONLY | O_CLOEXEC | O_NOCTTY);
                if (io->child[0] < 0)
                        return negative_errno();
        }
        for (int i = 1; i <= 2; i++) {
                if (pipe2(p, O_CLOEXEC) < 0)
                        return negative_errno();
                io->parent[i] = p[0];
                io->child[i] = p[1];
        }
        return 0;
}

/* ------------------------------------------------ staged command lines */

/* A connection's staged argv and env (INITPROTO_SPAWN_PART): what one SPAWN
 * frame cannot carry, up to the kernel's own bounds. */
struct cmdline_stage {
        char *argv[INITPROTO_MAX_ARGS + 1];
        size_t argc;
        char *envv[INITPROTO_MAX_ARGS + 1];
        size_t envc;
        size_t len[2]; /* the last item's length, per list */
        size_t total;  /* bytes of every item with its NUL */
};

static void cmdline_stage_free(cmdline_stage *st) {
        if (!st)
                return;
        for (size_t i = 0; i < st->argc; i++)
                free(st->argv[i]);
        for (size_t i = 0; i < st->envc; i++)
                free(st->envv[i]);
        free(st);
}

static void cmdline_stage_freep(cmdline_stage **st) {
        cmdline_stage_free(*st);
}

void proc_stage_free(conn *c) {
        cmdline_stage_free(c->stage);
        c->stage = NULL;
}

/* One chunk: a new item (more=false) or the tail of the last one. */
static int stage_add(cmdline_stage *st, int list, bool more, const char *chunk, size_t n) {
        char **v = list ? st->envv : st->argv;
        size_t *count = list ? &st->envc : &st->argc;
        if (st->total + n + (more ? 0 : 1) > INITPROTO_STAGE_MAX_TOTAL)
                return -E2BIG;
        if (more) {
                if (*count == 0)
                        return -EBADMSG;
                size_t have = st->len[list];
                if (have + n > INITPROTO_STAGE_MAX_ITEM)
                        return -E2BIG;
                char *grown = realloc(v[*count - 1], have + n + 1);
                if (!grown)
                        return -ENOMEM;
                memcpy(grown + have, chunk, n);
                grown[have + n] = 0;
                v[*count - 1] = grown;
                st->len[list] = have + n;
        } else {
                if (*count >= INITPROTO_MAX_ARGS)
                        return -E2BIG;
                char *item = malloc(n + 1);
                if (!item)
                        return -ENOMEM;
                memcpy(item, chunk, n);
                item[n] = 0;
                v[(*count)++] = item;
                v[*count] = NULL;
                st->len[list] = n;
        }
        st->total += n + (more ? 0 : 1);
        return 0;
}

void proc_spawn_part(conn *c, const initproto_msg *m) {
        initproto_iter it;
        initproto_field f;
        char chunk[INITPROTO_MAX_STRING + 1];
        int k;
        initproto_iter_init(&it, m);
        while ((k = initproto_next(&it, &f)) > 0) {
                if (f.tag == T_FLAGS) {
                        uint64_t v;
                        if ((k = initproto_field_u64(&f, &v)) < 0)
                                break;
                        if (v == 1)
                                proc_stage_free(c);
                        continue;
                }
                bool more = f.tag == T_ARG_MORE || f.tag == T_ENV_MORE;
                int list = f.tag == T_ENV || f.tag == T_ENV_MORE;
                if (!more && f.tag != T_ARG && f.tag != T_ENV)
                        continue; /* unknown: skipped, as everywhere */
                if ((k = initproto_field_str(&f, chunk, sizeof chunk)) < 0)
                        break; /* a NUL inside, or too long */
                if (!c->stage && !(c->stage = calloc(1, sizeof *c->stage))) {
                        k = -ENOMEM;
                        break;
                }
                if ((k = stage_add(c->stage, list, more, chunk, f.len)) < 0)
                        break;
        }
        if (k < 0) {
                proc_stage_free(c);
                reply_error(c, m->id, k, "spawn: staging the command line");
                return;
        }
        reply_ok(c, m->id);
}

static void proc_spawn(conn *c, const req *r) {
        _cleanup_(proc_freep) proc *p = NULL;
        spawn_io io = { .child = { -1, -1, -1 }, .parent = { -1, -1, -1 }, .master = -1, .slave = -1 };
        _cleanup_close_pair_ int errpipe[2] = { -1, -1 };
        char name[256], home[INIT_PATH_BUF], env_home[INIT_PATH_BUF + 8], env_user[256 + 8],
                env_logname[256 + 8];
        /* staged: argv and env came ahead in SPAWN_PART frames; this SPAWN
         * uses them up whatever happens */
        _cleanup_(cmdline_stage_freep) cmdline_stage *stage = NULL;
        if (req_u64(r, T_STAGED, 0) == 1) {
                stage = TAKE_PTR(c->stage);
                if (!stage || stage->argc < 1 || r->argc || r->envc) {
                        reply_error(c, r->id, EBADMSG, "spawn: no staged command line");
                        return;
                }
        }
        const char *const *argv = stage ? (const char *const *) stage->argv
                                        : (const char *const *) r->argv;
        size_t argc = stage ? stage->argc : r->argc;
        const char *const *envp = stage ? (const char *const *) stage->envv
                                        : (const char *const *) r->envv;
        size_t n_env = stage ? stage->envc : r->envc;
        const char *tag = req_str(r, T_TAG);
        const char *rid = req_str(r, T_REQUEST_ID);
        uint64_t rows = req_u64(r, T_PTY_ROWS, 0), cols = req_u64(r, T_PTY_COLS, 0);
        uint64_t stdin_mode = req_u64(r, T_STDIN, 0);
        uid_t uid;
        gid_t gid;
        int k;

        if (argc < 1)
                goto einval_argv;
        if (tag && strlen(tag) > INIT_MAX_TAG) {
                reply_error(c, r->id, EINVAL, "spawn: tag longer than %d bytes", INIT_MAX_TAG);
                return;
        }
        if (stdin_mode > 1 || rows > UINT16_MAX || cols > UINT16_MAX) {
                reply_error(c, r->id, EINVAL, "spawn: bad stdin mode or pty size");
                return;
        }
        if (n_procs >= INIT_MAX_PROCS) {
                reply_error(c, r->id, EAGAIN, "spawn: %d processes running", INIT_MAX_PROCS);
                return;
        }
        k = req_user(r, &uid, &gid);
        if (k < 0) {
                reply_error(c, r->id, k, "spawn: uid/gid");
                return;
        }

        if (user_lookup(uid, name, sizeof name, home, sizeof home) <= 0) {
                /* Unknown to /etc/passwd: still runnable, like `setpriv`. */
                snprintf(name, sizeof name, "%u", (unsigned) uid);
                const char *h = "/";
                if (uid == 0)
                        h = "/root";
                else if (uid == INIT_DEFAULT_UID)
                        h = "/home/user";
                snprintf(home, sizeof home, "%s", h);
        }
        /* The environment when the client gives none. */
        const char *default_env[] = {
                "PATH=" INIT_DEFAULT_PATH, env_home,       env_user, env_logname,
                "SHELL=/bin/bash",         "LANG=C.UTF-8", NULL
        };
        if (n_env == 0) {
                snprintf(env_home, sizeof env_home, "HOME=%s", home);
                snprintf(env_user, sizeof env_user, "USER=%s", name);
                snprintf(env_logname, sizeof env_logname, "LOGNAME=%s", name);
                envp = default_env;
                n_env = ELEMENTSOF(default_env) - 1;
        }
        const char *cwd = req_str(r, T_CWD) ? req_str(r, T_CWD) : home;

        p = calloc(1, sizeof *p);
        if (!p)
                goto enomem;
        p->stdin_fd = p->stdout_fd = p->stderr_fd = p->master_fd = -1;
        p->uid = uid;
        p->gid = gid;
        p->pty = rows > 0;
        p->argv = strv_copy(argv, argc);
        p->envv = strv_copy(envp, n_env);
        p->cwd = strdup(cwd);
        p->tag = tag ? strdup(tag) : NULL;
        if (!p->argv || !p->envv || !p->cwd || (tag && !p->tag))
                goto enomem;
        if (request_id_valid(rid))
                strcpy(p->request_id, rid);
        p->keep = req_u64(r, T_KEEP, 0) == 1;

        k = p->pty ? open_pty(&io, uid, (unsigned) rows, (unsigned) (cols ? cols : 80))
                   : open_pipes(&io, stdin_mode == 1);
        if (k < 0) {
                reply_error(c, r->id, k, p->pty ? "spawn: allocating a pty" : "spawn: pipes");
                spawn_io_done(&io);
                return;
        }
        if (pipe2(errpipe, O_CLOEXEC) < 0) {
                k = negative_errno();
                spawn_io_done(&io);
                reply_error(c, r->id, k, "spawn: pipe");
                return;
        }

        spawn_plan plan = {
                .argv = (const char *const *) p->argv,
                .envp = (const char *const *) p->envv,
                .cwd = p->cwd,
                .uid = uid,
                .gid = gid,
                .in_fd = io.child[0],
                .out_fd = io.child[1],
                .err_fd = io.child[2],
                .pty_slave = io.slave,
        };
        pid_t pid = fork();
        if (pid < 0) {
                k = negative_errno();
                spawn_io_done(&io);
                reply_error(c, r->id, k, "spawn: fork");
                return;
        }
        if (pid == 0) {
                errpipe[0] = safe_close(errpipe[0]);
                spawn_child(&plan, errpipe[1]);
        }

        /* Parent. Only the child keeps its ends; EOF on the error pipe
         * then means the exec happened. */
        errpipe[1] = safe_close(errpipe[1]);
        close_fdv(io.child, 3);
        io.slave = safe_close(io.slave);

        spawn_failure f;
        if (spawn_wait_exec(pid, errpipe[0], &f) < 0) {
                spawn_io_done(&io);
                if (f.stage == STAGE_CHDIR)
                        reply_error(c, r->id, f.err, "chdir %s", p->cwd);
                else
                        reply_error(c, r->id, f.err, "%s %s", stage_name(f.stage), p->argv[0]);
                return;
        }

        p->pid = pid;
        p->serial = next_serial++;
        p->started_ms = now_ms();
        p->stdin_fd = TAKE_FD(io.parent[0]);
        p->stdout_fd = TAKE_FD(io.parent[1]);
        p->stderr_fd = TAKE_FD(io.parent[2]);
        p->master_fd = TAKE_FD(io.master);
        proc_add_listener(p, c);
        exit_record_forget(pid);
        log_debug("spawned pid %d: %s%s%s", (int) pid, p->argv[0], p->request_id[0] ? ", for request " : "",
                  p->request_id);

        proc *q = TAKE_PTR(p);
        *procs_tail = q;
        procs_tail = &q->next;
        n_procs++;
        reply_proc(c, r->id, q, false);
        return;

einval_argv:
        reply_error(c, r->id, EINVAL, "spawn: no argv");
        return;
enomem:
        reply_error(c, r->id, ENOMEM, "spawn");
}

/* ------------------------------------------------ T_KEEP: started again */

#define KEEP_WAIT_MIN_MS 200
#define KEEP_WAIT_MAX_MS 10000
#define KEEP_RAN_LONG_MS 10000

static uint64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static void keep_timer_dispatch(source *s, uint32_t events);
static void keep_timer_release(source *s) {
}
static source keep_timer = { .fd = -1, .dispatch = keep_timer_dispatch, .release = keep_timer_release };

/* The timer at the earliest due restart, or off. */
static void keep_arm(void) {
        uint64_t due = 0;
        for (proc *p = kept; p; p = p->next)
                if (!due || p->due_ms < due)
                        due = p->due_ms;
        if (keep_timer.fd < 0) {
                if (!due)
                        return;
                keep_timer.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
                if (keep_timer.fd < 0 || source_add(&keep_timer, EPOLLIN) < 0) {
                        log_debug("T_KEEP: no timer: %s", strerror(errno));
                        keep_timer.fd = safe_close(keep_timer.fd);
                        return;
                }
        }
        struct itimerspec its = { 0 };
        if (due) {
                uint64_t now = now_ms(), in = due > now ? due - now : 1;
                its.it_value.tv_sec = (time_t) (in / 1000);
                its.it_value.tv_nsec = (long) (in % 1000) * 1000000L;
        }
        (void) timerfd_settime(keep_timer.fd, 0, &its, NULL);
}

/* p ended (or could not start again): it waits in `kept`, its descriptors
 * closed, for 0.2 s after a long run, else twice its last wait (at most
 * 10 s), so that a program that dies at once costs a start every 10 s. */
static void keep_schedule(proc *p) {
        uint64_t now = now_ms();
        p->stdin_fd = safe_close(p->stdin_fd);
        p->stdout_fd = safe_close(p->stdout_fd);
        p->stderr_fd = safe_close(p->stderr_fd);
        p->master_fd = safe_close(p->master_fd);
        memset(p->listeners, 0, sizeof p->listeners);
        p->request_id[0] = 0;
        p->pid = 0;
        if (p->started_ms && now - p->started_ms >= KEEP_RAN_LONG_MS)
                p->keep_wait_ms = KEEP_WAIT_MIN_MS;
        else
                p->keep_wait_ms = p->keep_wait_ms ? p->keep_wait_ms * 2 : KEEP_WAIT_MIN_MS;
        if (p->keep_wait_ms > KEEP_WAIT_MAX_MS)
                p->keep_wait_ms = KEEP_WAIT_MAX_MS;
        p->started_ms = 0;
        p->due_ms = now + p->keep_wait_ms;
        p->next = kept;
        kept = p;
        keep_arm();
}

/* Spawn p again as it was spawned, stdio on /dev/null; 0 or -errno. */
static int keep_respawn(proc *p) {
        if (n_procs >= INIT_MAX_PROCS)
                return -EAGAIN;
        _cleanup_close_ int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
        _cleanup_close_pair_ int errpipe[2] = { -1, -1 };
        if (nul < 0 || pipe2(errpipe, O_CLOEXEC) < 0)
                return negative_errno();
        spawn_plan plan = {
                .argv = (const char *const *) p->argv,
                .envp = (const char *const *) p->envv,
                .cwd = p->cwd,
                .uid = p->uid,
                .gid = p->gid,
                .in_fd = nul,
                .out_fd = nul,
                .err_fd = nul,
                .pty_slave = -1,
        };
        pid_t pid = fork();
        if (pid < 0)
                return negative_errno();
        if (pid == 0) {
                errpipe[0] = safe_close(errpipe[0]);
                spawn_child(&plan, errpipe[1]);
        }
        errpipe[1] = safe_close(errpipe[1]);
        spawn_failure f;
        if (spawn_wait_exec(pid, errpipe[0], &f) < 0) {
                log_debug("T_KEEP: %s %s: %s", stage_name(f.stage), p->argv[0], strerror(f.err));
                return -f.err;
        }
        p->pid = pid;
        p->serial = next_serial++;
        p->started_ms = now_ms();
        p->next = NULL;
        exit_record_forget(pid);
        *procs_tail = p;
        procs_tail = &p->next;
        n_procs++;
        log_debug("T_KEEP: started %s again as pid %d", p->argv[0], (int) pid);
        return 0;
}

static void keep_timer_dispatch(source *s, uint32_t events) {
        uint64_t ticks;
        while (read(s->fd, &ticks, sizeof ticks) > 0)
                ;
        uint64_t now = now_ms();
        proc *due = NULL;
        for (proc **pp = &kept; *pp;) {
                proc *p = *pp;
                if (p->due_ms <= now) {
                        *pp = p->next;
                        p->next = due;
                        due = p;
                } else
                        pp = &p->next;
        }
        while (due) {
                proc *p = due;
                due = p->next;
                if (keep_respawn(p) < 0)
                        keep_schedule(p);
        }
        keep_arm();
}

/* ---------------------------------------------------- other requests */

static proc *proc_lookup(conn *c, const req *r) {
        if (!req_has(r, T_PID)) {
                reply_error(c, r->id, EINVAL, "%s: no pid", initproto_type_name(r->type));
                return NULL;
        }
        uint64_t pid = req_u64(r, T_PID, 0);
        proc *p = pid > 0 && pid <= INT32_MAX ? proc_find((pid_t) pid) : NULL;
        if (!p)
                reply_error(c, r->id, ESRCH, "%s %llu", initproto_type_name(r->type),
                            (unsigned long long) pid);
        return p;
}

static void proc_signal(conn *c, const req *r) {
        proc *p = proc_lookup(c, r);
        if (!p)
                return;
        uint64_t sig = req_u64(r, T_SIGNAL, SIGKILL);
        if (sig >= _NSIG) {
                reply_error(c, r->id, EINVAL, "signal %llu", (unsigned long long) sig);
                return;
        }
        /* The process leads its own group (setpgid/setsid before exec, and
         * we replied only after exec), so -pid is exactly its job. */
        pid_t target = req_u64(r, T_GROUP, 0) ? -p->pid : p->pid;
        if (kill(target, (int) sig) < 0) {
                reply_error(c, r->id, errno, "kill %d", (int) target);
                return;
        }
        reply_ok(c, r->id);
}

static void proc_resize(conn *c, const req *r) {
        proc *p = proc_lookup(c, r);
        if (!p)
                return;
        uint64_t rows = req_u64(r, T_PTY_ROWS, 0), cols = req_u64(r, T_PTY_COLS, 0);
        if (p->master_fd < 0) {
                reply_error(c, r->id, ENOTTY, "resize %d", (int) p->pid);
                return;
        }
        if (rows == 0 || cols == 0 || rows > UINT16_MAX || cols > UINT16_MAX) {
                reply_error(c, r->id, EINVAL, "resize %d", (int) p->pid);
                return;
        }
        struct winsize ws = { .ws_row = (unsigned short) rows, .ws_col = (unsigned short) cols };
        if (ioctl(p->master_fd, TIOCSWINSZ, &ws) < 0) {
                reply_error(c, r->id, errno, "resize %d", (int) p->pid);
                return;
        }
        reply_ok(c, r->id);
}

static void proc_close_stdin(conn *c, const req *r) {
        proc *p = proc_lookup(c, r);
        if (!p)
                return;
        /* Clients close their copy; ours is the last one keeping the pipe
         * open. Without a stdin pipe this is a no-op. */
        p->stdin_fd = safe_close(p->stdin_fd);
        reply_ok(c, r->id);
}

static void proc_attach(conn *c, const req *r) {
        const char *tag = req_str(r, T_TAG);
        uint64_t pid = req_u64(r, T_PID, 0);

        if (!tag && !req_has(r, T_PID)) {
                reply_error(c, r->id, EINVAL, "attach: no pid or tag");
                return;
        }
        if (pid > INT32_MAX) {
                reply_error(c, r->id, ESRCH, "attach %llu", (unsigned long long) pid);
                return;
        }
        proc *p = tag ? proc_find_tag(tag) : proc_find((pid_t) pid);
        if (p) {
                proc_add_listener(p, c);
                reply_proc(c, r->id, p, true);
                return;
        }
        exit_record *e = exit_find((pid_t) pid, tag);
        if (!e) {
                if (tag)
                        reply_error(c, r->id, ESRCH, "attach %s", tag);
                else
                        reply_error(c, r->id, ESRCH, "attach %llu", (unsigned long long) pid);
                return;
        }
        initproto_writer *w = msg_begin(INITPROTO_OK, 0, r->id);
        put_exit_fields(w, e->pid, e->exit_code, e->signal, e->core);
        initproto_put_str(w, T_TAG, e->tag);
        msg_send(c, NULL, 0);
}

/* LIST_PROCS as a job: a few processes per step, resuming by spawn serial
 * (the list is in spawn order) so that exits in between are harmless. */
typedef struct list_procs_job {
        job job;
        uint32_t id;
        uint64_t after;
} list_procs_job;

static int list_procs_step(conn *c, job *j) {
        list_procs_job *l = (list_procs_job *) j;
        unsigned sent = 0;

        for (proc *p = procs; p; p = p->next) {
                if (p->serial <= l->after)
                        continue;
                if (sent++ == 16)
                        return 1;
                l->after = p->serial;
                initproto_writer *w = msg_begin(INITPROTO_OK, INITPROTO_F_MORE, l->id);
                put_proc_fields(w, p, true);
                if (w->overflow) {
                        w = msg_begin(INITPROTO_OK, INITPROTO_F_MORE, l->id);
                        put_proc_fields(w, p, false);
                }
                if (msg_send(c, NULL, 0) < 0)
                        return 0;
        }
        reply_ok(c, l->id);
        return 0;
}

static void list_procs_free(job *j) {
        free(j);
}

static void proc_list(conn *c, const req *r) {
        list_procs_job *l = calloc(1, sizeof *l);
        if (!l) {
                reply_error(c, r->id, ENOMEM, "list");
                return;
        }
        l->job = (job) { .step = list_procs_step, .free = list_procs_free };
        l->id = r->id;
        conn_start_job(c, &l->job);
}

void proc_handle(conn *c, const req *r) {
        switch (r->type) {
        case INITPROTO_SPAWN:
                proc_spawn(c, r);
                break;
        case INITPROTO_SIGNAL:
                proc_signal(c, r);
                break;
        case INITPROTO_RESIZE:
                proc_resize(c, r);
                break;
        case INITPROTO_CLOSE_STDIN:
                proc_close_stdin(c, r);
                break;
        case INITPROTO_ATTACH:
                proc_attach(c, r);
                break;
        case INITPROTO_LIST_PROCS:
                proc_list(c, r);
                break;
        }
}
