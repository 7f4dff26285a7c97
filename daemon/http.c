/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libmicrohttpd plumbing: the daemon runs MHD in external-epoll mode (its
 * epoll fd sits in ours), one request context per request, bodies bounded
 * while they arrive, and chunked streaming responses whose connection is
 * suspended while no frame is queued.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>

#include "daemon/connect.h"
#include "daemon/ingress.h"
#include "daemon/ingress_h2.h"
#include "daemon/route.h"
#include "daemon/audit.h"
#include "util/clock.h"
#include "daemon/server.h"
#include "daemon/templates.h"
#include "daemon/tls.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/parse.h"

const char *http_header(struct MHD_Connection *c, const char *name) {
        return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

const char *http_query(struct MHD_Connection *c, const char *name) {
        return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

/* Per connection: the raw request target of its current request (MHD
 * hands the access handler a decoded path without the query; ingress
 * relays the target as the client wrote it). */
typedef struct conn_ctx {
        char *raw_uri;
        signed char client_cert; /* tls-client-ca: 0 not checked yet, 1 verified, -1 refused */
        char client_why[160];    /* why it was refused */
} conn_ctx;

static conn_ctx *conn_ctx_of(struct MHD_Connection *c) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        return ci ? ci->socket_context : NULL;
}

const char *http_raw_uri(struct MHD_Connection *c) {
        conn_ctx *x = conn_ctx_of(c);
        return x ? x->raw_uri : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
        if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
                *socket_context = calloc(1, sizeof(conn_ctx));
                return;
        }
        conn_ctx *x = *socket_context;
        if (x)
                free(x->raw_uri);
        free(x);
        *socket_context = NULL;
}

/* While a request's body is still to come, libmicrohttpd 0.9.75 refuses a
 * response (and an early one closes the connection, so a client still
 * writing its body sees EPIPE, not the answer). Replies made then are kept
 * here and queued once the body has been read and thrown away. */
static request *deferring;

void http_defer_begin(request *req) {
        deferring = req;
}

void http_defer_end(void) {
        deferring = NULL;
}

/* A resume does not wake libmicrohttpd's epoll fd: the loop goes round
 * again while this count moves (server.c). */
void http_resume(request *req) {
        req->srv->resumes++;
        MHD_resume_connection(req->conn);
}

static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp) {
        if (!resp)
                return MHD_NO;
        if (deferring && deferring->conn == c && !deferring->deferred) {
                deferring->deferred = resp;
                deferring->deferred_status = status;
                return MHD_YES;
        }
        enum MHD_Result r = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return r;
}

enum MHD_Result http_reply_text(struct MHD_Connection *c, unsigned status, const char *ctype, const char *text) {
        struct MHD_Response *resp =
                MHD_create_response_from_buffer(strlen(text), (void *) text, MHD_RESPMEM_MUST_COPY);
        if (!resp)
                return MHD_NO;
        if (ctype)
                MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
        return queue(c, status, resp);
}

enum MHD_Result http_reply_json_page(struct MHD_Connection *c, json_t *body, const char *next_token) {
        char *s = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        if (!s)
                return MHD_NO;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(s);
                return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        if (next_token && next_token[0])
                MHD_add_response_header(resp, "X-Next-Token", next_token);
        return queue(c, 200, resp);
}

enum MHD_Result http_reply_json(struct MHD_Connection *c, unsigned status, json_t *body) {
        char *s = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        if (!s)
                return MHD_NO;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(s);
                return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        return queue(c, status, resp);
}

enum MHD_Result http_reply_empty(struct MHD_Connection *c, unsigned status) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        return queue(c, status, resp);
}

enum MHD_Result http_reply_error(struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return http_reply_json(c, status, json_pack("{s:i, s:s}", "code", (int) status, "message", msg));
}

enum MHD_Result http_reply_connect_error(struct MHD_Connection *c, const char *code, const char *fmt, ...) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        return http_reply_json(c, connect_code_http_status(code),
                               json_pack("{s:s, s:s}", "code", code, "message", msg));
}

enum MHD_Result http_reply_429(struct MHD_Connection *c, unsigned retry_after_s, const char *fmt, ...) {
        char msg[1024], ra[16];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        char *s = NULL;
        json_t *e = json_pack("{s:i, s:s}", "code", 429, "message", msg);
        if (e)
                s = json_dumps(e, JSON_COMPACT);
        json_decref(e);
        if (!s)
                return MHD_NO;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(s);
                return MHD_NO;
        }
        snprintf(ra, sizeof ra, "%u", retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
        return queue(c, 429, resp);
}

