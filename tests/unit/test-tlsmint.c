/* SPDX-License-Identifier: Apache-2.0 */
/* The egress proxy's TLS interception (lib/egress/tlsmint.c) in temporary
 * directories: the CA files and the refusals when loading them, leaves
 * checked with OpenSSL's own verifier, the cache, and real handshakes over
 * socketpairs between a minted server context and an upstream client. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "egress/tlsmint.h"
#include "tap.h"
#include "util/macro.h"

static char base[] = "/tmp/test-tlsmint-XXXXXX";

/* ------------------------------------------------------------- helpers */

static const char *path(const char *dir, const char *name) {
        static char bufs[4][600];
        static int next;
        char *b = bufs[next++ % 4];
        if (name)
                snprintf(b, sizeof bufs[0], "%s/%s/%s", base, dir, name);
        else
                snprintf(b, sizeof bufs[0], "%s/%s", base, dir);
        return b;
}

static const char *new_dir(const char *dir) {
        const char *p = path(dir, NULL);
        if (mkdir(p, 0700) < 0)
                abort();
        return p;
}

static char *read_text(const char *p) {
        FILE *f = fopen(p, "re");
        if (!f)
                return NULL;
        char *s = calloc(1, 65537);
        size_t n = s ? fread(s, 1, 65536, f) : 0;
        fclose(f);
        if (s)
                s[n] = 0;
        return s;
}

static void write_text(const char *p, const char *s, mode_t mode) {
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t) strlen(s) || fchmod(fd, mode) < 0)
                abort();
        close(fd);
}

static void copy_file(const char *from, const char *to, mode_t mode) {
        char *s = read_text(from);
        if (!s)
                abort();
        write_text(to, s, mode);
        free(s);
}

static mode_t lmode(const char *p) {
        struct stat st;
        if (lstat(p, &st) < 0)
                return (mode_t) -1;
        return st.st_mode;
}

/* Entries in dir: the CA files, and no temporary file left behind. */
static int count_entries(const char *dir) {
        DIR *d = opendir(path(dir, NULL));
        if (!d)
                return -1;
        int n = 0;
        for (struct dirent *e; (e = readdir(d));)
                n += !streq(e->d_name, ".") && !streq(e->d_name, "..");
        closedir(d);
        return n;
}

static X509 *cert_from_pem(const char *pem) {
        BIO *b = BIO_new_mem_buf(pem, -1);
        X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        return x;
}

/* Seconds from now to t (negative: in the past). */
static long long secs_from_now(const ASN1_TIME *t) {
        int days = 0, secs = 0;
        if (!ASN1_TIME_diff(&days, &secs, NULL, t))
                return -999999999;
        return (long long) days * 86400 + secs;
}

static bool ext_critical(X509 *x, int nid) {
        int i = X509_get_ext_by_NID(x, nid, -1);
        return i >= 0 && X509_EXTENSION_get_critical(X509_get_ext(x, i)) == 1;
}

static bool name_entry_is(X509_NAME *n, int nid, char *buf, size_t len) {
        return X509_NAME_get_text_by_NID(n, nid, buf, (int) len) > 0;
}

/* Verify leaf against ca alone, as a TLS server certificate for host (a
 * name, or an address when ip), with RFC 5280 strict checks when strict. */
static int verify_leaf(X509 *ca, X509 *leaf, const char *host, bool ip, bool strict) {
        X509_STORE *store = X509_STORE_new();
        X509_STORE_CTX *ctx = X509_STORE_CTX_new();
        int err = -1;
        if (store && ctx && X509_STORE_add_cert(store, ca) == 1 &&
            X509_STORE_CTX_init(ctx, store, leaf, NULL) == 1) {
                X509_VERIFY_PARAM *p = X509_STORE_CTX_get0_param(ctx);
                X509_VERIFY_PARAM_set_purpose(p, X509_PURPOSE_SSL_SERVER);
                if (strict)
                        X509_VERIFY_PARAM_set_flags(p, X509_V_FLAG_X509_STRICT);
                if (ip)
                        X509_VERIFY_PARAM_set1_ip_asc(p, host);
                else
                        X509_VERIFY_PARAM_set1_host(p, host, 0);
                err = X509_verify_cert(ctx) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
        }
        X509_STORE_CTX_free(ctx);
        X509_STORE_free(store);
        ERR_clear_error();
        return err;
}

/* A CA of the test's own making in dir: EC P-256, basicConstraints bc (NULL:
 * none), no subjectKeyIdentifier, valid until now + not_after_s. */
