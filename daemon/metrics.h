/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prometheus metrics of the daemon (docs/metrics.md): GET /metrics in the
 * text exposition format on a listen address of its own (the
 * metrics-listen setting; off by default), never on the API's port, where
 * /metrics belongs to a sandbox's envd. The hooks are one-line calls.
 */
#pragma once

#include <microhttpd.h>

#include "daemon/server.h"
#include "store/store.h"

int metrics_setup(server *srv); /* after the loop exists; nothing when metrics-listen is "-" */
void metrics_teardown(server *srv);

/* A request ended (with its status), a sandbox was created or ended, the
 * proxy recorded a connection, the store took this long to write. */
void metrics_request_done(server *srv, request *req, unsigned status);
void metrics_sandbox_created(server *srv);
void metrics_sandbox_end(server *srv, const sbx *sb, const char *reason);
void metrics_egress(server *srv, const store_egress *e);
void metrics_store_write(server *srv, const char *writer, int64_t ns);
/* A killed sandbox's teardown ended, ns after its kill began. */
void metrics_sandbox_killed(server *srv, int64_t ns);
/* A build's fromImage pulled an image: bytes downloaded. */
void metrics_template_pull(server *srv, int64_t bytes);
/* Admission (daemon/admission.c): a heavy request waited this long for its
 * turn (op: its route); one was refused because a limit ("team", "daemon")
 * was reached. */
void metrics_admission_wait(server *srv, int op, int64_t ns);
void metrics_admission_refused(server *srv, const char *limit);

/* The text exposition of the metrics (free with free()). */
char *metrics_render(server *srv);
