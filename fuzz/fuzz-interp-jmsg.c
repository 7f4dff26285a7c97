/* SPDX-License-Identifier: Apache-2.0 */
/* The Jupyter message decoder (interp/jmsg.c) on what a kernel sends: the
 * input is split into frames at each 0xff byte. Decoded with and without a
 * key; a message that decodes has a type and an object content. And every
 * message jmsg_encode writes decodes back with the same key, its content
 * and type unchanged. A decoded message's result line (interp/jresult.c)
 * is ASCII JSON, an object, its png the buffer the content names byte for
 * byte; and the escaping alone, on the whole input, reads back as the input
 * exactly when jansson takes the input as UTF-8. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jmsg.h"
#include "jresult.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(x)                                                                                   \
        do {                                                                                       \
                if (!(x))                                                                          \
                        abort();                                                                   \
        } while (0)

static void check_result(const jmsg *m) {
        size_t len = 0;
        char *line = jresult_line(m->content, m->buffers, m->n_buffers, false, &len);
        if (!line)
                return;
        check(strlen(line) == len);
        for (size_t i = 0; i < len; i++)
                check((unsigned char) line[i] < 0x80);
        json_t *ev = json_loadb(line, len, JSON_ALLOW_NUL, NULL);
        check(json_is_object(ev) && json_is_object(json_object_get(ev, "extra")));
        check(json_is_false(json_object_get(ev, "is_main_result")));
        json_t *ix = json_object_get(json_object_get(m->content, "hutch_buffers"), "image/png");
        if (json_is_integer(ix) && json_integer_value(ix) >= 0 &&
            (size_t) json_integer_value(ix) < m->n_buffers) {
                const jframe *b = &m->buffers[json_integer_value(ix)];
                json_t *want = json_stringn(b->data, b->len), *png = json_object_get(ev, "png");
                check(want ? json_equal(want, png) : png == NULL);
                json_decref(want);
        }
        json_decref(ev);
        free(line);
}

static void check_escape(const uint8_t *data, size_t size) {
        ssize_t n = json_escaped_len(data, size);
        json_t *want = json_stringn((const char *) data, size);
        check((n >= 0) == (want != NULL));
        if (n >= 0) {
                char *q = malloc((size_t) n + 2);
                check(q);
                q[0] = '"';
                json_escape(data, size, q + 1);
                q[n + 1] = '"';
                json_t *got = json_loadb(q, (size_t) n + 2, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
                check(got && json_equal(got, want));
                json_decref(got);
                free(q);
        }
        json_decref(want);
}

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
                        check_result(&m);
                        jmsg_clear(&m);
                }
        }
        check_escape(data, size);
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
