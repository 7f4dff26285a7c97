/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Volumes, the E2B way (docs/volumes.md, docs/protocol.md):
 *
 *   control plane  POST/GET /volumes, GET/DELETE /volumes/{id}   X-API-KEY
 *   content plane  /volumecontent/{id}/path|dir|file?path=…      Bearer <volume token>
 *   mounts         volumeMounts [{name, path}] of a sandbox create
 *
 * A volume's token is HMAC(master, team, id): it is shown again by GET (the
 * SDK's connect) without being stored; its SHA-256 is recorded in the row.
 * Content operations run in a confined helper (lib/sandbox/volfs.c): the
 * daemon never resolves a path of a volume, it streams through the
 * descriptors the helper opened.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/route.h"
#include "daemon/server.h"
#include "daemon/usage.h"
#include "daemon/volpath.h"
#include "util/error.h"
#include "util/log.h"

#define VOLUME_TOKEN_LEN (4 + 64)

typedef struct vol_request {
        hutch_volfs *fs;
        char id[37];
        int kind; /* VOLC_* */
        char path[VOLPATH_MAX];
        int64_t uid, gid, mode; /* -1: not given */
        bool force;
        uint64_t depth;
        /* PUT file: the temporary file the body goes into */
        int wfd;
        int write_err; /* -errno of the first failed write */
        uint64_t written;
} vol_request;

static void hexs(const uint8_t *b, size_t n, char *out) {
        static const char h[] = "0123456789abcdef";
        for (size_t i = 0; i < n; i++) {
                out[2 * i] = h[b[i] >> 4];
                out[2 * i + 1] = h[b[i] & 15];
        }
        out[2 * n] = 0;
}

static void volume_token(server *srv, int64_t team, const char *id, char out[VOLUME_TOKEN_LEN + 1]) {
        char msg[128];
        int n = snprintf(msg, sizeof msg, "volume-token:%lld:%s", (long long) team, id);
        uint8_t mac[32];
        unsigned maclen = sizeof mac;
        HMAC(EVP_sha256(), srv->master, sizeof srv->master, (const uint8_t *) msg, (size_t) n, mac,
             &maclen);
        memcpy(out, "vol_", 4);
        hexs(mac, 32, out + 4);
}

static void new_uuid(char out[37]) {
        uint8_t b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t) sizeof b)
                abort(); /* getrandom on a running kernel does not fail */
        b[6] = (uint8_t) ((b[6] & 0x0f) | 0x40);
        b[8] = (uint8_t) ((b[8] & 0x3f) | 0x80);
        snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                 b[13], b[14], b[15]);
}

/* The content plane keeps a volume's file system mounted (a detached
 * mount, in no namespace) for VOLUME_HOLD_MS after its last request, so
 * that a burst of requests mounts it once, not once each (an ext4 mount
 * and unmount with its journal is most of a request's cost). Dropped when
 * the volume is deleted; expired ones are closed at the next request. */
#define VOLUME_HOLD_MS 30000
#define VOLUME_HOLDS 32
static struct vol_hold {
        char id[37];
        int fd;
        int64_t last_ms;
} holds[VOLUME_HOLDS];

static void holds_expire(int64_t now, const char *drop_id) {
        for (size_t i = 0; i < VOLUME_HOLDS; i++)
                if (holds[i].id[0] &&
                    (now - holds[i].last_ms > VOLUME_HOLD_MS ||
                     (drop_id && streq(holds[i].id, drop_id)))) {
                        close(holds[i].fd);
                        memset(&holds[i], 0, sizeof holds[i]);
                }
}

