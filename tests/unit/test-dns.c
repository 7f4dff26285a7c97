/* SPDX-License-Identifier: Apache-2.0 */
/* The stub resolver's messages (lib/egress/dns.c): queries against bytes
 * written by hand, answers built record by record, every prefix and every
 * corrupted byte of a valid answer, and resolv.conf texts. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "egress/dns.h"
#include "egress/policy.h"
#include "util/macro.h"

/* ------------------------------------------------------------- builder */

#define QR_RD_RA 0x8180
#define ID 0x1234

typedef struct msg {
        uint8_t b[DNS_TCP_MSG_MAX + 16];
        size_t n;
} msg;

static void put8(msg *m, unsigned v) {
        if (m->n >= sizeof m->b)
                abort(); /* a test that outgrew its buffer */
        m->b[m->n++] = (uint8_t) v;
}

static void put16(msg *m, unsigned v) {
        put8(m, v >> 8 & 0xff);
        put8(m, v & 0xff);
}

static void put32(msg *m, uint32_t v) {
        put16(m, v >> 16);
        put16(m, v & 0xffff);
}

static void put_raw(msg *m, const void *p, size_t n) {
        if (n > sizeof m->b - m->n)
                abort();
        memcpy(m->b + m->n, p, n);
        m->n += n;
}

/* "www.example" as labels, no terminator ("" writes nothing). */
static void put_labels(msg *m, const char *dotted) {
        while (*dotted) {
                size_t l = strcspn(dotted, ".");
                put8(m, (unsigned) l);
                put_raw(m, dotted, l);
                dotted += l;
                if (*dotted == '.')
                        dotted++;
        }
}

static void put_name(msg *m, const char *dotted) {
        put_labels(m, dotted);
        put8(m, 0);
}

static void put_ptr(msg *m, size_t off) {
        put16(m, 0xc000 | (unsigned) off);
}

static void header(msg *m, unsigned id, unsigned flags, unsigned qd, unsigned an, unsigned ns,
                   unsigned ar) {
        m->n = 0;
        put16(m, id);
        put16(m, flags);
        put16(m, qd);
        put16(m, an);
        put16(m, ns);
        put16(m, ar);
}

/* Header and the question for name/qtype: the name is at offset 12. */
static void start(msg *m, unsigned flags, unsigned an, unsigned ns, unsigned ar, const char *name,
                  unsigned qtype) {
        header(m, ID, flags, 1, an, ns, ar);
        put_name(m, name);
        put16(m, qtype);
        put16(m, DNS_CLASS_IN);
}

/* The fixed part of a record, after its owner. */
static void rr_fixed(msg *m, unsigned type, uint32_t ttl, unsigned rdlength) {
        put16(m, type);
        put16(m, DNS_CLASS_IN);
        put32(m, ttl);
        put16(m, rdlength);
}

static void a_rr(msg *m, uint32_t ttl, uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
        rr_fixed(m, DNS_TYPE_A, ttl, 4);
        put_raw(m, (uint8_t[]) { a, b, c, d }, 4);
}

static void aaaa_rr(msg *m, uint32_t ttl, const char *text) {
        uint8_t b[16];
        inet_pton(AF_INET6, text, b);
        rr_fixed(m, DNS_TYPE_AAAA, ttl, 16);
        put_raw(m, b, 16);
}

/* A CNAME to target written in full. */
static void cname_rr(msg *m, uint32_t ttl, const char *target) {
        rr_fixed(m, DNS_TYPE_CNAME, ttl, (unsigned) strlen(target) + 2);
        put_name(m, target);
}

/* A CNAME whose target is labels then a pointer. */
static void cname_rr_ptr(msg *m, uint32_t ttl, const char *labels, size_t off) {
        size_t l = strlen(labels);
        rr_fixed(m, DNS_TYPE_CNAME, ttl, (unsigned) (l ? l + 1 : 0) + 2);
        put_labels(m, labels);
        put_ptr(m, off);
}

static void opt_rr(msg *m, uint8_t ext_rcode) {
        put8(m, 0);
        put16(m, DNS_TYPE_OPT);
        put16(m, 1232);
        put32(m, (uint32_t) ext_rcode << 24);
        put16(m, 0);
}

static void soa_rr(msg *m, const char *zone) {
        msg rd = { .n = 0 };
        put_name(&rd, "ns1.test");
        put_name(&rd, "hostmaster.test");
        for (int i = 0; i < 5; i++)
                put32(&rd, 3600);
        put_name(m, zone);
        rr_fixed(m, 6, 3600, (unsigned) rd.n);
        put_raw(m, rd.b, rd.n);
}

/* ------------------------------------------------------------- checks */

static const char *code_name(int r) {
        static char other[16];
        switch (r) {
        case 0:
                return "0";
        case -EBADMSG:
                return "-EBADMSG";
        case -ENOMSG:
                return "-ENOMSG";
        case -EMSGSIZE:
                return "-EMSGSIZE";
        case -ENXIO:
                return "-ENXIO";
        case -EIO:
                return "-EIO";
        case -ELOOP:
                return "-ELOOP";
        case -ENODATA:
                return "-ENODATA";
        case -EINVAL:
                return "-EINVAL";
        default:
                snprintf(other, sizeof other, "%d", r);
                return other;
        }
}

/* Test names are one TAP line: bytes outside printable ASCII as \xNN. */
static const char *show(const char *s) {
        static char b[256];
        size_t o = 0;
        for (; *s && o + 8 < sizeof b; s++) {
                unsigned char c = (unsigned char) *s;
                if (c >= 0x20 && c < 0x7f)
                        b[o++] = (char) c;
                else
                        o += (size_t) snprintf(b + o, sizeof b - o, "\\x%02x", c);
        }
        b[o] = 0;
        return b;
}

