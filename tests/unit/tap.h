/* SPDX-License-Identifier: Apache-2.0 */
/* A minimal TAP producer for the C unit tests. */
#pragma once

#include <stdio.h>
#include <stdlib.h>

static int tap_n, tap_failed;

#define ok(cond, ...)                                                                              \
        do {                                                                                       \
                tap_n++;                                                                           \
                bool _c = (cond);                                                                  \
                if (!_c)                                                                           \
                        tap_failed++;                                                              \
                printf("%sok %d - ", _c ? "" : "not ", tap_n);                                     \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
                if (!_c)                                                                           \
                        printf("#   failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
        } while (0)

static inline int tap_done(void) {
        printf("1..%d\n", tap_n);
        return tap_failed ? 1 : 0;
}
