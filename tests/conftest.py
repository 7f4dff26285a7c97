"""Fixtures shared by tests/integration and tests/hostile.

The implementation lives in tests/helpers/hutchtest.py (importable as
`hutchtest` once this conftest has run: conftest modules themselves are not
reliably importable). Fixture names here are a contract with both suites.

    hutch_bin      Path of the hutch binary; the test FAILS if it is missing
    sandboxed_hutch  hutch_bin, once `hutch run` is seen to really isolate
    probe_bin      Path of build_dir/tests/probe (static probe program)
    deny_errno     int, HUTCH_SECCOMP_DENY_ERRNO from build_dir/config.h
    sandbox_run    the function run_sandbox(args, cmd, stdin=None, timeout=60, env=None)
    leak_snapshot  a function returning a hutchtest.LeakSnapshot (compare with ==,
                   explain with before.diff(after), or hutchtest.assert_no_leak)
"""

import os
import sys
from pathlib import Path

import pytest

_HELPERS = str(Path(__file__).resolve().parent / "helpers")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)

import hutchtest  # noqa: E402
from hutchtest import run_sandbox  # noqa: E402,F401  (re-exported for convenience)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return hutchtest.REPO_ROOT


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return hutchtest.build_dir()


@pytest.fixture(scope="session")
def hutch_bin() -> Path:
    msg = hutchtest.missing_hutch_message()
    if msg:
        pytest.fail(msg, pytrace=False)
    return hutchtest.hutch_path()


@pytest.fixture(scope="session")
def probe_bin(build_dir) -> Path:
    p = build_dir / hutchtest.PROBE_BIN_RELPATH
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"probe binary not found: {p} (ninja -C {build_dir} builds it)",
                    pytrace=False)
    return p


@pytest.fixture(scope="session")
def deny_errno(build_dir) -> int:
    config_h = build_dir / hutchtest.CONFIG_H_RELPATH
    try:
        return hutchtest.read_deny_errno(config_h)
    except (OSError, ValueError) as e:
        pytest.fail(f"cannot read the seccomp deny errno: {e}", pytrace=False)


@pytest.fixture(scope="session")
def sandboxed_hutch(hutch_bin) -> Path:
    """hutch_bin, after checking that `hutch run` really isolates (own user
    namespace, ids in the sandbox range). Tests that write to /usr, /etc or /
    inside a sandbox must depend on this, so that a stub or a broken build
    never runs them on the host."""
    why = hutchtest.not_sandboxed_reason()
    if why:
        pytest.fail(f"refusing to run sandbox tests: {why}", pytrace=False)
    return hutch_bin


@pytest.fixture
def sandbox_run(sandboxed_hutch):
    """run_sandbox(args, cmd, stdin=None, timeout=60, env=None) -> CompletedProcess."""
    return hutchtest.run_sandbox


@pytest.fixture
def leak_snapshot():
    """A function that captures what a sandbox could leave behind on the host."""
    return hutchtest.take_leak_snapshot
