/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory limit of a gVisor sandbox, enforced from inside (PID 1).
 *
 * Under gVisor the whole sandbox is one host process tree (the sentry and
 * its gofer), and the host cgroup can only charge that tree as a whole: at
 * the cgroup's limit the host's OOM killer ends the sentry, and with it
 * every process of the sandbox. The namespace backend behaves otherwise:
 * there the kernel's OOM killer takes the largest process and the sandbox
 * lives on. To give the application that same answer, init watches the
 * sentry's own accounting (/proc/meminfo inside: everything the sandbox's
 * processes, page cache and in-memory files hold) and, once it passes the
 * sandbox's limit, SIGKILLs the process with the most resident memory, as
 * the kernel would (one at a time: the next only if usage stays over the
 * limit for a second after the last kill, or grows by an eighth of the
 * limit more than 200 ms after it). Files in the writable layer live in that memory too and count;
 * killing cannot free them. The host cgroup allows the limit plus the
 * runtime's own memory and headroom (sandbox-internal.h): the backstop.
 *
 * The check runs on a timer whose interval shrinks as usage nears the
 * limit: the time an allocation at 8 GB/s (measured: MAP_POPULATE under the
 * ptrace platform ~3.3 GB/s, touching page by page ~0.15 GB/s) needs to
 * cover the distance left, between 2 ms and 100 ms. An idle sandbox reads
 * one small file ten times a second. One allocation that jumps past the
 * limit by more than the cgroup's headroom in a single step (one
 * mmap(MAP_POPULATE) of that size) still meets the host's OOM killer,
 * which ends the whole sandbox.
 *
 * Killing cannot help when the writer is init itself: an upload (POST
 * /files) is written into the layer by init, which memwatch never picks,
 * and the file's pages would stay after any kill anyway. Such writes ask
 * memwatch_write_room() first and fail with EDQUOT (the daemon's 507) once
 * they would take usage past the limit less a reserve; without that a
 * compressed upload could inflate straight past the host cgroup's backstop,
 * whose OOM killer then ended the sentry and the whole sandbox.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "init.h"

#define MW_MIN_NS (2ull * 1000 * 1000)
#define MW_MAX_NS (100ull * 1000 * 1000)
/* bytes per ms the fastest allocation we measured takes (with margin) */
#define MW_RATE_PER_MS (8ull << 20)
#define MW_GRACE_NS (1000ull * 1000 * 1000)
#define MW_VICTIM_NS (200ull * 1000 * 1000)
/* init's own writes into the layer stop this far below the limit: room for
 * the sandbox's processes to go on, and for what they allocate while init
 * writes (init checks before each batch, at most 4 MiB, and again before
 * each megabyte once the room left is smaller) */
#define MW_WRITE_RESERVE(limit) ((limit) / 16 > (4ull << 20) ? (limit) / 16 : (4ull << 20))

static source timer_src = { .fd = -1 };
static int meminfo_fd = -1;
static uint64_t limit_bytes;
static uint64_t killed_at, used_at_kill;

static uint64_t now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

/* The value of "Key:  N kB" in a /proc/meminfo text, in bytes. */
static bool meminfo_value(const char *text, const char *key, uint64_t *ret) {
        size_t kl = strlen(key);
        for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
                if (strncmp(p, key, kl) != 0 || p[kl] != ':')
                        continue;
                char *end;
                errno = 0;
                unsigned long long v = strtoull(p + kl + 1, &end, 10);
                if (errno || end == p + kl + 1 || v > UINT64_MAX / 1024)
                        return false;
                *ret = (uint64_t) v * 1024;
                return true;
        }
        return false;
}

/* What the sandbox uses now, by the sentry's count; false if unknown. */
static bool usage_now(uint64_t *ret) {
        char buf[4096];
        ssize_t n = pread(meminfo_fd, buf, sizeof buf - 1, 0);
        if (n <= 0)
                return false;
        buf[n] = 0;
        uint64_t total, free_;
        if (!meminfo_value(buf, "MemTotal", &total) || !meminfo_value(buf, "MemFree", &free_) || free_ > total)
                return false;
        *ret = total - free_;
        return true;
}

