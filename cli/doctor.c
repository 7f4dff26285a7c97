/* SPDX-License-Identifier: Apache-2.0 */
/* hutch doctor: what this kernel offers, what hutch needs, what to change. */
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <linux/seccomp.h>

#include "cli/cli.h"
#include "util/fdutil.h"
#include "util/log.h"
#include "util/macro.h"
#include "util/syscalls.h"

static int failures;

static void report(bool ok, bool required, const char *name, const char *detail, const char *fix) {
        printf("%-22s %-5s %s\n", name, ok ? "ok" : required ? "FAIL" : "warn", detail ? detail : "");
        if (!ok && fix)
                printf("%-22s       fix: %s\n", "", fix);
        if (!ok && required)
                failures++;
}

static int child_exit0(void *arg) {
        return 0;
}

/* A child in a new user namespace, waiting; returns its pid or -errno. */
static pid_t userns_child(int *ret_pipe) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        pid_t pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                close(p[1]);
                if (unshare(CLONE_NEWUSER) < 0)
                        _exit(1);
                char c;
                (void) !read(p[0], &c, 1);
                _exit(0);
        }
        close(p[0]);
        *ret_pipe = p[1];
        return pid;
}

static void check_userns(void) {
        static char stack[64 * 1024] __attribute__((aligned(16)));
        pid_t pid = clone(child_exit0, stack + sizeof stack, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET |
                                                                      CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP | SIGCHLD,
                          NULL);
        int st = -1;
        if (pid > 0)
                waitpid(pid, &st, 0);
        char detail[128];
        _cleanup_free_ char *max = NULL;
        (void) read_file_at(AT_FDCWD, "/proc/sys/user/max_user_namespaces", 32, &max);
        snprintf(detail, sizeof detail, "user, mount, pid, net, uts, ipc, cgroup (max_user_namespaces=%s)",
                 max ? strtok(max, "\n") : "?");
        report(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, true, "namespaces", detail,
               "enable CONFIG_USER_NS and set user.max_user_namespaces > 0 (and kernel.unprivileged_userns_clone if present)");
}

