"""The public Python API of openagents-sandbox: a hardened sandbox on a workspace, for a program.

    from orchestrator import Sandbox

    with Sandbox("path/to/repo", auto_approve=True) as box:
        print(box.shell("ls").output)

Everything a front-end does to a session goes through here (docs/api.md): the six tools through
the call pipeline and the policy ladder, copy mode's review, checkpoints, an agent's run.
"""
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

__all__ = [
    "AgentRun", "Answer", "ApplyResult", "ApprovalRequest", "AsyncProcess", "AsyncSandbox", "ChangedFile", "Changes", "EditResult", "EnvWarning", "ErrorType",
    "GrepMatch", "GrepResult", "HostCodeInWorkspace", "ListResult", "OpenAgentsError", "Process", "ReadResult", "Sandbox", "SandboxOptions", "ShellResult",
    "ShellStream", "ToolError", "TreeResult", "WriteResult", "sessions",
]
