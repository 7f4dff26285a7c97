/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cgroup backends against the real kernel (root only; exit 77 otherwise).
 * Runs every check for each backend this host offers: the auto-detected one
 * and v2 forced (on a hybrid host that is cgroup2 at /sys/fs/cgroup/unified,
 * with no controllers). HUTCH_CGROUP=v1|v2 runs just that one.
 * Cgroups are made under "hutch-test" with random ids and removed again.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>

#include "sandbox/cgroup-internal.h"
#include "util/syscalls.h"

#define ROOT "hutch-test"

static unsigned n_tests, n_failed;

static void _printf_(2, 3) ok(bool cond, const char *fmt, ...) {
        va_list ap;

        n_tests++;
        if (!cond)
                n_failed++;
        printf("%sok %u - ", cond ? "" : "not ", n_tests);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        fflush(stdout);
}

static void _printf_(1, 2) skip(const char *fmt, ...) {
        va_list ap;

        printf("ok %u - # SKIP ", ++n_tests);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        fflush(stdout);
}

static void _printf_(1, 2) diag(const char *fmt, ...) {
        va_list ap;

        printf("# ");
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
        fflush(stdout);
}

static void random_id(char *buf, size_t size, const char *prefix) {
        static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
        unsigned char rnd[10];
        size_t n;

        if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t) sizeof(rnd))
                for (size_t i = 0; i < sizeof(rnd); i++)
                        rnd[i] = (unsigned char) (rand() & 0xff);
        n = (size_t) snprintf(buf, size, "%s", prefix);
        for (size_t i = 0; i < sizeof(rnd) && n + 1 < size; i++)
                buf[n++] = alphabet[rnd[i] % (sizeof(alphabet) - 1)];
        buf[n] = '\0';
}

static uint64_t now_msec(void) {
        return cgroup_now_usec() / 1000;
}

static void spin_msec(unsigned ms) {
        uint64_t end = now_msec() + ms;

        while (now_msec() < end)
                ;
}

/* waitpid with a bound; on timeout the child is killed and -ETIMEDOUT returned. */
static int wait_child(pid_t pid, unsigned timeout_ms, int *ret_status) {
        uint64_t end = now_msec() + timeout_ms;

        for (;;) {
                pid_t r = waitpid(pid, ret_status, WNOHANG);

                if (r == pid)
                        return 0;
                if (r < 0)
                        return -errno;
                if (now_msec() >= end) {
                        kill(pid, SIGKILL);
                        waitpid(pid, ret_status, 0);
                        return -ETIMEDOUT;
                }
                cgroup_sleep_usec(2000);
        }
}

/* ------------------------------------------------------------ children */

typedef int (*child_fn)(void *arg);
static bool used_clone3;

/* Start fn in cg: clone3(CLONE_INTO_CGROUP) where the backend offers a
 * cgroup fd (v2), else fork and attach before the child goes on. */
static pid_t start_child(hutch_cgroup *cg, child_fn fn, void *arg) {
        _cleanup_close_pair_ int p[2] = { -1, -1 };
        hutch_error e = {};
        int cfd = cgroup_clone_fd(cg), r;
        pid_t pid;
        char c = 'x';

        fflush(stdout);
        used_clone3 = false;
        if (cfd >= 0) {
                struct clone_args ca = {
                        .flags = CLONE_INTO_CGROUP,
                        .exit_signal = SIGCHLD,
                        .cgroup = (uint64_t) cfd,
                };

                pid = (pid_t) sys_clone3(&ca, sizeof(ca));
                if (pid == 0)
                        _exit(fn(arg));
                if (pid > 0) {
                        used_clone3 = true;
                        return pid;
                }
                if (errno != ENOSYS && errno != E2BIG && errno != EINVAL)
                        return -errno;
                diag("clone3(CLONE_INTO_CGROUP): %s, falling back to attach", strerror(errno));
        }

        if (pipe2(p, O_CLOEXEC) < 0)
                return -errno;
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                p[1] = safe_close(p[1]);
                if (read(p[0], &c, 1) != 1)
                        _exit(99);
                _exit(fn(arg));
        }
        p[0] = safe_close(p[0]);
        r = cgroup_attach_pid(cg, pid, &e);
        if (r < 0) {
                diag("attach: %s", e.msg);
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                return r;
        }
        if (write(p[1], &c, 1) != 1) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                return -EIO;
        }
        return pid;
}

typedef struct counter_arg {
        volatile uint64_t *counter;
        int nforks;
} counter_arg;

