/* SPDX-License-Identifier: Apache-2.0 */
/*
 * File operations, done here inside the sandbox's root and mount namespace
 * (never by the host through a host path, docs/design.md §3.3), each with the fs
 * credentials of the requesting user so that permissions are the user's.
 *
 * Data never goes through the control socket: reads hand out an fd, writes
 * hand out a pipe whose other end init drains into a temporary file that
 * is renamed into place only when the client commits the expected size.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hutch/hutch.h"
#include "init.h"

/* ------------------------------------------------------- fs credentials */

/* gVisor keeps no separate fs ids (setfsuid does not change them): there
 * the effective ids switch instead, with the real and saved ids left at 0
 * to come back. init is single-threaded, and while its effective uid is
 * not 0 nobody else gains a way to signal it (kill checks real/saved). */
bool fsuser_use_euid;

static int euser_enter(uid_t uid, gid_t gid, fsuser *ret_saved) {
        fsuser saved = { .uid = geteuid(), .gid = getegid() };
        if (saved.uid != 0 && syscall(SYS_setresuid, -1, 0, -1) < 0)
                return negative_errno();
        if (syscall(SYS_setresgid, -1, gid, -1) < 0 || syscall(SYS_setresuid, -1, uid, -1) < 0) {
                fsuser_restore(&saved);
                return -EPERM;
        }
        *ret_saved = saved;
        return 0;
}

int fsuser_enter(uid_t uid, gid_t gid, fsuser *ret_saved) {
        if (fsuser_use_euid)
                return euser_enter(uid, gid, ret_saved);
        /* setfsuid() cannot fail visibly: it returns the previous value
         * either way. Asking with an invalid id (-1) reads the current. */
        fsuser saved = {
                .uid = (uid_t) setfsuid((uid_t) -1),
                .gid = (gid_t) setfsgid((gid_t) -1),
        };
        setfsgid(gid);
        setfsuid(uid);
        if ((uid_t) setfsuid((uid_t) -1) != uid || (gid_t) setfsgid((gid_t) -1) != gid) {
                fsuser_restore(&saved);
                return -EPERM;
        }
        *ret_saved = saved;
        return 0;
}

void fsuser_restore(const fsuser *saved) {
        if (fsuser_use_euid) {
                /* back to euid 0 first: it may set any gid, then any uid */
                (void) syscall(SYS_setresuid, -1, 0, -1);
                (void) syscall(SYS_setresgid, -1, saved->gid, -1);
                (void) syscall(SYS_setresuid, -1, saved->uid, -1);
                return;
        }
        /* uid first: back at fsuid 0 the kernel gives the fs capabilities
         * back, whatever the order, but gid may need them. */
        setfsuid(saved->uid);
        setfsgid(saved->gid);
}

int req_user(const req *r, uid_t *ret_uid, gid_t *ret_gid) {
        uint64_t u = req_u64(r, T_UID, INIT_DEFAULT_UID);
        uint64_t g = req_u64(r, T_GID, INIT_DEFAULT_GID);

        if (u >= UINT32_MAX || g >= UINT32_MAX)
                return -EINVAL;
        *ret_uid = (uid_t) u;
        *ret_gid = (gid_t) g;
        return 0;
}

/* ----------------------------------------------------------------- paths */

int path_normalize(const char *in, char out[static INIT_PATH_BUF]) {
        size_t n = 0;

        if (in[0] != '/')
                return -EINVAL;
        for (const char *p = in; *p;) {
                while (*p == '/')
                        p++;
                if (!*p)
                        break;
                const char *e = strchrnul(p, '/');
                size_t len = (size_t) (e - p);
                if (len == 1 && p[0] == '.') {
                        /* nothing */
                } else if (len == 2 && p[0] == '.' && p[1] == '.') {
                        /* Lexically: we are inside the sandbox root, and
                         * ".." of "/" is "/". */
                        while (n > 0 && out[n - 1] != '/')
                                n--;
                        if (n > 0)
                                n--;
                } else {
                        if (n + 1 + len >= INIT_PATH_BUF)
                                return -ENAMETOOLONG;
                        out[n++] = '/';
                        memcpy(out + n, p, len);
                        n += len;
                }
                p = e;
        }
        if (n == 0)
                out[n++] = '/';
        out[n] = '\0';
        return 0;
}

/* Split a normalized path into its directory and last component ("" for "/"). */
static const char *path_split(const char *path, char dir[static INIT_PATH_BUF]) {
        const char *slash = strrchr(path, '/');
        size_t dlen = slash == path ? 1 : (size_t) (slash - path);
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
        return slash + 1;
}

static int req_path(conn *c, const req *r, uint16_t tag, char out[static INIT_PATH_BUF]) {
        const char *p = req_str(r, tag);
        int k = p ? path_normalize(p, out) : -EINVAL;

        if (k < 0)
                reply_error(c, r->id, k, "%s %s", initproto_type_name(r->type), p ? p : "(no path)");
        return k;
}

/* --------------------------------------------------------- user database */

/* The sandbox's own /etc (read by us, inside its root), never the host's.
 * Lines are name:x:id:...; passwd's sixth field is the home. */
