/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The volume content plane's parsers of client bytes (daemon/volpath.c):
 * the URL /volumecontent/{id}/{kind}, the query's path (cleaned, never with
 * a '..' left), its numbers and booleans, the volume name rule, and the
 * engine's check of a mount path (hutch_volume_path_check). Input:
 * NUL-separated fields (url, path, number, bool, name).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/volpath.h"
#include "hutch/hutch.h"
#include "util/macro.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_clean(const char *out) {
        size_t n = strlen(out);
        if (n == 0 || n >= VOLPATH_MAX || out[0] != '/')
                abort();
        if (n > 1 && out[n - 1] == '/')
                abort();
        for (const char *p = out; *p;) {
                const char *s = p + 1, *e = strchrnul(s, '/');
                size_t len = (size_t) (e - s);
                if (n > 1 &&
                    (len == 0 || (len == 1 && s[0] == '.') ||
                     (len == 2 && s[0] == '.' && s[1] == '.')))
                        abort();
                for (const char *c = s; c < e; c++)
                        if ((unsigned char) *c < 0x20 || *c == 0x7f)
                                abort();
                p = e;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 3 * VOLPATH_MAX)
                return 0;
        char *buf = malloc(size + 1);
        if (!buf)
                return 0;
        memcpy(buf, data, size);
        buf[size] = 0;
        const char *field[5] = { "", "", "", "", "" };
        size_t k = 0, start = 0;
        for (size_t i = 0; i <= size && k < 5; i++)
                if (i == size || buf[i] == 0) {
                        buf[i] = 0;
                        field[k++] = buf + start;
                        start = i + 1;
                }

        char id[37];
        int kind;
        if (volcontent_route(field[0], id, &kind) == 0) {
                if (kind < VOLC_PATH || kind > VOLC_FILE)
                        abort();
                if (id[0] && !hutch_volume_id_valid(id))
                        abort();
        }
        char out[VOLPATH_MAX];
        const char *why = NULL;
        if (volpath_clean(field[1], out, &why) == 0) {
                check_clean(out);
                /* cleaning is idempotent */
                char again[VOLPATH_MAX];
                if (volpath_clean(out, again, &why) != 0 || strcmp(out, again) != 0)
                        abort();
        } else if (!why)
                abort();
        uint64_t v = 0;
        int r = volquery_u64(field[2], 65535, &v);
        if (r == 1 && v > 65535)
                abort();
        bool b;
        (void) volquery_bool(field[3], &b);
        if (volume_name_valid(field[4]) &&
            (strlen(field[4]) == 0 || strlen(field[4]) > 128 || strchr(field[4], '/')))
                abort();
        /* a mount path the engine accepts is absolute, already clean, and
         * outside what it synthesizes */
        if (!hutch_volume_path_check(field[1])) {
                static const char *const reserved[] = { "/proc", "/dev",       "/sys",
                                                        "/etc",  "/run/hutch", NULL };
                char c[VOLPATH_MAX];
                if (volpath_clean(field[1], c, &why) != 0 || strcmp(c, field[1]) != 0 ||
                    strlen(field[1]) > HUTCH_VOLUME_PATH_MAX || streq(field[1], "/"))
                        abort();
                for (const char *const *q = reserved; *q; q++) {
                        size_t n = strlen(*q), m = strlen(field[1]);
                        if (strncmp(field[1], *q, n) == 0 && (field[1][n] == 0 || field[1][n] == '/'))
                                abort();
                        if (m < n && strncmp(*q, field[1], m) == 0 && (*q)[m] == '/')
                                abort();
                }
        }
        free(buf);
        return 0;
}
