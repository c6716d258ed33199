"""The egress gate's added latency per request (issue 29), in one run, on loopback:

  direct       client -> HTTPS API                                  (the baseline)
  passed       client -> gate (CONNECT, SNI checked, bytes relayed) -> API
  intercepted  client -> gate (TLS ends, request checked, credential set, TLS re-originated, verified) -> API

Each request is a fresh connection with its own TLS handshake (the gate forwards one request per
connection, so that is what a box pays), modes interleaved round by round so drift hits all three.
The gate is compose/proxy/egress_gate itself, served twice (once with a credential rule for the
API's host, once without), with the session CA made by orchestrator/sandbox/egress_tls.py.
Nothing leaves 127.0.0.1.

    python -m bench.egress [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from orchestrator.sandbox.egress_tls import SessionCA

ROOT = Path(__file__).resolve().parents[1]


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


def _api(world: SessionCA, tmp: Path) -> ThreadingHTTPServer:
    pem = tmp / "api.pem"
    pem.write_text(world.leaves["localhost"]["cert"] + world.leaves["localhost"]["key"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pem))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _gate(api_port: int, world: SessionCA, gate_ca: SessionCA | None) -> int:
    """The gate's own package, in-process, configured as its environment would configure it."""
    if str(ROOT / "compose" / "proxy") not in sys.path:
        sys.path.insert(0, str(ROOT / "compose" / "proxy"))
    from egress_gate import audit, handler, rules, settings, tls

    policy = rules.Policy(
        "", "127.0.0.0/8", json.dumps([{"action": "allow", "host": "localhost", "port": api_port}]), "bench"
    )
    gate = settings.Settings(
        policy, audit=audit.AuditLog(sink=lambda fields: None), upstream_tls=tls.upstream_context(world.ca_pem)
    )
    if gate_ca is not None:
        gate.credentials = [
            rules.Credential(
                {"host": "localhost", "port": api_port, "header": "Authorization", "value": "Bearer bench-token"}
            )
        ]
        gate.intercept = tls.intercept_contexts(json.dumps(gate_ca.leaves))
    server = handler.Server(("127.0.0.1", 0), gate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def _request(api_port: int, trust: str, gate_port: int | None) -> float:
    ctx = ssl.create_default_context(cadata=trust)
    started = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", gate_port or api_port), timeout=10)
    with sock:
        if gate_port is not None:
            sock.sendall(f"CONNECT localhost:{api_port} HTTP/1.1\r\nHost: localhost:{api_port}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(1)
                if not chunk:
                    raise RuntimeError("the gate closed the tunnel")
                head += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
        with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(f"GET /repos/x HTTP/1.1\r\nHost: localhost:{api_port}\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while chunk := tls.recv(65536):
                reply += chunk
    if not reply.startswith(b"HTTP/1.1 200") and not reply.startswith(b"HTTP/1.0 200"):
        raise RuntimeError(reply[:200].decode(errors="replace"))
    return (time.perf_counter() - started) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(requests: int) -> dict[str, dict[str, float]]:
    world, gate_ca = SessionCA(["localhost"]), SessionCA(["localhost"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            api = _api(world, Path(tmp))
            port = api.server_address[1]
            passed_port = _gate(port, world, None)
            intercept_port = _gate(port, world, gate_ca)
            modes = {
                "direct": (world.ca_pem, None),
                "passed": (world.ca_pem, passed_port),
                "intercepted": (gate_ca.ca_pem, intercept_port),
            }
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            for trust, gate in modes.values():  # warm-up
                for _ in range(5):
                    _request(port, trust, gate)
            for _ in range(requests):
                for mode, (trust, gate) in modes.items():
                    times[mode].append(_request(port, trust, gate))
            api.shutdown()
    finally:
        world.close()
        gate_ca.close()
    base = statistics.median(times["direct"])
    return {
        mode: {"p50_ms": statistics.median(v), "p90_ms": pct(v, 0.9), "added_p50_ms": statistics.median(v) - base}
        for mode, v in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    result = run(args.requests)
    print(f"egress gate, {args.requests} HTTPS requests per mode, each a new connection + TLS handshake, loopback")
    print(f"{'mode':<12} {'p50 ms':>8} {'p90 ms':>8} {'added p50 ms':>13}")
    for mode, row in result.items():
        print(f"{mode:<12} {row['p50_ms']:8.2f} {row['p90_ms']:8.2f} {row['added_p50_ms']:13.2f}")


if __name__ == "__main__":
    main()
