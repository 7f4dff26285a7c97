"""Templates shared between nodes through an OCI registry (issue 18,
docs/scale-out.md "Templates through a registry"): `hutch template push` on
one node's data dir, and `hutch serve --template-registry` on another that
never had the template pulling it when a create names it.

The registry is Debian's docker-registry (the CNCF distribution server) on a
free port of 127.0.0.1, plain HTTP (an `insecure` line in each data dir's
registries.conf), its log at level info: every request it served is a line,
which is how "not uploaded again" and "pulled once" are checked. The image
is built with umoci: the host's /bin/sh with its libraries, a marker file,
Env, WorkingDir, and the labels a template's start and ready commands
travel in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import hutchtest
from serveclient import ServeDaemon, free_port

TOOLS = ("docker-registry", "umoci", "openssl", "htpasswd")
missing = [t for t in TOOLS if not shutil.which(t)]
if missing:
    pytest.fail("test_template_share needs " + ", ".join(missing) + " (scripts/deps.sh test)",
                pytrace=False)

MARKER = "made on node A\n"


def sh(argv, **kw):
    kw.setdefault("timeout", 180)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    cp = subprocess.run(argv, **kw)
    if cp.returncode != 0:
        raise AssertionError(f"{argv} failed ({cp.returncode}): {cp.stderr[-2000:]}")
    return cp


def hutch(hutch_bin, data_dir: Path, *args, check=True, timeout=180, input=None):
    env = dict(os.environ, HUTCH_DATA_DIR=str(data_dir))
    cp = subprocess.run([str(hutch_bin), *args], env=env, capture_output=True, text=True,
                        timeout=timeout, input=input,
                        stdin=None if input is not None else subprocess.DEVNULL)
    if check and cp.returncode != 0:
        raise AssertionError(f"hutch {args} failed ({cp.returncode}): {cp.stderr[-3000:]}")
    return cp


def json_lines(out: str):
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def sh_rootfs(dst: Path):
    """/bin/sh (the host's, with its libraries), `id`, and a marker file."""
    for prog in ("sh", "id", "cat"):
        path = Path(os.path.realpath(shutil.which(prog)))
        files = {str(path)}
        ldd = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30)
        for line in ldd.stdout.splitlines():
            for part in line.split():
                if part.startswith("/"):
                    files.add(part)
                    files.add(os.path.realpath(part))
        for f in files:
            target = dst / f.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(f), target)
        (dst / "bin").mkdir(exist_ok=True)
        if not (dst / "bin" / prog).exists():
            shutil.copy2(path, dst / "bin" / prog)
    (dst / "srv" / "app").mkdir(parents=True)
    (dst / "srv" / "app" / "marker.txt").write_text(MARKER)


class Registry:
    """docker-registry on a free port: plain HTTP, or (tls) HTTPS with a test
    CA and htpasswd basic auth."""

    def __init__(self, root: Path, name: str = "registry", tls: bool = False):
        self.root = root
        self.name = name
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.log = root / f"{name}.log"
        extra = ""
        if tls:
            hutchtest.make_test_ca(root)
            cp = sh(["htpasswd", "-Bbn", "alice", "pw-alice"])
            (root / "htpasswd").write_text(cp.stdout)
            extra = (f"  tls:\n    certificate: {root / 'leaf.pem'}\n    key: {root / 'leaf.key'}\n"
                     f"auth:\n  htpasswd:\n    realm: hutch-test\n    path: {root / 'htpasswd'}\n")
        (root / f"{name}.yml").write_text(
            f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / (name + '-store')}\nhttp:\n  addr: {self.host}\n" + extra)
        self.proc = None

    def start(self):
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.root / f"{self.name}.yml")],
                                     stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        import socket
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("docker-registry never listened")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)

    def requests(self, method: str, pattern: str) -> int:
        """How many requests of method whose URI matches pattern it served
        (its access log's lines: "METHOD URI HTTP/1.1")."""
        n = 0
        for line in self.log.read_text(errors="replace").splitlines():
            m = re.search(rf'"{method} (\S+) HTTP/', line)
            if m and re.search(pattern, m.group(1)):
                n += 1
        return n


