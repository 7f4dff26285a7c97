/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libhutch: the sandbox engine. This is the only header an embedder includes.
 *
 * Conventions (see docs/style.md): functions return >= 0 on success and a negative
 * errno on failure, with a human-readable message in the optional hutch_error.
 * Out-parameters are named ret_* and are written only on success. Handles are
 * opaque; every destructor accepts NULL.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HUTCH_ID_LEN 20 /* [a-z0-9]{20} */

typedef struct hutch_error {
        int code;        /* negative errno, 0 when no error was recorded */
        char msg[1024];  /* NUL-terminated, empty when no error */
} hutch_error;

/* ---------------------------------------------------------------- context */

typedef struct hutch_ctx hutch_ctx;

typedef struct hutch_ctx_config {
        const char *run_dir;     /* runtime state (sockets, per-sandbox dirs); default /run/hutch */
        const char *data_dir;    /* persistent state (templates, storage); default /var/lib/hutch */
        const char *cgroup_root; /* name of the parent cgroup; default "hutch" */
        uint32_t uid_base;       /* first host uid handed to sandboxes; default 0x40000000 */
        uint32_t uid_slots;      /* number of 65536-id ranges; default 4096 */
        const char *storage;     /* "auto" (default), "ext4" or "tmpfs": how writable layers are limited */
        const char *runsc;       /* the gvisor backend's runsc; default $HUTCH_RUNSC, else /usr/bin/runsc, ... */
        const char *gvisor_platform; /* runsc --platform: "ptrace" (default, $HUTCH_GVISOR_PLATFORM), "systrap", "kvm" */
        /* NVIDIA GPUs (docs/gpu.md): where their device nodes are (default
         * $HUTCH_GPU_DEV_DIR, else /dev), the root the driver's libraries and
         * programs are found under (default $HUTCH_GPU_DRIVER_ROOT, else /),
         * the driver's proc directory (default $HUTCH_GPU_PROC_DIR, else
         * /proc/driver/nvidia), and whether sandboxes may share a GPU
         * (1 yes, -1 never, 0: yes when $HUTCH_GPU_SHARE=1). */
        const char *gpu_dev_dir;
        const char *gpu_driver_root;
        const char *gpu_proc_dir;
        int gpu_share;
        /* A directory on the data dir's file system where the writable
         * layers of destroyed sandboxes are moved, for the caller to delete
         * when it suits it: freeing a large image's blocks takes a while
         * (0.4-0.6 s for 1 GiB here), which the daemon's loop must not wait
         * for. NULL: deleted at once. */
        const char *trash_dir;
} hutch_ctx_config;

int hutch_ctx_new(const hutch_ctx_config *cfg, hutch_ctx **ret_ctx, hutch_error *err);
hutch_ctx *hutch_ctx_free(hutch_ctx *ctx);

/* Which cgroup backend this host uses: "v1" or "v2". */
const char *hutch_ctx_cgroup_backend(const hutch_ctx *ctx);
/* Which writable-layer backend this host uses: "ext4" or "tmpfs" ("auto"
 * before the first sandbox is created or attached). */
const char *hutch_ctx_storage_backend(const hutch_ctx *ctx);

/* --------------------------------------------------------------- sandbox */

typedef struct hutch_sandbox hutch_sandbox;

typedef struct hutch_limits {
        uint64_t memory_bytes;   /* memory cgroup limit; swap is off for the sandbox */
        uint64_t pids;           /* pids cgroup limit */
        uint64_t cpu_millis;     /* CPU quota in thousandths of a CPU (2000 = 2 CPUs) */
        uint64_t disk_bytes;     /* writable layer size */
        uint64_t disk_inodes;    /* writable layer inode count; ns only (gvisor: must be 0, -EOPNOTSUPP) */
        uint64_t nofile;         /* RLIMIT_NOFILE for every process */
} hutch_limits;

/* Isolation backends. ns: namespaces, seccomp and cgroups around the host
 * kernel (a hardened container). gvisor: the same root, limits and
 * protocol, with the processes on runsc's user-space kernel, for
 * multi-tenant untrusted code. */
enum {
        HUTCH_BACKEND_NS = 0,
        HUTCH_BACKEND_GVISOR = 1,
        HUTCH_BACKENDS, /* how many */
};
/* "ns" or "gvisor" to HUTCH_BACKEND_*, -EINVAL otherwise; and back. */
int hutch_backend_from_name(const char *name);
const char *hutch_backend_name(int backend);
/* What a backend does otherwise than the namespace backend, for a caller
 * that chooses between two ways of doing a thing: a set of these bits
 * (0 for an unknown backend). */
