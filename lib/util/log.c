/* SPDX-License-Identifier: Apache-2.0 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/log.h"

static int log_level = -1;
static const char *log_prefix = "hutch";
static bool log_json;
static const char *log_context; /* a request id, while one is served */

void log_set_json(bool on) {
        log_json = on;
}

const char *log_set_context(const char *request_id) {
        const char *old = log_context;
        log_context = request_id;
        return old;
}

/* s as the body of a JSON string */
static void json_escaped(FILE *f, const char *s) {
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20)
                        fprintf(f, "\\u%04x", *p);
                else
                        fputc(*p, f);
        }
}

static void log_json_line(int level, const char *msg) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char t[40];
        size_t n = strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(t + n, sizeof t - n, ".%03ldZ", ts.tv_nsec / 1000000);
        const char *lv = level <= LOG_LEVEL_ERROR ? "error"
                : level == LOG_LEVEL_WARNING      ? "warning"
                : level == LOG_LEVEL_INFO         ? "info"
                                                  : "debug";
        /* one write: lines of a concurrent writer (hutch-init's relay) never interleave mid-line */
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return;
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"prog\":\"", t, lv);
        json_escaped(f, log_prefix);
        fputs("\",\"msg\":\"", f);
        json_escaped(f, msg);
        fputc('"', f);
        if (log_context) {
                fputs(",\"request_id\":\"", f);
                json_escaped(f, log_context);
                fputc('"', f);
        }
        fputs("}\n", f);
        if (fclose(f) == 0)
                fwrite(buf, 1, len, stderr);
        free(buf);
}

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
                if (log_json)
                        log_json_line(level, buf);
                else
                        fprintf(stderr, "%s: %s%s\n", log_prefix,
                                level == LOG_LEVEL_DEBUG ? "debug: " : "", buf);
        }
        errno = saved;
        return err > 0 ? -err : err;
}
