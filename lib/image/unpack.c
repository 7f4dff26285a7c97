/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layer unpacker. A layer is attacker-controlled: its bytes are checked
 * against the manifest's digest before anything parses them, and then
 * unpacked by a child that cannot reach the host's tree:
 *
 *   parent (host root)                     child (new user + mount ns)
 *   ------------------                     ---------------------------
 *   sha256 of the blob == manifest's
 *   mkdir layers/sha256/.tmp-<hex>-<pid>
 *   clone(CLONE_NEWUSER|CLONE_NEWNS)  ──►  waits for its mount
 *   uid_map/gid_map "0 UNPACK_BASE 65536"
 *   open_tree(tmp) + MOUNT_ATTR_IDMAP
 *   (the child's userns) ─── fd ─────────►  setresuid(0): host uid UNPACK_BASE
 *                                           fchdir(mount); chroot("."):
 *                                           nothing but the layer is visible
 *   decompress (gzip/zstd), sha256 of the   every path through
 *   tar == diff_id, bounds ── tar bytes ──►  openat2(RESOLVE_IN_ROOT|NO_MAGICLINKS|
 *                                           NO_XDEV), the last component never
 *                                           followed; entries checked (below)
 *   diff_id matches and child exit 0:
 *   rename tmp -> <hex>, touch <hex>.done
 *
 * Files land on disk with ids 0..65535 through the id-mapped mount (the
 * child's uid k is host UNPACK_BASE+k, which the mount stores as k); an id
 * outside 0..65535 cannot even be expressed. The child runs our code only
 * (libarchive's tar reader on authenticated bytes), never the image's.
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <grp.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <openssl/evp.h>
#include <seccomp.h>

#include "image/image-internal.h"
#include "image/layer.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

#define CHUNK (256u << 10)

static uint64_t max_expansion = LAYER_MAX_EXPANSION;

void image_set_max_expansion(uint64_t bytes) {
        max_expansion = bytes ? bytes : LAYER_MAX_EXPANSION;
}

/* ------------------------------------------------------------- hashing */

int sha256_hex_final(EVP_MD_CTX *md, char out[65]) {
        unsigned char d[32];
        unsigned int n = 0;
        if (EVP_DigestFinal_ex(md, d, &n) != 1 || n != 32)
                return -EIO;
        for (unsigned i = 0; i < 32; i++)
                snprintf(out + 2 * i, 3, "%02x", d[i]);
        return 0;
}

int image_hash_fd(int fd, uint64_t max, char hex[65], uint64_t *ret_size) {
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                return -ENOMEM;
        }
        _cleanup_free_ char *buf = malloc(CHUNK);
        uint64_t total = 0;
        int r = buf ? 0 : -ENOMEM;
        while (r == 0) {
                ssize_t n = pread(fd, buf, CHUNK, (off_t) total);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                if (n == 0)
                        break;
                total += (uint64_t) n;
                if (total > max) {
                        r = -EFBIG;
                        break;
                }
                EVP_DigestUpdate(md, buf, (size_t) n);
        }
        if (r == 0)
                r = sha256_hex_final(md, hex);
        EVP_MD_CTX_free(md);
        if (ret_size)
                *ret_size = total;
        return r;
}

/* ------------------------------------------------------------- the child */

typedef struct unpack_state {
        int rootfd;
        uint64_t entries, bytes;
        unsigned stripped_xattrs;
        char msg[512];
} unpack_state;

#define FAIL(st, code, ...)                                                                        \
        do {                                                                                       \
                snprintf((st)->msg, sizeof(st)->msg, __VA_ARGS__);                                 \
                return (code);                                                                     \
        } while (0)

/* Split a tar path into components: "./" prefixes and empty or "."
 * components dropped; "..", absolute names and over-deep or over-long
 * paths refused. Writes NUL-separated components into buf. */
static int split_path(unpack_state *st, const char *path, char *buf, size_t bufsz,
                      const char **comps, unsigned *ret_n, const char *what) {
        if (!path)
                FAIL(st, -EINVAL, "%s without a name (or not valid in this locale)", what);
        size_t len = strlen(path);
        if (len >= LAYER_MAX_PATH || len >= bufsz)
                FAIL(st, -ENAMETOOLONG, "%s name is longer than %u bytes", what, LAYER_MAX_PATH);
        if (path[0] == '/')
                FAIL(st, -EPERM, "%s '%.200s' is an absolute name", what, path);
        memcpy(buf, path, len + 1);
        unsigned n = 0;
        for (char *save = NULL, *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
                if (streq(c, "."))
                        continue;
                if (streq(c, ".."))
                        FAIL(st, -EPERM, "%s '%.200s' has a '..' component", what, path);
                if (n >= LAYER_MAX_DEPTH)
                        FAIL(st, -ELOOP, "%s '%.200s' is deeper than %u directories", what, path,
                             LAYER_MAX_DEPTH);
                comps[n++] = c;
        }
        *ret_n = n;
        return 0;
}

/* Every lookup is scoped to the layer's root, and follows no symlink at
 * all: a layer that writes through a link it made (a/ -> /etc, then
 * a/shadow) is refused, as no tar of a real tree does that. */
static int open_in_root(unpack_state *st, const char *rel, int flags) {
        struct open_how how = {
                .flags = (uint64_t) (flags | O_CLOEXEC),
                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
                        RESOLVE_NO_XDEV,
        };
        int fd = sys_openat2(st->rootfd, *rel ? rel : ".", &how, sizeof how);
        return fd < 0 ? -errno : fd;
}

/* The directory holding comps[0..n-1], created (0755, root) where missing;
 * each lookup is scoped to the layer's root. */
static int open_parent(unpack_state *st, const char *const *comps, unsigned n) {
        char prefix[LAYER_MAX_PATH + 1] = "";
        size_t pl = 0;
        int fd = open_in_root(st, "", O_RDONLY | O_DIRECTORY);
        if (fd < 0)
                FAIL(st, fd, "opening the layer's root: %s", strerror(-fd));
        for (unsigned i = 0; i < n; i++) {
                size_t cl = strlen(comps[i]);
                if (pl + cl + 2 > sizeof prefix) {
                        close(fd);
                        FAIL(st, -ENAMETOOLONG, "path too long");
                }
                if (pl)
                        prefix[pl++] = '/';
                memcpy(prefix + pl, comps[i], cl + 1);
                pl += cl;
                int sub = open_in_root(st, prefix, O_RDONLY | O_DIRECTORY);
                if (sub == -ENOENT) {
                        if (mkdirat(fd, comps[i], 0755) < 0 && errno != EEXIST) {
                                int e = -errno;
                                close(fd);
                                FAIL(st, e, "creating directory '%.200s': %s", prefix, strerror(-e));
                        }
                        sub = open_in_root(st, prefix, O_RDONLY | O_DIRECTORY);
                }
                close(fd);
                if (sub == -ELOOP)
                        FAIL(st, -ELOOP,
                             "'%.200s' is a symlink: the layer writes through it, refused", prefix);
                if (sub < 0)
                        FAIL(st, sub, "'%.200s': %s", prefix, strerror(-sub));
                fd = sub;
        }
        return fd;
}

/* Make room for a new entry: whatever is at name goes, unless both are
 * directories (then the existing one is kept and updated). */
static int clear_name(unpack_state *st, int pfd, const char *name, bool keep_dir, bool *ret_is_dir) {
        struct stat s;
        *ret_is_dir = false;
        if (fstatat(pfd, name, &s, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (S_ISDIR(s.st_mode)) {
                if (keep_dir) {
                        *ret_is_dir = true;
                        return 0;
                }
                int r = rm_rf_at(pfd, name);
                if (r < 0)
                        FAIL(st, r, "replacing directory '%.200s': %s", name, strerror(-r));
                return 0;
        }
        if (unlinkat(pfd, name, 0) < 0)
                FAIL(st, -errno, "replacing '%.200s': %m", name);
        return 0;
}

/* xattrs: only plain user.* ones; never security.*, trusted.* (file caps,
 * SELinux labels, overlay's own) and never user.overlay.*, which would
 * steer the overlay the engine mounts (redirects, opaque, metacopy). */
static int apply_xattrs(unpack_state *st, struct archive_entry *e, int fd, const char *path) {
        const char *name;
        const void *val;
        size_t len;
        archive_entry_xattr_reset(e);
        while (archive_entry_xattr_next(e, &name, &val, &len) == ARCHIVE_OK) {
                if (!name)
                        continue;
                if (startswith(name, "user.overlay.") || startswith(name, "trusted.overlay."))
                        FAIL(st, -EPERM, "'%.200s' carries the overlay xattr %.64s", path, name);
                if (!startswith(name, "user.") || fd < 0 || len > 65536) {
                        st->stripped_xattrs++;
                        continue;
                }
                if (fsetxattr(fd, name, val, len, 0) < 0)
                        st->stripped_xattrs++; /* the file system may refuse user xattrs */
        }
        return 0;
}

static int write_data(unpack_state *st, struct archive *a, int fd, const char *path) {
        const void *buf;
        size_t len;
        la_int64_t off;
        for (;;) {
                int k = archive_read_data_block(a, &buf, &len, &off);
                if (k == ARCHIVE_EOF)
                        break;
                if (k != ARCHIVE_OK)
                        FAIL(st, -EBADMSG, "reading '%.200s': %s", path, archive_error_string(a));
                if (off < 0 || (uint64_t) off + len > LAYER_MAX_FILE)
                        FAIL(st, -EFBIG, "'%.200s' is larger than %llu bytes", path,
                             (unsigned long long) LAYER_MAX_FILE);
                for (size_t done = 0; done < len;) {
                        ssize_t n = pwrite(fd, (const char *) buf + done, len - done,
                                           off + (off_t) done);
                        if (n < 0) {
                                if (errno == EINTR)
                                        continue;
                                FAIL(st, -errno, "writing '%.200s': %m", path);
                        }
                        done += (size_t) n;
                }
                st->bytes += len;
        }
        return 0;
}

static int unpack_entry(unpack_state *st, struct archive *a, struct archive_entry *e) {
        char pbuf[LAYER_MAX_PATH + 1], lbuf[LAYER_MAX_PATH + 1];
        const char *comps[LAYER_MAX_DEPTH], *lcomps[LAYER_MAX_DEPTH];
        unsigned n = 0, ln = 0;
        const char *path = archive_entry_pathname(e);
        int r = split_path(st, path, pbuf, sizeof pbuf, comps, &n, "entry");
        if (r < 0)
                return r;
        if (++st->entries > LAYER_MAX_ENTRIES)
                FAIL(st, -E2BIG, "more than %u entries", LAYER_MAX_ENTRIES);
        la_int64_t uid = archive_entry_uid(e), gid = archive_entry_gid(e);
        if (uid < 0 || uid > 65535 || gid < 0 || gid > 65535)
                FAIL(st, -ERANGE, "'%.200s' is owned by %lld:%lld, outside 0..65535", path,
                     (long long) uid, (long long) gid);
        mode_t mode = archive_entry_perm(e) & 07777;
        mode_t type = archive_entry_filetype(e);
        const char *hl = archive_entry_hardlink(e);

        if (st->rootfd < 0) { /* checking only (the fuzz target) */
                if (hl) {
                        r = split_path(st, hl, lbuf, sizeof lbuf, lcomps, &ln, "hardlink target");
                        if (r < 0)
                                return r;
                }
                if (type == AE_IFCHR || type == AE_IFBLK)
                        FAIL(st, -EPERM, "device node");
                return 0;
        }
        if (n == 0) { /* the layer's root itself */
                if (type != AE_IFDIR)
                        FAIL(st, -EINVAL, "'%.200s' names the root but is not a directory", path);
                if (fchown(st->rootfd, (uid_t) uid, (gid_t) gid) < 0 || fchmod(st->rootfd, mode) < 0)
                        FAIL(st, -errno, "updating the root: %m");
                return 0;
        }
        const char *name = comps[n - 1];
        _cleanup_close_ int pfd = open_parent(st, comps, n - 1);
        if (pfd < 0)
                return pfd;

        /* OCI whiteouts become overlayfs ones */
        if (startswith(name, ".wh.")) {
                if (hl || type == AE_IFDIR)
                        FAIL(st, -EINVAL, "whiteout '%.200s' is a directory or a link", path);
                if (streq(name, ".wh..wh..opq")) {
                        if (fsetxattr(pfd, "user.overlay.opaque", "y", 1, 0) < 0)
                                FAIL(st, -errno, "marking '%.200s' opaque: %m", path);
                        return 0;
                }
                if (startswith(name, ".wh..wh."))
                        return 0; /* other AUFS metadata (.wh..wh.plnk, .wh..wh.aufs): nothing to do */
                const char *real = name + 4;
                if (!*real || streq(real, ".") || streq(real, ".."))
                        FAIL(st, -EINVAL, "whiteout '%.200s' names nothing", path);
                bool isdir;
                if ((r = clear_name(st, pfd, real, false, &isdir)) < 0)
                        return r;
                if (mknodat(pfd, real, S_IFCHR | 0, makedev(0, 0)) < 0)
                        FAIL(st, -errno, "creating the whiteout for '%.200s': %m", path);
                return 0;
        }

        bool isdir = false;
        if ((r = clear_name(st, pfd, name, type == AE_IFDIR && !hl, &isdir)) < 0)
                return r;

        if (hl) {
                if ((r = split_path(st, hl, lbuf, sizeof lbuf, lcomps, &ln, "hardlink target")) < 0)
                        return r;
                if (ln == 0)
                        FAIL(st, -EPERM, "hardlink '%.200s' to the root", path);
                _cleanup_close_ int tfd = open_parent(st, lcomps, ln - 1);
                if (tfd < 0)
                        return tfd;
                struct stat ts;
                if (fstatat(tfd, lcomps[ln - 1], &ts, AT_SYMLINK_NOFOLLOW) < 0)
                        FAIL(st, -errno, "hardlink '%.200s' to '%.200s', which is not in the layer",
                             path, hl);
                if (S_ISDIR(ts.st_mode))
                        FAIL(st, -EPERM, "hardlink '%.200s' to a directory", path);
                if (linkat(tfd, lcomps[ln - 1], pfd, name, 0) < 0)
                        FAIL(st, -errno, "hardlink '%.200s': %m", path);
                return 0;
        }

        switch (type) {
        case AE_IFREG: {
                if (archive_entry_size(e) < 0 || (uint64_t) archive_entry_size(e) > LAYER_MAX_FILE)
                        FAIL(st, -EFBIG, "'%.200s' is larger than %llu bytes", path,
                             (unsigned long long) LAYER_MAX_FILE);
                _cleanup_close_ int fd = openat(
                        pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0)
                        FAIL(st, -errno, "creating '%.200s': %m", path);
                if ((r = write_data(st, a, fd, path)) < 0)
                        return r;
                if (ftruncate(fd, archive_entry_size(e)) < 0)
                        FAIL(st, -errno, "sizing '%.200s': %m", path);
                if ((r = apply_xattrs(st, e, fd, path)) < 0)
                        return r;
                /* chown clears set-id bits: the mode comes after it */
                if (fchown(fd, (uid_t) uid, (gid_t) gid) < 0 || fchmod(fd, mode) < 0)
                        FAIL(st, -errno, "'%.200s': %m", path);
                struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, { archive_entry_mtime(e), 0 } };
                (void) futimens(fd, ts);
                return 0;
        }
        case AE_IFDIR: {
                if (!isdir && mkdirat(pfd, name, 0700) < 0)
                        FAIL(st, -errno, "creating directory '%.200s': %m", path);
                _cleanup_close_ int fd = openat(pfd, name,
                                                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                        FAIL(st, -errno, "opening directory '%.200s': %m", path);
                if ((r = apply_xattrs(st, e, fd, path)) < 0)
                        return r;
                if (fchown(fd, (uid_t) uid, (gid_t) gid) < 0 || fchmod(fd, mode) < 0)
                        FAIL(st, -errno, "'%.200s': %m", path);
                return 0;
        }
        case AE_IFLNK: {
                const char *target = archive_entry_symlink(e);
                if (!target || !*target || strlen(target) >= LAYER_MAX_PATH)
                        FAIL(st, -EINVAL, "symlink '%.200s' has no or an over-long target", path);
                if (symlinkat(target, pfd, name) < 0)
                        FAIL(st, -errno, "creating symlink '%.200s': %m", path);
                if (fchownat(pfd, name, (uid_t) uid, (gid_t) gid, AT_SYMLINK_NOFOLLOW) < 0)
                        FAIL(st, -errno, "'%.200s': %m", path);
                struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, { archive_entry_mtime(e), 0 } };
                (void) utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW);
                return 0;
        }
        case AE_IFIFO:
                if (mknodat(pfd, name, S_IFIFO | (mode & 0777), 0) < 0 ||
                    fchownat(pfd, name, (uid_t) uid, (gid_t) gid, AT_SYMLINK_NOFOLLOW) < 0)
                        FAIL(st, -errno, "creating fifo '%.200s': %m", path);
                return 0;
        case AE_IFCHR:
        case AE_IFBLK:
                FAIL(st, -EPERM, "'%.200s' is a device node (%u:%u): images may not carry devices",
                     path, (unsigned) archive_entry_rdevmajor(e),
                     (unsigned) archive_entry_rdevminor(e));
        default:
                FAIL(st, -EINVAL, "'%.200s' has an unsupported type (0%o)", path, (unsigned) type);
        }
}

/* The tar stream on data_fd into the tree at rootfd (-1: check only). */
int unpack_tar(int rootfd, int data_fd, char *msg, size_t msglen) {
        unpack_state st = { .rootfd = rootfd };
        struct archive *a = archive_read_new();
        if (!a) {
                snprintf(msg, msglen, "out of memory");
                return -ENOMEM;
        }
        archive_read_support_format_tar(a);
        int r = 0;
        if (archive_read_open_fd(a, data_fd, 65536) != ARCHIVE_OK) {
                snprintf(msg, msglen, "not a tar archive: %s", archive_error_string(a));
                archive_read_free(a);
                return -EBADMSG;
        }
        for (;;) {
                struct archive_entry *e;
                int k = archive_read_next_header(a, &e);
                if (k == ARCHIVE_EOF)
                        break;
                if (k != ARCHIVE_OK && k != ARCHIVE_WARN) {
                        snprintf(st.msg, sizeof st.msg, "bad tar stream after %llu entries: %s",
                                 (unsigned long long) st.entries, archive_error_string(a));
                        r = -EBADMSG;
                        break;
                }
                if ((r = unpack_entry(&st, a, e)) < 0)
                        break;
        }
        archive_read_free(a);
        snprintf(msg, msglen, "%s", st.msg);
        return r;
}

/* What the unpacker never needs, refused before the first byte of the tar
 * is parsed: a bug in the tar reader that got control could otherwise
 * signal or trace other processes of the unpack range, open sockets, or
 * reach the kernel's larger attack surface. (It still has the file calls
 * it needs, inside its one layer.) */
static int unpack_seccomp(void) {
        static const int deny[] = {
                SCMP_SYS(ptrace),
                SCMP_SYS(process_vm_readv),
                SCMP_SYS(process_vm_writev),
                SCMP_SYS(kill),
                SCMP_SYS(tkill),
                SCMP_SYS(tgkill),
                SCMP_SYS(pidfd_send_signal),
                SCMP_SYS(pidfd_open),
                SCMP_SYS(pidfd_getfd),
                SCMP_SYS(socket),
                SCMP_SYS(socketpair),
                SCMP_SYS(connect),
                SCMP_SYS(bind),
                SCMP_SYS(mount),
                SCMP_SYS(umount2),
                SCMP_SYS(pivot_root),
                SCMP_SYS(chroot),
                SCMP_SYS(open_tree),
                SCMP_SYS(move_mount),
                SCMP_SYS(fsopen),
                SCMP_SYS(fsmount),
                SCMP_SYS(fsconfig),
                SCMP_SYS(fspick),
                SCMP_SYS(mount_setattr),
                SCMP_SYS(unshare),
                SCMP_SYS(setns),
                SCMP_SYS(clone),
                SCMP_SYS(clone3),
                SCMP_SYS(fork),
                SCMP_SYS(vfork),
                SCMP_SYS(execve),
                SCMP_SYS(execveat),
                SCMP_SYS(bpf),
                SCMP_SYS(keyctl),
                SCMP_SYS(add_key),
                SCMP_SYS(request_key),
                SCMP_SYS(perf_event_open),
                SCMP_SYS(userfaultfd),
                SCMP_SYS(io_uring_setup),
                SCMP_SYS(io_uring_enter),
                SCMP_SYS(io_uring_register),
                SCMP_SYS(open_by_handle_at),
                SCMP_SYS(name_to_handle_at),
                SCMP_SYS(init_module),
                SCMP_SYS(finit_module),
                SCMP_SYS(kexec_load),
                SCMP_SYS(setuid),
                SCMP_SYS(setgid),
                SCMP_SYS(setresuid),
                SCMP_SYS(setresgid),
                SCMP_SYS(setgroups),
                SCMP_SYS(personality),
        };
        scmp_filter_ctx f = seccomp_init(SCMP_ACT_ALLOW);
        if (!f)
                return -ENOMEM;
        int r = 0;
        for (size_t i = 0; r == 0 && i < ELEMENTSOF(deny); i++)
                if (deny[i] >= 0)
                        r = seccomp_rule_add(f, SCMP_ACT_ERRNO(EPERM), deny[i], 0);
        if (r == 0)
                r = seccomp_load(f);
        seccomp_release(f);
        return r;
}

/* Runs in the clone child: never returns. */
_noreturn_ static void child_main(int sock, int data_fd) {
        char msg[600] = "";
        int code = 0, mfd = -1;
        size_t got = 0;
        char b;
        /* 1. the id-mapped mount of the target, once our maps exist */
        ssize_t n = fd_recv_with_fds(sock, &b, 1, &mfd, 1, &got, 0);
        if (n <= 0 || got != 1) {
                code = -EPROTO;
                snprintf(msg, sizeof msg, "no mount from the parent");
                goto out;
        }
        /* 2. root of our namespace: host uid UNPACK_BASE, no more */
        if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0 || setgroups(0, NULL) < 0 ||
            prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
                code = -errno;
                snprintf(msg, sizeof msg, "dropping to the unpack range: %m");
                goto out;
        }
        /* 3. nothing but the layer: a private mount tree, chrooted there */
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 || fchdir(mfd) < 0 ||
            chroot(".") < 0 || chdir("/") < 0) {
                code = -errno;
                snprintf(msg, sizeof msg, "entering the layer: %m");
                goto out;
        }
        close(mfd);
        int sk = unpack_seccomp();
        if (sk < 0) {
                code = sk;
                snprintf(msg, sizeof msg, "loading the unpacker's seccomp filter: %s", strerror(-sk));
                goto out;
        }
        int rootfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0) {
                code = -errno;
                snprintf(msg, sizeof msg, "opening the layer: %m");
                goto out;
        }
        code = unpack_tar(rootfd, data_fd, msg, sizeof msg);
        /* drain what follows the archive's end (padding) so that the parent's
         * digest sees every byte */
        if (code == 0) {
                char buf[65536];
                ssize_t k;
                while ((k = read(data_fd, buf, sizeof buf)) > 0 || (k < 0 && errno == EINTR))
                        ;
        }
