/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A volume's content, reached from the host (the content plane of the API,
 * docs/volumes.md). The host never resolves a path inside a volume: a
 * sandbox may have planted any symlink there. Each session is a helper
 * process, forked from the caller, that
 *   - takes a host uid range of its own (run_dir/uids, as a sandbox does)
 *     and enters a new user and mount namespace as that range's root,
 *   - is given the volume's mount id-mapped into that namespace (on-disk
 *     ids 0..65535 are its 0..65535, as in every sandbox),
 *   - chroots into it and resolves every path with openat2(RESOLVE_IN_ROOT |
 *     RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV),
 * so that a path or a link can only ever name a file of the volume, and an
 * open can only succeed where that unprivileged range may. Data moves as
 * descriptors: a read gets the opened file, a write a temporary file next to
 * its target that the commit renames into place; the caller (the daemon)
 * streams through them without holding a file in memory.
 */
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/syscalls.h"

#define VOLFS_TIMEOUT_MS 60000
#define VOLFS_LIST_MAX HUTCH_VOLFS_LIST_MAX
#define VOLFS_DEFAULT_ID 1000

enum {
        VOP_STAT = 1,
        VOP_LIST,
        VOP_MKDIR,
        VOP_REMOVE,
        VOP_CHATTR,
        VOP_OPEN_READ,
        VOP_WRITE_BEGIN,
        VOP_WRITE_COMMIT,
        VOP_WRITE_ABORT,
};

typedef struct volfs_req {
        uint32_t op, depth, parents;
        int64_t uid, gid, mode;
        char path[HUTCH_VOLFS_PATH_MAX];
} volfs_req;

typedef struct volfs_reply {
        int32_t err;   /* negative errno */
        uint32_t more; /* VOP_LIST: an entry, more follow */
        char msg[256];
        hutch_volfs_entry e;
} volfs_reply;

struct hutch_volfs {
        hutch_ctx *ctx;
        pid_t pid;
        int sock;
        uint32_t uid_slot;
        char owner[24];
        bool writing;
        char wpath[HUTCH_VOLFS_PATH_MAX]; /* the write under way */
};

/* ------------------------------------------------------------- the helper */

static int root_fd = -1;
static int w_parent = -1, w_fd = -1;
static char w_tmp[64], w_base[NAME_MAX + 1];

static int open_in_root(const char *rel, int flags, mode_t mode) {
        struct open_how how = {
                .flags = (uint64_t) (flags | O_CLOEXEC),
                .mode = (flags & O_CREAT) ? mode : 0,
                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
        };
        /* EAGAIN: a rename or mount anywhere on the host (the kernel's
         * counters are global) raced a ".." step; openat2(2) says retry */
        for (int i = 0;; i++) {
                int fd = sys_openat2(root_fd, rel, &how, sizeof how);
                if (fd >= 0)
                        return fd;
                if (errno != EAGAIN || i >= 64)
                        return -errno;
        }
}

/* "/a/b/c" -> parent "a/b" (or "."), base "c"; "/" -> ".", ".". */
static int split(const char *path, char *parent, char *base) {
        const char *rel = path + 1;
        if (!*rel) {
                strcpy(parent, ".");
                strcpy(base, ".");
                return 0;
        }
        const char *slash = strrchr(rel, '/');
        if (!slash) {
                strcpy(parent, ".");
                snprintf(base, NAME_MAX + 1, "%s", rel);
        } else {
                memcpy(parent, rel, (size_t) (slash - rel));
                parent[slash - rel] = 0;
                if (strlen(slash + 1) > NAME_MAX)
                        return -ENAMETOOLONG;
                snprintf(base, NAME_MAX + 1, "%s", slash + 1);
        }
        return 0;
}

