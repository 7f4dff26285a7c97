"""`hutch serve --log-format json` (issue 15): every line the daemon writes
is one JSON object with a time, a level and a message, and the lines
written while a request is served carry its request id (the client's
X-Request-Id, which the audit trail records too).
"""

from __future__ import annotations

import json

from serveclient import ServeDaemon


def test_json_logs_parse_and_carry_the_request_id(sandboxed_hutch, tmp_path, monkeypatch):
    monkeypatch.setenv("HUTCH_DEBUG", "1")
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--log-format", "json"])
    d.start()
    try:
        r = d.request("POST", "/v2/sandboxes", {"templateID": "base"}, headers={"X-Request-Id": "rid-audit-42"},
                      timeout=120)
        assert r.status == 201, r
        sid = r.json()["sandboxID"]
        d.created[sid] = d.key
        assert d.request("GET", "/sandboxes/" + "a" * 20, headers={"X-Request-Id": "bad id\x7f"}).status == 404
        events = d.request("GET", "/events?kind=api.call&limit=1000").json()
        call = next(e for e in events if e["detail"]["path"] == "/v2/sandboxes")
        assert call["detail"]["request_id"] == "rid-audit-42"
        # an id that is not plain is replaced by one of the daemon's
        other = next(e for e in events if e["detail"]["path"] == "/sandboxes/" + "a" * 20)
        assert other["detail"]["request_id"] and " " not in other["detail"]["request_id"]
    finally:
        d.stop()
    lines = d.log_path.read_text().splitlines()
    assert len(lines) > 3
    objs = [json.loads(l) for l in lines]   # every line is one object
    for o in objs:
        assert {"ts", "level", "prog", "msg"} <= o.keys(), o
        assert o["level"] in ("error", "warning", "info", "debug")
        assert o["ts"].endswith("Z")
    assert any(o["level"] == "debug" for o in objs)
    tagged = [o for o in objs if o.get("request_id") == "rid-audit-42"]
    assert tagged, "no line carried the request id"
    assert not any(d.key in l for l in lines), "the API key in a JSON log"


def test_a_process_keeps_its_request_id_through_its_exit_and_a_restart(sandboxed_hutch, tmp_path, monkeypatch):
    """The request id that started a process reaches hutch-init with the
    spawn: the process's exit, which happens after that request, is logged
    under it and its process.end record names it; after a kill -9 of the
    daemon the id comes back from hutch-init (marked as the sandbox's word)."""
    import signal
    import threading
    from hutchtest import wait_until

    monkeypatch.setenv("HUTCH_DEBUG", "1")
    data = tmp_path / "data"
    d = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--log-format", "json"])
    d.start()
    sb = d.create()

    def start(cmd, rid, timeout=60):
        return d.stream(sb, "process.Process/Start",
                        {"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": False},
                        extra={"X-Request-Id": rid}, timeout=timeout)

    def records(kind, daemon):
        r = daemon.request("GET", f"/sandboxes/{sb['sandboxID']}/events?limit=1000")
        assert r.status == 200, r
        return [e["detail"] for e in r.json() if e["type"] == kind]

    d2 = None
    try:
        assert start("exit 4", "rid-short-1").status == 200
        long_run = threading.Thread(target=lambda: _quiet(start, "sleep 4", "rid-long-9", 30))
        long_run.start()
        assert wait_until(lambda: any(p.get("request_id") == "rid-long-9"
                                      for p in records("process.start", d)), 10)
        short = next(p for p in records("process.end", d) if p.get("request_id") == "rid-short-1")
        assert short["exit_code"] == 4 and "request_id_source" not in short, short
        lines = [json.loads(l) for l in d.log_path.read_text().splitlines()]
        assert any(o.get("request_id") == "rid-short-1" and "exited" in o["msg"] for o in lines), lines[-20:]

        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        long_run.join(30)
        d2 = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0", "--log-format", "json"])
        d2.created = dict(d.created)
        d2.start()
        assert wait_until(lambda: any(p.get("request_id") == "rid-long-9" for p in records("process.end", d2)),
                          20), records("process.end", d2)
        end = next(p for p in records("process.end", d2) if p.get("request_id") == "rid-long-9")
        assert end["request_id_source"] == "sandbox" and end["exit_code"] == 0, end
        lines = [json.loads(l) for l in d2.log_path.read_text().splitlines()]
        assert any(o.get("request_id") == "rid-long-9" and "exited" in o["msg"] for o in lines), lines[-20:]
    finally:
        if d2:
            assert d2.stop() == []
        else:
            d.stop()


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:   # the daemon is killed under it, on purpose
        pass
