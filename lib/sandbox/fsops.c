/* SPDX-License-Identifier: Apache-2.0 */
/*
 * File operations. Every path is resolved by hutch-init inside the
 * sandbox's root (docs/design.md §3.3): the host never opens a path of the
 * sandbox, so a planted symlink can never point the host at its own files.
 * Data moves as descriptors that init passes out (a file opened for reading,
 * a pipe to write into), checked here to be a regular file or a pipe.
 */
#include <fcntl.h>
#include <poll.h>
#include <string.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"

#define FS_TIMEOUT_MS 60000
#define FS_LIST_MAX 100000

void hutch_file_info_clear(hutch_file_info *fi) {
        if (!fi)
                return;
        free(fi->name);
        free(fi->path);
        free(fi->symlink_target);
        free(fi->owner);
        free(fi->group);
        for (size_t i = 0; i < fi->n_metadata; i++) {
                free(fi->metadata_keys[i]);
                free(fi->metadata_values[i]);
        }
        free(fi->metadata_keys);
        free(fi->metadata_values);
        memset(fi, 0, sizeof *fi);
}

void hutch_file_info_array_free(hutch_file_info *v, size_t n) {
        if (!v)
                return;
        for (size_t i = 0; i < n; i++)
                hutch_file_info_clear(&v[i]);
        free(v);
}

static int dup_str_field(const initproto_msg *m, uint16_t tag, char **ret) {
        char buf[INITPROTO_MAX_STRING + 1];
        int r = initproto_find_str(m, tag, buf, sizeof buf);
        if (r < 0)
                return r;
        if (r == 0) {
                *ret = NULL;
                return 0;
        }
        *ret = strdup(buf);
        return *ret ? 1 : -ENOMEM;
}

_Static_assert(HUTCH_METADATA_MAX == INITPROTO_META_MAX && HUTCH_METADATA_KEY_MAX == INITPROTO_META_KEY_MAX &&
                       HUTCH_METADATA_VALUE_MAX == INITPROTO_META_VALUE_MAX &&
                       HUTCH_METADATA_TOTAL_MAX == INITPROTO_META_TOTAL_MAX,
               "metadata bounds of the API and of the protocol differ");

/* The T_META_KEY, T_META_VALUE pairs of a file entry. init filters what the
 * sandbox set, so anything outside the bounds means a broken init. */
static int metadata_from_msg(const initproto_msg *m, hutch_file_info *fi) {
        char buf[INITPROTO_MAX_STRING + 1];
        initproto_iter it;
        initproto_field f;
        size_t total = 0;
        bool want_value = false;
        int r;

        initproto_iter_init(&it, m);
        while ((r = initproto_next(&it, &f)) > 0) {
                if (f.tag != T_META_KEY && f.tag != T_META_VALUE)
                        continue;
                if ((f.tag == T_META_VALUE) != want_value)
                        return -EBADMSG;
                if ((r = initproto_field_str(&f, buf, sizeof buf)) < 0)
                        return -EBADMSG;
                if (f.tag == T_META_KEY) {
                        if (fi->n_metadata >= HUTCH_METADATA_MAX || !initproto_meta_key_valid(buf))
                                return -EBADMSG;
                        if (!fi->metadata_keys) {
                                fi->metadata_keys = calloc(HUTCH_METADATA_MAX, sizeof(char *));
                                fi->metadata_values = calloc(HUTCH_METADATA_MAX, sizeof(char *));
                                if (!fi->metadata_keys || !fi->metadata_values)
                                        return -ENOMEM;
                        }
                        fi->metadata_keys[fi->n_metadata] = strdup(buf);
                        /* counted now, so that clear() frees a key without its value */
                        fi->n_metadata++;
                        if (!fi->metadata_keys[fi->n_metadata - 1])
                                return -ENOMEM;
                } else {
                        if (f.len > HUTCH_METADATA_VALUE_MAX)
                                return -EBADMSG;
                        fi->metadata_values[fi->n_metadata - 1] = strdup(buf);
                        if (!fi->metadata_values[fi->n_metadata - 1])
                                return -ENOMEM;
                }
                total += f.len;
                if (total > HUTCH_METADATA_TOTAL_MAX)
                        return -EBADMSG;
                want_value = !want_value;
        }
        return r < 0 || want_value ? -EBADMSG : 0;
}

