"""A private network for the egress proxy tests: two netns, two veth pairs, a fake world.

Nothing here sends a packet anywhere but the namespaces it creates. Topology
(per instance; ID is 6 random hex digits, N a free 10.231.N.0/30):

    root netns                 netns D ("daemon")                  netns W ("world")
    hxtIDr 10.231.N.1/30 ----- hxtIDa 10.231.N.2/30 (= api_host)
                               hxtIDb 192.168.231.1/24 ----------- hxtIDc 192.168.231.2/24
                                      fd00:231::1/64                      fd00:231::2/64
                               default (v4, v6) via W              lo: the sinks and DNS below
                                                                   unreachable default (v4, v6):
                                                                   anything else fails fast (ICMP)

    sinks in W: ok 198.51.100.10, evil 198.51.100.20, private 10.77.0.5,
                metadata 169.254.169.254, ok6 2001:db8:100::10
                each: HTTP :80, HTTPS :443 (leaf from the test CA), TCP echo :9000
    DNS in W:   198.51.100.53, UDP and TCP :53, zone below, every query logged

Use:

    from egressnet import EgressNet
    with EgressNet() as net:
        daemon = subprocess.Popen(net.daemon_cmd_prefix + [hutch, "serve", "--listen",
                                  f"{net.api_host}:PORT", ...])     # hutch in D
        ... requests from pytest (root netns) to net.api_host:PORT ...
        net.stats()["sinks"]["ok"]["https"]["requests"]
        net.dns_queries("evil.test") == []        # no lookup reached the DNS server

or the fixtures `egressnet` (module scope) and `egressnet_fresh` (function
scope: zone and counters reset first): `from egressnet import egressnet,
egressnet_fresh  # noqa: F401` in a test module or a conftest registers them.

`hutch serve` must run under `nsenter --net=...` (net.daemon_cmd_prefix), not
`ip netns exec`, which remounts /sys and hides the cgroup mounts the daemon
needs. close() stops the world server, then SIGTERMs (5 s later SIGKILLs)
whatever still runs in D or W, so a test should stop its daemon first.

Run as a script, a few tools for use inside D (net.dig() and
net.http_from_daemon() wrap them):

    python3 egressnet.py dig [--server IP] [--tcp] NAME [TYPE]   -> JSON on stdout
    python3 egressnet.py http URL [--connect IP] [--cacert PEM] [-X METHOD] [-d BODY] [-H 'N: V']
    python3 egressnet.py cleanup          (remove what crashed runs left: hxt* netns, links, temp dirs)
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HELPERS_DIR = Path(__file__).resolve().parent
WORLD_SCRIPT = HELPERS_DIR / "egress_world.py"
SYS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NETNS_DIR = Path("/run/netns")
LOCK_FILE = Path("/run/lock/hxt-egressnet.lock") if Path("/run/lock").is_dir() \
    else Path("/tmp/hxt-egressnet.lock")
DEFAULT_PREFIX = "hxt"
CMD_TIMEOUT = 20          # every ip/openssl/nsenter call

DNS_SERVER = "198.51.100.53"
D_ADDR4, W_ADDR4 = "192.168.231.1", "192.168.231.2"
D_ADDR6, W_ADDR6 = "fd00:231::1", "fd00:231::2"

# sink name -> (address, DNS names in its certificate besides the address)
SINKS: Dict[str, tuple] = {
    "ok": ("198.51.100.10", ["ok.example.test", "api.example.test", "*.example.test",
                             "cname.example.test", "rebind.example.test", "rebind.test",
                             "dual.example.test"]),
    "evil": ("198.51.100.20", ["evil.test", "*.evil.test", "evil.example.org"]),
    "private": ("10.77.0.5", ["private.example.test", "*.example.test",
                              "rebind.example.test", "rebind.test"]),
    "metadata": ("169.254.169.254", ["metadata.example.test", "*.example.test",
                                     "metadata.google.internal"]),
    "ok6": ("2001:db8:100::10", ["ok6.example.test", "*.example.test", "dual.example.test"]),
}
# Served by every sink's HTTPS when the client's SNI is one of these names,
# with a leaf from a second CA that nobody trusts (net.rogue_ca_cert).
UNTRUSTED_NAMES = ["untrusted.example.test"]

DEFAULT_ZONE: Dict[str, object] = {
    "ok.example.test": ["198.51.100.10"],
    "api.example.test": ["198.51.100.10"],
    "ok6.example.test": ["2001:db8:100::10"],                 # AAAA only
    "dual.example.test": ["198.51.100.10", "2001:db8:100::10"],
    "evil.test": ["198.51.100.20"],
    "evil.example.org": ["198.51.100.20"],
    "private.example.test": ["10.77.0.5"],
    "metadata.example.test": ["169.254.169.254"],
    "rebind.example.test": {"rebind": ["198.51.100.10", "10.77.0.5"]},   # TTL 0
    "cname.example.test": {"cname": "ok.example.test"},
    "untrusted.example.test": ["198.51.100.10"],
    "servfail.example.test": {"rcode": 2},
    "blackhole.example.test": {"drop": True},                # never answered
}


class EgressNetError(RuntimeError):
    pass


class EgressNetUnavailable(EgressNetError):
    """This machine cannot build the network (not root, tools missing)."""


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------

def _tool(name: str) -> Optional[str]:
    return shutil.which(name, path=SYS_PATH)


IP, NSENTER, OPENSSL = _tool("ip"), _tool("nsenter"), _tool("openssl")


def _python() -> str:
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def unavailable_reason() -> Optional[str]:
    """Why EgressNet cannot run here, or None. For pytest.mark.skipif."""
    if not sys.platform.startswith("linux"):
        return "egress test network needs Linux"
    if os.geteuid() != 0:
        return "egress test network needs root (netns, veth)"
    missing = [n for n, p in (("ip", IP), ("nsenter", NSENTER), ("openssl", OPENSSL)) if not p]
    if missing:
        return "egress test network needs " + ", ".join(missing) + " (not found in " + SYS_PATH + ")"
    if not os.path.exists("/proc/self/ns/net"):
        return "no network namespaces on this kernel"
    return None


def _run(argv: Sequence[str], timeout: float = CMD_TIMEOUT, check: bool = True,
         **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("stdin", subprocess.DEVNULL)
    try:
        cp = subprocess.run(list(argv), timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise EgressNetError(f"timed out after {timeout}s: {' '.join(map(str, argv))}") from e
    if check and cp.returncode != 0:
        raise EgressNetError(f"`{' '.join(map(str, argv))}` failed (rc={cp.returncode}): "
                             f"{(cp.stderr or '').strip()}")
    return cp


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run([IP, *args], check=check)


def _sysctl_in(ns: Optional[str], key: str, value: str, check: bool = True) -> None:
    """Write a net sysctl in netns `ns` (None: this netns)."""
    path = "/proc/sys/" + key.replace(".", "/")
    if ns is None:
        with open(path, "w") as f:
            f.write(value)
        return
    # /proc/sys/net shows the netns of the process that opens it.
    _run([NSENTER, f"--net={NETNS_DIR / ns}", "/bin/sh", "-c", 'echo "$1" > "$2"', "sh",
          value, path], check=check)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _global_lock(timeout: float = 120.0):
    """Serializes setups and stale cleanups of all harness instances on this host."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EgressNetError(f"could not lock {LOCK_FILE} in {timeout}s")
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _netns_names() -> List[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _root_links() -> List[str]:
    cp = _ip("-o", "link", "show", check=False)
    names = []
    for line in cp.stdout.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)", line)
        if m:
            names.append(m.group(1))
    return names


