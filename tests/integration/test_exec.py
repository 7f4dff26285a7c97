"""`hutch exec ID -- CMD`: a command in a live sandbox, as `docker exec` runs one.

The sandbox is a `hutch run` one (a daemon's are the same to exec: both are
live sandboxes of the run dir). Each test checks what a user sees: output,
exit status, the user, directory and environment, stdin with -i, a real
terminal with -t (its size, keys, Ctrl-C reaching the command's terminal),
and that the sandbox lives on afterwards.
"""

import os
import pty
import select
import signal
import struct
import termios
import fcntl
import time

import pytest

import hutchtest
from hutchtest import BackgroundRun, run_hutch


@pytest.fixture
def live(warm):
    """A live sandbox: (id, BackgroundRun). The marker file tells it apart."""
    bg = BackgroundRun(["--env", "FROM_RUN=1"], ["sh", "-c", "echo here > /tmp/marker; echo READY; exec sleep 1000"])
    try:
        bg.wait_for(b"READY\n")
        # ours by its owner (other sandboxes of this host come and go)
        cp = run_hutch(["ps", "-q", "--filter", f"owner=hutch run pid {bg.pid}"])
        ids = cp.stdout.decode().split()
        assert len(ids) == 1, (ids, cp.stderr)
        yield ids[0], bg
    finally:
        bg.stop()


def test_exec_output_status_and_identity(live):
    sid, bg = live
    cp = run_hutch(["exec", sid, "--", "sh", "-c", "cat /tmp/marker; id -u; pwd; echo oops >&2; exit 3"])
    assert cp.returncode == 3, cp.stderr
    assert cp.stdout == b"here\n1000\n/home/user\n", cp.stdout
    assert cp.stderr == b"oops\n"

    # a unique prefix names it; -u, -w and -e as in run
    cp = run_hutch(["exec", "-u", "root", "-w", "/tmp", "-e", "A=b c", sid[:8], "--", "sh", "-c",
                    'echo "$(id -u) $PWD $A $HOME ${FROM_RUN:-unset}"'])
    assert cp.returncode == 0, cp.stderr
    # exec's environment is its own, not the run's command's
    assert cp.stdout == b"0 /tmp b c /root unset\n", cp.stdout

    # the sandbox lives on after each exec
    assert bg.proc.poll() is None
    assert sid in hutchtest.ps_live_sandboxes()


def test_exec_stdin_only_with_i(live):
    sid, _ = live
    cp = run_hutch(["exec", "-i", sid, "--", "sh", "-c", "tr a-z A-Z; echo done"], stdin=b"abc\n" * 20000)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == b"ABC\n" * 20000 + b"done\n"
    # without -i the command reads /dev/null, whatever our stdin holds
    cp = run_hutch(["exec", sid, "--", "sh", "-c", "wc -c"], stdin=b"ignored")
    assert cp.stdout.strip() == b"0", cp.stdout


def test_exec_errors(live):
    sid, _ = live
    cp = run_hutch(["exec", sid, "--", "no-such-command"])
    assert cp.returncode == 127
    assert b"no-such-command: command not found" in cp.stderr
    cp = run_hutch(["exec", "zzzzzzzzzzzzzzzzzzzz", "--", "true"])
    assert cp.returncode == 1
    assert b"no sandbox 'zzzzzzzzzzzzzzzzzzzz'" in cp.stderr
    for argv, needle in ((["exec"], b"no sandbox given"), (["exec", sid], b"no command given"),
                         (["exec", "--bogus", sid, "--", "true"], b"unknown option '--bogus'"),
                         (["exec", "-u", "nobody2", sid, "--", "true"], b"invalid --user"),
                         (["exec", "-w", "rel", sid, "--", "true"], b"invalid --workdir"),
                         (["exec", "-e", "1A=x", sid, "--", "true"], b"invalid --env")):
        cp = run_hutch(argv)
        assert cp.returncode == 2, (argv, cp)
        assert needle in cp.stderr, (argv, cp.stderr)
    # a signal ends the command with 128+N, and the sandbox lives
    cp = run_hutch(["exec", sid, "--", "sh", "-c", "kill -TERM $$"])
    assert cp.returncode == 128 + signal.SIGTERM
    assert sid in hutchtest.ps_live_sandboxes()


def _read_until(fd, needle, timeout=20):
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never came; got {buf[-500:]!r}"
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            assert chunk, f"EOF before {needle!r}; got {buf[-500:]!r}"
            buf += chunk
    return buf


