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
int verb_volume(int argc, char **argv);

/* volume.c, shared with run.c (--volume) */
struct hutch_store;
bool cli_volume_name_valid(const char *s);
int cli_volume_new_id(char out[HUTCH_VOLUME_ID_LEN + 1]);
int cli_volume_team(struct hutch_store *st, const char *team, bool create, int64_t *ret, hutch_error *err);
/* Names of the default team's volumes in $HUTCH_DATA_DIR to ids; prints the error. */
int cli_volume_resolve(const char *const *names, size_t n, char (*ret_ids)[HUTCH_VOLUME_ID_LEN + 1]);
int verb_template_build(int argc, char **argv); /* template-build.c: `template build` */
int verb_template_base(int argc, char **argv);  /* template-base.c: `template base` */
int verb_template_interpreter(int argc, char **argv); /* template-base.c: `template interpreter` */
const char *cli_template_data_dir(void); /* template.c: HUTCH_DATA_DIR, else /var/lib/hutch */
int verb_template(int argc, char **argv);

/* `hutch template pull|push|login ...` (cli/template-pull.c, owner: registry):
 * argv[0] is the sub-verb ("pull", "push" or "login"). Weak here so that the CLI
 * links without that file; `hutch template` says so when it is absent. */
int template_pull_main(int argc, char **argv) __attribute__((weak));
int template_login_main(int argc, char **argv) __attribute__((weak));
int template_push_main(int argc, char **argv) __attribute__((weak));

/* tty.c: our terminal in raw mode for a -t session (restored by
 * cli_tty_restore and at exit), its window size (24x80 when it has none),
 * and NAME=VALUE with a shell-safe name. */
void cli_tty_raw(void);
void cli_tty_restore(void);
void cli_tty_size(uint16_t *rows, uint16_t *cols);
bool cli_env_name_valid(const char *kv);
/* The signals run and exec forward to their command (INT, TERM, HUP, QUIT)
 * and WINCH, blocked and read from the returned signalfd (-1 on failure);
 * SIGPIPE ignored, so that a closed stdout does not kill us first. */
int cli_signals_open(void);
int verb_audit(int argc, char **argv);
int verb_logs(int argc, char **argv); /* logs.c */
/* an event for the audit trail from a CLI verb (cli/audit.c); steals detail */
struct json_t;
void cli_audit_note(const char *data_dir, const char *kind, struct json_t *detail);
int verb_usage(int argc, char **argv);
int verb_router(int argc, char **argv);
int verb_node(int argc, char **argv);

/* The lean `hutch` (main.c, run.c built with HUTCH_CLI_LEAN) serves `run`
 * linked against libhutch alone, so that the dynamic loader has a handful of
 * libraries to map rather than 48; every other verb, and a run with --net or
 * --volume, execs hutch-full (the whole CLI, next to it) with main()'s
 * arguments. Returns only on failure, with EXIT_HUTCH. */
extern char **cli_argv;
int cli_exec_full(void);

/* Open the library context with the global options; prints the error. */
int cli_ctx(hutch_ctx **ret);
/* After getopt_long() (opterr = 0, an optstring that starts with ':')
 * answered c, '?' or ':': logs which option was unknown or is missing its
 * value, naming the verb; returns EXIT_USAGE. */
int cli_getopt_error(const char *verb, int c, char **argv);
