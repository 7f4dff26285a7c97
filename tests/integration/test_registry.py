"""`hutch template pull` against a real registry (Debian's docker-registry, the
CNCF distribution server) in a network namespace this module creates, with
images built by umoci and pushed by skopeo; and against a facade
(tests/helpers/registry_facade.py) for the bearer-token flow, redirects to
another host, and a registry that lies.

The network namespace has only lo: 127.0.0.1 serves
  :5000  docker-registry, plain HTTP (marked insecure in registries.conf)
  :5443  docker-registry, HTTPS with a test CA, htpasswd basic auth
         (the same storage: what is pushed to :5000 is there too)
  :5001  docker-registry, plain HTTP, distribution's bearer-token auth
         (auth.token), its tokens from :5002 (tests/helpers/registry_token.py)
  :5080  the facade (HTTP, bearer tokens) in front of :5000, and
         127.0.0.2:5081 the "blob storage" its redirects point to.
Nothing leaves the namespace; `hutch template pull` runs in it (nsenter),
`hutch run` outside (a sandbox needs no registry).
"""

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hutchtest

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
sys.path.insert(0, str(HELPERS))
import ociimage  # noqa: E402

TOOLS = ("docker-registry", "skopeo", "umoci", "htpasswd", "openssl", "ip", "nsenter")
missing = [t for t in TOOLS if not shutil.which(t)]
if missing:
    pytest.fail("test_registry needs " + ", ".join(missing) + " (scripts/deps.sh test)",
                pytrace=False)

PASSWORD = "pw-" + secrets.token_hex(12)
USER = "alice"


def sh(argv, **kw):
    kw.setdefault("timeout", 120)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    cp = subprocess.run(argv, **kw)
    if cp.returncode != 0:
        raise AssertionError(f"{argv} failed ({cp.returncode}): {cp.stderr[-2000:]}")
    return cp


def wait_port(ns, host, port, deadline=15):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        cp = subprocess.run(["nsenter", f"--net={ns}", sys.executable, "-c",
                             f"import socket; socket.create_connection(('{host}', {port}), 1)"],
                            capture_output=True, timeout=10)
        if cp.returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"{host}:{port} never listened")


class World:
    def __init__(self, root: Path):
        self.root = root
        self.name = "hxr" + secrets.token_hex(3)
        self.ns = f"/run/netns/{self.name}"
        self.procs = []

    def start(self):
        sh(["ip", "netns", "add", self.name])
        sh(["ip", "-n", self.name, "link", "set", "lo", "up"])
        r = self.root
        hutchtest.make_test_ca(r)
        cp = sh(["htpasswd", "-Bbn", USER, PASSWORD])
        (r / "htpasswd").write_text(cp.stdout)
        store = r / "store"
        common = f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {store}\n"
        (r / "plain.yml").write_text(common + "http:\n  addr: 127.0.0.1:5000\n")
        (r / "tls.yml").write_text(
            common + "http:\n  addr: 127.0.0.1:5443\n  tls:\n"
            f"    certificate: {r / 'leaf.pem'}\n    key: {r / 'leaf.key'}\n"
            f"auth:\n  htpasswd:\n    realm: hutch-test\n    path: {r / 'htpasswd'}\n")
        # :5001, the same storage behind distribution's own bearer-token auth
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(r / "token.key"), "-out", str(r / "token.pem"), "-days", "2",
            "-subj", "/CN=hutch test token issuer"])
        (r / "token.yml").write_text(
            common + "http:\n  addr: 127.0.0.1:5001\n"
            "auth:\n  token:\n    realm: http://127.0.0.1:5002/token\n    service: hutch-test\n"
            f"    issuer: hutch-test-issuer\n    rootcertbundle: {r / 'token.pem'}\n")
        (r / "facade").mkdir()
        self.spawn([sys.executable, str(HELPERS / "registry_token.py"), "5002", str(r / "token.key"),
                    str(r / "token.pem"), str(r / "facade")])
        for cfg in ("plain.yml", "tls.yml", "token.yml"):
            self.spawn(["docker-registry", "serve", str(r / cfg)])
        self.spawn([sys.executable, str(HELPERS / "registry_facade.py"), "5080", "http://127.0.0.1:5000",
                    str(r / "facade")])
        for host, port in (("127.0.0.1", 5000), ("127.0.0.1", 5443), ("127.0.0.1", 5080),
                           ("127.0.0.2", 5081), ("127.0.0.1", 5001), ("127.0.0.1", 5002)):
            wait_port(self.ns, host, port)

    def spawn(self, argv):
        log = open(self.root / (Path(argv[-1]).name + ".log"), "w")
        p = subprocess.Popen(["nsenter", f"--net={self.ns}"] + argv, stdout=log, stderr=log,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)

    def in_ns(self, argv):
        return ["nsenter", f"--net={self.ns}"] + argv

    def push(self, layout, ref, dest):
        sh(self.in_ns(["skopeo", "copy", "--all", "--dest-tls-verify=false", f"oci:{layout}:{ref}",
                       f"docker://127.0.0.1:5000/{dest}"]))

    def facade_mode(self, mode):
        (self.root / "facade" / "mode").write_text(mode)


