"""Issue 40 (the workspace access level; landing is an action the ladder decides): an edit rule
governed edit *tools*, not file *changes*, so an admin who denied every edit still got the files an
allowed shell command wrote landed by `run --apply`, `oa-sandbox apply`, MCP's apply_changes or
ACP's end of a turn, and no rule could name the landing.

Each front-end is driven as a user drives it (the real CLI of this tree, the MCP SDK's client, the
ACP SDK's editor) with real sandboxes, under an admin policy (OA_ADMIN_POLICY) that allows the
shell and then: denies every edit, sets `workspace_access = "copy-only"`, or `"read-only"`. The
shell writes a file in the copy; every landing is refused with the same typed error
(refused_by_policy, "landing refused") and the file never reaches the workspace. With no such
policy (the control) the same run lands it, so the refusals are not a broken landing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from acp import text_block
from mcp import Client, StdioServerParameters

from tests.helpers import make_workspace
from tests.helpers.acp_editor import Editor, run_editor

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned workspace (copy mode under auto) needs root to make"),
]
ROOT = Path(__file__).resolve().parents[2]
SHELL = '[[rules]]\ntool = "shell"\ndecision = "allow"\n'
POLICIES = {
    "deny-edits": 'tier = "admin"\n' + SHELL + '[[rules]]\nid = "no-edits"\nkind = "edit"\ndecision = "deny"\n',
    "deny-land": 'tier = "admin"\n' + SHELL + '[[rules]]\nid = "no-landing"\naction = "land"\ndecision = "deny"\n',
    "copy-only": 'tier = "admin"\nworkspace_access = "copy-only"\n' + SHELL,
    "read-only": 'tier = "admin"\nworkspace_access = "read-only"\n' + SHELL,
}
WRITE = "echo from-the-shell > made.txt"


def environment(tmp_path: Path, variant: str | None, user_policy: str | None = None) -> dict[str, str]:
    admin = tmp_path / "admin.toml"
    admin.write_text(POLICIES[variant] if variant else 'tier = "admin"\n' + SHELL)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_"))}
    env.update(
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
        OA_ADMIN_POLICY=str(admin),
    )
    return env


def root_owned(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("print('old')\n")
    assert ws.stat().st_uid == 0
    return ws


def script(tmp_path: Path, turns: list[dict]) -> str:
    path = tmp_path / "model.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return f"script:{path}"


def oa(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )


def refused_landing(error: dict | str | None) -> bool:
    text = json.dumps(error) if not isinstance(error, str) else error
    return "refused_by_policy" in text and "landing refused" in text


@pytest.mark.parametrize("variant", [None, *POLICIES])
def test_run_apply_and_oa_sandbox_apply_meet_the_ladder(sandbox_image, tmp_path, variant):
    """`run --apply` and a later `oa-sandbox apply ID` land nothing an allowed shell command wrote when an admin
    denies edits, denies landing, or sets copy-only or read-only: one typed refusal (refused_by_policy), exit 3."""
    ws = root_owned(tmp_path)
    env = environment(tmp_path, variant)
    model = script(
        tmp_path, [{"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": WRITE}}]}, {"text": "done"}]
    )
    run = oa(
        env, "run", "--workspace", str(ws), "--model", model, "--non-interactive", "--output", "json", "--apply", "go"
    )
    out = json.loads(run.stdout)
    assert out["workspace_mode"] == "copy", run.stderr
    if variant is None:  # the control: the same run lands the shell's file
        assert (
            run.returncode == 0
            and out["applied"] == ["made.txt"]
            and (ws / "made.txt").read_text() == "from-the-shell\n"
        ), run.stderr
        return
    assert run.returncode == 3 and refused_landing(out["error"]) and out["applied"] == [], (run.stdout, run.stderr)
    assert not (ws / "made.txt").exists() and "landing refused" in run.stderr
    later = oa(env, "apply", out["session_id"])
    assert later.returncode == 3 and refused_landing(later.stderr), later.stderr
    assert not (ws / "made.txt").exists()
    if variant == "read-only":  # the copy itself was mounted read-only: the shell could not even write it
        assert out["calls"]["failed"] == 1 and "made.txt" not in json.dumps(out["changed_files"])


def test_read_only_in_bind_mode_mounts_the_workspace_read_only_and_refuses_every_edit(sandbox_image, tmp_path):
    """workspace_access = read-only in bind mode: the box's shell cannot write the workspace (a
    read-only mount), write_file and edit_file are refused typed, the files stay as they were."""
    ws = make_workspace(tmp_path / "ws", {"app.py": "print('old')\n"})  # owned by uid 1000: bind mode
    env = environment(tmp_path, "read-only")
    policy = tmp_path / "p.toml"
    policy.write_text(
        '[[rules]]\nkind = "edit"\ndecision = "allow"\n'
    )  # the user's allow cannot widen the admin's level
    model = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"id": "s1", "name": "shell", "arguments": {"command": f"{WRITE}; echo x >> app.py"}},
                    {"id": "w1", "name": "write_file", "arguments": {"path": "new.txt", "content": "x\n"}},
                    {
                        "id": "e1",
                        "name": "edit_file",
                        "arguments": {"path": "app.py", "old_text": "old", "new_text": "new"},
                    },
                ]
            },
            {"text": "done"},
        ],
    )
    run = oa(
        env,
        "run",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "bind",
        "--policy",
        str(policy),
        "--model",
        model,
        "--non-interactive",
        "--output",
        "json",
        "go",
    )
    out = json.loads(run.stdout)
    assert out["workspace_mode"] == "bind", run.stderr
    refused = {c["tool"]: c for c in out["refused_calls"]}
    assert set(refused) == {"write_file", "edit_file"} and all(
        c["error_type"] == "refused_by_policy" for c in refused.values()
    )
    assert "read-only" in refused["write_file"]["reason"]
    assert [c["exit_code"] for c in out["failed_calls"]] not in ([], [0])  # the shell's writes failed
    assert sorted(p.name for p in ws.iterdir()) == ["app.py"] and (ws / "app.py").read_text() == "print('old')\n"


def test_copy_only_refuses_bind_mode_before_any_box(tmp_path):
    """workspace_access = copy-only: a session asked for in bind mode is refused,
    typed, before any box exists (its edits would land with no landing to refuse)."""
    ws = make_workspace(tmp_path / "ws", {"app.py": "x\n"})
    env = environment(tmp_path, "copy-only")
    run = oa(
        env,
        "run",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "bind",
        "--model",
        script(tmp_path, [{"text": "hi"}]),
        "--non-interactive",
        "--output",
        "json",
        "go",
    )
    out = json.loads(run.stdout)
    assert (
        run.returncode == 2 and out["error"]["type"] == "refused_by_policy" and "copy-only" in out["error"]["message"]
    ), run.stdout


@pytest.mark.parametrize("variant", [None, "deny-edits", "copy-only", "read-only"])
def test_mcp_apply_changes_meets_the_ladder(sandbox_image, tmp_path, variant):
    """MCP's apply_changes lands nothing an allowed shell command wrote when an admin denies
    edits or sets copy-only or read-only: an isError result typed refused_by_policy."""
    ws = root_owned(tmp_path)
    env = environment(tmp_path, variant)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws)], env=env, cwd=ROOT
    )

    async def session():
        async with Client(params, read_timeout_seconds=120) as client:
            await client.call_tool("shell", {"command": WRITE})
            return await client.call_tool("apply_changes", {})

    applied = anyio.run(session)
    if variant is None:
        assert not applied.is_error and (ws / "made.txt").read_text() == "from-the-shell\n"
        return
    assert applied.is_error and applied.structured_content["error"]["type"] == "refused_by_policy"
    assert refused_landing(applied.structured_content["error"]) and not (ws / "made.txt").exists()


@pytest.mark.parametrize("variant", [None, "deny-edits", "copy-only", "read-only"])
def test_acp_end_of_turn_landing_meets_the_ladder(sandbox_image, tmp_path, variant):
    """ACP's end-of-turn landing (copy mode) lands nothing an allowed shell command wrote when an admin
    denies edits or sets copy-only or read-only: the turn's _meta error says refused_by_policy."""
    ws = root_owned(tmp_path)
    env = environment(tmp_path, variant)
    model = script(
        tmp_path, [{"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": WRITE}}]}, {"text": "done"}]
    )

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])
        return (answer.field_meta or {}).get("dev.openagents.sandbox/copyMode")

    meta = run_editor(
        tmp_path, ["--model", model, "--transcript-dir", str(tmp_path / "t")], body, editor=Editor(), env=env
    ).result
    if variant is None:
        assert meta["landed"] is True and meta["applied"] == ["made.txt"] and (ws / "made.txt").exists()
        return
    assert meta["landed"] is False and refused_landing(meta.get("error")), meta
    assert meta["applied"] == [] and not (ws / "made.txt").exists()