static void hold_touch(server *srv, const char *id) {
        int64_t now = wall_ms();
        holds_expire(now, NULL);
        size_t oldest = 0;
        for (size_t i = 0; i < VOLUME_HOLDS; i++) {
                if (streq(holds[i].id, id)) {
                        holds[i].last_ms = now;
                        return;
                }
                if (holds[i].last_ms < holds[oldest].last_ms)
                        oldest = i;
        }
        if (holds[oldest].id[0])
                close(holds[oldest].fd);
        memset(&holds[oldest], 0, sizeof holds[oldest]);
        hutch_error err = { 0 };
        int fd;
        if (hutch_volume_hold(srv->ctx, id, &fd, &err) < 0)
                return; /* only slower: the request mounts it itself */
        snprintf(holds[oldest].id, sizeof holds[oldest].id, "%s", id);
        holds[oldest].fd = fd;
        holds[oldest].last_ms = now;
}

/* Remove a volume whose row is marked deleting: image, then row. */
static int volume_finish_delete(server *srv, const char *id, hutch_error *err) {
        holds_expire(wall_ms(), id);
        int r = hutch_volume_remove(srv->ctx, id, err);
        if (r < 0 && r != -ENOENT)
                return r;
        return store_volume_delete(srv->store, id, err);
}

void volumes_setup(server *srv) {
        store_volume *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (store_volume_list_deleting(srv->store, &v, &n, &err) < 0) {
                log_warning("volumes: %s", err.msg);
                return;
        }
        for (size_t i = 0; i < n; i++) {
                hutch_error e = { 0 };
                if (volume_finish_delete(srv, v[i].id, &e) < 0)
                        log_warning("volume %s: finishing its delete: %s", v[i].id, e.msg);
        }
        free(v);
        /* Images no row knows (a create cut short between the image and
         * its row): removed once they are a minute old, so that a CLI's
         * create under way is left alone. */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/volumes", srv->cfg.data_dir);
        DIR *d = opendir(dir);
        if (!d)
                return;
        unsigned removed = 0;
        for (struct dirent *de; (de = readdir(d));) {
                char id[37];
                size_t len = strlen(de->d_name);
                bool img = len == 40 && streq(de->d_name + 36, ".img"),
                     tmp = len == 44 && streq(de->d_name + 36, ".img.new");
                if (!img && !tmp)
                        continue;
                memcpy(id, de->d_name, 36);
                id[36] = 0;
                struct stat st;
                store_volume row;
                hutch_error e = { 0 };
                if (!hutch_volume_id_valid(id) ||
                    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
                    !S_ISREG(st.st_mode) || wall_ms() - (int64_t) st.st_mtime * 1000 < 60000)
                        continue;
                if (img && store_volume_get(srv->store, -1, id, &row, &e) != -ENOENT)
                        continue;
                if (unlinkat(dirfd(d), de->d_name, 0) == 0)
                        removed++;
        }
        closedir(d);
        if (removed)
                log_info("volumes: removed %u image(s) no volume owns", removed);
}

/* ------------------------------------------------------------ control plane */

static json_t *volume_and_token(server *srv, const store_volume *v) {
        char tok[VOLUME_TOKEN_LEN + 1];
        volume_token(srv, v->team_id, v->id, tok);
        return json_pack("{s:s, s:s, s:s}", "volumeID", v->id, "name", v->name, "token", tok);
}

