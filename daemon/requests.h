/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decoders of the JSON requests that carry the most client-controlled
 * structure, free of I/O so that they are fuzzed (fuzz/fuzz-envd.c):
 * sandbox create (control plane) and process Start (envd). Strings and
 * sub-objects in the results are borrowed from the parsed JSON.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hutch/hutch.h"

#define REQ_METADATA_MAX_KEYS 64
#define REQ_METADATA_MAX_LEN 1024
/* A command line is bounded as the kernel bounds execve(): one string at
 * most MAX_ARG_STRLEN less its NUL, argv and env together at most 2 MiB
 * (the engine checks that sum); init takes 1024 strings of each. */
#define REQ_ENV_MAX_VARS 512
#define REQ_ENV_MAX_LEN HUTCH_SPAWN_STRING_MAX
#define REQ_MAX_ARGS 1000
#define REQ_MAX_ARG_LEN HUTCH_SPAWN_STRING_MAX
#define REQ_MAX_PATH_LEN 4096

typedef struct create_request {
        const char *template_id; /* "base" when absent */
        uint64_t timeout_s;      /* the default when absent or 0 */
        json_t *metadata;        /* object of strings or NULL */
        json_t *env;             /* object of strings or NULL */
        bool on_timeout_pause;   /* autoPause, lifecycle.onTimeout == "pause" */
        bool auto_resume;        /* lifecycle.autoResume, autoResume.enabled */
        bool pause_keep_memory;  /* autoPauseMemory (default true): false = a timeout pause reboots at resume */
        /* hutch's extension: the isolation backend, "ns" or "gvisor", from
         * the body's "backend" or metadata "hutch.backend" (the one an
         * unmodified SDK can send); NULL: the operator's default */
        const char *backend;
        /* hutch's extension: NVIDIA GPUs, from the body's "gpus" (a count,
         * "all", a list of ids, or a string in `hutch run --gpus`'s syntax)
         * or metadata "hutch.gpus" (a string), as hutch_gpu_spec_check()
         * takes it; "" when none is asked for */
        char gpus[256];
} create_request;

/* 0, or -EINVAL / -EOPNOTSUPP with a message for a 400. */
int create_request_parse(json_t *body, uint64_t default_timeout_s, uint64_t max_timeout_s, create_request *ret,
                         char *why, size_t whylen);

typedef struct start_request {
        const char *cmd;
        json_t *args;     /* array of strings (may be NULL) */
        size_t n_args;
        json_t *envs;     /* object of strings (may be NULL) */
        const char *cwd;  /* or NULL */
        const char *tag;  /* or NULL */
        bool pty;
        unsigned rows, cols;
        bool want_stdin;  /* unless "stdin": false */
} start_request;

int start_request_parse(json_t *msg, start_request *ret, char *why, size_t whylen);

/* protobuf-JSON: a field by its lowerCamelCase or original snake_case name;
 * null counts as absent. */
json_t *req_field(json_t *o, const char *camel, const char *snake);
