/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Secrets (issue #4, docs/egress.md "Credentials"): E2B's /secrets API, the
 * secrets key file, placeholders for ${e2b.secrets.NAME} in a sandbox's
 * environment, and the credential rules a sandbox's proxy applies (E2B's
 * network.rules transforms plus those placeholders).
 *
 * A secret's value is write-only: no response, log line or sandbox ever
 * holds it. The proxy asks for it (secrets_resolve) only while rewriting a
 * request to one of the hosts it is bound to, and wipes it after use.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/route.h"
#include "daemon/audit.h"
#include "daemon/server.h"
#include "egress/inject.h"
#include "egress/proxy.h"
#include "util/fsutil.h"
#include "util/log.h"
#include "util/macro.h"

#define SECRET_REF_OPEN "${e2b.secrets."
#define METADATA_ENTRIES_MAX 32
#define METADATA_TOTAL_MAX 8192

/* --------------------------------------------------------------- the key */

int secrets_setup(server *srv) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/secrets.key", srv->cfg.data_dir);
        uint8_t key[32];
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
                struct stat st;
                ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, key, sizeof key) : -1;
                close(fd);
                if (n != (ssize_t) sizeof key)
                        return log_error("%s: not a 32-byte key file", path), -EINVAL;
                if (st.st_mode & 077)
                        return log_error("%s: readable by others (mode %04o); it must be 0600", path,
                                         (unsigned) (st.st_mode & 07777)),
                               -EPERM;
        } else if (errno == ENOENT) {
                if (RAND_bytes(key, sizeof key) != 1)
                        return log_error("no randomness for the secrets key"), -EIO;
                int r = write_file_atomic(path, key, sizeof key, 0600);
                if (r < 0)
                        return log_error_errno(r, "writing %s: %m", path);
        } else
                return log_error_errno(-errno, "%s: %m", path);
        store_set_secrets_key(srv->store, key);
        memcpy(srv->data_key, key, sizeof key);
        OPENSSL_cleanse(key, sizeof key);
        return 0;
}

/* --------------------------------------------------------- placeholders */

void secret_placeholder(server *srv, const char *sbx_id, const char *name, char out[EGRESS_PLACEHOLDER_LEN + 1]) {
        char msg[256];
        int n = snprintf(msg, sizeof msg, "secret-placeholder:%s:%s", sbx_id, name);
        if (n < 0 || (size_t) n >= sizeof msg)
                n = (int) sizeof msg - 1; /* ids and names are bounded far below this */
        uint8_t mac[32];
        unsigned len = sizeof mac;
        HMAC(EVP_sha256(), srv->master, sizeof srv->master, (const uint8_t *) msg, (size_t) n, mac, &len);
        static const char digits[] = "0123456789abcdef";
        memcpy(out, "hsp_", 4);
        for (size_t i = 0; i < 20; i++) {
                out[4 + 2 * i] = digits[mac[i] >> 4];
                out[5 + 2 * i] = digits[mac[i] & 15];
        }
        out[EGRESS_PLACEHOLDER_LEN] = 0;
}


/* The hosts a secret is bound to, as strings (its hosts_json). */
static json_t *secret_hosts(const store_secret *s) {
        json_t *h = json_loads(s->hosts_json, 0, NULL);
        if (!json_is_array(h)) {
                json_decref(h);
                h = json_array();
        }
        return h;
}

