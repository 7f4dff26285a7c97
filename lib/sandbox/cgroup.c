/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cgroups, the common half: backend detection, dispatch to cgroup-v1.c or
 * cgroup-v2.c, name validation and the cgroupfs file helpers both backends
 * use. See docs/cgroups.md.
 */
#include <dirent.h>
#include <limits.h>
#include <unistd.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>

#include "sandbox/cgroup-internal.h"

/* cgroup.procs of a big cgroup is long (about 8 bytes a pid); anything past
 * this is not a cgroupfs file we know. */
#define CGROUP_READ_MAX (32u << 20)
/* Child cgroups below a sandbox's cgroup: hutch makes none, but a tree is
 * walked with a bound rather than trusted. */
#define CGROUP_TREE_DEPTH_MAX 16

static const char *const v1_controller_names[_CGROUP_V1_MAX] = {
        [CGROUP_V1_MEMORY] = "memory",   [CGROUP_V1_PIDS] = "pids",
        [CGROUP_V1_CPU] = "cpu",         [CGROUP_V1_CPUACCT] = "cpuacct",
        [CGROUP_V1_FREEZER] = "freezer", [CGROUP_V1_DEVICES] = "devices",
        [CGROUP_V1_CPUSET] = "cpuset",
};

const char *cgroup_v1_controller_name(cgroup_v1_controller c) {
        if (c < 0 || c >= _CGROUP_V1_MAX)
                return NULL;
        return v1_controller_names[c];
}

bool cgroup_v1_dir_is_dup(const hutch_cgroup *cg, cgroup_v1_controller c) {
        if (!cg->v1_dir[c])
                return false;
        for (int i = 0; i < (int) c; i++)
                if (cg->v1_dir[i] && streq(cg->v1_dir[i], cg->v1_dir[c]))
                        return true;
        return false;
}

/* ------------------------------------------------------------- names */

