/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FS_WATCH_ADD / FS_WATCH_REMOVE: inotify on a directory, optionally on
 * its whole subtree, reported as EV_WATCH to the connection that asked.
 *
 * One inotify instance per watch: the kernel hands out the same wd for the
 * same inode within one instance, so two clients watching one directory
 * through a shared instance would fight over it. Watches die with their
 * connection.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "init.h"

#define WATCH_MASK                                                                                 \
        (IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_MODIFY | IN_DELETE | IN_ATTRIB |             \
         IN_DELETE_SELF | IN_MOVE_SELF | IN_EXCL_UNLINK | IN_ONLYDIR)

/* Entries of a directory are walked in batches of this many, each sorted
 * by name. */
#define WALK_BATCH 1024

typedef struct watch_dir {
        int wd;
        char *path;
} watch_dir;

typedef struct watch {
        source src; /* the inotify fd */
        struct watch *next;
        uint32_t id;
        conn *owner;
        bool recursive;
        uid_t uid;
        gid_t gid;
        watch_dir *dirs; /* sorted by wd */
        size_t n_dirs, n_alloc;
        int root_wd;          /* of the watched directory itself */
        uint32_t temp_cookie; /* of the last temp file moved away (into place) */
        uint32_t dir_cookie;  /* of the last directory moved away */
} watch;

static watch *watches;
static unsigned n_watches;
static uint32_t next_watch_id = 1;

static void watch_release(source *s) {
        watch *w = (watch *) s;
        for (size_t i = 0; i < w->n_dirs; i++)
                free(w->dirs[i].path);
        free(w->dirs);
        free(w);
}

/* Closing the inotify fd drops every wd of it at once. */
static void watch_drop(watch *w) {
        for (watch **p = &watches; *p; p = &(*p)->next)
                if (*p == w) {
                        *p = w->next;
                        n_watches--;
                        break;
                }
        source_kill(&w->src);
}

void watch_conn_gone(conn *c) {
        for (watch *w = watches, *next; w; w = next) {
                next = w->next;
                if (w->owner == c)
                        watch_drop(w);
        }
}

/* Index of wd, or of where it would go (with *found false). */
static size_t dir_index(const watch *w, int wd, bool *found) {
        size_t lo = 0, hi = w->n_dirs;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (w->dirs[mid].wd < wd)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        *found = lo < w->n_dirs && w->dirs[lo].wd == wd;
        return lo;
}

static void dir_forget(watch *w, int wd) {
        bool found;
        size_t i = dir_index(w, wd, &found);
        if (!found)
                return;
        free(w->dirs[i].path);
        memmove(w->dirs + i, w->dirs + i + 1, (w->n_dirs - i - 1) * sizeof(watch_dir));
        w->n_dirs--;
}

static int dir_add(watch *w, const char *path, uint32_t extra) {
        if (w->n_dirs >= INIT_MAX_WATCH_DIRS)
                return -ENOSPC;
        int wd = inotify_add_watch(w->src.fd, path, WATCH_MASK | extra);
        if (wd < 0)
                return negative_errno();

        bool found;
        size_t i = dir_index(w, wd, &found);
        if (found)
                return 0; /* the same directory again (a bind mount): keep the first name */
        if (w->n_dirs == w->n_alloc) {
                size_t n = w->n_alloc ? w->n_alloc * 2 : 8;
                watch_dir *d = realloc(w->dirs, n * sizeof *d);
                if (!d)
                        goto enomem;
                w->dirs = d;
                w->n_alloc = n;
        }
        char *copy = strdup(path);
        if (!copy)
                goto enomem;
        memmove(w->dirs + i + 1, w->dirs + i, (w->n_dirs - i) * sizeof(watch_dir));
        w->dirs[i] = (watch_dir) { .wd = wd, .path = copy };
        w->n_dirs++;
        return 0;
enomem:
        (void) inotify_rm_watch(w->src.fd, wd);
        return -ENOMEM;
}

static void watch_send(watch *w, const char *path, int kind) {
        initproto_writer *m = msg_begin(INITPROTO_EV_WATCH, 0, 0);
        initproto_put_u64(m, T_WATCH_ID, w->id);
        initproto_put_str(m, T_PATH, path);
        initproto_put_u64(m, T_EVENT, (uint64_t) kind);
        msg_send(w->owner, NULL, 0);
}

typedef struct walk_entry {
        char *name;
        unsigned char type; /* DT_* */
} walk_entry;

static int walk_entry_cmp(const void *a, const void *b) {
        return strcmp(((const walk_entry *) a)->name, ((const walk_entry *) b)->name);
}

static int add_subtree(watch *w, const char *path, unsigned depth, bool announce);

