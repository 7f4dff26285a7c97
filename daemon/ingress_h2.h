/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HTTP/2 to sandbox ports (docs/api.md "Sandbox ports", "HTTP/2"): the
 * daemon accepts on the API port itself, and a plaintext connection that
 * opens with the HTTP/2 preface (h2c with prior knowledge, what gRPC
 * clients send) is served here; every other connection goes to
 * libmicrohttpd as before (MHD_add_connection). The first request's
 * headers (HPACK, lib/net/hpack.c) name the sandbox port; the access
 * controls of HTTP/1.1 apply; then the connection's bytes are relayed
 * both ways, the client's side still parsed frame by frame so that no
 * later stream can name another sandbox or port.
 */
#pragma once

#include <stdint.h>

#include "daemon/server.h"

/* Accept on listen_fd (the daemon's from here; closed by ingress_h2_stop). */
int ingress_h2_start(server *srv, int listen_fd);
void ingress_h2_stop(server *srv);
/* Deadlines of connections still sniffing or without their first
 * request; returns the next due time or -1. */
int64_t ingress_h2_tick(server *srv, int64_t now);
/* Close the HTTP/2 connections to a sandbox that ends or pauses. */
void ingress_h2_sbx_cut(server *srv, const char *sbx_id);
/* gvisor: the connectors the HTTP/2 connections to a sandbox hold (they
 * count towards the sandbox's bound, daemon/ingress.c) */
unsigned ingress_h2_connectors_of(const char *sbx_id);
/* After the loop's event batch: free what was closed during it. */
void ingress_h2_reap(void);
