"""One connection from the box, start to end: read its head, check it, decide, forward or refuse,
and write its one audit record before the box has its answer.

Works on the raw socket: bytes the client sent after its headers (a body, a TLS hello) are kept
in `leftover` and relayed first, with no buffered reader to block on. A refusal's record counts
what the box sent the gate and the refusal the gate sent back (nothing reached the upstream); an
allowed request's, what went to the upstream and came back from it.
"""

from __future__ import annotations

import json
import select
import socket
import socketserver
import ssl
from typing import Any
from urllib.parse import urlsplit

from .checks import (
    Denied,
    Headers,
    check_body,
    check_host_header,
    check_literal,
    check_path,
    check_query,
    client_hello_sni,
    normal_host,
    parse_authority,
    resolve,
    short,
    short_text,
)
from .redact import Redactor
from .response import Uninspectable, Upstream, relay
from .rules import TOKEN, Credential
from .settings import Settings
from .tls import SNI_ATTRIBUTE

HEADER_LIMIT = 64 * 1024
IDLE_TIMEOUT_S = 60
MAX_CLIENT_HELLO = 64 * 1024
HOP_BY_HOP = ("connection", "keep-alive", "host", "upgrade", "http2-settings", "te", "trailer", "transfer-encoding")
ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
Box = socket.socket  # the box's side: the accepted socket, or the TLS the gate opened on it (an ssl.SSLSocket)


class Cut(Exception):
    """An answer cut after the box had part of it (already in the audit): nothing more to say."""


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], settings: Settings) -> None:
        self.settings = settings
        super().__init__(address, Handler)


