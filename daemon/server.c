/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's loop and start-up. Order at start matters (issue: restart
 * without loss): open the database, bind the port, then re-adopt every
 * sandbox the database says is alive, so that clients that retry during
 * start-up reach a server that already knows its sandboxes.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "daemon/ingress.h"
#include "daemon/keysfile.h"
#include "daemon/node.h"
#include "daemon/ingress_h2.h"
#include "daemon/server.h"
#include "daemon/templates.h"
#include "daemon/serve.h"
#include "image/pull.h"
#include "image/reference.h"
#include "daemon/audit.h"
#include "daemon/server.h"
#include "daemon/metrics.h"
#include "daemon/serve.h"
#include "daemon/usage.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/log.h"
#include "util/parse.h"

/* ---------------------------------------------------------------- config */

enum { CFG_STR, CFG_LIST, CFG_U64, CFG_SIZE, CFG_SECONDS, CFG_BOOL };
static const struct cfg_entry {
        const char *name;
        int type;
        size_t off;
        size_t size; /* CFG_STR buffer size */
        uint64_t min, max;
        const char *def;
        const char *help;
} cfg_table[] = {
#define S(f) offsetof(server_config, f), sizeof(((server_config *) 0)->f)
#define U(f) offsetof(server_config, f), 0
        { "listen", CFG_STR, S(listen), 0, 0, "127.0.0.1:49982", "address and port of the HTTP API (HOST:PORT)" },
        { "data-dir", CFG_STR, S(data_dir), 0, 0, "/var/lib/hutch", "database, API key, templates, writable layers" },
        { "run-dir", CFG_STR, S(run_dir), 0, 0, "/run/hutch", "runtime state shared with `hutch run` (sockets, uid ranges)" },
        { "default-timeout", CFG_SECONDS, U(default_timeout_s), 1, 30 * 86400, "300", "sandbox lifetime when create names none" },
        { "max-timeout", CFG_SECONDS, U(max_timeout_s), 1, 365 * 86400, "86400", "longest lifetime a client may ask for" },
        { "max-sandboxes-per-team", CFG_U64, U(max_sandboxes_per_team), 1, 100000, "100", "live sandboxes per team (429 beyond)" },
        { "max-queued-per-team", CFG_U64, U(max_queued_per_team), 1, 100000, "32", "requests that create, resume, pause or snapshot sandboxes (and volume creates) one team may have waiting or running: they run one per loop turn, teams in turn, so that one team's burst only slows that team (429 with Retry-After beyond)" },
        { "max-queued", CFG_U64, U(max_queued), 1, 1000000, "1024", "the same requests waiting in the whole daemon (429 with Retry-After beyond)" },
        { "max-body", CFG_SIZE, U(max_body_bytes), 1024, 1ull << 30, "4M", "largest JSON/RPC request body" },
        { "max-upload", CFG_SIZE, U(max_upload_bytes), 1024, 1ull << 40, "4G", "largest POST /files request after decompression" },
        { "max-connections", CFG_U64, U(max_connections), 4, 1000000, "4096", "open HTTP connections" },
        { "on-stop", CFG_STR, S(on_stop), 0, 0, "keep", "what a stop (SIGTERM, SIGINT) does to this daemon's sandboxes: keep (they run on; the next start re-adopts them and enforces the timeouts that passed meanwhile) or kill" },
        { "tls-cert", CFG_STR, S(tls_cert), 0, 0, "-", "PEM certificate (chain) of the API: serve HTTPS instead of HTTP ('-': none)" },
        { "tls-key", CFG_STR, S(tls_key), 0, 0, "-", "PEM private key of tls-cert ('-': none)" },
        { "sandbox-tls-cert", CFG_STR, S(sandbox_tls_cert), 0, 0, "-", "PEM certificate (chain) served instead of tls-cert to TLS clients whose SNI names a sandbox port, <port>-<id>.<sandbox-domain> (e.g. a wildcard for *.<sandbox-domain>); needs tls-cert and sandbox-domain ('-': none, tls-cert serves every name)" },
        { "sandbox-tls-key", CFG_STR, S(sandbox_tls_key), 0, 0, "-", "PEM private key of sandbox-tls-cert ('-': none)" },
        { "tls-client-ca", CFG_STR, S(tls_client_ca), 0, 0, "-", "PEM CA bundle: mutual TLS, every request but GET /health must come with a client certificate that chains to it, valid now and for TLS clients (e.g. hutch router --node-tls-cert); needs tls-cert ('-': none)" },
        { "max-connections-per-client", CFG_U64, U(max_connections_per_client), 1, 1000000, "1024", "open HTTP connections from one client address (behind a reverse proxy, every client is the proxy's address)" },
        { "idle-timeout", CFG_SECONDS, U(idle_timeout_s), 1, 86400, "600", "an authenticated connection idle this long is closed" },
        { "unauthenticated-timeout", CFG_SECONDS, U(unauth_timeout_s), 1, 86400, "15", "a connection that has not yet sent an authenticated request is closed when idle this long" },
        { "stream-buffer", CFG_SIZE, U(stream_buffer_bytes), 4096, 1ull << 30, "1M", "output queued per stream before the process waits" },
        { "memory", CFG_SIZE, U(memory_mb), 16ull << 20, 1ull << 40, "512M", "default sandbox memory limit" },
        { "cpus", CFG_U64, U(cpu_count), 1, 1024, "2", "default sandbox CPUs" },
        { "disk", CFG_SIZE, U(disk_mb), 16ull << 20, 1ull << 42, "1G", "default writable layer size" },
        { "metrics-interval", CFG_SECONDS, U(metrics_interval_s), 1, 3600, "5", "how often sandbox metrics are sampled" },
        { "pool-size", CFG_U64, U(pool_size), 0, 1000, "2", "sandboxes of the default template (the built base, else host) kept ready, so that create only claims one (0: none)" },
        { "egress-allow", CFG_LIST, S(egress_allow), 0, 0, "", "the ceiling: destinations a sandbox may ever be allowed (rules, comma-separated; empty: none, so nothing leaves; '*': every public address)" },
        { "egress-deny", CFG_LIST, S(egress_deny), 0, 0, "", "destinations no sandbox may reach, whatever it asks (rules, comma-separated)" },
        { "egress-open", CFG_LIST, S(egress_open), 0, 0, "", "reserved ranges (private, link-local, ...) to open, comma-separated CIDRs" },
        { "build-egress", CFG_LIST, S(build_egress), 0, 0, "", "what template build steps may reach: egress rules under the ceiling (empty: nothing, steps have no network)" },
        { "dns", CFG_LIST, S(dns), 0, 0, "", "nameservers the egress proxy asks (comma-separated IPs; empty: /etc/resolv.conf's)" },
        { "retention", CFG_SECONDS, U(retention_s), 1, 87600 * 3600, "168h", "how long the database keeps ended sandboxes' rows and events, and egress records (pruned at start and then every retention/2, at most every 10 minutes)" },
        { "max-snapshots-per-team", CFG_U64, U(max_snapshots_per_team), 1, 1000000, "100", "snapshots a team may keep (429 beyond)" },
        { "snapshot-reserve", CFG_SIZE, U(snapshot_reserve_bytes), 0, 1ull << 50, "1G", "free disk a snapshot must leave on the data dir's file system (507 otherwise)" },
        { "snapshot-jobs", CFG_U64, U(snapshot_jobs), 1, 64, "8", "snapshots, forks and restores whose copying, sealing or unsealing runs at once, each in a worker process off the loop (429 beyond)" },
        { "snapshot-jobs-per-team", CFG_U64, U(snapshot_jobs_per_team), 1, 64, "4", "of those, how many one team may have running (429 beyond): one team's burst leaves the others a worker" },
        { "volume-size", CFG_SIZE, U(volume_size_bytes), 8ull << 20, 1ull << 40, "1G", "size limit of a volume made by POST /volumes (ENOSPC past it; sparse on disk)" },
        { "max-volumes-per-team", CFG_U64, U(max_volumes_per_team), 1, 1000000, "100", "volumes a team may keep (429 beyond)" },
        { "sandbox-domain", CFG_LIST, S(sandbox_domain), 0, 0, "", "domain of sandbox ports: a request with Host <port>-<id>.<domain> reaches that port of that sandbox, and create/connect answer it as 'domain', so the SDK's getHost() names it (may end in :PORT; empty: any domain, answered as null)" },
        { "egress-upstream-ca", CFG_LIST, S(egress_upstream_ca), 0, 0, "", "PEM file of CAs trusted for intercepted upstreams, besides the system store" },
        { "backend", CFG_STR, S(backend), 0, 0, "ns", "isolation backend of sandboxes whose create names none: ns (namespaces) or gvisor (runsc)" },
        { "template-backends", CFG_LIST, S(template_backends), 0, 0, "", "a template's default backend, before 'backend': NAME=BACKEND pairs, comma-separated (templates base, host and code-interpreter-v1 (and its aliases); e.g. base=gvisor: the SDK's default template on gvisor, 'host' on ns)" },
        { "runsc", CFG_STR, S(runsc), 0, 0, "auto", "runsc of the gvisor backend (auto: /usr/bin/runsc, /usr/local/bin/runsc)" },
        { "gvisor-platform", CFG_STR, S(gvisor_platform), 0, 0, "ptrace", "runsc --platform: ptrace, systrap or kvm" },
        { "gpu-share", CFG_BOOL, U(gpu_share), 0, 1, "off", "let several sandboxes hold one GPU (off: a GPU is one sandbox's until it ends; docs/gpu.md)" },
        { "gpu-dev-dir", CFG_STR, S(gpu_dev_dir), 0, 0, "/dev", "where the NVIDIA device nodes are (nvidia0, nvidia1, ..., nvidiactl, nvidia-uvm)" },
        { "gpu-driver-root", CFG_STR, S(gpu_driver_root), 0, 0, "/", "root the NVIDIA driver's libraries (libcuda, libnvidia-*) and programs (nvidia-smi) are found under, mounted read-only into GPU sandboxes" },
        { "gpu-proc-dir", CFG_STR, S(gpu_proc_dir), 0, 0, "/proc/driver/nvidia", "the NVIDIA driver's proc directory (params, version, gpus/)" },
        { "egress-port", CFG_U64, U(egress_port), 1, 65535, "3128", "port of the egress proxy on 127.0.0.1 inside each sandbox" },
        { "egress-connections", CFG_U64, U(egress_connections), 1, 65536, "256", "egress connections one sandbox may hold open" },
        { "egress-bandwidth", CFG_SIZE, U(egress_bandwidth), 0, 1ull << 40, "0", "egress bytes/s per sandbox and direction (0: unlimited)" },
        { "keys-file", CFG_STR, S(keys_file), 0, 0, "-", "API keys besides the database's, as \"TEAM KEY\" lines, re-read when the file changes: every node of a cluster gets the same file ('-': none)" },
        { "node-id", CFG_STR, S(node_id), 0, 0, "auto", "this node's id: 4 characters [a-z0-9] that begin every sandbox and snapshot id it allocates, so `hutch router` forwards by id (auto: derived from /etc/machine-id, else the host name)" },
        { "egress-records", CFG_U64, U(egress_records), 1, 100000, "50", "egress decisions recorded per sandbox per second (the rest are counted)" },
        { "registries-conf", CFG_STR, S(registries_conf), 0, 0, "-", "registries.conf of image pulls (search, mirror, insecure and ca lines; '-': DATA_DIR/registries.conf, as `hutch template pull`)" },
        { "registry-ca", CFG_STR, S(registry_ca), 0, 0, "-", "PEM file of CAs trusted for every registry, besides the system's ('-': none)" },
        { "template-registry", CFG_STR, S(template_registry), 0, 0, "-", "REGISTRY/PATH where the nodes of a cluster share templates: a create naming an image template this node lacks pulls REGISTRY/PATH/<name>:latest first, off the loop, one pull for every create that waits for it (404 when the registry has no such image); `hutch template push NAME REGISTRY/PATH/NAME` puts one there. Snapshots too: each one sealed here is pushed as REGISTRY/PATH/snapshots:<id>, and a create from one this node lacks pulls it (every node needs the same DATA_DIR/secrets.key). TLS, plain HTTP and credentials as for every pull: registries-conf, registry-ca, `hutch template login` ('-': none; docs/scale-out.md)" },
        { "interp-pool-size", CFG_U64, U(interp_pool_size), 0, 1000, "0", "code-interpreter sandboxes kept started, their kernels up, so that such a create only claims one (0: none; each holds its python and javascript kernels, about 150 MB)" },
        { "interp-checkpoint", CFG_BOOL, U(interp_checkpoint), 0, 1, "on", "gvisor (the default backend): once a code interpreter is wanted, keep a checkpoint of a started one in DATA_DIR/interp-checkpoints, and restore it for code-interpreter creates that the warm pool cannot serve, instead of starting Python's kernel again (docs/interpreter.md): on or off" },
        { "ready-timeout", CFG_SECONDS, U(ready_timeout_s), 1, 3600, "60", "a template's ready command (code-interpreter's: its kernel is up) must succeed within this, or the create fails" },
        { "log-format", CFG_STR, S(log_format), 0, 0, "text", "text (\"hutch serve: message\") or json (one object per line: ts, level, prog, msg, request_id)" },
        { "metrics-listen", CFG_STR, S(metrics_listen), 0, 0, "-", "address and port of the Prometheus GET /metrics (HOST:PORT; '-': not served)" },
        { "audit", CFG_BOOL, U(audit), 0, 1, "on", "keep the tamper-evident audit trail (docs/audit.md): on or off" },
        { "audit-checkpoint-interval", CFG_SECONDS, U(audit_checkpoint_interval_s), 1, 86400, "60", "how often the audit trail's head is signed (and at shutdown)" },
        { "audit-retention", CFG_SECONDS, U(audit_retention_s), 0, 87600 * 3600, "2160h", "how long audit records are kept (0: for ever); a signed checkpoint says where the trail starts" },
#undef S
#undef U
};

