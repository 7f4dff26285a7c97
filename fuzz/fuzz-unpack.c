/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layer unpacker's tar reader (lib/image/unpack.c unpack_tar) in its
 * checking mode: libarchive's tar parser on hostile bytes, then every
 * check of an entry's name, link target, owner and type. (The writing half
 * runs in the hostile tests, in its namespace: a fuzzer writing files as
 * root is not something to run.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "image/image-internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        int fd = memfd_create("fuzz-unpack", MFD_CLOEXEC);
        if (fd < 0)
                abort();
        if (size && write(fd, data, size) != (ssize_t) size)
                abort();
        if (lseek(fd, 0, SEEK_SET) != 0)
                abort();
        char msg[600] = "";
        int r = unpack_tar(-1, fd, msg, sizeof msg);
        if (r < 0 && !msg[0])
                abort(); /* every refusal says why */
        close(fd);
        return 0;
}