static void fill_entry(hutch_volfs_entry *e, int dirfd, const char *name, const struct stat *st,
                       const char *path) {
        memset(e, 0, sizeof *e);
        e->type = S_ISREG(st->st_mode) ? HUTCH_VOLFS_FILE
                : S_ISDIR(st->st_mode) ? HUTCH_VOLFS_DIR
                : S_ISLNK(st->st_mode) ? HUTCH_VOLFS_SYMLINK
                                       : HUTCH_VOLFS_OTHER;
        e->mode = st->st_mode & 07777;
        e->uid = st->st_uid;
        e->gid = st->st_gid;
        e->size = (uint64_t) st->st_size;
        e->atime_ns = (int64_t) st->st_atim.tv_sec * 1000000000 + st->st_atim.tv_nsec;
        e->mtime_ns = (int64_t) st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
        e->ctime_ns = (int64_t) st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
        snprintf(e->path, sizeof e->path, "%s", path);
        if (S_ISLNK(st->st_mode)) {
                ssize_t n = readlinkat(dirfd, name, e->target, sizeof e->target - 1);
                e->target[n > 0 ? n : 0] = 0;
        }
}

static int stat_path(const char *path, hutch_volfs_entry *e) {
        char parent[HUTCH_VOLFS_PATH_MAX], base[NAME_MAX + 1];
        int r = split(path, parent, base);
        if (r < 0)
                return r;
        _cleanup_close_ int pfd = open_in_root(parent, O_PATH | O_DIRECTORY, 0);
        if (pfd < 0)
                return pfd;
        struct stat st;
        if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        fill_entry(e, pfd, base, &st, path);
        return 0;
}

static int reply(int sock, int err, bool more, const hutch_volfs_entry *e, const int *fd) {
        static volfs_reply rp;
        memset(&rp, 0, offsetof(volfs_reply, e));
        rp.err = err;
        rp.more = more;
        if (e)
                rp.e = *e;
        else
                memset(&rp.e, 0, sizeof rp.e);
        if (fd)
                return fd_send_with_fds(sock, &rp, sizeof rp, fd, 1);
        return send(sock, &rp, sizeof rp, MSG_NOSIGNAL) == (ssize_t) sizeof rp ? 0 : -errno;
}

static int list_dir(int sock, int dirfd, const char *prefix, unsigned level, unsigned depth,
                    unsigned *count) {
        int dup_fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 3);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                if (dup_fd >= 0)
                        close(dup_fd);
                return -errno;
        }
        int r = 0;
        static hutch_volfs_entry e;
        for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                if (++*count > VOLFS_LIST_MAX) {
                        r = -E2BIG;
                        break;
                }
                char path[HUTCH_VOLFS_PATH_MAX];
                if (snprintf(path, sizeof path, "%s/%s", streq(prefix, "/") ? "" : prefix,
                             de->d_name) >= (int) sizeof path)
                        continue;
                struct stat st;
                if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                        continue; /* gone meanwhile */
                fill_entry(&e, dirfd, de->d_name, &st, path);
                if ((r = reply(sock, 0, true, &e, NULL)) < 0)
                        break;
                if (S_ISDIR(st.st_mode) && level + 1 < depth) {
                        int sub = openat(dirfd, de->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                        if (sub >= 0) {
                                r = list_dir(sock, sub, path, level + 1, depth, count);
                                close(sub);
                        }
                }
        }
        closedir(d);
        return r;
}

static int64_t id_or_default(int64_t v) {
        return v < 0 ? VOLFS_DEFAULT_ID : v;
}

/* mkdir -p (parents) or mkdir, each new directory given the owner and mode. */
static int make_dirs(const char *path, int64_t uid, int64_t gid, int64_t mode, bool parents,
                     bool *ret_created) {
        char prefix[HUTCH_VOLFS_PATH_MAX];
        size_t n = strlen(path);
        *ret_created = false;
        for (size_t i = 1; i <= n; i++) {
                if (path[i] != '/' && path[i] != 0)
                        continue;
                memcpy(prefix, path, i);
                prefix[i] = 0;
                bool last = i == n;
                _cleanup_close_ int fd = open_in_root(prefix + 1, O_PATH | O_DIRECTORY, 0);
                if (fd >= 0)
                        continue;
                if (fd != -ENOENT)
                        return fd;
                if (!last && !parents)
                        return -ENOENT;
                char parent[HUTCH_VOLFS_PATH_MAX], base[NAME_MAX + 1];
                int r = split(prefix, parent, base);
                if (r < 0)
                        return r;
                _cleanup_close_ int pfd = open_in_root(parent, O_PATH | O_DIRECTORY, 0);
                if (pfd < 0)
                        return pfd;
                mode_t m = mode < 0 ? 0755 : (mode_t) mode;
                if (mkdirat(pfd, base, m) < 0)
                        return -errno;
                if (fchownat(pfd, base, (uid_t) id_or_default(uid), (gid_t) id_or_default(gid),
                             AT_SYMLINK_NOFOLLOW) < 0 ||
                    fchmodat(pfd, base, m, 0) < 0)
                        return -errno;
                if (last)
                        *ret_created = true;
        }
        return 0;
}

