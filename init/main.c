/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch-init: PID 1 of a sandbox. The engine starts it with
 *   fd 3  a listening AF_UNIX SOCK_SEQPACKET socket (clients after the first)
 *   fd 4  a connected SOCK_SEQPACKET socket to the creator
 * and stdin/stdout/stderr on /dev/null. The creator's HELLO sets a token;
 * every later connection must present it. One thread runs an epoll loop
 * over the sockets, a signalfd for SIGCHLD, write pipes and inotify fds.
 *
 * Everything a client sends is untrusted: a malformed frame closes that
 * connection, nothing a client does can stop the loop or kill init.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "init.h"
#include "util/fdutil.h"

#define LISTEN_FD 3
#define CREATOR_FD 4
/* Requests handled per wakeup of one connection, so that one busy client
 * cannot starve the others. */
#define READS_PER_WAKEUP 16
#define JOB_STEPS_PER_WAKEUP 16

static int epoll_fd = -1;
static source *graveyard;
static bool debug;

conn *all_conns;
/* PID 1 under gVisor (--gvisor-guest): the mux, and the proxy's port */
static bool gvisor;
static uint16_t gvisor_egress_port;
/* and the sandbox's memory limit, enforced from inside (memwatch.c) */
static uint64_t gvisor_memory_limit;
static bool gvisor_layer;
/* --gvisor-guest ... layer PATH...: the volumes init binds (layer.c) */
static char *const *gvisor_vol_paths;
static size_t gvisor_n_vols;
static unsigned n_clients; /* accepted ones; the creator is not counted */

static char token[INITPROTO_MAX_STRING + 1];
static size_t token_len;
static bool token_set;

void log_debug_enable(bool on) {
        debug = on;
}

void log_debug(const char *fmt, ...) {
        va_list ap;

        if (!debug)
                return;
        va_start(ap, fmt);
        fputs("hutch-init: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
}

/* ------------------------------------------------------------ event loop */

/* What an event names is a slot of this table and the slot's generation,
 * never a pointer: an event the kernel reports for a registration that is
 * gone (the gVisor sentry has been seen to bring back, with a restore, the
 * registrations of descriptors closed before the checkpoint, whose sources
 * were freed) names an empty slot or an old generation and is dropped. A
 * slot is taken at EPOLL_CTL_ADD and given back at EPOLL_CTL_DEL. */
static struct slot {
        source *s;         /* NULL: free */
        uint32_t gen;      /* changes each time the slot is given back */
        uint32_t next_free;
} *slots;
static uint32_t n_slots, first_free = UINT32_MAX;

static int slot_take(source *s) {
        if (first_free == UINT32_MAX) {
                uint32_t n = n_slots ? n_slots * 2 : 64;
                struct slot *ns = realloc(slots, n * sizeof *ns);
                if (!ns)
                        return -ENOMEM;
                slots = ns;
                for (uint32_t i = n; i > n_slots; i--) {
                        slots[i - 1] = (struct slot) { .next_free = first_free };
                        first_free = i - 1;
                }
                n_slots = n;
        }
        uint32_t i = first_free;
        first_free = slots[i].next_free;
        slots[i].s = s;
        s->slot = i + 1;
        return 0;
}

static void slot_give_back(source *s) {
        if (!s->slot)
                return;
        struct slot *sl = &slots[s->slot - 1];
        sl->s = NULL;
        sl->gen++;
        sl->next_free = first_free;
        first_free = s->slot - 1;
        s->slot = 0;
}

static uint64_t slot_tag(const source *s) {
        return (uint64_t) slots[s->slot - 1].gen << 32 | (s->slot - 1);
}

static source *slot_source(uint64_t tag) {
        uint32_t i = (uint32_t) tag;
        return i < n_slots && slots[i].gen == (uint32_t) (tag >> 32) ? slots[i].s : NULL;
}

/* No events means out of the set: a hung-up descriptor nobody wants to
 * hear from would otherwise report EPOLLHUP on every wait. */
int source_set_events(source *s, uint32_t events) {
        if (s->fd < 0 || (s->registered && s->events == events) || (!s->registered && !events))
                return 0;
        int op = !events ? EPOLL_CTL_DEL : s->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
        if (op == EPOLL_CTL_ADD && slot_take(s) < 0)
                return -ENOMEM;
        struct epoll_event ev = { .events = events, .data.u64 = slot_tag(s) };
        if (epoll_ctl(epoll_fd, op, s->fd, op == EPOLL_CTL_DEL ? NULL : &ev) < 0) {
                int r = negative_errno();
                if (op == EPOLL_CTL_ADD)
                        slot_give_back(s);
                return r;
        }
        if (op == EPOLL_CTL_DEL)
                slot_give_back(s);
        s->events = events;
        s->registered = events != 0;
        return 0;
}

int source_add(source *s, uint32_t events) {
        s->registered = false;
        s->slot = 0;
        return source_set_events(s, events);
}

void source_remove(source *s) {
        if (s->fd < 0)
                return;
        if (s->registered)
                (void) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, s->fd, NULL);
        slot_give_back(s);
        s->registered = false;
        s->fd = safe_close(s->fd);
}