@pytest.fixture(scope="module")
def world(sandboxed_hutch):
    # not under pytest's tmp (mode 0700): sandbox uids must reach the run dirs
    root = Path(tempfile.mkdtemp(prefix="hutch-tplshare-"))
    root.chmod(0o755)
    reg = Registry(root)
    reg.start()
    # the image: one layer (sh, id, cat and a marker), Env, WorkingDir, the labels
    layout = root / "oci"
    sh(["umoci", "init", "--layout", str(layout)])
    sh(["umoci", "new", "--image", f"{layout}:t"])
    bundle = root / "bundle"
    sh(["umoci", "unpack", "--image", f"{layout}:t", str(bundle)])
    sh_rootfs(bundle / "rootfs")
    sh(["umoci", "repack", "--image", f"{layout}:t", str(bundle)])
    shutil.rmtree(bundle)
    sh(["umoci", "config", "--image", f"{layout}:t", "--config.env", "SHARED_FROM=node-a",
        "--config.workingdir", "/srv/app", "--config.label", "dev.hutch.start-cmd=echo started",
        "--config.label", "dev.hutch.ready-cmd=true"])
    a = root / "node-a"
    a.mkdir()
    (a / "registries.conf").write_text(f"insecure {reg.host}\n")
    hutch(sandboxed_hutch, a, "template", "import", str(layout), "--name", "shared-tpl")

    class W:
        pass
    w = W()
    w.root, w.reg, w.a, w.bin = root, reg, a, sandboxed_hutch
    w.daemons = []

    def node(name, registry=None, extra=()):
        d = root / name
        d.mkdir(exist_ok=True)
        (d / "registries.conf").write_text(f"insecure {reg.host}\n")
        args = ["--run-dir", str(root / (name + "-run")), "--pool-size", "0",
                "--template-registry", registry or f"{reg.host}/hutch", *extra]
        s = ServeDaemon(sandboxed_hutch, d, args)
        s.start()
        w.daemons.append(s)
        return s
    w.node = node
    try:
        yield w
    finally:
        for s in w.daemons:
            s.stop()
        reg.stop()
        shutil.rmtree(root, ignore_errors=True)


def push(w, name, ref, check=True):
    return hutch(w.bin, w.a, "template", "push", "--json", name, ref, check=check)


