#!/usr/bin/env bash
# Router overhead (issue 18): 3 `hutch serve` nodes and one `hutch router` on
# this host; bench/router.mjs runs commands.run('true') and a file round trip
# on one sandbox through the router and straight to its node, interleaved.
#
#   HUTCH_BIN=build/hutch RUNS=300 MB=50 bench/router.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HUTCH=${HUTCH_BIN:-${HUTCH_BUILD_DIR:-build}/hutch}
export RUNS=${RUNS:-300} MB=${MB:-50}
PY=/usr/bin/python3
(cd tests/e2b && { [[ -d node_modules/e2b ]] || npm ci --no-audit --no-fund >&2; })
work=$(mktemp -d /tmp/hutch-router-bench.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
        set +e
        for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
        wait 2>/dev/null
        for i in 1 2 3; do
                ids=$(HUTCH_RUN_DIR=$work/run$i "$HUTCH" ps -q 2>/dev/null)
                [[ -n $ids ]] && HUTCH_RUN_DIR=$work/run$i "$HUTCH" kill $ids >/dev/null 2>&1
        done
        rm -rf "$work"
}
trap cleanup EXIT
port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export E2B_API_KEY="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
echo "default $E2B_API_KEY" >"$work/keys"
urls=()
for i in 1 2 3; do
        p=$(port)
        "$HUTCH" serve --listen 127.0.0.1:$p --data-dir "$work/data$i" --run-dir "$work/run$i" \
                --node-id "bn0$i" --keys-file "$work/keys" >"$work/serve$i.log" 2>&1 &
        pids+=($!)
        urls+=("http://127.0.0.1:$p")
done
for u in "${urls[@]}"; do for _ in $(seq 100); do curl -sf -o /dev/null "$u/health" && break; sleep 0.1; done; done
rp=$(port)
"$HUTCH" router --listen 127.0.0.1:$rp --nodes "$(IFS=,; echo "${urls[*]}")" --key-file "$work/keys" \
        >"$work/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$rp/health" && break; sleep 0.1; done
export ROUTER_URL=http://127.0.0.1:$rp NODE_URLS=$(IFS=,; echo "${urls[*]}")
router_pid=${pids[-1]}
t0=$(awk '{print $14+$15}' /proc/$router_pid/stat)
node bench/router.mjs
t1=$(awk '{print $14+$15}' /proc/$router_pid/stat)
echo "router CPU over the run: $(( (t1 - t0) * 1000 / $(getconf CLK_TCK) )) ms" >&2
