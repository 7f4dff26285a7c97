"""The audit trail (issue 15, docs/audit.md), through the real daemon and CLI.

- What a client does is recorded as it happens: its API calls (key id,
  status), the sandbox's create (template, backend, limits) and end, each
  process start (argv, user, cwd, the env's names and never its values) and
  end (exit code, duration), a file upload (size and the sha256 of the
  bytes) and a delete; a team's GET /events returns its own records and no
  other team's.
- `hutch audit verify` passes on the trail as written, also while the daemon
  runs, and names the record or checkpoint of each kind of tampering made
  with sqlite3 behind its back: an edited record, a deleted one, two
  swapped, a chain rewritten with fresh hashes, a truncated tail, a
  replayed checkpoint.
- kill -9 of the daemon in the middle of a burst of writes: the next start
  says the trail ended without its final checkpoint, records it, and the
  trail verifies.
- Retention removes old records under a signed "pruned up to" checkpoint
  and the rest still verifies.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import signal
import sqlite3
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hutchtest import wait_until
from serveclient import ServeDaemon, parse_frames, envelope

SECRET_VALUE = "s3cr3t-value-never-logged"
WEIRD_ARGV = ["x\n{\"seq\":1,\"kind\":\"forged\"}\r\n", "\",\"kind\":\"forged", "a,b\"c", "\u00e9\t\\"]


def _hutch(hutch_bin, *args, timeout=60):
    return subprocess.run([str(hutch_bin), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _verify(hutch_bin, data: Path):
    cp = _hutch(hutch_bin, "audit", "verify", "--data-dir", str(data))
    return cp.returncode, cp.stdout + cp.stderr


def _export(hutch_bin, data: Path, *args):
    cp = _hutch(hutch_bin, "audit", "export", "--data-dir", str(data), *args)
    assert cp.returncode == 0, cp.stderr
    return [json.loads(l) for l in cp.stdout.splitlines()]


def _copy(data: Path, dst: Path) -> Path:
    """A stopped daemon's data dir, the database consolidated (no WAL)."""
    dst.mkdir()
    src = sqlite3.connect(f"file:{data}/hutch.db?mode=ro", uri=True)
    out = sqlite3.connect(dst / "hutch.db")
    src.backup(out)
    src.close()
    out.close()
    for name in ("audit.key", "audit.head", "secrets.key"):
        if (data / name).exists():
            shutil.copy2(data / name, dst / name)
    return dst


def _sql(data: Path, *stmts):
    db = sqlite3.connect(data / "hutch.db")
    try:
        for s in stmts:
            if isinstance(s, tuple):
                db.execute(*s)
            else:
                db.execute(s)
        db.commit()
    finally:
        db.close()


def _rows(data: Path, sql, *args):
    db = sqlite3.connect(f"file:{data}/hutch.db?mode=ro", uri=True)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def _record_hash(prev: bytes, seq, ts, team, sandbox, kind, detail) -> bytes:
    """lib/audit/audit-internal.h's encoding, for a forger that recomputes."""
    h = hashlib.sha256(b"hutch-audit-v1" + prev + struct.pack(">qqq", seq, ts, team))
    for s in (sandbox, kind, detail):
        b = s.encode()
        h.update(struct.pack(">Q", len(b)) + b)
    return h.digest()


