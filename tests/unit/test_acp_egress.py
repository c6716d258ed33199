"""ACP: a tool call's final update carries the gate's records of the requests it made in
`rawOutput.egress` (the same typed records the transcript's `egress` events hold)."""

from __future__ import annotations

import io
import json

from orchestrator import events as ev
from orchestrator.acp.server import AcpServer
from orchestrator.acp.updates import AcpSession
from orchestrator.events import ToolCallState
from orchestrator.protocol import EgressRecord, Executor


def test_a_calls_final_update_carries_its_egress_records(tmp_path):
    out = io.BytesIO()
    server = AcpServer(factory=None, stdin=io.BytesIO(), stdout=out, workspace=tmp_path)
    session = AcpSession(id="s1", workspace=tmp_path)
    record = EgressRecord(
        method="GET",
        host="api.example",
        port=443,
        path="/repos/x",
        decision="allow",
        rule="rules[0]",
        bytes_up=120,
        bytes_down=900,
        credential=True,
        tls="intercepted",
    )
    refused = EgressRecord(
        method="GET",
        host="other.example",
        port=443,
        path="/",
        decision="deny",
        rule="default deny",
        bytes_up=40,
        bytes_down=300,
    )
    for event in (
        ev.ToolCallChanged(call_id="c1", tool="shell", state=ToolCallState.VALIDATING, arguments={"command": "curl"}),
        ev.EgressRecorded.of("c1", record),
        ev.EgressRecorded.of("c1", refused),
        ev.ToolCallFinished(
            executor=Executor.RUNTIME, call_id="c1", tool="shell", state=ToolCallState.SUCCESS, ok=True, output="x"
        ),
        ev.ToolCallFinished(
            executor=Executor.RUNTIME, call_id="c2", tool="shell", state=ToolCallState.SUCCESS, ok=True, output="y"
        ),
    ):
        server._on_event(
            session,
            {"type": event.type, "executor": event.executor.value if event.executor else None, **event.fields()},
        )
    updates = [json.loads(line)["params"]["update"] for line in out.getvalue().splitlines()]
    final = {u["toolCallId"]: u for u in updates if u.get("status") == "completed"}
    assert [EgressRecord(**r) for r in final["c1"]["rawOutput"]["egress"]] == [record, refused]
    assert final["c2"]["rawOutput"]["egress"] == []  # another call's records are not its own
    assert "egress" not in session.calls["c1"]  # handed over, not kept for the session's life