enum MHD_Result http_reply_502(struct MHD_Connection *c, const char *sandbox_id) {
        return http_reply_json(c, 502,
                               json_pack("{s:s, s:s, s:i}", "sandboxId", sandbox_id ? sandbox_id : "",
                                         "message", "The sandbox was not found", "code", 502));
}

/* ----------------------------------------------------------------- streams */

static void stream_reserve(stream *st, size_t more) {
        if (st->off > 0 && st->off == st->len)
                st->off = st->len = 0;
        if (st->len + more <= st->cap)
                return;
        if (st->off > 0) {
                memmove(st->buf, st->buf + st->off, st->len - st->off);
                st->len -= st->off;
                st->off = 0;
                if (st->len + more <= st->cap)
                        return;
        }
        size_t cap = st->cap ? st->cap : 4096;
        while (cap < st->len + more)
                cap *= 2;
        char *b = realloc(st->buf, cap);
        if (!b)
                abort(); /* out of memory in the loop: nothing sane to do */
        st->buf = b;
        st->cap = cap;
}

void stream_resume(stream *st) {
        if (st->suspended) {
                st->suspended = false;
                st->srv->resumes++;
                MHD_resume_connection(st->conn);
        }
}

void stream_queue_frame(stream *st, uint8_t flags, const char *json, size_t len) {
        if (st->finished || st->cut)
                return;
        stream_reserve(st, CONNECT_ENVELOPE_HEADER + len);
        connect_envelope_header((uint8_t *) st->buf + st->len, flags, (uint32_t) len);
        memcpy(st->buf + st->len + CONNECT_ENVELOPE_HEADER, json, len);
        st->len += CONNECT_ENVELOPE_HEADER + len;
        st->last_send_ms = wall_ms();
        stream_resume(st);
}

void stream_queue_json(stream *st, json_t *msg) {
        char *s = json_dumps(msg, JSON_COMPACT);
        json_decref(msg);
        if (!s)
                return;
        stream_queue_frame(st, 0, s, strlen(s));
        free(s);
}

void stream_finish(stream *st, const char *code, const char *message) {
        if (st->finished || st->cut)
                return;
        if (code) {
                json_t *e = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message ? message : code);
                char *s = json_dumps(e, JSON_COMPACT);
                json_decref(e);
                if (s) {
                        stream_queue_frame(st, CONNECT_FLAG_END, s, strlen(s));
                        free(s);
                }
        } else
                stream_queue_frame(st, CONNECT_FLAG_END, "{}", 2);
        st->finished = true;
        stream_resume(st);
}

void stream_cut(stream *st) {
        st->cut = true;
        stream_resume(st);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
        stream *st = cls;
        if (st->cut)
                return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->len > st->off) {
                size_t n = MIN(max, st->len - st->off);
                memcpy(buf, st->buf + st->off, n);
                st->off += n;
                if (st->off == st->len)
                        st->off = st->len = 0;
                /* a throttled process may go on producing output */
                if (st->proc && st->proc->throttled)
                        proc_maybe_unthrottle(st->srv, st->proc);
                return (ssize_t) n;
        }
        if (st->finished)
                return MHD_CONTENT_READER_END_OF_STREAM;
        /* nothing to send: park the connection until stream_resume() */
        st->suspended = true;
        MHD_suspend_connection(st->conn);
        return 0;
}

static void stream_unlink_proc(stream *st) {
        if (!st->proc)
                return;
        for (stream **pp = &st->proc->subs; *pp; pp = &(*pp)->next_in_proc)
                if (*pp == st) {
                        *pp = st->next_in_proc;
                        break;
                }
        if (st->proc->timeout_stream == st)
                st->proc->timeout_stream = NULL;
        proc *p = st->proc;
        st->proc = NULL;
        /* the slow reader that held the process back may be this one */
        proc_maybe_unthrottle(st->srv, p);
}

