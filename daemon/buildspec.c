/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "daemon/buildspec.h"
#include "util/macro.h"

#include <stdlib.h>

static bool charset_ok(const char *s, bool dot) {
        if (!*s)
                return false;
        for (; *s; s++) {
                char c = *s;
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                      (dot && c == '.')))
                        return false;
        }
        return true;
}

bool tpl_uuid_valid(const char *s) {
        if (strlen(s) != 36)
                return false;
        for (int i = 0; i < 36; i++) {
                if (i == 8 || i == 13 || i == 18 || i == 23) {
                        if (s[i] != '-')
                                return false;
                } else if (!isxdigit((unsigned char) s[i]))
                        return false;
        }
        return true;
}

bool tpl_hash_valid(const char *s) {
        size_t n = 0;
        for (; s[n]; n++)
                if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')) || n >= 64)
                        return false;
        return n == 64;
}

int tpl_tag_parse(const char *s, char ret[TPL_NAME_MAX + 1], char *why, size_t whylen) {
        while (*s == ' ' || *s == '\t')
                s++;
        size_t n = strlen(s);
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
                n--;
        if (n == 0 || n > TPL_NAME_MAX) {
                snprintf(why, whylen, "Invalid tag: must be 1 to %d characters", TPL_NAME_MAX);
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++)
                ret[i] = (char) tolower((unsigned char) s[i]);
        ret[n] = 0;
        if (!charset_ok(ret, true) || tpl_uuid_valid(ret)) {
                snprintf(why, whylen,
                         "Invalid tag: '%.64s' (letters, digits, '-', '_' and '.'; not a UUID)", ret);
                return -EINVAL;
        }
        return 0;
}

int tpl_name_parse(const char *s, tpl_name *ret, char *why, size_t whylen) {
        tpl_name t = { 0 };
        char buf[TPL_NAME_MAX + 1];
        while (*s == ' ' || *s == '\t')
                s++;
        size_t n = strlen(s);
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
                n--;
        if (n == 0) {
                snprintf(why, whylen, "Name is required");
                return -EINVAL;
        }
        if (n > TPL_NAME_MAX) {
                snprintf(why, whylen, "Invalid name: longer than %d characters", TPL_NAME_MAX);
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++)
                buf[i] = (char) tolower((unsigned char) s[i]);
        buf[n] = 0;
        char *colon = strchr(buf, ':');
        if (colon) {
                *colon = 0;
                int r = tpl_tag_parse(colon + 1, t.tag, why, whylen);
                if (r < 0)
                        return r;
                if (streq(t.tag, "default"))
                        t.tag[0] = 0;
        }
        char *slash = strchr(buf, '/');
        const char *alias = buf;
        if (slash) {
                *slash = 0;
                if (!charset_ok(buf, false)) {
                        snprintf(why, whylen,
                                 "Invalid name: namespace '%.64s' (letters, digits, '-' and '_')",
                                 buf);
                        return -EINVAL;
                }
                snprintf(t.ns, sizeof t.ns, "%s", buf);
                alias = slash + 1;
        }
        if (!charset_ok(alias, false)) {
                snprintf(why, whylen, "Invalid name: alias '%.64s' (letters, digits, '-' and '_')",
                         alias);
                return -EINVAL;
        }
        snprintf(t.alias, sizeof t.alias, "%s", alias);
        *ret = t;
        return 0;
}

int build_copy_base(const char *src, char *ret, size_t n) {
        if (!*src || src[0] == '/' || strlen(src) >= n)
                return -EINVAL;
        /* no ".." component anywhere */
        for (const char *p = src; *p;) {
                size_t l = strcspn(p, "/");
                if (l == 2 && p[0] == '.' && p[1] == '.')
                        return -EINVAL;
                p += l;
                while (*p == '/')
                        p++;
        }
        size_t meta = strcspn(src, "*?[{");
        if (!src[meta]) {
                snprintf(ret, n, "%s", src);
                size_t l = strlen(ret);
                while (l > 1 && ret[l - 1] == '/')
                        ret[--l] = 0;
                return 0;
        }
        size_t cut = meta;
        while (cut > 0 && src[cut - 1] != '/')
                cut--;
        while (cut > 0 && src[cut - 1] == '/')
                cut--;
        if (cut == 0)
                snprintf(ret, n, ".");
        else
                snprintf(ret, n, "%.*s", (int) cut, src);
        return 0;
}

