/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The namespace backend: hutch-init runs on the host kernel in new user,
 * mount, pid, network, UTS and IPC namespaces, under seccomp, with the
 * template as an id-mapped read-only lower layer and the writable layer on
 * a sized file system (storage.c). The engine (sandbox.c) has made the
 * state dir, uid range and cgroup; this file clones the child (child.c),
 * hands it the mounts only the parent can make, and waits for init.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"
#include "sandbox/seccomp.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/syscalls.h"

#define CHILD_STACK_SIZE (256 * 1024)
/* The child's config at the bottom of its stack's mapping: it reads it
 * until it execs, and the engine unmaps both only once it is gone. */
#define CHILD_CONFIG_SPACE ((sizeof(child_config) + 63) & ~(size_t) 63)

/* A detached, id-mapped (and optionally read-only) copy of a host tree,
 * ready for the child to attach with move_mount(). Only the parent can do
 * this: MOUNT_ATTR_IDMAP needs CAP_SYS_ADMIN over the file system's owner. */
static int idmapped_tree(const char *path, int userns_fd, bool readonly, bool recursive, int *ret_fd) {
        _cleanup_close_ int fd = sys_open_tree(
                AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0));
        if (fd < 0)
                return -errno;
        struct mount_attr attr = {
                .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | (readonly ? MOUNT_ATTR_RDONLY : 0),
                .userns_fd = (uint64_t) userns_fd,
        };
        if (sys_mount_setattr(fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr,
                              sizeof attr) < 0)
                return -errno;
        *ret_fd = TAKE_FD(fd);
        return 0;
}

/* The one message the child waits for: [n_binds, has_layer, 16-byte bind
 * paths...] with the descriptors [lower, layer?, binds...]. */
static int send_bootstrap(int sock, const hutch_template *t, int lower_fd, int layer_fd,
                          const int *bind_fds) {
        char buf[2 + TEMPLATE_MAX_BINDS * 16] = { 0 };
        int fds[2 + TEMPLATE_MAX_BINDS];
        size_t n = 0;
        buf[0] = (char) t->n_binds;
        buf[1] = (char) ((layer_fd >= 0) | (t->n_layers ? 2 : 0)); /* 2: send_layers follows */
        fds[n++] = lower_fd;
        if (layer_fd >= 0)
                fds[n++] = layer_fd;
        for (size_t i = 0; i < t->n_binds; i++) {
                snprintf(buf + 2 + i * 16, 16, "%s", t->binds[i]);
                fds[n++] = bind_fds[i];
        }
        return fd_send_with_fds(sock, buf, 2 + t->n_binds * 16, fds, n);
}

/* The second message the child waits for, after the bootstrap: [n,
 * n paths of HUTCH_VOLUME_PATH_MAX + 1 bytes] with the n id-mapped volume
 * mounts (n may be 0: then a descriptor-less message). */
static int send_volumes(int sock, const hutch_sandbox_config *cfg, const int *vol_fds) {
        static char buf[1 + HUTCH_VOLUMES_MAX * (HUTCH_VOLUME_PATH_MAX + 1)];
        memset(buf, 0, sizeof buf);
        buf[0] = (char) cfg->n_volumes;
        for (size_t i = 0; i < cfg->n_volumes; i++)
                snprintf(buf + 1 + i * (HUTCH_VOLUME_PATH_MAX + 1), HUTCH_VOLUME_PATH_MAX + 1, "%s",
                         cfg->volumes[i].path);
        size_t len = 1 + cfg->n_volumes * (HUTCH_VOLUME_PATH_MAX + 1);
        if (cfg->n_volumes == 0)
                return send(sock, buf, len, MSG_NOSIGNAL) == (ssize_t) len ? 0 : -errno;
        return fd_send_with_fds(sock, buf, len, vol_fds, cfg->n_volumes);
}

/* An image template's layers (top first), each id-mapped into the
 * sandbox's range, read-only and detached, in one message after the
 * bootstrap: the child attaches them as l0..lN-1 under the template's own
 * top layer. Shared by every sandbox, never copied. */
