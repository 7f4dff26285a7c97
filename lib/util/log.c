/* SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static int log_level = -1;
static const char *log_prefix = "hutch";

void log_set_level(int level) {
        log_level = level;
}

int log_get_level(void) {
        if (log_level < 0) {
                const char *e = getenv("HUTCH_DEBUG");
                log_level = e && *e && !streq(e, "0") ? LOG_LEVEL_DEBUG : LOG_LEVEL_INFO;
        }
        return log_level;
}

void log_set_prefix(const char *prefix) {
        log_prefix = prefix;
}

int log_internal(int level, int err, const char *fmt, ...) {
        int saved = errno;
        if (level <= log_get_level()) {
                char buf[2048];
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(buf, sizeof buf, fmt, ap);
                va_end(ap);
                fprintf(stderr, "%s: %s%s\n", log_prefix, level == LOG_LEVEL_DEBUG ? "debug: " : "", buf);
        }
        errno = saved;
        return err > 0 ? -err : err;
}