static enum MHD_Result volume_create(server *srv, request *req) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        const char *name = json_string_value(json_object_get(body, "name"));
        if (!name || !volume_name_valid(name)) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "Invalid volume name");
        }
        store_volume v = { .team_id = req->team, .size_bytes = (int64_t) srv->cfg.volume_size_bytes };
        snprintf(v.name, sizeof v.name, "%s", name);
        json_decref(body);
        hutch_error err = { 0 };
        store_volume old;
        if (store_volume_find(srv->store, req->team, v.name, &old, &err) == 0)
                return http_reply_error(req->conn, 400, "Volume with name '%s' already exists",
                                        v.name);
        store_volume *all = NULL;
        size_t n = 0;
        if (store_volume_list(srv->store, req->team, &all, &n, &err) < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        free(all);
        if (n >= srv->cfg.max_volumes_per_team)
                return http_reply_error(req->conn, 429, "team has reached its limit of %llu volumes",
                                        (unsigned long long) srv->cfg.max_volumes_per_team);
        new_uuid(v.id);
        v.created_ms = wall_ms();
        char tok[VOLUME_TOKEN_LEN + 1];
        volume_token(srv, v.team_id, v.id, tok);
        SHA256((const uint8_t *) tok, strlen(tok), v.token_hash);
        v.has_token_hash = true;
        int r = hutch_volume_create(srv->ctx, v.id, (uint64_t) v.size_bytes, &err);
        if (r < 0) {
                log_error("volume %s: %s", v.id, err.msg);
                return http_reply_error(req->conn, r == -ENOSPC ? 507 : 500,
                                        "creating the volume failed: %s", err.msg);
        }
        if ((r = store_volume_insert(srv->store, &v, &err)) < 0) {
                hutch_error e2 = { 0 };
                (void) hutch_volume_remove(srv->ctx, v.id, &e2);
                if (r == -EEXIST)
                        return http_reply_error(req->conn, 400,
                                                "Volume with name '%s' already exists", v.name);
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        }
        usage_storage_changed(srv);
        hutch_error e3 = { 0 };
        char detail[160];
        snprintf(detail, sizeof detail, "{\"volume\":\"%s\"}", v.id);
        (void) store_event_add(srv->store, req->team, "", "volume.create", detail, &e3);
        return http_reply_json(req->conn, 201, volume_and_token(srv, &v));
}

static enum MHD_Result volume_list(server *srv, request *req) {
        store_volume *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        if (store_volume_list(srv->store, req->team, &v, &n, &err) < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
                json_array_append_new(
                        arr, json_pack("{s:s, s:s}", "volumeID", v[i].id, "name", v[i].name));
        free(v);
        return http_reply_json(req->conn, 200, arr);
}

static enum MHD_Result volume_get_or_delete(server *srv, request *req, const char *raw_id, bool del) {
        char id[37];
        if (!volume_uuid_parse(raw_id, id))
                return http_reply_error(req->conn, 400, "Invalid volume ID");
        store_volume v;
        hutch_error err = { 0 };
        int r = store_volume_get(srv->store, req->team, id, &v, &err);
        if (r == -ENOENT)
                return http_reply_error(req->conn, 404, "Volume not found");
        if (r < 0)
                return http_reply_error(req->conn, 500, "database: %s", err.msg);
        if (!del)
                return http_reply_json(req->conn, 200, volume_and_token(srv, &v));
        /* E2B: the row goes at once, the data once nothing uses it. Marked
         * first, so that no mount or content request takes it meanwhile;
         * the image is unlinked (sandboxes that mount it keep its file
         * system until the last is gone), then the row is removed. */
        if ((r = store_volume_set_deleting(srv->store, req->team, id, &err)) < 0)
                return http_reply_error(req->conn, r == -ENOENT ? 404 : 500, "%s",
                                        r == -ENOENT ? "Volume not found" : err.msg);
        usage_storage_changed(srv);
        if ((r = volume_finish_delete(srv, id, &err)) < 0)
                log_error("volume %s: delete: %s (finished at the next start)", id, err.msg);
        hutch_error e3 = { 0 };
        char detail[160];
        snprintf(detail, sizeof detail, "{\"volume\":\"%s\"}", id);
        (void) store_event_add(srv->store, req->team, "", "volume.delete", detail, &e3);
        return http_reply_empty(req->conn, 204);
}

enum MHD_Result volumes_dispatch(server *srv, request *req, const route *rt) {
        switch (rt->kind) {
        case ROUTE_VOLUMES_CREATE:
                return volume_create(srv, req);
        case ROUTE_VOLUMES_LIST:
                return volume_list(srv, req);
        case ROUTE_VOLUME_GET:
                return volume_get_or_delete(srv, req, rt->secret, false);
        case ROUTE_VOLUME_DELETE:
                return volume_get_or_delete(srv, req, rt->secret, true);
        }
        return http_reply_error(req->conn, 404, "no route for %s %s", req->method, req->url);
}

/* ---------------------------------------------------------- content plane */

/* The content plane's error body: code is a string there. */
static enum MHD_Result content_error(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static enum MHD_Result content_error(struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        const char *code = status == 400 ? "bad_request"
                : status == 401          ? "unauthorized"
                : status == 403          ? "forbidden"
                : status == 404          ? "not_found"
                : status == 405          ? "method_not_allowed"
                : status == 409          ? "conflict"
                : status == 413          ? "payload_too_large"
                : status == 507          ? "insufficient_storage"
                                         : "internal";
        return http_reply_json(c, status, json_pack("{s:s, s:s}", "code", code, "message", msg));
}

static unsigned status_of(int r) {
        switch (r) {
        case -ENOENT:
                return 404;
        case -EINVAL:
        case -ENOTDIR:
        case -EISDIR:
        case -EEXIST:
        case -ELOOP:
        case -ENAMETOOLONG:
        case -EBUSY:
        case -EXDEV:
        case -E2BIG:
        case -ENOTEMPTY:
                return 400;
        case -EACCES:
        case -EPERM:
                return 403;
        case -ENOSPC:
        case -EDQUOT:
                return 507;
        }
        return 500;
}

static json_t *entry_json(const hutch_volfs_entry *e) {
        static const char *const types[] = { "unknown", "file", "directory", "symlink", "unknown" };
        const char *name = strrchr(e->path, '/');
        name = name && name[1] ? name + 1 : "/";
        char at[40], mt[40], ct[40];
        format_rfc3339(e->atime_ns / 1000000, at);
        format_rfc3339(e->mtime_ns / 1000000, mt);
        format_rfc3339(e->ctime_ns / 1000000, ct);
        json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:s, s:s}", "name", name,
                              "type", types[e->type >= 0 && e->type <= 4 ? e->type : 0], "path",
                              e->path, "size", (json_int_t) e->size, "mode", (json_int_t) e->mode,
                              "uid", (json_int_t) e->uid, "gid", (json_int_t) e->gid, "atime", at,
                              "mtime", mt, "ctime", ct);
        if (e->type == HUTCH_VOLFS_SYMLINK)
                json_object_set_new(o, "target", json_string(e->target));
        return o;
}

