/* SPDX-License-Identifier: Apache-2.0 */
/* The egress policy core (lib/egress/policy.c): hosts as a sandbox sends
 * them (CONNECT, absolute-form, SOCKS5), rules and rule lists as a client
 * sends them (hutch run --net, E2B allowOut/denyOut). Invariants, not just
 * "no crash": a parsed host or rule re-parsed from its canonical text is the
 * same value, and a decision after resolution never allows more than the one
 * before it. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egress/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static egress_policy *pol_all, *pol_mixed, *pol_e2b;

static egress_policy *make(const char *list, egress_ceiling *c) {
        egress_policy *p = NULL;
        if (egress_policy_new(&p) < 0 || egress_policy_add_rules(p, list, NULL, 0) < 0)
                abort();
        egress_policy_set_ceiling(p, c);
        return p;
}

static void setup(void) {
        egress_ceiling *c = NULL;
        struct sockaddr_in sin = { .sin_family = AF_INET };

        if (pol_all)
                return;
        if (egress_ceiling_new(&c) < 0 || egress_ceiling_add_allow(c, "*", NULL, 0) < 0 ||
            egress_ceiling_add_deny(c, "*.blocked.test", NULL, 0) < 0 ||
            egress_ceiling_allow_private(c, "10.1.0.0/16", NULL, 0) < 0)
                abort();
        sin.sin_addr.s_addr = htonl(0x5db8d822); /* 93.184.216.34 */
        if (egress_ceiling_add_host_address(c, (struct sockaddr *) &sin, sizeof sin) < 0)
                abort();
        pol_all = make("*", c);
        pol_mixed = make(
                "*.example.test:80,443,8.8.8.0/24,[2606:4700::/32]:443,!bad.example.test,!8.8.8.8",
                c);
        static const char *const allow[] = { "*.example.test", "1.1.1.1" };
        static const char *const deny[] = { "0.0.0.0/0" };
        if (egress_policy_from_e2b(1, allow, 2, deny, 1, &pol_e2b, NULL, 0) < 0)
                abort();
        egress_policy_set_ceiling(pol_e2b, c);
        egress_ceiling_unref(c);
}

static void check_decision(const egress_decision *d) {
        if (d->verdict != EGRESS_ALLOW && d->verdict != EGRESS_DENY)
                abort();
        if (memchr(d->rule, 0, sizeof d->rule) == NULL)
                abort();
        if (d->provisional && d->verdict != EGRESS_ALLOW)
                abort();
}

/* Resolving a name never allows more than egress_decide() did. */
static void check_monotone(const egress_policy *p, const egress_host *h, uint16_t port) {
        static const char *const addrs[] = { "93.184.216.35",    "93.184.216.34", "8.8.8.8",
                                             "10.1.2.3",         "127.0.0.1",     "::ffff:1.1.1.1",
                                             "64:ff9b::808:808", "2606:4700::1" };
        egress_decision before, after;

        if (egress_decide(p, h, port, &before) < 0)
                abort();
        check_decision(&before);
        if (h->kind != EGRESS_HOST_NAME) {
                /* a literal: final, and the same as for its own address */
                struct sockaddr_storage ss;
                socklen_t len;
                if (before.provisional || egress_host_sockaddr(h, port, &ss, &len) < 0)
                        abort();
                if (egress_decide_address(p, h, (struct sockaddr *) &ss, len, port, &after) < 0)
                        abort();
                if (after.verdict != before.verdict || after.reason != before.reason)
                        abort();
                return;
        }
        if (before.verdict == EGRESS_ALLOW && !before.provisional)
                abort();
        for (size_t i = 0; i < sizeof addrs / sizeof addrs[0]; i++) {
                struct sockaddr_storage ss = { 0 };
                socklen_t len;
                struct sockaddr_in *sin = (struct sockaddr_in *) &ss;
                struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) &ss;
                if (inet_pton(AF_INET, addrs[i], &sin->sin_addr) == 1) {
                        sin->sin_family = AF_INET;
                        len = sizeof *sin;
                } else if (inet_pton(AF_INET6, addrs[i], &sin6->sin6_addr) == 1) {
                        sin6->sin6_family = AF_INET6;
                        len = sizeof *sin6;
                } else
                        abort();
                if (egress_decide_address(p, h, (struct sockaddr *) &ss, len, port, &after) < 0)
                        abort();
                check_decision(&after);
                if (after.provisional ||
                    (before.verdict == EGRESS_DENY && after.verdict == EGRESS_ALLOW))
                        abort();
        }
}

