"""A byte-exact client for `hutch serve` (tests/integration/test_serve_protocol.py).

Standard library only: every request is written by hand on a socket, so a
test controls the exact bytes (chunked bodies, odd headers, broken Connect
envelopes) and sees the exact answer (status, headers, raw body).

    d = ServeDaemon(hutch_bin, data_dir); d.start(); ...; d.stop()
    r = d.request("GET", "/health")          # -> Response(status, headers, body)
    frames = parse_frames(r.body)            # Connect envelopes of a stream
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union
from urllib.parse import quote, urlencode

ENVD_PORT = "49983"
FLAG_COMPRESSED = 0x01
FLAG_END = 0x02


# --------------------------------------------------------------------------
# HTTP/1.1 on a raw socket
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Response:
    status: int
    reason: str
    headers: Dict[str, str]          # lowercased names (last one wins)
    raw_headers: List[Tuple[str, str]]
    body: bytes
    elapsed: float = 0.0

    def header(self, name: str, default=None):
        return self.headers.get(name.lower(), default)

    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:
        b = self.body if len(self.body) < 600 else self.body[:600] + b"..."
        return f"<Response {self.status} {self.reason} {b!r}>"


class ConnectionClosed(Exception):
    """The server closed the connection before a complete response."""


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionClosed(f"connection closed in a line: {self.buf[:200]!r}")
        i = self.buf.index(b"\r\n")
        out, self.buf = self.buf[:i], self.buf[i + 2:]
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionClosed(f"connection closed after {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def until_eof(self) -> bytes:
        while self._fill():
            pass
        out, self.buf = self.buf, b""
        return out


def _read_head(rd: _Reader):
    line = rd.line()
    while line == b"":          # tolerate stray CRLF
        line = rd.line()
    parts = line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise AssertionError(f"not an HTTP status line: {line!r}")
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    raw = []
    while True:
        h = rd.line()
        if h == b"":
            break
        k, _, v = h.decode("latin-1").partition(":")
        raw.append((k.strip(), v.strip()))
    return status, reason, raw


def _read_body(rd: _Reader, method: str, status: int, headers: Dict[str, str], on_chunk=None) -> bytes:
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b""
    te = headers.get("transfer-encoding", "").lower()
    if "chunked" in te:
        out = bytearray()
        while True:
            size_line = rd.line().split(b";")[0].strip()
            n = int(size_line, 16)
            if n == 0:
                while rd.line() != b"":   # trailers
                    pass
                return bytes(out)
            data = rd.exactly(n)
            rd.exactly(2)
            out += data
            if on_chunk:
                on_chunk(bytes(out))
    if "content-length" in headers:
        return rd.exactly(int(headers["content-length"]))
    return rd.until_eof()


class HttpConn:
    """One keep-alive connection. request() writes exact bytes and reads one response."""

    def __init__(self, host: str, port: int, timeout: float = 30, tls=None):
        """tls: an ssl.SSLContext to speak HTTPS with (its name checked against host)."""
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname=host)
        self.rd = _Reader(self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_head(self):
        """Status line and headers only: (status, reason, [(name, value)])."""
        return _read_head(self.rd)

    def read_response(self, method: str = "GET", on_chunk=None) -> Response:
        t0 = time.monotonic()
        status, reason, raw = _read_head(self.rd)
        headers = {k.lower(): v for k, v in raw}
        body = _read_body(self.rd, method, status, headers, on_chunk)
        return Response(status, reason, headers, raw, body, time.monotonic() - t0)

    def request(self, method: str, path: str, body: Optional[bytes] = None,
                headers: Optional[Iterable[Tuple[str, str]]] = None, chunked: bool = False,
                chunk_size: int = 65536, content_length: Optional[int] = None,
                on_chunk=None) -> Response:
        hdrs = list(headers.items() if isinstance(headers, dict) else (headers or []))
        names = {k.lower() for k, _ in hdrs}
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        for k, v in hdrs:
            head.append(f"{k}: {v}")
        if body is not None and chunked:
            if "transfer-encoding" not in names:
                head.append("Transfer-Encoding: chunked")
        elif body is not None or content_length is not None:
            if "content-length" not in names:
                head.append(f"Content-Length: {content_length if content_length is not None else len(body)}")
        t0 = time.monotonic()
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if body is not None and chunked:
            out = bytearray(data)
            for i in range(0, len(body), chunk_size):
                part = body[i:i + chunk_size]
                out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
            out += b"0\r\n\r\n"
            data = bytes(out)
        elif body is not None:
            data += body
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server may answer early (413) and close: read that answer
        r = self.read_response(method, on_chunk)
        r.elapsed = time.monotonic() - t0
        return r


# --------------------------------------------------------------------------
# Connect protocol
# --------------------------------------------------------------------------

def envelope(msg: Union[dict, bytes], flags: int = 0, length: Optional[int] = None) -> bytes:
    data = msg if isinstance(msg, (bytes, bytearray)) else json.dumps(msg).encode()
    n = len(data) if length is None else length
    return struct.pack(">BI", flags, n) + bytes(data)


def parse_frames(body: bytes, strict: bool = True) -> List[Tuple[int, object]]:
    """[(flags, json)] of a Connect streaming body. strict: the body must be
    exactly a sequence of whole frames."""
    out = []
    i = 0
    while i < len(body):
        if len(body) - i < 5:
            if strict:
                raise AssertionError(f"trailing {len(body) - i} bytes: {body[i:]!r}")
            break
        flags, n = struct.unpack(">BI", body[i:i + 5])
        if len(body) - i - 5 < n:
            if strict:
                raise AssertionError(f"truncated frame at {i}: wants {n}, has {len(body) - i - 5}")
            break
        payload = body[i + 5:i + 5 + n]
        out.append((flags, json.loads(payload)))
        i += 5 + n
    return out


def frame_events(frames) -> List[str]:
    """Event kinds of process frames: start/data/end/keepalive, 'END' for 0x02."""
    kinds = []
    for flags, m in frames:
        if flags & FLAG_END:
            kinds.append("END")
        else:
            ev = m.get("event", m)
            kinds.append(next(iter(ev)) if ev else "?")
    return kinds


def stdout_of(frames, which: str = "stdout") -> bytes:
    out = b""
    for flags, m in frames:
        if flags & FLAG_END:
            continue
        d = m.get("event", {}).get("data", {})
        if which in d:
            out += base64.b64decode(d[which])
    return out


def basic_auth(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def sign(path: str, op: str, user: str, token: str, exp: Optional[int] = None) -> str:
    """docs/protocol.md §c.6: v1_ + base64(sha256("path:op:user:token[:exp]")) without padding."""
    raw = f"{path}:{op}:{user}:{token}"
    if exp is not None:
        raw += f":{exp}"
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")


def multipart(parts: List[Tuple[str, Optional[str], bytes]],
              boundary: str = "----formdata-hutch-7d1b2c") -> Tuple[bytes, str]:
    """parts: (field name, filename or None, data) -> (body, content type)."""
    out = bytearray()
    for name, filename, data in parts:
        out += f"--{boundary}\r\n".encode()
        disp = f'form-data; name="{name}"'
        if filename is not None:
            disp += f'; filename="{filename}"'
        out += f"Content-Disposition: {disp}\r\n".encode()
        if filename is not None:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


# --------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------

def websocket_echo(sock: socket.socket, head_lines: str, payloads: Iterable[bytes]) -> None:
    """Open a WebSocket on sock (GET /ws with head_lines, "Name: value\\r\\n"
    each), check the 101 and its Sec-WebSocket-Accept, then send each payload
    as a masked text frame and check that it comes back (an echo server)."""
    import os
    k = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /ws HTTP/1.1\r\n{head_lines}Upgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {k}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(4096)
        assert got, buf
        buf += got
    head, buf = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    accept = base64.b64encode(hashlib.sha1((k + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert accept in head, head
    for payload in payloads:
        mask = os.urandom(4)
        sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask +
                     bytes(c ^ mask[i % 4] for i, c in enumerate(payload)))
        while len(buf) < 2 + len(payload):
            got = sock.recv(4096)
            assert got, buf
            buf += got
        assert buf[:2 + len(payload)] == bytes([0x81, len(payload)]) + payload, buf
        buf = buf[2 + len(payload):]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class ServeDaemon:
    """`hutch serve` in the foreground on a free port with its own data dir.
    Tracks the sandboxes it creates (create()) so stop() can DELETE them."""

    def __init__(self, hutch_bin: Path, data_dir: Path, extra_args: Iterable[str] = (),
                 host: str = "127.0.0.1", cmd_prefix: Iterable[str] = (), tls=None):
        """host: the address to listen on and talk to; cmd_prefix: argv put
        before hutch (e.g. nsenter into a test netns); tls: an ssl.SSLContext
        when extra_args give --tls-cert."""
        self.host = host
        self.tls = tls
        self.cmd_prefix = list(cmd_prefix)
        self.hutch_bin = Path(hutch_bin)
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args)
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None
        self.key = ""
        self.created: Dict[str, str] = {}   # id -> api key that owns it
        self.log_path = self.data_dir.parent / (self.data_dir.name + "-serve.log")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def __iter__(self):
        """`url, api_key, data_dir = daemon`"""
        return iter((self.url, self.key, self.data_dir))

    def start(self, timeout: float = 30) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(5):
            self.port = free_port()
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                [*self.cmd_prefix, str(self.hutch_bin), "serve", "--listen", f"{self.host}:{self.port}",
                 "--data-dir", str(self.data_dir), *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    with HttpConn(self.host, self.port, timeout=5, tls=self.tls) as c:
                        r = c.request("GET", "/health")
                    if r.status == 200:
                        self.key = (self.data_dir / "api-key").read_text().strip()
                        return
                except (OSError, ConnectionClosed):
                    pass  # not listening yet, or closing on its way out
                time.sleep(0.1)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        raise AssertionError(f"hutch serve did not become ready; log: {self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def threads(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise AssertionError("no Threads line")

    def conn(self, timeout: float = 30) -> HttpConn:
        return HttpConn(self.host, self.port, timeout=timeout, tls=self.tls)

    def request(self, method: str, path: str, body=None, headers=None, key: Optional[str] = None,
                timeout: float = 30, **kw) -> Response:
        """One request on a fresh connection. body: bytes, or a JSON-able
        object (sent as application/json). key: X-API-KEY (None = the
        default key, "" = none)."""
        hdrs = list(headers.items() if isinstance(headers, dict) else (headers or []))
        if key is None:
            key = self.key
        if key:
            hdrs.append(("X-API-KEY", key))
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
            if not any(k.lower() == "content-type" for k, _ in hdrs):
                hdrs.append(("Content-Type", "application/json"))
        with self.conn(timeout) as c:
            return c.request(method, path, body=body, headers=hdrs, **kw)

    # ---------------------------------------------------------- control plane
    def create(self, key: Optional[str] = None, **fields) -> dict:
        body = {"templateID": "base", **fields}
        r = self.request("POST", "/v2/sandboxes", body, key=key, timeout=120)
        assert r.status == 201, r
        sb = r.json()
        self.created[sb["sandboxID"]] = key or self.key
        return sb

    def kill(self, sid: str, key: Optional[str] = None) -> Response:
        return self.request("DELETE", f"/sandboxes/{sid}", key=key or self.created.get(sid))

    def list_ids(self, key: Optional[str] = None, query: str = "") -> List[str]:
        r = self.request("GET", "/v2/sandboxes" + query, key=key)
        assert r.status == 200, r
        return sorted(s["sandboxID"] for s in r.json())

    # -------------------------------------------------------------- envd plane
    def envd_headers(self, sb: dict, token: Optional[str] = "same", user: Optional[str] = None,
                     ctype: Optional[str] = None, extra=None) -> List[Tuple[str, str]]:
        h = [("E2b-Sandbox-Id", sb["sandboxID"]), ("E2b-Sandbox-Port", ENVD_PORT)]
        if token == "same":
            token = sb["envdAccessToken"]
        if token is not None:
            h.append(("X-Access-Token", token))
        if user is not None:
            h.append(("Authorization", basic_auth(user)))
        if ctype:
            h.append(("Content-Type", ctype))
        h.append(("Connect-Protocol-Version", "1"))
        if extra:
            h += list(extra.items() if isinstance(extra, dict) else extra)
        return h

    def unary(self, sb: dict, rpc: str, msg, timeout: float = 60, **hkw) -> Response:
        body = msg if isinstance(msg, (bytes, bytearray)) else json.dumps(msg).encode()
        hkw.setdefault("ctype", "application/json")
        return self.request("POST", "/" + rpc, body, headers=self.envd_headers(sb, **hkw), key="",
                            timeout=timeout)

    def stream(self, sb: dict, rpc: str, msg, timeout: float = 60, raw_body: Optional[bytes] = None,
               **hkw) -> Response:
        body = raw_body if raw_body is not None else envelope(msg)
        hkw.setdefault("ctype", "application/connect+json")
        return self.request("POST", "/" + rpc, body, headers=self.envd_headers(sb, **hkw), key="",
                            timeout=timeout)

    def run(self, sb: dict, cmd: str, user: Optional[str] = None, timeout: float = 120):
        """sh -c CMD in the sandbox: (exit end event, stdout, stderr, frames)."""
        r = self.stream(sb, "process.Process/Start",
                        {"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": False},
                        user=user, timeout=timeout)
        assert r.status == 200, r
        frames = parse_frames(r.body)
        assert frames and frames[-1][0] == FLAG_END, frames
        assert frames[-1][1] == {}, frames[-1]
        ends = [m["event"]["end"] for f, m in frames if not f & FLAG_END and "end" in m.get("event", {})]
        assert len(ends) == 1, frames
        return ends[0], stdout_of(frames), stdout_of(frames, "stderr"), frames

    def files_path(self, path: str, **q) -> str:
        return "/files?" + urlencode({"path": path, **q}, quote_via=quote)

    def upload(self, sb: dict, path: str, data: bytes, user: Optional[str] = None, timeout: float = 30) -> Response:
        """POST /files?path=PATH with the bytes as application/octet-stream."""
        return self.request("POST", self.files_path(path), data, key="", timeout=timeout,
                            headers=self.envd_headers(sb, user=user, ctype="application/octet-stream"))

    def stop(self) -> List[str]:
        """DELETE every sandbox this daemon created, then SIGTERM it.
        Returns the ids whose DELETE did not answer 204/404."""
        bad = []
        if self.alive():
            for sid, key in list(self.created.items()):
                try:
                    r = self.request("DELETE", f"/sandboxes/{sid}", key=key, timeout=60)
                    if r.status not in (204, 404):
                        bad.append(sid)
                except OSError:
                    bad.append(sid)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
        return bad
