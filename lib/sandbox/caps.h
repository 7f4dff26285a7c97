/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Capabilities of sandbox root, inside its own user namespace: a bounded set
 * like Docker's default. Raw syscalls only (called in the clone3 child).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* The capability mask sandbox root keeps (bit N = capability N). */
uint64_t caps_sandbox_mask(void);

/* In the child, before exec: drop every capability outside the mask from
 * the bounding set, set permitted/effective/inheritable to the mask, clear
 * ambient, and set no_new_privs if asked. Returns -errno. */
int caps_apply_child(bool no_new_privs);
