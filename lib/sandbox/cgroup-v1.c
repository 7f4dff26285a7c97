/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cgroups v1 (legacy and hybrid hosts): one hierarchy per controller, each
 * mounted where /proc/self/mountinfo says (cpu and cpuacct are often
 * co-mounted as "cpu,cpuacct"). A sandbox's cgroup is <root_name>/<id> in
 * each hierarchy, relative to the hierarchy's root, not to the cgroup hutch
 * itself runs in.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sandbox/cgroup-internal.h"
#include "util/parse.h"

/* Without these a sandbox has no memory, pids or cpu limit, or cannot be
 * frozen and killed reliably; the rest are used when mounted. */
static const bool v1_required[_CGROUP_V1_MAX] = {
        [CGROUP_V1_MEMORY] = true,
        [CGROUP_V1_PIDS] = true,
        [CGROUP_V1_CPU] = true,
        [CGROUP_V1_FREEZER] = true,
};

/* The devices a sandbox may open (docs/design.md §4): null, zero, full, random,
 * urandom, tty, console, ptmx and the pts slaves. Everything else, block
 * devices included, is denied by the devices controller as well as by the
 * minimal /dev. */
static const char *const v1_devices_allow[] = {
        "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm",   "c 1:9 rwm",
        "c 5:0 rwm", "c 5:1 rwm", "c 5:2 rwm", "c 136:* rwm",
};

/* A memory limit at or above this is the kernel's "unlimited"
 * (PAGE_COUNTER_MAX pages, 0x7ffffffffffff000 on 64-bit). */
#define V1_MEMORY_UNLIMITED (1ULL << 62)

void cgroup_v1_mounts_free(char *mounts[_CGROUP_V1_MAX]) {
        for (int i = 0; i < _CGROUP_V1_MAX; i++)
                mounts[i] = (free(mounts[i]), NULL);
}

static void v1_mounts_freep(char *(*mounts)[_CGROUP_V1_MAX]) {
        cgroup_v1_mounts_free(*mounts);
}


int cgroup_v1_parse_mountinfo(FILE *f, char *ret_mounts[_CGROUP_V1_MAX], hutch_error *err) {
        char *mounts[_CGROUP_V1_MAX] = {};
        _cleanup_free_ char *line = NULL;
        size_t cap = 0;

        while (getline(&line, &cap, f) > 0) {
                char *fields[5], *p = line, *sep, *fstype, *superopts;
                int n;

                /* "id parent maj:min root mount_point opts [optional...] - fstype source superopts" */
                for (n = 0; n < 5; n++) {
                        fields[n] = strsep(&p, " ");
                        if (!fields[n] || !p)
                                break;
                }
                if (n < 5 || !p)
                        continue;
                sep = strstr(p, " - ");
                if (!sep && startswith(p, "- "))
                        sep = p - 1;
                if (!sep)
                        continue;
                p = sep + 3;
                fstype = strsep(&p, " ");
                if (!fstype || !streq(fstype, "cgroup") || !p)
                        continue;
                (void) strsep(&p, " "); /* source */
                superopts = p ? strsep(&p, " \n") : NULL;
                if (!superopts)
                        continue;

                for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                        if (mounts[c] ||
                            !cgroup_list_has_word(superopts, cgroup_v1_controller_name(c)))
                                continue;
                        mounts[c] = strdup(fields[4]);
                        if (!mounts[c]) {
                                cgroup_v1_mounts_free(mounts);
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        }
                        unescape_octal(mounts[c]);
                }
        }
        memcpy(ret_mounts, mounts, sizeof(mounts));
        return 0;
}

int cgroup_v1_find_mounts(char *ret_mounts[_CGROUP_V1_MAX], hutch_error *err) {
        FILE *f;
        int r;

        f = fopen("/proc/self/mountinfo", "re");
        if (!f) {
                r = negative_errno();
                return hutch_error_set(err, r, "opening /proc/self/mountinfo: %s", strerror(-r));
        }
        r = cgroup_v1_parse_mountinfo(f, ret_mounts, err);
        fclose(f);
        return r;
}

/* A handle whose v1_dir[] names <mount>/<root_name>/<id> for every mounted
 * controller, whether the directory exists or not. */
static int v1_new(const char *root_name, const char *id, char *mounts[_CGROUP_V1_MAX],
                  hutch_cgroup **ret, hutch_error *err) {
        _cleanup_cgroup_ hutch_cgroup *cg = NULL;

        cg = cgroup_new(CGROUP_V1, id);
        if (!cg)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                if (!mounts[c])
                        continue;
                if (asprintf(&cg->v1_dir[c], "%s/%s/%s", mounts[c], root_name, id) < 0) {
                        cg->v1_dir[c] = NULL;
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                }
        }
        *ret = TAKE_PTR(cg);
        return 0;
}

