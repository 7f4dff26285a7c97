/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The envd plane (docs/protocol.md §c): Connect RPCs with the JSON codec.
 * Processes run through hutch-init; their pipes come back as descriptors
 * and are read here, on the loop, and fanned out to every stream that
 * watches the process (Start and any number of Connect re-attaches). Every
 * path operation is done by hutch-init inside the sandbox root.
 */
#include <ctype.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "daemon/connect.h"
#include "daemon/requests.h"
#include "daemon/ingress.h"
#include "daemon/server.h"
#include "daemon/templates.h"
#include "daemon/audit.h"
#include "daemon/server.h"
#include "daemon/usage.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/log.h"

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define READ_CHUNK (64 * 1024)
#define STDIN_BUFFER_MAX (4u << 20)
#define EXIT_GRACE_MS 200       /* after exit, wait this long for pipes held by leftover children */
#define EXITED_KEEP_MS 60000    /* Connect after exit still answers start+end this long */
#define PWATCH_MAX_EVENTS 10000
#define PWATCH_MAX_BYTES (4u << 20)
#define KEEPALIVE_MAX_MS (300 * 1000)

/* ------------------------------------------------------------------ base64 */

/* OpenSSL's codec (EVP_EncodeBlock/EVP_DecodeBlock) does the arithmetic;
 * what is ours is the protocol's rule: Connect's JSON codec takes bytes in
 * the standard or the URL-safe alphabet, padded or not (protojson), but one
 * string never mixes the two, and nothing else (no whitespace, no stray
 * '=') is accepted. */
size_t base64_encode(const uint8_t *in, size_t len, char *out) {
        return (size_t) EVP_EncodeBlock((unsigned char *) out, in, (int) len);
}

ssize_t base64_decode(const char *in, size_t len, uint8_t *out) {
        size_t pad = 0;
        while (len > 0 && in[len - 1] == '=')
                len--, pad++;
        /* padding is optional, but when present it is exactly right */
        if (len % 4 == 1 || len > INT_MAX - 4 || (pad && pad != (4 - len % 4) % 4))
                return -EINVAL;
        static const char std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        static const char url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        bool is_url = memchr(in, '-', len) || memchr(in, '_', len);
        const char *alphabet = is_url ? url : std;
        for (size_t i = 0; i < len; i++)
                if (!in[i] || !strchr(alphabet, in[i]))
                        return -EINVAL; /* a mixed alphabet, '=' inside, whitespace */
        size_t padded = (len + 3) / 4 * 4;
        _cleanup_free_ unsigned char *tmp = malloc(padded + 1);
        if (!tmp)
                return -ENOMEM;
        for (size_t i = 0; i < len; i++)
                tmp[i] = is_url ? (in[i] == '-' ? '+' : in[i] == '_' ? '/' : (unsigned char) in[i])
                                : (unsigned char) in[i];
        memset(tmp + len, '=', padded - len);
        tmp[padded] = 0;
        int n = EVP_DecodeBlock(out, tmp, (int) padded);
        if (n < 0)
                return -EINVAL;
        /* EVP_DecodeBlock counts the padding's bytes as data */
        return (ssize_t) n - (ssize_t) (padded - len);
}

/* ------------------------------------------------------------------- users */

int user_resolve(const char *name, hutch_fs_user *ret_user, const char **ret_home) {
        if (streq(name, "root")) {
                *ret_user = (hutch_fs_user){ 0, 0 };
                *ret_home = "/root";
                return 0;
        }
        if (streq(name, "user")) {
                *ret_user = (hutch_fs_user){ 1000, 1000 };
                *ret_home = "/home/user";
                return 0;
        }
        return -ENOENT;
}

int user_from_auth(const char *authorization, char *ret, size_t retlen) {
        if (!authorization) {
                snprintf(ret, retlen, "user");
                return 0;
        }
        if (strncasecmp(authorization, "Basic ", 6) != 0)
                return -EINVAL;
        const char *b = authorization + 6;
        size_t l = strlen(b);
        if (l > 512)
                return -EINVAL;
        uint8_t buf[512];
        ssize_t n = base64_decode(b, l, buf);
        if (n < 0)
                return -EINVAL;
        size_t k = 0;
        while (k < (size_t) n && buf[k] != ':')
                k++;
        if (k == 0) {
                snprintf(ret, retlen, "user");
                return 0;
        }
        if (k >= retlen)
                return -EINVAL;
        memcpy(ret, buf, k);
        ret[k] = 0;
        return 0;
}

char *path_resolve(const char *path, const char *home) {
        if (!path || !*path)
                return NULL;
        if (path[0] == '/')
                return strdup(path);
        if (path[0] == '~' && (path[1] == 0 || path[1] == '/'))
                path += path[1] ? 2 : 1;
        char *r;
        if (asprintf(&r, "%s%s%s", home, *path ? "/" : "", path) < 0)
                return NULL;
        return r;
}

/* ------------------------------------------------------------- JSON helpers */

static const char *file_type_name(int t) {
        switch (t) {
        case HUTCH_FILE_REGULAR:
                return "FILE_TYPE_FILE";
        case HUTCH_FILE_DIRECTORY:
                return "FILE_TYPE_DIRECTORY";
        case HUTCH_FILE_SYMLINK:
                return "FILE_TYPE_SYMLINK";
        default:
                return "FILE_TYPE_UNSPECIFIED";
        }
}

/* Go's FileMode.String() for the bits envd reports. */
static void go_mode_string(uint32_t mode, int type, char out[16]) {
        char *p = out;
        if (type == HUTCH_FILE_SYMLINK)
                *p++ = 'L';
        else if (type == HUTCH_FILE_DIRECTORY)
                *p++ = 'd';
        else if (S_ISFIFO(mode))
                *p++ = 'p';
        else if (S_ISSOCK(mode))
                *p++ = 'S';
        else if (S_ISCHR(mode)) {
                *p++ = 'D';
                *p++ = 'c';
        } else if (S_ISBLK(mode))
                *p++ = 'D';
        const char *rwx = "rwxrwxrwx";
        if (p == out)
                *p++ = '-';
        for (int i = 0; i < 9; i++)
                *p++ = (mode & (1u << (8 - i))) ? rwx[i] : '-';
        *p = 0;
}

/* A link's target made absolute against the link's own directory, and
 * normalized lexically ("." and ".." resolved, never above "/"). */
static char *symlink_target_absolute(const char *link_path, const char *target) {
        char *joined;
        if (target[0] == '/')
                joined = strdup(target);
        else {
                const char *slash = strrchr(link_path, '/');
                int dl = slash ? (int) (slash - link_path) : 0;
                if (asprintf(&joined, "%.*s/%s", dl, link_path, target) < 0)
                        joined = NULL;
        }
        if (!joined)
                return NULL;
        size_t n = strlen(joined);
        char *out = malloc(n + 2);
        if (!out) {
                free(joined);
                return NULL;
        }
        size_t o = 0;
        char *save = NULL;
        for (char *c = strtok_r(joined, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
                if (streq(c, "."))
                        continue;
                if (streq(c, "..")) {
                        while (o > 0 && out[o - 1] != '/')
                                o--;
                        if (o > 0)
                                o--;
                        continue;
                }
                out[o++] = '/';
                size_t cl = strlen(c);
                memcpy(out + o, c, cl);
                o += cl;
        }
        if (o == 0)
                out[o++] = '/';
        out[o] = 0;
        free(joined);
        return out;
}

json_t *entry_to_json(const hutch_file_info *fi) {
        char perms[16], mtime[40], size[32];
        int type = fi->type == HUTCH_FILE_SYMLINK ? fi->target_type : fi->type;
        go_mode_string(fi->mode, fi->type, perms);
        format_rfc3339(fi->mtime_ns / 1000000, mtime);
        snprintf(size, sizeof size, "%llu", (unsigned long long) fi->size);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:s, s:s, s:s}", "name", fi->name ? fi->name : "",
                              "type", file_type_name(type), "path", fi->path ? fi->path : "", "size", size, "mode",
                              (int) (fi->mode & 07777), "permissions", perms, "owner", fi->owner ? fi->owner : "",
                              "group", fi->group ? fi->group : "", "modifiedTime", mtime);
        if (fi->symlink_target) {
                /* envd reports where the link points as an absolute path */
                char *abs = symlink_target_absolute(fi->path ? fi->path : "/", fi->symlink_target);
                json_object_set_new(o, "symlinkTarget", json_string(abs ? abs : fi->symlink_target));
                free(abs);
        }
        if (fi->n_metadata > 0) {
                json_t *md = json_object();
                for (size_t i = 0; i < fi->n_metadata; i++)
                        json_object_set_new(md, fi->metadata_keys[i], json_string(fi->metadata_values[i]));
                json_object_set_new(o, "metadata", md);
        }
        return o;
}

