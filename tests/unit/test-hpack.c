/* SPDX-License-Identifier: Apache-2.0 */
/* HPACK decoding (lib/net/hpack.c): the examples of RFC 7541 Appendix C,
 * and the bounds a hostile client meets (bombs, bad Huffman, size updates
 * above the limit, truncation). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/hpack.h"
#include "tap.h"

static bool streq_(const char *a, const char *b) {
        return strcmp(a, b) == 0;
}

static char got[4096];
static size_t got_len;

static int collect(void *ud, const char *n, size_t nl, const char *v, size_t vl) {
        (void) ud;
        got_len += (size_t) snprintf(got + got_len, sizeof got - got_len, "%.*s: %.*s\n", (int) nl,
                                     n, (int) vl, v);
        return 0;
}

static size_t unhex(const char *hex, uint8_t *out) {
        size_t n = 0;
        for (const char *p = hex; *p;) {
                if (*p == ' ') {
                        p++;
                        continue;
                }
                unsigned b;
                if (sscanf(p, "%2x", &b) != 1)
                        abort();
                out[n++] = (uint8_t) b;
                p += 2;
        }
        return n;
}

static int decode_hex(hpack_decoder *d, const char *hex, size_t list_max) {
        uint8_t buf[1024];
        size_t n = unhex(hex, buf);
        got_len = 0;
        got[0] = 0;
        return hpack_decode(d, buf, n, list_max, collect, NULL);
}

#define DATE1 "Mon, 21 Oct 2013 20:13:21 GMT"
#define DATE2 "Mon, 21 Oct 2013 20:13:22 GMT"

static const char *req_want[3] = {
        ":method: GET\n:scheme: http\n:path: /\n:authority: www.example.com\n",
        ":method: GET\n:scheme: http\n:path: /\n:authority: www.example.com\ncache-control: "
        "no-cache\n",
        ":method: GET\n:scheme: https\n:path: /index.html\n:authority: www.example.com\ncustom-key: "
        "custom-value\n",
};
static const size_t req_size[3] = { 57, 110, 164 };

static const char *resp_want[3] = {
        ":status: 302\ncache-control: private\ndate: " DATE1 "\nlocation: https://www.example.com\n",
        ":status: 307\ncache-control: private\ndate: " DATE1 "\nlocation: https://www.example.com\n",
        ":status: 200\ncache-control: private\ndate: " DATE2
        "\nlocation: https://www.example.com\ncontent-encoding: gzip\nset-cookie: "
        "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1\n",
};
static const size_t resp_size[3] = { 222, 222, 215 };

static void sequence(const char *name, const char *const hex[3], const char *const want[3],
                     const size_t size[3], size_t table) {
        hpack_decoder d;
        ok(hpack_decoder_init(&d, table) == 0, "%s: init", name);
        for (int i = 0; i < 3; i++) {
                int r = decode_hex(&d, hex[i], 65536);
                ok(r > 0 && streq_(got, want[i]), "%s.%d: fields (r=%d)", name, i + 1, r);
                ok(d.size == size[i], "%s.%d: table size %zu", name, i + 1, d.size);
        }
        hpack_decoder_done(&d);
}

int main(void) {
        hpack_decoder d;

        /* C.1: integers */
        uint8_t b[8];
        ok(hpack_put_int(b, sizeof b, 0, 5, 10) == 1 && b[0] == 10, "C.1.1: 10 in 5 bits");
        ok(hpack_put_int(b, sizeof b, 0, 5, 1337) == 3 && b[0] == 31 && b[1] == 0x9a && b[2] == 0x0a,
           "C.1.2: 1337 in 5 bits");
        ok(hpack_put_int(b, sizeof b, 0, 8, 42) == 1 && b[0] == 42, "C.1.3: 42 at an octet");

        /* C.2: one field each */
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
                      65536) == 1 &&
                   streq_(got, "custom-key: custom-header\n") && d.size == 55 && d.n == 1,
           "C.2.1: literal with indexing");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "040c 2f73 616d 706c 652f 7061 7468", 65536) == 1 &&
                   streq_(got, ":path: /sample/path\n") && d.n == 0,
           "C.2.2: literal without indexing");
        ok(decode_hex(&d, "1008 7061 7373 776f 7264 0673 6563 7265 74", 65536) == 1 &&
                   streq_(got, "password: secret\n") && d.n == 0,
           "C.2.3: literal never indexed");
        ok(decode_hex(&d, "82", 65536) == 1 && streq_(got, ":method: GET\n"), "C.2.4: indexed");
        hpack_decoder_done(&d);

        const char *c3[3] = {
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        };
        sequence("C.3", c3, req_want, req_size, 4096);
        const char *c4[3] = {
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        };
        sequence("C.4", c4, req_want, req_size, 4096);
        const char *c5[3] = {
                "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 "
                "2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 "
                "6c65 2e63 6f6d",
                "4803 3330 37c1 c0bf",
                "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d "
                "54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 "
                "5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e "
                "3d31",
        };
        sequence("C.5", c5, resp_want, resp_size, 256);
        const char *c6[3] = {
                "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 "
                "2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                "4883 640e ffc1 c0bf",
                "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab "
                "77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f "
                "9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        };
        sequence("C.6", c6, resp_want, resp_size, 256);

        /* Huffman edge cases (§5.2) */
        char out[64];
        uint8_t h[8];
        h[0] = 0xff;
        h[1] = 0xff;
        h[2] = 0xff;
        h[3] = 0xff; /* 32 ones: EOS (30) decoded */
        ok(hpack_huffman_decode(h, 4, out, sizeof out) == -EBADMSG, "Huffman: EOS is an error");
        h[0] = 0xff; /* 8 ones of padding: over 7 bits */
        ok(hpack_huffman_decode(h, 1, out, sizeof out) == -EBADMSG, "Huffman: 8-bit padding");
        h[0] = 0x00; /* '0' (00000) then 000 padding: not ones */
        ok(hpack_huffman_decode(h, 1, out, sizeof out) == -EBADMSG, "Huffman: zero padding");
        h[0] = 0x07; /* '0' then 111 */
        ok(hpack_huffman_decode(h, 1, out, sizeof out) == 1 && out[0] == '0',
           "Huffman: '0' with 3 bits of padding");
        ok(hpack_huffman_decode(h, 1, out, 0) == -E2BIG, "Huffman: output bound");

        /* hostile blocks */
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "80", 65536) == -EBADMSG, "index 0 refused");
        ok(decode_hex(&d, "82", 65536) == -EBADMSG, "errors are sticky");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "be", 65536) == -EBADMSG, "index past the dynamic table refused");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "3fe1 1f", 65536) == 0 && d.max_size == 4096, "size update to 4096");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "3fe2 1f", 65536) == -EBADMSG, "size update above the limit refused");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "82 20", 65536) == -EBADMSG, "size update after a field refused");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "ff ff ff ff ff 0f", 65536) == -EBADMSG, "integer overflow refused");
        ok(decode_hex(&d, "00", 65536) == -EBADMSG || d.broken, "truncated literal refused");
        hpack_decoder_done(&d);
        hpack_decoder_init(&d, 4096);
        ok(decode_hex(&d, "400a 6375 7374", 65536) == -EBADMSG, "string past the block refused");
        hpack_decoder_done(&d);

        /* a bomb: one 4000-byte entry indexed 1000 times is 4 MB decoded
         * from ~5 KB; list_max stops it */
        hpack_decoder_init(&d, 4096);
        size_t bl = 0;
        static uint8_t bomb[8192];
        bomb[bl++] = 0x40;
        bomb[bl++] = 0x01;
        bomb[bl++] = 'x';
        bl += (size_t) hpack_put_int(bomb + bl, sizeof bomb - bl, 0x00, 7, 4000);
        memset(bomb + bl, 'a', 4000);
        bl += 4000;
        for (int i = 0; i < 1000; i++)
                bomb[bl++] = 0xbe; /* index 62: the entry just added */
        ok(hpack_decode(&d, bomb, bl, 65536, NULL, NULL) == -E2BIG, "HPACK bomb stopped by list_max");
        hpack_decoder_done(&d);

        /* an entry larger than the table empties it, without error */
        hpack_decoder_init(&d, 64);
        ok(decode_hex(&d, "4003 6162 6303 6465 66", 65536) == 1 && d.n == 1 && d.size == 38,
           "small table: entry added");
        bl = 0;
        bomb[bl++] = 0x40;
        bomb[bl++] = 0x01;
        bomb[bl++] = 'y';
        bomb[bl++] = 40;
        memset(bomb + bl, 'b', 40);
        bl += 40;
        ok(hpack_decode(&d, bomb, bl, 65536, NULL, NULL) == 1 && d.n == 0 && d.size == 0,
           "entry larger than the table empties it");
        hpack_decoder_done(&d);

        /* the encoder of our answers reads back */
        uint8_t enc[128];
        ssize_t el = hpack_put_literal(enc, sizeof enc, ":status", "502", 3);
        hpack_decoder_init(&d, 4096);
        got_len = 0;
        ok(el > 0 && hpack_decode(&d, enc, (size_t) el, 65536, collect, NULL) == 1 &&
                   streq_(got, ":status: 502\n") && d.n == 0,
           "literal answer decodes");
        hpack_decoder_done(&d);
        return tap_done();
}