static int etc_lookup(const char *file, uint32_t id, char *ret_name, size_t name_sz, char *ret_home,
                      size_t home_sz) {
        char line[1024];
        /* The sandbox owns this file: it may be a FIFO (open would block
         * PID 1), a link to /dev/zero (endless), or huge. Regular files
         * only, opened without blocking, read up to a bound. */
        int fd = open(file, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        struct stat st;
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) {
                close(fd);
                return -EINVAL;
        }
        FILE *f = fdopen(fd, "re");
        if (!f) {
                close(fd);
                return negative_errno();
        }
        size_t total = 0;
        while (total < (1u << 20) && fgets(line, sizeof line, f)) {
                total += strlen(line);
                size_t len = strlen(line);
                if (len > 0 && line[len - 1] != '\n' && !feof(f)) {
                        /* Longer than any sane entry: skip the rest of it. */
                        int ch;
                        while ((ch = fgetc(f)) != EOF && ch != '\n')
                                ;
                        continue;
                }
                line[strcspn(line, "\n")] = '\0';

                char *field[7] = { 0 };
                size_t nf = 0;
                for (char *p = line; nf < ELEMENTSOF(field); nf++) {
                        field[nf] = p;
                        p = strchr(p, ':');
                        if (!p) {
                                nf++;
                                break;
                        }
                        *p++ = '\0';
                }
                if (nf < 3 || !*field[0] || !*field[2])
                        continue;
                char *end;
                errno = 0;
                unsigned long v = strtoul(field[2], &end, 10);
                if (errno || *end || field[2][0] == '-' || v != id)
                        continue;
                snprintf(ret_name, name_sz, "%s", field[0]);
                if (ret_home)
                        snprintf(ret_home, home_sz, "%s", nf > 5 ? field[5] : "/");
                fclose(f);
                return 1;
        }
        fclose(f);
        return 0;
}

int user_lookup(uid_t uid, char *ret_name, size_t name_sz, char *ret_home, size_t home_sz) {
        return etc_lookup("/etc/passwd", uid, ret_name, name_sz, ret_home, home_sz);
}

/* A listing names the same few owners over and over: remember the last
 * few answers for the duration of one request (or one job step), so an
 * edit of /etc/passwd shows up on the next. */
typedef struct name_cache_entry {
        bool valid;
        uint32_t id;
        char name[64];
} name_cache_entry;

static name_cache_entry user_cache[8], group_cache[8];
static unsigned user_cache_next, group_cache_next;

void names_cache_reset(void) {
        memset(user_cache, 0, sizeof user_cache);
        memset(group_cache, 0, sizeof group_cache);
}

static const char *cached_name(name_cache_entry *cache, unsigned *next, const char *file,
                               uint32_t id) {
        for (size_t i = 0; i < 8; i++)
                if (cache[i].valid && cache[i].id == id)
                        return cache[i].name;
        name_cache_entry *e = &cache[*next];
        *next = (*next + 1) % 8;
        e->valid = true;
        e->id = id;
        if (etc_lookup(file, id, e->name, sizeof e->name, NULL, 0) <= 0)
                snprintf(e->name, sizeof e->name, "%u", (unsigned) id);
        return e->name;
}

const char *user_name(uid_t uid) {
        return cached_name(user_cache, &user_cache_next, "/etc/passwd", uid);
}

const char *group_name(gid_t gid) {
        return cached_name(group_cache, &group_cache_next, "/etc/group", gid);
}

/* ------------------------------------------------------------ file info */

static int file_type(mode_t mode) {
        if (S_ISREG(mode))
                return HUTCH_FILE_REGULAR;
        if (S_ISDIR(mode))
                return HUTCH_FILE_DIRECTORY;
        if (S_ISLNK(mode))
                return HUTCH_FILE_SYMLINK;
        return HUTCH_FILE_OTHER;
}

int file_info_put(initproto_writer *w, int dirfd, const char *name, const char *path, int *ret_type) {
        char target[INIT_PATH_BUF];
        bool have_target = false;
        struct stat st, tst;

        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return negative_errno();
        int type = file_type(st.st_mode), target_type = type;
        if (type == HUTCH_FILE_SYMLINK) {
                ssize_t n = readlinkat(dirfd, name, target, sizeof target);
                /* A target that fills the buffer may be cut: leave it out. */
                if (n >= 0 && (size_t) n < sizeof target) {
                        target[n] = '\0';
                        have_target = true;
                }
                /* Dangling (or a loop): the target has no type. */
                target_type = fstatat(dirfd, name, &tst, 0) == 0 ? file_type(tst.st_mode)
                                                                 : HUTCH_FILE_UNKNOWN;
        }

        const char *base = strrchr(path, '/');
        base = base && base[1] ? base + 1 : path;
        initproto_put_str(w, T_NAME, base);
        initproto_put_str(w, T_PATH, path);
        initproto_put_u64(w, T_TYPE, (uint64_t) type);
        initproto_put_u64(w, T_TARGET_TYPE, (uint64_t) target_type);
        if (have_target)
                initproto_put_str(w, T_SYMLINK, target);
        initproto_put_u64(w, T_SIZE, (uint64_t) st.st_size);
        initproto_put_u64(w, T_MODE, st.st_mode);
        initproto_put_u64(w, T_FUID, st.st_uid);
        initproto_put_u64(w, T_FGID, st.st_gid);
        initproto_put_u64(w, T_MTIME_NS,
                          (uint64_t) ((int64_t) st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec));
        initproto_put_str(w, T_OWNER, user_name(st.st_uid));
        initproto_put_str(w, T_GROUPNAME, group_name(st.st_gid));
        /* The kernel allows user.* xattrs on nothing else. */
        if (type == HUTCH_FILE_REGULAR || type == HUTCH_FILE_DIRECTORY)
                file_meta_put(w, path);
        if (ret_type)
                *ret_type = type;
        return 0;
}

