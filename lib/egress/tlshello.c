/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A TLS ClientHello (RFC 8446 §4.1.2, RFC 5246 §7.4.1.2) read from the
 * records that carry it, without I/O or allocation. Strict where a lenient
 * reading would let the proxy and the server see different names: one
 * server_name with one host_name (RFC 6066 §3 allows a list, no client sends
 * one, servers differ on which entry wins), no duplicate extensions
 * (RFC 8446 §4.2), every length exact. docs/egress.md.
 */
#include <errno.h>
#include <string.h>

#include "egress/tlshello.h"
#include "util/macro.h"

enum {
        CONTENT_HANDSHAKE = 22,
        HANDSHAKE_CLIENT_HELLO = 1,
        RECORD_HEADER = 5,    /* type, version, length */
        HANDSHAKE_HEADER = 4, /* msg_type, uint24 length */
};

static int fail(tlshello *h, int code, const char *why) {
        h->why = why;
        return code;
}

/* ------------------------------------------------------------ the cursor */

/* The handshake message lies in the payloads of consecutive records; a
 * cursor reads it as one stream, bounded by how much its field holds. */
typedef struct segment {
        const uint8_t *p;
        size_t n;
} segment;

typedef struct cursor {
        const segment *segs;
        size_t seg, off; /* next byte: segs[seg].p[off] */
        size_t left;     /* bytes this cursor may still read */
} cursor;

/* Copy the next n bytes to dst (NULL: skip them). False if fewer are left. */
static bool take(cursor *c, void *dst, size_t n) {
        uint8_t *d = dst;

        if (n > c->left)
                return false;
        c->left -= n;
        while (n > 0) {
                const segment *s = &c->segs[c->seg];
                size_t k = MIN(n, s->n - c->off);
                if (d) {
                        memcpy(d, s->p + c->off, k);
                        d += k;
                }
                n -= k;
                c->off += k;
                if (c->off == s->n) {
                        c->seg++;
                        c->off = 0;
                }
        }
        return true;
}

static bool take_u8(cursor *c, size_t *ret) {
        uint8_t b;
        if (!take(c, &b, 1))
                return false;
        *ret = b;
        return true;
}

static bool take_u16(cursor *c, size_t *ret) {
        uint8_t b[2];
        if (!take(c, b, 2))
                return false;
        *ret = (size_t) b[0] << 8 | b[1];
        return true;
}

/* The next n bytes as a cursor of their own; c moves past them. */
static bool take_sub(cursor *c, size_t n, cursor *ret) {
        cursor s = *c;
        if (!take(c, NULL, n))
                return false;
        s.left = n;
        *ret = s;
        return true;
}

/* ------------------------------------------------------------ extensions */

/* RFC 6066 §3: ServerNameList, held to exactly one host_name. */
static int parse_server_name(tlshello *h, cursor *e) {
        size_t list_len, type, name_len;

        if (!take_u16(e, &list_len) || list_len != e->left)
                return fail(h, -EBADMSG, "server_name list length does not match its extension");
        if (list_len == 0)
                return fail(h, -EBADMSG, "empty server_name list");
        if (!take_u8(e, &type))
                return fail(h, -EBADMSG, "server_name entry truncated");
        if (type != 0)
                return fail(h, -EPROTO, "server_name type other than host_name");
        if (!take_u16(e, &name_len) || name_len > e->left)
                return fail(h, -EBADMSG, "server_name entry truncated");
        if (name_len == 0)
                return fail(h, -EPROTO, "empty server name");
        if (name_len > sizeof h->sni - 1)
                return fail(h, -EPROTO, "server name over 255 bytes");
        if (!take(e, h->sni, name_len))
                return fail(h, -EBADMSG, "server_name entry truncated");
        if (memchr(h->sni, 0, name_len))
                return fail(h, -EPROTO, "NUL in the server name");
        if (e->left > 0)
                return fail(h, -EPROTO, "more than one server name");
        h->sni[name_len] = 0;
        h->sni_len = name_len;
        h->has_sni = true;
        return 0;
}

