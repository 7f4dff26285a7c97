"""HTTP/2 to sandbox ports (docs/api.md "Sandbox ports", "HTTP/2").

One daemon with --sandbox-domain and two sandboxes, a public one and a
private one (allowPublicTraffic: false), each running
tests/helpers/h2_server.py (python3-h2) on port 8000. Clients outside: curl
(--http2-prior-knowledge, and --http2 for HTTP/1.1's Upgrade: h2c) and
hand-made frames with python3-hpack for what curl will not send. What is
checked: h2c with prior knowledge routes by :authority and by the
e2b-sandbox-* fields; bodies of several MB stream both ways; streams run
concurrently; trailers pass; the traffic token is required; errors are
HTTP/2 answers or GOAWAY, never a hang; hostile frames (bad frame order,
huge HEADERS, CONTINUATION floods, HPACK bombs and table abuse, a later
stream naming another sandbox) end the connection with GOAWAY before the
sandbox sees them, and the daemon stays healthy. The cases that involve a
sandbox run on both backends: on gvisor the daemon reaches the port through
a connector spawned in the sandbox, as HTTP/1.1 ingress does.
"""

import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import hpack
import pytest

from serveclient import ServeDaemon

DOMAIN = "sbx.hutch.test"
PORT = 8000
SERVER = Path(__file__).resolve().parent.parent / "helpers" / "h2_server.py"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
BACKENDS = ["ns", pytest.param("gvisor", marks=pytest.mark.skipif(not os.access(RUNSC, os.X_OK),
                                                                  reason="runsc is not installed"))]

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def start_server(d, sb, *curl_args):
    """The h2 server on PORT of sb, answering (curl_args: e.g. the token)."""
    assert d.upload(sb, "/tmp/h2s.py", SERVER.read_bytes()).status == 200
    end, _, err, _ = d.run(sb, f"(setsid python3 /tmp/h2s.py {PORT} /tmp/h2.log >/dev/null 2>/tmp/h2.err &)")
    assert end.get("exitCode", 0) == 0, err
    deadline = time.monotonic() + 20
    while not curl(d, sb, "/hello", *curl_args).stdout.endswith(b"\n200 2"):
        assert time.monotonic() < deadline, "the server in the sandbox did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request, sandboxed_hutch, tmp_path_factory):
    data = tmp_path_factory.mktemp("ingress-h2") / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--sandbox-domain", DOMAIN,
                                            "--backend", request.param])
    d.backend = request.param
    d.start()
    try:
        pub = d.create(timeout=120)
        priv = d.create(timeout=120, network={"allowPublicTraffic": False})
        assert priv["trafficAccessToken"], priv
        tok = ("-H", f"E2b-Traffic-Access-Token: {priv['trafficAccessToken']}")
        for sb, args in ((pub, ()), (priv, tok)):
            start_server(d, sb, *args)
        yield d, pub, priv
    finally:
        d.stop()
        env = dict(os.environ, HUTCH_DATA_DIR=str(data))
        for sid in d.created:
            subprocess.run([str(sandboxed_hutch), "kill", sid], env=env, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def host_of(sb, port=PORT):
    return f"{port}-{sb['sandboxID']}.{DOMAIN}"


def curl(d, sb, path, *args, host=None, mode="--http2-prior-knowledge", timeout=60):
    cmd = ["curl", "-sS", "--max-time", "30", mode, "-o", "-", "-w", "\n%{http_code} %{http_version}",
           "-H", f"Host: {host or host_of(sb)}", *args, f"http://{d.host}:{d.port}{path}"]
    return subprocess.run(cmd, capture_output=True, timeout=timeout)


def sandbox_log(d, sb) -> str:
    _, out, _, _ = d.run(sb, "cat /tmp/h2.log 2>/dev/null; : > /tmp/h2.log")
    return out.decode()


# ------------------------------------------------------------ a raw client

def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


SETTINGS = frame(4, 0, 0)


def headers_frame(sid, fields, end_stream=True, enc=None):
    block = (enc or hpack.Encoder()).encode(fields)
    return frame(1, 0x4 | (0x1 if end_stream else 0), sid, block)


def req_fields(authority, path="/hello", method="GET", extra=()):
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", authority), *extra]


class Raw:
    """A socket that speaks frames; read() collects frames until the
    daemon closes or a GOAWAY came and the connection ended."""

    def __init__(self, d, timeout=10):
        self.s = socket.create_connection((d.host, d.port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def frames(self, until_close=True, timeout=10):
        out = []
        deadline = time.monotonic() + timeout
        dec = hpack.Decoder()
        while time.monotonic() < deadline:
            while len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + n:
                    break
                t, fl, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7fffffff
                p = self.buf[9:9 + n]
                self.buf = self.buf[9 + n:]
                if t == 1:
                    p = dec.decode(p)
                out.append((t, fl, sid, p))
            if not until_close and any(f[0] == 7 for f in out):
                return out
            try:
                b = self.s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                return out
            self.buf += b
        raise AssertionError(f"no end of connection in {timeout}s: {out!r}")

    def answered(self, sid, timeout=20):
        """Frames until stream sid ended (HEADERS or DATA with END_STREAM);
        what comes after stays for frames()."""
        out, dec = [], hpack.Decoder()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                t, fl, s = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7fffffff
                p = self.buf[9:9 + n]
                self.buf = self.buf[9 + n:]
                out.append((t, fl, s, dec.decode(p) if t == 1 else p))
                if s == sid and t in (0, 1) and fl & 1:
                    return out
            b = self.s.recv(65536)
            assert b, out
            self.buf += b
        raise AssertionError(f"stream {sid} not answered in {timeout}s: {out!r}")

    def close(self):
        self.s.close()


def goaway_of(frames):
    g = [f for f in frames if f[0] == 7]
    assert g, f"no GOAWAY: {frames!r}"
    last, code = struct.unpack(">II", g[-1][3][:8])
    return last & 0x7fffffff, code, g[-1][3][8:]


def answer_of(frames, sid=1):
    hs = [f for f in frames if f[0] == 1 and f[2] == sid]
    assert hs, f"no HEADERS on stream {sid}: {frames!r}"
    status = dict((k.decode() if isinstance(k, bytes) else k, v) for k, v in hs[0][3])[":status"]
    body = b"".join(f[3] for f in frames if f[0] == 0 and f[2] == sid)
    return int(status), body


def healthy(d):
    assert d.alive()
    assert d.request("GET", "/health", key="").status == 200


# ------------------------------------------------------------ the tests

def test_prior_knowledge_get_by_authority_and_by_headers(world):
    d, pub, _ = world
    r = curl(d, pub, "/hello")
    out = r.stdout.decode()
    assert r.returncode == 0 and out.endswith("\n200 2"), (r.stderr, out)
    assert out.startswith(f"hello h2 {host_of(pub)}"), out
    # e2b-sandbox-* fields, the :authority the daemon's own
    r = curl(d, pub, "/hello", "-H", f"E2b-Sandbox-Id: {pub['sandboxID']}", "-H", f"E2b-Sandbox-Port: {PORT}",
             host=f"{d.host}:{d.port}")
    assert r.returncode == 0 and r.stdout.decode().endswith("\n200 2"), r
    # HTTP/1.1 on the same port is as before
    r = curl(d, pub, "/hello", mode="--http1.1")
    assert r.stdout.decode().endswith("\n200 1.1"), r


def test_large_bodies_stream_both_ways(world, tmp_path):
    d, pub, _ = world
    blob = os.urandom(6 * 1024 * 1024)
    f = tmp_path / "blob"
    f.write_bytes(blob)
    r = curl(d, pub, "/echo", "--data-binary", f"@{f}", "-H", "Content-Type: application/octet-stream")
    body, _, tail = r.stdout.rpartition(b"\n")
    assert tail == b"200 2", (r.stderr, tail)
    assert hashlib.sha256(body).digest() == hashlib.sha256(blob).digest(), len(body)
    r = curl(d, pub, "/big?n=8000000")
    body, _, tail = r.stdout.rpartition(b"\n")
    assert tail == b"200 2" and len(body) == 8000000 and body[:16] == b"0123456789abcdef", (tail, len(body), r.stderr)


def test_concurrent_streams_and_trailers(world):
    d, pub, _ = world
    c = Raw(d)
    enc = hpack.Encoder()
    t0 = time.monotonic()
    c.send(PREFACE + SETTINGS + headers_frame(1, req_fields(host_of(pub), "/slow"), enc=enc)
           + headers_frame(3, req_fields(host_of(pub), "/slow"), enc=enc)
           + headers_frame(5, req_fields(host_of(pub), "/grpc", "POST", [("content-type", "application/grpc")]),
                           end_stream=False, enc=enc)
           + frame(0, 1, 5, b"\x00\x00\x00\x00\x02hi"))
    got, done, ends = [], set(), {}
    dec = hpack.Decoder()
    while done != {1, 3, 5} and time.monotonic() - t0 < 10:
        b = c.s.recv(65536)
        assert b, got
        c.buf += b
        while len(c.buf) >= 9 and len(c.buf) >= 9 + int.from_bytes(c.buf[:3], "big"):
            n = int.from_bytes(c.buf[:3], "big")
            t, fl, sid, p = c.buf[3], c.buf[4], int.from_bytes(c.buf[5:9], "big"), c.buf[9:9 + n]
            c.buf = c.buf[9 + n:]
            if t == 4 and not fl & 1:
                c.send(frame(4, 1, 0))  # ACK the server's SETTINGS
            if t == 1:
                p = dec.decode(p)
            got.append((t, fl, sid, p))
            if t in (0, 1) and fl & 1:
                done.add(sid)
                ends[sid] = time.monotonic()
    c.close()
    assert done == {1, 3, 5}, got
    # one after the other, the two 1 s streams would end a second apart (the
    # total time also holds gvisor's connector spawn, which varies)
    gap = abs(ends[1] - ends[3])
    assert gap < 0.7, f"two 1 s streams ended {gap:.2f} s apart: not concurrent"
    heads = [dict((k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
                  for k, v in f[3]) for f in got if f[0] == 1 and f[2] == 5]
    assert heads[0][":status"] == "200" and heads[-1].get("grpc-status") == "0", heads


def ns_only(d):
    """Cases decided before a sandbox is chosen: the backend is not involved."""
    if d.backend != "ns":
        pytest.skip("decided before the sandbox's backend matters: run on ns")


def test_alpn_is_not_offered_so_tls_clients_keep_http1(world):
    """ALPN h2 over the daemon's TLS is not built (docs/api.md): with TLS off
    here, a TLS ClientHello is simply not the h2c preface and goes to
    libmicrohttpd, which closes it; nothing reaches the sandbox."""
    d, pub, _ = world
    ns_only(d)
    sandbox_log(d, pub)
    r = subprocess.run(["curl", "-sS", "--max-time", "10", "-k", "--http2", "-H", f"Host: {host_of(pub)}",
                        f"https://{d.host}:{d.port}/hello"], capture_output=True, timeout=30)
    assert r.returncode != 0
    assert sandbox_log(d, pub) == ""
    healthy(d)


def test_upgrade_h2c_passes_like_other_upgrades(world):
    d, pub, _ = world
    sandbox_log(d, pub)
    r = curl(d, pub, "/hello", mode="--http2")
    out = r.stdout.decode()
    assert r.returncode == 0 and out.endswith("\n200 2"), (r.stderr, out)
    assert out.startswith(f"hello h2 {host_of(pub)}"), out
    assert "upgrade=h2c" in sandbox_log(d, pub)


def test_access_token_required(world):
    d, _, priv = world
    r = curl(d, priv, "/hello")
    out = r.stdout.decode()
    assert out.endswith("\n403 2"), out
    assert json.loads(out.rsplit("\n", 1)[0])["message"].startswith(
        "the sandbox is private: the request has no e2b-traffic-access-token"), out
    r = curl(d, priv, "/hello", "-H", "E2b-Traffic-Access-Token: " + "0" * 40)
    assert r.stdout.decode().endswith("\n403 2"), r
    assert "invalid" in r.stdout.decode()
    r = curl(d, priv, "/hello", "-H", f"E2b-Traffic-Access-Token: {priv['trafficAccessToken']}")
    assert r.stdout.decode().endswith("\n200 2"), r
    assert r.stdout.decode().startswith("hello h2"), r
    # a later stream without the token ends the connection before it reaches the sandbox
    sandbox_log(d, priv)
    c = Raw(d)
    enc = hpack.Encoder()
    tok = [("e2b-traffic-access-token", priv["trafficAccessToken"])]
    c.send(PREFACE + SETTINGS + headers_frame(1, req_fields(host_of(priv), "/hello", extra=tok), enc=enc))
    time.sleep(0.5)
    c.send(headers_frame(3, req_fields(host_of(priv), "/hello?second"), enc=enc))
    fr = c.frames()
    c.close()
    last, code, _ = goaway_of(fr)
    assert (last, code) == (1, 1), fr
    assert "second" not in sandbox_log(d, priv)


def test_mask_request_host_rewrites_every_block(world):
    """maskRequestHost over HTTP/2: the sandbox's server sees :authority
    (and host) masked on every request of a connection, though the client's
    HPACK encoder indexes them after the first (the relay re-encodes each
    block as literals, so the server's table stays in step), a block over
    one frame goes as HEADERS + CONTINUATION, and bodies pass."""
    d, _, _ = world
    masked = d.create(timeout=120, network={"maskRequestHost": "localhost:${PORT}"})
    try:
        start_server(d, masked)
        sandbox_log(d, masked)
        # three streams on one connection: the client's encoder indexes
        # :authority after the first; the third's block (a 20000-byte field)
        # comes as HEADERS + CONTINUATION and is re-encoded over 16384 bytes
        enc, auth = hpack.Encoder(), host_of(masked)
        big = enc.encode([*req_fields(auth, "/echo", "POST"), ("x-big", "b" * 20000)])
        c = Raw(d)
        try:
            c.send(PREFACE + SETTINGS + headers_frame(1, req_fields(auth), enc=enc)
                   + headers_frame(3, req_fields(auth), enc=enc)
                   + frame(1, 0, 5, big[:12000]) + frame(9, 0x4, 5, big[12000:])
                   + frame(0, 0x1, 5, b"0123456789"))
            body, ended = {}, set()
            deadline = time.monotonic() + 20
            while ended != {1, 3, 5}:
                assert time.monotonic() < deadline, (body, ended, c.buf[:200])
                while len(c.buf) >= 9 and len(c.buf) >= 9 + int.from_bytes(c.buf[:3], "big"):
                    n = int.from_bytes(c.buf[:3], "big")
                    t, fl, sid = c.buf[3], c.buf[4], int.from_bytes(c.buf[5:9], "big") & 0x7fffffff
                    assert t != 7, f"GOAWAY {c.buf[9:9 + n]!r}"
                    if t == 0:
                        body[sid] = body.get(sid, b"") + c.buf[9:9 + n]
                    if t in (0, 1) and fl & 1:
                        ended.add(sid)
                    c.buf = c.buf[9 + n:]
                if ended != {1, 3, 5}:
                    b = c.s.recv(65536)
                    assert b, (body, ended)
                    c.buf += b
        finally:
            c.close()
        assert body == {1: b"hello h2 localhost:8000", 3: b"hello h2 localhost:8000", 5: b"0123456789"}, body
        log = sandbox_log(d, masked).split("\n")
        assert log[:3] == ["localhost:8000 /hello 0", "localhost:8000 /hello 0", "localhost:8000 /echo 10"], log
    finally:
        d.kill(masked["sandboxID"])


def test_errors_are_http2_answers(world):
    d, pub, _ = world
    # unknown sandbox: E2B's 502 body, as for HTTP/1.1
    r = curl(d, pub, "/hello", host=f"8000-{'a' * 20}.{DOMAIN}")
    out = r.stdout.decode()
    assert out.endswith("\n502 2"), out
    assert json.loads(out.rsplit("\n", 1)[0])["message"] == "The sandbox was not found"
    # a closed port
    r = curl(d, pub, "/hello", host=host_of(pub, 8001))
    out = r.stdout.decode()
    assert out.endswith("\n502 2"), out
    assert json.loads(out.rsplit("\n", 1)[0]) == {"sandboxId": pub["sandboxID"], "port": 8001, "code": 502,
                                                  "message": "The sandbox is running but port is not open"}
    # no sandbox port named: HTTP/2 serves sandbox ports only
    r = curl(d, pub, "/health", host=f"{d.host}:{d.port}")
    assert r.stdout.decode().endswith("\n400 2"), r
    # envd's port: HTTP/1.1 only
    r = curl(d, pub, "/health", host=host_of(pub, 49983))
    assert r.stdout.decode().endswith("\n421 2"), r
    # each answer ends with GOAWAY (no error), after the stream's end
    c = Raw(d)
    c.send(PREFACE + SETTINGS + headers_frame(1, req_fields(host_of(pub, 8001))))
    fr = c.frames()
    c.close()
    assert answer_of(fr)[0] == 502
    assert goaway_of(fr)[:2] == (1, 0)
    # a browser gets the closed port as HTML, as over HTTP/1.1; a port
    # found closed a moment ago (on gvisor answered from memory) alike
    for _ in range(2):
        r = curl(d, pub, "/hello", "-A", "Mozilla/5.0", host=host_of(pub, 8002))
        out = r.stdout.decode()
        assert out.endswith("\n502 2") and "Closed Port Error" in out, out
    healthy(d)


def test_closed_port_after_streams_were_sent(world):
    """More streams behind the first request to a closed port: the 502 is
    on the first, GOAWAY names it, nothing else is answered."""
    d, pub, _ = world
    c = Raw(d)
    enc = hpack.Encoder()
    c.send(PREFACE + SETTINGS + headers_frame(1, req_fields(host_of(pub, 8003)), enc=enc)
           + headers_frame(3, req_fields(host_of(pub, 8003)), enc=enc))
    fr = c.frames()
    c.close()
    assert answer_of(fr)[0] == 502
    assert goaway_of(fr)[:2] == (1, 0)
    assert not [f for f in fr if f[2] == 3], fr
    healthy(d)


def test_auto_resume(world):
    """An h2 request to a paused sandbox with autoResume resumes it and is
    answered by the server that ran before the pause."""
    d, _, _ = world
    sb = d.create(timeout=120, lifecycle={"onTimeout": "pause", "autoResume": True})
    try:
        start_server(d, sb)
        r = d.request("POST", f"/sandboxes/{sb['sandboxID']}/pause", {}, timeout=120)
        assert r.status == 204, r
        assert d.request("GET", f"/sandboxes/{sb['sandboxID']}").json()["state"] == "paused"
        r = curl(d, sb, "/hello")
        out = r.stdout.decode()
        assert r.returncode == 0 and out.endswith("\n200 2"), (r.stderr, out)
        assert out.startswith(f"hello h2 {host_of(sb)}"), out
        assert d.request("GET", f"/sandboxes/{sb['sandboxID']}").json()["state"] == "running"
    finally:
        d.kill(sb["sandboxID"])
    healthy(d)


HOSTILE = {
    # a DATA frame before any request
    "data-first": lambda pub: PREFACE + SETTINGS + frame(0, 1, 1, b"x"),
    # one HEADERS frame of 100 KB
    "huge-headers": lambda pub: PREFACE + SETTINGS + frame(1, 0x5, 1, b"\x00" * 100000),
    # HEADERS without END_HEADERS, then an endless run of CONTINUATIONs
    "continuation-flood": lambda pub: PREFACE + SETTINGS + frame(1, 0x1, 1, hpack.Encoder().encode(
        req_fields(host_of(pub))[:3])) + b"".join(frame(9, 0, 1, b"\x40\x01a\x01b") for _ in range(200)),
    # an HPACK bomb: a 4000-byte entry, then index 62 a thousand times
    "hpack-bomb": lambda pub: PREFACE + SETTINGS + frame(1, 0x5, 1, b"\x40\x01x\x7f\xa1\x1e" + b"a" * 4000
                                                          + b"\xbe" * 1000),
    # a dynamic table size update above what any server allows
    "table-size": lambda pub: PREFACE + SETTINGS + frame(1, 0x5, 1, b"\x3f\xe1\xff\x7f" + hpack.Encoder().encode(
        req_fields(host_of(pub)))),
    # an index past the tables
    "bad-index": lambda pub: PREFACE + SETTINGS + frame(1, 0x5, 1, b"\xff\x10"),
    # a PUSH_PROMISE from the client
    "push": lambda pub: PREFACE + SETTINGS + frame(5, 0x4, 1, b"\x00\x00\x00\x02"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_first_requests_end_in_goaway(world, case):
    d, pub, _ = world
    sandbox_log(d, pub)
    c = Raw(d)
    try:
        c.send(HOSTILE[case](pub))
    except (BrokenPipeError, ConnectionResetError):
        pass
    fr = c.frames()
    c.close()
    last, code, why = goaway_of(fr)
    assert last == 0 and code != 0, (code, why)
    assert not [f for f in fr if f[0] in (0, 1)], fr
    assert sandbox_log(d, pub) == ""
    healthy(d)


def test_bad_preface_is_not_http2(world):
    """A preface that breaks off after "PRI * HTTP/2.0" is not HTTP/2: it goes
    to libmicrohttpd, which answers HTTP/1.1's error; nothing reaches a sandbox."""
    d, pub, _ = world
    ns_only(d)
    s = socket.create_connection((d.host, d.port), timeout=10)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
    s.settimeout(5)
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            got += b
    except OSError:
        pass
    s.close()
    assert not got.startswith(b"\x00"), got  # no HTTP/2 frames
    assert sandbox_log(d, pub) == ""
    healthy(d)


def test_a_later_stream_naming_another_sandbox_is_refused(world):
    d, pub, priv = world
    sandbox_log(d, pub)
    sandbox_log(d, priv)
    tok = [("e2b-traffic-access-token", priv["trafficAccessToken"])]
    for other in ([(":authority", host_of(priv))] + tok, [(":authority", host_of(pub, 8001))],
                  [(":authority", host_of(pub)), ("e2b-sandbox-id", priv["sandboxID"]),
                   ("e2b-sandbox-port", str(PORT))] + tok):
        c = Raw(d)
        enc = hpack.Encoder()
        c.send(PREFACE + SETTINGS + headers_frame(1, req_fields(host_of(pub)), enc=enc))
        # stream 1 answered first: a GOAWAY ends the relay, and the
        # answer of a stream still open is lost with it
        first = c.answered(1)
        fields = [(":method", "GET"), (":scheme", "http"), (":path", "/hello?other")] + other
        c.send(headers_frame(3, fields, enc=enc))
        fr = c.frames()
        c.close()
        assert goaway_of(fr)[:2] == (1, 1), fr
        assert answer_of(first, 1)[0] == 200
        assert not [f for f in fr if f[2] == 3], fr
        assert "other" not in sandbox_log(d, pub)
        assert sandbox_log(d, priv) == ""
    healthy(d)


def test_slow_clients_are_cut_at_the_unauthenticated_timeout(sandboxed_hutch, tmp_path):
    """The preface and nothing else: GOAWAY at --unauthenticated-timeout, as
    an HTTP/1.1 connection without a request is closed; a connection that
    sends no byte at all is closed too; the daemon serves others meanwhile."""
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0", "--unauthenticated-timeout", "2"])
    d.start()
    try:
        c = Raw(d)
        c.send(PREFACE + SETTINGS)
        quiet = socket.create_connection((d.host, d.port), timeout=10)
        healthy(d)
        t0 = time.monotonic()
        fr = c.frames(timeout=8)
        assert goaway_of(fr)[0] == 0, fr
        assert time.monotonic() - t0 < 6
        quiet.settimeout(8)
        try:
            assert quiet.recv(1) == b""
        except ConnectionResetError:
            pass
        c.close()
        quiet.close()
        healthy(d)
    finally:
        d.stop()
