"""The egress gate: a small HTTP forward and CONNECT proxy with a host allow-list.

Standard library only; runs in its own container, the only door out of a sandbox's internal
network. It refuses by default, refuses IP literals, and refuses private, loopback and link-local
destinations after resolving the name itself (and then connects to the address it checked, so
DNS rebinding cannot slip past), unless an admin-level CIDR allows them. Every request, allowed
or denied, is one JSON line on stdout, every field of it bounded.

What was checked is what is reached: a plain request's Host header must name the host and port
of its URL (one request per connection: nothing the client sends after it is forwarded, and a
request with two Content-Length headers is refused, so no second request rides along), a CONNECT's
Host header (if any) its target, and the TLS ClientHello sent through a
CONNECT tunnel must name the same server (SNI) or none; anything else is refused (domain fronting).
A tunnel must carry TLS: its first bytes must be a ClientHello (a plain protocol inside a tunnel
would carry its own, unchecked Host). What TLS then encrypts (the inner Host header, an ECH inner
hello, which is refused) cannot be seen without breaking TLS.

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
import re
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
MAX_HOST_CHARS = 253  # a DNS name's longest text form (255 octets on the wire)
MAX_LOG_TEXT = 300  # per string field of a log line
MAX_CLIENT_HELLO = 64 * 1024
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")  # a header name (RFC 9110 token)
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


def short(value, limit: int = MAX_LOG_TEXT):
    """Strings the client chose, cut with a marker: no request makes a log line long."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}…[cut {len(value) - limit} chars]"
    return value


def log(**fields) -> None:
    """One JSON line; `seq` lets a reader that fetches overlapping windows drop what it has seen."""
    global _seq
    fields = {k: short(v) for k, v in fields.items()}
    with _log_lock:
        _seq += 1
        sys.stdout.write(json.dumps({"ts": round(time.time(), 3), "seq": _seq, "event": "egress", **fields}) + "\n")
        sys.stdout.flush()


class Denied(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def normal_host(host: str) -> str:
    """The host as compared and checked: lower case, no trailing dot, a valid DNS name or IP
    literal, else Denied (before it is quoted anywhere, so a 60 KB name is never logged whole)."""
    if len(host) > MAX_HOST_CHARS + 1:
        raise Denied(400, f"host name of {len(host)} characters: no DNS name is longer than {MAX_HOST_CHARS}")
    host = host.lower()
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise Denied(400, "malformed IPv6 literal") from None
        return host
    host = host[:-1] if host.endswith(".") else host
    if ":" in host:  # urlsplit gives an IPv6 literal without its brackets
        try:
            return f"[{ipaddress.IPv6Address(host)}]"
        except ValueError:
            raise Denied(400, "not a valid host name") from None
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        pass
    if not host or not all(_LABEL.match(label) for label in host.split(".")):
        raise Denied(400, "not a valid host name")
    return host


def parse_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """host[:port] (a Host header, a CONNECT target) as (normal host, port), else Denied."""
    if not text or any(c in text for c in "@/?#\\ \t") or any(ord(c) < 0x21 or ord(c) > 0x7e for c in text):
        raise Denied(400, "malformed host")
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1:]
    else:
        host, sep, port = text.rpartition(":")
        host, rest = (host, sep + port) if sep else (text, "")
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
            raise Denied(400, "malformed port")
        port = int(rest[1:])
    elif default_port is None:
        raise Denied(400, "a port is required")
    else:
        port = default_port
    return normal_host(host), port


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


def check_host_header(headers, host: str, port: int, default_port: int) -> None:
    """The Host header, if any, names exactly the host and port that were checked, or Denied.
    `default_port` is the port a Host header without one means (80 for http://, the target's for CONNECT)."""
    values = [v for k, v in headers if k.lower() == "host"]
    if len(values) > 1:
        raise Denied(400, "more than one Host header")
    if values and parse_authority(values[0], default_port) != (host, port):
        raise Denied(403, f"the Host header names {short(values[0], 80)}, not the checked target {host}:{port}")


