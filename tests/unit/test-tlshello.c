/* SPDX-License-Identifier: Apache-2.0 */
/* The ClientHello parser (lib/egress/tlshello.c) on hellos captured from
 * `openssl s_client` and curl on loopback, the same hellos re-split over
 * several records, and hellos built here to hold one refused shape each.
 * Every input is also parsed at every prefix: a prefix answers NEED_MORE or
 * exactly what the whole input answers. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "egress/tlshello.h"
#include "util/macro.h"

/* ------------------------------------------------------- captured hellos */

/* openssl s_client -connect 127.0.0.1:PORT -servername x.test (OpenSSL 3.0) */
static const char tls13_sni[] =
        "16030101330100012f030323a6e7241134309c409e7ef475d7310893ae182fcbf408cd68aadc95841d70d620"
        "efe7a6068779b84e7f006dfe7c36824e26d0ad74dd8cca90e623538511cc5df3003e130213031301c02cc030"
        "009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d"
        "003c0035002f00ff010000a80000000b0009000006782e74657374000b000403000102000a00160014001d00"
        "17001e0019001801000101010201030104002300000016000000170000000d002a0028040305030603080708"
        "080809080a080b080408050806040105010601030303010302040205020602002b0009080304030303020301"
        "002d00020101003300260024001d0020ad30c8d135b3d573c4a33266b508a46aacf4b4de95d7bac923db65ee"
        "512d092e";
/* openssl s_client -connect 127.0.0.1:PORT: no server_name for an address */
static const char tls13_nosni[] =
        "1603010124010001200303ff7175e0bda2e6080914ca82745cf6e85c97454235195be5a8d480429ae378f020"
        "a5e37604a66d2125e57663bb258c4a79753c79fd0290064ea6b409168a7bf7f2003e130213031301c02cc030"
        "009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d"
        "003c0035002f00ff01000099000b000403000102000a00160014001d0017001e001900180100010101020103"
        "0104002300000016000000170000000d002a0028040305030603080708080809080a080b0804080508060401"
        "05010601030303010302040205020602002b0009080304030303020301002d00020101003300260024001d00"
        "20ac11b0910394da1de11e348f74af8fef95ca8e68dc104ec7ad3b433cbaef277d";
/* ... -tls1_2 -servername x.test */
static const char tls12_sni[] =
        "16030100c6010000c20303feb5be77e7bbeae3e052b8cb8be185737e0b274db55dc7196673947c4220d79500"
        "0038c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033"
        "009d009c003d003c0035002f00ff010000610000000b0009000006782e74657374000b000403000102000a00"
        "0c000a001d0017001e00190018002300000016000000170000000d002a002804030503060308070808080908"
        "0a080b080408050806040105010601030303010302040205020602";
/* ... -tls1_2 -noservername */
static const char tls12_nosni[] =
        "16030100b7010000b3030330353104325b2f7d5cad4c12dd311b132cc1a117df8e3e705fcae0e361c2b3da00"
        "0038c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033"
        "009d009c003d003c0035002f00ff01000052000b000403000102000a000c000a001d0017001e001900180023"
        "00000016000000170000000d002a0028040305030603080708080809080a080b080408050806040105010601"
        "030303010302040205020602";
/* ... -servername api.example.com -alpn h2,http/1.1 */
static const char tls13_alpn[] =
        "160301014e0100014a030389659f14438004f1aa28fe97afc365ed0a0a54039800b52c9d353a61e11dff5f20"
        "5cbe180d821974d2436a251f41f8f79e8ecf5288af0c3bb109248b01687122f0003e130213031301c02cc030"
        "009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d"
        "003c0035002f00ff010000c300000014001200000f6170692e6578616d706c652e636f6d000b000403000102"
        "000a00160014001d0017001e0019001801000101010201030104002300000010000e000c0268320868747470"
        "2f312e310016000000170000000d002a0028040305030603080708080809080a080b08040805080604010501"
        "0601030303010302040205020602002b0009080304030303020301002d00020101003300260024001d002072"
        "ba86a9477a52870fe8ba1df38d9e9bdb31a4f51ba01110e0a9989f1deff42f";
