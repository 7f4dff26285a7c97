#!/usr/bin/env bash
# `hutch template pull` against `skopeo copy` of the same image to an OCI
# directory, side by side in one run, from a docker-registry on this machine
# (in a network namespace of its own, plain HTTP on 127.0.0.1:5000).
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