static void make_ca(const char *dir, const char *bc, long not_after_s) {
        EVP_PKEY *key = EVP_EC_gen("P-256");
        X509 *x = X509_new();
        time_t now = time(NULL);
        if (!key || !x || X509_set_version(x, X509_VERSION_3) != 1 ||
            !ASN1_INTEGER_set(X509_get_serialNumber(x), 7) ||
            !X509_time_adj_ex(X509_getm_notBefore(x), 0, -86400 * 30, &now) ||
            !X509_time_adj_ex(X509_getm_notAfter(x), 0, not_after_s, &now))
                abort();
        X509_NAME *n = X509_get_subject_name(x);
        if (X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *) "test CA", -1,
                                       -1, 0) != 1 ||
            X509_set_issuer_name(x, n) != 1 || X509_set_pubkey(x, key) != 1)
                abort();
        if (bc) {
                X509V3_CTX v;
                X509V3_set_ctx_nodb(&v);
                X509V3_set_ctx(&v, x, x, NULL, NULL, 0);
                X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &v, NID_basic_constraints, bc);
                if (!e || X509_add_ext(x, e, -1) != 1)
                        abort();
                X509_EXTENSION_free(e);
        }
        if (X509_sign(x, key, EVP_sha256()) <= 0)
                abort();
        FILE *f = fopen(path(dir, "egress-ca.key"), "we");
        if (!f || PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) != 1)
                abort();
        fclose(f);
        chmod(path(dir, "egress-ca.key"), 0600);
        f = fopen(path(dir, "egress-ca.pem"), "we");
        if (!f || PEM_write_X509(f, x) != 1)
                abort();
        fclose(f);
        X509_free(x);
        EVP_PKEY_free(key);
}

/* tlsmint_new() on dir must fail with code and a reason holding part. */
static void refused(const char *dir, const char *upstream, int code, const char *part,
                    const char *what) {
        char why[512] = "";
        tlsmint *m = (tlsmint *) 0x1;
        int r = tlsmint_new(path(dir, NULL), upstream, &m, why, sizeof why);
        ok(r == code && strstr(why, part) && m == (tlsmint *) 0x1 && ERR_peek_error() == 0,
           "%s refused: %d (want %d) \"%s\"", what, r, code, why);
        ERR_clear_error();
}

/* ------------------------------------------------------------ handshake */

typedef struct hs {
        bool ok;
        long verify;
        char alpn_client[32], alpn_server[32];
        char sni[256]; /* "" when the client sent none */
        int version;
        bool echoed;
} hs;

static void alpn_of(SSL *s, char *buf, size_t len) {
        const unsigned char *p = NULL;
        unsigned n = 0;
        SSL_get0_alpn_selected(s, &p, &n);
        snprintf(buf, len, "%.*s", (int) n, p ? (const char *) p : "");
}

/* Step one side's handshake; false when it failed. */
static bool step(SSL *s, bool *done) {
        if (*done)
                return true;
        int r = SSL_do_handshake(s);
        if (r == 1) {
                *done = true;
                return true;
        }
        int e = SSL_get_error(s, r);
        return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE;
}

/* Both sides in this thread over a non-blocking socketpair. Takes client. */
static hs handshake(SSL_CTX *server_ctx, SSL *client) {
        hs res = { .verify = -1 };
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
                abort();
        SSL *server = SSL_new(server_ctx);
        if (!server || SSL_set_fd(server, sv[0]) != 1 || SSL_set_fd(client, sv[1]) != 1)
                abort();
        SSL_set_accept_state(server);
        SSL_set_connect_state(client);
        bool cdone = false, sdone = false, cgood = true, sgood = true;
        for (int i = 0; i < 200 && cgood && sgood && !(cdone && sdone); i++) {
                cgood = step(client, &cdone);
                sgood = step(server, &sdone);
        }
        res.ok = cdone && sdone;
        res.verify = SSL_get_verify_result(client);
        if (res.ok) {
                alpn_of(client, res.alpn_client, sizeof res.alpn_client);
                alpn_of(server, res.alpn_server, sizeof res.alpn_server);
                const char *sni = SSL_get_servername(server, TLSEXT_NAMETYPE_host_name);
                snprintf(res.sni, sizeof res.sni, "%s", sni ? sni : "");
                res.version = SSL_version(client);
                char buf[8] = "";
                if (SSL_write(client, "ping", 4) == 4) {
                        for (int i = 0; i < 20; i++) {
                                int n = SSL_read(server, buf, sizeof buf);
                                if (n == 4) {
                                        res.echoed = memcmp(buf, "ping", 4) == 0;
                                        break;
                                }
                        }
                }
        }
        SSL_free(server);
        SSL_free(client);
        close(sv[0]);
        close(sv[1]);
        ERR_clear_error();
        return res;
}