@pytest.fixture(scope="module")
def trail(sandboxed_hutch, tmp_path_factory):
    """One daemon run doing one of each thing, stopped cleanly: its data
    dir, the sandbox id, the other team's key and what was seen live."""
    base = tmp_path_factory.mktemp("audit")
    data = base / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--audit-checkpoint-interval", "1s"])
    d.start()
    seen = {}
    try:
        cp = _hutch(sandboxed_hutch, "key", "create", "--team", "other", "--data-dir", str(data))
        assert cp.returncode == 0, cp.stderr
        other_key = cp.stdout.strip()
        sb = d.create()
        sid = sb["sandboxID"]
        r = d.stream(sb, "process.Process/Start",
                     {"process": {"cmd": "/bin/sh", "args": ["-c", "echo audited; exit 3"], "cwd": "/tmp",
                                  "envs": {"API_TOKEN": SECRET_VALUE}}, "stdin": False}, user="root")
        assert r.status == 200, r
        # argv chosen to break a naive log format: it must come back as given
        r = d.stream(sb, "process.Process/Start", {"process": {"cmd": "/bin/true", "args": WEIRD_ARGV},
                                                    "stdin": False}, user="root")
        assert r.status == 200, r
        payload = b"audited bytes\n" * 1000
        assert d.upload(sb, "/tmp/up.bin", payload, user="root").status == 200
        r = d.unary(sb, "filesystem.Filesystem/Remove", {"path": "/tmp/up.bin"}, user="root")
        assert r.status == 200, r
        assert d.request("GET", "/sandboxes/" + "x" * 20, key="e2b_" + "0" * 40).status == 401

        # the live API: this team's records, in order, and the other's none
        def events(key, path="/events", **q):
            qs = "&".join(f"{k}={v}" for k, v in q.items())
            r = d.request("GET", path + ("?" + qs if qs else ""), key=key)
            assert r.status == 200, r
            return r.json()

        seen["mine"] = events(d.key, limit=1000)
        seen["sandbox"] = events(d.key, f"/sandboxes/{sid}/events")
        seen["other"] = events(other_key, limit=1000)
        seen["other_sandbox"] = events(other_key, f"/sandboxes/{sid}/events")
        seen["page"] = d.request("GET", "/events?limit=2", key=d.key)
        seen["bad"] = d.request("GET", "/events?since=yesterday-ish", key=d.key)
        seen["verify_live"] = _verify(sandboxed_hutch, data)
        assert d.kill(sid).status == 204
        seen["payload_sha"] = hashlib.sha256(payload).hexdigest()
    finally:
        assert d.stop() == []
    return {"data": data, "sid": sid, "seen": seen, "base": base}


def test_records_what_a_client_did(sandboxed_hutch, trail):
    sid, seen = trail["sid"], trail["seen"]
    mine = seen["mine"]
    kinds = [e["type"] for e in mine]
    for k in ("sandbox.create", "sandbox.limits", "api.call", "process.start", "process.end", "file.write",
              "file.delete"):
        assert k in kinds, (k, kinds)
    assert [e["seq"] for e in mine] == sorted(e["seq"] for e in mine)

    start = next(e for e in mine if e["type"] == "process.start" and e["detail"]["argv"][0] == "/bin/sh")
    assert start["sandboxID"] == sid
    assert start["detail"]["argv"] == ["/bin/sh", "-c", "echo audited; exit 3"]
    assert start["detail"]["user"] == "root" and start["detail"]["cwd"] == "/tmp"
    assert start["detail"]["env_names"] == ["API_TOKEN"] and start["detail"]["pty"] is False
    end = next(e for e in mine if e["type"] == "process.end" and e["detail"]["pid"] == start["detail"]["pid"])
    assert end["detail"]["pid"] == start["detail"]["pid"] and end["detail"]["exit_code"] == 3
    assert end["detail"]["duration_ms"] >= 0
    limits = next(e for e in mine if e["type"] == "sandbox.limits")["detail"]
    assert limits["backend"] in ("ns", "gvisor") and limits["memory_mb"] > 0 and limits["cpu_count"] > 0
    w = next(e for e in mine if e["type"] == "file.write")["detail"]
    assert w == {"path": "/tmp/up.bin", "size": 14000, "sha256": seen["payload_sha"]}
    assert next(e for e in mine if e["type"] == "file.delete")["detail"]["path"] == "/tmp/up.bin"
    create_call = [e for e in mine if e["type"] == "api.call" and e["detail"]["method"] == "POST"
                   and e["detail"]["path"] == "/v2/sandboxes"]
    assert create_call and create_call[0]["detail"]["status"] == 201 and create_call[0]["sandboxID"] == sid
    assert create_call[0]["detail"]["key_id"] == 1

    # the value of an env var never reaches the trail, here or exported
    assert SECRET_VALUE not in json.dumps(mine)
    assert SECRET_VALUE not in _hutch(sandboxed_hutch, "audit", "export", "--data-dir", str(trail["data"])).stdout

    # GET /sandboxes/{id}/events: that sandbox only; another team sees none of it
    assert seen["sandbox"] and all(e["sandboxID"] == sid for e in seen["sandbox"])
    assert seen["other_sandbox"] == []
    assert all(e["sandboxID"] != sid for e in seen["other"])
    assert not any(e["type"] == "process.start" for e in seen["other"])
    page = seen["page"]
    assert page.status == 200 and len(page.json()) == 2 and page.header("x-next-token") == str(page.json()[1]["seq"])
    assert seen["bad"].status == 400 and "since" in seen["bad"].json()["message"]

    # the CLI while the daemon ran: a reader beside it
    rc, out = seen["verify_live"]
    assert rc == 0, out


