/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cgroups v2 (the unified hierarchy): <mount>/<root_name>/<id>, with memory,
 * pids and cpu enabled down to it. Freezing (cgroup.freeze), killing
 * (cgroup.kill) and CLONE_INTO_CGROUP are core cgroup2 features, so they
 * work even where no controller is available, as on a hybrid host whose
 * controllers are all bound to v1 hierarchies (docs/cgroups.md).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sandbox/cgroup-internal.h"

static const char *const v2_wanted[] = { "memory", "pids", "cpu" };

/* The largest wait between two reads of cgroup.events, in case a change
 * notification (POLLPRI) is missed. */
#define V2_EVENTS_POLL_MAX_MSEC 100

/* Enable the wanted controllers in dir's cgroup.subtree_control, so that
 * its children get them. root_controllers is cgroup.controllers of the
 * hierarchy's root: a controller absent there is absent from the whole
 * hierarchy and skipped; one present there that cannot be enabled here is an
 * error (the sandbox would run without a limit it was promised). */
static int v2_enable_controllers(const char *dir, const char *root_controllers, hutch_error *err) {
        _cleanup_free_ char *avail = NULL, *enabled = NULL;
        char buf[64] = "";
        size_t len = 0;
        int r;

        r = cgroup_read(dir, "cgroup.controllers", &avail, err);
        if (r < 0)
                return r;
        r = cgroup_read(dir, "cgroup.subtree_control", &enabled, err);
        if (r < 0)
                return r;

        for (size_t i = 0; i < ELEMENTSOF(v2_wanted); i++) {
                if (!cgroup_list_has_word(root_controllers, v2_wanted[i]))
                        continue;
                if (!cgroup_list_has_word(avail, v2_wanted[i]))
                        return hutch_error_set(err, -EOPNOTSUPP,
                                               "cgroup controller '%s' is available at the root "
                                               "of the hierarchy but not in %s",
                                               v2_wanted[i], dir);
                if (cgroup_list_has_word(enabled, v2_wanted[i]))
                        continue;
                len += (size_t) snprintf(buf + len, sizeof(buf) - len, "%s+%s", len ? " " : "",
                                         v2_wanted[i]);
        }
        if (len == 0)
                return 0; /* nothing to write: works on a delegated, read-only parent too */

        /* EBUSY here is the "no internal processes" rule: dir has processes
         * of its own (e.g. a container's cgroup namespace root). */
        r = cgroup_write(dir, "cgroup.subtree_control", buf, err);
        if (r < 0)
                return hutch_error_wrap(err, r, "enabling cgroup controllers");
        return 0;
}

static int v2_enable_cb(const char *parent, const char *path, void *userdata, hutch_error *err) {
        return v2_enable_controllers(path, userdata, err);
}

static int v2_read_controllers(hutch_cgroup *cg, hutch_error *err) {
        _cleanup_free_ char *c = NULL;
        int r;

        r = cgroup_read(cg->dir, "cgroup.controllers", &c, err);
        if (r < 0)
                return r;
        cg->has_memory = cgroup_list_has_word(c, "memory");
        cg->has_pids = cgroup_list_has_word(c, "pids");
        cg->has_cpu = cgroup_list_has_word(c, "cpu");
        return 0;
}

