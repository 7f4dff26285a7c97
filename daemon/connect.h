/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Connect protocol's envelope (connectrpc.com/docs/protocol): every
 * message of a streaming RPC is `u8 flags | u32 big-endian length | bytes`.
 * flags 0x01 = compressed (never used: the SDK refuses it), 0x02 = the
 * end-of-stream message, which must come last.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define CONNECT_FLAG_COMPRESSED 0x01
#define CONNECT_FLAG_END 0x02
#define CONNECT_ENVELOPE_HEADER 5

/* A streaming request body holds exactly one uncompressed message envelope
 * (server-streaming RPCs). Returns 0 and points at the JSON, or -EBADMSG with
 * a reason. */
int connect_unwrap_request(const uint8_t *body, size_t len, const uint8_t **ret_msg, size_t *ret_len,
                           const char **ret_reason);

void connect_envelope_header(uint8_t hdr[CONNECT_ENVELOPE_HEADER], uint8_t flags, uint32_t len);

/* The HTTP status a Connect error code maps to (unary errors); 500 for unknown codes. */
unsigned connect_code_http_status(const char *code);
/* The Connect code for a negative errno from the engine. */
const char *connect_code_from_errno(int r);
