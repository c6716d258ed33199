"""The test plays the editor: it starts `oa-sandbox acp`, speaks JSON-RPC over pipes, answers
permission requests, and checks every notification against the ACP models."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.acp import models as m
from tests.helpers import make_workspace
from tests.helpers.acp import Editor, updates

pytestmark = pytest.mark.docker


def test_editor_session_reads_edits_with_permission_and_runs_a_command(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"greet.py": "print('helo')\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "text": "Reading.",
                    "tool_calls": [{"id": "t1", "name": "read_file", "arguments": {"path": "greet.py"}}],
                },
                {
                    "tool_calls": [
                        {
                            "id": "t2",
                            "name": "edit_file",
                            "arguments": {"path": "greet.py", "old_text": "helo", "new_text": "hello"},
                        }
                    ]
                },
                {"tool_calls": [{"id": "t3", "name": "shell", "arguments": {"command": "python3 greet.py"}}]},
                {"tool_calls": [{"id": "t4", "name": "shell", "arguments": {"command": "touch rejected.txt"}}]},
                {"text": "Done."},
            ]
        )
    )
    editor = Editor("--model", f"script:{script}", "--transcript-dir", str(tmp_path / "t"))
    editor.answer = lambda p: {
        "outcome": {"outcome": "selected", "optionId": "reject_once" if "touch" in json.dumps(p) else "allow_once"}
    }
    try:
        init = editor.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert m.InitializeResult.model_validate(init["result"]).protocolVersion == 1
        session_id = m.NewSessionResult.model_validate(
            editor.call("session/new", {"cwd": str(ws), "mcpServers": []})["result"]
        ).sessionId
        result = editor.call(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "fix the greeting"}]}
        )
        assert m.PromptResult.model_validate(result["result"]).stopReason == "end_turn"
    finally:
        editor.close()
    assert (ws / "greet.py").read_text() == "print('hello')\n" and not (ws / "rejected.txt").exists()
    starts = {u["toolCallId"]: u for u in updates(editor, "tool_call")}
    assert {k: v["kind"] for k, v in starts.items()} == {"t1": "read", "t2": "edit", "t3": "execute", "t4": "execute"}
    final = {
        u["toolCallId"]: u for u in updates(editor, "tool_call_update") if u.get("status") in ("completed", "failed")
    }
    assert final["t1"]["status"] == final["t2"]["status"] == final["t3"]["status"] == "completed"
    assert final["t4"]["status"] == "failed" and "rejected_by_user" in final["t4"]["content"][0]["content"]["text"]
    diff = [c for c in final["t2"]["content"] if c["type"] == "diff"][0]
    # the whole file before and after (issue 13), as editors expect of a diff
    assert diff == {
        "type": "diff",
        "path": str(ws / "greet.py"),
        "oldText": "print('helo')\n",
        "newText": "print('hello')\n",
    }
    assert "hello" in final["t3"]["content"][0]["content"]["text"]
    asked = [p["toolCall"]["toolCallId"] for p in editor.permission_requests]
    assert asked == ["t2", "t3", "t4"]  # reads are automatic; edit asks once; each shell asks
    assert [u["content"]["text"] for u in updates(editor, "agent_message_chunk")] == ["Reading.", "Done."]


def test_cancel_in_the_middle_leaves_the_workspace_consistent(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"data.txt": "original\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {"id": "w1", "name": "write_file", "arguments": {"path": "data.txt", "content": "new\n"}}
                    ]
                },
                {
                    "tool_calls": [
                        {"id": "s1", "name": "shell", "arguments": {"command": "sleep 60; echo late > late.txt"}}
                    ]
                },
                {"text": "never reached"},
            ]
        )
    )
    editor = Editor("--model", f"script:{script}", "--transcript-dir", str(tmp_path / "t"))
    try:
        editor.call("initialize", {"protocolVersion": 1})
        session_id = editor.call("session/new", {"cwd": str(ws), "mcpServers": []})["result"]["sessionId"]

        def cancel_when_running(note):
            update = note["update"]
            if update.get("toolCallId") == "s1" and update.get("status") == "in_progress":
                editor.send({"method": "session/cancel", "params": {"sessionId": session_id}})

        editor.on_notification = cancel_when_running
        result = editor.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]})
        assert result["result"]["stopReason"] == "cancelled"  # and late.txt (after sleep 60) never appears: killed
    finally:
        editor.close()
    assert (ws / "data.txt").read_text() == "new\n" and not (ws / "late.txt").exists()
    assert [p.name for p in ws.iterdir()] == ["data.txt"]
    final = [u for u in updates(editor, "tool_call_update") if u["toolCallId"] == "s1" and u.get("status") == "failed"]
    assert final
    assert (
        docker_client.containers.list(all=True, filters={"label": f"dev.openagents.sandbox.host-pid={editor.proc.pid}"})
        == []
    )


def test_unknown_methods_and_malformed_frames_do_not_kill_the_agent(tmp_path):
    script = tmp_path / "s.jsonl"
    script.write_text('{"text": "hi"}\n')
    editor = Editor("--model", f"script:{script}")
    try:
        editor.send_raw(b"{not json")
        assert editor.inbox.get(timeout=30)["error"]["code"] == m.PARSE_ERROR
        editor.send_raw(b'{"jsonrpc": "1.0", "id": 5, "method": "x"}')
        assert editor.inbox.get(timeout=30)["error"]["code"] == m.INVALID_REQUEST
        assert editor.call("session/teleport", {})["error"]["code"] == m.METHOD_NOT_FOUND
        assert editor.call("session/new", {"cwd": 42})["error"]["code"] == m.INVALID_PARAMS
        assert editor.call("session/prompt", {"sessionId": "nope", "prompt": []})["error"]["code"] == m.INVALID_PARAMS
        assert editor.call("initialize", {"protocolVersion": 1})["result"]["protocolVersion"] == 1
    finally:
        editor.close()


def test_editor_gone_during_session_set_up_leaves_no_sandbox(sandbox_image, docker_client, tmp_path):
    """stdin closes while a session/new's set-up (a sandbox start) runs off the reader thread:
    shutdown waits for it and removes its sandbox, so no container outlives the agent."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    script = tmp_path / "s.jsonl"
    script.write_text('{"text": "hi"}\n')
    editor = Editor("--model", f"script:{script}", "--transcript-dir", str(tmp_path / "t"))
    editor.call("initialize", {"protocolVersion": 1})
    editor.send({"id": 7, "method": "session/new", "params": {"cwd": str(ws), "mcpServers": []}})
    label = {"label": f"dev.openagents.sandbox.host-pid={editor.proc.pid}"}
    deadline = time.monotonic() + 60
    # the low-level listing: containers.list() inspects each container it lists, and raises
    # NotFound when one is removed in between (seen on a busy daemon, on main too)
    while not docker_client.api.containers(all=True, filters=label):  # the set-up is under way
        assert time.monotonic() < deadline, "the session's sandbox never appeared"
        time.sleep(0.05)
    editor.proc.stdin.close()
    assert editor.proc.wait(timeout=90) == 0
    assert docker_client.api.containers(all=True, filters=label) == []
