"""A sandbox's writable layer is the tenant's, and it comes back as the root
of later sandboxes (a snapshot restored, a fork, a built template). Until
pivot_root the sandbox's set-up runs with the host's tree as its mount
namespace's root, so a link the tenant planted at a path the set-up writes
(/run: the boot id) must be resolved inside the sandbox's root, never on the
host: the host directory it names stays untouched, and a link that stays
inside the root still works."""

from __future__ import annotations

import os
import secrets
import shutil

from serveclient import ServeDaemon


def test_a_planted_run_link_never_reaches_the_host(sandboxed_hutch, tmp_path):
    tmp_path.chmod(0o755)
    # a host directory any uid may write, as /tmp is: the worst case
    target = f"/tmp/hutch-planted-{secrets.token_hex(4)}"
    os.mkdir(target)
    os.chmod(target, 0o1777)
    d = ServeDaemon(sandboxed_hutch, tmp_path / "data", ["--pool-size", "0"])
    d.start()
    try:
        sb = d.create()
        end, out, err, _ = d.run(sb, f"rm -rf /run && ln -s {target} /run && readlink /run", user="root")
        assert out == f"{target}\n".encode(), (end, out, err)
        r = d.request("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})
        assert r.status == 201, r
        snap = r.json()["snapshotID"]
        # restored: the link leads nowhere inside the root, the create fails
        # with a reason, and the host directory is as it was
        r = d.request("POST", "/v2/sandboxes", {"templateID": snap})
        assert r.status >= 400 and "/run" in r.json()["message"], r
        assert os.listdir(target) == [], os.listdir(target)
        # the same as a fork (its answer lists a failure per copy)
        r = d.request("POST", f"/sandboxes/{sb['sandboxID']}/fork", {})
        assert r.status >= 400 or b'"error"' in r.body, r
        assert os.listdir(target) == [], os.listdir(target)
        # a link that stays inside the root is followed there, as a program
        # inside would see it: the boot id lands in the sandbox's own /tmp
        end, out, err, _ = d.run(sb, f"mkdir -p {target} && echo mine > {target}/own", user="root")
        assert end.get("exitCode", 0) == 0, err
        r = d.request("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})
        assert r.status == 201, r
        r = d.request("POST", "/v2/sandboxes", {"templateID": r.json()["snapshotID"]})
        assert r.status == 201, r
        sb2 = r.json()
        d.created[sb2["sandboxID"]] = d.key  # made by a raw request: stop() deletes it too
        end, out, err, _ = d.run(sb2, f"cat {target}/own; test -s {target}/hutch/boot_id && echo has-id; "
                                      "cat /proc/sys/kernel/random/boot_id | wc -c", user="root")
        assert out == b"mine\nhas-id\n37\n", (out, err)
        assert os.listdir(target) == [], os.listdir(target)
    finally:
        d.stop()
        shutil.rmtree(target, ignore_errors=True)
