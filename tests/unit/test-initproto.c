/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The init protocol codec: round trips, and every way a hostile peer can
 * shape a frame (truncated, wrong magic, lying lengths, oversized or
 * NUL-carrying strings). Prints TAP.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sandbox/initproto.h"

static unsigned n_tests, n_failed;

static void check(bool ok, const char *what, int line) {
        n_tests++;
        if (ok) {
                printf("ok %u - %s\n", n_tests, what);
                return;
        }
        n_failed++;
        printf("not ok %u - %s\n#   at line %d\n", n_tests, what, line);
}
#define CHECK(expr) check(!!(expr), #expr, __LINE__)

static void put_le16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t) v;
        p[1] = (uint8_t) (v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v) {
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

/* A writer is 60 KiB: keep it off the stack. */
static initproto_writer w;
static uint8_t frame[INITPROTO_MAX_FRAME + 64];

/* Build a frame by hand: header claiming payload_len, then raw payload. */
static size_t raw_frame(uint16_t type, uint32_t payload_len, const void *payload, size_t n) {
        put_le32(frame, INITPROTO_MAGIC);
        put_le16(frame + 4, type);
        put_le16(frame + 6, 0);
        put_le32(frame + 8, 7);
        put_le32(frame + 12, payload_len);
        if (n > 0)
                memcpy(frame + INITPROTO_HEADER_SIZE, payload, n);
        return INITPROTO_HEADER_SIZE + n;
}

/* Payload holding exactly one field with the given value. */
static size_t one_field(uint16_t tag, const void *value, uint32_t len) {
        uint8_t p[INITPROTO_FIELD_HEADER_SIZE + 8192];
        put_le16(p, tag);
        put_le32(p + 2, len);
        memcpy(p + INITPROTO_FIELD_HEADER_SIZE, value, len);
        size_t n = INITPROTO_FIELD_HEADER_SIZE + len;
        return raw_frame(INITPROTO_OK, (uint32_t) n, p, n);
}

static void test_round_trip(void) {
        initproto_msg m;
        initproto_field f;
        initproto_iter it;
        uint64_t v = 0;
        char buf[64];
        int len;

        initproto_begin(&w, INITPROTO_SPAWN, INITPROTO_F_MORE, 0xdeadbeef);
        initproto_put_str(&w, T_ARG, "echo");
        initproto_put_str(&w, T_ARG, "hi");
        initproto_put_str(&w, T_ARG, "");
        initproto_put_u64(&w, T_UID, 1000);
        initproto_put_u64(&w, T_SIZE, UINT64_MAX);
        initproto_put_str(&w, T_TAG, NULL); /* no field */
        len = initproto_finish(&w);
        CHECK(len == INITPROTO_HEADER_SIZE + 3 * 6 + 4 + 2 + 0 + 2 * (6 + 8));

        /* The wire bytes are little-endian whatever the host. */
        CHECK(memcmp(w.buf, "HTI1", 4) == 0);
        CHECK(w.buf[4] == INITPROTO_SPAWN && w.buf[5] == 0);
        CHECK(w.buf[8] == 0xef && w.buf[11] == 0xde);
        CHECK(w.buf[12] == len - INITPROTO_HEADER_SIZE && w.buf[13] == 0);

        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0);
        CHECK(m.type == INITPROTO_SPAWN);
        CHECK(m.flags == INITPROTO_F_MORE);
        CHECK(m.id == 0xdeadbeef);
        CHECK(m.payload_len == (uint32_t) len - INITPROTO_HEADER_SIZE);

        initproto_iter_init(&it, &m);
        CHECK(initproto_next(&it, &f) == 1 && f.tag == T_ARG && f.len == 4);
        CHECK(initproto_field_str(&f, buf, sizeof buf) == 0 && strcmp(buf, "echo") == 0);
        CHECK(initproto_next(&it, &f) == 1 && initproto_field_str(&f, buf, sizeof buf) == 0 &&
              strcmp(buf, "hi") == 0);
        CHECK(initproto_next(&it, &f) == 1 && f.len == 0 &&
              initproto_field_str(&f, buf, sizeof buf) == 0 && buf[0] == '\0');
        CHECK(initproto_next(&it, &f) == 1 && f.tag == T_UID && initproto_field_u64(&f, &v) == 0 &&
              v == 1000);
        CHECK(initproto_next(&it, &f) == 1 && initproto_field_u64(&f, &v) == 0 && v == UINT64_MAX);
        CHECK(initproto_next(&it, &f) == 0);
        CHECK(initproto_next(&it, &f) == 0);

        CHECK(initproto_find_u64(&m, T_UID, &v) == 1 && v == 1000);
        /* A repeated tag: find returns the first occurrence. */
        CHECK(initproto_find_str(&m, T_ARG, buf, sizeof buf) == 1 && strcmp(buf, "echo") == 0);
        /* Absent: 0, and the output is left alone. */
        v = 42;
        strcpy(buf, "untouched");
        CHECK(initproto_find_u64(&m, T_PID, &v) == 0 && v == 42);
        CHECK(initproto_find_str(&m, T_TAG, buf, sizeof buf) == 0 && strcmp(buf, "untouched") == 0);
        /* Wrong accessor for the field's size. */
        CHECK(initproto_find_u64(&m, T_ARG, &v) == -EBADMSG);
        /* A string that is fine but does not fit the caller's buffer. */
        CHECK(initproto_find_str(&m, T_ARG, buf, 4) == -ENAMETOOLONG);
        CHECK(initproto_find_str(&m, T_ARG, buf, 5) == 1 && strcmp(buf, "echo") == 0);
}

