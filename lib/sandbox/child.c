/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The child half of sandbox creation: everything between clone3() and the
 * exec of hutch-init, as one checklist (child_setup()).
 *
 * The child is cloned with CLONE_VM (vfork-style, no page-table copy: on
 * this kind of VM that copy costs more than all the namespaces together) and
 * runs on its own stack while the parent waits, first for nothing (the
 * parent writes the id maps and prepares id-mapped mounts while the child
 * blocks in recvmsg), then on the sync pipe until exec or failure. Because
 * memory is shared, the child never allocates and never touches stdio; it
 * reports a failure as a child_error on the sync pipe and _exit()s.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "sandbox/caps.h"
#include "sandbox/sandbox-internal.h"
#include "sandbox/seccomp.h"
#include "util/macro.h"
#include "util/syscalls.h"

/* ------------------------------------------------------------ clone3 trampoline */

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl hutch_clone3_raw\n"
        ".type hutch_clone3_raw,@function\n"
        "hutch_clone3_raw:\n"          /* rdi=args rsi=size rdx=fn rcx=arg */
        "        mov %rcx, %r8\n"
        "        mov %rdx, %r9\n"
        "        mov $435, %eax\n"     /* __NR_clone3 */
        "        syscall\n"
        "        test %rax, %rax\n"
        "        jnz 1f\n"
        "        xor %ebp, %ebp\n"     /* child: on the new stack */
        "        mov %r8, %rdi\n"
        "        call *%r9\n"
        "        mov %eax, %edi\n"
        "        mov $60, %eax\n"      /* __NR_exit */
        "        syscall\n"
        "        hlt\n"
        "1:      ret\n"
        ".size hutch_clone3_raw, .-hutch_clone3_raw\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl hutch_clone3_raw\n"
        ".type hutch_clone3_raw,%function\n"
        "hutch_clone3_raw:\n"          /* x0=args x1=size x2=fn x3=arg */
        "        mov x9, x2\n"
        "        mov x10, x3\n"
        "        mov x8, #435\n"
        "        svc #0\n"
        "        cbnz x0, 1f\n"
        "        mov x29, #0\n"
        "        mov x0, x10\n"
        "        blr x9\n"
        "        mov x8, #93\n"        /* __NR_exit */
        "        svc #0\n"
        "        brk #0\n"
        "1:      ret\n"
        ".size hutch_clone3_raw, .-hutch_clone3_raw\n");
#else
#error "clone3 trampoline missing for this architecture"
#endif

long hutch_clone3_raw(struct clone_args *args, size_t size, int (*fn)(void *), void *arg);

pid_t clone3_with_fn(struct clone_args *args, int (*fn)(void *), void *arg) {
        long r = hutch_clone3_raw(args, sizeof *args, fn, arg);
        if (r < 0) {
                errno = (int) -r;
                return -1;
        }
        return (pid_t) r;
}

/* ------------------------------------------------------------------ helpers */

static _Noreturn void child_fail(const child_config *c, int err, const char *what) {
        child_error e = { .code = -err };
        /* no snprintf: shared memory with a parent that may hold stdio locks */
        size_t n = strlen(what);
        if (n > sizeof e.msg - 1)
                n = sizeof e.msg - 1;
        memcpy(e.msg, what, n);
        (void) !write(c->sync_fd, &e, sizeof e);
        _exit(127);
}

#define CHECK(c, expr, what)                                                                       \
        do {                                                                                       \
                if ((expr) < 0)                                                                    \
                        child_fail((c), errno, (what));                                           \
        } while (0)

/* Append src to dst (bounded), no libc formatting. */
static void cat(char *dst, size_t n, const char *src) {
        size_t l = strlen(dst), k = strlen(src);
        if (l + k >= n)
                k = n - l - 1;
        memcpy(dst + l, src, k);
        dst[l + k] = 0;
}

static void u64_to_str(uint64_t v, char *buf) {
        char tmp[24];
        int i = 0;
        do
                tmp[i++] = (char) ('0' + v % 10);
        while ((v /= 10) > 0);
        for (int j = 0; j < i; j++)
                buf[j] = tmp[i - 1 - j];
        buf[i] = 0;
}

static int bind_dev(const char *name) {
        char src[32] = "/dev/", dst[32] = "dev/";
        cat(src, sizeof src, name);
        cat(dst, sizeof dst, name);
        int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -1;
        close(fd);
        return mount(src, dst, NULL, MS_BIND, NULL);
}