static hs handshake_hosts(tlsmint *srv, const char *server_host, tlsmint *cli,
                          const char *client_host) {
        SSL_CTX *sctx = NULL;
        SSL *c = NULL;
        if (tlsmint_server_ctx(srv, server_host, &sctx) < 0 ||
            tlsmint_client_ssl(cli, client_host, &c) < 0)
                abort();
        hs res = handshake(sctx, c);
        SSL_CTX_free(sctx);
        return res;
}

/* ----------------------------------------------------------------- tests */

static tlsmint *test_create(X509 **ret_ca) {
        char why[512] = "";
        tlsmint *m = NULL;
        /* the modes must come out exact whatever the umask */
        mode_t old = umask(0077);
        int r = tlsmint_new(new_dir("a"), NULL, &m, why, sizeof why);
        umask(old);
        ok(r == 0 && m, "create a CA in an empty directory (%d %s)", r, why);
        if (!m)
                exit(tap_done());
        ok(ERR_peek_error() == 0, "no error left in OpenSSL's queue after success");
        mode_t k = lmode(path("a", "egress-ca.key")), c = lmode(path("a", "egress-ca.pem"));
        ok(S_ISREG(k) && (k & 07777) == 0600, "egress-ca.key: regular, 0600 (%o)", k);
        ok(S_ISREG(c) && (c & 07777) == 0644, "egress-ca.pem: regular, 0644 (%o)", c);
        ok(count_entries("a") == 2, "the two files and no temporary file left");

        char *pem = read_text(path("a", "egress-ca.pem"));
        ok(pem && streq(pem, tlsmint_ca_pem(m)), "tlsmint_ca_pem() is the certificate file");
        char *keytext = read_text(path("a", "egress-ca.key"));
        ok(keytext && startswith(keytext, "-----BEGIN PRIVATE KEY-----"),
           "the key is unencrypted PKCS#8 PEM");
        free(keytext);

        X509 *ca = cert_from_pem(tlsmint_ca_pem(m));
        ok(ca != NULL, "the CA PEM parses");
        if (!ca)
                exit(tap_done());
        EVP_PKEY *pub = X509_get0_pubkey(ca);
        char group[64] = "";
        size_t glen = 0;
        ok(pub && EVP_PKEY_get_id(pub) == EVP_PKEY_EC &&
                   EVP_PKEY_get_utf8_string_param(pub, "group", group, sizeof group, &glen) == 1 &&
                   streq(group, "prime256v1"),
           "CA key is EC P-256 (%s)", group);
        ok(X509_get_version(ca) == X509_VERSION_3 && X509_verify(ca, pub) == 1 &&
                   X509_get_signature_nid(ca) == NID_ecdsa_with_SHA256 &&
                   X509_NAME_cmp(X509_get_subject_name(ca), X509_get_issuer_name(ca)) == 0,
           "CA: v3, self-signed, ecdsa-with-SHA256");
        ok(X509_check_ca(ca) == 1 && ext_critical(ca, NID_basic_constraints) &&
                   X509_get_pathlen(ca) == 0,
           "CA: basicConstraints critical CA:TRUE pathlen:0");
        ok(ext_critical(ca, NID_key_usage) &&
                   X509_get_key_usage(ca) == (KU_KEY_CERT_SIGN | KU_CRL_SIGN),
           "CA: keyUsage critical keyCertSign cRLSign");
        ok(X509_get0_subject_key_id(ca) != NULL, "CA: subjectKeyIdentifier");
        char cn[128] = "", o[64] = "";
        bool names = name_entry_is(X509_get_subject_name(ca), NID_commonName, cn, sizeof cn) &&
                name_entry_is(X509_get_subject_name(ca), NID_organizationName, o, sizeof o);
        bool hex = strlen(cn) == 24 && startswith(cn, "hutch egress CA ") &&
                strspn(cn + 16, "0123456789abcdef") == 8;
        ok(names && hex && streq(o, "hutch"), "CA subject O=%s CN=%s", o, cn);
        long long nb = secs_from_now(X509_get0_notBefore(ca));
        long long na = secs_from_now(X509_get0_notAfter(ca));
        ok(nb >= -3700 && nb <= -3500 && na >= 3652LL * 86400 - 100 && na <= 3652LL * 86400,
           "CA valid from an hour ago for ten years (%lld, %lld)", nb, na);
        BIGNUM *serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(ca), NULL);
        ok(serial && BN_num_bits(serial) == 127 && !BN_is_negative(serial),
           "CA serial: random, positive, 127 bits");
        BN_free(serial);

        /* a second load reads the same CA back */
        tlsmint *again = NULL;
        r = tlsmint_new(path("a", NULL), NULL, &again, why, sizeof why);
        ok(r == 0 && again && streq(tlsmint_ca_pem(again), tlsmint_ca_pem(m)),
           "loading again gives the same CA (%d %s)", r, why);
        tlsmint_free(again);
        ok(lmode(path("a", "egress-ca.key")) == k && count_entries("a") == 2,
           "loading changes nothing on disk");
        free(pem);
        *ret_ca = ca;
        return m;
}

