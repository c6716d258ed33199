"""The transcript: JSONL written as it goes, executors on outcomes, secrets redacted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.protocol import Executor
from orchestrator.transcript import REDACTED, Redactor, Transcript


def test_events_are_on_disk_before_close_and_secrets_are_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-very-secret-123")
    path = tmp_path / "t.jsonl"
    transcript = Transcript(path, Redactor.from_environment(["custom-key-value-42"]))
    transcript.event("model_response", text="here: tok-very-secret-123 and custom-key-value-42 and sk-abcdefghijklmnopqrstuvwx")
    transcript.event("tool_result", executor=Executor.RUNTIME, ok=True, output="ghp_abcdefghijklmnopqrstuvwxyz0123")
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # before close: a crash keeps them
    assert [e["type"] for e in lines] == ["model_response", "tool_result"]
    assert lines[0]["text"] == f"here: {REDACTED} and {REDACTED} and {REDACTED}"
    assert lines[1]["output"] == REDACTED and lines[1]["executor"] == "runtime"
    transcript.close()


def test_transcript_show_renders_and_redacts(tmp_path):
    path = tmp_path / "t.jsonl"
    events = [
        {"seq": 1, "type": "session_start", "task": "fix", "model": "m", "workspace": "/w"},
        {"seq": 2, "type": "tool_call", "state": "validating", "tool": "shell", "arguments": {"command": "echo sk-abcdefghijklmnopqrstuvwx"}},
        {"seq": 3, "type": "approval", "executor": "user", "decision": "allow_once", "level": "ask_every_time", "reason": "approved"},
        {"seq": 4, "type": "tool_result", "executor": "runtime", "ok": True, "output": "done\n"},
        {"seq": 5, "type": "session_end", "executor": "openagents", "status": "finished", "reason": "final answer"},
    ]
    path.write_text("\n".join(json.dumps(e) for e in events) + "\nnot json\n")
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    out = subprocess.run([exe, "transcript", "show", str(path)], capture_output=True, text=True, check=True).stdout
    assert "sk-abc" not in out and REDACTED in out
    assert "approval: allow_once (ask_every_time) [user]" in out and "← ok [runtime]: done" in out
    assert "■ finished [openagents]" in out and "unreadable line" in out
