"""A server for the ingress edge-case tests, run inside a sandbox: it reads
one request per connection and answers with the canned bytes its path names
(some of them broken on purpose), then closes. Every request line and head
it read goes to the log file, so a test can see what reached the sandbox.

    python3 ingress_raw_server.py PORT LOG
"""
import socket
import sys
import threading

RESPONSES = {
    "/ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "/two-cl": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "/cl-te": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "/bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
    "/fold": b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nhi",
    "/nul": b"HTTP/1.1 200 OK\r\nX-A: a\0b\r\nContent-Length: 2\r\n\r\nhi",
    "/garbage": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    # bytes after the body: never a second response for the client
    "/extra": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
    "/chunk-bad": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n",
    "/interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "/close": b"HTTP/1.1 200 OK\r\nX-Mode: close\r\n\r\nuntil-close",
    "/hop": b"HTTP/1.1 200 OK\r\nConnection: X-Secret, close\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\nok",
    "/chunked-trailer": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
}

log_lock = threading.Lock()


def serve(conn, log):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            b = conn.recv(65536)
            if not b:
                return
            data += b
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        cl = 0
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                cl = int(v.strip())
        while len(rest) < cl:
            b = conn.recv(65536)
            if not b:
                break
            rest += b
        with log_lock:
            with open(log, "ab") as f:
                f.write(head + b"\r\n\r\n" + rest + b"\n=====\n")
        path = lines[0].split(b" ")[1].decode()
        conn.sendall(RESPONSES.get(path.split("?")[0], RESPONSES["/ok"]))
    finally:
        conn.close()


s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c, sys.argv[2]), daemon=True).start()