/* ------------------------------------------------------------- metadata */

/* <linux/limits.h>'s XATTR_LIST_MAX and XATTR_NAME_MAX (musl has neither) */
#define INIT_XATTR_LIST_MAX 65536
#define INIT_XATTR_NAME_MAX 255

static char xattr_names[INIT_XATTR_LIST_MAX];

static bool meta_name(const char *name, const char **ret_key) {
        size_t n = strlen(INITPROTO_META_PREFIX);

        if (strncmp(name, INITPROTO_META_PREFIX, n) != 0)
                return false;
        *ret_key = name + n;
        return true;
}

/* Whether path (a final symlink itself) holds user.e2b.* xattrs. */
static bool has_meta(const char *path) {
        ssize_t n = llistxattr(path, xattr_names, sizeof xattr_names);
        for (size_t off = 0; n > 0 && off < (size_t) n;) {
                const char *name = xattr_names + off, *key;
                off += strnlen(name, (size_t) n - off) + 1;
                if (off <= (size_t) n && meta_name(name, &key))
                        return true;
        }
        return false;
}

/* The l* calls act on a final symlink itself (which holds no user.*
 * xattrs), never on its target. The sandbox can set anything there: what
 * breaks the bounds, or holds a NUL the protocol cannot carry, is left out. */
void file_meta_put(initproto_writer *w, const char *path) {
        static char value[INITPROTO_META_VALUE_MAX];
        size_t count = 0, total = 0;

        ssize_t n = llistxattr(path, xattr_names, sizeof xattr_names);
        if (n <= 0)
                return;
        for (size_t off = 0; off < (size_t) n;) {
                const char *name = xattr_names + off;
                size_t len = strnlen(name, (size_t) n - off);
                off += len + 1;
                const char *key;
                if (off > (size_t) n || !meta_name(name, &key) || !initproto_meta_key_valid(key))
                        continue;
                /* ERANGE when the value is longer than the bound */
                ssize_t vn = lgetxattr(path, name, value, sizeof value);
                if (vn < 0 || memchr(value, 0, (size_t) vn))
                        continue;
                size_t klen = strlen(key);
                if (count >= INITPROTO_META_MAX)
                        break;
                if (total + klen + (size_t) vn > INITPROTO_META_TOTAL_MAX)
                        continue;
                initproto_put_str(w, T_META_KEY, key);
                initproto_put_bytes(w, T_META_VALUE, value, (size_t) vn);
                count++;
                total += klen + (size_t) vn;
        }
}

/* Check the pairs of a request: the host checked them too, but init trusts
 * no client. */
static int meta_validate(const req *r) {
        size_t total = 0;

        for (size_t i = 0; i < r->n_meta; i++) {
                if (!initproto_meta_key_valid(r->meta_keys[i]))
                        return -EINVAL;
                size_t vlen = strlen(r->meta_values[i]);
                if (vlen > INITPROTO_META_VALUE_MAX)
                        return -E2BIG;
                total += strlen(r->meta_keys[i]) + vlen;
                for (size_t j = 0; j < i; j++)
                        if (streq(r->meta_keys[i], r->meta_keys[j]))
                                return -EINVAL;
        }
        return total > INITPROTO_META_TOTAL_MAX ? -E2BIG : 0;
}

/* ------------------------------------------------------ directory helpers */

/* A directory made for the user is chowned to owner (lchown: never
 * through a symlink), also when the fs ids made it the user's already:
 * envd chowns every directory it creates, so its watchers see CREATE then
 * CHMOD, and the group is the user's even below a setgid directory. A
 * chown that fails is an error only where the owner is not right yet. */
static int mkdir_chown(const char *path, const mkdir_owner *owner) {
        struct stat st;

        if (lchown(path, owner->uid, owner->gid) == 0)
                return 0;
        int k = negative_errno();
        if (lstat(path, &st) == 0 && st.st_uid == owner->uid && st.st_gid == owner->gid)
                return 0;
        return k;
}

/* mkdir -p, each directory it creates handed to owner (mkdir_chown). */
int mkdir_parents(const char *path, const mkdir_owner *owner, bool *ret_created) {
        char buf[INIT_PATH_BUF];
        size_t len = strlen(path);
        bool created = false;

        if (len >= sizeof buf)
                return -ENAMETOOLONG;
        memcpy(buf, path, len + 1);
        for (char *p = buf + 1; *buf && p <= buf + len; p++) {
                if (*p != '/' && *p != '\0')
                        continue;
                char saved = *p;
                *p = '\0';
                if (p > buf + 1) { /* not the root itself */
                        if (mkdir(buf, 0755) == 0) {
                                created = true;
                                int k = mkdir_chown(buf, owner);
                                if (k < 0)
                                        return k;
                        } else if (errno == EEXIST) {
                                struct stat st;
                                /* Followed: a symlink to a directory is
                                 * one, as for mkdir -p. */
                                if (stat(buf, &st) < 0)
                                        return negative_errno();
                                if (!S_ISDIR(st.st_mode))
                                        return saved ? -ENOTDIR : -EEXIST;
                                created = false;
                        } else
                                return negative_errno();
                }
                *p = saved;
        }
        if (ret_created)
                *ret_created = created;
        return 0;
}

