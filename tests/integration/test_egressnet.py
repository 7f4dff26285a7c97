"""Self-test of the egress test network (tests/helpers/egressnet.py).

No hutch here: commands run in the daemon netns D reach the fake world W
(DNS, sinks), and nothing else. Skips where the network cannot be built.
"""

import json
import os
import shutil
import socket

import pytest

import egressnet as en
from egressnet import EgressNet, egressnet  # noqa: F401  (registers the fixture)

pytestmark = pytest.mark.skipif(en.unavailable_reason() is not None,
                                reason=str(en.unavailable_reason()))

CURL = shutil.which("curl", path="/usr/bin:/bin")


@pytest.fixture
def net(egressnet):  # noqa: F811
    egressnet.reset_zone()
    egressnet.reset()
    return egressnet


def test_dns_answers_from_the_zone(net):
    assert net.dig("ok.example.test")["addrs"] == ["198.51.100.10"]
    assert net.dig("OK.Example.Test.", tcp=True)["addrs"] == ["198.51.100.10"]
    assert net.dig("ok6.example.test", "AAAA")["addrs"] == ["2001:db8:100::10"]
    r = net.dig("ok6.example.test", "A")
    assert (r["rcode"], r["addrs"]) == (0, [])           # NODATA
    c = net.dig("cname.example.test")
    assert [a["type"] for a in c["answers"]] == ["CNAME", "A"] and c["addrs"] == ["198.51.100.10"]
    assert net.dig("nope.example.test")["rcode"] == 3
    assert net.dig("servfail.example.test")["rcode"] == 2
    # Malformed packets are logged and the server lives on.
    code = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "[s.sendto(p, ('198.51.100.53', 53)) for p in (b'x', b'\\0' * 12, b'\\1\\2\\1\\0\\0\\1' + b'\\0' * 6 + b'\\77')]")
    assert net.run_in_daemon_ns([net.python, "-c", code], timeout=20).returncode == 0
    assert net.dig("api.example.test")["addrs"] == ["198.51.100.10"]
    st = net.stats()["dns"]
    assert st["counts"]["malformed"] == 3
    names = [(q["name"], q["type"], q["transport"]) for q in st["queries"] if q["name"]]
    assert ("ok.example.test", "A", "tcp") in names and ("nope.example.test", "A", "udp") in names
    assert net.dns_queries("evil.test") == []


def test_http_and_https_reach_the_ok_sink(net):
    r = net.http_from_daemon("http://ok.example.test/p?q=1", connect="198.51.100.10",
                             method="POST", body=b"abc", headers=["X-Test: 1"])
    assert r["status"] == 200, r
    j = r["json"]
    assert (j["sink"], j["proto"], j["path"], j["body"]) == ("ok", "http", "/p", "abc")
    assert ["X-Test", "1"] in j["headers"] and j["host"] == "ok.example.test"
    r = net.http_from_daemon("https://api.example.test/s", connect="198.51.100.10")
    assert r["status"] == 200 and r["json"]["sni"] == "api.example.test", r
    r = net.http_from_daemon("https://[2001:db8:100::10]/v6")
    assert r["status"] == 200 and r["json"]["sink"] == "ok6", r
    # A leaf from the untrusted CA for untrusted.example.test.
    r = net.http_from_daemon("https://untrusted.example.test/", connect="198.51.100.10")
    assert "CERTIFICATE_VERIFY_FAILED" in r["error"]
    r = net.http_from_daemon("http://evil.test/redirect?to=http://x.test/", connect="198.51.100.20")
    assert r["status"] == 302 and ["Location", "http://x.test/"] in r["headers"]
    s = net.stats()["sinks"]
    assert s["ok"]["http"]["requests"] == 1 and s["ok"]["http"]["bytes"] > 0
    assert s["ok"]["https"]["requests"] == 1 and s["ok"]["https"]["tls_errors"] == 1
    assert s["ok6"]["https"]["requests"] == 1 and s["evil"]["http"]["requests"] == 1
    assert s["private"]["http"]["connections"] == 0


@pytest.mark.skipif(CURL is None, reason="curl is not installed")
def test_curl_chunked_https_and_echo(net):
    cp = net.run_in_daemon_ns(
        [CURL, "-sS", "--max-time", "10", "--cacert", net.ca_cert,
         "--resolve", "ok.example.test:443:198.51.100.10", "-H", "Transfer-Encoding: chunked",
         "--data-binary", "chunky", "https://ok.example.test/c"], timeout=30)
    assert cp.returncode == 0, cp.stderr
    j = json.loads(cp.stdout)
    assert (j["sink"], j["chunked"], j["body"], j["sni"]) == ("ok", True, "chunky", "ok.example.test")
    code = ("import socket; s = socket.create_connection(('10.77.0.5', 9000), timeout=5); "
            "s.sendall(b'ping'); print(s.recv(10).decode())")
    cp = net.run_in_daemon_ns([net.python, "-c", code], timeout=20)
    assert cp.stdout.strip() == "ping", cp.stderr
    assert net.sink_stats("private")["echo"] == {"connections": 1, "bytes": 4}


def test_rebind_alternates_and_set_zone(net):
    got = [net.dig("rebind.example.test") for _ in range(4)]
    assert [g["addrs"] for g in got] == [["198.51.100.10"], ["10.77.0.5"]] * 2
    assert {g["answers"][0]["ttl"] for g in got} == {0}
    net.set_zone({"new.example.test": ["198.51.100.20"], "ok.example.test": None})
    assert net.dig("new.example.test")["addrs"] == ["198.51.100.20"]
    assert net.dig("ok.example.test")["rcode"] == 3
    net.reset_zone()
    assert net.dig("ok.example.test")["addrs"] == ["198.51.100.10"]
    assert net.dig("rebind.example.test")["addrs"] == ["198.51.100.10"]


def test_isolation_and_reset(net):
    # pytest (root netns) reaches D's API address: nothing listens, so RST.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((net.api_host, 9), timeout=5).close()
    # From D, anything but the sinks fails at once (W has no way out).
    r = net.http_from_daemon("http://203.0.113.7/", timeout=5)
    assert "error" in r and "timed out" not in r["error"], r
    routes = net.run_in_daemon_ns(["ip", "-4", "route"], timeout=10).stdout
    assert f"default via {en.W_ADDR4}" in routes
    net.dig("ok.example.test")
    assert net.stats()["dns"]["queries"]
    net.reset()
    st = net.stats()
    assert st["dns"]["queries"] == [] and st["requests"] == []
    assert all(v == 0 for s in st["sinks"].values() for p in ("http", "https", "echo")
               for k, v in s[p].items() if k != "last_tls_error")


def test_close_leaves_nothing(tmp_path):
    net = EgressNet()
    with net:
        assert os.path.exists(f"/run/netns/{net.ns_daemon}")
        p = net.popen_in_daemon_ns(["sleep", "60"])    # a daemon the test forgot
    assert p.wait(timeout=10) != 0
    assert net.close_errors == [] and en.leftovers(instance_id=net.id) == []
    # A failed start cleans up too.
    bad = EgressNet(world_script=str(tmp_path / "missing.py"), start_timeout=10)
    with pytest.raises(en.EgressNetError):
        bad.start()
    assert bad.close_errors == [] and en.leftovers(instance_id=bad.id) == []
