"""`hutch doctor`: one line per kernel feature, "ok" or "FAIL"."""

import re
from pathlib import Path

import pytest

from hutchtest import run_hutch

# feature -> regex (matched on lowercased lines with '-', '_' and spaces removed)
REQUIRED = {
    "user namespaces": r"usernamespace|userns",
    "id-mapped mounts": r"idmapped|idmap",
    "overlayfs": r"overlay",
    "seccomp": r"seccomp",
    "cgroup layout": r"cgroup",
}
MENTIONED = dict(REQUIRED, pidfd=r"pidfd")


@pytest.fixture(scope="module")
def doctor(hutch_bin):
    cp = run_hutch(["doctor"], timeout=60)
    text = (cp.stdout + cp.stderr).decode("utf-8", "replace")
    return cp, [l for l in text.splitlines() if l.strip()]


def _norm(line):
    return re.sub(r"[-_ ]", "", line.lower())


def _lines_for(lines, pattern):
    return [l for l in lines if re.search(pattern, _norm(l))]


def test_doctor_exits_0(doctor):
    cp, lines = doctor
    assert cp.returncode == 0, lines


@pytest.mark.parametrize("feature", sorted(MENTIONED))
def test_doctor_mentions_feature(doctor, feature):
    _, lines = doctor
    found = _lines_for(lines, MENTIONED[feature])
    assert found, f"{feature!r} not in doctor output: {lines}"
    assert all(re.search(r"\bok\b|\bFAIL\b", l) for l in found), found


@pytest.mark.parametrize("feature", sorted(REQUIRED))
def test_required_feature_ok(doctor, feature):
    # hutch works on this host (the rest of the suite runs), so what it
    # requires must say ok.
    _, lines = doctor
    found = _lines_for(lines, REQUIRED[feature])
    assert found and any(re.search(r"\bok\b", l) and "FAIL" not in l for l in found), found


def test_every_feature_line_has_a_verdict(doctor):
    _, lines = doctor
    verdicts = [l for l in lines if re.search(r"\bok\b|\bFAIL\b", l)]
    assert len(verdicts) >= len(MENTIONED), lines


def test_root_only_files_under_usr_are_flagged(hutch_bin, tmp_path):
    """The host template binds /usr into sandboxes id-mapped as a whole, so
    a file only host root may read there is readable by a sandbox's root:
    doctor names it (a warning, not a failure)."""
    import os
    d = Path("/usr/local/share") / f"hutch-doctor-test-{os.getpid()}"
    d.mkdir(parents=True)
    try:
        secret = d / "secret.key"
        secret.write_text("not really a key\n")
        secret.chmod(0o600)
        cp = run_hutch(["doctor"], timeout=120)
        lines = [l for l in cp.stdout.decode().splitlines() if l.startswith("host /usr")]
        assert len(lines) == 1, cp.stdout
        assert " warn " in lines[0] and "only root may read" in lines[0], lines
        assert cp.returncode == 0, "a warning, not a failed required check"
        # the count names it, and it is among the paths shown when it is one of the first three
        n = int(re.search(r"warn\s+(\d+) file", lines[0]).group(1))
        assert n >= 1
        if n <= 3:
            assert str(secret) in lines[0], lines[0]
    finally:
        for p in sorted(d.rglob("*"), reverse=True):
            p.unlink()
        d.rmdir()