static int remove_tree(int parent, const char *name, unsigned depth) {
        if (depth > 4096)
                return -ELOOP;
        struct stat st;
        if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode))
                return unlinkat(parent, name, 0) < 0 ? -errno : 0;
        int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        DIR *d = fdopendir(fd);
        if (!d) {
                close(fd);
                return -errno;
        }
        int r = 0;
        for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                r = remove_tree(fd, de->d_name, depth + 1);
                if (r == -ENOENT)
                        r = 0;
        }
        closedir(d);
        if (r < 0)
                return r;
        return unlinkat(parent, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

static void write_drop(void) {
        if (w_parent >= 0 && w_tmp[0])
                (void) unlinkat(w_parent, w_tmp, 0);
        w_fd = safe_close(w_fd);
        w_parent = safe_close(w_parent);
        w_tmp[0] = 0;
}

static int do_chattr(const volfs_req *q, hutch_volfs_entry *e) {
        char parent[HUTCH_VOLFS_PATH_MAX], base[NAME_MAX + 1];
        int r = split(q->path, parent, base);
        if (r < 0)
                return r;
        _cleanup_close_ int pfd = open_in_root(parent, O_PATH | O_DIRECTORY, 0);
        if (pfd < 0)
                return pfd;
        struct stat st;
        if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if ((q->uid >= 0 || q->gid >= 0) &&
            fchownat(pfd, base, q->uid >= 0 ? (uid_t) q->uid : (uid_t) -1,
                     q->gid >= 0 ? (gid_t) q->gid : (gid_t) -1, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        if (q->mode >= 0) {
                if (S_ISLNK(st.st_mode))
                        return -ELOOP;
                if (fchmodat(pfd, base, (mode_t) q->mode, 0) < 0)
                        return -errno;
        }
        return stat_path(q->path, e);
}

static int serve_one(int sock, const volfs_req *q) {
        static hutch_volfs_entry e;
        int r = 0;
        switch (q->op) {
        case VOP_STAT:
                r = stat_path(q->path, &e);
                return reply(sock, r, false, r < 0 ? NULL : &e, NULL);
        case VOP_LIST: {
                _cleanup_close_ int fd = open_in_root(q->path[1] ? q->path + 1 : ".",
                                                      O_RDONLY | O_DIRECTORY, 0);
                if (fd < 0)
                        return reply(sock, fd, false, NULL, NULL);
                unsigned count = 0;
                r = list_dir(sock, fd, q->path, 0, q->depth ? q->depth : 1, &count);
                return reply(sock, r < 0 ? r : 0, false, NULL, NULL);
        }
        case VOP_MKDIR: {
                bool created;
                r = make_dirs(q->path, q->uid, q->gid, q->mode, q->parents, &created);
                if (r >= 0)
                        r = stat_path(q->path, &e);
                if (r >= 0 && e.type != HUTCH_VOLFS_DIR)
                        r = -EEXIST;
                return reply(sock, r, false, r < 0 ? NULL : &e, NULL);
        }
        case VOP_REMOVE: {
                if (streq(q->path, "/"))
                        return reply(sock, -EBUSY, false, NULL, NULL);
                char parent[HUTCH_VOLFS_PATH_MAX], base[NAME_MAX + 1];
                if ((r = split(q->path, parent, base)) >= 0) {
                        _cleanup_close_ int pfd = open_in_root(parent, O_PATH | O_DIRECTORY, 0);
                        r = pfd < 0 ? pfd : remove_tree(pfd, base, 0);
                }
                return reply(sock, r, false, NULL, NULL);
        }
        case VOP_CHATTR:
                r = do_chattr(q, &e);
                return reply(sock, r, false, r < 0 ? NULL : &e, NULL);
        case VOP_OPEN_READ: {
                _cleanup_close_ int fd = open_in_root(q->path[1] ? q->path + 1 : ".",
                                                      O_RDONLY | O_NOCTTY | O_NONBLOCK, 0);
                struct stat st;
                if (fd < 0)
                        return reply(sock, fd, false, NULL, NULL);
                if (fstat(fd, &st) < 0)
                        return reply(sock, -errno, false, NULL, NULL);
                if (!S_ISREG(st.st_mode))
                        return reply(sock, S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL, false, NULL,
                                     NULL);
                fill_entry(&e, -1, "", &st, q->path);
                return reply(sock, 0, false, &e, &fd);
        }
        case VOP_WRITE_BEGIN: {
                if (w_fd >= 0 || streq(q->path, "/"))
                        return reply(sock, streq(q->path, "/") ? -EISDIR : -EBUSY, false, NULL, NULL);
                char parent[HUTCH_VOLFS_PATH_MAX], base[NAME_MAX + 1];
                if ((r = split(q->path, parent, base)) < 0)
                        return reply(sock, r, false, NULL, NULL);
                bool created;
                char pabs[HUTCH_VOLFS_PATH_MAX + 1];
                snprintf(pabs, sizeof pabs, "/%s", streq(parent, ".") ? "" : parent);
                if (!streq(pabs, "/") && (r = make_dirs(pabs, -1, -1, -1, true, &created)) < 0)
                        return reply(sock, r, false, NULL, NULL);
                int pfd = open_in_root(parent, O_RDONLY | O_DIRECTORY, 0);
                if (pfd < 0)
                        return reply(sock, pfd, false, NULL, NULL);
                struct stat st;
                if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
                        close(pfd);
                        return reply(sock, -EISDIR, false, NULL, NULL);
                }
                uint8_t rnd[8];
                if (getrandom(rnd, sizeof rnd, 0) != (ssize_t) sizeof rnd) {
                        close(pfd);
                        return reply(sock, -EIO, false, NULL, NULL);
                }
                snprintf(w_tmp, sizeof w_tmp, ".hutch-upload-%02x%02x%02x%02x%02x%02x%02x%02x",
                         rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
                int fd = openat(pfd, w_tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0) {
                        r = -errno;
                        close(pfd);
                        w_tmp[0] = 0;
                        return reply(sock, r, false, NULL, NULL);
                }
                w_parent = pfd;
                w_fd = fd;
                snprintf(w_base, sizeof w_base, "%s", base);
                snprintf(e.path, sizeof e.path, "%s", q->path);
                r = reply(sock, 0, false, NULL, &fd);
                if (r < 0)
                        write_drop();
                return r;
        }
        case VOP_WRITE_COMMIT: {
                if (w_fd < 0)
                        return reply(sock, -EBADF, false, NULL, NULL);
                mode_t m = q->mode < 0 ? 0644 : (mode_t) q->mode;
                if (fchown(w_fd, (uid_t) id_or_default(q->uid), (gid_t) id_or_default(q->gid)) < 0 ||
                    fchmod(w_fd, m) < 0 || renameat(w_parent, w_tmp, w_parent, w_base) < 0) {
                        r = -errno;
                        write_drop();
                        return reply(sock, r, false, NULL, NULL);
                }
                w_tmp[0] = 0;
                write_drop();
                r = stat_path(q->path, &e);
                return reply(sock, r, false, r < 0 ? NULL : &e, NULL);
        }
        case VOP_WRITE_ABORT:
                write_drop();
                return reply(sock, 0, false, NULL, NULL);
        }
        return reply(sock, -EINVAL, false, NULL, NULL);
}

static _Noreturn void helper_main(int sock, uid_t base) {
        /* Nothing of the caller's but the socket: not its port, not its
         * database, not its lock files. */
        if (sock != 3) {
                if (dup2(sock, 3) < 0)
                        _exit(120);
                sock = 3;
        }
        int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
                _exit(120);
        if (sys_close_range(4, ~0U, 0) < 0)
                _exit(120);
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* it holds a copy of the caller's memory (keys included): nobody
         * but host root may read it, not even its own uid range */
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
                _exit(120);
        /* The user namespace belongs to the range's root, not host root
         * (as sandboxes' do: sandbox.c); real and saved ids stay 0 until the
         * maps exist. */
        if (syscall(SYS_setresgid, -1, base, -1) < 0 || syscall(SYS_setresuid, -1, base, -1) < 0)
                _exit(121);
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
                _exit(122);
        char b = 1;
        if (write(sock, &b, 1) != 1)
                _exit(123);
        /* the parent wrote the maps and sends the volume's mount */
        int mnt = -1;
        {
                char buf[1];
                struct iovec iov = { .iov_base = buf, .iov_len = 1 };
                union {
                        struct cmsghdr align;
                        char c[CMSG_SPACE(sizeof(int))];
                } ctl;
                struct msghdr msg = { .msg_iov = &iov,
                                      .msg_iovlen = 1,
                                      .msg_control = ctl.c,
                                      .msg_controllen = sizeof ctl.c };
                if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) <= 0)
                        _exit(124);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                if (!cm || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(sizeof(int)))
                        _exit(124);
                memcpy(&mnt, CMSG_DATA(cm), sizeof mnt);
        }
        if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0 || setgroups(0, NULL) < 0)
                _exit(125);
        if (fchdir(mnt) < 0 || chroot(".") < 0 || chdir("/") < 0)
                _exit(126);
        close(mnt);
        (void) prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        umask(0);
        root_fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root_fd < 0)
                _exit(127);
        if (write(sock, &b, 1) != 1)
                _exit(123);
        static volfs_req q;
        for (;;) {
                ssize_t n = recv(sock, &q, sizeof q, 0);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n != (ssize_t) sizeof q)
                        break;
                q.path[sizeof q.path - 1] = 0;
                if (q.path[0] != '/') {
                        (void) reply(sock, -EINVAL, false, NULL, NULL);
                        continue;
                }
                if (serve_one(sock, &q) < 0)
                        break;
        }
        write_drop();
        _exit(0);
}