static int v2_new(const char *mount_point, const char *root_name, const char *id,
                  hutch_cgroup **ret, hutch_error *err) {
        _cleanup_cgroup_ hutch_cgroup *cg = NULL;

        cg = cgroup_new(CGROUP_V2, id);
        if (!cg)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        if (asprintf(&cg->dir, "%s/%s/%s", mount_point, root_name, id) < 0) {
                cg->dir = NULL;
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        *ret = TAKE_PTR(cg);
        return 0;
}

/* CLONE_INTO_CGROUP wants a directory fd opened for reading (O_PATH fds are
 * refused by kernels before 5.7's follow-up fixes). */
static int v2_open_dir(hutch_cgroup *cg, hutch_error *err) {
        cg->dir_fd = open(cg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (cg->dir_fd < 0) {
                int r = negative_errno();
                if (r == -ENOENT)
                        return hutch_error_set(err, r, "cgroup %s does not exist", cg->dir);
                return hutch_error_set(err, r, "opening cgroup %s: %s", cg->dir, strerror(-r));
        }
        return 0;
}

static int v2_apply_limits(hutch_cgroup *cg, const hutch_limits *limits,
                           const char *root_controllers, hutch_error *err) {
        int r;

        if (!limits)
                return 0;

        /* A controller that was available but did not reach the cgroup is
         * an error; one the hierarchy lacks is skipped (recorded in has_*). */
        if ((limits->memory_bytes && !cg->has_memory &&
             cgroup_list_has_word(root_controllers, "memory")) ||
            (limits->pids && !cg->has_pids && cgroup_list_has_word(root_controllers, "pids")) ||
            (limits->cpu_millis && !cg->has_cpu && cgroup_list_has_word(root_controllers, "cpu")))
                return hutch_error_set(err, -EOPNOTSUPP,
                                       "cgroup %s lacks a controller that the hierarchy offers",
                                       cg->dir);

        if (limits->memory_bytes && cg->has_memory) {
                r = cgroup_write_u64(cg->dir, "memory.max", limits->memory_bytes, err);
                if (r < 0)
                        return r;
                /* Absent without swap accounting; then there is no swap to
                 * limit through the cgroup. */
                if (cgroup_file_exists(cg->dir, "memory.swap.max")) {
                        r = cgroup_write(cg->dir, "memory.swap.max", "0", err);
                        if (r < 0)
                                return r;
                }
                /* memory.oom.group stays 0: the OOM killer takes the one
                 * offending process and the sandbox reports it, rather than
                 * the whole sandbox dying at once. */
        }
        if (limits->pids && cg->has_pids) {
                r = cgroup_write_u64(cg->dir, "pids.max", limits->pids, err);
                if (r < 0)
                        return r;
        }
        if (limits->cpu_millis && cg->has_cpu) {
                uint64_t quota;
                char buf[48];

                r = cgroup_cpu_quota_usec(limits->cpu_millis, &quota, err);
                if (r < 0)
                        return r;
                snprintf(buf, sizeof(buf), "%" PRIu64 " %llu", quota, CGROUP_CPU_PERIOD_USEC);
                r = cgroup_write(cg->dir, "cpu.max", buf, err);
                if (r < 0)
                        return r;
        }
        return 0;
}

int cgroup_v2_create(const char *mount_point, const char *root_name, const char *id,
                     const hutch_limits *limits, hutch_cgroup **ret, hutch_error *err) {
        _cleanup_cgroup_ hutch_cgroup *cg = NULL;
        _cleanup_free_ char *root_controllers = NULL;
        int r;

        r = cgroup_read(mount_point, "cgroup.controllers", &root_controllers, err);
        if (r < 0)
                return r;
        r = v2_enable_controllers(mount_point, root_controllers, err);
        if (r < 0)
                return r;
        r = cgroup_mkdir_parents(mount_point, root_name, v2_enable_cb, root_controllers, err);
        if (r < 0)
                return r;

        r = v2_new(mount_point, root_name, id, &cg, err);
        if (r < 0)
                return r;
        if (mkdir(cg->dir, 0755) < 0) {
                r = negative_errno();
                return hutch_error_set(err, r, "creating cgroup %s: %s", cg->dir, strerror(-r));
        }

        r = v2_open_dir(cg, err);
        if (r >= 0)
                r = v2_read_controllers(cg, err);
        if (r >= 0)
                r = v2_apply_limits(cg, limits, root_controllers, err);
        if (r < 0) {
                (void) cgroup_rmdir_tree(cg->dir, NULL);
                return r;
        }
        *ret = TAKE_PTR(cg);
        return 0;
}

int cgroup_v2_open(const char *mount_point, const char *root_name, const char *id,
                   hutch_cgroup **ret, hutch_error *err) {
        _cleanup_cgroup_ hutch_cgroup *cg = NULL;
        int r;

        r = v2_new(mount_point, root_name, id, &cg, err);
        if (r < 0)
                return r;
        r = v2_open_dir(cg, err);
        if (r < 0)
                return r;
        r = v2_read_controllers(cg, err);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(cg);
        return 0;
}

int cgroup_v2_attach_pid(hutch_cgroup *cg, pid_t pid, hutch_error *err) {
        char buf[16];

        snprintf(buf, sizeof(buf), "%d", (int) pid);
        return cgroup_write(cg->dir, "cgroup.procs", buf, err);
}

/* The value of key in an open cgroup.events, read from the start. */
static int events_read_key(int fd, const char *path, const char *key, uint64_t *ret,
                           hutch_error *err) {
        char buf[256];
        size_t klen = strlen(key);
        ssize_t n;

        n = pread(fd, buf, sizeof(buf) - 1, 0);
        if (n < 0) {
                int r = negative_errno();
                return hutch_error_set(err, r, "reading %s: %s", path, strerror(-r));
        }
        buf[n] = '\0';
        for (char *line = buf; line && *line;) {
                char *nl = strchr(line, '\n');

                if (nl)
                        *nl = '\0';
                if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
                        *ret = strtoull(line + klen + 1, NULL, 10);
                        return 0;
                }
                line = nl ? nl + 1 : NULL;
        }
        return hutch_error_set(err, -ENODATA, "no '%s' in %s", key, path);
}

/* Wait until cgroup.events says key == want. The kernel signals every
 * change of cgroup.events with POLLPRI (kernfs_notify); the poll timeout is
 * capped anyway so a missed wakeup costs at most one interval. Returns
 * -ETIMEDOUT at the deadline. */
static int v2_wait_events(hutch_cgroup *cg, const char *key, uint64_t want, uint64_t deadline,
                          hutch_error *err) {
        _cleanup_free_ char *path = NULL;
        _cleanup_close_ int fd = -1;
        int r;

        path = cgroup_path_join(cg->dir, "cgroup.events");
        if (!path)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
                r = negative_errno();
                return hutch_error_set(err, r, "opening %s: %s", path, strerror(-r));
        }
        for (;;) {
                struct pollfd pfd = { .fd = fd, .events = POLLPRI };
                uint64_t v, now;
                int timeout;

                r = events_read_key(fd, path, key, &v, err);
                if (r < 0)
                        return r;
                if (v == want)
                        return 0;
                now = cgroup_now_usec();
                if (now >= deadline)
                        return hutch_error_set(err, -ETIMEDOUT,
                                               "timed out waiting for '%s %" PRIu64 "' in %s", key,
                                               want, path);
                timeout = (int) MIN((deadline - now) / 1000 + 1, (uint64_t) V2_EVENTS_POLL_MAX_MSEC);
                if (poll(&pfd, 1, timeout) < 0 && errno != EINTR) {
                        r = negative_errno();
                        return hutch_error_set(err, r, "polling %s: %s", path, strerror(-r));
                }
        }
}

