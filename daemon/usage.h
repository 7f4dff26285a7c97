/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's side of the usage ledger (lib/meter/, docs/usage.md): one
 * line hooks where sandboxes start, are sampled and end, a flush once a
 * second, GET /usage, and the report that `hutch usage` prints too.
 */
#pragma once

#include <jansson.h>
#include <microhttpd.h>

#include "daemon/server.h"

/* A sandbox just created: its row written (into the create's transaction,
 * when one is open); a failure is retried by the next flush. */
void usage_sandbox_start(server *srv, const sbx *sb);
/* The create's transaction was rolled back: its row is forgotten unwritten. */
void usage_sandbox_forget(server *srv, const sbx *sb);
void usage_sample(server *srv, const sbx *sb, const hutch_stats *s, int64_t now);
void usage_proc_started(server *srv, const sbx *sb);
/* Before the kill: the final counters, the row closed and written at once. */
void usage_sandbox_end(server *srv, const sbx *sb);
int64_t usage_tick(server *srv, int64_t now);
/* A volume or snapshot was made or deleted: the storage ledger samples at
 * the loop's next turn rather than at the next metrics-interval. */
void usage_storage_changed(server *srv);
void usage_teardown(server *srv);

/* GET /usage?since=&until=&by=sandbox|day: the caller's team. */
enum MHD_Result usage_api(server *srv, request *req);

/* {"by", "rows": [{"key", counters…}], "total": {counters…}} for a team
 * (-1: all); by is "sandbox" or "day". NULL with err set. */
json_t *usage_report(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms,
                     const char *by, hutch_error *err);