def _netns_pids(ns: str) -> List[int]:
    if not (NETNS_DIR / ns).exists():
        return []
    cp = _ip("netns", "pids", ns, check=False)
    return [int(x) for x in cp.stdout.split() if x.isdigit()]


def _kill_netns_processes(ns: str, grace: float = 5.0) -> List[int]:
    """SIGTERM every process in netns `ns`, SIGKILL those left after `grace` s."""
    pids = [p for p in _netns_pids(ns) if p != os.getpid()]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _pid_alive(p) and not _is_zombie(p)]
        if pids:
            time.sleep(0.05)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return pids


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _names_re(prefix: str):
    p = re.escape(prefix)
    return (re.compile(rf"^{p}-(\d+)-([0-9a-f]{{6}})-[dw]$"),      # netns
            re.compile(rf"^{p}([0-9a-f]{{6}})[rabc]$"),            # links
            re.compile(rf"^{p}-egress-(\d+)-([0-9a-f]{{6}})-"))    # temp dirs


def leftovers(prefix: str = DEFAULT_PREFIX, instance_id: Optional[str] = None) -> List[str]:
    """What harness instances (all, or only `instance_id`) have left on this host:
    netns names, root-netns links and temp dirs."""
    ns_re, link_re, dir_re = _names_re(prefix)
    out = []
    for n in _netns_names():
        m = ns_re.match(n)
        if m and instance_id in (None, m.group(2)):
            out.append(f"netns {n}")
    if IP:
        for n in _root_links():
            m = link_re.match(n)
            if m and instance_id in (None, m.group(1)):
                out.append(f"link {n}")
    for n in os.listdir(tempfile.gettempdir()):
        m = dir_re.match(n)
        if m and instance_id in (None, m.group(2)):
            out.append(f"dir {os.path.join(tempfile.gettempdir(), n)}")
    return out


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> List[str]:
    """Remove what crashed runs left behind: netns named PREFIX-PID-ID-{d,w}
    whose creating PID is gone (processes in them are killed first), root
    links PREFIXID? without such a netns, and their temp dirs. Instances of
    live processes are left alone. Returns what was removed."""
    with _global_lock():
        return _cleanup_stale_locked(prefix)


