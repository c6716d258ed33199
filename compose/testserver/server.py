"""A test HTTP server for the egress tests: answers `hello from NAME`, and /big with 1 MiB."""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = sys.argv[1] if len(sys.argv) > 1 else "server"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = b"x" * (1 << 20) if self.path == "/big" else f"hello from {NAME}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
