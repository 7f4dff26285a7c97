/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* A request id: 1 to REQUEST_ID_MAX characters of [A-Za-z0-9._-]. The
 * daemon takes a client's X-Request-Id only in this form, and hutch-init
 * and the host check it again wherever one crosses into the sandbox and
 * back: it ends up in log lines and audit records. */
#define REQUEST_ID_MAX 64
bool request_id_valid(const char *s);

/* "512M", "1G", "1.5GiB", "4096", "64k": powers of 1024. -EINVAL or -ERANGE. */
int parse_size(const char *s, uint64_t *ret);
/* "500ms", "10s", "2m", "1h", "1.5s", "30" (seconds). Result in ms. */
int parse_duration_ms(const char *s, uint64_t *ret);
/* A decimal unsigned integer with no sign, no junk, <= max. */
int parse_u64(const char *s, uint64_t max, uint64_t *ret);
/* "2", "0.5", "1.25": thousandths of a CPU, > 0. */
int parse_cpus_millis(const char *s, uint64_t *ret);
/* Format bytes as e.g. "512M" / "1.5G" into buf. */
const char *format_size(uint64_t v, char *buf, int bufsz);
/* A /proc/self/mounts or mountinfo field, decoded in place: the kernel
 * writes space, tab, newline and backslash as \ooo. */
void unescape_octal(char *s);
