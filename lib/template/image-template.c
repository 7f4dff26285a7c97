/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Templates made of layers (kind image, build, snapshot): a version
 * directory templates/<name>@<ns> holds template.json (CONTRACTS §1) and
 * rootfs/, the small layer hutch puts on top of the image's own; the
 * layers themselves live once in the layer store (lib/image/layer.h).
 * The link templates/<name> names the current version.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "image/layer.h"
#include "sandbox/initproto.h"
#include "template/interp-template.h"
#include "template/template-internal.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

#define USER_UID 1000
#define MAX_ETC_FILE (1u << 20)

bool image_version_valid(const char *n, char *name, size_t nl, int64_t *ret_ns) {
        const char *at = strrchr(n, '@');
        if (!at || at == n || !at[1] || (size_t) (at - n) >= nl || strlen(at + 1) > 20)
                return false;
        char nm[64];
        if ((size_t) (at - n) >= sizeof nm)
                return false;
        memcpy(nm, n, (size_t) (at - n));
        nm[at - n] = 0;
        if (template_validate_name(nm) < 0)
                return false;
        int64_t v = 0;
        for (const char *p = at + 1; *p; p++) {
                if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
                        return false;
                v = v * 10 + (*p - '0');
        }
        if (name)
                snprintf(name, nl, "%s", nm);
        if (ret_ns)
                *ret_ns = v;
        return true;
}

/* ------------------------------------------------- reading the image's files */

/* What the merged view of the layers (top first) has at rel: 'f' a regular
 * file (its fd to *ret_fd when asked), 'd' a directory, 'l' a symlink, 'o'
 * anything else, 0 nothing. Every lookup stays beneath its layer and
 * follows no symlink: these are the image's bytes. */
