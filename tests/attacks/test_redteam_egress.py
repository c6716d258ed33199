"""Red team (issue 10, finding 7 variants): what the egress proxy checked must be all it forwards.

The proxy runs here in-process on 127.0.0.1 (its real Server and Handler), in front of a lenient
upstream on loopback that, like many servers and CDNs, keeps reading requests on a connection after
answering one. The client is a plain socket speaking raw HTTP, as a box's program would."""
from __future__ import annotations

import importlib.util
import socket
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def proxy_module():
    spec = importlib.util.spec_from_file_location("egress_proxy_redteam", ROOT / "compose" / "proxy" / "egress_proxy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LenientUpstream:
    """Answers every request head it reads on a connection, and keeps reading: records each head."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.heads: list[bytes] = []
        self.closed = threading.Semaphore(0)  # released when a connection ends: then `heads` is complete
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        try:
            self._read(conn)
        finally:
            self.closed.release()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    self.heads.append(head)
                    length = next((int(field.split(b":", 1)[1]) for field in head.split(b"\r\n")[1:] if field.lower().startswith(b"content-length:")), 0)
                    buf = buf[length:]
                    try:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    except OSError:
                        return
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk

    def hosts(self) -> list[bytes]:
        return [field.split(b":", 1)[1].strip() for h in self.heads for field in h.split(b"\r\n")[1:] if field.lower().startswith(b"host:")]

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def gate(proxy_module):
    upstream = LenientUpstream()
    proxy_module.POLICY = proxy_module.Policy(f"localhost:{upstream.port}", "127.0.0.0/8,::1/128")
    proxy_module.log = lambda **fields: None  # the decisions are not what these tests read
    server = proxy_module.Server(("127.0.0.1", 0), proxy_module.Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], upstream
    server.shutdown()
    server.server_close()
    upstream.close()


def _send(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


def test_redteam_a_pipelined_second_request_never_reaches_upstream(gate):
    """A second request pipelined after an allowed one (its own Host: another site) is not relayed to the upstream connection."""
    port, upstream = gate
    allowed = f"localhost:{upstream.port}".encode()
    first = b"GET http://" + allowed + b"/ HTTP/1.1\r\nHost: " + allowed + b"\r\n\r\n"
    second = b"GET /secret HTTP/1.1\r\nHost: fronted.example\r\n\r\n"
    _send(port, first + second)
    assert upstream.closed.acquire(timeout=30)
    assert upstream.hosts() and all(h == allowed for h in upstream.hosts()), upstream.heads


def test_redteam_a_request_smuggled_in_a_body_under_two_content_lengths_is_refused(gate):
    """Two Content-Length headers (the proxy reads one, the upstream may read the other) are refused, never forwarded."""
    port, upstream = gate
    allowed = f"localhost:{upstream.port}".encode()
    smuggled = b"GET /secret HTTP/1.1\r\nHost: fronted.example\r\n\r\n"
    request = (b"POST http://" + allowed + b"/ HTTP/1.1\r\nHost: " + allowed + b"\r\nContent-Length: 0\r\n"
               b"Content-Length: " + str(len(smuggled)).encode() + b"\r\n\r\n" + smuggled)
    reply = _send(port, request)
    assert b"fronted.example" not in b"".join(upstream.hosts())
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert upstream.heads == []