static int send_layers(int sock, const hutch_template *t, int userns_fd, const char **step) {
        int fds[HUTCH_MAX_LAYERS];
        char buf[HUTCH_MAX_LAYERS] = { 0 };
        size_t n = 0;
        int r = 0;
        if (t->n_layers > HUTCH_MAX_LAYERS)
                return *step = "too many layers", -E2BIG;
        for (; n < t->n_layers; n++)
                if ((r = idmapped_tree(t->layers[n], userns_fd, true, false, &fds[n])) < 0) {
                        *step = "id-mapping an image layer";
                        break;
                }
        if (r >= 0) {
                union {
                        struct cmsghdr align;
                        char b[CMSG_SPACE(sizeof(int) * HUTCH_MAX_LAYERS)];
                } ctl;
                memset(&ctl, 0, sizeof ctl);
                struct iovec iov = { .iov_base = buf, .iov_len = n };
                struct msghdr msg = { .msg_iov = &iov,
                                      .msg_iovlen = 1,
                                      .msg_control = ctl.b,
                                      .msg_controllen = CMSG_SPACE(sizeof(int) * n) };
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
                memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
                ssize_t k;
                do
                        k = sendmsg(sock, &msg, MSG_NOSIGNAL);
                while (k < 0 && errno == EINTR);
                if (k < 0) {
                        r = -errno;
                        *step = "sending the image layers";
                }
        }
        for (size_t i = 0; i < n; i++)
                close(fds[i]);
        return r;
}

/* Their mount points in the sandbox directory. */
static int make_layer_dirs(int dfd, const hutch_template *t) {
        for (size_t i = 0; i < t->n_layers; i++) {
                char d[16];
                snprintf(d, sizeof d, "l%zu", i);
                if (mkdirat(dfd, d, 0755) < 0)
                        return -errno;
        }
        return 0;
}

/* No checkpoints here: runsc's are gVisor's. */
static int ns_check(const hutch_sandbox_config *cfg, hutch_error *err) {
        if (cfg->checkpoint_from)
                return hutch_error_set(err, -EOPNOTSUPP,
                                       "only a gvisor sandbox starts from a memory checkpoint");
        return 0;
}

/* Clone the child (child.c) into new namespaces, with conn[1] and sync[1]
 * as its ends; it joins its cgroup itself. Sets sb's init and a->stack. */
