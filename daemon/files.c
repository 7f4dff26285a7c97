/* SPDX-License-Identifier: Apache-2.0 */
/*
 * envd's /files (docs/protocol.md §c.5). Downloads: hutch-init opens the
 * path inside the sandbox and passes the descriptor out; MHD sends from it.
 * Uploads stream: request bytes → (gzip) → (multipart) → a pipe whose other
 * end hutch-init writes into a temporary file, renamed into place only on
 * commit, so a failed or cut upload leaves nothing behind. When a pipe is
 * full the connection is suspended until it drains: memory per upload is
 * bounded whatever the file size.
 */
#include <ctype.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/gzipstream.h"
#include "daemon/multipart.h"
#include "daemon/audit.h"
#include "daemon/server.h"
#include "util/error.h"
#include "util/log.h"

#define GZIP_SLICE 4096 /* input fed to the inflater per step: bounds a bomb's burst to ~4 MiB */
#define MAX_FILES_PER_UPLOAD 1000
#define MAX_METADATA 64
#define MAX_FILES_IN_FLIGHT 16 /* hutch-init allows 64 open writes per connection */

/* ---------------------------------------------------------------- signatures */

static void signature_compute(const char *path, const char *op, const char *user, const char *token,
                              const char *exp, char out[64]) {
        char *raw = NULL;
        int n = exp ? asprintf(&raw, "%s:%s:%s:%s:%s", path, op, user, token, exp)
                    : asprintf(&raw, "%s:%s:%s:%s", path, op, user, token);
        uint8_t d[32];
        if (n < 0)
                abort();
        SHA256((const uint8_t *) raw, (size_t) n, d);
        free(raw);
        memcpy(out, "v1_", 3);
        size_t k = base64_encode(d, sizeof d, out + 3);
        while (k > 0 && out[3 + k - 1] == '=')
                out[3 + --k] = 0;
}

static bool signature_matches(struct MHD_Connection *c, const sbx *sb, bool write) {
        const char *sig = http_query(c, "signature");
        const char *path = http_query(c, "path");
        const char *user = http_query(c, "username");
        const char *exp = http_query(c, "signature_expiration");
        if (!sig)
                return false;
        char want[64];
        signature_compute(path ? path : "", write ? "write" : "read", user ? user : "", sb->token,
                          exp && *exp ? exp : NULL, want);
        return const_time_eq(sig, want);
}

sbx *files_signed_sandbox(server *srv, struct MHD_Connection *c, bool write) {
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && signature_matches(c, sb, write))
                        return sb;
        return NULL;
}

/* 0 = allowed; otherwise a response was queued. */
static int files_auth(request *req, sbx *sb, bool write, enum MHD_Result *mr) {
        struct MHD_Connection *c = req->conn;
        if (http_header(c, "X-Access-Token"))
                return 0; /* checked (and matched) by the router */
        const char *sig = http_query(c, "signature");
        if (!sig) {
                *mr = http_reply_error(c, 401, "missing signature query parameter");
                return -EACCES;
        }
        if (!signature_matches(c, sb, write)) {
                *mr = http_reply_error(c, 401, "invalid signature");
                return -EACCES;
        }
        const char *exp = http_query(c, "signature_expiration");
        if (exp && *exp) {
                char *e;
                long long v = strtoll(exp, &e, 10);
                if (*e || v < (long long) time(NULL)) {
                        *mr = http_reply_error(c, 401, "signature is already expired");
                        return -EACCES;
                }
        }
        return 0;
}

static int files_user(request *req, hutch_fs_user *u, const char **home, char name[64], enum MHD_Result *mr) {
        const char *q = http_query(req->conn, "username");
        bool signed_url = !http_header(req->conn, "X-Access-Token");
        if (q && *q)
                snprintf(name, 64, "%s", q);
        else if (signed_url)
                /* the signature covers the query's user only: an
                 * Authorization header must not pick another one */
                snprintf(name, 64, "user");
        else if (user_from_auth(http_header(req->conn, "Authorization"), name, 64) < 0) {
                *mr = http_reply_error(req->conn, 401, "invalid authorization header");
                return -EACCES;
        }
        if (user_resolve(name, u, home) < 0) {
                *mr = http_reply_error(req->conn, 401, "invalid user: '%s'", name);
                return -EACCES;
        }
        return 0;
}