static void stream_free_cb(void *cls) {
        stream *st = cls;
        server *srv = st->srv;
        stream_unlink_proc(st);
        if (st->kind == STREAM_WATCH && st->sb && !st->sb->dead && !st->sb->paused && st->watch_id) {
                hutch_error err = { 0 };
                if (hutch_fs_watch_remove(st->sb->h, st->watch_id, &err) < 0)
                        log_debug("sandbox %s: removing watch %u: %s", st->sb->id, st->watch_id, err.msg);
                sbx_mark_dirty(st->sb);
        }
        if (st->prev)
                st->prev->next = st->next;
        else
                srv->streams = st->next;
        if (st->next)
                st->next->prev = st->prev;
        free(st->watch_root);
        free(st->buf);
        free(st);
}

stream *stream_new(server *srv, struct MHD_Connection *conn, int kind, enum MHD_Result *ret_mhd) {
        stream *st = calloc(1, sizeof *st);
        if (!st) {
                *ret_mhd = MHD_NO;
                return NULL;
        }
        st->srv = srv;
        st->conn = conn;
        st->kind = kind;
        st->last_send_ms = wall_ms();
        struct MHD_Response *resp =
                MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, st, stream_free_cb);
        if (!resp) {
                free(st);
                *ret_mhd = MHD_NO;
                return NULL;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/connect+json");
        st->next = srv->streams;
        if (srv->streams)
                srv->streams->prev = st;
        srv->streams = st;
        *ret_mhd = MHD_queue_response(conn, 200, resp);
        MHD_destroy_response(resp);
        /* not queued: destroying the response freed the stream already */
        return *ret_mhd == MHD_YES ? st : NULL;
}

/* ------------------------------------------------------------------ requests */

static void request_free(request *req) {
        if (!req)
                return;
        admission_forget(req->srv, req);
        snapjob_request_gone(req->srv, req);
        if (req->deferred)
                MHD_destroy_response(req->deferred);
        if (req->upload)
                files_upload_free(req->upload);
        volumes_request_free(req->vol);
        if (req->ingress)
                ingress_request_gone(req->ingress);
        templates_upload_free(req->tpl_upload);
        free(req->created);
        /* a body may hold a secret (a build's registry credentials, a
         * secret's value) on any path its handler took, refusals included */
        if (req->body)
                explicit_bzero(req->body, req->body_len);
        free(req->body);
        free(req->url);
        free(req);
}

/* What on_uri tells on_request through con_cls when the request line's
 * path hides a control byte: never a request, never freed. */
static char bad_path_marker;

/* MHD calls this once the response has been written to the socket in full
 * (COMPLETED_OK), or when the request ended without that. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
        request *req = *con_cls;
        if (req && req != (void *) &bad_path_marker)
                audit_request_done(cls, req, c);
        if (req && req != (void *) &bad_path_marker && req->n_created)
                sbx_create_answered(cls, req, toe);
        if (*con_cls != &bad_path_marker)
                request_free(*con_cls);
        *con_cls = NULL;
}

/* libmicrohttpd decodes the path before routing, and a decoded %00 ends the
 * C string: `DELETE /sandboxes/<id>%00anything` was `DELETE /sandboxes/<id>`.
 * The raw request target is only seen here, before that decoding. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
        conn_ctx *x = conn_ctx_of(c);
        if (x) {
                free(x->raw_uri);
                x->raw_uri = strdup(uri);
        }
        return http_path_has_control(uri) ? &bad_path_marker : NULL;
}

static enum MHD_Result nul_check(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                  const char *value, size_t value_size) {
        bool *bad = cls;
        if (strlen(key) != key_size || (value && strlen(value) != value_size)) {
                *bad = true;
                return MHD_NO;
        }
        return MHD_YES;
}

/* A request is refused before routing when it could mean two things to two
 * parsers: a NUL inside a query value or header (C strings would cut it), or
 * both Content-Length and Transfer-Encoding (request smuggling, RFC 9112
 * §6.3). Answered early, so the connection is closed after the reply. */
static enum MHD_Result count_host(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                 const char *value, size_t value_size) {
        if (strcasecmp(key, "Host") == 0)
                ++*(unsigned *) cls;
        return MHD_YES;
}