def _cleanup_stale_locked(prefix: str) -> List[str]:
    ns_re, link_re, dir_re = _names_re(prefix)
    removed = []
    live_ids = set()
    for n in _netns_names():
        m = ns_re.match(n)
        if not m:
            continue
        if _pid_alive(int(m.group(1))):
            live_ids.add(m.group(2))
            continue
        _kill_netns_processes(n, grace=2.0)
        _ip("netns", "del", n, check=False)
        removed.append(f"netns {n}")
    for n in _root_links():
        m = link_re.match(n)
        if m and m.group(1) not in live_ids:
            _ip("link", "del", n, check=False)
            removed.append(f"link {n}")
    tmp = tempfile.gettempdir()
    for n in os.listdir(tmp):
        m = dir_re.match(n)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, n), ignore_errors=True)
            removed.append(f"dir {os.path.join(tmp, n)}")
    return removed


def _used_v4_networks() -> List[ipaddress.IPv4Network]:
    used = []
    cp = _ip("-j", "-4", "route", "show", "table", "all")
    for r in json.loads(cp.stdout or "[]"):
        dst = r.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    cp = _ip("-j", "-4", "addr", "show")
    for link in json.loads(cp.stdout or "[]"):
        for a in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network)
                used.append(ipaddress.ip_network(a["local"]))
    return used


def _pick_subnet() -> int:
    """N such that 10.231.N.0/30 overlaps no route or address of this netns
    (falling back to one that only lies inside a route of /16 or wider)."""
    used = _used_v4_networks()
    cands = list(range(1, 255))
    random.shuffle(cands)
    for wide_ok in (False, True):
        for n in cands:
            net = ipaddress.ip_network(f"10.231.{n}.0/30")
            clash = [u for u in used if u.overlaps(net) and not (wide_ok and u.prefixlen <= 16)]
            if not clash:
                return n
    raise EgressNetError("no free 10.231.N.0/30 in this netns")


# --------------------------------------------------------------------------
# Certificates (openssl CLI)
# --------------------------------------------------------------------------

def _make_ca(d: Path, name: str, cn: str) -> tuple:
    cnf = d / f"{name}.cnf"
    cnf.write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\nx509_extensions = v3_ca\n"
        f"[dn]\nCN = {cn}\n"
        "[v3_ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n"
        "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid:always\n")
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    _run([OPENSSL, "req", "-x509", "-config", str(cnf), "-newkey", "ec", "-pkeyopt",
          "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
          "-days", "30", "-set_serial", "0x" + secrets.token_hex(8)])
    return cert, key


