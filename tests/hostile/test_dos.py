"""A fork bomb stays inside its pids limit and ends with its timeout
(docs/security.md promise 6, HostDoS): the host keeps forking, the bomb never
holds more tasks than --pids, and none of its processes outlives the run.
(Leaks of mounts, cgroups and the rest are tests/integration/test_leaks.py's
business; a global snapshot here would race other sandboxes.)"""

import os
import subprocess
import time

import hutchtest

PIDS = 64


def count_with(marker: bytes) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    n += 1
        except OSError:
            continue
    return n


def test_fork_bomb_capped_and_timed_out(warm, token):
    marker = f"hutch-bomb-{token}"
    # The bomb's processes all carry MARKER in their argv ($0 of bash -c).
    cmd = ["bash", "-c", "f(){ f|f& }; f; exec sleep 1000", marker]
    argv = [str(hutchtest.hutch_path()), "run", "--pids", str(PIDS), "--timeout", "10s",
            "--", *cmd]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    peak = 0
    host_forks_ok = True
    try:
        while proc.poll() is None and time.monotonic() - t0 < 60:
            peak = max(peak, count_with(marker.encode()))
            # The host is not starved of pids.
            host_forks_ok &= subprocess.run(["true"], timeout=10).returncode == 0
            time.sleep(0.1)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - t0

    assert rc == hutchtest.EXIT_TIMEOUT, (rc, proc.stderr.read())
    assert elapsed < 45, f"a 10s timeout took {elapsed:.1f}s"
    assert peak > 1, "the bomb never ran"
    assert peak <= PIDS, f"{peak} bomb processes with --pids {PIDS}"
    assert host_forks_ok, "the host could not fork while the bomb ran"

    deadline = time.monotonic() + 15
    while count_with(marker.encode()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count_with(marker.encode()) == 0, "fork bomb processes outlived their sandbox"