int server_config_set(server_config *c, const char *key, const char *value, hutch_error *err) {
        for (size_t i = 0; i < ELEMENTSOF(cfg_table); i++) {
                const struct cfg_entry *e = &cfg_table[i];
                if (!streq(e->name, key))
                        continue;
                char *p = (char *) c + e->off;
                uint64_t v;
                int r;
                switch (e->type) {
                case CFG_STR:
                case CFG_LIST:
                        if (strlen(value) >= e->size || (!*value && e->type == CFG_STR))
                                return hutch_error_set(err, -EINVAL, "%s: value empty or too long", key);
                        if (streq(key, "log-format") && !streq(value, "text") && !streq(value, "json"))
                                return hutch_error_set(err, -EINVAL, "log-format: text or json, not '%s'", value);
                        if (streq(key, "on-stop") && !streq(value, "keep") && !streq(value, "kill"))
                                return hutch_error_set(err, -EINVAL, "on-stop: keep or kill, not '%s'", value);
                        if (streq(key, "node-id")) {
                                if (streq(value, "auto"))
                                        node_id_default(c->node_id);
                                else if (!node_id_valid(value))
                                        return hutch_error_set(err, -EINVAL, "node-id: 4 characters [a-z0-9] or auto, not '%s'", value);
                                else
                                        snprintf(c->node_id, sizeof c->node_id, "%s", value);
                                return 0;
                        }
                        if (streq(key, "template-registry") && !streq(value, "-")) {
                                /* what a pull will name: REGISTRY/PATH/<name>:latest */
                                char probe[300];
                                image_reference ir = { 0 };
                                hutch_error e2 = { 0 };
                                snprintf(probe, sizeof probe, "%s/t:latest", value);
                                const char *last = strrchr(value, '/');
                                if (!last || strchr(last, ':') || strchr(value, '@') ||
                                    image_reference_parse(probe, &ir, &e2) < 0 || !ir.registry) {
                                        image_reference_clear(&ir);
                                        return hutch_error_set(err, -EINVAL,
                                                               "template-registry: REGISTRY/PATH (e.g. registry.example:5000/hutch), not '%s'%s%s",
                                                               value, e2.msg[0] ? ": " : "", e2.msg);
                                }
                                image_reference_clear(&ir);
                        }
                        if (streq(key, "listen") || (streq(key, "metrics-listen") && !streq(value, "-"))) {
                                struct sockaddr_storage ss;
                                unsigned len;
                                if ((r = http_listen_parse(value, &ss, &len, err)) < 0)
                                        return r;
                        }
                        memcpy(p, value, strlen(value) + 1);
                        return 0;
                case CFG_U64:
                        r = parse_u64(value, UINT64_MAX, &v);
                        break;
                case CFG_SIZE:
                        r = parse_size(value, &v);
                        break;
                case CFG_BOOL:
                        r = streq(value, "on") || streq(value, "true") ? (v = 1, 0)
                            : streq(value, "off") || streq(value, "false") ? (v = 0, 0)
                                                                           : -EINVAL;
                        break;
                case CFG_SECONDS: {
                        uint64_t ms;
                        r = parse_duration_ms(value, &ms);
                        v = ms / 1000;
                        break;
                }
                default:
                        r = -EINVAL;
                }
                if (r < 0)
                        return hutch_error_set(err, -EINVAL, "%s: cannot parse '%s'", key, value);
                if (v < e->min || v > e->max)
                        return hutch_error_set(err, -ERANGE, "%s: %s is out of range", key, value);
                /* sizes of sandboxes are kept in MiB */
                if (e->off == offsetof(server_config, memory_mb) || e->off == offsetof(server_config, disk_mb))
                        v >>= 20;
                *(uint64_t *) p = v;
                return 0;
        }
        return hutch_error_set(err, -ENOENT, "unknown setting '%s'", key);
}

