/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host side of the init protocol: requests with ids, replies matched by
 * id, events queued for hutch_sandbox_wait(). hutch-init lives inside the
 * sandbox, so everything it sends is hostile input (docs/design.md §4): frames
 * are parsed by the bounded codec, and descriptors are fstat-checked.
 */
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <time.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/clock.h"
#include "util/fdutil.h"


int initconn_check_fd(int fd, int want) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        bool ok = false;
        if (want & INITCONN_FD_FIFO)
                ok = ok || S_ISFIFO(st.st_mode);
        /* a pty master from the sandbox's devpts instance: /dev/ptmx is 5:2 */
        if (want & INITCONN_FD_PTY)
                ok = ok || (S_ISCHR(st.st_mode) && major(st.st_rdev) == 5 && minor(st.st_rdev) == 2);
        if ((want & INITCONN_FD_FILE) && S_ISREG(st.st_mode)) {
                /* a file of the sandbox's own tree, never procfs/sysfs: their
                 * handlers check the credentials of whoever reads or writes
                 * (us), not of whoever opened (CVE-class: oom_score_adj) */
                struct statfs sfs;
                ok = fstatfs(fd, &sfs) == 0 && sfs.f_type != PROC_SUPER_MAGIC &&
                        sfs.f_type != SYSFS_MAGIC && sfs.f_type != CGROUP_SUPER_MAGIC &&
                        sfs.f_type != CGROUP2_SUPER_MAGIC;
        }
        if (!ok)
                return -EBADMSG;
        /* never block on something the sandbox controls */
        return fd_set_nonblock(fd, true);
}

initproto_writer *initconn_begin(hutch_sandbox *sb, uint16_t type) {
        uint32_t id = sb->next_id++;
        if (sb->next_id == 0)
                sb->next_id = 1;
        initproto_begin(sb->tx, type, 0, id);
        return sb->tx;
}

/* Every exit is kept: there cannot be more than processes, so this many
 * queued means a broken init. Watch events are a flood the sandbox
 * controls: beyond their bound they are dropped, and counted. */
#define MAX_QUEUED_EXITS 4096
#define MAX_QUEUED_WATCH_EVENTS 4096

_Static_assert((int) INITPROTO_WEV_CREATE == HUTCH_WATCH_CREATE &&
                       (int) INITPROTO_WEV_WRITE == HUTCH_WATCH_WRITE &&
                       (int) INITPROTO_WEV_REMOVE == HUTCH_WATCH_REMOVE &&
                       (int) INITPROTO_WEV_RENAME == HUTCH_WATCH_RENAME &&
                       (int) INITPROTO_WEV_CHMOD == HUTCH_WATCH_CHMOD,
               "watch event kinds of the API and of the protocol differ");

void initconn_event_free(initconn_event *ev) {
        if (!ev)
                return;
        free(ev->path);
        free(ev);
}

initconn_event *initconn_event_pop(hutch_sandbox *sb) {
        initconn_event *ev = sb->events_head;
        if (!ev)
                return NULL;
        sb->events_head = ev->next;
        if (!sb->events_head)
                sb->events_tail = NULL;
        if (ev->type == INITPROTO_EV_EXIT)
                sb->n_exit_events--;
        else
                sb->n_watch_events--;
        ev->next = NULL;
        return ev;
}

void initconn_events_free(hutch_sandbox *sb) {
        initconn_event *ev;
        while ((ev = initconn_event_pop(sb)))
                initconn_event_free(ev);
}

static void event_append(hutch_sandbox *sb, initconn_event *ev) {
        if (sb->events_tail)
                sb->events_tail->next = ev;
        else
                sb->events_head = ev;
        sb->events_tail = ev;
        if (ev->type == INITPROTO_EV_EXIT)
                sb->n_exit_events++;
        else
                sb->n_watch_events++;
}

static int queue_exit(hutch_sandbox *sb, const initproto_msg *m) {
        if (sb->n_exit_events >= MAX_QUEUED_EXITS)
                return -ENOBUFS; /* more exits than processes could exist: a broken init */
        uint64_t pid = 0, code = 0, sig = 0, core = 0;
        if (initproto_find_u64(m, T_PID, &pid) <= 0 || pid == 0 || pid > INT32_MAX)
                return -EBADMSG;
        (void) initproto_find_u64(m, T_EXIT_CODE, &code);
        (void) initproto_find_u64(m, T_SIGNAL, &sig);
        (void) initproto_find_u64(m, T_CORE, &core);
        /* absent from an init older than the field (a sandbox adopted
         * across an upgrade) */
        uint64_t cpu_us = 0;
        bool has_cpu = initproto_find_u64(m, T_CPU_US, &cpu_us) > 0 && cpu_us <= INT64_MAX;
        initconn_event *ev = calloc(1, sizeof *ev);
        if (!ev)
                return -ENOMEM;
        ev->type = INITPROTO_EV_EXIT;
        ev->exit = (hutch_exit) {
                .pid = (pid_t) pid,
                .exit_code = (int) (code & 0xff),
                .signal = (int) (sig & 0x7f),
                .core_dumped = core != 0,
                .cpu_us = has_cpu ? (int64_t) cpu_us : -1,
        };
        event_append(sb, ev);
        return 1;
}

