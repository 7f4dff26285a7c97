"""One team's burst must not stall the other teams (issue #19 item 2).

Creates, resumes, pauses, snapshots and forks run the engine on the
daemon's one loop. They wait in per-team queues and run one per loop turn,
the teams in turn, with every other ready event served in between
(daemon/admission.c, docs/design.md §3.1 "Admission"); a team holds at most
`max-queued-per-team` of them waiting or running, the daemon `max-queued`,
and one beyond is refused at once with 429 and Retry-After.

The tests assert the rule by order and counts, never by wall-clock bounds.
To make the order exact, the daemon is stopped (SIGSTOP) while the requests
are written, each on its own connection, team A's burst first and team B's
requests last; then it is continued. Without the rule, B's requests are
read after A's twenty and the loop serves them after A's creates; with it,
B's create is made after at most a few of A's, and B's envd call, its
resume and /health are answered while most of A's burst still waits.
The warm pool is off (`pool-size 0`), so every create is a real one.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from serveclient import (FLAG_END, ConnectionClosed, HttpConn, ServeDaemon, envelope, free_port,
                         parse_frames, stdout_of)

RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
BACKENDS = ["ns", pytest.param("gvisor", marks=pytest.mark.skipif(not os.access(RUNSC, os.X_OK),
                                                                  reason="runsc is not installed"))]
BURST = 20


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def _key_create(hutch_bin, data_dir, team) -> str:
    cp = subprocess.run([str(hutch_bin), "key", "create", "--data-dir", str(data_dir), "--team", team],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    key = cp.stdout.strip().splitlines()[-1].strip()
    assert key.startswith("e2b_"), cp.stdout
    return key


def _daemon(hutch_bin, tmp_path, *extra, backend="ns") -> ServeDaemon:
    mport = free_port()
    d = ServeDaemon(hutch_bin, tmp_path / "data",
                    ["--pool-size", "0", "--backend", backend, "--metrics-listen", f"127.0.0.1:{mport}",
                     "--max-sandboxes-per-team", "100", *extra])
    d.metrics_port = mport
    d.start()
    return d


def _metrics(d) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=30) as r:
        return r.read().decode()


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _creation_order(data_dir: Path) -> list:
    """Sandbox ids in the order the daemon made them, read behind its back."""
    db = sqlite3.connect(f"file:{data_dir}/hutch.db?mode=ro", uri=True, timeout=10)
    try:
        return [r[0] for r in db.execute("SELECT sandbox_id FROM events WHERE kind = 'sandbox.create' ORDER BY id")]
    finally:
        db.close()


def _rows(data_dir: Path) -> dict:
    """{id: (team id, state, end_reason)}."""
    db = sqlite3.connect(f"file:{data_dir}/hutch.db?mode=ro", uri=True, timeout=10)
    try:
        return {r[0]: r[1:] for r in db.execute("SELECT id, team_id, state, end_reason FROM sandboxes")}
    finally:
        db.close()


class Sent:
    """One request written on a connection of its own; read() waits for its
    answer and notes when it came (time.monotonic())."""

    def __init__(self, d: ServeDaemon, name: str, method: str, path: str, body=None, headers=(), key=None):
        self.name, self.method = name, method
        hdrs = list(headers)
        if key:
            hdrs.append(("X-API-KEY", key))
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
            hdrs.append(("Content-Type", "application/json"))
        head = [f"{method} {path} HTTP/1.1", f"Host: {d.host}:{d.port}", *(f"{k}: {v}" for k, v in hdrs)]
        if body is not None:
            head.append(f"Content-Length: {len(body)}")
        self.conn = HttpConn(d.host, d.port, timeout=600)
        self.conn.send_raw(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        self.resp, self.at, self.error = None, None, None

    def read(self):
        try:
            self.resp = self.conn.read_response(self.method)
        except (ConnectionClosed, OSError) as e:
            self.error = e
        self.at = time.monotonic()
        self.conn.close()
        return self


def _read_all(sent: list, then=None) -> list:
    """Read every answer in threads (then(s) runs in s's thread after its
    answer); returns sent."""
    def one(s):
        s.read()
        if then:
            then(s)
    ts = [threading.Thread(target=one, args=(s,)) for s in sent]
    for t in ts:
        t.start()
    for t in ts:
        t.join(900)
    assert not any(t.is_alive() for t in ts), "an answer never came"
    return sent


@contextmanager
def _stopped(d: ServeDaemon):
    """The daemon reads nothing meanwhile: what is written queues in the
    kernel, in order, and is read once it goes on."""
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)


def _start_body(cmd: str) -> bytes:
    return envelope({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": False})


def _run_check(resp, want: bytes):
    """A process.Start stream that ended with exit 0 and printed want."""
    assert resp is not None and resp.status == 200, resp
    frames = parse_frames(resp.body)
    assert frames and frames[-1][0] == FLAG_END and frames[-1][1] == {}, frames
    ends = [m["event"]["end"] for f, m in frames if not f & FLAG_END and "end" in m.get("event", {})]
    assert len(ends) == 1 and ends[0].get("exitCode", 0) == 0 and ends[0].get("status") == "exit status 0", frames
    assert stdout_of(frames) == want


def _later(a_sent: list, t: float) -> int:
    """How many of A's answers came after t."""
    return sum(1 for s in a_sent if s.at > t)


