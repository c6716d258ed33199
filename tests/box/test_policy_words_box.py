"""The tests of tests/unit/test_policy_words.py that need a real box (issue 48: one tier per folder);
what they are about is said there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]


LOG_HOOK = """#!{py}
import json, sys
event = json.load(sys.stdin)
open({log!r}, "a").write(event["hook_event_name"] + " " + event.get("tool_name", "") + "\\n")
"""


@pytest.mark.docker
@pytest.mark.timeout(300)
@pytest.mark.parametrize("tier", ["admin", "user", "workspace", "--policy"])
def test_matcher_star_in_each_tier_opens_a_session_and_runs_on_every_call(sandbox_image, tmp_path, tier):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    log = hooks / "log"
    script = hooks / "log.py"
    script.write_text(LOG_HOOK.format(py=sys.executable, log=str(log)))
    script.chmod(0o755)
    hook = f'[[hooks]]\nevent = "BeforeTool"\nmatcher = "*"\ncommand = ["{script}"]\ntimeout = 20\n'
    policy = tmp_path / "policy.toml"
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_", "OA_ADMIN"))
    }
    environment.update(
        XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT)
    )
    args: list[str] = []
    if tier == "admin":
        policy.write_text(hook)
        environment["OA_ADMIN_POLICY"] = str(policy)
    elif tier == "user":
        policy.write_text(hook)
        (tmp_path / "config" / "openagents-sandbox").mkdir(parents=True)
        (tmp_path / "config" / "openagents-sandbox" / "config.toml").write_text(
            f"policy = [{json.dumps(str(policy))}]\n"
        )
    elif tier == "workspace":
        (ws / ".openagents").mkdir()
        (ws / ".openagents" / "policy.toml").write_text(hook)
        policy.write_text("trust_workspace_hooks = true\n")
        args = ["--policy", str(policy)]
    else:
        policy.write_text(hook)
        args = ["--policy", str(policy)]
    with FakeModelServer() as server:
        server.openai_turn("", [("read_file", {"path": "a.txt"})])
        server.openai_turn("", [("list_files", {})])
        server.openai_turn("done")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "run",
                "--workspace",
                str(ws),
                "--model",
                "openai:m",
                "--base-url",
                server.base_url,
                "--non-interactive",
                "--output",
                "json",
                *args,
                "look",
            ],
            input="",
            capture_output=True,
            text=True,
            timeout=240,
            env=environment,
            cwd=ROOT,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert log.read_text().splitlines() == ["BeforeTool read_file", "BeforeTool list_files"]
