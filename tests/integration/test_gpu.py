"""GPU sandboxes (issue 15, docs/gpu.md), without a GPU: a fake NVIDIA
device tree, driver root and proc directory made by the test, used by the
real binaries through HUTCH_GPU_* (hutch run) and the gpu-* settings
(hutch serve).

- The sandbox gets exactly its GPU's node and the control nodes, usable by
  its uid: opening them passes the device cgroup and reaches the (missing)
  driver, ENXIO. A node it was not given, put into its /dev from the host,
  is refused by the device cgroup: EPERM (v1; v2 has no device policy).
- The driver's libraries and programs are there read-only (EROFS), found
  through LD_LIBRARY_PATH and PATH (a stub libnvidia-ml, compiled here,
  loads and answers inside); /proc/driver/nvidia shows its own GPU only,
  with ModifyDeviceFiles off.
- --gpus and the create's gpus are parsed strictly; gvisor refuses them.
- Two sandboxes never get one GPU: through the API (409, nothing changes),
  and between the daemon and a `hutch run`; the GPU is free again once
  its sandbox is killed, and still held after a daemon restart.
- The ledger bills GPUs x lifetime and the GPU memory the stub NVML
  reports for the sandbox's own processes, null where no NVML measured.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import hutchtest
from hutchtest import BackgroundRun, assert_single_error_line, run_hutch
from serveclient import ServeDaemon, free_port

LIBDIR = "usr/lib/x86_64-linux-gnu" if os.uname().machine == "x86_64" else "usr/lib/aarch64-linux-gnu"
GPU_RESERVATIONS = hutchtest.RUN_DIR / "gpus"

# A stub NVML: two GPUs (minor numbers 0 and 1); the processes on each
# are the lines "MINOR PID BYTES" of $HUTCH_TEST_NVML_PROCS.
NVML_STUB = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) { *d = (void *) (uintptr_t) (i + 1); return 0; }
int nvmlDeviceGetMinorNumber(void *d, unsigned *m) { *m = (unsigned) (uintptr_t) d - 1; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *count, proc_t *out) {
        const char *f = getenv("HUTCH_TEST_NVML_PROCS");
        FILE *fp = f ? fopen(f, "re") : NULL;
        unsigned minor, pid, n = 0;
        unsigned long long bytes;
        while (fp && fscanf(fp, "%u %u %llu", &minor, &pid, &bytes) == 3)
                if (minor == (unsigned) (uintptr_t) d - 1) {
                        if (n < *count) {
                                out[n].pid = pid;
                                out[n].used = bytes;
                        }
                        n++;
                }
        if (fp)
                fclose(fp);
        if (n > *count) {
                *count = n;
                return 7;
        }
        *count = n;
        return 0;
}
"""
CUDA_STUB = r"""
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
"""

EXIT_USAGE = hutchtest.EXIT_USAGE


def _compile(src: str, out: Path):
    c = out.with_suffix(".c")
    c.write_text(src)
    cp = subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(c)], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    c.unlink()


