/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench-inproc: libhutch measured from inside one process, as the daemon uses
 * it, against fork+exec references timed in the same rounds (docs/design.md §7).
 *
 *   bench-inproc [-n ROUNDS] [-k IDLE] [--static PATH]
 *
 * Part 1, N interleaved rounds; each round (in an order that rotates) runs
 *   - fork + execve of a static binary (PATH, if given)       the reference
 *   - posix_spawn of the same static binary
 *   - fork + execve of /bin/true (dynamic)
 *   - one sandbox cycle: create (returns once hutch-init answered HELLO),
 *     spawn /bin/true and wait for its exit, spawn+wait once more on the now
 *     warm sandbox, destroy.
 * Part 2, memory: K sandboxes are created and left idle; the PSS of each
 * sandbox's processes (hutch-init and any descendants, from
 * /proc/PID/smaps_rollup) is summed, and this process's own growth in RSS and
 * PSS, divided by K, is the host-side share per sandbox.
 *
 * Prints markdown on stdout; errors on stderr, exit 1.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "hutch/hutch.h"

extern char **environ;

#define WARMUP_ROUNDS 3
#define WAIT_TIMEOUT_MS 10000

enum {
        M_FORK_STATIC,
        M_SPAWN_STATIC,
        M_FORK_DYNAMIC,
        M_CREATE_READY,
        M_CREATE_FIRST_EXIT,
        M_SPAWN_LIVE,
        M_DESTROY,
        M_CYCLE,
        _M_MAX,
};

static const char *const measurement_names[_M_MAX] = {
        [M_FORK_STATIC] = "fork+exec, static binary (reference)",
        [M_SPAWN_STATIC] = "posix_spawn, static binary",
        [M_FORK_DYNAMIC] = "fork+exec `/bin/true` (dynamic)",
        [M_CREATE_READY] = "create → init ready",
        [M_CREATE_FIRST_EXIT] = "create → first `/bin/true` exited",
        [M_SPAWN_LIVE] = "spawn+wait `/bin/true`, live sandbox",
        [M_DESTROY] = "destroy",
        [M_CYCLE] = "create + 2 runs + destroy",
};

typedef struct samples {
        uint64_t *v;
        size_t n;
} samples;

static uint64_t now_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static void samples_add(samples *s, uint64_t v) {
        s->v[s->n++] = v;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

/* Median, nearest-rank p99 and mean, in nanoseconds. */
static void samples_summary(samples *s, double *ret_median, double *ret_p99, double *ret_mean) {
        double sum = 0;
        size_t k;

        qsort(s->v, s->n, sizeof(uint64_t), cmp_u64);
        if (s->n % 2)
                *ret_median = (double) s->v[s->n / 2];
        else
                *ret_median = ((double) s->v[s->n / 2 - 1] + (double) s->v[s->n / 2]) / 2;
        k = (s->n * 99 + 99) / 100; /* ceil(0.99 n) */
        *ret_p99 = (double) s->v[k > 0 ? k - 1 : 0];
        for (size_t i = 0; i < s->n; i++)
                sum += (double) s->v[i];
        *ret_mean = sum / (double) s->n;
}

static int wait_exit(pid_t pid) {
        int status;

        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return -ECHILD;
        return 0;
}

static int time_fork_exec(const char *path, uint64_t *ret_ns) {
        char *const argv[] = { (char *) path, NULL };
        uint64_t t0 = now_ns();
        pid_t pid;
        int r;

        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                execve(path, argv, environ);
                _exit(127);
        }
        r = wait_exit(pid);
        if (r < 0)
                return r;
        *ret_ns = now_ns() - t0;
        return 0;
}

static int time_posix_spawn(const char *path, uint64_t *ret_ns) {
        char *const argv[] = { (char *) path, NULL };
        uint64_t t0 = now_ns();
        pid_t pid;
        int r;

        r = posix_spawn(&pid, path, NULL, NULL, argv, environ);
        if (r != 0)
                return -r;
        r = wait_exit(pid);
        if (r < 0)
                return r;
        *ret_ns = now_ns() - t0;
        return 0;
}

static void close_process(hutch_process *p) {
        if (p->stdin_fd >= 0)
                close(p->stdin_fd);
        if (p->stdout_fd >= 0)
                close(p->stdout_fd);
        if (p->stderr_fd >= 0)
                close(p->stderr_fd);
}

