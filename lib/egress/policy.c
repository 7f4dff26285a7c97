/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The egress policy core: host canonicalization, the rule grammar, the
 * built-in reserved ranges, the operator ceiling and the decision. Pure code:
 * the proxy does the I/O and asks here. docs/egress.md explains every choice;
 * the comments below say why the code looks the way it does.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/policy.h"
#include "util/macro.h"

/* ---------------------------------------------------------------- errors */

static int why_set(char *why, size_t whylen, int code, const char *fmt, ...) _printf_(4, 5);
static int why_set(char *why, size_t whylen, int code, const char *fmt, ...) {
        if (why && whylen > 0) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(why, whylen, fmt, ap);
                va_end(ap);
        }
        return code;
}

/* A client's text quoted into a message: printable ASCII kept, everything
 * else as \xNN (a message ends up in logs and JSON; no CR/LF injection), cut
 * at 80 bytes. */
static const char *quote(const char *s, size_t n, char *buf, size_t len) {
        size_t o = 0;
        for (size_t i = 0; i < n && o + 8 < len; i++) {
                unsigned char c = (unsigned char) s[i];
                if (i == 80) {
                        memcpy(buf + o, "...", 3);
                        o += 3;
                        break;
                }
                if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
                        buf[o++] = (char) c;
                else
                        o += (size_t) snprintf(buf + o, len - o, "\\x%02x", c);
        }
        buf[o] = 0;
        return buf;
}

#define QUOTE_MAX 400

/* ------------------------------------------------------------- addresses */

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

static bool is_hex(char c) {
        return is_digit(c) || (c >= 'a' && c <= 'f');
}

static char to_lower(char c) {
        return c >= 'A' && c <= 'Z' ? (char) (c - 'A' + 'a') : c;
}

static unsigned addr_bits(const egress_addr *a) {
        return a->family == AF_INET ? 32 : 128;
}