def test_export_filters_and_formats(sandboxed_hutch, trail):
    data, sid = trail["data"], trail["sid"]
    allr = _export(sandboxed_hutch, data)
    assert [r["seq"] for r in allr] == list(range(allr[0]["seq"], allr[-1]["seq"] + 1))
    kinds = {r["kind"] for r in allr}
    # the store's events (a key made by the CLI while the daemon ran) are folded in
    assert {"key.create", "daemon.start", "daemon.stop", "audit.checkpoint", "sandbox.end"} <= kinds, kinds
    only = _export(sandboxed_hutch, data, "--sandbox", sid, "--kind", "process.")
    assert {r["kind"] for r in only} == {"process.start", "process.end"}
    cp = _hutch(sandboxed_hutch, "audit", "export", "--data-dir", str(data), "--team", "default", "--format", "csv")
    assert cp.returncode == 0, cp.stderr
    rows = list(csv.DictReader(io.StringIO(cp.stdout)))
    assert rows and all(r["team"] == "1" for r in rows)
    assert any(r["kind"] == "process.start" and json.loads(r["detail"])["env_names"] == ["API_TOKEN"] for r in rows)
    # sandbox-chosen strings are escaped: every line is one record, argv as given
    weird = [r for r in allr if r["kind"] == "process.start" and r["detail"]["argv"][0] == "/bin/true"]
    assert len(weird) == 1 and weird[0]["detail"]["argv"][1:] == WEIRD_ARGV, weird
    assert "forged" not in kinds
    crow = [r for r in rows if r["kind"] == "process.start" and json.loads(r["detail"])["argv"][0] == "/bin/true"]
    assert len(crow) == 1 and json.loads(crow[0]["detail"])["argv"][1:] == WEIRD_ARGV
    future = _export(sandboxed_hutch, data, "--since", "2999-01-01")
    assert future == []
    bad = _hutch(sandboxed_hutch, "audit", "export", "--data-dir", str(data), "--since", "soon")
    assert bad.returncode == 2 and "since" in bad.stderr


def test_verify_passes_on_the_written_trail(sandboxed_hutch, trail):
    rc, out = _verify(sandboxed_hutch, trail["data"])
    assert rc == 0, out
    assert "0 record(s) after it not yet signed" in out, out
    pem = _hutch(sandboxed_hutch, "audit", "pubkey", "--data-dir", str(trail["data"])).stdout
    assert pem.startswith("-----BEGIN PUBLIC KEY-----")
    keyfile = trail["base"] / "pub.pem"
    keyfile.write_text(pem)
    cp = _hutch(sandboxed_hutch, "audit", "verify", "--data-dir", str(trail["data"]), "--pubkey", str(keyfile))
    assert cp.returncode == 0, cp.stdout