static int queue_watch(hutch_sandbox *sb, const initproto_msg *m) {
        char path[INITPROTO_MAX_STRING + 1];
        uint64_t id = 0, kind = 0;

        /* checked before the bound: garbage is garbage even when dropped */
        if (initproto_find_u64(m, T_WATCH_ID, &id) <= 0 || id == 0 || id > UINT32_MAX)
                return -EBADMSG;
        if (initproto_find_u64(m, T_EVENT, &kind) <= 0 || kind < HUTCH_WATCH_CREATE ||
            kind > HUTCH_WATCH_CHMOD)
                return -EBADMSG;
        if (initproto_find_str(m, T_PATH, path, sizeof path) <= 0 || path[0] != '/')
                return -EBADMSG;
        if (sb->n_watch_events >= MAX_QUEUED_WATCH_EVENTS) {
                sb->watch_events_dropped++;
                return 0;
        }
        initconn_event *ev = calloc(1, sizeof *ev);
        if (!ev)
                return -ENOMEM;
        ev->type = INITPROTO_EV_WATCH;
        ev->watch_id = (uint32_t) id;
        ev->watch_kind = (int) kind;
        ev->path = strdup(path);
        if (!ev->path) {
                free(ev);
                return -ENOMEM;
        }
        event_append(sb, ev);
        return 1;
}

/* 1 queued, 0 not (an event type of a newer init, a dropped watch event). */
static int queue_event(hutch_sandbox *sb, const initproto_msg *m) {
        switch (m->type) {
        case INITPROTO_EV_EXIT:
                return queue_exit(sb, m);
        case INITPROTO_EV_WATCH:
                return queue_watch(sb, m);
        default:
                return 0;
        }
}

/* Receive one frame into sb->rxbuf. 1 = got one, 0 = timeout. */
static int recv_frame(hutch_sandbox *sb, int timeout_ms, initproto_msg *ret, int *fds,
                      size_t *ret_nfds, hutch_error *err) {
        if (sb->conn < 0)
                return hutch_error_set(err, -ENOTCONN, "sandbox %s: not connected to its init",
                                       sb->id);
        struct pollfd p = { .fd = sb->conn, .events = POLLIN };
        int k;
        do
                k = poll(&p, 1, timeout_ms);
        while (k < 0 && errno == EINTR);
        if (k < 0)
                return hutch_error_set(err, -errno, "poll: %m");
        if (k == 0)
                return 0;
        ssize_t n = fd_recv_with_fds(sb->conn, sb->rxbuf, INITPROTO_MAX_FRAME, fds,
                                     INITPROTO_MAX_FDS, ret_nfds, MSG_DONTWAIT);
        if (n == -EAGAIN)
                return 0;
        if (n < 0)
                return hutch_error_set(err, (int) n, "sandbox %s: reading from init: %s", sb->id,
                                       strerror((int) -n));
        if (n == 0)
                return hutch_error_set(err, -ECONNRESET, "sandbox %s: init closed the connection",
                                       sb->id);
        int r = initproto_parse(sb->rxbuf, (size_t) n, ret);
        if (r < 0) {
                for (size_t i = 0; i < *ret_nfds; i++)
                        close_untrusted(fds[i]);
                return hutch_error_set(err, r, "sandbox %s: malformed message from init", sb->id);
        }
        return 1;
}

static int reply_error(hutch_sandbox *sb, const initproto_msg *m, hutch_error *err) {
        uint64_t e = EIO;
        char msg[512] = "";
        (void) initproto_find_u64(m, T_ERRNO, &e);
        if (initproto_find_str(m, T_MESSAGE, msg, sizeof msg) <= 0)
                msg[0] = 0;
        if (e == 0 || e > 4095)
                e = EIO;
        return hutch_error_set(err, -(int) e, "%s", msg[0] ? msg : strerror((int) e));
}

