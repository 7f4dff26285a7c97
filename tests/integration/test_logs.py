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
