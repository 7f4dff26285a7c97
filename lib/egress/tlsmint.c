/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The egress proxy's TLS interception (lib/egress/tlsmint.h): the deployment
 * CA on disk, leaf certificates minted per host, and the upstream client
 * context. Every OpenSSL failure path drains the error queue (why_set()).
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "egress/policy.h"
#include "egress/tlsmint.h"
#include "util/fdutil.h"
#include "util/macro.h"

#define CA_FILE_MAX 65536 /* a PEM key or certificate is a few KiB */
#define CA_DAYS 3652      /* ten years, leap days included */
#define BACKDATE_S 3600   /* notBefore: an hour ago, for sandbox clocks a little behind */
#define CN_MAX 64         /* RFC 5280 ub-common-name: longer names get no CN */

/* ALPN wire form (RFC 7301 §3.1): one length-prefixed name. */
static const unsigned char alpn_http11[] = { 8, 'h', 't', 't', 'p', '/', '1', '.', '1' };

typedef struct tlsmint_entry {
        char host[EGRESS_NAME_MAX + 1]; /* "" when the slot is free */
        SSL_CTX *ctx;
        time_t not_before, not_after; /* the leaf's */
        uint64_t used;                /* m->tick at the last lookup */
} tlsmint_entry;

struct tlsmint {
        EVP_PKEY *ca_key;
        X509 *ca_cert;
        time_t ca_not_after;
        char *ca_pem;
        EVP_PKEY *leaf_key;
        SSL_CTX *client_ctx;
        tlsmint_entry *cache; /* TLSMINT_CACHE_MAX slots */
        uint64_t tick;
};

/* OpenSSL's destructors accept NULL. */
static void EVP_PKEY_freep(EVP_PKEY **p) {
        EVP_PKEY_free(*p);
}
static void X509_freep(X509 **p) {
        X509_free(*p);
}
static void BIO_freep(BIO **p) {
        BIO_free(*p);
}
static void BN_freep(BIGNUM **p) {
        BN_free(*p);
}
static void SSL_CTX_freep(SSL_CTX **p) {
        SSL_CTX_free(*p);
}
static void SSL_freep(SSL **p) {
        SSL_free(*p);
}
static void X509_EXTENSION_freep(X509_EXTENSION **p) {
        X509_EXTENSION_free(*p);
}
static void GENERAL_NAMES_freep(GENERAL_NAMES **p) {
        GENERAL_NAMES_free(*p);
}
static void GENERAL_NAME_freep(GENERAL_NAME **p) {
        GENERAL_NAME_free(*p);
}
static void AUTHORITY_KEYID_freep(AUTHORITY_KEYID **p) {
        AUTHORITY_KEYID_free(*p);
}

/* ---------------------------------------------------------------- errors */

/* Write the reason, with the last OpenSSL reason appended when the queue
 * holds one, and empty the queue: a stale entry would make the proxy's next
 * SSL_get_error() on an unrelated connection answer SSL_ERROR_SSL. */
static int why_set(char *why, size_t whylen, int code, const char *fmt, ...) _printf_(4, 5);
static int why_set(char *why, size_t whylen, int code, const char *fmt, ...) {
        if (why && whylen > 0) {
                va_list ap;
                va_start(ap, fmt);
                int n = vsnprintf(why, whylen, fmt, ap);
                va_end(ap);
                const char *reason = ERR_reason_error_string(ERR_peek_last_error());
                if (reason && n >= 0 && (size_t) n < whylen)
                        snprintf(why + n, whylen - (size_t) n, " (OpenSSL: %s)", reason);
        }
        ERR_clear_error();
        return code;
}

/* Failure without a message (the calls that take no why). */
static int ssl_fail(int code) {
        ERR_clear_error();
        return code;
}

/* --------------------------------------------------------------- helpers */

static int no_passphrase(char *buf, int size, int rwflag, void *u) {
        return -1; /* never prompt on a terminal: an encrypted key is refused */
}