/* rm -rf without ever following a symlink: every level is opened with
 * O_NOFOLLOW relative to its parent's fd, so a symlink swapped in during
 * the walk is unlinked, not descended into. */
static int remove_tree(int parent_fd, const char *name, unsigned depth) {
        if (depth > INIT_MAX_REMOVE_DEPTH)
                return -ELOOP;

        int fd = openat(parent_fd, name,
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
                if (errno != ENOTDIR && errno != ELOOP)
                        return negative_errno();
                return unlinkat(parent_fd, name, 0) < 0 ? negative_errno() : 0;
        }
        DIR *d = fdopendir(fd);
        if (!d) {
                int k = negative_errno();
                close(fd);
                return k;
        }

        int ret = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                int k = 0;
                if (de->d_type == DT_DIR)
                        k = remove_tree(dirfd(d), de->d_name, depth + 1);
                else if (unlinkat(dirfd(d), de->d_name, 0) < 0)
                        /* DT_UNKNOWN on some filesystems; Linux says EISDIR. */
                        k = errno == EISDIR ? remove_tree(dirfd(d), de->d_name, depth + 1)
                                            : negative_errno();
                if (k < 0 && k != -ENOENT && ret == 0)
                        ret = k;
        }
        closedir(d);
        if (unlinkat(parent_fd, name, AT_REMOVEDIR) < 0 && ret == 0)
                ret = negative_errno();
        return ret;
}

/* ------------------------------------------------------------- requests */

static void fs_stat(conn *c, const req *r, const char *path) {
        initproto_writer *w = msg_begin(INITPROTO_OK, 0, r->id);
        int k = file_info_put(w, AT_FDCWD, path, path, NULL);
        if (k < 0) {
                reply_error(c, r->id, k, "stat %s", path);
                return;
        }
        msg_send(c, NULL, 0);
}

static void fs_mkdir(conn *c, const req *r, const char *path, const mkdir_owner *owner) {
        bool created = false;
        int k = 0;

        if (req_u64(r, T_PARENTS, 0))
                k = mkdir_parents(path, owner, &created);
        else if (mkdir(path, 0755) == 0) {
                created = true;
                k = mkdir_chown(path, owner);
        } else if (errno == EEXIST) {
                struct stat st;
                if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
                        k = -EEXIST;
        } else
                k = negative_errno();
        if (k < 0) {
                reply_error(c, r->id, k, "mkdir %s", path);
                return;
        }
        initproto_writer *w = msg_begin(INITPROTO_OK, 0, r->id);
        initproto_put_u64(w, T_CREATED, created);
        (void) file_info_put(w, AT_FDCWD, path, path, NULL);
        msg_send(c, NULL, 0);
}

static void fs_move(conn *c, const req *r, const char *from, const mkdir_owner *owner) {
        char to[INIT_PATH_BUF], dir[INIT_PATH_BUF];
        struct stat st;

        if (req_path(c, r, T_PATH2, to) < 0)
                return;
        if (rename(from, to) < 0) {
                int k = negative_errno();
                /* Like envd: a missing destination directory is created. */
                if (k == -ENOENT && lstat(from, &st) == 0) {
                        path_split(to, dir);
                        k = mkdir_parents(dir, owner, NULL);
                        if (k >= 0)
                                k = rename(from, to) < 0 ? negative_errno() : 0;
                }
                if (k < 0) {
                        reply_error(c, r->id, k, "move %s to %s", from, to);
                        return;
                }
        }
        initproto_writer *w = msg_begin(INITPROTO_OK, 0, r->id);
        int k = file_info_put(w, AT_FDCWD, to, to, NULL);
        if (k < 0) {
                /* Moved, but gone again already. */
                reply_error(c, r->id, k, "stat %s", to);
                return;
        }
        msg_send(c, NULL, 0);
}

static void fs_remove(conn *c, const req *r, const char *path) {
        if (streq(path, "/")) {
                reply_error(c, r->id, EBUSY, "remove /");
                return;
        }
        int k = remove_tree(AT_FDCWD, path, 0);
        if (k < 0) {
                reply_error(c, r->id, k, "remove %s", path);
                return;
        }
        reply_ok(c, r->id);
}

static void fs_open_read(conn *c, const req *r, const char *path) {
        /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for
         * a writer, and stop the whole loop. Symlinks are followed: they
         * resolve inside the sandbox root. */
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        struct stat st;

        if (fd < 0 || fstat(fd, &st) < 0) {
                reply_error(c, r->id, errno, "open %s", path);
                return;
        }
        if (!S_ISREG(st.st_mode)) {
                reply_error(c, r->id, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "open %s", path);
                return;
        }
        (void) fcntl(fd, F_SETFL, 0);

        initproto_writer *w = msg_begin(INITPROTO_OK, 0, r->id);
        int k = file_info_put(w, AT_FDCWD, path, path, NULL);
        if (k < 0) {
                reply_error(c, r->id, k, "stat %s", path);
                return;
        }
        msg_send(c, &fd, 1);
}

/* -------------------------------------------------------------- FS_LIST */

typedef struct list_job {
        job job;
        uint32_t id;
        uid_t uid;
        gid_t gid;
        unsigned max_depth, depth, n_entries;
        DIR *dirs[INIT_MAX_DEPTH];
        size_t prefix[INIT_MAX_DEPTH]; /* length of each open dir's path in path */
        char path[INIT_PATH_BUF];
        char root[INIT_PATH_BUF];
} list_job;