def _seq_of(data, kind):
    return _rows(data, "SELECT seq FROM audit_log WHERE kind = ? ORDER BY seq LIMIT 1", kind)[0][0]


@pytest.mark.parametrize("case", ["edit", "delete", "reorder", "rewrite", "truncate", "replay", "head"])
def test_verify_names_the_tampering(sandboxed_hutch, trail, tmp_path, case):
    data = _copy(trail["data"], tmp_path / "copy")
    ps = _seq_of(data, "process.start")
    if case == "edit":
        _sql(data, ("UPDATE audit_log SET detail = replace(detail, 'exit 3', 'exit 0') WHERE seq = ?", (ps,)))
        want = [f"record {ps} (process.start): its content does not match its hash"]
    elif case == "delete":
        _sql(data, ("DELETE FROM audit_log WHERE seq = ?", (ps,)))
        want = [f"records {ps}..{ps} are missing"]
    elif case == "reorder":
        a, b = ps, ps + 1
        cols = "ts_ms, team_id, sandbox_id, kind, detail, prev, hash"
        ra = _rows(data, f"SELECT {cols} FROM audit_log WHERE seq = ?", a)[0]
        rb = _rows(data, f"SELECT {cols} FROM audit_log WHERE seq = ?", b)[0]
        upd = "UPDATE audit_log SET ts_ms=?, team_id=?, sandbox_id=?, kind=?, detail=?, prev=?, hash=? WHERE seq=?"
        _sql(data, (upd, (*rb, a)), (upd, (*ra, b)))
        want = [f"record {a}: its link does not match", f"record {b}: its link does not match"]
    elif case == "rewrite":
        # a forger edits a record and recomputes every hash after it: the
        # chain is self-consistent, the signed checkpoints are not
        rows = _rows(data, "SELECT seq, ts_ms, team_id, sandbox_id, kind, detail, prev FROM audit_log ORDER BY seq")
        db = sqlite3.connect(data / "hutch.db")
        prev = None
        for seq, ts, team, sbx, kind, detail, p in rows:
            if seq == ps:
                detail = detail.replace("exit 3", "exit 0")
            if prev is not None and seq >= ps:
                p = prev
            h = _record_hash(p, seq, ts, team, sbx, kind, detail)
            if seq >= ps:
                db.execute("UPDATE audit_log SET detail=?, prev=?, hash=? WHERE seq=?", (detail, p, h, seq))
            prev = h
        db.commit()
        db.close()
        want = ["is not what it signed (records rewritten)"]
    elif case == "truncate":
        cut = ps + 1
        _sql(data, ("DELETE FROM audit_log WHERE seq > ?", (cut,)),
             ("DELETE FROM audit_checkpoints WHERE seq >= ?", (cut,)))
        want = ["truncated: audit.head names checkpoint"]
    elif case == "replay":
        # the newest checkpoint replaced by a copy of an older one under its number
        (n_first, n_last) = _rows(data, "SELECT min(n), max(n) FROM audit_checkpoints")[0]
        assert n_last > n_first
        old = _rows(data, "SELECT ts_ms, seq, hash, pruned_seq, pruned_hash, sig FROM audit_checkpoints"
                          " WHERE n = ?", n_first)[0]
        _sql(data, ("DELETE FROM audit_checkpoints WHERE n = ?", (n_last,)),
             ("INSERT INTO audit_checkpoints (n, ts_ms, seq, hash, pruned_seq, pruned_hash, sig)"
              " VALUES (?, ?, ?, ?, ?, ?, ?)", (n_last, *old)))
        want = [f"checkpoint {n_last}: a replay of checkpoint {n_first}"]
    elif case == "head":
        # the signed copy outside the database removed, to hide a truncation
        (data / "audit.head").unlink()
        want = ["audit.head is missing while the database holds checkpoints"]
    rc, out = _verify(sandboxed_hutch, data)
    assert rc == 1, out
    for w in want:
        assert w in out, (case, out)
    assert "TAMPERED:" in out


