"""`hutch run`: output streams, exit statuses, stdin, environment, user, cwd."""

import os
import secrets

import pytest

import hutchtest
from hutchtest import assert_single_error_line, parse_json_summary


def test_echo_hi(run):
    cp = run([], ["echo", "hi"])
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, b"hi\n", b"")


def test_stdout_and_stderr_are_separate(run):
    cp = run([], ["sh", "-c", "echo out; echo err >&2; echo out2"])
    assert cp.returncode == 0
    assert cp.stdout == b"out\nout2\n"
    assert cp.stderr == b"err\n"


def test_argv_is_passed_verbatim(run):
    # No shell in between: spaces, empty args, quotes and $ arrive as given.
    args = ["a b", "", 'c"d', "$HOME", "*", "--memory", "e\tf"]
    cp = run([], ["printf", "[%s]", *args])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == "".join(f"[{a}]" for a in args).encode()


def test_flags_after_double_dash_belong_to_the_command(run):
    cp = run([], ["echo", "--memory", "abc", "--timeout", "xyz"])
    assert (cp.returncode, cp.stdout) == (0, b"--memory abc --timeout xyz\n")


@pytest.mark.parametrize("code", [0, 1, 42, 255])
def test_exit_code_propagates(run, code):
    cp = run([], ["sh", "-c", f"exit {code}"])
    assert cp.returncode == code
    assert cp.stderr == b""


@pytest.mark.parametrize("sig,expected", [("TERM", 143), ("9", 137), ("INT", 130)])
def test_death_by_signal_is_128_plus_n(run, sig, expected):
    cp = run([], ["sh", "-c", f"kill -{sig} $$; sleep 10; exit 3"])
    assert cp.returncode == expected, cp.stderr


def test_missing_command_is_127(run, baseline):
    name = "no-such-command-" + secrets.token_hex(4)
    cp = run([], [name, "arg"])
    assert cp.returncode == hutchtest.EXIT_NOT_FOUND
    assert cp.stdout == b""
    assert_single_error_line(cp, name)
    hutchtest.assert_no_leak(baseline)


def test_missing_absolute_path_is_127(run):
    cp = run([], ["/no/such/dir/prog"])
    assert cp.returncode == hutchtest.EXIT_NOT_FOUND
    assert_single_error_line(cp, "/no/such/dir/prog")


@pytest.mark.parametrize("path", ["/etc/passwd", "/tmp"])
def test_not_executable_is_126(run, path):
    # /etc/passwd: a regular file without x bits (0644); /tmp: a directory.
    cp = run([], [path])
    assert cp.returncode == hutchtest.EXIT_NOT_EXECUTABLE
    assert cp.stdout == b""
    assert_single_error_line(cp, path)


def test_shell_not_found_status_propagates(run):
    # The command's own 127 (here from sh) is just an exit status.
    cp = run([], ["sh", "-c", "no-such-command-xyz 2>/dev/null"])
    assert (cp.returncode, cp.stderr) == (127, b"")


# ------------------------------------------------------------------ stdin

def test_stdin_binary_roundtrip(run):
    data = os.urandom(1 << 20)
    cp = run([], ["cat"], stdin=data)
    assert cp.returncode == 0, cp.stderr
    assert len(cp.stdout) == len(data)
    assert cp.stdout == data


def test_stdin_eof_reaches_command(run):
    data = os.urandom(1 << 20)
    cp = run([], ["wc", "-c"], stdin=data)
    assert (cp.returncode, cp.stdout.strip()) == (0, b"1048576")


def test_stdin_eof_then_command_continues(run):
    cp = run([], ["sh", "-c", "cat; echo after-eof"], stdin=b"abc")
    assert (cp.returncode, cp.stdout) == (0, b"abcafter-eof\n")


def test_empty_stdin(run):
    cp = run([], ["wc", "-c"], stdin=b"")
    assert (cp.returncode, cp.stdout.strip()) == (0, b"0")


def test_stdin_devnull(run):
    cp = run([], ["wc", "-c"], stdin=None)
    assert (cp.returncode, cp.stdout.strip()) == (0, b"0")


# ------------------------------------------------------------ environment

def _env_of(run, args=(), env=None):
    cp = run(list(args), ["env", "-0"], env=env)
    assert cp.returncode == 0, cp.stderr
    out = {}
    for item in cp.stdout.split(b"\0"):
        if item:
            k, _, v = item.partition(b"=")
            out[k.decode()] = v.decode()
    return out


