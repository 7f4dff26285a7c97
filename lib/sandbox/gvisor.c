/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gVisor backend: the sandbox's processes run on runsc's user-space
 * kernel (the sentry), not on the host's. What is shared with the namespace
 * backend: the state dir, the uid range, the cgroup (sized for the sentry's
 * own threads and memory), the template as the read-only lower layer, and
 * hutch-init as PID 1 speaking the same protocol. What differs:
 *
 *  - runsc serves the template as a read-only root (--overlay2=none) and
 *    mounts a tmpfs of the disk limit's size at /run/hutch/layer; hutch-init
 *    puts an overlay of the two under the sandbox as its root
 *    (init/layer.c): writes get ENOSPC at the disk limit, live in the
 *    sentry's memory and count against the memory limit too; the
 *    template's host files are never written;
 *  - no descriptor crosses the sandbox's edge, so hutch-init talks over a
 *    mux on its stdin/stdout to a relay on the host (init/relay.c, the same
 *    binary), which gives the engine the namespace backend's connection:
 *    frames with pipes, ptys and files as SCM_RIGHTS;
 *  - the network is runsc's --network=none (loopback only); hutch-init
 *    listens on 127.0.0.1:<egress port> inside, and the relay connects each
 *    of those connections to the same port in its own network namespace,
 *    where the daemon's egress proxy listens as for any sandbox.
 *
 * Process tree: the engine forks the relay (root until runsc is started,
 * then the sandbox's host uid, no capabilities) into the sandbox's cgroup
 * and a new network namespace; the relay forks `runsc run`, which starts
 * the sentry and the gofer. The relay is a subreaper: it reaps runsc's
 * orphans and exits when none is left.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "sandbox-internal.h"
#include "template/template.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/error.h"
#include "util/macro.h"

extern const unsigned char hutch_init_start[];
extern const unsigned char hutch_init_end[];

static const char *const runsc_candidates[] = { "/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc", NULL };

int gvisor_runsc_path(const hutch_ctx *ctx, char *buf, size_t n) {
        if (ctx->runsc && *ctx->runsc) {
                if (access(ctx->runsc, X_OK) < 0)
                        return -errno;
                snprintf(buf, n, "%s", ctx->runsc);
                return 0;
        }
        for (const char *const *p = runsc_candidates; *p; p++)
                if (access(*p, X_OK) == 0) {
                        snprintf(buf, n, "%s", *p);
                        return 0;
                }
        return -ENOENT;
}

/* ------------------------------------------------------------ the spec */

typedef struct jbuf {
        char *p;
        size_t len, cap;
        bool oom;
} jbuf;

static void jraw(jbuf *b, const char *s, size_t n) {
        if (b->oom)
                return;
        if (b->len + n + 1 > b->cap) {
                size_t cap = (b->cap ? b->cap * 2 : 4096) + n;
                char *np = realloc(b->p, cap);
                if (!np) {
                        b->oom = true;
                        return;
                }
                b->p = np;
                b->cap = cap;
        }
        memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = 0;
}

static void jput(jbuf *b, const char *s) {
        jraw(b, s, strlen(s));
}

static void jstr(jbuf *b, const char *s) {
        jraw(b, "\"", 1);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                char e[8];
                if (*p == '"' || *p == '\\') {
                        e[0] = '\\';
                        e[1] = (char) *p;
                        jraw(b, e, 2);
                } else if (*p < 0x20) {
                        snprintf(e, sizeof e, "\\u%04x", *p);
                        jraw(b, e, 6);
                } else
                        jraw(b, (const char *) p, 1);
        }
        jraw(b, "\"", 1);
}

static void jmount(jbuf *b, const char *dst, const char *type, const char *src, const char *const *opts) {
        jput(b, ",{\"destination\":");
        jstr(b, dst);
        jput(b, ",\"type\":");
        jstr(b, type);
        jput(b, ",\"source\":");
        jstr(b, src);
        jput(b, ",\"options\":[");
        for (size_t i = 0; opts[i]; i++) {
                if (i)
                        jput(b, ",");
                jstr(b, opts[i]);
        }
        jput(b, "]}");
}

/* Root in the sandbox holds these inside the sentry (as in a container);
 * none of them is a host capability. */
static const char *const guest_caps[] = {
        "CAP_CHOWN",        "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",     "CAP_FSETID",
        "CAP_KILL",         "CAP_SETGID",       "CAP_SETUID",          "CAP_SETPCAP",    "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",   "CAP_SYS_PTRACE",   "CAP_AUDIT_WRITE",     "CAP_SETFCAP",    "CAP_MKNOD",
        "CAP_SYS_NICE",     "CAP_SYS_RESOURCE", "CAP_IPC_LOCK",        "CAP_LEASE",      NULL,
};

/* init also starts with CAP_SYS_ADMIN (inside the sentry) to build the
 * root with its writable layer, and drops it from every set, the bounding
 * set included, before anything else runs (init/layer.c). */
static void jcaps(jbuf *b) {
        jput(b, "[\"CAP_SYS_ADMIN\"");
        for (size_t i = 0; guest_caps[i]; i++) {
                jput(b, ",");
                jstr(b, guest_caps[i]);
        }
        jput(b, "]");
}

