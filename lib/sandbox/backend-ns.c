/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The namespace backend: hutch-init runs on the host kernel in new user,
 * mount, pid, network, UTS and IPC namespaces, under seccomp, with the
 * template as an id-mapped read-only lower layer and the writable layer on
 * a sized file system (storage.c).
 */
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"
#include "util/error.h"
#include "util/fdutil.h"
#include "util/syscalls.h"

static void ns_usage(hutch_sandbox *sb, hutch_stats *s) {
        uint64_t used = 0;
        if (storage_usage(sb->ctx, sb->id, &used) >= 0)
                s->disk_used = used;
}

static int ns_layer_open(hutch_sandbox *sb, hutch_layer_source *ret, hutch_error *err) {
        /* the layer is synced through the sandbox's own root: an overlay's
         * syncfs writes back its upper file system */
        char p[64];
        snprintf(p, sizeof p, "/proc/%d/root", (int) sb->init_pid);
        _cleanup_close_ int root = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0)
                return hutch_error_set(err, -errno, "opening the sandbox's root: %m");
        /* still our init, not a process that got its pid after it died */
        if (sb->init_pidfd >= 0 && syscall(SYS_pidfd_send_signal, sb->init_pidfd, 0, NULL, 0) < 0)
                return hutch_error_set(err, -ESRCH, "the sandbox's init is gone");
        int img = -1;
        int r = storage_open_image(sb->ctx, sb->id, &img, err);
        if (r < 0)
                return r;
        *ret = (hutch_layer_source){ .root_fd = TAKE_FD(root), .image_fd = img, .uid_base = sb->uid_base };
        return 0;
}

const hutch_backend_ops backend_ns = {
        .id = HUTCH_BACKEND_NS,
        .name = "ns",
        .caps = 0,
        .usage = ns_usage,
        .layer_open = ns_layer_open,
};
