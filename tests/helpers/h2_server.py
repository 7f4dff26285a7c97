"""An HTTP/2 server (h2c: prior knowledge and Upgrade: h2c) that runs
inside a sandbox, for tests/integration/test_ingress_h2.py. Built on Debian's
python3-h2 (the host template's /usr has it). Paths:

  GET  /hello     200 "hello h2 <:authority>"
  POST /echo      the request body back, sent as flow control allows
  GET  /big?n=N   N bytes of a repeating pattern
  POST /grpc      gRPC-shaped: headers, the body back, trailers grpc-status 0
  GET  /slow      answers after 1 s (concurrent streams overlap)

Every request's :authority and path are appended to the log file (argv[2]).
"""
import select
import socket
import sys
import threading
import time

import h2.config
import h2.connection
import h2.events

PORT = int(sys.argv[1])
LOG = sys.argv[2]
lock = threading.Lock()


def log(line):
    with lock, open(LOG, "a") as f:
        f.write(line + "\n")


class Conn:
    def __init__(self, sock, upgrade_req=None):
        self.sock = sock
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.reqs = {}      # stream -> (headers, bytearray)
        self.pending = {}   # stream -> [bytes left, trailers or None]
        self.timers = []    # (due, stream)
        self.upgrade_req = upgrade_req

    def send_out(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def respond(self, sid, status, body, ctype="text/plain", trailers=None):
        hdrs = [(":status", str(status)), ("content-type", ctype)]
        if trailers is None:
            hdrs.append(("content-length", str(len(body))))
        self.h2.send_headers(sid, hdrs, end_stream=False)
        self.pending[sid] = [bytes(body), trailers]
        self.pump()

    def pump(self):
        for sid in list(self.pending):
            body, trailers = self.pending[sid]
            while body:
                n = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(body))
                if n <= 0:
                    break
                self.h2.send_data(sid, body[:n])
                body = body[n:]
            self.pending[sid][0] = body
            if not body:
                if trailers:
                    self.h2.send_headers(sid, trailers, end_stream=True)
                else:
                    self.h2.end_stream(sid)
                del self.pending[sid]
        self.send_out()

    def handle(self, sid):
        headers, body = self.reqs.pop(sid)
        h = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
             for k, v in headers}
        path, auth = h.get(":path", ""), h.get(":authority", h.get("host", ""))
        log(f"{auth} {path} {len(body)}")
        if path == "/hello":
            self.respond(sid, 200, f"hello h2 {auth}".encode())
        elif path == "/echo":
            self.respond(sid, 200, body, "application/octet-stream")
        elif path.startswith("/big"):
            n = int(path.split("=", 1)[1])
            self.respond(sid, 200, (b"0123456789abcdef" * (n // 16 + 1))[:n], "application/octet-stream")
        elif path == "/grpc":
            self.respond(sid, 200, body, "application/grpc",
                         trailers=[("grpc-status", "0"), ("grpc-message", "ok")])
        elif path == "/slow":
            self.timers.append((time.monotonic() + 1.0, sid))
        else:
            self.respond(sid, 404, b"not found")

    def run(self):
        if self.upgrade_req is not None:
            settings, path, auth = self.upgrade_req
            self.sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
            self.h2.initiate_upgrade_connection(settings)
            self.reqs[1] = ([(":path", path), (":authority", auth)], bytearray())
            self.send_out()
            self.handle(1)
        else:
            self.h2.initiate_connection()
            self.send_out()
        # blocking sends (a timeout on the socket would cut a sendall to a
        # slow reader, such as gvisor's connector); the timers' 0.1 s
        # tick comes from select
        self.sock.settimeout(None)
        while True:
            now = time.monotonic()
            for due, sid in [t for t in self.timers if t[0] <= now]:
                self.timers.remove((due, sid))
                self.respond(sid, 200, b"slow done")
            if not select.select([self.sock], [], [], 0.1)[0]:
                continue
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            for ev in self.h2.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    self.reqs[ev.stream_id] = (ev.headers, bytearray())
                elif isinstance(ev, h2.events.DataReceived):
                    self.reqs[ev.stream_id][1].extend(ev.data)
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    if ev.stream_id in self.reqs:
                        self.handle(ev.stream_id)
                elif isinstance(ev, h2.events.WindowUpdated):
                    pass
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self.send_out()
                    return
            self.pump()


def serve(sock):
    try:
        # HTTP/1.1 "Upgrade: h2c" or the prior-knowledge preface
        sock.settimeout(10)
        first = sock.recv(65536, socket.MSG_PEEK)
        if first.startswith(b"PRI * HTTP/2.0"):
            Conn(sock).run()
            return
        buf = b""
        while b"\r\n\r\n" not in buf:
            b = sock.recv(65536)
            if not b:
                return
            buf += b
        head = buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        path = head[0].split(" ")[1]
        fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:])}
        log(f"h1 {fields.get('host', '')} {path} upgrade={fields.get('upgrade', '')}")
        if fields.get("upgrade", "").lower() == "h2c" and "http2-settings" in fields:
            Conn(sock, (fields["http2-settings"].encode(), path, fields.get("host", ""))).run()
        else:
            body = b"plain http/1.1\n"
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except Exception as e:  # noqa: BLE001 - logged for the test to read
        log(f"error {e!r}")
    finally:
        sock.close()


def main():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", PORT))
    ls.listen(64)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


main()
