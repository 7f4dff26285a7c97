/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stub resolver's messages (RFC 1035 §4), without I/O. The proxy asks
 * one recursive nameserver for A or AAAA and reads one answer; nothing is
 * cached. Every offset is checked against the message length before it is
 * read, and every loop is bounded by that length.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/dns.h"

#define HEADER_SIZE 12
#define NAME_WIRE_MAX 255 /* RFC 1035 §3.1: labels, length bytes and root */
#define LABEL_MAX 63
/* Pointers followed in one name. Compressors point each name at one earlier
 * name, so real chains are a few jumps long; Go's dnsmessage stops at 10.
 * The bound keeps each name walk short whatever the message holds. */
#define POINTERS_MAX 16

/* Header flags (RFC 1035 §4.1.1) */
#define FLAG_QR 0x8000
#define FLAG_OPCODE 0x7800
#define FLAG_TC 0x0200
#define FLAG_RD 0x0100
#define FLAG_RCODE 0x000f

/* ----------------------------------------------------------------- bytes */

static uint16_t get16(const uint8_t *p) {
        return (uint16_t) (p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p) {
        return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

static uint8_t *put16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t) (v >> 8);
        p[1] = (uint8_t) v;
        return p + 2;
}

static uint8_t lower(uint8_t c) {
        return c >= 'A' && c <= 'Z' ? (uint8_t) (c - 'A' + 'a') : c;
}

/* ----------------------------------------------------------------- names */

/* A name in wire form, uncompressed and lowercased: comparing two of them
 * is memcmp, and a label holding '.' can never equal two labels. */
typedef struct wire_name {
        uint8_t b[NAME_WIRE_MAX];
        size_t len;
} wire_name;

static bool wire_name_equal(const wire_name *a, const wire_name *b) {
        return a->len == b->len && memcmp(a->b, b->b, a->len) == 0;
}

/* The canonical text name the proxy asks for, in wire form. */
static int name_from_text(const char *name, wire_name *ret) {
        size_t o = 0, label = 0;

        if (!name)
                return -EINVAL;
        for (const char *p = name;; p++) {
                char c = *p;
                if (c == '.' || c == 0) {
                        if (label == 0 || label > LABEL_MAX)
                                return -EINVAL; /* empty label: "..", leading or trailing dot */
                        ret->b[o - label - 1] = (uint8_t) label;
                        label = 0;
                        if (c == 0)
                                break;
                        continue;
                }
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
                        return -EINVAL;
                /* 253 bytes of text is 254 in wire form, 255 with the root */
                if (p - name >= 253)
                        return -EINVAL;
                if (label == 0)
                        o++; /* the length byte, written when the label ends */
                ret->b[o++] = (uint8_t) c;
                label++;
        }
        ret->b[o++] = 0;
        ret->len = o;
        return 0;
}

/* A walk over one name in a message, label by label, following compression
 * pointers (RFC 1035 §4.1.4). A pointer must point into the body and strictly
 * before the run of labels it ends, so every jump goes further back: no loop.
 * Label types 01 and 10 (RFC 6891 §5) are refused. */
typedef struct name_cursor {
        size_t p;       /* the next label or pointer */
        size_t run;     /* where the current run of labels starts */
        size_t next;    /* after the first pointer: where the name ends in place */
        unsigned jumps; /* pointers followed */
} name_cursor;

static name_cursor name_cursor_at(size_t off) {
        return (name_cursor) { .p = off, .run = off };
}

/* The length (0..63) of the label at c->p, after following pointers; the
 * label's bytes are in bounds. */
static int name_label(const uint8_t *msg, size_t len, name_cursor *c) {
        for (;;) {
                if (c->p >= len)
                        return -EBADMSG;
                uint8_t b = msg[c->p];
                if ((b & 0xc0) == 0)
                        return c->p + 1 + b <= len ? b : -EBADMSG;
                if ((b & 0xc0) != 0xc0 || c->p + 1 >= len)
                        return -EBADMSG;
                size_t target = (size_t) (b & 0x3f) << 8 | msg[c->p + 1];
                if (target < HEADER_SIZE || target >= c->run || c->jumps == POINTERS_MAX)
                        return -EBADMSG;
                if (c->jumps++ == 0)
                        c->next = c->p + 2;
                c->p = c->run = target;
        }
}

/* Where the name ends as it is written, once the root label is consumed. */
static size_t name_cursor_end(const name_cursor *c) {
        return c->jumps ? c->next : c->p;
}

