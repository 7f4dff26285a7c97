/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch-init internals: the sandbox's PID 1. One thread, one epoll loop
 * (main.c), processes (proc.c), file operations (files.c) and inotify
 * watches (watch.c). Everything a client can make init hold (connections,
 * processes, writes, watches, queued output) has a hard limit below.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/types.h>

#include "sandbox/initproto.h"
#include "util/macro.h"

#define INIT_MAX_CLIENTS 64       /* accepted on the listening socket */
#define INIT_MAX_PROCS 1024       /* tracked live processes */
#define INIT_MAX_EXIT_RECORDS 256 /* exits kept for a later ATTACH */
#define INIT_MAX_TAG 256
#define INIT_MAX_WRITES 64 /* FS_WRITE_BEGIN in progress */
#define INIT_MAX_WATCHES 64
#define INIT_MAX_WATCH_DIRS 8192 /* directories per recursive watch */
#define INIT_MAX_LIST_ENTRIES 100000
#define INIT_MAX_DEPTH 64 /* FS_LIST depth and recursive walks */
#define INIT_MAX_REMOVE_DEPTH 256

/* A connection stops being read once this much output waits for it, and
 * is dropped if events push its queue past the hard limit: a client that
 * does not read must not make init hold unbounded memory. */
#define INIT_OUTQ_HIGH (256 * 1024)
#define INIT_OUTQ_MAX (4 * 1024 * 1024)

#define INIT_PATH_BUF (INITPROTO_MAX_STRING + 1)
#define INIT_DEFAULT_UID 1000
#define INIT_DEFAULT_GID 1000
#define INIT_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* ------------------------------------------------------------ event loop */

/* Something registered with epoll. Freed objects may still have an event
 * pending in the batch being processed, so release() runs only after the
 * batch (the graveyard in main.c). */
typedef struct source {
        int fd;
        bool dead;
        bool registered; /* in the epoll set (events != 0) */
        uint32_t events; /* currently registered */
        uint32_t slot;   /* while registered: its slot in main.c's table, + 1 */
        void (*dispatch)(struct source *s, uint32_t events);
        void (*release)(struct source *s);
        struct source *grave_next;
} source;

int source_add(source *s, uint32_t events);
/* After a restore from a checkpoint (gVisor): a new epoll set with every
 * registered source in it; the old one may hold registrations the sentry
 * brought back for descriptors closed before the checkpoint. */
int loop_rebuild(void);
int source_set_events(source *s, uint32_t events);
/* Unregister and close the fd now; the object stays valid (fd = -1). */
void source_remove(source *s);
/* source_remove(), then release() once the current batch is done. */
void source_kill(source *s);

/* ----------------------------------------------------------- connections */

struct conn;

/* A reply stream too long to build at once (FS_LIST, LIST_PROCS): step()
 * sends a bounded number of frames and returns 1 while more remain, 0 when
 * finished. It runs while the connection's queue is short, so the replies
 * are paced by the client's reading. */
typedef struct job {
        int (*step)(struct conn *c, struct job *j);
        void (*free)(struct job *j);
} job;

typedef struct outframe outframe;

typedef struct cmdline_stage cmdline_stage;

typedef struct conn {
        source src;
        cmdline_stage *stage; /* a command line staged by SPAWN_PART (proc.c) */
        bool creator; /* fd 4, the client that set the token */
        bool authed;
        uint32_t subscriptions; /* INITPROTO_SUB_* */
        outframe *outq, **outq_tail;
        size_t outq_bytes;
        job *job;
        struct conn *next;
} conn;

extern conn *all_conns;

static inline bool conn_alive(const conn *c) {
        return c && !c->src.dead;
}

/* A connection over fd (creator: it sets the token with its HELLO). */
int conn_new(int fd, bool creator);

/* The loop (main.c): create the epoll set, then run it forever. */
int loop_init(void);
_noreturn_ void loop_run(void);

/* Under gVisor (guest.c): the relay's connections, process streams and the
 * egress listener over the mux on fd GUEST_STREAM_FD. */
#define GUEST_STREAM_FD 3
int guest_setup(int stream_fd, uint16_t egress_port);
/* Open (on) or close the 127.0.0.1:egress_port listener; closed at start,
 * so that with the network off a connection is refused, as on ns. */
int guest_net_listen(bool on);
/* Tell the relay init killed a process over the memory limit (sent once
 * the link may carry it). */
void guest_report_oom_kill(void);
/* Tell the relay how many bytes the writable layer holds (sent once the
 * link may carry it; only the latest counts). */
void guest_report_disk(uint64_t used);
/* Under gVisor (layer.c): build the sandbox's root (the read-only template
 * under an overlay whose upper is the sized tmpfs the engine mounted), enter
 * it, drop CAP_SYS_ADMIN; then report the layer's usage once a second. */
int layer_setup(char *const *vol_paths, size_t n_vols);
int layer_watch_setup(void);
void layer_watch_restored(void);
/* Enforce a memory limit of limit bytes from inside a gVisor sandbox
 * (memwatch.c); 0: none. */
int memwatch_setup(uint64_t limit);
/* After a restore from a checkpoint: watch again. */
void memwatch_restored(void);
/* How many bytes init may still write into the writable layer (which lives
 * in the memory it watches) before usage would come within the reserve of
 * the limit; false when no limit is watched (the namespace backend) or the
 * usage cannot be read. */
bool memwatch_write_room(uint64_t *ret);

/* The host relay of a gVisor sandbox (relay.c); argv[0] is "--gvisor-relay". */
int relay_main(int argc, char **argv);
/* connect.c: hutch-init --ingress-connect PORT (inside a gVisor sandbox) */
int connect_main(const char *port_s);