static const struct {
        const char *name, *as;
        unsigned min, max;
        bool pairs;
} step_types[] = {
        { "RUN", "RUN", 1, 2, false },
        { "COPY", "COPY", 2, 4, false },
        { "ADD", "COPY", 2, 4, false },
        { "ENV", "ENV", 2, BUILD_MAX_ARGS, true },
        { "ARG", "ENV", 2, BUILD_MAX_ARGS, true },
        { "WORKDIR", "WORKDIR", 1, 1, false },
        { "USER", "USER", 1, 2, false },
};

static json_t *step_parse(json_t *st, size_t idx, char *why, size_t whylen) {
        if (!json_is_object(st)) {
                snprintf(why, whylen, "step %zu: not an object", idx);
                return NULL;
        }
        const char *type = json_string_value(json_object_get(st, "type"));
        int k = -1;
        for (size_t i = 0; type && i < ELEMENTSOF(step_types); i++)
                if (strcasecmp(type, step_types[i].name) == 0)
                        k = (int) i;
        if (k < 0) {
                snprintf(why, whylen,
                         "step %zu: unknown type '%.32s' (RUN, COPY, ENV, WORKDIR, USER)", idx,
                         type ? type : "");
                return NULL;
        }
        json_t *args = json_object_get(st, "args");
        if (!json_is_array(args)) {
                snprintf(why, whylen, "step %zu: args must be an array of strings", idx);
                return NULL;
        }
        size_t na = json_array_size(args);
        if (na < step_types[k].min || na > step_types[k].max || (step_types[k].pairs && na % 2)) {
                snprintf(why, whylen, "step %zu: %s takes %s%u to %u arguments, not %zu", idx,
                         step_types[k].as, step_types[k].pairs ? "an even count of " : "",
                         step_types[k].min, step_types[k].max, na);
                return NULL;
        }
        json_t *out_args = json_array();
        for (size_t i = 0; i < na; i++) {
                json_t *a = json_array_get(args, i);
                if (!json_is_string(a) || json_string_length(a) > BUILD_MAX_ARG_LEN ||
                    strlen(json_string_value(a)) != json_string_length(a)) {
                        json_decref(out_args);
                        snprintf(why, whylen,
                                 "step %zu: argument %zu must be a string without NUL, at most %d bytes",
                                 idx, i, BUILD_MAX_ARG_LEN);
                        return NULL;
                }
                json_array_append(out_args, a);
        }
        const char *as = step_types[k].as;
        json_t *out = json_pack("{s:s, s:o, s:b}", "type", as, "args", out_args, "force",
                                json_is_true(json_object_get(st, "force")));
        if (streq(as, "COPY")) {
                const char *h = json_string_value(json_object_get(st, "filesHash"));
                char base[4096];
                if (!h || !tpl_hash_valid(h)) {
                        json_decref(out);
                        snprintf(why, whylen,
                                 "step %zu: COPY needs a filesHash of 64 hex characters", idx);
                        return NULL;
                }
                if (build_copy_base(json_string_value(json_array_get(out_args, 0)), base,
                                    sizeof base) < 0) {
                        json_decref(out);
                        snprintf(why, whylen,
                                 "step %zu: COPY source must be a relative path inside the context",
                                 idx);
                        return NULL;
                }
                const char *mode = json_string_value(json_array_get(out_args, 3));
                if (mode && *mode) {
                        bool ok = strlen(mode) <= 5;
                        for (const char *p = mode; ok && *p; p++)
                                ok = *p >= '0' && *p <= '7';
                        if (!ok) {
                                json_decref(out);
                                snprintf(why, whylen, "step %zu: COPY mode '%.16s' is not octal",
                                         idx, mode);
                                return NULL;
                        }
                }
                json_object_set_new(out, "filesHash", json_string(h));
        }
        if (streq(as, "ENV"))
                for (size_t i = 0; i < na; i += 2) {
                        const char *key = json_string_value(json_array_get(out_args, i));
                        bool ok = *key && !isdigit((unsigned char) *key);
                        for (const char *p = key; ok && *p; p++)
                                ok = isalnum((unsigned char) *p) || *p == '_';
                        if (!ok) {
                                json_decref(out);
                                snprintf(why, whylen,
                                         "step %zu: '%.64s' is not an environment variable name",
                                         idx, key);
                                return NULL;
                        }
                }
        if (streq(as, "USER") || streq(as, "WORKDIR")) {
                const char *v = json_string_value(json_array_get(out_args, 0));
                bool ok = *v && strlen(v) < 4096;
                if (streq(as, "USER"))
                        for (const char *p = v; ok && *p; p++)
                                ok = isalnum((unsigned char) *p) || *p == '_' || *p == '-' ||
                                        *p == '.';
                if (!ok) {
                        json_decref(out);
                        snprintf(why, whylen, "step %zu: invalid %s '%.64s'", idx, as, v);
                        return NULL;
                }
        }
        if (streq(as, "RUN") && na == 2) {
                const char *u = json_string_value(json_array_get(out_args, 1));
                bool ok = true;
                for (const char *p = u; ok && *p; p++)
                        ok = isalnum((unsigned char) *p) || *p == '_' || *p == '-' || *p == '.';
                if (!ok) {
                        json_decref(out);
                        snprintf(why, whylen, "step %zu: invalid user '%.64s'", idx, u);
                        return NULL;
                }
        }
        return out;
}

