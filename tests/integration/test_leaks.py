"""Nothing of a sandbox is left on the host once `hutch run` has returned:
no process, mount, cgroup, state dir, uid reservation, netns or writable layer.
Compared immediately after hutch exits (no grace period: hutch must have
cleaned up before it returns)."""

import os
import signal
import subprocess
import time

import pytest

import hutchtest
from hutchtest import BackgroundRun


def test_leak_paths_are_real(warm, baseline):
    """While a sandbox is live the snapshot shows it, so an equal snapshot
    afterwards means something (and the layout constants are right)."""
    before_ids = set(hutchtest.ps_sandboxes())
    with BackgroundRun([], ["sh", "-c", "echo READY; read x || true"]) as bg:
        bg.wait_for(b"READY\n")
        live = hutchtest.take_leak_snapshot()
        ids = set(hutchtest.ps_sandboxes()) - before_ids
        for field in hutchtest.LIVE_FIELDS_REQUIRED:
            assert getattr(live, field) != getattr(baseline, field), (
                f"a live sandbox does not show in {field}; fix the layout constants in "
                f"tests/helpers/hutchtest.py\n" + baseline.diff(live))
        assert len(ids) == 1, ids
        (sid,) = ids
        assert any(sid in e for e in live.sandbox_state - baseline.sandbox_state), (
            sid, live.sandbox_state)
        assert any(c.rstrip("/").endswith("/" + sid) or f"/{sid}/" in c for c in live.cgroups), (
            sid, sorted(live.cgroups))
        assert live.netns_of_sandbox_processes >= 1
        bg.close_stdin()
        assert bg.wait() == 0
    hutchtest.assert_no_leak(baseline)


def test_200_sequential_runs_leave_nothing(run, baseline):
    failures = []
    # 200 plain runs; 50 under the sanitizers (each run is several times
    # slower there, and what ASan checks is the same code path each time)
    for i in range(50 if os.environ.get("HUTCH_TEST_SANITIZED") else 200):
        cp = run([], ["true"], timeout=60)
        if cp.returncode != 0:
            failures.append((i, cp.returncode, cp.stderr[-300:]))
    assert not failures, failures[:5]
    hutchtest.assert_no_leak(baseline, what=f"after {i + 1} runs")


LEAK_CASES = [
    pytest.param(["--timeout", "1s"], ["sleep", "100"], 124, id="timeout"),
    pytest.param(["--memory", "48M"],
                 ["python3", "-c", "x = b'1' * (200 << 20)"], 137, id="oom"),
    pytest.param([], ["no-such-command-xyz"], 127, id="missing-command"),
    pytest.param([], ["/etc/passwd"], 126, id="not-executable"),
    pytest.param([], ["sh", "-c", "kill -9 $$"], 137, id="killed-by-signal"),
    pytest.param([], ["sh", "-c", "exit 3"], 3, id="nonzero-exit"),
    # Processes that outlive the main command die with the sandbox.
    pytest.param([], ["sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & "
                                  "sleep 1000 </dev/null >/dev/null 2>&1 & echo started"],
                 0, id="background-survivors"),
    pytest.param(["--user", "root"], ["sh", "-c", "mkdir -p /a/b && echo x > /a/b/c"], 0,
                 id="root-writes"),
    pytest.param(["--workdir", "/nonexistent"], ["true"], None, id="bad-workdir"),
    pytest.param(["--template", "no-such-template"], ["true"], 125, id="unknown-template"),
    pytest.param(["--memory", "abc"], ["true"], 2, id="usage-error"),
]


@pytest.mark.parametrize("args,cmd,rc", LEAK_CASES)
def test_no_leak_after(run, baseline, args, cmd, rc):
    cp = run(args, cmd, timeout=60)
    if rc is None:
        assert cp.returncode != 0
    else:
        assert cp.returncode == rc, (cp.returncode, cp.stderr)
    hutchtest.assert_no_leak(baseline)


def test_background_process_holding_stdout_does_not_block_exit(run, baseline):
    # The main command exits while a background child still holds stdout:
    # hutch returns the main command's status and kills the rest.
    cp = run([], ["sh", "-c", "sleep 1000 & echo started"], timeout=30)
    assert (cp.returncode, cp.stdout) == (0, b"started\n"), cp.stderr
    hutchtest.assert_no_leak(baseline)


def test_stdin_not_read_by_command(run, baseline):
    # The command exits without reading: hutch must not die of SIGPIPE/EPIPE.
    cp = run([], ["true"], stdin=os.urandom(8 << 20))
    assert (cp.returncode, cp.stderr) == (0, b"")
    hutchtest.assert_no_leak(baseline)


def test_reader_closes_stdout(warm, baseline):
    # `hutch run -- yes | head -1`: the reader goes away mid-flood.
    proc = subprocess.Popen([str(hutchtest.hutch_path()), "run", "--", "yes"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.read(4096) == b"y\n" * 2048
        proc.stdout.close()
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("hutch kept running after its stdout reader went away") from None
    finally:
        hutchtest.stop_process(proc)
    assert rc != 0
    hutchtest.assert_no_leak(baseline, what="after the reader of stdout went away")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_hutch_cleans_up(warm, baseline, sig):
    with BackgroundRun([], ["sh", "-c", "echo READY; sleep 1000"]) as bg:
        bg.wait_for(b"READY\n")
        bg.proc.send_signal(sig)
        rc = bg.wait(60)
    assert rc != 0
    hutchtest.assert_no_leak(baseline, what=f"after {sig.name} to hutch run")


def test_sigkill_of_hutch_kills_the_sandbox_processes(warm, baseline):
    # hutch cannot clean up after SIGKILL, but the sandbox must not run on
    # without it (its init dies with its parent). Other leftovers (state dir,
    # cgroup) may wait for the next hutch invocation, so only processes are
    # checked here, and they get a while to die.
    ids = []
    try:
        with BackgroundRun([], ["sh", "-c", "echo READY; sleep 1000"]) as bg:
            bg.wait_for(b"READY\n")
            inits = {str(p) for p in hutchtest.sandbox_descendants(bg.pid)}
            assert inits, "no sandbox process under hutch while running"
            ids = [sid for sid, f in hutchtest.ps_sandboxes().items() if f and f[0] in inits]
            assert ids, "hutch ps does not list the running sandbox's init pid"
            bg.proc.kill()
            bg.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # Zombies are left out: reaping orphans is the host init's job.
            left = sorted((p["pid"], p["comm"]) for p in hutchtest.sandbox_processes()
                          if not p["state"].startswith("Z")
                          and (p["pid"], p["comm"], p["uids"]) not in baseline.processes)
            if not left:
                break
            time.sleep(0.1)
        assert not left, f"sandbox processes outlived a SIGKILLed hutch: {left}"
    finally:
        # Tidy what hutch could not (state dir, cgroup) with an explicit kill.
        for sid in set(ids) & set(hutchtest.ps_sandboxes()):
            hutchtest.run_hutch(["kill", sid], timeout=60)
