# Run inside a code-interpreter sandbox by bench/interp.mjs: the same cell
# sent straight to the default python kernel with jupyter_client (the
# reference the interpreter's /execute is compared with). Prints JSON.
import glob
import json
import sys
import time

from jupyter_client import BlockingKernelClient

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
# the default python context's kernel: the oldest python one (ipykernel
# rewrites its connection file, kernel_name included, so ask each kernel)
kc = None
for f in sorted(glob.glob("/tmp/hutch-interp.*/kernel-*.json"), key=lambda f: __import__("os").stat(f).st_ctime):
    c = BlockingKernelClient()
    c.load_connection_file(f)
    c.start_channels()
    reply = c.kernel_info(reply=True, timeout=10)
    if reply["content"]["language_info"]["name"] == "python":
        kc = c
        break
    c.stop_channels()
c.wait_for_ready(timeout=30)
xs = []
for i in range(n + 10):
    t = time.perf_counter()
    mid = kc.execute("1+1")
    got = idle = False
    while not (got and idle):
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") != mid:
            continue
        if m["msg_type"] == "execute_result":
            got = True
        elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            idle = True
    if i >= 10:
        xs.append((time.perf_counter() - t) * 1000)
kc.stop_channels()
xs.sort()
print(json.dumps({"p50": xs[len(xs) // 2], "p99": xs[int(len(xs) * 0.99)]}))