static void fuzz_host(const uint8_t *data, size_t size) {
        egress_host h, again;

        if (egress_host_parse_n((const char *) data, size, &h) < 0)
                return;
        size_t n = strnlen(h.text, sizeof h.text);
        if (n == sizeof h.text || n == 0 || n > EGRESS_NAME_MAX)
                abort();
        if (h.kind != EGRESS_HOST_NAME && h.kind != EGRESS_HOST_IPV4 && h.kind != EGRESS_HOST_IPV6)
                abort();
        /* the canonical text is a fixed point */
        if (egress_host_parse(h.text, &again) < 0 || !egress_host_equal(&h, &again))
                abort();
        if (h.kind == EGRESS_HOST_IPV4 && h.has_embedded_v4)
                abort();
        if (h.kind != EGRESS_HOST_NAME) {
                char t[64];
                if (egress_addr_format(&h.addr, t, sizeof t) < 0 || strcmp(t, h.text) != 0)
                        abort();
        }
        for (uint16_t port = 0; port < 2; port++) {
                uint16_t p = port ? 443 : (uint16_t) (size * 257);
                check_monotone(pol_all, &h, p);
                check_monotone(pol_mixed, &h, p);
                check_monotone(pol_e2b, &h, p);
        }

        /* a rule naming exactly this host allows it, and a deny rule for it wins */
        egress_rule r;
        if (h.kind == EGRESS_HOST_IPV6 && h.has_embedded_v4)
                return; /* checked as its IPv4 address: an IPv6 rule does not allow it */
        if (egress_rule_parse(h.text, &r, NULL, 0) < 0)
                abort();
        egress_decision d_all, d;
        if (egress_decide(pol_all, &h, 443, &d_all) < 0)
                abort();
        egress_policy *p = NULL;
        if (egress_policy_new(&p) < 0 || egress_policy_add_allow(p, h.text, NULL, 0) < 0)
                abort();
        /* pol_all's ceiling, through a policy that shares it */
        egress_ceiling *c = NULL;
        if (egress_ceiling_new(&c) < 0 || egress_ceiling_add_allow(c, "*", NULL, 0) < 0 ||
            egress_ceiling_add_deny(c, "*.blocked.test", NULL, 0) < 0 ||
            egress_ceiling_allow_private(c, "10.1.0.0/16", NULL, 0) < 0)
                abort();
        struct sockaddr_in sin = { .sin_family = AF_INET };
        sin.sin_addr.s_addr = htonl(0x5db8d822);
        if (egress_ceiling_add_host_address(c, (struct sockaddr *) &sin, sizeof sin) < 0)
                abort();
        egress_policy_set_ceiling(p, c);
        egress_ceiling_unref(c);
        if (egress_decide(p, &h, 443, &d) < 0)
                abort();
        if (d.verdict != d_all.verdict)
                abort();
        if (d.verdict == EGRESS_ALLOW && (d.reason != EGRESS_REASON_ALLOW_RULE || d.index != 0))
                abort();
        if (egress_policy_add_deny(p, h.text, NULL, 0) < 0 || egress_decide(p, &h, 443, &d) < 0 ||
            d.verdict != EGRESS_DENY)
                abort();
        egress_policy_free(p);
}

