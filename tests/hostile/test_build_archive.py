"""A template build's COPY archive is the client's bytes (docs/templates.md,
"Building"): absolute names, `..` climbs, a symlink to the host's /etc and
a file written through it, a hardlink to /etc/shadow, a device node. The host
never unpacks it; tar does, as the build sandbox's root. Whatever the build
then says, no host file appears or changes."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import urllib.parse

from serveclient import ServeDaemon


def hostile_tar(tag: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        def add(name, data=b"", **kw):
            ti = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(ti, k, v)
            if ti.type == tarfile.REGTYPE:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            else:
                t.addfile(ti)
        add("ctx/", type=tarfile.DIRTYPE, mode=0o755)
        add("ctx/ok.txt", b"fine\n")
        add(f"/tmp/hutch-abs-{tag}", b"absolute\n")
        add(f"ctx/../../../../tmp/hutch-climb-{tag}", b"climb\n")
        add("ctx/etc", type=tarfile.SYMTYPE, linkname="/etc")
        add(f"ctx/etc/hutch-through-{tag}", b"through the link\n")
        add("ctx/shadow", type=tarfile.LNKTYPE, linkname="/etc/shadow")
        add("ctx/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
    return buf.getvalue()


def test_hostile_copy_archive_touches_no_host_file(sandboxed_hutch, tmp_path):
    tmp_path.chmod(0o755)
    tag = os.urandom(4).hex()
    victims = [f"/tmp/hutch-abs-{tag}", f"/tmp/hutch-climb-{tag}", f"/etc/hutch-through-{tag}"]
    shadow = hashlib.sha256(open("/etc/shadow", "rb").read()).hexdigest()
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0"])
    sd.start()
    try:
        r = sd.request("POST", "/v3/templates", {"name": "hostile"})
        assert r.status == 202, r
        tid, bid = r.json()["templateID"], r.json()["buildID"]
        h = hashlib.sha256(tag.encode()).hexdigest()
        r = sd.request("GET", f"/templates/{tid}/files/{h}")
        u = urllib.parse.urlsplit(r.json()["url"])
        assert sd.request("PUT", u.path + "?" + u.query, hostile_tar(tag), key="").status == 200
        body = {"fromTemplate": "base", "steps": [
            {"type": "COPY", "args": ["ctx", "/opt/ctx", "", ""], "force": False, "filesHash": h}]}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", body).status == 202
        deadline = time.monotonic() + 60
        while True:
            st = sd.request("GET", f"/templates/{tid}/builds/{bid}/status").json()
            if st["status"] in ("ready", "error"):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for v in victims:
            assert not os.path.lexists(v), v
        assert hashlib.sha256(open("/etc/shadow", "rb").read()).hexdigest() == shadow
        # (GNU tar in the sandbox strips the '/', refuses the '..' member,
        # the file through the link, the hardlink out and the mknod: the
        # build fails, which is one right answer)
        if st["status"] == "ready":
            # what did land is inside the template, owned inside its range
            sb = sd.create(templateID="hostile")
            end, out, err, _ = sd.run(sb, "cat /opt/ctx/ok.txt; ls -l /opt/ctx/shadow 2>&1 | cut -c1-10")
            assert out.startswith(b"fine\n"), (out, err)
            sd.kill(sb["sandboxID"])
    finally:
        sd.stop()
    for v in victims:
        assert not os.path.lexists(v), v
