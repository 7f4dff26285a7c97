#!/usr/bin/python3
"""The client of bench/ingress.py (standard library only), run the same way
inside a sandbox (direct to 127.0.0.1:PORT) and on the host (through hutch,
with the routing headers): N sequential GETs on one keep-alive connection,
then one download and one upload of MB MiB. Prints one JSON line.

    ingress_client.py HOST PORT N MB [HEADER:VALUE ...]
"""
import http.client
import json
import sys
import time

host, port, n, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
headers = dict(h.split(":", 1) for h in sys.argv[5:])
c = http.client.HTTPConnection(host, port, timeout=120)
lat = []
for i in range(n + 5):
    t0 = time.perf_counter()
    c.request("GET", "/", headers=headers)
    r = c.getresponse()
    r.read()
    assert r.status == 200, r.status
    if i >= 5:  # warm-up
        lat.append((time.perf_counter() - t0) * 1000)
size = mb << 20
t0 = time.perf_counter()
c.request("GET", f"/download?n={size}", headers=headers)
r = c.getresponse()
got = 0
while True:
    b = r.read(1 << 20)
    if not b:
        break
    got += len(b)
down = time.perf_counter() - t0
assert got == size, got
block = b"x" * (1 << 20)


def body():
    for _ in range(mb):
        yield block


t0 = time.perf_counter()
c.request("POST", "/upload", body=body(), headers={**headers, "Content-Length": str(size)})
r = c.getresponse()
res = r.read().decode()
up = time.perf_counter() - t0
assert res.startswith(f"{size} "), res
print(json.dumps({"lat_ms": lat, "down_mbs": mb / down, "up_mbs": mb / up}))