def _make_leaf(d: Path, name: str, ca: tuple, dns_names: Sequence[str],
               ips: Sequence[str]) -> tuple:
    cnf = d / f"{name}.cnf"
    alt = [f"DNS.{i + 1} = {n}" for i, n in enumerate(dns_names)]
    alt += [f"IP.{i + 1} = {a}" for i, a in enumerate(ips)]
    cn = dns_names[0] if dns_names else ips[0]
    cnf.write_text(
        f"[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = {cn}\n"
        "[v3_leaf]\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n"
        "extendedKeyUsage = serverAuth\nsubjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid\nsubjectAltName = @alt\n[alt]\n" + "\n".join(alt) + "\n")
    key, csr, cert = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem"
    _run([OPENSSL, "req", "-new", "-config", str(cnf), "-newkey", "ec", "-pkeyopt",
          "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(csr)])
    _run([OPENSSL, "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
          "-set_serial", "0x" + secrets.token_hex(8), "-days", "30", "-out", str(cert),
          "-extfile", str(cnf), "-extensions", "v3_leaf"])
    return cert, key


# --------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------

class EgressNet:
    """One private test network. `with EgressNet() as net:` or start()/close().

    Attributes (valid after start()):
      id                  6 hex digits, in every name this instance creates
      ns_daemon, ns_world netns names (files under /run/netns)
      api_host            D's address on the root<->D veth (10.231.N.2)
      root_host           the root side (10.231.N.1), the source of pytest's packets
      daemon_cmd_prefix   ["/usr/bin/nsenter", "--net=/run/netns/<D>"]
      world_cmd_prefix    the same for W (debugging)
      daemon_addr4/6      D's addresses towards W (the source of egress packets)
      dns_server          "198.51.100.53"
      sinks               {"ok": "198.51.100.10", "evil": ..., "private": ...,
                           "metadata": ..., "ok6": "2001:db8:100::10"}
      ca_cert             path of the test CA (PEM) that signed every sink's leaf
      rogue_ca_cert       a CA nobody trusts; its leaf is served for UNTRUSTED_NAMES
      tmpdir, control_path, world_log
    """

    DNS_SERVER = DNS_SERVER
    SINKS = {k: v[0] for k, v in SINKS.items()}

    def __init__(self, zone: Optional[dict] = None, extra_zone: Optional[dict] = None,
                 prefix: str = DEFAULT_PREFIX, start_timeout: float = 30.0,
                 world_script: Optional[str] = None):
        if len(prefix) > 8 or not re.fullmatch(r"[a-z][a-z0-9]*", prefix):
            raise ValueError("prefix: up to 8 of [a-z0-9], starting with a letter")
        self.prefix = prefix
        self.id = secrets.token_hex(3)
        pid = os.getpid()
        self.ns_daemon = f"{prefix}-{pid}-{self.id}-d"
        self.ns_world = f"{prefix}-{pid}-{self.id}-w"
        self.if_root = f"{prefix}{self.id}r"      # root side of root<->D
        self.if_d_root = f"{prefix}{self.id}a"    # D side of root<->D
        self.if_d_world = f"{prefix}{self.id}b"   # D side of D<->W
        self.if_world = f"{prefix}{self.id}c"     # W side of D<->W
        self.zone_initial = dict(DEFAULT_ZONE if zone is None else zone)
        self.zone_initial.update(extra_zone or {})
        self.start_timeout = start_timeout
        self.world_script = str(world_script or WORLD_SCRIPT)
        self.python = _python()
        self.dns_server = DNS_SERVER
        self.sinks = dict(self.SINKS)
        self.daemon_addr4, self.daemon_addr6 = D_ADDR4, D_ADDR6
        self.daemon_cmd_prefix = [NSENTER or "nsenter", f"--net={NETNS_DIR / self.ns_daemon}"]
        self.world_cmd_prefix = [NSENTER or "nsenter", f"--net={NETNS_DIR / self.ns_world}"]
        self.subnet: Optional[int] = None
        self.api_host: Optional[str] = None
        self.root_host: Optional[str] = None
        self.tmpdir: Optional[str] = None
        self.ca_cert = self.ca_key = self.rogue_ca_cert = None
        self.control_path = self.world_log = None
        self._world: Optional[subprocess.Popen] = None
        self.close_errors: List[str] = []
        self._started = False

    # --- lifecycle ---------------------------------------------------------

    def __enter__(self) -> "EgressNet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "EgressNet":
        why = unavailable_reason()
        if why:
            raise EgressNetUnavailable(why)
        if self._started:
            raise EgressNetError("already started")
        self._started = True
        try:
            self.tmpdir = tempfile.mkdtemp(prefix=f"{self.prefix}-egress-{os.getpid()}-{self.id}-")
            os.chmod(self.tmpdir, 0o755)   # the daemon may drop privileges and read ca_cert
            with _global_lock():
                _cleanup_stale_locked(self.prefix)
                self.subnet = _pick_subnet()
                self._build_network()
            self._make_certs()
            self._start_world()
        except BaseException:
            self.close()
            raise
        return self

    def _build_network(self) -> None:
        n = self.subnet
        D, W = self.ns_daemon, self.ns_world
        self.root_host, self.api_host = f"10.231.{n}.1", f"10.231.{n}.2"
        _ip("netns", "add", D)
        _ip("netns", "add", W)
        # root <-> D
        _ip("link", "add", self.if_root, "type", "veth", "peer", "name", self.if_d_root,
            "netns", D)
        with contextlib.suppress(OSError):      # no IPv6 towards the root netns
            _sysctl_in(None, f"net.ipv6.conf.{self.if_root}.disable_ipv6", "1")
        _sysctl_in(D, f"net.ipv6.conf.{self.if_d_root}.disable_ipv6", "1", check=False)
        _ip("addr", "add", f"{self.root_host}/30", "dev", self.if_root)
        _ip("link", "set", self.if_root, "up")
        _ip("-n", D, "link", "set", "lo", "up")
        _ip("-n", D, "addr", "add", f"{self.api_host}/30", "dev", self.if_d_root)
        _ip("-n", D, "link", "set", self.if_d_root, "up")
        # D <-> W
        _ip("-n", D, "link", "add", self.if_d_world, "type", "veth", "peer", "name",
            self.if_world, "netns", W)
        _ip("-n", W, "link", "set", "lo", "up")
        for a in [DNS_SERVER] + [a for a, _ in SINKS.values()]:
            plen = 128 if ":" in a else 32
            extra = ["nodad"] if ":" in a else []
            _ip("-n", W, "addr", "add", f"{a}/{plen}", "dev", "lo", *extra)
        _ip("-n", W, "addr", "add", f"{W_ADDR4}/24", "dev", self.if_world)
        _ip("-n", W, "addr", "add", f"{W_ADDR6}/64", "dev", self.if_world, "nodad")
        _ip("-n", W, "link", "set", self.if_world, "up")
        _ip("-n", D, "addr", "add", f"{D_ADDR4}/24", "dev", self.if_d_world)
        _ip("-n", D, "addr", "add", f"{D_ADDR6}/64", "dev", self.if_d_world, "nodad")
        _ip("-n", D, "link", "set", self.if_d_world, "up")
        _ip("-n", D, "route", "add", "default", "via", W_ADDR4, "dev", self.if_d_world)
        _ip("-n", D, "-6", "route", "add", "default", "via", W_ADDR6, "dev", self.if_d_world)
        # W: no way out; with forwarding on, W answers ICMP unreachable for any
        # other destination, so a connect to a non-sink fails at once.
        _sysctl_in(W, "net.ipv4.ip_forward", "1")
        _sysctl_in(W, "net.ipv6.conf.all.forwarding", "1")
        _ip("-n", W, "route", "add", "unreachable", "default")
        _ip("-n", W, "-6", "route", "add", "unreachable", "default")

    def _make_certs(self) -> None:
        d = Path(self.tmpdir) / "pki"
        d.mkdir()
        ca = _make_ca(d, "ca", f"hutch egress test CA {self.id}")
        rogue = _make_ca(d, "rogue-ca", f"untrusted test CA {self.id}")
        self.ca_cert, self.ca_key = str(ca[0]), str(ca[1])
        self.rogue_ca_cert = str(rogue[0])
        self._leaves = {name: _make_leaf(d, name, ca, names, [addr])
                        for name, (addr, names) in SINKS.items()}
        self._untrusted_leaf = _make_leaf(d, "untrusted", rogue, UNTRUSTED_NAMES, [])
        for p in d.iterdir():
            os.chmod(p, 0o600 if p.suffix == ".key" else 0o644)

    def _start_world(self) -> None:
        self.control_path = os.path.join(self.tmpdir, "control.sock")
        self.world_log = os.path.join(self.tmpdir, "world.log")
        cfg = {
            "control": self.control_path,
            "dns": DNS_SERVER,
            "zone": self.zone_initial,
            "sinks": {name: {"addr": addr, "cert": str(self._leaves[name][0]),
                             "key": str(self._leaves[name][1])}
                      for name, (addr, _names) in SINKS.items()},
            "alt_certs": [{"names": UNTRUSTED_NAMES, "cert": str(self._untrusted_leaf[0]),
                           "key": str(self._untrusted_leaf[1])}],
        }
        cfg_path = os.path.join(self.tmpdir, "world.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)
        with open(self.world_log, "wb") as logf:
            self._world = subprocess.Popen(
                self.world_cmd_prefix + [self.python, self.world_script, "--config", cfg_path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                start_new_session=True, cwd=self.tmpdir)
        buf = b""
        deadline = time.monotonic() + self.start_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._world.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EgressNetError(f"world server not ready in {self.start_timeout}s: "
                                         f"{self._world_log_tail()}")
                if sel.select(min(left, 0.5)):
                    chunk = os.read(self._world.stdout.fileno(), 4096)
                    if not chunk:
                        self._world.wait(timeout=5)
                        raise EgressNetError(f"world server exited (rc={self._world.returncode}) "
                                             f"before it was ready: {self._world_log_tail()}")
                    buf += chunk
        if not buf.startswith(b"READY "):
            raise EgressNetError(f"world server said {buf[:300]!r}: {self._world_log_tail()}")
        self._world.stdout.close()      # it writes nothing more there
        self._control({"op": "ping"})

    def _world_log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.world_log, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except (OSError, TypeError):
            return "(no world log)"

    def close(self) -> None:
        """Stop everything and remove every netns, link and file of this
        instance. Safe to call twice and after a failed start; never raises
        (problems land in self.close_errors)."""
        errs = []

        def step(what, fn, *a):
            try:
                fn(*a)
            except Exception as e:  # keep cleaning up
                errs.append(f"{what}: {e}")

        w = self._world
        if w is not None:
            self._world = None

            def stop_world():
                with contextlib.suppress(OSError):
                    w.stdin.close()
                if w.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(w.pid, signal.SIGTERM)
                try:
                    w.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(w.pid, signal.SIGKILL)
                    w.wait(timeout=5)
                if w.stdout and not w.stdout.closed:
                    w.stdout.close()
            step("stop world", stop_world)
        if IP:
            for ns in (self.ns_daemon, self.ns_world):
                step(f"processes in {ns}", _kill_netns_processes, ns)
            if self.if_root in _root_links():
                step(f"link del {self.if_root}", lambda: _ip("link", "del", self.if_root))
            for ns in (self.ns_daemon, self.ns_world):
                if (NETNS_DIR / ns).exists():
                    step(f"netns del {ns}", lambda ns=ns: _ip("netns", "del", ns))
        if self.tmpdir:
            step("rm tmpdir", shutil.rmtree, self.tmpdir)
        deadline = time.monotonic() + 5
        while leftovers(self.prefix, self.id) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = leftovers(self.prefix, self.id)
        if left:
            errs.append(f"left behind: {left}")
        self.close_errors.extend(errs)

    # --- control -----------------------------------------------------------

    def _control(self, req: dict, timeout: float = 15.0) -> dict:
        if not self.control_path:
            raise EgressNetError("not started")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.control_path)
            s.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
        if not buf:
            raise EgressNetError(f"no answer from the world server: {self._world_log_tail()}")
        out = json.loads(buf)
        if not out.get("ok"):
            raise EgressNetError(f"world server: {out.get('error')}")
        return out

    def stats(self) -> dict:
        """{"sinks": {NAME: {"addr", "http": {"connections", "bytes", "requests"},
                             "https": {... , "handshakes", "tls_errors", "last_tls_error"},
                             "echo": {"connections", "bytes"}}},
            "dns": {"queries": [{"name", "qtype", "type", "transport", "time", "client",
                                 "rcode", "answers": [{"name","type","ttl","value"}],
                                 "malformed"?: why}],
                    "counts": {"udp", "tcp", "malformed"}},
            "requests": [{"time", "sink", "proto", "method", "target", "path", "host",
                          "sni", "headers", "body_len", "client"}]}"""
        out = self._control({"op": "stats"})
        out.pop("ok", None)
        return out

    def reset(self) -> None:
        """Counters, logs and rebind positions to zero (the zone stays)."""
        self._control({"op": "reset"})

    def set_zone(self, entries: dict, replace: bool = False) -> None:
        """Add/replace zone entries (a value None deletes the name); replace=True
        drops every other name first. Entry forms: see egress_world.py."""
        self._control({"op": "set_zone", "zone": entries, "replace": replace})

    def reset_zone(self) -> None:
        """Back to the zone this instance started with."""
        self._control({"op": "reset_zone"})

    def zone(self) -> dict:
        return self._control({"op": "get_zone"})["zone"]

    def dns_queries(self, name: Optional[str] = None, qtype: Optional[str] = None) -> List[dict]:
        """Queries that reached the DNS server, optionally only for `name` / type ("A")."""
        qs = self.stats()["dns"]["queries"]
        if name is not None:
            qs = [q for q in qs if q["name"] == name.rstrip(".").lower()]
        if qtype is not None:
            qs = [q for q in qs if q["type"] == qtype]
        return qs

    def sink_stats(self, sink: str) -> dict:
        return self.stats()["sinks"][sink]

    def requests(self, sink: Optional[str] = None) -> List[dict]:
        rs = self.stats()["requests"]
        return [r for r in rs if sink is None or r["sink"] == sink]

    # --- commands in D -----------------------------------------------------

    def run_in_daemon_ns(self, argv: Sequence[str], timeout: float = 60,
                         **kw) -> subprocess.CompletedProcess:
        """subprocess.run(daemon_cmd_prefix + argv), capture_output and text by
        default; raises subprocess.TimeoutExpired past `timeout`."""
        kw.setdefault("capture_output", True)
        if "encoding" not in kw and "universal_newlines" not in kw:
            kw.setdefault("text", True)
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.daemon_cmd_prefix + list(argv), timeout=timeout, **kw)

    def popen_in_daemon_ns(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """subprocess.Popen(daemon_cmd_prefix + argv): for `hutch serve`. The
        caller stops it; close() kills whatever is left in D."""
        return subprocess.Popen(self.daemon_cmd_prefix + list(argv), **kw)

    def run_in_world_ns(self, argv: Sequence[str], timeout: float = 60,
                        **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.world_cmd_prefix + list(argv), timeout=timeout, **kw)

    def dig(self, name: str, qtype: str = "A", tcp: bool = False, server: Optional[str] = None,
            timeout: float = 5.0) -> dict:
        """A DNS query sent from D -> {"rcode", "flags", "answers": [{"name","type","ttl","value"}],
        "addrs": [values of A/AAAA answers]} or {"error": "..."} on a timeout."""
        argv = [self.python, __file__, "dig", "--server", server or self.dns_server,
                "--timeout", str(timeout), name, qtype] + (["--tcp"] if tcp else [])
        cp = self.run_in_daemon_ns(argv, timeout=timeout + 15)
        if cp.returncode != 0:
            raise EgressNetError(f"dig failed (rc={cp.returncode}): {cp.stderr.strip()}")
        return json.loads(cp.stdout)

    def http_from_daemon(self, url: str, connect: Optional[str] = None,
                         cacert: Optional[str] = None, method: str = "GET",
                         body: Optional[bytes] = None, headers: Sequence[str] = (),
                         timeout: float = 10.0) -> dict:
        """One HTTP(S) request sent from D, straight to `connect` (default: the
        URL's host, which must then be an address) -> {"status", "headers",
        "body", "json"} or {"error"}. cacert defaults to ca_cert."""
        argv = [self.python, __file__, "http", url, "--timeout", str(timeout),
                "--cacert", cacert or self.ca_cert, "-X", method]
        if connect:
            argv += ["--connect", connect]
        for h in headers:
            argv += ["-H", h]
        if body is not None:
            argv += ["--data-b64", __import__("base64").b64encode(body).decode()]
        cp = self.run_in_daemon_ns(argv, timeout=timeout + 15)
        if cp.returncode != 0:
            raise EgressNetError(f"http failed (rc={cp.returncode}): {cp.stderr.strip()}")
        return json.loads(cp.stdout)


# --------------------------------------------------------------------------
# pytest fixtures (defined only when pytest is loaded: the CLI below runs
# inside D without it)
# --------------------------------------------------------------------------

if "pytest" in sys.modules:
    import pytest

    @pytest.fixture(scope="module")
    def egressnet():
        """One EgressNet per test module; skips where it cannot run."""
        why = unavailable_reason()
        if why:
            pytest.skip(why)
        net = EgressNet()
        net.start()
        try:
            yield net
        finally:
            net.close()
            if net.close_errors:
                raise EgressNetError(f"egressnet cleanup: {net.close_errors}")

    @pytest.fixture
    def egressnet_fresh(egressnet):
        """The module's EgressNet with its zone, counters and logs reset."""
        egressnet.reset_zone()
        egressnet.reset()
        return egressnet


# --------------------------------------------------------------------------
# CLI: tiny DNS and HTTP clients for use inside D
# --------------------------------------------------------------------------

_QTYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28,
           "SRV": 33, "HTTPS": 65, "ANY": 255}


def _read_name(buf: bytes, off: int):
    labels, end, jumps = [], None, 0
    while True:
        n = buf[off]
        if n == 0:
            off += 1
            break
        if n & 0xC0 == 0xC0:
            if end is None:
                end = off + 2
            jumps += 1
            if jumps > 16:
                raise ValueError("pointer loop")
            off = ((n & 0x3F) << 8) | buf[off + 1]
            continue
        labels.append(buf[off + 1:off + 1 + n].decode("latin-1"))
        off += 1 + n
    return ".".join(labels), (end if end is not None else off)


def dns_query(server: str, name: str, qtype: str = "A", tcp: bool = False,
              timeout: float = 5.0, port: int = 53) -> dict:
    """Send one query (from the current netns) and parse the answer section."""
    t = _QTYPES[qtype.upper()] if not str(qtype).isdigit() else int(qtype)
    qid = secrets.randbelow(65536)
    q = struct.pack("!6H", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack("!HH", t, 1)
    fam = socket.AF_INET6 if ":" in server else socket.AF_INET
    try:
        if tcp:
            with socket.socket(fam, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect((server, port))
                s.sendall(struct.pack("!H", len(q)) + q)
                data = b""
                while len(data) < 2 or len(data) < 2 + struct.unpack("!H", data[:2])[0]:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise ConnectionError("connection closed")
                    data += chunk
                resp = data[2:2 + struct.unpack("!H", data[:2])[0]]
        else:
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.settimeout(timeout)
                s.sendto(q, (server, port))
                while True:
                    resp, _ = s.recvfrom(65535)
                    if resp[:2] == q[:2]:
                        break
    except (OSError, ConnectionError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    rid, flags, qd, an, _ns, _ar = struct.unpack("!6H", resp[:12])
    off = 12
    for _ in range(qd):
        _, off = _read_name(resp, off)
        off += 4
    answers = []
    rev = {v: k for k, v in _QTYPES.items()}
    for _ in range(an):
        owner, off = _read_name(resp, off)
        rtype, _cls, ttl, rdlen = struct.unpack_from("!HHIH", resp, off)
        off += 10
        rdata = resp[off:off + rdlen]
        if rtype == 1:
            value = str(ipaddress.IPv4Address(rdata))
        elif rtype == 28:
            value = str(ipaddress.IPv6Address(rdata))
        elif rtype == 5:
            value = _read_name(resp, off)[0]
        else:
            value = rdata.hex()
        off += rdlen
        answers.append({"name": owner, "type": rev.get(rtype, str(rtype)), "ttl": ttl,
                        "value": value})
    return {"rcode": flags & 0xF, "flags": flags, "tc": bool(flags & 0x0200),
            "answers": answers,
            "addrs": [a["value"] for a in answers if a["type"] in ("A", "AAAA")]}


def http_request(url: str, connect: Optional[str] = None, cacert: Optional[str] = None,
                 method: str = "GET", body: Optional[bytes] = None,
                 headers: Sequence[str] = (), timeout: float = 10.0) -> dict:
    """One request on a fresh connection to `connect` (default the URL's host)."""
    import http.client
    import ssl
    from urllib.parse import urlsplit

    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    host = connect or u.hostname
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        if u.scheme == "https":
            ctx = ssl.create_default_context(cafile=cacert)
            sock = ctx.wrap_socket(sock, server_hostname=u.hostname)
        conn = http.client.HTTPConnection(u.hostname, port, timeout=timeout)
        conn.sock = sock
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hdrs = {}
        for h in headers:
            n, _, v = h.partition(":")
            hdrs[n.strip()] = v.strip()
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        conn.close()
    except (OSError, http.client.HTTPException) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    out = {"status": r.status, "headers": [[k, v] for k, v in r.getheaders()],
           "body": data.decode("utf-8", "replace"), "json": None}
    try:
        out["json"] = json.loads(data)
    except ValueError:
        pass
    return out


def _main(argv=None) -> int:
    import argparse
    import base64

    ap = argparse.ArgumentParser(prog="egressnet.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dig")
    d.add_argument("--server", default=DNS_SERVER)
    d.add_argument("--tcp", action="store_true")
    d.add_argument("--timeout", type=float, default=5.0)
    d.add_argument("name")
    d.add_argument("qtype", nargs="?", default="A")
    h = sub.add_parser("http")
    h.add_argument("url")
    h.add_argument("--connect")
    h.add_argument("--cacert")
    h.add_argument("-X", dest="method", default="GET")
    h.add_argument("-d", dest="data")
    h.add_argument("--data-b64")
    h.add_argument("-H", dest="headers", action="append", default=[])
    h.add_argument("--timeout", type=float, default=10.0)
    c = sub.add_parser("cleanup")
    c.add_argument("--prefix", default=DEFAULT_PREFIX)
    a = ap.parse_args(argv)
    if a.cmd == "dig":
        print(json.dumps(dns_query(a.server, a.name, a.qtype, a.tcp, a.timeout)))
    elif a.cmd == "http":
        body = base64.b64decode(a.data_b64) if a.data_b64 else \
            (a.data.encode() if a.data is not None else None)
        print(json.dumps(http_request(a.url, a.connect, a.cacert, a.method, body,
                                      a.headers, a.timeout)))
    else:
        for r in cleanup_stale(a.prefix):
            print("removed", r)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