int secrets_env_rewrite(server *srv, int64_t team, const char *sbx_id, json_t *env, json_t *names, char *why,
                        size_t wl) {
        const char *k;
        json_t *v;
        json_object_foreach(env, k, v) {
                const char *s = json_string_value(v);
                if (!s || !strstr(s, SECRET_REF_OPEN))
                        continue;
                size_t cap = strlen(s) * 4 + 64;
                char *out = malloc(cap);
                if (!out)
                        return -ENOMEM;
                size_t n = 0;
                const char *p = s;
                for (;;) {
                        const char *ref = strstr(p, SECRET_REF_OPEN);
                        size_t lit = ref ? (size_t) (ref - p) : strlen(p);
                        memcpy(out + n, p, lit);
                        n += lit;
                        if (!ref)
                                break;
                        const char *nm = ref + strlen(SECRET_REF_OPEN), *e = strchr(nm, '}');
                        if (!e || !egress_secret_name_valid(nm, (size_t) (e - nm))) {
                                snprintf(why, wl, "envVars.%s: a malformed ${e2b.secrets.NAME} reference", k);
                                free(out);
                                return -EINVAL;
                        }
                        char name[EGRESS_SECRET_NAME_MAX + 1];
                        snprintf(name, sizeof name, "%.*s", (int) (e - nm), nm);
                        for (char *c = name; *c; c++)
                                if (*c >= 'A' && *c <= 'Z')
                                        *c = (char) (*c - 'A' + 'a');
                        store_secret sec;
                        hutch_error err = { 0 };
                        if (store_secret_get(srv->store, team, name, &sec, &err) < 0) {
                                snprintf(why, wl, "envVars.%s: secret \"%s\" not found", k, name);
                                free(out);
                                return -ENOENT;
                        }
                        json_t *hosts = secret_hosts(&sec);
                        size_t nh = json_array_size(hosts);
                        json_decref(hosts);
                        store_secret_clear(&sec);
                        if (nh == 0) {
                                snprintf(why, wl,
                                         "envVars.%s: secret \"%s\" is bound to no host (give it \"hosts\"), so "
                                         "it cannot be used from the environment; network.rules can use it",
                                         k, name);
                                free(out);
                                return -EINVAL;
                        }
                        char ph[EGRESS_PLACEHOLDER_LEN + 1];
                        secret_placeholder(srv, sbx_id, name, ph);
                        memcpy(out + n, ph, EGRESS_PLACEHOLDER_LEN);
                        n += EGRESS_PLACEHOLDER_LEN;
                        bool have = false;
                        size_t i;
                        json_t *x;
                        json_array_foreach(names, i, x) have |= json_is_string(x) && streq(json_string_value(x), name);
                        if (!have)
                                json_array_append_new(names, json_string(name));
                        p = e + 1;
                }
                out[n] = 0;
                json_object_set_new(env, k, json_string(out));
                free(out);
        }
        return 0;
}

/* ------------------------------------------------- a sandbox's rules set */

/* Validate E2B's network.rules object into x (NULL: only validate). */
int secrets_rules_validate(json_t *rules, egress_inject *x, char *why, size_t wl) {
        if (!rules || json_is_null(rules))
                return 0;
        if (!json_is_object(rules)) {
                snprintf(why, wl, "network.rules must be an object of host: [rule]");
                return -EINVAL;
        }
        egress_inject *tmp = NULL;
        if (!x) {
                if (egress_inject_new(&tmp) < 0)
                        return -ENOMEM;
                x = tmp;
        }
        int r = 0;
        const char *host;
        json_t *list;
        json_object_foreach(rules, host, list) {
                if (streq(host, "*")) {
                        snprintf(why, wl, "network.rules: a bare \"*\" is not a host pattern");
                        r = -EINVAL;
                        break;
                }
                if (!json_is_array(list)) {
                        snprintf(why, wl, "network.rules[\"%.64s\"] must be an array", host);
                        r = -EINVAL;
                        break;
                }
                size_t i;
                json_t *rule;
                json_array_foreach(list, i, rule) {
                        json_t *tr = json_object_get(rule, "transform");
                        json_t *hdrs = tr ? json_object_get(tr, "headers") : NULL;
                        if (!json_is_object(rule) || (tr && !json_is_object(tr)) || (hdrs && !json_is_object(hdrs))) {
                                snprintf(why, wl, "network.rules[\"%.64s\"][%zu]: {transform: {headers: {...}}}",
                                         host, i);
                                r = -EINVAL;
                                break;
                        }
                        const char *hn;
                        json_t *hv;
                        json_object_foreach(hdrs, hn, hv) {
                                if (!json_is_string(hv)) {
                                        snprintf(why, wl, "network.rules[\"%.64s\"]: header %.64s must be a string",
                                                 host, hn);
                                        r = -EINVAL;
                                        break;
                                }
                                r = egress_inject_add_transform(x, host, hn, json_string_value(hv), why, wl);
                                if (r < 0)
                                        break;
                        }
                        if (r < 0)
                                break;
                }
                if (r < 0)
                        break;
        }
        egress_inject_free(tmp);
        return r;
}