/* curl -k --resolve www.x.test:PORT:127.0.0.1 https://www.x.test:PORT/ (padded to 512) */
static const char curl_hello[] =
        "1603010200010001fc030315e59ed7e1a083f8ecebcc1653c5d08a0ad8607004a39c8188c6b09f2a6b35cc20"
        "bbf08e1242a9f1dd15686805d2af6a3bb2f730d8e7f7904b8aadd39e1c4a3a5e003e130213031301c02cc030"
        "009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d"
        "003c0035002f00ff010001750000000f000d00000a7777772e782e74657374000b000403000102000a001600"
        "14001d0017001e00190018010001010102010301040010000e000c02683208687474702f312e310016000000"
        "17000000310000000d002a0028040305030603080708080809080a080b080408050806040105010601030303"
        "010302040205020602002b0009080304030303020301002d00020101003300260024001d00208455ea7ad8c9"
        "3644c386e438a49c2dc6ec5f25b8e94e729f6029e57137b6eb42001500b30000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000";

/* ------------------------------------------------------------- helpers */

static uint8_t buf[2 * TLSHELLO_MAX], msg[2 * TLSHELLO_MAX];
static tlshello h;

static size_t unhex(const char *hex, uint8_t *out) {
        size_t n = strlen(hex) / 2;
        for (size_t i = 0; i < n; i++) {
                unsigned v;
                sscanf(hex + 2 * i, "%2x", &v);
                out[i] = (uint8_t) v;
        }
        return n;
}

/* Parse d[0..n) and every prefix of it. Returns the whole answer (h holds
 * its results); *ret_prefixes: whether every prefix answered NEED_MORE or
 * the same (code, reason, hello_len). */
static int parse_prefixes(const uint8_t *d, size_t n, bool *ret_prefixes) {
        tlshello p;
        int k = tlshello_parse(d, n, &h);

        *ret_prefixes = true;
        for (size_t i = 0; i < n; i++) {
                int kp = tlshello_parse(d, i, &p);
                if (kp == TLSHELLO_NEED_MORE && !p.why)
                        continue;
                if (kp != k || (k < 0 && !streq(p.why, h.why)) ||
                    (k == TLSHELLO_DONE && p.hello_len != h.hello_len)) {
                        *ret_prefixes = false;
                        printf("#   prefix %zu of %zu: %d (%s), whole: %d\n", i, n, kp,
                               p.why ? p.why : "", k);
                        break;
                }
        }
        return k;
}

static void hello_ok(const char *what, const uint8_t *d, size_t n, const char *sni,
                     const char *alpn, size_t hello_len, size_t n_records) {
        bool prefixes;
        int k = parse_prefixes(d, n, &prefixes);

        ok(k == TLSHELLO_DONE && prefixes && !h.why && h.has_sni == (sni != NULL) &&
                   (!sni || (streq(h.sni, sni) && h.sni_len == strlen(sni))) &&
                   h.has_alpn == (alpn != NULL) &&
                   (!alpn || (streq(h.alpn, alpn) && h.alpn_len == strlen(alpn))) &&
                   h.hello_len == hello_len && h.n_records == n_records && !h.has_ech,
           "%s: sni %.40s, alpn %s, %zu bytes in %zu records (got %d %s, sni %.40s)", what,
           sni ? sni : "-", alpn ? alpn : "-", hello_len, n_records, k, h.why ? h.why : "",
           h.has_sni ? h.sni : "-");
}

static void hello_bad(const char *what, const uint8_t *d, size_t n, int code, const char *why) {
        bool prefixes;
        int k = parse_prefixes(d, n, &prefixes);

        ok(k == code && prefixes && h.why && strstr(h.why, why), "%s: %d %s (got %d %s)", what,
           code, why, k, h.why ? h.why : "");
}

/* Wrap a handshake message in records: sizes[i] bytes each, the last one
 * whatever is left; version 0x0301 as TLS 1.3 clients send. */
static size_t wrap(const uint8_t *m, size_t n, const size_t *sizes, size_t n_sizes, uint8_t *out) {
        size_t o = 0, off = 0;
        for (size_t i = 0; off < n; i++) {
                size_t r = i < n_sizes ? MIN(sizes[i], n - off) : n - off;
                out[o++] = 22;
                out[o++] = 3;
                out[o++] = 1;
                out[o++] = (uint8_t) (r >> 8);
                out[o++] = (uint8_t) r;
                memcpy(out + o, m + off, r);
                o += r;
                off += r;
        }
        return o;
}

