"""Fixtures for the hostile suite (shared ones are in tests/conftest.py).

Every test here runs an escape attempt inside a real sandbox through the real
CLI and asserts that it FAILS, and fails for the right reason:

  - a syscall the seccomp filter refuses must answer the build's distinctive
    deny errno (tests build with -Dseccomp_deny_errno=200), so a pass cannot
    come from a kernel that lacks the feature;
  - a call the filter allows but the sandbox's design defeats must get the
    kernel's own answer (EPERM from the user namespace, ESRCH from the pid
    namespace, EROFS/EACCES from read-only /proc/sys).

The probe program (tests/helpers/probe.c) cannot be seen from inside a
sandbox, so it travels in through stdin:
    hutch run -- sh -c 'cat > /tmp/probe && chmod 0755 /tmp/probe && exec /tmp/probe NAME'
Its exit status is the errno it got (0: the attempt succeeded), or 128+S if
the attempt ran in a child that signal S killed.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

import pytest

import hutchtest

PROBE_SCRIPT = 'cat > /tmp/probe && chmod 0755 /tmp/probe && exec /tmp/probe "$@"'

# Many probes in one sandbox: one "RESULT NAME STATUS" line each.
BATCH_SCRIPT = ('cat > /tmp/probe && chmod 0755 /tmp/probe || exit 125\n'
                'for n in "$@"; do\n'
                '    /tmp/probe "$n" >/dev/null 2>&1\n'
                '    echo "RESULT $n $?"\n'
                'done\n')

# Host tunables no sandbox may write (each a host-wide lever).
HOST_TUNABLES = [
    "/proc/sys/vm/drop_caches",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/kernel/panic",
    "/proc/sys/fs/binfmt_misc/register",
    "/sys/kernel/uevent_helper",
    "/sys/power/state",
]

KILLED_BY_SIGSYS = 128 + signal.SIGSYS
KILLED_BY_SIGSEGV = 128 + signal.SIGSEGV


@dataclasses.dataclass
class ProbeResult:
    name: str
    rc: int
    stdout: bytes
    stderr: bytes

    def __str__(self) -> str:
        return (f"probe {self.name}: status {self.rc}, stdout={self.stdout[-2000:]!r}, "
                f"stderr={self.stderr[-2000:]!r}")


@pytest.fixture(scope="session", autouse=True)
def _require_root():
    if os.geteuid() != 0:
        pytest.fail("the hostile tests run hutch as root (sandboxes need it); run pytest as root",
                    pytrace=False)


@pytest.fixture(scope="session")
def warm(hutch_bin):
    """One plain run first: one-time setup must work before any probe means anything."""
    cp = hutchtest.run_sandbox([], ["true"], timeout=120)
    if cp.returncode != 0:
        pytest.fail(f"`hutch run -- true` fails (rc={cp.returncode}): {cp.stderr!r}",
                    pytrace=False)
    return hutch_bin


# Linux errnos end at 133 (EHWPOISON): above that, only the filter answers.
MAX_KERNEL_ERRNO = 133


@pytest.fixture(scope="session")
def distinctive_errno(deny_errno) -> int:
    """The deny errno, checked to be one that no kernel path answers by itself
    and that survives as an exit status."""
    if not MAX_KERNEL_ERRNO < deny_errno < 256 or deny_errno in (KILLED_BY_SIGSYS,
                                                                   KILLED_BY_SIGSEGV):
        pytest.fail(f"the hostile suite needs a test build with a distinctive seccomp deny "
                    f"errno (meson setup -Dseccomp_deny_errno=200); this build answers "
                    f"{deny_errno}", pytrace=False)
    return deny_errno


@pytest.fixture(scope="session")
def probe_bytes(probe_bin) -> bytes:
    return Path(probe_bin).read_bytes()


@pytest.fixture(scope="session")
def probe(warm, probe_bytes):
    """probe(NAME, *ARGS, user="root", run_args=(), timeout=60) -> ProbeResult,
    in a fresh sandbox."""

    def run(name: str, *args: str, user: str = "root", run_args: Sequence[str] = (),
            timeout: float = 60) -> ProbeResult:
        cp = hutchtest.run_sandbox(
            ["--user", user, "--timeout", f"{int(timeout)}s", *run_args],
            ["sh", "-c", PROBE_SCRIPT, "probe", name, *args],
            stdin=probe_bytes, timeout=timeout + 30)
        return ProbeResult(name, cp.returncode, cp.stdout, cp.stderr)

    return run


@pytest.fixture(scope="session")
def probe_batch(warm, probe_bytes):
    """probe_batch(NAMES, user="root", run_args=()) -> {name: status}: every
    probe in NAMES, one after the other in ONE sandbox (cached per arguments).
    Fails the test if the sandbox did not report every probe."""
    cache: dict = {}

    def run(names: Sequence[str], user: str = "root", run_args: Sequence[str] = ()) -> dict:
        key = (tuple(names), user, tuple(run_args))
        if key not in cache:
            cp = hutchtest.run_sandbox(
                ["--user", user, "--timeout", "300s", *run_args],
                ["sh", "-c", BATCH_SCRIPT, "batch", *names],
                stdin=probe_bytes, timeout=360)
            got = {}
            for line in cp.stdout.decode("utf-8", "replace").splitlines():
                words = line.split()
                if len(words) == 3 and words[0] == "RESULT":
                    got[words[1]] = int(words[2])
            cache[key] = (cp, got)
        cp, got = cache[key]
        missing = [n for n in names if n not in got]
        assert not missing, (f"batch sandbox (user={user}, {list(run_args)}) did not report "
                             f"{missing[:10]}: rc={cp.returncode} stdout={cp.stdout[-2000:]!r} "
                             f"stderr={cp.stderr[-2000:]!r}")
        return got

    return run


@pytest.fixture
def token() -> str:
    return secrets.token_hex(16)


# ------------------------------------------------------------ host side

def members_of_sandbox(pid: int) -> list:
    """Host pids of every process in the pid namespace of host pid PID."""
    ns = os.readlink(f"/proc/{pid}/ns/pid")
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") == ns:
                out.append(int(name))
        except OSError:
            continue
    return sorted(out)


@pytest.fixture
def find_sandbox():
    """find_sandbox(MARKER, timeout=60) -> (host pid of the process whose argv
    holds MARKER, host pids of every process in its sandbox)."""

    def find(marker: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while True:
            pid = hutchtest.find_sandbox_pid_with_arg(marker)
            if pid is not None:
                return pid, members_of_sandbox(pid)
            if time.monotonic() > deadline:
                raise AssertionError(f"no sandbox process with {marker!r} in its argv "
                                     f"after {timeout}s")
            time.sleep(0.05)

    return find


@pytest.fixture
def host_canary_process(token):
    """A host process whose argv carries the token: (pid, token). It must be
    invisible from inside and survive everything a sandbox does."""
    name = f"hutch-canary-{token}"
    proc = subprocess.Popen(["bash", "-c", f"exec -a {name} sleep 1000"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                if name.encode() in f.read():
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "canary process did not start"
        time.sleep(0.01)
    yield proc, token
    proc.kill()
    proc.wait(10)


@pytest.fixture
def host_canary_files(token):
    """Host files holding the token, world-readable (only the sandbox keeps
    them out): {path: content}. Checked unchanged by the tests that use them.
    The names do not contain the token (error messages repeat paths)."""
    files = {}
    name = f"hutch-canary-{secrets.token_hex(8)}"
    for d in ("/tmp", "/root"):
        p = Path(d) / name
        content = f"hutch canary {token}\n".encode()
        p.write_bytes(content)
        os.chmod(p, 0o644)
        files[str(p)] = content
    yield files
    for p in files:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