static bool id_char_ok(char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

bool cgroup_id_is_valid(const char *id) {
        size_t n;

        if (!id)
                return false;
        n = strlen(id);
        if (n == 0 || n > CGROUP_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!id_char_ok(id[i]))
                        return false;
        return true;
}

/* One or more '/'-separated components of [A-Za-z0-9_.-], none of them "."
 * or "..", relative to the hierarchy's root (no leading '/'). '.' is allowed
 * so that "hutch.slice" works; every cgroupfs control file has a '.' in its
 * name, so a component can name one (mkdir then fails with EEXIST). */
bool cgroup_root_name_is_valid(const char *root_name) {
        size_t n, comp = 0;

        if (!root_name)
                return false;
        n = strlen(root_name);
        if (n == 0 || n > CGROUP_ROOT_NAME_MAX)
                return false;
        for (size_t i = 0; i <= n; i++) {
                char c = root_name[i];

                if (c == '/' || c == '\0') {
                        if (comp == 0)
                                return false; /* leading, trailing or double '/' */
                        if ((comp == 1 && root_name[i - 1] == '.') ||
                            (comp == 2 && root_name[i - 1] == '.' && root_name[i - 2] == '.'))
                                return false;
                        comp = 0;
                        continue;
                }
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.'))
                        return false;
                comp++;
        }
        return true;
}

int cgroup_check_names(const char *root_name, const char *id, hutch_error *err) {
        if (!cgroup_root_name_is_valid(root_name))
                return hutch_error_set(err, -EINVAL,
                                       "invalid cgroup root name '%s': want relative components "
                                       "of [A-Za-z0-9_.-], no '.' or '..'",
                                       root_name ? root_name : "(null)");
        if (id && !cgroup_id_is_valid(id))
                return hutch_error_set(err, -EINVAL,
                                       "invalid cgroup id '%s': want 1 to %d of [a-z0-9_-]", id,
                                       CGROUP_ID_MAX);
        return 0;
}

/* ------------------------------------------------------------- limits */

int cgroup_cpu_quota_usec(uint64_t cpu_millis, uint64_t *ret, hutch_error *err) {
        uint64_t per_milli = CGROUP_CPU_PERIOD_USEC / 1000;

        if (cpu_millis > CGROUP_CPU_MILLIS_MAX)
                return hutch_error_set(err, -ERANGE, "cpu limit %" PRIu64 " millis is above %llu",
                                       cpu_millis, CGROUP_CPU_MILLIS_MAX);
        *ret = MAX(cpu_millis * per_milli, CGROUP_CPU_QUOTA_MIN_USEC);
        return 0;
}

/* ------------------------------------------------------------- handle */

hutch_cgroup *cgroup_new(cgroup_version v, const char *id) {
        hutch_cgroup *cg;

        cg = calloc(1, sizeof(*cg));
        if (!cg)
                return NULL;
        cg->version = v;
        cg->dir_fd = -1;
        cg->id = strdup(id);
        if (!cg->id) {
                free(cg);
                return NULL;
        }
        return cg;
}

void cgroup_free(hutch_cgroup *cg) {
        if (!cg)
                return;
        for (int i = 0; i < _CGROUP_V1_MAX; i++)
                free(cg->v1_dir[i]);
        free(cg->dir);
        safe_close(cg->dir_fd);
        free(cg->id);
        free(cg);
}

/* ------------------------------------------------------------- time */

uint64_t cgroup_now_usec(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000ULL + (uint64_t) ts.tv_nsec / 1000ULL;
}

void cgroup_sleep_usec(uint64_t usec) {
        struct timespec ts = {
                .tv_sec = (time_t) (usec / 1000000ULL),
                .tv_nsec = (long) (usec % 1000000ULL) * 1000L,
        };

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* ------------------------------------------------------------- files */

char *cgroup_path_join(const char *a, const char *b) {
        char *p;

        if (asprintf(&p, "%s/%s", a, b) < 0)
                return NULL;
        return p;
}

static int open_in(const char *dir, const char *file, int flags, hutch_error *err) {
        _cleanup_free_ char *p = NULL;
        int fd;

        p = cgroup_path_join(dir, file);
        if (!p)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        fd = open(p, flags | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
                int r = negative_errno();
                return hutch_error_set(err, r, "opening %s: %s", p, strerror(-r));
        }
        return fd;
}

int cgroup_write(const char *dir, const char *file, const char *value, hutch_error *err) {
        _cleanup_close_ int fd = -1;
        size_t len = strlen(value);
        ssize_t n;

        fd = open_in(dir, file, O_WRONLY, err);
        if (fd < 0)
                return fd;
        n = write(fd, value, len);
        if (n < 0) {
                int r = negative_errno();
                return hutch_error_set(err, r, "writing '%s' to %s/%s: %s", value, dir, file,
                                       strerror(-r));
        }
        if ((size_t) n != len)
                return hutch_error_set(err, -EIO, "short write of '%s' to %s/%s", value, dir, file);
        return 0;
}

int cgroup_write_u64(const char *dir, const char *file, uint64_t value, hutch_error *err) {
        char buf[24];

        snprintf(buf, sizeof(buf), "%" PRIu64, value);
        return cgroup_write(dir, file, buf, err);
}

int cgroup_read(const char *dir, const char *file, char **ret, hutch_error *err) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        size_t size = 4096, len = 0;

        fd = open_in(dir, file, O_RDONLY, err);
        if (fd < 0)
                return fd;
        buf = malloc(size);
        if (!buf)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        for (;;) {
                ssize_t n;

                if (len + 1 >= size) {
                        char *nb;

                        if (size >= CGROUP_READ_MAX)
                                return hutch_error_set(err, -EFBIG, "%s/%s is too large", dir, file);
                        nb = realloc(buf, size * 2);
                        if (!nb)
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        buf = nb;
                        size *= 2;
                }
                n = read(fd, buf + len, size - len - 1);
                if (n < 0) {
                        int r;

                        if (errno == EINTR)
                                continue;
                        r = negative_errno();
                        return hutch_error_set(err, r, "reading %s/%s: %s", dir, file, strerror(-r));
                }
                if (n == 0)
                        break;
                len += (size_t) n;
        }
        buf[len] = '\0';
        *ret = TAKE_PTR(buf);
        return 0;
}

static int parse_u64(const char *s, uint64_t *ret) {
        char *end;
        unsigned long long v;

        s += strspn(s, " \t");
        if (startswith(s, "max")) {
                end = (char *) s + 3;
                v = UINT64_MAX;
        } else {
                if (*s < '0' || *s > '9')
                        return -EINVAL;
                errno = 0;
                v = strtoull(s, &end, 10);
                if (errno != 0)
                        return -errno;
        }
        end += strspn(end, " \t\n");
        if (*end != '\0')
                return -EINVAL;
        *ret = v;
        return 0;
}

int cgroup_read_u64(const char *dir, const char *file, uint64_t *ret, hutch_error *err) {
        _cleanup_free_ char *s = NULL;
        uint64_t v;
        int r;

        r = cgroup_read(dir, file, &s, err);
        if (r < 0)
                return r;
        r = parse_u64(s, &v);
        if (r < 0)
                return hutch_error_set(err, r, "unexpected content in %s/%s", dir, file);
        *ret = v;
        return 0;
}

int cgroup_read_key_u64(const char *dir, const char *file, const char *key, uint64_t *ret,
                        hutch_error *err) {
        _cleanup_free_ char *s = NULL;
        size_t klen = strlen(key);
        int r;

        r = cgroup_read(dir, file, &s, err);
        if (r < 0)
                return r;
        for (char *line = s; line && *line;) {
                char *nl = strchr(line, '\n');

                if (nl)
                        *nl = '\0';
                if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
                        uint64_t v;

                        r = parse_u64(line + klen + 1, &v);
                        if (r < 0)
                                return hutch_error_set(err, r, "unexpected '%s' line in %s/%s", key,
                                                       dir, file);
                        *ret = v;
                        return 0;
                }
                line = nl ? nl + 1 : NULL;
        }
        return hutch_error_set(err, -ENODATA, "no '%s' in %s/%s", key, dir, file);
}

