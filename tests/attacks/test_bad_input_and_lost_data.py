"""Bad input from the model, and attempts to lose or corrupt data."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.loop import SessionStatus, TurnLoop
from orchestrator.models.base import ModelTurn, ToolCall
from orchestrator.models.script import ScriptedModel
from orchestrator.policy.approvals import ApprovalGate, NonInteractiveApprover
from orchestrator.policy.ladder import Decision, Ladder, PolicyRule
from orchestrator.sandbox.docker import run_detached
from orchestrator.tools.registry import ToolRegistry
from orchestrator.transcript import Transcript

pytestmark = pytest.mark.docker

BAD_CALLS = [
    ("read_file", '{"path": 12}'),  # wrong type
    ("read_file", "{}"),  # missing field
    ("read_file", '{"path": "README.md", "as_root": true}'),  # extra field
    ("write_file", json.dumps({"path": "a.txt", "content": "x" * (9 << 20)})),  # megabyte-long string
    ("read_file", b'{"path": "\xff\xfe\xfd"}'.decode("latin-1")),  # not what it claims
    ("read_file", '{"path": "\\udcff"}'),  # lone surrogate: invalid UTF-8 once encoded
    ("read_file", "[" * 50_000 + "]" * 50_000),  # deeply nested
    ("read_file", "{not json"),  # broken JSON
    ("launch_missiles", "{}"),  # unknown tool
    ("shell", '{"command": ["rm", "-rf", "/"]}'),  # wrong type for a dangerous tool
]


def test_bad_calls_from_the_model_are_typed_and_recoverable(victim, tmp_path):
    """Wrong types, missing and extra fields, huge strings, bad UTF-8, deep nesting, broken JSON and unknown
    tools each come back to the model as a typed, recoverable error; the session finishes normally."""
    turns = [
        ModelTurn(tool_calls=[ToolCall(id=f"c{i}", name=name, arguments=args)])
        for i, (name, args) in enumerate(BAD_CALLS)
    ]
    turns.append(ModelTurn(text="done"))
    transcript = Transcript(tmp_path / "t.jsonl")
    rules = [PolicyRule(kind="edit", decision=Decision.ALLOW), PolicyRule(tool="shell", decision=Decision.ALLOW)]
    session = TurnLoop(
        ScriptedModel(turns),
        ToolRegistry(victim.box, victim.ws),
        ApprovalGate(Ladder(rules), NonInteractiveApprover()),
        transcript,
    )
    result = session.run("try everything")
    assert result.status == SessionStatus.FINISHED
    results = [e for e in transcript.events if e["type"] == "tool_result"]
    assert len(results) == len(BAD_CALLS)
    for event in results:
        assert event["ok"] is False and event["error"]["recoverable"] is True, event
        assert event["error"]["type"] in ("invalid_arguments", "unknown_tool", "path_invalid", "file_not_found"), event
    victim.assert_intact()


def test_bad_input_straight_on_the_wire(victim):
    """The agent alone (no host validation) answers bad arguments with typed errors and keeps serving."""
    assert victim.call("read_file", {"path": ["a"]}).error.type.value == "invalid_arguments"
    assert victim.call("shell", {"command": "true", "timeout": "999"}).error.type.value == "invalid_arguments"
    assert (
        victim.call("edit_file", {"path": "README.md", "old_text": "", "new_text": "x"}).error.type.value
        == "invalid_arguments"
    )
    nested: dict = {}
    for _ in range(5000):
        nested = {"a": nested}
    assert victim.call("read_file", {"path": "README.md", "x": nested}).error.type.value in (
        "invalid_arguments",
        "protocol_error",
    )
    assert victim.call("read_file", {"path": "\udcff"}).error.type.value == "invalid_arguments"
    victim.assert_intact()


def test_concurrent_writes_never_mix(victim):
    """Twenty concurrent write_file calls to one file: the file is exactly one of the writes, never a mix."""
    contents = [chr(ord("a") + i) * (256 * 1024) for i in range(20)]
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(lambda c: victim.call("write_file", {"path": "shared.txt", "content": c}), contents))
    assert all(r.ok for r in results)
    final = (victim.ws / "shared.txt").read_text()
    assert final in contents
    assert sorted(p.name for p in victim.ws.iterdir()) == [".git", "README.md", "shared.txt", "src"]  # no temp files
    victim.assert_intact(changed=("shared.txt",))


def test_concurrent_edits_lose_nothing(victim):
    """Ten concurrent edits of different lines of one file: every edit that reports success is in the file."""
    (victim.ws / "lines.txt").write_text("".join(f"line {i}\n" for i in range(10)))
    victim.seal()
    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(
            pool.map(
                lambda i: victim.call(
                    "edit_file", {"path": "lines.txt", "old_text": f"line {i}\n", "new_text": f"LINE {i}\n"}
                ),
                range(10),
            )
        )
    assert all(r.ok for r in results)
    assert (victim.ws / "lines.txt").read_text() == "".join(f"LINE {i}\n" for i in range(10))
    victim.assert_intact(changed=("lines.txt",))


def test_edit_with_a_stale_hash(victim):
    """An edit based on an old read is refused (stale hash) and the newer content survives."""
    seen = victim.call("read_file", {"path": "src/app.py"}).meta["sha256"]
    assert victim.call("write_file", {"path": "src/app.py", "content": "print('newer')\n"}).ok
    stale = victim.call(
        "edit_file", {"path": "src/app.py", "old_text": "newer", "new_text": "older", "expected_sha256": seen}
    )
    assert stale.error.type.value == "stale_content"
    assert (victim.ws / "src/app.py").read_text() == "print('newer')\n"
    victim.assert_intact(changed=("src/app.py",))


def test_agent_killed_in_the_middle_of_writes(victim):
    """The agent killed while large writes run: the file is the old or a new content, never a mix."""
    old = "o" * (4 << 20)
    (victim.ws / "big.txt").write_text(old)
    victim.seal()
    news = {hashlib.sha256((c * (4 << 20)).encode()).hexdigest() for c in "nmk"}
    threads = [
        threading.Thread(target=victim.call, args=("write_file", {"path": "big.txt", "content": c * (4 << 20)}))
        for c in "nmk"
    ]
    for t in threads:
        t.start()
    victim.box.kill_processes()
    victim.sh("kill 1")
    for t in threads:
        t.join()
    digest = hashlib.sha256((victim.ws / "big.txt").read_bytes()).hexdigest()
    assert digest in news | {hashlib.sha256(old.encode()).hexdigest()}
    victim.assert_intact(changed=("big.txt",) + tuple(p.name for p in victim.ws.glob(".big.txt.oa-tmp-*")))


def test_calls_right_after_the_agent_is_killed(victim):
    """The agent killed between two calls (as the writes' test above does with `kill 1`), then at
    once another call: it runs on the fresh agent (it never reached the dying one), and no call
    runs twice."""
    for i in range(5):
        # Detached: under gVisor an attached exec whose container's PID 1 dies never sees its stream end.
        # Its own exit code races the agent's death (0, or 137 when the dying PID 1 takes it along, or
        # none under gVisor): the restarts counted below show each kill landed.
        run_detached(victim.box.container, ["sh", "-c", "kill 1"], victim.box.user)
        after = victim.call("shell", {"command": f"echo {i} >> runs.txt; echo alive"})
        assert after.ok and after.output == "alive\n", after
    assert (victim.ws / "runs.txt").read_text() == "".join(f"{i}\n" for i in range(5)), "a call ran twice or not at all"
    assert victim.box.restarts >= 5
    victim.assert_intact(changed=("runs.txt",))
