"""Every front-end's path through the one pipeline (issue 34): what reads the box on the editor's
behalf meets the ladder and the transcript like a model's call, so a deny rule refuses it the same
way. (exec's test is in test_api.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from acp import resource_link_block, text_block

from tests.acp_editor import run_editor
from tests.conftest import make_workspace
from tests.fake_model_server import FakeModelServer

KEY_ENV = {"OA_TEST_MODEL_KEY": "test-key"}


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_deny_rule_refuses_an_acp_resource_link_read(sandbox_image, tmp_path):
    """A resource link to a workspace file was read by calling the box directly: no ladder, so a
    policy denying read_file did not keep the file from the model. Now the read is a pipeline call:
    refused_by_policy, said in the task text, recorded in the transcript."""
    ws = make_workspace(tmp_path / "ws", {"docs/notes.md": "SECRET-PELICAN\n",
                                          ".openagents/policy.toml": '[[rules]]\ntool = "read_file"\ndecision = "deny"\n'})
    with FakeModelServer() as server:
        server.openai_turn("noted")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            answer = await conn.prompt(session_id=session.session_id, prompt=[
                text_block("look"), resource_link_block("notes.md", (ws / "docs/notes.md").as_uri())])
            return answer.stop_reason

        transcripts = tmp_path / "t"
        run = run_editor(tmp_path, ["--model", "openai:fake", "--base-url", server.base_url, "--api-key-env", "OA_TEST_MODEL_KEY",
                                    "--transcript-dir", str(transcripts)], body, env=KEY_ENV)
        requests = server.requests
    assert run.result == "end_turn"
    assert "SECRET-PELICAN" not in json.dumps(requests)
    task = [m for m in requests[0]["body"]["messages"] if m["role"] == "user"][-1]["content"]
    assert "refused_by_policy" in task and "notes.md" in task
    records = [json.loads(line) for path in Path(transcripts).rglob("*.jsonl") for line in path.read_text().splitlines() if line.strip()]
    assert any(r["type"] == "approval" and r.get("tool") == "read_file" and r.get("decision") == "refused" for r in records)
