# SPDX-License-Identifier: Apache-2.0
# Jupyter kernels for the languages Debian packages no kernel for: bash,
# JavaScript and TypeScript (node), Java (jshell). Each is an ipykernel
# Kernel driving one long-lived child process, so that state persists
# between cells; a cell's output streams as it comes, and SIGINT (the
# interpreter's interrupt) is passed on to the child.
#
#   python3 hutch_kernels.py bash|javascript|typescript|java CONNECTION_FILE
#   python3 hutch_kernels.py python CONNECTION_FILE [IPKernelApp options]
#
# The second form is ipykernel's own Python kernel (what `python3 -m
# ipykernel_launcher` starts), with the one change every kernel here gets
# (unix_iopub_pipe): no TCP socket of its own.
import base64
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

import zmq
from ipykernel import iostream
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

HERE = os.path.dirname(os.path.abspath(__file__))
KIND = sys.argv[1] if len(sys.argv) > 1 else "bash"


def unix_iopub_pipe():
    """ipykernel's IOPub thread takes the output of forked children (a
    multiprocessing worker's print) through a socket it listens on at a
    random TCP port of 127.0.0.1: the only TCP socket a kernel has once
    hutch-interp connects to it over Unix sockets (server.c, kernel_spawn).
    gVisor's runsc cannot checkpoint a TCP socket that an epoll set holds,
    so a sandbox with such a kernel could not be paused or snapshotted
    there. The same pipe on a Unix socket beside the connection file; left
    as it is on an ipykernel whose IOPub thread is not the one this was
    written against (Debian 12's 6.17)."""
    t = iostream.IOPubThread
    if not all(hasattr(t, a) for a in ("_setup_pipe_in", "_setup_pipe_out", "_handle_pipe_msg")):
        return
    where = os.path.dirname(os.path.abspath(sys.argv[2])) if len(sys.argv) > 2 else "/tmp"

    def setup_pipe_in(self):
        ctx = self.socket.context
        self._pipe_uuid = os.urandom(16)
        pipe_in = ctx.socket(zmq.PULL)
        pipe_in.linger = 0
        self._hutch_pipe = "ipc://%s/pipe-%d-%s" % (where, os.getpid(), os.urandom(6).hex())
        try:
            pipe_in.bind(self._hutch_pipe)
        except zmq.ZMQError as e:
            print("hutch: no IOPub pipe (%s): forked processes' output is lost" % e, file=sys.__stderr__)
            self._pipe_flag = False
            pipe_in.close()
            return
        self._pipe_in = iostream.ZMQStream(pipe_in, self.io_loop)
        self._pipe_in.on_recv(self._handle_pipe_msg)

    def setup_pipe_out(self):
        ctx = zmq.Context()
        pipe_out = ctx.socket(zmq.PUSH)
        pipe_out.linger = 3000
        pipe_out.connect(self._hutch_pipe)
        return ctx, pipe_out

    t._setup_pipe_in = setup_pipe_in
    t._setup_pipe_out = setup_pipe_out


unix_iopub_pipe()


def _child_setup():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


