/* SPDX-License-Identifier: Apache-2.0 */
/* The Jupyter message decoder (interp/jmsg.c) on what a kernel sends: the
 * input is split into frames at each 0xff byte. Decoded with and without a
 * key; a message that decodes has a type and an object content. And every
 * message jmsg_encode writes decodes back with the same key, its content
 * and type unchanged. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(x)                                                                                   \
        do {                                                                                       \
                if (!(x))                                                                          \
                        abort();                                                                   \
        } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        jframe fr[JMSG_MAX_FRAMES];
        size_t n = 0, start = 0;
        for (size_t i = 0; i <= size && n < JMSG_MAX_FRAMES; i++)
                if (i == size || data[i] == 0xff) {
                        fr[n++] = (jframe) { data + start, i - start };
                        start = i + 1;
                }
        static const char *const keys[] = { "", "k3y" };
        for (int k = 0; k < 2; k++) {
                jmsg m;
                if (jmsg_decode(keys[k], fr, n, &m) == 0) {
                        check(m.msg_type[0] && json_is_object(m.content));
                        jmsg_clear(&m);
                }
        }
        /* round trip: the input's first frame as a string of the content */
        json_t *content = json_pack("{s:s%}", "text", (const char *) data, size > 256 ? 256 : size);
        if (!content)
                return 0; /* not UTF-8 */
        char *out[5];
        size_t len[5];
        char id[64];
        if (jmsg_encode("k3y", "session", "stream", content, out, len, id) == 0) {
                jframe f2[6] = { { "<IDS|MSG>", 9 } };
                for (int i = 0; i < 5; i++)
                        f2[i + 1] = (jframe) { out[i], len[i] };
                jmsg m;
                check(jmsg_decode("k3y", f2, 6, &m) == 0);
                check(strcmp(m.msg_type, "stream") == 0 && strcmp(m.msg_id, id) == 0);
                check(json_equal(m.content, content));
                jmsg_clear(&m);
                check(jmsg_decode("other", f2, 6, &m) == -EPERM);
                for (int i = 0; i < 5; i++)
                        free(out[i]);
        }
        json_decref(content);
        return 0;
}