/* ---------------------------------------------------------- request context */

typedef struct rpc {
        server *srv;
        request *req;
        sbx *sb;
        json_t *msg;
        char user[64];
        hutch_fs_user fsu;
        const char *home;
        bool streaming;
} rpc;

static enum MHD_Result rpc_error(rpc *x, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static enum MHD_Result rpc_error(rpc *x, const char *code, const char *fmt, ...) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (!x->streaming)
                return http_reply_connect_error(x->req->conn, code, "%s", msg);
        /* streaming RPCs report errors in the end-stream frame of a 200 */
        enum MHD_Result mr;
        stream *st = stream_new(x->srv, x->req->conn, STREAM_PROCESS, &mr);
        if (st)
                stream_finish(st, code, msg);
        return mr;
}

static enum MHD_Result rpc_errno(rpc *x, int r, const hutch_error *err) {
        return rpc_error(x, connect_code_from_errno(r), "%s", err->msg[0] ? err->msg : strerror(-r));
}

static enum MHD_Result rpc_ok(rpc *x, json_t *body) {
        return http_reply_json(x->req->conn, 200, body ? body : json_object());
}

static char *rpc_path(rpc *x, const char *field) {
        const char *p = json_string_value(req_field(x->msg, field, NULL));
        if (!p || !*p)
                return NULL;
        return path_resolve(p, x->home);
}

/* ------------------------------------------------------------------ processes */

static proc *proc_find(sbx *sb, json_t *selector, bool live_only) {
        if (!json_is_object(selector))
                return NULL;
        json_t *pid = json_object_get(selector, "pid");
        const char *tag = json_string_value(json_object_get(selector, "tag"));
        for (proc *p = sb->procs; p; p = p->next) {
                if (live_only && p->exited && p->out_eof && p->err_eof)
                        continue;
                if (json_is_integer(pid) && p->pid == json_integer_value(pid))
                        return p;
                if (tag && p->tag && streq(tag, p->tag))
                        return p;
        }
        return NULL;
}

static void selector_text(json_t *selector, char *buf, size_t len) {
        json_t *pid = json_object_get(selector, "pid");
        const char *tag = json_string_value(json_object_get(selector, "tag"));
        if (json_is_integer(pid))
                snprintf(buf, len, "process with pid %lld not found", (long long) json_integer_value(pid));
        else if (tag)
                snprintf(buf, len, "process with tag %s not found", tag);
        else
                snprintf(buf, len, "process not found");
}

static bool proc_done(const proc *p) {
        return p->exited && p->out_eof && p->err_eof;
}

static json_t *end_event(const proc *p) {
        char status[64];
        json_t *end = json_object();
        if (p->exit.signal) {
                char name[48];
                const char *s = strsignal(p->exit.signal);
                snprintf(name, sizeof name, "%s", s ? s : "unknown signal");
                for (char *c = name; *c; c++)
                        *c = (char) tolower((unsigned char) *c);
                snprintf(status, sizeof status, "signal: %s%s", name, p->exit.core_dumped ? " (core dumped)" : "");
                json_object_set_new(end, "exitCode", json_integer(-1));
                json_object_set_new(end, "exited", json_false());
                json_object_set_new(end, "status", json_string(status));
                json_object_set_new(end, "error", json_string(status));
        } else {
                snprintf(status, sizeof status, "exit status %d", p->exit.exit_code);
                if (p->exit.exit_code)
                        json_object_set_new(end, "exitCode", json_integer(p->exit.exit_code));
                json_object_set_new(end, "exited", json_true());
                json_object_set_new(end, "status", json_string(status));
                if (p->exit.exit_code)
                        json_object_set_new(end, "error", json_string(status));
        }
        return json_pack("{s:{s:o}}", "event", "end", end);
}

static void proc_complete(server *srv, proc *p) {
        for (stream *st = p->subs; st;) {
                stream *next = st->next_in_proc;
                stream_queue_json(st, end_event(p));
                stream_finish(st, NULL, NULL);
                st->proc = NULL;
                st->next_in_proc = NULL;
                st = next;
        }
        p->subs = NULL;
        p->timeout_stream = NULL;
        if (p->in_fd >= 0) {
                loop_del(srv, &p->in_w);
                p->in_fd = safe_close(p->in_fd);
        }
        free(p->inbuf);
        p->inbuf = NULL;
        p->inlen = 0;
}

static void proc_close_output(server *srv, watcher *w, bool *eof) {
        int fd = w->fd;
        if (fd >= 0) {
                loop_del(srv, w);
                safe_close(fd);
        }
        *eof = true;
}

static void proc_broadcast(server *srv, proc *p, const char *which, const uint8_t *data, size_t n) {
        if (!p->subs)
                return; /* nobody listens: background output is dropped, as envd does */
        /* The event is written out here rather than built with jansson:
         * base64 needs no JSON escaping, and packing, checking and dumping
         * a 64 KiB string cost the loop more than everything else a byte of
         * output costs it (perf, docs/benchmarks.md). The bytes are what
         * json_dumps(JSON_COMPACT) made of the same event. */
        static char *frame;
        static size_t frame_cap;
        char head[48];
        int hl = snprintf(head, sizeof head, "{\"event\":{\"data\":{\"%s\":\"", which);
        static const char tail[] = "\"}}}";
        size_t need = (size_t) hl + 4 * ((n + 2) / 3) + 1 + sizeof tail;
        if (need > frame_cap) {
                char *f = realloc(frame, need);
                if (!f)
                        return;
                frame = f;
                frame_cap = need;
        }
        memcpy(frame, head, (size_t) hl);
        size_t sl = (size_t) hl + base64_encode(data, n, frame + hl);
        memcpy(frame + sl, tail, sizeof tail - 1);
        sl += sizeof tail - 1;
        bool slow = false;
        for (stream *st = p->subs; st; st = st->next_in_proc) {
                stream_queue_frame(st, 0, frame, sl);
                if (st->len - st->off > srv->cfg.stream_buffer_bytes)
                        slow = true;
        }
        if (slow && !p->throttled) {
                p->throttled = true;
                loop_mod(srv, &p->out_w, 0);
                loop_mod(srv, &p->err_w, 0);
        }
}

void proc_maybe_unthrottle(server *srv, proc *p) {
        if (!p->throttled)
                return;
        for (stream *st = p->subs; st; st = st->next_in_proc)
                if (st->len - st->off > srv->cfg.stream_buffer_bytes / 2)
                        return;
        p->throttled = false;
        if (!p->out_eof)
                loop_mod(srv, &p->out_w, EPOLLIN);
        if (!p->err_eof)
                loop_mod(srv, &p->err_w, EPOLLIN);
}

