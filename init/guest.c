/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch-init's side of the mux under gVisor (see mux.h). Each channel the
 * relay opens becomes an ordinary init connection: a SOCK_SEQPACKET pair
 * inside the sandbox, init on one end and this module on the other. What
 * init sends on it (a frame, maybe descriptors) goes out as one MSG, each
 * descriptor turned into a stream this module pumps: it reads pipes, pty
 * masters and files and writes what the relay sends. The egress listener
 * (127.0.0.1:PORT in the sandbox's own network stack) turns each accepted
 * connection into a stream the relay connects to the proxy on the host.
 *
 * Everything runs in init's loop: PID 1, which the sandbox cannot kill.
 * The relay is trusted here (it is the host); the sandbox's own processes
 * only ever see their ends of pipes, ptys and sockets.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "init.h"
#include "util/fdutil.h"
#include "mux.h"

#define GUEST_MAX_STREAMS 4096
#define GUEST_MAX_NET 256
/* Stop reading channels and streams while this much waits to go out. */
#define GUEST_TX_HIGH (1024 * 1024)
#define GUEST_CHAN_QUEUE_MAX (4 * 1024 * 1024)

typedef struct gbuf {
        struct gbuf *next;
        size_t len, off;
        uint8_t data[];
} gbuf;

typedef struct gchan {
        source src; /* our end of the pair; init has the other */
        uint32_t id;
        gbuf *q, **q_tail; /* relay → init frames not yet taken */
        size_t q_bytes;
        struct gchan *next;
} gchan;

typedef struct gstream {
        source src;
        uint32_t id;
        uint8_t kind;      /* MUX_K_*, or 0 for an egress connection */
        uint32_t credit;   /* bytes we may still send */
        mux_bufq q;        /* relay → fd */
        uint32_t unacked;  /* delivered, not yet credited back */
        bool in_eof;       /* the relay's side ended: close after the queue */
        bool out_eof;      /* our reading side ended */
        struct gstream *next;
} gstream;

static source mlink_src, wlink_src;
static mux_link mlink;
static gchan *chans;
static gstream *streams;
static unsigned n_streams, n_net;
static uint32_t next_stream_id = 1;
static source net_listener = { .fd = -1 };
static uint16_t net_port;
/* SYNC asked: produce nothing more; SYNCED goes out once the queue is empty */
static bool sync_asked, synced_sent;
/* processes memwatch.c killed that the relay has not heard of */
static uint32_t oom_pending;

static void link_update(void);
static void reports_flush(void);

static void fatal_link(int r) {
        /* The relay is gone or speaks nonsense: nothing can reach this
         * sandbox any more. Exiting as PID 1 ends it, as on the namespace
         * backend when init dies. */
        log_debug("mux link lost: %s", strerror(-r));
        _exit(0);
}

static void link_send(int r) {
        if (r < 0)
                fatal_link(r);
        link_update();
}

/* ---------------------------------------------------------------- streams */

static gstream *stream_find(uint32_t id) {
        for (gstream *s = streams; s; s = s->next)
                if (s->id == id)
                        return s;
        return NULL;
}

static void gbufs_free(gbuf *b) {
        while (b) {
                gbuf *n = b->next;
                free(b);
                b = n;
        }
}

static void stream_release(source *src) {
        gstream *s = (gstream *) src;
        mux_bufq_clear(&s->q);
        free(s);
}

static void stream_drop(gstream *s) {
        for (gstream **p = &streams; *p; p = &(*p)->next)
                if (*p == s) {
                        *p = s->next;
                        break;
                }
        n_streams--;
        if (s->kind == 0)
                n_net--;
        source_kill(&s->src);
}

static bool stream_reads(const gstream *s) {
        return s->kind != MUX_K_IN;
}

static bool stream_writes(const gstream *s) {
        return s->kind == MUX_K_IN || s->kind == MUX_K_PTY || s->kind == 0;
}

static int stream_read(gstream *s);

/* A regular file cannot be polled: read it while the window and the link
 * allow; the relay's WINDOW (or the link draining) brings us back. */
static void file_pump(gstream *s) {
        while (!s->src.dead && !s->out_eof && s->credit > 0 && mlink.tx_bytes < GUEST_TX_HIGH && !sync_asked)
                stream_read(s);
}

static void stream_update(gstream *s) {
        uint32_t ev = 0;
        if (s->src.dead)
                return;
        if (s->kind == MUX_K_FILE) {
                file_pump(s);
                return;
        }
        if (stream_reads(s) && !s->out_eof && s->credit > 0 && mlink.tx_bytes < GUEST_TX_HIGH && !sync_asked)
                ev |= EPOLLIN;
        /* writing a stream sends WINDOW credits: not while synced */
        if (s->q.head && !sync_asked)
                ev |= EPOLLOUT;
        if (source_set_events(&s->src, ev) < 0)
                stream_drop(s);
}

/* Both directions done: forget it. */
static void stream_maybe_done(gstream *s) {
        bool in_done = !stream_writes(s) || (s->in_eof && !s->q.head);
        bool out_done = !stream_reads(s) || s->out_eof;
        if (in_done && out_done)
                stream_drop(s);
}

/* 1 when data went out, 0 otherwise (nothing there, EOF, dropped). */
static int stream_read(gstream *s) {
        static uint8_t buf[MUX_MAX_DATA];
        size_t want = s->credit < sizeof buf ? s->credit : sizeof buf;
        ssize_t n = read(s->src.fd, buf, want);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return 0;
        if (n <= 0) {
                /* EOF, or EIO from a pty master whose processes are gone */
                s->out_eof = true;
                link_send(mux_link_send(&mlink, MUX_EOF, s->id, NULL, 0));
                if (s->kind == 0)
                        (void) shutdown(s->src.fd, SHUT_RD);
                stream_maybe_done(s);
                return 0;
        }
        s->credit -= (uint32_t) n;
        link_send(mux_link_send(&mlink, MUX_DATA, s->id, buf, (size_t) n));
        return 1;
}

/* What processes wrote before init reports their exit goes out first: a
 * reader that sees the exit then finds the output already on its way, as
 * with the namespace backend's pipes. Bounded by the windows. */
static void drain_out_streams(void) {
        for (gstream *s = streams; s;) {
                gstream *n = s->next;
                if ((s->kind == MUX_K_OUT || s->kind == MUX_K_PTY) && !s->src.dead)
                        while (!s->src.dead && !s->out_eof && s->credit > 0 && stream_read(s) > 0)
                                ;
                s = n;
        }
}

static void stream_write(gstream *s) {
        uint32_t wrote = 0;
        if (mux_bufq_write(&s->q, s->src.fd, &wrote) < 0) {
                /* the reader is gone: tell the relay to stop */
                link_send(mux_link_send(&mlink, MUX_RESET, s->id, NULL, 0));
                stream_drop(s);
                return;
        }
        s->unacked += wrote;
        if (s->unacked >= MUX_WINDOW_BYTES / 4 || (!s->q.head && s->unacked)) {
                link_send(mux_link_send_u32(&mlink, MUX_WINDOW, s->id, s->unacked));
                s->unacked = 0;
        }
        if (!s->q.head && s->in_eof) {
                if (s->kind == MUX_K_IN) {
                        stream_drop(s); /* closing our write end is the EOF */
                        return;
                }
                if (s->kind == 0)
                        (void) shutdown(s->src.fd, SHUT_WR);
        }
        stream_maybe_done(s);
}

static void stream_dispatch(source *src, uint32_t events) {
        gstream *s = (gstream *) src;
        if (events & EPOLLOUT)
                stream_write(s);
        if (s->src.dead)
                return;
        if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && stream_reads(s) && !s->out_eof && s->credit > 0)
                stream_read(s);
        else if ((events & (EPOLLHUP | EPOLLERR)) && !stream_reads(s) && !(events & EPOLLOUT)) {
                /* a write end whose reader is gone */
                link_send(mux_link_send(&mlink, MUX_RESET, s->id, NULL, 0));
                stream_drop(s);
                return;
        }
        if (!s->src.dead)
                stream_update(s);
}