enum {
        /* Its snapshots and pauses are checkpoints of the whole sandbox,
         * memory included (hutch_sandbox_checkpoint, _suspend); without,
         * a snapshot is the writable layer (hutch_sandbox_layer_export)
         * and a pause the cgroup freezer (hutch_sandbox_freeze). */
        HUTCH_BACKEND_CHECKPOINTS = 1 << 0,
        /* Its writable layer's files live in the sandbox's memory: a write
         * can fail with EDQUOT at the memory limit before the layer is full. */
        HUTCH_BACKEND_FILES_IN_MEMORY = 1 << 1,
        /* Its network stack is not the host kernel's: a port inside is
         * reached through hutch-init (a connector), not by a socket made in
         * the sandbox's network namespace. */
        HUTCH_BACKEND_OWN_NETSTACK = 1 << 2,
};
unsigned hutch_backend_caps(int backend);

/* Whether the gvisor backend can run here: runsc's path and version in
 * ret_info ("/usr/bin/runsc 0.0~20221219.0, platform ptrace"), -errno with
 * the reason otherwise. Starts nothing. */
int hutch_gvisor_probe(hutch_ctx *ctx, char *ret_info, size_t n, hutch_error *err);

/* A named volume (see "volumes" below) mounted into a sandbox. */
typedef struct hutch_volume_mount {
        const char *volume; /* its id (hutch_volume_id_valid) */
        const char *path;   /* absolute, clean (hutch_volume_path_check) */
} hutch_volume_mount;
#define HUTCH_VOLUME_ID_LEN 36  /* a UUID, lowercase: 8-4-4-4-12 */
#define HUTCH_VOLUMES_MAX 8     /* mounts per sandbox */
#define HUTCH_VOLUME_PATH_MAX 255

typedef struct hutch_sandbox_config {
        const char *template_name; /* default "host" */
        hutch_limits limits;       /* zero fields take the defaults below */
        bool no_new_privs;         /* set PR_SET_NO_NEW_PRIVS instead of allowing sudo */
        bool network;              /* reserved for the egress proxy; false = loopback only */
        const char *hostname;      /* default "hutch" */
        const char *id;            /* NULL: allocate a random id */
        /* Start the writable layer from a stream hutch_sandbox_layer_export()
         * wrote (a file), not empty: the files come back, owned by the same
         * ids inside the sandbox. Its size replaces limits.disk_bytes. ext4
         * layers only (-EOPNOTSUPP on tmpfs). gvisor: the stream's files are
         * a read-only layer between the template and the writable layer
         * (a built template's layer; limits.disk_bytes stays the writable
         * layer's size), and may come with checkpoint_from. */
        const char *layer_from;
        /* Or an image hutch_layer_import_fds() made from such a stream, with
         * the id range it gave (*ret_uid_base): taken over (renamed into the
         * storage; copied if it is on another file system), so that the
         * create does not copy the layer. */
        const char *layer_image;
        uint32_t layer_image_uid_base;
        int backend;               /* HUTCH_BACKEND_* */
        /* gvisor: restore a stream hutch_sandbox_checkpoint() wrote (a
         * file) instead of booting: its processes, their memory and its
         * files go on in the new sandbox. */
        const char *checkpoint_from;
        /* gvisor: the port the sandbox's 127.0.0.1 proxy address has (the
         * daemon's egress port); 0 = 3128. */
        uint16_t egress_port;
        /* Who made it, for `hutch ps` (e.g. "hutch run", "hutch serve
         * /var/lib/hutch"): printable, at most 127 bytes; NULL = unknown. */
        const char *owner;
        /* Volumes mounted read-write at their paths once the root is set
         * up, id-mapped into the sandbox's range (on-disk ids 0..65535 are
         * the sandbox's 0..65535). ns backend only (gvisor: -EOPNOTSUPP).
         * Never part of the writable layer, so never in a layer snapshot. */
        const hutch_volume_mount *volumes;
        size_t n_volumes;
        /* NVIDIA GPUs for the sandbox (hutch_gpu_spec_check's syntax: "N",
         * "all", "ID,ID..." or "device=ID[,ID...]"; NULL, "" or "0": none).
         * Each is reserved in the run dir for this sandbox alone unless the
         * context shares GPUs; -EBUSY when they are not free, -ENODEV when
         * the host has no such GPU. ns backend only (gvisor: -EOPNOTSUPP). */
        const char *gpus;
} hutch_sandbox_config;

#define HUTCH_DEFAULT_MEMORY (512ull << 20)
#define HUTCH_DEFAULT_PIDS 512
#define HUTCH_DEFAULT_CPU_MILLIS 2000
#define HUTCH_DEFAULT_DISK (1ull << 30)
#define HUTCH_DEFAULT_INODES 262144
#define HUTCH_DEFAULT_NOFILE 4096
/* The bounds hutch_sandbox_create() takes (-EINVAL outside them); the CLI
 * checks the same ones, so that a bad value is a usage error. */
