"""The egress benchmark's client (bench/egress.py): runs in a sandbox (through
its proxy) or directly in a netns. Standard library only; one JSON line out.

    latency SCHEME HOST ADDR|proxy PORT N CAFILE
    throughput SCHEME HOST ADDR|proxy PORT MIB CAFILE
"""

import json
import socket
import ssl
import sys
import time

PROXY = ("127.0.0.1", 3128)


_CTX = {}


def context(ca):
    """One TLS context per run: loading trust stores is not what is measured."""
    if ca not in _CTX:
        ctx = ssl.create_default_context(cafile=ca)
        try:
            ctx.load_verify_locations("/etc/ssl/certs/ca-certificates.crt")  # the sandbox's, with the deployment CA
        except OSError:
            pass
        _CTX[ca] = ctx
    return _CTX[ca]


def connect(scheme, host, addr, port, ca):
    if addr == "proxy":
        s = socket.create_connection(PROXY, timeout=30)
        if scheme == "https":
            s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                d = s.recv(4096)
                if not d:
                    raise OSError("proxy closed")
                head += d
            if not head.startswith(b"HTTP/1.1 200"):
                raise OSError(head.decode(errors="replace"))
    else:
        s = socket.create_connection((addr, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if scheme == "https":
        s = context(ca).wrap_socket(s, server_hostname=host)
    return s


def request(scheme, host, addr, port, ca, path):
    s = connect(scheme, host, addr, port, ca)
    target = f"http://{host}{path}" if (addr == "proxy" and scheme == "http") else path
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    n = 0
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        n += len(d)
    s.close()
    return n


def main():
    mode, scheme, host, addr, port = sys.argv[1:6]
    port = int(port)
    ca = sys.argv[7]
    if mode == "latency":
        n = int(sys.argv[6])
        request(scheme, host, addr, port, ca, "/warm")
        ms = []
        for i in range(n):
            t = time.perf_counter()
            got = request(scheme, host, addr, port, ca, "/status/200")
            ms.append((time.perf_counter() - t) * 1000)
            assert got > 0
        print(json.dumps({"ms": ms}))
    else:
        mib = int(sys.argv[6])
        t = time.perf_counter()
        got = request(scheme, host, addr, port, ca, f"/bytes/{mib << 20}")
        dt = time.perf_counter() - t
        assert got >= mib << 20, got
        print(json.dumps({"mbps": got / dt / 1e6}))


if __name__ == "__main__":
    main()
