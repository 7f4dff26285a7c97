/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host relay of a gVisor sandbox: hutch-init's binary started by the
 * engine as
 *
 *   hutch-init --gvisor-relay UID MAX_FILE SCRATCH_DIR EGRESS_PORT -- RUNSC ARGS...
 *
 * with fd 3 a listening SOCK_SEQPACKET socket (the sandbox's sock/init.sock)
 * and fd 4 the creator's connection, in the sandbox's cgroup and its own
 * network namespace. It starts runsc (as root, with the mux socket as the
 * container's stdin and stdout), then drops to UID for good and relays: each
 * host client is a mux channel to init inside; each stream a MSG declares
 * becomes a host object the relay makes itself: a pipe (OUT, IN), a pty
 * (PTY) or an unlinked file filled to EOF before the reply is passed on
 * (FILE). The engine and the daemon see what the namespace backend gives
 * them: frames with SCM_RIGHTS descriptors.
 *
 * Every byte from the guest is hostile: a malformed frame ends the relay
 * (and with it the sandbox's reachability); DATA beyond a stream's window or
 * a file beyond MAX_FILE resets the stream. The relay holds at most
 * RELAY_CHAN_QUEUE_MAX per channel for a client that does not read.
 *
 * The relay exits when runsc does: the sandbox is over.
 *
 * Once set up (runsc started, privileges dropped, its loop's descriptors
 * made) and before it reads a byte of the guest's, the relay loads its own
 * seccomp filter (lib/sandbox/seccomp-relay.c, compiled at build time): the
 * calls its loop makes and nothing else, which kills it.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "init.h"
#include "util/fdutil.h"
#include "mux.h"
#include "relay-seccomp.h"

#define RELAY_LISTEN_FD 3
#define RELAY_CREATOR_FD 4
#define RELAY_MAX_CLIENTS 64
#define RELAY_MAX_STREAMS 4096
#define RELAY_TX_HIGH (1024 * 1024)
#define RELAY_CHAN_QUEUE_MAX (4 * 1024 * 1024)
/* Host ptys are a host-wide budget (kernel.pty.max) and whole files take
 * host disk: a sandbox gets this many at a time. */
#define RELAY_MAX_PTYS 64
#define RELAY_MAX_FILES 16

/* A reply from init on its way to a client: held until its files are whole. */
typedef struct rmsg {
        struct rmsg *next;
        size_t len;
        int fds[MUX_MAX_STREAMS_PER_MSG];
        size_t n_fds;
        unsigned files_pending;
        uint8_t data[];
} rmsg;

typedef struct rchan {
        source src;
        uint32_t id;
        rmsg *q, **q_tail;
        size_t q_bytes;
        struct rchan *next;
} rchan;

typedef struct rstream {
        source src;        /* not registered for FILE streams */
        uint32_t id;
        uint8_t kind;      /* MUX_K_*, 0: an egress connection */
        uint32_t credit;   /* bytes we may still send to the guest */
        mux_bufq q;        /* guest → fd */
        uint32_t unacked;
        bool in_eof, out_eof, connecting;
        uint64_t file_bytes;
        rmsg *msg;         /* FILE: the reply waiting for us */
        rchan *chan;
        struct rstream *next;
} rstream;

static mux_link mlink;
static source mlink_src, listener, sigchld;
static rchan *chans;
static rstream *streams;
static unsigned n_clients, n_streams, n_ptys, n_files;
static uint32_t next_chan_id = 1;
static pid_t runsc_pid;
static uint64_t max_file;
static int scratch_fd = -1;
/* the scratch dir's oom-kills and disk-used, opened at set-up (the filter
 * lets nothing be created by name later) */
static int oom_kills_fd = -1, disk_used_fd = -1;
/* set once the relay is the sandbox's uid: runsc (root) is out of reach of
 * kill() from then on, and PR_SET_PDEATHSIG takes it down with us */
static bool dropped;
#define RELAY_OOM_KILLS_MAX (64 * 1024)
static uint16_t egress_port;
/* started by `runsc restore`: the guest still has the old relay's state */
static bool restored;
/* RELAY_SYNC in progress or done: frames for the guest wait in heldq */
static bool holding;
static mux_link heldq;
static rchan *sync_chan;
static uint32_t sync_id;

static void link_update(void);

/* Where a frame for the guest goes: the link, or held during a SYNC. */
#define GL (holding ? &heldq : &mlink)

_noreturn_ static void relay_exit(const char *why, int r) {
        fprintf(stderr, "hutch-relay: %s: %s\n", why, strerror(-r));
        /* runsc (and the sandbox) go too: nothing could reach them. After
         * the drop, its PR_SET_PDEATHSIG does it (a kill() would be EPERM,
         * and the filter does not allow one). */
        if (runsc_pid > 0 && !dropped)
                (void) kill(runsc_pid, SIGKILL);
        _exit(r < 0 ? 1 : 0);
}

static void link_send(int r) {
        if (r < 0)
                relay_exit("queueing on the link", r);
        link_update();
}

static void rmsg_free(rmsg *m) {
        for (size_t i = 0; i < m->n_fds; i++)
                safe_close(m->fds[i]);
        free(m);
}

/* ---------------------------------------------------------------- channels */

static rchan *chan_find(uint32_t id) {
        for (rchan *c = chans; c; c = c->next)
                if (c->id == id)
                        return c;
        return NULL;
}

static void chan_release(source *src) {
        rchan *c = (rchan *) src;
        while (c->q) {
                rmsg *m = c->q;
                c->q = m->next;
                rmsg_free(m);
        }
        free(c);
}

static void stream_drop(rstream *s);
static void relay_unsync(void);

static void chan_drop(rchan *c, bool tell) {
        for (rchan **p = &chans; *p; p = &(*p)->next)
                if (*p == c) {
                        *p = c->next;
                        break;
                }
        n_clients--;
        /* a checkpoint's client gone mid-way: never leave the sandbox quiet */
        if (sync_chan == c)
                relay_unsync();
        /* FILE streams of held replies go with them; other streams stay:
         * the client may still hold their host ends */
        for (rstream *s = streams; s;) {
                rstream *n = s->next;
                if (s->chan == c && s->kind == MUX_K_FILE) {
                        if (!s->out_eof)
                                link_send(mux_link_send(GL, MUX_RESET, s->id, NULL, 0));
                        stream_drop(s);
                }
                s = n;
        }
        if (tell)
                link_send(mux_link_send(GL, MUX_CLOSE, c->id, NULL, 0));
        source_kill(&c->src);
}

/* Pass on the replies at the head that are whole. */
static void chan_flush(rchan *c) {
        while (c->q && c->q->files_pending == 0) {
                rmsg *m = c->q;
                int r = fd_send_with_fds(c->src.fd, m->data, m->len, m->fds, m->n_fds);
                if (r == -EAGAIN)
                        break;
                if (r < 0) {
                        chan_drop(c, true);
                        return;
                }
                c->q = m->next;
                if (!c->q)
                        c->q_tail = &c->q;
                c->q_bytes -= m->len;
                rmsg_free(m); /* our copies; the client has its own now */
        }
}

static void chan_update(rchan *c) {
        uint32_t ev = 0;
        if (c->src.dead)
                return;
        if (mlink.tx_bytes < RELAY_TX_HIGH)
                ev |= EPOLLIN;
        if (c->q && c->q->files_pending == 0)
                ev |= EPOLLOUT;
        if (source_set_events(&c->src, ev) < 0)
                chan_drop(c, true);
}

/* A reply of the relay's own (RELAY_SYNC, RELAY_UNSYNC), queued like init's. */
static void chan_reply(rchan *c, uint32_t id, int err, const char *msg) {
        initproto_writer *w = msg_begin(err ? INITPROTO_ERROR : INITPROTO_OK, 0, id);
        if (err) {
                initproto_put_u64(w, T_ERRNO, (uint64_t) err);
                initproto_put_str(w, T_MESSAGE, msg);
        }
        int len = initproto_finish(w);
        if (len < 0)
                return;
        rmsg *m = calloc(1, sizeof *m + (size_t) len);
        if (!m)
                relay_exit("out of memory", -ENOMEM);
        m->len = (size_t) len;
        memcpy(m->data, w->buf, (size_t) len);
        *c->q_tail = m;
        c->q_tail = &m->next;
        c->q_bytes += m->len;
        chan_flush(c);
        if (!c->src.dead)
                chan_update(c);
}

static void relay_unsync(void) {
        if (!holding)
                return;
        int r = mux_link_send(&mlink, MUX_UNSYNC, 0, NULL, 0);
        if (r < 0)
                relay_exit("queueing on the link", r);
        holding = false;
        sync_chan = NULL;
        mux_link_append(&mlink, &heldq);
        link_update();
}

/* RELAY_SYNC and RELAY_UNSYNC are the relay's: 1 when m was one of them. */
static int relay_request(rchan *c, const initproto_msg *m) {
        if (m->type == INITPROTO_RELAY_SYNC) {
                if (holding) {
                        chan_reply(c, m->id, EBUSY, "a checkpoint of this sandbox is already in progress");
                        return 1;
                }
                int r = mux_link_send(&mlink, MUX_SYNC, 0, NULL, 0);
                if (r < 0)
                        relay_exit("queueing on the link", r);
                holding = true;
                sync_chan = c;
                sync_id = m->id;
                link_update();
                return 1;
        }
        if (m->type == INITPROTO_RELAY_UNSYNC) {
                relay_unsync();
                chan_reply(c, m->id, 0, NULL);
                return 1;
        }
        return 0;
}

static int chan_read_one(rchan *c) {
        static uint8_t buf[INITPROTO_MAX_FRAME];
        /* clients send no descriptors: any are closed */
        ssize_t n = fd_recv_with_fds(c->src.fd, buf, sizeof buf, NULL, 0, NULL, MSG_DONTWAIT);
        if (n == -EAGAIN)
                return 0;
        if (n == -EMSGSIZE)
                return -EBADMSG;
        if (n < 0)
                return (int) n;
        if (n == 0)
                return -ECONNRESET;
        initproto_msg m;
        if (initproto_parse(buf, (size_t) n, &m) < 0)
                return -EBADMSG;
        if (relay_request(c, &m))
                return 1;
        link_send(mux_link_send(GL, MUX_MSG, c->id, buf, (size_t) n));
        return 1;
}

static void chan_dispatch(source *src, uint32_t events) {
        rchan *c = (rchan *) src;
        if (events & EPOLLOUT)
                chan_flush(c);
        if (c->src.dead)
                return;
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                for (unsigned i = 0; i < 16 && mlink.tx_bytes < RELAY_TX_HIGH; i++) {
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

static int chan_new(int fd, bool creator) {
        rchan *c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->src = (source) { .fd = fd, .dispatch = chan_dispatch, .release = chan_release };
        c->q_tail = &c->q;
        do
                c->id = next_chan_id++;
        while (c->id == 0 || chan_find(c->id));
        int r = source_add(&c->src, EPOLLIN);
        if (r < 0) {
                free(c);
                return r;
        }
        c->next = chans;
        chans = c;
        n_clients++;
        uint8_t cr = creator ? 1 : 0;
        link_send(mux_link_send(GL, MUX_OPEN, c->id, &cr, 1));
        return 0;
}

static void listener_dispatch(source *s, uint32_t events) {
        for (unsigned i = 0; i < 16; i++) {
                int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                        return;
                if (n_clients >= RELAY_MAX_CLIENTS || chan_new(fd, false) < 0)
                        close(fd);
        }
}

/* ----------------------------------------------------------------- streams */

static rstream *stream_find(uint32_t id) {
        for (rstream *s = streams; s; s = s->next)
                if (s->id == id)
                        return s;
        return NULL;
}

static void stream_release(source *src) {
        rstream *s = (rstream *) src;
        mux_bufq_clear(&s->q);
        free(s);
}

static void stream_drop(rstream *s) {
        for (rstream **p = &streams; *p; p = &(*p)->next)
                if (*p == s) {
                        *p = s->next;
                        break;
                }
        n_streams--;
        if (s->kind == MUX_K_PTY)
                n_ptys--;
        if (s->kind == MUX_K_FILE)
                n_files--;
        if (s->kind == MUX_K_FILE) {
                /* the descriptor belongs to the held reply */
                s->src.fd = -1;
                free(s);
                return;
        }
        source_kill(&s->src);
}

static bool stream_reads(const rstream *s) {
        /* what the host side writes, we read and send to the guest */
        return s->kind == MUX_K_IN || s->kind == MUX_K_PTY || s->kind == 0;
}

static bool stream_writes(const rstream *s) {
        return s->kind == MUX_K_OUT || s->kind == MUX_K_PTY || s->kind == 0;
}

static void stream_update(rstream *s) {
        if (s->src.dead || s->kind == MUX_K_FILE)
                return;
        uint32_t ev = 0;
        if (s->connecting)
                ev = EPOLLOUT;
        else {
                if (stream_reads(s) && !s->out_eof && s->credit > 0 && mlink.tx_bytes < RELAY_TX_HIGH)
                        ev |= EPOLLIN;
                if (s->q.head)
                        ev |= EPOLLOUT;
        }
        if (source_set_events(&s->src, ev) < 0) {
                link_send(mux_link_send(GL, MUX_RESET, s->id, NULL, 0));
                stream_drop(s);
        }
}

static void stream_maybe_done(rstream *s) {
        bool in_done = !stream_writes(s) || (s->in_eof && !s->q.head);
        bool out_done = !stream_reads(s) || s->out_eof;
        if (in_done && out_done)
                stream_drop(s);
}

static void stream_reset(rstream *s) {
        link_send(mux_link_send(GL, MUX_RESET, s->id, NULL, 0));
        stream_drop(s);
}

static void stream_read(rstream *s) {
        static uint8_t buf[MUX_MAX_DATA];
        size_t want = s->credit < sizeof buf ? s->credit : sizeof buf;
        ssize_t n = read(s->src.fd, buf, want);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n < 0 && s->kind == MUX_K_PTY) {
                /* EIO: every copy of the master is closed; the process
                 * keeps its terminal inside, as when a client detaches */
                stream_reset(s);
                return;
        }
        if (n <= 0) {
                s->out_eof = true;
                link_send(mux_link_send(GL, MUX_EOF, s->id, NULL, 0));
                stream_maybe_done(s);
                return;
        }
        s->credit -= (uint32_t) n;
        link_send(mux_link_send(GL, MUX_DATA, s->id, buf, (size_t) n));
}

static void stream_write(rstream *s) {
        uint32_t wrote = 0;
        if (mux_bufq_write(&s->q, s->src.fd, &wrote) < 0) {
                stream_reset(s); /* EPIPE: the client closed its end */
                return;
        }
        s->unacked += wrote;
        if (s->unacked >= MUX_WINDOW_BYTES / 4 || (!s->q.head && s->unacked)) {
                link_send(mux_link_send_u32(GL, MUX_WINDOW, s->id, s->unacked));
                s->unacked = 0;
        }
        if (!s->q.head && s->in_eof) {
                if (s->kind == MUX_K_OUT || s->kind == MUX_K_PTY) {
                        /* closing the write end (or the pty slave) is the EOF */
                        stream_drop(s);
                        return;
                }
                if (s->kind == 0)
                        (void) shutdown(s->src.fd, SHUT_WR);
        }
        stream_maybe_done(s);
}

static void stream_dispatch(source *src, uint32_t events) {
        rstream *s = (rstream *) src;
        if (s->connecting) {
                int err = 0;
                socklen_t len = sizeof err;
                if (getsockopt(s->src.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
                        stream_reset(s);
                        return;
                }
                s->connecting = false;
                events |= EPOLLOUT;
        }
        if (events & EPOLLOUT)
                stream_write(s);
        if (s->src.dead)
                return;
        if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && stream_reads(s) && !s->out_eof && s->credit > 0)
                stream_read(s);
        else if ((events & (EPOLLHUP | EPOLLERR)) && !stream_reads(s) && !(events & EPOLLOUT)) {
                stream_reset(s);
                return;
        }
        if (!s->src.dead)
                stream_update(s);
}

static rstream *stream_new(uint32_t id, uint8_t kind, int fd) {
        if (n_streams >= RELAY_MAX_STREAMS || stream_find(id))
                return NULL;
        if ((kind == MUX_K_PTY && n_ptys >= RELAY_MAX_PTYS) || (kind == MUX_K_FILE && n_files >= RELAY_MAX_FILES))
                return NULL;
        rstream *s = calloc(1, sizeof *s);
        if (!s)
                return NULL;
        s->src = (source) { .fd = fd, .dispatch = stream_dispatch, .release = stream_release };
        s->id = id;
        s->kind = kind;
        s->credit = MUX_WINDOW_BYTES;
        mux_bufq_init(&s->q);
        if (kind != MUX_K_FILE && source_add(&s->src, 0) < 0) {
                free(s);
                return NULL;
        }
        s->next = streams;
        streams = s;
        n_streams++;
        n_ptys += kind == MUX_K_PTY;
        n_files += kind == MUX_K_FILE;
        return s;
}

/* The host side of a declared stream: *ret_ours is what the relay pumps,
 * *ret_theirs what the client gets. */
static int host_ends(uint8_t kind, int *ret_ours, int *ret_theirs) {
        int p[2];
        switch (kind) {
        case MUX_K_OUT:
                if (pipe2(p, O_CLOEXEC) < 0)
                        return negative_errno();
                *ret_theirs = p[0];
                *ret_ours = p[1];
                break;
        case MUX_K_IN:
                if (pipe2(p, O_CLOEXEC) < 0)
                        return negative_errno();
                *ret_theirs = p[1];
                *ret_ours = p[0];
                break;
        case MUX_K_PTY: {
                int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
                char name[64];
                if (m < 0)
                        return negative_errno();
                if (unlockpt(m) < 0 || ptsname_r(m, name, sizeof name) != 0) {
                        close(m);
                        return -EIO;
                }
                int sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
                struct termios t;
                if (sl < 0 || tcgetattr(sl, &t) < 0) {
                        if (sl >= 0)
                                close(sl);
                        close(m);
                        return -EIO;
                }
                /* the terminal that matters is inside: this one passes bytes */
                cfmakeraw(&t);
                (void) tcsetattr(sl, TCSANOW, &t);
                *ret_theirs = m;
                *ret_ours = sl;
                break;
        }
        case MUX_K_FILE: {
                int f = openat(scratch_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                if (f < 0)
                        return negative_errno();
                *ret_theirs = f;
                *ret_ours = f;
                break;
        }
        default:
                return -EBADMSG;
        }
        if (kind != MUX_K_FILE) {
                int fl = fcntl(*ret_ours, F_GETFL);
                (void) fcntl(*ret_ours, F_SETFL, fl | O_NONBLOCK);
        }
        return 0;
}

/* A reply from init: its streams made on this side, then queued (and
 * passed on once its files are whole). */
static void on_msg(rchan *c, const mux_frame *f) {
        mux_stream_decl decl[MUX_MAX_STREAMS_PER_MSG];
        const uint8_t *frame;
        size_t frame_len;
        int n = mux_msg_split(f->payload, f->payload_len, decl, &frame, &frame_len);
        initproto_msg im;
        if (n < 0 || initproto_parse(frame, frame_len, &im) < 0)
                relay_exit("a malformed reply from the guest", -EBADMSG);
        rmsg *m = calloc(1, sizeof *m + frame_len);
        if (!m)
                relay_exit("out of memory", -ENOMEM);
        m->len = frame_len;
        memcpy(m->data, frame, frame_len);
        for (int i = 0; i < n; i++) {
                int ours = -1, theirs = -1;
                rstream *s = NULL;
                bool capped = (decl[i].kind == MUX_K_PTY && n_ptys >= RELAY_MAX_PTYS) ||
                              (decl[i].kind == MUX_K_FILE && n_files >= RELAY_MAX_FILES);
                if (capped || host_ends(decl[i].kind, &ours, &theirs) < 0 ||
                    !(s = stream_new(decl[i].id, decl[i].kind, ours))) {
                        if (ours >= 0)
                                close(ours);
                        if (theirs >= 0 && theirs != ours)
                                close(theirs);
                        /* the reply goes on with fewer descriptors than it
                         * promises: the engine refuses it */
                        link_send(mux_link_send(GL, MUX_RESET, decl[i].id, NULL, 0));
                        continue;
                }
                s->chan = c;
                if (decl[i].kind == MUX_K_FILE) {
                        s->msg = m;
                        m->files_pending++;
                }
                m->fds[m->n_fds++] = theirs;
                stream_update(s);
        }
        if (c->q_bytes + frame_len > RELAY_CHAN_QUEUE_MAX) {
                rmsg_free(m);
                chan_drop(c, true);
                return;
        }
        *c->q_tail = m;
        c->q_tail = &m->next;
        c->q_bytes += frame_len;
        chan_flush(c);
        if (!c->src.dead)
                chan_update(c);
}

static void file_done(rstream *s, bool ok) {
        rmsg *m = s->msg;
        rchan *c = s->chan;
        if (!ok) {
                /* Too large or unwritable: the reply becomes an error with
                 * the request's id, and nothing of the file is passed on. */
                initproto_msg im;
                (void) initproto_parse(m->data, m->len, &im);
                initproto_writer *w = msg_begin(INITPROTO_ERROR, 0, im.id);
                initproto_put_u64(w, T_ERRNO, EFBIG);
                initproto_put_str(w, T_MESSAGE, "the file is larger than the relay passes on (the sandbox's disk limit)");
                int len = initproto_finish(w);
                for (size_t i = 0; i < m->n_fds; i++)
                        m->fds[i] = safe_close(m->fds[i]);
                m->n_fds = 0;
                if (len > 0 && (size_t) len <= m->len) {
                        memcpy(m->data, w->buf, (size_t) len);
                        m->len = (size_t) len;
                }
        } else {
                for (size_t i = 0; i < m->n_fds; i++)
                        if (m->fds[i] == s->src.fd)
                                (void) lseek(m->fds[i], 0, SEEK_SET);
        }
        m->files_pending--;
        stream_drop(s);
        chan_flush(c);
        if (!c->src.dead)
                chan_update(c);
}

static void on_file_data(rstream *s, const mux_frame *f) {
        if (s->file_bytes + f->payload_len > max_file) {
                link_send(mux_link_send(GL, MUX_RESET, s->id, NULL, 0));
                file_done(s, false);
                return;
        }
        size_t off = 0;
        while (off < f->payload_len) {
                ssize_t n = write(s->src.fd, f->payload + off, f->payload_len - off);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        link_send(mux_link_send(GL, MUX_RESET, s->id, NULL, 0));
                        file_done(s, false);
                        return;
                }
                off += (size_t) n;
        }
        s->file_bytes += f->payload_len;
        link_send(mux_link_send_u32(GL, MUX_WINDOW, s->id, f->payload_len));
}

static void on_net(uint32_t id) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(egress_port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        rstream *s = NULL;
        if (fd >= 0 && egress_port) {
                int one = 1;
                (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                if (connect(fd, (struct sockaddr *) &sa, sizeof sa) == 0 || errno == EINPROGRESS)
                        s = stream_new(id, 0, fd);
        }
        if (!s) {
                if (fd >= 0)
                        close(fd);
                link_send(mux_link_send(GL, MUX_RESET, id, NULL, 0));
                return;
        }
        s->connecting = true;
        stream_update(s);
}

/* -------------------------------------------------------------- the link */

static bool guest_said_hello;

/* The guest killed n processes over the memory limit: one byte each in the
 * scratch dir's "oom-kills", which the engine's stats count (the file
 * outlives this relay across a checkpoint's restore). Capped. */
static void count_oom_kills(uint32_t n) {
        static const uint8_t ones[256] = { 0 };
        struct stat st;
        if (oom_kills_fd >= 0 && fstat(oom_kills_fd, &st) == 0 && st.st_size < RELAY_OOM_KILLS_MAX)
                (void) !write(oom_kills_fd, ones, MIN(n, sizeof ones));
}

/* The guest's latest count of the writable layer's bytes, as 8 bytes
 * (little-endian) in the scratch dir's "disk-used", which the engine's
 * stats read (clamped to the disk limit there: the guest is not trusted). */
static void note_disk_used(const uint8_t *v) {
        if (disk_used_fd >= 0)
                (void) !pwrite(disk_used_fd, v, 8, 0);
}

static int on_frame(const mux_frame *f, void *userdata) {
        rchan *c;
        rstream *s;

        if (!guest_said_hello && f->type != MUX_HELLO)
                return -EPROTO;
        switch (f->type) {
        case MUX_HELLO:
                if (guest_said_hello || mux_get_u32(f->payload) != MUX_VERSION)
                        return -EPROTO;
                guest_said_hello = true;
                return 0;
        case MUX_CLOSE:
                if ((c = chan_find(f->id)))
                        chan_drop(c, false);
                return 0;
        case MUX_MSG:
                if ((c = chan_find(f->id)))
                        on_msg(c, f);
                else {
                        /* a reply for a client that left: make and drop its
                         * streams so the guest stops pumping them */
                        mux_stream_decl decl[MUX_MAX_STREAMS_PER_MSG];
                        const uint8_t *frame;
                        size_t frame_len;
                        int n = mux_msg_split(f->payload, f->payload_len, decl, &frame, &frame_len);
                        if (n < 0)
                                return -EBADMSG;
                        for (int i = 0; i < n; i++)
                                link_send(mux_link_send(GL, MUX_RESET, decl[i].id, NULL, 0));
                }
                return 0;
        case MUX_DATA:
                if (!(s = stream_find(f->id)) || s->in_eof || (!stream_writes(s) && s->kind != MUX_K_FILE))
                        return 0;
                if (s->kind == MUX_K_FILE) {
                        on_file_data(s, f);
                        return 0;
                }
                if (s->q.bytes + f->payload_len > MUX_WINDOW_BYTES) {
                        stream_reset(s); /* past its window */
                        return 0;
                }
                if (mux_bufq_push(&s->q, f->payload, f->payload_len) < 0)
                        relay_exit("out of memory", -ENOMEM);
                if (!s->connecting)
                        stream_write(s);
                if (!s->src.dead)
                        stream_update(s);
                return 0;
        case MUX_EOF:
                if (!(s = stream_find(f->id)))
                        return 0;
                if (s->kind == MUX_K_FILE) {
                        file_done(s, true);
                        return 0;
                }
                s->in_eof = true;
                if (!s->connecting)
                        stream_write(s);
                if (!s->src.dead)
                        stream_update(s);
                return 0;
        case MUX_WINDOW:
                if (!(s = stream_find(f->id)) || s->kind == MUX_K_FILE)
                        return 0;
                uint32_t add = mux_get_u32(f->payload);
                s->credit = add > MUX_WINDOW_BYTES - s->credit ? MUX_WINDOW_BYTES : s->credit + add;
                stream_update(s);
                return 0;
        case MUX_RESET:
                if ((s = stream_find(f->id))) {
                        if (s->kind == MUX_K_FILE)
                                file_done(s, false);
                        else
                                stream_drop(s);
                }
                return 0;
        case MUX_NET:
                on_net(f->id);
                return 0;
        case MUX_DISK:
                note_disk_used(f->payload);
                return 0;
        case MUX_OOM:
                count_oom_kills(mux_get_u32(f->payload));
                return 0;
        case MUX_SYNCED:
                /* the guest is quiet and its queue is empty: the client may
                 * checkpoint now */
                if (holding && sync_chan) {
                        rchan *sc = sync_chan;
                        chan_reply(sc, sync_id, 0, NULL);
                }
                return 0;
        default:
                return -EPROTO; /* OPEN only goes the other way */
        }
}

static void link_update(void) {
        static bool in_update;
        if (in_update)
                return;
        in_update = true;
        int r = mux_link_flush(&mlink);
        if (r < 0)
                relay_exit("writing to the guest", r);
        (void) source_set_events(&mlink_src, EPOLLIN | (mlink.txq ? EPOLLOUT : 0));
        /* Crossing the mark starts or stops every reader that feeds the link;
         * between crossings each one's own update gets it right. */
        static bool was_high;
        bool high = mlink.tx_bytes >= RELAY_TX_HIGH;
        if (high != was_high) {
                was_high = high;
                for (rchan *c = chans; c;) {
                        rchan *n = c->next;
                        chan_update(c);
                        c = n;
                }
                for (rstream *s = streams; s;) {
                        rstream *n = s->next;
                        stream_update(s);
                        s = n;
                }
        }
        in_update = false;
}

static void link_dispatch(source *src, uint32_t events) {
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                int r = mux_link_read(&mlink, on_frame, NULL, 64);
                if (r < 0)
                        relay_exit("reading from the guest", r);
        }
        link_update();
}

static void sigchld_dispatch(source *s, uint32_t events) {
        struct signalfd_siginfo si[8];
        while (read(s->fd, si, sizeof si) > 0)
                ;
        /* we are a subreaper: runsc's orphans come to us too */
        for (;;) {
                int st;
                pid_t p = waitpid(-1, &st, WNOHANG);
                if (p <= 0)
                        break;
                if (p == runsc_pid) {
                        runsc_pid = 0;
                        log_debug("relay: runsc exited (%d)", st);
                        _exit(0);
                }
        }
}

static void noop_release(source *s) {
}

/* ----------------------------------------------------------------- start */

/* The relay's filter, with no_new_privs already set. TSYNC: every thread
 * gets it, although the relay has only one. */
static int relay_seccomp_load(void) {
        struct relay_bpf_prog prog = { .len = relay_seccomp_filter_len, .filter = relay_seccomp_filter };
        if (syscall(SYS_seccomp, RELAY_SECCOMP_SET_MODE_FILTER, RELAY_SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
                return negative_errno();
        return 0;
}

static int parse_u64(const char *s, uint64_t *ret) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || *end || end == s)
                return -EINVAL;
        *ret = v;
        return 0;
}

int relay_main(int argc, char **argv) {
        uint64_t uid, port;
        if (argc < 8 || !streq(argv[6], "--") || (!streq(argv[5], "run") && !streq(argv[5], "restore")) ||
            parse_u64(argv[1], &uid) < 0 || uid == 0 || uid > 0xfffffffeu || parse_u64(argv[2], &max_file) < 0 ||
            parse_u64(argv[4], &port) < 0 || port > 65535) {
                fprintf(stderr, "usage: hutch-init --gvisor-relay UID MAX_FILE SCRATCH_DIR EGRESS_PORT run|restore -- "
                                "RUNSC ARGS...\n");
                return 2;
        }
        restored = streq(argv[5], "restore");
        egress_port = (uint16_t) port;
        log_debug_enable(getenv("HUTCH_INIT_DEBUG") != NULL);
        (void) prctl(PR_SET_NAME, "hutch-relay", 0, 0, 0);
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
                return 1;
        signal(SIGPIPE, SIG_IGN);
        scratch_fd = open(argv[3], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (scratch_fd < 0) {
                fprintf(stderr, "hutch-relay: %s: %s\n", argv[3], strerror(errno));
                return 1;
        }

        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGCHLD);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return 1;

        int sp[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
                return 1;
        runsc_pid = fork();
        if (runsc_pid < 0)
                return 1;
        if (runsc_pid == 0) {
                /* runsc: the mux is the container's stdin and stdout; its
                 * stderr (runsc's own messages) stays where ours goes */
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
                if (dup2(sp[1], 0) < 0 || dup2(sp[1], 1) < 0)
                        _exit(127);
                execv(argv[7], argv + 7);
                fprintf(stderr, "hutch-relay: executing %s: %s\n", argv[7], strerror(errno));
                _exit(127);
        }
        close(sp[1]);

        /* From here on nothing needs root: drop to the sandbox's host uid for
         * good (no capabilities survive a switch of every uid away from 0). */
        if (setgroups(0, NULL) < 0 || setresgid((gid_t) uid, (gid_t) uid, (gid_t) uid) < 0 ||
            setresuid((uid_t) uid, (uid_t) uid, (uid_t) uid) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
                relay_exit("dropping privileges", negative_errno());
        dropped = true;

        int r = loop_init();
        if (r < 0)
                relay_exit("epoll", r);
        sigchld = (source) { .fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK), .dispatch = sigchld_dispatch,
                             .release = noop_release };
        if (sigchld.fd < 0 || source_add(&sigchld, EPOLLIN) < 0)
                relay_exit("signalfd", -EIO);
        /* as the sandbox's uid, like the scratch dir; they outlive this
         * relay across a checkpoint's restore */
        oom_kills_fd = openat(scratch_fd, "oom-kills", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        disk_used_fd = openat(scratch_fd, "disk-used", O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (oom_kills_fd < 0 || disk_used_fd < 0)
                relay_exit("the scratch dir's counters", negative_errno());
        /* Everything below, and the loop, runs under the relay's filter:
         * the next byte read may be the guest's. */
        if ((r = relay_seccomp_load()) < 0)
                relay_exit("loading the relay's seccomp filter", r);
        int fl = fcntl(sp[0], F_GETFL);
        if (fl < 0 || fcntl(sp[0], F_SETFL, fl | O_NONBLOCK) < 0 || mux_link_init(&mlink, sp[0], sp[0]) < 0)
                relay_exit("the link", -EIO);
        mlink_src = (source) { .fd = sp[0], .dispatch = link_dispatch, .release = noop_release };
        if (source_add(&mlink_src, EPOLLIN) < 0)
                relay_exit("the link", -EIO);
        if (mux_link_init(&heldq, -1, -1) < 0)
                relay_exit("out of memory", -ENOMEM);
        /* a restored guest first forgets the old relay's channels and streams */
        if (restored && (r = mux_link_send(&mlink, MUX_RESYNC, 0, NULL, 0)) < 0)
                relay_exit("queueing on the link", r);
        fl = fcntl(RELAY_CREATOR_FD, F_GETFL);
        if (fl < 0 || fcntl(RELAY_CREATOR_FD, F_SETFL, fl | O_NONBLOCK) < 0 ||
            fcntl(RELAY_CREATOR_FD, F_SETFD, FD_CLOEXEC) < 0 || chan_new(RELAY_CREATOR_FD, true) < 0)
                relay_exit("the creator's connection", -EBADF);
        fl = fcntl(RELAY_LISTEN_FD, F_GETFL);
        if (fl >= 0 && fcntl(RELAY_LISTEN_FD, F_SETFL, fl | O_NONBLOCK) >= 0) {
                (void) fcntl(RELAY_LISTEN_FD, F_SETFD, FD_CLOEXEC);
                listener = (source) { .fd = RELAY_LISTEN_FD, .dispatch = listener_dispatch, .release = noop_release };
                if (source_add(&listener, EPOLLIN) < 0)
                        listener.fd = -1;
        }
        link_update();
        loop_run();
}
