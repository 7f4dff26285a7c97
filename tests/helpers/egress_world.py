#!/usr/bin/env python3
"""The "world" of the egress test network (tests/helpers/egressnet.py starts it).

Runs inside the world netns, standard library only, every server threaded:

- DNS on UDP and TCP port 53 of the DNS address, answering from a zone that
  the control socket can change at run time, logging every query;
- on each sink address: HTTP on 80, HTTPS on 443, a raw TCP echo on 9000,
  with counters per sink and protocol;
- a line-based JSON control socket (Unix, in the harness's temp dir).

    python3 egress_world.py --config FILE

FILE is JSON written by the harness:

    {"control": "/tmp/.../control.sock",
     "dns": "198.51.100.53",
     "zone": {NAME: ENTRY, ...},
     "sinks": {"ok": {"addr": "198.51.100.10", "cert": PEM, "key": PEM}, ...},
     "alt_certs": [{"names": ["untrusted.example.test"], "cert": PEM, "key": PEM}]}

A zone ENTRY is one of (names are matched case-insensitively, no trailing dot;
a name "*.x.test" matches every name below x.test that has no entry itself):

    ["198.51.100.10", "2001:db8::1"]       A and/or AAAA records (TTL 60)
    {"a": [...], "aaaa": [...], "ttl": 5}  the same, explicit
    {"rebind": ["198.51.100.10", "10.77.0.5"]}
        TTL 0; each A query gets the next IPv4 address of the list, starting
        with the first (AAAA queries likewise cycle over its IPv6 addresses,
        with a counter of their own; no IPv6 address -> empty answer)
    {"cname": "ok.example.test"}           a CNAME (followed within the zone)
    {"rcode": 2}                           answer with that rcode (2 SERVFAIL, 5 REFUSED)
    {"drop": true}                         never answer (the query is still logged)

Unknown names get NXDOMAIN; known names without records of the asked type get
an empty NOERROR answer.

Control requests, one JSON object per line, one JSON line answers each:

    {"op": "ping"}
    {"op": "stats"}     -> {"ok": true, "sinks": {...}, "dns": {...}, "requests": [...]}
    {"op": "reset"}     counters, logs and rebind positions back to zero
    {"op": "set_zone", "zone": {NAME: ENTRY or null}, "replace": false}
    {"op": "reset_zone"}   back to the zone of the config file
    {"op": "get_zone"}

The process prints one line "READY {json}" on stdout once every server is
listening, and exits when its standard input reaches EOF (the harness died)
or on SIGTERM.
"""

from __future__ import annotations

import argparse
import base64
import copy
import ipaddress
import json
import os
import signal
import socket
import socketserver
import ssl
import struct
import sys
import threading
import time
import traceback
from urllib.parse import parse_qs, urlsplit

IO_TIMEOUT = 20.0          # per socket operation on every server socket
MAX_HEAD = 64 * 1024       # request line + headers
MAX_BODY = 64 * 1024 * 1024
MAX_BYTES_REPLY = 256 * 1024 * 1024
LOG_LIMIT = 2000           # entries kept in each log
DEFAULT_TTL = 60

QTYPES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 15: "MX", 16: "TXT",
          28: "AAAA", 33: "SRV", 64: "SVCB", 65: "HTTPS", 255: "ANY"}
T_A, T_CNAME, T_AAAA, T_ANY = 1, 5, 28, 255


def log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} world: {msg}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------
# Zone
# --------------------------------------------------------------------------

def norm_name(name: str) -> str:
    return name.strip().rstrip(".").lower()


