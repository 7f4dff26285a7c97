/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Image references as Docker reads them (distribution's reference grammar):
 *
 *   python:3.12                 -> docker.io/library/python:3.12   (short)
 *   user/img                    -> docker.io/user/img:latest       (short)
 *   registry.example:5000/ns/img@sha256:<64 hex>
 *   localhost/img:tag           -> registry "localhost"
 *
 * The first path component is a registry when it holds a '.' or a ':', is
 * "localhost", or has an upper-case letter; otherwise the name is short
 * and its registry comes from the operator's list (registries.conf, below).
 * Repository components are lower case; a tag is [A-Za-z0-9_][A-Za-z0-9_.-]
 * {0,127}; a digest is "sha256:" + 64 lower-case hex digits; the name
 * (registry + "/" + path) is at most 255 bytes.
 *
 * registries.conf (DATA_DIR/registries.conf, or the file the operator
 * names with --registries-conf / HUTCH_REGISTRIES_CONF): one directive a
 * line, '#' starts a comment:
 *
 *   search REGISTRY...          where short names are looked for, in order
 *                               (default: docker.io)
 *   mirror REGISTRY HOST[:PORT] try HOST before REGISTRY for REGISTRY's
 *                               images (same repository paths), in order
 *   insecure HOST[:PORT]        plain HTTP to HOST (never TLS without a check)
 *   ca HOST[:PORT] FILE         trust FILE's CAs for HOST, besides the system's
 *   allow HOST[:PORT]...        where a restricted pull (the daemon's) may go,
 *                               besides the search and mirror hosts
 *
 * Every byte of a reference comes from a user or a client: the parser is
 * fuzzed (fuzz/fuzz-reference.c).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "hutch/hutch.h"

#define REFERENCE_NAME_MAX 255
#define REFERENCE_TAG_MAX 128
#define REFERENCES_CONF_MAX (64u << 10)
#define REFERENCES_MAX_ENTRIES 64

typedef struct image_reference {
        char *registry;   /* "docker.io", "host:5000", "localhost"; NULL when short */
        char *repository; /* "library/python", "ns/img" (as written when short: "python") */
        char *tag;        /* "3.12"; "latest" when neither tag nor digest was given */
        char *digest;     /* "sha256:<hex>" or NULL */
} image_reference;

/* Parse s. -EINVAL with a message saying which rule it broke. */
int image_reference_parse(const char *s, image_reference *ret, hutch_error *err);
void image_reference_clear(image_reference *r);

/* The repository path on registry reg for a reference: a short one-component
 * name on docker.io (or a docker.io mirror) is "library/NAME". */
int image_reference_repository_on(const image_reference *r, const char *reg, char **ret);

/* "REGISTRY/REPOSITORY[:TAG][@DIGEST]" (malloc'ed). */
char *image_reference_format(const char *registry, const char *repository, const char *tag,
                             const char *digest);

/* A template name for a reference: last path component, "-", tag (or the
 * digest's first 12 hex digits), lower case, at most 63 bytes. */
int image_reference_template_name(const image_reference *r, char **ret);

typedef struct registries_conf {
        char *search[REFERENCES_MAX_ENTRIES];
        size_t n_search;
        struct {
                char *registry, *host;
        } mirror[REFERENCES_MAX_ENTRIES];
        size_t n_mirror;
        char *insecure[REFERENCES_MAX_ENTRIES];
        size_t n_insecure;
        char *allow[REFERENCES_MAX_ENTRIES];
        size_t n_allow;
        struct {
                char *host, *file;
        } ca[REFERENCES_MAX_ENTRIES];
        size_t n_ca;
} registries_conf;

/* Parse a registries.conf text (len bytes, need not be NUL-terminated).
 * -EINVAL with "line N: ..." on a bad line. */
int registries_conf_parse(const char *text, size_t len, registries_conf *ret, hutch_error *err);
/* Read path; a missing file is the defaults (search docker.io). */
int registries_conf_load(const char *path, registries_conf *ret, hutch_error *err);
/* The registries.conf that pulls and pushes read: path when given, else
 * $HUTCH_REGISTRIES_CONF, else DATA_DIR/registries.conf. */
void registries_conf_path(const char *data_dir, const char *path, char *buf, size_t n);
void registries_conf_clear(registries_conf *c);
bool registries_conf_insecure(const registries_conf *c, const char *host);
/* Whether the file names host (a search entry, a mirror, an allow entry;
 * Docker Hub's spellings are one): where a restricted pull may connect. */
bool registries_conf_names(const registries_conf *c, const char *host);
const char *registries_conf_ca(const registries_conf *c, const char *host);

/* One place to ask for a manifest: a host and the repository path there. */
typedef struct image_candidate {
        char *host;       /* "registry-1.docker.io" for docker.io, else the registry or mirror */
        char *registry;   /* the registry the reference names (or the search entry) */
        char *repository; /* the path on that host */
        bool mirror;
} image_candidate;

/* Where to look for r, in order: for each registry (r's own, or each search
 * entry when r is short), its mirrors, then the registry itself. */
int image_reference_candidates(const image_reference *r, const registries_conf *c,
                               image_candidate **ret, size_t *ret_n, hutch_error *err);
void image_candidates_free(image_candidate *v, size_t n);

/* Whether s is a registry host ("name[.name...][:port]", "localhost:5000",
 * "[v6]:port"). */
bool image_registry_host_valid(const char *s);
