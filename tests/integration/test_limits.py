"""Resource limits: memory, pids, disk bytes and inodes, timeouts, and the
--json accounting."""

import subprocess
import threading
import time
from pathlib import Path

import pytest

import hutchtest
from hutchtest import MiB, parse_json_summary


# ----------------------------------------------------------------- memory

def test_memory_limit_oom_kills(run, baseline):
    cp = run(["--memory", "64M", "--json"],
             ["python3", "-c", "x = b'\\x01' * (200 * 1024 * 1024); print('survived')"],
             timeout=120)
    assert cp.returncode == 137, cp.stderr
    assert b"survived" not in cp.stdout
    _, s = parse_json_summary(cp)
    assert s["oom_killed"] is True
    assert (s["exit_code"], s["signal"]) == (None, 9)
    assert s["timed_out"] is False
    assert s["memory_peak_bytes"] <= 64 * MiB + 4 * MiB, s["memory_peak_bytes"]
    hutchtest.assert_no_leak(baseline, what="after an OOM kill")


def test_within_memory_limit_succeeds(run):
    cp = run(["--memory", "64M", "--json"],
             ["python3", "-c", "x = b'\\x01' * (16 * 1024 * 1024); print(len(x))"])
    assert (cp.returncode, cp.stdout) == (0, b"16777216\n"), cp.stderr
    _, s = parse_json_summary(cp)
    assert s["oom_killed"] is False
    assert 16 * MiB < s["memory_peak_bytes"] <= 64 * MiB


def test_memory_peak_reported(run):
    cp = run(["--json"], ["python3", "-c", "x = b'\\x01' * (50 * 1024 * 1024); print(len(x))"])
    assert cp.returncode == 0, cp.stderr
    _, s = parse_json_summary(cp)
    assert s["memory_peak_bytes"] > 50 * MiB
    assert s["memory_peak_bytes"] <= 512 * MiB  # the default limit
    assert s["oom_killed"] is False


def test_cpu_time_reported(run):
    # Burn 0.3 s of CPU (measured by the process itself, not by a clock).
    code = ("import time\n"
            "while time.process_time() < 0.3:\n"
            "    sum(range(1000))\n")
    cp = run(["--json"], ["python3", "-c", code])
    assert cp.returncode == 0, cp.stderr
    _, s = parse_json_summary(cp)
    assert s["cpu_ms"] >= 300, s
    # One thread cannot use 0.3 s of CPU in less than 0.3 s of wall time.
    assert s["wall_ms"] >= 300, s


# ------------------------------------------------------------------- pids

FORK_COUNT = """
import errno, os, time
n = 0
try:
    while n < 200:
        pid = os.fork()
        if pid == 0:
            os.close(1); os.close(2)
            time.sleep(60)
            os._exit(0)
        n += 1
    print(n, 'no-limit')
except OSError as e:
    print(n, errno.errorcode[e.errno])
"""


def test_pids_limit_stops_fork(run, baseline):
    cp = run(["--pids", "32"], ["python3", "-c", FORK_COUNT], timeout=120)
    assert cp.returncode == 0, cp.stderr
    n, err = cp.stdout.decode().split()
    assert err == "EAGAIN", cp.stdout
    # 32 tasks in the sandbox, minus python and hutch's own process(es).
    assert 16 <= int(n) < 32, n
    hutchtest.assert_no_leak(baseline, what="after a pids-limited run")


def test_fork_bomb_is_contained(run, baseline):
    stop = threading.Event()
    seen = []

    def sample():
        while not stop.is_set():
            seen.append(hutchtest.count_sandbox_processes())
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        # bash, not dash: bash retries a failed fork, so the bomb keeps the
        # pids limit saturated until the timeout (dash's bomb dies out).
        cp = run(["--pids", "32", "--timeout", "5s"],
                 ["bash", "-c", "f(){ f|f& };f; sleep 100"], timeout=120)
    finally:
        stop.set()
        t.join(30)
    assert cp.returncode != 0, cp
    assert seen, "sampler did not run"
    peak = max(seen) - len(baseline.processes)
    # The bomb ran (we saw it) and never got past the limit by much (/proc is
    # read non-atomically while processes come and go, hence the slack).
    assert peak > 4, seen
    assert peak <= 32 + 16, peak
    hutchtest.assert_no_leak(baseline, what="after a fork bomb")
    cp = run([], ["echo", "alive"])
    assert (cp.returncode, cp.stdout) == (0, b"alive\n")


# ------------------------------------------------------------------- disk