def sh_rootfs(dst: Path, marker: str):
    """/bin/sh (the host's dash with its libraries) and a marker file."""
    sh_path = Path(os.path.realpath(shutil.which("sh")))
    files = {str(sh_path)}
    for line in sh(["ldd", str(sh_path)]).stdout.splitlines():
        for part in line.split():
            if part.startswith("/"):
                files.add(os.path.realpath(part) if "=>" not in part else part)
                files.add(part)
    for f in files:
        target = dst / f.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(f), target)
    (dst / "bin").mkdir(exist_ok=True)
    if not (dst / "bin" / "sh").exists():
        shutil.copy2(sh_path, dst / "bin" / "sh")
    (dst / "marker.txt").write_text(marker)


def umoci_image(root: Path, n_layers: int, blob_mib: int):
    """An OCI layout built with umoci, n_layers layers: the first /bin/sh, the
    others blob_mib MiB of random bytes each (incompressible)."""
    layout = root / "oci-multi"
    sh(["umoci", "init", "--layout", str(layout)])
    sh(["umoci", "new", "--image", f"{layout}:multi"])
    for i in range(n_layers):
        bundle = root / f"bundle{i}"
        sh(["umoci", "unpack", "--image", f"{layout}:multi", str(bundle)])
        rootfs = bundle / "rootfs"
        if i == 0:
            sh_rootfs(rootfs, "multi-layer image\n")
        else:
            (rootfs / f"data{i}.bin").write_bytes(os.urandom(blob_mib << 20))
        sh(["umoci", "repack", "--image", f"{layout}:multi", str(bundle)])
        shutil.rmtree(bundle)
    return layout


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    w = World(root)
    try:
        w.start()
        w.layout = umoci_image(root, 3, 2)
        w.push(w.layout, "multi", "test/multi:1")
        w.push(w.layout, "multi", "library/debian:stable")   # Docker Hub's path, for the mirror case
        yield w
    finally:
        w.close()


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "registries.conf").write_text("insecure 127.0.0.1:5000 127.0.0.1:5080\n")
    return d


def pull(world, data, *args, stdin=None, timeout=120):
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    env.pop("HUTCH_REGISTRIES_CONF", None)
    return subprocess.run(world.in_ns([str(hutchtest.hutch_path()), "template", *args]), env=env,
                          capture_output=True, text=True, timeout=timeout, input=stdin)


def last_json(cp):
    lines = [json.loads(x) for x in cp.stdout.splitlines() if x.strip()]
    return lines[-1], lines


def template_json(data, name):
    return json.loads((data / "templates" / name / "template.json").read_text())


def all_files(d: Path):
    for p in d.rglob("*"):
        if p.is_file() and not p.is_symlink():
            yield p


