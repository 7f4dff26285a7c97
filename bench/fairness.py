#!/usr/bin/python3
"""Fairness between teams (issue #19 item 2, docs/design.md §3.1
"Admission"): team B's latency with the daemon otherwise idle, and while
team A fires bursts of parallel creates. The warm pool is off, so every
create of A's is a real one. Starts its own `hutch serve` (temporary data
dir, the host's run dir) for each backend. Markdown on stdout.

    HUTCH_BIN=build/hutch bench/fairness.py [--backend ns,gvisor] [--burst 20] [--samples 20]

What B measures, one after the other, each on a fresh connection:
  health      GET /health
  run         process.Start `true` in B's running sandbox, to its end event
              (what the SDK's commands.run does)
  create+run  a create, then process.Start `true` in the new sandbox (the
              kill after it is not timed)
  resume      a resume of B's paused sandbox (pause not timed; on ns a thaw,
              on gvisor a restore of its checkpoint)
A burst's B samples are those that B sent while A had creates in flight. p99 is the nearest rank: with fewer than 100
samples, the largest.
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("HUTCH_BIN", str(ROOT / "build" / "hutch"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, headers=None, timeout=600):
    """One request on a fresh connection: (status, body bytes). Hand-written
    HTTP/1.1, Content-Length or chunked answers."""
    hdrs = dict(headers or {})
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
            *(f"{k}: {v}" for k, v in hdrs.items())]
    if body is not None:
        head.append(f"Content-Length: {len(body)}")
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out = b""
        while rest:
            line, _, rest = rest.partition(b"\r\n")
            n = int(line.split(b";")[0], 16)
            if n == 0:
                break
            out += rest[:n]
            rest = rest[n + 2:]
        rest = out
    return status, rest


def start_body(cmd):
    msg = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": False}).encode()
    return struct.pack(">BI", 0, len(msg)) + msg


def envd(sb):
    return {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sb["envdAccessToken"], "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1"}


def run_true(port, sb):
    st, body = request(port, "POST", "/process.Process/Start", start_body("true"), envd(sb))
    assert st == 200 and b'"end"' in body, (st, body[:300])


def create(port, key, timeout=600):
    st, body = request(port, "POST", "/v2/sandboxes", {"templateID": "base", "timeout": timeout},
                       {"X-API-KEY": key})
    assert st == 201, (st, body)
    return json.loads(body)


def kill(port, key, sid):
    request(port, "DELETE", f"/sandboxes/{sid}", headers={"X-API-KEY": key})


def pctl(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, max(0, int(round(q * len(v) + 0.5)) - 1))] if v else float("nan")


class Daemon:
    def __init__(self, backend):
        self.tmp = Path(tempfile.mkdtemp(prefix="hutch-bench-fair."))
        self.tmp.chmod(0o755)
        self.port = free_port()
        self.log = open(self.tmp / "serve.log", "wb")
        self.proc = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{self.port}",
                                      "--data-dir", str(self.tmp / "data"), "--pool-size", "0",
                                      "--backend", backend, "--max-sandboxes-per-team", "1000",
                                      "--on-stop", "kill"],  # its data dir goes: nothing may outlive it
                                     stdout=self.log, stderr=self.log)
        for _ in range(600):
            try:
                if request(self.port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        self.key_a = (self.tmp / "data" / "api-key").read_text().strip()
        cp = subprocess.run([BIN, "key", "create", "--data-dir", str(self.tmp / "data"), "--team", "bench-b"],
                            capture_output=True, text=True, check=True)
        self.key_b = cp.stdout.strip().splitlines()[-1].strip()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        subprocess.run(["rm", "-rf", str(self.tmp)])


OPS = ("health", "run", "create+run", "resume")


def b_sample(d, sb, paused, op, out):
    """One timed sample of one of B's operations (set-up and clean-up untimed)."""
    if op == "resume":
        st, _ = request(d.port, "POST", f"/sandboxes/{paused['sandboxID']}/pause", {}, {"X-API-KEY": d.key_b})
        assert st in (204, 409), st
    made = []
    t = time.monotonic()
    if op == "health":
        assert request(d.port, "GET", "/health")[0] == 200
    elif op == "run":
        run_true(d.port, sb)
    elif op == "create+run":
        made.append(create(d.port, d.key_b))
        run_true(d.port, made[-1])
    else:
        st, body = request(d.port, "POST", f"/sandboxes/{paused['sandboxID']}/resume", {"timeout": 3600},
                           {"X-API-KEY": d.key_b})
        assert st == 201, (st, body)
    out.setdefault(op, []).append(time.monotonic() - t)
    for m in made:
        kill(d.port, d.key_b, m["sandboxID"])


def bench(backend, burst, samples):
    d = Daemon(backend)
    try:
        sb = create(d.port, d.key_b, 3600)
        paused = create(d.port, d.key_b, 3600)
        idle = {}
        for _ in range(samples):
            for op in OPS:
                b_sample(d, sb, paused, op, idle)
        during, a_lat, bursts = {}, [], 0
        active, stop = threading.Event(), threading.Event()

        def a_bursts():
            nonlocal bursts
            while not stop.is_set():
                made, lat = [], []

                def one():
                    t = time.monotonic()
                    made.append(create(d.port, d.key_a))
                    lat.append(time.monotonic() - t)
                ts = [threading.Thread(target=one) for _ in range(burst)]
                active.set()
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                active.clear()
                bursts += 1
                a_lat.extend(lat)
                ks = [threading.Thread(target=kill, args=(d.port, d.key_a, m["sandboxID"])) for m in made]
                for t in ks:
                    t.start()
                for t in ks:
                    t.join()
                # the teardowns end outside B's window: their state dirs go last
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and any(
                        (Path("/run/hutch/sandboxes") / m["sandboxID"]).exists() for m in made):
                    time.sleep(0.1)

        th = threading.Thread(target=a_bursts)
        th.start()
        while True:
            op = min(OPS, key=lambda k: len(during.get(k, [])))
            if len(during.get(op, [])) >= samples:
                break
            active.wait()
            b_sample(d, sb, paused, op, during)  # sent while A's creates are in flight
        stop.set()
        th.join()
        return idle, during, a_lat, bursts
    finally:
        d.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ns,gvisor")
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--samples", type=int, default=20)
    a = ap.parse_args()
    print(f"`{BIN}`, bursts of {a.burst} parallel creates by team A, pool off\n")
    print("| backend | team B's | idle median | idle p99 | during A's burst: median | p99 | n (idle/burst) |")
    print("|---|---|---|---|---|---|---|")
    for backend in a.backend.split(","):
        if backend == "gvisor" and not os.access("/usr/bin/runsc", os.X_OK):
            print(f"| gvisor | (runsc not installed) | | | | | |")
            continue
        idle, during, a_lat, bursts = bench(backend, a.burst, a.samples)
        for k in OPS:
            i, b = idle.get(k, []), during.get(k, [])
            print(f"| {backend} | {k} | {pctl(i, .5) * 1000:.1f} ms | {pctl(i, .99) * 1000:.1f} ms | "
                  f"{pctl(b, .5) * 1000:.1f} ms | {pctl(b, .99) * 1000:.1f} ms | {len(i)}/{len(b)} |")
        print(f"| {backend} | (A's own creates in the bursts) | | | {pctl(a_lat, .5) * 1000:.1f} ms | "
              f"{pctl(a_lat, .99) * 1000:.1f} ms | {len(a_lat)} in {bursts} bursts |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
