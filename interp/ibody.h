/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The JSON bodies @e2b/code-interpreter sends (POST /execute, POST
 * /contexts), checked: pure functions over client bytes, fuzzed by
 * fuzz/fuzz-interp-http.c.
 */
#pragma once

#include <jansson.h>
#include <stddef.h>

#define IX_LANG_MAX 16
#define IX_CTX_ID_MAX 64
#define IX_CWD_MAX 1024

typedef struct ix_execute {
        char *code;                     /* malloc'ed, NUL-terminated (a NUL inside is refused) */
        char language[IX_LANG_MAX];     /* normalized, "" when absent */
        char context_id[IX_CTX_ID_MAX]; /* "" when absent */
        json_t *env_vars;               /* an object of strings, or NULL */
} ix_execute;

/* -EINVAL with the reason in why (the status is 400); -ENOENT for an
 * unknown language (why names it). Accepts absent keys and JSON nulls
 * (the Python SDK sends nulls). */
int ix_parse_execute(const char *body, size_t len, ix_execute *ret, char *why, size_t whylen);
void ix_execute_clear(ix_execute *x);

/* POST /contexts {"language"?, "cwd"?}: defaults python and /home/user. */
int ix_parse_context(const char *body, size_t len, char lang[IX_LANG_MAX], char cwd[IX_CWD_MAX],
                     char *why, size_t whylen);

/* "" or NULL -> python; lower-cased and trimmed; js -> javascript, ts ->
 * typescript. -ENOENT for a language no kernel serves. */
int ix_language_normalize(const char *in, char out[IX_LANG_MAX]);
