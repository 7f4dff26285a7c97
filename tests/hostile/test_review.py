"""Attacks found in the engine's security review, kept as regressions."""

import os
import subprocess
import time
from pathlib import Path

import pytest

import hutchtest
from hutchtest import run_sandbox


def test_no_controlling_terminal_is_shared(warm):
    """Sandbox processes must not reach the caller's terminal through
    /dev/tty (bubblewrap CVE-2017-5226: TIOCSPGRP, keystroke reads,
    KDSKBENT on a console). Run hutch under a real pty so that there *is* a
    terminal to steal."""
    import pty
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(str(hutchtest.hutch_path()),
                 [str(hutchtest.hutch_path()), "run", "--", "python3", "-c",
                  "import os\n"
                  "try:\n"
                  "    os.open('/dev/tty', os.O_RDWR)\n"
                  "    print('TTY-OPENED')\n"
                  "except OSError as e:\n"
                  "    print('TTY-ERRNO', e.errno)\n"
                  "print('SID-IS-PGID', os.getsid(0) != os.getsid(1) or os.getsid(0) == 1)\n"])
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert "TTY-OPENED" not in text, text
    assert "TTY-ERRNO 6" in text, text  # ENXIO: no controlling terminal
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, text)


def test_kernel_aio_is_not_available(warm):
    """fs.aio-max-nr is one host-wide budget: io_setup answers ENOSYS."""
    cp = run_sandbox([], ["python3", "-c",
                          "import ctypes\n"
                          "l = ctypes.CDLL(None, use_errno=True)\n"
                          "ctx = ctypes.c_ulong(0)\n"
                          "r = l.syscall(206, 128, ctypes.byref(ctx))\n"
                          "print(r, ctypes.get_errno())\n"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == [b"-1", b"38"], cp.stdout


def test_root_only_host_etc_files_never_reach_the_template(warm, token):
    """A root-only file in a copied /etc tree (a proxy password in
    profile.d) must not become readable inside: sandbox root is reachable
    from `user` through sudo."""
    secret = Path("/etc/profile.d") / f"zz-hutch-test-{token}.sh"
    try:
        secret.write_text(f"export PROXY_PASSWORD={token}\n")
        os.chmod(secret, 0o600)
        cp = run_sandbox(["--user", "root"],
                         ["sh", "-c", f"ls /etc/profile.d; cat /etc/profile.d/* 2>&1; env"])
        assert cp.returncode == 0, cp.stderr
        assert token.encode() not in cp.stdout, "a root-only host file leaked into the sandbox"
        assert token.encode() not in cp.stderr
    finally:
        secret.unlink(missing_ok=True)


def test_background_writer_does_not_outlive_timeout(warm, leak_snapshot):
    """Once the command exits, a background process that keeps writing must
    not keep hutch run (and the sandbox) alive."""
    baseline = leak_snapshot()
    cp = run_sandbox(["--timeout", "5s"], ["sh", "-c", "yes & exit 0"], timeout=60)
    assert cp.returncode == 0, cp.returncode
    hutchtest.assert_no_leak(baseline, what="after a background writer")


def test_inotify_budget_is_per_sandbox(warm):
    """A sandbox's user namespace is owned by the sandbox's own host uid, so
    per-user kernel counters (inotify instances) charge that uid, not host
    root: one sandbox exhausting its budget leaves root's daemons and other
    sandboxes theirs."""
    import ctypes
    hog = hutchtest.BackgroundRun([], ["python3", "-c",
                                       "import ctypes, sys, time\n"
                                       "l = ctypes.CDLL(None, use_errno=True)\n"
                                       "fds = []\n"
                                       "while len(fds) < 100000:\n"
                                       "    fd = l.inotify_init1(0)\n"
                                       "    if fd < 0: break\n"
                                       "    fds.append(fd)\n"
                                       "print('HELD', len(fds), flush=True)\n"
                                       "time.sleep(60)\n"])
    with hog:
        out = hog.wait_for(b"\n", timeout=60)
        held = int(out.split()[-1])
        assert held > 0, out
        libc = ctypes.CDLL(None, use_errno=True)
        fds = [libc.inotify_init1(0) for _ in range(8)]
        try:
            assert all(fd >= 0 for fd in fds), "host root lost its inotify budget to a sandbox"
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
        cp = run_sandbox([], ["python3", "-c",
                              "import ctypes\n"
                              "l = ctypes.CDLL(None, use_errno=True)\n"
                              "print(min(l.inotify_init1(0) for _ in range(8)))\n"])
        assert cp.returncode == 0, cp.stderr
        assert int(cp.stdout) >= 0, "another sandbox lost its inotify budget"
        hog.stop()
