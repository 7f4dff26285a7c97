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

/* Compile the filter for the native ABI with libseccomp (32-bit and x32
 * syscalls are killed). Runs at build time (seccomp-gen), whose output is
 * compiled into libhutch: a sandbox start pays no libseccomp work (~1.5 ms
 * here) and libhutch needs no libseccomp at run time. */
int seccomp_filter_compile(struct sock_fprog *ret, hutch_error *err);

/* The gvisor relay's filter (seccomp-relay.c): an allowlist that kills
 * the relay on anything else. Build time only (seccomp-gen --relay); the
 * relay carries the result (init/relay-seccomp.h). */
int seccomp_relay_filter_compile(struct sock_fprog *ret, hutch_error *err);

/* The compiled program (generated at build time). */
int seccomp_filter_get(const struct sock_fprog **ret, hutch_error *err);

/* In the child: load the program with TSYNC off (single-threaded child).
 * Raw syscalls only; returns -errno. */
int seccomp_filter_load(const struct sock_fprog *prog);
