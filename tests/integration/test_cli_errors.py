"""One error style across the CLI (issue: a newcomer's first hour): every
usage error exits 2 with one line starting "hutch: " that names what was
wrong (the bound a value missed, the argument it did not know), every verb
refuses what it does not know, and a usage error changes nothing on disk."""

import json
import re

import pytest

import hutchtest
from hutchtest import assert_single_error_line, run_hutch


@pytest.mark.parametrize("args, needle", [
    (["run", "--memory", "1", "--", "true"], "at least 4M"),
    (["run", "--memory", "0", "--", "true"], "at least 4M"),
    (["run", "--disk", "2T", "--", "true"], "from 1M to 1T"),
    (["run", "--disk", "100K", "--", "true"], "from 1M to 1T"),
    (["run", "--inodes", "5", "--", "true"], "from 64 to 4294967296"),
    (["run", "--pids", "0", "--", "true"], "from 1 to 4194304"),
    (["run", "--bogus", "--", "true"], "unknown option '--bogus'"),
    (["serve", "--listen", "bad"], "wants HOST:PORT"),
    (["serve", "--listen", "127.0.0.1:99999"], "bad port"),
    (["serve", "--listen", "localhost:80"], "numeric address"),
    (["serve", "--bogus", "1"], "unknown setting 'bogus'"),
    (["serve", "--memory", "1"], "memory: 1 is out of range"),
    (["doctor", "--bogus"], "unknown argument '--bogus'"),
    (["ps", "--bogus"], "unknown option '--bogus'"),
    (["ps", "stray"], "unexpected argument 'stray'"),
    (["ps", "--filter"], "option '--filter' needs a value"),
    (["kill", "--bogus"], "unknown option '--bogus'"),
    (["gc", "--bogus"], "usage: hutch gc"),
    (["version", "--bogus"], "unknown argument '--bogus'"),
    (["frobnicate"], "unknown verb 'frobnicate'"),
])
def test_usage_errors_exit_2_with_one_line(args, needle, tmp_path):
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HUTCH_DATA_DIR": str(tmp_path / "data"),
           "HUTCH_RUN_DIR": str(tmp_path / "run")}
    cp = run_hutch([*args, *(["--data-dir", str(tmp_path / "data")] if args[0] == "serve" else [])], env=env)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert_single_error_line(cp, needle)
    assert not (tmp_path / "data").exists(), "a usage error created the data dir"
    assert not (tmp_path / "run").exists(), "a usage error created the run dir"


@pytest.mark.parametrize("args, needle", [
    (["key", "--bogus"], "unknown subcommand '--bogus'"),
    (["key", "list", "extra"], "unexpected argument 'extra'"),
    (["key", "revoke"], "wants a KEY_ID"),
    (["key", "revoke", "abc"], "wants a numeric KEY_ID"),
    (["key", "create", "--team"], "option '--team' needs a value"),
    (["key", "create", "--bogus"], "unknown option '--bogus'"),
    (["key", "create", "extra"], "unexpected argument 'extra'"),
])
def test_key_usage_errors_change_nothing(args, needle, tmp_path):
    """`hutch key` prints its usage after the error line; the data dir (and
    its database) is not created for a usage error."""
    cp = run_hutch([*args], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                 "HUTCH_DATA_DIR": str(tmp_path / "data")})
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    first = hutchtest.stderr_lines(cp)[0]
    assert first.startswith("hutch: ") and needle in first, cp.stderr
    assert "usage: hutch key" in cp.stderr.decode()
    assert not (tmp_path / "data").exists()


def test_config_file_error_names_file_line_and_key(tmp_path):
    conf = tmp_path / "hutch.conf"
    conf.write_text("# a comment\nlisten = 127.0.0.1:1\n\nmemory = 1\n")
    cp = run_hutch(["serve", "--config", str(conf), "--data-dir", str(tmp_path / "data")])
    assert cp.returncode == 2, cp.stderr
    assert_single_error_line(cp, f"{conf}:4: memory: 1 is out of range")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("verb", ["doctor", "kill", "gc", "ps", "run", "serve", "key", "volume", "usage",
                                  "audit", "node", "logs"])