void volumes_request_free(vol_request *v) {
        if (!v)
                return;
        if (v->wfd >= 0) {
                close(v->wfd);
                hutch_volfs_write_abort(v->fs);
        }
        hutch_volfs_close(v->fs);
        free(v);
}

/* uid, gid, mode, depth, force of the query. */
static int content_query(struct MHD_Connection *c, vol_request *v, const char **why) {
        uint64_t x;
        int r;
        if ((r = volquery_u64(http_query(c, "uid"), 65535, &x)) < 0)
                return *why = "uid must be a number from 0 to 65535", r;
        v->uid = r ? (int64_t) x : -1;
        if ((r = volquery_u64(http_query(c, "gid"), 65535, &x)) < 0)
                return *why = "gid must be a number from 0 to 65535", r;
        v->gid = r ? (int64_t) x : -1;
        if ((r = volquery_u64(http_query(c, "mode"), 07777, &x)) < 0)
                return *why = "mode must be a number from 0 to 4095 (07777)", r;
        v->mode = r ? (int64_t) x : -1;
        if ((r = volquery_u64(http_query(c, "depth"), 100, &x)) < 0)
                return *why = "depth must be a number from 1 to 100", r;
        v->depth = r ? x : 1;
        if (v->depth == 0)
                return *why = "depth must be a number from 1 to 100", -EINVAL;
        if ((r = volquery_bool(http_query(c, "force"), &v->force)) < 0)
                return *why = "force must be true or false", r;
        return 0;
}

