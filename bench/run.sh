#!/usr/bin/env bash
# hutch against its peers, measured in one run on this machine (docs/design.md §7).
# Prints markdown on stdout (progress on stderr) and keeps a copy in
# $HUTCH_BUILD_DIR/bench-results.md.
#
#   bench/run.sh                     # what `make bench` runs
#   BENCH_N=20 bench/run.sh          # a quick look
#
# Environment:
#   BENCH_N           interleaved rounds per command (200)
#   BENCH_WARMUP      unrecorded rounds first (3)
#   BENCH_TIMEOUT     seconds one run may take before it counts as failed (30)
#   BENCH_CONC        worker processes for the "at a time" rate; 0 skips (10)
#   BENCH_CONC_RUNS   runs per command in that test (200)
#   BENCH_K           idle sandboxes held for the memory figure (50)
#   BENCH_PEERS       which peers to run (default "bwrap crun runc runsc"; empty: none)
#   HUTCH_BUILD_DIR   meson build directory (build)
#   HUTCH_BIN         the hutch CLI (default: $HUTCH_BUILD_DIR/hutch)
#
# Every peer either gets numbers or a row "n/a: <reason>"; nothing here
# waits without a timeout.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=/usr/bin/python3
N=${BENCH_N:-200}
WARMUP=${BENCH_WARMUP:-3}
TIMEOUT=${BENCH_TIMEOUT:-30}
CONC=${BENCH_CONC:-10}
CONC_RUNS=${BENCH_CONC_RUNS:-200}
K=${BENCH_K:-50}
PEERS=${BENCH_PEERS-bwrap crun runc runsc}
BUILD=${HUTCH_BUILD_DIR:-build}
HUTCH=${HUTCH_BIN:-$BUILD/hutch}
[[ -x $HUTCH || -n ${HUTCH_BIN:-} || ! -x $BUILD/cli/hutch ]] || HUTCH=$BUILD/cli/hutch

log() { echo "bench: $*" >&2; }
has_peer() { [[ " $PEERS " == *" $1 "* ]]; }

work=$(mktemp -d /tmp/hutch-bench.XXXXXX)
ns_pid=
cleanup() {
        set +e
        if [[ -n $ns_pid ]]; then
                kill "$ns_pid" 2>/dev/null
                wait "$ns_pid" 2>/dev/null
        fi
        # Containers left by a run that timed out.
        for rt in crun runc; do
                [[ -d $work/$rt-state ]] || continue
                for id in $($rt --root "$work/$rt-state" list -q 2>/dev/null); do
                        timeout 10 $rt --root "$work/$rt-state" delete -f "$id" >/dev/null 2>&1
                done
        done
        rm -rf "$work"
}
trap cleanup EXIT

tool_args=()
na() { tool_args+=(--na "$1=$2"); }
tool() { tool_args+=(--tool "$1=$2"); }

# ---------------------------------------------------------------- references
tool "plain exec" /bin/true
# A static binary: what hutch-init is, and docs/design.md §7's "fork+exec of a static binary".
static_true=$work/static-true
if echo 'int main(void) { return 0; }' |
        { musl-gcc -static -Os -o "$static_true" -x c - || gcc -static -Os -o "$static_true" -x c -; } 2>/dev/null; then
        tool "static exec" "$static_true"
else
        na "static exec" "no static C toolchain (musl-gcc or gcc -static)"
        static_true=
fi

# --------------------------------------------------------------------- hutch
if [[ -x $HUTCH ]]; then
        tool "hutch run" "$HUTCH run -- /bin/true"
else
        na "hutch run" "$HUTCH not built"
fi

# --------------------------------------------------------------------- peers
if has_peer bwrap; then
        tool "bwrap" "bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true"
fi

# OCI runtimes need a bundle: the runtime's own default spec, running
# /bin/true on a read-only bind of the host's / (as hutch's "host" template
# does). The bind lives in a private mount namespace held open by a sleeping
# process, so the host's mount table is never touched; the timed runs enter
# it with setns() before their clock starts. On a hybrid cgroup host whose
# cgroup2 has controllers, crun refuses to start ("cgroups in hybrid mode not
# supported"), whatever --cgroup-manager says, so the namespace also
# unmounts /sys/fs/cgroup/unified: crun and runc then see a plain cgroup v1
# host and create their v1 cgroups as they would there.
oci_ns=
oci_note=
hybrid=0
if [[ -n $(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null) ]]; then
        hybrid=1
