/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's routing over client bytes (daemon/route.c): method + path,
 * the Host fallback, the list's metadata filter and page token. Input:
 * NUL-separated fields (method, url, host, metadata query, token).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/route.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 8192)
                return 0;
        char *buf = malloc(size + 1);
        if (!buf)
                return 0;
        memcpy(buf, data, size);
        buf[size] = 0;
        const char *field[5] = { "", "", "", "", "" };
        size_t k = 0, start = 0;
        for (size_t i = 0; i <= size && k < 5; i++)
                if (i == size || buf[i] == 0) {
                        buf[i] = 0;
                        field[k++] = buf + start;
                        start = i + 1;
                }
        route r;
        if (route_control(field[0], field[1], &r) == 0) {
                if (r.kind < ROUTE_HEALTH || r.kind >= _ROUTE_MAX)
                        abort();
                if (r.id[0] && !route_sandbox_id_valid(r.id))
                        abort();
                /* a secret or template id: one non-empty path segment, no NUL */
                bool named = r.kind == ROUTE_SECRET_GET || r.kind == ROUTE_SECRET_UPDATE ||
                        r.kind == ROUTE_SECRET_DELETE || r.kind == ROUTE_TEMPLATE_DELETE ||
                        (r.kind >= ROUTE_TPL_GET && r.kind != ROUTE_TPL_TAGS_ASSIGN &&
                         r.kind != ROUTE_TPL_TAGS_DELETE && r.kind <= ROUTE_TPL_TAGS_GET);
                /* a build id or files hash: one non-empty segment, no NUL or '/' */
                bool argd = r.kind == ROUTE_TPL_FILES || r.kind == ROUTE_TPL_BUILD_START ||
                        r.kind == ROUTE_TPL_BUILD_STATUS;
                if (argd && (!r.arg[0] || strchr(r.arg, '/') || strlen(r.arg) >= sizeof r.arg))
                        abort();
                if (named &&
                    (!r.secret[0] || strchr(r.secret, '/') || strlen(r.secret) >= sizeof r.secret))
                        abort();
        }
        /* a path that passes has no %00 before its query */
        if (!http_path_has_control(field[1])) {
                const char *q = strchr(field[1], '?');
                const char *z = strstr(field[1], "%00");
                if (z && (!q || z < q))
                        abort();
        }
        unsigned port;
        char id[HUTCH_ID_LEN + 1];
        if (route_host(field[2], &port, id) == 0 && (port == 0 || port > 65535 || !route_sandbox_id_valid(id)))
                abort();
        json_t *md = json_pack("{s:s, s:s}", "tag", "T", "odd key", "v=1&x");
        (void) route_metadata_matches(md, field[3]);
        json_decref(md);
        int64_t ms;
        if (route_page_token_parse(field[4], &ms, id) == 0 && (ms < 0 || !route_sandbox_id_valid(id)))
                abort();
        char *dec = strdup(field[3]);
        if (dec) {
                size_t before = strlen(dec);
                route_url_decode(dec);
                if (strlen(dec) > before)
                        abort();
                free(dec);
        }
        free(buf);
        return 0;
}