out:;
        struct {
                int32_t code;
                char msg[600];
        } rep = { code, "" };
        snprintf(rep.msg, sizeof rep.msg, "%s", msg);
        (void) !write(sock, &rep, sizeof rep);
        _exit(code == 0 ? 0 : 1);
}

/* ------------------------------------------------------------ the parent */

static int write_map(pid_t pid, const char *file) {
        char path[64], line[64];
        snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
        int n = snprintf(line, sizeof line, "0 %u 65536\n", (unsigned) IMAGE_UNPACK_UID_BASE);
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        return write(fd, line, (size_t) n) == n ? 0 : -errno;
}

typedef struct feeder {
        int out;
        EVP_MD_CTX *md;
        uint64_t total;
        bool child_gone;
} feeder;

static int feed(feeder *f, const void *buf, size_t len, hutch_error *err) {
        f->total += len;
        if (f->total > max_expansion)
                return hutch_error_set(
                        err, -EFBIG,
                        "the layer expands to more than %llu bytes (a compression bomb?)",
                        (unsigned long long) max_expansion);
        EVP_DigestUpdate(f->md, buf, len);
        if (f->child_gone)
                return 0;
        for (size_t done = 0; done < len;) {
                ssize_t n = send(f->out, (const char *) buf + done, len - done, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        f->child_gone = true; /* its report says why */
                        return 0;
                }
                done += (size_t) n;
        }
        return 0;
}

