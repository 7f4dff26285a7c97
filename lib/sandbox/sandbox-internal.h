/* SPDX-License-Identifier: Apache-2.0 */
/* What the engine's files share; not part of the public API. */
#pragma once

#include <linux/filter.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "hutch/hutch.h"
#include "sandbox/cgroup.h"
#include "sandbox/initproto.h"
#include "util/syscalls.h"

#define HUTCH_IDMAP_SIZE 65536u
#define HUTCH_TOKEN_LEN 32 /* hex chars */

struct hutch_ctx {
        char *run_dir;
        char *data_dir;
        char *cgroup_root;
        uint32_t uid_base;
        uint32_t uid_slots;
        cgroup_version cg_version;
        char *cg_mount;
        char *storage_kind; /* "auto" until storage_init(), then "ext4" or "tmpfs" */
        char *storage_mnt;  /* data_dir/storage, set by storage_init() */
        int init_memfd;     /* sealed memfd holding hutch-init, created lazily */
        char *runsc;        /* configured runsc path, "" to search */
        char *gvisor_platform;
        char *gpu_dev_dir, *gpu_driver_root, *gpu_proc_dir; /* gpu.c */
        char *trash_dir;    /* NULL, or where storage_remove moves layer images */
        bool gpu_share;
        struct gpu_nvml *nvml; /* gpu.c: libnvidia-ml, loaded on first use */
};

/* A queued unsolicited event from init. */
typedef struct initconn_event {
        struct initconn_event *next;
        uint16_t type;     /* INITPROTO_EV_* */
        hutch_exit exit;   /* EV_EXIT */
        uint32_t watch_id; /* EV_WATCH */
        int watch_kind;
        char *path;
} initconn_event;

struct hutch_sandbox {
        unsigned n_ref;
        hutch_ctx *ctx;
        char id[HUTCH_ID_LEN + 1];
        char template_name[64];
        char owner[128];   /* hutch_sandbox_config.owner, for hutch ps */
        char *template_root; /* the template version's rootfs it was made from (state: template_root=) */
        char token[HUTCH_TOKEN_LEN + 1];
        char *dir;         /* run_dir/sandboxes/<id> */
        int busy_fd;       /* the dir, flocked while a transition is under way (sandbox_busy_*) */
        pid_t init_pid;    /* host pid */
        uint64_t init_starttime; /* /proc/<pid>/stat field 22, to detect pid reuse */
        int init_pidfd;
        bool is_parent;    /* we cloned init and must reap it */
        uint32_t uid_slot;
        uid_t uid_base;
        hutch_limits limits;
        bool no_new_privs;
        int64_t created_ns;   /* CLOCK_REALTIME */
        hutch_cgroup *cg;
        cgroup_version cg_version; /* the backend the sandbox was made with */
        char cg_mount[256];
        int conn;          /* SOCK_SEQPACKET to hutch-init */
        uint32_t next_id;
        uint8_t *rxbuf;    /* INITPROTO_MAX_FRAME */
        initconn_event *events_head, *events_tail;
        size_t n_exit_events, n_watch_events; /* queued */
        uint64_t watch_events_dropped;
        initproto_writer *tx;
        bool destroyed;
        int backend;       /* HUTCH_BACKEND_*; gvisor: init_pid is the relay's */
        const struct hutch_backend_ops *ops; /* backend's: never NULL once created or read */
        uint16_t egress_port; /* gvisor: where hutch-init listens for the proxy */
        bool suspended;    /* gvisor: checkpointed to a stream and stopped (init_pid 0) */
        uint32_t gpu_ids[HUTCH_GPUS_MAX]; /* gpu.c: reserved in run_dir/gpus, ascending */
        size_t n_gpus;
        bool frozen;       /* its cgroup is frozen (hutch_sandbox_freeze, or found so at attach):
                              init cannot answer, so no request is sent to it (initconn_call) */
        /* gvisor: each volume's loop device, held from the first launch
         * this process made to the sandbox's end, so that a relaunch (the
         * restore after a checkpoint, a resume) finds a volume deleted
         * meanwhile as the ns backend's mounts keep it (-1: not held) */
        int vol_loop[HUTCH_VOLUMES_MAX];
        bool gpus_unasked; /* created by this handle without GPUs: none to release */
};

