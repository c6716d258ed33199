"""Issue 27 items 1, 4, 5 as a user meets them: the real CLI (this worktree's code, in a subprocess)
against a real model server of our own on loopback and real sandboxes.

- a streamed answer's text reaches stderr piece by piece, and the final text once on stdout;
- a refused port fails in about a second, typed, before any sandbox exists;
- a silent server stops the session with model_api_error within --model-timeout;
- AGENTS.md at the root and in a directory the model reads reaches the model (the server records
  the requests); a symlinked AGENTS.md pointing at a host file is refused, its content never sent;
- anthropic:MODEL runs a whole session with tool_use / tool_result over the event stream.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = [pytest.mark.docker, pytest.mark.serial]
ROOT = Path(__file__).resolve().parents[2]


def oa(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_"))}
    environment.update(
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
        **(env or {}),
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


def boxes() -> set[str]:
    client = docker.from_env(timeout=300)  # the daemon is shared and may be slow; no inspect per box
    try:
        image = os.environ.get("OA_SANDBOX_IMAGE", "openagents-sandbox:latest")
        return {c["Id"] for c in client.api.containers(all=True, filters={"ancestor": image})}
    finally:
        client.close()


@pytest.fixture
def server():
    with FakeModelServer() as srv:
        yield srv


def test_the_cli_runs_this_worktree():
    proc = subprocess.run(
        [sys.executable, "-c", "import orchestrator; print(orchestrator.__file__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert proc.stdout.strip().startswith(str(ROOT))


def test_a_refused_port_fails_in_about_a_second_before_any_box(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        before = boxes()
        started = time.monotonic()
        proc = oa(
            tmp_path,
            "run",
            "--workspace",
            str(ws),
            "--model",
            "openai:m",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--non-interactive",
            "--output",
            "json",
            "go",
        )
        took = time.monotonic() - started
    out = json.loads(proc.stdout)
    assert (
        proc.returncode != 0
        and out["error"]["type"] == "model_api_error"
        and "cannot connect" in out["error"]["message"]
    )
    assert took < 5, took  # the interpreter's start included; the check itself is a refused connect
    assert boxes() == before
    assert not (tmp_path / "state" / "openagents-sandbox" / "sessions").exists() or not any(
        (tmp_path / "state" / "openagents-sandbox" / "sessions").iterdir()
    )


def test_a_streamed_session_shows_text_as_it_comes_and_agents_md_reaches_the_model(sandbox_image, tmp_path, server):
    host_secret = tmp_path / "host-notes.md"
    host_secret.write_text("HOST-ONLY-MARKER-7731\n")
    ws = make_workspace(
        tmp_path / "ws",
        {
            "AGENTS.md": "Run tests with: make check ROOT-MARKER-4242\n",
            "src/AGENTS.md": "SUB-MARKER-5151\n",
            "src/a.py": "x = 1\n",
            "lib/b.py": "y = 2\n",
        },
    )
    (ws / "lib" / "AGENTS.md").symlink_to(host_secret)
    server.openai_stream(
        "Reading the code first.",
        [("read_file", {"path": "src/a.py"}), ("read_file", {"path": "lib/b.py"})],
        delay_s=0.01,
    )
    server.openai_stream("All done:\nthe code is fine.", delay_s=0.01)
    transcript = tmp_path / "t.jsonl"
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
        "--transcript",
        str(transcript),
        "go",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "◆ model: Reading the code first." in proc.stderr
        and "◆ model: All done:\n    │ the code is fine." in proc.stderr
    )
    assert proc.stderr.count("All done:") == 1 and proc.stdout.strip() == "All done:\nthe code is fine."
    first, second = (r["body"]["messages"][0]["content"] for r in server.requests)
    assert "ROOT-MARKER-4242" in first and "untrusted" in first and "SUB-MARKER-5151" not in first
    assert "SUB-MARKER-5151" in second and "sandbox may have written it" in second  # src/ was worked in: its file joins
    assert "HOST-ONLY-MARKER-7731" not in json.dumps(server.requests)  # the link is refused, never followed
    assert 'path="lib/AGENTS.md"' in second and "not shown" in second
    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    context = [(r["path"], r["outcome"]) for r in records if r["type"] == "context_file"]
    assert context == [("AGENTS.md", "given"), ("src/AGENTS.md", "given"), ("lib/AGENTS.md", "refused")]
    assert not any(r["type"] == "model_text" for r in records)  # live only: model_response has the text
    assert [r["text"] for r in records if r["type"] == "model_response"] == [
        "Reading the code first.",
        "All done:\nthe code is fine.",
    ]


def test_a_silent_model_stops_the_session_within_model_timeout(sandbox_image, tmp_path, server):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    server.hang(60)
    started = time.monotonic()
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
        "--model-timeout",
        "2",
        "--output",
        "json",
        "go",
    )
    out = json.loads(proc.stdout)
    assert (
        out["status"] == "stopped"
        and out["error"]["type"] == "model_api_error"
        and "--model-timeout" in out["error"]["message"]
    )
    assert "waiting for the model (1 s)" in proc.stderr
    assert len(server.requests) == 1 and time.monotonic() - started < 60


def test_an_anthropic_session_with_tool_use_over_the_event_stream(sandbox_image, tmp_path, server):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    server.anthropic_stream("Looking.", [("shell", {"command": "cat a.txt; env"})])
    server.anthropic_stream("It says one.")
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        "anthropic:claude-test",
        "--auto-approve",
        "--non-interactive",
        "--output",
        "json",
        "what does a.txt say",
        env={"ANTHROPIC_BASE_URL": server.root_url, "ANTHROPIC_API_KEY": "sk-ant-secret-9876543210"},
    )
    out = json.loads(proc.stdout)
    assert out["status"] == "finished" and out["final_text"] == "It says one.", proc.stderr
    assert out["tokens"] == {"input": 42, "output": 18}
    second = server.requests[1]
    assert second["path"] == "/v1/messages" and second["headers"]["x-api-key"] == "sk-ant-secret-9876543210"
    body = second["body"]
    assert body["tools"][0]["input_schema"] and body["messages"][1]["content"][1]["type"] == "tool_use"
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_s0" and "one" in result["content"]
    assert (
        "PATH=" in result["content"]
        and "sk-ant-secret" not in result["content"]
        and "ANTHROPIC" not in result["content"]
    )  # the key stays on the host


def test_acp_sends_a_streamed_answer_as_agent_message_chunks(sandbox_image, tmp_path, server, monkeypatch):
    """The official ACP SDK as the editor: each piece of the streamed text is one agent_message_chunk,
    and the whole text is not sent again at the end."""
    from acp import text_block

    from tests.helpers import acp_editor

    wrapper = tmp_path / "oa-sandbox"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m orchestrator.cli "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(acp_editor, "OA", str(wrapper))  # this worktree's code, not the installed entry point's
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    server.openai_stream("Hello from a streamed model.")

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        return (await conn.prompt(session_id=session.session_id, prompt=[text_block("hi")])).stop_reason

    run = acp_editor.run_editor(
        tmp_path,
        ["--model", "openai:fake", "--base-url", server.base_url, "--transcript-dir", str(tmp_path / "t")],
        body,
    )
    assert run.result == "end_turn"
    chunks = [u.content.text for u in run.editor.updates if getattr(u, "session_update", "") == "agent_message_chunk"]
    assert len(chunks) > 3 and "".join(chunks) == "Hello from a streamed model."
