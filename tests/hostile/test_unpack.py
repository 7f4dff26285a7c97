"""Hostile images (issue 13, security): every layer is attacker-controlled.
Each case imports an image whose layer or manifest tries one trick, and
asserts that the import failed with a clear error, that nothing was written
outside the layer store (the victim files and the escape targets on the
host are untouched), and that no half template or half layer was left."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import ociimage as oi


@pytest.fixture
def world(tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret").write_text("host secret\n")
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    return tmp_path, data, victim, env


def snapshot(victim):
    return {p.name: p.read_bytes() for p in victim.iterdir()}


def import_layers(hutch_bin, world, layers, name="evil", compression="gzip", env_extra=None, **kw):
    tmp, data, victim, env = world
    lay = tmp / ("oci-" + name)
    oi.write_oci_layout(lay, layers, compression=compression, **kw)
    e = dict(env, **(env_extra or {}))
    return subprocess.run([str(hutch_bin), "template", "import", str(lay), "--name", name], env=e,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)


def assert_refused(p, world, victim_before, *needles, name="evil"):
    tmp, data, victim, env = world
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, (p.stdout, err)
    for n in needles:
        assert n in err, (n, err)
    assert snapshot(victim) == victim_before
    # no template, no half version, no layer of the image, no temp dir
    tdir = data / "templates"
    if tdir.exists():
        assert not [x.name for x in tdir.iterdir() if x.name == name or x.name.startswith(name + "@")]
    store = data / "layers" / "sha256"
    if store.exists():
        left = [x.name for x in store.iterdir() if x.name not in (".lock", ".busy")]
        assert left == [], left
    return err


BASE = [oi.dir_entry("etc"), oi.file_entry("etc/ok", b"ok")]


@pytest.mark.parametrize("entries,needle", [
    pytest.param([oi.file_entry("../../../escape-dotdot", b"x")], "'..' component", id="dotdot"),
    pytest.param([oi.file_entry("a/../../escape", b"x")], "'..' component", id="dotdot-inner"),
    pytest.param([oi.file_entry("/tmp/escape-abs", b"x")], "absolute name", id="absolute"),
    pytest.param([oi.dir_entry("d" + "/d" * 140)], "deeper than", id="depth"),
    pytest.param([oi.file_entry("x" * 250 + "/" + "y" * 250 + ("/" + "z" * 250) * 17, b"x")],
                 "longer than", id="long-path"),
    pytest.param([dict(type="chr", name="dev-null", dev=(1, 3))], "device node", id="device"),
    pytest.param([dict(type="chr", name="fake-whiteout", dev=(0, 0))], "device node", id="raw-whiteout-device"),
    pytest.param([oi.file_entry("bin-su", b"\x7fELF", mode=0o4755, uid=70000)], "outside 0..65535",
                 id="setuid-outside-range"),
    pytest.param([oi.file_entry("g", b"x", mode=0o2755, gid=1 << 20)], "outside 0..65535", id="setgid-outside-range"),
    pytest.param([oi.file_entry(".wh..", b"")], "names nothing", id="whiteout-dotdot"),
    pytest.param([oi.file_entry("f", b"x", pax={"SCHILY.xattr.user.overlay.redirect": "/etc"})],
                 "overlay xattr", id="overlay-xattr"),
    pytest.param([oi.file_entry("f", b"x", pax={"SCHILY.xattr.trusted.overlay.opaque": "y"})],
                 "overlay xattr", id="trusted-overlay-xattr"),
])
def test_hostile_entries(sandboxed_hutch, world, entries, needle):
    before = snapshot(world[2])
    p = import_layers(sandboxed_hutch, world, [oi.make_tar(BASE + entries)])
    assert_refused(p, world, before, needle)
    assert not Path("/escape-dotdot").exists() and not Path("/tmp/escape-abs").exists()


def test_symlink_then_a_file_through_it(sandboxed_hutch, world):
    tmp, data, victim, env = world
    before = snapshot(victim)
    tar = oi.make_tar(BASE + [oi.symlink_entry("a", str(victim)), oi.file_entry("a/pwned", b"pwned"),
                              oi.symlink_entry("b", "../../../../../../" + str(victim)),
                              oi.file_entry("b/pwned2", b"pwned")])
    p = import_layers(sandboxed_hutch, world, [tar])
    assert_refused(p, world, before, "is a symlink: the layer writes through it")


def test_hardlinks_to_host_files(sandboxed_hutch, world):
    tmp, data, victim, env = world
    before = snapshot(victim)
    for i, target in enumerate([str(victim / "secret"), "../../../../../../../../" + str(victim / "secret")[1:],
                                "etc/shadow"]):
        tar = oi.make_tar(BASE + [oi.hardlink_entry("h", target)])
        p = import_layers(sandboxed_hutch, world, [tar], name=f"evil{i}")
        assert_refused(p, world, before, "hardlink", name=f"evil{i}")
    assert os.stat(victim / "secret").st_nlink == 1


def test_a_link_to_etc_shadow_is_never_written_through(sandboxed_hutch, world):
    """A symlink to /etc/shadow, then a file of the same name: the link is
    replaced, never followed; the layer holds a file, the host's shadow is
    untouched. (This one is a valid layer: it imports.)"""
    tmp, data, victim, env = world
    shadow = Path("/etc/shadow").read_bytes()
    tar = oi.make_tar(BASE + [oi.symlink_entry("etc/shadow-link", "/etc/shadow"),
                              oi.file_entry("etc/shadow-link", b"overwritten"),
                              oi.symlink_entry("etc/victim-link", str(victim / "secret")),
                              oi.file_entry("etc/victim-link", b"overwritten")])
    p = import_layers(sandboxed_hutch, world, [tar], name="links")
    assert p.returncode == 0, p.stderr
    assert Path("/etc/shadow").read_bytes() == shadow
    assert (victim / "secret").read_text() == "host secret\n"
    layer = next(x for x in (data / "layers" / "sha256").iterdir() if len(x.name) == 64)
    assert (layer / "etc" / "shadow-link").read_bytes() == b"overwritten"
    assert not (layer / "etc" / "shadow-link").is_symlink()


def test_xattrs_are_stripped_and_setid_is_kept_only_in_range(sandboxed_hutch, world):
    tmp, data, victim, env = world
    tar = oi.make_tar(BASE + [
        oi.file_entry("cap", b"x", mode=0o755, pax={"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}),
        oi.file_entry("selinux", b"x", pax={"SCHILY.xattr.security.selinux": "system_u:object_r:shadow_t:s0"}),
        oi.file_entry("tr", b"x", pax={"SCHILY.xattr.trusted.evil": "1"}),
        oi.file_entry("ok", b"x", pax={"SCHILY.xattr.user.note": "kept"}),
        oi.file_entry("suid", b"x", mode=0o4755, uid=0),
    ])
    p = import_layers(sandboxed_hutch, world, [tar], name="xattrs")
    assert p.returncode == 0, p.stderr
    layer = next(x for x in (data / "layers" / "sha256").iterdir() if len(x.name) == 64)
    for f in ("cap", "selinux", "tr"):
        names = os.listxattr(layer / f)
        assert not [n for n in names if n.startswith(("security.capability", "trusted."))], (f, names)
        assert "security.selinux" not in names or os.getxattr(layer / f, "security.selinux") != \
            b"system_u:object_r:shadow_t:s0"
    assert os.getxattr(layer / "ok", "user.note") == b"kept"
    # set-id kept for an owner inside 0..65535 (id-mapped into the sandbox's
    # range; the sandbox's root is mounted nosuid, and the store is 0700)
    assert os.stat(layer / "suid").st_mode & 0o4000
    assert (data / "layers").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compression_bomb(sandboxed_hutch, world, compression):
    before = snapshot(world[2])
    tar = oi.make_tar(BASE + [oi.file_entry("zeros", b"\0" * (48 << 20))])
    p = import_layers(sandboxed_hutch, world, [tar], compression=compression,
                      env_extra={"HUTCH_IMAGE_MAX_BYTES": str(16 << 20)})
    assert_refused(p, world, before, "compression bomb")


def _blob(lay, digest):
    return Path(lay) / "blobs" / "sha256" / digest[7:]


def test_manifest_that_lies(sandboxed_hutch, world):
    tmp, data, victim, env = world
    before = snapshot(victim)
    good = oi.make_tar(BASE)

    # a layer blob whose bytes are not the digest it is named by
    def flip(m):
        b = _blob(tmp / "oci-evil", m["layers"][0]["digest"])
        raw = bytearray(b.read_bytes())
        raw[-9] ^= 0xFF
        b.write_bytes(bytes(raw))
    assert_refused(import_layers(sandboxed_hutch, world, [good], manifest_hook=flip), world, before,
                   "has digest", "refused")

    # the size the manifest gives is wrong
    def size(m):
        m["layers"][0]["size"] += 1
    assert_refused(import_layers(sandboxed_hutch, world, [good], manifest_hook=size), world, before,
                   "the manifest says")

    # the config's diff_id is not the uncompressed tar's digest
    cfg = oi.image_config(["sha256:" + "0" * 64])
    assert_refused(import_layers(sandboxed_hutch, world, [good], config_override=cfg), world, before,
                   "rootfs.diff_ids lies")

    # more diff_ids than layers
    cfg = oi.image_config([oi.sha(good), oi.sha(good)])
    assert_refused(import_layers(sandboxed_hutch, world, [good], config_override=cfg), world, before,
                   "lists 1 layers, the config's rootfs.diff_ids 2")

    # a foreign (non-distributable) layer
    def foreign(m):
        m["layers"][0]["mediaType"] = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
        m["layers"][0]["urls"] = ["https://example.invalid/layer"]
    assert_refused(import_layers(sandboxed_hutch, world, [good], manifest_hook=foreign), world, before,
                   "foreign/non-distributable")

    # an image for another architecture
    cfg = oi.image_config([oi.sha(good)], arch="s390x")
    assert_refused(import_layers(sandboxed_hutch, world, [good], config_override=cfg), world, before,
                   "the image is for s390x")


def test_the_unpacker_cannot_see_the_host(sandboxed_hutch, world):
    """A hardlink by the name of a host file that exists at that path on the
    host (/etc/passwd): the unpacker's root is the layer, so the name is
    looked up there and the link fails."""
    before = snapshot(world[2])
    tar = oi.make_tar([oi.hardlink_entry("pw", "etc/passwd"), oi.hardlink_entry("pw2", "proc/self/root/etc/passwd")])
    p = import_layers(sandboxed_hutch, world, [tar])
    assert_refused(p, world, before, "not in the layer")
