/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include "daemon/server.h"
#include "util/error.h"

/* sandbox-tls-cert/-key: load the sandbox domain's certificate beside the
 * API's (srv->tls_pem, read before) and take both into GnuTLS objects
 * (srv->tls_certs; the caller then wipes the PEM copies). 0 without a sandbox certificate (srv->tls_certs stays
 * NULL: libmicrohttpd serves tls_pem as before); -errno with err set for a
 * missing, unreadable or mismatched pair, or one without tls-cert or
 * sandbox-domain. */
int tls_certs_load(server *srv, hutch_error *err);

/* The value of MHD_OPTION_HTTPS_CERT_CALLBACK, which picks a pair by SNI:
 * the sandbox domain's for "<port>-<id>.<sandbox-domain>", the API's for
 * any other name or none. NULL when tls_certs_load loaded none. */
void *tls_certs_callback(server *srv);

void tls_certs_free(server *srv);

struct MHD_Connection;

/* tls-client-ca: whether conn's client presented a certificate that chains
 * to it, valid now and, when it names purposes, for TLS clients; why not
 * to why. */
bool tls_client_verified(struct MHD_Connection *conn, char *why, size_t n);