static void test_refusals(void) {
        char why[512];

        refused("nonexistent", NULL, -ENOENT, "nonexistent", "a missing directory");

        new_dir("only-cert");
        copy_file(path("a", "egress-ca.pem"), path("only-cert", "egress-ca.pem"), 0644);
        refused("only-cert", NULL, -EINVAL, "egress-ca.key does not", "a certificate without key");
        ok(count_entries("only-cert") == 1, "nothing created beside the lone certificate");

        new_dir("only-key");
        copy_file(path("a", "egress-ca.key"), path("only-key", "egress-ca.key"), 0600);
        refused("only-key", NULL, -EINVAL, "egress-ca.pem does not", "a key without certificate");
        ok(count_entries("only-key") == 1, "nothing created beside the lone key");

        new_dir("symlink");
        copy_file(path("a", "egress-ca.pem"), path("symlink", "egress-ca.pem"), 0644);
        if (symlink(path("a", "egress-ca.key"), path("symlink", "egress-ca.key")) < 0)
                abort();
        refused("symlink", NULL, -ELOOP, "symlink", "a symlinked key");
        unlink(path("symlink", "egress-ca.key"));
        copy_file(path("a", "egress-ca.key"), path("symlink", "egress-ca.key"), 0600);
        unlink(path("symlink", "egress-ca.pem"));
        if (symlink(path("a", "egress-ca.pem"), path("symlink", "egress-ca.pem")) < 0)
                abort();
        refused("symlink", NULL, -ELOOP, "symlink", "a symlinked certificate");
        unlink(path("symlink", "egress-ca.key"));
        if (symlink("/nonexistent/key", path("symlink", "egress-ca.key")) < 0)
                abort();
        refused("symlink", NULL, -ELOOP, "symlink", "a dangling symlink as key (it is not absent)");

        new_dir("mode");
        copy_file(path("a", "egress-ca.pem"), path("mode", "egress-ca.pem"), 0644);
        copy_file(path("a", "egress-ca.key"), path("mode", "egress-ca.key"), 0640);
        refused("mode", NULL, -EPERM, "0640", "a group-readable key");
        chmod(path("mode", "egress-ca.key"), 0604);
        refused("mode", NULL, -EPERM, "0604", "a world-readable key");
        ok((lmode(path("mode", "egress-ca.key")) & 07777) == 0604, "the refused key's mode is kept");
        chmod(path("mode", "egress-ca.key"), 0400);
        tlsmint *m = NULL;
        int r = tlsmint_new(path("mode", NULL), NULL, &m, why, sizeof why);
        ok(r == 0, "a 0400 key is accepted (%d %s)", r, why);
        m = tlsmint_free(m);

        new_dir("dirkey");
        copy_file(path("a", "egress-ca.pem"), path("dirkey", "egress-ca.pem"), 0644);
        mkdir(path("dirkey", "egress-ca.key"), 0700);
        refused("dirkey", NULL, -EINVAL, "not a regular file", "a directory as key");
        rmdir(path("dirkey", "egress-ca.key"));
        if (mkfifo(path("dirkey", "egress-ca.key"), 0600) < 0)
                abort();
        refused("dirkey", NULL, -EINVAL, "not a regular file", "a FIFO as key, without blocking");

        new_dir("garbage");
        copy_file(path("a", "egress-ca.pem"), path("garbage", "egress-ca.pem"), 0644);
        write_text(path("garbage", "egress-ca.key"), "not a key\n", 0600);
        refused("garbage", NULL, -EINVAL, "not an unencrypted PEM private key", "a garbage key");
        copy_file(path("a", "egress-ca.key"), path("garbage", "egress-ca.key"), 0600);
        write_text(path("garbage", "egress-ca.pem"), "-----BEGIN CERTIFICATE-----\nAAAA\n", 0644);
        refused("garbage", NULL, -EINVAL, "not a PEM certificate", "a garbage certificate");

        /* an encrypted key: refused without asking for a passphrase */
        new_dir("encrypted");
        copy_file(path("a", "egress-ca.pem"), path("encrypted", "egress-ca.pem"), 0644);
        {
                BIO *b = BIO_new_file(path("a", "egress-ca.key"), "r");
                EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
                FILE *f = fopen(path("encrypted", "egress-ca.key"), "we");
                if (!k || !f ||
                    PEM_write_PrivateKey(f, k, EVP_aes_256_cbc(), (const unsigned char *) "pw", 2,
                                         NULL, NULL) != 1)
                        abort();
                fclose(f);
                chmod(path("encrypted", "egress-ca.key"), 0600);
                EVP_PKEY_free(k);
                BIO_free(b);
        }
        refused("encrypted", NULL, -EINVAL, "not an unencrypted", "an encrypted key");

        /* a key and a certificate from two different CAs */
        new_dir("other");
        r = tlsmint_new(path("other", NULL), NULL, &m, why, sizeof why);
        m = tlsmint_free(m);
        new_dir("mismatch");
        copy_file(path("a", "egress-ca.key"), path("mismatch", "egress-ca.key"), 0600);
        copy_file(path("other", "egress-ca.pem"), path("mismatch", "egress-ca.pem"), 0644);
        refused("mismatch", NULL, -EINVAL, "does not belong", "a certificate of another key");

        new_dir("notca");
        make_ca("notca", "critical,CA:FALSE", 86400 * 365);
        refused("notca", NULL, -EINVAL, "not a CA", "a certificate that is not a CA");
        new_dir("expired");
        make_ca("expired", "critical,CA:TRUE", -60);
        refused("expired", NULL, -EINVAL, "expired", "an expired CA");

        new_dir("upstream");
        refused("upstream", path("nonexistent", "ca.pem"), -ENOENT, "nonexistent",
                "a missing upstream CA file");
        ok(count_entries("upstream") == 0, "nothing created when the upstream file fails");
        write_text(path("a", "junk.pem"), "junk\n", 0644);
        refused("upstream", path("a", "junk.pem"), -EINVAL, "no PEM certificate",
                "an upstream CA file without certificates");
        refused("upstream", path("a", NULL), -EINVAL, "not a regular file",
                "a directory as upstream CA file");
}