#define HUTCH_MIN_MEMORY (4ull << 20)
#define HUTCH_MIN_DISK (1ull << 20)
#define HUTCH_MAX_DISK (1ull << 40)
#define HUTCH_MIN_INODES 64
#define HUTCH_MAX_INODES (1ull << 32)
#define HUTCH_MAX_PIDS 4194304
#define HUTCH_MAX_NOFILE 1048576
/* Image layers one template may stack (overlayfs takes 500; Docker 127). */
#define HUTCH_MAX_LAYERS 128

int hutch_sandbox_create(hutch_ctx *ctx, const hutch_sandbox_config *cfg, hutch_sandbox **ret,
                         hutch_error *err);
/* A fresh random sandbox id ([a-z0-9]{20}, unbiased), as create picks when
 * cfg->id is NULL: for callers that must know the id before the sandbox
 * exists (the daemon records it first). -errno from getrandom. */
int hutch_sandbox_id_new(char ret[HUTCH_ID_LEN + 1]);
/* Find a live sandbox by id (from its state in run_dir) and connect to its init. */
int hutch_sandbox_attach(hutch_ctx *ctx, const char *id, hutch_sandbox **ret, hutch_error *err);
/* Destroy a sandbox by id whether or not it is still alive (its init may
 * be gone after a crash): kills what is left and removes every trace. */
int hutch_sandbox_remove(hutch_ctx *ctx, const char *id, hutch_error *err);
/* Kill every process, remove mounts, cgroup, writable layer, uid range. */
int hutch_sandbox_destroy(hutch_sandbox *sb, hutch_error *err);
/* The first half of destroy, which never waits: SIGKILL init (thawing a
 * paused sandbox so that the kill lands) and close the control connection.
 * Returns init's pidfd (owned by sb), readable once every process of the
 * sandbox is gone; hutch_sandbox_destroy() then finishes without waiting. */
int hutch_sandbox_kill_begin(hutch_sandbox *sb, hutch_error *err);
hutch_sandbox *hutch_sandbox_unref(hutch_sandbox *sb);
hutch_sandbox *hutch_sandbox_ref(hutch_sandbox *sb);

const char *hutch_sandbox_id(const hutch_sandbox *sb);
const char *hutch_sandbox_template(const hutch_sandbox *sb);
/* The creator's owner string ("" when it gave none). */
const char *hutch_sandbox_owner(const hutch_sandbox *sb);
int hutch_sandbox_backend(const hutch_sandbox *sb); /* HUTCH_BACKEND_* */
pid_t hutch_sandbox_init_pid(const hutch_sandbox *sb); /* host pid of hutch-init */
uid_t hutch_sandbox_uid_base(const hutch_sandbox *sb);
const hutch_limits *hutch_sandbox_limits(const hutch_sandbox *sb);
/* The control socket to hutch-init; readable when an event or reply waits. */
int hutch_sandbox_fd(const hutch_sandbox *sb);

/* Tie the sandbox's life to this handle's connection: when it closes
 * (hutch_sandbox_unref, or the process holding it dies, even by SIGKILL),
 * hutch-init exits and the kernel kills every process of the sandbox. The
 * host-side leftovers are then removed by hutch_sandbox_remove()/gc. */
int hutch_sandbox_tie_lifetime(hutch_sandbox *sb, hutch_error *err);

/* Remove every sandbox whose init is no longer alive. Returns how many. */
int hutch_sandbox_gc(hutch_ctx *ctx, hutch_error *err);

/* Remove the versions of the data dir's `host` template that are not the
 * current one and that no sandbox of the run dir uses (its state file names
 * the version it was made from; a sandbox that is being created holds its
 * version locked). Never waits: returns 0 while another process builds the
 * template. Returns how many versions (and crash leftovers) it removed. */
int hutch_template_gc(hutch_ctx *ctx, hutch_error *err);

/* Freeze / thaw every process of the sandbox (cgroup freezer). While it is
 * frozen, calls that need an answer from its init fail at once with -EAGAIN
 * (a frozen init cannot answer: they would wait for their whole timeout). */
int hutch_sandbox_freeze(hutch_sandbox *sb, hutch_error *err);
int hutch_sandbox_thaw(hutch_sandbox *sb, hutch_error *err);
/* Frozen through this handle, or found frozen when it was attached. */
bool hutch_sandbox_is_frozen(const hutch_sandbox *sb);

typedef struct hutch_stats {
        uint64_t memory_current; /* bytes */
        uint64_t memory_peak;    /* bytes */
        uint64_t memory_limit;   /* bytes */
        uint64_t cpu_usage_ns;   /* total CPU time */
        uint64_t pids_current;
        uint64_t oom_kills;      /* processes killed by the memory limit */
        uint64_t disk_used;      /* bytes used in the writable layer */
        uint64_t disk_limit;
        uint32_t gpus;           /* GPUs allocated to the sandbox */
        /* GPU memory its processes hold now, from NVML (libnvidia-ml, loaded
         * at run time); gpu_memory_measured false where NVML is absent or
         * cannot say */
        bool gpu_memory_measured;
        uint64_t gpu_memory_used; /* bytes */
} hutch_stats;
int hutch_sandbox_stats(hutch_sandbox *sb, hutch_stats *ret, hutch_error *err);

