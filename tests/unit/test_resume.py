"""Issue 27 item 3, resume, as a user meets it: the real CLI in subprocesses (this worktree's code),
real sandboxes, a real model server of our own on loopback that records what the model was sent.

- `run --resume ID` in bind mode: the model is sent the conversation so far; the transcript goes on
  (session_resumed first, seq numbers on); turns count on, so `rollback --turn` reaches back past the
  resume; an AGENTS.md the box wrote during the first run is labelled as written since the start;
- `run --continue` in copy mode: the same copy, its manifest and checkpoints go on; `apply` lands both
  runs' changes; an unchanged AGENTS.md is labelled unchanged;
- refusals are typed and clear: running, discarded, no transcript, an exec session, --transcript;
- a hostile transcript (a huge line, invalid JSON, escape sequences in a tool output, a call without
  a result, a link, a FIFO, over the size cap) is read bounded and typed, never a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.transcript import Unreadable, read_records
from orchestrator.transcript.resume import NO_RESULT, rebuild
from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]


def oa(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_"))}
    environment.update(
        XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT)
    )
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=ROOT,
    )


def session_id(proc: subprocess.CompletedProcess) -> str:
    return json.loads(proc.stdout)["session_id"]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sessions_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "openagents-sandbox" / "sessions"


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


# -- refusals: typed and clear, before any sandbox ---------------------------------------------------------
def _record(tmp_path: Path, sid: str, **fields) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    d = sessions_dir(tmp_path) / sid
    d.mkdir(parents=True)
    transcript = d / "transcript.jsonl"
    transcript.write_text(json.dumps({"seq": 1, "type": "session_start", "task": "t"}) + "\n")
    body = {
        "id": sid,
        "created": time.time(),
        "kind": "run",
        "workspace": str(ws),
        "mode": "bind",
        "box_workspace": str(ws),
        "user": "1000:1000",
        "status": "finished",
        "transcript": str(transcript),
        "host_uid": os.getuid(),
        **fields,
    }
    (d / "session.json").write_text(json.dumps(body))
    return transcript


@pytest.mark.parametrize(
    "case, expect",
    [
        ("running", "is still running"),
        ("discarded", "was discarded"),
        ("no_transcript", "no transcript left"),
        ("exec", "`exec` session"),
        ("unknown", "no session"),
        ("transcript_flag", "appends to its own transcript"),
        ("transcript_in_workspace", "inside the workspace"),
    ],
)
def test_sessions_that_cannot_be_resumed_are_refused_typed(tmp_path, case, expect):
    sid = "20260101-000000-abcdef"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        extra: dict = {}
        if case == "running":
            extra = {"status": "running", "host_pid": sleeper.pid}
        elif case == "discarded":
            extra = {"discarded": True, "mode": "copy"}
        elif case == "exec":
            extra = {"kind": "exec"}
        elif case == "transcript_in_workspace":
            extra = {"transcript": str(tmp_path / "ws" / "t.jsonl")}
            (tmp_path / "ws").mkdir()
            (tmp_path / "ws" / "t.jsonl").write_text("{}\n")
        if case != "unknown":
            transcript = _record(tmp_path, sid, **extra)
            if case == "no_transcript":
                transcript.unlink()
        args = ["run", "--resume", sid, "--model", "script:/nonexistent", "--output", "json"]
        if case == "transcript_flag":
            args += ["--transcript", str(tmp_path / "new.jsonl")]
        proc = oa(tmp_path, *args, "go on")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == 2, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "setup_error" and out["error"]["type"] in (
        "invalid_arguments",
        "file_not_found",
        "unsafe_workspace_file",
    )
    assert expect in out["error"]["message"] and "Traceback" not in proc.stderr


def test_continue_without_a_session_of_the_workspace_is_refused(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    proc = oa(
        tmp_path, "run", "--workspace", str(ws), "--continue", "--model", "script:/nonexistent", "--output", "json", "x"
    )
    assert (
        proc.returncode == 2
        and json.loads(proc.stdout)["error"]["type"] == "file_not_found"
        and "no session of" in proc.stderr
    )


# -- a hostile transcript: bounded, typed, never a crash -----------------------------------------------------
def _line(**record) -> str:
    return json.dumps(record) + "\n"


def test_a_hostile_transcript_is_rebuilt_bounded_and_shown_without_escapes(tmp_path):
    path = tmp_path / "t.jsonl"
    with open(path, "w") as fh:
        fh.write(_line(seq=1, type="session_start", task="fix it"))
        fh.write(_line(seq=2, type="model_request", turn=1))
        fh.write(
            _line(
                seq=3,
                type="model_response",
                turn=1,
                text="looking",
                tool_calls=[
                    {"id": "c1", "name": "shell", "arguments": {"command": "ls"}},
                    {"id": "c2", "name": "read_file", "arguments": {"path": "a"}},
                ],
            )
        )
        fh.write("x" * (3 << 20) + "\n")  # a 3 MiB line: over the cap, passed over unread
        fh.write("{not json\n")
        fh.write("[" * 100_000 + "\n")  # nesting past jsonbound's depth
        fh.write("12\n")
        fh.write(
            _line(
                seq=4,
                type="tool_result",
                call_id="c1",
                tool="shell",
                ok=True,
                output="\x1b]0;owned\x07\x1b[2Jred\x1b[31m",
            )
        )
        fh.write(_line(seq=5, type="tool_result", call_id="zz", tool="shell", ok=True, output="a result for no call"))
        fh.write(
            _line(seq=6, type="tool_result", call_id="c1", tool="shell", state="bogus-state")
        )  # a damaged record of a known type
        fh.write('{"seq": 7, "type": "session_end", "turns": 1')  # cut short by a crash: no newline
    rebuilt = rebuild(path)
    roles = [(m.role, m.tool_call_id) for m in rebuilt.messages]
    assert roles == [("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2")]
    assert rebuilt.messages[2].content.startswith("\x1b]0;owned")  # the model reads what it read then
    assert rebuilt.messages[3].content == NO_RESULT and rebuilt.missing_results == 1
    assert rebuilt.unreadable == 6 and rebuilt.last_seq == 6 and rebuilt.previous_turns == 1
    assert "a result for no call" not in json.dumps([m.content for m in rebuilt.messages])
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "transcript", "show", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout and "unreadable line: a line over" in shown.stdout


def test_a_transcript_that_is_a_link_a_fifo_or_too_big_is_refused_typed(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text(_line(seq=1, type="session_start", task="t") * 100)
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    for path, kind in (
        (link, ErrorType.UNSAFE_WORKSPACE_FILE),
        (fifo, ErrorType.NOT_REGULAR_FILE),
        (tmp_path / "gone", ErrorType.FILE_NOT_FOUND),
    ):
        with pytest.raises(OpenAgentsError) as err:
            rebuild(path)
        assert err.value.type == kind
    with pytest.raises(OpenAgentsError) as err:
        list(read_records(real, max_total=1000))
    assert err.value.type == ErrorType.RESOURCE_EXHAUSTED
    assert all(not isinstance(r, Unreadable) for r in read_records(real))


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


# -- issue 41/40: whose record, which is newest, and the authority pinned at the start ---------------------
def _own_record(tmp_path: Path, sid: str, created: float, ws: Path):
    from orchestrator.workspace.records import SessionRecord, WorkspaceMode

    record = SessionRecord(
        id=sid,
        created=created,
        workspace=str(ws),
        mode=WorkspaceMode.BIND,
        box_workspace=str(ws),
        user="1000:1000",
        status="finished",
        transcript=str(tmp_path / f"{sid}.jsonl"),
    )
    Path(record.transcript or "").write_text("")
    record.save()
    return record


def test_continue_picks_the_newest_by_recorded_start_not_by_id_and_records_are_read_bounded(tmp_path, monkeypatch):
    from orchestrator.transcript.resume import newest
    from orchestrator.workspace.records import RECORD_CAP, list_sessions, open_own_record

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.py": "x = 1\n"})
    _own_record(tmp_path, "29991231-235959-aaaaaa", 1000.0, ws)  # a far-future id, started long ago
    real = _own_record(tmp_path, "20261201-120000-bbbbbb", 2000.0, ws)
    assert newest(ws).id == real.id
    # a record that is a link, or over the cap, is refused typed and passed over by the listing
    big = _own_record(tmp_path, "20261201-120001-cccccc", 3000.0, ws)
    (big.dir / "session.json").write_bytes(b" " * (RECORD_CAP + 1))
    linked = _own_record(tmp_path, "20261201-120002-dddddd", 4000.0, ws)
    (linked.dir / "session.json").unlink()
    (linked.dir / "session.json").symlink_to(real.dir / "session.json")
    for sid in (big.id, linked.id):
        with pytest.raises(OpenAgentsError) as err:
            open_own_record(sid)
        assert err.value.type is ErrorType.CONFIG_INVALID
    assert [r.id for r in list_sessions(all_users=False)] == [real.id, "29991231-235959-aaaaaa"]
    assert newest(ws).id == real.id


def test_a_resume_takes_the_pinned_policy_and_refuses_a_tampered_pin(tmp_path, monkeypatch):
    from orchestrator.policy import pins

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.py": "x = 1\n"})
    policy = tmp_path / "mine.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    record = _own_record(tmp_path, "20261201-120000-eeeeee", 1.0, ws)
    start = pins.user_sources([str(policy)], ws)
    assert [s.box_reach for s in start] == [False]
    pins.save(record, start)
    record.save()
    policy.write_text('tier = "admin"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    said: list[str] = []
    again = pins.user_sources([str(policy)], ws, record, say=said.append)
    assert again[0].raw == b'[[rules]]\ntool = "shell"\ndecision = "deny"\n' and "changed since session" in said[0]
    assert pins.parse(again[0]).rules[0].decision.value == "deny"
    (record.dir / "pins" / record.pins[0].pinned).write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    with pytest.raises(OpenAgentsError) as err:
        pins.user_sources([str(policy)], ws, record)
    assert err.value.type is ErrorType.CONFIG_INVALID and "pinned at its start has changed" in err.value.message