static void leaf_checks(tlsmint *m, X509 *ca, const char *host, bool ip, const char *wrong) {
        SSL_CTX *ctx = NULL;
        int r = tlsmint_server_ctx(m, host, &ctx);
        ok(r == 0 && ctx && ERR_peek_error() == 0, "mint for %s (%d)", host, r);
        if (!ctx)
                return;
        X509 *leaf = SSL_CTX_get0_certificate(ctx);
        ok(leaf != NULL, "%s: the context holds a leaf", host);
        if (!leaf) {
                SSL_CTX_free(ctx);
                return;
        }
        int v = verify_leaf(ca, leaf, host, ip, true);
        ok(v == X509_V_OK, "%s: chain verifies to the CA, strict, as a TLS server (%s)", host,
           X509_verify_cert_error_string(v));
        v = verify_leaf(ca, leaf, wrong, ip, true);
        ok(v == (ip ? X509_V_ERR_IP_ADDRESS_MISMATCH : X509_V_ERR_HOSTNAME_MISMATCH),
           "%s: verifying as %s fails (%s)", host, wrong, X509_verify_cert_error_string(v));
        if (ip)
                ok(X509_check_ip_asc(leaf, host, 0) == 1 && X509_check_ip_asc(leaf, wrong, 0) == 0,
                   "%s: X509_check_ip_asc matches it and not %s", host, wrong);
        else
                ok(X509_check_host(leaf, host, 0, 0, NULL) == 1 &&
                           X509_check_host(leaf, host, 0, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT,
                                           NULL) == 1 &&
                           X509_check_host(leaf, wrong, 0, 0, NULL) == 0,
                   "%s: X509_check_host matches it (by subjectAltName) and not %s", host, wrong);
        GENERAL_NAMES *san = X509_get_ext_d2i(leaf, NID_subject_alt_name, NULL, NULL);
        ok(san && sk_GENERAL_NAME_num(san) == 1 &&
                   sk_GENERAL_NAME_value(san, 0)->type == (ip ? GEN_IPADD : GEN_DNS),
           "%s: exactly one subjectAltName, %s", host, ip ? "IP" : "DNS");
        GENERAL_NAMES_free(san);
        ok(X509_check_ca(leaf) == 0 && ext_critical(leaf, NID_basic_constraints) &&
                   ext_critical(leaf, NID_key_usage) &&
                   X509_get_key_usage(leaf) == KU_DIGITAL_SIGNATURE &&
                   X509_get_extended_key_usage(leaf) == XKU_SSL_SERVER,
           "%s: CA:FALSE, keyUsage digitalSignature, extendedKeyUsage serverAuth", host);
        const ASN1_OCTET_STRING *akid = X509_get0_authority_key_id(leaf);
        ok(akid && ASN1_OCTET_STRING_cmp(akid, X509_get0_subject_key_id(ca)) == 0,
           "%s: authorityKeyIdentifier is the CA's key id", host);
        long long nb = secs_from_now(X509_get0_notBefore(leaf));
        long long na = secs_from_now(X509_get0_notAfter(leaf));
        ok(nb >= -3700 && nb <= -3500 && na >= 7 * 86400 - 100 && na <= 7 * 86400,
           "%s: valid from an hour ago for 7 days (%lld, %lld)", host, nb, na);
        EVP_PKEY *pub = X509_get0_pubkey(leaf);
        ok(pub && EVP_PKEY_get_id(pub) == EVP_PKEY_EC && EVP_PKEY_get_bits(pub) == 256,
           "%s: EC P-256 leaf key", host);
        STACK_OF(X509) *chain = NULL;
        ok(SSL_CTX_get0_chain_certs(ctx, &chain) == 1 && sk_X509_num(chain) == 1 &&
                   X509_cmp(sk_X509_value(chain, 0), ca) == 0,
           "%s: the CA is sent in the chain", host);

        SSL_CTX *again = NULL;
        r = tlsmint_server_ctx(m, host, &again);
        ok(r == 0 && again == ctx && SSL_CTX_get0_certificate(again) == leaf,
           "%s: cached (the same context and leaf)", host);
        SSL_CTX_free(again);
        SSL_CTX_free(ctx);
}

