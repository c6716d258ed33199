"""Hooks as a user meets them, through every front-end (issue 35): the same BeforeTool hook, a real
script on the host, blocks `curl` in any form through `run`, `exec`, the Python API and the MCP
server; an AfterTool hook's context reaches the model's next turn; a BeforeTool rewrite is
validated again and the ladder decides after it; SessionStart/SessionEnd fire once a session.
Real CLI subprocesses (this tree's code), real sandboxes, a model server of our own on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from orchestrator.api import Sandbox, ToolError
from orchestrator.errors import ErrorType
from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]

GUARD = """#!{py}
import json, re, sys
event = json.load(sys.stdin)
with open({log!r}, "a") as log:
    log.write(event["hook_event_name"] + " " + event.get("tool_name", "") + "\\n")
command = (event.get("tool_input") or {{}}).get("command", "")
if re.search(r"curl", re.sub(r"[\\\\'\\"\\s]", "", command)):
    print("curl is not allowed here (the user's guard)", file=sys.stderr)
    sys.exit(2)
"""
LINT = """#!{py}
import json, sys
event = json.load(sys.stdin)
print(json.dumps({{"hookSpecificOutput": {{"additionalContext": "LINT-SAYS-42 after " + event["tool_name"]}}}}))
"""
LIFE = """#!{py}
import json, sys
event = json.load(sys.stdin)
open({log!r}, "a").write(event["hook_event_name"] + " " + event.get("source", event.get("reason", "")) + "\\n")
"""


def write_script(path: Path, template: str, **values: str) -> Path:
    path.write_text(template.format(py=sys.executable, **values))
    path.chmod(0o755)
    return path


def guard_policy(tmp_path: Path, extra: str = "") -> tuple[Path, Path]:
    """A user policy (outside the workspace) allowing shell, with the curl guard; and the hooks' log."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    log = hooks / "log"
    guard = write_script(hooks / "guard.py", GUARD, log=str(log))
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rules]]\ntool = "shell"\ndecision = "allow"\n\n[[hooks]]\nid = "no-curl"\nevent '
        f'= "BeforeTool"\nmatcher = "shell"\ncommand = ["{guard}"]\ntimeout = 20\n{extra}'
    )
    return policy, log


CURLS = ["curl -s http://127.0.0.1:9/", "c'u'rl http://127.0.0.1:9/", "/usr/bin/cu\\rl -V", "sh -c 'cu\"\"rl x'"]


def oa(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_", "OA_ADMIN"))
    }
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


def hook_records(tmp_path: Path) -> list[dict]:
    sessions = tmp_path / "state" / "openagents-sandbox" / "sessions"
    out = []
    for transcript in sessions.glob("*/transcript.jsonl"):
        out += [r for r in map(json.loads, transcript.read_text().splitlines()) if r["type"] == "hook"]
    return out