static int feed_stream(int fd, feeder *f, hutch_error *err) {
        _cleanup_free_ uint8_t *in = malloc(CHUNK), *out = malloc(CHUNK);
        if (!in || !out)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        ssize_t n = pread(fd, in, 4, 0);
        if (n < 0)
                return hutch_error_set(err, -errno, "reading the layer: %m");
        enum { PLAIN, GZIP, ZSTD } kind = PLAIN;
        if (n >= 2 && in[0] == 0x1f && in[1] == 0x8b)
                kind = GZIP;
        else if (n >= 4 && in[0] == 0x28 && in[1] == 0xb5 && in[2] == 0x2f && in[3] == 0xfd)
                kind = ZSTD;
        off_t pos = 0;
        int r = 0;
        z_stream z = { 0 };
        ZSTD_DStream *zd = NULL;
        if (kind == GZIP && inflateInit2(&z, 15 + 16) != Z_OK)
                return hutch_error_set(err, -ENOMEM, "zlib: out of memory");
        if (kind == ZSTD && !(zd = ZSTD_createDStream()))
                return hutch_error_set(err, -ENOMEM, "zstd: out of memory");
        bool ended = false; /* the compressed stream's (last) frame ended */
        for (;;) {
                n = pread(fd, in, CHUNK, pos);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        r = hutch_error_set(err, -errno, "reading the layer: %m");
                        break;
                }
                if (n == 0)
                        break;
                pos += n;
                if (kind == PLAIN) {
                        if ((r = feed(f, in, (size_t) n, err)) < 0)
                                break;
                        continue;
                }
                if (kind == GZIP) {
                        z.next_in = in;
                        z.avail_in = (uInt) n;
                        while (z.avail_in > 0 && r == 0) {
                                if (ended) { /* another member follows */
                                        inflateReset(&z);
                                        ended = false;
                                }
                                z.next_out = out;
                                z.avail_out = CHUNK;
                                int k = inflate(&z, Z_NO_FLUSH);
                                if (k != Z_OK && k != Z_STREAM_END &&
                                    !(k == Z_BUF_ERROR && z.avail_out == 0)) {
                                        r = hutch_error_set(err, -EBADMSG,
                                                            "the layer's gzip stream is corrupt (%s)",
                                                            z.msg ? z.msg : "error");
                                        break;
                                }
                                if (k == Z_STREAM_END)
                                        ended = true;
                                r = feed(f, out, CHUNK - z.avail_out, err);
                        }
                        if (r < 0)
                                break;
                        continue;
                }
                ZSTD_inBuffer zi = { in, (size_t) n, 0 };
                while (zi.pos < zi.size && r == 0) {
                        ZSTD_outBuffer zo = { out, CHUNK, 0 };
                        size_t k = ZSTD_decompressStream(zd, &zo, &zi);
                        if (ZSTD_isError(k)) {
                                r = hutch_error_set(err, -EBADMSG,
                                                    "the layer's zstd stream is corrupt (%s)",
                                                    ZSTD_getErrorName(k));
                                break;
                        }
                        ended = k == 0;
                        r = feed(f, out, zo.pos, err);
                }
                /* flush what the decoder still holds for this input */
                while (r == 0 && !ended) {
                        ZSTD_outBuffer zo = { out, CHUNK, 0 };
                        ZSTD_inBuffer none = { in, 0, 0 };
                        size_t k = ZSTD_decompressStream(zd, &zo, &none);
                        if (ZSTD_isError(k)) {
                                r = hutch_error_set(err, -EBADMSG,
                                                    "the layer's zstd stream is corrupt (%s)",
                                                    ZSTD_getErrorName(k));
                                break;
                        }
                        ended = k == 0;
                        if (zo.pos == 0)
                                break;
                        r = feed(f, out, zo.pos, err);
                }
                if (r < 0)
                        break;
        }
        if (r == 0 && kind != PLAIN && !ended)
                r = hutch_error_set(err, -EBADMSG, "the layer's %s stream is truncated",
                                    kind == GZIP ? "gzip" : "zstd");
        if (kind == GZIP)
                inflateEnd(&z);
        ZSTD_freeDStream(zd);
        return r;
}

