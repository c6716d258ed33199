"""Every path through the one pipeline (issue 34, item 3): one policy, put in the workspace, denies
a read of a file, MCP's `changes` and the landing; every front-end that can take the action is
refused with the same typed error (refused_by_policy), nothing is read or written, and the
transcript records the call, its decision and who decided. Real containers; the MCP server is
driven by the official `mcp` SDK client, ACP by the `acp` SDK (tests/helpers/acp_editor.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from acp import resource_link_block, text_block
from mcp import Client, StdioServerParameters

from orchestrator import ErrorType, Sandbox, ToolError
from tests.helpers import make_workspace
from tests.helpers.acp_editor import run_editor
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
REFUSED = "refused_by_policy"
# The one policy of every test here: a workspace policy may deny (never allow).
DENY_ALL = (
    '[[rules]]\ntool = "read_file"\ndecision = "deny"\n'
    '[[rules]]\ntool = "changes"\ndecision = "deny"\n'
    '[[rules]]\ntool = "apply_changes"\ndecision = "deny"\n'
)
SECRET = "SECRET-PELICAN"


def workspace(tmp_path: Path, policy: str = DENY_ALL) -> Path:
    return make_workspace(
        tmp_path / "ws", {"notes.md": SECRET + "\n", "app.py": "print('old')\n", ".openagents/policy.toml": policy}
    )


def mcp_params(ws: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws), *extra],
        env=ENV,
        cwd=REPO,
    )


def text(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def records(path: Path) -> list[dict]:
    files = [path] if path.is_file() else sorted(path.rglob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def decided(transcript: list[dict], tool: str) -> list[dict]:
    return [r for r in transcript if r["type"] == "approval" and r.get("tool") == tool]


def finished(transcript: list[dict], tool: str) -> list[dict]:
    return [r for r in transcript if r["type"] == "tool_result" and r.get("tool") == tool]


def test_mcp_changes_and_apply_changes_meet_the_deny_rule(sandbox_image, tmp_path):
    """`changes` read the copy and `apply_changes` wrote the real workspace beside the ladder: no
    rule could refuse `changes`, and neither was in the transcript as a call. Now both are
    pipeline calls: refused typed, nothing landed, each recorded with who decided."""
    ws = workspace(tmp_path)
    transcript = tmp_path / "t.jsonl"

    async def session():
        async with Client(
            mcp_params(ws, "--workspace-mode", "copy", "--transcript", str(transcript)), read_timeout_seconds=120
        ) as client:
            read = await client.call_tool("read_file", {"path": "notes.md"})
            assert read.is_error and read.structured_content["error"]["type"] == REFUSED and SECRET not in text(read)
            edited = await client.call_tool("write_file", {"path": "app.py", "content": "print('box')\n"})
            assert not edited.is_error, text(edited)
            shown = await client.call_tool("changes", {})
            assert shown.is_error and shown.structured_content["error"]["type"] == REFUSED, text(shown)
            assert "box" not in text(shown)
            landed = await client.call_tool("apply_changes", {})
            assert landed.is_error and landed.structured_content["error"]["type"] == REFUSED, text(landed)
            assert landed.structured_content["error"]["message"].startswith(
                "landing refused: "
            )  # every landing's one refusal
            bad = await client.call_tool("changes", {"stat": "yes"})
            assert bad.is_error and bad.structured_content["error"]["type"] == "invalid_arguments"

    anyio.run(session)
    assert (ws / "app.py").read_text() == "print('old')\n"  # nothing landed
    said = records(transcript)
    for tool in ("read_file", "changes", "apply_changes"):
        decision = decided(said, tool)
        assert (
            len(decision) == 1 and decision[0]["decision"] == "refused" and decision[0]["executor"] == "openagents"
        ), (tool, decision)
        result = finished(said, tool)
        assert result and result[0]["ok"] is False and result[0]["error"]["type"] == REFUSED, (tool, result)
    assert (
        finished(said, "changes")[-1]["error"]["type"] == "invalid_arguments"
    )  # validated before the ladder, recorded too
    assert not [r for r in said if r["type"] == "apply" and r.get("ok")]


def test_mcp_apply_changes_asked_of_the_user_is_recorded_with_its_decider(sandbox_image, tmp_path):
    """A rule that asks: the landing is put to the client's user (elicitation) as an edit's
    question is; the transcript records the call, the user's decision and the outcome; `changes`
    with no rule is a read the ladder lets through (decided by openagents, recorded)."""
    ws = workspace(tmp_path, '[[rules]]\ntool = "apply_changes"\ndecision = "ask"\n')
    transcript = tmp_path / "t.jsonl"
    asked: list[str] = []

    async def answer(ctx, params):
        from mcp_types import ElicitResult

        asked.append(params.message)
        return ElicitResult(action="accept", content={"allow": True})

    async def session():
        async with Client(
            mcp_params(ws, "--workspace-mode", "copy", "--transcript", str(transcript)),
            read_timeout_seconds=120,
            elicitation_callback=answer,
        ) as client:
            await client.call_tool("write_file", {"path": "app.py", "content": "print('box')\n"})
            shown = await client.call_tool("changes", {"stat": True})
            assert not shown.is_error and "app.py" in text(shown), text(shown)
            landed = await client.call_tool("apply_changes", {})
            assert not landed.is_error, text(landed)

    anyio.run(session)
    assert (ws / "app.py").read_text() == "print('box')\n"
    assert (
        len(asked) == 2 and "write_file" in asked[0] and "land the private copy" in asked[1]
    )  # the edit in the copy, then the landing
    said = records(transcript)
    [read] = decided(said, "changes")
    assert (read["decision"], read["executor"]) == ("automatic", "openagents")
    [land] = decided(said, "apply_changes")
    assert land["decision"] == "allow_once" and land["executor"] == "user" and land["action"] == "land"
    [done] = finished(said, "apply_changes")
    assert done["ok"] is True and done["executor"] == "openagents" and "app.py" in done["output"]
    assert [r["ok"] for r in said if r["type"] == "apply"] == [True]


def test_exec_meets_the_same_deny_rule(sandbox_image, tmp_path):
    ws = workspace(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "exec", "--workspace", str(ws), "read_file", '{"path": "notes.md"}'],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=180,
    )
    said = json.loads(proc.stdout)
    assert (proc.returncode, said["ok"], said["error"]["type"]) == (3, False, REFUSED) and SECRET not in proc.stdout


def test_the_api_meets_the_same_deny_rule(sandbox_image, tmp_path):
    ws = workspace(tmp_path)
    with Sandbox(
        ws, mode="copy", auto_approve=True
    ) as box:  # --auto-approve: the edit in the copy runs; never the landing
        with pytest.raises(ToolError) as read:
            box.read_file("notes.md")
        assert read.value.type is ErrorType.REFUSED_BY_POLICY
        box.write_file("app.py", "print('box')\n")
        with pytest.raises(ToolError) as landed:
            box.apply()
        assert landed.value.type is ErrorType.REFUSED_BY_POLICY and str(landed.value.message).startswith(
            "landing refused: "
        )
        transcript = box.transcript_path
    assert (ws / "app.py").read_text() == "print('old')\n"
    [refusal] = decided(records(transcript), "read_file")
    assert (refusal["decision"], refusal["executor"]) == ("refused", "openagents")


def test_an_acp_resource_link_meets_the_same_deny_rule(sandbox_image, tmp_path):
    ws = workspace(tmp_path)
    with FakeModelServer() as server:
        server.openai_turn("noted")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            answer = await conn.prompt(
                session_id=session.session_id,
                prompt=[text_block("look"), resource_link_block("notes.md", (ws / "notes.md").as_uri())],
            )
            return answer.stop_reason

        transcripts = tmp_path / "t"
        run = run_editor(
            tmp_path,
            [
                "--model",
                "openai:fake",
                "--base-url",
                server.base_url,
                "--api-key-env",
                "OA_TEST_MODEL_KEY",
                "--transcript-dir",
                str(transcripts),
                "--workspace-mode",
                "copy",
            ],
            body,
            env={"OA_TEST_MODEL_KEY": "test-key"},
        )
        requests = server.requests
    assert run.result == "end_turn" and SECRET not in json.dumps(requests)
    task = [m for m in requests[0]["body"]["messages"] if m["role"] == "user"][-1]["content"]
    assert REFUSED in task
    said = records(transcripts)
    [refusal] = decided(said, "read_file")
    assert (refusal["decision"], refusal["executor"]) == ("refused", "openagents")
    # a copy session: the turn's end-of-turn landing met the same rule, recorded
    [landing] = decided(said, "apply_changes")
    assert (landing["decision"], landing["executor"], landing["action"]) == ("refused", "openagents", "land")
    assert not [r for r in said if r["type"] == "apply" and r.get("ok")]


def test_an_acp_landing_allowed_is_recorded_with_its_outcome(sandbox_image, tmp_path):
    ws = workspace(tmp_path, "")
    with FakeModelServer() as server:
        server.openai_turn("nothing to do")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            return (await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])).stop_reason

        transcripts = tmp_path / "t"
        run = run_editor(
            tmp_path,
            [
                "--model",
                "openai:fake",
                "--base-url",
                server.base_url,
                "--api-key-env",
                "OA_TEST_MODEL_KEY",
                "--transcript-dir",
                str(transcripts),
                "--workspace-mode",
                "copy",
            ],
            body,
            env={"OA_TEST_MODEL_KEY": "test-key"},
        )
    assert run.result == "end_turn"
    said = records(transcripts)
    [landing] = decided(said, "apply_changes")
    assert (landing["decision"], landing["executor"]) == ("automatic", "openagents")
    assert [(r["via"], r["ok"], r["applied"]) for r in said if r["type"] == "apply"] == [("acp", True, 0)]


def test_the_api_changes_apply_and_rollback_meet_the_deny_rules(sandbox_image, tmp_path):
    """Sandbox.changes() read the copy and rollback() wrote the workspace beside the pipeline and
    the ladder (no rule could refuse them, the transcript never had them); apply() recorded its
    outcome but not its decision. Now each is refused typed by the rule that names it (changes,
    apply_changes, a deny of edits for rollback), nothing read or written, and each call's
    decision and outcome are in the transcript with who decided."""
    ws = workspace(tmp_path, DENY_ALL + '[[rules]]\nkind = "edit"\ndecision = "deny"\n')
    with Sandbox(ws, mode="copy", auto_approve=True) as box:
        for name, act in (
            ("changes", box.changes),
            ("apply_changes", box.apply),
            ("rollback", lambda: box.rollback(0)),
        ):
            with pytest.raises(ToolError) as refused:
                act()
            assert refused.value.type is ErrorType.REFUSED_BY_POLICY, (name, refused.value)
        transcript = box.transcript_path
    assert (ws / "app.py").read_text() == "print('old')\n"
    said = records(transcript)
    for tool in ("changes", "apply_changes", "rollback"):
        [decision] = decided(said, tool)
        assert (decision["decision"], decision["executor"]) == ("refused", "openagents"), (tool, decision)
        [result] = finished(said, tool)
        assert result["ok"] is False and result["error"]["type"] == REFUSED, (tool, result)
    assert not [r for r in said if r["type"] == "apply"]


def test_the_api_changes_apply_and_rollback_allowed_are_recorded(sandbox_image, tmp_path):
    """No rule: the typed results are as before (Changes, ApplyResult, RestoreReport), each call is
    decided and recorded; a call of these host tools that is not the program's own (a model's,
    through call()) is an unknown tool, never a landing."""
    ws = workspace(tmp_path, "")
    with Sandbox(ws, mode="copy", auto_approve=True) as box:
        box.write_file("app.py", "print('box')\n")
        shown = box.changes()
        assert (
            [(f.path, f.status) for f in shown.files] == [("app.py", "modified")]
            and "+print('box')" in shown.diff
            and "app.py" in shown.stat
        )
        stray = box.call("apply_changes")
        assert not stray.ok and stray.error is not None and stray.error.type is ErrorType.UNKNOWN_TOOL
        assert (ws / "app.py").read_text() == "print('old')\n"
        landed = box.apply()
        assert landed.ok and landed.applied == ["app.py"]
        box.write_file("app.py", "print('again')\n")
        restored = box.rollback(0)
        assert not restored.conflicts
        assert "print('old')" in box.read_file("app.py").text
        transcript = box.transcript_path
    assert (ws / "app.py").read_text() == "print('box')\n"
    said = records(transcript)
    for tool in ("changes", "apply_changes", "rollback"):
        [decision] = decided(said, tool)
        assert decision["decision"] != "refused", (tool, decision)
        assert [r["ok"] for r in finished(said, tool) if r["call_id"] == decision["call_id"]] == [True], tool
    assert [(r["via"], r["ok"], r["applied"]) for r in said if r["type"] == "apply"] == [("api", True, 1)]


BLOCK_ROLLBACK = """#!{py}
import json, sys
event = json.load(sys.stdin)
open({log!r}, "a").write(event["hook_event_name"] + " " + event.get("tool_name", "") + " " + \
json.dumps(event.get("tool_input")) + "\\n")
print("no rollback here (the user's hook)", file=sys.stderr)
sys.exit(2)
"""


def test_the_api_rollback_is_seen_and_refused_by_a_before_tool_hook(sandbox_image, tmp_path):
    """rollback() met the ladder beside the call pipeline, so the user's BeforeTool hooks never saw
    it and could not refuse it. Now it is a pipeline call: the hook sees `rollback` with its
    arguments and blocks it; nothing is restored; the transcript has the refusal, by the user."""
    log = tmp_path / "hook.log"
    script = tmp_path / "block.py"
    script.write_text(BLOCK_ROLLBACK.format(py=sys.executable, log=str(log)))
    script.chmod(0o755)
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[hooks]]\nid = "no-rollback"\nevent = "BeforeTool"\nmatcher '
        f'= "rollback"\ncommand = ["{script}"]\ntimeout = 20\n'
    )
    ws = workspace(tmp_path, "")
    with Sandbox(ws, auto_approve=True, policy_files=[policy]) as box:
        box.write_file("app.py", "print('new')\n")
        with pytest.raises(ToolError) as blocked:
            box.rollback(0)
        assert blocked.value.type is ErrorType.REJECTED_BY_USER and "no rollback here" in blocked.value.message
        assert (ws / "app.py").read_text() == "print('new')\n"  # nothing restored
        transcript = box.transcript_path
    assert log.read_text().splitlines() == ['BeforeTool rollback {"turn": 0}']
    [result] = finished(records(transcript), "rollback")
    assert (result["ok"], result["executor"], result["error"]["type"]) == (False, "user", "rejected_by_user")
    assert not decided(records(transcript), "rollback")  # the hook refused it before the ladder


def test_the_api_rollback_meets_a_rule_that_names_it(sandbox_image, tmp_path):
    """A rule `tool = "rollback"` (a name the policy loader now knows) refuses it, typed and
    recorded; a model's call of `rollback` (call(), as run()'s model would) is an unknown tool."""
    ws = workspace(tmp_path, '[[rules]]\ntool = "rollback"\ndecision = "deny"\n')
    with Sandbox(ws, auto_approve=True) as box:
        box.write_file("app.py", "print('new')\n")
        stray = box.call("rollback", {"turn": 0})
        assert not stray.ok and stray.error is not None and stray.error.type is ErrorType.UNKNOWN_TOOL
        with pytest.raises(ToolError) as refused:
            box.rollback(0)
        assert refused.value.type is ErrorType.REFUSED_BY_POLICY and "rollback" in refused.value.message
        assert (ws / "app.py").read_text() == "print('new')\n"
        transcript = box.transcript_path
    [decision] = decided(records(transcript), "rollback")
    assert (decision["decision"], decision["executor"], decision["action"]) == ("refused", "openagents", "rollback")
