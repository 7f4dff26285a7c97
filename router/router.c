/* SPDX-License-Identifier: Apache-2.0 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "egress/chunked.h"
#include "egress/dns.h"
#include "egress/proxyreq.h"
#include "net/hpack.h"
#include "router/rhttp.h"
#include "router/router.h"
#include "util/log.h"
#include "util/macro.h"

#define NODES_MAX 1024
#define IDLE_PER_NODE 32
#define IDLE_MAX_MS                                                                                \
        4000 /* a pooled node connection older than this is closed (the node's own idle timers are longer) */
#define CLIENT_IDLE_MS 600000 /* between requests on a client connection */
#define FIRST_IDLE_MS                                                                              \
        15000 /* before a new connection's first request begins (the daemon's unauthenticated-timeout) */
#define HEAD_TIMEOUT_MS 30000 /* a request head must arrive within this once begun */
#define CALL_TIMEOUT_MS                                                                            \
        120000 /* a buffered exchange with a node (a create waits for the sandbox) */
#define IOBUF 65536
#define RELAY_BUF (256 * 1024) /* one read of a relayed body: fewer syscalls per MB */

/* ------------------------------------------------------------------ nodes */

/* A connection to a node: its socket and, with --node-tls-ca, its TLS
 * session. A TLS connection's socket stays non-blocking: every read and
 * write goes through nc_*, which wait in poll for what OpenSSL asks
 * (SSL_ERROR_WANT_READ/WRITE); the bytes OpenSSL has decrypted and not yet
 * handed out (SSL_pending) count as readable before poll is asked. */
typedef struct nconn {
        int fd;
        SSL *ssl;    /* NULL: plain HTTP */
        bool failed; /* a TLS error: no close_notify on close */
} nconn;

typedef struct node {
        char addr[300]; /* HOST:PORT as configured or found */
        struct sockaddr_storage sa;
        socklen_t salen;
        bool is_static;
        bool gone; /* left the DNS answer: not polled, not chosen */
        /* from GET /node (under nodes_mu) */
        char id[ROUTER_NODE_ID_LEN + 1];
        bool up, draining, polled;
        int64_t mem_free, sandboxes, pool, sandbox_mem_mb;
        json_t *templates;
        int64_t last_ok_ms;
        char tls_why[200]; /* the last TLS failure logged (under nodes_mu) */
        char poll_why[400]; /* the last refusal of GET /node logged (under nodes_mu) */
        /* idle keep-alive connections (under nodes_mu) */
        nconn idle[IDLE_PER_NODE];
        int64_t idle_ms[IDLE_PER_NODE];
        unsigned n_idle;
        atomic_uint_fast64_t forwarded, failures;
} node;

static const router_config *cfg;
static pthread_mutex_t nodes_mu = PTHREAD_MUTEX_INITIALIZER;
static node *nodes[NODES_MAX];
static unsigned n_nodes;
static char node_key[64]; /* the key GET /node is asked with */
static SSL_CTX *tls_ctx;  /* --node-tls-ca: every node connection is TLS */

static atomic_uint_fast64_t m_requests[RR_SIGNED_FILES + 1], m_create_retries, m_node_errors,
        m_conns, m_conns_open, m_no_node, m_refused, m_team_limit, m_team_snapshot_limit;

static int64_t mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int parse_hostport(const char *s, struct sockaddr_storage *ss, socklen_t *len) {
        char host[256];
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t) (colon - s) >= sizeof host)
                return -EINVAL;
        memcpy(host, s, (size_t) (colon - s));
        host[colon - s] = 0;
        char *end;
        unsigned long port = strtoul(colon + 1, &end, 10);
        if (*end || port == 0 || port > 65535)
                return -EINVAL;
        memset(ss, 0, sizeof *ss);
        char *h = host;
        if (h[0] == '[') {
                size_t l = strlen(h);
                if (l < 3 || h[l - 1] != ']')
                        return -EINVAL;
                h[l - 1] = 0;
                h++;
        }
        struct sockaddr_in *a4 = (struct sockaddr_in *) ss;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *) ss;
        if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
                a4->sin_family = AF_INET;
                a4->sin_port = htons((uint16_t) port);
                *len = sizeof *a4;
                return 0;
        }
        if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
                a6->sin6_family = AF_INET6;
                a6->sin6_port = htons((uint16_t) port);
                *len = sizeof *a6;
                return 0;
        }
        /* a name (static lists only): resolved once, here */
        struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
        if (getaddrinfo(h, colon + 1, &hints, &res) != 0 || !res)
                return -EHOSTUNREACH;
        memcpy(ss, res->ai_addr, res->ai_addrlen);
        *len = res->ai_addrlen;
        freeaddrinfo(res);
        return 0;
}

/* Under nodes_mu. */
static node *node_add(const char *addr, bool is_static) {
        for (unsigned i = 0; i < n_nodes; i++)
                if (streq(nodes[i]->addr, addr)) {
                        nodes[i]->gone = false;
                        return nodes[i];
                }
        if (n_nodes >= NODES_MAX)
                return NULL;
        node *n = calloc(1, sizeof *n);
        if (!n)
                return NULL;
        snprintf(n->addr, sizeof n->addr, "%s", addr);
        if (parse_hostport(addr, &n->sa, &n->salen) < 0) {
                log_warning("node %s: not an address", addr);
                free(n);
                return NULL;
        }
        n->is_static = is_static;
        nodes[n_nodes++] = n;
        log_info("node %s: found", addr);
        return n;
}

static void nc_close(nconn *c) {
        if (c->ssl) {
                /* close_notify, best effort (the socket does not block) */
                if (!c->failed && !(SSL_get_shutdown(c->ssl) & SSL_SENT_SHUTDOWN))
                        (void) SSL_shutdown(c->ssl);
                SSL_free(c->ssl);
        }
        if (c->fd >= 0)
                close(c->fd);
        *c = (nconn) { .fd = -1 };
}

static void node_drop_idle(node *n) {
        for (unsigned i = 0; i < n->n_idle; i++)
                nc_close(&n->idle[i]);
        n->n_idle = 0;
}

static void node_mark_down(node *n, const char *why) {
        pthread_mutex_lock(&nodes_mu);
        bool was = n->up;
        n->up = false;
        node_drop_idle(n);
        pthread_mutex_unlock(&nodes_mu);
        if (was)
                log_warning("node %s (%s): down: %s", n->id[0] ? n->id : "?", n->addr, why);
}

/* The up node with this id, or NULL. */
static node *node_by_id(const char *id) {
        node *found = NULL;
        pthread_mutex_lock(&nodes_mu);
        for (unsigned i = 0; i < n_nodes; i++)
                if (!nodes[i]->gone && nodes[i]->up && streq(nodes[i]->id, id)) {
                        found = nodes[i];
                        break;
                }
        pthread_mutex_unlock(&nodes_mu);
        return found;
}

static int cmp_node_id(const void *a, const void *b) {
        return strcmp((*(node *const *) a)->id, (*(node *const *) b)->id);
}

/* Up nodes in node-id order (a stable "first node" for every replica). */
static unsigned nodes_up(node **out, unsigned max) {
        unsigned k = 0;
        pthread_mutex_lock(&nodes_mu);
        for (unsigned i = 0; i < n_nodes && k < max; i++)
                if (!nodes[i]->gone && nodes[i]->up)
                        out[k++] = nodes[i];
        pthread_mutex_unlock(&nodes_mu);
        qsort(out, k, sizeof *out, cmp_node_id);
        return k;
}

/* -------------------------------------------------------------- sockets */

static int write_all(int fd, const void *buf, size_t n) {
        const char *p = buf;
        while (n > 0) {
                ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

/* recv with a deadline (-1: none). 0 = EOF, -ETIMEDOUT. */
static ssize_t read_some(int fd, void *buf, size_t n, int timeout_ms) {
        for (;;) {
                struct pollfd p = { .fd = fd, .events = POLLIN };
                int r = poll(&p, 1, timeout_ms);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -errno;
                if (r == 0)
                        return -ETIMEDOUT;
                ssize_t k = recv(fd, buf, n, 0);
                if (k < 0 && errno == EINTR)
                        continue;
                return k < 0 ? -errno : k;
        }
}

static int dial(node *n) {
        int fd = socket(n->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        int r = connect(fd, (struct sockaddr *) &n->sa, n->salen);
        if (r < 0 && errno != EINPROGRESS) {
                r = -errno;
                close(fd);
                return r;
        }
        if (r < 0) {
                struct pollfd p = { .fd = fd, .events = POLLOUT };
                r = poll(&p, 1, (int) cfg->connect_timeout_ms);
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (r <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
                        close(fd);
                        return r == 0 ? -ETIMEDOUT : -(soerr ? soerr : ECONNREFUSED);
                }
        }
        if (!tls_ctx) {
                int fl = fcntl(fd, F_GETFL);
                (void) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        }
        int one = 1;
        (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
}

/* Wait until the socket can do what OpenSSL asked for (err: its
 * SSL_ERROR_WANT_*); -ETIMEDOUT after timeout_ms (-1: none). */
static int tls_wait(nconn *c, int err, int timeout_ms) {
        struct pollfd p = { .fd = c->fd, .events = err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN };
        for (;;) {
                int r = poll(&p, 1, timeout_ms);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0)
                        return -errno;
                return r == 0 ? -ETIMEDOUT : 0;
        }
}

/* One SSL_read: > 0 bytes, 0 at the end (close_notify, or a plain EOF:
 * SSL_OP_IGNORE_UNEXPECTED_EOF), -EAGAIN when OpenSSL waits for the socket
 * (*ret_want says for what), -ECONNRESET on a TLS error. */
static ssize_t tls_read_once(nconn *c, void *buf, size_t n, int *ret_want) {
        size_t got = 0;
        ERR_clear_error();
        if (SSL_read_ex(c->ssl, buf, n, &got) == 1)
                return (ssize_t) got;
        int e = SSL_get_error(c->ssl, 0);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                *ret_want = e;
                return -EAGAIN;
        }
        if (e == SSL_ERROR_ZERO_RETURN)
                return 0;
        c->failed = true;
        return -ECONNRESET;
}

/* Like read_some (0: the end, -ETIMEDOUT). */
static ssize_t nc_read(nconn *c, void *buf, size_t n, int timeout_ms) {
        if (!c->ssl)
                return read_some(c->fd, buf, n, timeout_ms);
        int64_t end = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
        for (;;) {
                int want = 0;
                ssize_t k = tls_read_once(c, buf, n, &want);
                if (k != -EAGAIN)
                        return k;
                int left = end < 0 ? -1 : (int) (end - mono_ms());
                if (end >= 0 && left <= 0)
                        return -ETIMEDOUT;
                int r = tls_wait(c, want, left);
                if (r < 0)
                        return r;
        }
}

/* A read after poll said the node's socket is readable (or nc_pending):
 * -EAGAIN when that was no application data yet (a TLS record still
 * arriving, a session ticket), 0 at the end. */
static ssize_t nc_read_ready(nconn *c, void *buf, size_t n) {
        if (!c->ssl) {
                ssize_t k = recv(c->fd, buf, n, 0);
                return k >= 0 ? k : errno == EINTR ? -EAGAIN : -errno;
        }
        int want = 0;
        ssize_t k = tls_read_once(c, buf, n, &want);
        if (k == -EAGAIN && want == SSL_ERROR_WANT_WRITE) {
                int r = tls_wait(c, want, -1);
                if (r < 0)
                        return r;
        }
        return k;
}

/* Decrypted bytes waiting inside OpenSSL: poll would not see them. */
static bool nc_pending(const nconn *c) {
        return c->ssl && SSL_pending(c->ssl) > 0;
}

static int nc_write_all(nconn *c, const void *buf, size_t n) {
        if (!c->ssl)
                return write_all(c->fd, buf, n);
        const char *p = buf;
        while (n > 0) {
                size_t w = 0;
                ERR_clear_error();
                if (SSL_write_ex(c->ssl, p, n, &w) == 1) {
                        p += w;
                        n -= w;
                        continue;
                }
                int e = SSL_get_error(c->ssl, 0);
                if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
                        c->failed = true;
                        return -EPIPE;
                }
                int r = tls_wait(c, e, -1);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* This side has no more to send (a tunnel's half-close). */
static void nc_shutdown_write(nconn *c) {
        if (!c->ssl)
                (void) shutdown(c->fd, SHUT_WR);
        else if (!c->failed && !(SSL_get_shutdown(c->ssl) & SSL_SENT_SHUTDOWN))
                (void) SSL_shutdown(c->ssl);
}

/* Whether why differs from the reason last kept in slot (a node's, under
 * nodes_mu), keeping it: a reason the discovery thread meets every poll is
 * logged once, and again when it changes. */
static bool node_why_changed(char *slot, size_t n, const char *why) {
        pthread_mutex_lock(&nodes_mu);
        bool changed = !streq(slot, why);
        if (changed)
                snprintf(slot, n, "%s", why);
        pthread_mutex_unlock(&nodes_mu);
        return changed;
}

/* A TLS failure of node n, logged when it differs from the last one logged. */
static void tls_log(node *n, const char *why) {
        bool changed = node_why_changed(n->tls_why, sizeof n->tls_why, why);
        if (changed && why[0])
                log_warning("node %s (%s): TLS: %s; the node is not used until it presents a "
                            "certificate that --node-tls-ca trusts for %s",
                            n->id[0] ? n->id : "?", n->addr, why,
                            cfg->node_tls_name[0] ? cfg->node_tls_name : "its address");
}

/* The TLS handshake on a connected socket, verifying the node's certificate
 * against --node-tls-ca and --node-tls-name (else the host of its address:
 * an IP address SAN for an IP, a DNS name for a name). The node's event
 * loop answers it, not its kernel as for a connect: it gets as long as the
 * caller would wait for an answer (timeout_ms), -ETIMEDOUT beyond. */
static int tls_handshake(node *n, nconn *c, int timeout_ms) {
        c->ssl = SSL_new(tls_ctx);
        if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1)
                return -ENOMEM;
        char host[300];
        snprintf(host, sizeof host, "%s", n->addr);
        char *colon = strrchr(host, ':');
        if (colon)
                *colon = 0;
        const char *h = host;
        if (host[0] == '[' && colon && colon[-1] == ']') {
                colon[-1] = 0;
                h = host + 1;
        }
        const char *name = cfg->node_tls_name[0] ? cfg->node_tls_name : h;
        unsigned char ip[16];
        bool is_ip = !cfg->node_tls_name[0] &&
                (inet_pton(AF_INET, h, ip) == 1 || inet_pton(AF_INET6, h, ip) == 1);
        int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), h)
                       : SSL_set1_host(c->ssl, name) && SSL_set_tlsext_host_name(c->ssl, name);
        if (ok != 1)
                return -ENOMEM;
        int64_t end = mono_ms() + timeout_ms;
        for (;;) {
                ERR_clear_error();
                int r = SSL_connect(c->ssl);
                if (r == 1)
                        break;
                int e = SSL_get_error(c->ssl, r);
                int left = (int) (end - mono_ms());
                if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && left > 0 &&
                    tls_wait(c, e, left) == 0)
                        continue;
                c->failed = true;
                if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE))
                        return -ETIMEDOUT; /* a busy node, not a bad one */
                char why[200];
                long v = SSL_get_verify_result(c->ssl);
                unsigned long ec = ERR_peek_error();
                if (v != X509_V_OK)
                        snprintf(why, sizeof why, "its certificate is refused: %s",
                                 X509_verify_cert_error_string(v));
                else if (ec)
                        snprintf(why, sizeof why, "handshake failed: %s",
                                 ERR_reason_error_string(ec) ? ERR_reason_error_string(ec) : "?");
                else
                        snprintf(why, sizeof why,
                                 "handshake failed (the node closed: is it "
                                 "serving plain HTTP?)");
                tls_log(n, why);
                return -EPROTO;
        }
        tls_log(n, "");
        return 0;
}