bool cgroup_file_exists(const char *dir, const char *file) {
        _cleanup_free_ char *p = NULL;
        struct stat st;

        p = cgroup_path_join(dir, file);
        if (!p)
                return false;
        return fstatat(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

bool cgroup_list_has_word(const char *list, const char *word) {
        size_t wlen = strlen(word);

        for (const char *p = list; p && *p;) {
                size_t n;

                p += strspn(p, " ,\t\n");
                n = strcspn(p, " ,\t\n");
                if (n == wlen && strncmp(p, word, n) == 0)
                        return true;
                p += n;
        }
        return false;
}

/* ------------------------------------------------------------- directories */

int cgroup_mkdir_parents(const char *base, const char *rel,
                         int (*on_dir)(const char *parent, const char *path, void *userdata,
                                       hutch_error *err),
                         void *userdata, hutch_error *err) {
        _cleanup_free_ char *path = NULL;
        size_t base_len = strlen(base), rel_len = strlen(rel);

        path = malloc(base_len + 1 + rel_len + 1);
        if (!path)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        memcpy(path, base, base_len);
        path[base_len] = '/';
        memcpy(path + base_len + 1, rel, rel_len + 1);

        /* Walk rel's components: cut the path after each, mkdir, restore. */
        for (size_t i = base_len + 1;; i++) {
                char c = path[i];
                int r;

                if (c != '/' && c != '\0')
                        continue;
                path[i] = '\0';
                if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                        r = negative_errno();
                        return hutch_error_set(err, r, "creating cgroup %s: %s", path, strerror(-r));
                }
                if (on_dir) {
                        char *slash = strrchr(path, '/');

                        /* parent = path up to the last '/' */
                        *slash = '\0';
                        {
                                _cleanup_free_ char *parent = strdup(path);

                                *slash = '/';
                                if (!parent)
                                        return hutch_error_set(err, -ENOMEM, "out of memory");
                                r = on_dir(parent, path, userdata, err);
                                if (r < 0)
                                        return r;
                        }
                }
                path[i] = c;
                if (c == '\0')
                        break;
        }
        return 0;
}

static int rmdir_tree(const char *dir, unsigned depth, uint64_t deadline, hutch_error *err) {
        DIR *d;
        int r = 0;

        if (depth > CGROUP_TREE_DEPTH_MAX)
                return hutch_error_set(err, -ELOOP, "cgroup tree below %s is too deep", dir);

        d = opendir(dir);
        if (!d) {
                if (errno == ENOENT)
                        return 0;
                r = negative_errno();
                return hutch_error_set(err, r, "opening %s: %s", dir, strerror(-r));
        }
        for (struct dirent *de; (de = readdir(d));) {
                _cleanup_free_ char *sub = NULL;

                if (de->d_type != DT_DIR || streq(de->d_name, ".") || streq(de->d_name, ".."))
                        continue;
                sub = cgroup_path_join(dir, de->d_name);
                if (!sub) {
                        r = hutch_error_set(err, -ENOMEM, "out of memory");
                        break;
                }
                r = rmdir_tree(sub, depth + 1, deadline, err);
                if (r < 0)
                        break;
        }
        closedir(d);
        if (r < 0)
                return r;

        /* EBUSY: tasks that were killed can still hold the cgroup for a
         * moment after cgroup.procs reads empty. */
        for (uint64_t sleep = 1000;; sleep = MIN(sleep * 2, 20000ULL)) {
                if (rmdir(dir) >= 0 || errno == ENOENT)
                        return 0;
                r = negative_errno();
                if (r != -EBUSY || cgroup_now_usec() >= deadline)
                        return hutch_error_set(err, r, "removing cgroup %s: %s", dir, strerror(-r));
                cgroup_sleep_usec(sleep);
        }
}

int cgroup_rmdir_tree(const char *dir, hutch_error *err) {
        return rmdir_tree(dir, 0, cgroup_now_usec() + CGROUP_RMDIR_TIMEOUT_USEC, err);
}

/* ------------------------------------------------------------- processes */

int cgroup_read_pids(const char *dir, pid_t **ret_pids, size_t *ret_n, hutch_error *err) {
        _cleanup_free_ char *s = NULL;
        _cleanup_free_ pid_t *pids = NULL;
        size_t n = 0, cap = 0;
        int r;

        r = cgroup_read(dir, "cgroup.procs", &s, err);
        if (r < 0)
                return r;
        for (char *p = s; *p;) {
                char *end;
                long v;

                if (*p == '\n') {
                        p++;
                        continue;
                }
                errno = 0;
                v = strtol(p, &end, 10);
                if (errno != 0 || end == p || v <= 0 || v > INT32_MAX || (*end != '\n' && *end))
                        return hutch_error_set(err, -EINVAL,
                                               "unexpected content in %s/cgroup.procs", dir);
                if (n == cap) {
                        pid_t *np;

                        cap = cap ? cap * 2 : 16;
                        np = realloc(pids, cap * sizeof(pid_t));
                        if (!np)
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        pids = np;
                }
                pids[n++] = (pid_t) v;
                p = end;
        }
        *ret_pids = TAKE_PTR(pids);
        *ret_n = n;
        return 0;
}

static int kill_procs(const char *dir, bool recursive, unsigned depth, hutch_error *err) {
        _cleanup_free_ pid_t *pids = NULL;
        size_t n = 0;
        int r, count = 0;

        if (depth > CGROUP_TREE_DEPTH_MAX)
                return hutch_error_set(err, -ELOOP, "cgroup tree below %s is too deep", dir);

        r = cgroup_read_pids(dir, &pids, &n, err);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                /* ESRCH: it exited between the read and the kill. */
                if (kill(pids[i], SIGKILL) < 0 && errno != ESRCH) {
                        r = negative_errno();
                        return hutch_error_set(err, r, "killing pid %d of %s: %s", (int) pids[i],
                                               dir, strerror(-r));
                }
                count++;
        }

        if (recursive) {
                DIR *d = opendir(dir);

                if (!d) {
                        r = negative_errno();
                        return hutch_error_set(err, r, "opening %s: %s", dir, strerror(-r));
                }
                for (struct dirent *de; (de = readdir(d));) {
                        _cleanup_free_ char *sub = NULL;

                        if (de->d_type != DT_DIR || streq(de->d_name, ".") || streq(de->d_name, ".."))
                                continue;
                        sub = cgroup_path_join(dir, de->d_name);
                        if (!sub) {
                                closedir(d);
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        }
                        r = kill_procs(sub, true, depth + 1, err);
                        if (r < 0) {
                                closedir(d);
                                return r;
                        }
                        count += r;
                }
                closedir(d);
        }
        return count;
}

