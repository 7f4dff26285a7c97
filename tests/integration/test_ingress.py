"""Ingress edge cases over raw HTTP (docs/api.md "Sandbox ports").

One daemon with --sandbox-domain, one sandbox running
tests/helpers/ingress_raw_server.py, which answers canned (often broken)
responses and logs what reached it. What is checked: bad ports and ids get
clear errors; the Host forms that route and those that do not; control bytes
and request-smuggling shapes are refused before the sandbox sees them; a
broken or ambiguous response from the sandbox becomes a 502 or a cut
connection, and never a second response on the client's connection.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import hutchtest
from serveclient import HttpConn, ServeDaemon

DOMAIN = "sbx.hutch.test"
PORT = 8000
RAW = Path(__file__).resolve().parent.parent / "helpers" / "ingress_raw_server.py"


@pytest.fixture(scope="module")
def world(sandboxed_hutch, tmp_path_factory):
    data = tmp_path_factory.mktemp("ingress") / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--sandbox-domain", DOMAIN])
    d.start()
    try:
        sb = d.create(timeout=120)
        assert sb["domain"] == DOMAIN and sb["trafficAccessToken"] is None, sb
        assert d.upload(sb, "/tmp/raw.py", RAW.read_bytes()).status == 200
        end, _, err, _ = d.run(sb, f"(setsid python3 /tmp/raw.py {PORT} /tmp/raw.log >/dev/null 2>&1 &)")
        assert end.get("exitCode", 0) == 0, err
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if port_req(d, sb, "GET", "/ok").status == 200:
                break
            time.sleep(0.1)
        yield d, sb
    finally:
        d.stop()
        env = dict(os.environ, HUTCH_DATA_DIR=str(data))
        for sid in d.created:
            subprocess.run([str(sandboxed_hutch), "kill", sid], env=env, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def port_req(d, sb, method, path, port=PORT, extra=(), **kw):
    hdrs = [("E2b-Sandbox-Id", sb["sandboxID"]), ("E2b-Sandbox-Port", str(port)), *extra]
    return d.request(method, path, key="", headers=hdrs, **kw)


def raw(d, data: bytes, timeout=10) -> bytes:
    """Send raw bytes, read until the daemon closes or goes quiet."""
    with HttpConn(d.host, d.port, timeout=timeout) as c:
        c.sock.sendall(data)
        c.sock.settimeout(2)
        out = b""
        try:
            while True:
                b = c.sock.recv(65536)
                if not b:
                    break
                out += b
        except OSError:
            pass
        return out


def sandbox_log(d, sb) -> bytes:
    _, out, _, _ = d.run(sb, "cat /tmp/raw.log; : > /tmp/raw.log")
    return out


def test_bad_ports_and_ids(world):
    d, sb = world
    for bad in ["0", "65536", "99999999", "80x", "+80", "8 0", "0x50", "-1"]:
        r = port_req(d, sb, "GET", "/ok", port=bad)
        assert r.status == 400, (bad, r)
        assert "E2b-Sandbox-Port" in r.json()["message"], r
    # unknown and malformed ids: E2B's not-found 502, naming nothing else
    for sid in ["a" * 20, "UPPER" * 4, "x", "a" * 200]:
        r = d.request("GET", "/", key="", headers=[("E2b-Sandbox-Id", sid), ("E2b-Sandbox-Port", "8000")])
        assert r.status == 502, (sid, r)
        assert r.json()["message"] == "The sandbox was not found", r
        assert len(r.json()["sandboxId"]) <= 20
    # a closed port of a live sandbox
    r = port_req(d, sb, "GET", "/", port=9)
    assert r.status == 502 and r.json() == {"sandboxId": sb["sandboxID"], "port": 9, "code": 502,
                                            "message": "The sandbox is running but port is not open"}, r


def test_host_forms(world):
    d, sb = world
    sid = sb["sandboxID"]

    def host(h):
        return raw(d, f"GET /ok HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n".encode())

    for good in [f"{PORT}-{sid}.{DOMAIN}", f"{PORT}-{sid}.{DOMAIN}:{d.port}", f"{PORT}-{sid.upper()}.SBX.Hutch.TEST"]:
        out = host(good)
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"ok"), (good, out)
    # another domain, a bad port, no id: not a sandbox port (the control
    # plane, which wants an API key)
    for bad in [f"{PORT}-{sid}.other.test", f"0-{sid}.{DOMAIN}", f"70000-{sid}.{DOMAIN}",
                f"{PORT}-{sid}.{DOMAIN}.evil", f"{PORT}-{sid}{DOMAIN}", f"{PORT}-{sid[:-1]}.{DOMAIN}",
                f"{PORT}-{sid}.{DOMAIN}:x"]:
        out = host(bad)
        assert out.startswith(b"HTTP/1.1 401"), (bad, out)
    # two Host headers: refused, whichever would route
    out = raw(d, f"GET /ok HTTP/1.1\r\nHost: {PORT}-{sid}.{DOMAIN}\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert out.startswith(b"HTTP/1.1 400") and b"more than one Host" in out, out


def test_control_bytes_and_smuggling_are_refused_before_the_sandbox(world):
    d, sb = world
    sid = sb["sandboxID"]
    sandbox_log(d, sb)
    pre = f"E2b-Sandbox-Id: {sid}\r\nE2b-Sandbox-Port: {PORT}\r\nHost: x\r\n"
    cases = [
        f"GET /a%00b HTTP/1.1\r\n{pre}\r\n",
        f"GET /ok?q=%00 HTTP/1.1\r\n{pre}\r\n",
        f"POST /ok HTTP/1.1\r\n{pre}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        f"POST /ok HTTP/1.1\r\n{pre}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        f"POST /ok HTTP/1.1\r\n{pre}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        f"POST /ok HTTP/1.1\r\n{pre}Content-Length: +5\r\n\r\nhello",
        f"GET /ok HTTP/1.1\r\n{pre}X-A: a\rb\r\n\r\n",
    ]
    for c in cases:
        out = raw(d, c.encode())
        # a 400, or libmicrohttpd closing at once (a coding it cannot read)
        assert out.startswith(b"HTTP/1.1 400") or (out == b"" and "gzip" in c), (c, out)
    assert sandbox_log(d, sb) == b"", "a refused request reached the sandbox"


def test_pipelined_requests_stay_apart(world):
    d, sb = world
    sid = sb["sandboxID"]
    sandbox_log(d, sb)
    pre = f"E2b-Sandbox-Id: {sid}\r\nE2b-Sandbox-Port: {PORT}\r\nHost: x\r\n"
    # a body that looks like a request, a chunked body, then a plain GET, on one connection
    inner = b"GET /smuggled HTTP/1.1\r\nHost: y\r\n\r\n"
    data = (f"POST /ok HTTP/1.1\r\n{pre}Content-Length: {len(inner)}\r\n\r\n".encode() + inner
            + f"POST /ok HTTP/1.1\r\n{pre}Transfer-Encoding: chunked\r\n\r\n".encode()
            + b"5\r\nhello\r\n0\r\n\r\n" + f"GET /ok?third HTTP/1.1\r\n{pre}Connection: close\r\n\r\n".encode())
    out = raw(d, data)
    assert out.count(b"HTTP/1.1 200") == 3, out
    log = sandbox_log(d, sb)
    heads = [e for e in log.split(b"\n=====\n") if e]
    assert len(heads) == 3, log
    assert heads[0].startswith(b"POST /ok HTTP/1.1") and heads[0].endswith(b"GET /smuggled HTTP/1.1\r\nHost: y\r\n\r\n")
    assert heads[1].startswith(b"POST /ok HTTP/1.1") and b"Transfer-Encoding: chunked" in heads[1]
    assert heads[1].endswith(b"5\r\nhello\r\n0\r\n\r\n"), heads[1]
    assert heads[2].startswith(b"GET /ok?third HTTP/1.1")
    for h in heads:
        head = h.split(b"\r\n\r\n")[0]
        assert head.count(b"\r\nHost: ") == 1 and b"e2b-sandbox" not in head.lower(), h


ECHO_101 = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
while True:
    c, _ = s.accept(); buf = b""
    while b"\r\n\r\n" not in buf:
        buf += c.recv(4096)
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
    c.sendall(buf.split(b"\r\n\r\n", 1)[1])
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        c.sendall(b)
    c.close()
"""


