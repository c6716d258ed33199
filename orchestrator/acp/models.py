"""Pydantic models of the ACP messages we use (protocol version 1). Field names are ACP's own."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = 1

ToolKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"]
ToolCallStatus = Literal["pending", "in_progress", "completed", "failed"]
StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# -- JSON-RPC ------------------------------------------------------------------------------
class JsonRpcError(_Model):
    code: int
    message: str
    data: Any = None


class JsonRpcMessage(_Model):
    jsonrpc: Literal["2.0"]
    id: int | str | None = None
    method: str | None = None
    params: dict[str, Any] | None = None
    result: Any = None
    error: JsonRpcError | None = None


PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603


# -- content ---------------------------------------------------------------------------------
class TextContent(_Model):
    type: Literal["text"] = "text"
    text: str


class ContentToolCallContent(_Model):
    type: Literal["content"] = "content"
    content: TextContent


class ToolCallLocation(_Model):
    """A file a call touches, for editors that follow the agent; `line` is 1-based."""

    path: str
    line: int | None = Field(default=None, ge=1)


class DiffToolCallContent(_Model):
    type: Literal["diff"] = "diff"
    path: str
    oldText: str | None = None
    newText: str


ToolCallContent = Union[ContentToolCallContent, DiffToolCallContent]


# -- initialize, sessions ----------------------------------------------------------------------
class InitializeParams(_Model):
    protocolVersion: int
    clientCapabilities: dict[str, Any] = Field(default_factory=dict)

    def can_write_files(self) -> bool:
        """Whether the editor offers fs/write_text_file (exactly `true`; anything else is no)."""
        fs = self.clientCapabilities.get("fs")
        return isinstance(fs, dict) and fs.get("writeTextFile") is True


class PromptCapabilities(_Model):
    image: bool = False
    audio: bool = False
    embeddedContext: bool = False


class McpCapabilities(_Model):
    http: bool = False
    sse: bool = False


class AgentCapabilities(_Model):
    loadSession: bool = True  # session/load: a recorded session continued, its conversation replayed first
    promptCapabilities: PromptCapabilities = Field(default_factory=PromptCapabilities)
    mcpCapabilities: McpCapabilities = Field(default_factory=McpCapabilities)  # stdio only, which every agent supports


class InitializeResult(_Model):
    protocolVersion: int = PROTOCOL_VERSION
    agentCapabilities: AgentCapabilities = Field(default_factory=AgentCapabilities)
    authMethods: list[dict[str, Any]] = Field(default_factory=list)
    agentInfo: dict[str, str] = Field(default_factory=lambda: {"name": "openagents-sandbox", "version": "0.1.0"})


class NewSessionParams(_Model):
    cwd: str
    mcpServers: list[dict[str, Any]] = Field(default_factory=list)


class NewSessionResult(_Model):
    sessionId: str


class LoadSessionParams(_Model):
    sessionId: str
    cwd: str
    mcpServers: list[dict[str, Any]] = Field(default_factory=list)


class LoadSessionResult(_Model):
    """Answered once the whole conversation went out as session/update notifications."""


class PromptParams(_Model):
    sessionId: str
    prompt: list[dict[str, Any]]


# -- prompt content: what every agent must accept (text and resource links) ------------------------
class TextBlock(_Model):
    type: Literal["text"]
    text: str


class ResourceLinkBlock(_Model):
    type: Literal["resource_link"]
    uri: str = Field(max_length=8192)
    name: str = Field(max_length=1024)
    title: str | None = None
    description: str | None = None
    mimeType: str | None = None
    size: int | None = None


class PromptResult(_Model):
    stopReason: StopReason
    meta: dict[str, Any] | None = Field(default=None, alias="_meta")  # ACP's extension point: namespaced keys only


class CancelParams(_Model):
    sessionId: str


# -- session/update ------------------------------------------------------------------------------
class AgentMessageChunk(_Model):
    sessionUpdate: Literal["agent_message_chunk"] = "agent_message_chunk"
    content: TextContent


class UserMessageChunk(_Model):
    """The user's prompt, as session/load replays it."""

    sessionUpdate: Literal["user_message_chunk"] = "user_message_chunk"
    content: TextContent


class ToolCallStart(_Model):
    sessionUpdate: Literal["tool_call"] = "tool_call"
    toolCallId: str
    title: str
    kind: ToolKind = "other"
    status: ToolCallStatus = "pending"
    content: list[ToolCallContent] = Field(default_factory=list)
    locations: list[ToolCallLocation] | None = None
    rawInput: Any = None


class ToolCallUpdate(_Model):
    sessionUpdate: Literal["tool_call_update"] = "tool_call_update"
    toolCallId: str
    status: ToolCallStatus | None = None
    title: str | None = None
    kind: ToolKind | None = None
    content: list[ToolCallContent] | None = None
    locations: list[ToolCallLocation] | None = None
    rawOutput: Any = None


SessionUpdate = Union[AgentMessageChunk, UserMessageChunk, ToolCallStart, ToolCallUpdate]


class SessionNotification(_Model):
    sessionId: str
    update: SessionUpdate = Field(discriminator="sessionUpdate")


# -- permissions ---------------------------------------------------------------------------------
class PermissionOption(_Model):
    optionId: str
    name: str
    kind: Literal[
        "allow_once", "allow_always", "reject_once"
    ]  # allow_always only to widen a refused egress request for the session


class PermissionToolCall(_Model):
    toolCallId: str
    title: str | None = None
    kind: ToolKind | None = None
    status: ToolCallStatus | None = None
    rawInput: Any = None


class RequestPermissionParams(_Model):
    sessionId: str
    toolCall: PermissionToolCall
    options: list[PermissionOption]


# -- the editor's file system -------------------------------------------------------------------------
class WriteTextFileParams(_Model):
    sessionId: str
    path: str  # absolute
    content: str


class SelectedOutcome(_Model):
    outcome: Literal["selected"]
    optionId: str


class CancelledOutcome(_Model):
    outcome: Literal["cancelled"]


class RequestPermissionResult(_Model):
    outcome: Union[SelectedOutcome, CancelledOutcome] = Field(discriminator="outcome")