int server_config_defaults(server_config *c) {
        memset(c, 0, sizeof *c);
        for (size_t i = 0; i < ELEMENTSOF(cfg_table); i++) {
                hutch_error err = { 0 };
                int r = server_config_set(c, cfg_table[i].name, cfg_table[i].def, &err);
                if (r < 0)
                        return r;
        }
        return 0;
}

int server_config_load_file(server_config *c, const char *path, hutch_error *err) {
        FILE *f = fopen(path, "re");
        if (!f)
                return hutch_error_set(err, negative_errno(), "%s: %m", path);
        char line[2048];
        unsigned n = 0;
        int r = 0;
        while (fgets(line, sizeof line, f)) {
                n++;
                char *s = line;
                while (*s == ' ' || *s == '\t')
                        s++;
                size_t l = strlen(s);
                while (l > 0 && (s[l - 1] == '\n' || s[l - 1] == '\r' || s[l - 1] == ' ' || s[l - 1] == '\t'))
                        s[--l] = 0;
                if (!*s || *s == '#')
                        continue;
                char *eq = strchr(s, '=');
                if (!eq) {
                        r = hutch_error_set(err, -EINVAL, "%s:%u: expected key = value", path, n);
                        break;
                }
                char *k = s, *v = eq + 1;
                *eq = 0;
                size_t kl = strlen(k);
                while (kl > 0 && (k[kl - 1] == ' ' || k[kl - 1] == '\t'))
                        k[--kl] = 0;
                while (*v == ' ' || *v == '\t')
                        v++;
                r = server_config_set(c, k, v, err);
                if (r < 0) {
                        hutch_error_wrap(err, r, "%s:%u", path, n);
                        break;
                }
        }
        fclose(f);
        return r;
}

