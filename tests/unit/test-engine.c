/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libhutch's public API against real sandboxes: processes (pipes, stdin,
 * pty, signals, a second handle attached by id, listing and re-attaching
 * processes), the non-blocking event reader, directory watches, every file
 * operation with its metadata (on the ext4 and the tmpfs layer, and ENOSPC
 * of a full layer), and the promise that file APIs resolve paths inside the
 * sandbox, never on the host (a planted symlink to a host path reads the
 * sandbox's file). Needs root; exits 77 (skip) otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "hutch/hutch.h"
#include "tap.h"

static hutch_fs_user user = { 1000, 1000 };
static hutch_fs_user root = { 0, 0 };

/* Read everything from fd until EOF (or timeout) into buf. */
static size_t slurp(int fd, char *buf, size_t cap, int timeout_ms) {
        size_t n = 0;
        for (;;) {
                struct pollfd p = { .fd = fd, .events = POLLIN };
                if (poll(&p, 1, timeout_ms) <= 0)
                        break;
                ssize_t k = read(fd, buf + n, cap - 1 - n);
                if (k < 0 && (errno == EAGAIN || errno == EINTR))
                        continue;
                if (k <= 0)
                        break;
                n += (size_t) k;
                if (n == cap - 1)
                        break;
        }
        buf[n] = 0;
        return n;
}

static void close_proc(hutch_process *p) {
        if (p->stdin_fd >= 0)
                close(p->stdin_fd);
        if (p->stdout_fd >= 0)
                close(p->stdout_fd);
        if (p->stderr_fd >= 0)
                close(p->stderr_fd);
}

/* Read from fd into buf until needle shows up (or ~10 s). */
static bool read_until(int fd, char *buf, size_t cap, const char *needle) {
        size_t n = 0;
        buf[0] = 0;
        for (int i = 0; i < 50 && !strstr(buf, needle); i++) {
                struct pollfd pf = { .fd = fd, .events = POLLIN };
                if (poll(&pf, 1, 200) > 0) {
                        ssize_t k = read(fd, buf + n, cap - 1 - n);
                        if (k > 0)
                                n += (size_t) k;
                }
                buf[n] = 0;
        }
        return strstr(buf, needle) != NULL;
}

/* Wait for the exit of pid (other exits queued meanwhile are skipped). */
static int wait_pid(hutch_sandbox *sb, pid_t pid, hutch_exit *ex, hutch_error *err) {
        for (int i = 0; i < 64; i++) {
                int r = hutch_sandbox_wait(sb, 10000, ex, err);
                if (r < 0 || ex->pid == pid)
                        return r;
        }
        return -ETIMEDOUT;
}

/* Run argv as uid 1000, return its exit; stdout into out. */
static int run(hutch_sandbox *sb, const char *const *argv, char *out, size_t cap) {
        hutch_spawn_config sc = { .argv = argv, .uid = 1000, .gid = 1000, .cwd = "/home/user" };
        hutch_process p;
        hutch_error err = { 0 };
        if (hutch_sandbox_spawn(sb, &sc, &p, &err) < 0) {
                printf("# spawn: %s\n", err.msg);
                return -1;
        }
        char tmp[16];
        slurp(p.stdout_fd, out ? out : tmp, out ? cap : sizeof tmp, 10000);
        hutch_exit ex;
        int r = wait_pid(sb, p.pid, &ex, &err);
        close_proc(&p);
        if (r < 0) {
                printf("# wait: %s\n", err.msg);
                return -1;
        }
        return ex.signal ? 128 + ex.signal : ex.exit_code;
}

/* ---------------------------------------------------------------- events */

static int64_t mono_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void drain_events(hutch_sandbox *sb) {
        hutch_event ev;
        hutch_error err = { 0 };
        while (hutch_sandbox_next_event(sb, &ev, &err) == 1)
                hutch_event_clear(&ev);
}

/* The next event that match() accepts, within timeout_ms; others are
 * skipped (handed to seen() first when given). 1 found, 0 not, <0 error. */
typedef bool (*event_match_fn)(const hutch_event *ev, const void *arg);
static int next_event_until(hutch_sandbox *sb, event_match_fn match, const void *arg, int timeout_ms, hutch_event *ret,
                            void (*seen)(const hutch_event *ev, void *userdata), void *userdata) {
        int64_t deadline = mono_ms() + timeout_ms;
        hutch_error err = { 0 };
        for (;;) {
                hutch_event ev;
                int r = hutch_sandbox_next_event(sb, &ev, &err);
                if (r < 0) {
                        printf("# next_event: %s\n", err.msg);
                        return r;
                }
                if (r == 1) {
                        if (seen)
                                seen(&ev, userdata);
                        if (match(&ev, arg)) {
                                *ret = ev;
                                return 1;
                        }
                        hutch_event_clear(&ev);
                        continue;
                }
                int64_t left = deadline - mono_ms();
                if (left <= 0)
                        return 0;
                struct pollfd pf = { .fd = hutch_sandbox_fd(sb), .events = POLLIN };
                (void) poll(&pf, 1, (int) (left < 100 ? left : 100));
        }
}

static bool match_exit_of(const hutch_event *ev, const void *arg) {
        return ev->type == HUTCH_EVENT_EXIT && ev->exit.pid == *(const pid_t *) arg;
}

typedef struct watch_want {
        uint32_t id;
        int kind;
        const char *path;
} watch_want;

static bool match_watch(const hutch_event *ev, const void *arg) {
        const watch_want *w = arg;
        return ev->type == HUTCH_EVENT_WATCH && ev->watch_id == w->id && ev->watch_kind == w->kind && ev->path &&
               strcmp(ev->path, w->path) == 0;
}

static bool match_none(const hutch_event *ev, const void *arg) {
        return false;
}

typedef struct watch_seen {
        uint32_t id;
        unsigned n_of_id;
        unsigned n_temp; /* paths naming a write's temporary file */
        bool saw_write;
} watch_seen;

static void note_watch(const hutch_event *ev, void *userdata) {
        watch_seen *ws = userdata;
        if (ev->type != HUTCH_EVENT_WATCH)
                return;
        if (ev->watch_id == ws->id) {
                ws->n_of_id++;
                if (ev->watch_kind == HUTCH_WATCH_WRITE)
                        ws->saw_write = true;
        }
        if (ev->path && strstr(ev->path, ".hutch-"))
                ws->n_temp++;
}

static void test_events(hutch_sandbox *sb) {
        hutch_error err = { 0 };
        hutch_event ev;

        drain_events(sb);
        int64_t t0 = mono_ms();
        int r = hutch_sandbox_next_event(sb, &ev, &err);
        ok(r == 0 && mono_ms() - t0 < 200, "next_event with nothing queued returns 0 at once (r=%d)", r);

        const char *tru[] = { "sh", "-c", "exit 7", NULL };
        hutch_spawn_config sc = { .argv = tru, .uid = 1000, .gid = 1000, .cwd = "/" };
        hutch_process p;
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0, "spawn a short process (%s)", err.msg);
        close_proc(&p);
        r = next_event_until(sb, match_exit_of, &p.pid, 10000, &ev, NULL, NULL);
        ok(r == 1 && ev.type == HUTCH_EVENT_EXIT && ev.exit.exit_code == 7 && ev.exit.signal == 0 && !ev.path,
           "next_event returns its exit (code %d) when the fd is readable", r == 1 ? ev.exit.exit_code : -1);
        if (r == 1)
                hutch_event_clear(&ev);

        /* an exit that arrives while a synchronous call waits is queued */
        const char *slp[] = { "sh", "-c", "sleep 0.2", NULL };
        sc.argv = slp;
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0, "spawn a process that exits during a later call");
        close_proc(&p);
        usleep(500 * 1000);
        hutch_file_info fi;
        ok(hutch_fs_stat(sb, &user, "/", &fi, &err) == 0, "a synchronous call after it exited");
        hutch_file_info_clear(&fi);
        r = next_event_until(sb, match_exit_of, &p.pid, 0, &ev, NULL, NULL);
        ok(r == 1, "its exit was queued meanwhile and comes back without waiting");
        if (r == 1)
                hutch_event_clear(&ev);
        hutch_event_clear(NULL);
}