int layer_verify(int fd, const char *diff_id, hutch_error *err) {
        if (!layer_digest_valid(diff_id))
                return hutch_error_set(err, -EINVAL, "invalid layer digest '%.80s'", diff_id ? diff_id : "");
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        /* hashed, bounded, sent nowhere */
        feeder f = { .out = -1, .md = md, .child_gone = true };
        int r = feed_stream(fd, &f, err);
        char hex[65];
        if (r >= 0 && (r = sha256_hex_final(md, hex)) < 0)
                hutch_error_set(err, r, "sha256 failed");
        if (r >= 0 && !streq(hex, diff_id + 7))
                r = hutch_error_set(err, -EBADMSG,
                                    "layer %s: the blob uncompresses to sha256:%s: it is not the layer the "
                                    "store holds, refused",
                                    diff_id, hex);
        EVP_MD_CTX_free(md);
        return r < 0 ? r : 0;
}

static int store_dir(const char *data_dir, char *buf, size_t n, hutch_error *err) {
        snprintf(buf, n, "%s/layers", data_dir);
        int r = mkdir_p(buf, 0700);
        /* setuid-root files of an image live here: no host user may reach them */
        if (r >= 0 && chmod(buf, 0700) < 0)
                r = -errno;
        snprintf(buf, n, "%s/layers/sha256", data_dir);
        if (r >= 0)
                r = mkdir_p(buf, 0700);
        return r < 0 ? hutch_error_set(err, r, "creating %s: %s", buf, strerror(-r)) : 0;
}

