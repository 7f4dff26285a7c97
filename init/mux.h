/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The multiplexed stream between hutch-init inside a gVisor sandbox (the
 * guest) and its relay on the host. gVisor cannot pass descriptors out of
 * the sandbox, so what the namespace backend hands over as descriptors
 * (process pipes, the pty master, an open file, a write pipe) travels here
 * as numbered streams of bytes, next to the init protocol's own frames.
 * The relay turns streams back into host pipes, ptys and files, so the
 * engine and the daemon above it see the same SOCK_SEQPACKET connection
 * with SCM_RIGHTS as on the namespace backend.
 *
 * One byte stream (the container's stdin/stdout, a host socket the relay
 * owns) carries frames, all integers little-endian:
 *
 *   u32 len     bytes after this field: 8 + payload, <= MUX_MAX_FRAME - 4
 *   u8  type    MUX_*
 *   u8  flags   0
 *   u16 zero
 *   u32 id      a channel (OPEN, CLOSE, MSG) or a stream (the rest)
 *   payload
 *
 * Channels are init-protocol connections, numbered by the relay: one per
 * host client. Streams are numbered by the guest. Every stream has a
 * window per direction: a sender may have at most MUX_WINDOW bytes of DATA
 * unacknowledged; the receiver returns WINDOW credits as it delivers them.
 * The relay treats every frame from the guest as hostile: a malformed frame
 * ends the sandbox's connection; DATA over the window resets the stream.
 *
 * This file is pure (no I/O): both sides and the fuzz target use it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MUX_HEADER_SIZE 12
#define MUX_MAX_DATA (32 * 1024)
#define MUX_MAX_STREAMS_PER_MSG 4
/* A MSG from the guest: the stream list then an init-protocol frame. */
#define MUX_MAX_PAYLOAD (1 + MUX_MAX_STREAMS_PER_MSG * 5 + 16 + 60 * 1024)
#define MUX_MAX_FRAME (MUX_HEADER_SIZE + MUX_MAX_PAYLOAD)
#define MUX_WINDOW_BYTES (256 * 1024)

enum {
        MUX_OPEN = 1,   /* relay → guest: channel id; payload u8 creator */
        MUX_CLOSE = 2,  /* either way: the channel's connection is gone */
        MUX_MSG = 3,    /* relay → guest: an init-protocol frame;
                           guest → relay: u8 n, n × (u32 stream, u8 kind), the frame */
        MUX_DATA = 4,   /* either way: 1..MUX_MAX_DATA bytes of a stream */
        MUX_EOF = 5,    /* either way: the sender's side of the stream ended */
        MUX_WINDOW = 6, /* either way: payload u32, bytes delivered (credit back) */
        MUX_RESET = 7,  /* either way: the stream is gone; drop it */
        MUX_NET = 8,    /* guest → relay: a new connection to the egress proxy, as stream id */
        MUX_HELLO = 9,  /* guest → relay, once (again after RESYNC): the guest is up; payload u32 version */
        /* Checkpoints (runsc checkpoint) need the link at a frame boundary
         * both ways: the relay sends SYNC and holds everything after it;
         * the guest stops producing, empties its queue and answers SYNCED
         * as its last frame. UNSYNC lets both go on. A copy restored from
         * that checkpoint meets a new relay, whose first frame is RESYNC:
         * the guest drops every channel and stream (they were the old
         * relay's), goes on, and says HELLO. */
        MUX_SYNC = 10,   /* relay → guest */
        MUX_SYNCED = 11, /* guest → relay */
        MUX_UNSYNC = 12, /* relay → guest */
        MUX_RESYNC = 13, /* relay → guest */
        /* guest → relay: init killed payload u32 processes for going over
         * the sandbox's memory limit (memwatch.c); counted on the host */
        MUX_OOM = 14,
        /* guest → relay: payload u64, bytes the writable layer holds now
         * (layer.c); kept on the host for the metrics */
        MUX_DISK = 15,
        _MUX_TYPE_MAX,
};

/* What a stream carries, as the guest declares it; the relay makes the host
 * side itself (a pipe, a pty, a file), so a lie gets the guest nothing. */
enum {
        MUX_K_OUT = 1,  /* guest reads (a process's stdout/stderr), host gets a pipe read end */
        MUX_K_IN = 2,   /* guest writes (stdin, a file write), host gets a pipe write end */
        MUX_K_PTY = 3,  /* both ways, host gets a pty master */
        MUX_K_FILE = 4, /* guest reads to EOF, host gets a regular file with all of it */
        _MUX_K_MAX,
};

