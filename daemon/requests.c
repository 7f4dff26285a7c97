/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "daemon/requests.h"
#include "util/macro.h"

static int fail(char *why, size_t whylen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t whylen, int code, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
        return code;
}

json_t *req_field(json_t *o, const char *camel, const char *snake) {
        if (!json_is_object(o))
                return NULL;
        json_t *v = json_object_get(o, camel);
        if (!v && snake)
                v = json_object_get(o, snake);
        return json_is_null(v) ? NULL : v;
}

static bool env_name_ok(const char *k) {
        if (!(k[0] == '_' || (k[0] >= 'A' && k[0] <= 'Z') || (k[0] >= 'a' && k[0] <= 'z')))
                return false;
        return strchr(k, '=') == NULL;
}

/* An object of strings, bounded; env names checked too. */
static int string_map(json_t *v, const char *what, size_t max_keys, size_t max_len, bool env, char *why,
                      size_t whylen) {
        if (!v)
                return 0;
        if (!json_is_object(v))
                return fail(why, whylen, -EINVAL, "%s must be an object of strings", what);
        if (json_object_size(v) > max_keys)
                return fail(why, whylen, -EINVAL, "%s has more than %zu entries", what, max_keys);
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
                if (!json_is_string(x))
                        return fail(why, whylen, -EINVAL, "%s.%.64s must be a string", what, k);
                if (!*k || strlen(k) > 256)
                        return fail(why, whylen, -EINVAL, "%s: a key must be 1 to 256 bytes ('%.64s')", what, k);
                if (json_string_length(x) > max_len)
                        return fail(why, whylen, -EINVAL, "%s.%.64s is %zu bytes: at most %zu", what, k,
                                    json_string_length(x), max_len);
                if (strlen(json_string_value(x)) != json_string_length(x))
                        return fail(why, whylen, -EINVAL, "%s.%.64s contains a NUL byte", what, k);
                if (env && !env_name_ok(k))
                        return fail(why, whylen, -EINVAL, "%s: '%.64s' is not a valid variable name", what, k);
        }
        return 0;
}