/* The handshake message inside a one-record capture. */
static size_t unwrap(const uint8_t *rec, size_t n, uint8_t *out) {
        memcpy(out, rec + 5, n - 5);
        return n - 5;
}

static size_t put16(uint8_t *p, size_t v) {
        p[0] = (uint8_t) (v >> 8);
        p[1] = (uint8_t) v;
        return 2;
}

/* A ClientHello message around raw extension bytes (ext == NULL: no
 * extensions block at all, as TLS 1.2 allows). */
static size_t build(const uint8_t *ext, size_t ext_len, uint8_t *out) {
        size_t o = 4;
        o += put16(out + o, 0x0303);
        memset(out + o, 0x5a, 32);
        o += 32;
        out[o++] = 0;           /* session_id */
        o += put16(out + o, 2); /* cipher_suites */
        o += put16(out + o, 0x1301);
        out[o++] = 1; /* compression_methods */
        out[o++] = 0;
        if (ext) {
                o += put16(out + o, ext_len);
                memcpy(out + o, ext, ext_len);
                o += ext_len;
        }
        out[0] = 1;
        out[1] = (uint8_t) ((o - 4) >> 16);
        out[2] = (uint8_t) ((o - 4) >> 8);
        out[3] = (uint8_t) (o - 4);
        return o;
}

/* One extension: type, length, data. */
static size_t ext(uint8_t *p, unsigned type, const void *data, size_t n) {
        put16(p, type);
        put16(p + 2, n);
        if (data)
                memcpy(p + 4, data, n);
        else
                memset(p + 4, 0, n);
        return 4 + n;
}

/* server_name with the given entries: (type, name) pairs */
static size_t sni_ext(uint8_t *p, size_t n_names, const uint8_t *types, const char *const *names,
                      const size_t *lens) {
        uint8_t d[1024];
        size_t o = 2;
        for (size_t i = 0; i < n_names; i++) {
                d[o++] = types[i];
                o += put16(d + o, lens[i]);
                memcpy(d + o, names[i], lens[i]);
                o += lens[i];
        }
        put16(d, o - 2);
        return ext(p, 0x0000, d, o);
}

static size_t sni1(uint8_t *p, const char *name) {
        static const uint8_t host_name = 0;
        size_t len = strlen(name);
        return sni_ext(p, 1, &host_name, &name, &len);
}

/* Build a one-record hello from extension bytes; returns its size in buf. */
static size_t hello1(const uint8_t *e, size_t n) {
        size_t m = build(e, n, msg);
        return wrap(msg, m, NULL, 0, buf);
}

/* A hello naming a.test whose message, header included, is exactly size
 * bytes: padded with a padding extension (RFC 7685). */
static size_t build_sized(size_t size, uint8_t *out) {
        static uint8_t e[TLSHELLO_MAX];
        size_t en = sni1(e, "a.test");
        size_t base = build(e, en, out) + 4;
        en += ext(e + en, 0x0015, NULL, size - base);
        return build(e, en, out);
}

/* ------------------------------------------------------------- the tests */

static void test_captured(void) {
        static const struct {
                const char *name, *hex, *sni, *alpn;
                uint16_t version;
        } caps[] = {
                { "openssl TLS 1.3 -servername x.test", tls13_sni, "x.test", NULL, 0x0303 },
                { "openssl TLS 1.3 without server name", tls13_nosni, NULL, NULL, 0x0303 },
                { "openssl TLS 1.2 -servername x.test", tls12_sni, "x.test", NULL, 0x0303 },
                { "openssl TLS 1.2 -noservername", tls12_nosni, NULL, NULL, 0x0303 },
                { "openssl TLS 1.3 -alpn h2,http/1.1", tls13_alpn, "api.example.com", "h2", 0x0303 },
                { "curl", curl_hello, "www.x.test", "h2", 0x0303 },
        };

        for (size_t i = 0; i < ELEMENTSOF(caps); i++) {
                size_t n = unhex(caps[i].hex, buf);
                hello_ok(caps[i].name, buf, n, caps[i].sni, caps[i].alpn, n, 1);
                ok(h.legacy_version == caps[i].version, "%s: legacy_version 0x%04x", caps[i].name,
                   h.legacy_version);

                /* what follows the hello (early data, a second flight) is
                 * not looked at */
                memcpy(buf + n, "\x17\x03\x03\x00\x02xx\x16\x02", 9);
                int k = tlshello_parse(buf, n + 9, &h);
                ok(k == TLSHELLO_DONE && h.hello_len == n && h.has_sni == (caps[i].sni != NULL),
                   "%s followed by other records: DONE, hello_len %zu", caps[i].name, n);
        }
}

