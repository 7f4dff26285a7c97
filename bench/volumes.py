#!/usr/bin/python3
"""Volumes (docs/volumes.md): the content plane's per-request cost and
streaming rates, and what mounting a volume adds to a create. Starts its own
`hutch serve` in a temporary directory. Markdown on stdout.

    HUTCH_BIN=build/hutch bench/volumes.py
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("HUTCH_BIN", str(ROOT / "build" / "hutch"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    tmp = Path(tempfile.mkdtemp(prefix="hutch-bench-vol."))
    tmp.chmod(0o755)
    (tmp / "run").mkdir(mode=0o755)
    port = free_port()
    log = open(tmp / "serve.log", "wb")
    proc = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp / "data"),
                             "--run-dir", str(tmp / "run"), "--volume-size", "512M", "--pool-size", "0"],
                            stdout=log, stderr=log)
    try:
        for _ in range(300):
            if (tmp / "data" / "api-key").exists():
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    pass
            time.sleep(0.1)
        key = (tmp / "data" / "api-key").read_text().strip()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

        def req(m, p, b=None, h=None):
            c.request(m, p, body=b, headers=h or {})
            r = c.getresponse()
            return r.status, r.read()

        rows = []
        t = time.monotonic()
        s, d = req("POST", "/volumes", json.dumps({"name": "bench"}), {"X-API-KEY": key})
        assert s == 201, d
        rows.append(("create a 512 MiB volume (mkfs.ext4)", f"{(time.monotonic() - t) * 1000:.1f} ms"))
        v = json.loads(d)
        auth = {"Authorization": "Bearer " + v["token"]}
        base = f"/volumecontent/{v['volumeID']}"
        req("PUT", base + "/file?path=%2Fa", b"x", auth)
        n = 200
        t = time.monotonic()
        for _ in range(n):
            s, _ = req("GET", base + "/path?path=%2Fa", None, auth)
            assert s == 200
        rows.append((f"content stat (`GET …/path`, mean of {n})", f"{(time.monotonic() - t) * 1000 / n:.2f} ms"))
        data = os.urandom(256 << 20)
        t = time.monotonic()
        s, _ = req("PUT", base + "/file?path=%2Fbig", data, {**auth, "Content-Type": "application/octet-stream"})
        assert s == 201
        rows.append(("`PUT …/file` 256 MiB", f"{256 / (time.monotonic() - t):.0f} MiB/s"))
        t = time.monotonic()
        s, d = req("GET", base + "/file?path=%2Fbig", None, auth)
        assert s == 200 and d == data
        rows.append(("`GET …/file` 256 MiB", f"{256 / (time.monotonic() - t):.0f} MiB/s"))
        for label, body in (("create + kill, one volume mounted", {"volumeMounts": [{"name": "bench", "path": "/mnt/b"}]}),
                            ("create + kill, no volume", {})):
            t = time.monotonic()
            for _ in range(20):
                s, d = req("POST", "/sandboxes", json.dumps({"templateID": "base", **body}), {"X-API-KEY": key})
                assert s == 201, d
                req("DELETE", "/sandboxes/" + json.loads(d)["sandboxID"], None, {"X-API-KEY": key})
            rows.append((f"{label} (pool off, mean of 20)", f"{(time.monotonic() - t) * 1000 / 20:.1f} ms"))
        req("DELETE", "/volumes/" + v["volumeID"], None, {"X-API-KEY": key})
        print("| volumes | result |\n|---|---|")
        for k, val in rows:
            print(f"| {k} | {val} |")
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)])


if __name__ == "__main__":
    sys.exit(main())
