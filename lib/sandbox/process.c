/* SPDX-License-Identifier: Apache-2.0 */
/* Processes inside a sandbox, through hutch-init. */
#include <fcntl.h>
#include <string.h>
#include <time.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/clock.h"
#include "util/parse.h"

#define CALL_TIMEOUT_MS 30000

#define LIST_PROCS_MAX 4096
#define LIST_PROCS_MAX_BYTES (64u << 20)

typedef struct spawn_reply {
        hutch_process *proc;
        bool pty;
        bool any_layout; /* ATTACH: pipes or pty, whichever the process has */
        pid_t want_pid;  /* ATTACH by pid: the reply must be about it */
        const char *want_tag;
        bool exited;     /* ATTACH: init only knows the process's exit */
} spawn_reply;

static int on_spawn_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        spawn_reply *sr = userdata;
        uint64_t pid = 0, layout = 0;
        if (initproto_find_u64(m, T_PID, &pid) <= 0 || pid < 2 || pid > INT32_MAX)
                return -EBADMSG;
        if (sr->want_pid > 0 && (pid_t) pid != sr->want_pid)
                return -EBADMSG;
        if (sr->want_tag) {
                char tag[INITPROTO_MAX_STRING + 1];
                if (initproto_find_str(m, T_TAG, tag, sizeof tag) <= 0 || strcmp(tag, sr->want_tag) != 0)
                        return -EBADMSG;
        }
        int r = initproto_find_u64(m, T_FD_LAYOUT, &layout);
        if (r == 0 && sr->any_layout && nfds == 0) {
                /* an exit record: the process is gone */
                sr->exited = true;
                return 0;
        }
        if (r <= 0)
                return -EBADMSG;
        size_t want = layout == INITPROTO_FDS_PIPES_STDIN ? 3 : layout == INITPROTO_FDS_PIPES ? 2 : layout == INITPROTO_FDS_PTY ? 1 : 0;
        if (want == 0 || nfds != want || (!sr->any_layout && (layout == INITPROTO_FDS_PTY) != sr->pty))
                return -EBADMSG;
        for (size_t i = 0; i < nfds; i++) {
                r = initconn_check_fd(fds[i], layout == INITPROTO_FDS_PTY ? INITCONN_FD_PTY : INITCONN_FD_FIFO);
                if (r < 0)
                        return r;
        }
        hutch_process *p = sr->proc;
        p->pid = (pid_t) pid;
        p->stdin_fd = p->stdout_fd = p->stderr_fd = -1;
        if (layout == INITPROTO_FDS_PTY) {
                p->stdout_fd = fds[0];
                fds[0] = -1;
        } else {
                size_t k = 0;
                if (layout == INITPROTO_FDS_PIPES_STDIN) {
                        p->stdin_fd = fds[k];
                        fds[k++] = -1;
                }
                p->stdout_fd = fds[k];
                fds[k++] = -1;
                p->stderr_fd = fds[k];
                fds[k] = -1;
        }
        return 0;
}

/* the protocol's stage holds what the public API promises */
_Static_assert(HUTCH_SPAWN_STRING_MAX == INITPROTO_STAGE_MAX_ITEM && HUTCH_SPAWN_TOTAL_MAX == INITPROTO_STAGE_MAX_TOTAL,
               "hutch.h's spawn bounds and initproto.h's stage bounds differ");

/* Does argv + env fit one SPAWN frame (every string within the decoder's
 * bound, and the whole within a payload, with room for the other fields)? */
static bool spawn_fits_one_frame(const hutch_spawn_config *cfg) {
        size_t bytes = 1024; /* cwd, tag, ids, pty: bounded elsewhere */
        size_t n = 0;
        for (int list = 0; list < 2; list++)
                for (const char *const *s = list ? cfg->envp : cfg->argv; s && *s; s++) {
                        size_t len = strlen(*s);
                        if (len > INITPROTO_MAX_STRING || ++n > INITPROTO_MAX_ARGS)
                                return false;
                        bytes += INITPROTO_FIELD_HEADER_SIZE + len;
                }
        return bytes + (cfg->cwd ? strlen(cfg->cwd) : 0) + (cfg->tag ? strlen(cfg->tag) : 0) <=
               INITPROTO_MAX_PAYLOAD;
}

/* argv and env ahead of the SPAWN, in SPAWN_PART frames of chunks (see
 * initproto.h), each answered before the next goes. */