static void list_free(job *j) {
        list_job *l = (list_job *) j;
        while (l->depth > 0)
                closedir(l->dirs[--l->depth]);
        free(l);
}

static int list_step(conn *c, job *j) {
        list_job *l = (list_job *) j;
        unsigned budget = 64;
        fsuser saved;
        int ret = 1;

        if (fsuser_enter(l->uid, l->gid, &saved) < 0) {
                reply_error(c, l->id, EPERM, "list %s", l->root);
                return 0;
        }
        names_cache_reset();
        while (budget > 0) {
                if (l->depth == 0) {
                        reply_ok(c, l->id);
                        ret = 0;
                        break;
                }
                DIR *d = l->dirs[l->depth - 1];
                size_t base = l->prefix[l->depth - 1];
                struct dirent *de = readdir(d);
                if (!de) {
                        closedir(d);
                        l->depth--;
                        continue;
                }
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                size_t nlen = strlen(de->d_name);
                if (base + 1 + nlen >= sizeof l->path)
                        continue; /* a path the protocol cannot carry */
                l->path[base] = '/';
                memcpy(l->path + base + 1, de->d_name, nlen + 1);
                budget--;

                int type;
                initproto_writer *w = msg_begin(INITPROTO_OK, INITPROTO_F_MORE, l->id);
                if (file_info_put(w, dirfd(d), de->d_name, l->path, &type) < 0)
                        continue; /* removed since readdir */
                if (++l->n_entries > INIT_MAX_LIST_ENTRIES) {
                        reply_error(c, l->id, E2BIG, "list %s: more than %d entries", l->root,
                                    INIT_MAX_LIST_ENTRIES);
                        ret = 0;
                        break;
                }
                if (msg_send(c, NULL, 0) < 0) {
                        ret = 0;
                        break;
                }
                /* Descend into real directories only, never a symlink. */
                if (type == HUTCH_FILE_DIRECTORY && l->depth < l->max_depth) {
                        int fd = openat(dirfd(d), de->d_name,
                                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
                        DIR *sub = fd >= 0 ? fdopendir(fd) : NULL;
                        if (sub) {
                                l->dirs[l->depth] = sub;
                                l->prefix[l->depth] = base + 1 + nlen;
                                l->depth++;
                        } else
                                safe_close(fd); /* unreadable: listed, not entered */
                }
        }
        fsuser_restore(&saved);
        return ret;
}

static void fs_list(conn *c, const req *r, const char *path, uid_t uid, gid_t gid) {
        uint64_t depth = req_u64(r, T_DEPTH, 1);

        /* The top directory is opened now, so that its errors (ENOENT,
         * ENOTDIR, EACCES) are the reply; symlinks to it are followed. */
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
                reply_error(c, r->id, errno, "list %s", path);
                return;
        }
        DIR *d = fdopendir(fd);
        list_job *l = d ? calloc(1, sizeof *l) : NULL;
        if (!l) {
                reply_error(c, r->id, ENOMEM, "list %s", path);
                if (d)
                        closedir(d);
                else
                        close(fd);
                return;
        }
        l->job = (job) { .step = list_step, .free = list_free };
        l->id = r->id;
        l->uid = uid;
        l->gid = gid;
        l->max_depth = (unsigned) MIN(MAX(depth, 1u), (uint64_t) INIT_MAX_DEPTH);
        l->dirs[0] = d;
        l->depth = 1;
        snprintf(l->root, sizeof l->root, "%s", path);
        /* Children of "/" are "/name", not "//name". */
        l->prefix[0] = streq(path, "/") ? 0 : strlen(path);
        memcpy(l->path, path, l->prefix[0]);
        conn_start_job(c, &l->job);
}

/* --------------------------------------------------------------- writes */

typedef struct file_write {
        source src; /* the pipe's read end; fd -1 after EOF */
        struct file_write *next;
        uint32_t id;
        conn *owner;
        uid_t uid;
        gid_t gid;
        int dir_fd; /* O_PATH of the target's directory */
        int tmp_fd;
        char name[NAME_MAX + 1];
        char tmp_name[NAME_MAX + 1];
        char path[INIT_PATH_BUF];
        uint64_t written;
        int error; /* first failure writing the data, errno */
        bool eof;
        bool commit_pending;
        uint32_t commit_id;
        uint64_t commit_size;
        bool meta_set; /* replace the user.e2b.* xattrs with meta[] */
        size_t n_meta;
        char *meta[2 * INITPROTO_META_MAX]; /* key, value, key, value... */
} file_write;

static file_write *writes;
static unsigned n_writes;
static uint32_t next_write_id = 1;
/* also set under gVisor, whose non-blocking splice from an empty pipe
 * returns 0 as at EOF */
bool splice_unusable;

static void write_release(source *s) {
        file_write *w = (file_write *) s;
        for (size_t i = 0; i < 2 * w->n_meta; i++)
                free(w->meta[i]);
        safe_close(w->tmp_fd);
        safe_close(w->dir_fd);
        free(w);
}

/* Take w off the list (so that nothing else finds it), optionally remove
 * its temp file, and free it after the current batch. */
static void write_drop(file_write *w, bool unlink_temp) {
        for (file_write **p = &writes; *p; p = &(*p)->next)
                if (*p == w) {
                        *p = w->next;
                        n_writes--;
                        break;
                }
        if (unlink_temp) {
                fsuser saved;
                bool as_user = fsuser_enter(w->uid, w->gid, &saved) >= 0;
                (void) unlinkat(w->dir_fd, w->tmp_name, 0);
                if (as_user)
                        fsuser_restore(&saved);
        }
        source_kill(&w->src);
}

