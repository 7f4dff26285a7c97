/* SPDX-License-Identifier: Apache-2.0 */
/* The egress policy core (lib/egress/policy.c): hosts, rules, reserved ranges,
 * ceilings, E2B mapping. Tables first, so that a new spelling is one line. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "tap.h"
#include "egress/policy.h"
#include "util/macro.h"

/* ------------------------------------------------------------- helpers */

/* Test names are one TAP line: bytes outside printable ASCII as \xNN. */
static const char *show(const char *s) {
        static char bufs[4][1024];
        static int next;
        char *b = bufs[next++ % 4];
        size_t o = 0;
        for (; *s && o + 5 < sizeof bufs[0]; s++) {
                unsigned char c = (unsigned char) *s;
                if (c >= 0x20 && c < 0x7f)
                        b[o++] = (char) c;
                else
                        o += (size_t) snprintf(b + o, sizeof bufs[0] - o, "\\x%02x", c);
        }
        b[o] = 0;
        return b;
}

static void host_is(const char *in, egress_host_kind kind, const char *text) {
        egress_host h, again;
        int r = egress_host_parse(in, &h);
        bool good = r == 0 && h.kind == kind && strcmp(h.text, text) == 0;
        /* the canonical text parses back to the same value */
        if (good)
                good = egress_host_parse(h.text, &again) == 0 && egress_host_equal(&h, &again);
        ok(good, "host \"%s\" -> %s (got r=%d \"%s\")", show(in), text, r, r == 0 ? h.text : "");
}

static void host_bad(const char *in) {
        egress_host h;
        memset(&h, 0x5a, sizeof h);
        int r = egress_host_parse(in, &h);
        ok(r == -EINVAL && h.text[0] == 0x5a, "host \"%s\" refused (got %d)", show(in), r);
}

static void host_bad_n(const char *in, size_t n, const char *what) {
        egress_host h;
        int r = egress_host_parse_n(in, n, &h);
        ok(r == -EINVAL, "host with %s refused (got %d)", what, r);
}

static void rule_is(const char *in, const char *canonical) {
        egress_rule r, again;
        char why[512] = "", text[EGRESS_RULE_TEXT_MAX] = "", text2[EGRESS_RULE_TEXT_MAX] = "";
        int k = egress_rule_parse(in, &r, why, sizeof why);
        bool good = k == 0 && egress_rule_format(&r, text, sizeof text) >= 0 &&
                strcmp(text, canonical) == 0;
        if (good)
                good = egress_rule_parse(text, &again, NULL, 0) == 0 &&
                        egress_rule_equal(&r, &again) &&
                        egress_rule_format(&again, text2, sizeof text2) >= 0 &&
                        strcmp(text, text2) == 0;
        ok(good, "rule \"%s\" -> \"%s\" (got %d \"%s\" %s)", show(in), canonical, k, text, why);
}

static void rule_bad(const char *in, const char *why_part) {
        egress_rule r;
        char why[512] = "";
        int k = egress_rule_parse(in, &r, why, sizeof why);
        ok(k < 0 && strstr(why, why_part) != NULL, "rule \"%s\" refused: %s", show(in), why);
}

static egress_ceiling *ceiling_all(void) {
        egress_ceiling *c = NULL;
        if (egress_ceiling_new(&c) < 0 || egress_ceiling_add_allow(c, "*", NULL, 0) < 0)
                abort();
        return c;
}

/* A native policy from a ';'-separated allow list and deny list, under a "*"
 * ceiling. */
static egress_policy *policy(const char *allow, const char *deny) {
        egress_policy *p = NULL;
        char buf[4096], why[512];
        if (egress_policy_new(&p) < 0)
                abort();
        const char *lists[2] = { allow, deny };
        for (int l = 0; l < 2; l++) {
                if (!lists[l])
                        continue;
                snprintf(buf, sizeof buf, "%s", lists[l]);
                for (char *s = strtok(buf, ";"); s; s = strtok(NULL, ";")) {
                        int k = l == 0 ? egress_policy_add_allow(p, s, why, sizeof why)
                                       : egress_policy_add_deny(p, s, why, sizeof why);
                        if (k < 0) {
                                printf("# policy rule %s: %s\n", s, why);
                                abort();
                        }
                }
        }
        egress_ceiling *c = ceiling_all();
        egress_policy_set_ceiling(p, c);
        egress_ceiling_unref(c);
        return p;
}

static int sockaddr_of(const char *text, struct sockaddr_storage *ss, socklen_t *len) {
        memset(ss, 0, sizeof *ss);
        struct sockaddr_in *sin = (struct sockaddr_in *) ss;
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) ss;
        if (inet_pton(AF_INET, text, &sin->sin_addr) == 1) {
                sin->sin_family = AF_INET;
                *len = sizeof *sin;
                return 0;
        }
        if (inet_pton(AF_INET6, text, &sin6->sin6_addr) == 1) {
                sin6->sin6_family = AF_INET6;
                *len = sizeof *sin6;
                return 0;
        }
        abort();
}

/* Before resolution: host text through the parser, then egress_decide. */
static void decide_is(const egress_policy *p, const char *host, uint16_t port, egress_verdict v,
                      egress_reason reason) {
        egress_host h;
        egress_decision d;
        int r = egress_host_parse(host, &h);
        if (r == 0)
                r = egress_decide(p, &h, port, &d);
        ok(r == 0 && d.verdict == v && d.reason == reason, "%s:%u is %s (%s) (got r=%d %s %s \"%s\")",
           host, port, v == EGRESS_ALLOW ? "allowed" : "denied", egress_reason_to_string(reason), r,
           r == 0 && d.verdict == EGRESS_ALLOW ? "allow" : "deny",
           r == 0 ? egress_reason_to_string(d.reason) : "-", r == 0 ? d.rule : "");
}

/* After resolution: name host resolved to addr. */
static void resolved_is(const egress_policy *p, const char *host, const char *addr, uint16_t port,
                        egress_verdict v, egress_reason reason, const char *detail_part) {
        egress_host h;
        egress_decision d;
        struct sockaddr_storage ss;
        socklen_t len;
        sockaddr_of(addr, &ss, &len);
        int r = egress_host_parse(host, &h);
        if (r == 0)
                r = egress_decide_address(p, &h, (struct sockaddr *) &ss, len, port, &d);
        bool good = r == 0 && d.verdict == v && d.reason == reason && !d.provisional;
        if (good && detail_part)
                good = d.detail && strstr(d.detail, detail_part);
        ok(good, "%s -> %s:%u is %s (%s%s%s) (got r=%d %s %s \"%s\" %s)", host, addr, port,
           v == EGRESS_ALLOW ? "allowed" : "denied", egress_reason_to_string(reason),
           detail_part ? ", " : "", detail_part ? detail_part : "", r,
           r == 0 && d.verdict == EGRESS_ALLOW ? "allow" : "deny",
           r == 0 ? egress_reason_to_string(d.reason) : "-", r == 0 ? d.rule : "",
           r == 0 && d.detail ? d.detail : "");
}

static bool strv_is(char **v, const char *const *want, size_t n) {
        size_t i = 0;
        for (; v && v[i]; i++)
                if (i >= n || strcmp(v[i], want[i]) != 0)
                        return false;
        return i == n;
}

static void strings_are(const egress_policy *p, const char *const *allow, size_t na,
                        const char *const *deny, size_t nd, const char *what) {
        char **a = NULL, **d = NULL;
        int r = egress_policy_to_strings(p, &a, &d);
        ok(r == 0 && strv_is(a, allow, na) && strv_is(d, deny, nd), "to_strings: %s", what);
        egress_strv_free(a);
        egress_strv_free(d);
}

/* ------------------------------------------------------------- hosts */