int secrets_build_inject(server *srv, sbx *sb, json_t *rules, egress_inject **ret) {
        egress_inject *x = NULL;
        char why[256];
        int r = egress_inject_new(&x);
        if (r < 0)
                return r;
        if ((r = secrets_rules_validate(rules, x, why, sizeof why)) < 0) {
                log_warning("sandbox %s: network.rules: %s", sb->id, why);
                egress_inject_free(x);
                return r;
        }
        json_t *names = json_object_get(sb->extra, "secretRefs");
        size_t i;
        json_t *n;
        json_array_foreach(names, i, n) {
                const char *name = json_string_value(n);
                store_secret sec;
                hutch_error err = { 0 };
                if (!name || store_secret_get(srv->store, sb->team_id, name, &sec, &err) < 0)
                        continue; /* deleted: its placeholder now goes nowhere */
                json_t *hosts = secret_hosts(&sec);
                size_t nh = json_array_size(hosts);
                const char **hv = calloc(nh + 1, sizeof *hv);
                for (size_t j = 0; hv && j < nh; j++)
                        hv[j] = json_string_value(json_array_get(hosts, j));
                char ph[EGRESS_PLACEHOLDER_LEN + 1];
                secret_placeholder(srv, sb->id, name, ph);
                if (hv && nh && egress_inject_add_placeholder(x, ph, name, hv, nh, why, sizeof why) < 0)
                        log_warning("sandbox %s: secret %s: %s", sb->id, name, why);
                free(hv);
                json_decref(hosts);
                store_secret_clear(&sec);
        }
        *ret = x;
        return 0;
}

/* A secret bound to hosts goes to those only, whatever a rule says (a rule
 * naming another host cannot carry it there). */
static bool secret_allows(const store_secret *s, const egress_host *h, uint16_t port) {
        json_t *hosts = secret_hosts(s);
        size_t n = json_array_size(hosts), i;
        bool ok = n == 0;
        json_t *v;
        json_array_foreach(hosts, i, v) {
                egress_rule r;
                char why[64];
                const char *t = json_string_value(v);
                if (t && egress_rule_parse(t, &r, why, sizeof why) >= 0 && egress_rule_matches_host(&r, h, port))
                        ok = true;
        }
        json_decref(hosts);
        return ok;
}

int secrets_resolve(void *userdata, const char *sandbox_id, const char *name, const egress_host *h, uint16_t port,
                    char **ret, size_t *ret_len) {
        server *srv = userdata;
        sbx *sb = sbx_find(srv, sandbox_id);
        if (!sb)
                return -ENOENT;
        hutch_error err = { 0 };
        store_secret meta;
        if (store_secret_get(srv->store, sb->team_id, name, &meta, &err) < 0)
                return -ENOENT;
        int r = secret_allows(&meta, h, port) ? store_secret_value_of(srv->store, &meta, ret, ret_len, &err) : -EACCES;
        store_secret_clear(&meta);
        audit_secret_use(srv, sandbox_id, name, h ? h->text : NULL, port, r);
        if (r == -EACCES)
                return r;
        if (r < 0 && r != -ENOENT)
                log_warning("sandbox %s: secret %s: %s", sandbox_id, name, err.msg);
        return r;
}

/* ------------------------------------------------------------------- API */

static json_t *secret_json(const store_secret *s) {
        char c[40], u[40];
        format_rfc3339(s->created_ms, c);
        format_rfc3339(s->updated_ms, u);
        json_t *md = json_loads(s->metadata_json, 0, NULL);
        if (!json_is_object(md)) {
                json_decref(md);
                md = json_object();
        }
        return json_pack("{s:s, s:s, s:s, s:s, s:I, s:o, s:o}", "secretID", s->id, "name", s->name, "createdAt", c,
                         "updatedAt", u, "currentVersion", (json_int_t) s->version, "metadata", md, "hosts",
                         secret_hosts(s));
}

