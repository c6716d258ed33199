"""Red team (issue 40, classes 2 and 3): the gate's checks hold on what the far side decodes.

The gate runs in-process on 127.0.0.1 (its real Server and Handler) with a credential for a TLS
API on loopback (its own CA, as in test_redteam_egress.py). That API is hostile only in the way
ordinary servers are: it echoes the request it got (a debugging endpoint), in a chunked answer whose
chunk boundaries the box moves by padding its own header, compressed although the gate asked for
identity, or encoded (base64, percent, hex, JSON escapes); and it routes the way common servers do
(percent-decoded, dot segments resolved, slashes merged, case-insensitive). The box's client here
decodes what it gets the way http.client and curl do (de-chunks, gunzips), and then looks for the token.
"""

from __future__ import annotations

import base64
import gzip
import json
import posixpath
import socket
import ssl
import threading
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from tests.helpers.redteam_egress import TOKEN, _gate_with, _get, _status, _tls_exchange

CHUNK = 16  # the echoing API's chunk size


def _echo_body(kind: str, head: bytes) -> bytes:
    if kind == "b64":
        return base64.b64encode(head)
    if kind == "b64url":
        return base64.urlsafe_b64encode(head).rstrip(b"=")
    if kind == "pct":
        return quote(head, safe="").encode()
    if kind == "pctlower":
        return "".join(f"%{b:02x}" for b in head).encode()
    if kind == "hex":
        return head.hex().encode()
    if kind == "HEX":
        return head.hex().upper().encode()
    if kind == "json":  # JSON with \u escapes, mixed with plain characters as serializers mix them
        text = "".join(
            chr(b) if i % 2 == 0 and (chr(b).isalnum() or chr(b) in " -_.:") else f"\\u{b:04x}"
            for i, b in enumerate(head)
        )
        return b'{"headers": "' + text.encode() + b'"}'
    if kind == "upper":
        return head.upper()
    return head


