/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Codec for the host <-> hutch-init protocol (see initproto.h for the wire
 * format). Built twice: into libhutch (glibc) and into hutch-init (musl,
 * static), so it uses nothing but the C library.
 *
 * Both sides treat the other's bytes as hostile: every length is checked
 * against what is left before it is used, with comparisons written so that
 * they cannot overflow (`len > end - p`, never `p + len > end`). Integers are
 * assembled from single bytes, so neither alignment nor host byte order
 * matters.
 */
#include "sandbox/initproto.h"

#include <errno.h>
#include <string.h>

static void put_le16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t) v;
        p[1] = (uint8_t) (v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v) {
        for (size_t i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v) {
        for (size_t i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint16_t get_le16(const uint8_t *p) {
        return (uint16_t) (p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p) {
        uint64_t v = 0;
        for (size_t i = 0; i < 8; i++)
                v |= (uint64_t) p[i] << (8 * i);
        return v;
}

/* ------------------------------------------------------------- encoding */

void initproto_begin(initproto_writer *w, uint16_t type, uint16_t flags, uint32_t id) {
        put_le32(w->buf, INITPROTO_MAGIC);
        put_le16(w->buf + 4, type);
        put_le16(w->buf + 6, flags);
        put_le32(w->buf + 8, id);
        put_le32(w->buf + 12, 0);
        w->len = INITPROTO_HEADER_SIZE;
        w->overflow = false;
}

/* Reserve room for one field and write its header; NULL when it does not
 * fit, which poisons the whole frame: a frame with a silently missing field
 * (a dropped argv entry, say) would be worse than no frame at all. */
static uint8_t *put_field(initproto_writer *w, uint16_t tag, size_t len) {
        if (w->overflow)
                return NULL;
        if (w->len > sizeof(w->buf) || sizeof(w->buf) - w->len < INITPROTO_FIELD_HEADER_SIZE ||
            len > sizeof(w->buf) - w->len - INITPROTO_FIELD_HEADER_SIZE) {
                w->overflow = true;
                return NULL;
        }
        uint8_t *p = w->buf + w->len;
        put_le16(p, tag);
        put_le32(p + 2, (uint32_t) len);
        w->len += INITPROTO_FIELD_HEADER_SIZE + len;
        return p + INITPROTO_FIELD_HEADER_SIZE;
}

void initproto_put_u64(initproto_writer *w, uint16_t tag, uint64_t v) {
        uint8_t *p = put_field(w, tag, 8);
        if (p)
                put_le64(p, v);
}

void initproto_put_bytes(initproto_writer *w, uint16_t tag, const void *data, size_t len) {
        uint8_t *p = put_field(w, tag, len);
        if (p && len > 0)
                memcpy(p, data, len);
}

void initproto_put_str(initproto_writer *w, uint16_t tag, const char *s) {
        if (!s)
                return;
        size_t len = strlen(s);
        /* The decoder refuses longer strings; better to fail here, at the
         * sender, than to emit a frame the peer must reject. */
        if (len > INITPROTO_MAX_STRING) {
                w->overflow = true;
                return;
        }
        initproto_put_bytes(w, tag, s, len);
}

int initproto_finish(initproto_writer *w) {
        if (w->overflow || w->len < INITPROTO_HEADER_SIZE || w->len > INITPROTO_MAX_FRAME)
                return -EMSGSIZE;
        put_le32(w->buf + 12, (uint32_t) (w->len - INITPROTO_HEADER_SIZE));
        return (int) w->len;
}

/* ------------------------------------------------------------- decoding */

/* Check that [p, end) is a sequence of whole fields. */
static int validate_fields(const uint8_t *p, const uint8_t *end) {
        initproto_iter it = { .p = p, .end = end };
        initproto_field f;
        int r;

        while ((r = initproto_next(&it, &f)) > 0)
                ;
        return r;
}

int initproto_parse(const void *frame, size_t len, initproto_msg *ret) {
        const uint8_t *b = frame;

        if (!frame || len < INITPROTO_HEADER_SIZE)
                return -EBADMSG;
        if (get_le32(b) != INITPROTO_MAGIC)
                return -EPROTO;

        uint32_t payload_len = get_le32(b + 12);
        if (payload_len > INITPROTO_MAX_PAYLOAD || len - INITPROTO_HEADER_SIZE != payload_len)
                return -EBADMSG;

        const uint8_t *payload = b + INITPROTO_HEADER_SIZE;
        int r = validate_fields(payload, payload + payload_len);
        if (r < 0)
                return r;

        *ret = (initproto_msg) {
                .type = get_le16(b + 4),
                .flags = get_le16(b + 6),
                .id = get_le32(b + 8),
                .payload = payload,
                .payload_len = payload_len,
        };
        return 0;
}

void initproto_iter_init(initproto_iter *it, const initproto_msg *m) {
        it->p = m->payload;
        it->end = m->payload + m->payload_len;
}

int initproto_next(initproto_iter *it, initproto_field *ret) {
        if (it->p == it->end)
                return 0;
        /* A malformed field leaves the iterator where it is, so that every
         * later call reports the same error instead of reading past it. */
        if (it->p > it->end || (size_t) (it->end - it->p) < INITPROTO_FIELD_HEADER_SIZE)
                return -EBADMSG;

        uint32_t len = get_le32(it->p + 2);
        size_t left = (size_t) (it->end - it->p) - INITPROTO_FIELD_HEADER_SIZE;
        if (len > left)
                return -EBADMSG;

        *ret = (initproto_field) {
                .tag = get_le16(it->p),
                .len = len,
                .value = it->p + INITPROTO_FIELD_HEADER_SIZE,
        };
        it->p += INITPROTO_FIELD_HEADER_SIZE + len;
        return 1;
}

int initproto_field_u64(const initproto_field *f, uint64_t *ret) {
        if (f->len != 8)
                return -EBADMSG;
        *ret = get_le64(f->value);
        return 0;
}

int initproto_field_str(const initproto_field *f, char *buf, size_t bufsz) {
        if (f->len > INITPROTO_MAX_STRING || memchr(f->value, 0, f->len))
                return -EBADMSG;
        /* A well-formed string that is merely longer than the caller's
         * buffer is a different failure from a malformed one. */
        if (bufsz <= f->len)
                return -ENAMETOOLONG;
        if (f->len > 0)
                memcpy(buf, f->value, f->len);
        buf[f->len] = '\0';
        return 0;
}

int initproto_find(const initproto_msg *m, uint16_t tag, initproto_field *ret) {
        initproto_iter it;
        initproto_field f;
        int r;

        initproto_iter_init(&it, m);
        while ((r = initproto_next(&it, &f)) > 0)
                if (f.tag == tag) {
                        *ret = f;
                        return 1;
                }
        return r;
}

int initproto_find_u64(const initproto_msg *m, uint16_t tag, uint64_t *ret) {
        initproto_field f;
        uint64_t v;
        int r;

        r = initproto_find(m, tag, &f);
        if (r <= 0)
                return r;
        r = initproto_field_u64(&f, &v);
        if (r < 0)
                return r;
        *ret = v;
        return 1;
}

int initproto_find_str(const initproto_msg *m, uint16_t tag, char *buf, size_t bufsz) {
        initproto_field f;
        int r;

        r = initproto_find(m, tag, &f);
        if (r <= 0)
                return r;
        r = initproto_field_str(&f, buf, bufsz);
        if (r < 0)
                return r;
        return 1;
}

const char *initproto_type_name(uint16_t type) {
        switch (type) {
        case INITPROTO_OK:
                return "ok";
        case INITPROTO_ERROR:
                return "error";
        case INITPROTO_HELLO:
                return "hello";
        case INITPROTO_SUBSCRIBE:
                return "subscribe";
        case INITPROTO_SPAWN:
                return "spawn";
        case INITPROTO_SIGNAL:
                return "signal";
        case INITPROTO_RESIZE:
                return "resize";
        case INITPROTO_CLOSE_STDIN:
                return "close-stdin";
        case INITPROTO_ATTACH:
                return "attach";
        case INITPROTO_LIST_PROCS:
                return "list-procs";
        case INITPROTO_SPAWN_PART:
                return "spawn-part";
        case INITPROTO_FS_STAT:
                return "fs-stat";
        case INITPROTO_FS_LIST:
                return "fs-list";
        case INITPROTO_FS_MKDIR:
                return "fs-mkdir";
        case INITPROTO_FS_MOVE:
                return "fs-move";
        case INITPROTO_FS_REMOVE:
                return "fs-remove";
        case INITPROTO_FS_OPEN_READ:
                return "fs-open-read";
        case INITPROTO_FS_WRITE_BEGIN:
                return "fs-write-begin";
        case INITPROTO_FS_WRITE_COMMIT:
                return "fs-write-commit";
        case INITPROTO_FS_WRITE_ABORT:
                return "fs-write-abort";
        case INITPROTO_FS_WATCH_ADD:
                return "fs-watch-add";
        case INITPROTO_FS_WATCH_REMOVE:
                return "fs-watch-remove";
        case INITPROTO_EV_EXIT:
                return "exit";
        case INITPROTO_EV_WATCH:
                return "watch";
        default:
                return "unknown";
        }
}

bool initproto_meta_key_valid(const char *key) {
        size_t n = 0;

        if (!key)
                return false;
        for (; key[n]; n++) {
                if (n >= INITPROTO_META_KEY_MAX)
                        return false;
                unsigned char ch = (unsigned char) key[n];
                if (ch < 0x20 || ch > 0x7e || ch == '/')
                        return false;
        }
        return n > 0;
}