/* The gvisor backend's share of the sandbox's cgroup limits: runsc's own
 * threads and memory come on top of what the sandbox's processes are given.
 * Inside, the sandbox's pids limit is RLIMIT_NPROC, which the sentry
 * enforces; on the host each application process costs a ptrace stub and
 * sentry threads, measured here at about 22 host pids per process, so the
 * cgroup allows GVISOR_PIDS_PER_PROC per allowed process plus the idle
 * runtime (about 60).
 * Memory: hutch-init enforces the sandbox's limit from inside (it kills the
 * largest process once the sentry's count passes it, init/memwatch.c); the
 * cgroup is the backstop and allows the runtime (sentry, gofer, relay:
 * about 60 MiB RSS idle) plus headroom for an allocation that outruns one
 * check, half the limit: memory + memory/2 + GVISOR_MEMORY_OVERHEAD. */
#define GVISOR_MEMORY_OVERHEAD (128ull << 20)
#define GVISOR_PIDS_PER_PROC 32
#define GVISOR_PIDS_OVERHEAD 512
#define GVISOR_READY_TIMEOUT_MS 30000

/* gvisor.c */
struct hutch_template;
int gvisor_runsc_path(const hutch_ctx *ctx, char *buf, size_t n);
int gvisor_scratch_path(const hutch_ctx *ctx, const char *id, char *buf, size_t n);
/* Processes hutch-init killed inside for going over the memory limit. */
uint64_t gvisor_oom_kills(hutch_sandbox *sb);
uint64_t gvisor_disk_used(hutch_sandbox *sb);
/* layer_from: a built template's layer (a layer stream), read-only under
 * the writable layer; vols: the volumes to mount (recorded in the state dir
 * first, volume_state_write), or NULL with n_vols stand-ins (recorded as
 * GVISOR_STANDINS_FILE); image_dir: a checkpoint to restore. */
int gvisor_start(hutch_sandbox *sb, const struct hutch_template *tpl, const char *layer_from,
                 const hutch_volume_mount *vols, size_t n_vols, const char *hostname,
                 uint16_t egress_port, const char *image_dir, int timeout_ms, hutch_error *err);
/* ret_vol_slots: the volume mounts the checkpointed sandbox had (NULL: not wanted). */
int gvisor_unpack(const char *stream, const char *dir, char ret_token[HUTCH_TOKEN_LEN + 1],
                  unsigned *ret_vol_slots, hutch_error *err);
int gvisor_kill_runtime(hutch_sandbox *sb);
/* gvisor-root.c: runsc's root for an image or built template, stacked by
 * overlayfs on the host in the relay's own mount namespace. */
typedef struct gvisor_root {
        bool stacked;    /* false: runsc serves the template's rootfs itself */
        int layer_fd;    /* the build layer, read-only and detached, or -1 */
        const char *dir; /* the sandbox dir, the binds' and the overlay's home */
        size_t n_binds;
        char **src;     /* host dirs: the template's top layer, then its image layers, top first */
        char (*dst)[8]; /* their mount points: "lower", "l0".. */
        char *opts;     /* the overlay's mount options */
        size_t n_vols;
        int vol_fd[HUTCH_VOLUMES_MAX];      /* each volume's file system, detached */
        char vol_dst[HUTCH_VOLUMES_MAX][8]; /* where they go in the sandbox dir: "vol/0".. */
        char vol_path[HUTCH_VOLUMES_MAX][HUTCH_VOLUME_PATH_MAX + 1]; /* inside ("": a stand-in) */
} gvisor_root;
/* At create: the root's pieces in the sandbox dir (mount points, the build
 * layer's image from layer_from, the list of layers, the volumes' mount
 * points). 1: stacked (runsc's root is <dir>/root), 0: the host template
 * as it is. */
int gvisor_root_prepare(hutch_sandbox *sb, const struct hutch_template *tpl, const char *layer_from,
                        const hutch_volume_mount *vols, size_t n_vols, hutch_error *err);
/* Volume i: attached at GVISOR_VOL_DIR/<i> of the sandbox dir in the
 * relay's namespace, bound by runsc at GVISOR_VOL_MOUNT_DIR/<i> of its
 * root, bound by hutch-init at its path (init/layer.c). */
