"""The usage ledger (issue 15, docs/usage.md), through the daemon, the API
and `hutch usage`.

- A sandbox made to burn a known CPU time, allocate a known amount of
  memory and write a known file is billed that (from the cgroup's own
  counters, read again when it ends, so a short life loses nothing), with
  the memory reservation exactly its limit times its lifetime.
- A sandbox that lives across a daemon restart is not counted twice.
- Totals are the exact integer sums of the rows, in the API and the CLI.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
import time

from serveclient import ServeDaemon

BURN = ("import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n")
ALLOC = ("b = bytearray(256 << 20)\nb[::4096] = b'\\x01' * (len(b) // 4096)\nprint(len(b))\n")


def _run(d, sb, code):
    end, out, err, _ = d.run(sb, "python3 -c " + shlex.quote(code))
    assert end.get("exitCode", 0) == 0, (end, out, err)
    return out


def _usage(d, **q):
    qs = "&".join(f"{k}={v}" for k, v in q.items())
    r = d.request("GET", "/usage" + ("?" + qs if qs else ""))
    assert r.status == 200, r
    return r.json()


def _row(data, sid):
    db = sqlite3.connect(f"file:{data}/hutch.db?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM usage WHERE sandbox_id = ?", (sid,)).fetchone())
    finally:
        db.close()


ADDITIVE = ("cpu_ns", "memory_reserved_mib_ms", "disk_kib_ms", "processes")


def test_ledger_bills_what_the_sandbox_did(sandboxed_hutch, tmp_path):
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--metrics-interval", "1s"])
    d.start()
    try:
        sb = d.create()
        sid = sb["sandboxID"]
        t0 = time.monotonic()
        _run(d, sb, BURN.format(s=1.0))
        assert _run(d, sb, ALLOC) == b"268435456\n"
        d.run(sb, "head -c 48M /dev/zero > /home/user/blob && sync")
        wall = time.monotonic() - t0
        assert d.kill(sid).status == 204
        other = d.create()
        _run(d, other, BURN.format(s=0.2))

        rep = _usage(d)
        rows = {r["sandboxID"]: r for r in rep["rows"]}
        r = rows[sid]
        # the kernel's counters: at least what was burnt, at most what the
        # wall clock allowed on the sandbox's CPUs
        assert 1.0e9 <= r["cpu_ns"] <= (wall + 2) * 1e9 * 2, r
        assert r["memory_peak_bytes"] >= 256 << 20, r
        assert r["disk_peak_bytes"] >= 48 << 20, r
        assert r["processes"] == 3 and r["endedAt"] is not None, r
        db = _row(data, sid)
        assert db["memory_reserved_mib_ms"] == db["memory_mb"] * (db["ended_ms"] - db["started_ms"]), db
        assert db["disk_kib_ms"] > 0

        # totals are the sums of the rows, exactly (integers)
        for k in ADDITIVE:
            assert rep["total"][k] == sum(x[k] for x in rep["rows"]), k
        for k in ("allowed_bytes_out", "allowed_bytes_in", "denied"):
            assert rep["total"]["egress"][k] == sum(x["egress"][k] for x in rep["rows"]), k
        by_day = _usage(d, by="day")
        assert by_day["total"] == rep["total"]
        assert _usage(d, until="2000-01-01")["rows"] == []
        assert d.request("GET", "/usage?by=week").status == 400

        # the CLI beside the running daemon: TOTAL is the sum of its rows
        cp = subprocess.run([str(sandboxed_hutch), "usage", "--data-dir", str(data), "--team", "default"],
                            capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        lines = [l.split() for l in cp.stdout.splitlines()[1:]]
        body, total = lines[:-1], lines[-1]
        assert total[0] == "TOTAL" and {l[0] for l in body} >= {sid}
        for col in (1, 2, 4, 5, 6, 7, 8):
            assert int(total[col]) == sum(int(l[col]) for l in body), (col, cp.stdout)
        assert int(next(l for l in body if l[0] == sid)[1]) >= 1000
    finally:
        d.stop()


def test_ledger_counts_once_across_a_restart(sandboxed_hutch, tmp_path):
    data = tmp_path / "data"
    args = ["--pool-size", "0", "--metrics-interval", "1s"]
    d = ServeDaemon(sandboxed_hutch, data, args)
    d.start()
    sb = d.create()
    sid = sb["sandboxID"]
    _run(d, sb, BURN.format(s=0.6))
    time.sleep(1.5)  # a sample, written
    d.proc.terminate()   # on-stop keep: the sandbox runs on
    d.proc.wait(20)
    d2 = ServeDaemon(sandboxed_hutch, data, args)
    d2.created = dict(d.created)
    d2.start()
    try:
        _run(d2, sb, BURN.format(s=0.6))
        time.sleep(1.5)
        assert d2.kill(sid).status == 204
        r = {x["sandboxID"]: x for x in _usage(d2)["rows"]}[sid]
        # 1.2 s burnt in all; counted twice would be >= 1.8 s
        assert 1.2e9 <= r["cpu_ns"] < 1.7e9, r
        assert r["processes"] == 2, r
        db = _row(data, sid)
        assert db["memory_reserved_mib_ms"] == db["memory_mb"] * (db["ended_ms"] - db["started_ms"]), db
    finally:
        d2.stop()


def test_an_oom_kill_is_in_the_ledger_and_the_trail(sandboxed_hutch, tmp_path):
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--memory", "64M"])
    d.start()
    try:
        sb = d.create()
        sid = sb["sandboxID"]
        end, _, _, _ = d.run(sb, "python3 -c " + shlex.quote(ALLOC))
        assert end.get("exitCode", 0) != 0, end     # killed by the memory limit
        assert d.kill(sid).status == 204
        r = {x["sandboxID"]: x for x in _usage(d)["rows"]}[sid]
        assert r["oom_kills"] >= 1, r
        ev = d.request("GET", f"/sandboxes/{sid}/events?limit=1000").json()
        final = [e["detail"] for e in ev if e["type"] == "sandbox.final"]
        assert len(final) == 1 and final[0]["oom_kills"] >= 1 and final[0]["cpu_ns"] == r["cpu_ns"], final
        ends = [e["detail"] for e in ev if e["type"] == "process.end"]
        assert any(e["signal"] == 9 or e["exit_code"] == 137 for e in ends), ends   # sh -c: 128+9
        assert [e["detail"]["reason"] for e in ev if e["type"] == "sandbox.end"] == ["killed"]
    finally:
        d.stop()