static int time_from_asn1(const ASN1_TIME *t, time_t *ret) {
        struct tm tm;
        if (ASN1_TIME_to_tm(t, &tm) != 1)
                return -EINVAL;
        time_t v = timegm(&tm);
        if (v == (time_t) -1)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* A random positive serial of exactly 127 bits (RFC 5280 §4.1.2.2: at most
 * 20 octets; CA/B Forum: at least 64 random bits). */
static int set_random_serial(X509 *x) {
        unsigned char b[16];
        if (RAND_bytes(b, sizeof b) != 1)
                return -EIO;
        b[0] = (unsigned char) ((b[0] & 0x7f) | 0x40);
        _cleanup_(BN_freep) BIGNUM *bn = BN_bin2bn(b, sizeof b, NULL);
        if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)))
                return -ENOMEM;
        return 0;
}

static int add_ext(X509 *x, X509V3_CTX *v, int nid, const char *value) {
        _cleanup_(X509_EXTENSION_freep) X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, v, nid, value);
        if (!e || X509_add_ext(x, e, -1) != 1)
                return -EIO;
        return 0;
}

static int name_add(X509_NAME *n, const char *field, const char *value) {
        if (X509_NAME_add_entry_by_txt(n, field, MBSTRING_UTF8, (const unsigned char *) value, -1,
                                       -1, 0) != 1)
                return -EIO;
        return 0;
}

/* SHA-256, except for keys that take no separate digest. */
static const EVP_MD *sign_digest(const EVP_PKEY *key) {
        int id = EVP_PKEY_get_id(key);
        return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? NULL : EVP_sha256();
}

/* NUL-terminated PEM text of a certificate, malloc'd. */
static int cert_to_pem(X509 *x, char **ret) {
        _cleanup_(BIO_freep) BIO *b = BIO_new(BIO_s_mem());
        if (!b || PEM_write_bio_X509(b, x) != 1)
                return -ENOMEM;
        char *data;
        long len = BIO_get_mem_data(b, &data);
        if (len <= 0)
                return -EIO;
        char *s = malloc((size_t) len + 1);
        if (!s)
                return -ENOMEM;
        memcpy(s, data, (size_t) len);
        s[len] = 0;
        *ret = s;
        return 0;
}

/* Canonical host text only: one host, one cache entry, one certificate. */
static int host_canonical(const char *host, egress_host *ret) {
        egress_host h;
        if (!host || egress_host_parse(host, &h) < 0 || !streq(h.text, host))
                return -EINVAL;
        *ret = h;
        return 0;
}

/* ------------------------------------------------------------ CA on disk */

typedef struct file_data {
        char *p;
        size_t len;
        bool secret; /* erase before free */
} file_data;

static void file_data_done(file_data *f) {
        if (f->p && f->secret)
                OPENSSL_cleanse(f->p, CA_FILE_MAX + 1);
        free(f->p);
        f->p = NULL;
}

/* 1 when name exists under dfd (a dangling symlink counts: loading refuses
 * it), 0 when it does not. */
static int ca_file_exists(int dfd, const char *dir, const char *name, char *why, size_t whylen) {
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
                return 1;
        if (errno == ENOENT)
                return 0;
        int r = negative_errno();
        return why_set(why, whylen, r, "%s/%s: %s", dir, name, strerror(-r));
}

/* Read a CA file: a regular file, not through a symlink; for the key, owned
 * by us and closed to group and others. */
