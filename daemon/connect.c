/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>

#include "daemon/connect.h"

int connect_unwrap_request(const uint8_t *body, size_t len, const uint8_t **ret_msg, size_t *ret_len,
                           const char **ret_reason) {
        const char *why;
        if (len < CONNECT_ENVELOPE_HEADER) {
                why = "request body is shorter than a Connect envelope";
                goto bad;
        }
        uint8_t flags = body[0];
        uint32_t n = (uint32_t) body[1] << 24 | (uint32_t) body[2] << 16 | (uint32_t) body[3] << 8 | body[4];
        if (flags & CONNECT_FLAG_COMPRESSED) {
                why = "compressed Connect messages are not supported";
                goto bad;
        }
        if (flags != 0) {
                why = "unexpected Connect envelope flags in a request";
                goto bad;
        }
        if ((size_t) n != len - CONNECT_ENVELOPE_HEADER) {
                why = n > len - CONNECT_ENVELOPE_HEADER ? "Connect envelope is truncated"
                                                        : "trailing bytes after the Connect message";
                goto bad;
        }
        *ret_msg = body + CONNECT_ENVELOPE_HEADER;
        *ret_len = n;
        return 0;
bad:
        if (ret_reason)
                *ret_reason = why;
        return -EBADMSG;
}

void connect_envelope_header(uint8_t hdr[CONNECT_ENVELOPE_HEADER], uint8_t flags, uint32_t len) {
        hdr[0] = flags;
        hdr[1] = (uint8_t) (len >> 24);
        hdr[2] = (uint8_t) (len >> 16);
        hdr[3] = (uint8_t) (len >> 8);
        hdr[4] = (uint8_t) len;
}

static const struct {
        const char *code;
        unsigned status;
} codes[] = {
        { "canceled", 499 },          { "unknown", 500 },         { "invalid_argument", 400 },
        { "deadline_exceeded", 504 }, { "not_found", 404 },       { "already_exists", 409 },
        { "permission_denied", 403 }, { "resource_exhausted", 429 }, { "failed_precondition", 400 },
        { "aborted", 409 },           { "out_of_range", 400 },    { "unimplemented", 501 },
        { "internal", 500 },          { "unavailable", 503 },     { "data_loss", 500 },
        { "unauthenticated", 401 },
};

unsigned connect_code_http_status(const char *code) {
        for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
                if (strcmp(codes[i].code, code) == 0)
                        return codes[i].status;
        return 500;
}

const char *connect_code_from_errno(int r) {
        switch (-r) {
        case ENOENT:
        case ESRCH:
                return "not_found";
        case EEXIST:
                return "already_exists";
        case EINVAL:
        case ENOTDIR:
        case EISDIR:
        case ENAMETOOLONG:
        case ELOOP:
        case ENOTEMPTY:
        case E2BIG: /* a command line past the kernel's bounds */
                return "invalid_argument";
        case EACCES:
        case EPERM:
        case EROFS:
                return "permission_denied";
        case ENOSPC:
        case EDQUOT:
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case EAGAIN:
                return "resource_exhausted";
        case ETIMEDOUT:
                return "deadline_exceeded";
        case ECONNRESET:
        case ENOTCONN:
        case EPIPE:
                return "unavailable";
        default:
                return "internal";
        }
}