def test_multi_layer_pull_runs_and_second_pull_downloads_nothing(world, data):
    cp = pull(world, data, "pull", "--json", "127.0.0.1:5000/test/multi:1", "--name", "multi")
    assert cp.returncode == 0, cp.stderr
    res, lines = last_json(cp)
    assert res["phase"] == "pulled" and res["name"] == "multi" and res["layers"] == 3
    assert res["layers_present"] == 0 and res["blobs_downloaded"] == 4   # 3 layers + config
    assert res["bytes_downloaded"] > 4 << 20
    assert res["source"].startswith("127.0.0.1:5000/test/multi:1@sha256:")
    assert any(x["phase"] == "download" for x in lines)
    tj = template_json(data, "multi")
    assert len(tj["layers"]) == 3 and tj["source"] == res["source"]
    # no compressed layer stays behind, no partial download
    blobs = data / "images" / "blobs" / "sha256"
    assert not list(blobs.glob("*.partial"))
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    run = subprocess.run([str(hutchtest.hutch_path()), "run", "--template", "multi", "--", "/bin/sh", "-c",
                          "read -r l < /marker.txt; echo \"$l\"; for f in /data1.bin /data2.bin; do [ -s $f ] && echo $f; done"],
                         env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    # the bottom layer's file and each upper layer's: all three layers stacked
    assert run.stdout.splitlines() == ["multi-layer image", "/data1.bin", "/data2.bin"]

    again = pull(world, data, "pull", "--json", "127.0.0.1:5000/test/multi:1", "--name", "multi2")
    assert again.returncode == 0, again.stderr
    res2, lines2 = last_json(again)
    assert res2["blobs_downloaded"] == 0 and res2["bytes_downloaded"] == 0, res2
    assert res2["layers_present"] == 3
    assert not any(x["phase"] == "download" for x in lines2)


def test_two_pulls_of_one_image_at_once(world, data):
    # the same blobs: one downloads each (its .partial is flocked), the other
    # waits for it and takes the blob, or finds the layer unpacked
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    ps = [subprocess.Popen(world.in_ns([str(hutchtest.hutch_path()), "template", "pull", "--parallel", "1",
                                        "127.0.0.1:5000/test/multi:1", "--name", f"twin{i}"]),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(2)]
    outs = [p.communicate(timeout=120) for p in ps]
    for p, (out, errout) in zip(ps, outs):
        assert p.returncode == 0, errout
    assert template_json(data, "twin0")["layers"] == template_json(data, "twin1")["layers"]
    assert not list((data / "images" / "blobs" / "sha256").glob("*.partial"))


def test_a_blob_another_pull_is_downloading_is_waited_for(world, data):
    import fcntl
    man = json.loads(sh(world.in_ns(["curl", "-sf", "-H", "Accept: application/vnd.oci.image.manifest.v1+json",
                                     "http://127.0.0.1:5000/v2/test/multi/manifests/1"])).stdout)
    digest = man["layers"][-1]["digest"]
    blobs = data / "images" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    partial = blobs / (digest[7:] + ".partial")
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)   # "another pull" holds this download
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    p = subprocess.Popen(world.in_ns([str(hutchtest.hutch_path()), "template", "pull",
                                      "127.0.0.1:5000/test/multi:1", "--name", "waiter"]),
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        assert p.poll() is None, p.communicate()   # it waits, rather than racing the holder
    finally:
        os.close(fd)   # the holder went away without finishing
    out, errout = p.communicate(timeout=60)
    assert p.returncode == 0, errout
    assert not partial.exists()


def test_short_name_through_a_mirror(world, data):
    # A site without Docker Hub: debian:stable comes from the mirror; Docker Hub
    # itself is unreachable in this namespace (no DNS, no route).
    (data / "registries.conf").write_text("mirror docker.io 127.0.0.1:5000\ninsecure 127.0.0.1:5000\n")
    cp = pull(world, data, "pull", "--json", "debian:stable")
    assert cp.returncode == 0, cp.stderr
    res, _ = last_json(cp)
    assert res["name"] == "debian-stable" and res["host"] == "127.0.0.1:5000"
    assert res["source"].startswith("docker.io/library/debian:stable@sha256:")
    # the same file through the flag, with an unqualified-search list instead
    conf = data / "other.conf"
    conf.write_text("search 127.0.0.1:5000\ninsecure 127.0.0.1:5000\n")
    (data / "registries.conf").unlink()
    cp = pull(world, data, "pull", "--registries-conf", str(conf), "test/multi:1", "--name", "viasearch")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "viasearch"
    # without a mirror, the short name goes to Docker Hub, which is not there
    cp = pull(world, data, "pull", "debian:stable", "--name", "nohub")
    assert cp.returncode == 125 and "registry-1.docker.io" in cp.stderr, cp.stderr
    assert not (data / "templates" / "nohub").exists()


def test_index_selects_the_host_platform(world, data, tmp_path):
    layout = tmp_path / "oci-index"
    arch_layers = {}
    manifests = []
    for arch in ("arm64", "amd64", "riscv64"):
        tar = ociimage.make_tar([ociimage.file_entry("arch.txt", arch.encode())])
        sub = tmp_path / f"l-{arch}"
        m = ociimage.write_oci_layout(str(sub), [tar], arch=arch)
        arch_layers[arch] = ociimage.sha(tar)
        manifests.append((arch, sub, m))
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    descs = []
    for arch, sub, m in manifests:
        for b in (sub / "blobs" / "sha256").iterdir():
            shutil.copy(b, blobs / b.name)
        mb = json.dumps(m).encode()
        (blobs / hashlib.sha256(mb).hexdigest()).write_bytes(mb)
        descs.append({"mediaType": m["mediaType"], "digest": ociimage.sha(mb), "size": len(mb),
                      "platform": {"os": "linux", "architecture": arch}})
    ib = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                     "manifests": descs}).encode()
    (blobs / hashlib.sha256(ib).hexdigest()).write_bytes(ib)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": ociimage.sha(ib),
            "size": len(ib), "annotations": {"org.opencontainers.image.ref.name": "multiarch"}}]}))
    world.push(layout, "multiarch", "test/multiarch:1")
    cp = pull(world, data, "pull", "--json", "127.0.0.1:5000/test/multiarch:1", "--name", "multiarch")
    assert cp.returncode == 0, cp.stderr
    host = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]
    tj = template_json(data, "multiarch")
    assert tj["layers"] == [arch_layers[host]]
    res, _ = last_json(cp)
    # the source names the index (what the tag points to)
    assert res["source"].endswith(ociimage.sha(ib))
    # an index without this host's platform: refused, saying so
    other = [d for d in descs if d["platform"]["architecture"] == "riscv64"]
    ob = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                     "manifests": other}).encode()
    (blobs / hashlib.sha256(ob).hexdigest()).write_bytes(ob)
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": ociimage.sha(ob),
            "size": len(ob), "annotations": {"org.opencontainers.image.ref.name": "riscv"}}]}))
    world.push(layout, "riscv", "test/multiarch:riscv")
    cp = pull(world, data, "pull", "127.0.0.1:5000/test/multiarch:riscv", "--name", "riscv")
    assert cp.returncode == 125 and "no manifest for linux/" in cp.stderr, cp.stderr
    assert not (data / "templates" / "riscv").exists()