static void test_empty_and_binary(void) {
        initproto_msg m;
        initproto_field f;
        const uint8_t bin[] = { 0, 1, 2, 0xff };
        int len;

        initproto_begin(&w, INITPROTO_OK, 0, 0);
        len = initproto_finish(&w);
        CHECK(len == INITPROTO_HEADER_SIZE);
        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0 && m.payload_len == 0);
        CHECK(initproto_find(&m, T_PID, &f) == 0);

        /* put_bytes carries anything; only the string accessor refuses NUL. */
        initproto_begin(&w, INITPROTO_OK, 0, 1);
        initproto_put_bytes(&w, T_MESSAGE, bin, sizeof bin);
        initproto_put_bytes(&w, T_NAME, NULL, 0);
        len = initproto_finish(&w);
        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0);
        CHECK(initproto_find(&m, T_MESSAGE, &f) == 1 && f.len == 4 && memcmp(f.value, bin, 4) == 0);
        char buf[16];
        CHECK(initproto_field_str(&f, buf, sizeof buf) == -EBADMSG);
        CHECK(initproto_find_str(&m, T_NAME, buf, sizeof buf) == 1 && buf[0] == '\0');
}

static void test_truncated(void) {
        initproto_msg m;
        int len;

        initproto_begin(&w, INITPROTO_SPAWN, 0, 3);
        initproto_put_str(&w, T_ARG, "true");
        initproto_put_u64(&w, T_UID, 0);
        len = initproto_finish(&w);

        /* Every proper prefix is refused (header, field header, value). */
        bool all_refused = true;
        for (int i = 0; i < len; i++)
                if (initproto_parse(w.buf, (size_t) i, &m) >= 0)
                        all_refused = false;
        CHECK(all_refused);
        CHECK(initproto_parse(w.buf, 0, &m) == -EBADMSG);
        CHECK(initproto_parse(NULL, 0, &m) == -EBADMSG);
        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0);
        /* Trailing garbage after the declared payload. */
        CHECK(initproto_parse(w.buf, (size_t) len + 1, &m) == -EBADMSG);
}

static void test_bad_magic(void) {
        initproto_msg m;
        size_t n = raw_frame(INITPROTO_OK, 0, NULL, 0);

        CHECK(initproto_parse(frame, n, &m) == 0);
        frame[3] = '2'; /* "HTI2": a future version */
        CHECK(initproto_parse(frame, n, &m) == -EPROTO);
        memcpy(frame, "GET ", 4);
        CHECK(initproto_parse(frame, n, &m) == -EPROTO);
}