int loop_rebuild(void) {
        int fd = epoll_create1(EPOLL_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        int r = 0;
        for (uint32_t i = 0; i < n_slots; i++) {
                source *s = slots[i].s;
                if (!s)
                        continue;
                struct epoll_event ev = { .events = s->events, .data.u64 = slot_tag(s) };
                if (epoll_ctl(fd, EPOLL_CTL_ADD, s->fd, &ev) < 0 && r == 0)
                        r = negative_errno();
        }
        safe_close(epoll_fd);
        epoll_fd = fd;
        return r;
}

void source_kill(source *s) {
        if (s->dead)
                return;
        source_remove(s);
        s->dead = true;
        s->grave_next = graveyard;
        graveyard = s;
}

static void graveyard_flush(void) {
        while (graveyard) {
                source *s = graveyard;
                graveyard = s->grave_next;
                s->release(s);
        }
}

/* ---------------------------------------------------------------- output */

struct outframe {
        outframe *next;
        size_t len;
        size_t n_fds;
        int fds[INITPROTO_MAX_FDS];
        uint8_t data[];
};

/* What a queued frame costs against the limits: its bytes plus a share for
 * the bookkeeping, so that a flood of tiny frames is bounded too. */
static size_t outframe_cost(const outframe *f) {
        return f->len + 256;
}

static void outframe_free(outframe *f) {
        for (size_t i = 0; i < f->n_fds; i++)
                safe_close(f->fds[i]);
        free(f);
}

static void conn_close(conn *c);
static void conn_update_events(conn *c);

/* Send what is queued, oldest first, until the socket is full. */
static int conn_flush(conn *c) {
        while (c->outq) {
                outframe *f = c->outq;
                int r = fd_send_with_fds(c->src.fd, f->data, f->len, f->fds, f->n_fds);
                if (r == -EAGAIN)
                        return 0;
                if (r < 0)
                        return r;
                c->outq = f->next;
                if (!c->outq)
                        c->outq_tail = &c->outq;
                c->outq_bytes -= outframe_cost(f);
                outframe_free(f);
        }
        return 0;
}

static int conn_enqueue(conn *c, const void *data, size_t len, const int *fds, size_t n_fds) {
        outframe *f = malloc(sizeof(outframe) + len);
        if (!f)
                return -ENOMEM;
        *f = (outframe) { .len = len };
        memcpy(f->data, data, len);
        /* The caller keeps (and may soon close) its fds: queue our own. */
        for (size_t i = 0; i < n_fds; i++) {
                f->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
                if (f->fds[i] < 0) {
                        int r = negative_errno();
                        outframe_free(f);
                        return r;
                }
                f->n_fds++;
        }
        if (c->outq_bytes + outframe_cost(f) > INIT_OUTQ_MAX) {
                outframe_free(f);
                return -ENOBUFS;
        }
        c->outq_bytes += outframe_cost(f);
        *c->outq_tail = f;
        c->outq_tail = &f->next;
        f->next = NULL;
        return 0;
}

static initproto_writer out;
static uint32_t out_id;

initproto_writer *msg_begin(uint16_t type, uint16_t flags, uint32_t id) {
        initproto_begin(&out, type, flags, id);
        out_id = id;
        return &out;
}

int msg_send(conn *c, const int *fds, size_t n_fds) {
        int len, r;

        if (!conn_alive(c))
                return -ENOTCONN;
        len = initproto_finish(&out);
        if (len < 0) {
                /* Tell the client instead of sending a truncated reply. */
                log_debug("reply to request %u does not fit a frame", out_id);
                return reply_error(c, out_id, EMSGSIZE, "reply too large");
        }

        if (!c->outq) {
                r = fd_send_with_fds(c->src.fd, out.buf, (size_t) len, fds, n_fds);
                if (r >= 0)
                        return 0;
                if (r != -EAGAIN) {
                        conn_close(c);
                        return r;
                }
        }
        r = conn_enqueue(c, out.buf, (size_t) len, fds, n_fds);
        if (r < 0) {
                log_debug("dropping a client: %s", strerror(-r));
                conn_close(c);
                return r;
        }
        conn_update_events(c);
        return 0;
}

int reply_ok(conn *c, uint32_t id) {
        msg_begin(INITPROTO_OK, 0, id);
        return msg_send(c, NULL, 0);
}

int reply_error(conn *c, uint32_t id, int err, const char *fmt, ...) {
        char msg[1024];
        va_list ap;
        int n;

        err = abs(err);
        if (err == 0)
                err = EIO;
        va_start(ap, fmt);
        n = vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t) n < sizeof msg)
                snprintf(msg + n, sizeof msg - (size_t) n, ": %s", strerror(err));

        initproto_writer *w = msg_begin(INITPROTO_ERROR, 0, id);
        initproto_put_u64(w, T_ERRNO, (uint64_t) err);
        initproto_put_str(w, T_MESSAGE, msg);
        return msg_send(c, NULL, 0);
}

