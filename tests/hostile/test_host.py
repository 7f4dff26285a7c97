"""The host stays out of reach (docs/security.md promises 1 and 2): host files,
/etc, processes, devices, /proc/sys and /proc/sysrq-trigger.

Here the filter ALLOWS the calls; the sandbox's design is what defeats them,
so the probes must get the kernel's own answers (EPERM from the user
namespace, ESRCH from the pid namespace, ENOENT from the private root,
EROFS/EACCES from read-only /proc/sys), never success and never the
filter's errno (which would mean the test no longer tests the design).
"""

import errno
import os
import stat
from pathlib import Path

import pytest

import hutchtest
from .conftest import HOST_TUNABLES

READ_ONLY_ANSWERS = (errno.EROFS, errno.EACCES, errno.EPERM)


def assert_token_absent(token: str, *outputs) -> None:
    for out in outputs:
        data = out if isinstance(out, bytes) else str(out).encode()
        assert token.encode() not in data, f"the host canary token leaked: {data[-2000:]!r}"


# ------------------------------------------------------------- files

def test_host_canary_files_unreachable(probe, host_canary_files, token):
    outputs = []
    for path, content in host_canary_files.items():
        for attempt in (path, f"/proc/self/root{path}"):
            r = probe("read-file", attempt)
            outputs.append(r)
            assert r.rc == errno.ENOENT, r
        # hutch-init is non-dumpable: its /proc/1/root is closed to sandbox root.
        r = probe("read-file", f"/proc/1/root{path}")
        outputs.append(r)
        assert r.rc in (errno.ENOENT, errno.EACCES), r
        # The double-chroot breakout ends at the sandbox's own root.
        r = probe("chroot-escape", path)
        outputs.append(r)
        assert r.rc == errno.ENOENT, r
    cp = hutchtest.run_sandbox(
        ["--user", "root"],
        ["sh", "-c", "cat " + " ".join(host_canary_files) + "; "
         "grep -rs hutch-canary /tmp /root /home 2>/dev/null; true"])
    assert_token_absent(token, cp.stdout, cp.stderr, *(r.stdout + r.stderr for r in outputs))
    for path, content in host_canary_files.items():
        assert Path(path).read_bytes() == content, f"{path} changed"


def test_host_shadow_not_visible(warm):
    cp = hutchtest.run_sandbox(["--user", "root"], ["sh", "-c", "cat /etc/shadow; true"])
    host = Path("/etc/shadow").read_text(errors="replace")
    out = cp.stdout.decode(errors="replace")
    if host.strip():
        assert host.strip() not in out, "the host's /etc/shadow is visible"
    for line in host.splitlines():
        fields = line.split(":")
        if len(fields) > 1 and len(fields[1]) > 3 and fields[1][0] not in "!*":
            assert fields[1] not in out, f"a host password hash is visible ({fields[0]})"


def test_host_boot_id_not_visible(warm):
    """The host's boot id identifies the host across sandboxes: each sandbox
    sees its own, and sandbox root cannot set it through /proc."""
    host = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    seen = set()
    for _ in range(2):
        cp = hutchtest.run_sandbox(["--user", "root"], ["sh", "-c",
                                   "cat /proc/sys/kernel/random/boot_id; "
                                   "echo 00000000-0000-4000-8000-000000000000 > /proc/sys/kernel/random/boot_id"
                                   " 2>/dev/null && echo WROTE"])
        out = cp.stdout.decode().split()
        assert out and len(out[0]) == 36 and out[0] != host, (out, host)
        assert "WROTE" not in out, "sandbox root rewrote the boot id through /proc"
        seen.add(out[0])
    assert len(seen) == 2, "two sandboxes share a boot id"


def test_etc_is_synthesized(warm):
    # The sandbox's /etc/passwd is hutch's (root and user), not the host's.
    cp = hutchtest.run_sandbox([], ["cat", "/etc/passwd"])
    assert cp.returncode == 0, cp.stderr
    names = {ln.split(":")[0] for ln in cp.stdout.decode().splitlines() if ln}
    assert {"root", "user"} <= names, names
    host_only = {ln.split(":")[0] for ln in Path("/etc/passwd").read_text().splitlines()
                 if ln} - {"root", "user", "nobody"}
    assert not (names & host_only), f"host accounts visible: {sorted(names & host_only)}"


# --------------------------------------------------------- processes

