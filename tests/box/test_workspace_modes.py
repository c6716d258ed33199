"""Copy and bind modes through the real CLI: a root-owned workspace is worked on as a copy by an
unprivileged box; changes, apply, conflicts, rollback and the never-uid-0 rule."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.helpers import chown_tree, make_workspace
from tests.helpers.workspace_modes import cli, run_session, shell

pytestmark = pytest.mark.docker
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned workspace needs root to make")


def tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        st = os.lstat(path)
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = f"{oct(st.st_mode)} {st.st_uid} " + hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = f"{oct(st.st_mode)} dir"
    return out


@pytest.fixture
def state(tmp_path, monkeypatch):
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@needs_root
def test_root_owned_workspace_is_copied_and_applied(sandbox_image, tmp_path, state):
    """Root-owned workspace: the box (not uid 0) edits a copy and tries hostile plants; the
    real workspace is untouched until apply, which brings the edit and nothing else."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("print('old')\n")
    (ws / "keep.txt").write_text("keep\n")
    before = tree(ws)
    turns = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "app.py", "content": "print('new')\n"}}]},
        shell(
            "id -u > uid.txt; cp /bin/true tool; chmod 4755 tool; mkdir -p sub/.git; echo '[core]' > sub/.git/config; "
            "mkfifo pipe; ln -s /etc/passwd pw; true"
        ),
        {"text": "done"},
    ]
    proc, sid = run_session(tmp_path, ws, turns)
    assert proc.returncode == 0, proc.stderr
    assert "copy mode" in proc.stderr and sid
    assert tree(ws) == before, "copy mode wrote the real workspace"
    changes = cli("changes", sid)
    assert changes.returncode == 0 and "+print('new')" in changes.stdout, changes.stdout + changes.stderr
    listing = cli("sessions")
    assert (
        listing.stdout.splitlines()[0].startswith("ID ")
        and listing.stdout.splitlines()[1].startswith(sid)
        and "copy" in listing.stdout
    )
    applied = cli("apply", sid)
    assert applied.returncode == 0, applied.stderr
    assert (ws / "app.py").read_text() == "print('new')\n"
    assert (ws / "uid.txt").read_text().strip() not in ("0", ""), "the box ran as uid 0"
    assert not (ws / "sub" / ".git").exists() and not (ws / "pipe").exists() and not (ws / "pw").exists()
    assert not os.stat(ws / "tool").st_mode & 0o6000
    assert os.stat(ws / "app.py").st_uid == 0  # the real owner
    assert (ws / "keep.txt").read_text() == "keep\n"


@needs_root
def test_a_conflict_applies_nothing(sandbox_image, tmp_path, state):
    """The real file edited between run and apply: apply changes nothing and exits 1."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "b.txt": "b\n"})
    for p in [ws, *ws.iterdir()]:
        os.chown(p, 0, 0)
    proc, sid = run_session(
        tmp_path, ws, [shell("echo A > a.txt; echo B > b.txt"), {"text": "done"}], "--workspace-mode", "copy"
    )
    assert proc.returncode == 0, proc.stderr
    (ws / "a.txt").write_text("the user's own edit\n")
    before = tree(ws)
    applied = cli("apply", sid)
    assert applied.returncode == 1 and "conflict" in applied.stderr and "a.txt" in applied.stderr
    assert tree(ws) == before


def test_run_apply_at_the_end(sandbox_image, tmp_path, state):
    """`run --apply` in copy mode lands the changes without asking (CI)."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    proc, sid = run_session(
        tmp_path, ws, [shell("echo changed > a.txt"), {"text": "done"}], "--workspace-mode", "copy", "--apply"
    )
    assert proc.returncode == 0, proc.stderr
    assert (ws / "a.txt").read_text() == "changed\n"


@pytest.mark.parametrize("mode", ["bind", "copy"])
def test_rollback_to_the_start_and_to_a_middle_turn(sandbox_image, tmp_path, state, mode):
    """Checkpoints after each changing turn; rollback restores exactly, in both modes."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n", "d/b.txt": "b\n"})
    start = tree(ws)
    turns = [
        shell("echo two > a.txt; echo new > n.txt"),
        shell("echo three > a.txt; rm d/b.txt; ln -s a.txt link"),
        {"text": "done"},
    ]
    proc, sid = run_session(tmp_path, ws, turns, "--workspace-mode", mode)
    assert proc.returncode == 0, proc.stderr
    box_ws = Path(
        json.loads((state / "openagents-sandbox" / "sessions" / sid / "session.json").read_text())["box_workspace"]
    )
    assert (box_ws / "a.txt").read_text() == "three\n"
    points = cli("checkpoints", sid)
    assert points.returncode == 0 and points.stdout.splitlines()[0].startswith("start"), points.stdout + points.stderr
    assert "turn 1" in points.stdout and "turn 2" in points.stdout
    assert cli("rollback", sid, "--turn", "1").returncode == 0
    assert (box_ws / "a.txt").read_text() == "two\n" and (box_ws / "d" / "b.txt").read_text() == "b\n"
    assert (box_ws / "n.txt").exists() and not (box_ws / "link").exists()
    assert cli("rollback", sid, "--turn", "0").returncode == 0
    restored = tree(box_ws)
    if mode == "bind":
        assert restored == start
    else:
        assert {k: v.split()[-1] for k, v in restored.items()} == {k: v.split()[-1] for k, v in start.items()}


def test_uid_0_is_refused(sandbox_image, tmp_path, state):
    """`--user 0:0` is refused with a clear error, in every mode."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    for mode in ("bind", "copy"):
        proc = cli(
            "exec", "--workspace", str(ws), "--workspace-mode", mode, "--user", "0:0", "shell", '{"command": "id -u"}'
        )
        assert proc.returncode == 2 and "never runs as uid 0" in proc.stderr, proc.stderr


@needs_root
def test_bind_mode_on_a_root_owned_workspace_is_refused(sandbox_image, tmp_path, state):
    """Bind mode on a root-owned workspace without --user would need uid 0: refused, and auto picks copy."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    proc = cli("exec", "--workspace", str(ws), "--workspace-mode", "bind", "shell", '{"command": "id -u"}')
    assert proc.returncode == 2 and "uid 0" in proc.stderr
    auto = cli("exec", "--workspace", str(ws), "shell", '{"command": "id -u"}')
    assert auto.returncode == 0 and json.loads(auto.stdout)["output"].strip() == "1000" and "copy mode" in auto.stderr
    chown_tree(ws)
