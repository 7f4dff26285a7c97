"""Template start and ready commands (daemon/startcmd.c), through a real
daemon with the code-interpreter template: a create waits for the ready
command without holding up the daemon's other requests, and a ready command
that never succeeds fails the create with E2B's error body within
ready-timeout, leaving no sandbox behind."""

import json
import os
import sqlite3
import threading
import time

import pytest

import hutchtest
from hutchtest import wait_until
from serveclient import ServeDaemon


def test_create_waits_for_ready_without_blocking_the_daemon(sandboxed_hutch, tmp_path):
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0"])
    d.start()
    try:
        got = {}

        def create():
            t = time.monotonic()
            got["r"] = d.request("POST", "/v2/sandboxes", {"templateID": "code-interpreter-v1"}, timeout=120)
            got["s"] = time.monotonic() - t
        th = threading.Thread(target=create)
        th.start()
        # while the kernels start, the daemon answers others at once
        lat = []
        while th.is_alive():
            t = time.monotonic()
            assert d.request("GET", "/v2/sandboxes").status == 200
            lat.append(time.monotonic() - t)
            time.sleep(0.05)
        th.join()
        r = got["r"]
        assert r.status == 201, r
        sb = r.json()
        d.created[sb["sandboxID"]] = d.key
        # (the engine's own create runs on the loop: the first request may
        # wait for it; the ready wait must not hold the others)
        fast = [x for x in lat if x < 0.1]
        assert len(fast) >= 5, (f"the create took {got['s']:.2f} s", lat)
        # answered only once the interpreter is up: /health through the daemon
        h = d.request("GET", "/health", headers={"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49999"})
        assert h.status == 200 and h.body == b'"OK"', h
    finally:
        d.stop()


def test_a_ready_command_that_never_succeeds_fails_the_create(sandboxed_hutch, tmp_path):
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0", "--ready-timeout", "3"])
    d.start()
    try:
        t = time.monotonic()
        # a python that cannot start: the default kernel never comes up
        r = d.request("POST", "/v2/sandboxes", {"templateID": "code-interpreter-v1",
                                                 "envVars": {"PYTHONHOME": "/nonexistent"}}, timeout=60)
        took = time.monotonic() - t
        assert r.status == 504, r
        body = r.json()
        assert body["code"] == 504 and "ready command did not succeed within 3 s" in body["message"], body
        assert 2.5 < took < 15, took
        assert d.list_ids() == []
        # its row ended, and its processes are gone
        db = sqlite3.connect(d.data_dir / "hutch.db")
        rows = db.execute("select id, ended_ms from sandboxes").fetchall()
        db.close()
        assert len(rows) == 1 and rows[0][1] > 0, rows
        assert wait_until(lambda: rows[0][0] not in hutchtest.ps_sandboxes(), 30)
    finally:
        d.stop()


