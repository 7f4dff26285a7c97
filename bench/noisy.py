#!/usr/bin/python3
"""Noisy neighbours (issues #16 and #19 item 7): how long another tenant's
commands.run takes while one team snapshots, restores and forks a sandbox
with a large writable layer, against the same tenant's commands on an idle
daemon, in one run. Markdown on stdout, progress on stderr.

    bench/noisy.py                           # 1 GiB layer, 60 s under load
    BENCH_NOISY_MB=256 BENCH_NOISY_S=20 bench/noisy.py
    BENCH_NOISY_BASELINE=/path/to/other/hutch bench/noisy.py   # the same, then that build
    BENCH_NOISY_LOAD=dataplane bench/noisy.py  # A moves data instead (below)

Team A's sandbox holds BENCH_NOISY_MB of random bytes (incompressible: the
seal compresses and encrypts all of it). Team B's sandbox runs `true`
through process.Process/Start (what the SDK's commands.run sends), one
call after another, on a fresh connection each:
first for BENCH_NOISY_IDLE_N calls with nothing else going on, then for
BENCH_NOISY_S seconds while A's team loops over createSnapshot ->
Sandbox.create(snapshot) -> kill -> deleteSnapshot -> fork(count 1) ->
kill. After each of B's calls a GET /health, which touches no sandbox:
how soon the daemon's loop answers, apart from what B's own processes
wait for on a busy host. Reported: p50 / p99 / max (ms) of both, idle and
under load, the ratio of the p99s (issue target for commands.run: at most
2), how long A's operations took, the daemon's own CPU time while A's loop
ran, and how often the daemon logged its loop busy for more than 250 ms.

BENCH_NOISY_LOAD=dataplane: A's team moves data through the daemon instead
(issue #16's "the proxy's per-sandbox work is bounded the same way"), over
and over: a BENCH_NOISY_MB download of a file (GET /files), the same
upload (POST /files), a command that writes that much to stdout (streamed
to the client), and that many bytes from an HTTP server in A's sandbox
through ingress (E2b-Sandbox-Port). A's client reads as fast as it can.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from serveclient import ServeDaemon  # noqa: E402

MB = int(os.environ.get("BENCH_NOISY_MB", "1024"))
LOAD_S = float(os.environ.get("BENCH_NOISY_S", "60"))
IDLE_N = int(os.environ.get("BENCH_NOISY_IDLE_N", "300"))
BUILD = Path(os.environ.get("HUTCH_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HUTCH = Path(os.environ.get("HUTCH_BIN", BUILD / "hutch"))
BASELINE = os.environ.get("BENCH_NOISY_BASELINE", "")
LOAD = os.environ.get("BENCH_NOISY_LOAD", "snapshots")
INGRESS_PORT = 8123


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def b_call(d, b):
    t = time.perf_counter()
    end, out, _, _ = d.run(b, "true", timeout=600)
    dt = (time.perf_counter() - t) * 1000
    assert end.get("exitCode", 0) == 0 and out == b"", end
    return dt


def health_call(d):
    """The daemon alone (no sandbox): how soon its loop answers."""
    t = time.perf_counter()
    assert d.request("GET", "/health", key="").status == 200
    return (time.perf_counter() - t) * 1000


def a_loop(d, key_a, a, stop, ops, errors):
    """A's team: snapshot, restore, fork, over and over."""
    def timed(name, fn):
        t = time.perf_counter()
        r = fn()
        ops.setdefault(name, []).append((time.perf_counter() - t) * 1000)
        return r

    while not stop.is_set():
        try:
            r = timed("createSnapshot", lambda: d.request("POST", f"/sandboxes/{a['sandboxID']}/snapshots", {},
                                                          key=key_a, timeout=900))
            assert r.status == 201, r
            sid = r.json()["snapshotID"]
            r = timed("Sandbox.create(snapshot)", lambda: d.request("POST", "/sandboxes",
                                                                     {"templateID": sid, "timeout": 600},
                                                                     key=key_a, timeout=900))
            assert r.status == 201, r
            d.request("DELETE", f"/sandboxes/{r.json()['sandboxID']}", key=key_a)
            d.request("DELETE", f"/templates/{sid}", key=key_a)
            if stop.is_set():
                break
            r = timed("fork(count 1)", lambda: d.request("POST", f"/sandboxes/{a['sandboxID']}/fork",
                                                         {"count": 1}, key=key_a, timeout=900))
            assert r.status == 201, r
            for e in r.json():
                if "sandbox" in e:
                    d.request("DELETE", f"/sandboxes/{e['sandbox']['sandboxID']}", key=key_a)
        except Exception as e:  # noqa: BLE001 - reported in the output
            errors.append(repr(e)[:300])
            time.sleep(1)