def norm_entry(entry):
    """Validate one zone entry; returns the canonical dict. Raises ValueError."""
    if isinstance(entry, str):
        entry = [entry]
    if isinstance(entry, list):
        entry = {"addrs": entry}
    if not isinstance(entry, dict):
        raise ValueError(f"bad zone entry {entry!r}")
    known = {"a", "aaaa", "addrs", "ttl", "cname", "rebind", "rcode", "drop"}
    extra = set(entry) - known
    if extra:
        raise ValueError(f"unknown keys in zone entry: {sorted(extra)}")
    out = {"a": [], "aaaa": [], "ttl": int(entry.get("ttl", DEFAULT_TTL)),
           "cname": None, "rebind": None, "rcode": int(entry.get("rcode", 0)),
           "drop": bool(entry.get("drop", False))}
    if not 0 <= out["rcode"] <= 15:
        raise ValueError("rcode must be 0..15")
    addrs = list(entry.get("addrs", [])) + list(entry.get("a", [])) + list(entry.get("aaaa", []))
    for a in addrs:
        ip = ipaddress.ip_address(a)
        out["a" if ip.version == 4 else "aaaa"].append(str(ip))
    if entry.get("cname") is not None:
        out["cname"] = norm_name(str(entry["cname"]))
        if addrs:
            raise ValueError("a CNAME entry cannot have addresses")
    if entry.get("rebind") is not None:
        rb = [str(ipaddress.ip_address(a)) for a in entry["rebind"]]
        if not rb:
            raise ValueError("rebind needs addresses")
        out["rebind"] = rb
        out["ttl"] = int(entry.get("ttl", 0))
    return out


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.split("."):
        if not label:
            continue
        b = label.encode("latin-1")
        out += bytes([len(b)]) + b
    return out + b"\x00"


def parse_name(buf: bytes, off: int):
    """-> (list of label bytes, offset after the name). Raises ValueError."""
    labels, end, jumps, total = [], None, 0, 0
    while True:
        if off >= len(buf):
            raise ValueError("name runs past the packet")
        n = buf[off]
        if n == 0:
            off += 1
            break
        if n & 0xC0 == 0xC0:
            if off + 1 >= len(buf):
                raise ValueError("truncated pointer")
            if end is None:
                end = off + 2
            jumps += 1
            if jumps > 16:
                raise ValueError("pointer loop")
            off = ((n & 0x3F) << 8) | buf[off + 1]
            continue
        if n & 0xC0:
            raise ValueError("bad label type")
        label = buf[off + 1:off + 1 + n]
        if len(label) != n:
            raise ValueError("truncated label")
        total += n + 1
        if total > 255:
            raise ValueError("name too long")
        labels.append(label)
        off += 1 + n
    return labels, (end if end is not None else off)


def rr(owner: str, rtype: int, ttl: int, rdata: bytes) -> bytes:
    return encode_name(owner) + struct.pack("!HHIH", rtype, 1, ttl, len(rdata)) + rdata


# --------------------------------------------------------------------------
# Shared state
# --------------------------------------------------------------------------

def _proto_counters():
    return {
        "http": {"connections": 0, "bytes": 0, "requests": 0},
        "https": {"connections": 0, "bytes": 0, "requests": 0,
                  "handshakes": 0, "tls_errors": 0, "last_tls_error": None},
        "echo": {"connections": 0, "bytes": 0},
    }


