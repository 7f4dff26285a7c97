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

/* fromImageRegistry (docs/templates.md "Credentials"): a build's own
 * credentials for its fromImage. Bounds: a user name of at most
 * BUILD_CRED_USER_MAX bytes without ':' or control characters, a password
 * (or a GCP service account key's JSON) of at most BUILD_CRED_PASS_MAX bytes
 * without NUL. The gcp type becomes basic auth as user "_json_key" with the
 * key's JSON as the password, once the JSON is an object with the fields a
 * service account key has. */
#define BUILD_CRED_USER_MAX 256
#define BUILD_CRED_PASS_MAX (16 * 1024)

typedef enum build_cred_type {
        BUILD_CRED_NONE,
        BUILD_CRED_REGISTRY,
        BUILD_CRED_GCP,
        BUILD_CRED_AWS,
} build_cred_type;

typedef struct build_cred {
        build_cred_type type;
        char *user, *pass; /* malloc'ed, wiped by build_cred_clear(); aws: key id, secret */
        char region[33];   /* aws */
} build_cred;

/* body's fromImageRegistry: 0 with ret->type NONE when absent or null, 0
 * with the credentials, or -EINVAL with why (which never holds a secret's
 * bytes). Only with fromImage. */
int build_cred_parse(json_t *body, build_cred *ret, char *why, size_t whylen);
void build_cred_clear(build_cred *c);
const char *build_cred_type_name(build_cred_type t);
void build_cred_wipe_body(json_t *body);

/* The source base of a COPY: the part of src before its first glob
 * character, cut at a '/' ("app" → "app", "app/ **" → "app", "*.txt" → ".").
 * Refuses absolute sources and ".." components. */
int build_copy_base(const char *src, char *ret, size_t n);