def test_upgraded_connection_carries_megabytes_both_ways(world):
    """An upgraded connection is relayed a bounded slice per loop turn
    (daemon/ingress.c, UPGRADED_TURN) and the rest in later turns: 6 MiB,
    several slices, go to the sandbox and come back whole and in order."""
    import threading
    d, sb = world
    assert d.upload(sb, "/tmp/echo101.py", ECHO_101.encode()).status == 200
    end, _, err, _ = d.run(sb, "(setsid python3 /tmp/echo101.py 8001 >/dev/null 2>&1 &)")
    assert end.get("exitCode", 0) == 0, err
    blob = os.urandom(6 << 20)
    req = (f"GET /up HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {sb['sandboxID']}\r\nE2b-Sandbox-Port: 8001\r\n"
           "Upgrade: echo\r\nConnection: Upgrade\r\n\r\n").encode()
    for _ in range(150):
        c = HttpConn(d.host, d.port, timeout=30)
        c.sock.sendall(req)
        head = b""
        while b"\r\n\r\n" not in head:
            got = c.sock.recv(4096)
            assert got, head
            head += got
        if head.startswith(b"HTTP/1.1 101"):
            break
        c.close()
        time.sleep(0.1)   # the server in the sandbox is not listening yet: 502, try again
    assert head.startswith(b"HTTP/1.1 101"), head
    with c:
        back = bytearray(head.split(b"\r\n\r\n", 1)[1])
        sender = threading.Thread(target=c.sock.sendall, args=(blob,))
        sender.start()
        while len(back) < len(blob):
            got = c.sock.recv(1 << 20)
            assert got, len(back)
            back += got
        sender.join(30)
    assert bytes(back) == blob