static dns_result res;

static const dns_result *sentinel(void) {
        static dns_result s;
        memset(&s, 0xa5, sizeof s);
        return &s;
}

static int parse_as(const msg *m, const char *name, unsigned qtype) {
        res = *sentinel();
        int r = dns_parse_response(m->b, m->n, ID, name, (uint16_t) qtype, &res);
        /* ret_* written only on success */
        if (r < 0 && memcmp(&res, sentinel(), sizeof res) != 0)
                return -9999;
        return r;
}

/* Do the addresses of res read as want ("1.2.3.4", "2001:db8::1", ...)? */
static bool addrs_are(const char *const *want, size_t n) {
        char text[64];
        if (res.n_addrs != n)
                return false;
        for (size_t i = 0; i < n; i++)
                if (egress_addr_format(&res.addrs[i], text, sizeof text) < 0 || !streq(text, want[i]))
                        return false;
        return true;
}

#define WANT(...)                                                                                  \
        ((const char *const[]) { __VA_ARGS__ }), ELEMENTSOF(((const char *const[]) { __VA_ARGS__ }))

static void expect_ok(const char *what, const msg *m, const char *name, unsigned qtype,
                      const char *const *want, size_t n, uint32_t ttl) {
        int r = parse_as(m, name, qtype);
        ok(r == 0 && addrs_are(want, n) && res.ttl == ttl,
           "%s: %zu address(es), ttl %u (got %d, %zu, %u)", what, n, ttl, r,
           r == 0 ? res.n_addrs : 0, r == 0 ? res.ttl : 0);
}

static void expect_err(const char *what, const msg *m, const char *name, unsigned qtype, int code) {
        int r = parse_as(m, name, qtype);
        ok(r == code, "%s: %s (got %s)", what, code_name(code), code_name(r));
}

/* ----------------------------------------------------------------- query */