static int write_spec(hutch_sandbox *sb, const hutch_template *tpl, const char *root,
                      const hutch_volume_mount *vols, size_t n_vols, const char *hostname,
                      const char *init_path, uint16_t egress_port, hutch_error *err) {
        jbuf b = { 0 };
        char num[64];
        jput(&b, "{\"ociVersion\":\"1.0.2\",\"process\":{\"terminal\":false,\"user\":{\"uid\":0,\"gid\":0},\"args\":[");
        jstr(&b, INITPROTO_GVISOR_INIT);
        jput(&b, ",\"--gvisor-guest\",");
        snprintf(num, sizeof num, "\"%u\",\"%" PRIu64 "\",\"layer\"", (unsigned) egress_port,
                 sb->limits.memory_bytes);
        jput(&b, num);
        /* then the volumes' paths: init binds volume i there from
         * INITPROTO_GVISOR_VOLUMES/<i> (init/layer.c) */
        for (size_t i = 0; vols && i < n_vols; i++) {
                jput(&b, ",");
                jstr(&b, vols[i].path);
        }
        jput(&b, "],\"env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"");
        if (getenv("HUTCH_INIT_DEBUG"))
                jput(&b, ",\"HUTCH_INIT_DEBUG=1\"");
        jput(&b, "],\"cwd\":\"/\",\"noNewPrivileges\":");
        jput(&b, sb->no_new_privs ? "true" : "false");
        jput(&b, ",\"capabilities\":{\"bounding\":");
        jcaps(&b);
        jput(&b, ",\"effective\":");
        jcaps(&b);
        jput(&b, ",\"permitted\":");
        jcaps(&b);
        jput(&b, "},\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\",");
        snprintf(num, sizeof num, "\"hard\":%" PRIu64 ",\"soft\":%" PRIu64 "}", sb->limits.nofile, sb->limits.nofile);
        jput(&b, num);
        /* the sandbox's pids limit, enforced by the sentry for every uid
         * but root's (as Linux does) */
        snprintf(num, sizeof num, ",{\"type\":\"RLIMIT_NPROC\",\"hard\":%" PRIu64 ",\"soft\":%" PRIu64 "}",
                 sb->limits.pids, sb->limits.pids);
        jput(&b, num);
        jput(&b, ",{\"type\":\"RLIMIT_CORE\",\"hard\":0,\"soft\":0}]},\"root\":{\"path\":");
        jstr(&b, root);
        /* read-only: the writable layer is init's overlay over it */
        jput(&b, ",\"readonly\":true},\"hostname\":");
        jstr(&b, hostname);
        jput(&b, ",\"mounts\":[{\"destination\":\"/proc\",\"type\":\"proc\",\"source\":\"proc\"}");
        static const char *const dev_opts[] = { "nosuid", "strictatime", "mode=755", "size=65536k", NULL };
        static const char *const pts_opts[] = { "nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5", NULL };
        static const char *const shm_opts[] = { "nosuid", "noexec", "nodev", "mode=1777", "size=65536k", NULL };
        static const char *const sys_opts[] = { "nosuid", "noexec", "nodev", "ro", NULL };
        static const char *const ro_bind[] = { "rbind", "ro", "nosuid", "nodev", NULL };
        jmount(&b, "/dev", "tmpfs", "tmpfs", dev_opts);
        jmount(&b, "/dev/pts", "devpts", "devpts", pts_opts);
        jmount(&b, "/dev/shm", "tmpfs", "shm", shm_opts);
        jmount(&b, "/sys", "sysfs", "sysfs", sys_opts);
        for (size_t i = 0; i < tpl->n_binds; i++)
                jmount(&b, tpl->binds[i], "bind", tpl->binds[i], ro_bind);
        jmount(&b, INITPROTO_GVISOR_INIT, "bind", init_path, ro_bind);
        /* the writable layer: the sentry's tmpfs refuses to grow past size=
         * with ENOSPC (init/layer.c puts it under the root) */
        char layer_size[40];
        snprintf(layer_size, sizeof layer_size, "size=%" PRIu64, sb->limits.disk_bytes);
        const char *const layer_opts[] = { "nosuid", "nodev", "mode=0755", layer_size, NULL };
        jmount(&b, INITPROTO_GVISOR_LAYER, "tmpfs", "tmpfs", layer_opts);
        /* the volumes, attached in the relay's namespace (gvisor-root.c) */
        static const char *const vol_opts[] = { "rbind", "nosuid", "nodev", NULL };
        static const char *const standin_opts[] = { "rbind", "ro", "nosuid", "nodev", NULL };
        for (size_t i = 0; i < n_vols; i++) {
                char src[PATH_MAX], dst[64];
                snprintf(src, sizeof src, "%s/" GVISOR_VOL_DIR "/%zu", sb->dir, i);
                snprintf(dst, sizeof dst, INITPROTO_GVISOR_VOLUMES "/%zu", i);
                jmount(&b, dst, "bind", src, vols ? vol_opts : standin_opts);
        }
        jput(&b, "],\"linux\":{\"namespaces\":[{\"type\":\"pid\"},{\"type\":\"ipc\"},{\"type\":\"uts\"},"
                 "{\"type\":\"mount\"},{\"type\":\"network\"}]}}\n");
        if (b.oom) {
                free(b.p);
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/bundle/config.json", sb->dir);
        int r = write_file_atomic(path, b.p, b.len, 0600);
        free(b.p);
        if (r < 0)
                return hutch_error_set(err, r, "writing %s: %s", path, strerror(-r));
        return 0;
}

/* hutch-init's bytes as a read-only host file the spec binds in: runsc
 * can only start a file of the container's tree. Written once per run dir
 * (and again when this build's binary differs). */
static int guest_init_file(hutch_ctx *ctx, char *path, size_t n, hutch_error *err) {
        size_t len = (size_t) (hutch_init_end - hutch_init_start);
        snprintf(path, n, "%s/hutch-init.gvisor", ctx->run_dir);
        struct stat st;
        _cleanup_free_ char *have = NULL;
        if (stat(path, &st) == 0 && (size_t) st.st_size == len && st.st_uid == 0 && (st.st_mode & 0222) == 0) {
                _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                have = fd < 0 ? NULL : malloc(len);
                if (have && fd_read_full(fd, have, len) == (ssize_t) len && memcmp(have, hutch_init_start, len) == 0)
                        return 0;
        }
        int r = mkdir_p(ctx->run_dir, 0711);
        if (r >= 0)
                r = write_file_atomic(path, hutch_init_start, len, 0555);
        if (r < 0)
                return hutch_error_set(err, r, "writing %s: %s", path, strerror(-r));
        return 0;
}

/* The tail of the relay's log (runsc's own complaints), for an error message. */
static void log_tail(const char *dir, char *buf, size_t n) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/relay.log", dir);
        buf[0] = 0;
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return;
        off_t end = lseek(fd, 0, SEEK_END);
        off_t from = end > (off_t) n - 1 ? end - (off_t) n + 1 : 0;
        ssize_t k = pread(fd, buf, n - 1, from);
        buf[k > 0 ? k : 0] = 0;
        for (char *p = buf; *p; p++)
                if (*p == '\n' && p[1])
                        *p = ' ';
        size_t l = strlen(buf);
        while (l && (buf[l - 1] == '\n' || buf[l - 1] == ' '))
                buf[--l] = 0;
}

/* A file the relay keeps in the sandbox's scratch dir (init/relay.c). */
static int scratch_file_path(hutch_sandbox *sb, const char *name, char *buf, size_t n) {
        int r = gvisor_scratch_path(sb->ctx, sb->id, buf, n);
        size_t l = strlen(buf);
        if (r >= 0 && (size_t) snprintf(buf + l, n - l, "/%s", name) >= n - l)
                r = -ENAMETOOLONG;
        return r;
}

uint64_t gvisor_oom_kills(hutch_sandbox *sb) {
        /* the relay appends a byte per kill */
        char path[PATH_MAX];
        struct stat st;
        if (scratch_file_path(sb, "oom-kills", path, sizeof path) < 0 ||
            fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                return 0;
        return (uint64_t) st.st_size;
}

uint64_t gvisor_disk_used(hutch_sandbox *sb) {
        /* the relay keeps the guest's latest count, 8 bytes little-endian */
        char path[PATH_MAX];
        uint8_t v[8];
        if (scratch_file_path(sb, "disk-used", path, sizeof path) < 0)
                return 0;
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0 || pread(fd, v, sizeof v, 0) != (ssize_t) sizeof v)
                return 0;
        uint64_t used = 0;
        for (int i = 7; i >= 0; i--)
                used = used << 8 | v[i];
        return MIN(used, sb->limits.disk_bytes);
}

int gvisor_scratch_path(const hutch_ctx *ctx, const char *id, char *buf, size_t n) {
        return snprintf(buf, n, "%s/gvisor/%s", ctx->data_dir, id) >= (int) n ? -ENAMETOOLONG : 0;
}

/* Start the relay (and through it runsc run, or runsc restore from
 * image_dir) for a sandbox whose bundle exists, connect to it, HELLO. Also
 * what brings a sandbox back after its own checkpoint. */
static int gvisor_launch(hutch_sandbox *sb, const char *image_dir, int timeout_ms, hutch_error *err) {
        hutch_ctx *ctx = sb->ctx;
        char runsc[PATH_MAX], scratch[PATH_MAX], p[PATH_MAX];
        int r;
        uint16_t egress_port = sb->egress_port ? sb->egress_port : 3128;

        if (gvisor_runsc_path(ctx, runsc, sizeof runsc) < 0)
                return hutch_error_set(err, -ENOPKG,
                                       "the gvisor backend needs runsc (apt install runsc), not found%s%s",
                                       *ctx->runsc ? " at " : "", ctx->runsc);
        if ((r = gvisor_scratch_path(ctx, sb->id, scratch, sizeof scratch)) < 0)
                return hutch_error_set(err, r, "data dir path too long");
        /* The control socket at the namespace backend's path, so attach
         * works the same; the relay accepts on it. */
        _cleanup_close_ int lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        _cleanup_close_pair_ int conn[2] = { -1, -1 };
        if (lsock < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, conn) < 0)
                return hutch_error_set(err, -errno, "socket: %m");
        {
                snprintf(p, sizeof p, "%s/sock", sb->dir);
                _cleanup_close_ int sd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                if (sd < 0)
                        return hutch_error_set(err, -errno, "opening %s: %m", p);
                snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/init.sock", sd);
                (void) unlinkat(sd, "init.sock", 0); /* a relay's before a checkpoint */
                if (bind(lsock, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(lsock, 16) < 0)
                        return hutch_error_set(err, -errno, "binding the control socket: %m");
        }
        snprintf(p, sizeof p, "%s/relay.log", sb->dir);
        _cleanup_close_ int logfd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (logfd < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", p);
        int memfd = sandbox_init_memfd(ctx, err);
        if (memfd < 0)
                return memfd;
        /* an image or built template's root, stacked in the relay's
         * mount namespace (gvisor-root.c) */
        _cleanup_(gvisor_root_done) gvisor_root groot = { .layer_fd = -1 };
        if ((r = gvisor_root_parent(sb, &groot, err)) < 0)
                return r;
        int procs[8];
        r = cgroup_procs_fds(sb->cg, procs, ELEMENTSOF(procs), err);
        if (r < 0)
                return r;
        size_t n_procs = (size_t) r;

        /* argv, built before the fork: the child only makes syscalls */
        char a_uid[16], a_max[24], a_port[8], a_root[PATH_MAX + 8], a_plat[80], a_bundle[PATH_MAX],
                a_img[PATH_MAX + 16];
        snprintf(a_uid, sizeof a_uid, "%u", (unsigned) sb->uid_base);
        snprintf(a_max, sizeof a_max, "%" PRIu64, sb->limits.disk_bytes);
        snprintf(a_port, sizeof a_port, "%u", (unsigned) egress_port);
        snprintf(a_root, sizeof a_root, "--root=%s/runsc", sb->dir);
        snprintf(a_plat, sizeof a_plat, "--platform=%s", ctx->gvisor_platform);
        snprintf(a_bundle, sizeof a_bundle, "%s/bundle", sb->dir);
        snprintf(a_img, sizeof a_img, "--image-path=%s", image_dir ? image_dir : "");
        char *argv[] = { (char *) "hutch-relay", (char *) "--gvisor-relay", a_uid, a_max, scratch, a_port,
                         (char *) (image_dir ? "restore" : "run"), (char *) "--", runsc, a_root,
                         (char *) "--network=none", a_plat, (char *) "--overlay2=none",
                         (char *) "--ignore-cgroups", (char *) (image_dir ? "restore" : "run"), (char *) "--bundle",
                         a_bundle, image_dir ? a_img : sb->id, image_dir ? sb->id : NULL, NULL };
        static char *const envp[] = { (char *) "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        char *const *envv = envp;
        char *dbg_env[] = { (char *) "PATH=/usr/sbin:/usr/bin:/sbin:/bin", (char *) "HUTCH_INIT_DEBUG=1", NULL };
        if (getenv("HUTCH_INIT_DEBUG"))
                envv = dbg_env;

        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pid_t pid = fork();
        if (pid == 0) {
                /* the cgroup first (its limits cover everything from here),
                 * then a network namespace of our own with loopback up */
                for (size_t i = 0; i < n_procs; i++)
                        if (write(procs[i], "0", 1) != 1)
                                _exit(120);
                /* runsc, its sentry and gofer inherit it (sandbox-internal.h) */
                if (sandbox_oom_adjust(0) < 0)
                        _exit(126);
                if (unshare(CLONE_NEWNET) < 0)
                        _exit(121);
                int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                struct ifreq ifr = { .ifr_name = "lo" };
                if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
                        _exit(122);
                ifr.ifr_flags |= IFF_UP;
                if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
                        _exit(122);
                const char *step = NULL;
                int k = gvisor_root_child(&groot, &step);
                if (k < 0) {
                        /* for the create's error (log_tail): no stdio here */
                        char num[12], *q = num + sizeof num;
                        unsigned v = (unsigned) -k;
                        *--q = 0;
                        do
                                *--q = (char) ('0' + v % 10);
                        while ((v /= 10) && q > num);
                        static const char pre[] = "hutch: runsc's root: ", mid[] = " failed, errno ";
                        (void) !write(logfd, pre, sizeof pre - 1);
                        (void) !write(logfd, step, strlen(step));
                        (void) !write(logfd, mid, sizeof mid - 1);
                        (void) !write(logfd, q, strlen(q));
                        (void) !write(logfd, "\n", 1);
                        _exit(125);
                }
                int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
                int hl = fcntl(lsock, F_DUPFD_CLOEXEC, 64), hc = fcntl(conn[1], F_DUPFD_CLOEXEC, 64),
                    hm = fcntl(memfd, F_DUPFD_CLOEXEC, 64), hg = fcntl(logfd, F_DUPFD_CLOEXEC, 64);
                if (devnull < 0 || hl < 0 || hc < 0 || hm < 0 || hg < 0 || dup2(devnull, 0) < 0 ||
                    dup2(devnull, 1) < 0 || dup2(hg, 2) < 0 || dup2(hl, 3) < 0 || dup2(hc, 4) < 0 ||
                    dup3(hm, 5, O_CLOEXEC) < 0 || syscall(SYS_close_range, 6, ~0U, 0) < 0)
                        _exit(123);
                for (int sig = 1; sig < _NSIG; sig++)
                        if (sig != SIGKILL && sig != SIGSTOP)
                                (void) signal(sig, SIG_DFL);
                sigset_t none;
                sigemptyset(&none);
                (void) sigprocmask(SIG_SETMASK, &none, NULL);
                syscall(SYS_execveat, 5, "", argv, envv, AT_EMPTY_PATH);
                _exit(124);
        }
        int fork_errno = errno;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        for (size_t i = 0; i < n_procs; i++)
                safe_close(procs[i]);
        if (pid < 0)
                return hutch_error_set(err, -fork_errno, "fork: %s", strerror(fork_errno));
        sb->init_pid = pid;
        sb->is_parent = true;
        safe_close(sb->init_pidfd);
        sb->init_pidfd = sys_pidfd_open(pid, 0);
        if (sb->init_pidfd < 0)
                return hutch_error_set(err, -errno, "pidfd_open: %m");
        conn[1] = safe_close(conn[1]);
        safe_close(sb->conn);
        sb->conn = TAKE_FD(conn[0]);
        initconn_events_free(sb); /* the old relay's, if any */

        r = initconn_hello(sb, timeout_ms, err);
        if (r < 0) {
                char tail[600], why[sizeof err->msg];
                snprintf(why, sizeof why, "%s", err ? err->msg : strerror(-r));
                log_tail(sb->dir, tail, sizeof tail);
                int st = 0;
                bool exited = waitpid(pid, &st, WNOHANG) == pid;
                if (exited)
                        sb->is_parent = false; /* reaped here */
                return hutch_error_set(err, r, "starting the gVisor sandbox: %s%s%s", why,
                                       *tail ? "; runsc: " : "", tail);
        }
        return 0;
}

int gvisor_start(hutch_sandbox *sb, const hutch_template *tpl, const char *layer_from,
                 const hutch_volume_mount *vols, size_t n_vols, const char *hostname,
                 uint16_t egress_port, const char *image_dir, int timeout_ms, hutch_error *err) {
        hutch_ctx *ctx = sb->ctx;
        char init_path[PATH_MAX], scratch[PATH_MAX], p[PATH_MAX];
        int r;

        sb->egress_port = egress_port;
        if ((r = guest_init_file(ctx, init_path, sizeof init_path, err)) < 0)
                return r;
        snprintf(p, sizeof p, "%s/bundle", sb->dir);
        if (mkdir(p, 0700) < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", p);
        snprintf(p, sizeof p, "%s/runsc", sb->dir);
        if (mkdir(p, 0700) < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", p);
        /* an image or built template: the layers stacked at <dir>/root */
        if ((r = gvisor_root_prepare(sb, tpl, layer_from, vols, n_vols, err)) < 0)
                return r;
        snprintf(p, sizeof p, "%s/root", sb->dir);
        if ((r = write_spec(sb, tpl, r > 0 ? p : tpl->rootfs, vols, n_vols, hostname, init_path,
                            egress_port, err)) < 0)
                return r;
        /* The relay's scratch space (whole files on their way out) on the
         * data dir's disk, owned by the relay's uid. */
        snprintf(p, sizeof p, "%s/gvisor", ctx->data_dir);
        if ((r = mkdir_p(p, 0711)) < 0)
                return hutch_error_set(err, r, "creating %s: %s", p, strerror(-r));
        if ((r = gvisor_scratch_path(ctx, sb->id, scratch, sizeof scratch)) < 0)
                return hutch_error_set(err, r, "data dir path too long");
        (void) rm_rf_at(AT_FDCWD, scratch);
        if (mkdir(scratch, 0700) < 0 || chown(scratch, sb->uid_base, sb->uid_base) < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", scratch);
        return gvisor_launch(sb, image_dir, timeout_ms, err);
}

/* Kill what runs in the sandbox's cgroup except the relay, which reaps
 * runsc's orphans as they die and then exits itself (killing it first
 * would leave them to a host init that may never reap). */
int gvisor_kill_runtime(hutch_sandbox *sb) {
        if (!sb->cg || sb->init_pid <= 0)
                return 0;
        if (cgroup_is_frozen(sb->cg) == 1 && cgroup_thaw(sb->cg, NULL) >= 0)
                sb->frozen = false;
        for (unsigned round = 0; round < 4; round++) {
                int n = cgroup_signal_others(sb->cg, sb->init_pid, SIGKILL);
                if (n <= 0)
                        return n;
        }
        return 0;
}

int hutch_gvisor_probe(hutch_ctx *ctx, char *ret_info, size_t n, hutch_error *err) {
        char runsc[PATH_MAX];
        if (gvisor_runsc_path(ctx, runsc, sizeof runsc) < 0)
                return hutch_error_set(err, -ENOPKG, "runsc not found%s%s (apt install runsc)",
                                       *ctx->runsc ? " at " : "", ctx->runsc);
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return hutch_error_set(err, -errno, "pipe: %m");
        pid_t pid = fork();
        if (pid == 0) {
                int devnull = open("/dev/null", O_RDWR);
                if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(p[1], 1) < 0 || dup2(devnull, 2) < 0)
                        _exit(127);
                execl(runsc, runsc, "--version", (char *) NULL);
                _exit(127);
        }
        close(p[1]);
        if (pid < 0) {
                close(p[0]);
                return hutch_error_set(err, -errno, "fork: %m");
        }
        char out[256] = "";
        size_t got = 0;
        struct pollfd pf = { .fd = p[0], .events = POLLIN };
        while (got < sizeof out - 1 && poll(&pf, 1, 5000) == 1) {
                ssize_t k = read(p[0], out + got, sizeof out - 1 - got);
                if (k <= 0)
                        break;
                got += (size_t) k;
        }
        out[got] = 0;
        close(p[0]);
        (void) kill(pid, SIGKILL);
        int st = 0;
        (void) waitpid(pid, &st, 0);
        /* "runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n" */
        const char *v = strstr(out, "runsc version ");
        if (!v)
                return hutch_error_set(err, -ENOEXEC, "%s --version did not answer as runsc does", runsc);
        v += strlen("runsc version ");
        size_t vl = strcspn(v, "\n");
        snprintf(ret_info, n, "%s %.*s, platform %s", runsc, (int) vl, v, ctx->gvisor_platform);
        return 0;
}

/* ------------------------------------------------------- checkpoints */

/* The stream hutch_sandbox_checkpoint writes and create's checkpoint_from
 * reads (sealed at rest by the daemon):
 *   "HUTCHGV2", u32 token length, the token (init's, which the restored
 *   init still holds), u32 file count, then per file of runsc's image
 *   directory: u16 name length, name, u64 size, the bytes. */
#define CKPT_MAGIC "HUTCHGV2"
/* before the sized writable layer (runsc's own overlay then): such a
 * sandbox's mounts do not match today's spec, so it cannot be restored */
#define CKPT_MAGIC_V1 "HUTCHGV1"
#define CKPT_MAX_FILES 64
/* hutch's own entry in the stream (not runsc's): the count of volume
 * mounts the sandbox had, in decimal */
#define CKPT_VOLUMES "hutch-volumes"

static int runsc_wait(pid_t pid, int timeout_ms) {
        int pfd = sys_pidfd_open(pid, 0);
        if (pfd >= 0) {
                struct pollfd p = { .fd = pfd, .events = POLLIN };
                int k;
                do
                        k = poll(&p, 1, timeout_ms);
                while (k < 0 && errno == EINTR);
                close(pfd);
                if (k == 0) {
                        (void) kill(pid, SIGKILL);
                        (void) waitpid(pid, NULL, 0);
                        return -ETIMEDOUT;
                }
        }
        int st = 0;
        if (waitpid(pid, &st, 0) < 0)
                return -errno;
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

static int relay_call(hutch_sandbox *sb, uint16_t type, hutch_error *err) {
        (void) initconn_begin(sb, type);
        return initconn_call(sb, NULL, 0, NULL, NULL, 30000, err);
}

/* Start one runsc command (checkpoint, delete): stdin and stdout on
 * /dev/null, stderr too when quiet (else runsc's complaints reach the
 * daemon's log), in the network namespace netns_fd when it is >= 0.
 * Returns its pid (runsc_wait reaps it) or -1 with errno. */
static pid_t runsc_spawn(const char *runsc, char *const argv[], int netns_fd, bool quiet) {
        pid_t pid = fork();
        if (pid == 0) {
                int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
                if ((netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) < 0) || devnull < 0 || dup2(devnull, 0) < 0 ||
                    dup2(devnull, 1) < 0 || (quiet && dup2(devnull, 2) < 0))
                        _exit(127);
                execv(runsc, argv);
                _exit(127);
        }
        return pid;
}

/* What runsc keeps of a container in its --root (the .state and .lock files)
 * goes when `runsc run` ends on its own; the relay SIGKILLs runsc when the
 * guest's connection resets first, which after a checkpoint it can (a race
 * that load makes likely), and the next `runsc run` of the same id then
 * fails: "container already exists". Before a restore the old runtime is
 * gone (the checkpoint stopped it, the relay exited): ask runsc to forget
 * the container, and remove its files if it cannot. */
static void runsc_forget_stale(hutch_sandbox *sb) {
        char state[PATH_MAX], lock[PATH_MAX], runsc[PATH_MAX], a_root[PATH_MAX + 8];
        snprintf(state, sizeof state, "%s/runsc/%s_sandbox:%s.state", sb->dir, sb->id, sb->id);
        snprintf(lock, sizeof lock, "%s/runsc/%s_sandbox:%s.lock", sb->dir, sb->id, sb->id);
        if (access(state, F_OK) < 0)
                return;
        if (gvisor_runsc_path(sb->ctx, runsc, sizeof runsc) == 0) {
                snprintf(a_root, sizeof a_root, "--root=%s/runsc", sb->dir);
                char *argv[] = { runsc, a_root, (char *) "delete", (char *) "--force", sb->id, NULL };
                pid_t pid = runsc_spawn(runsc, argv, -1, true);
                if (pid > 0)
                        (void) runsc_wait(pid, 10000);
        }
        (void) unlink(state);
        (void) unlink(lock);
}

/* Wait (bounded) for the relay to exit once its runtime is gone, and reap
 * it when it is our child. */
static void relay_wait_gone(hutch_sandbox *sb, int timeout_ms) {
        struct pollfd pf = { .fd = sb->init_pidfd, .events = POLLIN };
        if (poll(&pf, 1, timeout_ms) == 1 && sb->is_parent)
                (void) waitpid(sb->init_pid, NULL, WNOHANG);
}

/* Checkpoint to out_fd; then restore the sandbox at once (a snapshot), or
 * leave it stopped (suspend). */
static int gvisor_checkpoint(hutch_sandbox *sb, int out_fd, uint64_t *ret_bytes, bool suspend,
                             hutch_error *err) {
        if (sb->suspended)
                return hutch_error_set(err, -EAGAIN, "sandbox %s is suspended: its checkpoint is on disk already",
                                       sb->id);
        if (sb->init_pidfd < 0)
                return hutch_error_set(err, -ESRCH, "sandbox %s is not running", sb->id);
        hutch_ctx *ctx = sb->ctx;
        char runsc[PATH_MAX], dir[PATH_MAX];
        if (gvisor_runsc_path(ctx, runsc, sizeof runsc) < 0)
                return hutch_error_set(err, -ENOPKG, "runsc not found");
        snprintf(dir, sizeof dir, "%s/gvisor/.ckpt-%s-XXXXXX", ctx->data_dir, sb->id);
        if (!mkdtemp(dir))
                return hutch_error_set(err, -errno, "creating a checkpoint directory: %m");
        /* the sentry saves itself: it must run; a paused sandbox is thawed
         * for the checkpoint and frozen again */
        bool frozen = sb->cg && cgroup_is_frozen(sb->cg) == 1;
        int r = frozen ? cgroup_thaw(sb->cg, err) : 0;
        if (frozen && r >= 0)
                sb->frozen = false; /* init answers again (initconn_call) */
        bool synced = false;
        if (r >= 0 && (r = relay_call(sb, INITPROTO_RELAY_SYNC, err)) >= 0)
                synced = true;
        if (r >= 0) {
                char a_root[PATH_MAX + 8], a_plat[80], a_img[PATH_MAX + 16];
                snprintf(a_root, sizeof a_root, "--root=%s/runsc", sb->dir);
                snprintf(a_plat, sizeof a_plat, "--platform=%s", ctx->gvisor_platform);
                snprintf(a_img, sizeof a_img, "--image-path=%s", dir);
                /* not --leave-running: this runsc implements it as a kill and
                 * an in-place restore, which cannot keep our stdio; the
                 * sandbox is restored below, by a new relay */
                char *argv[] = { runsc, a_root, (char *) "--network=none", a_plat, (char *) "--overlay2=none",
                                 (char *) "--ignore-cgroups", (char *) "checkpoint", a_img, sb->id, NULL };
                /* runsc reaches the sentry through an abstract socket,
                 * which lives in the relay's network namespace */
                char nsp[64];
                snprintf(nsp, sizeof nsp, "/proc/%d/ns/net", (int) sb->init_pid);
                int nsfd = open(nsp, O_RDONLY | O_CLOEXEC);
                pid_t pid = nsfd < 0 ? -1 : runsc_spawn(runsc, argv, nsfd, false);
                if (nsfd >= 0)
                        close(nsfd);
                if (pid < 0)
                        r = hutch_error_set(err, -errno, "starting runsc checkpoint: %m");
                else if ((r = runsc_wait(pid, 120000)) < 0)
                        hutch_error_set(err, r, "runsc checkpoint %s", r == -ETIMEDOUT ? "timed out" : "failed");
        }
        bool stopped = false;
        if (r >= 0) {
                /* the sentry is gone; the relay reaps runsc and exits */
                relay_wait_gone(sb, 10000);
                stopped = true;
        } else if (synced) {
                /* the checkpoint failed and the sandbox still runs: let it go on */
                hutch_error e2 = { 0 };
                (void) relay_call(sb, INITPROTO_RELAY_UNSYNC, &e2);
        }
        uint64_t total = 0;
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = r >= 0 && dfd >= 0 ? fdopendir(dup(dfd)) : NULL;
        if (r >= 0 && !d)
                r = hutch_error_set(err, -errno, "reading the checkpoint: %m");
        if (r >= 0) {
                /* header; the file count is patched in after the walk */
                uint32_t tl = (uint32_t) strlen(sb->token), nf = 0;
                r = fd_write_all(out_fd, CKPT_MAGIC, 8) < 0 || fd_write_all(out_fd, &tl, 4) < 0 || fd_write_all(out_fd, sb->token, tl) < 0
                            ? -EIO
                            : 0;
                off_t count_at = lseek(out_fd, 0, SEEK_CUR);
                if (r >= 0 && (count_at < 0 || fd_write_all(out_fd, &nf, 4) < 0))
                        r = -EIO;
                for (struct dirent *de; r >= 0 && (de = readdir(d));) {
                        if (de->d_name[0] == '.')
                                continue;
                        int f = openat(dfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                        struct stat st;
                        if (f < 0 || fstat(f, &st) < 0 || !S_ISREG(st.st_mode) || nf >= CKPT_MAX_FILES) {
                                if (f >= 0)
                                        close(f);
                                r = -EIO;
                                break;
                        }
                        uint16_t nl = (uint16_t) strlen(de->d_name);
                        uint64_t sz = (uint64_t) st.st_size;
                        if (fd_write_all(out_fd, &nl, 2) < 0 || fd_write_all(out_fd, de->d_name, nl) < 0 || fd_write_all(out_fd, &sz, 8) < 0)
                                r = -EIO;
                        static char buf[1 << 16];
                        for (uint64_t left = sz; r >= 0 && left > 0;) {
                                ssize_t k = read(f, buf, left < sizeof buf ? left : sizeof buf);
                                if (k <= 0 || fd_write_all(out_fd, buf, (size_t) k) < 0)
                                        r = -EIO;
                                else
                                        left -= (uint64_t) k;
                        }
                        close(f);
                        total += sz;
                        nf++;
                }
                /* the volume mounts runsc will want at a restore (a copy
                 * gets read-only stand-ins: a snapshot holds no volume) */
                size_t slots = gvisor_volume_slots(sb);
                if (r >= 0 && slots > 0) {
                        char v[8];
                        uint16_t nl = (uint16_t) strlen(CKPT_VOLUMES);
                        uint64_t sz = (uint64_t) snprintf(v, sizeof v, "%zu", slots);
                        if (fd_write_all(out_fd, &nl, 2) < 0 ||
                            fd_write_all(out_fd, CKPT_VOLUMES, nl) < 0 ||
                            fd_write_all(out_fd, &sz, 8) < 0 ||
                            fd_write_all(out_fd, v, (size_t) sz) < 0)
                                r = -EIO;
                        nf++;
                }
                if (r >= 0 && pwrite(out_fd, &nf, 4, count_at) != 4)
                        r = -EIO;
                if (r < 0)
                        hutch_error_set(err, r, "writing the checkpoint stream");
        }
        if (d)
                closedir(d);
        if (stopped && suspend && r >= 0) {
                /* stays stopped; the stream is all that is left of it, and
                 * runsc keeps nothing of it either (a runsc the relay killed
                 * leaves its container's files) */
                runsc_forget_stale(sb);
                r = gvisor_after_suspend(sb, err);
                stopped = r < 0; /* cannot record that: bring it back */
        }
        if (stopped && !sb->suspended) {
                /* the sandbox goes on from its own checkpoint: same id,
                 * token, cgroup and files; its connections and process
                 * streams were the old relay's and have ended */
                hutch_error e2 = { 0 };
                runsc_forget_stale(sb);
                int k = gvisor_launch(sb, dir, GVISOR_READY_TIMEOUT_MS, &e2);
                if (k >= 0)
                        k = gvisor_after_launch(sb, &e2);
                if (k < 0 && r >= 0)
                        r = hutch_error_set(err, k, "restoring the sandbox after its checkpoint: %s", e2.msg);
                if (k >= 0 && frozen && cgroup_freeze(sb->cg, &e2) >= 0)
                        sb->frozen = true;
        } else if (frozen && !sb->suspended) {
                hutch_error e2 = { 0 };
                if (cgroup_freeze(sb->cg, &e2) >= 0)
                        sb->frozen = true;
        }
        (void) rm_rf_at(AT_FDCWD, dir);
        if (r < 0)
                return r;
        if (ret_bytes)
                *ret_bytes = total;
        return 0;
}

/* A suspended sandbox's restore from its checkpoint, under the busy lock. */
static int gvisor_resume(hutch_sandbox *sb, const char *stream_path, hutch_error *err) {
        char dir[PATH_MAX], token[HUTCH_TOKEN_LEN + 1];
        snprintf(dir, sizeof dir, "%s/gvisor/.resume-%s", sb->ctx->data_dir, sb->id);
        int r = gvisor_unpack(stream_path, dir, token, NULL, err);
        if (r >= 0 && !streq(token, sb->token))
                r = hutch_error_set(err, -EBADMSG, "the checkpoint is not sandbox %s's", sb->id);
        if (r >= 0) {
                runsc_forget_stale(sb);
                r = gvisor_launch(sb, dir, GVISOR_READY_TIMEOUT_MS, err);
        }
        if (r >= 0)
                r = gvisor_after_launch(sb, err);
        if (r < 0 && sb->init_pidfd >= 0) {
                /* a relay started and the restore failed: stop what it
                 * started; the sandbox stays suspended, for another try */
                (void) gvisor_kill_runtime(sb);
                relay_wait_gone(sb, 5000);
                (void) gvisor_after_suspend(sb, NULL);
        }
        (void) rm_rf_at(AT_FDCWD, dir);
        return r;
}

int hutch_checkpoint_leftovers_remove(hutch_ctx *ctx) {
        /* the ".ckpt-" dirs of checkpoint() and ".resume-" of resume_from */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/gvisor", ctx->data_dir);
        DIR *d = opendir(dir);
        int removed = 0;
        for (struct dirent *de; d && (de = readdir(d));)
                if ((strncmp(de->d_name, ".ckpt-", 6) == 0 || strncmp(de->d_name, ".resume-", 8) == 0) &&
                    rm_rf_at(dirfd(d), de->d_name) >= 0)
                        removed++;
        if (d)
                closedir(d);
        return removed;
}

bool hutch_stream_is_checkpoint(const char *path) {
        char magic[8];
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        return fd >= 0 && fd_read_full(fd, magic, 8) == 8 &&
               (memcmp(magic, CKPT_MAGIC, 8) == 0 || memcmp(magic, CKPT_MAGIC_V1, 8) == 0);
}

/* Unpack a checkpoint stream into dir (created here, root only), and the
 * token its init holds into ret_token. */
int gvisor_unpack(const char *stream, const char *dir, char ret_token[HUTCH_TOKEN_LEN + 1],
                  unsigned *ret_vol_slots, hutch_error *err) {
        if (ret_vol_slots)
                *ret_vol_slots = 0;
        _cleanup_close_ int in = open(stream, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in < 0)
                return hutch_error_set(err, -errno, "opening the checkpoint: %m");
        char magic[8];
        uint32_t tl = 0, nf = 0;
        if (fd_read_full(in, magic, 8) != 8)
                return hutch_error_set(err, -EBADMSG, "not a gvisor checkpoint");
        if (memcmp(magic, CKPT_MAGIC_V1, 8) == 0)
                return hutch_error_set(err, -EPROTONOSUPPORT,
                                       "a gvisor checkpoint of an older hutch (its sandbox had no sized writable "
                                       "layer): it cannot be restored");
        if (memcmp(magic, CKPT_MAGIC, 8) != 0 || fd_read_full(in, &tl, 4) != 4 ||
            tl != HUTCH_TOKEN_LEN || fd_read_full(in, ret_token, tl) != (ssize_t) tl)
                return hutch_error_set(err, -EBADMSG, "not a gvisor checkpoint");
        ret_token[tl] = 0;
        for (size_t i = 0; i < tl; i++)
                if (!((ret_token[i] >= '0' && ret_token[i] <= '9') || (ret_token[i] >= 'a' && ret_token[i] <= 'f')))
                        return hutch_error_set(err, -EBADMSG, "not a gvisor checkpoint");
        if (fd_read_full(in, &nf, 4) != 4 || nf == 0 || nf > CKPT_MAX_FILES)
                return hutch_error_set(err, -EBADMSG, "a damaged gvisor checkpoint");
        (void) rm_rf_at(AT_FDCWD, dir);
        if (mkdir(dir, 0700) < 0)
                return hutch_error_set(err, -errno, "creating %s: %m", dir);
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return hutch_error_set(err, -errno, "opening %s: %m", dir);
        static char buf[1 << 16];
        for (uint32_t i = 0; i < nf; i++) {
                uint16_t nl = 0;
                uint64_t sz = 0;
                char name[256];
                if (fd_read_full(in, &nl, 2) != 2 || nl == 0 || nl > 255 || fd_read_full(in, name, nl) != nl ||
                    fd_read_full(in, &sz, 8) != 8)
                        return hutch_error_set(err, -EBADMSG, "a damaged gvisor checkpoint");
                name[nl] = 0;
                if (streq(name, CKPT_VOLUMES)) {
                        char v[8] = "";
                        if (sz == 0 || sz >= sizeof v ||
                            fd_read_full(in, v, (size_t) sz) != (ssize_t) sz || atoi(v) <= 0 ||
                            atoi(v) > HUTCH_VOLUMES_MAX)
                                return hutch_error_set(err, -EBADMSG, "a damaged gvisor checkpoint");
                        if (ret_vol_slots)
                                *ret_vol_slots = (unsigned) atoi(v);
                        continue;
                }
                for (size_t k = 0; k < nl; k++)
                        if (!((name[k] >= 'a' && name[k] <= 'z') || (name[k] >= 'A' && name[k] <= 'Z') ||
                              (name[k] >= '0' && name[k] <= '9') || name[k] == '.' || name[k] == '_' || name[k] == '-') ||
                            name[0] == '.')
                                return hutch_error_set(err, -EBADMSG, "a gvisor checkpoint with a bad file name");
                _cleanup_close_ int out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (out < 0)
                        return hutch_error_set(err, -errno, "writing the checkpoint: %m");
                for (uint64_t left = sz; left > 0;) {
                        ssize_t k = read(in, buf, left < sizeof buf ? left : sizeof buf);
                        if (k <= 0)
                                return hutch_error_set(err, -EBADMSG, "a truncated gvisor checkpoint");
                        if (fd_write_all(out, buf, (size_t) k) < 0)
                                return hutch_error_set(err, -EIO, "writing the checkpoint: %m");
                        left -= (uint64_t) k;
                }
        }
        return 0;
}

/* hutch-init's listener for the egress proxy (the network is the sentry's). */
static int gvisor_set_network(hutch_sandbox *sb, bool on, hutch_error *err) {
        initproto_writer *w = initconn_begin(sb, INITPROTO_NET_LISTEN);
        initproto_put_u64(w, T_FLAGS, on ? 1 : 0);
        return initconn_call(sb, NULL, 0, NULL, NULL, 10000, err);
}

/* ------------------------------------------------------------- the backend */

/* After a (re)launch: the relay's start time, and the state file. */
int gvisor_after_launch(hutch_sandbox *sb, hutch_error *err) {
        int r = sandbox_proc_starttime(sb->init_pid, &sb->init_starttime);
        if (r < 0)
                return hutch_error_set(err, r, "reading the relay's start time: %s", strerror(-r));
        sb->suspended = false;
        return sandbox_state_write(sb, err);
}

int gvisor_after_suspend(hutch_sandbox *sb, hutch_error *err) {
        sb->init_pidfd = safe_close(sb->init_pidfd);
        sb->conn = safe_close(sb->conn);
        sb->init_pid = 0;
        sb->init_starttime = 0;
        sb->suspended = true;
        int r = sandbox_state_write(sb, err);
        if (r < 0)
                sb->suspended = false;
        return r;
}

static int gvisor_check(const hutch_sandbox_config *cfg, hutch_error *err) {
        /* The gvisor layer is a tmpfs in the sentry, which refuses
         * nr_inodes (EINVAL): an inode limit asked for would not hold */
        if (cfg->limits.disk_inodes)
                return hutch_error_set(
                        err, -EOPNOTSUPP,
                        "an inode limit is not supported on the gvisor backend: its writable layer "
                        "has none (only its size and the memory limit bound it)");
        if (cfg->layer_image)
                return hutch_error_set(err, -EOPNOTSUPP,
                                       "a gvisor sandbox cannot take over a layer image");
        /* runsc restores a checkpoint into the mounts it was taken with
         * only, and a snapshot never holds a volume */
        if (cfg->checkpoint_from && cfg->n_volumes > 0 && cfg->n_volumes <= HUTCH_VOLUMES_MAX &&
            cfg->volumes)
                return hutch_error_set(err, -EOPNOTSUPP,
                                       "a gvisor sandbox restored from a snapshot cannot mount volumes "
                                       "(docs/volumes.md)");
        /* runsc passes GPUs through only with its nvproxy (runsc
         * --nvproxy, gVisor 2023 and later), which hutch does not drive
         * yet (docs/gpu.md) */
        if (cfg->gpus && hutch_gpu_spec_check(cfg->gpus, NULL) > 0)
                return hutch_error_set(
                        err, -EOPNOTSUPP,
                        "GPUs are not supported on the gvisor backend: runsc reaches a GPU only through "
                        "its nvproxy (runsc --nvproxy), which hutch does not set up (docs/gpu.md); use "
                        "the ns backend");
        return 0;
}

/* runsc's own threads and memory on top of the sandbox's (GVISOR_*_OVERHEAD). */
static void gvisor_cgroup_limits(hutch_limits *l) {
        l->memory_bytes += l->memory_bytes / 2 + GVISOR_MEMORY_OVERHEAD;
        l->pids = l->pids > (UINT64_MAX - GVISOR_PIDS_OVERHEAD) / GVISOR_PIDS_PER_PROC
                ? UINT64_MAX
                : l->pids * GVISOR_PIDS_PER_PROC + GVISOR_PIDS_OVERHEAD;
}

/* From a checkpoint (cfg->checkpoint_from), the image unpacked into img,
 * and the stand-ins of the volumes it had recorded; else nothing. */
static int gvisor_create_image(hutch_sandbox *sb, const hutch_sandbox_config *cfg,
                               char img[PATH_MAX], unsigned *ret_standins, hutch_error *err) {
        hutch_ctx *ctx = sb->ctx;
        unsigned standins = 0;
        int r;
        if (cfg->checkpoint_from) {
                /* the restored init holds the checkpointed one's token */
                char parent[PATH_MAX];
                snprintf(parent, sizeof parent, "%s/gvisor", ctx->data_dir);
                snprintf(img, PATH_MAX, "%s/.restore-%s", parent, sb->id);
                (void) mkdir_p(parent, 0711);
                if ((r = gvisor_unpack(cfg->checkpoint_from, img, sb->token, &standins, err)) < 0)
                        return r;
        }
        /* a copy of a sandbox that mounted volumes: as many stand-ins */
        if (standins > 0) {
                char p[PATH_MAX], v[8];
                snprintf(p, sizeof p, "%s/" GVISOR_STANDINS_FILE, sb->dir);
                int k = snprintf(v, sizeof v, "%u\n", standins);
                if ((r = write_file_atomic(p, v, (size_t) k, 0600)) < 0)
                        return hutch_error_set(err, r, "writing %s: %s", p, strerror(-r));
        }
        *ret_standins = standins;
        return 0;
}

static int gvisor_create(hutch_sandbox *sb, sandbox_create_args *a, hutch_error *err) {
        const hutch_sandbox_config *cfg = a->cfg;
        char img[PATH_MAX] = "";
        unsigned standins = 0;
        int r;
        /* a layer stream is a built template's layer: read-only under
         * the sandbox's writable layer (gvisor-root.c) */
        if (cfg->layer_from && (r = sandbox_storage_ensure(sb->ctx, err)) < 0)
                return r;
        if ((r = gvisor_create_image(sb, cfg, img, &standins, err)) < 0) {
                if (img[0])
                        (void) rm_rf_at(AT_FDCWD, img);
                return r;
        }
        /* recorded first: every launch (a resume too) mounts them
         * again from the list (gvisor-root.c) */
        if (cfg->n_volumes > 0 &&
            (r = volume_state_write(sb->dir, cfg->volumes, cfg->n_volumes, err)) < 0)
                return r;
        r = gvisor_start(sb, a->tpl, cfg->layer_from, standins ? NULL : cfg->volumes,
                         standins ? standins : cfg->n_volumes, a->hostname,
                         cfg->egress_port ? cfg->egress_port : 3128, img[0] ? img : NULL,
                         GVISOR_READY_TIMEOUT_MS, err);
        if (img[0])
                (void) rm_rf_at(AT_FDCWD, img); /* runsc has read it, or failed */
        if (r < 0)
                return r;
        return gvisor_after_launch(sb, err);
}

/* The relay's scratch dir (init/relay.c), in the data dir. */
static int gvisor_remove(hutch_sandbox *sb, hutch_error *err) {
        char scratch[PATH_MAX];
        if (gvisor_scratch_path(sb->ctx, sb->id, scratch, sizeof scratch) < 0)
                return 0;
        int r = rm_rf_at(AT_FDCWD, scratch);
        if (r < 0 && r != -ENOENT)
                return hutch_error_set(err, r, "removing %s: %s", scratch, strerror(-r));
        return 0;
}

static void gvisor_usage(hutch_sandbox *sb, hutch_stats *s) {
        s->oom_kills += gvisor_oom_kills(sb);
        s->disk_used = gvisor_disk_used(sb);
}

static int gvisor_layer_open(hutch_sandbox *sb, hutch_layer_source *ret, hutch_error *err) {
        (void) sb;
        (void) ret;
        return hutch_error_set(err, -EOPNOTSUPP,
                               "snapshots of gvisor sandboxes are not available: their files live in "
                               "the sandbox's memory, which this hutch cannot checkpoint yet");
}

const hutch_backend_ops backend_gvisor = {
        .name = "gvisor",
        .caps = HUTCH_BACKEND_CHECKPOINTS | HUTCH_BACKEND_FILES_IN_MEMORY | HUTCH_BACKEND_OWN_NETSTACK,
        .check = gvisor_check,
        .cgroup_limits = gvisor_cgroup_limits,
        .create = gvisor_create,
        .adopt = gvisor_volumes_hold,
        .release = gvisor_volumes_release,
        .stop = gvisor_kill_runtime,
        .remove = gvisor_remove,
        .usage = gvisor_usage,
        .layer_open = gvisor_layer_open,
        .checkpoint = gvisor_checkpoint,
        .resume = gvisor_resume,
        .set_network = gvisor_set_network,
};
