/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's half of egress (issue #4, docs/egress.md): the operator's
 * ceiling from the settings, one egress_proxy on the loop, a site per
 * sandbox whose network is on, E2B's network fields in and out, PUT
 * /sandboxes/{id}/network, the decision log in SQLite and
 * GET /sandboxes/{id}/egress.
 *
 * A sandbox's network spec is kept normalized in its extra JSON under
 * "egress": {"internet": true|false|absent, "allowOut": [...],
 * "denyOut": [...]}; the policy is rebuilt from it at re-adoption.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "daemon/ingress.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "egress/policy.h"
#include "egress/proxy.h"
#include "egress/tlsmint.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"

/* ------------------------------------------------------------- settings */

static int add_list(server *srv, const char *list, int (*add)(egress_ceiling *, const char *, char *, size_t),
                    const char *setting) {
        char why[256];
        int r = egress_ceiling_add_list(srv->egress_ceiling, list, add, why, sizeof why);
        if (r < 0)
                log_error("%s: %s", setting, r == -ENOMEM ? "out of memory" : why);
        return r;
}

static int ceiling_setup(server *srv) {
        int r = egress_ceiling_new(&srv->egress_ceiling);
        if (r < 0)
                return r;
        /* A ceiling allow list is a plain rule list, ports allowed. */
        if ((r = add_list(srv, srv->cfg.egress_allow, egress_ceiling_add_allow, "egress-allow")) < 0 ||
            (r = add_list(srv, srv->cfg.egress_deny, egress_ceiling_add_deny, "egress-deny")) < 0 ||
            (r = add_list(srv, srv->cfg.egress_open, egress_ceiling_allow_private, "egress-open")) < 0)
                return r;

        /* The host's own addresses, as this netns sees them: never a
         * destination, whatever a policy says. */
        int n = egress_ceiling_add_host_addresses(srv->egress_ceiling);
        if (n < 0)
                return log_error_errno(n, "getifaddrs: %m");
        log_debug("egress: %d host address(es) refused as destinations", n);
        return 0;
}

static int nameservers_setup(server *srv, egress_proxy_config *pc) {
        char why[128];
        int n = egress_nameservers(srv->cfg.dns, pc->nameservers, EGRESS_NAMESERVERS_MAX, why, sizeof why);
        if (n < 0)
                return log_error("dns: %s", why), n;
        pc->n_nameservers = (size_t) n;
        if (!n)
                log_warning("egress: no nameserver (set dns, or list one in /etc/resolv.conf): sandboxes can reach "
                            "addresses but no names");
        return 0;
}

/* --------------------------------------------------------------- records */

static void on_record(void *userdata, const egress_record *r) {
        server *srv = userdata;
        sbx *sb = sbx_find(srv, r->sandbox_id);
        store_egress e = {
                .team_id = sb ? sb->team_id : 0,
                .ts_ms = r->started_ms,
                .kind = (char *) (r->kind ? egress_kind_to_string(r->kind) : ""),
                .method = (char *) r->method,
                .host = (char *) r->host,
                .port = r->port,
                .address = (char *) r->address,
                .allowed = r->allowed,
                .reason = (char *) r->reason,
                .rule = (char *) r->rule,
                .error = (char *) r->error,
                .bytes_out = (int64_t) MIN(r->bytes_out, (uint64_t) INT64_MAX),
                .bytes_in = (int64_t) MIN(r->bytes_in, (uint64_t) INT64_MAX),
                .duration_ms = r->duration_ms,
                .suppressed = (int64_t) MIN(r->suppressed, (uint64_t) INT64_MAX),
                .injected = (char *) (r->injected ? r->injected : ""),
        };
        snprintf(e.sandbox_id, sizeof e.sandbox_id, "%s", r->sandbox_id);
        hutch_error err = { 0 };
        if (store_egress_add(srv->store, &e, &err) < 0)
                log_warning("egress: sandbox %s: recording a decision: %s", r->sandbox_id, err.msg);
        metrics_egress(srv, &e);
        log_debug("egress: %s %s %s:%u %s (%s%s%s)", r->sandbox_id, r->allowed ? "allow" : "deny", r->host, r->port,
                  r->address, r->reason, r->rule[0] ? " " : "", r->rule);
}

static void on_proxy(server *srv, watcher *w, uint32_t revents) {
        egress_proxy_dispatch(srv->egress);
}