/* The writable layer as a stream (the layer image's allocated extents, its
 * size and the sandbox's id range) to out_fd, for snapshots and forks. The
 * sandbox must be frozen (hutch_sandbox_freeze) so that nothing writes;
 * its file system is synced first (layers have no journal: the copy is
 * consistent because nothing writes and everything was written back).
 * Processes are not part of it. ext4 layers only (-EOPNOTSUPP). Returns
 * the bytes written to *ret_bytes. */
int hutch_sandbox_layer_export(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, hutch_error *err);

/* The same export in two halves, for a caller that must not block (the
 * daemon's loop): hutch_sandbox_layer_open() checks the sandbox and opens
 * what the export reads (its root, to sync it, and its layer image), at
 * once; hutch_layer_export_fds() then syncs and copies, as long as the
 * layer takes, using nothing but those descriptors and out_fd, so it may
 * run in a child process. The sandbox must stay frozen until it returns.
 * hutch_layer_source_close() accepts a zeroed or closed source. */
typedef struct hutch_layer_source {
        int root_fd;   /* /proc/<init>/root: syncfs writes the overlay's upper layer back */
        int image_fd;  /* the layer image, read-only */
        uid_t uid_base;
} hutch_layer_source;
int hutch_sandbox_layer_open(hutch_sandbox *sb, hutch_layer_source *ret, hutch_error *err);
int hutch_layer_export_fds(const hutch_layer_source *src, int out_fd, uint64_t *ret_bytes, hutch_error *err);
void hutch_layer_source_close(hutch_layer_source *src);
/* The other way: the stream read from in_fd written into image_fd (an
 * empty regular file) as the sparse layer image it describes, every extent
 * bounds-checked; the id range its files belong to in *ret_uid_base. Only
 * descriptors, for a child process: hutch_sandbox_config.layer_image then
 * takes the image over without copying it on the caller's loop. */
int hutch_layer_import_fds(int in_fd, int image_fd, uint32_t *ret_uid_base, hutch_error *err);

/* gvisor: a checkpoint of the running sandbox (runsc checkpoint
 * --leave-running: processes, memory and the in-memory writable layer) as
 * a stream to out_fd, for snapshots and forks; the sandbox goes on. A
 * paused sandbox is thawed for it and paused again. Returns the image's
 * bytes in *ret_bytes. -EOPNOTSUPP on the ns backend. */
int hutch_sandbox_checkpoint(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, hutch_error *err);
/* Whether the file at path is such a stream (for checkpoint_from), not a
 * layer stream (for layer_from): by its magic. */
bool hutch_stream_is_checkpoint(const char *path);

/* gvisor: checkpoint the sandbox as hutch_sandbox_checkpoint() does and
 * stop it there: its runtime, relay and memory are gone; its id, state,
 * token, cgroup and uid range stay, and it is "suspended" (attach finds it
 * so, gc leaves it alone) until hutch_sandbox_resume_from() restores it
 * from that stream. A failure after the runtime stopped restores it at
 * once. -EOPNOTSUPP on the ns backend. */
int hutch_sandbox_suspend(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, hutch_error *err);
/* Restore a suspended sandbox from the stream its suspend wrote (checked to
 * be its own: the token its init holds). */
int hutch_sandbox_resume_from(hutch_sandbox *sb, const char *stream_path, hutch_error *err);
bool hutch_sandbox_is_suspended(const hutch_sandbox *sb);
/* Remove the plain checkpoint files a crash in the middle of a checkpoint
 * or a resume_from left in the data dir. Only while none runs (a daemon's
 * start). Returns how many. */
int hutch_checkpoint_leftovers_remove(hutch_ctx *ctx);

/* The sandbox's way to the egress proxy at 127.0.0.1:<egress port>. ns:
 * nothing to do (the proxy listens inside the sandbox's netns itself, or
 * nothing does). gvisor: hutch-init's listener inside the sentry, which
 * relays to the proxy; closed until this opens it, so that with the network
 * off a connection is refused as on ns. */
int hutch_sandbox_set_network(hutch_sandbox *sb, bool on, hutch_error *err);

/* List live sandboxes (ids) found in run_dir. *ret_ids is a NULL-terminated
 * array; free with hutch_strv_free(). */
int hutch_sandbox_list(hutch_ctx *ctx, char ***ret_ids, hutch_error *err);
void hutch_strv_free(char **v);

/* ------------------------------------------------------------- processes */