void server_config_help(FILE *f) {
        for (size_t i = 0; i < ELEMENTSOF(cfg_table); i++)
                fprintf(f, "  --%-24s %s (default %s)\n", cfg_table[i].name, cfg_table[i].help, cfg_table[i].def);
}

/* ------------------------------------------------------------------ misc */

int64_t wall_ms(void) {
        return clock_ns(CLOCK_REALTIME) / 1000000;
}

void format_rfc3339(int64_t ms, char buf[40]) {
        time_t t = (time_t) (ms / 1000);
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t n = strftime(buf, 40, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(buf + n, 40 - n, ".%03dZ", (int) (ms % 1000));
}

int parse_rfc3339(const char *s, int64_t *ret_ms) {
        struct tm tm = { 0 };
        const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
        if (!p)
                return -EINVAL;
        int64_t frac_ms = 0;
        if (*p == '.') {
                p++;
                int digits = 0;
                int64_t v = 0;
                while (*p >= '0' && *p <= '9') {
                        if (digits < 3) {
                                v = v * 10 + (*p - '0');
                                digits++;
                        }
                        p++;
                }
                while (digits++ < 3)
                        v *= 10;
                frac_ms = v;
        }
        int64_t off = 0;
        if (*p == 'Z' || *p == 'z')
                p++;
        else if (*p == '+' || *p == '-') {
                int sign = *p == '-' ? -1 : 1;
                /* exactly ±hh:mm */
                for (int i = 1; i <= 5; i++)
                        if (i == 3 ? p[i] != ':' : !(p[i] >= '0' && p[i] <= '9'))
                                return -EINVAL;
                int hh = (p[1] - '0') * 10 + (p[2] - '0'), mm = (p[4] - '0') * 10 + (p[5] - '0');
                if (hh > 23 || mm > 59)
                        return -EINVAL;
                off = sign * (hh * 3600 + mm * 60);
                p += 6;
        } else
                return -EINVAL;
        if (*p)
                return -EINVAL;
        time_t t = timegm(&tm);
        *ret_ms = ((int64_t) t - off) * 1000 + frac_ms;
        return 0;
}

bool const_time_eq(const char *a, const char *b) {
        size_t la = strlen(a), lb = strlen(b);
        unsigned char d = la != lb;
        for (size_t i = 0; i < la; i++)
                d |= (unsigned char) a[i] ^ (unsigned char) (i < lb ? b[i] : 0);
        return d == 0;
}

/* ---------------------------------------------------------- housekeeping */

/* Rows per table and per loop turn: one short transaction each, so that a
 * backlog (a first start after an upgrade, a long retention shortened) is
 * worked through between requests instead of stalling them. */
#define PRUNE_BATCH 200
#define HOUSEKEEPING_INTERVAL_MAX_MS (600 * 1000)

static int64_t housekeeping_interval_ms(const server *srv) {
        uint64_t half = srv->cfg.retention_s * 1000 / 2;
        return half < 1000 ? 1000 : half > HOUSEKEEPING_INTERVAL_MAX_MS ? HOUSEKEEPING_INTERVAL_MAX_MS : (int64_t) half;
}

/* Retention (issue #19): a pass deletes what is older than `retention` in
 * batches, one per call, then removes unused versions of the host template
 * and truncates the WAL. Returns when it wants to run again: now while a
 * pass has more to delete. */
static int64_t housekeeping(server *srv, int64_t now) {
        if (!srv->pruning) {
                if (now < srv->housekeeping_due_ms)
                        return srv->housekeeping_due_ms;
                srv->pruning = true;
                srv->pruned = (store_prune_counts){ 0 };
        }
        hutch_error err = { 0 };
        store_prune_counts c = { 0 };
        int r = store_prune(srv->store, now - (int64_t) srv->cfg.retention_s * 1000, PRUNE_BATCH, &c, &err);
        srv->pruned.sandboxes += c.sandboxes;
        srv->pruned.events += c.events;
        srv->pruned.egress += c.egress;
        if (r > 0)
                return now; /* more next turn */
        if (r < 0)
                log_warning("retention: %s (trying again at the next pass)", err.msg);
        srv->pruning = false;
        /* host template versions that no sandbox uses any more */
        hutch_error e2 = { 0 };
        int k = hutch_template_gc(srv->ctx, &e2);
        if (k < 0)
                log_warning("templates: %s", e2.msg);
        else if (k > 0)
                log_info("templates: removed %d unused version(s) of the host template", k);
        /* downloads a killed pull left in the blob cache (a running pull holds its own) */
        hutch_error e3 = { 0 };
        int b = image_pull_gc(srv->cfg.data_dir, &e3);
        if (b < 0)
                log_warning("image blob cache: %s", e3.msg);
        else if (b > 0)
                log_info("image blob cache: removed %d interrupted download(s)", b);
        srv->housekeeping_due_ms = now + housekeeping_interval_ms(srv);
        const store_prune_counts *p = &srv->pruned;
        if (p->sandboxes + p->events + p->egress > 0) {
                log_info("retention: removed %lld ended sandboxes, %lld events and %lld egress records older than "
                         "%llu s",
                         (long long) p->sandboxes, (long long) p->events, (long long) p->egress,
                         (unsigned long long) srv->cfg.retention_s);
                srv->checkpoint_pending = true;
        }
        /* the WAL keeps its largest size (about 4 MB at SQLite's automatic
         * checkpoint) until truncated; busy: the next pass tries again */
        if (srv->checkpoint_pending) {
                if (store_checkpoint(srv->store, &err) < 0)
                        log_debug("retention: %s", err.msg);
                else
                        srv->checkpoint_pending = false;
        }
        return srv->housekeeping_due_ms;
}

/* ------------------------------------------------------------------ loop */

int loop_add(server *srv, watcher *w, int fd, uint32_t events) {
        w->fd = fd;
        w->events = events;
        struct epoll_event ev = { .events = events, .data.ptr = w };
        if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
                return negative_errno();
        return 0;
}

int loop_mod(server *srv, watcher *w, uint32_t events) {
        if (w->fd < 0 || w->events == events)
                return 0;
        w->events = events;
        struct epoll_event ev = { .events = events, .data.ptr = w };
        if (epoll_ctl(srv->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0)
                return negative_errno();
        return 0;
}

/* Forgets the fd too: a second loop_del of the same watcher must never hit
 * a number the kernel has since handed to someone else. */
void loop_del(server *srv, watcher *w) {
        if (w->fd >= 0)
                (void) epoll_ctl(srv->epfd, EPOLL_CTL_DEL, w->fd, NULL);
        w->fd = -1;
}

static void on_signal(server *srv, watcher *w, uint32_t revents) {
        struct signalfd_siginfo si;
        while (read(srv->sigfd, &si, sizeof si) == sizeof si) {
                if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) {
                        log_info("signal %u: stopping (sandboxes keep running; the next start re-adopts them)",
                                 si.ssi_signo);
                        srv->quit = true;
                }
        }
}

/* Every sandbox costs the daemon descriptors (its init's socket and pidfd,
 * the egress listener, proxied connections, streams): with the open-files
 * limit spent, every create fails. Counted from /proc/self/fd. */
int server_fds(unsigned *ret_open, unsigned *ret_limit) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return -errno;
        DIR *d = opendir("/proc/self/fd");
        if (!d)
                return -errno;
        unsigned n = 0;
        for (struct dirent *de; (de = readdir(d));)
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        *ret_open = n > 0 ? n - 1 : 0; /* less opendir's own */
        *ret_limit = rl.rlim_cur > UINT_MAX ? UINT_MAX : (unsigned) rl.rlim_cur;
        return 0;
}