def test_a_template_pushed_on_one_node_starts_on_another(world):
    w = world
    ref = f"{w.reg.host}/hutch/shared-tpl"
    cp = push(w, "shared-tpl", ref)
    done = json_lines(cp.stdout)[-1]
    assert done["phase"] == "pushed" and done["layers"] == 1, done
    assert done["blobs_uploaded"] == 1 and done["blobs_present"] == 0, done
    assert re.fullmatch(re.escape(ref) + r":latest@sha256:[0-9a-f]{64}", done["target"]), done
    assert cp.stdout.strip().splitlines()[-1].startswith("{")

    # a second push uploads nothing: every blob is HEADed and found
    uploads = w.reg.requests("PUT", r"/v2/hutch/shared-tpl/blobs/uploads/")
    assert uploads == 2, uploads  # the layer and the config, once
    again = json_lines(push(w, "shared-tpl", ref).stdout)[-1]
    assert again["blobs_uploaded"] == 0 and again["blobs_present"] == 1, again
    assert again["target"] == done["target"], (again, done)
    assert w.reg.requests("PUT", r"/v2/hutch/shared-tpl/blobs/uploads/") == uploads
    assert w.reg.requests("POST", r"/v2/hutch/shared-tpl/blobs/uploads/") == uploads
    # to another repository of the registry: the layer is mounted from the
    # first, not uploaded (the config is the same small blob: uploaded)
    other = json_lines(push(w, "shared-tpl", f"{w.reg.host}/hutch/other-repo").stdout)[-1]
    assert other["blobs_mounted"] == 1 and other["blobs_uploaded"] == 0, other
    assert w.reg.requests("POST", r"/v2/hutch/other-repo/blobs/uploads/\?mount=sha256") == 1
    assert w.reg.requests("PUT", r"/v2/hutch/other-repo/blobs/uploads/") == 1  # the config

    # node B never had it: the create pulls it, and a command sees the files,
    # the Env, the WorkingDir; the start and ready commands came along
    b = w.node("node-b")
    assert not (b.data_dir / "templates" / "shared-tpl").exists()
    sb = b.create(templateID="shared-tpl")
    end, out, err, _ = b.run(sb, 'pwd; cat marker.txt; echo "$SHARED_FROM"; id -u')
    assert end.get("exitCode", 0) == 0, (end, err)
    assert out.decode().splitlines() == ["/srv/app", MARKER.strip(), "node-a", "1000"], out
    tj = json.loads((b.data_dir / "templates" / "shared-tpl" / "template.json").read_text())
    assert tj["start_cmd"] == "echo started" and tj["ready_cmd"] == "true", tj
    assert tj["workdir"] == "/srv/app" and "SHARED_FROM=node-a" in tj["env"], tj
    assert tj["source"].startswith(f"{ref}:latest@sha256:"), tj
    # the next create finds it here: no second pull
    b.create(templateID="shared-tpl")
    assert b.log_tail(20000).count("pulling " + ref) == 1, b.log_tail()
    # and B lists it for the routers' placement
    node = b.request("GET", "/node").json()
    assert "shared-tpl" in node["templates"], node
    # the pull is in the audit trail of the team whose create made it
    pulls = b.request("GET", "/events?kind=template.pull").json()
    assert len(pulls) == 1, pulls
    d = pulls[0]["detail"]
    assert d["by"] == "template-registry" and d["image"] == "shared-tpl", d
    assert d["ref"] == ref + ":latest" and d["bytes_downloaded"] > 0, d


def test_concurrent_creates_of_a_missing_template_pull_it_once(world):
    w = world
    ref = f"{w.reg.host}/hutch/burst-tpl"
    push(w, "shared-tpl", ref)
    c = w.node("node-c")
    manifests_before = w.reg.requests("GET", r"/v2/hutch/burst-tpl/manifests/")
    results = []

    def create():
        r = c.request("POST", "/v2/sandboxes", {"templateID": "burst-tpl"}, timeout=120)
        results.append(r)
        if r.status == 201:
            c.created[r.json()["sandboxID"]] = c.key

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert [r.status for r in results] == [201] * 6, results
    assert c.log_tail(20000).count("pulling " + ref) == 1, c.log_tail()
    assert w.reg.requests("GET", r"/v2/hutch/burst-tpl/manifests/") - manifests_before == 1


def test_a_template_no_registry_has_is_a_404_and_leaves_nothing(world):
    w = world
    d = w.node("node-d")
    r = d.request("POST", "/v2/sandboxes", {"templateID": "never-pushed"}, timeout=60)
    assert r.status == 404, r
    body = r.json()
    assert body["code"] == 404 and "never-pushed" in body["message"], body
    assert "not found" in body["message"], body
    assert not list((d.data_dir / "templates").glob("never-pushed*"))
    # a snapshot the registry does not have either: the same 404
    r = d.request("POST", "/v2/sandboxes", {"templateID": "snap_0000abcdefghijklmnop"}, timeout=60)
    assert r.status == 404, r
    assert r.json()["message"] == "template 'snap_0000abcdefghijklmnop' not found", r
    assert not [p for p in (d.data_dir / "snapshots").iterdir() if p.name.startswith(".pull")]