static void test_mint(tlsmint *m, X509 *ca) {
        leaf_checks(m, ca, "api.example.test", false, "other.example.test");
        leaf_checks(m, ca, "1.2.3.4", true, "1.2.3.5");
        leaf_checks(m, ca, "2001:db8::1", true, "2001:db8::2");

        /* one leaf for a name longer than a CN may be */
        char longname[200];
        memset(longname, 'a', 63);
        snprintf(longname + 63, sizeof longname - 63, ".%s", "bbbbbbbbbbbbbbbb.example.test");
        SSL_CTX *ctx = NULL;
        int r = tlsmint_server_ctx(m, longname, &ctx);
        ok(r == 0 && ctx &&
                   verify_leaf(ca, SSL_CTX_get0_certificate(ctx), longname, false, true) == X509_V_OK,
           "a %zu-byte name (no CN) mints and verifies (%d)", strlen(longname), r);
        SSL_CTX_free(ctx);

        SSL_CTX *a = NULL, *b = NULL;
        tlsmint_server_ctx(m, "api.example.test", &a);
        tlsmint_server_ctx(m, "www.example.test", &b);
        ok(a && b && a != b && X509_cmp(SSL_CTX_get0_certificate(a), SSL_CTX_get0_certificate(b)),
           "two hosts, two contexts and leaves");
        SSL_CTX_free(a);
        SSL_CTX_free(b);

        const char *bad[] = { "API.example.test",
                              "api.example.test.",
                              "[2001:db8::1]",
                              "2001:DB8::1",
                              "2001:db8:0::1",
                              "01.2.3.4",
                              "1.2.3",
                              "*.example.test",
                              "localhost",
                              "",
                              "a b.test",
                              "api.example.test:443" };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                SSL_CTX *c = (SSL_CTX *) 0x1;
                SSL *s = (SSL *) 0x1;
                int r1 = tlsmint_server_ctx(m, bad[i], &c);
                int r2 = tlsmint_client_ssl(m, bad[i], &s);
                ok(r1 == -EINVAL && r2 == -EINVAL && c == (SSL_CTX *) 0x1 && s == (SSL *) 0x1,
                   "host \"%s\" (not canonical) refused (%d %d)", bad[i], r1, r2);
        }
        SSL_CTX *c = NULL;
        ok(tlsmint_server_ctx(m, NULL, &c) == -EINVAL, "a NULL host refused");
}

