/* SPDX-License-Identifier: Apache-2.0 */
/* The stub resolver's messages (lib/egress/dns.c) on bytes a nameserver, or
 * whoever spoofs one, sends back, and on resolv.conf texts. The first byte
 * chooses: bits 0-1 the mode (0: answer to an A query, 1: to an AAAA query,
 * 2: resolv.conf, 3: the rest is a name to build a query for); for answers,
 * bits 2-3 the name asked and bit 4 an id other than the message's own.
 * Invariants, not just "no crash": only documented return codes; the result
 * untouched on failure; on success a bounded, deduplicated address list of
 * the family asked, and every strict prefix of the message refused. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/dns.h"
#include "egress/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = { "example.com", "www.example.com", "nope.example.com", "h0.test" };

static bool code_documented(int r) {
        return r == 0 || r == -EBADMSG || r == -ENOMSG || r == -EMSGSIZE || r == -ENXIO ||
                r == -EIO || r == -ELOOP || r == -ENODATA;
}

static void addr_check(const egress_addr *a, int family) {
        static const uint8_t zero[12];
        if (a->family != family)
                abort();
        if (family == AF_INET && memcmp(a->bytes + 4, zero, 12) != 0)
                abort();
}

static void fuzz_response(const uint8_t *d, size_t n, uint16_t qtype, const char *name,
                          bool other_id) {
        static dns_result res, blank;
        uint16_t id = n >= 2 ? (uint16_t) (d[0] << 8 | d[1]) : 0;
        int r;

        if (other_id)
                id ^= 1;
        memset(&blank, 0x5a, sizeof blank);
        res = blank;
        r = dns_parse_response(d, n, id, name, qtype, &res);
        if (!code_documented(r))
                abort();
        if (r < 0) {
                if (memcmp(&res, &blank, sizeof res) != 0)
                        abort();
                /* a message of the wrong id is never read past its header */
                if (other_id && r != -ENOMSG && r != -EBADMSG)
                        abort();
                if (other_id && r == -EBADMSG && n >= 12 && n <= DNS_TCP_MSG_MAX)
                        abort();
                return;
        }
        if (other_id || n < 12 || n > DNS_TCP_MSG_MAX)
                abort();
        if (res.n_addrs < 1 || res.n_addrs > DNS_ADDRS_MAX || res.ttl > INT32_MAX)
                abort();
        for (size_t i = 0; i < res.n_addrs; i++) {
                addr_check(&res.addrs[i], qtype == DNS_TYPE_A ? AF_INET : AF_INET6);
                for (size_t j = 0; j < i; j++)
                        if (memcmp(&res.addrs[i], &res.addrs[j], sizeof res.addrs[i]) == 0)
                                abort();
        }

        /* the same bytes again: the same answer */
        dns_result again;
        if (dns_parse_response(d, n, id, name, qtype, &again) != 0 ||
            memcmp(&again, &res, sizeof res) != 0)
                abort();
        /* an answer is for one question only */
        if (dns_parse_response(d, n, id, name, qtype == DNS_TYPE_A ? DNS_TYPE_AAAA : DNS_TYPE_A,
                               &again) != -ENOMSG)
                abort();
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                if (names[i] != name &&
                    dns_parse_response(d, n, id, names[i], qtype, &again) != -ENOMSG)
                        abort();
        /* a whole message was read: any strict prefix is short */
        static const size_t cuts[] = { 1, 2, 5, 11 };
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
                if (cuts[i] <= n &&
                    dns_parse_response(d, n - cuts[i], id, name, qtype, &again) != -EBADMSG)
                        abort();
        if (dns_parse_response(d, n / 2, id, name, qtype, &again) != -EBADMSG)
                abort();
}

static void fuzz_resolv_conf(const uint8_t *d, size_t n) {
        egress_addr all[8], few[8], blank;
        int k_all, k_few;

        memset(&blank, 0x5a, sizeof blank);
        for (size_t i = 0; i < 8; i++)
                all[i] = few[i] = blank;
        k_all = dns_parse_resolv_conf((const char *) d, n, all, 8);
        k_few = dns_parse_resolv_conf((const char *) d, n, few, 3);
        if (k_all < 0 || k_all > 8 || k_few < 0 || k_few > 3)
                abort();
        /* a smaller max gives the first entries of a larger one */
        if (k_few != (k_all < 3 ? k_all : 3) || memcmp(few, all, (size_t) k_few * sizeof *few) != 0)
                abort();
        for (int i = 0; i < 8; i++) {
                if (i >= k_all) {
                        if (memcmp(&all[i], &blank, sizeof blank) != 0)
                                abort();
                        continue;
                }
                addr_check(&all[i], all[i].family == AF_INET ? AF_INET : AF_INET6);
                /* IPv4-mapped addresses come back as AF_INET */
                static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
                if (all[i].family == AF_INET6 && memcmp(all[i].bytes, mapped, 12) == 0)
                        abort();
        }
        if (dns_parse_resolv_conf((const char *) d, n, NULL, 0) != 0)
                abort();
}

static void fuzz_query(const uint8_t *d, size_t n) {
        char name[300];
        uint8_t buf[DNS_QUERY_MAX];
        dns_result res;
        int k;

        if (n >= sizeof name)
                return;
        memcpy(name, d, n);
        name[n] = 0;
        k = dns_build_query(name, 0x4242, DNS_TYPE_AAAA, buf, sizeof buf);
        if (k == -EINVAL)
                return;
        size_t len = strlen(name);
        if (k != (int) (12 + len + 2 + 4 + 11) || len > 253)
                abort();
        if (dns_build_query(name, 0x4242, DNS_TYPE_AAAA, buf, (size_t) k - 1) != -ENOBUFS)
                abort();
        /* the query is not its own answer; with QR set it is an empty one */
        if (dns_parse_response(buf, (size_t) k, 0x4242, name, DNS_TYPE_AAAA, &res) != -ENOMSG)
                abort();
        buf[2] |= 0x80;
        if (dns_parse_response(buf, (size_t) k, 0x4242, name, DNS_TYPE_AAAA, &res) != -ENODATA)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        uint8_t mode = data[0];
        const uint8_t *d = data + 1;
        size_t n = size - 1;

        switch (mode & 3) {
        case 0:
        case 1:
                fuzz_response(d, n, (mode & 3) == 0 ? DNS_TYPE_A : DNS_TYPE_AAAA,
                              names[(mode >> 2) & 3], mode & 0x10);
                break;
        case 2:
                fuzz_resolv_conf(d, n);
                break;
        default:
                fuzz_query(d, n);
                break;
        }
        return 0;
}