/* Spawn /bin/true as root in sb and wait for its exit. */
static int run_true(hutch_sandbox *sb, hutch_error *err) {
        static const char *const argv[] = { "/bin/true", NULL };
        hutch_spawn_config cfg = {
                .argv = argv,
                .stdin_mode = HUTCH_STDIN_NULL,
        };
        hutch_process p;
        hutch_exit ex;
        int r;

        r = hutch_sandbox_spawn(sb, &cfg, &p, err);
        if (r < 0)
                return r;
        close_process(&p);
        r = hutch_sandbox_wait(sb, WAIT_TIMEOUT_MS, &ex, err);
        if (r < 0)
                return r;
        if (ex.pid != p.pid || ex.signal != 0 || ex.exit_code != 0) {
                snprintf(err->msg, sizeof(err->msg),
                         "/bin/true (pid %d): exit %d, signal %d, got pid %d", (int) p.pid,
                         ex.exit_code, ex.signal, (int) ex.pid);
                err->code = -ECHILD;
                return -ECHILD;
        }
        return 0;
}

/* One create → run → run → destroy cycle; fills the sandbox measurements. */
static int sandbox_cycle(hutch_ctx *ctx, uint64_t ret_ns[_M_MAX], hutch_error *err) {
        hutch_sandbox_config cfg = { 0 };
        hutch_sandbox *sb = NULL;
        uint64_t t0, t1, t2, t3, t4;
        int r;

        t0 = now_ns();
        r = hutch_sandbox_create(ctx, &cfg, &sb, err);
        if (r < 0)
                return r;
        t1 = now_ns();
        r = run_true(sb, err);
        if (r < 0)
                goto fail;
        t2 = now_ns();
        r = run_true(sb, err);
        if (r < 0)
                goto fail;
        t3 = now_ns();
        r = hutch_sandbox_destroy(sb, err);
        hutch_sandbox_unref(sb);
        if (r < 0)
                return r;
        t4 = now_ns();

        ret_ns[M_CREATE_READY] = t1 - t0;
        ret_ns[M_CREATE_FIRST_EXIT] = t2 - t0;
        ret_ns[M_SPAWN_LIVE] = t3 - t2;
        ret_ns[M_DESTROY] = t4 - t3;
        ret_ns[M_CYCLE] = t4 - t0;
        return 0;

fail:
        hutch_sandbox_destroy(sb, NULL);
        hutch_sandbox_unref(sb);
        return r;
}

/* The kB value of "Key:" in a /proc file, or -1. */
static long proc_kb(const char *path, const char *key) {
        char line[256];
        size_t klen = strlen(key);
        long v = -1;
        FILE *f;

        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
                        v = strtol(line + klen + 1, NULL, 10);
                        break;
                }
        fclose(f);
        return v;
}

/* PSS in kB of pid and every descendant (via /proc/PID/task/TID/children). */
static long tree_pss_kb(pid_t pid, unsigned depth, unsigned *ret_nproc) {
        char path[128];
        long total, v;
        DIR *d;
        struct dirent *de;

        snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int) pid);
        total = proc_kb(path, "Pss");
        if (total < 0)
                return -1;
        (*ret_nproc)++;
        if (depth > 32)
                return total;

        snprintf(path, sizeof(path), "/proc/%d/task", (int) pid);
        d = opendir(path);
        if (!d)
                return total;
        while ((de = readdir(d))) {
                char cpath[128];
                FILE *f;
                int child, tid;

                tid = atoi(de->d_name);
                if (tid <= 0)
                        continue;
                snprintf(cpath, sizeof(cpath), "/proc/%d/task/%d/children", (int) pid, tid);
                f = fopen(cpath, "re");
                if (!f)
                        continue;
                while (fscanf(f, "%d", &child) == 1) {
                        v = tree_pss_kb(child, depth + 1, ret_nproc);
                        if (v > 0)
                                total += v;
                }
                fclose(f);
        }
        closedir(d);
        return total;
}

static unsigned count_fds(void) {
        unsigned n = 0;
        DIR *d = opendir("/proc/self/fd");
        struct dirent *de;

        if (!d)
                return 0;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n > 0 ? n - 1 : 0; /* the directory's own fd */
}

static void print_row(const char *name, samples *s, double ref_median) {
        double median, p99, mean;

        if (s->n == 0) {
                printf("| %s | n/a | | | |\n", name);
                return;
        }
        samples_summary(s, &median, &p99, &mean);
        printf("| %s | %.3f | %.3f | %.3f | ", name, median / 1e6, p99 / 1e6, mean / 1e6);
        if (ref_median > 0)
                printf("%.2f |\n", median / ref_median);
        else
                printf("– |\n");
}

