/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "util/parse.h"

/* Parse "<digits>[.<digits>]" into an integer part and a fraction in
 * millionths; returns the position after the number or NULL. */
static const char *parse_decimal(const char *s, uint64_t *ret_int, uint64_t *ret_frac_micro) {
        uint64_t v = 0, frac = 0, scale = 100000;
        const char *p = s;
        if (!isdigit((unsigned char) *p))
                return NULL;
        while (isdigit((unsigned char) *p)) {
                unsigned d = (unsigned) (*p - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return NULL;
                v = v * 10 + d;
                p++;
        }
        if (*p == '.') {
                p++;
                if (!isdigit((unsigned char) *p))
                        return NULL;
                while (isdigit((unsigned char) *p)) {
                        frac += (uint64_t) (*p - '0') * scale;
                        scale /= 10;
                        p++;
                }
        }
        *ret_int = v;
        *ret_frac_micro = frac;
        return p;
}

static int scale_checked(uint64_t v, uint64_t frac_micro, uint64_t mul, uint64_t *ret) {
        if (mul != 0 && v > UINT64_MAX / mul)
                return -ERANGE;
        uint64_t r = v * mul;
        uint64_t f = (mul / 1000000) * frac_micro + ((mul % 1000000) * frac_micro) / 1000000;
        if (r > UINT64_MAX - f)
                return -ERANGE;
        *ret = r + f;
        return 0;
}

int parse_size(const char *s, uint64_t *ret) {
        static const struct {
                const char *suffix;
                uint64_t mul;
        } units[] = {
                { "", 1 },           { "b", 1 },
                { "k", 1ull << 10 }, { "kb", 1ull << 10 }, { "kib", 1ull << 10 },
                { "m", 1ull << 20 }, { "mb", 1ull << 20 }, { "mib", 1ull << 20 },
                { "g", 1ull << 30 }, { "gb", 1ull << 30 }, { "gib", 1ull << 30 },
                { "t", 1ull << 40 }, { "tb", 1ull << 40 }, { "tib", 1ull << 40 },
        };
        uint64_t v, frac;
        if (!s)
                return -EINVAL;
        const char *p = parse_decimal(s, &v, &frac);
        if (!p)
                return -EINVAL;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
                if (strcasecmp(p, units[i].suffix) == 0) {
                        if (units[i].mul == 1 && frac != 0)
                                return -EINVAL; /* fractional bytes */
                        return scale_checked(v, frac, units[i].mul, ret);
                }
        return -EINVAL;
}

int parse_duration_ms(const char *s, uint64_t *ret) {
        static const struct {
                const char *suffix;
                uint64_t ms;
        } units[] = {
                { "", 1000 }, { "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "min", 60000 }, { "h", 3600000 },
        };
        uint64_t v, frac;
        if (!s)
                return -EINVAL;
        const char *p = parse_decimal(s, &v, &frac);
        if (!p)
                return -EINVAL;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
                if (strcmp(p, units[i].suffix) == 0)
                        return scale_checked(v, frac, units[i].ms, ret);
        return -EINVAL;
}

int parse_u64(const char *s, uint64_t max, uint64_t *ret) {
        uint64_t v, frac;
        if (!s)
                return -EINVAL;
        const char *p = parse_decimal(s, &v, &frac);
        if (!p || *p || frac || strchr(s, '.'))
                return -EINVAL;
        if (v > max)
                return -ERANGE;
        *ret = v;
        return 0;
}

int parse_cpus_millis(const char *s, uint64_t *ret) {
        uint64_t v, frac, r;
        if (!s)
                return -EINVAL;
        const char *p = parse_decimal(s, &v, &frac);
        if (!p || *p)
                return -EINVAL;
        int k = scale_checked(v, frac, 1000, &r);
        if (k < 0)
                return k;
        if (r == 0 || r > 1024 * 1000)
                return -ERANGE;
        *ret = r;
        return 0;
}

const char *format_size(uint64_t v, char *buf, int bufsz) {
        static const char units[] = "BKMGT";
        int u = 0;
        while (u < 4 && v >> (10 * (u + 1)) > 0)
                u++;
        uint64_t unit = 1ull << (10 * u);
        if (u == 0)
                snprintf(buf, (size_t) bufsz, "%llu", (unsigned long long) v);
        else if (v % unit == 0) /* exact: decided in integers, not doubles */
                snprintf(buf, (size_t) bufsz, "%llu%c", (unsigned long long) (v / unit), units[u]);
        else
                snprintf(buf, (size_t) bufsz, "%.1f%c", (double) v / (double) unit, units[u]);
        return buf;
}

void unescape_octal(char *s) {
        char *w = s;

        for (char *r = s; *r;) {
                if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
                    r[3] >= '0' && r[3] <= '7') {
                        *w++ = (char) (((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
                        r += 4;
                } else
                        *w++ = *r++;
        }
        *w = '\0';
}

bool request_id_valid(const char *s) {
        size_t n = 0;
        for (; s && s[n]; n++) {
                char c = s[n];
                if (n >= REQUEST_ID_MAX || !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                             c == '-' || c == '_' || c == '.'))
                        return false;
        }
        return n > 0;
}
