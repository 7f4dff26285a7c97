# SPDX-License-Identifier: Apache-2.0
"""`python3 busybox_image.py OUT.tar`: a `docker save` archive of a small
image built from the host's busybox-static (every applet, a /bin/bash that
is its sh, root and user accounts, an Env), for the template-build tests."""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ociimage as oi  # noqa: E402

bb = Path("/bin/busybox").read_bytes()
applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
ents = [oi.dir_entry("bin"), oi.file_entry("bin/busybox", bb, mode=0o755)]
for a in sorted(set(applets) - {"busybox"}):
    ents.append(oi.symlink_entry(f"bin/{a}", "busybox"))
ents += [
    oi.file_entry("bin/bash", b"#!/bin/sh\nexec /bin/sh \"$@\"\n", mode=0o755),
    oi.dir_entry("etc"),
    oi.file_entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"),
    oi.file_entry("etc/group", b"root:x:0:\nuser:x:1000:\n"),
    oi.dir_entry("root", mode=0o700),
    oi.dir_entry("home"),
    oi.dir_entry("home/user", uid=1000, gid=1000),
    oi.dir_entry("tmp", mode=0o1777),
]
oi.write_docker_save(sys.argv[1], [oi.make_tar(ents)], tag="bb:latest",
                     env=["PATH=/bin", "IMAGE_VAR=from-the-image"])
