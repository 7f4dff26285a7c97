#!/usr/bin/env bash
# The code interpreter benchmark (bench/interp.mjs) against a private
# `hutch serve`. Prints markdown (docs/benchmarks.md "Code interpreter").
#
#   HUTCH_BIN=build/hutch bench/interp.sh
#   INTERP_N=200 INTERP_CREATES=5 INTERP_POOL=1 bench/interp.sh
#   INTERP_BACKEND=gvisor INTERP_POOL=0 INTERP_CHECKPOINT=on bench/interp.sh
# (INTERP_POOL: the daemon's interp-pool-size; INTERP_BACKEND its backend;
# INTERP_CHECKPOINT its interp-checkpoint, on gvisor: with on, the run
# waits for the checkpoint before it measures)
set -euo pipefail
cd "$(dirname "$0")/.."
HUTCH=${HUTCH_BIN:-${HUTCH_BUILD_DIR:-build}/hutch}
PY=/usr/bin/python3
(cd tests/e2b && { [[ -d node_modules/@e2b/code-interpreter ]] || npm ci --no-audit --no-fund >&2; })
work=$(mktemp -d /tmp/hutch-interp-bench.XXXXXX)
chmod 0755 "$work"
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pid=
cleanup() {
        set +e
        [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        if [[ -f $work/data/hutch.db ]]; then
                for id in $(sqlite3 "$work/data/hutch.db" "select id from sandboxes where ended_ms = 0" 2>/dev/null); do
                        HUTCH_DATA_DIR=$work/data HUTCH_RUN_DIR=$work/run "$HUTCH" kill "$id" >/dev/null 2>&1
                done
        fi
        rm -rf --one-file-system "$work"
}
trap cleanup EXIT
"$HUTCH" serve --listen 127.0.0.1:$port --data-dir "$work/data" --run-dir "$work/run" \
        --interp-pool-size "${INTERP_POOL:-1}" --backend "${INTERP_BACKEND:-ns}" \
        --interp-checkpoint "${INTERP_CHECKPOINT:-on}" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -s $work/data/api-key ]] && curl -sf -o /dev/null http://127.0.0.1:$port/health && break; sleep 0.1; done
if [[ ${INTERP_BACKEND:-ns} == gvisor && ${INTERP_CHECKPOINT:-on} == on ]]; then
        # the daemon takes its checkpoint once an interpreter was wanted
        key=$(cat "$work/data/api-key")
        sid=$(curl -sf -H "X-API-Key: $key" -H 'Content-Type: application/json' \
                -d '{"templateID":"code-interpreter-v1"}' http://127.0.0.1:$port/sandboxes |
                $PY -c 'import json,sys; print(json.load(sys.stdin)["sandboxID"])')
        curl -sf -X DELETE -H "X-API-Key: $key" http://127.0.0.1:$port/sandboxes/$sid
        for _ in $(seq 600); do grep -q "interpreter checkpoint: " "$work/serve.log" && break; sleep 0.5; done
        grep "interpreter checkpoint" "$work/serve.log" >&2 || { echo "no interpreter checkpoint after 300 s" >&2; exit 1; }
fi
export E2B_API_URL=http://127.0.0.1:$port E2B_SANDBOX_URL=http://127.0.0.1:$port
export E2B_API_KEY=$(cat "$work/data/api-key")
node bench/interp.mjs
