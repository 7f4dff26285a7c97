/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The TLS ClientHello a sandbox program sends first through a CONNECT or
 * SOCKS5 tunnel, parsed without I/O or allocation, so the egress proxy can
 * compare its server_name with the host it dialled before it forwards a
 * byte (domain fronting: CONNECT allowed.test, SNI elsewhere.test).
 * The proxy (proxy.c) holds a tunnel's first bytes until this answers.
 * docs/egress.md ("TLS ClientHello").
 *
 * The caller buffers what the client sent, from its first byte, and calls
 * tlshello_parse() on the whole buffer after every read until the answer is
 * not TLSHELLO_NEED_MORE. A ClientHello may come in several handshake
 * records (RFC 8446 §5.1); they are reassembled. Every check runs as soon as
 * the bytes it needs are there and in the order of those bytes, so a prefix
 * of any input answers TLSHELLO_NEED_MORE or exactly what the whole input
 * answers: a prefix of a complete ClientHello is always NEED_MORE.
 *
 * The server name is returned raw. The proxy passes it to
 * egress_host_parse_n() and compares with egress_host_equal().
 *
 * Only the first ClientHello is seen. After a HelloRetryRequest the client
 * sends a second one, also in the clear (RFC 8446 §4.1.4), which must name
 * the same server but is not checked here.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes the caller may buffer while it waits for the ClientHello (records
 * included). Nothing at or past this offset is read. */
#define TLSHELLO_MAX 65536
/* Records one ClientHello may span. Real clients use one (a hello over
 * 2^14 bytes needs a few); the bound keeps a call on an incomplete hello
 * cheap. */
#define TLSHELLO_RECORDS_MAX 64
/* RFC 8446 §5.1: a TLSPlaintext fragment MUST NOT exceed 2^14 bytes. */
#define TLSHELLO_RECORD_MAX 16384

enum {
        TLSHELLO_NEED_MORE = 0, /* not complete yet: read more, call again with the longer buffer */
        TLSHELLO_DONE = 1,      /* a whole ClientHello; the results below are valid */
};

enum {
        TLSHELLO_EXT_SERVER_NAME = 0x0000,
        TLSHELLO_EXT_ALPN = 0x0010,
        TLSHELLO_EXT_ECH = 0xfe0d,  /* encrypted_client_hello */
        TLSHELLO_EXT_ESNI = 0xffce, /* encrypted_server_name (draft, deployed before ECH) */
};

typedef struct tlshello {
        /* results, valid after TLSHELLO_DONE */
        bool has_sni;
        char sni[256];  /* server_name host_name: raw bytes, NUL-terminated, no NUL inside */
        size_t sni_len; /* 1..255 */

        /* An encrypted_client_hello (or the older ESNI) extension: the
         * server_name above is only the outer, public name, and the
         * server may route by the encrypted inner one. Browsers (Chrome,
         * for one) also send a GREASE ECH extension when they have no ECH
         * config; it cannot be told from a real one (by design), so this
         * flag alone does not mean the name is hidden. */
        bool has_ech;

        bool has_alpn;
        char alpn[256]; /* the first application_layer_protocol_negotiation name, raw */
        size_t alpn_len;

        uint16_t legacy_version; /* ClientHello.legacy_version, 0x0300..0x03ff */
        size_t n_records;        /* records the ClientHello came in */
        size_t hello_len;        /* bytes of data up to the end of its last record; what
                                  * follows (early data, ...) is not looked at */

        /* after an error: a static English reason */
        const char *why;
} tlshello;

/* Parse data[0..len): every byte received from the client so far, from the
 * start. *h is reset on every call. Returns:
 *   TLSHELLO_NEED_MORE  incomplete; read more and call again (data may move)
 *   TLSHELLO_DONE       complete; see the results and hello_len
 *   -EINVAL    not a TLS handshake: the first record is not type 22 with
 *              version 0x0300..0x0304 (an HTTP request, an SSH banner, ...)
 *   -EPROTO    TLS, refused: an SSLv2-compatible ClientHello (it can carry no
 *              server_name); a duplicate extension of any type; a
 *              server_name that lists more than one name, a name type other
 *              than host_name(0), an empty name, a name over 255 bytes or
 *              one holding NUL
 *   -EBADMSG   malformed: a bad record header, an empty or oversized
 *              (> 2^14) record, a record of another type before the
 *              ClientHello ends, a handshake message other than ClientHello,
 *              bytes after the ClientHello in its last record, lengths that
 *              do not add up
 *   -E2BIG     the ClientHello does not fit TLSHELLO_MAX bytes or
 *              TLSHELLO_RECORDS_MAX records
 * with h->why set on every error. O(records) while incomplete; the
 * ClientHello itself is parsed once, when it is all there. */
int tlshello_parse(const uint8_t *data, size_t len, tlshello *h);