static int ca_file_read(int dfd, const char *dir, const char *name, bool secret, file_data *ret,
                        char *why, size_t whylen) {
        /* O_NONBLOCK: a FIFO planted here must not stall the daemon's start */
        _cleanup_close_ int fd = openat(dfd, name,
                                        O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
                int r = negative_errno();
                if (r == -ELOOP)
                        return why_set(why, whylen, r, "%s/%s is a symlink: refused", dir, name);
                return why_set(why, whylen, r, "opening %s/%s: %s", dir, name, strerror(-r));
        }
        struct stat st;
        if (fstat(fd, &st) < 0) {
                int r = negative_errno();
                return why_set(why, whylen, r, "%s/%s: %s", dir, name, strerror(-r));
        }
        if (!S_ISREG(st.st_mode))
                return why_set(why, whylen, -EINVAL, "%s/%s is not a regular file", dir, name);
        if (secret && st.st_uid != geteuid())
                return why_set(why, whylen, -EPERM, "%s/%s is owned by uid %u, not %u: refused",
                               dir, name, (unsigned) st.st_uid, (unsigned) geteuid());
        if (secret && (st.st_mode & 0077))
                return why_set(why, whylen, -EPERM,
                               "%s/%s has mode %04o: group or others may have read the CA key; "
                               "refused (it must be 0600)",
                               dir, name, (unsigned) (st.st_mode & 07777));

        file_data f = { .secret = secret };
        f.p = malloc(CA_FILE_MAX + 1);
        if (!f.p)
                return why_set(why, whylen, -ENOMEM, "reading %s/%s: out of memory", dir, name);
        ssize_t n = fd_read_full(fd, f.p, CA_FILE_MAX + 1);
        if (n < 0) {
                file_data_done(&f);
                return why_set(why, whylen, (int) n, "reading %s/%s: %s", dir, name,
                               strerror((int) -n));
        }
        if (n > CA_FILE_MAX) {
                file_data_done(&f);
                return why_set(why, whylen, -EINVAL, "%s/%s is larger than %d bytes", dir, name,
                               CA_FILE_MAX);
        }
        f.p[n] = 0;
        f.len = (size_t) n;
        *ret = f;
        return 0;
}

static int ca_load(tlsmint *m, int dfd, const char *dir, char *why, size_t whylen) {
        _cleanup_(file_data_done) file_data kf = {}, cf = {};
        int r = ca_file_read(dfd, dir, TLSMINT_CA_KEY_FILE, true, &kf, why, whylen);
        if (r < 0)
                return r;
        r = ca_file_read(dfd, dir, TLSMINT_CA_CERT_FILE, false, &cf, why, whylen);
        if (r < 0)
                return r;

        _cleanup_(EVP_PKEY_freep) EVP_PKEY *key = NULL;
        {
                _cleanup_(BIO_freep) BIO *b = BIO_new_mem_buf(kf.p, (int) kf.len);
                if (!b)
                        return why_set(why, whylen, -ENOMEM, "out of memory");
                key = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
                if (!key)
                        return why_set(why, whylen, -EINVAL,
                                       "%s/" TLSMINT_CA_KEY_FILE
                                       ": not an unencrypted PEM private key",
                                       dir);
        }
        _cleanup_(X509_freep) X509 *cert = NULL;
        {
                _cleanup_(BIO_freep) BIO *b = BIO_new_mem_buf(cf.p, (int) cf.len);
                if (!b)
                        return why_set(why, whylen, -ENOMEM, "out of memory");
                cert = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
                if (!cert)
                        return why_set(why, whylen, -EINVAL,
                                       "%s/" TLSMINT_CA_CERT_FILE ": not a PEM certificate", dir);
        }
        if (X509_check_ca(cert) == 0)
                return why_set(why, whylen, -EINVAL,
                               "%s/" TLSMINT_CA_CERT_FILE
                               ": not a CA certificate (basicConstraints CA:TRUE and keyUsage "
                               "keyCertSign)",
                               dir);
        if (X509_check_private_key(cert, key) != 1)
                return why_set(why, whylen, -EINVAL,
                               "%s/" TLSMINT_CA_CERT_FILE
                               " does not belong to the key in " TLSMINT_CA_KEY_FILE,
                               dir);
        if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0)
                return why_set(why, whylen, -EINVAL,
                               "%s/" TLSMINT_CA_CERT_FILE
                               " has expired: remove both CA files to create a new CA",
                               dir);
        time_t not_after;
        if (time_from_asn1(X509_get0_notAfter(cert), &not_after) < 0)
                return why_set(why, whylen, -EINVAL, "%s/" TLSMINT_CA_CERT_FILE ": bad notAfter",
                               dir);
        char *pem;
        r = cert_to_pem(cert, &pem);
        if (r < 0)
                return why_set(why, whylen, r, "encoding the CA certificate");

        m->ca_key = TAKE_PTR(key);
        m->ca_cert = TAKE_PTR(cert);
        m->ca_not_after = not_after;
        m->ca_pem = pem;
        return 0;
}

/* Write data to a new temporary file beside name, with exactly mode, synced.
 * tmp receives its name. */