/* A new connection to node n (TLS with --node-tls-ca: the handshake
 * within timeout_ms). */
static int nc_dial(node *n, int timeout_ms, nconn *ret) {
        nconn c = { .fd = dial(n) };
        if (c.fd < 0)
                return c.fd;
        if (tls_ctx) {
                int r = tls_handshake(n, &c, timeout_ms);
                if (r < 0) {
                        nc_close(&c);
                        return r;
                }
        }
        *ret = c;
        return 0;
}

/* Whether a pooled connection is still fine: open, nothing unasked for. */
static bool nc_idle_ok(nconn *c) {
        char ch;
        if (!c->ssl) {
                ssize_t k = recv(c->fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
                return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        }
        /* (a TLS 1.3 session ticket the node sent is read and kept here) */
        int want = 0;
        return !nc_pending(c) && tls_read_once(c, &ch, 1, &want) == -EAGAIN;
}

/* A pooled connection that is still open, else a new one (its TLS
 * handshake within timeout_ms). *ret_reused says which: a reused one may
 * have been closed by the node meanwhile. */
static int node_conn(node *n, int timeout_ms, nconn *ret, bool *ret_reused) {
        int64_t now = mono_ms();
        pthread_mutex_lock(&nodes_mu);
        while (n->n_idle > 0) {
                unsigned i = --n->n_idle;
                nconn c = n->idle[i];
                if (now - n->idle_ms[i] > IDLE_MAX_MS || !nc_idle_ok(&c)) {
                        nc_close(&c); /* old, closed, failed, or bytes nobody asked for */
                        continue;
                }
                pthread_mutex_unlock(&nodes_mu);
                *ret = c;
                *ret_reused = true;
                return 0;
        }
        pthread_mutex_unlock(&nodes_mu);
        *ret_reused = false;
        return nc_dial(n, timeout_ms, ret);
}

static void node_conn_put(node *n, nconn *c) {
        pthread_mutex_lock(&nodes_mu);
        if (n->n_idle < IDLE_PER_NODE && n->up) {
                n->idle[n->n_idle] = *c;
                n->idle_ms[n->n_idle] = mono_ms();
                n->n_idle++;
                *c = (nconn) { .fd = -1 };
        }
        pthread_mutex_unlock(&nodes_mu);
        nc_close(c);
}

/* ---------------------------------------------------------- buffers */

typedef struct buf {
        char *p;
        size_t len, cap;
} buf;

static int buf_add(buf *b, const void *d, size_t n) {
        if (b->len + n + 1 > b->cap) {
                size_t c = b->cap ? b->cap : 1024;
                while (c < b->len + n + 1)
                        c *= 2;
                char *np = realloc(b->p, c);
                if (!np)
                        return -ENOMEM;
                b->p = np;
                b->cap = c;
        }
        memcpy(b->p + b->len, d, n);
        b->len += n;
        b->p[b->len] = 0;
        return 0;
}

static int buf_addf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int buf_addf(buf *b, const char *fmt, ...) {
        char tmp[2048];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t) n >= sizeof tmp)
                return -E2BIG;
        return buf_add(b, tmp, (size_t) n);
}

static void buf_free(buf *b) {
        free(b->p);
        *b = (buf) { 0 };
}

/* ------------------------------------------------- buffered exchanges */

typedef struct reply {
        rhead *head; /* heap: large */
        buf body;
} reply;

static void reply_free(reply *r) {
        free(r->head);
        buf_free(&r->body);
        r->head = NULL;
}

/* One request with a body the router holds, one response it reads whole
 * (Content-Length or until close; a chunked one is decoded). -errno when
 * the node could not be reached or answered garbage (the node is then
 * suspect: the caller marks it down for connection errors). */
static int exchange(node *n, const char *head, size_t head_len, const char *body, size_t body_len,
                    int timeout_ms, reply *ret) {
        for (int attempt = 0; attempt < 2; attempt++) {
                bool reused;
                nconn nc;
                int r = node_conn(n, timeout_ms, &nc, &reused);
                if (r < 0)
                        return r;
                r = nc_write_all(&nc, head, head_len);
                if (r >= 0 && body_len)
                        r = nc_write_all(&nc, body, body_len);
                rhead *h = malloc(sizeof *h);
                if (!h) {
                        nc_close(&nc);
                        return -ENOMEM;
                }
                rhead_init(h);
                buf b = { 0 };
                char tmp[IOBUF];
                size_t got = 0; /* response bytes read */
                bool head_done = false, done = false;
                chunked ck;
                chunked_init(&ck);
                uint64_t left = 0;
                while (r >= 0 && !done) {
                        ssize_t k = nc_read(&nc, tmp, sizeof tmp, timeout_ms);
                        if (k < 0) {
                                r = (int) k;
                                break;
                        }
                        if (k == 0) {
                                if (head_done && !h->has_content_length && !h->chunked)
                                        done = true; /* close-delimited */
                                else
                                        r = -ECONNRESET;
                                break;
                        }
                        got += (size_t) k;
                        size_t off = 0;
                        if (!head_done) {
                                size_t used;
                                int q = rhead_feed(h, tmp, (size_t) k, &used);
                                if (q < 0) {
                                        r = -EBADMSG;
                                        break;
                                }
                                if (q == RHEAD_NEED_MORE)
                                        continue;
                                off = used;
                                if (h->status >= 100 && h->status < 200) {
                                        /* 100 Continue: the real head follows */
                                        rhead_init(h);
                                        size_t rest = (size_t) k - off;
                                        memmove(tmp, tmp + off, rest);
                                        /* re-feed the rest: simplest as a short loop */
                                        q = rhead_feed(h, tmp, rest, &used);
                                        if (q < 0) {
                                                r = -EBADMSG;
                                                break;
                                        }
                                        if (q == RHEAD_NEED_MORE)
                                                continue;
                                        off = used;
                                        k = (ssize_t) rest;
                                }
                                head_done = true;
                                if (h->has_content_length)
                                        left = h->content_length;
                                if (h->status == 204 || h->status == 304 ||
                                    (h->has_content_length && left == 0)) {
                                        done = true;
                                        break;
                                }
                        }
                        const char *d = tmp + off;
                        size_t dn = (size_t) k - off;
                        if (h->has_content_length) {
                                size_t take = dn < left ? dn : (size_t) left;
                                if (buf_add(&b, d, take) < 0) {
                                        r = -ENOMEM;
                                        break;
                                }
                                left -= take;
                                done = left == 0;
                        } else if (h->chunked) {
                                size_t used;
                                int q = chunked_feed(&ck, d, dn, &used);
                                if (q < 0 || buf_add(&b, d, used) < 0) {
                                        r = -EBADMSG;
                                        break;
                                }
                                done = q == CHUNKED_DONE;
                        } else if (buf_add(&b, d, dn) < 0) {
                                r = -ENOMEM;
                                break;
                        }
                        if (b.len > (64u << 20)) {
                                r = -E2BIG;
                                break;
                        }
                }
                if (r >= 0 && h->chunked) {
                        /* decode in place: size CRLF data CRLF ... 0 CRLF trailers CRLF */
                        buf out = { 0 };
                        const char *p = b.p ? b.p : "", *e = p + b.len;
                        while (p < e) {
                                char *x;
                                unsigned long long sz = strtoull(p, &x, 16);
                                const char *crlf = strstr(p, "\r\n");
                                if (!crlf || x > crlf)
                                        break;
                                p = crlf + 2;
                                if (sz == 0 || (size_t) (e - p) < sz)
                                        break;
                                buf_add(&out, p, (size_t) sz);
                                p += sz + 2;
                        }
                        buf_free(&b);
                        b = out;
                }
                if (r >= 0 && done && !h->conn_close && (h->has_content_length || h->chunked))
                        node_conn_put(n, &nc);
                else
                        nc_close(&nc);
                if (r < 0 && reused && got == 0) {
                        /* a pooled connection the node had closed: once more, fresh */
                        free(h);
                        buf_free(&b);
                        continue;
                }
                if (r < 0) {
                        free(h);
                        buf_free(&b);
                        return r;
                }
                ret->head = h;
                ret->body = b;
                if (!ret->body.p)
                        buf_add(&ret->body, "", 0);
                return 0;
        }
        return -ECONNRESET;
}

/* ------------------------------------------------------------- discovery */

static int resolve_dns(const char *name, egress_addr *out, size_t max, size_t *ret_n) {
        struct sockaddr_storage ns;
        socklen_t nslen = 0;
        if (cfg->dns[0]) {
                char tmp[160];
                if (strchr(cfg->dns, ':'))
                        snprintf(tmp, sizeof tmp, "%s", cfg->dns);
                else
                        snprintf(tmp, sizeof tmp, "%s:53", cfg->dns);
                if (parse_hostport(tmp, &ns, &nslen) < 0)
                        return -EINVAL;
        } else {
                char text[8192];
                int fd = open("/etc/resolv.conf", O_RDONLY | O_CLOEXEC);
                ssize_t k = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
                if (fd >= 0)
                        close(fd);
                if (k <= 0)
                        return -ENOENT;
                egress_addr a[1];
                if (dns_parse_resolv_conf(text, (size_t) k, a, 1) < 1)
                        return -ENOENT;
                memset(&ns, 0, sizeof ns);
                if (a[0].family == AF_INET) {
                        struct sockaddr_in *s4 = (struct sockaddr_in *) &ns;
                        s4->sin_family = AF_INET;
                        s4->sin_port = htons(53);
                        memcpy(&s4->sin_addr, a[0].bytes, 4);
                        nslen = sizeof *s4;
                } else {
                        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *) &ns;
                        s6->sin6_family = AF_INET6;
                        s6->sin6_port = htons(53);
                        memcpy(&s6->sin6_addr, a[0].bytes, 16);
                        nslen = sizeof *s6;
                }
        }
        uint8_t q[DNS_QUERY_MAX], resp[DNS_MSG_MAX];
        uint16_t id;
        if (getrandom(&id, sizeof id, 0) != sizeof id)
                return -EIO;
        int qn = dns_build_query(name, id, DNS_TYPE_A, q, sizeof q);
        if (qn < 0)
                return qn;
        int fd = socket(ns.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        int r = -ETIMEDOUT;
        if (sendto(fd, q, (size_t) qn, 0, (struct sockaddr *) &ns, nslen) == qn) {
                int64_t deadline = mono_ms() + 1000;
                while (mono_ms() < deadline) {
                        ssize_t k = read_some(fd, resp, sizeof resp, (int) (deadline - mono_ms()));
                        if (k <= 0)
                                break;
                        dns_result res;
                        int p = dns_parse_response(resp, (size_t) k, id, name, DNS_TYPE_A, &res);
                        if (p == -ENOMSG)
                                continue;
                        if (p < 0) {
                                r = p;
                                break;
                        }
                        size_t n = res.n_addrs < max ? res.n_addrs : max;
                        memcpy(out, res.addrs, n * sizeof *out);
                        *ret_n = n;
                        r = 0;
                        break;
                }
        }
        close(fd);
        return r;
}