class Handler(socketserver.BaseRequestHandler):
    server: Server
    leftover = b""
    version = "HTTP/1.1"  # the box's request's, for the framing of the answer
    injected = False  # whether the current request carries the credential

    def setup(self) -> None:
        self.settings = self.server.settings
        self.sock: socket.socket = self.request
        self.connection = self.settings.audit.opened()
        self.audit: dict[str, Any] = {"client": self.client_address[0]}
        self.reply_to: Box | None = (
            self.sock
        )  # where a refusal goes; None once the box has its 200 for a passed-through tunnel
        self.from_box = 0  # bytes read from the box (a refusal's record)
        self.to_box = 0  # bytes the gate sent the box before a refusal (a 200 Connection Established)

    def finish(self) -> None:
        self.settings.audit.closed(self.connection)

    def handle(self) -> None:
        self.sock.settimeout(IDLE_TIMEOUT_S)
        try:
            self._handle()
        except Denied as err:  # recorded before the box has its answer: a drain after the call sees it
            self._refuse(err.status, str(err), err.rule, "deny", kind=err.kind)
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            self._refuse(502, f"upstream failed: {type(err).__name__}", None, "error", f"{type(err).__name__}: {err}")

    def _fields(self) -> dict[str, Any]:
        return dict(self.audit)

    def _log(self, **fields: Any) -> None:
        self.settings.audit.log(**self._fields(), **fields)

    def _recv(self, sock: Box, size: int) -> bytes:
        """From the box, counted."""
        data = sock.recv(size)
        self.from_box += len(data)
        return data

    def _handle(self) -> None:
        head = self._read_head(self.sock)
        if head is None:
            return
        method, target, headers = head
        self.audit.update(
            method=method, host=short(target, 64), port=0
        )  # what the log names until the target is parsed
        if method == "CONNECT":
            self._connect(target, headers)
            return
        try:
            url = urlsplit(target)
            url_port = url.port
        except ValueError:
            raise Denied(400, "malformed URL") from None
        if url.scheme != "http" or not url.hostname or "@" in url.netloc:
            raise Denied(400, "only absolute http:// URLs (no user info) and CONNECT are proxied")
        policy = self.settings.policy
        host, port = normal_host(url.hostname), url_port or 80
        self.audit.update(host=host, port=port, path=short(url.path, 200))
        check_host_header(headers, host, port, default_port=80)
        check_literal(policy, host)
        path = check_path(url.path or "/")  # the canonical form: what the rules see is what is sent
        query = check_query(url.query)
        self.audit["path"] = short(path, 200)
        allowed, rule = policy.request(host, port, method, path)
        if not allowed:
            raise Denied(403, policy.refusal(host, port, method, path, rule), rule)
        length = check_body(headers, self.settings.max_request)
        ip = resolve(policy, host, port)
        with socket.create_connection((ip, port), timeout=10) as upstream:
            target_path = path + ("?" + query if query else "")
            sent = self._forward_request(self.sock, upstream, method, target_path, headers, host, port, length, None)
            # One checked request per connection: nothing more of the client's reaches this
            # upstream (a pipelined second request would carry its own, unchecked Host).
            self.leftover = b""
            received = self._pipe(upstream, self.sock)
        self._log(decision="allow", rule=rule, bytes_up=sent, bytes_down=received, credential=False)

    def _connect(self, target: str, headers: Headers) -> None:
        policy = self.settings.policy
        host, port = parse_authority(target, None)
        self.audit.update(host=host, port=port)
        check_host_header(headers, host, port, default_port=port)
        check_literal(policy, host)
        if self.settings.intercepts(host, port):
            self._intercept(host, port)
            return
        allowed, rule, why = policy.tunnel(host, port)
        if not allowed:
            raise Denied(403, why, rule)
        ip = resolve(policy, host, port)
        with socket.create_connection((ip, port), timeout=10) as upstream:
            self._established()
            self.audit.update(tls="tunnel")  # the client has its 200: a refusal now just closes the tunnel
            sni = self._client_hello_sni()
            if sni is not None and sni != host:
                raise Denied(
                    403, f"the TLS ClientHello names {short_text(sni, 80)}, not the checked target {host}", rule
                )
            sent, received = self._relay(upstream)
        self._log(decision="allow", rule=rule, bytes_up=sent, bytes_down=received, credential=False)

    def _established(self) -> None:
        self.sock.sendall(ESTABLISHED)
        self.to_box += len(ESTABLISHED)
        self.reply_to = None

    def _intercept(self, host: str, port: int) -> None:
        """A host with a credential rule: the box's TLS ends here, each request is checked and gets
        the credential, and a new verified TLS connection goes to the real host."""
        policy = self.settings.policy
        if policy.any_allow(host, port) is None:
            raise Denied(
                403, f"{host}:{port} is not on the allow-list of {policy.rule_set} (deny by default)", "default deny"
            )
        ip = resolve(policy, host, port)
        self._established()
        self.audit.update(tls="intercepted")
        tls = self.settings.intercept[host].wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError) as err:
            tls.close()
            sni = getattr(tls, SNI_ATTRIBUTE, None)
            why = (
                f"the TLS ClientHello names {short_text(sni, 80)}, not the checked target {host}"
                if isinstance(sni, str) and sni.lower().rstrip(".") != host
                else f"TLS handshake with the box failed: {type(err).__name__}"
            )
            raise Denied(403, why) from None
        with tls:
            self.reply_to = tls  # a refusal now is answered inside the box's TLS, before it closes
            try:
                self._intercepted_request(tls, host, port, ip)
            except Denied as err:
                self._refuse(err.status, str(err), err.rule, "deny", kind=err.kind)
            except Cut:
                pass
            except (OSError, ValueError) as err:
                self._refuse(
                    502, f"upstream failed: {type(err).__name__}", None, "error", f"{type(err).__name__}: {err}"
                )
            self.reply_to = None

    def _intercepted_request(self, tls: ssl.SSLSocket, host: str, port: int, ip: str) -> None:
        """One request inside an opened tunnel: read, checked, sent with the credential over verified TLS."""
        policy = self.settings.policy
        head = self._read_head(tls)
        if head is None:
            return
        method, target, headers = head
        self.audit["method"] = method
        if method == "CONNECT" or not target.startswith("/"):
            raise Denied(400, "inside an opened tunnel only origin-form requests (GET /path) are proxied")
        raw_path, _, query = target.partition("#")[0].partition("?")
        self.audit["path"] = short(raw_path, 200)
        check_host_header(headers, host, port, default_port=443)
        path = check_path(raw_path)  # the canonical form: what the rules see is what is sent
        query = check_query(query)
        self.audit["path"] = short(path, 200)
        allowed, rule = policy.request(host, port, method, path)
        if not allowed:
            raise Denied(403, policy.refusal(host, port, method, path, rule), rule)
        length = check_body(headers, self.settings.max_request)
        credential = self.settings.credential_for(host, port, path)
        self.injected = credential is not None
        assert self.settings.upstream_tls is not None, (
            "an intercepted host needs the upstream context (Settings.from_environment)"
        )
        with (
            socket.create_connection((ip, port), timeout=10) as raw,
            self.settings.upstream_tls.wrap_socket(raw, server_hostname=host) as upstream,
        ):
            sent = self._forward_request(
                tls, upstream, method, path + ("?" + query if query else ""), headers, host, port, length, credential
            )
            self.leftover = b""
            received = self._inspected(upstream, tls, method, Redactor(self.settings.secrets_of(host)))
        # logged before the box's connection closes: when the box has its answer, the record exists
        self._log(decision="allow", rule=rule, bytes_up=sent, bytes_down=received, credential=credential is not None)

    def _read_head(self, sock: Box) -> tuple[str, str, Headers] | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            try:
                chunk = self._recv(sock, 65536)
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
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not TOKEN.match(parts[0]):
            raise Denied(400, "malformed request line")
        if "*" in parts[0]:  # a token, but no method: never a request for "any method" (a rule's `*`)
            raise Denied(400, "a request method must name one method")
        self.version = parts[2]
        headers: Headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not TOKEN.match(name):  # also refuses obs-fold and `Host :` (RFC 9112 5.1)
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
            while len(buf) < offset + 5 or len(buf) < offset + 5 + int.from_bytes(buf[offset + 3 : offset + 5], "big"):
                if len(buf) > MAX_CLIENT_HELLO:
                    raise Denied(400, "TLS ClientHello too large")
                chunk = self._recv(self.sock, 16384)
                if not chunk:
                    raise Denied(400, "the tunnel closed before a TLS ClientHello")
                buf += chunk
            if buf[offset] != 0x16 or buf[offset + 1] != 0x03:
                raise Denied(400, "a CONNECT tunnel must start with a TLS ClientHello")
            length = int.from_bytes(buf[offset + 3 : offset + 5], "big")
            handshake += buf[offset + 5 : offset + 5 + length]
            offset += 5 + length
            if len(handshake) >= 4:
                if handshake[0] != 0x01:
                    raise Denied(400, "a CONNECT tunnel must start with a TLS ClientHello")
                if len(handshake) >= 4 + int.from_bytes(handshake[1:4], "big"):
                    break
        self.leftover = buf
        return client_hello_sni(handshake[4 : 4 + int.from_bytes(handshake[1:4], "big")])

    def _forward_request(
        self,
        client: Box,
        upstream: socket.socket,
        method: str,
        target: str,
        headers: Headers,
        host: str,
        port: int,
        length: int,
        credential: Credential | None,
    ) -> int:
        """Sends the checked head (our Host, no hop-by-hop headers, the credential's header replaced)
        and `length` body bytes; returns the bytes sent."""
        kept = [(k, v) for k, v in headers if not k.lower().startswith("proxy-") and k.lower() not in HOP_BY_HOP]
        if credential is not None:
            kept = [(k, v) for k, v in kept if k.lower() != credential.header.lower()] + [
                (credential.header, credential.value)
            ]
        if isinstance(
            upstream, ssl.SSLSocket
        ):  # an opened host: ask for plain bytes, so the blanking of the secret sees them;
            # no byte ranges (a slice chosen by the box could cut an echoed secret in two), no 100-continue
            kept = [(k, v) for k, v in kept if k.lower() not in ("accept-encoding", "range", "if-range", "expect")] + [
                ("Accept-Encoding", "identity")
            ]
        default = 443 if credential is not None or isinstance(upstream, ssl.SSLSocket) else 80
        kept.insert(0, ("Host", host if port == default else f"{host}:{port}"))  # exactly what was checked
        head = (
            f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept) + "Connection: close\r\n\r\n"
        ).encode("latin-1")
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

    def _pipe(self, upstream: socket.socket, client: Box) -> int:
        """A plain host's response (no secret to blank), upstream to client, until the upstream closes
        (we asked for Connection: close) or the cap."""
        received = 0
        while True:
            try:
                data = upstream.recv(65536)
            except OSError:  # ssl.SSLError is one
                data = b""
            if not data:
                return received
            received += len(data)
            if received > self.settings.max_response:
                return received
            client.sendall(data)

    def _inspected(self, upstream: ssl.SSLSocket, client: Box, method: str, redactor: Redactor) -> int:
        """The answer of an opened host, read as the box's client will read it, blanked and re-framed
        (response.py). Refused (502, in the audit) when it cannot be read so and the box has none of
        it yet; cut when that shows later. Returns the bytes received from the upstream."""
        up = Upstream(upstream.recv, self.settings.max_response)
        sent = 0

        def send(data: bytes) -> None:
            nonlocal sent
            client.sendall(data)
            sent += len(data)

        try:
            relay(up, send, redactor, method, chunked_ok=self.version == "HTTP/1.1")
        except Uninspectable as err:
            if sent:
                self._log(
                    decision="error",
                    reason=f"answer cut: {err}",
                    refused="uninspectable_response",
                    bytes_up=self.from_box,
                    bytes_down=up.received,
                    credential=self.injected,
                )
                raise Cut from None
            raise Denied(
                502,
                f"the answer of {self.audit.get('host')} cannot be inspected: {err}",
                "response check",
                "uninspectable_response",
            ) from None
        return up.received

    def _relay(self, upstream: socket.socket) -> tuple[int, int]:
        """Both ways for a passed-through tunnel, until either side closes, goes idle, or passes its cap."""
        sent = received = 0
        client = self.sock
        if self.leftover:
            upstream.sendall(self.leftover)
            sent += len(self.leftover)
            self.leftover = b""
        while True:
            ready, _, _ = select.select([client, upstream], [], [], IDLE_TIMEOUT_S)
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
                    if sent > self.settings.max_request:
                        return sent, received
                    upstream.sendall(data)
                else:
                    received += len(data)
                    if received > self.settings.max_response:
                        return sent, received
                    client.sendall(data)
        return sent, received

    def _refuse(
        self,
        status: int,
        reason: str,
        rule: str | None,
        decision: str,
        logged_reason: str | None = None,
        kind: str | None = None,
    ) -> None:
        """Records the refusal (what the box sent, what it gets back) and then answers: a JSON body naming
        the rule set and the rule, nothing of the request's headers in it. After a passed-through
        tunnel's 200 there is no answer: the tunnel just closes."""
        body = json.dumps(
            {
                "error": "egress refused",
                "reason": reason,
                "rule_set": self.settings.policy.rule_set,
                "rule": rule or "none",
                **({"refused": kind} if kind else {}),
            }
        ).encode()
        answer = (
            f"HTTP/1.1 {status} Egress Refused\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode() + body
        to, self.reply_to = self.reply_to, None
        fields: dict[str, Any] = {"rule": rule or "none"} if decision == "deny" else {}
        if kind:
            fields["refused"] = kind
        self._log(
            decision=decision,
            **fields,
            reason=logged_reason or reason,
            bytes_up=self.from_box,
            bytes_down=self.to_box + (len(answer) if to is not None else 0),
            credential=False,
        )
        if to is None:
            return
        try:
            to.sendall(answer)
        except OSError:
            pass