/* Least recently used goes first, and a held reference outlives the cache. */
static void test_cache(void) {
        char why[512] = "";
        tlsmint *m = NULL;
        new_dir("cache");
        if (tlsmint_new(path("cache", NULL), NULL, &m, why, sizeof why) < 0)
                abort();
        static SSL_CTX *held[TLSMINT_CACHE_MAX];
        char host[64];
        bool all = true;
        for (int i = 0; i < TLSMINT_CACHE_MAX; i++) {
                snprintf(host, sizeof host, "h%d.example.test", i);
                all = all && tlsmint_server_ctx(m, host, &held[i]) == 0;
        }
        ok(all, "%d hosts minted", TLSMINT_CACHE_MAX);
        SSL_CTX *c0 = NULL, *c1 = NULL, *c2 = NULL, *extra = NULL;
        tlsmint_server_ctx(m, "h0.example.test", &c0); /* h0 is now the most recent */
        tlsmint_server_ctx(m, "one-more.example.test", &extra);
        tlsmint_server_ctx(m, "h1.example.test", &c1);
        tlsmint_server_ctx(m, "h2.example.test", &c2);
        ok(c0 == held[0], "a full cache keeps the recently used h0");
        ok(c1 && c1 != held[1], "and dropped h1, the least recently used: minted again");
        /* h1 coming back dropped h2 */
        ok(c2 && c2 != held[2], "h1's return dropped h2, the next least recently used");
        SSL *s = SSL_new(held[1]);
        ok(s && SSL_CTX_get0_certificate(held[1]) != NULL,
           "the dropped context is still usable through the caller's reference");
        SSL_free(s);
        SSL_CTX_free(c0);
        SSL_CTX_free(c1);
        SSL_CTX_free(c2);
        SSL_CTX_free(extra);
        for (int i = 0; i < TLSMINT_CACHE_MAX; i++)
                SSL_CTX_free(held[i]);
        tlsmint_free(m);
}

/* A CA that ends in 12 hours: leaves end with it, and every call, being
 * within a day of the end, mints again. A CA without subjectKeyIdentifier
 * also loads: its leaves then carry no authorityKeyIdentifier. */
static void test_short_ca(void) {
        char why[512] = "";
        tlsmint *m = NULL;
        new_dir("short");
        make_ca("short", "critical,CA:TRUE", 12 * 3600);
        int r = tlsmint_new(path("short", NULL), NULL, &m, why, sizeof why);
        ok(r == 0, "an operator's CA ending in 12 hours loads (%d %s)", r, why);
        if (r < 0)
                return;
        X509 *ca = cert_from_pem(tlsmint_ca_pem(m));
        SSL_CTX *a = NULL, *b = NULL;
        tlsmint_server_ctx(m, "api.example.test", &a);
        tlsmint_server_ctx(m, "api.example.test", &b);
        X509 *leaf = a ? SSL_CTX_get0_certificate(a) : NULL;
        ok(leaf && ASN1_TIME_compare(X509_get0_notAfter(leaf), X509_get0_notAfter(ca)) == 0,
           "the leaf ends when the CA ends");
        ok(a && b && a != b, "a leaf within a day of its end is minted again");
        ok(leaf && X509_get0_authority_key_id(leaf) == NULL &&
                   verify_leaf(ca, leaf, "api.example.test", false, false) == X509_V_OK,
           "a leaf of a CA without key id verifies");
        SSL_CTX_free(a);
        SSL_CTX_free(b);
        X509_free(ca);
        tlsmint_free(m);
}

