/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Credentials that never enter the sandbox (issue #4, docs/egress.md
 * "Credentials"): what the egress proxy does to a request head on its way
 * out. Pure: no I/O; a secret's value comes from a callback only when a
 * request to one of its hosts needs it, and is never kept.
 *
 * Two mechanisms, one set per sandbox:
 *
 *  - transforms (E2B's network.rules): for requests to a host pattern
 *    ("api.example.com" or "*.example.com"), set these headers. A value may
 *    hold ${e2b.secrets.NAME}, resolved at egress. The exact name wins over
 *    suffixes, the longest suffix over shorter ones; sets are not merged.
 *
 *  - placeholders: a sandbox holds a random placeholder in place of a
 *    secret (an env var whose create value was ${e2b.secrets.NAME}). In a
 *    request to one of the secret's hosts the placeholder is replaced by the
 *    value in every header value. A placeholder in a request to any other
 *    host (header or request target) refuses the request.
 *
 * The rewritten head is origin-form, with the Host header of the parsed
 * destination, hop-by-hop headers removed and "Connection: close".
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/policy.h"
#include "egress/proxyreq.h"

#define EGRESS_SECRET_NAME_MAX 128
#define EGRESS_PLACEHOLDER_LEN 44 /* "hsp_" + 40 hex */
#define EGRESS_INJECT_MAX 256     /* transforms + placeholders in one set */
#define EGRESS_HEADERS_MAX 32     /* headers one transform sets */
#define EGRESS_HEADER_VALUE_MAX 8192

typedef struct egress_inject egress_inject;

/* A secret name as E2B allows it: 1..128 bytes, no '{', '}' or control
 * characters (it is interpolated into ${e2b.secrets.NAME}). */
bool egress_secret_name_valid(const char *n, size_t len);

int egress_inject_new(egress_inject **ret);
egress_inject *egress_inject_free(egress_inject *x); /* returns NULL */
bool egress_inject_empty(const egress_inject *x);     /* NULL counts as empty */

/* A transform: host is "name" or "*.suffix" (a bare "*" or an address is
 * refused); header a token; value printable (no CR, LF, NUL), with
 * ${e2b.secrets.NAME} references allowed. Adding the same host again adds
 * headers to its set. -EINVAL / -E2BIG with why. */
int egress_inject_add_transform(egress_inject *x, const char *host, const char *header, const char *value,
                                char *why, size_t whylen);

/* A placeholder for secret `name`, valid for requests to hosts (rules:
 * names, *.suffixes, addresses/CIDRs, optional ports; "*" refused). */
int egress_inject_add_placeholder(egress_inject *x, const char *placeholder, const char *name,
                                  const char *const *hosts, size_t n_hosts, char *why, size_t whylen);

/* Whether requests to h:port may need rewriting, so that a tunnel there must
 * be opened (TLS interception): some transform or placeholder is for it. */
bool egress_inject_wants(const egress_inject *x, const egress_host *h, uint16_t port);

/* A secret's value for a request to h:port, or -ENOENT (no such secret),
 * -EACCES (the secret is bound to hosts and h:port is not one of them).
 * *ret is malloc'ed; the caller wipes it. */
typedef int (*egress_resolve_fn)(void *userdata, const char *name, const egress_host *h, uint16_t port,
                                 char **ret, size_t *ret_len);

/* The longest value the proxy injects: it must be able to mask it in the
 * response. */
#define EGRESS_MASK_VALUE_MAX 8192

/* Why a head was refused: -EACCES (a placeholder for a secret not bound to
 * this host), -ENOENT (a referenced secret does not exist), -E2BIG (the
 * result is too large), -EINVAL (a resolved value holds CR/LF/NUL). */
#define EGRESS_INJECT_VALUES_MAX 8
typedef struct egress_inject_result {
        char *head; /* the head to send, malloc'ed: wipe and free it */
        size_t head_len;
        char used[1024]; /* names of the secrets and transforms applied, comma-separated (whole items only) */
        /* Copies of the distinct secret values put into the head (at most
         * EGRESS_INJECT_VALUES_MAX), so that the proxy can mask them in the
         * response: an upstream that echoes a header must not hand the
         * value to the sandbox. Wipe and free with egress_inject_result_clear(). */
        char *values[EGRESS_INJECT_VALUES_MAX];
        size_t value_lens[EGRESS_INJECT_VALUES_MAX];
        char value_names[EGRESS_INJECT_VALUES_MAX][EGRESS_SECRET_NAME_MAX + 1];
        size_t n_values;
} egress_inject_result;

void egress_inject_result_clear(egress_inject_result *r);

/* Rewrite request head r (absolute-form or origin-form; proxyreq says) for
 * destination h:port. x may be NULL (no rewriting but the framing ones).
 * tls: the request travels inside TLS that the proxy terminated and
 * re-established with a verified upstream. Secrets are only ever sent then:
 * in plain HTTP a placeholder refuses the request and rules do not apply.
 * A request carrying a value asks for an uncompressed, whole response
 * (Accept-Encoding: identity; Range dropped) so that the proxy can mask the
 * value where the response echoes it. At most 16 substitutions and 8
 * distinct secrets (each ≤ EGRESS_MASK_VALUE_MAX bytes) per request. */
int egress_inject_apply(const egress_inject *x, const egress_host *h, uint16_t port, bool tls, const proxyreq *r,
                        egress_resolve_fn resolve, void *userdata, egress_inject_result *ret, char *why,
                        size_t whylen);

/* Does buf hold any of x's placeholders? (Scanning tunnel bytes a proxy
 * cannot rewrite.) */
bool egress_inject_has_placeholder(const egress_inject *x, const void *buf, size_t len);
