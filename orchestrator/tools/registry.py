"""Which tools a session has, how each is validated, and where it runs (sandbox or host).

Built from configuration: tools can be switched off per session; an unknown name gets a typed
refusal; a tool that needs the repository (git, on the host) is active only when one was opened
at session start (open_repo, before the sandbox starts; no usable .git then means no such tool).
The turn loop only sees prepare() and invoke() (through the CallPipeline).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ErrorType, OpenAgentsError
from ..models.base import ToolCall
from ..protocol import Executor, ToolResult
from . import catalog, declarations, host_git, network
from .tooldef import READ_ONLY_KINDS, BoxCaller, RunContext, ToolDef


class Box(BoxCaller, Protocol):
    """What the registry needs of the sandbox it is handed (sandbox/base.py Sandbox is one): a call
    run in the box, and every process there killed on a cancel. tools/ sits below sandbox/
    (docs/architecture.md), so it names the sandbox only by what it uses."""

    def kill_processes(self) -> None: ...


# The built-in tools by name (catalog.py); a host tool of the session's own is described by a
# ToolDef of its name, kind and side alone (ToolDef(name, kind, side)).
SPECS: dict[str, ToolDef] = catalog.TOOLS


class RegistryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    disabled: set[str] = Field(default_factory=set, description="Tools switched off for this session.")
    git: bool = True


@dataclass
class PreparedCall:
    """The invocation: a call whose arguments its declaration (`spec`, tooldef.py) validated: what
    the ladder judges, what a person is asked about (`title`), and what runs (`execute`)."""

    call: ToolCall
    spec: ToolDef
    args: BaseModel
    kind: str
    action: str  # e.g. "shell", "git commit": the ladder's finest key

    @property
    def read_only(self) -> bool:
        return self.kind in READ_ONLY_KINDS

    def arguments(self) -> dict[str, Any]:
        return self.args.model_dump(exclude_none=True)

    @property
    def command(self) -> str | None:
        """What a policy rule's command_prefix is matched against (the tool names the argument)."""
        if self.spec.approval.command_arg is None:
            return None
        value = self.arguments().get(self.spec.approval.command_arg)
        return value if isinstance(value, str) else None

    @property
    def title(self) -> str:
        """What the call does, in one line a person reads at its approval prompt."""
        return self.spec.call_title(self.arguments())

    def execute(self, context: RunContext) -> ToolResult:
        """Run it: the declaration's own runner for a host tool, one request to the box's agent
        for a sandbox tool (a host tool of the session's own is invoked by its HostTools)."""
        return self.spec.execute(context, self.args)


class HostTools(Protocol):
    """Extra host-side tools a session brings (the user's MCP servers: orchestrator/tools/mcp/client.py McpHost).
    They prepare and invoke their own calls; switching one off by name works as for the built-ins."""

    def names(self) -> list[str]: ...
    def owns(self, name: str) -> bool: ...
    def declarations(self, family: str) -> list[dict[str, Any]]: ...
    def prepare(self, call: ToolCall) -> PreparedCall: ...
    def invoke(self, prepared: PreparedCall) -> ToolResult: ...


class OwnHostTools:
    """Host tools the session adds for its owner (copy mode's changes/apply_changes, the API's
    rollback, MCP's fork) in front of the host tools it had (`inner`: the user's MCP servers, or
    another layer of these), which keep working as they were. Only the owner's own calls reach
    them when `issued` is given (their ids): a model's call is an unknown tool. No model is told of
    them (declarations are the inner ones'); `LISTED`: whether names() lists them (a client's tools).
    A subclass names its tools' declarations in `DECLARED` (the owner's actions: owner.py), whose
    calls are validated as any tool's (ToolDef.validate: the one validation), and runs them (invoke_own)."""

    DECLARED: tuple[ToolDef, ...] = ()
    OWN: tuple[str, ...] = ()
    LISTED = True

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if cls.DECLARED:
            cls.OWN = tuple(tool.name for tool in cls.DECLARED)

    def __init__(self, inner: HostTools | None = None, issued: set[str] | None = None) -> None:
        self.inner = inner
        self.issued = issued

    def names(self) -> list[str]:
        return (list(self.OWN) if self.LISTED else []) + (self.inner.names() if self.inner is not None else [])

    def owns(self, name: str) -> bool:
        return name in self.OWN or (self.inner is not None and self.inner.owns(name))

    def declarations(self, family: str) -> list[dict[str, Any]]:
        return self.inner.declarations(family) if self.inner is not None else []

    def kill_running(self) -> None:
        """Cancel reaches the inner host tools' calls (loop/__init__.py
        looks for this); the own ones end on their own."""
        stop = getattr(self.inner, "kill_running", None)
        if callable(stop):
            stop()

    def prepare(self, call: ToolCall) -> PreparedCall:
        if call.name not in self.OWN:
            assert self.inner is not None
            return self.inner.prepare(call)
        if (
            self.issued is not None and call.id not in self.issued
        ):  # not the owner's own call (a model's, in the API's run())
            raise OpenAgentsError(
                ErrorType.UNKNOWN_TOOL,
                f"unknown tool {call.name!r}: {call.name} is the program's, not a tool of the model",
            )
        return self.prepare_own(call)

    def invoke(self, prepared: PreparedCall) -> ToolResult:
        if prepared.spec.name not in self.OWN:
            assert self.inner is not None
            return self.inner.invoke(prepared)
        return self.invoke_own(prepared)

    def prepare_own(self, call: ToolCall) -> PreparedCall:
        """The call validated by its declaration, as every tool's is (its kind and policy key with it)."""
        spec = next(tool for tool in self.DECLARED if tool.name == call.name)
        own = spec.validate(call.arguments)
        return PreparedCall(call, spec, own.args, own.kind, own.action)

    def invoke_own(self, prepared: PreparedCall) -> ToolResult:
        raise NotImplementedError


