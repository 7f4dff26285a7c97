"""Shared helpers for hutch's Python test suites (tests/integration, tests/hostile).

Everything here drives the real `hutch` binary. Every subprocess has a timeout,
so a hang fails a test instead of blocking CI. No assertion here depends on how
fast something is (speed is measured by bench/, never by tests).

The on-disk layout that the leak checks look at is described by the constants
below: fix them here, in one place, if the engine's layout changes.

Run as a script (`python3 hutchtest.py count-output SPEC_JSON`) this module is
the small wrapper used by the output-flood tests: it runs one command, counts
and checks its output in chunks, and reports the wrapper's RUSAGE_CHILDREN
max RSS (i.e. hutch's), so 200 MB never sit in the test process's memory.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

# --------------------------------------------------------------------------
# Layout constants (the one place to fix them)
# --------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUILD_DIR = "build-test"
# Where the hutch executable may live inside the build dir, first match wins.
# meson puts cli/meson.build's executable in <build>/cli/hutch.
HUTCH_BIN_CANDIDATES = ("hutch", "cli/hutch")
PROBE_BIN_RELPATH = "tests/probe"
CONFIG_H_RELPATH = "config.h"

UID_BASE = 0x40000000          # first host uid handed to sandboxes
UID_RANGE = 65536              # host ids per live sandbox
SANDBOX_USER_UID = 1000        # `user` inside

RUN_DIR = Path("/run/hutch")
STATE_DIR = RUN_DIR / "sandboxes"          # one entry per live sandbox
UID_RESERVATION_DIR = RUN_DIR / "uids"     # one entry per reserved uid range
NETNS_DIR = Path("/run/netns")             # named network namespaces
CGROUP_ROOT_NAME = "hutch"
# Parent cgroups under which every sandbox gets a child; the parents themselves
# may persist, only what is below them counts. "*" covers every v1 controller
# hierarchy and /sys/fs/cgroup/unified on a hybrid host.
CGROUP_PARENT_GLOBS = (
    "/sys/fs/cgroup/*/" + CGROUP_ROOT_NAME,
    "/sys/fs/cgroup/" + CGROUP_ROOT_NAME,
)
DATA_DIR = Path("/var/lib/hutch")
STORAGE_DIR = DATA_DIR / "storage"
# Directories whose entries are per-sandbox writable layers (not the storage
# image / mount infrastructure itself, e.g. storage/golden or layers.xfs).
STORAGE_LAYER_DIRS = (STORAGE_DIR / "mnt", STORAGE_DIR / "layers")
# Host-side process names that belong to hutch (comm is cut at 15 chars).
HUTCH_PROCESS_NAMES = ("hutch", "hutch-init")

# Snapshot fields that must differ from an idle baseline while one sandbox is
# live; proves the leak checks look at real places. Add "storage_layers" or
# "mounts" if the writable layer is visible on the host.
LIVE_FIELDS_REQUIRED = ("processes", "cgroups", "sandbox_state", "uid_reservations",
                        "storage_layers")

SANDBOX_ID_RE = re.compile(r"^[a-z0-9]{20}$")

# Exit statuses of `hutch run`.
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_HUTCH_FAILURE = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

JSON_SUMMARY_FIELDS = {
    "sandbox_id": (str,),
    "exit_code": (int, type(None)),
    "signal": (int, type(None)),
    "timed_out": (bool,),
    "oom_killed": (bool,),
    "wall_ms": (int, float),
    "cpu_ms": (int, float),
    "memory_peak_bytes": (int,),
}

MiB = 1 << 20


# --------------------------------------------------------------------------
# Locating the build
# --------------------------------------------------------------------------

def build_dir() -> Path:
    d = Path(os.environ.get("HUTCH_BUILD_DIR", DEFAULT_BUILD_DIR))
    return d if d.is_absolute() else REPO_ROOT / d


def hutch_path() -> Path:
    """Path of the hutch binary ($HUTCH_BIN overrides). May not exist."""
    if os.environ.get("HUTCH_BIN"):
        return Path(os.environ["HUTCH_BIN"])
    bd = build_dir()
    for rel in HUTCH_BIN_CANDIDATES:
        p = bd / rel
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return bd / HUTCH_BIN_CANDIDATES[0]


def missing_hutch_message() -> Optional[str]:
    p = hutch_path()
    if p.is_file() and os.access(p, os.X_OK):
        return None
    return (f"hutch binary not found or not executable: looked for "
            f"{', '.join(str(build_dir() / c) for c in HUTCH_BIN_CANDIDATES)} "
            f"(build with `meson setup {build_dir()} -Dseccomp_deny_errno=200 && "
            f"ninja -C {build_dir()}`, or set HUTCH_BUILD_DIR / HUTCH_BIN)")


def read_deny_errno(config_h: Path) -> int:
    """HUTCH_SECCOMP_DENY_ERRNO from the build's config.h."""
    text = config_h.read_text()
    m = re.search(r"^\s*#\s*define\s+HUTCH_SECCOMP_DENY_ERRNO\s+\(?\s*(\d+)\s*\)?\s*$",
                  text, re.M)
    if not m:
        raise ValueError(f"{config_h}: no `#define HUTCH_SECCOMP_DENY_ERRNO N` line")
    return int(m.group(1))


