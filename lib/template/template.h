/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Templates: the read-only lower layer of a sandbox's root. The built-in
 * `host` template is a small skeleton (synthesized /etc, empty mount points)
 * plus read-only, id-mapped binds of the host's /usr (and /bin, /lib*, /sbin
 * where they are real directories rather than merged-usr links): zero build
 * time, and whatever the host has installed works inside.
 *
 * Layout: data_dir/templates/<name> is a symlink to a versioned directory
 * <name>.<build time in ns> holding rootfs/ and a template.stamp (the host
 * inputs it was built from), so a rebuild never changes a lower layer that
 * live sandboxes have mounted; template_gc() removes the versions no
 * sandbox uses any more.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "hutch/hutch.h"

#define TEMPLATE_MAX_BINDS 8

typedef struct hutch_template {
        char *name;
        char *rootfs;   /* host path of the lower layer (real path) */
        const char *binds[TEMPLATE_MAX_BINDS + 1]; /* host dirs bound at the same path, read-only */
        size_t n_binds;
        int lock_fd;    /* host: its version's directory, flocked shared until template_free */
        bool rebuilt;   /* host: this resolve built a new version */
        char *start_cmd; /* run in every sandbox created from it, or NULL (owner of the behaviour: interp) */
        char *ready_cmd;  /* polled until it exits 0 before a create returns, or NULL */
} hutch_template;

/* Resolve a template by name ("base" is an alias of "host"), building the
 * host template on first use or when an input it copies from the host
 * changed. The host template's version stays locked (shared) until
 * template_free(): free it only once the sandbox's state names the version
 * (template_root=), so that template_gc() never takes a version a create is
 * using. -ENOENT with a message when there is no such template. */
int template_resolve(const char *data_dir, const char *name, hutch_template **ret, hutch_error *err);
void template_free(hutch_template *t);
int template_validate_name(const char *name);

/* The host template's stamp (malloc'ed): the builder's version, then one
 * line per input the build copies (the host's top-level links, the copied
 * /etc entries and every directory below them, skel's files) with its type,
 * inode, times and size. And whether a stamp still matches the host. */
int template_host_stamp(char **ret);
bool template_host_stamp_current(const char *stamp);
/* Tests: read the host's /etc from dir instead (NULL: /etc again). */
void template_set_host_etc(const char *dir);

/* What the sandboxes of a run dir use: the template roots their state
 * files name, and the creation times (CLOCK_REALTIME ns) of those whose
 * state predates template_root= (each keeps every version built before it). */
typedef struct template_users {
        char **roots;
        size_t n_roots;
        int64_t *unknown_created_ns;
        size_t n_unknown;
} template_users;
typedef int (*template_users_fn)(void *arg, template_users *ret, hutch_error *err);
void template_users_clear(template_users *u);

/* Remove the host template's versions that are not the current one and
 * that no sandbox uses (users() is asked once the candidates are locked),
 * with what a crash left in templates/. Under templates/.lock: waits for
 * it when wait, else returns 0 at once while a build holds it. Returns how
 * many it removed. */
int template_gc(const char *data_dir, template_users_fn users, void *arg, bool wait, hutch_error *err);