static gstream *stream_new(int fd, uint8_t kind) {
        if (n_streams >= GUEST_MAX_STREAMS)
                return NULL;
        gstream *s = calloc(1, sizeof *s);
        if (!s)
                return NULL;
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
                free(s);
                return NULL;
        }
        s->src = (source) { .fd = fd, .dispatch = stream_dispatch, .release = stream_release };
        s->kind = kind;
        s->credit = MUX_WINDOW_BYTES;
        mux_bufq_init(&s->q);
        do
                s->id = next_stream_id++;
        while (s->id == 0 || stream_find(s->id));
        if (source_add(&s->src, 0) < 0) {
                free(s);
                return NULL;
        }
        s->next = streams;
        streams = s;
        n_streams++;
        /* no reading before the relay knows the stream: the caller
         * announces it, then calls stream_update() */
        return s;
}

/* What init handed over, as the relay should see it. */
static int fd_kind(int fd) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0)
                return -errno;
        if (S_ISFIFO(st.st_mode))
                return (fl & O_ACCMODE) == O_WRONLY ? MUX_K_IN : MUX_K_OUT;
        if (S_ISCHR(st.st_mode))
                return MUX_K_PTY;
        if (S_ISREG(st.st_mode))
                return MUX_K_FILE;
        return -EBADF;
}