# --------------------------------------------------------------------------
# Running hutch
# --------------------------------------------------------------------------

class SandboxTimeout(subprocess.TimeoutExpired):
    """hutch did not finish within the test's timeout (it was then killed)."""

    def __str__(self) -> str:
        def tail(b):
            if not b:
                return "''"
            return repr(bytes(b[-2000:]))
        return (f"hutch did not finish within {self.timeout}s: {self.cmd!r}\n"
                f"  stdout (tail): {tail(self.output)}\n  stderr (tail): {tail(self.stderr)}")


def _stdin_args(stdin):
    """subprocess kwargs for a stdin that may be bytes, str, None or a file."""
    if stdin is None:
        return {"stdin": subprocess.DEVNULL}, None
    if isinstance(stdin, str):
        stdin = stdin.encode()
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return {"stdin": subprocess.PIPE}, bytes(stdin)
    return {"stdin": stdin}, None


def sandbox_descendants(pid: int) -> list:
    """Host pids of sandbox processes (uid >= UID_BASE) descending from PID
    whose parent is not itself one: the sandboxes' inits that hutch PID started."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _read_status(d)
            if st and "PPid" in st:
                parent[int(d)] = (int(st["PPid"]), max(int(x) for x in st["Uid"].split()))
    out = []
    for p, (pp, uid) in parent.items():
        if uid < UID_BASE or parent.get(pp, (0, 0))[1] >= UID_BASE:
            continue
        a = pp
        while a and a != pid and a in parent:
            a = parent[a][0]
        if a == pid:
            out.append(p)
    return out


def kill_orphaned_sandboxes(init_pids: Iterable) -> list:
    """`hutch kill` the sandboxes whose init host pid is in INIT_PIDS and still
    listed by `hutch ps` (cleanup after a hutch that was killed). Returns the
    ids killed. Never touches other sandboxes."""
    pids = {str(p) for p in init_pids}
    if not pids:
        return []
    killed = []
    try:
        for sid, fields in ps_sandboxes().items():
            if fields and fields[0] in pids:
                run_hutch(["kill", sid], timeout=60)
                killed.append(sid)
    except (AssertionError, OSError, subprocess.SubprocessError):
        pass
    return killed


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM (so hutch can tear its sandbox down), then SIGKILL; then
    `hutch kill` any sandbox that hutch left running."""
    if proc.poll() is not None:
        return
    try:
        inits = sandbox_descendants(proc.pid)
    except OSError:
        inits = []
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    except ProcessLookupError:
        pass
    kill_orphaned_sandboxes(p for p in inits if os.path.exists(f"/proc/{p}"))


_stop = stop_process