/* ----------------------------------------------------------- connections */

static void conn_release(source *s) {
        conn *c = (conn *) s;
        proc_stage_free(c);
        if (c->job)
                c->job->free(c->job);
        while (c->outq) {
                outframe *f = c->outq;
                c->outq = f->next;
                outframe_free(f);
        }
        free(c);
}

static void conn_close(conn *c) {
        if (!conn_alive(c))
                return;
        log_debug("closing connection fd %d", c->src.fd);
        /* A running job is freed with the connection, after the batch: its
         * step() may be what is closing us. */
        for (conn **p = &all_conns; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        if (!c->creator)
                n_clients--;
        if (c->subscriptions & INITPROTO_SUB_EXIT_WITH_CONN) {
                log_debug("the connection this sandbox lives with closed: exiting");
                _exit(0);
        }
        source_kill(&c->src);
        /* Writes, watches and exit listeners die with their connection. */
        proc_conn_gone(c);
        files_conn_gone(c);
        watch_conn_gone(c);
}

/* Read requests only while the client keeps up with the replies, and ask
 * for EPOLLOUT while something waits to go out or a job can make progress. */
static void conn_update_events(conn *c) {
        uint32_t ev = 0;

        if (!conn_alive(c))
                return;
        if (!c->job && c->outq_bytes < INIT_OUTQ_HIGH)
                ev |= EPOLLIN;
        if (c->outq || c->job)
                ev |= EPOLLOUT;
        if (source_set_events(&c->src, ev) < 0)
                conn_close(c);
}

static void conn_run_job(conn *c) {
        for (unsigned i = 0; i < JOB_STEPS_PER_WAKEUP; i++) {
                if (!conn_alive(c) || !c->job || c->outq_bytes >= INIT_OUTQ_HIGH)
                        break;
                job *j = c->job;
                int r = j->step(c, j);
                if (r <= 0 && conn_alive(c)) {
                        c->job = NULL;
                        j->free(j);
                }
        }
}

void conn_start_job(conn *c, job *j) {
        /* Requests are not read while a job runs, so there is never a
         * second one to start. */
        if (!conn_alive(c) || c->job) {
                j->free(j);
                return;
        }
        c->job = j;
        conn_run_job(c);
        conn_update_events(c);
}

/* Byte-wise comparison whose time does not depend on where the first
 * difference is. */
static bool token_equal(const char *a, size_t a_len) {
        unsigned char diff = a_len != token_len;
        for (size_t i = 0; i < token_len; i++)
                diff |= (unsigned char) token[i] ^ (unsigned char) (i < a_len ? a[i] : 0);
        return diff == 0;
}

static void handle_hello(conn *c, const req *r) {
        const char *t = req_str(r, T_TOKEN);

        if (req_has(r, T_VERSION) && req_u64(r, T_VERSION, 0) != INITPROTO_VERSION) {
                reply_error(c, r->id, EPROTONOSUPPORT, "protocol version %llu",
                            (unsigned long long) req_u64(r, T_VERSION, 0));
                conn_close(c);
                return;
        }
        if (!c->authed) {
                if (!t || !*t) {
                        conn_close(c);
                        return;
                }
                if (c->creator && !token_set) {
                        token_len = strlen(t);
                        memcpy(token, t, token_len + 1);
                        token_set = true;
                } else if (!token_set || !token_equal(t, strlen(t))) {
                        log_debug("refusing a client with a wrong token");
                        conn_close(c);
                        return;
                }
                c->authed = true;
        }
        initproto_writer *w = msg_begin(INITPROTO_OK, 0, r->id);
        initproto_put_u64(w, T_VERSION, INITPROTO_VERSION);
        initproto_put_u64(w, T_PID, (uint64_t) getpid());
        msg_send(c, NULL, 0);
}

static bool tag_is_string(uint16_t tag) {
        switch (tag) {
        case T_MESSAGE:
        case T_TOKEN:
        case T_ARG:
        case T_ENV:
        case T_CWD:
        case T_TAG:
        case T_REQUEST_ID:
        case T_PATH:
        case T_PATH2:
        case T_NAME:
        case T_SYMLINK:
        case T_OWNER:
        case T_GROUPNAME:
        case T_META_KEY:
        case T_META_VALUE:
                return true;
        default:
                return false;
        }
}

static bool tag_is_u64(uint16_t tag) {
        switch (tag) {
        case T_ERRNO ... T_VERSION:
        case T_FLAGS:
        case T_PID:
        case T_UID ... T_PTY_COLS:
        case T_SIGNAL ... T_PTY:
        case T_STAGED:
        case T_KEEP:
        case T_DEPTH ... T_EVENT:
        case T_TYPE ... T_TARGET_TYPE:
        case T_MODE ... T_MTIME_NS:
        case T_META_SET:
                return true;
        default:
                return false;
        }
}

/* Decode every known field once. Every string is copied into arena with its
 * NUL; a field costs 6 + len bytes of payload and len + 1 of arena, so an
 * arena as large as the payload always suffices. */
static int req_decode(const initproto_msg *m, req *r) {
        static char arena[INITPROTO_MAX_PAYLOAD];
        size_t used = 0;
        initproto_iter it;
        initproto_field f;
        int k;

        memset(r->has, 0, sizeof r->has);
        memset(r->str, 0, sizeof r->str);
        r->argc = r->envc = r->n_meta = 0;
        r->type = m->type;
        r->id = m->id;

        initproto_iter_init(&it, m);
        while ((k = initproto_next(&it, &f)) > 0) {
                if (tag_is_string(f.tag)) {
                        char *s = arena + used;
                        int e = initproto_field_str(&f, s, sizeof arena - used);
                        if (e < 0)
                                return e;
                        used += f.len + 1;
                        if (f.tag == T_ARG || f.tag == T_ENV) {
                                size_t *n = f.tag == T_ARG ? &r->argc : &r->envc;
                                const char **v = f.tag == T_ARG ? r->argv : r->envv;
                                if (*n >= INITPROTO_MAX_ARGS)
                                        return -E2BIG;
                                v[(*n)++] = s;
                                v[*n] = NULL;
                        } else if (f.tag == T_META_KEY) {
                                /* a key must follow a complete pair */
                                if (r->n_meta > 0 && !r->meta_values[r->n_meta - 1])
                                        return -EBADMSG;
                                if (r->n_meta >= INITPROTO_META_MAX)
                                        return -E2BIG;
                                r->meta_keys[r->n_meta] = s;
                                r->meta_values[r->n_meta++] = NULL;
                        } else if (f.tag == T_META_VALUE) {
                                if (r->n_meta == 0 || r->meta_values[r->n_meta - 1])
                                        return -EBADMSG;
                                r->meta_values[r->n_meta - 1] = s;
                        } else if (!r->str[f.tag])
                                r->str[f.tag] = s;
                } else if (tag_is_u64(f.tag)) {
                        uint64_t v;
                        int e = initproto_field_u64(&f, &v);
                        if (e < 0)
                                return e;
                        if (!r->has[f.tag]) {
                                r->has[f.tag] = true;
                                r->u64[f.tag] = v;
                        }
                }
                /* Unknown tags are skipped: a newer host may send more. */
        }
        r->argv[r->argc] = NULL;
        r->envv[r->envc] = NULL;
        if (k >= 0 && r->n_meta > 0 && !r->meta_values[r->n_meta - 1])
                return -EBADMSG; /* a key without its value */
        return k;
}

static void handle_message(conn *c, const initproto_msg *m) {
        static req r;
        int k;

        k = req_decode(m, &r);
        if (!c->authed) {
                /* Nothing but a well-formed HELLO before the token matched. */
                if (k < 0 || m->type != INITPROTO_HELLO) {
                        conn_close(c);
                        return;
                }
        }
        if (k < 0) {
                reply_error(c, m->id, k, "malformed %s request", initproto_type_name(m->type));
                return;
        }
        log_debug("request %s id %u", initproto_type_name(m->type), m->id);

        names_cache_reset();
        switch (m->type) {
        case INITPROTO_HELLO:
                handle_hello(c, &r);
                break;
        case INITPROTO_SUBSCRIBE:
                c->subscriptions = (uint32_t) req_u64(&r, T_FLAGS, 0);
                reply_ok(c, r.id);
                break;
        case INITPROTO_SPAWN ... INITPROTO_LIST_PROCS:
                proc_handle(c, &r);
                break;
        case INITPROTO_SPAWN_PART:
                proc_spawn_part(c, m);
                break;
        case INITPROTO_FS_STAT ... INITPROTO_FS_WRITE_ABORT:
                files_handle(c, &r);
                break;
        case INITPROTO_FS_WATCH_ADD:
        case INITPROTO_FS_WATCH_REMOVE:
                watch_handle(c, &r);
                break;
        case INITPROTO_NET_LISTEN:
                if (!gvisor) {
                        reply_error(c, m->id, EOPNOTSUPP, "net-listen is the gvisor backend's");
                        break;
                }
                k = guest_net_listen(req_u64(&r, T_FLAGS, 0) == 1);
                if (k < 0)
                        reply_error(c, m->id, k, "listening on 127.0.0.1:%u", (unsigned) gvisor_egress_port);
                else
                        reply_ok(c, r.id);
                break;
        default:
                reply_error(c, m->id, EOPNOTSUPP, "message type %u", m->type);
                break;
        }
}

/* Receive one packet. Returns 1 when a frame was handled, 0 when the socket
 * is drained, -errno when the connection is finished. */
static int conn_read_one(conn *c) {
        static uint8_t buf[INITPROTO_MAX_FRAME];
        initproto_msg m;

        /* Clients have no business sending descriptors: any are closed. */
        ssize_t n = fd_recv_with_fds(c->src.fd, buf, sizeof buf, NULL, 0, NULL, MSG_DONTWAIT);
        if (n == -EAGAIN)
                return 0;
        if (n == -EMSGSIZE)
                return -EBADMSG;
        if (n < 0)
                return (int) n;
        if (n == 0)
                return -ECONNRESET; /* EOF (or an empty packet, never valid) */
        if (initproto_parse(buf, (size_t) n, &m) < 0)
                return -EBADMSG;
        handle_message(c, &m);
        return 1;
}

static void conn_dispatch(source *s, uint32_t events) {
        conn *c = (conn *) s;

        if (events & EPOLLOUT) {
                if (conn_flush(c) < 0) {
                        conn_close(c);
                        return;
                }
                conn_run_job(c);
        }
        if (events & EPOLLIN) {
                for (unsigned i = 0; i < READS_PER_WAKEUP; i++) {
                        if (!conn_alive(c) || c->job || c->outq_bytes >= INIT_OUTQ_HIGH)
                                break;
                        int r = conn_read_one(c);
                        if (r < 0) {
                                log_debug("connection ends: %s", strerror(-r));
                                conn_close(c);
                                return;
                        }
                        if (r == 0)
                                break;
                }
        } else if (events & (EPOLLHUP | EPOLLERR)) {
                /* Nothing to read and the peer is gone. */
                conn_close(c);
                return;
        }
        conn_update_events(c);
}

int conn_new(int fd, bool creator) {
        conn *c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->src = (source) { .fd = fd, .dispatch = conn_dispatch, .release = conn_release };
        c->creator = creator;
        c->outq_tail = &c->outq;
        int r = source_add(&c->src, EPOLLIN);
        if (r < 0) {
                free(c);
                return r;
        }
        c->next = all_conns;
        all_conns = c;
        if (!creator)
                n_clients++;
        return 0;
}

/* ------------------------------------------------------------- listening */

static void listener_dispatch(source *s, uint32_t events) {
        /* A bounded number per wakeup; level-triggered epoll brings us back. */
        for (unsigned i = 0; i < 16; i++) {
                _cleanup_close_ int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                        /* EMFILE and friends: the pending connection stays
                         * in the backlog; try again on the next event. */
                        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                                log_debug("accept: %s", strerror(errno));
                        return;
                }
                if (n_clients >= INIT_MAX_CLIENTS) {
                        log_debug("too many clients, refusing one");
                        continue;
                }
                /* The listening socket lives on a host path, but check anyway
                 * that the peer is outside our pid namespace: SO_PEERCRED
                 * translates its pid into ours, 0 when it is not visible. Only
                 * meaningful when we are PID 1 of our own namespace. */
                struct ucred cred;
                socklen_t len = sizeof cred;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                        continue;
                if (getpid() == 1 && cred.pid != 0) {
                        log_debug("refusing a client from inside the sandbox (pid %d)",
                                  (int) cred.pid);
                        continue;
                }
                if (conn_new(fd, false) < 0)
                        continue;
                TAKE_FD(fd);
        }
}