static unsigned status_from_errno(int r) {
        switch (-r) {
        case ENOENT:
                return 404;
        case ENOSPC:
        case EDQUOT:
                return 507;
        case EACCES:
        case EPERM:
        case EROFS:
                return 403;
        case EISDIR:
        case ENOTDIR:
        case EINVAL:
        case ENAMETOOLONG:
        case ELOOP:
        case EEXIST:
                return 400;
        default:
                return 500;
        }
}

/* -------------------------------------------------------------- downloads */

static void content_disposition(const char *name, char *out, size_t len) {
        bool token = *name != 0;
        for (const char *p = name; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                      strchr("!#$&+-.^_`|~", *p)))
                        token = false;
        if (token) {
                snprintf(out, len, "inline; filename=%s", name);
                return;
        }
        size_t o = (size_t) snprintf(out, len, "inline; filename=\"");
        for (const char *p = name; *p && o + 4 < len; p++) {
                if ((unsigned char) *p < 0x20 || *p == 0x7f)
                        continue;
                if (*p == '"' || *p == '\\')
                        out[o++] = '\\';
                out[o++] = *p;
        }
        out[o++] = '"';
        out[o] = 0;
}

/* The SDK asks for a compressed download (`gzip: true`) by setting
 * Accept-Encoding to exactly "gzip"; undici's own default on every request
 * is "gzip, deflate", which is answered with identity (always allowed, and
 * it keeps large downloads at disk speed instead of deflate speed). */
static bool wants_gzip(struct MHD_Connection *c) {
        const char *ae = http_header(c, "Accept-Encoding");
        if (!ae)
                return false;
        while (*ae == ' ')
                ae++;
        size_t n = strlen(ae);
        while (n > 0 && ae[n - 1] == ' ')
                n--;
        return n == 4 && strncasecmp(ae, "gzip", 4) == 0;
}

typedef struct gz_reader {
        int fd;
        gzip_stream *gz;
        char *buf;
        size_t len, off, cap;
        bool eof;
} gz_reader;

static int gz_collect(void *ud, const void *data, size_t len) {
        gz_reader *g = ud;
        if (g->len + len > g->cap) {
                size_t cap = g->cap ? g->cap * 2 : 128 * 1024;
                while (cap < g->len + len)
                        cap *= 2;
                char *b = realloc(g->buf, cap);
                if (!b)
                        return -ENOMEM;
                g->buf = b;
                g->cap = cap;
        }
        memcpy(g->buf + g->len, data, len);
        g->len += len;
        return 0;
}

static ssize_t gz_read(void *cls, uint64_t pos, char *out, size_t max) {
        gz_reader *g = cls;
        while (g->off == g->len) {
                if (g->eof)
                        return MHD_CONTENT_READER_END_OF_STREAM;
                g->off = g->len = 0;
                char in[64 * 1024];
                ssize_t n = read(g->fd, in, sizeof in);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
                if (n == 0)
                        g->eof = true;
                if (gzip_stream_feed(g->gz, in, (size_t) n, n == 0, gz_collect, g) < 0)
                        return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        size_t k = MIN(max, g->len - g->off);
        memcpy(out, g->buf + g->off, k);
        g->off += k;
        return (ssize_t) k;
}

static void gz_free(void *cls) {
        gz_reader *g = cls;
        safe_close(g->fd);
        gzip_stream_free(g->gz);
        free(g->buf);
        free(g);
}

static struct MHD_Response *gzip_response(int fd) {
        gz_reader *g = calloc(1, sizeof *g);
        if (!g)
                return NULL;
        g->fd = fd;
        if (gzip_deflate_new(1, &g->gz) < 0) {
                free(g);
                return NULL;
        }
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, gz_read, g, gz_free);
        if (!r) {
                gzip_stream_free(g->gz);
                free(g);
        }
        return r;
}

/* Over TLS MHD cannot sendfile(), and its own reader of a descriptor reads
 * 4 KiB at a time, a loop turn each: read 256 KiB a turn instead. */
