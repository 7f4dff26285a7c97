/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The template build parsers (daemon/buildspec.c): names and tags, the build
 * start body with its steps and its fromImageRegistry credentials, a COPY
 * source's base. The first byte picks
 * the parser, the rest is its input.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/buildspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool charset(const char *s, bool dot) {
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-' ||
                      *s == '_' || (dot && *s == '.')))
                        return false;
        return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 65536)
                return 0;
        char *s = malloc(size);
        if (!s)
                return 0;
        memcpy(s, data + 1, size - 1);
        s[size - 1] = 0;
        char why[256];
        switch (data[0] % 4) {
        case 0: {
                tpl_name n;
                if (tpl_name_parse(s, &n, why, sizeof why) == 0) {
                        /* what passes is what E2B's grammar allows */
                        if (!n.alias[0] || !charset(n.alias, false) || !charset(n.ns, false) ||
                            !charset(n.tag, true) || strcmp(n.tag, "default") == 0 ||
                            tpl_uuid_valid(n.tag))
                                abort();
                }
                break;
        }
        case 1: {
                char t[TPL_NAME_MAX + 1];
                if (tpl_tag_parse(s, t, why, sizeof why) == 0 && (!t[0] || !charset(t, true)))
                        abort();
                break;
        }
        case 2: {
                json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, NULL);
                json_t *out = build_start_parse(j, why, sizeof why);
                if (out) {
                        /* normalized: known types only, never credentials */
                        json_t *steps = json_object_get(out, "steps");
                        size_t i;
                        json_t *st;
                        json_array_foreach(steps, i, st) {
                                const char *ty = json_string_value(json_object_get(st, "type"));
                                if (!ty ||
                                    (strcmp(ty, "RUN") && strcmp(ty, "COPY") && strcmp(ty, "ENV") &&
                                     strcmp(ty, "WORKDIR") && strcmp(ty, "USER")))
                                        abort();
                        }
                        if (json_object_get(out, "fromImageRegistry"))
                                abort();
                }
                /* fromImageRegistry: bounded, and a user basic auth can carry */
                build_cred c;
                if (build_cred_parse(j, &c, why, sizeof why) == 0 && c.type != BUILD_CRED_NONE) {
                        if (!c.user || !c.pass || !*c.user || strchr(c.user, ':') ||
                            strlen(c.user) > BUILD_CRED_USER_MAX ||
                            strlen(c.pass) > BUILD_CRED_PASS_MAX ||
                            (c.type == BUILD_CRED_GCP && strcmp(c.user, "_json_key") != 0))
                                abort();
                }
                build_cred_clear(&c);
                build_cred_wipe_body(j);
                json_decref(out);
                json_decref(j);
                break;
        }
        default: {
                char base[4096];
                if (build_copy_base(s, base, sizeof base) == 0) {
                        /* relative, and no ".." component */
                        size_t n = strlen(base);
                        if (base[0] == '/' || strcmp(base, "..") == 0 ||
                            strncmp(base, "../", 3) == 0 || strstr(base, "/../") ||
                            (n >= 3 && strcmp(base + n - 3, "/..") == 0))
                                abort();
                }
                break;
        }
        }
        free(s);
        return 0;
}