/* OCI's default masked and read-only /proc paths (runtime-spec config-linux),
 * and what else names the host's devices, storage or identity: block
 * devices with their sizes and I/O (every sandbox's loop-backed layer),
 * swap files by path, md arrays, the kernel command line, the hardware's
 * memory and I/O map; /proc/fs (ext4 and jbd2 by device), /proc/bus (PCI and
 * input devices), /proc/irq (by device), /proc/spl (ZFS pools). What stays
 * visible, and why, is in docs/security.md. */
static const char *const proc_masked_files[] = {
        "proc/kcore",       "proc/keys",        "proc/latency_stats", "proc/timer_list",
        "proc/timer_stats", "proc/sched_debug", "proc/interrupts",    "proc/kallsyms",
        "proc/partitions",  "proc/diskstats",   "proc/swaps",         "proc/mdstat",
        "proc/cmdline",     "proc/iomem",       "proc/ioports",       NULL,
};
static const char *const proc_masked_dirs[] = {
        "proc/acpi", "proc/scsi", "proc/asound", "proc/driver", "proc/fs",
        "proc/bus",  "proc/irq",  "proc/spl",    NULL,
};
static const char *const proc_readonly[] = { "proc/sys", "proc/sysrq-trigger", NULL };

/* The host's boot id is none of the sandbox's business (it identifies the
 * host across sandboxes): each sandbox gets its own, from a file in its own
 * root that is bound over /proc/sys/kernel/random/boot_id. Rewriting that
 * file in place (the daemon does on a cold reboot) changes the boot id. */
