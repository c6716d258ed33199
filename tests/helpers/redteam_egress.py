"""What tests/attacks/test_redteam_egress.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.sandbox.egress_tls import SessionCA

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def proxy_module():
    """The gate's package, imported as its container imports it (egress_proxy.py puts compose/proxy on sys.path)."""
    if str(ROOT / "compose" / "proxy") not in sys.path:
        sys.path.insert(0, str(ROOT / "compose" / "proxy"))
    from egress_gate import audit, handler, rules, settings, tls

    return SimpleNamespace(
        Policy=rules.Policy,
        Credential=rules.Credential,
        Settings=settings.Settings,
        Server=handler.Server,
        AuditLog=audit.AuditLog,
        tls=tls,
    )


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
                    length = next(
                        (
                            int(field.split(b":", 1)[1])
                            for field in head.split(b"\r\n")[1:]
                            if field.lower().startswith(b"content-length:")
                        ),
                        0,
                    )
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
        return [
            field.split(b":", 1)[1].strip()
            for h in self.heads
            for field in h.split(b"\r\n")[1:]
            if field.lower().startswith(b"host:")
        ]

    def close(self) -> None:
        self.listener.close()


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


TOKEN = "ghp_" + secrets.token_hex(20)


PLACEHOLDER = "oa-egress-placeholder-GITHUB_TOKEN"


@pytest.fixture(scope="module")
def cas():
    world, gate_ca = SessionCA(["localhost"]), SessionCA(["localhost"])
    yield world, gate_ca
    world.close()
    gate_ca.close()


def _gate_with(proxy_module, rules: list[dict], upstream_ca: str, leaves: dict, port: int, prefix: str = "/"):
    records: list[dict] = []
    credentials = [
        proxy_module.Credential(
            {
                "host": "localhost",
                "port": port,
                "path_prefix": prefix,
                "header": "Authorization",
                "value": f"Bearer {TOKEN}",
                "secrets": [TOKEN],
            }
        )
    ]
    settings = proxy_module.Settings(
        proxy_module.Policy("", "127.0.0.0/8", json.dumps(rules), "test rule set"),
        credentials,
        proxy_module.tls.intercept_contexts(json.dumps(leaves)),
        proxy_module.tls.upstream_context(upstream_ca),
        audit=proxy_module.AuditLog(sink=records.append),
    )
    server = proxy_module.Server(("127.0.0.1", 0), settings)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, records


def _tls_exchange(
    gate_port: int,
    upstream_port: int,
    ca_pem: str,
    request: bytes,
    sni: str | None = "localhost",
    connect_host: str = "localhost",
    alpn: list[str] | None = None,
) -> tuple[bytes, bytes]:
    """As a box's client: CONNECT through the gate, TLS (trusting only the session CA), one raw request.
    Returns (the CONNECT answer, what came back inside TLS)."""
    with socket.create_connection(("127.0.0.1", gate_port), timeout=10) as sock:
        sock.sendall(
            f"CONNECT {connect_host}:{upstream_port} HTTP/1.1\r\nHost: {connect_host}:{upstream_port}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                return head, b""
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            return head, b""
        ctx = ssl.create_default_context(cadata=ca_pem)
        if sni is None:
            ctx.check_hostname = False
        if alpn:
            ctx.set_alpn_protocols(alpn)
        try:
            tls = ctx.wrap_socket(sock, server_hostname=sni)
        except (ssl.SSLError, OSError) as err:
            return head, f"handshake failed: {err}".encode()
        with tls:
            if alpn:
                assert tls.selected_alpn_protocol() in (None, "http/1.1")
            tls.sendall(request)
            out = b""
            try:
                while chunk := tls.recv(65536):
                    out += chunk
            except (OSError, ssl.SSLError):
                pass
            return head, out


def _get(path: str, *extra: str, method: str = "GET", body: bytes = b"", port: int = 0) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: localhost:{port}", f"Authorization: Bearer {PLACEHOLDER}", *extra]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else 0
