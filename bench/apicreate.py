#!/usr/bin/python3
"""API create at the HTTP level (issue #16): POST /sandboxes → 201 on one
keep-alive connection, timed from the request's first byte to the whole
answer, against a daemon with its warm pool (a pool hit: the create claims
a ready sandbox) and against one without (every create starts a sandbox).
Each create is followed by its kill (not timed) and a pause long enough
for the pool to refill, so that every timed create with the pool is a hit.
Medians and p99 (nearest rank) in ms; markdown on stdout.

    bench/apicreate.py                      # BENCH_AC_N=100 creates each way
    BENCH_AC_N=40 bench/apicreate.py
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from serveclient import HttpConn, ServeDaemon  # noqa: E402

N = int(os.environ.get("BENCH_AC_N", "100"))
BUILD = Path(os.environ.get("HUTCH_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HUTCH = Path(os.environ.get("HUTCH_BIN", BUILD / "hutch"))


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def creates(pool: bool) -> list:
    with tempfile.TemporaryDirectory(prefix="hutch-bench-apicreate-") as work:
        os.chmod(work, 0o755)
        args = ["--run-dir", str(Path(work) / "run"), "--pool-size", "2" if pool else "0"]
        d = ServeDaemon(HUTCH, Path(work) / "data", args)
        d.start()
        try:
            h = [("X-API-KEY", d.key), ("Content-Type", "application/json")]
            body = json.dumps({"templateID": "base", "timeout": 60}).encode()
            times = []
            with HttpConn(d.host, d.port) as c:
                time.sleep(2)  # the pool fills
                for i in range(N + 2):
                    t = time.perf_counter()
                    r = c.request("POST", "/sandboxes", body, headers=h)
                    ms = (time.perf_counter() - t) * 1000
                    assert r.status == 201, (r.status, r.body[:200])
                    if i >= 2:  # the first two warm the connection and the caches
                        times.append(ms)
                    sid = json.loads(r.body)["sandboxID"]
                    assert c.request("DELETE", f"/sandboxes/{sid}", headers=h).status == 204
                    time.sleep(0.3 if pool else 0.05)
            return times
        finally:
            d.stop()


def main():
    print(f"bench: {N} creates with the warm pool, then {N} without", file=sys.stderr)
    hit = creates(True)
    miss = creates(False)
    print(f"### API create → 201 (HTTP, one keep-alive connection, {N} each)\n")
    print("| | p50 ms | p99 ms | min ms |")
    print("|---|---|---|---|")
    for name, v in (("pool hit", hit), ("no pool", miss)):
        print(f"| {name} | {pct(v, 50):.2f} | {pct(v, 99):.2f} | {min(v):.2f} |")


if __name__ == "__main__":
    main()
