/* SPDX-License-Identifier: Apache-2.0 */
/* The mux frame codec (see mux.h). Pure: no I/O, no allocation. */
#include <errno.h>
#include <string.h>

#include "mux.h"

void mux_header(uint8_t out[static MUX_HEADER_SIZE], uint8_t type, uint32_t id, size_t payload_len) {
        mux_put_u32(out, (uint32_t) (8 + payload_len));
        out[4] = type;
        out[5] = 0;
        out[6] = 0;
        out[7] = 0;
        mux_put_u32(out + 8, id);
}

static bool payload_ok(uint8_t type, uint32_t n) {
        switch (type) {
        case MUX_OPEN:
                return n == 1;
        case MUX_WINDOW:
        case MUX_HELLO:
        case MUX_OOM:
                return n == 4;
        case MUX_DISK:
                return n == 8;
        case MUX_CLOSE:
        case MUX_EOF:
        case MUX_RESET:
        case MUX_NET:
        case MUX_SYNC:
        case MUX_SYNCED:
        case MUX_UNSYNC:
        case MUX_RESYNC:
                return n == 0;
        case MUX_DATA:
                return n >= 1 && n <= MUX_MAX_DATA;
        case MUX_MSG:
                return n >= 1 && n <= MUX_MAX_PAYLOAD;
        default:
                return false;
        }
}

int mux_parse(const uint8_t *buf, size_t len, mux_frame *ret) {
        if (len < 4)
                return 0;
        uint32_t n = mux_get_u32(buf);
        if (n < 8 || n > MUX_MAX_FRAME - 4)
                return -EBADMSG;
        /* The header can be judged before the payload arrives. */
        if (len >= 8 && (buf[4] == 0 || buf[4] >= _MUX_TYPE_MAX || buf[5] != 0 || buf[6] != 0 || buf[7] != 0))
                return -EBADMSG;
        if (len >= 8 && !payload_ok(buf[4], n - 8))
                return -EBADMSG;
        if (len < (size_t) n + 4)
                return 0;
        ret->type = buf[4];
        ret->id = mux_get_u32(buf + 8);
        ret->payload = buf + MUX_HEADER_SIZE;
        ret->payload_len = n - 8;
        return (int) (n + 4);
}

int mux_msg_split(const uint8_t *payload, size_t len, mux_stream_decl decl[static MUX_MAX_STREAMS_PER_MSG],
                  const uint8_t **ret_frame, size_t *ret_frame_len) {
        if (len < 1)
                return -EBADMSG;
        unsigned n = payload[0];
        if (n > MUX_MAX_STREAMS_PER_MSG || len < 1 + (size_t) n * 5 + 1)
                return -EBADMSG;
        for (unsigned i = 0; i < n; i++) {
                const uint8_t *p = payload + 1 + i * 5;
                decl[i].id = mux_get_u32(p);
                decl[i].kind = p[4];
                if (decl[i].id == 0 || decl[i].kind == 0 || decl[i].kind >= _MUX_K_MAX)
                        return -EBADMSG;
                for (unsigned j = 0; j < i; j++)
                        if (decl[j].id == decl[i].id)
                                return -EBADMSG;
        }
        *ret_frame = payload + 1 + n * 5;
        *ret_frame_len = len - 1 - n * 5;
        return (int) n;
}