static void discover(void) {
        /* static list */
        char list[sizeof cfg->nodes];
        snprintf(list, sizeof list, "%s", cfg->nodes);
        char *save = NULL;
        pthread_mutex_lock(&nodes_mu);
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                while (*t == ' ')
                        t++;
                if (startswith(t, "http://"))
                        t += 7;
                else if (startswith(t, "https://"))
                        t += 8;
                t[strcspn(t, "/ ")] = 0;
                if (*t)
                        node_add(t, true);
        }
        pthread_mutex_unlock(&nodes_mu);
        if (!cfg->nodes_dns[0])
                return;
        char name[300];
        snprintf(name, sizeof name, "%s", cfg->nodes_dns);
        char *colon = strrchr(name, ':');
        if (!colon)
                return;
        *colon = 0;
        const char *port = colon + 1;
        egress_addr a[DNS_ADDRS_MAX];
        size_t n = 0;
        int r = resolve_dns(name, a, DNS_ADDRS_MAX, &n);
        if (r < 0) {
                /* keep the nodes known so far: a DNS hiccup is not a lost cluster */
                log_warning("nodes-dns %s: %s", name, strerror(-r));
                return;
        }
        pthread_mutex_lock(&nodes_mu);
        for (unsigned i = 0; i < n_nodes; i++)
                if (!nodes[i]->is_static)
                        nodes[i]->gone = true;
        for (size_t i = 0; i < n; i++) {
                char txt[INET6_ADDRSTRLEN], addr[300];
                inet_ntop(a[i].family, a[i].bytes, txt, sizeof txt);
                if (a[i].family == AF_INET6)
                        snprintf(addr, sizeof addr, "[%s]:%s", txt, port);
                else
                        snprintf(addr, sizeof addr, "%s:%s", txt, port);
                node_add(addr, false);
        }
        for (unsigned i = 0; i < n_nodes; i++)
                if (nodes[i]->gone && nodes[i]->up) {
                        nodes[i]->up = false;
                        node_drop_idle(nodes[i]);
                        log_info("node %s (%s): no longer in %s", nodes[i]->id, nodes[i]->addr, name);
                }
        pthread_mutex_unlock(&nodes_mu);
}

static void *poll_one(void *arg) {
        node *n = arg;
        buf h = { 0 };
        buf_addf(&h, "GET /node HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\n\r\n", n->addr, node_key);
        reply rp = { 0 };
        int r = exchange(n, h.p, h.len, NULL, 0, (int) (cfg->poll_ms < 1000 ? 1000 : cfg->poll_ms),
                         &rp);
        buf_free(&h);
        json_t *j = NULL;
        if (r >= 0 && rp.head->status == 200)
                j = json_loadb(rp.body.p, rp.body.len, 0, NULL);
        const char *id = j ? json_string_value(json_object_get(j, "nodeID")) : NULL;
        if (!id || strlen(id) != ROUTER_NODE_ID_LEN) {
                char why[400];
                if (r < 0)
                        snprintf(why, sizeof why, "%s", strerror(-r));
                else {
                        /* a node that answers but refuses (a key it does not
                         * take, tls-client-ca without our certificate): its
                         * reason, logged when it changes, even for a node that
                         * was never up */
                        json_t *e = json_loadb(rp.body.p, rp.body.len, 0, NULL);
                        const char *m = json_string_value(json_object_get(e, "message"));
                        snprintf(why, sizeof why, "GET /node answered %u%s%.300s", rp.head->status,
                                 m ? ": " : "", m ? m : "");
                        json_decref(e);
                        if (node_why_changed(n->poll_why, sizeof n->poll_why, why) && !n->up)
                                log_warning("node %s (%s): not used: %s", n->id[0] ? n->id : "?",
                                            n->addr, why);
                }
                node_mark_down(n, why);
                atomic_fetch_add(&m_node_errors, 1);
        } else {
                pthread_mutex_lock(&nodes_mu);
                bool was = n->up;
                char old[ROUTER_NODE_ID_LEN + 1];
                memcpy(old, n->id, sizeof old);
                memcpy(n->id, id, ROUTER_NODE_ID_LEN + 1);
                n->up = true;
                n->polled = true;
                n->poll_why[0] = 0;
                n->draining = json_is_true(json_object_get(j, "draining"));
                n->mem_free = json_integer_value(json_object_get(j, "memFreeBytes"));
                n->sandboxes = json_integer_value(json_object_get(j, "sandboxes"));
                n->pool = json_integer_value(json_object_get(j, "poolReady"));
                n->sandbox_mem_mb = json_integer_value(json_object_get(j, "sandboxMemoryMB"));
                json_decref(n->templates);
                n->templates = json_incref(json_object_get(j, "templates"));
                n->last_ok_ms = mono_ms();
                /* two nodes with one id would split its sandboxes: say so loudly */
                for (unsigned i = 0; i < n_nodes; i++)
                        if (nodes[i] != n && !nodes[i]->gone && nodes[i]->up &&
                            streq(nodes[i]->id, id))
                                log_error("nodes %s and %s both have node id %s: give each its own --node-id",
                                          nodes[i]->addr, n->addr, id);
                pthread_mutex_unlock(&nodes_mu);
                if (!was || !streq(old, id))
                        log_info("node %s (%s): up", id, n->addr);
        }
        json_decref(j);
        reply_free(&rp);
        return NULL;
}

static void *discovery_thread(void *arg) {
        for (;;) {
                discover();
                node *v[NODES_MAX];
                unsigned k = 0;
                pthread_mutex_lock(&nodes_mu);
                for (unsigned i = 0; i < n_nodes; i++)
                        if (!nodes[i]->gone)
                                v[k++] = nodes[i];
                pthread_mutex_unlock(&nodes_mu);
                pthread_t th[NODES_MAX];
                bool started[NODES_MAX];
                for (unsigned i = 0; i < k; i++)
                        started[i] = pthread_create(&th[i], NULL, poll_one, v[i]) == 0;
                for (unsigned i = 0; i < k; i++)
                        if (started[i])
                                pthread_join(th[i], NULL);
                struct timespec ts = { .tv_sec = cfg->poll_ms / 1000,
                                       .tv_nsec = (cfg->poll_ms % 1000) * 1000000L };
                nanosleep(&ts, NULL);
        }
        return arg;
}

/* ------------------------------------------------------ client replies */

typedef struct client {
        int fd;
        unsigned served; /* requests so far */
        char in[IOBUF];  /* bytes read and not yet used */
        size_t in_len;
        bool close_after;
        char peer[64];
} client;

static int send_json(client *c, unsigned status, const char *extra_headers, json_t *body) {
        char *s = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        if (!s)
                return -ENOMEM;
        static const struct {
                unsigned code;
                const char *text;
        } reasons[] = { { 200, "OK" },
                        { 201, "Created" },
                        { 204, "No Content" },
                        { 400, "Bad Request" },
                        { 404, "Not Found" },
                        { 405, "Method Not Allowed" },
                        { 411, "Length Required" },
                        { 413, "Content Too Large" },
                        { 502, "Bad Gateway" },
                        { 503, "Service Unavailable" } };
        const char *reason = "Status";
        for (size_t i = 0; i < ELEMENTSOF(reasons); i++)
                if (reasons[i].code == status)
                        reason = reasons[i].text;
        buf b = { 0 };
        buf_addf(&b,
                 "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s%s\r\n",
                 status, reason, strlen(s), extra_headers ? extra_headers : "",
                 c->close_after ? "Connection: close\r\n" : "");
        buf_add(&b, s, strlen(s));
        free(s);
        int r = write_all(c->fd, b.p, b.len);
        buf_free(&b);
        return r;
}

static int send_error(client *c, unsigned status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static int send_error(client *c, unsigned status, const char *fmt, ...) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return send_json(c, status, NULL,
                         json_pack("{s:i, s:s}", "code", (int) status, "message", msg));
}

/* What the data plane says for a sandbox the router cannot reach, in the
 * daemon's shape for an unknown sandbox (docs/api.md "Routing"). */
static int send_data_plane_gone(client *c, const char *id, const char *msg) {
        return send_json(c, 502, NULL,
                         json_pack("{s:s, s:s, s:i}", "sandboxId", id, "message", msg, "code", 502));
}

/* A reply read whole from a node, to the client: its status line and end-to-end headers. */
static int send_reply(client *c, const reply *rp, const char *extra_headers) {
        const rhead *h = rp->head;
        buf b = { 0 };
        size_t sl = strcspn(h->buf, "\r");
        buf_add(&b, h->buf, sl);
        buf_add(&b, "\r\n", 2);
        const char *conn = rhead_get(h, "Connection");
        for (size_t i = 0; i < h->n_headers; i++) {
                const char *nm = h->headers[i].name;
                if (rhead_hop_by_hop(nm, conn) || strcasecmp(nm, "Content-Length") == 0 ||
                    strcasecmp(nm, "Transfer-Encoding") == 0 ||
                    (extra_headers && strcasecmp(nm, "X-Next-Token") == 0))
                        continue;
                buf_addf(&b, "%s: %s\r\n", nm, h->headers[i].value);
        }
        if (!(h->status == 204 || h->status == 304))
                buf_addf(&b, "Content-Length: %zu\r\n", rp->body.len);
        if (extra_headers)
                buf_add(&b, extra_headers, strlen(extra_headers));
        if (c->close_after)
                buf_addf(&b, "Connection: close\r\n");
        buf_add(&b, "\r\n", 2);
        if (!(h->status == 204 || h->status == 304))
                buf_add(&b, rp->body.p, rp->body.len);
        int r = write_all(c->fd, b.p, b.len);
        buf_free(&b);
        return r;
}

/* The request head to send a node: the client's, with hop-by-hop headers
 * dropped (an Upgrade kept as such). body_len >= 0: the body is sent by the
 * router with this Content-Length instead of the client's framing. */
static void build_head(buf *b, const proxyreq *rq, long long body_len, bool upgrade) {
        buf_add(b, rq->method, strlen(rq->method));
        buf_add(b, " ", 1);
        buf_add(b, rq->path, rq->path_len);
        buf_add(b, " HTTP/1.1\r\n", 11);
        const proxyreq_header *ch = proxyreq_find_header(rq, "Connection");
        for (size_t i = 0; i < rq->n_headers; i++) {
                const proxyreq_header *h = &rq->headers[i];
                if (rhead_hop_by_hop(h->name, ch ? ch->value : NULL))
                        continue;
                if (body_len >= 0 &&
                    (strcasecmp(h->name, "Content-Length") == 0 ||
                     strcasecmp(h->name, "Transfer-Encoding") == 0))
                        continue;
                buf_add(b, h->name, h->name_len);
                buf_add(b, ": ", 2);
                buf_add(b, h->value, h->value_len);
                buf_add(b, "\r\n", 2);
        }
        if (upgrade) {
                const proxyreq_header *u = proxyreq_find_header(rq, "Upgrade");
                buf_addf(b, "Connection: Upgrade\r\nUpgrade: %.*s\r\n",
                         (int) (u ? u->value_len : 0), u ? u->value : "");
        }
        if (body_len >= 0 && (body_len > 0 || strcmp(rq->method, "GET") != 0))
                buf_addf(b, "Content-Length: %lld\r\n", body_len);
        buf_add(b, "\r\n", 2);
}

/* Read the request's whole body into out (bounded by max_body). */
static int read_body(client *c, const proxyreq *rq, buf *out) {
        if (rq->chunked) {
                chunked ck;
                chunked_init(&ck);
                buf raw = { 0 };
                for (;;) {
                        size_t used;
                        int q = chunked_feed(&ck, c->in, c->in_len, &used);
                        if (q < 0 || raw.len + used > cfg->max_body) {
                                buf_free(&raw);
                                return q < 0 ? -EBADMSG : -E2BIG;
                        }
                        buf_add(&raw, c->in, used);
                        memmove(c->in, c->in + used, c->in_len - used);
                        c->in_len -= used;
                        if (q == CHUNKED_DONE)
                                break;
                        ssize_t k = read_some(c->fd, c->in, sizeof c->in, HEAD_TIMEOUT_MS);
                        if (k <= 0) {
                                buf_free(&raw);
                                return -ECONNRESET;
                        }
                        c->in_len = (size_t) k;
                }
                /* decode */
                const char *p = raw.p, *e = raw.p + raw.len;
                while (p && p < e) {
                        char *x;
                        unsigned long long sz = strtoull(p, &x, 16);
                        const char *crlf = strstr(p, "\r\n");
                        if (!crlf || sz == 0 || (size_t) (e - crlf - 2) < sz)
                                break;
                        buf_add(out, crlf + 2, (size_t) sz);
                        p = crlf + 2 + sz + 2;
                }
                buf_free(&raw);
                if (!out->p)
                        buf_add(out, "", 0);
                return 0;
        }
        uint64_t want = rq->has_content_length ? rq->content_length : 0;
        if (want > cfg->max_body)
                return -E2BIG;
        buf_add(out, "", 0);
        while (out->len < want) {
                if (c->in_len == 0) {
                        ssize_t k = read_some(c->fd, c->in, sizeof c->in, HEAD_TIMEOUT_MS);
                        if (k <= 0)
                                return -ECONNRESET;
                        c->in_len = (size_t) k;
                }
                size_t take = c->in_len < want - out->len ? c->in_len : (size_t) (want - out->len);
                buf_add(out, c->in, take);
                memmove(c->in, c->in + take, c->in_len - take);
                c->in_len -= take;
        }
        return 0;
}

/* ------------------------------------------------------------- relaying */

enum { RELAY_OK = 0, RELAY_CLOSE = 1 };

#define SPLICE_MIN (256 * 1024) /* bodies at least this long left move through a pipe */
#define SPLICE_STEP (1024 * 1024)

