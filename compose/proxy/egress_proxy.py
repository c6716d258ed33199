"""The egress gate: a small HTTP forward and CONNECT proxy with a host allow-list.

Standard library only; runs in its own container, the only door out of a sandbox's internal
network. It refuses by default, refuses IP literals, and refuses private, loopback and link-local
destinations after resolving the name itself (and then connects to the address it checked, so
DNS rebinding cannot slip past), unless an admin-level CIDR allows them. Every request, allowed
or denied, is one JSON line on stdout.

Environment:
  OA_EGRESS_ALLOW        comma list of hosts: exact (pypi.org), suffix (*.pythonhosted.org), optional :port
  OA_EGRESS_ALLOW_CIDRS  comma list of CIDRs an admin allows (on-premises mirrors, test servers)
  OA_EGRESS_PORT         listening port (3128)
  OA_EGRESS_MAX_REQUEST_BYTES / OA_EGRESS_MAX_RESPONSE_BYTES  caps (10 MiB / 256 MiB)
"""
from __future__ import annotations

import ipaddress
import json
import os
import select
import socket
import socketserver
import sys
import threading
import time
from urllib.parse import urlsplit

DEFAULT_PORTS = {80, 443}
HEADER_LIMIT = 64 * 1024
IDLE_TIMEOUT_S = 60
_log_lock = threading.Lock()


class Rule:
    def __init__(self, text: str) -> None:
        host, _, port = text.strip().lower().rpartition(":") if text.count(":") == 1 else (text.strip().lower(), "", "")
        if not host:
            host, port = port, ""
        self.host = host
        self.port = int(port) if port else None

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.port is None and port not in DEFAULT_PORTS:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host


class Policy:
    def __init__(self, allow: str, cidrs: str) -> None:
        self.rules = [Rule(r) for r in allow.split(",") if r.strip()]
        self.cidrs = [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs.split(",") if c.strip()]

    def host_allowed(self, host: str, port: int) -> bool:
        return any(rule.matches(host.lower().rstrip("."), port) for rule in self.rules)

    def address_allowed(self, ip: str) -> tuple[bool, str]:
        addr = ipaddress.ip_address(ip)
        if any(addr in net for net in self.cidrs):
            return True, "admin-allowed network"
        if not addr.is_global or addr.is_multicast:
            return False, f"{ip} is a private, loopback, link-local or reserved address"
        return True, "public address"


POLICY = Policy(os.environ.get("OA_EGRESS_ALLOW", ""), os.environ.get("OA_EGRESS_ALLOW_CIDRS", ""))
MAX_REQUEST = int(os.environ.get("OA_EGRESS_MAX_REQUEST_BYTES", 10 << 20))
MAX_RESPONSE = int(os.environ.get("OA_EGRESS_MAX_RESPONSE_BYTES", 256 << 20))


_seq = 0


def log(**fields) -> None:
    """One JSON line; `seq` lets a reader that fetches overlapping windows drop what it has seen."""
    global _seq
    with _log_lock:
        _seq += 1
        sys.stdout.write(json.dumps({"ts": round(time.time(), 3), "seq": _seq, "event": "egress", **fields}) + "\n")
        sys.stdout.flush()


