"""Usage errors (exit 2), hutch's own failures (exit 125), and the size and
duration syntaxes. An error is one stderr line starting "hutch: " and leaves
nothing behind."""

import pytest

import hutchtest
from hutchtest import assert_single_error_line, run_hutch


@pytest.mark.parametrize("argv", [
    pytest.param(["run", "--bogus-flag", "--", "true"], id="unknown-flag"),
    pytest.param(["run", "--memory", "abc", "--", "true"], id="memory-abc"),
    pytest.param(["run", "--memory", "12Q", "--", "true"], id="memory-bad-suffix"),
    pytest.param(["run", "--memory", "-5M", "--", "true"], id="memory-negative"),
    pytest.param(["run", "--memory", "", "--", "true"], id="memory-empty"),
    pytest.param(["run", "--disk", "lots", "--", "true"], id="disk-bad"),
    pytest.param(["run", "--pids", "abc", "--", "true"], id="pids-bad"),
    pytest.param(["run", "--cpus", "abc", "--", "true"], id="cpus-bad"),
    pytest.param(["run", "--timeout", "xyz", "--", "true"], id="timeout-xyz"),
    pytest.param(["run", "--timeout", "10x", "--", "true"], id="timeout-bad-unit"),
    pytest.param(["run", "--timeout", "-1s", "--", "true"], id="timeout-negative"),
    pytest.param(["run", "--net", "bogus", "--", "true"], id="net-bogus"),
    pytest.param(["run"], id="no-command"),
    pytest.param(["run", "--"], id="empty-command"),
    pytest.param(["run", "--memory", "64M"], id="flags-but-no-command"),
    pytest.param(["run", "--memory"], id="flag-missing-value"),
    pytest.param(["no-such-verb"], id="unknown-verb"),
])
def test_usage_error(warm, leak_snapshot, argv):
    before = leak_snapshot()
    cp = run_hutch(argv, timeout=30)
    assert cp.returncode == hutchtest.EXIT_USAGE, (cp.returncode, cp.stderr)
    assert cp.stdout == b""
    assert_single_error_line(cp)
    hutchtest.assert_no_leak(before)


def test_unknown_template_is_125(warm, leak_snapshot):
    before = leak_snapshot()
    cp = hutchtest.run_sandbox(["--template", "no-such-template-xyz"], ["true"], timeout=30)
    assert cp.returncode == hutchtest.EXIT_HUTCH_FAILURE, (cp.returncode, cp.stderr)
    assert cp.stdout == b""
    assert_single_error_line(cp, "no-such-template-xyz")
    hutchtest.assert_no_leak(before)


def test_explicit_defaults_are_accepted(run):
    cp = run(["--template", "host", "--memory", "512M", "--pids", "512", "--cpus", "2",
              "--disk", "1G", "--net", "deny", "--user", "user", "--workdir", "/home/user",
              "--timeout", "1h", "--no-new-privs"], ["echo", "ok"])
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, b"ok\n", b"")


@pytest.mark.parametrize("size", ["67108864", "64M", "64m", "64MiB", "65536K", "65536k",
                                  "65536KiB", "1G", "1g", "1GiB", "1T"])
def test_memory_size_syntax_accepted(run, size):
    cp = run(["--memory", size], ["true"])
    assert (cp.returncode, cp.stderr) == (0, b"")


@pytest.mark.parametrize("duration", ["10", "10s", "2m", "1h", "1500ms"])
def test_duration_syntax_accepted(run, duration):
    cp = run(["--timeout", duration], ["sh", "-c", "exit 5"])
    assert (cp.returncode, cp.stderr) == (5, b"")


# The same size spelled several ways must give the same disk limit. Measured
# by behaviour: fill /home/user until ENOSPC and read back the file's size.
FILL = "head -c 100M /dev/zero > /home/user/fill 2>/dev/null; stat -c %s /home/user/fill"


def test_disk_size_spellings_are_equivalent(run):
    sizes = {}
    for spelling in ["64M", "64m", "64MiB", "65536K", "65536k", "65536KiB", str(64 << 20)]:
        cp = run(["--disk", spelling], ["sh", "-c", FILL], timeout=120)
        assert cp.returncode == 0, (spelling, cp.stderr)
        sizes[spelling] = int(cp.stdout)
    for spelling, n in sizes.items():
        assert 48 * hutchtest.MiB <= n <= 66 * hutchtest.MiB, sizes
    # Spellings of one value land within a page-rounding of each other.
    assert max(sizes.values()) - min(sizes.values()) <= 1 * hutchtest.MiB, sizes


def test_duration_500ms_is_milliseconds(run):
    # If "500ms" were read as 500 s (or minutes) the run would hit the test timeout.
    cp = run(["--timeout", "500ms"], ["sleep", "100"], timeout=60)
    assert cp.returncode == hutchtest.EXIT_TIMEOUT


def test_plain_number_duration_is_seconds(run):
    cp = run(["--timeout", "1"], ["sleep", "100"], timeout=60)
    assert cp.returncode == hutchtest.EXIT_TIMEOUT


def test_kill_unknown_id_fails(warm):
    cp = run_hutch(["kill", "a" * 20], timeout=30)
    assert cp.returncode != 0
    assert_single_error_line(cp)
