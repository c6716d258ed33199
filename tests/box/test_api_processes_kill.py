"""A box where only background processes ran still holds processes (issue 48): `Sandbox.start()` is a
call that spawns (its rule's `spawns`), so kill_running() and a rollback end what it started. Before,
the supervisor's fast path took such a box for one holding only its agent and killed nothing."""

from __future__ import annotations

import time

import pytest

from orchestrator import ErrorType, Sandbox, ToolError
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")

PIDS = "for p in /proc/[0-9]*; do echo \"$(cat $p/comm 2>/dev/null) $(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\"; done"


def _ended(proc) -> bool:
    """Whether the process ended: killed with the keeper (lost, typed) or on its own."""
    try:
        return proc.wait(30) is not None
    except ToolError as err:
        return err.type is ErrorType.AGENT_LOST


def test_kill_running_ends_a_background_process_when_nothing_else_ran(tmp_path):
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws) as box:
        sleeper = box.start("exec sleep 1011")
        assert sleeper.running and [p["running"] for p in box.processes()] == [True]
        box.kill_running()  # no shell call ran first: only the background process could be holding the box
        assert _ended(sleeper)
        assert "sleep 1011" not in box.shell(PIDS).output


def test_a_rollback_stops_a_background_writer_first(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "start\n"})
    with Sandbox(ws) as box:
        writer = box.start("while :; do echo x >> w.txt; sleep 0.05; done")
        for _ in range(200):
            if (ws / "w.txt").exists():
                break
            time.sleep(0.05)
        try:
            box.rollback(0)
        except ToolError as err:  # w.txt changed since the last checkpoint: nothing restored, typed
            assert err.type is ErrorType.STALE_CONTENT
        assert _ended(writer)
        size = (ws / "w.txt").stat().st_size
        time.sleep(0.5)
        assert (ws / "w.txt").stat().st_size == size  # nothing writes in the workspace any more
