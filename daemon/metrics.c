/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's Prometheus metrics (daemon/metrics.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/metrics.h"
#include "daemon/route.h"
#include "daemon/serve.h"
#include "util/clock.h"
#include "util/log.h"

/* seconds: 1 ms .. 60 s */
static const double buckets[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5,   1,      2.5,   5,    10,    30,   60 };
#define NB (sizeof buckets / sizeof *buckets)

typedef struct histo {
        uint64_t b[NB];
        uint64_t count;
        double sum;
} histo;

static void histo_add(histo *h, double v) {
        for (size_t i = 0; i < NB; i++)
                if (v <= buckets[i])
                        h->b[i]++;
        h->count++;
        h->sum += v;
}

/* Labelled series: a short list, searched linearly (labels come from
 * fixed sets: route names, statuses, reasons). */
typedef struct series {
        char a[48], b[48];
        uint64_t n;
        histo h;
        struct series *next;
} series;

struct daemon_metrics {
        struct MHD_Daemon *mhd;
        watcher w;
        series *requests; /* route, status: count */
        series *latency;  /* route: histogram */
        series *ends;     /* reason */
        series *egress;   /* decision: count; a = decision, b = "" */
        series *store;    /* writer: histogram */
        series *adm_wait; /* route: histogram */
        series *adm_refused; /* limit: count */
        uint64_t creates, egress_bytes_out, egress_bytes_in;
        uint64_t pulls, pull_bytes;
        histo create_latency, kill_latency;
        int64_t start_ms;
};

static series *find(series **list, const char *a, const char *b) {
        for (series *s = *list; s; s = s->next)
                if (streq(s->a, a) && streq(s->b, b))
                        return s;
        series *s = calloc(1, sizeof *s);
        if (!s)
                return NULL;
        snprintf(s->a, sizeof s->a, "%s", a);
        snprintf(s->b, sizeof s->b, "%s", b);
        s->next = *list;
        *list = s;
        return s;
}

static void list_free(series *s) {
        while (s) {
                series *n = s->next;
                free(s);
                s = n;
        }
}

static const char *route_name(int kind) {
        static const char *const names[_ROUTE_MAX] = {
                [ROUTE_HEALTH] = "health",
                [ROUTE_SANDBOXES_CREATE] = "sandboxes_create",
                [ROUTE_SANDBOXES_LIST] = "sandboxes_list",
                [ROUTE_SANDBOX_GET] = "sandbox_get",
                [ROUTE_SANDBOX_KILL] = "sandbox_kill",
                [ROUTE_SANDBOX_TIMEOUT] = "sandbox_timeout",
                [ROUTE_SANDBOX_CONNECT] = "sandbox_connect",
                [ROUTE_SANDBOX_PAUSE] = "sandbox_pause",
                [ROUTE_SANDBOX_RESUME] = "sandbox_resume",
                [ROUTE_SANDBOX_REFRESHES] = "sandbox_refreshes",
                [ROUTE_SANDBOX_METRICS] = "sandbox_metrics",
                [ROUTE_SANDBOX_NETWORK] = "sandbox_network",
                [ROUTE_SANDBOX_EGRESS] = "sandbox_egress",
                [ROUTE_SECRETS_LIST] = "secrets_list",
                [ROUTE_SECRETS_CREATE] = "secrets_create",
                [ROUTE_SECRET_GET] = "secret_get",
                [ROUTE_SECRET_UPDATE] = "secret_update",
                [ROUTE_SECRET_DELETE] = "secret_delete",
                [ROUTE_SANDBOX_SNAPSHOT] = "sandbox_snapshot",
                [ROUTE_SANDBOX_FORK] = "sandbox_fork",
                [ROUTE_SNAPSHOTS_LIST] = "snapshots_list",
                [ROUTE_TEMPLATE_DELETE] = "template_delete",
                [ROUTE_EVENTS] = "events",
                [ROUTE_SANDBOX_EVENTS] = "sandbox_events",
                [ROUTE_USAGE] = "usage",
                [ROUTE_VOLUMES_CREATE] = "volumes_create",
        };
        return kind > 0 && kind < _ROUTE_MAX && names[kind] ? names[kind] : "other";
}

void metrics_request_done(server *srv, request *req, unsigned status) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        const char *name;
        route rt;
        if (req->data_plane)
                name = startswith(req->url, "/files") ? "envd_files" : "envd";
        else
                name = route_control(req->method, req->url, &rt) == 0 ? route_name(rt.kind)
                                                                      : "unknown";
        char st[8];
        snprintf(st, sizeof st, "%u", status);
        series *s = find(&m->requests, name, st);
        if (s)
                s->n++;
        double secs = req->t0_ns ? (double) (clock_ns(CLOCK_MONOTONIC) - req->t0_ns) / 1e9 : 0;
        s = find(&m->latency, name, "");
        if (s)
                histo_add(&s->h, secs);
        if (!req->data_plane && streq(name, "sandboxes_create") && (status == 200 || status == 201))
                histo_add(&m->create_latency, secs);
}

