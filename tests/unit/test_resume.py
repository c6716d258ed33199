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
from tests.helpers.resume import ROOT, oa, sessions_dir


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
