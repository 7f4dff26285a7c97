#!/usr/bin/env bash
# `hutch template pull` against `skopeo copy` of the same image to an OCI
# directory, side by side in one run, from a docker-registry on this machine
# (in a network namespace of its own, plain HTTP on 127.0.0.1:5000); then
# `hutch template push` of the pulled template (cold: tar, gzip, upload;
# and again, every blob present), and a daemon's create of a template it
# lacks (`template-registry`: the pull on a miss) against a create of one it
# has (PULL_SHARE=0 skips those).
#
#   PULL_LAYERS=5 PULL_LAYER_MIB=20 PULL_RUNS=5 bench/pull.sh
#
# Both start cold every run: hutch with an empty data dir (no blob cache, no
# layer store: it downloads, verifies, unpacks and writes the template),
# skopeo with an empty destination (it downloads and verifies, and unpacks
# nothing). The layers are random bytes (incompressible), gzip'd by umoci.
# Needs root, docker-registry, skopeo, umoci, hyperfine.
set -euo pipefail

layers=${PULL_LAYERS:-5}
mib=${PULL_LAYER_MIB:-20}
runs=${PULL_RUNS:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
hutch=${HUTCH_BIN:-$root/build/cli/hutch}
[[ -x $hutch ]] || hutch=$root/build-test/cli/hutch
for t in docker-registry skopeo umoci hyperfine ip nsenter; do
        command -v "$t" >/dev/null || {
                echo "bench/pull.sh needs $t (scripts/deps.sh test)" >&2
                exit 1
        }
done

work=$(mktemp -d /tmp/hutch-bench-pull.XXXXXX)
ns=hxb$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
reg_pid=
cleanup() {
        if [[ -n $reg_pid ]]; then
                kill "$reg_pid" 2>/dev/null || true
                wait "$reg_pid" 2>/dev/null || true
        fi
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "$work"
}
trap cleanup EXIT
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }

ip netns add "$ns"
ip -n "$ns" link set lo up
cat >"$work/reg.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/store
http:
  addr: 127.0.0.1:5000
EOF
# nsenter execs the registry: $! is the registry itself (a shell function
# here would put a subshell between, and the kill would miss the registry)
nsenter --net="/run/netns/$ns" docker-registry serve "$work/reg.yml" >"$work/reg.log" 2>&1 &
reg_pid=$!

echo "building a $layers-layer image, $mib MiB of random bytes a layer" >&2
umoci init --layout "$work/oci" >/dev/null
umoci new --image "$work/oci:img" >/dev/null
for i in $(seq 1 "$layers"); do
        umoci unpack --image "$work/oci:img" "$work/b" >/dev/null
        head -c "$((mib << 20))" /dev/urandom >"$work/b/rootfs/data$i.bin"
        umoci repack --image "$work/oci:img" "$work/b" >/dev/null
        rm -rf "$work/b"
done
for _ in $(seq 50); do in_ns curl -sf http://127.0.0.1:5000/v2/ >/dev/null && break || sleep 0.1; done
in_ns skopeo copy -q --dest-tls-verify=false "oci:$work/oci:img" docker://127.0.0.1:5000/bench/img:1
echo "insecure 127.0.0.1:5000" >"$work/registries.conf"

export HUTCH_REGISTRIES_CONF=$work/registries.conf
[[ -n ${PULL_KEEP:-} ]] && { echo "ns=$ns work=$work"; trap - EXIT; exit 0; }
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/result.md" \
        --prepare "rm -rf $work/data $work/skopeo-dst" \
        -n "hutch template pull" \
        "HUTCH_DATA_DIR=$work/data nsenter --net=/run/netns/$ns $hutch template pull 127.0.0.1:5000/bench/img:1 --name bench >/dev/null 2>&1" \
        -n "skopeo copy (to an OCI dir)" \
        "nsenter --net=/run/netns/$ns skopeo copy -q --src-tls-verify=false docker://127.0.0.1:5000/bench/img:1 oci:$work/skopeo-dst:img"
# and a pull whose layers are all in the store (the manifest and the cached
# config are read; nothing is downloaded or unpacked)
HUTCH_DATA_DIR=$work/data in_ns "$hutch" template pull 127.0.0.1:5000/bench/img:1 --name bench >/dev/null 2>&1
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/again.md" \
        -n "hutch template pull, layers present" \
        "HUTCH_DATA_DIR=$work/data nsenter --net=/run/netns/$ns $hutch template pull 127.0.0.1:5000/bench/img:1 --name bench >/dev/null 2>&1"
