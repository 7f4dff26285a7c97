/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's side of the audit trail (lib/audit/, docs/audit.md): the
 * hooks the rest of daemon/ calls, one line each, and GET /events. Every
 * hook is a no-op with the `audit` setting off.
 *
 * Records are queued in memory and written once per loop turn (before the
 * loop sleeps) in one transaction, with the store's new events and egress
 * records folded in; a checkpoint is signed every audit-checkpoint-interval
 * and at shutdown.
 */
#pragma once

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/server.h"

int audit_setup(server *srv);     /* after the store is open; logs what the previous daemon left */
void audit_teardown(server *srv); /* daemon.stop, the final checkpoint */
/* Once per loop turn: write what is queued; a checkpoint or a retention
 * pass when due. Returns when it wants to run next (ms), or -1. */
int64_t audit_tick(server *srv, int64_t now);

/* An HTTP request is over (http.c's completion callback). */
void audit_request_done(server *srv, request *req, struct MHD_Connection *c);
/* A sandbox exists: its template, backend and limits. */
void audit_sandbox_created(server *srv, const sbx *sb);
/* A sandbox is ending: its final counters from the usage ledger (CPU,
 * memory peak, processes the memory limit killed). */
struct meter_row;
void audit_sandbox_final(server *srv, const sbx *sb, const struct meter_row *row);
/* envd: a process started (argv, user, cwd, env names, pty) or ended. */
void audit_proc_start(server *srv, sbx *sb, proc *p, const char *user, const char *cwd);
void audit_proc_end(server *srv, sbx *sb, proc *p);
/* envd filesystem calls that change files: kind "file.delete", "file.move",
 * "dir.create"; result < 0 is recorded as the error. */
void audit_fs(server *srv, sbx *sb, const char *kind, const char *path, const char *path2,
              int result);
/* POST /files: bytes of an upload part as they pass (hashed), its end. key
 * names the part (its upload_file). */
void audit_upload_data(server *srv, const void *key, const void *data, size_t len);
void audit_upload_done(server *srv, const char *sbx_id, const void *key, const char *path,
                       uint64_t bytes, int result);
/* The egress proxy asked for a secret's value (a credential rule). */
void audit_secret_use(server *srv, const char *sbx_id, const char *name, const char *host,
                      unsigned port, int result);

/* GET /events and GET /sandboxes/{id}/events: the caller's team's records. */
enum MHD_Result audit_events_api(server *srv, request *req, const char *sandbox_id);
