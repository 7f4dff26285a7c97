/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the init protocol decoder: the host parses every
 * frame that a (possibly compromised) hutch-init sends, and hutch-init parses
 * every frame a client sends. Parse, then walk every field through every
 * accessor; the sanitizers catch any read outside the frame.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sandbox/initproto.h"
#include "util/parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static char str[INITPROTO_MAX_STRING + 1];
        initproto_msg m;
        initproto_iter it;
        initproto_field f;
        uint64_t v;
        int r;

        /* Copy into an exact-size heap buffer so that ASan sees the real end
         * of the frame (libFuzzer's own buffer may have slack). */
        uint8_t *copy = malloc(size ? size : 1);
        if (!copy)
                return 0;
        if (size > 0)
                memcpy(copy, data, size);

        (void) initproto_type_name(size >= 6 ? (uint16_t) (copy[4] | copy[5] << 8) : 0);
        if (initproto_parse(copy, size, &m) < 0)
                goto out;
        (void) initproto_type_name(m.type);

        initproto_iter_init(&it, &m);
        while ((r = initproto_next(&it, &f)) > 0) {
                (void) initproto_field_u64(&f, &v);
                if (initproto_field_str(&f, str, sizeof str) == 0) {
                        (void) initproto_meta_key_valid(str);
                        (void) request_id_valid(str);
                }
                /* A buffer too small for the value must be refused, never overrun. */
                (void) initproto_field_str(&f, str, f.len > 0 ? f.len : 1);
                (void) initproto_find(&m, f.tag, &f);
                (void) initproto_find_u64(&m, f.tag, &v);
                (void) initproto_find_str(&m, f.tag, str, sizeof str);
        }
        /* parse() validated the field sequence, so iteration must end cleanly. */
        if (r != 0)
                abort();

        /* Re-encode what was read and check that it parses back the same. */
        static initproto_writer w;
        initproto_begin(&w, m.type, m.flags, m.id);
        initproto_iter_init(&it, &m);
        while (initproto_next(&it, &f) > 0)
                initproto_put_bytes(&w, f.tag, f.value, f.len);
        r = initproto_finish(&w);
        if (r < 0 || (size_t) r != size || memcmp(w.buf, copy, size) != 0)
                abort();
out:
        free(copy);
        return 0;
}
