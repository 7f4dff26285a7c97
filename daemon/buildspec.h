/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The client bytes of template builds, free of I/O so that they are fuzzed
 * (fuzz/fuzz-buildspec.c): template names "[namespace/]alias[:tag]" as E2B
 * parses them, and the steps of a build (docs/templates.md "Building").
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define TPL_NAME_MAX 128
#define BUILD_MAX_STEPS 256
#define BUILD_MAX_ARGS 1000
#define BUILD_MAX_ARG_LEN (128 * 1024 - 1)
#define BUILD_MAX_TAGS 32

typedef struct tpl_name {
        char ns[TPL_NAME_MAX + 1]; /* "" when none */
        char alias[TPL_NAME_MAX + 1];
        char tag[TPL_NAME_MAX + 1]; /* "" when none (or "default") */
} tpl_name;

/* Trimmed, lowercased; alias and namespace [a-z0-9-_]+, tag [a-z0-9-_.]+
 * and not a UUID; the tag "default" counts as none. 0, or -EINVAL with why. */
int tpl_name_parse(const char *s, tpl_name *ret, char *why, size_t whylen);
/* A tag alone (lowercased into ret). */
int tpl_tag_parse(const char *s, char ret[TPL_NAME_MAX + 1], char *why, size_t whylen);
bool tpl_uuid_valid(const char *s);
bool tpl_hash_valid(const char *s); /* 64 lowercase hex */

/* A build start body (POST /v2/templates/{id}/builds/{bid}): fromImage or
 * fromTemplate, steps of known types with the argument counts they need,
 * startCmd/readyCmd strings. Unknown keys are ignored. Returns a new
 * normalized object {fromImage|fromTemplate, force, steps:[{type (RUN,
 * COPY, ENV, WORKDIR, USER), args, force, filesHash?}], startCmd?,
 * readyCmd?} with no credentials in it, or NULL with why. */
json_t *build_start_parse(json_t *body, char *why, size_t whylen);

/* The source base of a COPY: the part of src before its first glob
 * character, cut at a '/' ("app" → "app", "app/ **" → "app", "*.txt" → ".").
 * Refuses absolute sources and ".." components. */
int build_copy_base(const char *src, char *ret, size_t n);