def test_proc_shows_only_the_sandbox(warm, host_canary_process):
    proc, token = host_canary_process
    cp = hutchtest.run_sandbox(
        ["--user", "root"],
        ["sh", "-c", "ls /proc | grep -c '^[0-9]*$'; "
         "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; "
         "cat /proc/1/cmdline | tr '\\0' ' '"])
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.decode(errors="replace").splitlines()
    assert int(lines[0]) < 16, f"{lines[0]} processes visible: {cp.stdout!r}"
    assert_token_absent(token, cp.stdout, cp.stderr)
    host_init = Path("/proc/1/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert lines[-1].strip() != host_init, f"the host's init is visible: {host_init!r}"


@pytest.mark.parametrize("name", ["ptrace-outside", "kill-pid", "process-vm-readv"])
def test_host_process_unreachable(probe, host_canary_process, name):
    proc, _ = host_canary_process
    r = probe(name, str(proc.pid))
    assert r.rc == errno.ESRCH, r
    assert proc.poll() is None, "the host canary process died"


def test_init_cannot_be_ptraced(probe):
    # hutch-init is non-dumpable, and sandbox root has no CAP_SYS_PTRACE.
    r = probe("ptrace-pid", "1")
    assert r.rc == errno.EPERM, r


@pytest.mark.parametrize("how", ["shell", "probe"])
def test_kill_all_kills_only_the_sandbox(probe, warm, host_canary_process, how):
    proc, _ = host_canary_process
    if how == "probe":
        r = probe("kill-all")
        assert r.rc == 0, r  # it killed the probe's own child: the call worked
    else:
        cp = hutchtest.run_sandbox(["--user", "root"],
                                   ["sh", "-c", "sleep 100 & kill -9 -1; echo after $?"])
        assert cp.stdout == b"after 0\n", (cp.returncode, cp.stdout, cp.stderr)
    assert proc.poll() is None, "kill(-1, SIGKILL) in a sandbox killed a host process"
    # And the host can still start processes.
    assert hutchtest.run_sandbox([], ["true"]).returncode == 0


# ----------------------------------------------------------- devices

@pytest.mark.parametrize("name", ["mknod-block", "mknod-char"])
@pytest.mark.parametrize("user", ["root", "user"])
def test_mknod_device_refused_by_kernel(probe, name, user):
    # mknod is allowed by the filter (FIFOs are normal); devices need
    # CAP_MKNOD in the initial user namespace.
    r = probe(name, user=user)
    assert r.rc == errno.EPERM, r


# ------------------------------------------------------ /proc and /sys

@pytest.mark.parametrize("user", ["root", "user"])
def test_core_pattern_not_writable(probe, user):
    r = probe("write-core-pattern", user=user)
    assert r.rc in READ_ONLY_ANSWERS, r


def test_core_pattern_write_from_shell(warm):
    # Writes the host's own value back, so even a broken sandbox changes nothing.
    path = Path("/proc/sys/kernel/core_pattern")
    before = path.read_bytes()
    cp = hutchtest.run_sandbox(
        ["--user", "root"],
        ["sh", "-c", 'printf "%s" "$1" > /proc/sys/kernel/core_pattern', "sh",
         before.decode().rstrip("\n")])
    assert cp.returncode != 0, "writing /proc/sys/kernel/core_pattern succeeded"
    assert path.read_bytes() == before


@pytest.mark.parametrize("user", ["root", "user"])
def test_sysrq_trigger_not_writable(probe, user):
    r = probe("write-sysrq", user=user)
    if r.rc == 0:
        assert b"is masked (/dev/null)" in r.stderr, r
    else:
        assert r.rc in READ_ONLY_ANSWERS + (errno.ENOENT,), r


@pytest.mark.parametrize("path", HOST_TUNABLES)
def test_host_tunables_not_writable(probe, path):
    r = probe("open-write", path)
    if r.rc == 0:
        assert b"is masked (/dev/null)" in r.stderr, r
    else:
        assert r.rc in READ_ONLY_ANSWERS + (errno.ENOENT,), r


def test_host_devices_absent(warm):
    # docs/design.md §4: null zero full random urandom tty ptmx pts shm, nothing else.
    cp = hutchtest.run_sandbox([], ["sh", "-c", "ls -A /dev"])
    assert cp.returncode == 0, cp.stderr
    allowed = {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
               "fd", "stdin", "stdout", "stderr", "core", "mqueue"}
    extra = set(cp.stdout.decode().split()) - allowed
    assert not extra, f"unexpected entries in the sandbox's /dev: {sorted(extra)}"


def test_no_host_sockets(warm):
    # No host socket (docker.sock, systemd's private socket, hutch's own) is
    # reachable: list every socket inode the sandbox can find in its tree.
    cp = hutchtest.run_sandbox(
        ["--user", "root"],
        ["sh", "-c", "find / -xdev -type s 2>/dev/null; find /run /var/run /tmp -type s 2>/dev/null; true"])
    found = set(cp.stdout.decode().split())
    host_sockets = {str(p) for d in ("/run", "/var/run") for p in Path(d).rglob("*")
                    if _is_socket(p)}
    assert not (found & host_sockets), f"host sockets visible: {sorted(found & host_sockets)}"


def _is_socket(p: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(p).st_mode)
    except OSError:
        return False