static bool is_blank(const char *s) {
        return s[strspn(s, " \t\n")] == '\0';
}

/* A new cpuset cgroup starts with empty cpus and mems (unless
 * cgroup.clone_children is set), and a task cannot join it (ENOSPC) until
 * both are filled: copy them from the parent, level by level. */
static int cpuset_inherit(const char *parent, const char *path, void *userdata, hutch_error *err) {
        static const char *const files[] = { "cpuset.cpus", "cpuset.mems" };

        for (size_t i = 0; i < ELEMENTSOF(files); i++) {
                _cleanup_free_ char *cur = NULL, *want = NULL;
                int r;

                r = cgroup_read(path, files[i], &cur, err);
                if (r < 0)
                        return r;
                if (!is_blank(cur))
                        continue;
                r = cgroup_read(parent, files[i], &want, err);
                if (r < 0)
                        return r;
                want[strcspn(want, "\n")] = '\0';
                if (is_blank(want))
                        return hutch_error_set(err, -EINVAL, "%s/%s is empty", parent, files[i]);
                r = cgroup_write(path, files[i], want, err);
                if (r < 0)
                        return r;
        }
        return 0;
}

static bool v1_is_cpuset_dir(const hutch_cgroup *cg, int c) {
        return cg->v1_dir[CGROUP_V1_CPUSET] && streq(cg->v1_dir[c], cg->v1_dir[CGROUP_V1_CPUSET]);
}