static int check_metadata(json_t *md, char *why, size_t wl) {
        if (!md || json_is_null(md))
                return 0;
        if (!json_is_object(md) || json_object_size(md) > METADATA_ENTRIES_MAX) {
                snprintf(why, wl, "metadata must be an object of at most %d strings", METADATA_ENTRIES_MAX);
                return -EINVAL;
        }
        size_t total = 0;
        const char *k;
        json_t *v;
        json_object_foreach(md, k, v) {
                if (!json_is_string(v) || strlen(k) > 128 || json_string_length(v) > 1024) {
                        snprintf(why, wl, "metadata: keys of at most 128 bytes, string values of at most 1024");
                        return -EINVAL;
                }
                total += strlen(k) + json_string_length(v);
        }
        if (total > METADATA_TOTAL_MAX) {
                snprintf(why, wl, "metadata is at most %d bytes in total", METADATA_TOTAL_MAX);
                return -EINVAL;
        }
        return 0;
}

/* The hosts a secret may be sent to: body "hosts" (array), else metadata
 * "hosts" (comma-separated, for SDKs that only send metadata). Returns a
 * canonical JSON array, or NULL (with why) when one is invalid; an absent
 * list is []. */
static json_t *parse_hosts(json_t *body, json_t *md, bool *ret_given, char *why, size_t wl) {
        json_t *out = json_array();
        json_t *h = json_object_get(body, "hosts");
        const char *mh = json_string_value(json_object_get(md, "hosts"));
        json_t *list = NULL;
        *ret_given = (h && !json_is_null(h)) || mh;
        if (h && !json_is_null(h)) {
                if (!json_is_array(h)) {
                        snprintf(why, wl, "hosts must be an array of host rules");
                        json_decref(out);
                        return NULL;
                }
                list = json_incref(h);
        } else if (mh) {
                list = json_array();
                char *copy = strdup(mh), *save = NULL;
                for (char *t = copy ? strtok_r(copy, ", ", &save) : NULL; t; t = strtok_r(NULL, ", ", &save))
                        json_array_append_new(list, json_string(t));
                free(copy);
        }
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
                egress_rule r;
                const char *s = json_string_value(v);
                if (!s || egress_rule_parse(s, &r, why, wl) < 0 || r.kind == EGRESS_RULE_ALL) {
                        if (s && r.kind == EGRESS_RULE_ALL)
                                snprintf(why, wl, "hosts: a secret cannot be bound to every host");
                        else if (!s)
                                snprintf(why, wl, "hosts[%zu] must be a string", i);
                        json_decref(list);
                        json_decref(out);
                        return NULL;
                }
                char text[EGRESS_RULE_TEXT_MAX];
                (void) egress_rule_format(&r, text, sizeof text);
                json_array_append_new(out, json_string(text));
        }
        json_decref(list);
        if (json_array_size(out) > 64) {
                snprintf(why, wl, "hosts: at most 64");
                json_decref(out);
                return NULL;
        }
        return out;
}

static int check_value(json_t *v, const char **ret, size_t *ret_len, char *why, size_t wl) {
        const char *s = json_string_value(v);
        size_t n = s ? json_string_length(v) : 0;
        /* the proxy sends only values it can mask in responses */
        if (!s || n == 0 || n > EGRESS_MASK_VALUE_MAX) {
                snprintf(why, wl, "value must be a string of 1..%d bytes", EGRESS_MASK_VALUE_MAX);
                return -EINVAL;
        }
        if (memchr(s, '\r', n) || memchr(s, '\n', n) || memchr(s, 0, n)) {
                snprintf(why, wl, "value cannot hold CR, LF or NUL: it is put into HTTP headers");
                return -EINVAL;
        }
        *ret = s;
        *ret_len = n;
        return 0;
}

