/* SPDX-License-Identifier: Apache-2.0 */
/* A registry's error body as a push quotes it (lib/image/registry.c,
 * registry_error_summary): whatever answers in the registry's place.
 * Invariants: only 0 or -ENOENT; the summary is NUL-terminated within its
 * buffer and holds printable ASCII only (it reaches a terminal and a log);
 * "" on -ENOENT. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char out[260];
        memset(out, 'x', sizeof out);
        int r = registry_error_summary(data, size, out, sizeof out);
        if (r != 0 && r != -ENOENT)
                abort();
        size_t l = strnlen(out, sizeof out);
        if (l == sizeof out)
                abort();
        if (r == -ENOENT && l != 0)
                abort();
        for (size_t i = 0; i < l; i++)
                if ((unsigned char) out[i] < 0x20 || (unsigned char) out[i] >= 0x7f)
                        abort();
        return 0;
}