static int file_info_from_msg(const initproto_msg *m, hutch_file_info *fi) {
        uint64_t v;
        int r;
        memset(fi, 0, sizeof *fi);
        if ((r = dup_str_field(m, T_NAME, &fi->name)) < 0 || (r = dup_str_field(m, T_PATH, &fi->path)) < 0 ||
            (r = dup_str_field(m, T_SYMLINK, &fi->symlink_target)) < 0 ||
            (r = dup_str_field(m, T_OWNER, &fi->owner)) < 0 || (r = dup_str_field(m, T_GROUPNAME, &fi->group)) < 0)
                goto fail;
        if (!fi->path || fi->path[0] != '/') {
                r = -EBADMSG;
                goto fail;
        }
        if (!fi->name) {
                const char *slash = strrchr(fi->path, '/');
                fi->name = strdup(slash[1] ? slash + 1 : "/");
                if (!fi->name) {
                        r = -ENOMEM;
                        goto fail;
                }
        }
        if (initproto_find_u64(m, T_TYPE, &v) > 0 && v <= HUTCH_FILE_OTHER)
                fi->type = (int) v;
        fi->target_type = fi->type;
        if (initproto_find_u64(m, T_TARGET_TYPE, &v) > 0 && v <= HUTCH_FILE_OTHER)
                fi->target_type = (int) v;
        if (initproto_find_u64(m, T_SIZE, &v) > 0)
                fi->size = v;
        if (initproto_find_u64(m, T_MODE, &v) > 0)
                fi->mode = (uint32_t) v;
        if (initproto_find_u64(m, T_FUID, &v) > 0)
                fi->uid = (uint32_t) v;
        if (initproto_find_u64(m, T_FGID, &v) > 0)
                fi->gid = (uint32_t) v;
        if (initproto_find_u64(m, T_MTIME_NS, &v) > 0)
                fi->mtime_ns = (int64_t) v;
        if ((r = metadata_from_msg(m, fi)) < 0)
                goto fail;
        return 0;
fail:
        hutch_file_info_clear(fi);
        return r;
}

static void put_user(initproto_writer *w, const hutch_fs_user *u) {
        initproto_put_u64(w, T_UID, u ? u->uid : 1000);
        initproto_put_u64(w, T_GID, u ? u->gid : 1000);
}

static int check_path(const char *path, hutch_error *err) {
        if (!path || path[0] != '/')
                return hutch_error_set(err, -EINVAL, "path must be absolute: '%s'", path ? path : "");
        if (strlen(path) > INITPROTO_MAX_STRING)
                return hutch_error_set(err, -ENAMETOOLONG, "path too long");
        return 0;
}

static int on_file_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        return file_info_from_msg(m, userdata);
}

int hutch_fs_stat(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, hutch_file_info *ret, hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_STAT);
        initproto_put_str(w, T_PATH, path);
        put_user(w, u);
        hutch_file_info fi;
        memset(&fi, 0, sizeof fi);
        r = initconn_call(sb, NULL, 0, on_file_reply, &fi, FS_TIMEOUT_MS, err);
        if (r < 0)
                return r;
        *ret = fi;
        return 0;
}

/* A listing is bounded in entries and in bytes: 100000 entries of 4 KiB
 * paths and 4 KiB link targets would otherwise cost the host ~850 MB. */
#define FS_LIST_MAX_BYTES (64u << 20)

typedef struct list_state {
        hutch_file_info *v;
        size_t n, cap;
        size_t bytes;
} list_state;

static int on_list_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        list_state *ls = userdata;
        if (m->payload_len == 0)
                return 0; /* the final, empty OK */
        if (ls->n >= FS_LIST_MAX)
                return -E2BIG;
        if (ls->n == ls->cap) {
                size_t nc = ls->cap ? ls->cap * 2 : 64;
                hutch_file_info *nv = realloc(ls->v, nc * sizeof *nv);
                if (!nv)
                        return -ENOMEM;
                ls->v = nv;
                ls->cap = nc;
        }
        ls->bytes += m->payload_len + sizeof(hutch_file_info);
        if (ls->bytes > FS_LIST_MAX_BYTES)
                return -E2BIG;
        int r = file_info_from_msg(m, &ls->v[ls->n]);
        if (r < 0)
                return r;
        ls->n++;
        return 0;
}