static void test_query(void) {
        /* sizeof - 1: the literal's own NUL is not part of the query */
        static const char want_a[] = "\xbe\xef\x01\x00"                 /* id, RD */
                                     "\x00\x01\x00\x00\x00\x00\x00\x01" /* QD 1, AR 1 */
                                     "\x07"
                                     "example"
                                     "\x03"
                                     "com"
                                     "\x00"
                                     "\x00\x01\x00\x01"          /* A, IN */
                                     "\x00\x00\x29\x04\xd0"      /* root, OPT, 1232 */
                                     "\x00\x00\x00\x00\x00\x00"; /* TTL 0, rdlength 0 */
        static const char want_aaaa[] = "\x00\x01\x01\x00"
                                        "\x00\x01\x00\x00\x00\x00\x00\x01"
                                        "\x09"
                                        "localhost"
                                        "\x00"
                                        "\x00\x1c\x00\x01" /* AAAA, IN */
                                        "\x00\x00\x29\x04\xd0"
                                        "\x00\x00\x00\x00\x00\x00";
        uint8_t buf[DNS_QUERY_MAX + 8];
        char name[300];
        int n;

        n = dns_build_query("example.com", 0xbeef, DNS_TYPE_A, buf, sizeof buf);
        ok(n == (int) sizeof want_a - 1 && memcmp(buf, want_a, sizeof want_a - 1) == 0,
           "query example.com A id 0xbeef: RD, one question, OPT 1232 (got %d)", n);
        n = dns_build_query("localhost", 1, DNS_TYPE_AAAA, buf, sizeof buf);
        ok(n == (int) sizeof want_aaaa - 1 && memcmp(buf, want_aaaa, sizeof want_aaaa - 1) == 0,
           "query localhost AAAA id 1 (got %d)", n);
        n = dns_build_query("a-0.b9.test", 7, DNS_TYPE_A, buf, sizeof buf);
        ok(n == 12 + 13 + 4 + 11 && buf[12] == 3 && buf[16] == 2 && buf[19] == 4 && buf[24] == 0,
           "query a-0.b9.test: labels 3, 2, 4 (got %d)", n);

        n = dns_build_query("example.com", 1, DNS_TYPE_A, buf, sizeof want_a - 1);
        ok(n == (int) sizeof want_a - 1, "query in a buffer of its exact size");
        n = dns_build_query("example.com", 1, DNS_TYPE_A, buf, sizeof want_a - 2);
        ok(n == -ENOBUFS, "query in a buffer one byte short: -ENOBUFS (got %d)", n);
        ok(dns_build_query("example.com", 1, DNS_TYPE_A, NULL, 0) == -ENOBUFS,
           "query into no buffer: -ENOBUFS");

        /* 63-byte labels pass, 64 do not */
        memset(name, 'a', 63);
        strcpy(name + 63, ".test");
        ok(dns_build_query(name, 1, DNS_TYPE_A, buf, sizeof buf) == 12 + 70 + 4 + 11,
           "63-byte label accepted");
        memset(name, 'a', 64);
        strcpy(name + 64, ".test");
        ok(dns_build_query(name, 1, DNS_TYPE_A, buf, sizeof buf) == -EINVAL,
           "64-byte label: -EINVAL");

        /* 253 bytes of text pass (255 in wire form), 254 do not */
        memset(name, 'a', 253);
        for (size_t i = 63; i < 253; i += 64)
                name[i] = '.';
        name[253] = 0;
        n = dns_build_query(name, 1, DNS_TYPE_A, buf, sizeof buf);
        ok(n == DNS_QUERY_MAX, "253-byte name: %d bytes = DNS_QUERY_MAX", n);
        name[253] = 'a';
        name[254] = 0;
        ok(dns_build_query(name, 1, DNS_TYPE_A, buf, sizeof buf) == -EINVAL,
           "254-byte name: -EINVAL");

        static const char *const bad[] = {
                "",         ".",          "a..b",     ".a.test",   "a.test.",       "A.test",
                "a_b.test", "a b.test",   "a.test\n", "a%2e.test", "\xc3\xa9.test", "a\\.b.test",
                "*.test",   "a.test:443", "[::1]",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                ok(dns_build_query(bad[i], 1, DNS_TYPE_A, buf, sizeof buf) == -EINVAL,
                   "query for non-canonical name \"%s\": -EINVAL", show(bad[i]));
        ok(dns_build_query(NULL, 1, DNS_TYPE_A, buf, sizeof buf) == -EINVAL, "NULL name: -EINVAL");
        ok(dns_build_query("a.test", 1, DNS_TYPE_CNAME, buf, sizeof buf) == -EINVAL,
           "qtype CNAME: -EINVAL");
        ok(dns_build_query("a.test", 1, 255, buf, sizeof buf) == -EINVAL, "qtype ANY: -EINVAL");

        /* our own query is not an answer; with QR set it is NOERROR, no data */
        msg m = { .n = 0 };
        m.n = (size_t) dns_build_query("example.com", ID, DNS_TYPE_A, m.b, sizeof m.b);
        expect_err("our query read as an answer", &m, "example.com", DNS_TYPE_A, -ENOMSG);
        m.b[2] |= 0x80;
        expect_err("our query with QR=1", &m, "example.com", DNS_TYPE_A, -ENODATA);
}

/* --------------------------------------------------------------- answers */

static void test_answers(void) {
        msg m;

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 93, 184, 216, 34);
        expect_ok("plain A", &m, "example.com", DNS_TYPE_A, WANT("93.184.216.34"), 300);

        start(&m, QR_RD_RA, 1, 0, 1, "example.com", DNS_TYPE_A);
        put_name(&m, "EXAMPLE.com");
        a_rr(&m, 60, 10, 0, 0, 1);
        opt_rr(&m, 0);
        expect_ok("A with OPT, owner in capitals", &m, "example.com", DNS_TYPE_A, WANT("10.0.0.1"),
                  60);

        start(&m, QR_RD_RA, 4, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 1, 1, 1);
        put_ptr(&m, 12);
        a_rr(&m, 200, 2, 2, 2, 2);
        put_ptr(&m, 12);
        a_rr(&m, 100, 1, 1, 1, 1);
        put_ptr(&m, 12);
        a_rr(&m, 400, 3, 3, 3, 3);
        expect_ok("several A, one repeated: deduplicated, order kept, smallest TTL", &m,
                  "example.com", DNS_TYPE_A, WANT("1.1.1.1", "2.2.2.2", "3.3.3.3"), 100);

        start(&m, QR_RD_RA, 3, 0, 0, "example.com", DNS_TYPE_AAAA);
        put_ptr(&m, 12);
        aaaa_rr(&m, 30, "2001:db8::1");
        put_ptr(&m, 12);
        a_rr(&m, 5, 9, 9, 9, 9); /* not the type asked: ignored, TTL not used */
        put_ptr(&m, 12);
        aaaa_rr(&m, 40, "::ffff:10.0.0.1");
        expect_ok("AAAA (A ignored, IPv4-mapped kept as IPv6)", &m, "example.com", DNS_TYPE_AAAA,
                  WANT("2001:db8::1", "::ffff:a00:1"), 30);
        ok(res.addrs[0].family == AF_INET6 && res.addrs[1].family == AF_INET6,
           "AAAA addresses are AF_INET6");
        expect_err("the same answer for qtype A", &m, "example.com", DNS_TYPE_A, -ENOMSG);

        /* the mixed-case question of a server doing 0x20 */
        start(&m, QR_RD_RA, 1, 0, 0, "ExAmPlE.CoM", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_ok("question and owner in mixed case", &m, "example.com", DNS_TYPE_A,
                  WANT("1.2.3.4"), 300);

        /* RFC 2181 §8: TTL with the top bit set is zero */
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 0x80000001u, 1, 2, 3, 4);
        expect_ok("TTL 2^31+1 read as 0", &m, "example.com", DNS_TYPE_A, WANT("1.2.3.4"), 0);

        /* more addresses than DNS_ADDRS_MAX: the first ones kept */
        start(&m, QR_RD_RA, DNS_ADDRS_MAX + 3, 0, 0, "example.com", DNS_TYPE_A);
        for (unsigned i = 0; i < DNS_ADDRS_MAX + 3; i++) {
                put_ptr(&m, 12);
                a_rr(&m, 1000 - i, 10, 0, 0, (uint8_t) i);
        }
        int r = parse_as(&m, "example.com", DNS_TYPE_A);
        ok(r == 0 && res.n_addrs == DNS_ADDRS_MAX && res.addrs[DNS_ADDRS_MAX - 1].bytes[3] == 31 &&
                   res.ttl == 1000 - (DNS_ADDRS_MAX - 1),
           "%d A records: %d kept, TTL of those kept (got %d, %zu)", DNS_ADDRS_MAX + 3,
           DNS_ADDRS_MAX, r, r == 0 ? res.n_addrs : 0);

        /* longer than a UDP answer may be: what TCP brings after a TC */
        start(&m, QR_RD_RA, 300, 0, 0, "example.com", DNS_TYPE_A);
        for (unsigned i = 0; i < 300; i++) {
                put_ptr(&m, 12);
                a_rr(&m, 60, 10, 1, (uint8_t) (i >> 8), (uint8_t) i);
        }
        r = parse_as(&m, "example.com", DNS_TYPE_A);
        ok(m.n > DNS_MSG_MAX && r == 0 && res.n_addrs == DNS_ADDRS_MAX && res.addrs[0].bytes[1] == 1,
           "a %zu-byte answer (over TCP): parsed, %d addresses kept (got %d)", m.n, DNS_ADDRS_MAX, r);
}

