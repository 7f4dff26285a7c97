/* SPDX-License-Identifier: Apache-2.0 */
/* WWW-Authenticate header values as a registry (or whoever answers in its
 * place) sends them (lib/image/registry.c). Invariants: only 0 or -EINVAL;
 * a Bearer result has a non-empty realm; the result is untouched on
 * failure; no value holds a control byte (they end up in a URL). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void no_ctl(const char *s) {
        for (; s && *s; s++)
                if ((unsigned char) *s < 0x20 || *s == 0x7f)
                        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        registry_challenge c = { 0 };
        int r = registry_challenge_parse((const char *) data, size, &c);
        if (r == 0) {
                if (c.scheme == REGISTRY_AUTH_BEARER && (!c.realm || !*c.realm))
                        abort();
                if (c.scheme == REGISTRY_AUTH_NONE)
                        abort();
                no_ctl(c.realm);
                no_ctl(c.service);
                no_ctl(c.scope);
                registry_challenge_clear(&c);
        } else if (r != -EINVAL || c.realm || c.scheme != REGISTRY_AUTH_NONE)
                abort();
        return 0;
}
