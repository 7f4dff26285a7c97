/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>

#include "daemon/volpath.h"

bool volume_uuid_parse(const char *s, char out[37]) {
        if (!s || strlen(s) != 36)
                return false;
        for (size_t i = 0; i < 36; i++) {
                char c = s[i];
                if (i == 8 || i == 13 || i == 18 || i == 23) {
                        if (c != '-')
                                return false;
                        out[i] = c;
                        continue;
                }
                if (c >= 'A' && c <= 'F')
                        c = (char) (c - 'A' + 'a');
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
                        return false;
                out[i] = c;
        }
        out[36] = 0;
        return true;
}

int volcontent_route(const char *url, char ret_id[37], int *ret_kind) {
        static const char prefix[] = "/volumecontent/";
        if (strncmp(url, prefix, sizeof prefix - 1) != 0)
                return -ENOENT;
        const char *id = url + sizeof prefix - 1, *slash = strchr(id, '/');
        if (!slash || slash == id)
                return -ENOENT;
        const char *kind = slash + 1;
        if (strcmp(kind, "path") == 0)
                *ret_kind = VOLC_PATH;
        else if (strcmp(kind, "dir") == 0)
                *ret_kind = VOLC_DIR;
        else if (strcmp(kind, "file") == 0)
                *ret_kind = VOLC_FILE;
        else
                return -ENOENT;
        char tmp[64];
        size_t n = (size_t) (slash - id);
        ret_id[0] = 0;
        if (n < sizeof tmp) {
                memcpy(tmp, id, n);
                tmp[n] = 0;
                if (!volume_uuid_parse(tmp, ret_id))
                        ret_id[0] = 0;
        }
        return 0;
}

bool volume_name_valid(const char *s) {
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || n > 128)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-'))
                        return false;
        }
        return true;
}

int volpath_clean(const char *in, char out[VOLPATH_MAX], const char **ret_why) {
        const char *why = NULL;
        size_t n = 0;
        if (!in || !*in)
                why = "path is required";
        else if (in[0] != '/')
                why = "path must be absolute";
        for (const char *p = in; !why && *p;) {
                while (*p == '/')
                        p++;
                if (!*p)
                        break;
                const char *e = strchrnul(p, '/');
                size_t len = (size_t) (e - p);
                for (const char *c = p; c < e; c++)
                        if ((unsigned char) *c < 0x20 || *c == 0x7f)
                                why = "path must not contain control characters";
                if (why)
                        break;
                if (len == 1 && p[0] == '.') {
                        p = e;
                        continue;
                }
                if (len == 2 && p[0] == '.' && p[1] == '.') {
                        why = "path must not contain '..' (it would leave the volume)";
                        break;
                }
                if (len > 255) {
                        why = "a path component is longer than 255 bytes";
                        break;
                }
                if (n + 1 + len >= VOLPATH_MAX) {
                        why = "path is too long";
                        break;
                }
                out[n++] = '/';
                memcpy(out + n, p, len);
                n += len;
                p = e;
        }
        if (why) {
                *ret_why = why;
                return -EINVAL;
        }
        if (n == 0)
                out[n++] = '/';
        out[n] = 0;
        return 0;
}

int volquery_u64(const char *s, uint64_t max, uint64_t *ret) {
        if (!s || !*s)
                return 0;
        uint64_t v = 0;
        for (const char *p = s; *p; p++) {
                if (*p < '0' || *p > '9' || p - s >= 20)
                        return -EINVAL;
                uint64_t d = (uint64_t) (*p - '0');
                if (v > max / 10 || (v == max / 10 && d > max % 10))
                        return -EINVAL;
                v = v * 10 + d;
        }
        *ret = v;
        return 1;
}

int volquery_bool(const char *s, bool *ret) {
        if (!s || !*s)
                return 0;
        if (strcmp(s, "true") == 0 || strcmp(s, "1") == 0)
                *ret = true;
        else if (strcmp(s, "false") == 0 || strcmp(s, "0") == 0)
                *ret = false;
        else
                return -EINVAL;
        return 1;
}
