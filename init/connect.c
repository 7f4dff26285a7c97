/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch-init --ingress-connect PORT: the inside end of an ingress connection
 * to a gVisor sandbox's port (docs/gvisor.md "Ingress"). The sandbox's
 * loopback is inside the sentry, out of reach of any host socket, so the
 * daemon spawns this in the sandbox (like any process, its stdin and stdout
 * are mux streams through the relay), and it joins them to a TCP
 * connection to 127.0.0.1:PORT: stdin to the socket, the socket to stdout.
 * Nothing is parsed here; the daemon reads what comes out as the sandbox's
 * bytes. If the connect fails it exits 111 having written nothing, which
 * the daemon answers as a closed port.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "init.h"

#define BUF (64 * 1024)

typedef struct pipe_buf {
        char b[BUF];
        size_t off, len;
} pipe_buf;

/* read what is there into an empty buffer: 1 data, 0 EOF, -1 would block or failed */
static int fill(int fd, pipe_buf *p) {
        ssize_t n = read(fd, p->b, sizeof p->b);
        if (n > 0) {
                p->off = 0;
                p->len = (size_t) n;
                return 1;
        }
        if (n == 0)
                return 0;
        return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

/* write what is queued: 0 on progress or would-block, -1 when fd is gone */
static int drain(int fd, pipe_buf *p) {
        while (p->off < p->len) {
                ssize_t n = write(fd, p->b + p->off, p->len - p->off);
                if (n < 0)
                        return errno == EAGAIN || errno == EINTR ? 0 : -1;
                p->off += (size_t) n;
        }
        p->off = p->len = 0;
        return 0;
}

int connect_main(const char *port_s) {
        char *end;
        unsigned long port = strtoul(port_s, &end, 10);
        if (*end || port == 0 || port > 65535)
                return 2;
        (void) signal(SIGPIPE, SIG_IGN);
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return 111;
        struct sockaddr_in sin = { .sin_family = AF_INET,
                                   .sin_port = htons((uint16_t) port),
                                   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (connect(s, (struct sockaddr *) &sin, sizeof sin) < 0)
                return 111;
        static pipe_buf up, down; /* stdin → socket, socket → stdout */
        bool in_eof = false, sock_eof = false;
        for (;;) {
                struct pollfd pf[3] = {
                        { .fd = in_eof || up.len ? -1 : 0, .events = POLLIN },
                        { .fd = s,
                          .events = (short) ((sock_eof || down.len ? 0 : POLLIN) |
                                             (up.len ? POLLOUT : 0)) },
                        { .fd = 1, .events = down.len ? POLLOUT : 0 },
                };
                if (poll(pf, 3, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        return 1;
                }
                /* the daemon's side of stdout is gone: nobody reads any more */
                if (pf[2].revents & (POLLERR | POLLHUP))
                        return 0;
                if (pf[0].revents) {
                        int r = fill(0, &up);
                        if (r == 0 || r == -2) {
                                in_eof = true;
                                (void) shutdown(s, SHUT_WR);
                        }
                }
                if (up.len && drain(s, &up) < 0)
                        return 0;
                if (pf[1].revents & (POLLIN | POLLHUP | POLLERR) && !sock_eof && !down.len) {
                        int r = fill(s, &down);
                        if (r == 0 || r == -2)
                                sock_eof = true;
                }
                if (down.len && drain(1, &down) < 0)
                        return 0;
                if (sock_eof && !down.len)
                        return 0;
        }
}