int egress_setup(server *srv) {
        int r = ceiling_setup(srv);
        if (r < 0)
                return r;
        egress_proxy_config pc = {
                .max_connections = (unsigned) srv->cfg.egress_connections,
                .bandwidth_bytes = srv->cfg.egress_bandwidth,
                .records_per_second = (unsigned) srv->cfg.egress_records,
                .on_record = on_record,
                .resolve = secrets_resolve,
                .userdata = srv,
        };
        if ((r = nameservers_setup(srv, &pc)) < 0)
                return r;
        char why[256] = "";
        r = tlsmint_new(srv->cfg.data_dir, srv->cfg.egress_upstream_ca[0] ? srv->cfg.egress_upstream_ca : NULL,
                        &srv->mint, why, sizeof why);
        if (r < 0)
                return log_error("egress CA: %s", why), r;
        pc.mint = srv->mint;
        /* what sandboxes trust: the host's bundle and the deployment CA */
        {
                const char *ca = tlsmint_ca_pem(srv->mint);
                char *host = NULL;
                int k = read_file_at(AT_FDCWD, "/etc/ssl/certs/ca-certificates.crt", 16 << 20, &host);
                size_t hl = k >= 0 && host ? strlen(host) : 0;
                srv->ca_bundle_len = hl + 1 + strlen(ca);
                srv->ca_bundle = malloc(srv->ca_bundle_len + 1);
                if (!srv->ca_bundle) {
                        free(host);
                        return -ENOMEM;
                }
                snprintf(srv->ca_bundle, srv->ca_bundle_len + 1, "%s%s%s", hl ? host : "",
                         hl && host[hl - 1] != '\n' ? "\n" : "", ca);
                srv->ca_bundle_len = strlen(srv->ca_bundle);
                free(host);
        }
        if ((r = egress_proxy_new(&pc, &srv->egress)) < 0)
                return log_error_errno(r, "egress proxy: %m");
        srv->egress_w.cb = on_proxy;
        srv->egress_w.data = srv;
        if ((r = loop_add(srv, &srv->egress_w, egress_proxy_fd(srv->egress), EPOLLIN)) < 0)
                return log_error_errno(r, "epoll: %m");
        return 0;
}

void egress_teardown(server *srv) {
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                sb->egress = NULL; /* closed with the proxy below */
        for (sbx *sb = srv->pool; sb; sb = sb->next)
                sb->egress = NULL;
        if (srv->egress_w.fd >= 0)
                loop_del(srv, &srv->egress_w);
        srv->egress = egress_proxy_free(srv->egress);
        egress_ceiling_unrefp(&srv->egress_ceiling);
        srv->mint = tlsmint_free(srv->mint);
        free(srv->ca_bundle);
        srv->ca_bundle = NULL;
}

/* ----------------------------------------------------------------- specs */

static int strings_of(json_t *arr, const char *field, const char ***ret, size_t *ret_n, char *why, size_t wl) {
        *ret = NULL;
        *ret_n = 0;
        if (!arr || json_is_null(arr))
                return 0;
        if (!json_is_array(arr)) {
                snprintf(why, wl, "%s must be an array of strings", field);
                return -EINVAL;
        }
        size_t n = json_array_size(arr);
        if (n > EGRESS_RULES_MAX) {
                snprintf(why, wl, "%s has %zu entries; at most %d", field, n, EGRESS_RULES_MAX);
                return -E2BIG;
        }
        const char **v = calloc(n + 1, sizeof *v);
        if (!v)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                v[i] = json_string_value(json_array_get(arr, i));
                if (!v[i]) {
                        snprintf(why, wl, "%s[%zu] must be a string", field, i);
                        free(v);
                        return -EINVAL;
                }
        }
        *ret = v;
        *ret_n = n;
        return 0;
}

/* A policy from a normalized spec. *ret is NULL when the network is off:
 * internet access off and nothing allowed. */
static int policy_from_spec(server *srv, json_t *spec, egress_policy **ret, char *why, size_t wl) {
        json_t *inet = json_object_get(spec, "internet");
        int aia = json_is_true(inet) ? 1 : json_is_false(inet) ? 0 : -1;
        const char **allow = NULL, **deny = NULL;
        size_t na = 0, nd = 0;
        int r = strings_of(json_object_get(spec, "allowOut"), "network.allowOut", &allow, &na, why, wl);
        if (r >= 0)
                r = strings_of(json_object_get(spec, "denyOut"), "network.denyOut", &deny, &nd, why, wl);
        egress_policy *p = NULL;
        if (r >= 0)
                r = egress_policy_from_e2b(aia, allow, na, deny, nd, &p, why, wl);
        free(allow);
        free(deny);
        if (r < 0)
                return r;
        if (aia == 0 && na == 0) {
                egress_policy_free(p);
                *ret = NULL;
                return 0;
        }
        egress_policy_set_ceiling(p, srv->egress_ceiling);
        *ret = p;
        return 0;
}

