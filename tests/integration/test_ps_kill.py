"""`hutch ps` lists live sandboxes; `hutch kill ID` destroys one."""

import fcntl
import json
import os
import secrets
import string
import time

import hutchtest
from hutchtest import BackgroundRun, run_hutch


def _uid_of(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None


def test_ps_lists_and_kill_destroys(warm, baseline):
    before = hutchtest.ps_sandboxes()
    with BackgroundRun(["--json"], ["sh", "-c", "echo READY; exec sleep 1000"]) as bg:
        bg.wait_for(b"READY\n")
        now = hutchtest.ps_live_sandboxes()
        new = set(now) - set(before)
        assert len(new) == 1, (before, now)
        (sid,) = new
        fields = now[sid]
        assert len(fields) >= 3, fields  # init host pid, template, age
        init_pid = int(fields[0])
        assert fields[1] == "host", fields
        # The init pid is a live host process running as the sandbox's root.
        uid = _uid_of(init_pid)
        assert uid is not None and uid >= hutchtest.UID_BASE, (init_pid, uid)

        cp = run_hutch(["kill", sid], timeout=60)
        assert cp.returncode == 0, cp.stderr
        rc = bg.wait(60)
        assert rc != 0, (rc, bg.stderr)
        assert rc in (137, 125), rc
        # If the summary line was written, it names the same sandbox.
        last = hutchtest.stderr_lines(bg.stderr)[-1:]
        if last and last[0].startswith("{"):
            _, s = hutchtest.parse_json_summary(bg.stderr)
            assert s["sandbox_id"] == sid

    assert sid not in hutchtest.ps_sandboxes()
    uid = _uid_of(init_pid)
    assert uid is None or uid < hutchtest.UID_BASE, "the sandbox's init still runs"
    hutchtest.assert_no_leak(baseline, what="after hutch kill")


def test_kill_twice_fails_the_second_time(warm, baseline):
    before = set(hutchtest.ps_sandboxes())
    with BackgroundRun([], ["sh", "-c", "echo READY; exec sleep 1000"]) as bg:
        bg.wait_for(b"READY\n")
        (sid,) = set(hutchtest.ps_live_sandboxes()) - before
        assert run_hutch(["kill", sid], timeout=60).returncode == 0
        bg.wait(60)
        cp = run_hutch(["kill", sid], timeout=60)
        assert cp.returncode != 0
        hutchtest.assert_single_error_line(cp)
    hutchtest.assert_no_leak(baseline)


def test_gc_leaves_a_sandbox_in_transit_and_removes_a_dead_create(warm):
    """A sandbox directory whose lock is held (a create, checkpoint or
    teardown under way in another process) is not gc's to judge, however old
    it looks; once unlocked, a directory without state is a create that died,
    and gc removes it."""
    sid = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(20))
    d = hutchtest.STATE_DIR / sid
    d.mkdir(mode=0o711, parents=True)
    try:
        old = time.time() - 600
        os.utime(d, (old, old))
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            cp = run_hutch(["gc"], timeout=60)
            assert cp.returncode == 0, cp.stderr
            assert d.exists(), "gc removed a sandbox whose lock was held"
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        cp = run_hutch(["gc"], timeout=60)
        assert cp.returncode == 0, cp.stderr
        assert not d.exists(), "gc left a dead create's directory"
    finally:
        if d.exists():
            d.rmdir()


def test_ps_lists_live_ones_with_owner_filters_and_quiet(warm, tmp_path):
    """`hutch ps` lists live sandboxes with their backend and who made them;
    -a adds dead ones, -q prints ids only, --filter narrows (state, backend,
    template, owner, id), --json carries the owner; a bad filter is a usage
    error."""
    with BackgroundRun([], ["sh", "-c", "echo READY; exec sleep 1000"]) as bg:
        bg.wait_for(b"READY\n")
        live = hutchtest.ps_live_sandboxes()
        cp = run_hutch(["ps"])
        assert cp.returncode == 0, cp.stderr
        lines = cp.stdout.decode().splitlines()
        assert lines[0].split() == ["ID", "PID", "TEMPLATE", "BACKEND", "AGE", "MEMORY", "STATE", "OWNER"]
        mine = [l for l in lines[1:] if f"hutch run pid {bg.proc.pid}" in l]
        assert len(mine) == 1, lines
        sid = mine[0].split()[0]
        assert sid in live and mine[0].split()[3] == "ns" and " running " in mine[0], mine
        # a dead one: a sandbox directory whose init is gone (a create that died)
        dead = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(20))
        (hutchtest.STATE_DIR / dead).mkdir(mode=0o711)
        try:
            assert dead not in run_hutch(["ps"]).stdout.decode()
            assert dead in run_hutch(["ps", "-a"]).stdout.decode()
            dead_ids = run_hutch(["ps", "-q", "--filter", "state=dead"]).stdout.decode().split()
            assert dead in dead_ids and sid not in dead_ids, dead_ids
            # short flags combine as in docker: -aq is -a -q
            both = run_hutch(["ps", "-aq", f"--filter=id={dead}"]).stdout.decode().split()
            assert both == [dead], both
        finally:
            (hutchtest.STATE_DIR / dead).rmdir()
        q = run_hutch(["ps", "-q", "--filter", f"owner=hutch run pid {bg.proc.pid}", "--filter", "backend=ns",
                       "--filter", "template=host", "--filter", f"id={sid[:6]}"])
        assert q.returncode == 0 and q.stdout.decode().split() == [sid], q
        assert run_hutch(["ps", "-q", "--filter", "backend=gvisor", "--filter", f"id={sid}"]).stdout == b""
        js = json.loads(run_hutch(["ps", "--json", "--filter", f"id={sid}"]).stdout)
        assert js == [dict(js[0], id=sid, state="running", backend="ns", template="host",
                           owner=f"hutch run pid {bg.proc.pid}")], js
        bad = run_hutch(["ps", "--filter", "colour=red"])
        assert bad.returncode == 2
        hutchtest.assert_single_error_line(bad, "invalid --filter 'colour=red'")
        assert run_hutch(["kill", sid]).returncode == 0
        bg.wait(60)