@pytest.mark.slow
def test_run_blocks_curl_in_any_form_and_after_tool_context_reaches_the_model(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    life_log = hooks / "life"
    lint = write_script(hooks / "lint.py", LINT)
    life = write_script(hooks / "life.py", LIFE, log=str(life_log))
    policy, log = guard_policy(
        tmp_path,
        f'\n[[hooks]]\nevent = "AfterTool"\nmatcher = "shell"\ncommand = ["{lint}"]\n'
        f'\n[[hooks]]\nevent = "SessionStart"\ncommand = ["{life}"]\n'
        f'\n[[hooks]]\nevent = "SessionEnd"\ncommand = ["{life}"]\n',
    )
    with FakeModelServer() as server:
        for command in CURLS:
            server.openai_turn("", [("shell", {"command": command})])
        server.openai_turn("", [("shell", {"command": "echo fine"})])
        server.openai_turn("done")
        proc = oa(
            tmp_path,
            "run",
            "--workspace",
            str(ws),
            "--model",
            "openai:m",
            "--base-url",
            server.base_url,
            "--non-interactive",
            "--policy",
            str(policy),
            "--output",
            "json",
            "try curl",
        )
        sent = [r["body"]["messages"] for r in server.requests]
    assert proc.returncode == 3, proc.stderr  # finished, with refused calls
    out = json.loads(proc.stdout)
    assert out["calls"]["refused"] == len(CURLS) and out["calls"]["ok"] == 1
    for turn in range(1, len(CURLS) + 1):
        tool_message = sent[turn][-1]
        assert tool_message["role"] == "tool" and "rejected_by_user" in tool_message["content"]
        assert "curl is not allowed here" in tool_message["content"]
    assert (
        "LINT-SAYS-42 after shell" in sent[len(CURLS) + 1][-1]["content"]
        and "fine" in sent[len(CURLS) + 1][-1]["content"]
    )
    assert log.read_text().count("BeforeTool shell") == len(CURLS) + 1
    assert life_log.read_text().splitlines() == ["SessionStart startup", "SessionEnd finished"]
    recs = hook_records(tmp_path)
    assert all(r["executor"] == "user" for r in recs)
    assert [r["outcome"] for r in recs if r["hook_event"] == "BeforeTool"] == ["blocked"] * len(CURLS) + ["ok"]


def test_exec_honours_the_same_hook(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy, _ = guard_policy(tmp_path)
    proc = oa(
        tmp_path, "exec", "--workspace", str(ws), "--policy", str(policy), "shell", json.dumps({"command": CURLS[1]})
    )
    result = json.loads(proc.stdout)
    assert (
        proc.returncode != 0
        and result["error"]["type"] == "rejected_by_user"
        and "curl is not allowed" in result["error"]["message"]
    )
    fine = oa(
        tmp_path, "exec", "--workspace", str(ws), "--policy", str(policy), "shell", json.dumps({"command": "echo fine"})
    )
    assert fine.returncode == 0 and "fine" in json.loads(fine.stdout)["output"]


def test_the_api_honours_the_hook_and_a_rewrite_is_validated_then_laddered(sandbox_image, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("OA_ADMIN_POLICY", raising=False)
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    rewrite = write_script(
        tmp_path / "rewrite.py",
        """#!{py}
import json, sys
event = json.load(sys.stdin)
command = event["tool_input"]["command"]
new = {{"rewrite-ok": {{"command": "echo rewritten"}}, "rewrite-bad": {{"command": 5}}, \
"rewrite-rm": {{"command": "rm a.txt"}}}}.get(command)
if command == "stop-now":
    print(json.dumps({{"continue": False, "stopReason": "enough for today"}}))
else:
    print(json.dumps({{"hookSpecificOutput": {{"tool_input": new}}}} if new else {{}}))
""",
    )
    policy, _ = guard_policy(
        tmp_path,
        f'\n[[hooks]]\nevent = "BeforeTool"\nmatcher = "shell"\ncommand = ["{rewrite}"]\n'
        '\n[[rules]]\nid = "no-rm"\ntool = "shell"\ncommand_prefix = "rm"\ndecision = "deny"\n',
    )
    with Sandbox(ws, auto_approve=True, policy_files=[policy]) as box:
        for command in CURLS:
            with pytest.raises(ToolError) as refused:
                box.shell(command)
            assert refused.value.type is ErrorType.REJECTED_BY_USER
        assert "rewritten" in box.shell("rewrite-ok").output  # the rewrite took effect
        with pytest.raises(ToolError) as bad:
            box.shell("rewrite-bad")
        assert bad.value.type is ErrorType.INVALID_ARGUMENTS  # validated again against the tool's schema
        with pytest.raises(ToolError) as denied:
            box.shell("rewrite-rm")
        assert denied.value.type is ErrorType.REFUSED_BY_POLICY  # the ladder decides after the hook
        with pytest.raises(ToolError) as stopped:
            box.shell("stop-now")
        assert stopped.value.type is ErrorType.HOOK_STOPPED and "enough for today" in str(stopped.value)
        transcript = box.transcript_path
    assert (ws / "a.txt").exists()
    judged = [json.loads(line) for line in Path(transcript).read_text().splitlines()]
    rewritten = [
        r["arguments"]["command"] for r in judged if r.get("state") == "awaiting_approval" and r.get("arguments")
    ]
    assert rewritten == ["echo rewritten", "rm a.txt"]  # each hook's new input is recorded as judged and run


def test_the_mcp_server_honours_the_hook(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy, log = guard_policy(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OA_ADMIN")}
    env.update(PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp_path / "state"))
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws), "--policy", str(policy)],
        env=env,
        cwd=ROOT,
    )

    async def session() -> None:
        async with Client(server, read_timeout_seconds=120) as client:
            for command in CURLS:
                refused = await client.call_tool("shell", {"command": command})
                assert refused.is_error and refused.structured_content["error"]["type"] == "rejected_by_user"
            fine = await client.call_tool("shell", {"command": "echo fine"})
            assert not fine.is_error

    anyio.run(session)
    assert log.read_text().count("BeforeTool shell") == len(CURLS) + 1


def test_batch_honours_the_hook(sandbox_image, tmp_path):
    make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy, log = guard_policy(tmp_path)
    script = tmp_path / "s.jsonl"
    script.write_text(
        json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": CURLS[3]}}]})
        + "\n"
        + json.dumps({"text": "gave up"})
        + "\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "workspace": "ws", "task": "fetch"}) + "\n")
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "batch",
            str(tasks),
            "--out",
            str(out),
            "--model",
            f"script:{script}",
            "--policy",
            str(policy),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("OA_ADMIN")},
            "PYTHONPATH": str(ROOT),
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
        },
    )
    assert out.exists(), proc.stderr
    assert log.read_text().splitlines() == ["BeforeTool shell"]
    blocked = [r for r in hook_records(tmp_path) if r["hook_event"] == "BeforeTool"]
    assert [r["outcome"] for r in blocked] == ["blocked"] and blocked[0]["executor"] == "user"


