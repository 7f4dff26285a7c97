/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch template base: the `base` template, built from Debian packages of
 * the archive the host's apt is configured with (mmdebstrap), not from the
 * host's /usr. Stored through the layer store as an image template named
 * `base` (kind "debian"), which template_base_target() then prefers over
 * the host template; `hutch template rm base` falls back to the host.
 *
 * hutch template interpreter: the same build, another recipe: the
 * `code-interpreter` template (its names code-interpreter-v1, -beta too),
 * with the interpreter's kernels and libraries from the archive rather
 * than the host's /usr (template_interp_resolve() prefers it; the server's
 * own files are copied in at create, so they are always this hutch's).
 *
 *   1. each suite's InRelease (the release, and its -updates and -security
 *      where the host's apt reads them; apt-helper, the host's transports):
 *      the newest Date is SOURCE_DATE_EPOCH, their hashes part of the
 *      build's key; a base built from the same key is up to date
 *   2. mmdebstrap --mode=unshare --format=tar in a child that is root of a
 *      user namespace of its own, mapped to the 65536 host ids at
 *      BASE_BUILD_UID_BASE (no sandbox's, not the unpacker's): the archive's
 *      maintainer scripts run as those ids, never as host root, in a mount
 *      namespace where DATA_DIR/.base-build/work is its /tmp
 *   3. the tar goes through the layer unpacker like any image layer, and
 *      template_write_base() switches `base` to the new version
 *
 * Everything of a build lives in DATA_DIR/.base-build (removed at the end,
 * on failure, on SIGINT/SIGTERM/SIGHUP, and at the next build's start after
 * a kill -9), under the exclusive lock DATA_DIR/.base-build.lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <jansson.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <openssl/evp.h>

#include "cli/cli.h"
#include "image/image.h"
#include "image/layer.h"
#include "template/template.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"
#include "util/log.h"

/* The host ids the archive's maintainer scripts run as: the 65536 ids right
 * below the unpacker's (0x3FFF0000), which are right below the sandboxes'
 * default range; used by nothing else. */
#define BASE_BUILD_UID_BASE 0x3FFE0000u
#define BASE_MAX_PACKAGES 256

/* E2B's base: a shell, Python with pip and venv (and `python`, as E2B's
 * has), Node with npm, git, curl, sudo for `user`, a compiler */
static const char *const default_packages[] = {
        "bash",
        "coreutils",
        "python3",
        "python-is-python3",
        "python3-pip",
        "python3-venv",
        "nodejs",
        "npm",
        "git",
        "curl",
        "ca-certificates",
        "sudo",
        "build-essential",
        NULL,
};

/* The code interpreter's languages (docs/interpreter.md) over a shell,
 * Python with pip and Node with npm, as E2B's code-interpreter template
 * has them; R through IRkernel, Java through jshell. */
static const char *const interp_default_packages[] = {
        "bash", "coreutils", "python3", "python-is-python3", "python3-pip", "python3-venv",
        "nodejs", "npm", "git", "curl", "ca-certificates", "sudo",
        "python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib",
        "python3-scipy", "python3-sklearn", "python3-seaborn", "python3-pil", "python3-plotly",
        "r-cran-irkernel", "node-typescript", "default-jdk-headless",
        NULL,
};

/* What every build of a recipe gets, whatever --packages says: sudo for
 * `user`'s rule; for the interpreter, the python kernel it waits for at
 * create and hutch-interp's own libraries (jansson, ZeroMQ; OpenSSL's
 * libcrypto comes with python3), the server being the host's binary. */
static const char *const base_required[] = { "sudo", NULL };
static const char *const interp_required[] = { "sudo", "python3-ipykernel", "libjansson4", "libzmq5", NULL };

static const char base_usage[] =
        "usage: hutch template base [--mirror URL] [--suite SUITE] [--security-mirror URL] [--no-updates]\n"
        "                           [--packages LIST] [--json] [--force]\n"
        "\n"
        "Builds the `base` template from Debian packages with mmdebstrap (variant minbase, plus\n"
        "LIST, plus sudo) and a `user` (uid 1000, /home/user) with passwordless sudo.\n"
        "  --mirror URL      the archive (default: the host's apt source for the suite)\n"
        "  --suite SUITE     default: the host's release (VERSION_CODENAME)\n"
        "  --security-mirror URL  the archive of SUITE-security (default: the host's apt source\n"
        "                    for it; without one and without this flag, no security suite)\n"
        "  --no-updates      the main suite alone: no SUITE-updates, no SUITE-security (by default\n"
        "                    each is read when the host's apt has it, SUITE-updates from --mirror)\n"
        "  --packages LIST   comma- or space-separated package names, in place of the default set:\n"
        "                    bash coreutils python3 python-is-python3 python3-pip python3-venv nodejs\n"
        "                    npm git curl ca-certificates sudo build-essential\n"
        "  --force           build even when a base of the same inputs exists\n"
        "  --json            one JSON object per event on stdout\n"
        "`hutch template rm base` removes it: `base` is then the host template again.\n";