static int ensure_default_team(server *srv, bool *ret_new_key, char key[45]) {
        hutch_error err = { 0 };
        int64_t n = 0, team = 0;
        int r = store_team_count(srv->store, &n, &err);
        if (r < 0)
                return log_error_errno(r, "database: %s", err.msg);
        *ret_new_key = false;
        if (n == 0) {
                r = store_team_create(srv->store, "default", &team, &err);
                if (r < 0)
                        return log_error_errno(r, "database: %s", err.msg);
                int64_t key_id;
                r = store_key_create(srv->store, team, "first start", key, &key_id, &err);
                if (r < 0)
                        return log_error_errno(r, "database: %s", err.msg);
                *ret_new_key = true;
        } else {
                r = store_team_find(srv->store, "default", &team, &err);
                if (r < 0)
                        team = 0;
        }
        srv->default_team = team;
        return 0;
}

/* The key written at first start, mode 0600; printed for the operator. */
static int write_api_key(server *srv, const char *key) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/api-key", srv->cfg.data_dir);
        char line[64];
        int n = snprintf(line, sizeof line, "%s\n", key);
        int r = write_file_atomic(path, line, (size_t) n, 0600);
        if (r < 0)
                return log_error_errno(r, "writing %s: %m", path);
        return 0;
}

/* systemd's readiness protocol (sd_notify(3)), without libsystemd: one
 * datagram to $NOTIFY_SOCKET ('@' = the abstract namespace). Nothing when
 * the daemon was not started by a Type=notify unit. */
