/* SPDX-License-Identifier: Apache-2.0 */
/* The ClientHello parser (lib/egress/tlshello.c) on the first bytes a
 * sandbox program sends through a tunnel. Invariants, not just "no crash":
 * the answer is one of the documented ones; every prefix answers NEED_MORE
 * until the first prefix that answers otherwise, and that answer is the
 * whole input's, so a caller that calls again after every read sees what a
 * caller with all the bytes sees; a DONE hello keeps its results when its
 * handshake message is cut into other records; the results hold only what
 * the parser promises. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egress/tlshello.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tlshello a, b;
static uint8_t msg[TLSHELLO_MAX], rebuilt[2 * TLSHELLO_MAX];

static void check_answer(int k, const tlshello *h, size_t size) {
        switch (k) {
        case TLSHELLO_NEED_MORE:
                if (h->why || size >= TLSHELLO_MAX)
                        abort();
                return;
        case TLSHELLO_DONE:
                break;
        case -EINVAL:
        case -EPROTO:
        case -EBADMSG:
        case -E2BIG:
                if (!h->why || h->why[0] == 0)
                        abort();
                return;
        default:
                abort();
        }
        if (h->why || h->hello_len > size || h->hello_len > TLSHELLO_MAX)
                abort();
        if (h->n_records < 1 || h->n_records > TLSHELLO_RECORDS_MAX)
                abort();
        if (h->hello_len < h->n_records * 5 + 4 + 41)
                abort(); /* record headers, handshake header, minimal body */
        if (h->legacy_version >> 8 != 3)
                abort();
        if (h->has_sni &&
            (h->sni_len == 0 || h->sni_len > 255 || h->sni[h->sni_len] != 0 ||
             strlen(h->sni) != h->sni_len))
                abort();
        if (!h->has_sni && (h->sni_len != 0 || h->sni[0] != 0))
                abort();
        if (h->has_alpn && (h->alpn_len == 0 || h->alpn_len > 255 || h->alpn[h->alpn_len] != 0))
                abort();
}

static bool same_results(const tlshello *x, const tlshello *y) {
        return x->has_sni == y->has_sni && x->sni_len == y->sni_len &&
                memcmp(x->sni, y->sni, x->sni_len) == 0 && x->has_ech == y->has_ech &&
                x->has_alpn == y->has_alpn && x->alpn_len == y->alpn_len &&
                memcmp(x->alpn, y->alpn, x->alpn_len) == 0 && x->legacy_version == y->legacy_version;
}

/* Parse every prefix up to the first answer other than NEED_MORE, which
 * must be the whole input's; a few longer prefixes must agree too. */
static void check_prefixes(const uint8_t *d, size_t size, int k) {
        size_t i;
        int kp = TLSHELLO_NEED_MORE;

        for (i = 0; i < size; i++) {
                kp = tlshello_parse(d, i, &b);
                if (kp != TLSHELLO_NEED_MORE)
                        break;
                if (b.why)
                        abort();
        }
        if (i == size)
                return; /* every proper prefix was NEED_MORE */
        if (kp != k)
                abort();
        for (size_t j = i; j < size && j < i + 4; j++) {
                kp = tlshello_parse(d, j, &b);
                if (kp != k || (k < 0 && strcmp(b.why, a.why) != 0))
                        abort();
                if (k == TLSHELLO_DONE && (b.hello_len != a.hello_len || !same_results(&a, &b)))
                        abort();
        }
}

/* The handshake message of a DONE hello, out of its records. */
static size_t unwrap(const uint8_t *d, size_t len, uint8_t *out) {
        size_t pos = 0, m = 0;

        while (pos < len) {
                size_t r = (size_t) d[pos + 3] << 8 | d[pos + 4];
                memcpy(out + m, d + pos + 5, r);
                m += r;
                pos += 5 + r;
        }
        return m;
}

/* The same message in records of `step` bytes (the last one shorter), with
 * record version 3.minor. */
static size_t rewrap(const uint8_t *m, size_t n, size_t step, uint8_t minor, uint8_t *out) {
        size_t o = 0;

        for (size_t off = 0; off < n; off += step) {
                size_t r = n - off < step ? n - off : step;
                out[o++] = 22;
                out[o++] = 3;
                out[o++] = minor;
                out[o++] = (uint8_t) (r >> 8);
                out[o++] = (uint8_t) r;
                memcpy(out + o, m + off, r);
                o += r;
        }
        return o;
}

static void check_resplit(const uint8_t *d, size_t size) {
        uint32_t sum = 0;
        size_t m = unwrap(d, a.hello_len, msg), step, n;
        int k;

        for (size_t i = 0; i < size; i++)
                sum = sum * 31 + d[i];
        step = sum % 400 + 1;
        if (step < (m + TLSHELLO_RECORDS_MAX - 1) / TLSHELLO_RECORDS_MAX)
                step = (m + TLSHELLO_RECORDS_MAX - 1) / TLSHELLO_RECORDS_MAX;
        n = rewrap(msg, m, step, (uint8_t) (sum >> 16) % 5, rebuilt);

        k = tlshello_parse(rebuilt, n, &b);
        if (n > TLSHELLO_MAX) {
                if (k != -E2BIG)
                        abort();
                return;
        }
        if (k != TLSHELLO_DONE || b.hello_len != n || b.n_records != (m + step - 1) / step ||
            !same_results(&a, &b))
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        int k = tlshello_parse(data, size, &a);

        check_answer(k, &a, size);
        if (tlshello_parse(data, size, &b) != k || memcmp(&a, &b, sizeof a) != 0)
                abort();
        check_prefixes(data, size, k);
        if (k == TLSHELLO_DONE)
                check_resplit(data, size);
        return 0;
}