static bool addr_equal(const egress_addr *a, const egress_addr *b) {
        return a->family == b->family && memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

/* Is a inside net/prefix? Different families never match. */
static bool addr_in(const egress_addr *a, const egress_addr *net, unsigned prefix) {
        if (a->family != net->family)
                return false;
        unsigned full = prefix / 8, rest = prefix % 8;
        if (memcmp(a->bytes, net->bytes, full) != 0)
                return false;
        if (rest == 0)
                return true;
        uint8_t mask = (uint8_t) (0xff << (8 - rest));
        return (a->bytes[full] & mask) == (net->bytes[full] & mask);
}

static bool addr_host_bits_zero(const egress_addr *a, unsigned prefix) {
        for (unsigned bit = prefix; bit < addr_bits(a); bit++)
                if (a->bytes[bit / 8] & (0x80 >> (bit % 8)))
                        return false;
        return true;
}

static egress_addr addr_v4(const uint8_t *b) {
        egress_addr a = { .family = AF_INET };
        memcpy(a.bytes, b, 4);
        return a;
}

static bool is_v4_mapped(const egress_addr *a) {
        static const uint8_t pfx[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
        return a->family == AF_INET6 && memcmp(a->bytes, pfx, 12) == 0;
}

/* A ::ffff:a.b.c.d address is that IPv4 address (an AF_INET6 socket dialling
 * it reaches a.b.c.d), so it is turned into one before anything looks at it. */
static egress_addr addr_normalize(const egress_addr *a) {
        if (is_v4_mapped(a))
                return addr_v4(a->bytes + 12);
        return *a;
}

/* The IPv4 address carried inside an IPv6 one, where a relay or translator
 * would deliver the connection to it: IPv4-compatible ::a.b.c.d (RFC 4291,
 * deprecated; not :: and ::1), SIIT ::ffff:0:a.b.c.d (RFC 2765), NAT64
 * 64:ff9b::a.b.c.d (RFC 6052) and 6to4 2002:AABB:CCDD::/48 (RFC 3056). */
static bool addr_embedded_v4(const egress_addr *a, egress_addr *ret) {
        static const uint8_t zero12[12] = { 0 };
        static const uint8_t siit[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0 };
        static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0 };
        const uint8_t *b = a->bytes;

        if (a->family != AF_INET6)
                return false;
        if (memcmp(b, zero12, 12) == 0) {
                uint32_t low = (uint32_t) b[12] << 24 | (uint32_t) b[13] << 16 |
                        (uint32_t) b[14] << 8 | b[15];
                if (low <= 1)
                        return false; /* :: and ::1 are themselves */
                *ret = addr_v4(b + 12);
                return true;
        }
        if (memcmp(b, siit, 12) == 0 || memcmp(b, nat64, 12) == 0) {
                *ret = addr_v4(b + 12);
                return true;
        }
        if (b[0] == 0x20 && b[1] == 0x02) {
                *ret = addr_v4(b + 2);
                return true;
        }
        return false;
}

int egress_addr_from_sockaddr(const struct sockaddr *sa, socklen_t len, egress_addr *ret) {
        egress_addr a = { 0 };

        if (!sa || !ret)
                return -EINVAL;
        if (len < (socklen_t) sizeof(sa_family_t))
                return -EINVAL;
        if (sa->sa_family == AF_INET) {
                struct sockaddr_in sin;
                if (len < (socklen_t) sizeof sin)
                        return -EINVAL;
                memcpy(&sin, sa, sizeof sin);
                a.family = AF_INET;
                memcpy(a.bytes, &sin.sin_addr, 4);
        } else if (sa->sa_family == AF_INET6) {
                struct sockaddr_in6 sin6;
                if (len < (socklen_t) sizeof sin6)
                        return -EINVAL;
                memcpy(&sin6, sa, sizeof sin6);
                /* A scope id picks an interface: never a destination we dial. */
                if (sin6.sin6_scope_id != 0)
                        return -EINVAL;
                a.family = AF_INET6;
                memcpy(a.bytes, &sin6.sin6_addr, 16);
        } else
                return -EAFNOSUPPORT;
        *ret = addr_normalize(&a);
        return 0;
}

int egress_addr_format(const egress_addr *a, char *buf, size_t len) {
        char out[64];
        int n = 0;

        if (!a || !buf)
                return -EINVAL;
        if (a->family == AF_INET)
                n = snprintf(out, sizeof out, "%u.%u.%u.%u", a->bytes[0], a->bytes[1], a->bytes[2],
                             a->bytes[3]);
        else if (a->family == AF_INET6) {
                /* RFC 5952 §4: lowercase, no leading zeros, the longest run
                 * (the first of equals) of two or more zero groups as "::". */
                unsigned g[8];
                int best = -1, best_len = 0;
                for (int i = 0; i < 8; i++)
                        g[i] = (unsigned) a->bytes[2 * i] << 8 | a->bytes[2 * i + 1];
                for (int i = 0; i < 8;) {
                        if (g[i] != 0) {
                                i++;
                                continue;
                        }
                        int j = i;
                        while (j < 8 && g[j] == 0)
                                j++;
                        if (j - i > best_len) {
                                best = i;
                                best_len = j - i;
                        }
                        i = j;
                }
                if (best_len < 2)
                        best = -1;
                for (int i = 0; i < 8; i++) {
                        if (i == best) {
                                n += snprintf(out + n, sizeof out - (size_t) n, "::");
                                i += best_len - 1;
                                continue;
                        }
                        if (i > 0 && i != best + best_len)
                                out[n++] = ':';
                        n += snprintf(out + n, sizeof out - (size_t) n, "%x", g[i]);
                }
                out[n] = 0;
        } else
                return -EINVAL;
        if ((size_t) n >= len)
                return -ENOBUFS;
        memcpy(buf, out, (size_t) n + 1);
        return n;
}

/* ---------------------------------------------------------- IPv4 parsing */

/* One inet_aton part (lowercase): "0x" hex (digits optional, as glibc and
 * the WHATWG URL parser take "0x" for 0), "0" octal, or decimal. */
static int ipv4_number(const char *s, size_t n, uint64_t *ret) {
        unsigned base = 10;
        size_t i = 0;
        uint64_t v = 0;

        if (n == 0)
                return -EINVAL;
        if (n >= 2 && s[0] == '0' && s[1] == 'x') {
                base = 16;
                i = 2;
        } else if (n >= 2 && s[0] == '0') {
                base = 8;
                i = 1;
        }
        for (; i < n; i++) {
                unsigned d;
                if (is_digit(s[i]))
                        d = (unsigned) (s[i] - '0');
                else if (base == 16 && is_hex(s[i]))
                        d = (unsigned) (s[i] - 'a' + 10);
                else
                        return -EINVAL;
                if (d >= base)
                        return -EINVAL;
                v = v * base + d;
                if (v > UINT32_MAX)
                        return -EINVAL;
        }
        *ret = v;
        return 0;
}

/* inet_aton's grammar (a, a.b, a.b.c, a.b.c.d; the last part fills the rest
 * of the 32 bits), without its tolerance for trailing junk. */
static int ipv4_parse_loose(const char *s, size_t n, egress_addr *ret) {
        uint64_t part[4];
        size_t np = 0, i = 0;

        for (;;) {
                size_t start = i;
                if (np == 4)
                        return -EINVAL;
                while (i < n && s[i] != '.')
                        i++;
                int r = ipv4_number(s + start, i - start, &part[np]);
                if (r < 0)
                        return r;
                np++;
                if (i == n)
                        break;
                i++;
        }
        uint64_t v = 0;
        for (size_t k = 0; k + 1 < np; k++) {
                if (part[k] > 255)
                        return -EINVAL;
                v |= part[k] << (24 - 8 * k);
        }
        uint64_t last_max = UINT32_MAX >> (8 * (np - 1));
        if (part[np - 1] > last_max)
                return -EINVAL;
        v |= part[np - 1];

        egress_addr a = { .family = AF_INET };
        a.bytes[0] = (uint8_t) (v >> 24);
        a.bytes[1] = (uint8_t) (v >> 16);
        a.bytes[2] = (uint8_t) (v >> 8);
        a.bytes[3] = (uint8_t) v;
        *ret = a;
        return 0;
}

/* The one IPv4 spelling rules accept: four decimal numbers 0-255 without
 * leading zeros ("010" could be octal 8 or ten: refused). */
static int ipv4_parse_strict(const char *s, size_t n, egress_addr *ret) {
        egress_addr a = { .family = AF_INET };
        size_t i = 0;

        for (int k = 0; k < 4; k++) {
                size_t start = i;
                unsigned v = 0;
                while (i < n && is_digit(s[i]) && i - start < 4) {
                        v = v * 10 + (unsigned) (s[i] - '0');
                        i++;
                }
                size_t digits = i - start;
                if (digits == 0 || digits > 3 || v > 255 || (digits > 1 && s[start] == '0'))
                        return -EINVAL;
                a.bytes[k] = (uint8_t) v;
                if (k < 3) {
                        if (i >= n || s[i] != '.')
                                return -EINVAL;
                        i++;
                }
        }
        if (i != n)
                return -EINVAL;
        *ret = a;
        return 0;
}

/* IPv6 text (NUL-terminated, no brackets, no zone) through inet_pton, which
 * takes hex groups of 1-4 digits, one "::" and a dotted-quad tail. */
static int ipv6_parse(const char *s, egress_addr *ret) {
        struct in6_addr in6;
        for (const char *p = s; *p; p++)
                if (!is_hex(to_lower(*p)) && *p != ':' && *p != '.')
                        return -EINVAL;
        if (inet_pton(AF_INET6, s, &in6) != 1)
                return -EINVAL;
        egress_addr a = { .family = AF_INET6 };
        memcpy(a.bytes, &in6, 16);
        *ret = a;
        return 0;
}

/* WHATWG URL "ends in a number": the last label is all digits, or "0x"
 * followed by hex digits. Such a host is an IPv4 address or nothing. */
static bool ends_in_number(const char *s, size_t n) {
        size_t start = n;
        while (start > 0 && s[start - 1] != '.')
                start--;
        const char *l = s + start;
        size_t ln = n - start;
        if (ln == 0)
                return false;
        size_t i = 0;
        if (ln >= 2 && l[0] == '0' && l[1] == 'x') {
                for (i = 2; i < ln; i++)
                        if (!is_hex(l[i]))
                                return false;
                return true;
        }
        for (; i < ln; i++)
                if (!is_digit(l[i]))
                        return false;
        return true;
}

/* ----------------------------------------------------------------- names */

/* A lowercase name without trailing dot: labels of 1-63 [a-z0-9-] that do
 * not start or end with '-', 253 bytes at most. Returns the label count. */
static int name_check(const char *s, size_t n) {
        int labels = 0;
        size_t i = 0;

        if (n == 0 || n > EGRESS_NAME_MAX)
                return -EINVAL;
        while (i <= n) {
                size_t start = i;
                while (i < n && s[i] != '.') {
                        char c = s[i];
                        if (!is_digit(c) && !(c >= 'a' && c <= 'z') && c != '-')
                                return -EINVAL;
                        i++;
                }
                size_t ln = i - start;
                if (ln == 0 || ln > 63 || s[start] == '-' || s[i - 1] == '-')
                        return -EINVAL;
                labels++;
                i++;
        }
        return labels;
}

/* ----------------------------------------------------------------- hosts */

static void host_from_addr(const egress_addr *raw, egress_host *h) {
        egress_addr a = addr_normalize(raw);
        h->kind = a.family == AF_INET ? EGRESS_HOST_IPV4 : EGRESS_HOST_IPV6;
        h->addr = a;
        h->has_embedded_v4 = addr_embedded_v4(&a, &h->embedded_v4);
        (void) egress_addr_format(&a, h->text, sizeof h->text);
}

int egress_host_parse_n(const char *in, size_t len, egress_host *ret) {
        char buf[EGRESS_HOST_INPUT_MAX + 1];
        egress_host h;
        bool bracket = false, colon = false;

        if (!in || !ret)
                return -EINVAL;
        if (len == 0 || len > EGRESS_HOST_INPUT_MAX)
                return -EINVAL;
        if (in[0] == '[') {
                if (len < 3 || in[len - 1] != ']')
                        return -EINVAL;
                bracket = true;
                in++;
                len -= 2;
        }
        /* One alphabet for everything: no byte that could end the host in
         * some other parser ('@', '#', '/', '\\', '%', NUL, CR, LF, space),
         * none that a resolver would treat differently ('_', IDNA). */
        for (size_t i = 0; i < len; i++) {
                char c = to_lower(in[i]);
                if (c == ':')
                        colon = true;
                else if (!is_digit(c) && !(c >= 'a' && c <= 'z') && c != '.' && c != '-')
                        return -EINVAL;
                buf[i] = c;
        }
        buf[len] = 0;

        memset(&h, 0, sizeof h);
        if (bracket || colon) {
                egress_addr a;
                if (!colon || ipv6_parse(buf, &a) < 0)
                        return -EINVAL;
                host_from_addr(&a, &h);
        } else {
                if (buf[len - 1] == '.')
                        buf[--len] = 0; /* the root label: "example.com." is example.com */
                if (len == 0)
                        return -EINVAL;
                if (ends_in_number(buf, len)) {
                        egress_addr a;
                        if (ipv4_parse_loose(buf, len, &a) < 0)
                                return -EINVAL;
                        host_from_addr(&a, &h);
                } else {
                        /* One label ("localhost", "metadata") would go through
                         * search domains and /etc/hosts: refused. */
                        if (name_check(buf, len) < 2)
                                return -EINVAL;
                        h.kind = EGRESS_HOST_NAME;
                        memcpy(h.text, buf, len + 1);
                }
        }
        memcpy(ret, &h, sizeof h);
        return 0;
}

int egress_host_parse(const char *in, egress_host *ret) {
        if (!in)
                return -EINVAL;
        return egress_host_parse_n(in, strnlen(in, EGRESS_HOST_INPUT_MAX + 1), ret);
}

bool egress_host_equal(const egress_host *a, const egress_host *b) {
        if (a->kind != b->kind || strcmp(a->text, b->text) != 0)
                return false;
        if (a->kind == EGRESS_HOST_NAME)
                return true;
        if (!addr_equal(&a->addr, &b->addr) || a->has_embedded_v4 != b->has_embedded_v4)
                return false;
        return !a->has_embedded_v4 || addr_equal(&a->embedded_v4, &b->embedded_v4);
}

int egress_host_sockaddr(const egress_host *h, uint16_t port, struct sockaddr_storage *ret,
                         socklen_t *ret_len) {
        struct sockaddr_storage ss;

        if (!h || !ret || !ret_len)
                return -EINVAL;
        memset(&ss, 0, sizeof ss);
        if (h->kind == EGRESS_HOST_IPV4) {
                struct sockaddr_in *sin = (struct sockaddr_in *) &ss;
                sin->sin_family = AF_INET;
                sin->sin_port = htons(port);
                memcpy(&sin->sin_addr, h->addr.bytes, 4);
                *ret_len = sizeof *sin;
        } else if (h->kind == EGRESS_HOST_IPV6) {
                struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) &ss;
                sin6->sin6_family = AF_INET6;
                sin6->sin6_port = htons(port);
                memcpy(&sin6->sin6_addr, h->addr.bytes, 16);
                *ret_len = sizeof *sin6;
        } else
                return -EINVAL;
        memcpy(ret, &ss, sizeof ss);
        return 0;
}