static bool request_ambiguous(struct MHD_Connection *c, const char **ret_why) {
        bool bad = false;
        MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND | MHD_HEADER_KIND, nul_check, &bad);
        if (bad) {
                *ret_why = "NUL byte in a query parameter or header";
                return true;
        }
        if (http_header(c, "Content-Length") && http_header(c, "Transfer-Encoding")) {
                *ret_why = "both Content-Length and Transfer-Encoding";
                return true;
        }
        /* RFC 9112 §3.2: which Host routes and which one a sandbox's server
         * reads must be the same */
        unsigned hosts = 0;
        MHD_get_connection_values_n(c, MHD_HEADER_KIND, count_host, &hosts);
        if (hosts > 1) {
                *ret_why = "more than one Host header";
                return true;
        }
        return false;
}

static bool has_body(struct MHD_Connection *c) {
        const char *cl = http_header(c, "Content-Length");
        if (cl)
                return strtoull(cl, NULL, 10) > 0;
        return http_header(c, "Transfer-Encoding") != NULL;
}

static enum MHD_Result finish_deferred(request *req) {
        struct MHD_Response *resp = req->deferred;
        req->deferred = NULL;
        enum MHD_Result r = MHD_queue_response(req->conn, req->deferred_status, resp);
        MHD_destroy_response(resp);
        return r;
}

/* X-Request-Id as the client sent it when it is short and plain, else one
 * made here: logs and the audit trail carry it. */
static void request_id_set(request *req, struct MHD_Connection *conn) {
        static uint64_t counter;
        const char *h = http_header(conn, "X-Request-Id");
        _Static_assert(sizeof req->rid > REQUEST_ID_MAX, "a request id fits its buffer");
        if (request_id_valid(h))
                memcpy(req->rid, h, strlen(h) + 1);
        else
                snprintf(req->rid, sizeof req->rid, "%08x%08llx", (unsigned) getpid(),
                         (unsigned long long) (req->t0_ns ^ ++counter));
}

static enum MHD_Result on_request_inner(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                        const char *version, const char *upload_data, size_t *upload_size,
                                        void **con_cls);

/* What is done with a request's headers, before its body. */
static enum MHD_Result request_begin(server *srv, request *req) {
        struct MHD_Connection *conn = req->conn;
        /* a refused request's body is read and dropped, up to a cap:
         * one announced beyond it is answered at once (and closed) */
        const char *cl = http_header(conn, "Content-Length");
        bool body = has_body(conn) && !(cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes + (64u << 20));
        if (body)
                deferring = req;
        bool responded = false;
        enum MHD_Result r = api_begin(srv, req, &responded);
        deferring = NULL;
        if (responded)
                req->responded = true;
        if (req->deferred)
                req->body_mode = BODY_DISCARD;
        else if (body && req->body_mode == BODY_BUFFER &&
                 (streq(req->method, "GET") || streq(req->method, "HEAD") ||
                  (streq(req->method, "DELETE") && !streq(req->url, "/templates/tags"))))
                req->body_mode = BODY_DISCARD; /* no route reads one: never buffer it */
        return r;
}

/* tls-client-ca: a request but GET /health (a load balancer's or the
 * kubelet's probe, which carry no client certificate) on a connection whose
 * client did not present a verified certificate is refused, with why. The
 * verdict is the connection's: one check per handshake. */
static bool client_cert_refused(server *srv, struct MHD_Connection *conn, const char *method,
                                const char *url, char *why, size_t n) {
        if (!srv->tls_client_ca_pem || (streq(method, "GET") && streq(url, "/health")))
                return false;
        conn_ctx *x = conn_ctx_of(conn);
        if (x && x->client_cert == 1)
                return false;
        char reason[sizeof x->client_why] = "";
        if (x && x->client_cert == -1)
                snprintf(reason, sizeof reason, "%s", x->client_why);
        else {
                bool ok = tls_client_verified(conn, reason, sizeof reason);
                if (x) {
                        x->client_cert = ok ? 1 : -1;
                        snprintf(x->client_why, sizeof x->client_why, "%s", reason);
                }
                if (ok)
                        return false;
                log_info("a client was refused by tls-client-ca: %s", reason);
        }
        snprintf(why, n,
                 "this server requires a client certificate signed by its tls-client-ca (mutual TLS): %s",
                 reason);
        return true;
}