static int add_entry(watch *w, const char *path, const walk_entry *e, unsigned depth, bool announce) {
        char sub[INIT_PATH_BUF];
        int n = snprintf(sub, sizeof sub, "%s/%s", streq(path, "/") ? "" : path, e->name);
        if (n < 0 || (size_t) n >= sizeof sub)
                return 0;
        if (announce) {
                watch_send(w, sub, INITPROTO_WEV_CREATE);
                if (w->src.dead)
                        return -EPIPE; /* the client is gone */
        }
        if (e->type != DT_DIR && e->type != DT_UNKNOWN)
                return 0;
        int r = dir_add(w, sub, IN_DONT_FOLLOW);
        if (r == -ENOTDIR || r == -ENOENT || r == -EACCES)
                return 0; /* not a directory after all, or not ours to see */
        if (r < 0)
                return r;
        return add_subtree(w, sub, depth + 1, announce);
}

/* Watch every directory below path (path itself is watched already).
 * Subdirectories are found with O_NOFOLLOW opens and added with
 * IN_DONT_FOLLOW: a symlink never extends the watch elsewhere.
 *
 * With announce, every entry is reported as CREATE, by name, each
 * directory before what it holds: a directory new to a recursive watch
 * (mkdir -p, a move from elsewhere) may hold entries made before its own
 * watch existed, and envd's watcher walks it the same way (Go's WalkDir,
 * in name order), sending CREATE for each. Temporary files of writes in
 * progress are no entries (their commit reports the file). */
static int add_subtree(watch *w, const char *path, unsigned depth, bool announce) {
        if (depth >= INIT_MAX_DEPTH)
                return 0;
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0)
                return 0; /* gone or unreadable: nothing below to watch */
        DIR *d = fdopendir(fd);
        walk_entry *batch = d ? malloc(WALK_BATCH * sizeof *batch) : NULL;
        if (!batch) {
                if (d)
                        closedir(d);
                else
                        close(fd);
                return -ENOMEM;
        }
        int r = 0;
        for (size_t n = WALK_BATCH; n == WALK_BATCH && r >= 0;) {
                struct dirent *de;
                n = 0;
                while (n < WALK_BATCH && (de = readdir(d))) {
                        if (streq(de->d_name, ".") || streq(de->d_name, "..") ||
                            write_temp_name(de->d_name))
                                continue;
                        if (!announce && de->d_type != DT_DIR && de->d_type != DT_UNKNOWN)
                                continue;
                        char *name = strdup(de->d_name);
                        if (!name) {
                                r = -ENOMEM;
                                break;
                        }
                        batch[n++] = (walk_entry) { .name = name, .type = de->d_type };
                }
                qsort(batch, n, sizeof *batch, walk_entry_cmp);
                for (size_t i = 0; i < n; i++) {
                        if (r >= 0)
                                r = add_entry(w, path, &batch[i], depth, announce);
                        free(batch[i].name);
                }
        }
        free(batch);
        closedir(d);
        return r;
}

/* A directory moved away: its watches (and their names) no longer say
 * where things are. Drop them; a move back in re-adds. */
static void forget_subtree(watch *w, const char *path) {
        size_t len = strlen(path);
        for (size_t i = 0; i < w->n_dirs;) {
                const char *p = w->dirs[i].path;
                if (strncmp(p, path, len) == 0 && (p[len] == '\0' || p[len] == '/')) {
                        (void) inotify_rm_watch(w->src.fd, w->dirs[i].wd);
                        dir_forget(w, w->dirs[i].wd);
                } else
                        i++;
        }
}

static int event_kind(uint32_t mask) {
        if (mask & (IN_CREATE | IN_MOVED_TO))
                return INITPROTO_WEV_CREATE;
        if (mask & IN_MOVED_FROM)
                return INITPROTO_WEV_RENAME;
        if (mask & IN_MODIFY)
                return INITPROTO_WEV_WRITE;
        if (mask & IN_DELETE)
                return INITPROTO_WEV_REMOVE;
        if (mask & IN_ATTRIB)
                return INITPROTO_WEV_CHMOD;
        return 0;
}

/* The watched directory moved: like envd, watch nothing more. */
static void forget_all(watch *w) {
        while (w->n_dirs > 0) {
                watch_dir *d = &w->dirs[--w->n_dirs];
                (void) inotify_rm_watch(w->src.fd, d->wd);
                free(d->path);
        }
}

/* An event of a watched directory itself (no name). envd reports those of
 * the watched directory as "." (a name relative to itself): CHMOD, REMOVE
 * when it is deleted, RENAME when it is moved, after which it watches
 * nothing. Of a subdirectory (recursive) only IN_ATTRIB counts: the kernel
 * sends it to the parent's watch, with a name, and then to the
 * subdirectory's own, and envd reports both; its deletion or move is
 * reported by its parent. */
