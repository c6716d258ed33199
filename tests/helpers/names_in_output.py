"""What tests/attacks/test_names_in_output.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

ALLOW = '[[rules]]\nkind = "edit"\ndecision = "allow"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n'


def maker(script: str) -> dict:
    """A model turn running a Python script in the box (given as base64: any bytes, no quoting)."""
    blob = base64.b64encode(script.encode()).decode()
    return {
        "tool_calls": [
            {"name": "shell", "arguments": {"command": f'python3 -c "$(echo {blob} | base64 -d)"', "timeout": 600}}
        ]
    }


def model(tmp_path: Path, *turns: dict) -> Path:
    path = tmp_path / f"model-{time.monotonic_ns()}.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in [*turns, {"text": "done"}]))
    return path


def policy(tmp_path: Path) -> Path:
    path = tmp_path / "allow.toml"
    path.write_text(ALLOW)
    return path


def _many(count: int) -> dict:
    """A box that makes `count` long-named absolute symlinks (the sanitiser leaves each out) and 100 plain files."""
    return maker(
        "import os\n"
        f"for i in range({count}):\n    os.symlink('/etc/passwd', 'L' * 180 + '%07d' % i)\n"
        "for i in range(100):\n    open('plain%03d' % i, 'w').write('x\\n')\n"
    )
