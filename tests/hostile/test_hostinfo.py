"""What a sandbox's /proc shows of the host (SECURITY.md promise 2, grade
HostLeak; docs/security.md "What /proc and /sys show").

/proc cannot be an allowlist, so its masks are checked by name: the files and
directories that named the host's disks (every sandbox's loop-backed layer,
with its size and I/O), swap files, hardware and kernel command line read as
empty, as root and as `user`, and the host-root-only files stay unreadable.
The programs that read /proc (free, df, ps, top, nproc, Python, Node, the
JVM) must still work.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import hutchtest

# /proc files and directories masked on the ns backend (lib/sandbox/child.c):
# each read as empty. Only those the host kernel has are checked.
PROC_MASKED_FILES = ("partitions", "diskstats", "swaps", "cmdline", "iomem", "ioports",
                     "interrupts", "kallsyms", "keys", "timer_list")
PROC_MASKED_DIRS = ("fs", "bus", "irq", "acpi", "driver", "scsi")
# Readable by host root only: sandbox root is not host root, so the kernel
# refuses them (kpage* also need CAP_SYS_ADMIN in the initial namespace).
PROC_HOST_ROOT_ONLY = ("kpagecount", "kpageflags", "kpagecgroup", "slabinfo", "vmallocinfo",
                       "pagetypeinfo", "kmsg")


def _sandbox_sh(script: str, user: str = "root", backend: str = "ns", timeout: float = 120):
    cp = hutchtest.run_sandbox(["--backend", backend, "--user", user], ["sh", "-c", script],
                               timeout=timeout)
    return cp


def test_proc_host_device_and_identity_files_masked(warm):
    host_cmdline = Path("/proc/cmdline").read_text().strip()
    files = [f for f in PROC_MASKED_FILES if os.path.exists(f"/proc/{f}")]
    dirs = [d for d in PROC_MASKED_DIRS if os.path.isdir(f"/proc/{d}")]
    root_only = [f for f in PROC_HOST_ROOT_ONLY if os.path.exists(f"/proc/{f}")]
    script = ("cd /proc; "
              + "".join(f'printf "FILE {f} %s\\n" "$(wc -c < {f})"; ' for f in files)
              + "".join(f'printf "DIR {d} %s\\n" "$(ls -A {d} | wc -l)"; ' for d in dirs)
              + "".join(f'head -c1 {f} >/dev/null 2>&1 && echo "READ {f}"; ' for f in root_only)
              + "cat /proc/cmdline")
    for user in ("root", "user"):
        cp = _sandbox_sh(script, user=user)
        assert cp.returncode == 0, cp.stderr
        lines = cp.stdout.decode().splitlines()
        got = {tuple(ln.split()[:2]): ln.split()[2] for ln in lines
               if ln.startswith(("FILE ", "DIR "))}
        for f in files:
            assert got.get(("FILE", f)) == "0", f"/proc/{f} is not masked ({user}): {lines}"
        for d in dirs:
            assert got.get(("DIR", d)) == "0", f"/proc/{d} is not masked ({user}): {lines}"
        readable = [ln for ln in lines if ln.startswith("READ ")]
        assert not readable, f"host-root-only /proc files readable ({user}): {readable}"
        if host_cmdline:
            assert host_cmdline.encode() not in cp.stdout, "the host's kernel command line is visible"


# ------------------------------------------------- programs that read them

def _host_has(prog: str) -> bool:
    return shutil.which(prog, path="/usr/bin:/bin") is not None


PROGRAMS = [
    ("free", "free", lambda out: "Mem:" in out),
    ("df", "df -h /", lambda out: out.splitlines()[-1].split()[-1] == "/"),
    ("ps", "ps aux", lambda out: "ps aux" in out and "hutch-init" in out),
    ("top", "top -bn1", lambda out: "Tasks:" in out and "%Cpu" in out),
    ("nproc", "nproc", lambda out: int(out) == len(os.sched_getaffinity(0))),
    ("python3", "python3 -c 'import os;print(os.cpu_count())'",
     lambda out: int(out) == os.cpu_count()),
    ("node", "node -e 'console.log(require(\"os\").cpus().length)'",
     lambda out: int(out) == os.cpu_count()),
    ("java", "java -version 2>&1", lambda out: "version" in out),
]


@pytest.mark.parametrize("prog,script,check", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_common_programs_still_work(warm, prog, script, check):
    if not _host_has(prog):
        pytest.skip(f"{prog} is not installed on this host (the host template's /usr)")
    cp = hutchtest.run_sandbox(["--timeout", "60s"], ["sh", "-c", script], timeout=120)
    out = cp.stdout.decode(errors="replace").strip()
    assert cp.returncode == 0, (prog, cp.returncode, out[-2000:], cp.stderr[-2000:])
    assert check(out), (prog, out[-2000:])
    assert b"No such file" not in cp.stderr and b"rror" not in cp.stderr, cp.stderr[-2000:]