int cgroup_kill_procs(const char *dir, bool recursive, hutch_error *err) {
        return kill_procs(dir, recursive, 0, err);
}

int cgroup_count_procs_in(const char *dir) {
        _cleanup_free_ char *s = NULL;
        int r, n = 0;

        r = cgroup_read(dir, "cgroup.procs", &s, NULL);
        if (r < 0)
                return r;
        for (char *p = s; *p; p++)
                if (*p == '\n')
                        n++;
        return n;
}

/* ------------------------------------------------------------- lists */

void cgroup_strv_free(char **l) {
        if (!l)
                return;
        for (char **p = l; *p; p++)
                free(*p);
        free(l);
}

bool cgroup_strv_contains(char *const *l, const char *s) {
        if (!l)
                return false;
        for (char *const *p = l; *p; p++)
                if (streq(*p, s))
                        return true;
        return false;
}

int cgroup_list_children(const char *dir, char ***ret, hutch_error *err) {
        _cleanup_strv_ char **l = NULL;
        size_t n = 0, cap = 8;
        DIR *d;
        int r = 0;

        l = calloc(cap, sizeof(char *));
        if (!l)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        d = opendir(dir);
        if (!d) {
                if (errno == ENOENT) {
                        *ret = TAKE_PTR(l);
                        return 0;
                }
                r = negative_errno();
                return hutch_error_set(err, r, "opening %s: %s", dir, strerror(-r));
        }
        for (struct dirent *de; (de = readdir(d));) {
                if (de->d_type != DT_DIR || !cgroup_id_is_valid(de->d_name))
                        continue;
                if (n + 1 >= cap) {
                        char **nl = realloc(l, cap * 2 * sizeof(char *));

                        if (!nl) {
                                r = hutch_error_set(err, -ENOMEM, "out of memory");
                                break;
                        }
                        l = nl;
                        cap *= 2;
                }
                l[n] = strdup(de->d_name);
                if (!l[n]) {
                        r = hutch_error_set(err, -ENOMEM, "out of memory");
                        break;
                }
                l[++n] = NULL;
        }
        closedir(d);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(l);
        return 0;
}

