"""hutch-interp's HTTP parser (interp/ihttp.c) on the edge cases a client
can send, through the real server (run here on a loopback port with no
kernels: --no-defaults), answered in the formats @e2b/code-interpreter
reads (docs/interpreter.md): plain-text errors, keep-alive, pipelining,
chunked bodies, and no answer that leaves the connection confused."""

import json
import socket
import subprocess
import time

import pytest


@pytest.fixture(scope="module")
def server(build_dir):
    binary = build_dir / "interp" / "hutch-interp"
    assert binary.exists(), f"{binary} is missing: build first"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([str(binary), "--port", str(port), "--no-defaults"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.02)
    yield port
    p.terminate()
    assert p.wait(timeout=10) == 0, p.stderr.read().decode()


def exchange(port, data, timeout=5):
    """Send raw bytes, read until the server closes or goes quiet."""
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    c.sendall(data)
    out = b""
    c.settimeout(0.2)
    end = time.time() + timeout
    while time.time() < end:
        try:
            b = c.recv(65536)
        except socket.timeout:
            break
        if not b:
            break
        out += b
    c.close()
    return out


def responses(raw):
    """Split a byte stream of Content-Length responses: [(status, headers, body)]."""
    res = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(hdrs.get("content-length", "0"))
        res.append((status, hdrs, rest[:n]))
        raw = rest[n:]
    return res


def test_keepalive_and_pipelining(server):
    req = b"GET /contexts HTTP/1.1\r\nHost: x\r\n\r\n"
    r = responses(exchange(server, req * 3 + b"GET /nope HTTP/1.1\r\n\r\n"))
    assert [s for s, _, _ in r] == [200, 200, 200, 404]
    assert json.loads(r[0][2]) == []
    assert r[0][1]["content-type"] == "application/json"


def test_chunked_body_and_split_writes(server):
    c = socket.create_connection(("127.0.0.1", server), timeout=5)
    body = json.dumps({"code": "1", "context_id": "nope"}).encode()
    msg = (b"POST /execute HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" +
           b"%x;ext=1\r\n%s\r\n" % (5, body[:5]) + b"%x\r\n%s\r\n0\r\nTrailer: x\r\n\r\n" % (len(body) - 5, body[5:]))
    for i in range(0, len(msg), 7):  # a byte stream cut anywhere
        c.sendall(msg[i:i + 7])
        time.sleep(0.001)
    c.settimeout(5)
    data = c.recv(65536)
    c.close()
    (status, _, text), = responses(data)
    assert status == 404
    assert text == b"Context nope not found"


@pytest.mark.parametrize("raw,status", [
    (b"POST /execute HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 400),  # both framings
    (b"POST /execute HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),  # two lengths
    (b"POST /execute HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST /execute HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"POST /execute HTTP/1.1\r\nContent-Length: 20000000\r\n\r\n", 413),  # over the body limit
    (b"POST /execute HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"GET /contexts HTTP/1.1\r\n folded: header\r\n\r\n", 400),  # obs-fold
    (b"GET /contexts HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
    (b"GET /con\x01texts HTTP/1.1\r\n\r\n", 400),
    (b"GET /contexts HTTP/2.0\r\n\r\n", 400),
    (b"GET /contexts\r\n\r\n", 400),
    (b"GET /contexts HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
    (b"POST /execute HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"PUT /execute HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
    (b"POST /execute HTTP/1.1\r\nContent-Length: 8\r\n\r\n{\"code\":", 400),
    (b"POST /execute HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]", 400),
    (b"POST /execute HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"code\": 12}", 400),
    (b"POST /contexts HTTP/1.1\r\nContent-Length: 22\r\n\r\n{\"language\": \"cobol\"}\n", 400),
    (b"POST /contexts HTTP/1.1\r\nContent-Length: 15\r\n\r\n{\"cwd\": \"rel\"}\n", 400),
    (b"POST /contexts/x/restart HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 404),
    (b"DELETE /contexts/x HTTP/1.1\r\n\r\n", 404),
])
def test_bad_requests_are_answered_and_closed(server, raw, status):
    r = responses(exchange(server, raw))
    assert r and r[0][0] == status, r
    assert r[0][1]["content-type"].startswith(("text/plain", "application/json"))
    assert len(r[0][2]) > 0  # a reason, for a person


def test_http10_closes_and_health_without_kernels(server):
    raw = exchange(server, b"GET /health HTTP/1.0\r\n\r\nGET /health HTTP/1.0\r\n\r\n")
    r = responses(raw)
    assert len(r) == 1  # HTTP/1.0 without keep-alive: one answer, then close
    assert r[0][0] == 503  # no default python context (--no-defaults)


def test_server_survives_garbage(server):
    for junk in (b"\x00" * 1000, b"\r\n" * 100, b"GET / HTTP/1.1\r\n" + b"a:b\r\n" * 5000):
        exchange(server, junk, timeout=1)
    assert responses(exchange(server, b"GET /contexts HTTP/1.1\r\n\r\n"))[0][0] == 200
