/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hutch router (docs/scale-out.md): a stateless front end for several
 * `hutch serve` nodes. It forwards every request by the node id at the start
 * of the sandbox or snapshot id it names, places creates on the best of K
 * sampled nodes, merges lists from every node, and finds nodes in a static
 * list or a DNS name (a Kubernetes headless Service). It keeps no state a
 * second replica would need: replicas run side by side.
 *
 * One thread per client connection (blocking I/O, poll on the two sockets of
 * a stream), one discovery thread that polls every node's GET /node. Node
 * connections are plain HTTP or, with node_tls_ca, TLS that verifies the
 * node (OpenSSL, non-blocking sockets under the same polls). The
 * parsers of node and client bytes are in rhttp.c (fuzzed) and lib/egress's
 * proxyreq.
 */
#pragma once

#include <stdint.h>

typedef struct router_config {
        char listen[128];    /* HOST:PORT */
        char nodes[4096];    /* http://HOST:PORT,... */
        char nodes_dns[300]; /* NAME:PORT: every A record of NAME is a node */
        char dns[128];       /* nameserver IP[:PORT] for nodes_dns; "": /etc/resolv.conf's first */
        char key_file[1024]; /* "TEAM KEY" (or "KEY") lines; the first key is the one GET /node is asked with */
        char node_tls_ca[1024]; /* PEM CA bundle: nodes are spoken to over TLS and verified; "": plain HTTP */
        char node_tls_name[256]; /* the name node certificates must match; "": each node's address (IP SAN) */
        char node_tls_cert[1024]; /* PEM chain shown to nodes (their tls-client-ca: mutual TLS); "": none */
        char node_tls_key[1024]; /* its private key */
        unsigned sample;  /* K: nodes sampled per create */
        unsigned poll_ms; /* GET /node of every node this often; DNS re-resolved as often */
        unsigned connect_timeout_ms;
        uint64_t max_body;        /* request bodies the router buffers (creates, secrets writes) */
        unsigned max_connections; /* client connections open at once (a thread each); beyond: closed */
        unsigned max_sandboxes_per_team; /* across every node; 0: only each node's own limit */
        unsigned max_snapshots_per_team; /* across every node; 0: only each node's own limit */
} router_config;

void router_config_defaults(router_config *c);
int router_run(const router_config *cfg);
