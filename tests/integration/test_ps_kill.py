"""`hutch ps` lists live sandboxes; `hutch kill ID` destroys one."""

import fcntl
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