static int temp_write(int dfd, const char *name, const void *data, size_t len, mode_t mode,
                      char *tmp, size_t tmplen) {
        unsigned char rnd[8];
        if (RAND_bytes(rnd, sizeof rnd) != 1)
                return -EIO;
        uint64_t v;
        memcpy(&v, rnd, sizeof v);
        if ((size_t) snprintf(tmp, tmplen, ".%s.tmp-%016llx", name, (unsigned long long) v) >= tmplen)
                return -ENAMETOOLONG;
        /* O_EXCL: never write through something already there */
        _cleanup_close_ int fd = openat(dfd, tmp,
                                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                return negative_errno();
        int r = fd_write_all(fd, data, len);
        /* exactly mode, whatever the umask */
        if (r >= 0 && fchmod(fd, mode) < 0)
                r = negative_errno();
        if (r >= 0 && fsync(fd) < 0)
                r = negative_errno();
        if (r < 0)
                (void) unlinkat(dfd, tmp, 0);
        return r;
}

/* The PEM texts of a new CA key and its self-signed certificate. */
static int ca_generate(BIO *key_pem, BIO *cert_pem) {
        _cleanup_(EVP_PKEY_freep) EVP_PKEY *key = EVP_EC_gen("P-256");
        _cleanup_(X509_freep) X509 *x = X509_new();
        if (!key || !x)
                return -ENOMEM;
        if (X509_set_version(x, X509_VERSION_3) != 1)
                return -EIO;
        int r = set_random_serial(x);
        if (r < 0)
                return r;
        time_t now = time(NULL);
        if (!X509_time_adj_ex(X509_getm_notBefore(x), 0, -BACKDATE_S, &now) ||
            !X509_time_adj_ex(X509_getm_notAfter(x), CA_DAYS, 0, &now))
                return -EIO;

        unsigned char rnd[4];
        if (RAND_bytes(rnd, sizeof rnd) != 1)
                return -EIO;
        char cn[64];
        snprintf(cn, sizeof cn, "hutch egress CA %02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3]);
        X509_NAME *n = X509_get_subject_name(x);
        if (name_add(n, "O", "hutch") < 0 || name_add(n, "CN", cn) < 0 ||
            X509_set_issuer_name(x, n) != 1 || X509_set_pubkey(x, key) != 1)
                return -EIO;

        X509V3_CTX v;
        X509V3_set_ctx_nodb(&v);
        X509V3_set_ctx(&v, x, x, NULL, NULL, 0);
        /* pathlen:0: this CA signs leaves, never another CA */
        if (add_ext(x, &v, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") < 0 ||
            add_ext(x, &v, NID_key_usage, "critical,keyCertSign,cRLSign") < 0 ||
            add_ext(x, &v, NID_subject_key_identifier, "hash") < 0)
                return -EIO;
        if (X509_sign(x, key, EVP_sha256()) <= 0)
                return -EIO;

        if (PEM_write_bio_PrivateKey(key_pem, key, NULL, NULL, 0, NULL, NULL) != 1 ||
            PEM_write_bio_X509(cert_pem, x) != 1)
                return -ENOMEM;
        return 0;
}

/* Create both CA files. Each is written in full to a temporary file and
 * linked into place: link() never replaces an existing file, so a racing
 * creator makes one of the two fail (-EEXIST) rather than leaving each
 * with a different CA. The key goes first, and a failure to place the
 * certificate takes back the key this call placed. */
static int ca_create(int dfd, const char *dir, char *why, size_t whylen) {
        /* the key's PEM text lives in secure-heap memory, erased when freed */
        _cleanup_(BIO_freep) BIO *key_pem = BIO_new(BIO_s_secmem());
        _cleanup_(BIO_freep) BIO *cert_pem = BIO_new(BIO_s_mem());
        if (!key_pem || !cert_pem)
                return why_set(why, whylen, -ENOMEM, "out of memory");
        int r = ca_generate(key_pem, cert_pem);
        if (r < 0)
                return why_set(why, whylen, r, "creating the egress CA");

        char *key_data, *cert_data;
        long key_len = BIO_get_mem_data(key_pem, &key_data);
        long cert_len = BIO_get_mem_data(cert_pem, &cert_data);
        if (key_len <= 0 || cert_len <= 0)
                return why_set(why, whylen, -EIO, "creating the egress CA");

        char key_tmp[128], cert_tmp[128];
        r = temp_write(dfd, TLSMINT_CA_KEY_FILE, key_data, (size_t) key_len, 0600, key_tmp,
                       sizeof key_tmp);
        if (r < 0)
                return why_set(why, whylen, r, "writing %s/" TLSMINT_CA_KEY_FILE ": %s", dir,
                               strerror(-r));
        r = temp_write(dfd, TLSMINT_CA_CERT_FILE, cert_data, (size_t) cert_len, 0644, cert_tmp,
                       sizeof cert_tmp);
        if (r < 0) {
                (void) unlinkat(dfd, key_tmp, 0);
                return why_set(why, whylen, r, "writing %s/" TLSMINT_CA_CERT_FILE ": %s", dir,
                               strerror(-r));
        }

        const char *failed = TLSMINT_CA_KEY_FILE;
        if (linkat(dfd, key_tmp, dfd, TLSMINT_CA_KEY_FILE, 0) < 0)
                r = negative_errno();
        else if (linkat(dfd, cert_tmp, dfd, TLSMINT_CA_CERT_FILE, 0) < 0) {
                r = negative_errno();
                failed = TLSMINT_CA_CERT_FILE;
                (void) unlinkat(dfd, TLSMINT_CA_KEY_FILE, 0);
        }
        (void) unlinkat(dfd, key_tmp, 0);
        (void) unlinkat(dfd, cert_tmp, 0);
        if (r < 0) {
                if (r == -EEXIST)
                        return why_set(why, whylen, r,
                                       "%s/%s was created by another process at the same time", dir,
                                       failed);
                return why_set(why, whylen, r, "placing %s/%s: %s", dir, failed, strerror(-r));
        }
        /* the new names survive a crash only once the directory is synced */
        if (fsync(dfd) < 0) {
                r = negative_errno();
                return why_set(why, whylen, r, "syncing %s: %s", dir, strerror(-r));
        }
        return 0;
}

/* --------------------------------------------------------------- clients */

static int client_ctx_new(const char *upstream_ca_file, SSL_CTX **ret, char *why, size_t whylen) {
        _cleanup_(SSL_CTX_freep) SSL_CTX *c = SSL_CTX_new(TLS_client_method());
        if (!c)
                return why_set(why, whylen, -ENOMEM, "creating the upstream TLS context");
        if (SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1)
                return why_set(why, whylen, -EIO, "setting the upstream TLS version");
        SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
        SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
        if (SSL_CTX_set_default_verify_paths(c) != 1)
                return why_set(why, whylen, -EIO, "loading the system trust store");
        if (upstream_ca_file) {
                /* open() first, for an errno the operator can act on */
                _cleanup_close_ int fd = open(upstream_ca_file, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
                if (fd < 0) {
                        int r = negative_errno();
                        return why_set(why, whylen, r, "upstream CA file %s: %s", upstream_ca_file,
                                       strerror(-r));
                }
                struct stat st;
                if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                        return why_set(why, whylen, -EINVAL,
                                       "upstream CA file %s is not a regular file", upstream_ca_file);
                if (SSL_CTX_load_verify_file(c, upstream_ca_file) != 1)
                        return why_set(why, whylen, -EINVAL,
                                       "upstream CA file %s: no PEM certificate loaded",
                                       upstream_ca_file);
        }
        /* SSL_CTX_set_alpn_protos() returns 0 on success */
        if (SSL_CTX_set_alpn_protos(c, alpn_http11, sizeof alpn_http11) != 0)
                return why_set(why, whylen, -ENOMEM, "setting the upstream ALPN");
        *ret = TAKE_PTR(c);
        return 0;
}

int tlsmint_client_ssl(tlsmint *m, const char *host, SSL **ret) {
        egress_host h;
        if (!m || !ret || host_canonical(host, &h) < 0)
                return -EINVAL;
        _cleanup_(SSL_freep) SSL *s = SSL_new(m->client_ctx);
        if (!s)
                return ssl_fail(-ENOMEM);
        if (h.kind == EGRESS_HOST_NAME) {
                /* Browsers' rules: names only from subjectAltName, and a
                 * wildcard only as a whole left-most label. */
                SSL_set_hostflags(s,
                                  X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS |
                                          X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
                if (SSL_set_tlsext_host_name(s, h.text) != 1 || SSL_set1_host(s, h.text) != 1)
                        return ssl_fail(-ENOMEM);
        } else if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), h.text) != 1)
                return ssl_fail(-ENOMEM);
        *ret = TAKE_PTR(s);
        return 0;
}

SSL_CTX *tlsmint_client_ctx(tlsmint *m) {
        return m ? m->client_ctx : NULL;
}

/* ------------------------------------------------------------------ mint */

/* RFC 7301 §3.2: select "http/1.1" if offered; otherwise no ALPN answer
 * (SSL_TLSEXT_ERR_NOACK) and the handshake goes on. OpenSSL has checked
 * the list's framing; the loop stays within inlen anyway. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg) {
        for (unsigned i = 0; i < inlen;) {
                unsigned n = in[i];
                if (n == 0 || n > inlen - i - 1)
                        break;
                if (n == alpn_http11[0] && memcmp(in + i + 1, alpn_http11 + 1, n) == 0) {
                        *out = in + i + 1;
                        *outlen = (unsigned char) n;
                        return SSL_TLSEXT_ERR_OK;
                }
                i += 1 + n;
        }
        return SSL_TLSEXT_ERR_NOACK;
}

static int leaf_add_san(X509 *x, const egress_host *h) {
        _cleanup_(GENERAL_NAMES_freep) GENERAL_NAMES *gens = sk_GENERAL_NAME_new_null();
        _cleanup_(GENERAL_NAME_freep) GENERAL_NAME *g = GENERAL_NAME_new();
        if (!gens || !g)
                return -ENOMEM;
        if (h->kind == EGRESS_HOST_NAME) {
                ASN1_IA5STRING *s = ASN1_IA5STRING_new();
                if (!s || ASN1_STRING_set(s, h->text, (int) strlen(h->text)) != 1) {
                        ASN1_IA5STRING_free(s);
                        return -ENOMEM;
                }
                GENERAL_NAME_set0_value(g, GEN_DNS, s);
        } else {
                int len = h->kind == EGRESS_HOST_IPV4 ? 4 : 16;
                ASN1_OCTET_STRING *o = ASN1_OCTET_STRING_new();
                if (!o || ASN1_OCTET_STRING_set(o, h->addr.bytes, len) != 1) {
                        ASN1_OCTET_STRING_free(o);
                        return -ENOMEM;
                }
                GENERAL_NAME_set0_value(g, GEN_IPADD, o);
        }
        if (sk_GENERAL_NAME_push(gens, g) <= 0)
                return -ENOMEM;
        g = NULL; /* owned by gens */
        if (X509_add1_ext_i2d(x, NID_subject_alt_name, gens, 0, X509V3_ADD_DEFAULT) != 1)
                return -EIO;
        return 0;
}

/* The CA's subjectKeyIdentifier as the leaf's authorityKeyIdentifier, which
 * strict verifiers (Python 3.13's VERIFY_X509_STRICT) require. */
static int leaf_add_akid(X509 *x, X509 *ca) {
        const ASN1_OCTET_STRING *skid = X509_get0_subject_key_id(ca);
        if (!skid)
                return 0;
        _cleanup_(AUTHORITY_KEYID_freep) AUTHORITY_KEYID *akid = AUTHORITY_KEYID_new();
        if (!akid || !(akid->keyid = ASN1_OCTET_STRING_dup(skid)))
                return -ENOMEM;
        if (X509_add1_ext_i2d(x, NID_authority_key_identifier, akid, 0, X509V3_ADD_DEFAULT) != 1)
                return -EIO;
        return 0;
}

static int leaf_mint(tlsmint *m, const egress_host *h, time_t now, X509 **ret) {
        _cleanup_(X509_freep) X509 *x = X509_new();
        if (!x)
                return -ENOMEM;
        if (X509_set_version(x, X509_VERSION_3) != 1)
                return -EIO;
        int r = set_random_serial(x);
        if (r < 0)
                return r;
        time_t not_before = now - BACKDATE_S;
        time_t not_after = MIN(now + (time_t) TLSMINT_LEAF_DAYS * 24 * 3600, m->ca_not_after);
        if (!ASN1_TIME_set(X509_getm_notBefore(x), not_before) ||
            !ASN1_TIME_set(X509_getm_notAfter(x), not_after))
                return -EIO;

        X509_NAME *n = X509_get_subject_name(x);
        if (name_add(n, "O", "hutch egress") < 0)
                return -EIO;
        if (strlen(h->text) <= CN_MAX && name_add(n, "CN", h->text) < 0)
                return -EIO;
        if (X509_set_issuer_name(x, X509_get_subject_name(m->ca_cert)) != 1 ||
            X509_set_pubkey(x, m->leaf_key) != 1)
                return -EIO;

        X509V3_CTX v;
        X509V3_set_ctx_nodb(&v);
        X509V3_set_ctx(&v, m->ca_cert, x, NULL, NULL, 0);
        if (add_ext(x, &v, NID_basic_constraints, "critical,CA:FALSE") < 0 ||
            add_ext(x, &v, NID_key_usage, "critical,digitalSignature") < 0 ||
            add_ext(x, &v, NID_ext_key_usage, "serverAuth") < 0 ||
            add_ext(x, &v, NID_subject_key_identifier, "hash") < 0)
                return -EIO;
        r = leaf_add_akid(x, m->ca_cert);
        if (r < 0)
                return r;
        r = leaf_add_san(x, h);
        if (r < 0)
                return r;
        if (X509_sign(x, m->ca_key, sign_digest(m->ca_key)) <= 0)
                return -EIO;
        *ret = TAKE_PTR(x);
        return 0;
}

static int server_ctx_new(tlsmint *m, X509 *leaf, SSL_CTX **ret) {
        _cleanup_(SSL_CTX_freep) SSL_CTX *c = SSL_CTX_new(TLS_server_method());
        if (!c)
                return -ENOMEM;
        if (SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION) != 1)
                return -EIO;
        /* a client's renegotiation requests cost the proxy a handshake each */
        SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
        /* Resumption by tickets only: a server-side session cache would
         * grow with every sandbox connection, per host (20480 by default). */
        SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
        if (SSL_CTX_use_certificate(c, leaf) != 1 || SSL_CTX_use_PrivateKey(c, m->leaf_key) != 1 ||
            SSL_CTX_add1_chain_cert(c, m->ca_cert) != 1 || SSL_CTX_check_private_key(c) != 1)
                return -EIO;
        SSL_CTX_set_alpn_select_cb(c, alpn_select, NULL);
        *ret = TAKE_PTR(c);
        return 0;
}

