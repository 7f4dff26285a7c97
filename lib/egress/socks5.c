/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The server side of a SOCKS5 handshake (RFC 1928), parsed without I/O.
 * Only NO AUTH and CONNECT: the sandbox is already authenticated by being
 * the sandbox, and BIND/UDP ASSOCIATE would open paths the policy does not
 * describe. docs/egress.md ("Proxy request parsing").
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "egress/socks5.h"

enum { STAGE_GREETING, STAGE_REQUEST, STAGE_DONE };

void socks5_init(socks5 *s) {
        memset(s, 0, sizeof *s);
}

static int fail(socks5 *s, int code, int reply_kind, uint8_t reply, const char *why) {
        s->error = code;
        s->reply_kind = reply_kind;
        s->reply = reply;
        s->why = why;
        return code;
}

/* Judge the bytes buffered so far: 0 need more, > 0 a message is complete. */
static int step_greeting(socks5 *s) {
        /* VER NMETHODS METHODS[NMETHODS] */
        if (s->buf[0] != 5)
                return fail(s, -EPROTO, 0, 0, "not SOCKS version 5");
        if (s->len < 2)
                return 0;
        if (s->buf[1] == 0)
                return fail(s, -EPROTO, 1, SOCKS5_METHOD_NONE_ACCEPTABLE, "empty method list");
        if (s->len < 2 + (size_t) s->buf[1])
                return 0;
        if (!memchr(s->buf + 2, SOCKS5_METHOD_NO_AUTH, s->buf[1]))
                return fail(s, -ENOTSUP, 1, SOCKS5_METHOD_NONE_ACCEPTABLE,
                            "client does not offer NO AUTH");
        s->stage = STAGE_REQUEST;
        return SOCKS5_GREETING_DONE;
}

static int step_request(socks5 *s) {
        /* VER CMD RSV ATYP DST.ADDR DST.PORT */
        size_t need;

        if (s->buf[0] != 5)
                return fail(s, -EPROTO, 2, SOCKS5_REP_GENERAL_FAILURE, "not SOCKS version 5");
        if (s->len < 2)
                return 0;
        if (s->buf[1] != SOCKS5_CMD_CONNECT)
                return fail(s, -ENOTSUP, 2, SOCKS5_REP_COMMAND_NOT_SUPPORTED,
                            "command other than CONNECT");
        if (s->len < 3)
                return 0;
        if (s->buf[2] != 0)
                return fail(s, -EPROTO, 2, SOCKS5_REP_GENERAL_FAILURE, "reserved byte not zero");
        if (s->len < 4)
                return 0;
        switch (s->buf[3]) {
        case SOCKS5_ATYP_IPV4:
                need = 4 + 4 + 2;
                break;
        case SOCKS5_ATYP_IPV6:
                need = 4 + 16 + 2;
                break;
        case SOCKS5_ATYP_DOMAIN:
                if (s->len < 5)
                        return 0;
                if (s->buf[4] == 0)
                        return fail(s, -EPROTO, 2, SOCKS5_REP_GENERAL_FAILURE, "empty domain name");
                need = 5 + (size_t) s->buf[4] + 2;
                break;
        default:
                return fail(s, -ENOTSUP, 2, SOCKS5_REP_ADDRESS_NOT_SUPPORTED, "unknown address type");
        }
        if (s->len < need)
                return 0;

        uint16_t port = (uint16_t) (s->buf[need - 2] << 8 | s->buf[need - 1]);
        if (port == 0)
                return fail(s, -EPROTO, 2, SOCKS5_REP_NOT_ALLOWED, "port 0");
        s->atyp = s->buf[3];
        s->port = port;
        if (s->atyp == SOCKS5_ATYP_DOMAIN) {
                s->host_len = s->buf[4];
                memcpy(s->host, s->buf + 5, s->host_len);
                s->host[s->host_len] = 0;
        } else {
                memcpy(s->addr, s->buf + 4, s->atyp == SOCKS5_ATYP_IPV4 ? 4 : 16);
        }
        s->stage = STAGE_DONE;
        return SOCKS5_REQUEST_DONE;
}

int socks5_feed(socks5 *s, const void *data, size_t n, size_t *ret_consumed) {
        const uint8_t *p = data;
        size_t i;
        int k = SOCKS5_NEED_MORE;

        if (s->error || s->stage == STAGE_DONE) {
                if (ret_consumed)
                        *ret_consumed = 0;
                return s->error ? s->error : SOCKS5_REQUEST_DONE;
        }
        /* One byte at a time: every message is judged on the same prefixes
         * whatever the split, and never reads past its own end. */
        for (i = 0; i < n; i++) {
                s->buf[s->len++] = p[i];
                k = s->stage == STAGE_GREETING ? step_greeting(s) : step_request(s);
                if (k != 0) {
                        i++;
                        s->len = 0;
                        break;
                }
        }
        if (ret_consumed)
                *ret_consumed = i;
        return k;
}

int socks5_host(const socks5 *s, egress_host *ret) {
        char text[INET6_ADDRSTRLEN];

        if (s->error || s->stage != STAGE_DONE)
                return -EINVAL;
        if (s->atyp == SOCKS5_ATYP_DOMAIN)
                return egress_host_parse_n(s->host, s->host_len, ret);
        if (!inet_ntop(s->atyp == SOCKS5_ATYP_IPV4 ? AF_INET : AF_INET6, s->addr, text, sizeof text))
                return -EINVAL;
        return egress_host_parse(text, ret);
}

int socks5_method_reply(uint8_t method, uint8_t *buf, size_t len) {
        if (len < 2)
                return -ENOBUFS;
        buf[0] = 5;
        buf[1] = method;
        return 2;
}

int socks5_reply(uint8_t rep, const egress_addr *bound, uint16_t bound_port, uint8_t *buf,
                 size_t len) {
        size_t alen = bound && bound->family == AF_INET6 ? 16 : 4;

        if (len < 4 + alen + 2)
                return -ENOBUFS;
        buf[0] = 5;
        buf[1] = rep;
        buf[2] = 0;
        buf[3] = alen == 16 ? SOCKS5_ATYP_IPV6 : SOCKS5_ATYP_IPV4;
        if (bound)
                memcpy(buf + 4, bound->bytes, alen);
        else
                memset(buf + 4, 0, alen);
        buf[4 + alen] = (uint8_t) (bound_port >> 8);
        buf[4 + alen + 1] = (uint8_t) bound_port;
        return (int) (4 + alen + 2);
}