/* ------------------------------------------------------------- the caller */

static int wait_readable(int fd, int timeout_ms) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int k;
        do
                k = poll(&p, 1, timeout_ms);
        while (k < 0 && errno == EINTR);
        if (k < 0)
                return -errno;
        return k == 0 ? -ETIMEDOUT : 0;
}

hutch_volfs *hutch_volfs_close(hutch_volfs *v) {
        if (!v)
                return NULL;
        v->sock = safe_close(v->sock);
        if (v->pid > 0) {
                /* EOF ends it at once; one stuck in the kernel for a second
                 * longer is killed */
                int pfd = sys_pidfd_open(v->pid, 0);
                if (pfd >= 0 && wait_readable(pfd, 1000) == -ETIMEDOUT)
                        (void) kill(v->pid, SIGKILL);
                safe_close(pfd);
                while (waitpid(v->pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        }
        if (v->uid_slot != UINT32_MAX)
                (void) uidrange_release(v->ctx, v->uid_slot, v->owner);
        free(v);
        return NULL;
}

int hutch_volfs_open(hutch_ctx *ctx, const char *id, hutch_volfs **ret, hutch_error *err) {
        static unsigned counter;
        if (!hutch_volume_id_valid(id))
                return hutch_error_set(err, -EINVAL, "invalid volume id");
        hutch_volfs *v = calloc(1, sizeof *v);
        if (!v)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        v->ctx = ctx;
        v->sock = -1;
        v->uid_slot = UINT32_MAX;
        snprintf(v->owner, sizeof v->owner, "v%d.%u", (int) getpid(), counter++ % 1000);
        int r = uidrange_alloc(ctx, v->owner, &v->uid_slot, err);
        if (r < 0) {
                v->uid_slot = UINT32_MAX;
                hutch_volfs_close(v);
                return r;
        }
        uid_t base = uidrange_base(ctx, v->uid_slot);
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
                r = hutch_error_set(err, -errno, "socketpair: %m");
                hutch_volfs_close(v);
                return r;
        }
        pid_t pid = fork();
        if (pid < 0) {
                r = hutch_error_set(err, -errno, "fork: %m");
                close(sp[0]);
                close(sp[1]);
                hutch_volfs_close(v);
                return r;
        }
        if (pid == 0) {
                close(sp[0]);
                helper_main(sp[1], base);
        }
        close(sp[1]);
        v->pid = pid;
        v->sock = sp[0];
        char b;
        const char *step = "starting the helper";
        _cleanup_close_ int userns = -1, mnt = -1;
        if ((r = wait_readable(v->sock, VOLFS_TIMEOUT_MS)) < 0 || read(v->sock, &b, 1) != 1)
                r = r < 0 ? r : -EPROTO;
        if (r >= 0) {
                step = "writing its id maps";
                if ((r = idmap_write(pid, "uid_map", base, HUTCH_IDMAP_SIZE)) >= 0)
                        r = idmap_write(pid, "gid_map", base, HUTCH_IDMAP_SIZE);
        }
        if (r >= 0) {
                char p[64];
                snprintf(p, sizeof p, "/proc/%d/ns/user", pid);
                userns = open(p, O_RDONLY | O_CLOEXEC);
                if (userns < 0)
                        r = -errno;
        }
        hutch_error e = { 0 };
        if (r >= 0 && (r = volume_mount_idmapped(ctx, id, userns, &mnt, &e)) < 0) {
                hutch_volfs_close(v);
                return hutch_error_set(err, r, "%s", e.msg);
        }
        if (r >= 0 && (r = fd_send_with_fds(v->sock, "m", 1, &mnt, 1)) >= 0) {
                step = "entering the volume";
                if ((r = wait_readable(v->sock, VOLFS_TIMEOUT_MS)) >= 0 && read(v->sock, &b, 1) != 1)
                        r = -EPROTO;
        }
        if (r < 0) {
                hutch_volfs_close(v);
                return hutch_error_set(err, r, "volume %s: %s: %s", id, step, strerror(-r));
        }
        *ret = v;
        return 0;
}

static const char *errno_text(int r) {
        switch (r) {
        case -ENOENT:
                return "path not found";
        case -ENOTDIR:
                return "a component of the path is not a directory";
        case -EISDIR:
                return "path is a directory";
        case -EEXIST:
                return "path exists and is not a directory";
        case -ENOSPC:
                return "the volume is full";
        case -EBUSY:
                return "the volume's root cannot be removed";
        case -ELOOP:
                return "path is a symlink";
        case -EXDEV:
                return "path leaves the volume";
        case -E2BIG:
                return "too many entries";
        }
        return NULL;
}

/* Send q, take one reply (and its descriptor, when ret_fd). */
static int call(hutch_volfs *v, const volfs_req *q, volfs_reply *rp, int *ret_fd, hutch_error *err) {
        if (!v || v->sock < 0)
                return hutch_error_set(err, -EPIPE, "the volume session is closed");
        if (send(v->sock, q, sizeof *q, MSG_NOSIGNAL) != (ssize_t) sizeof *q)
                return hutch_error_set(err, -errno, "volume helper: %m");
        for (;;) {
                int r = wait_readable(v->sock, VOLFS_TIMEOUT_MS);
                if (r < 0)
                        return hutch_error_set(err, r, "volume helper: %s", strerror(-r));
                int fds[1] = { -1 };
                size_t nfds = 0;
                struct iovec iov = { .iov_base = rp, .iov_len = sizeof *rp };
                union {
                        struct cmsghdr align;
                        char c[CMSG_SPACE(sizeof(int))];
                } ctl;
                struct msghdr msg = { .msg_iov = &iov,
                                      .msg_iovlen = 1,
                                      .msg_control = ctl.c,
                                      .msg_controllen = sizeof ctl.c };
                ssize_t n = recvmsg(v->sock, &msg, MSG_CMSG_CLOEXEC);
                if (n < 0 && errno == EINTR)
                        continue;
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                if (cm && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int))) {
                        memcpy(fds, CMSG_DATA(cm), sizeof(int));
                        nfds = 1;
                }
                if (n != (ssize_t) sizeof *rp || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
                        if (nfds)
                                close(fds[0]);
                        v->sock = safe_close(v->sock);
                        return hutch_error_set(err, -EPROTO, "volume helper: a broken reply");
                }
                rp->e.path[sizeof rp->e.path - 1] = 0;
                rp->e.target[sizeof rp->e.target - 1] = 0;
                if (ret_fd && nfds) {
                        *ret_fd = fds[0];
                } else if (nfds)
                        close(fds[0]);
                if (rp->err < 0) {
                        const char *t = errno_text(rp->err);
                        return hutch_error_set(err, rp->err, "%s", t ? t : strerror(-rp->err));
                }
                return 0;
        }
}

