/* SPDX-License-Identifier: Apache-2.0 */
/* layer_from_dir (lib/image/fromdir.c): a writable layer in overlay upper
 * format, owned in a sandbox's host range, becomes a store layer with ids
 * 0..65535, its whiteouts and opaque directories kept, its hardlinks
 * linked; a second call finds it in the store; a tree with an id outside
 * the range is refused. Needs root (chown, mknod, id-mapped mounts). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "tap.h"
#include "image/layer.h"
#include "util/fsutil.h"

#define SHIFT 0x50000000u

static void put(const char *root, const char *rel, const char *content, uid_t uid) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", root, rel);
        FILE *f = fopen(p, "w");
        fputs(content, f);
        fclose(f);
        if (chown(p, uid, uid) < 0)
                abort();
}

int main(void) {
        if (geteuid() != 0) {
                printf("1..0 # SKIP needs root\n");
                return 77;
        }
        char base[] = "/tmp/hutch-fromdir-XXXXXX";
        if (!mkdtemp(base))
                return 1;
        chmod(base, 0755);
        char up[4200], data[4200], p[4400];
        snprintf(up, sizeof up, "%s/upper", base);
        snprintf(data, sizeof data, "%s/data", base);
        mkdir(up, 0755);
        if (chown(up, SHIFT, SHIFT) < 0)
                return 1;
        snprintf(p, sizeof p, "%s/home", up);
        mkdir(p, 0755);
        if (chown(p, SHIFT + 1000, SHIFT + 1000) < 0)
                return 1;
        put(up, "home/file", "hello\n", SHIFT + 1000);
        snprintf(p, sizeof p, "%s/home/file", up);
        char p2[4400];
        snprintf(p2, sizeof p2, "%s/home/link", up);
        ok(link(p, p2) == 0, "a hardlink in the upper dir");
        snprintf(p, sizeof p, "%s/gone", up);
        ok(mknod(p, S_IFCHR | 0, makedev(0, 0)) == 0, "an overlay whiteout");
        snprintf(p, sizeof p, "%s/opq", up);
        mkdir(p, 0755);
        ok(setxattr(p, "user.overlay.opaque", "y", 1, 0) == 0, "an opaque directory");
        if (chown(p, SHIFT, SHIFT) < 0)
                return 1;
        snprintf(p, sizeof p, "%s/sym", up);
        ok(symlink("/etc/shadow", p) == 0 && lchown(p, SHIFT, SHIFT) == 0,
           "a symlink to a host path");

        int dfd = open(up, O_RDONLY | O_DIRECTORY);
        char digest[LAYER_DIGEST_MAX] = "";
        hutch_error err = { 0 };
        int r = layer_from_dir(data, dfd, SHIFT, digest, &err);
        ok(r == 0 && layer_digest_valid(digest), "layer_from_dir: %s %s", digest, err.msg);
        char lp[4200];
        layer_path(data, digest, lp, sizeof lp);
        ok(lp[0] != 0, "the layer is in the store");
        struct stat st;
        snprintf(p, sizeof p, "%s/home/file", lp);
        ok(stat(p, &st) == 0 && st.st_uid == 1000 && st.st_gid == 1000 && st.st_nlink == 2,
           "ids shifted back to 1000, the hardlink kept (nlink %lu)", (unsigned long) st.st_nlink);
        snprintf(p, sizeof p, "%s/gone", lp);
        ok(lstat(p, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0),
           "the whiteout kept");
        char v[4] = "";
        snprintf(p, sizeof p, "%s/opq", lp);
        ok(getxattr(p, "user.overlay.opaque", v, sizeof v) == 1 && v[0] == 'y',
           "the opaque directory kept");
        char t[64] = "";
        snprintf(p, sizeof p, "%s/sym", lp);
        ok(readlink(p, t, sizeof t - 1) == 11 && lstat(p, &st) == 0 && st.st_uid == 0,
           "the symlink kept as data");

        char again[LAYER_DIGEST_MAX] = "";
        ok(layer_from_dir(data, dfd, SHIFT, again, &err) == 0 && strcmp(again, digest) == 0,
           "the same tree gives the same digest (a canonical tar)");

        /* an id outside the sandbox's range: refused, nothing left */
        put(up, "home/stray", "x", 1234);
        char bad[LAYER_DIGEST_MAX] = "";
        r = layer_from_dir(data, dfd, SHIFT, bad, &err);
        ok(r == -ERANGE && strstr(err.msg, "outside the sandbox's range"),
           "an id outside the range: %s", err.msg);
        char **v2 = NULL;
        size_t n = 0;
        layer_list(data, &v2, &n, &err);
        ok(n == 1, "only the first layer in the store (%zu)", n);
        for (size_t i = 0; i < n; i++)
                free(v2[i]);
        free(v2);
        close(dfd);
        rm_rf_at(AT_FDCWD, base);
        return tap_done();
}