def test_disk_limit(run, baseline):
    cp = run(["--disk", "64M"], ["sh", "-c",
             "dd if=/dev/zero of=/home/user/big bs=1M count=200; echo dd=$?; "
             "stat -c %s /home/user/big"], timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert b"No space left on device" in cp.stderr, cp.stderr
    out = cp.stdout.decode().split()
    assert out[0] != "dd=0", out
    size = int(out[1])
    assert 32 * MiB <= size <= 64 * MiB + 2 * MiB, size
    hutchtest.assert_no_leak(baseline, what="after filling the disk")


def test_disk_limit_covers_tmp(run):
    cp = run(["--disk", "64M"], ["sh", "-c",
             "head -c 200M /dev/zero > /tmp/big; echo rc=$?; stat -c %s /tmp/big"],
             timeout=120)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout.decode().split()
    assert out[0] != "rc=0", out
    assert int(out[1]) <= 64 * MiB + 2 * MiB, out


def test_disk_space_is_usable_again_after_delete(run):
    cp = run(["--disk", "64M"], ["sh", "-c",
             "head -c 100M /dev/zero > /home/user/a 2>/dev/null; rm /home/user/a; "
             "head -c 40M /dev/zero > /home/user/b && stat -c %s /home/user/b"], timeout=120)
    assert (cp.returncode, cp.stdout.strip()) == (0, str(40 * MiB).encode()), cp.stderr


INODE_FILL = """
import errno, os, sys
limit = int(sys.argv[1])
os.mkdir('/home/user/many')
n = 0
try:
    while n < limit + 40000:
        os.close(os.open('/home/user/many/%d' % n, os.O_CREAT | os.O_WRONLY, 0o644))
        n += 1
    print(n, 'no-limit')
except OSError as e:
    print(n, errno.errorcode[e.errno])
"""


def _fill_inodes(run, args, limit):
    # Default disk (1G, far more than these empty files need) and a generous
    # memory limit, so only the inode limit can stop it.
    cp = run(["--memory", "1G", *args], ["python3", "-c", INODE_FILL, str(limit)], timeout=240)
    assert cp.returncode == 0, cp.stderr
    n, err = cp.stdout.decode().split()
    assert err == "ENOSPC", cp.stdout
    # the layer's own directories take a few of them
    assert limit - 4096 <= int(n) <= limit + 100, n


def test_inode_limit(run, baseline):
    """--inodes is a hard limit: creating files stops with ENOSPC at it."""
    _fill_inodes(run, ["--inodes", "24576"], 24576)
    hutchtest.assert_no_leak(baseline, what="after filling the inodes")


def test_default_inode_limit(run):
    """Without --inodes the layer has the default 262144: the file system
    says so (statvfs), and filling it by creating files (a minute on this
    2-core machine, so the limit itself is filled once, above, with a
    smaller value) is what test_inode_limit shows for any value."""
    cp = run([], ["python3", "-c", "import os; print(os.statvfs('/home/user').f_files)"])
    assert cp.returncode == 0, cp.stderr
    assert 262144 - 4096 <= int(cp.stdout) <= 262144 + 100, cp.stdout


# ---------------------------------------------------------------- timeout

def test_timeout_kills_the_whole_sandbox(run, baseline):
    cp = run(["--timeout", "1s", "--json"],
             ["sh", "-c", "sleep 100 & setsid sleep 100 & trap '' TERM HUP INT; sleep 100"],
             timeout=60)
    assert cp.returncode == hutchtest.EXIT_TIMEOUT, cp.stderr
    _, s = parse_json_summary(cp)
    assert s["timed_out"] is True
    assert s["oom_killed"] is False
    assert s["exit_code"] is None
    hutchtest.assert_no_leak(baseline, what="after a timeout")


def test_timeout_not_reached(run):
    cp = run(["--timeout", "30s", "--json"], ["sh", "-c", "exit 4"])
    assert cp.returncode == 4
    _, s = parse_json_summary(cp)
    assert (s["timed_out"], s["exit_code"]) == (False, 4)


# ------------------------------------------------------------ OOM killer

def test_sandbox_processes_are_the_oom_killers_first_choice(run):
    """Every process of a sandbox has oom_score_adj 500, whatever hutch's own
    is (systemd's unit gives the daemon -1000, which a sandbox must never
    inherit: no OOM kill, its memory cgroup's included, could end it).
    hutch run is started here with 250 (a raise needs no privilege), so an
    inherited value would show as 250."""
    def at(adj):
        return lambda: open("/proc/self/oom_score_adj", "w").write(str(adj))

    cp = subprocess.run([str(hutchtest.hutch_path()), "run", "--", "sh", "-c",
                         "cat /proc/1/oom_score_adj /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"],
                        capture_output=True, timeout=60, preexec_fn=at(250))
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == [b"500", b"500", b"500"], cp.stdout


def test_gvisor_sandbox_processes_are_the_oom_killers_first_choice(tmp_path):
    """On gvisor the sandbox's memory is runsc's (the sentry and the gofer,
    started by hutch's relay): each of them has oom_score_adj 500 on the
    host (inside, gVisor's /proc shows its own)."""
    if not Path("/usr/bin/runsc").exists():
        pytest.skip("runsc is not installed")
    p = subprocess.Popen([str(hutchtest.hutch_path()), "run", "--backend", "gvisor", "--", "sh", "-c",
                          "echo up; sleep 60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: open("/proc/self/oom_score_adj", "w").write("250"))
    try:
        assert p.stdout.readline() == b"up\n", p.stderr.read() if p.poll() is not None else "no output"
        # hutch run's children: the relay, runsc and what runsc started
        kids, todo = [], [p.pid]
        while todo:
            pid = todo.pop()
            for t in Path(f"/proc/{pid}/task").iterdir():
                for c in (t / "children").read_text().split():
                    kids.append(int(c))
                    todo.append(int(c))
        names = {}
        for k in kids:
            try:
                names[k] = (Path(f"/proc/{k}/comm").read_text().strip(),
                            int(Path(f"/proc/{k}/oom_score_adj").read_text()))
            except FileNotFoundError:
                pass
        assert any(n.startswith("runsc-sandbox") or n == "exe" for n, _ in names.values()), names
        assert names and all(adj == 500 for _, adj in names.values()), names
    finally:
        p.kill()
        p.wait(30)