def test_a_registry_that_cannot_be_reached_is_a_clear_502(world):
    w = world
    dead = f"127.0.0.1:{free_port()}"
    e = w.node("node-e", registry=f"{dead}/hutch")
    (e.data_dir / "registries.conf").write_text(f"insecure {dead}\n")
    r = e.request("POST", "/v2/sandboxes", {"templateID": "shared-tpl"}, timeout=60)
    assert r.status == 502, r
    msg = r.json()["message"]
    assert "template registry" in msg and "cannot connect" in msg, msg
    assert not list((e.data_dir / "templates").glob("shared-tpl*"))
    # the push, too, says so and exits 125
    cp = push(w, "shared-tpl", f"{dead}/hutch/shared-tpl", check=False)
    (w.a / "registries.conf").write_text(f"insecure {w.reg.host}\n")
    assert cp.returncode == 125, cp
    assert "cannot connect" in cp.stderr, cp.stderr


def test_push_refuses_what_it_cannot_push(world):
    w = world
    ref = f"{w.reg.host}/hutch/x"
    cp = push(w, "host", ref, check=False)
    assert cp.returncode == 125 and "host template" in cp.stderr, cp
    cp = push(w, "no-such-template", ref, check=False)
    assert cp.returncode == 125 and "no-such-template" in cp.stderr, cp
    cp = push(w, "shared-tpl", "UPPER//bad", check=False)
    assert cp.returncode == 2, cp
    cp = push(w, "shared-tpl", f"{ref}@sha256:" + "0" * 64, check=False)
    assert cp.returncode == 2 and "tag" in cp.stderr, cp
    # nothing of a failed push stays in the layer store
    leftovers = [p for p in (w.a / "layers" / "sha256").iterdir()
                 if p.name.startswith(".tmp") or p.name.endswith(".tmp")]
    assert not leftovers, leftovers


def test_serve_refuses_a_bad_template_registry(world):
    for bad in ("no-slash", "reg.example:5000/x:tag", "reg.example/x@sha256:" + "0" * 64):
        cp = subprocess.run([str(world.bin), "serve", "--data-dir", str(world.root / "unused"),
                             "--template-registry", bad], capture_output=True, text=True, timeout=30)
        assert cp.returncode != 0 and "template-registry" in cp.stderr, (bad, cp)