static const char interp_usage[] =
        "usage: hutch template interpreter [--mirror URL] [--suite SUITE] [--security-mirror URL]\n"
        "                                  [--no-updates] [--packages LIST] [--json] [--force]\n"
        "\n"
        "Builds the `code-interpreter` template (also code-interpreter-v1 and -beta, what\n"
        "@e2b/code-interpreter creates) from Debian packages with mmdebstrap (variant minbase, plus\n"
        "LIST, plus what the interpreter needs: python3-ipykernel libjansson4 libzmq5 sudo) and a\n"
        "`user` (uid 1000, /home/user) with passwordless sudo. hutch-interp itself is copied in at\n"
        "each create. Options as for `hutch template base`; the default LIST:\n"
        "                    bash coreutils python3 python-is-python3 python3-pip python3-venv nodejs\n"
        "                    npm git curl ca-certificates sudo python3-ipykernel python3-numpy\n"
        "                    python3-pandas python3-matplotlib python3-scipy python3-sklearn\n"
        "                    python3-seaborn python3-pil python3-plotly r-cran-irkernel node-typescript\n"
        "                    default-jdk-headless\n"
        "`hutch template rm code-interpreter` removes it: the interpreter then runs on the host\n"
        "template again (the host's /usr, with the kernels the host has installed).\n";

/* What a verb builds: the template, the recipe's name in the build's key,
 * its packages */
typedef struct recipe {
        const char *name;  /* the template written */
        const char *verb;  /* `hutch template VERB`, and the prefix of our messages */
        const char *key;   /* part of every build's key: a new recipe is a new key */
        const char *audit; /* the audit trail's event */
        const char *usage; /* --help, and after a usage error */
        const char *const *defaults;
        const char *const *required;
} recipe;

static const recipe recipe_base = {
        .name = "base",
        .verb = "base",
        .key = "hutch-base-1",
        .audit = "template.base",
        .usage = base_usage,
        .defaults = default_packages,
        .required = base_required,
};

static const recipe recipe_interp = {
        .name = "code-interpreter",
        .verb = "interpreter",
        .key = "hutch-interp-1",
        .audit = "template.interpreter",
        .usage = interp_usage,
        .defaults = interp_default_packages,
        .required = interp_required,
};

static const recipe *rc = &recipe_base; /* the verb's, for the whole run */

static const char *data_dir(void) {
        return cli_template_data_dir();
}

static bool json_out;
static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
        got_signal = sig;
}

/* A stage line: "base: ..." on stderr, or {"phase":...,"message":...}. */
static void stage(const char *phase, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stage(const char *phase, const char *fmt, ...) {
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (json_out) {
                json_t *o = json_pack("{s:s, s:s}", "phase", phase, "message", msg);
                char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
                if (s)
                        printf("%s\n", s);
                fflush(stdout);
                free(s);
                json_decref(o);
        } else
                fprintf(stderr, "%s: %s\n", rc->verb, msg);
}

/* ---------------------------------------------------------------- inputs */

static bool mirror_valid(const char *m) {
        size_t n = strlen(m);
        if (n < 8 || n > 512 || !(strncmp(m, "http://", 7) == 0 || strncmp(m, "https://", 8) == 0))
                return false;
        for (const unsigned char *c = (const unsigned char *) m; *c; c++)
                if (*c <= 0x20 || *c >= 0x7f || *c == '"' || *c == '\'' || *c == '\\')
                        return false;
        return true;
}

static bool suite_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > 64)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      (i > 0 && (c == '-' || c == '.'))))
                        return false;
        }
        return true;
}

/* Debian policy: [a-z0-9][a-z0-9+.-]+ */
static bool package_valid(const char *p) {
        size_t n = strlen(p);
        if (n < 2 || n > 128 || !((p[0] >= 'a' && p[0] <= 'z') || (p[0] >= '0' && p[0] <= '9')))
                return false;
        for (size_t i = 1; i < n; i++) {
                char c = p[i];
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '.' ||
                      c == '-'))
                        return false;
        }
        return true;
}

