/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The server side of a SOCKS5 handshake (RFC 1928) as a sandbox program
 * speaks it to the egress proxy (issue #4), parsed without I/O: the greeting
 * (NO AUTH required) and one CONNECT request (IPv4, IPv6 or a domain name).
 * Bytes may come in any split; state is bounded. The proxy (proxy.c)
 * parses every SOCKS5 client with it. docs/egress.md ("Proxy request
 * parsing").
 *
 * The destination is returned raw; socks5_host() passes it through
 * egress_host_parse_n(), and the proxy decides and dials that parsed value.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/policy.h"

/* ---------------------------------------------------------------- SOCKS5 */

enum {
        SOCKS5_NEED_MORE = 0,     /* all taken; feed more */
        SOCKS5_GREETING_DONE = 1, /* send socks5_method_reply(SOCKS5_METHOD_NO_AUTH) */
        SOCKS5_REQUEST_DONE = 2,  /* the CONNECT request is in; decide, then reply */
};

enum {
        SOCKS5_METHOD_NO_AUTH = 0x00,
        SOCKS5_METHOD_NONE_ACCEPTABLE = 0xff,
};

enum {
        SOCKS5_ATYP_IPV4 = 0x01,
        SOCKS5_ATYP_DOMAIN = 0x03,
        SOCKS5_ATYP_IPV6 = 0x04,
};

enum {
        SOCKS5_CMD_CONNECT = 0x01,
        SOCKS5_CMD_BIND = 0x02,
        SOCKS5_CMD_UDP_ASSOCIATE = 0x03,
};

/* REP codes (RFC 1928 §6) */
enum {
        SOCKS5_REP_SUCCEEDED = 0x00,
        SOCKS5_REP_GENERAL_FAILURE = 0x01,
        SOCKS5_REP_NOT_ALLOWED = 0x02,
        SOCKS5_REP_NETWORK_UNREACHABLE = 0x03,
        SOCKS5_REP_HOST_UNREACHABLE = 0x04,
        SOCKS5_REP_CONNECTION_REFUSED = 0x05,
        SOCKS5_REP_TTL_EXPIRED = 0x06,
        SOCKS5_REP_COMMAND_NOT_SUPPORTED = 0x07,
        SOCKS5_REP_ADDRESS_NOT_SUPPORTED = 0x08,
};

#define SOCKS5_REPLY_MAX 22 /* VER REP RSV ATYP + 16-byte address + port */

typedef struct socks5 {
        /* results, valid after SOCKS5_REQUEST_DONE */
        uint8_t atyp;     /* SOCKS5_ATYP_* */
        uint8_t addr[16]; /* IPV4: 4 bytes, IPV6: 16 bytes, network order */
        char host[256];   /* DOMAIN: the raw bytes (may hold NUL), NUL-terminated */
        size_t host_len;  /* DOMAIN: 1..255 */
        uint16_t port;    /* host order; 0 is refused */

        /* after an error: what to send before closing, and why */
        int reply_kind; /* 0: nothing; 1: socks5_method_reply(reply); 2: socks5_reply(reply) */
        uint8_t reply;
        const char *why;

        /* parser state */
        int error; /* sticky */
        int stage; /* 0 greeting, 1 request, 2 done */
        size_t len;
        uint8_t buf[4 + 1 + 255 + 2];
} socks5;

void socks5_init(socks5 *s);

/* Feed the next bytes. Returns SOCKS5_NEED_MORE, SOCKS5_GREETING_DONE or
 * SOCKS5_REQUEST_DONE (*ret_consumed bytes were taken; feed the rest again
 * after GREETING_DONE: a client may send its request before the method
 * reply), or a negative errno with why and reply_kind/reply set: -EPROTO
 * (not version 5, non-zero reserved byte, empty method list or domain,
 * port 0), -ENOTSUP (no NO AUTH method: reply 0xff; BIND/UDP ASSOCIATE:
 * REP 0x07; unknown ATYP: REP 0x08). Sticky, and
 * ret_consumed written on every return, like proxyreq_feed(). */
int socks5_feed(socks5 *s, const void *data, size_t n, size_t *ret_consumed);

/* The destination as an egress_host: the domain through
 * egress_host_parse_n() (so NUL, '@', '%', bad labels are refused there), an
 * address through its canonical text. -EINVAL if refused or not DONE. */
int socks5_host(const socks5 *s, egress_host *ret);

/* The method-selection reply: 2 bytes. Returns 2 or -ENOBUFS. */
int socks5_method_reply(uint8_t method, uint8_t *buf, size_t len);

/* A request reply with REP code rep and the bound address (NULL:
 * 0.0.0.0:0, as a refusal sends). Returns its length (10 or 22) or
 * -ENOBUFS; SOCKS5_REPLY_MAX always suffices. */
int socks5_reply(uint8_t rep, const egress_addr *bound, uint16_t bound_port, uint8_t *buf,
                 size_t len);