class EchoAPI:
    """An HTTPS API on loopback that answers each request by what its path asks for, and records
    the path each request was routed to (percent-decoded, dot segments resolved, slashes merged,
    lower case: what common servers do before routing)."""

    def __init__(self, cert_dir: Path, leaf: dict[str, str]) -> None:
        (cert_dir / "echo.pem").write_text(leaf["cert"] + leaf["key"])
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert_dir / "echo.pem"))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.targets: list[bytes] = []  # the request-targets as received
        self.routed: list[str] = []  # the paths they were routed to
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, raw: socket.socket) -> None:
        raw.settimeout(5)
        try:
            with self.context.wrap_socket(raw, server_side=True) as conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head = buf.split(b"\r\n\r\n", 1)[0]
                target = head.split(b" ")[1]
                self.targets.append(target)
                routed = posixpath.normpath("/" + unquote(target.split(b"?")[0].decode("latin-1")).lstrip("/")).lower()
                self.routed.append(routed)
                conn.sendall(self._answer(routed, head))
        except (OSError, ssl.SSLError):
            return

    def _answer(self, routed: str, head: bytes) -> bytes:
        kind = routed.strip("/").split("/")[-1]
        if routed.startswith("/admin"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nadmin served\n"
        if kind == "chunked":  # the echo in CHUNK-byte chunks: a chunk-size line lands inside the token
            body = b"".join(
                b"%x\r\n%s\r\n" % (len(head[i : i + CHUNK]), head[i : i + CHUNK]) for i in range(0, len(head), CHUNK)
            )
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
        if kind == "big":  # over the gate's 1 MiB buffer: the echo in the middle of 1.5 MiB, in 4093-byte chunks
            data = b"x" * (3 << 19) + head + b"y" * 5000
            body = b"".join(
                b"%x\r\n%s\r\n" % (len(data[i : i + 4093]), data[i : i + 4093]) for i in range(0, len(data), 4093)
            )
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
        if kind in (
            "gzip",
            "br",
            "gzip2",
        ):  # compressed although the gate asked for identity (br: a coding it cannot read)
            body = gzip.compress(head) if kind != "gzip2" else gzip.compress(b"first member\n") + gzip.compress(head)
            kind = "gzip" if kind == "gzip2" else kind  # gzip2: two members, as gzip allows and clients decode
            return (
                b"HTTP/1.1 200 OK\r\nContent-Encoding: "
                + kind.encode()
                + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
        if kind == "upgrade":
            return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + head
        if kind == "h2":
            return b"\x00\x00\x12\x04\x00\x00\x00\x00\x00" + head
        if kind == "header":  # the secret echoed in a response header
            return b"HTTP/1.1 204 No Content\r\nX-Echo: " + head.replace(b"\r\n", b" | ") + b"\r\n\r\n"
        body = _echo_body(kind, head)
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def echo_gate(proxy_module, cas, tmp_path):  # noqa: F811
    """The gate with a credential for the echo API: every GET allowed but `deny /admin*`."""
    world, gate_ca = cas
    api = EchoAPI(tmp_path, world.leaves["localhost"])
    rules = [
        {"action": "deny", "host": "localhost", "port": api.port, "path": "/admin*"},
        {"action": "allow", "host": "localhost", "port": api.port, "methods": ["GET", "HEAD"]},
    ]
    server, records = _gate_with(proxy_module, rules, world.ca_pem, gate_ca.leaves, api.port)
    yield server.server_address[1], api, records, gate_ca
    server.shutdown()
    server.server_close()
    api.close()


def _decoded(reply: bytes) -> tuple[int, dict[str, str], bytes]:
    """What the box's HTTP client makes of the reply: status, headers, the body de-chunked and gunzipped."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        body = out
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    if headers.get("content-encoding", "").lower() == "gzip":
        body = gzip.decompress(body)
    return _status(reply), headers, body


def _leaks(body: bytes) -> bool:
    """The token, in any form the box could decode from the body."""
    token = TOKEN.encode()
    forms = [body, body.upper(), body.lower()]
    for shift in range(4):
        text = body[shift:].strip()
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                forms.append(decode(text + b"=" * (-len(text) % 4)))
            except ValueError:
                pass
        try:
            forms.append(bytes.fromhex(text[: len(text) // 2 * 2].decode("latin-1")))
        except ValueError:
            pass
    forms.append(unquote(body.decode("latin-1")).encode("latin-1"))
    try:
        forms.append(json.loads(body)["headers"].encode("latin-1"))
    except (ValueError, KeyError, TypeError):
        pass
    return any(token.lower() in f.lower() for f in forms)


def _ask(port: int, api: EchoAPI, ca: str, path: str, pad: int = 0, method: str = "GET") -> bytes:
    return _tls_exchange(port, api.port, ca, _get(path, f"X-Pad: {'p' * pad}", method=method, port=api.port))[1]


def test_redteam_a_chunk_boundary_moved_into_the_echoed_token_does_not_hand_it_over(echo_gate):
    """The echo answers in 16-byte chunks; the box pads its header 0..15 bytes so that a chunk-size
    line falls at every place inside the token: once its client de-chunks, the token is never whole."""
    port, api, records, ca = echo_gate
    for pad in range(CHUNK):
        reply = _ask(port, api, ca.ca_pem, "/echo/chunked", pad)
        status, headers, body = _decoded(reply)
        assert status == 200 and b"Authorization: " in body, reply[:300]
        assert not _leaks(body) and TOKEN.encode() not in reply, f"pad {pad}: the token reached the box"
    assert records[-1]["credential"] is True and records[-1]["decision"] == "allow"


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
def test_redteam_a_long_answer_is_streamed_blanked_and_reframed(echo_gate, version):
    """Past the gate's buffer the answer streams (its own chunking for HTTP/1.1, up to the close for
    HTTP/1.0): the echoed token in the middle of 1.5 MiB is blanked all the same, nothing is lost."""
    port, api, _, ca = echo_gate
    request = _get("/echo/big", port=api.port).replace(b"HTTP/1.1\r\n", version.encode() + b"\r\n", 1)
    reply = _tls_exchange(port, api.port, ca.ca_pem, request)[1]
    status, headers, body = _decoded(reply)
    assert status == 200 and "content-length" not in headers
    assert headers.get("transfer-encoding") == ("chunked" if version == "HTTP/1.1" else None)
    assert (
        body.startswith(b"x" * (3 << 19))
        and body.endswith(b"y" * 5000)
        and b"Authorization: " in body
        and not _leaks(body)
    )


@pytest.mark.parametrize("kind", ["b64", "b64url", "pct", "pctlower", "hex", "HEX", "json", "upper", "header"])
def test_redteam_an_encoded_echo_of_the_token_is_blanked(echo_gate, kind):
    """The echo writes the request (with the injected token) base64 (both alphabets, each alignment the
    box's padding picks), percent-encoded (either hex case), hex (either case), JSON-escaped, upper case,
    or into a response header: the box decodes none of them back to the token."""
    port, api, _, ca = echo_gate
    for pad in range(3):
        reply = _ask(port, api, ca.ca_pem, f"/echo/{kind}", pad)
        status, headers, body = _decoded(reply)
        assert status in (200, 204), reply[:300]
        assert not _leaks(body) and not _leaks(json.dumps(headers).encode()), (
            f"{kind}, pad {pad}: the token reached the box"
        )


def test_redteam_a_gzip_answer_despite_identity_is_decoded_and_blanked(echo_gate):
    """The API gzips its echo although the gate asked for identity: the gate decodes it, blanks the
    token, and the box gets a plain body with an exact Content-Length."""
    port, api, _, ca = echo_gate
    reply = _ask(port, api, ca.ca_pem, "/echo/gzip")
    status, headers, body = _decoded(reply)
    assert status == 200 and "content-encoding" not in headers and int(headers["content-length"]) == len(body)
    assert b"Authorization: " in body and not _leaks(body)


@pytest.mark.parametrize(
    ("kind", "why"),
    [("br", "Content-Encoding"), ("upgrade", "protocol upgrade"), ("h2", "HTTP/2"), ("gzip2", "more than one member")],
)
def test_redteam_an_answer_the_gate_cannot_read_is_refused_typed(echo_gate, kind, why):
    """A coding the gate cannot decode, a 101 upgrade, an HTTP/2 frame: refused (502, typed in the body
    and the audit) before the box gets a byte of the answer."""
    port, api, records, ca = echo_gate
    reply = _ask(port, api, ca.ca_pem, f"/echo/{kind}")
    assert _status(reply) == 502 and not _leaks(reply) and b"Bearer" not in reply, reply[:300]
    answer = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert answer["refused"] == "uninspectable_response" and why in answer["reason"]
    assert records[-1]["decision"] == "deny" and records[-1]["refused"] == "uninspectable_response"


@pytest.mark.parametrize(
    "path",
    [
        "/%61dmin/keys",
        "/ADMIN/keys",
        "/Admin/keys",
        "/x/../admin/keys",
        "//admin/keys",
        "/%2e%2e/admin/keys",
        "/./admin/keys",
        "/%41DMIN/keys",
        "/admin%2Fkeys",
        "/adm%69n;x/keys",
        "/admin%zz",
    ],
)
def test_redteam_a_deny_rule_holds_on_every_spelling_the_server_routes_the_same(echo_gate, path):
    """`deny /admin*` on the credentialed host: no spelling the server routes to /admin (an escaped
    letter, another case, dot segments, doubled slashes) reaches it; each is refused (403 by the deny
    rule, or 400 when the spelling is ambiguous)."""
    port, api, _, ca = echo_gate
    reply = _ask(port, api, ca.ca_pem, path)
    assert _status(reply) in (400, 403), reply[:300]
    assert not any(r.startswith("/admin") for r in api.routed), api.routed


def test_redteam_what_the_rules_saw_is_what_the_server_gets(echo_gate):
    """An allowed request goes out in the one canonical form the rules read: unreserved escapes
    decoded, other escapes upper case, dot segments resolved, slashes merged; the query as sent."""
    port, api, records, ca = echo_gate
    reply = _ask(port, api, ca.ca_pem, "/%7Erepos/./a//b/../c%2a%c3%a9?q=%2F1")
    assert _status(reply) == 200
    assert api.targets == [b"/~repos/a/c%2A%C3%A9?q=%2F1"] and records[-1]["path"] == "/~repos/a/c%2A%C3%A9"


def test_redteam_a_star_method_is_refused_not_read_as_any(proxy_module):  # noqa: F811
    """`*` is a token but names no method: the gate refuses it as a request method (a widening offer
    built from it would otherwise read as "every method")."""
    records: list[dict] = []
    settings = proxy_module.Settings(
        proxy_module.Policy("", "127.0.0.0/8", "[]", "rs"), audit=proxy_module.AuditLog(sink=records.append)
    )
    server = proxy_module.Server(("127.0.0.1", 0), settings)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(server.server_address, timeout=10) as sock:
            sock.sendall(b"* http://localhost:1/only-this HTTP/1.1\r\nHost: localhost:1\r\n\r\n")
            reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 400") and b"one method" in reply
        assert records[-1]["decision"] == "deny" and records[-1]["rule"] == "none"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/%61dmin/keys", "/ADMIN/keys", "/x/../admin/keys", "//admin/keys"])
def test_redteam_a_deny_rule_holds_on_plain_http_too(proxy_module, path):  # noqa: F811
    """The same spellings through plain http (no credential, the
    gate reads the request itself): refused, nothing forwarded."""
    from tests.helpers.redteam_egress import LenientUpstream, _send

    upstream = LenientUpstream()
    rules = [
        {"action": "deny", "host": "localhost", "port": upstream.port, "path": "/admin*"},
        {"action": "allow", "host": "localhost", "port": upstream.port},
    ]
    settings = proxy_module.Settings(
        proxy_module.Policy("", "127.0.0.0/8", json.dumps(rules), "rs"),
        audit=proxy_module.AuditLog(sink=lambda fields: None),
    )
    server = proxy_module.Server(("127.0.0.1", 0), settings)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        authority = f"localhost:{upstream.port}"
        reply = _send(
            server.server_address[1], f"GET http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
        )
        assert reply.startswith(b"HTTP/1.1 403") and b"/admin*" in reply and upstream.heads == []
        _send(
            server.server_address[1], f"GET http://{authority}/a/./b//c HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
        )
        assert upstream.closed.acquire(timeout=30) and upstream.heads[0].split(b"\r\n")[0] == b"GET /a/b/c HTTP/1.1"
    finally:
        server.shutdown()
        server.server_close()
        upstream.close()


def test_redteam_a_rule_written_with_escapes_matches_the_canonical_form(proxy_module):  # noqa: F811
    """An admin's `deny /%61dmin*` is compared in the same
    canonical form as requests: it holds on /admin/x and /ADMIN."""
    policy = proxy_module.Policy(
        "",
        "",
        json.dumps(
            [{"action": "deny", "host": "api.example", "path": "/%61dmin*"}, {"action": "allow", "host": "api.example"}]
        ),
        "rs",
    )
    assert [policy.request("api.example", 443, "GET", p)[0] for p in ("/admin/x", "/ADMIN", "/other")] == [
        False,
        False,
        True,
    ]
