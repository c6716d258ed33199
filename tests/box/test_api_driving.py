"""The public methods a front-end drives a session with (api/driving.py, docs/api.md "Front-ends"):
run_turns and cancel, decide then execute, emit, decide_landing, and what the box runs on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import ErrorType, OpenAgentsError, Sandbox
from orchestrator.events import McpServersStarted, parse
from orchestrator.policy.ladder import Access
from orchestrator.protocol import Executor, ToolResult
from tests.helpers import make_workspace

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("sandbox_image")]


def script(tmp_path: Path, turns: list[dict]) -> str:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return f"script:{path}"


def records(box: Sandbox) -> list[dict]:
    return [json.loads(line) for line in box.transcript_path.read_text().splitlines()]


def test_a_task_runs_in_the_callers_thread_and_a_cancel_first_ends_it(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    turns = [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi > hi.txt"}}]}, {"text": "done"}]
    with Sandbox(ws, mode="bind", auto_approve=True, model=script(tmp_path, turns)) as box:
        box.cancel()
        assert box.run_turns("make hi.txt").status.value == "cancelled"  # a cancel that came first holds
        result = box.run_turns("make hi.txt", again=True)  # an editor's next prompt forgets it
        assert result.status.value == "finished" and result.final_text == "done"
        assert box.read_file("hi.txt").text == "hi\n"


def test_run_turns_needs_a_model(tmp_path):
    with Sandbox(make_workspace(tmp_path / "ws", {}), mode="bind") as box:
        with pytest.raises(OpenAgentsError) as err:
            box.run_turns("anything")
        assert err.value.type == ErrorType.INVALID_ARGUMENTS


def test_a_call_decided_then_run_is_recorded_and_counted_once(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    deny = tmp_path / "deny.toml"
    deny.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    with Sandbox(ws, mode="bind", policy_files=[deny]) as box:
        refused = box.decide("shell", {"command": "true"})
        assert isinstance(refused, ToolResult) and refused.error is not None
        assert refused.error.type == ErrorType.REFUSED_BY_POLICY
        prepared = box.decide("read_file", {"path": "a.txt"}, "mine_1")
        assert not isinstance(prepared, ToolResult)
        assert box.execute(prepared, counted=False).ok
        again = box.decide("read_file", {"path": "a.txt"})
        assert not isinstance(again, ToolResult) and box.execute(again).ok
        box.emit(McpServersStarted(executor=Executor.OPENAGENTS, tools=["x"], problems=[]))
        assert box.box_workspace == ws.resolve() and box.box_config.egress is None
        assert box.policy.access == Access.READ_WRITE and len(box.policy.rules) == 1
        said = records(box)
    assert box.record.turns == 1  # the counted call only
    finished = [r for r in said if r["type"] == "tool_result"]
    assert "mine_1" in [r["call_id"] for r in finished] and len(finished) == 3
    assert any(isinstance(parse(r), McpServersStarted) for r in said)


def test_a_landing_is_decided_by_the_sessions_policy_and_recorded_while_open(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    copy_only = tmp_path / "copy-only.toml"
    copy_only.write_text('workspace_access = "copy-only"\n')
    box = Sandbox(ws, mode="copy", policy_files=[copy_only]).open()
    try:
        assert not box.decide_landing("test").allowed
        assert any(r["type"] == "approval" and r["tool"] == "apply_changes" for r in records(box))
    finally:
        box.close()
    assert not box.decide_landing("after close").allowed  # still answered after close (run --apply)
    with pytest.raises(OpenAgentsError) as err:
        Sandbox(ws).decide_landing()
    assert err.value.type == ErrorType.SANDBOX_CLOSED
