"""A build's own registry credentials, fromImageRegistry (docs/templates.md
"Credentials", docs/security.md "Registries and pulls"): a private image on a
real docker-registry with htpasswd basic auth is pulled with the build's
`registry` credentials and with `gcp` ones (user `_json_key`, the key's JSON
as the password); wrong ones fail the build with the registry's refusal and
without the password; another team's build of the same reference without
credentials fails (nothing of the first pull serves it); malformed objects
are 400s; and the secrets are nowhere in the data dir, the daemon's log, the
build log or the audit trail afterwards."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from serveclient import ServeDaemon

from .test_registry import umoci_image

missing = [t for t in ("docker-registry", "skopeo", "umoci", "htpasswd") if not shutil.which(t)]
pytestmark = pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")

USER = "alice"
PASSWORD = "pw-" + secrets.token_hex(12)
# bcrypt (the only hash docker-registry takes) reads 72 bytes, and htpasswd
# takes no longer password: the hash is of the key's first 72 bytes (which
# hold project_id, where the wrong key differs), the client sends it whole
GCP_SECRET = secrets.token_hex(32)
GCP_KEY = json.dumps({
    "type": "service_account", "project_id": "hutch-" + secrets.token_hex(8),
    "private_key_id": secrets.token_hex(20),
    "private_key": "-----BEGIN PRIVATE KEY-----\n" + GCP_SECRET + "\n-----END PRIVATE KEY-----\n",
    "client_email": "builder@hutch-test.iam.gserviceaccount.com", "client_id": "1",
})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_registry(root: Path, auth: str = "") -> tuple[subprocess.Popen, str]:
    """docker-registry on the host's loopback, plain HTTP, its store and
    log under root; auth: the config's auth section, if any."""
    port = free_port()
    (root / "reg.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {root / 'store'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n" + auth)
    log = open(root / "registry.log", "w")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "reg.yml")], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                proc.terminate()
                proc.wait(10)
                raise AssertionError("docker-registry did not start")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry on the host's loopback, plain HTTP, htpasswd basic
    auth (alice, and _json_key for the gcp type), holding 'private/sh:1'."""
    root = tmp_path_factory.mktemp("regcred")
    ht = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
    ht += subprocess.run(["htpasswd", "-Bbn", "_json_key", GCP_KEY[:72]], capture_output=True, text=True,
                         check=True).stdout
    (root / "htpasswd").write_text(ht)
    proc, addr = start_registry(root, f"auth:\n  htpasswd:\n    realm: hutch-regcred\n    path: {root / 'htpasswd'}\n")
    try:
        layout = umoci_image(root, 1, 0)
        subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", "--dest-creds", f"{USER}:{PASSWORD}",
                        f"oci:{layout}:multi", f"docker://{addr}/private/sh:1"],
                       check=True, capture_output=True, timeout=120)
        yield addr
    finally:
        proc.terminate()
        proc.wait(10)


def request_build(sd, name, key=None):
    r = sd.request("POST", "/v3/templates", {"name": name}, key=key)
    assert r.status == 202, r
    return r.json()["templateID"], r.json()["buildID"]


def build(sd, name, body, key=None, timeout=180):
    tid, bid = request_build(sd, name, key)
    r = sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", body, key=key)
    assert r.status == 202, r
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = sd.request("GET", f"/templates/{tid}/builds/{bid}/status?limit=100", key=key)
        assert r.status == 200, r
        st = r.json()
        if st["status"] in ("ready", "error"):
            st["templateID"] = tid
            return st
        time.sleep(0.2)
    raise AssertionError(f"build {bid} never ended")


def run_in(sd, sb, cmd, key=None):
    from serveclient import parse_frames, stdout_of
    r = sd.stream(sb, "process.Process/Start",
                  {"process": {"cmd": "/bin/sh", "args": ["-c", cmd], "cwd": "/"}, "stdin": False}, user="root")
    assert r.status == 200, r
    return stdout_of(parse_frames(r.body))


def test_build_credentials(sandboxed_hutch, registry, tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    sd.stop()
    (data / "registries.conf").write_text(f"insecure {registry}\nallow {registry}\n")
    ref = f"{registry}/private/sh:1"
    wrong = "wrong-" + secrets.token_hex(8)
    sd.start()
    seen = []   # every answer and log the API gave, searched for the secrets at the end
    try:
        cp = subprocess.run([str(sandboxed_hutch), "key", "create", "--team", "other", "--data-dir", str(data)],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, cp.stderr
        other = cp.stdout.strip()

        # malformed objects: 400 in E2B's error format, the secret not echoed
        tid, bid = request_build(sd, "badcreds")
        bad = [
            "not-an-object",
            {"username": USER, "password": PASSWORD},
            {"type": "docker", "username": USER, "password": PASSWORD},
            {"type": "registry", "username": USER},
            {"type": "registry", "password": PASSWORD},
            {"type": "registry", "username": f"{USER}:x", "password": PASSWORD},
            {"type": "registry", "username": USER, "password": ""},
            {"type": "registry", "username": USER, "password": "x" * (16 * 1024 + 1)},
            {"type": "gcp", "serviceAccountJson": PASSWORD},
            {"type": "gcp", "serviceAccountJson": json.dumps({"type": "service_account",
                                                              "client_email": "a@b", "x": PASSWORD})},
            {"type": "gcp", "serviceAccountJson": {"type": "service_account"}},
            {"type": "aws", "awsAccessKeyId": "AKIA", "awsSecretAccessKey": PASSWORD},
            {"type": "aws", "awsAccessKeyId": "AKIA", "awsSecretAccessKey": PASSWORD, "awsRegion": "Bad Region"},
        ]
        for creds in bad:
            r = sd.request("POST", f"/v2/templates/{tid}/builds/{bid}",
                           {"fromImage": ref, "steps": [], "fromImageRegistry": creds})
            assert r.status == 400, (creds, r)
            j = r.json()
            assert j["code"] == 400 and "fromImageRegistry" in j["message"], j
            seen.append(r.body)
        r = sd.request("POST", f"/v2/templates/{tid}/builds/{bid}",
                       {"fromTemplate": "base", "steps": [],
                        "fromImageRegistry": {"type": "registry", "username": USER, "password": PASSWORD}})
        assert r.status == 400 and "only for fromImage" in r.json()["message"], r
        # none of those started the build
        r = sd.request("GET", f"/templates/{tid}/builds/{bid}/status")
        assert r.json()["status"] == "waiting", r.json()

        step = {"type": "RUN", "args": ["read -r l < /marker.txt; echo \"built on: $l\" > /built.txt", "root"],
                "force": False}
        # without credentials: the registry's 401
        st = build(sd, "nocreds", {"fromImage": ref, "steps": [step]})
        seen.append(json.dumps(st).encode())
        assert st["status"] == "error" and st["reason"]["step"] == "base", st
        assert "401" in st["reason"]["message"], st

        # wrong credentials: the registry's refusal, named as the build's, never the password
        st = build(sd, "wrongcreds", {"fromImage": ref, "steps": [step], "fromImageRegistry":
                                      {"type": "registry", "username": USER, "password": wrong}})
        seen.append(json.dumps(st).encode())
        assert st["status"] == "error" and st["reason"]["step"] == "base", st
        assert f"{registry} refused" in st["reason"]["message"], st
        assert "the build's credentials (HTTP 401)" in st["reason"]["message"], st
        assert wrong not in json.dumps(st)

        # the right ones: pulled, built, and a sandbox of it starts on the image
        st = build(sd, "withcreds", {"fromImage": ref, "steps": [step], "fromImageRegistry":
                                     {"type": "registry", "username": USER, "password": PASSWORD}})
        seen.append(json.dumps(st).encode())
        assert st["status"] == "ready", st
        msgs = "\n".join(e["message"] for e in st["logEntries"])
        assert "with the build's credentials" in msgs and "[base] pulled" in msgs, msgs
        team_tpl = [m for m in msgs.split() if m.startswith("sh-1.team")]
        assert team_tpl, msgs
        sb = sd.create(templateID="withcreds")
        out = run_in(sd, sb, "read -r l < /built.txt; echo \"$l\"")
        assert out.startswith(b"built on: multi-layer image\n"), out
        sd.kill(sb["sandboxID"])

        # again: the registry is asked again (the credentials are checked
        # each time), and the unchanged image keeps its cached steps
        st = build(sd, "withcreds", {"fromImage": ref, "steps": [step], "fromImageRegistry":
                                     {"type": "registry", "username": USER, "password": PASSWORD}})
        assert st["status"] == "ready", st
        msgs = "\n".join(e["message"] for e in st["logEntries"])
        assert "[base] pulled" in msgs and "CACHED [builder 1/1]" in msgs, msgs

        # gcp: basic auth as _json_key with the key's JSON
        st = build(sd, "gcpcreds", {"fromImage": ref, "steps": [step], "fromImageRegistry":
                                    {"type": "gcp", "serviceAccountJson": GCP_KEY}})
        seen.append(json.dumps(st).encode())
        assert st["status"] == "ready", st
        wrong_key = json.loads(GCP_KEY)
        wrong_key["project_id"] = "other-" + secrets.token_hex(8)
        st = build(sd, "gcpwrong", {"fromImage": ref, "steps": [step], "fromImageRegistry":
                                    {"type": "gcp", "serviceAccountJson": json.dumps(wrong_key)}})
        assert st["status"] == "error" and "the build's credentials (HTTP 401)" in st["reason"]["message"], st

        # aws: the key goes to ECR only, for an ECR registry of its region
        # (no network here: the exchange itself is not reached)
        aws = {"type": "aws", "awsAccessKeyId": "AKIAEXAMPLE", "awsSecretAccessKey": PASSWORD,
               "awsRegion": "us-east-1"}
        st = build(sd, "awscreds", {"fromImage": ref, "steps": [], "fromImageRegistry": aws})
        seen.append(json.dumps(st).encode())
        assert st["status"] == "error" and "is not an Amazon ECR registry of region us-east-1" in \
            st["reason"]["message"], st
        st = build(sd, "awsunlisted", {"fromImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1",
                                       "steps": [], "fromImageRegistry": aws})
        seen.append(json.dumps(st).encode())
        assert st["status"] == "error" and "does not list" in st["reason"]["message"], st

        # another team, the same reference: nothing of team 1's pull serves it
        st = build(sd, "stolen", {"fromImage": ref, "steps": [step]}, key=other)
        assert st["status"] == "error" and "401" in st["reason"]["message"], st
        st = build(sd, "stolen2", {"fromImage": team_tpl[0], "steps": [step]}, key=other)
        assert st["status"] == "error", st
        st = build(sd, "stolen3", {"fromImage": ref, "steps": [step], "fromImageRegistry":
                                   {"type": "registry", "username": USER, "password": wrong}}, key=other)
        assert st["status"] == "error" and "the build's credentials (HTTP 401)" in st["reason"]["message"], st
        r = sd.request("POST", "/v2/sandboxes", {"templateID": team_tpl[0]}, key=other)
        assert r.status == 404, r
        # and team 1 without credentials neither: the registry is asked
        st = build(sd, "again-nocreds", {"fromImage": ref, "steps": [step]})
        assert st["status"] == "error" and "401" in st["reason"]["message"], st

        # the audit trail says that credentials were given, never what
        r = sd.request("GET", "/events?kind=template.build&limit=1000")
        assert r.status == 200, r
        seen.append(r.body)
        kinds = {e["detail"].get("credentials") for e in r.json()}
        assert {"registry", "gcp", "aws"} <= kinds, r.json()
        r = sd.request("GET", "/events?kind=template.pull&limit=1000")
        seen.append(r.body)
        assert any(e["detail"].get("credentials") is True for e in r.json()), r.json()
        r = sd.request("GET", "/metrics")
        seen.append(r.body)
    finally:
        sd.stop()

    secrets_bytes = [PASSWORD.encode(), wrong.encode(), base64.b64encode(f"{USER}:{PASSWORD}".encode()),
                     GCP_SECRET.encode(), json.loads(GCP_KEY)["private_key_id"].encode(),
                     base64.b64encode(f"_json_key:{GCP_KEY}".encode())[:40]]
    for blob in seen:
        for s in secrets_bytes:
            assert s not in blob
    files = [p for p in data.rglob("*") if p.is_file() and not p.is_symlink()] + [sd.log_path]
    assert len(files) > 10
    for p in files:
        b = p.read_bytes()
        for s in secrets_bytes:
            assert s not in b, (p, s)


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory):
    """A second docker-registry, without auth: where anyone may push."""
    root = tmp_path_factory.mktemp("openreg")
    proc, addr = start_registry(root)
    try:
        yield addr
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_private_layer_is_not_had_by_naming_it(sandboxed_hutch, registry, open_registry, tmp_path):
    """The layer store shares layers by diff_id. A layer that a pull with a
    build's credentials brought in is listed as that team's: another team's
    image that merely *names* its diff_id (a forged config, pushed where
    anyone may) must download its own blob, which does not uncompress to
    that layer: the pull is refused and nothing of the private layer is
    reached. The same layer really pulled from a public copy proves itself,
    and the layer is public from then on."""
    import ociimage as oi
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    sd.stop()
    (data / "registries.conf").write_text(
        f"insecure {registry}\nallow {registry}\ninsecure {open_registry}\nallow {open_registry}\n")
    sd.start()
    try:
        cp = subprocess.run([str(sandboxed_hutch), "key", "create", "--team", "other", "--data-dir", str(data)],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert cp.returncode == 0, cp.stderr
        other = cp.stdout.strip()
        st = build(sd, "mine", {"fromImage": f"{registry}/private/sh:1", "steps": [], "fromImageRegistry":
                                {"type": "registry", "username": USER, "password": PASSWORD}})
        assert st["status"] == "ready", st
        store = data / "layers" / "sha256"
        private = [p.name[:64] for p in store.glob("*.teams")]
        assert private and all((store / h).is_dir() for h in private), list(store.iterdir())
        secret = private[0]

        # the forgery: a config that names the private diff_id over a blob of other bytes
        lay = tmp_path / "forged"
        decoy = oi.make_tar([oi.dir_entry("bin"), oi.file_entry("bin/not-it", b"decoy\n")])
        oi.write_oci_layout(lay, [decoy], ref="forged:1",
                            config_override=oi.image_config(["sha256:" + secret]))
        subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{lay}:forged:1",
                        f"docker://{open_registry}/forged/sh:1"], check=True, capture_output=True, timeout=120)
        st = build(sd, "stolen", {"fromImage": f"{open_registry}/forged/sh:1", "steps": []}, key=other)
        assert st["status"] == "error", st
        assert "not the layer the store holds" in st["reason"]["message"], st
        r = sd.request("POST", "/v2/sandboxes", {"templateID": "forged-sh-1"}, key=other)
        assert r.status == 404, r
        assert (store / f"{secret}.teams").exists()

        # a public copy of the real image: the other team downloads it, it proves
        # itself, and the layer is nobody's secret any more
        subprocess.run(["skopeo", "copy", "--src-tls-verify=false", "--src-creds", f"{USER}:{PASSWORD}",
                        "--dest-tls-verify=false", f"docker://{registry}/private/sh:1",
                        f"docker://{open_registry}/public/sh:1"], check=True, capture_output=True, timeout=120)
        st = build(sd, "copied", {"fromImage": f"{open_registry}/public/sh:1", "steps": []}, key=other)
        assert st["status"] == "ready", st
        assert not (store / f"{secret}.teams").exists()
    finally:
        assert sd.stop() == []
