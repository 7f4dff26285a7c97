"""hutch router against hostile bytes (docs/scale-out.md "How it is built").

A node is trusted less than it looks: a compromised or buggy one must not be
able to make the router hand its bytes to another request, crash it or hang
it. A fake node here answers GET /node correctly (node id "evil") and then
answers every sandbox request with one kind of broken response; the router
must answer the client with a clear 502 (or cut that one response), never
reuse a connection that carried more than one response, and keep serving.
Client bytes: the router must refuse an ambiguous request (Content-Length
with Transfer-Encoding, two Host headers, an oversized head) before any node
sees it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import pytest

from serveclient import HttpConn, free_port

EVIL = "evil" + "a" * 16  # a sandbox id naming node "evil"

RESPONSES = {
    "ok": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}",
    "twocl": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "clte": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "hugehead": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 20000 + b"\r\nContent-Length: 0\r\n\r\n",
    "nul": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
    "badchunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "gzipte": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    # a whole second response after the first one's body: for the next request
    "smuggle": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
                b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"),
    "cut": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..",
    "notheader": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
}


class EvilNode:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.seen = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        buf = b""
        c.settimeout(10)
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                line = head.split(b"\r\n")[0].decode()
                path = line.split()[1]
                self.seen.append(path)
                if path == "/node":
                    body = json.dumps({"nodeID": "evil", "draining": False, "memFreeBytes": 1 << 30,
                                       "sandboxes": 0, "poolReady": 0, "sandboxMemoryMB": 512,
                                       "templates": []}).encode()
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                    continue
                kind = path.rstrip("/").rsplit("/", 1)[-1]
                if kind == "ws":
                    # an Upgrade must arrive as one (Connection: Upgrade kept)
                    low = head.lower()
                    if b"\r\nupgrade: websocket" in low and b"\r\nconnection: upgrade" in low:
                        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                  b"Connection: Upgrade\r\n\r\n" + buf)
                        while True:  # then echo, upper-cased
                            d = c.recv(65536)
                            if not d:
                                return
                            c.sendall(d.upper())
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    continue
                c.sendall(RESPONSES.get(kind, RESPONSES["ok"]))
                if kind == "cut":
                    c.close()
                    return
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        self.stopped = True
        self.sock.close()


@pytest.fixture
def evil_router(hutch_bin, tmp_path):
    node = EvilNode()
    keys = tmp_path / "keys"
    keys.write_text("default e2b_" + "0" * 40 + "\n")
    port = free_port()
    log = open(tmp_path / "router.log", "ab")
    p = subprocess.Popen([str(hutch_bin), "router", "--listen", f"127.0.0.1:{port}",
                          "--nodes", f"http://127.0.0.1:{node.port}", "--key-file", str(keys),
                          "--poll-interval", "200"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            with HttpConn("127.0.0.1", port, timeout=2) as c:
                if c.request("GET", "/health").status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "router not up"
        time.sleep(0.05)
    try:
        yield port, node, p
    finally:
        p.kill()
        p.wait(10)
        node.stop()


def _get(port, path, headers=(), timeout=10):
    with HttpConn("127.0.0.1", port, timeout=timeout) as c:
        return c.request("GET", path, headers=list(headers))


@pytest.mark.parametrize("kind", ["twocl", "clte", "hugehead", "nul", "gzipte", "notheader"])
def test_broken_node_heads_are_502(evil_router, kind):
    port, node, p = evil_router
    r = _get(port, f"/sandboxes/{EVIL}/{kind}")
    assert r.status in (404, 502), r  # a clear error in the control plane's shape
    assert "did not answer" in r.json()["message"], r
    assert p.poll() is None
    # and the router still serves
    assert _get(port, "/health").status in (200, 503)


def test_bad_chunked_body_is_cut_where_it_breaks(evil_router):
    """The head was good and went out; the body's framing breaks: the client
    gets the head and the connection closed, not a byte of the bad chunk."""
    port, node, p = evil_router
    with HttpConn("127.0.0.1", port, timeout=10) as c:
        c.send_raw(f"GET /sandboxes/{EVIL}/badchunk HTTP/1.1\r\nHost: r\r\n\r\n".encode())
        data = b""
        while True:
            d = c.sock.recv(65536)
            if not d:
                break
            data += d
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n"), data
    assert b"zz" not in data and b"hello" not in data
    assert p.poll() is None


def test_bytes_after_a_response_never_reach_the_next_request(evil_router):
    port, node, _ = evil_router
    with HttpConn("127.0.0.1", port, timeout=10) as c:
        r1 = c.request("GET", f"/sandboxes/{EVIL}/smuggle")
        assert r1.status == 200 and r1.body == b"hi"
        for _ in range(3):
            r2 = c.request("GET", f"/sandboxes/{EVIL}/ok")
            assert r2.body == b'{"ok":true}', r2  # never b"SMUGGLED"


def test_cut_response_cuts_the_client_and_nothing_else(evil_router):
    port, node, p = evil_router
    with HttpConn("127.0.0.1", port, timeout=10) as c:
        c.send_raw(f"GET /sandboxes/{EVIL}/cut HTTP/1.1\r\nHost: r\r\n\r\n".encode())
        data = b""
        t0 = time.monotonic()
        while True:
            d = c.sock.recv(65536)
            if not d:
                break
            data += d
        assert time.monotonic() - t0 < 5
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"only ten..")
    assert p.poll() is None
    # the node is not marked down for it: the next request is served
    r = _get(port, f"/sandboxes/{EVIL}/ok")
    assert r.status == 200


@pytest.mark.parametrize("raw, status", [
    (b"POST /sandboxes/" + EVIL.encode() + b"/ok HTTP/1.1\r\nHost: r\r\nContent-Length: 4\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"GET /sandboxes/" + EVIL.encode() + b"/ok HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"GET /sandboxes/" + EVIL.encode() + b"/ok HTTP/1.1\r\nHost: r\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
    (b"GET /sandboxes/" + EVIL.encode() + b"/ok HTTP/1.1\nHost: r\n\n", 400),
])
def test_ambiguous_client_requests_are_refused_before_any_node(evil_router, raw, status):
    port, node, _ = evil_router
    before = len([s for s in node.seen if s != "/node"])
    with HttpConn("127.0.0.1", port, timeout=10) as c:
        c.send_raw(raw)
        r = c.read_response()
    assert r.status == status, r
    assert r.header("Connection", "").lower() == "close"
    assert len([s for s in node.seen if s != "/node"]) == before


def test_bad_ids_in_routing_headers(evil_router):
    port, node, _ = evil_router
    r = _get(port, "/health", [("E2b-Sandbox-Id", "../../etc"), ("E2b-Sandbox-Port", "49983")])
    assert r.status == 502 and r.json()["code"] == 502, r
    r = _get(port, "/sandboxes/..%2f..%2fnode")
    assert r.status == 404, r
    r = _get(port, "/sandboxes/zzzzzzzzzzzzzzzzzzzz")
    assert r.status == 404 and "node zzzz is not reachable" in r.json()["message"], r


def test_upgrade_is_a_tunnel(evil_router):
    """Upgrade (WebSocket) to a sandbox port: the 101 and then raw bytes both
    ways, through the sandbox's Host name as the SDK's getHost() gives it."""
    port, node, _ = evil_router
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /ws HTTP/1.1\r\nHost: 8080-{EVIL}.hutch.example\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\nearly".encode())
        got = b""
        while b"EARLY" not in got:
            d = s.recv(65536)
            assert d, got
            got += d
        assert got.startswith(b"HTTP/1.1 101"), got
        for msg in (b"hello", b"x" * 200000):
            s.sendall(msg)
            back = b""
            while len(back) < len(msg):
                d = s.recv(65536)
                assert d
                back += d
            assert back == msg.upper()
