# The PNG cell of bench/interp.mjs sent to hutch-interp from inside the
# sandbox (no daemon, no SDK): POST /execute, the whole response read.
# Prints {"p50": ms, "p99": ms}.
import http.client
import json
import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
body = json.dumps({"code": "display(Image(data=png))"})
ts = []
for _ in range(n):
    c = http.client.HTTPConnection("127.0.0.1", 49999)
    t = time.perf_counter()
    c.request("POST", "/execute", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse().read()
    ts.append((time.perf_counter() - t) * 1000)
    c.close()
    if b'"png"' not in r:
        sys.exit("no png in the response")
ts.sort()
print(json.dumps({"p50": ts[len(ts) // 2], "p99": ts[min(len(ts) - 1, int(len(ts) * 0.99))]}))