class ChildKernel(Kernel):
    implementation = "hutch-" + KIND
    implementation_version = "1.0"
    banner = "hutch " + KIND + " kernel"
    language_info = {"name": KIND, "mimetype": "text/plain", "file_extension": ".txt"}

    def __init__(self, **kw):
        super().__init__(**kw)
        self.child = None
        # beside the connection file: hutch-interp removes that directory
        self.tmp = tempfile.mkdtemp(prefix="hutch-kernel-", dir=os.path.dirname(os.path.abspath(sys.argv[2])))
        self.start_child()

    # -- the child
    def argv(self):
        if KIND == "bash":
            return ["/bin/bash", "--noprofile", "--norc", "-s"]
        if KIND in ("javascript", "typescript"):
            return ["/usr/bin/node", os.path.join(HERE, "jsrepl.js"), KIND]
        return ["java", "--add-modules", "jdk.jshell", os.path.join(HERE, "HutchJShell.java")]

    def start_child(self):
        r, w = os.pipe()
        os.set_inheritable(w, True)
        env = dict(os.environ)
        env.setdefault("TERM", "dumb")
        env["HUTCH_CTL_FD"] = str(w)
        self.child = subprocess.Popen(
            self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(w,), preexec_fn=_child_setup, start_new_session=True, env=env,
            cwd=os.getcwd())
        os.close(w)
        self.ctl = r
        self.ctl_buf = b""
        if KIND == "bash":
            fd = w
            # fd 3 in the child is our control pipe; SIGINT ends the cell, not the shell
            self.child.stdin.write(("exec 3>&%d %d>&-; trap 'return 130 2>/dev/null' INT; "
                                    "PS1=; PS2=\n" % (fd, fd)).encode())
            self.child.stdin.flush()
        else:
            self.child_fd = w
        for f in (self.child.stdout, self.child.stderr):
            os.set_blocking(f.fileno(), False)

    def send_cell(self, code):
        if KIND == "bash":
            path = os.path.join(self.tmp, "cell.sh")
            with open(path, "w") as f:
                f.write(code)
                f.write("\n")
            line = "{ . %s; } </dev/null; printf '%%d\\n' \"$?\" >&3\n" % path
        elif KIND == "java":
            line = base64.b64encode(code.encode()).decode() + "\n"
        else:
            line = json.dumps({"code": code}) + "\n"
        self.child.stdin.write(line.encode())
        self.child.stdin.flush()

    # -- output
    def stream(self, name, data, silent):
        if data and not silent:
            self.send_response(self.iopub_socket, "stream", {"name": name, "text": data.decode("utf-8", "replace")})

    def drain(self, silent):
        for f, name in ((self.child.stdout, "stdout"), (self.child.stderr, "stderr")):
            while True:
                try:
                    b = os.read(f.fileno(), 65536)
                except BlockingIOError:
                    break
                if not b:
                    break
                self.stream(name, b, silent)

    def wait_done(self, silent):
        """Stream the child's output until its control line; (done json | None if it died)."""
        fds = {self.child.stdout.fileno(): "stdout", self.child.stderr.fileno(): "stderr", self.ctl: "ctl"}
        interrupted = False
        while True:
            try:
                ready, _, _ = select.select(list(fds), [], [])
            except KeyboardInterrupt:
                interrupted = True
                try:
                    os.killpg(self.child.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
                continue
            for fd in ready:
                try:
                    b = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not b:
                    if fds.get(fd) == "ctl" or self.child.poll() is not None:
                        self.drain(silent)
                        return None, interrupted
                    del fds[fd]
                    continue
                if fds[fd] == "ctl":
                    self.ctl_buf += b
                    if b"\n" in self.ctl_buf:
                        line, self.ctl_buf = self.ctl_buf.split(b"\n", 1)
                        self.drain(silent)
                        return line.decode("utf-8", "replace"), interrupted
                else:
                    self.stream(fds[fd], b, silent)

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False):
        if self.child.poll() is not None:
            self.start_child()
        try:
            self.send_cell(code)
        except BrokenPipeError:
            self.start_child()
            self.send_cell(code)
        done, interrupted = self.wait_done(silent)
        if done is None:
            rc = self.child.wait()
            self.start_child()
            return self.error("KernelDied" if not interrupted else "KeyboardInterrupt",
                              "the %s process ended (status %s) and was started again: its state is lost" % (KIND, rc),
                              [], silent)
        if KIND == "bash":
            rc = int(done or "0") if done.strip().lstrip("-").isdigit() else 0
            if interrupted or rc == 130:
                return self.error("KeyboardInterrupt", "interrupted", [], silent)
            if rc != 0:
                return self.error("CommandExitError", "the cell's last command exited with status %d" % rc, [], silent)
            return self.ok()
        msg = json.loads(done)
        if msg.get("status") == "error":
            name = "KeyboardInterrupt" if interrupted else msg.get("ename", "Error")
            return self.error(name, msg.get("evalue", ""), msg.get("traceback", []), silent)
        data = msg.get("data")
        if data and not silent:
            self.send_response(self.iopub_socket, "execute_result",
                               {"execution_count": self.execution_count, "data": data, "metadata": {}})
        return self.ok()

    def ok(self):
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

    def error(self, ename, evalue, tb, silent):
        if not silent:
            self.send_response(self.iopub_socket, "error",
                               {"ename": ename, "evalue": evalue, "traceback": tb or ["%s: %s" % (ename, evalue)]})
        return {"status": "error", "execution_count": self.execution_count, "ename": ename, "evalue": evalue,
                "traceback": tb}

    def do_shutdown(self, restart):
        if self.child and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    if KIND == "python":
        # as ipykernel_launcher: user code does not import from our directory
        if sys.path and os.path.abspath(sys.path[0]) == HERE:
            del sys.path[0]
        from ipykernel.ipkernel import IPythonKernel
        IPKernelApp.launch_instance(argv=["-f", sys.argv[2], *sys.argv[3:]], kernel_class=IPythonKernel)
    else:
        IPKernelApp.launch_instance(argv=["-f", sys.argv[2]], kernel_class=ChildKernel)
