/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Routing decisions over client bytes, free of I/O so that they are fuzzed
 * (fuzz/fuzz-route.c): the control-plane path table, sandbox ids, the
 * `<port>-<id>.<domain>` Host fallback (docs/protocol.md §a.4 rule 6), the
 * list's metadata filter and page token.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "hutch/hutch.h"

enum {
        ROUTE_HEALTH = 1,
        ROUTE_SANDBOXES_CREATE,
        ROUTE_SANDBOXES_LIST,
        ROUTE_SANDBOX_GET,
        ROUTE_SANDBOX_KILL,
        ROUTE_SANDBOX_TIMEOUT,
        ROUTE_SANDBOX_CONNECT,
        ROUTE_SANDBOX_PAUSE,
        ROUTE_SANDBOX_RESUME,
        ROUTE_SANDBOX_REFRESHES,
        ROUTE_SANDBOX_METRICS,
        ROUTE_SANDBOX_NETWORK,
        ROUTE_SANDBOX_EGRESS, /* hutch: the egress decision log */
        ROUTE_SECRETS_LIST,
        ROUTE_SECRETS_CREATE,
        ROUTE_SECRET_GET,
        ROUTE_SECRET_UPDATE,
        ROUTE_SECRET_DELETE,
        ROUTE_SANDBOX_SNAPSHOT,
        ROUTE_SANDBOX_FORK,
        ROUTE_SNAPSHOTS_LIST,
        ROUTE_TEMPLATE_DELETE, /* a snapshot or a built template (daemon/templates.c) */
        ROUTE_VOLUMES_CREATE,
        ROUTE_VOLUMES_LIST,
        ROUTE_VOLUME_GET,
        ROUTE_VOLUME_DELETE,
        /* template builds (daemon/templates.c, daemon/route-template.c) */
        ROUTE_TPL_REQUEST,      /* POST /v3/templates */
        ROUTE_TPL_LIST,         /* GET /templates */
        ROUTE_TPL_GET,          /* GET /templates/{id} */
        ROUTE_TPL_FILES,        /* GET /templates/{id}/files/{hash} */
        ROUTE_TPL_BUILD_START,  /* POST /v2/templates/{id}/builds/{bid} */
        ROUTE_TPL_BUILD_STATUS, /* GET /templates/{id}/builds/{bid}/status */
        ROUTE_TPL_ALIAS,        /* GET /templates/aliases/{alias} */
        ROUTE_TPL_TAGS_ASSIGN,  /* POST /templates/tags */
        ROUTE_TPL_TAGS_DELETE,  /* DELETE /templates/tags */
        ROUTE_TPL_TAGS_GET,     /* GET /templates/{id}/tags */
        ROUTE_EVENTS,         /* hutch: GET /events, the team's audit records (docs/audit.md) */
        ROUTE_SANDBOX_EVENTS, /* hutch: GET /sandboxes/{id}/events */
        ROUTE_USAGE,          /* hutch: GET /usage, the team's usage ledger (docs/usage.md) */
        ROUTE_NODE, /* hutch: GET /node, this node's identity and capacity (daemon/node.h) */
        _ROUTE_MAX, /* not a route: one past the last */
};

typedef struct route {
        int kind;               /* ROUTE_* */
        bool v2;                /* /v2/… (list: states and filters) */
        char id[HUTCH_ID_LEN + 1]; /* ROUTE_SANDBOX_*: "" when the path's id is not a valid sandbox id */
        char secret[161];          /* ROUTE_SECRET_*: the id or name, percent-decoded; ROUTE_VOLUME_*: the id;
                                      ROUTE_TPL_*, ROUTE_TEMPLATE_DELETE: the template id or name */
        char arg[80];              /* ROUTE_TPL_*: the build id or the files hash */
} route;

/* 0 and *ret; -ENOENT no such path (404); -EPERM known path, other method (405). */
int route_control(const char *method, const char *url, route *ret);

bool route_sandbox_id_valid(const char *s);

/* route_control's /templates, /v2/templates and /v3/templates paths
 * (route-template.c). */
int route_templates(const char *method, const char *url, route *r);

/* Host "<port>-<id>.<domain>[:port]": 0 and the two parts, or -EINVAL. */
int route_host(const char *host, unsigned *ret_port, char ret_id[HUTCH_ID_LEN + 1]);

/* Percent-decoding in place ('+' is a space). */
void route_url_decode(char *s);

/* True when the path of a raw request target (up to '?') holds a control
 * byte, literal or %-encoded (%00 ends a decoded C string; %0a splits lines
 * in logs): such a path is refused with 400 before it is decoded. */
bool http_path_has_control(const char *target);

/* GET /v2/sandboxes?metadata=…, as MHD decoded it once: "k=v&k2=v2" whose
 * keys and values carry two more levels of encoding (the SDK's). */
bool route_metadata_matches(json_t *metadata, const char *query);

/* The list's nextToken "<startedMs>.<id>". */
int route_page_token_parse(const char *s, int64_t *ret_ms, char ret_id[HUTCH_ID_LEN + 1]);