static ssize_t fd_read(void *cls, uint64_t pos, char *out, size_t max) {
        int fd = (int) (intptr_t) cls;
        ssize_t n;
        do
                n = pread(fd, out, max, (off_t) pos);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
        return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : n;
}

static void fd_free(void *cls) {
        close((int) (intptr_t) cls);
}

enum MHD_Result files_get(server *srv, request *req, sbx *sb) {
        struct MHD_Connection *c = req->conn;
        enum MHD_Result mr = MHD_NO;
        if (files_auth(req, sb, false, &mr) < 0)
                return mr;
        hutch_fs_user u;
        const char *home;
        char uname[64];
        if (files_user(req, &u, &home, uname, &mr) < 0)
                return mr;
        const char *qp = http_query(c, "path");
        if (!qp || !*qp)
                return http_reply_error(c, 400, "path is required");
        _cleanup_free_ char *path = path_resolve(qp, home);
        if (!path)
                return MHD_NO;
        int fd = -1;
        hutch_file_info fi = { 0 };
        hutch_error err = { 0 };
        int r = hutch_fs_open_read(sb->h, &u, path, &fd, &fi, &err);
        sbx_mark_dirty(sb);
        if (r < 0) {
                if (r == -ENOENT)
                        return http_reply_error(c, 404, "path '%s' does not exist", path);
                if (r == -EISDIR)
                        return http_reply_error(c, 400, "path '%s' is a directory", path);
                return http_reply_error(c, status_from_errno(r), "reading '%s': %s", path, err.msg);
        }
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                close(fd);
                hutch_file_info_clear(&fi);
                return http_reply_error(c, 400, "path '%s' is not a regular file", path);
        }
        char disp[512];
        content_disposition(fi.name ? fi.name : "file", disp, sizeof disp);
        hutch_file_info_clear(&fi);
        struct MHD_Response *resp;
        if (wants_gzip(c)) {
                resp = gzip_response(fd);
                if (resp)
                        MHD_add_response_header(resp, "Content-Encoding", "gzip");
        } else if (server_tls_on(srv))
                resp = MHD_create_response_from_callback((uint64_t) st.st_size, 256 * 1024, fd_read,
                                                         (void *) (intptr_t) fd, fd_free);
        else
                /* MHD sends the descriptor with sendfile() and closes it */
                resp = MHD_create_response_from_fd64((uint64_t) st.st_size, fd);
        if (!resp) {
                close(fd);
                return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
        MHD_add_response_header(resp, "Content-Disposition", disp);
        mr = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return mr;
}

/* ---------------------------------------------------------------- uploads */

typedef struct upload_file {
        hutch_fs_write *w;
        int fd;
        char *path;
        char *pending;
        size_t plen;
        bool ended;   /* all data of the part is in pending or written */
        uint64_t bytes;
        struct upload_file *next;
} upload_file;

typedef struct files_upload {
        server *srv;
        request *req;
        char sbx_id[HUTCH_ID_LEN + 1];
        hutch_fs_user user;
        const char *home;
        char *query_path;
        multipart_parser *mp;
        gzip_stream *gz;
        upload_file *files;   /* in-flight, oldest first */
        upload_file *cur;     /* the part being received */
        json_t *results;
        char **md_keys, **md_values;
        size_t n_md;
        uint64_t total;
        unsigned n_parts;
        unsigned status;      /* != 0: failed with this status */
        char message[512];
        watcher drain_w;      /* the pipe of files->fd, while full */
        bool suspended;
} files_upload;

