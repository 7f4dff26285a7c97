/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the two build-time filter compilers share (seccomp.c: the sandbox's
 * filter; seccomp-relay.c: the gvisor relay's). Build time only: this
 * header needs libseccomp's.
 */
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <seccomp.h>
#include <stddef.h>

#include "hutch/hutch.h"

#if defined(__x86_64__)
#define SECCOMP_NATIVE_AUDIT_ARCH AUDIT_ARCH_X86_64
#define SECCOMP_X32_SYSCALL_BIT 0x40000000u
#elif defined(__aarch64__)
#define SECCOMP_NATIVE_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "seccomp: add the native audit arch (and any compat ABI check) for this architecture"
#endif

/* Export ctx's program after prefix_len zeroed instructions, which the
 * caller fills with its own checks (they run first). */
int seccomp_export_prefixed(scmp_filter_ctx ctx, size_t prefix_len, struct sock_filter **ret_insns,
                            size_t *ret_len, hutch_error *err);
