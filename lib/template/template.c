/* SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>

#include "sandbox/initproto.h"
#include "template/interp-template.h"
#include "template/template.h"
#include "template/template-internal.h"
#include "image/layer.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"

/* init/gvisor-compat.so, embedded by the build (init/embed.sh) */
extern const unsigned char hutch_gvisor_compat_start[];
extern const unsigned char hutch_gvisor_compat_end[];

#define HOST_TEMPLATE_VERSION "host-9"
#define USER_UID 1000

/* Host /etc entries a sandbox needs to behave like the host's userland:
 * loader cache, alternatives links, PAM and shell profiles, TLS config and
 * trust store. No accounts, no secrets, no host identity (machine-id,
 * hostname, ssh keys, ssl/private are never copied). */
static const char *const host_etc_copy[] = {
        "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
        "protocols", "services", "rpc", "ethertypes", "networks", "mime.types", "profile",
        "profile.d", "bash.bashrc", "inputrc", "shells", "debian_version", "os-release",
        "lsb-release", "issue", "pam.d", "pam.conf", "security", "login.defs", "ssl",
        "ca-certificates", "ca-certificates.conf", "gai.conf", "host.conf", "magic",
        "magic.mime", "python3", "perl", "xattr.conf", "locale.alias", "sudo.conf",
        "bindresvport.blacklist", "manpath.config", "skel", "vim", "nanorc",
        "ld-musl-x86_64.path", "ld-musl-x86_64.d",
        /* Debian keeps these packages' configuration in /etc: matplotlib
         * (the code interpreter's charts), R, the JDK, fontconfig */
        "matplotlibrc", "R", "java-17-openjdk", "fonts", NULL,
};
/* Inside the copied trees: keys and password history. (Files that may hold
 * an operator's credentials — environment, npmrc, pip.conf, gitconfig —
 * are not in the list above at all.) */
static const char *const never_copy[] = { "ssl/private", "security/opasswd", NULL };

/* The host's /etc as the template copies it; tests point it elsewhere. */
static const char *host_etc = "/etc";

static const char *const top_links[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32", NULL };

int template_validate_name(const char *name) {
        size_t n = name ? strlen(name) : 0;
        if (n == 0 || n > 63)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                char c = name[i];
                bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                          (i > 0 && (c == '-' || c == '_' || c == '.'));
                if (!ok)
                        return -EINVAL;
        }
        return 0;
}

int template_write_at(int dfd, const char *name, const char *content, mode_t mode, uid_t uid, gid_t gid);
int template_mkdir_at(int dfd, const char *name, mode_t mode, uid_t uid, gid_t gid);
#define write_at template_write_at
#define mkdir_at template_mkdir_at

int template_write_at(int dfd, const char *name, const char *content, mode_t mode, uid_t uid, gid_t gid) {
        _cleanup_close_ int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;
        int r = fd_write_all(fd, content, strlen(content));
        if (r < 0)
                return r;
        if (fchmod(fd, mode) < 0 || fchown(fd, uid, gid) < 0)
                return -errno;
        return 0;
}

