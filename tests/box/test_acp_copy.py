"""Copy mode in ACP (issue 24): on a root-owned workspace (`auto` picks copy: the tests run as root),
what the user allowed in a prompt turn is on disk when the turn's answer arrives, landed through
the sanitiser (review.apply_changes) or written through the editor's fs/write_text_file as well
when it offers that; a conflict lands nothing; what is left out is said. And the host git tool's
reading subcommands are announced as `read`.

The official ACP SDK plays the editor (tests/helpers/acp_editor.py); every frame the agent sends is held to
the SDK's schema models, the PromptResponse's `_meta` included.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from acp import text_block
from acp.schema import AgentMessageChunk, ClientCapabilities, FileSystemCapabilities

from tests.helpers import chown_tree
from tests.helpers.acp_editor import OA, Editor, run_editor
from tests.helpers.host_git import init_repo

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned workspace needs root to make")
pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
META = "dev.openagents.sandbox/copyMode"
WRITES = ClientCapabilities(fs=FileSystemCapabilities(write_text_file=True))


def root_workspace(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    assert root.stat().st_uid == 0
    return root


def script(tmp_path: Path, turns: list[dict]) -> str:
    path = tmp_path / "model.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return f"script:{path}"


def call(call_id: str, name: str, **arguments) -> dict:
    return {"tool_calls": [{"id": call_id, "name": name, "arguments": arguments}]}


def agent_args(tmp_path: Path, model: str) -> list[str]:
    return ["--model", model, "--transcript-dir", str(tmp_path / "t")]


def env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


def messages(editor: Editor) -> list[str]:
    return [u.content.text for u in editor.updates if isinstance(u, AgentMessageChunk)]


async def prompt(conn, session_id: str, text: str) -> tuple[str, dict | None]:
    """A prompt turn: its stop reason and its copy-mode report (the PromptResponse's _meta; None in bind mode)."""
    answer = await conn.prompt(session_id=session_id, prompt=[text_block(text)])
    return answer.stop_reason, (answer.field_meta or {}).get(META)


def record_of(tmp_path: Path) -> dict:
    (record,) = (tmp_path / "state").glob("openagents-sandbox/sessions/*/session.json")
    return json.loads(record.read_text())


@needs_root
def test_an_allowed_edit_is_on_disk_when_the_turn_ends(sandbox_image, tmp_path):
    ws = root_workspace(tmp_path / "ws", {"calc.py": "def add(a, b):\n    return a - b\n", "notes.txt": "keep?\n"})
    model = script(
        tmp_path,
        [
            call("e1", "edit_file", path="calc.py", old_text="a - b", new_text="a + b"),
            call("w1", "write_file", path="rejected.txt", content="the user said no\n"),
            {"text": "first done"},
            call("e2", "edit_file", path="calc.py", old_text="a + b", new_text="b + a"),
            call("s1", "shell", command="rm notes.txt"),
            call("w2", "write_file", path="pkg/util.py", content="X = 1\n"),
            {"text": "second done"},
        ],
    )
    editor = Editor(decide=lambda tool_call: "reject_once" if "rejected" in (tool_call.title or "") else "allow_once")

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        first = await prompt(conn, session.session_id, "fix add")
        on_disk_first = {p.name: p.read_text() for p in ws.iterdir() if p.is_file()}
        second = await prompt(conn, session.session_id, "again")
        return first, on_disk_first, second

    run = run_editor(tmp_path, agent_args(tmp_path, model), body, editor=editor, env=env(tmp_path))
    (stop1, meta1), on_disk, (stop2, meta2) = run.result
    assert stop1 == stop2 == "end_turn"
    # The answer to the first prompt arrived with the allowed edit on disk, and only it.
    assert on_disk == {"calc.py": "def add(a, b):\n    return a + b\n", "notes.txt": "keep?\n"}
    assert meta1["applied"] == ["calc.py"] and meta1["conflicts"] == [] and meta1["landed"] is True
    assert meta1["editorWrites"] == [] and meta1["workspace"] == str(ws)
    # The editor's diff describes the file that really changed.
    diff = [c for c in run.editor.last("e1").content if c.type == "diff"][0]
    assert diff.path == str(ws / "calc.py") and diff.new_text == on_disk["calc.py"]
    assert run.editor.statuses("w1")[-1] == "failed"
    # The second turn lands on top of the first: the same file again, a deletion, a new directory.
    assert sorted(meta2["applied"]) == ["calc.py", "notes.txt", "pkg", "pkg/util.py"] and meta2["conflicts"] == []
    assert (ws / "calc.py").read_text() == "def add(a, b):\n    return b + a\n"
    assert not (ws / "notes.txt").exists() and not (ws / "rejected.txt").exists()
    util = (ws / "pkg/util.py").stat()
    assert (ws / "pkg/util.py").read_text() == "X = 1\n" and stat.S_IMODE(util.st_mode) == 0o644 and util.st_uid == 0
    said = messages(run.editor)
    assert said[0] == "first done" and "landed in" in said[1] and "calc.py" in said[1]
    assert "pkg/util.py" in said[-1] and said[-2] == "second done"
    # What landed is no longer a change of the session: `changes` and `apply` have nothing left to carry.
    changes = subprocess.run(
        [OA, "changes", meta2["session"]],
        capture_output=True,
        text=True,
        env={**os.environ, **env(tmp_path)},
        timeout=60,
    )
    assert changes.returncode == 0 and changes.stdout == "", changes.stdout + changes.stderr
    assert record_of(tmp_path)["applied"] is True  # landed as `oa-sandbox apply` would: `sessions prune` may take it


@needs_root
def test_a_cancelled_turn_still_lands_what_was_allowed_and_done(sandbox_image, tmp_path):
    ws = root_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    model = script(
        tmp_path,
        [
            call("w1", "write_file", path="a.txt", content="allowed and done\n"),
            call("s1", "shell", command="sleep 60; echo late > late.txt"),
            {"text": "never reached"},
        ],
    )

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])

        async def cancel_once_running(session_id, update):
            if getattr(update, "tool_call_id", None) == "s1" and getattr(update, "status", None) == "in_progress":
                asyncio.get_running_loop().create_task(conn.cancel(session_id=session_id))

        editor.on_update = cancel_once_running
        return await prompt(conn, session.session_id, "go")

    run = run_editor(tmp_path, agent_args(tmp_path, model), body, env=env(tmp_path))
    stop, meta = run.result
    assert stop == "cancelled" and meta["applied"] == ["a.txt"]
    assert (ws / "a.txt").read_text() == "allowed and done\n" and not (ws / "late.txt").exists()