static void upload_fail(files_upload *u, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void upload_fail(files_upload *u, unsigned status, const char *fmt, ...) {
        if (u->status)
                return;
        u->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(u->message, sizeof u->message, fmt, ap);
        va_end(ap);
}

static void upload_file_abort(files_upload *u, upload_file *f) {
        if (u->drain_w.fd == f->fd && f->fd >= 0) {
                loop_del(u->srv, &u->drain_w);
                u->drain_w.fd = -1;
        }
        safe_close(f->fd);
        f->fd = -1;
        audit_upload_done(u->srv, u->sbx_id, f, f->path, f->bytes, -ECANCELED);
        if (f->w)
                sbx_write_abort(u->srv, u->sbx_id, f->w); /* deferred to resume when paused */
        f->w = NULL;
        free(f->pending);
        free(f->path);
        free(f);
}

void files_upload_free(files_upload *u) {
        if (!u)
                return;
        while (u->files) {
                upload_file *f = u->files;
                u->files = f->next;
                upload_file_abort(u, f);
        }
        if (u->suspended && u->req) {
                u->suspended = false;
                MHD_resume_connection(u->req->conn);
        }
        multipart_parser_free(u->mp);
        gzip_stream_free(u->gz);
        json_decref(u->results);
        for (size_t i = 0; i < u->n_md; i++) {
                free(u->md_keys[i]);
                free(u->md_values[i]);
        }
        free(u->md_keys);
        free(u->md_values);
        free(u->query_path);
        free(u);
}

static sbx *upload_sandbox(files_upload *u) {
        sbx *sb = sbx_find(u->srv, u->sbx_id);
        if (!sb || sb->paused) {
                upload_fail(u, 502, "The sandbox was not found");
                return NULL;
        }
        return sb;
}

/* A write the layer had no room for: 507, E2B's NotEnoughSpaceError. On
 * gvisor init refuses with EDQUOT a write that would take the sandbox's
 * memory to its limit (the layer's files live in that memory:
 * init/memwatch.c) before the layer itself is full. */
static void upload_fail_no_room(files_upload *u, int r, const char *path) {
        sbx *sb = sbx_find(u->srv, u->sbx_id);
        if (r == -EDQUOT && sb && hutch_backend_caps(sb->backend) & HUTCH_BACKEND_FILES_IN_MEMORY)
                upload_fail(u, 507,
                            "not enough space to write '%s': the sandbox's memory (%lld MiB), which holds its "
                            "files on gvisor, is full",
                            path, (long long) sb->memory_mb);
        else
                upload_fail(u, 507, "not enough disk space to write '%s'", path);
}

/* Write what the pipe takes; keep the rest. 0 = all written. */
static int file_flush(upload_file *f) {
        while (f->plen > 0) {
                ssize_t n = write(f->fd, f->pending, f->plen);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return -EAGAIN;
                        return negative_errno();
                }
                memmove(f->pending, f->pending + n, f->plen - (size_t) n);
                f->plen -= (size_t) n;
        }
        return 0;
}

static void file_commit(files_upload *u, upload_file *f) {
        close(f->fd);
        f->fd = -1;
        hutch_file_info fi = { 0 };
        hutch_error err = { 0 };
        sbx *sb = upload_sandbox(u);
        int r = sb ? hutch_fs_write_commit(f->w, f->bytes, &fi, &err) : -ECONNRESET;
        if (!sb)
                sbx_write_abort(u->srv, u->sbx_id, f->w); /* paused or gone: never committed */
        f->w = NULL; /* commit consumes it */
        if (sb)
                sbx_mark_dirty(sb);
        if (r < 0) {
                if (r == -ENOSPC || r == -EDQUOT)
                        upload_fail_no_room(u, r, f->path);
                else
                        upload_fail(u, status_from_errno(r), "writing '%s': %s", f->path, err.msg);
                audit_upload_done(u->srv, u->sbx_id, f, f->path, f->bytes, r);
                return;
        }
        audit_upload_done(u->srv, u->sbx_id, f, fi.path ? fi.path : f->path, f->bytes, 0);
        json_t *o = json_pack("{s:s, s:s, s:s}", "name", fi.name ? fi.name : "", "type", "file", "path",
                              fi.path ? fi.path : f->path);
        if (u->n_md > 0) {
                json_t *md = json_object();
                for (size_t i = 0; i < u->n_md; i++)
                        json_object_set_new(md, u->md_keys[i], json_string(u->md_values[i]));
                json_object_set_new(o, "metadata", md);
        }
        json_array_append_new(u->results, o);
        hutch_file_info_clear(&fi);
}

/* The pipe broke: hutch-init stopped reading because its write failed (a
 * full layer, say). Its commit reply says why. */
