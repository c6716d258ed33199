"""What a tool is, as Gemini CLI splits it (packages/core/src/tools/tools.ts): a frozen
**declaration** (`ToolDef`) and an **invocation** (a call whose arguments passed the declaration's
validation: registry.PreparedCall, built by `ToolDef.validate`, run by `ToolDef.execute`).

The declaration is data, testable alone: the model-facing face (name, description, argument model
and so JSON schema, kind), where it runs (sandbox or host) and how (`BoxRule`), the bounds the box
enforces (`bounds`, checked against the agent's own table: sandbox_agent/table.py), what the
approval ladder judges (`Approval`), how a call relates to a workspace file (`FileUse`) and what
the MCP server says of it (`McpFace`). Each tool has its own file under tools/defs/ holding its
argument model and its ToolDef; everything else that knows about tools reads it from catalog.py,
so no other product file names a tool. The contract each tool keeps is docs/tools.md.

This module imports no sandbox, session or front-end code, so every layer may import it (the
sandbox layer reads a tool's `BoxRule` from it) without an import circle; the sandbox an invocation
runs in is only a `BoxCaller` here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Protocol

from pydantic import BaseModel

from ..errors import ErrorType, OpenAgentsError
from ..models.base import parse_arguments
from ..protocol import DEFAULT_RULE, BoxCall, BoxRule
from .argbase import shown_path, validate_model

if TYPE_CHECKING:
    from ..protocol import ToolResult

__all__ = ["DEFAULT_RULE", "BoxRule"]  # with the rest: a declaration's parts, whatever module defines them

# ACP's tool kinds (the ladder judges by them); read, search and think change nothing.
KINDS = ("read", "search", "edit", "delete", "move", "execute", "fetch", "think", "other")
READ_ONLY_KINDS = ("read", "search", "think")


# JSON Schema types for `McpFace.result_meta`.
J_STR: Mapping[str, Any] = {"type": "string"}
J_INT: Mapping[str, Any] = {"type": "integer"}
J_BOOL: Mapping[str, Any] = {"type": "boolean"}
J_NUM: Mapping[str, Any] = {"type": "number"}
# A name in a result, exact (sandbox_agent/names.py): its text, or {"bytes_b64": ...} when its bytes are not UTF-8
# (or its text would be longer as JSON than that).
J_NAME: Mapping[str, Any] = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "object",
            "properties": {"bytes_b64": {"type": "string"}},
            "required": ["bytes_b64"],
            "additionalProperties": False,
        },
    ]
}


@dataclass(frozen=True)
class Prepared:
    """A validated call as `ToolDef.validate` (or a tool's own `Approval.prepare`) returns it: the
    arguments, the ACP kind the ladder judges, and the finest policy key (e.g. "git commit")."""

    args: BaseModel
    kind: str
    action: str


@dataclass(frozen=True)
class Proposal:
    """What a file-replacing call would make of the file, for the preview at its approval prompt
    (proposed.py): the verb, the new file's size in characters (known before it is built, so a
    huge result is never built), and how to build it."""

    verb: str
    size: int
    make: Callable[[], str]


@dataclass(frozen=True)
class Approval:
    """What the approval ladder judges of a call, and the words a person is asked with."""

    # One line a person reads (prompt, editor), from raw arguments; None: "<name> <pattern or path>".
    describe: Callable[[Mapping[str, Any]], str] | None = None
    command_arg: str | None = None  # the argument a policy rule's command_prefix matches
    # Tools with several actions (git): action -> kind, for policy files and announcements; raw
    # arguments -> action, before validation; and the validation that also names kind and action.
    actions: Mapping[str, str] = field(default_factory=dict)
    action_of: Callable[[Mapping[str, Any]], str | None] | None = None
    prepare: Callable[[Any], Prepared] | None = None
    action: str = ""  # the policy key of the tool's one action, when it is not the tool's name (landing: "land")


@dataclass(frozen=True)
class FileUse:
    """How a call relates to one workspace file: where editors are shown it points, and the preview
    of a file it replaces."""

    path_arg: bool = False  # has a workspace `path` argument
    path_may_be_directory: bool = (
        False  # that path may name a directory (a listing, a search): its own AGENTS.md applies
    )
    reads_file: bool = False  # returns a workspace file's text: how an editor's link to a file is read
    replaces_file: bool = False  # rewrites the file `path` names: a diff is previewed and shown
    propose: Callable[[str, Mapping[str, Any]], Proposal | None] | None = None  # (file before, args) -> its preview
    line_arg: str | None = None  # the argument naming the line the call starts at (editors follow it)
    match_arg: str | None = None  # the argument holding text of the file before the call: where the change is


NO_FILE = FileUse()


@dataclass(frozen=True)
class McpFace:
    """What `oa-sandbox mcp` says of the tool (its hints and outputSchema)."""

    served: bool = False  # served by `oa-sandbox mcp`
    idempotent: bool = False  # the same call twice changes nothing more
    output_doc: str = ""  # what the result's output holds
    result_meta: Mapping[str, Any] = field(
        default_factory=dict
    )  # the result's metadata keys, as JSON Schema properties


NOT_SERVED = McpFace()


class BoxCaller(Protocol):
    """What an invocation of a sandbox tool needs of the sandbox (sandbox/base.py Sandbox): one call,
    carrying its rule, run in the box."""

    def run(self, call: BoxCall, on_output: Callable[[str], None] | None = None) -> ToolResult: ...


@dataclass(frozen=True)
class RunContext:
    """What an invocation runs against (the registry builds it): the sandbox for a box tool, the
    repository opened at session start for a host tool (None when there is none), and where a
    streaming call's output goes while it runs."""

    sandbox: BoxCaller | None = None
    repo: Any = None
    on_output: Callable[[str], None] | None = None