/* ------------------------------------------------------------- detection */

static bool is_cgroup2(const char *path) {
        struct statfs fs;

        return statfs(path, &fs) == 0 && fs.f_type == (typeof(fs.f_type)) CGROUP2_SUPER_MAGIC;
}

static int v1_has_memory(hutch_error *err) {
        char *mounts[_CGROUP_V1_MAX] = {};
        bool has;
        int r;

        r = cgroup_v1_find_mounts(mounts, err);
        if (r < 0)
                return r;
        has = mounts[CGROUP_V1_MEMORY] != NULL;
        cgroup_v1_mounts_free(mounts);
        return has;
}

int cgroup_detect(const char *override, cgroup_version *ret_version, char **ret_mount_point,
                  hutch_error *err) {
        const char *mount_point;
        cgroup_version v;
        char *m;
        int r;

        if (!override || streq(override, "") || streq(override, "auto")) {
                if (is_cgroup2("/sys/fs/cgroup")) {
                        v = CGROUP_V2;
                        mount_point = "/sys/fs/cgroup";
                } else {
                        r = v1_has_memory(err);
                        if (r < 0)
                                return r;
                        if (r > 0) {
                                v = CGROUP_V1;
                                mount_point = "/sys/fs/cgroup";
                        } else if (is_cgroup2("/sys/fs/cgroup/unified")) {
                                v = CGROUP_V2;
                                mount_point = "/sys/fs/cgroup/unified";
                        } else
                                return hutch_error_set(err, -ENODEV,
                                                       "no cgroup hierarchy found: neither cgroup2 "
                                                       "at /sys/fs/cgroup nor a v1 memory "
                                                       "controller is mounted");
                }
        } else if (streq(override, "v1")) {
                r = v1_has_memory(err);
                if (r < 0)
                        return r;
                if (r == 0)
                        return hutch_error_set(err, -ENODEV,
                                               "cgroup v1 requested but no v1 memory controller "
                                               "is mounted");
                v = CGROUP_V1;
                mount_point = "/sys/fs/cgroup";
        } else if (streq(override, "v2")) {
                v = CGROUP_V2;
                if (is_cgroup2("/sys/fs/cgroup"))
                        mount_point = "/sys/fs/cgroup";
                else if (is_cgroup2("/sys/fs/cgroup/unified"))
                        mount_point = "/sys/fs/cgroup/unified"; /* hybrid host */
                else
                        return hutch_error_set(err, -ENODEV,
                                               "cgroup v2 requested but cgroup2 is mounted neither "
                                               "at /sys/fs/cgroup nor at /sys/fs/cgroup/unified");
        } else
                return hutch_error_set(err, -EINVAL,
                                       "unknown cgroup backend '%s': want v1, v2 or auto", override);

        m = strdup(mount_point);
        if (!m)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        *ret_version = v;
        *ret_mount_point = m;
        return 0;
}

