"""Template builds on the wire (docs/templates.md "Building", docs/api.md
"Templates"): the status codes and bodies the SDK relies on, the upload
link's refusals, and a daemon killed during a build. The SDK flow itself is
tested in tests/e2b/template.test.mjs."""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import tarfile
import time
import urllib.parse
from pathlib import Path

from hutchtest import wait_until
from serveclient import ServeDaemon
from layercheck import assert_nothing_left, mounts_naming, sandbox_processes, tree_digest

from .test_images import needs_runsc


def tar_of(files: dict, gz: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw) if gz else raw


def request_build(sd, name):
    r = sd.request("POST", "/v3/templates", {"name": name})
    assert r.status == 202, r
    return r.json()


def wait_status(sd, tid, bid, want, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = sd.request("GET", f"/templates/{tid}/builds/{bid}/status")
        assert r.status == 200, r
        if r.json()["status"] in want:
            return r.json()
        time.sleep(0.1)
    raise AssertionError(f"build {bid} never reached {want}")


def test_protocol_codes_and_upload_link(sandboxed_hutch, tmp_path):
    tmp_path.chmod(0o755)
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0"])
    sd.start()
    try:
        # names: the grammar, the team's namespace, tags and the default tag
        assert sd.request("POST", "/v3/templates", {}).status == 400
        assert sd.request("POST", "/v3/templates", {"name": "Bad Name!"}).status == 400
        assert sd.request("POST", "/v3/templates", {"name": "other-team/x"}).status == 400
        assert sd.request("POST", "/v3/templates", {"name": "x", "cpuCount": 0}).status == 400
        assert sd.request("POST", "/v3/templates", {"name": "x", "memoryMB": 64}).status == 400
        r = sd.request("POST", "/v3/templates", {"name": "default/my-tpl:v1", "tags": ["stable", "v1"]})
        assert r.status == 202, r
        b = r.json()
        assert b["tags"] == ["v1", "stable"] and b["names"] == ["default/my-tpl"] and b["aliases"] == ["my-tpl"]
        assert b["public"] is False
        tid, bid = b["templateID"], b["buildID"]
        r = sd.request("POST", "/v3/templates", {"name": "my-tpl", "cpuCount": 1, "memoryMB": 256})
        assert r.status == 202, r
        again = r.json()
        assert again["templateID"] == tid and again["tags"] == ["default"]
        # the older build, never triggered, is superseded
        st = sd.request("GET", f"/templates/{tid}/builds/{bid}/status").json()
        assert st["status"] == "error" and "superseded" in st["reason"]["message"]
        assert st["logs"] == [] and st["logEntries"] == []

        # file probe: 400 for a bad hash, 404 for someone else's template, 201 with a url
        assert sd.request("GET", f"/templates/{tid}/files/nothex").status == 400
        assert sd.request("GET", f"/templates/{'a' * 20}/files/{'0' * 64}").status == 404
        h = "ab" * 32
        r = sd.request("GET", f"/templates/{tid}/files/{h}")
        assert r.status == 201 and r.json()["present"] is False, r
        url = urllib.parse.urlsplit(r.json()["url"])
        assert url.netloc == f"127.0.0.1:{sd.port}" and url.path == f"/upload/{tid}/{h}"
        path = url.path + "?" + url.query
        arch = tar_of({"a.txt": b"hello"})
        files_dir = tmp_path / "data" / "builds" / "files" / tid

        # the link authorises itself: a changed token, hash or expiry is refused
        q = urllib.parse.parse_qs(url.query)
        bad_tok = f"{url.path}?expires={q['expires'][0]}&token={'0' * 64}"
        assert sd.request("PUT", bad_tok, arch, key="").status == 401
        other = f"/upload/{tid}/{'cd' * 32}?{url.query}"
        assert sd.request("PUT", other, arch, key="").status == 401
        later = f"{url.path}?expires={int(q['expires'][0]) + 1}&token={q['token'][0]}"
        assert sd.request("PUT", later, arch, key="").status == 401
        # not an archive: refused, nothing left behind
        r = sd.request("PUT", path, b"just some bytes, not a tar", key="")
        assert r.status == 400, r
        assert not files_dir.exists() or list(files_dir.iterdir()) == []
        # gzip and plain tar are accepted, 200 with Content-Length: 0
        r = sd.request("PUT", path, arch, key="")
        assert r.status == 200 and r.header("content-length") == "0", r
        assert (files_dir / h).read_bytes() == arch
        r = sd.request("GET", f"/templates/{tid}/files/{h}")
        assert r.json()["present"] is True and r.json()["url"]
        plain = "ef" * 32
        r = sd.request("GET", f"/templates/{tid}/files/{plain}")
        u2 = urllib.parse.urlsplit(r.json()["url"])
        assert sd.request("PUT", u2.path + "?" + u2.query, tar_of({"b": b"x"}, gz=False), key="").status == 200

        # trigger: 400 for a non-UUID, 404 unknown, 400 bad steps, 202 with Content-Length: 0, 400 twice
        bid2 = again["buildID"]
        assert sd.request("POST", f"/v2/templates/{tid}/builds/not-a-uuid", {"fromTemplate": "base"}).status == 400
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{'0' * 8}-0000-4000-8000-{'0' * 12}",
                          {"fromTemplate": "base"}).status == 404
        bad = {"fromTemplate": "base", "steps": [{"type": "EXPLODE", "args": []}]}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid2}", bad).status == 400
        ok = {"fromTemplate": "base", "steps": [
            {"type": "COPY", "args": ["a.txt", "/opt/a.txt", "", ""], "force": False, "filesHash": h},
            {"type": "RUN", "args": ["cat /opt/a.txt"], "force": False}]}
        r = sd.request("POST", f"/v2/templates/{tid}/builds/{bid2}", ok)
        assert r.status == 202 and r.header("content-length") == "0" and r.body == b"", r
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid2}", ok).status == 400
        st = wait_status(sd, tid, bid2, ("ready", "error"))
        assert st["status"] == "ready", st
        msgs = [e["message"] for e in st["logEntries"]]
        assert "[builder 2/2] [stdout]: hello" in msgs, msgs
        assert all(e["step"] in ("base", "1", "2", "finalize") for e in st["logEntries"])
        # paging over the level-filtered log
        info = sd.request("GET", f"/templates/{tid}/builds/{bid2}/status?level=info").json()["logEntries"]
        page = sd.request("GET", f"/templates/{tid}/builds/{bid2}/status?level=info&logsOffset=1&limit=2").json()
        assert page["logEntries"] == info[1:3]
        assert sd.request("GET", f"/templates/{tid}/builds/{bid2}/status?limit=101").status == 400

        # aliases, list, get, delete; sandbox create by name
        assert sd.request("GET", "/templates/aliases/my-tpl").json() == {"templateID": tid, "public": False}
        assert sd.request("GET", "/templates/aliases/my-tpl%3Anope").status == 404
        assert sd.request("GET", "/templates/aliases/nobody").status == 404
        # the templates a create starts without a build exist, as E2B's public ones
        for name in ("base", "host"):
            assert sd.request("GET", f"/templates/aliases/{name}").json() == {"templateID": name, "public": True}
        assert sd.request("GET", "/templates/aliases/base%3Av1").status == 404
        lst = sd.request("GET", "/templates").json()
        assert [t["templateID"] for t in lst] == [tid] and lst[0]["buildID"] == bid2
        for ref in ("default/my-tpl", "my-tpl:default", tid):
            sb = sd.create(templateID=ref)
            assert sb["templateID"] == tid and sb["alias"] == "my-tpl", (ref, sb)
            sd.kill(sb["sandboxID"])
        assert sd.request("POST", "/v2/sandboxes", {"templateID": "my-tpl:v1"}).status == 404  # superseded, never built
        # (on gvisor: test_built_template_starts_gvisor_sandboxes below)
        layers = tmp_path / "data" / "builds" / "layers"
        assert any(p.suffix == ".layer" for p in layers.iterdir())
        assert sd.request("DELETE", f"/templates/{tid}").status == 204
        assert sd.request("GET", f"/templates/{tid}").status == 404
        assert not files_dir.exists()
        # its step cache goes with it (no other template used it)
        assert list(layers.iterdir()) == []
        assert sd.request("POST", "/v2/sandboxes", {"templateID": "my-tpl"}).status == 404

        # the audit trail has the build, how it ended and the delete
        # (docs/audit.md: template.build, template.build_end, template.delete)
        def tpl_events():
            r = sd.request("GET", "/events?kind=template.&limit=1000")
            assert r.status == 200, r
            return [e for e in r.json() if e["detail"].get("template") == tid]
        assert wait_until(lambda: len(tpl_events()) >= 3, 10), tpl_events()
        evs = tpl_events()
        kinds = [e["type"] for e in evs]
        assert kinds == ["template.build", "template.build_end", "template.delete"], evs
        start, end, gone = evs
        assert start["detail"] == {"template": tid, "build": bid2, "fromTemplate": "base", "steps": 2}, start
        assert end["detail"]["build"] == bid2 and end["detail"]["status"] == "ready", end
        assert gone["detail"] == {"template": tid, "alias": "my-tpl"}, gone
    finally:
        sd.stop()


