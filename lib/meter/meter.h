/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The usage ledger (docs/usage.md): one row per sandbox in the store's
 * database (table usage, store migration 8). Every counter is an absolute
 * value, never a delta: the kernel's cumulative counters as last read
 * (CPU time, memory peak), integrals up to updated_ms (writable layer), and
 * sums over the egress log; so a row written twice, or again by the next
 * daemon after a restart, never counts anything twice. All integers.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "hutch/hutch.h"
#include "store/store.h"

typedef struct meter_row {
        char sandbox_id[64];
        int64_t team;
        char template_id[64];
        char backend[16];
        int64_t started_ms, ended_ms, updated_ms; /* ended 0: still running */
        int64_t cpu_ns;                           /* the cgroup's CPU time */
        int64_t memory_mb;                        /* the limit (reserved) */
        int64_t memory_reserved_mib_ms;           /* memory_mb × lifetime */
        int64_t memory_peak_bytes;
        int64_t disk_kib_ms; /* the writable layer's use, integrated */
        int64_t disk_peak_bytes;
        int64_t pids_peak;
        int64_t processes; /* started through the API */
        int64_t oom_kills; /* processes the memory limit killed (the cgroup's count) */
        /* from the egress log, by decision */
        int64_t egress_allowed, egress_denied;
        int64_t egress_allowed_out, egress_allowed_in, egress_denied_out, egress_denied_in;
        /* NVIDIA GPUs (store migration 10): how many it held, gpus × lifetime
         * (GPU-ms), and the most GPU memory its processes held (NVML);
         * -1 (NULL in the table): not measured */
        int64_t gpus, gpu_ms, gpu_memory_peak_bytes;
} meter_row;

/* -ENOENT when the sandbox has no row. */
int meter_get(hutch_store *st, const char *sandbox_id, meter_row *ret, hutch_error *err);
/* Insert or replace the row; the egress columns are summed from the
 * egress log here, whatever r holds. */
int meter_put(hutch_store *st, const meter_row *r, hutch_error *err);
/* Rows still open whose sandbox the store says ended (the daemon died
 * before it closed them): closed at the sandbox's end. Returns how many. */
int meter_close_orphans(hutch_store *st, hutch_error *err);

/* Rows of a team (-1: all) that overlap [since, until) (0: open), by start. */
int meter_query(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms,
                int (*cb)(void *arg, const meter_row *r), void *arg, hutch_error *err);

/* A transaction around several meter_put(): the store's (store_begin … store_commit),
 * so it joins one that the caller has open. */
int meter_begin(hutch_store *st, hutch_error *err);
int meter_commit(hutch_store *st, bool ok, hutch_error *err); /* ok false: ROLLBACK */

/* Totals of rows grouped by key (a sandbox id, or a UTC day "YYYY-MM-DD"
 * of the sandbox's start): each sum is the exact integer sum of its rows. */
void meter_row_add(meter_row *sum, const meter_row *r);

/* ------------------------------------------------------- storage ledger */

/* One row per volume and per snapshot a team holds (table storage_usage,
 * store migration 9): its bytes on the host's disk integrated over its
 * life, from its creation to its deletion. Absolute like meter_row: a
 * sample taken twice at the same time adds nothing. */
typedef struct meter_storage {
        char kind[16]; /* "volume" or "snapshot" */
        char object_id[64];
        int64_t team;
        char name[129];
        int64_t started_ms, ended_ms, updated_ms; /* ended 0: still held */
        int64_t bytes;                            /* on disk at the last sample */
        int64_t bytes_peak;
        int64_t kib_ms; /* KiB·ms: ÷ 1024² ÷ 3.6e6 for GiB-hours */
} meter_storage;

/* Samples every live volume and snapshot, and every paused sandbox's
 * checkpoint, at now in one transaction: a row is opened for a new one
 * (integrated from its creation; a checkpoint from now), advanced with the
 * bytes it holds now, and closed at now for one that is gone. A volume's
 * and a checkpoint's bytes come from object_bytes(arg, kind, id) (< 0: a
 * volume keeps its last value; a paused sandbox without a checkpoint on
 * disk, an ns one whose memory stays in RAM, has no row); a snapshot's from
 * its row in the store. A sandbox paused again reopens its checkpoint row
 * (one row a sandbox, its paused time summed). A row is written only when
 * its bytes change (or it opens or closes). Returns the number of rows
 * closed. */
int meter_storage_sample(hutch_store *st, int64_t now,
                         int64_t (*object_bytes)(void *arg, const char *kind, const char *id), void *arg,
                         hutch_error *err);
/* Rows of a team (-1: all) that overlap [since, until) (0: open), by start;
 * an open row's kib_ms runs to now_ms at its last bytes (rows are written
 * only when their bytes change). */
int meter_storage_query(hutch_store *st, int64_t team, int64_t since_ms, int64_t until_ms, int64_t now_ms,
                        int (*cb)(void *arg, const meter_storage *r), void *arg, hutch_error *err);
