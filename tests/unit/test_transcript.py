"""The transcript: JSONL written as it goes, executors on outcomes, secrets redacted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from orchestrator.protocol import Executor
from orchestrator.transcript import REDACTED, Redactor, Transcript
from tests.helpers.transcript import HOSTILE, _raw_hidden


def test_events_are_on_disk_before_close_and_secrets_are_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-very-secret-123")
    path = tmp_path / "t.jsonl"
    transcript = Transcript(path, Redactor.from_environment(["custom-key-value-42"]))
    transcript.event(
        "model_response", text="here: tok-very-secret-123 and custom-key-value-42 and sk-abcdefghijklmnopqrstuvwx"
    )
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
        {
            "seq": 2,
            "type": "tool_call",
            "state": "validating",
            "tool": "shell",
            "arguments": {"command": "echo sk-abcdefghijklmnopqrstuvwx"},
        },
        {
            "seq": 3,
            "type": "approval",
            "executor": "user",
            "decision": "allow_once",
            "level": "ask_every_time",
            "reason": "approved",
        },
        {"seq": 4, "type": "tool_result", "executor": "runtime", "ok": True, "output": "done\n"},
        {"seq": 5, "type": "session_end", "executor": "openagents", "status": "finished", "reason": "final answer"},
    ]
    path.write_text("\n".join(json.dumps(e) for e in events) + "\nnot json\n")
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    out = subprocess.run([exe, "transcript", "show", str(path)], capture_output=True, text=True, check=True).stdout
    assert "sk-abc" not in out and REDACTED in out
    assert "approval: allow_once (ask_every_time) [user]" in out and "← ok [runtime]: done" in out
    assert "■ finished [openagents]" in out and "unreadable line" in out


def test_visible_leaves_no_control_character_and_is_idempotent():
    from orchestrator.ground.text import visible

    everything = (
        "".join(chr(c) for c in range(0x00, 0xA0))
        + "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u2028\u2029\U000e0041\ud800"
    )
    out = visible(everything + HOSTILE)
    assert _raw_hidden(out) == []
    assert "\\x1b[2J" in out and "\\x07" in out and "\\x9b" in out and "\\u202e" in out and "\\x0d? fake prompt" in out
    assert "\r" not in visible("line\r\nnext") and visible("line\r\nnext") == "line\nnext"
    assert visible(out) == out
    assert visible("plain text, é, 中文, tabs\tand\nlines") == "plain text, é, 中文, tabs\tand\nlines"


def test_json_lines_escape_what_json_leaves_raw_and_still_round_trip():
    from orchestrator.ground.text import json_line

    value = {"k": HOSTILE + "\ud800\U000e0041", HOSTILE: [HOSTILE]}
    line = json_line(value)
    assert _raw_hidden(line) == [] and json.loads(line) == value
    assert _raw_hidden(json.dumps(value, ensure_ascii=False))  # what plain json.dumps would have written raw


def test_every_event_is_capped_and_a_box_surrogate_cannot_break_the_writer(tmp_path):
    from orchestrator.transcript import MAX_EVENT_BYTES

    path = tmp_path / "t.jsonl"
    transcript = Transcript(path, Redactor([]))
    big = "x" * (10 << 20)
    diff = "".join(f"+line {i}\n" for i in range(1_000_000))
    transcript.event(
        "tool_result",
        executor=Executor.RUNTIME,
        ok=True,
        output=big,
        note=big,
        diff=diff,
        meta={f"k{i}": "v" * 1000 for i in range(100_000)},
    )
    transcript.event(
        "egress",
        executor=Executor.OPENAGENTS,
        method="GET",
        host="h" * 60_000 + ".test",
        port=80,
        decision="deny",
        reason="r" * 60_000,
    )
    deep: dict = {}
    node = deep
    for _ in range(500):
        node["d"] = {}
        node = node["d"]
    transcript.event(
        "tool_result",
        executor=Executor.RUNTIME,
        ok=True,
        output="\ud800" + HOSTILE,
        meta=deep,
        items=list(range(200_000)),
    )
    transcript.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert len(line) <= MAX_EVENT_BYTES
        assert _raw_hidden(line.decode("utf-8")) == []
    result, egress, third = (json.loads(line) for line in lines)
    assert result["output"].startswith("xxxx") and "chars]" in result["output"] and "cut" in result["output"]
    assert (
        result["diff"].startswith("+line 0\n+line 1\n")
        and len(result["diff"]) > 4096
        and result["diff"].endswith("chars]")
    )
    assert "…" in result["meta"] and len(result["meta"]) <= 257
    assert (
        len(egress["host"]) < 60_000
        and "cut" in egress["host"]
        and egress["decision"] == "deny"
        and egress["port"] == 80
    )
    assert third["output"].startswith("\ud800a\x1b[2J") and "cut 199744 items" in third["items"][-1]
    assert [e["seq"] for e in (result, egress, third)] == [1, 2, 3] and result["type"] == "tool_result"


def test_transcript_show_makes_every_control_character_visible(tmp_path):
    path = tmp_path / "t.jsonl"
    events = [
        {"seq": 1, "type": "session_start", "task": HOSTILE, "model": HOSTILE, "workspace": HOSTILE},
        {
            "seq": 2,
            "type": "model_response",
            "text": HOSTILE + "\n? Run in the sandbox: rm -rf /\n  y = allow once, n = reject",
        },
        {"seq": 3, "type": "tool_call", "state": "validating", "tool": HOSTILE, "arguments": {"command": HOSTILE}},
        {
            "seq": 4,
            "type": "tool_result",
            "executor": "runtime",
            "ok": False,
            "error": {"type": HOSTILE, "message": HOSTILE},
        },
        {"seq": 5, "type": "tool_result", "executor": "runtime", "ok": False, "error": None, "output": HOSTILE},
        {
            "seq": 6,
            "type": "egress",
            "executor": "openagents",
            "decision": "deny",
            "host": HOSTILE,
            "port": 80,
            "reason": HOSTILE,
        },
        {"seq": 7, "type": "session_end", "executor": "openagents", "status": HOSTILE, "reason": HOSTILE},
    ]
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n" + HOSTILE + "\n[1]\n")
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    out = subprocess.run([exe, "transcript", "show", str(path)], capture_output=True, check=True).stdout
    text = out.decode("utf-8")
    assert _raw_hidden(text) == [], _raw_hidden(text)
    assert b"\x1b" not in out and b"\x07" not in out and b"\r" not in out
    assert text.count("\\x1b[2J") >= 7 and "\\u202egnp.exe" in text
    # Newlines the model wrote never start a line at the left margin, where real prompts start.
    assert not any(line.startswith(("?", "  y =")) for line in text.splitlines())


def test_context_file_records_are_typed_events_like_the_others(tmp_path):
    """Issue 36: the context_file record was written from loose keyword arguments, the one record
    no front-end could `parse()`. It is an event model now: written through `emit`, read back typed."""
    from orchestrator import events as ev
    from orchestrator.workspace.context_files import ContextFiles

    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "AGENTS.md").write_text("root rules\n")
    (ws / "src" / "AGENTS.md").mkdir()  # a directory where the file would be: refused, and said
    transcript = Transcript(tmp_path / "t.jsonl", redactor=Redactor())
    files = ContextFiles(ws, note=transcript.emit)
    assert "root rules" in files.root()
    files._look("src", "during")
    transcript.close()
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    given, refused = (ev.parse(r) for r in records)
    assert isinstance(given, ev.ContextFileNoted) and isinstance(refused, ev.ContextFileNoted)
    assert (given.outcome, given.path, given.bytes, given.during_session, given.executor) == (
        "given",
        "AGENTS.md",
        11,
        False,
        Executor.OPENAGENTS,
    )
    assert (refused.outcome, refused.path) == ("refused", "src/AGENTS.md") and refused.error_type and refused.reason
    assert "bytes" not in records[1] and "origin" not in records[1]  # fields a refusal has not are left out, as before