class State:
    def __init__(self, cfg):
        self.lock = threading.Lock()
        self.cfg = cfg
        self.initial_zone = {norm_name(k): norm_entry(v) for k, v in cfg.get("zone", {}).items()}
        self.zone = copy.deepcopy(self.initial_zone)
        self.sink_addrs = {name: s["addr"] for name, s in cfg["sinks"].items()}
        self._reset_locked()

    def _reset_locked(self):
        self.rebind_pos = {}
        self.dns_log = []
        self.dns_counts = {"udp": 0, "tcp": 0, "malformed": 0}
        self.requests = []
        self.counters = {name: _proto_counters() for name in self.sink_addrs}

    def reset(self):
        with self.lock:
            self._reset_locked()

    def add(self, sink, proto, key, n=1):
        with self.lock:
            self.counters[sink][proto][key] += n

    def set(self, sink, proto, key, value):
        with self.lock:
            self.counters[sink][proto][key] = value

    def log_request(self, entry):
        with self.lock:
            self.requests.append(entry)
            del self.requests[:-LOG_LIMIT]

    def log_dns(self, entry):
        with self.lock:
            self.dns_log.append(entry)
            del self.dns_log[:-LOG_LIMIT]
            if entry.get("malformed"):
                self.dns_counts["malformed"] += 1
            else:
                self.dns_counts[entry["transport"]] += 1

    def snapshot(self):
        with self.lock:
            sinks = {}
            for name, addr in self.sink_addrs.items():
                s = copy.deepcopy(self.counters[name])
                s["addr"] = addr
                sinks[name] = s
            return {"sinks": sinks,
                    "dns": {"queries": copy.deepcopy(self.dns_log),
                            "counts": dict(self.dns_counts)},
                    "requests": copy.deepcopy(self.requests)}

    def set_zone(self, entries, replace=False):
        new = {}
        for k, v in (entries or {}).items():
            new[norm_name(k)] = None if v is None else norm_entry(v)
        with self.lock:
            if replace:
                self.zone = {}
            for k, v in new.items():
                if v is None:
                    self.zone.pop(k, None)
                else:
                    self.zone[k] = v
                self.rebind_pos = {key: p for key, p in self.rebind_pos.items() if key[0] != k}

    def reset_zone(self):
        with self.lock:
            self.zone = copy.deepcopy(self.initial_zone)
            self.rebind_pos = {}

    # --- resolution, under the lock ---------------------------------------

    def _lookup(self, name):
        e = self.zone.get(name)
        if e is not None:
            return name, e
        parts = name.split(".")
        for i in range(1, len(parts)):
            key = "*." + ".".join(parts[i:])
            e = self.zone.get(key)
            if e is not None:
                return key, e
        return None, None

    def resolve(self, name, qtype):
        """-> (rcode, [(owner, type, ttl, value)]) or None to drop."""
        with self.lock:
            answers = []
            cur = name
            for hop in range(10):
                key, e = self._lookup(cur)
                if e is None:
                    return 3, answers           # NXDOMAIN (also at a dangling CNAME)
                if e["drop"]:
                    return None
                if e["rcode"]:
                    return e["rcode"], answers
                if e["cname"]:
                    answers.append((cur, T_CNAME, e["ttl"], e["cname"]))
                    if qtype == T_CNAME:
                        return 0, answers
                    cur = e["cname"]
                    continue
                for fam, t in ((4, T_A), (6, T_AAAA)):
                    if qtype not in (t, T_ANY):
                        continue
                    if e["rebind"] is not None:
                        pool = [a for a in e["rebind"] if ipaddress.ip_address(a).version == fam]
                        if pool:
                            pos = self.rebind_pos.get((key, fam), 0)
                            self.rebind_pos[(key, fam)] = pos + 1
                            answers.append((cur, t, e["ttl"], pool[pos % len(pool)]))
                    else:
                        for a in e["a" if fam == 4 else "aaaa"]:
                            answers.append((cur, t, e["ttl"], a))
                return 0, answers
            return 2, answers                   # CNAME loop: SERVFAIL


STATE: State = None  # type: ignore[assignment]


# --------------------------------------------------------------------------
# DNS
# --------------------------------------------------------------------------

def dns_answer(data: bytes, transport: str, client) -> bytes | None:
    entry = {"name": None, "qtype": None, "type": None, "transport": transport,
             "time": time.time(), "client": client[0], "rcode": None, "answers": []}
    if len(data) < 12:
        entry["malformed"] = "short header"
        STATE.log_dns(entry)
        return None
    qid, flags, qd, _an, _ns, _ar = struct.unpack("!6H", data[:12])
    if flags & 0x8000:
        entry["malformed"] = "a response, not a query"
        STATE.log_dns(entry)
        return None
    opcode = (flags >> 11) & 0xF
    rd = flags & 0x0100

    def reply(rcode, question=b"", rrs=()):
        f = 0x8000 | (opcode << 11) | 0x0400 | rd | 0x0080 | rcode
        return struct.pack("!6H", qid, f, 1 if question else 0, len(rrs), 0, 0) + question + b"".join(rrs)

    if opcode != 0:
        entry["malformed"] = f"opcode {opcode}"
        entry["rcode"] = 4
        STATE.log_dns(entry)
        return reply(4)
    try:
        if qd != 1:
            raise ValueError(f"qdcount {qd}")
        labels, off = parse_name(data, 12)
        if off + 4 > len(data):
            raise ValueError("truncated question")
        qtype, qclass = struct.unpack_from("!HH", data, off)
    except ValueError as e:
        entry["malformed"] = str(e)
        entry["rcode"] = 1
        STATE.log_dns(entry)
        return reply(1)
    raw = ".".join(lb.decode("latin-1") for lb in labels)
    name = raw.lower()
    entry.update(name=name, qtype=qtype, type=QTYPES.get(qtype, str(qtype)))
    question = encode_name(raw) + struct.pack("!HH", qtype, qclass)
    if qclass not in (1, 255):
        entry["rcode"] = 5
        STATE.log_dns(entry)
        return reply(5, question)
    res = STATE.resolve(name, qtype)
    if res is None:
        entry["dropped"] = True
        STATE.log_dns(entry)
        return None
    rcode, ans = res
    rrs = []
    for owner, t, ttl, value in ans:
        if t == T_A:
            rdata = ipaddress.IPv4Address(value).packed
        elif t == T_AAAA:
            rdata = ipaddress.IPv6Address(value).packed
        else:
            rdata = encode_name(value)
        rrs.append(rr(owner, t, ttl, rdata))
        entry["answers"].append({"name": owner, "type": QTYPES[t], "ttl": ttl, "value": value})
    entry["rcode"] = rcode
    STATE.log_dns(entry)
    return reply(rcode, question, rrs)


