"""Volumes from the CLI (docs/volumes.md): `hutch volume create|ls|rm` and
`hutch run --volume NAME:/path`, alone and next to a daemon serving the same
data dir. (The API is tested through the SDK in tests/e2b/volumes.test.mjs.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from hutchtest import run_hutch
from serveclient import ServeDaemon

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
    cp = _hutch(data, "run", "--backend", "gvisor", "--volume", "work:/m", "--", "true")
    assert cp.returncode == 125 and b"not supported on the gvisor backend" in cp.stderr, cp.stderr
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
