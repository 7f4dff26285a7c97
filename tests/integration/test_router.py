"""hutch router in front of several nodes (issue 18, docs/scale-out.md).

Nodes are `hutch serve` daemons on this host, each with its own data dir,
run dir, node id and network namespace (its own address, joined to the test's
by a veth pair), all given one keys-file; a tiny DNS server in the
test answers the "headless Service" name with the nodes' addresses (the
router's --nodes-dns, as on Kubernetes), and routers run in front of them.
Everything goes through the router's port: creates, lists, the envd plane.

What is checked: every id names its node, creates spread over all nodes,
a list is one merged, paginated list, the envd plane (a command stream,
file upload and download) reaches the sandbox's node; a node killed with
kill -9 turns only its sandboxes into a clear 404 within a few seconds while
creates keep working; a node added to the DNS answer takes creates; a drained
node takes none and keeps serving its sandboxes; a second router replica
serves the same sandboxes and carries on when the first is killed; a keys-file
change reaches the nodes within seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from serveclient import HttpConn, ServeDaemon, envelope, free_port, websocket_echo

NAME = "hutch-nodes.hutch.svc.cluster.local"


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


class TinyDNS:
    """A UDP DNS server on 127.0.0.1 that answers A queries for NAME with
    self.addrs (mutable), NXDOMAIN for anything else."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.addrs: list[str] = []
        self.queries = 0
        self.stopped = False
        self.th = threading.Thread(target=self._serve, daemon=True)
        self.th.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stopped:
            try:
                q, peer = self.sock.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                return
            self.queries += 1
            try:
                self.sock.sendto(self._answer(q), peer)
            except Exception:  # a malformed query gets no answer
                pass

    def _answer(self, q: bytes) -> bytes:
        qid, _flags, qd = struct.unpack("!HHH", q[:6])
        # the question: labels to a zero byte, then type and class
        i, labels = 12, []
        while q[i]:
            labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
            i += 1 + q[i]
        qtype, = struct.unpack("!H", q[i + 1:i + 3])
        question = q[12:i + 5]
        ok = ".".join(labels) == NAME
        answers = b""
        n = 0
        if ok and qtype == 1:
            for a in self.addrs:
                answers += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + socket.inet_aton(a)
                n += 1
        flags = 0x8180 if ok else 0x8183
        return struct.pack("!HHHHHH", qid, flags, 1, n, 0, 0) + question + answers

    def stop(self):
        self.stopped = True
        self.sock.close()


