/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The content plane's parsers of client bytes (/volumecontent/{id}/{kind}
 * and its query), free of I/O so that they are fuzzed (fuzz/fuzz-volpath.c).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VOLPATH_MAX 4096 /* HUTCH_VOLFS_PATH_MAX */

enum { VOLC_PATH = 1, VOLC_DIR = 2, VOLC_FILE = 3 };

/* "/volumecontent/<id>/<path|dir|file>": 0 and the kind, id copied
 * lowercased when it is a UUID ("" otherwise: "Invalid volume ID");
 * -ENOENT for any other shape. */
int volcontent_route(const char *url, char ret_id[37], int *ret_kind);

/* A UUID (8-4-4-4-12 hex, either case) lowercased into out. */
bool volume_uuid_parse(const char *s, char out[37]);

/* E2B's volume name rule: ^[a-zA-Z0-9_-]+$, at most 128 bytes. */
bool volume_name_valid(const char *s);

/* The query's path, cleaned: absolute, '//' and '.' collapsed, no '..',
 * no control bytes, shorter than VOLPATH_MAX. 0, or -EINVAL with why. */
int volpath_clean(const char *in, char out[VOLPATH_MAX], const char **ret_why);

/* A decimal number of the query, at most max: 1 and *ret; 0 when absent
 * (NULL or ""); -EINVAL otherwise. */
int volquery_u64(const char *s, uint64_t max, uint64_t *ret);
/* "true"/"1" and "false"/"0": 1 and *ret; 0 when absent; -EINVAL otherwise. */
int volquery_bool(const char *s, bool *ret);
