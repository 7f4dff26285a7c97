/* SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>

#include "sandbox/initproto.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"

/* init/gvisor-compat.so, embedded by the build (init/embed.sh) */
extern const unsigned char hutch_gvisor_compat_start[];
extern const unsigned char hutch_gvisor_compat_end[];

#define HOST_TEMPLATE_VERSION "host-7"
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
        "ld-musl-x86_64.path", "ld-musl-x86_64.d", NULL,
};
/* Inside the copied trees: keys and password history. (Files that may hold
 * an operator's credentials — environment, npmrc, pip.conf, gitconfig —
 * are not in the list above at all.) */
static const char *const never_copy[] = { "ssl/private", "security/opasswd", NULL };

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

static int write_at(int dfd, const char *name, const char *content, mode_t mode, uid_t uid, gid_t gid) {
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

static int mkdir_at(int dfd, const char *name, mode_t mode, uid_t uid, gid_t gid) {
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
        _cleanup_close_ int host_etc = open("/etc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (efd < 0 || host_etc < 0)
                return -errno;
        for (const char *const *e = host_etc_copy; *e; e++) {
                r = copy_tree(host_etc, *e, efd, *e, *e, 0);
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
                r = copy_tree(host_etc, p, hfd, *s, p, 0);
                if (r < 0)
                        return r;
                (void) fchownat(hfd, *s, USER_UID, USER_UID, AT_SYMLINK_NOFOLLOW);
        }
        return 0;
}

/* What the host template depends on: when any of these changes (a package
 * install updates the loader cache or alternatives), the template is rebuilt. */
static void host_inputs_stamp(char *buf, size_t n) {
        static const char *const inputs[] = { "/etc", "/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl",
                                               "/etc/ssl/certs", "/etc/pam.d", "/etc/profile.d", "/etc/security",
                                               "/etc/skel", NULL };
        size_t off = (size_t) snprintf(buf, n, "%s", HOST_TEMPLATE_VERSION);
        for (const char *const *p = inputs; *p && off < n; p++) {
                struct stat st;
                long long m = stat(*p, &st) == 0 ? (long long) st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec : 0;
                off += (size_t) snprintf(buf + off, n - off, " %lld", m);
        }
}

static int template_load(const char *tdir, const char *name, hutch_template **ret, hutch_error *err) {
        char rootfs[PATH_MAX], real[PATH_MAX];
        snprintf(rootfs, sizeof rootfs, "%s/rootfs", tdir);
        if (!realpath(rootfs, real))
                return hutch_error_set(err, -errno, "template '%s': %s: %m", name, rootfs);
        hutch_template *t = calloc(1, sizeof *t);
        if (!t)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        t->name = strdup(name);
        t->rootfs = strdup(real);
        if (!t->name || !t->rootfs) {
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

static int host_template_ensure(const char *tpl_root, hutch_error *err) {
        char link[PATH_MAX], stamp[512], cur[512] = "";
        snprintf(link, sizeof link, "%s/host", tpl_root);
        host_inputs_stamp(stamp, sizeof stamp);

        char marker[PATH_MAX];
        snprintf(marker, sizeof marker, "%s/template.stamp", link);
        _cleanup_free_ char *have = NULL;
        if (read_file_at(AT_FDCWD, marker, sizeof cur - 1, &have) >= 0 && streq(have, stamp))
                return 0;

        int r = mkdir_p(tpl_root, 0755);
        if (r < 0)
                return hutch_error_set(err, r, "creating %s: %s", tpl_root, strerror(-r));
        char lockp[PATH_MAX];
        snprintf(lockp, sizeof lockp, "%s/.lock", tpl_root);
        _cleanup_close_ int lfd = lock_file_take(AT_FDCWD, lockp);
        if (lfd < 0)
                return hutch_error_set(err, lfd, "locking %s: %s", lockp, strerror(-lfd));
        free(have);
        have = NULL;
        if (read_file_at(AT_FDCWD, marker, sizeof cur - 1, &have) >= 0 && streq(have, stamp))
                return 0; /* built by someone else meanwhile */

        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char vname[64], vdir[PATH_MAX];
        snprintf(vname, sizeof vname, "host.%lld%09ld", (long long) ts.tv_sec, ts.tv_nsec);
        snprintf(vdir, sizeof vdir, "%s/%s", tpl_root, vname);
        if (mkdir(vdir, 0755) < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", vdir);
        _cleanup_close_ int vfd = open(vdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (vfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", vdir);
        r = mkdir_at(vfd, "rootfs", 0755, 0, 0);
        _cleanup_close_ int rfd = r < 0 ? -1 : openat(vfd, "rootfs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rfd < 0) {
                r = r < 0 ? r : -errno;
                goto fail;
        }
        r = build_host_rootfs(rfd);
        if (r < 0)
                goto fail;
        r = write_at(vfd, "template.stamp", stamp, 0644, 0, 0);
        if (r < 0)
                goto fail;
        /* Switch the name atomically: symlink to a temp name, rename over. */
        char tmplink[PATH_MAX];
        snprintf(tmplink, sizeof tmplink, "%s/.host.new", tpl_root);
        (void) unlink(tmplink);
        if (symlink(vname, tmplink) < 0 || rename(tmplink, link) < 0) {
                r = -errno;
                goto fail;
        }
        return 0;
fail:
        (void) rm_rf_at(AT_FDCWD, vdir);
        return hutch_error_set(err, r, "building the host template in %s: %s", vdir, strerror(-r));
}

int template_resolve(const char *data_dir, const char *name, hutch_template **ret, hutch_error *err) {
        if (!name || !*name || streq(name, "base"))
                name = "host";
        if (template_validate_name(name) < 0)
                return hutch_error_set(err, -EINVAL, "invalid template name '%s'", name);
        char tpl_root[PATH_MAX], tdir[PATH_MAX];
        snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
        if (streq(name, "host")) {
                int r = host_template_ensure(tpl_root, err);
                if (r < 0)
                        return r;
        }
        snprintf(tdir, sizeof tdir, "%s/%s", tpl_root, name);
        struct stat st;
        if (stat(tdir, &st) < 0 || !S_ISDIR(st.st_mode))
                return hutch_error_set(err, -ENOENT, "template '%s' not found", name);
        return template_load(tdir, name, ret, err);
}

void template_free(hutch_template *t) {
        if (!t)
                return;
        free(t->name);
        free(t->rootfs);
        free(t);
}
