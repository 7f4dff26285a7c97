/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include "hutch/hutch.h"

/* Exit codes of the CLI itself (the command's own status is passed through). */
#define EXIT_USAGE 2
#define EXIT_HUTCH 125
#define EXIT_NOEXEC 126
#define EXIT_NOTFOUND 127
#define EXIT_TIMEOUT 124

int verb_run(int argc, char **argv);
int verb_doctor(int argc, char **argv);
int verb_ps(int argc, char **argv);
int verb_kill(int argc, char **argv);
int verb_exec(int argc, char **argv);
int verb_gc(int argc, char **argv);
int verb_serve(int argc, char **argv);
int verb_key(int argc, char **argv);
int verb_router(int argc, char **argv);
int verb_node(int argc, char **argv);

/* Open the library context with the global options; prints the error. */
int cli_ctx(hutch_ctx **ret);