/* Start argv as the user and forget it: run() waits with
 * hutch_sandbox_wait(), which discards the watch events it passes. */
static bool spawn_bg(hutch_sandbox *sb, const char *const *argv) {
        hutch_spawn_config sc = { .argv = argv, .uid = 1000, .gid = 1000, .cwd = "/home/user" };
        hutch_process p;
        hutch_error err = { 0 };
        if (hutch_sandbox_spawn(sb, &sc, &p, &err) < 0) {
                printf("# spawn: %s\n", err.msg);
                return false;
        }
        close_proc(&p);
        return true;
}

static void test_watch(hutch_sandbox *sb) {
        hutch_error err = { 0 };
        hutch_event ev;
        uint32_t id = 0, rid = 0, bad = 0;
        int r;

        drain_events(sb);
        ok(hutch_fs_watch_add(sb, &user, "/home/user/no-such-dir", false, &bad, &err) == -ENOENT,
           "watching a missing directory is ENOENT (%s)", err.msg);
        ok(hutch_fs_write_buffer(sb, &user, "/home/user/plain", "x", 1, &err) == 0 &&
                   hutch_fs_watch_add(sb, &user, "/home/user/plain", false, &bad, &err) == -ENOTDIR,
           "watching a file is ENOTDIR (%s)", err.msg);

        ok(hutch_fs_mkdir(sb, &user, "/home/user/w", true, &err) >= 0 &&
                   hutch_fs_watch_add(sb, &user, "/home/user/w", false, &id, &err) == 0 && id != 0,
           "watch /home/user/w (id %u, %s)", id, err.msg);
        ok(hutch_fs_write_buffer(sb, &user, "/home/user/w/a.txt", "hello", 5, &err) == 0, "write a file in it");
        watch_seen ws = { .id = id };
        watch_want want = { id, HUTCH_WATCH_CREATE, "/home/user/w/a.txt" };
        r = next_event_until(sb, match_watch, &want, 5000, &ev, note_watch, &ws);
        ok(r == 1, "a CREATE event with the file's full path");
        if (r == 1)
                hutch_event_clear(&ev);
        want.kind = HUTCH_WATCH_WRITE;
        if (ws.saw_write)
                r = 1;
        else if ((r = next_event_until(sb, match_watch, &want, 2000, &ev, NULL, NULL)) == 1)
                hutch_event_clear(&ev);
        ok(r == 1, "and a WRITE event, as for a write in place");
        ok(ws.n_temp == 0, "the write's temporary file never shows up (%u events)", ws.n_temp);

        /* a process's changes are seen too */
        ok(spawn_bg(sb, (const char *[]){ "sh", "-c", "echo x >> /home/user/w/a.txt; rm /home/user/w/a.txt", NULL }),
           "a process appends to and removes the file");
        want = (watch_want){ id, HUTCH_WATCH_REMOVE, "/home/user/w/a.txt" };
        r = next_event_until(sb, match_watch, &want, 5000, &ev, NULL, NULL);
        ok(r == 1, "REMOVE is reported");
        if (r == 1)
                hutch_event_clear(&ev);

        /* recursive */
        ok(hutch_fs_mkdir(sb, &user, "/home/user/r/sub/deep", true, &err) >= 0 &&
                   hutch_fs_watch_add(sb, &user, "/home/user/r", true, &rid, &err) == 0 && rid != id,
           "a recursive watch on /home/user/r (id %u)", rid);
        ok(hutch_fs_write_buffer(sb, &user, "/home/user/r/sub/deep/b.txt", "b", 1, &err) == 0,
           "write a file two levels down");
        want = (watch_want){ rid, HUTCH_WATCH_CREATE, "/home/user/r/sub/deep/b.txt" };
        r = next_event_until(sb, match_watch, &want, 5000, &ev, NULL, NULL);
        ok(r == 1, "the recursive watch reports it with the full path");
        if (r == 1)
                hutch_event_clear(&ev);
        ok(hutch_fs_mkdir(sb, &user, "/home/user/r/new", false, &err) == 1, "create a directory after the watch");
        want = (watch_want){ rid, HUTCH_WATCH_CREATE, "/home/user/r/new" };
        r = next_event_until(sb, match_watch, &want, 5000, &ev, NULL, NULL);
        ok(r == 1, "its creation is reported");
        if (r == 1)
                hutch_event_clear(&ev);
        ok(spawn_bg(sb, (const char *[]){ "touch", "/home/user/r/new/c.txt", NULL }),
           "a process creates a file in the new directory");
        want = (watch_want){ rid, HUTCH_WATCH_CREATE, "/home/user/r/new/c.txt" };
        r = next_event_until(sb, match_watch, &want, 5000, &ev, NULL, NULL);
        ok(r == 1, "the new directory is watched too");
        if (r == 1)
                hutch_event_clear(&ev);

        /* removal */
        ok(hutch_fs_watch_remove(sb, id, &err) == 0, "remove the first watch");
        ok(hutch_fs_watch_remove(sb, id, &err) == -ENOENT, "removing it again is ENOENT");
        drain_events(sb);
        ok(hutch_fs_write_buffer(sb, &user, "/home/user/w/after.txt", "z", 1, &err) == 0 &&
                   spawn_bg(sb, (const char *[]){ "touch", "/home/user/w/after2.txt", NULL }),
           "change the directory again");
        ws = (watch_seen){ .id = id };
        (void) next_event_until(sb, match_none, NULL, 500, &ev, note_watch, &ws);
        ok(ws.n_of_id == 0, "no more events from the removed watch (%u)", ws.n_of_id);
        ok(hutch_fs_watch_remove(sb, rid, &err) == 0, "remove the recursive watch");
        ok(hutch_sandbox_watch_events_dropped(sb) == 0, "no watch event was dropped");
}