static void file_broken(files_upload *u, upload_file *f, int write_err) {
        if (u->drain_w.fd == f->fd && f->fd >= 0) {
                loop_del(u->srv, &u->drain_w);
                u->drain_w.fd = -1;
        }
        f->fd = safe_close(f->fd);
        free(f->pending);
        f->pending = NULL;
        f->plen = 0;
        hutch_file_info fi = { 0 };
        hutch_error err = { 0 };
        sbx *sb = upload_sandbox(u);
        int r = sb && f->w ? hutch_fs_write_commit(f->w, f->bytes, &fi, &err) : -ECONNRESET;
        if (!sb && f->w)
                sbx_write_abort(u->srv, u->sbx_id, f->w);
        f->w = NULL;
        if (sb)
                sbx_mark_dirty(sb);
        if (r >= 0) {
                hutch_file_info_clear(&fi);
                r = write_err;
                snprintf(err.msg, sizeof err.msg, "%s", strerror(-write_err));
        }
        if (r == -ENOSPC || r == -EDQUOT)
                upload_fail_no_room(u, r, f->path);
        else
                upload_fail(u, status_from_errno(r), "writing '%s': %s", f->path, err.msg);
        audit_upload_done(u->srv, u->sbx_id, f, f->path, f->bytes, r);
}

/* Flush in order; commit files whose data is complete. 0 = nothing pending. */
static int upload_progress(files_upload *u) {
        while (u->files) {
                upload_file *f = u->files;
                int r = file_flush(f);
                if (r == -EAGAIN)
                        return -EAGAIN;
                if (r < 0) {
                        file_broken(u, f, r);
                        return r;
                }
                if (!f->ended)
                        return 0;
                u->files = f->next;
                if (u->cur == f)
                        u->cur = NULL;
                file_commit(u, f);
                free(f->path);
                free(f->pending);
                free(f);
                if (u->status)
                        return -EIO;
        }
        return 0;
}

/* Write out and commit finished files, waiting (bounded) for their pipes,
 * until at most `keep` are in flight. */
static int upload_settle(files_upload *u, unsigned keep) {
        int64_t deadline = wall_ms() + 30000;
        for (;;) {
                unsigned n = 0;
                for (upload_file *f = u->files; f; f = f->next)
                        n++;
                if (n <= keep)
                        return 0;
                upload_file *f = u->files;
                if (!f->ended)
                        return 0;
                if (!upload_sandbox(u))
                        return -EIO;
                int r = upload_progress(u);
                if (u->status)
                        return -EIO;
                if (r == -EAGAIN) {
                        struct pollfd pfd = { .fd = f->fd, .events = POLLOUT };
                        int64_t left = deadline - wall_ms();
                        int k = left > 0 ? poll(&pfd, 1, (int) left) : 0;
                        if (k <= 0) {
                                upload_fail(u, 500, "writing '%s': the sandbox does not take the data", f->path);
                                return -EIO;
                        }
                }
        }
}

