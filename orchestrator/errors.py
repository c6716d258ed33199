"""One error taxonomy, used end to end: the agent's wire errors, the host's, the model's and the CLI's.

Recoverable errors go back to the model so it can correct itself; fatal ones end the session.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Self


class ErrorType(str, Enum):
    # arguments and tools (the model can fix these)
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_DISABLED = "tool_disabled"
    # paths
    PATH_INVALID = "path_invalid"
    PATH_OUTSIDE_WORKSPACE = "path_outside_workspace"
    PATH_IN_GIT_DIR = "path_in_git_dir"
    FILE_NOT_FOUND = "file_not_found"
    NOT_A_FILE = "not_a_file"
    NOT_A_DIRECTORY = "not_a_directory"
    IS_DIRECTORY = "is_directory"
    PERMISSION_DENIED = "permission_denied"
    FILE_TOO_LARGE = "file_too_large"
    # edits and searches
    EDIT_NO_MATCH = "edit_no_match"
    EDIT_AMBIGUOUS = "edit_ambiguous"
    STALE_CONTENT = "stale_content"
    INVALID_REGEX = "invalid_regex"
    ENCODING_ERROR = "encoding_error"  # the file is not in an encoding the tool can edit (not the arguments' fault)
    # execution
    TIMEOUT = "timeout"
    IO_ERROR = "io_error"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    NOT_REGULAR_FILE = "not_regular_file"  # a FIFO, socket or device where a file was expected
    UNSAFE_WORKSPACE_FILE = "unsafe_workspace_file"  # the host refused to read what the box may have planted
    INTERNAL_ERROR = "internal_error"
    AGENT_LOST = "agent_lost"
    PROTOCOL_ERROR = "protocol_error"
    # approvals
    REFUSED_BY_POLICY = "refused_by_policy"
    REJECTED_BY_USER = "rejected_by_user"
    CANCELLED = "cancelled"
    # a user's hook crashed, timed out or printed no JSON (docs/hooks.md): a Before* hook fails closed
    HOOK_FAILED = "hook_failed"
    # fatal: the session cannot go on
    NO_SPACE = "no_space"
    DOCKER_UNAVAILABLE = "docker_unavailable"
    IMAGE_MISSING = "image_missing"
    SANDBOX_START_FAILED = "sandbox_start_failed"
    MODEL_API_ERROR = "model_api_error"
    CONFIG_INVALID = "config_invalid"
    LOOP_DETECTED = "loop_detected"
    MAX_TURNS = "max_turns"
    BUDGET_EXCEEDED = "budget_exceeded"  # --max-tokens or --max-wall spent
    WORKSPACE_QUOTA_EXCEEDED = "workspace_quota_exceeded"
    SANDBOX_CLOSED = "sandbox_closed"  # a call on a sandbox the program closed (orchestrator.api)
    HOOK_STOPPED = "hook_stopped"  # a user's hook answered continue: false (docs/hooks.md)

    @property
    def recoverable(self) -> bool:
        return self not in _FATAL

    @classmethod
    def parse(cls, value: object) -> "ErrorType":
        """Map a wire string to a member; anything unknown from the untrusted agent is a protocol error."""
        try:
            return cls(value)
        except ValueError:
            return cls.PROTOCOL_ERROR


_FATAL = frozenset(
    {
        ErrorType.NO_SPACE,
        ErrorType.DOCKER_UNAVAILABLE,
        ErrorType.IMAGE_MISSING,
        ErrorType.SANDBOX_START_FAILED,
        ErrorType.MODEL_API_ERROR,
        ErrorType.CONFIG_INVALID,
        ErrorType.LOOP_DETECTED,
        ErrorType.MAX_TURNS,
        ErrorType.BUDGET_EXCEEDED,
        ErrorType.WORKSPACE_QUOTA_EXCEEDED,
        ErrorType.SANDBOX_CLOSED,
        ErrorType.HOOK_STOPPED,
    }
)


class OpenAgentsError(Exception):
    """Raised on the host for any typed failure; carries its ErrorType."""

    def __init__(self, type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.type = type
        self.message = message

    @property
    def recoverable(self) -> bool:
        return self.type.recoverable

    def detached(self) -> Self:
        """The same error (same class) with no traceback, cause or context: one to keep, or to hand
        to another thread. A kept exception object gains the frames of every place that raises it,
        and those frames hold the keeper (a channel, a future) in a reference cycle: each lost agent's
        channel, socket and buffers stayed in memory until the next full garbage collection."""
        clone = type(self).__new__(type(self))
        clone.args, clone.__dict__ = self.args, dict(self.__dict__)
        return clone

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type.value, "message": self.message, "recoverable": self.recoverable}