static int spawn_stage(hutch_sandbox *sb, const hutch_spawn_config *cfg, hutch_error *err) {
        size_t total = 0, n_args = 0, n_env = 0;
        for (int list = 0; list < 2; list++)
                for (const char *const *s = list ? cfg->envp : cfg->argv; s && *s; s++) {
                        size_t len = strlen(*s), i = (size_t) (s - (list ? cfg->envp : cfg->argv));
                        if (len > HUTCH_SPAWN_STRING_MAX)
                                return hutch_error_set(err, -E2BIG,
                                                       "%s %zu is %zu bytes: the kernel takes at most %d bytes in one "
                                                       "argument or environment string",
                                                       list ? "environment variable" : "argument", i, len,
                                                       HUTCH_SPAWN_STRING_MAX);
                        total += len + 1;
                        if (++*(list ? &n_env : &n_args) > INITPROTO_MAX_ARGS)
                                return hutch_error_set(err, -E2BIG, "more than %d %s", INITPROTO_MAX_ARGS,
                                                       list ? "environment variables" : "arguments");
                }
        if (total > HUTCH_SPAWN_TOTAL_MAX)
                return hutch_error_set(err, -E2BIG,
                                       "the command line and environment are %zu bytes: at most %d (the kernel's "
                                       "ARG_MAX with an 8 MiB stack)",
                                       total, HUTCH_SPAWN_TOTAL_MAX);
        initproto_writer *w = NULL;
        bool first = true;
        int r;
        for (int list = 0; list < 2; list++)
                for (const char *const *s = list ? cfg->envp : cfg->argv; s && *s; s++) {
                        size_t len = strlen(*s), off = 0;
                        do {
                                size_t chunk = MIN(len - off, (size_t) INITPROTO_MAX_STRING);
                                if (w && w->len + INITPROTO_FIELD_HEADER_SIZE + chunk > INITPROTO_MAX_FRAME) {
                                        if ((r = initconn_call(sb, NULL, 0, NULL, NULL, CALL_TIMEOUT_MS, err)) < 0)
                                                return r;
                                        w = NULL;
                                }
                                if (!w) {
                                        w = initconn_begin(sb, INITPROTO_SPAWN_PART);
                                        initproto_put_u64(w, T_FLAGS, first ? 1 : 0);
                                        first = false;
                                }
                                uint16_t tag = off ? (list ? T_ENV_MORE : T_ARG_MORE) : (list ? T_ENV : T_ARG);
                                initproto_put_bytes(w, tag, *s + off, chunk);
                                off += chunk;
                        } while (off < len);
                }
        return w ? initconn_call(sb, NULL, 0, NULL, NULL, CALL_TIMEOUT_MS, err) : 0;
}

static void strv_freep(char ***v) {
        for (char **p = *v; p && *p; p++)
                free(*p);
        free(*v);
}

int hutch_sandbox_spawn(hutch_sandbox *sb, const hutch_spawn_config *cfg, hutch_process *ret, hutch_error *err) {
        if (!cfg || !cfg->argv || !cfg->argv[0] || !cfg->argv[0][0])
                return hutch_error_set(err, -EINVAL, "no command given");
        /* a sandbox with GPUs: the driver's libraries and programs on the
         * loader's and the shell's paths (docs/gpu.md); an environment
         * left to init's default stays so */
        _cleanup_(strv_freep) char **genv = NULL;
        hutch_spawn_config gcfg;
        if (sb->n_gpus && cfg->envp) {
                if (!(genv = gpu_env(cfg->envp)))
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                gcfg = *cfg;
                gcfg.envp = (const char *const *) genv;
                cfg = &gcfg;
        }
        bool staged = !spawn_fits_one_frame(cfg);
        if (staged) {
                int r = spawn_stage(sb, cfg, err);
                if (r < 0)
                        return r;
        }
        initproto_writer *w = initconn_begin(sb, INITPROTO_SPAWN);
        if (staged)
                initproto_put_u64(w, T_STAGED, 1);
        else {
                for (const char *const *a = cfg->argv; *a; a++)
                        initproto_put_str(w, T_ARG, *a);
                if (cfg->envp)
                        for (const char *const *e = cfg->envp; *e; e++)
                                initproto_put_str(w, T_ENV, *e);
        }
        initproto_put_str(w, T_CWD, cfg->cwd);
        initproto_put_u64(w, T_UID, cfg->uid);
        initproto_put_u64(w, T_GID, cfg->gid);
        initproto_put_u64(w, T_STDIN, cfg->stdin_mode == HUTCH_STDIN_PIPE ? 1 : 0);
        if (cfg->pty) {
                initproto_put_u64(w, T_PTY_ROWS, cfg->pty_rows ? cfg->pty_rows : 24);
                initproto_put_u64(w, T_PTY_COLS, cfg->pty_cols ? cfg->pty_cols : 80);
        }
        initproto_put_str(w, T_TAG, cfg->tag);
        if (request_id_valid(cfg->request_id))
                initproto_put_str(w, T_REQUEST_ID, cfg->request_id);
        if (cfg->keep)
                initproto_put_u64(w, T_KEEP, 1);
        if (w->overflow)
                return hutch_error_set(err, -E2BIG, "command line and environment are too large");

        hutch_process p = { .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1 };
        spawn_reply sr = { .proc = &p, .pty = cfg->pty };
        int r = initconn_call(sb, NULL, 0, on_spawn_reply, &sr, CALL_TIMEOUT_MS, err);
        if (r < 0)
                return r;
        *ret = p;
        return 0;
}

