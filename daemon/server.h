/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch serve: the daemon. One thread, one epoll loop (docs/style.md "The
 * server"): libmicrohttpd runs in external-epoll mode inside it, streams are
 * suspended connections resumed when a process pipe, a watch or a timer has
 * something for them, so a thousand open streams cost no threads.
 *
 *   server.c     the loop, timers, configuration, start-up and re-adoption
 *   http.c       request contexts, bodies, JSON/error responses, streams
 *   api.c        routing and the control plane (/sandboxes, /v2/sandboxes)
 *   admission.c  per-team queues of creates and other engine calls, one per turn
 *   sandboxes.c  the live sandbox table: create, kill, pause, timeouts, events
 *   envd.c       the envd plane: Connect RPCs (process.*, filesystem.*)
 *   files.c      GET/POST /files, signatures
 *   connect.c    the Connect envelope and error codes (pure, fuzzed)
 *   egress.c     each sandbox's egress proxy site and policy
 *   secrets.c    /secrets, placeholders, credential rules
 *   snapshots.c  snapshots and fork (sealed files in DATA_DIR/snapshots)
 */
#pragma once

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "hutch/hutch.h"
#include "egress/policy.h"
#include "store/store.h"

#define ENVD_PORT 49983
#define ENVD_VERSION "0.6.13"

/* ------------------------------------------------------------ configuration */

typedef struct server_config {
        char listen[128];         /* host:port */
        char tls_cert[1024];      /* PEM paths, "-" = plain HTTP */
        char on_stop[8];          /* keep | kill: this daemon's sandboxes at a clean stop */
        char tls_key[1024];
        char sandbox_tls_cert[1024]; /* PEM paths, "-" = none: served by SNI for the sandbox domain */
        char sandbox_tls_key[1024];
        char tls_client_ca[1024]; /* PEM CA bundle, "-" = none: every API request but /health needs a client cert it signed */
        char data_dir[1024];
        char run_dir[1024];
        uint64_t default_timeout_s;  /* sandbox lifetime when create sends none */
        uint64_t max_timeout_s;      /* longest lifetime a client may ask for */
        uint64_t max_sandboxes_per_team;
        uint64_t max_queued_per_team; /* heavy requests a team may have waiting or running (admission.c) */
        uint64_t max_queued;          /* the same, the whole daemon */
        uint64_t max_body_bytes;     /* JSON and RPC request bodies */
        uint64_t max_upload_bytes;   /* one POST /files request, after decompression */
        uint64_t max_connections;
        uint64_t max_connections_per_client; /* per client address */
        uint64_t idle_timeout_s;     /* authenticated connections */
        uint64_t unauth_timeout_s;   /* connections with no authenticated request yet */
        uint64_t stream_buffer_bytes; /* output queued per stream before the process is throttled */
        uint64_t memory_mb, cpu_count, disk_mb; /* default sandbox limits */
        uint64_t metrics_interval_s;
        uint64_t pool_size;          /* sandboxes of the host template kept ready to hand out */
        /* egress (daemon/egress.c, docs/egress.md) */
        char egress_allow[4096];     /* the operator's ceiling: rules, comma-separated */
        char egress_deny[4096];
        char egress_open[1024];      /* reserved ranges opened */
        char build_egress[4096];     /* template build steps' egress rules, under the ceiling (templates.c) */
        char dns[256];               /* nameservers; empty: /etc/resolv.conf */
        char egress_upstream_ca[1024]; /* extra CAs trusted for intercepted upstreams */
        char sandbox_domain[256];    /* ingress: Host <port>-<id>.<domain>; create's "domain" */
        uint64_t egress_port;
        char backend[16];            /* ns or gvisor: sandboxes whose create names none */
        char template_backends[256]; /* NAME=BACKEND,...: a template's default, before backend */
        char runsc[1024];            /* "auto" or a path */
        char gvisor_platform[16];
        /* NVIDIA GPUs (lib/sandbox/gpu.c, docs/gpu.md) */
        uint64_t gpu_share;          /* 1: several sandboxes may hold one GPU */
        char gpu_dev_dir[1024];      /* the nodes nvidia0, nvidiactl, ... */
        char gpu_driver_root[1024];  /* the driver's libraries and programs are found under it */
        char gpu_proc_dir[1024];     /* the driver's /proc/driver/nvidia */
        uint64_t egress_connections; /* per sandbox, open at once */
        uint64_t egress_bandwidth;   /* per sandbox and direction, bytes/s; 0: unlimited */
        uint64_t egress_records;     /* decisions recorded per sandbox per second */
        uint64_t retention_s;        /* ended sandboxes' rows, events and egress records are kept this long */
        uint64_t max_snapshots_per_team;
        uint64_t snapshot_reserve_bytes; /* free disk a snapshot must leave */
        uint64_t snapshot_jobs;          /* snapshot, fork and restore workers at once (daemon/snapjob.c) */
        uint64_t snapshot_jobs_per_team; /* of which one team's */
        uint64_t volume_size_bytes;      /* POST /volumes makes volumes of this size */
        uint64_t max_volumes_per_team;
        /* image pulls (lib/image/pull.h): the same files `hutch template pull` reads */
        char registries_conf[1024];  /* "-": DATA_DIR/registries.conf */
        char registry_ca[1024];      /* "-": the system's CAs only */
        char template_registry[256]; /* REGISTRY/PATH templates are pulled from on a miss (daemon/tplshare.c); "-": none */
        uint64_t ready_timeout_s;    /* a template's ready command must succeed within this (daemon/startcmd.c) */
        uint64_t interp_pool_size;   /* code-interpreter sandboxes kept started and ready */
        uint64_t interp_checkpoint;  /* gvisor: code-interpreter creates restore a checkpoint of a started one (sandboxes.c) */
        uint64_t audit, audit_checkpoint_interval_s, audit_retention_s; /* daemon/audit.c */
        char metrics_listen[128];    /* daemon/metrics.c: HOST:PORT or "-" */
        char log_format[8];          /* text | json */
        char keys_file[1024];        /* "TEAM KEY" lines, re-read on change (daemon/keysfile.h); "-": none */
        char node_id[8];             /* [a-z0-9]{4}, the first characters of every id (daemon/node.h) */
} server_config;

int server_config_defaults(server_config *c);
/* key = value lines; unknown keys and out-of-range values are errors. */
int server_config_load_file(server_config *c, const char *path, hutch_error *err);
int server_config_set(server_config *c, const char *key, const char *value, hutch_error *err);
void server_config_help(FILE *f);

/* ---------------------------------------------------------------- objects */

typedef struct server server;

/* The options of image pulls (a build's fromImage, lib/image/pull.h) from
 * the registries-conf and registry-ca settings. */
struct image_pull_opts;
void server_pull_opts(const server *srv, struct image_pull_opts *ret);
/* tls-cert is set: the API port speaks HTTPS only. */
bool server_tls_on(const server *srv);
typedef struct sbx sbx;
typedef struct proc proc;
typedef struct stream stream;
typedef struct request request;
typedef struct ingress_conn ingress_conn;

/* Something registered in the epoll set. */
typedef struct watcher {
        int fd;
        uint32_t events;
        void (*cb)(server *srv, struct watcher *w, uint32_t revents);
        void *data;
} watcher;

int loop_add(server *srv, watcher *w, int fd, uint32_t events);
int loop_mod(server *srv, watcher *w, uint32_t events);
void loop_del(server *srv, watcher *w);

/* A chunked streaming response (Connect server streams). Bytes are queued
 * here and handed to MHD by its content reader; with nothing queued the
 * connection is suspended until stream_resume(). */
enum { STREAM_PROCESS = 1, STREAM_WATCH = 2 };
struct stream {
        server *srv;
        struct MHD_Connection *conn;
        int kind;
        sbx *sb;
        proc *proc;          /* STREAM_PROCESS */
        uint32_t watch_id;   /* STREAM_WATCH */
        char *watch_root;    /* STREAM_WATCH: the watched path, without trailing '/' */
        bool watch_recursive, watch_entry;
        unsigned watch_dropped; /* events dropped while the reader lagged */
        hutch_fs_user user;
        char *buf;
        size_t len, off, cap;
        bool suspended;
        bool finished;       /* the end-stream frame is queued: END_OF_STREAM after the buffer */
        bool cut;            /* sandbox killed or paused: drop the connection, no end frame */
        bool started;        /* the start event was queued */
        int64_t keepalive_ms; /* 0 = none */
        int64_t last_send_ms;
        int64_t deadline_ms;  /* Connect-Timeout-Ms; 0 = none */
        stream *next_in_proc; /* proc's subscriber list */
        stream *next, *prev;  /* server's list of open streams */
};

void stream_queue_frame(stream *st, uint8_t flags, const char *json, size_t len);
void stream_queue_json(stream *st, json_t *msg); /* steals msg */
void stream_finish(stream *st, const char *code, const char *message);
void stream_cut(stream *st);
void stream_resume(stream *st);
/* Attach a new streaming response to the connection and queue it (status 200). */
stream *stream_new(server *srv, struct MHD_Connection *conn, int kind, enum MHD_Result *ret_mhd);

/* A process started through the envd plane (or found again at re-adoption). */
#define PROC_EXITED_KEEP 64
struct proc {
        sbx *sb;
        pid_t pid;
        char *tag;
        /* the request that started it: the daemon's own record, or after a
         * restart what the sandbox's hutch-init kept ("" when neither) */
        char request_id[65];
        bool request_id_from_sandbox;
        json_t *config;        /* ProcessConfig as JSON: cmd, args, envs, cwd */
        bool pty;
        int in_fd;             /* stdin pipe write end, or the pty master (dup), or -1 */
        watcher out_w, err_w;  /* stdout/stderr (pty: out only) */
        bool out_eof, err_eof;
        bool exited;
        hutch_exit exit;
        int64_t exited_ms;
        int64_t deadline_ms;   /* SIGKILL at this time (Connect-Timeout-Ms of Start) */
        int64_t started_ms;    /* audit: when Start started it (0: found at re-adoption) */
        stream *timeout_stream; /* the Start stream whose deadline this is */
        bool throttled;        /* output reading paused: a subscriber is slow */
        stream *subs;          /* subscriber streams */
        bool close_stdin_pending; /* CloseStdin came while input was still queued */
        char *inbuf;           /* stdin bytes not yet written */
        size_t inlen;
        watcher in_w;
        proc *next;
};

struct sbx {
        server *srv;
        char id[HUTCH_ID_LEN + 1];
        int64_t team_id;
        char template_id[64];
        int backend;            /* HUTCH_BACKEND_* */
        char alias[64];
        hutch_sandbox *h;
        watcher w;              /* init's control socket */
        bool paused;
        bool dead;
        bool dirty;             /* a synchronous call may have queued events: drain them */
        bool procs_pending;     /* re-adopted while paused: find its processes at resume */
        bool pooled;            /* in the warm pool: no row, no owner yet */
        char pool_version[96]; /* pooled: the version of the built base or interpreter template it started (templates/base's or templates/code-interpreter's target; "" for the host template) */
        bool start_pending;     /* pooled: its template's ready command has not succeeded yet */
        bool start_done;        /* its template's start command runs and was ready (a pooled one) */
        bool snapshotting;      /* a snapshot or fork worker copies its layer now (snapjob.c): not
                                   thawed, paused or resumed, and its data-plane requests wait */
        bool dying;             /* killed; the engine finishes when init's pidfd is readable */
        bool gone;              /* dying, and init is gone: the teardown waits its turn (sbx_reap) */
        watcher gone_w;         /* init's pidfd while dying (never the init socket's watcher: a
                                   stale event for that one must not finish the teardown) */
        hutch_fs_write **pending_aborts; /* uploads cut while paused: aborted at resume */
        size_t n_pending_aborts;
        int64_t dying_since_ms;
        int64_t kill_t0_ns; /* CLOCK_MONOTONIC at its kill: the kill duration metric */
        int64_t started_ms, end_ms;
        char token[64];
        json_t *metadata;       /* object of strings */
        json_t *envs;           /* object of strings */
        json_t *extra;          /* lifecycle etc. */
        bool on_timeout_pause;
        bool auto_resume;
        bool pause_keep_memory; /* a timeout pause keeps processes (false: reboot at resume) */
        bool cold_resume;       /* paused without memory: resume reboots (processes killed, new boot id) */
        int64_t cpu_count, memory_mb, disk_mb;
        struct egress_site *egress; /* its proxy, when the network is on */
        proc *procs;            /* live and recently exited */
        struct pwatch *pwatches; /* CreateWatcher watchers (polled with GetWatcherEvents) */
        unsigned n_exited;
        /* metrics ring */
#define SBX_METRICS 120
        struct sample {
                int64_t ts_ms;
                double cpu_pct;
                uint64_t mem_used, mem_total, mem_cache, disk_used, disk_total;
        } samples[SBX_METRICS];
        unsigned n_samples, sample_head;
        uint64_t last_cpu_ns;
        int64_t last_cpu_ms;
        int64_t next_sample_ms;
        sbx *next;
};

struct server {
        server_config cfg;
        int epfd;
        struct MHD_Daemon *mhd;
        int listen_fd;           /* bound at start, ingress_h2's once http_start ran */
        int lock_fd;             /* DATA_DIR/serve.lock, held for the daemon's life */
        char *tls_pem[2];        /* tls-cert, tls-key: MHD reads them for its whole life */
        char *tls_client_ca_pem; /* tls-client-ca, for MHD's trust list, for its whole life */
        struct tls_certs *tls_certs; /* both pairs in GnuTLS, when sandbox-tls-cert is set (daemon/tls.c) */
        watcher mhd_w;
        hutch_ctx *ctx;
        hutch_store *store;
        uint8_t master[32];
        uint8_t data_key[32];   /* DATA_DIR/secrets.key: seals secrets' team keys and snapshots */
        char fork_snapshot[32]; /* during a fork: its snapshot, unsealed once into fork_stream */
        char fork_stream[4096];
        char fork_image[4096];  /* and an image made from it (snapshots.c's workers), which the next
                                   create of that snapshot takes over: emptied when it does */
        uint32_t fork_image_base;
        sbx *sandboxes;
        stream *streams;
        bool quit;
        int sigfd;
        watcher sig_w;
        int64_t default_team;
        struct egress_proxy *egress;
        struct egress_ceiling *egress_ceiling;
        struct tlsmint *mint;   /* the deployment CA: TLS interception for credential rules */
        char *ca_bundle;        /* the host's CA bundle plus the deployment CA, for sandboxes */
        size_t ca_bundle_len;
        watcher egress_w;
        uint64_t resumes;       /* connections resumed so far (the loop serves them before sleeping) */
        sbx *pool;              /* warm pool: ready sandboxes without a row */
        unsigned n_pool;
        int64_t pool_backoff_ms; /* after a failed fill, wait until then */
        int64_t interp_ckpt_backoff_ms; /* after a failed interpreter checkpoint, none until then */
        bool interp_ckpt_wanted;        /* a code interpreter was asked for (sandboxes.c) */
        bool pool_dirty;         /* pool-ids to rewrite once the claimed sandbox has its row */
        /* housekeeping (server.c): a pass prunes the database in batches,
         * one per loop turn, then waits for the next */
        int64_t housekeeping_due_ms;
        bool pruning;            /* a pass is under way */
        bool checkpoint_pending; /* rows were deleted and the WAL not truncated since */
        store_prune_counts pruned; /* what this pass removed so far */
        struct daemon_audit *audit; /* daemon/audit.c; NULL with audit = off */
        struct daemon_usage *usage; /* daemon/usage.c */
        struct daemon_metrics *metrics; /* daemon/metrics.c */
        struct keysfile *keys;   /* keys-file (daemon/keysfile.c), or NULL */
};

/* ---------------------------------------------------------------- http.c */

/* A heavy request's place in admission (daemon/admission.c). */
enum { ADM_NONE, ADM_QUEUED, ADM_ADMITTED, ADM_RUN, ADM_DROPPED };
struct admission_entry {
        int state;           /* ADM_* */
        int op;              /* its route (metrics) */
        int64_t team;
        int64_t queued_ns;   /* CLOCK_MONOTONIC when it was queued */
        watcher gone_w;      /* its socket while queued: EPOLLRDHUP, the client went away */
        request *next;       /* its team's queue */
};

/* One request's state across MHD's access-handler calls. */
enum { BODY_BUFFER = 1, BODY_FILES = 2, BODY_DISCARD = 3, BODY_VOLUME = 4, BODY_INGRESS = 5, BODY_TPL_UPLOAD = 6 };
struct request {
        server *srv;
        struct MHD_Connection *conn;
        const char *method;
        char *url;
        int body_mode;
        char *body;
        size_t body_len, body_cap;
        bool too_large;
        struct files_upload *upload; /* BODY_FILES */
        struct vol_request *vol;     /* /volumecontent/…: its session (daemon/volumes.c) */
        ingress_conn *ingress;       /* BODY_INGRESS: a request to a sandbox port */
        struct tpl_upload *tpl_upload; /* BODY_TPL_UPLOAD (templates.c) */
        bool responded;
        bool authenticated;     /* its connection got idle-timeout (http_conn_authenticated) */
        struct MHD_Response *deferred; /* a reply waiting for the body to be read */
        unsigned deferred_status;
        uint64_t discarded;
        bool data_plane;             /* routed to a sandbox's envd */
        int64_t team;                /* control plane: the API key's team */
        int64_t key_id;              /* control plane: the API key's id (audit) */
        int64_t t0_ns;               /* CLOCK_MONOTONIC at its headers (metrics) */
        char rid[65];                /* request id: the client's X-Request-Id, or made here (logs, audit) */
        char sbx_id[HUTCH_ID_LEN + 1];
        /* sandboxes this request created, whose rows stay marked unanswered
         * until its response has been sent (sbx_create_answered) */
        char (*created)[HUTCH_ID_LEN + 1];
        unsigned n_created;
        struct admission_entry adm;
        struct snapjob_waiter *snap_wait; /* waiting for a snapshot worker, or using its result (snapjob.c) */
        int resume_action;           /* RESUME_*: what it does when its connection is resumed */
};

enum MHD_Result http_reply_json(struct MHD_Connection *c, unsigned status, json_t *body); /* steals body */
/* 200 with a list page: X-Next-Token when next_token is not empty. */
enum MHD_Result http_reply_json_page(struct MHD_Connection *c, json_t *body, const char *next_token);
enum MHD_Result http_reply_error(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
enum MHD_Result http_reply_empty(struct MHD_Connection *c, unsigned status);
enum MHD_Result http_reply_text(struct MHD_Connection *c, unsigned status, const char *ctype, const char *text);
/* Connect unary error: {"code":"not_found","message":…} with the mapped status. */
enum MHD_Result http_reply_connect_error(struct MHD_Connection *c, const char *code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
enum MHD_Result http_reply_502(struct MHD_Connection *c, const char *sandbox_id);
/* 429 with Retry-After and the API's JSON error body. */
enum MHD_Result http_reply_429(struct MHD_Connection *c, unsigned retry_after_s, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
const char *http_header(struct MHD_Connection *c, const char *name);
const char *http_query(struct MHD_Connection *c, const char *name);
/* The request target as the client sent it (path and query, undecoded). */
const char *http_raw_uri(struct MHD_Connection *c);

/* HOST:PORT with a numeric address ("[::1]:49982" for IPv6). */
struct sockaddr_storage;
int http_listen_parse(const char *listen, struct sockaddr_storage *ss, unsigned *ret_len, hutch_error *err);
/* Bind the API's port (first thing at start); http_start serves it. */
int http_bind(server *srv, hutch_error *err);
int http_start(server *srv, hutch_error *err);
/* The request proved a key, token or signature: its connection may idle for
 * idle-timeout instead of unauthenticated-timeout. */
void http_conn_authenticated(request *req);
void http_stop(server *srv);

/* Replies queued between these wait in req->deferred (its connection is
 * suspended); http_resume() hands the connection back to libmicrohttpd,
 * which then sends the reply, or does what req->resume_action says. */
void http_defer_begin(request *req);
void http_defer_end(void);
void http_resume(request *req);

/* ----------------------------------------------------------------- api.c */

/* Called once the body (if any) is complete. */
enum MHD_Result api_dispatch(server *srv, request *req);
/* Called with the headers, before the body: may reject early, or claim the
 * body as a streamed upload (POST /files). Returns MHD_YES to go on reading. */
enum MHD_Result api_begin(server *srv, request *req, bool *ret_responded);

/* ------------------------------------------------------------ admission.c */

/* Heavy control-plane requests (creates, resumes, pauses, snapshots,
 * forks, volume creates) wait in per-team queues and run one per loop turn,
 * teams in turn. admission_gate: *ret_wait false when the request is to run
 * now; true when it was queued (its connection suspended) or refused (429
 * queued), and the result is the handler's. */
enum MHD_Result admission_gate(server *srv, request *req, int op, bool *ret_wait);
/* http.c: a resumed request whose turn came (true), or that was dropped. */
void admission_resumed(server *srv, request *req);
/* Once per loop turn, after every ready event: resume the next request,
 * round-robin over teams (quiet: the turn's epoll_wait found nothing
 * ready). True when the loop must go round without sleeping. */
bool admission_turn(server *srv, bool quiet);
bool admission_busy(void);   /* requests wait or one was resumed and has not run */
unsigned admission_queued(void);
void admission_forget(server *srv, request *req); /* the request ends */
void admission_stop(server *srv);                  /* every waiting request answered 503 */

/* ------------------------------------------------------------ sandboxes.c */

sbx *sbx_find(server *srv, const char *id);
sbx *sbx_find_team(server *srv, const char *id, int64_t team);
/* The row is written before the engine starts the sandbox, marked
 * unanswered (a restart removes such sandboxes): the caller notes the
 * sandbox on its request (sbx_create_note), queues the answer and then
 * calls sbx_create_queued, which clears the mark. */
int sbx_create(server *srv, int64_t team, json_t *body, sbx **ret, unsigned *ret_status, hutch_error *err);
int sbx_create_note(request *req, const sbx *sb);
void sbx_create_queued(server *srv, request *req);
/* The request that created these sandboxes is over. When its answer could
 * not be written (the client went away) they are killed, as nobody holds
 * their ids; at a daemon shutdown they are marked unanswered again and left
 * for the next start. */
void sbx_create_answered(server *srv, request *req, enum MHD_RequestTerminationCode toe);
int sbx_kill(server *srv, sbx *sb, const char *reason);
int sbx_pause(server *srv, sbx *sb, bool keep_memory, hutch_error *err);
/* Write sb->extra (lifecycle and network) to its row. */
void save_sandbox_extra(server *srv, sbx *sb);
int sbx_resume(server *srv, sbx *sb, bool cold, hutch_error *err);
void sbx_cut_streams(server *srv, sbx *sb);
void sbx_drain(server *srv, sbx *sb);
void sbx_mark_dirty(sbx *sb);
int sbx_readopt_all(server *srv);
int64_t sbx_timers(server *srv, int64_t now); /* runs what is due; returns the next due time or -1 */
void sbx_sample(server *srv, sbx *sb, int64_t now);
int sbx_live_count(server *srv, int64_t team);
/* Where a gvisor sandbox paused to disk keeps its sealed checkpoint. */
void sbx_pause_image_path(server *srv, const char *id, char *buf, size_t n);
void sbx_token_derive(server *srv, const char *id, const char *nonce, char ret[64]);
json_t *sbx_to_json(sbx *sb, bool detail);
void sbx_free_all(server *srv);
/* End every live sandbox of this daemon as a kill does, waiting for each. */
void sbx_kill_all(server *srv, const char *reason);
/* Once per loop turn: finish one teardown of a killed sandbox whose init is
 * gone. True when it did (others may wait: go round without sleeping). */
bool sbx_reap(server *srv);
/* Warm pool: top it up by at most one sandbox (called once per loop turn);
 * clean what a previous run left in it; destroy it at shutdown. */
/* After the engine replaced a sandbox's control connection (a gvisor
 * sandbox restored after its own checkpoint): drop the daemon's handles on
 * the old one and its processes (their streams end), watch the new one and
 * attach to the processes init runs now. */
int sbx_reattach(server *srv, sbx *sb);
/* The template-backends setting: whether it is NAME=BACKEND pairs of known
 * templates and backends; and the backend it names for a template (NULL:
 * none). */
int template_backends_check(const char *setting, char *why, size_t whylen);
const char *template_backend(const char *setting, const char *template_name);
/* snapshots.c: whether dir's file system has room for bytes written twice
 * (plain, then sealed) plus the snapshot-reserve setting; and plain_fd
 * sealed (from its start) into final, through final.tmp, fsynced, renamed
 * and the rename synced. why says what failed. */
bool data_disk_has_room(server *srv, const char *dir, uint64_t bytes);
int sealed_file_write(server *srv, int plain_fd, const char *final, const char *context, uint64_t *ret_bytes,
                      char *why, size_t whylen);
/* gvisor, paused to disk: the checkpoint stream, unsealed, to out_fd. */
int sbx_pause_image_read(server *srv, sbx *sb, int out_fd, hutch_error *err);
void sbx_pool_fill(server *srv);
bool sbx_pool_short(server *srv); /* fewer warm sandboxes than the settings ask */
void sbx_pool_sync(server *srv);  /* pool-ids rewritten if a claim changed the pool */
/* Template start and ready commands (daemon/startcmd.c): answer a create
 * whose template has a start command once its ready command exits 0 (the
 * connection waits suspended); the ready command's exits, the retries and
 * deadlines; at stop, every waiting create is answered 503. */
enum MHD_Result sbx_start_answer(server *srv, request *req, sbx *sb);
bool startcmd_on_exit(server *srv, sbx *sb, const hutch_exit *ex);
int64_t startcmd_timers(server *srv, int64_t now);
void startcmd_stop(server *srv);
/* A pooled sandbox of a template with a start command: start it, and mark
 * it start_done once ready (it is not handed out before). */
int startcmd_pool_begin(server *srv, sbx *sb, hutch_error *err);
/* Whether a create from sb's template waits for its start and ready
 * commands (the code interpreter's, a built template's setStartCmd). */
bool startcmd_wanted(sbx *sb);
void sbx_pool_cleanup_previous(server *srv);
void sbx_pool_destroy(server *srv);

/* ---------------------------------------------------------------- envd.c */

enum MHD_Result envd_dispatch(server *srv, request *req, sbx *sb);
int user_resolve(const char *name, hutch_fs_user *ret_user, const char **ret_home);
/* "Basic base64(user:)" → user name; NULL header → "user". */
int user_from_auth(const char *authorization, char *ret, size_t retlen);
char *path_resolve(const char *path, const char *home); /* relative to home */
json_t *entry_to_json(const hutch_file_info *fi);
void proc_on_exit(server *srv, sbx *sb, const hutch_exit *ex);
void proc_free(proc *p);
void sbx_pwatches_free(sbx *sb);
/* An upload's write to abort: now, or at resume when the sandbox is paused
 * (its frozen init could not answer). */
void sbx_write_abort(server *srv, const char *sbx_id, hutch_fs_write *w);
void proc_readopt(server *srv, sbx *sb);
void proc_maybe_unthrottle(server *srv, proc *p);
void stream_on_watch_event(server *srv, sbx *sb, const hutch_event *ev);
int64_t envd_timers(server *srv, int64_t now);

/* --------------------------------------------------------------- files.c */

enum MHD_Result files_begin(server *srv, request *req, sbx *sb);
enum MHD_Result files_body(server *srv, request *req, const char *data, size_t *size);
enum MHD_Result files_finish(server *srv, request *req);
enum MHD_Result files_get(server *srv, request *req, sbx *sb);
void files_upload_free(struct files_upload *u);
/* Which sandbox a signed /files URL (no routing headers) belongs to. */
sbx *files_signed_sandbox(server *srv, struct MHD_Connection *c, bool write);

/* --------------------------------------------------------------- misc */

size_t base64_encode(const uint8_t *in, size_t len, char *out); /* out: 4*ceil(len/3)+1 bytes */
/* Standard or URL-safe alphabet (never both in one string), padding
 * optional. out: room for 3 * ceil(len / 4) bytes. Returns the length or
 * -EINVAL (-ENOMEM). */
ssize_t base64_decode(const char *in, size_t len, uint8_t *out);

int64_t wall_ms(void);
/* The daemon's open descriptors and its RLIMIT_NOFILE. /health answers 503
 * when fewer than SERVER_FDS_RESERVE are left; start warns below WANTED. */
int server_fds(unsigned *ret_open, unsigned *ret_limit);
#define SERVER_FDS_PER_SANDBOX 8
#define SERVER_FDS_RESERVE 16
#define SERVER_FDS_WANTED 8192
void format_rfc3339(int64_t ms, char buf[40]);
int parse_rfc3339(const char *s, int64_t *ret_ms);
bool const_time_eq(const char *a, const char *b);

/* ---------------------------------------------------------------- egress */

struct store_egress;
int egress_setup(server *srv);
void egress_teardown(server *srv);
/* The normalized network spec of a create body (allow_internet_access,
 * network.allowOut/denyOut), validated; -EINVAL etc. with why. */
int egress_spec_from_create(server *srv, json_t *body, json_t **ret, char *why, size_t wl);
int egress_sbx_start(server *srv, sbx *sb); /* open its proxy if its network is on */
/* A pooled sandbox's proxy listener, opened refusing everything when it
 * joins the pool; its claim sets the create's policy on it (or closes it
 * when the create's network is off), or opens one if the pool could not. */
int egress_sbx_pool_open(server *srv, sbx *sb);
int egress_sbx_claim(server *srv, sbx *sb);
void egress_sbx_stop(server *srv, sbx *sb);
void egress_sbx_env(server *srv, sbx *sb, json_t *env); /* HTTP_PROXY and friends */
/* E2B's SandboxDetail.network, and allowInternetAccess (bool or null). */
json_t *egress_network_json(server *srv, sbx *sb, json_t **ret_internet);
int egress_sbx_update(server *srv, sbx *sb, json_t *body, unsigned *ret_closed, char *why, size_t wl);
json_t *egress_log_json(const struct store_egress *v, size_t n);

/* The request body as a JSON object; on error the reply (400) is queued. */
int api_parse_body(request *req, json_t **ret);

/* ---------------------------------------------------------------- secrets */

struct route;
struct egress_inject;
int secrets_setup(server *srv); /* DATA_DIR/secrets.key */
enum MHD_Result secrets_dispatch(server *srv, request *req, const struct route *rt);
void secret_placeholder(server *srv, const char *sbx_id, const char *name, char out[45]);
/* ${e2b.secrets.NAME} in env's values -> the sandbox's placeholders; the
 * names used are appended to names. -ENOENT/-EINVAL with why. */
int secrets_env_rewrite(server *srv, int64_t team, const char *sbx_id, json_t *env, json_t *names, char *why,
                        size_t wl);
int secrets_rules_validate(json_t *rules, struct egress_inject *x, char *why, size_t wl);
int secrets_build_inject(server *srv, sbx *sb, json_t *rules, struct egress_inject **ret);
int secrets_resolve(void *userdata, const char *sandbox_id, const char *name, const egress_host *h, uint16_t port,
                    char **ret, size_t *ret_len);
void egress_sbx_refresh_inject(server *srv, sbx *sb);
/* The deployment CA into the sandbox's trust store. */
int egress_sbx_install_ca(server *srv, sbx *sb, hutch_error *err);
/* Process envs (envd Start): placeholders for secret references, which the
 * sandbox's proxy then honours. */
int egress_sbx_env_secrets(server *srv, sbx *sb, json_t *env, char *why, size_t wl);

/* -------------------------------------------------------------- snapshots */

json_t *sandbox_created_json(sbx *sb); /* create/connect/fork's Sandbox */
int snapshots_setup(server *srv);
bool snapshot_id_valid(const char *s);
/* Verify and unseal a team's snapshot into a new temporary file (its path
 * in ret_path; the caller unlinks it). -ENOENT, -EBADMSG (refused). */
int snapshot_unseal(server *srv, int64_t team, const char *id, store_snapshot *ret_meta, char *ret_path, size_t pathlen,
                    hutch_error *err);
/* A create from a snapshot (body's templateID): 1 when the request waits
 * for the snapshot to be unsealed off the loop (the create is dispatched
 * again then) or its answer is queued (*ret_mr); 0: go on, the snapshot's
 * stream ready for sbx_create when it is one. snapshot_restore_end after
 * sbx_create lets the stream go. */
int snapshot_restore_begin(server *srv, request *req, json_t *body, enum MHD_Result *ret_mr);
void snapshot_restore_end(server *srv, request *req);
/* A snapshot's sealed file, and the context it is sealed under. */
void snapshot_file(server *srv, const char *id, char *buf, size_t n);
void snapshot_seal_context(int64_t team, const char *id, char *buf, size_t n);

/* ------------------------------------------------------------- tplshare.c */

/* template-registry is set. */
bool tplshare_on(const server *srv);
/* A create naming an image template this node lacks, with template-registry
 * set: 1 when the request waits for the template's pull off the loop (the
 * create is dispatched again then) or its answer is queued (*ret_mr: 404
 * when the registry has no such image, 502 when it cannot be asked); 0: go
 * on. tplshare_end after sbx_create. */
int tplshare_begin(server *srv, request *req, json_t *body, enum MHD_Result *ret_mr);
void tplshare_end(server *srv, request *req);
/* A snapshot just sealed (ctx: its seal's context): pushed to
 * template-registry as REGISTRY/PATH/snapshots:<id>, off the loop, when
 * the setting is on; a create from it on another node pulls it there. */
void tplshare_snapshot_push(server *srv, const store_snapshot *sn, const char *ctx);
/* A snapshot deleted here: its tag at template-registry is replaced by a
 * tombstone (an artifact whose config says "deleted"), so that no node
 * restores it any more; until that push succeeds, <id>.deleted keeps this
 * node from pulling it back. */
void tplshare_snapshot_deleted(server *srv, const char *id);
enum MHD_Result snapshot_create(server *srv, request *req, sbx *sb);
enum MHD_Result snapshots_list(server *srv, request *req);
enum MHD_Result snapshot_delete(server *srv, request *req, const char *id);
enum MHD_Result sandbox_fork(server *srv, request *req, sbx *sb);

/* -------------------------------------------------------------- snapjob.c */

/* What a request does when its suspended connection is resumed. */
enum {
        RESUME_NONE,     /* its reply is in req->deferred */
        RESUME_DISPATCH, /* it is dispatched again (api_dispatch), its body read */
        RESUME_BEGIN,    /* it starts again from its headers (api_begin), its body to come */
        RESUME_CLOSE,    /* its client went away: the connection is closed */
};
/* A data-plane request to a sandbox whose layer a worker copies (its init
 * may be frozen: it cannot answer) waits, suspended, until the copy is
 * done, and is then resumed with resume_action. false: sb is not being
 * copied, go on. */
bool snapjob_park(server *srv, request *req, sbx *sb, int resume_action);
/* sbx_kill: a job still copying sb's layer is cancelled (409 to its client). */
void snapjob_sandbox_killed(server *srv, sbx *sb);
/* request_free: it no longer waits for, nor uses, any job. */
void snapjob_request_gone(server *srv, request *req);
/* http_stop: every worker killed and reaped, its files removed, its
 * sandbox thawed, its clients answered 503. */
void snapjobs_stop(server *srv);
/* After each batch of loop events: frees what ended during it. */
void snapjobs_reap(server *srv);

/* ---------------------------------------------------------------- trash.c */

/* DATA_DIR/trash, made (NULL when it cannot be: files are deleted at once). */
const char *trash_setup(server *srv);
/* path moved into the trash (or deleted, when it cannot be), to be deleted
 * by a worker, off the loop. */
void trash_file(server *srv, const char *path);
/* The engine may have put something there (a destroyed sandbox's layer):
 * start the worker if it has work. */
void trash_kick(server *srv);
void trash_stop(server *srv);

/* ---------------------------------------------------------------- volumes */

struct route;
/* Finish deletes a crash cut short. */
void volumes_setup(server *srv);
enum MHD_Result volumes_dispatch(server *srv, request *req, const struct route *rt);
/* /volumecontent/…: authenticated by the volume's token, not an API key.
 * Called with the headers (a PUT's body then streams into the volume). */
enum MHD_Result volumes_content_begin(server *srv, request *req, bool *ret_responded);
enum MHD_Result volumes_content_body(server *srv, request *req, const char *data, size_t *size);
enum MHD_Result volumes_content_dispatch(server *srv, request *req);
void volumes_request_free(struct vol_request *v);
/* volumeMounts of a create body: [{name, path, id}] resolved in the team,
 * NULL when there are none; -EINVAL (-ENOENT) with E2B's message. */
int volumes_mounts_parse(server *srv, int64_t team, json_t *body, json_t **ret, char *why, size_t wl);
/* The engine's mounts from a sandbox's extra.volumeMounts. */
size_t volumes_mounts_config(json_t *mounts, hutch_volume_mount *out, size_t max);