def test_a_router_sends_a_create_of_a_template_no_node_has_to_a_node_that_pulls_it(world):
    w = world
    ref = f"{w.reg.host}/hutch/routed-tpl"
    push(w, "shared-tpl", ref)
    keys = w.root / "keys"
    key = "e2b_" + os.urandom(20).hex()
    keys.write_text(f"default {key}\n")
    nodes = [w.node("node-r0", extra=("--node-id", "rt00", "--keys-file", str(keys)))]
    (w.root / "node-r1").mkdir()
    shutil.copy2(nodes[0].data_dir / "secrets.key", w.root / "node-r1" / "secrets.key")
    nodes.append(w.node("node-r1", extra=("--node-id", "rt01", "--keys-file", str(keys))))
    port = free_port()
    router = subprocess.Popen([str(w.bin), "router", "--listen", f"127.0.0.1:{port}",
                               "--nodes", ",".join(n.url for n in nodes), "--key-file", str(keys),
                               "--poll-interval", "200"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        front = ServeDaemon(w.bin, w.root / "unused")
        front.port, front.key = port, key
        deadline = time.monotonic() + 20
        while True:
            try:
                if front.request("GET", "/health").status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the router never answered"
            time.sleep(0.1)
        time.sleep(0.5)  # a poll of both nodes
        r = front.request("POST", "/v2/sandboxes", {"templateID": "routed-tpl"}, timeout=120)
        assert r.status == 201, r
        sid = r.json()["sandboxID"]
        owner = next(n for n in nodes if sid.startswith(n.request("GET", "/node", key=key).json()["nodeID"]))
        owner.created[sid] = key
        assert (owner.data_dir / "templates" / "routed-tpl").exists()
        assert sum("pulling " + ref in n.log_tail(20000) for n in nodes) == 1
        # the next create goes where the template now is
        time.sleep(0.6)
        r = front.request("POST", "/v2/sandboxes", {"templateID": "routed-tpl"}, timeout=120)
        assert r.status == 201, r
        sid2 = r.json()["sandboxID"]
        owner.created[sid2] = key
        assert sid2[:4] == sid[:4], (sid, sid2)

        # a snapshot there, pushed; its node goes away: a create from it
        # goes to the other node, which pulls it
        r = front.request("POST", f"/sandboxes/{sid}/snapshots", {}, timeout=120)
        assert r.status == 201, r
        snap = r.json()["snapshotID"]
        deadline = time.monotonic() + 60
        while "pushed snapshot " + snap not in owner.log_tail(20000):
            assert time.monotonic() < deadline, owner.log_tail()
            time.sleep(0.2)
        owner.stop()
        other = next(n for n in nodes if n is not owner)
        time.sleep(1)  # the router's polls find it down
        r = front.request("POST", "/v2/sandboxes", {"templateID": snap}, timeout=120)
        assert r.status == 201, r
        sid3 = r.json()["sandboxID"]
        other.created[sid3] = key
        assert sid3[:4] == other.request("GET", "/node", key=key).json()["nodeID"], sid3
        assert "pulled snapshot " + snap in other.log_tail(20000)
    finally:
        router.kill()
        router.wait(10)


def test_push_and_the_pull_on_a_miss_use_the_pulls_tls_and_credentials(world):
    """HTTPS with a private CA (registries.conf's ca line) and basic auth
    (`hutch template login`): refused without credentials, with a message
    that says what to do; pushed with them; pulled by a node that has them."""
    w = world
    sec = w.root / "secure"
    sec.mkdir()
    reg = Registry(sec, "secure", tls=True)
    reg.start()
    try:
        conf = f"ca {reg.host} {sec / 'ca.pem'}\ninsecure {w.reg.host}\n"
        (w.a / "registries.conf").write_text(conf)
        ref = f"{reg.host}/hutch/shared-tpl"
        cp = push(w, "shared-tpl", ref, check=False)
        assert cp.returncode == 125, cp
        assert "needs credentials" in cp.stderr and "hutch template login" in cp.stderr, cp.stderr
        hutch(w.bin, w.a, "template", "login", "--username", "alice", reg.host, input="pw-alice\n")
        done = json_lines(push(w, "shared-tpl", ref).stdout)[-1]
        assert done["phase"] == "pushed" and done["blobs_uploaded"] == 1, done

        f = w.node("node-f", registry=f"{reg.host}/hutch")
        (f.data_dir / "registries.conf").write_text(conf)
        # no credentials on F yet: a clear 502, nothing left
        r = f.request("POST", "/v2/sandboxes", {"templateID": "shared-tpl"}, timeout=60)
        assert r.status == 502 and "credentials" in r.json()["message"], r
        assert not list((f.data_dir / "templates").glob("shared-tpl*"))
        hutch(w.bin, f.data_dir, "template", "login", "--username", "alice", reg.host,
              input="pw-alice\n")
        sb = f.create(templateID="shared-tpl")
        end, out, err, _ = f.run(sb, "cat marker.txt")
        assert out.decode() == MARKER, (out, err)
    finally:
        (w.a / "registries.conf").write_text(f"insecure {w.reg.host}\n")
        reg.stop()


def test_a_snapshot_taken_on_one_node_is_restored_on_another(world):
    """Nodes with template-registry push every snapshot they seal
    (REGISTRY/PATH/snapshots:<id>); a node with no row for a snapshot pulls
    it when a create names it, if the creating key's team (by name) is the
    snapshot's and the node has the same secrets.key."""
    w = world
    push(w, "shared-tpl", f"{w.reg.host}/hutch/shared-tpl")
    g = w.node("node-g", extra=("--node-id", "snpg"))
    key = (g.data_dir / "secrets.key").read_bytes()
    # H gets G's key (the operator's one key file for every node); I has its own
    hd = w.root / "node-h"
    hd.mkdir()
    (hd / "secrets.key").write_bytes(key)
    (hd / "secrets.key").chmod(0o600)
    other_key = "e2b_" + os.urandom(20).hex()
    (w.root / "keys-h").write_text(f"other {other_key}\n")
    h = w.node("node-h", extra=("--node-id", "snph", "--keys-file", str(w.root / "keys-h")))
    i = w.node("node-i", extra=("--node-id", "snpi"))

    # a sandbox of the shared image template (pulled on G's miss), a file
    # written in it, a snapshot: pushed in the background
    sb = g.create(templateID="shared-tpl")
    end, _, err, _ = g.run(sb, "echo from-g > /srv/app/written", user="root")
    assert end.get("exitCode", 0) == 0, err
    r = g.request("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {}, timeout=120)
    assert r.status == 201, r
    snap = r.json()["snapshotID"]
    assert snap.startswith("snap_snpg"), snap
    deadline = time.monotonic() + 60
    while "pushed snapshot " + snap not in g.log_tail(20000):
        assert time.monotonic() < deadline and "pushing snapshot" not in g.log_tail(20000), g.log_tail()
        time.sleep(0.2)

    # H restores it: the image template pulled too, the file there
    sb2 = h.create(templateID=snap)
    end, out, err, _ = h.run(sb2, "cat /srv/app/written /srv/app/marker.txt")
    assert out.decode() == "from-g\n" + MARKER, (out, err)
    assert (h.data_dir / "snapshots" / f"{snap}.seal").exists()
    assert h.request("GET", "/snapshots").json()[0]["snapshotID"] == snap
    pulls = h.request("GET", "/events?kind=snapshot.pull").json()
    assert [p["detail"]["snapshot"] for p in pulls] == [snap], pulls
    # a second create finds it here
    h.create(templateID=snap)
    assert h.log_tail(20000).count("pulling " + f"{w.reg.host}/hutch/snapshots:{snap}") == 1

    # I has another key: a clear 422, nothing of it left
    r = i.request("POST", "/v2/sandboxes", {"templateID": snap}, timeout=60)
    assert r.status == 422 and "secrets.key" in r.json()["message"], r
    assert not (i.data_dir / "snapshots" / f"{snap}.seal").exists()
    assert not [p for p in (i.data_dir / "snapshots").iterdir() if p.name.startswith(".pull")]

    # another team (a key of a team named otherwise): not found, on H (which
    # has the row, the default team's) as on a node that has to ask
    r = h.request("POST", "/v2/sandboxes", {"templateID": snap}, key=other_key, timeout=60)
    assert r.status == 404, r
    j = w.node("node-j", extra=("--node-id", "snpj", "--keys-file", str(w.root / "keys-h")))
    r = j.request("POST", "/v2/sandboxes", {"templateID": snap}, key=other_key, timeout=60)
    assert r.status == 404 and r.json()["message"] == f"template '{snap}' not found", r
    assert not list((j.data_dir / "snapshots").glob(snap + "*"))
    # a snapshot the registry never had: not found
    r = h.request("POST", "/v2/sandboxes", {"templateID": "snap_snpg" + "0" * 16}, timeout=60)
    assert r.status == 404, r

    # deleted on its node: a tombstone replaces it in the registry, so no
    # node restores it any more, its own node included
    r = g.request("DELETE", f"/templates/{snap}")
    assert r.status == 204, r
    r = g.request("POST", "/v2/sandboxes", {"templateID": snap}, timeout=60)
    assert r.status == 404, r
    deadline = time.monotonic() + 60
    while f"snapshot {snap} marked deleted" not in g.log_tail(20000):
        assert time.monotonic() < deadline, g.log_tail()
        time.sleep(0.2)
    assert not (g.data_dir / "snapshots" / f"{snap}.deleted").exists()
    r = g.request("POST", "/v2/sandboxes", {"templateID": snap}, timeout=60)
    assert r.status == 404, r
    kd = w.root / "node-k"
    kd.mkdir()
    (kd / "secrets.key").write_bytes(key)
    (kd / "secrets.key").chmod(0o600)
    k = w.node("node-k", extra=("--node-id", "snpk"))
    r = k.request("POST", "/v2/sandboxes", {"templateID": snap}, timeout=60)
    assert r.status == 404, r
