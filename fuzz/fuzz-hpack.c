/* SPDX-License-Identifier: Apache-2.0 */
/* HPACK decoding (lib/net/hpack.c) on the header blocks an HTTP/2 client
 * sends to ingress. The input is: two bytes of table limit, two of
 * list_max (in 16-byte units), then blocks, each a length byte and that
 * many bytes, decoded in turn with one decoder (the dynamic table carries
 * over, as on a connection). Invariants, not just "no crash": the table
 * never holds more than its size and that size never passes the limit;
 * every entry costs at least 32; a block's fields never add up past
 * list_max; an error is sticky; a field comes only through the callback
 * of a block that succeeds or stops at that field. And a Huffman string
 * decodes to at most 8/5 of its length. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/hpack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t list_sum;

static int count(void *ud, const char *n, size_t nl, const char *v, size_t vl) {
        (void) n;
        (void) v;
        list_sum += nl + vl + HPACK_ENTRY_OVERHEAD;
        if (list_sum > *(size_t *) ud)
                abort(); /* the decoder must stop before the callback */
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 4)
                return 0;
        size_t limit = (size_t) data[0] << 8 | data[1];
        size_t list_max = ((size_t) data[2] << 8 | data[3]) * 16;
        data += 4;
        size -= 4;

        char out[256 * 8 / 5 + 8];
        ssize_t h = hpack_huffman_decode(data, size < 256 ? size : 256, out, sizeof out);
        if (h < -EBADMSG || (h >= 0 && (size_t) h > (size < 256 ? size : 256) * 8 / 5))
                abort();

        hpack_decoder d;
        if (hpack_decoder_init(&d, limit) < 0)
                return 0;
        bool failed = false;
        while (size > 0) {
                size_t n = data[0];
                data++;
                size--;
                if (n > size)
                        n = size;
                list_sum = 0;
                int r = hpack_decode(&d, data, n, list_max, count, &list_max);
                if (failed && r >= 0)
                        abort(); /* sticky */
                if (r < 0) {
                        if (r != -EBADMSG && r != -E2BIG && r != -ENOMEM)
                                abort();
                        failed = true;
                }
                if (d.size > d.max_size || d.max_size > d.limit ||
                    d.n * HPACK_ENTRY_OVERHEAD > d.size || d.n >= d.cap)
                        abort();
                data += n;
                size -= n;
        }
        hpack_decoder_done(&d);
        return 0;
}
