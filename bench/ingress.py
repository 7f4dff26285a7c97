#!/usr/bin/python3
"""Ingress cost (issue #14): a request to a server inside a sandbox through
hutch (E2b-Sandbox-Id/Port headers on the daemon's port) against the same
request sent directly from inside the sandbox's netns, in one run, and the
throughput of a large body both ways. Markdown on stdout, progress on stderr.

    bench/ingress.py                              # what `make bench` runs
    BENCH_INGRESS_N=500 BENCH_INGRESS_MB=100 bench/ingress.py
    BENCH_INGRESS_BACKEND=gvisor BENCH_INGRESS_MB=20 bench/ingress.py

The server is tests/e2b/fixtures/ingress_server.py (Python's threading
http.server) on port 8000 of one sandbox. The client is
bench/ingress_client.py, the same program both times: inside the sandbox
(through envd) to 127.0.0.1:8000, and on the host to the daemon. Both keep
one connection alive for the N requests.
"""

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from serveclient import ServeDaemon  # noqa: E402

N = int(os.environ.get("BENCH_INGRESS_N", "300"))
MB = int(os.environ.get("BENCH_INGRESS_MB", "100"))
BACKEND = os.environ.get("BENCH_INGRESS_BACKEND", "ns")
BUILD = Path(os.environ.get("HUTCH_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HUTCH = Path(os.environ.get("HUTCH_BIN", BUILD / "hutch"))
CLIENT = ROOT / "bench" / "ingress_client.py"
SERVER = ROOT / "tests" / "e2b" / "fixtures" / "ingress_server.py"


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    with tempfile.TemporaryDirectory(prefix="hutch-bench-ingress-") as work:
        os.chmod(work, 0o755)
        d = ServeDaemon(HUTCH, Path(work) / "data", ["--run-dir", str(Path(work) / "run"), "--pool-size", "0",
                                                      "--memory", "1G", "--backend", BACKEND])
        d.start()
        try:
            sb = d.create(timeout=600)
            for src, dst in ((SERVER, "/tmp/server.py"), (CLIENT, "/tmp/client.py")):
                assert d.upload(sb, dst, src.read_bytes()).status == 200
            d.run(sb, "(setsid python3 /tmp/server.py 8000 >/dev/null 2>&1 &)")
            time.sleep(1)
            log(f"direct: {N} requests and {MB} MiB each way inside the sandbox")
            end, out, err, _ = d.run(sb, f"python3 /tmp/client.py 127.0.0.1 8000 {N} {MB}", timeout=600)
            assert end.get("exitCode", 0) == 0, err
            direct = json.loads(out)
            log("through hutch")
            import subprocess
            cp = subprocess.run([sys.executable, str(CLIENT), d.host, str(d.port), str(N), str(MB),
                                 f"E2b-Sandbox-Id:{sb['sandboxID']}", "E2b-Sandbox-Port:8000"],
                                capture_output=True, text=True, timeout=600)
            assert cp.returncode == 0, cp.stderr
            via = json.loads(cp.stdout)
        finally:
            d.stop()
    dl, vl = direct["lat_ms"], via["lat_ms"]
    dm, vm = statistics.median(dl), statistics.median(vl)
    print(f"### Ingress ({BACKEND}): {N} GETs on one keep-alive connection, {MB} MiB each way\n")
    print("| | direct, inside the netns | through hutch | ratio |")
    print("|---|---|---|---|")
    print(f"| GET / p50 (ms) | {dm:.3f} | {vm:.3f} | {vm / dm:.2f}x |")
    print(f"| GET / p99 (ms) | {pct(dl, 99):.3f} | {pct(vl, 99):.3f} | {pct(vl, 99) / pct(dl, 99):.2f}x |")
    print(f"| download (MB/s) | {direct['down_mbs']:.0f} | {via['down_mbs']:.0f} | "
          f"{100 * via['down_mbs'] / direct['down_mbs']:.0f}% |")
    print(f"| upload (MB/s) | {direct['up_mbs']:.0f} | {via['up_mbs']:.0f} | "
          f"{100 * via['up_mbs'] / direct['up_mbs']:.0f}% |")


if __name__ == "__main__":
    main()