static enum MHD_Result reply_store_error(request *req, int r, const hutch_error *err) {
        if (r == -ENOENT)
                return http_reply_error(req->conn, 404, "%s", err->msg);
        if (r == -EEXIST)
                return http_reply_error(req->conn, 409, "%s", err->msg);
        log_error("secrets: %s", err->msg);
        return http_reply_error(req->conn, 500, "%s", err->msg);
}

/* Rebuild the credential rules of the team's live sandboxes: a secret's
 * hosts changed, or it went away. */
static void refresh_team(server *srv, int64_t team) {
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && sb->team_id == team)
                        egress_sbx_refresh_inject(srv, sb);
}

static enum MHD_Result secrets_list(server *srv, request *req) {
        const char *l = http_query(req->conn, "limit"), *t = http_query(req->conn, "nextToken");
        unsigned limit = 100;
        if (l && *l) {
                char *x;
                unsigned long v = strtoul(l, &x, 10);
                if (*x || v < 1 || v > 100)
                        return http_reply_error(req->conn, 400, "limit must be 1..100");
                limit = (unsigned) v;
        }
        /* the token is the last name, hex-encoded (names may hold anything
         * a header value cannot) */
        char after[EGRESS_SECRET_NAME_MAX + 1] = "";
        if (t && *t) {
                size_t n = strlen(t);
                if (n % 2 || n / 2 > EGRESS_SECRET_NAME_MAX)
                        return http_reply_error(req->conn, 400, "invalid nextToken");
                for (size_t i = 0; i < n / 2; i++) {
                        unsigned v;
                        if (sscanf(t + 2 * i, "%2x", &v) != 1)
                                return http_reply_error(req->conn, 400, "invalid nextToken");
                        after[i] = (char) v;
                }
                after[n / 2] = 0;
        }
        store_secret *v = NULL;
        size_t n = 0;
        hutch_error err = { 0 };
        int r = store_secret_list(srv->store, req->team, after, limit + 1, &v, &n, &err);
        if (r < 0)
                return reply_store_error(req, r, &err);
        json_t *arr = json_array();
        for (size_t i = 0; i < n && i < limit; i++)
                json_array_append_new(arr, secret_json(&v[i]));
        char token[2 * EGRESS_SECRET_NAME_MAX + 1] = "";
        if (n > limit) {
                const char *last = v[limit - 1].name;
                for (size_t i = 0; last[i]; i++)
                        snprintf(token + 2 * i, 3, "%02x", (unsigned char) last[i]);
        }
        store_secret_array_free(v, n);
        return http_reply_json_page(req->conn, arr, token);
}

/* The value was in the request body and in jansson's copy: wipe both. */
static void wipe_request(request *req, json_t *body, const char *value, size_t vlen) {
        if (value)
                OPENSSL_cleanse((char *) value, vlen);
        json_decref(body);
        if (req->body)
                OPENSSL_cleanse(req->body, req->body_len);
}

/* What create and update take: value, metadata, hosts, all checked. */
typedef struct secret_body {
        const char *value; /* in the request's JSON */
        size_t vlen;
        char *hosts_json;    /* canonical rules, or NULL when the body names none */
        char *metadata_json; /* or NULL when the body has none */
} secret_body;

static void secret_body_clear(secret_body *b) {
        free(b->hosts_json);
        free(b->metadata_json);
        b->hosts_json = b->metadata_json = NULL;
}

static int secret_body_parse(json_t *body, secret_body *ret, char *why, size_t wl) {
        secret_body b = { 0 };
        json_t *md = json_object_get(body, "metadata");
        bool given = false;
        json_t *hosts = NULL;
        int r = check_value(json_object_get(body, "value"), &b.value, &b.vlen, why, wl);
        if (r >= 0)
                r = check_metadata(md, why, wl);
        if (r >= 0 && !(hosts = parse_hosts(body, md, &given, why, wl)))
                r = -EINVAL;
        if (r < 0)
                return r;
        b.hosts_json = given ? json_dumps(hosts, JSON_COMPACT) : NULL;
        b.metadata_json = md && !json_is_null(md) ? json_dumps(md, JSON_COMPACT) : NULL;
        json_decref(hosts);
        *ret = b;
        return 0;
}

