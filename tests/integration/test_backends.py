"""The other backends, exercised as far as this host allows.

cgroup v2: this CI host is hybrid (v1 controllers, an empty cgroup2 mount at
/sys/fs/cgroup/unified). HUTCH_CGROUP=v2 runs the v2 backend there: the
sandbox is born in its cgroup (clone3 CLONE_INTO_CGROUP), sees itself at the
root of its cgroup namespace, and is killed and removed through cgroup.kill.
Limits need controllers, which only a pure v2 host has (not verified here).

storage: HUTCH_STORAGE=tmpfs is the fallback for hosts without loop devices.
"""

import os
from pathlib import Path

import pytest

import hutchtest
from hutchtest import run_sandbox

UNIFIED = Path("/sys/fs/cgroup/unified")


def _env(**kw):
    e = dict(os.environ)
    e.update(kw)
    return e


def _is_cgroup2(p: Path) -> bool:
    try:
        return os.statvfs(p) is not None and os.path.ismount(p) and \
            "cgroup2" in Path("/proc/self/mounts").read_text().split(f" {p} ")[1].split()[0]
    except (OSError, IndexError):
        return False


def _v2_mount() -> Path:
    if _is_cgroup2(Path("/sys/fs/cgroup")):
        return Path("/sys/fs/cgroup")
    if _is_cgroup2(UNIFIED):
        return UNIFIED
    pytest.fail("no cgroup2 hierarchy mounted: the v2 backend cannot be exercised")


def test_v2_backend_runs_and_cleans_up(warm, baseline):
    mount = _v2_mount()
    cp = run_sandbox(["--json"], ["sh", "-c", "cat /proc/self/cgroup; echo ok"],
                     env=_env(HUTCH_CGROUP="v2"))
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.decode().splitlines()
    assert lines[-1] == "ok"
    # the v2 line ("0::...") shows the root of the sandbox's cgroup namespace
    v2 = [l for l in lines if l.startswith("0::")]
    assert v2 == ["0::/"], lines
    _, summary = hutchtest.parse_json_summary(cp)
    sid = summary["sandbox_id"]
    assert not (mount / "hutch" / sid).exists(), "the v2 cgroup was left behind"
    hutchtest.assert_no_leak(baseline, what="after a v2-backend run")


def test_v2_backend_timeout_kills_everything(warm, baseline):
    cp = run_sandbox(["--timeout", "1s"], ["sh", "-c", "sleep 100 & sleep 100"],
                     env=_env(HUTCH_CGROUP="v2"), timeout=60)
    assert cp.returncode == 124, cp.stderr
    hutchtest.assert_no_leak(baseline, what="after a v2-backend timeout")


def test_v2_backend_ps_sees_the_sandbox_in_its_cgroup(warm, baseline):
    mount = _v2_mount()
    with hutchtest.BackgroundRun([], ["sh", "-c", "echo READY; exec sleep 1000"],
                                 env=_env(HUTCH_CGROUP="v2")) as bg:
        bg.wait_for(b"READY\n")
        live = hutchtest.ps_live_sandboxes()
        assert live, "ps shows no live sandbox"
        # every live sandbox made by this run has a cgroup under <mount>/hutch
        found = [sid for sid in live if (mount / "hutch" / sid / "cgroup.procs").exists()]
        assert found, (live, list((mount / "hutch").iterdir()))
        procs = (mount / "hutch" / found[0] / "cgroup.procs").read_text().split()
        assert len(procs) >= 2, procs  # hutch-init and the shell/sleep
        bg.stop()
    hutchtest.assert_no_leak(baseline)


def test_tmpfs_storage_limits_disk(warm, baseline):
    cp = run_sandbox(["--disk", "32M"],
                     ["sh", "-c", "dd if=/dev/zero of=/home/user/big bs=1M count=64 2>&1; "
                      "stat -c %s /home/user/big"],
                     env=_env(HUTCH_STORAGE="tmpfs"))
    out = cp.stdout.decode()
    assert "No space left on device" in out, out
    size = int(out.strip().splitlines()[-1])
    assert 16 << 20 < size <= 32 << 20, size
    hutchtest.assert_no_leak(baseline, what="after a tmpfs-layer run")


def test_ext4_layer_is_the_default_and_is_not_memory(warm, baseline):
    """With the ext4 backend a disk larger than memory fills to ENOSPC
    instead of an OOM kill: layer pages are not charged to the sandbox."""
    cp = run_sandbox(["--memory", "64M", "--disk", "160M", "--json"],
                     ["sh", "-c", "dd if=/dev/zero of=/home/user/big bs=1M count=200 2>&1; sync; "
                      "stat -c %s /home/user/big"], timeout=120)
    out = cp.stdout.decode()
    _, summary = hutchtest.parse_json_summary(cp)
    assert summary["oom_killed"] is False, (out, summary)
    assert "No space left on device" in out, out
    size = int(out.strip().splitlines()[-1])
    assert 100 << 20 < size <= 160 << 20, size
    hutchtest.assert_no_leak(baseline)
