/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "tap.h"
#include "util/parse.h"

static void size_is(const char *s, int want_r, uint64_t want) {
        uint64_t v = 0xdead;
        int r = parse_size(s, &v);
        if (want_r == 0)
                ok(r == 0 && v == want, "parse_size(\"%s\") = %llu (got r=%d v=%llu)", s, (unsigned long long) want, r,
                   (unsigned long long) v);
        else
                ok(r == want_r && v == 0xdead, "parse_size(\"%s\") fails with %d and leaves the output (got %d)", s,
                   want_r, r);
}

static void dur_is(const char *s, int want_r, uint64_t want) {
        uint64_t v = 0xdead;
        int r = parse_duration_ms(s, &v);
        if (want_r == 0)
                ok(r == 0 && v == want, "parse_duration_ms(\"%s\") = %llu (got r=%d v=%llu)", s, (unsigned long long) want,
                   r, (unsigned long long) v);
        else
                ok(r == want_r && v == 0xdead, "parse_duration_ms(\"%s\") fails with %d (got %d)", s, want_r, r);
}

int main(void) {
        size_is("0", 0, 0);
        size_is("4096", 0, 4096);
        size_is("1k", 0, 1024);
        size_is("1K", 0, 1024);
        size_is("64KiB", 0, 65536);
        size_is("512M", 0, 512ull << 20);
        size_is("512mb", 0, 512ull << 20);
        size_is("1G", 0, 1ull << 30);
        size_is("1.5G", 0, 3ull << 29);
        size_is("2T", 0, 2ull << 40);
        size_is("", -EINVAL, 0);
        size_is("abc", -EINVAL, 0);
        size_is("-1M", -EINVAL, 0);
        size_is("1X", -EINVAL, 0);
        size_is("1 M", -EINVAL, 0);
        size_is("1.5", -EINVAL, 0);
        size_is("1.", -EINVAL, 0);
        size_is(" 1M", -EINVAL, 0);
        size_is("99999999999999999999", -EINVAL, 0);
        size_is("17179869184G", -ERANGE, 0);
        size_is("18446744073709551615", 0, UINT64_MAX);

        dur_is("30", 0, 30000);
        dur_is("500ms", 0, 500);
        dur_is("10s", 0, 10000);
        dur_is("1.5s", 0, 1500);
        dur_is("2m", 0, 120000);
        dur_is("1h", 0, 3600000);
        dur_is("", -EINVAL, 0);
        dur_is("xyz", -EINVAL, 0);
        dur_is("10 s", -EINVAL, 0);
        dur_is("-5s", -EINVAL, 0);
        dur_is("5d", -EINVAL, 0);

        uint64_t v;
        ok(parse_u64("512", 1000, &v) == 0 && v == 512, "parse_u64 plain");
        ok(parse_u64("1001", 1000, &v) == -ERANGE, "parse_u64 above max");
        ok(parse_u64("1.0", 1000, &v) == -EINVAL, "parse_u64 refuses fractions");
        ok(parse_u64("+5", 1000, &v) == -EINVAL, "parse_u64 refuses a sign");
        ok(parse_u64("5x", 1000, &v) == -EINVAL, "parse_u64 refuses junk");
        ok(parse_cpus_millis("2", &v) == 0 && v == 2000, "cpus 2 = 2000 millis");
        ok(parse_cpus_millis("0.5", &v) == 0 && v == 500, "cpus 0.5 = 500 millis");
        ok(parse_cpus_millis("0", &v) == -ERANGE, "cpus 0 refused");
        ok(parse_cpus_millis("0.0001", &v) == -ERANGE, "cpus below a millicpu refused");
        ok(parse_cpus_millis("x", &v) == -EINVAL, "cpus junk refused");

        char buf[32];
        ok(strcmp(format_size(512ull << 20, buf, sizeof buf), "512M") == 0, "format_size 512M (%s)", buf);
        ok(strcmp(format_size(1536ull << 20, buf, sizeof buf), "1.5G") == 0, "format_size 1.5G (%s)", buf);
        ok(strcmp(format_size(100, buf, sizeof buf), "100") == 0, "format_size 100 (%s)", buf);
        return tap_done();
}
