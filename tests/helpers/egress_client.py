"""Runs INSIDE a sandbox (copied there by tests/integration/test_egress.py):
small clients of the egress proxy that curl cannot be made to be. Standard
library only; prints one JSON object on stdout.

    raw HEX [WAIT]          send bytes to the proxy, print what comes back
    tls HOST PORT SNI CA    CONNECT HOST:PORT, then TLS with that SNI ('-': none)
    nested HOST PORT        CONNECT HOST:PORT, then a CONNECT inside it
    hold HOST PORT SECS     CONNECT HOST:PORT to an echo server, send a line
                            every 0.2 s, report when the tunnel closed
    direct IP PORT          connect without the proxy (must fail)
"""

import json
import socket
import ssl
import sys
import time

PROXY = ("127.0.0.1", int(__import__("os").environ.get("HUTCH_TEST_PROXY_PORT", "3128")))


def recv_all(s, wait):
    s.settimeout(wait)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except socket.timeout:
        pass
    except OSError as e:
        out += f"<{e}>".encode()
    return out


def connect_tunnel(host, port):
    s = socket.create_connection(PROXY, timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d:
            break
        head += d
    return s, head.decode(errors="replace")


def main():
    mode = sys.argv[1]
    res = {}
    if mode == "raw":
        data = bytes.fromhex(sys.argv[2])
        wait = float(sys.argv[3]) if len(sys.argv) > 3 else 3
        s = socket.create_connection(PROXY, timeout=10)
        s.sendall(data)
        res["reply"] = recv_all(s, wait).decode(errors="replace")
    elif mode == "tls":
        host, port, sni, ca = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        s, head = connect_tunnel(host, port)
        res["connect"] = head
        ctx = ssl.create_default_context(cafile=ca)
        ctx.check_hostname = False
        try:
            t = ctx.wrap_socket(s, server_hostname=None if sni == "-" else sni)
            t.sendall(f"GET /tls HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            res["reply"] = recv_all(t, 5).decode(errors="replace")
            res["ok"] = True
        except (OSError, ssl.SSLError) as e:
            res["error"] = repr(e)
            res["ok"] = False
    elif mode == "nested":
        host, port = sys.argv[2], int(sys.argv[3])
        s, head = connect_tunnel(host, port)
        res["connect"] = head
        try:
            s.sendall(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
            res["reply"] = recv_all(s, 3).decode(errors="replace")
        except OSError as e:
            res["error"] = repr(e)
    elif mode == "hold":
        host, port, secs = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        s, head = connect_tunnel(host, port)
        res["connect"] = head
        s.settimeout(1)
        echoed = 0
        start = time.monotonic()
        closed_at = None
        # announce that the tunnel is up, for the test to change the policy
        print("UP", flush=True, file=sys.stderr)
        while time.monotonic() - start < secs:
            try:
                s.sendall(b"ping\n")
                d = s.recv(100)
                if not d:
                    closed_at = time.monotonic() - start
                    break
                echoed += len(d)
            except OSError:
                closed_at = time.monotonic() - start
                break
            time.sleep(0.2)
        res["echoed"] = echoed
        res["closed"] = closed_at is not None
    elif mode == "direct":
        ip, port = sys.argv[2], int(sys.argv[3])
        fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect((ip, port))
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            res["connected"] = True
        except OSError as e:
            res["connected"] = False
            res["error"] = repr(e)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