def wait_until(pred, timeout, step=0.1):
    """pred() until it is truthy or TIMEOUT seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)


def run_hutch(hutch_args: Sequence, stdin=None, timeout: float = 60,
              env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run `hutch HUTCH_ARGS...`; bytes stdout/stderr.

    stdin: None (= /dev/null), bytes/str (fed, then closed), or a file/fd.
    env: the hutch process's whole environment (subprocess semantics);
    None = this process's environment.
    On timeout hutch gets SIGTERM, then SIGKILL, and SandboxTimeout is raised.
    """
    argv = [str(hutch_path()), *[str(a) for a in hutch_args]]
    kw, data = _stdin_args(stdin)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, **kw)
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        raise SandboxTimeout(argv, timeout, output=out, stderr=err) from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_sandbox(args: Sequence, cmd: Sequence, stdin=None, timeout: float = 60,
                env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run `hutch run ARGS... -- CMD...`; see run_hutch for the parameters."""
    return run_hutch(["run", *args, "--", *cmd], stdin=stdin, timeout=timeout, env=env)


def not_sandboxed_reason(timeout: float = 120) -> Optional[str]:
    """None if `hutch run` really runs commands in a user namespace whose ids
    map into the sandbox range; else why not. Tests that write to /usr, /etc
    or / as sandbox root must not run against anything else (a stub or a
    broken build would run them on the host)."""
    for user in ("root", "user"):
        try:
            cp = run_sandbox(["--user", user], ["cat", "/proc/self/uid_map"], timeout=timeout)
        except SandboxTimeout as e:
            return str(e)
        if cp.returncode != 0:
            return f"`hutch run --user {user} -- cat /proc/self/uid_map` failed " \
                   f"(rc={cp.returncode}): {cp.stderr[-500:]!r}"
        try:
            m = parse_uid_map(cp.stdout.decode())
        except ValueError:
            return f"unexpected uid_map inside the sandbox: {cp.stdout[:500]!r}"
        if not m or any(outside < UID_BASE for _, outside, _ in m):
            return f"sandbox ids map onto host ids below {UID_BASE:#x}: {m}"
    return None


class BackgroundRun:
    """`hutch run ARGS -- CMD` running in the background, output collected by
    reader threads. Use as a context manager: leaving it stops hutch
    (SIGTERM, then SIGKILL) if it is still running.

        with BackgroundRun([], ["sh", "-c", "echo READY; read x || true"]) as bg:
            bg.wait_for(b"READY\\n")
            ...
            bg.close_stdin()
            assert bg.wait() == 0
    """

    def __init__(self, args: Sequence, cmd: Sequence, env: Optional[dict] = None,
                 stdin_pipe: bool = True, hutch_args: Optional[Sequence] = None):
        if hutch_args is None:
            hutch_args = ["run", *args, "--", *cmd]
        self.argv = [str(hutch_path()), *[str(a) for a in hutch_args]]
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._bufs = {"stdout": bytearray(), "stderr": bytearray()}
        self._eof = {"stdout": False, "stderr": False}
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._reader, args=(name, getattr(self.proc, name)),
                             daemon=True)
            for name in ("stdout", "stderr")
        ]
        for t in self._threads:
            t.start()

    def _reader(self, name, f):
        fd = f.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if not chunk:
                    self._eof[name] = True
                    self._cond.notify_all()
                    return
                self._bufs[name] += chunk
                self._cond.notify_all()

    @property
    def stdout(self) -> bytes:
        with self._cond:
            return bytes(self._bufs["stdout"])

    @property
    def stderr(self) -> bytes:
        with self._cond:
            return bytes(self._bufs["stderr"])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, needle: bytes, timeout: float = 60, stream: str = "stdout") -> bytes:
        """Block until NEEDLE appears in STREAM; returns the stream so far.
        Fails (AssertionError) if the stream ends or the timeout passes first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while needle not in self._bufs[stream]:
                if self._eof[stream]:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            buf = bytes(self._bufs[stream])
            if needle in buf:
                return buf
            other = "stderr" if stream == "stdout" else "stdout"
            raise AssertionError(
                f"{needle!r} never appeared on {stream} of {self.argv!r} "
                f"(eof={self._eof[stream]}, rc={self.proc.poll()}): "
                f"{stream}={buf[-2000:]!r} {other}={bytes(self._bufs[other][-2000:])!r}")

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def wait(self, timeout: float = 60) -> int:
        """Wait for hutch to exit and its output to end; returns the exit status.
        On timeout hutch is stopped and SandboxTimeout raised."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop(self.proc)
            for t in self._threads:
                t.join(10)
            raise SandboxTimeout(self.argv, timeout, output=self.stdout,
                                 stderr=self.stderr) from None
        for t in self._threads:
            t.join(30)
        return self.proc.returncode

    def stop(self) -> None:
        self.close_stdin()
        _stop(self.proc)
        for t in self._threads:
            t.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


# --------------------------------------------------------------------------
# Parsing hutch's output
# --------------------------------------------------------------------------

def stderr_lines(cp_or_bytes) -> list:
    b = cp_or_bytes.stderr if hasattr(cp_or_bytes, "stderr") else cp_or_bytes
    return b.decode("utf-8", "replace").splitlines()


def assert_single_error_line(cp: subprocess.CompletedProcess, *needles: str) -> str:
    """stderr is exactly one line, starting with "hutch: ", containing NEEDLES."""
    lines = stderr_lines(cp)
    assert len(lines) == 1 and lines[0].startswith("hutch: "), (
        f"expected exactly one stderr line starting 'hutch: ', got {lines!r} "
        f"(rc={cp.returncode}, argv={cp.args!r})")
    for n in needles:
        assert n in lines[0], f"{n!r} not in error line {lines[0]!r}"
    return lines[0]


def parse_json_summary(cp_or_stderr) -> tuple:
    """Split `--json` stderr into (command's stderr lines, summary dict).
    The summary must be the last line, one JSON object with exactly the
    documented fields of the documented types."""
    lines = stderr_lines(cp_or_stderr)
    assert lines, "no stderr at all: expected the --json summary line"
    try:
        summary = json.loads(lines[-1])
    except ValueError as e:
        raise AssertionError(f"last stderr line is not JSON ({e}): {lines[-1]!r}") from None
    assert isinstance(summary, dict), f"summary is not an object: {lines[-1]!r}"
    assert set(summary) == set(JSON_SUMMARY_FIELDS), (
        f"summary fields {sorted(summary)} != {sorted(JSON_SUMMARY_FIELDS)}")
    for k, types in JSON_SUMMARY_FIELDS.items():
        v = summary[k]
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        assert ok, f"summary[{k!r}] = {v!r} is not of type {types}"
    assert SANDBOX_ID_RE.match(summary["sandbox_id"]), summary["sandbox_id"]
    return lines[:-1], summary


def parse_uid_map(text: str) -> list:
    """[(inside, outside, count), ...] from /proc/PID/uid_map text."""
    out = []
    for line in text.strip().splitlines():
        inside, outside, count = (int(x) for x in line.split())
        out.append((inside, outside, count))
    return out


def map_id(uid_map: Iterable, inside_id: int) -> Optional[int]:
    """Host id for INSIDE_ID under UID_MAP, or None if unmapped."""
    for inside, outside, count in uid_map:
        if inside <= inside_id < inside + count:
            return outside + inside_id - inside
    return None


def ps_sandboxes(timeout: float = 30) -> dict:
    """{id: [host_pid, template, backend, age...]} from `hutch ps -a` (lines
    whose first word is a sandbox id; a header line, if any, is ignored)."""
    cp = run_hutch(["ps", "-a"], timeout=timeout)
    assert cp.returncode == 0, f"hutch ps failed rc={cp.returncode}: {cp.stderr!r}"
    out = {}
    for line in cp.stdout.decode("utf-8", "replace").splitlines():
        words = line.split()
        if words and SANDBOX_ID_RE.match(words[0]):
            out[words[0]] = words[1:]
    return out


def ps_live_sandboxes(timeout: float = 30) -> dict:
    """Like ps_sandboxes, only entries whose init host pid is a number (a
    sandbox whose init is gone may be listed with "-")."""
    return {k: v for k, v in ps_sandboxes(timeout).items() if v and v[0].isdigit()}


# --------------------------------------------------------------------------
# Host-side views of sandboxes
# --------------------------------------------------------------------------

def _read_status(pid: str) -> Optional[dict]:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    d = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        d[k] = v.strip()
    return d


def host_processes() -> list:
    """[{pid, comm, uids, state}] of every host process (best effort: ones that
    exit while we read are skipped)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        st = _read_status(pid)
        if not st or "Uid" not in st:
            continue
        out.append({"pid": int(pid), "comm": st.get("Name", ""),
                    "uids": tuple(int(x) for x in st["Uid"].split()),
                    "state": st.get("State", "")})
    return out


def sandbox_processes() -> list:
    """Host processes with any uid (real, effective, saved, fs) >= UID_BASE."""
    return [p for p in host_processes() if max(p["uids"]) >= UID_BASE]


def count_sandbox_processes() -> int:
    """Cheap count of processes owned by a sandbox uid (stat of /proc/PID)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid >= UID_BASE:
                    n += 1
            except OSError:
                pass
    return n


def find_sandbox_pid(predicate) -> Optional[int]:
    """First sandbox process (host pid) for which predicate(pid) is true."""
    for p in sandbox_processes():
        try:
            if predicate(p["pid"]):
                return p["pid"]
        except OSError:
            continue
    return None


def find_sandbox_pid_with_path(inside_path: str) -> Optional[int]:
    """A host pid of a sandbox process whose root contains INSIDE_PATH
    (looked up through /proc/PID/root, as root on the host)."""
    rel = inside_path.lstrip("/")
    return find_sandbox_pid(lambda pid: os.path.lexists(f"/proc/{pid}/root/{rel}"))


def find_sandbox_pid_with_arg(token: str) -> Optional[int]:
    """A host pid of a sandbox process whose argv contains TOKEN."""
    t = token.encode()

    def has(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return t in f.read()
    return find_sandbox_pid(has)


def read_uid_map(pid: int) -> list:
    with open(f"/proc/{pid}/uid_map") as f:
        return parse_uid_map(f.read())


# --------------------------------------------------------------------------
# Leak snapshots
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LeakSnapshot:
    processes: frozenset          # (pid, comm, uids) with a uid >= UID_BASE
    hutch_processes: frozenset    # (pid, comm) named like hutch's own processes
    mounts: tuple                 # sorted (mount point, fs type, source), with repeats
    cgroups: frozenset            # dirs below each hutch parent cgroup
    sandbox_state: frozenset      # entries of STATE_DIR
    uid_reservations: frozenset   # entries of UID_RESERVATION_DIR
    netns_named: frozenset        # entries of NETNS_DIR
    netns_of_sandbox_processes: int  # distinct net ns among `processes`
    storage_layers: frozenset     # entries of STORAGE_LAYER_DIRS
    loop_devices: frozenset       # (loop device, backing file) backed by a file in DATA_DIR

    def diff(self, other: "LeakSnapshot") -> str:
        """Human-readable difference self -> other ('' when equal)."""
        parts = []
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a == b:
                continue
            if isinstance(a, (frozenset, tuple)):
                sa, sb = list(a), list(b)
                gone = [x for x in sa if x not in sb] if isinstance(a, tuple) else sorted(a - b, key=str)
                new = [x for x in sb if x not in sa] if isinstance(a, tuple) else sorted(b - a, key=str)
                if isinstance(a, tuple) and not gone and not new:
                    new = [f"multiplicity changed: {len(sa)} -> {len(sb)} entries"]
                parts.append(f"{f.name}: new={new[:20]!r} gone={gone[:20]!r}")
            else:
                parts.append(f"{f.name}: {a!r} -> {b!r}")
        return "\n".join(parts)


def _listdir(p: Path) -> frozenset:
    try:
        return frozenset(os.listdir(p))
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()


def _mounts() -> tuple:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            # mount point, fs type, source (mount ids are left out: remounts
            # of the same thing must not count as a change)
            out.append((fields[4], fields[sep + 1], fields[sep + 2]))
    return tuple(sorted(out))


def _cgroups() -> frozenset:
    out = set()
    parents = set()
    for g in CGROUP_PARENT_GLOBS:
        parents.update(glob.glob(g))
    for parent in sorted(parents):
        if not os.path.isdir(parent):
            continue
        for dirpath, dirnames, _ in os.walk(parent):
            for d in dirnames:
                out.add(os.path.join(dirpath, d))
    return frozenset(out)


def _loop_devices() -> frozenset:
    out = set()
    for bf in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(bf) as f:
                backing = f.read().strip()
        except OSError:
            continue
        if backing.startswith(str(DATA_DIR) + "/"):
            out.add((bf.split("/")[3], backing))
    return frozenset(out)


def take_leak_snapshot() -> LeakSnapshot:
    # Zombies are left out: they hold nothing but a pid, and reaping an
    # orphaned init (a SIGKILLed `hutch run`'s) is the host init's job; some
    # minimal host inits (this CI VM's) never do it.
    procs = [p for p in sandbox_processes() if not p["state"].startswith("Z")]
    netns = set()
    for p in procs:
        try:
            netns.add(os.readlink(f"/proc/{p['pid']}/ns/net"))
        except OSError:
            pass
    hutch_procs = set()
    for p in host_processes():
        if p["comm"] in HUTCH_PROCESS_NAMES and not p["state"].startswith("Z"):
            hutch_procs.add((p["pid"], p["comm"]))
    storage = set()
    for d in STORAGE_LAYER_DIRS:
        storage.update(f"{d}/{e}" for e in _listdir(d))
    return LeakSnapshot(
        processes=frozenset((p["pid"], p["comm"], p["uids"]) for p in procs),
        hutch_processes=frozenset(hutch_procs),
        mounts=_mounts(),
        cgroups=_cgroups(),
        sandbox_state=_listdir(STATE_DIR),
        uid_reservations=_listdir(UID_RESERVATION_DIR),
        netns_named=_listdir(NETNS_DIR),
        netns_of_sandbox_processes=len(netns),
        storage_layers=frozenset(storage),
        loop_devices=_loop_devices(),
    )


def assert_no_leak(before: LeakSnapshot, after: Optional[LeakSnapshot] = None,
                   what: str = "") -> None:
    """after (default: a fresh snapshot) must hold nothing that before did
    not: a new process, mount, cgroup, state dir, reservation, layer, loop
    device or netns. Things that went away meanwhile (another test's sandbox
    finishing its teardown) are not leaks."""
    if after is None:
        after = take_leak_snapshot()
    leaked = []
    for f in dataclasses.fields(before):
        a, b = getattr(before, f.name), getattr(after, f.name)
        if isinstance(a, frozenset):
            new = b - a
        elif isinstance(a, tuple):
            rest = list(a)
            new = []
            for x in b:
                if x in rest:
                    rest.remove(x)
                else:
                    new.append(x)
        else:
            new = [f"{a!r} -> {b!r}"] if b > a else []
        if new:
            leaked.append(f"{f.name}: new={sorted(new, key=str)[:20]!r}")
    if leaked:
        raise AssertionError(f"hutch left something behind{' ' + what if what else ''}:\n"
                             + "\n".join(leaked))


# --------------------------------------------------------------------------
# Output counting wrapper (run as a separate process)
# --------------------------------------------------------------------------

def _pattern_ok(kind: Optional[str], chunk: bytes, offset: int) -> bool:
    if kind is None:
        return True
    if kind == "zero":
        return chunk.count(0) == len(chunk)
    if kind == "yes":  # "y\n" repeated, starting at stream offset 0
        first, second = (b"y", b"\n") if offset % 2 == 0 else (b"\n", b"y")
        a, b = chunk[0::2], chunk[1::2]
        return a.count(first) == len(a) and b.count(second) == len(b)
    raise ValueError(kind)


def _count_output_main(spec: dict) -> dict:
    import resource
    argv = spec["argv"]
    timeout = spec.get("timeout", 120)
    patterns = spec.get("patterns", {})
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    res = {"bytes": {"stdout": 0, "stderr": 0},
           "pattern_ok": {"stdout": True, "stderr": True},
           "first_bad_offset": {"stdout": None, "stderr": None},
           "head": {"stdout": "", "stderr": ""},
           "tail": {"stdout": "", "stderr": ""},
           "timed_out": False}
    heads = {"stdout": bytearray(), "stderr": bytearray()}
    tails = {"stdout": b"", "stderr": b""}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    deadline = time.monotonic() + timeout
    open_streams = 2
    while open_streams:
        left = deadline - time.monotonic()
        if left <= 0:
            res["timed_out"] = True
            break
        for key, _ in sel.select(min(left, 1.0)):
            name = key.data
            chunk = os.read(key.fileobj.fileno(), 1 << 20)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            off = res["bytes"][name]
            if res["pattern_ok"][name] and not _pattern_ok(patterns.get(name), chunk, off):
                res["pattern_ok"][name] = False
                res["first_bad_offset"][name] = off
            res["bytes"][name] = off + len(chunk)
            if len(heads[name]) < 4096:
                heads[name] += chunk[:4096 - len(heads[name])]
            tails[name] = (tails[name] + chunk[-4096:])[-4096:]
    if res["timed_out"]:
        _stop(proc)
    else:
        proc.wait(max(1.0, deadline - time.monotonic()))
    res["rc"] = proc.returncode
    res["maxrss_kib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    for name in ("stdout", "stderr"):
        res["head"][name] = heads[name].decode("latin-1")
        res["tail"][name] = tails[name].decode("latin-1")
    return res


def run_counting(args: Sequence, cmd: Sequence, patterns: Optional[dict] = None,
                 timeout: float = 180) -> dict:
    """Run `hutch run ARGS -- CMD` under a wrapper process that counts (and
    optionally pattern-checks: "zero" or "yes") stdout and stderr in chunks.
    Returns {rc, bytes{stdout,stderr}, pattern_ok{..}, head{..}, tail{..},
    maxrss_kib (hutch's max RSS, from the wrapper's RUSAGE_CHILDREN), timed_out}."""
    spec = {"argv": [str(hutch_path()), "run", *map(str, args), "--", *map(str, cmd)],
            "timeout": timeout, "patterns": patterns or {}}
    cp = subprocess.run([sys.executable, __file__, "count-output", json.dumps(spec)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        stdin=subprocess.DEVNULL, timeout=timeout + 60)
    assert cp.returncode == 0, f"count-output wrapper failed: {cp.stderr!r}"
    res = json.loads(cp.stdout)
    assert not res["timed_out"], f"hutch did not finish within {timeout}s: {res!r}"
    return res


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "count-output":
        print(json.dumps(_count_output_main(json.loads(sys.argv[2]))))
        sys.exit(0)
    print(f"usage: {sys.argv[0]} count-output SPEC_JSON", file=sys.stderr)
    sys.exit(errno.EINVAL)


def make_test_ca(d: Path) -> None:
    """A test CA (d/ca.pem, ca.key) and a leaf for 127.0.0.1 and localhost
    (d/leaf.pem, leaf.key) that it signed, with openssl."""
    def run(argv):
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if cp.returncode != 0:
            raise AssertionError(f"{argv} failed ({cp.returncode}): {cp.stderr[-2000:]}")
    run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"), "-days", "2", "-subj", "/CN=hutch test CA"])
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                               "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(d / "leaf.key"), "-out", str(d / "leaf.csr"), "-subj", "/CN=127.0.0.1"])
    run(["openssl", "x509", "-req", "-in", str(d / "leaf.csr"), "-CA", str(d / "ca.pem"), "-CAkey",
         str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "leaf.pem"), "-days", "2",
         "-extfile", str(d / "ext.cnf")])
