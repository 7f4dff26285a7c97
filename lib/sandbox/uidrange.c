/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host uid/gid ranges. Every live sandbox owns 65536 consecutive host ids
 * starting at uid_base + slot * 65536, so sandbox root (and every other
 * sandbox uid) is an unprivileged host id that no other sandbox shares
 * (docs/design.md §4). Reservations are files run_dir/uids/<slot> holding the
 * owner's id, created under an flock so that concurrent `hutch run`s and the
 * daemon never hand out the same range. A reservation whose sandbox state
 * directory is gone (creator killed half-way) is reclaimed.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/fsutil.h"

uid_t uidrange_base(const hutch_ctx *ctx, uint32_t slot) {
        return (uid_t) (ctx->uid_base + (uint64_t) slot * HUTCH_IDMAP_SIZE);
}

int uidrange_pick(const uint8_t *used, uint32_t n, uint32_t start) {
        for (uint32_t i = 0; i < n; i++) {
                uint32_t s = (start + i) % n;
                if (!(used[s / 8] & (1u << (s % 8))))
                        return (int) s;
        }
        return -ENOSPC;
}

static int uids_dir_open(hutch_ctx *ctx, int *ret_dirfd, int *ret_lockfd) {
        char path[4096];
        snprintf(path, sizeof path, "%s/uids", ctx->run_dir);
        int r = mkdir_p(path, 0700);
        if (r < 0)
                return r;
        _cleanup_close_ int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        _cleanup_close_ int lfd = lock_file_take(dfd, ".lock");
        if (lfd < 0)
                return lfd;
        *ret_dirfd = TAKE_FD(dfd);
        *ret_lockfd = TAKE_FD(lfd);
        return 0;
}

static bool reservation_is_stale(hutch_ctx *ctx, int dfd, const char *name) {
        _cleanup_free_ char *owner = NULL;
        if (read_file_at(dfd, name, HUTCH_ID_LEN + 8, &owner) < 0)
                return false;
        owner[strcspn(owner, "\n")] = 0;
        /* "v<pid>.<n>": a volume content helper (volfs.c) of process pid */
        if (owner[0] == 'v' && owner[1] >= '1' && owner[1] <= '9') {
                long pid = strtol(owner + 1, NULL, 10);
                return pid <= 0 || (kill((pid_t) pid, 0) < 0 && errno == ESRCH);
        }
        if (sandbox_validate_id(owner) < 0)
                return true;
        char path[4096];
        snprintf(path, sizeof path, "%s/sandboxes/%s", ctx->run_dir, owner);
        struct stat st;
        return stat(path, &st) < 0 && errno == ENOENT;
}

int uidrange_alloc(hutch_ctx *ctx, const char *id, uint32_t *ret_slot, hutch_error *err) {
        _cleanup_close_ int dfd = -1, lfd = -1;
        int r = uids_dir_open(ctx, &dfd, &lfd);
        if (r < 0)
                return hutch_error_set(err, r, "opening uid reservations in %s/uids: %s", ctx->run_dir,
                                       strerror(-r));

        size_t bytes = (ctx->uid_slots + 7) / 8;
        _cleanup_free_ uint8_t *used = calloc(1, bytes);
        if (!used)
                return hutch_error_set(err, -ENOMEM, "out of memory");

        int dup_fd = dup(dfd);
        DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
        if (!d) {
                safe_close(dup_fd);
                return hutch_error_set(err, -errno, "reading uid reservations: %m");
        }
        struct dirent *de;
        while ((de = readdir(d))) {
                char *end;
                if (de->d_name[0] < '0' || de->d_name[0] > '9')
                        continue;
                unsigned long s = strtoul(de->d_name, &end, 10);
                if (*end || s >= ctx->uid_slots)
                        continue;
                if (reservation_is_stale(ctx, dfd, de->d_name)) {
                        (void) unlinkat(dfd, de->d_name, 0);
                        continue;
                }
                used[s / 8] |= (uint8_t) (1u << (s % 8));
        }
        closedir(d);

        r = uidrange_pick(used, ctx->uid_slots, 0);
        if (r < 0)
                return hutch_error_set(err, -ENOSPC, "all %u uid ranges are in use", ctx->uid_slots);
        uint32_t slot = (uint32_t) r;

        char name[16];
        snprintf(name, sizeof name, "%u", slot);
        _cleanup_close_ int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return hutch_error_set(err, -errno, "reserving uid range %u: %m", slot);
        char line[HUTCH_ID_LEN + 2];
        snprintf(line, sizeof line, "%s\n", id);
        r = fd_write_all(fd, line, strlen(line));
        if (r < 0) {
                (void) unlinkat(dfd, name, 0);
                return hutch_error_set(err, r, "reserving uid range %u: %s", slot, strerror(-r));
        }
        *ret_slot = slot;
        return 0;
}

int uidrange_release(hutch_ctx *ctx, uint32_t slot, const char *id) {
        _cleanup_close_ int dfd = -1, lfd = -1;
        int r = uids_dir_open(ctx, &dfd, &lfd);
        if (r < 0)
                return r;
        char name[16];
        snprintf(name, sizeof name, "%u", slot);
        _cleanup_free_ char *owner = NULL;
        r = read_file_at(dfd, name, HUTCH_ID_LEN + 8, &owner);
        if (r < 0)
                return r == -ENOENT ? 0 : r;
        owner[strcspn(owner, "\n")] = 0;
        if (!streq(owner, id))
                return -EBUSY; /* someone else's by now: not ours to free */
        if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}