def test_daemon_killed_during_a_build(sandboxed_hutch, tmp_path):
    """kill -9 of the daemon mid-build: the builder and its sandbox die with
    it; the next start fails the build, and no job, temporary layer or
    sandbox is left."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    b = request_build(sd, "slow")
    tid, bid = b["templateID"], b["buildID"]
    body = {"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["echo started; sleep 300"], "force": False}]}
    assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", body).status == 202
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = sd.request("GET", f"/templates/{tid}/builds/{bid}/status").json()
        if any("[stdout]: started" in e["message"] for e in st["logEntries"]):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the step never started")
    sbx_id = (data / "builds" / "jobs" / bid / "sandbox").read_text().strip()
    assert len(sbx_id) == 20
    sd.proc.kill()
    sd.proc.wait(10)
    # the builder dies with its parent, the sandbox with the builder
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ps = subprocess.run(["pgrep", "-f", f"--job {data}/builds/jobs/{bid}"], capture_output=True)
        if ps.returncode != 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the builder outlived the daemon")
    sd.start()
    try:
        st = sd.request("GET", f"/templates/{tid}/builds/{bid}/status").json()
        assert st["status"] == "error" and "daemon stopped" in st["reason"]["message"], st
        assert list((data / "builds" / "jobs").iterdir()) == []
        assert [p.name for p in (data / "builds" / "layers").iterdir() if p.name.endswith(".tmp")] == []
        env = {**os.environ, "HUTCH_DATA_DIR": str(data)}
        ps = subprocess.run([str(sandboxed_hutch), "ps", "-a", "-q"], capture_output=True, text=True, env=env)
        assert ps.returncode == 0 and sbx_id not in ps.stdout, ps
        # the name is not a template a sandbox starts from
        assert sd.request("POST", "/v2/sandboxes", {"templateID": "slow"}).status == 404
    finally:
        sd.stop()


def test_a_flood_of_output_is_cut(sandboxed_hutch, tmp_path):
    """A step that prints without end fills at most the log's bound."""
    tmp_path.chmod(0o755)
    sd = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0"])
    sd.start()
    try:
        b = request_build(sd, "flood")
        tid, bid = b["templateID"], b["buildID"]
        body = {"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["seq 30000"], "force": False}]}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", body).status == 202
        st = wait_status(sd, tid, bid, ("ready", "error"), timeout=120)
        assert st["status"] == "ready", st
        warn = sd.request("GET", f"/templates/{tid}/builds/{bid}/status?level=warn").json()["logEntries"]
        assert [e["message"] for e in warn] == ["the build log is cut here: too many lines"], warn
        tail = sd.request("GET", f"/templates/{tid}/builds/{bid}/status?logsOffset=19999").json()["logEntries"]
        assert len(tail) == 2, tail  # the last line kept, then the note
        assert sd.request("GET", f"/templates/{tid}/builds/{bid}/status?logsOffset=20001").json()["logEntries"] == []
    finally:
        sd.stop()