static int bench_latency(hutch_ctx *ctx, unsigned rounds, const char *static_path) {
        samples s[_M_MAX] = {};
        unsigned nkinds = static_path ? 4 : 2;
        double ref_median = 0, unused1, unused2;
        hutch_error err = {};
        int r;

        for (size_t m = 0; m < _M_MAX; m++) {
                s[m].v = calloc(rounds, sizeof(uint64_t));
                if (!s[m].v)
                        return -ENOMEM;
        }

        for (unsigned round = 0; round < WARMUP_ROUNDS + rounds; round++) {
                bool keep = round >= WARMUP_ROUNDS;

                for (unsigned j = 0; j < nkinds; j++) {
                        /* Rotate the order so that no kind always runs right after another. */
                        unsigned kind = (j + round) % nkinds;
                        uint64_t ns[_M_MAX] = {};

                        /* Kinds: 0 sandbox cycle, 1 fork+exec /bin/true, 2 and 3 the static ones. */
                        switch (kind) {
                        case 0:
                                r = sandbox_cycle(ctx, ns, &err);
                                if (r < 0) {
                                        fprintf(stderr, "sandbox cycle: %s (%s)\n",
                                                err.msg[0] ? err.msg : "failed", strerror(-r));
                                        return r;
                                }
                                if (keep)
                                        for (size_t m = M_CREATE_READY; m <= M_CYCLE; m++)
                                                samples_add(&s[m], ns[m]);
                                break;
                        case 1:
                                r = time_fork_exec("/bin/true", &ns[0]);
                                if (r < 0) {
                                        fprintf(stderr, "fork+exec /bin/true: %s\n", strerror(-r));
                                        return r;
                                }
                                if (keep)
                                        samples_add(&s[M_FORK_DYNAMIC], ns[0]);
                                break;
                        case 2:
                                r = time_fork_exec(static_path, &ns[0]);
                                if (r < 0) {
                                        fprintf(stderr, "fork+exec %s: %s\n", static_path,
                                                strerror(-r));
                                        return r;
                                }
                                if (keep)
                                        samples_add(&s[M_FORK_STATIC], ns[0]);
                                break;
                        case 3:
                                r = time_posix_spawn(static_path, &ns[0]);
                                if (r < 0) {
                                        fprintf(stderr, "posix_spawn %s: %s\n", static_path,
                                                strerror(-r));
                                        return r;
                                }
                                if (keep)
                                        samples_add(&s[M_SPAWN_STATIC], ns[0]);
                                break;
                        }
                }
        }

        /* Ratios are against fork+exec of a static binary, else of /bin/true. */
        if (s[M_FORK_STATIC].n > 0)
                samples_summary(&s[M_FORK_STATIC], &ref_median, &unused1, &unused2);
        else
                samples_summary(&s[M_FORK_DYNAMIC], &ref_median, &unused1, &unused2);

        printf("%u interleaved rounds (+%d warm-up) in one process; cgroup backend %s, "
               "writable layers on %s.\n\n",
               rounds, WARMUP_ROUNDS, hutch_ctx_cgroup_backend(ctx), hutch_ctx_storage_backend(ctx));
        printf("| measurement | median ms | p99 ms | mean ms | × %s |\n",
               s[M_FORK_STATIC].n > 0 ? "fork+exec static" : "fork+exec /bin/true");
        printf("|---|---:|---:|---:|---:|\n");
        for (size_t m = 0; m < _M_MAX; m++) {
                if (s[m].n == 0 && (m == M_FORK_STATIC || m == M_SPAWN_STATIC))
                        continue;
                print_row(measurement_names[m], &s[m], ref_median);
        }
        printf("\n");

        for (size_t m = 0; m < _M_MAX; m++)
                free(s[m].v);
        return 0;
}

