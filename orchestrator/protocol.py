"""Wire messages between the host and the container agent (see sandbox_agent/server.py), and the
result every tool call ends in. Everything the agent says is validated here: it is untrusted.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from sandbox_agent import PROTOCOL_VERSION, table

from .errors import ErrorType, OpenAgentsError


class Executor(str, Enum):
    """Who produced an outcome: the host (openagents), the sandbox (runtime) or the person (user)."""

    OPENAGENTS = "openagents"
    RUNTIME = "runtime"
    USER = "user"


@dataclass(frozen=True)
class BoxRule:
    """How the sandbox supervisor (sandbox/base.py) runs one call of a tool in the box: the agent's
    table states it for each of its tools (sandbox_agent/table.py RULES), the tool's declaration
    carries it (tools/tooldef.py ToolDef.box), and each call to the box carries it (BoxCall), so the
    sandbox never looks a tool up by its name."""

    timeout_arg: str | None = None  # the argument naming the call's own seconds; None: the fixed per-call deadline
    timeout_default_s: int = 0  # that argument's default and the most it may ask (the agent clamps it the same)
    timeout_max_s: int = 0
    exclusive: bool = False  # a command: named to the agent by a key (api/turns.py), so a cancel kills it alone
    streams: bool = False  # sends its output while it runs (on_output)
    writes: bool = False  # may grow the workspace: the write quota is polled after it
    # may leave processes of its own in the box (beside the agent), which kill_processes ends: while no such call
    # ran and no call is under way, the box holds only its agent and a kill has nothing to do (a close skips it)
    spawns: bool = False

    @classmethod
    def of_agent(cls, tool: str) -> BoxRule:
        """The rule the agent's table states for `tool` (the default for a name it has no rule for)."""
        rule = table.RULES.get(tool)
        if not rule:
            return DEFAULT_RULE
        bounds = table.TOOLS[tool][2] if tool in table.TOOLS else {}  # the program's own operations have none
        timeout = rule.get("timeout_arg")
        return cls(
            timeout_arg=timeout if isinstance(timeout, str) else None,
            timeout_default_s=bounds.get("timeout_default_s", 0) if timeout else 0,
            timeout_max_s=bounds.get("timeout_max_s", 0) if timeout else 0,
            **{flag: rule.get(flag) is True for flag in ("exclusive", "streams", "writes", "spawns")},
        )

    def deadline(self, args: Mapping[str, Any]) -> float | None:
        """The seconds a call may run by its own arguments, clamped as the agent clamps them (the host
        adds its grace); None: the sandbox's fixed per-call deadline. Read from raw arguments too (a
        caller of the sandbox may pass anything): a non-integer is the default."""
        if self.timeout_arg is None:
            return None
        requested = args.get(self.timeout_arg, self.timeout_default_s)
        if not isinstance(requested, int) or isinstance(requested, bool):
            requested = self.timeout_default_s
        return float(min(max(requested, 1), self.timeout_max_s))


DEFAULT_RULE = BoxRule()


