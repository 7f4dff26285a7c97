"""The daemon's Prometheus metrics (issue 15, docs/metrics.md), scraped by
Debian's own `prometheus` server and read back through its query API: the
names parse, the sandbox gauge follows a create and a kill, the request
counter and the create histogram count what the test did. The envd plane's
/metrics on the API port is a sandbox's, as before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from hutchtest import wait_until
from serveclient import ServeDaemon, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def _query(prom, q):
    st, body = _get(f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    j = json.loads(body)
    assert j["status"] == "success", j
    return j["data"]["result"]


def _value(prom, q):
    res = _query(prom, q)
    return float(res[0]["value"][1]) if res else None


def test_prometheus_scrapes_the_daemon(sandboxed_hutch, tmp_path):
    assert shutil.which(PROMETHEUS) or __import__("os").path.exists(PROMETHEUS), \
        "prometheus is not installed (scripts/deps.sh test_pkgs)"
    mport = free_port()
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0", "--metrics-listen",
                                                          f"127.0.0.1:{mport}"])
    d.start()
    prom = None
    try:
        st, text = _get(f"http://127.0.0.1:{mport}/metrics")
        assert st == 200 and "# TYPE hutch_sandboxes gauge" in text
        # not the API's port: there /metrics is envd's, for a sandbox
        assert d.request("GET", "/metrics").status in (401, 404)

        pport = free_port()
        (tmp_path / "prom.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: hutch\n    static_configs: [{{targets: ['127.0.0.1:{mport}']}}]\n")
        log = open(tmp_path / "prom.log", "wb")
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prom.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

        def up():
            try:
                return _value(pport, 'up{job="hutch"}') == 1
            except OSError:
                return False

        assert wait_until(up, 30), (tmp_path / "prom.log").read_text()[-3000:]
        sb = d.create()
        r = d.request("GET", "/v2/sandboxes")
        assert r.status == 200
        # envd's own /metrics on the API port still answers for the sandbox
        r = d.request("GET", "/metrics", key="", headers=d.envd_headers(sb))
        assert r.status == 200 and "cpu_count" in r.body.decode(), r

        assert wait_until(lambda: _value(pport, 'sum(hutch_sandboxes{state="running"})') == 1, 15)
        assert wait_until(lambda: (_value(pport, 'hutch_api_requests_total{route="sandboxes_create",'
                                                 'status="201"}') or 0) >= 1, 15)
        assert (_value(pport, "hutch_sandbox_create_duration_seconds_count") or 0) >= 1
        q = _value(pport, "histogram_quantile(0.5, hutch_sandbox_create_duration_seconds_bucket)")
        assert q is not None and 0 < q <= 60
        assert (_value(pport, "process_resident_memory_bytes") or 0) > 1 << 20
        assert (_value(pport, "process_open_fds") or 0) > 3
        assert d.kill(sb["sandboxID"]).status == 204
        assert wait_until(lambda: _value(pport, 'sum(hutch_sandboxes)') == 0, 15)
        assert wait_until(lambda: (_value(pport, 'hutch_sandbox_ends_total{reason="killed"}') or 0) == 1, 15)
        # its teardown's time: one observation, within reason
        assert wait_until(lambda: (_value(pport, "hutch_sandbox_kill_duration_seconds_count") or 0) == 1, 15)
        k = _value(pport, "hutch_sandbox_kill_duration_seconds_sum")
        assert k is not None and 0 < k <= 60, k
        # no build pulled anything here
        assert _value(pport, "hutch_template_pulls_total") == 0
        # every family Prometheus took in follows the naming conventions
        names = json.loads(_get(f"http://127.0.0.1:{pport}/api/v1/label/__name__/values")[1])["data"]
        ours = [n for n in names if n.startswith(("hutch_", "process_"))]
        assert len(ours) >= 10, ours
        for n in ours:
            assert n == n.lower() and " " not in n
            if "_total" in n:
                assert n.endswith("_total")
    finally:
        if prom:
            prom.terminate()
            prom.wait(20)
        d.stop()
