/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libhutch's public API against real sandboxes: processes (pipes, stdin,
 * pty, signals, a second handle attached by id), every file operation, and
 * the promise that file APIs resolve paths inside the sandbox, never on the
 * host (a planted symlink to a host path reads the sandbox's file). Needs
 * root; exits 77 (skip) otherwise.
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

int main(void) {
        if (geteuid() != 0) {
                printf("1..0 # SKIP needs root (creates sandboxes)\n");
                return 77;
        }
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
        hutch_ctx_free(ctx);
        return tap_done();
}