static void proc_check_done(server *srv, proc *p) {
        if (proc_done(p))
                proc_complete(srv, p);
}

static void on_output(server *srv, watcher *w, uint32_t revents) {
        proc *p = w->data;
        bool is_err = w == &p->err_w;
        uint8_t buf[READ_CHUNK];
        for (int round = 0; round < 4 && !p->throttled; round++) {
                ssize_t n = read(w->fd, buf, sizeof buf);
                if (n > 0) {
                        proc_broadcast(srv, p, p->pty ? "pty" : is_err ? "stderr" : "stdout", buf, (size_t) n);
                        continue;
                }
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        return;
                /* EOF, or EIO from a pty master whose slave side is gone */
                proc_close_output(srv, w, is_err ? &p->err_eof : &p->out_eof);
                proc_check_done(srv, p);
                return;
        }
}

static void on_stdin_writable(server *srv, watcher *w, uint32_t revents) {
        proc *p = w->data;
        while (p->inlen > 0) {
                ssize_t n = write(p->in_fd, p->inbuf, p->inlen);
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                return;
                        p->inlen = 0; /* the reader is gone */
                        break;
                }
                memmove(p->inbuf, p->inbuf + n, p->inlen - (size_t) n);
                p->inlen -= (size_t) n;
        }
        loop_del(srv, &p->in_w);
        if (p->close_stdin_pending)
                p->in_fd = safe_close(p->in_fd);
}

static int proc_write_input(server *srv, proc *p, const uint8_t *data, size_t n) {
        if (p->in_fd < 0)
                return -EPIPE;
        if (p->inlen == 0) {
                ssize_t k = write(p->in_fd, data, n);
                if (k < 0) {
                        if (errno != EAGAIN && errno != EINTR)
                                return negative_errno();
                        k = 0;
                }
                data += k;
                n -= (size_t) k;
                if (n == 0)
                        return 0;
        }
        if (p->inlen + n > STDIN_BUFFER_MAX)
                return -ENOBUFS;
        char *b = realloc(p->inbuf, p->inlen + n);
        if (!b)
                return -ENOMEM;
        p->inbuf = b;
        memcpy(p->inbuf + p->inlen, data, n);
        p->inlen += n;
        if (p->in_w.fd < 0) {
                p->in_w.cb = on_stdin_writable;
                p->in_w.data = p;
                if (loop_add(srv, &p->in_w, p->in_fd, EPOLLOUT) < 0)
                        p->in_w.fd = -1;
        }
        return 0;
}

static proc *proc_new(server *srv, sbx *sb, const hutch_process *hp, bool pty) {
        proc *p = calloc(1, sizeof *p);
        if (!p)
                return NULL;
        p->sb = sb;
        p->pid = hp->pid;
        p->pty = pty;
        p->in_fd = -1;
        p->in_w.fd = p->out_w.fd = p->err_w.fd = -1;
        p->out_w.cb = p->err_w.cb = on_output;
        p->out_w.data = p->err_w.data = p;
        if (pty) {
                /* one master: read output from it, write input to a dup */
                p->in_fd = fcntl(hp->stdout_fd, F_DUPFD_CLOEXEC, 3);
                if (loop_add(srv, &p->out_w, hp->stdout_fd, EPOLLIN) < 0)
                        p->out_w.fd = safe_close(hp->stdout_fd);
                p->err_eof = true;
        } else {
                p->in_fd = hp->stdin_fd;
                if (loop_add(srv, &p->out_w, hp->stdout_fd, EPOLLIN) < 0)
                        p->out_w.fd = safe_close(hp->stdout_fd);
                if (loop_add(srv, &p->err_w, hp->stderr_fd, EPOLLIN) < 0)
                        p->err_w.fd = safe_close(hp->stderr_fd);
        }
        if (p->out_w.fd < 0)
                p->out_eof = true;
        if (!pty && p->err_w.fd < 0)
                p->err_eof = true;
        p->next = sb->procs;
        sb->procs = p;
        return p;
}

void proc_free(proc *p) {
        if (!p)
                return;
        safe_close(p->out_w.fd);
        safe_close(p->err_w.fd);
        safe_close(p->in_fd);
        free(p->inbuf);
        free(p->tag);
        json_decref(p->config);
        free(p);
}

void proc_on_exit(server *srv, sbx *sb, const hutch_exit *ex) {
        if (startcmd_on_exit(srv, sb, ex)) /* a template's ready command (startcmd.c) */
                return;
        for (proc *p = sb->procs; p; p = p->next) {
                if (p->pid != ex->pid || p->exited)
                        continue;
                p->exited = true;
                p->exit = *ex;
                p->exited_ms = wall_ms();
                p->deadline_ms = 0;
                /* what the exit causes is logged under the request that started it */
                const char *old = log_set_context(p->request_id[0] ? p->request_id : NULL);
                log_debug("sandbox %s: pid %d exited (code %d, signal %d)", sb->id, (int) p->pid,
                          p->exit.exit_code, p->exit.signal);
                audit_proc_end(srv, sb, p);
                /* read what is already in the pipes before reporting the end */
                if (!p->out_eof && !p->throttled)
                        on_output(srv, &p->out_w, EPOLLIN);
                if (!p->err_eof && !p->throttled)
                        on_output(srv, &p->err_w, EPOLLIN);
                proc_check_done(srv, p);
                log_set_context(old);
                return;
        }
}

/* After a restart: the processes init still runs, with their pipes again. */
void proc_readopt(server *srv, sbx *sb) {
        hutch_proc_info *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (hutch_sandbox_list_procs(sb->h, &v, &n, &err) < 0) {
                log_warning("sandbox %s: listing processes: %s", sb->id, err.msg);
                return;
        }
        for (size_t i = 0; i < n; i++) {
                hutch_process hp;
                if (v[i].tag && streq(v[i].tag, INGRESS_CONNECTOR_TAG)) {
                        /* a gvisor ingress connector of the previous daemon:
                         * nobody holds its pipes any more */
                        (void) hutch_sandbox_signal(sb->h, v[i].pid, SIGKILL, false, &err);
                        continue;
                }
                if (hutch_sandbox_attach_process(sb->h, v[i].pid, NULL, &hp, &err) < 0) {
                        log_debug("sandbox %s: attaching pid %d: %s", sb->id, (int) v[i].pid, err.msg);
                        continue;
                }
                proc *p = proc_new(srv, sb, &hp, v[i].pty);
                if (!p)
                        break;
                if (v[i].tag)
                        p->tag = strdup(v[i].tag);
                if (v[i].request_id) { /* checked well-formed by the library */
                        snprintf(p->request_id, sizeof p->request_id, "%s", v[i].request_id);
                        p->request_id_from_sandbox = true;
                }
                json_t *args = json_array();
                const char *cmd = v[i].argv && v[i].argv[0] ? v[i].argv[0] : "";
                for (size_t k = 1; v[i].argv && v[i].argv[0] && v[i].argv[k]; k++)
                        json_array_append_new(args, json_string(v[i].argv[k]));
                json_t *envs = json_object();
                p->config = json_pack("{s:s, s:o, s:o}", "cmd", cmd, "args", args, "envs", envs);
                if (v[i].cwd)
                        json_object_set_new(p->config, "cwd", json_string(v[i].cwd));
        }
        hutch_proc_info_array_free(v, n);
        sbx_mark_dirty(sb);
}