static bool strv_has(char **v, const char *s) {
        for (; v && *v; v++)
                if (strcmp(*v, s) == 0)
                        return true;
        return false;
}

static void test_procs(hutch_ctx *ctx, hutch_sandbox *sb) {
        hutch_error err = { 0 };
        hutch_event ev;
        hutch_process p1, p2, pc, pt;
        int r;

        drain_events(sb);
        const char *env[] = { "PATH=/usr/bin:/bin", "FOO=bar baz", NULL };
        const char *sleep1[] = { "sleep", "100", NULL };
        hutch_spawn_config sc = { .argv = sleep1, .envp = env, .cwd = "/tmp", .uid = 1000, .gid = 1000,
                                  .tag = "lp-one" };
        ok(hutch_sandbox_spawn(sb, &sc, &p1, &err) == 0, "spawn sleep 100 tagged lp-one (%s)", err.msg);
        const char *cat[] = { "cat", NULL };
        sc = (hutch_spawn_config){ .argv = cat, .uid = 1000, .gid = 1000, .cwd = "/", .tag = "lp-cat",
                                   .stdin_mode = HUTCH_STDIN_PIPE };
        ok(hutch_sandbox_spawn(sb, &sc, &pc, &err) == 0, "spawn cat with a stdin pipe, tagged lp-cat");
        const char *tru[] = { "true", NULL };
        sc = (hutch_spawn_config){ .argv = tru, .uid = 1000, .gid = 1000, .cwd = "/", .tag = "lp-gone" };
        ok(hutch_sandbox_spawn(sb, &sc, &pt, &err) == 0, "spawn true, tagged lp-gone");
        close_proc(&pt);
        r = next_event_until(sb, match_exit_of, &pt.pid, 10000, &ev, NULL, NULL);
        ok(r == 1, "true exited");
        if (r == 1)
                hutch_event_clear(&ev);
        const char *sh[] = { "sh", "-c", "sleep 100", NULL };
        sc = (hutch_spawn_config){ .argv = sh, .uid = 0, .gid = 0, .cwd = "/", .pty = true, .pty_rows = 10,
                                   .pty_cols = 20 };
        ok(hutch_sandbox_spawn(sb, &sc, &p2, &err) == 0, "spawn a shell on a pty, untagged");

        hutch_proc_info *v = NULL;
        size_t n = 0;
        ok(hutch_sandbox_list_procs(sb, &v, &n, &err) == 0, "list processes (%zu, %s)", n, err.msg);
        ssize_t i1 = -1, ic = -1, i2 = -1;
        bool gone = false;
        for (size_t i = 0; i < n; i++) {
                if (v[i].pid == p1.pid)
                        i1 = (ssize_t) i;
                if (v[i].pid == pc.pid)
                        ic = (ssize_t) i;
                if (v[i].pid == p2.pid)
                        i2 = (ssize_t) i;
                if (v[i].pid == pt.pid || (v[i].tag && strcmp(v[i].tag, "lp-gone") == 0))
                        gone = true;
        }
        ok(i1 >= 0 && ic > i1 && i2 > ic, "the three live ones, in spawn order (%zd %zd %zd)", i1, ic, i2);
        ok(!gone, "not the one that exited");
        if (i1 >= 0) {
                hutch_proc_info *pi = &v[i1];
                ok(pi->tag && strcmp(pi->tag, "lp-one") == 0 && pi->argv && pi->argv[0] &&
                           strcmp(pi->argv[0], "sleep") == 0 && pi->argv[1] && strcmp(pi->argv[1], "100") == 0 &&
                           !pi->argv[2],
                   "tag and argv");
                ok(strv_has(pi->envp, "FOO=bar baz") && strv_has(pi->envp, "PATH=/usr/bin:/bin") && !pi->envp[2],
                   "environment");
                ok(pi->cwd && strcmp(pi->cwd, "/tmp") == 0 && !pi->pty && pi->uid == 1000 && pi->gid == 1000,
                   "cwd, no pty, uid/gid");
        }
        if (i2 >= 0)
                ok(v[i2].pty && !v[i2].tag && v[i2].uid == 0 && v[i2].envp && strv_has(v[i2].envp, "LANG=C.UTF-8"),
                   "the pty shell: pty, no tag, the default environment");
        hutch_proc_info_array_free(v, n);
        hutch_proc_info_array_free(NULL, 0);

        /* a second handle, as after a daemon restart */
        hutch_sandbox *sb2 = NULL;
        ok(hutch_sandbox_attach(ctx, hutch_sandbox_id(sb), &sb2, &err) == 0, "attach a second handle");
        if (!sb2)
                return;
        hutch_process a;
        ok(hutch_sandbox_attach_process(sb2, 0, "lp-cat", &a, &err) == 0 && a.pid == pc.pid && a.stdin_fd >= 0 &&
                   a.stdout_fd >= 0 && a.stderr_fd >= 0,
           "attach cat by tag: its pid and three pipes (%s)", err.msg);
        char buf[256];
        fcntl(a.stdin_fd, F_SETFL, 0);
        ok(write(a.stdin_fd, "again\n", 6) == 6 && read_until(a.stdout_fd, buf, sizeof buf, "again\n"),
           "the attached stdin and stdout reach the process");
        close_proc(&a);
        hutch_process b;
        ok(hutch_sandbox_attach_process(sb2, p1.pid, NULL, &b, &err) == 0 && b.pid == p1.pid && b.stdin_fd < 0 &&
                   b.stdout_fd >= 0 && b.stderr_fd >= 0,
           "attach sleep by pid: stdout and stderr, no stdin (%s)", err.msg);
        hutch_process c;
        ok(hutch_sandbox_attach_process(sb2, p2.pid, NULL, &c, &err) == 0 && c.stdout_fd >= 0 && c.stdin_fd < 0 &&
                   c.stderr_fd < 0,
           "attach the pty shell: the master only");
        if (c.stdout_fd >= 0) {
                struct winsize wsz;
                ok(ioctl(c.stdout_fd, TIOCGWINSZ, &wsz) == 0 && wsz.ws_row == 10 && wsz.ws_col == 20,
                   "it is the process's terminal (10x20)");
        }
        close_proc(&c);
        ok(hutch_sandbox_attach_process(sb2, 999999, NULL, &c, &err) == -ESRCH, "an unknown pid is ESRCH (%s)",
           err.msg);
        ok(hutch_sandbox_attach_process(sb2, 0, "no-such-tag", &c, &err) == -ESRCH, "an unknown tag is ESRCH");
        ok(hutch_sandbox_attach_process(sb2, pt.pid, NULL, &c, &err) == -ESRCH, "an exited process is ESRCH (%s)",
           err.msg);
        ok(hutch_sandbox_attach_process(sb2, 0, "lp-gone", &c, &err) == -ESRCH, "also by tag");

        /* the attaching handle hears of the exit */
        drain_events(sb2);
        ok(hutch_sandbox_signal(sb2, p1.pid, SIGKILL, false, &err) == 0, "kill sleep through the second handle");
        r = next_event_until(sb2, match_exit_of, &p1.pid, 10000, &ev, NULL, NULL);
        ok(r == 1 && ev.exit.signal == SIGKILL, "its exit reaches the handle that attached");
        if (r == 1)
                hutch_event_clear(&ev);
        close_proc(&b);
        hutch_sandbox_unref(sb2);

        (void) hutch_sandbox_signal(sb, pc.pid, SIGKILL, false, &err);
        (void) hutch_sandbox_signal(sb, p2.pid, SIGKILL, true, &err);
        close_proc(&p1);
        close_proc(&pc);
        close_proc(&p2);
        drain_events(sb);
}

