"""A warm pool for a front-end that opens many sessions on one workspace (`oa-sandbox acp --pool`):
boxes started ahead, each handed to one `Sandbox(..., box=pool.claim())`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..sandbox.pool import SandboxPool
    from ..session.options import SandboxOptions


def warm_pool(
    workspace: Path, options: SandboxOptions, size: int, on_event: Callable[[Any], None] | None = None
) -> SandboxPool:
    """`size` boxes of `workspace` kept warm (not started yet: call start()) for sessions opened with
    `options` (the same options each Sandbox gets: its box, mode and policy files), configured as the
    session's policy says (session.warm_box_config: refused for copy-only access, the workspace
    mounted read-only for read-only, the policy's egress; what the host runs mounted read-only)."""
    from ..sandbox.pool import SandboxPool
    from ..session import warm_box_config

    config = warm_box_config(
        workspace, [str(p) for p in options.policy_files], options.sandbox_config(), options.workspace_mode()
    )
    return SandboxPool(workspace, config, size=size, on_event=on_event)
