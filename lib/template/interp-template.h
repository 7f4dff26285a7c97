/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The code-interpreter template (docs/interpreter.md): the host template,
 * or one built from Debian packages (`hutch template interpreter`), plus
 * hutch-interp and its kernel files, started by the template's start
 * command. Its names are E2B's: "code-interpreter-v1" is what
 * @e2b/code-interpreter creates by default.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "hutch/hutch.h"

struct hutch_template;

/* Where the interpreter's files live inside a sandbox when they are not
 * visible through the host's /usr (a build tree): the daemon copies them
 * there at create (daemon/startcmd.c). */
#define INTERP_SANDBOX_DIR "/opt/hutch-interp"

/* The files of the interpreter's directory, the server first. */
extern const char *const interp_files[];

bool template_is_interp(const char *name);
/* The host directory of hutch-interp and its files: $HUTCH_INTERP_DIR,
 * else ../interp next to the running binary's directory (a build tree),
 * else the install directory. -ENOENT when none holds hutch-interp. */
int interp_host_dir(char *buf, size_t n);
/* Whether a sandbox sees dir as it is (below /usr, bound read-only from the host). */
bool interp_dir_visible(const char *dir);
/* Copy the interpreter's files into a new sandbox's INTERP_SANDBOX_DIR
 * (root's, the server executable) when its template's start_cmd runs the
 * server from there (the sandbox cannot see the host's directory: a build
 * tree's, or any on a template built from Debian packages); 0 at once
 * when it can. Waits (at most timeout_ms) for the chmod it runs: call it
 * before the sandbox runs anything else. */
int interp_files_install(hutch_sandbox *sb, const char *start_cmd, int timeout_ms, hutch_error *err);
/* `hutch run`: the template's start command in the background, then its
 * ready command until it exits 0, at most timeout_ms in all (-ETIMEDOUT). */
int template_start_commands(hutch_sandbox *sb, const struct hutch_template *t,
                            const char *const *envp, int timeout_ms, hutch_error *err);
/* The code-interpreter template built from Debian packages when there is
 * one (templates/code-interpreter, `hutch template interpreter`), else the
 * host template, named name, with the interpreter's start and ready
 * commands. */
int template_interp_resolve(const char *data_dir, const char *name, struct hutch_template **ret,
                            hutch_error *err);