class ToolRegistry:
    def __init__(
        self,
        sandbox: Box,
        workspace: Path,
        config: RegistryConfig | None = None,
        repo: host_git.HostRepo | None = None,
        host_tools: HostTools | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.workspace = Path(workspace)
        self.config = config or RegistryConfig()
        self.repo = repo if self.config.git else None
        self.host_tools = host_tools
        # Before any call that is not read-only runs: the session's wait for its first checkpoint
        # (session.py); False: the wait was cut short (cancelled), and the call does not run.
        self.before_change: Callable[[], bool] | None = None
        unknown = {n for n in self.config.disabled - SPECS.keys() if not n.startswith("mcp__")}
        if unknown:
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID, f"cannot disable unknown tools: {', '.join(sorted(unknown))}"
            )

    @staticmethod
    def open_repo(workspace: Path, config: RegistryConfig | None = None) -> host_git.HostRepo | None:
        """Call at session start, before the sandbox starts: the only moment .git is known to be the user's."""
        return host_git.HostRepo.open_at_start(workspace) if (config or RegistryConfig()).git else None

    def active(self) -> list[str]:
        names = [n for n, s in SPECS.items() if not s.needs_repo or self.repo is not None]
        if self.host_tools is not None:
            names += self.host_tools.names()
        return [n for n in names if n not in self.config.disabled]

    def declarations(self, family: str) -> list[dict[str, Any]]:
        own = declarations.declarations([n for n in self.active() if n in SPECS], family, self.network_sentence())
        if self.host_tools is None:
            return own
        extra = [
            d
            for d in self.host_tools.declarations(family)
            if d.get("function", d).get("name") not in self.config.disabled
        ]
        return own + extra

    def runtime_name(self) -> str:
        """The box's runtime as chosen at its start (runsc, runc), or "" before it has one."""
        backend = getattr(getattr(self.sandbox, "config", None), "backend", None)
        runtime = getattr(backend, "runtime", None)
        return runtime if isinstance(runtime, str) else ""

    def network_sentence(self) -> str:
        """What the sandbox's network really is, for the system prompt and the tools that reach it."""
        return network.of_sandbox(self.sandbox)

    def prepare(self, call: ToolCall) -> PreparedCall:
        if call.arguments_error is not None:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"{call.name}: {call.arguments_error}")
        if self.host_tools is not None and self.host_tools.owns(call.name):
            if call.name in self.config.disabled:
                raise OpenAgentsError(
                    ErrorType.TOOL_DISABLED, f"the tool {call.name!r} is switched off in this session"
                )
            return self.host_tools.prepare(call)
        spec = SPECS.get(call.name)
        if spec is None:
            raise OpenAgentsError(
                ErrorType.UNKNOWN_TOOL, f"unknown tool {call.name!r}; the tools are {', '.join(self.active())}"
            )
        if call.name not in self.active():
            raise OpenAgentsError(ErrorType.TOOL_DISABLED, f"the tool {call.name!r} is switched off in this session")
        own = spec.validate(call.arguments)
        return PreparedCall(call, spec, own.args, own.kind, own.action)

    def kill_running(self) -> None:
        """Cancel: what runs in the sandbox is killed from outside (host tools end at their deadline)."""
        self.sandbox.kill_processes()

    def invoke(self, prepared: PreparedCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """`on_output(text)`: a shell call's output while it runs, for a live view. A call that may
        change files (any not read-only), and one that reads the checkpoint store (a fork), first waits for
        the session's first checkpoint."""
        waits = not prepared.read_only or prepared.spec.reads_checkpoints
        if waits and self.before_change is not None and not self.before_change():
            err = OpenAgentsError(
                ErrorType.CANCELLED, "cancelled while it waited for the session's first checkpoint (it never ran)"
            )
            return ToolResult.failure(err, executor=Executor.USER)
        if self.host_tools is not None and self.host_tools.owns(prepared.spec.name):
            return self.host_tools.invoke(prepared)
        return prepared.execute(RunContext(self.sandbox, self.repo, on_output))