int hutch_sandbox_signal(hutch_sandbox *sb, pid_t pid, int sig, bool process_group, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_SIGNAL);
        initproto_put_u64(w, T_PID, (uint64_t) pid);
        initproto_put_u64(w, T_SIGNAL, (uint64_t) sig);
        initproto_put_u64(w, T_GROUP, process_group ? 1 : 0);
        return initconn_call(sb, NULL, 0, NULL, NULL, CALL_TIMEOUT_MS, err);
}

int hutch_sandbox_resize(hutch_sandbox *sb, pid_t pid, uint16_t rows, uint16_t cols, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_RESIZE);
        initproto_put_u64(w, T_PID, (uint64_t) pid);
        initproto_put_u64(w, T_PTY_ROWS, rows);
        initproto_put_u64(w, T_PTY_COLS, cols);
        return initconn_call(sb, NULL, 0, NULL, NULL, CALL_TIMEOUT_MS, err);
}

int hutch_sandbox_close_stdin(hutch_sandbox *sb, pid_t pid, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_CLOSE_STDIN);
        initproto_put_u64(w, T_PID, (uint64_t) pid);
        return initconn_call(sb, NULL, 0, NULL, NULL, CALL_TIMEOUT_MS, err);
}

int hutch_sandbox_tie_lifetime(hutch_sandbox *sb, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_SUBSCRIBE);
        initproto_put_u64(w, T_FLAGS, INITPROTO_SUB_EXIT_WITH_CONN);
        return initconn_call(sb, NULL, 0, NULL, NULL, CALL_TIMEOUT_MS, err);
}


int hutch_sandbox_attach_process(hutch_sandbox *sb, pid_t pid, const char *tag, hutch_process *ret,
                                 hutch_error *err) {
        if (tag && (!tag[0] || strlen(tag) > INITPROTO_MAX_STRING))
                return hutch_error_set(err, -EINVAL, "bad process tag");
        if (!tag && pid <= 0)
                return hutch_error_set(err, -ESRCH, "no process %d", (int) pid);
        initproto_writer *w = initconn_begin(sb, INITPROTO_ATTACH);
        if (tag)
                initproto_put_str(w, T_TAG, tag);
        else
                initproto_put_u64(w, T_PID, (uint64_t) pid);

        hutch_process p = { .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1 };
        spawn_reply sr = { .proc = &p, .any_layout = true, .want_pid = tag ? 0 : pid, .want_tag = tag };
        int r = initconn_call(sb, NULL, 0, on_spawn_reply, &sr, CALL_TIMEOUT_MS, err);
        if (r < 0)
                return r;
        if (sr.exited) {
                if (tag)
                        return hutch_error_set(err, -ESRCH, "process '%s' has exited", tag);
                return hutch_error_set(err, -ESRCH, "process %d has exited", (int) pid);
        }
        *ret = p;
        return 0;
}

void hutch_proc_info_array_free(hutch_proc_info *v, size_t n) {
        if (!v)
                return;
        for (size_t i = 0; i < n; i++) {
                free(v[i].tag);
                free(v[i].cwd);
                free(v[i].request_id);
                hutch_strv_free(v[i].argv);
                hutch_strv_free(v[i].envp);
        }
        free(v);
}

static int dup_str(const initproto_field *f, char **ret) {
        char buf[INITPROTO_MAX_STRING + 1];
        if (initproto_field_str(f, buf, sizeof buf) < 0)
                return -EBADMSG;
        char *c = strdup(buf);
        if (!c)
                return -ENOMEM;
        free(*ret);
        *ret = c;
        return 0;
}

/* Append a string field to a NULL-terminated vector of *n entries. */
static int strv_push(char ***v, size_t *n, const initproto_field *f) {
        if (*n >= INITPROTO_MAX_ARGS)
                return -EBADMSG;
        char **nv = realloc(*v, (*n + 2) * sizeof(char *));
        if (!nv)
                return -ENOMEM;
        *v = nv;
        nv[*n] = nv[*n + 1] = NULL;
        int r = dup_str(f, &nv[*n]);
        if (r < 0)
                return r;
        (*n)++;
        return 0;
}

