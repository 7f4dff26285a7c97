#!/usr/bin/env bash
# SDK-level benchmark: the stock e2b npm SDK against `hutch serve`, next to
# the references measured in the same run (plain fork+exec of /bin/true,
# `cat` between tmpfs files, `runsc do true`). Prints markdown.
#
#   bench/sdk.sh                 # what `make bench` runs after bench/run.sh
#   SDK_N=10 SDK_IDLE=0 bench/sdk.sh
#
# SDK_N (50) create+run+kill cycles one at a time (twice that at SDK_CONC=10),
# SDK_RUNS (200) commands.run('true') on one sandbox, SDK_MB (100) file size,
# SDK_IDLE (1000) idle sandboxes held for the memory figure (0 skips).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${HUTCH_BUILD_DIR:-build}
HUTCH=${HUTCH_BIN:-$BUILD/hutch}
export SDK_N=${SDK_N:-50} SDK_CONC=${SDK_CONC:-10} SDK_RUNS=${SDK_RUNS:-200} SDK_MB=${SDK_MB:-100}
export SDK_IDLE=${SDK_IDLE:-1000}
PY=/usr/bin/python3

(cd tests/e2b && { [[ -d node_modules/e2b ]] || npm ci --no-audit --no-fund >&2; })

work=$(mktemp -d /tmp/hutch-sdk-bench.XXXXXX)
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pid=
cleanup() {
        set +e
        [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        # the daemon leaves sandboxes running by design: remove what the run left
        if [[ -f $work/data/hutch.db ]]; then
                for id in $(sqlite3 "$work/data/hutch.db" "select id from sandboxes where ended_ms = 0" 2>/dev/null); do
                        "$HUTCH" kill "$id" >/dev/null 2>&1
                done
        fi
        rm -rf "$work"
}
trap cleanup EXIT

"$HUTCH" serve --listen 127.0.0.1:$port --data-dir "$work/data" --max-sandboxes-per-team 5000 \
        >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:$port/health && break; sleep 0.1; done
export E2B_API_URL=http://127.0.0.1:$port E2B_SANDBOX_URL=http://127.0.0.1:$port
export E2B_API_KEY=$(cat "$work/data/api-key")

echo "bench: references (fork+exec, cat, runsc do)" >&2
ref=$($PY - <<'PYEOF'
import json, os, statistics, subprocess, time
def spawn(argv, n):
    xs = []
    for _ in range(n):
        t = time.perf_counter_ns()
        pid = os.posix_spawn(argv[0], argv, os.environ)
        os.waitpid(pid, 0)
        xs.append((time.perf_counter_ns() - t) / 1e6)
    xs.sort()
    return {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * .99))]}
out = {"fork_exec": spawn(["/bin/true"], 300)}
mb = int(os.environ["SDK_MB"])
os.makedirs("/dev/shm/hutch-bench", exist_ok=True)
src, dst = "/dev/shm/hutch-bench/a", "/dev/shm/hutch-bench/b"
with open(src, "wb") as f:
    f.write(os.urandom(1 << 20) * mb)
xs = []
for _ in range(5):
    t = time.perf_counter_ns()
    subprocess.run(["/bin/sh", "-c", f"cat {src} > {dst}"], check=True)
    xs.append((time.perf_counter_ns() - t) / 1e9)
xs.sort()
out["cat_mb_per_s"] = mb / xs[len(xs) // 2]
subprocess.run(["rm", "-rf", "/dev/shm/hutch-bench"])
runsc = subprocess.run(["sh", "-c", "command -v runsc"], capture_output=True, text=True).stdout.strip()
if runsc:
    try:
        argv = [runsc, "--platform=ptrace", "--network=none", "--rootless=false", "do", "/bin/true"]
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
        out["runsc_do"] = spawn(argv, 20)
    except Exception as e:
        out["runsc_do"] = {"na": str(e)[:80]}
print(json.dumps(out))
PYEOF
)

echo "bench: SDK (N=$SDK_N, runs=$SDK_RUNS, ${SDK_MB} MB, idle=$SDK_IDLE)" >&2
mem=""
export SDK_SYNC=$work/sync SDK_OUT=$work/sdk.json
(cd tests/e2b && exec node ../../bench/sdk.mjs) >&2 &
node_pid=$!
while kill -0 "$node_pid" 2>/dev/null; do
        if [[ -e $SDK_SYNC.ready && ! -e $SDK_SYNC.go ]]; then
                sleep 2
                rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
                pss=0
                # every init of this daemon's sandboxes (PSS: shared pages split)
                for id in $(sqlite3 "$work/data/hutch.db" "select id from sandboxes where ended_ms = 0"); do
                        ip=$(sed -n 's/^init_pid=//p' /run/hutch/sandboxes/$id/state 2>/dev/null)
                        [[ -n $ip ]] && pss=$((pss + $(awk '/^Pss:/ {s+=$2} END {print s+0}' /proc/$ip/smaps_rollup 2>/dev/null || echo 0)))
                done
                mem="{\"daemon_rss_kib\": $rss, \"inits_pss_kib\": $pss}"
                touch "$SDK_SYNC.go"
        fi
        sleep 0.2