def _stop(d: ServeDaemon):
    if d.alive():
        os.kill(d.proc.pid, signal.SIGCONT)
    for sid, key in list(d.created.items()):
        if d.alive():
            try:
                d.request("DELETE", f"/sandboxes/{sid}", key=key, timeout=60)
            except OSError:
                pass
    d.created.clear()
    d.stop()


# --------------------------------------------------------------------------
# the rule
# --------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_burst_of_creates_does_not_hold_another_team(sandboxed_hutch, tmp_path, backend):
    """Twenty creates of team A, then team B's create (and a command in the
    new sandbox), a command in B's existing sandbox, B's resume of a paused
    sandbox and /health, all read after A's twenty: B's create is made
    after at most a few of A's, and everything of B's is answered while
    most of A's burst still waits."""
    d = _daemon(sandboxed_hutch, tmp_path, backend=backend)
    key_b = _key_create(sandboxed_hutch, d.data_dir, "fair-b-" + secrets.token_hex(3))
    try:
        sb_b = d.create(key=key_b, timeout=600)
        paused_b = d.create(key=key_b, timeout=600)
        r = d.request("POST", f"/sandboxes/{paused_b['sandboxID']}/pause", {}, key=key_b, timeout=120)
        assert r.status == 204, r
        env = dict(d.envd_headers(sb_b, ctype="application/connect+json"))
        body = {"templateID": "base", "timeout": 600}

        with _stopped(d):
            a = [Sent(d, f"a{i}", "POST", "/v2/sandboxes", body, key=d.key) for i in range(BURST)]
            b_create = Sent(d, "b-create", "POST", "/v2/sandboxes", body, key=key_b)
            b_run = Sent(d, "b-run", "POST", "/process.Process/Start", _start_body("echo existing"),
                         headers=env.items())
            b_resume = Sent(d, "b-resume", "POST", f"/sandboxes/{paused_b['sandboxID']}/resume",
                            {"timeout": 600}, key=key_b)
            health = Sent(d, "health", "GET", "/health")

        new_b = {}

        def then(s):
            if s is b_create and s.resp is not None and s.resp.status == 201:
                sb = s.resp.json()
                d.created[sb["sandboxID"]] = key_b
                with HttpConn(d.host, d.port, timeout=600) as c:
                    r = c.request("POST", "/process.Process/Start", _start_body("echo new"),
                                  headers=d.envd_headers(sb, ctype="application/connect+json"))
                new_b.update(resp=r, at=time.monotonic())

        _read_all([*a, b_create, b_run, b_resume, health], then)
        for s in a:
            assert s.resp is not None and s.resp.status == 201, (s.name, s.resp, s.error)
            d.created[s.resp.json()["sandboxID"]] = d.key
        assert b_create.resp is not None and b_create.resp.status == 201, (b_create.resp, b_create.error)
        assert b_resume.resp is not None and b_resume.resp.status == 201, (b_resume.resp, b_resume.error)
        assert health.resp is not None and health.resp.status == 200, (health.resp, health.error)
        _run_check(b_run.resp, b"existing\n")
        _run_check(new_b.get("resp"), b"new\n")

        # the daemon's own order: B's create was not made after A's burst
        order = _creation_order(d.data_dir)
        b_id = b_create.resp.json()["sandboxID"]
        a_ids = {s.resp.json()["sandboxID"] for s in a}
        a_after_b = sum(1 for sid in order[order.index(b_id) + 1:] if sid in a_ids)
        later = {"b-create": _later(a, b_create.at), "b-run": _later(a, b_run.at),
                 "b-resume": _later(a, b_resume.at), "health": _later(a, health.at),
                 "b-create+run": _later(a, new_b["at"])}
        print(f"\n{backend}: A's creates made after B's: {a_after_b} of {BURST}; "
              f"A's answers still to come when B's came: {later}")
        assert a_after_b >= BURST // 2, (a_after_b, order)
        for what, n in later.items():
            assert n >= 3, f"{what} was answered after {BURST - n} of A's {BURST} creates: {later}"

        # they all went through admission, and nothing waits any more
        m = _metrics(d)
        assert _metric(m, "hutch_admission_wait_seconds_count", 'route="sandboxes_create"') >= BURST + 1, m
        assert _metric(m, "hutch_admission_wait_seconds_count", 'route="sandbox_resume"') >= 1, m
        assert _metric(m, "hutch_admission_queued") == 0, m
        assert d.request("GET", "/health").status == 200
    finally:
        _stop(d)