@needs_root
def test_an_editor_offering_write_text_file_gets_each_landed_text_file(sandbox_image, tmp_path):
    ws = root_workspace(tmp_path / "ws", {"calc.py": "x = 1\n"})
    model = script(
        tmp_path,
        [
            call("e1", "edit_file", path="calc.py", old_text="x = 1", new_text="x = 2"),
            call("w1", "write_file", path="new/fresh.txt", content="fresh\n"),
            call("s1", "shell", command="printf '\\377\\376\\000' > blob.bin"),
            {"text": "first"},
            call("e2", "edit_file", path="calc.py", old_text="x = 2", new_text="x = 3"),
            {"text": "second"},
        ],
    )

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        first = await prompt(conn, session.session_id, "go")
        writes_first = list(editor.writes)
        second = await prompt(conn, session.session_id, "again")
        return first, writes_first, second

    run = run_editor(tmp_path, agent_args(tmp_path, model), body, env=env(tmp_path), capabilities=WRITES)
    (_, meta1), writes_first, (_, meta2) = run.result
    # Each text file that landed went through the editor, with the landed text; the binary one did not.
    assert writes_first == [(str(ws / "calc.py"), "x = 2\n"), (str(ws / "new/fresh.txt"), "fresh\n")]
    assert meta1["editorWrites"] == ["calc.py", "new/fresh.txt"] and meta1["editorWriteFailures"] == []
    assert "blob.bin" in meta1["applied"] and (ws / "blob.bin").read_bytes() == b"\xff\xfe\x00"
    # The editor's own write is not taken for the user's change: the next turn lands without a conflict.
    assert meta2["conflicts"] == [] and meta2["applied"] == ["calc.py"]
    assert run.editor.writes[-1] == (str(ws / "calc.py"), "x = 3\n") and (ws / "calc.py").read_text() == "x = 3\n"


@needs_root
def test_an_editor_refusing_the_write_still_gets_the_file_on_disk_and_is_told(sandbox_image, tmp_path):
    ws = root_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    model = script(tmp_path, [call("w1", "write_file", path="a.txt", content="b\n"), {"text": "done"}])

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        return await prompt(conn, session.session_id, "go")

    run = run_editor(
        tmp_path,
        agent_args(tmp_path, model),
        body,
        editor=Editor(refuse_writes=True),
        env=env(tmp_path),
        capabilities=WRITES,
    )
    _, meta = run.result
    assert (ws / "a.txt").read_text() == "b\n" and meta["applied"] == ["a.txt"] and meta["editorWrites"] == []
    assert [f["path"] for f in meta["editorWriteFailures"]] == ["a.txt"]
    assert "editor refused" in messages(run.editor)[-1]