/* Read the name at *off into ret; *off moves past the name as written. */
static int name_read(const uint8_t *msg, size_t len, size_t *off, wire_name *ret) {
        name_cursor c = name_cursor_at(*off);
        size_t o = 0;
        int l;

        do {
                l = name_label(msg, len, &c);
                if (l < 0)
                        return l;
                if (o + 1 + (size_t) l > NAME_WIRE_MAX)
                        return -EBADMSG;
                ret->b[o++] = (uint8_t) l;
                for (int i = 0; i < l; i++)
                        ret->b[o++] = lower(msg[c.p + 1 + (size_t) i]);
                c.p += 1 + (size_t) l;
        } while (l > 0);
        ret->len = o;
        *off = name_cursor_end(&c);
        return 0;
}

/* Is the name at off want? Compared as it is walked, so a name that differs
 * costs only up to its first difference. */
static bool name_equal_at(const uint8_t *msg, size_t len, size_t off, const wire_name *want) {
        name_cursor c = name_cursor_at(off);
        size_t o = 0;
        int l;

        do {
                l = name_label(msg, len, &c);
                if (l < 0 || o + 1 + (size_t) l > want->len || want->b[o] != l)
                        return false;
                for (int i = 0; i < l; i++)
                        if (want->b[o + 1 + (size_t) i] != lower(msg[c.p + 1 + (size_t) i]))
                                return false;
                o += 1 + (size_t) l;
                c.p += 1 + (size_t) l;
        } while (l > 0);
        return o == want->len;
}

/* Step over the name at *off as it is written, without following pointers:
 * for a second walk over records that were checked already. */
static int name_skip(const uint8_t *msg, size_t len, size_t *off) {
        size_t p = *off;

        for (;;) {
                if (p >= len)
                        return -EBADMSG;
                uint8_t b = msg[p];
                if ((b & 0xc0) == 0xc0) {
                        p += 2;
                        break;
                }
                if (b & 0xc0)
                        return -EBADMSG;
                p += 1 + (size_t) b;
                if (b == 0)
                        break;
        }
        if (p > len)
                return -EBADMSG;
        *off = p;
        return 0;
}

/* --------------------------------------------------------------- records */

typedef struct record {
        size_t owner; /* offset of the owner name */
        uint16_t type, class;
        uint32_t ttl;
        size_t rdata; /* offset of the rdata */
        uint16_t rdlength;
} record;

/* The type, class, TTL and rdata of the record whose owner ends at p. */
static int record_fixed(const uint8_t *msg, size_t len, size_t p, record *ret) {
        if (p > len || len - p < 10)
                return -EBADMSG;
        ret->type = get16(msg + p);
        ret->class = get16(msg + p + 2);
        ret->ttl = get32(msg + p + 4);
        ret->rdlength = get16(msg + p + 8);
        ret->rdata = p + 10;
        if (len - ret->rdata < ret->rdlength)
                return -EBADMSG;
        return 0;
}

/* Read the record at *off and check the parts this resolver reads: the
 * owner, the bounds, the rdlength of A and AAAA, the name in a CNAME. */
static int record_read(const uint8_t *msg, size_t len, size_t *off, record *ret) {
        wire_name owner;
        size_t p = *off;
        int r;

        ret->owner = p;
        r = name_read(msg, len, &p, &owner);
        if (r < 0)
                return r;
        r = record_fixed(msg, len, p, ret);
        if (r < 0)
                return r;
        *off = ret->rdata + ret->rdlength;

        if (ret->type == DNS_TYPE_OPT) {
                /* RFC 6891 §6.1.2: owned by the root; its class is the
                 * sender's UDP size, so it is not checked against IN. */
                if (owner.len != 1)
                        return -EBADMSG;
                return 0;
        }
        if (ret->class != DNS_CLASS_IN)
                return 0;
        if ((ret->type == DNS_TYPE_A && ret->rdlength != 4) ||
            (ret->type == DNS_TYPE_AAAA && ret->rdlength != 16))
                return -EBADMSG;
        if (ret->type == DNS_TYPE_CNAME) {
                wire_name target;
                size_t t = ret->rdata;
                r = name_read(msg, len, &t, &target);
                if (r < 0)
                        return r;
                if (t != *off)
                        return -EBADMSG; /* the name must fill the rdata exactly */
        }
        return 0;
}

/* The next record of a section record_read() has checked: the owner is
 * stepped over, not read. */
static int record_next(const uint8_t *msg, size_t len, size_t *off, record *ret) {
        size_t p = *off;
        int r;

        ret->owner = p;
        r = name_skip(msg, len, &p);
        if (r < 0)
                return r;
        r = record_fixed(msg, len, p, ret);
        if (r < 0)
                return r;
        *off = ret->rdata + ret->rdlength;
        return 0;
}

/* RFC 2181 §8: a TTL with the top bit set is read as zero. */
static uint32_t record_ttl(const record *rr) {
        return rr->ttl & 0x80000000u ? 0 : rr->ttl;
}

