/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "template/template.h"

/* template.c */
int template_mkdir_at(int dfd, const char *name, mode_t mode, uid_t uid, gid_t gid);
int template_write_at(int dfd, const char *name, const char *content, mode_t mode, uid_t uid,
                      gid_t gid);
int template_version_open_shared(int rootfd, const char *vname);

/* image-template.c: versions of the non-host templates, "<name>@<ns>" */
bool image_version_valid(const char *n, char *name, size_t nl, int64_t *ret_ns);
/* Load templates/<name> (a link to a <name>@<ns> version), locked shared. */
int image_template_resolve(const char *tpl_root, const char *data_dir, const char *name,
                           hutch_template **ret, hutch_error *err);
/* The layer digests ("sha256:<hex>", NULL-terminated) of every version
 * left in templates/ (rootfd), for layer_gc's keep list. */
int image_versions_layers(int rootfd, char ***ret, size_t *ret_n);
