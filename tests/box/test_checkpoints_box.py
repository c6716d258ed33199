"""The tests of tests/unit/test_checkpoints.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.workspace.checkpoints import CheckpointStore
from tests.helpers import SANDBOX_UID, chown_tree, make_workspace, recorded
from tests.helpers.checkpoints import picture


@pytest.mark.docker
def test_checkpoints_of_a_real_sandbox(open_sandbox, tmp_path: Path):
    ws = make_workspace(tmp_path / "ws", {"calc.py": "def add(a, b):\n    return a - b\n", "tests/t.py": "ok\n"})
    chown_tree(ws)
    os.chown(ws, SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else None
    canary = tmp_path / "host"
    canary.mkdir()
    (canary / "secret.txt").write_text("host secret\n")
    store = CheckpointStore(tmp_path / "state" / "checkpoints.git", ws)
    box = open_sandbox(ws, runtime="runc")  # runc: under gVisor the box's FIFO never reaches the host
    store.record(0)
    start = picture(ws)
    out = box.call(
        "shell",
        {
            "command": "sed -i 's/a - b/a + b/' calc.py && mkdir -p build "
            "&& echo obj > build/o.txt && chmod +x tests/t.py"
        },
    )
    assert out.ok, out
    cp1 = recorded(store, 1)
    assert set(cp1.files_changed) == {"calc.py", "build/o.txt", "tests/t.py"}
    middle = picture(ws)
    out = box.call(
        "shell", {"command": "rm -rf tests && ln -s /etc/passwd calc.py.bak && mkfifo pipe && echo more >> calc.py"}
    )
    assert out.ok, out
    cp2 = recorded(store, 2)
    assert "pipe" in [s.path for s in cp2.skipped] and "calc.py.bak" in cp2.files_changed
    box.close()  # restore runs while no box does
    store.restore(1)
    assert picture(ws) == middle
    store.restore(0)
    assert picture(ws) == start
    assert {p.name for p in canary.iterdir()} == {"secret.txt"}