/* Resident pages of a process; 0 if it is gone or a zombie. */
static uint64_t resident_pages(pid_t pid) {
        char path[64], buf[128];
        snprintf(path, sizeof path, "/proc/%d/statm", (int) pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return 0;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
                return 0;
        buf[n] = 0;
        char *p = strchr(buf, ' ');
        return p ? strtoull(p + 1, NULL, 10) : 0;
}

static pid_t largest_process(void) {
        DIR *d = opendir("/proc");
        if (!d)
                return 0;
        pid_t best = 0;
        uint64_t best_pages = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                char *end;
                long pid = strtol(e->d_name, &end, 10);
                if (*end || pid <= 1 || pid == getpid())
                        continue;
                uint64_t pages = resident_pages((pid_t) pid);
                if (pages > best_pages) {
                        best_pages = pages;
                        best = (pid_t) pid;
                }
        }
        closedir(d);
        return best;
}

static void arm(uint64_t ns) {
        struct itimerspec its = { .it_value = { .tv_sec = (time_t) (ns / 1000000000ull),
                                                .tv_nsec = (long) (ns % 1000000000ull) } };
        (void) timerfd_settime(timer_src.fd, 0, &its, NULL);
}

static void check(void) {
        uint64_t used;
        if (!usage_now(&used)) {
                arm(MW_MAX_NS);
                return;
        }
        if (used > limit_bytes) {
                /* One victim at a time. While it dies, its last system
                 * call (a large mmap, maybe) still completes and usage may
                 * go on rising: give it MW_VICTIM_NS whatever happens. Its
                 * memory then comes back bit by bit: the next victim only
                 * once a grace has passed with usage still over the limit,
                 * or at once when others keep allocating past what it held
                 * at its kill. */
                uint64_t now = now_ns(), since = now - killed_at;
                if (killed_at && since < MW_GRACE_NS &&
                    (since < MW_VICTIM_NS || used <= used_at_kill + limit_bytes / 8)) {
                        arm(MW_MIN_NS);
                        return;
                }
                pid_t victim = largest_process();
                if (victim > 0 && kill(victim, SIGKILL) == 0) {
                        killed_at = now;
                        used_at_kill = used;
                        log_debug("memory %llu > limit %llu: killed pid %d", (unsigned long long) used,
                                  (unsigned long long) limit_bytes, (int) victim);
                        guest_report_oom_kill();
                }
                arm(MW_MIN_NS);
                return;
        }
        uint64_t ns = (limit_bytes - used) / MW_RATE_PER_MS * 1000000ull;
        arm(ns < MW_MIN_NS ? MW_MIN_NS : ns > MW_MAX_NS ? MW_MAX_NS : ns);
}

bool memwatch_write_room(uint64_t *ret) {
        uint64_t used, reserve = MW_WRITE_RESERVE(limit_bytes);
        if (!limit_bytes || meminfo_fd < 0 || !usage_now(&used))
                return false;
        *ret = used + reserve < limit_bytes ? limit_bytes - reserve - used : 0;
        return true;
}

static void timer_dispatch(source *s, uint32_t events) {
        uint64_t ticks;
        (void) !read(s->fd, &ticks, sizeof ticks);
        check();
}

static void noop_release(source *s) {
}

void memwatch_restored(void) {
        /* the loop's epoll set is new (loop_rebuild): check now */
        if (timer_src.fd >= 0)
                arm(MW_MIN_NS);
}

int memwatch_setup(uint64_t limit) {
        if (!limit)
                return 0;
        meminfo_fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
        if (meminfo_fd < 0)
                return negative_errno();
        int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
        if (fd < 0)
                return negative_errno();
        limit_bytes = limit;
        timer_src = (source) { .fd = fd, .dispatch = timer_dispatch, .release = noop_release };
        int r = source_add(&timer_src, EPOLLIN);
        if (r < 0)
                return r;
        arm(MW_MIN_NS);
        return 0;
}
