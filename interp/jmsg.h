/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Jupyter messages (messaging protocol 5.3) on the wire: the frames after
 * the "<IDS|MSG>" delimiter, signed with HMAC-SHA256 of the header, parent
 * header, metadata and content. Pure functions: fuzz/fuzz-interp-jmsg.c
 * feeds them the kernel's bytes.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define JMSG_MAX_FRAMES 64

typedef struct jframe {
        const void *data;
        size_t len;
} jframe;

typedef struct jmsg {
        char msg_type[64];
        char msg_id[128];
        char parent_id[128]; /* "" when the parent header is empty */
        char date[64];       /* the header's date, "" when absent */
        json_t *content;     /* an object, owned */
        /* the frames after the content: binary buffers, unsigned (the
         * HMAC covers the four frames before them); the caller's frames */
        const jframe *buffers;
        size_t n_buffers;
} jmsg;

/* Decode the frames of one message (identities first, as a SUB or DEALER
 * socket delivers them). ret->buffers points into frames[]. key may be empty (no signature). Returns 0, or
 * -EBADMSG (no delimiter, too few frames, bad JSON, not objects),
 * -EPERM (a bad signature). */
int jmsg_decode(const char *key, const jframe *frames, size_t n, jmsg *ret);
void jmsg_clear(jmsg *m);

/* Encode a message: writes the five frames after the delimiter (signature,
 * header, parent, metadata, content) as malloc'ed strings into out[] (the
 * caller frees them); the new msg_id goes to ret_msg_id. */
int jmsg_encode(const char *key, const char *session, const char *msg_type, json_t *content,
                char *out[5], size_t out_len[5], char ret_msg_id[64]);

/* Hex HMAC-SHA256 of the parts (65 bytes with the NUL). */
void jmsg_sign(const char *key, const jframe *parts, size_t n, char out[65]);