#define MUX_VERSION 1

typedef struct mux_frame {
        uint8_t type;
        uint32_t id;
        const uint8_t *payload;
        uint32_t payload_len;
} mux_frame;

typedef struct mux_stream_decl {
        uint32_t id;
        uint8_t kind;
} mux_stream_decl;

/* Parse one frame from the front of buf: returns the bytes it takes, 0 when
 * more bytes are needed, -EBADMSG when it can never be a valid frame
 * (length out of range, unknown type, non-zero flags, payload size wrong for
 * its type). */
int mux_parse(const uint8_t *buf, size_t len, mux_frame *ret);

/* Split a guest → relay MSG payload into its stream declarations and the
 * init-protocol frame. Returns the number of streams or -EBADMSG (count over
 * MUX_MAX_STREAMS_PER_MSG, unknown kind, stream id 0, a repeated id, or no
 * frame after the list). */
int mux_msg_split(const uint8_t *payload, size_t len, mux_stream_decl decl[static MUX_MAX_STREAMS_PER_MSG],
                  const uint8_t **ret_frame, size_t *ret_frame_len);

/* Write a frame header for a payload of payload_len bytes into out
 * (MUX_HEADER_SIZE bytes). */
void mux_header(uint8_t out[static MUX_HEADER_SIZE], uint8_t type, uint32_t id, size_t payload_len);

static inline void mux_put_u32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t) v;
        p[1] = (uint8_t) (v >> 8);
        p[2] = (uint8_t) (v >> 16);
        p[3] = (uint8_t) (v >> 24);
}

static inline void mux_put_u64(uint8_t *p, uint64_t v) {
        mux_put_u32(p, (uint32_t) v);
        mux_put_u32(p + 4, (uint32_t) (v >> 32));
}

static inline uint32_t mux_get_u32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

/* ------------------------------------------------------------- the link */
/* The stream's two ends share this: a non-blocking fd, a receive buffer
 * and a queue of whole frames to write (muxlink.c, not pure). */

typedef struct mux_out mux_out;

typedef struct mux_link {
        int fd;           /* read from */
        int wfd;          /* written to: the same fd, or (gVisor stdio) stdout */
        uint8_t *rx;      /* MUX_MAX_FRAME + a read's worth */
        size_t rx_len;
        mux_out *txq, **txq_tail;
        size_t tx_bytes;  /* queued, not yet written */
        size_t tx_off;    /* of the head frame */
} mux_link;

/* Queue a frame whose payload is a followed by b (either may be empty). */
int mux_link_send2(mux_link *l, uint8_t type, uint32_t id, const void *a, size_t a_len, const void *b, size_t b_len);
static inline int mux_link_send(mux_link *l, uint8_t type, uint32_t id, const void *p, size_t len) {
        return mux_link_send2(l, type, id, p, len, NULL, 0);
}
int mux_link_send_u32(mux_link *l, uint8_t type, uint32_t id, uint32_t v);
/* Write what is queued until the fd is full: 0, or -errno when the link is broken. */
int mux_link_flush(mux_link *l);
/* Read what is there and call on_frame for each whole frame, at most
 * max_frames of them. Returns 1 if the fd may have more, 0 when it is
 * drained, -ECONNRESET at EOF, -EBADMSG on a malformed frame, or what
 * on_frame returned when negative. */
int mux_link_read(mux_link *l, int (*on_frame)(const mux_frame *f, void *userdata), void *userdata, unsigned max_frames);
int mux_link_init(mux_link *l, int fd, int wfd);
/* Move every frame queued on from (never written: its head is whole) to
 * the end of to's queue. */
void mux_link_append(mux_link *to, mux_link *from);

/* A queue of bytes on their way to a descriptor (a stream's pipe, pty or
 * socket), shared by both ends. */
typedef struct mux_chunk mux_chunk;
typedef struct mux_bufq {
        mux_chunk *head, **tail;
        size_t bytes;
} mux_bufq;

void mux_bufq_init(mux_bufq *q);
int mux_bufq_push(mux_bufq *q, const void *p, size_t n); /* 0 or -ENOMEM */
/* Write from the front until the queue is empty or fd is full; the bytes
 * written go to *ret_wrote. 0, or -errno when fd failed (EPIPE: its reader
 * is gone). */
int mux_bufq_write(mux_bufq *q, int fd, uint32_t *ret_wrote);
void mux_bufq_clear(mux_bufq *q);