static void test_length_mismatch(void) {
        initproto_msg m;
        uint8_t payload[16] = { 0 };
        size_t n;

        /* Header claims more than was received. */
        n = raw_frame(INITPROTO_OK, 10, payload, 6);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
        /* Header claims less than was received. */
        n = raw_frame(INITPROTO_OK, 0, payload, 6);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
        /* Header claims a huge length (would wrap a 32-bit sum). */
        n = raw_frame(INITPROTO_OK, UINT32_MAX, payload, 6);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
        n = raw_frame(INITPROTO_OK, UINT32_MAX - INITPROTO_HEADER_SIZE + 7, payload, 6);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);

        /* Field length runs past the payload. */
        put_le16(payload, T_PID);
        put_le32(payload + 2, 9);
        n = raw_frame(INITPROTO_OK, 14, payload, 14);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
        /* Field length that would overflow pointer arithmetic. */
        put_le32(payload + 2, UINT32_MAX);
        n = raw_frame(INITPROTO_OK, 14, payload, 14);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
        /* A partial field header at the end. */
        put_le32(payload + 2, 0);
        n = raw_frame(INITPROTO_OK, 9, payload, 9);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
        /* Zero-length field then exactly the end. */
        n = raw_frame(INITPROTO_OK, 6, payload, 6);
        CHECK(initproto_parse(frame, n, &m) == 0);
}

static void test_payload_limit(void) {
        static uint8_t big[INITPROTO_MAX_PAYLOAD + 8];
        initproto_msg m;
        size_t n;

        /* One field filling the whole maximum payload parses... */
        memset(big, 'a', sizeof big);
        put_le16(big, T_MESSAGE);
        put_le32(big + 2, INITPROTO_MAX_PAYLOAD - INITPROTO_FIELD_HEADER_SIZE);
        n = raw_frame(INITPROTO_OK, INITPROTO_MAX_PAYLOAD, big, INITPROTO_MAX_PAYLOAD);
        CHECK(initproto_parse(frame, n, &m) == 0);
        /* ...but its string is over INITPROTO_MAX_STRING. */
        initproto_field f;
        static char sbuf[INITPROTO_MAX_PAYLOAD];
        CHECK(initproto_find(&m, T_MESSAGE, &f) == 1);
        CHECK(initproto_field_str(&f, sbuf, sizeof sbuf) == -EBADMSG);
        CHECK(initproto_find_str(&m, T_MESSAGE, sbuf, sizeof sbuf) == -EBADMSG);

        /* One byte more than the maximum payload is refused. */
        put_le32(big + 2, INITPROTO_MAX_PAYLOAD + 1 - INITPROTO_FIELD_HEADER_SIZE);
        n = raw_frame(INITPROTO_OK, INITPROTO_MAX_PAYLOAD + 1, big, INITPROTO_MAX_PAYLOAD + 1);
        CHECK(initproto_parse(frame, n, &m) == -EBADMSG);
}

static void test_strings(void) {
        static char s[INITPROTO_MAX_STRING + 2];
        static char buf[INITPROTO_MAX_STRING + 2];
        initproto_msg m;
        size_t n;

        /* Exactly the maximum is fine, one more is not. */
        memset(s, 'x', INITPROTO_MAX_STRING);
        n = one_field(T_PATH, s, INITPROTO_MAX_STRING);
        CHECK(initproto_parse(frame, n, &m) == 0);
        CHECK(initproto_find_str(&m, T_PATH, buf, sizeof buf) == 1 &&
              strlen(buf) == INITPROTO_MAX_STRING);
        n = one_field(T_PATH, s, INITPROTO_MAX_STRING + 1);
        CHECK(initproto_parse(frame, n, &m) == 0);
        CHECK(initproto_find_str(&m, T_PATH, buf, sizeof buf) == -EBADMSG);

        /* An embedded NUL would let "/tmp/a\0/../etc" mean two things. */
        n = one_field(T_PATH, "/tmp\0/x", 7);
        CHECK(initproto_parse(frame, n, &m) == 0);
        CHECK(initproto_find_str(&m, T_PATH, buf, sizeof buf) == -EBADMSG);
        n = one_field(T_PATH, "/tmp\0", 5);
        CHECK(initproto_parse(frame, n, &m) == 0);
        CHECK(initproto_find_str(&m, T_PATH, buf, sizeof buf) == -EBADMSG);

        /* The writer refuses a string the reader would refuse. */
        memset(s, 'y', sizeof s - 1);
        s[sizeof s - 1] = '\0';
        initproto_begin(&w, INITPROTO_FS_STAT, 0, 1);
        initproto_put_str(&w, T_PATH, s);
        CHECK(w.overflow);
        CHECK(initproto_finish(&w) == -EMSGSIZE);
}