/* ------------------------------------------------------------------ query */

int dns_build_query(const char *name, uint16_t id, uint16_t qtype, uint8_t *buf, size_t len) {
        wire_name q;
        uint8_t *p = buf;
        int r;

        if (qtype != DNS_TYPE_A && qtype != DNS_TYPE_AAAA)
                return -EINVAL;
        r = name_from_text(name, &q);
        if (r < 0)
                return r;
        size_t total = HEADER_SIZE + q.len + 4 + 11;
        if (len < total)
                return -ENOBUFS;

        p = put16(p, id);
        p = put16(p, FLAG_RD);
        p = put16(p, 1); /* QDCOUNT */
        p = put16(p, 0); /* ANCOUNT */
        p = put16(p, 0); /* NSCOUNT */
        p = put16(p, 1); /* ARCOUNT: the OPT record */
        memcpy(p, q.b, q.len);
        p += q.len;
        p = put16(p, qtype);
        p = put16(p, DNS_CLASS_IN);
        /* OPT (RFC 6891 §6.1.2): root owner, UDP size as class, extended
         * RCODE 0, version 0, DO=0, no options. */
        *p++ = 0;
        p = put16(p, DNS_TYPE_OPT);
        p = put16(p, DNS_EDNS_UDP_SIZE);
        p = put16(p, 0);
        p = put16(p, 0);
        p = put16(p, 0);
        return (int) (p - buf);
}

/* --------------------------------------------------------------- response */

/* Follow the CNAME chain in the answer section from *cur, one hop: 1 and
 * *cur moved to the target, 0 if *cur has no CNAME. */
static int cname_step(const uint8_t *msg, size_t len, size_t answers, unsigned ancount,
                      wire_name *cur, uint32_t *ttl) {
        wire_name target = { .len = 0 };
        bool found = false;
        size_t p = answers;
        record rr;
        int r;

        for (unsigned i = 0; i < ancount; i++) {
                r = record_next(msg, len, &p, &rr);
                if (r < 0)
                        return r;
                if (rr.type != DNS_TYPE_CNAME || rr.class != DNS_CLASS_IN ||
                    !name_equal_at(msg, len, rr.owner, cur))
                        continue;
                /* RFC 2181 §10.1: one CNAME per name. Two that agree are
                 * one record sent twice; two that disagree are no answer. */
                if (found) {
                        if (!name_equal_at(msg, len, rr.rdata, &target))
                                return -EBADMSG;
                } else {
                        size_t t = rr.rdata;
                        r = name_read(msg, len, &t, &target);
                        if (r < 0)
                                return r;
                        found = true;
                }
                if (record_ttl(&rr) < *ttl)
                        *ttl = record_ttl(&rr);
        }
        if (!found)
                return 0;
        *cur = target;
        return 1;
}