/* ------------------------------------------------------------- dispatch */

int cgroup_create(cgroup_version v, const char *mount_point, const char *root_name, const char *id,
                  const hutch_limits *limits, hutch_cgroup **ret, hutch_error *err) {
        int r;

        r = cgroup_check_names(root_name, id, err);
        if (r < 0)
                return r;
        switch (v) {
        case CGROUP_V1:
                return cgroup_v1_create(root_name, id, limits, ret, err);
        case CGROUP_V2:
                if (!mount_point)
                        return hutch_error_set(err, -EINVAL, "cgroup v2 needs a mount point");
                return cgroup_v2_create(mount_point, root_name, id, limits, ret, err);
        }
        return hutch_error_set(err, -EINVAL, "unknown cgroup version %d", (int) v);
}

int cgroup_open(cgroup_version v, const char *mount_point, const char *root_name, const char *id,
                hutch_cgroup **ret, hutch_error *err) {
        int r;

        r = cgroup_check_names(root_name, id, err);
        if (r < 0)
                return r;
        switch (v) {
        case CGROUP_V1:
                return cgroup_v1_open(root_name, id, ret, err);
        case CGROUP_V2:
                if (!mount_point)
                        return hutch_error_set(err, -EINVAL, "cgroup v2 needs a mount point");
                return cgroup_v2_open(mount_point, root_name, id, ret, err);
        }
        return hutch_error_set(err, -EINVAL, "unknown cgroup version %d", (int) v);
}

int cgroup_clone_fd(const hutch_cgroup *cg) {
        if (!cg || cg->version != CGROUP_V2)
                return -1;
        return cg->dir_fd;
}

int cgroup_procs_fds(hutch_cgroup *cg, int *fds, size_t max, hutch_error *err) {
        size_t n = 0;
        const char *dirs[_CGROUP_V1_MAX + 1];
        size_t nd = 0;
        if (cg->version == CGROUP_V2)
                dirs[nd++] = cg->dir;
        else
                for (int c = 0; c < _CGROUP_V1_MAX; c++)
                        if (cg->v1_dir[c] && !cgroup_v1_dir_is_dup(cg, c))
                                dirs[nd++] = cg->v1_dir[c];
        for (size_t i = 0; i < nd; i++) {
                char path[PATH_MAX];
                if (n == max) {
                        for (size_t k = 0; k < n; k++)
                                close(fds[k]);
                        return hutch_error_set(err, -E2BIG, "too many cgroup hierarchies");
                }
                snprintf(path, sizeof path, "%s/cgroup.procs", dirs[i]);
                int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
                if (fd < 0) {
                        int r = -errno;
                        for (size_t k = 0; k < n; k++)
                                close(fds[k]);
                        return hutch_error_set(err, r, "opening %s: %s", path, strerror(-r));
                }
                fds[n++] = fd;
        }
        return (int) n;
}

