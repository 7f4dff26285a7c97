/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The egress proxy's stub resolver, as messages without I/O (RFC 1035): the
 * query the proxy sends for an allowed name, the parse of the answer it gets
 * back over UDP, and the nameservers of a resolv.conf text. The proxy owns the
 * socket, the random id and source port, the timeout and the retries; it
 * resolves exactly the name egress_host_parse() produced, with no search list
 * and no /etc/hosts (docs/egress.md).
 *
 * The flow the proxy follows:
 *
 *   n = dns_build_query(h.text, id, DNS_TYPE_A, q, sizeof q);   // id random
 *   send q to a nameserver, then for each datagram r that comes back:
 *           k = dns_parse_response(r, rlen, id, h.text, DNS_TYPE_A, &res)
 *           k == -ENOMSG: not the answer to this query; keep waiting
 *           k == -EMSGSIZE: truncated (TC): the proxy asks that nameserver
 *                           again over TCP (RFC 7766: two length bytes, then
 *                           the same query) and parses that answer the same way
 *           otherwise: the answer (k == 0: res.addrs for egress_decide_address)
 *
 * EDNS0 (RFC 6891): every query carries an OPT record advertising
 * DNS_EDNS_UDP_SIZE (1232 bytes, the DNS Flag Day 2020 value: no IP
 * fragmentation on a 1280-byte IPv6 path), so answers with many addresses fit
 * a datagram without TC. A server that does not speak EDNS answers FORMERR,
 * which is -EIO here.
 *
 * Conventions as elsewhere in lib/: >= 0 on success, -errno on failure;
 * ret_* are written only on success. Every input is bounded; nothing is
 * allocated.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "egress/policy.h"

#define DNS_EDNS_UDP_SIZE 1232 /* advertised in the OPT record of every query */
/* The receive buffer and the largest response dns_parse_response() reads:
 * what the query advertised as the largest payload it takes (RFC 6891
 * §6.2.3); a server truncates (TC) rather than send more. A larger one is
 * refused, which also bounds the work one answer costs. A datagram cut by
 * recv() (MSG_TRUNC) is not an answer. */
#define DNS_MSG_MAX DNS_EDNS_UDP_SIZE
/* Over TCP (after a truncated UDP answer) a message may be longer: the
 * largest one the proxy reads there and dns_parse_response() takes. */
#define DNS_TCP_MSG_MAX 16384
#define DNS_QUERY_MAX 282    /* header 12 + name 255 + type/class 4 + OPT 11 */
#define DNS_ADDRS_MAX 32     /* addresses kept from one answer */
#define DNS_CNAME_HOPS_MAX 8 /* CNAME records followed from the name asked */

enum {
        DNS_TYPE_A = 1,
        DNS_TYPE_CNAME = 5,
        DNS_TYPE_AAAA = 28,
        DNS_TYPE_OPT = 41,
};

enum {
        DNS_CLASS_IN = 1,
};

enum {
        DNS_RCODE_NOERROR = 0,
        DNS_RCODE_FORMERR = 1,
        DNS_RCODE_SERVFAIL = 2,
        DNS_RCODE_NXDOMAIN = 3,
        DNS_RCODE_NOTIMP = 4,
        DNS_RCODE_REFUSED = 5,
};

typedef struct dns_result {
        /* In answer order, without duplicates. A: AF_INET (bytes[0..3], the
         * rest 0); AAAA: AF_INET6 as sent, IPv4-mapped included (the policy
         * looks through it when the proxy decides on the sockaddr). */
        egress_addr addrs[DNS_ADDRS_MAX];
        size_t n_addrs; /* 1..DNS_ADDRS_MAX; further addresses are dropped */
        uint32_t ttl;   /* smallest TTL of the CNAME and address records used */
} dns_result;

/* A standard recursive query (RD=1, one question, class IN, EDNS0 OPT) for
 * name and qtype (DNS_TYPE_A or DNS_TYPE_AAAA). name is canonical, as
 * egress_host_parse() writes it: labels of [a-z0-9-], 1..63 bytes each, no
 * trailing dot, at most 253 bytes. Returns the length (at most DNS_QUERY_MAX,
 * which always suffices), -EINVAL for another name or qtype, -ENOBUFS. */
int dns_build_query(const char *name, uint16_t id, uint16_t qtype, uint8_t *buf, size_t len);

/* Parse msg as the answer to the query dns_build_query(name, id, qtype) sent.
 *
 * -ENOMSG: not an answer to that query, to be ignored (RFC 5452 §9.1: a
 *  stray or forged datagram must not end the wait for the real answer): QR=0,
 *  another id, opcode not QUERY, not exactly one question, or a question other
 *  than name (compared case-insensitively, so 0x20 mixing passes), qtype, IN.
 * -EMSGSIZE: TC=1 (the rest of the message is not read), also a header
 *  with TC=1 and no question, as some servers send a truncated answer.
 * -EBADMSG: malformed: shorter than its counts say, bytes after the last
 *  record, a record out of bounds, a name over 255 bytes, a compression
 *  pointer that is not strictly backwards into the message body (so loops are
 *  impossible), a name through more than 16 pointers, a reserved label
 *  type, an A rdlength other than 4 or AAAA other than 16, CNAME rdata that
 *  is not exactly one name, more than one OPT or an OPT not owned by the
 *  root, two different CNAMEs for one name; also a message over
 *  DNS_TCP_MSG_MAX (the UDP receive buffer holds DNS_MSG_MAX).
 * -ENXIO: RCODE NXDOMAIN. -EIO: any other non-zero RCODE, extended RCODE
 *  from the OPT record included.
 * -ELOOP: the CNAME chain from name is longer than DNS_CNAME_HOPS_MAX (a
 *  loop always is).
 * -ENODATA: NOERROR, but no address of qtype for the end of the chain.
 * -EINVAL: name or qtype that dns_build_query() refuses.
 *
 * Every record is checked, but only the answer section is used: the CNAME
 * chain is followed from name, then the qtype/IN records owned by the end of
 * the chain are taken. Records for any other owner, in any section, are
 * ignored: an answer cannot plant addresses for names nobody asked. */
int dns_parse_response(const uint8_t *msg, size_t len, uint16_t id, const char *name,
                       uint16_t qtype, dns_result *ret);

/* The nameservers of a resolv.conf text (resolv.conf(5)): the first token
 * after "nameserver" on each line, when it is an IPv4 dotted quad or an IPv6
 * address (IPv4-mapped becomes AF_INET; with a %zone it is skipped: there is
 * no interface to say it with). Lines starting with '#' or ';' and the rest
 * of a line from '#' or ';' are comments; other keywords and bad addresses
 * are skipped. Writes ret[0..count-1], at most max entries, in file order,
 * and returns count: 0 if none (glibc would then use 127.0.0.1; the caller
 * decides). */
int dns_parse_resolv_conf(const char *text, size_t len, egress_addr *ret, size_t max);
