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

import http.client
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

from serveclient import ServeDaemon, envelope  # noqa: E402

MB = int(os.environ.get("BENCH_DP_MB", "64"))
REPS = int(os.environ.get("BENCH_DP_REPS", "5"))
STRACE = os.environ.get("BENCH_DP_STRACE") == "1"
BUILD = Path(os.environ.get("HUTCH_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HUTCH = Path(os.environ.get("HUTCH_BIN", BUILD / "hutch"))
BASELINE = os.environ.get("BENCH_DP_BASELINE", "")
PORT = 8123


def cpu_s(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


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
        payload = os.urandom(MB << 20)

        def read_all(method, path, headers, body=None):
            c = http.client.HTTPConnection(d.host, d.port, timeout=900)
            c.request(method, path, body=body, headers=dict(headers))
            r = c.getresponse()
            n = 0
            while chunk := r.read(1 << 20):
                n += len(chunk)
            c.close()
            return r.status, n

        def download():
            st, n = read_all("GET", d.files_path("/home/user/blob"), d.envd_headers(a, user="user"))
            assert st == 200 and n == MB << 20, (st, n)

        def upload():
            r = d.upload(a, "/home/user/up.bin", payload, user="user", timeout=900)
            assert r.status == 200, r

        def stdout():
            body = envelope({"process": {"cmd": "/bin/sh", "args": ["-c", f"head -c {MB << 20} /home/user/blob"]},
                             "stdin": False})
            st, n = read_all("POST", "/process.Process/Start",
                             d.envd_headers(a, user="user", ctype="application/connect+json"), body)
            assert st == 200 and n > MB << 20, (st, n)

        def ingress():
            st, n = read_all("GET", "/blob", {"E2b-Sandbox-Id": a["sandboxID"], "E2b-Sandbox-Port": str(PORT)})
            assert st == 200 and n == MB << 20, (st, n)

        for name, fn in (("files download", download), ("files upload", upload), ("stdout stream", stdout),
                         ("ingress GET", ingress)):
            fn()  # warm
            tracer = None
            if STRACE:
                out = work / "strace.txt"
                tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(d.proc.pid), "-o", str(out)],
                                          stderr=subprocess.DEVNULL)
                time.sleep(1)
            walls = []
            c0 = cpu_s(d.proc.pid)
            for _ in range(REPS):
                t = time.perf_counter()
                fn()
                walls.append((time.perf_counter() - t) * 1000)
            cpu = (cpu_s(d.proc.pid) - c0) * 1000 / REPS
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
