#!/usr/bin/python3
"""Time whole commands, interleaved, and print a markdown table.

    timeit.py [--rounds N] [--warmup W] [--timeout S] [--ref NAME] [--vs NAME]
              --tool 'NAME=COMMAND LINE' ... [--na 'NAME=REASON'] ...
              [--ns 'NAME=/path/to/mnt/ns'] [--concurrency C --conc-runs R
              --conc-tools 'NAME,NAME']

Each sample is one posix_spawn() + waitpid() of the command, measured with
perf_counter_ns in this process: no shell and no hyperfine in between, so the
plain-exec reference is a true fork+exec of /bin/true. Every round runs every
tool once, in an order that rotates each round, so a slow drift of the machine
(page cache, another tenant, thermal) spreads over all tools alike.

A tool first runs once with its output captured; if that fails, its row says
"n/a: <reason>" instead of numbers. Every run has a timeout; a tool that fails
five times during the rounds is dropped with the reason.

"{id}" in a command is replaced by a unique token per run (container names).
--ns makes a tool run inside a mount namespace held open by another process
(setns() before the timer starts, and back after it stops).
"""

import argparse
import ctypes
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time

CLONE_NEWNS = 0x00020000
MAX_FAILURES = 5

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def setns(fd, nstype=CLONE_NEWNS):
    if _libc.setns(fd, nstype) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "setns: " + os.strerror(e))


class RunTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise RunTimeout()