def test_acp_honours_the_hook(sandbox_image, tmp_path, monkeypatch):
    from orchestrator.acp import models as m
    from tests.helpers.acp import Editor, updates

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("OA_ADMIN_POLICY", raising=False)
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy, log = guard_policy(tmp_path)
    script = tmp_path / "s.jsonl"
    script.write_text(
        json.dumps({"tool_calls": [{"id": "t1", "name": "shell", "arguments": {"command": CURLS[2]}}]})
        + "\n"
        + json.dumps({"text": "Done."})
        + "\n"
    )
    editor = Editor("--model", f"script:{script}", "--policy", str(policy))
    try:
        editor.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        session_id = m.NewSessionResult.model_validate(
            editor.call("session/new", {"cwd": str(ws), "mcpServers": []})["result"]
        ).sessionId
        editor.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "fetch"}]})
    finally:
        editor.close()
    final = [u for u in updates(editor, "tool_call_update") if u.get("status") in ("completed", "failed")]
    assert final[0]["status"] == "failed" and "curl is not allowed" in final[0]["content"][0]["content"]["text"]
    assert not editor.permission_requests
    assert log.read_text().splitlines() == ["BeforeTool shell"]


def test_doctor_fails_on_a_hook_whose_program_cannot_run(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy = tmp_path / "p.toml"
    policy.write_text('[[hooks]]\nid = "gone"\nevent = "AfterTool"\ncommand = ["/nonexistent/lint"]\n')
    (tmp_path / "config" / "openagents-sandbox").mkdir(parents=True)
    (tmp_path / "config" / "openagents-sandbox" / "config.toml").write_text(f'policy = ["{policy}"]\n')
    proc = oa(tmp_path, "doctor", "--workspace", str(ws))
    assert proc.returncode != 0 and "[fail] hook gone (AfterTool" in proc.stdout and "is not a file" in proc.stdout, (
        proc.stdout[-2000:]
    )
    policy.write_text('[[hooks]]\nid = "fine"\nevent = "AfterTool"\ncommand = ["/bin/true"]\n')
    assert "1 hook(s) in force, every program executable" in oa(tmp_path, "doctor", "--workspace", str(ws)).stdout


def test_a_notification_hook_fires_before_a_person_is_asked(sandbox_image, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("OA_ADMIN_POLICY", raising=False)
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    log = tmp_path / "notify.log"
    hook = write_script(
        tmp_path / "notify.py",
        """#!{py}
import json, sys
e = json.load(sys.stdin)
open({log!r}, "a").write(e["notification_type"] + " " + e["details"]["tool_name"] + "\\n")
""",
        log=str(log),
    )
    policy = tmp_path / "p.toml"
    policy.write_text(f'[[hooks]]\nevent = "Notification"\nmatcher = "ToolPermission"\ncommand = ["{hook}"]\n')
    order: list[str] = []

    def approver(request):
        order.append("asked:" + (log.read_text() if log.exists() else ""))
        return True

    with Sandbox(ws, approver=approver, policy_files=[policy]) as box:
        box.read_file("a.txt")  # automatic: nobody is asked, no notification
        assert "x" in box.shell("echo x").output
    assert order == ["asked:ToolPermission shell\n"]
