"""`oa-sandbox mcp` driven by the official MCP SDK's stdio client, as Claude Code or Codex would drive
it: a real subprocess, a real sandbox, real files; no container is left once the client is gone."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
import jsonschema
import pytest
from mcp import Client, StdioServerParameters

from orchestrator.config import LABEL
from tests.helpers import make_workspace

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
OA = [sys.executable, "-m", "orchestrator.cli"]  # this tree's code, whatever the venv's entry point was installed from
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def params(workspace: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=OA[0], args=[*OA[1:], "mcp", "--workspace", str(workspace), *extra], env=ENV, cwd=REPO
    )


def boxes_of(docker_client, workspace: Path) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL}.workspace={workspace.resolve()}"})


def gone(docker_client, workspace: Path, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not boxes_of(docker_client, workspace):
            return True
        time.sleep(0.2)
    return False


def text(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def test_tools_files_errors_shell_and_no_box_left(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"hello.txt": "hi\n"})
    progress: list[float] = []

    async def session():
        async with Client(params(ws), read_timeout_seconds=120) as client:
            assert len(boxes_of(docker_client, ws)) == 1  # warm before the first call
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert sorted(tools) == sorted(
                ["read_file", "list_files", "grep_files", "write_file", "edit_file", "shell"]
            )
            for name in ("read_file", "list_files", "grep_files"):
                assert tools[name].annotations.read_only_hint is True
                assert tools[name].annotations.open_world_hint is False
            for name in ("write_file", "edit_file", "shell"):
                assert tools[name].annotations.read_only_hint is False
                assert tools[name].annotations.destructive_hint is True
            assert tools["read_file"].input_schema["required"] == ["path"]
            assert "Workspace mode: bind" in client.instructions  # a workspace the user owns: bind, nothing to apply

            async def call(name, arguments):  # every structuredContent conforms to the tool's declared outputSchema
                result = await client.call_tool(name, arguments)
                jsonschema.validate(result.structured_content, tools[name].output_schema)
                return result

            wrote = await call("write_file", {"path": "sub/new.txt", "content": "made over MCP\n"})
            assert not wrote.is_error, text(wrote)
            assert (ws / "sub/new.txt").read_text() == "made over MCP\n"
            assert "in_private_copy" not in wrote.structured_content and "private copy" not in text(wrote)
            read = await call("read_file", {"path": "sub/new.txt"})
            assert not read.is_error and "made over MCP" in text(read)
            # structuredContent is the whole result: the file's text, not only its metadata
            assert read.structured_content["output"] == "made over MCP\n" and read.structured_content["ok"] is True
            assert "sha256" in read.structured_content and read.structured_content["workspace_mode"] == "bind"

            outside = await call("write_file", {"path": "../x", "content": "no"})
            assert outside.is_error
            assert outside.structured_content["error"]["type"] == "path_outside_workspace"
            assert not (tmp_path / "x").exists()

            ran = await client.call_tool(
                "shell",
                {"command": "sleep 2.5; cat hello.txt; id -u"},
                progress_callback=lambda p, total, message: progress.append(p),
            )
            assert not ran.is_error, text(ran)
            assert "hi" in text(ran) and ran.structured_content["exit_code"] == 0
            assert ran.structured_content["output"].startswith("hi\n")  # the command's output itself
            jsonschema.validate(ran.structured_content, tools["shell"].output_schema)

            nothing = await client.call_tool("apply_changes", {})  # bind mode: not listed, and says why if called
            assert nothing.is_error and "bind mode" in text(nothing) and "nothing to apply" in text(nothing)
            assert text(ran).split()[-1] != "0"  # never root in the box

    anyio.run(session)
    assert progress, "a shell call that runs for seconds reports progress"
    assert gone(docker_client, ws), "the sandbox outlived its MCP client"
    sessions = sorted(
        (Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state")) / "openagents-sandbox/sessions").glob(
            "*/session.json"
        )
    )
    assert sessions  # a session record and its transcript, like run's


@pytest.mark.parametrize(
    "mode", ["auto", "legacy"]
)  # 2026-07-28: InputRequiredResult; handshake era: elicitation/create
def test_policy_deny_holds_and_elicitation_asks(sandbox_image, docker_client, tmp_path, mode):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nid = "no-rm"\ntool = "shell"\ncommand_prefix = "rm"\ndecision = "deny"\n')
    transcript = tmp_path / "t.jsonl"
    asked: list[str] = []

    async def answer(ctx, params):
        from mcp_types import ElicitResult

        asked.append(params.message)
        return ElicitResult(action="accept", content={"allow": "echo yes" in params.message})

    async def session():
        async with Client(
            params(ws, "--policy", str(policy), "--transcript", str(transcript)),
            read_timeout_seconds=120,
            elicitation_callback=answer,
            mode=mode,
        ) as client:
            assert (client.protocol_version >= "2026") == (mode == "auto")
            denied = await client.call_tool("shell", {"command": "rm a.txt"})
            assert denied.is_error and denied.structured_content["error"]["type"] == "refused_by_policy"
            assert not asked  # a deny is never put to the user
            allowed = await client.call_tool("shell", {"command": "echo yes"})
            assert not allowed.is_error and "yes" in text(allowed)
            rejected = await client.call_tool("shell", {"command": "echo no > b.txt"})
            assert rejected.is_error and rejected.structured_content["error"]["type"] == "rejected_by_user"
            read = await client.call_tool("read_file", {"path": "a.txt"})  # automatic: nobody is asked
            assert not read.is_error

    anyio.run(session)
    assert len(asked) == 2
    assert (ws / "a.txt").exists() and not (ws / "b.txt").exists()
    assert gone(docker_client, ws)
    events = transcript.read_text()
    assert '"approval"' in events and "no-rm" in events and '"session_end"' in events


def test_sigterm_removes_the_box(sandbox_image, docker_client, tmp_path):
    import json
    import signal
    import subprocess

    ws = make_workspace(tmp_path / "ws")
    proc = subprocess.Popen(
        [*OA, "mcp", "--workspace", str(ws)],
        env=ENV,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        proc.stdin.write(json.dumps(hello).encode() + b"\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())  # served: the box is up
        assert answer["id"] == 1 and "serverInfo" in answer["result"]
        assert boxes_of(docker_client, ws)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert gone(docker_client, ws, within=5)
