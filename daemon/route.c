/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/route.h"
#include "util/macro.h"

bool route_sandbox_id_valid(const char *s) {
        size_t n = 0;
        for (; s[n]; n++)
                if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9')) || n >= HUTCH_ID_LEN)
                        return false;
        return n == HUTCH_ID_LEN;
}

static int hexval(int c);

static const struct {
        const char *method, *action;
        int kind;
} sandbox_routes[] = {
        { "GET", NULL, ROUTE_SANDBOX_GET },
        { "DELETE", NULL, ROUTE_SANDBOX_KILL },
        { "POST", "timeout", ROUTE_SANDBOX_TIMEOUT },
        { "POST", "connect", ROUTE_SANDBOX_CONNECT },
        { "POST", "pause", ROUTE_SANDBOX_PAUSE },
        { "POST", "resume", ROUTE_SANDBOX_RESUME },
        { "POST", "refreshes", ROUTE_SANDBOX_REFRESHES },
        { "GET", "metrics", ROUTE_SANDBOX_METRICS },
        { "PUT", "network", ROUTE_SANDBOX_NETWORK },
        { "GET", "egress", ROUTE_SANDBOX_EGRESS },
        { "POST", "snapshots", ROUTE_SANDBOX_SNAPSHOT },
        { "POST", "fork", ROUTE_SANDBOX_FORK },
        { "GET", "events", ROUTE_SANDBOX_EVENTS },
};

int route_control(const char *method, const char *url, route *ret) {
        route r = { 0 };
        if (streq(url, "/health")) {
                if (!streq(method, "GET") && !streq(method, "HEAD"))
                        return -EPERM;
                r.kind = ROUTE_HEALTH;
                *ret = r;
                return 0;
        }
        if (streq(url, "/sandboxes") || streq(url, "/v2/sandboxes")) {
                r.v2 = url[1] == 'v';
                if (streq(method, "POST"))
                        r.kind = ROUTE_SANDBOXES_CREATE;
                else if (streq(method, "GET"))
                        r.kind = ROUTE_SANDBOXES_LIST;
                else
                        return -EPERM;
                *ret = r;
                return 0;
        }
        if (streq(url, "/usage")) {
                if (!streq(method, "GET"))
                        return -EPERM;
                r.kind = ROUTE_USAGE;
                *ret = r;
                return 0;
        }
        if (streq(url, "/events")) {
                if (!streq(method, "GET"))
                        return -EPERM;
                r.kind = ROUTE_EVENTS;
                *ret = r;
                return 0;
        }
        if (streq(url, "/node")) {
                if (!streq(method, "GET"))
                        return -EPERM;
                r.kind = ROUTE_NODE;
                *ret = r;
                return 0;
        }
        if (streq(url, "/snapshots")) {
                if (!streq(method, "GET"))
                        return -EPERM;
                r.kind = ROUTE_SNAPSHOTS_LIST;
                *ret = r;
                return 0;
        }
        if (streq(url, "/templates") || startswith(url, "/templates/") || startswith(url, "/v2/templates/") ||
            streq(url, "/v3/templates")) {
                int rr = route_templates(method, url, &r);
                if (rr < 0)
                        return rr;
                *ret = r;
                return 0;
        }
        if (streq(url, "/volumes")) {
                if (streq(method, "POST"))
                        r.kind = ROUTE_VOLUMES_CREATE;
                else if (streq(method, "GET"))
                        r.kind = ROUTE_VOLUMES_LIST;
                else
                        return -EPERM;
                *ret = r;
                return 0;
        }
        if (startswith(url, "/volumes/")) {
                /* /volumes/{id}: one path segment, bounded */
                const char *p = url + strlen("/volumes/");
                size_t n = 0;
                for (; *p && *p != '/' && n + 1 < sizeof r.secret; p++)
                        r.secret[n++] = *p;
                r.secret[n] = 0;
                if (*p || n == 0)
                        return -ENOENT;
                if (streq(method, "GET"))
                        r.kind = ROUTE_VOLUME_GET;
                else if (streq(method, "DELETE"))
                        r.kind = ROUTE_VOLUME_DELETE;
                else
                        return -EPERM;
                *ret = r;
                return 0;
        }
        if (streq(url, "/secrets")) {
                if (streq(method, "GET"))
                        r.kind = ROUTE_SECRETS_LIST;
                else if (streq(method, "POST"))
                        r.kind = ROUTE_SECRETS_CREATE;
                else
                        return -EPERM;
                *ret = r;
                return 0;
        }
        if (startswith(url, "/secrets/")) {
                /* the id or name, percent-decoded; no '/' and nothing below it */
                const char *p = url + strlen("/secrets/");
                size_t n = 0;
                for (; *p; p++) {
                        int c = (unsigned char) *p;
                        if (c == '/')
                                return -ENOENT;
                        if (c == '%') {
                                int hi = hexval(p[1]), lo = hi < 0 ? -1 : hexval(p[2]);
                                if (hi < 0 || lo < 0)
                                        return -ENOENT;
                                c = hi * 16 + lo;
                                p += 2;
                        }
                        if (c == 0 || c == '/' || n + 1 >= sizeof r.secret)
                                return -ENOENT;
                        r.secret[n++] = (char) c;
                }
                if (n == 0)
                        return -ENOENT;
                r.secret[n] = 0;
                if (streq(method, "GET"))
                        r.kind = ROUTE_SECRET_GET;
                else if (streq(method, "POST"))
                        r.kind = ROUTE_SECRET_UPDATE;
                else if (streq(method, "DELETE"))
                        r.kind = ROUTE_SECRET_DELETE;
                else
                        return -EPERM;
                *ret = r;
                return 0;
        }
        /* /sandboxes/{id}[/action] and /v2/sandboxes/{id}/connect */
        const char *rest;
        if (startswith(url, "/sandboxes/"))
                rest = url + strlen("/sandboxes/");
        else if (startswith(url, "/v2/sandboxes/")) {
                rest = url + strlen("/v2/sandboxes/");
                r.v2 = true;
        } else
                return -ENOENT;
        size_t idl = strcspn(rest, "/");
        if (idl == 0)
                return -ENOENT;
        const char *action = rest[idl] == '/' ? rest + idl + 1 : NULL;
        if (r.v2 && !(action && streq(action, "connect")))
                return -ENOENT;
        bool path_known = false;
        for (size_t i = 0; i < ELEMENTSOF(sandbox_routes); i++) {
                bool same = (!sandbox_routes[i].action && !action) ||
                            (sandbox_routes[i].action && action && streq(sandbox_routes[i].action, action));
                if (!same)
                        continue;
                path_known = true;
                if (streq(sandbox_routes[i].method, method))
                        r.kind = sandbox_routes[i].kind;
        }
        if (!path_known)
                return -ENOENT;
        if (!r.kind)
                return -EPERM;
        if (idl == HUTCH_ID_LEN) {
                memcpy(r.id, rest, idl);
                r.id[idl] = 0;
                if (!route_sandbox_id_valid(r.id))
                        r.id[0] = 0;
        }
        *ret = r;
        return 0;
}