static void notify_systemd(const char *state) {
        const char *path = getenv("NOTIFY_SOCKET");
        if (!path || (path[0] != '/' && path[0] != '@'))
                return;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        size_t len = strlen(path);
        if (len >= sizeof sa.sun_path)
                return;
        memcpy(sa.sun_path, path, len);
        if (sa.sun_path[0] == '@')
                sa.sun_path[0] = 0;
        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return;
        if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *) &sa,
                   (socklen_t) (offsetof(struct sockaddr_un, sun_path) + len)) < 0)
                log_warning("telling systemd '%s': %m", state);
}

bool server_tls_on(const server *srv) {
        return !streq(srv->cfg.tls_cert, "-");
}

/* An API key crosses the network with every control-plane request, and an
 * envd token with every data-plane one: in clear text beyond this host
 * unless TLS is on (here or in a proxy in front). */
static void warn_cleartext(const server *srv) {
        struct sockaddr_storage ss;
        unsigned len;
        if (server_tls_on(srv) || http_listen_parse(srv->cfg.listen, &ss, &len, NULL) < 0)
                return;
        bool loopback = ss.ss_family == AF_INET
                                ? (ntohl(((struct sockaddr_in *) &ss)->sin_addr.s_addr) >> 24) == 127
                                : IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *) &ss)->sin6_addr);
        if (!loopback)
                log_warning("listening on %s without TLS: API keys and sandbox tokens cross the network in clear "
                            "text; give --tls-cert and --tls-key, or put a TLS proxy in front and listen on loopback",
                            srv->cfg.listen);
}

static void print_env(server *srv) {
        char path[PATH_MAX], key[128] = "";
        snprintf(path, sizeof path, "%s/api-key", srv->cfg.data_dir);
        FILE *f = fopen(path, "re");
        if (f) {
                if (!fgets(key, sizeof key, f))
                        key[0] = 0;
                fclose(f);
                key[strcspn(key, "\r\n")] = 0;
        }
        const char *scheme = server_tls_on(srv) ? "https" : "http";
        if (streq(srv->cfg.log_format, "json")) {
                /* one object per line, and no key in a log that may be shipped */
                log_info("listening on %s://%s (E2B_API_URL and E2B_SANDBOX_URL; the first API key is in %s)", scheme,
                         srv->cfg.listen, path);
                return;
        }
        fprintf(stderr,
                "hutch: listening on %s://%s\n"
                "hutch: point the E2B SDK at it with:\n"
                "export E2B_API_URL=%s://%s\n"
                "export E2B_SANDBOX_URL=%s://%s\n"
                "export E2B_VOLUME_API_URL=%s://%s\n"
                "export E2B_API_KEY=%s\n",
                scheme, srv->cfg.listen, scheme, srv->cfg.listen, scheme, srv->cfg.listen, scheme, srv->cfg.listen,
                key[0] ? key : "$(cat api-key) # the first key was written to DATA_DIR/api-key");
        fflush(stderr);
}

void server_pull_opts(const server *srv, image_pull_opts *ret) {
        *ret = (image_pull_opts) {
                .conf_path = streq(srv->cfg.registries_conf, "-") ? NULL : srv->cfg.registries_conf,
                .ca_file = streq(srv->cfg.registry_ca, "-") ? NULL : srv->cfg.registry_ca,
                /* a client's reference reaches only the registries the file names */
                .configured_only = true,
        };
}

int server_open_store(const char *data_dir, hutch_store **ret) {
        int r = mkdir_p(data_dir, 0700);
        if (r < 0)
                return log_error_errno(r, "creating %s: %m", data_dir);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/hutch.db", data_dir);
        hutch_error err = { 0 };
        r = store_open(path, ret, &err);
        if (r < 0)
                return log_error_errno(r, "opening %s: %s", path, err.msg);
        return 0;
}

/* One data dir, one daemon: two daemons on one database would each re-adopt,
 * time out and remove the other's sandboxes (and its warm pool). An flock on
 * DATA_DIR/serve.lock, taken before anything in the dir is touched and held
 * until the daemon exits (the kernel drops it on kill -9, so a restart never
 * finds a stale lock). The holder's pid and address are written into it for
 * the refusal's message; `hutch run` and `hutch key` do not take it (they
 * share the data dir with a daemon on purpose: templates, the database). */
static int data_dir_lock(server *srv) {
        const char *dir = srv->cfg.data_dir;
        int r = mkdir_p(dir, 0700);
        if (r < 0)
                return log_error_errno(r, "creating %s: %m", dir);
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return log_error_errno(negative_errno(), "opening %s: %m", dir);
        int fd = lock_file_try(dfd, "serve.lock");
        if (fd == -EWOULDBLOCK) {
                _cleanup_free_ char *who = NULL;
                (void) read_file_at(dfd, "serve.lock", 512, &who);
                long pid = 0;
                char listen[128] = "?";
                if (who) {
                        const char *p = strstr(who, "pid=");
                        const char *l = strstr(who, "listen=");
                        if (p)
                                pid = strtol(p + 4, NULL, 10);
                        if (l)
                                snprintf(listen, sizeof listen, "%.*s", (int) strcspn(l + 7, "\n"), l + 7);
                }
                log_error("data dir %s is in use by another hutch serve (pid %ld, listening on %s); one data dir "
                          "has one daemon: stop that one, or give this one another --data-dir",
                          dir, pid, listen);
                return -EBUSY;
        }
        if (fd < 0)
                return log_error_errno(fd, "locking %s/serve.lock: %m", dir);
        char buf[256];
        int n = snprintf(buf, sizeof buf, "pid=%ld\nlisten=%s\n", (long) getpid(), srv->cfg.listen);
        if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t) n, 0) != n)
                log_warning("writing %s/serve.lock: %m (the lock is held all the same)", dir);
        srv->lock_fd = fd;
        return 0;
}

/* Sandboxes are created by processes running as the sandbox's own host
 * uid, which must be able to walk down to the run dir (each sandbox's
 * directory and socket live there): refuse one behind a 0700 directory at
 * start instead of failing every create. */
