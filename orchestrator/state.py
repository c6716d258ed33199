"""Where the host keeps what a session leaves behind: outside every workspace, under the XDG
state directory (`$XDG_STATE_HOME/openagents-sandbox`, default `~/.local/state/...`)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from .errors import ErrorType, OpenAgentsError


def state_root() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "openagents-sandbox"


def new_id() -> str:
    """Sortable by time, unique across processes: 20261202-183005-4f2a9c."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"


def sandbox_state_dir(workspace: Path, sandbox_id: str) -> Path:
    """The state directory of one sandbox; refused if it would lie inside the workspace, since the
    box could then write what the host later trusts (its quarantine, its placeholder)."""
    path = state_root() / "sandboxes" / sandbox_id
    if _inside(path, workspace):
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the state directory {state_root()} lies inside the workspace {workspace}; "
                              "set XDG_STATE_HOME to a directory outside it")
    return path


def empty_dir() -> Path:
    """An empty, read-only directory: mounted read-only at /workspace/.git when the workspace has
    none, so the box cannot plant a repository at the top for the host's or the user's git."""
    path = state_root() / "empty"
    path.mkdir(parents=True, exist_ok=True)
    if any(os.scandir(path)):
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{path} must be empty (it is mounted as the workspace's placeholder .git)")
    os.chmod(path, 0o555)
    return path


def _inside(path: Path, root: Path) -> bool:
    path, root = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return path == root or root in path.parents
