/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to cgroup.c, cgroup-v1.c and cgroup-v2.c: the handle's layout, the
 * backends' entry points and the cgroupfs file helpers. Every read and write
 * of a cgroupfs file in hutch goes through the helpers declared here.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "sandbox/cgroup.h"
#include "util/error.h"

/* Bounds on the waits. Freezing waits for every task to reach the freezer,
 * which a task in uninterruptible sleep (NFS, FUSE) can delay; killing waits
 * for the tasks to leave the cgroup; rmdir waits for exiting tasks to drop
 * their references (EBUSY meanwhile). */
#define CGROUP_FREEZE_TIMEOUT_USEC (2 * 1000 * 1000ULL)
#define CGROUP_KILL_TIMEOUT_USEC (5 * 1000 * 1000ULL)
#define CGROUP_RMDIR_TIMEOUT_USEC (1 * 1000 * 1000ULL)

/* cpu quota period, both backends: 100 ms, the kernel's default. */
#define CGROUP_CPU_PERIOD_USEC 100000ULL
/* The kernel refuses quotas below 1 ms (cfs_quota_us / cpu.max). */
#define CGROUP_CPU_QUOTA_MIN_USEC 1000ULL

/* A million CPUs: far above any host, far below overflowing the quota. */
#define CGROUP_CPU_MILLIS_MAX (1000ULL * 1000 * 1000)

#define CGROUP_ID_MAX 64
#define CGROUP_ROOT_NAME_MAX 128

/* v1 controllers hutch uses, each in its own hierarchy or co-mounted
 * (cpu,cpuacct). */
typedef enum cgroup_v1_controller {
        CGROUP_V1_MEMORY,
        CGROUP_V1_PIDS,
        CGROUP_V1_CPU,
        CGROUP_V1_CPUACCT,
        CGROUP_V1_FREEZER,
        CGROUP_V1_DEVICES,
        CGROUP_V1_CPUSET,
        _CGROUP_V1_MAX,
} cgroup_v1_controller;

struct hutch_cgroup {
        cgroup_version version;
        char *id;

        /* v1: the sandbox's directory in each controller's hierarchy, NULL
         * where that controller is not mounted. Co-mounted controllers get
         * equal strings; cgroup_v1_dir_is_dup() tells the later ones. */
        char *v1_dir[_CGROUP_V1_MAX];

        /* v2: <mount>/<root_name>/<id> and an O_DIRECTORY fd of it (kept for
         * clone3(CLONE_INTO_CGROUP)). */
        char *dir;
        int dir_fd;
        /* v2: which controllers the cgroup has; a missing one is absent from
         * the whole hierarchy (recorded and skipped, see docs/cgroups.md). */
        bool has_memory, has_pids, has_cpu;
        /* v2 without memory.peak (< 5.19): the largest memory.current seen. */
        uint64_t memory_peak_seen;
};

/* ------------------------------------------------------------ cgroup.c */

const char *cgroup_v1_controller_name(cgroup_v1_controller c);
bool cgroup_v1_dir_is_dup(const hutch_cgroup *cg, cgroup_v1_controller c);

bool cgroup_id_is_valid(const char *id);
bool cgroup_root_name_is_valid(const char *root_name);
int cgroup_check_names(const char *root_name, const char *id, hutch_error *err);

hutch_cgroup *cgroup_new(cgroup_version v, const char *id);

/* cpu_millis as a quota per CGROUP_CPU_PERIOD_USEC, raised to the kernel's
 * 1 ms minimum; -ERANGE above CGROUP_CPU_MILLIS_MAX. */
int cgroup_cpu_quota_usec(uint64_t cpu_millis, uint64_t *ret, hutch_error *err);

uint64_t cgroup_now_usec(void);
void cgroup_sleep_usec(uint64_t usec);

/* "<a>/<b>" freshly allocated, NULL on ENOMEM. */
char *cgroup_path_join(const char *a, const char *b);

/* Write the whole of value to dir/file in one write(2): cgroupfs acts on
 * each write separately, so a split value is a different value. Opened
 * O_WRONLY|O_CLOEXEC|O_NOFOLLOW. The message names the file. */
int cgroup_write(const char *dir, const char *file, const char *value, hutch_error *err);
int cgroup_write_u64(const char *dir, const char *file, uint64_t value, hutch_error *err);
/* Read a whole file, NUL-terminated. */
int cgroup_read(const char *dir, const char *file, char **ret, hutch_error *err);
/* A file holding one number; "max" reads as UINT64_MAX. */
int cgroup_read_u64(const char *dir, const char *file, uint64_t *ret, hutch_error *err);
/* A "key value" line of a flat keyed file (memory.events, cpu.stat, ...).
 * -ENODATA when the key is absent. */
int cgroup_read_key_u64(const char *dir, const char *file, const char *key, uint64_t *ret,
                        hutch_error *err);
