/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The egress proxy (docs/design.md §5.1, issue #4): the only way out of a sandbox.
 *
 * One egress_proxy per host process (the daemon, or `hutch run`) owns an
 * epoll fd, a timerfd and every connection. The host loop polls
 * egress_proxy_fd() and calls egress_proxy_dispatch() when it is readable;
 * nothing here blocks and no thread is started.
 *
 * One egress_site per sandbox: a listening socket opened **inside the
 * sandbox's netns** (setns into it, socket, setns back), the sandbox's
 * policy, its connection and bandwidth caps and its connections. On that one
 * port the site serves an HTTP/1.1 forward proxy (absolute-form http://),
 * CONNECT tunnels and SOCKS5 (the first byte 0x05 chooses SOCKS5).
 *
 * For every request: the host text is parsed once (egress_host_parse_n),
 * the policy decides, a name is resolved by the proxy itself (its own DNS
 * client over UDP to the configured nameservers: no /etc/hosts, no search
 * domains), every resolved address is checked, and exactly an allowed
 * address is dialled. A tunnel's first client bytes are held until they are
 * known: a TLS ClientHello must name the CONNECT host in its SNI (port 443
 * requires TLS with SNI), and nothing reaches the upstream before that.
 * Forward requests are rewritten: the Host header is the parsed target's,
 * hop-by-hop headers are dropped, exactly one request body is relayed
 * (Content-Length or chunked framing), and the connection closes after the
 * response.
 *
 * Every connection ends in one egress_record handed to on_record (rate
 * limited per site; the suppressed count travels in the next record).
 *
 * docs/egress.md ("The proxy") is the reference.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "egress/inject.h"
#include "egress/policy.h"

#define EGRESS_PROXY_PORT 3128
#define EGRESS_NAMESERVERS_MAX 4

typedef struct egress_proxy egress_proxy;
typedef struct egress_site egress_site;

typedef enum egress_kind {
        EGRESS_KIND_HTTP = 1, /* absolute-form forward request */
        EGRESS_KIND_CONNECT,  /* HTTP CONNECT tunnel */
        EGRESS_KIND_SOCKS5,   /* SOCKS5 CONNECT */
} egress_kind;

const char *egress_kind_to_string(egress_kind k); /* "http", "connect", "socks5", "unknown" */

/* What happened to one connection, when it ends. Strings are valid during
 * the callback only. */
typedef struct egress_record {
        const char *sandbox_id;
        egress_kind kind;      /* 0 when the request never got that far */
        const char *method;    /* HTTP method, or "" */
        const char *host;      /* canonical host, or "" when none was accepted */
        uint16_t port;
        const char *address;   /* the address dialled (or refused after resolution), or "" */
        bool allowed;          /* the policy allowed it (the dial may still have failed) */
        const char *reason;    /* static English text */
        const char *rule;      /* the deciding rule's canonical text, or "" */
        const char *error;     /* what went wrong after an allow ("connect: ..."), or "" */
        uint64_t bytes_out;    /* sandbox -> upstream, after the proxy (head rewrites included) */
        uint64_t bytes_in;     /* upstream -> sandbox */
        int64_t started_ms;    /* CLOCK_REALTIME, ms */
        int64_t duration_ms;
        uint64_t suppressed;   /* records dropped by the rate limit since the last one */
        const char *injected;  /* secrets and rules applied to the request, comma-separated, or "" */
} egress_record;

typedef struct egress_proxy_config {
        egress_addr nameservers[EGRESS_NAMESERVERS_MAX]; /* port 53 */
        size_t n_nameservers;
        uint16_t dns_port;            /* 0: 53 (tests use another) */
        unsigned max_connections;     /* per site, open at once; 0: 256 */
        unsigned max_total_connections; /* every site together; 0: 8192 */
        uint64_t bandwidth_bytes;     /* per site and direction, bytes/s; 0: unlimited */
        unsigned records_per_second;  /* per site; 0: 50 */
        void (*on_record)(void *userdata, const egress_record *r);
        /* TLS interception for hosts with credential rules (tlsmint.h);
         * NULL: such tunnels pass untouched (placeholders stay placeholders). */
        struct tlsmint *mint;
        /* A secret's value for a sandbox's request (inject.h); NULL: none. */
        int (*resolve)(void *userdata, const char *sandbox_id, const char *name, const egress_host *h, uint16_t port,
                       char **ret, size_t *ret_len);
        void *userdata;
} egress_proxy_config;

/* Reads the daemon's own netns now: every upstream socket is made there. */
int egress_proxy_new(const egress_proxy_config *cfg, egress_proxy **ret);
egress_proxy *egress_proxy_free(egress_proxy *p); /* closes every site; returns NULL */
int egress_proxy_fd(const egress_proxy *p);       /* readable when dispatch has work */
/* Serve whatever is ready, never blocking. */
void egress_proxy_dispatch(egress_proxy *p);

/* Listen on 127.0.0.1:port inside the netns netns_fd refers to (an open
 * /proc/PID/ns/net), with policy (taken, even on failure). -EADDRINUSE when
 * something in the sandbox holds the port. */
int egress_site_open(egress_proxy *p, const char *sandbox_id, int netns_fd, uint16_t port,
                     egress_policy *policy, egress_site **ret);
/* Replace the policy (taken, even on failure). Live connections whose
 * destination the new policy denies are closed now and recorded. Returns how
 * many were closed. */
int egress_site_set_policy(egress_site *s, egress_policy *policy);
const egress_policy *egress_site_policy(const egress_site *s);
/* Replace the site's credential rules (inject.h; taken, NULL for none). */
void egress_site_set_inject(egress_site *s, egress_inject *x);
unsigned egress_site_connections(const egress_site *s);
/* Close the listener and every connection (each recorded). NULL is fine. */
void egress_site_close(egress_site *s);

/* ------------------------------------------------------- set-up helpers */

/* Add each comma-separated item of list (spaces around items ignored,
 * empty items skipped) with add (egress_ceiling_add_allow, _add_deny or
 * _allow_private). Stops at the first refused item: its error, with why. */
int egress_ceiling_add_list(egress_ceiling *c, const char *list,
                            int (*add)(egress_ceiling *, const char *, char *, size_t), char *why, size_t whylen);

/* Add every address of every interface of the calling process's netns to
 * c as a host address (never a destination). Returns how many. */
int egress_ceiling_add_host_addresses(egress_ceiling *c);

/* Nameservers from list (comma/space-separated IP addresses) or, when list
 * is NULL or empty, from /etc/resolv.conf. Returns how many (0: none),
 * -EINVAL/-E2BIG with why for a bad list. */
int egress_nameservers(const char *list, egress_addr *ret, size_t max, char *why, size_t whylen);

/* The proxy variables every sandbox process gets, as eight "NAME=value"
 * strings written to ret, for the proxy on 127.0.0.1:port.
 * HTTP(S)_PROXY, ALL_PROXY (socks5h), NO_PROXY, and their lowercase forms. */
int egress_proxy_env(uint16_t port, char ret[8][64]);