def test_beyond_its_bound_a_team_gets_429_at_once(sandboxed_hutch, tmp_path):
    """max-queued-per-team 4: of twelve creates of A read at once, at most
    four wait or run at a time; the others are refused with 429, Retry-After
    and the API's JSON error, before A's last create is answered. B's create
    is not refused: the bound is A's."""
    d = _daemon(sandboxed_hutch, tmp_path, "--max-queued-per-team", "4")
    key_b = _key_create(sandboxed_hutch, d.data_dir, "fair-b-" + secrets.token_hex(3))
    try:
        body = {"templateID": "base", "timeout": 600}
        with _stopped(d):
            a = [Sent(d, f"a{i}", "POST", "/v2/sandboxes", body, key=d.key) for i in range(12)]
            b = Sent(d, "b", "POST", "/v2/sandboxes", body, key=key_b)
        _read_all([*a, b])
        for s in [*a, b]:
            if s.resp is not None and s.resp.status == 201:
                d.created[s.resp.json()["sandboxID"]] = key_b if s is b else d.key
        assert b.resp is not None and b.resp.status == 201, (b.resp, b.error)
        ok = [s for s in a if s.resp is not None and s.resp.status == 201]
        refused = [s for s in a if s.resp is not None and s.resp.status == 429]
        assert len(ok) + len(refused) == len(a), [(s.name, s.resp, s.error) for s in a]
        print(f"\nA: {len(ok)} created, {len(refused)} refused")
        assert len(ok) >= 4 and refused, [(s.name, s.resp) for s in a]
        for s in refused:
            assert s.resp.header("Retry-After") == "1", s.resp
            assert s.resp.header("Content-Type") == "application/json", s.resp
            j = s.resp.json()
            assert j["code"] == 429 and "max-queued-per-team" in j["message"], j
        # refused at once, not after a wait: before A's last create was answered
        assert max(s.at for s in refused) < max(s.at for s in ok)
        # the rows are the answered creates', and only theirs
        rows = _rows(d.data_dir)
        assert sorted(sid for sid, (_, st, _) in rows.items() if st == 1) == \
            sorted(s.resp.json()["sandboxID"] for s in [*ok, b])
        m = _metrics(d)
        assert _metric(m, "hutch_admission_refused_total", 'limit="team"') == len(refused), m
        # the bound frees as the queue drains: A creates again
        sb = d.create(timeout=600)
        assert sb["sandboxID"]
    finally:
        _stop(d)