def dataplane_ops(d, a, mb=MB, port=INGRESS_PORT):
    """[(name, fn)]: the four ways A moves mb MiB through the daemon, each
    answer read as it comes and counted, never kept. A's sandbox holds
    /home/user/blob and serves its home on port (bench/dataplane.py too)."""
    import http.client

    def stream(method, path, headers, body=None):
        """(status, bytes) of a request whose answer is read as it comes and
        counted, never kept (the helpers' client buffers whole bodies)."""
        c = http.client.HTTPConnection(d.host, d.port, timeout=900)
        c.request(method, path, body=body, headers=dict(headers))
        r = c.getresponse()
        n = 0
        while True:
            chunk = r.read(1 << 20)
            if not chunk:
                break
            n += len(chunk)
        c.close()
        return r.status, n

    def fetch(path, headers):
        status, n = stream("GET", path, headers)
        assert status == 200 and n == mb << 20, (path, status, n)

    def download():
        fetch(d.files_path("/home/user/blob"), d.envd_headers(a, user="user"))

    payload = os.urandom(mb << 20)

    def upload():
        r = d.upload(a, "/home/user/up.bin", payload, user="user", timeout=900)
        assert r.status == 200, r

    def stdout_flood():
        """process.Process/Start, its Connect stream read and counted, not
        parsed: the stdout arrives base64 in JSON frames, about 4/3 of it."""
        from serveclient import envelope
        body = envelope({"process": {"cmd": "/bin/sh", "args": ["-c", f"head -c {mb << 20} /home/user/blob"]},
                         "stdin": False})
        status, n = stream("POST", "/process.Process/Start",
                           d.envd_headers(a, user="user", ctype="application/connect+json"), body)
        assert status == 200 and n > mb << 20, (status, n)

    def ingress():
        fetch("/blob", {"E2b-Sandbox-Id": a["sandboxID"], "E2b-Sandbox-Port": str(port)})

    return [("files download", download), ("files upload", upload), ("stdout stream", stdout_flood),
            ("ingress GET", ingress)]


def a_dataplane_loop(d, key_a, a, stop, ops, errors):
    """A's team: downloads, uploads, stdout floods and ingress, over and over."""
    def timed(name, fn):
        t = time.perf_counter()
        fn()
        ops.setdefault(name, []).append((time.perf_counter() - t) * 1000)

    steps = dataplane_ops(d, a)
    while not stop.is_set():
        for name, fn in steps:
            if stop.is_set():
                break
            try:
                timed(f"{name} ({MB} MiB)", fn)
            except Exception as e:  # noqa: BLE001 - reported in the output
                errors.append(f"{name}: {repr(e)[:300]}")
                time.sleep(1)


