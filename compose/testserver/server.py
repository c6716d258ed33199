"""A test server for the egress tests: answers `hello from NAME`, and /big with 1 MiB.

`server.py tls NAME` serves HTTPS on 8443 with /certs/server.pem and /certs/server.key (made by the
test, signed by its own CA) and records every request it receives, headers and body, as one JSON
line on stdout: what the test reads to see what really arrived. It answers whether the
Authorization header was `Bearer $EXPECT_TOKEN` (never the header itself), except /echo, which
reflects every header it got (a server that echoes: the gate must not let the secret back out), and
/echo/chunked, /echo/gzip and /echo/b64, the same echo chunked, compressed and base64-encoded, and
/redirect, which sends the client to another host. /linger (plain) answers in full, then keeps the
connection open for LINGER_S before closing it: the gate's record of it comes after the client is done.
"""

import hmac
import json
import os
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TLS = len(sys.argv) > 1 and sys.argv[1] == "tls"
LINGER_S = 0.5
NAME = (sys.argv[2] if TLS else sys.argv[1]) if len(sys.argv) > 1 + TLS else "server"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1" if TLS else "HTTP/1.0"

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if TLS:
            print(
                json.dumps(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": list(self.headers.items()),
                        "body": body.decode("latin-1"),
                    }
                ),
                flush=True,
            )
        status, extra = 200, []
        if self.path == "/big":
            out = b"x" * (1 << 20)
        elif TLS and self.path == "/echo":
            out = json.dumps(list(self.headers.items())).encode()
        elif TLS and self.path in ("/echo/chunked", "/echo/gzip", "/echo/b64"):
            return self._echo_as(self.path.rsplit("/", 1)[1], json.dumps(list(self.headers.items())).encode())
        elif TLS and self.path == "/redirect":
            status, out, extra = 302, b"moved\n", [("Location", "https://denied.test:8443/steal")]
        elif TLS:
            expected = "Bearer " + os.environ.get("EXPECT_TOKEN", "")
            ok = hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected.encode())
            out = json.dumps({"hello": NAME, "path": self.path, "authorized": ok}).encode()
        else:
            out = f"hello from {NAME}\n".encode()
        self.send_response(status)
        for key, value in extra:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(out)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(out)
        self.close_connection = True
        if self.path == "/linger":
            self.wfile.flush()
            time.sleep(LINGER_S)

    def _echo_as(self, kind, echo):
        """The echo in 16-byte chunks (a chunk-size line lands inside an echoed token, wherever the
        client's padding puts it), gzipped although the client asked for identity, or base64."""
        self.send_response(200)
        if kind == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            body = (
                b"".join(b"%x\r\n%s\r\n" % (len(echo[i : i + 16]), echo[i : i + 16]) for i in range(0, len(echo), 16))
                + b"0\r\n\r\n"
            )
        else:
            if kind == "gzip":
                import gzip

                body = gzip.compress(echo)
                self.send_header("Content-Encoding", "gzip")
            else:
                import base64

                body = base64.b64encode(echo)
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    def log_message(self, *args):
        pass


if TLS:
    server = ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain("/certs/server.pem", "/certs/server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
else:
    ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
