"""In ACP, a running shell call's output reaches the editor as tool_call_update content before the
command ends (issue 14); the final update still carries the whole result."""

from __future__ import annotations

import json

import pytest

from tests.helpers import make_workspace
from tests.helpers.acp import Editor, updates

pytestmark = pytest.mark.docker


def test_acp_streams_shell_output_as_tool_call_updates(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    gate = ws / "go-on"
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {
                            "id": "s1",
                            "name": "shell",
                            "arguments": {
                                "command": "echo first-line; i=0; while [ ! -e go-on ] && [ $i -lt "
                                "600 ]; do sleep 0.1; i=$((i+1)); done; echo second-line"
                            },
                        }
                    ]
                },
                {"text": "Done."},
            ]
        )
    )
    editor = Editor("--model", f"script:{script}", "--transcript-dir", str(tmp_path / "t"))
    live: list[str] = []

    def on_update(note):
        update = note["update"]
        if update.get("toolCallId") == "s1" and update.get("status") == "in_progress" and update.get("content"):
            live.append(update["content"][0]["content"]["text"])
            if "first-line" in live[-1] and not gate.exists():
                assert "second-line" not in live[-1]
                gate.write_text("")  # only now can the command end

    editor.on_notification = on_update
    try:
        editor.call("initialize", {"protocolVersion": 1})
        session_id = editor.call("session/new", {"cwd": str(ws), "mcpServers": []})["result"]["sessionId"]
        result = editor.call(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "run it"}]}
        )
        assert result["result"]["stopReason"] == "end_turn"
    finally:
        editor.close()
    assert live and live[0].startswith("first-line") and gate.exists()
    final = [u for u in updates(editor, "tool_call_update") if u.get("status") == "completed"]
    assert final and final[0]["content"][0]["content"]["text"].startswith("first-line\nsecond-line")
