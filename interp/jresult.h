/* SPDX-License-Identifier: Apache-2.0 */
/*
 * E2B's `result` event (docs/interpreter.md "The wire (port 49999)") from a
 * Jupyter display_data / update_display_data / execute_result content. Pure
 * functions: fuzz/fuzz-interp-jmsg.c feeds them what the kernel sends.
 *
 * Large text values of a MIME bundle may come out of the JSON: the kernel's
 * helper (e2b_startup.py) moves each string of 64 KiB or more into a
 * ZeroMQ buffer after the message's frames and names it in the content's
 * "hutch_buffers" ({mime: buffer index}), so that neither Python's json nor
 * jansson parses it; it is written into the result line here, escaped once.
 * Lines are ASCII (escape_walk says why).
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "jmsg.h"

/* The event for a bundle of inline values only (data: {mime: value}). */
json_t *jresult_event(json_t *data, bool main_result);

/* The event for a message's content as one JSON line (no newline),
 * malloc'ed, its length in *ret_len. Values named in "hutch_buffers" are
 * taken from bufs[]: a name whose index is out of range, or whose buffer is
 * not UTF-8, is left out of the result. NULL when the content has no data
 * object (or out of memory). */
char *jresult_line(json_t *content, const jframe *bufs, size_t n_bufs, bool main_result,
                   size_t *ret_len);

/* The length of p[0..n) as the inside of a JSON string in ASCII (all else
 * as \u escapes), or -1 when it is not UTF-8; and the escaping itself,
 * into out (that many bytes). */
ssize_t json_escaped_len(const unsigned char *p, size_t n);
void json_escape(const unsigned char *p, size_t n, char *out);