int cgroup_v2_freeze(hutch_cgroup *cg, hutch_error *err) {
        int r;

        /* cgroup.freeze arrived in 5.2. */
        if (!cgroup_file_exists(cg->dir, "cgroup.freeze"))
                return hutch_error_set(err, -EOPNOTSUPP,
                                       "%s has no cgroup.freeze (kernel older than 5.2)", cg->dir);
        r = cgroup_write(cg->dir, "cgroup.freeze", "1", err);
        if (r < 0)
                return r;
        r = v2_wait_events(cg, "frozen", 1, cgroup_now_usec() + CGROUP_FREEZE_TIMEOUT_USEC, err);
        if (r < 0) {
                /* A failed pause leaves the sandbox running, not half frozen. */
                (void) cgroup_write(cg->dir, "cgroup.freeze", "0", NULL);
                return r;
        }
        return 0;
}

int cgroup_v2_thaw(hutch_cgroup *cg, hutch_error *err) {
        return cgroup_write(cg->dir, "cgroup.freeze", "0", err);
}

int cgroup_v2_is_frozen(hutch_cgroup *cg) {
        uint64_t v;

        if (cgroup_read_key_u64(cg->dir, "cgroup.events", "frozen", &v, NULL) < 0)
                return 0;
        return v == 1;
}

/* Before 5.14 there is no cgroup.kill: freeze so that nothing forks or exits
 * between reading cgroup.procs and kill(), signal, thaw so the signals are
 * acted on, and repeat until nothing is left. */
static int v2_kill_loop(hutch_cgroup *cg, uint64_t deadline, hutch_error *err) {
        bool freezer = cgroup_file_exists(cg->dir, "cgroup.freeze");

        for (uint64_t sleep = 500;; sleep = MIN(sleep * 2, 20000ULL)) {
                uint64_t populated;
                int r, kill_r;

                if (freezer)
                        (void) cgroup_write(cg->dir, "cgroup.freeze", "1", NULL);
                kill_r = cgroup_kill_procs(cg->dir, true, err);
                if (freezer) {
                        r = cgroup_write(cg->dir, "cgroup.freeze", "0", kill_r < 0 ? NULL : err);
                        if (r < 0 && kill_r >= 0)
                                return r;
                }
                if (kill_r < 0)
                        return kill_r;
                r = cgroup_read_key_u64(cg->dir, "cgroup.events", "populated", &populated, err);
                if (r < 0)
                        return r;
                if (populated == 0 || cgroup_now_usec() >= deadline)
                        return 0; /* the caller reports what is left */
                cgroup_sleep_usec(sleep);
        }
}

static bool file_is_one(const char *dir, const char *file) {
        uint64_t v;

        return cgroup_read_u64(dir, file, &v, NULL) >= 0 && v == 1;
}

