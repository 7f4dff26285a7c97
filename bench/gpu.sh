#!/usr/bin/env bash
# GPU sandboxes on a machine with an NVIDIA GPU (docs/gpu.md): nvidia-smi and
# a CUDA check (libcuda through ctypes: no CUDA toolkit needed) inside
# `hutch run --gpus 1`, the start time with and without a GPU, what a
# sandbox without --gpus sees, and the usage ledger's GPU figures from a
# daemon (NVML). Prints markdown; exits 0 with a message where there is no
# GPU, 1 when a check fails.
#
#   bench/gpu.sh                 # as root
#   GPU_BENCH_N=20 bench/gpu.sh  # more start-time rounds (default 10)
#
# Environment: HUTCH_BUILD_DIR (build), HUTCH_BIN, HUTCH_GPU_DEV_DIR (/dev),
# HUTCH_GPU_DRIVER_ROOT (/), GPU_BENCH_N, GPU_BENCH_SKIP_SERVE=1 (no daemon part).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=/usr/bin/python3
N=${GPU_BENCH_N:-10}
BUILD=${HUTCH_BUILD_DIR:-build}
HUTCH=${HUTCH_BIN:-$BUILD/hutch}
[[ -x $HUTCH || -n ${HUTCH_BIN:-} || ! -x $BUILD/cli/hutch ]] || HUTCH=$BUILD/cli/hutch
DEV=${HUTCH_GPU_DEV_DIR:-/dev}

log() { echo "bench/gpu.sh: $*" >&2; }
fail=0
check() { # check NAME OK(0/1) DETAIL
        if [[ $2 == 0 ]]; then echo "| $1 | ok | $3 |"; else echo "| $1 | FAIL | $3 |"; fail=1; fi
}