fi
want_oci=0
for rt in crun runc; do has_peer $rt && command -v $rt >/dev/null && want_oci=1; done
if ((want_oci)); then
        if ((EUID != 0)); then
                for rt in crun runc; do has_peer $rt && na "$rt" "needs root (rootless OCI bundles not set up here)"; done
        else
                mkdir -p "$work/rootfs"
                unshare --mount --propagation private sh -c '
                        set -e
                        mount --bind / "$1/rootfs"
                        if [ "$2" = 1 ]; then umount -l /sys/fs/cgroup/unified; fi
                        touch "$1/ns-ready"
                        exec sleep 3600' sh "$work" "$hybrid" >"$work/ns.log" 2>&1 &
                ns_pid=$!
                for _ in $(seq 100); do
                        [[ -e $work/ns-ready ]] && break
                        kill -0 "$ns_pid" 2>/dev/null || break
                        sleep 0.05
                done
                if [[ -e $work/ns-ready ]]; then
                        oci_ns=/proc/$ns_pid/ns/mnt
                        oci_note="crun and runc run in a private mount namespace where the bundle's rootfs is a bind of the host's /"
                        if ((hybrid)); then
                                oci_note+=" and /sys/fs/cgroup/unified is unmounted (this host has hybrid cgroups with controllers on cgroup2, which crun refuses)"
                        fi
                else
                        reason="could not prepare the bundle namespace: $(tail -n1 "$work/ns.log" 2>/dev/null)"
                        for rt in crun runc; do has_peer $rt && na "$rt" "$reason"; done
                fi
        fi
fi

# make_bundle RUNTIME DIR: write DIR/config.json from `RUNTIME spec`.
make_bundle() {
        local rt=$1 dir=$2
        mkdir -p "$dir"
        (cd "$dir" && $rt spec) >"$work/$rt-spec.log" 2>&1 || return 1
        "$PY" - "$dir/config.json" "$work/rootfs" <<'EOF'
import json, sys
path, rootfs = sys.argv[1], sys.argv[2]
with open(path) as f:
    c = json.load(f)
c["process"]["args"] = ["/bin/true"]
c["process"]["terminal"] = False
c["root"] = {"path": rootfs, "readonly": True}
with open(path, "w") as f:
    json.dump(c, f, indent=1)
EOF
}

for rt in crun runc; do
        has_peer $rt || continue
        [[ -n $oci_ns ]] || continue
        if ! command -v $rt >/dev/null; then
                na "$rt" "$rt is not installed"
                continue
        fi
        if ! make_bundle $rt "$work/$rt"; then
                na "$rt" "$rt spec failed: $(tail -n1 "$work/$rt-spec.log")"
                continue
        fi
        mkdir -p "$work/$rt-state"
        tool "$rt" "$rt --root $work/$rt-state run --bundle $work/$rt {id}"
        tool_args+=(--ns "$rt=$oci_ns")
        if [[ $rt == crun ]]; then
                # The same without creating cgroups: what the cgroup costs crun.
                tool "crun, no cgroup" "crun --cgroup-manager=disabled --root $work/$rt-state run --bundle $work/$rt {id}"
                tool_args+=(--ns "crun, no cgroup=$oci_ns")
        fi
done

if has_peer runsc; then
        if ! command -v runsc >/dev/null; then
                na "runsc (gVisor)" "runsc is not installed"
        elif ((EUID != 0)); then
                na "runsc (gVisor)" "runsc do needs root here"
        else
                mkdir -p "$work/runsc-state"
                tool "runsc (gVisor)" "runsc --root $work/runsc-state --rootless=false --platform=ptrace --network=none do /bin/true"
        fi
fi

# -------------------------------------------------------------------- output
out=$work/results.md
{
        echo "## hutch benchmarks"
        echo
        echo "$(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'), build dir \`$BUILD\`."
        echo
} | tee "$out"

log "command line: $N rounds (+$WARMUP warm-up), then $CONC at a time"
"$PY" bench/timeit.py --rounds "$N" --warmup "$WARMUP" --timeout "$TIMEOUT" \
        --ref "plain exec" --vs bwrap \
        --concurrency "$CONC" --conc-runs "$CONC_RUNS" \
        --conc-tools "plain exec,hutch run,bwrap,crun" \
        --label "$work=\$WORK" --json "$work/cli.json" "${tool_args[@]}" | tee -a "$out"
if [[ -n $oci_note ]]; then
        echo "Note: $oci_note." | tee -a "$out"
        echo | tee -a "$out"
fi

# ------------------------------------------------------- libhutch in process
inproc=$BUILD/bench/bench-inproc
{
        echo "### libhutch, in process"
        echo
} | tee -a "$out"
if [[ ! -x $inproc ]]; then
        echo "n/a: $inproc not built" | tee -a "$out"
elif ((EUID != 0)); then
        echo "n/a: needs root" | tee -a "$out"
else
        # Bounded: every create is a few ms; allow generously for a slow host.
        limit=$((60 + N * 2 + K * 2))
        args=(-n "$N" -k "$K")
        [[ -n $static_true ]] && args+=(--static "$static_true")
        rc=0
        timeout --kill-after=10 "$limit" "$inproc" "${args[@]}" >"$work/inproc.md" 2>"$work/inproc.err" || rc=$?
        cat "$work/inproc.md" | tee -a "$out"
        if ((rc != 0)); then
                reason=$(grep -v '^$' "$work/inproc.err" | tail -n1)
                ((rc == 124)) && reason="timed out after ${limit}s"
                echo "n/a: bench-inproc exited $rc${reason:+: $reason}" | tee -a "$out"
        fi
fi
echo | tee -a "$out"

if [[ -d $BUILD ]]; then
        cp "$out" "$BUILD/bench-results.md"
        [[ -f $work/cli.json ]] && cp "$work/cli.json" "$BUILD/bench-cli.json"
        log "results kept in $BUILD/bench-results.md"
fi
