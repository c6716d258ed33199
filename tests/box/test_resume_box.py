"""The tests of tests/unit/test_resume.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer
from tests.helpers.resume import ROOT, oa, sessions_dir


def session_id(proc: subprocess.CompletedProcess) -> str:
    return json.loads(proc.stdout)["session_id"]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- bind mode: the conversation, the transcript, turns and rollback, AGENTS.md written by the box ---------
@pytest.mark.docker
def test_resume_in_bind_mode_sends_the_conversation_and_rollback_reaches_past_it(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"AGENTS.md": "START-RULES-1111\n", "a.py": "x = 1\n"})
    with FakeModelServer() as server:
        server.openai_stream("Writing b.", [("write_file", {"path": "b.txt", "content": "one\n"})])
        server.openai_stream("", [("write_file", {"path": "AGENTS.md", "content": "BOX-WROTE-2222\n"})])
        server.openai_stream("first run done")
        server.openai_stream("", [("write_file", {"path": "c.txt", "content": "two\n"})])
        server.openai_stream("second run done")
        model = [
            "--model",
            "openai:m",
            "--base-url",
            server.base_url,
            "--non-interactive",
            "--auto-approve",
            "--output",
            "json",
        ]
        first = oa(tmp_path, "run", "--workspace", str(ws), "--workspace-mode", "bind", *model, "task one")
        assert first.returncode == 0, first.stderr
        sid = session_id(first)
        second = oa(tmp_path, "run", "--resume", sid, *model, "task two")
        assert second.returncode == 0, second.stderr
        out = json.loads(second.stdout)
        assert out["session_id"] == sid and out["final_text"] == "second run done" and out["turns"] == 2
        sent = server.requests[3]["body"]["messages"]
    assert [m["role"] for m in sent] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert (
        sent[1]["content"] == "task one"
        and sent[-1]["content"] == "task two"
        and sent[6]["content"] == "first run done"
    )
    assert sent[2]["tool_calls"][0]["id"] == sent[3]["tool_call_id"] and "wrote 4 bytes" in sent[3]["content"]
    system = sent[0]["content"]
    assert "BOX-WROTE-2222" in system and "START-RULES-1111" not in system
    assert "written since the session's start" in system and "sandbox may have written it" in system
    # one transcript, one id, seq numbers on, session_resumed before the second run's start
    session_dirs = list(sessions_dir(tmp_path).iterdir())
    assert [d.name for d in session_dirs] == [sid]
    recs = records(session_dirs[0] / "transcript.jsonl")
    seqs = [r["seq"] for r in recs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    types = [r["type"] for r in recs]
    resumed = recs[types.index("session_resumed")]
    assert (
        resumed["session_id"] == sid
        and resumed["previous_turns"] == 3
        and resumed["messages"] == 6
        and resumed["unreadable"] == 0
    )
    assert types.index("session_resumed") < [i for i, t in enumerate(types) if t == "session_start"][1]
    assert [r["turn"] for r in recs if r["type"] == "model_request"] == [1, 2, 3, 4, 5]
    record = json.loads((session_dirs[0] / "session.json").read_text())
    assert record["turns"] == 5 and record["resumes"] == 1 and record["status"] == "finished"
    shown = oa(tmp_path, "transcript", "show", sid)
    assert shown.returncode == 0 and f"↻ resumed session {sid} after 3 turn(s)" in shown.stdout
    assert shown.stdout.count("● task:") == 2
    # checkpoints by turn keep working after the resume: back to turn 1 (b.txt only, AGENTS.md as it was)
    assert (ws / "c.txt").exists()
    back = oa(tmp_path, "rollback", sid, "--turn", "1")
    assert back.returncode == 0, back.stderr
    assert (
        (ws / "b.txt").read_text() == "one\n"
        and not (ws / "c.txt").exists()
        and (ws / "AGENTS.md").read_text() == "START-RULES-1111\n"
    )


# -- copy mode: --continue, the same copy, manifest and checkpoints go on, apply lands both runs ------------
@pytest.mark.docker
def test_continue_in_copy_mode_goes_on_in_the_same_copy_and_apply_lands_both_runs(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"AGENTS.md": "RULES-3333\n", "a.py": "x = 1\n"})
    with FakeModelServer() as server:
        server.openai_stream("", [("write_file", {"path": "b.txt", "content": "one\n"})])
        server.openai_stream("first done")
        server.openai_stream("", [("edit_file", {"path": "b.txt", "old_text": "one", "new_text": "one and two"})])
        server.openai_stream("second done")
        model = [
            "--model",
            "openai:m",
            "--base-url",
            server.base_url,
            "--non-interactive",
            "--auto-approve",
            "--output",
            "json",
        ]
        first = oa(tmp_path, "run", "--workspace", str(ws), "--workspace-mode", "copy", *model, "task one")
        assert first.returncode == 0, first.stderr
        sid = session_id(first)
        assert not (ws / "b.txt").exists()  # copy mode: in the copy only
        second = oa(tmp_path, "run", "--workspace", str(ws), "--continue", *model, "task two")
        assert second.returncode == 0, second.stderr
        assert session_id(second) == sid and json.loads(second.stdout)["workspace_mode"] == "copy"
        system = server.requests[2]["body"]["messages"][0]["content"]
        assert "RULES-3333" in system and "unchanged since the session's start" in system
    copy = sessions_dir(tmp_path) / sid / "copy"
    assert (copy / "b.txt").read_text() == "one and two\n"
    points = oa(tmp_path, "checkpoints", sid)
    assert "turn 1" in points.stdout and "turn 3" in points.stdout, points.stdout
    changes = oa(tmp_path, "changes", sid, "--stat")
    assert "b.txt" in changes.stdout
    applied = oa(tmp_path, "apply", sid)
    assert applied.returncode == 0, applied.stderr
    assert (ws / "b.txt").read_text() == "one and two\n"
    # a --workspace-mode that contradicts the session is refused, typed
    bad = oa(
        tmp_path,
        "run",
        "--resume",
        sid,
        "--workspace-mode",
        "bind",
        "--model",
        "script:/nonexistent",
        "--output",
        "json",
        "x",
    )
    assert (
        bad.returncode == 2
        and json.loads(bad.stdout)["error"]["type"] == "invalid_arguments"
        and "copy mode" in bad.stderr
    )


# -- ACP session/load, with the official SDK as the editor -------------------------------------------------
@pytest.mark.docker
def test_acp_session_load_replays_the_conversation_then_the_session_goes_on(sandbox_image, tmp_path):
    from acp import RequestError, text_block
    from acp.schema import AgentMessageChunk, ToolCallProgress, ToolCallStart, UserMessageChunk

    from tests.helpers.acp_editor import run_editor

    ws = make_workspace(tmp_path / "ws", {"a.txt": "alpha\n"})
    env = {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }

    def script(name: str, turns: list[dict]) -> str:
        path = tmp_path / name
        path.write_text("".join(json.dumps(t) + "\n" for t in turns))
        return f"script:{path}"

    first_model = script(
        "m1.jsonl",
        [
            {
                "text": "writing b",
                "tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "b.txt", "content": "one\n"}}],
            },
            {"text": "first answer"},
        ],
    )

    async def first(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("FIRST-PROMPT")])
        return session.session_id, answer.stop_reason

    run = run_editor(tmp_path, ["--model", first_model], first, env=env)
    sid, stop = run.result
    assert stop == "end_turn" and (ws / "b.txt").read_text() == "one\n"
    assert (sessions_dir(tmp_path) / sid / "session.json").is_file()  # the ACP session's id is the record's

    second_model = script(
        "m2.jsonl",
        [
            {
                "text": "",
                "tool_calls": [{"id": "w2", "name": "write_file", "arguments": {"path": "c.txt", "content": "two\n"}}],
            },
            {"text": "second answer"},
        ],
    )
    init: list = []

    async def second(conn, editor):
        with pytest.raises(RequestError):
            await conn.load_session(cwd=str(ws), session_id="20990101-000000-000000", mcp_servers=[])
        await conn.load_session(cwd=str(ws), session_id=sid, mcp_servers=[])
        replayed = list(editor.updates)
        with pytest.raises(RequestError):  # loaded already in this agent
            await conn.load_session(cwd=str(ws), session_id=sid, mcp_servers=[])
        answer = await conn.prompt(session_id=sid, prompt=[text_block("SECOND-PROMPT")])
        return replayed, answer.stop_reason

    run = run_editor(tmp_path, ["--model", second_model], second, env=env, init=init)
    replayed, stop = run.result
    assert init[0].agent_capabilities.load_session is True
    assert stop == "end_turn" and (ws / "c.txt").read_text() == "two\n"
    kinds = [type(u).__name__ for u in replayed]
    assert kinds == [
        "UserMessageChunk",
        "AgentMessageChunk",
        "ToolCallStart",
        "ToolCallProgress",
        "AgentMessageChunk",
    ], kinds
    assert isinstance(replayed[0], UserMessageChunk) and replayed[0].content.text == "FIRST-PROMPT"
    assert isinstance(replayed[2], ToolCallStart) and replayed[2].tool_call_id == "w1"
    assert isinstance(replayed[3], ToolCallProgress) and replayed[3].status == "completed"
    assert isinstance(replayed[4], AgentMessageChunk) and replayed[4].content.text == "first answer"
    live = run.editor.updates[len(replayed) :]
    assert any(isinstance(u, AgentMessageChunk) and u.content.text == "second answer" for u in live)
    recs = records(sessions_dir(tmp_path) / sid / "transcript.jsonl")
    resumed = [r for r in recs if r["type"] == "session_resumed"]
    assert len(resumed) == 1 and resumed[0]["via"] == "acp" and resumed[0]["previous_turns"] == 2
    assert [r["turn"] for r in recs if r["type"] == "model_request"] == [1, 2, 3, 4]
    assert [r["task"] for r in recs if r["type"] == "session_start"] == ["FIRST-PROMPT", "SECOND-PROMPT"]
