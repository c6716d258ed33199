"""A warm pool for a front-end that opens many sessions on one workspace (`oa-sandbox acp --pool`):
boxes started ahead, each handed to one `Sandbox(..., box=pool.claim())`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..config import SandboxConfig
    from ..sandbox.pool import SandboxPool
    from ..workspace.records import WorkspaceMode


def warm_pool(
    workspace: Path,
    policy_files: list[str],
    config: SandboxConfig,
    mode: WorkspaceMode,
    size: int,
    on_event: Callable[[Any], None] | None = None,
) -> SandboxPool:
    """`size` boxes of `workspace` kept warm (not started yet: call start()), configured as the
    session's policy says (session.warm_box_config: refused for copy-only access, the workspace
    mounted read-only for read-only, the policy's egress; what the host runs mounted read-only)."""
    from ..sandbox.pool import SandboxPool
    from ..session import warm_box_config

    return SandboxPool(workspace, warm_box_config(workspace, policy_files, config, mode), size=size, on_event=on_event)
