/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdint.h>
#include <time.h>

/* Nanoseconds on the given clock (CLOCK_MONOTONIC for deadlines and
 * durations, CLOCK_REALTIME for timestamps that are stored). */
static inline int64_t clock_ns(clockid_t clock) {
        struct timespec ts;
        clock_gettime(clock, &ts);
        return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t now_ms(void) {
        return clock_ns(CLOCK_MONOTONIC) / 1000000;
}