/* Log lines written while a request is served carry its id. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **con_cls) {
        request *known = *con_cls && *con_cls != &bad_path_marker ? *con_cls : NULL;
        const char *old = log_set_context(known ? known->rid : NULL);
        enum MHD_Result r = on_request_inner(cls, conn, url, method, version, upload_data, upload_size, con_cls);
        log_set_context(old);
        return r;
}

static enum MHD_Result on_request_inner(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                        const char *version, const char *upload_data, size_t *upload_size,
                                        void **con_cls) {
        server *srv = cls;
        bool bad_path = *con_cls == &bad_path_marker;
        if (bad_path)
                *con_cls = NULL;
        request *req = *con_cls;
        if (!req) {
                req = calloc(1, sizeof *req);
                if (!req)
                        return MHD_NO;
                req->srv = srv;
                req->conn = conn;
                req->method = method;
                req->url = strdup(url);
                req->body_mode = BODY_BUFFER;
                req->t0_ns = clock_ns(CLOCK_MONOTONIC);
                request_id_set(req, conn);
                log_set_context(req->rid);
                if (!req->url) {
                        free(req);
                        return MHD_NO;
                }
                *con_cls = req;
                const char *why = "a control byte (such as %00) in the URL path";
                int status = 400;
                char cert_why[256];
                if (client_cert_refused(srv, conn, method, url, cert_why, sizeof cert_why)) {
                        why = cert_why;
                        status = 403;
                }
                if (status != 400 || bad_path || request_ambiguous(conn, &why)) {
                        req->responded = true;
                        struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
                        json_t *body = json_pack("{s:i, s:s}", "code", status, "message", why);
                        char *txt = json_dumps(body, JSON_COMPACT);
                        json_decref(body);
                        MHD_destroy_response(resp);
                        resp = MHD_create_response_from_buffer(strlen(txt), txt, MHD_RESPMEM_MUST_FREE);
                        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
                        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
                        enum MHD_Result r = MHD_queue_response(conn, (unsigned) status, resp);
                        MHD_destroy_response(resp);
                        return r;
                }
                return request_begin(srv, req);
        }
        /* resumed after a wait (daemon/snapjob.c) */
        if (req->resume_action != RESUME_NONE) {
                int action = req->resume_action;
                req->resume_action = RESUME_NONE;
                if (action == RESUME_CLOSE)
                        return MHD_NO;
                if (action == RESUME_DISPATCH)
                        return api_dispatch(srv, req);
                /* RESUME_BEGIN: from its headers again. It was suspended in
                 * its first call, which libmicrohttpd repeats after the resume
                 * (no data: the body follows in the next calls) */
                enum MHD_Result r = request_begin(srv, req);
                if (r != MHD_YES || req->snap_wait || *upload_size == 0)
                        return r;
        }
        if (req->body_mode == BODY_INGRESS)
                return ingress_on_request(srv, req, upload_data, upload_size);
        if (*upload_size > 0) {
                if (req->responded && !req->deferred) {
                        *upload_size = 0;
                        return MHD_YES;
                }
                if (req->body_mode == BODY_DISCARD) {
                        /* read and drop the body of a refused request (or one
                         * no route reads), so the client gets to read the
                         * answer; past the cap the connection is closed */
                        req->discarded += *upload_size;
                        *upload_size = 0;
                        return req->discarded > srv->cfg.max_body_bytes + (64u << 20) ? MHD_NO : MHD_YES;
                }
                if (req->body_mode == BODY_TPL_UPLOAD)
                        return templates_upload_body(srv, req, upload_data, upload_size);
                if (req->body_mode == BODY_FILES) {
                        deferring = req;
                        enum MHD_Result r = files_body(srv, req, upload_data, upload_size);
                        deferring = NULL;
                        return r;
                }
                if (req->body_mode == BODY_VOLUME)
                        return volumes_content_body(srv, req, upload_data, upload_size);
                size_t n = *upload_size;
                if (req->body_len + n > srv->cfg.max_body_bytes) {
                        deferring = req;
                        http_reply_error(conn, 413, "request body exceeds %llu bytes",
                                         (unsigned long long) srv->cfg.max_body_bytes);
                        deferring = NULL;
                        req->body_mode = BODY_DISCARD;
                        req->discarded = req->body_len + n;
                        *upload_size = 0;
                        return MHD_YES;
                }
                if (req->body_len + n + 1 > req->body_cap) {
                        size_t cap = req->body_cap ? req->body_cap : 1024;
                        while (cap < req->body_len + n + 1)
                                cap *= 2;
                        char *b = realloc(req->body, cap);
                        if (!b)
                                return MHD_NO;
                        req->body = b;
                        req->body_cap = cap;
                }
                memcpy(req->body + req->body_len, upload_data, n);
                req->body_len += n;
                req->body[req->body_len] = 0;
                *upload_size = 0;
                return MHD_YES;
        }
        if (req->deferred)
                return finish_deferred(req);
        /* resumed by admission.c: its turn to run, or its client went away */
        if (req->adm.state == ADM_ADMITTED) {
                admission_resumed(srv, req);
                return api_dispatch(srv, req);
        }
        if (req->adm.state == ADM_DROPPED)
                return MHD_NO;
        if (req->responded)
                return MHD_YES;
        if (req->body_mode == BODY_DISCARD) {
                req->body_mode = BODY_BUFFER; /* dispatched with an empty body */
                req->body_len = 0;
        }
        if (req->body_mode == BODY_FILES)
                return files_finish(srv, req); /* may wait for a pipe first */
        if (req->body_mode == BODY_TPL_UPLOAD)
                return templates_upload_finish(srv, req);
        req->responded = true;
        return api_dispatch(srv, req);
}