def check_body(headers) -> int:
    """The request body's length, or Denied: no chunked bodies, nothing over the cap."""
    length = 0
    lengths = [value for name, value in headers if name.lower() == "content-length"]
    if len(lengths) > 1:  # the proxy would read one, the upstream maybe the other: a request hidden in a body
        raise Denied(400, "more than one Content-Length header")
    for name, value in headers:
        if name.lower() == "transfer-encoding":
            raise Denied(411, "chunked request bodies are not proxied; send Content-Length")
        if name.lower() == "content-length":
            if not re.fullmatch(r"[0-9]{1,19}", value):  # str.isdigit() also takes '²' and friends
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
        host, port = short(target, 64), 0  # what the log names until the target is parsed
        try:
            if method == "CONNECT":
                host, port = parse_authority(target, None)
                check_host_header(headers, host, port, default_port=port)
            else:
                try:
                    url = urlsplit(target)
                    url_port = url.port
                except ValueError:
                    raise Denied(400, "malformed URL") from None
                if url.scheme != "http" or not url.hostname or "@" in url.netloc:
                    raise Denied(400, "only absolute http:// URLs (no user info) and CONNECT are proxied")
                host, port = normal_host(url.hostname), url_port or 80
                check_host_header(headers, host, port, default_port=80)
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
        with upstream:
            if method == "CONNECT":
                self.request.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                try:
                    sni = self._client_hello_sni()
                    if sni is not None and sni != host:
                        raise Denied(403, f"the TLS ClientHello names {short(sni, 80)}, not the checked target {host}")
                except Denied as err:  # the client already has its 200: the tunnel just closes
                    log(client=client, method=method, host=host, port=port, decision="deny", reason=str(err))
                    return
                except OSError as err:
                    log(client=client, method=method, host=host, port=port, decision="error", reason=f"client: {err}")
                    return
            log(client=client, method=method, host=host, port=port, ip=ip, decision="allow", reason="on the allow-list")
            if method != "CONNECT":
                self._forward_request(upstream, method, url, headers, host, port)
                # One checked request per connection: nothing more of the client's reaches this
                # upstream (a pipelined second request would carry its own, unchecked Host).
                self.leftover = b""
            sent, received = self._relay(upstream, upload=method == "CONNECT")
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
        bare = head.replace(b"\r\n", b"")
        if b"\r" in bare or b"\n" in bare or b"\0" in head:  # a line a server might split where we did not
            raise Denied(400, "bare CR, LF or NUL in the request head")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise Denied(400, "malformed request line")
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not _TOKEN.match(name):  # also refuses obs-fold and `Host :` (RFC 9112 5.1)
                raise Denied(400, "malformed header line")
            headers.append((name, value.strip(" \t")))
        return parts[0].upper(), parts[1], headers

    def _client_hello_sni(self) -> str | None:
        """Reads the tunnel's first TLS handshake message (kept in `leftover` to relay) and returns
        the server name it asks for, or None; Denied for anything that is not a ClientHello."""
        buf = self.leftover
        handshake = b""
        offset = 0
        while True:
            while len(buf) < offset + 5 or len(buf) < offset + 5 + int.from_bytes(buf[offset + 3:offset + 5], "big"):
                if len(buf) > MAX_CLIENT_HELLO:
                    raise Denied(400, "TLS ClientHello too large")
                chunk = self.request.recv(16384)
                if not chunk:
                    raise Denied(400, "the tunnel closed before a TLS ClientHello")
                buf += chunk
            if buf[offset] != 0x16 or buf[offset + 1] != 0x03:
                raise Denied(400, "a CONNECT tunnel must start with a TLS ClientHello")
            length = int.from_bytes(buf[offset + 3:offset + 5], "big")
            handshake += buf[offset + 5:offset + 5 + length]
            offset += 5 + length
            if len(handshake) >= 4:
                if handshake[0] != 0x01:
                    raise Denied(400, "a CONNECT tunnel must start with a TLS ClientHello")
                if len(handshake) >= 4 + int.from_bytes(handshake[1:4], "big"):
                    break
        self.leftover = buf
        return client_hello_sni(handshake[4:4 + int.from_bytes(handshake[1:4], "big")])

    def _forward_request(self, upstream, method, url, headers, host, port) -> None:
        length = check_body(headers)
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        kept = [(k, v) for k, v in headers if not k.lower().startswith("proxy-") and k.lower() not in ("connection", "keep-alive", "host")]
        kept.insert(0, ("Host", host if port == 80 else f"{host}:{port}"))  # exactly what was checked
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

    def _relay(self, upstream, upload: bool = True) -> tuple[int, int]:
        """Both ways for a tunnel; for a plain request (upload=False) only the response comes back."""
        sent = received = 0
        client = self.request
        if self.leftover:
            upstream.sendall(self.leftover)
            sent += len(self.leftover)
            self.leftover = b""
        sockets = [client, upstream] if upload else [upstream]
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


def client_hello_sni(body: bytes) -> str | None:
    """The host_name in a ClientHello body's server_name extension, or None; Denied when the hello
    is malformed, names more than one server, or hides its real one (ECH)."""
    try:
        at = 2 + 32  # legacy_version, random
        at += 1 + body[at]  # session id
        at += 2 + int.from_bytes(body[at:at + 2], "big")  # cipher suites
        at += 1 + body[at]  # compression methods
        if at > len(body):
            raise IndexError
        if at == len(body):
            return None  # no extensions at all
        end = at + 2 + int.from_bytes(body[at:at + 2], "big")
        if end != len(body):
            raise IndexError
        at += 2
        names: list[str] = []
        seen: set[int] = set()
        while at < end:
            kind, size = int.from_bytes(body[at:at + 2], "big"), int.from_bytes(body[at + 2:at + 4], "big")
            data = body[at + 4:at + 4 + size]
            if len(data) != size or kind in seen:
                raise IndexError
            seen.add(kind)
            at += 4 + size
            if kind == 0xFE0D:
                raise Denied(403, "an encrypted ClientHello (ECH) hides the server it asks for")
            if kind == 0:
                pos, listed = 2, 2 + int.from_bytes(data[0:2], "big")
                if listed != len(data):
                    raise IndexError
                while pos < listed:
                    name_type, name_len = data[pos], int.from_bytes(data[pos + 1:pos + 3], "big")
                    name = data[pos + 3:pos + 3 + name_len]
                    if len(name) != name_len:
                        raise IndexError
                    pos += 3 + name_len
                    if name_type == 0:
                        names.append(name.decode("ascii"))
    except (IndexError, UnicodeDecodeError):
        raise Denied(400, "malformed TLS ClientHello") from None
    if len(names) > 1:
        raise Denied(403, "the TLS ClientHello names more than one server")
    return normal_host(names[0]) if names else None


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
