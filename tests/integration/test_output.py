"""Output floods: every byte arrives, in order, and hutch's memory stays bounded.

The counting happens in a wrapper process (hutchtest.run_counting) that reads
in chunks, so the test never holds the flood in memory; the wrapper's
RUSAGE_CHILDREN max RSS is hutch's own peak (its sandbox processes are tiny).
"""

import hutchtest

MAX_HUTCH_RSS_KIB = 64 * 1024


def _check(res, stream, expected_bytes):
    other = "stderr" if stream == "stdout" else "stdout"
    assert res["rc"] == 0, res
    assert res["bytes"][stream] == expected_bytes, (
        f"{stream}: got {res['bytes'][stream]} bytes, expected {expected_bytes}; "
        f"{other} tail={res['tail'][other]!r}")
    assert res["pattern_ok"][stream], (
        f"{stream} content wrong from offset {res['first_bad_offset'][stream]}")
    assert res["bytes"][other] == 0, f"unexpected {other}: {res['head'][other]!r}"
    assert 0 < res["maxrss_kib"] < MAX_HUTCH_RSS_KIB, (
        f"hutch's max RSS was {res['maxrss_kib']} KiB during a {expected_bytes}-byte flood")


def test_stdout_flood_200m(warm):
    res = hutchtest.run_counting([], ["head", "-c", "200M", "/dev/zero"],
                                 patterns={"stdout": "zero"})
    _check(res, "stdout", 200 * hutchtest.MiB)


def test_stdout_flood_yes_pipeline(warm):
    res = hutchtest.run_counting([], ["sh", "-c", "yes | head -c 50M"],
                                 patterns={"stdout": "yes"})
    _check(res, "stdout", 50 * hutchtest.MiB)


def test_stderr_flood(warm):
    res = hutchtest.run_counting([], ["sh", "-c", "head -c 100M /dev/zero >&2"],
                                 patterns={"stderr": "zero"})
    _check(res, "stderr", 100 * hutchtest.MiB)


def test_both_streams_flood_at_once(warm):
    # Both pipes full at the same time: hutch must drain both (no deadlock)
    # and keep them apart.
    res = hutchtest.run_counting(
        [], ["sh", "-c", "head -c 30M /dev/zero >&2 & yes | head -c 30M; wait"],
        patterns={"stdout": "yes", "stderr": "zero"})
    assert res["rc"] == 0, res
    assert res["bytes"] == {"stdout": 30 * hutchtest.MiB, "stderr": 30 * hutchtest.MiB}
    assert res["pattern_ok"] == {"stdout": True, "stderr": True}, res["first_bad_offset"]
    assert res["maxrss_kib"] < MAX_HUTCH_RSS_KIB, res["maxrss_kib"]


def test_output_then_exit_code(warm):
    # The exit status is still right after a flood, and the last bytes arrive.
    res = hutchtest.run_counting([], ["sh", "-c", "head -c 20M /dev/zero; printf END; exit 7"])
    assert res["rc"] == 7
    assert res["bytes"]["stdout"] == 20 * hutchtest.MiB + 3
    assert res["tail"]["stdout"].endswith("END")