/* --------------------------------------------------------------- channels */

static gchan *chan_find(uint32_t id) {
        for (gchan *c = chans; c; c = c->next)
                if (c->id == id)
                        return c;
        return NULL;
}

static void chan_release(source *src) {
        gchan *c = (gchan *) src;
        gbufs_free(c->q);
        free(c);
}

static void chan_drop(gchan *c, bool tell) {
        for (gchan **p = &chans; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        if (tell)
                link_send(mux_link_send(&mlink, MUX_CLOSE, c->id, NULL, 0));
        source_kill(&c->src); /* init sees the hangup and closes its end */
}

static void chan_update(gchan *c) {
        uint32_t ev = 0;
        if (mlink.tx_bytes < GUEST_TX_HIGH && !sync_asked)
                ev |= EPOLLIN;
        if (c->q)
                ev |= EPOLLOUT;
        if (source_set_events(&c->src, ev) < 0)
                chan_drop(c, true);
}

/* One frame (and its descriptors) from init: out as a MSG. */
static int chan_read_one(gchan *c) {
        static uint8_t buf[INITPROTO_MAX_FRAME];
        int fds[INITPROTO_MAX_FDS];
        size_t n_fds = 0;

        ssize_t n = fd_recv_with_fds(c->src.fd, buf, sizeof buf, fds, INITPROTO_MAX_FDS, &n_fds, MSG_DONTWAIT);
        if (n == -EAGAIN)
                return 0;
        if (n < 0)
                return (int) n;
        if (n == 0) {
                for (size_t i = 0; i < n_fds; i++)
                        close(fds[i]);
                return -ECONNRESET;
        }

        /* an exit event: the output before it first */
        if (n >= 6 && (buf[4] | buf[5] << 8) == INITPROTO_EV_EXIT && !sync_asked)
                drain_out_streams();
        uint8_t head[1 + MUX_MAX_STREAMS_PER_MSG * 5];
        gstream *made[INITPROTO_MAX_FDS];
        head[0] = 0;
        for (size_t i = 0; i < n_fds; i++) {
                int kind = fd_kind(fds[i]);
                gstream *s = kind > 0 && head[0] < MUX_MAX_STREAMS_PER_MSG ? stream_new(fds[i], (uint8_t) kind) : NULL;
                if (!s) {
                        /* The relay will see fewer descriptors than the frame
                         * promises and the engine refuses the reply. */
                        close(fds[i]);
                        continue;
                }
                uint8_t *p = head + 1 + head[0] * 5;
                mux_put_u32(p, s->id);
                p[4] = (uint8_t) kind;
                made[head[0]] = s;
                head[0]++;
        }
        unsigned n_made = head[0];
        link_send(mux_link_send2(&mlink, MUX_MSG, c->id, head, 1 + n_made * 5u, buf, (size_t) n));
        for (unsigned i = 0; i < n_made; i++)
                stream_update(made[i]);
        return 1;
}

static void chan_write(gchan *c) {
        while (c->q) {
                gbuf *b = c->q;
                ssize_t n = send(c->src.fd, b->data, b->len, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return;
                        chan_drop(c, true);
                        return;
                }
                c->q = b->next;
                if (!c->q)
                        c->q_tail = &c->q;
                c->q_bytes -= b->len;
                free(b);
        }
}

static void chan_dispatch(source *src, uint32_t events) {
        gchan *c = (gchan *) src;
        if (events & EPOLLOUT)
                chan_write(c);
        if (c->src.dead)
                return;
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                for (unsigned i = 0; i < 16 && mlink.tx_bytes < GUEST_TX_HIGH; i++) {
                        int r = chan_read_one(c);
                        if (r < 0) {
                                chan_drop(c, true);
                                return;
                        }
                        if (r == 0)
                                break;
                }
        }
        chan_update(c);
}

static int chan_open(uint32_t id, bool creator) {
        if (chan_find(id))
                return -EEXIST;
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp) < 0)
                return negative_errno();
        gchan *c = calloc(1, sizeof *c);
        if (!c) {
                close(sp[0]);
                close(sp[1]);
                return -ENOMEM;
        }
        c->src = (source) { .fd = sp[0], .dispatch = chan_dispatch, .release = chan_release };
        c->id = id;
        c->q_tail = &c->q;
        int r = source_add(&c->src, EPOLLIN);
        if (r < 0) {
                close(sp[0]);
                close(sp[1]);
                free(c);
                return r;
        }
        r = conn_new(sp[1], creator);
        if (r < 0) {
                close(sp[1]);
                source_kill(&c->src);
                return r;
        }
        c->next = chans;
        chans = c;
        return 0;
}