int cgroup_v2_kill_all(hutch_cgroup *cg, hutch_error *err) {
        uint64_t deadline = cgroup_now_usec() + CGROUP_KILL_TIMEOUT_USEC;
        int r;

        /* cgroup.kill (5.14) kills the whole subtree, forks in flight
         * included, without the pid reuse race of kill(2). */
        if (cgroup_file_exists(cg->dir, "cgroup.kill"))
                r = cgroup_write(cg->dir, "cgroup.kill", "1", err);
        else
                r = v2_kill_loop(cg, deadline, err);
        if (r < 0)
                return r;
        /* "populated 0" once the last task has exited (zombies do not count). */
        r = v2_wait_events(cg, "populated", 0, deadline, err);
        if (r < 0)
                return hutch_error_wrap(err, r, "killing the processes of %s", cg->dir);
        /* Killed tasks leave a frozen cgroup too; thaw it so that kill_all
         * ends in the same state on both backends. */
        if (file_is_one(cg->dir, "cgroup.freeze"))
                return cgroup_write(cg->dir, "cgroup.freeze", "0", err);
        return 0;
}

int cgroup_v2_destroy(hutch_cgroup *cg, hutch_error *err) {
        return cgroup_rmdir_tree(cg->dir, err);
}

int cgroup_v2_count_procs(hutch_cgroup *cg) {
        return cgroup_count_procs_in(cg->dir);
}

int cgroup_v2_stats(hutch_cgroup *cg, hutch_stats *ret, hutch_error *err) {
        hutch_stats s = {};
        uint64_t usec = 0;
        int r;

        if (cg->has_memory) {
                r = cgroup_read_u64(cg->dir, "memory.current", &s.memory_current, err);
                if (r < 0)
                        return r;
                /* memory.peak arrived in 5.19; before it, the largest value
                 * this handle has seen is the best there is. */
                if (cgroup_file_exists(cg->dir, "memory.peak")) {
                        r = cgroup_read_u64(cg->dir, "memory.peak", &s.memory_peak, err);
                        if (r < 0)
                                return r;
                } else {
                        cg->memory_peak_seen = MAX(cg->memory_peak_seen, s.memory_current);
                        s.memory_peak = cg->memory_peak_seen;
                }
                r = cgroup_read_u64(cg->dir, "memory.max", &s.memory_limit, err);
                if (r < 0)
                        return r;
                if (s.memory_limit == UINT64_MAX)
                        s.memory_limit = 0;
                /* The "oom_kill" key arrived in 4.13. */
                r = cgroup_read_key_u64(cg->dir, "memory.events", "oom_kill", &s.oom_kills, NULL);
                if (r < 0 && r != -ENODATA)
                        return hutch_error_set(err, r, "reading %s/memory.events: %s", cg->dir,
                                               strerror(-r));
        }
        /* cpu.stat's usage_usec is core (no cpu controller needed) since 4.15. */
        r = cgroup_read_key_u64(cg->dir, "cpu.stat", "usage_usec", &usec, NULL);
        if (r < 0 && r != -ENOENT && r != -ENODATA)
                return hutch_error_set(err, r, "reading %s/cpu.stat: %s", cg->dir, strerror(-r));
        s.cpu_usage_ns = usec * 1000;
        if (cg->has_pids) {
                r = cgroup_read_u64(cg->dir, "pids.current", &s.pids_current, err);
                if (r < 0)
                        return r;
        }
        *ret = s;
        return 0;
}

int cgroup_v2_prune(const char *mount_point, const char *root_name, char *const *keep,
                    hutch_error *err) {
        _cleanup_strv_ char **names = NULL;
        _cleanup_free_ char *parent = NULL;
        int r, ret = 0;

        parent = cgroup_path_join(mount_point, root_name);
        if (!parent)
                return hutch_error_set(err, -ENOMEM, "out of memory");
        r = cgroup_list_children(parent, &names, err);
        if (r < 0)
                return r;
        for (char **n = names; *n; n++) {
                _cleanup_cgroup_ hutch_cgroup *cg = NULL;
                hutch_error *e = ret < 0 ? NULL : err;

                if (cgroup_strv_contains(keep, *n))
                        continue;
                r = cgroup_v2_open(mount_point, root_name, *n, &cg, e);
                if (r == -ENOENT)
                        continue;
                if (r >= 0)
                        r = cgroup_v2_kill_all(cg, e);
                if (r >= 0)
                        r = cgroup_v2_destroy(cg, e);
                if (r < 0 && ret == 0)
                        ret = r;
        }
        return ret;
}