static void noop_release(source *s) {
}

static source listener = { .fd = -1, .dispatch = listener_dispatch, .release = noop_release };

/* ------------------------------------------------------------- SIGCHLD */

static void sigchld_dispatch(source *s, uint32_t events) {
        struct signalfd_siginfo si[8];

        /* Signals coalesce; what matters is reaping everything afterwards. */
        while (read(s->fd, si, sizeof si) > 0)
                ;
        proc_reap();
}

static source sigchld = { .fd = -1, .dispatch = sigchld_dispatch, .release = noop_release };

/* ----------------------------------------------------------------- setup */

/* Make 0, 1, 2 exist, so that no pipe or socket we create lands there and
 * gets clobbered by a child's dup2() onto its stdio. */
static void ensure_stdio(void) {
        for (int fd = 0; fd <= 2; fd++)
                if (fcntl(fd, F_GETFD) < 0) {
                        int n = open("/dev/null", O_RDWR);
                        if (n >= 0 && n != fd) {
                                dup2(n, fd);
                                close(n);
                        }
                }
}

static int set_cloexec_nonblock(int fd) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
                return negative_errno();
        if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
                return negative_errno();
        return 0;
}

int loop_init(void) {
        epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        return epoll_fd < 0 ? negative_errno() : 0;
}