static int ns_clone(hutch_sandbox *sb, sandbox_create_args *a, const struct sock_fprog *prog,
                    int memfd, const int conn[2], const int sync[2], hutch_error *err) {
        int r;
        void *mem = mmap(NULL, CHILD_CONFIG_SPACE + CHILD_STACK_SIZE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (mem == MAP_FAILED)
                return hutch_error_set(err, -errno, "allocating the child stack: %m");
        child_config *cc = mem;
        *cc = (child_config) {
                .sandbox_dir = sb->dir,
                .disk_bytes = sb->limits.disk_bytes,
                .disk_inodes = sb->limits.disk_inodes,
                .nofile = sb->limits.nofile,
                .hostname = a->hostname,
                .no_new_privs = sb->no_new_privs,
                .init_conn = conn[1],
                .parent_conn = conn[0],
                .sync_fd = sync[1],
                .init_memfd = memfd,
                .seccomp = prog,
                .uid_base = sb->uid_base,
                .gpu = a->gpu,
        };
        int pidfd = -1;
        /* The child always joins its cgroup itself (cgroup.procs opened here,
         * as root), on v2 too: CLONE_INTO_CGROUP checks the cloning task's
         * credentials, and the clone below runs with the sandbox's uid as
         * its euid (see there). */
        r = cgroup_procs_fds(sb->cg, cc->cgroup_procs, ELEMENTSOF(cc->cgroup_procs), err);
        if (r < 0) {
                munmap(mem, CHILD_CONFIG_SPACE + CHILD_STACK_SIZE);
                return r;
        }
        cc->n_cgroup_procs = (size_t) r;
        struct clone_args ca = {
                .flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS |
                        CLONE_NEWIPC | CLONE_VM | CLONE_PIDFD,
                .pidfd = (uint64_t) (uintptr_t) &pidfd,
                .exit_signal = SIGCHLD,
                .stack = (uint64_t) (uintptr_t) ((char *) mem + CHILD_CONFIG_SPACE),
                .stack_size = CHILD_STACK_SIZE,
        };
        /* No handler of ours may run on the child's stack before it resets them. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        /* The new user namespace is owned by the euid that creates it. With
         * host root as the owner, every sandbox's per-user kernel counters
         * (inotify instances and watches, ...) would also be charged to host
         * uid 0, one budget all sandboxes and the host's root daemons share.
         * So the clone runs with the sandbox's own uid as euid: raw syscalls,
         * this thread only; real and saved ids stay 0 to switch back. */
        pid_t pid = -1;
        int clone_errno = 0;
        if (syscall(SYS_setresgid, -1, sb->uid_base, -1) < 0 ||
            syscall(SYS_setresuid, -1, sb->uid_base, -1) < 0)
                clone_errno = errno;
        else {
                pid = clone3_with_fn(&ca, child_main, cc);
                clone_errno = errno;
        }
        if (syscall(SYS_setresuid, -1, 0, -1) < 0 || syscall(SYS_setresgid, -1, 0, -1) < 0)
                abort(); /* cannot happen with real and saved ids 0; never go on as another uid */
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        for (size_t i = 0; i < cc->n_cgroup_procs; i++)
                safe_close(cc->cgroup_procs[i]);
        if (pid < 0) {
                munmap(mem, CHILD_CONFIG_SPACE + CHILD_STACK_SIZE);
                return hutch_error_set(err, -clone_errno, "clone3: %s", strerror(clone_errno));
        }
        a->stack = mem;
        a->stack_size = CHILD_CONFIG_SPACE + CHILD_STACK_SIZE;
        sb->init_pid = pid;
        sb->init_pidfd = pidfd;
        return 0;
}

/* The parent half, while the child waits in recvmsg(): its id maps, then
 * over conn the mounts only the parent can make (id-mapped template, binds,
 * image layers, the writable layer, the volumes). On failure, *ret_step
 * says which. */
static int ns_parent_half(hutch_sandbox *sb, const sandbox_create_args *a, int conn, hutch_error *e,
                          const char **ret_step) {
        hutch_ctx *ctx = sb->ctx;
        const hutch_sandbox_config *cfg = a->cfg;
        const hutch_template *tpl = a->tpl;
        pid_t pid = sb->init_pid;
        _cleanup_close_ int userns = -1, layer_fd = -1;
        int lower_fd = -1, bind_fds[TEMPLATE_MAX_BINDS];
        size_t n_bind_fds = 0;
        const char *step = NULL;
        int r = 0;
        if ((r = idmap_write(pid, "uid_map", sb->uid_base, HUTCH_IDMAP_SIZE)) < 0)
                step = "writing uid_map";
        if (r >= 0 && (r = idmap_write(pid, "gid_map", sb->uid_base, HUTCH_IDMAP_SIZE)) < 0)
                step = "writing gid_map";
        /* before it has children (it waits for the bootstrap): every process
         * of the sandbox inherits it (sandbox-internal.h) */
        if (r >= 0 && (r = sandbox_oom_adjust(pid)) < 0)
                step = "setting its oom_score_adj (it would keep this process's negative one)";
        if (r >= 0) {
                char p[64];
                snprintf(p, sizeof p, "/proc/%d/ns/user", pid);
                userns = open(p, O_RDONLY | O_CLOEXEC);
                if (userns < 0) {
                        r = -errno;
                        step = "opening the user namespace";
                }
        }
        /* The writable layer, while the child joins its cgroup. */
        uint64_t restored_bytes = 0;
        if (r >= 0 &&
            (r = storage_prepare(ctx, sb->id, sb->uid_base, &sb->limits, cfg->layer_from,
                                 cfg->layer_image, cfg->layer_image_uid_base, &layer_fd,
                                 &restored_bytes, e)) < 0)
                step = e->msg;
        if (r >= 0 && restored_bytes)
                sb->limits.disk_bytes = restored_bytes; /* the snapshot's size, not the request's */
        if (r >= 0 && (r = idmapped_tree(tpl->rootfs, userns, true, false, &lower_fd)) < 0)
                step = "id-mapping the template";
        for (size_t i = 0; r >= 0 && i < tpl->n_binds; i++) {
                if ((r = idmapped_tree(tpl->binds[i], userns, true, true, &bind_fds[i])) < 0)
                        step = "id-mapping a template bind";
                else
                        n_bind_fds++;
        }
        if (r >= 0 && (r = send_bootstrap(conn, tpl, lower_fd, layer_fd, bind_fds)) < 0)
                step = "sending the bootstrap message";
        if (r >= 0 && tpl->n_layers)
                r = send_layers(conn, tpl, userns, &step);
        safe_close(lower_fd);
        layer_fd = safe_close(layer_fd);
        for (size_t i = 0; i < n_bind_fds; i++)
                safe_close(bind_fds[i]);
        /* Volumes: id-mapped mounts of their file systems, then the second
         * message (the child attaches them once its root is set up). */
        int vol_fds[HUTCH_VOLUMES_MAX];
        size_t n_vol_fds = 0;
        for (size_t i = 0; r >= 0 && i < cfg->n_volumes; i++) {
                if ((r = volume_mount_idmapped(ctx, cfg->volumes[i].volume, userns, &vol_fds[i], e)) <
                    0)
                        step = e->msg;
                else
                        n_vol_fds++;
        }
        if (r >= 0 && (r = send_volumes(conn, cfg, vol_fds)) < 0)
                step = "sending the volume mounts";
        for (size_t i = 0; i < n_vol_fds; i++)
                safe_close(vol_fds[i]);
        if (r >= 0 && cfg->n_volumes > 0 &&
            (r = volume_state_write(sb->dir, cfg->volumes, cfg->n_volumes, e)) < 0)
                step = e->msg;
        *ret_step = step;
        return r;
}

/* The child's end: EOF on the sync pipe once it exec'd hutch-init (the
 * pipe is close-on-exec), or its error. Bounded: a child stuck in the
 * kernel must not hang us. */
static int ns_wait_child(sandbox_create_args *a, int sync, hutch_error *err) {
        child_error ce = { 0 };
        ssize_t got = 0;
        struct pollfd p = { .fd = sync, .events = POLLIN };
        int k;
        do
                k = poll(&p, 1, INIT_READY_TIMEOUT_MS);
        while (k < 0 && errno == EINTR);
        if (k != 1)
                return hutch_error_set(err, -ETIMEDOUT, "creating sandbox: %s: %s",
                                       "the sandbox's setup did not finish in time",
                                       strerror(ETIMEDOUT));
        got = fd_read_full(sync, &ce, sizeof ce);
        if (got == 0) {
                /* it exec'd: its memory view of the stack and gpu is gone */
                munmap(a->stack, a->stack_size);
                a->stack = MAP_FAILED;
                a->gpu = gpu_child_free(a->gpu);
                return 0;
        }
        int r = got == (ssize_t) sizeof ce && ce.code < 0 ? ce.code : -EPROTO;
        ce.msg[sizeof ce.msg - 1] = 0;
        return hutch_error_set(err, r, "creating sandbox: %s: %s",
                               got == (ssize_t) sizeof ce ? ce.msg : "child failed", strerror(-r));
}

static int ns_create(hutch_sandbox *sb, sandbox_create_args *a, hutch_error *err) {
        _cleanup_close_pair_ int conn[2] = { -1, -1 }, sync[2] = { -1, -1 };
        int r;
        if ((r = make_layer_dirs(a->dir_fd, a->tpl)) < 0)
                return hutch_error_set(err, r, "preparing %s: %s", sb->dir, strerror(-r));
        if ((r = sandbox_storage_ensure(sb->ctx, err)) < 0)
                return r;
        const struct sock_fprog *prog;
        if ((r = seccomp_filter_get(&prog, err)) < 0)
                return r;
        int memfd = sandbox_init_memfd(sb->ctx, err);
        if (memfd < 0)
                return memfd;
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, conn) < 0 ||
            pipe2(sync, O_CLOEXEC) < 0)
                return hutch_error_set(err, -errno, "socketpair/pipe: %m");
        if ((r = ns_clone(sb, a, prog, memfd, conn, sync, err)) < 0)
                return r;
        /* the child has its own copies of the GPU mounts; its memory view
         * of gpu is read until it execs, so gpu is freed only then */
        conn[1] = safe_close(conn[1]);
        sync[1] = safe_close(sync[1]);
        hutch_error e = { 0 };
        const char *step = NULL;
        if ((r = ns_parent_half(sb, a, conn[0], &e, &step)) < 0)
                return hutch_error_set(err, r, "creating sandbox: %s: %s", step, strerror(-r));
        if ((r = ns_wait_child(a, sync[0], err)) < 0)
                return r;
        sb->conn = TAKE_FD(conn[0]);
        sandbox_conn_set_timeouts(sb->conn);
        if ((r = sandbox_proc_starttime(sb->init_pid, &sb->init_starttime)) < 0)
                return hutch_error_set(err, r, "reading hutch-init's start time: %s", strerror(-r));
        if ((r = initconn_hello(sb, INIT_READY_TIMEOUT_MS, err)) < 0)
                return r;
        return sandbox_state_write(sb, err);
}