static int req_init(volfs_req *q, uint32_t op, const char *path, hutch_error *err) {
        memset(q, 0, sizeof *q);
        q->op = op;
        q->uid = q->gid = q->mode = -1;
        if (!path || path[0] != '/' || strlen(path) >= sizeof q->path)
                return hutch_error_set(err, -EINVAL,
                                       "path must be absolute and shorter than %d bytes",
                                       HUTCH_VOLFS_PATH_MAX);
        strcpy(q->path, path);
        return 0;
}

static int check_ids(int64_t uid, int64_t gid, int64_t mode, hutch_error *err) {
        if (uid > 65535 || gid > 65535)
                return hutch_error_set(err, -EINVAL, "uid and gid must be 0..65535");
        if (mode > 07777)
                return hutch_error_set(err, -EINVAL, "mode must be at most 07777");
        return 0;
}

static volfs_reply reply_buf;

int hutch_volfs_stat(hutch_volfs *v, const char *path, hutch_volfs_entry *ret, hutch_error *err) {
        volfs_req q;
        int r = req_init(&q, VOP_STAT, path, err);
        if (r >= 0 && (r = call(v, &q, &reply_buf, NULL, err)) >= 0)
                *ret = reply_buf.e;
        return r;
}

int hutch_volfs_list(hutch_volfs *v, const char *path, unsigned depth, hutch_volfs_list_fn fn,
                     void *userdata, hutch_error *err) {
        volfs_req q;
        int r = req_init(&q, VOP_LIST, path, err);
        if (r < 0)
                return r;
        q.depth = depth ? depth : 1;
        int stop = 0;
        for (bool first = true;; first = false) {
                if (first)
                        r = call(v, &q, &reply_buf, NULL, err);
                else {
                        /* the rest of the sequence: replies without a request */
                        r = wait_readable(v->sock, VOLFS_TIMEOUT_MS);
                        if (r < 0)
                                hutch_error_set(err, r, "volume helper: %s", strerror(-r));
                        else {
                                ssize_t k = recv(v->sock, &reply_buf, sizeof reply_buf, 0);
                                if (k != (ssize_t) sizeof reply_buf) {
                                        v->sock = safe_close(v->sock);
                                        r = hutch_error_set(err, -EPROTO,
                                                            "volume helper: a broken reply");
                                } else if (reply_buf.err < 0) {
                                        const char *t = errno_text(reply_buf.err);
                                        r = hutch_error_set(err, reply_buf.err, "%s",
                                                            t ? t : strerror(-reply_buf.err));
                                }
                        }
                }
                if (r < 0 || !reply_buf.more)
                        break;
                reply_buf.e.path[sizeof reply_buf.e.path - 1] = 0;
                reply_buf.e.target[sizeof reply_buf.e.target - 1] = 0;
                /* after a stop the sequence is still read to its end, so
                 * that the session stays in step */
                if (stop >= 0)
                        stop = fn(&reply_buf.e, userdata);
        }
        if (r < 0)
                return r;
        return stop < 0 ? hutch_error_set(err, stop, "listing stopped: %s", strerror(-stop)) : 0;
}