static json_t *spec_get(sbx *sb) {
        json_t *s = json_object_get(sb->extra, "egress");
        return json_is_object(s) ? s : NULL;
}

int egress_spec_from_create(server *srv, json_t *body, json_t **ret, char *why, size_t wl) {
        json_t *spec = json_object();
        json_t *aia = json_object_get(body, "allow_internet_access");
        if (aia && !json_is_null(aia)) {
                if (!json_is_boolean(aia)) {
                        json_decref(spec);
                        snprintf(why, wl, "allow_internet_access must be a boolean");
                        return -EINVAL;
                }
                json_object_set(spec, "internet", aia);
        }
        json_t *net = json_object_get(body, "network");
        if (net && !json_is_null(net)) {
                if (!json_is_object(net)) {
                        json_decref(spec);
                        snprintf(why, wl, "network must be an object");
                        return -EINVAL;
                }
                json_t *ep = json_object_get(net, "egressProxy");
                if (ep && !json_is_null(ep)) {
                        json_decref(spec);
                        snprintf(why, wl, "network.egressProxy is not supported: hutch's own proxy is every "
                                          "sandbox's only way out");
                        return -EINVAL;
                }
                json_t *rules = json_object_get(net, "rules");
                if (secrets_rules_validate(rules, NULL, why, wl) < 0) {
                        json_decref(spec);
                        return -EINVAL;
                }
                const char *keys[] = { "allowOut", "denyOut", "rules" };
                for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                        json_t *v = json_object_get(net, keys[i]);
                        if (v && !json_is_null(v))
                                json_object_set(spec, keys[i], v);
                }
        }
        /* validate now: a bad rule is the client's 400, before anything exists */
        egress_policy *p = NULL;
        int r = policy_from_spec(srv, spec, &p, why, wl);
        egress_policy_free(p);
        if (r < 0) {
                json_decref(spec);
                return r;
        }
        *ret = spec;
        return 0;
}

/* ------------------------------------------------------------ per sandbox */

static int site_open(server *srv, sbx *sb, egress_policy *p) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/net", (int) hutch_sandbox_init_pid(sb->h));
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                egress_policy_free(p);
                return -errno;
        }
        int r = egress_site_open(srv->egress, sb->id, fd, (uint16_t) srv->cfg.egress_port, p, &sb->egress);
        close(fd);
        return r;
}

int egress_sbx_start(server *srv, sbx *sb) {
        json_t *spec = spec_get(sb);
        if (!spec || sb->egress)
                return 0;
        char why[256];
        egress_policy *p = NULL;
        int r = policy_from_spec(srv, spec, &p, why, sizeof why);
        if (r < 0) {
                log_error("sandbox %s: network spec: %s", sb->id, why);
                return r;
        }
        hutch_error e = { 0 };
        if (!p) {
                /* network off: a gvisor sandbox restored from one with it on
                 * must not keep listening */
                (void) hutch_sandbox_set_network(sb->h, false, &e);
                return 0;
        }
        r = site_open(srv, sb, p);
        if (r < 0)
                log_error("sandbox %s: egress proxy: %s", sb->id, strerror(-r));
        else {
                egress_sbx_refresh_inject(srv, sb);
                if (hutch_sandbox_set_network(sb->h, true, &e) < 0)
                        log_error("sandbox %s: opening its way to the egress proxy: %s", sb->id, e.msg);
        }
        return r;
}

/* A pooled sandbox's listener, bound when it joins the pool so that its
 * create needs no setns: until then it refuses everything (what a create
 * with its internet access off would get), and the create's own policy
 * replaces that at the claim (egress_sbx_claim). */
int egress_sbx_pool_open(server *srv, sbx *sb) {
        if (sb->egress)
                return 0;
        char why[256];
        egress_policy *p = NULL;
        int r = egress_policy_from_e2b(0, NULL, 0, NULL, 0, &p, why, sizeof why);
        if (r < 0) {
                log_warning("warm pool: sandbox %s: its closed egress policy: %s", sb->id, why);
                return r;
        }
        egress_policy_set_ceiling(p, srv->egress_ceiling);
        if ((r = site_open(srv, sb, p)) < 0)
                return r;
        hutch_error e = { 0 };
        if ((r = hutch_sandbox_set_network(sb->h, true, &e)) < 0) {
                log_warning("warm pool: sandbox %s: opening its way to the egress proxy: %s",
                            sb->id, e.msg);
                egress_sbx_stop(srv, sb);
        }
        return r;
}

