"""Which tools a session has, how each is validated, and where it runs (sandbox or host).

Built from configuration: tools can be switched off per session; an unknown name gets a typed
refusal; `git` runs on the host, over the repository opened at session start (open_repo, before
the sandbox starts; no usable .git then means no git tool); `delegate` is known but off unless
configured. The turn loop only sees prepare() and invoke().
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..protocol import ToolResult
from ..sandbox.base import Sandbox
from . import declarations, host_git
from .args import parse_arguments, validate_arguments


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: str  # the ACP tool kind: read, search, edit, delete, move, execute, fetch, think, other
    side: Literal["sandbox", "host"]


SPECS: dict[str, ToolSpec] = {
    "read_file": ToolSpec("read_file", "read", "sandbox"),
    "list_files": ToolSpec("list_files", "read", "sandbox"),
    "grep_files": ToolSpec("grep_files", "search", "sandbox"),
    "write_file": ToolSpec("write_file", "edit", "sandbox"),
    "edit_file": ToolSpec("edit_file", "edit", "sandbox"),
    "shell": ToolSpec("shell", "execute", "sandbox"),
    "git": ToolSpec("git", "other", "host"),
    "delegate": ToolSpec("delegate", "other", "host"),
}
_GIT_KINDS = {"status": "read", "diff": "read", "log": "read", "commit": "edit"}


class RegistryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    disabled: set[str] = Field(default_factory=set, description="Tools switched off for this session.")
    git: bool = True
    delegate: bool = False  # the OpenAgents delegation API is not configured here


@dataclass
class PreparedCall:
    """A call that passed validation: what the ladder judges and the registry runs."""

    call: ToolCall
    spec: ToolSpec
    args: BaseModel
    kind: str
    action: str  # e.g. "shell", "git commit": the ladder's finest key

    @property
    def read_only(self) -> bool:
        return self.kind in ("read", "search", "think")

    def arguments(self) -> dict[str, Any]:
        return self.args.model_dump(exclude_none=True)


def call_title(tool: str, arguments: Any) -> str:
    """One line a person reads: the terminal prompt, the editor's tool call and its permission request.
    Takes raw arguments too (the editor is told of a call before it is validated)."""
    args = arguments if isinstance(arguments, dict) else {}
    if tool == "shell":
        return f"Run in the sandbox: {str(args.get('command', ''))[:200]}"
    if tool == "git":
        return f"Run on the host: git {args.get('subcommand', '')}".strip()
    detail = args.get("pattern") or args.get("path") or ""
    return f"{tool} {str(detail)[:120]}".strip()


class HostTools(Protocol):
    """Extra host-side tools a session brings (the user's MCP servers: orchestrator/mcp/client.py McpHost).
    They prepare and invoke their own calls; switching one off by name works as for the built-ins."""

    def names(self) -> list[str]: ...
    def owns(self, name: str) -> bool: ...
    def declarations(self, family: str) -> list[dict[str, Any]]: ...
    def prepare(self, call: ToolCall) -> PreparedCall: ...
    def invoke(self, prepared: PreparedCall) -> ToolResult: ...


class ToolRegistry:
    def __init__(self, sandbox: Sandbox, workspace: Path, config: RegistryConfig | None = None, repo: host_git.HostRepo | None = None,
                 host_tools: HostTools | None = None) -> None:
        self.sandbox = sandbox
        self.workspace = Path(workspace)
        self.config = config or RegistryConfig()
        self.repo = repo if self.config.git else None
        self.host_tools = host_tools
        unknown = {n for n in self.config.disabled - SPECS.keys() if not n.startswith("mcp__")}
        if unknown:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"cannot disable unknown tools: {', '.join(sorted(unknown))}")

    @staticmethod
    def open_repo(workspace: Path, config: RegistryConfig | None = None) -> host_git.HostRepo | None:
        """Call at session start, before the sandbox starts: the only moment .git is known to be the user's."""
        return host_git.HostRepo.open_at_start(workspace) if (config or RegistryConfig()).git else None

    def active(self) -> list[str]:
        names = [n for n, s in SPECS.items() if s.side == "sandbox"]
        if self.repo is not None:
            names.append("git")
        if self.config.delegate:
            names.append("delegate")
        if self.host_tools is not None:
            names += self.host_tools.names()
        return [n for n in names if n not in self.config.disabled]

    def declarations(self, family: str) -> list[dict[str, Any]]:
        own = declarations.declarations([n for n in self.active() if n != "delegate" and n in SPECS], family)
        if self.host_tools is None:
            return own
        extra = [d for d in self.host_tools.declarations(family) if d.get("function", d).get("name") not in self.config.disabled]
        return own + extra

    def prepare(self, call: ToolCall) -> PreparedCall:
        if call.arguments_error is not None:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"{call.name}: {call.arguments_error}")
        if self.host_tools is not None and self.host_tools.owns(call.name):
            if call.name in self.config.disabled:
                raise OpenAgentsError(ErrorType.TOOL_DISABLED, f"the tool {call.name!r} is switched off in this session")
            return self.host_tools.prepare(call)
        spec = SPECS.get(call.name)
        if spec is None:
            raise OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"unknown tool {call.name!r}; the tools are {', '.join(self.active())}")
        if call.name not in self.active():
            raise OpenAgentsError(ErrorType.TOOL_DISABLED, f"the tool {call.name!r} is switched off in this session")
        if spec.name == "delegate":
            raise OpenAgentsError(ErrorType.TOOL_DISABLED, "delegation is not configured")
        if spec.name == "git":
            git_args = host_git.parse_args(parse_arguments(call.arguments))
            return PreparedCall(call, spec, git_args, _GIT_KINDS[git_args.subcommand], host_git.action(git_args))
        args = validate_arguments(spec.name, call.arguments)
        return PreparedCall(call, spec, args, spec.kind, spec.name)

    def kill_running(self) -> None:
        """Cancel: what runs in the sandbox is killed from outside (host tools end at their deadline)."""
        self.sandbox.kill_processes()

    def invoke(self, prepared: PreparedCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """`on_output(text)`: a shell call's output while it runs, for a live view."""
        if self.host_tools is not None and self.host_tools.owns(prepared.spec.name):
            return self.host_tools.invoke(prepared)
        if prepared.spec.side == "host":
            assert isinstance(prepared.args, host_git.GitArgs)  # git is the registry's one host-side tool: prepare() made these
            return host_git.run_git(self.repo, prepared.args)
        if on_output is not None and prepared.spec.name == "shell":
            return self.sandbox.call(prepared.spec.name, prepared.arguments(), on_output=on_output)
        return self.sandbox.call(prepared.spec.name, prepared.arguments())