static void test_u64_sizes(void) {
        initproto_msg m;
        initproto_field f;
        uint64_t v = 99;
        const uint8_t nine[9] = { 1, 0, 0, 0, 0, 0, 0, 0, 0 };

        for (uint32_t len = 0; len <= 9; len++) {
                size_t n = one_field(T_PID, nine, len);
                char what[64];
                snprintf(what, sizeof what, "u64 field of %u bytes", len);
                int r = initproto_parse(frame, n, &m) == 0 ? initproto_find(&m, T_PID, &f) : -1;
                int expect = len == 8 ? 0 : -EBADMSG;
                check(r == 1 && initproto_field_u64(&f, &v) == expect &&
                              initproto_find_u64(&m, T_PID, &v) == (len == 8 ? 1 : -EBADMSG),
                      what, __LINE__);
        }
        CHECK(v == 1);
}

static void test_writer_overflow(void) {
        static uint8_t chunk[8192];
        initproto_msg m;
        int len;

        /* Fill the frame to the last byte: still fine. */
        initproto_begin(&w, INITPROTO_OK, 0, 1);
        size_t room = INITPROTO_MAX_PAYLOAD;
        while (room >= INITPROTO_FIELD_HEADER_SIZE + sizeof chunk) {
                initproto_put_bytes(&w, T_MESSAGE, chunk, sizeof chunk);
                room -= INITPROTO_FIELD_HEADER_SIZE + sizeof chunk;
        }
        initproto_put_bytes(&w, T_MESSAGE, chunk, room - INITPROTO_FIELD_HEADER_SIZE);
        CHECK(!w.overflow);
        len = initproto_finish(&w);
        CHECK(len == INITPROTO_MAX_FRAME);
        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0);

        /* One more field of any size (even empty) does not fit. */
        initproto_put_bytes(&w, T_NAME, NULL, 0);
        CHECK(w.overflow);
        CHECK(initproto_finish(&w) == -EMSGSIZE);

        /* Overflow is sticky: a small field after a failed big one does not
         * produce a frame that silently lacks the big one. */
        initproto_begin(&w, INITPROTO_OK, 0, 1);
        initproto_put_bytes(&w, T_MESSAGE, frame, INITPROTO_MAX_PAYLOAD);
        initproto_put_u64(&w, T_PID, 1);
        CHECK(initproto_finish(&w) == -EMSGSIZE);

        /* Absurd lengths do not wrap the bounds check. */
        initproto_begin(&w, INITPROTO_OK, 0, 1);
        initproto_put_bytes(&w, T_MESSAGE, chunk, SIZE_MAX);
        CHECK(initproto_finish(&w) == -EMSGSIZE);
        initproto_begin(&w, INITPROTO_OK, 0, 1);
        initproto_put_bytes(&w, T_MESSAGE, chunk, SIZE_MAX - 3);
        CHECK(initproto_finish(&w) == -EMSGSIZE);

        /* begin() resets the overflow. */
        initproto_begin(&w, INITPROTO_OK, 0, 1);
        CHECK(initproto_finish(&w) == INITPROTO_HEADER_SIZE);
}