static int check_run_dir_reachable(const char *dir) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s", dir);
        for (char *p = path + 1;; p++) {
                char c = *p;
                if (c == '/' || c == 0) {
                        *p = 0;
                        struct stat st;
                        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && !(st.st_mode & S_IXOTH)) {
                                log_error("%s is mode %04o: sandbox uids cannot reach the run dir %s below it "
                                          "(chmod o+x %s, or choose another --run-dir)",
                                          path, (unsigned) (st.st_mode & 07777), dir, path);
                                return -EACCES;
                        }
                        *p = c;
                        if (c == 0)
                                break;
                }
        }
        return 0;
}

int server_run(const server_config *cfg) {
        server srv_storage = { 0 };
        server *srv = &srv_storage;
        srv->cfg = *cfg;
        srv->epfd = -1;
        srv->sigfd = -1;
        srv->listen_fd = -1;
        srv->lock_fd = -1;
        srv->egress_w.fd = -1;
        hutch_error err = { 0 };
        int r;
        log_set_json(streq(srv->cfg.log_format, "json"));

        (void) signal(SIGPIPE, SIG_IGN);
        /* every sandbox's proxy connections are this process's descriptors:
         * use what the hard limit allows (1024 is systemd's soft default) */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void) setrlimit(RLIMIT_NOFILE, &rl);
        }
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max < HUTCH_DEFAULT_NOFILE)
                log_warning("the hard open-files limit is %llu, below a sandbox's own (%d): every create will fail "
                            "(503) until it is raised (ulimit -Hn, systemd LimitNOFILE=)",
                            (unsigned long long) rl.rlim_max, HUTCH_DEFAULT_NOFILE);
        else if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < SERVER_FDS_WANTED)
                log_warning("the open-files limit is %llu: creates fail with 503 once it is spent (a sandbox holds "
                            "about %d descriptors, more with egress connections and streams); raise it (ulimit -n, "
                            "systemd LimitNOFILE=) to at least %d",
                            (unsigned long long) rl.rlim_cur, SERVER_FDS_PER_SANDBOX, SERVER_FDS_WANTED);
        /* the host's OOM killer takes a sandbox's process (they run at
         * +500, whatever this one has: lib/sandbox) before the daemon that
         * serves every tenant; an operator's own choice (systemd's
         * OOMScoreAdjust=) is kept. Lowering needs CAP_SYS_RESOURCE: where
         * it is refused, the default stands. */
        {
                _cleanup_free_ char *adj = NULL;
                if (read_file_at(AT_FDCWD, "/proc/self/oom_score_adj", 32, &adj) >= 0 &&
                    atoi(adj) == 0 && write_file_at(AT_FDCWD, "/proc/self/oom_score_adj", "-900") < 0)
                        log_debug("oom_score_adj -900 refused (%m): the daemon keeps 0");
        }
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGTERM);
        sigprocmask(SIG_BLOCK, &mask, NULL);

        srv->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (srv->epfd < 0)
                return log_error_errno(negative_errno(), "epoll_create1: %m");
        srv->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (srv->sigfd < 0)
                return log_error_errno(negative_errno(), "signalfd: %m");
        srv->sig_w.cb = on_signal;
        loop_add(srv, &srv->sig_w, srv->sigfd, EPOLLIN);

        /* Settings that need nothing but themselves are checked before the
         * port is bound: a client never connects to a daemon that is about
         * to exit over its own command line. */
        if (hutch_backend_from_name(srv->cfg.backend) < 0) {
                log_error("backend must be ns or gvisor, not '%s'", srv->cfg.backend);
                r = -EINVAL;
                goto out;
        }
        char tb_why[160];
        if (template_backends_check(srv->cfg.template_backends, tb_why, sizeof tb_why) < 0) {
                log_error("template-backends: %s", tb_why);
                r = -EINVAL;
                goto out;
        }

        /* A refused start changes nothing: the port first (nothing is
         * written before it is ours), then the data dir's lock (nothing in
         * the dir is read or written before it is held). */
        r = http_bind(srv, &err);
        if (r < 0) {
                log_error("%s", err.msg);
                goto out;
        }
        r = data_dir_lock(srv);
        if (r < 0)
                goto out;
        r = server_open_store(srv->cfg.data_dir, &srv->store);
        if (r < 0)
                goto out;
        r = check_run_dir_reachable(srv->cfg.run_dir);
        if (r < 0)
                goto out;
        r = store_master_secret(srv->store, srv->master, &err);
        if (r < 0) {
                log_error_errno(r, "database: %s", err.msg);
                goto out;
        }
        bool new_key = false;
        char key[45];
        r = ensure_default_team(srv, &new_key, key);
        if (r < 0)
                goto out;
        if (new_key && (r = write_api_key(srv, key)) < 0)
                goto out;
        if ((r = keysfile_load(srv, &err)) < 0) {
                log_error("%s", err.msg);
                goto out;
        }

        hutch_ctx_config cc = { .run_dir = srv->cfg.run_dir, .data_dir = srv->cfg.data_dir,
                                .runsc = streq(srv->cfg.runsc, "auto") ? NULL : srv->cfg.runsc,
                                .gvisor_platform = srv->cfg.gvisor_platform,
                                .gpu_dev_dir = srv->cfg.gpu_dev_dir,
                                .gpu_driver_root = srv->cfg.gpu_driver_root,
                                .gpu_proc_dir = srv->cfg.gpu_proc_dir,
                                .gpu_share = srv->cfg.gpu_share ? 1 : -1 };
        cc.trash_dir = trash_setup(srv); /* destroyed sandboxes' layers, deleted off the loop */
        r = hutch_ctx_new(&cc, &srv->ctx, &err);
        if (r < 0) {
                log_error_errno(r, "%s", err.msg);
                goto out;
        }

        r = secrets_setup(srv);
        if (r < 0)
                goto out;
        r = snapshots_setup(srv);
        if (r < 0)
                goto out;
        trash_kick(srv); /* what a crash or the last stop left there */
        volumes_setup(srv);
        r = templates_setup(srv);
        if (r < 0)
                goto out;
        r = egress_setup(srv);
        if (r < 0)
                goto out;
        if ((r = audit_setup(srv)) < 0)
                goto out;
        if ((r = metrics_setup(srv)) < 0)
                goto out;

        /* Bind first, then re-adopt: requests queue in the backlog meanwhile. */
        r = http_start(srv, &err);
        if (r < 0) {
                log_error_errno(r, "%s", err.msg);
                goto out;
        }
        sbx_readopt_all(srv);
        trash_kick(srv); /* the layers of the sandboxes that died meanwhile */
        sbx_pool_cleanup_previous(srv);
        print_env(srv);
        warn_cleartext(srv);
        {
                char st[256];
                snprintf(st, sizeof st, "READY=1\nMAINPID=%ld\nSTATUS=serving on %s://%s",
                         (long) getpid(), server_tls_on(srv) ? "https" : "http", srv->cfg.listen);
                notify_systemd(st);
        }

        bool quiet = true; /* the last epoll_wait found nothing ready */
        while (!srv->quit) {
                /* Timers come after MHD_run(): a request served there may
                 * set a deadline that the wait below must know. What timers
                 * resume is only served by another MHD_run() (a resume does
                 * not wake MHD's epoll fd), so go round until nothing was. */
                int64_t next = -1;
                for (int round = 0; round < 8; round++) {
                        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                                if (sb->dirty)
                                        sbx_drain(srv, sb);
                        MHD_run(srv->mhd);
                        uint64_t resumes = srv->resumes;
                        int64_t now = wall_ms();
                        next = sbx_timers(srv, now);
                        int64_t n2 = envd_timers(srv, now);
                        if (n2 >= 0 && (next < 0 || n2 < next))
                                next = n2;
                        n2 = startcmd_timers(srv, now);
                        if (n2 >= 0 && (next < 0 || n2 < next))
                                next = n2;
                        bool dirty = false;
                        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                                dirty |= sb->dirty;
                        if (resumes == srv->resumes && !dirty)
                                break;
                }
                /* one heavy request per turn, the teams in turn, after
                 * everything else that was ready (admission.c) */
                if (admission_turn(srv, quiet))
                        next = wall_ms();
                /* and one teardown of a killed sandbox (sandboxes.c) */
                if (sbx_reap(srv))
                        next = wall_ms();
                /* top up the warm pool, one sandbox per quiet turn: not while
                 * requests wait, which would then wait for two creates a turn */
                if (!admission_busy() && sbx_pool_short(srv) && wall_ms() >= srv->pool_backoff_ms) {
                        sbx_pool_fill(srv);
                        if (sbx_pool_short(srv) && wall_ms() >= srv->pool_backoff_ms)
                                next = wall_ms(); /* go on filling without sleeping */
                }
                /* pool-ids, when a claim changed the pool and no fill
                 * rewrote it: after the turn's answers were written */
                sbx_pool_sync(srv);
                int64_t hk = housekeeping(srv, wall_ms());
                if (next < 0 || hk < next)
                        next = hk;
                int64_t at = audit_tick(srv, wall_ms());
                if (at >= 0 && at < next)
                        next = at;
                int64_t ut = usage_tick(srv, wall_ms());
                if (ut >= 0 && ut < next)
                        next = ut;
                int64_t it = ingress_h2_tick(srv, wall_ms());
                if (it >= 0 && (next < 0 || it < next))
                        next = it;
                int timeout = -1;
                MHD_UNSIGNED_LONG_LONG mt;
                if (MHD_get_timeout(srv->mhd, &mt) == MHD_YES)
                        timeout = mt > 60000 ? 60000 : (int) mt;
                if (next >= 0) {
                        int64_t d = next - wall_ms();
                        if (d < 0)
                                d = 0;
                        if (timeout < 0 || d < timeout)
                                timeout = (int) d;
                }
                struct epoll_event evs[64];
                int n = epoll_wait(srv->epfd, evs, ELEMENTSOF(evs), timeout);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        r = log_error_errno(negative_errno(), "epoll_wait: %m");
                        break;
                }
                quiet = n == 0;
                int64_t busy = wall_ms();
                for (int i = 0; i < n; i++) {
                        watcher *w = evs[i].data.ptr;
                        if (w && w->cb)
                                w->cb(srv, w, evs[i].events);
                }
                ingress_reap(srv);
                snapjobs_reap(srv);
                busy = wall_ms() - busy;
                if (busy > 250)
                        log_warning("the loop was busy for %lld ms serving %d events", (long long) busy, n);
        }
        r = 0;
        notify_systemd("STOPPING=1");
        /* on-stop=kill: a clean stop takes this daemon's sandboxes with it,
         * while streams and the proxy still run (kill -9 cannot: the next
         * start then enforces the timeouts that passed meanwhile) */
        if (streq(srv->cfg.on_stop, "kill"))
                sbx_kill_all(srv, "daemon stopped");
out:
        templates_teardown(srv);
        trash_stop(srv);
        http_stop(srv);
        egress_teardown(srv);
        usage_teardown(srv);
        audit_teardown(srv);
        metrics_teardown(srv);
        /* a start refused before the lock owns nothing in the data dir: the
         * pool's file there is another daemon's */
        if (srv->lock_fd >= 0)
                sbx_pool_destroy(srv);
        sbx_free_all(srv);
        hutch_ctx_free(srv->ctx);
        keysfile_free(srv);
        store_close(srv->store);
        if (srv->sigfd >= 0)
                close(srv->sigfd);
        if (srv->epfd >= 0)
                close(srv->epfd);
        /* last: the next daemon may start once everything above is done */
        safe_close(srv->lock_fd);
        return r;
}
