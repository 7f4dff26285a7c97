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
import os
import shlex
import sqlite3
import subprocess
import time

import pytest

import hutchtest
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


def _storage(d):
    return _usage(d)["storage"]


def test_storage_ledger_bills_volumes_and_snapshots(sandboxed_hutch, tmp_path):
    """Volumes and snapshots (docs/usage.md "Storage"): a row each, opened
    at its creation, holding its bytes on the host's disk integrated over
    its life (KiB·ms), closed at its deletion and no longer growing, kept
    across a restart without counting twice; the totals are the rows'
    sums, in the API and in `hutch usage --json`."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--metrics-interval", "1s",
                                            "--volume-size", "64M"])
    d.start()
    try:
        r = d.request("POST", "/volumes", {"name": "billed"})
        assert r.status == 201, r
        vol = r.json()
        # 8 MiB of incompressible bytes through the content plane
        blob = os.urandom(8 << 20)
        r = d.request("PUT", f"/volumecontent/{vol['volumeID']}/file?path=%2Fblob", blob,
                      headers={"Authorization": f"Bearer {vol['token']}",
                               "Content-Type": "application/octet-stream"}, key="")
        assert r.status == 201, r
        sb = d.create()
        _run(d, sb, "open('/home/user/f', 'wb').write(b'x' * (1 << 20))")
        r = d.request("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})
        assert r.status == 201, r
        snap = r.json()["snapshotID"]
        d.kill(sb["sandboxID"])

        def rows():
            return {(x["kind"], x["id"]): x for x in _storage(d)["rows"]}
        # samples every second: the volume's row grows with its bytes as
        # the kernel writes them back to its image (sync: now, not in 30 s)
        os.sync()
        assert hutchtest.wait_until(lambda: len(rows()) == 2, 10), rows()
        assert hutchtest.wait_until(lambda: rows()[("volume", vol["volumeID"])]["bytes"] >= 8 << 20, 10), rows()
        first = rows()
        time.sleep(2.5)
        later = rows()
        v0, v1 = first[("volume", vol["volumeID"])], later[("volume", vol["volumeID"])]
        s0, s1 = first[("snapshot", snap)], later[("snapshot", snap)]
        assert v1["name"] == "billed" and v1["teamID"] == v0["teamID"] and v1["endedAt"] is None, v1
        img = data / "volumes" / f"{vol['volumeID']}.img"
        on_disk = img.stat().st_blocks * 512
        assert v1["bytes"] == on_disk and on_disk >= 8 << 20, (v1, on_disk)
        assert v1["bytes_peak"] >= v1["bytes"]
        # the snapshot's bytes are its sealed file's, as the store has them
        sealed = [p for p in (data / "snapshots").rglob(f"{snap}*") if p.is_file()]
        assert sealed and s1["bytes"] == sum(p.stat().st_size for p in sealed), (s1, sealed)
        # 2.5 s more at that size: KiB·ms grew by about bytes/1024 × 2500
        # (the sampler's times, not the test's, so a wide band)
        grew = v1["kib_ms"] - v0["kib_ms"]
        assert (on_disk >> 10) * 1000 <= grew <= (on_disk >> 10) * 6000, (grew, on_disk)
        assert s1["kib_ms"] > s0["kib_ms"] > 0
        # totals are the rows' exact sums, by kind
        st = _storage(d)
        for kind, key in (("volume", "volumes"), ("snapshot", "snapshots")):
            ks = [x for x in st["rows"] if x["kind"] == kind]
            assert st["total"][key]["kib_ms"] == sum(x["kib_ms"] for x in ks), st
            assert st["total"][key]["bytes_peak"] == max(x["bytes_peak"] for x in ks), st

        # deleted: closed at once, then never growing again
        assert d.request("DELETE", f"/volumes/{vol['volumeID']}").status == 204
        assert d.request("DELETE", f"/templates/{snap}").status == 204
        closed = rows()
        assert closed[("volume", vol["volumeID"])]["endedAt"] is not None, closed
        assert closed[("snapshot", snap)]["endedAt"] is not None, closed
        time.sleep(1.5)
        assert rows() == closed
    finally:
        d.stop()
    # a restart keeps the rows as they were (nothing is added twice) and
    # `hutch usage` reads the same numbers
    d.start()
    try:
        assert {k: v["kib_ms"] for k, v in rows().items()} == {k: v["kib_ms"] for k, v in closed.items()}
    finally:
        d.stop()
    cp = subprocess.run([str(sandboxed_hutch), "usage", "--json", "--data-dir", str(data)],
                        capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["storage"]["rows"] == list(closed.values())
    cp = subprocess.run([str(sandboxed_hutch), "usage", "--data-dir", str(data)], capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    text = cp.stdout.decode()
    assert "STORAGE" in text and vol["volumeID"] in text and snap in text, text


@pytest.mark.skipif(not os.access("/usr/bin/runsc", os.X_OK), reason="runsc is not installed")
def test_storage_ledger_bills_a_paused_gvisor_sandboxs_checkpoint(sandboxed_hutch, tmp_path):
    """A gvisor pause writes the sandbox's memory and layer to disk: the
    storage ledger bills that checkpoint (kind `checkpoint`, the sandbox's
    id) while it is paused, at the checkpoint's bytes on disk; a resume
    closes the row, a second pause reopens it without counting the time it
    ran in between; an ns pause (memory kept in RAM) has no row."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--metrics-interval", "1s"])
    d.start()
    try:
        gv = d.create(metadata={"hutch.backend": "gvisor"}, timeout=120)
        ns = d.create(timeout=120)
        gid = gv["sandboxID"]
        for sb in (gv, ns):
            assert d.request("POST", f"/sandboxes/{sb['sandboxID']}/pause", {}, timeout=120).status == 204

        def row():
            rows = [x for x in _storage(d)["rows"] if x["kind"] == "checkpoint"]
            assert all(x["id"] == gid for x in rows), rows   # none for the ns pause
            return rows[0] if rows else None
        assert hutchtest.wait_until(lambda: row() is not None and row()["bytes"] > 0, 15), _storage(d)
        ckpt = (data / "paused" / f"{gid}.seal").stat().st_blocks * 512   # the sealed checkpoint
        first = row()
        assert first["endedAt"] is None and abs(first["bytes"] - ckpt) <= ckpt // 10 + 65536, (first, ckpt)
        time.sleep(2)
        grown = row()
        # KiB·ms at the checkpoint's size: about 2 s of it (a sample is up to 1 s late)
        assert 1000 * (grown["bytes"] // 1024) <= grown["kib_ms"] - first["kib_ms"] <= 4000 * (grown["bytes"] // 1024), \
            (first, grown)
        r = d.request("POST", f"/sandboxes/{gid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 201, r
        assert hutchtest.wait_until(lambda: row()["endedAt"] is not None, 15), row()
        closed = row()
        time.sleep(2)
        assert row()["kib_ms"] == closed["kib_ms"], "a running sandbox's checkpoint row grew"
        # paused again: the same row goes on, without the 2 s it ran
        assert d.request("POST", f"/sandboxes/{gid}/pause", {}, timeout=120).status == 204
        assert hutchtest.wait_until(lambda: row()["endedAt"] is None, 15), row()
        again = row()
        assert again["kib_ms"] - closed["kib_ms"] < 1500 * (again["bytes"] // 1024), (closed, again)
        total = _storage(d)["total"]["checkpoints"]
        assert total["kib_ms"] >= again["kib_ms"] and total["bytes_peak"] == max(x["bytes_peak"] for x in [again]), total
    finally:
        d.stop()