def make_tree(base: Path, nvml: bool = True) -> dict:
    """dev/ (nvidia0, nvidia1, nvidiactl, nvidia-uvm, nvidia-uvm-tools),
    root/ (libcuda, libnvidia-ml with an absolute link, decoys, nvidia-smi)
    and proc/ (params, version, gpus/<bus>/information)."""
    dev, root, proc = base / "dev", base / "root", base / "proc"
    lib = root / LIBDIR
    for d in (dev, lib, root / "usr/bin", proc / "gpus/0000:00:1e.0", proc / "gpus/0000:00:1f.0"):
        d.mkdir(parents=True)
    # 195 is the driver's major; 240-254 are for local use: no driver here
    for name, maj, mi in (("nvidia0", 195, 0), ("nvidia1", 195, 1), ("nvidiactl", 195, 255),
                          ("nvidia-uvm", 240, 0), ("nvidia-uvm-tools", 240, 1)):
        os.mknod(dev / name, 0o20666, os.makedev(maj, mi))
        os.chmod(dev / name, 0o666)
    _compile(CUDA_STUB, lib / "libcuda.so.550.54.14")
    # world-writable on the host: only the read-only bind keeps the sandbox off it
    os.chmod(lib / "libcuda.so.550.54.14", 0o777)
    (lib / "libcuda.so.1").symlink_to("libcuda.so.550.54.14")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    if nvml:
        _compile(NVML_STUB, lib / "libnvidia-ml.so.550.54.14")
        # absolute, as Debian's alternatives links are: resolved inside the root
        (lib / "libnvidia-ml.so.1").symlink_to("/" + LIBDIR + "/libnvidia-ml.so.550.54.14")
    (lib / "libnvidia-container.so.1").write_text("not the driver's\n")
    (lib / "libz.so.1").write_text("not the driver's\n")
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI stub'\n")
    smi.chmod(0o755)
    (root / "usr/bin/nvidia-persistenced").write_text("#!/bin/sh\n")
    (proc / "params").write_text("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n")
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14 (stub)\n")
    (proc / "gpus/0000:00:1e.0/information").write_text("Model: Stub\nDevice Minor: 0\n")
    (proc / "gpus/0000:00:1f.0/information").write_text("Model: Stub\nDevice Minor: 1\n")
    return {"dev": dev, "root": root, "proc": proc}


def run_env(tree: dict) -> dict:
    env = dict(os.environ)
    env.update(HUTCH_GPU_DEV_DIR=str(tree["dev"]), HUTCH_GPU_DRIVER_ROOT=str(tree["root"]),
               HUTCH_GPU_PROC_DIR=str(tree["proc"]))
    env.pop("HUTCH_GPU_SHARE", None)
    return env


def serve_args(tree: dict) -> list:
    return ["--gpu-dev-dir", str(tree["dev"]), "--gpu-driver-root", str(tree["root"]),
            "--gpu-proc-dir", str(tree["proc"])]


def reservations() -> set:
    try:
        return {n for n in os.listdir(GPU_RESERVATIONS) if not n.startswith(".")}
    except FileNotFoundError:
        return set()


@pytest.fixture
def tree(tmp_path, warm):
    t = make_tree(tmp_path / "gpu")
    yield t
    # a kill answers before the teardown that releases the GPU
    hutchtest.wait_until(lambda: not reservations(), 20)
    assert not reservations(), f"GPU reservations left: {reservations()}"


# ------------------------------------------------------------------- parsing

@pytest.mark.parametrize("spec", ["", "x", "-1", "1.5", "65", "1000", "0,0", "1,x", "device=", "device=a",
                                  "all,0", "0,,1", "01x"])
def test_gpus_flag_refuses_bad_specs(warm, spec):
    cp = run_hutch(["run", "--gpus", spec, "--", "true"], timeout=30)
    assert cp.returncode == EXIT_USAGE, (spec, cp.returncode, cp.stderr)
    assert_single_error_line(cp, "--gpus")


def test_gpus_on_gvisor_is_a_usage_error(warm):
    cp = run_hutch(["run", "--backend", "gvisor", "--gpus", "1", "--", "true"], timeout=30)
    assert cp.returncode == EXIT_USAGE, cp.stderr
    assert_single_error_line(cp, "nvproxy")


def test_gpus_zero_is_no_gpu(warm):
    """0 asks for nothing: no GPU tree is needed, the sandbox has no node."""
    cp = run_hutch(["run", "--gpus", "0", "--", "sh", "-c", "ls /dev | grep -c nvidia || true"], timeout=60)
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, b"0\n", b"")


def test_no_gpu_on_the_host_is_a_clear_failure(warm, tmp_path):
    (tmp_path / "dev").mkdir()
    env = dict(os.environ, HUTCH_GPU_DEV_DIR=str(tmp_path / "dev"))
    cp = run_hutch(["run", "--gpus", "1", "--", "true"], env=env, timeout=60)
    assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE, cp.stderr
    assert_single_error_line(cp, "no NVIDIA GPU")