class Tool:
    def __init__(self, name, cmdline):
        self.name = name
        self.cmdline = cmdline
        self.argv = shlex.split(cmdline)
        self.na = None          # reason when the tool cannot be measured
        self.ns_path = None
        self.ns_fd = -1
        self.samples = []       # nanoseconds
        self.failures = 0
        self.last_error = ""
        self.conc = None        # (workers, runs, wall_ns, failures)

    def resolve(self):
        exe = self.argv[0]
        if "/" in exe:
            path = os.path.abspath(exe)
            if not os.access(path, os.X_OK):
                self.na = "%s not found" % exe
                return
        else:
            path = shutil.which(exe)
            if path is None:
                self.na = "%s is not installed" % exe
                return
        self.argv[0] = path
        if self.ns_path:
            try:
                self.ns_fd = os.open(self.ns_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                self.na = "mount namespace %s: %s" % (self.ns_path, e.strerror)


class Runner:
    def __init__(self, timeout):
        self.timeout = timeout
        self.devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.self_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.cwd = os.getcwd()
        self.env = dict(os.environ)
        self.seq = 0
        signal.signal(signal.SIGALRM, _on_alarm)

    def run(self, tool, out_fd=None):
        """Run tool once; return (elapsed_ns, status, error text)."""
        self.seq += 1
        argv = [a.replace("{id}", "hb%d-%d" % (os.getpid(), self.seq)) for a in tool.argv]
        out = self.devnull if out_fd is None else out_fd
        actions = [
            (os.POSIX_SPAWN_DUP2, self.devnull, 0),
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, out, 2),
        ]
        if tool.ns_fd >= 0:
            setns(tool.ns_fd)
        pid = None
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            t0 = time.perf_counter_ns()
            pid = os.posix_spawn(argv[0], argv, self.env, file_actions=actions, setpgroup=0)
            _, status = os.waitpid(pid, 0)
            t1 = time.perf_counter_ns()
            signal.setitimer(signal.ITIMER_REAL, 0)
        except RunTimeout:
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(pid, 0)
            return None, None, "timed out after %gs" % self.timeout
        except OSError as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return None, None, "spawn: %s" % e.strerror
        finally:
            if tool.ns_fd >= 0:
                setns(self.self_ns)
                os.chdir(self.cwd)
        if os.WIFSIGNALED(status):
            return None, status, "killed by signal %d" % os.WTERMSIG(status)
        if os.WEXITSTATUS(status) != 0:
            return None, status, "exit %d" % os.WEXITSTATUS(status)
        return t1 - t0, status, ""

    def preflight(self, tool):
        with tempfile.TemporaryFile() as f:
            elapsed, _, err = self.run(tool, out_fd=f.fileno())
            if elapsed is not None:
                return
            f.seek(0)
            text = f.read().decode("utf-8", "replace")
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        detail = lines[-1] if lines else ""
        if len(detail) > 160:
            detail = detail[:157] + "..."
        tool.na = err + (": " + detail if detail else "")

    def concurrent(self, tool, workers, runs):
        """workers processes run runs/workers each; returns (wall_ns, failures)."""
        per = max(1, runs // workers)
        go_r, go_w = os.pipe()
        res_r, res_w = os.pipe()
        pids = []
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(go_w)
                    os.close(res_r)
                    os.read(go_r, 1)
                    failures = 0
                    for _ in range(per):
                        elapsed, _, _ = self.run(tool)
                        if elapsed is None:
                            failures += 1
                    os.write(res_w, b"%d\n" % failures)
                finally:
                    os._exit(0)
            pids.append(pid)
        os.close(go_r)
        os.close(res_w)
        time.sleep(0.05)  # let every worker reach its read()
        t0 = time.perf_counter_ns()
        os.close(go_w)
        for pid in pids:
            os.waitpid(pid, 0)
        t1 = time.perf_counter_ns()
        data = b""
        while True:
            chunk = os.read(res_r, 4096)
            if not chunk:
                break
            data += chunk
        os.close(res_r)
        failures = sum(int(x) for x in data.split())
        return workers * per, t1 - t0, failures


def percentile(sorted_values, p):
    """Nearest-rank percentile."""
    if not sorted_values:
        return float("nan")
    k = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[k - 1]


def machine_line():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    virt = ""
    if shutil.which("systemd-detect-virt"):
        try:
            import subprocess
            virt = subprocess.run(["systemd-detect-virt"], capture_output=True, text=True,
                                  timeout=5).stdout.strip()
        except Exception:
            virt = ""
    parts = ["%d CPUs" % os.cpu_count(), "kernel %s" % platform.release()]
    if cpu:
        parts.append(cpu)
    if virt and virt != "none":
        parts.append("virt: %s" % virt)
    return ", ".join(parts)


def fmt_ms(ns):
    ms = ns / 1e6
    if ms >= 100:
        return "%.0f" % ms
    if ms >= 10:
        return "%.1f" % ms
    return "%.2f" % ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_N", 200)))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per run")
    # --tool and --na share one list so that rows keep the order they were given in.
    ap.add_argument("--tool", dest="rows", action="append", type=lambda s: ("tool", s),
                    default=[], metavar="NAME=CMD")
    ap.add_argument("--na", dest="rows", action="append", type=lambda s: ("na", s),
                    metavar="NAME=REASON")
    ap.add_argument("--ns", action="append", default=[], metavar="NAME=NSPATH")
    ap.add_argument("--ref", default=None, help="tool the ratios are taken against (default: first)")
    ap.add_argument("--vs", default=None, help="a second tool to show a ratio against")
    ap.add_argument("--concurrency", type=int, default=0)
    ap.add_argument("--conc-runs", type=int, default=100)
    ap.add_argument("--conc-tools", default="")
    ap.add_argument("--json", default=None, help="write raw results here")
    ap.add_argument("--title", default="Command line: one sandbox at a time")
    ap.add_argument("--label", action="append", default=[], metavar="TEXT=LABEL",
                    help="show TEXT as LABEL in the printed commands (temporary paths)")
    args = ap.parse_args()

    tools = []
    by_name = {}

    def get(name, cmd=""):
        if name not in by_name:
            by_name[name] = Tool(name, cmd)
            tools.append(by_name[name])
        return by_name[name]

    for kind, spec in args.rows:
        name, _, value = spec.partition("=")
        if kind == "tool":
            t = get(name, value)
            t.cmdline, t.argv = value, shlex.split(value)
        else:
            get(name).na = value
    for spec in args.ns:
        name, _, path = spec.partition("=")
        if name in by_name:
            by_name[name].ns_path = path

    runner = Runner(args.timeout)
    for t in tools:
        if t.na is None:
            t.resolve()
        if t.na is None:
            runner.preflight(t)
        state = "ok" if t.na is None else "n/a: " + t.na
        print("preflight %-22s %s" % (t.name, state), file=sys.stderr, flush=True)

    live = [t for t in tools if t.na is None]
    t_start = time.monotonic()
    total = args.warmup + args.rounds
    for r in range(total):
        live = [t for t in live if t.na is None]
        if not live:
            break
        k = r % len(live)
        for t in live[k:] + live[:k]:
            if t.na is not None:
                continue
            elapsed, _, err = runner.run(t)
            if elapsed is None:
                t.failures += 1
                t.last_error = err
                if t.failures >= MAX_FAILURES:
                    t.na = "failed %d times during the rounds (last: %s)" % (t.failures, err)
            elif r >= args.warmup:
                t.samples.append(elapsed)
        if (r + 1) % 50 == 0:
            print("round %d/%d (%.0fs)" % (r + 1, total, time.monotonic() - t_start),
                  file=sys.stderr, flush=True)

    if args.concurrency > 0:
        wanted = [n.strip() for n in args.conc_tools.split(",") if n.strip()]
        for name in wanted:
            t = by_name.get(name)
            if t is None or t.na is not None:
                continue
            runs, wall, failures = runner.concurrent(t, args.concurrency, args.conc_runs)
            t.conc = (args.concurrency, runs, wall, failures)
            print("concurrency %-20s %d runs in %.2fs" % (t.name, runs, wall / 1e9),
                  file=sys.stderr, flush=True)

    ref = by_name.get(args.ref) if args.ref else (tools[0] if tools else None)
    vs = by_name.get(args.vs) if args.vs else None

    def med(t):
        return statistics.median(t.samples) if t and t.na is None and t.samples else None

    ref_med, vs_med = med(ref), med(vs)
    cols = ["command", "runs", "median ms", "p99 ms", "mean ms"]
    if ref:
        cols.append("× %s" % ref.name)
    if vs:
        cols.append("× %s" % vs.name)

    print("### %s" % args.title)
    print()
    print("%d interleaved rounds (+%d warm-up), each sample one posix_spawn+waitpid "
          "of the whole command. Machine: %s." % (args.rounds, args.warmup, machine_line()))
    print()
    print("| " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * (len(cols) - 1))
    results = []
    for t in tools:
        row = {"name": t.name, "command": t.cmdline}
        if t.na is not None or not t.samples:
            reason = t.na or "no samples"
            print("| %s | – | n/a: %s |%s" % (t.name, reason.replace("|", "/"), " – |" * (len(cols) - 3)))
            row["na"] = reason
            results.append(row)
            continue
        s = sorted(t.samples)
        m = statistics.median(s)
        p99 = percentile(s, 99)
        mean = statistics.fmean(s)
        runs = "%d" % len(s)
        if t.failures:
            runs += " (%d failed: %s)" % (t.failures, t.last_error)
        cells = [t.name, runs, fmt_ms(m), fmt_ms(p99), fmt_ms(mean)]
        if ref:
            cells.append("%.2f" % (m / ref_med) if ref_med else "–")
        if vs:
            cells.append("%.2f" % (m / vs_med) if vs_med else "–")
        print("| " + " | ".join(cells) + " |")
        row.update(runs=len(s), failures=t.failures, median_ns=m, p99_ns=p99, mean_ns=mean,
                   min_ns=s[0], max_ns=s[-1])
        results.append(row)
    print()
    print("Commands:")
    print()
    for t in tools:
        if t.cmdline:
            shown = t.cmdline
            for spec in args.label:
                text, _, label = spec.partition("=")
                if text:
                    shown = shown.replace(text, label)
            ns = " (in a private mount namespace, see below)" if t.ns_path else ""
            print("- %s: `%s`%s" % (t.name, shown, ns))
    print()

    conc = [t for t in tools if t.conc]
    if conc:
        vs_rate = None
        if vs and vs.conc and vs.conc[2] > 0:
            vs_rate = vs.conc[1] / (vs.conc[2] / 1e9)
        print("### %d at a time" % args.concurrency)
        print()
        print("%d worker processes, each running the command back to back; rate = runs / wall time."
              % args.concurrency)
        print()
        hdr = ["command", "runs", "wall s", "runs/s"]
        if vs_rate:
            hdr.append("× %s rate" % vs.name)
        print("| " + " | ".join(hdr) + " |")
        print("|---|" + "---:|" * (len(hdr) - 1))
        for t in conc:
            workers, runs, wall, failures = t.conc
            rate = runs / (wall / 1e9)
            r = "%d" % runs + (" (%d failed)" % failures if failures else "")
            cells = [t.name, r, "%.2f" % (wall / 1e9), "%.0f" % rate]
            if vs_rate:
                cells.append("%.2f" % (rate / vs_rate))
            print("| " + " | ".join(cells) + " |")
            for row in results:
                if row["name"] == t.name:
                    row["concurrency"] = {"workers": workers, "runs": runs, "wall_ns": wall,
                                          "failures": failures}
        print()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_line(), "rounds": args.rounds, "tools": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