def test_the_daemon_wide_bound(sandboxed_hutch, tmp_path):
    """max-queued 3 bounds all teams together: what is beyond it is refused
    with 429 naming the daemon's limit."""
    d = _daemon(sandboxed_hutch, tmp_path, "--max-queued", "3")
    key_b = _key_create(sandboxed_hutch, d.data_dir, "fair-b-" + secrets.token_hex(3))
    try:
        body = {"templateID": "base", "timeout": 600}
        with _stopped(d):
            sent = [Sent(d, f"a{i}", "POST", "/v2/sandboxes", body, key=d.key) for i in range(5)]
            sent += [Sent(d, f"b{i}", "POST", "/v2/sandboxes", body, key=key_b) for i in range(5)]
        _read_all(sent)
        for s in sent:
            if s.resp is not None and s.resp.status == 201:
                d.created[s.resp.json()["sandboxID"]] = key_b if s.name.startswith("b") else d.key
        statuses = sorted(s.resp.status for s in sent if s.resp is not None)
        assert len(statuses) == len(sent) and set(statuses) <= {201, 429}, statuses
        refused = [s for s in sent if s.resp.status == 429]
        assert refused and statuses.count(201) >= 3, statuses
        for s in refused:
            j = s.resp.json()
            assert j["code"] == 429 and "max-queued)" in j["message"] and s.resp.header("Retry-After") == "1", j
        assert _metric(_metrics(d), "hutch_admission_refused_total", 'limit="daemon"') == len(refused)
    finally:
        _stop(d)


def test_a_waiting_create_whose_client_left_makes_nothing(sandboxed_hutch, tmp_path):
    """Creates whose clients went away while they waited are dropped: no
    sandbox, no row, no event; the others are made as usual."""
    d = _daemon(sandboxed_hutch, tmp_path)
    try:
        body = {"templateID": "base", "timeout": 600}
        with _stopped(d):
            kept = [Sent(d, f"kept{i}", "POST", "/v2/sandboxes", body, key=d.key) for i in range(4)]
            gone = [Sent(d, f"gone{i}", "POST", "/v2/sandboxes", body, key=d.key) for i in range(4)]
            for s in gone:
                s.conn.close()
        _read_all(kept)
        made = []
        for s in kept:
            assert s.resp is not None and s.resp.status == 201, (s.resp, s.error)
            made.append(s.resp.json()["sandboxID"])
            d.created[made[-1]] = d.key
        assert sorted(_rows(d.data_dir)) == sorted(made)
        assert sorted(_creation_order(d.data_dir)) == sorted(made)
        assert _metric(_metrics(d), "hutch_admission_queued") == 0
        assert d.request("GET", "/health").status == 200
    finally:
        _stop(d)


def test_a_stop_answers_the_waiting_creates(sandboxed_hutch, tmp_path):
    """SIGTERM while creates wait: each client gets its 201 or a 503 (or, at
    worst, a closed connection), never a sandbox it was not told of; the
    next start finds exactly the answered ones."""
    d = _daemon(sandboxed_hutch, tmp_path)
    try:
        body = {"templateID": "base", "timeout": 600}
        with _stopped(d):
            # enough that most still wait when the first is answered
            sent = [Sent(d, f"a{i}", "POST", "/v2/sandboxes", body, key=d.key) for i in range(16)]
        first = threading.Event()

        def then(s):
            first.set()
        ts = [threading.Thread(target=lambda s=s: (s.read(), then(s))) for s in sent]
        for t in ts:
            t.start()
        assert first.wait(300), "no create was answered"
        d.proc.send_signal(signal.SIGTERM)
        for t in ts:
            t.join(300)
        d.proc.wait(60)
        made = []
        for s in sent:
            if s.resp is not None and s.resp.status == 201:
                made.append(s.resp.json()["sandboxID"])
                d.created[made[-1]] = d.key
            elif s.resp is not None:
                assert s.resp.status == 503 and s.resp.json() == \
                    {"code": 503, "message": "the daemon is stopping"}, s.resp
        print(f"\n{len(made)} created, {sum(1 for s in sent if s.resp is not None and s.resp.status == 503)} "
              f"answered 503, {sum(1 for s in sent if s.resp is None)} closed")
        assert 1 <= len(made) < len(sent), [(s.resp, s.error) for s in sent]
        assert sorted(_creation_order(d.data_dir)) == sorted(made)
        d.start()
        assert sorted(d.list_ids()) == sorted(made)
    finally:
        _stop(d)
