"""The tests of tests/unit/test_mcp_launch.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.mcp_launch import SYSTEM_PATH, server_file

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch) -> Path:
    """The workspace, and oa-sandbox started in it (as `oa-sandbox run --workspace .` is)."""
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


@pytest.mark.docker
def test_doctor_names_what_each_server_runs_and_what_is_refused(tmp_path, ws):
    """`oa-sandbox doctor` lists each config.toml server's argv as a session would run it, what the user's
    PATH would have run from the workspace instead, the PATH entries left out, and each server refused."""
    (ws / ".venv/bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", ws / ".venv/bin/python3")
    probe = server_file(tmp_path)
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'[[mcp_servers]]\nname = "py"\ncommand = "python3"\nargs = ["{probe}"]\n'
        f'[[mcp_servers]]\nname = "inside"\ncommand = "{ws}/.venv/bin/python3"\nargs = ["{probe}"]\n'
    )
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PATH": f"{ws}/.venv/bin:{SYSTEM_PATH}",
    }
    oa = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    out = subprocess.run(
        [oa, "doctor", "--workspace", str(ws)], capture_output=True, text=True, timeout=120, env=env
    ).stdout
    assert f"[ok]   MCP server 'py' runs: /usr/bin/python3 {probe}" in out, out
    assert (
        f"[warn] MCP server 'py': your PATH finds python3 at {ws}/.venv/bin/python3, "
        "where the sandbox can write: not used" in out
    ), out
    assert f"[warn] MCP servers run without PATH entry {ws}/.venv/bin: where the sandbox can write" in out, out
    assert (
        f"[warn] MCP server 'inside' not started: its program {ws}/.venv/bin/python3 lies where the sandbox can write"
        in out
    ), out