def test_kill9_mid_write_loses_at_most_the_unwritten(sandboxed_hutch, tmp_path):
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--audit-checkpoint-interval", "60s"])
    d.start()
    sb = d.create()
    stop = threading.Event()
    done = []

    def burst():
        # uploads (a record each) as fast as one client goes, until the kill
        i = 0
        while not stop.is_set():
            try:
                r = d.upload(sb, f"/tmp/f{i}", b"x", user="root", timeout=5)
                if r.status == 200:
                    done.append(i)
            except Exception:
                return
            i += 1

    t = threading.Thread(target=burst)
    t.start()
    try:
        assert wait_until(lambda: len(done) >= 20, 30)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
    finally:
        stop.set()
        t.join(30)
    acked = len(done)
    d2 = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    d2.created = dict(d.created)
    d2.start()
    try:
        assert wait_until(lambda: "stopped without its final checkpoint" in d2.log_tail(20000), 10), d2.log_tail()
        recs = _export(sandboxed_hutch, data, "--kind", "daemon.")
        assert [r["kind"] for r in recs][-2:] == ["daemon.unclean_stop", "daemon.start"], recs
        writes = _export(sandboxed_hutch, data, "--kind", "file.write")
        # every upload answered before the kill is on the trail: a record is
        # written in the loop turn that served it, before the loop sleeps
        # (the answer may leave in that turn too: at most that turn's are lost)
        assert len(writes) >= acked - 1, (len(writes), acked)
        rc, out = _verify(sandboxed_hutch, data)
        assert rc == 0, out
    finally:
        assert d2.stop() == []
    rc, out = _verify(sandboxed_hutch, data)
    assert rc == 0 and "0 record(s) after it not yet signed" in out, out


def test_retention_prunes_under_a_signed_checkpoint(sandboxed_hutch, tmp_path):
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--audit-checkpoint-interval", "1s",
                                            "--audit-retention", "2s"])
    d.start()
    try:
        sb = d.create()
        assert d.kill(sb["sandboxID"]).status == 204
        assert wait_until(lambda: _rows(data, "SELECT max(pruned_seq) FROM audit_checkpoints")[0][0] or 0, 15)
        assert wait_until(lambda: _rows(data, "SELECT min(seq) FROM audit_log")[0][0] > 1, 10)
        (first,) = _rows(data, "SELECT min(seq) FROM audit_log")[0]
        rc, out = _verify(sandboxed_hutch, data)
        assert rc == 0, out
        assert "retention removed records before the first" in out
    finally:
        d.stop()
    # a record removed past the pruned point is still found out
    copy = _copy(data, tmp_path / "copy")
    (first,) = _rows(copy, "SELECT min(seq) FROM audit_log")[0]
    (pruned,) = _rows(copy, "SELECT max(pruned_seq) FROM audit_checkpoints")[0]
    _sql(copy, ("DELETE FROM audit_log WHERE seq <= ?", (max(first, pruned + 1),)))
    rc, out = _verify(sandboxed_hutch, copy)
    assert rc == 1 and "are missing (deleted)" in out, out


def test_a_held_write_lock_delays_records_and_loses_none(sandboxed_hutch, tmp_path):
    """Another process holding the database's write lock (a CLI, a backup)
    makes the writes fail after the store's busy timeout: the records stay
    queued, are written once the lock is gone, and the chain is whole."""
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    d.start()
    try:
        assert d.request("GET", "/v2/sandboxes").status == 200   # the key's last-used write is done
        db = sqlite3.connect(data / "hutch.db", timeout=10)
        db.execute("BEGIN IMMEDIATE")
        try:
            for i in range(3):
                assert d.request("GET", "/v2/sandboxes", timeout=60).status == 200
            time.sleep(2.5)
        finally:
            db.rollback()
            db.close()
        assert wait_until(lambda: len([r for r in _export(sandboxed_hutch, data, "--kind", "api.call")
                                       if r["detail"]["path"] == "/v2/sandboxes"]) == 4, 15)
        assert "kept in memory; trying again" in d.log_tail(20000)
    finally:
        d.stop()
    rc, out = _verify(sandboxed_hutch, data)
    assert rc == 0, out