bool cgroup_file_exists(const char *dir, const char *file);
/* Is word one of the space- or comma-separated words of list? */
bool cgroup_list_has_word(const char *list, const char *word);

/* mkdir each component of rel under base (existing ones are fine) and call
 * on_dir(path, userdata) for every level, top first, created or not. */
int cgroup_mkdir_parents(const char *base, const char *rel,
                         int (*on_dir)(const char *parent, const char *path, void *userdata,
                                       hutch_error *err),
                         void *userdata, hutch_error *err);
/* rmdir dir and any child cgroups below it, retrying EBUSY for a while.
 * A missing dir is not an error. */
int cgroup_rmdir_tree(const char *dir, hutch_error *err);

/* The pids in dir/cgroup.procs. */
int cgroup_read_pids(const char *dir, pid_t **ret_pids, size_t *ret_n, hutch_error *err);
/* SIGKILL every pid in dir/cgroup.procs (and in child cgroups when
 * recursive); returns how many were signalled, or -errno. */
int cgroup_kill_procs(const char *dir, bool recursive, hutch_error *err);
/* Number of lines in dir/cgroup.procs, or -errno. */
int cgroup_count_procs_in(const char *dir);

/* Child directories of dir that are valid ids, NULL-terminated; a missing
 * dir gives an empty list. */
int cgroup_list_children(const char *dir, char ***ret, hutch_error *err);
bool cgroup_strv_contains(char *const *l, const char *s);
void cgroup_strv_free(char **l);

/* --------------------------------------------------------- cgroup-v1.c */

/* The mount point of each v1 controller's hierarchy from
 * /proc/self/mountinfo, NULL where it is not mounted. */
int cgroup_v1_find_mounts(char *ret_mounts[_CGROUP_V1_MAX], hutch_error *err);
/* The same from any mountinfo-formatted stream (for tests). */
int cgroup_v1_parse_mountinfo(FILE *f, char *ret_mounts[_CGROUP_V1_MAX], hutch_error *err);
void cgroup_v1_mounts_free(char *mounts[_CGROUP_V1_MAX]);

int cgroup_v1_create(const char *root_name, const char *id, const hutch_limits *limits,
                     hutch_cgroup **ret, hutch_error *err);
int cgroup_v1_open(const char *root_name, const char *id, hutch_cgroup **ret, hutch_error *err);
int cgroup_v1_attach_pid(hutch_cgroup *cg, pid_t pid, hutch_error *err);
int cgroup_v1_freeze(hutch_cgroup *cg, hutch_error *err);
int cgroup_v1_thaw(hutch_cgroup *cg, hutch_error *err);
int cgroup_v1_is_frozen(hutch_cgroup *cg);
int cgroup_v1_kill_all(hutch_cgroup *cg, hutch_error *err);
int cgroup_v1_destroy(hutch_cgroup *cg, hutch_error *err);
int cgroup_v1_count_procs(hutch_cgroup *cg);
int cgroup_v1_stats(hutch_cgroup *cg, hutch_stats *ret, hutch_error *err);
int cgroup_v1_prune(const char *root_name, char *const *keep, hutch_error *err);
int cgroup_v1_allow_devices(hutch_cgroup *cg, const char (*rules)[32], size_t n, hutch_error *err);

/* --------------------------------------------------------- cgroup-v2.c */

int cgroup_v2_create(const char *mount_point, const char *root_name, const char *id,
                     const hutch_limits *limits, hutch_cgroup **ret, hutch_error *err);
int cgroup_v2_open(const char *mount_point, const char *root_name, const char *id,
                   hutch_cgroup **ret, hutch_error *err);
int cgroup_v2_attach_pid(hutch_cgroup *cg, pid_t pid, hutch_error *err);
int cgroup_v2_freeze(hutch_cgroup *cg, hutch_error *err);
int cgroup_v2_thaw(hutch_cgroup *cg, hutch_error *err);
int cgroup_v2_is_frozen(hutch_cgroup *cg);
int cgroup_v2_kill_all(hutch_cgroup *cg, hutch_error *err);
int cgroup_v2_destroy(hutch_cgroup *cg, hutch_error *err);
int cgroup_v2_count_procs(hutch_cgroup *cg);
int cgroup_v2_stats(hutch_cgroup *cg, hutch_stats *ret, hutch_error *err);
int cgroup_v2_prune(const char *mount_point, const char *root_name, char *const *keep,
                    hutch_error *err);

static inline void cgroup_freep(hutch_cgroup **cg) {
        cgroup_free(*cg);
}
static inline void cgroup_strv_freep(char ***l) {
        cgroup_strv_free(*l);
}
#define _cleanup_cgroup_ _cleanup_(cgroup_freep)
#define _cleanup_strv_ _cleanup_(cgroup_strv_freep)