static int build_env(rpc *x, json_t *req_envs, char ***ret) {
        json_t *env = json_object();
        json_object_set_new(env, "PATH", json_string(DEFAULT_PATH));
        json_object_set_new(env, "HOME", json_string(x->home));
        json_object_set_new(env, "USER", json_string(x->user));
        json_object_set_new(env, "LOGNAME", json_string(x->user));
        /* what E2B's own sandboxes tell their processes */
        json_object_set_new(env, "E2B_SANDBOX", json_string("true"));
        json_object_set_new(env, "E2B_SANDBOX_ID", json_string(x->sb->id));
        json_object_set_new(env, "E2B_TEMPLATE_ID", json_string(x->sb->template_id));
        egress_sbx_env(x->sb->srv, x->sb, env);
        json_object_update(env, x->sb->envs);
        if (json_is_object(req_envs))
                json_object_update(env, req_envs);
        size_t n = json_object_size(env);
        char **v = calloc(n + 1, sizeof *v);
        if (!v) {
                json_decref(env);
                return -ENOMEM;
        }
        size_t i = 0;
        const char *k;
        json_t *val;
        json_object_foreach(env, k, val) {
                const char *s = json_string_value(val);
                if (!s || strchr(k, '=') || !*k)
                        continue;
                if (asprintf(&v[i], "%s=%s", k, s) < 0)
                        break;
                i++;
        }
        json_decref(env);
        *ret = v;
        return 0;
}

static void strv_free(char **v) {
        if (!v)
                return;
        for (char **p = v; *p; p++)
                free(*p);
        free(v);
}

static int64_t header_ms(struct MHD_Connection *c, const char *name, int64_t scale) {
        const char *v = http_header(c, name);
        if (!v || !*v)
                return 0;
        char *e;
        long long n = strtoll(v, &e, 10);
        if (*e || n <= 0)
                return 0;
        if (n > INT64_MAX / scale / 2)
                n = INT64_MAX / scale / 2;
        return (int64_t) n * scale;
}

static stream *open_stream(rpc *x, int kind, enum MHD_Result *mr) {
        stream *st = stream_new(x->srv, x->req->conn, kind, mr);
        if (!st)
                return NULL;
        st->sb = x->sb;
        st->user = x->fsu;
        /* bounded: a suspended connection only notices a gone client when
         * it writes, so every stream writes at least every 5 minutes */
        int64_t ka = header_ms(x->req->conn, "Keepalive-Ping-Interval", 1000);
        st->keepalive_ms = ka > 0 ? MIN(ka, KEEPALIVE_MAX_MS) : 90000;
        return st;
}

/* An image template's WorkingDir (sbx_create keeps it in extra), else the user's home. */
static const char *sbx_default_cwd(sbx *sb, const char *home) {
        const char *w = json_string_value(json_object_get(sb->extra, "workdir"));
        return w && *w ? w : home;
}

static enum MHD_Result process_start(rpc *x) {
        start_request sr;
        char why[256];
        if (start_request_parse(x->msg, &sr, why, sizeof why) < 0)
                return rpc_error(x, "invalid_argument", "%s", why);
        const char *cmd = sr.cmd, *cwd_in = sr.cwd, *tag = sr.tag;
        json_t *args = sr.args, *envs = sr.envs;
        size_t nargs = sr.n_args;
        bool pty = sr.pty, want_stdin = sr.want_stdin;
        unsigned rows = sr.rows, cols = sr.cols;

        /* ${e2b.secrets.NAME}: the process gets the sandbox's placeholder */
        if (json_is_object(envs) && egress_sbx_env_secrets(x->srv, x->sb, envs, why, sizeof why) < 0)
                return rpc_error(x, "invalid_argument", "%s", why);

        _cleanup_free_ char *cwd = NULL;
        hutch_error err = { 0 };
        if (cwd_in && *cwd_in) {
                cwd = path_resolve(cwd_in, x->home);
                hutch_file_info fi = { 0 };
                int r = hutch_fs_stat(x->sb->h, &x->fsu, cwd, &fi, &err);
                sbx_mark_dirty(x->sb);
                int t = fi.type == HUTCH_FILE_SYMLINK ? fi.target_type : fi.type;
                hutch_file_info_clear(&fi);
                if (r < 0 || t != HUTCH_FILE_DIRECTORY)
                        return rpc_error(x, "invalid_argument", "cwd '%s' does not exist", cwd_in);
        }
        const char **argv = calloc(nargs + 2, sizeof *argv);
        if (!argv)
                return MHD_NO;
        argv[0] = cmd;
        for (size_t i = 0; i < nargs; i++)
                argv[i + 1] = json_string_value(json_array_get(args, i));
        char **envp = NULL;
        if (build_env(x, envs, &envp) < 0) {
                free(argv);
                return MHD_NO;
        }
        hutch_spawn_config sc = {
                .argv = argv,
                .envp = (const char *const *) envp,
                .cwd = cwd ? cwd : sbx_default_cwd(x->sb, x->home),
                .uid = x->fsu.uid,
                .gid = x->fsu.gid,
                .stdin_mode = want_stdin && !pty ? HUTCH_STDIN_PIPE : HUTCH_STDIN_NULL,
                .pty = pty,
                .pty_rows = (uint16_t) rows,
                .pty_cols = (uint16_t) cols,
                .tag = tag,
                .request_id = x->req->rid,
        };
        hutch_process hp;
        int r = hutch_sandbox_spawn(x->sb->h, &sc, &hp, &err);
        sbx_mark_dirty(x->sb);
        free(argv);
        strv_free(envp);
        if (r < 0) {
                if (r == -ENOENT || r == -EACCES || r == -ENOEXEC)
                        return rpc_error(x, "invalid_argument", "failed to start process '%s': %s", cmd, err.msg);
                return rpc_errno(x, r, &err);
        }
        proc *p = proc_new(x->srv, x->sb, &hp, pty);
        if (!p) {
                hutch_error e2 = { 0 };
                hutch_sandbox_signal(x->sb->h, hp.pid, SIGKILL, true, &e2);
                return MHD_NO;
        }
        if (tag)
                p->tag = strdup(tag);
        snprintf(p->request_id, sizeof p->request_id, "%s", x->req->rid);
        p->config = json_pack("{s:s, s:O?, s:O?}", "cmd", cmd, "args", args, "envs", envs);
        if (!args)
                json_object_set_new(p->config, "args", json_array());
        if (!envs)
                json_object_set_new(p->config, "envs", json_object());
        if (cwd_in)
                json_object_set_new(p->config, "cwd", json_string(cwd_in));
        audit_proc_start(x->srv, x->sb, p, x->user, cwd ? cwd : x->home);
        usage_proc_started(x->srv, x->sb);

        enum MHD_Result mr;
        stream *st = open_stream(x, STREAM_PROCESS, &mr);
        if (!st)
                return mr;
        st->proc = p;
        st->next_in_proc = p->subs;
        p->subs = st;
        stream_queue_json(st, json_pack("{s:{s:{s:i}}}", "event", "start", "pid", (int) p->pid));
        st->started = true;
        int64_t t = header_ms(x->req->conn, "Connect-Timeout-Ms", 1);
        if (t > 0) {
                p->deadline_ms = wall_ms() + t;
                p->timeout_stream = st;
        }
        return mr;
}

/* The running process the request's `process` selector names (pid or tag). */
static bool live_proc(rpc *x, proc **ret) {
        proc *p = proc_find(x->sb, req_field(x->msg, "process", NULL), true);
        if (!p || p->exited)
                return false;
        *ret = p;
        return true;
}

static enum MHD_Result rpc_not_found_proc(rpc *x) {
        char msg[128];
        selector_text(req_field(x->msg, "process", NULL), msg, sizeof msg);
        return rpc_error(x, "not_found", "%s", msg);
}