def test_a_backlog_of_store_records_is_folded_in_batches(sandboxed_hutch, tmp_path):
    """Egress records written while the trail was off (or before an upgrade)
    are folded in at the next start, a batch per loop turn, every one."""
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--audit", "off"])
    d.start()
    d.stop()
    db = sqlite3.connect(data / "hutch.db")
    db.executemany("INSERT INTO egress_log (sandbox_id, team_id, ts_ms, kind, host, port, allowed, bytes_in)"
                   " VALUES ('x', 1, ?, 'http', 'h.test', 80, ?, ?)",
                   [(int(time.time() * 1000) + i, i % 2, i) for i in range(5000)])
    db.commit()
    db.close()
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    d.start()
    try:
        assert wait_until(lambda: len(_export(sandboxed_hutch, data, "--kind", "egress.")) == 5000, 20)
        assert d.request("GET", "/health").status == 200
    finally:
        d.stop()
    recs = _export(sandboxed_hutch, data, "--kind", "egress.")
    assert [r["detail"]["bytes_in"] for r in recs] == list(range(5000))
    rc, out = _verify(sandboxed_hutch, data)
    assert rc == 0, out


def test_verify_beside_a_writing_daemon_never_cries_wolf(sandboxed_hutch, tmp_path):
    """Checkpoints signed while verify reads (every second here) are never
    taken for a truncation or a forgery."""
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--audit-checkpoint-interval", "1s"])
    d.start()
    stop = threading.Event()

    def writes():
        sb = d.create()
        i = 0
        while not stop.is_set():
            d.upload(sb, f"/tmp/w{i % 10}", b"y" * 100, user="root", timeout=10)
            i += 1

    t = threading.Thread(target=writes)
    t.start()
    try:
        time.sleep(0.5)
        results = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            results.append(_verify(sandboxed_hutch, data))
        assert len(results) >= 3
        for rc, out in results:
            assert rc == 0, out
        (n,) = _rows(data, "SELECT count(*) FROM audit_checkpoints")[0]
        assert n >= 3
    finally:
        stop.set()
        t.join(30)
        d.stop()


