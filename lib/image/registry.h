/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A client of the OCI distribution API (v2) for one repository on one host,
 * with libcurl: manifests (OCI and Docker media types), blobs downloaded in
 * parallel into the blob cache, anonymous access, bearer tokens
 * (WWW-Authenticate: Bearer realm=...,service=...,scope=...) and basic
 * auth with the credentials `hutch template login` kept.
 *
 * The blob cache: DATA_DIR/images/blobs/sha256/<hex> holds a blob whose
 * digest and size were verified; <hex>.partial is a download in progress,
 * flocked by its downloader, resumed (Range) by the next one, and removed
 * by registry_cache_gc() when nobody holds it. A blob is never read from
 * a .partial file.
 *
 * Everything the server sends is attacker-controlled: the challenge parser
 * is fuzzed (fuzz/fuzz-wwwauth.c), a manifest is bounded, a blob that runs
 * past its descriptor's size stops at once, a token with a byte outside
 * printable ASCII is refused, and credentials never follow a redirect to
 * another host, port or scheme.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hutch/hutch.h"
#include "image/reference.h"

#define REGISTRY_MAX_TOKEN_RESPONSE (64u << 10)
#define REGISTRY_MAX_CHALLENGE 4096u
#define REGISTRY_DEFAULT_PARALLEL 4u
#define REGISTRY_MAX_PARALLEL 16u

/* ---- WWW-Authenticate (RFC 7235 challenges), exposed for the fuzz target */

typedef struct registry_challenge {
        enum { REGISTRY_AUTH_NONE, REGISTRY_AUTH_BASIC, REGISTRY_AUTH_BEARER } scheme;
        char *realm, *service, *scope;
} registry_challenge;

/* Parse a header value: the first Bearer challenge wins over a Basic one.
 * -EINVAL when it holds neither (or is malformed). */
int registry_challenge_parse(const char *value, size_t len, registry_challenge *ret);
void registry_challenge_clear(registry_challenge *c);

/* ---- credentials (DATA_DIR/registries.auth, mode 0600, JSON:
 * {"auths": {"HOST": {"auth": base64("user:password")}}}) */

int registry_auth_path(const char *data_dir, char *buf, size_t n);
/* The credentials for host: 1 and *ret_user, *ret_pass (malloc'ed), 0 when
 * none. -EPERM when the file is readable by group or others. */
int registry_auth_get(const char *auth_path, const char *host, char **ret_user, char **ret_pass,
                      hutch_error *err);
/* Store (pass != NULL) or remove (pass == NULL) host's credentials. */
int registry_auth_set(const char *auth_path, const char *host, const char *user, const char *pass,
                      hutch_error *err);

/* ---- Amazon ECR (a build's fromImageRegistry of type aws)
 *
 * ECR takes basic auth as user AWS with a password from its
 * GetAuthorizationToken call (a SigV4-signed POST to
 * https://api.ecr.REGION.amazonaws.com/, which libcurl signs), valid 12 h.
 * The key is sent to that endpoint only, and only for a registry host
 * ACCOUNT.dkr.ecr.REGION.amazonaws.com of the same region. Not verified
 * against AWS itself. */

/* host is ACCOUNT(12 digits).dkr.ecr.REGION.amazonaws.com */
bool registry_ecr_host_valid(const char *host, const char *region);
/* The registry's basic credentials for the key: *ret_user ("AWS") and
 * *ret_pass, malloc'ed (wipe the password). -EACCES refused, -EPROTO an
 * answer without a token, network errors as the client's. */
int registry_ecr_login(const char *region, const char *key_id, const char *secret,
                       const char *ca_file, char **ret_user, char **ret_pass, hutch_error *err);

/* ---- the client */

typedef struct registry_client registry_client;

typedef struct registry_client_opts {
        const registries_conf *conf; /* insecure and ca entries; may be NULL */
        const char *auth_path;       /* NULL: no stored credentials */
        /* a build's own credentials (fromImageRegistry): used in place of
         * auth_path's, for this client only; the client keeps a copy that
         * it wipes when freed */
        const char *user, *pass;
        const char *ca_file;         /* an extra CA bundle for every host, or NULL */
        const char *blob_dir;        /* the cache, DATA_DIR/images/blobs/sha256 */
        unsigned parallel;           /* concurrent blob downloads (0: default) */
        bool push;                   /* tokens are asked for pull,push (a push) */
} registry_client_opts;

int registry_client_new(const char *host, const char *repository, const registry_client_opts *o,
                        registry_client **ret, hutch_error *err);
registry_client *registry_client_free(registry_client *c);

/* GET /v2/REPO/manifests/REF (a tag or a digest), at most IMAGE_MAX_MANIFEST
 * bytes. ret_digest is the sha256 of the bytes; when ref is a digest they
 * must match (-EBADMSG). -ENOENT: 404; -EACCES: 401/403 (the message says
 * whether credentials were sent). */
int registry_get_manifest(registry_client *c, const char *ref, uint8_t **ret_buf, size_t *ret_len,
                          char **ret_media_type, char ret_digest[72], hutch_error *err);

typedef struct registry_blob {
        const char *digest;
        int64_t size;
} registry_blob;

typedef void (*registry_progress_fn)(void *arg, uint64_t done, uint64_t total, unsigned blobs_done,
                                     unsigned n_blobs);

/* Download the blobs the cache lacks, in parallel, each verified (size and
 * digest) before it is renamed into place. ret_bytes: bytes in the blobs
 * fetched (a resumed one counts whole), ret_blobs: how many (both may be NULL). */
int registry_fetch_blobs(registry_client *c, const registry_blob *blobs, size_t n,
                         registry_progress_fn fn, void *arg, uint64_t *ret_bytes,
                         unsigned *ret_blobs, hutch_error *err);

/* ---- pushes (lib/image/push.c): every answer's code is checked, the
 * registry's own error ({"errors":[{"code","message"}]}) quoted. */

/* HEAD /v2/REPO/blobs/DIGEST: 1 the registry has the blob, 0 it has not. */
int registry_blob_exists(registry_client *c, const char *digest, hutch_error *err);
/* A monolithic upload: POST /v2/REPO/blobs/uploads/, then PUT the size
 * bytes of fd (from offset 0), or of buf when fd < 0, to the Location it
 * answered with ?digest=DIGEST (the registry checks the digest). */
int registry_blob_upload(registry_client *c, int fd, const uint8_t *buf, uint64_t size,
                         const char *digest, hutch_error *err);
/* POST /v2/REPO/blobs/uploads/?mount=DIGEST&from=FROM: 1 the registry
 * mounted the blob from repository FROM, 0 it would not (it answered an
 * upload session, left to expire). */
int registry_blob_mount(registry_client *c, const char *digest, const char *from,
                        hutch_error *err);
/* PUT /v2/REPO/manifests/TAG; ret_digest: the sha256 of buf (checked
 * against the registry's Docker-Content-Digest when it sends one). */
int registry_put_manifest(registry_client *c, const char *tag, const uint8_t *buf, size_t len,
                          const char *media_type, char ret_digest[72], hutch_error *err);
/* The first error of a registry's error body as "CODE: message"
 * (printable ASCII, bounded) into out; -ENOENT when it holds none.
 * Fuzzed (fuzz/fuzz-registry-error.c). */
int registry_error_summary(const uint8_t *buf, size_t len, char *out, size_t n);

/* The cache file of a digest into buf ("" when the cache lacks it). */
int registry_cache_path(const char *blob_dir, const char *digest, char *buf, size_t n);
/* Remove the .partial files nobody holds. Returns how many. */
int registry_cache_gc(const char *blob_dir, hutch_error *err);
