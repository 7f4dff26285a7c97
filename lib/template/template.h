/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Templates: the read-only lower layer of a sandbox's root. The built-in
 * `host` template is a small skeleton (synthesized /etc, empty mount points)
 * plus read-only, id-mapped binds of the host's /usr (and /bin, /lib*, /sbin
 * where they are real directories rather than merged-usr links): zero build
 * time, and whatever the host has installed works inside.
 *
 * Layout: data_dir/templates/<name> is a symlink to a versioned directory
 * <name>.<stamp> holding rootfs/ and a template.stamp (the host inputs it
 * was built from), so a rebuild never changes a lower layer that live
 * sandboxes have mounted.
 */
#pragma once

#include "hutch/hutch.h"

#define TEMPLATE_MAX_BINDS 8

typedef struct hutch_template {
        char *name;
        char *rootfs;   /* host path of the lower layer (real path) */
        const char *binds[TEMPLATE_MAX_BINDS + 1]; /* host dirs bound at the same path, read-only */
        size_t n_binds;
} hutch_template;

/* Resolve a template by name ("base" is an alias of "host"), building the
 * host template on first use or when the host's /etc inputs changed.
 * -ENOENT with a message when there is no such template. */
int template_resolve(const char *data_dir, const char *name, hutch_template **ret, hutch_error *err);
void template_free(hutch_template *t);
int template_validate_name(const char *name);