/* One outgoing frame is built at a time, in this writer. */
initproto_writer *msg_begin(uint16_t type, uint16_t flags, uint32_t id);
/* Finish the frame and send it with fds (init keeps its own copies), or
 * queue it. A frame that does not fit becomes an EMSGSIZE error reply. A
 * dead or overflowing connection is closed; returns -errno then. */
int msg_send(conn *c, const int *fds, size_t n_fds);
int reply_ok(conn *c, uint32_t id);
/* err: errno (either sign). The message is fmt, ": ", strerror(err). */
int reply_error(conn *c, uint32_t id, int err, const char *fmt, ...) _printf_(4, 5);
void conn_start_job(conn *c, job *j);

/* -------------------------------------------------------------- requests */

#define REQ_MAX_TAG 80

/* A request decoded once, up front: every known field checked for size and
 * content, strings NUL-terminated. First occurrence of a tag wins (as in
 * initproto_find); T_ARG and T_ENV collect every occurrence. Valid until
 * the next request is read. */
typedef struct req {
        uint16_t type;
        uint32_t id;
        bool has[REQ_MAX_TAG];
        uint64_t u64[REQ_MAX_TAG];
        const char *str[REQ_MAX_TAG];
        const char *argv[INITPROTO_MAX_ARGS + 1];
        size_t argc;
        const char *envv[INITPROTO_MAX_ARGS + 1];
        size_t envc;
        /* T_META_KEY, T_META_VALUE pairs, in order */
        const char *meta_keys[INITPROTO_META_MAX];
        const char *meta_values[INITPROTO_META_MAX];
        size_t n_meta;
} req;

static inline bool req_has(const req *r, uint16_t tag) {
        return tag < REQ_MAX_TAG && r->has[tag];
}
static inline uint64_t req_u64(const req *r, uint16_t tag, uint64_t def) {
        return req_has(r, tag) ? r->u64[tag] : def;
}
static inline const char *req_str(const req *r, uint16_t tag) {
        return tag < REQ_MAX_TAG ? r->str[tag] : NULL;
}

/* ------------------------------------------------------------- handlers */

void proc_handle(conn *c, const req *r);
/* INITPROTO_SPAWN_PART: stage a chunk of argv/env on the connection. */
void proc_spawn_part(conn *c, const initproto_msg *m);
/* Drop the connection's staged command line (at close, or a new start). */
void proc_stage_free(conn *c);
void proc_reap(void);
void proc_conn_gone(conn *c);

void files_handle(conn *c, const req *r);
void files_conn_gone(conn *c);

void watch_handle(conn *c, const req *r);
void watch_conn_gone(conn *c);
/* A write committed path by renaming its temporary file into place (whose
 * own inotify events watchers never see): report it the way envd's
 * in-place write shows up (docs/protocol.md, "Watch events"): CREATE and
 * CHMOD (its chown) for a new file, CHMOD for a replaced one, WRITE when
 * it wrote data or truncated a file, CHMOD when metadata xattrs changed. */
void watch_note_write(const char *path, bool created, bool wrote, bool meta_changed);
/* ".<name>.hutch-XXXXXX": the temporary file of a write in progress. */
bool write_temp_name(const char *name);

/* --------------------------------------------------- helpers (files.c) */

/* Switch the fs credentials to the requesting user for one operation;
 * permission checks are then the user's (root's for uid 0). Nests: cleanup
 * of another user's write can run in the middle of a request. */
typedef struct fsuser {
        uid_t uid;
        gid_t gid;
} fsuser;
int fsuser_enter(uid_t uid, gid_t gid, fsuser *ret_saved);
extern bool splice_unusable; /* file writes copy with read/write */
extern bool fsuser_use_euid; /* under gVisor: switch effective ids, not fs ids */
void fsuser_restore(const fsuser *saved);
/* Read T_UID/T_GID (default 1000/1000) and refuse (uid_t)-1, which the
 * set*id calls read as "leave unchanged". */
int req_user(const req *r, uid_t *ret_uid, gid_t *ret_gid);

/* Absolute, lexically normalized: no "//", "." or ".." (the host resolved
 * relative paths already). -EINVAL when not absolute. */
int path_normalize(const char *in, char out[static INIT_PATH_BUF]);

/* User database of the sandbox (its own /etc, never the host's). */
int user_lookup(uid_t uid, char *ret_name, size_t name_sz, char *ret_home, size_t home_sz);
const char *user_name(uid_t uid); /* cached; the number when unknown */
const char *group_name(gid_t gid);
void names_cache_reset(void);

/* Put the file fields (T_NAME, T_PATH, T_TYPE, ...) of name, relative to
 * dirfd, into w. ret_type (optional): HUTCH_FILE_* of the entry itself. */
int file_info_put(initproto_writer *w, int dirfd, const char *name, const char *path, int *ret_type);
/* Put the user.e2b.* xattrs of path (never following a final symlink) as
 * T_META_KEY/T_META_VALUE pairs; entries outside the bounds are left out. */
void file_meta_put(initproto_writer *w, const char *path);

/* Create every missing directory of path (mode 0755), each chowned to
 * owner. ret_created: whether the last component was created here. */
typedef struct mkdir_owner {
        uid_t uid;
        gid_t gid;
} mkdir_owner;
int mkdir_parents(const char *path, const mkdir_owner *owner, bool *ret_created);

void log_debug(const char *fmt, ...) _printf_(1, 2);
void log_debug_enable(bool on);
