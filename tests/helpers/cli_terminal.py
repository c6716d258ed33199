"""What tests/box/test_cli_terminal.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import json
import os
import pty
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def spawn(tmp_path: Path, ws: Path, turns: list[dict], *flags: str) -> tuple[int, int, Path]:
    """`oa-sandbox run` of this tree at a pty, with a script model of `turns`; (pid, pty fd, transcript path)."""
    script = tmp_path / "s.jsonl"
    script.write_text("\n".join(json.dumps(t) for t in turns))
    transcript = tmp_path / "t.jsonl"
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(
            XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT)
        )
        os.chdir(ROOT)
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "run",
                "--workspace",
                str(ws),
                "--model",
                f"script:{script}",
                "--transcript",
                str(transcript),
                *flags,
                "go",
            ],
        )
    return pid, fd, transcript


def finish(pid, fd) -> int:
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status)