def test_https_basic_auth_login_and_credentials_stay_put(world, data):
    ref = "127.0.0.1:5443/test/multi:1"
    ca = str(world.root / "ca.pem")
    # the test CA is not the system's: refused, with what to do
    cp = pull(world, data, "pull", ref, "--name", "tls")
    assert cp.returncode == 125 and "TLS" in cp.stderr and "ca-file" in cp.stderr, cp.stderr
    # trusted, but no credentials: 401 and the login hint
    cp = pull(world, data, "pull", "--ca-file", ca, ref, "--name", "tls")
    assert cp.returncode == 125, cp.stderr
    assert "401" in cp.stderr and "hutch template login 127.0.0.1:5443" in cp.stderr, cp.stderr
    # wrong password: refused, and said so
    cp = pull(world, data, "login", "--username", USER, "127.0.0.1:5443", stdin="wrong\n")
    assert cp.returncode == 0, cp.stderr
    cp = pull(world, data, "pull", "--ca-file", ca, ref, "--name", "tls")
    assert cp.returncode == 125 and "credentials" in cp.stderr, cp.stderr
    # the right one, from stdin
    cp = pull(world, data, "login", "--username", USER, "127.0.0.1:5443", stdin=PASSWORD + "\n")
    assert cp.returncode == 0, cp.stderr
    auth = data / "registries.auth"
    assert (auth.stat().st_mode & 0o777) == 0o600
    (data / "registries.conf").write_text(f"ca 127.0.0.1:5443 {ca}\n")   # the per-host CA line
    cp = pull(world, data, "pull", "--json", ref, "--name", "tls")
    assert cp.returncode == 0, cp.stderr
    assert template_json(data, "tls")["source"].startswith(ref + "@sha256:")
    # the password is in registries.auth (base64) and nowhere else: not in a
    # template, a layer, the output; never on a command line (stdin only)
    import base64
    needles = [PASSWORD.encode(), base64.b64encode(f"{USER}:{PASSWORD}".encode())]
    for f in all_files(data):
        if f == auth:
            continue
        blob = f.read_bytes()
        for n in needles:
            assert n not in blob, f
    for n in needles:
        assert n.decode() not in cp.stdout + cp.stderr
    # --remove forgets them
    cp = pull(world, data, "login", "--remove", "127.0.0.1:5443")
    assert cp.returncode == 0 and PASSWORD not in auth.read_text()