class Cluster:
    def __init__(self, hutch_bin: Path, tmp: Path):
        self.bin = hutch_bin
        self.tmp = tmp
        self.key = "e2b_" + os.urandom(20).hex()
        self.keys = tmp / "keys"
        self.keys.write_text(f"default {self.key}\n")
        self.nodes: dict[str, ServeDaemon] = {}
        self.routers: list[subprocess.Popen] = []
        self.dns = TinyDNS()
        # all nodes listen on one port, each on its own address in its own
        # network namespace: the headless Service's shape (one port, an
        # address per pod)
        self.node_port = free_port()
        self.ns_prefix = "hrt" + os.urandom(3).hex()
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        self.subnet = next(n for n in (int.from_bytes(os.urandom(1), "big") for _ in range(200))
                           if f"10.233.{n}." not in used)
        self.netns: list[str] = []

    def node_addr(self, i: int) -> str:
        return f"10.233.{self.subnet}.{4 * i + 2}"

    def _netns(self, i: int) -> tuple[str, str]:
        """Node i's own network namespace, joined to this one by a veth pair
        on 10.233.S.4i/30: (namespace name, the node's address)."""
        ns = f"{self.ns_prefix}{i}"
        host, peer = f"{self.ns_prefix}{i}r", f"{self.ns_prefix}{i}n"
        here, there = f"10.233.{self.subnet}.{4 * i + 1}", self.node_addr(i)
        for argv in (["ip", "netns", "add", ns],
                     ["ip", "link", "add", host, "type", "veth", "peer", "name", peer],
                     ["ip", "link", "set", peer, "netns", ns],
                     ["ip", "addr", "add", f"{here}/30", "dev", host],
                     ["ip", "link", "set", host, "up"],
                     ["ip", "-n", ns, "addr", "add", f"{there}/30", "dev", peer],
                     ["ip", "-n", ns, "link", "set", peer, "up"],
                     ["ip", "-n", ns, "link", "set", "lo", "up"]):
            subprocess.run(argv, check=True, capture_output=True)
        self.netns.append(ns)
        return ns, there

    def add_node(self, i: int, tls_args: tuple = (), tls=None) -> ServeDaemon:
        """tls_args: --tls-cert/--tls-key; tls: the ssl.SSLContext the test
        speaks to the node with."""
        nid = f"nd{i:02d}"
        ns, addr = self._netns(i)
        # nsenter, not `ip netns exec` (which remounts /sys and hides the cgroups)
        d = ServeDaemon(self.bin, self.tmp / f"data{i}", host=addr, cmd_prefix=["nsenter", f"--net=/run/netns/{ns}"],
                        extra_args=["--run-dir", str(self.tmp / f"run{i}"), "--node-id", nid,
                                    "--keys-file", str(self.keys), "--pool-size", "0", *tls_args], tls=tls)
        # ServeDaemon picks a free port per start: pin this cluster's one
        import serveclient
        orig = serveclient.free_port
        serveclient.free_port = lambda: self.node_port
        try:
            d.start()
        finally:
            serveclient.free_port = orig
        d.key = self.key
        self.nodes[nid] = d
        self.dns.addrs = [n.host for n in self.nodes.values() if n.alive()]
        return d

    def start_router(self, *extra: str, up: int | None = None) -> tuple[subprocess.Popen, int]:
        """up: how many nodes the router must see up (default: every live one)."""
        port = free_port()
        log = open(self.tmp / f"router-{port}.log", "ab")
        p = subprocess.Popen([str(self.bin), "router", "--listen", f"127.0.0.1:{port}",
                              "--nodes-dns", f"{NAME}:{self.node_port}", "--dns", f"127.0.0.1:{self.dns.port}",
                              "--key-file", str(self.keys), "--poll-interval", "300", "--sample", "2", *extra],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        self.routers.append(p)
        known = len(self.dns.addrs) if up is not None else None
        if up is None:
            up = len([n for n in self.nodes.values() if n.alive()])
        wait_until(lambda: _health(port).get("nodesUp", 0) == up and
                   known in (None, _health(port).get("nodesKnown")),
                   timeout=15, what=f"the router to see {up} node(s) up")
        return p, port

    def client(self, port: int) -> ServeDaemon:
        """A ServeDaemon object that talks to a router (never started)."""
        c = ServeDaemon(self.bin, self.tmp / "unused")
        c.port = port
        c.key = self.key
        return c

    def teardown(self):
        for p in self.routers:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for nid, d in self.nodes.items():
            if not d.alive():
                d.start()  # re-adopts what a kill -9 left, so it can be killed
                d.key = self.key
            d.key = self.key
            try:
                for sid in list_all(d):
                    d.kill(sid, key=self.key)
            finally:
                d.stop()
        self.dns.stop()

    def remove_netns(self):
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # its veth goes with it


def _health(port: int) -> dict:
    try:
        with HttpConn("127.0.0.1", port, timeout=5) as c:
            return c.request("GET", "/health").json()
    except (OSError, ValueError):
        return {}


def list_all(c: ServeDaemon, limit: int = 100) -> list[str]:
    """Every running sandbox of the key, page by page."""
    ids, token = [], ""
    for _ in range(100):
        q = f"?limit={limit}" + (f"&nextToken={token}" if token else "")
        r = c.request("GET", "/v2/sandboxes" + q)
        assert r.status == 200, r
        ids += [s["sandboxID"] for s in r.json()]
        token = r.header("X-Next-Token") or ""
        if not token:
            return ids
    raise AssertionError("more than 100 pages")


@pytest.fixture
def cluster(hutch_bin):
    # run dirs must be reachable by sandbox uids: not under pytest's 0700 tmp
    base = Path(tempfile.mkdtemp(prefix="hutch-router-", dir="/tmp"))
    base.chmod(0o755)
    c = Cluster(hutch_bin, base)
    try:
        yield c
    finally:
        try:
            c.teardown()
        finally:
            c.remove_netns()
            _rm(base)


def _rm(base: Path):
    mounted = any(line.split()[4].startswith(str(base) + "/") for line in open("/proc/self/mountinfo"))
    if not mounted:
        shutil.rmtree(base, ignore_errors=True)


def test_router_end_to_end(cluster):
    for i in (1, 2, 3):
        cluster.add_node(i)
    _, port = cluster.start_router()
    rc = cluster.client(port)

    # creates spread over every node; each id begins with its node's id
    made = [rc.create(metadata={"n": str(k)})["sandboxID"] for k in range(9)]
    by_node = {}
    for sid in made:
        assert sid[:4] in cluster.nodes, sid
        by_node.setdefault(sid[:4], []).append(sid)
    assert set(by_node) == {"nd01", "nd02", "nd03"}, by_node
    for nid, sids in by_node.items():
        assert sorted(cluster.nodes[nid].list_ids()) == sorted(sids)

    # one merged list, newest first, in pages of 4 with the page token
    assert sorted(list_all(rc, limit=4)) == sorted(made)
    r = rc.request("GET", "/v2/sandboxes?limit=100")
    started = [s["startedAt"] for s in r.json()]
    assert started == sorted(started, reverse=True)

    # the envd plane: a command stream and files reach the sandbox's node
    sb = rc.request("GET", f"/sandboxes/{made[0]}").json()
    end, out, _, _ = rc.run(sb, "echo routed; hostname")
    assert end.get("exitCode", 0) == 0 and out.startswith(b"routed"), (end, out)
    data = os.urandom(300_000)
    assert rc.upload(sb, "/tmp/blob", data).status == 200
    got = rc.request("GET", rc.files_path("/tmp/blob"), key="", headers=rc.envd_headers(sb))
    assert got.status == 200 and got.body == data

    # a client that leaves a stream: the router lets go of it at once (not
    # when the command next prints or ends)
    def open_conns():
        with HttpConn("127.0.0.1", port, timeout=5) as c:
            m = c.request("GET", "/metrics").body.decode()
        return int(next(ln.split()[1] for ln in m.splitlines() if ln.startswith("hutch_router_connections_open ")))
    base = open_conns()
    body = envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 60"]}, "stdin": False})
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    hdrs = "".join(f"{k}: {v}\r\n" for k, v in rc.envd_headers(sb, ctype="application/connect+json"))
    s.sendall(f"POST /process.Process/Start HTTP/1.1\r\nHost: r\r\n{hdrs}Content-Length: {len(body)}\r\n\r\n"
              .encode() + body)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")  # the stream is open, the command runs
    assert open_conns() == base + 1
    s.close()
    wait_until(lambda: open_conns() == base, timeout=3, what="the router to drop the abandoned stream")

    # an id whose node no router knows: 404 naming the node
    r = rc.request("GET", "/sandboxes/zzzzaaaaaaaaaaaaaaaa")
    assert r.status == 404 and "zzzz" in r.json()["message"], r

    # a second router replica, sharing nothing, serves the same sandboxes
    r2, port2 = cluster.start_router()
    rc2 = cluster.client(port2)
    assert sorted(list_all(rc2)) == sorted(made)

    # kill -9 a node mid-traffic: its sandboxes answer 404 with a clear
    # error within seconds, the others' are unaffected, creates go on
    victim = "nd02"
    stop = threading.Event()
    errors = []

    def traffic():
        while not stop.is_set():
            for sid in by_node["nd01"] + by_node["nd03"]:
                st = rc.request("GET", f"/sandboxes/{sid}").status
                if st != 200:
                    errors.append((sid, st))
    t = threading.Thread(target=traffic)
    t.start()
    try:
        cluster.nodes[victim].proc.kill()
        cluster.nodes[victim].proc.wait(10)
        t0 = time.monotonic()
        wait_until(lambda: rc.request("GET", f"/sandboxes/{by_node[victim][0]}").status == 404, timeout=10,
                   what="the killed node's sandbox to answer 404")
        assert time.monotonic() - t0 < 3
        r = rc.request("GET", f"/sandboxes/{by_node[victim][0]}")
        assert "not reachable" in r.json()["message"] and victim in r.json()["message"], r
        # the data plane says it in envd's shape
        vsb = {"sandboxID": by_node[victim][0], "envdAccessToken": "tok_x"}
        r = rc.request("GET", "/health", key="", headers=rc.envd_headers(vsb))
        assert r.status == 502 and "not reachable" in r.json()["message"], r
        for _ in range(4):
            assert rc.create()["sandboxID"][:4] in ("nd01", "nd03")
    finally:
        stop.set()
        t.join()
    assert errors == [], errors[:5]
    cluster.dns.addrs = [n.host for n in cluster.nodes.values() if n.alive()]

    # a node added while traffic runs: found through DNS, takes creates
    cluster.add_node(4)
    wait_until(lambda: any(n.get("nodeID") == "nd04" and n.get("up") for n in _health(port).get("nodes", [])),
               timeout=10, what="the router to find nd04")
    landed = [rc.create()["sandboxID"][:4] for _ in range(6)]
    assert "nd04" in landed, landed

    # drain: nd01 takes no creates, keeps serving its sandboxes
    subprocess.run([str(cluster.bin), "node", "drain", "--data-dir", str(cluster.nodes["nd01"].data_dir)],
                   check=True, capture_output=True)
    r = cluster.nodes["nd01"].request("POST", "/sandboxes", {"templateID": "base"})
    assert r.status == 503 and "draining" in r.json()["message"], r
    landed = [rc.create()["sandboxID"][:4] for _ in range(6)]
    assert "nd01" not in landed, landed
    assert rc.request("GET", f"/sandboxes/{by_node['nd01'][0]}").status == 200
    subprocess.run([str(cluster.bin), "node", "undrain", "--data-dir", str(cluster.nodes["nd01"].data_dir)],
                   check=True, capture_output=True)

    # the first router killed: the replica carries on
    cluster.routers[0].kill()
    cluster.routers[0].wait(10)
    sb3 = rc2.request("GET", f"/sandboxes/{by_node['nd03'][0]}").json()
    end, out, _, _ = rc2.run(sb3, "echo still")
    assert out == b"still\n"

    # router metrics count what it did
    with HttpConn("127.0.0.1", port2, timeout=5) as c:
        m = c.request("GET", "/metrics").body.decode()
    assert f'hutch_router_node_up{{node="nd04",address="{cluster.nodes["nd04"].host}:' in m, m
    assert 'nd02' not in m  # gone from the DNS answer: no longer a node
    assert 'hutch_router_requests_total{route="create"}' in m, m


def test_keys_file_reload(cluster):
    d = cluster.add_node(1)
    assert d.request("GET", "/v2/sandboxes").status == 200
    new = "e2b_" + os.urandom(20).hex()
    tmp = cluster.keys.with_suffix(".new")
    tmp.write_text(f"# rotated\ndefault {new}\n")
    os.replace(tmp, cluster.keys)  # as a Secret update: a new inode
    wait_until(lambda: d.request("GET", "/v2/sandboxes").status == 401, timeout=5,
               what="the old key to be refused")
    assert d.request("GET", "/v2/sandboxes", key=new).status == 200
    # a file that does not parse keeps the last good keys
    cluster.keys.write_text("default not-a-key\n")
    time.sleep(1.2)
    assert d.request("GET", "/v2/sandboxes", key=new).status == 200
    assert "keeping the 1 keys" in d.log_tail()
    cluster.key = new
    cluster.keys.write_text(f"default {new}\n")
    wait_until(lambda: d.request("GET", "/v2/sandboxes", key=new).status == 200
               and d.log_tail().count("reloaded, 1 keys") >= 2, timeout=5, what="the good file to be read again")


def test_creates_find_the_node_that_has_the_template(cluster):
    """A template lives on the node that built or imported it: a create
    through the router lands there, not on a node that would answer 404 —
    an image template because /node lists it, a built one because the
    router tries the next node on a 404 (docs/scale-out.md)."""
    import ociimage as oi
    for i in (1, 2, 3):
        cluster.add_node(i)
    _, port = cluster.start_router()
    rc = cluster.client(port)
    # a built template on nd02 only (its own API): no steps over the host template
    nd02 = cluster.nodes["nd02"]
    r = nd02.request("POST", "/v3/templates", {"name": "built-here"})
    assert r.status == 202, r
    tid, bid = r.json()["templateID"], r.json()["buildID"]
    assert nd02.request("POST", f"/v2/templates/{tid}/builds/{bid}", {"fromTemplate": "base", "steps": []}).status == 202
    wait_until(lambda: nd02.request("GET", f"/templates/{tid}/builds/{bid}/status").json()["status"] == "ready",
               timeout=60, what="the build on nd02")
    # an image template imported into nd03's data dir only
    bb = Path("/bin/busybox").read_bytes()
    layer = oi.make_tar([oi.dir_entry("bin"), oi.file_entry("bin/busybox", bb, mode=0o755),
                         oi.symlink_entry("bin/sh", "busybox"), oi.symlink_entry("bin/true", "busybox"),
                         oi.dir_entry("etc"), oi.file_entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"),
                         oi.file_entry("etc/group", b"root:x:0:\n"), oi.dir_entry("tmp", mode=0o1777)])
    lay = cluster.tmp / "img"
    oi.write_oci_layout(lay, [layer], ref="only-nd03:1")
    cp = subprocess.run([str(cluster.bin), "template", "import", str(lay), "--name", "only-nd03"],
                        env=dict(os.environ, HUTCH_DATA_DIR=str(cluster.nodes["nd03"].data_dir)),
                        capture_output=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    wait_until(lambda: "only-nd03" in cluster.nodes["nd03"].request("GET", "/node").json().get("templates", []),
               timeout=10, what="nd03 to list the image")
    time.sleep(1)  # the router's next poll of /node (every 300 ms here)
    made = []
    try:
        for tmpl, nid in (("built-here", "nd02"), ("only-nd03", "nd03")):
            for _ in range(6):
                r = rc.request("POST", "/v2/sandboxes", {"templateID": tmpl, "timeout": 60})
                assert r.status == 201, (tmpl, r)
                sid = r.json()["sandboxID"]
                made.append(sid)
                assert sid.startswith(nid), (tmpl, sid)
        # a template no node has is still the node's own 404
        r = rc.request("POST", "/v2/sandboxes", {"templateID": "nowhere-at-all"})
        assert r.status == 404, r
    finally:
        for sid in made:
            rc.kill(sid)


def test_a_team_limit_holds_across_the_nodes(cluster):
    """--max-sandboxes-per-team at the router counts a team's sandboxes on
    every node (each node's GET /node says the caller's team's count, and
    no other team's): past it a create is 429, another team is not held,
    and a kill makes room again (docs/scale-out.md, "Team limits")."""
    other = "e2b_" + os.urandom(20).hex()
    cluster.keys.write_text(f"default {cluster.key}\nother {other}\n")
    for i in (1, 2, 3):
        cluster.add_node(i)
    time.sleep(1.5)  # each node re-reads keys-file within 1 s
    # a node the router takes for down is not counted (docs/scale-out.md):
    # a generous connect timeout, so that a node slowed by a loaded host (or
    # the sanitizers) is not taken for down while the limit is checked
    _, port = cluster.start_router("--max-sandboxes-per-team", "4", "--max-snapshots-per-team", "2",
                                   "--connect-timeout", "10000")
    rc = cluster.client(port)
    ro = cluster.client(port)
    ro.key = other
    made, snaps = [], []
    try:
        for _ in range(4):
            r = rc.request("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 120})
            assert r.status == 201, r
            made.append((rc, r.json()["sandboxID"]))
        assert len({sid[:4] for _, sid in made}) >= 2, made  # spread over nodes: the limit is the cluster's
        r = rc.request("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 120})
        assert r.status == 429, r
        assert r.json()["code"] == 429 and "limit of 4 live sandboxes across the cluster" in r.json()["message"], r
        assert sum(len(list_all(d)) for d in cluster.nodes.values()) == 4
        # another team has its own count; a node tells each team only its own
        r = ro.request("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 120})
        assert r.status == 201, r
        made.append((ro, r.json()["sandboxID"]))
        node = cluster.nodes[made[-1][1][:4]]
        assert node.request("GET", "/node", key=other).json()["teamSandboxes"] == 1
        assert sum(cluster.nodes[n].request("GET", "/node").json()["teamSandboxes"]
                   for n in cluster.nodes) == 4
        # a bad key is the node's 401, not the limit's 429
        bad = cluster.client(port)
        bad.key = "e2b_" + "0" * 40
        assert bad.request("POST", "/v2/sandboxes", {"templateID": "base"}).status == 401
        # room again after a kill
        c0, sid0 = made.pop(0)
        assert c0.kill(sid0).status == 204
        r = rc.request("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 120})
        assert r.status == 201, r
        made.append((rc, r.json()["sandboxID"]))
        # --max-snapshots-per-team: snapshots on two nodes make the team's
        # two; a third createSnapshot, on either, is 429 until one is deleted
        mine = [sid for c, sid in made if c is rc]
        two = [mine[0], next(sid for sid in mine if sid[:4] != mine[0][:4])]
        for sid in two:
            r = rc.request("POST", f"/sandboxes/{sid}/snapshots", {}, timeout=120)
            assert r.status == 201, r
            snaps.append((rc, r.json()["snapshotID"]))
        assert sum(cluster.nodes[n].request("GET", "/node").json()["teamSnapshots"] for n in cluster.nodes) == 2
        r = rc.request("POST", f"/sandboxes/{two[0]}/snapshots", {}, timeout=120)
        assert r.status == 429 and "limit of 2 snapshots across the cluster" in r.json()["message"], r
        osid = next(sid for c, sid in made if c is ro)
        r = ro.request("POST", f"/sandboxes/{osid}/snapshots", {}, timeout=120)
        assert r.status == 201, r  # another team's snapshot: its own count
        snaps.append((ro, r.json()["snapshotID"]))
        assert rc.request("DELETE", f"/templates/{snaps.pop(0)[1]}").status in (200, 204)
        r = rc.request("POST", f"/sandboxes/{two[0]}/snapshots", {}, timeout=120)
        assert r.status == 201, r
        snaps.append((rc, r.json()["snapshotID"]))
        with HttpConn("127.0.0.1", port) as c:
            m = c.request("GET", "/metrics").body.decode()
        assert "hutch_router_team_limit_refusals_total 1" in m, m
        assert "hutch_router_team_snapshot_limit_refusals_total 1" in m, m
    finally:
        for c, sid in made:
            c.kill(sid)
        for c, sn in snaps:
            c.request("DELETE", f"/templates/{sn}")


# ------------------------------------------------------------ HTTP/2

H2_SERVER = Path(__file__).resolve().parent.parent / "helpers" / "h2_server.py"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _h2_frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def _h2_frames(s: socket.socket, timeout: float = 10, buf: bytes = b"") -> list:
    """Frames (buf's, then what comes) until the other side closes: (type,
    flags, stream, payload)."""
    out = []
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            b = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not b:
            break
        buf += b
    while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
        n = int.from_bytes(buf[:3], "big")
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7fffffff, buf[9:9 + n]))
        buf = buf[9 + n:]
    return out


def test_router_forwards_h2c_prior_knowledge(cluster):
    """h2c with prior knowledge through the router: the first request's
    :authority (<port>-<id>.<domain>) or e2b-sandbox-id and -port pick the
    node, as Host and E2b-Sandbox-* do for HTTP/1.1, and the connection is
    relayed to it whole; what the router cannot route is answered in
    HTTP/2; a later stream that names a sandbox of another node is refused
    by the node (GOAWAY) before either sandbox sees it; HTTP/1.1 on the same
    port is as before."""
    import hpack

    for i in (1, 2):
        cluster.add_node(i)
    _, port = cluster.start_router()
    rc = cluster.client(port)
    by_node: dict[str, dict] = {}
    for _ in range(10):
        sb = rc.create()
        by_node.setdefault(sb["sandboxID"][:4], sb)
        if len(by_node) == 2:
            break
    assert set(by_node) == {"nd01", "nd02"}, by_node
    for sb in by_node.values():
        assert rc.upload(sb, "/tmp/h2s.py", H2_SERVER.read_bytes()).status == 200
        end, _, err, _ = rc.run(sb, "(setsid python3 /tmp/h2s.py 8000 /tmp/h2.log >/dev/null 2>/tmp/h2.err &)")
        assert end.get("exitCode", 0) == 0, err

    def curl(host, *args, mode="--http2-prior-knowledge"):
        return subprocess.run(["curl", "-sS", "--max-time", "20", mode, "-o", "-", "-w",
                               "\n%{http_code} %{http_version}", "-H", f"Host: {host}", *args,
                               f"http://127.0.0.1:{port}/hello"], capture_output=True, timeout=60)

    def h2log(sb):
        _, out, _, _ = rc.run(sb, "cat /tmp/h2.log 2>/dev/null; : > /tmp/h2.log")
        return out.decode()

    for sb in by_node.values():
        host = f"8000-{sb['sandboxID']}.sbx.hutch.test"
        wait_until(lambda: curl(host).stdout.endswith(b"\n200 2"), 20, "the sandbox's h2 server")
        out = curl(host).stdout.decode()
        assert out.startswith(f"hello h2 {host}"), out
        r = curl("router.hutch.test", "-H", f"E2b-Sandbox-Id: {sb['sandboxID']}", "-H", "E2b-Sandbox-Port: 8000")
        assert r.stdout.decode().endswith("\n200 2"), r
        assert curl(host, mode="--http1.1").stdout.decode().endswith("\n200 1.1")

    # a node no router knows: HTTP/2's answer, the data plane's body
    r = curl("8000-zzzzaaaaaaaaaaaaaaaa.sbx.hutch.test")
    out = r.stdout.decode()
    assert out.endswith("\n502 2") and "zzzz" in out, (out, r.stderr)

    # a second stream that names the other node's sandbox
    a, b = by_node["nd01"], by_node["nd02"]
    h2log(a)
    h2log(b)
    enc = hpack.Encoder()

    def req(sid, sb, path):
        block = enc.encode([(":method", "GET"), (":scheme", "http"), (":path", path),
                            (":authority", f"8000-{sb['sandboxID']}.sbx.hutch.test")])
        return _h2_frame(1, 0x5, sid, block)

    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(H2_PREFACE + _h2_frame(4, 0, 0) + req(1, a, "/hello"))
    # stream 1 answered (its DATA with END_STREAM) before stream 3 goes
    seen = b""
    deadline = time.monotonic() + 20
    while b"hello h2" not in seen:
        assert time.monotonic() < deadline, seen
        seen += s.recv(65536)
    s.sendall(req(3, b, "/hello?other"))
    fr = _h2_frames(s, buf=seen)
    s.close()
    ga = [f for f in fr if f[0] == 7]
    assert ga and struct.unpack(">II", ga[-1][3][:8]) == (1, 1), fr
    assert not [f for f in fr if f[2] == 3], fr
    assert "other" not in h2log(a) and h2log(b) == ""

    # hostile first requests end at the router with GOAWAY, no node involved
    for bad in (_h2_frame(0, 1, 1, b"x"), _h2_frame(1, 0x5, 1, b"\x00" * 20000),
                _h2_frame(1, 0x5, 1, b"\xff\x10")):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(H2_PREFACE + _h2_frame(4, 0, 0) + bad)
        except (BrokenPipeError, ConnectionResetError):
            pass
        fr = _h2_frames(s)
        s.close()
        ga = [f for f in fr if f[0] == 7]
        assert ga and struct.unpack(">I", ga[-1][3][4:8])[0] != 0, fr
        assert not [f for f in fr if f[0] in (0, 1)], fr
    assert _health(port).get("nodesUp") == 2


# ------------------------------------------------------------ TLS to nodes

def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    return cert, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], san: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}",
             "-addext", "basicConstraints=critical,CA:FALSE", "-x509", "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-days", "2", "-out", str(cert))
    return cert, key


def test_router_speaks_tls_to_nodes(cluster):
    """--node-tls-ca: the router speaks TLS to every node and verifies it.
    Two nodes with certificates of the router's CA (for their addresses)
    take creates, a command stream, files both ways (one large enough to be
    spliced on plain HTTP), a WebSocket through ingress, a kill; a third node
    whose certificate comes from another CA is down, with a log line that
    says why, and never used; --node-tls-name makes the name the
    certificates must carry; HTTP/2 prior knowledge, which a TLS node does
    not serve, is answered by the router."""
    import ssl

    pki = cluster.tmp / "pki"
    pki.mkdir()
    good, evil = _ca(pki, "ca"), _ca(pki, "other-ca")
    ctx_good = ssl.create_default_context(cafile=str(good[0]))
    ctx_evil = ssl.create_default_context(cafile=str(evil[0]))
    for i, ca, ctx in ((1, good, ctx_good), (2, good, ctx_good), (3, evil, ctx_evil)):
        cert, key = _leaf(pki, f"node{i}", ca, f"IP:{cluster.node_addr(i)},DNS:{NAME}")
        cluster.add_node(i, ("--tls-cert", str(cert), "--tls-key", str(key)), tls=ctx)
    _, port = cluster.start_router("--node-tls-ca", str(good[0]), up=2)
    rc = cluster.client(port)
    nodes = {n["address"].split(":")[0]: n for n in _health(port)["nodes"]}
    assert not nodes[cluster.node_addr(3)]["up"] and nodes[cluster.node_addr(1)]["up"], nodes
    log = next(cluster.tmp.glob(f"router-{port}.log")).read_text()
    assert f"({cluster.node_addr(3)}:{cluster.node_port}): TLS: its certificate is refused" in log, log

    made = [rc.create()["sandboxID"] for _ in range(6)]
    assert {sid[:4] for sid in made} == {"nd01", "nd02"}, made
    assert cluster.nodes["nd03"].list_ids() == []
    sb = rc.request("GET", f"/sandboxes/{made[0]}").json()
    end, out, _, _ = rc.run(sb, "for i in 1 2 3; do echo line$i; sleep 0.1; done")
    assert end.get("exitCode", 0) == 0 and out == b"line1\nline2\nline3\n", (end, out)
    data = os.urandom(600_000)
    assert rc.upload(sb, "/tmp/blob", data).status == 200
    got = rc.request("GET", rc.files_path("/tmp/blob"), key="", headers=rc.envd_headers(sb))
    assert got.status == 200 and got.body == data

    # a WebSocket to a sandbox port, through the router and the node's TLS
    srv = (Path(__file__).resolve().parent.parent / "e2b" / "fixtures" / "ingress_server.py").read_bytes()
    assert rc.upload(sb, "/tmp/s.py", srv).status == 200
    end, _, err, _ = rc.run(sb, "(setsid python3 /tmp/s.py 8000 >/dev/null 2>&1 &)")
    assert end.get("exitCode", 0) == 0, err
    host = f"8000-{sb['sandboxID']}.sbx.hutch.test"
    port_h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "8000"}
    wait_until(lambda: rc.request("GET", "/", key="", headers=port_h).status == 200, 20, "the sandbox's server")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        websocket_echo(s, f"Host: {host}\r\n", (b"over tls", b"twice"))

    # HTTP/2 prior knowledge: a TLS node has none, the router says so
    r = subprocess.run(["curl", "-sS", "--max-time", "20", "--http2-prior-knowledge", "-o", "-", "-w",
                        "\n%{http_code} %{http_version}", "-H", f"Host: {host}", f"http://127.0.0.1:{port}/"],
                       capture_output=True, timeout=60)
    out = r.stdout.decode()
    assert out.endswith("\n502 2") and "not built" in out, (out, r.stderr)

    for sid in made:
        assert rc.kill(sid).status == 204
    assert rc.request("GET", f"/sandboxes/{made[0]}").status == 404

    # the name the certificates must carry: theirs, then one they lack
    _, p2 = cluster.start_router("--node-tls-ca", str(good[0]), "--node-tls-name", NAME, up=2)
    _, p3 = cluster.start_router("--node-tls-ca", str(good[0]), "--node-tls-name", "other.example", up=0)
    assert _health(p3)["nodesKnown"] == 3
    log = next(cluster.tmp.glob(f"router-{p3}.log")).read_text()
    assert "its certificate is refused: hostname mismatch" in log, log