int egress_sbx_claim(server *srv, sbx *sb) {
        if (!sb->egress)
                return egress_sbx_start(srv, sb); /* the pool could not open it */
        json_t *spec = spec_get(sb);
        egress_policy *p = NULL;
        if (spec) {
                char why[256];
                int r = policy_from_spec(srv, spec, &p, why, sizeof why);
                if (r < 0) {
                        log_error("sandbox %s: network spec: %s", sb->id, why);
                        return r;
                }
        }
        if (!p) {
                /* network off: no listener, and (gvisor) no way to one */
                hutch_error e = { 0 };
                egress_sbx_stop(srv, sb);
                (void) hutch_sandbox_set_network(sb->h, false, &e);
                return 0;
        }
        (void) egress_site_set_policy(sb->egress, p); /* nothing connected while it waited */
        egress_sbx_refresh_inject(srv, sb);
        return 0;
}

void egress_sbx_refresh_inject(server *srv, sbx *sb) {
        if (!sb->egress)
                return;
        json_t *spec = spec_get(sb);
        egress_inject *x = NULL;
        if (secrets_build_inject(srv, sb, spec ? json_object_get(spec, "rules") : NULL, &x) < 0)
                return;
        egress_site_set_inject(sb->egress, x);
}

int egress_sbx_env_secrets(server *srv, sbx *sb, json_t *env, char *why, size_t wl) {
        json_t *names = json_object_get(sb->extra, "secretRefs");
        if (!json_is_array(names)) {
                names = json_array();
                json_object_set_new(sb->extra, "secretRefs", names);
        }
        size_t before = json_array_size(names);
        int r = secrets_env_rewrite(srv, sb->team_id, sb->id, env, names, why, wl);
        if (r < 0)
                return r;
        if (json_array_size(names) != before) {
                egress_sbx_refresh_inject(srv, sb);
                save_sandbox_extra(srv, sb);
        }
        return 0;
}

void egress_sbx_stop(server *srv, sbx *sb) {
        egress_site_close(sb->egress);
        sb->egress = NULL;
}

#define SBX_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define SBX_CA_FILE "/etc/ssl/certs/hutch-egress-ca.pem"

int egress_sbx_install_ca(server *srv, sbx *sb, hutch_error *err) {
        static const hutch_fs_user root = { 0, 0 };
        if (!srv->mint)
                return 0;
        const char *ca = tlsmint_ca_pem(srv->mint);
        int r = hutch_fs_write_buffer(sb->h, &root, SBX_CA_FILE, ca, strlen(ca), err);
        if (r >= 0)
                r = hutch_fs_write_buffer(sb->h, &root, SBX_CA_BUNDLE, srv->ca_bundle, srv->ca_bundle_len, err);
        sbx_mark_dirty(sb);
        return r;
}

void egress_sbx_env(server *srv, sbx *sb, json_t *env) {
        if (srv->mint) {
                /* every TLS stack's way of naming its trust store */
                json_object_set_new(env, "SSL_CERT_FILE", json_string(SBX_CA_BUNDLE));
                json_object_set_new(env, "REQUESTS_CA_BUNDLE", json_string(SBX_CA_BUNDLE));
                json_object_set_new(env, "CURL_CA_BUNDLE", json_string(SBX_CA_BUNDLE));
                json_object_set_new(env, "NODE_EXTRA_CA_CERTS", json_string(SBX_CA_FILE));
        }
        /* a pooled sandbox's listener refuses everything until its claim:
         * what starts in it then (an interpreter's kernels) gets no proxy,
         * as before the pool opened one */
        if (!sb->egress || sb->pooled)
                return;
        char vars[8][64];
        int n = egress_proxy_env((uint16_t) srv->cfg.egress_port, vars);
        for (int i = 0; i < n; i++) {
                char *eq = strchr(vars[i], '=');
                *eq = 0;
                json_object_set_new(env, vars[i], json_string(eq + 1));
        }
}