int hutch_fs_list(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, unsigned depth, hutch_file_info **ret,
                  size_t *ret_n, hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_LIST);
        initproto_put_str(w, T_PATH, path);
        initproto_put_u64(w, T_DEPTH, depth ? depth : 1);
        put_user(w, u);
        list_state ls = { 0 };
        r = initconn_call(sb, NULL, 0, on_list_reply, &ls, FS_TIMEOUT_MS, err);
        if (r < 0) {
                hutch_file_info_array_free(ls.v, ls.n);
                return r;
        }
        *ret = ls.v;
        *ret_n = ls.n;
        return 0;
}

static int on_created_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        uint64_t v = 0;
        (void) initproto_find_u64(m, T_CREATED, &v);
        *(int *) userdata = v ? 1 : 0;
        return 0;
}

int hutch_fs_mkdir(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, bool parents, hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_MKDIR);
        initproto_put_str(w, T_PATH, path);
        initproto_put_u64(w, T_PARENTS, parents ? 1 : 0);
        put_user(w, u);
        int created = 0;
        r = initconn_call(sb, NULL, 0, on_created_reply, &created, FS_TIMEOUT_MS, err);
        return r < 0 ? r : created;
}

int hutch_fs_move(hutch_sandbox *sb, const hutch_fs_user *u, const char *from, const char *to, hutch_error *err) {
        int r = check_path(from, err);
        if (r < 0 || (r = check_path(to, err)) < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_MOVE);
        initproto_put_str(w, T_PATH, from);
        initproto_put_str(w, T_PATH2, to);
        put_user(w, u);
        return initconn_call(sb, NULL, 0, NULL, NULL, FS_TIMEOUT_MS, err);
}

int hutch_fs_remove(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_REMOVE);
        initproto_put_str(w, T_PATH, path);
        put_user(w, u);
        return initconn_call(sb, NULL, 0, NULL, NULL, FS_TIMEOUT_MS, err);
}

typedef struct open_state {
        int fd;
        hutch_file_info *info;
} open_state;

static int on_open_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        open_state *os = userdata;
        if (nfds != 1)
                return -EBADMSG;
        int r = initconn_check_fd(fds[0], INITCONN_FD_FILE);
        if (r < 0)
                return r;
        /* read-only use only: refuse a descriptor that is not open for reading */
        int fl = fcntl(fds[0], F_GETFL);
        if (fl < 0 || ((fl & O_ACCMODE) != O_RDONLY && (fl & O_ACCMODE) != O_RDWR))
                return -EBADMSG;
        if (os->info && (r = file_info_from_msg(m, os->info)) < 0)
                return r;
        os->fd = fds[0];
        fds[0] = -1;
        return 0;
}

int hutch_fs_open_read(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, int *ret_fd,
                       hutch_file_info *ret_info, hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_OPEN_READ);
        initproto_put_str(w, T_PATH, path);
        put_user(w, u);
        hutch_file_info info;
        open_state os = { .fd = -1, .info = ret_info ? &info : NULL };
        r = initconn_call(sb, NULL, 0, on_open_reply, &os, FS_TIMEOUT_MS, err);
        if (r < 0) {
                safe_close(os.fd);
                return r;
        }
        *ret_fd = os.fd;
        if (ret_info)
                *ret_info = info;
        return 0;
}

/* The pipe's write end belongs to the caller alone (it must close it
 * before commit): keeping a copy here would mean closing a number the
 * caller may have closed and reused already. */
struct hutch_fs_write {
        hutch_sandbox *sb;
        uint64_t write_id;
        bool meta_set;
        size_t n_meta;
        char **meta_keys, **meta_values;
};

typedef struct begin_state {
        uint64_t write_id;
        int fd;
} begin_state;

static int on_begin_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        begin_state *bs = userdata;
        if (nfds != 1 || initproto_find_u64(m, T_WRITE_ID, &bs->write_id) <= 0)
                return -EBADMSG;
        int r = initconn_check_fd(fds[0], INITCONN_FD_FIFO);
        if (r < 0)
                return r;
        int fl = fcntl(fds[0], F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) != O_WRONLY)
                return -EBADMSG;
        bs->fd = fds[0];
        fds[0] = -1;
        return 0;
}