@dataclass(frozen=True)
class BoxCall:
    """One request to the box, as the sandbox runs it: the tool's name, its arguments (validated on
    the host when they come from a model's call), and the rule its declaration carries."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    rule: BoxRule = DEFAULT_RULE

    @classmethod
    def named(cls, tool: str, args: dict[str, Any]) -> BoxCall:
        """A request by name (the program's own operations, a self-check): the agent's rule for it."""
        return cls(tool, args, BoxRule.of_agent(tool))


class AgentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    v: int = PROTOCOL_VERSION
    id: int
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    stream: bool | None = None  # shell: send output chunks while it runs (left out when None)


# Bounds on what one answer may carry, well above anything the agent sends (its largest output is a
# list of 500 paths; its largest meta an edit's diff, cut at 256 KiB): past them it is not the agent.
MAX_OUTPUT_CHARS = 4 << 20
MAX_NOTE_CHARS = 1 << 20
MAX_META_CHARS = 4 << 20  # JSON-escaped: a 256 KiB diff of control characters is 1.5 M
_INT_BOUND = 1 << 63
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Meta keys only the host writes: an agent's (or a forger's) are dropped, never shown as the host's.
# "egress" and "diff" are no meta keys (ToolResult's typed fields): an agent's are dropped too.
HOST_META_KEYS = frozenset({"egress", "diff", "host_elapsed_s", "workspace_growth_bytes"})


def _refuse_odd_values(value: Any) -> None:
    """ValueError for what the agent never sends and a consumer may choke on: a lone surrogate (from a
    JSON escape; it cannot be written as UTF-8), a number that is not finite, an integer past 64 bits.
    Iterative: the nesting is already bounded (jsonbound), but no recursion is needed for it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                raise ValueError("a lone surrogate")
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -_INT_BOUND < item < _INT_BOUND:
                raise ValueError("an integer past 64 bits")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("a number that is not finite")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


class WireError(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field(max_length=200)
    message: str = Field(default="", max_length=1 << 20)


class AgentResponse(BaseModel):
    """One answer line. Anything can write it (under gVisor a command reaches the agent's stdout):
    strict types, and values outside what the agent sends are a validation error, so the channel
    refuses the line as a protocol error before any consumer sees it."""

    model_config = ConfigDict(extra="ignore")
    v: StrictInt
    id: StrictInt | None
    ok: StrictBool
    output: str = Field(default="", max_length=MAX_OUTPUT_CHARS)
    note: str = Field(default="", max_length=MAX_NOTE_CHARS)
    meta: dict[str, Any] = Field(default_factory=dict)
    error: WireError | None = None

    @model_validator(mode="after")
    def _plain_values(self) -> "AgentResponse":
        _refuse_odd_values(
            [
                self.output,
                self.note,
                self.meta,
                self.error.type if self.error else "",
                self.error.message if self.error else "",
            ]
        )
        if self.meta and len(json.dumps(self.meta, ensure_ascii=False)) > MAX_META_CHARS:
            raise ValueError(f"meta over {MAX_META_CHARS} characters")
        return self


def agent_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """An answer's meta as results carry it: the host's own keys and the typed fields' dropped (the
    host sets them; the diff goes to ToolResult.diff, agent_diff)."""
    return {k: v for k, v in meta.items() if k not in HOST_META_KEYS}


def agent_diff(meta: dict[str, Any]) -> str | None:
    """An edit's diff as the agent sent it, only as text (consumers show it; it is still the agent's
    word, shown escaped)."""
    diff = meta.get("diff")
    return diff if isinstance(diff, str) else None


class EgressRecord(BaseModel):
    """One request the box made through the egress gate, or the line saying how many more there
    were (decision "omitted"). Every field bounded by the host (sandbox/egress.py bounded_record):
    its values quote requests the box made. bytes_up/bytes_down: for an allowed request what went to
    the upstream and came back; for a refused one (nothing reached the upstream) what the box sent
    the gate and the refusal it got back. `credential`: whether the gate injected one, never its value."""

    time: float | None = None
    method: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None  # query stripped
    decision: str  # allow | deny | error | omitted
    rule: str | None = None
    reason: str | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None
    credential: bool = False
    tls: str | None = None  # tunnel (passed through) | intercepted (opened for a credential) | None (plain http)


class ErrorInfo(BaseModel):
    type: ErrorType
    message: str
    recoverable: bool

    @classmethod
    def of(cls, err: OpenAgentsError) -> "ErrorInfo":
        return cls(type=err.type, message=err.message, recoverable=err.recoverable)


class ToolResult(BaseModel):
    """The outcome of one tool call, as the transcript records it and the model reads it."""

    ok: bool
    output: str = ""
    note: str = ""
    meta: dict[str, Any] = Field(
        default_factory=dict
    )  # the tool's own metadata (exit_code, sha256, ...) and the host's timings
    error: ErrorInfo | None = None
    executor: Executor = Executor.RUNTIME
    diff: str | None = None  # an edit's unified diff (the agent's word, shown escaped)
    egress: list[EgressRecord] = Field(default_factory=list)  # the gate's record of each request the call made

    @classmethod
    def failure(
        cls,
        err: OpenAgentsError,
        executor: Executor = Executor.OPENAGENTS,
        output: str = "",
        meta: dict[str, Any] | None = None,
        egress: list[EgressRecord] | None = None,
    ) -> "ToolResult":
        return cls(
            ok=False, output=output, meta=meta or {}, error=ErrorInfo.of(err), executor=executor, egress=egress or []
        )

    @classmethod
    def from_agent(cls, response: AgentResponse) -> "ToolResult":
        error = None
        if not response.ok:
            wire = response.error or WireError(type="protocol_error", message="the agent failed without saying why")
            kind = ErrorType.parse(wire.type)
            error = ErrorInfo(type=kind, message=wire.message, recoverable=kind.recoverable)
        return cls(
            ok=response.ok,
            output=response.output,
            note=response.note,
            meta=agent_meta(response.meta),
            error=error,
            executor=Executor.RUNTIME,
            diff=agent_diff(response.meta),
        )

    def for_model(self) -> str:
        """The text the model sees: output, the notes on bounds, and a typed error if any."""
        parts = [p for p in (self.output, self.note) if p]
        if self.error:
            parts.append(
                f"ERROR {self.error.type.value} "
                f"({'recoverable' if self.error.recoverable else 'fatal'}): {self.error.message}"
            )
        return "\n".join(parts) if parts else "(no output)"