static void on_mhd_ready(server *srv, watcher *w, uint32_t revents) {
        MHD_run(srv->mhd);
}

__attribute__((format(printf, 2, 0))) static void on_log(void *cls, const char *fmt, va_list ap) {
        if (log_get_level() < LOG_LEVEL_DEBUG)
                return;
        char buf[1024];
        vsnprintf(buf, sizeof buf, fmt, ap);
        size_t n = strlen(buf);
        while (n > 0 && buf[n - 1] == '\n')
                buf[--n] = 0;
        log_debug("http: %s", buf);
}

/* Idle connections are cheap to open and each holds one of max-connections:
 * one that has not proved a key, token or signature is closed after
 * unauthenticated-timeout, and one client address holds at most
 * max-connections-per-client (MHD's per-IP limit), so a flood of idle
 * connections from one address cannot lock everyone out. Once a request
 * authenticates, its connection may idle for idle-timeout (the SDK keeps
 * connections alive between calls). */
void http_conn_authenticated(request *req) {
        if (req->authenticated)
                return;
        req->authenticated = true;
        (void) MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                         (unsigned) req->srv->cfg.idle_timeout_s);
}

/* The API's socket, bound before the daemon touches its data dir, so that a
 * busy port refuses the start before anything changes. No SO_REUSEPORT
 * (libmicrohttpd's LISTENING_ADDRESS_REUSE): with it a second daemon binds
 * the same port and the kernel splits connections between the two.
 * SO_REUSEADDR only lets a restart bind while old connections sit in
 * TIME_WAIT; it never admits a second listener. */
int http_listen_parse(const char *listen, struct sockaddr_storage *ss, unsigned *ret_len, hutch_error *err) {
        char host[128];
        if (strlen(listen) >= sizeof host)
                return hutch_error_set(err, -EINVAL, "listen: '%s' is too long", listen);
        snprintf(host, sizeof host, "%s", listen);
        char *colon = strrchr(host, ':');
        if (!colon)
                return hutch_error_set(err, -EINVAL, "listen: wants HOST:PORT, not '%s'", listen);
        *colon = 0;
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port < 0 || port > 65535)
                return hutch_error_set(err, -EINVAL, "listen: bad port in '%s' (0 to 65535)", listen);
        memset(ss, 0, sizeof *ss);
        char *h = host;
        if (h[0] == '[') {
                h++;
                char *rb = strchr(h, ']');
                if (!rb || rb[1])
                        return hutch_error_set(err, -EINVAL, "listen: unbalanced [ in '%s'", listen);
                *rb = 0;
        }
        struct sockaddr_in *in4 = (struct sockaddr_in *) ss;
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) ss;
        if (inet_pton(AF_INET, h, &in4->sin_addr) == 1) {
                in4->sin_family = AF_INET;
                in4->sin_port = htons((uint16_t) port);
                *ret_len = sizeof *in4;
        } else if (inet_pton(AF_INET6, h, &in6->sin6_addr) == 1) {
                in6->sin6_family = AF_INET6;
                in6->sin6_port = htons((uint16_t) port);
                *ret_len = sizeof *in6;
        } else
                return hutch_error_set(err, -EINVAL, "listen: wants a numeric address (127.0.0.1:49982, [::1]:49982), not '%s'",
                                       listen);
        return 0;
}