/* Burn a little CPU, fork helpers, then count forever. */
static int child_counter(void *arg) {
        counter_arg *a = arg;

        spin_msec(30);
        for (int i = 0; i < a->nforks; i++)
                if (fork() == 0)
                        break;
        for (;;) {
                __atomic_add_fetch(a->counter, 1, __ATOMIC_RELAXED);
                usleep(1000);
        }
        return 0;
}

static int child_oom(void *arg) {
        size_t mib = (size_t) (uintptr_t) arg;

        for (size_t i = 0; i < mib; i++) {
                /* volatile: compilers drop a malloc+memset nobody reads. */
                volatile char *p = malloc(1 << 20);

                if (!p)
                        return 2;
                for (size_t off = 0; off < (1 << 20); off += 4096)
                        p[off] = (char) (i + 1);
        }
        return 0; /* survived: the limit did not hold */
}

/* Fork until the pids limit refuses; the exit code is how many forks worked. */
static int child_pids(void *arg) {
        int tries = (int) (intptr_t) arg, n = 0;

        for (int i = 0; i < tries; i++) {
                pid_t pid = fork();

                if (pid == 0) {
                        sleep(30);
                        _exit(0);
                }
                if (pid < 0)
                        break;
                n++;
        }
        return n;
}

static int child_spin(void *arg) {
        spin_msec((unsigned) (uintptr_t) arg);
        return 0;
}

/* 0: /dev/null opens and /dev/kmsg is refused with EPERM. */
static int child_devices(void *arg) {
        int fd;

        fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return 1;
        close(fd);
        fd = open("/dev/kmsg", O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
                return 2;
        return errno == EPERM ? 0 : 3;
}

/* GPU-like nodes in a temporary directory (arg): "gpu0" is c 195:0, which
 * the test allows, "gpu1" c 195:1, which it does not. No driver has major
 * 195 here, so an allowed open reaches the (missing) driver: ENXIO; the
 * device cgroup refuses the other before that: EPERM. */
static int child_gpu_devices(void *arg) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/gpu0", (const char *) arg);
        int fd = open(p, O_RDWR | O_CLOEXEC);
        if (fd >= 0 || errno != ENXIO)
                return 1;
        snprintf(p, sizeof p, "%s/gpu1", (const char *) arg);
        fd = open(p, O_RDWR | O_CLOEXEC);
        if (fd >= 0)
                return 2;
        return errno == EPERM ? 0 : 3;
}

/* ------------------------------------------------------------ helpers */

static bool proc_in_cgroup(pid_t pid, const char *needle) {
        _cleanup_free_ char *s = NULL;
        char dir[64];

        snprintf(dir, sizeof(dir), "/proc/%d", (int) pid);
        if (cgroup_read(dir, "cgroup", &s, NULL) < 0)
                return false;
        return strstr(s, needle) != NULL;
}

static bool file_is(const char *dir, const char *file, const char *want) {
        _cleanup_free_ char *s = NULL;

        if (!dir || cgroup_read(dir, file, &s, NULL) < 0)
                return false;
        s[strcspn(s, "\n")] = '\0';
        if (!streq(s, want))
                diag("%s/%s is '%s', want '%s'", dir, file, s, want);
        return streq(s, want);
}