class Denied(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def decide(host: str, port: int) -> str:
    """The checked address to connect to, or Denied."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        literal = True
    except ValueError:
        literal = False
    if literal:
        ok, why = POLICY.address_allowed(host.strip("[]"))
        if not (ok and why == "admin-allowed network"):
            raise Denied(403, "IP literals are refused; name an allowed host")
        return host.strip("[]")
    if not POLICY.host_allowed(host, port):
        raise Denied(403, f"{host}:{port} is not on the allow-list")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise Denied(502, f"cannot resolve {host}: {err}") from None
    addresses = sorted({info[4][0] for info in infos})
    for ip in addresses:  # every address must pass: a mixed answer is a rebinding attempt
        ok, why = POLICY.address_allowed(ip)
        if not ok:
            raise Denied(403, f"{host} resolves to a refused address: {why}")
    return addresses[0]


def check_body(headers) -> int:
    """The request body's length, or Denied: no chunked bodies, nothing over the cap."""
    length = 0
    for name, value in headers:
        if name.lower() == "transfer-encoding":
            raise Denied(411, "chunked request bodies are not proxied; send Content-Length")
        if name.lower() == "content-length":
            if not value.isdigit():
                raise Denied(400, "bad Content-Length")
            length = int(value)
    if length > MAX_REQUEST:
        raise Denied(413, f"request body over {MAX_REQUEST} bytes")
    return length


class Handler(socketserver.BaseRequestHandler):
    """Works on the raw socket: bytes the client sent after its headers (a body, a TLS hello) are
    kept in `leftover` and relayed first, with no buffered reader to block on."""

    leftover = b""

    def handle(self) -> None:
        self.request.settimeout(IDLE_TIMEOUT_S)
        client = self.client_address[0]
        try:
            head = self._read_head()
        except Denied as err:
            self._refuse(err.status, str(err))
            log(client=client, decision="deny", reason=str(err))
            return
        if head is None:
            return
        method, target, headers = head
        host, port = "", 0
        try:
            if method == "CONNECT":
                host, _, p = target.rpartition(":")
                port = int(p)
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    raise Denied(400, "only absolute http:// URLs and CONNECT are proxied")
                host, port = url.hostname, url.port or 80
                check_body(headers)
            ip = decide(host, port)
            upstream = socket.create_connection((ip, port), timeout=10)
        except Denied as err:
            self._refuse(err.status, str(err))
            log(client=client, method=method, host=host, port=port, decision="deny", reason=str(err))
            return
        except (OSError, ValueError) as err:
            self._refuse(502, f"upstream failed: {err}")
            log(client=client, method=method, host=host, port=port, decision="error", reason=str(err))
            return
        log(client=client, method=method, host=host, port=port, ip=ip, decision="allow", reason="on the allow-list")
        with upstream:
            if method == "CONNECT":
                self.request.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                self._forward_request(upstream, method, url, headers)
            sent, received = self._relay(upstream)
        log(client=client, method=method, host=host, port=port, decision="done", bytes_up=sent, bytes_down=received)

    def _read_head(self):
        buf = b""
        while b"\r\n\r\n" not in buf:
            try:
                chunk = self.request.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
            if len(buf) > HEADER_LIMIT:
                raise Denied(431, "request headers too large")
        head, self.leftover = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3:
            raise Denied(400, "malformed request line")
        headers = [tuple(h.split(":", 1)) for h in lines[1:] if ":" in h]
        return parts[0].upper(), parts[1], [(k.strip(), v.strip()) for k, v in headers]

    def _forward_request(self, upstream, method, url, headers) -> None:
        length = check_body(headers)
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        kept = [(k, v) for k, v in headers if not k.lower().startswith("proxy-") and k.lower() not in ("connection", "keep-alive")]
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept) + "Connection: close\r\n\r\n"
        upstream.sendall(head.encode("latin-1"))
        body, self.leftover = self.leftover[:length], self.leftover[length:]
        upstream.sendall(body)
        remaining = length - len(body)
        while remaining > 0:
            chunk = self.request.recv(min(65536, remaining))
            if not chunk:
                break
            upstream.sendall(chunk)
            remaining -= len(chunk)

    def _relay(self, upstream) -> tuple[int, int]:
        sent = received = 0
        client = self.request
        if self.leftover:
            upstream.sendall(self.leftover)
            sent += len(self.leftover)
            self.leftover = b""
        sockets = [client, upstream]
        while True:
            ready, _, _ = select.select(sockets, [], [], IDLE_TIMEOUT_S)
            if not ready:
                break
            for sock in ready:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return sent, received
                if not data:
                    return sent, received
                if sock is client:
                    sent += len(data)
                    if sent > MAX_REQUEST:
                        return sent, received
                    upstream.sendall(data)
                else:
                    received += len(data)
                    if received > MAX_RESPONSE:
                        return sent, received
                    client.sendall(data)
        return sent, received

    def _refuse(self, status: int, reason: str) -> None:
        body = json.dumps({"error": "egress refused", "reason": reason}).encode()
        try:
            self.request.sendall(f"HTTP/1.1 {status} Egress Refused\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        except OSError:
            pass


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    port = int(os.environ.get("OA_EGRESS_PORT", 3128))
    log(decision="start", allow=[r.host + (f":{r.port}" if r.port else "") for r in POLICY.rules], cidrs=[str(c) for c in POLICY.cidrs])
    with Server(("0.0.0.0", port), Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