shopt -s nullglob
gpus=("$DEV"/nvidia[0-9]*)
if ((${#gpus[@]} == 0)); then
        echo "bench/gpu.sh: no NVIDIA GPU on this host (no $DEV/nvidia0, nvidia1, ...): nothing to measure"
        exit 0
fi
if [[ ! -x $HUTCH ]]; then
        log "$HUTCH is not built (make build, or HUTCH_BIN)"
        exit 1
fi
if [[ $(id -u) != 0 ]]; then
        log "run as root (hutch run makes sandboxes)"
        exit 1
fi

echo "## GPU sandboxes ($(date -u +%Y-%m-%dT%H:%MZ), $(uname -r))"
echo
echo "Host: ${#gpus[@]} GPU node(s) in $DEV."
if command -v nvidia-smi >/dev/null; then
        echo
        echo '```'
        nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 || true
        echo '```'
fi
echo
echo "| check | result | detail |"
echo "|---|---|---|"

# 1. nvidia-smi inside: one GPU, from the driver's programs hutch mounts
out=$(timeout 120 "$HUTCH" run --gpus 1 -- nvidia-smi --query-gpu=index,name,memory.total,memory.used \
        --format=csv,noheader 2>&1) && rc=0 || rc=$?
lines=$(printf '%s\n' "$out" | grep -c . || true)
check "nvidia-smi in \`--gpus 1\`" $((rc != 0 || lines != 1)) "$(printf '%s' "$out" | tr '\n' ';')"

# 2. what a sandbox without --gpus sees: no node, and libcuda finds no device
out=$(timeout 120 "$HUTCH" run -- sh -c 'ls /dev | grep -c "^nvidia" || true' 2>&1) && rc=0 || rc=$?
check "no GPU without \`--gpus\`" $((rc != 0 || out != 0)) "nvidia nodes in /dev: $out"

# 3. CUDA through the driver API: init, the device, a context, 256 MiB set
#    and read back, the memory figures
CUDA_CHECK='
import ctypes, sys, time
t0 = time.perf_counter()
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        print("FAIL %s: CUresult %d" % (what, r)); sys.exit(1)
ck(cu.cuInit(0), "cuInit")
t_init = time.perf_counter() - t0
n = ctypes.c_int(); ck(cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
name = ctypes.create_string_buffer(256); ck(cu.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
total = ctypes.c_size_t(); ck(cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem")
ctx = ctypes.c_void_p(); ck(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
size = 256 << 20
ptr = ctypes.c_uint64()
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cu.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
ck(cu.cuMemAlloc_v2(ctypes.byref(ptr), size), "cuMemAlloc")
ck(cu.cuMemsetD8_v2(ptr.value, 0x5a, size), "cuMemsetD8")
buf = (ctypes.c_ubyte * 4096)()
ck(cu.cuMemcpyDtoH_v2(buf, ptr.value + size - 4096, 4096), "cuMemcpyDtoH")
ok = all(b == 0x5a for b in buf)
free = ctypes.c_size_t(); tot = ctypes.c_size_t()
ck(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(tot)), "cuMemGetInfo")
print("devices=%d name=%s total_mib=%d free_mib=%d cuInit_ms=%.1f readback=%s" % (
    n.value, name.value.decode(), total.value >> 20, free.value >> 20, t_init * 1000, "ok" if ok else "WRONG"))
sys.exit(0 if ok and n.value == 1 else 1)
'
out=$(timeout 300 "$HUTCH" run --gpus 1 -- python3 -c "$CUDA_CHECK" 2>&1) && rc=0 || rc=$?
check "CUDA driver API in \`--gpus 1\`" "$((rc != 0))" "$(printf '%s' "$out" | tr '\n' ';')"

# 4. start time of `hutch run -- true`, without and with a GPU (wall clock,
#    median of N, interleaved)
times=$($PY - "$HUTCH" "$N" <<'EOF'
import statistics, subprocess, sys, time
hutch, n = sys.argv[1], int(sys.argv[2])
runs = {"without": [], "with --gpus 1": []}
for _ in range(n):
    for k, extra in (("without", []), ("with --gpus 1", ["--gpus", "1"])):
        t = time.perf_counter()
        subprocess.run([hutch, "run", *extra, "--", "true"], check=True, timeout=120)
        runs[k].append((time.perf_counter() - t) * 1000)
for k, v in runs.items():
    print("%s: median %.1f ms, min %.1f ms, max %.1f ms (n=%d)" % (k, statistics.median(v), min(v), max(v), len(v)))
EOF
) && rc=0 || rc=$?
check "start time, \`hutch run -- true\`" "$((rc != 0))" "$(printf '%s' "$times" | tr '\n' ';')"

# 5. the usage ledger of a daemon: GPU-ms and the GPU memory NVML saw
if [[ ${GPU_BENCH_SKIP_SERVE:-0} != 1 ]]; then
        out=$($PY - "$HUTCH" <<'EOF' 2>&1
import os, sys, tempfile, time
sys.path.insert(0, "tests/helpers")
from serveclient import ServeDaemon
from pathlib import Path
hutch = Path(sys.argv[1])
with tempfile.TemporaryDirectory(prefix="hutch-gpu-bench.") as tmp:
    d = ServeDaemon(hutch, Path(tmp) / "data", [
        "--pool-size", "0", "--metrics-interval", "1s",
        "--gpu-dev-dir", os.environ.get("HUTCH_GPU_DEV_DIR", "/dev"),
        "--gpu-driver-root", os.environ.get("HUTCH_GPU_DRIVER_ROOT", "/"),
        "--gpu-proc-dir", os.environ.get("HUTCH_GPU_PROC_DIR", "/proc/driver/nvidia")])
    d.start()
    try:
        sb = d.create(gpus=1)
        code = ("import ctypes, time; cu = ctypes.CDLL('libcuda.so.1'); cu.cuInit(0); d = ctypes.c_int(); "
                "cu.cuDeviceGet(ctypes.byref(d), 0); c = ctypes.c_void_p(); cu.cuCtxCreate_v2(ctypes.byref(c), 0, d); "
                "p = ctypes.c_uint64(); cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]; "
                "print(cu.cuMemAlloc_v2(ctypes.byref(p), 512 << 20)); time.sleep(4)")
        end, out, err, _ = d.run(sb, "python3 -c \"%s\"" % code)
        assert d.kill(sb["sandboxID"]).status == 204
        time.sleep(1)
        row = {r["sandboxID"]: r for r in d.request("GET", "/usage").json()["rows"]}[sb["sandboxID"]]
        peak = row["gpu_memory_peak_bytes"]
        print("gpus=%d gpu_ms=%d gpu_memory_peak_mib=%s (a 512 MiB allocation held 4 s)" % (
            row["gpus"], row["gpu_ms"], "not measured" if peak is None else peak >> 20))
        sys.exit(0 if peak is not None and peak >= 512 << 20 else 1)
    finally:
        d.stop()
EOF
        ) && rc=0 || rc=$?
        check "ledger (hutch serve, NVML)" "$((rc != 0))" "$(printf '%s' "$out" | tail -3 | tr '\n' ';')"
fi

echo
if ((fail)); then
        echo "Some checks failed."
        exit 1
fi
echo "Every check passed."
