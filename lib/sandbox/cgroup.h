/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cgroups: one interface, two backends chosen at run time.
 *   cgroup-v1.c  the legacy/hybrid layout (one hierarchy per controller under
 *                /sys/fs/cgroup/<controller>/), as on this project's CI host
 *   cgroup-v2.c  the unified hierarchy (/sys/fs/cgroup is cgroup2)
 * Only these three files touch cgroupfs (docs/style.md: one owner per resource).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "hutch/hutch.h"

typedef enum cgroup_version {
        CGROUP_V1 = 1,
        CGROUP_V2 = 2,
} cgroup_version;

typedef struct hutch_cgroup hutch_cgroup;

/* Which layout the host uses. `override` may be NULL, "v1" or "v2" (config /
 * HUTCH_CGROUP). On v2, mount_point is where cgroup2 is mounted
 * ("/sys/fs/cgroup", or "/sys/fs/cgroup/unified" on a hybrid host when v2 is
 * forced). */
int cgroup_detect(const char *override, cgroup_version *ret_version, char **ret_mount_point,
                  hutch_error *err);

/* Create <root_name>/<id> (and the parent with its controllers enabled, if
 * missing) and apply the limits. Fails with -EEXIST if it already exists. */
int cgroup_create(cgroup_version v, const char *mount_point, const char *root_name, const char *id,
                  const hutch_limits *limits, hutch_cgroup **ret, hutch_error *err);
/* Open an existing sandbox cgroup (re-attach after a restart). -ENOENT if absent. */
int cgroup_open(cgroup_version v, const char *mount_point, const char *root_name, const char *id,
                hutch_cgroup **ret, hutch_error *err);
void cgroup_free(hutch_cgroup *cg);

/* v2: an O_DIRECTORY fd of the cgroup for clone3(CLONE_INTO_CGROUP); v1: -1. */
int cgroup_clone_fd(const hutch_cgroup *cg);
/* Open (O_WRONLY|O_CLOEXEC) every cgroup.procs file a process must be
 * written into to join the sandbox's cgroup (v1: one per hierarchy; v2:
 * one). Writing "0" to each moves the writer: the clone3 child does that
 * itself on v1, in parallel with the parent's preparations, since a v1
 * migration waits for an RCU grace period. The open-time credentials and
 * cgroup namespace are what the kernel checks. Returns the count. */
int cgroup_procs_fds(hutch_cgroup *cg, int *fds, size_t max, hutch_error *err);
/* Move a process into the cgroup (v1: every controller; v2: cgroup.procs).
 * Used on v1, and on v2 when CLONE_INTO_CGROUP is unavailable. */
int cgroup_attach_pid(hutch_cgroup *cg, pid_t pid, hutch_error *err);

int cgroup_freeze(hutch_cgroup *cg, hutch_error *err);
int cgroup_thaw(hutch_cgroup *cg, hutch_error *err);
/* 1 frozen, 0 not. */
int cgroup_is_frozen(hutch_cgroup *cg);

/* SIGKILL every process in the cgroup and wait (bounded) until it is empty.
 * v2: cgroup.kill where present; v1: freeze, kill each pid, thaw, repeat. */
int cgroup_kill_all(hutch_cgroup *cg, hutch_error *err);
/* Send sig to every process in the cgroup but keep; returns how many
 * were signalled (0: keep is alone). Not recursive. */
int cgroup_signal_others(hutch_cgroup *cg, pid_t keep, int sig);
/* rmdir the cgroup (every controller on v1). The cgroup must be empty. */
int cgroup_destroy(hutch_cgroup *cg, hutch_error *err);
/* Number of processes in the cgroup, or -errno. */
int cgroup_count_procs(hutch_cgroup *cg);

/* Let the sandbox open these devices too ("c MAJ:MIN rw" each, the
 * devices controller's syntax), beyond the fixed list: v1 writes each to
 * devices.allow. v2 has no devices file (a BPF program would be needed,
 * which hutch does not load): there the nodes bound into /dev, and no
 * mknod in a user namespace, are the whole policy (docs/cgroups.md), and
 * this returns 0. */
int cgroup_allow_devices(hutch_cgroup *cg, const char (*rules)[32], size_t n, hutch_error *err);
/* The host pids in the cgroup (not in child cgroups); *ret_pids freed by the caller. */
int cgroup_list_pids(hutch_cgroup *cg, pid_t **ret_pids, size_t *ret_n, hutch_error *err);

/* memory_*, cpu_usage_ns, pids_current, oom_kills; fields the controller
 * does not offer are left 0. */
int cgroup_stats(hutch_cgroup *cg, hutch_stats *ret, hutch_error *err);

/* Remove <root_name>/<x> cgroups whose name is not in keep (a NULL-terminated
 * list of ids); used after a daemon restart. Kills what is inside first. */
int cgroup_prune(cgroup_version v, const char *mount_point, const char *root_name,
                 char *const *keep, hutch_error *err);