int create_request_parse(json_t *body, uint64_t default_timeout_s, uint64_t max_timeout_s, create_request *ret,
                         char *why, size_t whylen) {
        create_request r = { .template_id = "base", .timeout_s = default_timeout_s, .pause_keep_memory = true };
        if (!json_is_object(body))
                return fail(why, whylen, -EINVAL, "request body must be a JSON object");
        json_t *tj = req_field(body, "templateID", NULL);
        if (tj && !json_is_string(tj))
                return fail(why, whylen, -EINVAL, "templateID must be a string");
        if (tj && json_string_length(tj) > 0) {
                if (json_string_length(tj) > 128 || strlen(json_string_value(tj)) != json_string_length(tj))
                        return fail(why, whylen, -EINVAL, "invalid templateID");
                r.template_id = json_string_value(tj);
        }
        json_t *t = req_field(body, "timeout", NULL);
        if (t) {
                if (!json_is_integer(t) || json_integer_value(t) < 0)
                        return fail(why, whylen, -EINVAL, "timeout must be a non-negative integer (seconds)");
                uint64_t v = (uint64_t) json_integer_value(t);
                if (v > max_timeout_s)
                        return fail(why, whylen, -EINVAL, "timeout %llus exceeds the maximum of %llus",
                                    (unsigned long long) v, (unsigned long long) max_timeout_s);
                if (v > 0)
                        r.timeout_s = v;
        }
        r.metadata = req_field(body, "metadata", NULL);
        r.env = req_field(body, "envVars", "env_vars");
        int k;
        if ((k = string_map(r.metadata, "metadata", REQ_METADATA_MAX_KEYS, REQ_METADATA_MAX_LEN, false, why,
                            whylen)) < 0 ||
            (k = string_map(r.env, "envVars", REQ_ENV_MAX_VARS, REQ_ENV_MAX_LEN, true, why, whylen)) < 0)
                return k;
        json_t *vm = req_field(body, "volumeMounts", NULL);
        if (vm && !json_is_array(vm))
                return fail(why, whylen, -EINVAL, "volumeMounts must be a list");
        /* its entries: daemon/volumes.c (volumes_mounts_parse), which needs the store */
        json_t *v = req_field(body, "autoPause", NULL);
        if (v && !json_is_boolean(v))
                return fail(why, whylen, -EINVAL, "autoPause must be a boolean");
        r.on_timeout_pause = json_is_true(v);
        json_t *lc = req_field(body, "lifecycle", NULL);
        if (lc) {
                if (!json_is_object(lc))
                        return fail(why, whylen, -EINVAL, "lifecycle must be an object");
                json_t *ot = req_field(lc, "onTimeout", "on_timeout");
                if (ot) {
                        const char *s = json_string_value(ot);
                        if (!s || (!streq(s, "pause") && !streq(s, "kill")))
                                return fail(why, whylen, -EINVAL, "lifecycle.onTimeout must be \"kill\" or \"pause\"");
                        r.on_timeout_pause = streq(s, "pause");
                }
                json_t *ar = req_field(lc, "autoResume", "auto_resume");
                if (ar && !json_is_boolean(ar))
                        return fail(why, whylen, -EINVAL, "lifecycle.autoResume must be a boolean");
                r.auto_resume = json_is_true(ar);
        }
        json_t *bj = req_field(body, "backend", NULL);
        json_t *bm = json_is_object(r.metadata) ? json_object_get(r.metadata, "hutch.backend") : NULL;
        if (bj && !json_is_string(bj))
                return fail(why, whylen, -EINVAL, "backend must be a string");
        if (bj && bm && !json_equal(bj, bm))
                return fail(why, whylen, -EINVAL, "backend and metadata[\"hutch.backend\"] disagree");
        if (!bj)
                bj = bm;
        if (bj) {
                r.backend = json_string_value(bj);
                if (!streq(r.backend, "ns") && !streq(r.backend, "gvisor"))
                        return fail(why, whylen, -EINVAL, "backend must be \"ns\" or \"gvisor\"");
        }
        json_t *gj = req_field(body, "gpus", NULL);
        json_t *gm = json_is_object(r.metadata) ? json_object_get(r.metadata, "hutch.gpus") : NULL;
        if (gj && gm)
                return fail(why, whylen, -EINVAL, "give gpus or metadata[\"hutch.gpus\"], not both");
        if (gm)
                gj = gm; /* a string: metadata holds strings only */
        if (json_is_integer(gj)) {
                if (json_integer_value(gj) < 0 || json_integer_value(gj) > HUTCH_GPUS_MAX)
                        return fail(why, whylen, -EINVAL, "gpus: a count from 0 to %d", HUTCH_GPUS_MAX);
                snprintf(r.gpus, sizeof r.gpus, "%lld", (long long) json_integer_value(gj));
        } else if (json_is_string(gj)) {
                if (json_string_length(gj) == 0)
                        return fail(why, whylen, -EINVAL, "gpus: empty (a count, \"all\" or GPU ids)");
                if (json_string_length(gj) >= sizeof r.gpus || strlen(json_string_value(gj)) != json_string_length(gj))
                        return fail(why, whylen, -EINVAL, "gpus: too long");
                snprintf(r.gpus, sizeof r.gpus, "%s", json_string_value(gj));
        } else if (json_is_array(gj)) {
                /* ids: a list is never a count, so [1] is GPU 1 */
                size_t i, o = (size_t) snprintf(r.gpus, sizeof r.gpus, "device=");
                json_t *x;
                if (json_array_size(gj) == 0 || json_array_size(gj) > HUTCH_GPUS_MAX)
                        return fail(why, whylen, -EINVAL, "gpus: a list of 1 to %d GPU ids", HUTCH_GPUS_MAX);
                json_array_foreach(gj, i, x) {
                        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 999)
                                return fail(why, whylen, -EINVAL, "gpus[%zu] must be a GPU id (an integer)", i);
                        o += (size_t) snprintf(r.gpus + o, sizeof r.gpus - o, "%s%lld", i ? "," : "",
                                               (long long) json_integer_value(x));
                }
        } else if (gj)
                return fail(why, whylen, -EINVAL, "gpus must be a count, \"all\", a list of GPU ids or a string");
        if (r.gpus[0]) {
                hutch_error e = { 0 };
                if (hutch_gpu_spec_check(r.gpus, &e) < 0)
                        return fail(why, whylen, -EINVAL, "%s", e.msg);
        }
        json_t *apm = req_field(body, "autoPauseMemory", NULL);
        if (apm && !json_is_boolean(apm))
                return fail(why, whylen, -EINVAL, "autoPauseMemory must be a boolean");
        r.pause_keep_memory = !json_is_false(apm);
        json_t *ar = req_field(body, "autoResume", NULL);
        if (json_is_object(ar)) {
                json_t *en = req_field(ar, "enabled", NULL);
                if (en && !json_is_boolean(en))
                        return fail(why, whylen, -EINVAL, "autoResume.enabled must be a boolean");
                if (en)
                        r.auto_resume = json_is_true(en);
        }
        *ret = r;
        return 0;
}