static bool dir_exists(const char *p) {
        struct stat st;

        return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Every directory of the cgroup, whichever backend. */
static bool cg_dirs_exist(const hutch_cgroup *cg, bool want) {
        if (cg->version == CGROUP_V2)
                return dir_exists(cg->dir) == want;
        for (int c = 0; c < _CGROUP_V1_MAX; c++)
                if (cg->v1_dir[c] && dir_exists(cg->v1_dir[c]) != want)
                        return false;
        return true;
}

static bool has_memory(const hutch_cgroup *cg) {
        return cg->version == CGROUP_V1 ? cg->v1_dir[CGROUP_V1_MEMORY] != NULL : cg->has_memory;
}
static bool has_pids(const hutch_cgroup *cg) {
        return cg->version == CGROUP_V1 ? cg->v1_dir[CGROUP_V1_PIDS] != NULL : cg->has_pids;
}
static bool has_cpu(const hutch_cgroup *cg) {
        return cg->version == CGROUP_V1 ? cg->v1_dir[CGROUP_V1_CPU] != NULL : cg->has_cpu;
}

typedef struct backend {
        const char *name;
        cgroup_version v;
        char *mount;
} backend;

static int make(const backend *b, const char *root, const char *id, const hutch_limits *l,
                hutch_cgroup **ret) {
        hutch_error e = {};
        int r;

        r = cgroup_create(b->v, b->mount, root, id, l, ret, &e);
        if (r < 0)
                diag("cgroup_create(%s/%s): %s", root, id, e.msg);
        return r;
}

static void teardown(hutch_cgroup *cg) {
        hutch_error e = {};

        if (!cg)
                return;
        if (cgroup_kill_all(cg, &e) < 0)
                diag("teardown kill: %s", e.msg);
        if (cgroup_destroy(cg, &e) < 0)
                diag("teardown destroy: %s", e.msg);
        cgroup_free(cg);
}

/* ------------------------------------------------------------ tests */

static void test_names(const backend *b) {
        static const char *const bad_ids[] = { "", "../x", "a/b", "..", "A", "x.y", "a b" };
        static const char *const bad_roots[] = { "",   "/abs",   "../etc", "a//b",
                                                 "a/", "a/../b", ".",      "a/./b" };
        hutch_cgroup *cg = NULL;

        for (size_t i = 0; i < ELEMENTSOF(bad_ids); i++)
                ok(cgroup_create(b->v, b->mount, ROOT, bad_ids[i], NULL, &cg, NULL) == -EINVAL,
                   "%s: id '%s' refused", b->name, bad_ids[i]);
        for (size_t i = 0; i < ELEMENTSOF(bad_roots); i++)
                ok(cgroup_create(b->v, b->mount, bad_roots[i], "x", NULL, &cg, NULL) == -EINVAL,
                   "%s: root name '%s' refused", b->name, bad_roots[i]);
        ok(cgroup_root_name_is_valid("hutch.slice/sandboxes") && cgroup_id_is_valid("abc-1_2"),
           "%s: nested root name and id with - _ accepted", b->name);
}

static void test_lifecycle(const backend *b) {
        hutch_limits l = { .memory_bytes = 256ULL << 20, .pids = 64, .cpu_millis = 500 };
        volatile uint64_t *counter;
        hutch_cgroup *cg = NULL, *again = NULL, *opened = NULL;
        counter_arg arg;
        hutch_stats st = {};
        hutch_error e = {};
        char id[40], needle[128];
        uint64_t c0, c1;
        int status = 0, r, n;
        pid_t pid;

        random_id(id, sizeof(id), "test-");
        r = make(b, ROOT, id, &l, &cg);
        ok(r == 0, "%s: create %s/%s", b->name, ROOT, id);
        if (r < 0)
                return;
        ok(cg_dirs_exist(cg, true), "%s: cgroup directories exist", b->name);
        if (b->v == CGROUP_V2)
                diag("%s: controllers memory=%d pids=%d cpu=%d", b->name, cg->has_memory,
                     cg->has_pids, cg->has_cpu);
        ok(cgroup_create(b->v, b->mount, ROOT, id, &l, &again, &e) == -EEXIST,
           "%s: creating it again gives -EEXIST (%s)", b->name, e.msg);
        ok(cg_dirs_exist(cg, true), "%s: a failed second create leaves the first intact", b->name);
        ok((b->v == CGROUP_V2) == (cgroup_clone_fd(cg) >= 0), "%s: clone fd only on v2", b->name);

        /* Limits as written. */
        if (b->v == CGROUP_V1) {
                const char *mem = cg->v1_dir[CGROUP_V1_MEMORY];
                _cleanup_free_ char *oom = NULL, *devs = NULL;

                ok(file_is(mem, "memory.limit_in_bytes", "268435456"), "v1: memory.limit_in_bytes");
                if (cgroup_file_exists(mem, "memory.memsw.limit_in_bytes"))
                        ok(file_is(mem, "memory.memsw.limit_in_bytes", "268435456"),
                           "v1: memory.memsw.limit_in_bytes equals the limit");
                else
                        skip("v1: no memory.memsw.limit_in_bytes (swap accounting off)");
                ok(file_is(mem, "memory.swappiness", "0"), "v1: memory.swappiness 0");
                ok(cgroup_read(mem, "memory.oom_control", &oom, NULL) >= 0 &&
                           strstr(oom, "oom_kill_disable 0"),
                   "v1: OOM killer enabled");
                ok(file_is(cg->v1_dir[CGROUP_V1_PIDS], "pids.max", "64"), "v1: pids.max");
                ok(file_is(cg->v1_dir[CGROUP_V1_CPU], "cpu.cfs_period_us", "100000") &&
                           file_is(cg->v1_dir[CGROUP_V1_CPU], "cpu.cfs_quota_us", "50000"),
                   "v1: cpu quota 500 millis = 50000/100000");
                if (cg->v1_dir[CGROUP_V1_DEVICES]) {
                        ok(cgroup_read(cg->v1_dir[CGROUP_V1_DEVICES], "devices.list", &devs, NULL) >=
                                           0 &&
                                   !strstr(devs, "a *:* rwm") && strstr(devs, "c 1:3 rwm") &&
                                   strstr(devs, "c 136:* rwm"),
                           "v1: devices allow-list in place");
                } else
                        skip("v1: devices controller not mounted");
                if (cg->v1_dir[CGROUP_V1_CPUSET]) {
                        _cleanup_free_ char *cpus = NULL, *mems = NULL;

                        ok(cgroup_read(cg->v1_dir[CGROUP_V1_CPUSET], "cpuset.cpus", &cpus, NULL) >= 0 &&
                                   cgroup_read(cg->v1_dir[CGROUP_V1_CPUSET], "cpuset.mems", &mems,
                                               NULL) >= 0 &&
                                   cpus[0] != '\n' && mems[0] != '\n',
                           "v1: cpuset.cpus/mems copied from the parent");
                } else
                        skip("v1: cpuset controller not mounted");
        } else {
                if (cg->has_memory)
                        ok(file_is(cg->dir, "memory.max", "268435456"), "v2: memory.max");
                else
                        skip("v2: no memory controller in this hierarchy");
                if (cg->has_memory && cgroup_file_exists(cg->dir, "memory.swap.max"))
                        ok(file_is(cg->dir, "memory.swap.max", "0"), "v2: memory.swap.max 0");
                if (cg->has_pids)
                        ok(file_is(cg->dir, "pids.max", "64"), "v2: pids.max");
                else
                        skip("v2: no pids controller in this hierarchy");
                if (cg->has_cpu)
                        ok(file_is(cg->dir, "cpu.max", "50000 100000"), "v2: cpu.max");
                else
                        skip("v2: no cpu controller in this hierarchy");
        }

        /* A child with three helpers. */
        counter = mmap(NULL, sizeof(*counter), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
        if (counter == MAP_FAILED) {
                ok(false, "mmap: %s", strerror(errno));
                teardown(cg);
                return;
        }
        *counter = 0;
        arg = (counter_arg) { .counter = counter, .nforks = 3 };
        pid = start_child(cg, child_counter, &arg);
        ok(pid > 0, "%s: child started in the cgroup (%s)", b->name,
           used_clone3 ? "clone3 CLONE_INTO_CGROUP" : "fork + attach");
        if (pid <= 0)
                goto out;
        if (b->v == CGROUP_V1)
                snprintf(needle, sizeof(needle), ":memory:/%s/%s\n", ROOT, id);
        else
                snprintf(needle, sizeof(needle), "0::/%s/%s\n", ROOT, id);
        ok(proc_in_cgroup(pid, needle), "%s: /proc/%d/cgroup has '%.*s'", b->name, (int) pid,
           (int) strlen(needle) - 1, needle);
        if (b->v == CGROUP_V1) {
                snprintf(needle, sizeof(needle), ":freezer:/%s/%s\n", ROOT, id);
                ok(proc_in_cgroup(pid, needle), "v1: child in the freezer cgroup too");
        }

        /* Let the helpers start and burn their CPU. */
        for (int i = 0; i < 200 && cgroup_count_procs(cg) < 4; i++)
                cgroup_sleep_usec(5000);
        cgroup_sleep_usec(60000);
        n = cgroup_count_procs(cg);
        ok(n == 4, "%s: count_procs = %d (want 4)", b->name, n);

        r = cgroup_stats(cg, &st, &e);
        ok(r == 0, "%s: stats (%s)", b->name, r < 0 ? e.msg : "ok");
        diag("%s: stats current=%" PRIu64 " peak=%" PRIu64 " limit=%" PRIu64 " cpu_ns=%" PRIu64
             " pids=%" PRIu64 " oom_kills=%" PRIu64,
             b->name, st.memory_current, st.memory_peak, st.memory_limit, st.cpu_usage_ns,
             st.pids_current, st.oom_kills);
        ok(st.cpu_usage_ns > 0, "%s: cpu usage > 0", b->name);
        if (has_pids(cg))
                ok(st.pids_current == 4, "%s: pids.current = 4", b->name);
        else
                ok(st.pids_current == 0, "%s: pids_current 0 without the pids controller", b->name);
        if (has_memory(cg))
                ok(st.memory_current > 0 && st.memory_peak >= st.memory_current &&
                           st.memory_limit == 256ULL << 20,
                   "%s: memory current, peak and limit", b->name);
        else
                ok(st.memory_current == 0 && st.memory_limit == 0,
                   "%s: memory stats 0 without the memory controller", b->name);
        ok(st.oom_kills == 0, "%s: no OOM kills yet", b->name);

        /* Freeze: the counter stops. */
        r = cgroup_freeze(cg, &e);
        ok(r == 0, "%s: freeze (%s)", b->name, r < 0 ? e.msg : "ok");
        ok(cgroup_is_frozen(cg) == 1, "%s: is_frozen = 1", b->name);
        if (b->v == CGROUP_V1)
                ok(file_is(cg->v1_dir[CGROUP_V1_FREEZER], "freezer.state", "FROZEN"),
                   "v1: freezer.state FROZEN");
        else {
                uint64_t fz = 0;

                ok(cgroup_read_key_u64(cg->dir, "cgroup.events", "frozen", &fz, NULL) == 0 && fz == 1,
                   "v2: cgroup.events frozen 1");
        }
        c0 = __atomic_load_n(counter, __ATOMIC_RELAXED);
        cgroup_sleep_usec(150000);
        c1 = __atomic_load_n(counter, __ATOMIC_RELAXED);
        ok(c0 == c1, "%s: frozen processes do not run (counter %" PRIu64 " -> %" PRIu64 ")",
           b->name, c0, c1);

        r = cgroup_thaw(cg, &e);
        ok(r == 0, "%s: thaw (%s)", b->name, r < 0 ? e.msg : "ok");
        cgroup_sleep_usec(100000);
        c1 = __atomic_load_n(counter, __ATOMIC_RELAXED);
        ok(c1 > c0, "%s: thawed processes run again (counter %" PRIu64 " -> %" PRIu64 ")", b->name,
           c0, c1);
        ok(cgroup_is_frozen(cg) == 0, "%s: is_frozen = 0", b->name);

        /* Reopen by name, as after a daemon restart. */
        r = cgroup_open(b->v, b->mount, ROOT, id, &opened, &e);
        ok(r == 0 && cgroup_count_procs(opened) == 4, "%s: open finds the live cgroup", b->name);

        /* Kill everything, frozen or not. */
        if (opened)
                (void) cgroup_freeze(opened, NULL);
        {
                uint64_t t0 = now_msec();

                r = cgroup_kill_all(opened ? opened : cg, &e);
                ok(r == 0, "%s: kill_all (%s) in %" PRIu64 " ms", b->name, r < 0 ? e.msg : "ok",
                   now_msec() - t0);
        }
        ok(cgroup_count_procs(cg) == 0, "%s: no processes left", b->name);
        ok(wait_child(pid, 2000, &status) == 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
           "%s: child died of SIGKILL", b->name);
        ok(cgroup_is_frozen(cg) == 0, "%s: not left frozen after kill_all", b->name);
        cgroup_free(opened);
        opened = NULL;

        r = cgroup_destroy(cg, &e);
        ok(r == 0, "%s: destroy (%s)", b->name, r < 0 ? e.msg : "ok");
        ok(cg_dirs_exist(cg, false), "%s: cgroup directories are gone", b->name);
        ok(cgroup_open(b->v, b->mount, ROOT, id, &opened, NULL) == -ENOENT,
           "%s: open after destroy gives -ENOENT", b->name);
        ok(cgroup_destroy(cg, NULL) == 0, "%s: destroy is idempotent", b->name);
        cgroup_free(cg);
        cg = NULL;
out:
        munmap((void *) counter, sizeof(*counter));
        teardown(cg);
}

static void test_oom(const backend *b) {
        hutch_limits l = { .memory_bytes = 32ULL << 20, .pids = 16 };
        hutch_cgroup *cg = NULL;
        hutch_stats st = {};
        hutch_error e = {};
        char id[40];
        int status = 0, r;
        pid_t pid;

        random_id(id, sizeof(id), "test-oom-");
        if (make(b, ROOT, id, &l, &cg) < 0) {
                ok(false, "%s: create for the OOM test", b->name);
                return;
        }
        if (!has_memory(cg)) {
                skip("%s: no memory controller: the memory limit cannot be checked", b->name);
                teardown(cg);
                return;
        }
        /* 32 MiB limit, 96 MiB touched: 64 MiB over. */
        pid = start_child(cg, child_oom, (void *) (uintptr_t) 96);
        r = pid > 0 ? wait_child(pid, 20000, &status) : (int) pid;
        ok(r == 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
           "%s: a child allocating 96 MiB under a 32 MiB limit is OOM-killed (status 0x%x)",
           b->name, (unsigned) status);
        r = cgroup_stats(cg, &st, &e);
        ok(r == 0 && st.oom_kills >= 1, "%s: oom_kills = %" PRIu64 " (>= 1), peak %" PRIu64 " MiB",
           b->name, st.oom_kills, st.memory_peak >> 20);
        ok(st.memory_peak <= (32ULL << 20), "%s: peak within the limit", b->name);
        teardown(cg);
}

static void test_pids_cpu_devices(const backend *b) {
        hutch_limits l = { .memory_bytes = 128ULL << 20, .pids = 8, .cpu_millis = 100 };
        hutch_cgroup *cg = NULL;
        hutch_stats st = {};
        char id[40];
        int status = 0, r;
        pid_t pid;

        random_id(id, sizeof(id), "test-lim-");
        if (make(b, ROOT, id, &l, &cg) < 0) {
                ok(false, "%s: create for the limits test", b->name);
                return;
        }

        if (has_pids(cg)) {
                pid = start_child(cg, child_pids, (void *) (intptr_t) 20);
                r = pid > 0 ? wait_child(pid, 10000, &status) : (int) pid;
                ok(r == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 7,
                   "%s: pids.max 8 lets the child fork 7 times (got %d)", b->name,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                ok(cgroup_kill_all(cg, NULL) == 0 && cgroup_count_procs(cg) == 0,
                   "%s: kill_all removes the orphaned helpers", b->name);
        } else
                skip("%s: no pids controller: pids.max cannot be checked", b->name);

        if (has_cpu(cg)) {
                const char *dir = b->v == CGROUP_V1 ? cg->v1_dir[CGROUP_V1_CPU] : cg->dir;
                uint64_t throttled = 0;

                pid = start_child(cg, child_spin, (void *) (uintptr_t) 400);
                r = pid > 0 ? wait_child(pid, 10000, &status) : (int) pid;
                ok(r == 0 && WIFEXITED(status), "%s: a child spins for 400 ms", b->name);
                (void) cgroup_stats(cg, &st, NULL);
                (void) cgroup_read_key_u64(dir, "cpu.stat", "nr_throttled", &throttled, NULL);
                ok(throttled > 0 && st.cpu_usage_ns < 250ULL * 1000 * 1000,
                   "%s: a 100-millis quota throttles it (nr_throttled %" PRIu64 ", cpu %" PRIu64
                   " ms)",
                   b->name, throttled, st.cpu_usage_ns / 1000000);
        } else
                skip("%s: no cpu controller: cpu.max cannot be checked", b->name);

        if (b->v == CGROUP_V1 && cg->v1_dir[CGROUP_V1_DEVICES]) {
                pid = start_child(cg, child_devices, NULL);
                r = pid > 0 ? wait_child(pid, 5000, &status) : (int) pid;
                ok(r == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                   "v1: /dev/null opens, /dev/kmsg is refused with EPERM (code %d)",
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);

                /* cgroup_allow_devices: exactly the rule given, nothing near it */
                static const char rules[][32] = { "c 195:0 rw" };
                static const char bad[][32] = { "a", "c 195:* rw", "c 195:0 rwm", "b 7:0 rw" };
                char dir[] = "/tmp/hutch-test-gpu-XXXXXX", node[PATH_MAX];
                _cleanup_free_ char *devs = NULL;
                ok(cgroup_allow_devices(cg, rules, 1, NULL) == 0 &&
                           cgroup_read(cg->v1_dir[CGROUP_V1_DEVICES], "devices.list", &devs, NULL) >= 0 &&
                           strstr(devs, "c 195:0 rw") && !strstr(devs, "c 195:1"),
                   "v1: allow_devices adds c 195:0 rw to devices.list");
                bool refused = true;
                for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                        refused &= cgroup_allow_devices(cg, &bad[i], 1, NULL) == -EINVAL;
                ok(refused, "v1: allow_devices refuses 'a', wildcards, mknod and block devices");
                if (mkdtemp(dir)) {
                        snprintf(node, sizeof node, "%s/gpu0", dir);
                        int k = mknod(node, S_IFCHR | 0666, makedev(195, 0));
                        snprintf(node, sizeof node, "%s/gpu1", dir);
                        k |= mknod(node, S_IFCHR | 0666, makedev(195, 1));
                        pid = k == 0 ? start_child(cg, child_gpu_devices, dir) : -1;
                        r = pid > 0 ? wait_child(pid, 5000, &status) : (int) pid;
                        ok(r == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                           "v1: the allowed node reaches its driver (ENXIO), the other is refused with EPERM (code %d)",
                           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                        unlink(node);
                        snprintf(node, sizeof node, "%s/gpu0", dir);
                        unlink(node);
                        rmdir(dir);
                } else
                        ok(false, "v1: mkdtemp for the GPU nodes: %m");
        } else if (b->v == CGROUP_V2) {
                static const char rules[][32] = { "c 195:0 rw" };
                ok(cgroup_allow_devices(cg, rules, 1, NULL) == 0,
                   "v2: allow_devices is a no-op (no devices file; docs/cgroups.md)");
        }
        teardown(cg);
}

static void rmdir_prune_root(const backend *b, const char *root) {
        if (b->v == CGROUP_V2) {
                _cleanup_free_ char *p = cgroup_path_join(b->mount, root);

                if (p)
                        (void) rmdir(p);
                return;
        }
        {
                char *mounts[_CGROUP_V1_MAX] = {};

                if (cgroup_v1_find_mounts(mounts, NULL) < 0)
                        return;
                for (int c = 0; c < _CGROUP_V1_MAX; c++) {
                        _cleanup_free_ char *p = NULL;

                        if (mounts[c] && (p = cgroup_path_join(mounts[c], root)))
                                (void) rmdir(p);
                }
                cgroup_v1_mounts_free(mounts);
        }
}

static void test_prune(const backend *b) {
        hutch_limits l = { .memory_bytes = 64ULL << 20, .pids = 16 };
        hutch_cgroup *a = NULL, *c = NULL, *chk = NULL;
        volatile uint64_t counter = 0;
        counter_arg arg = { .counter = &counter, .nforks = 0 };
        hutch_error e = {};
        char root[64], sub[32];
        char keep_id[] = "keep-me", *keep[] = { keep_id, NULL };
        int status = 0, r;
        pid_t pid;

        random_id(sub, sizeof(sub), "prune-");
        snprintf(root, sizeof(root), "%s/%s", ROOT, sub);
        if (make(b, root, "keep-me", &l, &a) < 0 || make(b, root, "drop-me", &l, &c) < 0) {
                ok(false, "%s: create for the prune test", b->name);
                teardown(a);
                teardown(c);
                return;
        }
        pid = start_child(c, child_counter, &arg);
        ok(pid > 0, "%s: a process in the cgroup to prune", b->name);

        r = cgroup_prune(b->v, b->mount, root, keep, &e);
        ok(r == 0, "%s: prune keeping one (%s)", b->name, r < 0 ? e.msg : "ok");
        ok(cg_dirs_exist(a, true), "%s: the kept cgroup stays", b->name);
        ok(cg_dirs_exist(c, false) &&
                   cgroup_open(b->v, b->mount, root, "drop-me", &chk, NULL) == -ENOENT,
           "%s: the other one is gone", b->name);
        ok(pid > 0 && wait_child(pid, 2000, &status) == 0 && WIFSIGNALED(status) &&
                   WTERMSIG(status) == SIGKILL,
           "%s: its process was killed", b->name);

        r = cgroup_prune(b->v, b->mount, root, NULL, &e);
        ok(r == 0 && cg_dirs_exist(a, false), "%s: prune keeping none removes the rest (%s)",
           b->name, r < 0 ? e.msg : "ok");
        ok(cgroup_prune(b->v, b->mount, "hutch-test/does-not-exist", NULL, NULL) == 0,
           "%s: prune of a missing root is a no-op", b->name);
        cgroup_free(a);
        cgroup_free(c);
        rmdir_prune_root(b, root);
}

/* Backend-independent: the mountinfo parser and the cpu quota arithmetic. */
static void test_parsers(void) {
        static const char mountinfo[] =
                "25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
                "31 25 0:28 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755\n"
                "32 31 0:29 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw\n"
                "33 31 0:30 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd\n"
                "34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw shared:12 - cgroup cgroup rw,cpu,cpuacct\n"
                "35 31 0:32 / /sys/fs/cgroup/cpuset rw shared:13 - cgroup cgroup rw,cpuset\n"
                "36 31 0:33 /docker/abc /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n"
                "37 31 0:34 / /sys/fs/cgroup/net_cls,net_prio rw - cgroup cgroup rw,net_cls,net_prio\n"
                "38 31 0:33 / /mnt/memory-again rw - cgroup cgroup rw,memory\n"
                "39 31 0:35 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n";
        char *m[_CGROUP_V1_MAX] = {};
        uint64_t q = 0;
        FILE *f;
        int r;

        f = fmemopen((void *) mountinfo, sizeof(mountinfo) - 1, "r");
        r = f ? cgroup_v1_parse_mountinfo(f, m, NULL) : -errno;
        if (f)
                fclose(f);
        ok(r == 0 && m[CGROUP_V1_CPU] && m[CGROUP_V1_CPUACCT] &&
                   streq(m[CGROUP_V1_CPU], "/sys/fs/cgroup/cpu,cpuacct") &&
                   streq(m[CGROUP_V1_CPUACCT], "/sys/fs/cgroup/cpu,cpuacct"),
           "mountinfo: co-mounted cpu,cpuacct found for both");
        ok(m[CGROUP_V1_CPUSET] && streq(m[CGROUP_V1_CPUSET], "/sys/fs/cgroup/cpuset"),
           "mountinfo: cpuset is not mistaken for cpu");
        ok(m[CGROUP_V1_MEMORY] && streq(m[CGROUP_V1_MEMORY], "/sys/fs/cgroup/mem ory"),
           "mountinfo: escaped mount point decoded, first mount wins");
        ok(m[CGROUP_V1_FREEZER] && !m[CGROUP_V1_PIDS] && !m[CGROUP_V1_DEVICES],
           "mountinfo: absent controllers are NULL");
        cgroup_v1_mounts_free(m);

        ok(cgroup_cpu_quota_usec(2000, &q, NULL) == 0 && q == 200000, "cpu: 2000 millis = 200000 us");
        ok(cgroup_cpu_quota_usec(1, &q, NULL) == 0 && q == 1000, "cpu: quota raised to 1 ms");
        ok(cgroup_cpu_quota_usec(UINT64_MAX / 10, &q, NULL) == -ERANGE, "cpu: overflow refused");
}

/* A create whose limits the kernel refuses leaves nothing behind. */
static void test_rollback(const backend *b) {
        hutch_limits l = { .memory_bytes = 64ULL << 20, .pids = 1ULL << 40 };
        hutch_cgroup *cg = NULL, *chk = NULL;
        hutch_error e = {};
        char id[40];
        int r;

        random_id(id, sizeof(id), "test-rb-");
        if (b->v == CGROUP_V2) {
                /* Only a limit on a present controller can fail. */
                r = make(b, ROOT, id, NULL, &cg);
                if (r == 0 && !cg->has_pids) {
                        teardown(cg);
                        skip("v2: no pids controller: no limit to make fail");
                        return;
                }
                teardown(cg);
                cg = NULL;
        }
        r = cgroup_create(b->v, b->mount, ROOT, id, &l, &cg, &e);
        ok(r < 0, "%s: pids.max 2^40 is refused (%s)", b->name, e.msg);
        ok(cgroup_open(b->v, b->mount, ROOT, id, &chk, NULL) == -ENOENT,
           "%s: the refused create left no directory", b->name);
        cgroup_free(chk);
        if (r == 0)
                teardown(cg);
}

static void run_backend(const char *override) {
        backend b = {};
        hutch_error e = {};
        int r;

        r = cgroup_detect(override, &b.v, &b.mount, &e);
        if (r < 0) {
                skip("backend %s unavailable: %s", override ? override : "auto", e.msg);
                return;
        }
        b.name = b.v == CGROUP_V1 ? "v1" : "v2";
        diag("backend %s (%s) at %s", b.name, override ? override : "auto", b.mount);
        ok(true, "detect %s: %s at %s", override ? override : "auto", b.name, b.mount);

        test_names(&b);
        test_lifecycle(&b);
        test_oom(&b);
        test_pids_cpu_devices(&b);
        test_rollback(&b);
        test_prune(&b);
        free(b.mount);
}

int main(void) {
        const char *only = getenv("HUTCH_CGROUP");
        cgroup_version v;
        char *m = NULL;

        if (geteuid() != 0) {
                printf("1..0 # SKIP needs root to create cgroups\n");
                return 77;
        }
        if (cgroup_detect(NULL, &v, &m, NULL) < 0) {
                printf("1..0 # SKIP no usable cgroup hierarchy\n");
                return 77;
        }

        ok(cgroup_detect("v3", &v, &m, NULL) == -EINVAL, "detect refuses an unknown backend");
        if (v == CGROUP_V1) {
                cgroup_version v1 = 0;
                char *m1 = NULL;

                ok(cgroup_detect("v1", &v1, &m1, NULL) == 0 && v1 == CGROUP_V1,
                   "detect v1 forced on a v1 host");
                free(m1);
        }
        test_parsers();
        if (only && *only)
                run_backend(only);
        else {
                /* auto, and v2 forced when auto picked v1 (hybrid host). */
                run_backend(NULL);
                if (v == CGROUP_V1)
                        run_backend("v2");
        }
        free(m);
        printf("1..%u\n", n_tests);
        return n_failed ? 1 : 0;
}