def test_hutch_logs_shows_and_follows_a_sandbox(sandboxed_hutch, tmp_path):
    """`hutch logs ID` prints what happened in one sandbox, from the trail,
    a line a record; --json prints the records; -f follows new ones and
    ends by itself when the sandbox ends; bad input is a usage error."""
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    d.start()

    def logs(*args, **kw):
        return subprocess.run([str(sandboxed_hutch), "logs", "--data-dir", str(data), *args],
                              capture_output=True, timeout=60, **kw)
    try:
        sb = d.create()
        sid = sb["sandboxID"]
        end, out, _, _ = d.run(sb, "echo logged; exit 5")
        assert end.get("exitCode") == 5, end
        assert d.upload(sb, "/tmp/seen.txt", b"hello", user="root").status == 200

        def text():
            cp = logs(sid)
            assert cp.returncode == 0, cp.stderr
            return cp.stdout.decode()
        assert wait_until(lambda: "file.write" in text(), 10), text()
        lines = text().splitlines()
        start = next(ln for ln in lines if " process.start " in ln)
        assert "/bin/bash -l -c echo logged; exit 5" in start or "echo logged; exit 5" in start, start
        assert any(" process.end " in ln and "exited 5" in ln for ln in lines), lines
        assert any(" file.write " in ln and "/tmp/seen.txt (5 bytes" in ln for ln in lines), lines
        assert all(ln[:4].isdigit() for ln in lines), lines  # each line starts with its time
        recs = [json.loads(ln) for ln in logs("--json", sid).stdout.splitlines()]
        assert recs and all(r["sandbox"] == sid for r in recs), recs
        assert [r for r in recs if r["kind"] == "process.end"][0]["detail"]["exit_code"] == 5
        only = logs("--kind", "process.", sid).stdout.decode().splitlines()
        assert only and all(" process." in ln for ln in only), only

        # -f: what comes later, then its end
        f = subprocess.Popen([str(sandboxed_hutch), "logs", "-f", "--data-dir", str(data), sid],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            time.sleep(1)
            d.run(sb, "echo later-one")
            time.sleep(1)
            assert d.kill(sid).status == 204
            out, err = f.communicate(timeout=30)
        finally:
            if f.poll() is None:
                f.kill()
                f.wait()
        assert f.returncode == 0, err
        tail = out.decode()
        assert "later-one" in tail and " sandbox.end " in tail and "killed" in tail, tail
    finally:
        d.stop()
    cp = logs("3p3unosuchsandbox000")
    assert cp.returncode == 1 and b"no sandbox" in cp.stderr, cp
    cp = logs()
    assert cp.returncode == 2 and b"wants a SANDBOX_ID" in cp.stderr, cp
    cp = logs("--since", "whenever", "x")
    assert cp.returncode == 2, cp


RUNSC = shutil.which("runsc") or "/usr/bin/runsc"


@pytest.mark.parametrize("backend", ["ns", pytest.param("gvisor", marks=pytest.mark.skipif(
    not Path(RUNSC).exists(), reason="runsc is not installed"))])
def test_process_end_records_the_cpu_the_process_used(sandboxed_hutch, tmp_path, backend):
    """process.end carries cpu_ms: the process's user + system time as
    hutch-init's wait4() reports it, descendants it waited for included; a
    process that sleeps uses next to none; `hutch logs` shows it."""
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--backend", backend])
    d.start()
    try:
        sb = d.create()
        sid = sb["sandboxID"]
        burn = ("import time\nt = time.process_time()\n"
                "while time.process_time() - t < 0.6:\n    pass\n")
        # the burner is a child the shell waits for: its time is the shell's too
        end, _, err, _ = d.run(sb, f"python3 -c '{burn}'; echo done")
        assert end.get("exitCode", 0) == 0, (end, err)
        end, _, _, _ = d.run(sb, "sleep 0.5")
        assert end.get("exitCode", 0) == 0, end

        def ends():
            r = d.request("GET", f"/sandboxes/{sid}/events?limit=1000", key=d.key)
            assert r.status == 200, r
            return [e["detail"] for e in r.json() if e["type"] == "process.end"]
        assert wait_until(lambda: len(ends()) == 2, 10), ends()
        burned, slept = ends()
        # gVisor's own accounting (the sentry's, on the ptrace platform)
        # can exceed the wall time a little; the kernel's cannot
        ceiling = burned["duration_ms"] + 50 if backend == "ns" else 2 * burned["duration_ms"]
        assert 550 <= burned["cpu_ms"] <= ceiling, burned
        assert slept["duration_ms"] >= 490, slept
        # on gVisor a shell's and sleep's start alone cost the sentry a
        # few hundred ms of its accounting
        assert 0 <= slept["cpu_ms"] < (150 if backend == "ns" else burned["cpu_ms"] - 300), (slept, burned)
        cp = subprocess.run([str(sandboxed_hutch), "logs", "--data-dir", str(data), sid],
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        assert f"{burned['cpu_ms']} ms of CPU" in cp.stdout, cp.stdout
        assert d.kill(sid).status == 204
    finally:
        assert d.stop() == []
