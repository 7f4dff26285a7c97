"""A volume is written by untrusted sandboxes and read by the host's daemon
(the content plane, docs/volumes.md): a path or a link there must never make
the daemon read, write, chown or remove a host file, nor list a host
directory. A sandbox plants links (to a root-only host file, to a host
directory, to /), then every content operation is aimed through them and
through '..' spellings; the host files must come out unchanged and unread."""

from __future__ import annotations

import os
import secrets
import shutil
import urllib.parse

import pytest

from hutchtest import run_hutch
from serveclient import ServeDaemon


def _q(path: str) -> str:
    return urllib.parse.quote(path, safe="")


def test_content_plane_never_leaves_the_volume(sandboxed_hutch, tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    token = secrets.token_hex(16)
    host_dir = tmp_path / "hostdir"
    host_dir.mkdir(mode=0o700)
    secret = host_dir / "secret"
    secret.write_text(token)
    secret.chmod(0o600)
    before = secret.stat()

    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--volume-size", "8M"])
    sd.start()
    try:
        r = sd.request("POST", "/volumes", {"name": "hostile"})
        assert r.status == 201, r
        vol = r.json()
        auth = {"Authorization": f"Bearer {vol['token']}"}
        base = f"/volumecontent/{vol['volumeID']}"

        # the sandbox plants links (the host paths are absolute host paths)
        plant = (f"ln -s {secret} /v/abs && ln -s {host_dir} /v/dir && ln -s / /v/root && "
                 f"ln -s ../../../../../../../..{secret} /v/rel && mkdir /v/sub && ln -s .. /v/sub/up")
        cp = run_hutch(["run", "--volume", "hostile:/v", "--", "sh", "-c", plant],
                       env={**os.environ, "HUTCH_DATA_DIR": str(data)})
        assert cp.returncode == 0, cp.stderr

        def req(method, kind, path, body=None, extra=""):
            return sd.request(method, f"{base}/{kind}?path={_q(path)}{extra}", body=body, headers=auth, key="")

        outputs = []
        for p in ["/abs", "/rel", "/root" + str(secret), "/dir/secret", "/sub/up/abs", "/sub/up/up/up/abs"]:
            r = req("GET", "file", p)
            outputs.append(r.body)
            assert r.status in (400, 404), (p, r)
        for p in ["/dir", "/root" + str(host_dir), "/sub/up/dir"]:
            r = req("GET", "dir", p)
            outputs.append(r.body)
            assert r.status in (400, 404), (p, r)
        # '..' in every spelling is refused before anything is opened
        for raw in ["/../" + str(secret), "/sub/../../x", "/./..", "..", "abs"]:
            r = req("GET", "path", raw)
            assert r.status == 400, (raw, r)
        r = sd.request("GET", f"{base}/file?path=%2F%2e%2e%2Fetc%2Fpasswd", headers=auth, key="")
        assert r.status == 400, r
        # writes, metadata and removal through links stay inside the volume
        r = req("PUT", "file", "/abs", body=b"overwritten")
        assert r.status == 201 and r.json()["type"] == "file", r
        r = req("PUT", "file", "/dir/planted", body=b"x")
        assert r.status in (201, 400, 404), r
        r = req("PATCH", "path", "/rel", body={"uid": 0, "gid": 0})
        assert r.status == 200 and r.json()["type"] == "symlink", r
        r = req("PATCH", "path", "/rel", body={"mode": 0o777})
        assert r.status == 400, r
        r = req("POST", "dir", "/root" + str(host_dir) + "/made", extra="&force=true")
        assert r.status in (201, 400, 404), r
        r = req("DELETE", "path", "/dir")
        assert r.status == 204, r
        r = req("DELETE", "path", "/root" + str(host_dir))
        assert r.status in (204, 404), r

        for out in outputs:
            assert token.encode() not in out, out
        assert secret.read_text() == token
        after = secret.stat()
        assert (after.st_uid, after.st_gid, after.st_mode, after.st_mtime_ns) == \
               (before.st_uid, before.st_gid, before.st_mode, before.st_mtime_ns)
        assert sorted(os.listdir(host_dir)) == ["secret"]
        assert host_dir.stat().st_mode & 0o777 == 0o700
    finally:
        sd.stop()


RUNSC = shutil.which("runsc") or "/usr/bin/runsc"


@pytest.mark.skipif(not os.access(RUNSC, os.X_OK), reason="runsc is not installed")
def test_gvisor_sandbox_never_leaves_the_volume(sandboxed_hutch, tmp_path):
    """On gvisor a volume is a host directory that runsc's gofer serves: a
    link, a '..' chain, a hard link or a device node made by sandbox root
    in the volume must reach nothing of the host, in that sandbox nor in
    the next one (gvisor or ns) that mounts the volume."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    env = {**os.environ, "HUTCH_DATA_DIR": str(data)}
    token = secrets.token_hex(16)
    host_dir = tmp_path / "hostdir"
    host_dir.mkdir(mode=0o700)
    secret = host_dir / "secret"
    secret.write_text(token)
    secret.chmod(0o600)
    before = secret.stat()
    assert run_hutch(["volume", "create", "hostile", "--size", "8M"], env=env).returncode == 0

    up = "../" * 12
    attack = " ; ".join([
        f"ln -s {secret} /v/abs", f"ln -s {up}{str(secret)[1:]} /v/rel", "ln -s / /v/root",
        f"ln -s {host_dir} /v/dir", "ln -s /proc/self/root /v/procroot", "mkdir -p /v/sub && ln -s .. /v/sub/up",
        # through them, and up out of the mount
        "cat /v/abs /v/rel /v/root" + str(secret), f"ls /v/dir /v/root{host_dir}",
        f"cat /v/procroot{secret}", f"cat /v/sub/up/up/up{secret}", f"cat /v/../../..{secret}",
        f"cat /run/hutch/vol/0/../../..{secret}",
        # writes through them land in the sandbox, or nowhere
        "echo overwritten > /v/abs", "echo planted > /v/dir/planted",
        # hard links across the mount, device nodes in it
        "ln /etc/passwd /v/hard; echo hard=$?", "mknod /v/mem c 1 1; echo mknod=$?",
        "ls -la /v",
    ])
    g = run_hutch(["run", "--backend", "gvisor", "--user", "root", "--volume", "hostile:/v", "--",
                   "sh", "-c", attack], env=env, timeout=120)
    out = g.stdout + g.stderr
    assert g.returncode in (0, 1), out
    assert b"hard=0" not in g.stdout, out  # EXDEV: the root is another mount
    # the next sandboxes follow the same links in their own roots
    follow = (f"cat /v/abs /v/rel /v/root{secret} /v/procroot{secret} /v/sub/up/up/up{secret}; "
              f"ls /v/dir; head -c 1 /v/mem; echo done")
    for backend in ("gvisor", "ns"):
        cp = run_hutch(["run", "--backend", backend, "--user", "root", "--volume", "hostile:/v", "--",
                        "sh", "-c", follow], env=env, timeout=120)
        assert b"done" in cp.stdout, (backend, cp.stdout, cp.stderr)
        out += cp.stdout + cp.stderr
    assert token.encode() not in out, out
    assert secret.read_text() == token
    after = secret.stat()
    assert (after.st_uid, after.st_gid, after.st_mode, after.st_mtime_ns) == \
           (before.st_uid, before.st_gid, before.st_mode, before.st_mtime_ns)
    assert sorted(os.listdir(host_dir)) == ["secret"]
    # and no host mount of the volume outlived the sandboxes
    assert not [l for l in open("/proc/self/mountinfo") if str(data) in l]