static int bench_memory(hutch_ctx *ctx, unsigned k) {
        hutch_sandbox **sbs;
        hutch_error err = {};
        long rss0, rss1, pss0, pss1, init_total = 0, cg_total = 0;
        unsigned fds0, fds1, created = 0, nproc = 0, with_stats = 0;
        uint64_t t0, t_create, t_destroy;
        int r = 0;

        sbs = calloc(k, sizeof(*sbs));
        if (!sbs)
                return -ENOMEM;

        rss0 = proc_kb("/proc/self/status", "VmRSS");
        pss0 = proc_kb("/proc/self/smaps_rollup", "Pss");
        fds0 = count_fds();

        t0 = now_ns();
        for (; created < k; created++) {
                hutch_sandbox_config cfg = { 0 };

                r = hutch_sandbox_create(ctx, &cfg, &sbs[created], &err);
                if (r < 0) {
                        fprintf(stderr, "creating idle sandbox %u of %u: %s\n", created + 1, k,
                                err.msg[0] ? err.msg : strerror(-r));
                        break;
                }
        }
        t_create = now_ns() - t0;
        usleep(200 * 1000); /* let every init settle into its idle loop */

        rss1 = proc_kb("/proc/self/status", "VmRSS");
        pss1 = proc_kb("/proc/self/smaps_rollup", "Pss");
        fds1 = count_fds();
        for (unsigned i = 0; i < created; i++) {
                hutch_stats st;
                long v;

                v = tree_pss_kb(hutch_sandbox_init_pid(sbs[i]), 0, &nproc);
                if (v > 0)
                        init_total += v;
                if (hutch_sandbox_stats(sbs[i], &st, NULL) >= 0 && st.memory_current > 0) {
                        cg_total += (long) (st.memory_current / 1024);
                        with_stats++;
                }
        }

        t0 = now_ns();
        for (unsigned i = 0; i < created; i++) {
                if (hutch_sandbox_destroy(sbs[i], &err) < 0)
                        fprintf(stderr, "destroying idle sandbox %u: %s\n", i, err.msg);
                hutch_sandbox_unref(sbs[i]);
        }
        t_destroy = now_ns() - t0;
        free(sbs);

        if (created == 0)
                return r < 0 ? r : -EIO;

        printf("%u idle sandboxes held at once (created in %.1f ms, %.0f/s sequentially; "
               "destroyed in %.1f ms).\n\n",
               created, (double) t_create / 1e6, created / ((double) t_create / 1e9),
               (double) t_destroy / 1e6);
        printf("| memory per idle sandbox | KiB |\n|---|---:|\n");
        printf("| sandbox processes, PSS (%u processes in all) | %.0f |\n", nproc,
               (double) init_total / created);
        if (rss0 >= 0 && rss1 >= 0)
                printf("| host side: this process's RSS growth / %u | %.0f |\n", created,
                       (double) (rss1 - rss0) / created);
        if (pss0 >= 0 && pss1 >= 0)
                printf("| host side: this process's PSS growth / %u | %.0f |\n", created,
                       (double) (pss1 - pss0) / created);
        if (rss0 >= 0 && rss1 >= 0)
                printf("| **sandbox PSS + host RSS share** | **%.0f** |\n",
                       (double) (init_total + (rss1 - rss0)) / created);
        if (with_stats > 0)
                printf("| cgroup memory charge (memory.current, incl. kernel) | %.0f |\n",
                       (double) cg_total / with_stats);
        printf("\nDescriptors held by this process per sandbox: %.1f.\n\n",
               (double) (fds1 - fds0) / created);
        return created == k ? 0 : r;
}

static void usage(FILE *f) {
        fprintf(f, "usage: bench-inproc [-n ROUNDS] [-k IDLE_SANDBOXES] [--static PATH]\n");
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "rounds", required_argument, NULL, 'n' },
                { "idle", required_argument, NULL, 'k' },
                { "static", required_argument, NULL, 's' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        unsigned rounds = 200, k = 50;
        const char *static_path = NULL;
        hutch_ctx *ctx = NULL;
        hutch_error err = {};
        int c, r;

        while ((c = getopt_long(argc, argv, "n:k:s:h", options, NULL)) >= 0)
                switch (c) {
                case 'n':
                        rounds = (unsigned) strtoul(optarg, NULL, 10);
                        break;
                case 'k':
                        k = (unsigned) strtoul(optarg, NULL, 10);
                        break;
                case 's':
                        static_path = optarg;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        if (rounds == 0) {
                usage(stderr);
                return 2;
        }
        if (static_path && access(static_path, X_OK) < 0) {
                fprintf(stderr, "%s: %s\n", static_path, strerror(errno));
                return 1;
        }

        r = hutch_ctx_new(NULL, &ctx, &err);
        if (r < 0) {
                fprintf(stderr, "hutch_ctx_new: %s\n", err.msg[0] ? err.msg : strerror(-r));
                return 1;
        }

        /* Results go out as they are made: a failure in part 2 keeps part 1. */
        setvbuf(stdout, NULL, _IOLBF, 0);
        r = bench_latency(ctx, rounds, static_path);
        if (r >= 0 && k > 0)
                r = bench_memory(ctx, k);

        hutch_ctx_free(ctx);
        return r < 0 ? 1 : 0;
}