@needs_root
def test_a_conflict_applies_nothing_and_is_reported(sandbox_image, tmp_path):
    ws = root_workspace(tmp_path / "ws", {"calc.py": "v = 'original'\n", "other.txt": "other\n"})
    model = script(
        tmp_path,
        [
            call("w1", "write_file", path="other.txt", content="the box's\n"),
            call("e1", "edit_file", path="calc.py", old_text="original", new_text="the box's"),
            {"text": "done"},
            {"text": "nothing more"},
        ],
    )

    def decide(tool_call) -> str:
        if "calc.py" in (tool_call.title or ""):
            (ws / "calc.py").write_text("v = 'the user typed this'\n")  # the user edits the real file during the turn
        return "allow_once"

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        first = await prompt(conn, session.session_id, "go")
        second = await prompt(conn, session.session_id, "anything else?")
        return first, second

    run = run_editor(tmp_path, agent_args(tmp_path, model), body, editor=Editor(decide=decide), env=env(tmp_path))
    (stop, meta), (_, again) = run.result
    assert stop == "end_turn"
    assert (ws / "calc.py").read_text() == "v = 'the user typed this'\n" and (ws / "other.txt").read_text() == "other\n"
    assert meta["landed"] is False and meta["applied"] == []
    assert [c["path"] for c in meta["conflicts"]] == ["calc.py"] and "changed in the real workspace" in meta[
        "conflicts"
    ][0]["reason"]
    said = messages(run.editor)
    assert "nothing landed" in said[1] and "calc.py" in said[1] and f"oa-sandbox changes {meta['session']}" in said[1]
    # It still blocks at the next turn, and is said again; nothing landed meanwhile.
    assert [c["path"] for c in again["conflicts"]] == ["calc.py"] and (ws / "other.txt").read_text() == "other\n"
    assert record_of(tmp_path)["applied"] is False  # its work has not landed: `sessions prune` keeps it


@needs_root
def test_the_record_says_unlanded_as_soon_as_a_call_changes_the_copy_mid_turn(sandbox_image, tmp_path):
    """After a landing the record says `applied` (prune may take the copy); the next turn's first
    change turns it false at once, before that turn lands: a host killed mid-turn must not leave a
    copy holding unlanded work that `sessions prune` would take. A failed edit changes nothing."""
    ws = root_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    model = script(
        tmp_path,
        [
            call("w1", "write_file", path="a.txt", content="one\n"),
            {"text": "first done"},
            call("e0", "edit_file", path="a.txt", old_text="not there", new_text="x"),
            call("w2", "write_file", path="b.txt", content="two\n"),
            call("w3", "write_file", path="c.txt", content="three\n"),
            {"text": "second done"},
        ],
    )
    seen: dict[str, bool] = {}

    def decide(tool_call) -> str:
        seen[tool_call.tool_call_id] = record_of(tmp_path)["applied"]  # what a prune would read at this moment
        return "allow_once"

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        return await prompt(conn, session.session_id, "go"), await prompt(conn, session.session_id, "more")

    run = run_editor(tmp_path, agent_args(tmp_path, model), body, editor=Editor(decide=decide), env=env(tmp_path))
    (_, meta1), (_, meta2) = run.result
    assert meta1["applied"] == ["a.txt"] and sorted(meta2["applied"]) == ["b.txt", "c.txt"]
    # e0 failed (nothing changed): still landed when w2 was asked; w2 wrote: unlanded when w3 was asked.
    assert seen.get("w2") is True and seen.get("w3") is False, seen
    assert record_of(tmp_path)["applied"] is True


