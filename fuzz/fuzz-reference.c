/* SPDX-License-Identifier: Apache-2.0 */
/* Image references (a user's or an API client's bytes) and registries.conf
 * texts. The first byte chooses: even, a reference; odd, a conf. Invariants:
 * a parsed reference has a repository and a tag or a digest, formats back
 * to a string that parses to the same parts, and its candidates list is
 * non-empty; a failed parse leaves the result untouched. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/reference.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same(const char *a, const char *b) {
        return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 4096)
                return 0;
        const char *body = (const char *) data + 1;
        size_t n = size - 1;
        hutch_error err = { 0 };
        if (data[0] & 1) {
                registries_conf c = { 0 };
                if (registries_conf_parse(body, n, &c, &err) == 0) {
                        if (c.n_search == 0)
                                abort();
                        image_reference r = { 0 };
                        if (image_reference_parse("python:3.12", &r, NULL) == 0) {
                                image_candidate *v = NULL;
                                size_t k = 0;
                                if (image_reference_candidates(&r, &c, &v, &k, NULL) == 0 &&
                                    k < c.n_search)
                                        abort();
                                image_candidates_free(v, k);
                        }
                        image_reference_clear(&r);
                        registries_conf_clear(&c);
                } else if (c.n_search || c.n_mirror)
                        abort();
                return 0;
        }
        char *s = malloc(n + 1);
        if (!s)
                return 0;
        memcpy(s, body, n);
        s[n] = '\0';
        image_reference r = { 0 };
        int k = image_reference_parse(s, &r, &err);
        if (k == 0) {
                if (!r.repository || (!r.tag && !r.digest))
                        abort();
                char *f = image_reference_format(r.registry ? r.registry : "docker.io",
                                                 r.repository, r.tag, r.digest);
                image_reference r2 = { 0 };
                if (!f || image_reference_parse(f, &r2, NULL) != 0 ||
                    !same(r2.repository, r.repository) || !same(r2.tag, r.tag) ||
                    !same(r2.digest, r.digest))
                        abort();
                char *name = NULL;
                if (image_reference_template_name(&r, &name) != 0 || strlen(name) > 63)
                        abort();
                free(name);
                free(f);
                image_reference_clear(&r2);
                image_reference_clear(&r);
        } else if (k != -EINVAL || r.repository || r.registry || r.tag || r.digest)
                abort();
        free(s);
        return 0;
}