/* ------------------------------------------------------------- metadata */

static const char *meta_get(const hutch_file_info *fi, const char *key) {
        for (size_t i = 0; i < fi->n_metadata; i++)
                if (strcmp(fi->metadata_keys[i], key) == 0)
                        return fi->metadata_values[i];
        return NULL;
}

static int write_with_meta(hutch_sandbox *sb, const char *path, const char *data, const char *const *keys,
                           const char *const *values, size_t n, hutch_file_info *ret_info, hutch_error *err) {
        hutch_fs_write *w;
        int fd;
        int r = hutch_fs_write_begin(sb, &user, path, &w, &fd, err);
        if (r < 0)
                return r;
        r = hutch_fs_write_set_metadata(w, keys, values, n, err);
        if (r < 0) {
                close(fd);
                hutch_fs_write_abort(w);
                return r;
        }
        fcntl(fd, F_SETFL, 0);
        size_t len = strlen(data);
        if (write(fd, data, len) != (ssize_t) len) {
                close(fd);
                hutch_fs_write_abort(w);
                return -EIO;
        }
        close(fd);
        return hutch_fs_write_commit(w, len, ret_info, err);
}

static void test_metadata(hutch_sandbox *sb, const char *backend) {
        hutch_error err = { 0 };
        hutch_file_info fi;
        const char *path = "/home/user/meta.txt";

        const char *k2[] = { "owner", "note" }, *v2[] = { "alice", "hello world: {\"json\": 1}" };
        memset(&fi, 0, sizeof fi);
        int r = write_with_meta(sb, path, "data", k2, v2, 2, &fi, &err);
        ok(r == 0 && fi.n_metadata == 2 && meta_get(&fi, "owner") && strcmp(meta_get(&fi, "owner"), "alice") == 0,
           "%s: write with two metadata keys; the commit's info has them (%s)", backend, err.msg);
        hutch_file_info_clear(&fi);
        r = hutch_fs_stat(sb, &user, path, &fi, &err);
        ok(r == 0 && fi.n_metadata == 2 && meta_get(&fi, "owner") && strcmp(meta_get(&fi, "owner"), "alice") == 0 &&
                   meta_get(&fi, "note") && strcmp(meta_get(&fi, "note"), v2[1]) == 0,
           "%s: stat returns both", backend);
        hutch_file_info_clear(&fi);

        const char *k1[] = { "owner" }, *v1[] = { "bob" };
        r = write_with_meta(sb, path, "data2", k1, v1, 1, NULL, &err);
        ok(r == 0, "%s: a second write with one key", backend);
        r = hutch_fs_stat(sb, &user, path, &fi, &err);
        ok(r == 0 && fi.n_metadata == 1 && meta_get(&fi, "owner") && strcmp(meta_get(&fi, "owner"), "bob") == 0,
           "%s: replaces both (%zu keys)", backend, fi.n_metadata);
        hutch_file_info_clear(&fi);

        hutch_file_info *list = NULL;
        size_t nl = 0;
        bool listed = false;
        if (hutch_fs_list(sb, &user, "/home/user", 1, &list, &nl, &err) == 0)
                for (size_t i = 0; i < nl; i++)
                        if (strcmp(list[i].path, path) == 0)
                                listed = list[i].n_metadata == 1 && strcmp(list[i].metadata_values[0], "bob") == 0;
        hutch_file_info_array_free(list, nl);
        ok(listed, "%s: a listing carries it", backend);
        int fd = -1;
        memset(&fi, 0, sizeof fi);
        r = hutch_fs_open_read(sb, &user, path, &fd, &fi, &err);
        ok(r == 0 && fi.n_metadata == 1 && strcmp(fi.metadata_keys[0], "owner") == 0, "%s: and open_read's info",
           backend);
        if (fd >= 0)
                close(fd);
        hutch_file_info_clear(&fi);

        r = write_with_meta(sb, path, "", NULL, NULL, 0, NULL, &err);
        ok(r == 0 && hutch_fs_stat(sb, &user, path, &fi, &err) == 0 && fi.n_metadata == 0 && !fi.metadata_keys,
           "%s: setting none removes it", backend);
        hutch_file_info_clear(&fi);
        ok(hutch_fs_write_buffer(sb, &user, path, "x", 1, &err) == 0 &&
                   hutch_fs_stat(sb, &user, path, &fi, &err) == 0 && fi.n_metadata == 0,
           "%s: a plain write leaves none", backend);
        hutch_file_info_clear(&fi);

        /* 16000 bytes: within the protocol's bounds; tmpfs holds them,
         * ext4 keeps an inode's xattrs in one 4 KiB block */
        static char big[4][4001];
        const char *bk[] = { "b0", "b1", "b2", "b3" }, *bv[4];
        for (int i = 0; i < 4; i++) {
                memset(big[i], 'a' + i, 4000);
                bv[i] = big[i];
        }
        bool ext4 = strcmp(backend, "ext4") == 0;
        r = write_with_meta(sb, "/home/user/bigmeta", "d", bk, bv, 4, NULL, &err);
        ok(ext4 ? r == -E2BIG : r == 0, "%s: 16000 bytes of metadata: %s (%s)", backend,
           ext4 ? "E2BIG, not ENOSPC" : "kept", err.msg);
        if (!ext4) {
                ok(hutch_fs_stat(sb, &user, "/home/user/bigmeta", &fi, &err) == 0 && fi.n_metadata == 4 &&
                           meta_get(&fi, "b3") && strcmp(meta_get(&fi, "b3"), big[3]) == 0,
                   "%s: and all of it comes back", backend);
                hutch_file_info_clear(&fi);
        } else
                ok(hutch_fs_stat(sb, &user, "/home/user/bigmeta", &fi, &err) == -ENOENT,
                   "%s: the failed commit leaves no file", backend);

        /* what the sandbox sets itself is filtered */
        const char *py[] = {
                "python3", "-c",
                "import os\n"
                "p = '/home/user/inside.txt'\n"
                "open(p, 'w').write('x')\n"
                "for k, v in (('user.e2b.ok', b'yes'), ('user.e2b.nul', b'a\\0b'), ('user.e2b.a/b', b'v'),\n"
                "             ('user.other', b'o'), ('user.e2b.long', b'v' * 4097), ('user.e2b.', b'e')):\n"
                "    try:\n"
                "        os.setxattr(p, k, v)\n"
                "    except OSError:\n"
                "        pass\n"
                "os.symlink(p, '/home/user/inside.lnk')\n",
                NULL
        };
        r = run(sb, py, NULL, 0);
        if (r == 127)
                ok(true, "# SKIP no python3 in the sandbox to set xattrs with");
        else {
                ok(r == 0 && hutch_fs_stat(sb, &user, "/home/user/inside.txt", &fi, &err) == 0 &&
                           fi.n_metadata == 1 && strcmp(fi.metadata_keys[0], "ok") == 0 &&
                           strcmp(fi.metadata_values[0], "yes") == 0,
                   "%s: of the xattrs a process set, only the valid user.e2b.* one shows (%zu)", backend,
                   fi.n_metadata);
                hutch_file_info_clear(&fi);
                ok(hutch_fs_stat(sb, &user, "/home/user/inside.lnk", &fi, &err) == 0 &&
                           fi.type == HUTCH_FILE_SYMLINK && fi.n_metadata == 0,
                   "%s: a symlink to it has none of its own", backend);
                hutch_file_info_clear(&fi);
        }
}

