"""openagents-sandbox: the host side. It holds the model credentials and never lets them cross into the sandbox.

The public API (docs/api.md): `from orchestrator import Sandbox, AsyncSandbox, SandboxOptions, OpenAgentsError,
ErrorType`. Its names load on first use, so a command that needs none of it (`oa-sandbox --help`) does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AgentRun",
    "Answer",
    "ApplyResult",
    "ApprovalRequest",
    "AsyncProcess",
    "AsyncSandbox",
    "Changes",
    "EditResult",
    "EnvWarning",
    "ErrorType",
    "GrepResult",
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

if TYPE_CHECKING:
    from .api import (
        AgentRun,
        Answer,
        ApplyResult,
        ApprovalRequest,
        AsyncProcess,
        AsyncSandbox,
        Changes,
        EditResult,
        EnvWarning,
        ErrorType,
        GrepResult,
        ListResult,
        OpenAgentsError,
        Process,
        ReadResult,
        Sandbox,
        SandboxOptions,
        ShellResult,
        ShellStream,
        ToolError,
        TreeResult,
        WriteResult,
        sessions,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
