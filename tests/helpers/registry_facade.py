"""A registry facade for the pull tests: a small HTTP server in front of a real
`docker-registry`, run inside the test's network namespace.

    python3 registry_facade.py LISTEN_PORT UPSTREAM_URL STATE_DIR

It forwards /v2/ GETs to UPSTREAM_URL and, as STATE_DIR/mode says (read on
every request, so a test switches it without a restart):

    ok        forward as is, behind a bearer-token challenge (the token flow)
    corrupt   blob bodies with one byte flipped (a digest that lies)
    oversize  blob bodies with 1 MiB more than the descriptor's size
    slow      blob bodies 16 KiB at a time, 0.2 s apart (for kill -9 mid-pull)
    hugemanifest  a 5 MiB manifest
    badtoken  the token endpoint answers a token with CR LF in it
    redirect  blobs answered 307 to 127.0.0.2 on LISTEN_PORT+1, another
              "host" (the blob storage), which logs the Authorization header
              it got to STATE_DIR/storage-auth.log

The token endpoint /token hands out STATE_DIR/token's contents; any
/v2/ request without "Authorization: Bearer <that>" gets a 401 with the
challenge. Every Authorization header the facade sees is appended to
STATE_DIR/facade-auth.log, every Range header to STATE_DIR/ranges.log.
"""

import http.server
import os
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.request

PORT = int(sys.argv[1])
UPSTREAM = sys.argv[2].rstrip("/")
STATE = sys.argv[3]


def state(name, default=""):
    try:
        with open(os.path.join(STATE, name)) as f:
            return f.read().strip()
    except OSError:
        return default


def log(name, line):
    with open(os.path.join(STATE, name), "a") as f:
        f.write(line + "\n")


def fetch(path, headers):
    req = urllib.request.Request(UPSTREAM + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Facade(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        if auth:
            log("facade-auth.log", auth)
        token = state("token", "t0ken")
        if self.path.startswith("/token"):
            if state("mode", "ok") == "badtoken":   # a header injection attempt
                body = b'{"token": "abc\\r\\nX-Injected: 1"}'
                return self.send(200, body, [("Content-Type", "application/json")])
            body = ('{"token": "%s", "expires_in": 300}' % token).encode()
            return self.send(200, body, [("Content-Type", "application/json")])
        if not self.path.startswith("/v2/"):
            return self.send(404)
        if auth != "Bearer " + token:
            repo = self.path[4:].split("/manifests/")[0].split("/blobs/")[0]
            chal = ('Bearer realm="http://127.0.0.1:%d/token",service="facade",'
                    'scope="repository:%s:pull"' % (PORT, repo))
            return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                             [("WWW-Authenticate", chal), ("Content-Type", "application/json")])
        mode = state("mode", "ok")
        is_blob = "/blobs/" in self.path
        if mode == "hugemanifest" and "/manifests/" in self.path:
            body = b'{"schemaVersion": 2, "pad": "' + b"x" * (5 << 20) + b'"}'
            return self.send(200, body, [("Content-Type", "application/vnd.oci.image.manifest.v1+json")])
        if is_blob and mode == "redirect":
            digest = self.path.rsplit("/", 1)[1]
            loc = "http://127.0.0.2:%d%s?signed=1&d=%s" % (PORT + 1, self.path, digest)
            return self.send(307, b"", [("Location", loc)])
        hdrs = {"Accept": self.headers.get("Accept", "*/*")}
        if self.headers.get("Range"):
            hdrs["Range"] = self.headers["Range"]   # a resumed download
            log("ranges.log", self.headers["Range"])
        code, rh, body = fetch(self.path, hdrs)
        out = [(k, v) for k, v in rh.items()
               if k.lower() in ("content-type", "docker-content-digest", "content-range")]
        if not is_blob or code not in (200, 206):
            return self.send(code, body, out)
        if mode == "corrupt":
            body = bytes([body[0] ^ 1]) + body[1:]
        elif mode == "oversize":
            body = body + b"\0" * (1 << 20)
        elif mode == "slow":
            self.send_response(code)
            for k, v in out:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 16384):
                self.wfile.write(body[i:i + 16384])
                self.wfile.flush()
                time.sleep(0.2)
            return None
        return self.send(code, body, out)

    do_HEAD = do_GET


class Storage(http.server.BaseHTTPRequestHandler):
    """The other host a blob redirect points to."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        log("storage-auth.log", "auth=" + self.headers.get("Authorization", "<none>"))
        path = self.path.split("?")[0]
        code, rh, body = fetch(path, {})  # the upstream is anonymous
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    a = Server(("127.0.0.1", PORT), Facade)
    b = Server(("127.0.0.2", PORT + 1), Storage)
    threading.Thread(target=b.serve_forever, daemon=True).start()
    with open(os.path.join(STATE, "ready"), "w") as f:
        f.write("1")
    a.serve_forever()


if __name__ == "__main__":
    main()
