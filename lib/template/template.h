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
        int lock_fd;    /* its version's directory, flocked shared until template_free */
        bool rebuilt;   /* host: this resolve built a new version */
        char **layers;  /* host paths of the layer dirs, TOP FIRST (overlay lowerdir order); NULL for host */
        size_t n_layers;
        char **env;      /* "K=V", NULL-terminated; defaults for every process (NULL: none) */
        char *workdir;   /* default cwd, or NULL */
        char *user;      /* default user name, or NULL ("user" where it exists) */
        char **cmd;      /* the image's Entrypoint + Cmd, NULL-terminated, or NULL */
        char *start_cmd; /* run in every sandbox created from it, or NULL (owner of the behaviour: interp) */
        char *ready_cmd; /* polled until it exits 0 before a create returns, or NULL */
        char *kind;      /* "host", "image", "build", "snapshot" */
        int64_t team;    /* 0 = public */
        char *version;   /* the version directory's name (<name>@<ns>; host.<ns> for host) */
        int64_t uid, gid; /* user resolved against the image's /etc/passwd; -1 when user is NULL */
} hutch_template;

/* What template.json of a non-host template version holds (CONTRACTS §1).
 * Arrays are NULL-terminated; any may be NULL. */
typedef struct hutch_template_meta {
        const char *name;
        const char *kind; /* "image", "build", "snapshot" */
        int64_t team;
        int64_t created_ms; /* 0: now */
        const char *source;
        char *const *layers; /* "sha256:<hex>" diff_ids, BOTTOM first as in OCI */
        char *const *env;
        const char *workdir;
        const char *user;
        char *const *cmd;
        const char *start_cmd;
        const char *ready_cmd;
        const char *parent;
        const char *build_id;
} hutch_template_meta;

/* Write a template version <name>@<ns> (template.json, and rootfs/: the
 * small top layer hutch adds over the image's: mount points, the
 * synthesized /etc/hosts, hostname and resolv.conf, a `user` account and
 * /home/user where the image has none) and swap templates/<name> to it,
 * under templates/.lock. Every layer must be in the store (-ENOENT otherwise).
 * The previous version stays until template_gc() finds no user of it. */
int template_write(const char *data_dir, const hutch_template_meta *meta, hutch_error *err);

/* The templates there are (name, kind, layers, size, created) for `ls`. */
typedef struct template_info {
        char *name;
        char *kind;
        char *source;
        size_t n_layers;
        uint64_t size; /* bytes of its layers on disk */
        int64_t created_ms;
} template_info;
int template_list(const char *data_dir, template_info **ret, size_t *ret_n, hutch_error *err);
void template_info_free(template_info *v, size_t n);

/* Remove templates/<name>: the name goes now (no new sandbox can use it);
 * its versions and layers go at the next template_gc() once no live
 * sandbox uses them (a sandbox keeps the version it was made from, so a
 * remove never pulls a layer from under one). -ENOENT, -EPERM for host. */
int template_remove(const char *data_dir, const char *name, hutch_error *err);

typedef struct template_users template_users;
typedef int (*template_users_fn)(void *arg, template_users *ret, hutch_error *err);

/* The template's env ("K=V" each) as a JSON object {K: V} (a new reference). */
struct json_t;
struct json_t *template_env_json(const hutch_template *t);

/* What the name "base" means, decided here and nowhere else: the template
 * `hutch template base` built from Debian packages (templates/base, an
 * image template) when there is one, else the host template. Returns
 * "base" or "host". */
const char *template_base_target(const char *data_dir);
bool template_base_built(const char *data_dir);
/* Whether a base is built, with its version (the name templates/base
 * points at) to buf; false and "" when none is. */
bool template_base_version(const char *data_dir, char *buf, size_t n);
/* The same for the code-interpreter template built from Debian packages
 * (`hutch template interpreter`): the target of DATA_DIR/templates/
 * code-interpreter to buf; false (buf "") when none was built and the
 * interpreter runs on the host template. */
bool template_interp_version(const char *data_dir, char *buf, size_t n);
/* Whether name is the host template: "host", or "base" while no base is
 * built. */
bool template_names_host(const char *data_dir, const char *name);
/* template_write for the reserved names "base" and "code-interpreter":
 * only `hutch template base` and `hutch template interpreter` write them
 * (every other writer refuses the names). */
int template_write_base(const char *data_dir, const hutch_template_meta *meta, hutch_error *err);

/* Resolve a template by name ("base": template_base_target()), building the
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
struct template_users {
        char **roots;
        size_t n_roots;
        int64_t *unknown_created_ns;
        size_t n_unknown;
};
void template_users_clear(template_users *u);

/* Remove the template versions that are not the current one of their name
 * and that no sandbox uses, then the layers no version names (users() is asked once the candidates are locked),
 * with what a crash left in templates/. Under templates/.lock: waits for
 * it when wait, else returns 0 at once while a build holds it. Returns how
 * many it removed. */
int template_gc(const char *data_dir, template_users_fn users, void *arg, bool wait, hutch_error *err);
