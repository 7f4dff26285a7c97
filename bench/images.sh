#!/usr/bin/env bash
# `hutch run -- /bin/true` from a python-sized multi-layer image template
# against the host template, interleaved in one run (issue 13: within 10%).
# The image is built here, offline, from the host's own files (7 layers: a
# base with libc and coreutils, the Python 3 standard library, the python3
# binary, zoneinfo, perl's modules, locales, a small config layer), written
# as an OCI layout and imported with `hutch template import` (its time is
# printed too: the one-off cost of the first import, and of a second import
# whose layers are all in the store already).
#
# Where runsc is installed, the same pair then runs on the gvisor backend
# (the image's layers stacked by a read-only overlay on the host as runsc's
# root, against the host template served as it is), BENCH_GVISOR_N rounds.
#
#   bench/images.sh                    # BENCH_N=100 rounds, BENCH_GVISOR_N=30
#   BENCH_N=20 bench/images.sh
#   BENCH_GVISOR_N=0 bench/images.sh   # no gvisor rounds
#
# Prints markdown on stdout, progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
N=${BENCH_N:-100}
GN=${BENCH_GVISOR_N:-30}
BUILD=${HUTCH_BUILD_DIR:-build}
HUTCH=${HUTCH_BIN:-$BUILD/hutch}
[[ -x $HUTCH || -n ${HUTCH_BIN:-} || ! -x $BUILD/cli/hutch ]] || HUTCH=$BUILD/cli/hutch
HUTCH=$(realpath "$HUTCH")

work=$(mktemp -d /tmp/hutch-bench-images.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
export HUTCH_DATA_DIR=$work/data

echo "bench: building the image" >&2
"$PY" - "$work/oci" <<'EOF'
import os, sys, tarfile, json
sys.path.insert(0, "tests/helpers")
import ociimage as oi

out = sys.argv[1]
tmp = out + ".layers"
os.makedirs(tmp)
def layer(i, paths, extra=()):
    p = os.path.join(tmp, f"{i}.tar")
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as t:
        for name, target in extra:
            ti = tarfile.TarInfo(name); ti.type = tarfile.SYMTYPE; ti.linkname = target
            t.addfile(ti)
        for src in paths:
            if os.path.exists(src):
                t.add(src, arcname=src.lstrip("/"), recursive=True)
    return open(p, "rb").read()

libs = [f"/usr/lib/x86_64-linux-gnu/{n}" for n in os.listdir("/usr/lib/x86_64-linux-gnu")
        if n.startswith(("ld-linux", "libc.so", "libm.so", "libz.so", "libexpat", "libffi", "libssl", "libcrypto",
                         "libsqlite3", "liblzma", "libbz2", "libreadline", "libtinfo", "libncurses",
                         "libuuid", "libselinux", "libpcre2", "libacl", "libattr", "libgmp"))]
base = ["/usr/lib64", "/usr/bin/true", "/usr/bin/env", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/sh",
        "/usr/bin/dash", "/usr/bin/bash", "/etc/os-release", "/etc/passwd", "/etc/group"] + libs
layers = [
    layer(1, base, [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")]),
    layer(2, ["/usr/lib/python3.11"]),
    layer(3, ["/usr/bin/python3.11", "/usr/bin/python3"]),
    layer(4, ["/usr/share/zoneinfo"]),
    layer(5, ["/usr/share/perl", "/usr/lib/x86_64-linux-gnu/perl-base"]),
    layer(6, ["/usr/share/i18n", "/usr/share/locale"]),
    layer(7, ["/etc/ssl/certs/ca-certificates.crt"]),
]
oi.write_oci_layout(out, layers, compression=None, env=["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
                    cmd=["python3"])
files = sum(len(tarfile.open(os.path.join(tmp, f"{i}.tar")).getmembers()) for i in range(1, 8))
size = sum(len(l) for l in layers)
print(f"{len(layers)} layers, {files} entries, {size / 2**20:.0f} MiB uncompressed", file=open(out + ".desc", "w"))
EOF
desc=$(cat "$work/oci.desc")
t0=$(date +%s.%N)
"$HUTCH" template import "$work/oci" --name bench-py >/dev/null 2>&1
t1=$(date +%s.%N)
"$HUTCH" template import "$work/oci" --name bench-py2 >/dev/null 2>&1
t2=$(date +%s.%N)
"$HUTCH" run --template bench-py -- /usr/bin/python3 -c 'import json, sqlite3, ssl' >/dev/null
"$HUTCH" run -- /bin/true >/dev/null # builds the host template outside the rounds

echo "## Image template vs host: \`hutch run -- /bin/true\`"
echo
echo "Image: $desc (host files; bench/images.sh)."
printf 'First import: %.2f s; a second import of the same image (every layer already in the store): %.2f s.\n\n' \
        "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
"$PY" bench/timeit.py --rounds "$N" --warmup 3 --ref "hutch run (host)" \
        --title "One sandbox at a time, $N interleaved rounds" \
        --label "$work=\$WORK" \
        --tool "hutch run (host)=$HUTCH run -- /bin/true" \
        --tool "hutch run (7-layer image)=$HUTCH run --template bench-py -- /bin/true"
if ((GN > 0)) && { [[ -x /usr/bin/runsc ]] || [[ -x /usr/local/bin/runsc ]]; }; then
        "$HUTCH" run --backend gvisor --template bench-py -- /bin/true >/dev/null
        echo
        "$PY" bench/timeit.py --rounds "$GN" --warmup 2 --timeout 60 --ref "hutch run --backend gvisor (host)" \
                --title "The gvisor backend: one sandbox at a time, $GN interleaved rounds" \
                --label "$work=\$WORK" \
                --tool "hutch run --backend gvisor (host)=$HUTCH run --backend gvisor -- /bin/true" \
                --tool "hutch run --backend gvisor (7-layer image)=$HUTCH run --backend gvisor --template bench-py -- /bin/true"
fi
"$HUTCH" template rm bench-py bench-py2 >/dev/null
