"""Foreign syscall ABIs (docs/security.md promise 3): the 32-bit (int $0x80) and
x32 (__X32_SYSCALL_BIT) entry points must not offer what the x86_64 filter
refuses. The filter knows the native ABI only and kills the process for any
other (SIGSYS), so each attempt runs in a child of the probe, which reports
"killed by signal 31 (SIGSYS)" and exits 128+31."""

import platform
import signal

import pytest

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="x32 and int $0x80 are x86_64 ABIs")

SIGSYS_STATUS = 128 + signal.SIGSYS
# A kernel booted with ia32_emulation=0 (or built without it) answers int
# $0x80 with #GP before seccomp runs: refused outright, also fine.
SIGSEGV_STATUS = 128 + signal.SIGSEGV


@pytest.mark.parametrize("user", ["root", "user"])
def test_x32_syscall_refused(probe, distinctive_errno, user):
    r = probe("x32-syscall", user=user)
    assert r.rc in (SIGSYS_STATUS, distinctive_errno), r
    if r.rc == SIGSYS_STATUS:
        assert b"killed by signal 31 (SIGSYS)" in r.stdout, r


@pytest.mark.parametrize("name", ["int80-getpid", "int80-unshare"])
@pytest.mark.parametrize("user", ["root", "user"])
def test_int80_refused(probe, distinctive_errno, name, user):
    # int80-unshare is i386 unshare(CLONE_NEWUSER): it succeeds without the
    # filter, so a 32-bit hole would show here first.
    r = probe(name, user=user)
    assert r.rc in (SIGSYS_STATUS, SIGSEGV_STATUS, distinctive_errno), r
    assert r.rc != 0, f"{name}: the 32-bit syscall SUCCEEDED: {r}"