/* RFC 7301 §3.1: ProtocolNameList protocol_name_list<2..2^16-1>, names
 * <1..2^8-1>. Only the first is kept. */
static int parse_alpn(tlshello *h, cursor *e) {
        size_t list_len, n;
        bool first = true;

        if (!take_u16(e, &list_len) || list_len != e->left)
                return fail(h, -EBADMSG, "ALPN list length does not match its extension");
        if (list_len == 0)
                return fail(h, -EBADMSG, "empty ALPN list");
        while (e->left > 0) {
                if (!take_u8(e, &n) || n == 0)
                        return fail(h, -EBADMSG, "empty ALPN protocol name");
                if (!take(e, first ? h->alpn : NULL, n))
                        return fail(h, -EBADMSG, "ALPN protocol name truncated");
                if (first) {
                        h->alpn[n] = 0;
                        h->alpn_len = n;
                        first = false;
                }
        }
        h->has_alpn = true;
        return 0;
}

static int parse_extensions(tlshello *h, cursor *c) {
        uint64_t seen[65536 / 64] = { 0 };
        size_t total, type, n;
        int k;

        if (!take_u16(c, &total) || total != c->left)
                return fail(h, -EBADMSG, "extensions length does not match the ClientHello");
        while (c->left > 0) {
                cursor e;
                if (!take_u16(c, &type) || !take_u16(c, &n) || !take_sub(c, n, &e))
                        return fail(h, -EBADMSG, "extension truncated");
                if (seen[type / 64] & (UINT64_C(1) << (type % 64)))
                        return fail(h, -EPROTO, "duplicate extension");
                seen[type / 64] |= UINT64_C(1) << (type % 64);

                switch (type) {
                case TLSHELLO_EXT_SERVER_NAME:
                        k = parse_server_name(h, &e);
                        if (k < 0)
                                return k;
                        break;
                case TLSHELLO_EXT_ALPN:
                        k = parse_alpn(h, &e);
                        if (k < 0)
                                return k;
                        break;
                case TLSHELLO_EXT_ECH:
                case TLSHELLO_EXT_ESNI:
                        h->has_ech = true;
                        break;
                default:
                        break;
                }
        }
        return 0;
}

/* The ClientHello body, after its 4-byte handshake header. */
static int parse_client_hello(tlshello *h, cursor *c) {
        size_t version, n;

        if (!take_u16(c, &version))
                return fail(h, -EBADMSG, "ClientHello truncated");
        if (version >> 8 != 3)
                return fail(h, -EBADMSG, "ClientHello version is not 3.x");
        h->legacy_version = (uint16_t) version;
        if (!take(c, NULL, 32))
                return fail(h, -EBADMSG, "ClientHello truncated");
        if (!take_u8(c, &n) || n > 32)
                return fail(h, -EBADMSG, "session_id over 32 bytes");
        if (!take(c, NULL, n))
                return fail(h, -EBADMSG, "ClientHello truncated");
        if (!take_u16(c, &n) || n == 0 || n % 2 != 0)
                return fail(h, -EBADMSG, "malformed cipher_suites length");
        if (!take(c, NULL, n))
                return fail(h, -EBADMSG, "ClientHello truncated");
        if (!take_u8(c, &n) || n == 0)
                return fail(h, -EBADMSG, "empty compression_methods");
        if (!take(c, NULL, n))
                return fail(h, -EBADMSG, "ClientHello truncated");
        /* RFC 5246 §7.4.1.2: a TLS 1.2 hello may end here, without extensions */
        if (c->left == 0)
                return 0;
        return parse_extensions(h, c);
}

/* ------------------------------------------------------------ the records */

/* The first byte is not a handshake record. Tell an SSLv2-compatible
 * ClientHello (RFC 5246 Appendix E.2: a 2-byte length with the high bit
 * set, then msg_type 1) from everything else. */
static int not_handshake(tlshello *h, const uint8_t *data, size_t len) {
        if (data[0] & 0x80) {
                if (len < 3)
                        return TLSHELLO_NEED_MORE;
                if (data[2] == HANDSHAKE_CLIENT_HELLO)
                        return fail(h, -EPROTO, "SSLv2-compatible ClientHello");
        }
        return fail(h, -EINVAL, "not a TLS handshake record");
}

