#!/usr/bin/python3
"""What one MiB of data-plane traffic costs the daemon (issues #16 and #19
item 7): one daemon, one sandbox holding BENCH_DP_MB of random bytes, and
BENCH_DP_REPS of each operation, one at a time: a download (GET /files), an
upload (POST /files), a command's stdout streamed to the client (the
Connect stream read to its end) and a GET through ingress. For each, the
median wall time and the daemon's own CPU time per operation (utime +
stime from /proc, the loop being its one thread). With BENCH_DP_STRACE=1
also the daemon's system calls per operation (strace -c -f, which slows
it: its wall and CPU times are then not comparable). Markdown on stdout.

    bench/dataplane.py
    BENCH_DP_BASELINE=/path/to/other/hutch bench/dataplane.py   # the same, then that build
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

sys.path.insert(0, str(ROOT / "bench"))

from noisy import dataplane_ops, proc_cpu_s  # noqa: E402
from serveclient import ServeDaemon  # noqa: E402

MB = int(os.environ.get("BENCH_DP_MB", "64"))
REPS = int(os.environ.get("BENCH_DP_REPS", "5"))
STRACE = os.environ.get("BENCH_DP_STRACE") == "1"
BUILD = Path(os.environ.get("HUTCH_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HUTCH = Path(os.environ.get("HUTCH_BIN", BUILD / "hutch"))
BASELINE = os.environ.get("BENCH_DP_BASELINE", "")
PORT = 8123


def run_one(hutch):
    work = Path(tempfile.mkdtemp(prefix="hutch-bench-dp."))
    work.chmod(0o755)
    d = ServeDaemon(hutch, work / "data", ["--pool-size", "0", "--disk", "3G", "--memory", "1G"])
    rows = []
    try:
        d.start()
        a = d.create(timeout=3600)
        end, o, _, _ = d.run(a, f"dd if=/dev/urandom of=/home/user/blob bs=1M count={MB} status=none && sync && "
                                "echo ok", timeout=3600)
        assert o == b"ok\n", end
        d.run(a, f"cd /home/user && (setsid python3 -m http.server {PORT} >/dev/null 2>&1 &) && sleep 1")
        for name, fn in dataplane_ops(d, a, MB, PORT):
            fn()  # warm
            tracer = None
            if STRACE:
                out = work / "strace.txt"
                tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(d.proc.pid), "-o", str(out)],
                                          stderr=subprocess.DEVNULL)
                time.sleep(1)
            walls = []
            c0 = proc_cpu_s(d.proc.pid)
            for _ in range(REPS):
                t = time.perf_counter()
                fn()
                walls.append((time.perf_counter() - t) * 1000)
            cpu = (proc_cpu_s(d.proc.pid) - c0) * 1000 / REPS
            calls = ""
            if tracer:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(60)
                total = [ln for ln in out.read_text().splitlines() if ln.rstrip().endswith("total")]
                calls = f"{int(total[0].split()[3]) // REPS}" if total else "?"
            walls.sort()
            rows.append((name, walls[len(walls) // 2], cpu, calls))
        return rows
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(title, rows):
    print(f"#### {title}\n")
    print(f"| operation ({MB} MiB) | wall p50 ms | daemon CPU ms / op | daemon CPU ms / MiB |"
          + (" system calls / op |" if STRACE else ""))
    print("|---|---|---|---|" + ("---|" if STRACE else ""))
    for name, wall, cpu, calls in rows:
        print(f"| {name} | {wall:.0f} | {cpu:.0f} | {cpu / MB:.2f} |" + (f" {calls} |" if STRACE else ""))
    print()


def main():
    if os.geteuid() != 0:
        print("data-plane benchmark: n/a: run as root (sandboxes need it)")
        return 0
    print(f"### The daemon's cost per byte: {REPS} × each {MB} MiB operation\n")
    print(f"`BENCH_DP_MB={MB} BENCH_DP_REPS={REPS}{' BENCH_DP_STRACE=1' if STRACE else ''} bench/dataplane.py`\n")
    report(str(HUTCH), run_one(HUTCH))
    if BASELINE:
        report(f"{BASELINE} (baseline)", run_one(Path(BASELINE)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