class DNSUDPHandler(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        try:
            out = dns_answer(data, "udp", self.client_address)
            if out is None:
                return
            if len(out) > 512:          # no EDNS here: header + TC bit, the client retries on TCP
                out = out[:2] + bytes([out[2] | 0x02, out[3]]) + b"\0\0" * 4
            sock.sendto(out, self.client_address)
        except Exception:
            log("dns/udp: " + traceback.format_exc())


class DNSTCPHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.settimeout(IO_TIMEOUT)
        try:
            while True:
                head = _recv_exact(sock, 2)
                if head is None:
                    return
                (n,) = struct.unpack("!H", head)
                msg = _recv_exact(sock, n)
                if msg is None:
                    STATE.log_dns({"name": None, "qtype": None, "type": None, "transport": "tcp",
                                   "time": time.time(), "client": self.client_address[0],
                                   "rcode": None, "answers": [], "malformed": "truncated TCP message"})
                    return
                out = dns_answer(msg, "tcp", self.client_address)
                if out is None:
                    if len(msg) < 12 or msg[2] & 0x80:
                        return          # garbage: hang up
                    continue            # a "drop" entry: no answer, the connection stays
                sock.sendall(struct.pack("!H", len(out)) + out)
        except (OSError, ValueError):
            return
        except Exception:
            log("dns/tcp: " + traceback.format_exc())


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# --------------------------------------------------------------------------
# HTTP / HTTPS / echo sinks
# --------------------------------------------------------------------------

class BadRequest(Exception):
    pass


class Closed(Exception):
    pass


class Reader:
    def __init__(self, sock, on_bytes):
        self.sock = sock
        self.on_bytes = on_bytes
        self.buf = b""

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Closed()
        self.on_bytes(len(chunk))
        self.buf += chunk

    def line(self, limit=MAX_HEAD) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out, self.buf = self.buf[:i], self.buf[i + 1:]
                return out[:-1] if out.endswith(b"\r") else out
            if len(self.buf) > limit:
                raise BadRequest("line too long")
            self._fill()

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def read_request(r: Reader, send_continue):
    line = r.line()
    if line == b"":
        line = r.line()                 # one stray CRLF before a request is allowed
    parts = line.decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise BadRequest(f"bad request line {line[:200]!r}")
    method, target, version = parts
    headers = []
    size = len(line)
    while True:
        h = r.line()
        size += len(h) + 2
        if size > MAX_HEAD:
            raise BadRequest("headers too large")
        if h == b"":
            break
        if h[:1] in (b" ", b"\t"):
            raise BadRequest("obsolete line folding")
        name, sep, value = h.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {h[:200]!r}")
        headers.append([name, value.strip(" \t")])
    lower = [(n.lower(), v) for n, v in headers]
    te = [v for n, v in lower if n == "transfer-encoding"]
    cl = [v for n, v in lower if n == "content-length"]
    if any(v.lower() == "100-continue" for n, v in lower if n == "expect"):
        send_continue()
    body, chunked, trailers = b"", False, []
    if te:
        codings = [c.strip().lower() for v in te for c in v.split(",")]
        if codings[-1] != "chunked":
            raise BadRequest("transfer-encoding without chunked last")
        chunked = True
        while True:
            sl = r.line().decode("latin-1").split(";")[0].strip()
            if not sl or any(c not in "0123456789abcdefABCDEF" for c in sl):
                raise BadRequest(f"bad chunk size {sl[:40]!r}")
            n = int(sl, 16)
            if n == 0:
                break
            if len(body) + n > MAX_BODY:
                raise BadRequest("body too large")
            body += r.exactly(n)
            if r.exactly(2) != b"\r\n":
                raise BadRequest("chunk not followed by CRLF")
        while True:
            t = r.line()
            if t == b"":
                break
            name, _, value = t.decode("latin-1").partition(":")
            trailers.append([name, value.strip(" \t")])
    elif cl:
        if len(set(v.strip() for v in cl)) != 1 or not cl[0].strip().isdigit():
            raise BadRequest(f"bad content-length {cl!r}")
        n = int(cl[0])
        if n > MAX_BODY:
            raise BadRequest("body too large")
        body = r.exactly(n)
    return {"method": method, "target": target, "version": version, "headers": headers,
            "body": body, "chunked": chunked, "trailers": trailers}


def _status_line(code):
    reasons = {200: "OK", 201: "Created", 204: "No Content", 301: "Moved Permanently",
               302: "Found", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
               500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
    return f"HTTP/1.1 {code} {reasons.get(code, 'Status')}\r\n"


def send_response(sock, code, body: bytes, ctype="application/json", extra=(), head=False):
    hdrs = _status_line(code)
    for n, v in list(extra) + [("Content-Type", ctype), ("Content-Length", str(len(body))),
                               ("Connection", "close")]:
        hdrs += f"{n}: {v}\r\n"
    data = hdrs.encode("latin-1") + b"\r\n"
    sock.sendall(data if head else data + body)


class TLSInfo(threading.local):
    sni = None


TLS_INFO = TLSInfo()


class SinkHandler(socketserver.BaseRequestHandler):
    """HTTP or HTTPS, by self.server.proto."""

    def handle(self):
        srv = self.server
        sink, proto = srv.sink, srv.proto
        sock = self.request
        sock.settimeout(IO_TIMEOUT)
        # no Nagle: a TLS handshake's several small writes must not wait on
        # the client's delayed ACK (40 ms each), which would swamp what the
        # egress benchmark measures
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        STATE.add(sink, proto, "connections")
        sni = alpn = tls_version = None
        if proto == "https":
            TLS_INFO.sni = None
            try:
                sock = srv.ssl_ctx.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError) as e:
                STATE.add(sink, proto, "tls_errors")
                STATE.set(sink, proto, "last_tls_error", str(e))
                return
            sni = TLS_INFO.sni
            alpn = sock.selected_alpn_protocol()
            tls_version = sock.version()
            STATE.add(sink, proto, "handshakes")
        try:
            self._serve(sock, sink, proto, sni, alpn, tls_version)
        finally:
            if proto == "https":
                try:
                    sock.settimeout(0.5)
                    sock.unwrap()
                except (OSError, ValueError):
                    pass
                try:
                    sock.close()
                except OSError:
                    pass

    def _serve(self, sock, sink, proto, sni, alpn, tls_version):
        r = Reader(sock, lambda n: STATE.add(sink, proto, "bytes", n))
        try:
            req = read_request(r, lambda: sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n"))
        except BadRequest as e:
            try:
                send_response(sock, 400, json.dumps({"error": str(e), "sink": sink}).encode())
            except OSError:
                pass
            return
        except (Closed, OSError):
            return
        STATE.add(sink, proto, "requests")
        target = req["target"]
        u = urlsplit(target if not target.startswith("/") else "http://x" + target)
        path = u.path or "/"
        host = next((v for n, v in req["headers"] if n.lower() == "host"), None)
        body = req["body"]
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        local = sock.getsockname()
        peer = sock.getpeername()
        echo = {
            "sink": sink, "proto": proto, "method": req["method"], "target": target,
            "path": path, "query": u.query, "version": req["version"],
            "headers": req["headers"], "host": host,
            "body": text, "body_b64": base64.b64encode(body).decode(), "body_len": len(body),
            "chunked": req["chunked"], "trailers": req["trailers"],
            "sni": sni, "alpn": alpn, "tls_version": tls_version,
            "client": [peer[0], peer[1]], "local": [local[0], local[1]],
        }
        STATE.log_request({"time": time.time(), "sink": sink, "proto": proto,
                           "method": req["method"], "target": target, "path": path,
                           "host": host, "sni": sni, "headers": req["headers"],
                           "body_len": len(body), "client": peer[0]})
        head = req["method"] == "HEAD"
        q = parse_qs(u.query)
        try:
            if path == "/redirect" and "to" in q:
                send_response(sock, 302, b"redirect\n", "text/plain",
                              [("Location", q["to"][0])], head)
            elif path.startswith("/status/") and path[8:].isdigit() and 100 <= int(path[8:]) <= 599:
                code = int(path[8:])
                b = b"" if code in (204, 304) else json.dumps(echo).encode()
                send_response(sock, code, b, head=head or code in (204, 304))
            elif path.startswith("/bytes/") and path[7:].isdigit():
                n = min(int(path[7:]), MAX_BYTES_REPLY)
                send_response(sock, 200, b"x" * n, "application/octet-stream", head=head)
            else:
                send_response(sock, 200, json.dumps(echo).encode(), head=head)
        except OSError:
            pass


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sink = self.server.sink
        sock = self.request
        sock.settimeout(IO_TIMEOUT)
        STATE.add(sink, "echo", "connections")
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                STATE.add(sink, "echo", "bytes", len(data))
                sock.sendall(data)
        except OSError:
            return


# --------------------------------------------------------------------------
# Control
# --------------------------------------------------------------------------

class ControlHandler(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                out = self.dispatch(req)
            except Exception as e:  # an error answer, never a dead world
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            self.wfile.write(json.dumps(out).encode() + b"\n")
            self.wfile.flush()

    def dispatch(self, req):
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "stats":
            return dict(ok=True, **STATE.snapshot())
        if op == "reset":
            STATE.reset()
            return {"ok": True}
        if op == "set_zone":
            STATE.set_zone(req.get("zone"), bool(req.get("replace", False)))
            return {"ok": True}
        if op == "reset_zone":
            STATE.reset_zone()
            return {"ok": True}
        if op == "get_zone":
            with STATE.lock:
                return {"ok": True, "zone": copy.deepcopy(STATE.zone)}
        return {"ok": False, "error": f"unknown op {op!r}"}


# --------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------

def _family(addr):
    return socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET


class TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr, handler, **attrs):
        self.address_family = _family(addr[0])
        for k, v in attrs.items():
            setattr(self, k, v)
        super().__init__(addr, handler)

    def handle_error(self, request, client_address):
        log(f"error serving {client_address}: {traceback.format_exc()}")


class UDPServer(socketserver.ThreadingUDPServer):
    daemon_threads = True
    allow_reuse_address = True
    max_packet_size = 65535

    def __init__(self, addr, handler):
        self.address_family = _family(addr[0])
        super().__init__(addr, handler)


class UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def make_ssl_ctx(cert, key, alt_ctxs):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])

    def on_sni(sslsock, server_name, _ctx):
        TLS_INFO.sni = server_name
        if server_name:
            alt = alt_ctxs.get(server_name.lower())
            if alt is not None:
                sslsock.context = alt
        return None

    ctx.sni_callback = on_sni
    return ctx