/* ----------------------------------------------------------------- rules */

/* A port: 1-65535, decimal, no sign, no leading zero. */
static int port_parse(const char *s, size_t n, uint16_t *ret) {
        unsigned v = 0;
        if (n == 0 || n > 5 || s[0] == '0')
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                if (!is_digit(s[i]))
                        return -EINVAL;
                v = v * 10 + (unsigned) (s[i] - '0');
        }
        if (v == 0 || v > 65535)
                return -EINVAL;
        *ret = (uint16_t) v;
        return 0;
}

static int ports_parse(const char *rule, const char *s, egress_rule *r, char *why, size_t whylen) {
        char q[QUOTE_MAX];
        size_t i = 0, n = strlen(s);

        r->n_ports = 0;
        if (n == 0)
                return why_set(why, whylen, -EINVAL, "\"%s\": no port after ':'",
                               quote(rule, strlen(rule), q, sizeof q));
        while (i <= n) {
                size_t start = i, dash = SIZE_MAX;
                while (i < n && s[i] != ',') {
                        if (s[i] == '-' && dash == SIZE_MAX)
                                dash = i;
                        i++;
                }
                egress_port_range pr;
                int k;
                if (dash == SIZE_MAX) {
                        k = port_parse(s + start, i - start, &pr.first);
                        pr.last = pr.first;
                } else {
                        k = port_parse(s + start, dash - start, &pr.first);
                        if (k >= 0)
                                k = port_parse(s + dash + 1, i - dash - 1, &pr.last);
                        if (k >= 0 && pr.last < pr.first)
                                return why_set(why, whylen, -EINVAL,
                                               "\"%s\": port range %u-%u runs backwards",
                                               quote(rule, strlen(rule), q, sizeof q), pr.first,
                                               pr.last);
                }
                if (k < 0) {
                        char qp[QUOTE_MAX];
                        return why_set(why, whylen, -EINVAL,
                                       "\"%s\": \"%s\" is not a port (1-65535) or range (1000-2000)",
                                       quote(rule, strlen(rule), q, sizeof q),
                                       quote(s + start, i - start, qp, sizeof qp));
                }
                if (r->n_ports == EGRESS_RULE_PORTS_MAX)
                        return why_set(why, whylen, -E2BIG, "\"%s\": more than %d ports",
                                       quote(rule, strlen(rule), q, sizeof q), EGRESS_RULE_PORTS_MAX);
                r->ports[r->n_ports++] = pr;
                i++;
        }
        return 0;
}

/* addr[/prefix], already lowercase, without brackets or ports. */
static int cidr_parse(const char *rule, char *s, egress_rule *r, char *why, size_t whylen) {
        char q[QUOTE_MAX];
        const char *qr = quote(rule, strlen(rule), q, sizeof q);
        char *slash = strchr(s, '/');
        unsigned prefix = 0;
        egress_addr a;

        if (slash) {
                *slash = 0;
                const char *p = slash + 1;
                size_t n = strlen(p);
                if (n == 0 || n > 3 || (n > 1 && p[0] == '0'))
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": the prefix length after '/' must be a number without leading zeros",
                                qr);
                for (size_t i = 0; i < n; i++) {
                        if (!is_digit(p[i]))
                                return why_set(why, whylen, -EINVAL,
                                               "\"%s\": the prefix length after '/' must be a number",
                                               qr);
                        prefix = prefix * 10 + (unsigned) (p[i] - '0');
                }
        }
        if (strchr(s, ':')) {
                if (ipv6_parse(s, &a) < 0)
                        return why_set(why, whylen, -EINVAL, "\"%s\": not a valid IPv6 address", qr);
                if (is_v4_mapped(&a) && (!slash || prefix >= 96))
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": write the IPv4 address itself, not its IPv4-mapped IPv6 form",
                                qr);
        } else if (ipv4_parse_strict(s, strlen(s), &a) < 0)
                return why_set(
                        why, whylen, -EINVAL,
                        "\"%s\": not an IPv4 address; rules take four decimal numbers without leading zeros (10.0.0.1)",
                        qr);
        if (!slash)
                prefix = addr_bits(&a);
        if (prefix > addr_bits(&a))
                return why_set(why, whylen, -EINVAL, "\"%s\": prefix /%u is longer than %u bits",
                               qr, prefix, addr_bits(&a));
        if (!addr_host_bits_zero(&a, prefix)) {
                /* 10.0.0.1/8: meant 10.0.0.0/8 or 10.0.0.1? Ask, not guess. */
                egress_addr net = a;
                char t[64];
                for (unsigned bit = prefix; bit < addr_bits(&a); bit++)
                        net.bytes[bit / 8] &= (uint8_t) ~(0x80 >> (bit % 8));
                (void) egress_addr_format(&net, t, sizeof t);
                return why_set(
                        why, whylen, -EINVAL,
                        "\"%s\": address has bits set past /%u; write %s/%u for the network, or drop /%u for one address",
                        qr, prefix, t, prefix, prefix);
        }
        r->addr = a;
        r->prefix = prefix;
        /* E2B's ALL_TRAFFIC: 0.0.0.0/0 means every destination, names too. */
        r->kind = a.family == AF_INET && prefix == 0 ? EGRESS_RULE_ALL : EGRESS_RULE_CIDR;
        if (r->kind == EGRESS_RULE_ALL)
                memset(&r->addr, 0, sizeof r->addr);
        return 0;
}