enum {
        HUTCH_STDIN_NULL = 0, /* /dev/null */
        HUTCH_STDIN_PIPE = 1, /* a pipe whose write end is returned */
};

typedef struct hutch_spawn_config {
        const char *const *argv;  /* argv[0] is looked up in PATH if it has no '/' */
        const char *const *envp;  /* full environment; NULL = a minimal default */
        const char *cwd;          /* default: the user's home */
        uid_t uid;                /* inside the sandbox: 0 root, 1000 user */
        gid_t gid;
        int stdin_mode;           /* HUTCH_STDIN_* */
        bool pty;                 /* allocate a pseudo-terminal for stdin/stdout/stderr */
        uint16_t pty_rows, pty_cols;
        const char *tag;          /* optional name to find the process again */
        /* optional: the API request this spawn serves (1 to 64 characters of
         * [A-Za-z0-9._-]; anything else is not sent). hutch-init keeps it
         * with the process, and LIST_PROCS gives it back after a restart. */
        const char *request_id;
        /* hutch-init starts the process again whenever it ends, as a service
         * manager's Restart=always: after 0.2 s when it ran for 10 s or more,
         * else after twice the last wait, up to 10 s (the restarts' stdio is
         * /dev/null; the tag stays, the pid changes) */
        bool keep;
} hutch_spawn_config;

typedef struct hutch_process {
        pid_t pid;        /* pid inside the sandbox */
        int stdin_fd;     /* write end, or -1 */
        int stdout_fd;    /* read end, or -1 (pty: the master, read+write) */
        int stderr_fd;    /* read end, or -1 */
} hutch_process;

/* What execve takes: one argument or environment string (MAX_ARG_STRLEN
 * less its NUL) and argv and env together (ARG_MAX with an 8 MiB stack);
 * hutch_sandbox_spawn() answers -E2BIG past either. */
#define HUTCH_SPAWN_STRING_MAX (128 * 1024 - 1)
#define HUTCH_SPAWN_TOTAL_MAX (2 * 1024 * 1024)

/* Start a process. On exec failure returns -errno (e.g. -ENOENT for a
 * missing command) with a message. Descriptors in ret are owned by the caller. */
int hutch_sandbox_spawn(hutch_sandbox *sb, const hutch_spawn_config *cfg, hutch_process *ret,
                        hutch_error *err);
int hutch_sandbox_signal(hutch_sandbox *sb, pid_t pid, int sig, bool process_group,
                         hutch_error *err);
/* Close hutch-init's own copy of a process's stdin write end, so that the
 * process sees EOF once the caller closes its copy too. */
int hutch_sandbox_close_stdin(hutch_sandbox *sb, pid_t pid, hutch_error *err);
int hutch_sandbox_resize(hutch_sandbox *sb, pid_t pid, uint16_t rows, uint16_t cols,
                         hutch_error *err);

typedef struct hutch_exit {
        pid_t pid;
        int exit_code;  /* valid when signal == 0 */
        int signal;     /* terminating signal, 0 if it exited */
        bool core_dumped;
        /* user + system CPU time of the process and of the descendants it
         * waited for, in µs; -1 when hutch-init did not report it */
        int64_t cpu_us;
} hutch_exit;

/* Wait for the next exit of a process spawned (or attached) through this
 * handle. With timeout_ms < 0 it blocks; returns -ETIMEDOUT when the time
 * passed. Exits only: watch events queued ahead of the exit it returns are
 * discarded (an embedder with watches uses hutch_sandbox_next_event()). */
int hutch_sandbox_wait(hutch_sandbox *sb, int timeout_ms, hutch_exit *ret, hutch_error *err);

typedef struct hutch_proc_info {
        pid_t pid;
        char *tag;        /* or NULL */
        char **argv;      /* NULL-terminated */
        char **envp;      /* NULL-terminated (empty when init could not fit it in one frame) */
        char *cwd;        /* or NULL */
        bool pty;
        uid_t uid;        /* inside the sandbox */
        gid_t gid;
        char *request_id; /* the spawn's request id as hutch-init kept it, or NULL */
} hutch_proc_info;
/* Every process started through SPAWN that has not exited yet, in spawn order. */
int hutch_sandbox_list_procs(hutch_sandbox *sb, hutch_proc_info **ret, size_t *ret_n, hutch_error *err);
void hutch_proc_info_array_free(hutch_proc_info *v, size_t n);
/* Get descriptors of a running process again (after a daemon restart): by
 * pid (tag NULL) or by tag. -ESRCH when no such live process. ret as for
 * spawn; its exit is then also reported to this handle. */
int hutch_sandbox_attach_process(hutch_sandbox *sb, pid_t pid, const char *tag, hutch_process *ret,
                                 hutch_error *err);

/* ------------------------------------------------------------- events */