json_t *egress_network_json(server *srv, sbx *sb, json_t **ret_internet) {
        json_t *spec = spec_get(sb);
        json_t *inet = spec ? json_object_get(spec, "internet") : NULL;
        *ret_internet = json_is_boolean(inet) ? json_incref(inet) : json_null();
        json_t *allow = json_array(), *deny = json_array();
        const egress_policy *p = sb->egress ? egress_site_policy(sb->egress) : NULL;
        char **a = NULL, **d = NULL;
        if (p && egress_policy_to_strings(p, &a, &d) >= 0) {
                for (char **x = a; x && *x; x++)
                        json_array_append_new(allow, json_string(*x));
                for (char **x = d; x && *x; x++)
                        json_array_append_new(deny, json_string(*x));
                egress_strv_free(a);
                egress_strv_free(d);
        } else if (!p)
                json_array_append_new(deny, json_string("0.0.0.0/0")); /* off: nothing leaves */
        json_t *rules = spec ? json_object_get(spec, "rules") : NULL;
        json_t *net = json_pack("{s:o, s:o, s:o, s:n, s:[]}", "allowOut", allow, "denyOut", deny, "rules",
                                json_is_object(rules) ? json_incref(rules) : json_object(), "egressProxy",
                                "httpsPorts");
        ingress_network_json(sb, net);
        return net;
}

/* PUT /sandboxes/{id}/network: the lists are replaced (absent = empty);
 * allow_internet_access, when present, replaces the previous value. */
int egress_sbx_update(server *srv, sbx *sb, json_t *body, unsigned *ret_closed, char *why, size_t wl) {
        json_t *spec = NULL;
        /* the same validation as create; the body is shaped like create's network object */
        json_t *as_create = json_object();
        json_t *aia = json_object_get(body, "allow_internet_access");
        if (aia)
                json_object_set(as_create, "allow_internet_access", aia);
        json_object_set(as_create, "network", body);
        int r = egress_spec_from_create(srv, as_create, &spec, why, wl);
        json_decref(as_create);
        if (r < 0)
                return r;
        if (!json_object_get(spec, "internet")) {
                json_t *old = spec_get(sb);
                json_t *oi = old ? json_object_get(old, "internet") : NULL;
                if (json_is_boolean(oi))
                        json_object_set(spec, "internet", oi);
        }
        egress_policy *p = NULL;
        r = policy_from_spec(srv, spec, &p, why, wl);
        if (r < 0) {
                json_decref(spec);
                return r;
        }
        *ret_closed = 0;
        hutch_error e = { 0 };
        if (!p) {
                if (sb->egress)
                        *ret_closed = egress_site_connections(sb->egress);
                egress_sbx_stop(srv, sb);
                /* gvisor: the sandbox's listener goes too (not while paused:
                 * a frozen init cannot answer) */
                if (!sb->paused)
                        (void) hutch_sandbox_set_network(sb->h, false, &e);
        } else if (sb->egress) {
                int k = egress_site_set_policy(sb->egress, p);
                *ret_closed = k > 0 ? (unsigned) k : 0;
        } else if (hutch_sandbox_is_suspended(sb->h)) {
                /* gvisor, paused to disk: no network namespace to listen in
                 * now; its resume opens the site with this policy */
                egress_policy_free(p);
        } else if ((r = site_open(srv, sb, p)) < 0) {
                json_decref(spec);
                snprintf(why, wl, "cannot open the sandbox's egress proxy: %s", strerror(-r));
                return r;
        } else if (!sb->paused && hutch_sandbox_set_network(sb->h, true, &e) < 0)
                log_error("sandbox %s: opening its way to the egress proxy: %s", sb->id, e.msg);
        json_object_set_new(sb->extra, "egress", spec);
        egress_sbx_refresh_inject(srv, sb);
        return 0;
}

json_t *egress_log_json(const store_egress *v, size_t n) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
                char ts[40];
                format_rfc3339(v[i].ts_ms, ts);
                json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:s, s:i, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I}",
                                       "id", (json_int_t) v[i].id, "timestamp", ts, "kind", v[i].kind, "method",
                                       v[i].method, "host", v[i].host, "port", v[i].port, "address", v[i].address,
                                       "decision", v[i].allowed ? "allow" : "deny", "reason", v[i].reason, "rule",
                                       v[i].rule, "error", v[i].error, "bytesOut", (json_int_t) v[i].bytes_out,
                                       "bytesIn", (json_int_t) v[i].bytes_in, "durationMs",
                                       (json_int_t) v[i].duration_ms, "suppressedBefore",
                                       (json_int_t) v[i].suppressed);
                json_object_set_new(o, "injected", json_string(v[i].injected ? v[i].injected : ""));
                json_array_append_new(arr, o);
        }
        return arr;
}