json_t *build_start_parse(json_t *body, char *why, size_t whylen) {
        if (!json_is_object(body)) {
                snprintf(why, whylen, "request body must be a JSON object");
                return NULL;
        }
        const char *img = json_string_value(json_object_get(body, "fromImage"));
        const char *tpl = json_string_value(json_object_get(body, "fromTemplate"));
        if (img && !*img)
                img = NULL;
        if (tpl && !*tpl)
                tpl = NULL;
        if (!img == !tpl) {
                snprintf(why, whylen, "exactly one of fromImage and fromTemplate must be given");
                return NULL;
        }
        if (strlen(img ? img : tpl) > 512) {
                snprintf(why, whylen, "%s is longer than 512 characters",
                         img ? "fromImage" : "fromTemplate");
                return NULL;
        }
        json_t *steps = json_object_get(body, "steps");
        if (steps && !json_is_array(steps) && !json_is_null(steps)) {
                snprintf(why, whylen, "steps must be an array");
                return NULL;
        }
        size_t ns = json_array_size(steps);
        if (ns > BUILD_MAX_STEPS) {
                snprintf(why, whylen, "a build has at most %d steps, not %zu", BUILD_MAX_STEPS, ns);
                return NULL;
        }
        json_t *out_steps = json_array();
        for (size_t i = 0; i < ns; i++) {
                json_t *s = step_parse(json_array_get(steps, i), i + 1, why, whylen);
                if (!s) {
                        json_decref(out_steps);
                        return NULL;
                }
                json_array_append_new(out_steps, s);
        }
        json_t *out = json_pack("{s:s, s:b, s:o}", img ? "fromImage" : "fromTemplate",
                                img ? img : tpl, "force",
                                json_is_true(json_object_get(body, "force")), "steps", out_steps);
        static const char *const cmds[] = { "startCmd", "readyCmd" };
        for (size_t i = 0; i < ELEMENTSOF(cmds); i++) {
                json_t *v = json_object_get(body, cmds[i]);
                if (!v || json_is_null(v))
                        continue;
                if (!json_is_string(v) || json_string_length(v) > BUILD_MAX_ARG_LEN ||
                    strlen(json_string_value(v)) != json_string_length(v)) {
                        json_decref(out);
                        snprintf(why, whylen, "%s must be a string without NUL", cmds[i]);
                        return NULL;
                }
                json_object_set(out, cmds[i], v);
        }
        /* fromImageRegistry's credentials are deliberately not copied: they
         * would travel into the job file and the logs */
        return out;
}

const char *build_cred_type_name(build_cred_type t) {
        switch (t) {
        case BUILD_CRED_REGISTRY:
                return "registry";
        case BUILD_CRED_GCP:
                return "gcp";
        case BUILD_CRED_AWS:
                return "aws";
        default:
                return "none";
        }
}

void build_cred_clear(build_cred *c) {
        if (c->user) {
                explicit_bzero(c->user, strlen(c->user));
                free(c->user);
        }
        if (c->pass) {
                explicit_bzero(c->pass, strlen(c->pass));
                free(c->pass);
        }
        *c = (build_cred) { 0 };
}

/* A string member of o, 1..max bytes, without NUL (and without ':' or
 * control characters when user): NULL when it is not. */
static const char *cred_string(json_t *o, const char *key, size_t max, bool user) {
        json_t *v = json_object_get(o, key);
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (!s || n == 0 || n > max || strlen(s) != n)
                return NULL;
        for (const char *p = s; user && *p; p++)
                if ((unsigned char) *p < 0x20 || *p == 0x7f || *p == ':')
                        return NULL;
        return s;
}