static enum MHD_Result process_connect(rpc *x) {
        proc *p = proc_find(x->sb, req_field(x->msg, "process", NULL), false);
        if (!p)
                return rpc_not_found_proc(x);
        enum MHD_Result mr;
        stream *st = open_stream(x, STREAM_PROCESS, &mr);
        if (!st)
                return mr;
        stream_queue_json(st, json_pack("{s:{s:{s:i}}}", "event", "start", "pid", (int) p->pid));
        st->started = true;
        if (proc_done(p)) {
                stream_queue_json(st, end_event(p));
                stream_finish(st, NULL, NULL);
                return mr;
        }
        st->proc = p;
        st->next_in_proc = p->subs;
        p->subs = st;
        int64_t t = header_ms(x->req->conn, "Connect-Timeout-Ms", 1);
        if (t > 0)
                st->deadline_ms = wall_ms() + t;
        return mr;
}

static enum MHD_Result process_list(rpc *x) {
        json_t *arr = json_array();
        for (proc *p = x->sb->procs; p; p = p->next) {
                if (p->exited)
                        continue;
                json_t *o = json_pack("{s:i, s:O}", "pid", (int) p->pid, "config", p->config);
                if (p->tag)
                        json_object_set_new(o, "tag", json_string(p->tag));
                json_array_insert_new(arr, 0, o); /* procs are newest first: list in start order */
        }
        return rpc_ok(x, json_pack("{s:o}", "processes", arr));
}

static enum MHD_Result process_send_input(rpc *x) {
        proc *p;
        if (!live_proc(x, &p))
                return rpc_not_found_proc(x);
        json_t *in = req_field(x->msg, "input", NULL);
        const char *data = json_string_value(req_field(in, "stdin", NULL));
        const char *ptyd = json_string_value(req_field(in, "pty", NULL));
        if (!data && !ptyd)
                return rpc_error(x, "invalid_argument", "input.stdin or input.pty is required");
        if (ptyd && !p->pty)
                return rpc_error(x, "failed_precondition", "process has no pty");
        /* stdin input to a pty process goes to the pty too, as envd does */
        const char *s = data ? data : ptyd;
        size_t l = strlen(s);
        uint8_t *buf = malloc(l / 4 * 3 + 4);
        if (!buf)
                return MHD_NO;
        ssize_t n = base64_decode(s, l, buf);
        if (n < 0) {
                free(buf);
                return rpc_error(x, "invalid_argument", "input is not valid base64");
        }
        if (p->in_fd < 0) {
                free(buf);
                return rpc_error(x, "failed_precondition", "stdin of process %d is not open", (int) p->pid);
        }
        int r = proc_write_input(x->srv, p, buf, (size_t) n);
        free(buf);
        if (r == -ENOBUFS)
                return rpc_error(x, "resource_exhausted", "too much input is waiting for process %d", (int) p->pid);
        if (r < 0)
                return rpc_error(x, "failed_precondition", "writing to process %d: %s", (int) p->pid, strerror(-r));
        return rpc_ok(x, NULL);
}

static int signal_from_json(json_t *v) {
        if (json_is_integer(v))
                return (int) json_integer_value(v);
        const char *s = json_string_value(v);
        if (!s)
                return 0;
        if (streq(s, "SIGNAL_SIGKILL"))
                return SIGKILL;
        if (streq(s, "SIGNAL_SIGTERM"))
                return SIGTERM;
        if (streq(s, "SIGNAL_SIGINT"))
                return SIGINT;
        if (streq(s, "SIGNAL_SIGHUP"))
                return SIGHUP;
        return 0;
}

static enum MHD_Result process_send_signal(rpc *x) {
        proc *p;
        if (!live_proc(x, &p))
                return rpc_not_found_proc(x);
        int sig = signal_from_json(req_field(x->msg, "signal", NULL));
        if (sig != SIGKILL && sig != SIGTERM && sig != SIGINT && sig != SIGHUP)
                return rpc_error(x, "invalid_argument", "unsupported signal");
        hutch_error err = { 0 };
        int r = hutch_sandbox_signal(x->sb->h, p->pid, sig, true, &err);
        sbx_mark_dirty(x->sb);
        if (r < 0 && r != -ESRCH)
                return rpc_errno(x, r, &err);
        return rpc_ok(x, NULL);
}

static enum MHD_Result process_close_stdin(rpc *x) {
        proc *p;
        if (!live_proc(x, &p))
                return rpc_not_found_proc(x);
        if (p->pty)
                return rpc_error(x, "failed_precondition", "cannot close stdin of a pty process");
        if (p->in_fd >= 0 && p->inlen == 0) {
                loop_del(x->srv, &p->in_w);
                p->in_fd = safe_close(p->in_fd);
        } else if (p->in_fd >= 0)
                p->close_stdin_pending = true; /* after what is queued */
        hutch_error err = { 0 };
        int r = hutch_sandbox_close_stdin(x->sb->h, p->pid, &err);
        sbx_mark_dirty(x->sb);
        if (r < 0 && r != -ESRCH && r != -ENOENT)
                return rpc_errno(x, r, &err);
        return rpc_ok(x, NULL);
}

static enum MHD_Result process_update(rpc *x) {
        proc *p;
        if (!live_proc(x, &p))
                return rpc_not_found_proc(x);
        json_t *size = req_field(req_field(x->msg, "pty", NULL), "size", NULL);
        json_t *r = req_field(size, "rows", NULL), *c = req_field(size, "cols", NULL);
        if (!json_is_integer(r) || !json_is_integer(c) || json_integer_value(r) <= 0 || json_integer_value(c) <= 0 ||
            json_integer_value(r) > 65535 || json_integer_value(c) > 65535)
                return rpc_error(x, "invalid_argument", "pty.size.rows and pty.size.cols are required");
        if (!p->pty)
                return rpc_error(x, "failed_precondition", "process %d has no pty", (int) p->pid);
        hutch_error err = { 0 };
        int k = hutch_sandbox_resize(x->sb->h, p->pid, (uint16_t) json_integer_value(r),
                                     (uint16_t) json_integer_value(c), &err);
        sbx_mark_dirty(x->sb);
        if (k < 0)
                return rpc_errno(x, k, &err);
        return rpc_ok(x, NULL);
}

/* ----------------------------------------------------------------- filesystem */

static enum MHD_Result fs_stat(rpc *x) {
        _cleanup_free_ char *path = rpc_path(x, "path");
        if (!path)
                return rpc_error(x, "invalid_argument", "path is required");
        hutch_file_info fi = { 0 };
        hutch_error err = { 0 };
        int r = hutch_fs_stat(x->sb->h, &x->fsu, path, &fi, &err);
        sbx_mark_dirty(x->sb);
        if (r == -ENOENT)
                return rpc_error(x, "not_found", "file not found: %s", path);
        if (r < 0)
                return rpc_errno(x, r, &err);
        json_t *e = entry_to_json(&fi);
        hutch_file_info_clear(&fi);
        return rpc_ok(x, json_pack("{s:o}", "entry", e));
}

static enum MHD_Result fs_make_dir(rpc *x) {
        _cleanup_free_ char *path = rpc_path(x, "path");
        if (!path)
                return rpc_error(x, "invalid_argument", "path is required");
        hutch_error err = { 0 };
        int r = hutch_fs_mkdir(x->sb->h, &x->fsu, path, true, &err);
        sbx_mark_dirty(x->sb);
        audit_fs(x->srv, x->sb, "dir.create", path, NULL, r == 0 ? -EEXIST : r < 0 ? r : 0);
        if (r == 0)
                return rpc_error(x, "already_exists", "directory already exists: %s", path);
        if (r == -EEXIST || r == -ENOTDIR)
                return rpc_error(x, "invalid_argument", "path already exists but is not a directory: %s", path);
        if (r < 0)
                return rpc_errno(x, r, &err);
        hutch_file_info fi = { 0 };
        r = hutch_fs_stat(x->sb->h, &x->fsu, path, &fi, &err);
        if (r < 0)
                return rpc_errno(x, r, &err);
        json_t *e = entry_to_json(&fi);
        hutch_file_info_clear(&fi);
        return rpc_ok(x, json_pack("{s:o}", "entry", e));
}

