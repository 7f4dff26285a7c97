/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ibody.h"

static const char *const languages[] = { "python", "javascript", "typescript", "r",
                                         "java",   "bash",       NULL };

int ix_language_normalize(const char *in, char out[IX_LANG_MAX]) {
        char buf[IX_LANG_MAX];
        size_t n = 0;
        if (!in)
                in = "";
        while (*in && isspace((unsigned char) *in))
                in++;
        for (; *in && n < sizeof buf - 1; in++)
                buf[n++] = (char) tolower((unsigned char) *in);
        if (*in && !isspace((unsigned char) *in))
                return -ENOENT; /* too long to be one of ours */
        while (n > 0 && isspace((unsigned char) buf[n - 1]))
                n--;
        buf[n] = 0;
        const char *v = buf;
        if (n == 0)
                v = "python";
        else if (strcmp(buf, "js") == 0)
                v = "javascript";
        else if (strcmp(buf, "ts") == 0)
                v = "typescript";
        for (const char *const *l = languages; *l; l++)
                if (strcmp(v, *l) == 0) {
                        snprintf(out, IX_LANG_MAX, "%s", v);
                        return 0;
                }
        return -ENOENT;
}

static json_t *load_object(const char *body, size_t len, char *why, size_t whylen) {
        json_error_t je;
        if (len == 0) {
                snprintf(why, whylen, "The request body is empty: a JSON object was expected");
                return NULL;
        }
        json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
        if (!j) {
                snprintf(why, whylen, "The request body is not valid JSON: %s (at byte %d)",
                         je.text, je.position);
                return NULL;
        }
        if (!json_is_object(j)) {
                json_decref(j);
                snprintf(why, whylen, "The request body must be a JSON object");
                return NULL;
        }
        return j;
}

/* a string or null/absent; -EINVAL otherwise */
static int opt_string(json_t *o, const char *k, const char **ret, char *why, size_t whylen) {
        json_t *v = json_object_get(o, k);
        *ret = NULL;
        if (!v || json_is_null(v))
                return 0;
        if (!json_is_string(v)) {
                snprintf(why, whylen, "'%s' must be a string", k);
                return -EINVAL;
        }
        if (strlen(json_string_value(v)) != json_string_length(v)) {
                snprintf(why, whylen, "'%s' must not contain NUL characters", k);
                return -EINVAL;
        }
        *ret = json_string_value(v);
        return 0;
}

int ix_parse_execute(const char *body, size_t len, ix_execute *ret, char *why, size_t whylen) {
        json_t *j = load_object(body, len, why, whylen);
        if (!j)
                return -EINVAL;
        ix_execute x = { 0 };
        const char *code, *lang, *ctx;
        int r;
        if ((r = opt_string(j, "code", &code, why, whylen)) < 0 ||
            (r = opt_string(j, "language", &lang, why, whylen)) < 0 ||
            (r = opt_string(j, "context_id", &ctx, why, whylen)) < 0)
                goto out;
        if (!code) {
                snprintf(why, whylen, "'code' is required");
                r = -EINVAL;
                goto out;
        }
        if (lang && ctx) {
                snprintf(why, whylen, "Only one of context_id or language can be provided");
                r = -EINVAL;
                goto out;
        }
        if (lang && ix_language_normalize(lang, x.language) < 0) {
                snprintf(why, whylen,
                         "Unsupported language '%.40s': supported are python, javascript, typescript, r, java and bash",
                         lang);
                r = -ENOENT;
                goto out;
        }
        if (ctx) {
                if (strlen(ctx) >= sizeof x.context_id || !*ctx) {
                        snprintf(why, whylen, "Context %.80s not found", ctx);
                        r = -ESRCH;
                        goto out;
                }
                snprintf(x.context_id, sizeof x.context_id, "%s", ctx);
        }
        json_t *env = json_object_get(j, "env_vars");
        if (env && !json_is_null(env)) {
                if (!json_is_object(env)) {
                        snprintf(why, whylen, "'env_vars' must be an object of strings");
                        r = -EINVAL;
                        goto out;
                }
                const char *k;
                json_t *v;
                json_object_foreach(env, k, v) {
                        bool ok = *k && strlen(k) < 256 && json_is_string(v) &&
                                strlen(json_string_value(v)) == json_string_length(v);
                        for (const char *c = k; ok && *c; c++)
                                ok = isalnum((unsigned char) *c) || *c == '_';
                        if (!ok || isdigit((unsigned char) *k)) {
                                snprintf(why, whylen,
                                         "env_vars: '%.64s' is not a valid variable name with a string value",
                                         k);
                                r = -EINVAL;
                                goto out;
                        }
                }
                x.env_vars = json_incref(env);
        }
        x.code = strdup(code);
        if (!x.code) {
                r = -ENOMEM;
                snprintf(why, whylen, "out of memory");
                goto out;
        }
        *ret = x;
        r = 0;
out:
        if (r < 0)
                json_decref(x.env_vars);
        json_decref(j);
        return r;
}

void ix_execute_clear(ix_execute *x) {
        free(x->code);
        json_decref(x->env_vars);
        *x = (ix_execute) { 0 };
}

int ix_parse_context(const char *body, size_t len, char lang[IX_LANG_MAX], char cwd[IX_CWD_MAX],
                     char *why, size_t whylen) {
        json_t *j = len ? load_object(body, len, why, whylen) : json_object();
        if (!j)
                return -EINVAL;
        const char *l, *c;
        int r;
        if ((r = opt_string(j, "language", &l, why, whylen)) < 0 ||
            (r = opt_string(j, "cwd", &c, why, whylen)) < 0)
                goto out;
        if (ix_language_normalize(l, lang) < 0) {
                snprintf(why, whylen,
                         "Unsupported language '%.40s': supported are python, javascript, typescript, r, java and bash",
                         l);
                r = -ENOENT;
                goto out;
        }
        if (!c || !*c)
                c = "/home/user";
        if (c[0] != '/' || strlen(c) >= IX_CWD_MAX) {
                snprintf(why, whylen, "'cwd' must be an absolute path of at most %d bytes",
                         IX_CWD_MAX - 1);
                r = -EINVAL;
                goto out;
        }
        snprintf(cwd, IX_CWD_MAX, "%s", c);
        r = 0;
out:
        json_decref(j);
        return r;
}