static int part_begin(void *ud, const multipart_part *p) {
        files_upload *u = ud;
        if (u->status)
                return -ECANCELED;
        if (++u->n_parts > MAX_FILES_PER_UPLOAD) {
                upload_fail(u, 400, "too many files in one upload");
                return -E2BIG;
        }
        const char *given = u->query_path && u->n_parts == 1 ? u->query_path : p ? p->filename : NULL;
        if (u->query_path && u->n_parts > 1) {
                upload_fail(u, 400, "one file per upload when ?path= is given");
                return -EINVAL;
        }
        if (!given || !*given) {
                upload_fail(u, 400, "missing file path: give ?path= or a filename in the part");
                return -EINVAL;
        }
        char *path = path_resolve(given, u->home);
        if (!path)
                return -ENOMEM;
        for (size_t i = 0; i < json_array_size(u->results); i++) {
                const char *done = json_string_value(json_object_get(json_array_get(u->results, i), "path"));
                if (done && streq(done, path)) {
                        upload_fail(u, 400, "duplicate path '%s' in one upload", path);
                        free(path);
                        return -EINVAL;
                }
        }
        for (upload_file *f = u->files; f; f = f->next)
                if (streq(f->path, path)) {
                        upload_fail(u, 400, "duplicate path '%s' in one upload", path);
                        free(path);
                        return -EINVAL;
                }
        /* hutch-init keeps a bounded number of writes open: finish older
         * files first when a request carries many small ones */
        if (upload_settle(u, MAX_FILES_IN_FLIGHT - 1) < 0) {
                free(path);
                return -EIO;
        }
        sbx *sb = upload_sandbox(u);
        if (!sb) {
                free(path);
                return -ECONNRESET;
        }
        upload_file *f = calloc(1, sizeof *f);
        if (!f) {
                free(path);
                return -ENOMEM;
        }
        f->fd = -1;
        f->path = path;
        hutch_error err = { 0 };
        int r = hutch_fs_write_begin(sb->h, &u->user, path, &f->w, &f->fd, &err);
        sbx_mark_dirty(sb);
        /* a larger pipe means fewer suspend/resume turns per megabyte; the
         * kernel caps it (fs.pipe-max-size) and may refuse: best effort */
        if (r >= 0)
                (void) fcntl(f->fd, F_SETPIPE_SZ, 1 << 20);
        if (r < 0) {
                if (r == -EISDIR)
                        upload_fail(u, 400, "path '%s' is a directory", path);
                else if (r == -ENOSPC || r == -EDQUOT)
                        upload_fail_no_room(u, r, path);
                else
                        upload_fail(u, status_from_errno(r), "writing '%s': %s", path, err.msg);
                free(f->path);
                free(f);
                return r;
        }
        if (u->n_md > 0) {
                r = hutch_fs_write_set_metadata(f->w, (const char *const *) u->md_keys,
                                                (const char *const *) u->md_values, u->n_md, &err);
                if (r < 0) {
                        upload_fail(u, 400, "metadata: %s", err.msg);
                        upload_file_abort(u, f);
                        return r;
                }
        }
        upload_file **pp = &u->files;
        while (*pp)
                pp = &(*pp)->next;
        *pp = f;
        u->cur = f;
        return 0;
}

static int part_data(void *ud, const void *data, size_t len) {
        files_upload *u = ud;
        upload_file *f = u->cur;
        if (u->status || !f)
                return -ECANCELED;
        u->total += len;
        if (u->total > u->srv->cfg.max_upload_bytes) {
                upload_fail(u, 413, "upload exceeds %llu bytes", (unsigned long long) u->srv->cfg.max_upload_bytes);
                return -EFBIG;
        }
        f->bytes += len;
        audit_upload_data(u->srv, f, data, len);
        if (f->plen == 0 && f == u->files) {
                ssize_t n = write(f->fd, data, len);
                if (n < 0) {
                        if (errno != EAGAIN && errno != EINTR) {
                                file_broken(u, f, negative_errno());
                                return -EIO;
                        }
                        n = 0;
                }
                data = (const char *) data + n;
                len -= (size_t) n;
                if (len == 0)
                        return 0;
        }
        char *b = realloc(f->pending, f->plen + len);
        if (!b)
                return -ENOMEM;
        f->pending = b;
        memcpy(f->pending + f->plen, data, len);
        f->plen += len;
        return 0;
}

static int part_end(void *ud) {
        files_upload *u = ud;
        if (u->cur)
                u->cur->ended = true;
        u->cur = NULL;
        return 0;
}

static const multipart_callbacks mp_callbacks = { part_begin, part_data, part_end };

/* Decompressed bytes: to the multipart parser, or straight into the file. */
static int upload_consume(void *ud, const void *data, size_t len) {
        files_upload *u = ud;
        if (u->mp)
                return multipart_parser_feed(u->mp, data, len);
        return part_data(u, data, len);
}