def test_registry_credentials_never_land(sandboxed_hutch, tmp_path):
    """fromImageRegistry's secrets never land: not in the job, the log, the
    database or any file of the data dir, also when the pull is refused
    (test_template_build_regcred.py pulls with them)."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    try:
        secret = "s3cret-" + os.urandom(6).hex()
        b = request_build(sd, "private")
        tid, bid = b["templateID"], b["buildID"]
        body = {"fromImage": "127.0.0.1:9/private/app:1", "steps": [],
                "fromImageRegistry": {"type": "registry", "username": "me", "password": secret}}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", body).status == 202
        st = wait_status(sd, tid, bid, ("ready", "error"))
        assert st["status"] == "error" and st["reason"]["step"] == "base", st
        assert "the pull failed" in st["reason"]["message"], st
        assert secret not in str(st)
    finally:
        sd.stop()
    for p in data.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert secret.encode() not in p.read_bytes(), p


def test_build_egress_is_the_operator_s(sandboxed_hutch, tmp_path):
    """build-egress opens what build steps may reach, under the ceiling: a
    RUN step reaches the allowed server through the build's proxy, and not
    another port of it."""
    import random
    ns = "hbe" + os.urandom(3).hex()
    o3 = random.randint(100, 199)
    host_ip, srv_ip = f"10.232.{o3}.1", f"10.232.{o3}.2"
    sh = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    sh("ip", "netns", "add", ns)
    srv = None
    try:
        sh("ip", "link", "add", f"{ns}a", "type", "veth", "peer", "name", f"{ns}b")
        sh("ip", "link", "set", f"{ns}b", "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", f"{ns}a")
        sh("ip", "link", "set", f"{ns}a", "up")
        sh("ip", "-n", ns, "addr", "add", f"{srv_ip}/30", "dev", f"{ns}b")
        sh("ip", "-n", ns, "link", "set", f"{ns}b", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        (tmp_path / "www").mkdir()
        (tmp_path / "www" / "pkg.txt").write_text("package-contents\n")
        srv = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-m", "http.server", "--bind", srv_ip,
                                "18080"], cwd=tmp_path / "www", stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://{srv_ip}:18080/pkg.txt"]).returncode:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.1)
        tmp_path.chmod(0o755)
        sd = ServeDaemon(sandboxed_hutch, tmp_path / "data",
                         ["--pool-size", "0", "--egress-allow", "*", "--egress-open", f"10.232.{o3}.0/30",
                          "--build-egress", f"{srv_ip}:18080"])
        sd.start()
        try:
            b = request_build(sd, "netbuild")
            tid, bid = b["templateID"], b["buildID"]
            body = {"fromTemplate": "base", "steps": [
                {"type": "RUN", "args": [f"curl -sS -m 10 http://{srv_ip}:18080/pkg.txt > /home/user/pkg.txt"],
                 "force": False},
                {"type": "RUN", "args": [f"curl -sf -m 5 http://{srv_ip}:18081/ && echo REACHED || echo refused"],
                 "force": False}]}
            assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", body).status == 202
            st = wait_status(sd, tid, bid, ("ready", "error"), timeout=60)
            msgs = [e["message"] for e in st["logEntries"]]
            assert st["status"] == "ready", msgs
            assert "[builder 2/2] [stdout]: refused" in msgs, msgs
            assert not any("REACHED" in m and "[stdout]" in m for m in msgs), msgs
            sb = sd.create(templateID="netbuild")
            end, out, err, _ = sd.run(sb, "cat /home/user/pkg.txt")
            assert out == b"package-contents\n", (out, err)
            sd.kill(sb["sandboxID"])
        finally:
            sd.stop()
    finally:
        if srv:
            srv.kill()
            srv.wait()
        subprocess.run(["ip", "link", "del", f"{ns}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_delete_during_a_build(sandboxed_hutch, tmp_path):
    """DELETE of a template while it builds: the build is stopped, its
    sandbox removed, and the template's step cache collected once no build
    runs."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    try:
        b = request_build(sd, "short-lived")
        tid, bid = b["templateID"], b["buildID"]
        quick = {"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["echo one"], "force": False}]}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", quick).status == 202
        assert wait_status(sd, tid, bid, ("ready", "error"))["status"] == "ready"
        layers = data / "builds" / "layers"
        assert any(p.suffix == ".layer" for p in layers.iterdir())
        b2 = request_build(sd, "short-lived")
        slow = {"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["echo one"], "force": False},
                                                  {"type": "RUN", "args": ["echo go; sleep 300"], "force": False}]}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{b2['buildID']}", slow).status == 202
        deadline = time.monotonic() + 30
        while not any("[stdout]: go" in e["message"] for e in
                      sd.request("GET", f"/templates/{tid}/builds/{b2['buildID']}/status").json()["logEntries"]):
            assert time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.1)
        sbx_id = (data / "builds" / "jobs" / b2["buildID"] / "sandbox").read_text().strip()
        assert sd.request("DELETE", f"/templates/{tid}").status == 204
        deadline = time.monotonic() + 20
        while list((data / "builds" / "jobs").iterdir()) or list(layers.iterdir()):
            assert time.monotonic() < deadline, (list((data / "builds" / "jobs").iterdir()), list(layers.iterdir()))
            time.sleep(0.1)
        ps = subprocess.run([str(sandboxed_hutch), "ps", "-a", "-q"], capture_output=True, text=True,
                            env={**os.environ, "HUTCH_DATA_DIR": str(data)})
        assert sbx_id not in ps.stdout, ps.stdout
        assert sd.request("GET", "/templates/aliases/short-lived").status == 404
    finally:
        sd.stop()


