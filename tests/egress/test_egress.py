"""Opt-in egress: allowed hosts through the proxy, everything else refused, no way around it."""
from __future__ import annotations

import json

import pytest

from orchestrator.config import EgressConfig, SandboxConfig
from orchestrator.sandbox.docker import DockerSandbox
from tests.conftest import make_workspace
from tests.egress.conftest import OUTER_CIDR

pytestmark = pytest.mark.docker

FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    body = urllib.request.urlopen(sys.argv[1], timeout=10).read()\n"
    "    print('OK', len(body), body[:40].decode(errors='replace').strip())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print('HTTP', e.code, e.read().decode(errors='replace')[:200])\n"
    "except Exception as e:\n"
    "    print('FAIL', type(e).__name__, e)\n"
)
DIRECT = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(3)\n"
    "print('connect', s.connect_ex((sys.argv[1], 8000)))\n"
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
    egress = EgressConfig(allow=["allowed.test:8000", "localhost:8000"], allow_cidrs=[OUTER_CIDR], outer_network=egress_project["outer"])
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
    assert [(r["host"], r["decision"]) for r in allowed.meta["egress"]] == [("allowed.test", "allow")]
    denied = box.call("shell", {"command": "python3 fetch.py http://denied.test:8000/"})
    assert denied.output.startswith("HTTP 403") and denied.meta["egress"][0]["decision"] == "deny"
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
    script.write_text("\n".join(json.dumps(t) for t in [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "python3 fetch.py http://allowed.test:8000/"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "python3 fetch.py http://denied.test:8000/"}}]},
        {"text": "done"},
    ]))
    transcript = tmp_path / "t.jsonl"
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    # The per-session proxy must reach the test servers: its outer network is the project's.
    env = {**os.environ, "OA_ADMIN_POLICY": str(admin), "OA_EGRESS_OUTER_NETWORK": egress_project["outer"]}
    proc = subprocess.run([exe, "run", "--workspace", str(ws), "--model", f"script:{script}", "--non-interactive", "--egress", "allow:allowed.test:8000",
                           "--transcript", str(transcript), "fetch"], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    events = [e for e in map(json.loads, transcript.read_text().splitlines()) if e["type"] == "egress"]
    assert [(e["host"], e["decision"], e["executor"]) for e in events] == [("allowed.test", "allow", "openagents"), ("denied.test", "deny", "openagents")]


def test_default_is_still_no_network(sandbox, docker_client):
    assert sandbox.egress is None
    assert sandbox.call("shell", {"command": "ls /sys/class/net"}).output.split() == ["lo"]
    assert sandbox.container.attrs["HostConfig"]["NetworkMode"] == "none"