enum { HUTCH_EVENT_EXIT = 1, HUTCH_EVENT_WATCH = 2 };
enum {
        HUTCH_WATCH_CREATE = 1,
        HUTCH_WATCH_WRITE = 2,
        HUTCH_WATCH_REMOVE = 3,
        HUTCH_WATCH_RENAME = 4,
        HUTCH_WATCH_CHMOD = 5,
};

typedef struct hutch_event {
        int type;           /* HUTCH_EVENT_* */
        hutch_exit exit;    /* HUTCH_EVENT_EXIT */
        uint32_t watch_id;  /* HUTCH_EVENT_WATCH */
        int watch_kind;     /* HUTCH_WATCH_* */
        char *path;         /* HUTCH_EVENT_WATCH: full path inside the sandbox (heap, freed by hutch_event_clear) */
} hutch_event;

/* Never blocks: reads whatever init has already sent on hutch_sandbox_fd(),
 * and returns the next queued event. 1 = *ret filled (caller calls
 * hutch_event_clear), 0 = nothing now, <0 = the connection to init is lost
 * or init sent garbage (-ECONNRESET etc.): the sandbox is dead or broken.
 * Events that arrive while a synchronous call (spawn, fs_*) waits for its
 * reply are queued and returned here too, so after such a call the queue
 * may hold events although the fd is not readable: call this until it
 * returns 0 whenever the fd is readable and after every synchronous call.
 * A hostile init could send endlessly; one call reads a bounded number of
 * frames and may return 0 while the fd is still readable (use the fd
 * level-triggered). Exits are never dropped; watch events beyond 4096
 * queued are (hutch_sandbox_watch_events_dropped() counts them). */
int hutch_sandbox_next_event(hutch_sandbox *sb, hutch_event *ret, hutch_error *err);
void hutch_event_clear(hutch_event *ev);
/* Watch events dropped so far because the queue was full. */
uint64_t hutch_sandbox_watch_events_dropped(const hutch_sandbox *sb);

/* --------------------------------------------------------- file operations */
/* All paths are interpreted by hutch-init inside the sandbox's root. */

enum { HUTCH_FILE_UNKNOWN = 0, HUTCH_FILE_REGULAR, HUTCH_FILE_DIRECTORY, HUTCH_FILE_SYMLINK, HUTCH_FILE_OTHER };

typedef struct hutch_file_info {
        char *name;            /* base name */
        char *path;            /* absolute path inside the sandbox */
        int type;              /* HUTCH_FILE_* of the entry itself (lstat) */
        int target_type;       /* for symlinks: type of the target, else same as type */
        char *symlink_target;  /* for symlinks, else NULL */
        uint64_t size;
        uint32_t mode;         /* st_mode */
        uint32_t uid, gid;
        int64_t mtime_ns;
        char *owner, *group;   /* names from the sandbox's /etc, or the number */
        /* The file's user.e2b.<key> extended attributes (regular files and
         * directories only), keys without the prefix. At most
         * HUTCH_METADATA_MAX entries; entries that break the bounds below
         * (set from inside the sandbox) are left out. */
        size_t n_metadata;
        char **metadata_keys;
        char **metadata_values;
} hutch_file_info;

#define HUTCH_METADATA_MAX 64
#define HUTCH_METADATA_KEY_MAX 246     /* XATTR_NAME_MAX 255 less "user.e2b." */
#define HUTCH_METADATA_VALUE_MAX 4096
#define HUTCH_METADATA_TOTAL_MAX 16384 /* keys + values of one file: one protocol frame */

void hutch_file_info_clear(hutch_file_info *fi);
void hutch_file_info_array_free(hutch_file_info *v, size_t n);

typedef struct hutch_fs_user {
        uid_t uid;
        gid_t gid;
} hutch_fs_user;

int hutch_fs_stat(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, hutch_file_info *ret,
                  hutch_error *err);
int hutch_fs_list(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, unsigned depth,
                  hutch_file_info **ret, size_t *ret_n, hutch_error *err);
int hutch_fs_mkdir(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, bool parents,
                   hutch_error *err); /* returns 1 when created, 0 when it already existed */
int hutch_fs_move(hutch_sandbox *sb, const hutch_fs_user *u, const char *from, const char *to,
                  hutch_error *err);
int hutch_fs_remove(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, hutch_error *err);
/* Open a regular file for reading; *ret_fd is a read-only fd checked to be a
 * regular file or pipe. */
int hutch_fs_open_read(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, int *ret_fd,
                       hutch_file_info *ret_info, hutch_error *err);

/* Write a whole file: begin returns a pipe write end (*ret_fd, non-blocking,
 * owned by the caller) to stream the content into. Close it, then commit:
 * hutch-init fsyncs and renames the temporary file into place (parents
 * created, owned by u) and commit returns only when the file is complete.
 * When the writable layer is full, init closes the pipe (the writer gets
 * EPIPE) and commit fails with -ENOSPC (or -EDQUOT). Abort (or losing the
 * connection) leaves nothing. */
