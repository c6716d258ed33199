"""What a request must look like before any rule reads it: host names, authorities, paths, bodies,
the Host header, the TLS ClientHello of a tunnel. Each check refuses (Denied) rather than guess what
a server further on would make of an ambiguous request: what was checked is what is reached."""

from __future__ import annotations

import ipaddress
import re
import socket

from .rules import Policy

MAX_HOST_CHARS = 253  # a DNS name's longest text form (255 octets on the wire)
MAX_LOG_TEXT = 300  # per string field of a log line
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")

Headers = list[tuple[str, str]]


class Denied(Exception):
    """A refusal: the status the box gets, the reason it reads, the rule that decided (if one did)."""

    def __init__(self, status: int, reason: str, rule: str | None = None, kind: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.rule = rule
        self.kind = kind  # the refusal's type, when it is not a rule's (uninspectable_response)


def short(value: object, limit: int = MAX_LOG_TEXT) -> object:
    """Strings the client chose, cut with a marker: no request makes a log line long."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}…[cut {len(value) - limit} chars]"
    return value


def short_text(value: str, limit: int = MAX_LOG_TEXT) -> str:
    return value if len(value) <= limit else f"{value[:limit]}…[cut {len(value) - limit} chars]"


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
    if not text or any(c in text for c in "@/?#\\ \t") or any(ord(c) < 0x21 or ord(c) > 0x7E for c in text):
        raise Denied(400, "malformed host")
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, sep, port_text = text.rpartition(":")
        host, rest = (host, sep + port_text) if sep else (text, "")
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
            raise Denied(400, "malformed port")
        port = int(rest[1:])
    elif default_port is None:
        raise Denied(400, "a port is required")
    else:
        port = default_port
    return normal_host(host), port


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_literal(policy: Policy, host: str) -> None:
    """IP literals only inside an admin-allowed network, else Denied (before any rule is read)."""
    if not _literal(host):
        return
    ok, why = policy.address_allowed(host.strip("[]"))
    if not (ok and why == "admin-allowed network"):
        raise Denied(403, "IP literals are refused; name an allowed host")


def resolve(policy: Policy, host: str, port: int) -> str:
    """The checked address to connect to, or Denied."""
    if _literal(host):
        check_literal(policy, host)
        return host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise Denied(502, f"cannot resolve {host}: {err}") from None
    addresses = sorted({str(info[4][0]) for info in infos})
    for ip in addresses:  # every address must pass: a mixed answer is a rebinding attempt
        ok, why = policy.address_allowed(ip)
        if not ok:
            raise Denied(403, f"{host} resolves to a refused address: {why}")
    return addresses[0]


def check_host_header(headers: Headers, host: str, port: int, default_port: int) -> None:
    """The Host header, if any, names exactly the host and port that were checked, or Denied.
    `default_port` is the port a Host header without one means (80 for http://, the target's for CONNECT)."""
    values = [v for k, v in headers if k.lower() == "host"]
    if len(values) > 1:
        raise Denied(400, "more than one Host header")
    if values and parse_authority(values[0], default_port) != (host, port):
        raise Denied(403, f"the Host header names {short_text(values[0], 80)}, not the checked target {host}:{port}")


def check_body(headers: Headers, max_request: int) -> int:
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
    if length > max_request:
        raise Denied(413, f"request body over {max_request} bytes")
    return length


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset("0123456789abcdefABCDEF")


def check_path(path: str) -> str:
    """The one form of the path that rules see and the upstream gets (RFC 3986 6.2.2): percent-
    encoded unreserved characters decoded, other escapes upper case, dot segments resolved, runs of
    slashes made one. Denied where servers disagree on what a spelling means, rather than guess: an
    invalid escape (`%zz`), an encoded slash or backslash, NUL or any control character (raw or
    encoded), an encoded percent followed by hex (decoded twice by some servers), a backslash, a
    `;` (path parameters, which some servers strip before routing), a fragment, bytes that are not
    UTF-8 once decoded (overlong forms). What was checked is what is sent."""
    if not path.startswith("/") or any(ord(c) < 0x21 or ord(c) > 0x7E for c in path):
        raise Denied(400, "the request path must be an absolute path of visible ASCII")
    if "\\" in path or ";" in path or "#" in path:
        raise Denied(400, "ambiguous request path (a backslash, a `;` path parameter or a fragment)")
    out: list[str] = []
    encoded = bytearray()  # a run of escaped bytes that stay escaped: must be UTF-8 as a whole
    i = 0
    while i < len(path):
        char = path[i]
        if char != "%":
            _utf8_run(encoded)
            out.append(char)
            i += 1
            continue
        pair = path[i + 1 : i + 3]
        if len(pair) != 2 or not set(pair) <= _HEX:
            raise Denied(400, "invalid percent-encoding in the request path")
        byte = int(pair, 16)
        if chr(byte) in _UNRESERVED:
            _utf8_run(encoded)
            out.append(chr(byte))
        elif byte < 0x20 or byte == 0x7F or byte in (0x2F, 0x5C):
            raise Denied(400, "ambiguous request path (an encoded slash, backslash, NUL or control character)")
        elif byte == 0x25 and set(path[i + 3 : i + 5]) <= _HEX and len(path[i + 3 : i + 5]) == 2:
            raise Denied(400, "ambiguous request path (a double percent-encoding)")
        else:
            if byte >= 0x80:
                encoded.append(byte)
            else:
                _utf8_run(encoded)
            out.append(f"%{byte:02X}")
        i += 3
    _utf8_run(encoded)
    segments: list[str] = []
    parts = "".join(out).split("/")[1:]
    for at, segment in enumerate(parts):
        last = at == len(parts) - 1
        if segment == "..":
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif segment == ".":
            if last:
                segments.append("")
        elif segment or last:
            segments.append(segment)
    return "/" + "/".join(segments)


def check_query(query: str) -> str:
    """The query as sent: visible ASCII only (it is forwarded as it came; rules do not read it)."""
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in query):
        raise Denied(400, "the request query must be visible ASCII")
    return query


def _utf8_run(encoded: bytearray) -> None:
    if encoded:
        try:
            encoded.decode("utf-8")
        except UnicodeDecodeError:
            raise Denied(400, "percent-encoded bytes in the request path that are not UTF-8") from None
        encoded.clear()


def client_hello_sni(body: bytes) -> str | None:
    """The host_name in a ClientHello body's server_name extension, or None; Denied when the hello
    is malformed, names more than one server, or hides its real one (ECH)."""
    names: list[str] = []
    try:
        at = 2 + 32  # legacy_version, random
        at += 1 + body[at]  # session id
        at += 2 + int.from_bytes(body[at : at + 2], "big")  # cipher suites
        at += 1 + body[at]  # compression methods
        if at > len(body):
            raise IndexError
        if at == len(body):
            return None  # no extensions at all
        end = at + 2 + int.from_bytes(body[at : at + 2], "big")
        if end != len(body):
            raise IndexError
        at += 2
        seen: set[int] = set()
        while at < end:
            kind, size = int.from_bytes(body[at : at + 2], "big"), int.from_bytes(body[at + 2 : at + 4], "big")
            data = body[at + 4 : at + 4 + size]
            if len(data) != size or kind in seen:
                raise IndexError
            seen.add(kind)
            at += 4 + size
            if kind == 0xFE0D:
                raise Denied(403, "an encrypted ClientHello (ECH) hides the server it asks for")
            if kind == 0:
                names += _server_names(data)
    except (IndexError, UnicodeDecodeError):
        raise Denied(400, "malformed TLS ClientHello") from None
    if len(names) > 1:
        raise Denied(403, "the TLS ClientHello names more than one server")
    return normal_host(names[0]) if names else None


def _server_names(data: bytes) -> list[str]:
    """The host names of a server_name extension's list (IndexError when it is malformed)."""
    names = []
    pos, listed = 2, 2 + int.from_bytes(data[0:2], "big")
    if listed != len(data):
        raise IndexError
    while pos < listed:
        name_type, name_len = data[pos], int.from_bytes(data[pos + 1 : pos + 3], "big")
        name = data[pos + 3 : pos + 3 + name_len]
        if len(name) != name_len:
            raise IndexError
        pos += 3 + name_len
        if name_type == 0:
            names.append(name.decode("ascii"))
    return names
