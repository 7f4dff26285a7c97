"""What a sandbox's root leaves on the host, for the tests of image and
built templates on the gvisor backend (tests/integration/test_images.py,
test_template_build.py, tests/hostile/test_gvisor.py): a digest of a tree
(the layer store must never change), the host's mounts and loop devices,
and the processes of a sandbox."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import hutchtest
from hutchtest import wait_until


def tree_digest(*roots):
    """Every name, type, mode, owner, size, mtime, xattr, link target and
    file content under roots (symlinks never followed): what "never written"
    means for the layer store and the template versions."""
    h = hashlib.sha256()
    for root in roots:
        for dirpath, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in [".", *sorted(files), *dirs]:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                h.update(f"{os.path.relpath(p, root)} {st.st_mode:o} {st.st_uid}:{st.st_gid} {st.st_size} "
                         f"{st.st_mtime_ns} {st.st_rdev}\n".encode())
                for x in sorted(os.listxattr(p, follow_symlinks=False)):
                    h.update(x.encode() + os.getxattr(p, x, follow_symlinks=False))
                if os.path.islink(p):
                    h.update(os.readlink(p).encode())
                elif name != "." and os.path.isfile(p):
                    h.update(Path(p).read_bytes())
    return h.hexdigest()


def mounts_naming(*needles):
    text = Path("/proc/self/mountinfo").read_text()
    return [line for line in text.splitlines() if any(n in line for n in needles)]


def loops_backed_by(*needles):
    """Loop devices whose backing file names one of needles."""
    out = []
    for d in Path("/sys/block").glob("loop*"):
        try:
            backing = (d / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if any(n in backing for n in needles):
            out.append((d.name, backing))
    return out


def sandbox_processes(sid):
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if sid.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def assert_nothing_left(sid, data, timeout=30):
    """No mount, loop device, process or run-dir entry of the sandbox."""
    def gone():
        return (not mounts_naming(sid, str(data)) and not loops_backed_by(sid)
                and not sandbox_processes(sid) and not (hutchtest.STATE_DIR / sid).exists())
    assert wait_until(gone, timeout), (mounts_naming(sid, str(data)), loops_backed_by(sid),
                                       sandbox_processes(sid), (hutchtest.STATE_DIR / sid).exists())
    assert not (data / "storage" / "layers" / f"{sid}.img").exists()