@pytest.mark.parametrize("path", ["/two-cl", "/cl-te", "/bare-lf", "/fold", "/nul", "/garbage"])
def test_bad_responses_are_502_and_the_connection_stays_in_step(world, path):
    d, sb = world
    with d.conn() as c:
        hdrs = [("E2b-Sandbox-Id", sb["sandboxID"]), ("E2b-Sandbox-Port", str(PORT))]
        r = c.request("GET", path, headers=hdrs)
        assert r.status == 502, (path, r)
        assert "no valid HTTP response" in r.json()["message"], r
        r2 = c.request("GET", "/ok", headers=hdrs)
        assert r2.status == 200 and r2.body == b"ok", r2


def test_response_framing_is_the_daemons(world):
    d, sb = world
    hdrs = [("E2b-Sandbox-Id", sb["sandboxID"]), ("E2b-Sandbox-Port", str(PORT))]
    with d.conn() as c:
        # bytes after the body are dropped: the next answer is the next request's
        r = c.request("GET", "/extra", headers=hdrs)
        assert r.status == 200 and r.body == b"hi", r
        r = c.request("GET", "/interim", headers=hdrs)
        assert r.status == 200 and r.body == b"ok", r
        r = c.request("GET", "/close", headers=hdrs)
        assert r.status == 200 and r.body == b"until-close" and r.header("X-Mode") == "close", r
        r = c.request("GET", "/chunked-trailer", headers=hdrs)
        assert r.status == 200 and r.body == b"abc", r
        r = c.request("GET", "/hop", headers=hdrs)
        assert r.status == 200 and r.header("X-Kept") == "1", r
        assert r.header("X-Secret") is None and r.header("Keep-Alive") is None, r
        r = c.request("GET", "/ok", headers=hdrs)
        assert r.body == b"ok"
    # a broken chunk mid-body: the response is cut, not completed
    out = raw(d, f"GET /chunk-bad HTTP/1.1\r\nE2b-Sandbox-Id: {sb['sandboxID']}\r\nE2b-Sandbox-Port: {PORT}\r\n"
                 f"Host: x\r\n\r\n".encode())
    assert out.startswith(b"HTTP/1.1 200") and not out.endswith(b"0\r\n\r\n"), out