int layer_unpack(const char *data_dir, int fd, const char *blob_digest, const char *diff_id,
                 uint64_t blob_size, hutch_error *err) {
        char have[PATH_MAX];
        if (!layer_digest_valid(diff_id))
                return hutch_error_set(err, -EINVAL, "invalid layer digest '%.80s'",
                                       diff_id ? diff_id : "");
        if (blob_digest && !layer_digest_valid(blob_digest))
                return hutch_error_set(err, -EINVAL, "invalid blob digest '%.80s'", blob_digest);
        int r = layer_path(data_dir, diff_id, have, sizeof have);
        if (r < 0)
                return hutch_error_set(err, r, "layer path: %s", strerror(-r));
        if (have[0])
                return 1;
        char sdir[PATH_MAX];
        if ((r = store_dir(data_dir, sdir, sizeof sdir, err)) < 0)
                return r;

        /* 1. the compressed bytes are the manifest's before anything parses them */
        if (blob_digest) {
                char hex[65];
                uint64_t size = 0;
                r = image_hash_fd(fd, LAYER_MAX_EXPANSION, hex, &size);
                if (r < 0)
                        return hutch_error_set(err, r, "reading blob %s: %s", blob_digest,
                                               strerror(-r));
                if (blob_size != UINT64_MAX && size != blob_size)
                        return hutch_error_set(err, -EBADMSG,
                                               "blob %s is %llu bytes, the manifest says %llu",
                                               blob_digest, (unsigned long long) size,
                                               (unsigned long long) blob_size);
                if (!streq(hex, blob_digest + 7))
                        return hutch_error_set(err, -EBADMSG, "blob %s has digest sha256:%s: refused",
                                               blob_digest, hex);
        }

        _cleanup_close_ int sfd = open(sdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (sfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", sdir);
        char tmp[128];
        unsigned rnd = 0;
        (void) !getrandom(&rnd, sizeof rnd, 0);
        snprintf(tmp, sizeof tmp, ".tmp-%.64s-%d-%08x", diff_id + 7, (int) getpid(), rnd);
        if (mkdirat(sfd, tmp, 0755) < 0)
                return hutch_error_set(err, -errno, "creating %s/%s: %m", sdir, tmp);

        _cleanup_close_pair_ int ctl[2] = { -1, -1 }, data[2] = { -1, -1 };
        _cleanup_close_ int userns = -1, mnt = -1, lfd = -1;
        pid_t pid = -1;
        EVP_MD_CTX *md = NULL;
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, data) < 0) {
                r = hutch_error_set(err, -errno, "socketpair: %m");
                goto fail;
        }
        pid_t parent = getpid();
        pid = (pid_t) syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD, NULL, NULL, NULL,
                              NULL);
        if (pid < 0) {
                r = hutch_error_set(err, -errno, "creating the unpack namespace: %m");
                goto fail;
        }
        if (pid == 0) {
                /* only the two sockets survive: no descriptor of the caller's */
                int s = ctl[1], d = data[1];
                /* dies with the import: never an unpacker writing on alone */
                if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
                        _exit(1);
                if (dup2(s, 3) < 0 || dup2(d, 4) < 0)
                        _exit(1);
                syscall(SYS_close_range, 5, ~0u, 0);
                signal(SIGPIPE, SIG_DFL);
                child_main(3, 4);
        }
        ctl[1] = safe_close(ctl[1]);
        data[1] = safe_close(data[1]);
        char p[64];
        if ((r = write_map(pid, "uid_map")) < 0 || (r = write_map(pid, "gid_map")) < 0) {
                hutch_error_set(err, r, "writing the unpack id map: %s", strerror(-r));
                goto fail;
        }
        snprintf(p, sizeof p, "/proc/%d/ns/user", (int) pid);
        userns = open(p, O_RDONLY | O_CLOEXEC);
        mnt = userns < 0 ? -1 : sys_open_tree(sfd, tmp, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (mnt < 0) {
                r = hutch_error_set(err, -errno, "preparing the unpack mount: %m");
                goto fail;
        }
        struct mount_attr attr = { .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
                                   .userns_fd = (uint64_t) userns };
        if (sys_mount_setattr(mnt, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) {
                r = hutch_error_set(
                        err, -errno,
                        "id-mapping the unpack mount (does %s support id-mapped mounts?): %m", sdir);
                goto fail;
        }
        char one = 1;
        if ((r = fd_send_with_fds(ctl[0], &one, 1, &mnt, 1)) < 0) {
                hutch_error_set(err, r, "starting the unpacker: %s", strerror(-r));
                goto fail;
        }
        mnt = safe_close(mnt);

        /* 2. decompress, hash, bound, feed */
        md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto fail;
        }
        feeder f = { .out = data[0], .md = md };
        r = feed_stream(fd, &f, err);
        data[0] = safe_close(data[0]);
        struct {
                int32_t code;
                char msg[600];
        } rep = { -EPROTO, "the unpacker died" };
        if (r < 0) {
                kill(pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
                pid = -1;
                goto fail;
        }
        ssize_t k = fd_read_full(ctl[0], &rep, sizeof rep);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
        pid = -1;
        if (k != (ssize_t) sizeof rep || rep.code != 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
                rep.msg[sizeof rep.msg - 1] = 0;
                r = hutch_error_set(err, rep.code < 0 ? rep.code : -EPROTO, "layer %s: %s", diff_id,
                                    rep.msg);
                goto fail;
        }
        char hex[65];
        if ((r = sha256_hex_final(md, hex)) < 0) {
                hutch_error_set(err, r, "sha256 failed");
                goto fail;
        }
        if (!streq(hex, diff_id + 7)) {
                r = hutch_error_set(err, -EBADMSG,
                                    "layer %s: its uncompressed tar has digest sha256:%s: the config's "
                                    "rootfs.diff_ids lies, refused",
                                    diff_id, hex);
                goto fail;
        }
        EVP_MD_CTX_free(md);
        md = NULL;

        /* 3. complete: under its name, then the marker */
        lfd = lock_file_take(sfd, ".lock");
        if (lfd < 0) {
                r = hutch_error_set(err, lfd, "locking %s/.lock: %s", sdir, strerror(-lfd));
                goto fail;
        }
        if (renameat(sfd, tmp, sfd, diff_id + 7) < 0) {
                if (errno != EEXIST && errno != ENOTEMPTY) {
                        r = hutch_error_set(err, -errno, "renaming %s/%s: %m", sdir, tmp);
                        goto fail;
                }
                (void) rm_rf_at(sfd, tmp); /* another install had it renamed first: complete */
        }
        if ((r = layer_mark_done(sfd, diff_id + 7)) < 0) {
                hutch_error_set(err, r, "marking %s done: %s", diff_id, strerror(-r));
                return r;
        }
        return 0;
fail:
        if (pid > 0) {
                kill(pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
        }
        EVP_MD_CTX_free(md);
        (void) rm_rf_at(sfd, tmp);
        return r;
}
