/* SPDX-License-Identifier: Apache-2.0 */
/* The parsers of user-supplied sizes, durations, counts and CPU amounts
 * (hutch run's flags today, the daemon's JSON fields later). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 256)
                return 0;
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = 0;
        uint64_t v, w;
        if (parse_size(s, &v) == 0) {
                char buf[32];
                format_size(v, buf, sizeof buf);
                /* a formatted integral size parses back to itself */
                if (strchr(buf, '.') == NULL && (parse_size(buf, &w) != 0 || w != v))
                        abort();
        }
        (void) parse_duration_ms(s, &v);
        (void) parse_u64(s, UINT64_MAX, &v);
        if (parse_cpus_millis(s, &v) == 0 && (v == 0 || v > 1024 * 1000))
                abort();
        free(s);
        return 0;
}