int hutch_fs_write_begin(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, hutch_fs_write **ret,
                         int *ret_fd, hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        hutch_fs_write *fw = calloc(1, sizeof *fw);
        if (!fw)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_WRITE_BEGIN);
        initproto_put_str(w, T_PATH, path);
        put_user(w, u);
        begin_state bs = { .fd = -1 };
        r = initconn_call(sb, NULL, 0, on_begin_reply, &bs, FS_TIMEOUT_MS, err);
        if (r < 0) {
                safe_close(bs.fd);
                free(fw);
                return r;
        }
        fw->sb = hutch_sandbox_ref(sb);
        fw->write_id = bs.write_id;
        *ret = fw;
        *ret_fd = bs.fd;
        return 0;
}

static void fs_write_meta_free(hutch_fs_write *fw) {
        for (size_t i = 0; i < fw->n_meta; i++) {
                free(fw->meta_keys[i]);
                free(fw->meta_values[i]);
        }
        free(fw->meta_keys);
        free(fw->meta_values);
        fw->meta_keys = fw->meta_values = NULL;
        fw->n_meta = 0;
        fw->meta_set = false;
}

static void fs_write_free(hutch_fs_write *fw) {
        fs_write_meta_free(fw);
        hutch_sandbox_unref(fw->sb);
        free(fw);
}