enum MHD_Result volumes_content_begin(server *srv, request *req, bool *ret_responded) {
        struct MHD_Connection *c = req->conn;
        char id[37];
        int kind;
        *ret_responded = true;
        if (volcontent_route(req->url, id, &kind) < 0)
                return content_error(c, 404, "no route for %s %s", req->method, req->url);
        const char *auth = http_header(c, "Authorization");
        if (!auth || strncasecmp(auth, "Bearer ", 7) != 0 || !auth[7])
                return content_error(c, 401,
                                     "a volume token is required (Authorization: Bearer <token>)");
        if (!id[0])
                return content_error(c, 400, "Invalid volume ID");
        const char *tok = auth + 7;
        store_volume v;
        hutch_error err = { 0 };
        int r = store_volume_get(srv->store, -1, id, &v, &err);
        if (r < 0 && r != -ENOENT)
                return content_error(c, 500, "database: %s", err.msg);
        char want[VOLUME_TOKEN_LEN + 1] = "";
        if (r == 0)
                volume_token(srv, v.team_id, v.id, want);
        /* one answer for a wrong token and an unknown (or deleted) volume */
        if (r < 0 || strlen(tok) != VOLUME_TOKEN_LEN || !const_time_eq(tok, want))
                return content_error(c, 403, "the token does not grant access to volume %s", id);
        http_conn_authenticated(req);

        const char *m = req->method;
        bool ok = (kind == VOLC_PATH && (streq(m, "GET") || streq(m, "PATCH") || streq(m, "DELETE"))) ||
                (kind == VOLC_DIR && (streq(m, "GET") || streq(m, "POST"))) ||
                (kind == VOLC_FILE && (streq(m, "GET") || streq(m, "PUT")));
        if (!ok)
                return content_error(c, 405, "method %s not allowed on %s", m, req->url);
        vol_request *vr = calloc(1, sizeof *vr);
        if (!vr)
                return MHD_NO;
        vr->wfd = -1;
        vr->kind = kind;
        memcpy(vr->id, id, sizeof vr->id);
        const char *why = NULL;
        if (volpath_clean(http_query(c, "path"), vr->path, &why) < 0 ||
            content_query(c, vr, &why) < 0) {
                free(vr);
                return content_error(c, 400, "%s", why);
        }
        hold_touch(srv, id);
        if ((r = hutch_volfs_open(srv->ctx, id, &vr->fs, &err)) < 0) {
                free(vr);
                log_error("volume %s: %s", id, err.msg);
                return content_error(c, 500, "opening the volume failed: %s", err.msg);
        }
        req->vol = vr;
        if (kind == VOLC_FILE && streq(m, "PUT")) {
                r = hutch_volfs_write_begin(vr->fs, vr->path, &vr->wfd, &err);
                if (r < 0)
                        return content_error(c, status_of(r), "%s: %s", vr->path, err.msg);
                req->body_mode = BODY_VOLUME;
        }
        *ret_responded = false;
        return MHD_YES;
}

/* A PUT's body, as it comes: into the temporary file, never in memory. */
enum MHD_Result volumes_content_body(server *srv, request *req, const char *data, size_t *size) {
        vol_request *v = req->vol;
        size_t n = *size;
        *size = 0;
        if (!v || v->wfd < 0 || v->write_err)
                return MHD_YES; /* answered at the end */
        while (n > 0) {
                ssize_t k = write(v->wfd, data, n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        v->write_err = k < 0 ? -errno : -EIO;
                        return MHD_YES;
                }
                data += k;
                n -= (size_t) k;
                v->written += (uint64_t) k;
        }
        return MHD_YES;
}

