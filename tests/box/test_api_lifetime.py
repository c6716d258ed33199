"""Leftovers and lifetimes (issue 46), against real boxes: a failed open leaves no copy; a sandbox
dropped without close() is closed when it is collected (not only at exit); `idle_timeout` and
`lifetime` close the box."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

from orchestrator import ErrorType, OpenAgentsError, Sandbox
from orchestrator.config import LABEL
from tests.helpers import make_workspace

pytestmark = pytest.mark.usefixtures("sandbox_image")


def boxes_on(docker_client, ws: Path) -> list[str]:
    return [
        c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={ws.resolve()}"})
    ]


def gone(docker_client, ws: Path, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while boxes_on(docker_client, ws):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.parametrize("bad", [{"runtime": "no-such-runtime"}, {"memory": "lots"}])
def test_a_failed_open_leaves_no_copy(tmp_path, monkeypatch, bad):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"big.bin": os.urandom(1 << 20), "a.txt": "a\n"})
    with pytest.raises(OpenAgentsError):
        Sandbox(ws, mode="copy", **bad).open()
    sessions = tmp_path / "state" / "openagents-sandbox" / "sessions"
    (record_dir,) = list(sessions.iterdir())
    assert sorted(p.name for p in record_dir.iterdir()) == ["session.json"]  # the record says why; no copy, no store
    assert '"failed"' in (record_dir / "session.json").read_text()


def test_a_sandbox_collected_without_close_is_closed(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws")
    events = []
    box = Sandbox(ws, on_event=events.append).open()
    box.shell("true")
    assert boxes_on(docker_client, ws)
    transcript = box.transcript_path
    del box
    gc.collect()
    assert gone(docker_client, ws), "the box of a collected sandbox still runs"
    assert '"session_end"' in transcript.read_text() or events


def test_idle_timeout_closes_an_idle_box_and_not_a_busy_one(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws")
    with Sandbox(ws, idle_timeout=1.5) as box:
        assert box.shell("sleep 3; echo done").output == "done\n"  # a call longer than the timeout is not idleness
        time.sleep(4)
        assert box.closed and gone(docker_client, ws)
        with pytest.raises(OpenAgentsError) as closed:
            box.shell("true")
        assert closed.value.type is ErrorType.SANDBOX_CLOSED and "idle_timeout" in closed.value.message
    assert box.record.status == "closed" and "idle" in box.record.reason


def test_lifetime_closes_the_box_even_mid_call(tmp_path, docker_client):
    ws = make_workspace(tmp_path / "ws")
    with Sandbox(ws, lifetime=4) as box:
        started = time.monotonic()
        with pytest.raises(OpenAgentsError) as ended:
            box.shell("sleep 60")
        assert time.monotonic() - started < 30
        assert ended.value.type is ErrorType.SANDBOX_CLOSED and "lifetime" in ended.value.message
    assert gone(docker_client, ws) and "lifetime" in box.record.reason
