"""`make install`: the binary (with hutch-init embedded) runs from where it
is installed, the systemd unit passes `systemd-analyze verify` with its
ExecStart and man page, the completions parse and complete, and
`make uninstall` takes it all away again."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hutchtest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def installed(tmp_path):
    dest = tmp_path / "dest"
    # -o build: install what this test run built, without building build/
    cp = subprocess.run(["make", "--no-print-directory", "-o", "build", "install", f"DESTDIR={dest}",
                         f"INSTALL_BIN={hutchtest.hutch_path()}"], cwd=ROOT, capture_output=True, timeout=120)
    assert cp.returncode == 0, cp.stderr.decode()
    return dest


def test_installed_files_and_binary_work(installed):
    bin_ = installed / "usr/local/bin/hutch"
    for rel in ["usr/local/share/man/man1/hutch.1", "usr/local/share/bash-completion/completions/hutch",
                "usr/local/share/zsh/site-functions/_hutch", "usr/local/share/doc/hutch/design.md",
                "usr/local/share/doc/hutch/api.md", "etc/systemd/system/hutch.service"]:
        assert (installed / rel).is_file(), rel
    assert os.access(bin_, os.X_OK)
    cp = subprocess.run([str(bin_), "run", "--", "echo", "installed"], capture_output=True, timeout=60)
    assert cp.returncode == 0 and cp.stdout == b"installed\n", cp
    man = subprocess.run(["man", "-l", str(installed / "usr/local/share/man/man1/hutch.1")],
                         capture_output=True, timeout=30, env={**os.environ, "MANWIDTH": "80", "PAGER": "cat"})
    assert man.returncode == 0 and b"EXIT STATUS" in man.stdout, man.stderr


def test_systemd_unit_verifies(installed, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (package systemd)")
    unit = (installed / "etc/systemd/system/hutch.service").read_text()
    assert "ExecStart=/usr/local/bin/hutch serve" in unit and "Type=notify" in unit
    assert "KillMode=process" in unit, "stopping the unit must not kill the sandboxes"
    # verify checks that ExecStart exists and the man page is found
    local = tmp_path / "hutch.service"
    local.write_text(unit.replace("/usr/local/bin/hutch", str(installed / "usr/local/bin/hutch")))
    cp = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, timeout=60,
                        env={**os.environ, "MANPATH": str(installed / "usr/local/share/man")})
    assert cp.returncode == 0, cp.stderr.decode()


def test_bash_completion(installed):
    script = installed / "usr/local/share/bash-completion/completions/hutch"
    out = subprocess.run(["bash", "-c", f'''source {script}
        COMP_WORDS=(hutch ru); COMP_CWORD=1; _hutch; echo "${{COMPREPLY[@]}}"
        PATH={installed / "usr/local/bin"}:$PATH
        COMP_WORDS=(hutch run --mem); COMP_CWORD=2; _hutch; echo "${{COMPREPLY[@]}}"
        COMP_WORDS=(hutch serve --tls-ce); COMP_CWORD=2; _hutch; echo "${{COMPREPLY[@]}}"'''],
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().split("\n")[:3] == ["run", "--memory", "--tls-cert"], out.stdout


def test_uninstall(installed):
    cp = subprocess.run(["make", "--no-print-directory", "uninstall", f"DESTDIR={installed}"], cwd=ROOT,
                        capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    left = [p for p in installed.rglob("*") if p.is_file()]
    assert not left, left