typedef struct hutch_fs_write hutch_fs_write;
int hutch_fs_write_begin(hutch_sandbox *sb, const hutch_fs_user *u, const char *path,
                         hutch_fs_write **ret, int *ret_fd, hutch_error *err);
int hutch_fs_write_commit(hutch_fs_write *w, uint64_t expected_bytes, hutch_file_info *ret_info,
                          hutch_error *err);
void hutch_fs_write_abort(hutch_fs_write *w);
/* Between begin and commit: at commit the file's user.e2b.* extended
 * attributes become exactly these (keys without the prefix: printable
 * ASCII without '/', 1..HUTCH_METADATA_KEY_MAX bytes; values up to
 * HUTCH_METADATA_VALUE_MAX bytes; at most HUTCH_METADATA_MAX keys and
 * HUTCH_METADATA_TOTAL_MAX bytes in all). A later call replaces an earlier
 * one. Without it the new file has no metadata (a write makes a new inode).
 * Commit then fails with -EOPNOTSUPP where the filesystem has no user
 * xattrs, and with -E2BIG where they do not fit its xattr space. */
int hutch_fs_write_set_metadata(hutch_fs_write *w, const char *const *keys, const char *const *values, size_t n,
                                hutch_error *err);
/* Watch a directory (and with recursive, its whole subtree, including
 * directories created later) for changes; events come as HUTCH_EVENT_WATCH
 * from hutch_sandbox_next_event(). -ENOENT missing, -ENOTDIR not a
 * directory. A watch lives as long as this handle's connection. */
int hutch_fs_watch_add(hutch_sandbox *sb, const hutch_fs_user *u, const char *path, bool recursive,
                       uint32_t *ret_id, hutch_error *err);
/* -ENOENT for an id this handle does not hold. Events of the watch already
 * queued may still be returned. */
int hutch_fs_watch_remove(hutch_sandbox *sb, uint32_t id, hutch_error *err);
/* Convenience over begin/commit. Writing into the pipe that init closed
 * after a failure (a full layer) raises SIGPIPE: callers ignore it, and
 * get the failure (-ENOSPC, -EDQUOT) from the commit. */
int hutch_fs_write_buffer(hutch_sandbox *sb, const hutch_fs_user *u, const char *path,
                          const void *data, size_t len, hutch_error *err);

/* ------------------------------------------------------------------ GPUs
 *
 * NVIDIA GPUs are the device nodes <dev dir>/nvidiaN; a GPU's id is its N
 * (the node's minor number, nvidia-smi's "Minor Number"). A sandbox given
 * GPUs gets those nodes and the driver's control nodes in its /dev, only
 * those in its device cgroup (v1), and the driver's user-space libraries
 * and programs read-only under HUTCH_GPU_DIR (docs/gpu.md). */

#define HUTCH_GPUS_MAX 64
/* Inside the sandbox: lib/ and bin/, appended to LD_LIBRARY_PATH and PATH
 * of every process started with an environment. */
#define HUTCH_GPU_DIR "/run/hutch/gpu"

/* 0: the spec asks for no GPU, 1: it asks for some, -EINVAL (with the
 * reason) when it is not "N", "all", "ID,ID..." or "device=ID[,ID...]". */
int hutch_gpu_spec_check(const char *spec, hutch_error *err);
/* Whether a create asking for spec would get its GPUs now (nothing is
 * reserved): 0, -EBUSY held by other sandboxes, -ENODEV no such GPU (or
 * none, or no driver), -EACCES a node the sandbox's users cannot open. */
int hutch_gpu_check(hutch_ctx *ctx, const char *spec, hutch_error *err);
/* How many GPUs (nodes nvidiaN) the host has; 0 when none. */
int hutch_gpu_count(hutch_ctx *ctx);
/* For `hutch doctor`: the GPUs, the driver's files found and whether NVML
 * loads, in ret_info. Returns the GPU count, -ENODEV when there is none. */
int hutch_gpu_probe(hutch_ctx *ctx, char *ret_info, size_t n, hutch_error *err);
/* The ids of the sandbox's GPUs (at most HUTCH_GPUS_MAX), ascending; their number. */
size_t hutch_sandbox_gpus(const hutch_sandbox *sb, uint32_t ret_ids[HUTCH_GPUS_MAX]);

/* --------------------------------------------------------------- volumes
 *
 * A volume is one ext4 image of a fixed size, DATA_DIR/volumes/<id>.img
 * (sparse: it holds what was written), outliving every sandbox. It is
 * attached to one loop device while anything uses it (found again by the
 * image's inode, so every user shares one file system and the kernel counts
 * the users), and mounted into each sandbox id-mapped into its range. */