@dataclass(frozen=True)
class ToolDef:
    """One tool's declaration. `name`, `kind` (KINDS) and `side` (sandbox or host) come first so a
    host-side tool of the session's own (an MCP server's, tools/mcp/client.py) can be described by those
    three alone."""

    name: str
    kind: str
    side: Literal["sandbox", "host"]
    args: type[BaseModel] | None = None  # strict, extra fields forbidden: the declarations' schema too
    description: str = ""  # what every model family is told
    title: str = ""  # a short label (the MCP tool's title)
    order: int = 100  # position in the declarations and lists (the snapshots' order)
    mutates: bool = False  # may change workspace files: a checkpoint follows the turn; copy mode says where
    reaches_network: bool = (
        False  # its description ends with the network sentence; MCP's open-world hint when egress is open
    )
    needs_repo: bool = False  # active only when a repository was opened at session start
    # reads the session's checkpoint store (a fork copies it): waits for the session's first checkpoint, as a
    # call that may change files does
    reads_checkpoints: bool = False
    # The limits the box enforces on a call (names as sandbox_agent/table.py's; tests/unit/test_tool_table.py).
    bounds: Mapping[str, int] = field(default_factory=dict)
    overrides: Mapping[str, Mapping[str, Any]] = field(
        default_factory=dict
    )  # per model family: declaration keys replaced
    box: BoxRule = DEFAULT_RULE  # sandbox tools: how the supervisor runs a call (the agent's table states it)
    approval: Approval = Approval()
    files: FileUse = NO_FILE
    mcp: McpFace = NOT_SERVED
    run: Callable[[RunContext, Any], ToolResult] | None = None  # host-side tools: the call itself

    def __post_init__(self) -> None:
        if self.side == "sandbox" and self.box is DEFAULT_RULE:  # the agent's own word on how its tool runs
            object.__setattr__(self, "box", BoxRule.of_agent(self.name))

    @property
    def read_only(self) -> bool:
        return self.kind in READ_ONLY_KINDS

    def call_title(self, arguments: Any) -> str:
        args = arguments if isinstance(arguments, dict) else {}
        if self.approval.describe is not None:
            return self.approval.describe(args)
        detail = args.get("pattern") or args.get("path") or ""
        if isinstance(detail, dict):  # a name that is not UTF-8 ({"bytes_b64": ...}): its bytes, escaped
            detail = shown_path(detail)
        return f"{self.name} {str(detail)[:120]}".strip()

    def announced_kind(self, arguments: Any) -> str:
        """The kind a call is announced with before it is validated: a multi-action tool's action
        kind when its raw arguments name a reading one; the tool's kind otherwise."""
        if self.approval.action_of is not None and isinstance(arguments, dict):
            kind = self.approval.actions.get(self.approval.action_of(arguments) or "")
            if kind in ("read", "search"):
                return kind
        return self.kind

    def validate(self, raw: str | bytes | dict[str, Any] | None) -> Prepared:
        """The model's raw arguments as this tool's arguments, with the kind and action the ladder
        judges, or a typed error (Gemini CLI's `build`: nothing runs here)."""
        if self.approval.prepare is not None:
            return self.approval.prepare(raw)
        if self.args is None:
            raise OpenAgentsError(ErrorType.UNKNOWN_TOOL, f"{self.name} declares no arguments")
        action = self.approval.action or self.name
        return Prepared(validate_model(self.args, self.name, parse_arguments(raw)), self.kind, action)

    def execute(self, context: RunContext, args: BaseModel) -> ToolResult:
        """Run validated arguments: a host tool's own `run`, or one request to the box's agent (a
        streaming tool's output goes to `context.on_output` while it runs)."""
        if self.run is not None:
            return self.run(context, args)
        if self.side != "sandbox" or context.sandbox is None:
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{self.name} has nowhere to run")
        call = BoxCall(self.name, args.model_dump(exclude_none=True), self.box)
        return context.sandbox.run(call, context.on_output if self.box.streams else None)
