"""One error taxonomy end to end: every type the agent (or the host's path checks) can emit is a
member of ErrorType, and every fatal type ends a session."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator import events as ev
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.loop import SessionStatus
from orchestrator.models.base import ModelTurn, ToolCall
from orchestrator.protocol import ToolResult
from tests.helpers.loop_fast import FakeSandbox, session, typed

ROOT = Path(__file__).resolve().parents[2]
RAISERS = {"ToolError", "PathRefused", "PathProblem"}


def emitted_types() -> dict[str, str]:
    """type -> where: first arguments of the typed exceptions, and the "type" of every wire error
    dict ({"error": {"type": ...}}), in the agent's sources and the host's shared path checks."""
    found: dict[str, str] = {}
    files = sorted((ROOT / "sandbox_agent").glob("*.py")) + [ROOT / "orchestrator/tools/git_workdir.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) in RAISERS
                and node.args
            ):
                first = node.args[0]
                if isinstance(first, ast.Attribute) and first.attr == "kind":
                    continue  # passes on a type that was already checked where it was raised
                literals = [
                    n.value for n in ast.walk(first) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                ]
                assert literals, (
                    f"{path.name}:{node.lineno}: the error type must be a "
                    "literal (or a choice of them) so it can be checked"
                )
                for literal in literals:
                    found.setdefault(literal, f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "error" and isinstance(value, ast.Dict):
                        for k, v in zip(value.keys, value.values, strict=True):
                            if isinstance(k, ast.Constant) and k.value == "type" and isinstance(v, ast.Constant):
                                found.setdefault(
                                    str(v.value), f"{path.name}:{node.lineno}"
                                )  # not a str: no such type, fails below
    return found


def test_every_error_type_the_agent_can_emit_is_in_the_taxonomy():
    found = emitted_types()
    assert len(found) >= 15, f"the scan found too little to mean anything: {sorted(found)}"
    unknown = {kind: where for kind, where in found.items() if kind not in {t.value for t in ErrorType}}
    assert not unknown, f"error types outside ErrorType: {unknown}"


def test_an_unknown_wire_type_from_a_hostile_agent_is_a_protocol_error():
    assert ErrorType.parse("made_up_by_the_box") is ErrorType.PROTOCOL_ERROR
    assert ErrorType.parse(["not", "a", "string"]) is ErrorType.PROTOCOL_ERROR


FATAL = sorted((t for t in ErrorType if not t.recoverable), key=lambda t: t.value)


def test_the_fatal_set_is_what_the_session_cannot_go_on_after():
    assert {t.value for t in FATAL} >= {"no_space", "docker_unavailable", "model_api_error", "workspace_quota_exceeded"}
    assert all(
        t.recoverable
        for t in (ErrorType.FILE_NOT_FOUND, ErrorType.TIMEOUT, ErrorType.AGENT_LOST, ErrorType.REJECTED_BY_USER)
    )


@pytest.mark.parametrize("kind", FATAL, ids=lambda t: t.value)
def test_every_fatal_tool_result_ends_the_session(tmp_path, kind):
    failing = ToolResult.failure(OpenAgentsError(kind, "the box says so"))
    box = FakeSandbox(results={"read_file": failing})
    turns = [
        ModelTurn(tool_calls=[ToolCall(id=str(i), name="read_file", arguments={"path": "a"})]) for i in range(3)
    ] + [ModelTurn(text="done")]
    s, _, transcript = session(tmp_path, turns, sandbox=box)
    result = s.run("task")
    assert result.status is SessionStatus.STOPPED and result.error.type is kind
    assert len(box.calls) == 1, "the session went on after a fatal result"
    end = typed(transcript)[-1]
    assert isinstance(end, ev.SessionEnded) and end.error["type"] == kind.value


@pytest.mark.parametrize("kind", [t for t in ErrorType if t.recoverable][:8], ids=lambda t: t.value)
def test_a_recoverable_tool_result_goes_back_to_the_model(tmp_path, kind):
    box = FakeSandbox(results={"read_file": ToolResult.failure(OpenAgentsError(kind, "try again"))})
    turns = [
        ModelTurn(tool_calls=[ToolCall(id="1", name="read_file", arguments={"path": "a"})]),
        ModelTurn(text="done"),
    ]
    s, _, _ = session(tmp_path, turns, sandbox=box)
    assert s.run("task").status is SessionStatus.FINISHED
    assert f"ERROR {kind.value} (recoverable)" in [m for m in s.messages if m.role == "tool"][0].content
