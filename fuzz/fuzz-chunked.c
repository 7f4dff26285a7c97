/* SPDX-License-Identifier: Apache-2.0 */
/* The chunked body framer (lib/egress/chunked.c) on bytes a sandbox program
 * sends after a request head. Invariants, not just "no crash": the answer,
 * bytes consumed, reason and counts are the same fed whole, one byte at a
 * time and in pieces whose sizes come from the input; no feed consumes more
 * than it was given, NEED_MORE takes everything; answers are sticky; a
 * DONE body ends in CRLF, is DONE again on exactly its bytes and NEED_MORE
 * one byte short, and a naive reader that trusts the framing (size line,
 * data, CRLF, ..., trailer lines to an empty one) finds the same end and
 * the same payload length. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egress/chunked.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static chunked runs[3];

/* mode 0: whole; 1: byte by byte; 2: pieces of 1..17 bytes from the input */
static int run(chunked *c, const uint8_t *d, size_t n, int mode, size_t *ret_used) {
        size_t off = 0, piece = 0;
        int k = CHUNKED_NEED_MORE;

        chunked_init(c);
        while (off < n) {
                size_t len = mode == 0 ? n - off : mode == 1 ? 1 : (size_t) d[piece++ % n] % 17 + 1;
                size_t taken = SIZE_MAX;
                if (len > n - off)
                        len = n - off;
                k = chunked_feed(c, d + off, len, &taken);
                if (taken > len || (k == CHUNKED_NEED_MORE && taken != len))
                        abort();
                off += taken;
                if (k != CHUNKED_NEED_MORE)
                        break;
        }
        *ret_used = off;
        if (k != CHUNKED_NEED_MORE) {
                /* sticky, and consumes nothing */
                size_t taken = SIZE_MAX;
                if (chunked_feed(c, d, n, &taken) != k || taken != 0)
                        abort();
        }
        return k;
}

static size_t skip_line(const uint8_t *d, size_t n, size_t p) {
        while (p + 1 < n && !(d[p] == '\r' && d[p + 1] == '\n'))
                p++;
        if (p + 1 >= n)
                abort(); /* DONE, yet a line without CRLF */
        return p + 2;
}

/* Read a body the framer said is DONE the naive way; returns where it
 * ends, and the payload length in *ret_payload. */
static size_t naive(const uint8_t *d, size_t n, uint64_t *ret_payload) {
        size_t p = 0;
        uint64_t total = 0;

        for (;;) {
                uint64_t size = 0;
                for (; p < n && d[p] != ';' && d[p] != '\r'; p++) {
                        uint8_t x = d[p];
                        unsigned v = x <= '9' ? x - '0' : (x | 0x20) - 'a' + 10;
                        if (!((x >= '0' && x <= '9') || ((x | 0x20) >= 'a' && (x | 0x20) <= 'f')))
                                abort(); /* DONE, yet not a hex size */
                        size = size * 16 + v;
                }
                p = skip_line(d, n, p);
                if (size == 0)
                        break;
                if (size > n - p || n - p - size < 2 || d[p + size] != '\r' || d[p + size + 1] != '\n')
                        abort();
                p += size + 2;
                total += size;
        }
        while (!(p + 1 < n && d[p] == '\r' && d[p + 1] == '\n'))
                p = skip_line(d, n, p);
        *ret_payload = total;
        return p + 2;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        size_t u[3];
        int k[3];

        for (int m = 0; m < 3; m++)
                k[m] = run(&runs[m], data, size, m, &u[m]);
        for (int m = 1; m < 3; m++)
                if (k[m] != k[0] || u[m] != u[0] || runs[m].body_bytes != runs[0].body_bytes ||
                    runs[m].n_chunks != runs[0].n_chunks || runs[m].n_trailers != runs[0].n_trailers ||
                    (k[0] < 0 && strcmp(runs[m].why, runs[0].why) != 0))
                        abort();

        const chunked *c = &runs[0];
        chunked again;
        size_t used;
        uint64_t payload;
        switch (k[0]) {
        case CHUNKED_NEED_MORE:
                if (u[0] != size || c->why)
                        abort();
                break;
        case CHUNKED_DONE:
                if (c->why || u[0] < 5 || data[u[0] - 2] != '\r' || data[u[0] - 1] != '\n' ||
                    c->body_bytes > u[0] || c->n_trailers > CHUNKED_TRAILERS_MAX)
                        abort();
                if (run(&again, data, u[0], 0, &used) != CHUNKED_DONE || used != u[0])
                        abort();
                if (run(&again, data, u[0] - 1, 0, &used) != CHUNKED_NEED_MORE)
                        abort();
                if (naive(data, size, &payload) != u[0] || payload != c->body_bytes)
                        abort();
                break;
        case -EINVAL:
        case -E2BIG:
                /* refused at a byte that is there; everything before it was fine */
                if (!c->why || u[0] >= size)
                        abort();
                if (run(&again, data, u[0], 0, &used) != CHUNKED_NEED_MORE)
                        abort();
                if (run(&again, data, u[0] + 1, 0, &used) != k[0] || used != u[0] ||
                    strcmp(again.why, c->why) != 0)
                        abort();
                break;
        default:
                abort();
        }
        return 0;
}
