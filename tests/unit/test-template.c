/* SPDX-License-Identifier: Apache-2.0 */
/* The host template against a fake /etc in a temporary directory (issue
 * #19 item 10): it is rebuilt when an input it copies changes and only then,
 * and hutch_template_gc() removes the versions no sandbox uses. Needs root
 * (the build keeps the owners of what it copies). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"
#include "tap.h"
#include "template/template.h"
#include "util/fsutil.h"
#include "util/macro.h"

static char base[256], etc[300], data[300], run[300];

static void put(const char *rel, const char *content, mode_t mode) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", etc, rel);
        FILE *f = fopen(p, "we");
        if (f) {
                fputs(content, f);
                fclose(f);
        }
        chmod(p, mode);
}

/* Write into an existing file without replacing it (an editor saving in place). */
static void put_in_place(const char *rel, const char *content) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", etc, rel);
        int fd = open(p, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd >= 0) {
                (void) !write(fd, content, strlen(content));
                close(fd);
        }
}

static void dir(const char *rel, mode_t mode) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", etc, rel);
        mkdir(p, mode);
        chmod(p, mode);
}

/* Resolve `host`; its version's name to vname, whether it was built now. */
static bool resolve(char vname[64], bool *rebuilt) {
        hutch_template *t = NULL;
        hutch_error err = { 0 };
        if (template_resolve(data, "host", &t, &err) < 0) {
                printf("# resolve: %s\n", err.msg);
                return false;
        }
        const char *r = strstr(t->rootfs, "/templates/");
        snprintf(vname, 64, "%.*s", r ? (int) strcspn(r + 11, "/") : 0, r ? r + 11 : "");
        *rebuilt = t->rebuilt;
        template_free(t);
        return true;
}

/* Whether DATA_DIR/templates/<version>[/<rel>] exists. */
static bool exists(const char *version, const char *rel) {
        char p[900];
        struct stat st;
        snprintf(p, sizeof p, "%s/templates/%s%s%s", data, version, rel ? "/" : "", rel ? rel : "");
        return lstat(p, &st) == 0;
}

/* A sandbox's state file in the fake run dir. */
static void fake_sandbox(const char *id, const char *vname, long long created_ns) {
        char p[600], rootfs[600], real[PATH_MAX] = "";
        snprintf(p, sizeof p, "%s/sandboxes/%s", run, id);
        mkdir(p, 0711);
        snprintf(p, sizeof p, "%s/sandboxes/%s/state", run, id);
        FILE *f = fopen(p, "we");
        if (!f)
                return;
        fprintf(f, "id=%s\ntemplate=host\n", id);
        if (vname) {
                snprintf(rootfs, sizeof rootfs, "%s/templates/%s/rootfs", data, vname);
                if (!realpath(rootfs, real))
                        snprintf(real, sizeof real, "%s", rootfs);
                fprintf(f, "template_root=%s\n", real);
        }
        fprintf(f, "init_pid=1234\ncreated_ns=%lld\n", created_ns);
        fclose(f);
}

static void unfake_sandbox(const char *id) {
        char p[600];
        snprintf(p, sizeof p, "%s/sandboxes/%s", run, id);
        rm_rf_at(AT_FDCWD, p);
}

static long long version_ns(const char *vname) {
        return strtoll(vname + 5, NULL, 10);
}

