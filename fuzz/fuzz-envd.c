/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's decoders of client bytes that are not HTTP itself (MHD owns
 * that): the Connect envelope of streaming requests and the JSON inside it,
 * base64 (stdin, pty input), the Basic-auth user, RFC 3339 times
 * (startedAfter) and path resolution against a home. The first byte picks
 * the decoder; the rest is its input.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/connect.h"
#include "daemon/requests.h"
#include "daemon/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1 || size > 65536)
                return 0;
        uint8_t which = data[0] % 7;
        data++;
        size--;
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = 0;
        switch (which) {
        case 0: {
                const uint8_t *msg;
                size_t len;
                const char *why = NULL;
                if (connect_unwrap_request(data, size, &msg, &len, &why) == 0) {
                        if (len + CONNECT_ENVELOPE_HEADER != size || msg != data + CONNECT_ENVELOPE_HEADER)
                                abort();
                        json_error_t je;
                        json_t *j = json_loadb((const char *) msg, len, JSON_REJECT_DUPLICATES, &je);
                        json_decref(j);
                } else if (!why)
                        abort();
                break;
        }
        case 1: {
                uint8_t *out = malloc(size + 3);
                ssize_t n = base64_decode(s, strlen(s), out);
                if (n >= 0) {
                        /* what decodes re-encodes to at most the input's length plus padding */
                        char *enc = malloc(4 * (((size_t) n + 2) / 3) + 1);
                        size_t el = base64_encode(out, (size_t) n, enc);
                        if (el > strlen(s) + 3)
                                abort();
                        free(enc);
                }
                free(out);
                break;
        }
        case 2: {
                char user[64];
                if (user_from_auth(s, user, sizeof user) == 0 && strlen(user) >= sizeof user)
                        abort();
                break;
        }
        case 3: {
                int64_t ms;
                (void) parse_rfc3339(s, &ms);
                break;
        }
        case 5:
        case 6: {
                json_error_t je;
                json_t *j = json_loadb((const char *) data, size, JSON_REJECT_DUPLICATES, &je);
                char why[256];
                if (which == 5) {
                        create_request cr;
                        if (create_request_parse(j, 300, 86400, &cr, why, sizeof why) == 0 &&
                            (!cr.template_id || cr.timeout_s == 0 || cr.timeout_s > 86400 ||
                             (cr.gpus[0] && hutch_gpu_spec_check(cr.gpus, NULL) < 0)))
                                abort();
                } else {
                        start_request sr;
                        if (start_request_parse(j, &sr, why, sizeof why) == 0 &&
                            (!sr.cmd || !*sr.cmd || sr.rows == 0 || sr.cols == 0 || sr.n_args > REQ_MAX_ARGS))
                                abort();
                }
                json_decref(j);
                break;
        }
        case 4: {
                char *p = path_resolve(s, "/home/user");
                if (p && p[0] != '/' && s[0] != 0)
                        abort();
                free(p);
                break;
        }
        }
        free(s);
        return 0;
}
