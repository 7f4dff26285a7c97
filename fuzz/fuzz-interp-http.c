/* SPDX-License-Identifier: Apache-2.0 */
/* The code interpreter's parsers of client bytes (interp/ihttp.c,
 * interp/ibody.c): a request head, a chunked body after it, and the JSON
 * bodies of /execute and /contexts. Invariants besides "no crash": a
 * complete head is complete again on any longer prefix with the same
 * length and fields, and never on a shorter one; a complete chunked body
 * decodes to exactly its announced length and is incomplete one byte
 * short; a parsed execute has a code string and a known language or none. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ibody.h"
#include "ihttp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(x)                                                                                   \
        do {                                                                                       \
                if (!(x))                                                                          \
                        abort();                                                                   \
        } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *buf = (const char *) data;
        ih_request rq;
        int r = ih_parse_head(buf, size, 1 << 20, &rq);
        if (r == 1) {
                check(rq.head_len <= size);
                ih_request again;
                check(ih_parse_head(buf, rq.head_len, 1 << 20, &again) == 1);
                check(again.head_len == rq.head_len && strcmp(again.path, rq.path) == 0 &&
                      again.content_length == rq.content_length && again.chunked == rq.chunked);
                if (rq.head_len > 0) {
                        ih_request shorter;
                        check(ih_parse_head(buf, rq.head_len - 1, 1 << 20, &shorter) <= 0);
                }
                check(rq.path[0] == '/');
                const char *b = buf + rq.head_len;
                size_t bl = size - rq.head_len, blen = 0, used = 0;
                if (rq.chunked) {
                        int k = ih_chunked_scan(b, bl, 1 << 20, &blen, &used);
                        if (k == 1) {
                                check(used <= bl && blen <= used);
                                char *out = malloc(blen + 1);
                                ih_chunked_copy(b, used, out);
                                size_t l2 = 0, u2 = 0;
                                check(ih_chunked_scan(b, used, 1 << 20, &l2, &u2) == 1 &&
                                      l2 == blen && u2 == used);
                                check(ih_chunked_scan(b, used - 1, 1 << 20, &l2, &u2) <= 0);
                                free(out);
                        }
                } else if (bl >= rq.content_length) {
                        blen = rq.content_length;
                }
                (void) blen;
        }
        /* the bodies, on the whole input */
        ix_execute x;
        char why[256];
        if (ix_parse_execute(buf, size, &x, why, sizeof why) == 0) {
                check(x.code);
                char norm[IX_LANG_MAX];
                check(!x.language[0] || ix_language_normalize(x.language, norm) == 0);
                check(!(x.language[0] && x.context_id[0]));
                ix_execute_clear(&x);
        }
        char lang[IX_LANG_MAX], cwd[IX_CWD_MAX];
        if (ix_parse_context(buf, size, lang, cwd, why, sizeof why) == 0)
                check(cwd[0] == '/' && lang[0]);
        return 0;
}