static int setup(void) {
        sigset_t mask;
        int r;

        /* First: sandbox root must not be able to ptrace us or read our
         * memory (the token, other clients' data) via /proc. */
        /* Executed from a memfd, the kernel names us "memfd:hutch-ini". */
        (void) prctl(PR_SET_NAME, "hutch-init", 0, 0, 0);
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
                return negative_errno();
        debug = getenv("HUTCH_INIT_DEBUG") != NULL;

        /* When we are not PID 1 (tests), orphans of our children still
         * come to us for reaping. */
        (void) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

        /* Clients can hang up at any time: a write to them must fail with
         * EPIPE, not kill us. As PID 1 we only ever get signals we handle,
         * but outside a pid namespace (tests) these would be fatal. */
        signal(SIGPIPE, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        umask(022);

        /* Supplementary groups would leak root's group permissions into
         * every file operation done as the user (fsuid only swaps uid/gid). */
        (void) setgroups(0, NULL);

        /* Each tracked process pins a few descriptors. */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void) setrlimit(RLIMIT_NOFILE, &rl);
        }

        if (gvisor) {
                /* The mux stream is runsc's stdin and stdout: keep it out of
                 * 0-2, which children inherit, and out of their reach. */
                if (dup3(0, GUEST_STREAM_FD, O_CLOEXEC) < 0 || dup3(1, GUEST_STREAM_FD + 1, O_CLOEXEC) < 0)
                        return negative_errno();
                /* stderr stays runsc's (the relay's log) only for debugging */
                for (int fd = 0; fd <= (debug ? 1 : 2); fd++)
                        close(fd);
                if (syscall(SYS_close_range, (unsigned long) GUEST_STREAM_FD + 2, (unsigned long) ~0U, 0ul) < 0)
                        for (int fd = GUEST_STREAM_FD + 2; fd < 1024; fd++)
                                close(fd);
                ensure_stdio();
                /* the root with its sized writable layer, before anything
                 * else runs (layer.c) */
                if (gvisor_layer && (r = layer_setup(gvisor_vol_paths, gvisor_n_vols)) < 0) {
                        fprintf(stderr, "hutch-init: building the writable layer: %s\n", strerror(-r));
                        return r;
                }
        } else {
                ensure_stdio();
                /* Nothing but fds 3 and 4 should have been inherited; make sure. */
                if (syscall(SYS_close_range, CREATOR_FD + 1, ~0U, 0) < 0)
                        for (int fd = CREATOR_FD + 1; fd < 1024; fd++)
                                close(fd);
        }

        r = loop_init();
        if (r < 0)
                return r;

        sigemptyset(&mask);
        sigaddset(&mask, SIGCHLD);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return negative_errno();
        sigchld.fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (sigchld.fd < 0)
                return negative_errno();
        r = source_add(&sigchld, EPOLLIN);
        if (r < 0)
                return r;

        /* Under gVisor no descriptor crosses the sandbox's edge: the
         * relay's connections arrive over the mux on fd 0 (guest.c). */
        if (gvisor) {
                r = guest_setup(GUEST_STREAM_FD, gvisor_egress_port);
                if (r >= 0 && gvisor_layer)
                        r = layer_watch_setup();
                return r < 0 ? r : memwatch_setup(gvisor_memory_limit);
        }

        r = set_cloexec_nonblock(CREATOR_FD);
        if (r < 0)
                return r;
        r = conn_new(CREATOR_FD, true);
        if (r < 0)
                return r;

        /* Without a listening socket only the creator can talk to us. */
        if (set_cloexec_nonblock(LISTEN_FD) >= 0) {
                listener.fd = LISTEN_FD;
                if (source_add(&listener, EPOLLIN) < 0)
                        listener.fd = -1;
        }
        return 0;
}