static void setup_boot_id(const child_config *c) {
        uint8_t b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t) sizeof b)
                child_fail(c, errno ? errno : EIO, "getrandom for the boot id");
        b[6] = (uint8_t) ((b[6] & 0x0f) | 0x40); /* a version 4 UUID, as the kernel's */
        b[8] = (uint8_t) ((b[8] & 0x3f) | 0x80);
        char id[40];
        int n = snprintf(id, sizeof id,
                         "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1],
                         b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        /* The root's /run is the tenant's: a snapshot or a build step can
         * leave it a symlink (`ln -s /tmp/x /run`), and until pivot_root
         * this mount namespace's "/" is the host's tree, where a plain
         * mkdir("run/hutch") would follow it and create on the host. Every
         * path here is resolved inside the sandbox's root instead. */
        int rootfd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
        CHECK(c, rootfd, "opening the root");
        if (mkdirat(rootfd, "run", 0755) < 0 && errno != EEXIST)
                child_fail(c, errno, "creating /run");
        struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
        int runfd = sys_openat2(rootfd, "run", &how, sizeof how);
        CHECK(c, runfd, "opening /run inside the sandbox's root");
        if (mkdirat(runfd, "hutch", 0755) < 0 && errno != EEXIST)
                child_fail(c, errno, "creating /run/hutch");
        close(runfd);
        how = (struct open_how) { .flags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                                  .mode = 0644,
                                  .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
        int fd = sys_openat2(rootfd, "run/hutch/boot_id", &how, sizeof how);
        CHECK(c, fd, "creating the boot id");
        close(rootfd);
        if (write(fd, id, (size_t) n) != n)
                child_fail(c, errno ? errno : EIO, "writing the boot id");
        /* a bind of that very file, not of a path looked up again */
        int m = sys_open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        CHECK(c, m, "cloning the boot id");
        close(fd);
        CHECK(c, sys_move_mount(m, "", AT_FDCWD, "proc/sys/kernel/random/boot_id", MOVE_MOUNT_F_EMPTY_PATH),
              "masking the host's boot id");
        close(m);
        /* read-only through /proc, like the rest of /proc/sys */
        CHECK(c,
              mount(NULL, "proc/sys/kernel/random/boot_id", NULL,
                    MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
              "making the boot id read-only");
}

static void write_small_file(const child_config *c, const char *path, const char *text) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
        CHECK(c, fd, "creating a /proc/driver/nvidia file");
        size_t n = strlen(text);
        if (write(fd, text, n) != (ssize_t) n)
                child_fail(c, errno ? errno : EIO, "writing a /proc/driver/nvidia file");
        close(fd);
}

/* A sandbox with GPUs: /proc/driver holds nvidia/ with what the driver's
 * libraries read (as nvidia-container-toolkit gives a container): the
 * params with ModifyDeviceFiles off, the version, and the directories of
 * the sandbox's own GPUs only. Read-only, like the mask it replaces. */
static void setup_proc_driver_gpu(const child_config *c) {
        const gpu_child *g = c->gpu;
        CHECK(c, mount("tmpfs", "proc/driver", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,nr_inodes=256,mode=0555"),
              "mounting /proc/driver");
        CHECK(c, mkdir("proc/driver/nvidia", 0555), "creating /proc/driver/nvidia");
        CHECK(c, mkdir("proc/driver/nvidia/gpus", 0555), "creating /proc/driver/nvidia/gpus");
        if (g->params[0])
                write_small_file(c, "proc/driver/nvidia/params", g->params);
        if (g->version[0])
                write_small_file(c, "proc/driver/nvidia/version", g->version);
        for (size_t i = 0; i < g->n_proc_gpus; i++) {
                char dst[GPU_NAME_MAX + 32] = "proc/driver/nvidia/gpus/";
                cat(dst, sizeof dst, g->proc_gpus[i].name);
                CHECK(c, mkdir(dst, 0555), "creating a /proc/driver/nvidia/gpus directory");
                CHECK(c, sys_move_mount(g->proc_gpus[i].fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH),
                      "attaching a /proc/driver/nvidia/gpus directory");
        }
        CHECK(c, mount(NULL, "proc/driver", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
              "making /proc/driver read-only");
}

static void setup_proc(const child_config *c) {
        CHECK(c, mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mounting /proc");
        setup_boot_id(c);
        for (const char *const *p = proc_masked_files; *p; p++)
                if (mount("/dev/null", *p, NULL, MS_BIND, NULL) < 0 && errno != ENOENT)
                        child_fail(c, errno, "masking a /proc file");
        for (const char *const *p = proc_masked_dirs; *p; p++) {
                if (c->gpu && c->gpu->proc && streq(*p, "proc/driver")) {
                        setup_proc_driver_gpu(c);
                        continue;
                }
                if (mount("tmpfs", *p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555") < 0 &&
                    errno != ENOENT)
                        child_fail(c, errno, "masking a /proc directory");
        }
        for (const char *const *p = proc_readonly; *p; p++) {
                if (mount(*p, *p, NULL, MS_BIND | MS_REC, NULL) < 0) {
                        if (errno == ENOENT)
                                continue;
                        child_fail(c, errno, "binding a read-only /proc path");
                }
                CHECK(c,
                      mount(NULL, *p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
                      "making a /proc path read-only");
        }
}

static void setup_dev(const child_config *c) {
        static const char *const devs[] = { "null", "zero", "full", "random", "urandom", "tty", NULL };
        static const char *const links[][2] = {
                { "pts/ptmx", "dev/ptmx" },         { "/proc/self/fd", "dev/fd" },
                { "/proc/self/fd/0", "dev/stdin" }, { "/proc/self/fd/1", "dev/stdout" },
                { "/proc/self/fd/2", "dev/stderr" }, { "/proc/kcore", "dev/core" },
        };
        /* a GPU sandbox's nodes too: up to HUTCH_GPUS_MAX + GPU_CTL_MAX more */
        CHECK(c,
              mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC,
                    c->gpu ? "size=64k,nr_inodes=160,mode=0755" : "size=64k,nr_inodes=64,mode=0755"),
              "mounting /dev");
        for (const char *const *d = devs; *d; d++)
                CHECK(c, bind_dev(*d), "binding a device into /dev");
        CHECK(c, mkdir("dev/pts", 0755), "creating /dev/pts");
        CHECK(c, mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"),
              "mounting /dev/pts");
        CHECK(c, mkdir("dev/shm", 01777), "creating /dev/shm");
        CHECK(c, mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=1777"),
              "mounting /dev/shm");
        for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
                if (i < 5) /* /dev/core is left out: kcore is masked anyway */
                        CHECK(c, symlink(links[i][0], links[i][1]), "creating a /dev link");
        /* The GPUs given to the sandbox and the driver's control nodes:
         * binds of the host's nodes (the device cgroup allows exactly
         * these); nothing else of the driver's is in this /dev. */
        for (size_t i = 0; c->gpu && i < c->gpu->n_nodes; i++) {
                char dst[GPU_NAME_MAX + 8] = "dev/";
                cat(dst, sizeof dst, c->gpu->nodes[i].name);
                int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
                CHECK(c, fd, "creating a GPU node's mount point");
                close(fd);
                CHECK(c, sys_move_mount(c->gpu->nodes[i].fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH),
                      "attaching a GPU node");
        }
}

/* /sys is an allowlist: a read-only tmpfs holding only the subtrees that
 * common programs read, bound from a sysfs of the sandbox's own netns. The
 * rest of sysfs is the host's hardware and storage: every loop device with
 * its backing file (each sandbox's layer image: the data directory's path and
 * the sandbox's id), block devices and their I/O counters, /sys/fs/ext4 by
 * device, firmware tables, module parameters, RAPL energy counters
 * (CVE-2020-8694). A denylist would have to follow every kernel release;
 * this list grows only when a program needs more (docs/security.md). */
static const char *const sys_visible[] = {
        "devices/system/cpu",  /* sysconf(_SC_NPROCESSORS_*), os.cpu_count, lscpu, the JVM */
        "devices/system/node", /* ps, top: NUMA nodes */
        "devices/virtual/net", /* the netns's own devices: sysfs shows its mounter's netns only */
        "class/net",           /* links into devices/virtual/net */
        "kernel/mm/transparent_hugepage", /* the JVM, Go's runtime, glibc's malloc tunables */
        "kernel/mm/hugepages",            /* the JVM lists the huge page sizes */
        NULL,
};
/* Nothing is mounted there inside; empty, as in the full sysfs. */
static const char *const sys_empty_dirs[] = { "fs/cgroup", NULL };

/* mkdir -p sys/PATH, without allocating. */
static int mkdir_sys_path(const char *path) {
        char p[128] = "sys/";
        cat(p, sizeof p, path);
        for (char *s = p + 4;; s++) {
                if (*s != '/' && *s != 0)
                        continue;
                char was = *s;
                *s = 0;
                if (mkdir(p, 0755) < 0 && errno != EEXIST)
                        return -1;
                if (!was)
                        return 0;
                *s = was;
        }
}

static void setup_sys(const child_config *c) {
        /* The full sysfs is mounted over the old root's /sys (private to this
         * mount namespace since step 3), so it never enters the sandbox's
         * tree and goes away with the old root at pivot_root, without an
         * umount of its own (each costs an RCU grace period). If the kernel
         * refuses it (a host /sys with locked overmounts), /sys stays empty. */
        if (mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                return;
        if (mount("tmpfs", "sys", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,nr_inodes=32,mode=0555") < 0) {
                if (errno == ENOENT) /* a root without /sys, as before */
                        return;
                child_fail(c, errno, "mounting the /sys tmpfs");
        }
        for (const char *const *p = sys_empty_dirs; *p; p++)
                CHECK(c, mkdir_sys_path(*p), "creating a /sys directory");
        for (const char *const *p = sys_visible; *p; p++) {
                char src[128] = "/sys/", dst[128] = "sys/";
                cat(src, sizeof src, *p);
                cat(dst, sizeof dst, *p);
                CHECK(c, mkdir_sys_path(*p), "creating a /sys directory");
                /* the bind keeps the sysfs mount's flags: read-only, nosuid, nodev, noexec */
                if (mount(src, dst, NULL, MS_BIND, NULL) < 0) {
                        if (errno != ENOENT) /* not in this kernel (no NUMA, no THP) */
                                child_fail(c, errno, "binding a /sys subtree");
                        (void) rmdir(dst);
                }
        }
        CHECK(c,
              mount(NULL, "sys", NULL,
                    MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
              "making /sys read-only");
}

/* ------------------------------------------------------------------ volumes */

typedef struct child_volumes {
        char paths[HUTCH_VOLUMES_MAX][HUTCH_VOLUME_PATH_MAX + 1];
        int fds[HUTCH_VOLUMES_MAX];
        uint32_t n;
} child_volumes;

/* The second bootstrap message (sandbox.c send_volumes). */
static void receive_volumes(const child_config *c, child_volumes *v) {
        char buf[1 + HUTCH_VOLUMES_MAX * (HUTCH_VOLUME_PATH_MAX + 1)];
        struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
        union {
                struct cmsghdr align;
                char b[CMSG_SPACE(sizeof(int) * HUTCH_VOLUMES_MAX)];
        } ctl;
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b };
        ssize_t n;
        do
                n = recvmsg(c->init_conn, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
                child_fail(c, n < 0 ? errno : EPIPE, "waiting for the volume mounts");
        v->n = (uint32_t) (unsigned char) buf[0];
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        size_t nfds = cm && cm->cmsg_type == SCM_RIGHTS ? (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) : 0;
        if (v->n > HUTCH_VOLUMES_MAX || nfds != v->n || (size_t) n != 1 + v->n * (HUTCH_VOLUME_PATH_MAX + 1))
                child_fail(c, EPROTO, "volume message malformed");
        if (nfds)
                memcpy(v->fds, CMSG_DATA(cm), nfds * sizeof(int));
        for (uint32_t i = 0; i < v->n; i++) {
                memcpy(v->paths[i], buf + 1 + i * (HUTCH_VOLUME_PATH_MAX + 1), HUTCH_VOLUME_PATH_MAX + 1);
                v->paths[i][HUTCH_VOLUME_PATH_MAX] = 0;
        }
}

/* The directory at path inside the new root ("/" by now), made as
 * sandbox root where missing, each component entered without following a
 * symlink: the template is not trusted to point it anywhere (a /mnt ->
 * /proc link must not put a volume over /proc). An O_PATH descriptor. */
static int open_mount_point(const child_config *c, const char *path, const char *what_crossed,
                            const char *what_failed) {
        char comp[HUTCH_VOLUME_PATH_MAX + 1];
        int dfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        CHECK(c, dfd, "opening the root");
        for (const char *p = path; *p;) {
                while (*p == '/')
                        p++;
                if (!*p)
                        break;
                const char *e = strchrnul(p, '/');
                size_t len = (size_t) (e - p);
                if (len > HUTCH_VOLUME_PATH_MAX)
                        child_fail(c, ENAMETOOLONG, what_failed);
                memcpy(comp, p, len);
                comp[len] = 0;
                if (mkdirat(dfd, comp, 0755) < 0 && errno != EEXIST)
                        child_fail(c, errno, what_failed);
                int next = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (next < 0)
                        child_fail(c, errno, errno == ELOOP || errno == ENOTDIR ? what_crossed : what_failed);
                close(dfd);
                dfd = next;
                p = e;
        }
        return dfd;
}

/* Attach each volume at its path inside the new root. */
static void attach_volumes(const child_config *c, child_volumes *v) {
        for (uint32_t i = 0; i < v->n; i++) {
                int dfd = open_mount_point(c, v->paths[i], "a volume's mount path crosses a symlink or a file",
                                           "creating a volume's mount point");
                CHECK(c, sys_move_mount(v->fds[i], "", dfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
                      "attaching a volume");
                close(dfd);
                close(v->fds[i]);
        }
}

/* A sandbox with GPUs: the driver's libraries and programs, each a
 * read-only bind of the host's file, in a tmpfs of their own at
 * HUTCH_GPU_DIR (lib/, bin/, the libraries' soname links), read-only
 * once filled. A directory of its own, not the host's paths: the host
 * template's /usr is the host's, read-only, and an image template's
 * paths are the image's (docs/gpu.md). */
static void attach_gpu_driver(const child_config *c) {
        const gpu_child *g = c->gpu;
        int pfd = open_mount_point(c, HUTCH_GPU_DIR, "the GPU directory's path crosses a symlink or a file",
                                   "creating the GPU directory");
        int fs = sys_fsopen("tmpfs", FSOPEN_CLOEXEC);
        CHECK(c, fs, "fsopen tmpfs for the GPU directory");
        CHECK(c, sys_fsconfig(fs, FSCONFIG_SET_STRING, "size", "1m", 0), "configuring the GPU directory");
        CHECK(c, sys_fsconfig(fs, FSCONFIG_SET_STRING, "nr_inodes", "1024", 0), "configuring the GPU directory");
        CHECK(c, sys_fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0755", 0), "configuring the GPU directory");
        CHECK(c, sys_fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0), "creating the GPU directory's tmpfs");
        int mfd = sys_fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        CHECK(c, mfd, "mounting the GPU directory's tmpfs");
        close(fs);
        CHECK(c, sys_move_mount(mfd, "", pfd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
              "attaching the GPU directory");
        close(pfd);
        CHECK(c, mkdirat(mfd, "lib", 0755), "creating the GPU directory's lib");
        CHECK(c, mkdirat(mfd, "bin", 0755), "creating the GPU directory's bin");
        for (size_t i = 0; i < g->n_files; i++) {
                int fd = openat(mfd, g->files[i].name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
                CHECK(c, fd, "creating a GPU driver file's mount point");
                close(fd);
                CHECK(c, sys_move_mount(g->files[i].fd, "", mfd, g->files[i].name, MOVE_MOUNT_F_EMPTY_PATH),
                      "attaching a GPU driver file");
        }
        for (size_t i = 0; i < g->n_links; i++)
                CHECK(c, symlinkat(g->links[i].target, mfd, g->links[i].name), "creating a GPU driver link");
        struct mount_attr ro = { .attr_set = MOUNT_ATTR_RDONLY };
        CHECK(c, sys_mount_setattr(mfd, "", AT_EMPTY_PATH, &ro, sizeof ro), "making the GPU directory read-only");
        close(mfd);
}

/* ------------------------------------------------------- image layers */

/* The message after the bootstrap when it says layers follow: one byte
 * per layer, with the layers' id-mapped, read-only, detached mounts, top
 * first (sandbox.c send_layers). */
static uint32_t recv_layers(const child_config *c, int *fds) {
        char buf[HUTCH_MAX_LAYERS];
        struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
        union {
                struct cmsghdr align;
                char b[CMSG_SPACE(sizeof(int) * HUTCH_MAX_LAYERS)];
        } ctl;
        struct msghdr msg = { .msg_iov = &iov,
                              .msg_iovlen = 1,
                              .msg_control = ctl.b,
                              .msg_controllen = sizeof ctl.b };
        ssize_t n;
        do
                n = recvmsg(c->init_conn, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
                child_fail(c, n < 0 ? errno : EPIPE, "waiting for the template's layers");
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        if (!cm || cm->cmsg_type != SCM_RIGHTS || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
                child_fail(c, EPROTO, "layers message without descriptors");
        size_t nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if (nfds < 1 || nfds > HUTCH_MAX_LAYERS || nfds != (size_t) n)
                child_fail(c, EPROTO, "layers message malformed");
        memcpy(fds, CMSG_DATA(cm), nfds * sizeof(int));
        return (uint32_t) nfds;
}

/* Attach layer k at lK (the sandbox dir's mount points) and name them in
 * the overlay's lowerdir after the template's own top layer. */
static void attach_layers(const child_config *c, const int *fds, uint32_t n, char *opts,
                          size_t optsz) {
        for (uint32_t i = 0; i < n; i++) {
                char dir[16] = "l", num[24];
                u64_to_str(i, num);
                cat(dir, sizeof dir, num);
                CHECK(c, sys_move_mount(fds[i], "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH),
                      "attaching an image layer");
                close(fds[i]);
                cat(opts, optsz, ":");
                cat(opts, optsz, dir);
        }
}

/* ------------------------------------------------------------- the checklist */

static void child_setup(const child_config *c) {
        int fds[2 + 8];
        size_t nfds = 0;
        char bind_paths[8][16];
        uint32_t n_binds = 0;
        int layer_fd = -1, *bind_fds;
        int image_fds[HUTCH_MAX_LAYERS];
        uint32_t n_image = 0;

        /* The child has its own copy of the parent's descriptors (no
         * CLONE_FILES), the parent's end of the bootstrap socketpair
         * included: held here, a parent killed before it sent the bootstrap
         * left the child in recvmsg() for ever, holding every descriptor of
         * the daemon (its port, DATA_DIR/serve.lock: no restart). Without
         * it, the parent's death is an EOF and the child exits. */
        close(c->parent_conn);

        /* 0. Join the sandbox's cgroup (unless clone3 put us there): a v1
         *    migration waits for an RCU grace period, so it runs here while
         *    the parent prepares the mounts. Then a cgroup namespace rooted
         *    at it, so /proc/self/cgroup shows "/" inside. */
        if (c->n_cgroup_procs > 0) {
                for (size_t i = 0; i < c->n_cgroup_procs; i++) {
                        if (write(c->cgroup_procs[i], "0", 1) != 1)
                                child_fail(c, errno, "joining the sandbox cgroup");
                        close(c->cgroup_procs[i]);
                }
                CHECK(c, unshare(CLONE_NEWCGROUP), "creating the cgroup namespace");
        }

        /* 1. Wait for the parent: id maps written, id-mapped mounts made. */
        {
                char buf[2 + 8 * 16];
                struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
                union {
                        struct cmsghdr align;
                        char b[CMSG_SPACE(sizeof(int) * 10)];
                } ctl;
                struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                                      .msg_controllen = sizeof ctl.b };
                ssize_t n;
                do
                        n = recvmsg(c->init_conn, &msg, MSG_CMSG_CLOEXEC);
                while (n < 0 && errno == EINTR);
                if (n <= 0)
                        child_fail(c, n < 0 ? errno : EPIPE, "waiting for the parent");
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                if (!cm || cm->cmsg_type != SCM_RIGHTS)
                        child_fail(c, EPROTO, "bootstrap message without descriptors");
                nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                if (nfds < 1 || nfds > 10)
                        child_fail(c, EPROTO, "bootstrap message with a bad descriptor count");
                memcpy(fds, CMSG_DATA(cm), nfds * sizeof(int));
                n_binds = (uint32_t) (unsigned char) buf[0];
                bool has_layer = (buf[1] & 1) != 0;
                if (buf[1] & 2)
                        n_image = recv_layers(c, image_fds);
                if (n < 2 || n_binds > 8 || n_binds + 1 + has_layer != nfds || (size_t) n < 2 + n_binds * 16)
                        child_fail(c, EPROTO, "bootstrap message malformed");
                for (uint32_t i = 0; i < n_binds; i++) {
                        memcpy(bind_paths[i], buf + 2 + i * 16, 16);
                        bind_paths[i][15] = 0;
                }
                layer_fd = has_layer ? fds[1] : -1;
                bind_fds = fds + 1 + has_layer;
        }
        /* 1b. The volume mounts, a message of their own. */
        child_volumes vols;
        receive_volumes(c, &vols);

        /* 2. Become sandbox root (the maps exist now). */
        CHECK(c, setresgid(0, 0, 0), "setresgid(0)");
        CHECK(c, setresuid(0, 0, 0), "setresuid(0)");
        CHECK(c, setgroups(0, NULL), "setgroups");
        /* A session of our own: without it, every sandbox process would
         * share the caller's controlling terminal, and /dev/tty would hand
         * them the operator's tty (TIOCSPGRP, keystrokes, KDSKBENT on a
         * console: bubblewrap's CVE-2017-5226). */
        CHECK(c, setsid(), "setsid");

        /* 3. Nothing we mount travels back to the host. */
        CHECK(c, mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "making / private");
        CHECK(c, chdir(c->sandbox_dir), "entering the sandbox directory");

        /* 4. The control socket, bound on a host path the sandbox never sees. */
        int lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        CHECK(c, lsock, "socket");
        {
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                memcpy(sa.sun_path, "sock/init.sock", sizeof "sock/init.sock");
                CHECK(c, bind(lsock, (struct sockaddr *) &sa, sizeof sa), "binding the control socket");
                CHECK(c, listen(lsock, 16), "listen");
        }

        /* 5. The writable layer and the overlay root. */
        char opts[256 + HUTCH_MAX_LAYERS * 6] = "lowerdir=";
        if (layer_fd >= 0) {
                CHECK(c, sys_move_mount(layer_fd, "", AT_FDCWD, "layer", MOVE_MOUNT_F_EMPTY_PATH),
                      "attaching the writable layer");
                close(layer_fd);
        } else {
                char t[128] = "size=";
                char num[24];
                u64_to_str(c->disk_bytes, num);
                cat(t, sizeof t, num);
                cat(t, sizeof t, ",nr_inodes=");
                u64_to_str(c->disk_inodes, num);
                cat(t, sizeof t, num);
                cat(t, sizeof t, ",mode=0755");
                CHECK(c, mount("tmpfs", "layer", "tmpfs", MS_NOSUID | MS_NODEV, t), "mounting the tmpfs layer");
                CHECK(c, mkdir("layer/upper", 0755), "creating upper");
                CHECK(c, mkdir("layer/work", 0700), "creating work");
        }
        CHECK(c, sys_move_mount(fds[0], "", AT_FDCWD, "lower", MOVE_MOUNT_F_EMPTY_PATH), "attaching the template");
        close(fds[0]);
        /* overlayfs resolves relative layer paths against our cwd */
        cat(opts, sizeof opts, "lower");
        attach_layers(c, image_fds, n_image, opts, sizeof opts);
        cat(opts, sizeof opts, ",upperdir=layer/upper,workdir=layer/work,userxattr");
        /* Not nosuid: set-id programs of the template (an image's sudo, as
         * the host template's from its /usr) run, as in E2B's sandboxes,
         * where `user` has passwordless sudo. Their owners are the
         * sandbox's ids (0..65535, id-mapped into its range), so a set-uid
         * root file gives the sandbox's root, in its user namespace, with
         * the bounded capabilities and nothing of the host's
         * (docs/security.md, "Image layers"). */
        CHECK(c, mount("overlay", "root", "overlay", MS_NODEV, opts), "mounting the overlay root");
        CHECK(c, chdir("root"), "entering the root");

        /* 6. Template binds (/usr ...), id-mapped and read-only. */
        for (uint32_t i = 0; i < n_binds; i++) {
                const char *rel = bind_paths[i] + 1; /* "/usr" -> "usr" */
                CHECK(c, sys_move_mount(bind_fds[i], "", AT_FDCWD, rel, MOVE_MOUNT_F_EMPTY_PATH),
                      "attaching a template bind");
                close(bind_fds[i]);
        }

        /* 7. /proc, /dev, /sys. */
        setup_proc(c);
        setup_dev(c);
        setup_sys(c);

        /* 8. Identity, and loopback up: the new netns starts with lo down. */
        CHECK(c, sethostname(c->hostname, strlen(c->hostname)), "sethostname");
        {
                int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                struct ifreq ifr = { .ifr_name = "lo" };
                CHECK(c, s, "socket for lo");
                CHECK(c, ioctl(s, SIOCGIFFLAGS, &ifr), "reading lo's flags");
                ifr.ifr_flags |= IFF_UP;
                CHECK(c, ioctl(s, SIOCSIFFLAGS, &ifr), "bringing lo up");
                close(s);
        }

        /* 9. Leave the host's tree behind for good. */
        CHECK(c, sys_pivot_root(".", "."), "pivot_root");
        CHECK(c, umount2(".", MNT_DETACH), "detaching the old root");
        CHECK(c, chdir("/"), "chdir /");

        /* 9b. The GPU driver's files, then volumes, over the finished root. */
        if (c->gpu)
                attach_gpu_driver(c);
        attach_volumes(c, &vols);

        /* 10. Limits every process inherits. */
        struct rlimit nofile = { c->nofile, c->nofile }, core = { 0, 0 };
        CHECK(c, setrlimit(RLIMIT_NOFILE, &nofile), "RLIMIT_NOFILE");
        CHECK(c, setrlimit(RLIMIT_CORE, &core), "RLIMIT_CORE");

        /* 11. Descriptors: 0-2 /dev/null, 3 listener, 4 creator, 5 the init
         *     memfd (close-on-exec), nothing else. */
        int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
        CHECK(c, devnull, "opening /dev/null");
        int hl = fcntl(lsock, F_DUPFD_CLOEXEC, 64), hc = fcntl(c->init_conn, F_DUPFD_CLOEXEC, 64),
            hm = fcntl(c->init_memfd, F_DUPFD_CLOEXEC, 64), hs = fcntl(c->sync_fd, F_DUPFD_CLOEXEC, 64);
        if (hl < 0 || hc < 0 || hm < 0 || hs < 0)
                child_fail(c, errno, "moving descriptors");
        child_config moved = *c;
        moved.sync_fd = hs;
        c = &moved;
        CHECK(c, dup2(devnull, 0), "dup2");
        CHECK(c, dup2(devnull, 1), "dup2");
        CHECK(c, dup2(devnull, 2), "dup2");
        CHECK(c, dup2(hl, 3), "dup2");
        CHECK(c, dup2(hc, 4), "dup2");
        CHECK(c, dup3(hm, 5, O_CLOEXEC), "dup3");
        CHECK(c, dup3(hs, 6, O_CLOEXEC), "dup3");
        moved.sync_fd = 6;
        CHECK(c, sys_close_range(7, ~0U, 0), "close_range");

        /* 12. Signals: default dispositions, nothing blocked. */
        for (int s = 1; s < _NSIG; s++)
                if (s != SIGKILL && s != SIGSTOP)
                        (void) signal(s, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        (void) sigprocmask(SIG_SETMASK, &none, NULL);

        /* 13. seccomp (needs CAP_SYS_ADMIN in our userns unless NNP), then
         *     drop to the bounded capability set. */
        int r = seccomp_filter_load(c->seccomp);
        if (r < 0)
                child_fail(c, -r, "loading the seccomp filter");
        r = caps_apply_child(c->no_new_privs);
        if (r < 0)
                child_fail(c, -r, "dropping capabilities");

        /* 14. Become hutch-init, from the sealed memfd. */
        static char *const argv[] = { (char *) "hutch-init", NULL };
        static char *const envp[] = { (char *) "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL };
        syscall(SYS_execveat, 5, "", argv, envp, AT_EMPTY_PATH);
        child_fail(c, errno, "executing hutch-init");
}

int child_main(void *arg) {
        child_setup(arg);
        return 127;
}