static enum MHD_Result secrets_create(server *srv, request *req) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        char why[256];
        const char *name = json_string_value(json_object_get(body, "name"));
        secret_body b;
        int r = 0;
        if (!name || !egress_secret_name_valid(name, strlen(name)) || strncasecmp(name, "sec_", 4) == 0) {
                snprintf(why, sizeof why,
                         "name must be 1..128 bytes without '{', '}' or control characters, not starting with sec_");
                r = -EINVAL;
        }
        if (r >= 0)
                r = secret_body_parse(body, &b, why, sizeof why);
        if (r < 0) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "%s", why);
        }
        store_secret s;
        hutch_error err = { 0 };
        r = store_secret_create(srv->store, req->team, name, b.value, b.vlen, b.hosts_json, b.metadata_json, &s, &err);
        secret_body_clear(&b);
        wipe_request(req, body, b.value, b.vlen);
        if (r < 0)
                return reply_store_error(req, r, &err);
        char detail[200];
        snprintf(detail, sizeof detail, "{\"secret\":\"%s\"}", s.id);
        (void) store_event_add(srv->store, req->team, NULL, "secret.create", detail, &err);
        json_t *j = secret_json(&s);
        store_secret_clear(&s);
        return http_reply_json(req->conn, 201, j);
}

static enum MHD_Result secrets_update(server *srv, request *req, const char *id) {
        json_t *body;
        if (api_parse_body(req, &body) < 0)
                return MHD_YES;
        char why[256];
        secret_body b;
        int r = secret_body_parse(body, &b, why, sizeof why);
        if (r < 0) {
                json_decref(body);
                return http_reply_error(req->conn, 400, "%s", why);
        }
        bool given = b.hosts_json != NULL;
        store_secret s;
        hutch_error err = { 0 };
        r = store_secret_update(srv->store, req->team, id, b.value, b.vlen, b.hosts_json, b.metadata_json, &s, &err);
        secret_body_clear(&b);
        wipe_request(req, body, b.value, b.vlen);
        if (r < 0)
                return reply_store_error(req, r, &err);
        char detail[200];
        snprintf(detail, sizeof detail, "{\"secret\":\"%s\",\"version\":%lld}", s.id, (long long) s.version);
        (void) store_event_add(srv->store, req->team, NULL, "secret.update", detail, &err);
        if (given)
                refresh_team(srv, req->team);
        json_t *j = secret_json(&s);
        store_secret_clear(&s);
        return http_reply_json(req->conn, 200, j);
}

enum MHD_Result secrets_dispatch(server *srv, request *req, const route *rt) {
        store_secret s;
        hutch_error err = { 0 };
        int r;
        switch (rt->kind) {
        case ROUTE_SECRETS_LIST:
                return secrets_list(srv, req);
        case ROUTE_SECRETS_CREATE:
                return secrets_create(srv, req);
        case ROUTE_SECRET_UPDATE:
                return secrets_update(srv, req, rt->secret);
        case ROUTE_SECRET_GET:
                r = store_secret_get(srv->store, req->team, rt->secret, &s, &err);
                if (r < 0)
                        return reply_store_error(req, r, &err);
                {
                        json_t *j = secret_json(&s);
                        store_secret_clear(&s);
                        return http_reply_json(req->conn, 200, j);
                }
        case ROUTE_SECRET_DELETE:
                r = store_secret_delete(srv->store, req->team, rt->secret, &err);
                if (r < 0)
                        return reply_store_error(req, r, &err);
                {
                        char detail[200];
                        snprintf(detail, sizeof detail, "{\"secret\":\"%.160s\"}", rt->secret);
                        json_t *d = json_pack("{s:s}", "secret", rt->secret);
                        char *ds = json_dumps(d, JSON_COMPACT);
                        json_decref(d);
                        (void) store_event_add(srv->store, req->team, NULL, "secret.delete", ds ? ds : detail, &err);
                        free(ds);
                }
                refresh_team(srv, req->team);
                return http_reply_empty(req->conn, 204);
        }
        return http_reply_error(req->conn, 404, "no route");
}