def _execute(d, sid, body):
    """POST /execute on the sandbox's port 49999 through the daemon: the NDJSON events."""
    r = d.request("POST", "/execute", body, headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999"}, timeout=60)
    assert r.status == 200, r
    return [json.loads(line) for line in r.body.decode().splitlines() if line]


def test_the_warm_pool_hands_out_started_interpreters_with_the_creates_envs(sandboxed_hutch, tmp_path):
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0", "--interp-pool-size", "1"])
    d.start()
    try:
        assert wait_until(lambda: "(code-interpreter-v1) ready after" in d.log_tail(), 60), d.log_tail()
        t = time.monotonic()
        sb = d.create(templateID="code-interpreter-v1", envVars={"HUTCH_CLAIM": "it's mine"})
        took = time.monotonic() - t
        assert took < 0.5, f"a create from the warm pool took {took:.2f} s"
        ev = _execute(d, sb["sandboxID"], {"code": "import os; os.environ['HUTCH_CLAIM']"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["it's mine"], ev
        ev = _execute(d, sb["sandboxID"], {"code": "process.env.HUTCH_CLAIM", "language": "js"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["it's mine"], ev
        # per-call envs are restored to the claim's value afterwards
        _execute(d, sb["sandboxID"], {"code": "1", "env_vars": {"HUTCH_CLAIM": "other"}})
        ev = _execute(d, sb["sandboxID"], {"code": "import os; os.environ['HUTCH_CLAIM']"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["it's mine"], ev
        # and the pool fills again
        assert wait_until(lambda: d.log_tail(100000).count("(code-interpreter-v1) ready after") >= 2, 60)
    finally:
        d.stop()


def test_hutch_run_starts_the_interpreter_before_the_command(sandboxed_hutch, sandbox_run):
    """`hutch run --template code-interpreter` is a normal template whose
    start command runs (and is ready) before the command, with its --env."""
    code = json.dumps({"code": "import os, pandas, sklearn, matplotlib; os.environ['HUTCH_RUN_ENV']"})
    cp = sandbox_run(["--template", "code-interpreter", "--env", "HUTCH_RUN_ENV=from-run"],
                     ["sh", "-c", "curl -s localhost:49999/health && curl -sN localhost:49999/execute -d \"$0\"", code],
                     timeout=120)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout.decode()
    assert out.startswith('"OK"'), out
    events = [json.loads(line) for line in out[4:].splitlines() if line]
    assert [e.get("text") for e in events if e["type"] == "result"] == ["from-run"], events
    assert events[-1] == {"type": "end_of_execution"}


def test_kernels_have_no_tcp_port_and_forked_output_arrives(sandboxed_hutch, sandbox_run):
    """hutch-interp speaks to ipykernel's kernels over Unix sockets, and a
    kernel's pipe for its forked children's output is one too: the only TCP
    socket in the sandbox is the server's port 49999 (gVisor can checkpoint
    such a sandbox: docs/interpreter.md). A multiprocessing child's print
    still reaches the cell's stdout."""
    code = json.dumps({"code": "import multiprocessing as mp\n"
                               "mp.set_start_method('fork', force=True)\n"
                               "p = mp.Process(target=print, args=('from the child',)); p.start(); p.join()\n"
                               "print('from the parent')"})
    # the javascript kernel starts after /health answers: wait for its
    # context, then list every TCP socket of the sandbox
    script = ("curl -s localhost:49999/health >/dev/null && curl -sN localhost:49999/execute -d \"$0\" && "
              "for i in $(seq 100); do curl -s localhost:49999/contexts | grep -q javascript && break; sleep 0.1; done; "
              "sleep 1; echo; echo TCP; awk 'FNR > 1 { print $2, $3, $4 }' /proc/net/tcp /proc/net/tcp6")
    cp = sandbox_run(["--template", "code-interpreter"], ["sh", "-c", script, code], timeout=120)
    assert cp.returncode == 0, cp.stderr
    out, tcp = cp.stdout.decode().split("\nTCP\n")
    events = [json.loads(line) for line in out.splitlines() if line]
    text = "".join(e["text"] for e in events if e["type"] == "stdout")
    assert "from the child\n" in text and "from the parent\n" in text, events
    # 0100007F:C34F: 127.0.0.1:49999. It is the one listening socket, and
    # every other one (curl's, in TIME_WAIT) is a connection to it
    socks = [line.split() for line in tcp.splitlines() if line.strip()]
    assert [s[0] for s in socks if s[2] == "0A"] == ["0100007F:C34F"], tcp
    assert all(s[0].endswith(":C34F") or s[1].endswith(":C34F") for s in socks), tcp


def test_gvisor_interpreter_creates_restore_a_checkpoint(sandboxed_hutch, tmp_path):
    """gVisor (docs/interpreter.md, "On gVisor"): once an interpreter was
    wanted, the daemon checkpoints a started one (a pooled one, which then
    leaves the pool), and later code-interpreter creates restore it instead
    of starting Python's kernel:
    each gets its own envs and its own random state; a memory snapshot of
    such a sandbox keeps the kernel's state (its kernels are on Unix
    sockets); and a damaged checkpoint is removed, that create starts its
    kernels, and a new checkpoint is taken."""
    if os.environ.get("HUTCH_TEST_SANITIZED"):
        # checked by hand: in a gVisor sandbox the sanitized hutch-interp
        # stops at once ("ASan runtime does not come first in initial
        # library list"), so no interpreter there is ever ready
        pytest.skip("a sanitized hutch-interp does not start on gVisor (ASan's runtime check)")
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--backend", "gvisor"])
    d.start()
    try:
        # none until an interpreter is wanted: the first create starts its
        # kernels, and the pool then takes the checkpoint
        def pooled():
            return (data / "pool-ids").read_text().split() if (data / "pool-ids").exists() else []
        time.sleep(2)
        assert not (data / "interp-checkpoints").exists() and pooled() == []
        first = d.create(templateID="code-interpreter-v1")
        assert "restored from the interpreter checkpoint" not in d.log_tail(100000)
        ev = _execute(d, first["sandboxID"], {"code": "1 + 1"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["2"], ev
        assert wait_until(lambda: "interpreter checkpoint: " in d.log_tail(100000), 180), d.log_tail()
        ckpts = list((data / "interp-checkpoints").iterdir())
        assert len(ckpts) == 1 and ckpts[0].suffix == ".ckpt", ckpts
        assert ckpts[0].stat().st_mode & 0o777 == 0o600
        # the interpreter it was taken from was stopped by it: out of the pool
        assert wait_until(lambda: pooled() == [], 30)

        values = []
        for i in range(2):
            sb = d.create(templateID="code-interpreter-v1", envVars={"HUTCH_CLAIM": f"claim {i}"})
            sid = sb["sandboxID"]
            assert f"sandbox {sid}: restored from the interpreter checkpoint" in d.log_tail(100000)
            ev = _execute(d, sid, {"code": "import os, random\n"
                                           "(os.environ['HUTCH_CLAIM'], os.environ['E2B_SANDBOX_ID'], random.random())"})
            res = [e["text"] for e in ev if e["type"] == "result"]
            assert len(res) == 1 and res[0].startswith(f"('claim {i}', '{sid}', "), ev
            values.append(res[0].split(", ")[2])
        assert values[0] != values[1], "two restored interpreters drew the same random number"

        # a memory snapshot of it, and a create from that, keep the kernel's state
        _execute(d, sid, {"code": "x = 41"})
        r = d.request("POST", f"/sandboxes/{sid}/snapshots", {}, timeout=300)
        assert r.status == 201, r
        snap = r.json()["snapshotID"]
        sb2 = d.create(templateID=snap)
        ev = _execute(d, sb2["sandboxID"], {"code": "x + 2"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["43"], ev
        ev = _execute(d, sid, {"code": "x + 1"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["42"], ev

        # a damaged checkpoint: removed, the create starts its kernels (and
        # the pool then takes a new one, as it took the first)
        ckpts[0].write_bytes(b"HUTCHGV2 not a checkpoint at all")
        sb3 = d.create(templateID="code-interpreter-v1")
        assert "restoring the interpreter checkpoint" in d.log_tail(100000), d.log_tail()
        assert not ckpts[0].exists() or ckpts[0].stat().st_size > 1 << 20
        ev = _execute(d, sb3["sandboxID"], {"code": "6 * 7"})
        assert [e.get("text") for e in ev if e["type"] == "result"] == ["42"], ev
    finally:
        d.stop()