static void test_cnames(void) {
        msg m;
        size_t cdn;

        /* www.example.com -> a.cdn.test -> b.cdn.test -> A, compressed */
        start(&m, QR_RD_RA, 3, 0, 0, "www.example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 3600, "a.cdn.test");
        cdn = m.n - 12; /* "a.cdn.test" */
        put_ptr(&m, cdn);
        cname_rr_ptr(&m, 50, "b", cdn + 2); /* b + "cdn.test" */
        put_ptr(&m, m.n - 4);               /* "b" + ptr */
        a_rr(&m, 120, 192, 0, 2, 7);
        expect_ok("CNAME chain of 2, compressed: TTL includes the CNAMEs", &m, "www.example.com",
                  DNS_TYPE_A, WANT("192.0.2.7"), 50);

        /* the same chain, records in reverse order */
        start(&m, QR_RD_RA, 3, 0, 0, "www.example.com", DNS_TYPE_A);
        put_name(&m, "b.cdn.test");
        a_rr(&m, 120, 192, 0, 2, 7);
        put_name(&m, "a.cdn.test");
        cname_rr(&m, 3600, "b.cdn.test");
        put_ptr(&m, 12);
        cname_rr(&m, 3600, "a.cdn.test");
        expect_ok("CNAME chain in reverse order", &m, "www.example.com", DNS_TYPE_A,
                  WANT("192.0.2.7"), 120);

        /* addresses of the name asked and of a chain member are not the end */
        start(&m, QR_RD_RA, 5, 0, 0, "www.example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 10, 6, 6, 6, 6);
        put_ptr(&m, 12);
        cname_rr(&m, 300, "a.cdn.test");
        put_name(&m, "a.cdn.test");
        cname_rr(&m, 300, "b.cdn.test");
        put_name(&m, "a.cdn.test");
        a_rr(&m, 10, 7, 7, 7, 7);
        put_name(&m, "b.cdn.test");
        a_rr(&m, 300, 8, 8, 8, 8);
        expect_ok("A records of names before the chain end ignored", &m, "www.example.com",
                  DNS_TYPE_A, WANT("8.8.8.8"), 300);

        /* a CNAME in a class other than IN is not followed */
        start(&m, QR_RD_RA, 2, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        put16(&m, DNS_TYPE_CNAME);
        put16(&m, 3); /* CH */
        put32(&m, 1);
        put16(&m, 2);
        put_ptr(&m, 12);
        put_ptr(&m, 12);
        a_rr(&m, 9, 1, 2, 3, 4);
        expect_ok("CNAME in class CH ignored", &m, "example.com", DNS_TYPE_A, WANT("1.2.3.4"), 9);

        /* loops */
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr_ptr(&m, 1, "", 12);
        expect_err("CNAME to itself", &m, "example.com", DNS_TYPE_A, -ELOOP);

        start(&m, QR_RD_RA, 3, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 1, "b.test");
        put_name(&m, "b.test");
        cname_rr_ptr(&m, 1, "", 12);
        put_name(&m, "b.test");
        a_rr(&m, 1, 1, 2, 3, 4);
        expect_err("CNAME loop of two (with an A for one member)", &m, "example.com", DNS_TYPE_A,
                   -ELOOP);

        /* hop limit: h0 -> h1 -> ... ; DNS_CNAME_HOPS_MAX hops pass, one more does not */
        for (unsigned hops = DNS_CNAME_HOPS_MAX; hops <= DNS_CNAME_HOPS_MAX + 1; hops++) {
                char owner[32], target[32];
                start(&m, QR_RD_RA, hops + 1, 0, 0, "h0.test", DNS_TYPE_A);
                for (unsigned i = 0; i < hops; i++) {
                        snprintf(owner, sizeof owner, "h%u.test", i);
                        snprintf(target, sizeof target, "h%u.test", i + 1);
                        put_name(&m, owner);
                        cname_rr(&m, 100 + i, target);
                }
                put_name(&m, target);
                a_rr(&m, 500, 10, 9, 8, 7);
                if (hops == DNS_CNAME_HOPS_MAX)
                        expect_ok("chain of DNS_CNAME_HOPS_MAX CNAMEs", &m, "h0.test", DNS_TYPE_A,
                                  WANT("10.9.8.7"), 100);
                else
                        expect_err("chain of DNS_CNAME_HOPS_MAX + 1 CNAMEs", &m, "h0.test",
                                   DNS_TYPE_A, -ELOOP);
        }

        /* two CNAMEs for one name: the same target is one record, twice */
        start(&m, QR_RD_RA, 3, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 9, "b.test");
        put_ptr(&m, 12);
        cname_rr(&m, 8, "B.TEST");
        put_name(&m, "b.test");
        a_rr(&m, 10, 1, 2, 3, 4);
        expect_ok("the same CNAME twice", &m, "example.com", DNS_TYPE_A, WANT("1.2.3.4"), 8);
        start(&m, QR_RD_RA, 3, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 9, "b.test");
        put_ptr(&m, 12);
        cname_rr(&m, 9, "c.test");
        put_name(&m, "b.test");
        a_rr(&m, 10, 1, 2, 3, 4);
        expect_err("two different CNAMEs for one name", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        /* a chain to a name with no address */
        start(&m, QR_RD_RA, 1, 1, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 9, "b.test");
        soa_rr(&m, "test");
        expect_err("CNAME to a name with no A", &m, "example.com", DNS_TYPE_A, -ENODATA);

        /* a CNAME label holding a dot is not two labels */
        start(&m, QR_RD_RA, 2, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_CNAME, 9, 8);
        put_raw(&m,
                "\x06"
                "b.test"
                "\x00",
                8);
        put_name(&m, "b.test");
        a_rr(&m, 10, 1, 2, 3, 4);
        expect_err("CNAME to the one label \"b.test\"", &m, "example.com", DNS_TYPE_A, -ENODATA);
}

static void test_other_owners(void) {
        msg m;

        /* answers, authority and additional records for names not asked */
        start(&m, QR_RD_RA, 3, 1, 2, "example.com", DNS_TYPE_A);
        put_name(&m, "evil.test");
        a_rr(&m, 300, 6, 6, 6, 6);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        put_name(&m, "com");
        a_rr(&m, 300, 6, 6, 6, 7);
        put_name(&m, "evil.test");
        a_rr(&m, 300, 6, 6, 6, 8);
        put_ptr(&m, 12);
        a_rr(&m, 1, 6, 6, 6, 9); /* the name asked, but in the additional section */
        opt_rr(&m, 0);
        expect_ok("records for other owners, and outside the answer section, ignored", &m,
                  "example.com", DNS_TYPE_A, WANT("1.2.3.4"), 300);

        start(&m, QR_RD_RA, 1, 0, 1, "example.com", DNS_TYPE_A);
        put_name(&m, "www.example.com");
        a_rr(&m, 300, 6, 6, 6, 6);
        put_ptr(&m, 12);
        a_rr(&m, 300, 6, 6, 6, 7);
        expect_err("only records for other owners", &m, "example.com", DNS_TYPE_A, -ENODATA);

        /* a CNAME for another name is not a step of the chain */
        start(&m, QR_RD_RA, 2, 0, 0, "example.com", DNS_TYPE_A);
        put_name(&m, "other.test");
        cname_rr(&m, 9, "evil.test");
        put_name(&m, "evil.test");
        a_rr(&m, 10, 6, 6, 6, 6);
        expect_err("CNAME for another owner not followed", &m, "example.com", DNS_TYPE_A, -ENODATA);
}

static void test_not_ours(void) {
        msg m;

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        ok(dns_parse_response(m.b, m.n, ID + 1, "example.com", DNS_TYPE_A, &res) == -ENOMSG,
           "another id: -ENOMSG");
        expect_err("another name", &m, "example.org", DNS_TYPE_A, -ENOMSG);
        expect_err("a name one label longer", &m, "www.example.com", DNS_TYPE_A, -ENOMSG);
        expect_err("another qtype", &m, "example.com", DNS_TYPE_AAAA, -ENOMSG);
        m.b[2] &= 0x7f;
        expect_err("QR=0", &m, "example.com", DNS_TYPE_A, -ENOMSG);
        m.b[2] |= 0x80 | 0x10; /* opcode 2 (STATUS) */
        expect_err("opcode STATUS", &m, "example.com", DNS_TYPE_A, -ENOMSG);

        start(&m, QR_RD_RA, 0, 0, 0, "example.com", DNS_TYPE_A);
        m.b[m.n - 1] = 3; /* class CH */
        expect_err("question in class CH", &m, "example.com", DNS_TYPE_A, -ENOMSG);

        header(&m, ID, QR_RD_RA | 2, 0, 0, 0, 0);
        expect_err("no question (SERVFAIL)", &m, "example.com", DNS_TYPE_A, -ENOMSG);
        header(&m, ID, QR_RD_RA, 2, 0, 0, 0);
        put_name(&m, "example.com");
        put16(&m, 1);
        put16(&m, 1);
        put_ptr(&m, 12);
        put16(&m, 1);
        put16(&m, 1);
        expect_err("two questions", &m, "example.com", DNS_TYPE_A, -ENOMSG);

        /* a name the query could not have had */
        start(&m, QR_RD_RA, 0, 0, 0, "example.com", DNS_TYPE_A);
        expect_err("parse for a non-canonical name", &m, "Example.com", DNS_TYPE_A, -EINVAL);
        expect_err("parse for qtype CNAME", &m, "example.com", DNS_TYPE_CNAME, -EINVAL);
}

static void test_rcodes(void) {
        msg m;

        /* TC: whatever follows the question is not read */
        start(&m, QR_RD_RA | 0x0200, 3, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("TC=1 with a partial answer", &m, "example.com", DNS_TYPE_A, -EMSGSIZE);
        start(&m, QR_RD_RA | 0x0200, 0, 0, 0, "example.com", DNS_TYPE_A);
        expect_err("TC=1, empty", &m, "example.com", DNS_TYPE_A, -EMSGSIZE);
        /* a truncated answer cut down to its header: no question to check */
        m.n = 0;
        header(&m, ID, QR_RD_RA | 0x0200, 0, 0, 0, 0);
        expect_err("TC=1, header only", &m, "example.com", DNS_TYPE_A, -EMSGSIZE);
        m.n = 0;
        header(&m, ID ^ 1, QR_RD_RA | 0x0200, 0, 0, 0, 0);
        expect_err("TC=1, header only, another id", &m, "example.com", DNS_TYPE_A, -ENOMSG);
        m.n = 0;
        header(&m, ID, QR_RD_RA, 0, 0, 0, 0);
        expect_err("no question and no TC", &m, "example.com", DNS_TYPE_A, -ENOMSG);

        start(&m, QR_RD_RA | DNS_RCODE_NXDOMAIN, 0, 1, 1, "nope.example.com", DNS_TYPE_A);
        soa_rr(&m, "example.com");
        opt_rr(&m, 0);
        expect_err("NXDOMAIN with SOA", &m, "nope.example.com", DNS_TYPE_A, -ENXIO);

        start(&m, QR_RD_RA | DNS_RCODE_NXDOMAIN, 1, 0, 0, "www.example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 9, "gone.test");
        expect_err("NXDOMAIN at the end of a CNAME", &m, "www.example.com", DNS_TYPE_A, -ENXIO);

        static const unsigned other[] = {
                DNS_RCODE_FORMERR, DNS_RCODE_SERVFAIL, DNS_RCODE_NOTIMP, DNS_RCODE_REFUSED, 9, 15
        };
        for (size_t i = 0; i < ELEMENTSOF(other); i++) {
                start(&m, QR_RD_RA | other[i], 1, 0, 0, "example.com", DNS_TYPE_A);
                put_ptr(&m, 12);
                a_rr(&m, 300, 1, 2, 3, 4);
                char what[64];
                snprintf(what, sizeof what, "RCODE %u, even with an answer", other[i]);
                expect_err(what, &m, "example.com", DNS_TYPE_A, -EIO);
        }

        /* extended RCODE BADVERS (16): 1 in the OPT, 0 in the header */
        start(&m, QR_RD_RA, 1, 0, 1, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        opt_rr(&m, 1);
        expect_err("extended RCODE BADVERS", &m, "example.com", DNS_TYPE_A, -EIO);

        start(&m, QR_RD_RA, 0, 1, 1, "example.com", DNS_TYPE_A);
        soa_rr(&m, "example.com");
        opt_rr(&m, 0);
        expect_err("NOERROR, no answer", &m, "example.com", DNS_TYPE_A, -ENODATA);
}

static void test_malformed(void) {
        msg m;

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        put8(&m, 0);
        expect_err("a byte after the last record", &m, "example.com", DNS_TYPE_A, -EBADMSG);
        m.b[7] = 2;
        m.n--;
        expect_err("ANCOUNT 2, one record", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_A, 300, 5);
        put_raw(&m, "\1\2\3\4\5", 5);
        expect_err("A with rdlength 5", &m, "example.com", DNS_TYPE_A, -EBADMSG);
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_A, 300, 3);
        put_raw(&m, "\1\2\3", 3);
        expect_err("A with rdlength 3", &m, "example.com", DNS_TYPE_A, -EBADMSG);
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_AAAA);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_AAAA, 300, 4);
        put_raw(&m, "\1\2\3\4", 4);
        expect_err("AAAA with rdlength 4", &m, "example.com", DNS_TYPE_AAAA, -EBADMSG);
        start(&m, QR_RD_RA, 2, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        a_rr(&m, 300, 1, 2, 3, 4);
        put_name(&m, "other.test");
        rr_fixed(&m, DNS_TYPE_AAAA, 300, 15);
        put_raw(&m, "0123456789abcde", 15);
        expect_err("AAAA with rdlength 15 for another owner", &m, "example.com", DNS_TYPE_A,
                   -EBADMSG);
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_A, 300, 10);
        put_raw(&m, "\1\2\3\4", 4);
        expect_err("rdlength past the end", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_CNAME, 300, 9);
        put_name(&m, "b.test");
        put8(&m, 0);
        expect_err("CNAME rdata longer than its name", &m, "example.com", DNS_TYPE_A, -EBADMSG);
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        rr_fixed(&m, DNS_TYPE_CNAME, 300, 3);
        put_name(&m, "b.test");
        m.b[7] = 1;
        expect_err("CNAME name running past its rdata", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 0, 0, 2, "example.com", DNS_TYPE_A);
        opt_rr(&m, 0);
        opt_rr(&m, 0);
        expect_err("two OPT records", &m, "example.com", DNS_TYPE_A, -EBADMSG);
        start(&m, QR_RD_RA, 0, 0, 1, "example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        put16(&m, DNS_TYPE_OPT);
        put16(&m, 1232);
        put32(&m, 0);
        put16(&m, 0);
        expect_err("OPT not owned by the root", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        static uint8_t big[DNS_TCP_MSG_MAX + 1];
        ok(dns_parse_response(big, sizeof big, 0, "a.test", DNS_TYPE_A, &res) == -EBADMSG,
           "message over DNS_TCP_MSG_MAX: -EBADMSG");
        ok(dns_parse_response(big, 11, 0, "a.test", DNS_TYPE_A, &res) == -EBADMSG,
           "11 bytes: -EBADMSG");
        ok(dns_parse_response(NULL, 0, 0, "a.test", DNS_TYPE_A, &res) == -EBADMSG,
           "no message: -EBADMSG");
}

static void test_pointers(void) {
        msg m;
        size_t at;

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        at = m.n;
        put_ptr(&m, at);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("pointer to itself", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        at = m.n;
        put_labels(&m, "www");
        put_ptr(&m, at);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("pointer to the start of its own name", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        /* two names pointing at each other: the second pointer goes forward */
        start(&m, QR_RD_RA, 2, 0, 0, "example.com", DNS_TYPE_A);
        at = m.n;
        put_labels(&m, "a");
        put_ptr(&m, at + 2 + 2 + 10 + 4);
        a_rr(&m, 300, 1, 2, 3, 4);
        put_labels(&m, "b");
        put_ptr(&m, at);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("two names pointing at each other", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, m.n + 20);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("forward pointer", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 0x3fff);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("pointer past the end", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put_ptr(&m, 4);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("pointer into the header", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        header(&m, ID, QR_RD_RA, 1, 0, 0, 0);
        put_ptr(&m, 12);
        put16(&m, 1);
        put16(&m, 1);
        expect_err("question that points at itself", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 0, 0, 0, "example.com", DNS_TYPE_A);
        m.n -= 4;
        put8(&m, 0xc0);
        expect_err("pointer cut after its first byte", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put8(&m, 0x41); /* label type 01: extended (RFC 6891 §5) */
        put8(&m, 0);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("label type 01", &m, "example.com", DNS_TYPE_A, -EBADMSG);
        start(&m, QR_RD_RA, 1, 0, 0, "example.com", DNS_TYPE_A);
        put8(&m, 0x81);
        put8(&m, 0);
        a_rr(&m, 300, 1, 2, 3, 4);
        expect_err("label type 10", &m, "example.com", DNS_TYPE_A, -EBADMSG);

        /* names of 255 bytes pass, 256 do not, also when made of pointers:
         * record 1 (root owner, type 99) carries "x{63}.x{63}." in its rdata;
         * record 2's owner is "y{k}" "x{63}" and a pointer to it, so
         * 1+k + 64 + 129 = 255 for k = 61 and 256 for k = 62. */
        char x63[64], y[64];
        memset(x63, 'x', 63);
        x63[63] = 0;
        for (int k = 61; k <= 62; k++) {
                header(&m, ID, QR_RD_RA, 1, 0, 0, 2);
                put_name(&m, "example.com");
                put16(&m, DNS_TYPE_A);
                put16(&m, DNS_CLASS_IN);
                put8(&m, 0);
                rr_fixed(&m, 99, 1, 129);
                at = m.n;
                put_labels(&m, x63);
                put_name(&m, x63);
                memset(y, 'y', (size_t) k);
                y[k] = 0;
                put_labels(&m, y);
                put_labels(&m, x63);
                put_ptr(&m, at);
                rr_fixed(&m, 99, 1, 0);
                if (k == 62)
                        expect_err("owner of 256 bytes through a pointer", &m, "example.com",
                                   DNS_TYPE_A, -EBADMSG);
                else
                        expect_err("owner of 255 bytes through a pointer", &m, "example.com",
                                   DNS_TYPE_A, -ENODATA);
        }
}

/* A name through 16 pointers passes, through 17 does not: record 1 (root
 * owner, type 99) carries a root label and a chain of pointers, each to the
 * one before; record 2's owner is a pointer into that chain. */
static void test_pointer_chain(void) {
        msg m;

        for (unsigned jumps = 16; jumps <= 17; jumps++) {
                size_t root, chain;
                header(&m, ID, QR_RD_RA, 1, 0, 0, 2);
                put_name(&m, "example.com");
                put16(&m, DNS_TYPE_A);
                put16(&m, DNS_CLASS_IN);
                put8(&m, 0);
                rr_fixed(&m, 99, 1, 1 + 2 * 20);
                root = m.n;
                put8(&m, 0);
                chain = m.n;
                for (unsigned i = 0; i < 20; i++)
                        put_ptr(&m, i == 0 ? root : chain + 2 * (i - 1));
                /* the owner's own pointer is jump 1, into the chain at jumps - 1 */
                put_ptr(&m, chain + 2 * (jumps - 2));
                rr_fixed(&m, 99, 1, 0);
                char what[64];
                snprintf(what, sizeof what, "a name through %u pointers", jumps);
                expect_err(what, &m, "example.com", DNS_TYPE_A, jumps <= 16 ? -ENODATA : -EBADMSG);
        }
}

/* Every prefix of a valid answer is -EBADMSG; every byte changed to every
 * value gives an answer in the documented set, never a read out of bounds
 * (the ASan build runs this). */
static void test_prefixes_and_bytes(void) {
        msg m, c;
        size_t cdn;
        unsigned bad_prefix = 0, bad_byte = 0;

        start(&m, QR_RD_RA, 4, 1, 2, "www.example.com", DNS_TYPE_A);
        put_ptr(&m, 12);
        cname_rr(&m, 3600, "a.cdn.test");
        cdn = m.n - 12;
        put_ptr(&m, cdn);
        a_rr(&m, 120, 192, 0, 2, 7);
        put_ptr(&m, cdn);
        a_rr(&m, 120, 192, 0, 2, 8);
        put_ptr(&m, cdn + 2);
        aaaa_rr(&m, 120, "2001:db8::1");
        soa_rr(&m, "cdn.test");
        put_name(&m, "ns1.test");
        a_rr(&m, 1, 10, 0, 0, 1);
        opt_rr(&m, 0);
        expect_ok("the full answer", &m, "www.example.com", DNS_TYPE_A,
                  WANT("192.0.2.7", "192.0.2.8"), 120);

        for (size_t n = 0; n < m.n; n++) {
                c = m;
                c.n = n;
                if (parse_as(&c, "www.example.com", DNS_TYPE_A) != -EBADMSG)
                        bad_prefix++;
        }
        ok(bad_prefix == 0, "all %zu prefixes: -EBADMSG, result untouched (%u did not)", m.n,
           bad_prefix);

        for (size_t i = 0; i < m.n; i++)
                for (unsigned v = 0; v < 256; v++) {
                        c = m;
                        c.b[i] = (uint8_t) v;
                        int r = parse_as(&c, "www.example.com", DNS_TYPE_A);
                        bool good = r == 0 || r == -EBADMSG || r == -ENOMSG || r == -EMSGSIZE ||
                                r == -ENXIO || r == -EIO || r == -ELOOP || r == -ENODATA;
                        if (r == 0)
                                good = good && res.n_addrs >= 1 && res.n_addrs <= DNS_ADDRS_MAX &&
                                        res.addrs[0].family == AF_INET;
                        if (!good)
                                bad_byte++;
                }
        ok(bad_byte == 0, "every byte set to every value: a documented answer (%u not)", bad_byte);

        /* NXDOMAIN prefixes too */
        start(&m, QR_RD_RA | DNS_RCODE_NXDOMAIN, 0, 1, 1, "nope.example.com", DNS_TYPE_AAAA);
        soa_rr(&m, "example.com");
        opt_rr(&m, 0);
        bad_prefix = 0;
        for (size_t n = 0; n < m.n; n++) {
                c = m;
                c.n = n;
                if (parse_as(&c, "nope.example.com", DNS_TYPE_AAAA) != -EBADMSG)
                        bad_prefix++;
        }
        ok(bad_prefix == 0 && parse_as(&m, "nope.example.com", DNS_TYPE_AAAA) == -ENXIO,
           "NXDOMAIN: -ENXIO whole, all %zu prefixes -EBADMSG (%u did not)", m.n, bad_prefix);
}

/* ----------------------------------------------------------- resolv.conf */

static bool servers_are(const egress_addr *got, int n, const char *const *want, size_t nwant) {
        char text[64];
        if (n < 0 || (size_t) n != nwant)
                return false;
        for (size_t i = 0; i < nwant; i++)
                if (egress_addr_format(&got[i], text, sizeof text) < 0 || !streq(text, want[i]))
                        return false;
        return true;
}

static void test_resolv_conf(void) {
        static const char conf[] = "# Generated by NetworkManager\n"
                                   "; old style comment\n"
                                   "search example.com corp.test\n"
                                   "nameserver 10.0.0.1\n"
                                   "nameserver   2001:db8::53   # secondary\n"
                                   "options ndots:5 timeout:1\n"
                                   "nameserver fe80::1%eth0\n"
                                   "nameserver 1.2.3.4#53\n"
                                   "nameserver\n"
                                   "nameserver \n"
                                   "nameserverx 5.5.5.5\n"
                                   "#nameserver 5.5.5.6\n"
                                   "  nameserver 9.9.9.9\n"
                                   "nameserver ::ffff:8.8.8.8\n"
                                   "nameserver 127.1\n"
                                   "nameserver dns.example.com\n"
                                   "nameserver 256.1.1.1\n"
                                   "NAMESERVER 5.5.5.7\n"
                                   "nameserver 1.1.1.1\r\n"
                                   "nameserver\t8.8.4.4 extra words\n"
                                   "nameserver [::1]\n"
                                   "nameserver ::1";
        egress_addr got[16], keep;
        int n;

        n = dns_parse_resolv_conf(conf, sizeof conf - 1, got, ELEMENTSOF(got));
        ok(servers_are(got, n,
                       WANT("10.0.0.1", "2001:db8::53", "1.2.3.4", "9.9.9.9", "8.8.8.8", "1.1.1.1",
                            "8.8.4.4", "::1")),
           "resolv.conf: 8 usable nameservers, in order (got %d)", n);
        ok(got[4].family == AF_INET && got[7].family == AF_INET6,
           "IPv4-mapped nameserver is AF_INET, ::1 AF_INET6");

        memset(got, 0xee, sizeof got);
        memset(&keep, 0xee, sizeof keep);
        n = dns_parse_resolv_conf(conf, sizeof conf - 1, got, 3);
        ok(servers_are(got, n, WANT("10.0.0.1", "2001:db8::53", "1.2.3.4")) &&
                   memcmp(&got[3], &keep, sizeof keep) == 0,
           "max 3: the first 3, nothing written after them (got %d)", n);
        memset(got, 0xee, sizeof got);
        n = dns_parse_resolv_conf(conf, sizeof conf - 1, got, 0);
        ok(n == 0 && memcmp(&got[0], &keep, sizeof keep) == 0, "max 0: 0, nothing written");

        n = dns_parse_resolv_conf(conf, 0, got, ELEMENTSOF(got));
        ok(n == 0, "empty text: 0");
        n = dns_parse_resolv_conf(NULL, 0, NULL, 0);
        ok(n == 0, "NULL text: 0");
        static const char none[] = "search a.test\noptions rotate\n";
        ok(dns_parse_resolv_conf(none, sizeof none - 1, got, ELEMENTSOF(got)) == 0,
           "no nameserver line: 0");

        /* length, not NUL, ends the text; a NUL inside an address spoils it */
        static const char nul[] = "nameserver 1.2.3.4\0garbage\nnameserver 4.3.2.1\n";
        n = dns_parse_resolv_conf(nul, sizeof nul - 1, got, ELEMENTSOF(got));
        ok(servers_are(got, n, WANT("4.3.2.1")), "NUL inside an address: skipped (got %d)", n);
        n = dns_parse_resolv_conf("nameserver 1.2.3.4", 14, got, ELEMENTSOF(got));
        ok(n == 0, "text cut in the middle of an address by its length: 0 (got %d)", n);

        /* 45 bytes of address text pass (the longest IPv6 text), 46 do not */
        static const char longest[] = "nameserver ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255\n"
                                      "nameserver 0ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255\n";
        n = dns_parse_resolv_conf(longest, sizeof longest - 1, got, ELEMENTSOF(got));
        ok(servers_are(got, n, WANT("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")),
           "45-byte address accepted, 46-byte refused (got %d)", n);
}

int main(void) {
        test_query();
        test_answers();
        test_cnames();
        test_other_owners();
        test_not_ours();
        test_rcodes();
        test_malformed();
        test_pointers();
        test_pointer_chain();
        test_prefixes_and_bytes();
        test_resolv_conf();
        return tap_done();
}
