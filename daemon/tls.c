/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Two certificates on the API's one port, chosen by the ClientHello's SNI:
 * the API's own (tls-cert) and the sandbox domain's (sandbox-tls-cert), so
 * an operator can keep `*.<sandbox-domain>` on its own certificate and key
 * instead of adding that wildcard to the API's. libmicrohttpd terminates
 * TLS with GnuTLS; with a certificate callback it asks tls_pick() for the
 * chain and key during each handshake, after GnuTLS has parsed the SNI.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>

#include "daemon/ingress_http.h"
#include "daemon/server.h"
#include "daemon/tls.h"
#include "util/fdutil.h"

#define TLS_CHAIN_MAX 16

struct tls_pair {
        gnutls_pcert_st pcert[TLS_CHAIN_MAX];
        unsigned n;
        gnutls_privkey_t key;
};

struct tls_certs {
        struct tls_pair pair[2]; /* 0: the API's, 1: the sandbox domain's */
        char domain[256];        /* sandbox-domain without its :PORT */
};

/* GnuTLS's certificate callback carries no pointer of ours; one daemon
 * runs per process, so its certificates are this file's. */
static const struct tls_certs *tls_active;

static void pair_free(struct tls_pair *p) {
        for (unsigned i = 0; i < p->n; i++)
                gnutls_pcert_deinit(&p->pcert[i]);
        p->n = 0;
        if (p->key)
                gnutls_privkey_deinit(p->key);
        p->key = NULL;
}

/* Import a PEM chain and its key, refusing a key that is not the
 * certificate's (GnuTLS checks that when both go into one credential). */