void loop_run(void) {
        struct epoll_event events[64];

        for (;;) {
                int n = epoll_wait(epoll_fd, events, (int) ELEMENTSOF(events), -1);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        /* Cannot happen with a valid epoll fd; never exit,
                         * PID 1 leaving would kill the whole sandbox. */
                        log_debug("epoll_wait: %s", strerror(errno));
                        sleep(1);
                        continue;
                }
                for (int i = 0; i < n; i++) {
                        source *s = slot_source(events[i].data.u64);
                        if (!s)
                                log_debug("an event for a registration that is gone (slot %u)",
                                          (unsigned) (uint32_t) events[i].data.u64);
                        else if (!s->dead && s->fd >= 0)
                                s->dispatch(s, events[i].events);
                }
                graveyard_flush();
        }
}

/* hutch-init                      PID 1 of a namespace sandbox (fds 3, 4)
 * hutch-init --gvisor-guest PORT [MEMORY [layer]]
 *                                 PID 1 under gVisor, the mux on fd 0;
 *                                 "layer": build the root (layer.c)
 * hutch-init --gvisor-relay ...   the host relay of a gVisor sandbox (relay.c)
 * hutch-init --ingress-connect PORT  inside a gVisor sandbox: stdin/stdout
 *                                 joined to 127.0.0.1:PORT (connect.c) */
