"""The public Python API of openagents-sandbox: a hardened sandbox on a workspace, for a program.

    from orchestrator import Sandbox

    with Sandbox("path/to/repo", auto_approve=True) as box:
        print(box.shell("ls").output)

Everything a front-end does to a session goes through here (docs/api.md): the six tools through
the call pipeline and the policy ladder, copy mode's review, checkpoints, an agent's run.

Its names load on first use (as `orchestrator`'s do): a module of the package, such as
`api.sessions` for `oa-sandbox sessions`, is imported without the sandbox, the loop and the model
clients behind `Sandbox`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import ErrorType, OpenAgentsError
    from ..policy.approvals import Answer, ApprovalRequest
    from ..workspace.host_code import HostCodeInWorkspace
    from . import sessions
    from .agent import AgentRun
    from .aio import AsyncProcess, AsyncSandbox, ShellStream
    from .environment import EnvWarning
    from .options import SandboxOptions
    from .processes import Process
    from .results import (
        ApplyResult,
        ChangedFile,
        Changes,
        EditResult,
        GrepMatch,
        GrepResult,
        ListResult,
        ReadResult,
        ShellResult,
        ToolError,
        TreeResult,
        WriteResult,
    )
    from .sandbox import Sandbox

# Each public name, and the module it comes from (relative to this package).
_HOMES = {
    "ErrorType": "..errors",
    "OpenAgentsError": "..errors",
    "Answer": "..policy.approvals",
    "ApprovalRequest": "..policy.approvals",
    "HostCodeInWorkspace": "..workspace.host_code",
    "AgentRun": ".agent",
    "AsyncProcess": ".aio",
    "AsyncSandbox": ".aio",
    "ShellStream": ".aio",
    "EnvWarning": ".environment",
    "SandboxOptions": ".options",
    "Process": ".processes",
    **dict.fromkeys(
        [
            "ApplyResult",
            "ChangedFile",
            "Changes",
            "EditResult",
            "GrepMatch",
            "GrepResult",
            "ListResult",
            "ReadResult",
            "ShellResult",
            "ToolError",
            "TreeResult",
            "WriteResult",
        ],
        ".results",
    ),
    "Sandbox": ".sandbox",
}

__all__ = [
    "AgentRun",
    "Answer",
    "ApplyResult",
    "ApprovalRequest",
    "AsyncProcess",
    "AsyncSandbox",
    "ChangedFile",
    "Changes",
    "EditResult",
    "EnvWarning",
    "ErrorType",
    "GrepMatch",
    "GrepResult",
    "HostCodeInWorkspace",
    "ListResult",
    "OpenAgentsError",
    "Process",
    "ReadResult",
    "Sandbox",
    "SandboxOptions",
    "ShellResult",
    "ShellStream",
    "ToolError",
    "TreeResult",
    "WriteResult",
    "sessions",
]


def __getattr__(name: str) -> Any:
    if name == "sessions":
        return importlib.import_module(".sessions", __name__)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once: the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
