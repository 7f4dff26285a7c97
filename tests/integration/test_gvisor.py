"""The gvisor backend through `hutch run --backend gvisor`: the sandbox's
processes run on runsc's user-space kernel, reached through hutch-init's mux
and the host relay. What the host must see: the sentry and the gofer (never
the sandbox's own programs), the sentry under seccomp as an unprivileged user,
the relay as the sandbox's host uid, and nothing of any of them after the end.

Skipped when runsc is not installed (`make test` installs it)."""

import json
import os
import re
import shutil
import subprocess
import threading
import time
import zlib
from pathlib import Path

import pytest

import hutchtest
from hutchtest import parse_json_summary
from serveclient import ServeDaemon, multipart

RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
pytestmark = pytest.mark.skipif(not os.access(RUNSC, os.X_OK), reason="runsc is not installed")

GV = ["--backend", "gvisor"]


def _procs():
    """(pid, ppid, uid, state, cmdline, name) of every host process."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = Path(f"/proc/{d}/status").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        uid = int(re.search(r"^Uid:\s+(\d+)", st, re.M).group(1))
        ppid = int(re.search(r"^PPid:\s+(\d+)", st, re.M).group(1))
        state = re.search(r"^State:\s+(\S)", st, re.M).group(1)
        name = re.search(r"^Name:\s+(.*)$", st, re.M).group(1)
        out.append((int(d), ppid, uid, state, cmd, name))
    return out


def _of_sandbox(sid):
    return [p for p in _procs() if sid in p[4]]


def _status(pid):
    return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)


@pytest.fixture
def gvrun(warm):
    def run(args, cmd, **kw):
        return hutchtest.run_sandbox([*GV, *args], cmd, **kw)
    return run


def test_runs_on_the_user_space_kernel(gvrun):
    cp = gvrun(["--json"], ["sh", "-c", "echo out; echo err >&2; dmesg 2>/dev/null | head -1; uname -r; id -u; exit 7"])
    assert cp.returncode == 7, cp.stderr
    lines = cp.stdout.decode().splitlines()
    assert lines[0] == "out"
    assert "gVisor" in lines[1]          # the sentry's own boot log
    assert lines[2] != os.uname().release  # not the host's kernel
    assert lines[3] == "1000"
    assert b"err\n" in cp.stderr
    assert parse_json_summary(cp)[1]["exit_code"] == 7


def test_stdin_and_large_output(gvrun):
    data = os.urandom(3 << 20)
    cp = gvrun([], ["sh", "-c", "cat; head -c 5000000 /dev/zero | tr '\\0' x"], stdin=data, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout[: len(data)] == data
    assert cp.stdout[len(data):] == b"x" * 5000000


def test_the_host_never_runs_the_sandboxes_programs(gvrun, baseline):
    """While a marked program runs inside, no host process has its command
    line; the sentry runs as nobody under seccomp in a user namespace of its own, the
    gofer and the relay are the only other processes, the relay as the
    sandbox's host uid without capabilities and under its own seccomp filter."""
    marker = f"hutch-gvisor-marker-{os.getpid()}"
    proc = subprocess.Popen([str(hutchtest.hutch_path()), "run", *GV, "--json", "--", "bash", "-c",
                             f"exec -a {marker} sleep 30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        relay = None
        while time.time() < deadline and not relay:
            relay = [p for p in _procs() if p[4].startswith("hutch-relay ") and p[1] == proc.pid]
            time.sleep(0.2)
        assert relay, "no relay process"
        sid = relay[0][4].split()[-1]
        time.sleep(2)  # the marker program runs inside by now
        assert not [p for p in _procs() if p[4].startswith(marker)], "a sandbox program is a host process"
        mine = _of_sandbox(sid)
        kinds = {p[4].split()[0] for p in mine}
        assert kinds <= {"hutch-relay", RUNSC, "runsc-gofer", "runsc-sandbox"}, kinds
        sentry = [p for p in mine if p[4].startswith("runsc-sandbox")]
        assert len(sentry) == 1, mine
        st = _status(sentry[0][0])
        assert st["Seccomp"].strip() == "2"
        assert st["Uid"].split()[0] == "65534"
        # what capabilities it keeps are its own user namespace's, not the host's
        assert (int(st["CapEff"], 16) == 0 or
                os.readlink(f"/proc/{sentry[0][0]}/ns/user") != os.readlink("/proc/self/ns/user"))
        # the relay parses what the sandbox sends: every thread of it is
        # under its own seccomp filter, without capabilities, no_new_privs
        tasks = os.listdir(f"/proc/{relay[0][0]}/task")
        assert tasks
        for tid in tasks:
            rel = _status(f"{relay[0][0]}/task/{tid}")
            assert int(rel["Uid"].split()[0]) >= hutchtest.UID_BASE, (tid, rel["Uid"])
            assert rel["Seccomp"].strip() == "2", (tid, rel["Seccomp"])
            assert int(rel.get("Seccomp_filters", "1")) >= 1, (tid, rel["Seccomp_filters"])
            for cap in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
                assert int(rel[cap], 16) == 0, (tid, cap, rel[cap])
            assert rel["NoNewPrivs"].strip() == "1", tid
        # the relay lives in a network namespace of its own (the proxy's)
        assert os.readlink(f"/proc/{relay[0][0]}/ns/net") != os.readlink("/proc/self/ns/net")
    finally:
        proc.kill()
        proc.wait()
    # a SIGKILLed `hutch run` takes its sandbox with it (init's connection)
    deadline = time.time() + 30
    while time.time() < deadline and _of_sandbox(sid):
        time.sleep(0.2)
    assert not _of_sandbox(sid)
    subprocess.run([str(hutchtest.hutch_path()), "gc"], capture_output=True, timeout=60)
    hutchtest.assert_no_leak(baseline)


def test_nothing_left_after_the_end(gvrun, baseline):
    def zombies():
        return [p for p in _procs() if p[3] == "Z" and (p[5].startswith(("runsc", "hutch-relay", "exe")))]
    before = zombies()
    cp = gvrun(["--json"], ["sh", "-c", "sleep 100 & sleep 100 & echo started"])
    assert cp.returncode == 0, cp.stderr
    sid = parse_json_summary(cp)[1]["sandbox_id"]
    assert not _of_sandbox(sid)
    assert not (hutchtest.STATE_DIR / sid).exists()
    assert not (hutchtest.DATA_DIR / "gvisor" / sid).exists()
    # runsc's processes are reaped by the relay (a subreaper), the relay by
    # hutch: none is left to a host init that may never reap
    deadline = time.time() + 10
    while time.time() < deadline and len(zombies()) > len(before):
        time.sleep(0.2)
    assert len(zombies()) <= len(before), zombies()
    hutchtest.assert_no_leak(baseline)


def _tree(root):
    """Every path under root with its type, mode, size and mtime."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def test_the_template_is_never_written(gvrun):
    """Neither the sandbox (through its layer) nor runsc (its gofer makes
    missing mount points in the root it serves) changes the template."""
    tpl = (hutchtest.DATA_DIR / "templates" / "host").resolve() / "rootfs"
    gvrun([], ["true"])  # the template exists
    before = _tree(tpl)
    cp = gvrun(["--user", "root"], ["sh", "-c", "echo x > /etc/hutch-gvisor-probe && rm -f /etc/hosts && "
                                    "echo y > /usr/hutch-probe; cat /etc/hutch-gvisor-probe"])
    assert b"x\n" in cp.stdout
    assert b"Read-only file system" in cp.stderr  # /usr is a read-only bind
    assert _tree(tpl) == before
    assert not Path("/usr/hutch-probe").exists()


def test_disk_limit_is_enospc(gvrun):
    """--disk is the writable layer's size: writing past it is ENOSPC for the
    writer (in the home directory and /tmp alike, one layer), nothing is
    killed, the sandbox goes on, and deleting frees the room again. df
    tells the layer's size."""
    script = r"""
df -B1 --output=size / | tail -n 1
dd if=/dev/zero of=/home/user/big bs=1M count=100 2>&1 | grep -o 'No space left on device' | head -1
python3 -c 'import os; print("home", os.path.getsize("/home/user/big"))'
dd if=/dev/zero of=/tmp/more bs=64K count=10 2>&1 | grep -o 'No space left on device' | head -1
rm -f /home/user/big
dd if=/dev/zero of=/tmp/more bs=1M count=20 2>/dev/null && echo again-ok
python3 -c 'import os; print("tmp", os.path.getsize("/tmp/more"))'
echo alive
"""
    cp = gvrun(["--disk", "32M", "--memory", "256M", "--json"], ["sh", "-c", script], timeout=120)
    summary = parse_json_summary(cp)[1]
    lines = cp.stdout.decode().split("\n")
    assert int(lines[0]) == 32 << 20, cp.stdout
    assert lines[1] == "No space left on device", (cp.stdout, cp.stderr)
    assert lines[2].startswith("home ") and (31 << 20) <= int(lines[2].split()[1]) <= 32 << 20, cp.stdout
    assert lines[3] == "No space left on device", cp.stdout
    assert lines[4] == "again-ok" and lines[5] == f"tmp {20 << 20}" and lines[6] == "alive", cp.stdout
    assert summary["exit_code"] == 0 and summary["oom_killed"] is False, summary


def test_disk_limit_through_the_api(sandboxed_hutch, tmp_path):
    """Through the daemon: an upload into a full layer is HTTP 507 (as on the
    namespace backend) and leaves no partial file; the metrics' disk_used
    follows what the layer holds; after a cleanup the upload succeeds."""
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data",
                     ["--backend", "gvisor", "--disk", "48M", "--memory", "512M", "--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(timeout=120)

        def metrics():
            r = sd.request("GET", "/metrics", headers=sd.envd_headers(sb), key="")
            assert r.status == 200, r
            return r.json()

        m = metrics()
        assert m["disk_total"] == 48 << 20 and m["disk_used"] < 8 << 20, m
        end, out, _, _ = sd.run(sb, "dd if=/dev/zero of=/home/user/fill bs=1M count=40 2>/dev/null; echo $?")
        assert out == b"0\n", out
        deadline = time.monotonic() + 10
        while not 40 << 20 <= metrics()["disk_used"] <= 48 << 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert 40 << 20 <= metrics()["disk_used"] <= 48 << 20, metrics()
        r = sd.upload(sb, "/home/user/upload.bin", os.urandom(16 << 20), timeout=60)
        assert r.status == 507, r
        end, out, _, _ = sd.run(sb, "ls /home/user; rm -f /home/user/fill")
        assert b"upload.bin" not in out, out
        r = sd.upload(sb, "/home/user/upload.bin", os.urandom(16 << 20), timeout=60)
        assert r.status == 200, r
        deadline = time.monotonic() + 10
        while not (16 << 20) <= metrics()["disk_used"] <= 24 << 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (16 << 20) <= metrics()["disk_used"] <= 24 << 20, metrics()
    finally:
        assert sd.stop() == []



def gzip_of_zeros(n, level=9):
    """A gzip member of n zero bytes, built a MiB at a time (2 GiB → ~2 MB)."""
    c = zlib.compressobj(level, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    out = bytearray()
    for _ in range(n >> 20):
        out += c.compress(zeros)
    return bytes(out + c.flush())


# Every name in the directories (temp names included) with its size, and
# the sentry's memory in use: python, since this runsc's ls cannot stat.
LAYER_STATE = r"""
import os, sys
for d in sys.argv[1:]:
    for n in sorted(os.listdir(d)):
        print(os.path.join(d, n), os.lstat(os.path.join(d, n)).st_size)
m = dict(l.split(':', 1) for l in open('/proc/meminfo'))
kb = lambda k: int(m[k].split()[0])
print('used', (kb('MemTotal') - kb('MemFree')) * 1024)
"""


def _layer_state(sd, sb, *dirs):
    end, out, err, _ = sd.run(sb, "python3 - " + " ".join(dirs) + " <<'EOF'\n" + LAYER_STATE + "EOF\n", timeout=60)
    assert end.get("exitCode", 0) == 0, (end, out, err)
    lines = out.decode().split("\n")
    files = {l.rsplit(" ", 1)[0]: int(l.rsplit(" ", 1)[1]) for l in lines if l and not l.startswith("used ")}
    used = [int(l.split()[1]) for l in lines if l.startswith("used ")][0]
    return files, used


def _gz_upload(sd, sb, path, body, chunked=False, ctype="application/octet-stream", timeout=600):
    target = sd.files_path(path) if path else "/files"
    return sd.request("POST", target, body, key="", timeout=timeout, chunked=chunked,
                      headers=sd.envd_headers(sb, ctype=ctype, extra={"Content-Encoding": "gzip"}))


def test_compressed_upload_past_memory_is_507(sandboxed_hutch, tmp_path):
    """A layer larger than the memory that holds its files (the daemon's
    defaults are 1 GiB and 512 MiB; here 1 GiB and 128 MiB, the same shape,
    so the test writes a quarter as much at gvisor's ~8 MB/s). 2 MB of gzip
    that inflate to 2 GiB were written by hutch-init, which memwatch never
    kills, until the host cgroup's backstop (limit × 1.5 + 128 MiB) ended
    the sentry: 500/502 and the sandbox gone. Now init stops such a write
    short of the memory limit: 507 in E2B's error format (the SDK's
    NotEnoughSpaceError), no file and no temp file left, the memory given
    back, no process of the sandbox killed, and the sandbox goes on."""
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data",
                     ["--backend", "gvisor", "--memory", "128M", "--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(timeout=120)
        end, out, _, _ = sd.run(sb, "sleep 900 >/dev/null 2>&1 </dev/null & echo $!")
        bystander = int(out)
        bomb = gzip_of_zeros(2 << 30)
        assert len(bomb) < 3 << 20
        r = _gz_upload(sd, sb, "/home/user/big.bin", bomb)
        assert r.status == 507, (r, sd.log_tail())
        assert r.header("content-type", "").startswith("application/json"), r.headers
        body = r.json()
        assert body["code"] == 507 and "big.bin" in body["message"], body
        end, out, err, _ = sd.run(sb, f"kill -0 {bystander} && echo alive")
        assert out == b"alive\n", (out, err)
        files, used = _layer_state(sd, sb, "/home/user")
        assert not [f for f in files if "big.bin" in f], files
        assert used < 64 << 20, f"the refused upload's memory was not given back: {used}"
        r = sd.upload(sb, "/home/user/small.bin", b"x" * 1000)
        assert r.status == 200, r
        assert "lost its init" not in sd.log_tail()
    finally:
        assert sd.stop() == []


def test_every_upload_form_past_memory_is_507(sandboxed_hutch, tmp_path):
    """The same bound for every way a client writes into the layer: a
    multipart upload of many files keeps the files that fit, each whole (as
    on a full disk) and refuses the first that does not; an octet-stream
    without Content-Length (chunked); two uploads at once. The sandbox
    lives through all of them and no temp file is left."""
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data",
                     ["--backend", "gvisor", "--memory", "128M", "--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(timeout=120)
        # 128 MiB, of which uploads may fill up to 120 (a reserve of 1/16,
        # at least 4 MiB, stays for the processes): two 40 MiB files fit,
        # the third does not
        part = bytes(40 << 20)
        body, ctype = multipart([("file", f"/home/user/mp{i}.bin", part) for i in range(4)])
        c = zlib.compressobj(1, zlib.DEFLATED, 31)
        r = _gz_upload(sd, sb, None, c.compress(body) + c.flush(), ctype=ctype)
        assert r.status == 507 and r.json()["code"] == 507, r
        files, _ = _layer_state(sd, sb, "/home/user")
        assert files.get("/home/user/mp0.bin") == 40 << 20 and files.get("/home/user/mp1.bin") == 40 << 20, files
        assert not [f for f in files if "mp2" in f or "mp3" in f or ".hutch-" in f], files
        sd.run(sb, "rm -f /home/user/mp*.bin")

        r = _gz_upload(sd, sb, "/tmp/chunked.bin", gzip_of_zeros(256 << 20), chunked=True)
        assert r.status == 507 and r.json()["code"] == 507, r

        results = [None, None]

        def up(i):
            results[i] = _gz_upload(sd, sb, f"/tmp/par{i}.bin", gzip_of_zeros(100 << 20))

        threads = [threading.Thread(target=up, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(x.status for x in results)
        assert statuses in ([200, 507], [507, 507]), results
        files, used = _layer_state(sd, sb, "/tmp", "/home/user")
        assert not [f for f in files if ".hutch-" in f or "chunked" in f], files
        kept = sum(1 for f in files if "/tmp/par" in f)
        assert kept == statuses.count(200), files
        assert used < (100 << 20) * kept + (32 << 20), used
        end, out, _, _ = sd.run(sb, "echo still here")
        assert out == b"still here\n"
    finally:
        assert sd.stop() == []


def test_inodes_is_refused(warm):
    """runsc's tmpfs refuses nr_inodes, so the gvisor layer has no inode
    limit: an explicit --inodes is a usage error there, not ignored."""
    for args, env in [([*GV, "--inodes", "1000"], None),
                      (["--inodes", "1000"], dict(os.environ, HUTCH_BACKEND="gvisor"))]:
        cp = hutchtest.run_sandbox(args, ["true"], env=env)
        assert cp.returncode == 2, cp
        assert b"--inodes is not supported on the gvisor backend" in cp.stderr, cp.stderr
    cp = hutchtest.run_sandbox(["--backend", "ns", "--inodes", "1000"], ["true"])
    assert cp.returncode == 0, cp.stderr

# Grows by 8 MiB a step, touching every page (the sentry's fault path).
GROW = """
chunks = []
while True:
    b = bytearray(8 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    chunks.append(b)
"""

# One mmap(MAP_POPULATE) of N MiB: the sentry commits all of it in one call.
BURST = """
import mmap, sys
m = mmap.mmap(-1, int(sys.argv[1]) << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000)
print("mapped", flush=True)
"""


def _cgroup_cap(limit):
    # the host cgroup's backstop (sandbox-internal.h): memory + memory/2 + 128 MiB
    return limit + limit // 2 + (128 << 20)


@pytest.mark.parametrize("how", ["grow", "burst"])
def test_memory_limit_is_the_applications(gvrun, how):
    """Past the sandbox's memory limit the largest process is killed, as the
    kernel's OOM killer does on the namespace backend; the sandbox (its init,
    the shell that started the program) lives on. On gVisor hutch-init does
    it from inside, by the sentry's own count: the host cgroup would end the
    whole sentry. Both a program that grows page by page and one
    mmap(MAP_POPULATE) past the limit (within the cgroup's headroom)."""
    limit = 128 << 20
    prog = GROW if how == "grow" else BURST
    arg = "" if how == "grow" else str((limit >> 20) + 40)
    cp = gvrun(["--memory", "128M", "--json"],
               ["sh", "-c", f'python3 -c "$(cat)" {arg}; echo "app=$?"; echo survivor'],
               stdin=prog.encode(), timeout=120)
    summary = parse_json_summary(cp)[1]
    assert b"app=137" in cp.stdout, (cp.stdout, cp.stderr)
    assert b"survivor" in cp.stdout
    assert b"destroyed" not in cp.stderr
    assert summary["exit_code"] == 0 and summary["oom_killed"] is True, summary
    assert summary["memory_peak_bytes"] <= _cgroup_cap(limit), summary


def test_memory_under_the_limit_is_left_alone(gvrun):
    """Just under the limit nothing is killed (the sentry's count includes the
    runtime's own small share, so leave a margin for it)."""
    cp = gvrun(["--memory", "256M", "--json"],
               ["sh", "-c", 'python3 -c "$(cat)" 160; echo "app=$?"'],
               stdin=BURST.encode(), timeout=120)
    summary = parse_json_summary(cp)[1]
    assert b"mapped" in cp.stdout and b"app=0" in cp.stdout, (cp.stdout, cp.stderr)
    assert summary["oom_killed"] is False, summary


def test_files_written_inside_count_against_memory(gvrun):
    """The writable layer lives in the sentry's memory: with a layer larger
    than the sandbox's memory, writing a file larger than the memory gets the
    writing processes killed (as a tmpfs in a memory cgroup does on Linux),
    never the sandbox, and the host cgroup's backstop is not reached."""
    limit = 64 << 20
    cp = gvrun(["--memory", "64M", "--disk", "1G", "--json"],
               ["sh", "-c", "head -c 400000000 /dev/zero > /home/user/big; echo rc=$?"], timeout=120)
    summary = parse_json_summary(cp)[1]
    assert b"rc=0" not in cp.stdout
    assert b"destroyed" not in cp.stderr, cp.stderr
    assert summary["oom_killed"] is True, summary
    assert summary["memory_peak_bytes"] <= _cgroup_cap(limit), summary


def test_pids_limit_is_the_applications(gvrun):
    """--pids is RLIMIT_NPROC inside (the sentry enforces it), and the host
    cgroup allows runsc's threads and a ptrace stub per process on top: a
    fork loop meets the limit as EAGAIN and the sandbox survives it."""
    cp = gvrun(["--pids", "64", "--json"], ["sh", "-c", "for i in $(seq 200); do sleep 3 & done; echo never"],
               timeout=120)
    summary = parse_json_summary(cp)[1]
    assert b"Cannot fork" in cp.stderr, cp.stderr
    assert summary["exit_code"] == 2, cp.stderr  # dash gives up at the failed fork
    assert b"destroyed" not in cp.stderr


def test_bad_backend_is_a_usage_error(warm):
    cp = hutchtest.run_sandbox(["--backend", "firecracker"], ["true"])
    assert cp.returncode == 2
    assert b"--backend" in cp.stderr


def test_missing_runsc_is_a_clear_error(warm, baseline):
    env = dict(os.environ, HUTCH_RUNSC="/nonexistent/runsc")
    cp = hutchtest.run_sandbox(GV, ["true"], env=env)
    assert cp.returncode == 125
    assert b"runsc" in cp.stderr
    hutchtest.assert_no_leak(baseline)


def test_template_default_backend(sandboxed_hutch, tmp_path):
    """`--template-backends base=gvisor`: the SDK's default template starts
    on gvisor, `host` on the operator's default (ns), and a create that
    names its backend wins over the template's."""
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--template-backends", "base=gvisor", "--pool-size", "0"])
    sd.start()
    try:
        cases = [(sd.create(timeout=120), "gvisor"),
                 (sd.create(timeout=120, templateID="host"), "ns"),
                 (sd.create(timeout=120, metadata={"hutch.backend": "ns"}), "ns")]
        for sb, want in cases:
            end, out, err, _ = sd.run(sb, "dmesg 2>/dev/null | head -1; cat /proc/version")
            on_gvisor = b"gVisor" in out or b"4.4.0" in out
            assert on_gvisor == (want == "gvisor"), (want, out, err)
            assert sd.kill(sb["sandboxID"]).status == 204
    finally:
        sd.stop()
    for i, setting in enumerate(["base=firecracker", "base", "=gvisor", "nosuch=gvisor", "base=gvisor,,host=ns"]):
        bad = ServeDaemon(sandboxed_hutch, tmp_path / f"bad{i}", ["--template-backends", setting])
        with pytest.raises(AssertionError):
            bad.start(timeout=10)
        assert "template-backends" in bad.log_tail() and "is not TEMPLATE=BACKEND" in bad.log_tail(), setting


def test_pause_resume_cycles_with_traffic(sandboxed_hutch, tmp_path):
    """Pause (checkpoint) and resume (restore) a busy gvisor sandbox again and
    again: every resume must come back with its processes. The sentry's
    restore was seen to report epoll events for registrations of
    descriptors hutch-init had closed before the checkpoint (their sources
    freed): init must drop them (an event names a slot and generation, not
    a pointer) rather than crash as PID 1, which ended the sandbox in about
    one resume of ten."""
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--backend", "gvisor", "--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(timeout=120)
        sid = sb["sandboxID"]
        sd.run(sb, "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; "
                   "sleep 0.05; done) >/dev/null 2>&1 </dev/null &")
        last = 0
        for cycle in range(10):
            # traffic that opens and closes init's descriptors: commands,
            # file writes and reads, a watch-free listing
            for k in range(4):
                end, out, _, _ = sd.run(sb, f"echo cycle{cycle}-{k}; cat /tmp/count")
                assert out.startswith(f"cycle{cycle}-{k}\n".encode()), out
            up = sd.upload(sb, f"/home/user/f{cycle}", os.urandom(100_000))
            assert up.status == 200, up
            assert sd.request("POST", f"/sandboxes/{sid}/pause", {}, timeout=120).status == 204
            r = sd.request("POST", f"/sandboxes/{sid}/connect", {"timeout": 300}, timeout=120)
            assert r.status == 201, (cycle, r, sd.log_tail())
            end, out, err, _ = sd.run(sb, "sleep 0.3; cat /tmp/count; set -- /home/user/f*; echo $#")
            assert len(out.split()) == 2, (cycle, out, err)
            count, files = (int(x) for x in out.split())
            assert count > last and files == cycle + 1, (cycle, out)
            last = count
    finally:
        assert sd.stop() == []


def test_resume_past_a_stale_runsc_container(sandboxed_hutch, tmp_path):
    """runsc keeps a container's .state and .lock in its root until `runsc
    run` ends on its own; a runsc killed first (the relay SIGKILLs it when
    the guest's connection resets before it exits, a race load makes
    likely) leaves them, and the restore's `runsc run` of the same id failed
    with "container already exists". A pause clears them once the relay
    is gone, and the restore clears them first (here planted again)."""
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--backend", "gvisor", "--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(timeout=120)
        sid = sb["sandboxID"]
        sd.run(sb, "echo 7 > /tmp/n")
        root = hutchtest.STATE_DIR / sid / "runsc"
        live = {p.name: p.read_bytes() for p in root.iterdir()}
        assert any(n.endswith(".state") for n in live), live
        assert sd.request("POST", f"/sandboxes/{sid}/pause", {}, timeout=120).status == 204
        assert not list(root.iterdir()), "runsc's files outlived the pause"
        for name, data in live.items():           # what a killed runsc leaves
            (root / name).write_bytes(data)
        r = sd.request("POST", f"/sandboxes/{sid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())
        end, out, _, _ = sd.run(sb, "cat /tmp/n")
        assert out == b"7\n", out
    finally:
        assert sd.stop() == []
