"""Snapshots at rest (docs/snapshots.md): what a crash can leave in
DATA_DIR/snapshots is removed at the next start. (The snapshot API itself is
tested through the SDK in tests/e2b/snapshots.test.mjs.)"""

from __future__ import annotations

from serveclient import ServeDaemon


def test_start_sweeps_what_a_crash_left(sandboxed_hutch, tmp_path):
    tmp_path.chmod(0o755)
    data = tmp_path / "data"
    snaps = data / "snapshots"
    snaps.mkdir(parents=True)
    stray = [".restore-abc123",                      # an unsealed layer: must not survive
             ".layer-xyz",
             "snap_aaaaaaaaaaaaaaaaaaaa.seal.tmp",    # a seal cut short
             "snap_bbbbbbbbbbbbbbbbbbbb.seal",        # a sealed file no row knows
             "not-a-snapshot.seal"]
    for name in stray:
        (snaps / name).write_bytes(b"x" * 64)
    (snaps / "operator-notes.txt").write_text("kept")
    sd = ServeDaemon(sandboxed_hutch, data, ["--pool-size", "0"])
    sd.start()
    try:
        left = sorted(p.name for p in snaps.iterdir())
        assert left == ["operator-notes.txt"], left
        assert "removed 5 leftover file(s)" in sd.log_tail()
        r = sd.request("GET", "/snapshots")
        assert r.status == 200 and r.json() == []
    finally:
        sd.stop()