static file_write *write_find(conn *c, const req *r) {
        uint64_t id = req_u64(r, T_WRITE_ID, 0);
        for (file_write *w = writes; w; w = w->next)
                if (w->id == id && w->owner == c)
                        return w;
        reply_error(c, r->id, ENOENT, "%s: write %llu", initproto_type_name(r->type),
                    (unsigned long long) id);
        return NULL;
}

bool write_temp_name(const char *name) {
        size_t len = strlen(name);
        const char suffix[] = ".hutch-";
        size_t slen = sizeof suffix - 1;

        if (len < 2 + slen + 6 || name[0] != '.')
                return false;
        if (memcmp(name + len - 6 - slen, suffix, slen) != 0)
                return false;
        for (size_t i = len - 6; i < len; i++)
                if (!strchr("0123456789abcdef", name[i]))
                        return false;
        return true;
}

/* Make the temp file's user.e2b.* xattrs exactly w->meta (the sandbox may
 * have set some on it meanwhile). Returns a positive errno. */
static int write_apply_meta(file_write *w) {
        char name[INIT_XATTR_NAME_MAX + 1];

        ssize_t n = flistxattr(w->tmp_fd, xattr_names, sizeof xattr_names);
        for (size_t off = 0; n > 0 && off < (size_t) n;) {
                const char *old = xattr_names + off, *key;
                off += strnlen(old, (size_t) n - off) + 1;
                if (off <= (size_t) n && meta_name(old, &key) && fremovexattr(w->tmp_fd, old) < 0 &&
                    errno != ENODATA)
                        return errno;
        }
        for (size_t i = 0; i < w->n_meta; i++) {
                const char *value = w->meta[2 * i + 1];
                snprintf(name, sizeof name, "%s%s", INITPROTO_META_PREFIX, w->meta[2 * i]);
                if (fsetxattr(w->tmp_fd, name, value, strlen(value), 0) == 0)
                        continue;
                int e = errno;
                struct statvfs sv;
                /* ext4 keeps all xattrs of an inode in the inode and one
                 * block: ENOSPC there with free blocks means "too big" */
                if (e == ENOSPC && fstatvfs(w->tmp_fd, &sv) == 0 && sv.f_bavail > 0)
                        e = E2BIG;
                return e;
        }
        return 0;
}

