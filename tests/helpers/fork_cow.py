"""What tests/unit/test_fork_cow.py shares with tests/box/test_fork_cow_box.py, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import make_workspace


def _parent(tmp_path: Path, monkeypatch) -> str:
    from orchestrator.workspace.records import WorkspaceMode, prepare

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("OA_FORK_COW", "auto")
    ws = make_workspace(
        tmp_path / "ws", {"a.txt": "alpha\n", "b.txt": "beta\n", "sub/c.txt": "gamma\n", "big.bin": b"\1" * (1 << 20)}
    )
    record, _ = prepare(ws, WorkspaceMode.COPY, None)
    record.status, record.host_pid = "finished", 0
    record.save()
    return record.id
