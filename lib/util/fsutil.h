/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/* mkdir -p with the given mode for created components; existing ones are
 * left alone. Symlinks are followed (host-controlled paths only). */
int mkdir_p(const char *path, mode_t mode);

/* Remove a directory tree that a sandbox wrote (its writable layer): never
 * follows a symlink, never leaves the file system it starts on, and copes
 * with trees deeper than any stack or fd limit by hoisting deep
 * subdirectories to the top before descending into them. Removes `name`
 * itself (relative to dirfd). -ENOENT is not an error. */
int rm_rf_at(int dirfd, const char *name);

/* Open `name` under dirfd (open_flags, plus O_CLOEXEC and O_NOFOLLOW; with
 * O_CREAT, mode 0600) and take an exclusive flock on it, waiting for it or
 * not (-EWOULDBLOCK when another open file holds it). Returns the fd: the
 * lock belongs to that open file. A directory works too (O_DIRECTORY). */
int lock_open(int dirfd, const char *name, int open_flags, bool wait);

/* Open (creating, 0600) the lock file `name` under dirfd and take an
 * exclusive flock on it; returns the fd (the lock lives as long as it). */
int lock_file_take(int dirfd, const char *name);

/* The same without waiting: -EWOULDBLOCK when another open file description
 * holds the lock (another process, or this one through another open). */
int lock_file_try(int dirfd, const char *name);

/* Write a file atomically: temp in the same dir, fsync, rename. */
int write_file_atomic(const char *path, const void *data, size_t len, mode_t mode);