static void watch_self_event(watch *w, size_t i, uint32_t mask) {
        bool root = w->dirs[i].wd == w->root_wd;

        if (mask & IN_ATTRIB)
                watch_send(w, w->dirs[i].path, INITPROTO_WEV_CHMOD);
        if (!root || w->src.dead)
                return;
        if (mask & IN_DELETE_SELF)
                watch_send(w, w->dirs[i].path, INITPROTO_WEV_REMOVE);
        else if (mask & IN_MOVE_SELF) {
                watch_send(w, w->dirs[i].path, INITPROTO_WEV_RENAME);
                if (!w->src.dead)
                        forget_all(w);
        }
}

static void watch_event(watch *w, const struct inotify_event *ev, const char *name) {
        bool found;
        size_t i = dir_index(w, ev->wd, &found);

        if (!found)
                return;
        if (ev->mask & IN_IGNORED) {
                /* The directory is gone (or was unwatched). */
                dir_forget(w, ev->wd);
                return;
        }
        if (ev->len == 0 || name[0] == '\0') {
                watch_self_event(w, i, ev->mask);
                return;
        }
        /* The temporary file of a write, and its rename into place, are
         * not what happened for the client: write_finish() reports the
         * write itself (watch_note_write). A rename's two halves come
         * one after the other from the same directory's wd. */
        if (write_temp_name(name)) {
                if (ev->mask & IN_MOVED_FROM)
                        w->temp_cookie = ev->cookie;
                return;
        }
        if ((ev->mask & IN_MOVED_TO) && ev->cookie != 0 && ev->cookie == w->temp_cookie) {
                w->temp_cookie = 0;
                return;
        }

        char path[INIT_PATH_BUF];
        const char *dir = w->dirs[i].path;
        int n = snprintf(path, sizeof path, "%s/%s", streq(dir, "/") ? "" : dir, name);
        if (n < 0 || (size_t) n >= sizeof path)
                return;

        /* A directory new to a recursive watch is watched, and what it
         * holds already is announced, unless it only moved within the
         * watch (its halves are adjacent: same cookie). */
        bool rewatch = false, announce = false;
        if (w->recursive && (ev->mask & IN_ISDIR)) {
                if (ev->mask & IN_MOVED_FROM) {
                        w->dir_cookie = ev->cookie;
                        forget_subtree(w, path);
                } else if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
                        rewatch = true;
                        announce = (ev->mask & IN_CREATE) || ev->cookie != w->dir_cookie;
                        w->dir_cookie = 0;
                }
        }

        int kind = event_kind(ev->mask);
        if (kind)
                watch_send(w, path, kind);
        if (rewatch && !w->src.dead) {
                fsuser saved;
                if (fsuser_enter(w->uid, w->gid, &saved) >= 0) {
                        if (dir_add(w, path, IN_DONT_FOLLOW) >= 0)
                                (void) add_subtree(w, path, 0, announce);
                        fsuser_restore(&saved);
                }
        }
}

static void watch_dispatch(source *s, uint32_t events) {
        watch *w = (watch *) s;
        static char buf[64 * 1024]; /* room for many events at once */

        /* A few reads per wakeup; level-triggered epoll brings us back. */
        for (unsigned round = 0; round < 4; round++) {
                ssize_t n = read(s->fd, buf, sizeof buf);
                if (n <= 0)
                        return;
                for (size_t off = 0; off + sizeof(struct inotify_event) <= (size_t) n;) {
                        /* Copied out: no alignment assumption about buf. The
                         * kernel NUL-pads the name within len. */
                        struct inotify_event ev;
                        memcpy(&ev, buf + off, sizeof ev);
                        off += sizeof ev;
                        if (ev.len > (size_t) n - off)
                                break;
                        watch_event(w, &ev, ev.len ? buf + off : "");
                        off += ev.len;
                        /* Sending may have dropped the client, and w with it. */
                        if (w->src.dead)
                                return;
                }
        }
}

