/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The keys-file setting (docs/scale-out.md "Keys on every node"): API keys
 * the operator hands every node the same way (a Kubernetes Secret mounted as
 * a file), besides the database's own. Lines "TEAM KEY" ('#' comments); TEAM
 * is a team name (created in this node's database when new), KEY an API key
 * of the usual shape (e2b_ + 40 lowercase hex). The file is read at start and
 * again whenever its inode, size or mtime changed, looked at most once a
 * second (a Secret's update swaps a symlink: a new inode). A key taken out of
 * the file stops working at the next look. A file that does not parse keeps
 * the last good set (logged); one that cannot be read at start stops it.
 */
#pragma once

#include <stdint.h>

#include "daemon/server.h"

/* At start: -errno with err when the file is unreadable or malformed. */
int keysfile_load(server *srv, hutch_error *err);
/* The control plane's key check: the file's keys, then the database's.
 * -ENOENT for a key neither knows. */
int keysfile_lookup(server *srv, const char *key, int64_t *ret_team, int64_t *ret_key_id, hutch_error *err);
void keysfile_free(server *srv);