static void tls_pem_free(server *srv) {
        for (int i = 0; i < 2; i++) {
                if (srv->tls_pem[i])
                        explicit_bzero(srv->tls_pem[i], strlen(srv->tls_pem[i]));
                free(srv->tls_pem[i]);
                srv->tls_pem[i] = NULL;
        }
}

int http_bind(server *srv, hutch_error *err) {
        struct sockaddr_storage ss;
        socklen_t sslen;
        int r = http_listen_parse(srv->cfg.listen, &ss, &sslen, err);
        if (r < 0)
                return r;
        /* TLS material is read here too, so that a bad path refuses the start
         * before the data dir is touched */
        bool want_cert = !streq(srv->cfg.tls_cert, "-"), want_key = !streq(srv->cfg.tls_key, "-");
        if (want_cert != want_key)
                return hutch_error_set(err, -EINVAL, "tls-cert and tls-key go together (one was given without the other)");
        if (want_cert) {
                r = read_file_at(AT_FDCWD, srv->cfg.tls_cert, 1 << 20, &srv->tls_pem[0]);
                if (r < 0)
                        return hutch_error_set(err, r, "tls-cert %s: %s", srv->cfg.tls_cert, strerror(-r));
                r = read_file_at(AT_FDCWD, srv->cfg.tls_key, 1 << 20, &srv->tls_pem[1]);
                if (r < 0)
                        return hutch_error_set(err, r, "tls-key %s: %s", srv->cfg.tls_key, strerror(-r));
                if (!strstr(srv->tls_pem[0], "-----BEGIN CERTIFICATE-----") ||
                    !strstr(srv->tls_pem[1], "PRIVATE KEY-----"))
                        return hutch_error_set(err, -EINVAL, "tls-cert must be a PEM certificate and tls-key a PEM "
                                                             "private key");
        }
        if (!streq(srv->cfg.tls_client_ca, "-")) {
                if (!want_cert)
                        return hutch_error_set(
                                err, -EINVAL,
                                "tls-client-ca needs tls-cert and tls-key: client certificates "
                                "are asked for in the API's TLS handshake");
                r = read_file_at(AT_FDCWD, srv->cfg.tls_client_ca, 1 << 20, &srv->tls_client_ca_pem);
                if (r < 0)
                        return hutch_error_set(err, r, "tls-client-ca %s: %s",
                                               srv->cfg.tls_client_ca, strerror(-r));
                if (!strstr(srv->tls_client_ca_pem, "-----BEGIN CERTIFICATE-----"))
                        return hutch_error_set(err, -EINVAL,
                                               "tls-client-ca %s holds no PEM certificate",
                                               srv->cfg.tls_client_ca);
        }
        r = tls_certs_load(srv, err);
        if (r < 0)
                return r;
        if (srv->tls_certs)
                tls_pem_free(srv); /* the keys live in GnuTLS's objects now: no PEM copy stays */

        _cleanup_close_ int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return hutch_error_set(err, -errno, "socket: %m");
        int one = 1;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
                return hutch_error_set(err, -errno, "SO_REUSEADDR: %m");
        /* [::] means IPv6 only; 0.0.0.0 is how to ask for IPv4 */
        if (ss.ss_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) < 0)
                return hutch_error_set(err, -errno, "IPV6_V6ONLY: %m");
        if (bind(fd, (struct sockaddr *) &ss, sslen) < 0) {
                int e = errno;
                if (e == EADDRINUSE)
                        return hutch_error_set(err, -e,
                                               "cannot listen on %s: the port is in use (another hutch serve, or "
                                               "another program; choose another with --listen)",
                                               srv->cfg.listen);
                return hutch_error_set(err, -e, "cannot listen on %s: %s", srv->cfg.listen, strerror(e));
        }
        if (listen(fd, 1024) < 0)
                return hutch_error_set(err, -errno, "cannot listen on %s: %m", srv->cfg.listen);
        srv->listen_fd = TAKE_FD(fd);
        return 0;
}