def test_env_flag(run):
    env = _env_of(run, ["--env", "FOO=bar", "--env", "EQ=a=b=c", "--env", "SP=x y",
                        "--env", "EMPTY="])
    assert env["FOO"] == "bar"
    assert env["EQ"] == "a=b=c"
    assert env["SP"] == "x y"
    assert env["EMPTY"] == ""


def test_env_flag_overrides_default(run):
    env = _env_of(run, ["--env", "HOME=/tmp"])
    assert env["HOME"] == "/tmp"


def test_default_environment(run):
    env = _env_of(run)
    assert env.get("HOME") == "/home/user"
    assert env.get("USER") == "user"
    path = env.get("PATH", "").split(":")
    assert "/usr/bin" in path and "/bin" in path, env.get("PATH")
    assert all(p.startswith("/") for p in path), env.get("PATH")


def test_host_environment_does_not_leak(run):
    token = "hutch-canary-" + secrets.token_hex(8)
    host_env = dict(os.environ, HUTCH_TEST_CANARY=token, AWS_SECRET_ACCESS_KEY=token)
    cp = run([], ["env"], env=host_env)
    assert cp.returncode == 0, cp.stderr
    assert token.encode() not in cp.stdout
    assert b"HUTCH_TEST_CANARY" not in cp.stdout


# -------------------------------------------------------------- user, cwd

@pytest.mark.parametrize("args,uid,gid", [
    ([], "1000", "1000"),
    (["--user", "user"], "1000", "1000"),
    (["--user", "root"], "0", "0"),
    (["--user", "1234"], "1234", None),
])
def test_user(run, args, uid, gid):
    cp = run(args, ["sh", "-c", "id -u; id -g"])
    assert cp.returncode == 0, cp.stderr
    got_uid, got_gid = cp.stdout.decode().split()
    assert got_uid == uid
    if gid is not None:
        assert got_gid == gid


def test_default_user_name(run):
    cp = run([], ["sh", "-c", "id -un; whoami"])
    assert (cp.returncode, cp.stdout) == (0, b"user\nuser\n"), cp.stderr


def test_default_cwd_is_home(run):
    cp = run([], ["pwd"])
    assert (cp.returncode, cp.stdout) == (0, b"/home/user\n")


def test_workdir(run):
    cp = run(["--workdir", "/tmp"], ["sh", "-c", "pwd; /bin/pwd -P"])
    assert (cp.returncode, cp.stdout) == (0, b"/tmp\n/tmp\n")


def test_workdir_nonexistent_fails_cleanly(run, baseline):
    cp = run(["--workdir", "/nonexistent"], ["pwd"])
    # Not started: hutch's own failure (125) or "cannot run" (126/127), never
    # the command's output and never a crash.
    assert cp.returncode in (125, 126, 127), cp.returncode
    assert cp.stdout == b""
    assert_single_error_line(cp, "/nonexistent")
    hutchtest.assert_no_leak(baseline)


# ------------------------------------------------------------------ --json

def test_json_summary_fields(run):
    cp = run(["--json"], ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert cp.returncode == 3
    assert cp.stdout == b"out\n"
    rest, s = parse_json_summary(cp)
    assert rest == ["err"]
    assert s["exit_code"] == 3
    assert s["signal"] is None
    assert s["timed_out"] is False
    assert s["oom_killed"] is False
    assert s["wall_ms"] > 0
    assert s["cpu_ms"] >= 0
    assert s["memory_peak_bytes"] > 0


def test_json_summary_on_signal(run):
    cp = run(["--json"], ["sh", "-c", "kill -TERM $$"])
    assert cp.returncode == 143
    rest, s = parse_json_summary(cp)
    assert rest == []
    assert (s["exit_code"], s["signal"]) == (None, 15)
    assert s["timed_out"] is False and s["oom_killed"] is False


def test_json_sandbox_ids_are_fresh(run):
    ids = set()
    for _ in range(3):
        cp = run(["--json"], ["true"])
        assert cp.returncode == 0
        ids.add(parse_json_summary(cp)[1]["sandbox_id"])
    assert len(ids) == 3


def test_json_not_printed_without_flag(run):
    cp = run([], ["sh", "-c", "echo err >&2"])
    assert cp.stderr == b"err\n"