int egress_rule_parse(const char *text, egress_rule *ret, char *why, size_t whylen) {
        char buf[EGRESS_RULE_INPUT_MAX + 1], q[QUOTE_MAX];
        const char *qr;
        char *target, *ports = NULL;
        size_t n, colons = 0;
        egress_rule r;
        bool bracket = false;
        int k;

        if (!text || !ret)
                return why_set(why, whylen, -EINVAL, "no rule");
        n = strnlen(text, EGRESS_RULE_INPUT_MAX + 1);
        qr = quote(text, n, q, sizeof q);
        if (n == 0)
                return why_set(why, whylen, -EINVAL, "empty rule");
        if (n > EGRESS_RULE_INPUT_MAX)
                return why_set(why, whylen, -E2BIG, "\"%s\": rule longer than %d bytes", qr,
                               EGRESS_RULE_INPUT_MAX);
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char) text[i];
                if (c >= 0x80)
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": non-ASCII byte 0x%02x; write internationalized names in punycode (xn--...)",
                                qr, c);
                if (c == ' ' || c == '\t')
                        return why_set(why, whylen, -EINVAL, "\"%s\": spaces are not allowed", qr);
                if (c < 0x20 || c == 0x7f)
                        return why_set(why, whylen, -EINVAL, "\"%s\": control byte 0x%02x", qr, c);
                if (!is_digit(to_lower((char) c)) &&
                    !(to_lower((char) c) >= 'a' && to_lower((char) c) <= 'z') &&
                    !strchr(".-*:/,[]", c))
                        return why_set(why, whylen, -EINVAL,
                                       "\"%s\": character '%c' is not allowed", qr, c);
                buf[i] = to_lower((char) c);
                if (c == ':')
                        colons++;
        }
        buf[n] = 0;
        memset(&r, 0, sizeof r);

        /* Split off the ports. IPv6 with ports needs brackets: "::1:443" is
         * one address, so a bare IPv6 rule never has ports. */
        target = buf;
        if (buf[0] == '[') {
                char *close = strchr(buf, ']');
                if (!close)
                        return why_set(why, whylen, -EINVAL, "\"%s\": '[' without ']'", qr);
                *close = 0;
                target = buf + 1;
                if (close[1] == ':')
                        ports = close + 2;
                else if (close[1] != 0)
                        return why_set(why, whylen, -EINVAL,
                                       "\"%s\": only ':' and ports may follow ']'", qr);
                if (!strchr(target, ':'))
                        return why_set(why, whylen, -EINVAL,
                                       "\"%s\": brackets are only for IPv6 addresses", qr);
                bracket = true;
        } else if (colons == 1) {
                ports = strchr(buf, ':');
                *ports++ = 0;
        }
        if (strchr(target, '[') || strchr(target, ']') ||
            (ports && (strchr(ports, '[') || strchr(ports, ']'))))
                return why_set(
                        why, whylen, -EINVAL,
                        "\"%s\": '[' and ']' go only around an IPv6 address: [2001:db8::1]:443", qr);
        if (strchr(target, ','))
                return why_set(
                        why, whylen, -EINVAL,
                        "\"%s\": ',' only separates ports (example.com:80,443); give one destination per rule",
                        qr);
        if (ports && strchr(ports, ':'))
                return why_set(why, whylen, -EINVAL,
                               "\"%s\": one ':' before the ports, as in [2001:db8::1]:443", qr);
        if (ports && (k = ports_parse(text, ports, &r, why, whylen)) < 0)
                return k;
        if (colons >= 2 && !bracket && strchr(target, '/')) {
                /* "2001:db8::/32:443": say what to write instead of
                 * "not a number" about "32:443". */
                const char *slash = strchr(target, '/');
                if (strchr(slash, ':'))
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": write an IPv6 prefix with ports in brackets: [2001:db8::/32]:443",
                                qr);
        }

        size_t tn = strlen(target);
        if (tn == 0)
                return why_set(why, whylen, -EINVAL, "\"%s\": no destination before ':'", qr);
        if (strcmp(target, "*") == 0)
                r.kind = EGRESS_RULE_ALL;
        else if (target[0] == '*') {
                if (target[1] != '.')
                        return why_set(why, whylen, -EINVAL,
                                       "\"%s\": '*' must be a whole first label, as in *.example.com",
                                       qr);
                char *sfx = target + 2;
                size_t sn = strlen(sfx);
                if (strchr(sfx, '*'))
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": only one '*', as the whole first label (*.example.com)", qr);
                if (sn > 0 && sfx[sn - 1] == '.')
                        sfx[--sn] = 0;
                if (strchr(sfx, '/') || strchr(sfx, ':'))
                        return why_set(why, whylen, -EINVAL,
                                       "\"%s\": '*.' goes only before a domain name", qr);
                if (sn > 0 && ends_in_number(sfx, sn))
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": a domain cannot end in a number; use a CIDR for addresses",
                                qr);
                if (name_check(sfx, sn) < 1)
                        return why_set(
                                why, whylen, -EINVAL,
                                "\"%s\": not a valid domain name after '*.' (labels of 1-63 letters, digits and '-', no '-' at either end, 253 bytes at most; '_' is not allowed)",
                                qr);
                r.kind = EGRESS_RULE_SUFFIX;
                memcpy(r.name, sfx, sn + 1);
        } else if (strchr(target, '*'))
                return why_set(
                        why, whylen, -EINVAL,
                        "\"%s\": '*' is only allowed as the whole first label (*.example.com) or alone",
                        qr);
        else if (bracket || strchr(target, '/') || strchr(target, ':')) {
                if ((k = cidr_parse(text, target, &r, why, whylen)) < 0)
                        return k;
        } else {
                if (target[tn - 1] == '.')
                        target[--tn] = 0;
                if (tn == 0)
                        return why_set(why, whylen, -EINVAL, "\"%s\": not a domain name", qr);
                if (ends_in_number(target, tn)) {
                        if ((k = cidr_parse(text, target, &r, why, whylen)) < 0)
                                return k;
                } else {
                        int labels = name_check(target, tn);
                        if (labels < 0)
                                return why_set(
                                        why, whylen, -EINVAL,
                                        "\"%s\": not a valid domain name (labels of 1-63 letters, digits and '-', no '-' at either end, 253 bytes at most; '_' is not allowed)",
                                        qr);
                        if (labels < 2)
                                return why_set(
                                        why, whylen, -EINVAL,
                                        "\"%s\": a single-label name is not allowed (it would resolve through search domains or /etc/hosts); write the full name",
                                        qr);
                        r.kind = EGRESS_RULE_NAME;
                        memcpy(r.name, target, tn + 1);
                }
        }
        memcpy(ret, &r, sizeof r);
        return 0;
}