def test_help_exits_0(verb):
    cp = run_hutch([verb, "--help"])
    assert cp.returncode == 0, (verb, cp.stderr)
    assert b"usage: hutch" in cp.stdout, (verb, cp.stdout)


@pytest.mark.parametrize("args, needle", [
    (["audit", "frob"], "unknown subcommand 'frob'"),
    (["audit", "verify", "--since", "1h"], "unknown option '--since'"),
    (["audit", "export", "--since"], "option '--since' needs a value"),
    (["audit", "export", "stray"], "unexpected argument 'stray'"),
    (["audit", "export", "--since", "soon"], "--since: expected"),
    (["audit", "export", "--format", "xml"], "--format is jsonl or csv"),
    (["audit", "export", "--kind", "Bad Kind"], "--kind: expected"),
    (["usage", "--by", "week"], "--by is sandbox or day"),
    (["usage", "--since", "tomorrow-ish"], "--since: expected"),
    (["usage", "--bogus"], "unknown option '--bogus'"),
    (["usage", "--team"], "option '--team' needs a value"),
    (["usage", "stray"], "unexpected argument 'stray'"),
    (["volume", "create", "v", "--size"], "option '--size' needs a value"),
    (["volume", "create", "v", "--bogus"], "unknown option '--bogus'"),
    (["volume", "rm", "v", "w"], "unexpected argument 'w'"),
    (["node", "status", "--bogus"], "unknown option '--bogus'"),
    (["node", "status", "stray"], "unexpected argument 'stray'"),
])
def test_audit_and_usage_errors_change_nothing(args, needle, tmp_path):
    """`hutch audit`, `usage`, `volume` and `node` refuse bad options (parsed
    with getopt_long) before they open anything: the data dir is not
    created."""
    cp = run_hutch([*args], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                 "HUTCH_DATA_DIR": str(tmp_path / "data")})
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    first = hutchtest.stderr_lines(cp)[0]
    assert first.startswith("hutch: ") and needle in first, cp.stderr
    assert not (tmp_path / "data").exists()


def test_verbs_take_getopt_forms(tmp_path):
    """key, volume and usage parse with getopt_long: `--opt=value`, options
    before or after the NAME, and `--` all work as in other GNU tools."""
    data = tmp_path / "data"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HUTCH_DATA_DIR": str(tmp_path / "elsewhere")}
    cp = run_hutch(["key", "create", f"--data-dir={data}", "--team=t9", "--label", "x y"], env=env)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.decode().startswith("e2b_"), cp.stdout
    cp = run_hutch(["key", "list", "--data-dir", str(data)], env=env)
    assert cp.returncode == 0, cp.stderr
    assert re.search(r"\bt9\b.*\bx y\b", cp.stdout.decode()), cp.stdout
    cp = run_hutch(["volume", "create", "--size=16M", f"--data-dir={data}", "--", "vol1"], env=env)
    assert cp.returncode == 0, cp.stderr
    cp = run_hutch(["volume", "ls", f"--data-dir={data}"], env=env)
    assert cp.returncode == 0, cp.stderr
    row = [ln.split() for ln in cp.stdout.decode().splitlines() if " vol1 " in ln]
    assert row and row[0][2] == "16M", cp.stdout
    cp = run_hutch(["volume", "rm", "vol1", f"--data-dir={data}"], env=env)
    assert cp.returncode == 0, cp.stderr
    cp = run_hutch(["usage", f"--data-dir={data}", "--json", "--by=day"], env=env)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["by"] == "day"
    assert not (tmp_path / "elsewhere").exists(), "--data-dir=DIR was not taken"