void metrics_sandbox_created(server *srv) {
        if (srv->metrics)
                srv->metrics->creates++;
}

void metrics_sandbox_end(server *srv, const sbx *sb, const char *reason) {
        struct daemon_metrics *m = srv->metrics;
        if (!m || sb->pooled)
                return;
        series *s = find(&m->ends, reason ? reason : "", "");
        if (s)
                s->n++;
}

void metrics_egress(server *srv, const store_egress *e) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        series *s = find(&m->egress, e->allowed ? "allow" : "deny", "");
        if (s)
                s->n += 1 + (uint64_t) (e->suppressed > 0 ? e->suppressed : 0);
        m->egress_bytes_out += (uint64_t) e->bytes_out;
        m->egress_bytes_in += (uint64_t) e->bytes_in;
}

void metrics_sandbox_killed(server *srv, int64_t ns) {
        if (srv->metrics)
                histo_add(&srv->metrics->kill_latency, (double) ns / 1e9);
}

void metrics_template_pull(server *srv, int64_t bytes) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        m->pulls++;
        m->pull_bytes += (uint64_t) (bytes > 0 ? bytes : 0);
}

void metrics_store_write(server *srv, const char *writer, int64_t ns) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        series *s = find(&m->store, writer, "");
        if (s)
                histo_add(&s->h, (double) ns / 1e9);
}

void metrics_admission_wait(server *srv, int op, int64_t ns) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        series *s = find(&m->adm_wait, route_name(op), "");
        if (s)
                histo_add(&s->h, (double) ns / 1e9);
}

void metrics_admission_refused(server *srv, const char *limit) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        series *s = find(&m->adm_refused, limit, "");
        if (s)
                s->n++;
}

/* ------------------------------------------------------------- rendering */

typedef struct out {
        char *p;
        size_t n;
        FILE *f;
} out;

static void histo_print(FILE *f, const char *name, const char *labels, const histo *h) {
        const char *sep = labels[0] ? "," : "";
        for (size_t i = 0; i < NB; i++)
                fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, buckets[i],
                        (unsigned long long) h->b[i]);
        fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                (unsigned long long) h->count);
        fprintf(f, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
                h->sum);
        fprintf(f, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
                labels[0] ? "}" : "", (unsigned long long) h->count);
}

static long proc_rss_bytes(void) {
        FILE *f = fopen("/proc/self/statm", "re");
        long pages = 0, rss = 0;
        if (f) {
                if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
                        rss = 0;
                fclose(f);
        }
        return rss * sysconf(_SC_PAGESIZE);
}