static int rule_format_target(const egress_rule *r, bool e2b, char *out, size_t len) {
        char a[64];
        switch (r->kind) {
        case EGRESS_RULE_ALL:
                return snprintf(out, len, "%s", e2b ? "0.0.0.0/0" : "*");
        case EGRESS_RULE_NAME:
                return snprintf(out, len, "%s", r->name);
        case EGRESS_RULE_SUFFIX:
                return snprintf(out, len, "*.%s", r->name);
        case EGRESS_RULE_CIDR: {
                bool v6_ports = r->addr.family == AF_INET6 && r->n_ports > 0;
                if (egress_addr_format(&r->addr, a, sizeof a) < 0)
                        return -EINVAL;
                if (r->prefix == addr_bits(&r->addr))
                        return snprintf(out, len, "%s%s%s", v6_ports ? "[" : "", a,
                                        v6_ports ? "]" : "");
                return snprintf(out, len, "%s%s/%u%s", v6_ports ? "[" : "", a, r->prefix,
                                v6_ports ? "]" : "");
        }
        }
        return -EINVAL;
}

static int rule_format(const egress_rule *r, bool e2b, char *buf, size_t len) {
        char out[EGRESS_RULE_TEXT_MAX + 64];
        int n;

        if (!r || !buf)
                return -EINVAL;
        n = rule_format_target(r, e2b, out, sizeof out);
        if (n < 0)
                return n;
        for (unsigned i = 0; i < r->n_ports && i < EGRESS_RULE_PORTS_MAX; i++) {
                const egress_port_range *p = &r->ports[i];
                n += snprintf(out + n, sizeof out - (size_t) n, "%c%u", i == 0 ? ':' : ',', p->first);
                if (p->last != p->first)
                        n += snprintf(out + n, sizeof out - (size_t) n, "-%u", p->last);
        }
        if ((size_t) n >= len)
                return -ENOBUFS;
        memcpy(buf, out, (size_t) n + 1);
        return n;
}

int egress_rule_format(const egress_rule *r, char *buf, size_t len) {
        return rule_format(r, false, buf, len);
}

bool egress_rule_equal(const egress_rule *a, const egress_rule *b) {
        if (a->kind != b->kind || a->n_ports != b->n_ports)
                return false;
        for (unsigned i = 0; i < a->n_ports && i < EGRESS_RULE_PORTS_MAX; i++)
                if (a->ports[i].first != b->ports[i].first || a->ports[i].last != b->ports[i].last)
                        return false;
        switch (a->kind) {
        case EGRESS_RULE_NAME:
        case EGRESS_RULE_SUFFIX:
                return strcmp(a->name, b->name) == 0;
        case EGRESS_RULE_CIDR:
                return a->prefix == b->prefix && addr_equal(&a->addr, &b->addr);
        default:
                return true;
        }
}

/* --------------------------------------------------------- reserved ranges */

/* Destinations no sandbox reaches unless the operator opens them: what is
 * not the public internet (IANA special-purpose registries, RFC 6890 and
 * successors) plus the cloud metadata services. Most specific entries first
 * within a family; egress_ceiling_allow_private() uses the most specific one
 * an address falls in. */
typedef struct reserved_range {
        egress_addr net;
        unsigned prefix;
        const char *detail;
} reserved_range;

#define V4(a, b, c, d)                                                                             \
        {                                                                                          \
                .family = AF_INET, .bytes = { a, b, c, d }                                         \
        }
#define V6(...)                                                                                    \
        {                                                                                          \
                .family = AF_INET6, .bytes = { __VA_ARGS__ }                                       \
        }

static const reserved_range reserved[] = {
        { V4(169, 254, 169, 254), 32, "cloud metadata service" },
        { V4(168, 63, 129, 16), 32, "Azure host services (metadata)" },
        { V4(100, 100, 100, 200), 32, "Alibaba Cloud metadata service" },
        { V4(255, 255, 255, 255), 32, "limited broadcast" },
        { V4(0, 0, 0, 0), 8, "unspecified (\"this network\")" },
        { V4(10, 0, 0, 0), 8, "private (RFC 1918)" },
        { V4(100, 64, 0, 0), 10, "shared address space (CGNAT)" },
        { V4(127, 0, 0, 0), 8, "loopback" },
        { V4(169, 254, 0, 0), 16, "link-local" },
        { V4(172, 16, 0, 0), 12, "private (RFC 1918)" },
        { V4(192, 0, 0, 0), 24, "IETF protocol assignments" },
        { V4(192, 0, 2, 0), 24, "documentation (TEST-NET-1)" },
        { V4(192, 88, 99, 0), 24, "6to4 relay anycast (deprecated)" },
        { V4(192, 168, 0, 0), 16, "private (RFC 1918)" },
        { V4(198, 18, 0, 0), 15, "benchmarking" },
        { V4(198, 51, 100, 0), 24, "documentation (TEST-NET-2)" },
        { V4(203, 0, 113, 0), 24, "documentation (TEST-NET-3)" },
        { V4(224, 0, 0, 0), 4, "multicast" },
        { V4(240, 0, 0, 0), 4, "reserved (240/4)" },

        { V6(0), 128, "unspecified" },
        { V6(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1), 128, "loopback" },
        { V6(0xfd, 0x00, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x54), 128,
          "cloud metadata service (AWS IPv6)" },
        { V6(0), 96, "IPv4-compatible (deprecated)" },
        { V6(0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff), 96, "IPv4-translated (SIIT)" },
        { V6(0x00, 0x64, 0xff, 0x9b, 0x00, 0x01), 48, "local-use NAT64" },
        { V6(0x01, 0x00), 64, "discard-only" },
        { V6(0x20, 0x01, 0x0d, 0xb8), 32, "documentation" },
        { V6(0x20, 0x01), 23, "IETF protocol assignments (Teredo, benchmarking, ORCHID)" },
        { V6(0x3f, 0xff), 20, "documentation" },
        { V6(0x5f, 0x00), 16, "SRv6 SIDs" },
        { V6(0xfc), 7, "unique local (ULA)" },
        { V6(0xfe, 0x80), 10, "link-local" },
        { V6(0xfe, 0xc0), 10, "site-local (deprecated)" },
        { V6(0xff), 8, "multicast" },
};

/* The most specific reserved range holding a, or NULL. */
static const reserved_range *reserved_find(const egress_addr *a) {
        const reserved_range *best = NULL;
        for (size_t i = 0; i < ELEMENTSOF(reserved); i++)
                if (addr_in(a, &reserved[i].net, reserved[i].prefix) &&
                    (!best || reserved[i].prefix > best->prefix))
                        best = &reserved[i];
        return best;
}

/* ------------------------------------------------------------- rule lists */

typedef struct rule_list {
        egress_rule *v;
        size_t n, cap;
} rule_list;

static int rule_list_push(rule_list *l, const egress_rule *r) {
        if (l->n == l->cap) {
                size_t cap = l->cap ? l->cap * 2 : 8;
                egress_rule *v = realloc(l->v, cap * sizeof *v);
                if (!v)
                        return -ENOMEM;
                l->v = v;
                l->cap = cap;
        }
        l->v[l->n++] = *r;
        return 0;
}

/* What a decision looks at: the name (before and after resolution), and the
 * address once there is one (a literal, or what the name resolved to). */
typedef struct target {
        const char *name;
        bool have_addr;
        egress_addr addr;
        bool has_v4;
        egress_addr v4; /* embedded IPv4: the address allow rules look at */
} target;

static void target_set_addr(target *t, const egress_addr *a) {
        t->have_addr = true;
        t->addr = addr_normalize(a);
        t->has_v4 = addr_embedded_v4(&t->addr, &t->v4);
}

static bool ports_match(const egress_rule *r, uint16_t port) {
        if (r->n_ports == 0)
                return true;
        for (unsigned i = 0; i < r->n_ports && i < EGRESS_RULE_PORTS_MAX; i++)
                if (port >= r->ports[i].first && port <= r->ports[i].last)
                        return true;
        return false;
}