def run_one(hutch):
    work = Path(tempfile.mkdtemp(prefix="hutch-bench-noisy."))
    work.chmod(0o755)
    d = ServeDaemon(hutch, work / "data", ["--pool-size", "0", "--disk", f"{max(2, MB // 1024 + 2)}G",
                                           "--memory", "1G", "--max-sandboxes-per-team", "10"])
    try:
        d.start()
        key_a = d.key
        out = subprocess.run([str(hutch), "key", "create", "--data-dir", str(d.data_dir), "--team", "noisy-b"],
                             capture_output=True, text=True, check=True).stdout
        key_b = out.strip().splitlines()[-1].strip()
        a = d.create(key=key_a, timeout=3600)
        b = d.create(key=key_b, timeout=3600)
        log(f"{hutch}: writing {MB} MiB of random bytes into A's layer")
        end, o, e, _ = d.run(a, f"dd if=/dev/urandom of=/home/user/blob bs=1M count={MB} status=none && sync && "
                                "echo ok", timeout=3600)
        assert o == b"ok\n", (end, o, e)
        if LOAD == "dataplane":
            d.run(a, f"cd /home/user && nohup python3 -m http.server {INGRESS_PORT} >/dev/null 2>&1 & sleep 1")
        for _ in range(20):
            b_call(d, b)
        log(f"B idle: {IDLE_N} calls")
        idle, idle_h = [], []
        for _ in range(IDLE_N):
            idle.append(b_call(d, b))
            idle_h.append(health_call(d))
        ops, errors = {}, []
        loop = a_dataplane_loop if LOAD == "dataplane" else a_loop
        # A's client in a process of its own: as a thread it shared the GIL
        # with B's timing, and its parsing showed up as B's latency
        import multiprocessing as mp
        stop = mp.Event()
        results = mp.Queue()

        def child():
            o, e = {}, []
            loop(d, key_a, a, stop, o, e)
            results.put((o, e))
        th = mp.Process(target=child, daemon=True)
        log(f"B under A's {LOAD} loop: {LOAD_S:.0f} s")
        mark = len(d.log_tail(1 << 30))
        cpu0 = proc_cpu_s(d.proc.pid)
        th.start()
        load, load_h = [], []
        t_end = time.monotonic() + LOAD_S
        while time.monotonic() < t_end:
            load.append(b_call(d, b))
            load_h.append(health_call(d))
        cpu = proc_cpu_s(d.proc.pid) - cpu0
        stop.set()
        got = results.get(timeout=1800)
        ops.update(got[0])
        errors.extend(got[1])
        th.join(60)
        busy = re.findall(r"the loop was busy for (\d+) ms", d.log_tail(1 << 30)[mark:])
        return idle, load, idle_h, load_h, ops, errors, busy, cpu
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)


def proc_cpu_s(pid):
    """user + system CPU seconds of one process (the daemon's loop is its
    one thread; its workers are processes of their own)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def report(title, idle, load, idle_h, load_h, ops, errors, busy, cpu):
    print(f"#### {title}\n")
    print("| | calls | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
    for name, v in (("B's commands.run('true'), idle", idle), ("B's commands.run('true'), during A's loop", load),
                    ("GET /health, idle", idle_h), ("GET /health, during A's loop", load_h)):
        print(f"| {name} | {len(v)} | {pct(v, 50):.1f} | {pct(v, 99):.1f} | {max(v):.1f} |")
    print(f"\ncommands.run p99 under load / p99 idle: **{pct(load, 99) / pct(idle, 99):.2f}×** (target ≤ 2×); "
          f"p50: {pct(load, 50) / pct(idle, 50):.2f}×; /health p99: {pct(load_h, 99) / pct(idle_h, 99):.2f}×\n")
    print("| A's operation | n | p50 ms | max ms |\n|---|---|---|---|")
    for k, v in ops.items():
        print(f"| {k} | {len(v)} | {pct(v, 50):.0f} | {max(v):.0f} |")
    print(f"\nthe daemon's CPU while A's loop ran: {cpu:.1f} s in {LOAD_S:.0f} s")
    print(f"\nloop busy > 250 ms (daemon log): {len(busy)} time(s)"
          + (f", longest {max(map(int, busy))} ms" if busy else ""))
    if errors:
        print(f"\nA's loop errors: {errors[:3]}")
    print()


def main():
    if os.geteuid() != 0:
        print("noisy benchmark: n/a: run as root (sandboxes need it)")
        return 0
    what = (f"{MB} MiB downloads, uploads, stdout streams and ingress" if LOAD == "dataplane"
            else f"snapshots of a {MB} MiB layer")
    print(f"### Noisy neighbours: another team's commands.run during {what}\n")
    print(f"`BENCH_NOISY_LOAD={LOAD} BENCH_NOISY_MB={MB} BENCH_NOISY_S={LOAD_S:.0f} BENCH_NOISY_IDLE_N={IDLE_N} "
          "bench/noisy.py`\n")
    report(f"{HUTCH}", *run_one(HUTCH))
    if BASELINE:
        report(f"{BASELINE} (baseline)", *run_one(Path(BASELINE)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
