"""Opt-in egress: allowed hosts through the proxy, everything else refused, no way around it."""

from __future__ import annotations

import json

import pytest

from orchestrator.config import EgressConfig, SandboxConfig
from orchestrator.sandbox.docker import DockerSandbox
from tests.helpers import make_workspace
from tests.helpers.egress import FETCH, OUTER_CIDR

pytestmark = pytest.mark.docker

DIRECT = (
    "import socket, sys\ns = socket.socket(); s.settimeout(3)\nprint('connect', s.connect_ex((sys.argv[1], 8000)))\n"
)


def fetch(box, url: str) -> str:
    box.call("write_file", {"path": "fetch.py", "content": FETCH})
    return box.call("shell", {"command": f"python3 fetch.py {url}", "timeout": 30}).output.strip()


def direct(box, ip: str) -> str:
    box.call("write_file", {"path": "direct.py", "content": DIRECT})
    return box.call("shell", {"command": f"python3 direct.py {ip}", "timeout": 30}).output.strip()


@pytest.fixture
def shared_gate_box(egress_project, docker_client, tmp_path):
    config = SandboxConfig(egress=EgressConfig(network=egress_project["internal"]))
    with DockerSandbox(make_workspace(tmp_path / "ws"), config, client=docker_client) as box:
        yield box


@pytest.fixture
def managed_gate_box(egress_project, docker_client, tmp_path):
    egress = EgressConfig(
        allow=["allowed.test:8000", "localhost:8000"], allow_cidrs=[OUTER_CIDR], outer_network=egress_project["outer"]
    )
    with DockerSandbox(make_workspace(tmp_path / "ws"), SandboxConfig(egress=egress), client=docker_client) as box:
        yield box


def test_shared_gate_allows_the_listed_server(shared_gate_box):
    assert fetch(shared_gate_box, "http://allowed.test:8000/") == "OK 19 hello from allowed"


def test_shared_gate_refuses_an_unlisted_server(shared_gate_box):
    out = fetch(shared_gate_box, "http://denied.test:8000/")
    assert out.startswith("HTTP 403") and "not on the allow-list" in out


def test_shared_gate_caps_the_response(shared_gate_box):
    out = fetch(shared_gate_box, "http://allowed.test:8000/big")
    assert not out.startswith("OK 1048576")


def test_direct_connection_skipping_the_proxy_fails(shared_gate_box, egress_project):
    assert direct(shared_gate_box, egress_project["allowed_ip"]) != "connect 0"
    env = shared_gate_box.call("shell", {"command": "env"}).output
    assert "HTTP_PROXY=http://egress-proxy:3128" in env


def test_managed_gate_allows_refuses_and_records(managed_gate_box, egress_project):
    box = managed_gate_box
    assert box.egress.proxy is not None and box.egress.network.name.startswith("oa-egress-")
    box.call("write_file", {"path": "fetch.py", "content": FETCH})
    allowed = box.call("shell", {"command": "python3 fetch.py http://allowed.test:8000/"})
    assert allowed.output.strip() == "OK 19 hello from allowed"
    assert [(r.host, r.decision) for r in allowed.egress] == [("allowed.test", "allow")]
    denied = box.call("shell", {"command": "python3 fetch.py http://denied.test:8000/"})
    assert denied.output.startswith("HTTP 403") and denied.egress[0].decision == "deny"
    # A listed name that resolves to loopback is refused after resolution (no rebinding around the list).
    loop = box.call("shell", {"command": "python3 fetch.py http://localhost:8000/"})
    assert loop.output.startswith("HTTP 403") and "refused address" in loop.output
    literal = box.call("shell", {"command": "python3 fetch.py http://127.0.0.1:8000/"})
    assert literal.output.startswith("HTTP 403") and "IP literals" in literal.output
    assert direct(box, egress_project["allowed_ip"]) != "connect 0"


def test_managed_gate_is_removed_with_the_sandbox(egress_project, docker_client, tmp_path):
    egress = EgressConfig(allow=["allowed.test:8000"], allow_cidrs=[OUTER_CIDR], outer_network=egress_project["outer"])
    with DockerSandbox(make_workspace(tmp_path / "ws"), SandboxConfig(egress=egress), client=docker_client) as box:
        network, proxy = box.egress.network_name, box.egress.proxy.name
    assert not docker_client.networks.list(names=[network])
    assert not docker_client.containers.list(all=True, filters={"name": proxy})


