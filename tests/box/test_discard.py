"""`oa-sandbox discard` removes a box-written copy through boxfs: all of it, however deep, and
nothing a link in it points at."""

from __future__ import annotations

import os

import pytest

from tests.helpers import make_workspace
from tests.helpers.workspace_modes import cli, run_session, shell

pytestmark = pytest.mark.docker

PLANT = (
    "python3 -c \"import os\nfd=os.open('.',os.O_RDONLY)\nfor _ in range(1500):\n "
    "os.mkdir('d',dir_fd=fd); n=os.open('d',os.O_RDONLY,dir_fd=fd); os.close(fd); "
    "fd=n\n\"; ln -s /host-outside out; ln -s ../../.. up; printf x > 'new\nline'"
)


def test_discard_removes_a_deep_hostile_copy_and_follows_no_link(sandbox_image, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("the user's file")
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    proc, sid = run_session(
        tmp_path,
        ws,
        [shell(PLANT.replace("/host-outside", str(outside))), {"text": "done"}],
        "--workspace-mode",
        "copy",
    )
    assert proc.returncode == 0 and sid, proc.stderr
    session_dir = next((tmp_path / "state").glob(f"*/sessions/{sid}"))
    copy = next(p for p in session_dir.iterdir() if p.is_dir() and (p / "a.txt").exists())
    assert (copy / "d" / "d").is_dir() and os.path.islink(copy / "out"), "the box's plants are not in the copy"
    done = cli("discard", sid)
    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(copy), "discard left the copy behind"
    assert (outside / "keep").read_text() == "the user's file"
    assert (ws / "a.txt").read_text() == "a\n"