def test_router_and_nodes_mutual_tls(cluster):
    """tls-client-ca on a node and --node-tls-cert on the router: mutual TLS.
    A node asks every client for a certificate and answers every request but
    GET /health with E2B's 403 unless the certificate chains to its CA, is
    valid and is for TLS clients; a router without one finds the node down,
    a router with one uses it (a create, a command, a kill)."""
    import ssl

    pki = cluster.tmp / "pki"
    pki.mkdir()
    ca, other = _ca(pki, "ca"), _ca(pki, "other-ca")
    cert, key = _leaf(pki, "node1", ca, f"IP:{cluster.node_addr(1)}")
    rcert, rkey = _leaf(pki, "router", ca, "DNS:hutch-router")
    # a client certificate needs the TLS client purpose when it names purposes
    server_only = pki / "server-only.pem"
    server_only_key = pki / "server-only.key"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(server_only_key),
             "-subj", "/CN=server-only", "-addext", "extendedKeyUsage=serverAuth",
             "-addext", "basicConstraints=critical,CA:FALSE", "-x509", "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-days", "2", "-out", str(server_only))
    stranger = _leaf(pki, "stranger", other, "DNS:stranger")

    def ctx_with(chain=None):
        c = ssl.create_default_context(cafile=str(ca[0]))
        if chain:
            c.load_cert_chain(str(chain[0]), str(chain[1]))
        return c

    node = cluster.add_node(1, ("--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(ca[0])),
                            tls=ctx_with((rcert, rkey)))
    # straight to the node: the test's own client certificate works
    assert node.request("GET", "/sandboxes").status == 200
    # without one, or with a refused one: 403 in E2B's error shape, /health open
    from serveclient import HttpConn
    for chain, says in ((None, "no client certificate was presented"),
                        (stranger, "its certificate is refused"),
                        ((server_only, server_only_key), "its certificate is refused")):
        with HttpConn(node.host, node.port, timeout=10, tls=ctx_with(chain)) as c:
            assert c.request("GET", "/health").status == 200
            r = c.request("GET", "/sandboxes", headers={"X-API-Key": cluster.key})
        assert r.status == 403, (chain, r.status, r.body)
        body = json.loads(r.body)
        assert body["code"] == 403 and says in body["message"] and "tls-client-ca" in body["message"], body

    # a router that shows no certificate: the node is down, and says why
    _, p0 = cluster.start_router("--node-tls-ca", str(ca[0]), up=0)
    log0 = cluster.tmp / f"router-{p0}.log"
    deadline = time.monotonic() + 15
    while "GET /node answered 403" not in log0.read_text():
        assert time.monotonic() < deadline, f"the router did not log the node's refusal: {log0.read_text()}"
        time.sleep(0.1)
    assert _health(p0)["nodesKnown"] == 1
    # one that shows its own: the node is up and used
    _, port = cluster.start_router("--node-tls-ca", str(ca[0]), "--node-tls-cert", str(rcert),
                                   "--node-tls-key", str(rkey), up=1)
    rc = cluster.client(port)
    sid = rc.create()["sandboxID"]
    sb = rc.request("GET", f"/sandboxes/{sid}").json()
    end, out, _, _ = rc.run(sb, "echo over mutual tls")
    assert end.get("exitCode", 0) == 0 and out == b"over mutual tls\n", (end, out)
    assert rc.kill(sid).status == 204


def test_node_tls_client_ca_is_checked_at_start(hutch_bin, tmp_path):
    """tls-client-ca needs tls-cert and a CA file with a certificate in it."""
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = _ca(pki, "ca")
    cert, key = _leaf(pki, "node", ca, "IP:127.0.0.1")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for args, says in (
        (["--tls-client-ca", str(ca[0])], "tls-client-ca needs tls-cert"),
        (["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(tmp_path / "missing.pem")],
         "missing.pem: No such file or directory"),
        (["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(garbage)], "holds no PEM certificate"),
    ):
        r = subprocess.run([str(hutch_bin), "serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                            str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"), *args],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode != 0 and says in r.stderr, (args, r.returncode, r.stderr)
        assert not (tmp_path / "data").exists(), "a refused start wrote its data dir"


def test_router_tls_settings_are_checked_at_start(hutch_bin, tmp_path):
    """Bad TLS settings stop the router before it listens, saying why."""
    keys = tmp_path / "keys"
    keys.write_text("default e2b_" + "a" * 40 + "\n")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    base = [str(hutch_bin), "router", "--listen", f"127.0.0.1:{free_port()}", "--key-file", str(keys)]
    ca = _ca(tmp_path, "ca")[0]
    for args, says in (
        (["--nodes", "https://127.0.0.1:1", "--node-tls-ca", str(tmp_path / "missing.pem")],
         "missing.pem: No such file or directory"),
        (["--nodes", "https://127.0.0.1:1", "--node-tls-ca", str(garbage)], "no PEM certificate could be read"),
        (["--nodes", "https://127.0.0.1:1", "--node-tls-ca", str(empty)], "no PEM certificate could be read"),
        (["--nodes", "http://127.0.0.1:1", "--node-tls-ca", str(garbage)], "write https://"),
        (["--nodes", "https://127.0.0.1:1"], "give --node-tls-ca"),
        (["--nodes", "127.0.0.1:1", "--node-tls-name", "x.example"], "--node-tls-name is for --node-tls-ca"),
        (["--nodes", "127.0.0.1:1", "--node-tls-cert", str(garbage), "--node-tls-key", str(garbage)],
         "--node-tls-cert is for --node-tls-ca"),
        (["--nodes", "https://127.0.0.1:1", "--node-tls-ca", str(ca), "--node-tls-cert", str(garbage)],
         "go together"),
        (["--nodes", "https://127.0.0.1:1", "--node-tls-ca", str(ca), "--node-tls-cert", str(garbage),
          "--node-tls-key", str(garbage)], f"--node-tls-cert {garbage}"),
    ):
        r = subprocess.run(base + args, capture_output=True, text=True, timeout=10)
        assert r.returncode != 0 and says in r.stderr, (args, r.returncode, r.stderr)