int build_cred_parse(json_t *body, build_cred *ret, char *why, size_t whylen) {
        *ret = (build_cred) { 0 };
        json_t *o = json_object_get(body, "fromImageRegistry");
        if (!o || json_is_null(o))
                return 0;
        if (!json_is_object(o)) {
                snprintf(why, whylen, "fromImageRegistry must be an object");
                return -EINVAL;
        }
        const char *img = json_string_value(json_object_get(body, "fromImage"));
        if (!img || !*img) {
                snprintf(why, whylen, "fromImageRegistry is only for fromImage");
                return -EINVAL;
        }
        const char *type = json_string_value(json_object_get(o, "type"));
        build_cred c = { 0 };
        if (type && streq(type, "registry")) {
                const char *u = cred_string(o, "username", BUILD_CRED_USER_MAX, true);
                const char *p = cred_string(o, "password", BUILD_CRED_PASS_MAX, false);
                if (!u || !p) {
                        snprintf(why, whylen,
                                 "fromImageRegistry: type registry needs a username (1 to %d "
                                 "bytes, no ':' or control characters) and a password (1 to %d "
                                 "bytes, no NUL)",
                                 BUILD_CRED_USER_MAX, BUILD_CRED_PASS_MAX);
                        return -EINVAL;
                }
                c.type = BUILD_CRED_REGISTRY;
                c.user = strdup(u);
                c.pass = strdup(p);
        } else if (type && streq(type, "gcp")) {
                const char *k = cred_string(o, "serviceAccountJson", BUILD_CRED_PASS_MAX, false);
                json_t *key = k ? json_loads(k, JSON_REJECT_DUPLICATES, NULL) : NULL;
                static const char *const fields[] = { "type", "client_email", "private_key" };
                bool ok = json_is_object(key);
                for (size_t i = 0; ok && i < ELEMENTSOF(fields); i++)
                        ok = json_string_length(json_object_get(key, fields[i])) > 0;
                ok = ok && streq(json_string_value(json_object_get(key, "type")), "service_account");
                json_decref(key);
                if (!ok) {
                        snprintf(why, whylen,
                                 "fromImageRegistry: type gcp needs serviceAccountJson, a service "
                                 "account key (a JSON object with type \"service_account\", "
                                 "client_email and private_key) of at most %d bytes",
                                 BUILD_CRED_PASS_MAX);
                        return -EINVAL;
                }
                /* Google's registries take the key as basic auth */
                c.type = BUILD_CRED_GCP;
                c.user = strdup("_json_key");
                c.pass = strdup(k);
        } else if (type && streq(type, "aws")) {
                const char *id = cred_string(o, "awsAccessKeyId", 128, true);
                const char *sk = cred_string(o, "awsSecretAccessKey", 128, true);
                const char *rg = cred_string(o, "awsRegion", sizeof c.region - 1, true);
                bool ok = id && sk && rg;
                for (const char *p = rg; ok && *p; p++)
                        ok = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-';
                if (!ok) {
                        snprintf(why, whylen,
                                 "fromImageRegistry: type aws needs awsAccessKeyId, "
                                 "awsSecretAccessKey and awsRegion (a region name such as "
                                 "us-east-1)");
                        return -EINVAL;
                }
                /* the builder exchanges them for ECR's basic credentials */
                c.type = BUILD_CRED_AWS;
                snprintf(c.region, sizeof c.region, "%s", rg);
                c.user = strdup(id);
                c.pass = strdup(sk);
        } else {
                snprintf(why, whylen,
                         "fromImageRegistry: type must be \"registry\", \"aws\" or \"gcp\"");
                return -EINVAL;
        }
        if (!c.user || !c.pass) {
                build_cred_clear(&c);
                snprintf(why, whylen, "out of memory");
                return -ENOMEM;
        }
        *ret = c;
        return 0;
}

/* Zero the secrets of body's fromImageRegistry in place: jansson frees its
 * strings without wiping them. */
void build_cred_wipe_body(json_t *body) {
        json_t *o = json_object_get(body, "fromImageRegistry");
        const char *k;
        json_t *v;
        if (!json_is_object(o))
                return;
        json_object_foreach(o, k, v) {
                if (json_is_string(v) && !streq(k, "type"))
                        explicit_bzero((char *) json_string_value(v), json_string_length(v));
        }
}