static enum MHD_Result collect_metadata(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        files_upload *u = cls;
        if (strncasecmp(key, "X-Metadata-", 11) != 0)
                return MHD_YES;
        const char *k = key + 11;
        size_t kl = strlen(k);
        bool ok = kl > 0 && kl <= 200 && strlen(value) <= 4096;
        for (const char *p = k; *p && ok; p++)
                ok = *p > 0x20 && *p < 0x7f && *p != '/';
        for (const char *p = value; *p && ok; p++)
                ok = (*p >= 0x20 && *p < 0x7f) || *p == '\t';
        if (!ok) {
                upload_fail(u, 400, "invalid metadata header '%s'", key);
                return MHD_NO;
        }
        if (u->n_md >= MAX_METADATA) {
                upload_fail(u, 400, "too many metadata headers");
                return MHD_NO;
        }
        char **nk = realloc(u->md_keys, (u->n_md + 1) * sizeof *nk);
        if (!nk)
                return MHD_NO;
        u->md_keys = nk;
        char **nv = realloc(u->md_values, (u->n_md + 1) * sizeof *nv);
        if (!nv)
                return MHD_NO;
        u->md_values = nv;
        char *lk = strdup(k);
        char *dv = strdup(value);
        if (!lk || !dv) {
                free(lk);
                free(dv);
                return MHD_NO;
        }
        for (char *p = lk; *p; p++)
                *p = (char) tolower((unsigned char) *p);
        for (size_t i = 0; i < u->n_md; i++)
                if (streq(u->md_keys[i], lk)) {
                        free(u->md_values[i]);
                        u->md_values[i] = dv;
                        free(lk);
                        return MHD_YES;
                }
        u->md_keys[u->n_md] = lk;
        u->md_values[u->n_md] = dv;
        u->n_md++;
        return MHD_YES;
}

enum MHD_Result files_begin(server *srv, request *req, sbx *sb) {
        struct MHD_Connection *c = req->conn;
        enum MHD_Result mr = MHD_NO;
        req->responded = true; /* until the upload is set up, every exit answers */
        if (files_auth(req, sb, true, &mr) < 0)
                return mr;
        files_upload *u = calloc(1, sizeof *u);
        if (!u)
                return MHD_NO;
        u->srv = srv;
        u->req = req;
        u->drain_w.fd = -1;
        memcpy(u->sbx_id, sb->id, sizeof u->sbx_id);
        u->results = json_array();
        char uname[64];
        if (files_user(req, &u->user, &u->home, uname, &mr) < 0) {
                files_upload_free(u);
                return mr;
        }
        const char *qp = http_query(c, "path");
        if (qp && *qp)
                u->query_path = strdup(qp);
        const char *ct = http_header(c, "Content-Type");
        const char *ce = http_header(c, "Content-Encoding");
        MHD_get_connection_values(c, MHD_HEADER_KIND, collect_metadata, u);
        if (u->status) {
                mr = http_reply_error(c, u->status, "%s", u->message);
                files_upload_free(u);
                return mr;
        }
        if (ce && *ce && strcasecmp(ce, "identity") != 0) {
                if (strcasecmp(ce, "gzip") != 0) {
                        files_upload_free(u);
                        return http_reply_error(c, 400, "unsupported Content-Encoding '%s'", ce);
                }
                if (gzip_inflate_new(srv->cfg.max_upload_bytes, &u->gz) < 0) {
                        files_upload_free(u);
                        return MHD_NO;
                }
        }
        if (ct && strncasecmp(ct, "multipart/form-data", 19) == 0) {
                char why[256] = "";
                if (multipart_parser_new(ct, &mp_callbacks, u, &u->mp, why, sizeof why) < 0) {
                        files_upload_free(u);
                        return http_reply_error(c, 400, "%s", why[0] ? why : "invalid multipart Content-Type");
                }
        } else if (ct && strncasecmp(ct, "application/octet-stream", 24) == 0) {
                if (!u->query_path) {
                        files_upload_free(u);
                        return http_reply_error(c, 400, "path is required for application/octet-stream uploads");
                }
                if (part_begin(u, NULL) < 0) {
                        mr = http_reply_error(c, u->status ? u->status : 500, "%s", u->message);
                        files_upload_free(u);
                        return mr;
                }
        } else {
                files_upload_free(u);
                return http_reply_error(c, 400, "unsupported Content-Type '%s': want multipart/form-data or "
                                                "application/octet-stream",
                                        ct ? ct : "");
        }
        req->upload = u;
        req->responded = false;
        return MHD_YES;
}

static void on_pipe_drained(server *srv, watcher *w, uint32_t revents) {
        files_upload *u = w->data;
        loop_del(srv, w);
        w->fd = -1;
        if (u->suspended) {
                u->suspended = false;
                srv->resumes++;
                MHD_resume_connection(u->req->conn);
        }
}