/* The pipe reached EOF (or writing failed): complete a waiting commit. */
static void write_finish(file_write *w) {
        conn *c = w->owner;
        uint32_t id = w->commit_id;
        fsuser saved;
        struct stat st;
        bool existed = false, meta_changed = w->meta_set && w->n_meta > 0;
        int err = w->error;

        /* Off the list before replying: a failed reply closes c, which
         * would otherwise drop w under our feet. */
        for (file_write **p = &writes; *p; p = &(*p)->next)
                if (*p == w) {
                        *p = w->next;
                        n_writes--;
                        break;
                }
        if (fsuser_enter(w->uid, w->gid, &saved) < 0) {
                (void) unlinkat(w->dir_fd, w->tmp_name, 0);
                reply_error(c, id, EPERM, "write %s", w->path);
                source_kill(&w->src);
                return;
        }

        if (!err && w->written != w->commit_size) {
                (void) unlinkat(w->dir_fd, w->tmp_name, 0);
                reply_error(c, id, EIO, "write %s: short write (%llu of %llu bytes)", w->path,
                            (unsigned long long) w->written, (unsigned long long) w->commit_size);
                goto out;
        }
        if (!err && w->meta_set) {
                err = write_apply_meta(w);
                if (err) {
                        (void) unlinkat(w->dir_fd, w->tmp_name, 0);
                        if (err == EOPNOTSUPP)
                                reply_error(c, id, err,
                                            "write %s: metadata needs user extended attributes",
                                            w->path);
                        else if (err == E2BIG)
                                reply_error(c, id, err,
                                            "write %s: the metadata does not fit the file's "
                                            "extended attributes",
                                            w->path);
                        else
                                reply_error(c, id, err, "write %s: setting metadata", w->path);
                        goto out;
                }
        }
        if (!err && fsync(w->tmp_fd) < 0)
                err = errno;
        if (!err && fstatat(w->dir_fd, w->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
                existed = true;
                if (S_ISDIR(st.st_mode))
                        err = EISDIR;
                else if (S_ISREG(st.st_mode)) {
                        /* Replacing a file keeps its permissions (a script
                         * stays executable); the owner becomes the user. */
                        (void) fchmod(w->tmp_fd, st.st_mode & 0777);
                        /* envd writes in place and removes the old file's
                         * keys one by one: watchers see that as a CHMOD */
                        meta_changed = meta_changed || has_meta(w->path);
                }
        }
        if (!err && renameat(w->dir_fd, w->tmp_name, w->dir_fd, w->name) < 0)
                err = errno;
        if (err) {
                (void) unlinkat(w->dir_fd, w->tmp_name, 0);
                reply_error(c, id, err, "write %s", w->path);
                goto out;
        }

        initproto_writer *m = msg_begin(INITPROTO_OK, 0, id);
        int k = file_info_put(m, w->dir_fd, w->name, w->path, NULL);
        if (k < 0)
                reply_error(c, id, k, "stat %s", w->path);
        else
                msg_send(c, NULL, 0);
        watch_note_write(w->path, !existed, existed || w->written > 0, meta_changed);
out:
        fsuser_restore(&saved);
        source_kill(&w->src);
}

static void write_input_done(file_write *w) {
        source_remove(&w->src);
        w->eof = true;
        if (w->commit_pending)
                write_finish(w);
}

/* Move up to max bytes from the pipe into the temp file: 0 at EOF, -EAGAIN
 * when the pipe is empty. splice() keeps the data out of user space; where
 * it is unavailable (a filesystem without it, a seccomp filter refusing
 * it) plain read/write does the same. */
static ssize_t write_pump(file_write *w, size_t max) {
        static uint8_t buf[64 * 1024];
        ssize_t n;

        if (!splice_unusable) {
                do
                        n = splice(w->src.fd, NULL, w->tmp_fd, NULL, max,
                                   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                while (n < 0 && errno == EINTR);
                if (n >= 0)
                        return n;
                if (errno != EINVAL && errno != ENOSYS && errno != EPERM)
                        return -errno;
                splice_unusable = true;
        }
        do
                n = read(w->src.fd, buf, MIN(max, sizeof buf));
        while (n < 0 && errno == EINTR);
        if (n <= 0)
                return n < 0 ? -errno : 0;
        for (ssize_t done = 0; done < n;) {
                ssize_t k = write(w->tmp_fd, buf + done, (size_t) (n - done));
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                done += k;
        }
        return n;
}

static void write_dispatch(source *s, uint32_t events) {
        file_write *w = (file_write *) s;
        uint64_t room = 0;

        /* A bounded amount per wakeup: other clients wait meanwhile. */
        for (size_t budget = 4u << 20; budget > 0;) {
                size_t max = MIN(budget, (size_t) 1 << 20);
                ssize_t n;
                /* Under gVisor the layer is memory, and init, the writer
                 * here, is never memwatch's victim: stop before the
                 * limit instead (memwatch.c). The room is read again
                 * whenever what is left of it would not cover a chunk. */
                if (room < max && !memwatch_write_room(&room))
                        room = UINT64_MAX;
                if (room == 0)
                        n = -EDQUOT;
                else
                        n = write_pump(w, MIN(max, room));
                if (n > 0) {
                        w->written += (uint64_t) n;
                        budget -= (size_t) n;
                        if (room != UINT64_MAX)
                                room -= MIN(room, (uint64_t) n);
                        continue;
                }
                if (n == -EAGAIN)
                        return;
                if (n < 0) {
                        /* ENOSPC, EDQUOT, EIO...: remembered for the commit.
                         * Closing the pipe gives the writer EPIPE now rather
                         * than letting it stream data into the void; the
                         * data written so far is given back at once (the
                         * temp file goes at the commit or abort). */
                        w->error = (int) -n;
                        (void) ftruncate(w->tmp_fd, 0);
                        log_debug("write %s: %s", w->path, strerror(w->error));
                }
                write_input_done(w);
                return;
        }
}

static int write_temp_open(file_write *w) {
        for (unsigned i = 0; i < 100; i++) {
                uint32_t rnd;
                if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd) {
                        struct timespec ts;
                        clock_gettime(CLOCK_MONOTONIC, &ts);
                        rnd = (uint32_t) ts.tv_nsec ^ (i * 2654435761u);
                }
                /* NAME_MAX bounds the temp name: keep at most 200 bytes of
                 * the real one. */
                snprintf(w->tmp_name, sizeof w->tmp_name, ".%.200s.hutch-%06x", w->name,
                         rnd & 0xffffff);
                w->tmp_fd = openat(w->dir_fd, w->tmp_name,
                                   O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
                if (w->tmp_fd >= 0)
                        return 0;
                if (errno != EEXIST)
                        return negative_errno();
        }
        return -EEXIST;
}

static void fs_write_begin(conn *c, const req *r, const char *path, uid_t uid, gid_t gid) {
        char dir[INIT_PATH_BUF];
        _cleanup_close_pair_ int p[2] = { -1, -1 };
        struct stat st;
        int k;

        if (n_writes >= INIT_MAX_WRITES) {
                reply_error(c, r->id, EAGAIN, "write %s: %d writes in progress", path,
                            INIT_MAX_WRITES);
                return;
        }
        const char *name = path_split(path, dir);
        if (!*name) {
                reply_error(c, r->id, EISDIR, "write %s", path);
                return;
        }

        file_write *w = calloc(1, sizeof *w);
        if (!w) {
                reply_error(c, r->id, ENOMEM, "write %s", path);
                return;
        }
        *w = (file_write) {
                .src = { .fd = -1, .dispatch = write_dispatch, .release = write_release },
                .owner = c,
                .uid = uid,
                .gid = gid,
                .dir_fd = -1,
                .tmp_fd = -1,
        };
        snprintf(w->name, sizeof w->name, "%s", name);
        snprintf(w->path, sizeof w->path, "%s", path);

        /* Parents are created as the user, so the user owns them. Where
         * the user may not create one (a new top-level directory such as
         * /data), envd creates the missing ones as root and gives them to
         * the user; hutch does the same for missing directories only, and
         * the file itself is still created with the user's fsuid, so an
         * existing directory's permissions keep applying. (Inside the
         * sandbox, `user` can become sandbox root with sudo anyway.) */
        const mkdir_owner owner = { uid, gid };
        k = mkdir_parents(dir, &owner, NULL);
        if (k == -EACCES && uid != 0) {
                fsuser root_saved;
                if (fsuser_enter(0, 0, &root_saved) == 0) {
                        k = mkdir_parents(dir, &owner, NULL);
                        fsuser_restore(&root_saved);
                }
        }
        if (k < 0)
                goto fail;
        w->dir_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (w->dir_fd < 0) {
                k = negative_errno();
                goto fail;
        }
        /* Fail early rather than after the whole upload. */
        if (fstatat(w->dir_fd, w->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
                k = -EISDIR;
                goto fail;
        }
        k = write_temp_open(w);
        if (k < 0)
                goto fail;
        if (pipe2(p, O_CLOEXEC) < 0) {
                k = negative_errno();
                goto fail_unlink;
        }
        /* Only our end is non-blocking: the two ends are separate open
         * files, the client decides for its own. */
        (void) fcntl(p[0], F_SETFL, O_NONBLOCK);
        (void) fcntl(p[0], F_SETPIPE_SZ, 256 * 1024);
        w->src.fd = TAKE_FD(p[0]);
        k = source_add(&w->src, EPOLLIN);
        if (k < 0)
                goto fail_unlink;

        w->id = next_write_id++;
        if (next_write_id == 0)
                next_write_id = 1;
        w->next = writes;
        writes = w;
        n_writes++;

        initproto_writer *m = msg_begin(INITPROTO_OK, 0, r->id);
        initproto_put_u64(m, T_WRITE_ID, w->id);
        /* Our copy of the write end is closed on return (p[1]): from then
         * on EOF means the client is done. */
        msg_send(c, &p[1], 1);
        return;

fail_unlink:
        (void) unlinkat(w->dir_fd, w->tmp_name, 0);
fail:
        reply_error(c, r->id, k, "write %s", path);
        source_remove(&w->src);
        write_release(&w->src);
}

static void fs_write_commit(conn *c, const req *r) {
        file_write *w = write_find(c, r);
        if (!w)
                return;
        if (w->commit_pending) {
                reply_error(c, r->id, EBUSY, "commit %s", w->path);
                return;
        }
        if (!req_has(r, T_SIZE)) {
                reply_error(c, r->id, EINVAL, "commit %s: no size", w->path);
                return;
        }
        if (req_u64(r, T_META_SET, 0)) {
                int k = meta_validate(r);
                if (k < 0) {
                        write_drop(w, true);
                        reply_error(c, r->id, k, "commit %s: metadata", w->path);
                        return;
                }
                for (size_t i = 0; i < r->n_meta; i++) {
                        w->meta[2 * i] = strdup(r->meta_keys[i]);
                        w->meta[2 * i + 1] = strdup(r->meta_values[i]);
                        w->n_meta = i + 1;
                        if (!w->meta[2 * i] || !w->meta[2 * i + 1]) {
                                write_drop(w, true);
                                reply_error(c, r->id, ENOMEM, "commit %s", w->path);
                                return;
                        }
                }
                w->meta_set = true;
        }
        w->commit_pending = true;
        w->commit_id = r->id;
        w->commit_size = req_u64(r, T_SIZE, 0);
        /* Otherwise the reply waits for the pipe's EOF. */
        if (w->eof)
                write_finish(w);
}

static void fs_write_abort(conn *c, const req *r) {
        file_write *w = write_find(c, r);
        if (!w)
                return;
        write_drop(w, true);
        reply_ok(c, r->id);
}

void files_conn_gone(conn *c) {
        for (file_write *w = writes, *next; w; w = next) {
                next = w->next;
                if (w->owner == c)
                        write_drop(w, true);
        }
}

/* --------------------------------------------------------------- dispatch */

void files_handle(conn *c, const req *r) {
        char path[INIT_PATH_BUF];
        fsuser saved;
        uid_t uid;
        gid_t gid;
        int k;

        /* Commit and abort name a write begun earlier, as its user. */
        if (r->type == INITPROTO_FS_WRITE_COMMIT) {
                fs_write_commit(c, r);
                return;
        }
        if (r->type == INITPROTO_FS_WRITE_ABORT) {
                fs_write_abort(c, r);
                return;
        }

        if (req_path(c, r, T_PATH, path) < 0)
                return;
        k = req_user(r, &uid, &gid);
        if (k >= 0)
                k = fsuser_enter(uid, gid, &saved);
        if (k < 0) {
                reply_error(c, r->id, k, "%s %s: uid/gid", initproto_type_name(r->type), path);
                return;
        }

        switch (r->type) {
        case INITPROTO_FS_STAT:
                fs_stat(c, r, path);
                break;
        case INITPROTO_FS_LIST:
                fs_list(c, r, path, uid, gid);
                break;
        case INITPROTO_FS_MKDIR:
                fs_mkdir(c, r, path, &(mkdir_owner) { uid, gid });
                break;
        case INITPROTO_FS_MOVE:
                fs_move(c, r, path, &(mkdir_owner) { uid, gid });
                break;
        case INITPROTO_FS_REMOVE:
                fs_remove(c, r, path);
                break;
        case INITPROTO_FS_OPEN_READ:
                fs_open_read(c, r, path);
                break;
        case INITPROTO_FS_WRITE_BEGIN:
                fs_write_begin(c, r, path, uid, gid);
                break;
        }
        fsuser_restore(&saved);
}
