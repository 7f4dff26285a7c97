"""What the data dir keeps of the past (issue #19 item 10).

- The database: rows and events of ended sandboxes older than the
  `retention` setting are pruned, at start and then periodically, and the
  WAL is truncated after a pass; live sandboxes keep their rows and events,
  and a row that a snapshot names stays.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from serveclient import ServeDaemon


def wait_until(pred, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)


def _query(data_dir: Path, sql: str, *args) -> list:
    db = sqlite3.connect(f"file:{data_dir}/hutch.db?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def _row_ids(data_dir: Path) -> set:
    return {r[0] for r in _query(data_dir, "SELECT id FROM sandboxes")}


def _events_of(data_dir: Path, sid: str) -> list:
    return [r[0] for r in _query(data_dir, "SELECT kind FROM events WHERE sandbox_id = ? ORDER BY id", sid)]


def _wal_size(data_dir: Path) -> int:
    try:
        return (data_dir / "hutch.db-wal").stat().st_size
    except FileNotFoundError:
        return 0


def test_retention_prunes_ended_rows_and_events_and_keeps_live_ones(sandboxed_hutch, tmp_path):
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--retention", "3s"])
    d.start()
    try:
        live = d.create(timeout=300)["sandboxID"]
        ended = [d.create(timeout=300)["sandboxID"] for _ in range(3)]
        snapped = ended[2]
        r = d.request("POST", f"/sandboxes/{snapped}/snapshots", {})
        has_snapshots = r.status == 201
        if not has_snapshots:
            assert r.status == 409, r      # no ext4 layers on this host
        for sid in ended:
            assert d.kill(sid).status == 204
        assert _events_of(data, ended[0]) == ["sandbox.create", "sandbox.end"]
        t_end = time.monotonic()

        # 3 s of retention, a pass every 1.5 s: gone within about 5 s
        gone = set(ended) - ({snapped} if has_snapshots else set())
        assert wait_until(lambda: not (_row_ids(data) & gone), 30), _row_ids(data)
        assert time.monotonic() - t_end >= 2.5, "pruned before the retention had passed"
        for sid in gone:
            assert _events_of(data, sid) == [], sid
        assert live in _row_ids(data)
        assert _events_of(data, live) == ["sandbox.create"], "a live sandbox's events are kept, however old"
        if has_snapshots:
            assert snapped in _row_ids(data), "the row a snapshot names was pruned"
        assert "retention: removed" in d.log_tail(20000)
        assert wait_until(lambda: _wal_size(data) == 0, 10), f"WAL of {_wal_size(data)} bytes after a pass"
        # the live sandbox works as before
        assert d.run({"sandboxID": live, "envdAccessToken": _token(d, live)}, "echo ok")[1] == b"ok\n"
    finally:
        d.stop()


def _token(d: ServeDaemon, sid: str) -> str:
    r = d.request("GET", f"/sandboxes/{sid}")
    assert r.status == 200, r
    return r.json()["envdAccessToken"]


def test_retention_prunes_at_start(sandboxed_hutch, tmp_path):
    """Rows that grew old while no daemon ran go at the next start."""
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    d.start()
    try:
        sid = d.create(timeout=300)["sandboxID"]
        assert d.kill(sid).status == 204
    finally:
        d.stop()
    time.sleep(1.2)
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--retention", "1s"])
    d.start()
    try:
        assert wait_until(lambda: sid not in _row_ids(data), 5), "not pruned at start"
        assert _events_of(data, sid) == []
    finally:
        d.stop()
