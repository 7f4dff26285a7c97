"""`hutch template base` (docs/templates.md, "The base template"): `base`
built from Debian packages with mmdebstrap, from the Debian archive the
host's apt uses (CI reaches deb.debian.org), and every way of naming `base`
then starting it: `hutch run --template base`, an E2B create without a
templateID (with a warm pool of host sandboxes that must not serve it), and
`template rm base` falling back to the host template.

One small build (minbase, plus `hello`, plus sudo): about a minute, most of
it dpkg. The full default set is not built here (docs/templates.md has its
size and time)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from hutchtest import wait_until
from serveclient import ServeDaemon

PKG = "hello"  # GNU hello: tiny, and not on the host


def hutch(hutch_bin, env, *args, timeout=600, check=True):
    p = subprocess.run([str(hutch_bin), *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=timeout)
    if check:
        assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr[-3000:])
    return p


def codename():
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    raise AssertionError("/etc/os-release has no VERSION_CODENAME")


def host_extra_suites():
    """The host's apt suites SUITE-updates and SUITE-security, the ones a
    default build reads besides SUITE."""
    text = ""
    for f in [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]:
        if f.exists():
            text += "\n".join(ln for ln in f.read_text().splitlines() if not ln.lstrip().startswith("#")) + "\n"
    words = set(text.split())
    return [s for s in (f"{codename()}-updates", f"{codename()}-security") if s in words]


def pooled_id(data, old, timeout):
    """The first id in the daemon's pool-ids that is not in old, once there is one."""
    ids = []

    def listed():
        ids[:] = [x for x in (data / "pool-ids").read_text().split() if x not in old] \
            if (data / "pool-ids").exists() else []
        return ids
    assert wait_until(listed, timeout), "the warm pool did not fill"
    return ids[0]


def in_base(hutch_bin, env, script, *opts):
    return hutch(hutch_bin, env, "run", "--template", "base", *opts, "--", "/bin/sh", "-c", script)


