/* SPDX-License-Identifier: Apache-2.0 */
/* The I/O half of the mux link (see mux.h), shared by the guest and the relay. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mux.h"

struct mux_out {
        mux_out *next;
        size_t len;
        uint8_t data[];
};

#define RX_SIZE (MUX_MAX_FRAME + 64 * 1024)

int mux_link_init(mux_link *l, int fd, int wfd) {
        memset(l, 0, sizeof *l);
        l->fd = fd;
        l->wfd = wfd;
        l->txq_tail = &l->txq;
        l->rx = malloc(RX_SIZE);
        return l->rx ? 0 : -ENOMEM;
}

int mux_link_send2(mux_link *l, uint8_t type, uint32_t id, const void *a, size_t a_len, const void *b, size_t b_len) {
        size_t n = a_len + b_len;
        if (n > MUX_MAX_PAYLOAD)
                return -EMSGSIZE;
        mux_out *o = malloc(sizeof *o + MUX_HEADER_SIZE + n);
        if (!o)
                return -ENOMEM;
        o->next = NULL;
        o->len = MUX_HEADER_SIZE + n;
        mux_header(o->data, type, id, n);
        if (a_len)
                memcpy(o->data + MUX_HEADER_SIZE, a, a_len);
        if (b_len)
                memcpy(o->data + MUX_HEADER_SIZE + a_len, b, b_len);
        *l->txq_tail = o;
        l->txq_tail = &o->next;
        l->tx_bytes += o->len;
        return 0;
}

int mux_link_send_u32(mux_link *l, uint8_t type, uint32_t id, uint32_t v) {
        uint8_t p[4];
        mux_put_u32(p, v);
        return mux_link_send(l, type, id, p, 4);
}

int mux_link_flush(mux_link *l) {
        while (l->txq) {
                mux_out *o = l->txq;
                ssize_t n = write(l->wfd, o->data + l->tx_off, o->len - l->tx_off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return errno == EAGAIN ? 0 : -errno;
                }
                l->tx_off += (size_t) n;
                l->tx_bytes -= (size_t) n;
                if (l->tx_off < o->len)
                        continue;
                l->tx_off = 0;
                l->txq = o->next;
                if (!l->txq)
                        l->txq_tail = &l->txq;
                free(o);
        }
        return 0;
}

int mux_link_read(mux_link *l, int (*on_frame)(const mux_frame *f, void *userdata), void *userdata, unsigned max_frames) {
        unsigned done = 0;
        bool eof = false, more = true;
        for (;;) {
                /* whole frames first */
                size_t off = 0;
                for (;;) {
                        if (done >= max_frames)
                                break;
                        mux_frame f;
                        int k = mux_parse(l->rx + off, l->rx_len - off, &f);
                        if (k < 0)
                                return k;
                        if (k == 0)
                                break;
                        int r = on_frame(&f, userdata);
                        if (r < 0)
                                return r;
                        off += (size_t) k;
                        done++;
                }
                if (off) {
                        memmove(l->rx, l->rx + off, l->rx_len - off);
                        l->rx_len -= off;
                }
                if (done >= max_frames)
                        return 1;
                if (eof)
                        return -ECONNRESET;
                if (!more)
                        return 0;
                ssize_t n = read(l->fd, l->rx + l->rx_len, RX_SIZE - l->rx_len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return 0;
                        return -errno;
                }
                if (n == 0)
                        eof = true;
                else if ((size_t) n < RX_SIZE - l->rx_len)
                        more = false; /* drained for now: parse, then stop */
                l->rx_len += (size_t) n;
        }
}

void mux_link_append(mux_link *to, mux_link *from) {
        if (!from->txq)
                return;
        *to->txq_tail = from->txq;
        to->txq_tail = from->txq_tail;
        to->tx_bytes += from->tx_bytes;
        from->txq = NULL;
        from->txq_tail = &from->txq;
        from->tx_bytes = 0;
}

struct mux_chunk {
        mux_chunk *next;
        size_t len, off;
        uint8_t data[];
};

void mux_bufq_init(mux_bufq *q) {
        q->head = NULL;
        q->tail = &q->head;
        q->bytes = 0;
}

int mux_bufq_push(mux_bufq *q, const void *p, size_t n) {
        mux_chunk *c = malloc(sizeof *c + n);
        if (!c)
                return -ENOMEM;
        c->next = NULL;
        c->len = n;
        c->off = 0;
        memcpy(c->data, p, n);
        *q->tail = c;
        q->tail = &c->next;
        q->bytes += n;
        return 0;
}

int mux_bufq_write(mux_bufq *q, int fd, uint32_t *ret_wrote) {
        uint32_t wrote = 0;
        int r = 0;
        while (q->head) {
                mux_chunk *c = q->head;
                ssize_t n = write(fd, c->data + c->off, c->len - c->off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno != EAGAIN)
                                r = -errno;
                        break;
                }
                c->off += (size_t) n;
                q->bytes -= (size_t) n;
                wrote += (uint32_t) n;
                if (c->off == c->len) {
                        q->head = c->next;
                        if (!q->head)
                                q->tail = &q->head;
                        free(c);
                }
        }
        *ret_wrote = wrote;
        return r;
}

void mux_bufq_clear(mux_bufq *q) {
        while (q->head) {
                mux_chunk *c = q->head;
                q->head = c->next;
                free(c);
        }
        mux_bufq_init(q);
}