@needs_runsc
def test_built_template_starts_gvisor_sandboxes(sandboxed_hutch, tmp_path):
    """A template built with the E2B build API (its steps run on ns) starts
    gvisor sandboxes: the build's layer, imported into the sandbox's own
    image and mounted read-only from a read-only loop device, between the
    base and the writable layer. Its files with their owners, its deletions,
    the template's user and workdir, and its start and ready commands work
    as on ns; the build's cached layer is never written; a checkpoint
    (snapshot) restores over it; nothing is left after a kill, or after a
    kill -9 of the runtime."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    try:
        b = request_build(sd, "gv-tpl")
        tid, bid = b["templateID"], b["buildID"]
        h = "ab" * 32
        url = urllib.parse.urlsplit(sd.request("GET", f"/templates/{tid}/files/{h}").json()["url"])
        assert sd.request("PUT", url.path + "?" + url.query, tar_of({"a.txt": b"hello\n"}), key="").status == 200
        spec = {"fromTemplate": "base", "steps": [
            {"type": "COPY", "args": ["a.txt", "/opt/app/a.txt", "", ""], "force": False, "filesHash": h},
            {"type": "RUN", "args": ["mkdir -p /opt/own && echo own > /opt/own/f && chown -R 4321:4322 /opt/own "
                                     "&& rm /etc/fstab", "root"], "force": False},
            {"type": "WORKDIR", "args": ["/opt/app"], "force": False},
            {"type": "USER", "args": ["user"], "force": False}],
            "startCmd": "echo started > /tmp/started; sleep 1000", "readyCmd": "[ -f /tmp/started ]"}
        assert sd.request("POST", f"/v2/templates/{tid}/builds/{bid}", spec).status == 202
        st = wait_status(sd, tid, bid, ("ready", "error"), timeout=300)
        assert st["status"] == "ready", st
        layers = data / "builds" / "layers"
        before = tree_digest(layers)

        sb = sd.create(templateID="gv-tpl", backend="gvisor", timeout=300)
        sid = sb["sandboxID"]
        end, out, err, _ = sd.run(sb, "id -un; pwd; cat a.txt /opt/own/f /tmp/started; stat -c %u:%g /opt/own/f "
                                      "/opt/app/a.txt; test -e /etc/fstab || echo FSTAB-GONE; uname -r")
        assert end.get("exitCode", 0) == 0, (end, err)
        lines = out.decode().splitlines()
        assert lines[:-1] == ["user", "/opt/app", "hello", "own", "started", "4321:4322", "1000:1000",
                              "FSTAB-GONE"], lines
        assert lines[-1] != os.uname().release  # the sentry's kernel
        # the build layer: a read-only loop device of this sandbox's image,
        # mounted only in the relay's namespace
        img = data / "storage" / "layers" / f"{sid}.img"
        loops = [d for d in Path("/sys/block").glob("loop*")
                 if (d / "loop" / "backing_file").exists()
                 and (d / "loop" / "backing_file").read_text().strip() == str(img)]
        assert len(loops) == 1 and (loops[0] / "ro").read_text().strip() == "1", loops
        assert not mounts_naming(sid, str(data))
        # writes over the build's files land in the sandbox's layer
        end, out, err, _ = sd.run(sb, "echo changed > /opt/app/a.txt && rm /opt/own/f && cat /opt/app/a.txt; "
                                      "test -e /opt/own/f || echo F-GONE", user="root")
        assert out == b"changed\nF-GONE\n", (out, err)

        # a snapshot (a memory checkpoint) restores over the base and the
        # build's layer, in a new sandbox
        r = sd.request("POST", f"/sandboxes/{sid}/snapshots", {}, timeout=120)
        assert r.status == 201, (r, sd.log_tail())
        sb2 = sd.create(templateID=r.json()["snapshotID"], timeout=300)
        end, out, err, _ = sd.run(sb2, "cat /opt/app/a.txt /tmp/started; test -e /opt/own/f || echo F-GONE; "
                                       "stat -c %u:%g /opt/own")
        assert out == b"changed\nstarted\nF-GONE\n4321:4322\n", (out, err, sd.log_tail())
        assert sd.kill(sb2["sandboxID"]).status == 204
        assert_nothing_left(sb2["sandboxID"], data)
        assert sd.kill(sid).status == 204
        assert_nothing_left(sid, data)

        # kill -9 of the runtime: the mounts and the loop device go with it
        sb3 = sd.create(templateID="gv-tpl", backend="gvisor", timeout=300)
        sid3 = sb3["sandboxID"]
        assert sd.run(sb3, "cat /opt/own/f")[1] == b"own\n"
        for pid in sandbox_processes(sid3):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert_nothing_left(sid3, data, timeout=60)
        assert tree_digest(layers) == before
    finally:
        assert sd.stop() == []