bool hutch_volume_id_valid(const char *id);
/* Why path cannot be a mount point in a sandbox (NULL: it can): not
 * absolute, not clean, too long, or over a path hutch sets up itself. */
const char *hutch_volume_path_check(const char *path);
/* Format a new volume of `bytes` (>= HUTCH_VOLUME_MIN_BYTES) with its root
 * owned by uid/gid 1000 ("user"). -EEXIST when the id has an image. */
#define HUTCH_VOLUME_MIN_BYTES (8ull << 20)
int hutch_volume_create(hutch_ctx *ctx, const char *id, uint64_t bytes, hutch_error *err);
/* Remove the image. Sandboxes that mount it keep its file system until the
 * last of them is gone; nothing can mount it again. -ENOENT if none. */
int hutch_volume_remove(hutch_ctx *ctx, const char *id, hutch_error *err);
/* A detached mount of the volume's file system (in no namespace; the fd
 * is the caller's): while it is open the file system stays mounted, so
 * that the next user does not pay for mounting it (journal recovery
 * included) again. */
int hutch_volume_hold(hutch_ctx *ctx, const char *id, int *ret_fd, hutch_error *err);
/* Size and bytes in use on the host (the image's allocated blocks). */
int hutch_volume_usage(hutch_ctx *ctx, const char *id, uint64_t *ret_size, uint64_t *ret_used, hutch_error *err);

/* The content of a volume, reached from the host without the host ever
 * resolving a path in it: each session is a helper process in a user
 * namespace of its own (an unprivileged host id range), chrooted into the
 * volume's id-mapped mount, resolving every path with RESOLVE_IN_ROOT. */
typedef struct hutch_volfs hutch_volfs;
enum { HUTCH_VOLFS_FILE = 1, HUTCH_VOLFS_DIR = 2, HUTCH_VOLFS_SYMLINK = 3, HUTCH_VOLFS_OTHER = 4 };
#define HUTCH_VOLFS_PATH_MAX 4096
typedef struct hutch_volfs_entry {
        int type; /* HUTCH_VOLFS_* */
        uint32_t mode, uid, gid; /* permission bits; on-disk ids */
        uint64_t size;
        int64_t atime_ns, mtime_ns, ctime_ns;
        char path[HUTCH_VOLFS_PATH_MAX];   /* absolute inside the volume */
        char target[HUTCH_VOLFS_PATH_MAX]; /* symlinks */
} hutch_volfs_entry;
/* Paths: absolute, '/'-separated, no "." or ".." components (the caller
 * cleans them), at most HUTCH_VOLFS_PATH_MAX - 1 bytes. ids: -1 = the
 * default (1000), mode: -1 = the default (0644 files, 0755 directories). */
int hutch_volfs_open(hutch_ctx *ctx, const char *id, hutch_volfs **ret, hutch_error *err);
hutch_volfs *hutch_volfs_close(hutch_volfs *v);
int hutch_volfs_stat(hutch_volfs *v, const char *path, hutch_volfs_entry *ret, hutch_error *err);
/* Every entry under path to depth levels (at most HUTCH_VOLFS_LIST_MAX),
 * handed to fn as it comes, never collected here: fn < 0 stops the list. */
#define HUTCH_VOLFS_LIST_MAX 100000
typedef int (*hutch_volfs_list_fn)(const hutch_volfs_entry *e, void *userdata);
int hutch_volfs_list(hutch_volfs *v, const char *path, unsigned depth, hutch_volfs_list_fn fn, void *userdata,
                     hutch_error *err);
int hutch_volfs_mkdir(hutch_volfs *v, const char *path, int64_t uid, int64_t gid, int64_t mode, bool parents,
                      hutch_volfs_entry *ret, hutch_error *err);
int hutch_volfs_remove(hutch_volfs *v, const char *path, hutch_error *err);
int hutch_volfs_chattr(hutch_volfs *v, const char *path, int64_t uid, int64_t gid, int64_t mode,
                       hutch_volfs_entry *ret, hutch_error *err);
/* A regular file opened for reading (the fd is the caller's). */
int hutch_volfs_open_read(hutch_volfs *v, const char *path, int *ret_fd, hutch_volfs_entry *ret, hutch_error *err);
/* A new temporary file next to path (missing parents created) for the
 * caller to write; commit renames it over path with the owner and mode
 * given, abort (or close) removes it. One write per session at a time. */
int hutch_volfs_write_begin(hutch_volfs *v, const char *path, int *ret_fd, hutch_error *err);
int hutch_volfs_write_commit(hutch_volfs *v, int64_t uid, int64_t gid, int64_t mode, hutch_volfs_entry *ret,
                             hutch_error *err);
void hutch_volfs_write_abort(hutch_volfs *v);

#ifdef __cplusplus
}
#endif
