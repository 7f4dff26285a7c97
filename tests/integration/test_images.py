"""Image templates (docs/templates.md): `hutch template import` of OCI image
layouts and `docker save` archives, sandboxes from their layers (hutch run
and the daemon), the config's defaults, whiteouts across layers, layer
sharing, rm and prune. Images are made here with tarfile (no network): a
rootfs of busybox-static is enough for a shell."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import hutchtest
import ociimage as oi
from hutchtest import parse_json_summary
from layercheck import assert_nothing_left, mounts_naming, sandbox_processes, tree_digest
from serveclient import ServeDaemon

BUSYBOX = Path("/bin/busybox")


def _base_layer(os_id="hutchtest"):
    bb = BUSYBOX.read_bytes()
    ents = [oi.dir_entry("bin"), oi.file_entry("bin/busybox", bb, mode=0o755)]
    for tool in ("sh", "cat", "ls", "id", "pwd", "sleep", "true", "env", "echo", "stat", "test"):
        ents.append(oi.symlink_entry(f"bin/{tool}", "busybox"))
    ents += [
        oi.dir_entry("etc"),
        oi.file_entry("etc/os-release", f'ID={os_id}\nNAME="Hutch Test"\n'.encode()),
        oi.file_entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/app:/bin/sh\n"),
        oi.file_entry("etc/group", b"root:x:0:\napp:x:1234:\n"),
        oi.dir_entry("gone"), oi.file_entry("gone/a", b"a"),
        oi.dir_entry("opq"), oi.file_entry("opq/old", b"old"),
        oi.file_entry("delme", b"x"),
        oi.dir_entry("tmp", mode=0o1777),
    ]
    return oi.make_tar(ents)


def _top_layer(marker=b"hi\n"):
    return oi.make_tar([
        oi.dir_entry("app", uid=1234, gid=1234),
        oi.file_entry("app/hello", marker, uid=1234, gid=1234),
        oi.file_entry(".wh.gone"), oi.file_entry(".wh.delme"),
        oi.dir_entry("opq"), oi.file_entry("opq/.wh..wh..opq"), oi.file_entry("opq/new", b"new"),
    ])


@pytest.fixture(scope="module")
def base_layer():
    if not BUSYBOX.is_file():
        pytest.fail("/bin/busybox missing: apt-get install busybox-static (scripts/deps.sh test)")
    return _base_layer()


@pytest.fixture
def env(tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    e = dict(os.environ, HUTCH_DATA_DIR=str(data))
    return e, data


def hutch(hutch_bin, env, *args, timeout=120, check=True):
    p = subprocess.run([str(hutch_bin), *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=timeout)
    if check:
        assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    return p


def store(data):
    d = data / "layers" / "sha256"
    return sorted(p.name for p in d.iterdir() if len(p.name) == 64 and p.is_dir()) if d.exists() else []


def du_bytes(path):
    return int(subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, check=True,
                              text=True).stdout.split()[0])


def test_import_oci_layout_and_run_with_its_defaults(sandboxed_hutch, env, tmp_path, base_layer):
    e, data = env
    lay = tmp_path / "oci"
    oi.write_oci_layout(lay, [base_layer, _top_layer()], compression="gzip",
                        env=["PATH=/bin", "FOO=bar"], workdir="/app", user="app", cmd=["sh"])
    p = hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "bb")
    assert p.stdout.decode().strip() == "bb"
    assert b"layer 2/2" in p.stderr

    # the image's files, its config's defaults (user app = 1234, /app, Env)
    p = hutch(sandboxed_hutch, e, "run", "--template", "bb", "--", "sh", "-c",
              "cat /etc/os-release; id -u; id -g; pwd; echo FOO=$FOO; cat hello")
    out = p.stdout.decode()
    assert "ID=hutchtest" in out
    assert out.splitlines()[2:] == ["1234", "1234", "/app", "FOO=bar", "hi"], out
    # the command line wins over the template
    p = hutch(sandboxed_hutch, e, "run", "--template", "bb", "--user", "root", "--workdir", "/", "--env", "FOO=cli",
              "--", "sh", "-c", "id -u; pwd; echo $FOO")
    assert p.stdout.decode().split() == ["0", "/", "cli"]

    # whiteouts and opaque directories across the layers; hutch's /etc pieces
    p = hutch(sandboxed_hutch, e, "run", "--template", "bb", "--user", "root", "--", "sh", "-c",
              "ls -a /opq; test -e /gone && echo GONE-EXISTS; test -e /delme && echo DELME-EXISTS; "
              "cat /etc/hostname; grep -c '^user:x:1000:1000' /etc/passwd; test -d /home/user && echo HOME-OK")
    out = p.stdout.decode().split()
    assert "new" in out and "old" not in out, out
    assert "GONE-EXISTS" not in out and "DELME-EXISTS" not in out
    assert out[-3:] == ["hutch", "1", "HOME-OK"], out

    # (on the gvisor backend: test_gvisor_runs_an_image_template below)

    # ls: kind, layers, size
    rows = hutch(sandboxed_hutch, e, "template", "ls").stdout.decode().splitlines()
    assert rows[0].split() == ["NAME", "KIND", "LAYERS", "SIZE", "CREATED"]
    assert [r.split()[:3] for r in rows[1:]] == [["bb", "image", "2"]], rows
    p = hutch(sandboxed_hutch, e, "template", "ls", "--json")
    t = {x["name"]: x for x in json.loads(p.stdout)}["bb"]
    assert t["kind"] == "image" and t["layers"] == 2 and t["size"] > len(BUSYBOX.read_bytes())
    tj = json.loads((data / "templates" / "bb" / "template.json").read_text())
    assert tj["env"] == ["PATH=/bin", "FOO=bar"] and tj["workdir"] == "/app" and tj["user"] == "app"
    assert tj["cmd"] == ["sh"] and len(tj["layers"]) == 2
    # layers on disk: ids 0..65535 (never a sandbox's range), whiteouts as 0:0 char devices
    top = data / "layers" / "sha256" / tj["layers"][1][7:]
    st = os.lstat(top / "gone")
    assert os.major(st.st_rdev) == 0 and os.minor(st.st_rdev) == 0 and (st.st_mode & 0o170000) == 0o020000
    assert os.getxattr(top / "opq", "user.overlay.opaque") == b"y"
    assert os.stat(top / "app" / "hello").st_uid == 1234
    assert (data / "layers").stat().st_mode & 0o777 == 0o700


def test_docker_save_and_oci_tar_share_layers(sandboxed_hutch, env, tmp_path, base_layer):
    e, data = env
    # an OCI layout as a tar, zstd layers
    lay = tmp_path / "oci"
    oi.write_oci_layout(lay, [base_layer, _top_layer(b"one\n")], compression="zstd", ref="first:1")
    oi.tar_dir(lay, tmp_path / "oci.tar")
    hutch(sandboxed_hutch, e, "template", "import", str(tmp_path / "oci.tar"), "--name", "one")
    one = du_bytes(data / "layers")
    assert len(store(data)) == 2

    # a docker save archive with the same base layer: stored once, not read again
    oi.write_docker_save(tmp_path / "save.tar", [base_layer, _top_layer(b"two\n")], tag="Example/Two:3.1",
                         workdir="/app")
    p = hutch(sandboxed_hutch, e, "template", "import", str(tmp_path / "save.tar"))
    assert p.stdout.decode().strip() == "two-3.1"  # the name from its tag
    assert b"layer 1/2" in p.stderr and b"already in the store" in p.stderr
    assert len(store(data)) == 3
    two = du_bytes(data / "layers")
    assert two - one < len(BUSYBOX.read_bytes()) // 2, (one, two)  # du: the busybox layer is there once

    for name, want in (("one", "one"), ("two-3.1", "two")):
        p = hutch(sandboxed_hutch, e, "run", "--template", name, "--", "cat", "/app/hello")
        assert p.stdout.decode().strip() == want


def test_rm_and_prune_keep_what_a_live_sandbox_uses(sandboxed_hutch, env, tmp_path, base_layer):
    e, data = env
    for name, marker in (("a", b"a\n"), ("b", b"b\n")):
        oi.write_oci_layout(tmp_path / name, [base_layer, _top_layer(marker)])
        hutch(sandboxed_hutch, e, "template", "import", str(tmp_path / name), "--name", name)
    assert len(store(data)) == 3
    # a sandbox of a, alive while a is removed
    live = subprocess.Popen([str(sandboxed_hutch), "run", "--template", "a", "--", "sh", "-c",
                             "echo up; read x; cat /app/hello"], env=e, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert live.stdout.readline() == b"up\n"
        hutch(sandboxed_hutch, e, "template", "rm", "a")
        assert not (data / "templates" / "a").exists()
        assert hutch(sandboxed_hutch, e, "run", "--template", "a", "--", "true", check=False).returncode != 0
        hutch(sandboxed_hutch, e, "template", "prune")
        assert len(store(data)) == 3  # a's version and its top layer: the live sandbox uses them
        out, err = live.communicate(b"go\n", timeout=60)
        assert live.returncode == 0 and out == b"a\n", (out, err)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait(10)
    hutch(sandboxed_hutch, e, "template", "prune")
    assert len(store(data)) == 2  # the shared base stays for b
    assert not any(p.name.startswith("a@") for p in (data / "templates").iterdir())
    p = hutch(sandboxed_hutch, e, "run", "--template", "b", "--", "cat", "/app/hello")
    assert p.stdout == b"b\n"
    hutch(sandboxed_hutch, e, "template", "rm", "b")
    assert store(data) == []
    # the host template cannot go
    assert hutch(sandboxed_hutch, e, "template", "rm", "host", check=False).returncode != 0


def test_prune_removes_what_a_crash_left(sandboxed_hutch, env):
    e, data = env
    s = data / "layers" / "sha256"
    s.mkdir(parents=True)
    (s / (".tmp-" + "a" * 64 + "-1-0")).mkdir()
    (s / ("b" * 64)).mkdir()  # renamed, never marked done
    (s / ("b" * 64) / "f").write_text("x")
    (s / ("c" * 64 + ".done")).write_text("")  # a marker without its layer
    hutch(sandboxed_hutch, e, "template", "prune")
    assert sorted(p.name for p in s.iterdir() if not p.name.startswith(".") or p.name.startswith(".tmp")) == []


def test_daemon_creates_from_a_multi_layer_template(sandboxed_hutch, env, tmp_path, base_layer):
    e, data = env
    lay = tmp_path / "oci"
    mid = oi.make_tar([oi.dir_entry("srv"), oi.file_entry("srv/mid", b"mid\n")])
    oi.write_oci_layout(lay, [base_layer, mid, _top_layer()], env=["PATH=/bin", "FOO=daemon"], workdir="/srv")
    hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "three")
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(templateID="three", envVars={"BAR": "create"})
        assert sb["templateID"] == "three"
        end, out, err, _ = sd.run(sb, "cat /etc/os-release mid /app/hello; echo $FOO $BAR; pwd; id -un")
        assert end.get("exitCode", 0) == 0, (end, err)
        lines = out.decode().splitlines()
        assert "ID=hutchtest" in lines and lines[-5:] == ["mid", "hi", "daemon create", "/srv", "user"], lines
        r = sd.request("POST", "/v2/sandboxes", {"templateID": "no-such-template"})
        assert r.status == 404, r

        # a snapshot of it restores over the same layers, and keeps the template from `rm`
        end, _, err, _ = sd.run(sb, "echo kept > /srv/written", user="root")
        assert end.get("exitCode", 0) == 0, err
        r = sd.request("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})
        assert r.status == 201, r
        snap = r.json()["snapshotID"]
        sb2 = sd.create(templateID=snap)
        end, out, err, _ = sd.run(sb2, "cat /srv/mid /srv/written /app/hello")
        assert out == b"mid\nkept\nhi\n", (out, err)
        p = hutch(sandboxed_hutch, e, "template", "rm", "three", check=False)
        assert p.returncode != 0 and b"base of 1 snapshot" in p.stderr, p.stderr
        assert (data / "templates" / "three").is_symlink()
        hutch(sandboxed_hutch, e, "template", "rm", "--force", "three")
        assert not (data / "templates" / "three").exists()
    finally:
        sd.stop()


def test_an_image_umoci_built(sandboxed_hutch, env, tmp_path):
    """Interop: a layout written by a real tool (umoci), a file removed in a
    second layer (umoci's whiteout), its config's Env and WorkingDir."""
    e, data = env
    img, b1, b2 = tmp_path / "img", tmp_path / "b1", tmp_path / "b2"

    def umoci(*a):
        subprocess.run(["umoci", *a], check=True, capture_output=True, timeout=60)
    umoci("init", "--layout", str(img))
    umoci("new", "--image", f"{img}:latest")
    umoci("unpack", "--image", f"{img}:latest", str(b1))
    (b1 / "rootfs" / "bin").mkdir()
    (b1 / "rootfs" / "etc").mkdir()
    (b1 / "rootfs" / "bin" / "busybox").write_bytes(BUSYBOX.read_bytes())
    (b1 / "rootfs" / "bin" / "busybox").chmod(0o755)
    for tool in ("sh", "cat", "ls"):
        (b1 / "rootfs" / "bin" / tool).symlink_to("busybox")
    (b1 / "rootfs" / "etc" / "os-release").write_text("ID=umoci\n")
    (b1 / "rootfs" / "etc" / "drop").write_text("x\n")
    umoci("repack", "--image", f"{img}:latest", str(b1))
    umoci("unpack", "--image", f"{img}:latest", str(b2))
    (b2 / "rootfs" / "etc" / "drop").unlink()
    umoci("repack", "--image", f"{img}:latest", str(b2))
    umoci("config", "--image", f"{img}:latest", "--config.env", "UMOCI=yes", "--config.workingdir", "/etc")
    hutch(sandboxed_hutch, e, "template", "import", str(img), "--name", "um")
    p = hutch(sandboxed_hutch, e, "run", "--template", "um", "--", "sh", "-c",
              "cat /etc/os-release; echo $UMOCI; pwd; ls /etc/drop 2>&1; true")
    lines = p.stdout.decode().splitlines()
    assert lines[:3] == ["ID=umoci", "yes", "/etc"] and "No such file" in lines[3], lines


def test_docker_media_types_and_platform_choice(sandboxed_hutch, env, tmp_path, base_layer):
    """A Docker schema 2 manifest list with an arm64 and an amd64 image: the
    host's platform is chosen (the arm64 entry points at a blob that is not
    there, so choosing it would fail)."""
    e, data = env
    lay = tmp_path / "oci"

    def docker(m):
        m["mediaType"] = "application/vnd.docker.distribution.manifest.v2+json"
        m["config"]["mediaType"] = "application/vnd.docker.container.image.v1+json"
        for l in m["layers"]:
            l["mediaType"] = "application/vnd.docker.image.rootfs.diff.tar.gzip"
    oi.write_oci_layout(lay, [base_layer], manifest_hook=docker)
    idx = json.loads((lay / "index.json").read_text())
    amd = idx["manifests"][0]
    amd["mediaType"] = "application/vnd.docker.distribution.manifest.v2+json"
    arm = dict(amd, digest="sha256:" + "e" * 64, platform={"os": "linux", "architecture": "arm64", "variant": "v8"})
    lst = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
           "manifests": [arm, amd]}
    lb = json.dumps(lst).encode()
    (lay / "blobs" / "sha256" / oi.sha(lb)[7:]).write_bytes(lb)
    idx["manifests"] = [{"mediaType": lst["mediaType"], "digest": oi.sha(lb), "size": len(lb)}]
    (lay / "index.json").write_text(json.dumps(idx))
    # the layout's index names the list (as docker save of a multi-platform
    # image does), the list the manifests: the amd64 one is chosen
    hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "dk")
    p = hutch(sandboxed_hutch, e, "run", "--template", "dk", "--", "cat", "/etc/os-release")
    assert b"ID=hutchtest" in p.stdout
    # three levels of index: refused (a chain of indexes is never followed far)
    loop = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}
    lst3 = dict(lst, manifests=[{"mediaType": lst["mediaType"], "digest": oi.sha(lb), "size": len(lb),
                                 "platform": {"os": "linux", "architecture": "amd64"}}])
    lb = json.dumps(lst3).encode()
    (lay / "blobs" / "sha256" / oi.sha(lb)[7:]).write_bytes(lb)
    (lay / "index.json").write_text(json.dumps(dict(loop, manifests=[
        {"mediaType": lst["mediaType"], "digest": oi.sha(lb), "size": len(lb)}])))
    p = hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "dk3", check=False)
    assert p.returncode != 0 and b"nested more than two deep" in p.stderr, p.stderr
    # only other platforms: refused, naming what the image has
    (lay / "index.json").write_text(json.dumps(dict(lst, manifests=[arm])))
    p = hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "dk2", check=False)
    assert p.returncode != 0 and b"no manifest for linux/amd64" in p.stderr and b"linux/arm64/v8" in p.stderr, \
        p.stderr


def test_import_killed_midway_leaves_nothing(sandboxed_hutch, env, tmp_path):
    """kill -9 of an import while it unpacks: no template, and the next
    collection removes the half layer."""
    import signal
    import time
    e, data = env
    big = oi.make_tar([oi.dir_entry("d")] + [oi.file_entry(f"d/f{i}", b"\0" * (32 << 20)) for i in range(4)])
    oi.write_oci_layout(tmp_path / "oci", [big], compression=None)
    del big
    p = subprocess.Popen([str(sandboxed_hutch), "template", "import", str(tmp_path / "oci"), "--name", "big"],
                         env=e, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store_dir = data / "layers" / "sha256"
    deadline = time.monotonic() + 60
    seen = False
    while time.monotonic() < deadline and p.poll() is None:
        if store_dir.exists() and any(x.name.startswith(".tmp-") for x in store_dir.iterdir()):
            seen = True
            break
        time.sleep(0.005)
    assert seen, "the import never started unpacking"
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    assert not (data / "templates" / "big").exists()
    assert store(data) == []
    hutch(sandboxed_hutch, e, "template", "prune")
    assert [x.name for x in store_dir.iterdir() if x.name not in (".lock", ".busy")] == []


def test_reimport_switches_the_version_and_prune_takes_the_old(sandboxed_hutch, env, tmp_path, base_layer):
    e, data = env
    oi.write_oci_layout(tmp_path / "v1", [base_layer, _top_layer(b"v1\n")])
    oi.write_oci_layout(tmp_path / "v2", [base_layer, _top_layer(b"v2\n")])
    hutch(sandboxed_hutch, e, "template", "import", str(tmp_path / "v1"), "--name", "t")
    hutch(sandboxed_hutch, e, "template", "import", str(tmp_path / "v2"), "--name", "t")
    versions = [p.name for p in (data / "templates").iterdir() if p.name.startswith("t@")]
    assert len(versions) == 2 and len(store(data)) == 3
    assert hutch(sandboxed_hutch, e, "run", "--template", "t", "--", "cat", "/app/hello").stdout == b"v2\n"
    hutch(sandboxed_hutch, e, "template", "prune")
    assert [p.name for p in (data / "templates").iterdir() if p.name.startswith("t@")] == \
        [os.readlink(data / "templates" / "t")]
    assert len(store(data)) == 2  # v1's top layer went with its version


# ---------------------------------------------------------------- gvisor

RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
needs_runsc = pytest.mark.skipif(not os.access(RUNSC, os.X_OK), reason="runsc is not installed")


@needs_runsc
def test_gvisor_runs_an_image_template(sandboxed_hutch, env, tmp_path, base_layer):
    """The gvisor backend stacks the image's layers (read-only, on the host,
    in the relay's own mount namespace) as runsc's root: the image's files
    with their own owners, whiteouts, the config's defaults; writes land in
    the sandbox's layer and the layer store stays as it was; nothing of it
    is left after the run."""
    e, data = env
    lay = tmp_path / "oci"
    oi.write_oci_layout(lay, [base_layer, _top_layer()], env=["PATH=/bin", "FOO=bar"], workdir="/app",
                        user="app")
    hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "bb")
    before = tree_digest(data / "layers", data / "templates")
    gv = ["run", "--backend", "gvisor", "--template", "bb"]

    # the image's files, owners as in the image, its defaults (user app =
    # 1234, /app, Env), whiteouts and opaque directories across the layers
    p = hutch(sandboxed_hutch, e, *gv, "--json", "--", "sh", "-c",
              "cat /etc/os-release; id -u; id -g; pwd; echo FOO=$FOO; cat hello; "
              "stat -c '%n %u:%g %a' /app /app/hello /bin/busybox /tmp; ls -a /opq; "
              "test -e /gone && echo GONE-EXISTS; test -e /delme && echo DELME-EXISTS; "
              "cat /etc/hostname; test -d /home/user && echo HOME-OK; uname -r")
    out = p.stdout.decode().splitlines()
    assert "ID=hutchtest" in out, out
    i = out.index("1234")
    assert out[i:i + 9] == ["1234", "1234", "/app", "FOO=bar", "hi", "/app 1234:1234 755",
                            "/app/hello 1234:1234 644", "/bin/busybox 0:0 755", "/tmp 0:0 1777"], out
    assert "new" in out and "old" not in out and "GONE-EXISTS" not in out and "DELME-EXISTS" not in out
    assert out[-3:-1] == ["hutch", "HOME-OK"] and out[-1] != os.uname().release, out  # the sentry's kernel
    sid = parse_json_summary(p)[1]["sandbox_id"]
    assert_nothing_left(sid, data)

    # the command line wins over the template; root writes over image files
    # (copied up into the sandbox's layer), deletes one, makes a new one
    p = hutch(sandboxed_hutch, e, *gv, "--user", "root", "--workdir", "/", "--env", "FOO=cli", "--json", "--",
              "sh", "-c", "id -u; pwd; echo $FOO; echo changed > /app/hello && rm /bin/cat && "
              "echo new > /bin/newfile && chown 77:88 /app && cat /app/hello /bin/newfile; "
              "stat -c '%u:%g' /app; test -e /bin/cat || echo CAT-GONE")
    assert p.stdout.decode().split() == ["0", "/", "cli", "changed", "new", "77:88", "CAT-GONE"], p.stdout
    assert_nothing_left(parse_json_summary(p)[1]["sandbox_id"], data)
    # ... in that sandbox's layer only: the store is as it was, and the
    # next sandbox sees the image again
    assert tree_digest(data / "layers", data / "templates") == before
    p = hutch(sandboxed_hutch, e, *gv, "--", "sh", "-c", "cat /app/hello; test -e /bin/cat && echo CAT")
    assert p.stdout == b"hi\nCAT\n"
    # a volume in an image template's sandbox: its mount point made below
    # the image's /app (which keeps its owner); the volume's root is
    # `user`'s (1000), not the image user's, as on ns
    hutch(sandboxed_hutch, e, "volume", "create", "iv", "--size", "8M")
    p = hutch(sandboxed_hutch, e, *gv, "--user", "root", "--volume", "iv:/app/data", "--", "sh", "-c",
              "echo v > /app/data/f && chown 1234:1234 /app/data/f; stat -c '%u' /app /app/data /app/data/f")
    assert p.stdout == b"1234\n1000\n1234\n", (p.stdout, p.stderr)
    assert tree_digest(data / "layers", data / "templates") == before
    # (an ns sandbox of the image sees the same ids)
    p = hutch(sandboxed_hutch, e, "run", "--template", "bb", "--volume", "iv:/v", "--", "stat", "-c", "%u", "/v/f")
    assert p.stdout == b"1234\n", (p.stdout, p.stderr)


@needs_runsc
def test_gvisor_daemon_image_template_pause_snapshot_and_kill(sandboxed_hutch, env, tmp_path, base_layer):
    """Through the API on gvisor: the image's Env and WorkingDir, E2B's
    default user; pause (a checkpoint) and resume restore over the same
    stacked root with the processes going on; a snapshot (a memory
    checkpoint) starts a new sandbox over it; a kill -9 of the runtime
    leaves no mount, loop device or run-dir entry behind."""
    e, data = env
    lay = tmp_path / "oci"
    mid = oi.make_tar([oi.dir_entry("srv"), oi.file_entry("srv/mid", b"mid\n", uid=4321, gid=4322)])
    oi.write_oci_layout(lay, [base_layer, mid, _top_layer()], env=["PATH=/bin", "FOO=daemon"], workdir="/srv")
    hutch(sandboxed_hutch, e, "template", "import", str(lay), "--name", "three")
    before = tree_digest(data / "layers", data / "templates")
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    try:
        sb = sd.create(templateID="three", envVars={"BAR": "create"}, backend="gvisor", timeout=300)
        sid = sb["sandboxID"]
        end, out, err, _ = sd.run(sb, "cat mid /app/hello; echo $FOO $BAR; pwd; id -un; stat -c %u:%g mid; "
                                      "uname -r")
        assert end.get("exitCode", 0) == 0, (end, err)
        lines = out.decode().splitlines()
        assert lines[:-1] == ["mid", "hi", "daemon create", "/srv", "user", "4321:4322"], lines
        assert lines[-1] != os.uname().release
        # the root runsc serves is the stacked overlay, in the relay's mount
        # namespace only; the host's mount table never holds it
        relay_mounts = [m for pid in sandbox_processes(sid)
                        for m in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                        if f"/sandboxes/{sid}/root " in m]
        assert relay_mounts and all(" overlay " in m and " ro," in m for m in relay_mounts), relay_mounts
        assert not mounts_naming(sid)
        # the per-sandbox top layer (its /tmp is world-writable) is root's
        # alone: no host user adds a file to a live root's lower layer
        st = (hutchtest.STATE_DIR / sid / "gvtop").stat()
        assert st.st_uid == 0 and st.st_mode & 0o777 == 0o700, oct(st.st_mode)

        # a process that lives through a pause; a file in the layer
        # (/tmp/n is replaced by a rename, never truncated: a checkpoint
        # taken between a truncation and its write would find it empty)
        end, _, err, _ = sd.run(sb, "echo kept > /srv/written; (i=0; while :; do i=$((i+1)); "
                                    "echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; "
                                    "sleep 0.1; done) >/dev/null 2>&1 </dev/null &", user="root")
        assert end.get("exitCode", 0) == 0, err
        assert sd.request("POST", f"/sandboxes/{sid}/pause", {}, timeout=120).status == 204
        assert not sandbox_processes(sid) and not mounts_naming(sid)
        r = sd.request("POST", f"/sandboxes/{sid}/connect", {"timeout": 300}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())
        end, out, err, _ = sd.run(sb, "a=$(cat /tmp/n); sleep 0.5; b=$(cat /tmp/n); cat /srv/written /srv/mid; "
                                      "test $b -gt $a && echo COUNTING")
        assert out == b"kept\nmid\nCOUNTING\n", (out, err)

        # a snapshot restores over the same layers in a new sandbox
        r = sd.request("POST", f"/sandboxes/{sid}/snapshots", {}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())
        sb2 = sd.create(templateID=r.json()["snapshotID"], timeout=300)
        assert sb2["sandboxID"] != sid
        end, out, err, _ = sd.run(sb2, "cat /srv/mid /srv/written /app/hello; test -s /tmp/n && echo N")
        assert out == b"mid\nkept\nhi\nN\n", (out, err, sd.log_tail())
        sd.kill(sb2["sandboxID"])
        assert_nothing_left(sb2["sandboxID"], data)

        # kill -9 of everything the sandbox runs on the host: the daemon
        # finds it dead; its mounts went with the relay's namespace
        for pid in sandbox_processes(sid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert_nothing_left(sid, data, timeout=60)
        assert tree_digest(data / "layers", data / "templates") == before
    finally:
        sd.stop()