static void test_handshakes(tlsmint *m) {
        char why[512] = "";
        tlsmint *up = NULL;
        new_dir("client");
        int r = tlsmint_new(path("client", NULL), path("a", "egress-ca.pem"), &up, why, sizeof why);
        ok(r == 0, "a second tlsmint trusting the first CA for upstreams (%d %s)", r, why);
        if (r < 0)
                return;
        ok(tlsmint_client_ctx(up) != NULL, "it has a client context");

        hs h = handshake_hosts(m, "api.example.test", up, "api.example.test");
        ok(h.ok && h.verify == X509_V_OK, "handshake as api.example.test succeeds (verify %s)",
           X509_verify_cert_error_string(h.verify));
        ok(streq(h.sni, "api.example.test"), "the server saw SNI api.example.test (\"%s\")", h.sni);
        ok(streq(h.alpn_client, "http/1.1") && streq(h.alpn_server, "http/1.1"),
           "ALPN negotiated http/1.1 (\"%s\" \"%s\")", h.alpn_client, h.alpn_server);
        ok(h.version >= TLS1_2_VERSION, "TLS 1.2 or later (0x%x)", (unsigned) h.version);
        ok(h.echoed, "application data goes through");

        h = handshake_hosts(m, "api.example.test", up, "other.example.test");
        ok(!h.ok && h.verify == X509_V_ERR_HOSTNAME_MISMATCH,
           "expecting other.example.test fails: %s", X509_verify_cert_error_string(h.verify));

        h = handshake_hosts(m, "1.2.3.4", up, "1.2.3.4");
        ok(h.ok && h.verify == X509_V_OK && streq(h.sni, ""),
           "handshake with 1.2.3.4 succeeds, without SNI (%s, \"%s\")",
           X509_verify_cert_error_string(h.verify), h.sni);
        h = handshake_hosts(m, "1.2.3.4", up, "1.2.3.5");
        ok(!h.ok && h.verify == X509_V_ERR_IP_ADDRESS_MISMATCH, "expecting 1.2.3.5 fails: %s",
           X509_verify_cert_error_string(h.verify));
        h = handshake_hosts(m, "2001:db8::1", up, "2001:db8::1");
        ok(h.ok && h.verify == X509_V_OK, "handshake with 2001:db8::1 succeeds (%s)",
           X509_verify_cert_error_string(h.verify));

        /* the egress CA is never trusted for upstreams: m's own client */
        h = handshake_hosts(m, "api.example.test", m, "api.example.test");
        ok(!h.ok && h.verify != X509_V_OK,
           "a client without the extra CA file refuses the minted leaf: %s",
           X509_verify_cert_error_string(h.verify));

        /* ALPN: h2 only gets no answer; h2 before http/1.1 gets http/1.1 */
        SSL_CTX *sctx = NULL;
        SSL *c = NULL;
        tlsmint_server_ctx(m, "api.example.test", &sctx);
        tlsmint_client_ssl(up, "api.example.test", &c);
        static const unsigned char h2[] = { 2, 'h', '2' };
        SSL_set_alpn_protos(c, h2, sizeof h2);
        h = handshake(sctx, c);
        ok(h.ok && streq(h.alpn_client, "") && streq(h.alpn_server, ""),
           "a client offering only h2 connects with no ALPN (\"%s\")", h.alpn_client);
        tlsmint_client_ssl(up, "api.example.test", &c);
        static const unsigned char both[] = { 2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1' };
        SSL_set_alpn_protos(c, both, sizeof both);
        h = handshake(sctx, c);
        ok(h.ok && streq(h.alpn_server, "http/1.1"),
           "h2,http/1.1 offered: http/1.1 chosen (\"%s\")", h.alpn_server);

        /* TLS 1.1 at most: refused by the server */
        SSL_CTX *old = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_security_level(old, 0);
        SSL_CTX_set_max_proto_version(old, TLS1_1_VERSION);
        SSL_CTX_set_cipher_list(old, "ALL:@SECLEVEL=0");
        c = SSL_new(old);
        h = handshake(sctx, c);
        ok(!h.ok, "a TLS 1.1 client is refused");
        SSL_CTX_free(old);
        SSL_CTX_free(sctx);
        ok(ERR_peek_error() == 0, "OpenSSL's queue is clean");
        tlsmint_free(up);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
        return remove(p) < 0 ? -1 : 0;
}

int main(void) {
        if (!mkdtemp(base)) {
                printf("1..0 # SKIP mkdtemp: %s\n", strerror(errno));
                return 77;
        }
        X509 *ca = NULL;
        tlsmint *m = test_create(&ca);
        test_refusals();
        test_mint(m, ca);
        test_cache();
        test_short_ca();
        test_handshakes(m);
        ok(tlsmint_free(NULL) == NULL && tlsmint_ca_pem(NULL) == NULL &&
                   tlsmint_client_ctx(NULL) == NULL,
           "NULL handles are accepted");
        X509_free(ca);
        tlsmint_free(m);
        nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        return tap_done();
}
