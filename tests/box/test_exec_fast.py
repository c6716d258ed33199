"""`oa-sandbox exec` of a read-only tool (issue 50): its box gets the workspace mounted read-only, and its
removal is asked of the daemon, not waited for (orchestrator/sandbox/handoff.py). Real containers: the
box is gone soon after the command returns (no leak), nothing in such a box can write the workspace,
a tool that may write still waits for its box's removal, and the next command's reaper leaves a box
the daemon is already removing to the daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config import LABEL, SandboxConfig
from orchestrator.sandbox import handoff
from orchestrator.tools import catalog
from tests.helpers import make_workspace

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }


def _exec(tmp_path: Path, ws: Path, tool: str, args: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "exec", "--workspace", str(ws), "--workspace-mode", "bind"]
        + [tool, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.stdout[-1000:], done.stderr[-2000:])
    result: dict = json.loads(done.stdout)
    return result


def _boxes_on(client, ws: Path) -> list[dict]:
    return client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={ws}"})


def _gone_within(client, ws: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _boxes_on(client, ws):
            return True
        time.sleep(0.1)
    return not _boxes_on(client, ws)


def test_which_tools_get_a_read_only_box():
    assert {t for t in ("read_file", "list_files", "grep_files") if catalog.reads_only(t)} == {
        "read_file",
        "list_files",
        "grep_files",
    }
    assert not any(catalog.reads_only(t) for t in ("write_file", "edit_file", "shell", "git", "no_such_tool"))


def _session_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state" / "openagents-sandbox" / "sessions").iterdir())


def test_a_read_only_exec_answers_and_its_box_is_gone_soon_after(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "hello\n"})
    result = _exec(tmp_path, ws, "read_file", {"path": "a.txt"})
    assert result["ok"] and result["output"] == "hello\n", result
    # nothing in its box could change the workspace: no checkpoint store, none listed (and no libgit2 loaded)
    (session,) = _session_dirs(tmp_path)
    record = json.loads((session / "session.json").read_text())
    assert not (session / "checkpoints.git").exists() and record["files_changed"] == [], record
    listed = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "checkpoints", session.name],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert listed.returncode == 0 and listed.stdout == "", listed.stdout + listed.stderr
    # removed by the daemon after the command returned: held once the removal has finished
    assert _gone_within(docker_client, ws, 60), _boxes_on(docker_client, ws)


def test_an_exec_that_may_write_still_waits_for_its_box_removal(sandbox_image, docker_client, tmp_path):
    ws = make_workspace(tmp_path / "ws", {})
    result = _exec(tmp_path, ws, "write_file", {"path": "b.txt", "content": "x"})
    assert result["ok"], result
    assert (ws / "b.txt").read_text() == "x"
    (session,) = _session_dirs(tmp_path)  # its start and its change are checkpointed, as in any session
    record = json.loads((session / "session.json").read_text())
    assert (session / "checkpoints.git").is_dir() and record["files_changed"] == ["b.txt"], record
    assert _boxes_on(docker_client, ws) == []  # at once: nothing handed off


def test_a_read_only_box_cannot_write_and_its_removal_is_handed_off(
    sandbox_image, docker_client, tmp_path, monkeypatch
):
    """What exec gives a read tool, through the API in this process: the workspace mounted read-only (a
    shell in that box cannot create a file there), and a close that leaves the removal to the daemon."""
    from orchestrator.api import Sandbox, SandboxOptions

    monkeypatch.setattr(handoff, "_ENABLED", True)
    asked: list[str] = []
    real = handoff.remove_detached
    monkeypatch.setattr(handoff, "remove_detached", lambda cid: asked.append(cid) or real(cid))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "hello\n"})
    config = SandboxConfig(workspace_read_only=True)
    with Sandbox(ws, SandboxOptions(config=config, mode="bind", auto_approve=True)) as box:
        touched = box.shell("touch /workspace/planted 2>&1; echo rc=$?")
        assert "rc=0" not in touched.output, touched.output
        assert box.read_file("a.txt").output == "hello\n"
    assert not (ws / "planted").exists()
    assert len(asked) == 1
    assert _gone_within(docker_client, ws, 60), _boxes_on(docker_client, ws)


def test_a_writable_box_is_never_handed_off(sandbox_image, docker_client, tmp_path, monkeypatch):
    from orchestrator.api import Sandbox, SandboxOptions

    monkeypatch.setattr(handoff, "_ENABLED", True)
    asked: list[str] = []
    monkeypatch.setattr(handoff, "remove_detached", lambda cid: asked.append(cid) or False)
    ws = make_workspace(tmp_path / "ws", {})
    with Sandbox(ws, SandboxOptions(mode="bind", auto_approve=True)) as box:
        box.write_file("b.txt", "x")  # raises a typed error if it failed
    assert (ws / "b.txt").read_text() == "x"
    assert asked == []
    assert _boxes_on(docker_client, ws) == []


def test_the_removal_is_asked_without_waiting_and_done_by_the_daemon(sandbox_image, docker_client, tmp_path):
    box = docker_client.containers.run(
        sandbox_image, ["sleep", "300"], entrypoint=[], detach=True, network_mode="none", labels={LABEL: "test"}
    )
    try:
        assert handoff.remove_detached(box.id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and docker_client.api.containers(all=True, filters={"id": box.id}):
            time.sleep(0.1)
        assert docker_client.api.containers(all=True, filters={"id": box.id}) == []
    finally:
        try:
            docker_client.api.remove_container(box.id, force=True)
        except Exception:  # noqa: BLE001 - removed already, as the test wants
            pass


def test_no_handoff_without_a_unix_socket_or_a_full_id(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert not handoff.remove_detached("a" * 64)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert not handoff.remove_detached("a" * 64)  # the socket does not take it: the caller removes, waiting
    monkeypatch.delenv("DOCKER_HOST")
    assert not handoff.remove_detached("abc")
    assert not handoff.remove_detached("A" * 64)
