#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A small client for the hutch-init control protocol (lib/sandbox/initproto.h).

Usable as a library by integration tests, and as a self-test that runs a
hutch-init binary outside any sandbox (it then is not PID 1 and acts as a
child subreaper) and drives every request type:

    python3 tests/helpers/initclient.py path/to/hutch-init    # prints TAP
"""
import array
import errno
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

MAGIC = 0x31495448
HEADER = struct.Struct("<IHHII")
MAX_FRAME = 16 + 60 * 1024

# message types
OK, ERROR, HELLO, SUBSCRIBE = 1, 2, 10, 11
SPAWN, SIGNAL, RESIZE, CLOSE_STDIN, ATTACH, LIST_PROCS, SPAWN_PART = 20, 21, 22, 23, 24, 25, 26
FS_STAT, FS_LIST, FS_MKDIR, FS_MOVE, FS_REMOVE, FS_OPEN_READ = 40, 41, 42, 43, 44, 45
FS_WRITE_BEGIN, FS_WRITE_COMMIT, FS_WRITE_ABORT, FS_WATCH_ADD, FS_WATCH_REMOVE = 46, 47, 48, 49, 50
EV_EXIT, EV_WATCH = 80, 81
F_MORE = 1
SUB_ALL_EXITS = 1
FDS_PIPES, FDS_PIPES_STDIN, FDS_PTY = 1, 2, 3
WEV_CREATE, WEV_WRITE, WEV_REMOVE, WEV_RENAME, WEV_CHMOD = 1, 2, 3, 4, 5

# field tags
T = dict(ERRNO=1, MESSAGE=2, VERSION=3, TOKEN=4, FLAGS=5, PID=10, ARG=11, ENV=12, CWD=13,
         UID=14, GID=15, STDIN=16, PTY_ROWS=17, PTY_COLS=18, TAG=19, SIGNAL=20, GROUP=21,
         EXIT_CODE=22, CORE=23, FD_LAYOUT=24, PTY=25, ARG_MORE=26, ENV_MORE=27, STAGED=28, CPU_US=29, REQUEST_ID=30, PATH=40, PATH2=41, DEPTH=42, PARENTS=43,
         CREATED=44, SIZE=45, WRITE_ID=46, RECURSIVE=47, WATCH_ID=48, EVENT=49, NAME=60,
         TYPE=61, TARGET_TYPE=62, SYMLINK=63, MODE=64, FUID=65, FGID=66, MTIME_NS=67,
         OWNER=68, GROUPNAME=69)
TAG_NAME = {v: k for k, v in T.items()}
STRING_TAGS = {T[k] for k in ("MESSAGE", "TOKEN", "ARG", "ENV", "ARG_MORE", "ENV_MORE", "CWD", "TAG", "REQUEST_ID",
                              "PATH", "PATH2",
                              "NAME", "SYMLINK", "OWNER", "GROUPNAME")}
REPEATED = {T["ARG"], T["ENV"]}


def encode(mtype, fields=(), flags=0, id=0):
    """fields: iterable of (tag name or number, int | str | bytes)."""
    payload = b""
    for tag, value in fields:
        tag = T[tag] if isinstance(tag, str) else tag
        if isinstance(value, bool) or isinstance(value, int):
            value = struct.pack("<Q", int(value) & (2**64 - 1))
        elif isinstance(value, str):
            value = value.encode()
        payload += struct.pack("<HI", tag, len(value)) + value
    return HEADER.pack(MAGIC, mtype, flags, id, len(payload)) + payload


class Msg:
    def __init__(self, mtype, flags, id, fields, fds):
        self.type, self.flags, self.id, self.fields, self.fds = mtype, flags, id, fields, fds

    def get(self, name, default=None):
        for tag, v in self.fields:
            if tag == T[name]:
                return v
        return default

    def all(self, name):
        return [v for tag, v in self.fields if tag == T[name]]

    def __repr__(self):
        fs = ", ".join(f"{TAG_NAME.get(t, t)}={v!r}" for t, v in self.fields)
        return f"<msg type={self.type} flags={self.flags} id={self.id} {fs} fds={self.fds}>"


def decode(data, fds=()):
    magic, mtype, flags, id, plen = HEADER.unpack_from(data)
    if magic != MAGIC or plen != len(data) - HEADER.size:
        raise ValueError("bad frame")
    fields, p = [], HEADER.size
    while p < len(data):
        tag, flen = struct.unpack_from("<HI", data, p)
        v = data[p + 6:p + 6 + flen]
        if len(v) != flen:
            raise ValueError("truncated field")
        p += 6 + flen
        if tag in STRING_TAGS:
            v = v.decode(errors="surrogateescape")
        elif flen == 8:
            v = struct.unpack("<Q", v)[0]
        fields.append((tag, v))
    return Msg(mtype, flags, id, fields, list(fds))


class InitError(Exception):
    def __init__(self, msg):
        self.errno = msg.get("ERRNO")
        self.message = msg.get("MESSAGE")
        super().__init__(f"[{errno.errorcode.get(self.errno, self.errno)}] {self.message}")


class Client:
    def __init__(self, sock):
        self.sock = sock
        self.next_id = 1
        self.events = []

    def close(self):
        self.sock.close()

    def send(self, mtype, fields=(), id=None):
        if id is None:
            id = self.next_id
            self.next_id += 1
        self.sock.send(encode(mtype, fields, id=id))
        return id

    def recv(self, timeout=10):
        self.sock.settimeout(timeout)
        data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_FRAME, 8)
        if not data:
            raise EOFError("init closed the connection")
        return decode(data, fds)

    def reply(self, id, timeout=10):
        """Next message answering id; events seen meanwhile are queued."""
        while True:
            m = self.recv(timeout)
            if m.id == id and m.type in (OK, ERROR):
                return m
            self.events.append(m)

    def call(self, mtype, fields=(), timeout=10):
        m = self.reply(self.send(mtype, fields), timeout)
        if m.type == ERROR:
            for fd in m.fds:
                os.close(fd)
            raise InitError(m)
        return m

    def stream(self, mtype, fields=(), timeout=10):
        """All OK+F_MORE replies; the final one ends the list."""
        id = self.send(mtype, fields)
        out = []
        while True:
            m = self.reply(id, timeout)
            if m.type == ERROR:
                raise InitError(m)
            if not m.flags & F_MORE:
                return out
            out.append(m)

    def event(self, mtype, timeout=10, match=lambda m: True):
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.events):
                if m.type == mtype and match(m):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no event {mtype}")
            self.events.append(self.recv(left))

    def hello(self, token):
        return self.call(HELLO, [("VERSION", 1), ("TOKEN", token)])

    def spawn(self, argv, env=None, cwd=None, uid=0, gid=0, stdin=False, pty=None, tag=None, request_id=None):
        f = [("ARG", a) for a in argv] + [("ENV", e) for e in (env or [])]
        if cwd is not None:
            f.append(("CWD", cwd))
        f += [("UID", uid), ("GID", gid), ("STDIN", 1 if stdin else 0)]
        if pty:
            f += [("PTY_ROWS", pty[0]), ("PTY_COLS", pty[1])]
        if tag is not None:
            f.append(("TAG", tag))
        if request_id is not None:
            f.append(("REQUEST_ID", request_id))
        return self.call(SPAWN, f)

    def write_file(self, path, data, uid=0, gid=0):
        m = self.call(FS_WRITE_BEGIN, [("PATH", path), ("UID", uid), ("GID", gid)])
        with os.fdopen(m.fds[0], "wb") as f:
            f.write(data)
        return self.call(FS_WRITE_COMMIT, [("WRITE_ID", m.get("WRITE_ID")), ("SIZE", len(data))])


def read_all(fd, timeout=10):
    """Read an fd to EOF (closing it)."""
    out = b""
    os.set_blocking(fd, True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                b = os.read(fd, 65536)
            except OSError as e:
                if e.errno == errno.EIO:  # pty master after the slave closed
                    break
                raise
            if not b:
                break
            out += b
    finally:
        os.close(fd)
    return out


class Init:
    """hutch-init started outside a sandbox with its two sockets."""

    def __init__(self, binary, debug=False):
        self.dir = tempfile.mkdtemp(prefix="hutch-init-test.")
        self.sock_path = os.path.join(self.dir, "init.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(self.sock_path)
        listener.listen(16)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lfd, cfd = listener.fileno(), theirs.fileno()

        def place_fds():
            # dup2 onto 3 and 4 clears CLOEXEC; go through high numbers
            # first in case the sources already sit on 3 or 4.
            a, b = os.dup(lfd) + 100, os.dup(cfd) + 100
            os.dup2(lfd, a)
            os.dup2(cfd, b)
            os.dup2(a, 3)
            os.dup2(b, 4)

        env = dict(os.environ)
        if debug:
            env["HUTCH_INIT_DEBUG"] = "1"
        self.proc = subprocess.Popen([binary], preexec_fn=place_fds, pass_fds=(3, 4),
                                     stdin=subprocess.DEVNULL, env=env,
                                     stdout=None if debug else subprocess.DEVNULL,
                                     stderr=None if debug else subprocess.DEVNULL)
        listener.close()
        theirs.close()
        self.creator = Client(ours)

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(self.sock_path)
        return Client(s)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.creator.close()


# ---------------------------------------------------------------- self-test

class Tap:
    def __init__(self):
        self.n = self.failed = 0

    def ok(self, cond, what, detail=""):
        self.n += 1
        if not cond:
            self.failed += 1
        print(f"{'ok' if cond else 'not ok'} {self.n} - {what}")
        if not cond and detail:
            print("#   " + str(detail).replace("\n", "\n#   "))
        sys.stdout.flush()
        return cond

    def run(self, what, fn):
        try:
            fn()
        except Exception as e:  # a crash in one check must not hide the others
            import traceback
            self.ok(False, what, traceback.format_exc())


def expect_error(fn, err):
    try:
        fn()
    except InitError as e:
        return e.errno == err, e
    return False, "no error"


def selftest(binary):
    t = Tap()
    init = Init(binary, debug=bool(os.environ.get("HUTCH_INIT_DEBUG")))
    c = init.creator
    tmp = tempfile.mkdtemp(prefix="hutch-init-files.")
    os.chmod(tmp, 0o777)
    token = "s3cret-token-0123456789"

    def hello():
        m = c.hello(token)
        t.ok(m.get("VERSION") == 1 and m.get("PID") == init.proc.pid, "hello", m)
    t.run("hello", hello)

    def echo():
        m = c.spawn(["echo", "hi"], cwd="/tmp", env=["PATH=/usr/bin:/bin"])
        t.ok(m.get("FD_LAYOUT") == FDS_PIPES and len(m.fds) == 2, "spawn: two pipes", m)
        out, err = read_all(m.fds[0]), read_all(m.fds[1])
        t.ok(out == b"hi\n" and err == b"", "spawn: output", (out, err))
        ev = c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        t.ok(ev.get("EXIT_CODE") == 0 and ev.get("SIGNAL") == 0 and ev.id == 0, "spawn: exit", ev)
    t.run("echo", echo)

    def exit_code():
        m = c.spawn(["sh", "-c", "echo err >&2; exit 3"], cwd="/")
        err = read_all(m.fds[1])
        os.close(m.fds[0])
        ev = c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        t.ok(err == b"err\n" and ev.get("EXIT_CODE") == 3, "exit code and stderr", (err, ev))
    t.run("exit code", exit_code)

    def bad_cmd():
        ok, e = expect_error(lambda: c.spawn(["/bad/cmd"], cwd="/"), errno.ENOENT)
        t.ok(ok and e.message == "exec /bad/cmd: No such file or directory", "exec failure", e)
        ok, e = expect_error(lambda: c.spawn(["no-such-command-xyz"], cwd="/"), errno.ENOENT)
        t.ok(ok, "PATH search failure", e)
        ok, e = expect_error(lambda: c.spawn(["true"], cwd="/nonexistent"), errno.ENOENT)
        t.ok(ok and "chdir /nonexistent" in e.message, "missing cwd", e)
        ok, e = expect_error(lambda: c.spawn([], cwd="/"), errno.EINVAL)
        t.ok(ok, "empty argv", e)
        # and no EV_EXIT for any of them
        try:
            ev = c.event(EV_EXIT, timeout=0.3)
            t.ok(False, "no exit event for failed spawns", ev)
        except TimeoutError:
            t.ok(True, "no exit event for failed spawns")
    t.run("bad cmd", bad_cmd)

    def default_env():
        m = c.spawn(["/usr/bin/env"], cwd="/")
        os.close(m.fds[1])
        env = set(read_all(m.fds[0]).decode().split("\n"))
        want = {"HOME=/root", "USER=root", "LOGNAME=root", "SHELL=/bin/bash", "LANG=C.UTF-8",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        t.ok(want <= env and "HUTCH_INIT_DEBUG=1" not in env, "default environment", env)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
    t.run("default env", default_env)

    def user():
        m = c.spawn(["sh", "-c", "id -u; id -g; id -G; pwd; ls /proc/self/fd | wc -l"],
                    cwd="/tmp", uid=1000, gid=1000)
        os.close(m.fds[1])
        out = read_all(m.fds[0]).decode().split()
        # fds: 0,1,2 and the one ls opens for the listing
        t.ok(out[:4] == ["1000", "1000", "1000", "/tmp"] and out[4] == "4",
             "runs as the user, only stdio inherited", out)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        home = next((l.split(":")[5] for l in open("/etc/passwd")
                     if l.split(":")[2:3] == ["1000"]), "/home/user")
        if os.path.isdir(home):
            m = c.spawn(["pwd"], uid=1000, gid=1000)
            os.close(m.fds[1])
            out = read_all(m.fds[0]).decode().strip()
            t.ok(out == home, "default cwd is the user's home", out)
            c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        else:
            ok, e = expect_error(lambda: c.spawn(["true"], uid=1000, gid=1000), errno.ENOENT)
            t.ok(ok, "default cwd is the user's home (missing: ENOENT)", e)
        ok, e = expect_error(lambda: c.spawn(["true"], cwd="/", uid=2**32 - 1), errno.EINVAL)
        t.ok(ok, "uid -1 refused", e)
    t.run("user", user)

    def signals_reset():
        m = c.spawn(["sh", "-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status"], cwd="/")
        os.close(m.fds[1])
        out = read_all(m.fds[0]).decode()
        t.ok("SigBlk:\t0000000000000000" in out and "SigIgn:\t0000000000000000" in out,
             "signal mask and dispositions reset", out)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
    t.run("signals", signals_reset)

    def stdin_pipe():
        m = c.spawn(["cat"], cwd="/", stdin=True)
        t.ok(m.get("FD_LAYOUT") == FDS_PIPES_STDIN and len(m.fds) == 3, "stdin pipe layout", m)
        os.write(m.fds[0], b"abc")
        os.close(m.fds[0])
        c.call(CLOSE_STDIN, [("PID", m.get("PID"))])
        out = read_all(m.fds[1])
        os.close(m.fds[2])
        t.ok(out == b"abc", "stdin reaches the process, EOF after CLOSE_STDIN", out)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
    t.run("stdin", stdin_pipe)

    def pty():
        m = c.spawn(["sh", "-c", "stty size; test -t 0 && echo tty; read x; echo got $x"],
                    cwd="/", pty=(24, 80), env=["PATH=/usr/bin:/bin"])
        t.ok(m.get("FD_LAYOUT") == FDS_PTY and m.get("PTY") == 1 and len(m.fds) == 1,
             "pty layout", m)
        fd = m.fds[0]
        os.write(fd, b"line\n")
        out = read_all(fd).decode()
        t.ok("24 80" in out and "tty" in out and "got line" in out, "pty works", out)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
    t.run("pty", pty)

    def resize():
        m = c.spawn(["sh", "-c", "read x; stty size"], cwd="/", pty=(10, 20))
        c.call(RESIZE, [("PID", m.get("PID")), ("PTY_ROWS", 50), ("PTY_COLS", 132)])
        listed = [p for p in c.stream(LIST_PROCS) if p.get("PID") == m.get("PID")]
        t.ok(listed and listed[0].get("PTY") == 1 and listed[0].get("PTY_ROWS") == 50 and
             listed[0].get("PTY_COLS") == 132, "list shows the pty size", listed)
        os.write(m.fds[0], b"\n")
        out = read_all(m.fds[0]).decode()
        t.ok("50 132" in out, "resize", out)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        p = c.spawn(["sleep", "100"], cwd="/")
        ok, e = expect_error(lambda: c.call(RESIZE, [("PID", p.get("PID")), ("PTY_ROWS", 5),
                                                     ("PTY_COLS", 5)]), errno.ENOTTY)
        t.ok(ok, "resize without a pty: ENOTTY", e)
        c.call(SIGNAL, [("PID", p.get("PID")), ("SIGNAL", 9)])
        for fd in p.fds:
            os.close(fd)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == p.get("PID"))
    t.run("resize", resize)

    def request_ids_and_cpu():
        good = c.spawn(["sh", "-c", "read x"], cwd="/", stdin=True, request_id="rid-7.a_B")
        bad = c.spawn(["sh", "-c", "read x"], cwd="/", stdin=True, request_id="bad id\n{")
        listed = {p.get("PID"): p for p in c.stream(LIST_PROCS)}
        t.ok(listed[good.get("PID")].get("REQUEST_ID") == "rid-7.a_B", "a spawn's request id is kept and listed",
             listed.get(good.get("PID")))
        t.ok(listed[bad.get("PID")].get("REQUEST_ID") is None, "a malformed request id is not kept",
             listed.get(bad.get("PID")))
        for m in (good, bad):
            os.write(m.fds[0], b"\n")
            os.close(m.fds[0])
        ev = c.event(EV_EXIT, match=lambda e: e.get("PID") == good.get("PID"))
        t.ok(isinstance(ev.get("CPU_US"), int) and ev.get("CPU_US") >= 0, "an exit says the CPU it used", ev)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == bad.get("PID"))
    t.run("request ids and cpu", request_ids_and_cpu)

    def signal():
        m = c.spawn(["sh", "-c", "sleep 100 & wait"], cwd="/")
        pid = m.get("PID")
        c.call(SIGNAL, [("PID", pid), ("SIGNAL", 15), ("GROUP", 1)])
        ev = c.event(EV_EXIT, match=lambda e: e.get("PID") == pid)
        t.ok(ev.get("SIGNAL") == 15, "signal the group", ev)
        for fd in m.fds:
            os.close(fd)
        ok, e = expect_error(lambda: c.call(SIGNAL, [("PID", pid), ("SIGNAL", 9)]), errno.ESRCH)
        t.ok(ok, "signal an exited pid: ESRCH", e)
        ok, e = expect_error(lambda: c.call(SIGNAL, [("PID", 1), ("SIGNAL", 9)]), errno.ESRCH)
        t.ok(ok, "signal an untracked pid: ESRCH", e)
    t.run("signal", signal)

    def second_client():
        bad = init.connect()
        try:
            bad.hello("wrong-token")
            t.ok(False, "wrong token refused")
        except (EOFError, ConnectionError, InitError) as e:
            t.ok(isinstance(e, (EOFError, ConnectionError)), "wrong token: connection closed", e)
        bad.close()
        noauth = init.connect()
        try:
            noauth.call(LIST_PROCS)
            t.ok(False, "request before hello refused")
        except (EOFError, ConnectionError):
            t.ok(True, "request before hello: connection closed")
        noauth.close()

        other = init.connect()
        other.hello(token)
        m = c.spawn(["sh", "-c", "read x; echo reattached $x"], cwd="/", stdin=True, tag="job-7")
        pid = m.get("PID")
        for fd in m.fds:
            os.close(fd)
        procs = other.stream(LIST_PROCS)
        mine = [p for p in procs if p.get("PID") == pid]
        t.ok(len(mine) == 1 and mine[0].get("TAG") == "job-7" and
             mine[0].all("ARG")[0] == "sh" and mine[0].get("CWD") == "/", "list procs", procs)
        a = other.call(ATTACH, [("TAG", "job-7")])
        t.ok(a.get("PID") == pid and a.get("FD_LAYOUT") == FDS_PIPES_STDIN and len(a.fds) == 3,
             "attach by tag", a)
        os.write(a.fds[0], b"yes\n")
        os.close(a.fds[0])
        out = read_all(a.fds[1])
        os.close(a.fds[2])
        t.ok(out == b"reattached yes\n", "attached pipes work", out)
        ev = other.event(EV_EXIT, match=lambda e: e.get("PID") == pid)
        t.ok(ev.get("EXIT_CODE") == 0, "attacher gets the exit", ev)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == pid)

        # the exit is remembered for a later ATTACH
        r = other.call(ATTACH, [("PID", pid)])
        t.ok(r.get("EXIT_CODE") == 0 and not r.fds and r.get("FD_LAYOUT") is None,
             "attach after the exit", r)

        # all-exits subscription
        other.call(SUBSCRIBE, [("FLAGS", SUB_ALL_EXITS)])
        m = c.spawn(["true"], cwd="/")
        for fd in m.fds:
            os.close(fd)
        ev = other.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        t.ok(ev is not None, "subscriber gets other clients' exits")
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        other.close()
    t.run("second client", second_client)

    def creator_gone_exit_kept():
        other = init.connect()
        other.hello(token)
        m = other.spawn(["sh", "-c", "exit 5"], cwd="/")
        pid = m.get("PID")
        for fd in m.fds:
            os.close(fd)
        other.close()  # nobody listening when it exits
        time.sleep(0.3)
        third = init.connect()
        third.hello(token)
        r = third.call(ATTACH, [("PID", pid)])
        t.ok(r.get("EXIT_CODE") == 5, "exit kept for a client that reconnects", r)
        third.close()
    t.run("exit records", creator_gone_exit_kept)

    def orphans():
        m = c.spawn(["sh", "-c", "sleep 0.2 & exit 0"], cwd="/")
        for fd in m.fds:
            os.close(fd)
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        time.sleep(0.6)
        kids = open(f"/proc/{init.proc.pid}/task/{init.proc.pid}/children").read().split()
        zombies = [k for k in kids if open(f"/proc/{k}/stat").read().split(") ")[1][0] == "Z"]
        t.ok(not zombies, "orphans are reaped", kids)
    t.run("orphans", orphans)

    def files():
        d = os.path.join(tmp, "a/b/c")
        m = c.call(FS_MKDIR, [("PATH", d), ("PARENTS", 1), ("UID", 1000), ("GID", 1000)])
        st = os.stat(d)
        t.ok(m.get("CREATED") == 1 and st.st_uid == 1000 and (st.st_mode & 0o777) == 0o755,
             "mkdir -p as the user", (m, st))
        m = c.call(FS_MKDIR, [("PATH", d), ("PARENTS", 1), ("UID", 1000), ("GID", 1000)])
        t.ok(m.get("CREATED") == 0, "mkdir -p of an existing dir", m)
        open(os.path.join(tmp, "plain"), "w").close()
        ok, e = expect_error(lambda: c.call(FS_MKDIR, [("PATH", tmp + "/plain")]), errno.EEXIST)
        t.ok(ok, "mkdir over a file: EEXIST", e)

        data = os.urandom(300000)
        f = os.path.join(tmp, "new/dir/file.bin")
        m = c.write_file(f, data, uid=1000, gid=1000)
        st = os.stat(f)
        t.ok(open(f, "rb").read() == data and m.get("SIZE") == len(data) and
             m.get("PATH") == f and m.get("TYPE") == 1 and st.st_uid == 1000 and
             os.stat(os.path.dirname(f)).st_uid == 1000 and (st.st_mode & 0o777) == 0o644,
             "write: content, owner, parents", m)
        t.ok(not [n for n in os.listdir(os.path.dirname(f)) if "hutch-" in n],
             "write: no temp file left")

        # short write
        m = c.call(FS_WRITE_BEGIN, [("PATH", tmp + "/short"), ("UID", 0), ("GID", 0)])
        os.write(m.fds[0], b"abc")
        os.close(m.fds[0])
        ok, e = expect_error(lambda: c.call(FS_WRITE_COMMIT, [("WRITE_ID", m.get("WRITE_ID")),
                                                             ("SIZE", 4)]), errno.EIO)
        t.ok(ok and "short write" in e.message and not os.path.exists(tmp + "/short") and
             not [n for n in os.listdir(tmp) if "hutch-" in n], "short write: EIO, no file", e)

        # commit before EOF: reply waits for EOF
        m = c.call(FS_WRITE_BEGIN, [("PATH", tmp + "/late"), ("UID", 0), ("GID", 0)])
        id = c.send(FS_WRITE_COMMIT, [("WRITE_ID", m.get("WRITE_ID")), ("SIZE", 2)])
        time.sleep(0.1)
        os.write(m.fds[0], b"ok")
        os.close(m.fds[0])
        r = c.reply(id)
        t.ok(r.type == OK and open(tmp + "/late").read() == "ok", "commit waits for EOF", r)

        # abort
        m = c.call(FS_WRITE_BEGIN, [("PATH", tmp + "/aborted"), ("UID", 0), ("GID", 0)])
        os.write(m.fds[0], b"x")
        c.call(FS_WRITE_ABORT, [("WRITE_ID", m.get("WRITE_ID"))])
        os.close(m.fds[0])
        t.ok(not [n for n in os.listdir(tmp) if "aborted" in n], "abort removes the temp file")

        # onto a directory
        ok, e = expect_error(lambda: c.write_file(tmp + "/a", b"x"), errno.EISDIR)
        t.ok(ok, "write onto a directory: EISDIR", e)
        # as the user into a root-only dir
        os.mkdir(tmp + "/rootonly", 0o755)
        ok, e = expect_error(lambda: c.write_file(tmp + "/rootonly/f", b"x", uid=1000, gid=1000),
                             errno.EACCES)
        t.ok(ok, "permissions are the user's", e)
        # overwrite keeps the mode
        os.chmod(f, 0o755)
        c.write_file(f, b"#!/bin/sh\n", uid=1000, gid=1000)
        t.ok(os.stat(f).st_mode & 0o777 == 0o755, "overwrite keeps the mode")

        # stat, symlinks, names
        os.symlink("new/dir", tmp + "/link")
        m = c.call(FS_STAT, [("PATH", tmp + "/link")])
        t.ok(m.get("TYPE") == 3 and m.get("TARGET_TYPE") == 2 and m.get("SYMLINK") == "new/dir" and
             m.get("NAME") == "link", "stat of a symlink", m)
        m = c.call(FS_STAT, [("PATH", tmp + "//new/./dir/../dir/file.bin")])
        t.ok(m.get("PATH") == f and m.get("OWNER") in ("1000", open("/etc/passwd").read() and
             next((l.split(":")[0] for l in open("/etc/passwd") if l.split(":")[2:3] == ["1000"]),
                  "1000")), "stat: normalized path, owner name", m)
        m = c.call(FS_STAT, [("PATH", "/")])
        t.ok(m.get("PATH") == "/" and m.get("OWNER") == "root" and m.get("TYPE") == 2,
             "stat /", m)
        ok, e = expect_error(lambda: c.call(FS_STAT, [("PATH", "relative/x")]), errno.EINVAL)
        t.ok(ok, "relative path: EINVAL", e)
        ok, e = expect_error(lambda: c.call(FS_STAT, [("PATH", tmp + "/nope")]), errno.ENOENT)
        t.ok(ok and "No such file" in e.message, "stat missing: ENOENT", e)

        # open for reading
        m = c.call(FS_OPEN_READ, [("PATH", tmp + "/late")])
        t.ok(len(m.fds) == 1 and read_all(m.fds[0]) == b"ok" and m.get("SIZE") == 2,
             "open_read", m)
        ok, e = expect_error(lambda: c.call(FS_OPEN_READ, [("PATH", tmp)]), errno.EISDIR)
        t.ok(ok, "open_read of a directory: EISDIR", e)
        os.mkfifo(tmp + "/fifo")
        ok, e = expect_error(lambda: c.call(FS_OPEN_READ, [("PATH", tmp + "/fifo")]), errno.EINVAL)
        t.ok(ok, "open_read of a fifo: EINVAL, without blocking", e)

        # list
        entries = c.stream(FS_LIST, [("PATH", tmp), ("DEPTH", 1)])
        names = sorted(e.get("NAME") for e in entries)
        t.ok(names == sorted(os.listdir(tmp)), "list depth 1", names)
        entries = c.stream(FS_LIST, [("PATH", tmp), ("DEPTH", 2)])
        paths = {e.get("PATH") for e in entries}
        t.ok(tmp + "/a/b/c" not in paths and tmp + "/a/b" in paths and
             tmp + "/new/dir" in paths and tmp + "/link/file.bin" not in paths,
             "list depth 2", sorted(paths))
        entries = c.stream(FS_LIST, [("PATH", tmp), ("DEPTH", 3)])
        paths = {e.get("PATH") for e in entries}
        t.ok(tmp + "/a/b/c" in paths and tmp + "/new/dir/file.bin" in paths and
             tmp + "/link/file.bin" not in paths, "list depth 3, symlinks not followed",
             sorted(paths))
        ok, e = expect_error(lambda: c.stream(FS_LIST, [("PATH", f)]), errno.ENOTDIR)
        t.ok(ok, "list a file: ENOTDIR", e)
        big = os.path.join(tmp, "big")
        os.mkdir(big)
        for i in range(5000):
            open(os.path.join(big, f"f{i:05d}-" + "x" * 100), "w").close()
        entries = c.stream(FS_LIST, [("PATH", big)])
        t.ok(len(entries) == 5000, "list of 5000 entries (paced job)", len(entries))

        # move
        m = c.call(FS_MOVE, [("PATH", tmp + "/late"), ("PATH2", tmp + "/x/y/moved")])
        t.ok(m.get("PATH") == tmp + "/x/y/moved" and open(tmp + "/x/y/moved").read() == "ok",
             "move (destination parents created)", m)

        # remove: recursive, never through symlinks
        outside = tempfile.mkdtemp(prefix="hutch-init-outside.")
        open(outside + "/keep", "w").close()
        os.symlink(outside, tmp + "/a/b/escape")
        c.call(FS_REMOVE, [("PATH", tmp + "/a")])
        t.ok(not os.path.exists(tmp + "/a") and os.path.exists(outside + "/keep"),
             "remove -r does not follow symlinks")
        c.call(FS_REMOVE, [("PATH", tmp + "/link")])
        t.ok(not os.path.lexists(tmp + "/link") and os.path.exists(f), "remove a symlink")
        ok, e = expect_error(lambda: c.call(FS_REMOVE, [("PATH", tmp + "/nope")]), errno.ENOENT)
        t.ok(ok, "remove missing: ENOENT", e)
        ok, e = expect_error(lambda: c.call(FS_REMOVE, [("PATH", "/")]), errno.EBUSY)
        t.ok(ok, "remove /: refused", e)
    t.run("files", files)

    def watch():
        d = os.path.join(tmp, "w")
        os.mkdir(d)
        m = c.call(FS_WATCH_ADD, [("PATH", d), ("RECURSIVE", 1), ("UID", 0), ("GID", 0)])
        wid = m.get("WATCH_ID")

        def ev(path, kind):
            return c.event(EV_WATCH, timeout=5, match=lambda e: e.get("WATCH_ID") == wid and
                           e.get("PATH") == path and e.get("EVENT") == kind)
        with open(d + "/f", "w") as fh:
            fh.write("x")
        t.ok(ev(d + "/f", WEV_CREATE) and ev(d + "/f", WEV_WRITE), "watch: create, write")
        os.chmod(d + "/f", 0o600)
        t.ok(ev(d + "/f", WEV_CHMOD), "watch: chmod")
        os.rename(d + "/f", d + "/g")
        t.ok(ev(d + "/f", WEV_RENAME) and ev(d + "/g", WEV_CREATE), "watch: rename")
        os.unlink(d + "/g")
        t.ok(ev(d + "/g", WEV_REMOVE), "watch: remove")
        os.mkdir(d + "/sub")
        ev(d + "/sub", WEV_CREATE)
        time.sleep(0.05)  # let init add the new directory's watch
        open(d + "/sub/deep", "w").close()
        t.ok(ev(d + "/sub/deep", WEV_CREATE), "watch: recursive into a new subdirectory")
        c.call(FS_WATCH_REMOVE, [("WATCH_ID", wid)])
        ok, e = expect_error(lambda: c.call(FS_WATCH_REMOVE, [("WATCH_ID", wid)]), errno.ENOENT)
        t.ok(ok, "watch removed", e)
        ok, e = expect_error(lambda: c.call(FS_WATCH_ADD, [("PATH", d + "/sub/deep")]),
                             errno.ENOTDIR)
        t.ok(ok, "watch a file: ENOTDIR", e)
        ok, e = expect_error(lambda: c.call(FS_WATCH_ADD, [("PATH", d + "/none")]), errno.ENOENT)
        t.ok(ok, "watch a missing dir: ENOENT", e)
    t.run("watch", watch)

    def misbehaviour():
        ok, e = expect_error(lambda: c.call(999), errno.EOPNOTSUPP)
        t.ok(ok, "unknown type: EOPNOTSUPP", e)
        ok, e = expect_error(lambda: c.call(SIGNAL, [("PID", b"\x01\x02")]), errno.EBADMSG)
        t.ok(ok, "bad field size: EBADMSG", e)
        ok, e = expect_error(lambda: c.call(FS_STAT, [("PATH", b"/tmp\x00x")]), errno.EBADMSG)
        t.ok(ok, "NUL in a path: EBADMSG", e)
        bad = init.connect()
        bad.hello(token)
        bad.sock.send(b"garbage that is not a frame")
        try:
            bad.recv(timeout=5)
            t.ok(False, "malformed frame closes the connection")
        except (EOFError, ConnectionError):
            t.ok(True, "malformed frame closes the connection")
        bad.close()
        # a client that never reads: init must not block
        lazy = init.connect()
        lazy.hello(token)
        lazy.call(SUBSCRIBE, [("FLAGS", SUB_ALL_EXITS)])
        # init stops reading it once its replies pile up, so its own
        # sends end up blocking: send until they would.
        lazy.sock.setblocking(False)
        sent = 0
        try:
            for _ in range(100000):
                lazy.sock.send(encode(FS_LIST, [("PATH", "/"), ("DEPTH", 2)], id=7))
                sent += 1
        except BlockingIOError:
            pass
        m = c.call(FS_STAT, [("PATH", "/")], timeout=5)
        t.ok(m.get("PATH") == "/" and sent < 100000,
             "a client that does not read does not block others", sent)
        st = open(f"/proc/{init.proc.pid}/status").read()
        rss = int(next(l.split()[1] for l in st.splitlines() if l.startswith("VmRSS")))
        t.ok(rss < 32 * 1024, "and init's memory stays bounded", f"{rss} kB")
        lazy.close()
        t.ok(init.alive(), "init survived")
    t.run("misbehaviour", misbehaviour)

    def staged():
        # a command line past one frame: SPAWN_PART chunks, then SPAWN with STAGED
        big, env = "x" * 100000, "BIG=" + "y" * 70000

        def chunks(tag, more, s):
            return [(tag if i == 0 else more, s[i:i + 4096]) for i in range(0, len(s), 4096)] or [(tag, "")]
        items = [("ARG", "sh"), ("ARG", "-c"), ("ARG", 'printf %s "$1" | wc -c; printf %s "$BIG" | wc -c; printf "[%s]" "$2"'),
                 ("ARG", "sh")] + chunks("ARG", "ARG_MORE", big) + [("ARG", "")] + chunks("ENV", "ENV_MORE", env)
        frames, cur, size = [], [("FLAGS", 1)], 0
        for f in items:
            if size + 6 + len(f[1]) > 50000:
                frames.append(cur)
                cur, size = [("FLAGS", 0)], 0
            cur.append(f)
            size += 6 + len(f[1])
        frames.append(cur)
        for fr in frames:
            c.call(SPAWN_PART, fr)
        m = c.call(SPAWN, [("STAGED", 1), ("CWD", "/"), ("UID", 0), ("GID", 0), ("STDIN", 0)])
        out = read_all(m.fds[0])
        os.close(m.fds[1])
        c.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        t.ok(len(frames) >= 3 and out == b"100000\n70000\n[]", "staged: 100 KB argument, 70 KB variable, empty argument",
             (len(frames), out[:80]))
        # the SPAWN used the stage up
        ok, e = expect_error(lambda: c.call(SPAWN, [("STAGED", 1), ("CWD", "/")]), errno.EBADMSG)
        t.ok(ok, "staged: a second SPAWN finds nothing staged", e)
        ok, e = expect_error(lambda: c.call(SPAWN_PART, [("FLAGS", 1), ("ARG_MORE", "x")]), errno.EBADMSG)
        t.ok(ok, "staged: a chunk with no item before it: EBADMSG", e)
        ok, e = expect_error(lambda: c.call(SPAWN_PART, [("FLAGS", 1), ("ARG", "a\x00b")]), errno.EBADMSG)
        t.ok(ok, "staged: a NUL inside: EBADMSG", e)
        ok, e = expect_error(lambda: [c.call(SPAWN_PART, [("FLAGS", int(i == 0))] + [("ARG" if i == 0 else "ARG_MORE", "z" * 4096)] +
                                             [("ARG_MORE", "z" * 4096)] * 9) for i in range(4)], errno.E2BIG)
        t.ok(ok, "staged: one string past 131071 bytes: E2BIG", e)
        ok, e = expect_error(lambda: c.call(SPAWN, [("STAGED", 1), ("CWD", "/")]), errno.EBADMSG)
        t.ok(ok, "staged: an error empties the stage", e)
        c.call(SPAWN_PART, [("FLAGS", 1), ("ARG", "true")])
        ok, e = expect_error(lambda: c.call(SPAWN, [("STAGED", 1), ("ARG", "echo"), ("CWD", "/")]), errno.EBADMSG)
        t.ok(ok, "staged: a SPAWN with STAGED and its own argv: EBADMSG", e)
        t.ok(init.alive(), "staged: init survived")
    t.run("staged", staged)

    def creator_gone():
        c.close()
        time.sleep(0.2)
        other = init.connect()
        other.hello(token)
        m = other.spawn(["echo", "still here"], cwd="/")
        t.ok(read_all(m.fds[0]) == b"still here\n", "init outlives its creator")
        os.close(m.fds[1])
        other.event(EV_EXIT, match=lambda e: e.get("PID") == m.get("PID"))
        other.close()
        time.sleep(0.2)
        # 0-2, the listening socket, epoll, signalfd: nothing else is left
        fds = os.listdir(f"/proc/{init.proc.pid}/fd")
        t.ok(len(fds) == 6, "no descriptor leaked", [os.readlink(f"/proc/{init.proc.pid}/fd/{f}")
                                                     for f in fds])
    t.run("creator gone", creator_gone)

    t.ok(init.alive(), "init still running at the end")
    init.stop()
    subprocess.run(["rm", "-rf", tmp, init.dir])
    print(f"1..{t.n}")
    return 1 if t.failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} HUTCH_INIT_BINARY", file=sys.stderr)
        sys.exit(2)
    sys.exit(selftest(sys.argv[1]))
