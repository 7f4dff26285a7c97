#!/usr/bin/env bash
# bench/backends.mjs (ns and gvisor side by side) against a fresh `hutch serve`
# with no warm pool, so that every create is cold on both (part of `make bench`).
#   BACKENDS_N=5 BACKENDS_IDLE=5 bench/backends.sh
BENCH_MJS=backends.mjs SERVE_ARGS="--pool-size 0" exec "$(dirname "$0")/snapshots.sh"
