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

Rules (first match wins, deny by default): OA_EGRESS_RULES is a JSON list of
{"name", "action": "allow"|"deny", "host", "port", "methods", "path"}; host is exact, *.suffix or
*, port null means 80/443, methods null means any, path null means any (a glob on the path, query
stripped). OA_EGRESS_ALLOW's hosts are appended as whole-host allow rules. A refusal's 403 body names
the rule set (OA_EGRESS_RULE_SET) and the rule. A passed-through CONNECT tunnel cannot be checked
by method or path, so it is allowed only when every request it could carry would be.

Credentials (OA_EGRESS_CREDENTIALS, JSON list of {"host", "port", "path_prefix", "header", "value"}):
for these hosts only the gate terminates the box's TLS with a certificate the host signed for the
host (OA_EGRESS_INTERCEPT: JSON {host: {"cert": PEM, "key": PEM}}; the CA's key stays on the host),
checks each request against the rules, replaces the named header with the value, and re-originates
TLS to the real host with full verification (system trust, plus OA_EGRESS_UPSTREAM_CA's PEM). The
value is put in that header only: never in a URL, a body, a log line or a refusal.

Environment:
  OA_EGRESS_ALLOW        comma list of hosts: exact (pypi.org), suffix (*.pythonhosted.org), optional :port
  OA_EGRESS_ALLOW_CIDRS  comma list of CIDRs an admin allows (on-premises mirrors, test servers)
  OA_EGRESS_PORT         listening port (3128)
  OA_EGRESS_MAX_REQUEST_BYTES / OA_EGRESS_MAX_RESPONSE_BYTES  caps (10 MiB / 256 MiB)
"""
from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import select
import socket
import socketserver
import ssl
import sys
import tempfile
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
    """One rule: host (exact, *.suffix, or * for any), port (None: 80 and 443), methods (None: any),
    path (None: any; else a glob on the path, query stripped), action allow or deny."""

    def __init__(self, host: str, port: int | None = None, methods=None, path: str | None = None,
                 action: str = "allow", name: str = "", once: bool = False) -> None:
        self.host = host.strip().lower().rstrip(".")
        self.once = once  # a widened rule the person allowed for one request
        self.port = port
        self.methods = None if methods is None else frozenset(m.upper() for m in methods)
        self.path = path
        self.action = action
        self.name = name

    @classmethod
    def parse(cls, text: str, name: str = "") -> "Rule":
        """A whole-host allow rule from OA_EGRESS_ALLOW's host[:port]."""
        host, _, port = text.strip().lower().rpartition(":") if text.count(":") == 1 else (text.strip().lower(), "", "")
        if not host:
            host, port = port, ""
        return cls(host, int(port) if port else None, name=name)

    @classmethod
    def from_dict(cls, data: dict, name: str) -> "Rule":
        action = data.get("action", "allow")
        if action not in ("allow", "deny"):
            raise ValueError(f"{name}: action must be allow or deny")
        return cls(str(data["host"]), data.get("port"), data.get("methods"), data.get("path"), action, data.get("name") or name,
                   bool(data.get("once")))

    @property
    def whole_host(self) -> bool:
        return self.methods is None and self.path is None

    def matches_host(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.port is None and port not in DEFAULT_PORTS:
            return False
        if self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host

    def matches(self, host: str, port: int, method: str, path: str) -> bool:
        return (self.matches_host(host, port) and (self.methods is None or method in self.methods)
                and (self.path is None or fnmatch.fnmatchcase(path, self.path)))

    def describe(self) -> str:
        methods = ",".join(sorted(self.methods)) if self.methods else "*"
        return f"{self.name} ({self.action} {methods} {self.host}{'' if self.port is None else f':{self.port}'}{self.path or ''})"


class Policy:
    def __init__(self, allow: str, cidrs: str, rules: str = "", rule_set: str = "egress allow-list") -> None:
        self.rules = [Rule.from_dict(d, f"rules[{i}]") for i, d in enumerate(json.loads(rules or "[]"))]
        self.rules += [Rule.parse(r, f"allow[{i}]") for i, r in enumerate(r for r in allow.split(",") if r.strip())]
        self.cidrs = [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs.split(",") if c.strip()]
        self.rule_set = rule_set
        # Rules the person widened this session (the host writes them with `docker exec`: the box
        # cannot reach this container's files). They come last, so they only decide what no
        # configured rule matched (a default deny): an explicit deny is never widened.
        self.live: list[Rule] = []
        self.live_file = os.environ.get("OA_EGRESS_LIVE_RULES", "")
        self._live_stamp: tuple[int, int, int] | None = None
        self._used_once: set[str] = set()
        self._live_lock = threading.Lock()

    def _refresh(self) -> list[Rule]:
        """The widened rules in force (a changed file is read again; a once-rule is gone after its use)."""
        if not self.live_file:
            return []
        with self._live_lock:
            try:
                st = os.stat(self.live_file)
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if stamp != self._live_stamp and st.st_size < 1 << 20:
                    with open(self.live_file) as f:
                        data = json.load(f)
                    self.live = [Rule.from_dict({**d, "action": "allow", "name": f"widened[{d['id']}]"}, "") for d in data]
                    self._live_stamp = stamp
            except (OSError, ValueError, KeyError, TypeError):
                pass
            return [r for r in self.live if r.name not in self._used_once]

    def _use(self, rule: Rule) -> bool:
        """A once-rule decides one request only; False when another thread used it first."""
        if not rule.once:
            return True
        with self._live_lock:
            if rule.name in self._used_once:
                return False
            self._used_once.add(rule.name)
            return True

    def request(self, host: str, port: int, method: str, path: str) -> tuple[bool, str]:
        """First match wins; none matching is a refusal (deny by default). (allowed, the deciding rule)."""
        host = host.lower().rstrip(".")
        for rule in self.rules:
            if rule.matches(host, port, method, path):
                return rule.action == "allow", rule.describe()
        for rule in self._refresh():
            if rule.matches(host, port, method, path) and self._use(rule):
                return True, rule.describe()
        return False, "default deny"

    def tunnel(self, host: str, port: int) -> tuple[bool, str, str]:
        """A passed-through tunnel carries requests the gate never sees: it is allowed only when
        every request in it would be. (allowed, the deciding rule, why not)."""
        host = host.lower().rstrip(".")
        for rule in self.rules:
            if not rule.matches_host(host, port):
                continue
            if rule.whole_host:
                return rule.action == "allow", rule.describe(), "" if rule.action == "allow" else f"{host}:{port} is denied by {rule.describe()}"
            if rule.action == "deny":
                return False, rule.describe(), (f"{rule.describe()} limits methods or paths on {host}:{port}, which a passed-through "
                                                "TLS tunnel cannot show; only hosts with a credential rule are opened and checked per request")
        for rule in self._refresh():
            if rule.whole_host and rule.matches_host(host, port) and self._use(rule):
                return True, rule.describe(), ""
        return False, "default deny", f"{host}:{port} is not on the allow-list of {self.rule_set} (no rule allows the whole host; deny by default)"

    def any_allow(self, host: str, port: int) -> str | None:
        """For an intercepted host: the first allow rule that could let some request through, else None."""
        host = host.lower().rstrip(".")
        return next((r.describe() for r in [*self.rules, *self._refresh()] if r.action == "allow" and r.matches_host(host, port)), None)

    def address_allowed(self, ip: str) -> tuple[bool, str]:
        addr = ipaddress.ip_address(ip)
        if any(addr in net for net in self.cidrs):
            return True, "admin-allowed network"
        if not addr.is_global or addr.is_multicast:
            return False, f"{ip} is a private, loopback, link-local or reserved address"
        return True, "public address"


class Credential:
    def __init__(self, data: dict) -> None:
        self.host = str(data["host"]).lower().rstrip(".")
        self.port = int(data.get("port") or 443)
        self.path_prefix = str(data.get("path_prefix") or "/")
        self.header = str(data["header"])
        self.value = str(data["value"])
        self.secrets = [self.value] + [str(v) for v in data.get("secrets") or []]  # blanked in responses
        if not _TOKEN.match(self.header) or any(c in self.value for c in "\r\n\0"):
            raise ValueError("a credential's header must be a header name and its value one line")

    def applies(self, host: str, port: int, path: str) -> bool:
        return host == self.host and port == self.port and path.startswith(self.path_prefix)


POLICY = Policy(os.environ.get("OA_EGRESS_ALLOW", ""), os.environ.get("OA_EGRESS_ALLOW_CIDRS", ""),
                os.environ.get("OA_EGRESS_RULES", ""), os.environ.get("OA_EGRESS_RULE_SET") or "egress allow-list")
CREDENTIALS = [Credential(d) for d in json.loads(os.environ.get("OA_EGRESS_CREDENTIALS") or "[]")]
MAX_REQUEST = int(os.environ.get("OA_EGRESS_MAX_REQUEST_BYTES", 10 << 20))
MAX_RESPONSE = int(os.environ.get("OA_EGRESS_MAX_RESPONSE_BYTES", 256 << 20))
INTERCEPT: dict[str, ssl.SSLContext] = {}  # host -> server context with the host-signed certificate (load_intercept)
UPSTREAM_TLS: ssl.SSLContext | None = None


def load_intercept(spec: str, upstream_ca: str) -> None:
    """The per-host server contexts (each cert and key written to a private temp file, loaded,
    unlinked: nothing stays on disk) and the verifying client context for re-originated TLS."""
    global UPSTREAM_TLS
    UPSTREAM_TLS = ssl.create_default_context()
    if upstream_ca:
        UPSTREAM_TLS.load_verify_locations(cadata=upstream_ca)
    UPSTREAM_TLS.set_alpn_protocols(["http/1.1"])
    for host, pair in json.loads(spec or "{}").items():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])  # no h2: one checked HTTP/1.1 request per connection
        fd, name = tempfile.mkstemp()
        try:
            with os.fdopen(fd, "w") as out:
                out.write(pair["cert"] + "\n" + pair["key"])
            ctx.load_cert_chain(name)
        finally:
            os.unlink(name)

        ctx.sni_callback = _sni_check(host.lower())
        INTERCEPT[host.lower()] = ctx


def _sni_check(expected: str):
    """The handshake goes on only for the host the CONNECT named (or no SNI): a mismatch is refused."""
    def check(sock, server_name, _ctx):
        sock.oa_sni = server_name
        if server_name is not None and server_name.lower().rstrip(".") != expected:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        return None
    return check


def check_path(path: str) -> str:
    """The path as rules see it, or Denied when a server could read it as another one (dot segments,
    encoded slashes or dots, backslashes, empty segments): a glob checked here is the path reached."""
    if not path.startswith("/") or any(ord(c) < 0x21 or ord(c) > 0x7e for c in path):
        raise Denied(400, "the request path must be an absolute path of visible ASCII")
    lowered = path.lower()
    if "\\" in path or "//" in path or any(code in lowered for code in ("%2f", "%5c", "%2e", "%00")):
        raise Denied(400, "ambiguous request path (an encoded slash, dot or backslash, or an empty segment)")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise Denied(400, "dot segments in the request path")
    return path


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
    def __init__(self, status: int, reason: str, rule: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.rule = rule


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


def check_literal(host: str) -> None:
    """IP literals only inside an admin-allowed network, else Denied (before any rule is read)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return
    ok, why = POLICY.address_allowed(host.strip("[]"))
    if not (ok and why == "admin-allowed network"):
        raise Denied(403, "IP literals are refused; name an allowed host")


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


# A refused request sent nothing upstream (what the box sent the gate is not egress), and got no credential.
NOTHING_SENT = {"bytes_up": 0, "bytes_down": 0, "credential": False}
HOP_BY_HOP = ("connection", "keep-alive", "host", "upgrade", "http2-settings", "te", "trailer", "transfer-encoding")


class Redactor:
    """Replaces each secret in a byte stream with as many asterisks (so a Content-Length stays true),
    across chunk boundaries: an upstream that echoes the injected header does not hand it to the box."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = [s for s in secrets if len(s) >= 4]
        self.keep = max((len(s) for s in self.secrets), default=1) - 1
        self.tail = b""

    def feed(self, data: bytes, final: bool = False) -> bytes:
        if not self.secrets:
            return data
        buf = self.tail + data
        for secret in self.secrets:
            buf = buf.replace(secret, b"*" * len(secret))
        if final or self.keep == 0:
            self.tail = b""
            return buf
        cut = max(0, len(buf) - self.keep)
        out, self.tail = buf[:cut], buf[cut:]
        return out


class Handler(socketserver.BaseRequestHandler):
    """Works on the raw socket: bytes the client sent after its headers (a body, a TLS hello) are
    kept in `leftover` and relayed first, with no buffered reader to block on."""

    leftover = b""

    def handle(self) -> None:
        self.request.settimeout(IDLE_TIMEOUT_S)
        self.audit = {"client": self.client_address[0]}
        try:
            self._handle()
        except Denied as err:  # recorded before the box has its answer: a drain after the call sees it
            log(**self._fields(), decision="deny", rule=err.rule or "none", reason=str(err), **NOTHING_SENT)
            self._refuse(self.audit.pop("_reply_to", self.request), err.status, str(err), err.rule)
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            log(**self._fields(), decision="error", reason=f"{type(err).__name__}: {err}", **NOTHING_SENT)
            self._refuse(self.audit.pop("_reply_to", self.request), 502, f"upstream failed: {type(err).__name__}")

    def _fields(self) -> dict:
        return {k: v for k, v in self.audit.items() if not k.startswith("_")}

    def _handle(self) -> None:
        head = self._read_head(self.request)
        if head is None:
            return
        method, target, headers = head
        self.audit.update(method=method, host=short(target, 64), port=0)  # what the log names until the target is parsed
        if method == "CONNECT":
            host, port = parse_authority(target, None)
            self.audit.update(host=host, port=port)
            check_host_header(headers, host, port, default_port=port)
            check_literal(host)
            if host in INTERCEPT and any(c.host == host and c.port == port for c in CREDENTIALS):
                return self._intercept(host, port)
            allowed, rule, why = POLICY.tunnel(host, port)
            if not allowed:
                raise Denied(403, why, rule)
            ip = decide(host, port)
            upstream = socket.create_connection((ip, port), timeout=10)
            with upstream:
                self.request.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                self.audit.update(_reply_to=None, tls="tunnel")  # the client has its 200: a refusal now just closes the tunnel
                sni = self._client_hello_sni()
                if sni is not None and sni != host:
                    raise Denied(403, f"the TLS ClientHello names {short(sni, 80)}, not the checked target {host}", rule)
                sent, received = self._relay(upstream, upload=True)
            log(**self._fields(), decision="allow", rule=rule, bytes_up=sent, bytes_down=received, credential=False)
            return
        try:
            url = urlsplit(target)
            url_port = url.port
        except ValueError:
            raise Denied(400, "malformed URL") from None
        if url.scheme != "http" or not url.hostname or "@" in url.netloc:
            raise Denied(400, "only absolute http:// URLs (no user info) and CONNECT are proxied")
        host, port = normal_host(url.hostname), url_port or 80
        self.audit.update(host=host, port=port, path=short(url.path, 200))
        check_host_header(headers, host, port, default_port=80)
        check_literal(host)
        path = check_path(url.path or "/")
        allowed, rule = POLICY.request(host, port, method, path)
        if not allowed:
            raise Denied(403, self._refusal(host, port, method, path, rule), rule)
        length = check_body(headers)
        ip = decide(host, port)
        with socket.create_connection((ip, port), timeout=10) as upstream:
            target_path = path + ("?" + url.query if url.query else "")
            sent = self._forward_request(self.request, upstream, method, target_path, headers, host, port, length, None)
            # One checked request per connection: nothing more of the client's reaches this
            # upstream (a pipelined second request would carry its own, unchecked Host).
            self.leftover = b""
            received = self._pipe(upstream, self.request, Redactor([]))
        log(**self._fields(), decision="allow", rule=rule, bytes_up=sent, bytes_down=received, credential=False)

    def _refusal(self, host: str, port: int, method: str, path: str, rule: str) -> str:
        if rule == "default deny":
            return f"{method} {host}:{port}{short(path, 120)} is not on the allow-list of {POLICY.rule_set} (no rule matches; deny by default)"
        return f"{method} {host}:{port}{short(path, 120)} is denied by {rule} of {POLICY.rule_set}"

    def _intercept(self, host: str, port: int) -> None:
        """A host with a credential rule: the box's TLS ends here, each request is checked and gets
        the credential, and a new verified TLS connection goes to the real host."""
        first = POLICY.any_allow(host, port)
        if first is None:
            raise Denied(403, f"{host}:{port} is not on the allow-list of {POLICY.rule_set} (deny by default)", "default deny")
        ip = decide(host, port)
        self.request.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        self.audit.update(_reply_to=None, tls="intercepted")
        tls = INTERCEPT[host].wrap_socket(self.request, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError) as err:
            tls.close()
            sni = getattr(tls, "oa_sni", None)
            why = f"the TLS ClientHello names {short(sni, 80)}, not the checked target {host}" if sni and sni.lower().rstrip(".") != host else f"TLS handshake with the box failed: {type(err).__name__}"
            raise Denied(403, why) from None
        with tls:
            try:
                self._intercepted_request(tls, host, port, ip)
            except Denied as err:  # answered inside the box's TLS, before it closes
                log(**self._fields(), decision="deny", rule=err.rule or "none", reason=str(err), **NOTHING_SENT)
                self._refuse(tls, err.status, str(err), err.rule)
            except (OSError, ValueError) as err:
                log(**self._fields(), decision="error", reason=f"{type(err).__name__}: {err}", **NOTHING_SENT)
                self._refuse(tls, 502, f"upstream failed: {type(err).__name__}")

    def _intercepted_request(self, tls, host: str, port: int, ip: str) -> None:
        """One request inside an opened tunnel: read, checked, sent with the credential over verified TLS."""
        self.audit["_reply_to"] = None
        head = self._read_head(tls)
        if head is None:
            return
        method, target, headers = head
        self.audit["method"] = method
        if method == "CONNECT" or not target.startswith("/"):
            raise Denied(400, "inside an opened tunnel only origin-form requests (GET /path) are proxied")
        raw_path, _, query = target.partition("?")
        self.audit["path"] = short(raw_path.partition("#")[0], 200)
        check_host_header(headers, host, port, default_port=443)
        path = check_path(raw_path)
        allowed, rule = POLICY.request(host, port, method, path)
        if not allowed:
            raise Denied(403, self._refusal(host, port, method, path, rule), rule)
        length = check_body(headers)
        credential = next((c for c in CREDENTIALS if c.applies(host, port, path)), None)
        with socket.create_connection((ip, port), timeout=10) as raw, UPSTREAM_TLS.wrap_socket(raw, server_hostname=host) as upstream:
            sent = self._forward_request(tls, upstream, method, target, headers, host, port, length, credential)
            self.leftover = b""
            secrets = [s.encode("latin-1") for c in CREDENTIALS if c.host == host for s in c.secrets]
            received = self._pipe(upstream, tls, Redactor(secrets))
        # logged before the box's connection closes: when the box has its answer, the record exists
        log(**self._fields(), decision="allow", rule=rule, bytes_up=sent, bytes_down=received, credential=credential is not None)

    def _read_head(self, sock):
        buf = b""
        while b"\r\n\r\n" not in buf:
            try:
                chunk = sock.recv(65536)
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
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not _TOKEN.match(parts[0]):
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

    def _forward_request(self, client, upstream, method, target, headers, host, port, length, credential) -> int:
        """Sends the checked head (our Host, no hop-by-hop headers, the credential's header replaced)
        and `length` body bytes; returns the bytes sent."""
        kept = [(k, v) for k, v in headers if not k.lower().startswith("proxy-") and k.lower() not in HOP_BY_HOP]
        if credential is not None:
            kept = [(k, v) for k, v in kept if k.lower() != credential.header.lower()] + [(credential.header, credential.value)]
        if isinstance(upstream, ssl.SSLSocket):  # an opened host: ask for plain bytes, so the blanking of the secret sees them
            kept = [(k, v) for k, v in kept if k.lower() != "accept-encoding"] + [("Accept-Encoding", "identity")]
        default = 443 if credential is not None or isinstance(upstream, ssl.SSLSocket) else 80
        kept.insert(0, ("Host", host if port == default else f"{host}:{port}"))  # exactly what was checked
        head = (f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept) + "Connection: close\r\n\r\n").encode("latin-1")
        upstream.sendall(head)
        body, self.leftover = self.leftover[:length], self.leftover[length:]
        upstream.sendall(body)
        remaining = length - len(body)
        while remaining > 0:
            chunk = client.recv(min(65536, remaining))
            if not chunk:
                break
            upstream.sendall(chunk)
            remaining -= len(chunk)
        return len(head) + length - remaining

    def _pipe(self, upstream, client, redactor: Redactor) -> int:
        """The response, upstream to client, until the upstream closes (we asked for Connection: close) or the cap."""
        received = 0
        while True:
            try:
                data = upstream.recv(65536)
            except (OSError, ssl.SSLError):
                data = b""
            if not data:
                client.sendall(redactor.feed(b"", final=True))
                return received
            received += len(data)
            if received > MAX_RESPONSE:
                return received
            client.sendall(redactor.feed(data))

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

    def _refuse(self, sock, status: int, reason: str, rule: str | None = None) -> None:
        """A JSON refusal naming the rule set and the rule; nothing of the request's headers in it."""
        if sock is None:
            return
        body = json.dumps({"error": "egress refused", "reason": reason, "rule_set": POLICY.rule_set, "rule": rule or "none"}).encode()
        try:
            sock.sendall(f"HTTP/1.1 {status} Egress Refused\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
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
    load_intercept(os.environ.get("OA_EGRESS_INTERCEPT", ""), os.environ.get("OA_EGRESS_UPSTREAM_CA", ""))
    log(decision="start", rule_set=POLICY.rule_set, rules=[r.describe() for r in POLICY.rules][:50], cidrs=[str(c) for c in POLICY.cidrs],
        intercepted=sorted(INTERCEPT), credentials=[f"{c.host}:{c.port}{c.path_prefix} {c.header}" for c in CREDENTIALS])
    with Server(("0.0.0.0", port), Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