#define GVISOR_VOL_DIR "vol"
#define GVISOR_VOL_MOUNT_DIR INITPROTO_GVISOR_VOLUMES
/* A copy restored from a checkpoint of a sandbox that mounted volumes has,
 * in their place, as many stand-ins (read-only empty directories): runsc
 * restores only into the mounts a checkpoint was taken with. Their count
 * is in this state file. */
#define GVISOR_STANDINS_FILE "gvstandins"
int gvisor_standins(const hutch_sandbox *sb);
/* Take vol_loop for each volume the state dir records (a sandbox this
 * process adopts); close what it holds. */
void gvisor_volumes_hold(hutch_sandbox *sb);
void gvisor_volumes_release(hutch_sandbox *sb);
/* The volume mounts of runsc's spec: volumes or stand-ins. */
size_t gvisor_volume_slots(const hutch_sandbox *sb);
/* At every launch, in the engine: what the relay's child mounts. */
int gvisor_root_parent(hutch_sandbox *sb, gvisor_root *ret, hutch_error *err);
/* In the relay's child, before runsc starts: system calls only. */
int gvisor_root_child(const gvisor_root *g, const char **ret_step);
void gvisor_root_done(gvisor_root *g);
/* After a (re)launch, the relay's start time and the state file */
int gvisor_after_launch(hutch_sandbox *sb, hutch_error *err);
/* The runtime stopped at its checkpoint: no init; state says suspended. */
int gvisor_after_suspend(hutch_sandbox *sb, hutch_error *err);
int sandbox_init_memfd(hutch_ctx *ctx, hutch_error *err);

/* uidrange.c: one 65536-id host range per live sandbox, never host uid 0. */
int uidrange_alloc(hutch_ctx *ctx, const char *id, uint32_t *ret_slot, hutch_error *err);
int uidrange_release(hutch_ctx *ctx, uint32_t slot, const char *id);
uid_t uidrange_base(const hutch_ctx *ctx, uint32_t slot);
/* Pure helper for tests: first free slot in a bitmap of n slots, or -ENOSPC. */
int uidrange_pick(const uint8_t *used, uint32_t n, uint32_t start);

/* storage.c: the writable layer with a hard size and inode limit. */
int storage_init(hutch_ctx *ctx, hutch_error *err);
/* ext4: a detached mount (fd in *ret_layer_fd) holding upper/ and work/
 * owned by `owner`; tmpfs: *ret_layer_fd = -1 and the child mounts one. */
/* The layer image of sandbox id, opened read-only (-EOPNOTSUPP without ext4
 * layers); and that image as a layer stream to out_fd (descriptors only). */
int storage_open_image(hutch_ctx *ctx, const char *id, int *ret_fd, hutch_error *err);
int storage_export_fd(int image_fd, uid_t uid_base, int out_fd, uint64_t *ret_bytes, hutch_error *err);
/* layer_image (with its ids' base): an image made by hutch_layer_import_fds,
 * taken over instead of importing layer_from. */
int storage_prepare(hutch_ctx *ctx, const char *id, uid_t owner, const hutch_limits *limits, const char *layer_from,
                    const char *layer_image, uint32_t layer_image_base,
                    int *ret_layer_fd, uint64_t *ret_disk_bytes,
                    hutch_error *err);
int storage_remove(hutch_ctx *ctx, const char *id, hutch_error *err);
/* The sandbox's layer image (storage_prepare), read-only and detached. */
int storage_layer_mount_ro(hutch_ctx *ctx, const char *id, int *ret_mnt, hutch_error *err);
/* Bytes the writable layer occupies on the host (ext4 image blocks). */
int storage_usage(hutch_ctx *ctx, const char *id, uint64_t *ret_bytes);
/* Remove layer images that no live sandbox owns. */
int storage_prune(hutch_ctx *ctx, char *const *keep, hutch_error *err);
/* Shared with volume.c: run a tool (stdout/stderr to /dev/null), whether a
 * tool is installed, attach an image file to a free loop device
 * (LO_FLAGS_AUTOCLEAR; returns its number, its fd in *ret_loop_fd). */
int run_tool(const char *const argv[]);
bool have_tool(const char *name);
int loop_attach(int img_fd, int *ret_loop_fd);

/* volume.c: named volumes, one ext4 image each in data_dir/volumes. A
 * detached mount of the volume's one file system (one loop device per
 * image, found again by the image's inode), id-mapped into userns_fd. */
