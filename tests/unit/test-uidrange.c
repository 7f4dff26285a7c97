/* SPDX-License-Identifier: Apache-2.0 */
/* uid range allocation: the pure picker, and real reservations in a
 * temporary run dir (no root needed: only files are involved). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"
#include "tap.h"
#include "util/fsutil.h"

int main(void) {
        uint8_t used[4] = { 0 };
        ok(uidrange_pick(used, 32, 0) == 0, "empty bitmap gives slot 0");
        used[0] = 0xff;
        ok(uidrange_pick(used, 32, 0) == 8, "first free after a full byte");
        memset(used, 0xff, sizeof used);
        ok(uidrange_pick(used, 32, 0) == -ENOSPC, "full bitmap is ENOSPC");
        used[3] = 0x7f;
        ok(uidrange_pick(used, 32, 0) == 31, "last slot found");
        ok(uidrange_pick(used, 31, 0) == -ENOSPC, "n bounds the search");

        char tmpl[] = "/tmp/hutch-uidtest-XXXXXX";
        char *dir = mkdtemp(tmpl);
        ok(dir != NULL, "temp run dir");
        hutch_ctx ctx = { .run_dir = dir, .uid_base = 0x40000000u, .uid_slots = 3 };
        char sbdir[512];
        snprintf(sbdir, sizeof sbdir, "%s/sandboxes", dir);
        mkdir(sbdir, 0700);
        const char *ids[] = { "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb", "cccccccccccccccccccc", "dddddddddddddddddddd" };
        for (int i = 0; i < 4; i++) {
                snprintf(sbdir, sizeof sbdir, "%s/sandboxes/%s", dir, ids[i]);
                mkdir(sbdir, 0700);
        }
        uint32_t s0 = 99, s1 = 99, s2 = 99, s3 = 99;
        hutch_error err = { 0 };
        ok(uidrange_alloc(&ctx, ids[0], &s0, &err) == 0 && s0 == 0, "first reservation gets slot 0");
        ok(uidrange_alloc(&ctx, ids[1], &s1, &err) == 0 && s1 == 1, "second gets slot 1");
        ok(uidrange_alloc(&ctx, ids[2], &s2, &err) == 0 && s2 == 2, "third gets slot 2");
        ok(uidrange_alloc(&ctx, ids[3], &s3, &err) == -ENOSPC && s3 == 99, "fourth: all ranges in use (%s)", err.msg);
        ok(uidrange_base(&ctx, 0) == 0x40000000u && uidrange_base(&ctx, 2) == 0x40000000u + 2 * 65536,
           "bases are 65536 apart and never 0");
        ok(uidrange_release(&ctx, 1, ids[0]) == -EBUSY, "releasing someone else's range is refused");
        ok(uidrange_release(&ctx, 1, ids[1]) == 0, "owner releases its range");
        ok(uidrange_alloc(&ctx, ids[3], &s3, &err) == 0 && s3 == 1, "a released range is handed out again");

        /* a reservation whose sandbox directory vanished (creator crashed) is reclaimed */
        snprintf(sbdir, sizeof sbdir, "%s/sandboxes/%s", dir, ids[2]);
        rmdir(sbdir);
        uint32_t s4 = 99;
        ok(uidrange_alloc(&ctx, ids[1], &s4, &err) == 0 && s4 == 2, "stale reservation reclaimed (got %u)", s4);

        rm_rf_at(AT_FDCWD, dir);
        struct stat st;
        ok(stat(dir, &st) < 0, "rm_rf_at removed the test dir");
        return tap_done();
}