static int proc_info_from_msg(const initproto_msg *m, hutch_proc_info *pi) {
        initproto_iter it;
        initproto_field f;
        size_t argc = 0, envc = 0;
        bool seen_pid = false, seen_tag = false, seen_cwd = false;
        uint64_t v;
        int r;

        initproto_iter_init(&it, m);
        while ((r = initproto_next(&it, &f)) > 0) {
                switch (f.tag) {
                case T_PID:
                        if (seen_pid || initproto_field_u64(&f, &v) < 0 || v < 2 || v > INT32_MAX)
                                return -EBADMSG;
                        pi->pid = (pid_t) v;
                        seen_pid = true;
                        break;
                case T_TAG:
                case T_CWD: {
                        bool *seen = f.tag == T_TAG ? &seen_tag : &seen_cwd;
                        if (*seen)
                                break; /* first occurrence wins, as in initproto_find */
                        *seen = true;
                        r = dup_str(&f, f.tag == T_TAG ? &pi->tag : &pi->cwd);
                        if (r < 0)
                                return r;
                        break;
                }
                case T_ARG:
                case T_ENV:
                        r = f.tag == T_ARG ? strv_push(&pi->argv, &argc, &f) : strv_push(&pi->envp, &envc, &f);
                        if (r < 0)
                                return r;
                        break;
                case T_PTY:
                        if (initproto_field_u64(&f, &v) < 0)
                                return -EBADMSG;
                        pi->pty = v != 0;
                        break;
                case T_REQUEST_ID: {
                        /* what init says: kept only when it is a well-formed id */
                        char buf[REQUEST_ID_MAX + 1];
                        if (pi->request_id || initproto_field_str(&f, buf, sizeof buf) < 0 ||
                            !request_id_valid(buf))
                                break;
                        pi->request_id = strdup(buf);
                        if (!pi->request_id)
                                return -ENOMEM;
                        break;
                }
                case T_UID:
                case T_GID:
                        if (initproto_field_u64(&f, &v) < 0 || v > UINT32_MAX)
                                return -EBADMSG;
                        if (f.tag == T_UID)
                                pi->uid = (uid_t) v;
                        else
                                pi->gid = (gid_t) v;
                        break;
                }
        }
        if (r < 0 || !seen_pid || argc == 0)
                return -EBADMSG;
        if (!pi->envp) {
                pi->envp = calloc(1, sizeof(char *));
                if (!pi->envp)
                        return -ENOMEM;
        }
        return 0;
}

typedef struct list_procs_state {
        hutch_proc_info *v;
        size_t n, cap;
        size_t bytes;
} list_procs_state;

static int on_list_procs_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        list_procs_state *ls = userdata;
        if (m->payload_len == 0)
                return 0; /* the final, empty OK */
        if (ls->n >= LIST_PROCS_MAX)
                return -E2BIG;
        ls->bytes += m->payload_len + sizeof(hutch_proc_info);
        if (ls->bytes > LIST_PROCS_MAX_BYTES)
                return -E2BIG;
        if (ls->n == ls->cap) {
                size_t nc = ls->cap ? ls->cap * 2 : 16;
                hutch_proc_info *nv = realloc(ls->v, nc * sizeof *nv);
                if (!nv)
                        return -ENOMEM;
                ls->v = nv;
                ls->cap = nc;
        }
        hutch_proc_info *pi = &ls->v[ls->n];
        *pi = (hutch_proc_info){ 0 };
        /* counted before parsing, so that a half-parsed entry is freed too */
        ls->n++;
        return proc_info_from_msg(m, pi);
}

int hutch_sandbox_list_procs(hutch_sandbox *sb, hutch_proc_info **ret, size_t *ret_n, hutch_error *err) {
        (void) initconn_begin(sb, INITPROTO_LIST_PROCS);
        list_procs_state ls = { 0 };
        int r = initconn_call(sb, NULL, 0, on_list_procs_reply, &ls, CALL_TIMEOUT_MS, err);
        if (r < 0) {
                hutch_proc_info_array_free(ls.v, ls.n);
                return r;
        }
        *ret = ls.v;
        *ret_n = ls.n;
        return 0;
}

int hutch_sandbox_wait(hutch_sandbox *sb, int timeout_ms, hutch_exit *ret, hutch_error *err) {
        int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
        for (;;) {
                initconn_event *ev;
                /* exits only: watch events on the way are discarded */
                while ((ev = initconn_event_pop(sb))) {
                        bool is_exit = ev->type == INITPROTO_EV_EXIT;
                        if (is_exit)
                                *ret = ev->exit;
                        initconn_event_free(ev);
                        if (is_exit)
                                return 0;
                }
                int64_t now = now_ms();
                int wait = deadline < 0 ? -1 : deadline > now ? (int) (deadline - now) : 0;
                int r = initconn_pump(sb, wait, err);
                if (r < 0)
                        return r;
                /* r == 1 but nothing queued: a frame that was not an exit
                 * (a watch event, a late reply); only the deadline ends the wait. */
                if (!sb->events_head && deadline >= 0 && now_ms() >= deadline)
                        return hutch_error_set(err, -ETIMEDOUT, "no process exited in time");
        }
}