int template_mkdir_at(int dfd, const char *name, mode_t mode, uid_t uid, gid_t gid) {
        if (mkdirat(dfd, name, mode) < 0 && errno != EEXIST)
                return -errno;
        if (fchmodat(dfd, name, mode, 0) < 0 || fchownat(dfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
                return -errno;
        return 0;
}

/* Copy a host tree (files, dirs, symlinks; ownership and modes kept). */
static int copy_tree(int sfd, const char *sname, int dfd, const char *dname, const char *relpath,
                     unsigned depth) {
        struct stat st;
        if (depth > 16)
                return 0;
        for (const char *const *n = never_copy; *n; n++)
                if (streq(relpath, *n))
                        return 0;
        if (fstatat(sfd, sname, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (S_ISLNK(st.st_mode)) {
                char target[PATH_MAX];
                ssize_t n = readlinkat(sfd, sname, target, sizeof target - 1);
                if (n < 0)
                        return -errno;
                target[n] = 0;
                if (symlinkat(target, dfd, dname) < 0 && errno != EEXIST)
                        return -errno;
                (void) fchownat(dfd, dname, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
                return 0;
        }
        /* Only what every host user may read: a root-only file (a proxy
         * password in profile.d, a key next to the certificates) would
         * become readable by sandbox root, which `user` reaches with sudo. */
        if (S_ISREG(st.st_mode) && !(st.st_mode & S_IROTH))
                return 0;
        if (S_ISDIR(st.st_mode) && (st.st_mode & (S_IROTH | S_IXOTH)) != (S_IROTH | S_IXOTH))
                return 0;
        if (S_ISREG(st.st_mode)) {
                _cleanup_close_ int in = openat(sfd, sname, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (in < 0)
                        return errno == EACCES ? 0 : -errno;
                _cleanup_close_ int out = openat(dfd, dname, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                                                 st.st_mode & 07777);
                if (out < 0)
                        return -errno;
                char buf[65536];
                for (;;) {
                        ssize_t k = read(in, buf, sizeof buf);
                        if (k < 0)
                                return -errno;
                        if (k == 0)
                                break;
                        int r = fd_write_all(out, buf, (size_t) k);
                        if (r < 0)
                                return r;
                }
                if (fchown(out, st.st_uid, st.st_gid) < 0 || fchmod(out, st.st_mode & 07777) < 0)
                        return -errno;
                return 0;
        }
        if (!S_ISDIR(st.st_mode))
                return 0; /* no devices, sockets or fifos */
        int r = mkdir_at(dfd, dname, st.st_mode & 07777, st.st_uid, st.st_gid);
        if (r < 0)
                return r;
        _cleanup_close_ int sub = openat(sfd, sname, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        _cleanup_close_ int dsub = openat(dfd, dname, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (sub < 0 || dsub < 0)
                return -errno;
        int dup_fd = dup(sub);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return -errno;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
                if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                char rel[PATH_MAX];
                snprintf(rel, sizeof rel, "%s/%s", relpath, de->d_name);
                r = copy_tree(sub, de->d_name, dsub, de->d_name, rel, depth + 1);
                if (r < 0)
                        break;
        }
        closedir(d);
        return r;
}

static const char etc_passwd[] = "root:x:0:0:root:/root:/bin/bash\n"
                                 "user:x:1000:1000:user:/home/user:/bin/bash\n"
                                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
static const char etc_group[] = "root:x:0:\n"
                                "tty:x:5:\n"
                                "sudo:x:27:user\n"
                                "shadow:x:42:\n"
                                "users:x:100:user\n"
                                "user:x:1000:\n"
                                "nogroup:x:65534:\n";
static const char etc_shadow[] = "root:*:19000:0:99999:7:::\n"
                                 "user:*:19000:0:99999:7:::\n"
                                 "nobody:*:19000:0:99999:7:::\n";
static const char etc_hosts[] = "127.0.0.1\tlocalhost\n"
                                "::1\tlocalhost ip6-localhost ip6-loopback\n"
                                "127.0.1.1\thutch\n";
static const char etc_nsswitch[] = "passwd:         files\n"
                                   "group:          files\n"
                                   "shadow:         files\n"
                                   "hosts:          files dns\n"
                                   "networks:       files\n"
                                   "protocols:      files\n"
                                   "services:       files\n"
                                   "ethers:         files\n"
                                   "rpc:            files\n";
static const char etc_resolv[] = "# hutch: names are resolved by the egress proxy when the sandbox has network access\n"
                                 "nameserver 127.0.0.1\n"
                                 "options ndots:0\n";
static const char etc_sudoers[] = "Defaults\tenv_reset\n"
                                  "Defaults\tsecure_path=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n"
                                  "root\tALL=(ALL:ALL) ALL\n"
                                  "user\tALL=(ALL:ALL) NOPASSWD: ALL\n";

static int build_host_rootfs(int rfd) {
        int r;
        static const struct {
                const char *name;
                mode_t mode;
        } dirs[] = {
                { "usr", 0755 }, { "etc", 0755 },  { "home", 0755 },  { "root", 0700 },    { "tmp", 01777 },
                { "var", 0755 }, { "var/tmp", 01777 }, { "var/log", 0755 }, { "var/cache", 0755 },
                { "var/lib", 0755 }, { "run", 0755 }, { "opt", 0755 }, { "mnt", 0755 }, { "srv", 0755 },
                { "media", 0755 }, { "proc", 0555 }, { "sys", 0555 }, { "dev", 0755 }, { "etc/sudoers.d", 0750 },
                /* mount points of the gvisor backend's spec (its init and
                 * writable layer): runsc's gofer would otherwise create them
                 * in the template itself */
                { "run/hutch", 0755 }, { &INITPROTO_GVISOR_LAYER[1], 0755 },
        };
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
                r = mkdir_at(rfd, dirs[i].name, dirs[i].mode, 0, 0);
                if (r < 0)
                        return r;
        }
        for (const char *const *l = top_links; *l; l++) {
                char host[64], target[PATH_MAX];
                snprintf(host, sizeof host, "/%s", *l);
                ssize_t n = readlink(host, target, sizeof target - 1);
                if (n > 0) {
                        target[n] = 0;
                        if (symlinkat(target, rfd, *l) < 0 && errno != EEXIST)
                                return -errno;
                        continue;
                }
                struct stat st;
                if (stat(host, &st) == 0 && S_ISDIR(st.st_mode)) {
                        r = mkdir_at(rfd, *l, 0755, 0, 0); /* a bind mount point */
                        if (r < 0)
                                return r;
                }
        }
        if ((r = write_at(rfd, &INITPROTO_GVISOR_INIT[1], "", 0444, 0, 0)) < 0)
                return r;
        /* gvisor sandboxes preload it (init/gvisor-compat.c); ns ones ignore it */
        {
                _cleanup_close_ int fd = openat(rfd, &INITPROTO_GVISOR_COMPAT[1],
                                                O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
                if (fd < 0)
                        return -errno;
                r = fd_write_all(fd, hutch_gvisor_compat_start,
                                 (size_t) (hutch_gvisor_compat_end - hutch_gvisor_compat_start));
                if (r < 0)
                        return r;
        }

        _cleanup_close_ int efd = openat(rfd, "etc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        _cleanup_close_ int etc = open(host_etc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (efd < 0 || etc < 0)
                return -errno;
        for (const char *const *e = host_etc_copy; *e; e++) {
                r = copy_tree(etc, *e, efd, *e, *e, 0);
                if (r < 0)
                        return r;
        }
        if ((r = write_at(efd, "passwd", etc_passwd, 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "group", etc_group, 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "shadow", etc_shadow, 0640, 0, 42)) < 0 ||
            (r = write_at(efd, "gshadow", "", 0640, 0, 42)) < 0 ||
            (r = write_at(efd, "hosts", etc_hosts, 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "hostname", "hutch\n", 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "resolv.conf", etc_resolv, 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "nsswitch.conf", etc_nsswitch, 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "sudoers", etc_sudoers, 0440, 0, 0)) < 0 ||
            (r = write_at(efd, "fstab", "", 0644, 0, 0)) < 0 ||
            (r = write_at(efd, "machine-id", "", 0444, 0, 0)) < 0)
                return r;
        (void) unlinkat(efd, "mtab", 0);
        if (symlinkat("../proc/self/mounts", efd, "mtab") < 0)
                return -errno;
        /* Make sure a CA bundle exists at the conventional path even on a host without one. */
        if (mkdir_at(efd, "ssl", 0755, 0, 0) < 0 || mkdir_at(efd, "ssl/certs", 0755, 0, 0) < 0)
                return -errno;
        struct stat st;
        if (fstatat(efd, "ssl/certs/ca-certificates.crt", &st, 0) < 0 &&
            (r = write_at(efd, "ssl/certs/ca-certificates.crt", "", 0644, 0, 0)) < 0)
                return r;

        /* /home/user from /etc/skel, owned by the sandbox user. */
        r = mkdir_at(rfd, "home/user", 0750, USER_UID, USER_UID);
        if (r < 0)
                return r;
        _cleanup_close_ int hfd = openat(rfd, "home/user", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (hfd < 0)
                return -errno;
        static const char *const skel[] = { ".bashrc", ".profile", ".bash_logout", NULL };
        for (const char *const *s = skel; *s; s++) {
                char p[64];
                snprintf(p, sizeof p, "skel/%s", *s);
                r = copy_tree(etc, p, hfd, *s, p, 0);
                if (r < 0)
                        return r;
                (void) fchownat(hfd, *s, USER_UID, USER_UID, AT_SYMLINK_NOFOLLOW);
        }
        return 0;
}

/* ------------------------------------------------------------ the stamp */

void template_set_host_etc(const char *dir) {
        host_etc = dir && *dir ? dir : "/etc";
}

typedef struct strbuf {
        char *p;
        size_t len, cap;
        bool oom;
} strbuf;

static void sb_addf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_addf(strbuf *b, const char *fmt, ...) {
        if (b->oom)
                return;
        for (;;) {
                va_list ap;
                va_start(ap, fmt);
                int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
                va_end(ap);
                if (n < 0) {
                        b->oom = true;
                        return;
                }
                if (b->p && b->len + (size_t) n < b->cap) {
                        b->len += (size_t) n;
                        return;
                }
                size_t cap = b->cap ? b->cap : 4096;
                while (cap <= b->len + (size_t) n)
                        cap *= 2;
                char *q = realloc(b->p, cap);
                if (!q) {
                        b->oom = true;
                        return;
                }
                b->p = q;
                b->cap = cap;
        }
}

/* What an input looks like: type, inode, change and modification times,
 * size. A file replaced (as package managers do: write, then rename), an
 * entry added to or removed from a directory, a changed mode or owner all
 * change it. */
static void input_sig(const struct stat *st, char *buf, size_t n) {
        char type = S_ISDIR(st->st_mode) ? 'd' : S_ISLNK(st->st_mode) ? 'l' : S_ISREG(st->st_mode) ? 'f' : 'o';
        snprintf(buf, n, "%c:%llu:%lld.%09ld:%lld.%09ld:%lld", type, (unsigned long long) st->st_ino,
                 (long long) st->st_mtim.tv_sec, st->st_mtim.tv_nsec, (long long) st->st_ctim.tv_sec,
                 st->st_ctim.tv_nsec, (long long) st->st_size);
}

static bool never_copied(const char *rel) {
        for (const char *const *n = never_copy; *n; n++)
                if (streq(rel, *n))
                        return true;
        return false;
}

/* One line per input "<path>\t<sig>": the entry itself when top (an entry
 * of host_etc_copy or a file of skel), and every directory below it that
 * copy_tree would enter. Files below a directory are not listed: adding,
 * removing or replacing one changes its directory's times. */
static void manifest_walk(int dfd, const char *name, const char *rel, unsigned depth, bool top, strbuf *out) {
        struct stat st;
        char sig[128];
        if (depth > 16 || never_copied(rel))
                return;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (top)
                        sb_addf(out, "%s\t-\n", rel);
                return;
        }
        if (!top && !S_ISDIR(st.st_mode))
                return;
        /* names with a tab or newline are not listed (their directory is) */
        if (strpbrk(rel, "\t\n"))
                return;
        input_sig(&st, sig, sizeof sig);
        sb_addf(out, "%s\t%s\n", rel, sig);
        /* copy_tree enters only directories every host user may read */
        if (!S_ISDIR(st.st_mode) || (st.st_mode & (S_IROTH | S_IXOTH)) != (S_IROTH | S_IXOTH))
                return;
        _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        int dup_fd = fd >= 0 ? dup(fd) : -1;
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                sb_addf(out, "%s/\t?\n", rel); /* unreadable now: a rebuild next time */
                return;
        }
        for (struct dirent *de; (de = readdir(d));) {
                if (streq(de->d_name, ".") || streq(de->d_name, "..") ||
                    (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
                        continue;
                char sub[PATH_MAX];
                if ((size_t) snprintf(sub, sizeof sub, "%s/%s", rel, de->d_name) >= sizeof sub)
                        continue;
                manifest_walk(fd, de->d_name, sub, depth + 1, false, out);
        }
        closedir(d);
}

/* The host template's stamp: what it was built from. Only inputs the build
 * really copies count (an earlier stamp held /etc's own mtime, so any file
 * written anywhere in /etc, such as another tenant's package install,
 * rebuilt it). Line 1 is the builder's version; then the host's top-level
 * links (their targets are mirrored) and the /etc manifest. */
int template_host_stamp(char **ret) {
        strbuf b = { 0 };
        sb_addf(&b, "%s\n", HOST_TEMPLATE_VERSION);
        for (const char *const *l = top_links; *l; l++) {
                char host[64], sig[128];
                struct stat st;
                snprintf(host, sizeof host, "/%s", *l);
                if (lstat(host, &st) < 0)
                        sb_addf(&b, "%s\t-\n", host);
                else {
                        input_sig(&st, sig, sizeof sig);
                        sb_addf(&b, "%s\t%s\n", host, sig);
                }
        }
        _cleanup_close_ int etc = open(host_etc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (etc < 0) {
                free(b.p);
                return -errno;
        }
        for (const char *const *e = host_etc_copy; *e; e++)
                manifest_walk(etc, *e, *e, 0, true, &b);
        /* skel's files are copied into /home/user: in-place edits count */
        static const char *const skel[] = { "skel/.bashrc", "skel/.profile", "skel/.bash_logout", NULL };
        for (const char *const *k = skel; *k; k++)
                manifest_walk(etc, *k, *k, 0, true, &b);
        if (b.oom) {
                free(b.p);
                return -ENOMEM;
        }
        *ret = b.p;
        return 0;
}

/* Whether a stamp still describes the host: each listed input is stat()ed
 * again and compared (no directory is read, so the check costs one lstat
 * per line, about 70 on Debian 12, on every create). */
bool template_host_stamp_current(const char *stamp) {
        const char *nl = strchr(stamp, '\n');
        if (!nl || (size_t) (nl - stamp) != strlen(HOST_TEMPLATE_VERSION) ||
            strncmp(stamp, HOST_TEMPLATE_VERSION, (size_t) (nl - stamp)) != 0)
                return false;
        _cleanup_close_ int etc = open(host_etc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (etc < 0)
                return false;
        for (const char *line = nl + 1; *line;) {
                const char *end = strchr(line, '\n'), *tab = memchr(line, '\t', end ? (size_t) (end - line) : 0);
                if (!end || !tab || tab == line)
                        return false;
                char path[PATH_MAX], want[160], sig[128] = "-";
                size_t pl = (size_t) (tab - line), sl = (size_t) (end - tab - 1);
                if (pl >= sizeof path || sl >= sizeof want)
                        return false;
                memcpy(path, line, pl);
                path[pl] = 0;
                memcpy(want, tab + 1, sl);
                want[sl] = 0;
                struct stat st;
                if (streq(want, "?"))
                        return false; /* a directory the build could not read */
                if ((path[0] == '/' ? lstat(path, &st) : fstatat(etc, path, &st, AT_SYMLINK_NOFOLLOW)) == 0)
                        input_sig(&st, sig, sizeof sig);
                if (!streq(sig, want))
                        return false;
                line = end + 1;
        }
        return true;
}

static int template_load(const char *tdir, const char *name, hutch_template **ret, hutch_error *err) {
        char rootfs[PATH_MAX], real[PATH_MAX];
        snprintf(rootfs, sizeof rootfs, "%s/rootfs", tdir);
        if (!realpath(rootfs, real))
                return hutch_error_set(err, -errno, "template '%s': %s: %m", name, rootfs);
        hutch_template *t = calloc(1, sizeof *t);
        if (!t)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        t->lock_fd = -1;
        t->uid = t->gid = -1;
        t->name = strdup(name);
        t->rootfs = strdup(real);
        t->kind = strdup("host");
        if (!t->name || !t->rootfs || !t->kind) {
                template_free(t);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        if (streq(name, "host")) {
                t->binds[t->n_binds++] = "/usr";
                for (const char *const *l = top_links; *l; l++) {
                        char host[64];
                        struct stat st;
                        snprintf(host, sizeof host, "/%s", *l);
                        if (lstat(host, &st) == 0 && S_ISDIR(st.st_mode) && t->n_binds < TEMPLATE_MAX_BINDS) {
                                static char bind_paths[8][16];
                                snprintf(bind_paths[t->n_binds], sizeof bind_paths[0], "/%s", *l);
                                t->binds[t->n_binds] = bind_paths[t->n_binds];
                                t->n_binds++;
                        }
                }
        }
        *ret = t;
        return 0;
}

/* -------------------------------------------------------------- versions */

/* A version is DATA_DIR/templates/host.<ns since the epoch, at its build>;
 * the symlink `host` names the current one. */
static bool version_name_valid(const char *n, int64_t *ret_ns) {
        if (strncmp(n, "host.", 5) != 0 || !n[5] || strlen(n) > 40)
                return false;
        int64_t v = 0;
        for (const char *p = n + 5; *p; p++) {
                if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
                        return false;
                v = v * 10 + (*p - '0');
        }
        if (ret_ns)
                *ret_ns = v;
        return true;
}

static int current_version(int rootfd, char *buf, size_t n) {
        ssize_t k = readlinkat(rootfd, "host", buf, n - 1);
        if (k < 0)
                return -errno;
        buf[k] = 0;
        return version_name_valid(buf, NULL) ? 0 : -EINVAL;
}

/* The version's directory, flocked shared: a sandbox is being made from it,
 * and template_gc() skips a version it cannot lock exclusively. GC renames a
 * version away before removing it, so a directory that is not at its name
 * any more once the lock is ours was removed meanwhile: -ESTALE. */
int template_version_open_shared(int rootfd, const char *vname) {
        _cleanup_close_ int fd = openat(rootfd, vname, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        while (flock(fd, LOCK_SH) < 0)
                if (errno != EINTR)
                        return -errno;
        struct stat a, b;
        if (fstat(fd, &a) < 0)
                return -errno;
        if (fstatat(rootfd, vname, &b, AT_SYMLINK_NOFOLLOW) < 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev)
                return -ESTALE;
        return TAKE_FD(fd);
}

static bool version_current(int vfd) {
        _cleanup_free_ char *have = NULL;
        return read_file_at(vfd, "template.stamp", 1 << 20, &have) >= 0 && template_host_stamp_current(have);
}

/* The current version, up to date with the host, locked shared (its fd to
 * *ret_vfd, its name to vname); built first when there is none or the host
 * changed an input. */
static int host_template_ensure(const char *tpl_root, char *vname, size_t vlen, int *ret_vfd, bool *ret_rebuilt,
                                hutch_error *err) {
        int r = mkdir_p(tpl_root, 0755);
        if (r < 0)
                return hutch_error_set(err, r, "creating %s: %s", tpl_root, strerror(-r));
        _cleanup_close_ int rootfd = open(tpl_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", tpl_root);
        /* without the lock: the common case costs a readlink, a flock and
         * the stamp's lstats */
        for (unsigned attempt = 0; attempt < 8; attempt++) {
                if (current_version(rootfd, vname, vlen) < 0)
                        break;
                int vfd = template_version_open_shared(rootfd, vname);
                if (vfd == -ESTALE || vfd == -ENOENT)
                        continue; /* switched and removed under us: read the link again */
                if (vfd < 0)
                        break;
                if (version_current(vfd)) {
                        *ret_vfd = vfd;
                        *ret_rebuilt = false;
                        return 0;
                }
                close(vfd);
                break;
        }

        _cleanup_close_ int lfd = lock_file_take(rootfd, ".lock");
        if (lfd < 0)
                return hutch_error_set(err, lfd, "locking %s/.lock: %s", tpl_root, strerror(-lfd));
        /* built by someone else meanwhile? (no GC runs while we hold the lock) */
        if (current_version(rootfd, vname, vlen) == 0) {
                int vfd = template_version_open_shared(rootfd, vname);
                if (vfd >= 0 && version_current(vfd)) {
                        *ret_vfd = vfd;
                        *ret_rebuilt = false;
                        return 0;
                }
                safe_close(vfd);
        }

        _cleanup_free_ char *stamp = NULL;
        r = template_host_stamp(&stamp);
        if (r < 0)
                return hutch_error_set(err, r, "reading the host's %s: %s", host_etc, strerror(-r));
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(vname, vlen, "host.%lld%09ld", (long long) ts.tv_sec, ts.tv_nsec);
        char vdir[PATH_MAX];
        snprintf(vdir, sizeof vdir, "%s/%s", tpl_root, vname);
        if (mkdir(vdir, 0755) < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", vdir);
        _cleanup_close_ int vfd = -1, rfd = -1;
        vfd = open(vdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (vfd < 0) {
                r = -errno;
                goto fail;
        }
        r = mkdir_at(vfd, "rootfs", 0755, 0, 0);
        rfd = r < 0 ? -1 : openat(vfd, "rootfs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rfd < 0) {
                r = r < 0 ? r : -errno;
                goto fail;
        }
        r = build_host_rootfs(rfd);
        if (r < 0)
                goto fail;
        /* the stamp was taken before the copy: an input changed during it
         * fails the next check and rebuilds, never the other way round */
        r = write_at(vfd, "template.stamp", stamp, 0644, 0, 0);
        if (r < 0)
                goto fail;
        /* Switch the name atomically: symlink to a temp name, rename over. */
        (void) unlinkat(rootfd, ".host.new", 0);
        if (symlinkat(vname, rootfd, ".host.new") < 0 || renameat(rootfd, ".host.new", rootfd, "host") < 0) {
                r = -errno;
                goto fail;
        }
        r = template_version_open_shared(rootfd, vname);
        if (r < 0)
                return hutch_error_set(err, r, "opening %s: %s", vdir, strerror(-r));
        *ret_vfd = r;
        *ret_rebuilt = true;
        return 0;
fail:
        (void) rm_rf_at(AT_FDCWD, vdir);
        return hutch_error_set(err, r, "building the host template in %s: %s", vdir, strerror(-r));
}

bool template_base_built(const char *data_dir) {
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/templates/base", data_dir);
        return lstat(p, &st) == 0 && S_ISLNK(st.st_mode);
}

/* The version a reserved name's link points at: only a link is a built one */
static bool built_version(const char *data_dir, const char *name, char *buf, size_t n) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/templates/%s", data_dir, name);
        ssize_t k = n > 1 ? readlink(p, buf, n - 1) : -1;
        if (n > 0)
                buf[k > 0 ? k : 0] = 0;
        return k > 0;
}

bool template_base_version(const char *data_dir, char *buf, size_t n) {
        return built_version(data_dir, "base", buf, n);
}

bool template_interp_version(const char *data_dir, char *buf, size_t n) {
        return built_version(data_dir, "code-interpreter", buf, n);
}

const char *template_base_target(const char *data_dir) {
        return template_base_built(data_dir) ? "base" : "host";
}

bool template_names_host(const char *data_dir, const char *name) {
        return streq(name, "host") || (streq(name, "base") && !template_base_built(data_dir));
}

int template_resolve(const char *data_dir, const char *name, hutch_template **ret, hutch_error *err) {
        if (!name || !*name || streq(name, "base"))
                name = template_base_target(data_dir);
        if (template_is_interp(name))
                return template_interp_resolve(data_dir, name, ret, err); /* interp-template.c */
        if (template_validate_name(name) < 0)
                return hutch_error_set(err, -EINVAL, "invalid template name '%s'", name);
        char tpl_root[PATH_MAX], tdir[PATH_MAX];
        snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
        if (streq(name, "host")) {
                char vname[64];
                int vfd = -1;
                bool rebuilt = false;
                int r = host_template_ensure(tpl_root, vname, sizeof vname, &vfd, &rebuilt, err);
                if (r < 0)
                        return r;
                /* the locked version, not the link, which may move on */
                snprintf(tdir, sizeof tdir, "%s/%s", tpl_root, vname);
                r = template_load(tdir, name, ret, err);
                if (r < 0) {
                        close(vfd);
                        return r;
                }
                (*ret)->lock_fd = vfd;
                (*ret)->rebuilt = rebuilt;
                return 0;
        }
        snprintf(tdir, sizeof tdir, "%s/%s", tpl_root, name);
        struct stat st;
        if (lstat(tdir, &st) == 0 && S_ISLNK(st.st_mode))
                return image_template_resolve(tpl_root, data_dir, name, ret, err);
        if (stat(tdir, &st) < 0 || !S_ISDIR(st.st_mode))
                return hutch_error_set(err, -ENOENT, "template '%s' not found", name);
        return template_load(tdir, name, ret, err);
}

void template_free(hutch_template *t) {
        if (!t)
                return;
        safe_close(t->lock_fd);
        free(t->name);
        free(t->rootfs);
        for (size_t i = 0; i < t->n_layers; i++)
                free(t->layers[i]);
        free(t->layers);
        for (char **e = t->env; e && *e; e++)
                free(*e);
        free(t->env);
        for (char **e = t->cmd; e && *e; e++)
                free(*e);
        free(t->cmd);
        free(t->workdir);
        free(t->user);
        free(t->start_cmd);
        free(t->ready_cmd);
        free(t->kind);
        free(t->version);
        free(t);
}

/* ------------------------------------------------------------ collection */

static bool root_in_use(const template_users *u, const char *rootfs, int64_t built_ns, bool image) {
        for (size_t i = 0; i < u->n_roots; i++)
                if (streq(u->roots[i], rootfs))
                        return true;
        /* a sandbox that did not record its version was made from one built
         * before it was created. Not an image version's: every state that
         * could name one records template_root=, and a create that has not
         * written its state yet holds its version locked. */
        for (size_t i = 0; !image && i < u->n_unknown; i++)
                if (built_ns < u->unknown_created_ns[i])
                        return true;
        return false;
}

int template_gc(const char *data_dir, template_users_fn users, void *arg, bool wait, hutch_error *err) {
        char tpl_root[PATH_MAX], real[PATH_MAX];
        snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
        if (!realpath(tpl_root, real))
                /* no template at all: every layer (and crash leftover) is unused */
                return errno == ENOENT ? layer_gc(data_dir, NULL, 0, err)
                                       : hutch_error_set(err, -errno, "%s: %m", tpl_root);
        _cleanup_close_ int rootfd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", real);
        /* not while a version is being built (nor by two collectors) */
        _cleanup_close_ int lfd = wait ? lock_file_take(rootfd, ".lock") : lock_file_try(rootfd, ".lock");
        if (lfd == -EWOULDBLOCK)
                return 0; /* a build is under way: the next call */
        if (lfd < 0)
                return hutch_error_set(err, lfd, "locking %s/.lock: %s", real, strerror(-lfd));
        char cur[64] = "";
        (void) current_version(rootfd, cur, sizeof cur);

        struct victim {
                char name[64];
                int fd;
                int64_t built_ns;
                bool image;
        } *v = NULL;
        size_t n = 0, cap = 0;
        int removed = 0, r = 0;
        int dup_fd = dup(rootfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return hutch_error_set(err, -errno, "reading %s: %m", real);
        }
        for (struct dirent *de; (de = readdir(d));) {
                const char *nm = de->d_name;
                int64_t built = 0;
                /* what a crash left: a half-switched link, a half-removed version */
                if (streq(nm, ".host.new") || strncmp(nm, ".trash-", 7) == 0 ||
                    strncmp(nm, ".new-", 5) == 0) {
                        if (rm_rf_at(rootfd, nm) >= 0)
                                removed++;
                        continue;
                }
                char tname[64];
                bool image = image_version_valid(nm, tname, sizeof tname, &built);
                if (image) {
                        /* an image (build, snapshot) version that its name no longer names */
                        char link[128];
                        ssize_t k = readlinkat(rootfd, tname, link, sizeof link - 1);
                        if (k > 0 && (link[k] = 0, streq(link, nm)))
                                continue;
                        if (strlen(nm) >= sizeof v->name)
                                continue;
                } else if (!version_name_valid(nm, &built) || streq(nm, cur) ||
                           strlen(nm) >= sizeof v->name)
                        continue;
                /* a sandbox being made from it holds it shared */
                int fd = openat(rootfd, nm, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0)
                        continue;
                if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                        close(fd);
                        continue;
                }
                if (n == cap) {
                        size_t nc = cap ? cap * 2 : 8;
                        struct victim *nv = reallocarray(v, nc, sizeof *v);
                        if (!nv) {
                                close(fd);
                                r = hutch_error_set(err, -ENOMEM, "out of memory");
                                break;
                        }
                        v = nv;
                        cap = nc;
                }
                snprintf(v[n].name, sizeof v[n].name, "%s", nm);
                v[n].fd = fd;
                v[n].built_ns = built;
                v[n].image = image;
                n++;
        }
        closedir(d);

        /* Who uses what is read only now, with the candidates locked: a
         * create that held one shared has written its state by the time it
         * let go, and a new create cannot pick a version that is not current. */
        template_users u = { 0 };
        if (r >= 0 && n > 0)
                r = users(arg, &u, err);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                char rootfs[PATH_MAX], trash[80];
                snprintf(rootfs, sizeof rootfs, "%s/%s/rootfs", real, v[i].name);
                if (root_in_use(&u, rootfs, v[i].built_ns, v[i].image))
                        continue;
                snprintf(trash, sizeof trash, ".trash-%s", v[i].name);
                if (renameat(rootfd, v[i].name, rootfd, trash) < 0) {
                        r = hutch_error_set(err, -errno, "renaming %s/%s: %m", real, v[i].name);
                        break;
                }
                int k = rm_rf_at(rootfd, trash);
                if (k < 0) {
                        r = hutch_error_set(err, k, "removing %s/%s: %s", real, trash, strerror(-k));
                        break;
                }
                removed++;
        }
        for (size_t i = 0; i < n; i++)
                close(v[i].fd);
        free(v);
        template_users_clear(&u);
        /* then the layers that no version left names (a live sandbox's
         * version is left, and so are its layers) */
        if (r >= 0) {
                char **keep = NULL;
                size_t nk = 0;
                int k = image_versions_layers(rootfd, &keep, &nk);
                if (k < 0)
                        r = hutch_error_set(err, k, "reading the templates' layers: %s",
                                            strerror(-k));
                else {
                        k = layer_gc(data_dir, keep, nk, err);
                        if (k < 0)
                                r = k;
                        else
                                removed += k;
                }
                for (size_t i = 0; i < nk; i++)
                        free(keep[i]);
                free(keep);
        }
        return r < 0 ? r : removed;
}

void template_users_clear(template_users *u) {
        if (!u)
                return;
        for (size_t i = 0; i < u->n_roots; i++)
                free(u->roots[i]);
        free(u->roots);
        free(u->unknown_created_ns);
        *u = (template_users){ 0 };
}
