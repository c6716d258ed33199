"""SessionStart and SessionEnd fire once a session, SessionEnd also on Ctrl-C and on a fatal error;
a BeforeModel hook's `continue: false` stops the session, typed (hook_stopped), before the model is
asked. The real CLI (this tree's code), real sandboxes, real hook scripts on the host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import make_workspace
from tests.helpers.fake_model_server import FakeModelServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_", "ANTHROPIC_", "OA_ADMIN"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    return env


def life_policy(tmp_path: Path, extra: str = "") -> tuple[Path, Path]:
    log = tmp_path / "life.log"
    hook = tmp_path / "life.py"
    hook.write_text(
        f"#!{sys.executable}\nimport json, sys\ne = json.load(sys.stdin)\n"
        f"open({str(log)!r}, 'a').write(e['hook_event_name'] + ' ' + e.get('source', e.get('reason', '')) + '\\n')\n"
    )
    hook.chmod(0o755)
    policy = tmp_path / "p.toml"
    policy.write_text(
        '[[rules]]\ntool = "shell"\ndecision = "allow"\n[[hooks]]\nevent = "SessionStart"\ncommand '
        f'= ["{hook}"]\n[[hooks]]\nevent = "SessionEnd"\ncommand = ["{hook}"]\n{extra}'
    )
    return policy, log


def test_session_end_fires_once_on_ctrl_c(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy, log = life_policy(tmp_path)
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]}) + "\n")
    transcript = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--policy",
            str(policy),
            "--non-interactive",
            "--transcript",
            str(transcript),
            "wait",
        ],
        env=environment(tmp_path),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (transcript.exists() and '"executing"' in transcript.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    proc.communicate()
    assert log.read_text().splitlines() == ["SessionStart startup", "SessionEnd cancelled"]
    hooks = [r for r in map(json.loads, transcript.read_text().splitlines()) if r["type"] == "hook"]
    assert [r["hook_event"] for r in hooks] == ["SessionStart", "SessionEnd"] and all(
        r["executor"] == "user" for r in hooks
    )


def test_a_before_model_stop_is_a_typed_fatal_end_and_session_end_still_fires(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    stop = tmp_path / "stop.py"
    stop.write_text(
        f"#!{sys.executable}\nimport json\nprint(json.dumps({{'continue': "
        f"False, 'stopReason': 'the budget office says no'}}))\n"
    )
    stop.chmod(0o755)
    policy, log = life_policy(tmp_path, f'[[hooks]]\nevent = "BeforeModel"\ncommand = ["{stop}"]\n')
    with FakeModelServer() as server:
        server.openai_turn("never asked")
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
                "--policy",
                str(policy),
                "--non-interactive",
                "--output",
                "json",
                "go",
            ],
            env=environment(tmp_path),
            cwd=ROOT,
            input="",
            capture_output=True,
            text=True,
            timeout=240,
        )
        asked = len([r for r in server.requests if r.get("body", {}).get("messages")])
    out = json.loads(proc.stdout)
    assert proc.returncode != 0 and out["status"] == "stopped" and out["error"]["type"] == "hook_stopped", proc.stdout
    assert "the budget office says no" in out["error"]["message"]
    assert asked == 0
    assert log.read_text().splitlines() == ["SessionStart startup", "SessionEnd stopped"]


def test_agent_model_selection_and_compression_points_fire_with_their_effects(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"big.txt": "x" * 12000 + "\n"})
    log = tmp_path / "points.log"
    hook = tmp_path / "points.py"
    hook.write_text(f"""#!{sys.executable}
import json, sys
e = json.load(sys.stdin)
name = e["hook_event_name"]
open({str(log)!r}, "a").write(name + "\\n")
if name == "BeforeAgent":
    print(json.dumps({{"hookSpecificOutput": {{"additionalContext": "TICKET-7 says: be brief"}}}}))
elif name == "BeforeToolSelection":
    print(json.dumps({{"hookSpecificOutput": {{"toolConfig": \
{{"allowedFunctionNames": ["read_file", "list_files"]}}}}}}))
""")
    hook.chmod(0o755)
    policy = tmp_path / "p.toml"
    policy.write_text(
        "".join(
            f'[[hooks]]\nevent = "{point}"\ncommand = ["{hook}"]\n'
            for point in (
                "BeforeAgent",
                "AfterAgent",
                "BeforeToolSelection",
                "BeforeModel",
                "AfterModel",
                "PreCompress",
            )
        )
    )
    with FakeModelServer() as server:
        server.openai_turn("", [("read_file", {"path": "big.txt"})])
        server.openai_turn("", [("list_files", {"path": "."})])
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
                "--policy",
                str(policy),
                "--non-interactive",
                "--output",
                "json",
                "--context-window",
                "4000",
                "go",
            ],
            env=environment(tmp_path),
            cwd=ROOT,
            input="",
            capture_output=True,
            text=True,
            timeout=240,
        )
        bodies = [r["body"] for r in server.requests if r.get("body", {}).get("messages")]
    assert proc.returncode == 0, proc.stderr
    assert "TICKET-7 says: be brief" in bodies[0]["messages"][1]["content"]  # BeforeAgent's context, with the prompt
    assert all(
        sorted(t["function"]["name"] for t in b["tools"]) == ["list_files", "read_file"] for b in bodies
    )  # narrowed
    points = log.read_text().splitlines()
    assert (
        points[0] == "BeforeAgent"
        and points[-1] == "AfterAgent"
        and points.count("BeforeModel") == 3
        and points.count("AfterModel") == 3
    )
    assert "PreCompress" in points