int route_host(const char *host, unsigned *ret_port, char ret_id[HUTCH_ID_LEN + 1]) {
        /* 1-5 digits, '-', 20 [a-z0-9], '.' and at least one more byte */
        size_t d = 0;
        unsigned port = 0;
        while (host[d] >= '0' && host[d] <= '9' && d < 5) {
                port = port * 10 + (unsigned) (host[d] - '0');
                d++;
        }
        if (d == 0 || host[d] != '-' || port == 0 || port > 65535)
                return -EINVAL;
        const char *id = host + d + 1;
        char buf[HUTCH_ID_LEN + 1];
        size_t n = 0;
        while (n < HUTCH_ID_LEN && id[n] && id[n] != '.') {
                buf[n] = (char) tolower((unsigned char) id[n]);
                n++;
        }
        buf[n] = 0;
        if (n != HUTCH_ID_LEN || id[n] != '.' || !id[n + 1] || !route_sandbox_id_valid(buf))
                return -EINVAL;
        *ret_port = port;
        memcpy(ret_id, buf, sizeof buf);
        return 0;
}

static int hexval(int c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        c = tolower(c);
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

bool http_path_has_control(const char *target) {
        /* up to '?' only: a request target carries no fragment, and
         * libmicrohttpd takes a '#' as part of the path (a %00 after it was
         * still decoded into the path: found by fuzz-route) */
        for (const char *p = target; *p && *p != '?'; p++) {
                int c = (unsigned char) *p;
                if (c == '%' && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
                        c = hexval(p[1]) * 16 + hexval(p[2]);
                        p += 2;
                }
                if (c < 0x20 || c == 0x7f)
                        return true;
        }
        return false;
}

void route_url_decode(char *s) {
        char *o = s;
        for (char *p = s; *p; p++) {
                if (*p == '%' && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
                        *o++ = (char) (hexval(p[1]) * 16 + hexval(p[2]));
                        p += 2;
                } else if (*p == '+')
                        *o++ = ' ';
                else
                        *o++ = *p;
        }
        *o = 0;
}

bool route_metadata_matches(json_t *md, const char *query) {
        char *q = strdup(query);
        if (!q)
                return false;
        bool ok = true;
        char *save = NULL;
        for (char *pair = strtok_r(q, "&", &save); pair && ok; pair = strtok_r(NULL, "&", &save)) {
                char *eq = strchr(pair, '=');
                if (!eq)
                        continue;
                *eq = 0;
                /* MHD decoded the parameter once; the SDK encoded each key
                 * and value, then the pair list: two more levels (E2B's API
                 * does ParseQuery, then QueryUnescape) */
                route_url_decode(pair);
                route_url_decode(pair);
                route_url_decode(eq + 1);
                route_url_decode(eq + 1);
                const char *v = json_string_value(json_object_get(md, pair));
                ok = v && streq(v, eq + 1);
        }
        free(q);
        return ok;
}

int route_page_token_parse(const char *s, int64_t *ret_ms, char ret_id[HUTCH_ID_LEN + 1]) {
        char *end;
        errno = 0;
        long long ms = strtoll(s, &end, 10);
        if (errno || end == s || *end != '.' || ms < 0)
                return -EINVAL;
        if (!route_sandbox_id_valid(end + 1))
                return -EINVAL;
        *ret_ms = ms;
        memcpy(ret_id, end + 1, HUTCH_ID_LEN + 1);
        return 0;
}