static const char *const spellings_127[] = {
        "127.0.0.1",
        "2130706433",
        "0x7f000001",
        "0X7F000001",
        "0x7F000001",
        "0177.0.0.1",
        "0177.0000.0000.0001",
        "127.1",
        "127.0.1",
        "0x7f.1",
        "0x7f.0.0.1",
        "0x7f.0x0.0x0.0x1",
        "017700000001",
        "127.0.0.1.",
        "127.000.000.001",
        "0000000000000177.0.0.1",
        "127.0.0x1",
        "0x7f.0.1",
        "127.0x0.0.1",
        "::ffff:127.0.0.1",
        "[::ffff:127.0.0.1]",
        "::ffff:7f00:1",
        "[::FFFF:7F00:0001]",
        "0:0:0:0:0:ffff:7f00:1",
        "0000:0000:0000:0000:0000:ffff:127.0.0.1",
        "::FFFF:127.0.0.1",
};

static const char *const spellings_169[] = {
        "169.254.169.254",     "2852039166",         "0xa9fea9fe",       "0xA9FEA9FE",
        "0251.0376.0251.0376", "169.254.43518",      "169.16689662",     "0xa9.0xfe.0xa9.0xfe",
        "025177524776",        "0251.254.169.254",   "169.254.169.254.", "::ffff:169.254.169.254",
        "::ffff:a9fe:a9fe",    "[::ffff:a9fe:a9fe]",
};

/* IPv6 forms that carry 127.0.0.1 / 169.254.169.254 inside: kept as IPv6
 * (that is what is dialled) with the IPv4 address as the one checked. */
static const struct {
        const char *in, *text, *v4;
} embedded[] = {
        { "::127.0.0.1", "::7f00:1", "127.0.0.1" },
        { "[::7f00:1]", "::7f00:1", "127.0.0.1" },
        { "64:ff9b::127.0.0.1", "64:ff9b::7f00:1", "127.0.0.1" },
        { "[64:FF9B::7F00:1]", "64:ff9b::7f00:1", "127.0.0.1" },
        { "2002:7f00:1::", "2002:7f00:1::", "127.0.0.1" },
        { "2002:7f00:0001:ffff::1", "2002:7f00:1:ffff::1", "127.0.0.1" },
        { "::ffff:0:127.0.0.1", "::ffff:0:7f00:1", "127.0.0.1" },
        { "::169.254.169.254", "::a9fe:a9fe", "169.254.169.254" },
        { "64:ff9b::169.254.169.254", "64:ff9b::a9fe:a9fe", "169.254.169.254" },
        { "64:ff9b::a9fe:a9fe", "64:ff9b::a9fe:a9fe", "169.254.169.254" },
        { "2002:a9fe:a9fe::", "2002:a9fe:a9fe::", "169.254.169.254" },
        { "2002:a9fe:a9fe:1:2:3:4:5", "2002:a9fe:a9fe:1:2:3:4:5", "169.254.169.254" },
        { "::ffff:0:a9fe:a9fe", "::ffff:0:a9fe:a9fe", "169.254.169.254" },
};

