"""Ingress is no route out (docs/security.md "Ingress").

The daemon reaches a sandbox's port through a socket it makes inside the
sandbox's netns. These tests check, from both ends, that this gives the
sandbox nothing: from inside, the host, the daemon's API and other
sandboxes stay unreachable while ingress connections are open; a request
for a port of sandbox A never reaches sandbox B (nor the daemon's own port);
and what a sandbox writes back is read as a response, never as a request.
"""

import os
import shutil
import socket
import subprocess
import time

import pytest

from serveclient import HttpConn, ServeDaemon

PORT = 8000
# answers its sandbox's id on every path; /forever holds the response open;
# /request writes an API request back instead of a response
SERVER = r'''
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
SID = open("/run/e2b/.E2B_SANDBOX_ID").read().strip().encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/forever":
            self.send_response(200); self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
            try:
                while True:
                    self.wfile.write(b"5\r\ntick\n\r\n"); self.wfile.flush(); time.sleep(0.1)
            except OSError:
                return
        if self.path == "/request":
            self.wfile.write(b"GET /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); self.close_connection = True
            return
        self.send_response(200); self.send_header("Content-Length", str(len(SID))); self.end_headers()
        self.wfile.write(SID)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''

# connect() to each address from inside; prints "addr:port errno-name" per line
PROBE = r'''
import errno, socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        print(target, "CONNECTED")
    except OSError as e:
        print(target, errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__)
    finally:
        s.close()
'''


def host_addrs():
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    addrs = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addrs.append(parts[parts.index("inet") + 1].split("/")[0])
    return [a for a in addrs if a != "127.0.0.1"] or ["10.255.255.1"]


@pytest.fixture(scope="module")
def world(sandboxed_hutch, tmp_path_factory):
    data = tmp_path_factory.mktemp("ingress-hostile") / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    d.start()
    try:
        a, b = d.create(timeout=120), d.create(timeout=120)
        for sb in (a, b):
            assert d.upload(sb, "/tmp/s.py", SERVER.encode()).status == 200
            assert d.upload(sb, "/tmp/probe.py", PROBE.encode()).status == 200
            d.run(sb, f"(setsid python3 /tmp/s.py {PORT} >/dev/null 2>&1 &)")
        for sb in (a, b):
            deadline = time.monotonic() + 15
            while get(d, sb, "/").status != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
        yield d, a, b
    finally:
        d.stop()
        env = dict(os.environ, HUTCH_DATA_DIR=str(data))
        for sid in d.created:
            subprocess.run([str(sandboxed_hutch), "kill", sid], env=env, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def get(d, sb, path, port=PORT):
    return d.request("GET", path, key="", headers=[("E2b-Sandbox-Id", sb["sandboxID"]),
                                                   ("E2b-Sandbox-Port", str(port))])


def test_ingress_gives_the_sandbox_no_way_out(world):
    d, a, b = world
    # an ingress connection held open while the sandbox probes
    c = HttpConn(d.host, d.port, timeout=30)
    c.send_raw(f"GET /forever HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {a['sandboxID']}\r\n"
               f"E2b-Sandbox-Port: {PORT}\r\n\r\n".encode())
    try:
        status, _ = c.read_head()[:2]
        assert status == 200
        targets = [f"{h}:{d.port}" for h in host_addrs()] + [f"127.0.0.1:{d.port}", "127.0.0.1:49983",
                                                             f"[::1]:{d.port}"]
        _, out, _, _ = d.run(a, "python3 /tmp/probe.py " + " ".join(targets))
        results = dict(line.split(" ", 1) for line in out.decode().splitlines())
        assert set(results) == set(targets), out
        for t, why in results.items():
            assert why != "CONNECTED", f"from inside the sandbox, {t} was reachable while ingress was open"
        # the sandbox's netns still has loopback only, and the ingress
        # connection is a loopback one
        _, dev, _, _ = d.run(a, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert dev.split() == [b"lo"], dev
        _, tcp, _, _ = d.run(a, "cat /proc/net/tcp")
        for line in tcp.decode().splitlines()[1:]:
            local, remote = line.split()[1:3]
            assert local.startswith("0100007F") and (remote.startswith("0100007F") or remote.startswith("00000000")), line
    finally:
        c.close()


def test_a_port_of_one_sandbox_never_reaches_another(world):
    d, a, b = world
    assert get(d, a, "/").body == a["sandboxID"].encode()
    assert get(d, b, "/").body == b["sandboxID"].encode()
    # the daemon's own port, named as a sandbox port, is the sandbox's loopback
    r = get(d, a, "/v2/sandboxes", port=d.port)
    assert r.status == 502 and r.json()["message"] == "The sandbox is running but port is not open", r
    # A's server stopped: A's port is closed, though B's same port listens
    d.run(a, "pkill -f /tmp/s.py; sleep 0.3")
    r = get(d, a, "/")
    assert r.status == 502 and r.json()["sandboxId"] == a["sandboxID"], r
    assert get(d, b, "/").body == b["sandboxID"].encode()


def test_what_the_sandbox_writes_back_is_never_a_request(world):
    d, a, b = world
    r = get(d, b, "/request")
    assert r.status == 502 and "no valid HTTP response" in r.json()["message"], r
    # and the daemon is fine
    assert d.request("GET", "/health", key="").status == 200