def test_bearer_token_flow_of_the_real_registry(world, data):
    (data / "registries.conf").write_text("insecure 127.0.0.1:5001\n")
    log = world.root / "facade" / "token-requests.log"
    log.unlink(missing_ok=True)
    cp = pull(world, data, "pull", "--json", "127.0.0.1:5001/test/multi:1", "--name", "tokened")
    assert cp.returncode == 0, cp.stderr
    reqs = [json.loads(x) for x in log.read_text().splitlines()]
    assert reqs, "no token was asked for"
    q = dict(x.split("=", 1) for x in reqs[0]["query"].split("&"))
    assert q["service"] == "hutch-test" and q["scope"] == "repository%3Atest%2Fmulti%3Apull", q
    assert all(r["auth"] is None for r in reqs)   # anonymous: no credentials for this host
    assert last_json(cp)[0]["blobs_downloaded"] == 4
    # logged in: the credentials go to the token realm, as basic auth
    cp = pull(world, data, "login", "--username", USER, "127.0.0.1:5001", stdin=PASSWORD + "\n")
    assert cp.returncode == 0, cp.stderr
    log.unlink()
    cp = pull(world, data, "pull", "127.0.0.1:5001/test/multi:1", "--name", "tokened2")
    assert cp.returncode == 0, cp.stderr
    import base64
    want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert [json.loads(x)["auth"] for x in log.read_text().splitlines()] == [want]


def test_bearer_token_and_redirect_drops_authorization(world, data):
    facade = world.root / "facade"
    token = "tok-" + secrets.token_hex(8)
    (facade / "token").write_text(token)
    for log in ("facade-auth.log", "storage-auth.log"):
        (facade / log).unlink(missing_ok=True)
    world.facade_mode("redirect")
    cp = pull(world, data, "pull", "--json", "127.0.0.1:5080/test/multi:1", "--name", "viatoken")
    assert cp.returncode == 0, cp.stderr
    assert f"Bearer {token}" in (facade / "facade-auth.log").read_text()
    storage = (facade / "storage-auth.log").read_text().splitlines()
    assert len(storage) >= 4, storage   # config + 3 layers came from the other host
    assert all(x == "auth=<none>" for x in storage), storage   # and never with the token


def test_a_token_that_expires_mid_pull_is_renewed(world, data):
    facade = world.root / "facade"
    token = "tok-" + secrets.token_hex(8)
    (facade / "token").write_text(token)
    (facade / "blobcount").unlink(missing_ok=True)
    (facade / "facade-auth.log").unlink(missing_ok=True)
    world.facade_mode("expire")
    try:
        cp = pull(world, data, "pull", "--parallel", "4", "127.0.0.1:5080/test/multi:1", "--name", "renewed")
    finally:
        world.facade_mode("ok")
    assert cp.returncode == 0, cp.stderr
    seen = set((facade / "facade-auth.log").read_text().splitlines())
    assert seen == {f"Bearer {token}", f"Bearer {token}-renewed"}, seen


@pytest.mark.parametrize("mode,words", [("corrupt", "digest mismatch"), ("oversize", "stopped"),
                                        ("hugemanifest", "larger than 4194304 bytes"),
                                        ("badtoken", "no usable token")])
def test_a_lying_registry_is_refused(world, data, mode, words):
    world.facade_mode(mode)
    try:
        cp = pull(world, data, "pull", "--json", "127.0.0.1:5080/test/multi:1", "--name", "liar")
    finally:
        world.facade_mode("ok")
    assert cp.returncode == 125, cp.stderr
    assert words in cp.stderr, cp.stderr
    res, _ = last_json(cp)
    assert res["phase"] == "error"
    assert not (data / "templates" / "liar").exists()
    blobs = data / "images" / "blobs" / "sha256"
    # nothing unverified became a blob: every cached file is what its name says
    for f in (blobs.iterdir() if blobs.is_dir() else ()):
        if not f.name.endswith(".partial"):
            assert hashlib.sha256(f.read_bytes()).hexdigest() == f.name