done
wait "$node_pid" && [[ -s $SDK_OUT ]] || { echo "bench: the SDK run failed" >&2; tail -20 "$work/serve.log" >&2; exit 1; }
sdk_json=$(cat "$SDK_OUT")

echo "bench: the same transfers with curl (the daemon without the SDK's costs)" >&2
sb=$(curl -sf -XPOST -H "X-API-KEY: $E2B_API_KEY" -H 'content-type: application/json' -d '{"templateID":"base"}' \
        http://127.0.0.1:$port/v2/sandboxes)
sid=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["sandboxID"])' "$sb")
tok=$($PY -c 'import json,sys; print(json.loads(sys.argv[1])["envdAccessToken"])' "$sb")
head -c $((SDK_MB << 20)) /dev/urandom >"$work/blob"
hdr=(-H "E2b-Sandbox-Id: $sid" -H "E2b-Sandbox-Port: 49983" -H "X-Access-Token: $tok")
curl_up=() curl_down=()
for _ in 1 2 3 4 5; do
        curl_up+=("$(curl -sf -o /dev/null -w '%{time_total}' -XPOST "${hdr[@]}" -H 'content-type: application/octet-stream' \
                --data-binary @"$work/blob" "http://127.0.0.1:$port/files?path=/home/user/blob")")
        curl_down+=("$(curl -sf -o /dev/null -w '%{time_total}' "${hdr[@]}" "http://127.0.0.1:$port/files?path=/home/user/blob")")
done
curl -sf -o /dev/null -XDELETE -H "X-API-KEY: $E2B_API_KEY" http://127.0.0.1:$port/sandboxes/$sid || true
rm -f "$work/blob"
export CURL_UP="${curl_up[*]}" CURL_DOWN="${curl_down[*]}"

REF="$ref" SDK="$sdk_json" MEM="${mem:-{\}}" $PY - <<'PYEOF'
import json, os
ref, sdk, mem = json.loads(os.environ["REF"]), json.loads(os.environ["SDK"]), json.loads(os.environ["MEM"])
fe = ref["fork_exec"]["p50"]
def row(name, s, ratio_to=None, target=""):
    r = f"{s['p50'] / ratio_to:.2f}×" if ratio_to else ""
    return f"| {name} | {s['p50']:.2f} | {s['p99']:.2f} | {r} | {target} |"
print("| what | p50 ms | p99 ms | ratio | target |")
print("|---|---|---|---|---|")
print(row("fork+exec /bin/true (reference)", ref["fork_exec"]))
rs = ref.get("runsc_do", {})
if "p50" in rs:
    print(row("`runsc do true` (gVisor, ptrace) (reference)", rs))
print(row("SDK create → run('true') → kill, 1 at a time", sdk["cycle_c1"],
          rs.get("p50"), "≤ 0.2× runsc do"))
c = sdk["cycle_c10"]
print(row(f"same, {c['concurrency']} at a time ({c['per_sec']:.1f}/s)", c))
print(row("SDK commands.run('true') on a live sandbox", sdk["run_true"], fe, "≤ 2× fork+exec"))
print(row("  of which: SDK unary RPC round trip (files.exists)", sdk["unary"], fe))
b = sdk["bash_l_in_sandbox_ms"]
print(f"|   of which: `bash -l -c true` inside the sandbox (mean of 100) | {b:.2f} | | {b / fe:.2f}× | |")
up, dn = sdk["upload"], sdk["download"]
cat = ref["cat_mb_per_s"]
print()
print("| transfer | MB/s | vs `cat` tmpfs→tmpfs | target |")
print("|---|---|---|---|")
print(f"| `cat` {up['mb']} MB tmpfs→tmpfs (reference) | {cat:.0f} | | |")
print(f"| SDK files.write {up['mb']} MB | {up['mb_per_s']:.0f} | {up['mb_per_s'] / cat:.0%} | ≥ 50% |")
print(f"| SDK files.read {dn['mb']} MB | {dn['mb_per_s']:.0f} | {dn['mb_per_s'] / cat:.0%} | ≥ 50% |")
for name, var in (("upload", "CURL_UP"), ("download", "CURL_DOWN")):
    ts = sorted(float(x) for x in os.environ.get(var, "").split() if x)
    if ts:
        r = up["mb"] / ts[len(ts) // 2]
        print(f"| curl {name} {up['mb']} MB (median of {len(ts)}) | {r:.0f} | {r / cat:.0%} | ≥ 50% |")
if "idle" in sdk and mem:
    i = sdk["idle"]
    print()
    print(f"Idle: {i['n']} sandboxes created in {i['create_s']:.1f} s (8 at a time), killed in {i['kill_s']:.1f} s; "
          f"daemon RSS {mem['daemon_rss_kib'] / 1024:.1f} MiB, all inits' PSS {mem['inits_pss_kib'] / 1024:.1f} MiB "
          f"→ {(mem['daemon_rss_kib'] + mem['inits_pss_kib']) / i['n']:.0f} KiB per idle sandbox (target ≤ 1 MiB).")
PYEOF
