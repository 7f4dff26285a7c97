/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "jmsg.h"

#define DELIM "<IDS|MSG>"

void jmsg_sign(const char *key, const jframe *parts, size_t n, char out[65]) {
        unsigned char md[EVP_MAX_MD_SIZE];
        size_t mdlen = 0;
        out[0] = 0;
        EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        EVP_MAC_CTX *h = mac ? EVP_MAC_CTX_new(mac) : NULL;
        OSSL_PARAM params[] = { OSSL_PARAM_construct_utf8_string("digest", (char *) "SHA256", 0),
                                OSSL_PARAM_construct_end() };
        if (h && EVP_MAC_init(h, (const unsigned char *) key, strlen(key), params) == 1) {
                for (size_t i = 0; i < n; i++)
                        EVP_MAC_update(h, parts[i].data, parts[i].len);
                if (EVP_MAC_final(h, md, &mdlen, sizeof md) != 1)
                        mdlen = 0;
        }
        EVP_MAC_CTX_free(h);
        EVP_MAC_free(mac);
        for (size_t i = 0; i < mdlen && i < 32; i++)
                snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void copy_str(json_t *obj, const char *k, char *buf, size_t n) {
        const char *s = json_string_value(json_object_get(obj, k));
        snprintf(buf, n, "%s", s ? s : "");
}

int jmsg_decode(const char *key, const jframe *frames, size_t n, jmsg *ret) {
        size_t d = 0;
        while (d < n &&
               !(frames[d].len == strlen(DELIM) && memcmp(frames[d].data, DELIM, strlen(DELIM)) == 0))
                d++;
        if (d == n || n - d < 6)
                return -EBADMSG;
        const jframe *f = frames + d + 1; /* signature, header, parent, metadata, content */
        if (key && *key) {
                char want[65];
                jmsg_sign(key, f + 1, 4, want);
                if (f[0].len != 64 || CRYPTO_memcmp(f[0].data, want, 64) != 0)
                        return -EPERM;
        }
        json_error_t je;
        json_t *hdr = json_loadb(f[1].data, f[1].len, JSON_REJECT_DUPLICATES, &je);
        json_t *par = json_loadb(f[2].data, f[2].len, 0, &je);
        /* a kernel may print NUL characters: kept, not a reason to drop the message */
        json_t *content = json_loadb(f[4].data, f[4].len, JSON_ALLOW_NUL, &je);
        int r = 0;
        if (!json_is_object(hdr) || !json_is_object(par) || !json_is_object(content)) {
                r = -EBADMSG;
                goto out;
        }
        jmsg m = { 0 };
        copy_str(hdr, "msg_type", m.msg_type, sizeof m.msg_type);
        copy_str(hdr, "msg_id", m.msg_id, sizeof m.msg_id);
        copy_str(hdr, "date", m.date, sizeof m.date);
        copy_str(par, "msg_id", m.parent_id, sizeof m.parent_id);
        if (!m.msg_type[0]) {
                r = -EBADMSG;
                goto out;
        }
        m.content = content;
        content = NULL;
        m.buffers = f + 5;
        m.n_buffers = n - d - 6;
        *ret = m;
out:
        json_decref(hdr);
        json_decref(par);
        json_decref(content);
        return r;
}

void jmsg_clear(jmsg *m) {
        json_decref(m->content);
        m->content = NULL;
}

static void uuid4(char out[37]) {
        unsigned char b[16];
        if (getrandom(b, sizeof b, 0) != (ssize_t) sizeof b)
                abort();
        b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);
        b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);
        snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                 b[13], b[14], b[15]);
}

int jmsg_encode(const char *key, const char *session, const char *msg_type, json_t *content,
                char *out[5], size_t out_len[5], char ret_msg_id[64]) {
        char id[37], date[40];
        uuid4(id);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        snprintf(date, sizeof date, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000);
        json_t *hdr = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "msg_id", id, "session", session,
                                "username", "hutch", "date", date, "msg_type", msg_type, "version",
                                "5.3");
        if (!hdr)
                return -ENOMEM;
        char *h = json_dumps(hdr, JSON_COMPACT), *c = json_dumps(content, JSON_COMPACT);
        json_decref(hdr);
        char *p = strdup("{}"), *md = strdup("{}"), *sig = malloc(65);
        if (!h || !c || !p || !md || !sig) {
                free(h), free(c), free(p), free(md), free(sig);
                return -ENOMEM;
        }
        jframe parts[4] = { { h, strlen(h) }, { p, 2 }, { md, 2 }, { c, strlen(c) } };
        if (key && *key)
                jmsg_sign(key, parts, 4, sig);
        else
                sig[0] = 0;
        out[0] = sig, out[1] = h, out[2] = p, out[3] = md, out[4] = c;
        for (int i = 0; i < 5; i++)
                out_len[i] = strlen(out[i]);
        snprintf(ret_msg_id, 64, "%s", id);
        return 0;
}
