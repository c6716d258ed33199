"""What tests/box/test_cli_run.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")


def oa(
    tmp_path: Path,
    *args: str,
    stdin: str | None = None,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 240,
):
    environment = {
        k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY")
    }
    environment.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), **(env or {}))
    return subprocess.run(
        [OA, *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=environment,
    )
