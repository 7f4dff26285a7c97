"""The same refusals through the ordinary tools an attacker would reach for
first (util-linux, python): each must fail, and fail with the filter's
errno, so the refusal is the filter's and not an accident of the tool."""

import os
import platform

import pytest

import hutchtest


def run_root(cmd, **kw):
    return hutchtest.run_sandbox(["--user", "root"], cmd, **kw)


@pytest.mark.parametrize("cmd", [
    ["unshare", "-U", "true"],
    ["unshare", "-Ur", "true"],
    ["unshare", "-n", "true"],
    ["unshare", "-m", "true"],
], ids=lambda c: " ".join(c))
def test_unshare_fails(warm, distinctive_errno, cmd):
    cp = run_root(cmd)
    assert cp.returncode != 0, cp.stdout
    assert os.strerror(distinctive_errno).encode() in cp.stderr, cp.stderr


@pytest.mark.parametrize("cmd", [
    "mkdir -p /mnt && mount -t tmpfs x /mnt",
    "mkdir -p /tmp/cg && mount -t cgroup -o rdma cgroup /tmp/cg",
    "mkdir -p /tmp/b && mount --bind / /tmp/b",
    "umount -l /proc",
])
def test_mount_fails(warm, distinctive_errno, cmd):
    cp = run_root(["sh", "-c", cmd])
    assert cp.returncode != 0, cp.stdout
    assert os.strerror(distinctive_errno).encode() in cp.stderr, cp.stderr


def test_mount_left_nothing(warm):
    cp = run_root(["sh", "-c", "mkdir -p /mnt; mount -t tmpfs x /mnt 2>/dev/null; "
                               "grep -c ' /mnt ' /proc/self/mountinfo; true"])
    assert cp.stdout.strip() == b"0", cp.stdout


@pytest.mark.parametrize("family,name", [(40, "AF_VSOCK"), (38, "AF_ALG")])
@pytest.mark.parametrize("user", ["root", "user"])
def test_python_socket_family_refused(warm, distinctive_errno, family, name, user):
    code = f"import socket; socket.socket({family}, socket.SOCK_SEQPACKET if {family} == 38 else socket.SOCK_STREAM)"
    cp = hutchtest.run_sandbox(["--user", user], ["python3", "-c", code])
    assert cp.returncode != 0, f"socket({name}) succeeded"
    assert f"[Errno {distinctive_errno}]".encode() in cp.stderr, cp.stderr


def test_python_ordinary_sockets_work(warm):
    # The families the filter allows (loopback traffic itself is the
    # integration suite's business).
    code = ("import socket\n"
            "a, b = socket.socketpair()\n"
            "a.sendall(b'ping'); print(b.recv(4).decode())\n"
            "for fam in (socket.AF_INET, socket.AF_INET6):\n"
            "    socket.socket(fam, socket.SOCK_STREAM).close()\n"
            "    socket.socket(fam, socket.SOCK_DGRAM).close()\n"
            "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()\n"
            "s = socket.socket(socket.AF_UNIX); s.bind('\\0hutch-test'); s.listen()\n"
            "c = socket.socket(socket.AF_UNIX); c.connect('\\0hutch-test')\n"
            "d, _ = s.accept(); c.sendall(b'unix'); print(d.recv(4).decode())\n")
    cp = hutchtest.run_sandbox([], ["python3", "-c", code])
    assert (cp.returncode, cp.stdout) == (0, b"ping\nunix\n"), cp.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 syscall number")
def test_keyctl_from_python(warm, distinctive_errno):
    # keyctl(KEYCTL_GET_KEYRING_ID = 0, KEY_SPEC_SESSION_KEYRING = -3) through libc's syscall().
    code = ("import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.syscall(250, 0, -3, 0)\n"
            "print(r, ctypes.get_errno())\n")
    cp = run_root(["python3", "-c", code])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == [b"-1", str(distinctive_errno).encode()], cp.stdout


def test_io_uring_from_python(warm, distinctive_errno):
    code = ("import ctypes\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "params = ctypes.create_string_buffer(120)\n"
            "r = libc.syscall(425, 1, params)\n"
            "print(r, ctypes.get_errno())\n")
    cp = run_root(["python3", "-c", code])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == [b"-1", str(distinctive_errno).encode()], cp.stdout
