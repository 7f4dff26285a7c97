"""A build FROM an image this host does not have (docs/templates.md,
"Building"): the builder pulls it from a registry (the CNCF distribution
server in a netns of the test's, as in test_registry.py), builds on it, and
a sandbox of the built template starts on the pulled layers."""

from __future__ import annotations

import os
import subprocess

import pytest

import hutchtest
from serveclient import ServeDaemon, parse_frames, stdout_of

from .test_registry import World, umoci_image


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    w = World(root)
    try:
        w.start()
        w.layout = umoci_image(root, 1, 0)
        w.push(w.layout, "multi", "test/sh:1")
        yield w
    finally:
        w.close()


def test_build_from_an_image_it_pulls(sandboxed_hutch, world, tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    # the daemon's first start makes the store and its default team
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    sd.stop()
    (data / "registries.conf").write_text("insecure 127.0.0.1:5000\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "pulled.build").write_text(
        "FROM 127.0.0.1:5000/test/sh:1\n"
        "RUN read -r l < /marker.txt; echo \"built on: $l\" > /built.txt\n")
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    env.pop("HUTCH_REGISTRIES_CONF", None)
    cp = subprocess.run(world.in_ns([str(hutchtest.hutch_path()), "template", "build", str(ctx / "pulled.build")]),
                        env=env, capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr
    assert "[base] pulled 127.0.0.1:5000/test/sh:1@sha256:" in cp.stderr, cp.stderr
    assert "as template sh-1" in cp.stderr, cp.stderr
    # the image is now a template of this host; a sandbox of the build starts on it
    sd.start()
    try:
        sb = sd.create(templateID="pulled")
        cmd = ("read -r l < /built.txt; echo \"$l\"; read -r m < /marker.txt; echo \"$m\"; "
               "[ -e /usr/bin/python3 ] || echo no-host-usr")
        # cwd /: the image has no home directories
        r = sd.stream(sb, "process.Process/Start",
                      {"process": {"cmd": "/bin/sh", "args": ["-c", cmd], "cwd": "/"}, "stdin": False}, user="root")
        assert r.status == 200, r
        frames = parse_frames(r.body)
        assert stdout_of(frames) == b"built on: multi-layer image\nmulti-layer image\nno-host-usr\n", frames
        sd.kill(sb["sandboxID"])
        # the pull the CLI's build made is in the audit trail (docs/audit.md)
        def pulls():
            r = sd.request("GET", "/events?kind=template.pull&limit=1000")
            assert r.status == 200, r
            return r.json()
        assert hutchtest.wait_until(lambda: pulls(), 10), "no template.pull record"
        d = pulls()[0]["detail"]
        assert d["ref"] == "127.0.0.1:5000/test/sh:1" and d["image"] == "sh-1" and d["by"] == "cli", d
        assert d["source"].startswith("127.0.0.1:5000/test/sh:1@sha256:") and d["bytes_downloaded"] > 0, d
    finally:
        sd.stop()
