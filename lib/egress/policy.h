/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The egress policy core (docs/design.md §5.1, issue #4): what the proxy asks before
 * it resolves a name and before it dials an address. Pure: no I/O, no DNS, no
 * clock, no logging; every input is bounded. docs/egress.md is the reference
 * for the grammar and the semantics; this header is the contract.
 *
 * The flow the proxy follows:
 *
 *   egress_host h;                    // from CONNECT / absolute-form / SOCKS5
 *   if (egress_host_parse_n(buf, len, &h) < 0) -> refuse
 *   egress_decide(policy, &h, port, &d)
 *   if (d.verdict == EGRESS_DENY) -> refuse, record d
 *   if (h.kind == EGRESS_HOST_NAME)  // d.provisional: resolve h.text, no search
 *           for each resolved address a:   // domains, no /etc/hosts
 *                   egress_decide_address(policy, &h, a, alen, port, &d)
 *                   dial the first a that is allowed, exactly a
 *   else
 *           dial egress_host_sockaddr(&h, port)
 *
 * Any negative return from a decision function means "deny".
 *
 * Conventions as elsewhere in lib/: >= 0 on success, -errno on failure;
 * ret_* are written only on success; destructors accept NULL. A policy or
 * ceiling is not locked: change it only from the thread that decides with it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define EGRESS_NAME_MAX 253       /* a DNS name without its trailing dot */
#define EGRESS_HOST_INPUT_MAX 255 /* longest host text egress_host_parse reads */
#define EGRESS_RULE_INPUT_MAX 511 /* longest rule text egress_rule_parse reads */
#define EGRESS_RULE_TEXT_MAX 512  /* buffer that holds any canonical rule text */
#define EGRESS_RULE_PORTS_MAX 16  /* port items in one rule */
#define EGRESS_RULES_MAX 1024     /* allow + deny rules in one policy or ceiling */
#define EGRESS_EXEMPTIONS_MAX 64  /* egress_ceiling_allow_private() ranges */
#define EGRESS_HOST_ADDRESSES_MAX 256
#define EGRESS_LIST_INPUT_MAX 65536 /* egress_policy_add_rules() text */

/* ------------------------------------------------------------- addresses */

/* An IP address in network byte order. IPv4 uses bytes[0..3], the rest is 0,
 * so two addresses compare equal with memcmp. */
typedef struct egress_addr {
        int family; /* AF_INET or AF_INET6 */
        uint8_t bytes[16];
} egress_addr;

/* From a sockaddr_in / sockaddr_in6 (the port is ignored). An IPv4-mapped
 * IPv6 address (::ffff:a.b.c.d) becomes the IPv4 address it is: a socket
 * dialling it reaches exactly that. -EAFNOSUPPORT for other families,
 * -EINVAL for a short length or an IPv6 address with a scope id. */
int egress_addr_from_sockaddr(const struct sockaddr *sa, socklen_t len, egress_addr *ret);

/* Canonical text: dotted quad, or RFC 5952 IPv6 (lowercase, longest run of
 * two or more zero groups shortened, no brackets, no dotted tail). buf should
 * hold 46 bytes; returns the length or -ENOBUFS. */
int egress_addr_format(const egress_addr *a, char *buf, size_t len);

/* ----------------------------------------------------------------- hosts */

typedef enum egress_host_kind {
        EGRESS_HOST_NAME = 1,
        EGRESS_HOST_IPV4,
        EGRESS_HOST_IPV6,
} egress_host_kind;

/* A destination host as the sandbox wrote it, parsed once. The same value is
 * checked and dialled: the proxy resolves text (names) or dials addr
 * (literals), never the bytes it was given. */
typedef struct egress_host {
        egress_host_kind kind;
        /* Canonical text: a lowercase name without trailing dot, a dotted
         * quad, or RFC 5952 IPv6 without brackets. Parses back to this value. */
        char text[EGRESS_NAME_MAX + 1];
        /* Address kinds: the address to dial. */
        egress_addr addr;
        /* EGRESS_HOST_IPV6 only: addr carries an IPv4 address (IPv4-compatible
         * ::/96, SIIT ::ffff:0:0/96, NAT64 64:ff9b::/96, 6to4 2002::/16). That
         * IPv4 address is the one allow rules and built-in ranges look at. */
        bool has_embedded_v4;
        egress_addr embedded_v4;
} egress_host;

/* Parse a host: a DNS name (≥ 2 labels of [a-z0-9-], 1–63 bytes, no leading
 * or trailing '-', ≤ 253 bytes; case folded, one trailing dot dropped), an
 * IPv4 address in any inet_aton spelling (2130706433, 0x7f000001,
 * 0177.0.0.1, 127.1, ...), or an IPv6 address with or without brackets (no
 * zone). A name whose last label is a number must be a valid IPv4 address
 * (WHATWG URL rule), so "1.2.3.4.5" is refused, never resolved. -EINVAL for
 * anything else, including every byte outside [A-Za-z0-9.:-] and '[' ']'
 * around an IPv6 address (NUL, CR, LF, space, '@', '#', '%', '/', '\\', '_',
 * bytes >= 0x80: IDNA must come as punycode "xn--"). */
int egress_host_parse_n(const char *in, size_t len, egress_host *ret);
int egress_host_parse(const char *in, egress_host *ret); /* NUL-terminated */

bool egress_host_equal(const egress_host *a, const egress_host *b);

/* Address kinds: the sockaddr to dial (sockaddr_in or sockaddr_in6).
 * -EINVAL for a name. */
int egress_host_sockaddr(const egress_host *h, uint16_t port, struct sockaddr_storage *ret,
                         socklen_t *ret_len);

/* ----------------------------------------------------------------- rules */

typedef enum egress_rule_kind {
        EGRESS_RULE_ALL = 1, /* "*" or "0.0.0.0/0": every destination */
        EGRESS_RULE_NAME,    /* "example.com": that name only */
        EGRESS_RULE_SUFFIX,  /* "*.example.com": names below it, at a label boundary */
        EGRESS_RULE_CIDR,    /* "10.0.0.0/8", "10.0.0.1", "2001:db8::/32", "::1" */
} egress_rule_kind;

typedef struct egress_port_range {
        uint16_t first, last; /* 1 <= first <= last */
} egress_port_range;

typedef struct egress_rule {
        egress_rule_kind kind;
        char name[EGRESS_NAME_MAX + 1]; /* NAME: the name; SUFFIX: the part after "*." */
        egress_addr addr;               /* CIDR: the network, host bits zero */
        unsigned prefix;                /* CIDR: 0..32 or 0..128 */
        unsigned n_ports;               /* 0: every port */
        egress_port_range ports[EGRESS_RULE_PORTS_MAX];
} egress_rule;

/* Parse one rule (grammar in docs/egress.md). On failure -EINVAL (or
 * -E2BIG for too many ports or too long a text) and, when why is not NULL, a
 * one-line English reason that quotes the rule. */
int egress_rule_parse(const char *text, egress_rule *ret, char *why, size_t whylen);

/* Canonical text ("*", "*.example.com:80,443", "10.0.0.0/8",
 * "[2001:db8::/32]:443"); parses back to the same rule. Returns the length or
 * -ENOBUFS; EGRESS_RULE_TEXT_MAX always suffices. */
int egress_rule_format(const egress_rule *r, char *buf, size_t len);

bool egress_rule_equal(const egress_rule *a, const egress_rule *b);

/* Whether r (with allow semantics: an address rule looks at the embedded
 * IPv4 address when there is one) matches host h on port. Names match name
 * and suffix rules only; addresses match address rules only. */
bool egress_rule_matches_host(const egress_rule *r, const egress_host *h, uint16_t port);

/* --------------------------------------------------------------- ceiling */

/* The operator's half: a ceiling of allow and deny rules that no client policy
 * can exceed, the reserved ranges the operator opens, and the host's own
 * addresses. Reference counted, because every sandbox policy holds one. A
 * ceiling with no allow rule allows nothing: a daemon without configured
 * limits adds "*". */
typedef struct egress_ceiling egress_ceiling;

int egress_ceiling_new(egress_ceiling **ret);
egress_ceiling *egress_ceiling_ref(egress_ceiling *c);
egress_ceiling *egress_ceiling_unref(egress_ceiling *c); /* returns NULL */
void egress_ceiling_unrefp(egress_ceiling **c);

int egress_ceiling_add_allow(egress_ceiling *c, const char *rule, char *why, size_t whylen);
int egress_ceiling_add_deny(egress_ceiling *c, const char *rule, char *why, size_t whylen);

/* Open part of a built-in reserved range (private, CGNAT, link-local, ...):
 * an address or CIDR without ports that lies inside one of them. It lifts
 * the refusal only for the most specific reserved range it lies within, so
 * "169.254.0.0/16" opens link-local but not 169.254.169.254, which needs its
 * own "169.254.169.254". The client policy and the ceiling must still allow
 * the destination. -EINVAL (with why) for anything else. */
int egress_ceiling_allow_private(egress_ceiling *c, const char *cidr, char *why, size_t whylen);

/* One of the host's own addresses: always refused, whatever else allows it. */
int egress_ceiling_add_host_address(egress_ceiling *c, const struct sockaddr *sa, socklen_t len);

/* ---------------------------------------------------------------- policy */

typedef struct egress_policy egress_policy;

/* An empty native policy: deny rules win over allow rules, and what no rule
 * allows is denied. */
int egress_policy_new(egress_policy **ret);
egress_policy *egress_policy_free(egress_policy *p); /* returns NULL */
void egress_policy_freep(egress_policy **p);

/* -EINVAL (bad rule, with why), -E2BIG (over EGRESS_RULES_MAX), -ENOMEM. */
int egress_policy_add_allow(egress_policy *p, const char *rule, char *why, size_t whylen);
int egress_policy_add_deny(egress_policy *p, const char *rule, char *why, size_t whylen);

/* A list as `hutch run --net` takes it: rules separated by ',', a leading
 * '!' makes a deny rule, and an item that is only a port or port range
 * continues the port list of the rule before it ("a.test:80,443,!b.test").
 * All or nothing: on error the policy is unchanged. */
int egress_policy_add_rules(egress_policy *p, const char *list, char *why, size_t whylen);

/* Attach the operator's ceiling (takes a reference, drops the previous one).
 * A policy without a ceiling denies everything. */
void egress_policy_set_ceiling(egress_policy *p, egress_ceiling *c);

/* E2B's create/PUT fields. allow_internet_access: -1 absent, 0 false, 1 true.
 * E2B semantics: allowOut entries win over denyOut entries; what neither
 * matches is allowed when internet access is on (absent counts as on) and
 * denied when it is off, and off also adds denyOut "0.0.0.0/0" as E2B
 * documents. Built-in ranges, host addresses and the ceiling still apply. An
 * entry error names the list and index in why. The result has no ceiling. */
int egress_policy_from_e2b(int allow_internet_access, const char *const *allow_out, size_t n_allow,
                           const char *const *deny_out, size_t n_deny, egress_policy **ret,
                           char *why, size_t whylen);

/* The rules back as canonical strings in E2B's network shape: two
 * NULL-terminated arrays (every rule "*" is written "0.0.0.0/0", as E2B's
 * ALL_TRAFFIC). Free each with egress_strv_free(). */
int egress_policy_to_strings(const egress_policy *p, char ***ret_allow_out, char ***ret_deny_out);
char **egress_strv_free(char **v); /* returns NULL */

/* ------------------------------------------------------------- decisions */

typedef enum egress_verdict {
        EGRESS_DENY = 0,
        EGRESS_ALLOW = 1,
} egress_verdict;

typedef enum egress_reason {
        EGRESS_REASON_ALLOW_RULE = 1,    /* allowed by policy allow rule `index` */
        EGRESS_REASON_DEFAULT_ALLOW,     /* allowed: E2B internet access on, no rule matched */
        EGRESS_REASON_DENY_RULE,         /* policy deny rule `index` */
        EGRESS_REASON_NO_ALLOW_RULE,     /* default deny: no allow rule matches */
        EGRESS_REASON_CEILING_DENY_RULE, /* operator ceiling deny rule `index` */
        EGRESS_REASON_CEILING_NO_ALLOW,  /* no operator ceiling allow rule matches */
        EGRESS_REASON_NO_CEILING,        /* the policy has no ceiling attached */
        EGRESS_REASON_RESERVED_ADDRESS,  /* a built-in reserved range: `rule`, `detail` */
        EGRESS_REASON_HOST_ADDRESS,      /* one of the host's own addresses */
        EGRESS_REASON_BAD_PORT,          /* port 0 */
} egress_reason;

typedef struct egress_decision {
        egress_verdict verdict;
        egress_reason reason;
        /* ALLOW: true when a name was allowed before resolution, so every
         * resolved address still needs egress_decide_address(). */
        bool provisional;
        int index;                       /* rule index in its list, -1 if none */
        char rule[EGRESS_RULE_TEXT_MAX]; /* canonical text of that rule or range, or "" */
        const char *detail;              /* static: the reserved range's name, or NULL */
} egress_decision;

/* Static English text: "no allow rule matches", ... */
const char *egress_reason_to_string(egress_reason r);

/* Before resolution. For an address literal the answer is final. For a name
 * an ALLOW is provisional: only then may the name be resolved, and each
 * address must pass egress_decide_address(). Names are allowed only by name
 * rules, "*" or an E2B default: address rules never cause a lookup. */
int egress_decide(const egress_policy *p, const egress_host *h, uint16_t port, egress_decision *ret);

/* After resolution: the final answer for dialling `resolved` (sockaddr_in or
 * sockaddr_in6; its port is ignored) to reach h on port. Never allows what
 * egress_decide() denies for h. With an address literal h, resolved must be
 * h's own address (-EINVAL otherwise). */
int egress_decide_address(const egress_policy *p, const egress_host *h,
                          const struct sockaddr *resolved, socklen_t len, uint16_t port,
                          egress_decision *ret);