static void fuzz_rule(const char *s) {
        egress_rule r, again;
        char why[256], text[EGRESS_RULE_TEXT_MAX], text2[EGRESS_RULE_TEXT_MAX];

        memset(why, 0x41, sizeof why);
        if (egress_rule_parse(s, &r, why, sizeof why) < 0) {
                if (!memchr(why, 0, sizeof why))
                        abort();
                return;
        }
        if (egress_rule_format(&r, text, sizeof text) < 0)
                abort();
        if (egress_rule_parse(text, &again, NULL, 0) < 0 || !egress_rule_equal(&r, &again))
                abort();
        if (egress_rule_format(&again, text2, sizeof text2) < 0 || strcmp(text, text2) != 0)
                abort();
        if (r.n_ports > EGRESS_RULE_PORTS_MAX)
                abort();
        for (unsigned i = 0; i < r.n_ports; i++)
                if (r.ports[i].first == 0 || r.ports[i].first > r.ports[i].last)
                        abort();
}

/* A rule list, then the same text as E2B lists (one entry a line). */
static void fuzz_lists(const char *s, size_t n) {
        egress_policy *p = NULL;
        char **a = NULL, **d = NULL;

        if (egress_policy_new(&p) < 0)
                abort();
        if (egress_policy_add_rules(p, s, NULL, 0) == 0) {
                if (egress_policy_to_strings(p, &a, &d) < 0)
                        abort();
                for (char **v = a; *v; v++)
                        if (egress_rule_parse(*v, &(egress_rule) { 0 }, NULL, 0) < 0)
                                abort();
                for (char **v = d; *v; v++)
                        if (egress_rule_parse(*v, &(egress_rule) { 0 }, NULL, 0) < 0)
                                abort();
                a = egress_strv_free(a);
                d = egress_strv_free(d);
        }
        p = egress_policy_free(p);

        char *copy = strdup(s);
        const char *allow[16], *deny[16];
        size_t na = 0, nd = 0, line = 0;
        if (!copy)
                return;
        for (char *tok = copy, *nl; tok && na < 16 && nd < 16; tok = nl, line++) {
                nl = strchr(tok, '\n');
                if (nl)
                        *nl++ = 0;
                if (line % 2 == 0)
                        allow[na++] = tok;
                else
                        deny[nd++] = tok;
        }
        int internet = (int) (n % 3) - 1;
        if (egress_policy_from_e2b(internet, allow, na, deny, nd, &p, NULL, 0) == 0) {
                if (egress_policy_to_strings(p, &a, &d) < 0)
                        abort();
                size_t ma = 0, md = 0;
                while (a[ma])
                        ma++;
                while (d[md])
                        md++;
                /* the E2B shape maps back to a policy with the same strings */
                egress_policy *q = NULL;
                char **a2 = NULL, **d2 = NULL;
                if (egress_policy_from_e2b(internet, (const char *const *) a, ma,
                                           (const char *const *) d, md, &q, NULL, 0) < 0 ||
                    egress_policy_to_strings(q, &a2, &d2) < 0)
                        abort();
                for (size_t i = 0; i <= ma; i++)
                        if ((a[i] == NULL) != (a2[i] == NULL) || (a[i] && strcmp(a[i], a2[i]) != 0))
                                abort();
                for (size_t i = 0; i <= md; i++)
                        if ((d[i] == NULL) != (d2[i] == NULL) || (d[i] && strcmp(d[i], d2[i]) != 0))
                                abort();
                egress_strv_free(a2);
                egress_strv_free(d2);
                egress_policy_free(q);
                egress_strv_free(a);
                egress_strv_free(d);
                egress_policy_free(p);
        }
        free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 4096)
                return 0;
        setup();
        fuzz_host(data, size);

        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = 0;
        fuzz_rule(s);
        fuzz_lists(s, size);
        free(s);
        return 0;
}