static enum MHD_Result fs_move(rpc *x) {
        _cleanup_free_ char *src = rpc_path(x, "source");
        _cleanup_free_ char *dst = rpc_path(x, "destination");
        if (!src || !dst)
                return rpc_error(x, "invalid_argument", "source and destination are required");
        hutch_error err = { 0 };
        int r = hutch_fs_move(x->sb->h, &x->fsu, src, dst, &err);
        sbx_mark_dirty(x->sb);
        audit_fs(x->srv, x->sb, "file.move", src, dst, r);
        if (r == -ENOENT)
                return rpc_error(x, "not_found", "source file not found: %s", src);
        /* rename(2) does not cross file systems (the writable layer, /dev/shm,
         * a volume): the client's to fix, not the server's fault */
        if (r == -EXDEV)
                return rpc_error(x, "invalid_argument",
                                 "cannot move %s to %s: they are on different file systems (copy, then remove)", src,
                                 dst);
        if (r < 0)
                return rpc_errno(x, r, &err);
        hutch_file_info fi = { 0 };
        r = hutch_fs_stat(x->sb->h, &x->fsu, dst, &fi, &err);
        if (r < 0)
                return rpc_errno(x, r, &err);
        json_t *e = entry_to_json(&fi);
        hutch_file_info_clear(&fi);
        return rpc_ok(x, json_pack("{s:o}", "entry", e));
}

static int cmp_entry_path(const void *a, const void *b) {
        const hutch_file_info *x = a, *y = b;
        /* compare component-wise so that "d/x" sorts right after "d", before "d-1" */
        const char *p = x->path ? x->path : "", *q = y->path ? y->path : "";
        for (; *p && *p == *q; p++, q++)
                ;
        unsigned char cp = *p == '/' ? 1 : (unsigned char) *p, cq = *q == '/' ? 1 : (unsigned char) *q;
        return (int) cp - (int) cq;
}

static enum MHD_Result fs_list_dir(rpc *x) {
        _cleanup_free_ char *path = rpc_path(x, "path");
        if (!path)
                return rpc_error(x, "invalid_argument", "path is required");
        json_t *d = req_field(x->msg, "depth", NULL);
        json_int_t depth = json_is_integer(d) ? json_integer_value(d) : 1;
        if (depth <= 0)
                depth = 1;
        if (depth > 64)
                return rpc_error(x, "invalid_argument", "depth must be at most 64");
        hutch_error err = { 0 };
        hutch_file_info fi = { 0 };
        int r = hutch_fs_stat(x->sb->h, &x->fsu, path, &fi, &err);
        sbx_mark_dirty(x->sb);
        if (r == -ENOENT)
                return rpc_error(x, "not_found", "directory not found: %s", path);
        if (r < 0)
                return rpc_errno(x, r, &err);
        int t = fi.type == HUTCH_FILE_SYMLINK ? fi.target_type : fi.type;
        hutch_file_info_clear(&fi);
        if (t != HUTCH_FILE_DIRECTORY)
                return rpc_error(x, "invalid_argument", "path is not a directory: %s", path);
        hutch_file_info *v = NULL;
        size_t n = 0;
        r = hutch_fs_list(x->sb->h, &x->fsu, path, (unsigned) depth, &v, &n, &err);
        if (r == -ENOENT)
                return rpc_error(x, "not_found", "directory not found: %s", path);
        if (r < 0)
                return rpc_errno(x, r, &err);
        /* by full path: each directory's entries in name order, depth first (as envd walks) */
        if (n > 1)
                qsort(v, n, sizeof *v, cmp_entry_path);
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
                json_array_append_new(arr, entry_to_json(&v[i]));
        hutch_file_info_array_free(v, n);
        return rpc_ok(x, json_pack("{s:o}", "entries", arr));
}

static enum MHD_Result fs_remove(rpc *x) {
        _cleanup_free_ char *path = rpc_path(x, "path");
        if (!path)
                return rpc_error(x, "invalid_argument", "path is required");
        hutch_error err = { 0 };
        int r = hutch_fs_remove(x->sb->h, &x->fsu, path, &err);
        sbx_mark_dirty(x->sb);
        audit_fs(x->srv, x->sb, "file.delete", path, NULL, r);
        if (r < 0 && r != -ENOENT)
                return rpc_errno(x, r, &err);
        return rpc_ok(x, NULL);
}

/* Watches: a stream (WatchDir) or a polled watcher (CreateWatcher). */
typedef struct pwatch {
        uint32_t id;
        char *root;
        bool recursive, include_entry;
        hutch_fs_user user;
        json_t *events;
        size_t bytes;     /* a bound on what events keeps */
        unsigned dropped;
        struct pwatch *next;
} pwatch;

static int watch_prepare(rpc *x, char **ret_root, uint32_t *ret_id, bool recursive) {
        _cleanup_free_ char *path = rpc_path(x, "path");
        if (!path) {
                rpc_error(x, "invalid_argument", "path is required");
                return -EINVAL;
        }
        hutch_error err = { 0 };
        hutch_file_info fi = { 0 };
        int r = hutch_fs_stat(x->sb->h, &x->fsu, path, &fi, &err);
        sbx_mark_dirty(x->sb);
        int t = fi.type == HUTCH_FILE_SYMLINK ? fi.target_type : fi.type;
        hutch_file_info_clear(&fi);
        if (r == -ENOENT) {
                rpc_error(x, "not_found", "path %s not found", path);
                return r;
        }
        if (r < 0) {
                rpc_errno(x, r, &err);
                return r;
        }
        if (t != HUTCH_FILE_DIRECTORY) {
                rpc_error(x, "invalid_argument", "path %s is not a directory", path);
                return -ENOTDIR;
        }
        r = hutch_fs_watch_add(x->sb->h, &x->fsu, path, recursive, ret_id, &err);
        if (r < 0) {
                rpc_errno(x, r, &err);
                return r;
        }
        size_t l = strlen(path);
        while (l > 1 && path[l - 1] == '/')
                path[--l] = 0;
        *ret_root = TAKE_PTR(path);
        return 0;
}

static enum MHD_Result fs_watch_dir(rpc *x) {
        bool recursive = json_is_true(req_field(x->msg, "recursive", NULL));
        bool entry = json_is_true(req_field(x->msg, "includeEntry", "include_entry"));
        char *root = NULL;
        uint32_t id = 0;
        if (watch_prepare(x, &root, &id, recursive) < 0)
                return MHD_YES;
        enum MHD_Result mr;
        stream *st = open_stream(x, STREAM_WATCH, &mr);
        if (!st) {
                hutch_error err = { 0 };
                hutch_fs_watch_remove(x->sb->h, id, &err);
                free(root);
                return mr;
        }
        st->watch_id = id;
        st->watch_root = root;
        st->watch_recursive = recursive;
        st->watch_entry = entry;
        stream_queue_json(st, json_pack("{s:{}}", "start"));
        st->started = true;
        int64_t t = header_ms(x->req->conn, "Connect-Timeout-Ms", 1);
        if (t > 0)
                st->deadline_ms = wall_ms() + t;
        return mr;
}