int main(int argc, char **argv) {
        int r;

        if (argc >= 2 && streq(argv[1], "--gvisor-relay"))
                return relay_main(argc - 1, argv + 1);
        if (argc == 3 && streq(argv[1], "--ingress-connect"))
                return connect_main(argv[2]);
        if (argc >= 3 && streq(argv[1], "--gvisor-guest")) {
                char *end;
                unsigned long port = strtoul(argv[2], &end, 10);
                if (*end || port > 65535) {
                        fprintf(stderr, "hutch-init: bad egress port '%s'\n", argv[2]);
                        return EXIT_FAILURE;
                }
                unsigned long long mem = 0;
                if (argc >= 4) {
                        mem = strtoull(argv[3], &end, 10);
                        if (*end) {
                                fprintf(stderr, "hutch-init: bad memory limit '%s'\n", argv[3]);
                                return EXIT_FAILURE;
                        }
                }
                if (argc >= 5) {
                        if (!streq(argv[4], "layer")) {
                                fprintf(stderr, "hutch-init: bad argument '%s'\n", argv[4]);
                                return EXIT_FAILURE;
                        }
                        gvisor_layer = true;
                        /* then the volumes' paths, volume i's at argv[5 + i] */
                        gvisor_vol_paths = argv + 5;
                        gvisor_n_vols = (size_t) (argc - 5);
                        for (size_t i = 0; i < gvisor_n_vols; i++)
                                if (gvisor_vol_paths[i][0] != '/' || gvisor_n_vols > 8) {
                                        fprintf(stderr, "hutch-init: bad volume path '%s'\n",
                                                gvisor_vol_paths[i]);
                                        return EXIT_FAILURE;
                                }
                }
                gvisor = true;
                gvisor_egress_port = (uint16_t) port;
                gvisor_memory_limit = mem;
                fsuser_use_euid = true;
                splice_unusable = true;
        }
        r = setup();
        if (r < 0) {
                fprintf(stderr, "hutch-init: setup failed: %s\n", strerror(-r));
                return EXIT_FAILURE;
        }
        log_debug("ready, pid %d", (int) getpid());
        loop_run();
}
