"""Issue 41 item 4: a widening offer allows exactly the request that was shown, nothing wider.

A real per-session gate (EgressGate, its own container on an internal network this test makes; the
request is made from inside the gate's container to its own port, so nothing leaves it). Its refusal
is drained from its log like any call's, recorded by the real call pipeline, offered at the terminal
(the TerminalApprover reading a pty), answered y (once), a (session) or n; then the test reads the
gate's live rules back and asks the gate again: the shown request passes (a 502: allowed, but
denied.test does not resolve), the same path with another method, another case or a string its glob
characters would match does not (403, default deny), and a once-rule lets one request through.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from types import SimpleNamespace
from typing import Any, cast

import docker
import pytest

from orchestrator.config import EgressConfig
from orchestrator.models.base import ToolCall
from orchestrator.pipeline import CallPipeline
from orchestrator.policy.approvals import ApprovalGate, TerminalApprover
from orchestrator.policy.ladder import Ladder
from orchestrator.protocol import ToolResult
from orchestrator.sandbox.egress import LIVE_RULES, EgressGate
from orchestrator.transcript import Transcript

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

# From inside the gate's container: one raw request to the gate itself; prints the status code.
ASK = r"""
import socket, sys, time
method, target, host = sys.argv[1], sys.argv[2], sys.argv[3]
for _ in range(100):  # the gate may still be starting
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
s.sendall(f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
print(s.recv(65536).split(b" ")[1].decode())
"""
PATH = "/v1/a*b[d]"  # glob characters: allowed as written, they must match only themselves
SHOWN = f"http://denied.test:8000{PATH}"


@pytest.fixture
def gate():
    client = docker.from_env()
    outer = client.networks.create(f"oa-test-widen-{uuid.uuid4().hex[:8]}", driver="bridge", internal=True)
    egress = EgressGate(client, EgressConfig(allow=["allowed.test:8000"], outer_network=outer.name))
    egress.start()
    try:
        yield egress
    finally:
        egress.close()
        outer.remove()


def _ask(gate: EgressGate, method: str, target: str = SHOWN, host: str = "denied.test:8000") -> int:
    assert gate.proxy is not None
    result = gate.proxy.exec_run(["python3", "-I", "-S", "-c", ASK, method, target, host], user="65534:65534")
    output = cast(bytes, result.output)
    assert result.exit_code == 0, output
    return int(output.decode().strip())


def _live(gate: EgressGate) -> list[dict[str, Any]] | None:
    assert gate.proxy is not None
    result = gate.proxy.exec_run(
        ["python3", "-I", "-S", "-c", "import sys; print(open(sys.argv[1]).read())", LIVE_RULES], user="65534:65534"
    )
    return json.loads(cast(bytes, result.output)) if result.exit_code == 0 else None


def _offer(gate: EgressGate, typed: str, monkeypatch, capsys) -> str:
    """The drained records of the last requests through the real pipeline's record step, the
    question answered at a pty; returns what the terminal showed."""
    master, slave = os.openpty()
    os.write(master, typed.encode())
    with open(slave, "r", closefd=True) as tty:
        monkeypatch.setattr(sys, "stdin", tty)
        registry = SimpleNamespace(sandbox=SimpleNamespace(widen_egress=gate.widen))
        pipeline = CallPipeline(cast(Any, registry), ApprovalGate(Ladder(), TerminalApprover()), Transcript(None))
        pipeline.finish(ToolCall(id="c1", name="shell", arguments={}), ToolResult(ok=True, egress=gate.drain()))
    os.close(master)
    return capsys.readouterr().err


@pytest.mark.parametrize(("typed", "once"), [("y\n", True), ("a\n", False), ("n\n", None)])
def test_the_live_rule_is_the_literal_request_shown(gate, monkeypatch, capsys, typed, once):
    assert _ask(gate, "GET") == 403
    shown = _offer(gate, typed, monkeypatch, capsys)
    assert f"the egress gate refused GET denied.test:8000{PATH} (no rule allows it)" in shown
    live = _live(gate)
    if once is None:
        assert live is None and _ask(gate, "GET") == 403
        return
    assert live == [
        {
            "action": "allow",
            "host": "denied.test",
            "port": 8000,
            "methods": ["GET"],
            "path": "/v1/a[*]b[[]d]",
            "id": 0,
            "once": once,
        }
    ]
    assert _ask(gate, "POST") == 403  # another method
    assert _ask(gate, "GET", "http://denied.test:8000/v1/aXXb[d]") == 403  # what `*` would match as a glob
    assert _ask(gate, "GET", "http://denied.test:8000/v1/A*B[d]") == 403  # another case
    assert _ask(gate, "GET", "http://denied.test:80/v1/a*b[d]", "denied.test") == 403  # another port
    assert _ask(gate, "GET") == 502  # the shown request passes the rules (denied.test does not resolve)
    assert _ask(gate, "GET") == (403 if once else 502)


def test_a_star_method_is_refused_and_never_offered(gate, monkeypatch, capsys):
    """`*` as a request method: the gate refuses it (400), so nothing is offered and no rule is written."""
    assert _ask(gate, "*") == 400
    shown = _offer(gate, "a\n", monkeypatch, capsys)
    assert "refused" not in shown and _live(gate) is None
    assert _ask(gate, "DELETE") == 403 and _ask(gate, "*") == 400