static int cmp_str(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

typedef struct pkgs {
        char *v[BASE_MAX_PACKAGES + 2];
        size_t n;
} pkgs;

static int pkgs_add(pkgs *p, const char *name) {
        for (size_t i = 0; i < p->n; i++)
                if (streq(p->v[i], name))
                        return 0;
        if (p->n >= BASE_MAX_PACKAGES)
                return log_error("--packages: more than %d packages", BASE_MAX_PACKAGES), -E2BIG;
        if (!package_valid(name))
                return log_error("--packages: '%.140s' is not a Debian package name ([a-z0-9][a-z0-9+.-]+)",
                                 name),
                       -EINVAL;
        p->v[p->n++] = strdup(name);
        return 0;
}

static int pkgs_parse(pkgs *p, const char *list) {
        char *copy = strdup(list), *save = NULL;
        int r = 0;
        for (char *t = strtok_r(copy, ", \t\n", &save); t && r == 0;
             t = strtok_r(NULL, ", \t\n", &save))
                r = pkgs_add(p, t);
        free(copy);
        if (r == 0 && p->n == 0)
                return log_error("--packages: the list is empty"), -EINVAL;
        return r;
}

static void pkgs_free(pkgs *p) {
        for (size_t i = 0; i < p->n; i++)
                free(p->v[i]);
        p->n = 0;
}

/* The host's release: VERSION_CODENAME of /etc/os-release. */
static int host_codename(char *buf, size_t n) {
        FILE *f = fopen("/etc/os-release", "re");
        if (!f)
                return -errno;
        char line[512];
        int r = -ENOENT;
        while (fgets(line, sizeof line, f))
                if (strncmp(line, "VERSION_CODENAME=", 17) == 0) {
                        char *v = line + 17;
                        v[strcspn(v, "\r\n")] = 0;
                        if (*v == '"') {
                                v++;
                                v[strcspn(v, "\"")] = 0;
                        }
                        snprintf(buf, n, "%s", v);
                        r = *v ? 0 : -ENOENT;
                        break;
                }
        fclose(f);
        return r;
}

static bool word_in(const char *list, const char *w) {
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", list);
        char *save = NULL;
        for (char *t = strtok_r(copy, " \t", &save); t; t = strtok_r(NULL, " \t", &save))
                if (streq(t, w))
                        return true;
        return false;
}

/* The first deb source of the host's apt that serves suite: deb822 stanzas
 * in sources.list.d/ *.sources, then one-line entries. */
static bool host_mirror_deb822(const char *path, const char *suite, char *buf, size_t n) {
        FILE *f = fopen(path, "re");
        if (!f)
                return false;
        char line[1024], types[1024] = "", uris[1024] = "", suites[1024] = "";
        bool found = false, more = true;
        while (!found && more) {
                more = fgets(line, sizeof line, f) != NULL;
                line[strcspn(line, "\r\n")] = 0;
                if (!more || !line[0]) { /* the end of a stanza */
                        if (word_in(types, "deb") && word_in(suites, suite) && uris[0]) {
                                char *save = NULL, *u = strtok_r(uris, " \t", &save);
                                if (u && mirror_valid(u)) {
                                        snprintf(buf, n, "%s", u);
                                        found = true;
                                }
                        }
                        types[0] = uris[0] = suites[0] = 0;
                        continue;
                }
                char *v = strchr(line, ':');
                if (!v || line[0] == '#' || line[0] == ' ')
                        continue;
                *v++ = 0;
                v += strspn(v, " \t");
                if (strcasecmp(line, "Types") == 0)
                        snprintf(types, sizeof types, "%s", v);
                else if (strcasecmp(line, "URIs") == 0)
                        snprintf(uris, sizeof uris, "%s", v);
                else if (strcasecmp(line, "Suites") == 0)
                        snprintf(suites, sizeof suites, "%s", v);
        }
        fclose(f);
        return found;
}

static bool host_mirror_list(const char *path, const char *suite, char *buf, size_t n) {
        FILE *f = fopen(path, "re");
        if (!f)
                return false;
        char line[1024];
        bool found = false;
        while (!found && fgets(line, sizeof line, f)) {
                char *save = NULL, *t = strtok_r(line, " \t\r\n", &save);
                if (!t || !streq(t, "deb"))
                        continue;
                t = strtok_r(NULL, " \t\r\n", &save);
                if (t && t[0] == '[') /* [options] */
                        while (t && !strchr(t, ']'))
                                t = strtok_r(NULL, " \t\r\n", &save);
                if (t && strchr(t, ']'))
                        t = strtok_r(NULL, " \t\r\n", &save);
                char *s = t ? strtok_r(NULL, " \t\r\n", &save) : NULL;
                if (t && s && streq(s, suite) && mirror_valid(t)) {
                        snprintf(buf, n, "%s", t);
                        found = true;
                }
        }
        fclose(f);
        return found;
}

/* Whether the host's apt has a deb source for suite: its URL to buf. */
static bool host_mirror(const char *suite, char *buf, size_t n) {
        return host_mirror_deb822("/etc/apt/sources.list.d/debian.sources", suite, buf, n) ||
               host_mirror_list("/etc/apt/sources.list", suite, buf, n);
}

/* The archives a build reads: the main suite first, then SUITE-updates and
 * SUITE-security where there are such. */
#define BASE_MAX_SOURCES 3
typedef struct archive {
        char url[600];
        char suite[80];
} archive;

typedef struct sources {
        archive v[BASE_MAX_SOURCES];
        size_t n;
} sources;

static void sources_add(sources *s, const char *url, const char *suite) {
        if (s->n < BASE_MAX_SOURCES) {
                snprintf(s->v[s->n].url, sizeof s->v[s->n].url, "%s", url);
                snprintf(s->v[s->n].suite, sizeof s->v[s->n].suite, "%s", suite);
                s->n++;
        }
}

/* ------------------------------------------------------------ processes */

/* In the child, as host root: a mount namespace where work is /tmp, then a
 * user namespace whose root the parent maps to BASE_BUILD_UID_BASE (it
 * says so on go once we said on ready that we are in it). */
static int enter_build_ns(const char *work, int ready, int go) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount(work, "/tmp", NULL, MS_BIND, NULL) < 0) {
                fprintf(stderr, "%s: mount namespace: %m\n", rc->verb);
                return -1;
        }
        if (unshare(CLONE_NEWUSER) < 0) {
                fprintf(stderr, "%s: user namespace: %m\n", rc->verb);
                return -1;
        }
        char c = 1;
        if (write(ready, &c, 1) != 1 || read(go, &c, 1) != 1 || c != 1) {
                fprintf(stderr, "%s: the id maps were not written\n", rc->verb);
                return -1;
        }
        if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
                fprintf(stderr, "%s: becoming the namespace's root: %m\n", rc->verb);
                return -1;
        }
        /* nothing it runs gains privileges through a set-id file */
        return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

