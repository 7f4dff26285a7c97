/* SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"

int hutch_error_set(hutch_error *err, int code, const char *fmt, ...) {
        if (!err)
                return code;
        int saved = errno;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
        errno = saved;
        return code;
}

int hutch_error_wrap(hutch_error *err, int code, const char *fmt, ...) {
        if (!err)
                return code;
        char prefix[512], old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        if (old[0])
                snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
        else
                snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, strerror(code < 0 ? -code : code));
        err->code = code;
        return code;
}