static void test_unknown_and_repeated(void) {
        initproto_msg m;
        initproto_iter it;
        initproto_field f;
        uint64_t v;
        char buf[32];
        int len, n_args = 0, n_other = 0, r;

        initproto_begin(&w, INITPROTO_SPAWN, 0, 5);
        initproto_put_u64(&w, 0xfff0, 7); /* unknown tag */
        initproto_put_str(&w, T_ARG, "a");
        initproto_put_bytes(&w, 0xfff1, "\0\0\0", 3); /* unknown, odd size, NULs */
        initproto_put_str(&w, T_ARG, "b");
        initproto_put_u64(&w, T_UID, 5);
        initproto_put_u64(&w, T_UID, 6);
        len = initproto_finish(&w);

        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0);
        initproto_iter_init(&it, &m);
        while ((r = initproto_next(&it, &f)) > 0) {
                if (f.tag == T_ARG)
                        n_args++;
                else if (f.tag != T_UID)
                        n_other++;
        }
        CHECK(r == 0);
        CHECK(n_args == 2 && n_other == 2);
        /* Lookups skip over the unknown fields. */
        CHECK(initproto_find_str(&m, T_ARG, buf, sizeof buf) == 1 && strcmp(buf, "a") == 0);
        CHECK(initproto_find_u64(&m, T_UID, &v) == 1 && v == 5);
        /* An unknown message type parses: rejecting it is the server's job. */
        initproto_begin(&w, 9999, 0, 1);
        len = initproto_finish(&w);
        CHECK(initproto_parse(w.buf, (size_t) len, &m) == 0 && m.type == 9999);
}

static void test_iterator_sticky_error(void) {
        initproto_msg m = { 0 };
        initproto_iter it;
        initproto_field f;
        uint8_t payload[10] = { 0 };

        /* Iterating a payload that parse() would refuse (callers may build
         * an initproto_msg by hand) reports the error, repeatedly. */
        put_le16(payload, T_PID);
        put_le32(payload + 2, 8);
        m.payload = payload;
        m.payload_len = sizeof payload;
        initproto_iter_init(&it, &m);
        CHECK(initproto_next(&it, &f) == -EBADMSG);
        CHECK(initproto_next(&it, &f) == -EBADMSG);
        CHECK(initproto_find(&m, T_ERRNO, &f) == -EBADMSG);
}

static void test_type_names(void) {
        CHECK(strcmp(initproto_type_name(INITPROTO_SPAWN), "spawn") == 0);
        CHECK(strcmp(initproto_type_name(INITPROTO_OK), "ok") == 0);
        CHECK(strcmp(initproto_type_name(INITPROTO_FS_WRITE_COMMIT), "fs-write-commit") == 0);
        CHECK(strcmp(initproto_type_name(INITPROTO_EV_EXIT), "exit") == 0);
        CHECK(strcmp(initproto_type_name(0), "unknown") == 0);
        CHECK(strcmp(initproto_type_name(65535), "unknown") == 0);
}

static void test_meta_keys(void) {
        char key[INITPROTO_META_KEY_MAX + 2];

        CHECK(initproto_meta_key_valid("owner"));
        CHECK(initproto_meta_key_valid("a b.c-d_e:f~"));
        CHECK(!initproto_meta_key_valid(""));
        CHECK(!initproto_meta_key_valid(NULL));
        CHECK(!initproto_meta_key_valid("a/b"));
        CHECK(!initproto_meta_key_valid("tab\there"));
        CHECK(!initproto_meta_key_valid("del\x7f"));
        CHECK(!initproto_meta_key_valid("\xc3\xa9t\xc3\xa9"));
        memset(key, 'k', INITPROTO_META_KEY_MAX);
        key[INITPROTO_META_KEY_MAX] = '\0';
        CHECK(initproto_meta_key_valid(key));
        key[INITPROTO_META_KEY_MAX] = 'k';
        key[INITPROTO_META_KEY_MAX + 1] = '\0';
        CHECK(!initproto_meta_key_valid(key));
        /* the prefix and the longest key make a name the kernel accepts */
        CHECK(strlen(INITPROTO_META_PREFIX) + INITPROTO_META_KEY_MAX == 255);
}

int main(void) {
        test_round_trip();
        test_empty_and_binary();
        test_truncated();
        test_bad_magic();
        test_length_mismatch();
        test_payload_limit();
        test_strings();
        test_u64_sizes();
        test_writer_overflow();
        test_unknown_and_repeated();
        test_iterator_sticky_error();
        test_type_names();
        test_meta_keys();
        printf("1..%u\n", n_tests);
        return n_failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