int hutch_volfs_mkdir(hutch_volfs *v, const char *path, int64_t uid, int64_t gid, int64_t mode,
                      bool parents, hutch_volfs_entry *ret, hutch_error *err) {
        volfs_req q;
        int r = req_init(&q, VOP_MKDIR, path, err);
        if (r >= 0)
                r = check_ids(uid, gid, mode, err);
        if (r < 0)
                return r;
        q.uid = uid;
        q.gid = gid;
        q.mode = mode;
        q.parents = parents;
        if ((r = call(v, &q, &reply_buf, NULL, err)) >= 0)
                *ret = reply_buf.e;
        return r;
}

int hutch_volfs_remove(hutch_volfs *v, const char *path, hutch_error *err) {
        volfs_req q;
        int r = req_init(&q, VOP_REMOVE, path, err);
        return r < 0 ? r : call(v, &q, &reply_buf, NULL, err);
}

int hutch_volfs_chattr(hutch_volfs *v, const char *path, int64_t uid, int64_t gid, int64_t mode,
                       hutch_volfs_entry *ret, hutch_error *err) {
        volfs_req q;
        int r = req_init(&q, VOP_CHATTR, path, err);
        if (r >= 0)
                r = check_ids(uid, gid, mode, err);
        if (r < 0)
                return r;
        q.uid = uid;
        q.gid = gid;
        q.mode = mode;
        if ((r = call(v, &q, &reply_buf, NULL, err)) >= 0)
                *ret = reply_buf.e;
        return r;
}

