/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include "hutch/hutch.h"
#include "util/macro.h"

/* Record an error: code is a negative errno, returned for convenience so that
 * callers write `return hutch_error_set(err, -EINVAL, "bad size %s", s);`.
 * err may be NULL (best-effort callers). The latest call wins. */
int hutch_error_set(hutch_error *err, int code, const char *fmt, ...) _printf_(3, 4);

/* Prefix context to the message already in err ("creating cgroup: " + msg). */
int hutch_error_wrap(hutch_error *err, int code, const char *fmt, ...) _printf_(3, 4);

/* Convenience: set from errno with "%m"-style suffix. */
#define hutch_error_errno(err, code, ...) hutch_error_set((err), (code), __VA_ARGS__)