def test_ports_over_tls_and_a_websocket_through_it(sandboxed_hutch, tmp_path):
    """With tls-cert/tls-key the sandbox ports are served over HTTPS on the
    same port, upgrades included (libmicrohttpd relays the TLS side)."""
    import http.client
    import json
    import socket
    import ssl
    from serveclient import free_port, websocket_echo
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=hutch-test",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:*.sbx.hutch.test"], check=True, capture_output=True)
    port = free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen([str(sandboxed_hutch), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
                             "--pool-size", "0", "--tls-cert", str(cert), "--tls-key", str(key)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = ssl.create_default_context(cafile=str(cert))
    d = ServeDaemon(sandboxed_hutch, data)
    d.port = port
    d.proc = proc

    def https(method, path, body=None, headers=None):
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()
    sid = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if https("GET", "/health")[0] == 200:
                    break
            except (OSError, ssl.SSLError):
                time.sleep(0.1)
        api = (data / "api-key").read_text().strip()
        st, body = https("POST", "/sandboxes", json.dumps({"templateID": "base"}),
                         {"X-API-KEY": api, "Content-Type": "application/json"})
        assert st == 201, body
        sb = json.loads(body)
        sid = sb["sandboxID"]
        envd = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb["envdAccessToken"]}
        srv = (Path(__file__).resolve().parent.parent / "e2b" / "fixtures" / "ingress_server.py").read_bytes()
        st, _ = https("POST", "/files?path=/tmp/s.py", srv, {**envd, "Content-Type": "application/octet-stream"})
        assert st == 200
        from serveclient import envelope
        st, _ = https("POST", "/process.Process/Start",
                      envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "(setsid python3 /tmp/s.py 8000 "
                                                                              ">/dev/null 2>&1 &); sleep 1"]}}),
                      {**envd, "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})
        assert st == 200
        port_h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000"}
        assert https("GET", "/", None, port_h) == (200, b"hello from the sandbox\n")
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")
        websocket_echo(s, f"Host: 8000-{sid}.sbx.hutch.test\r\nE2b-Sandbox-Id: {sid}\r\n"
                          f"E2b-Sandbox-Port: 8000\r\n", (b"over tls",))
        s.close()
        assert https("GET", "/", None, port_h)[0] == 200
    finally:
        if sid:
            https("DELETE", f"/sandboxes/{sid}", headers={"X-API-KEY": api})
        proc.terminate()
        proc.wait(20)


def test_sandbox_domain_certificate_chosen_by_sni(sandboxed_hutch, tmp_path):
    """--sandbox-tls-cert: a ClientHello whose SNI names a sandbox port,
    <port>-<id>.<sandbox-domain>, gets that certificate; any other name, or
    none, gets tls-cert's. Both serve HTTP after the handshake. A pair that
    does not match, or one the settings cannot use, refuses the start."""
    import socket
    import ssl
    from serveclient import free_port

    def mkcert(name, san):
        cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                        "-addext", f"subjectAltName={san}"], check=True, capture_output=True)
        return cert, key
    api_cert, api_key = mkcert("api", "IP:127.0.0.1,DNS:api.hutch.test")
    sbx_cert, sbx_key = mkcert("sbx", f"DNS:*.{DOMAIN}")
    port = free_port()
    proc = subprocess.Popen([str(sandboxed_hutch), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir",
                             str(tmp_path / "data"), "--pool-size", "0", "--sandbox-domain", f"{DOMAIN}:{port}",
                             "--tls-cert", str(api_cert), "--tls-key", str(api_key),
                             "--sandbox-tls-cert", str(sbx_cert), "--sandbox-tls-key", str(sbx_key)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def hello(sni, cafile):
        """The certificate served for sni (None: no SNI), verified against
        cafile, and the answer to a request naming the same host."""
        ctx = ssl.create_default_context(cafile=str(cafile))
        ctx.check_hostname = sni is not None
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                             server_hostname=sni) as s:
            der = s.getpeercert(binary_form=True)
            s.sendall(f"GET /health HTTP/1.1\r\nHost: {sni or '127.0.0.1'}:{port}\r\nConnection: close\r\n\r\n"
                      .encode())
            out = b""
            while chunk := s.recv(4096):
                out += chunk
        return der, out

    der = {p: ssl.PEM_cert_to_DER_cert(p.read_text()) for p in (api_cert, sbx_cert)}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                got, out = hello(None, api_cert)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
                time.sleep(0.1)
        assert got == der[api_cert] and out.startswith(b"HTTP/1.1 200"), out[:200]
        got, out = hello("api.hutch.test", api_cert)
        assert got == der[api_cert] and out.startswith(b"HTTP/1.1 200"), out[:200]
        # a sandbox port's name: the sandbox certificate, and ingress answers
        # (no such sandbox: E2B's JSON error, not a TLS failure)
        name = f"8000-{'a' * 4}{'0' * 16}.{DOMAIN.upper()}"
        got, out = hello(name, sbx_cert)
        assert got == der[sbx_cert], "the sandbox domain's certificate was not served"
        assert out.startswith(b"HTTP/1.1 ") and b'"message"' in out, out[:300]
        # a name under the domain that is not a sandbox port's: the API's
        ctx = ssl.create_default_context(cafile=str(sbx_cert))
        with pytest.raises(ssl.SSLCertVerificationError):
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                 server_hostname=f"www.{DOMAIN}"):
                pass
    finally:
        proc.terminate()
        proc.wait(20)
    other_cert, other_key = mkcert("other", f"DNS:*.{DOMAIN}")
    tls = ["--tls-cert", str(api_cert), "--tls-key", str(api_key)]
    for i, (args, needle) in enumerate([
            ([*tls, "--sandbox-domain", DOMAIN, "--sandbox-tls-cert", str(sbx_cert)], "go together"),
            (["--sandbox-domain", DOMAIN, "--sandbox-tls-cert", str(sbx_cert), "--sandbox-tls-key", str(sbx_key)],
             "needs tls-cert"),
            ([*tls, "--sandbox-tls-cert", str(sbx_cert), "--sandbox-tls-key", str(sbx_key)], "needs sandbox-domain"),
            ([*tls, "--sandbox-domain", DOMAIN, "--sandbox-tls-cert", str(sbx_cert), "--sandbox-tls-key",
              str(other_key)], "sandbox-tls-cert:"),
            ([*tls, "--sandbox-domain", DOMAIN, "--sandbox-tls-cert", str(tmp_path / "nosuch.pem"),
              "--sandbox-tls-key", str(sbx_key)], "nosuch.pem")]):
        data = tmp_path / f"bad{i}"
        out = subprocess.run([str(sandboxed_hutch), "serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                              str(data), *args], capture_output=True, timeout=30)
        assert out.returncode != 0 and needle in out.stderr.decode(), (args, out.stderr[-500:])
        assert not data.exists() or not any(data.iterdir()), list(data.iterdir())
