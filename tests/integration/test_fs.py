"""The sandbox's filesystem, /etc, /dev, /proc, network view, and host tools."""

import glob
import hashlib
import os
import secrets
import shutil

import pytest

import hutchtest
from hutchtest import BackgroundRun

ALLOWED_NAMES = {"root", "user", "nobody"}
DEV_REQUIRED = {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
                "fd", "stdin", "stdout", "stderr"}
DEV_TOLERATED = {"console", "mqueue", "core"}

PY_ERRNO = ("import errno, os, sys\n"
            "try:\n"
            "    {op}\n"
            "    print('ok')\n"
            "except OSError as e:\n"
            "    print(errno.errorcode[e.errno])\n")


def _py_errno(run, op, args=()):
    cp = run(list(args), ["python3", "-c", PY_ERRNO.format(op=op)])
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.decode().strip()


# ------------------------------------------------------------------- /etc

def test_passwd_has_only_sandbox_accounts(run):
    cp = run([], ["cat", "/etc/passwd"])
    assert cp.returncode == 0, cp.stderr
    lines = [l for l in cp.stdout.decode().splitlines() if l.strip()]
    entries = {l.split(":")[0]: l.split(":") for l in lines}
    assert {"root", "user"} <= set(entries) <= ALLOWED_NAMES, lines
    # name:x:uid:gid:gecos:home:shell (the GECOS field is free)
    u = entries["user"]
    assert (u[2], u[3], u[5], u[6]) == ("1000", "1000", "/home/user", "/bin/bash"), u
    r = entries["root"]
    assert (r[2], r[3]) == ("0", "0"), r
    with open("/etc/passwd") as f:
        host_names = {l.split(":")[0] for l in f if ":" in l}
    host_only = host_names - ALLOWED_NAMES
    assert host_only, "host /etc/passwd has no account to compare with"
    assert not (set(entries) & host_only), f"host accounts visible: {set(entries) & host_only}"


def test_group_has_user(run):
    cp = run([], ["sh", "-c", "id -gn; grep -c . /etc/group"])
    assert cp.returncode == 0, cp.stderr
    group, count = cp.stdout.decode().split()
    assert group == "user"
    assert int(count) < 10


def test_hostname(run):
    cp = run([], ["sh", "-c", "cat /etc/hostname; uname -n"])
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[0] and lines[0] == lines[1], lines
    if os.uname().nodename != "hutch":
        assert lines[1] != os.uname().nodename, "the sandbox has the host's hostname"


@pytest.mark.parametrize("path", ["/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf",
                                  "/etc/group", "/etc/passwd", "/etc/hostname"])
def test_synthesized_etc_files_exist(run, path):
    cp = run([], ["test", "-f", path])
    assert cp.returncode == 0, path