/* The oldest pipe is full: park the connection until it drains. */
static void upload_wait(files_upload *u) {
        if (u->suspended || !u->files)
                return;
        u->drain_w.cb = on_pipe_drained;
        u->drain_w.data = u;
        if (loop_add(u->srv, &u->drain_w, u->files->fd, EPOLLOUT) < 0) {
                u->drain_w.fd = -1;
                upload_fail(u, 500, "epoll: %m");
                return;
        }
        u->suspended = true;
        MHD_suspend_connection(u->req->conn);
}

/* While a worker copies the sandbox's layer its init is frozen: the upload
 * waits (MHD hands the same bytes again after) instead of asking it. */
static bool upload_park(server *srv, files_upload *u) {
        sbx *sb = sbx_find(srv, u->sbx_id);
        return sb && snapjob_park(srv, u->req, sb, RESUME_NONE);
}

enum MHD_Result files_body(server *srv, request *req, const char *data, size_t *size) {
        files_upload *u = req->upload;
        if (u->status) {
                *size = 0;
                return MHD_YES;
        }
        if (upload_park(srv, u))
                return MHD_YES;
        if (upload_progress(u) == -EAGAIN) {
                upload_wait(u);
                return MHD_YES; /* *size unchanged: MHD hands the same bytes again after resume */
        }
        while (*size > 0 && !u->status) {
                size_t n = u->gz ? MIN(*size, (size_t) GZIP_SLICE) : *size;
                int r = u->gz ? gzip_stream_feed(u->gz, data, n, false, upload_consume, u)
                              : upload_consume(u, data, n);
                data += n;
                *size -= n;
                if (r < 0) {
                        if (!u->status) {
                                if (r == -EFBIG)
                                        upload_fail(u, 413, "upload exceeds %llu bytes",
                                                    (unsigned long long) srv->cfg.max_upload_bytes);
                                else if (u->mp && r == -EBADMSG)
                                        upload_fail(u, 400, "malformed multipart body: %s",
                                                    multipart_parser_error(u->mp));
                                else if (r == -EBADMSG)
                                        upload_fail(u, 400, "malformed gzip body");
                                else
                                        upload_fail(u, 500, "upload failed: %s", strerror(-r));
                        }
                        break;
                }
                if (upload_progress(u) == -EAGAIN) {
                        upload_wait(u);
                        return MHD_YES;
                }
        }
        if (u->status)
                *size = 0;
        return MHD_YES;
}

enum MHD_Result files_finish(server *srv, request *req) {
        files_upload *u = req->upload;
        struct MHD_Connection *c = req->conn;
        if (!u->status && upload_park(srv, u))
                return MHD_YES; /* called again after */
        if (!u->status && u->gz) {
                int r = gzip_stream_feed(u->gz, NULL, 0, true, upload_consume, u);
                gzip_stream_free(u->gz);
                u->gz = NULL;
                if (r < 0 && !u->status)
                        upload_fail(u, r == -EFBIG ? 413 : 400, r == -EFBIG ? "upload too large"
                                                                            : "malformed gzip body");
        }
        if (!u->status && u->mp) {
                int r = multipart_parser_finish(u->mp);
                multipart_parser_free(u->mp);
                u->mp = NULL;
                if (r < 0 && !u->status)
                        upload_fail(u, 400, "malformed multipart body: %s", "missing closing boundary");
        } else if (!u->status && !u->mp && u->cur)
                part_end(u);
        if (!u->status) {
                int r = upload_progress(u);
                if (r == -EAGAIN) {
                        upload_wait(u);
                        return MHD_YES; /* called again once the pipe drained */
                }
        }
        req->responded = true;
        if (!u->status && json_array_size(u->results) == 0)
                upload_fail(u, 400, "no file in the request");
        if (u->status) {
                unsigned s = u->status;
                if (s == 502)
                        return http_reply_502(c, u->sbx_id);
                return http_reply_error(c, s, "%s", u->message);
        }
        json_t *res = u->results;
        u->results = NULL;
        return http_reply_json(c, 200, res);
}