@pytest.mark.parametrize(
    "mode", ["auto", "legacy"]
)  # 2026-07-28: InputRequiredResult; handshake era: elicitation/create
def test_mcp_a_landing_rule_that_asks_is_put_to_the_client(sandbox_image, tmp_path, mode):
    """A landing rule that asks: MCP's apply_changes puts the question to the client's user
    (elicitation); a rejection lands nothing (rejected_by_user), an acceptance lands."""
    ws = root_owned(tmp_path)
    env = environment(tmp_path, None)
    (tmp_path / "admin.toml").write_text('tier = "admin"\n' + SHELL + '[[rules]]\naction = "land"\ndecision = "ask"\n')
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws)], env=env, cwd=ROOT
    )
    asked: list[str] = []

    async def answer(ctx, params):
        from mcp_types import ElicitResult

        asked.append(params.message)
        return ElicitResult(action="accept", content={"allow": len(asked) > 1})

    async def session():
        async with Client(params, read_timeout_seconds=120, elicitation_callback=answer, mode=mode) as client:
            await client.call_tool("shell", {"command": WRITE})
            first = await client.call_tool("apply_changes", {})
            on_disk = (ws / "made.txt").exists()
            second = await client.call_tool("apply_changes", {})
            return first, on_disk, second

    first, on_disk, second = anyio.run(session)
    assert first.is_error and first.structured_content["error"]["type"] == "rejected_by_user" and not on_disk
    assert not second.is_error and (ws / "made.txt").read_text() == "from-the-shell\n"
    assert len(asked) == 2 and all("land" in message for message in asked)


