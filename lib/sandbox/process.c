/* SPDX-License-Identifier: Apache-2.0 */
/* Processes inside a sandbox, through hutch-init. */
#include <fcntl.h>
#include <string.h>
#include <time.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/clock.h"

#define CALL_TIMEOUT_MS 30000

typedef struct spawn_reply {
        hutch_process *proc;
        bool pty;
} spawn_reply;

static int on_spawn_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        spawn_reply *sr = userdata;
        uint64_t pid = 0, layout = 0;
        if (initproto_find_u64(m, T_PID, &pid) <= 0 || pid < 2 || pid > INT32_MAX)
                return -EBADMSG;
        if (initproto_find_u64(m, T_FD_LAYOUT, &layout) <= 0)
                return -EBADMSG;
        size_t want = layout == INITPROTO_FDS_PIPES_STDIN ? 3 : layout == INITPROTO_FDS_PIPES ? 2 : layout == INITPROTO_FDS_PTY ? 1 : 0;
        if (want == 0 || nfds != want || (layout == INITPROTO_FDS_PTY) != sr->pty)
                return -EBADMSG;
        for (size_t i = 0; i < nfds; i++) {
                int r = initconn_check_fd(fds[i], layout == INITPROTO_FDS_PTY ? INITCONN_FD_PTY : INITCONN_FD_FIFO);
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

int hutch_sandbox_spawn(hutch_sandbox *sb, const hutch_spawn_config *cfg, hutch_process *ret, hutch_error *err) {
        if (!cfg || !cfg->argv || !cfg->argv[0] || !cfg->argv[0][0])
                return hutch_error_set(err, -EINVAL, "no command given");
        initproto_writer *w = initconn_begin(sb, INITPROTO_SPAWN);
        for (const char *const *a = cfg->argv; *a; a++)
                initproto_put_str(w, T_ARG, *a);
        if (cfg->envp)
                for (const char *const *e = cfg->envp; *e; e++)
                        initproto_put_str(w, T_ENV, *e);
        initproto_put_str(w, T_CWD, cfg->cwd);
        initproto_put_u64(w, T_UID, cfg->uid);
        initproto_put_u64(w, T_GID, cfg->gid);
        initproto_put_u64(w, T_STDIN, cfg->stdin_mode == HUTCH_STDIN_PIPE ? 1 : 0);
        if (cfg->pty) {
                initproto_put_u64(w, T_PTY_ROWS, cfg->pty_rows ? cfg->pty_rows : 24);
                initproto_put_u64(w, T_PTY_COLS, cfg->pty_cols ? cfg->pty_cols : 80);
        }
        initproto_put_str(w, T_TAG, cfg->tag);
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


int hutch_sandbox_wait(hutch_sandbox *sb, int timeout_ms, hutch_exit *ret, hutch_error *err) {
        int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
        for (;;) {
                initconn_event *ev = sb->events_head;
                if (ev) {
                        sb->events_head = ev->next;
                        if (!sb->events_head)
                                sb->events_tail = NULL;
                        sb->n_events--;
                        *ret = ev->exit;
                        free(ev);
                        return 0;
                }
                int64_t now = now_ms();
                int wait = deadline < 0 ? -1 : deadline > now ? (int) (deadline - now) : 0;
                int r = initconn_pump(sb, wait, err);
                if (r < 0)
                        return r;
                /* r == 0: a timeout or a frame that was not an exit (a watch
                 * event, a late reply): only the deadline ends the wait. */
                if (r == 0 && !sb->events_head && deadline >= 0 && now_ms() >= deadline)
                        return hutch_error_set(err, -ETIMEDOUT, "no process exited in time");
        }
}
