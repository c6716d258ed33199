"""Wire messages between the host and the container agent (see sandbox_agent/server.py), and the
result every tool call ends in. Everything the agent says is validated here: it is untrusted.
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_agent import PROTOCOL_VERSION

from .errors import ErrorType, OpenAgentsError


class Executor(str, Enum):
    """Who produced an outcome: the host (openagents), the sandbox (runtime) or the person (user)."""

    OPENAGENTS = "openagents"
    RUNTIME = "runtime"
    USER = "user"


class AgentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    v: int = PROTOCOL_VERSION
    id: int
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    stream: bool | None = None  # shell: send output chunks while it runs (left out when None)


class WireError(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    message: str = Field(default="", max_length=1 << 20)


class AgentResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")
    v: int
    id: int | None
    ok: bool
    output: str = ""
    note: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)
    error: WireError | None = None


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
    meta: dict[str, Any] = Field(default_factory=dict)
    error: ErrorInfo | None = None
    executor: Executor = Executor.RUNTIME

    @classmethod
    def failure(cls, err: OpenAgentsError, executor: Executor = Executor.OPENAGENTS, output: str = "", meta: dict[str, Any] | None = None) -> "ToolResult":
        return cls(ok=False, output=output, meta=meta or {}, error=ErrorInfo.of(err), executor=executor)

    @classmethod
    def from_agent(cls, response: AgentResponse) -> "ToolResult":
        error = None
        if not response.ok:
            wire = response.error or WireError(type="protocol_error", message="the agent failed without saying why")
            kind = ErrorType.parse(wire.type)
            error = ErrorInfo(type=kind, message=wire.message, recoverable=kind.recoverable)
        return cls(ok=response.ok, output=response.output, note=response.note, meta=response.meta, error=error, executor=Executor.RUNTIME)

    def for_model(self) -> str:
        """The text the model sees: output, the notes on bounds, and a typed error if any."""
        parts = [p for p in (self.output, self.note) if p]
        if self.error:
            parts.append(f"ERROR {self.error.type.value} ({'recoverable' if self.error.recoverable else 'fatal'}): {self.error.message}")
        return "\n".join(parts) if parts else "(no output)"