static const char *event_type_name(int k) {
        switch (k) {
        case HUTCH_WATCH_CREATE:
                return "EVENT_TYPE_CREATE";
        case HUTCH_WATCH_WRITE:
                return "EVENT_TYPE_WRITE";
        case HUTCH_WATCH_REMOVE:
                return "EVENT_TYPE_REMOVE";
        case HUTCH_WATCH_RENAME:
                return "EVENT_TYPE_RENAME";
        case HUTCH_WATCH_CHMOD:
                return "EVENT_TYPE_CHMOD";
        default:
                return "EVENT_TYPE_UNSPECIFIED";
        }
}

static json_t *watch_event_json(server *srv, sbx *sb, const hutch_event *ev, const char *root, bool entry,
                                const hutch_fs_user *u) {
        if (!ev->path)
                return NULL;
        size_t rl = strlen(root);
        const char *name;
        /* the watched directory's own events: its name relative to itself */
        if (streq(ev->path, root))
                name = ".";
        else if (streq(root, "/"))
                name = ev->path + 1;
        else if (strncmp(ev->path, root, rl) == 0 && ev->path[rl] == '/')
                name = ev->path + rl + 1;
        else
                return NULL;
        json_t *o = json_pack("{s:s, s:s}", "name", name, "type", event_type_name(ev->watch_kind));
        if (entry && (ev->watch_kind == HUTCH_WATCH_CREATE || ev->watch_kind == HUTCH_WATCH_WRITE ||
                      ev->watch_kind == HUTCH_WATCH_CHMOD)) {
                hutch_file_info fi = { 0 };
                hutch_error err = { 0 };
                if (hutch_fs_stat(sb->h, u, ev->path, &fi, &err) >= 0) {
                        json_object_set_new(o, "entry", entry_to_json(&fi));
                        hutch_file_info_clear(&fi);
                }
                sbx_mark_dirty(sb);
        }
        return o;
}

void stream_on_watch_event(server *srv, sbx *sb, const hutch_event *ev) {
        for (stream *st = srv->streams; st; st = st->next) {
                if (st->sb != sb || st->kind != STREAM_WATCH || st->watch_id != ev->watch_id || st->finished)
                        continue;
                /* a reader that does not keep up loses events, never the
                 * daemon's memory */
                if (st->len - st->off > srv->cfg.stream_buffer_bytes) {
                        st->watch_dropped++;
                        return;
                }
                json_t *o = watch_event_json(srv, sb, ev, st->watch_root, st->watch_entry, &st->user);
                if (o)
                        stream_queue_json(st, json_pack("{s:o}", "filesystem", o));
                return;
        }
        for (pwatch *w = sb->pwatches; w; w = w->next) {
                if (w->id != ev->watch_id)
                        continue;
                if (json_array_size(w->events) >= PWATCH_MAX_EVENTS || w->bytes > PWATCH_MAX_BYTES) {
                        w->dropped++;
                        return;
                }
                json_t *o = watch_event_json(srv, sb, ev, w->root, w->include_entry, &w->user);
                if (o) {
                        w->bytes += strlen(ev->path) + (w->include_entry ? 512 : 64);
                        json_array_append_new(w->events, o);
                }
                return;
        }
}

static enum MHD_Result fs_create_watcher(rpc *x) {
        bool recursive = json_is_true(req_field(x->msg, "recursive", NULL));
        bool entry = json_is_true(req_field(x->msg, "includeEntry", "include_entry"));
        unsigned n = 0;
        for (pwatch *w = x->sb->pwatches; w; w = w->next)
                n++;
        if (n >= 64)
                return rpc_error(x, "resource_exhausted", "too many watchers in this sandbox");
        char *root = NULL;
        uint32_t id = 0;
        if (watch_prepare(x, &root, &id, recursive) < 0)
                return MHD_YES;
        pwatch *w = calloc(1, sizeof *w);
        if (!w) {
                free(root);
                return MHD_NO;
        }
        w->id = id;
        w->root = root;
        w->recursive = recursive;
        w->include_entry = entry;
        w->user = x->fsu;
        w->events = json_array();
        w->next = x->sb->pwatches;
        x->sb->pwatches = w;
        char ids[32];
        snprintf(ids, sizeof ids, "w%u", id);
        return rpc_ok(x, json_pack("{s:s}", "watcherId", ids));
}

static pwatch **pwatch_find(rpc *x) {
        const char *ids = json_string_value(req_field(x->msg, "watcherId", "watcher_id"));
        if (!ids || ids[0] != 'w')
                return NULL;
        char *e;
        unsigned long id = strtoul(ids + 1, &e, 10);
        if (*e)
                return NULL;
        for (pwatch **pp = &x->sb->pwatches; *pp; pp = &(*pp)->next)
                if ((*pp)->id == id)
                        return pp;
        return NULL;
}

static enum MHD_Result fs_get_watcher_events(rpc *x) {
        pwatch **pp = pwatch_find(x);
        if (!pp)
                return rpc_error(x, "not_found", "watcher not found");
        json_t *evs = (*pp)->events;
        (*pp)->events = json_array();
        (*pp)->bytes = 0;
        return rpc_ok(x, json_pack("{s:o}", "events", evs));
}

static void pwatch_free(pwatch *w) {
        json_decref(w->events);
        free(w->root);
        free(w);
}

static enum MHD_Result fs_remove_watcher(rpc *x) {
        pwatch **pp = pwatch_find(x);
        if (!pp)
                return rpc_error(x, "not_found", "watcher not found");
        pwatch *w = *pp;
        *pp = w->next;
        hutch_error err = { 0 };
        (void) hutch_fs_watch_remove(x->sb->h, w->id, &err);
        sbx_mark_dirty(x->sb);
        pwatch_free(w);
        return rpc_ok(x, NULL);
}

void sbx_pwatches_free(sbx *sb) {
        while (sb->pwatches) {
                pwatch *w = sb->pwatches;
                sb->pwatches = w->next;
                pwatch_free(w);
        }
}

/* ------------------------------------------------------------------ timers */

int64_t envd_timers(server *srv, int64_t now) {
        int64_t next = -1;
#define DUE(t)                                   \
        do {                                     \
                if ((t) > 0 && (next < 0 || (t) < next)) \
                        next = (t);              \
        } while (0)
        for (stream *st = srv->streams; st; st = st->next) {
                if (st->finished || st->cut)
                        continue;
                if (st->deadline_ms && st->deadline_ms <= now) {
                        if (st->proc) {
                                proc *p = st->proc;
                                for (stream **pp = &p->subs; *pp; pp = &(*pp)->next_in_proc)
                                        if (*pp == st) {
                                                *pp = st->next_in_proc;
                                                break;
                                        }
                                st->proc = NULL;
                                proc_maybe_unthrottle(srv, p);
                        }
                        stream_finish(st, "deadline_exceeded", "context deadline exceeded");
                        continue;
                }
                DUE(st->deadline_ms);
                if (st->keepalive_ms && st->started) {
                        if (now - st->last_send_ms >= st->keepalive_ms) {
                                if (st->kind == STREAM_PROCESS)
                                        stream_queue_json(st, json_pack("{s:{s:{}}}", "event", "keepalive"));
                                else
                                        stream_queue_json(st, json_pack("{s:{}}", "keepalive"));
                        }
                        DUE(st->last_send_ms + st->keepalive_ms);
                }
        }
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next) {
                /* snapshotting: its init may be frozen; the deadlines wait
                 * for the end of the copy, which wakes the loop */
                if (sb->dead || sb->paused || sb->snapshotting)
                        continue;
                unsigned exited = 0;
                for (proc **pp = &sb->procs; *pp;) {
                        proc *p = *pp;
                        if (p->deadline_ms && p->deadline_ms <= now && !p->exited) {
                                hutch_error err = { 0 };
                                p->deadline_ms = 0;
                                (void) hutch_sandbox_signal(sb->h, p->pid, SIGKILL, true, &err);
                                sbx_mark_dirty(sb);
                                stream *ts = p->timeout_stream;
                                if (ts) {
                                        for (stream **sp = &p->subs; *sp; sp = &(*sp)->next_in_proc)
                                                if (*sp == ts) {
                                                        *sp = ts->next_in_proc;
                                                        break;
                                                }
                                        ts->proc = NULL;
                                        p->timeout_stream = NULL;
                                        stream_finish(ts, "deadline_exceeded", "context deadline exceeded");
                                }
                        }
                        DUE(p->deadline_ms);
                        if (p->exited && !proc_done(p)) {
                                /* children that inherited the pipes keep them open:
                                 * report the end once the grace period is over */
                                if (now - p->exited_ms >= EXIT_GRACE_MS) {
                                        if (!p->throttled) {
                                                if (!p->out_eof)
                                                        on_output(srv, &p->out_w, EPOLLIN);
                                                if (!p->err_eof)
                                                        on_output(srv, &p->err_w, EPOLLIN);
                                        }
                                        proc_close_output(srv, &p->out_w, &p->out_eof);
                                        proc_close_output(srv, &p->err_w, &p->err_eof);
                                        proc_complete(srv, p);
                                } else
                                        DUE(p->exited_ms + EXIT_GRACE_MS);
                        }
                        if (proc_done(p)) {
                                exited++;
                                if (now - p->exited_ms > EXITED_KEEP_MS || exited > PROC_EXITED_KEEP) {
                                        *pp = p->next;
                                        proc_free(p);
                                        continue;
                                }
                                DUE(p->exited_ms + EXITED_KEEP_MS + 1);
                        }
                        pp = &p->next;
                }
        }