static int v1_make_dirs(hutch_cgroup *cg, char *mounts[_CGROUP_V1_MAX], const char *root_name,
                        bool created[_CGROUP_V1_MAX], hutch_error *err) {
        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                _cleanup_free_ char *parent = NULL;
                bool cpuset;
                int r;

                if (!cg->v1_dir[c] || cgroup_v1_dir_is_dup(cg, c))
                        continue;
                cpuset = v1_is_cpuset_dir(cg, c);

                r = cgroup_mkdir_parents(mounts[c], root_name, cpuset ? cpuset_inherit : NULL, NULL,
                                         err);
                if (r < 0)
                        return r;
                if (mkdir(cg->v1_dir[c], 0755) < 0) {
                        r = negative_errno();
                        return hutch_error_set(err, r, "creating cgroup %s: %s", cg->v1_dir[c],
                                               strerror(-r));
                }
                created[c] = true;
                if (cpuset) {
                        if (asprintf(&parent, "%s/%s", mounts[c], root_name) < 0) {
                                parent = NULL;
                                return hutch_error_set(err, -ENOMEM, "out of memory");
                        }
                        r = cpuset_inherit(parent, cg->v1_dir[c], NULL, err);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int v1_apply_limits(hutch_cgroup *cg, const hutch_limits *limits, hutch_error *err) {
        const char *mem = cg->v1_dir[CGROUP_V1_MEMORY], *cpu = cg->v1_dir[CGROUP_V1_CPU];
        const char *devices = cg->v1_dir[CGROUP_V1_DEVICES];
        int r;

        if (limits && limits->memory_bytes > 0) {
                /* limit first: memsw must never be below it. */
                r = cgroup_write_u64(mem, "memory.limit_in_bytes", limits->memory_bytes, err);
                if (r < 0)
                        return r;
                /* Absent when swap accounting is off (swapaccount=0). */
                if (cgroup_file_exists(mem, "memory.memsw.limit_in_bytes")) {
                        r = cgroup_write_u64(mem, "memory.memsw.limit_in_bytes",
                                             limits->memory_bytes, err);
                        if (r < 0)
                                return r;
                }
        }
        r = cgroup_write(mem, "memory.swappiness", "0", err);
        if (r < 0)
                return r;
        /* A new memcg inherits oom_kill_disable from its parent; a sandbox
         * that hits its limit must lose a process, not hang. */
        r = cgroup_write(mem, "memory.oom_control", "0", err);
        if (r < 0)
                return r;

        if (limits && limits->pids > 0) {
                r = cgroup_write_u64(cg->v1_dir[CGROUP_V1_PIDS], "pids.max", limits->pids, err);
                if (r < 0)
                        return r;
        }

        if (limits && limits->cpu_millis > 0) {
                uint64_t quota;

                r = cgroup_cpu_quota_usec(limits->cpu_millis, &quota, err);
                if (r < 0)
                        return r;
                r = cgroup_write_u64(cpu, "cpu.cfs_period_us", CGROUP_CPU_PERIOD_USEC, err);
                if (r < 0)
                        return r;
                r = cgroup_write_u64(cpu, "cpu.cfs_quota_us", quota, err);
                if (r < 0)
                        return r;
        }

        if (devices) {
                /* Each line is one rule, so one write each. */
                r = cgroup_write(devices, "devices.deny", "a", err);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < ELEMENTSOF(v1_devices_allow); i++) {
                        r = cgroup_write(devices, "devices.allow", v1_devices_allow[i], err);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

int cgroup_v1_allow_devices(hutch_cgroup *cg, const char (*rules)[32], size_t n, hutch_error *err) {
        const char *devices = cg->v1_dir[CGROUP_V1_DEVICES];
        if (!devices)
                return 0; /* no controller: no list to extend (the deny-all was not written either) */
        for (size_t i = 0; i < n; i++) {
                /* "c MAJ:MIN rw": never "a", never a wildcard, never mknod */
                unsigned maj, min;
                char acc[4];
                int used = 0;
                if (sscanf(rules[i], "c %u:%u %3s%n", &maj, &min, acc, &used) != 3 || rules[i][used] ||
                    (!streq(acc, "rw") && !streq(acc, "r") && !streq(acc, "w")))
                        return hutch_error_set(err, -EINVAL, "device rule '%.31s' is not \"c MAJ:MIN rw\"", rules[i]);
                int r = cgroup_write(devices, "devices.allow", rules[i], err);
                if (r < 0)
                        return r;
        }
        return 0;
}

int cgroup_v1_create(const char *root_name, const char *id, const hutch_limits *limits,
                     hutch_cgroup **ret, hutch_error *err) {
        _cleanup_(v1_mounts_freep) char *mounts[_CGROUP_V1_MAX] = {};
        _cleanup_cgroup_ hutch_cgroup *cg = NULL;
        bool created[_CGROUP_V1_MAX] = {};
        int r;

        r = cgroup_v1_find_mounts(mounts, err);
        if (r < 0)
                return r;
        for (int c = 0; c < _CGROUP_V1_MAX; c++)
                if (v1_required[c] && !mounts[c])
                        return hutch_error_set(err, -ENODEV,
                                               "cgroup v1 controller '%s' is not mounted",
                                               cgroup_v1_controller_name(c));

        r = v1_new(root_name, id, mounts, &cg, err);
        if (r < 0)
                return r;

        r = v1_make_dirs(cg, mounts, root_name, created, err);
        if (r >= 0)
                r = v1_apply_limits(cg, limits, err);
        if (r < 0) {
                /* Remove only what this call made: on EEXIST the other
                 * directories belong to the sandbox that has this id. */
                for (int c = 0; c < _CGROUP_V1_MAX; c++)
                        if (created[c])
                                (void) cgroup_rmdir_tree(cg->v1_dir[c], NULL);
                return r;
        }
        *ret = TAKE_PTR(cg);
        return 0;
}

/* Keep the directories that exist; -ENOENT when none does. */
static int v1_open_with(char *mounts[_CGROUP_V1_MAX], const char *root_name, const char *id,
                        hutch_cgroup **ret, hutch_error *err) {
        _cleanup_cgroup_ hutch_cgroup *cg = NULL;
        bool any = false;
        int r;

        r = v1_new(root_name, id, mounts, &cg, err);
        if (r < 0)
                return r;
        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                struct stat st;

                if (!cg->v1_dir[c])
                        continue;
                if (stat(cg->v1_dir[c], &st) < 0 || !S_ISDIR(st.st_mode))
                        cg->v1_dir[c] = (free(cg->v1_dir[c]), NULL);
                else
                        any = true;
        }
        if (!any)
                return hutch_error_set(err, -ENOENT, "cgroup %s/%s does not exist", root_name, id);
        *ret = TAKE_PTR(cg);
        return 0;
}

int cgroup_v1_open(const char *root_name, const char *id, hutch_cgroup **ret, hutch_error *err) {
        _cleanup_(v1_mounts_freep) char *mounts[_CGROUP_V1_MAX] = {};
        int r;

        r = cgroup_v1_find_mounts(mounts, err);
        if (r < 0)
                return r;
        return v1_open_with(mounts, root_name, id, ret, err);
}

int cgroup_v1_attach_pid(hutch_cgroup *cg, pid_t pid, hutch_error *err) {
        char buf[16];

        snprintf(buf, sizeof(buf), "%d", (int) pid);
        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                int r;

                if (!cg->v1_dir[c] || cgroup_v1_dir_is_dup(cg, c))
                        continue;
                r = cgroup_write(cg->v1_dir[c], "cgroup.procs", buf, err);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int freezer_state(const hutch_cgroup *cg, char **ret, hutch_error *err) {
        char *s;
        int r;

        r = cgroup_read(cg->v1_dir[CGROUP_V1_FREEZER], "freezer.state", &s, err);
        if (r < 0)
                return r;
        s[strcspn(s, "\n")] = '\0';
        *ret = s;
        return 0;
}

int cgroup_v1_freeze(hutch_cgroup *cg, hutch_error *err) {
        const char *dir = cg->v1_dir[CGROUP_V1_FREEZER];
        uint64_t deadline = cgroup_now_usec() + CGROUP_FREEZE_TIMEOUT_USEC;
        int r;

        if (!dir)
                return hutch_error_set(err, -EOPNOTSUPP, "cgroup %s has no freezer", cg->id);
        r = cgroup_write(dir, "freezer.state", "FROZEN", err);
        if (r < 0)
                return r;
        /* FREEZING until every task has stopped; no notification on v1. */
        for (uint64_t sleep = 100;; sleep = MIN(sleep * 2, 10000ULL)) {
                _cleanup_free_ char *state = NULL;

                r = freezer_state(cg, &state, err);
                if (r < 0)
                        return r;
                if (streq(state, "FROZEN"))
                        return 0;
                if (cgroup_now_usec() >= deadline)
                        break;
                cgroup_sleep_usec(sleep);
        }
        /* Do not leave it half frozen: a failed pause leaves the sandbox
         * running. */
        (void) cgroup_write(dir, "freezer.state", "THAWED", NULL);
        return hutch_error_set(err, -ETIMEDOUT, "freezing %s timed out", dir);
}

int cgroup_v1_thaw(hutch_cgroup *cg, hutch_error *err) {
        const char *dir = cg->v1_dir[CGROUP_V1_FREEZER];

        if (!dir)
                return hutch_error_set(err, -EOPNOTSUPP, "cgroup %s has no freezer", cg->id);
        return cgroup_write(dir, "freezer.state", "THAWED", err);
}

int cgroup_v1_is_frozen(hutch_cgroup *cg) {
        _cleanup_free_ char *state = NULL;

        if (!cg->v1_dir[CGROUP_V1_FREEZER] || freezer_state(cg, &state, NULL) < 0)
                return 0;
        return streq(state, "FROZEN");
}

static int v1_count_all(hutch_cgroup *cg) {
        int total = 0;

        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                int n;

                if (!cg->v1_dir[c] || cgroup_v1_dir_is_dup(cg, c))
                        continue;
                n = cgroup_count_procs_in(cg->v1_dir[c]);
                if (n == -ENOENT)
                        continue;
                if (n < 0)
                        return n;
                total += n;
        }
        return total;
}

/* No cgroup.kill on v1. Freezing first means nothing in the cgroup can fork
 * or exit between reading cgroup.procs and kill(), so the pids read are the
 * processes signalled; SIGKILL is delivered when the freezer lets go. Every
 * hierarchy's procs are read in case an attach was interrupted half way. */
int cgroup_v1_kill_all(hutch_cgroup *cg, hutch_error *err) {
        const char *freezer = cg->v1_dir[CGROUP_V1_FREEZER];
        uint64_t deadline = cgroup_now_usec() + CGROUP_KILL_TIMEOUT_USEC;
        int n, r, kill_r = 0;

        for (uint64_t sleep = 500;; sleep = MIN(sleep * 2, 20000ULL)) {
                if (freezer)
                        (void) cgroup_write(freezer, "freezer.state", "FROZEN", NULL);
                for (int c = 0; c < _CGROUP_V1_MAX && kill_r >= 0; c++) {
                        if (!cg->v1_dir[c] || cgroup_v1_dir_is_dup(cg, c))
                                continue;
                        r = cgroup_kill_procs(cg->v1_dir[c], true, NULL);
                        if (r < 0 && r != -ENOENT)
                                kill_r = hutch_error_set(err, r, "killing the processes of %s: %s",
                                                         cg->v1_dir[c], strerror(-r));
                }
                /* Thaw even after a failure: never leave a sandbox frozen
                 * behind an error. */
                if (freezer) {
                        r = cgroup_write(freezer, "freezer.state", "THAWED", kill_r < 0 ? NULL : err);
                        if (r < 0 && r != -ENOENT && kill_r >= 0)
                                return r;
                }
                if (kill_r < 0)
                        return kill_r;
                n = v1_count_all(cg);
                if (n < 0)
                        return hutch_error_set(err, n, "counting the processes of cgroup %s: %s",
                                               cg->id, strerror(-n));
                if (n == 0)
                        return 0;
                if (cgroup_now_usec() >= deadline)
                        return hutch_error_set(err, -ETIMEDOUT,
                                               "%d processes still in cgroup %s after SIGKILL", n,
                                               cg->id);
                cgroup_sleep_usec(sleep);
        }
}

int cgroup_v1_destroy(hutch_cgroup *cg, hutch_error *err) {
        int ret = 0;

        /* Every hierarchy, even after a failure: a half-removed sandbox is
         * finished by cgroup_prune() later. */
        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                int r;

                if (!cg->v1_dir[c] || cgroup_v1_dir_is_dup(cg, c))
                        continue;
                r = cgroup_rmdir_tree(cg->v1_dir[c], ret < 0 ? NULL : err);
                if (r < 0 && ret == 0)
                        ret = r;
        }
        return ret;
}

int cgroup_v1_count_procs(hutch_cgroup *cg) {
        const char *dir = cg->v1_dir[CGROUP_V1_FREEZER];

        if (!dir)
                dir = cg->v1_dir[CGROUP_V1_MEMORY];
        if (!dir)
                return v1_count_all(cg);
        return cgroup_count_procs_in(dir);
}

/* A controller that is not mounted leaves its fields 0. */
static int read_optional_u64(const char *dir, const char *file, uint64_t *ret, hutch_error *err) {
        if (!dir)
                return 0;
        return cgroup_read_u64(dir, file, ret, err);
}

int cgroup_v1_stats(hutch_cgroup *cg, hutch_stats *ret, hutch_error *err) {
        const char *mem = cg->v1_dir[CGROUP_V1_MEMORY];
        hutch_stats s = {};
        int r;

        r = read_optional_u64(mem, "memory.usage_in_bytes", &s.memory_current, err);
        if (r < 0)
                return r;
        r = read_optional_u64(mem, "memory.max_usage_in_bytes", &s.memory_peak, err);
        if (r < 0)
                return r;
        r = read_optional_u64(mem, "memory.limit_in_bytes", &s.memory_limit, err);
        if (r < 0)
                return r;
        if (s.memory_limit >= V1_MEMORY_UNLIMITED)
                s.memory_limit = 0;
        if (mem) {
                /* The "oom_kill" line arrived in 4.13. */
                r = cgroup_read_key_u64(mem, "memory.oom_control", "oom_kill", &s.oom_kills, NULL);
                if (r < 0 && r != -ENODATA)
                        return hutch_error_set(err, r, "reading %s/memory.oom_control: %s", mem,
                                               strerror(-r));
        }
        r = read_optional_u64(cg->v1_dir[CGROUP_V1_CPUACCT], "cpuacct.usage", &s.cpu_usage_ns, err);
        if (r < 0)
                return r;
        r = read_optional_u64(cg->v1_dir[CGROUP_V1_PIDS], "pids.current", &s.pids_current, err);
        if (r < 0)
                return r;
        *ret = s;
        return 0;
}

int cgroup_v1_prune(const char *root_name, char *const *keep, hutch_error *err) {
        _cleanup_(v1_mounts_freep) char *mounts[_CGROUP_V1_MAX] = {};
        int r, ret = 0;

        r = cgroup_v1_find_mounts(mounts, err);
        if (r < 0)
                return r;

        /* A sandbox half created or half destroyed exists in only some
         * hierarchies: look in each. */
        for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                _cleanup_strv_ char **names = NULL;
                _cleanup_free_ char *parent = NULL;

                if (!mounts[c])
                        continue;
                parent = cgroup_path_join(mounts[c], root_name);
                if (!parent)
                        return hutch_error_set(err, -ENOMEM, "out of memory");
                r = cgroup_list_children(parent, &names, err);
                if (r < 0)
                        return r;
                for (char **n = names; *n; n++) {
                        _cleanup_cgroup_ hutch_cgroup *cg = NULL;

                        if (cgroup_strv_contains(keep, *n))
                                continue;
                        r = v1_open_with(mounts, root_name, *n, &cg, NULL);
                        if (r == -ENOENT)
                                continue; /* removed while pruning an earlier hierarchy */
                        if (r < 0 && ret == 0)
                                r = hutch_error_set(err, r, "opening cgroup %s/%s: %s", root_name,
                                                    *n, strerror(-r));
                        if (r >= 0)
                                r = cgroup_v1_kill_all(cg, ret < 0 ? NULL : err);
                        if (r >= 0)
                                r = cgroup_v1_destroy(cg, ret < 0 ? NULL : err);
                        if (r < 0 && ret == 0)
                                ret = r;
                }
        }
        return ret;
}