/* Move exactly *left bytes from in to out through a pipe (splice(2)): the
 * bytes never enter the router's memory. *left counts down as they go.
 * -ECONNRESET when in ends first, -errno on a failed read or write. */
static int splice_body(int in, int out, uint64_t *left) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        (void) fcntl(p[1], F_SETPIPE_SZ, SPLICE_STEP);
        int r = 0;
        while (*left > 0) {
                size_t want = *left < SPLICE_STEP ? (size_t) *left : SPLICE_STEP;
                ssize_t n = splice(in, NULL, p[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_MORE);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        r = n == 0 ? -ECONNRESET : -errno;
                        break;
                }
                while (n > 0) {
                        ssize_t m = splice(p[0], NULL, out, NULL, (size_t) n,
                                           SPLICE_F_MOVE | SPLICE_F_MORE);
                        if (m < 0 && errno == EINTR)
                                continue;
                        if (m <= 0) {
                                r = m == 0 ? -EPIPE : -errno;
                                goto done;
                        }
                        n -= m;
                        *left -= (uint64_t) m;
                }
        }
done:
        close(p[0]);
        close(p[1]);
        return r;
}

/* A tunnel between the client and a node (an upgrade, an HTTP/2
 * connection) until it ends. half_close: a side's end is passed on as the
 * end of the other's write side and the other direction goes on (HTTP/2);
 * otherwise either side's end ends both (an Upgrade). */
