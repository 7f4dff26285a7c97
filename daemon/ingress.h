/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ingress: requests to ports of sandboxes (daemon/ingress.c).
 */
#pragma once

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

#include "daemon/server.h"

/* The tag of gvisor's ingress connectors (hutch-init --ingress-connect):
 * a restarted daemon kills those it finds instead of adopting them. */
#define INGRESS_CONNECTOR_TAG "hutch-ingress"

/* The request names port (not envd's) of the running sandbox sb and passed
 * the access checks: connect to it and proxy. MHD_YES with *ret_responded
 * false when proxying; the request's body mode is BODY_INGRESS then. */
enum MHD_Result ingress_begin(server *srv, request *req, sbx *sb, unsigned port, bool *ret_responded);
/* MHD's later calls for a BODY_INGRESS request (body bytes, final call). */
enum MHD_Result ingress_on_request(server *srv, request *req, const char *data, size_t *size);
/* MHD freed the request. */
void ingress_request_gone(ingress_conn *ic);
/* Kill or pause: every connection to the sandbox's ports ends now. */
void ingress_sbx_cut(server *srv, sbx *sb);
/* Shutdown: end them all. */
void ingress_stop(server *srv);
/* Free what ended during the loop's last event batch. */
void ingress_reap(server *srv);

/* allowPublicTraffic:false at create: requests to ports other than envd's
 * need e2b-traffic-access-token. 0 or -EACCES. */
int ingress_check_access(server *srv, request *req, sbx *sb, unsigned port);
enum MHD_Result ingress_reply_forbidden(struct MHD_Connection *c, const char *id, bool missing);
/* Traffic to a paused sandbox: resume it when its lifecycle says
 * autoResume. 0 (running now), -EHOSTDOWN (stays paused), -EIO. */
int ingress_auto_resume(server *srv, sbx *sb);

bool ingress_public(sbx *sb);
/* create/connect answers: trafficAccessToken (null for a public sandbox) and domain */
json_t *ingress_traffic_token_json(sbx *sb);
json_t *ingress_domain_json(server *srv);
/* SandboxDetail.network: allowPublicTraffic and maskRequestHost */
void ingress_network_json(sbx *sb, json_t *network);
/* The create body's network.allowPublicTraffic and maskRequestHost. */
int ingress_create_check(json_t *body, char *why, size_t wl);

/* For HTTP/2 ingress (daemon/ingress_h2.c), which has no MHD request: */
/* whether tok is sb's traffic access token (constant time) */
bool ingress_token_ok(server *srv, sbx *sb, const char *tok);
/* sb's maskRequestHost for port (${PORT} replaced) into out: true, or
 * false when sb has none (out untouched) */
bool ingress_masked_host(sbx *sb, unsigned port, char *out, size_t n);
/* a socket in sb's netns, not connected (ns backend) */
int ingress_up_socket(sbx *sb, int *ret_fd);
/* gvisor: a fresh connector to port (never a pooled one: those carry
 * HTTP/1.1), its read and write ends, non-blocking. -ECONNREFUSED: the
 * port was found closed a moment ago; -EUSERS: the sandbox has as many
 * connectors as it may (HTTP/1.1 and HTTP/2 together). */
int ingress_connector(server *srv, sbx *sb, unsigned port, int *ret_rfd, int *ret_wfd);
/* gvisor: a connector found port closed (answered from memory a while) */
void ingress_closed_note(const char *sbx_id, unsigned port);
