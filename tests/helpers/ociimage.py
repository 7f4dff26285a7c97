# SPDX-License-Identifier: Apache-2.0
"""Build OCI image layouts and `docker save` archives for the tests, offline,
with Python's tarfile: layers are lists of entries, so a test can make any
image it needs, hostile ones included."""
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile

try:
    import zstandard  # type: ignore
except ImportError:  # pragma: no cover
    zstandard = None


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def file_entry(name, data=b"", mode=0o644, uid=0, gid=0, **kw):
    return dict(type="file", name=name, data=data, mode=mode, uid=uid, gid=gid, **kw)


def dir_entry(name, mode=0o755, uid=0, gid=0, **kw):
    return dict(type="dir", name=name, mode=mode, uid=uid, gid=gid, **kw)


def symlink_entry(name, target, **kw):
    return dict(type="symlink", name=name, target=target, **kw)


def hardlink_entry(name, target, **kw):
    return dict(type="hardlink", name=name, target=target, **kw)


def make_tar(entries, fmt=tarfile.PAX_FORMAT):
    """A layer tar (uncompressed bytes) from entry dicts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.mode = e.get("mode", 0o644)
            ti.uid = e.get("uid", 0)
            ti.gid = e.get("gid", 0)
            ti.mtime = 1700000000
            if e.get("pax"):
                ti.pax_headers = e["pax"]
            data = None
            kind = e["type"]
            if kind == "file":
                data = e.get("data", b"")
                ti.size = len(data)
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = e["target"]
            elif kind == "hardlink":
                ti.type = tarfile.LNKTYPE
                ti.linkname = e["target"]
            elif kind == "chr":
                ti.type = tarfile.CHRTYPE
                ti.devmajor, ti.devminor = e.get("dev", (1, 3))
            elif kind == "fifo":
                ti.type = tarfile.FIFOTYPE
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def compress(tar, kind):
    if kind == "gzip":
        return gzip.compress(tar, compresslevel=1, mtime=0)
    if kind == "zstd":
        if zstandard is None:
            import subprocess
            return subprocess.run(["zstd", "-q", "-c"], input=tar, stdout=subprocess.PIPE, check=True).stdout
        return zstandard.ZstdCompressor().compress(tar)
    return tar


MEDIA = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    None: "application/vnd.oci.image.layer.v1.tar",
}


def image_config(diff_ids, env=None, workdir=None, user=None, cmd=None, arch="amd64"):
    cfg = {}
    if env is not None:
        cfg["Env"] = env
    if workdir is not None:
        cfg["WorkingDir"] = workdir
    if user is not None:
        cfg["User"] = user
    if cmd is not None:
        cfg["Cmd"] = cmd
    return {
        "architecture": arch,
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }


def write_oci_layout(path, layers, compression="gzip", config_override=None, manifest_hook=None,
                     ref="test:latest", **cfgkw):
    """layers: list of tar bytes (bottom first). Returns the manifest dict."""
    if os.path.exists(path):
        shutil.rmtree(path)
    blobs = os.path.join(path, "blobs", "sha256")
    os.makedirs(blobs)

    def put(b):
        d = sha(b)
        with open(os.path.join(blobs, d[7:]), "wb") as f:
            f.write(b)
        return d

    descs, diff_ids = [], []
    for tar in layers:
        comp = compress(tar, compression)
        descs.append({"mediaType": MEDIA[compression], "digest": put(comp), "size": len(comp)})
        diff_ids.append(sha(tar))
    cfg = config_override if config_override is not None else image_config(diff_ids, **cfgkw)
    cfgb = json.dumps(cfg).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(cfgb),
                   "size": len(cfgb)},
        "layers": descs,
    }
    if manifest_hook:
        manifest_hook(manifest)
    mb = json.dumps(manifest).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(mb),
                       "size": len(mb), "annotations": {"org.opencontainers.image.ref.name": ref},
                       "platform": {"os": "linux", "architecture": "amd64"}}],
    }
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(path, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return manifest


def tar_dir(src, dst):
    """A tar of a directory's contents (an OCI layout as a tar)."""
    with tarfile.open(dst, "w") as t:
        for name in sorted(os.listdir(src)):
            t.add(os.path.join(src, name), arcname=name)


def write_docker_save(path, layers, tag="test:latest", **cfgkw):
    """A `docker save` archive (legacy format: <id>/layer.tar, <config>.json, manifest.json)."""
    diff_ids = [sha(t) for t in layers]
    cfgb = json.dumps(image_config(diff_ids, **cfgkw)).encode()
    cfgname = sha(cfgb)[7:] + ".json"
    names = []
    with tarfile.open(path, "w") as t:
        def add(name, data):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
        add(cfgname, cfgb)
        for i, tar in enumerate(layers):
            n = "%064x/layer.tar" % (i + 1)
            add(n, tar)
            names.append(n)
        add("manifest.json", json.dumps([{"Config": cfgname, "RepoTags": [tag], "Layers": names}]).encode())
    return diff_ids