static void test_split(void) {
        size_t n = unhex(tls13_sni, buf), m = unwrap(buf, n, msg), total;
        size_t sizes[3];
        bool all = true;

        /* two records, split at every byte of the message; the handshake
         * header itself may be cut */
        for (size_t s = 1; s < m; s++) {
                sizes[0] = s;
                total = wrap(msg, m, sizes, 1, buf);
                if (tlshello_parse(buf, total, &h) != TLSHELLO_DONE || !streq(h.sni, "x.test") ||
                    h.n_records != 2 || h.hello_len != total) {
                        all = false;
                        printf("#   split at %zu: %s\n", s, h.why ? h.why : "");
                }
        }
        ok(all, "hello split over 2 records at every byte: same server name");

        sizes[0] = 1;
        sizes[1] = 3;
        total = wrap(msg, m, sizes, 2, buf);
        hello_ok("hello in 3 records, header cut 1+3", buf, total, "x.test", NULL, total, 3);
        sizes[0] = 50;
        sizes[1] = 60;
        total = wrap(msg, m, sizes, 2, buf);
        hello_ok("hello in 3 records, 50+60+rest", buf, total, "x.test", NULL, total, 3);

        /* the name itself split over records */
        size_t at = 0;
        for (size_t i = 0; i + 6 <= m; i++)
                if (memcmp(msg + i, "x.test", 6) == 0)
                        at = i;
        sizes[0] = at + 2;
        sizes[1] = 2;
        total = wrap(msg, m, sizes, 2, buf);
        hello_ok("server name cut over 3 records", buf, total, "x.test", NULL, total, 3);

        /* one byte per record: 64 records pass, more do not */
        size_t mm = build_sized(200, msg);
        size_t ones[TLSHELLO_RECORDS_MAX + 8];
        for (size_t i = 0; i < ELEMENTSOF(ones); i++)
                ones[i] = 1;
        total = wrap(msg, mm, ones, TLSHELLO_RECORDS_MAX - 1, buf);
        hello_ok("hello in exactly 64 records", buf, total, "a.test", NULL, total, 64);
        total = wrap(msg, mm, ones, TLSHELLO_RECORDS_MAX, buf);
        hello_bad("hello in 65 records", buf, total, -E2BIG, "more than 64 records");
}