static enum MHD_Result content_file_get(request *req, vol_request *v) {
        int fd = -1;
        hutch_volfs_entry e;
        hutch_error err = { 0 };
        int r = hutch_volfs_open_read(v->fs, v->path, &fd, &e, &err);
        if (r < 0)
                return content_error(req->conn, status_of(r), "%s: %s", v->path, err.msg);
        /* MHD reads with pread from the descriptor and closes it */
        struct MHD_Response *resp = MHD_create_response_from_fd64(e.size, fd);
        if (!resp) {
                close(fd);
                return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
        enum MHD_Result mr = MHD_queue_response(req->conn, 200, resp);
        MHD_destroy_response(resp);
        return mr;
}

static enum MHD_Result content_file_put(request *req, vol_request *v) {
        hutch_volfs_entry e;
        hutch_error err = { 0 };
        if (v->write_err) {
                int r = v->write_err;
                close(v->wfd);
                v->wfd = -1;
                hutch_volfs_write_abort(v->fs);
                return content_error(req->conn, status_of(r), "writing %s: %s", v->path,
                                     r == -ENOSPC || r == -EDQUOT ? "the volume is full"
                                                                  : strerror(-r));
        }
        close(v->wfd);
        v->wfd = -1;
        int r = hutch_volfs_write_commit(v->fs, v->uid, v->gid, v->mode, &e, &err);
        if (r < 0)
                return content_error(req->conn, status_of(r), "%s: %s", v->path, err.msg);
        return http_reply_json(req->conn, 201, entry_json(&e));
}

static enum MHD_Result content_patch(request *req, vol_request *v) {
        json_error_t je;
        json_t *b = req->body_len ? json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je)
                                  : json_object();
        if (!json_is_object(b)) {
                json_decref(b);
                return content_error(req->conn, 400,
                                     "the body must be a JSON object {uid?, gid?, mode?}");
        }
        int64_t vals[3] = { -1, -1, -1 };
        static const char *const keys[] = { "uid", "gid", "mode" };
        static const int64_t max[] = { 65535, 65535, 07777 };
        for (int i = 0; i < 3; i++) {
                json_t *x = json_object_get(b, keys[i]);
                if (!x || json_is_null(x))
                        continue;
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) > max[i]) {
                        json_decref(b);
                        return content_error(req->conn, 400, "'%s' must be an integer from 0 to %lld",
                                             keys[i], (long long) max[i]);
                }
                vals[i] = json_integer_value(x);
        }
        json_decref(b);
        hutch_volfs_entry e;
        hutch_error err = { 0 };
        int r = hutch_volfs_chattr(v->fs, v->path, vals[0], vals[1], vals[2], &e, &err);
        if (r < 0)
                return content_error(req->conn, status_of(r), "%s: %s", v->path, err.msg);
        return http_reply_json(req->conn, 200, entry_json(&e));
}

static int list_add(const hutch_volfs_entry *e, void *userdata) {
        return json_array_append_new(userdata, entry_json(e)) < 0 ? -ENOMEM : 0;
}

enum MHD_Result volumes_content_dispatch(server *srv, request *req) {
        vol_request *v = req->vol;
        const char *m = req->method;
        hutch_volfs_entry e;
        hutch_error err = { 0 };
        int r;
        switch (v->kind) {
        case VOLC_PATH:
                if (streq(m, "PATCH"))
                        return content_patch(req, v);
                if (streq(m, "DELETE")) {
                        if ((r = hutch_volfs_remove(v->fs, v->path, &err)) < 0)
                                return content_error(req->conn, status_of(r), "%s: %s", v->path,
                                                     err.msg);
                        return http_reply_empty(req->conn, 204);
                }
                if ((r = hutch_volfs_stat(v->fs, v->path, &e, &err)) < 0)
                        return content_error(req->conn, status_of(r), "%s: %s", v->path, err.msg);
                return http_reply_json(req->conn, 200, entry_json(&e));
        case VOLC_DIR:
                if (streq(m, "POST")) {
                        r = hutch_volfs_mkdir(v->fs, v->path, v->uid, v->gid, v->mode, v->force, &e,
                                              &err);
                        if (r < 0)
                                return content_error(req->conn, status_of(r), "%s: %s", v->path,
                                                     err.msg);
                        return http_reply_json(req->conn, 201, entry_json(&e));
                } else {
                        /* a file is not a directory to list: 400 */
                        json_t *arr = json_array();
                        if ((r = hutch_volfs_list(v->fs, v->path, (unsigned) v->depth, list_add,
                                                  arr, &err)) < 0) {
                                json_decref(arr);
                                return content_error(req->conn, status_of(r), "%s: %s", v->path,
                                                     err.msg);
                        }
                        return http_reply_json(req->conn, 200, arr);
                }
        case VOLC_FILE:
                if (streq(m, "PUT"))
                        return content_file_put(req, v);
                return content_file_get(req, v);
        }
        return content_error(req->conn, 404, "no route");
}