static tlsmint_entry *cache_find(tlsmint *m, const char *host) {
        for (size_t i = 0; i < TLSMINT_CACHE_MAX; i++)
                if (m->cache[i].ctx && streq(m->cache[i].host, host))
                        return &m->cache[i];
        return NULL;
}

/* A free slot, or the least recently used one. */
static tlsmint_entry *cache_victim(tlsmint *m) {
        tlsmint_entry *best = &m->cache[0];
        for (size_t i = 0; i < TLSMINT_CACHE_MAX; i++) {
                if (!m->cache[i].ctx)
                        return &m->cache[i];
                if (m->cache[i].used < best->used)
                        best = &m->cache[i];
        }
        return best;
}

int tlsmint_server_ctx(tlsmint *m, const char *host, SSL_CTX **ret) {
        egress_host h;
        if (!m || !ret || host_canonical(host, &h) < 0)
                return -EINVAL;
        time_t now = time(NULL);
        if (now >= m->ca_not_after)
                return -EKEYEXPIRED;

        tlsmint_entry *e = cache_find(m, h.text);
        /* renew near the end, and after the clock went back past notBefore */
        if (!e || now < e->not_before || now > e->not_after - TLSMINT_LEAF_RENEW_S) {
                _cleanup_(X509_freep) X509 *leaf = NULL;
                _cleanup_(SSL_CTX_freep) SSL_CTX *c = NULL;
                int r = leaf_mint(m, &h, now, &leaf);
                if (r >= 0)
                        r = server_ctx_new(m, leaf, &c);
                if (r < 0)
                        return ssl_fail(r);
                time_t not_before, not_after;
                if (time_from_asn1(X509_get0_notBefore(leaf), &not_before) < 0 ||
                    time_from_asn1(X509_get0_notAfter(leaf), &not_after) < 0)
                        return ssl_fail(-EIO);
                if (!e) {
                        e = cache_victim(m);
                        memcpy(e->host, h.text, strlen(h.text) + 1);
                }
                SSL_CTX_free(e->ctx); /* holders of a reference keep theirs */
                e->ctx = TAKE_PTR(c);
                e->not_before = not_before;
                e->not_after = not_after;
        }
        e->used = ++m->tick;
        if (SSL_CTX_up_ref(e->ctx) != 1)
                return ssl_fail(-EIO);
        *ret = e->ctx;
        return 0;
}

