"""What tests/unit/test_mcp_launch.py shares with tests/box/test_mcp_launch_box.py, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.host_programs import PY_SERVER

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def server_file(tmp_path: Path, name: str = "probe.py", text: str = PY_SERVER) -> Path:
    """The user's server, outside the workspace."""
    path = tmp_path / "servers" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path