@needs_root
def test_hostile_plants_are_left_out_and_reported(sandbox_image, tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("outside\n")
    ws = root_workspace(tmp_path / "ws", {"app.py": "print('app')\n", "sub/keep.txt": "keep\n"})
    model = script(
        tmp_path,
        [
            call(
                "s1",
                "shell",
                command="ln -s /etc/passwd pw; ln -s ../../outside up; mkdir -p sub/.git; "
                "echo '[core]' > sub/.git/config; ln app.py hard; true",
            ),
            call("w1", "write_file", path="good.txt", content="good\n"),
            {"text": "planted"},
            {"text": "quiet turn"},
        ],
    )

    def decide(tool_call) -> str:
        if tool_call.tool_call_id == "w1":
            # What the box's own seccomp filter and sweep keep it from making (a FIFO, a setuid file), made
            # in its copy behind its back mid-turn, as a box that got past them would: the sanitiser's turn.
            (copy,) = (tmp_path / "state").glob("openagents-sandbox/sessions/*/copy")
            os.mkfifo(copy / "pipe")
            (copy / "tool").write_bytes(b"\x7fELF\xff")
            for name in ("pipe", "tool"):
                os.chown(copy / name, 1000, 1000)
            os.chmod(copy / "tool", 0o4755)  # after the chown, which clears it
        return "allow_once"

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        first = await prompt(conn, session.session_id, "go")
        second = await prompt(conn, session.session_id, "and now?")
        return first, second

    run = run_editor(
        tmp_path,
        agent_args(tmp_path, model),
        body,
        editor=Editor(decide=decide),
        env=env(tmp_path),
        capabilities=WRITES,
    )
    (_, meta), (_, again) = run.result
    left = {lo["path"]: lo["reason"] for lo in meta["leftOut"]}
    assert {"pw", "up", "pipe", "sub/.git", "hard"} <= set(left), left
    assert "absolute symlink" in left["pw"] and "outside the workspace" in left["up"]
    assert "FIFO" in left["pipe"] and ".git" in left["sub/.git"] and "hard link" in left["hard"]
    for name in ("pw", "up", "pipe", "sub/.git", "hard"):
        assert not os.path.lexists(ws / name), name
    assert (ws / "good.txt").read_text() == "good\n"
    tool = (ws / "tool").stat()
    assert stat.S_IMODE(tool.st_mode) == 0o755 and tool.st_uid == 0  # carried without its setuid bit, and said
    assert {"path": "tool", "pathShown": "tool", "boxMode": "4755", "mode": "0755"} in meta["normalised"]
    # Only text files that landed went through the editor: no plant did (tool is not UTF-8 text).
    assert [p for p, _ in run.editor.writes] == [str(ws / "good.txt")]
    said = messages(run.editor)[1]
    assert "Left out, never carried" in said and "pipe: a FIFO" in said and "tool 4755 -> 0755" in said
    # Said once: the next turn counts them, it does not repeat them.
    assert again["leftOut"] == [] and again["stillLeftOut"] == len(meta["leftOut"]) and again["applied"] == []
    assert messages(run.editor)[-1] == "quiet turn"
    assert outside.read_text() == "outside\n"


def test_git_reads_are_announced_as_read_and_a_commit_keeps_its_kind(sandbox_image, tmp_path):
    ws = tmp_path / "ws"
    init_repo(ws, {"a.txt": "a\n"})
    (ws / "a.txt").write_text("changed\n")
    chown_tree(ws)  # owned by an ordinary user: bind mode, where the git tool is on
    model = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"id": "g1", "name": "git", "arguments": {"subcommand": "status"}},
                    {"id": "g2", "name": "git", "arguments": {"subcommand": "diff"}},
                    {"id": "g3", "name": "git", "arguments": {"subcommand": "log"}},
                ]
            },
            call("g4", "git", subcommand="commit", message="change a"),
            {"text": "done"},
        ],
    )

    async def body(conn, editor):
        session = await conn.new_session(cwd=str(ws), mcp_servers=[])
        return await prompt(conn, session.session_id, "look")

    run = run_editor(tmp_path, agent_args(tmp_path, model), body, env=env(tmp_path))
    stop, meta = run.result
    assert stop == "end_turn" and meta is None  # bind mode: nothing to land, no copy-mode report
    ed = run.editor
    assert {c: ed.start(c).kind for c in ("g1", "g2", "g3", "g4")} == {
        "g1": "read",
        "g2": "read",
        "g3": "read",
        "g4": "other",
    }
    assert all(ed.statuses(c)[-1] == "completed" for c in ("g1", "g2", "g3")), [
        ed.statuses(c) for c in ("g1", "g2", "g3")
    ]
    assert [p.tool_call_id for p in ed.permissions] == ["g4"]  # reads ask nothing; the commit asks, as an edit
    assert ed.permissions[0].kind == "edit"


def test_git_reads_batched_in_parallel_take_turns(tmp_path):
    """Reads run in parallel in a turn (loop/__init__.py), and the three git reads above are one batch: the
    repository's per-command shadow work tree once raced there (TypeError out of the prompt)."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.tools.host_git import HostRepo, parse_args, run_git

    ws = tmp_path / "ws"
    init_repo(ws, {"a.txt": "a\n"})
    (ws / "a.txt").write_text("b\n")
    repo = HostRepo.open_at_start(ws)
    assert repo is not None
    for _ in range(30):
        with ThreadPoolExecutor(3) as pool:
            results = list(
                pool.map(lambda sub: run_git(repo, parse_args({"subcommand": sub})), ["status", "diff", "log"])
            )
        assert all(r.ok for r in results), [r.error for r in results]