def test_base_from_debian_packages(sandboxed_hutch, tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    e = dict(os.environ, HUTCH_DATA_DIR=str(data))
    assert not Path(f"/usr/bin/{PKG}").exists(), f"the host has /usr/bin/{PKG}: pick another package"

    # bad flags: a clear error, and nothing written (not even the data dir)
    for args, says in [
        (["--suite", "Bookworm!"], "is not a suite name"),
        (["--mirror", "ftp://deb.debian.org/debian"], "is not an http:// or https:// URL"),
        (["--mirror", "http://x/ y"], "is not an http:// or https:// URL"),
        (["--packages", "hello,Bad_Name"], "is not a Debian package name"),
        (["--security-mirror", "file:///srv/debian-security"], "is not an http:// or https:// URL"),
        (["--security-mirror", "http://deb.debian.org/debian-security", "--no-updates"], "give one of them"),
        (["--packages", " , "], "the list is empty"),
        (["--no-such-flag"], "unknown option"),
        (["stray"], "unexpected argument"),
    ]:
        p = hutch(sandboxed_hutch, e, "template", "base", *args, check=False)
        assert p.returncode == 2 and says.encode() in p.stderr, (args, p.returncode, p.stderr)
    assert not data.exists()
    # and no other writer may take the name: a build named base is refused
    (tmp_path / "Buildfile").write_text("FROM base\nRUN true\n")
    p = hutch(sandboxed_hutch, e, "template", "build", str(tmp_path / "Buildfile"), "--name", "base", check=False)
    assert p.returncode == 2 and b"is a built-in template" in p.stderr, p.stderr

    # before a build, base is the host template: the host's /usr
    in_base(sandboxed_hutch, e, "test -x /usr/bin/python3")

    t0 = time.monotonic()
    p = hutch(sandboxed_hutch, e, "template", "base", "--packages", PKG, "--json")
    build_s = time.monotonic() - t0
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert events[-1]["phase"] == "built" and events[-1]["name"] == "base", events
    layer = events[-1]["layer"]
    tj = json.loads((data / "templates" / "base" / "template.json").read_text())
    assert tj["kind"] == "debian" and tj["layers"] == [layer] and "packages hello,sudo" in tj["source"], tj
    # SUITE-updates and SUITE-security are read where the host's apt reads
    # them: their Releases are in the source, their lines in the base's apt
    extra = host_extra_suites()
    for suite in extra:
        assert f"+ {suite} from http" in tj["source"], (suite, tj["source"])
    apt_lines = [ln.split() for ln in in_base(sandboxed_hutch, e, "cat /etc/apt/sources.list").stdout.decode().splitlines()
                 if ln.startswith("deb ")]
    assert sorted(ln[2] for ln in apt_lines) == sorted([codename()] + extra), apt_lines
    # nothing of the build is left beside the data
    assert not (data / ".base-build").exists()
    ls = json.loads(hutch(sandboxed_hutch, e, "template", "ls", "--json").stdout)
    assert [t["kind"] for t in ls if t["name"] == "base"] == ["debian"], ls

    # hutch run --template base: Debian's files, the package, none of the host's
    out = in_base(sandboxed_hutch, e,
                  f"grep ^ID= /etc/os-release; {PKG} | head -n 1; "
                  "test -e /usr/bin/python3 && echo host-python; "
                  "getent passwd user; cat /etc/sudoers.d/user; stat -c '%a %u' /etc/sudoers.d/user; "
                  "stat -c %U /home/user", "--user", "0").stdout.decode().splitlines()
    assert out == ["ID=debian", "Hello, world!", "user:x:1000:1000::/home/user:/bin/bash",
                   "user ALL=(ALL:ALL) NOPASSWD: ALL", "440 0", "user"], out
    # `user`'s passwordless sudo works (set-uid programs of the template run:
    # docs/security.md, "Image layers"), as does asking for root
    p = hutch(sandboxed_hutch, e, "run", "--template", "base", "--user", "1000", "--", "sudo", "-n", "id", "-u",
              check=False)
    assert p.returncode == 0 and p.stdout == b"0\n", (p.returncode, p.stdout, p.stderr)
    assert in_base(sandboxed_hutch, e, "id -u", "--user", "0").stdout == b"0\n"

    # unchanged inputs: a second build is a no-op (the archive's Release is read again)
    p = hutch(sandboxed_hutch, e, "template", "base", "--packages", PKG, "--json")
    assert json.loads(p.stdout.decode().splitlines()[-1])["phase"] == "unchanged", p.stdout
    assert json.loads((data / "templates" / "base" / "template.json").read_text())["layers"] == [layer]

    # the daemon: an E2B create without templateID starts the built base, and
    # the warm pool holds base sandboxes (the create is a pool hit); after
    # `template rm base` the pooled base sandbox is removed, the pool holds a
    # host one, and the same create is host
    def pooled(old=()):
        return pooled_id(data, old, 30)

    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "1"])
    sd.start()
    try:
        warm = pooled()
        r = sd.request("POST", "/v2/sandboxes", {})
        assert r.status == 201, r
        sb = r.json()
        assert sb["sandboxID"] == warm, "a create of the built base takes the pooled base sandbox"
        sd.created[sb["sandboxID"]] = sd.key
        end, out, err, _ = sd.run(sb, f"grep ^ID= /etc/os-release; {PKG}; id -un; echo $LANG")
        assert end.get("exitCode", 0) == 0, (end, err)
        assert out.decode().splitlines() == ["ID=debian", "Hello, world!", "user", "C.UTF-8"], (out, err)
        end, out, err, _ = sd.run(sb, "id -u", user="root")
        assert out == b"0\n", (out, err)

        warm2 = pooled(old=(warm,))
        hutch(sandboxed_hutch, e, "template", "rm", "base")
        assert not (data / "templates" / "base").exists()
        # the pooled base sandbox goes, a host one takes its place
        warm3 = pooled(old=(warm, warm2))
        assert wait_until(lambda: warm2 not in (data / "pool-ids").read_text().split(), 30), \
            "the stale base sandbox stayed in the pool"
        # the live sandbox keeps its version
        end, out, err, _ = sd.run(sb, f"{PKG}")
        assert out == b"Hello, world!\n", (out, err)
        r = sd.request("POST", "/v2/sandboxes", {})
        assert r.status == 201, r
        sb2 = r.json()
        sd.created[sb2["sandboxID"]] = sd.key
        assert sb2["sandboxID"] == warm3, "the create of host-as-base takes the pooled host sandbox"
        end, out, err, _ = sd.run(sb2, "test -x /usr/bin/python3 && echo host")
        assert out == b"host\n", (out, err)
    finally:
        sd.stop()
    in_base(sandboxed_hutch, e, "test -x /usr/bin/python3")
    p = hutch(sandboxed_hutch, e, "template", "rm", "base", check=False)
    assert p.returncode != 0 and b"no base template was built" in p.stderr, p.stderr
    print(f"base build (minbase + {PKG} + sudo): {build_s:.1f}s")


