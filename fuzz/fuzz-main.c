/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replay main for fuzz targets built without -fsanitize=fuzzer (systemd's
 * fuzz-main.c): runs LLVMFuzzerTestOneInput on every file named on the
 * command line, and on every file one level inside a named directory, so the
 * committed corpus is exercised on every test run. No input at all is a
 * failure: a corpus that went missing must not pass silently.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/macro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Corpus entries are small; anything larger is not an input we made. */
#define MAX_INPUT_SIZE (1024 * 1024)

static unsigned n_run;

static int run_fd(int fd, const char *name) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode))
                return 0; /* sockets, fifos, ... are not corpus entries */
        if (st.st_size > MAX_INPUT_SIZE)
                return -EFBIG;

        size_t size = (size_t) st.st_size;
        _cleanup_free_ uint8_t *buf = malloc(size ? size : 1);
        if (!buf)
                return -ENOMEM;
        size_t got = 0;
        while (got < size) {
                ssize_t n = read(fd, buf + got, size - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return negative_errno();
                if (n == 0)
                        break; /* shrank while we read: use what is there */
                got += (size_t) n;
        }
        LLVMFuzzerTestOneInput(buf, got);
        n_run++;
        printf("ok %u - %s (%zu bytes)\n", n_run, name, got);
        return 0;
}

static int run_path(int dir_fd, const char *name, const char *shown, bool descend) {
        _cleanup_close_ int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        struct stat st;

        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISDIR(st.st_mode))
                return run_fd(fd, shown);
        if (!descend)
                return 0;

        DIR *d = fdopendir(fd);
        if (!d)
                return negative_errno();
        fd = -1; /* owned by d now */

        int ret = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue; /* ., .., and hidden files (editor droppings) */
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", shown, de->d_name);
                int r = run_path(dirfd(d), de->d_name, path, false);
                if (r < 0) {
                        fprintf(stderr, "%s: %s\n", path, strerror(-r));
                        ret = r;
                }
        }
        closedir(d);
        return ret;
}

int main(int argc, char **argv) {
        int ret = EXIT_SUCCESS;

        for (int i = 1; i < argc; i++) {
                int r = run_path(AT_FDCWD, argv[i], argv[i], true);
                if (r < 0) {
                        fprintf(stderr, "%s: %s\n", argv[i], strerror(-r));
                        ret = EXIT_FAILURE;
                }
        }
        if (n_run == 0) {
                fprintf(stderr, "no inputs found\n");
                return EXIT_FAILURE;
        }
        printf("1..%u\n", n_run);
        return ret;
}
