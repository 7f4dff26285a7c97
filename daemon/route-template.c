/* SPDX-License-Identifier: Apache-2.0 */
/* The template paths of the control plane (docs/api.md "Templates"). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/route.h"
#include "util/macro.h"

/* The next path segment, percent-decoded into buf (no NUL and no '/' in
 * it, bounded); returns the rest of the path after it, or NULL. */
static const char *segment(const char *p, char *buf, size_t n) {
        size_t k = 0;
        for (; *p && *p != '/'; p++) {
                int c = (unsigned char) *p;
                if (c == '%') {
                        char h[3] = { p[1], p[1] ? p[2] : 0, 0 };
                        char *end;
                        long v = strtol(h, &end, 16);
                        if (!h[0] || !h[1] || *end)
                                return NULL;
                        c = (int) v;
                        p += 2;
                }
                if (c == 0 || c == '/' || k + 1 >= n)
                        return NULL;
                buf[k++] = (char) c;
        }
        if (k == 0)
                return NULL;
        buf[k] = 0;
        return p;
}

int route_templates(const char *method, const char *url, route *r) {
        if (streq(url, "/v3/templates")) {
                if (!streq(method, "POST"))
                        return -EPERM;
                r->kind = ROUTE_TPL_REQUEST;
                return 0;
        }
        if (streq(url, "/templates")) {
                if (!streq(method, "GET"))
                        return -EPERM;
                r->kind = ROUTE_TPL_LIST;
                return 0;
        }
        if (streq(url, "/templates/tags")) {
                if (streq(method, "POST"))
                        r->kind = ROUTE_TPL_TAGS_ASSIGN;
                else if (streq(method, "DELETE"))
                        r->kind = ROUTE_TPL_TAGS_DELETE;
                else
                        return -EPERM;
                return 0;
        }
        bool v2 = startswith(url, "/v2/templates/");
        const char *p = url + (v2 ? strlen("/v2/templates/") : strlen("/templates/"));
        if (!v2 && startswith(p, "aliases/")) {
                const char *rest = segment(p + strlen("aliases/"), r->secret, sizeof r->secret);
                if (!rest || *rest)
                        return -ENOENT;
                if (!streq(method, "GET"))
                        return -EPERM;
                r->kind = ROUTE_TPL_ALIAS;
                return 0;
        }
        const char *rest = segment(p, r->secret, sizeof r->secret);
        if (!rest)
                return -ENOENT;
        if (!*rest) {
                if (v2)
                        return -ENOENT;
                if (streq(method, "GET"))
                        r->kind = ROUTE_TPL_GET;
                else if (streq(method, "DELETE"))
                        r->kind = ROUTE_TEMPLATE_DELETE;
                else
                        return -EPERM;
                return 0;
        }
        rest++; /* the '/' */
        if (!v2 && streq(rest, "tags")) {
                if (!streq(method, "GET"))
                        return -EPERM;
                r->kind = ROUTE_TPL_TAGS_GET;
                return 0;
        }
        if (!v2 && startswith(rest, "files/")) {
                const char *end = segment(rest + strlen("files/"), r->arg, sizeof r->arg);
                if (!end || *end)
                        return -ENOENT;
                if (!streq(method, "GET"))
                        return -EPERM;
                r->kind = ROUTE_TPL_FILES;
                return 0;
        }
        if (startswith(rest, "builds/")) {
                const char *end = segment(rest + strlen("builds/"), r->arg, sizeof r->arg);
                if (!end)
                        return -ENOENT;
                if (v2 && !*end) {
                        if (!streq(method, "POST"))
                                return -EPERM;
                        r->kind = ROUTE_TPL_BUILD_START;
                        return 0;
                }
                if (!v2 && streq(end, "/status")) {
                        if (!streq(method, "GET"))
                                return -EPERM;
                        r->kind = ROUTE_TPL_BUILD_STATUS;
                        return 0;
                }
        }
        return -ENOENT;
}
