/* SPDX-License-Identifier: Apache-2.0 */
/* Logging for programs (cli/, daemon/). lib/ only ever calls log_debug(). */
#pragma once

#include <stdbool.h>

#include "util/macro.h"

enum { LOG_LEVEL_ERROR = 3, LOG_LEVEL_WARNING = 4, LOG_LEVEL_INFO = 6, LOG_LEVEL_DEBUG = 7 };

void log_set_level(int level);
int log_get_level(void);
void log_set_prefix(const char *prefix);
/* One JSON object per line on stderr ({"ts","level","prog","msg"[,"request_id"]})
 * instead of "prefix: msg" (hutch serve --log-format json). */
void log_set_json(bool on);
/* The request id that lines carry from now on (NULL: none); returns the
 * one before, to put back. */
const char *log_set_context(const char *request_id);
/* Returns -abs(err) when err != 0 so that `return log_error_errno(r, ...)` works. */
int log_internal(int level, int err, const char *fmt, ...) _printf_(3, 4);

#define log_debug(...)                                                                             \
        (log_get_level() >= LOG_LEVEL_DEBUG ? log_internal(LOG_LEVEL_DEBUG, 0, __VA_ARGS__) : 0)
#define log_info(...) log_internal(LOG_LEVEL_INFO, 0, __VA_ARGS__)
#define log_warning(...) log_internal(LOG_LEVEL_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_internal(LOG_LEVEL_ERROR, 0, __VA_ARGS__)
#define log_error_errno(e, ...) log_internal(LOG_LEVEL_ERROR, (e), __VA_ARGS__)