static int pair_load(struct tls_pair *p, const char *what, const char *cert_pem,
                     const char *key_pem, hutch_error *err) {
        gnutls_datum_t cd = { .data = (unsigned char *) cert_pem,
                              .size = (unsigned) strlen(cert_pem) };
        gnutls_datum_t kd = { .data = (unsigned char *) key_pem, .size = (unsigned) strlen(key_pem) };
        gnutls_certificate_credentials_t probe;
        if (gnutls_certificate_allocate_credentials(&probe) < 0)
                return hutch_error_set(err, -ENOMEM, "%s: out of memory", what);
        int g = gnutls_certificate_set_x509_key_mem2(probe, &cd, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
        gnutls_certificate_free_credentials(probe);
        if (g < 0)
                return hutch_error_set(err, -EINVAL,
                                       "%s: %s (is the key the certificate's, both PEM?)", what,
                                       gnutls_strerror(g));
        p->n = TLS_CHAIN_MAX;
        g = gnutls_pcert_list_import_x509_raw(p->pcert, &p->n, &cd, GNUTLS_X509_FMT_PEM, 0);
        if (g < 0) {
                p->n = 0;
                return hutch_error_set(err, -EINVAL, "%s: %s (at most %d certificates in the chain)",
                                       what, gnutls_strerror(g), TLS_CHAIN_MAX);
        }
        if (gnutls_privkey_init(&p->key) < 0)
                return hutch_error_set(err, -ENOMEM, "%s: out of memory", what);
        g = gnutls_privkey_import_x509_raw(p->key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
        if (g < 0)
                return hutch_error_set(err, -EINVAL, "%s: %s", what, gnutls_strerror(g));
        return 0;
}

static int tls_pick(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int n_req_ca_dn,
                    const gnutls_pk_algorithm_t *pk_algos, int n_pk_algos,
                    gnutls_pcert_st **ret_pcert, unsigned *ret_n, gnutls_privkey_t *ret_key) {
        (void) req_ca_dn;
        (void) n_req_ca_dn;
        (void) pk_algos;
        (void) n_pk_algos;
        const struct tls_certs *t = tls_active;
        if (!t)
                return -1;
        const struct tls_pair *p = &t->pair[0];
        char name[256];
        size_t len = sizeof name - 1;
        unsigned type = 0;
        if (gnutls_server_name_get(session, name, &len, &type, 0) == GNUTLS_E_SUCCESS &&
            type == GNUTLS_NAME_DNS && len < sizeof name) {
                name[len] = '\0';
                unsigned port;
                char id[HUTCH_ID_LEN + 1];
                if (ingress_host_parse(name, t->domain, &port, id) == 0)
                        p = &t->pair[1];
        }
        *ret_pcert = (gnutls_pcert_st *) p->pcert;
        *ret_n = p->n;
        *ret_key = p->key;
        return 0;
}

int tls_certs_load(server *srv, hutch_error *err) {
        bool want_cert = !streq(srv->cfg.sandbox_tls_cert, "-"),
             want_key = !streq(srv->cfg.sandbox_tls_key, "-");
        if (want_cert != want_key)
                return hutch_error_set(err, -EINVAL,
                                       "sandbox-tls-cert and sandbox-tls-key go together (one was "
                                       "given without the other)");
        if (!want_cert)
                return 0;
        if (!srv->tls_pem[0])
                return hutch_error_set(err, -EINVAL,
                                       "sandbox-tls-cert needs tls-cert and tls-key: the sandbox "
                                       "domain's certificate is served on the API's HTTPS port");
        if (!srv->cfg.sandbox_domain[0])
                return hutch_error_set(err, -EINVAL,
                                       "sandbox-tls-cert needs sandbox-domain: it is served to "
                                       "clients that name <port>-<id>.<sandbox-domain>");
        _cleanup_free_ char *cert = NULL, *key = NULL;
        int r = read_file_at(AT_FDCWD, srv->cfg.sandbox_tls_cert, 1 << 20, &cert);
        if (r < 0)
                return hutch_error_set(err, r, "sandbox-tls-cert %s: %s", srv->cfg.sandbox_tls_cert,
                                       strerror(-r));
        r = read_file_at(AT_FDCWD, srv->cfg.sandbox_tls_key, 1 << 20, &key);
        if (r < 0)
                return hutch_error_set(err, r, "sandbox-tls-key %s: %s", srv->cfg.sandbox_tls_key,
                                       strerror(-r));
        struct tls_certs *t = calloc(1, sizeof *t);
        if (!t) {
                explicit_bzero(key, strlen(key));
                return hutch_error_set(err, -ENOMEM, "out of memory");
        }
        snprintf(t->domain, sizeof t->domain, "%.*s", (int) strcspn(srv->cfg.sandbox_domain, ":"),
                 srv->cfg.sandbox_domain);
        r = pair_load(&t->pair[0], "tls-cert", srv->tls_pem[0], srv->tls_pem[1], err);
        if (r >= 0)
                r = pair_load(&t->pair[1], "sandbox-tls-cert", cert, key, err);
        explicit_bzero(key, strlen(key));
        srv->tls_certs = t;
        if (r < 0)
                tls_certs_free(srv);
        return r < 0 ? r : 0;
}

void *tls_certs_callback(server *srv) {
        tls_active = srv->tls_certs;
        return srv->tls_certs ? (void *) tls_pick : NULL;
}

void tls_certs_free(server *srv) {
        struct tls_certs *t = srv->tls_certs;
        if (!t)
                return;
        if (tls_active == t)
                tls_active = NULL;
        for (int i = 0; i < 2; i++)
                pair_free(&t->pair[i]);
        free(t);
        srv->tls_certs = NULL;
}

/* Whether the client of conn presented a certificate (chain) that GnuTLS
 * verifies against tls-client-ca, which libmicrohttpd was given as its
 * trust list: signed by it, valid now, and, when it names purposes, one
 * for TLS clients. Why not to why. */
bool tls_client_verified(struct MHD_Connection *conn, char *why, size_t n) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
                conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        gnutls_session_t session = ci ? (gnutls_session_t) ci->tls_session : NULL;
        if (!session) {
                snprintf(why, n, "the connection is not TLS");
                return false;
        }
        unsigned k = 0;
        if (!gnutls_certificate_get_peers(session, &k) || k == 0) {
                snprintf(why, n, "no client certificate was presented");
                return false;
        }
        gnutls_typed_vdata_st purpose = { .type = GNUTLS_DT_KEY_PURPOSE_OID,
                                          .data = (unsigned char *) GNUTLS_KP_TLS_WWW_CLIENT };
        unsigned status = 0;
        int g = gnutls_certificate_verify_peers(session, &purpose, 1, &status);
        if (g < 0) {
                snprintf(why, n, "its certificate could not be verified: %s", gnutls_strerror(g));
                return false;
        }
        if (status) {
                gnutls_datum_t out = { 0 };
                if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0) ==
                    0) {
                        snprintf(why, n, "its certificate is refused: %s", (const char *) out.data);
                        gnutls_free(out.data);
                } else
                        snprintf(why, n, "its certificate is refused (status %#x)", status);
                return false;
        }
        return true;
}