int cgroup_attach_pid(hutch_cgroup *cg, pid_t pid, hutch_error *err) {
        if (pid <= 0)
                return hutch_error_set(err, -EINVAL, "invalid pid %d", (int) pid);
        return cg->version == CGROUP_V1 ? cgroup_v1_attach_pid(cg, pid, err)
                                        : cgroup_v2_attach_pid(cg, pid, err);
}

int cgroup_freeze(hutch_cgroup *cg, hutch_error *err) {
        return cg->version == CGROUP_V1 ? cgroup_v1_freeze(cg, err) : cgroup_v2_freeze(cg, err);
}

int cgroup_thaw(hutch_cgroup *cg, hutch_error *err) {
        return cg->version == CGROUP_V1 ? cgroup_v1_thaw(cg, err) : cgroup_v2_thaw(cg, err);
}

int cgroup_is_frozen(hutch_cgroup *cg) {
        return cg->version == CGROUP_V1 ? cgroup_v1_is_frozen(cg) : cgroup_v2_is_frozen(cg);
}

int cgroup_kill_all(hutch_cgroup *cg, hutch_error *err) {
        return cg->version == CGROUP_V1 ? cgroup_v1_kill_all(cg, err) : cgroup_v2_kill_all(cg, err);
}

int cgroup_destroy(hutch_cgroup *cg, hutch_error *err) {
        return cg->version == CGROUP_V1 ? cgroup_v1_destroy(cg, err) : cgroup_v2_destroy(cg, err);
}

int cgroup_count_procs(hutch_cgroup *cg) {
        return cg->version == CGROUP_V1 ? cgroup_v1_count_procs(cg) : cgroup_v2_count_procs(cg);
}

int cgroup_stats(hutch_cgroup *cg, hutch_stats *ret, hutch_error *err) {
        return cg->version == CGROUP_V1 ? cgroup_v1_stats(cg, ret, err)
                                        : cgroup_v2_stats(cg, ret, err);
}

int cgroup_prune(cgroup_version v, const char *mount_point, const char *root_name,
                 char *const *keep, hutch_error *err) {
        int r;

        r = cgroup_check_names(root_name, NULL, err);
        if (r < 0)
                return r;
        switch (v) {
        case CGROUP_V1:
                return cgroup_v1_prune(root_name, keep, err);
        case CGROUP_V2:
                if (!mount_point)
                        return hutch_error_set(err, -EINVAL, "cgroup v2 needs a mount point");
                return cgroup_v2_prune(mount_point, root_name, keep, err);
        }
        return hutch_error_set(err, -EINVAL, "unknown cgroup version %d", (int) v);
}

int cgroup_allow_devices(hutch_cgroup *cg, const char (*rules)[32], size_t n, hutch_error *err) {
        if (n == 0 || cg->version == CGROUP_V2)
                return 0;
        return cgroup_v1_allow_devices(cg, rules, n, err);
}

int cgroup_list_pids(hutch_cgroup *cg, pid_t **ret_pids, size_t *ret_n, hutch_error *err) {
        const char *dir = NULL;
        if (cg->version == CGROUP_V2)
                dir = cg->dir;
        else
                for (int c = 0; c < _CGROUP_V1_MAX && !dir; c++)
                        dir = cg->v1_dir[c];
        if (!dir)
                return hutch_error_set(err, -ENOENT, "cgroup %s has no directory", cg->id);
        return cgroup_read_pids(dir, ret_pids, ret_n, err);
}

int cgroup_signal_others(hutch_cgroup *cg, pid_t keep, int sig) {
        const char *dir = NULL;
        if (cg->version == CGROUP_V2)
                dir = cg->dir;
        else
                for (int c = 0; c < _CGROUP_V1_MAX && !dir; c++)
                        dir = cg->v1_dir[c];
        if (!dir)
                return -ENOENT;
        _cleanup_free_ pid_t *pids = NULL;
        size_t n = 0;
        int r = cgroup_read_pids(dir, &pids, &n, NULL);
        if (r < 0)
                return r;
        int count = 0;
        for (size_t i = 0; i < n; i++)
                if (pids[i] != keep && (kill(pids[i], sig) == 0 || errno != ESRCH))
                        count++;
        return count;
}