/* ------------------------------------------------------------- lifetime */

int tlsmint_new(const char *dir, const char *upstream_ca_file, tlsmint **ret, char *why,
                size_t whylen) {
        if (!dir || !ret)
                return why_set(why, whylen, -EINVAL, "no directory for the egress CA");
        _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
                int r = negative_errno();
                return why_set(why, whylen, r, "opening %s: %s", dir, strerror(-r));
        }
        /* the upstream side first: a bad operator file fails before the
         * CA directory is touched */
        _cleanup_(SSL_CTX_freep) SSL_CTX *client_ctx = NULL;
        int r = client_ctx_new(upstream_ca_file, &client_ctx, why, whylen);
        if (r < 0)
                return r;
        int has_key = ca_file_exists(dfd, dir, TLSMINT_CA_KEY_FILE, why, whylen);
        if (has_key < 0)
                return has_key;
        int has_cert = ca_file_exists(dfd, dir, TLSMINT_CA_CERT_FILE, why, whylen);
        if (has_cert < 0)
                return has_cert;
        if (has_key != has_cert) {
                const char *there = has_key ? TLSMINT_CA_KEY_FILE : TLSMINT_CA_CERT_FILE;
                const char *missing = has_key ? TLSMINT_CA_CERT_FILE : TLSMINT_CA_KEY_FILE;
                return why_set(why, whylen, -EINVAL,
                               "%s/%s exists but %s/%s does not: restore it, or remove both to "
                               "create a new egress CA (which every sandbox must then trust)",
                               dir, there, dir, missing);
        }
        if (!has_key) {
                r = ca_create(dfd, dir, why, whylen);
                if (r < 0)
                        return r;
        }

        _cleanup_(tlsmint_freep) tlsmint *m = calloc(1, sizeof *m);
        if (!m)
                return why_set(why, whylen, -ENOMEM, "out of memory");
        m->cache = calloc(TLSMINT_CACHE_MAX, sizeof *m->cache);
        if (!m->cache)
                return why_set(why, whylen, -ENOMEM, "out of memory");
        /* a created CA is read back: one path checks every CA in use */
        r = ca_load(m, dfd, dir, why, whylen);
        if (r < 0)
                return r;
        m->leaf_key = EVP_EC_gen("P-256");
        if (!m->leaf_key)
                return why_set(why, whylen, -EIO, "creating the leaf key");
        m->client_ctx = TAKE_PTR(client_ctx);
        *ret = TAKE_PTR(m);
        return 0;
}

tlsmint *tlsmint_free(tlsmint *m) {
        if (!m)
                return NULL;
        if (m->cache)
                for (size_t i = 0; i < TLSMINT_CACHE_MAX; i++)
                        SSL_CTX_free(m->cache[i].ctx);
        free(m->cache);
        SSL_CTX_free(m->client_ctx);
        EVP_PKEY_free(m->leaf_key);
        EVP_PKEY_free(m->ca_key);
        X509_free(m->ca_cert);
        free(m->ca_pem);
        free(m);
        return NULL;
}

void tlsmint_freep(tlsmint **m) {
        *m = tlsmint_free(*m);
}

const char *tlsmint_ca_pem(const tlsmint *m) {
        return m ? m->ca_pem : NULL;
}