static void check_idmap(void) {
        int p = -1;
        pid_t pid = userns_child(&p);
        bool ok = false;
        char detail[160] = "";
        if (pid > 0) {
                char path[64];
                usleep(20000);
                snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
                int fd = open(path, O_WRONLY | O_CLOEXEC);
                bool mapped = fd >= 0 && write(fd, "0 1879048192 65536\n", 19) == 19;
                safe_close(fd);
                snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
                fd = open(path, O_WRONLY | O_CLOEXEC);
                mapped = mapped && fd >= 0 && write(fd, "0 1879048192 65536\n", 19) == 19;
                safe_close(fd);
                snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
                int ns = open(path, O_RDONLY | O_CLOEXEC);
                int t = sys_open_tree(AT_FDCWD, "/usr", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
                struct mount_attr a = { .attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, .userns_fd = (uint64_t) ns };
                if (mapped && ns >= 0 && t >= 0 && sys_mount_setattr(t, "", AT_EMPTY_PATH, &a, sizeof a) == 0)
                        ok = true;
                else
                        snprintf(detail, sizeof detail, "open_tree/mount_setattr(MOUNT_ATTR_IDMAP) on /usr: %s", strerror(errno));
                safe_close(t);
                safe_close(ns);
                close(p);
                waitpid(pid, NULL, 0);
        } else
                snprintf(detail, sizeof detail, "could not create a user namespace");
        report(ok, true, "id-mapped mounts", ok ? "MOUNT_ATTR_IDMAP on the host's /usr" : detail,
               "Linux >= 5.12 with a file system that supports idmapped mounts (ext4, xfs, btrfs, tmpfs >= 6.3)");
}

static void check_fs(const char *fs, bool required, const char *fix) {
        _cleanup_free_ char *all = NULL;
        bool ok = read_file_at(AT_FDCWD, "/proc/filesystems", 65536, &all) >= 0 && all && strstr(all, fs);
        char name[32];
        snprintf(name, sizeof name, "%s", fs);
        report(ok, required, name, ok ? "in /proc/filesystems" : "missing", fix);
}

static void check_seccomp(void) {
        bool ok = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0;
        _cleanup_free_ char *actions = NULL;
        (void) read_file_at(AT_FDCWD, "/proc/sys/kernel/seccomp/actions_avail", 512, &actions);
        report(ok, true, "seccomp", ok ? "filter mode available" : "prctl(PR_GET_SECCOMP) failed", "enable CONFIG_SECCOMP_FILTER");
}

static void check_pidfd_clone3(void) {
        int fd = sys_pidfd_open(getpid(), 0);
        report(fd >= 0, true, "pidfd", fd >= 0 ? "pidfd_open works" : strerror(errno), "Linux >= 5.3");
        safe_close(fd);
        struct clone_args ca = { .flags = CLONE_VM, .exit_signal = SIGCHLD };
        long r = syscall(SYS_clone3, &ca, 8); /* too small a size: EINVAL means clone3 exists */
        bool ok = r < 0 && errno == EINVAL;
        report(ok, true, "clone3", ok ? "available" : "missing (ENOSYS)", "Linux >= 5.3");
}

/* Run argv in a fresh sandbox of the backend; true when it exits 0. */
static bool end_to_end(hutch_ctx *ctx, int backend, const char *const *argv, char *detail, size_t n) {
        hutch_sandbox *sb = NULL;
        hutch_error err = { 0 };
        hutch_sandbox_config cfg = { .backend = backend };
        if (hutch_sandbox_create(ctx, &cfg, &sb, &err) < 0) {
                snprintf(detail, n, "%s", err.msg);
                return false;
        }
        hutch_spawn_config sc = { .argv = argv, .uid = 1000, .gid = 1000, .cwd = "/" };
        hutch_process p = { .stdin_fd = -1, .stdout_fd = -1, .stderr_fd = -1 };
        hutch_exit ex = { 0 };
        bool ok = hutch_sandbox_spawn(sb, &sc, &p, &err) >= 0 && hutch_sandbox_wait(sb, 10000, &ex, &err) >= 0 &&
                  ex.signal == 0 && ex.exit_code == 0;
        safe_close(p.stdin_fd);
        safe_close(p.stdout_fd);
        safe_close(p.stderr_fd);
        if (!ok && !err.msg[0])
                snprintf(err.msg, sizeof err.msg, "%s exited with %d (signal %d)", argv[0], ex.exit_code, ex.signal);
        snprintf(detail, n, "%s", ok ? "created a sandbox, ran it, destroyed it" : err.msg);
        if (hutch_sandbox_destroy(sb, &err) < 0) {
                ok = false;
                snprintf(detail, n, "destroy: %s", err.msg);
        }
        hutch_sandbox_unref(sb);
        return ok;
}

static void check_end_to_end(hutch_ctx *ctx) {
        static const char *const argv[] = { "/bin/true", NULL };
        char detail[1100];
        bool ok = end_to_end(ctx, HUTCH_BACKEND_NS, argv, detail, sizeof detail);
        report(ok, true, "sandbox", detail, "run with HUTCH_DEBUG=1 for details");
}

/* The gvisor backend is optional: runsc, a sandbox on it, and whether ls
 * works in it (coreutils' ls and stat send statx(AT_NO_AUTOMOUNT), which
 * runsc releases of 2022, Debian 12's included, refuse with EINVAL; the
 * template's preloaded shim, init/gvisor-compat.c, drops the flag). */
static void check_gvisor(hutch_ctx *ctx) {
        char info[512], detail[1100];
        hutch_error err = { 0 };
        if (hutch_gvisor_probe(ctx, info, sizeof info, &err) < 0) {
                report(false, false, "gvisor (runsc)", err.msg, "apt-get install runsc (or gVisor's own release)");
                return;
        }
        static const char *const argv[] = { "/bin/true", NULL };
        bool ok = end_to_end(ctx, HUTCH_BACKEND_GVISOR, argv, detail, sizeof detail);
        char line[1700];
        snprintf(line, sizeof line, "%s: %s", info, ok ? "created a sandbox, ran it, destroyed it" : detail);
        report(ok, false, "gvisor (runsc)", line, "see docs/gvisor.md");
        if (!ok)
                return;
        static const char *const ls[] = { "/bin/ls", "-d", "/", NULL };
        ok = end_to_end(ctx, HUTCH_BACKEND_GVISOR, ls, detail, sizeof detail);
        report(ok, false, "gvisor statx", ok ? "ls and stat work" : "ls fails with 'Invalid argument' inside (statx "
                                                                   "AT_NO_AUTOMOUNT refused, and the preloaded shim "
                                                                   "did not help)",
               "install a runsc release from 2023 or later (gvisor.dev)");
}

/* GPUs are optional: the nodes, the driver's files and NVML (docs/gpu.md). */
static void check_gpus(hutch_ctx *ctx) {
        char info[768];
        hutch_error err = { 0 };
        bool ok = hutch_gpu_probe(ctx, info, sizeof info, &err) > 0;
        report(ok, false, "gpus (nvidia)", ok ? info : err.msg,
               "install the NVIDIA driver, or set HUTCH_GPU_DEV_DIR / HUTCH_GPU_DRIVER_ROOT (docs/gpu.md)");
        if (ok)
                report(false, false, "gpus on gvisor", "not supported: hutch does not drive runsc's nvproxy (docs/gpu.md)",
                       NULL);
}

/* The host template binds the host's /usr (and /bin, /lib... where they are
 * directories) into every sandbox, id-mapped as a whole: a file there that
 * only root may read, or a directory only root may enter, is open to the
 * sandbox's root, which is root of the mapping. Listed so that an operator
 * can tell whether anything secret sits there (docs/security.md). */
static struct {
        size_t n;
        char first[3][256];
} root_only;

static int root_only_visit(const char *path, const struct stat *st, int type, struct FTW *ftw) {
        (void) ftw;
        bool hidden = (type == FTW_F && S_ISREG(st->st_mode) && !(st->st_mode & S_IROTH)) ||
                ((type == FTW_D || type == FTW_DNR) && !(st->st_mode & S_IXOTH));
        if (hidden) {
                if (root_only.n < ELEMENTSOF(root_only.first))
                        snprintf(root_only.first[root_only.n], sizeof root_only.first[0], "%s", path);
                root_only.n++;
        }
        return 0;
}

static void check_host_usr(void) {
        static const char *const dirs[] = { "/usr",   "/bin",   "/sbin",   "/lib",
                                            "/lib32", "/lib64", "/libx32", NULL };
        root_only.n = 0;
        for (const char *const *d = dirs; *d; d++) {
                struct stat st;
                if (lstat(*d, &st) == 0 && S_ISDIR(st.st_mode))
                        (void) nftw(*d, root_only_visit, 32, FTW_PHYS | FTW_MOUNT);
        }
        char detail[1024];
        if (!root_only.n)
                snprintf(detail, sizeof detail, "nothing under /usr is readable by root alone");
        else
                snprintf(detail, sizeof detail,
                         "%zu file(s) or dir(s) only root may read, which a host-template sandbox's root reads "
                         "too: %s%s%s%s%s%s",
                         root_only.n, root_only.first[0], root_only.n > 1 ? ", " : "",
                         root_only.first[1], root_only.n > 2 ? ", " : "", root_only.first[2],
                         root_only.n > 3 ? ", ..." : "");
        report(root_only.n == 0, false, "host /usr", detail,
               "keep secrets out of /usr (or make what is there world-readable), or serve sandboxes from "
               "`hutch template base` (Debian packages, not the host's /usr)");
}

int verb_doctor(int argc, char **argv) {
        for (int i = 1; i < argc; i++) {
                if (streq(argv[i], "-h") || streq(argv[i], "--help")) {
                        puts("usage: hutch doctor\n\nChecks what the kernel and this host offer hutch, and runs one "
                             "sandbox end to end.\nExit 0: every required check passed; 1: one failed.");
                        return 0;
                }
                log_error("unknown argument '%s' (usage: hutch doctor)", argv[i]);
                return EXIT_USAGE;
        }
        struct utsname u;
        uname(&u);
        printf("hutch doctor: %s %s %s\n\n", u.sysname, u.release, u.machine);
        report(geteuid() == 0, true, "root", geteuid() == 0 ? "running as root" : "not root",
               "run hutch as root (it allocates host uid ranges and mounts)");
        check_userns();
        check_idmap();
        check_fs("overlay", true, "modprobe overlay (CONFIG_OVERLAY_FS)");
        check_seccomp();
        check_pidfd_clone3();

        hutch_ctx *ctx = NULL;
        hutch_error err = { 0 };
        if (hutch_ctx_new(NULL, &ctx, &err) < 0) {
                report(false, true, "cgroups", err.msg, "mount cgroup v2 at /sys/fs/cgroup or the v1 memory, pids, cpu controllers");
                printf("\n%d required check(s) failed\n", failures + 1);
                return 1;
        }
        char detail[256];
        snprintf(detail, sizeof detail, "%s backend", hutch_ctx_cgroup_backend(ctx));
        report(true, true, "cgroups", detail, NULL);
        check_fs("ext4", false, "enable CONFIG_EXT4_FS for disk limits off the memory budget");
        check_end_to_end(ctx);
        snprintf(detail, sizeof detail, "%s%s", hutch_ctx_storage_backend(ctx),
                 streq(hutch_ctx_storage_backend(ctx), "ext4") ? " (a loop-mounted image per sandbox)"
                                                               : " (writable layers count against sandbox memory)");
        report(streq(hutch_ctx_storage_backend(ctx), "ext4"), false, "writable layers", detail,
               "make /dev/loop-control and mkfs.ext4 (e2fsprogs) available, or accept tmpfs layers");
        check_gvisor(ctx);
        check_gpus(ctx);
        check_host_usr();
        hutch_ctx_free(ctx);
        printf("\n%s\n", failures ? "some required checks failed" : "all required checks passed");
        return failures ? 1 : 0;
}
