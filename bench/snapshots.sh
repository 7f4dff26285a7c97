#!/usr/bin/env bash
# bench/snapshots.mjs against a fresh `hutch serve` (part of `make bench`).
#   SNAP_N=5 bench/snapshots.sh
# BENCH_MJS (a bench/*.mjs) and SERVE_ARGS run another client the same way
# (bench/backends.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${HUTCH_BUILD_DIR:-build}
HUTCH=${HUTCH_BIN:-$BUILD/hutch}
PY=/usr/bin/python3
(cd tests/e2b && { [[ -d node_modules/e2b ]] || npm ci --no-audit --no-fund >&2; })
work=$(mktemp -d /tmp/hutch-snap-bench.XXXXXX)
chmod 755 "$work"
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pid=
cleanup() {
        set +e
        [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        if [[ -f $work/data/hutch.db ]]; then
                for id in $(sqlite3 "$work/data/hutch.db" "select id from sandboxes where ended_ms = 0" 2>/dev/null); do
                        "$HUTCH" kill "$id" >/dev/null 2>&1
                done
        fi
        rm -rf "$work"
}
trap cleanup EXIT
"$HUTCH" serve --listen 127.0.0.1:$port --data-dir "$work/data" --run-dir "$work/run" ${SERVE_ARGS:-} >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:$port/health && break; sleep 0.1; done
export E2B_API_URL=http://127.0.0.1:$port E2B_SANDBOX_URL=http://127.0.0.1:$port
export E2B_API_KEY=$(cat "$work/data/api-key")
cd tests/e2b && node ../../bench/${BENCH_MJS:-snapshots.mjs}