void watch_note_write(const char *path, bool created, bool wrote, bool meta_changed) {
        const char *slash = strrchr(path, '/');
        size_t dlen = slash && slash != path ? (size_t) (slash - path) : 1;
        int kinds[4];
        size_t n_kinds = 0;

        if (!slash)
                return;
        /* envd: open(O_CREAT|O_TRUNC) is a CREATE for a new file; the
         * chown that follows (before the open for an existing file), a
         * CHMOD; the truncation of an existing file and the data, WRITE
         * (one: the kernel merges an IN_MODIFY into the one still queued
         * before it, so how many a large upload gives envd's readers
         * varies); setting or clearing metadata xattrs, CHMOD. */
        if (created)
                kinds[n_kinds++] = INITPROTO_WEV_CREATE;
        kinds[n_kinds++] = INITPROTO_WEV_CHMOD;
        if (wrote)
                kinds[n_kinds++] = INITPROTO_WEV_WRITE;
        if (meta_changed)
                kinds[n_kinds++] = INITPROTO_WEV_CHMOD;

        for (watch *w = watches, *next; w; w = next) {
                next = w->next;
                if (w->src.dead)
                        continue;
                /* What the kernel queued before goes out first: a parent
                 * directory the write made, and the temporary file's own
                 * events, dropped here. Reading may drop the client, and
                 * its watches (w, maybe next too: both are only killed,
                 * freed after the batch). */
                watch_dispatch(&w->src, EPOLLIN);
                bool covered = false;
                for (size_t i = 0; i < w->n_dirs && !covered; i++)
                        covered = strlen(w->dirs[i].path) == dlen &&
                                memcmp(w->dirs[i].path, path, dlen) == 0;
                for (size_t k = 0; k < n_kinds && covered; k++) {
                        if (w->src.dead || !conn_alive(w->owner))
                                break;
                        watch_send(w, path, kinds[k]);
                }
        }
}

static void watch_add(conn *c, const req *r, const char *path, uid_t uid, gid_t gid) {
        struct stat st;
        int k;

        if (n_watches >= INIT_MAX_WATCHES) {
                reply_error(c, r->id, ENOSPC, "watch %s: %d watches", path, INIT_MAX_WATCHES);
                return;
        }
        if (stat(path, &st) < 0) {
                reply_error(c, r->id, errno, "watch %s", path);
                return;
        }
        if (!S_ISDIR(st.st_mode)) {
                reply_error(c, r->id, ENOTDIR, "watch %s", path);
                return;
        }

        watch *w = calloc(1, sizeof *w);
        if (!w) {
                reply_error(c, r->id, ENOMEM, "watch %s", path);
                return;
        }
        w->src = (source) { .fd = -1, .dispatch = watch_dispatch, .release = watch_release };
        w->owner = c;
        w->uid = uid;
        w->gid = gid;
        w->recursive = req_u64(r, T_RECURSIVE, 0) != 0;

        w->src.fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (w->src.fd < 0) {
                k = negative_errno();
                goto fail;
        }
        k = dir_add(w, path, 0);
        if (k >= 0)
                w->root_wd = w->dirs[0].wd;
        if (k >= 0 && w->recursive)
                k = add_subtree(w, path, 0, false);
        if (k >= 0)
                k = source_add(&w->src, EPOLLIN);
        if (k < 0)
                goto fail;

        w->id = next_watch_id++;
        if (next_watch_id == 0)
                next_watch_id = 1;
        w->next = watches;
        watches = w;
        n_watches++;

        initproto_writer *m = msg_begin(INITPROTO_OK, 0, r->id);
        initproto_put_u64(m, T_WATCH_ID, w->id);
        msg_send(c, NULL, 0);
        return;
fail:
        reply_error(c, r->id, k, k == -ENOSPC ? "watch %s: too many directories" : "watch %s", path);
        source_remove(&w->src);
        watch_release(&w->src);
}

static void watch_remove(conn *c, const req *r) {
        uint64_t id = req_u64(r, T_WATCH_ID, 0);

        for (watch *w = watches; w; w = w->next)
                if (w->id == id && w->owner == c) {
                        watch_drop(w);
                        reply_ok(c, r->id);
                        return;
                }
        reply_error(c, r->id, ENOENT, "unwatch %llu", (unsigned long long) id);
}

void watch_handle(conn *c, const req *r) {
        char path[INIT_PATH_BUF];
        const char *p;
        fsuser saved;
        uid_t uid;
        gid_t gid;
        int k;

        if (r->type == INITPROTO_FS_WATCH_REMOVE) {
                watch_remove(c, r);
                return;
        }

        p = req_str(r, T_PATH);
        k = p ? path_normalize(p, path) : -EINVAL;
        if (k < 0) {
                reply_error(c, r->id, k, "watch %s", p ? p : "(no path)");
                return;
        }
        k = req_user(r, &uid, &gid);
        if (k >= 0)
                k = fsuser_enter(uid, gid, &saved);
        if (k < 0) {
                reply_error(c, r->id, k, "watch %s: uid/gid", path);
                return;
        }
        /* inotify_add_watch() checks read permission with the fs ids. */
        watch_add(c, r, path, uid, gid);
        fsuser_restore(&saved);
}