int volume_mount_idmapped(hutch_ctx *ctx, const char *id, int userns_fd, int *ret_fd, hutch_error *err);
/* hutch_volume_hold, and the volume's loop device, opened: while that
 * stays open the device keeps its image (LO_FLAGS_AUTOCLEAR waits for the
 * last opener), deleted or not, with no mount of it left (a gvisor
 * sandbox's runtime between a checkpoint and its restore). */
int volume_hold_loop(hutch_ctx *ctx, const char *id, int *ret_fd, int *ret_loop_fd, hutch_error *err);
/* A detached mount of the file system on a loop device held so. */
int volume_mount_loop(const char *id, int loop_fd, int *ret_fd, hutch_error *err);
/* Record the sandbox's mounts in its directory (file "volumes"). */
int volume_state_write(const char *sandbox_dir, const hutch_volume_mount *v, size_t n, hutch_error *err);

/* gpu.c: NVIDIA GPUs (docs/gpu.md). */
#define GPU_CTL_MAX 4     /* nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset */
#define GPU_FILES_MAX 192 /* the driver's libraries and programs */
#define GPU_NAME_MAX 80

/* A detached mount (a bind of one host file or directory) the clone child
 * attaches at name, relative to where its kind goes. */
typedef struct gpu_mount {
        int fd;
        char name[GPU_NAME_MAX];
} gpu_mount;

/* What the clone child sets up for a sandbox with GPUs, made by the parent
 * before the clone: the child inherits the descriptors (no CLONE_FILES)
 * and reads the rest from the shared memory, never allocating. */
typedef struct gpu_child {
        gpu_mount nodes[HUTCH_GPUS_MAX + GPU_CTL_MAX]; /* /dev/<name> */
        size_t n_nodes;
        gpu_mount files[GPU_FILES_MAX]; /* HUTCH_GPU_DIR/<name>: "lib/..." or "bin/..." */
        size_t n_files;
        struct {
                char name[GPU_NAME_MAX], target[GPU_NAME_MAX]; /* "lib/libcuda.so.1" -> "libcuda.so.550.54" */
        } links[GPU_FILES_MAX];
        size_t n_links;
        /* /proc/driver/nvidia: params (ModifyDeviceFiles off: nothing may
         * try to make device nodes) and version as files, the allocated
         * GPUs' gpus/<PCI address> directories bound read-only */
        bool proc;
        char params[4096], version[1024];
        gpu_mount proc_gpus[HUTCH_GPUS_MAX];
        size_t n_proc_gpus;
} gpu_child;

/* Reserve the GPUs spec asks for to sandbox id (its run-dir directory
 * must exist: a reservation whose directory is gone is stale), under the
 * run dir's lock; their ids in ret_ids, ascending. */
int gpu_alloc(hutch_ctx *ctx, const char *id, const char *spec, uint32_t ret_ids[HUTCH_GPUS_MAX], size_t *ret_n,
              hutch_error *err);
/* Drop every reservation of sandbox id (none: nothing to do). */
void gpu_release(hutch_ctx *ctx, const char *id);
/* The device cgroup rules ("c MAJ:MIN rw") and the child's mounts for
 * the GPUs ids. Free with gpu_child_free (closes what the child did not). */
int gpu_child_prepare(hutch_ctx *ctx, const uint32_t *ids, size_t n, gpu_child **ret, char (**ret_rules)[32],
                      size_t *ret_n_rules, hutch_error *err);
gpu_child *gpu_child_free(gpu_child *g);
/* The GPU memory the sandbox's processes hold (NVML); -ENODEV when it
 * cannot be measured. */
int gpu_memory_used(hutch_sandbox *sb, uint64_t *ret);
void gpu_nvml_free(hutch_ctx *ctx);
/* The environment of a process of a sandbox with GPUs: envp with
 * HUTCH_GPU_DIR's lib/ and bin/ appended to LD_LIBRARY_PATH and PATH
 * (added when absent). NULL on ENOMEM; free with free() of each and of the array. */
char **gpu_env(const char *const *envp);