def serve(server):
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    t.start()
    return t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    args = ap.parse_args(argv)
    with open(args.config) as f:
        cfg = json.load(f)

    global STATE
    STATE = State(cfg)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    alt_ctxs = {}
    for alt in cfg.get("alt_certs", []):
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        c.load_cert_chain(alt["cert"], alt["key"])
        c.set_alpn_protocols(["http/1.1"])
        for n in alt["names"]:
            alt_ctxs[n.lower()] = c

    servers = []
    dns = cfg["dns"]
    servers.append(UDPServer((dns, 53), DNSUDPHandler))
    servers.append(TCPServer((dns, 53), DNSTCPHandler))
    for name, s in cfg["sinks"].items():
        addr = s["addr"]
        servers.append(TCPServer((addr, 80), SinkHandler, sink=name, proto="http"))
        servers.append(TCPServer((addr, 443), SinkHandler, sink=name, proto="https",
                                 ssl_ctx=make_ssl_ctx(s["cert"], s["key"], alt_ctxs)))
        servers.append(TCPServer((addr, 9000), EchoHandler, sink=name))
    ctl = cfg["control"]
    try:
        os.unlink(ctl)
    except FileNotFoundError:
        pass
    servers.append(UnixServer(ctl, ControlHandler))
    for s in servers:
        serve(s)

    # Exit when the harness goes away (our stdin is its pipe).
    def watch_stdin():
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    sys.stdout.write("READY " + json.dumps({"pid": os.getpid(), "servers": len(servers)}) + "\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
