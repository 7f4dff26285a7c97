"""A token server for docker-registry's `auth.token` (the bearer flow of the
distribution spec), for the pull tests, run inside the test's netns:

    python3 registry_token.py PORT KEY_PEM CERT_PEM STATE_DIR

GET /token?service=S&scope=repository:NAME:pull answers {"token": JWT}, an
ES256 JWT whose header carries the signing certificate (x5c), which the
registry trusts through its `rootcertbundle`. Anonymous requests get a
token for pull; every request's query and Authorization header (present
or not) is appended to STATE_DIR/token-requests.log.
"""

import base64
import http.server
import json
import os
import socketserver
import sys
import time
import urllib.parse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

PORT = int(sys.argv[1])
with open(sys.argv[2], "rb") as f:
    KEY = serialization.load_pem_private_key(f.read(), None)
with open(sys.argv[3], "rb") as f:
    CERT = x509.load_pem_x509_certificate(f.read())
STATE = sys.argv[4]
ISSUER = "hutch-test-issuer"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def jwt(claims):
    header = {"typ": "JWT", "alg": "ES256",
              "x5c": [base64.b64encode(CERT.public_bytes(serialization.Encoding.DER)).decode()]}
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    der = KEY.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return signing_input + "." + b64(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


class Token(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(u.query)
        with open(os.path.join(STATE, "token-requests.log"), "a") as f:
            f.write(json.dumps({"query": u.query, "auth": self.headers.get("Authorization")}) + "\n")
        access = []
        for scope in q.get("scope", []):
            parts = scope.split(":")
            if len(parts) == 3 and parts[0] == "repository":
                access.append({"type": "repository", "name": parts[1], "actions": ["pull"]})
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": "", "aud": q.get("service", [""])[0], "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(), "access": access}
        body = json.dumps({"token": jwt(claims), "expires_in": 300}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", PORT), Token).serve_forever()