static bool name_match(const egress_rule *r, const char *name) {
        if (r->kind == EGRESS_RULE_NAME)
                return strcmp(r->name, name) == 0;
        size_t n = strlen(name), s = strlen(r->name);
        /* *.example.com: a.example.com yes; example.com, aexample.com no. */
        return n > s + 1 && name[n - s - 1] == '.' && memcmp(name + n - s, r->name, s) == 0;
}

/* An allow rule must hold the address that is checked (an embedded IPv4 one
 * when there is one); a deny rule wins if it holds any form of it. */
static bool rule_match(const egress_rule *r, const target *t, uint16_t port, bool deny) {
        if (!ports_match(r, port))
                return false;
        switch (r->kind) {
        case EGRESS_RULE_ALL:
                return true;
        case EGRESS_RULE_NAME:
        case EGRESS_RULE_SUFFIX:
                return t->name && name_match(r, t->name);
        case EGRESS_RULE_CIDR:
                if (!t->have_addr)
                        return false;
                if (deny)
                        return addr_in(&t->addr, &r->addr, r->prefix) ||
                                (t->has_v4 && addr_in(&t->v4, &r->addr, r->prefix));
                return addr_in(t->has_v4 ? &t->v4 : &t->addr, &r->addr, r->prefix);
        }
        return false;
}

bool egress_rule_matches_host(const egress_rule *r, const egress_host *h, uint16_t port) {
        target t = { 0 };
        if (h->kind == EGRESS_HOST_NAME)
                t.name = h->text;
        else
                target_set_addr(&t, &h->addr);
        return rule_match(r, &t, port, false);
}

static int rule_list_find(const rule_list *l, const target *t, uint16_t port, bool deny) {
        for (size_t i = 0; i < l->n; i++)
                if (rule_match(&l->v[i], t, port, deny))
                        return (int) i;
        return -1;
}

enum { BY_DEFAULT, BY_ALLOW, BY_DENY };

typedef struct evaluation {
        egress_verdict verdict;
        int by;
        int index;
} evaluation;

static evaluation evaluate(const rule_list *allow, const rule_list *deny, bool allow_wins,
                           egress_verdict fallback, const target *t, uint16_t port) {
        int a = rule_list_find(allow, t, port, false);
        int d = rule_list_find(deny, t, port, true);
        if (d >= 0 && !(allow_wins && a >= 0))
                return (evaluation) { EGRESS_DENY, BY_DENY, d };
        if (a >= 0)
                return (evaluation) { EGRESS_ALLOW, BY_ALLOW, a };
        return (evaluation) { fallback, BY_DEFAULT, -1 };
}

/* ---------------------------------------------------------------- ceiling */

struct egress_ceiling {
        unsigned n_ref;
        rule_list allow, deny;
        egress_rule exempt[EGRESS_EXEMPTIONS_MAX];
        size_t n_exempt;
        egress_addr host[EGRESS_HOST_ADDRESSES_MAX];
        size_t n_host;
};

int egress_ceiling_new(egress_ceiling **ret) {
        if (!ret)
                return -EINVAL;
        egress_ceiling *c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        c->n_ref = 1;
        *ret = c;
        return 0;
}

egress_ceiling *egress_ceiling_ref(egress_ceiling *c) {
        if (c)
                c->n_ref++;
        return c;
}

egress_ceiling *egress_ceiling_unref(egress_ceiling *c) {
        if (!c || --c->n_ref > 0)
                return NULL;
        free(c->allow.v);
        free(c->deny.v);
        free(c);
        return NULL;
}

void egress_ceiling_unrefp(egress_ceiling **c) {
        if (c)
                *c = egress_ceiling_unref(*c);
}

static int lists_add(rule_list *allow, rule_list *deny, bool is_deny, const char *text, char *why,
                     size_t whylen) {
        egress_rule r;
        int k = egress_rule_parse(text, &r, why, whylen);
        if (k < 0)
                return k;
        if (allow->n + deny->n >= EGRESS_RULES_MAX)
                return why_set(why, whylen, -E2BIG, "more than %d rules", EGRESS_RULES_MAX);
        k = rule_list_push(is_deny ? deny : allow, &r);
        if (k < 0)
                return why_set(why, whylen, k, "out of memory");
        return 0;
}

int egress_ceiling_add_allow(egress_ceiling *c, const char *rule, char *why, size_t whylen) {
        if (!c)
                return -EINVAL;
        return lists_add(&c->allow, &c->deny, false, rule, why, whylen);
}

int egress_ceiling_add_deny(egress_ceiling *c, const char *rule, char *why, size_t whylen) {
        if (!c)
                return -EINVAL;
        return lists_add(&c->allow, &c->deny, true, rule, why, whylen);
}

/* Does exemption e lie inside reserved range r? */
static bool exempt_within(const egress_rule *e, const reserved_range *r) {
        return e->prefix >= r->prefix && addr_in(&e->addr, &r->net, r->prefix);
}

int egress_ceiling_allow_private(egress_ceiling *c, const char *cidr, char *why, size_t whylen) {
        char q[QUOTE_MAX];
        egress_rule r;
        bool inside = false;
        int k;

        if (!c)
                return -EINVAL;
        if ((k = egress_rule_parse(cidr, &r, why, whylen)) < 0)
                return k;
        const char *qr = quote(cidr, strlen(cidr), q, sizeof q);
        if (r.kind != EGRESS_RULE_CIDR || r.n_ports > 0)
                return why_set(why, whylen, -EINVAL,
                               "\"%s\": a reserved range to open is an address or CIDR without ports",
                               qr);
        for (size_t i = 0; i < ELEMENTSOF(reserved); i++)
                if (exempt_within(&r, &reserved[i]))
                        inside = true;
        if (!inside)
                return why_set(
                        why, whylen, -EINVAL,
                        "\"%s\" does not lie inside a reserved range (private, loopback, link-local, CGNAT, ...); there is nothing to open",
                        qr);
        if (c->n_exempt == EGRESS_EXEMPTIONS_MAX)
                return why_set(why, whylen, -E2BIG, "more than %d opened ranges",
                               EGRESS_EXEMPTIONS_MAX);
        c->exempt[c->n_exempt++] = r;
        return 0;
}

int egress_ceiling_add_host_address(egress_ceiling *c, const struct sockaddr *sa, socklen_t len) {
        egress_addr a;
        int k;

        if (!c)
                return -EINVAL;
        if ((k = egress_addr_from_sockaddr(sa, len, &a)) < 0)
                return k;
        for (size_t i = 0; i < c->n_host; i++)
                if (addr_equal(&c->host[i], &a))
                        return 0;
        if (c->n_host == EGRESS_HOST_ADDRESSES_MAX)
                return -E2BIG;
        c->host[c->n_host++] = a;
        return 0;
}

/* One form of the destination address against the host's addresses and the
 * reserved ranges. Sets the decision and returns true when it is refused. */