/* ------------------------------------------------------------ egress */

static void net_dispatch(source *src, uint32_t events) {
        for (unsigned i = 0; i < 16 && !sync_asked; i++) {
                int fd = accept4(src->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                        return;
                int one = 1;
                (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                gstream *s = n_net < GUEST_MAX_NET ? stream_new(fd, 0) : NULL;
                if (!s) {
                        close(fd);
                        continue;
                }
                n_net++;
                link_send(mux_link_send(&mlink, MUX_NET, s->id, NULL, 0));
                stream_update(s);
        }
}

static void noop_release(source *s) {
}

/* ---------------------------------------------------------------- the link */

static void gbuf_push(gbuf **head, gbuf ***tail, size_t *bytes, const uint8_t *p, size_t n) {
        gbuf *b = malloc(sizeof *b + n);
        if (!b)
                fatal_link(-ENOMEM);
        b->next = NULL;
        b->len = n;
        b->off = 0;
        memcpy(b->data, p, n);
        **tail = b;
        *tail = &b->next;
        *bytes += n;
}

static void guest_update_all(void) {
        for (gchan *c = chans; c;) {
                gchan *n = c->next;
                chan_update(c);
                c = n;
        }
        for (gstream *s = streams; s;) {
                gstream *n = s->next;
                stream_update(s);
                s = n;
        }
        (void) source_set_events(&net_listener, sync_asked ? 0 : EPOLLIN);
}

static int on_frame(const mux_frame *f, void *userdata) {
        gchan *c;
        gstream *s;

        switch (f->type) {
        case MUX_OPEN:
                if (chan_open(f->id, f->payload[0] == 1) < 0)
                        link_send(mux_link_send(&mlink, MUX_CLOSE, f->id, NULL, 0));
                return 0;
        case MUX_CLOSE:
                if ((c = chan_find(f->id)))
                        chan_drop(c, false);
                return 0;
        case MUX_MSG:
                if (!(c = chan_find(f->id)))
                        return 0;
                if (c->q_bytes + f->payload_len > GUEST_CHAN_QUEUE_MAX) {
                        chan_drop(c, true);
                        return 0;
                }
                gbuf_push(&c->q, &c->q_tail, &c->q_bytes, f->payload, f->payload_len);
                chan_write(c);
                if (!c->src.dead)
                        chan_update(c);
                return 0;
        case MUX_DATA:
                if (!(s = stream_find(f->id)) || !stream_writes(s) || s->in_eof)
                        return 0;
                if (mux_bufq_push(&s->q, f->payload, f->payload_len) < 0)
                        fatal_link(-ENOMEM);
                stream_write(s);
                if (!s->src.dead)
                        stream_update(s);
                return 0;
        case MUX_EOF:
                if (!(s = stream_find(f->id)))
                        return 0;
                s->in_eof = true;
                stream_write(s);
                if (!s->src.dead)
                        stream_update(s);
                return 0;
        case MUX_WINDOW:
                if (!(s = stream_find(f->id)))
                        return 0;
                uint32_t add = mux_get_u32(f->payload);
                s->credit = add > MUX_WINDOW_BYTES - s->credit ? MUX_WINDOW_BYTES : s->credit + add;
                stream_update(s);
                return 0;
        case MUX_RESET:
                if ((s = stream_find(f->id)))
                        stream_drop(s);
                return 0;
        case MUX_SYNC:
                sync_asked = true;
                synced_sent = false;
                guest_update_all();
                return 0;
        case MUX_UNSYNC:
                sync_asked = synced_sent = false;
                guest_update_all();
                reports_flush();
                return 0;
        case MUX_RESYNC:
                /* restored from a checkpoint, talking to a new relay: what
                 * the old one had is gone. Processes keep running; their
                 * output waits in init's pipes for an ATTACH. */
                while (chans)
                        chan_drop(chans, false);
                while (streams)
                        stream_drop(streams);
                sync_asked = synced_sent = false;
                /* the epoll set as the restore left it cannot be trusted:
                 * the link's host descriptors are new (their readiness was
                 * never reported), the egress listener's registration does
                 * not fire (connections waited in its backlog forever), and
                 * registrations of descriptors closed before the checkpoint
                 * came back. A new set with what is registered now. */
                if (loop_rebuild() < 0)
                        log_debug("rebuilding the epoll set after a restore: %m");
                (void) source_set_events(&wlink_src, 0);
                /* listen anew; the daemon turns the listener on again */
                source_remove(&net_listener);
                memwatch_restored();
                layer_watch_restored();
                link_send(mux_link_send_u32(&mlink, MUX_HELLO, 0, MUX_VERSION));
                reports_flush();
                return 0;
        default:
                return 0; /* NET and HELLO only go the other way */
        }
}

static bool disk_pending;
static uint64_t disk_used;

static void reports_flush(void) {
        if (sync_asked)
                return;
        if (oom_pending) {
                link_send(mux_link_send_u32(&mlink, MUX_OOM, 0, oom_pending));
                oom_pending = 0;
        }
        if (disk_pending) {
                uint8_t v[8];
                mux_put_u64(v, disk_used);
                link_send(mux_link_send(&mlink, MUX_DISK, 0, v, sizeof v));
                disk_pending = false;
        }
}

void guest_report_disk(uint64_t used) {
        disk_used = used;
        disk_pending = true;
        reports_flush();
}

void guest_report_oom_kill(void) {
        if (oom_pending < UINT32_MAX)
                oom_pending++;
        reports_flush();
}

/* After the link's queue changed: write it, and start or stop reading the
 * channels and streams that feed it. */
static void link_update(void) {
        static bool in_update;
        if (in_update)
                return;
        in_update = true;
        int r = mux_link_flush(&mlink);
        if (r < 0)
                fatal_link(r);
        if (sync_asked && !synced_sent && !mlink.txq) {
                synced_sent = true;
                if ((r = mux_link_send(&mlink, MUX_SYNCED, 0, NULL, 0)) < 0 || (r = mux_link_flush(&mlink)) < 0)
                        fatal_link(r);
        }
        (void) source_set_events(&mlink_src, EPOLLIN);
        (void) source_set_events(&wlink_src, mlink.txq ? EPOLLOUT : 0);
        /* Crossing the mark starts or stops every reader that feeds the mlink;
         * between crossings each one's own update gets it right. */
        static bool was_high;
        bool high = mlink.tx_bytes >= GUEST_TX_HIGH;
        if (high != was_high) {
                was_high = high;
                for (gchan *c = chans; c;) {
                        gchan *n = c->next;
                        chan_update(c);
                        c = n;
                }
                for (gstream *s = streams; s;) {
                        gstream *n = s->next;
                        stream_update(s);
                        s = n;
                }
        }
        in_update = false;
}

static void link_dispatch(source *src, uint32_t events) {
        if (events & EPOLLOUT)
                link_update();
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                int r = mux_link_read(&mlink, on_frame, NULL, 64);
                if (r < 0)
                        fatal_link(r);
        }
        link_update();
}

int guest_net_listen(bool on) {
        if (!on) {
                /* connections already made stay: the proxy decides about those */
                source_remove(&net_listener);
                return 0;
        }
        if (net_listener.fd >= 0 || !net_port)
                return 0;
        int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(net_port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        int one = 1;
        if (l < 0)
                return negative_errno();
        (void) setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(l, 128) < 0) {
                int r = negative_errno();
                close(l);
                return r;
        }
        net_listener = (source) { .fd = l, .dispatch = net_dispatch, .release = noop_release };
        int r = source_add(&net_listener, sync_asked ? 0 : EPOLLIN);
        if (r < 0)
                net_listener.fd = safe_close(l);
        return r;
}

int guest_setup(int stream_fd, uint16_t egress_port) {
        /* runsc imports the container's stdin read-only: read the mux from
         * there, write it to stdout (the same host socket) */
        int wfd = stream_fd + 1;
        for (int fd = stream_fd; fd <= wfd; fd++) {
                int fl = fcntl(fd, F_GETFL);
                if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
                        return negative_errno();
        }
        int r = mux_link_init(&mlink, stream_fd, wfd);
        if (r < 0)
                return r;
        mlink_src = (source) { .fd = stream_fd, .dispatch = link_dispatch, .release = noop_release };
        if ((r = source_add(&mlink_src, EPOLLIN)) < 0)
                return r;
        wlink_src = (source) { .fd = wfd, .dispatch = link_dispatch, .release = noop_release };
        if ((r = source_add(&wlink_src, 0)) < 0)
                return r;

        net_port = egress_port;
        link_send(mux_link_send_u32(&mlink, MUX_HELLO, 0, MUX_VERSION));
        return 0;
}