int hutch_fs_write_set_metadata(hutch_fs_write *fw, const char *const *keys, const char *const *values, size_t n,
                                hutch_error *err) {
        size_t total = 0;

        if (!fw || (n > 0 && (!keys || !values)))
                return hutch_error_set(err, -EINVAL, "no write or no metadata given");
        if (n > HUTCH_METADATA_MAX)
                return hutch_error_set(err, -E2BIG, "%zu metadata keys, at most %d", n, HUTCH_METADATA_MAX);
        for (size_t i = 0; i < n; i++) {
                if (!initproto_meta_key_valid(keys[i]))
                        return hutch_error_set(err, -EINVAL,
                                               "metadata key '%.64s': 1 to %d bytes of printable ASCII without '/'",
                                               keys[i] ? keys[i] : "", HUTCH_METADATA_KEY_MAX);
                if (!values[i])
                        return hutch_error_set(err, -EINVAL, "metadata key '%s' has no value", keys[i]);
                size_t vlen = strlen(values[i]);
                if (vlen > HUTCH_METADATA_VALUE_MAX)
                        return hutch_error_set(err, -E2BIG, "metadata value of '%s': %zu bytes, at most %d",
                                               keys[i], vlen, HUTCH_METADATA_VALUE_MAX);
                for (size_t j = 0; j < i; j++)
                        if (strcmp(keys[i], keys[j]) == 0)
                                return hutch_error_set(err, -EINVAL, "metadata key '%s' given twice", keys[i]);
                total += strlen(keys[i]) + vlen;
        }
        if (total > HUTCH_METADATA_TOTAL_MAX)
                return hutch_error_set(err, -E2BIG, "metadata of %zu bytes, at most %d", total,
                                       HUTCH_METADATA_TOTAL_MAX);

        /* calloc: a half-filled copy frees as a whole */
        char **k = calloc(n ? n : 1, sizeof(char *)), **v = calloc(n ? n : 1, sizeof(char *));
        bool oom = !k || !v;
        for (size_t i = 0; !oom && i < n; i++) {
                k[i] = strdup(keys[i]);
                v[i] = strdup(values[i]);
                oom = !k[i] || !v[i];
        }
        if (oom) {
                for (size_t i = 0; k && v && i < n; i++) {
                        free(k[i]);
                        free(v[i]);
                }
                free(k);
                free(v);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        fs_write_meta_free(fw);
        fw->meta_keys = k;
        fw->meta_values = v;
        fw->n_meta = n;
        fw->meta_set = true;
        return 0;
}

int hutch_fs_write_commit(hutch_fs_write *fw, uint64_t expected_bytes, hutch_file_info *ret_info, hutch_error *err) {
        /* init answers once its read end reaches EOF: the caller has
         * closed the write end it got from begin. */
        initproto_writer *w = initconn_begin(fw->sb, INITPROTO_FS_WRITE_COMMIT);
        initproto_put_u64(w, T_WRITE_ID, fw->write_id);
        initproto_put_u64(w, T_SIZE, expected_bytes);
        if (fw->meta_set) {
                initproto_put_u64(w, T_META_SET, 1);
                for (size_t i = 0; i < fw->n_meta; i++) {
                        initproto_put_str(w, T_META_KEY, fw->meta_keys[i]);
                        initproto_put_str(w, T_META_VALUE, fw->meta_values[i]);
                }
        }
        hutch_file_info fi;
        memset(&fi, 0, sizeof fi);
        int r = initconn_call(fw->sb, NULL, 0, on_file_reply, &fi, FS_TIMEOUT_MS, err);
        fs_write_free(fw);
        if (r < 0)
                return r;
        if (ret_info)
                *ret_info = fi;
        else
                hutch_file_info_clear(&fi);
        return 0;
}

void hutch_fs_write_abort(hutch_fs_write *fw) {
        if (!fw)
                return;
        initproto_writer *w = initconn_begin(fw->sb, INITPROTO_FS_WRITE_ABORT);
        initproto_put_u64(w, T_WRITE_ID, fw->write_id);
        (void) initconn_call(fw->sb, NULL, 0, NULL, NULL, FS_TIMEOUT_MS, NULL);
        fs_write_free(fw);
}

int hutch_fs_write_buffer(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, const void *data, size_t len,
                          hutch_error *err) {
        hutch_fs_write *fw;
        int fd;
        int r = hutch_fs_write_begin(sb, u, path, &fw, &fd, err);
        if (r < 0)
                return r;
        /* init drains the pipe concurrently; a paused or wedged init must not
         * block us forever, so every wait has the call's deadline */
        const char *p = data;
        size_t left = len;
        r = 0;
        while (left > 0 && r >= 0) {
                ssize_t n = write(fd, p, left);
                if (n > 0) {
                        p += n;
                        left -= (size_t) n;
                } else if (n < 0 && errno == EAGAIN) {
                        struct pollfd pf = { .fd = fd, .events = POLLOUT };
                        int k = poll(&pf, 1, FS_TIMEOUT_MS);
                        if (k == 0)
                                r = -ETIMEDOUT;
                        else if (k < 0 && errno != EINTR)
                                r = -errno;
                } else if (n < 0 && errno != EINTR)
                        r = -errno;
        }
        close(fd);
        /* EPIPE: init stopped reading because writing the file failed
         * (ENOSPC, EDQUOT...); the commit reports what happened. */
        if (r < 0 && r != -EPIPE) {
                hutch_fs_write_abort(fw);
                return hutch_error_set(err, r, "writing %s: %s", path, strerror(-r));
        }
        return hutch_fs_write_commit(fw, len, NULL, err);
}

static int on_watch_reply(const initproto_msg *m, int *fds, size_t nfds, void *userdata) {
        uint64_t id = 0;
        if (initproto_find_u64(m, T_WATCH_ID, &id) <= 0 || id == 0 || id > UINT32_MAX)
                return -EBADMSG;
        *(uint32_t *) userdata = (uint32_t) id;
        return 0;
}

int hutch_fs_watch_add(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, bool recursive, uint32_t *ret_id,
                       hutch_error *err) {
        int r = check_path(path, err);
        if (r < 0)
                return r;
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_WATCH_ADD);
        initproto_put_str(w, T_PATH, path);
        initproto_put_u64(w, T_RECURSIVE, recursive ? 1 : 0);
        put_user(w, u);
        uint32_t id = 0;
        r = initconn_call(sb, NULL, 0, on_watch_reply, &id, FS_TIMEOUT_MS, err);
        if (r < 0)
                return r;
        *ret_id = id;
        return 0;
}

int hutch_fs_watch_remove(hutch_sandbox *sb, uint32_t id, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_FS_WATCH_REMOVE);
        initproto_put_u64(w, T_WATCH_ID, id);
        return initconn_call(sb, NULL, 0, NULL, NULL, FS_TIMEOUT_MS, err);
}