int dns_parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name,
                       uint16_t qtype, dns_result *ret) {
        wire_name q, qname, cur;
        size_t p, answers;
        unsigned ancount, total, n_opt = 0;
        uint16_t flags;
        unsigned rcode;
        int r;

        if (qtype != DNS_TYPE_A && qtype != DNS_TYPE_AAAA)
                return -EINVAL;
        r = name_from_text(name, &q);
        if (r < 0)
                return r;
        if (!msg || len < HEADER_SIZE || len > DNS_TCP_MSG_MAX)
                return -EBADMSG;

        /* Is this the answer to our query at all? */
        flags = get16(msg + 2);
        if (!(flags & FLAG_QR) || get16(msg) != id || (flags & FLAG_OPCODE) != 0)
                return -ENOMSG;
        /* Some servers cut a truncated answer down to its header. All it can
         * make the proxy do is ask the same nameserver again over TCP, where
         * the question is checked as here: take it as truncated. */
        if ((flags & FLAG_TC) && get16(msg + 4) == 0)
                return -EMSGSIZE;
        if (get16(msg + 4) != 1)
                return -ENOMSG;
        p = HEADER_SIZE;
        r = name_read(msg, len, &p, &qname);
        if (r < 0)
                return r;
        if (len - p < 4)
                return -EBADMSG;
        if (!wire_name_equal(&qname, &q) || get16(msg + p) != qtype ||
            get16(msg + p + 2) != DNS_CLASS_IN)
                return -ENOMSG;
        p += 4;

        /* RFC 2181 §9: a truncated answer is not used, whatever it holds. */
        if (flags & FLAG_TC)
                return -EMSGSIZE;

        /* Every record is read and checked, so a message is either whole and
         * well formed or refused, before anything in it is believed. */
        answers = p;
        ancount = get16(msg + 6);
        total = ancount + get16(msg + 8) + get16(msg + 10);
        rcode = flags & FLAG_RCODE;
        for (unsigned i = 0; i < total; i++) {
                record rr;
                r = record_read(msg, len, &p, &rr);
                if (r < 0)
                        return r;
                if (rr.type != DNS_TYPE_OPT || i < ancount + get16(msg + 8))
                        continue;
                /* RFC 6891 §6.1.1: at most one OPT, in the additional section.
                 * Its TTL holds the upper 8 bits of a 12-bit RCODE. */
                if (n_opt++ > 0)
                        return -EBADMSG;
                rcode |= (rr.ttl >> 24) << 4;
        }
        if (p != len)
                return -EBADMSG;

        if (rcode == DNS_RCODE_NXDOMAIN)
                return -ENXIO;
        if (rcode != DNS_RCODE_NOERROR)
                return -EIO;

        dns_result res = { .ttl = UINT32_MAX };
        cur = q;
        for (unsigned hops = 0;; hops++) {
                r = cname_step(msg, len, answers, ancount, &cur, &res.ttl);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                if (hops == DNS_CNAME_HOPS_MAX)
                        return -ELOOP;
        }

        p = answers;
        for (unsigned i = 0; i < ancount; i++) {
                record rr;
                egress_addr a = { 0 };
                bool dup = false;

                r = record_next(msg, len, &p, &rr);
                if (r < 0)
                        return r;
                if (rr.type != qtype || rr.class != DNS_CLASS_IN ||
                    !name_equal_at(msg, len, rr.owner, &cur))
                        continue;
                a.family = qtype == DNS_TYPE_A ? AF_INET : AF_INET6;
                if (rr.rdlength != (qtype == DNS_TYPE_A ? 4 : 16))
                        return -EBADMSG; /* record_read() refused it already */
                memcpy(a.bytes, msg + rr.rdata, rr.rdlength);
                for (size_t j = 0; j < res.n_addrs && !dup; j++)
                        dup = memcmp(&res.addrs[j], &a, sizeof a) == 0;
                if (!dup && res.n_addrs == DNS_ADDRS_MAX)
                        continue; /* dropped, so its TTL is not used */
                if (!dup)
                        res.addrs[res.n_addrs++] = a;
                /* RFC 2181 §5.2: TTLs in one RRset should agree; when they
                 * do not, the smallest is the one to trust, repeats included */
                if (record_ttl(&rr) < res.ttl)
                        res.ttl = record_ttl(&rr);
        }
        if (res.n_addrs == 0)
                return -ENODATA;
        *ret = res;
        return 0;
}

/* ------------------------------------------------------------ resolv.conf */

static bool is_blank(char c) {
        return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* One line, without its '\n': 1 and *ret if it names a usable nameserver. */
static int resolv_line(const char *s, size_t n, egress_addr *ret) {
        static const char kw[] = "nameserver";
        char text[INET6_ADDRSTRLEN];
        size_t i = 0, start;
        uint8_t b[16];

        for (size_t k = 0; k < n; k++)
                if (s[k] == '#' || s[k] == ';') {
                        n = k;
                        break;
                }
        while (i < n && is_blank(s[i]))
                i++;
        if (n - i < sizeof kw || memcmp(s + i, kw, sizeof kw - 1) != 0 ||
            !is_blank(s[i + sizeof kw - 1]))
                return 0;
        i += sizeof kw - 1;
        while (i < n && is_blank(s[i]))
                i++;
        start = i;
        while (i < n && !is_blank(s[i]))
                i++;
        if (i == start || i - start >= sizeof text || memchr(s + start, 0, i - start))
                return 0;
        memcpy(text, s + start, i - start);
        text[i - start] = 0;

        egress_addr a = { 0 };
        if (inet_pton(AF_INET, text, b) == 1) {
                a.family = AF_INET;
                memcpy(a.bytes, b, 4);
        } else if (inet_pton(AF_INET6, text, b) == 1) {
                /* "%zone" never gets here: inet_pton refuses it */
                static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
                if (memcmp(b, mapped, 12) == 0) {
                        a.family = AF_INET;
                        memcpy(a.bytes, b + 12, 4);
                } else {
                        a.family = AF_INET6;
                        memcpy(a.bytes, b, 16);
                }
        } else {
                return 0;
        }
        *ret = a;
        return 1;
}

int dns_parse_resolv_conf(const char *text, size_t len, egress_addr *ret, size_t max) {
        size_t n = 0, i = 0;

        if (!text)
                return 0;
        while (i < len && n < max) {
                const char *nl = memchr(text + i, '\n', len - i);
                size_t end = nl ? (size_t) (nl - text) : len;
                egress_addr a;
                if (resolv_line(text + i, end - i, &a) > 0)
                        ret[n++] = a;
                i = end + 1;
        }
        return (int) n;
}