/* --------------------------------------------------------------- mounts */

int volumes_mounts_parse(server *srv, int64_t team, json_t *body, json_t **ret, char *why, size_t wl) {
        json_t *vm = json_object_get(body, "volumeMounts");
        *ret = NULL;
        if (!vm || json_is_null(vm))
                return 0;
        if (!json_is_array(vm)) {
                snprintf(why, wl, "'volumeMounts' must be an array of {name, path}");
                return -EINVAL;
        }
        if (json_array_size(vm) == 0)
                return 0;
        json_t *out = json_array();
        char msg[4096] = "invalid mounts:";
        size_t len = strlen(msg);
        bool bad = false;
        size_t i;
        json_t *m;
        json_array_foreach(vm, i, m) {
                const char *name = json_string_value(json_object_get(m, "name"));
                const char *path = json_string_value(json_object_get(m, "path"));
                char reason[512] = "";
                store_volume v;
                hutch_error err = { 0 };
                if (!json_is_object(m))
                        snprintf(reason, sizeof reason, "must be an object {name, path}");
                else if (!path || !*path)
                        snprintf(reason, sizeof reason, "path cannot be empty");
                else if (path[0] != '/')
                        snprintf(reason, sizeof reason, "path must be absolute");
                else if (!name || store_volume_find(srv->store, team, name, &v, &err) < 0)
                        snprintf(reason, sizeof reason, "volume '%.200s' not found",
                                 name ? name : "");
                else {
                        const char *pw = hutch_volume_path_check(path);
                        if (pw)
                                snprintf(reason, sizeof reason, "%s", pw);
                        size_t j;
                        json_t *prev;
                        json_array_foreach(out, j, prev) {
                                if (!reason[0] &&
                                    streq(json_string_value(json_object_get(prev, "path")), path))
                                        snprintf(reason, sizeof reason,
                                                 "path '%.200s' is already used", path);
                        }
                }
                if (i >= HUTCH_VOLUMES_MAX && !reason[0])
                        snprintf(reason, sizeof reason, "at most %d volumes can be mounted",
                                 HUTCH_VOLUMES_MAX);
                if (reason[0]) {
                        bad = true;
                        len += (size_t) snprintf(msg + len, len < sizeof msg ? sizeof msg - len : 0,
                                                 "\n\t- volume mount #%zu: %s", i, reason);
                        if (len >= sizeof msg)
                                len = sizeof msg - 1;
                        continue;
                }
                json_array_append_new(
                        out, json_pack("{s:s, s:s, s:s}", "name", name, "path", path, "id", v.id));
        }
        if (bad) {
                json_decref(out);
                snprintf(why, wl, "%s", msg);
                return -EINVAL;
        }
        *ret = out;
        return 0;
}

size_t volumes_mounts_config(json_t *mounts, hutch_volume_mount *out, size_t max) {
        size_t n = 0, i;
        json_t *m;
        if (!json_is_array(mounts))
                return 0;
        json_array_foreach(mounts, i, m) {
                const char *id = json_string_value(json_object_get(m, "id"));
                const char *path = json_string_value(json_object_get(m, "path"));
                if (!id || !path || n >= max)
                        continue;
                out[n].volume = id;
                out[n].path = path;
                n++;
        }
        return n;
}