static void test_not_tls(void) {
#define NOT_TLS(what, s) hello_bad(what, (const uint8_t *) (s), sizeof(s) - 1, -EINVAL, "")
        NOT_TLS("HTTP request", "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n");
        NOT_TLS("SSH banner", "SSH-2.0-OpenSSH_9.6p1 Debian-3\r\n");
        NOT_TLS("SMTP command", "EHLO a.test\r\n");
        NOT_TLS("HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        NOT_TLS("TLS alert record", "\x15\x03\x03\x00\x02\x02\x28");
        NOT_TLS("TLS application data record", "\x17\x03\x03\x00\x01x");
        NOT_TLS("handshake record, version 2.0", "\x16\x02\x00\x00\x04\x01\x00\x00\x00");
        NOT_TLS("handshake record, version 3.5", "\x16\x03\x05\x00\x04\x01\x00\x00\x00");
        NOT_TLS("high bit set, not SSLv2", "\x80\x10\x02\x03\x01");
#undef NOT_TLS

        int k = tlshello_parse((const uint8_t *) "G", 1, &h);
        ok(k == -EINVAL && h.why, "one byte \"G\" is enough to tell: %d %s", k, h.why);
        k = tlshello_parse((const uint8_t *) "", 0, &h);
        ok(k == TLSHELLO_NEED_MORE && !h.why, "nothing yet: NEED_MORE");

        /* SSLv2-compatible CLIENT-HELLO (RFC 5246 E.2): TLS, but it cannot
         * carry server_name */
        static const uint8_t v2[] = { 0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15,
                                      0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x04 };
        hello_bad("SSLv2-compatible ClientHello", v2, sizeof v2, -EPROTO, "SSLv2");
        k = tlshello_parse(v2, 2, &h);
        ok(k == TLSHELLO_NEED_MORE, "SSLv2 header: two bytes are not enough to tell");
}

static void test_server_name(void) {
        uint8_t e[2048];
        size_t n, en;

        /* two server_name extensions */
        en = sni1(e, "a.test");
        en += sni1(e + en, "b.test");
        n = hello1(e, en);
        hello_bad("two server_name extensions", buf, n, -EPROTO, "duplicate extension");

        /* the same for any other type */
        en = sni1(e, "a.test");
        en += ext(e + en, 0x002b, "\x02\x03\x04", 3);
        en += ext(e + en, 0x002b, "\x02\x03\x04", 3);
        n = hello1(e, en);
        hello_bad("two supported_versions extensions", buf, n, -EPROTO, "duplicate extension");

        static const uint8_t types00[] = { 0, 0 }, types01[] = { 0, 1 }, type1[] = { 1 };
        static const char *const names2[] = { "a.test", "b.test" };
        static const size_t lens2[] = { 6, 6 };
        en = sni_ext(e, 2, types00, names2, lens2);
        n = hello1(e, en);
        hello_bad("two host_names in one server_name", buf, n, -EPROTO, "more than one server name");
        en = sni_ext(e, 2, types01, names2, lens2);
        n = hello1(e, en);
        hello_bad("host_name and a type-1 name", buf, n, -EPROTO, "more than one server name");
        en = sni_ext(e, 1, type1, names2, lens2);
        n = hello1(e, en);
        hello_bad("name type 1", buf, n, -EPROTO, "type other than host_name");

        static const char *const empty[] = { "" };
        static const size_t zero[] = { 0 };
        en = sni_ext(e, 1, types00, empty, zero);
        n = hello1(e, en);
        hello_bad("empty host_name", buf, n, -EPROTO, "empty server name");

        static const char *const nul[] = { "a.test\0evil.test" };
        static const size_t nul_len[] = { 16 };
        en = sni_ext(e, 1, types00, nul, nul_len);
        n = hello1(e, en);
        hello_bad("NUL in host_name", buf, n, -EPROTO, "NUL");

        char longname[300];
        memset(longname, 'a', sizeof longname);
        const char *lp = longname;
        size_t ll = 255;
        en = sni_ext(e, 1, types00, &lp, &ll);
        n = hello1(e, en);
        longname[255] = 0;
        hello_ok("host_name of 255 bytes", buf, n, longname, NULL, n, 1);
        ll = 256;
        en = sni_ext(e, 1, types00, &lp, &ll);
        n = hello1(e, en);
        hello_bad("host_name of 256 bytes", buf, n, -EPROTO, "over 255 bytes");

        /* malformed server_name shapes */
        en = ext(e, 0x0000, NULL, 0);
        n = hello1(e, en);
        hello_bad("server_name without a list", buf, n, -EBADMSG, "server_name list");
        en = ext(e, 0x0000, "\x00\x00", 2);
        n = hello1(e, en);
        hello_bad("empty server_name list", buf, n, -EBADMSG, "empty server_name list");
        en = ext(e, 0x0000, "\x00\x0a\x00\x00\x06x.test", 11);
        n = hello1(e, en);
        hello_bad("server_name list longer than its extension", buf, n, -EBADMSG, "does not match");
        en = ext(e, 0x0000, "\x00\x09\x00\x00\x07x.test", 11);
        n = hello1(e, en);
        hello_bad("host_name longer than its list", buf, n, -EBADMSG, "truncated");

        /* raw bytes are returned as sent; canonicalising is the caller's */
        en = sni1(e, "X.Test.");
        n = hello1(e, en);
        hello_ok("host_name kept raw", buf, n, "X.Test.", NULL, n, 1);
}

static void test_extensions(void) {
        uint8_t e[256];
        size_t n, en;

        en = sni1(e, "public.test");
        en += ext(e + en, 0xfe0d, "\x00\x00\x01\x00\x01\x07\x00\x00\x00\x00", 10);
        n = hello1(e, en);
        ok(tlshello_parse(buf, n, &h) == TLSHELLO_DONE && h.has_ech && h.has_sni &&
                   streq(h.sni, "public.test"),
           "encrypted_client_hello flagged, outer name returned");
        en = sni1(e, "public.test");
        en += ext(e + en, 0xffce, "\x00", 1);
        n = hello1(e, en);
        ok(tlshello_parse(buf, n, &h) == TLSHELLO_DONE && h.has_ech, "ESNI draft extension flagged");
        n = unhex(tls13_sni, buf);
        ok(tlshello_parse(buf, n, &h) == TLSHELLO_DONE && !h.has_ech, "no ECH: not flagged");

        /* ALPN: the first name */
        en = ext(e, 0x0010, "\x00\x0c\x08http/1.1\x02h2", 14);
        n = hello1(e, en);
        hello_ok("ALPN http/1.1,h2", buf, n, NULL, "http/1.1", n, 1);
        en = ext(e, 0x0010, "\x00\x04\x02h2\x00", 6);
        n = hello1(e, en);
        hello_bad("empty ALPN name", buf, n, -EBADMSG, "empty ALPN protocol name");
        en = ext(e, 0x0010, "\x00\x00", 2);
        n = hello1(e, en);
        hello_bad("empty ALPN list", buf, n, -EBADMSG, "empty ALPN list");

        /* no extensions block (TLS 1.2 allows it), an empty one */
        size_t m = build(NULL, 0, msg);
        n = wrap(msg, m, NULL, 0, buf);
        hello_ok("no extensions block", buf, n, NULL, NULL, n, 1);
        n = hello1((const uint8_t *) "", 0);
        hello_ok("empty extensions block", buf, n, NULL, NULL, n, 1);

        /* lengths that do not add up */
        en = sni1(e, "a.test");
        m = build(e, en, msg);
        msg[45 + 1] ^= 1; /* the low byte of the extensions length */
        n = wrap(msg, m, NULL, 0, buf);
        hello_bad("extensions length off by one", buf, n, -EBADMSG, "extensions length");
        en = ext(e, 0x0023, NULL, 0);
        e[3] = 9; /* an extension longer than the block */
        n = hello1(e, en);
        hello_bad("extension longer than the block", buf, n, -EBADMSG, "extension truncated");
        m = build(e, 0, msg);
        msg[4 + 2 + 32] = 33; /* session_id */
        n = wrap(msg, m, NULL, 0, buf);
        hello_bad("session_id of 33 bytes", buf, n, -EBADMSG, "session_id");
        m = build(NULL, 0, msg);
        msg[4] = 2; /* legacy_version 2.3 */
        n = wrap(msg, m, NULL, 0, buf);
        hello_bad("ClientHello version 2.3", buf, n, -EBADMSG, "version");
}

static void test_records(void) {
        uint8_t e[64];
        size_t n, m, en = sni1(e, "a.test");
        size_t sizes[2] = { 20, 0 };

        /* another handshake message type */
        m = build(e, en, msg);
        msg[0] = 2; /* ServerHello */
        n = wrap(msg, m, NULL, 0, buf);
        hello_bad("ServerHello", buf, n, -EBADMSG, "not a ClientHello");
        hello_bad("ServerHello, one byte of handshake", buf, 6, -EBADMSG, "not a ClientHello");

        /* a record of another type between the fragments */
        m = build(e, en, msg);
        n = wrap(msg, 20, NULL, 0, buf);
        memcpy(buf + n, "\x14\x03\x03\x00\x01\x01", 6);
        n += 6;
        n += wrap(msg + 20, m - 20, NULL, 0, buf + n);
        hello_bad("ChangeCipherSpec between fragments", buf, n, -EBADMSG, "another type");

        /* record length: empty, 2^14 + 1 */
        memcpy(buf, "\x16\x03\x01\x00\x00", 5);
        hello_bad("empty record", buf, 5, -EBADMSG, "empty handshake record");
        memcpy(buf, "\x16\x03\x01\x40\x01\x01\x00\x40\x00", 9);
        hello_bad("record of 2^14 + 1 bytes", buf, 9, -EBADMSG, "over 2^14");

        /* a second record with a bad version */
        n = wrap(msg, m, sizes, 1, buf);
        buf[5 + 20 + 2] = 5;
        hello_bad("second record version 0x0305", buf, n, -EBADMSG, "record version");
        n = wrap(msg, m, sizes, 1, buf);
        buf[5 + 20 + 1] = 2;
        hello_bad("second record version 2.x", buf, n, -EBADMSG, "record version");

        /* the record goes on after the ClientHello */
        m = build(e, en, msg);
        memcpy(msg + m, "\x0b\x00\x00\x00", 4); /* an empty Certificate, say */
        n = wrap(msg, m + 4, NULL, 0, buf);
        hello_bad("another message after the ClientHello in its record", buf, n, -EBADMSG,
                  "bytes after the ClientHello");
        n = wrap(msg, m + 4, sizes, 1, buf);
        hello_bad("same, second record", buf, n, -EBADMSG, "bytes after the ClientHello");
        sizes[0] = 2; /* known when the header completes in the 2nd record */
        n = wrap(msg, m + 4, sizes, 1, buf);
        hello_bad("same, header cut", buf, n, -EBADMSG, "bytes after the ClientHello");

        /* a message length of zero */
        memcpy(buf, "\x16\x03\x01\x00\x04\x01\x00\x00\x00", 9);
        hello_bad("empty ClientHello", buf, 9, -EBADMSG, "truncated");
}

static void test_sizes(void) {
        size_t sizes[3] = { TLSHELLO_RECORD_MAX, TLSHELLO_RECORD_MAX, TLSHELLO_RECORD_MAX };
        size_t n, m;

        m = build_sized(TLSHELLO_RECORD_MAX, msg);
        n = wrap(msg, m, NULL, 0, buf);
        hello_ok("one record of exactly 2^14 bytes", buf, n, "a.test", NULL, n, 1);
        m = build_sized(TLSHELLO_RECORD_MAX + 1, msg);
        n = wrap(msg, m, sizes, 1, buf);
        hello_ok("2^14 + 1 bytes in 2 records", buf, n, "a.test", NULL, n, 2);
        m = build_sized(20000, msg);
        n = wrap(msg, m, sizes, 1, buf);
        hello_ok("20 KB hello in 2 records", buf, n, "a.test", NULL, n, 2);

        /* exactly TLSHELLO_MAX bytes in 4 records; one byte more is refused
         * once TLSHELLO_MAX bytes are in */
        m = build_sized(TLSHELLO_MAX - 4 * 5, msg);
        n = wrap(msg, m, sizes, 3, buf);
        hello_ok("hello of exactly TLSHELLO_MAX bytes", buf, n, "a.test", NULL, TLSHELLO_MAX, 4);
        m = build_sized(TLSHELLO_MAX - 4 * 5 + 1, msg);
        n = wrap(msg, m, sizes, 3, buf);
        hello_bad("hello of TLSHELLO_MAX + 1 bytes", buf, n, -E2BIG, "over 64 KiB");
        ok(tlshello_parse(buf, TLSHELLO_MAX - 1, &h) == TLSHELLO_NEED_MORE,
           "... NEED_MORE one byte before the limit");

        /* a declared length that cannot fit is refused at once */
        memcpy(buf, "\x16\x03\x01\x00\x04\x01\x00\xff\xfc", 9);
        hello_bad("ClientHello length 65532", buf, 9, -E2BIG, "over 64 KiB");
        memcpy(buf, "\x16\x03\x01\x00\x04\x01\xff\xff\xff", 9);
        hello_bad("ClientHello length 2^24-1", buf, 9, -E2BIG, "over 64 KiB");
}

int main(void) {
        test_captured();
        test_split();
        test_not_tls();
        test_server_name();
        test_extensions();
        test_records();
        test_sizes();
        return tap_done();
}