static void test_hosts(void) {
        egress_policy *all = policy("*", NULL);

        for (size_t i = 0; i < ELEMENTSOF(spellings_127); i++) {
                host_is(spellings_127[i], EGRESS_HOST_IPV4, "127.0.0.1");
                decide_is(all, spellings_127[i], 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        }
        for (size_t i = 0; i < ELEMENTSOF(spellings_169); i++) {
                host_is(spellings_169[i], EGRESS_HOST_IPV4, "169.254.169.254");
                decide_is(all, spellings_169[i], 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        }
        for (size_t i = 0; i < ELEMENTSOF(embedded); i++) {
                egress_host h;
                char v4[64] = "";
                host_is(embedded[i].in, EGRESS_HOST_IPV6, embedded[i].text);
                int r = egress_host_parse(embedded[i].in, &h);
                if (r == 0 && h.has_embedded_v4)
                        egress_addr_format(&h.embedded_v4, v4, sizeof v4);
                ok(r == 0 && strcmp(v4, embedded[i].v4) == 0, "%s carries %s (got %s)",
                   embedded[i].in, embedded[i].v4, v4);
                decide_is(all, embedded[i].in, 443, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        }
        /* the metadata service by name of its range */
        {
                egress_host h;
                egress_decision d;
                egress_host_parse("0xa9fea9fe", &h);
                egress_decide(all, &h, 80, &d);
                ok(d.detail && strstr(d.detail, "metadata") && strcmp(d.rule, "169.254.169.254") == 0,
                   "0xa9fea9fe is refused as the metadata service (%s, %s)", d.rule,
                   d.detail ? d.detail : "");
                egress_host_parse("fd00:ec2::254", &h);
                egress_decide(all, &h, 80, &d);
                ok(d.verdict == EGRESS_DENY && d.detail && strstr(d.detail, "metadata"),
                   "fd00:ec2::254 is refused as the metadata service (%s)", d.detail ? d.detail : "");
                egress_host_parse("::1", &h);
                egress_decide(all, &h, 80, &d);
                ok(d.verdict == EGRESS_DENY && d.detail && strcmp(d.detail, "loopback") == 0 &&
                           strcmp(d.rule, "::1") == 0,
                   "::1 is refused as loopback");
        }

        /* names: case, trailing dot, punycode */
        host_is("example.com", EGRESS_HOST_NAME, "example.com");
        host_is("Example.COM", EGRESS_HOST_NAME, "example.com");
        host_is("example.com.", EGRESS_HOST_NAME, "example.com");
        host_is("EXAMPLE.COM.", EGRESS_HOST_NAME, "example.com");
        host_is("a.b.example.test", EGRESS_HOST_NAME, "a.b.example.test");
        host_is("xn--bcher-kva.example", EGRESS_HOST_NAME, "xn--bcher-kva.example");
        host_is("XN--BCHER-KVA.example", EGRESS_HOST_NAME, "xn--bcher-kva.example");
        host_is("a-b.c-d.test", EGRESS_HOST_NAME, "a-b.c-d.test");
        host_is("1.example.com", EGRESS_HOST_NAME, "1.example.com");
        host_is("127.0.0.1.example.com", EGRESS_HOST_NAME, "127.0.0.1.example.com");
        host_is("0x7f.example", EGRESS_HOST_NAME, "0x7f.example");
        host_is("example.0x1g", EGRESS_HOST_NAME, "example.0x1g");
        host_is("deadbeef.test", EGRESS_HOST_NAME, "deadbeef.test");

        /* label and name lengths */
        char name[300];
        memset(name, 'a', 63);
        strcpy(name + 63, ".test");
        host_is(name, EGRESS_HOST_NAME, name);
        memset(name, 'a', 64);
        strcpy(name + 64, ".test");
        host_bad(name);
        /* 253 bytes: 4 labels of 62 + ".a" ... */
        name[0] = 0;
        for (int i = 0; i < 4; i++) {
                char l[64];
                memset(l, 'b', 62);
                l[62] = 0;
                strcat(name, l);
                strcat(name, ".");
        }
        strcat(name, "x"); /* 4*63 + 1 = 253 */
        ok(strlen(name) == 253, "name of 253 bytes built");
        host_is(name, EGRESS_HOST_NAME, name);
        char canon[300];
        strcpy(canon, name);
        strcat(name, ".");
        host_is(name, EGRESS_HOST_NAME, canon);
        name[253] = 0;
        strcat(name, "y"); /* 254 */
        host_bad(name);

        /* IPv6 canonical text (RFC 5952) */
        host_is("::1", EGRESS_HOST_IPV6, "::1");
        host_is("[::1]", EGRESS_HOST_IPV6, "::1");
        host_is("2001:DB8::1", EGRESS_HOST_IPV6, "2001:db8::1");
        host_is("2001:0db8:0000:0000:0000:0000:0000:0001", EGRESS_HOST_IPV6, "2001:db8::1");
        host_is("2001:db8:0:0:1:0:0:1", EGRESS_HOST_IPV6, "2001:db8::1:0:0:1");
        host_is("1:0:0:2:0:0:0:3", EGRESS_HOST_IPV6, "1:0:0:2::3");
        host_is("1:0:2:3:4:5:6:7", EGRESS_HOST_IPV6, "1:0:2:3:4:5:6:7");
        host_is("1:2:3:4:5:6:7:0", EGRESS_HOST_IPV6, "1:2:3:4:5:6:7:0");
        host_is("1:0:0:0:0:0:0:0", EGRESS_HOST_IPV6, "1::");
        host_is("::", EGRESS_HOST_IPV6, "::");
        host_is("2606:4700:4700::1111", EGRESS_HOST_IPV6, "2606:4700:4700::1111");

        /* IPv4 edge values */
        host_is("4294967295", EGRESS_HOST_IPV4, "255.255.255.255");
        host_is("0", EGRESS_HOST_IPV4, "0.0.0.0");
        host_is("0x", EGRESS_HOST_IPV4, "0.0.0.0");
        host_is("1.2.3.4", EGRESS_HOST_IPV4, "1.2.3.4");
        host_is("1.2.65535", EGRESS_HOST_IPV4, "1.2.255.255");
        host_is("1.16777215", EGRESS_HOST_IPV4, "1.255.255.255");
        host_is("8.8.8.8", EGRESS_HOST_IPV4, "8.8.8.8");

        static const char *const bad[] = {
                "",
                ".",
                "..",
                "localhost",
                "metadata",
                "LOCALHOST.",
                "example..com",
                ".example.com",
                "example.com..",
                "-a.example",
                "a-.example",
                "a.-b.example",
                "a_b.example",
                "_srv.example",
                "ex@mple.com",
                "user@example.com",
                "example.com@evil.test",
                "a.com#b",
                "a.com%2f",
                "a.com%00",
                "a.com/",
                "a.com/x",
                "a\\b.com",
                "a .com",
                " a.com",
                "a.com ",
                "a.com\r",
                "a.com\n",
                "a.com\r\nX: y",
                "a.com\t",
                "b\xc3\xbc\x63her.example",
                "\xd0\xb0pple.com",
                "example.com:443",
                "a.com?",
                "a.com;",
                "*.example.com",
                "*",
                "a,b.com",
                "a.com'",
                "1.2.3.4.5",
                "example.123",
                "example.0x1",
                "256.0.0.1",
                "1.2.3.256",
                "1.2.3.4.5.6",
                "4294967296",
                "0x100000000",
                "08.1.1.1",
                "09",
                "0x1g.1",
                "1..2",
                "1.2..3",
                "1.2.3.-4",
                "1.2.3.4 ",
                "1.2.3.4\n",
                "1.256.65536",
                "1.2.16777216",
                "1.2.3.0x100",
                "-1",
                "1-2.3",
                "0xffffffff1",
                "99999999999999999999",
                "[example.com]",
                "[127.0.0.1]",
                "[::1",
                "::1]",
                "[[::1]]",
                "[]",
                "[:]",
                "fe80::1%eth0",
                "[fe80::1%25eth0]",
                "fe80::1%25eth0",
                "1::2::3",
                "12345::",
                "::g",
                ":::",
                "1:2:3:4:5:6:7:8:9",
                "::ffff:127.1",
                "::ffff:0177.0.0.1",
                "::ffff:1.2.3",
                "[::1]:80",
                "::1.",
                "[::1.]",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                host_bad(bad[i]);
        host_bad_n("example.com\0.evil.test", 22, "an embedded NUL");
        host_bad_n("example.com\0", 12, "a trailing NUL");
        host_bad_n("127.0.0.1\0", 10, "a NUL after an address");
        {
                char longname[400];
                memset(longname, '1', sizeof longname - 1);
                longname[sizeof longname - 1] = 0;
                host_bad(longname);
        }

        /* the dial address */
        {
                egress_host h;
                struct sockaddr_storage ss;
                socklen_t len = 0;
                egress_host_parse("0x7f.1", &h);
                int r = egress_host_sockaddr(&h, 8080, &ss, &len);
                struct sockaddr_in *sin = (struct sockaddr_in *) &ss;
                ok(r == 0 && len == sizeof *sin && sin->sin_family == AF_INET &&
                           ntohs(sin->sin_port) == 8080 && ntohl(sin->sin_addr.s_addr) == 0x7f000001,
                   "0x7f.1 dials 127.0.0.1:8080");
                egress_host_parse("::ffff:8.8.8.8", &h);
                r = egress_host_sockaddr(&h, 53, &ss, &len);
                ok(r == 0 && sin->sin_family == AF_INET && ntohl(sin->sin_addr.s_addr) == 0x08080808,
                   "::ffff:8.8.8.8 dials 8.8.8.8 over IPv4");
                egress_host_parse("[64:ff9b::808:808]", &h);
                r = egress_host_sockaddr(&h, 443, &ss, &len);
                struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) &ss;
                ok(r == 0 && len == sizeof *sin6 && sin6->sin6_family == AF_INET6 &&
                           sin6->sin6_addr.s6_addr[1] == 0x64 && sin6->sin6_addr.s6_addr[15] == 8,
                   "64:ff9b::808:808 dials the NAT64 address itself");
                egress_host_parse("example.com", &h);
                ok(egress_host_sockaddr(&h, 443, &ss, &len) == -EINVAL, "a name has no sockaddr");
        }
        egress_policy_free(all);
}

/* ------------------------------------------------------------- rules */

static void test_rules(void) {
        static const struct {
                const char *in, *canonical;
        } good[] = {
                { "example.com", "example.com" },
                { "EXAMPLE.Com.", "example.com" },
                { "*.example.com", "*.example.com" },
                { "*.EXAMPLE.com.", "*.example.com" },
                { "*.test", "*.test" },
                { "xn--bcher-kva.example", "xn--bcher-kva.example" },
                { "example.com:443", "example.com:443" },
                { "*.x.test:80,443", "*.x.test:80,443" },
                { "example.com:1-65535", "example.com:1-65535" },
                { "example.com:443-443", "example.com:443" },
                { "a.test:80,443,8000-8100", "a.test:80,443,8000-8100" },
                { "10.0.0.0/8", "10.0.0.0/8" },
                { "10.0.0.1", "10.0.0.1" },
                { "10.0.0.1/32", "10.0.0.1" },
                { "10.0.0.1.", "10.0.0.1" },
                { "10.0.0.0/8:1000-2000", "10.0.0.0/8:1000-2000" },
                { "8.8.8.8:53", "8.8.8.8:53" },
                { "0.0.0.0", "0.0.0.0" },
                { "0.0.0.0/32", "0.0.0.0" },
                { "255.255.255.255", "255.255.255.255" },
                { "128.0.0.0/1", "128.0.0.0/1" },
                { "2001:db8::/32", "2001:db8::/32" },
                { "2001:DB8:0::/32", "2001:db8::/32" },
                { "2001:db8::1", "2001:db8::1" },
                { "2001:db8::1/128", "2001:db8::1" },
                { "[2001:db8::1]", "2001:db8::1" },
                { "[2001:db8::1]:443", "[2001:db8::1]:443" },
                { "[2001:db8::/32]:443", "[2001:db8::/32]:443" },
                { "[2001:db8::/32]:80,443", "[2001:db8::/32]:80,443" },
                { "::1:443", "::1:443" }, /* one address: ports need brackets */
                { "::/0", "::/0" },
                { "8000::/1", "8000::/1" },
                { "64:ff9b::/96", "64:ff9b::/96" },
                { "::/80", "::/80" }, /* wider than the mapped range: an IPv6 prefix */
                { "*", "*" },
                { "*:443", "*:443" },
                { "0.0.0.0/0", "*" },
                { "0.0.0.0/0:443", "*:443" },
        };
        for (size_t i = 0; i < ELEMENTSOF(good); i++)
                rule_is(good[i].in, good[i].canonical);

        static const struct {
                const char *in, *why;
        } bad[] = {
                { "", "empty" },
                { "exa mple.com", "spaces" },
                { " example.com", "spaces" },
                { "ex@mple.com", "'@'" },
                { "a.com#x", "'#'" },
                { "a.com%2f", "'%'" },
                { "a.com/x", "prefix length" },
                { "a.com/8", "IPv4" },
                { "a\\b.com", "'\\'" },
                { "a.com\r", "control byte 0x0d" },
                { "a.com\nx", "control byte 0x0a" },
                { "b\xc3\xbc\x63her.example", "punycode" },
                { "*example.com", "whole first label" },
                { "a.*.example.com", "first label" },
                { "*.*.example.com", "only one" },
                { "**", "whole first label" },
                { "*.", "not a valid domain" },
                { "*.1.2.3", "cannot end in a number" },
                { "*.example.com/8", "before a domain" },
                { "localhost", "single-label" },
                { "example..com", "not a valid domain" },
                { "-a.example", "not a valid domain" },
                { "a_b.example", "'_'" },
                { "10.0.0.1/8", "write 10.0.0.0/8" },
                { "10.0.0.0/33", "longer than 32" },
                { "2001:db8::/129", "longer than 128" },
                { "2001:db8::1/32", "write 2001:db8::/32" },
                { "10.0.0.0/08", "leading zeros" },
                { "10.0.0.0/", "prefix length" },
                { "10.0.0.0/x", "prefix length" },
                { "/8", "IPv4" },
                { "10.1", "four decimal numbers" },
                { "0177.0.0.1", "four decimal numbers" },
                { "010.0.0.1", "four decimal numbers" },
                { "2130706433", "four decimal numbers" },
                { "0x7f000001", "four decimal numbers" },
                { "1.2.3.4.5", "four decimal numbers" },
                { "256.0.0.1", "four decimal numbers" },
                { "[10.0.0.1]:80", "only for IPv6" },
                { "[example.com]", "only for IPv6" },
                { "[::1", "without ']'" },
                { "[::1]x", "may follow ']'" },
                { "[::1]:80:90", "one ':'" },
                { "2001:db8::/32:443", "in brackets" },
                { "a[::1]", "'[' and ']'" },
                { "example.com:", "no port" },
                { "example.com:0", "not a port" },
                { "example.com:65536", "not a port" },
                { "example.com:80-", "not a port" },
                { "example.com:-80", "not a port" },
                { "example.com:2000-1000", "backwards" },
                { "example.com:080", "not a port" },
                { "example.com:80,,443", "not a port" },
                { "example.com:80,", "not a port" },
                { "example.com:1-2-3", "not a port" },
                { "example.com:http", "not a port" },
                { ":443", "no destination" },
                { "example.com,other.com", "one destination" },
                { "::ffff:10.0.0.1", "IPv4-mapped" },
                { "[::ffff:10.0.0.1]:80", "IPv4-mapped" },
                { "::ffff:0:0/96", "IPv4-mapped" },
                { "::g", "IPv6" },
                { "1::2::3", "IPv6" },
                { "fe80::1%eth0", "'%'" },
                { "example.com:1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "more than 16 ports" },
                { "1:2", "four decimal numbers" },
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                rule_bad(bad[i].in, bad[i].why);

        /* 16 ports fit; the longest canonical text fits the buffer */
        rule_is("*.example.com:1-2,3-4,5-6,7-8,9-10,11-12,13-14,15-16,17-18,19-20,21-22,23-24,25-26,27-28,29-30,31-32",
                "*.example.com:1-2,3-4,5-6,7-8,9-10,11-12,13-14,15-16,17-18,19-20,21-22,23-24,25-26,27-28,29-30,31-32");
        {
                char big[600];
                memset(big, 'a', sizeof big - 1);
                big[sizeof big - 1] = 0;
                rule_bad(big, "longer than 511");
                /* a message never carries raw control bytes */
                egress_rule r;
                char why[512];
                egress_rule_parse("a\r\nb.com", &r, why, sizeof why);
                ok(!strchr(why, '\r') && !strchr(why, '\n') && strstr(why, "\\x0d\\x0a"),
                   "why quotes CR LF as \\x0d\\x0a: %s", why);
                ok(egress_rule_parse(NULL, &r, why, sizeof why) == -EINVAL, "NULL rule refused");
                ok(egress_rule_parse("example.com", &r, NULL, 0) == 0, "why may be NULL");
                ok(egress_rule_parse("bad rule", &r, NULL, 0) == -EINVAL, "why may be NULL on error");
                /* longest possible canonical rule */
                char longest[EGRESS_RULE_INPUT_MAX + 1] = "*.";
                for (int i = 0; i < 4; i++) {
                        char l[64];
                        memset(l, 'c', 62);
                        l[62] = 0;
                        strcat(longest, l);
                        strcat(longest, ".");
                }
                strcat(longest,
                       "x:10000-20000,10000-20000,10000-20000,10000-20000,10000-20000,10000-20000,"
                       "10000-20000,10000-20000,10000-20000,10000-20000,10000-20000,10000-20000,"
                       "10000-20000,10000-20000,10000-20000,10000-20000");
                rule_is(longest, longest);
        }
}

/* ----------------------------------------------------------- matching */

static void test_matching(void) {
        egress_policy *p = policy("*.example.test", NULL);
        decide_is(p, "a.example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "a.b.example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "A.Example.TEST.", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "xn--bcher-kva.example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "example.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "evil-example.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "example.test.evil", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "a.example.test.evil", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "aexample.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "example.tes", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "other.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        {
                egress_host h;
                egress_decision d;
                egress_host_parse("a.example.test", &h);
                egress_decide(p, &h, 443, &d);
                ok(d.provisional && d.index == 0 && strcmp(d.rule, "*.example.test") == 0,
                   "a name allowed before resolution is provisional, rule 0 \"*.example.test\"");
                egress_host_parse("other.test", &h);
                egress_decide(p, &h, 443, &d);
                ok(d.index == -1 && d.rule[0] == 0 &&
                           strcmp(egress_reason_to_string(d.reason), "no allow rule matches") == 0,
                   "default deny says \"no allow rule matches\"");
        }
        resolved_is(p, "a.example.test", "93.184.216.34", 443, EGRESS_ALLOW,
                    EGRESS_REASON_ALLOW_RULE, NULL);
        resolved_is(p, "other.test", "93.184.216.34", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE,
                    NULL);
        egress_policy_free(p);

        p = policy("example.test", NULL);
        decide_is(p, "example.test", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "EXAMPLE.test.", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "a.example.test", 80, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);

        /* a single-label suffix */
        p = policy("*.test", NULL);
        decide_is(p, "a.test", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "a.b.test", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "a.testx", 80, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);

        /* ports */
        p = policy("example.test:443;*.x.test:80,443;93.184.0.0/16:1000-2000;[2606:4700::/32]:443",
                   NULL);
        decide_is(p, "example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "example.test", 80, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "a.x.test", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "a.x.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "a.x.test", 8080, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "93.184.1.1", 999, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "93.184.1.1", 1000, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "93.184.1.1", 2000, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "93.184.1.1", 2001, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "93.184.1.1", 65535, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "2606:4700::1", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "2606:4700::1", 80, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "example.test", 0, EGRESS_DENY, EGRESS_REASON_BAD_PORT);
        egress_policy_free(p);

        /* deny beats allow, in either order of adding */
        p = policy("*", "evil.test;*.bad.test;8.8.8.8;2606:4700::/32");
        decide_is(p, "good.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "evil.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "EVIL.TEST.", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "a.bad.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "bad.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "134744072", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "::ffff:8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "64:ff9b::8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "2002:808:808::1", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "8.8.4.4", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "2606:4700::1111", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        /* a name resolving into a denied address */
        resolved_is(p, "good.test", "8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE, NULL);
        resolved_is(p, "good.test", "::ffff:8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE,
                    NULL);
        resolved_is(p, "good.test", "64:ff9b::808:808", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE,
                    NULL);
        resolved_is(p, "good.test", "2606:4700::1111", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE,
                    NULL);
        resolved_is(p, "good.test", "8.8.4.4", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE, NULL);
        {
                egress_host h;
                egress_decision d;
                egress_host_parse("a.bad.test", &h);
                egress_decide(p, &h, 443, &d);
                ok(d.index == 1 && strcmp(d.rule, "*.bad.test") == 0,
                   "deny names rule 1 \"*.bad.test\" (%d %s)", d.index, d.rule);
        }
        egress_policy_free(p);
        p = policy(NULL, "evil.test");
        {
                char why[256];
                ok(egress_policy_add_allow(p, "*", why, sizeof why) == 0, "allow added after deny");
        }
        decide_is(p, "evil.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "good.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("*.example.test", "bad.example.test");
        decide_is(p, "bad.example.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "x.bad.example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "good.example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("*", "*:25");
        decide_is(p, "mail.test", 25, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "mail.test", 587, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        egress_policy_free(p);

        /* address rules never allow a name (no lookup for them) */
        p = policy("93.184.216.34", NULL);
        decide_is(p, "93.184.216.34", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "example.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        resolved_is(p, "example.test", "93.184.216.34", 443, EGRESS_DENY,
                    EGRESS_REASON_NO_ALLOW_RULE, NULL);
        egress_policy_free(p);

        /* CIDR edges */
        p = policy("8.8.8.0/24;1.1.1.1/32;2606:4700::/32;2606:4700:4700::1111/128", NULL);
        decide_is(p, "8.8.8.0", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.8.255", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.9.0", 53, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "8.8.7.255", 53, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "1.1.1.1", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "1.1.1.0", 53, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "1.1.1.2", 53, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "2606:4700:ffff:ffff:ffff:ffff:ffff:ffff", 443, EGRESS_ALLOW,
                  EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "2606:4701::", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "2606:46ff:ffff::", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("2606:4700:4700::1111/128;8.8.8.8/31", NULL);
        decide_is(p, "2606:4700:4700::1111", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "2606:4700:4700::1112", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "8.8.8.9", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.8.10", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("::/0", NULL);
        decide_is(p, "2606:4700::1111", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "::ffff:8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        decide_is(p, "example.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        /* a NAT64 address is checked as its IPv4 address: ::/0 does not allow it */
        decide_is(p, "64:ff9b::808:808", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("0.0.0.0/0", NULL);
        decide_is(p, "example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.8.8", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "2606:4700::1111", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        egress_policy_free(p);

        /* IPv4 rules reach the embedded and mapped forms; IPv6 prefixes of
         * the translation ranges do not allow them, but deny them */
        p = policy("8.8.8.8", NULL);
        decide_is(p, "64:ff9b::808:808", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "::ffff:8.8.8.8", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "2002:808:808::", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "0x08080808", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "64:ff9b::808:809", 53, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("64:ff9b::/96", NULL);
        decide_is(p, "64:ff9b::808:808", 53, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);
        p = policy("*", "64:ff9b::/96");
        decide_is(p, "64:ff9b::808:808", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "8.8.8.8", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        egress_policy_free(p);

        /* an address literal's decision is final; decide_address agrees */
        p = policy("8.8.8.8", NULL);
        {
                egress_host h;
                egress_decision d;
                struct sockaddr_storage ss;
                socklen_t len;
                egress_host_parse("8.8.8.8", &h);
                egress_decide(p, &h, 53, &d);
                ok(d.verdict == EGRESS_ALLOW && !d.provisional,
                   "a literal's ALLOW is not provisional");
                egress_host_sockaddr(&h, 53, &ss, &len);
                ok(egress_decide_address(p, &h, (struct sockaddr *) &ss, len, 53, &d) == 0 &&
                           d.verdict == EGRESS_ALLOW,
                   "decide_address agrees for the literal's own address");
                sockaddr_of("8.8.4.4", &ss, &len);
                ok(egress_decide_address(p, &h, (struct sockaddr *) &ss, len, 53, &d) == -EINVAL,
                   "decide_address refuses another address for a literal");
                sockaddr_of("fe80::1", &ss, &len);
                ((struct sockaddr_in6 *) &ss)->sin6_scope_id = 2;
                egress_host_parse("example.test", &h);
                ok(egress_decide_address(p, &h, (struct sockaddr *) &ss, len, 53, &d) == -EINVAL,
                   "a scoped IPv6 address is refused");
                struct sockaddr_un sun = { .sun_family = AF_UNIX };
                ok(egress_decide_address(p, &h, (struct sockaddr *) &sun, sizeof sun, 53, &d) ==
                           -EAFNOSUPPORT,
                   "AF_UNIX is refused");
                sockaddr_of("8.8.8.8", &ss, &len);
                ok(egress_decide_address(p, &h, (struct sockaddr *) &ss, 4, 53, &d) == -EINVAL,
                   "a short sockaddr is refused");
                ok(egress_decide(NULL, &h, 53, &d) == -EINVAL &&
                           egress_decide(p, NULL, 53, &d) == -EINVAL,
                   "NULL arguments are refused");
        }
        egress_policy_free(p);
}

/* ------------------------------------------------------ reserved ranges */

static const struct {
        const char *addr, *detail;
} reserved_cases[] = {
        { "0.0.0.0", "unspecified" },
        { "0.255.255.255", "unspecified" },
        { "10.0.0.0", "private" },
        { "10.255.255.255", "private" },
        { "100.64.0.0", "CGNAT" },
        { "100.127.255.255", "CGNAT" },
        { "100.100.100.200", "Alibaba" },
        { "127.0.0.1", "loopback" },
        { "127.255.255.254", "loopback" },
        { "169.254.0.1", "link-local" },
        { "169.254.169.254", "metadata" },
        { "168.63.129.16", "Azure" },
        { "172.16.0.0", "private" },
        { "172.31.255.255", "private" },
        { "192.0.0.8", "IETF" },
        { "192.0.2.1", "TEST-NET-1" },
        { "192.88.99.1", "6to4" },
        { "192.168.0.1", "private" },
        { "192.168.255.255", "private" },
        { "198.18.0.0", "benchmarking" },
        { "198.19.255.255", "benchmarking" },
        { "198.51.100.7", "TEST-NET-2" },
        { "203.0.113.9", "TEST-NET-3" },
        { "224.0.0.1", "multicast" },
        { "239.255.255.250", "multicast" },
        { "240.0.0.1", "reserved" },
        { "255.255.255.255", "broadcast" },
        { "::", "unspecified" },
        { "::1", "loopback" },
        { "::2", "IPv4-compatible" },
        { "::ffff:0:808:808", "SIIT" },
        { "64:ff9b:1::1", "local-use NAT64" },
        { "100::1", "discard" },
        { "2001::1", "Teredo" },
        { "2001:2::1", "benchmarking" },
        { "2001:db8::1", "documentation" },
        { "3fff::1", "documentation" },
        { "5f00::1", "SRv6" },
        { "fc00::1", "unique local" },
        { "fdff:ffff::1", "unique local" },
        { "fd00:ec2::254", "metadata" },
        { "fe80::1", "link-local" },
        { "febf:ffff::1", "link-local" },
        { "fec0::1", "site-local" },
        { "ff02::1", "multicast" },
        { "ff0e::1", "multicast" },
};

static const char *const public_addrs[] = {
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "9.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "126.255.255.255",
        "128.0.0.0",
        "169.253.255.255",
        "169.255.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.0",
        "192.167.255.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "168.63.129.17",
        "2606:4700:4700::1111",
        "2001:4860:4860::8888",
        "2001:200::1",
        "2a00:1450::1",
        "64:ff9b::808:808",
        "2002:808:808::1",
        "fe00::1",
        "fbff::1",
        "4000::1",
};

static void test_reserved(void) {
        egress_policy *p = policy("*", NULL);

        for (size_t i = 0; i < ELEMENTSOF(reserved_cases); i++) {
                const char *a = reserved_cases[i].addr;
                resolved_is(p, "any.example.test", a, 443, EGRESS_DENY,
                            EGRESS_REASON_RESERVED_ADDRESS, reserved_cases[i].detail);
                decide_is(p, a, 443, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
                struct in_addr in4;
                if (inet_pton(AF_INET, a, &in4) != 1)
                        continue;
                /* the IPv4-mapped, NAT64, 6to4, compatible and SIIT forms of it */
                const uint8_t *b = (const uint8_t *) &in4;
                char forms[5][64];
                snprintf(forms[0], 64, "::ffff:%s", a);
                snprintf(forms[1], 64, "64:ff9b::%s", a);
                snprintf(forms[2], 64, "2002:%02x%02x:%02x%02x::1", b[0], b[1], b[2], b[3]);
                snprintf(forms[3], 64, "::%s", a);
                snprintf(forms[4], 64, "::ffff:0:%s", a);
                for (int f = 0; f < 5; f++) {
                        if (f == 3 && (in4.s_addr == 0 || ntohl(in4.s_addr) == 1))
                                continue;
                        resolved_is(p, "any.example.test", forms[f], 443, EGRESS_DENY,
                                    EGRESS_REASON_RESERVED_ADDRESS, NULL);
                        decide_is(p, forms[f], 443, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
                }
        }
        for (size_t i = 0; i < ELEMENTSOF(public_addrs); i++) {
                resolved_is(p, "any.example.test", public_addrs[i], 443, EGRESS_ALLOW,
                            EGRESS_REASON_ALLOW_RULE, NULL);
                decide_is(p, public_addrs[i], 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        }
        /* a client rule cannot open a reserved range */
        egress_policy_free(p);
        p = policy("10.0.0.0/8;127.0.0.1;169.254.169.254;*.internal.test", NULL);
        decide_is(p, "10.1.2.3", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        decide_is(p, "127.0.0.1", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        decide_is(p, "169.254.169.254", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        resolved_is(p, "db.internal.test", "10.1.2.3", 5432, EGRESS_DENY,
                    EGRESS_REASON_RESERVED_ADDRESS, "private");
        /* DNS rebinding: the same name, public then private */
        resolved_is(p, "db.internal.test", "93.184.216.34", 5432, EGRESS_ALLOW,
                    EGRESS_REASON_ALLOW_RULE, NULL);
        resolved_is(p, "db.internal.test", "127.0.0.1", 5432, EGRESS_DENY,
                    EGRESS_REASON_RESERVED_ADDRESS, "loopback");
        resolved_is(p, "db.internal.test", "::ffff:127.0.0.1", 5432, EGRESS_DENY,
                    EGRESS_REASON_RESERVED_ADDRESS, "loopback");
        egress_policy_free(p);
}

/* ------------------------------------------ exemptions and host addresses */

static egress_policy *policy_with(egress_ceiling *c, const char *allow) {
        egress_policy *p = NULL;
        char buf[1024];
        if (egress_policy_new(&p) < 0)
                abort();
        snprintf(buf, sizeof buf, "%s", allow);
        for (char *s = strtok(buf, ";"); s; s = strtok(NULL, ";"))
                if (egress_policy_add_allow(p, s, NULL, 0) < 0)
                        abort();
        egress_policy_set_ceiling(p, c);
        return p;
}

static void test_operator(void) {
        egress_ceiling *c = ceiling_all();
        char why[512];

        ok(egress_ceiling_allow_private(c, "10.1.0.0/16", why, sizeof why) == 0, "open 10.1.0.0/16");
        ok(egress_ceiling_allow_private(c, "169.254.0.0/16", why, sizeof why) == 0,
           "open 169.254.0.0/16");
        ok(egress_ceiling_allow_private(c, "fd12:3456::/32", why, sizeof why) == 0,
           "open fd12:3456::/32");
        static const struct {
                const char *in, *why;
        } bad[] = {
                { "0.0.0.0/0", "without ports" },
                { "*", "without ports" },
                { "8.8.8.0/24", "does not lie inside" },
                { "10.0.0.0/7", "does not lie inside" },
                { "::/0", "does not lie inside" },
                { "10.0.0.0/8:80", "without ports" },
                { "example.test", "without ports" },
                { "10.0.0.1/8", "write 10.0.0.0/8" },
                { "", "empty" },
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                int k = egress_ceiling_allow_private(c, bad[i].in, why, sizeof why);
                ok(k == -EINVAL && strstr(why, bad[i].why), "allow_private \"%s\" refused: %s",
                   bad[i].in, why);
        }

        egress_policy *p = policy_with(c, "*");
        decide_is(p, "10.1.2.3", 5432, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "0xa010203", 5432, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "::ffff:10.1.2.3", 5432, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "64:ff9b::a01:203", 5432, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "::10.1.2.3", 5432, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        decide_is(p, "10.2.0.1", 5432, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        decide_is(p, "127.0.0.1", 5432, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        decide_is(p, "169.254.1.1", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        /* the metadata address is a range of its own: 169.254.0.0/16 does not open it */
        decide_is(p, "169.254.169.254", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        decide_is(p, "fd12:3456::1", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "fd12:3457::1", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
        resolved_is(p, "db.corp.test", "10.1.9.9", 5432, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE,
                    NULL);
        resolved_is(p, "db.corp.test", "10.9.9.9", 5432, EGRESS_DENY,
                    EGRESS_REASON_RESERVED_ADDRESS, "private");
        egress_policy_free(p);
        ok(egress_ceiling_allow_private(c, "169.254.169.254", why, sizeof why) == 0,
           "open the metadata address");
        p = policy_with(c, "*");
        decide_is(p, "169.254.169.254", 80, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        egress_policy_free(p);

        /* an opened range still needs the client's allow */
        p = policy_with(c, "example.test");
        decide_is(p, "10.1.2.3", 5432, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);

        /* the host's own addresses: refused in every form, opened or not */
        struct sockaddr_storage ss;
        socklen_t len;
        sockaddr_of("93.184.216.34", &ss, &len);
        ok(egress_ceiling_add_host_address(c, (struct sockaddr *) &ss, len) == 0,
           "host address 93.184.216.34");
        ok(egress_ceiling_add_host_address(c, (struct sockaddr *) &ss, len) == 0, "added twice");
        sockaddr_of("2606:4700::6810:1", &ss, &len);
        ok(egress_ceiling_add_host_address(c, (struct sockaddr *) &ss, len) == 0,
           "host address 2606:4700::6810:1");
        sockaddr_of("::ffff:10.1.2.4", &ss, &len);
        ok(egress_ceiling_add_host_address(c, (struct sockaddr *) &ss, len) == 0,
           "host address ::ffff:10.1.2.4");
        struct sockaddr_un sun = { .sun_family = AF_UNIX };
        ok(egress_ceiling_add_host_address(c, (struct sockaddr *) &sun, sizeof sun) == -EAFNOSUPPORT,
           "host address of AF_UNIX refused");
        p = policy_with(c, "*");
        decide_is(p, "93.184.216.34", 443, EGRESS_DENY, EGRESS_REASON_HOST_ADDRESS);
        decide_is(p, "1572395042", 443, EGRESS_DENY, EGRESS_REASON_HOST_ADDRESS);
        decide_is(p, "::ffff:93.184.216.34", 443, EGRESS_DENY, EGRESS_REASON_HOST_ADDRESS);
        decide_is(p, "64:ff9b::93.184.216.34", 443, EGRESS_DENY, EGRESS_REASON_HOST_ADDRESS);
        decide_is(p, "2606:4700::6810:1", 443, EGRESS_DENY, EGRESS_REASON_HOST_ADDRESS);
        decide_is(p, "10.1.2.4", 443, EGRESS_DENY, EGRESS_REASON_HOST_ADDRESS);
        decide_is(p, "10.1.2.3", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        resolved_is(p, "www.example.test", "93.184.216.34", 443, EGRESS_DENY,
                    EGRESS_REASON_HOST_ADDRESS, NULL);
        resolved_is(p, "www.example.test", "::ffff:93.184.216.34", 443, EGRESS_DENY,
                    EGRESS_REASON_HOST_ADDRESS, NULL);
        resolved_is(p, "www.example.test", "93.184.216.35", 443, EGRESS_ALLOW,
                    EGRESS_REASON_ALLOW_RULE, NULL);
        egress_policy_free(p);
        egress_ceiling_unref(c);
}

/* ------------------------------------------------------------- ceiling */

static void test_ceiling(void) {
        egress_ceiling *c = NULL;
        char why[512];

        ok(egress_ceiling_new(&c) == 0, "ceiling created");
        ok(egress_ceiling_add_allow(c, "*.corp.test", why, sizeof why) == 0 &&
                   egress_ceiling_add_allow(c, "8.8.8.0/24", why, sizeof why) == 0 &&
                   egress_ceiling_add_deny(c, "secret.corp.test", why, sizeof why) == 0 &&
                   egress_ceiling_add_deny(c, "8.8.8.8", why, sizeof why) == 0,
           "ceiling rules added");
        ok(egress_ceiling_add_allow(c, "bad rule", why, sizeof why) == -EINVAL &&
                   strstr(why, "spaces"),
           "bad ceiling rule refused: %s", why);

        egress_policy *p = policy_with(c, "*");
        decide_is(p, "a.corp.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "other.test", 443, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        decide_is(p, "corp.test", 443, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        decide_is(p, "secret.corp.test", 443, EGRESS_DENY, EGRESS_REASON_CEILING_DENY_RULE);
        decide_is(p, "8.8.8.9", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_CEILING_DENY_RULE);
        decide_is(p, "8.8.4.4", 53, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        /* names need a name rule in the ceiling too */
        resolved_is(p, "other.test", "8.8.8.9", 53, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW,
                    NULL);
        /* a ceiling deny address applies to what a name resolves to */
        resolved_is(p, "a.corp.test", "8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_CEILING_DENY_RULE,
                    NULL);
        resolved_is(p, "a.corp.test", "1.1.1.1", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE, NULL);
        {
                egress_host h;
                egress_decision d;
                egress_host_parse("secret.corp.test", &h);
                egress_decide(p, &h, 443, &d);
                ok(d.index == 0 && strcmp(d.rule, "secret.corp.test") == 0,
                   "ceiling deny names its rule");
        }
        egress_policy_free(p);

        p = policy_with(c, "*.test");
        decide_is(p, "a.corp.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "b.test", 443, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        egress_policy_free(p);
        p = policy_with(c, "a.corp.test");
        decide_is(p, "a.corp.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "b.corp.test", 443, EGRESS_DENY, EGRESS_REASON_NO_ALLOW_RULE);
        egress_policy_free(p);

        /* older SDKs send allow_internet_access: true; the ceiling holds */
        ok(egress_policy_from_e2b(1, NULL, 0, NULL, 0, &p, why, sizeof why) == 0, "e2b: internet on");
        egress_policy_set_ceiling(p, c);
        decide_is(p, "a.corp.test", 443, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW);
        decide_is(p, "x.test", 443, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        decide_is(p, "9.9.9.9", 443, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        egress_policy_free(p);

        /* the policy holds its own reference */
        p = policy_with(c, "*");
        egress_ceiling_unref(c);
        decide_is(p, "a.corp.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);

        /* a port-limited ceiling */
        ok(egress_ceiling_new(&c) == 0 && egress_ceiling_add_allow(c, "*:443", NULL, 0) == 0,
           "ceiling *:443");
        egress_policy_set_ceiling(p, c);
        egress_ceiling_unref(c);
        decide_is(p, "any.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
        decide_is(p, "any.test", 80, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);

        /* an empty ceiling allows nothing; no ceiling denies everything */
        ok(egress_ceiling_new(&c) == 0, "empty ceiling");
        egress_policy_set_ceiling(p, c);
        egress_ceiling_unref(c);
        decide_is(p, "any.test", 443, EGRESS_DENY, EGRESS_REASON_CEILING_NO_ALLOW);
        egress_policy_set_ceiling(p, NULL);
        decide_is(p, "any.test", 443, EGRESS_DENY, EGRESS_REASON_NO_CEILING);
        decide_is(p, "8.8.8.8", 443, EGRESS_DENY, EGRESS_REASON_NO_CEILING);
        egress_policy_free(p);

        egress_ceiling_unref(NULL);
        egress_policy_free(NULL);
        egress_ceiling_unrefp(NULL);
        egress_policy_freep(NULL);
        ok(true, "destructors accept NULL");
}

/* ------------------------------------------------------------------ E2B */

static egress_policy *e2b(int internet, const char *const *allow, size_t na,
                          const char *const *deny, size_t nd) {
        egress_policy *p = NULL;
        char why[512] = "";
        int r = egress_policy_from_e2b(internet, allow, na, deny, nd, &p, why, sizeof why);
        if (r < 0) {
                printf("# from_e2b: %s\n", why);
                abort();
        }
        egress_ceiling *c = ceiling_all();
        egress_policy_set_ceiling(p, c);
        egress_ceiling_unref(c);
        return p;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void test_e2b(void) {
        static const char *const all[] = { "0.0.0.0/0" };
        egress_policy *p;

        /* on, nothing listed: all public, reserved ranges still refused */
        for (int internet = -1; internet <= 1; internet += 2) {
                p = e2b(internet, NULL, 0, NULL, 0);
                decide_is(p, "example.test", 443, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW);
                decide_is(p, "8.8.8.8", 53, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW);
                decide_is(p, "10.0.0.1", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
                decide_is(p, "169.254.169.254", 80, EGRESS_DENY, EGRESS_REASON_RESERVED_ADDRESS);
                resolved_is(p, "example.test", "127.0.0.1", 80, EGRESS_DENY,
                            EGRESS_REASON_RESERVED_ADDRESS, "loopback");
                strings_are(p, NULL, 0, NULL, 0, "internet on: no rules");
                egress_policy_free(p);
        }

        /* off: deny all, reported as E2B's denyOut ["0.0.0.0/0"] */
        p = e2b(0, NULL, 0, NULL, 0);
        decide_is(p, "example.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        decide_is(p, "8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
        strings_are(p, NULL, 0, all, 1, "internet off: denyOut 0.0.0.0/0");
        egress_policy_free(p);
        p = e2b(0, NULL, 0, all, 1);
        strings_are(p, NULL, 0, all, 1, "internet off + denyOut 0.0.0.0/0: not twice");
        egress_policy_free(p);

        /* denyOut all + allowOut list: only the list */
        {
                static const char *const allow[] = { "*.example.test", "1.1.1.1" };
                p = e2b(1, allow, N(allow), all, 1);
                decide_is(p, "a.example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
                decide_is(p, "example.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                decide_is(p, "other.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                decide_is(p, "1.1.1.1", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
                decide_is(p, "8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                /* the IP allow does not let a name be resolved */
                decide_is(p, "one.one.one.one", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                resolved_is(p, "a.example.test", "93.184.216.34", 443, EGRESS_ALLOW,
                            EGRESS_REASON_ALLOW_RULE, NULL);
                resolved_is(p, "a.example.test", "10.0.0.1", 443, EGRESS_DENY,
                            EGRESS_REASON_RESERVED_ADDRESS, NULL);
                static const char *const want_allow[] = { "*.example.test", "1.1.1.1" };
                strings_are(p, want_allow, 2, all, 1, "allow list + deny all");
                egress_policy_free(p);
        }
        /* internet off + allowOut: E2B's "off = denyOut 0.0.0.0/0", so the list still works */
        {
                static const char *const allow[] = { "example.test" };
                p = e2b(0, allow, 1, NULL, 0);
                decide_is(p, "example.test", 443, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
                decide_is(p, "other.test", 443, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                static const char *const want_allow[] = { "example.test" };
                strings_are(p, want_allow, 1, all, 1, "internet off + allowOut");
                egress_policy_free(p);
        }
        /* a deny list on open internet */
        {
                static const char *const deny[] = { "8.8.8.8" };
                p = e2b(1, NULL, 0, deny, 1);
                decide_is(p, "8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                decide_is(p, "64:ff9b::808:808", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                decide_is(p, "8.8.4.4", 53, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW);
                decide_is(p, "dns.test", 53, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW);
                resolved_is(p, "dns.test", "8.8.8.8", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE, NULL);
                resolved_is(p, "dns.test", "8.8.4.4", 53, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW,
                            NULL);
                egress_policy_free(p);
        }
        /* E2B: allowOut wins over denyOut */
        {
                static const char *const allow[] = { "8.8.8.8" };
                static const char *const deny[] = { "8.8.8.0/24" };
                p = e2b(1, allow, 1, deny, 1);
                decide_is(p, "8.8.8.8", 53, EGRESS_ALLOW, EGRESS_REASON_ALLOW_RULE);
                decide_is(p, "8.8.8.9", 53, EGRESS_DENY, EGRESS_REASON_DENY_RULE);
                decide_is(p, "8.8.9.1", 53, EGRESS_ALLOW, EGRESS_REASON_DEFAULT_ALLOW);
                egress_policy_free(p);
        }
        /* canonical strings back */
        {
                static const char *const allow[] = { "EXAMPLE.test.", "8.8.8.8/32",
                                                     "[2001:DB8::1]:443", "*" };
                static const char *const deny[] = { "10.0.0.0/8", "*:25" };
                static const char *const want_allow[] = { "example.test", "8.8.8.8",
                                                          "[2001:db8::1]:443", "0.0.0.0/0" };
                static const char *const want_deny[] = { "10.0.0.0/8", "0.0.0.0/0:25" };
                p = e2b(-1, allow, N(allow), deny, N(deny));
                strings_are(p, want_allow, N(want_allow), want_deny, N(want_deny),
                            "canonical E2B strings");
                /* and they map back to the same policy */
                char **a = NULL, **d = NULL;
                egress_policy *q = NULL;
                egress_policy_to_strings(p, &a, &d);
                size_t na = 0, nd = 0;
                while (a[na])
                        na++;
                while (d[nd])
                        nd++;
                int r = egress_policy_from_e2b(-1, (const char *const *) a, na,
                                               (const char *const *) d, nd, &q, NULL, 0);
                ok(r == 0, "the strings map back");
                if (r == 0)
                        strings_are(q, want_allow, N(want_allow), want_deny, N(want_deny),
                                    "round trip");
                egress_policy_free(q);
                egress_strv_free(a);
                egress_strv_free(d);
                egress_policy_free(p);
        }
        /* errors name the list and the index */
        {
                static const char *const allow[] = { "example.test", "bad host" };
                static const char *const deny[] = { "10.0.0.1/8" };
                char why[512] = "";
                p = NULL;
                int r = egress_policy_from_e2b(1, allow, 2, NULL, 0, &p, why, sizeof why);
                ok(r == -EINVAL && p == NULL && strncmp(why, "allowOut[1]: ", 13) == 0, "%s", why);
                r = egress_policy_from_e2b(1, NULL, 0, deny, 1, &p, why, sizeof why);
                ok(r == -EINVAL && p == NULL && strncmp(why, "denyOut[0]: ", 12) == 0, "%s", why);
                r = egress_policy_from_e2b(2, NULL, 0, NULL, 0, &p, why, sizeof why);
                ok(r == -EINVAL && p == NULL, "allow_internet_access 2 refused");
                r = egress_policy_from_e2b(1, NULL, 1, NULL, 0, &p, why, sizeof why);
                ok(r == -EINVAL && p == NULL, "a count without a list refused");
                static const char *const nul[] = { NULL };
                r = egress_policy_from_e2b(1, nul, 1, NULL, 0, &p, why, sizeof why);
                ok(r == -EINVAL && p == NULL, "a NULL entry refused: %s", why);
        }
        /* the E2B limit */
        {
                static const char *many[EGRESS_RULES_MAX];
                for (size_t i = 0; i < EGRESS_RULES_MAX; i++)
                        many[i] = "example.test";
                char why[512] = "";
                p = NULL;
                int r = egress_policy_from_e2b(1, many, EGRESS_RULES_MAX, NULL, 0, &p, why,
                                               sizeof why);
                ok(r == -E2BIG && p == NULL, "too many entries: %s", why);
                r = egress_policy_from_e2b(0, many, EGRESS_RULES_MAX - 1, NULL, 0, &p, why,
                                           sizeof why);
                ok(r == 0, "%d entries and the implicit deny fit: %s", EGRESS_RULES_MAX - 1, why);
                egress_policy_free(p);
        }
}

/* ------------------------------------------------------------- lists */

static void test_lists(void) {
        egress_policy *p = NULL;
        char why[512] = "";

        egress_policy_new(&p);
        ok(egress_policy_add_rules(
                   p, "a.test:80,443,!b.test,10.0.0.0/8,[::1]:80,443,1.2.3.4:80,5.6.7.8,!*:25", why,
                   sizeof why) == 0,
           "list parsed: %s", why);
        static const char *const want_allow[] = { "a.test:80,443", "10.0.0.0/8", "[::1]:80,443",
                                                  "1.2.3.4:80", "5.6.7.8" };
        static const char *const want_deny[] = { "b.test", "0.0.0.0/0:25" };
        strings_are(p, want_allow, N(want_allow), want_deny, N(want_deny), "list rules");
        static const struct {
                const char *in, *why;
        } bad[] = {
                { "", "empty rule list" },
                { "a.test,,b.test", "empty item" },
                { "a.test,", "empty item" },
                { ",a.test", "empty item" },
                { "a.test,443", "four decimal numbers" },
                { "a.test:80,99999", "not a port" },
                { "!", "empty rule" },
                { "ok.test,bad host", "spaces" },
                { "a.test:80,1-2-3", "single-label" },
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                int k = egress_policy_add_rules(p, bad[i].in, why, sizeof why);
                ok(k < 0 && strstr(why, bad[i].why), "list \"%s\" refused: %s", bad[i].in, why);
        }
        strings_are(p, want_allow, N(want_allow), want_deny, N(want_deny),
                    "failed lists changed nothing");
        egress_policy_free(p);

        /* the rule limit */
        egress_policy_new(&p);
        int k = 0;
        for (int i = 0; i < EGRESS_RULES_MAX && k == 0; i++)
                k = (i % 2 ? egress_policy_add_deny : egress_policy_add_allow)(p, "example.test",
                                                                               why, sizeof why);
        ok(k == 0, "%d rules fit", EGRESS_RULES_MAX);
        ok(egress_policy_add_allow(p, "example.test", why, sizeof why) == -E2BIG &&
                   strstr(why, "more than"),
           "rule %d refused: %s", EGRESS_RULES_MAX + 1, why);
        ok(egress_policy_add_rules(p, "x.test", why, sizeof why) == -E2BIG,
           "list over the limit refused");
        egress_policy_free(p);
}

int main(void) {
        test_hosts();
        test_rules();
        test_matching();
        test_reserved();
        test_operator();
        test_ceiling();
        test_e2b();
        test_lists();
        return tap_done();
}
