"""The turn loop with an in-memory sandbox double and a scripted model: no Docker, seconds.

What is checked is the loop's own contract: approvals asked in the model's order, consecutive
read-only calls run together, results go back in the model's order, cancel, fatal results,
arguments parsed once at the edge, typed events in the transcript.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator import events as ev
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.events import ToolCallState
from orchestrator.loop import SessionStatus
from orchestrator.models.base import ModelTurn, ToolCall
from orchestrator.policy.approvals import PermissionOption
from orchestrator.protocol import Executor, ToolResult
from tests.helpers.loop_fast import FakeSandbox, RecordingApprover, session, typed

if TYPE_CHECKING:
    pass


def call(cid: str, name: str, arguments: Any) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=arguments)


def test_several_calls_in_one_turn_keep_the_models_order(tmp_path):
    turns = [
        ModelTurn(
            tool_calls=[
                call("1", "read_file", {"path": "a"}),
                call("2", "shell", {"command": "one"}),
                call("3", "read_file", {"path": "b"}),
                call("4", "write_file", {"path": "c", "content": "x"}),
            ]
        ),
        ModelTurn(text="done"),
    ]
    approver = RecordingApprover()
    s, box, transcript = session(tmp_path, turns, approver=approver)
    result = s.run("task")
    assert result.status is SessionStatus.FINISHED
    assert approver.asked == ["2", "4"], "approvals are asked one at a time, in the model's order"
    tool_messages = [m for m in s.messages if m.role == "tool"]
    assert [m.tool_call_id for m in tool_messages] == ["1", "2", "3", "4"]
    assert [c[0] for c in box.calls] == ["read_file", "shell", "read_file", "write_file"]


def test_consecutive_reads_run_in_parallel_and_results_stay_in_order(tmp_path):
    reads = [call(str(i), "read_file", {"path": f"f{i}"}) for i in range(4)]
    s, box, _ = session(tmp_path, [ModelTurn(tool_calls=reads), ModelTurn(text="ok")], FakeSandbox(delay=0.3))
    started = time.monotonic()
    s.run("task")
    assert box.max_running > 1 and time.monotonic() - started < 1.0
    assert [m.content.split()[-1] for m in s.messages if m.role == "tool"] == ["f0", "f1", "f2", "f3"]


def test_arguments_as_json_text_are_parsed_once_at_the_edge(tmp_path):
    turns = [
        ModelTurn(
            tool_calls=[
                call("1", "read_file", '{"path": "a.txt"}'),
                call("2", "read_file", "{not json"),
                call("3", "read_file", "[1, 2]"),
            ]
        ),
        ModelTurn(text="ok"),
    ]
    s, box, transcript = session(tmp_path, turns)
    s.run("task")
    assert [(tool, args["path"]) for tool, args in box.calls] == [("read_file", "a.txt")]
    announced = [
        e for e in typed(transcript) if isinstance(e, ev.ToolCallChanged) and e.state is ToolCallState.VALIDATING
    ]
    assert announced[0].arguments == {"path": "a.txt"}
    assert announced[1].arguments == "{not json" and "not valid JSON" in announced[1].arguments_error
    results = {e.call_id: e for e in typed(transcript) if isinstance(e, ev.ToolCallFinished)}
    assert results["2"].error["type"] == "invalid_arguments" and results["3"].error["type"] == "invalid_arguments"


def test_unknown_tool_and_malformed_arguments_go_back_to_the_model(tmp_path):
    turns = [
        ModelTurn(
            tool_calls=[
                call("1", "rm_rf", {}),
                call("2", "read_file", {"path": 7}),
                call("3", "read_file", {"path": "../x"}),
            ]
        ),
        ModelTurn(text="ok"),
    ]
    s, box, transcript = session(tmp_path, turns)
    result = s.run("task")
    assert result.status is SessionStatus.FINISHED and box.calls == []
    errors = [e.error["type"] for e in typed(transcript) if isinstance(e, ev.ToolCallFinished)]
    assert errors == ["unknown_tool", "invalid_arguments", "path_outside_workspace"]
    assert all("ERROR" in m.content for m in s.messages if m.role == "tool")


def test_a_refused_call_never_reaches_the_sandbox(tmp_path):
    turns = [ModelTurn(tool_calls=[call("1", "shell", {"command": "rm -rf /"})]), ModelTurn(text="ok")]
    s, box, transcript = session(tmp_path, turns, approver=RecordingApprover(PermissionOption.REJECT_ONCE))
    s.run("task")
    assert box.calls == []
    finished = [e for e in typed(transcript) if isinstance(e, ev.ToolCallFinished)][0]
    assert finished.error["type"] == "rejected_by_user" and finished.executor is Executor.USER


def test_cancel_while_a_call_runs_kills_it_and_ends_cancelled(tmp_path):
    box = FakeSandbox()
    box.block_on = "sleep"
    turns = [
        ModelTurn(tool_calls=[call("1", "shell", {"command": "sleep"}), call("2", "shell", {"command": "after"})]),
        ModelTurn(text="never"),
    ]
    s, _, transcript = session(tmp_path, turns, sandbox=box)
    timer = threading.Timer(0.2, lambda: (s.cancel.set(), box.kill_processes()))
    timer.start()
    result = s.run("task")
    assert result.status is SessionStatus.CANCELLED
    assert [c[1]["command"] for c in box.calls] == ["sleep"], "nothing runs after the cancel"
    finished = [e for e in typed(transcript) if isinstance(e, ev.ToolCallFinished)]
    assert [e.state for e in finished] == [ToolCallState.CANCELLED, ToolCallState.CANCELLED]
    last_states = {}
    for e in typed(transcript):
        if isinstance(e, ev.ToolCallChanged):
            last_states[e.call_id] = e.state
    assert set(last_states.values()) == {ToolCallState.CANCELLED}
    assert isinstance(typed(transcript)[-1], ev.SessionEnded)


def test_ctrl_c_in_the_loop_kills_the_running_call_and_writes_session_end(tmp_path):
    box = FakeSandbox()

    def interrupt(request):
        raise KeyboardInterrupt

    s, _, transcript = session(
        tmp_path,
        [ModelTurn(tool_calls=[call("1", "shell", {"command": "x"})])],
        sandbox=box,
        approver=RecordingApprover(on_ask=interrupt),
    )
    result = s.run("task")
    assert result.status is SessionStatus.CANCELLED and box.killed == 1
    end = typed(transcript)[-1]
    assert isinstance(end, ev.SessionEnded) and end.executor is Executor.USER


def test_an_error_raised_inside_a_call_still_ends_the_session_typed(tmp_path):
    class Dying(FakeSandbox):
        def call(self, tool, args):
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, "the replacement container did not start")

    s, _, transcript = session(
        tmp_path, [ModelTurn(tool_calls=[call("1", "read_file", {"path": "a"})])], sandbox=Dying()
    )
    result = s.run("task")
    assert result.status is SessionStatus.STOPPED and result.error.type is ErrorType.SANDBOX_START_FAILED
    end = typed(transcript)[-1]
    assert isinstance(end, ev.SessionEnded) and end.error["type"] == "sandbox_start_failed"


def test_a_bug_of_ours_still_writes_session_end(tmp_path):
    class Buggy(FakeSandbox):
        def call(self, tool, args):
            raise ZeroDivisionError("oops")

    s, _, transcript = session(
        tmp_path, [ModelTurn(tool_calls=[call("1", "read_file", {"path": "a"})])], sandbox=Buggy()
    )
    with pytest.raises(ZeroDivisionError):
        s.run("task")
    end = typed(transcript)[-1]
    assert isinstance(end, ev.SessionEnded) and end.error["type"] == "internal_error"


def test_every_event_the_loop_writes_is_typed_and_names_its_executor_when_it_is_an_outcome(tmp_path):
    turns = [
        ModelTurn(tool_calls=[call("1", "read_file", {"path": "a"}), call("2", "shell", {"command": "x"})]),
        ModelTurn(text="ok"),
    ]
    s, _, transcript = session(tmp_path, turns)
    s.run("task")
    for record in transcript.events:
        event = ev.parse(record)
        assert event is not None, record
        if isinstance(event, (ev.ToolCallFinished, ev.ApprovalDecided, ev.SessionEnded)):
            assert event.executor is not None, record


def test_egress_records_of_any_shape_never_break_the_session(tmp_path):
    """The proxy's log lines carry what the box's requests held: a missing host, a port that is no
    number, keys named like the event's own. The session records them and goes on."""
    from orchestrator import events as ev

    records = [
        {"decision": "deny", "host": None, "port": "x", "reason": None},
        {
            "decision": "deny",
            "host": "h",
            "port": 80,
            "type": "session_end",
            "executor": "user",
            "call_id": "forged",
            "extra": [1],
        },
    ]
    from orchestrator.sandbox.egress import bounded_record

    box = FakeSandbox(
        results={"shell": ToolResult(ok=True, output="sent\n", egress=[bounded_record(r) for r in records])}
    )
    turns = [
        ModelTurn(tool_calls=[ToolCall(id="1", name="shell", arguments={"command": "curl x"})]),
        ModelTurn(text="done"),
    ]
    s, _, transcript = session(tmp_path, turns, sandbox=box)
    assert s.run("task").status is SessionStatus.FINISHED
    egress = [e for e in typed(transcript) if isinstance(e, ev.EgressRecorded)]
    assert [(e.host, e.port, e.call_id, e.executor) for e in egress] == [
        ("", None, "1", Executor.OPENAGENTS),
        ("h", 80, "1", Executor.OPENAGENTS),
    ]
