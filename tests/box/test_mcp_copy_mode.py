"""`oa-sandbox mcp` on a root-owned workspace (auto mode picks copy), driven by the official MCP SDK's
stdio client: every mutating result says the change is in the private copy, `changes` shows the
diff, `apply_changes` lands it through the sanitiser (hostile plants left out and listed), a
second apply after a second edit lands too, and a conflict applies nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.helpers.mcp_copy_mode import Checked, server_params, text

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned workspace needs root to make"),
]


def root_owned(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for rel, content in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(content)
    assert os.stat(ws).st_uid == 0
    return ws


def applied_flag(state: Path) -> bool:
    """The session record's `applied`, as `oa-sandbox sessions` and `sessions prune` read it."""
    records = list(state.glob("openagents-sandbox/sessions/*/session.json"))
    assert len(records) == 1, records
    return json.loads(records[0].read_text())["applied"]


def test_edit_changes_apply_plants_and_conflict(sandbox_image, tmp_path):
    ws = root_owned(tmp_path, {"app.py": "print('old')\n", "keep.txt": "keep\n"})
    state = tmp_path / "state"

    # runc: under gVisor a FIFO the box makes lives in the sandbox kernel only and never reaches the
    # host's copy; under runc it is a real FIFO in the copy, as a hostile box would leave it.
    async def session():
        async with Client(server_params(ws, state, "--runtime", "runc"), read_timeout_seconds=120) as client:
            assert "Workspace mode: copy" in (client.instructions or "") and "apply_changes" in client.instructions
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {"changes", "apply_changes"} <= set(tools)
            assert all(t.output_schema and t.output_schema["type"] == "object" for t in tools.values())
            assert tools["apply_changes"].annotations.destructive_hint and tools["changes"].annotations.read_only_hint
            call = Checked(client, tools)

            # edit: the result says where the change is, and the real file is as it was
            edited = await call("edit_file", {"path": "app.py", "old_text": "old", "new_text": "new"})
            assert not edited.is_error, text(edited)
            assert "in the session's private copy" in text(edited) and "apply_changes" in text(edited)
            assert (
                edited.structured_content["in_private_copy"] is True
                and edited.structured_content["workspace_mode"] == "copy"
            )
            assert (ws / "app.py").read_text() == "print('old')\n"
            read = await call("read_file", {"path": "app.py"})
            assert (
                read.structured_content["output"] == "print('new')\n"
                and "in_private_copy" not in read.structured_content
            )

            diff = await call("changes")
            assert (
                not diff.is_error
                and "+print('new')" in diff.structured_content["output"]
                and "-print('old')" in text(diff)
            )
            assert diff.structured_content["changes"] == [
                {"path": "app.py", "path_shown": "app.py", "status": "modified"}
            ]

            # hostile plants in the copy: left out, listed; the plain file lands
            planted = await call(
                "shell",
                {
                    "command": "mkfifo pipe; ln -s /etc/passwd pw; mkdir -p sub/.git; "
                    "echo '[core]' > sub/.git/config; echo plain > plain.txt"
                },
            )
            assert (
                not planted.is_error
                and "private copy" in text(planted)
                and planted.structured_content["in_private_copy"]
            )

            applied = await call("apply_changes")
            assert not applied.is_error, text(applied)
            assert (ws / "app.py").read_text() == "print('new')\n" and (ws / "plain.txt").read_text() == "plain\n"
            assert os.stat(ws / "app.py").st_uid == 0
            assert not (ws / "pipe").exists() and not os.path.lexists(ws / "pw") and not (ws / "sub" / ".git").exists()
            left = {item["path"]: item["reason"] for item in applied.structured_content["left_out"]}
            assert {"pipe", "pw", "sub/.git"} <= set(left), left
            assert "FIFO" in left["pipe"] or "fifo" in left["pipe"].lower()
            assert {"app.py", "plain.txt"} <= set(applied.structured_content["applied"])
            assert "left out: pipe" in text(applied)
            assert (
                applied_flag(state) is True
            )  # the record says it landed, as after `oa-sandbox apply`: prune may take it

            # the session goes on: a second edit of the same file lands with a second apply (no false conflict)
            await call("edit_file", {"path": "app.py", "old_text": "new", "new_text": "newer"})
            again = await call("apply_changes")
            assert not again.is_error, text(again)
            assert (ws / "app.py").read_text() == "print('newer')\n"
            assert "app.py" in again.structured_content["applied"]
            assert applied_flag(state) is True
            left_now = (await call("changes")).structured_content["changes"]
            assert {c["path"] for c in left_now} == {"pipe", "pw"}, (
                left_now
            )  # landed ones are gone; the plants stay: never carried

            # a conflict: the user edits the real file in between; nothing at all is applied
            await call("edit_file", {"path": "app.py", "old_text": "newer", "new_text": "box"})
            await call("write_file", {"path": "other.txt", "content": "from the box\n"})
            assert applied_flag(state) is False  # work in the copy that has not landed: prune keeps the session
            (ws / "app.py").write_text("print('user')\n")
            conflict = await call("apply_changes")
            assert conflict.is_error
            assert conflict.structured_content["error"]["type"] == "stale_content"
            assert [c["path"] for c in conflict.structured_content["conflicts"]] == ["app.py"]
            assert "nothing applied" in text(conflict) and "app.py" in text(conflict)
            assert (ws / "app.py").read_text() == "print('user')\n" and not (ws / "other.txt").exists()
            assert applied_flag(state) is False

            bad = await client.call_tool("apply_changes", {"force": True})
            assert bad.is_error and bad.structured_content["error"]["type"] == "invalid_arguments"

    anyio.run(session)
    assert (ws / "keep.txt").read_text() == "keep\n"