int main(void) {
        if (geteuid() != 0) {
                printf("1..0 # SKIP the template build keeps owners: needs root\n");
                return 0;
        }
        snprintf(base, sizeof base, "/tmp/hutch-tpltest-XXXXXX");
        if (!mkdtemp(base)) {
                ok(false, "temp dir");
                return tap_done();
        }
        snprintf(etc, sizeof etc, "%s/etc", base);
        snprintf(data, sizeof data, "%s/data", base);
        snprintf(run, sizeof run, "%s/run", base);
        mkdir(etc, 0755);
        mkdir(data, 0700);
        mkdir(run, 0711);
        char sbdir[400];
        snprintf(sbdir, sizeof sbdir, "%s/sandboxes", run);
        mkdir(sbdir, 0711);

        /* a few of the entries the build copies, and some it does not */
        put("ld.so.cache", "cache-1", 0644);
        put("os-release", "ID=test\n", 0644);
        dir("profile.d", 0755);
        put("profile.d/a.sh", "# a\n", 0644);
        dir("ssl", 0755);
        dir("ssl/certs", 0755);
        put("ssl/certs/ca.pem", "pem-1", 0644);
        dir("ssl/private", 0700);
        dir("skel", 0755);
        put("skel/.bashrc", "# bashrc\n", 0644);
        put("unrelated.conf", "x=1\n", 0644);
        dir("unrelated.d", 0755);
        template_set_host_etc(etc);

        char v1[64] = "", v[64] = "";
        bool rebuilt = false;
        ok(resolve(v1, &rebuilt) && rebuilt && startswith(v1, "host."), "first resolve builds %s",
           v1);
        ok(exists(v1, "rootfs/etc/ssl/certs/ca.pem") && exists(v1, "rootfs/home/user/.bashrc") &&
                   !exists(v1, "rootfs/etc/unrelated.conf"),
           "it copies the listed entries and nothing else");
        ok(resolve(v, &rebuilt) && !rebuilt && streq(v, v1), "a second resolve reuses it");

        {
                char *stamp = NULL;
                ok(template_host_stamp(&stamp) == 0 && stamp && template_host_stamp_current(stamp),
                   "a fresh stamp is current");
                ok(stamp && !strstr(stamp, "unrelated") && !strstr(stamp, "ssl/private") &&
                           strstr(stamp, "\nssl/certs\t") && strstr(stamp, "\nskel/.bashrc\t") &&
                           strstr(stamp, "\n/bin\t"),
                   "the stamp lists copied inputs only");
                ok(!template_host_stamp_current("host-6 123 456") && !template_host_stamp_current(""),
                   "a stamp of another format is not current");
                free(stamp);
        }

        /* what the template does not copy changes nothing */
        put("unrelated.conf", "x=2\n", 0644);
        put("another-new-file", "y\n", 0600);
        dir("unrelated.d/sub", 0755);
        put("ssl/private/key.pem", "secret", 0600);
        put_in_place("unrelated.conf", "z=3\n");
        ok(resolve(v, &rebuilt) && !rebuilt && streq(v, v1),
           "files outside the copied inputs (and under ssl/private) do not rebuild it");

        /* what it copies does */
        put("ssl/certs/new.pem", "pem-2", 0644); /* an entry added below a copied directory */
        char v2[64] = "";
        ok(resolve(v2, &rebuilt) && rebuilt && !streq(v2, v1),
           "a new file under ssl/certs rebuilds it (%s)", v2);
        ok(exists(v2, "rootfs/etc/ssl/certs/new.pem"), "with the new file");
        ok(exists(v1, NULL), "the old version stays until collected");
        put_in_place("skel/.bashrc", "alias x=y\n");
        char v3[64] = "";
        ok(resolve(v3, &rebuilt) && rebuilt && !streq(v3, v2),
           "skel's .bashrc edited in place rebuilds it");
        put_in_place("ld.so.cache", "-2");
        char v4[64] = "";
        ok(resolve(v4, &rebuilt) && rebuilt && !streq(v4, v3),
           "a top-level file edited in place rebuilds it");
        dir("profile.d", 0750);
        char v5[64] = "";
        ok(resolve(v5, &rebuilt) && rebuilt && !streq(v5, v4),
           "a copied directory's mode rebuilds it");
        ok(resolve(v, &rebuilt) && !rebuilt && streq(v, v5), "and then it is current again");

        /* collection */
        hutch_ctx ctx = { .run_dir = run, .data_dir = data };
        hutch_error err = { 0 };
        fake_sandbox("aaaaaaaaaaaaaaaaaaaa", v1, version_ns(v2));
        /* a create under way holds its version shared */
        char p[600];
        snprintf(p, sizeof p, "%s/templates/%s", data, v3);
        int held = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ok(held >= 0 && flock(held, LOCK_SH) == 0, "a create in progress holds %s", v3);
        /* what a crash left */
        snprintf(p, sizeof p, "%s/templates/.trash-host.1", data);
        mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/templates/.host.new", data);
        (void) !symlink("host.1", p);

        int n = hutch_template_gc(&ctx, &err);
        ok(n == 4, "gc removed 2 versions and 2 leftovers (%d: %s)", n, err.msg);
        ok(exists(v1, NULL), "the version a sandbox's state names stays");
        ok(!exists(v2, NULL), "an unused version is removed");
        ok(exists(v3, NULL), "the version a create holds stays");
        ok(!exists(v4, NULL), "another unused version is removed");
        ok(exists(v5, NULL) && exists("host", NULL), "the current version and its link stay");
        ok(!exists(".trash-host.1", NULL) && !exists(".host.new", NULL),
           "a crash's leftovers are removed");
        close(held);
        ok(hutch_template_gc(&ctx, &err) == 1 && !exists(v3, NULL),
           "released by its create, it goes at the next collection");

        /* a sandbox from before template_root= keeps every version older than itself */
        unfake_sandbox("aaaaaaaaaaaaaaaaaaaa");
        fake_sandbox("bbbbbbbbbbbbbbbbbbbb", NULL, version_ns(v1) + 1);
        ok(hutch_template_gc(&ctx, &err) == 0 && exists(v1, NULL),
           "an older sandbox without template_root keeps the versions built before it");
        unfake_sandbox("bbbbbbbbbbbbbbbbbbbb");
        fake_sandbox("cccccccccccccccccccc", NULL, version_ns(v1) - 1);
        ok(hutch_template_gc(&ctx, &err) == 1 && !exists(v1, NULL), "but not those built after it");
        ok(hutch_template_gc(&ctx, &err) == 0, "nothing left to collect");
        unfake_sandbox("cccccccccccccccccccc");

        /* a directory without a state file: a create under way (an older
         * hutch's does not lock its version) keeps what was built before it */
        put("ssl/certs/third.pem", "pem-3", 0644);
        char v6[64] = "";
        ok(resolve(v6, &rebuilt) && rebuilt && !streq(v6, v5), "rebuilt once more (%s)", v6);
        snprintf(p, sizeof p, "%s/sandboxes/dddddddddddddddddddd", run);
        ok(mkdir(p, 0711) == 0, "a sandbox directory without state");
        ok(hutch_template_gc(&ctx, &err) == 0 && exists(v5, NULL), "it keeps the older version");
        long long t = version_ns(v5) - 1000;
        struct timespec ts[2] = { { t / 1000000000, t % 1000000000 },
                                  { t / 1000000000, t % 1000000000 } };
        ok(utimensat(AT_FDCWD, p, ts, 0) == 0 && hutch_template_gc(&ctx, &err) == 1 &&
                   !exists(v5, NULL),
           "but not one built after it");
        rmdir(p);
        v5[0] = 0;
        snprintf(v5, sizeof v5, "%s", v6);

        /* a collector never waits for a build: busy is 0, not a hang */
        snprintf(p, sizeof p, "%s/templates", data);
        int lfd = lock_file_take(AT_FDCWD, strcat(p, "/.lock"));
        ok(lfd >= 0 && hutch_template_gc(&ctx, &err) == 0,
           "a held templates lock makes gc return at once");
        close(lfd);
        ok(resolve(v, &rebuilt) && !rebuilt && streq(v, v5), "the current version still resolves");

        template_set_host_etc(NULL);
        rm_rf_at(AT_FDCWD, base);
        return tap_done();
}