def test_acp_a_landing_rule_that_asks_is_put_to_the_editor(sandbox_image, tmp_path):
    """A landing rule that asks: ACP's end-of-turn landing is put to the editor
    (session/request_permission); a rejection lands nothing (rejected_by_user)."""
    ws = root_owned(tmp_path)
    env = environment(tmp_path, None)
    (tmp_path / "admin.toml").write_text('tier = "admin"\n' + SHELL + '[[rules]]\naction = "land"\ndecision = "ask"\n')
    model = script(
        tmp_path, [{"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": WRITE}}]}, {"text": "done"}]
    )
    editor = Editor(decide=lambda tool_call: "reject_once" if "land" in (tool_call.title or "") else "allow_once")

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])
        return (answer.field_meta or {}).get("dev.openagents.sandbox/copyMode")

    run = run_editor(
        tmp_path, ["--model", model, "--transcript-dir", str(tmp_path / "t")], body, editor=editor, env=env
    )
    meta = run.result
    assert [p.title for p in run.editor.permissions] == ["land the private copy's changes in the real workspace"]
    assert meta["landed"] is False and "rejected_by_user" in meta["error"] and not (ws / "made.txt").exists()


@pytest.mark.parametrize("variant", ["deny-edits", "copy-only"])
def test_the_public_api_apply_meets_the_ladder(sandbox_image, tmp_path, monkeypatch, variant):
    """The public API's Sandbox.apply() lands nothing an allowed shell command wrote
    when an admin denies edits or sets copy-only: ToolError(refused_by_policy)."""
    from orchestrator import Sandbox, ToolError

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    for key, value in environment(tmp_path, variant).items():
        monkeypatch.setenv(key, value)
    with Sandbox(ws, mode="copy") as box:
        box.shell(WRITE)
        with pytest.raises(ToolError) as err:
            box.apply()
    assert err.value.type.value == "refused_by_policy" and "landing refused" in err.value.message
    assert not (ws / "made.txt").exists()