static void ns_usage(hutch_sandbox *sb, hutch_stats *s) {
        uint64_t used = 0;
        if (storage_usage(sb->ctx, sb->id, &used) >= 0)
                s->disk_used = used;
}

static int ns_layer_open(hutch_sandbox *sb, hutch_layer_source *ret, hutch_error *err) {
        /* the layer is synced through the sandbox's own root: an overlay's
         * syncfs writes back its upper file system */
        char p[64];
        snprintf(p, sizeof p, "/proc/%d/root", (int) sb->init_pid);
        _cleanup_close_ int root = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0)
                return hutch_error_set(err, -errno, "opening the sandbox's root: %m");
        /* still our init, not a process that got its pid after it died */
        if (sb->init_pidfd >= 0 && syscall(SYS_pidfd_send_signal, sb->init_pidfd, 0, NULL, 0) < 0)
                return hutch_error_set(err, -ESRCH, "the sandbox's init is gone");
        int img = -1;
        int r = storage_open_image(sb->ctx, sb->id, &img, err);
        if (r < 0)
                return r;
        *ret = (hutch_layer_source) { .root_fd = TAKE_FD(root),
                                      .image_fd = img,
                                      .uid_base = sb->uid_base };
        return 0;
}

const hutch_backend_ops backend_ns = {
        .name = "ns",
        .caps = 0,
        .check = ns_check,
        .create = ns_create,
        .usage = ns_usage,
        .layer_open = ns_layer_open,
};
