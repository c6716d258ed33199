"""Red team (issue 10, finding 7 variants): what the egress proxy checked must be all it forwards.

The proxy runs here in-process on 127.0.0.1 (its real Server and Handler), in front of a lenient
upstream on loopback that, like many servers and CDNs, keeps reading requests on a connection after
answering one. The client is a plain socket speaking raw HTTP, as a box's program would."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.redteam_egress import (
    PLACEHOLDER,
    TOKEN,
    LenientUpstream,
    _gate_with,
    _get,
    _send,
    _status,
    _tls_exchange,
)


@pytest.fixture
def gate(proxy_module):
    upstream = LenientUpstream()
    settings = proxy_module.Settings(
        proxy_module.Policy(f"localhost:{upstream.port}", "127.0.0.0/8,::1/128"),
        audit=proxy_module.AuditLog(sink=lambda fields: None),
    )  # the decisions are not what these tests read
    server = proxy_module.Server(("127.0.0.1", 0), settings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], upstream
    server.shutdown()
    server.server_close()
    upstream.close()


def test_redteam_a_pipelined_second_request_never_reaches_upstream(gate):
    """A second request pipelined after an allowed one (its own Host:
    another site) is not relayed to the upstream connection."""
    port, upstream = gate
    allowed = f"localhost:{upstream.port}".encode()
    first = b"GET http://" + allowed + b"/ HTTP/1.1\r\nHost: " + allowed + b"\r\n\r\n"
    second = b"GET /secret HTTP/1.1\r\nHost: fronted.example\r\n\r\n"
    _send(port, first + second)
    assert upstream.closed.acquire(timeout=30)
    assert upstream.hosts() and all(h == allowed for h in upstream.hosts()), upstream.heads


def test_redteam_a_request_smuggled_in_a_body_under_two_content_lengths_is_refused(gate):
    """Two Content-Length headers (the proxy reads one, the
    upstream may read the other) are refused, never forwarded."""
    port, upstream = gate
    allowed = f"localhost:{upstream.port}".encode()
    smuggled = b"GET /secret HTTP/1.1\r\nHost: fronted.example\r\n\r\n"
    request = (
        b"POST http://" + allowed + b"/ HTTP/1.1\r\nHost: " + allowed + b"\r\nContent-Length: 0\r\n"
        b"Content-Length: " + str(len(smuggled)).encode() + b"\r\n\r\n" + smuggled
    )
    reply = _send(port, request)
    assert b"fronted.example" not in b"".join(upstream.hosts())
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert upstream.heads == []


# -- issue 29: rules by method and path, credential injection, a hostile box (attack tests first) ----
# The gate in-process on 127.0.0.1 again; the "real" API is a TLS server on loopback with its own CA
# (made by SessionCA, as the host makes the gate's), which records every request it receives.
import json  # noqa: E402
import ssl  # noqa: E402


class TLSUpstream:
    """An HTTPS API on loopback: records each request (head, body); /echo reflects the headers,
    /redirect points elsewhere, anything else answers whether the token arrived."""

    def __init__(self, cert_dir: Path, leaf: dict[str, str]) -> None:
        (cert_dir / "up.pem").write_text(leaf["cert"] + leaf["key"])
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert_dir / "up.pem"))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, raw: socket.socket) -> None:
        raw.settimeout(5)
        try:
            conn = self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        buf = b""
        with conn:
            try:
                while True:  # lenient: keeps reading requests on the connection, like LenientUpstream
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    length = next(
                        (
                            int(f.split(b":", 1)[1])
                            for f in head.split(b"\r\n")[1:]
                            if f.lower().startswith(b"content-length:")
                        ),
                        0,
                    )
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    body, buf = buf[:length], buf[length:]
                    self.requests.append((head, body))
                    path = head.split(b" ")[1]
                    if path == b"/echo":
                        status, out = b"200 OK", head
                    elif path == b"/redirect":
                        status, out = b"302 Found\r\nLocation: https://other.test/steal", b"moved"
                    else:
                        status, out = (
                            b"200 OK",
                            json.dumps(
                                {"authorized": f"Authorization: Bearer {TOKEN}".encode() in head.split(b"\r\n")}
                            ).encode(),
                        )
                    conn.sendall(
                        b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(out)).encode() + b"\r\n\r\n" + out
                    )
                    if b"\r\nconnection: close" in head.lower():
                        return
            except (OSError, ssl.SSLError):
                return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def api_gate(proxy_module, cas, tmp_path):
    """The gate with a credential for localhost:PORT and rules: GET /repos/org/* allowed, DELETE
    anywhere denied, POST /repos/org/issues allowed, /echo and /redirect allowed; nothing else."""
    world, gate_ca = cas
    upstream = TLSUpstream(tmp_path, world.leaves["localhost"])
    rules = [
        {"action": "deny", "host": "*", "port": upstream.port, "methods": ["DELETE"]},
        {"action": "allow", "host": "localhost", "port": upstream.port, "methods": ["GET"], "path": "/repos/org/*"},
        {
            "action": "allow",
            "host": "localhost",
            "port": upstream.port,
            "methods": ["POST"],
            "path": "/repos/org/issues",
        },
        {"action": "allow", "host": "localhost", "port": upstream.port, "methods": ["GET"], "path": "/echo"},
        {"action": "allow", "host": "localhost", "port": upstream.port, "methods": ["GET"], "path": "/redirect"},
    ]
    server, records = _gate_with(proxy_module, rules, world.ca_pem, gate_ca.leaves, upstream.port)
    yield server.server_address[1], upstream, records, gate_ca
    server.shutdown()
    server.server_close()
    upstream.close()


def test_redteam_credential_is_injected_and_the_box_gets_only_the_answer(api_gate):
    """An allowed GET with the placeholder: the real API receives the
    token, the box's reply does not hold it, the audit says injected."""
    port, upstream, records, ca = api_gate
    head, reply = _tls_exchange(port, upstream.port, ca.ca_pem, _get("/repos/org/x?token=abc", port=upstream.port))
    assert _status(reply) == 200 and b'"authorized": true' in reply and TOKEN.encode() not in reply
    ((sent, _),) = upstream.requests
    assert f"Authorization: Bearer {TOKEN}".encode() in sent.split(b"\r\n") and PLACEHOLDER.encode() not in sent
    record = records[-1]
    assert record["decision"] == "allow" and record["credential"] is True and record["tls"] == "intercepted"
    assert (
        record["path"] == "/repos/org/x"
        and record["bytes_up"] > 0
        and record["bytes_down"] > 0
        and "rules[1]" in record["rule"]
    )
    assert TOKEN not in json.dumps(records)


@pytest.mark.parametrize("where", ["url", "body", "header"])
def test_redteam_the_placeholder_elsewhere_is_never_replaced(api_gate, where):
    """The placeholder in the URL, the body or another header reaches
    the API as itself: the gate fills one header, nowhere else."""
    port, upstream, records, ca = api_gate
    if where == "url":
        request = _get(f"/repos/org/{PLACEHOLDER}?q={PLACEHOLDER}", port=upstream.port)
    elif where == "body":
        request = _get(
            "/repos/org/issues", method="POST", body=f'{{"title": "{PLACEHOLDER}"}}'.encode(), port=upstream.port
        )
    else:
        request = _get("/repos/org/x", f"X-Token: {PLACEHOLDER}", f"Cookie: t={PLACEHOLDER}", port=upstream.port)
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, request)
    assert _status(reply) == 200 and TOKEN.encode() not in reply
    ((head, body),) = upstream.requests
    assert (head + body).count(TOKEN.encode()) == 1 and PLACEHOLDER.encode() in head + body


def test_redteam_an_echoing_api_does_not_hand_the_secret_back(api_gate):
    """An API that reflects request headers: the gate blanks the
    secret in the response (same length, the framing stays true)."""
    port, upstream, _, ca = api_gate
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, _get("/echo", port=upstream.port))
    assert _status(reply) == 200 and TOKEN.encode() not in reply and b"*" * len(TOKEN) in reply
    assert TOKEN.encode() in upstream.requests[0][0]  # the API did get it


@pytest.mark.parametrize(
    ("method", "path", "status", "rule"),
    [
        ("DELETE", "/repos/org/x", 403, "rules[0]"),
        ("GET", "/repos/other/x", 403, "default deny"),
        ("PUT", "/repos/org/x", 403, "default deny"),
        ("GET", "/repos/org/../other/x", 403, "default deny"),  # resolved (as servers do) before any rule reads it
        ("GET", "/repos/org/%2e%2e/other", 403, "default deny"),
        ("GET", "/repos/org%2fx/../../admin", 400, None),
        ("GET", "//repos/other/x", 403, "default deny"),
        ("GET", "/repos/org/\\..\\admin", 400, None),
        ("GET", "/repos/org/%zz", 400, None),
        ("GET", "/repos/org/x%00", 400, None),
    ],
)
def test_redteam_rules_by_method_and_path_refuse_and_name_the_rule_set(api_gate, method, path, status, rule):
    """A denied method or path (dot segments and repeated slashes resolved first) gets a JSON 403 naming the rule set
    and rule; an ambiguous path (an encoded slash, a backslash, an invalid escape, NUL) a 400; the API sees nothing."""
    port, upstream, records, ca = api_gate
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, _get(path, method=method, port=upstream.port))
    assert _status(reply) == status, reply[:300]
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["rule_set"] == "test rule set" and (rule is None or rule in body["rule"])
    assert upstream.requests == [] and TOKEN.encode() not in reply
    assert records[-1]["decision"] == "deny" and records[-1]["method"] == method


@pytest.mark.parametrize(
    "smuggle",
    [
        "Content-Length: 0\r\nContent-Length: 44",
        "Content-Length: 44\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked",
    ],
)
def test_redteam_smuggling_inside_the_opened_tunnel_is_refused(api_gate, smuggle):
    """Two Content-Lengths, CL+TE, chunked: refused before anything (or any token) reaches the API."""
    port, upstream, _, ca = api_gate
    hidden = b"GET /admin HTTP/1.1\r\nHost: localhost\r\n\r\n"
    request = _get("/repos/org/issues", smuggle, method="POST", port=upstream.port) + b"0\r\n\r\n" + hidden
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, request)
    assert _status(reply) in (400, 411) and upstream.requests == []


def test_redteam_a_pipelined_request_inside_the_tunnel_never_reaches_the_api(api_gate):
    """An allowed request, then a second one (a denied path) on the same TLS connection: only the first is forwarded."""
    port, upstream, _, ca = api_gate
    _, reply = _tls_exchange(
        port,
        upstream.port,
        ca.ca_pem,
        _get("/repos/org/x", port=upstream.port) + _get("/admin", method="DELETE", port=upstream.port),
    )
    assert _status(reply) == 200
    assert [head.split(b"\r\n")[0] for head, _ in upstream.requests] == [b"GET /repos/org/x HTTP/1.1"]


def test_redteam_http2_is_never_spoken_and_an_h2c_upgrade_is_not_forwarded(api_gate):
    """ALPN h2 is not chosen; an `Upgrade: h2c` request goes out without it; an h2 preface is a malformed request."""
    port, upstream, _, ca = api_gate
    _, reply = _tls_exchange(
        port,
        upstream.port,
        ca.ca_pem,
        _get(
            "/repos/org/x",
            "Connection: Upgrade, HTTP2-Settings",
            "Upgrade: h2c",
            "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
            port=upstream.port,
        ),
        alpn=["h2"],
    )
    assert _status(reply) == 200
    head = upstream.requests[0][0].lower()
    assert b"upgrade" not in head and b"http2-settings" not in head
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert _status(reply) == 400 and len(upstream.requests) == 1


def test_redteam_sni_or_host_naming_another_server_is_refused(api_gate):
    """A ClientHello naming another server than the CONNECT, or an inner Host header naming another, gets nowhere."""
    port, upstream, records, ca = api_gate
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, _get("/repos/org/x", port=upstream.port), sni="other.test")
    assert reply.startswith(b"handshake failed") and upstream.connections == 0
    # the gate's thread records the refusal after the client already saw its handshake fail
    deadline = time.monotonic() + 5
    while not records and time.monotonic() < deadline:
        time.sleep(0.02)
    assert records[-1]["decision"] == "deny" and "other.test" in records[-1]["reason"]
    request = f"GET /repos/org/x HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n".encode()
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, request)
    assert _status(reply) == 403 and b"Host header" in reply and upstream.requests == []


def test_redteam_a_redirect_to_another_host_is_relayed_not_followed(api_gate):
    """The API's 302 to another host reaches the box as is; the gate
    follows nothing, and that host is refused (default deny)."""
    port, upstream, _, ca = api_gate
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, _get("/redirect", port=upstream.port))
    assert _status(reply) == 302 and b"Location: https://other.test/steal" in reply and len(upstream.requests) == 1
    refused = _send(port, b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 403") and b"test rule set" in refused


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /repos/org/x HTTP/1.1\r\nHost: localhost\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /repos/org/x HTTP/1.1\r\nHost: localhost\nX-A: 1\r\n\r\n",
        b"GET /repos/org/x HTTP/9.9\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello\r\n\r\n",
    ],
)
def test_redteam_malformed_or_huge_requests_inside_the_tunnel_are_refused(api_gate, raw):
    """Garbage, a 70 KB header, a bare LF, an unknown version: 400/431, the API sees no request."""
    port, upstream, _, ca = api_gate
    _, reply = _tls_exchange(port, upstream.port, ca.ca_pem, raw)
    assert _status(reply) in (400, 431) and upstream.requests == []


def test_redteam_the_gate_never_sends_the_token_to_an_unverified_server(proxy_module, cas, tmp_path):
    """The gate does not trust the API's CA: TLS to it fails verification, and no request (no token) is sent."""
    world, gate_ca = cas
    upstream = TLSUpstream(tmp_path, world.leaves["localhost"])
    rules = [{"action": "allow", "host": "localhost", "port": upstream.port}]
    server, records = _gate_with(proxy_module, rules, "", gate_ca.leaves, upstream.port)
    try:
        _, reply = _tls_exchange(
            server.server_address[1], upstream.port, gate_ca.ca_pem, _get("/repos/org/x", port=upstream.port)
        )
        assert _status(reply) == 502 and upstream.requests == []
        assert records[-1]["decision"] == "error" and "CERTIFICATE_VERIFY_FAILED" in records[-1]["reason"]
    finally:
        server.shutdown()
        server.server_close()
        upstream.close()


def test_redteam_narrow_rules_on_a_passed_through_host_refuse_the_tunnel(proxy_module):
    """Without a credential rule the gate cannot see a tunnel's requests: a host with
    a method/path rule (or a narrow deny) is refused, a whole-host allow passes."""
    policy = proxy_module.Policy(
        "",
        "",
        json.dumps(
            [
                {"action": "deny", "host": "*", "methods": ["DELETE"]},
                {"action": "allow", "host": "api.example", "methods": ["GET"], "path": "/repos/*"},
                {"action": "allow", "host": "cdn.example"},
            ]
        ),
        "rs",
    )
    allowed, rule, why = policy.tunnel("api.example", 443)
    assert not allowed and "rules[0]" in rule and "cannot show" in why
    policy = proxy_module.Policy(
        "",
        "",
        json.dumps(
            [{"action": "allow", "host": "api.example", "methods": ["GET"]}, {"action": "allow", "host": "cdn.example"}]
        ),
        "rs",
    )
    assert policy.tunnel("api.example", 443)[0] is False and "deny by default" in policy.tunnel("api.example", 443)[2]
    assert policy.tunnel("cdn.example", 443)[:2] == (True, "rules[1] (allow * cdn.example)")
    assert policy.request("api.example", 80, "GET", "/x") == (True, "rules[0] (allow GET api.example)")
    assert policy.request("api.example", 80, "POST", "/x") == (False, "default deny")


def test_redteam_plain_http_to_a_credential_host_gets_no_credential(api_gate):
    """The credential goes only into re-originated TLS: a plain
    http:// request to the same host and port is sent without it."""
    port, upstream, records, _ = api_gate
    reply = _send(
        port,
        (
            f"GET http://localhost:{upstream.port}/repos/org/x HTTP/1.1\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n"
        ).encode(),
    )
    assert TOKEN.encode() not in reply and records[-1]["credential"] is False


def test_redteam_widened_rules_come_last_and_a_once_rule_is_used_once(proxy_module, tmp_path):
    """Rules the person widened (the live file) decide only what no configured rule matched, an
    allow-once rule lets exactly one request through (also under a race), a session rule stays."""
    live = tmp_path / "live.json"
    policy = proxy_module.Policy(
        "", "", json.dumps([{"action": "deny", "host": "api.example", "path": "/private*"}]), "rs"
    )
    policy.live_file = str(live)
    live.write_text(json.dumps([{"id": 0, "once": True, "host": "api.example", "methods": ["GET"], "path": "/*"}]))
    assert policy.request("api.example", 443, "GET", "/private/x") == (False, "rules[0] (deny * api.example/private*)")
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(policy.request("api.example", 443, "GET", "/a")[0]))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    live.write_text(
        json.dumps(
            [
                {"id": 0, "once": True, "host": "api.example", "methods": ["GET"], "path": "/*"},
                {"id": 1, "host": "api.example", "methods": ["GET"], "path": "/*"},
            ]
        )
    )
    assert [policy.request("api.example", 443, "GET", "/a")[1] for _ in range(3)] == [
        "widened[1] (allow GET api.example/*)"
    ] * 3
    assert policy.request("api.example", 443, "POST", "/a") == (False, "default deny")
    assert policy.tunnel("api.example", 443)[0] is False  # a method/path rule never opens a tunnel it cannot see into