char *metrics_render(server *srv) {
        struct daemon_metrics *m = srv->metrics;
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return NULL;
        /* sandboxes by state and backend, counted now */
        unsigned n[2][HUTCH_BACKENDS] = { { 0 } }; /* [paused][HUTCH_BACKEND_*] */
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && !sb->pooled && sb->backend >= 0 && sb->backend < HUTCH_BACKENDS)
                        n[sb->paused][sb->backend]++;
        fputs("# HELP hutch_sandboxes Sandboxes of this daemon, by state and backend.\n"
              "# TYPE hutch_sandboxes gauge\n",
              f);
        for (int p = 0; p < 2; p++)
                for (int b = 0; b < HUTCH_BACKENDS; b++)
                        fprintf(f, "hutch_sandboxes{state=\"%s\",backend=\"%s\"} %u\n",
                                p ? "paused" : "running", hutch_backend_name(b), n[p][b]);
        /* GPUs: the host's (its nodes, counted now) and those this
         * daemon's sandboxes hold (a `hutch run`'s are not this daemon's) */
        unsigned gpus_held = 0;
        for (sbx *sb = srv->sandboxes; sb; sb = sb->next)
                if (!sb->dead && sb->h)
                        gpus_held += (unsigned) hutch_sandbox_gpus(sb->h, NULL);
        fprintf(f,
                "# HELP hutch_gpus NVIDIA GPUs on this host (device nodes nvidiaN in gpu-dev-dir).\n"
                "# TYPE hutch_gpus gauge\nhutch_gpus %d\n"
                "# HELP hutch_gpus_allocated GPUs held by this daemon's sandboxes (with gpu-share on, a GPU counts once per sandbox).\n"
                "# TYPE hutch_gpus_allocated gauge\nhutch_gpus_allocated %u\n",
                hutch_gpu_count(srv->ctx), gpus_held);
        fprintf(f,
                "# HELP hutch_pool_sandboxes Sandboxes ready in the warm pool.\n"
                "# TYPE hutch_pool_sandboxes gauge\nhutch_pool_sandboxes %u\n"
                "# HELP hutch_pool_target_sandboxes The pool-size setting.\n"
                "# TYPE hutch_pool_target_sandboxes gauge\nhutch_pool_target_sandboxes %llu\n",
                srv->n_pool, (unsigned long long) srv->cfg.pool_size);
        fprintf(f,
                "# HELP hutch_sandbox_creates_total Sandboxes created.\n"
                "# TYPE hutch_sandbox_creates_total counter\nhutch_sandbox_creates_total %llu\n",
                (unsigned long long) m->creates);
        fputs("# HELP hutch_sandbox_ends_total Sandboxes ended, by reason.\n"
              "# TYPE hutch_sandbox_ends_total counter\n",
              f);
        for (series *s = m->ends; s; s = s->next)
                fprintf(f, "hutch_sandbox_ends_total{reason=\"%s\"} %llu\n", s->a,
                        (unsigned long long) s->n);
        fputs("# HELP hutch_sandbox_create_duration_seconds Time to answer a successful create.\n"
              "# TYPE hutch_sandbox_create_duration_seconds histogram\n",
              f);
        histo_print(f, "hutch_sandbox_create_duration_seconds", "", &m->create_latency);
        fputs("# HELP hutch_sandbox_kill_duration_seconds Time from a sandbox's kill to the end of its teardown "
              "(every process gone; layer, cgroup and state removed).\n"
              "# TYPE hutch_sandbox_kill_duration_seconds histogram\n",
              f);
        histo_print(f, "hutch_sandbox_kill_duration_seconds", "", &m->kill_latency);
        fprintf(f,
                "# HELP hutch_template_pulls_total Images pulled for template builds (fromImage).\n"
                "# TYPE hutch_template_pulls_total counter\nhutch_template_pulls_total %llu\n"
                "# HELP hutch_template_pull_bytes_total Bytes those pulls downloaded.\n"
                "# TYPE hutch_template_pull_bytes_total counter\nhutch_template_pull_bytes_total %llu\n",
                (unsigned long long) m->pulls, (unsigned long long) m->pull_bytes);
        fputs("# HELP hutch_api_requests_total API requests answered, by route and status.\n"
              "# TYPE hutch_api_requests_total counter\n",
              f);
        for (series *s = m->requests; s; s = s->next)
                fprintf(f, "hutch_api_requests_total{route=\"%s\",status=\"%s\"} %llu\n", s->a,
                        s->b, (unsigned long long) s->n);
        fputs("# HELP hutch_api_request_duration_seconds Time from a request's headers to its answer, by route.\n"
              "# TYPE hutch_api_request_duration_seconds histogram\n",
              f);
        for (series *s = m->latency; s; s = s->next) {
                char l[80];
                snprintf(l, sizeof l, "route=\"%s\"", s->a);
                histo_print(f, "hutch_api_request_duration_seconds", l, &s->h);
        }
        fputs("# HELP hutch_egress_connections_total Connections through the egress proxies, by decision.\n"
              "# TYPE hutch_egress_connections_total counter\n",
              f);
        for (series *s = m->egress; s; s = s->next)
                fprintf(f, "hutch_egress_connections_total{decision=\"%s\"} %llu\n", s->a,
                        (unsigned long long) s->n);
        fprintf(f,
                "# HELP hutch_egress_bytes_total Bytes through the egress proxies, by direction.\n"
                "# TYPE hutch_egress_bytes_total counter\n"
                "hutch_egress_bytes_total{direction=\"out\"} %llu\nhutch_egress_bytes_total{direction=\"in\"} %llu\n",
                (unsigned long long) m->egress_bytes_out, (unsigned long long) m->egress_bytes_in);
        fputs("# HELP hutch_store_write_duration_seconds Time of the daemon's batched database writes, by writer.\n"
              "# TYPE hutch_store_write_duration_seconds histogram\n",
              f);
        for (series *s = m->store; s; s = s->next) {
                char l[80];
                snprintf(l, sizeof l, "writer=\"%s\"", s->a);
                histo_print(f, "hutch_store_write_duration_seconds", l, &s->h);
        }
        fprintf(f,
                "# HELP hutch_admission_queued Requests that create, resume, pause or snapshot sandboxes, "
                "waiting their team's turn.\n"
                "# TYPE hutch_admission_queued gauge\nhutch_admission_queued %u\n",
                admission_queued());
        fputs("# HELP hutch_admission_wait_seconds Time such a request waited for its turn, by route.\n"
              "# TYPE hutch_admission_wait_seconds histogram\n",
              f);
        for (series *s = m->adm_wait; s; s = s->next) {
                char l[80];
                snprintf(l, sizeof l, "route=\"%s\"", s->a);
                histo_print(f, "hutch_admission_wait_seconds", l, &s->h);
        }
        fputs("# HELP hutch_admission_refused_total Such requests refused with 429, by the limit reached.\n"
              "# TYPE hutch_admission_refused_total counter\n",
              f);
        for (series *s = m->adm_refused; s; s = s->next)
                fprintf(f, "hutch_admission_refused_total{limit=\"%s\"} %llu\n", s->a,
                        (unsigned long long) s->n);
        unsigned fds = 0, limit = 0;
        (void) server_fds(&fds, &limit);
        fprintf(f,
                "# HELP process_resident_memory_bytes Resident memory of the daemon.\n"
                "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %ld\n"
                "# HELP process_open_fds Open descriptors of the daemon.\n"
                "# TYPE process_open_fds gauge\nprocess_open_fds %u\n"
                "# HELP process_max_fds The daemon's open-files limit.\n"
                "# TYPE process_max_fds gauge\nprocess_max_fds %u\n"
                "# HELP process_start_time_seconds When the daemon started (unix seconds).\n"
                "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %lld\n",
                proc_rss_bytes(), fds, limit, (long long) (m->start_ms / 1000));
        if (fclose(f) != 0) {
                free(buf);
                return NULL;
        }
        return buf;
}

