#!/usr/bin/python3
"""Egress proxy cost (issue #4): per-request latency and throughput through a
sandbox's proxy, against a direct connection between the same two network
namespaces, measured in one run. Markdown on stdout, progress on stderr.

    bench/egress.py                 # what `make bench` runs
    BENCH_EGRESS_N=50 bench/egress.py

The network is tests/helpers/egressnet.py's (nothing leaves this machine):
`hutch serve` runs in netns D, the sinks in netns W. The same client
(bench/egress_client.py, standard library only) runs
  - directly in D (a plain process, no sandbox, no proxy): the reference;
  - inside a sandbox of that daemon, whose only way out is its proxy:
      HTTP forward, HTTPS through a CONNECT tunnel (SNI checked, bytes
      untouched), and HTTPS to a host with a credential rule (TLS
      interception: terminated, rewritten, re-encrypted).
Each request opens a new connection (the proxy closes after one response
anyway), so latency includes connect (+ TLS handshake).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from egressnet import EgressNet, unavailable_reason  # noqa: E402
from serveclient import ServeDaemon, parse_frames, stdout_of  # noqa: E402

N = int(os.environ.get("BENCH_EGRESS_N", "200"))
MB = int(os.environ.get("BENCH_EGRESS_MB", "64"))
BUILD = Path(os.environ.get("HUTCH_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HUTCH = Path(os.environ.get("HUTCH_BIN", BUILD / "hutch"))


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    why = unavailable_reason()
    if why:
        print(f"egress benchmark: n/a: {why}")
        return 0
    with EgressNet() as net:
        work = Path(tempfile.mkdtemp(prefix="hutch-bench-egress."))
        work.chmod(0o755)
        sd = ServeDaemon(HUTCH, work / "data",
                         ["--dns", net.dns_server, "--egress-open", "198.51.100.0/24", "--egress-allow", "*",
                          "--egress-upstream-ca", str(net.ca_cert), "--pool-size", "0"],
                         host=net.api_host, cmd_prefix=net.daemon_cmd_prefix)
        sd.start()
        try:
            return run(net, sd, work)
        finally:
            sd.stop()


def run(net, sd, work):
    client = (ROOT / "bench" / "egress_client.py").read_bytes()
    ca = Path(net.ca_cert).read_bytes()
    sb = sd.create(timeout=600, network={"rules": {"api.example.test": [
        {"transform": {"headers": {"X-Bench": "1"}}}]}})
    for path, data in (("/tmp/c.py", client), ("/tmp/ca.pem", ca)):
        r = sd.request("POST", sd.files_path(path), body=data, key="",
                       headers=sd.envd_headers(sb, user="root", ctype="application/octet-stream"))
        assert r.status == 200, r
    direct_client = work / "c.py"
    direct_client.write_bytes(client)
    (work / "ca.pem").write_bytes(ca)

    def in_sandbox(args):
        r = sd.stream(sb, "process.Process/Start",
                      {"process": {"cmd": "/usr/bin/python3", "args": ["/tmp/c.py", *args]}}, timeout=600)
        assert r.status == 200, r
        out = stdout_of(parse_frames(r.body)).decode()
        return json.loads(out.strip().splitlines()[-1])

    def direct(args):
        p = net.run_in_daemon_ns(["/usr/bin/python3", str(direct_client), *args], timeout=600)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])

    cases = [
        ("HTTP", "http", "ok.example.test", "198.51.100.10", 80),
        ("HTTPS (tunnel, SNI checked)", "https", "ok.example.test", "198.51.100.10", 443),
        ("HTTPS (intercepted, rule applied)", "https", "api.example.test", "198.51.100.10", 443),
    ]
    rows = []
    for label, scheme, host, ip, port in cases:
        log(label)
        # direct: connect to the address, name the host (SNI, Host, cert check)
        d_lat = direct(["latency", scheme, host, ip, str(port), str(N), str(work / "ca.pem")])
        p_lat = in_sandbox(["latency", scheme, host, "proxy", str(port), str(N), "/tmp/ca.pem"])
        d_tp = direct(["throughput", scheme, host, ip, str(port), str(MB), str(work / "ca.pem")])
        p_tp = in_sandbox(["throughput", scheme, host, "proxy", str(port), str(MB), "/tmp/ca.pem"])
        rows.append((label, d_lat["ms"], p_lat["ms"], d_tp["mbps"], p_tp["mbps"]))

    print(f"### Egress proxy: {N} requests (new connection each), {MB} MiB downloads; "
          f"direct = a process in the daemon's netns, no sandbox, no proxy\n")
    print("| | direct p50 / p99 (ms) | via proxy p50 / p99 (ms) | added p50 (ms) "
          "| direct MB/s | via proxy MB/s | proxy / direct |")
    print("|---|---|---|---|---|---|---|")
    for label, d, p, dt, pt in rows:
        dm, pm = statistics.median(d), statistics.median(p)
        print(f"| {label} | {dm:.2f} / {pct(d, 99):.2f} | {pm:.2f} / {pct(p, 99):.2f} | {pm - dm:+.2f} "
              f"| {dt:.0f} | {pt:.0f} | {pt / dt:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