# -------------------------------------------------------- inside the sandbox

INSIDE = r"""
import ctypes, errno, os
def opened(p):
    try:
        os.close(os.open(p, os.O_RDWR)); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
out = {}
out["dev"] = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
out["open"] = {n: opened("/dev/" + n) for n in out["dev"]}
out["lib"] = sorted(os.listdir("/run/hutch/gpu/lib"))
out["bin"] = sorted(os.listdir("/run/hutch/gpu/bin"))
try:
    open("/run/hutch/gpu/lib/libcuda.so.1", "ab")
    out["write"] = "ok"
except OSError as e:
    out["write"] = errno.errorcode[e.errno]
try:
    os.mkdir("/run/hutch/gpu/lib/x")
    out["mkdir"] = "ok"
except OSError as e:
    out["mkdir"] = errno.errorcode[e.errno]
out["ld"] = os.environ.get("LD_LIBRARY_PATH")
out["path"] = os.environ.get("PATH")
out["nvmlInit"] = ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()
n = ctypes.c_int(0)
cuda = ctypes.CDLL("libcuda.so.1")
out["cuda"] = [cuda.cuInit(0), cuda.cuDeviceGetCount(ctypes.byref(n)), n.value]
out["params"] = open("/proc/driver/nvidia/params").read()
out["version"] = open("/proc/driver/nvidia/version").read()
out["proc_gpus"] = sorted(os.listdir("/proc/driver/nvidia/gpus"))
out["minor"] = [open("/proc/driver/nvidia/gpus/%s/information" % b).read() for b in out["proc_gpus"]]
out["uid"] = os.getuid()
print(repr(out))
"""


def _inside(tree, spec, user="user"):
    cp = run_hutch(["run", "--gpus", spec, "--user", user, "--", "python3", "-c", INSIDE], env=run_env(tree),
                   timeout=120)
    assert cp.returncode == 0, cp.stderr
    import ast
    return ast.literal_eval(cp.stdout.decode())


def test_the_sandbox_gets_its_gpu_and_nothing_else(tree):
    o = _inside(tree, "1")
    assert o["uid"] == 1000
    # its GPU (the first free one) and every control node; not the other GPU
    assert o["dev"] == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"], o
    # the sandbox's user may open them: the device cgroup lets the open
    # through to the driver, which is missing here (ENXIO, not EPERM/EACCES)
    assert set(o["open"].values()) == {"ENXIO"}, o["open"]
    # the driver's libraries and soname links, not a decoy's
    assert o["lib"] == ["libcuda.so", "libcuda.so.1", "libcuda.so.550.54.14", "libnvidia-ml.so.1",
                        "libnvidia-ml.so.550.54.14"], o["lib"]
    assert o["bin"] == ["nvidia-smi"], o["bin"]
    # writing the (world-writable) library: the read-only bind refuses; so
    # does the read-only tmpfs around it
    assert o["write"] == "EROFS" and o["mkdir"] == "EROFS", o
    assert o["ld"] == "/run/hutch/gpu/lib" and o["path"].endswith(":/run/hutch/gpu/bin"), o
    # the stub libraries load by soname and answer
    assert o["nvmlInit"] == 0 and o["cuda"] == [0, 0, 1], o
    assert "ModifyDeviceFiles: 0" in o["params"] and "ModifyDeviceFiles: 1" not in o["params"], o["params"]
    assert "DeviceFileMode: 438" in o["params"] and "550.54.14 (stub)" in o["version"], o
    assert o["proc_gpus"] == ["0000:00:1e.0"] and "Device Minor: 0" in o["minor"][0], o


