"""ACP conformance of `oa-sandbox acp`, with the official SDK as the editor (issue 13).

Each test starts the agent as a real subprocess and drives it through the SDK's client
connection (tests/helpers/acp_editor.py); every frame the agent sends is held to the SDK's schema models.
The model is a script (models/script.py), or the fake OpenAI server on loopback when the test
must see what the model was sent or make the model API fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from acp import RequestError, image_block, resource_link_block, text_block
from acp.schema import EnvVariable, McpServerStdio

from tests.helpers import make_workspace
from tests.helpers.acp_editor import run_editor
from tests.helpers.acp_sdk import MCP_SERVER, alive
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = pytest.mark.timeout(300)
KEY_ENV = {"OA_TEST_MODEL_KEY": "test-key"}


def script(tmp_path: Path, turns: list[dict]) -> str:
    path = tmp_path / "model.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return f"script:{path}"


def fake_model_args(server: FakeModelServer, tmp_path: Path) -> list[str]:
    return [
        "--model",
        "openai:fake",
        "--base-url",
        server.base_url,
        "--api-key-env",
        "OA_TEST_MODEL_KEY",
        "--transcript-dir",
        str(tmp_path / "t"),
    ]


def boxes_of(docker_client, pid: int) -> list:
    return docker_client.api.containers(
        all=True, filters={"label": f"dev.openagents.sandbox.host-pid={pid}"}
    )  # no inspect: no NotFound race


def user_text(request: dict) -> str:
    return [msg for msg in request["body"]["messages"] if msg["role"] == "user"][-1]["content"]


# -- 1. cancel while a shell command runs ----------------------------------------------------------
@pytest.mark.docker
def test_cancel_during_a_shell_command_ends_the_call_failed_for_good(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"data.txt": "original\n"})
    model = script(
        tmp_path,
        [
            {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "sleep 60; echo late > late.txt"}}]},
            {"text": "never reached"},
        ],
    )

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])

        async def cancel_once_running(session_id, update):
            if getattr(update, "tool_call_id", None) == "s1" and getattr(update, "status", None) == "in_progress":
                asyncio.get_running_loop().create_task(conn.cancel(session_id=session_id))

        editor.on_update = cancel_once_running
        answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("run it")])
        return answer.stop_reason

    run = run_editor(tmp_path, ["--model", model, "--transcript-dir", str(tmp_path / "t")], body)
    assert run.result == "cancelled"
    statuses = run.editor.statuses("s1")
    # The last status an editor keeps is the final one: failed, and nothing after it.
    assert statuses == ["pending", "in_progress", "failed"], statuses
    final = run.editor.last("s1")
    assert "cancelled" in final.content[-1].content.text
    assert run.editor.calls("s1")[-1] is final
    assert not (ws / "late.txt").exists() and (ws / "data.txt").read_text() == "original\n"
    assert boxes_of(docker_client, run.pid) == []


# -- 2. resource links -------------------------------------------------------------------------------
@pytest.mark.docker
def test_resource_links_reach_the_model_and_outside_files_are_named_not_read(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"docs/notes.md": "the password hint is PELICAN\nsecond line\n"})
    outside = tmp_path / "outside.txt"
    outside.write_text("OUTSIDE-CONTENT must never reach the model\n")

    with FakeModelServer() as server:
        server.openai_turn("read it").openai_turn("noted")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            alone = await conn.prompt(
                session_id=session.session_id,
                prompt=[resource_link_block("notes.md", (ws / "docs/notes.md").as_uri(), mime_type="text/markdown")],
            )
            mixed = await conn.prompt(
                session_id=session.session_id,
                prompt=[text_block("and compare with this one"), resource_link_block("outside.txt", outside.as_uri())],
            )
            with pytest.raises(RequestError) as refused:
                await conn.prompt(session_id=session.session_id, prompt=[image_block("aGk=", "image/png")])
            return alone.stop_reason, mixed.stop_reason, refused.value.code

        run = run_editor(tmp_path, fake_model_args(server, tmp_path), body, env=KEY_ENV)
        requests = server.requests

    assert run.result == ("end_turn", "end_turn", -32602)  # an image was not advertised: invalid params
    first, second = user_text(requests[0]), user_text(requests[1])
    assert "notes.md" in first and (ws / "docs/notes.md").as_uri() in first
    assert "PELICAN" in first and "second line" in first  # read through the sandbox's read_file
    assert "and compare with this one" in second and "outside.txt" in second and str(outside) in second
    assert "outside the workspace" in second
    assert "OUTSIDE-CONTENT" not in json.dumps(requests)


@pytest.mark.docker
def test_mcp_servers_from_session_new_are_started_offered_asked_and_stopped(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    server_py = tmp_path / "notes_server.py"
    server_py.write_text(MCP_SERVER)
    pid_file, notes = tmp_path / "mcp.pid", tmp_path / "notes.txt"
    stdio = McpServerStdio(
        name="notes",
        command=sys.executable,
        args=[str(server_py)],
        env=[EnvVariable(name="PID_FILE", value=str(pid_file)), EnvVariable(name="NOTES_FILE", value=str(notes))],
    )

    with FakeModelServer() as server:
        server.openai_turn("", [("mcp__notes__add_note", {"text": "buy milk"})]).openai_turn("stored it")

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[stdio])
            server_pid = int(pid_file.read_text())
            assert alive(server_pid)  # started with the session, before any prompt
            answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("note: buy milk")])
            return answer.stop_reason, server_pid

        run = run_editor(tmp_path, fake_model_args(server, tmp_path), body, env=KEY_ENV)
        requests = server.requests

    stop, server_pid = run.result
    assert stop == "end_turn"
    offered = [t["function"]["name"] for t in requests[0]["body"]["tools"]]
    assert "mcp__notes__add_note" in offered and "shell" in offered
    call_id = run.editor.permissions[0].tool_call_id
    assert [p.tool_call_id for p in run.editor.permissions] == [call_id]  # the MCP call asked
    assert "mcp__notes__add_note" in run.editor.permissions[0].title
    assert run.editor.statuses(call_id)[-1] == "completed"
    assert notes.read_text() == "buy milk\n"  # it ran on the host, as the user's own server
    tool_messages = [m for m in requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert "stored: buy milk" in tool_messages[-1]["content"]  # the result reached the model
    assert not alive(server_pid), "the MCP server outlived the session"
    records = [json.loads(line) for path in (tmp_path / "t").glob("*.jsonl") for line in path.read_text().splitlines()]
    started = [r for r in records if r["type"] == "mcp_servers"]
    assert started and started[0]["tools"] == ["mcp__notes__add_note"] and started[0]["problems"] == []
    assert boxes_of(docker_client, run.pid) == []


# -- 4. relative cwd -----------------------------------------------------------------------------------
def test_relative_cwd_is_invalid_params(tmp_path):
    model = script(tmp_path, [{"text": "hi"}])

    async def body(conn, editor):
        codes = []
        for cwd in ("relative/dir", ".", "ws/../ws"):
            with pytest.raises(RequestError) as err:
                await conn.new_session(cwd=cwd, mcp_servers=[])
            codes.append(err.value.code)
        return codes

    run = run_editor(tmp_path, ["--model", model], body)
    assert run.result == [-32602, -32602, -32602]
    assert all("absolute" in f["error"]["message"] for f in run.checker.frames if "error" in f)


# -- 5 and 7. whole-file diffs, and locations on every file tool ----------------------------------------
@pytest.mark.docker
def test_file_tools_carry_locations_and_whole_file_diffs(sandbox_image, tmp_path):
    original = "one\ntwo\nthree\n"
    ws = make_workspace(tmp_path / "ws", {"data.txt": original, "src/app.py": "a = 1\nb = 2\nc = 3\n"})
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("HOST-SECRET never shown\n")
    os.symlink(host_secret, ws / "evil.txt")  # planted in the workspace: a link out to the host
    model = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"id": "r1", "name": "read_file", "arguments": {"path": "src/app.py", "offset": 2}},
                    {"id": "l1", "name": "list_files", "arguments": {"path": "src"}},
                    {"id": "g1", "name": "grep_files", "arguments": {"pattern": "b =", "path": "src"}},
                ]
            },
            {
                "tool_calls": [
                    {"id": "w1", "name": "write_file", "arguments": {"path": "data.txt", "content": "ONE\nTWO\n"}}
                ]
            },
            {
                "tool_calls": [
                    {"id": "w2", "name": "write_file", "arguments": {"path": "fresh/new.txt", "content": "brand new\n"}}
                ]
            },
            {
                "tool_calls": [
                    {
                        "id": "e1",
                        "name": "edit_file",
                        "arguments": {"path": "src/app.py", "old_text": "c = 3", "new_text": "c = 30"},
                    }
                ]
            },
            {"tool_calls": [{"id": "w3", "name": "write_file", "arguments": {"path": "evil.txt", "content": "x\n"}}]},
            {"text": "done"},
        ],
    )

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        return (await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])).stop_reason

    run = run_editor(tmp_path, ["--model", model, "--transcript-dir", str(tmp_path / "t")], body)
    assert run.result == "end_turn"
    ed = run.editor

    def where(call_id: str) -> list[tuple[str, int | None]]:
        """The locations an editor holds for the call: the last update that set them."""
        sets = [u.locations for u in ed.calls(call_id) if u.locations is not None]
        return [(loc.path, loc.line) for loc in sets[-1]]

    assert where("r1") == [(str(ws / "src/app.py"), 2)]  # read_file's offset
    assert where("l1") == [(str(ws / "src"), None)]
    assert where("g1") == [(str(ws / "src"), None)]
    assert where("w1") == [(str(ws / "data.txt"), None)]
    assert where("w2") == [(str(ws / "fresh/new.txt"), None)]
    assert where("e1") == [(str(ws / "src/app.py"), 3)]  # the first changed line
    for call_id in ("r1", "l1", "g1", "w1", "w2", "e1", "w3"):
        assert ed.start(call_id).locations, f"{call_id} was announced without locations"

    def diff_of(call_id: str):
        final = ed.last(call_id)
        assert final.status == "completed", (call_id, final)
        diffs = [c for c in final.content if c.type == "diff"]
        assert len(diffs) == 1, final.content
        return diffs[0]

    over = diff_of("w1")
    assert (over.path, over.old_text, over.new_text) == (str(ws / "data.txt"), original, "ONE\nTWO\n")
    new = diff_of("w2")
    assert (new.path, new.old_text, new.new_text) == (str(ws / "fresh/new.txt"), None, "brand new\n")
    edit = diff_of("e1")
    assert (edit.old_text, edit.new_text) == ("a = 1\nb = 2\nc = 3\n", "a = 1\nb = 2\nc = 30\n")
    # The planted link is never followed by the host: no diff claims to know it, the secret is in no frame.
    assert not [c for c in (ed.last("w3").content or []) if c.type == "diff"]
    assert "HOST-SECRET" not in json.dumps(run.checker.frames)
    assert host_secret.read_text() == "HOST-SECRET never shown\n"


# -- 6. a model API failure --------------------------------------------------------------------------
@pytest.mark.docker
def test_model_api_failure_is_a_json_rpc_error_on_the_prompt(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    with FakeModelServer() as server:
        server.reply({"error": {"message": "invalid model"}}, status=400)

        async def body(conn, editor):
            session = await conn.new_session(cwd=str(ws), mcp_servers=[])
            with pytest.raises(RequestError) as failed:
                await conn.prompt(session_id=session.session_id, prompt=[text_block("hi")])
            return failed.value

        run = run_editor(tmp_path, fake_model_args(server, tmp_path), body, env=KEY_ENV)

    err = run.result
    assert err.code == -32603
    assert err.data["type"] == "model_api_error" and err.data["recoverable"] is False
    assert "HTTP 400" in err.data["message"]
    prompt_answers = [f for f in run.checker.frames if run.checker.asked.get(f.get("id")) == "session/prompt"]
    assert len(prompt_answers) == 1 and "result" not in prompt_answers[0]  # no end_turn, only the error
    assert not [u for u in run.editor.updates if getattr(u, "session_update", "") == "agent_message_chunk"]


# -- the frame check itself can fail ------------------------------------------------------------------
def test_the_frame_checker_refuses_what_the_sdk_models_would_quietly_fix():
    """The SDK's models drop unknown fields and salvage invalid values; the checker must not."""
    from tests.helpers.acp_editor import FrameChecker

    checker = FrameChecker()
    good = {
        "sessionId": "s",
        "update": {
            "sessionUpdate": "tool_call",
            "toolCallId": "c",
            "title": "read_file a",
            "locations": [{"path": "/w/a", "line": 2}],
        },
    }
    checker.check({"jsonrpc": "2.0", "method": "session/update", "params": good})
    bad_line = json.loads(json.dumps(good))
    bad_line["update"]["locations"][0]["line"] = -1  # salvaged to None by the SDK
    unknown = json.loads(json.dumps(good))
    unknown["update"]["colour"] = "red"  # dropped by the SDK
    bad_status = json.loads(json.dumps(good))
    bad_status["update"]["status"] = "cancelled"  # not an ACP status: salvaged to None
    for params in (bad_line, unknown, bad_status):
        with pytest.raises(AssertionError):
            checker.check({"jsonrpc": "2.0", "method": "session/update", "params": params})
    with pytest.raises(AssertionError):  # an answer to nothing we asked
        checker.check({"jsonrpc": "2.0", "id": 99, "result": {"stopReason": "end_turn"}})