def test_exec_tty_size_keys_and_ctrl_c(live):
    """-it on a terminal: the command has a terminal of our size, follows a
    resize, and Ctrl-C typed on ours interrupts the command's foreground job
    (not hutch, not the sandbox); the shell then goes on."""
    sid, _ = live
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-test"
        os.execv(str(hutchtest.hutch_path()), ["hutch", "exec", "-it", sid, "--", "sh", "-i"])
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        os.write(fd, b"stty size; echo T=$TERM; tty\n")
        out = _read_until(fd, b"/dev/pts/")
        # the size at start is ours (set before or after the spawn: a resize either way)
        deadline = time.monotonic() + 10
        while b"33 101" not in out and time.monotonic() < deadline:
            os.write(fd, b"stty size\n")
            out += _read_until(fd, b"\n")
        assert b"33 101" in out, out
        assert b"T=xterm-test" in out, out
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.kill(pid, signal.SIGWINCH)
        time.sleep(0.3)
        os.write(fd, b"stty size\n")
        _read_until(fd, b"40 120")
        # Ctrl-C: the sleep is interrupted through the sandbox's terminal
        os.write(fd, b"sleep 100\n")
        time.sleep(0.5)
        t0 = time.monotonic()
        os.write(fd, b"\x03")
        os.write(fd, b"echo after=$?\n")
        _read_until(fd, b"after=130")
        assert time.monotonic() - t0 < 10
        os.write(fd, b"exit 7\n")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 7
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert sid in hutchtest.ps_live_sandboxes()


def test_exec_on_gvisor(warm):
    """The same verb on the gvisor backend: init there is reached through
    the relay, and exec, -i and -t behave alike."""
    bg = BackgroundRun(["--backend", "gvisor"], ["sh", "-c", "echo READY; exec sleep 1000"])
    try:
        bg.wait_for(b"READY\n", timeout=120)
        cp = run_hutch(["ps", "-q", "--filter", f"owner=hutch run pid {bg.pid}"])
        (sid,) = cp.stdout.decode().split()
        cp = run_hutch(["exec", "-i", sid, "--", "sh", "-c", "read x; echo got=$x; id -u; exit 4"], stdin=b"abc\n")
        assert (cp.returncode, cp.stdout) == (4, b"got=abc\n1000\n"), cp
        cp = run_hutch(["exec", "-t", sid, "--", "sh", "-c", "tty"])
        assert cp.returncode == 0 and cp.stdout.startswith(b"/dev/pts/"), cp
    finally:
        bg.stop()


def test_run_tty(warm):
    """`hutch run -it` on a terminal: the command has a terminal of our
    size, follows a resize, Ctrl-C reaches its foreground job through the
    sandbox's terminal, and the exit status is the command's."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-test"
        os.execv(str(hutchtest.hutch_path()), ["hutch", "run", "-it", "--", "sh", "-i"])
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 31, 97, 0, 0))
        os.write(fd, b"echo T=$TERM; tty\n")
        out = _read_until(fd, b"/dev/pts/")
        assert b"T=xterm-test" in out, out
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 42, 121, 0, 0))
        os.kill(pid, signal.SIGWINCH)
        time.sleep(0.3)
        os.write(fd, b"stty size\n")
        _read_until(fd, b"42 121")
        os.write(fd, b"sleep 100\n")
        time.sleep(0.5)
        os.write(fd, b"\x03")
        os.write(fd, b"echo after=$?\n")
        _read_until(fd, b"after=130")
        os.write(fd, b"exit 9\n")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 9
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    # without a terminal of ours, -t still gives the command one
    cp = run_hutch(["run", "-t", "--", "sh", "-c", "tty; stty size"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.startswith(b"/dev/pts/") and b"24 80" in cp.stdout, cp.stdout


def test_run_tty_job_control_ctrl_z(warm):
    """Ctrl-Z typed on our terminal stops the command's foreground job inside
    the sandbox (its own terminal's SIGTSTP), not hutch: the shell reports
    it stopped, `jobs` lists it, it makes no progress until `fg` resumes it,
    and its output and status come back as on a local terminal."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(str(hutchtest.hutch_path()), ["hutch", "run", "-it", "--", "bash", "--norc", "-i"])
    try:
        os.write(fd, b"PS1='$ '; echo re\"\"ady\n")  # the echo of what we type never matches
        _read_until(fd, b"ready")
        # a job (a subshell: one process group, as a pipeline would be)
        # that tells its progress: stopped by ^Z, it stops counting
        os.write(fd, b"(for i in 1 2 3 4 5 6 7 8 9; do sleep 0.4; echo tick$i; done; echo loop\"\"done)\n")
        _read_until(fd, b"tick1")
        os.write(fd, b"\x1a")
        out = _read_until(fd, b"Stopped")
        os.write(fd, b"jobs; echo lis\"\"ted\n")
        out = _read_until(fd, b"listed")
        assert b"Stopped" in out and b"for i in" in out, out
        # stopped: no tick comes while it is
        time.sleep(1.2)
        os.write(fd, b"echo qu\"\"iet\n")
        out = _read_until(fd, b"quiet")
        assert b"tick" not in out.split(b"echo qu")[0], out
        # hutch itself was not stopped: it still relays our input
        os.write(fd, b"echo alive=$((6*7))\n")
        _read_until(fd, b"alive=42")
        # fg: the job goes on to its end in the foreground
        os.write(fd, b"fg\n")
        out = _read_until(fd, b"loopdone", timeout=30)
        assert b"tick9" in out, out
        os.write(fd, b"echo after=$?\n")
        _read_until(fd, b"after=0")
        os.write(fd, b"exit 3\n")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 3
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
