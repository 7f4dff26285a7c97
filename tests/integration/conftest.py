"""Fixtures for the integration suite only (shared ones are in tests/conftest.py)."""

import os

import pytest

import hutchtest


@pytest.fixture(scope="session", autouse=True)
def _require_root():
    if os.geteuid() != 0:
        pytest.fail("the integration tests run hutch as root (sandboxes need it); "
                    "run pytest as root", pytrace=False)


@pytest.fixture(scope="session")
def warm(sandboxed_hutch):
    """One plain run first, so one-time setup on first use (parent cgroups,
    the storage image, /run/hutch) is not mistaken for a leak."""
    cp = hutchtest.run_sandbox([], ["true"], timeout=120)
    if cp.returncode != 0:
        pytest.fail(f"`hutch run -- true` fails (rc={cp.returncode}): {cp.stderr!r}",
                    pytrace=False)
    return sandboxed_hutch


@pytest.fixture
def baseline(warm, leak_snapshot):
    """Leak snapshot taken before the test's sandboxes; compare with
    hutchtest.assert_no_leak(baseline)."""
    return leak_snapshot()


@pytest.fixture
def run(warm):
    """run_sandbox, after the warm-up run."""
    return hutchtest.run_sandbox
