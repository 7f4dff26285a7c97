"""Volumes from the CLI (docs/volumes.md): `hutch volume create|ls|rm` and
`hutch run --volume NAME:/path`, alone and next to a daemon serving the same
data dir. (The API is tested through the SDK in tests/e2b/volumes.test.mjs.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse

import pytest

from hutchtest import run_hutch
from serveclient import ServeDaemon

RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
needs_runsc = pytest.mark.skipif(not os.access(RUNSC, os.X_OK), reason="runsc is not installed")
GV = ["--backend", "gvisor"]

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _env(data):
    return {**os.environ, "HUTCH_DATA_DIR": str(data)}


def _hutch(data, *args, timeout=60):
    return run_hutch(list(args), env=_env(data), timeout=timeout)


def _disk_owner(image, path):
    """uid:gid of path inside an ext4 image, read by debugfs (never mounted)."""
    out = subprocess.run(["debugfs", "-R", f"stat {path}", str(image)], capture_output=True, text=True,
                         timeout=30).stdout
    m = re.search(r"User:\s+(\d+)\s+Group:\s+(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def test_volume_cli_lifecycle(sandboxed_hutch, tmp_path):
    if not shutil.which("debugfs"):
        pytest.fail("debugfs (e2fsprogs) is needed to read a volume's on-disk ids", pytrace=False)
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    cp = _hutch(data, "volume", "create", "work", "--size", "16M")
    assert cp.returncode == 0, cp.stderr
    vid = cp.stdout.decode().strip()
    assert UUID.match(vid), cp.stdout
    image = data / "volumes" / f"{vid}.img"
    assert image.stat().st_size == 16 << 20
    assert image.stat().st_blocks * 512 < 4 << 20, "the image is sparse"

    ls = _hutch(data, "volume", "ls")
    assert ls.returncode == 0 and re.search(rf"^{vid}\s+work\s+16M\s", ls.stdout.decode(), re.M), ls.stdout

    dup = _hutch(data, "volume", "create", "work")
    assert dup.returncode == 1 and b"volume with name 'work' already exists" in dup.stderr, dup.stderr
    bad = _hutch(data, "volume", "create", "no/slash")
    assert bad.returncode == 2 and b"invalid name" in bad.stderr
    small = _hutch(data, "volume", "create", "tiny", "--size", "1M")
    assert small.returncode == 2 and b"from 8M to 1T" in small.stderr

    # written as `user` in one sandbox, read as `root` in another, at another path
    w = _hutch(data, "run", "--volume", "work:/mnt/w", "--", "sh", "-c",
               "echo persisted > /mnt/w/f && mkdir /mnt/w/d && id -u")
    assert w.returncode == 0, w.stderr
    r = _hutch(data, "run", "--user", "root", "--volume", "work:/data", "--", "sh", "-c",
               "cat /data/f; stat -c %u:%g /data/f; head -c 20M /dev/zero > /data/big; echo rc=$?")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.startswith("persisted\n1000:1000\n"), out
    assert "rc=1" in out and b"No space left on device" in r.stderr, (out, r.stderr)
    # on disk: the sandbox's ids (1000), never its host uid range
    assert _disk_owner(image, "/f") == (1000, 1000)

    # bad mounts are usage errors that start nothing
    for spec, why in [("work:rel", b"must be absolute"), ("work:/a/../b", b"'.' or '..'"),
                      ("work:/etc/x", b"hutch sets up itself"), ("nocolon", b"NAME:/PATH")]:
        cp = _hutch(data, "run", "--volume", spec, "--", "true")
        assert cp.returncode == 2 and why in cp.stderr, (spec, cp.stderr)
    cp = _hutch(data, "run", "--volume", "work:/a", "--volume", "work:/a", "--", "true")
    assert cp.returncode == 2 and b"already used" in cp.stderr
    cp = _hutch(data, "run", "--volume", "missing:/m", "--", "true")
    assert cp.returncode == 125 and b"volume 'missing' not found" in cp.stderr, cp.stderr

    rm = _hutch(data, "volume", "rm", "work")
    assert rm.returncode == 0, rm.stderr
    assert not image.exists()
    assert vid not in _hutch(data, "volume", "ls").stdout.decode()
    cp = _hutch(data, "volume", "rm", "work")
    assert cp.returncode == 1 and b"not found" in cp.stderr
    # no loop device of ours is left
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert str(data) not in loops, loops


def test_volume_cli_next_to_a_daemon(sandboxed_hutch, tmp_path):
    """The CLI goes through the store and the volumes lock, so it works while
    `hutch serve` holds DATA_DIR/serve.lock; both see the same volumes."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    # what a create cut short leaves (an image no row knows, a half-made
    # one) is removed at start once it is a minute old; a young one is kept
    vols = data / "volumes"
    vols.mkdir(parents=True)
    stray = [vols / "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f.img", vols / "1e1e1e1e-1e1e-4e1e-8e1e-1e1e1e1e1e1e.img.new"]
    young = vols / "2d2d2d2d-2d2d-4d2d-8d2d-2d2d2d2d2d2d.img"
    for p in stray + [young]:
        p.write_bytes(b"x" * 4096)
    for p in stray:
        os.utime(p, (1, 1))
    (vols / "notes.txt").write_text("kept")
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--volume-size", "8M"])
    sd.start()
    assert sorted(p.name for p in vols.iterdir() if p.name != ".lock") == sorted([young.name, "notes.txt"])
    young.unlink()
    try:
        cp = _hutch(data, "volume", "create", "fromcli", "--size", "8M")
        assert cp.returncode == 0, cp.stderr
        vid = cp.stdout.decode().strip()
        r = sd.request("GET", "/volumes")
        assert r.status == 200 and {"volumeID": vid, "name": "fromcli"} in r.json(), r
        r = sd.request("POST", "/volumes", {"name": "fromapi"})
        assert r.status == 201, r
        api = r.json()
        assert "fromapi" in _hutch(data, "volume", "ls").stdout.decode()
        # a file written through the content plane is read by `hutch run`
        r = sd.request("PUT", f"/volumecontent/{api['volumeID']}/file?path=%2Fhello.txt", b"hi from the api",
                       headers={"Authorization": f"Bearer {api['token']}",
                                "Content-Type": "application/octet-stream"}, key="")
        assert r.status == 201, r
        cp = _hutch(data, "run", "--volume", "fromapi:/v", "--", "cat", "/v/hello.txt")
        assert cp.returncode == 0 and cp.stdout == b"hi from the api", cp.stderr
        # a sandbox of the daemon mounts the CLI's volume
        sb = sd.create(volumeMounts=[{"name": "fromcli", "path": "/mnt/c"}])
        try:
            r = sd.request("GET", f"/sandboxes/{sb['sandboxID']}")
            assert r.json()["volumeMounts"] == [{"name": "fromcli", "path": "/mnt/c"}]
        finally:
            sd.kill(sb["sandboxID"])
        assert _hutch(data, "volume", "rm", "fromapi").returncode == 0
        r = sd.request("GET", f"/volumes/{api['volumeID']}")
        assert r.status == 404 and r.json()["message"] == "Volume not found", r
    finally:
        sd.stop()


