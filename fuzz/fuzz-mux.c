/* SPDX-License-Identifier: Apache-2.0 */
/* The mux frame codec (init/mux.c): what the relay on the host parses from a
 * gVisor sandbox's init, which the relay treats as hostile. The input is a
 * byte stream as the relay reads it; every frame found must lie inside the
 * input, and MSG payloads split into at most MUX_MAX_STREAMS_PER_MSG distinct,
 * valid declarations and a frame inside the payload. */
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>

#include "../init/mux.h"
#include "sandbox/initproto.h"

#define CHECK(x)                 \
        do {                     \
                if (!(x))        \
                        abort(); \
        } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        size_t off = 0;
        while (off < size) {
                mux_frame f;
                int k = mux_parse(data + off, size - off, &f);
                if (k <= 0)
                        break;
                CHECK((size_t) k <= size - off && (size_t) k >= MUX_HEADER_SIZE);
                CHECK(f.payload == data + off + MUX_HEADER_SIZE);
                CHECK(f.payload_len == (uint32_t) k - MUX_HEADER_SIZE);
                CHECK(f.type > 0 && f.type < _MUX_TYPE_MAX);
                if (f.type == MUX_DATA)
                        CHECK(f.payload_len >= 1 && f.payload_len <= MUX_MAX_DATA);
                if (f.type == MUX_DISK)
                        CHECK(f.payload_len == 8);
                if (f.type == MUX_MSG) {
                        mux_stream_decl d[MUX_MAX_STREAMS_PER_MSG];
                        const uint8_t *frame;
                        size_t frame_len;
                        int n = mux_msg_split(f.payload, f.payload_len, d, &frame, &frame_len);
                        if (n >= 0) {
                                CHECK(n <= MUX_MAX_STREAMS_PER_MSG);
                                CHECK(frame >= f.payload && frame + frame_len == f.payload + f.payload_len);
                                CHECK(frame_len >= 1);
                                for (int i = 0; i < n; i++) {
                                        CHECK(d[i].id != 0 && d[i].kind > 0 && d[i].kind < _MUX_K_MAX);
                                        for (int j = 0; j < i; j++)
                                                CHECK(d[i].id != d[j].id);
                                }
                                initproto_msg m;
                                (void) initproto_parse(frame, frame_len, &m);
                        }
                }
                off += (size_t) k;
        }
        return 0;
}
