"""Every front-end's path through the one pipeline (issue 34): what reads the box on the editor's
behalf meets the ladder and the transcript like a model's call, so a deny rule refuses it the same
way. (exec's test is in test_api.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acp import resource_link_block, text_block

from tests.helpers import make_workspace
from tests.helpers.acp_editor import run_editor
from tests.helpers.fake_model_server import FakeModelServer

KEY_ENV = {"OA_TEST_MODEL_KEY": "test-key"}


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_deny_rule_refuses_an_acp_resource_link_read(sandbox_image, tmp_path):
    """A resource link to a workspace file was read by calling the box directly: no ladder, so a
    policy denying read_file did not keep the file from the model. Now the read is a pipeline call:
    refused_by_policy, said in the task text, recorded in the transcript."""
    ws = make_workspace(
        tmp_path / "ws",
        {
            "docs/notes.md": "SECRET-PELICAN\n",
            ".openagents/policy.toml": '[[rules]]\ntool = "read_file"\ndecision = "deny"\n',
        },
    )
    with FakeModelServer() as server:
        server.openai_turn("noted")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            answer = await conn.prompt(
                session_id=session.session_id,
                prompt=[text_block("look"), resource_link_block("notes.md", (ws / "docs/notes.md").as_uri())],
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
            ],
            body,
            env=KEY_ENV,
        )
        requests = server.requests
    assert run.result == "end_turn"
    assert "SECRET-PELICAN" not in json.dumps(requests)
    task = [m for m in requests[0]["body"]["messages"] if m["role"] == "user"][-1]["content"]
    assert "refused_by_policy" in task and "notes.md" in task
    records = [
        json.loads(line)
        for path in Path(transcripts).rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    assert any(
        r["type"] == "approval" and r.get("tool") == "read_file" and r.get("decision") == "refused" for r in records
    )


# -- every front-end built on the API's Sandbox (issue 34, item 2) --------------------------------------
# What only a session the API opened has: its registry holds the program's own `rollback` (api/own_calls.py),
# which a model's call meets as an unknown tool saying whose it is; and its transcript is framed once
# (a model's session: the turn loop's session_start only; a session without a model: the API's).
ROOT = Path(__file__).resolve().parents[2]
THE_APIS = "rollback is the program's, not a tool of the model"
CALLS_ROLLBACK = [{"tool_calls": [{"name": "rollback", "arguments": {"turn": 0}}]}, {"text": "done"}]


def cli(tmp_path: Path, *args: str, timeout: float = 240):
    import os
    import subprocess
    import sys

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
        cwd=tmp_path,
    )


def session_files(tmp_path: Path) -> list[tuple[dict, list[dict]]]:
    """Each session's record and transcript, as the state directory holds them."""
    out = []
    for record in sorted((tmp_path / "state" / "openagents-sandbox" / "sessions").glob("*/session.json")):
        meta = json.loads(record.read_text())
        transcript = Path(meta.get("transcript") or record.parent / "transcript.jsonl")
        said = (
            [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
            if transcript.is_file()
            else []
        )
        out.append((meta, said))
    return out


def through_the_api(said: list[dict]) -> None:
    refused = [r for r in said if r["type"] == "tool_result" and r.get("tool") == "rollback"]
    assert refused and refused[0]["error"]["type"] == "unknown_tool" and THE_APIS in refused[0]["error"]["message"], (
        refused
    )
    assert (
        len([r for r in said if r["type"] == "session_start"]) == 1
    )  # the turn loop's; the API adds none to a model's session


def write_script(tmp_path: Path, turns: list[dict]) -> Path:
    path = tmp_path / "calls.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return path


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_run_opens_its_session_through_the_api(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    proc = cli(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{write_script(tmp_path, CALLS_ROLLBACK)}",
        "--output",
        "json",
        "go",
    )
    summary = json.loads(proc.stdout)
    assert summary["status"] == "finished", proc.stderr
    [(record, said)] = session_files(tmp_path)
    assert record["kind"] == "run" and record["id"] == summary["session_id"] and record["status"] == "finished"
    through_the_api(said)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_batch_opens_each_session_through_the_api(sandbox_image, tmp_path):
    make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps(
            {"id": "one", "workspace": "ws", "task": "go", "model": f"script:{write_script(tmp_path, CALLS_ROLLBACK)}"}
        )
        + "\n"
    )
    proc = cli(tmp_path, "batch", str(tasks), "--out", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 0, proc.stderr
    [(record, said)] = session_files(tmp_path)
    assert record["kind"] == "batch" and record["mode"] == "copy" and record["status"] == "finished"
    through_the_api(said)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_acp_opens_each_session_through_the_api(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with FakeModelServer() as server:
        server.openai_turn(tool_calls=[("rollback", {"turn": 0})]).openai_turn("done")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            return (await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])).stop_reason

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
            ],
            body,
            env=KEY_ENV,
        )
    assert run.result == "end_turn"
    [transcript] = list(transcripts.glob("*.jsonl"))
    through_the_api([json.loads(line) for line in transcript.read_text().splitlines() if line.strip()])


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_mcp_opens_its_session_through_the_api(sandbox_image, tmp_path):
    """A session without a model: the API frames its transcript (session_start of kind mcp at the
    open, session_end by the user at the close) and saves its record."""
    import anyio
    from mcp import Client, StdioServerParameters

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    transcript = tmp_path / "t.jsonl"
    import os
    import sys

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "--workspace", str(ws), "--transcript", str(transcript)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state")},
        cwd=ROOT,
    )

    async def session():
        async with Client(params, read_timeout_seconds=120) as client:
            shown = await client.call_tool("read_file", {"path": "a.txt"})
            assert not shown.is_error

    anyio.run(session)
    said = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    [start] = [r for r in said if r["type"] == "session_start"]
    assert (start["task"], start["family"]) == ("(mcp)", "mcp")
    [end] = [r for r in said if r["type"] == "session_end"]
    assert (end["executor"], end["status"], end["turns"]) == ("user", "closed", 1)
    [(record, _)] = session_files(tmp_path)
    assert record["kind"] == "mcp" and record["status"] == "closed"