#undef DUE
        return next;
}

/* ---------------------------------------------------------------- dispatch */

static bool content_type_is(struct MHD_Connection *c, const char *want) {
        const char *ct = http_header(c, "Content-Type");
        if (!ct)
                return false;
        size_t l = strlen(want);
        return strncasecmp(ct, want, l) == 0 && (ct[l] == 0 || ct[l] == ';' || ct[l] == ' ');
}

static const struct rpc_route {
        const char *path;
        bool streaming;
        enum MHD_Result (*fn)(rpc *x);
} rpc_routes[] = {
        { "/process.Process/Start", true, process_start },
        { "/process.Process/Connect", true, process_connect },
        { "/process.Process/List", false, process_list },
        { "/process.Process/SendInput", false, process_send_input },
        { "/process.Process/SendSignal", false, process_send_signal },
        { "/process.Process/CloseStdin", false, process_close_stdin },
        { "/process.Process/Update", false, process_update },
        { "/filesystem.Filesystem/Stat", false, fs_stat },
        { "/filesystem.Filesystem/MakeDir", false, fs_make_dir },
        { "/filesystem.Filesystem/Move", false, fs_move },
        { "/filesystem.Filesystem/ListDir", false, fs_list_dir },
        { "/filesystem.Filesystem/Remove", false, fs_remove },
        { "/filesystem.Filesystem/WatchDir", true, fs_watch_dir },
        { "/filesystem.Filesystem/CreateWatcher", false, fs_create_watcher },
        { "/filesystem.Filesystem/GetWatcherEvents", false, fs_get_watcher_events },
        { "/filesystem.Filesystem/RemoveWatcher", false, fs_remove_watcher },
};

static enum MHD_Result envd_metrics(server *srv, request *req, sbx *sb) {
        sbx_sample(srv, sb, wall_ms());
        unsigned k = (sb->sample_head + SBX_METRICS - 1) % SBX_METRICS;
        const struct sample *m = &sb->samples[k];
        return http_reply_json(req->conn, 200,
                               json_pack("{s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I}", "ts",
                                         (json_int_t) (m->ts_ms / 1000), "cpu_count", (json_int_t) sb->cpu_count,
                                         "cpu_used_pct", m->cpu_pct, "mem_total", (json_int_t) m->mem_total,
                                         "mem_used", (json_int_t) m->mem_used, "mem_cache", (json_int_t) m->mem_cache,
                                         "disk_used", (json_int_t) m->disk_used, "disk_total",
                                         (json_int_t) m->disk_total));
}

enum MHD_Result envd_dispatch(server *srv, request *req, sbx *sb) {
        struct MHD_Connection *c = req->conn;
        const char *url = req->url;
        const char *m = req->method;
        if (streq(url, "/health")) {
                if (!streq(m, "GET") && !streq(m, "HEAD"))
                        return http_reply_error(c, 405, "method not allowed");
                return http_reply_empty(c, 204);
        }
        if (streq(url, "/envs") && streq(m, "GET")) {
                json_t *e = json_pack("{s:s, s:s, s:s}", "E2B_SANDBOX", "true", "E2B_SANDBOX_ID", sb->id,
                                      "E2B_TEMPLATE_ID", sb->template_id);
                egress_sbx_env(srv, sb, e);
                json_object_update(e, sb->envs);
                return http_reply_json(c, 200, e);
        }
        if (streq(url, "/metrics") && streq(m, "GET"))
                return envd_metrics(srv, req, sb);
        if (streq(url, "/files")) {
                if (streq(m, "GET"))
                        return files_get(srv, req, sb);
                return http_reply_error(c, 405, "method %s not allowed on /files", m);
        }
        const struct rpc_route *route = NULL;
        for (size_t i = 0; i < ELEMENTSOF(rpc_routes); i++)
                if (streq(url, rpc_routes[i].path))
                        route = &rpc_routes[i];
        if (!route) {
                if (startswith(url, "/process.Process/") || startswith(url, "/filesystem.Filesystem/"))
                        return http_reply_connect_error(c, "unimplemented", "%s is not implemented", url);
                return http_reply_error(c, 404, "no route for %s %s", m, url);
        }
        if (!streq(m, "POST"))
                return http_reply_error(c, 405, "Connect RPCs are POST requests");
        if (route->streaming ? !content_type_is(c, "application/connect+json")
                             : !content_type_is(c, "application/json"))
                return http_reply_text(c, 415, "text/plain",
                                       route->streaming ? "unsupported content type: want application/connect+json\n"
                                                        : "unsupported content type: want application/json\n");
        rpc x = { .srv = srv, .req = req, .sb = sb, .streaming = route->streaming };
        const uint8_t *msg = (const uint8_t *) req->body;
        size_t len = req->body_len;
        if (route->streaming) {
                const char *why = NULL;
                if (connect_unwrap_request((const uint8_t *) req->body, req->body_len, &msg, &len, &why) < 0)
                        return rpc_error(&x, "invalid_argument", "%s", why);
        }
        json_error_t je;
        x.msg = len ? json_loadb((const char *) msg, len, JSON_REJECT_DUPLICATES, &je) : json_object();
        if (!x.msg)
                return rpc_error(&x, "invalid_argument", "invalid JSON: %s", je.text);
        if (!json_is_object(x.msg)) {
                json_decref(x.msg);
                return rpc_error(&x, "invalid_argument", "the request message must be a JSON object");
        }
        enum MHD_Result mr;
        const char *auth = http_header(c, "Authorization");
        if (!auth && templates_sbx_default(sb, "user")) /* a built template's last USER */
                snprintf(x.user, sizeof x.user, "%s", templates_sbx_default(sb, "user"));
        if ((auth && user_from_auth(auth, x.user, sizeof x.user) < 0) || (!auth && !x.user[0] &&
            user_from_auth(NULL, x.user, sizeof x.user) < 0) || user_resolve(x.user, &x.fsu, &x.home) < 0) {
                mr = rpc_error(&x, "unauthenticated", "invalid username: '%s'", x.user);
        } else
                mr = route->fn(&x);
        json_decref(x.msg);
        return mr;
}
