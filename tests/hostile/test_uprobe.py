"""The uprobe syscalls, which the kernel lets past seccomp (docs/security.md,
"Past the filter: uretprobe and uprobe").

x86_64 syscalls 335 (uretprobe, Linux 6.11) and 336 (uprobe, 6.17) are how a
process returns from the trampolines the kernel maps into it when a host
tracer has set uprobes on a file it runs. Since kernel/seccomp.c exempts both
from every filter ("Our single exception to filtering"; backported to
stable kernels), the sandbox's filter cannot refuse them: on such a kernel
they are not answered with the filter's errno. What has to hold instead is
that a call from a sandbox does no harm: outside a trampoline uretprobe
raises SIGILL at its caller and uprobe answers ENXIO (EPROTO or SIGILL in
other kernel versions). So this asserts the outcome is one of those, or the filter's
errno (a kernel without the exemption), or ENOSYS (a kernel without the
syscall), and that the sandbox's other processes live on. On gvisor the
sentry answers (ENOSYS): the host kernel never sees the call.

Each call runs in a child of the probe, which reports a signal as 128+N."""

import errno
import os
import platform
import shutil
import signal

import pytest

import hutchtest
from .conftest import PROBE_SCRIPT

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="syscalls 335 and 336 are x86_64's uprobe syscalls")

RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
SIGILL_STATUS = 128 + signal.SIGILL

# Run both calls, then show that a process started before them (and the
# shell that ran them) is still there.
SCRIPT = ('cat > /tmp/probe && chmod 0755 /tmp/probe || exit 125\n'
          'sleep 60 & bystander=$!\n'
          'for n in uretprobe uprobe; do /tmp/probe $n >/dev/null 2>&1; echo "RESULT $n $?"; done\n'
          'kill -0 $bystander && echo "BYSTANDER alive"\n'
          'kill $bystander\n'
          'echo DONE\n')


def _run(probe_bytes, user, run_args=()):
    cp = hutchtest.run_sandbox(["--user", user, "--timeout", "60s", *run_args], ["sh", "-c", SCRIPT],
                               stdin=probe_bytes, timeout=120)
    out = cp.stdout.decode("utf-8", "replace")
    got = {w[1]: int(w[2]) for w in (line.split() for line in out.splitlines())
           if len(w) == 3 and w[0] == "RESULT"}
    return cp, out, got


@pytest.mark.parametrize("user", ["root", "user"])
def test_uprobe_syscalls_harm_no_one_but_the_caller(warm, probe_bytes, distinctive_errno, user):
    cp, out, got = _run(probe_bytes, user)
    assert cp.returncode == 0, (cp.returncode, out, cp.stderr[-2000:])
    # the exemption's outcome, the filter's, or no such syscall: never a success
    assert got.get("uretprobe") in (SIGILL_STATUS, distinctive_errno, errno.ENOSYS), (got, out)
    assert got.get("uprobe") in (errno.ENXIO, errno.EPROTO, SIGILL_STATUS, distinctive_errno,
                                 errno.ENOSYS), (got, out)
    # the caller alone paid: its parent reported, the rest of the sandbox lives
    assert "BYSTANDER alive" in out and out.rstrip().endswith("DONE"), out
    # and the sandbox still runs commands
    cp2 = hutchtest.run_sandbox(["--user", user], ["sh", "-c", PROBE_SCRIPT, "probe", "getpid"],
                                stdin=probe_bytes, timeout=60)
    assert cp2.returncode == 0, cp2


@pytest.mark.skipif(not os.access(RUNSC, os.X_OK), reason="runsc is not installed")
@pytest.mark.parametrize("user", ["root", "user"])
def test_uprobe_syscalls_on_gvisor_are_the_sentrys(warm, probe_bytes, user):
    cp, out, got = _run(probe_bytes, user, ("--backend", "gvisor"))
    assert cp.returncode == 0, (cp.returncode, out, cp.stderr[-2000:])
    # the sentry implements neither: the host kernel never runs them
    assert got.get("uretprobe") == errno.ENOSYS, (got, out)
    assert got.get("uprobe") == errno.ENOSYS, (got, out)
    assert "BYSTANDER alive" in out and out.rstrip().endswith("DONE"), out