int tlshello_parse(const uint8_t *data, size_t len, tlshello *h) {
        segment segs[TLSHELLO_RECORDS_MAX];
        uint8_t hdr[HANDSHAKE_HEADER];
        size_t nseg = 0, pos = 0;
        size_t have = 0; /* handshake bytes in the records so far */
        size_t need = 0; /* the message's size with its header; 0: not known yet */

        memset(h, 0, sizeof *h);
        if (len > TLSHELLO_MAX)
                len = TLSHELLO_MAX;

        /* Every check runs where its last byte is, in the order of the
         * bytes, so a prefix answers NEED_MORE or what the whole answers. */
        for (;;) {
                /* The first record tells TLS from other protocols (-EINVAL);
                 * later ones can only be a broken ClientHello. */
                int bad = nseg == 0 ? -EINVAL : -EBADMSG;
                size_t rlen, start;

                if (len - pos < 1)
                        break;
                if (data[pos] != CONTENT_HANDSHAKE) {
                        if (nseg == 0)
                                return not_handshake(h, data, len);
                        return fail(h, -EBADMSG, "record of another type inside the ClientHello");
                }
                if (len - pos < 2)
                        break;
                if (data[pos + 1] != 3)
                        return fail(h, bad, "record version is not 3.x");
                if (len - pos < 3)
                        break;
                if (data[pos + 2] > 4)
                        return fail(h, bad, "record version over 0x0304");
                if (len - pos < RECORD_HEADER)
                        break;
                rlen = (size_t) data[pos + 3] << 8 | data[pos + 4];
                /* RFC 8446 §5.1: no zero-length handshake fragments */
                if (rlen == 0)
                        return fail(h, -EBADMSG, "empty handshake record");
                if (rlen > TLSHELLO_RECORD_MAX)
                        return fail(h, -EBADMSG, "record over 2^14 bytes");
                if (nseg == TLSHELLO_RECORDS_MAX)
                        return fail(h, -E2BIG, "ClientHello in more than 64 records");
                if (need > 0 && have + rlen > need)
                        return fail(h, -EBADMSG, "bytes after the ClientHello in its record");

                start = have;
                pos += RECORD_HEADER;
                segs[nseg].p = data + pos;
                segs[nseg].n = MIN(rlen, len - pos);

                /* the handshake header, which may itself be split */
                for (size_t i = 0; i < segs[nseg].n && have < HANDSHAKE_HEADER; i++) {
                        hdr[have++] = segs[nseg].p[i];
                        if (have == 1 && hdr[0] != HANDSHAKE_CLIENT_HELLO)
                                return fail(h, -EBADMSG, "handshake message is not a ClientHello");
                        if (have < HANDSHAKE_HEADER)
                                continue;
                        need = HANDSHAKE_HEADER +
                                ((size_t) hdr[1] << 16 | (size_t) hdr[2] << 8 | hdr[3]);
                        if (need + RECORD_HEADER > TLSHELLO_MAX)
                                return fail(h, -E2BIG, "ClientHello over 64 KiB");
                        if (start + rlen > need)
                                return fail(h, -EBADMSG, "bytes after the ClientHello in its record");
                }
                have = start + segs[nseg].n;
                nseg++;
                if (segs[nseg - 1].n < rlen)
                        break; /* this record is not all here */
                pos += rlen;
                if (need > 0 && have == need) {
                        cursor c = { .segs = segs, .left = need };
                        int k;

                        (void) take(&c, NULL, HANDSHAKE_HEADER);
                        k = parse_client_hello(h, &c);
                        if (k < 0)
                                return k;
                        h->n_records = nseg;
                        h->hello_len = pos;
                        return TLSHELLO_DONE;
                }
        }
        if (len == TLSHELLO_MAX)
                return fail(h, -E2BIG, "ClientHello over 64 KiB");
        return TLSHELLO_NEED_MORE;
}