static void test_metadata_bounds(hutch_sandbox *sb) {
        hutch_error err = { 0 };
        hutch_fs_write *w;
        int fd;

        if (hutch_fs_write_begin(sb, &user, "/home/user/bounds", &w, &fd, &err) < 0) {
                ok(false, "begin a write for the bounds (%s)", err.msg);
                return;
        }
        close(fd);
        const char *slash[] = { "a/b" }, *ctl[] = { "a\tb" }, *empty[] = { "" }, *vals[] = { "v", "w" };
        ok(hutch_fs_write_set_metadata(w, slash, vals, 1, &err) == -EINVAL, "a key with '/' is refused (%s)",
           err.msg);
        ok(hutch_fs_write_set_metadata(w, ctl, vals, 1, &err) == -EINVAL, "a key with a control character too");
        ok(hutch_fs_write_set_metadata(w, empty, vals, 1, &err) == -EINVAL, "an empty key too");
        char longkey[HUTCH_METADATA_KEY_MAX + 2];
        memset(longkey, 'k', sizeof longkey - 1);
        longkey[sizeof longkey - 1] = 0;
        const char *lk[] = { longkey };
        ok(hutch_fs_write_set_metadata(w, lk, vals, 1, &err) == -EINVAL, "a key of %d bytes too",
           HUTCH_METADATA_KEY_MAX + 1);
        longkey[HUTCH_METADATA_KEY_MAX] = 0;
        ok(hutch_fs_write_set_metadata(w, lk, vals, 1, &err) == 0, "one of %d bytes is fine", HUTCH_METADATA_KEY_MAX);
        const char *dup[] = { "a", "a" };
        ok(hutch_fs_write_set_metadata(w, dup, vals, 2, &err) == -EINVAL, "a key given twice is refused");
        static char big[HUTCH_METADATA_VALUE_MAX + 2];
        memset(big, 'v', sizeof big - 1);
        const char *bk[] = { "big" }, *bv[] = { big };
        ok(hutch_fs_write_set_metadata(w, bk, bv, 1, &err) == -E2BIG, "a value over %d bytes is refused",
           HUTCH_METADATA_VALUE_MAX);
        const char *many_k[HUTCH_METADATA_MAX + 1], *many_v[HUTCH_METADATA_MAX + 1];
        char names[HUTCH_METADATA_MAX + 1][8];
        for (int i = 0; i <= HUTCH_METADATA_MAX; i++) {
                snprintf(names[i], sizeof names[i], "k%d", i);
                many_k[i] = names[i];
                many_v[i] = "v";
        }
        ok(hutch_fs_write_set_metadata(w, many_k, many_v, HUTCH_METADATA_MAX + 1, &err) == -E2BIG,
           "more than %d keys are refused", HUTCH_METADATA_MAX);
        hutch_fs_write_abort(w);
}

