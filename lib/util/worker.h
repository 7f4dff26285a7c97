/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A worker: a child process forked from a single-threaded program (the
 * daemon) to do one blocking job (copy, compress, encrypt, fsync) while the
 * parent's loop goes on. The child keeps only the descriptors it is given,
 * dies with its parent (PR_SET_PDEATHSIG, so a kill -9 of the daemon leaves
 * no worker writing behind its back), runs at a lower CPU and I/O priority
 * than the loop it relieves, and must end with _exit(): it shares the
 * parent's memory image, so it may call pure functions and use its
 * descriptors, never the parent's database, HTTP server or exit handlers.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* In the child: move fds[0..n) to 3, 4, ... (fds[] is updated; -1 entries
 * stay -1) and close every other descriptor above 2. Returns 0 or -errno. */
int fds_keep_only(int *fds, size_t n);

/* fork(). In the parent: returns the child's pid (> 0) and its pidfd in
 * *ret_pidfd (O_CLOEXEC; readable when it exits; reap with
 * worker_reap()). In the child: returns 0 with fds[] moved as
 * fds_keep_only() does and its name (comm, as ps shows it; 15 bytes) set
 * (a child that cannot set itself up _exits 127). -errno when no child was
 * made. */
pid_t worker_fork(const char *name, int *fds, size_t n, int *ret_pidfd);

/* Reap an exited worker through its pidfd without blocking (WNOHANG):
 * 1 and its exit code (128 + the signal that killed it) in *ret_status,
 * 0 while it runs, -errno. wait: block until it exits (for a worker just
 * sent SIGKILL). */
int worker_reap(int pidfd, bool wait, int *ret_status);