def test_gpu_by_id_and_all(tree):
    o = _inside(tree, "device=1")
    assert [n for n in o["dev"] if re.fullmatch(r"nvidia\d+", n)] == ["nvidia1"], o["dev"]
    assert o["proc_gpus"] == ["0000:00:1f.0"], o
    o = _inside(tree, "all", user="root")
    assert o["write"] == "EROFS" and o["mkdir"] == "EROFS", o
    assert [n for n in o["dev"] if re.fullmatch(r"nvidia\d+", n)] == ["nvidia0", "nvidia1"], o["dev"]
    assert o["proc_gpus"] == ["0000:00:1e.0", "0000:00:1f.0"], o
    cp = run_hutch(["run", "--gpus", "7,", "--", "true"], env=run_env(tree), timeout=60)
    assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE
    assert_single_error_line(cp, "no GPU 7")


def test_the_run_shell_finds_nvidia_smi(tree):
    cp = run_hutch(["run", "--gpus", "1", "--", "sh", "-c", "nvidia-smi; echo $LD_LIBRARY_PATH"],
                   env=run_env(tree), timeout=60)
    assert (cp.returncode, cp.stdout) == (0, b"NVIDIA-SMI stub\n/run/hutch/gpu/lib\n"), cp.stderr


INJECT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid, src, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
AT_FDCWD, OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, MOVE_MOUNT_F_EMPTY_PATH = -100, 1, 0o2000000, 4
fd = libc.syscall(428, AT_FDCWD, src.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
if fd < 0:
    sys.exit("open_tree: " + os.strerror(ctypes.get_errno()))
# the mount point is made as the sandbox's root: host uid 0 has no id in
# the sandbox's tmpfs (EOVERFLOW)
base = int(open("/proc/%d/uid_map" % pid).read().split()[1])
ns = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY)
if libc.setns(ns, 0x00020000) != 0:
    sys.exit("setns: " + os.strerror(ctypes.get_errno()))