int initconn_call(hutch_sandbox *sb, const int *fds, size_t nfds, initconn_reply_fn on_reply,
                  void *userdata, int timeout_ms, hutch_error *err) {
        int len = initproto_finish(sb->tx);
        if (len < 0)
                return hutch_error_set(err, len, "request too large for the init protocol");
        initproto_msg req;
        (void) initproto_parse(sb->tx->buf, (size_t) len, &req);
        uint32_t id = req.id;
        /* only these requests are answered by a stream of replies */
        bool streaming = req.type == INITPROTO_FS_LIST || req.type == INITPROTO_LIST_PROCS;
        if (sb->conn < 0)
                return hutch_error_set(err, -ENOTCONN, "sandbox %s: not connected", sb->id);
        /* a frozen init cannot answer: fail now rather than at the timeout,
         * which on the daemon's loop would hold every other sandbox */
        if (sb->frozen)
                return hutch_error_set(err, -EAGAIN, "sandbox %s is frozen (paused, or its layer is being copied)",
                                       sb->id);
        int r = fd_send_with_fds(sb->conn, sb->tx->buf, (size_t) len, fds, nfds);
        if (r < 0)
                return hutch_error_set(err, r, "sandbox %s: sending to init: %s", sb->id,
                                       strerror(-r));

        int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
        for (;;) {
                int wait = -1;
                if (deadline >= 0) {
                        int64_t left = deadline - now_ms();
                        if (left <= 0)
                                return hutch_error_set(err, -ETIMEDOUT,
                                                       "sandbox %s: init did not answer in time",
                                                       sb->id);
                        wait = (int) left;
                }
                initproto_msg m;
                int rfds[INITPROTO_MAX_FDS];
                size_t rn = 0;
                r = recv_frame(sb, wait, &m, rfds, &rn, err);
                if (r < 0)
                        return r;
                if (r == 0)
                        continue;
                if (m.id == 0) {
                        for (size_t i = 0; i < rn; i++)
                                close_untrusted(rfds[i]);
                        r = queue_event(sb, &m);
                        if (r < 0)
                                return hutch_error_set(err, r, "sandbox %s: bad event from init",
                                                       sb->id);
                        continue;
                }
                if (m.id != id) {
                        /* a late reply to a request we gave up on */
                        for (size_t i = 0; i < rn; i++)
                                close_untrusted(rfds[i]);
                        continue;
                }
                if (m.type == INITPROTO_ERROR) {
                        for (size_t i = 0; i < rn; i++)
                                close_untrusted(rfds[i]);
                        return reply_error(sb, &m, err);
                }
                if (m.type != INITPROTO_OK) {
                        for (size_t i = 0; i < rn; i++)
                                close_untrusted(rfds[i]);
                        return hutch_error_set(err, -EBADMSG, "sandbox %s: unexpected reply type %u",
                                               sb->id, m.type);
                }
                if ((m.flags & INITPROTO_F_MORE) && !streaming) {
                        for (size_t i = 0; i < rn; i++)
                                close_untrusted(rfds[i]);
                        return hutch_error_set(
                                err, -EBADMSG,
                                "sandbox %s: init streamed replies to a single request", sb->id);
                }
                r = on_reply ? on_reply(&m, rfds, rn, userdata) : 0;
                for (size_t i = 0; i < rn; i++)
                        if (rfds[i] >= 0)
                                close_untrusted(rfds[i]);
                if (r < 0)
                        return hutch_error_set(err, r, "sandbox %s: bad reply from init", sb->id);
                if (!(m.flags & INITPROTO_F_MORE))
                        return 0;
        }
}

int initconn_hello(hutch_sandbox *sb, int timeout_ms, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_HELLO);
        initproto_put_u64(w, T_VERSION, INITPROTO_VERSION);
        initproto_put_str(w, T_TOKEN, sb->token);
        return initconn_call(sb, NULL, 0, NULL, NULL, timeout_ms, err);
}

int initconn_pump(hutch_sandbox *sb, int timeout_ms, hutch_error *err) {
        initproto_msg m;
        int fds[INITPROTO_MAX_FDS];
        size_t n = 0;
        int r = recv_frame(sb, timeout_ms, &m, fds, &n, err);
        if (r <= 0)
                return r;
        for (size_t i = 0; i < n; i++)
                close_untrusted(fds[i]);
        if (m.id != 0)
                return 1; /* stale reply */
        r = queue_event(sb, &m);
        if (r < 0)
                return hutch_error_set(err, r, "sandbox %s: bad event from init", sb->id);
        return 1;
}

/* Frames read per call when nothing is queued: init alone decides how
 * many it sends, and the caller's loop must get control back. */
#define NEXT_EVENT_MAX_READS 64

int hutch_sandbox_next_event(hutch_sandbox *sb, hutch_event *ret, hutch_error *err) {
        for (unsigned i = 0; !sb->events_head && i < NEXT_EVENT_MAX_READS; i++) {
                int r = initconn_pump(sb, 0, err);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
        }
        initconn_event *ev = initconn_event_pop(sb);
        if (!ev)
                return 0;
        *ret = (hutch_event) { .type = ev->type == INITPROTO_EV_EXIT ? HUTCH_EVENT_EXIT
                                                                     : HUTCH_EVENT_WATCH };
        if (ev->type == INITPROTO_EV_EXIT)
                ret->exit = ev->exit;
        else {
                ret->watch_id = ev->watch_id;
                ret->watch_kind = ev->watch_kind;
                ret->path = TAKE_PTR(ev->path);
        }
        initconn_event_free(ev);
        return 1;
}

void hutch_event_clear(hutch_event *ev) {
        if (!ev)
                return;
        free(ev->path);
        *ev = (hutch_event) { 0 };
}

uint64_t hutch_sandbox_watch_events_dropped(const hutch_sandbox *sb) {
        return sb ? sb->watch_events_dropped : 0;
}