cat "$work/result.md"
tail -n 1 "$work/again.md"
[[ ${PULL_SHARE:-1} == 0 ]] && exit 0

# Templates through a registry (docs/scale-out.md). A cold push goes to a
# new repository each run (the registry links blobs per repository, so it
# HEADs 404 and takes every blob again) with the layers' .pushed notes
# removed (so the tars are made and compressed again); a warm one pushes
# the same template to the same place: HEADs only, and the manifest.
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/push.md" \
        --prepare "rm -f $work/data/layers/sha256/*.pushed" \
        -n "hutch template push (cold: tar + gzip + upload)" \
        "HUTCH_DATA_DIR=$work/data nsenter --net=/run/netns/$ns $hutch template push bench 127.0.0.1:5000/bench/p\$(date +%s%N) >/dev/null 2>&1"
HUTCH_DATA_DIR=$work/data in_ns "$hutch" template push bench 127.0.0.1:5000/bench/warm >/dev/null 2>&1
hyperfine --runs "$runs" --warmup 1 --export-markdown "$work/push-again.md" \
        -n "hutch template push, blobs present" \
        "HUTCH_DATA_DIR=$work/data nsenter --net=/run/netns/$ns $hutch template push bench 127.0.0.1:5000/bench/warm >/dev/null 2>&1"
tail -n 1 "$work/push.md"
tail -n 1 "$work/push-again.md"

# A node with template-registry: each miss$i is the pushed template under a
# name the node has never seen, so its create pulls it (download, unpack,
# template) before it answers; after each, the template and its layers are
# removed from the node (rm, prune), so every miss is cold. Then creates of
# a template the node has.
chmod 755 "$work"
for i in $(seq 1 "$runs"); do
        HUTCH_DATA_DIR=$work/data in_ns "$hutch" template push bench "127.0.0.1:5000/bench/miss$i" >/dev/null 2>&1
done
mkdir -p "$work/node"
cp "$work/registries.conf" "$work/node/registries.conf"
nsenter --net="/run/netns/$ns" "$hutch" serve --listen 127.0.0.1:5190 --data-dir "$work/node" \
        --run-dir "$work/node-run" --pool-size 0 --on-stop kill \
        --template-registry 127.0.0.1:5000/bench >"$work/node.log" 2>&1 &
node_pid=$!
trap 'kill $node_pid 2>/dev/null; wait $node_pid 2>/dev/null; cleanup' EXIT
for _ in $(seq 100); do in_ns curl -sf http://127.0.0.1:5190/health >/dev/null && break || sleep 0.1; done
key=$(cat "$work/node/api-key")
create_ms() { # templateID -> ms to the 201, and the sandbox removed
        local t0 t1 id
        t0=$(date +%s%N)
        id=$(in_ns curl -sf -XPOST -H "X-API-KEY: $key" -H 'Content-Type: application/json' \
                -d "{\"templateID\":\"$1\"}" http://127.0.0.1:5190/sandboxes |
                python3 -c 'import json, sys; print(json.load(sys.stdin)["sandboxID"])')
        t1=$(date +%s%N)
        in_ns curl -sf -XDELETE -H "X-API-KEY: $key" "http://127.0.0.1:5190/sandboxes/$id" >/dev/null
        echo $(((t1 - t0) / 1000000))
}
miss=() hit=()
for i in $(seq 1 "$runs"); do
        miss+=("$(create_ms "miss$i")")
        HUTCH_DATA_DIR=$work/node "$hutch" template rm "miss$i" >/dev/null 2>&1
        HUTCH_DATA_DIR=$work/node "$hutch" template prune >/dev/null 2>&1
done
create_ms miss1 >/dev/null # pulled again, and kept
for i in $(seq 1 "$runs"); do
        hit+=("$(create_ms miss1)")
done
python3 - "${miss[*]}" "${hit[*]}" <<'PY'
import statistics, sys
for name, v in (("create, template pulled on the miss (cold: no layer on the node)", sys.argv[1]), ("create, template present", sys.argv[2])):
    xs = [int(x) for x in v.split()]
    print(f"| {name} | {statistics.mean(xs):.0f} ± {statistics.pstdev(xs):.0f} ms (min {min(xs)}, n {len(xs)}) |")
PY
