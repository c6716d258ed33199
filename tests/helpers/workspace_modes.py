"""What tests/box/test_workspace_modes.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


def cli(*args, env=None, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [OA, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def script(tmp_path: Path, turns: list) -> Path:
    path = tmp_path / "model.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return path


def shell(command: str) -> dict:
    return {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}


ALLOW = '[[rules]]\nkind = "edit"\ndecision = "allow"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n'


def run_session(tmp_path, ws, turns, *extra):
    policy = tmp_path / "allow.toml"
    policy.write_text(ALLOW)
    proc = cli(
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{script(tmp_path, turns)}",
        "--non-interactive",
        "--policy",
        str(policy),
        *extra,
        "task",
    )
    sid = next(
        (line.split()[1] for line in map(str.strip, proc.stderr.splitlines()) if line.startswith("session: ")), None
    )
    return proc, sid