int hutch_volfs_open_read(hutch_volfs *v, const char *path, int *ret_fd, hutch_volfs_entry *ret,
                          hutch_error *err) {
        volfs_req q;
        int fd = -1;
        int r = req_init(&q, VOP_OPEN_READ, path, err);
        if (r >= 0)
                r = call(v, &q, &reply_buf, &fd, err);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || fd_set_nonblock(fd, false) < 0) {
                safe_close(fd);
                return hutch_error_set(err, -EPROTO, "volume helper: no file came back");
        }
        *ret = reply_buf.e;
        *ret_fd = fd;
        return 0;
}

int hutch_volfs_write_begin(hutch_volfs *v, const char *path, int *ret_fd, hutch_error *err) {
        volfs_req q;
        int fd = -1;
        int r = req_init(&q, VOP_WRITE_BEGIN, path, err);
        if (r >= 0)
                r = call(v, &q, &reply_buf, &fd, err);
        if (r < 0) {
                safe_close(fd);
                return r;
        }
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                safe_close(fd);
                hutch_volfs_write_abort(v);
                return hutch_error_set(err, -EPROTO, "volume helper: no file came back");
        }
        v->writing = true;
        snprintf(v->wpath, sizeof v->wpath, "%s", path);
        *ret_fd = fd;
        return 0;
}

int hutch_volfs_write_commit(hutch_volfs *v, int64_t uid, int64_t gid, int64_t mode,
                             hutch_volfs_entry *ret, hutch_error *err) {
        volfs_req q;
        if (!v->writing)
                return hutch_error_set(err, -EBADF, "no write under way");
        int r = check_ids(uid, gid, mode, err);
        if (r < 0) {
                hutch_volfs_write_abort(v);
                return r;
        }
        r = req_init(&q, VOP_WRITE_COMMIT, v->wpath, err);
        if (r < 0)
                return r;
        q.uid = uid;
        q.gid = gid;
        q.mode = mode;
        v->writing = false;
        if ((r = call(v, &q, &reply_buf, NULL, err)) >= 0)
                *ret = reply_buf.e;
        return r;
}

void hutch_volfs_write_abort(hutch_volfs *v) {
        if (!v || !v->writing)
                return;
        v->writing = false;
        volfs_req q;
        hutch_error e = { 0 };
        if (req_init(&q, VOP_WRITE_ABORT, "/", &e) >= 0)
                (void) call(v, &q, &reply_buf, NULL, &e);
}