def _execute(sd, sid, code):
    """POST /execute on the sandbox's port 49999 through the daemon: the NDJSON events."""
    r = sd.request("POST", "/execute", {"code": code},
                   headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999"}, timeout=90)
    assert r.status == 200, r
    return [json.loads(line) for line in r.body.decode().splitlines() if line]


def test_interpreter_from_debian_packages(sandboxed_hutch, tmp_path):
    """`hutch template interpreter`: the code-interpreter template built from
    Debian packages (its kernels and libraries the archive's, not the
    host's /usr), then started by `hutch run`, by an E2B create (the warm
    pool holding it), and `template rm code-interpreter` falling back to the
    host template. A small build: the interpreter's own needs (python3-
    ipykernel, hutch-interp's libraries, sudo) plus `hello`."""
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    e = dict(os.environ, HUTCH_DATA_DIR=str(data))
    assert not Path(f"/usr/bin/{PKG}").exists(), f"the host has /usr/bin/{PKG}: pick another package"

    # bad input: a clear error, nothing written
    p = hutch(sandboxed_hutch, e, "template", "interpreter", "--packages", "hello,Bad_Name", check=False)
    assert p.returncode == 2 and b"is not a Debian package name" in p.stderr, p.stderr
    p = hutch(sandboxed_hutch, e, "template", "rm", "code-interpreter", check=False)
    assert p.returncode != 0 and b"no code-interpreter template was built" in p.stderr, p.stderr
    assert not (data / "templates" / "code-interpreter").exists()

    # a sanitized build's hutch-interp (copied in at each create) needs
    # gcc's sanitizer runtimes, which the host has and the template must too
    pkgs = f"{PKG},libasan8,libubsan1" if os.environ.get("HUTCH_TEST_SANITIZED") else PKG
    p = hutch(sandboxed_hutch, e, "template", "interpreter", "--packages", pkgs, "--json")
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert events[-1]["phase"] == "built" and events[-1]["name"] == "code-interpreter", events
    tj = json.loads((data / "templates" / "code-interpreter" / "template.json").read_text())
    # what the interpreter needs is added to any --packages
    listed = tj["source"].split(" packages ", 1)[1].split(";")[0].split(")")[0].split(",")
    assert tj["kind"] == "debian" and listed == sorted(pkgs.split(",") + ["libjansson4", "libzmq5",
                                                                            "python3-ipykernel", "sudo"]), tj
    assert not (data / ".base-build").exists()
    # a build of the same inputs is a no-op, and base is a template of its own
    p = hutch(sandboxed_hutch, e, "template", "interpreter", "--packages", pkgs, "--json")
    assert json.loads(p.stdout.decode().splitlines()[-1])["phase"] == "unchanged", p.stdout
    assert not (data / "templates" / "base").exists()

    # hutch run: every name of the interpreter's template starts it, the
    # server copied in (the host's /usr is not there), its python kernel the
    # archive's; the command talks to it on port 49999
    probe = ("import json, urllib.request\n"
             "req = urllib.request.Request('http://127.0.0.1:49999/execute', "
             "data=json.dumps({'code': 'import sys; sys.executable + \" \" + str(6 * 7)'}).encode())\n"
             "ev = [json.loads(x) for x in urllib.request.urlopen(req, timeout=60)]\n"
             "print([x['text'] for x in ev if x['type'] == 'result'][0])\n")
    for name in ("code-interpreter", "code-interpreter-v1"):
        out = hutch(sandboxed_hutch, e, "run", "--template", name, "--", "/bin/sh", "-c",
                    f"{PKG}; test -x /opt/hutch-interp/hutch-interp && echo server; "
                    f"grep ^ID= /etc/os-release; python3 -c \"$0\"", probe).stdout.decode().splitlines()
        assert out == ["Hello, world!", "server", "ID=debian", "/usr/bin/python3 42"], (name, out)

    # the daemon: the warm pool holds a started interpreter of the built
    # template; an E2B create of code-interpreter-v1 takes it; after
    # `template rm code-interpreter` the pooled one is replaced by one on
    # the host template, which the next create gets
    def pooled(old=()):
        return pooled_id(data, old, 60)

    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--interp-pool-size", "1"])
    sd.start()
    try:
        warm = pooled()
        assert wait_until(lambda: "(code-interpreter-v1) ready after" in sd.log_tail(), 90), sd.log_tail()
        sb = sd.create(templateID="code-interpreter-v1")
        assert sb["sandboxID"] == warm, "the create takes the pooled interpreter"
        end, out, err, _ = sd.run(sb, f"{PKG}; grep ^ID= /etc/os-release")
        assert out.decode().splitlines() == ["Hello, world!", "ID=debian"], (out, err)
        ev = _execute(sd, sb["sandboxID"], "import shutil; shutil.which('hello')")
        assert [x.get("text") for x in ev if x["type"] == "result"] == ["/usr/bin/hello"], ev

        warm2 = pooled(old=(warm,))
        assert wait_until(lambda: sd.log_tail(100000).count("(code-interpreter-v1) ready after") >= 2, 90)
        hutch(sandboxed_hutch, e, "template", "rm", "code-interpreter")
        assert not (data / "templates" / "code-interpreter").exists()
        assert wait_until(lambda: warm2 not in (data / "pool-ids").read_text().split(), 60), \
            "the stale interpreter stayed in the pool"
        warm3 = pooled(old=(warm, warm2))
        assert wait_until(lambda: sd.log_tail(100000).count("(code-interpreter-v1) ready after") >= 3, 90)
        # the live sandbox keeps its version
        end, out, err, _ = sd.run(sb, PKG)
        assert out == b"Hello, world!\n", (out, err)
        sb2 = sd.create(templateID="code-interpreter-v1")
        assert sb2["sandboxID"] == warm3, "the create takes the pooled interpreter on the host template"
        ev = _execute(sd, sb2["sandboxID"], "import shutil; str(shutil.which('hello'))")
        assert [x.get("text") for x in ev if x["type"] == "result"] == ["None"], ev
    finally:
        sd.stop()