/* Run argv in a process group of its own, stdout and stderr to out (-1:
 * ours); with work, in the build's namespaces (enter_build_ns). A signal
 * to us ends the group: ^C on a terminal reached it already, a SIGTERM to
 * us alone is passed on, and what is left after 20 s is killed. */
static int spawn(char *const argv[], char *const envp[], int out, const char *work, int *ret_status) {
        int ready[2] = { -1, -1 }, go[2] = { -1, -1 };
        if (work && (pipe2(ready, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0)) {
                int r = -errno;
                safe_close(ready[0]), safe_close(ready[1]), safe_close(go[0]);
                return r;
        }
        pid_t pid = fork();
        if (pid < 0) {
                int r = -errno;
                safe_close(ready[0]), safe_close(ready[1]), safe_close(go[0]), safe_close(go[1]);
                return r;
        }
        if (pid == 0) {
                (void) setpgid(0, 0);
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                signal(SIGINT, SIG_DFL);
                signal(SIGTERM, SIG_DFL);
                signal(SIGHUP, SIG_DFL);
                if (out >= 0 && (dup2(out, STDOUT_FILENO) < 0 || dup2(out, STDERR_FILENO) < 0))
                        _exit(127);
                if (work && enter_build_ns(work, ready[1], go[0]) < 0)
                        _exit(126);
                execve(argv[0], argv, envp);
                fprintf(stderr, "%s: cannot run %s: %m\n", rc->verb, argv[0]);
                _exit(127);
        }
        (void) setpgid(pid, pid);
        if (work) {
                safe_close(ready[1]);
                safe_close(go[0]);
                char c = 0;
                ssize_t k;
                while ((k = read(ready[0], &c, 1)) < 0 && errno == EINTR)
                        ;
                int r = 0;
                if (k == 1 &&
                    ((r = idmap_write(pid, "uid_map", BASE_BUILD_UID_BASE, 65536)) < 0 ||
                     (r = idmap_write(pid, "gid_map", BASE_BUILD_UID_BASE, 65536)) < 0))
                        log_error("writing the build's id maps: %s", strerror(-r));
                c = r == 0 && k == 1 ? 1 : 0;
                (void) !write(go[1], &c, 1);
                safe_close(ready[0]);
                safe_close(go[1]);
        }
        int status = 0;
        bool sent = false;
        time_t deadline = 0;
        for (;;) {
                pid_t w = waitpid(pid, &status, got_signal ? WNOHANG : 0);
                if (w == pid)
                        break;
                if (w < 0 && errno != EINTR)
                        return -errno;
                if (got_signal && !sent) {
                        (void) kill(-pid, SIGTERM);
                        sent = true;
                        deadline = time(NULL) + 20;
                } else if (got_signal && time(NULL) > deadline) {
                        (void) kill(-pid, SIGKILL);
                        deadline = (time_t) INT64_MAX;
                }
                if (got_signal && w == 0)
                        usleep(100 * 1000);
        }
        *ret_status = status;
        return 0;
}

/* ----------------------------------------------------------------- build */

typedef struct build {
        char dir[PATH_MAX];  /* DATA_DIR/.base-build */
        char work[PATH_MAX]; /* its work/, the build's /tmp */
        char log[PATH_MAX];  /* what the helpers said, shown on failure */
} build;

static void show_log(const build *b) {
        FILE *f = fopen(b->log, "re");
        if (!f)
                return;
        /* the last 30 lines */
        char *lines[30] = { 0 }, line[1024];
        size_t n = 0;
        while (fgets(line, sizeof line, f)) {
                free(lines[n % 30]);
                lines[n % 30] = strdup(line);
                n++;
        }
        fclose(f);
        for (size_t i = n > 30 ? n - 30 : 0; i < n; i++) {
                fprintf(stderr, "  %s", lines[i % 30] ? lines[i % 30] : "\n");
                free(lines[i % 30]);
                lines[i % 30] = NULL;
        }
}

static int open_log(const build *b) {
        return open(b->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
}

/* work: in the build's namespaces (spawn) */
static int run_logged(const build *b, char *const argv[], char *const envp[], const char *work,
                      const char *what) {
        _cleanup_close_ int fd = open_log(b);
        int status = 0, r = fd < 0 ? -errno : spawn(argv, envp, fd, work, &status);
        if (r < 0)
                return log_error("%s: %s", what, strerror(-r)), r;
        if (got_signal)
                return -EINTR;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                log_error("%s failed (%s %d):", what, WIFEXITED(status) ? "exit" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                show_log(b);
                return -EIO;
        }
        return 0;
}

/* The suite's InRelease, through the host's apt transports (its proxies):
 * Date: becomes SOURCE_DATE_EPOCH, the file's sha256 part of the key. It is
 * not verified here: mmdebstrap's apt verifies what the build uses. */
static int release_info(const build *b, const char *mirror, const char *suite, int64_t *ret_epoch,
                        char ret_date[64], char ret_hex[65]) {
        char url[1024], path[PATH_MAX + 96];
        snprintf(url, sizeof url, "%s%sdists/%s/InRelease", mirror,
                 mirror[strlen(mirror) - 1] == '/' ? "" : "/", suite);
        snprintf(path, sizeof path, "%s/InRelease.%s", b->dir, suite);
        char *argv[] = { (char *) "/usr/lib/apt/apt-helper", (char *) "download-file", url, path,
                         NULL };
        char *envp[] = { (char *) "PATH=/usr/sbin:/usr/bin:/sbin:/bin", (char *) "LC_ALL=C", NULL };
        char what[160];
        snprintf(what, sizeof what, "downloading %s's InRelease", suite);
        int r = run_logged(b, argv, envp, NULL, what);
        if (r < 0)
                return r;
        FILE *f = fopen(path, "re");
        if (!f)
                return log_error("%s: %m", path), -errno;
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
                EVP_MD_CTX_free(md);
                fclose(f);
                return log_error("out of memory"), -ENOMEM;
        }
        char line[4096];
        bool dated = false;
        while (fgets(line, sizeof line, f)) {
                EVP_DigestUpdate(md, line, strlen(line));
                if (!dated && strncmp(line, "Date: ", 6) == 0) {
                        struct tm tm = { 0 };
                        char *end = strptime(line + 6, "%a, %d %b %Y %H:%M:%S", &tm);
                        if (end) {
                                *ret_epoch = (int64_t) timegm(&tm);
                                line[strcspn(line, "\r\n")] = 0;
                                snprintf(ret_date, 64, "%.63s", line + 6);
                                dated = true;
                        }
                }
        }
        fclose(f);
        unsigned char d[EVP_MAX_MD_SIZE];
        unsigned int dn = 0;
        EVP_DigestFinal_ex(md, d, &dn);
        EVP_MD_CTX_free(md);
        for (unsigned i = 0; i < dn && i < 32; i++)
                snprintf(ret_hex + 2 * i, 3, "%02x", d[i]);
        if (!dated)
                return log_error("%s has no Date: field: is %s a Debian archive?", url, mirror),
                       -EBADMSG;
        return 0;
}

static void hex_of(const char *s, char out[65]) {
        unsigned char d[EVP_MAX_MD_SIZE];
        unsigned int dn = 0;
        out[0] = 0;
        if (EVP_Digest(s, strlen(s), d, &dn, EVP_sha256(), NULL) == 1)
                for (unsigned i = 0; i < dn && i < 32; i++)
                        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* The source of the recipe's current template, "" when there is none. */
static void current_source(char *buf, size_t n) {
        buf[0] = 0;
        template_info *v = NULL;
        size_t k = 0;
        hutch_error err = { 0 };
        if (template_list(data_dir(), &v, &k, &err) < 0)
                return;
        for (size_t i = 0; i < k; i++)
                if (streq(v[i].name, rc->name) && v[i].source)
                        snprintf(buf, n, "%s", v[i].source);
        template_info_free(v, k);
}

static int build_tree(build *b, const sources *src, pkgs *p, bool force) {
        const char *mirror = src->v[0].url, *suite = src->v[0].suite;
        int64_t epoch = 0;
        char date[64] = "", date0[64] = "", release_hex[65] = "", key[65], version[128] = "";
        /* the other suites: their Release hashes join the key, the newest
         * Date of all is SOURCE_DATE_EPOCH */
        char extra[BASE_MAX_SOURCES * 800] = "", extra_src[BASE_MAX_SOURCES * 700] = "";
        int r = 0;
        for (size_t i = 0; i < src->n; i++) {
                int64_t e = 0;
                char d[64] = "", h[65] = "";
                stage("release", "Debian %s from %s: reading the suite's Release", src->v[i].suite,
                      src->v[i].url);
                if ((r = release_info(b, src->v[i].url, src->v[i].suite, &e, d, h)) < 0)
                        return r;
                if (i == 0) {
                        memcpy(release_hex, h, sizeof h);
                        memcpy(date0, d, sizeof d);
                } else {
                        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%s %s %s\n",
                                 src->v[i].url, src->v[i].suite, h);
                        snprintf(extra_src + strlen(extra_src), sizeof extra_src - strlen(extra_src),
                                 "; + %s from %s (Release %s)", src->v[i].suite, src->v[i].url, d);
                }
                if (i == 0 || e > epoch) {
                        epoch = e;
                        memcpy(date, d, sizeof d);
                }
        }
        /* mmdebstrap's version is an input too */
        {
                char *argv[] = { (char *) "/usr/bin/mmdebstrap", (char *) "--version", NULL };
                char *envp[] = { (char *) "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
                if ((r = run_logged(b, argv, envp, NULL, "mmdebstrap --version")) < 0)
                        return r;
                FILE *f = fopen(b->log, "re");
                if (f) {
                        if (fgets(version, sizeof version, f))
                                version[strcspn(version, "\r\n")] = 0;
                        fclose(f);
                }
        }
        char list[BASE_MAX_PACKAGES * 130] = "";
        for (size_t i = 0; i < p->n; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "",
                         p->v[i]);
        /* a build of the main suite alone has the key it always had */
        char inputs[sizeof list + sizeof extra + 2048];
        snprintf(inputs, sizeof inputs, "%s\n%s\n%s\n%s\n%s\n%s\n%s", rc->key, mirror, suite,
                 list, release_hex, version, extra);
        hex_of(inputs, key);
        char source[sizeof list + sizeof extra_src + 1024];
        if (src->n == 1)
                snprintf(source, sizeof source, "debian %s from %s (Release %s; %s; packages %s) key %.64s",
                         suite, mirror, date, version, list, key);
        else
                snprintf(source, sizeof source,
                         "debian %s from %s (Release %s)%s (dated %s; %s; packages %s) key %.64s", suite,
                         mirror, date0, extra_src, date, version, list, key);
        char have[sizeof source + 64];
        current_source(have, sizeof have);
        if (!force && streq(have, source)) {
                stage("unchanged",
                      "%s is up to date (key %.12s: same archive state, packages and recipe)", rc->name, key);
                return 1;
        }
        stage("build",
              "mmdebstrap: %zu packages (and their dependencies) over minbase, SOURCE_DATE_EPOCH=%lld "
              "(%s), maintainer scripts as host uids %#x+ in a user namespace",
              p->n, (long long) epoch, date, BASE_BUILD_UID_BASE);
        char include[sizeof list + 16], sde[64];
        snprintf(include, sizeof include, "--include=%s", list);
        snprintf(sde, sizeof sde, "SOURCE_DATE_EPOCH=%lld", (long long) epoch);
        /* `user` as E2B's base has it: uid 1000, /home/user, bash,
         * passwordless sudo */
        static const char hook[] =
                "--customize-hook=chroot \"$1\" useradd --create-home --uid 1000 --user-group "
                "--shell /bin/bash user && "
                "printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\\n' > \"$1/etc/sudoers.d/user\" && "
                "chmod 0440 \"$1/etc/sudoers.d/user\"";
        char *argv[] = { (char *) "/usr/bin/mmdebstrap", (char *) "--mode=unshare",
                         (char *) "--variant=minbase", (char *) "--format=tar",
                         /* no device nodes in the tree: the layer store takes
                          * none (hutch makes /dev in every sandbox) */
                         (char *) "--skip=output/dev",
                         /* the tree is a tar a minute later: no fsync per file */
                         (char *) "--dpkgopt=force-unsafe-io", include, (char *) hook,
                         (char *) suite, (char *) "/tmp/tree.tar", (char *) mirror,
                         /* SUITE-updates, SUITE-security: whole deb lines */
                         NULL, NULL, NULL };
        char lines[BASE_MAX_SOURCES][800];
        size_t argc0 = 0;
        while (argv[argc0])
                argc0++;
        for (size_t i = 1; i < src->n; i++) {
                snprintf(lines[i], sizeof lines[i], "deb %s %s main", src->v[i].url, src->v[i].suite);
                argv[argc0++] = lines[i];
        }
        const char *term = getenv("TERM");
        char termv[128];
        snprintf(termv, sizeof termv, "TERM=%s", term && *term ? term : "dumb");
        char *envp[] = { (char *) "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                         (char *) "HOME=/tmp",
                         (char *) "TMPDIR=/tmp",
                         (char *) "LC_ALL=C.UTF-8",
                         sde,
                         termv,
                         NULL };
        int64_t t0 = (int64_t) time(NULL);
        if (json_out) {
                if ((r = run_logged(b, argv, envp, b->work, "mmdebstrap")) < 0)
                        return r;
        } else {
                int status = 0;
                if ((r = spawn(argv, envp, -1, b->work, &status)) < 0)
                        return log_error("mmdebstrap: %s", strerror(-r)), r;
                if (got_signal)
                        return -EINTR;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                        return log_error("mmdebstrap failed (%s %d): its messages are above",
                                         WIFEXITED(status) ? "exit" : "signal",
                                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)),
                               -EIO;
        }
        char tar[PATH_MAX + 16];
        snprintf(tar, sizeof tar, "%s/tree.tar", b->work);
        _cleanup_close_ int fd = open(tar, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return log_error("mmdebstrap left no tree in %s", tar), -ENOENT;
        stage("unpack", "mmdebstrap took %llds; the tree (%.1f MiB) goes into the layer store",
              (long long) ((int64_t) time(NULL) - t0), (double) st.st_size / 1048576.0);
        hutch_error err = { 0 };
        _cleanup_close_ int busy = layer_store_hold(data_dir(), &err);
        if (busy < 0)
                return log_error("%s", err.msg), busy;
        char digest[LAYER_DIGEST_MAX];
        bool existed = false;
        if ((r = image_tar_layer(data_dir(), fd, digest, &existed, &err)) < 0)
                return log_error("the built tree: %s", err.msg), r;
        if (got_signal)
                return -EINTR;
        char *layers[] = { digest, NULL };
        char *env[] = { (char *) "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        (char *) "LANG=C.UTF-8", NULL };
        hutch_template_meta meta = {
                .name = rc->name,
                .kind = "debian",
                .source = source,
                .layers = layers,
                .env = env,
        };
        if ((r = template_write_base(data_dir(), &meta, &err)) < 0)
                return log_error("%s", err.msg), r;
        stage("layer", "layer %s (%s)", digest,
              existed ? "the store had it: the same bytes as an earlier build" : "new");
        cli_audit_note(data_dir(), rc->audit,
                       json_pack("{s:s, s:s, s:s, s:s, s:s, s:i}", "suite", suite, "mirror", mirror,
                                 "layer", digest, "key", key, "by", "cli", "suites", (int) src->n));
        if (json_out)
                printf("{\"phase\":\"built\",\"name\":\"%s\",\"layer\":\"%s\",\"key\":\"%s\"}\n",
                       rc->name, digest, key);
        else
                printf("%s\n", rc->name);
        return 0;
}

static int template_debian(int argc, char **argv) {
        const char *usage_text = rc->usage;
        char verb[32];
        snprintf(verb, sizeof verb, "template %s", rc->verb);
        static const struct option opts[] = { { "mirror", required_argument, NULL, 'm' },
                                              { "suite", required_argument, NULL, 's' },
                                              { "security-mirror", required_argument, NULL, 'S' },
                                              { "no-updates", no_argument, NULL, 'n' },
                                              { "packages", required_argument, NULL, 'p' },
                                              { "json", no_argument, NULL, 'j' },
                                              { "force", no_argument, NULL, 'f' },
                                              { "help", no_argument, NULL, 'h' },
                                              {} };
        const char *mirror = NULL, *suite = NULL, *list = NULL, *sec_mirror = NULL;
        bool force = false, no_updates = false;
        int c;
        json_out = false;
        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, ":m:s:S:np:jfh", opts, NULL)) != -1) {
                if (c == 'm')
                        mirror = optarg;
                else if (c == 'S')
                        sec_mirror = optarg;
                else if (c == 'n')
                        no_updates = true;
                else if (c == 's')
                        suite = optarg;
                else if (c == 'p')
                        list = optarg;
                else if (c == 'j')
                        json_out = true;
                else if (c == 'f')
                        force = true;
                else if (c == 'h') {
                        fputs(usage_text, stdout);
                        return 0;
                } else
                        return cli_getopt_error(verb, c, argv);
        }
        if (optind != argc)
                return log_error("template %s: unexpected argument '%s'\n%s", rc->verb, argv[optind],
                                 usage_text),
                       EXIT_USAGE;
        if (mirror && !mirror_valid(mirror))
                return log_error("--mirror '%.200s' is not an http:// or https:// URL (printable, no spaces or "
                                 "quotes, at most 512 bytes)",
                                 mirror),
                       EXIT_USAGE;
        if (sec_mirror && !mirror_valid(sec_mirror))
                return log_error("--security-mirror '%.200s' is not an http:// or https:// URL (printable, no "
                                 "spaces or quotes, at most 512 bytes)",
                                 sec_mirror),
                       EXIT_USAGE;
        if (sec_mirror && no_updates)
                return log_error("--security-mirror and --no-updates: the second says to read no security "
                                 "suite; give one of them"),
                       EXIT_USAGE;
        if (suite && !suite_valid(suite))
                return log_error("--suite '%.80s' is not a suite name (a-z, 0-9, then - and .; at most 64)",
                                 suite),
                       EXIT_USAGE;
        pkgs p = { .n = 0 };
        int r = 0;
        if (list)
                r = pkgs_parse(&p, list);
        else
                for (const char *const *d = rc->defaults; *d && r == 0; d++)
                        r = pkgs_add(&p, *d);
        for (const char *const *d = rc->required; *d && r == 0; d++)
                r = pkgs_add(&p, *d);
        if (r < 0) {
                pkgs_free(&p);
                return EXIT_USAGE;
        }
        qsort(p.v, p.n, sizeof p.v[0], cmp_str);
        char codename[65];
        if (!suite) {
                if (host_codename(codename, sizeof codename) < 0 || !suite_valid(codename)) {
                        pkgs_free(&p);
                        return log_error("cannot tell the host's Debian release from /etc/os-release: "
                                         "give --suite"),
                               EXIT_USAGE;
                }
                suite = codename;
        }
        /* the main suite from --mirror, or the host's source of it, or
         * Debian's; SUITE-updates and SUITE-security where the host's apt
         * reads them (updates from --mirror when given, security from
         * --security-mirror), unless --no-updates */
        sources src = { .n = 0 };
        char url[600], name[80];
        if (!mirror && !host_mirror(suite, url, sizeof url))
                snprintf(url, sizeof url, "http://deb.debian.org/debian");
        sources_add(&src, mirror ? mirror : url, suite);
        if (!no_updates) {
                snprintf(name, sizeof name, "%s-updates", suite);
                if (host_mirror(name, url, sizeof url))
                        sources_add(&src, mirror ? mirror : url, name);
                snprintf(name, sizeof name, "%s-security", suite);
                if (sec_mirror || host_mirror(name, url, sizeof url))
                        sources_add(&src, sec_mirror ? sec_mirror : url, name);
        }
        const char *dd = data_dir();
        if (dd[0] != '/' || strlen(dd) > 1024) {
                pkgs_free(&p);
                return log_error("HUTCH_DATA_DIR must be an absolute path of at most 1024 bytes"),
                       EXIT_USAGE;
        }
        if (geteuid() != 0 || access("/usr/bin/mmdebstrap", X_OK) < 0 ||
            access("/usr/lib/apt/apt-helper", X_OK) < 0) {
                pkgs_free(&p);
                return log_error(geteuid() != 0
                                         ? "hutch template %s needs root (it gives the build a uid range "
                                           "of its own)"
                                         : "hutch template %s needs mmdebstrap and apt "
                                           "(apt-get install mmdebstrap)",
                                 rc->verb),
                       EXIT_HUTCH;
        }
        if ((r = mkdir_p(dd, 0700)) < 0) {
                pkgs_free(&p);
                return log_error("creating %s: %s", dd, strerror(-r)), EXIT_HUTCH;
        }
        char lockp[PATH_MAX];
        snprintf(lockp, sizeof lockp, "%s/.base-build.lock", dd);
        _cleanup_close_ int lock = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) < 0) {
                pkgs_free(&p);
                /* one build at a time, of either recipe: they share the
                 * build directory and the build's uid range */
                return log_error(errno == EWOULDBLOCK ? "another `hutch template base` or `interpreter` is running on %s"
                                                      : "locking %s: %m",
                                 lock < 0 ? lockp : dd),
                       EXIT_HUTCH;
        }
        build b;
        snprintf(b.dir, sizeof b.dir, "%s/.base-build", dd);
        snprintf(b.work, sizeof b.work, "%s/work", b.dir);
        snprintf(b.log, sizeof b.log, "%s/log", b.dir);
        (void) rm_rf_at(AT_FDCWD, b.dir); /* what a killed build left */
        if (mkdir(b.dir, 0700) < 0 || mkdir(b.work, 0700) < 0 ||
            chown(b.work, BASE_BUILD_UID_BASE, BASE_BUILD_UID_BASE) < 0) {
                r = -errno;
                (void) rm_rf_at(AT_FDCWD, b.dir);
                pkgs_free(&p);
                return log_error("creating %s: %s", b.work, strerror(-r)), EXIT_HUTCH;
        }
        struct sigaction sa = { .sa_handler = on_signal }, old[3];
        const int sigs[3] = { SIGINT, SIGTERM, SIGHUP };
        for (int i = 0; i < 3; i++)
                sigaction(sigs[i], &sa, &old[i]);
        r = build_tree(&b, &src, &p, force);
        (void) rm_rf_at(AT_FDCWD, b.dir);
        for (int i = 0; i < 3; i++)
                sigaction(sigs[i], &old[i], NULL);
        pkgs_free(&p);
        if (got_signal) {
                log_error("interrupted: nothing was written (%s is as it was)", rc->name);
                return 128 + got_signal;
        }
        if (r == 1) {
                if (json_out)
                        printf("{\"phase\":\"unchanged\",\"name\":\"%s\"}\n", rc->name);
                else
                        printf("%s\n", rc->name);
                return 0;
        }
        if (r < 0 && json_out)
                printf("{\"phase\":\"failed\",\"name\":\"%s\",\"message\":\"the build failed: "
                       "the reason is on stderr; %s is as it was\"}\n",
                       rc->name, rc->name);
        return r < 0 ? EXIT_HUTCH : 0;
}

int verb_template_base(int argc, char **argv) {
        rc = &recipe_base;
        return template_debian(argc, argv);
}

int verb_template_interpreter(int argc, char **argv) {
        rc = &recipe_interp;
        return template_debian(argc, argv);
}