/* child.c: everything between clone3 and exec of hutch-init. */
typedef struct child_config {
        const char *sandbox_dir;    /* run_dir/sandboxes/<id> */
        uint64_t disk_bytes, disk_inodes, nofile;
        const char *hostname;
        bool no_new_privs;
        int init_conn;              /* child end of the bootstrap socketpair */
        int parent_conn;            /* the parent's end, which the child closes at once */
        int sync_fd;                /* write end of the error pipe */
        int init_memfd;
        const struct sock_fprog *seccomp;
        uid_t uid_base;
        /* cgroup.procs files to write "0" into first (v1: the child joins
         * its cgroup itself), then a fresh cgroup namespace rooted there. */
        int cgroup_procs[8];
        size_t n_cgroup_procs;
        const gpu_child *gpu; /* NULL: no GPU */
} child_config;

int child_main(void *arg);

/* Every process of a sandbox runs with this oom_score_adj: the host's OOM
 * killer takes a tenant's process before the host's own, and a daemon run
 * with a negative one (systemd's OOMScoreAdjust=-1000 in deploy/) never
 * hands it down, which would leave a sandbox that no OOM kill, its own
 * memory cgroup's included, can end. */
#define SANDBOX_OOM_SCORE_ADJ 500

/* Write SANDBOX_OOM_SCORE_ADJ for pid (0: the caller), before it has
 * children. Async-signal-safe for pid 0 (a fork child's call). 0, or -errno when
 * it failed and the process is left with a negative value (protected from
 * the OOM killer); a failure that leaves it at 0 or above is ignored. */
int sandbox_oom_adjust(pid_t pid);

/* The error a failing child sends up the sync pipe. */
typedef struct child_error {
        int code; /* negative errno */
        char msg[256];
} child_error;

/* clone3 with a fresh stack, running fn(arg) in the child (x86_64/aarch64). */
pid_t clone3_with_fn(struct clone_args *args, int (*fn)(void *), void *arg);

/* ------------------------------------------------------------- backends */

/* What a create hands its backend's create op. The engine has made the
 * state dir (locked), the uid range, the GPUs' reservation and the cgroup;
 * the op starts init in them. stack and gpu are what a clone child may
 * still read after a failure: the engine frees them once the teardown has
 * seen the child gone. */
typedef struct sandbox_create_args {
        const hutch_sandbox_config *cfg;
        const struct hutch_template *tpl;
        const char *hostname;
        int dir_fd;     /* the sandbox dir, open */
        gpu_child *gpu; /* the GPU mounts (NULL: no GPU) */
        void *stack;    /* what a clone child runs on (stack, config), or MAP_FAILED */
        size_t stack_size;
} sandbox_create_args;

/* A backend: how a sandbox's processes are isolated (docs/design.md
 * §3.6). One const table per backend file; the engine (sandbox.c)
 * calls through it and never tests which backend it holds. A NULL op is
 * what the comment says. */
typedef struct hutch_backend_ops {
        const char *name; /* the API's and the state file's */
        unsigned caps;    /* HUTCH_BACKEND_CHECKPOINTS, ... */
        /* Refuse a config this backend cannot honour, before anything is
         * made (NULL: every config). */
        int (*check)(const hutch_sandbox_config *cfg, hutch_error *err);
        /* The sandbox's cgroup limits from its own (NULL: the same). */
        void (*cgroup_limits)(hutch_limits *l);
        /* Start init, wait until it answers, write the state file. */
        int (*create)(hutch_sandbox *sb, sandbox_create_args *a, hutch_error *err);
        /* This process attached to a sandbox that runs or is suspended:
         * take what the backend holds per process (NULL: nothing). */
        void (*adopt)(hutch_sandbox *sb);
        /* Close what this handle holds for the sandbox (at teardown and at
         * the handle's end; NULL: nothing). */
        void (*release)(hutch_sandbox *sb);
        /* Make init exit by itself (it has a runtime to stop first), not
         * waiting (NULL: init's SIGKILL ends every process of the sandbox). */
        int (*stop)(hutch_sandbox *sb);
        /* At teardown, once nothing runs: remove what the sandbox left
         * outside its dir, cgroup and layer image (NULL: nothing). */
        int (*remove)(hutch_sandbox *sb, hutch_error *err);
        /* Its share of hutch_sandbox_stats: the disk used, its own counts. */
        void (*usage)(hutch_sandbox *sb, hutch_stats *s);
        /* hutch_sandbox_layer_open: the writable layer, for a copy. */
        int (*layer_open)(hutch_sandbox *sb, hutch_layer_source *ret, hutch_error *err);
        /* Under the busy lock: a checkpoint of the whole sandbox to out_fd,
         * then run on (a snapshot) or stay stopped (suspend); and a restore
         * of a suspended sandbox (NULL, both: no checkpoints). */
        int (*checkpoint)(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, bool suspend,
                          hutch_error *err);
        int (*resume)(hutch_sandbox *sb, const char *stream_path, hutch_error *err);
        /* Let the sandbox's network on or off inside (NULL: the egress
         * proxy's policy is all there is to change). */
        int (*set_network)(hutch_sandbox *sb, bool on, hutch_error *err);
} hutch_backend_ops;

