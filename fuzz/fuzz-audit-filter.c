/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The audit trail's filters over client bytes (lib/audit/audit-read.c):
 * GET /events' query values and `hutch audit export`'s options, and the
 * export encodings of a record whose fields a sandbox chose (argv, paths).
 * Input: NUL-separated key=value pairs, then a detail string.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "audit/audit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 8192)
                return 0;
        char *buf = malloc(size + 1);
        if (!buf)
                return 0;
        memcpy(buf, data, size);
        buf[size] = 0;
        audit_filter f;
        audit_filter_init(&f);
        const char *last = "";
        for (size_t i = 0; i < size;) {
                char *field = buf + i;
                size_t n = strlen(field);
                char *eq = strchr(field, '=');
                if (eq) {
                        *eq = 0;
                        hutch_error err = { 0 };
                        (void) audit_filter_set(&f, field, eq + 1, 1800000000000LL, 1000, &err);
                        *eq = '=';
                }
                int64_t t;
                (void) audit_time_parse(field, 1800000000000LL, &t);
                last = field;
                i += n + 1;
        }
        audit_record r = { .seq = 1,
                           .ts_ms = f.since_ms,
                           .team = f.team,
                           .sandbox = f.sandbox,
                           .kind = f.kind,
                           .detail = last };
        char *j = audit_record_json(&r);
        free(j);
        FILE *devnull = fopen("/dev/null", "we");
        if (devnull) {
                audit_record_csv(devnull, &r);
                fclose(devnull);
        }
        free(buf);
        return 0;
}