static int layers_lookup(char *const *layers, size_t n, const char *rel, int *ret_fd) {
        for (size_t i = 0; i < n; i++) {
                _cleanup_close_ int lfd = open(layers[i],
                                               O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                if (lfd < 0)
                        return -errno;
                /* a whiteout or an opaque directory on the way hides the lower layers */
                char prefix[PATH_MAX] = "";
                const char *p = rel;
                bool stop = false;
                int found = -1;
                while (*p) {
                        const char *sl = strchr(p, '/');
                        size_t cl = sl ? (size_t) (sl - p) : strlen(p);
                        size_t pl = strlen(prefix);
                        if (pl + cl + 2 > sizeof prefix)
                                return -ENAMETOOLONG;
                        if (pl)
                                prefix[pl++] = '/';
                        memcpy(prefix + pl, p, cl);
                        prefix[pl + cl] = 0;
                        p += cl + (sl ? 1 : 0);
                        struct stat st;
                        if (fstatat(lfd, prefix, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                                /* a symlinked parent in this layer: not followed */
                                found = errno == ENOENT || errno == ENOTDIR ? -1 : -errno;
                                if (found < -1)
                                        return found;
                                break;
                        }
                        if (S_ISCHR(st.st_mode) && st.st_rdev == 0)
                                return 0; /* whited out */
                        if (*p) {
                                if (!S_ISDIR(st.st_mode)) {
                                        stop = true; /* a non-directory hides the lower ones' */
                                        break;
                                }
                                char v[2];
                                _cleanup_close_ int dfd = sys_openat2(
                                        lfd, prefix,
                                        &(struct open_how) {
                                                .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                                                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS },
                                        sizeof(struct open_how));
                                if (dfd >= 0 &&
                                    fgetxattr(dfd, "user.overlay.opaque", v, sizeof v) == 1 &&
                                    v[0] == 'y')
                                        stop = true; /* after this layer's own entry */
                                continue;
                        }
                        found = S_ISREG(st.st_mode)   ? 'f'
                                : S_ISDIR(st.st_mode) ? 'd'
                                : S_ISLNK(st.st_mode) ? 'l'
                                                      : 'o';
                        if (found == 'f' && ret_fd) {
                                struct open_how how = {
                                        .flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK,
                                        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
                                };
                                int fd = sys_openat2(lfd, rel, &how, sizeof how);
                                if (fd < 0)
                                        return -errno;
                                *ret_fd = fd;
                        }
                        return found;
                }
                if (found > 0)
                        return found;
                if (stop)
                        return 0;
        }
        return 0;
}

static int layers_read(char *const *layers, size_t n, const char *rel, char **ret) {
        int fd = -1;
        *ret = NULL;
        int k = layers_lookup(layers, n, rel, &fd);
        if (k != 'f')
                return k < 0 ? k : 0;
        _cleanup_close_ int cfd = fd;
        struct stat st;
        if (fstat(cfd, &st) < 0)
                return -errno;
        if ((uint64_t) st.st_size > MAX_ETC_FILE)
                return -EFBIG;
        char *buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        ssize_t got = pread(cfd, buf, (size_t) st.st_size, 0);
        if (got < 0) {
                free(buf);
                return -errno;
        }
        buf[got] = 0;
        if (strlen(buf) != (size_t) got) { /* NUL bytes: not a text file we parse */
                free(buf);
                return -EINVAL;
        }
        *ret = buf;
        return 1;
}

/* The uid and gid of a passwd entry (by name) */
static bool passwd_find(const char *passwd, const char *name, int64_t *uid, int64_t *gid,
                        char *home, size_t hl) {
        size_t nl = strlen(name);
        for (const char *line = passwd; line && *line;) {
                const char *end = strchr(line, '\n');
                size_t ll = end ? (size_t) (end - line) : strlen(line);
                if (ll > nl && strncmp(line, name, nl) == 0 && line[nl] == ':') {
                        char buf[1024];
                        snprintf(buf, sizeof buf, "%.*s", (int) MIN(ll, sizeof buf - 1), line);
                        char *f[7] = { 0 };
                        char *save = NULL, *q = buf;
                        for (int i = 0; i < 7; i++) {
                                f[i] = q;
                                char *c = q ? strchr(q, ':') : NULL;
                                if (c)
                                        *c = 0, q = c + 1;
                                else
                                        q = NULL;
                        }
                        (void) save;
                        if (!f[2] || !f[3])
                                return false;
                        char *e1, *e2;
                        long long u = strtoll(f[2], &e1, 10), g = strtoll(f[3], &e2, 10);
                        if (*e1 || *e2 || u < 0 || u > 65535 || g < 0 || g > 65535)
                                return false;
                        *uid = u;
                        *gid = g;
                        if (home)
                                snprintf(home, hl, "%s", f[5] ? f[5] : "/");
                        return true;
                }
                line = end ? end + 1 : NULL;
        }
        return false;
}

static bool group_find(const char *group, const char *name, int64_t *gid) {
        int64_t dummy;
        return passwd_find(group, name, &dummy, gid, NULL, 0) || false;
}

/* "name", "uid", "name:group", "uid:gid" against the image's files */
static int resolve_user(const char *user, const char *passwd, const char *group, int64_t *uid,
                        int64_t *gid, hutch_error *err) {
        char u[256], *g;
        snprintf(u, sizeof u, "%s", user);
        g = strchr(u, ':');
        if (g)
                *g++ = 0;
        char *e;
        long long n = strtoll(u, &e, 10);
        if (*u && !*e) {
                if (n < 0 || n > 65535)
                        return hutch_error_set(err, -ERANGE,
                                               "the image's User '%s' is outside 0..65535", user);
                *uid = n;
                *gid = n;
                int64_t pg;
                (void) pg;
        } else if (!passwd || !passwd_find(passwd, u, uid, gid, NULL, 0))
                return hutch_error_set(err, -ENOENT,
                                       "the image's User '%s' is not in its /etc/passwd", user);
        if (g && *g) {
                n = strtoll(g, &e, 10);
                if (!*e) {
                        if (n < 0 || n > 65535)
                                return hutch_error_set(
                                        err, -ERANGE,
                                        "the image's User group '%s' is outside 0..65535", g);
                        *gid = n;
                } else if (!group || !group_find(group, g, gid))
                        return hutch_error_set(err, -ENOENT,
                                               "the image's User group '%s' is not in its /etc/group",
                                               g);
        }
        return 0;
}

static const char skel_hosts[] = "127.0.0.1\tlocalhost\n"
                                 "::1\tlocalhost ip6-localhost ip6-loopback\n"
                                 "127.0.1.1\thutch\n";
static const char skel_resolv[] =
        "# hutch: names are resolved by the egress proxy when the sandbox has network access\n"
        "nameserver 127.0.0.1\n"
        "options ndots:0\n";

static char *append_line(const char *base, const char *line) {
        size_t bl = base ? strlen(base) : 0;
        char *out = NULL;
        if (asprintf(&out, "%s%s%s", base ? base : "", bl && base[bl - 1] != '\n' ? "\n" : "",
                     line) < 0)
                return NULL;
        return out;
}

static bool has_entry(const char *file, const char *name) {
        size_t nl = strlen(name);
        for (const char *line = file; line && *line;) {
                if (strncmp(line, name, nl) == 0 && line[nl] == ':')
                        return true;
                const char *end = strchr(line, '\n');
                line = end ? end + 1 : NULL;
        }
        return false;
}

/* hutch's top layer over the image (rfd: rootfs/ of the new version) */
static int build_skeleton(int rfd, char *const *layers, size_t n, const char *user,
                          int64_t *ret_uid, int64_t *ret_gid, hutch_error *err) {
        int r;
        static const struct {
                const char *name;
                mode_t mode;
        } dirs[] = {
                { "etc", 0755 },
                { "proc", 0555 },
                { "sys", 0555 },
                { "dev", 0755 },
                { "run", 0755 },
                { "run/hutch", 0755 },
                { &INITPROTO_GVISOR_LAYER[1], 0755 },
        };
        for (size_t i = 0; i < ELEMENTSOF(dirs); i++) {
                int k = layers_lookup(layers, n, dirs[i].name, NULL);
                if (k < 0)
                        return hutch_error_set(err, k, "reading the image's /%s: %s", dirs[i].name,
                                               strerror(-k));
                if (k != 0 && k != 'd')
                        return hutch_error_set(err, -ENOTDIR, "the image's /%s is not a directory",
                                               dirs[i].name);
                if ((r = template_mkdir_at(rfd, dirs[i].name, dirs[i].mode, 0, 0)) < 0)
                        return hutch_error_set(err, r, "creating /%s: %s", dirs[i].name,
                                               strerror(-r));
        }
        _cleanup_close_ int efd = openat(rfd, "etc", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (efd < 0)
                return hutch_error_set(err, -errno, "opening etc: %m");
        /* never the host's, never the image's: what hutch's network is */
        if ((r = template_write_at(efd, "hosts", skel_hosts, 0644, 0, 0)) < 0 ||
            (r = template_write_at(efd, "hostname", "hutch\n", 0644, 0, 0)) < 0 ||
            (r = template_write_at(efd, "resolv.conf", skel_resolv, 0644, 0, 0)) < 0)
                return hutch_error_set(err, r, "writing /etc: %s", strerror(-r));

        /* a `user` account (uid 1000) where the image has none */
        _cleanup_free_ char *passwd = NULL, *group = NULL;
        if ((r = layers_read(layers, n, "etc/passwd", &passwd)) < 0 ||
            (r = layers_read(layers, n, "etc/group", &group)) < 0)
                return hutch_error_set(err, r, "reading the image's /etc/passwd or /etc/group: %s",
                                       strerror(-r));
        bool had_user = passwd && has_entry(passwd, "user");
        if (!passwd) {
                passwd = strdup("root:x:0:0:root:/root:/bin/sh\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
                group = group ? group : strdup("root:x:0:\nnogroup:x:65534:\n");
        }
        if (!passwd || !group)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        if (!had_user) {
                const char *sh = layers_lookup(layers, n, "bin/bash", NULL) > 0 ? "/bin/bash"
                                                                                : "/bin/sh";
                char line[128];
                snprintf(line, sizeof line, "user:x:%d:%d:user:/home/user:%s\n", USER_UID, USER_UID,
                         sh);
                char *np = append_line(passwd, line);
                if (!np)
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                free(passwd);
                passwd = np;
                if (!has_entry(group, "user")) {
                        char *ng = append_line(group, "user:x:1000:\n");
                        if (!ng)
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        free(group);
                        group = ng;
                }
                if ((r = template_write_at(efd, "passwd", passwd, 0644, 0, 0)) < 0 ||
                    (r = template_write_at(efd, "group", group, 0644, 0, 0)) < 0)
                        return hutch_error_set(err, r, "writing /etc/passwd: %s", strerror(-r));
                int k = layers_lookup(layers, n, "home", NULL);
                if (k == 0 && (r = template_mkdir_at(rfd, "home", 0755, 0, 0)) < 0)
                        return hutch_error_set(err, r, "creating /home: %s", strerror(-r));
                if ((k == 0 || k == 'd') && layers_lookup(layers, n, "home/user", NULL) == 0) {
                        if (k == 'd' && (r = template_mkdir_at(rfd, "home", 0755, 0, 0)) < 0)
                                return hutch_error_set(err, r, "creating /home: %s", strerror(-r));
                        if ((r = template_mkdir_at(rfd, "home/user", 0750, USER_UID, USER_UID)) < 0)
                                return hutch_error_set(err, r, "creating /home/user: %s",
                                                       strerror(-r));
                }
        }
        /* where the daemon writes the egress CA bundle (credential injection) */
        int k = layers_lookup(layers, n, "etc/ssl", NULL);
        if (k == 0 || k == 'd') {
                int c = layers_lookup(layers, n, "etc/ssl/certs", NULL);
                if (c == 0 || c == 'd') {
                        if ((r = template_mkdir_at(efd, "ssl", 0755, 0, 0)) < 0 ||
                            (r = template_mkdir_at(efd, "ssl/certs", 0755, 0, 0)) < 0)
                                return hutch_error_set(err, r, "creating /etc/ssl/certs: %s",
                                                       strerror(-r));
                        if (layers_lookup(layers, n, "etc/ssl/certs/ca-certificates.crt", NULL) == 0 &&
                            (r = template_write_at(efd, "ssl/certs/ca-certificates.crt", "", 0644,
                                                   0, 0)) < 0)
                                return hutch_error_set(err, r, "creating the CA bundle: %s",
                                                       strerror(-r));
                }
        }
        *ret_uid = *ret_gid = -1;
        if (user && *user)
                return resolve_user(user, passwd, group, ret_uid, ret_gid, err);
        return 0;
}

/* ------------------------------------------------------------ template.json */

static json_t *strv_json(char *const *v) {
        json_t *a = json_array();
        for (char *const *p = v; p && *p; p++)
                json_array_append_new(a, json_string(*p));
        return a;
}

static int strv_from(json_t *a, char ***ret) {
        *ret = NULL;
        if (!json_is_array(a))
                return 0;
        char **v = calloc(json_array_size(a) + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        size_t i, k = 0;
        json_t *e;
        json_array_foreach(a, i, e) {
                if (json_is_string(e) && !(v[k++] = strdup(json_string_value(e)))) {
                        for (size_t j = 0; j < k; j++)
                                free(v[j]);
                        free(v);
                        return -ENOMEM;
                }
        }
        *ret = v;
        return 0;
}

json_t *template_env_json(const hutch_template *t) {
        json_t *o = json_object();
        for (char **e = t->env; o && e && *e; e++) {
                const char *eq = strchr(*e, '=');
                if (eq && eq != *e) {
                        char *k = strndup(*e, (size_t) (eq - *e));
                        if (k)
                                json_object_set_new(o, k, json_string(eq + 1));
                        free(k);
                }
        }
        return o;
}

static char *str_or_null(json_t *o, const char *k) {
        const char *s = json_string_value(json_object_get(o, k));
        return s && *s ? strdup(s) : NULL;
}

static int write_version(const char *data_dir, const hutch_template_meta *meta, hutch_error *err);

int template_write(const char *data_dir, const hutch_template_meta *meta, hutch_error *err) {
        if (!meta || template_validate_name(meta->name) < 0 || streq(meta->name, "host") ||
            streq(meta->name, "base") || template_is_interp(meta->name))
                return hutch_error_set(err, -EINVAL, "invalid template name '%s'",
                                       meta && meta->name ? meta->name : "");
        return write_version(data_dir, meta, err);
}

int template_write_base(const char *data_dir, const hutch_template_meta *meta, hutch_error *err) {
        if (!meta || !meta->name || !(streq(meta->name, "base") || streq(meta->name, "code-interpreter")))
                return hutch_error_set(err, -EINVAL, "template_write_base writes 'base' and 'code-interpreter' only");
        return write_version(data_dir, meta, err);
}

static int write_version(const char *data_dir, const hutch_template_meta *meta, hutch_error *err) {
        size_t n = 0;
        for (char *const *l = meta->layers; l && *l; l++)
                n++;
        /* the layers' host paths, top first */
        char **paths = calloc(n + 1, sizeof *paths);
        if (!paths)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        int r = 0;
        for (size_t i = 0; i < n && r >= 0; i++) {
                char p[PATH_MAX];
                r = layer_path(data_dir, meta->layers[i], p, sizeof p);
                if (r < 0 || !p[0])
                        r = hutch_error_set(err, r < 0 ? r : -ENOENT,
                                            "layer %s is not in the store", meta->layers[i]);
                else if (!(paths[n - 1 - i] = strdup(p)))
                        r = hutch_error_set(err, -ENOMEM, "out of memory");
        }
        char tpl_root[PATH_MAX], vname[128], vdir[PATH_MAX];
        _cleanup_close_ int rootfd = -1, lfd = -1, vfd = -1, rfd = -1;
        bool made = false;
        if (r < 0)
                goto out;
        snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
        if ((r = mkdir_p(tpl_root, 0755)) < 0 ||
            (rootfd = open(tpl_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
                r = hutch_error_set(err, r < 0 ? r : -errno, "opening %s: %s", tpl_root,
                                    strerror(r < 0 ? -r : errno));
                goto out;
        }
        if ((lfd = lock_file_take(rootfd, ".lock")) < 0) {
                r = hutch_error_set(err, lfd, "locking %s/.lock: %s", tpl_root, strerror(-lfd));
                goto out;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(vname, sizeof vname, "%s@%lld%09ld", meta->name, (long long) ts.tv_sec, ts.tv_nsec);
        snprintf(vdir, sizeof vdir, "%s/%s", tpl_root, vname);
        if (mkdirat(rootfd, vname, 0755) < 0) {
                r = hutch_error_set(err, -errno, "creating %s: %m", vdir);
                goto out;
        }
        made = true;
        if ((vfd = openat(rootfd, vname, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0 ||
            mkdirat(vfd, "rootfs", 0755) < 0 ||
            (rfd = openat(vfd, "rootfs", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
                r = hutch_error_set(err, -errno, "creating %s/rootfs: %m", vdir);
                goto out;
        }
        int64_t uid = -1, gid = -1;
        if ((r = build_skeleton(rfd, paths, n, meta->user, &uid, &gid, err)) < 0)
                goto out;
        json_t *j = json_pack(
                "{s:i, s:s, s:s, s:I, s:I, s:s, s:o, s:o, s:s, s:s, s:I, s:I, s:o, s:s, s:s, s:s, s:s}",
                "format", 1, "name", meta->name, "kind", meta->kind ? meta->kind : "image", "team",
                (json_int_t) meta->team, "created_ms",
                (json_int_t) (meta->created_ms ? meta->created_ms
                                               : (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000),
                "source", meta->source ? meta->source : "", "layers", strv_json(meta->layers),
                "env", strv_json(meta->env), "workdir", meta->workdir ? meta->workdir : "", "user",
                meta->user ? meta->user : "", "uid", (json_int_t) uid, "gid", (json_int_t) gid,
                "cmd", strv_json(meta->cmd), "start_cmd", meta->start_cmd ? meta->start_cmd : "",
                "ready_cmd", meta->ready_cmd ? meta->ready_cmd : "", "parent",
                meta->parent ? meta->parent : "", "build_id", meta->build_id ? meta->build_id : "");
        char *txt = j ? json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
        json_decref(j);
        if (!txt) {
                r = hutch_error_set(err, -ENOMEM, "out of memory");
                goto out;
        }
        r = template_write_at(vfd, "template.json", txt, 0644, 0, 0);
        free(txt);
        if (r < 0 || fsync(vfd) < 0) {
                r = hutch_error_set(err, r < 0 ? r : -errno, "writing %s/template.json: %s", vdir,
                                    strerror(r < 0 ? -r : errno));
                goto out;
        }
        /* switch the name atomically; the old version stays until GC */
        char tmp[96];
        snprintf(tmp, sizeof tmp, ".new-%s", meta->name);
        (void) unlinkat(rootfd, tmp, 0);
        struct stat st;
        if (fstatat(rootfd, meta->name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISLNK(st.st_mode)) {
                r = hutch_error_set(err, -EEXIST, "%s/%s exists and is not a template link",
                                    tpl_root, meta->name);
                goto out;
        }
        if (symlinkat(vname, rootfd, tmp) < 0 || renameat(rootfd, tmp, rootfd, meta->name) < 0) {
                r = hutch_error_set(err, -errno, "switching %s/%s: %m", tpl_root, meta->name);
                goto out;
        }
        (void) fsync(rootfd);
        made = false;
out:
        if (made)
                (void) rm_rf_at(rootfd, vname);
        for (size_t i = 0; i < n; i++)
                free(paths[i]);
        free(paths);
        return r;
}

static int load_json(int vfd, json_t **ret) {
        _cleanup_free_ char *txt = NULL;
        int r = read_file_at(vfd, "template.json", 4 << 20, &txt);
        if (r < 0)
                return r;
        *ret = json_loads(txt, 0, NULL);
        return *ret && json_is_object(*ret) ? 0 : (json_decref(*ret), -EBADMSG);
}

int image_template_resolve(const char *tpl_root, const char *data_dir, const char *name,
                           hutch_template **ret, hutch_error *err) {
        _cleanup_close_ int rootfd = open(tpl_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", tpl_root);
        char vname[128];
        int vfd = -1;
        for (unsigned attempt = 0; attempt < 8; attempt++) {
                ssize_t k = readlinkat(rootfd, name, vname, sizeof vname - 1);
                if (k < 0)
                        return hutch_error_set(err, -ENOENT, "template '%s' not found", name);
                vname[k] = 0;
                char owner[64];
                if (!image_version_valid(vname, owner, sizeof owner, NULL) || !streq(owner, name))
                        return hutch_error_set(err, -EINVAL,
                                               "template '%s' links to '%s', not a version of it",
                                               name, vname);
                vfd = template_version_open_shared(rootfd, vname);
                if (vfd == -ESTALE || vfd == -ENOENT)
                        continue; /* switched and collected under us */
                break;
        }
        if (vfd < 0)
                return hutch_error_set(err, vfd, "template '%s': opening %s: %s", name, vname,
                                       strerror(-vfd));
        json_t *j = NULL;
        int r = load_json(vfd, &j);
        if (r < 0) {
                close(vfd);
                return hutch_error_set(err, r, "template '%s': reading %s/template.json: %s", name,
                                       vname, strerror(-r));
        }
        hutch_template *t = calloc(1, sizeof *t);
        char rootfs[PATH_MAX];
        snprintf(rootfs, sizeof rootfs, "%s/%s/rootfs", tpl_root, vname);
        if (!t) {
                close(vfd);
                json_decref(j);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        t->lock_fd = vfd;
        t->name = strdup(name);
        t->rootfs = realpath(rootfs, NULL);
        t->version = strdup(vname);
        t->kind = strdup(json_string_value(json_object_get(j, "kind")) ?: "image");
        t->team = json_integer_value(json_object_get(j, "team"));
        t->workdir = str_or_null(j, "workdir");
        t->user = str_or_null(j, "user");
        t->start_cmd = str_or_null(j, "start_cmd");
        t->ready_cmd = str_or_null(j, "ready_cmd");
        json_t *u = json_object_get(j, "uid"), *g = json_object_get(j, "gid");
        t->uid = json_is_integer(u) ? json_integer_value(u) : -1;
        t->gid = json_is_integer(g) ? json_integer_value(g) : -1;
        r = (!t->name || !t->rootfs || !t->version || !t->kind) ? -ENOMEM : 0;
        if (r >= 0)
                r = strv_from(json_object_get(j, "env"), &t->env);
        if (r >= 0)
                r = strv_from(json_object_get(j, "cmd"), &t->cmd);
        if (r < 0) {
                json_decref(j);
                template_free(t);
                return hutch_error_set(err, r, "template '%s': %s", name, strerror(-r));
        }
        json_t *layers = json_object_get(j, "layers");
        size_t n = json_array_size(layers);
        t->layers = calloc(n + 1, sizeof *t->layers);
        if (!t->layers)
                r = hutch_error_set(err, -ENOMEM, "out of memory");
        else
                t->n_layers = n; /* slots still NULL are freed as such */
        for (size_t i = 0; r >= 0 && i < n; i++) {
                const char *d = json_string_value(json_array_get(layers, i));
                char p[PATH_MAX];
                int k = d ? layer_path(data_dir, d, p, sizeof p) : -EINVAL;
                if (k < 0 || !p[0])
                        r = hutch_error_set(err, k < 0 ? k : -ENOENT,
                                            "template '%s': layer %s is missing from the store",
                                            name, d ? d : "?");
                else if (!(t->layers[n - 1 - i] = strdup(p))) /* top first */
                        r = hutch_error_set(err, -ENOMEM, "out of memory");
        }
        json_decref(j);
        if (r < 0) {
                template_free(t);
                return r;
        }
        *ret = t;
        return 0;
}

int image_versions_layers(int rootfd, char ***ret, size_t *ret_n) {
        *ret = NULL;
        *ret_n = 0;
        /* a fresh open, not a dup: a dup shares the caller's read offset */
        int dup_fd = openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return -errno;
        }
        char **v = NULL;
        size_t n = 0;
        int r = 0;
        for (struct dirent *de; (de = readdir(d)) && r >= 0;) {
                if (!image_version_valid(de->d_name, NULL, 64, NULL))
                        continue;
                _cleanup_close_ int vfd = openat(rootfd, de->d_name,
                                                 O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                json_t *j = NULL;
                if (vfd < 0 || load_json(vfd, &j) < 0) {
                        /* unreadable: keep everything rather than guess */
                        r = -EBADMSG;
                        break;
                }
                size_t i;
                json_t *e;
                json_array_foreach(json_object_get(j, "layers"), i, e) {
                        const char *s = json_string_value(e);
                        if (!s)
                                continue;
                        char **nv = reallocarray(v, n + 2, sizeof *v);
                        if (!nv || !(nv[n] = strdup(s))) {
                                v = nv ? nv : v;
                                r = -ENOMEM;
                                break;
                        }
                        v = nv;
                        v[++n] = NULL;
                }
                json_decref(j);
        }
        closedir(d);
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        free(v[i]);
                free(v);
                return r;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

int template_remove(const char *data_dir, const char *name, hutch_error *err) {
        if (!name || streq(name, "host"))
                return hutch_error_set(err, -EPERM, "the host template cannot be removed");
        if (streq(name, "base") && !template_base_built(data_dir))
                return hutch_error_set(err, -ENOENT,
                                       "no base template was built: 'base' is the host template "
                                       "(`hutch template base` builds one)");
        char iv[8];
        if (template_is_interp(name) && !template_interp_version(data_dir, iv, sizeof iv))
                return hutch_error_set(err, -ENOENT,
                                       "no code-interpreter template was built: the interpreter runs on "
                                       "the host template (`hutch template interpreter` builds one)");
        if (template_is_interp(name))
                name = "code-interpreter"; /* its three names are one template */
        if (template_validate_name(name) < 0)
                return hutch_error_set(err, -EINVAL, "invalid template name '%s'", name);
        char tpl_root[PATH_MAX];
        snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
        _cleanup_close_ int rootfd = open(tpl_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0)
                return hutch_error_set(err, -ENOENT, "template '%s' not found", name);
        _cleanup_close_ int lfd = lock_file_take(rootfd, ".lock");
        if (lfd < 0)
                return hutch_error_set(err, lfd, "locking %s/.lock: %s", tpl_root, strerror(-lfd));
        struct stat st;
        if (fstatat(rootfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISLNK(st.st_mode))
                return hutch_error_set(err, -ENOENT, "template '%s' not found", name);
        if (unlinkat(rootfd, name, 0) < 0)
                return hutch_error_set(err, -errno, "removing %s/%s: %m", tpl_root, name);
        return 0;
}

void template_info_free(template_info *v, size_t n) {
        for (size_t i = 0; v && i < n; i++) {
                free(v[i].name);
                free(v[i].kind);
                free(v[i].source);
        }
        free(v);
}

int template_list(const char *data_dir, template_info **ret, size_t *ret_n, hutch_error *err) {
        *ret = NULL;
        *ret_n = 0;
        char tpl_root[PATH_MAX];
        snprintf(tpl_root, sizeof tpl_root, "%s/templates", data_dir);
        _cleanup_close_ int rootfd = open(tpl_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rootfd < 0)
                return errno == ENOENT ? 0 : hutch_error_set(err, -errno, "opening %s: %m", tpl_root);
        int dup_fd = dup(rootfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return hutch_error_set(err, -errno, "reading %s: %m", tpl_root);
        }
        template_info *v = NULL;
        size_t n = 0;
        int r = 0;
        for (struct dirent *de; (de = readdir(d));) {
                struct stat st;
                if (template_validate_name(de->d_name) < 0 ||
                    fstatat(rootfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISLNK(st.st_mode))
                        continue;
                template_info ti = { 0 };
                char link[128];
                ssize_t k = readlinkat(rootfd, de->d_name, link, sizeof link - 1);
                if (k <= 0)
                        continue;
                link[k] = 0;
                ti.name = strdup(de->d_name);
                if (streq(de->d_name, "host")) {
                        ti.kind = strdup("host");
                        ti.source = strdup("the host's /usr");
                        int64_t ns = 0;
                        const char *dot = strrchr(link, '.');
                        if (dot)
                                ns = strtoll(dot + 1, NULL, 10);
                        ti.created_ms = ns / 1000000;
                } else {
                        _cleanup_close_ int vfd = openat(
                                rootfd, link, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                        json_t *j = NULL;
                        if (vfd < 0 || load_json(vfd, &j) < 0) {
                                free(ti.name);
                                continue;
                        }
                        ti.kind = strdup(json_string_value(json_object_get(j, "kind")) ?: "image");
                        ti.source = strdup(json_string_value(json_object_get(j, "source")) ?: "");
                        ti.created_ms = json_integer_value(json_object_get(j, "created_ms"));
                        size_t i;
                        json_t *e;
                        json_array_foreach(json_object_get(j, "layers"), i, e) {
                                uint64_t du = 0;
                                const char *s = json_string_value(e);
                                ti.n_layers++;
                                if (s && layer_disk_usage(data_dir, s, &du) == 0)
                                        ti.size += du;
                        }
                        json_decref(j);
                }
                template_info *nv = reallocarray(v, n + 1, sizeof *v);
                if (!nv || !ti.name || !ti.kind || !ti.source) {
                        v = nv ? nv : v;
                        free(ti.name);
                        free(ti.kind);
                        free(ti.source);
                        r = hutch_error_set(err, -ENOMEM, "out of memory");
                        break;
                }
                v = nv;
                v[n++] = ti;
        }
        closedir(d);
        if (r < 0) {
                template_info_free(v, n);
                return r;
        }
        *ret = v;
        *ret_n = n;
        return 0;
}
