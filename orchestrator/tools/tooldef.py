"""What a tool is, in one place: `ToolDef`. Each tool has its own file under tools/defs/ holding its
argument model and its ToolDef; everything else that knows about tools (the registry, the
declarations each model family gets, the MCP and ACP tool lists, the approval prompt's title, the
sandbox supervisor's deadline and one-at-a-time rule, the checkpoints) reads it from there
(catalog.py), so no other product file names a tool. The contract each tool keeps is docs/tools.md.

This module is data only: it imports no sandbox, session or front-end code, so every layer may
import it (the sandbox layer reads a tool's `BoxRule` from it) without an import circle.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from pydantic import BaseModel

if TYPE_CHECKING:
    from ..protocol import ToolResult


@dataclass(frozen=True)
class BoxRule:
    """How the sandbox supervisor runs one call of a tool in the box (sandbox/base.py). The sandbox
    layer knows these rules, never the tools' names."""

    # The seconds the call may run by its own arguments (the host adds its grace); None: the
    # sandbox's fixed per-call deadline.
    deadline: Callable[[Mapping[str, Any]], float] | None = None
    exclusive: bool = False  # one such call at a time in a box; its deadline starts when it holds the turn
    streams: bool = False  # sends its output while it runs (on_output)
    writes: bool = False  # may grow the workspace: the write quota is polled after it


DEFAULT_RULE = BoxRule()

# JSON Schema types for `result_meta`.
J_STR: Mapping[str, Any] = {"type": "string"}
J_INT: Mapping[str, Any] = {"type": "integer"}
J_BOOL: Mapping[str, Any] = {"type": "boolean"}
J_NUM: Mapping[str, Any] = {"type": "number"}


@dataclass(frozen=True)
class Prepared:
    """A validated call as a tool's own `prepare` hook returns it: the arguments, the ACP kind the
    ladder judges, and the finest policy key (e.g. "git commit")."""

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
class HostContext:
    """What a host-side tool runs against (the registry builds it): the repository opened at
    session start, or None when there is none."""

    repo: Any = None


@dataclass(frozen=True)
class ToolDef:
    """One tool. `name`, `kind` (ACP's: read, search, edit, delete, move, execute, fetch, think,
    other) and `side` (sandbox or host) come first so a host-side tool of the session's own (an MCP
    server's, tools/mcp/client.py) can be described by those three alone."""

    name: str
    kind: str
    side: Literal["sandbox", "host"]
    args: type[BaseModel] | None = None  # strict, extra fields forbidden: the declarations' schema too
    description: str = ""  # what every model family is told
    title: str = ""  # a short label: the MCP tool's title
    order: int = 100  # position in the declarations and lists (the snapshots' order)
    mutates: bool = False  # may change workspace files: a checkpoint follows the turn; copy mode says where
    box: BoxRule = DEFAULT_RULE  # sandbox tools: how the supervisor runs a call
    path_arg: bool = False  # has a workspace `path` argument: editors are shown where the call points
    path_may_be_directory: bool = False  # that path may name a directory (a listing, a search): its own AGENTS.md applies
    replaces_file: bool = False  # rewrites the file `path` names: a diff is previewed and shown
    propose: Callable[[str, Mapping[str, Any]], Proposal | None] | None = None  # (file before, args) -> its preview
    line_arg: str | None = None  # the argument naming the line the call starts at (editors follow it)
    match_arg: str | None = None  # the argument holding text of the file before the call: where the change is
    reads_file: bool = False  # returns a workspace file's text: how an editor's link to a file is read
    over_mcp: bool = False  # served by `oa-sandbox mcp`
    idempotent: bool = False  # MCP's hint: the same call twice changes nothing more
    reaches_network: bool = False  # MCP's open-world hint when egress is open
    command_arg: str | None = None  # the argument a policy rule's command_prefix matches
    output_doc: str = ""  # what the result's output holds (the MCP outputSchema's words)
    result_meta: Mapping[str, Any] = field(default_factory=dict)  # the result's metadata keys, as JSON Schema properties
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per model family: declaration keys replaced
    # One line a person reads (prompt, editor), from raw arguments; None: "<name> <pattern or path>".
    title_of: Callable[[Mapping[str, Any]], str] | None = None
    # Tools with several actions (git): validation that also names the kind and action judged.
    prepare: Callable[[Any], Prepared] | None = None
    actions: Mapping[str, str] = field(default_factory=dict)  # action -> kind, for policy files and announcements
    action_of: Callable[[Mapping[str, Any]], str | None] | None = None  # raw arguments -> action, before validation
    needs_repo: bool = False  # active only when a repository was opened at session start
    run: Callable[[HostContext, Any], "ToolResult"] | None = None  # host-side tools: the call itself

    @property
    def read_only(self) -> bool:
        return self.kind in ("read", "search", "think")

    def call_title(self, arguments: Any) -> str:
        args = arguments if isinstance(arguments, dict) else {}
        if self.title_of is not None:
            return self.title_of(args)
        detail = args.get("pattern") or args.get("path") or ""
        return f"{self.name} {str(detail)[:120]}".strip()

    def announced_kind(self, arguments: Any) -> str:
        """The kind a call is announced with before it is validated: a multi-action tool's action
        kind when its raw arguments name a reading one; the tool's kind otherwise."""
        if self.action_of is not None and isinstance(arguments, dict):
            kind = self.actions.get(self.action_of(arguments) or "")
            if kind in ("read", "search"):
                return kind
        return self.kind