static void tunnel(int cfd, nconn *nc, bool half_close) {
        char *tmp = malloc(RELAY_BUF);
        bool open[2] = { true, true }; /* reading from the client, from the node */
        while (tmp && (open[0] || open[1])) {
                bool pending = open[1] && nc_pending(nc);
                struct pollfd p[2] = { { .fd = open[0] ? cfd : -1, .events = POLLIN },
                                       { .fd = open[1] ? nc->fd : -1, .events = POLLIN } };
                if (poll(p, 2, pending ? 0 : -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (pending)
                        p[1].revents |= POLLIN;
                bool failed = false;
                if (p[0].revents) {
                        ssize_t t = recv(cfd, tmp, RELAY_BUF, 0);
                        if (t == 0 || (t < 0 && errno != EINTR)) {
                                open[0] = false;
                                nc_shutdown_write(nc);
                                failed = t < 0 || !half_close;
                        } else if (t > 0)
                                failed = nc_write_all(nc, tmp, (size_t) t) < 0;
                }
                if (!failed && p[1].revents) {
                        ssize_t t = nc_read_ready(nc, tmp, RELAY_BUF);
                        if (t == 0 || (t < 0 && t != -EAGAIN)) {
                                open[1] = false;
                                (void) shutdown(cfd, SHUT_WR);
                                failed = t < 0 || !half_close;
                        } else if (t > 0)
                                failed = write_all(cfd, tmp, (size_t) t) < 0;
                }
                if (failed)
                        break;
        }
        free(tmp);
}

/* Forward one request whose body streams from the client, and its response
 * (streams, 1xx, 101 upgrades) back, to node n. Returns RELAY_OK (the client
 * connection may carry the next request), RELAY_CLOSE, or -errno when
 * nothing reached the client and the node failed (the caller answers). */
static int relay(client *c, const proxyreq *rq, node *n) {
        const proxyreq_header *uh = proxyreq_find_header(rq, "Upgrade");
        bool upgrade = uh != NULL;
        buf head = { 0 };
        build_head(&head, rq, -1, upgrade);
        nconn nc = { .fd = -1 };
        bool reused = false;
        int r = 0;
        for (int attempt = 0; attempt < 2; attempt++) {
                r = node_conn(n, HEAD_TIMEOUT_MS, &nc, &reused);
                if (r < 0) {
                        buf_free(&head);
                        return r;
                }
                r = nc_write_all(&nc, head.p, head.len);
                if (r >= 0 || !reused)
                        break;
                nc_close(&nc);
        }
        buf_free(&head);
        if (r < 0) {
                nc_close(&nc);
                return r;
        }
        atomic_fetch_add(&n->forwarded, 1);

        /* request body framing */
        bool req_done = !rq->chunked && (!rq->has_content_length || rq->content_length == 0);
        uint64_t req_left = rq->has_content_length ? rq->content_length : 0;
        chunked rck;
        chunked_init(&rck);
        rhead *h = malloc(sizeof *h);
        if (!h) {
                nc_close(&nc);
                return -ENOMEM;
        }
        rhead_init(h);
        bool head_done = false, resp_done = false, sent_any = false, node_clean = true;
        uint64_t resp_left = 0;
        bool resp_close_delim = false;
        chunked sck;
        chunked_init(&sck);
        char *tmp = malloc(RELAY_BUF);
        if (!tmp) {
                free(h);
                nc_close(&nc);
                return -ENOMEM;
        }
        int result = RELAY_OK;
        size_t resp_got = 0;

/* feed client bytes at p..p+len into the request body; sets *used */
#define FEED_REQ(p, len, used)                                                                     \
        do {                                                                                       \
                if (rq->chunked) {                                                                 \
                        int q_ = chunked_feed(&rck, (p), (len), &(used));                          \
                        if (q_ < 0) {                                                              \
                                result = RELAY_CLOSE;                                              \
                                goto out;                                                          \
                        }                                                                          \
                        req_done = q_ == CHUNKED_DONE;                                             \
                } else {                                                                           \
                        (used) = (len) < req_left ? (len) : (size_t) req_left;                     \
                        req_left -= (used);                                                        \
                        req_done = req_left == 0;                                                  \
                }                                                                                  \
        } while (0)

        if (!req_done && c->in_len) {
                size_t used;
                FEED_REQ(c->in, c->in_len, used);
                if (nc_write_all(&nc, c->in, used) < 0)
                        node_clean = false;
                memmove(c->in, c->in + used, c->in_len - used);
                c->in_len -= used;
        }
        bool req_broken = false;
        /* (not with Expect: 100-continue: the client waits for the node's 100
         * first; not over TLS: the bytes must pass through OpenSSL) */
        if (!req_done && rq->has_content_length && req_left >= SPLICE_MIN &&
            !proxyreq_find_header(rq, "Expect") && !nc.ssl) {
                /* a large upload: client → node without a copy. A node that
                 * answers early (413) and closes ends it; its answer is read below */
                if (splice_body(c->fd, nc.fd, &req_left) < 0)
                        req_broken = true;
                req_done = true;
        }
        while (!resp_done) {
                /* with the request sent, the client is still watched for a
                 * hang-up (not for bytes: a pipelined request waits): a stream
                 * whose client left is ended at once, not at its next output */
                bool pending = nc_pending(&nc);
                struct pollfd p[2] = { { .fd = nc.fd, .events = POLLIN },
                                       { .fd = c->fd, .events = req_done ? POLLRDHUP : POLLIN } };
                int pr = poll(p, 2, pending ? 0 : -1);
                if (pr < 0 && errno == EINTR)
                        continue;
                if (pr < 0) {
                        result = RELAY_CLOSE;
                        goto out;
                }
                if (pending)
                        p[0].revents |= POLLIN;
                if (req_done && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                        node_clean = false;
                        result = RELAY_CLOSE;
                        goto out;
                }
                if (!req_done && p[1].revents) {
                        ssize_t k = recv(c->fd, tmp, RELAY_BUF, 0);
                        if (k <= 0) {
                                result = RELAY_CLOSE; /* the client left mid-body */
                                goto out;
                        }
                        size_t used;
                        FEED_REQ(tmp, (size_t) k, used);
                        if (nc_write_all(&nc, tmp, used) < 0)
                                node_clean = false;
                        if ((size_t) k > used) { /* the next request, pipelined */
                                size_t extra = (size_t) k - used;
                                if (extra > sizeof c->in - c->in_len) {
                                        result = RELAY_CLOSE;
                                        goto out;
                                }
                                memcpy(c->in + c->in_len, tmp + used, extra);
                                c->in_len += extra;
                        }
                }
                if (!p[0].revents)
                        continue;
                ssize_t k = nc_read_ready(&nc, tmp, RELAY_BUF);
                if (k == -EAGAIN)
                        continue;
                if (k <= 0) {
                        if (head_done && resp_close_delim) {
                                resp_done = true;
                                node_clean = false;
                                result = RELAY_CLOSE;
                                break;
                        }
                        if (!sent_any) {
                                /* a pooled connection the node had closed, and a request
                                 * with no body: the caller may send it again, fresh */
                                bool bodyless_req = !rq->chunked &&
                                        (!rq->has_content_length || rq->content_length == 0);
                                result = resp_got == 0 && reused && bodyless_req ? -EAGAIN
                                                                                 : -ECONNRESET;
                        } else
                                result = RELAY_CLOSE; /* cut mid-response: the client sees it cut */
                        node_clean = false;
                        goto out;
                }
                resp_got += (size_t) k;
                size_t off = 0;
                while (off < (size_t) k && !resp_done) {
                        if (!head_done) {
                                size_t used;
                                int q = rhead_feed(h, tmp + off, (size_t) k - off, &used);
                                if (q < 0) {
                                        log_warning("node %s: bad response head (%s)", n->id, h->why);
                                        node_clean = false;
                                        result = sent_any ? RELAY_CLOSE : -EBADMSG;
                                        goto out;
                                }
                                off += used;
                                if (q == RHEAD_NEED_MORE)
                                        break;
                                /* the head, to the client */
                                buf out = { 0 };
                                size_t sl = strcspn(h->buf, "\r");
                                buf_add(&out, h->buf, sl);
                                buf_add(&out, "\r\n", 2);
                                const char *conn = rhead_get(h, "Connection");
                                bool is101 = h->status == 101 && upgrade;
                                for (size_t i = 0; i < h->n_headers; i++) {
                                        if (rhead_hop_by_hop(h->headers[i].name, conn) && !is101)
                                                continue;
                                        buf_addf(&out, "%s: %s\r\n", h->headers[i].name,
                                                 h->headers[i].value);
                                }
                                bool informational = h->status >= 100 && h->status < 200 && !is101;
                                bool bodyless = rhead_bodyless(h, rq->method);
                                resp_close_delim = !informational && !bodyless &&
                                        !h->has_content_length && !h->chunked;
                                if (!informational && !is101 && (c->close_after || resp_close_delim))
                                        buf_addf(&out, "Connection: close\r\n");
                                buf_add(&out, "\r\n", 2);
                                int w = write_all(c->fd, out.p, out.len);
                                buf_free(&out);
                                sent_any = true;
                                if (w < 0) {
                                        result = RELAY_CLOSE;
                                        node_clean = false;
                                        goto out;
                                }
                                if (informational) {
                                        rhead_init(h);
                                        continue;
                                }
                                head_done = true;
                                if (is101) {
                                        /* a tunnel: whatever follows, both ways, until either side ends */
                                        if (off < (size_t) k &&
                                            write_all(c->fd, tmp + off, (size_t) k - off) < 0)
                                                goto tunnel_end;
                                        if (c->in_len && nc_write_all(&nc, c->in, c->in_len) < 0)
                                                goto tunnel_end;
                                        c->in_len = 0;
                                        tunnel(c->fd, &nc, false);
                                tunnel_end:
                                        node_clean = false;
                                        result = RELAY_CLOSE;
                                        goto out;
                                }
                                if (bodyless || (h->has_content_length && h->content_length == 0)) {
                                        resp_done = true;
                                        break;
                                }
                                resp_left = h->has_content_length ? h->content_length : 0;
                                continue;
                        }
                        /* body bytes */
                        size_t take = (size_t) k - off;
                        if (h->has_content_length) {
                                if (take > resp_left)
                                        take = (size_t) resp_left;
                                resp_left -= take;
                                resp_done = resp_left == 0;
                        } else if (h->chunked) {
                                size_t used;
                                int q = chunked_feed(&sck, tmp + off, take, &used);
                                if (q < 0) {
                                        log_warning("node %s: bad chunked response (%s)", n->id,
                                                    sck.why);
                                        if (write_all(c->fd, tmp + off, used) < 0) {
                                        }
                                        node_clean = false;
                                        result = RELAY_CLOSE;
                                        goto out;
                                }
                                take = used;
                                resp_done = q == CHUNKED_DONE;
                        }
                        if (write_all(c->fd, tmp + off, take) < 0) {
                                node_clean = false;
                                result = RELAY_CLOSE;
                                goto out;
                        }
                        off += take;
                }
                if (resp_done && off < (size_t) k)
                        node_clean = false; /* bytes after the response: never reuse that connection */
                if (!resp_done && head_done && h->has_content_length && req_done &&
                    resp_left >= SPLICE_MIN && !nc.ssl && !nc_pending(&nc)) {
                        /* a large download: node → client without a copy */
                        if (splice_body(nc.fd, c->fd, &resp_left) < 0) {
                                node_clean = false;
                                result = RELAY_CLOSE;
                                goto out;
                        }
                        resp_done = true;
                }
        }
#undef FEED_REQ
        if (!req_done) {
                /* answered before the body was all sent (an early 413): this
                 * client connection cannot be reused, nor the node's */
                node_clean = false;
                result = RELAY_CLOSE;
        }
        if (h->conn_close)
                node_clean = false;
        if (req_broken) {
                node_clean = false;
                result = RELAY_CLOSE;
        }
out:
        if (result == RELAY_OK && node_clean && head_done)
                node_conn_put(n, &nc);
        else
                nc_close(&nc);
        if (result < 0)
                atomic_fetch_add(&n->failures, 1);
        free(tmp);
        free(h);
        return result;
}

/* ------------------------------------------------------------- handlers */

static const char *query_param(const char *target, const char *name, char *out, size_t n) {
        const char *q = strchr(target, '?');
        size_t nl = strlen(name);
        while (q && *q) {
                q++;
                if (strncmp(q, name, nl) == 0 && q[nl] == '=') {
                        const char *v = q + nl + 1;
                        size_t l = strcspn(v, "&");
                        snprintf(out, n, "%.*s", (int) l, v);
                        return out;
                }
                q = strchr(q, '&');
        }
        return NULL;
}

typedef struct fan {
        node *n;
        const char *head;
        size_t head_len;
        const char *body;
        size_t body_len;
        reply rp;
        int r;
} fan;

static void *fan_one(void *arg) {
        fan *f = arg;
        f->r = exchange(f->n, f->head, f->head_len, f->body, f->body_len, CALL_TIMEOUT_MS, &f->rp);
        if (f->r < 0 && f->r != -EBADMSG)
                node_mark_down(f->n, strerror(-f->r));
        return NULL;
}

/* Ask every up node at once; f[i] for each. */
static unsigned fan_out(node **v, unsigned k, const char *head, size_t hl, const char *body,
                        size_t bl, fan *f) {
        pthread_t th[NODES_MAX];
        bool ok[NODES_MAX];
        for (unsigned i = 0; i < k; i++) {
                f[i] = (fan) { .n = v[i], .head = head, .head_len = hl, .body = body, .body_len = bl };
                ok[i] = pthread_create(&th[i], NULL, fan_one, &f[i]) == 0;
                if (!ok[i])
                        fan_one(&f[i]);
        }
        for (unsigned i = 0; i < k; i++)
                if (ok[i])
                        pthread_join(th[i], NULL);
        return k;
}

static int handle_list(client *c, const proxyreq *rq, bool snapshots) {
        node *up[NODES_MAX];
        unsigned k = nodes_up(up, NODES_MAX);
        if (k == 0) {
                atomic_fetch_add(&m_no_node, 1);
                return send_error(c, 503, "no hutch node is up");
        }
        buf head = { 0 };
        build_head(&head, rq, 0, false);
        fan *f = calloc(k, sizeof *f);
        if (!f) {
                buf_free(&head);
                return -ENOMEM;
        }
        fan_out(up, k, head.p, head.len, NULL, 0, f);
        buf_free(&head);
        int ret = 0;
        json_t *pages[NODES_MAX];
        unsigned np = 0;
        bool more = false, answered = false;
        for (unsigned i = 0; i < k && !answered; i++) {
                if (f[i].r < 0)
                        continue; /* a node lost meanwhile: its sandboxes are not listed */
                if (f[i].rp.head->status != 200) {
                        /* 400 bad token, 401 bad key: the same on every node */
                        ret = send_reply(c, &f[i].rp, NULL);
                        answered = true;
                        break;
                }
                json_t *j = json_loadb(f[i].rp.body.p, f[i].rp.body.len, 0, NULL);
                if (!json_is_array(j)) {
                        json_decref(j);
                        continue;
                }
                pages[np++] = j;
                if (rhead_get(f[i].rp.head, "X-Next-Token"))
                        more = true;
        }
        if (!answered) {
                char lim[16], ord[16];
                long limit = 100;
                if (query_param(rq->path, "limit", lim, sizeof lim))
                        limit = strtol(lim, NULL, 10);
                if (limit < 1 || limit > 1000)
                        limit = 100;
                bool asc = query_param(rq->path, "order", ord, sizeof ord) && streq(ord, "asc");
                json_t *merged;
                char token[96];
                if (np == 0)
                        ret = send_error(c, 503, "no hutch node answered the list");
                else if (rmerge(pages, np, snapshots, asc, (size_t) limit, more, &merged, token) < 0)
                        ret = send_error(c, 502,
                                         "a node answered the list with something else than a list");
                else {
                        char extra[160] = "";
                        if (token[0])
                                snprintf(extra, sizeof extra, "X-Next-Token: %s\r\n", token);
                        ret = send_json(c, 200, extra, merged);
                }
        }
        for (unsigned i = 0; i < np; i++)
                json_decref(pages[i]);
        for (unsigned i = 0; i < k; i++)
                reply_free(&f[i].rp);
        free(f);
        return ret;
}

/* The node's last /node listed the template (an image template's name). */
static bool node_has_template(const node *n, const char *tmpl) {
        size_t i;
        json_t *t;
        if (!tmpl || !json_is_array(n->templates))
                return false;
        json_array_foreach(n->templates, i, t) {
                if (json_string_value(t) && streq(json_string_value(t), tmpl))
                        return true;
        }
        return false;
}

static double node_score(const node *n) {
        double per = (double) (n->sandbox_mem_mb > 0 ? n->sandbox_mem_mb : 512) * 1048576.0;
        return (double) n->mem_free / per - (double) n->sandboxes;
}

static int create_forward(client *c, const proxyreq *rq) {
        buf body = { 0 };
        int r = read_body(c, rq, &body);
        if (r == -E2BIG) {
                c->close_after = true;
                return send_error(c, 413, "request body exceeds %llu bytes",
                                  (unsigned long long) cfg->max_body);
        }
        if (r < 0) {
                buf_free(&body);
                return r;
        }
        json_t *j = json_loadb(body.p, body.len, 0, NULL);
        const char *tmpl = j ? json_string_value(json_object_get(j, "templateID")) : NULL;
        char pinned[ROUTER_NODE_ID_LEN + 1] = "";
        char tmpl_name[128] = "";
        if (tmpl) {
                snprintf(tmpl_name, sizeof tmpl_name, "%s", tmpl);
                size_t tl = strlen(tmpl);
                if (tl == 25 && startswith(tmpl, "snap_") && rroute_sandbox_id_valid(tmpl + 5, 20))
                        memcpy(pinned, tmpl + 5, ROUTER_NODE_ID_LEN); /* a snapshot lives on its node */
        }
        json_decref(j);

        /* candidates: K sampled up, non-draining nodes, best first, then the rest */
        node *cand[NODES_MAX];
        unsigned nc = 0;
        /* a snapshot whose node is gone goes where a create would: a node
         * with template-registry restores it from there (docs/scale-out.md) */
        node *pinned_node = pinned[0] ? node_by_id(pinned) : NULL;
        if (pinned_node) {
                cand[nc++] = pinned_node;
        } else {
                node *up[NODES_MAX];
                unsigned k = nodes_up(up, NODES_MAX);
                pthread_mutex_lock(&nodes_mu);
                for (unsigned i = 0; i < k; i++)
                        if (!up[i]->draining)
                                cand[nc++] = up[i];
                /* shuffle; the nodes that have the template (an image
                 * template lives on the nodes it was pulled or imported
                 * to) first; then sort the first K of that group by score */
                for (unsigned i = nc; i > 1; i--) {
                        uint32_t x;
                        if (getrandom(&x, sizeof x, 0) != sizeof x)
                                x = (uint32_t) mono_ms();
                        unsigned jdx = x % i;
                        node *t = cand[i - 1];
                        cand[i - 1] = cand[jdx];
                        cand[jdx] = t;
                }
                unsigned nh = 0;
                for (unsigned i = 0; i < nc; i++)
                        if (node_has_template(cand[i], tmpl_name[0] ? tmpl_name : NULL)) {
                                node *t = cand[nh];
                                cand[nh++] = cand[i];
                                cand[i] = t;
                        }
                unsigned group = nh ? nh : nc;
                unsigned K = cfg->sample < group ? cfg->sample : group;
                for (unsigned i = 0; i < K; i++)
                        for (unsigned m = i + 1; m < K; m++)
                                if (node_score(cand[m]) > node_score(cand[i])) {
                                        node *t = cand[i];
                                        cand[i] = cand[m];
                                        cand[m] = t;
                                }
                pthread_mutex_unlock(&nodes_mu);
        }
        if (nc == 0) {
                buf_free(&body);
                atomic_fetch_add(&m_no_node, 1);
                return send_error(c, 503,
                                  "no hutch node takes new sandboxes (none up, or all draining)");
        }
        buf head = { 0 };
        build_head(&head, rq, (long long) body.len, false);
        int ret = -1;
        char last[200] = "";
        for (unsigned i = 0; i < nc; i++) {
                node *n = cand[i];
                reply rp = { 0 };
                r = exchange(n, head.p, head.len, body.p, body.len, CALL_TIMEOUT_MS, &rp);
                if (r < 0) {
                        snprintf(last, sizeof last, "node %s: %s", n->id, strerror(-r));
                        if (r != -EBADMSG && r != -ETIMEDOUT)
                                node_mark_down(n, strerror(-r));
                        atomic_fetch_add(&m_create_retries, 1);
                        continue;
                }
                if (rp.head->status == 404 && !pinned[0] && i + 1 < nc) {
                        /* the template is not on this node (a built
                         * template lives on the node that built it, and
                         * /node lists only image templates): the next one */
                        snprintf(last, sizeof last, "node %s: 404", n->id);
                        reply_free(&rp);
                        atomic_fetch_add(&m_create_retries, 1);
                        continue;
                }
                if (rp.head->status == 503 && i + 1 < nc) {
                        /* full or draining: the next one */
                        snprintf(last, sizeof last, "node %s: 503", n->id);
                        pthread_mutex_lock(&nodes_mu);
                        if (strstr(rp.body.p, "draining"))
                                n->draining = true;
                        pthread_mutex_unlock(&nodes_mu);
                        reply_free(&rp);
                        atomic_fetch_add(&m_create_retries, 1);
                        continue;
                }
                if (rp.head->status == 201) {
                        /* until the next poll says better: spread the next creates */
                        pthread_mutex_lock(&nodes_mu);
                        n->sandboxes++;
                        n->mem_free -= (n->sandbox_mem_mb > 0 ? n->sandbox_mem_mb : 512) * 1048576;
                        pthread_mutex_unlock(&nodes_mu);
                }
                ret = send_reply(c, &rp, NULL);
                reply_free(&rp);
                break;
        }
        if (ret == -1)
                ret = send_error(c, 503, "no hutch node took the sandbox (%s)", last);
        buf_free(&head);
        buf_free(&body);
        return ret;
}

/* ------------------------------------------------ cluster-wide team limit */

/* GET /node asked with the client's own key (X-API-Key, Authorization):
 * a node answers 401 for a bad one, and its teamSandboxes for that team. */
static void node_get_with_callers_key(buf *h, const proxyreq *rq, const char *host, size_t host_len) {
        buf_addf(h, "GET /node HTTP/1.1\r\nHost: %.*s\r\n", (int) host_len, host);
        const proxyreq_header *k = proxyreq_find_header(rq, "X-API-Key");
        const proxyreq_header *a = proxyreq_find_header(rq, "Authorization");
        if (k)
                buf_addf(h, "X-API-Key: %.*s\r\n", (int) k->value_len, k->value);
        if (a)
                buf_addf(h, "Authorization: %.*s\r\n", (int) a->value_len, a->value);
        buf_add(h, "\r\n", 2);
}

/* Creates this router has in flight, by the API key they came with (a hash
 * of its headers): a key's creates already sent but not yet answered are
 * not yet in every node's count. */
#define INFLIGHT_SLOTS 512
static pthread_mutex_t inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
        uint64_t key;
        unsigned n;
} inflight[INFLIGHT_SLOTS];

static uint64_t fnv1a(uint64_t h, const char *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                h = (h ^ (unsigned char) p[i]) * 1099511628211ull;
        return h;
}

static uint64_t caller_key_hash(const proxyreq *rq) {
        uint64_t h = 1469598103934665603ull;
        const proxyreq_header *k = proxyreq_find_header(rq, "X-API-Key");
        const proxyreq_header *a = proxyreq_find_header(rq, "Authorization");
        if (k)
                h = fnv1a(h, k->value, k->value_len);
        h = fnv1a(h, "\n", 1);
        if (a)
                h = fnv1a(h, a->value, a->value_len);
        return h;
}

/* Count one more create of key in flight; returns how many others were. */
static unsigned inflight_add(uint64_t key) {
        unsigned others = 0;
        pthread_mutex_lock(&inflight_mu);
        int slot = -1;
        for (int i = 0; i < INFLIGHT_SLOTS; i++) {
                if (inflight[i].n && inflight[i].key == key) {
                        slot = i;
                        break;
                }
                if (!inflight[i].n && slot < 0)
                        slot = i;
        }
        if (slot >= 0) { /* a full table only forgets what is in flight */
                others = inflight[slot].key == key ? inflight[slot].n : 0;
                inflight[slot].key = key;
                inflight[slot].n = others + 1;
        }
        pthread_mutex_unlock(&inflight_mu);
        return others;
}

static void inflight_drop(uint64_t key) {
        pthread_mutex_lock(&inflight_mu);
        for (int i = 0; i < INFLIGHT_SLOTS; i++)
                if (inflight[i].n && inflight[i].key == key) {
                        inflight[i].n--;
                        break;
                }
        pthread_mutex_unlock(&inflight_mu);
}

/* A cluster-wide limit of what a team holds: the sum of every up node's
 * count of the caller's team (GET /node asked with the caller's key
 * answers `field`, its own team's only) plus the caller's others in flight
 * here must stay under `limit`. */
typedef struct team_limit {
        const char *field; /* teamSandboxes, teamSnapshots */
        const char *what;  /* in the 429's message */
        uint64_t salt;     /* keeps its in-flight count apart from the other limit's */
        atomic_uint_fast64_t *refusals;
} team_limit;

static const team_limit sandbox_limit = { "teamSandboxes", "live sandboxes", 0, &m_team_limit };
static const team_limit snapshot_limit = { "teamSnapshots", "snapshots", 0x5a17ull, &m_team_snapshot_limit };

/* 1 when the answer was sent (429, or a node's 401 for a bad key), 0 to go
 * on, -errno. */
static int team_limit_refused(client *c, const proxyreq *rq, const team_limit *tl, unsigned limit,
                              unsigned in_flight) {
        node *up[NODES_MAX];
        unsigned k = nodes_up(up, NODES_MAX);
        if (k == 0)
                return 0; /* the forward says there is no node */
        buf h = { 0 };
        /* the client's Host, as lists are asked (a node reads a sandbox
         * domain's name as ingress: the router's own name is none) */
        const proxyreq_header *hh = proxyreq_find_header(rq, "Host");
        node_get_with_callers_key(&h, rq, hh ? hh->value : "hutch", hh ? hh->value_len : 5);
        fan *f = calloc(k, sizeof *f);
        if (!f) {
                buf_free(&h);
                return -ENOMEM;
        }
        fan_out(up, k, h.p, h.len, NULL, 0, f);
        buf_free(&h);
        unsigned long long held = 0;
        unsigned counted = 0;
        int r = 0;
        for (unsigned i = 0; i < k; i++) {
                if (f[i].r < 0)
                        continue;
                if (f[i].rp.head->status == 401 && r == 0) {
                        r = send_reply(c, &f[i].rp, NULL);
                        r = r < 0 ? r : 1;
                }
                json_t *j = f[i].rp.head->status == 200 ? json_loadb(f[i].rp.body.p, f[i].rp.body.len, 0, NULL)
                                                        : NULL;
                json_t *v = json_object_get(j, tl->field);
                if (json_is_integer(v) && json_integer_value(v) >= 0) {
                        held += (unsigned long long) json_integer_value(v);
                        counted++;
                }
                json_decref(j);
        }
        for (unsigned i = 0; i < k; i++)
                reply_free(&f[i].rp);
        free(f);
        if (r == 0 && held + in_flight >= limit) {
                atomic_fetch_add(tl->refusals, 1);
                r = send_error(c, 429, "team has reached its limit of %u %s across the cluster (%llu on %u node(s)%s)",
                               limit, tl->what, held + in_flight, counted,
                               in_flight ? ", creates in flight included" : "");
                r = r < 0 ? r : 1;
        }
        return r;
}

/* Count the request against tl's limit; 1: answered (refused), 0: go on and
 * call team_limit_done() after forwarding, -errno. */
static int team_limit_enter(client *c, const proxyreq *rq, const team_limit *tl, unsigned limit,
                            uint64_t *ret_key) {
        *ret_key = caller_key_hash(rq) ^ tl->salt;
        int r = team_limit_refused(c, rq, tl, limit, inflight_add(*ret_key));
        if (r == 0)
                return 0;
        inflight_drop(*ret_key);
        if (r > 0) /* answered before its body was read */
                c->close_after = c->close_after || rq->has_content_length || rq->chunked;
        return r;
}

static int handle_create(client *c, const proxyreq *rq) {
        if (!cfg->max_sandboxes_per_team)
                return create_forward(c, rq);
        uint64_t key;
        int r = team_limit_enter(c, rq, &sandbox_limit, cfg->max_sandboxes_per_team, &key);
        if (r != 0)
                return r < 0 ? r : 0;
        r = create_forward(c, rq);
        inflight_drop(key);
        return r;
}

/* POST /sandboxes/<id>/snapshots (createSnapshot): what
 * --max-snapshots-per-team counts. */
static bool is_snapshot_create(const proxyreq *rq, const char *target, const char *id) {
        size_t il = strlen(id);
        if (!streq(rq->method, "POST") || !startswith(target, "/sandboxes/"))
                return false;
        const char *p = target + strlen("/sandboxes/");
        if (strncmp(p, id, il) != 0 || !startswith(p + il, "/snapshots"))
                return false;
        p += il + strlen("/snapshots");
        return *p == '\0' || *p == '?';
}

/* POST/DELETE /secrets…: every node keeps the team's secrets, so each write
 * goes to every up node; the answer is the first node's (node-id order). */
static int handle_broadcast(client *c, const proxyreq *rq) {
        buf body = { 0 };
        int r = read_body(c, rq, &body);
        if (r == -E2BIG) {
                c->close_after = true;
                return send_error(c, 413, "request body exceeds %llu bytes",
                                  (unsigned long long) cfg->max_body);
        }
        if (r < 0) {
                buf_free(&body);
                return r;
        }
        node *up[NODES_MAX];
        unsigned k = nodes_up(up, NODES_MAX);
        if (k == 0) {
                buf_free(&body);
                return send_error(c, 503, "no hutch node is up");
        }
        buf head = { 0 };
        build_head(&head, rq, (long long) body.len, false);
        fan *f = calloc(k, sizeof *f);
        if (!f) {
                buf_free(&head);
                buf_free(&body);
                return -ENOMEM;
        }
        fan_out(up, k, head.p, head.len, body.p, body.len, f);
        int ret = -1;
        for (unsigned i = 0; i < k; i++) {
                if (f[i].r < 0)
                        continue;
                if (ret == -1)
                        ret = send_reply(c, &f[i].rp, NULL);
                else if (f[i].rp.head->status / 100 != f[0].rp.head->status / 100)
                        log_warning("%s %.*s: node %s answered %u, node %s %u", rq->method,
                                    (int) rq->path_len, rq->path, f[i].n->id, f[i].rp.head->status,
                                    f[0].n->id, f[0].rp.head->status);
        }
        if (ret == -1)
                ret = send_error(c, 503, "no hutch node answered");
        for (unsigned i = 0; i < k; i++)
                reply_free(&f[i].rp);
        free(f);
        buf_free(&head);
        buf_free(&body);
        return ret;
}

/* /files?signature=… with no id (uploadUrl()/downloadUrl() pointed at the
 * router): the node whose sandbox signed it is the one that does not answer
 * 401/404/502; the body is held so that it can be sent to each in turn. */
static int handle_signed_files(client *c, const proxyreq *rq) {
        buf body = { 0 };
        int r = read_body(c, rq, &body);
        if (r == -E2BIG) {
                c->close_after = true;
                return send_error(c, 413,
                                  "a signed upload through the router is limited to %llu bytes; "
                                  "send the E2b-Sandbox-Id header (files.write) for larger files",
                                  (unsigned long long) cfg->max_body);
        }
        if (r < 0) {
                buf_free(&body);
                return r;
        }
        node *up[NODES_MAX];
        unsigned k = nodes_up(up, NODES_MAX);
        buf head = { 0 };
        build_head(&head, rq, (long long) body.len, false);
        int ret = -1;
        reply keep = { 0 };
        for (unsigned i = 0; i < k; i++) {
                reply rp = { 0 };
                if (exchange(up[i], head.p, head.len, body.p, body.len, CALL_TIMEOUT_MS, &rp) < 0)
                        continue;
                unsigned s = rp.head->status;
                /* "invalid signature": no sandbox of that node made it; any
                 * other answer (expired, wrong user…) is the owner's */
                if ((s == 401 && strstr(rp.body.p, "invalid signature")) || s == 404 || s == 502) {
                        if (!keep.head)
                                keep = rp;
                        else
                                reply_free(&rp);
                        continue;
                }
                ret = send_reply(c, &rp, NULL);
                reply_free(&rp);
                break;
        }
        if (ret == -1)
                ret = keep.head ? send_reply(c, &keep, NULL)
                                : send_error(c, 503, "no hutch node is up");
        reply_free(&keep);
        buf_free(&head);
        buf_free(&body);
        return ret;
}

static int handle_health(client *c) {
        unsigned up = 0, known = 0;
        pthread_mutex_lock(&nodes_mu);
        json_t *arr = json_array();
        for (unsigned i = 0; i < n_nodes; i++) {
                if (nodes[i]->gone)
                        continue;
                known++;
                up += nodes[i]->up;
                json_array_append_new(arr,
                                      json_pack("{s:s, s:s, s:b, s:b, s:I}", "nodeID", nodes[i]->id,
                                                "address", nodes[i]->addr, "up", nodes[i]->up,
                                                "draining", nodes[i]->draining, "sandboxes",
                                                (json_int_t) nodes[i]->sandboxes));
        }
        pthread_mutex_unlock(&nodes_mu);
        return send_json(c, up ? 200 : 503, NULL,
                         json_pack("{s:s, s:i, s:i, s:o}", "status", up ? "ok" : "no node up",
                                   "nodesUp", (int) up, "nodesKnown", (int) known, "nodes", arr));
}

static int handle_metrics(client *c) {
        static const char *const kinds[] = { "bad",    "health",      "metrics",   "sandbox",
                                             "create", "list",        "snapshots", "broadcast",
                                             "any",    "signed_files" };
        buf b = { 0 };
        buf_addf(&b,
                 "# HELP hutch_router_requests_total Requests by how they were routed.\n"
                 "# TYPE hutch_router_requests_total counter\n");
        for (size_t i = 0; i < ELEMENTSOF(kinds); i++)
                buf_addf(&b, "hutch_router_requests_total{route=\"%s\"} %llu\n", kinds[i],
                         (unsigned long long) atomic_load(&m_requests[i]));
        buf_addf(&b,
                 "# TYPE hutch_router_create_retries_total counter\nhutch_router_create_retries_total %llu\n"
                 "# TYPE hutch_router_node_errors_total counter\nhutch_router_node_errors_total %llu\n"
                 "# TYPE hutch_router_no_node_total counter\nhutch_router_no_node_total %llu\n"
                 "# TYPE hutch_router_connections_total counter\nhutch_router_connections_total %llu\n"
                 "# TYPE hutch_router_connections_open gauge\nhutch_router_connections_open %llu\n"
                 "# TYPE hutch_router_connections_refused_total counter\nhutch_router_connections_refused_total %llu\n"
                 "# TYPE hutch_router_team_limit_refusals_total counter\nhutch_router_team_limit_refusals_total %llu\n"
                 "# TYPE hutch_router_team_snapshot_limit_refusals_total counter\n"
                 "hutch_router_team_snapshot_limit_refusals_total %llu\n",
                 (unsigned long long) atomic_load(&m_create_retries),
                 (unsigned long long) atomic_load(&m_node_errors),
                 (unsigned long long) atomic_load(&m_no_node),
                 (unsigned long long) atomic_load(&m_conns),
                 (unsigned long long) atomic_load(&m_conns_open),
                 (unsigned long long) atomic_load(&m_refused),
                 (unsigned long long) atomic_load(&m_team_limit),
                 (unsigned long long) atomic_load(&m_team_snapshot_limit));
        buf_addf(&b,
                 "# TYPE hutch_router_node_up gauge\n# TYPE hutch_router_node_sandboxes gauge\n"
                 "# TYPE hutch_router_node_forwarded_total counter\n");
        pthread_mutex_lock(&nodes_mu);
        for (unsigned i = 0; i < n_nodes; i++) {
                node *n = nodes[i];
                if (n->gone)
                        continue;
                buf_addf(&b,
                         "hutch_router_node_up{node=\"%s\",address=\"%s\"} %d\n"
                         "hutch_router_node_sandboxes{node=\"%s\"} %lld\n"
                         "hutch_router_node_forwarded_total{node=\"%s\"} %llu\n",
                         n->id, n->addr, n->up ? 1 : 0, n->id, (long long) n->sandboxes, n->id,
                         (unsigned long long) atomic_load(&n->forwarded));
        }
        pthread_mutex_unlock(&nodes_mu);
        char head[256];
        int hl = snprintf(
                head, sizeof head,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %zu\r\n%s\r\n",
                b.len, c->close_after ? "Connection: close\r\n" : "");
        int r = write_all(c->fd, head, (size_t) hl);
        if (r >= 0)
                r = write_all(c->fd, b.p, b.len);
        buf_free(&b);
        return r;
}

/* Whether a node refuses the client's API key: 1 (its 401 was sent), 0
 * (accepted, or no node to ask), -errno when sending failed. */
static int key_refused(client *c, const proxyreq *rq) {
        node *up[NODES_MAX];
        if (nodes_up(up, NODES_MAX) == 0)
                return 0;
        buf h = { 0 };
        node_get_with_callers_key(&h, rq, up[0]->addr, strlen(up[0]->addr));
        reply rp = { 0 };
        int r = exchange(up[0], h.p, h.len, NULL, 0, CALL_TIMEOUT_MS, &rp);
        buf_free(&h);
        if (r < 0 || rp.head->status != 401) {
                reply_free(&rp);
                return 0;
        }
        r = send_reply(c, &rp, NULL);
        reply_free(&rp);
        return r < 0 ? r : 1;
}

/* One request on a client connection: 0 to read the next, < 0 to close. */
static int serve_one(client *c, proxyreq *rq) {
        proxyreq_init_origin(rq);
        int64_t deadline = -1;
        for (;;) {
                size_t used = 0;
                int q = c->in_len ? proxyreq_feed(rq, c->in, c->in_len, &used) : PROXYREQ_NEED_MORE;
                if (q < 0) {
                        c->close_after = true;
                        send_error(c, q == -E2BIG ? 431 : 400, "bad request: %s",
                                   rq->why ? rq->why : "malformed");
                        return -1;
                }
                memmove(c->in, c->in + used, c->in_len - used);
                c->in_len -= used;
                if (q == PROXYREQ_DONE)
                        break;
                int to = deadline >= 0 ? (int) (deadline - mono_ms())
                        : c->served    ? CLIENT_IDLE_MS
                                       : FIRST_IDLE_MS;
                if (to <= 0)
                        return -1;
                ssize_t k = read_some(c->fd, c->in, sizeof c->in, to);
                if (k <= 0)
                        return -1;
                c->in_len = (size_t) k;
                if (deadline < 0)
                        deadline = mono_ms() + HEAD_TIMEOUT_MS;
        }
        c->served++;
        const proxyreq_header *conn = proxyreq_find_header(rq, "Connection");
        if (rq->version_minor == 0 || (conn && strcasestr(conn->value, "close")))
                c->close_after = true;
        char target[8192];
        snprintf(target, sizeof target, "%.*s", (int) rq->path_len, rq->path);
        const proxyreq_header *hh = proxyreq_find_header(rq, "Host");
        const proxyreq_header *sid = proxyreq_find_header(rq, "E2b-Sandbox-Id");
        const proxyreq_header *sport = proxyreq_find_header(rq, "E2b-Sandbox-Port");
        rroute rt;
        rroute_decide(rq->method, target, hh ? hh->value : NULL, sid ? sid->value : NULL,
                      sport ? sport->value : NULL, &rt);
        atomic_fetch_add(&m_requests[rt.kind], 1);
        int r;
        switch (rt.kind) {
        case RR_HEALTH:
                return handle_health(c);
        case RR_METRICS:
                return handle_metrics(c);
        case RR_LIST:
        case RR_SNAPSHOTS:
                if (rq->has_content_length && rq->content_length > 0) {
                        c->close_after = true;
                        return send_error(c, 400, "a list takes no body");
                }
                return handle_list(c, rq, rt.kind == RR_SNAPSHOTS);
        case RR_CREATE:
                return handle_create(c, rq);
        case RR_BROADCAST:
                return handle_broadcast(c, rq);
        case RR_SIGNED_FILES:
                return handle_signed_files(c, rq);
        case RR_BAD:
                c->close_after = true;
                if (rt.data_plane)
                        return send_data_plane_gone(c, "",
                                                    "The sandbox was not found: not a sandbox id");
                return send_error(c, 404, "sandbox not found: not a sandbox id");
        case RR_SANDBOX: {
                node *n = node_by_id(rt.node);
                if (!n) {
                        atomic_fetch_add(&m_no_node, 1);
                        c->close_after = c->close_after || rq->has_content_length || rq->chunked;
                        char msg[200];
                        snprintf(msg, sizeof msg,
                                 "%s %s: its node %s is not reachable (down, or unknown to this router)",
                                 startswith(rt.id, "snap_") ? "snapshot" : "sandbox", rt.id, rt.node);
                        if (rt.data_plane)
                                return send_data_plane_gone(c, rt.id, msg);
                        /* a bad key is a 401 before anything else, as on one
                         * daemon: a node checks it (GET /node with the client's key) */
                        r = key_refused(c, rq);
                        if (r != 0)
                                return r < 0 ? r : 0;
                        return send_error(c, 404, "%s", msg);
                }
                uint64_t snap_key = 0;
                if (cfg->max_snapshots_per_team && is_snapshot_create(rq, target, rt.id)) {
                        r = team_limit_enter(c, rq, &snapshot_limit, cfg->max_snapshots_per_team, &snap_key);
                        if (r != 0)
                                return r < 0 ? r : 0;
                }
                r = relay(c, rq, n);
                if (r == -EAGAIN)
                        r = relay(c, rq, n);
                if (snap_key)
                        inflight_drop(snap_key);
                if (r < 0) {
                        node_mark_down(n, strerror(-r));
                        c->close_after = true;
                        char msg[200];
                        snprintf(msg, sizeof msg, "sandbox %s: its node %s did not answer (%s)",
                                 rt.id, rt.node, strerror(-r));
                        if (rt.data_plane)
                                return send_data_plane_gone(c, rt.id, msg);
                        return send_error(c, 404, "%s", msg);
                }
                return r == RELAY_OK ? 0 : -1;
        }
        case RR_ANY:
        default: {
                node *up[NODES_MAX];
                unsigned k = nodes_up(up, NODES_MAX);
                if (k == 0) {
                        c->close_after = true;
                        return send_error(c, 503, "no hutch node is up");
                }
                r = relay(c, rq, up[0]);
                if (r == -EAGAIN)
                        r = relay(c, rq, up[0]);
                if (r < 0) {
                        node_mark_down(up[0], strerror(-r));
                        c->close_after = true;
                        return send_error(c, 502, "node %s did not answer (%s)", up[0]->id,
                                          strerror(-r));
                }
                return r == RELAY_OK ? 0 : -1;
        }
        }
}

/* ---------------------------------------------------------------- HTTP/2 */

/* h2c with prior knowledge (docs/scale-out.md "What the router does with each request"): the first
 * request's header block names the sandbox port as an HTTP/1.1 request's
 * Host or E2b-Sandbox-* headers do; the connection, every byte of it from
 * the preface on, is then relayed to that sandbox's node, which checks
 * every stream itself (a later stream that names another sandbox ends the
 * connection with GOAWAY there, docs/api.md). Bounds as the daemon's. */
#define H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2_PREFACE_LEN 24
#define H2_FRAME_HDR 9
#define H2_FRAME_MAX 16384 /* SETTINGS_MAX_FRAME_SIZE: the node has not raised it yet */
#define H2_BLOCK_MAX 65536
#define H2_BLOCK_FRAMES_MAX 32
#define H2_HEAD_FRAMES_MAX 64
#define H2_HEAD_MAX (H2_PREFACE_LEN + H2_BLOCK_MAX + 4 * H2_FRAME_MAX)
#define H2_DRAIN_MS 2000

typedef struct h2_fields {
        char authority[300], host[300], sid[64], sport[16], method[32], path[8192];
        bool bad;
} h2_fields;

static void h2_copy(char *dst, size_t cap, bool *bad, const char *v, size_t vl) {
        if (dst[0] || vl >= cap || memchr(v, 0, vl)) {
                *bad = true; /* repeated, too long, or a NUL */
                return;
        }
        memcpy(dst, v, vl);
        dst[vl] = 0;
}

static int h2_field(void *ud, const char *n, size_t nl, const char *v, size_t vl) {
        h2_fields *f = ud;
        for (size_t i = 0; i < nl; i++)
                if (n[i] >= 'A' && n[i] <= 'Z')
                        f->bad = true; /* RFC 9113 §8.2.1: lowercase on the wire */
#define IS(s) (nl == sizeof(s) - 1 && memcmp(n, s, nl) == 0)
        if (IS(":authority"))
                h2_copy(f->authority, sizeof f->authority, &f->bad, v, vl);
        else if (IS("host"))
                h2_copy(f->host, sizeof f->host, &f->bad, v, vl);
        else if (IS("e2b-sandbox-id"))
                h2_copy(f->sid, sizeof f->sid, &f->bad, v, vl);
        else if (IS("e2b-sandbox-port"))
                h2_copy(f->sport, sizeof f->sport, &f->bad, v, vl);
        else if (IS(":method"))
                h2_copy(f->method, sizeof f->method, &f->bad, v, vl);
        else if (IS(":path"))
                h2_copy(f->path, sizeof f->path, &f->bad, v, vl);
#undef IS
        return 0;
}

static void h2_frame(buf *b, uint8_t type, uint8_t flags, uint32_t sid, const void *p, size_t n) {
        uint8_t h[H2_FRAME_HDR] = { (uint8_t) (n >> 16),
                                    (uint8_t) (n >> 8),
                                    (uint8_t) n,
                                    type,
                                    flags,
                                    (uint8_t) (sid >> 24 & 0x7f),
                                    (uint8_t) (sid >> 16),
                                    (uint8_t) (sid >> 8),
                                    (uint8_t) sid };
        buf_add(b, h, sizeof h);
        if (n)
                buf_add(b, p, n);
}

/* Write what b holds, then shut the write side and read (and drop) the
 * client's bytes until it closes, a while at most: closing with unread
 * bytes would send a RST, which can destroy the answer unread. */
static void h2_send_and_drain(client *c, buf *b) {
        if (write_all(c->fd, b->p, b->len) == 0) {
                (void) shutdown(c->fd, SHUT_WR);
                int64_t end = mono_ms() + H2_DRAIN_MS;
                char tmp[4096];
                while (mono_ms() < end &&
                       read_some(c->fd, tmp, sizeof tmp, (int) (end - mono_ms())) > 0) {
                }
        }
        buf_free(b);
}

/* No stream to answer on: the server preface (an empty SETTINGS), GOAWAY. */
static void h2_goaway(client *c, uint32_t code, const char *why) {
        buf b = { 0 };
        uint8_t p[8 + 128];
        size_t dl = strlen(why) < 128 ? strlen(why) : 128;
        for (int i = 0; i < 4; i++) {
                p[i] = 0;
                p[4 + i] = (uint8_t) (code >> (24 - 8 * i));
        }
        memcpy(p + 8, why, dl);
        h2_frame(&b, 4, 0, 0, NULL, 0);
        h2_frame(&b, 7, 0, 0, p, 8 + dl);
        h2_send_and_drain(c, &b);
}

/* The router's own answer to the first request (stream sid), as JSON. */
static void h2_answer(client *c, uint32_t sid, unsigned status, json_t *body) {
        char *s = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        const char *j = s ? s : "{}";
        size_t n = strlen(j);
        uint8_t block[256];
        char st[8], cl[24];
        snprintf(st, sizeof st, "%u", status);
        snprintf(cl, sizeof cl, "%zu", n);
        size_t bl = 0;
        ssize_t k = hpack_put_literal(block, sizeof block, ":status", st, strlen(st));
        bl += k > 0 ? (size_t) k : 0;
        k = hpack_put_literal(block + bl, sizeof block - bl, "content-type", "application/json",
                              strlen("application/json"));
        bl += k > 0 ? (size_t) k : 0;
        k = hpack_put_literal(block + bl, sizeof block - bl, "content-length", cl, strlen(cl));
        bl += k > 0 ? (size_t) k : 0;
        uint8_t ga[8] = { (uint8_t) (sid >> 24 & 0x7f),
                          (uint8_t) (sid >> 16),
                          (uint8_t) (sid >> 8),
                          (uint8_t) sid,
                          0,
                          0,
                          0,
                          0 };
        buf b = { 0 };
        h2_frame(&b, 4, 0, 0, NULL, 0);
        h2_frame(&b, 1, 0x4, sid, block, bl);
        h2_frame(&b, 0, 0x1, sid, j, n);
        h2_frame(&b, 7, 0, 0, ga, sizeof ga);
        free(s);
        h2_send_and_drain(c, &b);
}

/* The connection began with the preface (read into c->in). */
static void serve_h2(client *c) {
        buf in = { 0 };
        buf_add(&in, c->in, c->in_len);
        c->in_len = 0;
        size_t at = H2_PREFACE_LEN, bl_frames = 0, head_frames = 0;
        uint32_t hstream = 0;
        buf block = { 0 };
        hpack_decoder hp;
        h2_fields *f = calloc(1, sizeof *f);
        bool hp_ok = hpack_decoder_init(&hp, 65536) == 0;
        int64_t deadline = mono_ms() + FIRST_IDLE_MS;
        if (!f || !hp_ok)
                goto out;
        for (;;) {
                /* whole frames at in[at..] */
                while (in.len - at >= H2_FRAME_HDR) {
                        const uint8_t *p = (const uint8_t *) in.p + at;
                        size_t len = (size_t) p[0] << 16 | (size_t) p[1] << 8 | p[2];
                        uint8_t type = p[3], flags = p[4];
                        uint32_t sid = ((uint32_t) p[5] << 24 | (uint32_t) p[6] << 16 |
                                        (uint32_t) p[7] << 8 | p[8]) &
                                0x7fffffffu;
                        if (len > H2_FRAME_MAX) {
                                h2_goaway(c, 6, "frame too large");
                                goto out;
                        }
                        if (in.len - at < H2_FRAME_HDR + len)
                                break;
                        at += H2_FRAME_HDR + len;
                        if (bl_frames && (type != 9 || sid != hstream)) {
                                h2_goaway(c, 1, "a header block interrupted");
                                goto out;
                        }
                        if (type != 1 && type != 9) {
                                if ((type != 4 && type != 8 && type != 2 && type != 6) ||
                                    ++head_frames > H2_HEAD_FRAMES_MAX) {
                                        h2_goaway(c, 1, "unexpected frame before the first request");
                                        goto out;
                                }
                                continue;
                        }
                        const uint8_t *frag = p + H2_FRAME_HDR;
                        size_t fl = len;
                        if (type == 9 && !bl_frames) {
                                h2_goaway(c, 1, "CONTINUATION without HEADERS");
                                goto out;
                        }
                        if (type == 1) {
                                size_t pad = 0, off = 0;
                                if (flags & 0x8) {
                                        pad = len ? frag[0] : 0;
                                        off = 1;
                                }
                                if (flags & 0x20)
                                        off += 5;
                                if (sid == 0 || !(sid & 1) || off + pad > len) {
                                        h2_goaway(c, 1, "bad HEADERS frame");
                                        goto out;
                                }
                                frag += off;
                                fl = len - off - pad;
                                hstream = sid;
                        }
                        if (++bl_frames > H2_BLOCK_FRAMES_MAX || block.len + fl > H2_BLOCK_MAX) {
                                h2_goaway(c, 0xb, "header block too large (CONTINUATION flood)");
                                goto out;
                        }
                        buf_add(&block, frag, fl);
                        if (!(flags & 0x4))
                                continue;
                        int r = hpack_decode(&hp, (const uint8_t *) block.p, block.len, 65536,
                                             h2_field, f);
                        if (r < 0) {
                                h2_goaway(c, r == -E2BIG ? 0xb : 9,
                                          r == -E2BIG ? "header list too large" : "bad header block");
                                goto out;
                        }
                        goto routed;
                }
                if (in.len > H2_HEAD_MAX) {
                        h2_goaway(c, 0xb, "too much before the first request");
                        goto out;
                }
                char tmp[16384];
                int to = (int) (deadline - mono_ms());
                ssize_t k = to > 0 ? read_some(c->fd, tmp, sizeof tmp, to) : -ETIMEDOUT;
                if (k == -ETIMEDOUT) {
                        h2_goaway(c, 0, "no request in time");
                        goto out;
                }
                if (k <= 0)
                        goto out;
                buf_add(&in, tmp, (size_t) k);
        }
routed:;
        const char *host = f->authority[0] ? f->authority : f->host[0] ? f->host : NULL;
        rroute rt;
        if (f->bad) {
                h2_answer(c, hstream, 400,
                          json_pack("{s:i, s:s}", "code", 400, "message", "malformed request fields"));
                goto out;
        }
        rroute_decide(f->method[0] ? f->method : "GET", f->path[0] ? f->path : "/", host,
                      f->sid[0] ? f->sid : NULL, f->sport[0] ? f->sport : NULL, &rt);
        atomic_fetch_add(&m_requests[rt.kind], 1);
        node *n = NULL;
        if (rt.kind == RR_SANDBOX) {
                n = node_by_id(rt.node);
                if (!n) {
                        atomic_fetch_add(&m_no_node, 1);
                        char msg[200];
                        snprintf(msg, sizeof msg,
                                 "sandbox %s: its node %s is not reachable (down, or unknown to this router)",
                                 rt.id, rt.node);
                        h2_answer(c, hstream, 502,
                                  json_pack("{s:s, s:s, s:i}", "sandboxId", rt.id, "message", msg,
                                            "code", 502));
                        goto out;
                }
        } else if (rt.kind == RR_BAD) {
                h2_answer(c, hstream, 502,
                          json_pack("{s:s, s:s, s:i}", "sandboxId", "", "message",
                                    "The sandbox was not found: not a sandbox id", "code", 502));
                goto out;
        } else {
                /* no sandbox named: any node answers as the daemon does
                 * (HTTP/2 serves sandbox ports only) */
                node *up[NODES_MAX];
                if (nodes_up(up, NODES_MAX) == 0) {
                        h2_answer(c, hstream, 503,
                                  json_pack("{s:i, s:s}", "code", 503, "message",
                                            "no hutch node is up"));
                        goto out;
                }
                n = up[0];
        }
        if (tls_ctx) {
                /* a node serves HTTP/2 only without TLS (docs/api.md) */
                h2_answer(c, hstream, 502,
                          json_pack("{s:s, s:s, s:i}", "sandboxId", rt.id, "message",
                                    "HTTP/2 through a router whose nodes serve TLS is not built: "
                                    "use HTTP/1.1 (WebSocket and other upgrades work)",
                                    "code", 502));
                goto out;
        }
        nconn nc;
        int dr = nc_dial(n, HEAD_TIMEOUT_MS, &nc);
        if (dr < 0) {
                node_mark_down(n, strerror(-dr));
                atomic_fetch_add(&n->failures, 1);
                char msg[200];
                snprintf(msg, sizeof msg, "sandbox %s: its node %s did not answer (%s)", rt.id,
                         n->id, strerror(-dr));
                h2_answer(c, hstream, 502,
                          json_pack("{s:s, s:s, s:i}", "sandboxId", rt.id, "message", msg, "code",
                                    502));
                goto out;
        }
        atomic_fetch_add(&n->forwarded, 1);
        /* everything read, the preface first, goes to the node intact */
        if (nc_write_all(&nc, in.p, in.len) == 0) {
                buf_free(&in);
                tunnel(c->fd, &nc, true);
        }
        nc_close(&nc);
out:
        if (hp_ok)
                hpack_decoder_done(&hp);
        free(f);
        buf_free(&block);
        buf_free(&in);
}

/* A new connection: whether it opens with the HTTP/2 preface. 1: it does,
 * 0: not (what was read stays in c->in for serve_one), -1: closed. */
static int sniff_h2(client *c) {
        int64_t deadline = mono_ms() + FIRST_IDLE_MS;
        while (c->in_len < H2_PREFACE_LEN) {
                int to = (int) (deadline - mono_ms());
                if (to <= 0)
                        return -1;
                ssize_t k = read_some(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, to);
                if (k <= 0)
                        return -1;
                c->in_len += (size_t) k;
                size_t cmp = c->in_len < H2_PREFACE_LEN ? c->in_len : H2_PREFACE_LEN;
                if (memcmp(c->in, H2_PREFACE, cmp) != 0)
                        return 0;
        }
        return 1;
}

static void *client_thread(void *arg) {
        client *c = arg;
        int h2 = sniff_h2(c);
        if (h2 > 0)
                serve_h2(c);
        proxyreq *rq = h2 == 0 ? malloc(sizeof *rq) : NULL;
        while (rq) {
                int r = serve_one(c, rq);
                if (r < 0 || c->close_after)
                        break;
        }
        atomic_fetch_sub(&m_conns_open, 1);
        free(rq);
        close(c->fd);
        free(c);
        return NULL;
}

/* ---------------------------------------------------------------- main */

void router_config_defaults(router_config *c) {
        memset(c, 0, sizeof *c);
        snprintf(c->listen, sizeof c->listen, "127.0.0.1:49980");
        c->sample = 2;
        c->poll_ms = 1000;
        c->connect_timeout_ms = 1000;
        c->max_body = 16u << 20;
        c->max_connections = 16384;
}

static int load_key(const char *path) {
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        char line[512];
        int r = -ENOENT;
        while (fgets(line, sizeof line, f)) {
                char *h = strchr(line, '#');
                if (h)
                        *h = 0;
                char a[160], b[160];
                int k = sscanf(line, "%159s %159s", a, b);
                const char *key = k == 2 ? b : k == 1 ? a : NULL;
                if (key && strlen(key) < sizeof node_key) {
                        snprintf(node_key, sizeof node_key, "%s", key);
                        r = 0;
                        break;
                }
        }
        fclose(f);
        return r;
}

/* --node-tls-ca (and --node-tls-name): every node connection is TLS and
 * must present a certificate that chains to the CA file's certificates. */
static int tls_setup(void) {
        if (!cfg->node_tls_cert[0] != !cfg->node_tls_key[0]) {
                log_error("--node-tls-cert and --node-tls-key go together (one was given without the other)");
                return -EINVAL;
        }
        if (!cfg->node_tls_ca[0]) {
                if (cfg->node_tls_name[0] || cfg->node_tls_cert[0]) {
                        log_error("%s is for --node-tls-ca: give the CA too",
                                  cfg->node_tls_name[0] ? "--node-tls-name" : "--node-tls-cert");
                        return -EINVAL;
                }
                if (strstr(cfg->nodes, "https://")) {
                        log_error("--nodes names https:// nodes: give --node-tls-ca, the CA "
                                  "their certificates chain to");
                        return -EINVAL;
                }
                return 0;
        }
        if (strstr(cfg->nodes, "http://")) {
                log_error("--nodes names http:// nodes, but with --node-tls-ca every node is "
                          "spoken to over TLS: write https://");
                return -EINVAL;
        }
        FILE *f = fopen(cfg->node_tls_ca, "re");
        if (!f) {
                int r = -errno;
                log_error("--node-tls-ca %s: %s", cfg->node_tls_ca, strerror(-r));
                return r;
        }
        fclose(f);
        tls_ctx = SSL_CTX_new(TLS_client_method());
        if (!tls_ctx)
                return -ENOMEM;
        (void) SSL_CTX_set_min_proto_version(tls_ctx, TLS1_2_VERSION);
        /* a node that closes without close_notify ends a close-delimited
         * response, as a plain connection's EOF does */
        SSL_CTX_set_options(tls_ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
        SSL_CTX_set_mode(tls_ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_PEER, NULL);
        ERR_clear_error();
        if (SSL_CTX_load_verify_locations(tls_ctx, cfg->node_tls_ca, NULL) != 1) {
                unsigned long ec = ERR_peek_error();
                log_error("--node-tls-ca %s: no PEM certificate could be read from it (%s)",
                          cfg->node_tls_ca,
                          ERR_reason_error_string(ec) ? ERR_reason_error_string(ec) : "?");
                SSL_CTX_free(tls_ctx);
                tls_ctx = NULL;
                return -EINVAL;
        }
        /* mutual TLS: the router's own certificate, for nodes that ask */
        if (cfg->node_tls_cert[0]) {
                const char *what = "--node-tls-cert";
                ERR_clear_error();
                bool ok = SSL_CTX_use_certificate_chain_file(tls_ctx, cfg->node_tls_cert) == 1;
                if (ok) {
                        what = "--node-tls-key";
                        ok = SSL_CTX_use_PrivateKey_file(tls_ctx, cfg->node_tls_key,
                                                         SSL_FILETYPE_PEM) == 1;
                }
                if (ok) {
                        what = "--node-tls-key (not the key of --node-tls-cert)";
                        ok = SSL_CTX_check_private_key(tls_ctx) == 1;
                }
                if (!ok) {
                        unsigned long ec = ERR_peek_error();
                        log_error("%s %s: %s", what,
                                  strncmp(what, "--node-tls-cert", 15) == 0 ? cfg->node_tls_cert
                                                                            : cfg->node_tls_key,
                                  ERR_reason_error_string(ec) ? ERR_reason_error_string(ec)
                                                              : "cannot be read");
                        SSL_CTX_free(tls_ctx);
                        tls_ctx = NULL;
                        return -EINVAL;
                }
        }
        return 0;
}

static void *stop_thread(void *arg) {
        int sig = 0;
        if (sigwait(arg, &sig) == 0)
                log_info("signal %d: stopping", sig);
        exit(0);
}

int router_run(const router_config *config) {
        cfg = config;
        if (!cfg->nodes[0] && !cfg->nodes_dns[0]) {
                log_error("give --nodes URL,... or --nodes-dns NAME:PORT");
                return -EINVAL;
        }
        if (!cfg->key_file[0]) {
                log_error("--key-file is required (a key every node accepts, for GET /node)");
                return -EINVAL;
        }
        int r = load_key(cfg->key_file);
        if (r < 0) {
                log_error("--key-file %s: %s", cfg->key_file,
                          r == -ENOENT ? "no key in it" : strerror(-r));
                return r;
        }
        r = tls_setup();
        if (r < 0)
                return r;
        struct sockaddr_storage ss;
        socklen_t sl;
        if (parse_hostport(cfg->listen, &ss, &sl) < 0) {
                log_error("--listen %s: not HOST:PORT", cfg->listen);
                return -EINVAL;
        }
        int lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
            bind(lfd, (struct sockaddr *) &ss, sl) < 0 || listen(lfd, 1024) < 0) {
                r = -errno;
                log_error("listening on %s: %s", cfg->listen, strerror(-r));
                if (lfd >= 0)
                        close(lfd);
                return r;
        }
        signal(SIGPIPE, SIG_IGN);
        /* SIGTERM/SIGINT: to one thread that ends the process cleanly (the
         * router holds nothing to save: a request in flight is cut, and the
         * SDK retries on another replica) */
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGTERM);
        sigaddset(&stop, SIGINT);
        pthread_sigmask(SIG_BLOCK, &stop, NULL);
        /* the first round of discovery before the first request */
        discover();
        {
                node *v[NODES_MAX];
                unsigned k = 0;
                pthread_mutex_lock(&nodes_mu);
                for (unsigned i = 0; i < n_nodes; i++)
                        v[k++] = nodes[i];
                pthread_mutex_unlock(&nodes_mu);
                for (unsigned i = 0; i < k; i++)
                        poll_one(v[i]);
        }
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_t th;
        if (pthread_create(&th, &attr, discovery_thread, NULL) != 0) {
                log_error("cannot start the discovery thread");
                close(lfd);
                return -EAGAIN;
        }
        static sigset_t stop_set;
        stop_set = stop;
        if (pthread_create(&th, &attr, stop_thread, &stop_set) != 0) {
                log_error("cannot start the signal thread");
                close(lfd);
                return -EAGAIN;
        }
        log_info("listening on http://%s", cfg->listen);
        for (;;) {
                struct sockaddr_storage peer;
                socklen_t pl = sizeof peer;
                int fd = accept4(lfd, (struct sockaddr *) &peer, &pl, SOCK_CLOEXEC);
                if (fd < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        if (errno == EMFILE || errno == ENFILE) {
                                log_warning("accept: %s", strerror(errno));
                                usleep(100000);
                                continue;
                        }
                        log_error("accept: %s", strerror(errno));
                        break;
                }
                (void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                client *c = calloc(1, sizeof *c);
                if (!c) {
                        close(fd);
                        continue;
                }
                c->fd = fd;
                atomic_fetch_add(&m_conns, 1);
                if (atomic_load(&m_conns_open) >= cfg->max_connections) {
                        /* a thread per connection: bounded, or a flood of idle ones takes the memory */
                        close(fd);
                        free(c);
                        atomic_fetch_add(&m_refused, 1);
                        continue;
                }
                atomic_fetch_add(&m_conns_open, 1);
                if (pthread_create(&th, &attr, client_thread, c) != 0) {
                        atomic_fetch_sub(&m_conns_open, 1);
                        close(fd);
                        free(c);
                }
        }
        close(lfd);
        return -EIO;
}