/* ------------------------------------------------------------- its server */

static enum MHD_Result on_metrics(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
        server *srv = cls;
        if (!*con_cls) { /* headers: wait for the (empty) body */
                *con_cls = (void *) 1;
                return MHD_YES;
        }
        if (*upload_size) {
                *upload_size = 0;
                return MHD_YES;
        }
        struct MHD_Response *resp;
        unsigned status = 200;
        if (!streq(url, "/metrics") || (!streq(method, "GET") && !streq(method, "HEAD"))) {
                static const char msg[] = "only GET /metrics here\n";
                status = streq(url, "/metrics") ? 405 : 404;
                resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *) msg,
                                                       MHD_RESPMEM_PERSISTENT);
        } else {
                char *body = metrics_render(srv);
                if (!body)
                        return MHD_NO;
                resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
                MHD_add_response_header(resp, "Content-Type",
                                        "text/plain; version=0.0.4; charset=utf-8");
        }
        if (!resp)
                return MHD_NO;
        enum MHD_Result r = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return r;
}

static void on_ready(server *srv, watcher *w, uint32_t revents) {
        MHD_run(srv->metrics->mhd);
}

int metrics_setup(server *srv) {
        struct daemon_metrics *m = calloc(1, sizeof *m);
        if (!m)
                return log_error_errno(-ENOMEM, "metrics: out of memory");
        m->start_ms = wall_ms();
        m->w.fd = -1;
        srv->metrics = m;
        if (streq(srv->cfg.metrics_listen, "-"))
                return 0; /* counted, not served */
        struct sockaddr_storage ss;
        unsigned len;
        hutch_error err = { 0 };
        if (http_listen_parse(srv->cfg.metrics_listen, &ss, &len, &err) < 0)
                return log_error_errno(-EINVAL, "metrics-listen: %s", err.msg);
        m->mhd = MHD_start_daemon(
                MHD_USE_EPOLL | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL,
                on_metrics, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *) &ss,
                MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) (32 * 1024), MHD_OPTION_END);
        if (!m->mhd)
                return log_error_errno(-EADDRINUSE, "metrics-listen: cannot listen on %s",
                                       srv->cfg.metrics_listen);
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD);
        m->w.cb = on_ready;
        if (!info || loop_add(srv, &m->w, info->epoll_fd, EPOLLIN) < 0)
                return log_error_errno(-EIO, "metrics-listen: no epoll fd");
        log_info("metrics: serving GET /metrics on http://%s", srv->cfg.metrics_listen);
        return 0;
}

void metrics_teardown(server *srv) {
        struct daemon_metrics *m = srv->metrics;
        if (!m)
                return;
        if (m->mhd) {
                loop_del(srv, &m->w);
                MHD_stop_daemon(m->mhd);
        }
        list_free(m->requests);
        list_free(m->latency);
        list_free(m->ends);
        list_free(m->egress);
        list_free(m->store);
        list_free(m->adm_wait);
        list_free(m->adm_refused);
        free(m);
        srv->metrics = NULL;
}