def test_hosts_resolves_localhost(run):
    cp = run([], ["getent", "hosts", "localhost"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split()[0] in (b"127.0.0.1", b"::1"), cp.stdout


def test_ca_bundle(run):
    cp = run([], ["sh", "-c", "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt"])
    assert cp.returncode == 0, cp.stderr
    host = "/etc/ssl/certs/ca-certificates.crt"
    if os.path.exists(host):
        with open(host) as f:
            host_count = f.read().count("BEGIN CERTIFICATE")
        assert int(cp.stdout) == host_count
    else:
        assert int(cp.stdout) > 0


def test_host_etc_is_not_visible(run):
    """Host-specific /etc files (secrets, identity, layout) are absent, or (if
    hutch synthesizes one, like a shadow file for sudo) differ from the
    host's and name no host account. Package defaults may be shared."""
    candidates = [p for p in ["/etc/shadow", "/etc/gshadow", "/etc/machine-id", "/etc/fstab",
                              *sorted(glob.glob("/etc/ssh/ssh_host_*"))]
                  if os.path.exists(p)]
    assert candidates, "no host /etc file to compare with"
    with open("/etc/passwd") as f:
        host_only = {l.split(":")[0] for l in f if ":" in l} - ALLOWED_NAMES
    for path in candidates:
        cp = run(["--user", "root"], ["sh", "-c", f"test -e {path} || exit 99; cat {path}"])
        if cp.returncode == 99:
            continue
        assert cp.returncode == 0, (path, cp.stderr)
        with open(path, "rb") as f:
            host = f.read()
        assert cp.stdout != host, f"{path} is the host's"
        names = {l.split(b":")[0].decode("utf-8", "replace") for l in cp.stdout.splitlines()}
        assert not (names & host_only), f"{path} names host accounts {names & host_only}"


def test_etc_changes_do_not_persist_or_reach_host(run):
    with open("/etc/passwd", "rb") as f:
        host_before = hashlib.sha256(f.read()).hexdigest()
    run(["--user", "root"], ["sh", "-c", "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd"])
    cp = run([], ["grep", "-c", "^evil:", "/etc/passwd"])
    assert cp.stdout.strip() == b"0", cp.stdout
    with open("/etc/passwd", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == host_before


# ------------------------------------------------------------- /usr, /home

# Fresh names each run, so that nothing on the host can be mistaken for them.
_X = "hutch-test-" + secrets.token_hex(6)


def test_usr_is_read_only(run):
    assert _py_errno(run, f"os.open('/usr/{_X}', os.O_CREAT | os.O_WRONLY)") == "EROFS"
    assert not os.path.lexists(f"/usr/{_X}")


@pytest.mark.parametrize("op,expected", [
    (f"os.open('/usr/{_X}', os.O_CREAT | os.O_WRONLY)", {"EROFS"}),
    (f"os.mkdir('/usr/lib/{_X}')", {"EROFS"}),
    (f"os.open('/bin/{_X}', os.O_CREAT | os.O_WRONLY)", {"EROFS"}),
    (f"os.symlink('/etc/passwd', '/usr/bin/{_X}')", {"EROFS"}),
    ("os.unlink('/usr/bin/env')", {"EROFS"}),
    ("os.chmod('/usr/bin/env', 0o777)", {"EROFS"}),
    (f"os.rename('/usr/bin/env', '/usr/bin/{_X}')", {"EROFS"}),
    # Opening an existing file for writing checks permission before the mount
    # flag; with an id-mapped /usr sandbox root passes it and gets EROFS.
    ("os.open('/usr/bin/env', os.O_WRONLY)", {"EROFS", "EACCES"}),
], ids=["create", "mkdir", "create-via-bin", "symlink", "unlink", "chmod", "rename",
        "open-write"])
def test_usr_is_read_only_even_for_root(run, op, expected):
    env_before = os.stat("/usr/bin/env")
    assert _py_errno(run, op, ["--user", "root"]) in expected
    for p in (f"/usr/{_X}", f"/usr/lib/{_X}", f"/usr/bin/{_X}"):
        assert not os.path.lexists(p), f"{p} appeared on the host"
    env_after = os.stat("/usr/bin/env")
    assert (env_after.st_ino, env_after.st_mode) == (env_before.st_ino, env_before.st_mode)


def test_touch_usr_reports_read_only(run):
    cp = run([], ["touch", f"/usr/{_X}"])
    assert cp.returncode != 0
    assert b"Read-only file system" in cp.stderr, cp.stderr
    assert not os.path.lexists(f"/usr/{_X}")


def test_home_and_tmp_writable_and_owned_by_user(run):
    cp = run([], ["sh", "-c",
                  "echo a > /home/user/f && echo b > /tmp/f && mkdir /home/user/d && "
                  "stat -c '%u:%g' /home/user/f /tmp/f /home/user/d /home/user && "
                  "stat -c %a /tmp && cat /home/user/f /tmp/f"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.decode().split() == ["1000:1000"] * 4 + ["1777", "a", "b"]


def test_root_can_write_outside_home(run):
    cp = run(["--user", "root"], ["sh", "-c", f"echo x > /{_X} && cat /{_X}"])
    assert (cp.returncode, cp.stdout) == (0, b"x\n"), cp.stderr
    assert not os.path.lexists(f"/{_X}")


@pytest.mark.parametrize("user,inside_uid", [("user", 1000), ("root", 0)])
def test_files_from_host_view_are_owned_by_sandbox_range(warm, user, inside_uid):
    """A file made inside, seen from the host through /proc/PID/root, belongs to
    the sandbox's host uid range, never to host root."""
    name = "owned-" + secrets.token_hex(6)
    path = f"/tmp/{name}"
    with BackgroundRun(["--user", user],
                       ["sh", "-c", f"touch {path} && echo READY && (read x || true)"]) as bg:
        bg.wait_for(b"READY\n")
        pid = hutchtest.find_sandbox_pid_with_path(path)
        assert pid, "no sandbox process found on the host whose root holds the file"
        st = os.stat(f"/proc/{pid}/root{path}")
        host_uid = hutchtest.map_id(hutchtest.read_uid_map(pid), inside_uid)
        assert host_uid is not None and host_uid >= hutchtest.UID_BASE, host_uid
        assert st.st_uid == host_uid, (st.st_uid, host_uid)
        assert st.st_uid != 0
        # and the sandbox's processes run as that range on the host
        with open(f"/proc/{pid}/status") as f:
            uids = next(l for l in f if l.startswith("Uid:")).split()[1:]
        assert all(int(u) >= hutchtest.UID_BASE for u in uids), uids
        bg.close_stdin()
        assert bg.wait() == 0


# ------------------------------------------------------------------- /dev

def test_dev_contents(run):
    cp = run([], ["ls", "-A", "/dev"])
    assert cp.returncode == 0, cp.stderr
    names = set(cp.stdout.decode().split())
    assert DEV_REQUIRED <= names, f"missing: {DEV_REQUIRED - names}"
    assert names <= DEV_REQUIRED | DEV_TOLERATED, f"unexpected: {names - DEV_REQUIRED - DEV_TOLERATED}"


def test_dev_has_no_block_devices_and_devices_work(run):
    cp = run([], ["sh", "-c",
                  "find /dev -type b | wc -l; "
                  "head -c 16 /dev/urandom | wc -c; head -c 16 /dev/zero | wc -c; "
                  "echo x > /dev/null && echo null-ok; "
                  "(echo x > /dev/full) 2>/dev/null || echo full-enospc"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.decode().split() == ["0", "16", "16", "null-ok", "full-enospc"]


# ------------------------------------------------------------------ /proc

def test_proc_shows_only_sandbox_processes(run):
    cp = run([], ["sh", "-c", "ls /proc | grep -c '^[0-9]*$'"])
    assert cp.returncode == 0, cp.stderr
    inside = int(cp.stdout)
    host = sum(1 for p in os.listdir("/proc") if p.isdigit())
    assert 1 <= inside <= 6, inside
    assert inside < host


def test_process_sees_itself_with_small_pid(run):
    cp = run([], ["sh", "-c", "echo $$"])
    assert cp.returncode == 0
    assert int(cp.stdout) < 10


def test_seccomp_and_no_caps_for_user(run):
    cp = run([], ["sh", "-c", "grep -E '^(Seccomp|CapEff):' /proc/self/status"])
    assert cp.returncode == 0, cp.stderr
    fields = dict(l.split(":\t") for l in cp.stdout.decode().splitlines())
    assert fields["Seccomp"].strip() == "2"
    assert int(fields["CapEff"], 16) == 0


# --------------------------------------------------------------- network

def test_only_loopback(run):
    cp = run([], ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1; echo --; "
                              "tail -n +2 /proc/net/route | wc -l"])
    assert cp.returncode == 0, cp.stderr
    ifaces, routes = cp.stdout.decode().split("--")
    assert [i.strip() for i in ifaces.split()] == ["lo"]
    assert routes.strip() == "0"


def test_loopback_works(run):
    code = ("import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
            "c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n"
            "c.sendall(b'ping'); print(a.recv(4).decode())\n")
    cp = run([], ["python3", "-c", code])
    assert (cp.returncode, cp.stdout) == (0, b"ping\n"), cp.stderr


def test_net_deny_explicit(run):
    cp = run(["--net", "deny"], ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"])
    assert cp.returncode == 0
    assert cp.stdout.split() == [b"lo"]


# ------------------------------------------------------------ host tools

def test_python3(run):
    cp = run([], ["python3", "-c", "print(1)"])
    assert (cp.returncode, cp.stdout) == (0, b"1\n"), cp.stderr


@pytest.mark.skipif(not (os.path.exists("/usr/bin/node") or os.path.exists("/usr/local/bin/node")),
                    reason="node is not installed on the host under /usr")
def test_node(run):
    cp = run([], ["node", "-e", "console.log(2)"])
    assert (cp.returncode, cp.stdout) == (0, b"2\n"), cp.stderr


def test_bash_runs(run):
    cp = run([], ["bash", "-c", "echo $BASH_VERSION | cut -c1"])
    assert cp.returncode == 0 and cp.stdout.strip().isdigit(), cp


SUDO = shutil.which("sudo", path="/usr/bin:/usr/sbin:/bin:/sbin")
needs_sudo = pytest.mark.skipif(
    SUDO is None or not SUDO.startswith("/usr/"),
    reason="sudo is not installed on the host (apt-get install sudo to run this test)")


@needs_sudo
def test_sudo_works_by_default(run):
    cp = run([], ["sudo", "-n", "id", "-u"])
    assert (cp.returncode, cp.stdout) == (0, b"0\n"), cp.stderr


@needs_sudo
def test_sudo_fails_with_no_new_privs(run):
    cp = run(["--no-new-privs"], ["sudo", "-n", "id", "-u"])
    assert cp.returncode != 0
    assert cp.stdout != b"0\n"


def test_no_new_privs_off_by_default(run):
    # sudo works by default, which needs no_new_privs off.
    cp = run([], ["grep", "^NoNewPrivs:", "/proc/self/status"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split()[-1] == b"0"


def test_no_new_privs_flag_sets_the_bit(run):
    cp = run(["--no-new-privs"], ["grep", "^NoNewPrivs:", "/proc/self/status"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split()[-1] == b"1"


# ---------------------------------------------------- run-to-run isolation

def test_each_run_gets_a_fresh_root(run):
    token = secrets.token_hex(8)
    cp = run([], ["sh", "-c", f"echo {token} > /home/user/mark && echo {token} > /tmp/mark"])
    assert cp.returncode == 0, cp.stderr
    cp = run([], ["sh", "-c", "ls -A /home/user /tmp; cat /home/user/mark /tmp/mark 2>/dev/null; true"])
    assert cp.returncode == 0
    assert token.encode() not in cp.stdout
    assert b"mark" not in cp.stdout


def test_live_sandboxes_do_not_see_each_other(warm):
    """A live sandbox's files and processes are invisible to another one. The
    looking sandbox's own argv does not carry the token (it would see itself)."""
    token = "lateral-" + secrets.token_hex(8)
    with BackgroundRun([], ["sh", "-c", f"echo {token} > /tmp/{token}; echo {token} > "
                                        f"/home/user/{token}; echo READY; read x || true",
                            token]) as a:
        a.wait_for(b"READY\n")
        assert hutchtest.find_sandbox_pid_with_arg(token), "canary sandbox not found on host"
        cp = hutchtest.run_sandbox(["--user", "root"], [
            "sh", "-c",
            "ls -A /tmp /home/user; cat /tmp/* /home/user/* 2>/dev/null; "
            "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"])
        assert cp.returncode == 0, cp.stderr
        assert b"/home/user" in cp.stdout  # the listing ran
        assert token.encode() not in cp.stdout, cp.stdout
        a.close_stdin()
        assert a.wait() == 0