int start_request_parse(json_t *msg, start_request *ret, char *why, size_t whylen) {
        start_request r = { .rows = 24, .cols = 80, .want_stdin = true };
        json_t *pc = req_field(msg, "process", NULL);
        if (!json_is_object(pc))
                return fail(why, whylen, -EINVAL, "process is required");
        json_t *cmd = req_field(pc, "cmd", NULL);
        if (!json_is_string(cmd) || json_string_length(cmd) == 0)
                return fail(why, whylen, -EINVAL, "process.cmd is required (a non-empty string)");
        if (json_string_length(cmd) > REQ_MAX_ARG_LEN)
                return fail(why, whylen, -EINVAL, "process.cmd is %zu bytes: at most %d", json_string_length(cmd),
                            REQ_MAX_ARG_LEN);
        if (strlen(json_string_value(cmd)) != json_string_length(cmd))
                return fail(why, whylen, -EINVAL, "process.cmd contains a NUL byte");
        r.cmd = json_string_value(cmd);
        r.args = req_field(pc, "args", NULL);
        if (r.args) {
                if (!json_is_array(r.args))
                        return fail(why, whylen, -EINVAL, "process.args must be a list of strings");
                r.n_args = json_array_size(r.args);
                if (r.n_args > REQ_MAX_ARGS)
                        return fail(why, whylen, -EINVAL, "process.args has %zu entries: at most %d", r.n_args,
                                    REQ_MAX_ARGS);
                for (size_t i = 0; i < r.n_args; i++) {
                        json_t *a = json_array_get(r.args, i);
                        if (!json_is_string(a))
                                return fail(why, whylen, -EINVAL, "process.args[%zu] must be a string", i);
                        if (json_string_length(a) > REQ_MAX_ARG_LEN)
                                return fail(why, whylen, -EINVAL, "process.args[%zu] is %zu bytes: at most %d", i,
                                            json_string_length(a), REQ_MAX_ARG_LEN);
                        if (strlen(json_string_value(a)) != json_string_length(a))
                                return fail(why, whylen, -EINVAL, "process.args[%zu] contains a NUL byte", i);
                }
        }
        r.envs = req_field(pc, "envs", NULL);
        int k = string_map(r.envs, "process.envs", REQ_ENV_MAX_VARS, REQ_ENV_MAX_LEN, true, why, whylen);
        if (k < 0)
                return k;
        json_t *cwd = req_field(pc, "cwd", NULL);
        if (cwd) {
                if (!json_is_string(cwd) || json_string_length(cwd) > REQ_MAX_PATH_LEN ||
                    strlen(json_string_value(cwd)) != json_string_length(cwd))
                        return fail(why, whylen, -EINVAL, "process.cwd must be a path of at most %d bytes, without NUL",
                                    REQ_MAX_PATH_LEN);
                if (json_string_length(cwd) > 0)
                        r.cwd = json_string_value(cwd);
        }
        json_t *tag = req_field(msg, "tag", NULL);
        if (tag) {
                if (!json_is_string(tag) || json_string_length(tag) > 256 ||
                    strlen(json_string_value(tag)) != json_string_length(tag))
                        return fail(why, whylen, -EINVAL, "tag must be a string without NUL");
                r.tag = json_string_value(tag);
        }
        json_t *pty = req_field(msg, "pty", NULL);
        if (pty) {
                if (!json_is_object(pty))
                        return fail(why, whylen, -EINVAL, "pty must be an object");
                r.pty = true;
                json_t *size = req_field(pty, "size", NULL);
                json_t *rows = req_field(size, "rows", NULL), *cols = req_field(size, "cols", NULL);
                if ((rows && (!json_is_integer(rows) || json_integer_value(rows) <= 0 ||
                              json_integer_value(rows) > 65535)) ||
                    (cols && (!json_is_integer(cols) || json_integer_value(cols) <= 0 ||
                              json_integer_value(cols) > 65535)))
                        return fail(why, whylen, -EINVAL, "pty.size.rows and cols must be 1..65535");
                if (rows)
                        r.rows = (unsigned) json_integer_value(rows);
                if (cols)
                        r.cols = (unsigned) json_integer_value(cols);
        }
        json_t *in = req_field(msg, "stdin", NULL);
        if (in && !json_is_boolean(in))
                return fail(why, whylen, -EINVAL, "stdin must be a boolean");
        r.want_stdin = !json_is_false(in);
        *ret = r;
        return 0;
}
