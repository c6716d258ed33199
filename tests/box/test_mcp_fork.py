"""Issue 37, `fork` in the MCP server (copy mode), driven by the official MCP SDK's stdio client:
the session's own copy forks into N new copy sessions (each with the state after the last call,
each its own copy: a write through one is in no other), an ended session of the user's forks by id,
bad arguments are typed, and a policy's deny rule refuses the call (refused_by_policy) through the
one call pipeline, as for the six tools."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.helpers.mcp_copy_mode import Checked, server_params, text

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def sessions(state: Path) -> dict[str, dict]:
    out = {}
    for path in state.glob("openagents-sandbox/sessions/*/session.json"):
        record = json.loads(path.read_text())
        out[record["id"]] = record
    return out


def copy_of(state: Path, session_id: str) -> Path:
    return state / "openagents-sandbox" / "sessions" / session_id / "copy"


def test_fork_this_session_and_an_ended_one_by_id(sandbox_image, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    state = tmp_path / "state"

    async def first() -> tuple[str, list[str]]:
        async with Client(
            server_params(ws, state, "--workspace-mode", "copy", "--runtime", "runc"), read_timeout_seconds=120
        ) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "fork" in tools and tools["fork"].input_schema["properties"]["n"]["maximum"] == 16
            call = Checked(client, tools)
            assert not (await call("write_file", {"path": "a.txt", "content": "two\n"})).is_error
            forked = await call("fork", {"n": 2})
            assert not forked.is_error, text(forked)
            ids = forked.structured_content["session_ids"]
            assert len(ids) == 2 and len(set(ids)) == 2
            own = forked.structured_content["forked_from"]
            for bad in ({"n": 0}, {"n": 17}, {"n": "2"}, {"surprise": 1}):
                refused = await call("fork", bad)
                assert refused.is_error and refused.structured_content["error"]["type"] == "invalid_arguments", bad
            gone = await call("fork", {"session_id": "20990101-000000-abcdef"})
            assert gone.is_error
            return own, ids

    own, ids = anyio.run(first)
    assert (ws / "a.txt").read_text() == "one\n"  # the real workspace is untouched
    records = sessions(state)
    for fork_id in ids:
        assert records[fork_id]["forked_from"] == own
        assert (copy_of(state, fork_id) / "a.txt").read_text() == "two\n"  # the state after the last call
    (copy_of(state, ids[0]) / "a.txt").write_text("three\n")
    assert (copy_of(state, ids[1]) / "a.txt").read_text() == "two\n"  # no shared writable inode

    async def second() -> list[str]:
        async with Client(
            server_params(ws, state, "--workspace-mode", "copy", "--runtime", "runc"), read_timeout_seconds=120
        ) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            forked = await Checked(client, tools)("fork", {"session_id": own, "n": 1})  # the first session has ended
            assert not forked.is_error, text(forked)
            assert forked.structured_content["forked_from"] == own
            return list(forked.structured_content["session_ids"])

    (again,) = anyio.run(second)
    assert sessions(state)[again]["forked_from"] == own and (copy_of(state, again) / "a.txt").read_text() == "two\n"


def test_a_deny_rule_refuses_fork(sandbox_image, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    state = tmp_path / "state"
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nid = "no-forks"\ntool = "fork"\ndecision = "deny"\n')

    async def session() -> str:
        async with Client(
            server_params(ws, state, "--workspace-mode", "copy", "--runtime", "runc", "--policy", str(policy)),
            read_timeout_seconds=120,
        ) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            denied = await Checked(client, tools)("fork", {"n": 2})
            assert denied.is_error and denied.structured_content["error"]["type"] == "refused_by_policy", text(denied)
            return text(denied)

    anyio.run(session)
    assert len(sessions(state)) == 1  # no fork was made
    transcripts = list(state.glob("openagents-sandbox/sessions/*/transcript.jsonl"))
    assert any(
        '"fork"' in p.read_text() and "no-forks" in p.read_text() for p in transcripts
    )  # the pipeline recorded the refusal