static bool address_refused(const egress_ceiling *c, const egress_addr *a, egress_decision *d) {
        for (size_t i = 0; i < c->n_host; i++)
                if (addr_equal(&c->host[i], a)) {
                        d->reason = EGRESS_REASON_HOST_ADDRESS;
                        d->index = (int) i;
                        (void) egress_addr_format(a, d->rule, sizeof d->rule);
                        return true;
                }
        const reserved_range *r = reserved_find(a);
        if (!r)
                return false;
        for (size_t i = 0; i < c->n_exempt; i++)
                if (exempt_within(&c->exempt[i], r) &&
                    addr_in(a, &c->exempt[i].addr, c->exempt[i].prefix))
                        return false;
        char t[64];
        (void) egress_addr_format(&r->net, t, sizeof t);
        d->reason = EGRESS_REASON_RESERVED_ADDRESS;
        d->index = (int) (r - reserved);
        d->detail = r->detail;
        if (r->prefix == addr_bits(&r->net))
                snprintf(d->rule, sizeof d->rule, "%s", t);
        else
                snprintf(d->rule, sizeof d->rule, "%s/%u", t, r->prefix);
        return true;
}

/* ----------------------------------------------------------------- policy */

struct egress_policy {
        rule_list allow, deny;
        bool allow_wins;         /* E2B: allowOut entries beat denyOut entries */
        egress_verdict fallback; /* when no rule matches: deny, or E2B's internet access */
        egress_ceiling *ceiling;
};

int egress_policy_new(egress_policy **ret) {
        if (!ret)
                return -EINVAL;
        egress_policy *p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        p->fallback = EGRESS_DENY;
        *ret = p;
        return 0;
}

egress_policy *egress_policy_free(egress_policy *p) {
        if (!p)
                return NULL;
        free(p->allow.v);
        free(p->deny.v);
        egress_ceiling_unref(p->ceiling);
        free(p);
        return NULL;
}

void egress_policy_freep(egress_policy **p) {
        if (p)
                *p = egress_policy_free(*p);
}

int egress_policy_add_allow(egress_policy *p, const char *rule, char *why, size_t whylen) {
        if (!p)
                return -EINVAL;
        return lists_add(&p->allow, &p->deny, false, rule, why, whylen);
}

int egress_policy_add_deny(egress_policy *p, const char *rule, char *why, size_t whylen) {
        if (!p)
                return -EINVAL;
        return lists_add(&p->allow, &p->deny, true, rule, why, whylen);
}

void egress_policy_set_ceiling(egress_policy *p, egress_ceiling *c) {
        if (!p)
                return;
        egress_ceiling *old = p->ceiling;
        p->ceiling = egress_ceiling_ref(c);
        egress_ceiling_unref(old);
}

static bool is_port_item(const char *s, size_t n) {
        size_t dashes = 0;
        if (n == 0 || !is_digit(s[0]) || !is_digit(s[n - 1]))
                return false;
        for (size_t i = 0; i < n; i++) {
                if (s[i] == '-')
                        dashes++;
                else if (!is_digit(s[i]))
                        return false;
        }
        return dashes <= 1;
}

typedef struct list_item {
        bool deny;
        char text[EGRESS_RULE_INPUT_MAX + 1];
        egress_rule rule;
} list_item;

int egress_policy_add_rules(egress_policy *p, const char *list, char *why, size_t whylen) {
        _cleanup_free_ list_item *items = NULL;
        size_t n_items = 0, cap = 0, i = 0, n;

        if (!p || !list)
                return -EINVAL;
        n = strnlen(list, EGRESS_LIST_INPUT_MAX + 1);
        if (n == 0)
                return why_set(why, whylen, -EINVAL, "empty rule list");
        if (n > EGRESS_LIST_INPUT_MAX)
                return why_set(why, whylen, -E2BIG, "rule list longer than %d bytes",
                               EGRESS_LIST_INPUT_MAX);
        while (i <= n) {
                size_t start = i;
                while (i < n && list[i] != ',')
                        i++;
                const char *tok = list + start;
                size_t tn = i - start;
                i++;
                if (tn == 0)
                        return why_set(why, whylen, -EINVAL,
                                       "empty item in rule list (two ',' in a row?)");
                if (n_items > 0 && items[n_items - 1].rule.n_ports > 0 && is_port_item(tok, tn)) {
                        /* "a.test:80,443": 443 continues a.test's ports. */
                        list_item *last = &items[n_items - 1];
                        size_t ln = strlen(last->text);
                        if (ln + 1 + tn > EGRESS_RULE_INPUT_MAX)
                                return why_set(why, whylen, -E2BIG,
                                               "a rule in the list is longer than %d bytes",
                                               EGRESS_RULE_INPUT_MAX);
                        last->text[ln] = ',';
                        memcpy(last->text + ln + 1, tok, tn);
                        last->text[ln + 1 + tn] = 0;
                        int k = egress_rule_parse(last->text, &last->rule, why, whylen);
                        if (k < 0)
                                return k;
                        continue;
                }
                if (n_items == EGRESS_RULES_MAX ||
                    p->allow.n + p->deny.n + n_items >= EGRESS_RULES_MAX)
                        return why_set(why, whylen, -E2BIG, "more than %d rules", EGRESS_RULES_MAX);
                if (n_items == cap) {
                        size_t ncap = cap ? cap * 2 : 4;
                        list_item *v = realloc(items, ncap * sizeof *v);
                        if (!v)
                                return why_set(why, whylen, -ENOMEM, "out of memory");
                        items = v;
                        cap = ncap;
                }
                list_item *it = &items[n_items];
                it->deny = tok[0] == '!';
                if (it->deny) {
                        tok++;
                        tn--;
                }
                if (tn > EGRESS_RULE_INPUT_MAX) {
                        char q[QUOTE_MAX];
                        return why_set(why, whylen, -E2BIG, "\"%s\": rule longer than %d bytes",
                                       quote(tok, tn, q, sizeof q), EGRESS_RULE_INPUT_MAX);
                }
                memcpy(it->text, tok, tn);
                it->text[tn] = 0;
                int k = egress_rule_parse(it->text, &it->rule, why, whylen);
                if (k < 0)
                        return k;
                n_items++;
        }
        /* Room for all of them first, so that the policy changes all or not at all. */
        size_t n_allow = 0, n_deny = 0;
        for (size_t j = 0; j < n_items; j++)
                *(items[j].deny ? &n_deny : &n_allow) += 1;
        rule_list *lists[2] = { &p->allow, &p->deny };
        size_t want[2] = { n_allow, n_deny };
        for (int l = 0; l < 2; l++)
                if (lists[l]->n + want[l] > lists[l]->cap) {
                        size_t ncap = lists[l]->n + want[l];
                        egress_rule *v = realloc(lists[l]->v, ncap * sizeof *v);
                        if (!v)
                                return why_set(why, whylen, -ENOMEM, "out of memory");
                        lists[l]->v = v;
                        lists[l]->cap = ncap;
                }
        for (size_t j = 0; j < n_items; j++)
                (void) rule_list_push(items[j].deny ? &p->deny : &p->allow, &items[j].rule);
        return 0;
}