extern const hutch_backend_ops backend_ns;     /* backend-ns.c */
extern const hutch_backend_ops backend_gvisor; /* gvisor.c */
/* HUTCH_BACKEND_* to its table, NULL when there is none. */
const hutch_backend_ops *backend_ops(int backend);

/* initconn.c: requests to hutch-init over the control socket. */
typedef int (*initconn_reply_fn)(const initproto_msg *m, int *fds, size_t nfds, void *userdata);
initproto_writer *initconn_begin(hutch_sandbox *sb, uint16_t type);
/* Send the request in sb->tx (with fds), then feed each reply with this
 * request's id to on_reply (F_MORE sequences included) while queueing
 * events. ERROR replies become -errno with the message in err. Descriptors
 * that on_reply leaves in fds[] (not set to -1) are closed. */
int initconn_call(hutch_sandbox *sb, const int *fds, size_t nfds, initconn_reply_fn on_reply,
                  void *userdata, int timeout_ms, hutch_error *err);
int initconn_hello(hutch_sandbox *sb, int timeout_ms, hutch_error *err);
/* Read one frame (waiting up to timeout_ms) and queue it if it is an event.
 * Returns 1 if something was queued, 0 on timeout, -errno. */
int initconn_pump(hutch_sandbox *sb, int timeout_ms, hutch_error *err);
/* Take the oldest queued event off the queue (NULL when empty); free it
 * with initconn_event_free(). */
initconn_event *initconn_event_pop(hutch_sandbox *sb);
void initconn_event_free(initconn_event *ev);
void initconn_events_free(hutch_sandbox *sb);
/* Check a descriptor received from init against the kinds allowed (a pipe,
 * the pty master, a regular file not on procfs/sysfs/cgroupfs) and make it
 * non-blocking. -EBADMSG for anything else. */
enum { INITCONN_FD_FIFO = 1, INITCONN_FD_PTY = 2, INITCONN_FD_FILE = 4 };
int initconn_check_fd(int fd, int want);

/* sandbox.c helpers used by others */
/* A sandbox's directory is flocked while it is between two consistent
 * states (being created, checkpointed, suspended, restored, torn down), so
 * that another process (`hutch gc`, `hutch kill`, another daemon on the same
 * run dir) never takes a sandbox in transit for a dead one. The lock belongs
 * to the open directory, released explicitly (the clone child shares the open
 * file until it execs). wait=false: -EWOULDBLOCK when busy. */
int sandbox_busy_take(hutch_sandbox *sb, bool wait);
void sandbox_busy_release(hutch_sandbox *sb);

int sandbox_dir_path(hutch_ctx *ctx, const char *id, char **ret);
/* The state file, from sb (atomically replaced). */
int sandbox_state_write(hutch_sandbox *sb, hutch_error *err);
/* Field 22 of /proc/<pid>/stat: start time, to tell a pid from its reuse. */
int sandbox_proc_starttime(pid_t pid, uint64_t *ret);
/* Sends on the control connection fail instead of blocking for long. */
void sandbox_conn_set_timeouts(int fd);
/* The writable layers' storage, set up on first use. */
int sandbox_storage_ensure(hutch_ctx *ctx, hutch_error *err);
#define INIT_READY_TIMEOUT_MS 10000
/* Whether the sandbox's state file names an init that is no longer alive
 * (false while there is no state: a create under way). On ns, init's end
 * is the end of every process of the sandbox (its pid namespace). */
bool sandbox_init_gone(hutch_ctx *ctx, const char *id);
int sandbox_validate_id(const char *id);
