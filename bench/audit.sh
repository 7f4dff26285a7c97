#!/usr/bin/env bash
# The audit trail's cost on the SDK's commands.run and files.write: one
# daemon with `audit = on` and one with `audit = off` (same build, own data
# dirs), measured in alternating rounds by bench/audit.mjs. Prints markdown.
#
#   bench/audit.sh                       # AUDIT_ROUNDS=10 AUDIT_PER=40
#   HUTCH_BUILD_DIR=build-test bench/audit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${HUTCH_BUILD_DIR:-build}
HUTCH=${HUTCH_BIN:-$BUILD/hutch}
PY=/usr/bin/python3
(cd tests/e2b && { [[ -d node_modules/e2b ]] || npm ci --no-audit --no-fund >&2; })

work=$(mktemp -d /tmp/hutch-audit-bench.XXXXXX)
pids=()
cleanup() {
        set +e
        for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
        for d in on off; do
                [[ -f $work/$d/hutch.db ]] || continue
                for id in $(sqlite3 "$work/$d/hutch.db" "select id from sandboxes where ended_ms = 0" 2>/dev/null); do
                        "$HUTCH" kill "$id" >/dev/null 2>&1
                done
        done
        rm -rf "$work"
}
trap cleanup EXIT

for side in on off; do
        port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        "$HUTCH" serve --listen 127.0.0.1:$port --data-dir "$work/$side" --pool-size 0 --audit $side \
                >"$work/$side.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:$port/health && break; sleep 0.1; done
        export AUDIT_${side^^}="http://127.0.0.1:$port $(cat "$work/$side/api-key")"
done
out=$(cd tests/e2b && node ../../bench/audit.mjs)
records=$(sqlite3 "$work/on/hutch.db" "select count(*) from audit_log")
"$HUTCH" audit verify --data-dir "$work/on" >&2
$PY - "$out" "$records" <<'PYEOF'
import json, sys
o = json.loads(sys.argv[1])
print("| op | audit | n | p50 ms | p90 ms | mean ms |")
print("|---|---|---|---|---|---|")
for op, name in (("run", "commands.run('true')"), ("write", "files.write (4 KiB)")):
    for side in ("off", "on"):
        s = o[side][op]
        print(f"| {name} | {side} | {s['n']} | {s['p50']:.3f} | {s['p90']:.3f} | {s['mean']:.3f} |")
for op in ("run", "write"):
    c = o[op + "_cost_pct"]
    print(f"\n{op}: audit on costs {c['p50']:+.1f}% at p50, {c['mean']:+.1f}% on the mean", end="")
print(f"\n\n{sys.argv[2]} audit records written by the `on` daemon; `hutch audit verify` passed")
PYEOF