int egress_policy_from_e2b(int allow_internet_access, const char *const *allow_out, size_t n_allow,
                           const char *const *deny_out, size_t n_deny, egress_policy **ret,
                           char *why, size_t whylen) {
        _cleanup_(egress_policy_freep) egress_policy *p = NULL;
        char sub[512];
        int k;

        if (!ret || allow_internet_access < -1 || allow_internet_access > 1 ||
            (n_allow && !allow_out) || (n_deny && !deny_out))
                return why_set(why, whylen, -EINVAL, "invalid arguments");
        if (n_allow > EGRESS_RULES_MAX || n_deny > EGRESS_RULES_MAX ||
            n_allow + n_deny >= EGRESS_RULES_MAX)
                return why_set(why, whylen, -E2BIG, "more than %d allowOut and denyOut entries",
                               EGRESS_RULES_MAX - 1);
        if ((k = egress_policy_new(&p)) < 0)
                return why_set(why, whylen, k, "out of memory");
        /* E2B: "Allowed entries always take precedence over denied entries",
         * and what neither names follows allow_internet_access. */
        p->allow_wins = true;
        p->fallback = allow_internet_access == 0 ? EGRESS_DENY : EGRESS_ALLOW;
        for (size_t i = 0; i < n_allow; i++)
                if ((k = egress_policy_add_allow(p, allow_out[i], sub, sizeof sub)) < 0)
                        return why_set(why, whylen, k, "allowOut[%zu]: %s", i, sub);
        bool deny_all = false;
        for (size_t i = 0; i < n_deny; i++) {
                if ((k = egress_policy_add_deny(p, deny_out[i], sub, sizeof sub)) < 0)
                        return why_set(why, whylen, k, "denyOut[%zu]: %s", i, sub);
                const egress_rule *r = &p->deny.v[p->deny.n - 1];
                if (r->kind == EGRESS_RULE_ALL && r->n_ports == 0)
                        deny_all = true;
        }
        /* E2B: a false allow_internet_access "is equivalent to setting
         * denyOut to ['0.0.0.0/0']". */
        if (allow_internet_access == 0 && !deny_all)
                if ((k = egress_policy_add_deny(p, "0.0.0.0/0", sub, sizeof sub)) < 0)
                        return why_set(why, whylen, k, "%s", sub);
        *ret = TAKE_PTR(p);
        return 0;
}

char **egress_strv_free(char **v) {
        if (!v)
                return NULL;
        for (char **s = v; *s; s++)
                free(*s);
        free(v);
        return NULL;
}

static void strv_freep(char ***v) {
        *v = egress_strv_free(*v);
}

static int rule_list_strv(const rule_list *l, char ***ret) {
        __attribute__((cleanup(strv_freep))) char **v = calloc(l->n + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        for (size_t i = 0; i < l->n; i++) {
                char t[EGRESS_RULE_TEXT_MAX];
                int k = rule_format(&l->v[i], true, t, sizeof t);
                if (k < 0)
                        return k;
                if (!(v[i] = strdup(t)))
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(v);
        return 0;
}

int egress_policy_to_strings(const egress_policy *p, char ***ret_allow_out, char ***ret_deny_out) {
        __attribute__((cleanup(strv_freep))) char **a = NULL;
        __attribute__((cleanup(strv_freep))) char **d = NULL;
        int k;

        if (!p || !ret_allow_out || !ret_deny_out)
                return -EINVAL;
        if ((k = rule_list_strv(&p->allow, &a)) < 0 || (k = rule_list_strv(&p->deny, &d)) < 0)
                return k;
        *ret_allow_out = TAKE_PTR(a);
        *ret_deny_out = TAKE_PTR(d);
        return 0;
}

/* -------------------------------------------------------------- decisions */

const char *egress_reason_to_string(egress_reason r) {
        switch (r) {
        case EGRESS_REASON_ALLOW_RULE:
                return "allowed by rule";
        case EGRESS_REASON_DEFAULT_ALLOW:
                return "allowed: internet access is on and no rule matches";
        case EGRESS_REASON_DENY_RULE:
                return "denied by rule";
        case EGRESS_REASON_NO_ALLOW_RULE:
                return "no allow rule matches";
        case EGRESS_REASON_CEILING_DENY_RULE:
                return "denied by the operator's ceiling";
        case EGRESS_REASON_CEILING_NO_ALLOW:
                return "outside the operator's ceiling";
        case EGRESS_REASON_NO_CEILING:
                return "no operator ceiling is set";
        case EGRESS_REASON_RESERVED_ADDRESS:
                return "reserved address range";
        case EGRESS_REASON_HOST_ADDRESS:
                return "the host's own address";
        case EGRESS_REASON_BAD_PORT:
                return "port 0 is not a destination";
        }
        return "unknown";
}

static void decision_rule(egress_decision *d, const rule_list *l, int index) {
        d->index = index;
        if (index >= 0)
                (void) egress_rule_format(&l->v[index], d->rule, sizeof d->rule);
}

static void decide_target(const egress_policy *p, const target *t, uint16_t port,
                          egress_decision *ret) {
        egress_decision d = { .verdict = EGRESS_DENY, .index = -1 };
        const egress_ceiling *c = p->ceiling;

        if (port == 0) {
                d.reason = EGRESS_REASON_BAD_PORT;
                goto done;
        }
        if (!c) {
                d.reason = EGRESS_REASON_NO_CEILING;
                goto done;
        }
        /* Reserved ranges and the host's addresses, in every form: an IPv6
         * address and the IPv4 one it carries must both pass. */
        if (t->have_addr &&
            (address_refused(c, &t->addr, &d) || (t->has_v4 && address_refused(c, &t->v4, &d))))
                goto done;

        evaluation e = evaluate(&p->allow, &p->deny, p->allow_wins, p->fallback, t, port);
        if (e.verdict == EGRESS_DENY) {
                d.reason = e.by == BY_DENY ? EGRESS_REASON_DENY_RULE : EGRESS_REASON_NO_ALLOW_RULE;
                decision_rule(&d, &p->deny, e.index);
                goto done;
        }
        evaluation ce = evaluate(&c->allow, &c->deny, false, EGRESS_DENY, t, port);
        if (ce.verdict == EGRESS_DENY) {
                d.reason = ce.by == BY_DENY ? EGRESS_REASON_CEILING_DENY_RULE
                                            : EGRESS_REASON_CEILING_NO_ALLOW;
                decision_rule(&d, &c->deny, ce.index);
                goto done;
        }
        d.verdict = EGRESS_ALLOW;
        d.reason = e.by == BY_ALLOW ? EGRESS_REASON_ALLOW_RULE : EGRESS_REASON_DEFAULT_ALLOW;
        d.provisional = !t->have_addr;
        decision_rule(&d, &p->allow, e.index);
done:
        memcpy(ret, &d, sizeof d);
}

int egress_decide(const egress_policy *p, const egress_host *h, uint16_t port, egress_decision *ret) {
        target t = { 0 };

        if (!p || !h || !ret)
                return -EINVAL;
        if (h->kind == EGRESS_HOST_NAME)
                t.name = h->text;
        else if (h->kind == EGRESS_HOST_IPV4 || h->kind == EGRESS_HOST_IPV6)
                target_set_addr(&t, &h->addr);
        else
                return -EINVAL;
        decide_target(p, &t, port, ret);
        return 0;
}

int egress_decide_address(const egress_policy *p, const egress_host *h,
                          const struct sockaddr *resolved, socklen_t len, uint16_t port,
                          egress_decision *ret) {
        target t = { 0 };
        egress_addr a;
        int k;

        if (!p || !h || !ret)
                return -EINVAL;
        if ((k = egress_addr_from_sockaddr(resolved, len, &a)) < 0)
                return k;
        if (h->kind == EGRESS_HOST_NAME) {
                /* First what egress_decide() said, so that this never allows
                 * more: address rules do not stand in for a name rule. */
                egress_decision first;
                t.name = h->text;
                decide_target(p, &t, port, &first);
                if (first.verdict == EGRESS_DENY) {
                        memcpy(ret, &first, sizeof first);
                        return 0;
                }
        } else if (h->kind == EGRESS_HOST_IPV4 || h->kind == EGRESS_HOST_IPV6) {
                if (!addr_equal(&a, &h->addr))
                        return -EINVAL;
        } else
                return -EINVAL;
        target_set_addr(&t, &a);
        decide_target(p, &t, port, ret);
        return 0;
}