def _loops_of(data):
    return [l for l in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
            if str(data) in l]


def _host_mounts_of(data):
    return [l for l in open("/proc/self/mountinfo") if str(data) in l]


@needs_runsc
def test_gvisor_volume_cli(sandboxed_hutch, tmp_path):
    """`hutch run --backend gvisor --volume`: the same ids on disk and inside
    as on ns (the sandbox's ids, never a host range), the size limit, one
    file system with ns sandboxes, and nothing left on the host after."""
    if not shutil.which("debugfs"):
        pytest.fail("debugfs (e2fsprogs) is needed to read a volume's on-disk ids", pytrace=False)
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    cp = _hutch(data, "volume", "create", "work", "--size", "16M")
    assert cp.returncode == 0, cp.stderr
    image = data / "volumes" / f"{cp.stdout.decode().strip()}.img"

    # `user` writes (the default); its home keeps its owner though the mount
    # point is made below it
    w = _hutch(data, "run", *GV, "--volume", "work:/home/user/w", "--", "sh", "-c",
               "echo persisted > /home/user/w/f && mkdir /home/user/w/d && id -u && "
               "stat -c %u:%a /home/user /home/user/w && df -k /home/user/w | tail -1")
    assert w.returncode == 0, w.stderr
    out = w.stdout.decode().splitlines()
    assert out[:3] == ["1000", "1000:750", "1000:755"], out
    assert 14000 < int(out[3].split()[1]) <= 16384, out  # df shows the volume's size
    assert _disk_owner(image, "/f") == (1000, 1000)
    assert _disk_owner(image, "/d") == (1000, 1000)

    # root inside: root's on disk; the size limit is ENOSPC
    r = _hutch(data, "run", *GV, "--user", "root", "--volume", "work:/data", "--", "sh", "-c",
               "cat /data/f; stat -c %u:%g /data/f; touch /data/r; "
               "head -c 20M /dev/zero > /data/big; echo rc=$?; rm -f /data/big")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.startswith("persisted\n1000:1000\n") and "rc=1" in out, (out, r.stderr)
    assert b"No space left on device" in r.stderr, r.stderr
    assert _disk_owner(image, "/r") == (0, 0)

    # an ns sandbox sees the same files, owners and all
    n = _hutch(data, "run", "--volume", "work:/v", "--", "sh", "-c", "cat /v/f; stat -c %U:%u /v/f /v/r")
    assert n.returncode == 0 and n.stdout == b"persisted\nuser:1000\nroot:0\n", (n.stdout, n.stderr)

    # runsc would have to make a mount point in the host's /usr
    cp = _hutch(data, "run", *GV, "--volume", "work:/usr/x", "--", "true")
    assert cp.returncode == 125 and b"binds read-only from the host" in cp.stderr, cp.stderr
    # the host template's /bin is a link to usr/bin: no volume over what it points at
    cp = _hutch(data, "run", *GV, "--volume", "work:/bin/x", "--", "true")
    assert cp.returncode == 125 and b"crosses a symlink or a file" in cp.stderr, cp.stderr
    cp = _hutch(data, "run", *GV, "--volume", "missing:/m", "--", "true")
    assert cp.returncode == 125 and b"volume 'missing' not found" in cp.stderr, cp.stderr

    # the mounts lived in the runtime's own namespace: nothing on the host
    assert _host_mounts_of(data) == []
    assert _loops_of(data) == []