/* A layer on tmpfs: metadata needs its user xattrs (Linux >= 6.6), and a
 * full layer is ENOSPC at commit. */
static void test_tmpfs_layer(void) {
        hutch_error err = { 0 };
        hutch_ctx *ctx = NULL;
        hutch_sandbox *sb = NULL;
        hutch_ctx_config cfg = { .storage = "tmpfs" };
        hutch_sandbox_config scfg = { .limits = { .disk_bytes = 8u << 20 } };

        if (hutch_ctx_new(&cfg, &ctx, &err) < 0 || hutch_sandbox_create(ctx, &scfg, &sb, &err) < 0) {
                ok(false, "create a sandbox with a tmpfs layer (%s)", err.msg);
                hutch_ctx_free(ctx);
                return;
        }
        ok(strcmp(hutch_ctx_storage_backend(ctx), "tmpfs") == 0, "a sandbox with an 8 MiB tmpfs layer");
        test_metadata(sb, "tmpfs");

        size_t len = 16u << 20;
        char *data = calloc(1, len);
        int r = data ? hutch_fs_write_buffer(sb, &user, "/home/user/huge", data, len, &err) : -ENOMEM;
        ok(r == -ENOSPC, "writing 16 MiB into it fails with ENOSPC at commit (%d: %s)", r, err.msg);
        free(data);
        hutch_file_info fi;
        ok(hutch_fs_stat(sb, &user, "/home/user/huge", &fi, &err) == -ENOENT, "and leaves no file");
        ok(hutch_fs_write_buffer(sb, &user, "/home/user/small", "ok", 2, &err) == 0, "a small write works again after");

        ok(hutch_sandbox_destroy(sb, &err) == 0, "destroy the tmpfs sandbox (%s)", err.msg);
        hutch_sandbox_unref(sb);
        hutch_ctx_free(ctx);
}