def test_configured_only_refuses_unlisted_registries(world, data):
    # what hutch serve does for a client's reference: only hosts the file names
    (data / "registries.conf").write_text("insecure 127.0.0.1:5000 127.0.0.1:5080\n")
    cp = pull(world, data, "pull", "--configured-only", "--json", "127.0.0.1:5000/test/multi:1", "--name", "r")
    assert cp.returncode == 125 and "does not list" in cp.stderr, cp.stderr
    assert last_json(cp)[0]["error"] == "not_allowed"
    assert not (data / "templates" / "r").exists()
    (data / "registries.conf").write_text("insecure 127.0.0.1:5000\nallow 127.0.0.1:5000\n")
    cp = pull(world, data, "pull", "--configured-only", "127.0.0.1:5000/test/multi:1", "--name", "r")
    assert cp.returncode == 0, cp.stderr


def test_404_and_bad_reference(world, data):
    cp = pull(world, data, "pull", "127.0.0.1:5000/test/nope:1")
    assert cp.returncode == 125 and "manifest unknown" in cp.stderr and "404" in cp.stderr, cp.stderr
    cp = pull(world, data, "pull", "127.0.0.1:5000/Test/Upper:1")
    assert cp.returncode == 2 and "lower case" in cp.stderr, cp.stderr
    cp = pull(world, data, "pull", "127.0.0.1:9/test/multi:1")
    assert cp.returncode == 125 and "cannot connect" in cp.stderr, cp.stderr
    assert not (data / "templates").exists() or not any((data / "templates").glob("nope*"))


def kill_mid_pull(world, data, name):
    """Start a pull through the slow facade, kill -9 it once a download has bytes."""
    world.facade_mode("slow")
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    p = subprocess.Popen(world.in_ns([str(hutchtest.hutch_path()), "template", "pull",
                                      "127.0.0.1:5080/test/multi:1", "--name", name]),
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blobs = data / "images" / "blobs" / "sha256"
    try:
        hutchtest.wait_until(lambda: any(f.stat().st_size > 0 for f in blobs.glob("*.partial"))
                             if blobs.is_dir() else False, timeout=30)
    finally:
        p.send_signal(signal.SIGKILL)   # nsenter execs hutch: this is the pull itself
        p.wait(timeout=10)
        world.facade_mode("ok")
    assert p.returncode == -signal.SIGKILL
    assert list(blobs.glob("*.partial"))
    assert not (data / "templates" / name).exists()
    return blobs


def test_kill9_mid_pull_then_gc_or_resume(world, data):
    env = dict(os.environ, HUTCH_DATA_DIR=str(data))
    blobs = kill_mid_pull(world, data, "killed")
    cp = subprocess.run([str(hutchtest.hutch_path()), "gc"], env=env, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "interrupted download" in cp.stdout
    assert not list(blobs.glob("*.partial"))
    assert not (data / "templates" / "killed").exists()
    # killed again: the next pull resumes the partial blob (a Range request)
    # and completes, verified as a whole
    ranges = world.root / "facade" / "ranges.log"
    ranges.unlink(missing_ok=True)
    kill_mid_pull(world, data, "killed")
    cp = pull(world, data, "pull", "127.0.0.1:5080/test/multi:1", "--name", "killed")
    assert cp.returncode == 0, cp.stderr
    assert any(line.startswith("bytes=") and not line.startswith("bytes=0-")
               for line in ranges.read_text().splitlines()), ranges.read_text()
    assert not list(blobs.glob("*.partial"))
    assert (data / "templates" / "killed" / "template.json").is_file()


def test_kill9_mid_pull_then_daemon_start_cleans(world, data):
    """The next `hutch serve` start removes what the killed pull left (its
    housekeeping at start)."""
    from serveclient import ServeDaemon
    blobs = kill_mid_pull(world, data, "killed-d")
    d = ServeDaemon(hutchtest.hutch_path(), data, extra_args=["--pool-size", "0"])
    d.start()
    try:
        assert hutchtest.wait_until(lambda: not list(blobs.glob("*.partial")), timeout=20), \
            list(blobs.glob("*.partial"))
    finally:
        d.stop()
    assert "interrupted download" in d.log_path.read_text()
    assert not (data / "templates" / "killed-d").exists()
