/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sandbox's seccomp filter: an allowlist compiled once per process with
 * libseccomp and kept as a BPF program, so the child of clone3 only has to
 * call seccomp(SECCOMP_SET_MODE_FILTER) (async-signal-safe, no allocation).
 */
#pragma once

#include <linux/filter.h>
#include <stdbool.h>

#include "hutch/hutch.h"

/* The errno that a denied syscall gets: EPERM in normal builds, a
 * distinctive value in test builds (meson option seccomp_deny_errno) so that
 * tests can tell the filter's answer from a kernel that lacks a feature. */
int seccomp_deny_errno(void);

/* Build (once; later calls return the cached program) the filter for the
 * native ABI; 32-bit and x32 syscalls are killed/refused. The returned
 * program is owned by the module. */
int seccomp_filter_get(const struct sock_fprog **ret, hutch_error *err);

/* In the child: load the program with TSYNC off (single-threaded child).
 * Raw syscalls only; returns -errno. */
int seccomp_filter_load(const struct sock_fprog *prog);
