/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ingress's parsers of sandbox bytes (daemon/ingress_http.c): the response
 * head of a server inside a sandbox, its chunked body, and the Host form of
 * a sandbox port. Input: one selector byte, then the bytes.
 *
 *   0  response head (the next byte's low bit: the request was a HEAD)
 *   1  chunked body: decoded whole and byte by byte, which must agree
 *   2  "host\0domain" for ingress_host_parse, "port" after a second NUL
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ingress_http.h"
#include "daemon/route.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void head(const uint8_t *data, size_t size) {
        if (size < 1)
                return;
        bool head_request = data[0] & 1;
        data++;
        size--;
        static ingress_resp_head h;
        int r = ingress_resp_head_parse((const char *) data, size, head_request, &h);
        if (r > 1 || (r < 0 && r != -EBADMSG && r != -E2BIG))
                abort();
        if (r != 1)
                return;
        if (h.head_len > size || h.head_len < 4 || h.status < 100 || h.status > 999 ||
            h.n_fields > INGRESS_HEADERS_MAX)
                abort();
        if (memcmp(data + h.head_len - 4, "\r\n\r\n", 4) != 0)
                abort();
        for (size_t i = 0; i < h.n_fields; i++) {
                const ingress_field *f = &h.fields[i];
                const char *lo = (const char *) data, *hi = lo + h.head_len;
                if (f->name < lo || f->name + f->name_len > hi || f->value < lo ||
                    f->value + f->value_len > hi)
                        abort();
                if (f->name_len == 0 || memchr(f->name, ':', f->name_len))
                        abort();
                /* nothing that could end a line where the daemon writes it */
                if (memchr(f->value, '\r', f->value_len) || memchr(f->value, '\n', f->value_len) ||
                    memchr(f->value, 0, f->value_len))
                        abort();
                (void) ingress_resp_field_is_hop(&h, f->name, f->name_len);
        }
        if (h.body < INGRESS_BODY_NONE || h.body > INGRESS_BODY_CLOSE)
                abort();
        if ((head_request || h.status == 204 || h.status == 304 || h.status < 200) &&
            h.body != INGRESS_BODY_NONE)
                abort();
}

static void chunked(const uint8_t *data, size_t size) {
        uint8_t *a = malloc(size + 1), *b = malloc(size + 1);
        if (!a || !b)
                abort();
        memcpy(a, data, size);
        ingress_chunked c1, c2;
        ingress_chunked_init(&c1);
        ingress_chunked_init(&c2);
        size_t used1 = 0;
        ssize_t n1 = ingress_chunked_decode(&c1, a, size, &used1);
        if (n1 > (ssize_t) size || used1 > size)
                abort();
        /* byte by byte: the same data, end and verdict */
        size_t out = 0, used2 = 0;
        ssize_t n2 = 0;
        for (size_t i = 0; i < size && !c2.done; i++) {
                uint8_t byte = data[i];
                size_t u;
                n2 = ingress_chunked_decode(&c2, &byte, 1, &u);
                if (n2 < 0)
                        break;
                if (n2 == 1)
                        b[out++] = byte;
                used2 += u;
        }
        if ((n1 < 0) != (n2 < 0))
                abort();
        if (n1 >= 0) {
                if ((size_t) n1 != out || memcmp(a, b, out) != 0 || c1.done != c2.done)
                        abort();
                if (c1.done && used1 != used2)
                        abort();
                if (!c1.done && used1 != size)
                        abort();
        }
        free(a);
        free(b);
}

static void host(const uint8_t *data, size_t size) {
        char *buf = malloc(size + 3);
        if (!buf)
                abort();
        memcpy(buf, data, size);
        buf[size] = buf[size + 1] = buf[size + 2] = 0;
        /* host NUL domain NUL port; missing fields are empty */
        const char *h = buf;
        const char *d = h + strlen(h) + 1;
        if (d > buf + size)
                d = buf + size + 1;
        const char *p = d + strlen(d) + 1;
        if (p > buf + size + 1)
                p = buf + size + 2;
        unsigned port;
        char id[HUTCH_ID_LEN + 1];
        if (ingress_host_parse(h, d, &port, id) == 0 &&
            (port == 0 || port > 65535 || !route_sandbox_id_valid(id)))
                abort();
        if (ingress_port_parse(p, &port) == 0 && (port == 0 || port > 65535))
                abort();
        free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 200000)
                return 0;
        switch (data[0] % 3) {
        case 0:
                head(data + 1, size - 1);
                break;
        case 1:
                chunked(data + 1, size - 1);
                break;
        default:
                host(data + 1, size - 1);
        }
        return 0;
}