int http_start(server *srv, hutch_error *err) {
        if (srv->listen_fd < 0)
                return hutch_error_set(err, -EBADF, "the API socket is not bound");
        /* read by http_bind; MHD copies neither, so they stay until http_stop */
        const char *cert = srv->tls_pem[0], *key = srv->tls_pem[1];
        void *pick = tls_certs_callback(srv); /* two certificates, chosen by SNI: no PEM given to MHD */
        /* The daemon accepts, not MHD: a connection that opens with the
         * HTTP/2 preface is ingress's (daemon/ingress_h2.c); the rest are
         * handed over with MHD_add_connection, MHD's limits applying. */
        unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE |
                MHD_USE_NO_LISTEN_SOCKET | (cert || pick ? MHD_USE_TLS : 0);
        struct MHD_OptionItem tls_opts[4] = { { MHD_OPTION_END, 0, NULL } };
        size_t k = 0;
        if (pick) {
                tls_opts[k++] = (struct MHD_OptionItem) { MHD_OPTION_HTTPS_CERT_CALLBACK, 0, pick };
        } else if (cert) {
                tls_opts[k++] = (struct MHD_OptionItem) { MHD_OPTION_HTTPS_MEM_CERT, 0,
                                                          (void *) cert };
                tls_opts[k++] = (struct MHD_OptionItem) { MHD_OPTION_HTTPS_MEM_KEY, 0, (void *) key };
        }
        /* tls-client-ca: libmicrohttpd asks every client for a certificate
         * and GnuTLS verifies it against this list; a request without a
         * verified one is refused (client_cert_refused) */
        if (srv->tls_client_ca_pem)
                tls_opts[k++] = (struct MHD_OptionItem) { MHD_OPTION_HTTPS_MEM_TRUST, 0,
                                                          srv->tls_client_ca_pem };
        tls_opts[k] = (struct MHD_OptionItem) { MHD_OPTION_END, 0, NULL };
        srv->mhd = MHD_start_daemon(
                flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_ARRAY, tls_opts,
                MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION,
                on_connection, srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv,
                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) (128 * 1024),
                MHD_OPTION_CONNECTION_LIMIT, (unsigned) srv->cfg.max_connections,
                MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned) srv->cfg.max_connections_per_client,
                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) srv->cfg.unauth_timeout_s,
                MHD_OPTION_EXTERNAL_LOGGER, on_log, srv,
        /* server_run() ignores SIGPIPE: without this MHD sends a file
         * (GET /files) 4 KiB a pread and a send at a time, one loop turn
         * each, instead of with sendfile() (libmicrohttpd >= 0.9.73) */
#if MHD_VERSION >= 0x00097205
                MHD_OPTION_SIGPIPE_HANDLED_BY_APP, (int) 1,
#endif
                MHD_OPTION_END);
        if (!srv->mhd)
                return hutch_error_set(
                        err, -EIO, "libmicrohttpd did not start on %s%s", srv->cfg.listen,
                        flags & MHD_USE_TLS ? " (is tls-key the key of tls-cert, both PEM?)" : "");
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_EPOLL_FD);
        if (!info) {
                MHD_stop_daemon(srv->mhd);
                srv->mhd = NULL;
                return hutch_error_set(err, -EIO, "libmicrohttpd has no epoll fd");
        }
        srv->mhd_w.cb = on_mhd_ready;
        int r = loop_add(srv, &srv->mhd_w, info->epoll_fd, EPOLLIN);
        if (r < 0)
                return hutch_error_set(err, r, "epoll: %s", strerror(-r));
        /* the socket is ingress_h2's from here: ingress_stop closes it */
        r = ingress_h2_start(srv, srv->listen_fd);
        if (r < 0)
                return hutch_error_set(err, r, "epoll: %s", strerror(-r));
        srv->listen_fd = -1;
        return 0;
}

void http_stop(server *srv) {
        srv->listen_fd = safe_close(srv->listen_fd);
        if (!srv->mhd) {
                tls_pem_free(srv);
                tls_certs_free(srv);
                free(srv->tls_client_ca_pem);
                srv->tls_client_ca_pem = NULL;
                return;
        }
        /* suspended connections must be resumed before MHD can close them */
        for (stream *st = srv->streams; st; st = st->next)
                stream_cut(st);
        startcmd_stop(srv);
        admission_stop(srv);
        snapjobs_stop(srv);
        ingress_stop(srv);
        MHD_run(srv->mhd);
        MHD_stop_daemon(srv->mhd);
        srv->mhd = NULL;
        ingress_reap(srv);
        tls_pem_free(srv);
        tls_certs_free(srv);
        free(srv->tls_client_ca_pem);
        srv->tls_client_ca_pem = NULL;
}