def _wait_gone(pred, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred():
        time.sleep(0.2)
    return pred()


@needs_runsc
def test_gvisor_volume_api(sandboxed_hutch, tmp_path):
    """volumeMounts on a gvisor create: shared with an ns sandbox and the
    content plane at once, kept over pause and resume (a checkpoint and a
    restore) and over a kill -9 of the daemon, never in a snapshot or fork,
    and nothing left once the sandboxes are gone."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    args = ["--pool-size", "0", "--volume-size", "16M"]
    sd = ServeDaemon(sandboxed_hutch, data, args)
    sd.start()
    try:
        r = sd.request("POST", "/volumes", {"name": "shared"})
        assert r.status == 201, r
        vol = r.json()
        auth = {"Authorization": f"Bearer {vol['token']}"}
        base = f"/volumecontent/{vol['volumeID']}"
        mounts = [{"name": "shared", "path": "/mnt/s"}]
        g = sd.create(backend="gvisor", volumeMounts=mounts, timeout=120)
        n = sd.create(volumeMounts=mounts)
        r = sd.request("GET", f"/sandboxes/{g['sandboxID']}")
        assert r.json()["volumeMounts"] == mounts, r

        # both ways, at once: a write in one is read by the other
        end, out, err, _ = sd.run(g, "echo from-gvisor > /mnt/s/g; id -u")
        assert end.get("exitCode", 0) == 0 and out == b"1000\n", (end, err)
        end, out, err, _ = sd.run(n, "cat /mnt/s/g; echo from-ns > /mnt/s/n")
        assert out == b"from-gvisor\n", (out, err)
        end, out, err, _ = sd.run(g, "cat /mnt/s/n")
        assert out == b"from-ns\n", (out, err)
        # rewritten in place by ns: the gvisor reader sees the new bytes
        sd.run(n, "echo second > /mnt/s/n")
        _, out, _, _ = sd.run(g, "cat /mnt/s/n")
        assert out == b"second\n", out
        # the content plane sees the gvisor sandbox's user as 1000, and its
        # writes are the sandbox's at once
        r = sd.request("GET", f"{base}/path?path=%2Fg", headers=auth, key="")
        assert r.status == 200 and (r.json()["uid"], r.json()["gid"]) == (1000, 1000), r
        r = sd.request("PUT", f"{base}/file?path=%2Fapi", b"from-api", key="",
                       headers={**auth, "Content-Type": "application/octet-stream"})
        assert r.status == 201, r
        _, out, _, _ = sd.run(g, "cat /mnt/s/api; echo; stat -c %U /mnt/s/api")
        assert out == b"from-api\nuser\n", out

        # a snapshot holds no volume: the sandbox goes on with its mount; a
        # copy has an empty, read-only directory there (runsc restores only
        # into the mounts a checkpoint was taken with), and mounts nothing
        gid = g["sandboxID"]
        sd.run(g, "echo in-layer > /home/user/l")
        r = sd.request("POST", f"/sandboxes/{gid}/snapshots", {}, timeout=120)
        assert r.status == 201, r
        snap = r.json()["snapshotID"]
        _, out, _, _ = sd.run(g, "cat /mnt/s/g")
        assert out == b"from-gvisor\n", out
        copy = sd.create(templateID=snap, timeout=120)
        end, out, err, _ = sd.run(copy, "cat /home/user/l; ls -A /mnt/s | wc -l; stat -c %u:%a /mnt/s")
        assert out == b"in-layer\n0\n0:755\n", (out, err)
        end, out, err, _ = sd.run(copy, "touch /mnt/s/x 2>&1; ls -A /run/hutch/vol/0 | wc -l", user="root")
        assert b"Read-only file system" in out and out.endswith(b"\n0\n"), (out, err)
        assert sd.request("GET", f"/sandboxes/{copy['sandboxID']}").json().get("volumeMounts", []) == []
        # a copy of the copy restores too (the stand-ins go with it)
        r = sd.request("POST", f"/sandboxes/{copy['sandboxID']}/fork", {"count": 1}, timeout=120)
        assert r.status == 201, r
        (entry,) = r.json()
        fork = entry["sandbox"]
        sd.created[fork["sandboxID"]] = sd.key
        _, out, _, _ = sd.run(fork, "cat /home/user/l; ls -A /mnt/s | wc -l")
        assert out == b"in-layer\n0\n", out
        assert sd.kill(copy["sandboxID"]).status == 204
        # and volumeMounts on a create from a gvisor snapshot are refused
        r = sd.request("POST", "/v2/sandboxes", {"templateID": snap, "volumeMounts": mounts}, timeout=120)
        assert r.status == 409 and "cannot mount volumes" in r.json()["message"], r

        # pause is a checkpoint (the runtime stops, its mounts go), resume
        # a restore that mounts the volume again; an open file survives
        sd.run(g, "(exec 3</mnt/s/g; sleep 600) >/dev/null 2>&1 </dev/null &")
        assert sd.request("POST", f"/sandboxes/{gid}/pause", {}, timeout=120).status == 204
        # while it is paused, others change what it had open and had read,
        # remove what it had seen, and add files
        sd.run(n, "echo while-paused > /mnt/s/p; echo grown >> /mnt/s/g; echo rewritten-longer > /mnt/s/n; "
                  "rm /mnt/s/api")
        r = sd.request("POST", f"/sandboxes/{gid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())
        end, out, err, _ = sd.run(g, "cat /mnt/s/p /mnt/s/g /mnt/s/n; ls /mnt/s/api; echo after > /mnt/s/a")
        assert out == b"while-paused\nfrom-gvisor\ngrown\nrewritten-longer\n", (out, err)
        assert b"No such file" in err, err
        _, out, _, _ = sd.run(n, "cat /mnt/s/a")
        assert out == b"after\n", out
        r = sd.request("POST", f"/sandboxes/{gid}/pause", {}, timeout=120)
        assert r.status == 204, r
        r = sd.request("POST", f"/sandboxes/{gid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())

        # kill -9 of the daemon: the sandbox is re-adopted with its mount
        sd.proc.send_signal(signal.SIGKILL)
        sd.proc.wait(10)
        sd.start()
        _, out, _, _ = sd.run(g, "cat /mnt/s/a; echo adopted > /mnt/s/d")
        assert out == b"after\n", out
        _, out, _, _ = sd.run(n, "cat /mnt/s/d")
        assert out == b"adopted\n", out

        # a volume deleted while a gvisor sandbox mounts it: like the ns
        # sandbox, it keeps the files over a pause and resume (the engine
        # holds the volume's loop device for it) ...
        assert sd.request("POST", f"/sandboxes/{gid}/pause", {}, timeout=120).status == 204
        assert sd.request("DELETE", f"/volumes/{vol['volumeID']}").status == 204
        r = sd.request("POST", f"/sandboxes/{gid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())
        _, out, _, _ = sd.run(g, "cat /mnt/s/d; echo kept > /mnt/s/k")
        assert out == b"adopted\n", out
        _, out, _, _ = sd.run(n, "cat /mnt/s/k")
        assert out == b"kept\n", out
        # ... but a daemon restarted since holds nothing of it: the resume
        # says why and the sandbox stays paused
        assert sd.request("POST", f"/sandboxes/{gid}/pause", {}, timeout=120).status == 204
        sd.proc.send_signal(signal.SIGKILL)
        sd.proc.wait(10)
        sd.start()
        r = sd.request("POST", f"/sandboxes/{gid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 500 and "the volume was deleted" in r.json()["message"], r
        _, out, _, _ = sd.run(n, "cat /mnt/s/k")
        assert out == b"kept\n", out
        assert sd.kill(gid).status == 204
        assert sd.kill(n["sandboxID"]).status == 204
    finally:
        assert sd.stop() == []
    assert _wait_gone(lambda: not _loops_of(data)), _loops_of(data)
    assert _host_mounts_of(data) == []