def test_egress_decisions_reach_the_transcript(egress_project, sandbox_image, tmp_path):
    """Through the CLI: --egress plus an admin policy naming the test network's CIDR."""
    import os
    import subprocess
    import sys

    ws = make_workspace(tmp_path / "ws", {"fetch.py": FETCH})
    admin = tmp_path / "admin.toml"
    admin.write_text(f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": "python3 fetch.py http://allowed.test:8000/"}}
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": "python3 fetch.py http://denied.test:8000/"}}
                    ]
                },
                {"text": "done"},
            ]
        )
    )
    transcript = tmp_path / "t.jsonl"
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    # The per-session proxy must reach the test servers: its outer network is the project's.
    env = {**os.environ, "OA_ADMIN_POLICY": str(admin), "OA_EGRESS_OUTER_NETWORK": egress_project["outer"]}
    proc = subprocess.run(
        [
            exe,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--egress",
            "allow:allowed.test:8000",
            "--transcript",
            str(transcript),
            "fetch",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    events = [e for e in map(json.loads, transcript.read_text().splitlines()) if e["type"] == "egress"]
    assert [(e["host"], e["decision"], e["executor"]) for e in events] == [
        ("allowed.test", "allow", "openagents"),
        ("denied.test", "deny", "openagents"),
    ]


def test_default_is_still_no_network(sandbox, docker_client):
    assert sandbox.egress is None
    # /proc/net/dev under both runtimes (gVisor, the default where registered, has no /sys/class/net)
    assert sandbox.call("shell", {"command": "tail -n +3 /proc/net/dev | cut -d: -f1"}).output.split() == ["lo"]
    assert sandbox.container.attrs["HostConfig"]["NetworkMode"] == "none"


# -- what was checked is what is reached (domain fronting), and no request makes the logs long -----
PROBE = r"""
import os, socket, ssl, sys
from urllib.parse import urlsplit

proxy = urlsplit(os.environ["HTTP_PROXY"])


def reply(sock):
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


def hello(name):
    out = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), out, server_hostname=name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


mode = sys.argv[1]
arg, extra = (bytes.fromhex(open(name).read()).decode("latin-1") for name in ("payload.hex", "extra.hex"))
sock = socket.create_connection((proxy.hostname, proxy.port), timeout=15)
if mode == "raw":
    sock.sendall(arg.encode("latin-1"))
    print(repr(reply(sock)[:300]))
else:  # tunnel: CONNECT head, then a ClientHello naming sys.argv[3], or plain bytes
    sock.sendall(arg.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    print(repr(head.split(b"\r\n")[0]))
    if head.startswith(b"HTTP/1.1 200"):
        # After the hello, an empty line: a plain-HTTP server reading it as a request line answers at once.
        sock.sendall(hello(extra) + b"\r\n\r\n" if mode == "tls" else extra.encode("latin-1"))
        print(repr(reply(sock)[:40]))
"""


PROBES = {"started": 0.0}  # when the last probe started (last_decision waits for a record newer than it)


def probe(box, mode: str, payload: str, extra: str = "") -> list[str]:
    """Runs PROBE in the box: `payload` straight to the proxy (raw), or as a CONNECT head followed by
    a ClientHello naming `extra` (tls) or by `extra` itself (plain); prints what came back."""
    import time

    for path, content in (
        ("probe.py", PROBE),
        ("payload.hex", payload.encode("latin-1").hex()),
        ("extra.hex", extra.encode("latin-1").hex()),
    ):
        assert box.call("write_file", {"path": path, "content": content}).ok
    PROBES["started"] = time.time()
    out = box.call("shell", {"command": f"python3 probe.py {mode}", "timeout": 40}).output
    return out.strip().splitlines()


def proxy_log(egress_project) -> list[bytes]:
    return egress_project["proxy"].logs(stdout=True, stderr=False).splitlines()


def last_decision(egress_project, since: float | None = None) -> dict:
    """The proxy's newest decision; Docker copies a container's stdout to its log asynchronously, so
    this waits (up to 5 s) for one newer than the last probe's start."""
    import time

    since = PROBES["started"] if since is None else since
    deadline = time.monotonic() + 5
    while True:
        records = [
            r for r in map(json.loads, proxy_log(egress_project)) if r.get("decision") in ("allow", "deny", "error")
        ]
        if (records and records[-1]["ts"] >= since - 0.01) or time.monotonic() > deadline:
            return records[-1]
        time.sleep(0.1)


@pytest.mark.parametrize(
    "host_header", ["denied.test:8000", "denied.test", "allowed.test:80", "allowed.test.evil:8000"]
)
def test_a_host_header_naming_another_host_is_refused_and_logged(shared_gate_box, egress_project, host_header):
    """Domain fronting: a request to an allowed URL whose Host header names another host is refused (403) and logged."""
    out = probe(
        shared_gate_box,
        "raw",
        f"GET http://allowed.test:8000/ HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n",
    )
    assert out[0].startswith("b'HTTP/1.1 403") and "Host header" in out[0] and "hello from" not in out[0]
    record = last_decision(egress_project)
    assert record["decision"] == "deny" and "Host header" in record["reason"] and record["host"] == "allowed.test"


def test_the_checked_host_is_the_one_asked_for(shared_gate_box, egress_project):
    """The same request with a matching Host header (or none) still works: the check is not a blanket refusal."""
    for head in ("Host: allowed.test:8000\r\n", "Host: ALLOWED.test.:8000\r\n", ""):
        out = probe(
            shared_gate_box, "raw", f"GET http://allowed.test:8000/ HTTP/1.1\r\n{head}Connection: close\r\n\r\n"
        )
        assert out[0].startswith("b'HTTP/1.0 200") and "hello from allowed" in out[0], (head, out)


@pytest.mark.parametrize(
    "smuggled",
    [
        "X-A: 1\nHost: denied.test:8000",  # a bare LF: a server splitting on LF sees a second Host
        "Host: allowed.test:8000\r\nHost: denied.test:8000",  # two Host headers
        "Host : denied.test:8000",  # whitespace before the colon
        "X-A: 1\r\n Host: denied.test:8000",  # obs-fold
    ],
)
def test_a_second_host_smuggled_into_the_head_is_refused(shared_gate_box, egress_project, smuggled):
    """A second Host header smuggled past the check (bare LF, duplicate, `Host :`, obs-fold) is refused."""
    out = probe(
        shared_gate_box, "raw", f"GET http://allowed.test:8000/ HTTP/1.1\r\n{smuggled}\r\nConnection: close\r\n\r\n"
    )
    assert out[0].startswith(("b'HTTP/1.1 400", "b'HTTP/1.1 403")) and "hello from" not in out[0], out
    assert last_decision(egress_project)["decision"] == "deny"


def test_connect_with_a_mismatching_host_header_is_refused(shared_gate_box, egress_project):
    """CONNECT to an allowed host whose Host header names another host is refused (403) and logged."""
    out = probe(
        shared_gate_box,
        "tunnel",
        "CONNECT allowed.test:8000 HTTP/1.1\r\nHost: denied.test:8000\r\n\r\n",
        "allowed.test",
    )
    assert out[0].startswith("b'HTTP/1.1 403") and len(out) == 1
    record = last_decision(egress_project)
    assert record["decision"] == "deny" and "Host header" in record["reason"]


def test_a_tls_hello_naming_another_server_is_refused(shared_gate_box, egress_project):
    """CONNECT to an allowed host, then a TLS ClientHello whose SNI names
    another server: the tunnel closes before a byte reaches the server."""
    tunnel = "CONNECT allowed.test:8000 HTTP/1.1\r\nHost: allowed.test:8000\r\n\r\n"
    refused = probe(shared_gate_box, "tls", tunnel, "denied.test")
    assert refused == ["b'HTTP/1.1 200 Connection Established'", "b''"]
    record = last_decision(egress_project)
    assert record["decision"] == "deny" and "ClientHello names denied.test" in record["reason"]
    # The same hello naming the checked host goes through: the plain-HTTP test server answers the TLS bytes.
    passed = probe(shared_gate_box, "tls", tunnel, "allowed.test")
    # (it reads the hello as an HTTP/0.9 request line and answers with a bare error page)
    assert passed[0] == "b'HTTP/1.1 200 Connection Established'" and passed[1].startswith(
        ("b'HTTP/1.0 400", "b'<!DOCTYPE HTML>")
    ), passed
    assert last_decision(egress_project)["decision"] == "allow"


def test_a_tunnel_that_does_not_start_with_tls_is_refused(shared_gate_box, egress_project):
    """A CONNECT tunnel carrying plain HTTP (whose own Host header the proxy would never see) is closed unforwarded."""
    tunnel = "CONNECT allowed.test:8000 HTTP/1.1\r\n\r\n"
    out = probe(shared_gate_box, "plain", tunnel, "GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
    assert out == ["b'HTTP/1.1 200 Connection Established'", "b''"]
    record = last_decision(egress_project)
    assert record["decision"] == "deny" and "TLS ClientHello" in record["reason"]


@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_a_60_kb_host_name_is_refused_and_never_logged_whole(shared_gate_box, egress_project, form):
    """A 60 KB host name is refused as no DNS name, and the proxy's log line stays short."""
    host = "a" * 60_000 + ".test"
    head = f"GET http://{host}:8000/ HTTP/1.1\r\n\r\n" if form == "absolute" else f"CONNECT {host}:443 HTTP/1.1\r\n\r\n"
    out = probe(shared_gate_box, "raw", head)
    assert out[0].startswith("b'HTTP/1.1 400") and "no DNS name" in out[0]
    lines = proxy_log(egress_project)
    assert max(len(line) for line in lines) < 1024
    record = json.loads(lines[-1])
    assert record["decision"] == "deny" and len(record["host"]) < 128 and "cut" in record["host"]


def test_a_flood_of_60_kb_host_names_leaves_the_transcript_bounded(egress_project, sandbox_image, tmp_path):
    """Through the CLI: denied requests with 60 KB host names leave every
    transcript line under the cap; the per-session proxy's log rotates."""
    import os
    import subprocess
    import sys

    from orchestrator.transcript import MAX_EVENT_BYTES

    flood = (
        "import os, socket\nfrom urllib.parse import urlsplit\np = urlsplit(os.environ['HTTP_PROXY'])\nfor "
        "i in range(300):\n    s = socket.create_connection((p.hostname, p.port)); s.sendall(b'GET "
        "http://' + b'x' * 60000 + b'.test/ HTTP/1.1\\r\\n\\r\\n'); s.recv(100); s.close()\nprint('sent')\n"
    )
    ws = make_workspace(tmp_path / "ws", {"flood.py": flood, "fetch.py": FETCH})
    admin = tmp_path / "admin.toml"
    admin.write_text(f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {"tool_calls": [{"name": "shell", "arguments": {"command": "python3 flood.py", "timeout": 120}}]},
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": "python3 fetch.py http://allowed.test:8000/"}}
                    ]
                },
                {"text": "done"},
            ]
        )
    )
    transcript = tmp_path / "t.jsonl"
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    env = {**os.environ, "OA_ADMIN_POLICY": str(admin), "OA_EGRESS_OUTER_NETWORK": egress_project["outer"]}
    proc = subprocess.run(
        [
            exe,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--egress",
            "allow:allowed.test:8000",
            "--transcript",
            str(transcript),
            "flood",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    raw = transcript.read_bytes().splitlines()
    assert max(len(line) for line in raw) <= MAX_EVENT_BYTES
    events = [json.loads(line) for line in raw]
    egress = [e for e in events if e["type"] == "egress"]
    denied = [e for e in egress if e["decision"] == "deny"]
    assert denied and all(len(e["host"]) < 128 and len(json.dumps(e)) < 2048 for e in denied)
    assert (
        egress[-2]["decision"] == "omitted" and "100 more" in egress[-2]["reason"]
    )  # 300 decisions, 200 recorded, one line for the rest
    assert (egress[-1]["host"], egress[-1]["decision"]) == ("allowed.test", "allow")


def test_the_per_session_proxy_keeps_a_rotated_log(managed_gate_box):
    """The per-session proxy logs to a size-capped, rotated json-file (drain() reads its decisions from there)."""
    managed_gate_box.egress.proxy.reload()
    assert managed_gate_box.egress.proxy.attrs["HostConfig"]["LogConfig"] == {
        "Type": "json-file",
        "Config": {"max-file": "3", "max-size": "10m"},
    }