libc.setfsgid(base)
libc.setfsuid(base)
dst = "/dev/" + name
os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
if libc.syscall(429, fd, b"", AT_FDCWD, dst.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
    sys.exit("move_mount: " + os.strerror(ctypes.get_errno()))
"""

PROBE = r"""
import errno, os, sys, time
print("READY", flush=True)
deadline = time.time() + 60
while not os.path.exists("/dev/nvidia1") and time.time() < deadline:
    time.sleep(0.05)
for n in ("nvidia0", "nvidia1"):
    try:
        os.close(os.open("/dev/" + n, os.O_RDWR))
        print(n, "opened")
    except OSError as e:
        print(n, errno.errorcode[e.errno])
"""


def test_device_cgroup_refuses_a_gpu_not_given(tree):
    """GPU 1's node, bound into the /dev of a sandbox that was given GPU 0
    (by host root, through the sandbox's mount namespace): the node is
    there, and the device cgroup refuses it."""
    if not Path("/sys/fs/cgroup/devices").is_dir():
        pytest.skip("no v1 devices controller: on cgroup v2 hutch loads no device program (docs/cgroups.md)")
    token = f"gpu-probe-{os.getpid()}-{time.monotonic_ns()}"
    with BackgroundRun(["--gpus", "0,"], ["python3", "-c", PROBE, token], env=run_env(tree)) as bg:
        bg.wait_for(b"READY\n")
        pid = hutchtest.wait_until(lambda: hutchtest.find_sandbox_pid_with_arg(token), 30)
        assert pid, "the probe's host pid"
        cp = subprocess.run([sys.executable, "-c", INJECT, str(pid), str(tree["dev"] / "nvidia1"), "nvidia1"],
                            capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        out = bg.wait_for(b"nvidia1 ")
        bg.close_stdin()
        assert bg.wait(60) == 0, bg.stderr
    out = bg.stdout
    assert b"nvidia0 ENXIO\n" in out and b"nvidia1 EPERM\n" in out, out


# ------------------------------------------------------------ the daemon

def _metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(hutch_gpus\w*) (\S+)$", text, re.M)}


def _row(data, sid):
    db = sqlite3.connect(f"file:{data}/hutch.db?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        r = db.execute("SELECT * FROM usage WHERE sandbox_id = ?", (sid,)).fetchone()
        return dict(r) if r else None
    finally:
        db.close()


def _create(d, **fields):
    return d.request("POST", "/v2/sandboxes", {"templateID": "base", **fields}, timeout=120)


def _create_once_free(d, **fields):
    """A create right after a kill: the GPU is free once the killed
    sandbox's processes are gone (the kill answers first)."""
    r = hutchtest.wait_until(lambda: (lambda x: x if x.status != 409 else None)(_create(d, **fields)), 20, 0.2)
    assert r and r.status == 201, r
    sb = r.json()
    d.created[sb["sandboxID"]] = d.key
    return sb


def test_api_never_double_books(sandboxed_hutch, tree, tmp_path, monkeypatch):
    procs = tmp_path / "nvml-procs"
    procs.write_text("")
    monkeypatch.setenv("HUTCH_TEST_NVML_PROCS", str(procs))
    data = tmp_path / "data"
    mport = free_port()
    args = ["--pool-size", "0", "--metrics-interval", "1s", "--metrics-listen", f"127.0.0.1:{mport}",
            *serve_args(tree)]
    d = ServeDaemon(sandboxed_hutch, data, args)
    d.start()
    d2 = None
    try:
        a = d.create(gpus=1)
        r = d.request("GET", f"/sandboxes/{a['sandboxID']}")
        assert r.status == 200 and r.json()["gpus"] == [0], r
        end, out, err, _ = d.run(a, "ls /dev | grep '^nvidia[0-9]'")
        assert out == b"nvidia0\n", (out, err)

        # GPU 0 is a's: asked for by id, through metadata, or as all, it is refused
        before = d.list_ids()
        for body in ({"gpus": [0]}, {"gpus": "0,"}, {"metadata": {"hutch.gpus": "device=0"}}, {"gpus": "all"}):
            r = _create(d, **body)
            assert r.status == 409, (body, r)
            assert r.json()["code"] == 409 and "held by sandbox " + a["sandboxID"] in r.json()["message"], r.json()
        b = d.create(gpus=1)
        assert d.request("GET", f"/sandboxes/{b['sandboxID']}").json()["gpus"] == [1]
        r = _create(d, gpus=1)
        assert r.status == 409 and "1 GPU asked for, 0 free of 2" in r.json()["message"], r.json()
        for body, why in (({"gpus": 3}, "this host has 2"), ({"gpus": "bogus"}, "gpus 'bogus'"),
                          ({"gpus": [5]}, "no GPU 5"), ({"gpus": True}, "gpus must be"),
                          ({"gpus": 1, "backend": "gvisor"}, "nvproxy")):
            r = _create(d, **body)
            assert r.status == 400 and why in r.json()["message"], (body, r.json())
        # nothing of the refused creates exists: no sandbox, no ledger row
        assert d.list_ids() == sorted(before + [b["sandboxID"]])
        db = sqlite3.connect(f"file:{data}/hutch.db?mode=ro", uri=True)
        assert db.execute("SELECT count(*) FROM usage").fetchone()[0] == 2
        db.close()

        # a hutch run on the same run dir does not take them either
        cp = run_hutch(["run", "--gpus", "1", "--", "true"], env=run_env(tree), timeout=60)
        assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE, cp.stderr
        assert_single_error_line(cp, "held by sandbox")

        m = _metrics(mport)
        assert m["hutch_gpus"] == 2 and m["hutch_gpus_allocated"] == 2, m

        # the GPU memory of a's own processes, from NVML: its init's pid
        # holds 96 MiB on GPU 0; another pid on GPU 0 is not a's
        init_pid = int(hutchtest.ps_sandboxes()[a["sandboxID"]][0])
        procs.write_text(f"0 {init_pid} {96 << 20}\n0 1 {1 << 30}\n1 {init_pid} 4096\n")
        time.sleep(2.5)  # samples every second

        # killed: its GPU is free for the next create once its processes
        # are gone (the kill answers first; the teardown follows at once)
        assert d.kill(a["sandboxID"]).status == 204
        c = _create_once_free(d, gpus=[0])
        assert d.request("GET", f"/sandboxes/{c['sandboxID']}").json()["gpus"] == [0]

        ra = _row(data, a["sandboxID"])
        assert ra["gpus"] == 1 and ra["ended_ms"] > 0, ra
        assert ra["gpu_ms"] == ra["ended_ms"] - ra["started_ms"] > 0, ra
        assert ra["gpu_memory_peak_bytes"] == 96 << 20, ra
        rep = d.request("GET", "/usage").json()
        rows = {x["sandboxID"]: x for x in rep["rows"]}
        assert rows[a["sandboxID"]]["gpu_ms"] == ra["gpu_ms"] and rows[a["sandboxID"]]["gpus"] == 1
        assert rep["total"]["gpu_ms"] == sum(x["gpu_ms"] for x in rep["rows"])
        assert rep["total"]["gpu_memory_peak_bytes"] == 96 << 20

        # a restart re-adopts b and c with their GPUs: still held
        d.proc.terminate()
        d.proc.wait(30)
        d2 = ServeDaemon(sandboxed_hutch, data, args)
        d2.created = dict(d.created)
        d2.created.pop(a["sandboxID"])
        d2.start()
        r = _create(d2, gpus=1)
        assert r.status == 409, r
        assert d2.request("GET", f"/sandboxes/{b['sandboxID']}").json()["gpus"] == [1]
        assert _metrics(mport)["hutch_gpus_allocated"] == 2
        assert d2.kill(b["sandboxID"]).status == 204
        assert d2.kill(c["sandboxID"]).status == 204
        assert _metrics(mport)["hutch_gpus_allocated"] == 0
        rb = _row(data, b["sandboxID"])
        assert rb["gpu_ms"] == rb["ended_ms"] - rb["started_ms"], rb

        # hutch usage prints GPU-seconds and the peak (MiB), '-' where unmeasured
        cp = subprocess.run([str(sandboxed_hutch), "usage", "--data-dir", str(data)], capture_output=True,
                            text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        lines = [l.split() for l in cp.stdout.splitlines()]
        assert lines[0][-2:] == ["GPU-S", "GPU-PEAK-MIB"], lines[0]
        by_id = {l[0]: l for l in lines[1:]}
        assert by_id[a["sandboxID"]][-1] == "96", by_id
        assert int(by_id["TOTAL"][-2]) == sum(int(l[-2]) for k, l in by_id.items() if k != "TOTAL")
    finally:
        for x in (d2, d):
            if x is not None:
                x.stop()


def test_ledger_without_nvml_says_not_measured(sandboxed_hutch, tmp_path, warm):
    tree = make_tree(tmp_path / "gpu", nvml=False)
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--metrics-interval", "1s", *serve_args(tree)])
    d.start()
    try:
        s = d.create(gpus="all")
        time.sleep(1.5)
        assert d.kill(s["sandboxID"]).status == 204
        r = _row(data, s["sandboxID"])
        assert r["gpus"] == 2 and r["gpu_ms"] == 2 * (r["ended_ms"] - r["started_ms"]), r
        assert r["gpu_memory_peak_bytes"] is None, r
        row = {x["sandboxID"]: x for x in d.request("GET", "/usage").json()["rows"]}[s["sandboxID"]]
        assert row["gpu_memory_peak_bytes"] is None, row
    finally:
        d.stop()
    hutchtest.wait_until(lambda: not reservations(), 20)
    assert not reservations()


def test_fork_asks_for_the_parents_gpus(sandboxed_hutch, tree, tmp_path):
    """A fork asks for what its parent asked for: a count gets a free GPU
    of its own, ids (the parent's) are a 409 entry of the fork's answer."""
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0", *serve_args(tree)])
    d.start()
    try:
        p = d.create(gpus=1)
        r = d.request("POST", f"/sandboxes/{p['sandboxID']}/fork", {"count": 1}, timeout=120)
        assert r.status == 201, r
        (entry,) = r.json()
        child = entry["sandbox"]["sandboxID"]
        d.created[child] = d.key
        assert d.request("GET", f"/sandboxes/{child}").json()["gpus"] == [1]
        assert d.request("GET", f"/sandboxes/{p['sandboxID']}").json()["gpus"] == [0]
        assert d.kill(child).status == 204
        q = _create_once_free(d, gpus="device=1")
        r = d.request("POST", f"/sandboxes/{q['sandboxID']}/fork", {"count": 1}, timeout=120)
        assert r.status == 201, r
        (entry,) = r.json()
        assert entry["error"]["code"] == 409 and "held by sandbox" in entry["error"]["message"], entry
    finally:
        d.stop()


def test_a_killed_hutch_run_does_not_keep_its_gpu(tree):
    """hutch run killed with SIGKILL: its sandbox dies with it, its run-dir
    directory waits for `hutch gc`, its GPU does not."""
    with BackgroundRun(["--gpus", "all"], ["sh", "-c", "echo READY; sleep 600"], env=run_env(tree)) as bg:
        bg.wait_for(b"READY\n")
        cp = run_hutch(["run", "--gpus", "1", "--", "true"], env=run_env(tree), timeout=60)
        assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE, cp.stderr
        bg.proc.kill()
        bg.proc.wait(30)
    cp = hutchtest.wait_until(
        lambda: (lambda x: x if x.returncode == 0 else None)(
            run_hutch(["run", "--gpus", "all", "--", "true"], env=run_env(tree), timeout=60)), 20, 0.2)
    assert cp and cp.returncode == 0, cp
    assert run_hutch(["gc"], timeout=60).returncode == 0


def test_sharing_is_the_operators_choice(tree):
    """HUTCH_GPU_SHARE=1: sandboxes that share may hold one GPU together; a
    sandbox that does not share never gets a held GPU, and a GPU it holds
    is never shared."""
    share = dict(run_env(tree), HUTCH_GPU_SHARE="1")
    with BackgroundRun(["--gpus", "all"], ["sh", "-c", "echo READY; read x || true"], env=share) as bg:
        bg.wait_for(b"READY\n")
        cp = run_hutch(["run", "--gpus", "all", "--", "sh", "-c", "ls /dev | grep -c '^nvidia[0-9]'"], env=share,
                       timeout=60)
        assert (cp.returncode, cp.stdout) == (0, b"2\n"), cp.stderr
        cp = run_hutch(["run", "--gpus", "1", "--", "true"], env=run_env(tree), timeout=60)
        assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE, cp.stderr
        assert_single_error_line(cp, "held by sandbox")
        bg.close_stdin()
        assert bg.wait(60) == 0, bg.stderr
    with BackgroundRun(["--gpus", "device=0"], ["sh", "-c", "echo READY; read x || true"], env=run_env(tree)) as bg:
        bg.wait_for(b"READY\n")
        cp = run_hutch(["run", "--gpus", "0,", "--", "true"], env=share, timeout=60)
        assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE, cp.stderr
        assert_single_error_line(cp, "held by sandbox", "alone")
        # a count takes the GPU nobody holds
        cp = run_hutch(["run", "--gpus", "1", "--", "sh", "-c", "ls /dev | grep '^nvidia[0-9]'"], env=share,
                       timeout=60)
        assert (cp.returncode, cp.stdout) == (0, b"nvidia1\n"), cp.stderr
        bg.close_stdin()
        assert bg.wait(60) == 0, bg.stderr
