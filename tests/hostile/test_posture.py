"""Posture, seen from the host (docs/security.md promises 1 and 3): walk
/proc/<pid>/task/*/status of every thread of every process in a running
sandbox (found by its pid namespace) and check the seccomp mode, the
capability sets and the host uids. Also the same from inside, and the
namespaces and uid ranges."""

import os

import pytest

import hutchtest
from hutchtest import BackgroundRun

# Docker's default capability set without CAP_NET_RAW: CHOWN DAC_OVERRIDE
# FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT
# AUDIT_WRITE SETFCAP (lib/sandbox/caps.c).
SANDBOX_CAPS = sum(1 << c for c in (0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31))

# Four threads and a child process, alive until stdin closes.
WORKLOAD = """
import subprocess, sys, threading
ev = threading.Event()
threads = [threading.Thread(target=ev.wait) for _ in range(4)]
for t in threads:
    t.start()
child = subprocess.Popen(["sleep", "1000"])
print("READY", flush=True)
sys.stdin.read()
ev.set()
child.kill()
child.wait()
"""

NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


def read_status(path: str):
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None  # the thread exited meanwhile
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def walk_threads(pids):
    """[(pid, tid, status dict)] of every thread of PIDS."""
    out = []
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            st = read_status(f"/proc/{pid}/task/{tid}/status")
            if st is not None:
                out.append((pid, int(tid), st))
    return out


def check_posture(threads, *, user: str, nnp: bool) -> list:
    """Problems found in THREADS (empty: all good)."""
    problems = []
    for pid, tid, st in threads:
        where = f"pid {pid} tid {tid} ({st.get('Name')})"
        is_init = st["NSpid"].split()[-1] == "1"
        if st.get("Seccomp") != "2":
            problems.append(f"{where}: Seccomp {st.get('Seccomp')!r}, want 2 (filter)")
        for key in ("Uid", "Gid"):
            ids = [int(x) for x in st[key].split()]
            if min(ids) < hutchtest.UID_BASE:
                problems.append(f"{where}: host {key} {ids}: below {hutchtest.UID_BASE:#x}")
        caps = {k: int(st[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
        if caps["CapBnd"] != SANDBOX_CAPS:
            problems.append(f"{where}: CapBnd {caps['CapBnd']:#x}, want {SANDBOX_CAPS:#x}")
        for k in ("CapInh", "CapPrm", "CapEff"):
            if caps[k] & ~SANDBOX_CAPS:
                problems.append(f"{where}: {k} {caps[k]:#x} outside {SANDBOX_CAPS:#x}")
        if caps["CapAmb"]:
            problems.append(f"{where}: CapAmb {caps['CapAmb']:#x}")
        if not is_init and user != "root" and caps["CapEff"]:
            problems.append(f"{where}: CapEff {caps['CapEff']:#x} for a non-root user")
        if nnp and st.get("NoNewPrivs") != "1":
            problems.append(f"{where}: NoNewPrivs {st.get('NoNewPrivs')!r} with --no-new-privs")
        if not nnp and not is_init and st.get("NoNewPrivs") != "0":
            problems.append(f"{where}: NoNewPrivs {st.get('NoNewPrivs')!r} without --no-new-privs")
    return problems


@pytest.mark.parametrize("user,nnp", [("root", False), ("user", False), ("root", True)],
                         ids=["root", "user", "root-nnp"])
def test_every_thread_of_every_process(warm, find_sandbox, token, user, nnp):
    marker = f"hutch-posture-{token}"
    args = ["--user", user, "--timeout", "120s"] + (["--no-new-privs"] if nnp else [])
    with BackgroundRun(args, ["python3", "-c", WORKLOAD, marker]) as bg:
        bg.wait_for(b"READY\n")
        cmd_pid, members = find_sandbox(marker)
        threads = walk_threads(members)

        # The walk saw the whole sandbox: init, python with its 4 threads, sleep.
        names = [st["Name"] for _, _, st in threads]
        assert any(st["NSpid"].split()[-1] == "1" for _, _, st in threads), names
        assert sum(1 for p, _, _ in threads if p == cmd_pid) >= 5, names
        assert "sleep" in names, names

        problems = check_posture(threads, user=user, nnp=nnp)
        assert not problems, "\n".join(problems)

        # Every namespace differs from the host's (this test runs in the host's).
        for ns in NAMESPACES:
            assert os.readlink(f"/proc/{cmd_pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns

        # Sandbox uid 0 maps to the sandbox's own range, never to host uid 0.
        uid_map = hutchtest.read_uid_map(cmd_pid)
        root = hutchtest.map_id(uid_map, 0)
        assert root is not None and root >= hutchtest.UID_BASE, uid_map
        assert all(not (outside <= 0 < outside + count) for _, outside, count in uid_map), uid_map

        bg.close_stdin()
        assert bg.wait() == 0, bg.stderr


def test_two_sandboxes_get_disjoint_uid_ranges(warm, find_sandbox, token):
    cmd = ["sh", "-c", "echo READY; read x"]
    with BackgroundRun(["--user", "root"], cmd + [f"a-{token}"]) as a, \
            BackgroundRun(["--user", "root"], cmd + [f"b-{token}"]) as b:
        a.wait_for(b"READY\n")
        b.wait_for(b"READY\n")
        pa, _ = find_sandbox(f"a-{token}")
        pb, _ = find_sandbox(f"b-{token}")
        ra = hutchtest.map_id(hutchtest.read_uid_map(pa), 0)
        rb = hutchtest.map_id(hutchtest.read_uid_map(pb), 0)
        assert ra >= hutchtest.UID_BASE and rb >= hutchtest.UID_BASE, (ra, rb)
        assert abs(ra - rb) >= hutchtest.UID_RANGE, (hex(ra), hex(rb))


@pytest.mark.parametrize("user,run_args,cap_eff,nnp", [
    ("root", (), SANDBOX_CAPS, "0"),
    ("user", (), 0, "0"),
    ("root", ("--no-new-privs",), SANDBOX_CAPS, "1"),
], ids=["root", "user", "root-nnp"])
def test_posture_from_inside(probe, user, run_args, cap_eff, nnp):
    r = probe("seccomp-status", user=user, run_args=run_args)
    assert r.rc == 0, r
    st = {}
    for line in r.stdout.decode().splitlines():
        k, _, v = line.partition(":")
        st[k] = v.strip()
    assert st["Seccomp"] == "2", r
    assert int(st["CapBnd"], 16) == SANDBOX_CAPS, r
    assert int(st["CapEff"], 16) == cap_eff, r
    assert int(st["CapAmb"], 16) == 0, r
    assert st["NoNewPrivs"] == nnp, r
    want_uid = "0" if user == "root" else str(hutchtest.SANDBOX_USER_UID)
    assert st["Uid"].split() == [want_uid] * 4, r