int main(void) {
        if (geteuid() != 0) {
                printf("1..0 # SKIP needs root (creates sandboxes)\n");
                return 77;
        }
        /* a write into a layer that filled up meets a closed pipe */
        signal(SIGPIPE, SIG_IGN);
        hutch_ctx *ctx = NULL;
        hutch_sandbox *sb = NULL;
        hutch_error err = { 0 };
        if (hutch_ctx_new(NULL, &ctx, &err) < 0 || hutch_sandbox_create(ctx, NULL, &sb, &err) < 0) {
                printf("not ok 1 - create a sandbox: %s\n1..1\n", err.msg);
                return 1;
        }
        ok(strlen(hutch_sandbox_id(sb)) == HUTCH_ID_LEN, "sandbox id has %d characters", HUTCH_ID_LEN);
        ok(hutch_sandbox_uid_base(sb) >= 0x40000000u, "uid base %u is a high, unprivileged host range",
           (unsigned) hutch_sandbox_uid_base(sb));

        /* --- processes: pipes and stdin */
        const char *cat[] = { "cat", NULL };
        hutch_spawn_config sc = { .argv = cat, .uid = 1000, .gid = 1000, .stdin_mode = HUTCH_STDIN_PIPE };
        hutch_process p;
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0 && p.pid > 1 && p.stdin_fd >= 0, "spawn cat with a stdin pipe");
        const char msg[] = "through the sandbox\n";
        fcntl(p.stdin_fd, F_SETFL, 0);
        ok(write(p.stdin_fd, msg, sizeof msg - 1) == (ssize_t) sizeof msg - 1, "write to its stdin");
        close(p.stdin_fd);
        p.stdin_fd = -1;
        ok(hutch_sandbox_close_stdin(sb, p.pid, &err) == 0, "close init's copy of stdin");
        char buf[65536];
        slurp(p.stdout_fd, buf, sizeof buf, 10000);
        ok(strcmp(buf, msg) == 0, "cat echoed the input (%zu bytes)", strlen(buf));
        hutch_exit ex;
        ok(hutch_sandbox_wait(sb, 10000, &ex, &err) == 0 && ex.pid == p.pid && ex.exit_code == 0 && ex.signal == 0,
           "cat exited 0 after EOF");
        close_proc(&p);

        /* --- exec errors */
        const char *missing[] = { "/no/such/binary", NULL };
        sc = (hutch_spawn_config){ .argv = missing, .uid = 1000, .gid = 1000 };
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == -ENOENT, "a missing command is ENOENT (%s)", err.msg);

        /* --- signals and process groups */
        const char *sleeper[] = { "sh", "-c", "sleep 100 & sleep 100", NULL };
        sc = (hutch_spawn_config){ .argv = sleeper, .uid = 1000, .gid = 1000 };
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0, "spawn a shell with a background child");
        ok(hutch_sandbox_signal(sb, p.pid, SIGTERM, true, &err) == 0, "SIGTERM its process group");
        ok(hutch_sandbox_wait(sb, 10000, &ex, &err) == 0 && ex.pid == p.pid && ex.signal == SIGTERM,
           "the shell died of SIGTERM (signal %d)", ex.signal);
        close_proc(&p);
        ok(hutch_sandbox_signal(sb, 999999, SIGTERM, false, &err) == -ESRCH, "signalling an unknown pid is ESRCH");
        ok(hutch_sandbox_signal(sb, 1, SIGKILL, false, &err) < 0, "init itself cannot be signalled through the API");

        /* --- pty with a real window size, then a resize */
        const char *stty[] = { "sh", "-c", "stty size; read x; stty size", NULL };
        sc = (hutch_spawn_config){ .argv = stty, .uid = 1000, .gid = 1000, .pty = true, .pty_rows = 33, .pty_cols = 101 };
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0 && p.stdout_fd >= 0 && p.stderr_fd < 0, "spawn with a pty");
        ok(read_until(p.stdout_fd, buf, sizeof buf, "33 101"), "stty sees the requested 33x101 window");
        ok(hutch_sandbox_resize(sb, p.pid, 40, 120, &err) == 0, "resize to 40x120");
        fcntl(p.stdout_fd, F_SETFL, 0);
        ok(write(p.stdout_fd, "\n", 1) == 1, "type a line into the pty");
        ok(read_until(p.stdout_fd, buf, sizeof buf, "40 120"), "stty sees the new size");
        ok(hutch_sandbox_wait(sb, 10000, &ex, &err) == 0 && ex.exit_code == 0, "the pty process exited 0");
        close_proc(&p);

        /* --- files */
        const char content[] = "hello, file\n";
        ok(hutch_fs_write_buffer(sb, &user, "/home/user/dir/sub/f.txt", content, sizeof content - 1, &err) == 0,
           "write a file, creating its parents (%s)", err.msg);
        hutch_file_info fi;
        ok(hutch_fs_stat(sb, &user, "/home/user/dir/sub/f.txt", &fi, &err) == 0 && fi.type == HUTCH_FILE_REGULAR &&
                   fi.size == sizeof content - 1 && fi.uid == 1000 && fi.gid == 1000 && fi.owner &&
                   strcmp(fi.owner, "user") == 0,
           "stat: regular, right size, owned by user");
        hutch_file_info_clear(&fi);
        ok(run(sb, (const char *[]){ "cat", "/home/user/dir/sub/f.txt", NULL }, buf, sizeof buf) == 0 &&
                   strcmp(buf, content) == 0,
           "a process inside reads what the API wrote");
        int fd = -1;
        ok(hutch_fs_open_read(sb, &user, "/home/user/dir/sub/f.txt", &fd, NULL, &err) == 0 && fd >= 0, "open for reading");
        slurp(fd, buf, sizeof buf, 1000);
        close(fd);
        ok(strcmp(buf, content) == 0, "the descriptor reads the content");
        ok(hutch_fs_mkdir(sb, &user, "/home/user/a/b/c", true, &err) == 1, "mkdir -p creates");
        ok(hutch_fs_mkdir(sb, &user, "/home/user/a/b/c", true, &err) == 0, "mkdir -p of an existing dir is not an error");
        ok(hutch_fs_move(sb, &user, "/home/user/dir/sub/f.txt", "/home/user/a/b/c/g.txt", &err) == 0, "move");
        ok(hutch_fs_stat(sb, &user, "/home/user/dir/sub/f.txt", &fi, &err) == -ENOENT, "the old name is gone");
        hutch_file_info *list = NULL;
        size_t nl = 0;
        ok(hutch_fs_list(sb, &user, "/home/user/a", 3, &list, &nl, &err) == 0 && nl == 3, "list depth 3 sees b, c, g.txt (%zu)", nl);
        bool saw_g = false;
        for (size_t i = 0; i < nl; i++)
                if (strcmp(list[i].path, "/home/user/a/b/c/g.txt") == 0)
                        saw_g = list[i].type == HUTCH_FILE_REGULAR;
        ok(saw_g, "the listing names g.txt with its full path");
        hutch_file_info_array_free(list, nl);
        ok(hutch_fs_remove(sb, &user, "/home/user/a", &err) == 0, "remove -r");
        ok(hutch_fs_stat(sb, &user, "/home/user/a", &fi, &err) == -ENOENT, "removed");
        ok(hutch_fs_write_buffer(sb, &user, "/etc/hutch-test", "x", 1, &err) == -EACCES,
           "user cannot write /etc (%s)", err.msg);
        ok(hutch_fs_write_buffer(sb, &root, "/usr/hutch-test", "x", 1, &err) == -EROFS,
           "even sandbox root cannot write /usr (%s)", err.msg);
        ok(hutch_fs_stat(sb, &user, "relative/path", &fi, &err) == -EINVAL, "relative paths are refused");

        /* --- writes are atomic: an aborted write leaves nothing */
        hutch_fs_write *w = NULL;
        ok(hutch_fs_write_begin(sb, &user, "/home/user/partial", &w, &fd, &err) == 0, "begin a write");
        fcntl(fd, F_SETFL, 0);
        ok(write(fd, "half", 4) == 4, "write part of it");
        close(fd);
        hutch_fs_write_abort(w);
        ok(hutch_fs_stat(sb, &user, "/home/user/partial", &fi, &err) == -ENOENT, "an aborted write leaves no file");
        ok(run(sb, (const char *[]){ "sh", "-c", "ls -A /home/user | grep -c hutch-", NULL }, buf, sizeof buf) == 1 &&
                   atoi(buf) == 0,
           "and no temporary file");
        ok(hutch_fs_write_begin(sb, &user, "/home/user/short", &w, &fd, &err) == 0, "begin another write");
        close(fd);
        ok(hutch_fs_write_commit(w, 10, NULL, &err) < 0, "a commit whose size does not match fails (%s)", err.msg);
        ok(hutch_fs_stat(sb, &user, "/home/user/short", &fi, &err) == -ENOENT, "and leaves no file");

        /* --- paths resolve inside the sandbox: a symlink to a host file */
        char canary_path[] = "/tmp/hutch-canary-XXXXXX";
        int cfd = mkstemp(canary_path);
        const char token[] = "HOST-CANARY-7f3a9c";
        ok(cfd >= 0 && write(cfd, token, sizeof token - 1) == (ssize_t) sizeof token - 1, "host canary %s", canary_path);
        close(cfd);
        const char *ln[] = { "ln", "-s", canary_path, "/home/user/link", NULL };
        ok(run(sb, ln, NULL, 0) == 0, "the sandbox plants a symlink to the host canary's path");
        fd = -1;
        int r = hutch_fs_open_read(sb, &user, "/home/user/link", &fd, NULL, &err);
        buf[0] = 0;
        if (r == 0) {
                slurp(fd, buf, sizeof buf, 1000);
                close(fd);
        }
        ok(!strstr(buf, token), "reading through it never returns the host file (r=%d)", r);
        /* writing through it is allowed (it writes the sandbox's path) or not;
         * either way the host file must not change */
        (void) hutch_fs_write_buffer(sb, &root, "/home/user/link", "pwned", 5, &err);
        char hostbuf[64] = "";
        cfd = open(canary_path, O_RDONLY);
        ssize_t hk = read(cfd, hostbuf, sizeof hostbuf - 1);
        close(cfd);
        hostbuf[hk > 0 ? hk : 0] = 0;
        ok(strcmp(hostbuf, token) == 0, "writing through it leaves the host canary untouched");
        unlink(canary_path);
        const char *ln2[] = { "ln", "-s", "/etc/shadow", "/home/user/shadow", NULL };
        run(sb, ln2, NULL, 0);
        r = hutch_fs_open_read(sb, &root, "/home/user/shadow", &fd, NULL, &err);
        buf[0] = 0;
        if (r == 0) {
                slurp(fd, buf, sizeof buf, 1000);
                close(fd);
        }
        ok(r == 0 && strstr(buf, "root:*:") && !strstr(buf, "$"),
           "a symlink to /etc/shadow reads the sandbox's synthesized shadow, no hashes");

        /* --- a second handle, attached by id */
        const char *bg[] = { "sleep", "100", NULL };
        sc = (hutch_spawn_config){ .argv = bg, .uid = 1000, .gid = 1000, .tag = "bg" };
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0, "start a background process");
        close_proc(&p);
        hutch_sandbox *sb2 = NULL;
        ok(hutch_sandbox_attach(ctx, hutch_sandbox_id(sb), &sb2, &err) == 0, "attach a second handle by id (%s)", err.msg);
        if (sb2) {
                ok(hutch_sandbox_init_pid(sb2) == hutch_sandbox_init_pid(sb), "it sees the same init");
                ok(run(sb2, (const char *[]){ "sh", "-c", "echo $((6*7))", NULL }, buf, sizeof buf) == 0 &&
                           strcmp(buf, "42\n") == 0,
                   "and runs commands");
                ok(hutch_sandbox_signal(sb2, p.pid, SIGKILL, false, &err) == 0, "and signals the first handle's process");
                hutch_sandbox_unref(sb2);
        }
        hutch_stats st;
        ok(hutch_sandbox_stats(sb, &st, &err) == 0 && st.memory_limit == HUTCH_DEFAULT_MEMORY && st.pids_current >= 1,
           "stats: memory limit %llu, %llu pids", (unsigned long long) st.memory_limit,
           (unsigned long long) st.pids_current);
        ok(hutch_sandbox_attach(ctx, "zzzzzzzzzzzzzzzzzzzz", &sb2, &err) == -ENOENT, "attaching an unknown id is ENOENT");
        ok(hutch_sandbox_attach(ctx, "../../../etc", &sb2, &err) == -ENOENT, "a malformed id is ENOENT");

        /* --- the sandbox cannot wedge its PID 1 through the files init reads */
        const char *fifo[] = { "sh", "-c", "rm -f /etc/passwd && mkfifo /etc/passwd", NULL };
        sc = (hutch_spawn_config){ .argv = fifo, .uid = 0, .gid = 0, .cwd = "/" };
        ok(hutch_sandbox_spawn(sb, &sc, &p, &err) == 0 && wait_pid(sb, p.pid, &ex, &err) == 0 && ex.exit_code == 0 &&
                   ex.signal == 0,
           "sandbox root replaces /etc/passwd with a FIFO");
        close_proc(&p);
        ok(hutch_fs_stat(sb, &user, "/home/user", &fi, &err) == 0 && fi.owner && strcmp(fi.owner, "1000") == 0,
           "init still answers (owner shown as a number: %s)", fi.owner ? fi.owner : "(none)");
        hutch_file_info_clear(&fi);

        /* --- events, watches, processes again, metadata */
        test_events(sb);
        test_watch(sb);
        test_procs(ctx, sb);
        test_metadata(sb, hutch_ctx_storage_backend(ctx));
        test_metadata_bounds(sb);

        /* --- destroy leaves nothing */
        char dir[256];
        snprintf(dir, sizeof dir, "/run/hutch/sandboxes/%s", hutch_sandbox_id(sb));
        pid_t init_pid = hutch_sandbox_init_pid(sb);
        ok(hutch_sandbox_destroy(sb, &err) == 0, "destroy (%s)", err.msg);
        struct stat sst;
        ok(stat(dir, &sst) < 0 && errno == ENOENT, "the state directory is gone");
        ok(kill(init_pid, 0) < 0 && errno == ESRCH, "init is gone");
        hutch_sandbox_unref(sb);

        /* --- a paused (frozen) sandbox can still be destroyed: frozen tasks
         *     ignore SIGKILL until thawed */
        hutch_sandbox *sb3 = NULL;
        ok(hutch_sandbox_create(ctx, NULL, &sb3, &err) == 0, "create another sandbox");
        if (sb3) {
                const char *spin[] = { "sh", "-c", "while :; do :; done", NULL };
                sc = (hutch_spawn_config){ .argv = spin, .uid = 1000, .gid = 1000 };
                ok(hutch_sandbox_spawn(sb3, &sc, &p, &err) == 0, "start a busy loop");
                close_proc(&p);
                ok(hutch_sandbox_freeze(sb3, &err) == 0, "freeze it (%s)", err.msg);
                init_pid = hutch_sandbox_init_pid(sb3);
                ok(hutch_sandbox_destroy(sb3, &err) == 0, "destroy while frozen (%s)", err.msg);
                ok(kill(init_pid, 0) < 0 && errno == ESRCH, "its init is gone");
                hutch_sandbox_unref(sb3);
        }
        /* runsc's tmpfs has no nr_inodes: an inode limit on gvisor would
         * not hold, so it is refused before anything starts (no runsc
         * needed to see it) */
        hutch_sandbox_config gv = { .backend = HUTCH_BACKEND_GVISOR, .limits = { .disk_inodes = 1000 } };
        hutch_sandbox *none = NULL;
        ok(hutch_sandbox_create(ctx, &gv, &none, &err) == -EOPNOTSUPP && !none && strstr(err.msg, "inode"),
           "gvisor with an inode limit is refused (%s)", err.msg);
        hutch_ctx_free(ctx);
        test_tmpfs_layer();
        return tap_done();
}
