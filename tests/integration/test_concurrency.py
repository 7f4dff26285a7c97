"""Sandboxes running at the same time each get their own host uid range."""

import hutchtest
from hutchtest import BackgroundRun

N = 10
SCRIPT = "id -u; cat /proc/self/uid_map; echo READY; read x; echo bye"


def test_parallel_sandboxes_have_disjoint_uid_ranges(warm, baseline):
    runs = []
    try:
        for _ in range(N):
            runs.append(BackgroundRun([], ["sh", "-c", SCRIPT]))
        # All N are live at once: each blocks in `read` until we close stdin.
        maps = []
        for bg in runs:
            out = bg.wait_for(b"READY\n", timeout=120).decode()
            lines = out.splitlines()
            assert lines[0] == "1000", lines
            uid_map = hutchtest.parse_uid_map("\n".join(lines[1:lines.index("READY")]))
            maps.append(uid_map)

        for m in maps:
            # One range of 65536 ids, sandbox root at its start, far from host ids.
            assert len(m) == 1, m
            inside, outside, count = m[0]
            assert (inside, count) == (0, hutchtest.UID_RANGE), m
            assert outside != 0 and outside >= hutchtest.UID_BASE, m
        ranges = sorted((m[0][1], m[0][1] + m[0][2]) for m in maps)
        for (a_start, a_end), (b_start, _) in zip(ranges, ranges[1:]):
            assert a_end <= b_start, f"overlapping host uid ranges: {ranges}"

        # From the host, each sandbox's `sh` runs as its own range's uid 1000.
        host_uids = {max(p["uids"]) for p in hutchtest.sandbox_processes()}
        for m in maps:
            assert hutchtest.map_id(m, 1000) in host_uids, (m, sorted(host_uids))

        for bg in runs:
            bg.close_stdin()
        for bg in runs:
            assert bg.wait(120) == 0, bg.stderr
            assert bg.stdout.endswith(b"bye\n")
    finally:
        for bg in runs:
            bg.stop()
    hutchtest.assert_no_leak(baseline, what=f"after {N} parallel sandboxes")


def test_parallel_short_runs_all_succeed(warm, baseline):
    runs = [BackgroundRun([], ["sh", "-c", "echo $$; id -u"], stdin_pipe=False)
            for _ in range(N)]
    try:
        for bg in runs:
            assert bg.wait(120) == 0, bg.stderr
            pid, uid = bg.stdout.decode().split()
            assert uid == "1000" and int(pid) < 10
    finally:
        for bg in runs:
            bg.stop()
    hutchtest.assert_no_leak(baseline, what=f"after {N} parallel runs")
