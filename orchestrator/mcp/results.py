"""What an MCP tool call answers: `structuredContent` is the whole result, and each tool declares
the `outputSchema` it conforms to.

The MCP specification takes `structuredContent` as the result and the text block as its rendering
for clients without structured output; clients that support it (pydantic-ai's MCPToolset,
FastMCP's Client) hand the model `structuredContent` alone. So the payload is in it: `output`
holds what the tool's ToolDef says it holds (`output_doc`: a file's text, a listing, a command's
output, what was done), `note` the bounds and exit notes, `error` the typed error; the tool's metadata
(`sha256`, `exit_code`, ...) sits beside them at the top level. The text block keeps the same
result as the model reads it in `oa-sandbox run` (output, notes, error), for older clients.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from ..protocol import ToolResult
from ..tools import catalog
from ..tools.catalog import FORK_TOOL
from ..tools.tooldef import J_NAME
from ..workspace.copy_tools import apply_meta as apply_meta
from ..workspace.copy_tools import changes_meta as changes_meta
from ..workspace.fork_tool import FORK_OUTPUT_META

_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUM = {"type": "number"}

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Present when the call failed: a typed error (orchestrator/errors.py ErrorType).",
    "properties": {"type": _STR, "message": _STR, "recoverable": _BOOL},
    "required": ["type", "message", "recoverable"],
}

_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"type": ["integer", "null"]}
EGRESS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "description": "The egress gate's record of each request the call made (present when the box has "
    "egress; none made: empty). bytes_up/bytes_down: to and from the upstream when allowed; "
    "what the box sent and the refusal it got when refused. credential: whether the gate "
    "injected one (never its value). A last record with decision 'omitted' counts the rest.",
    "items": {
        "type": "object",
        "required": ["decision"],
        "properties": {
            "time": {"type": ["number", "null"]},
            "method": _OPT_STR,
            "host": _OPT_STR,
            "port": _OPT_INT,
            "path": _OPT_STR,
            "decision": {"type": "string", "enum": ["allow", "deny", "error", "omitted"]},
            "rule": _OPT_STR,
            "reason": _OPT_STR,
            "bytes_up": _OPT_INT,
            "bytes_down": _OPT_INT,
            "credential": _BOOL,
            "tls": _OPT_STR,
        },
    },
}

COMMON: dict[str, Any] = {
    "ok": {"type": "boolean", "description": "Whether the call succeeded."},
    "output": {"type": "string", "description": "The result itself, as the model reads it."},
    "note": {"type": "string", "description": "Notes on bounds, truncation, exit code; empty when there are none."},
    "error": ERROR_SCHEMA,
    "workspace_mode": {
        "type": "string",
        "enum": ["bind", "copy"],
        "description": "bind: the tools work on the real workspace; copy: on the session's private copy of it.",
    },
    "host_elapsed_s": _NUM,
    "workspace_growth_bytes": _INT,
    "egress": EGRESS_SCHEMA,
}

_MUTATING = {
    "in_private_copy": {
        "type": "boolean",
        "description": "Copy mode: true, the change is in the session's private copy and not "
        "in the real workspace until apply_changes lands it.",
    },
}

# The MCP server's own tools (landing.py); the built-in tools' words and metadata are their ToolDefs'.
_OUTPUT = {
    "changes": "The unified diff of the private copy against the real workspace.",
    "apply_changes": "What was applied, left out, or in conflict, one line each.",
    FORK_TOOL: "The session forked and the new sessions' ids.",
}

# A name in a result: a string (its UTF-8), or {"bytes_b64": ...} when its bytes are not UTF-8.
_NAME = dict(J_NAME)


def _named(**props: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"path": _NAME, "path_shown": _STR, **props},
        "required": ["path", "path_shown", *props],
    }


def _bounds(key: str) -> dict[str, Any]:
    """The keys beside a bounded list (terminal/machine.py)."""
    return {
        f"{key}_total": _INT,
        f"{key}_file": {
            "type": ["string", "null"],
            "description": f"When {key} is cut (over 1,000 items): a JSONL file holding every item.",
        },
    }


_META: dict[str, dict[str, Any]] = {
    FORK_TOOL: FORK_OUTPUT_META,
    "changes": {
        "changes": {
            "type": "array",
            "description": "Each changed entry of the copy: path (exact), path_shown and status.",
            "items": _named(status=_STR),
        },
        "count": _INT,
        **_bounds("changes"),
    },
    "apply_changes": {
        "applied": {"type": "array", "items": _NAME},
        "applied_shown": {"type": "array", "items": _STR},
        **_bounds("applied"),
        "left_out": {
            "type": "array",
            "description": "What the sanitiser never carries, and why.",
            "items": _named(reason=_STR),
        },
        **_bounds("left_out"),
        "conflicts": {
            "type": "array",
            "description": "Paths changed in the real workspace since the copy was taken: "
            "one conflict means nothing was applied.",
            "items": _named(reason=_STR),
        },
        **_bounds("conflicts"),
        "already": {"type": "array", "items": _NAME},
        "already_shown": {"type": "array", "items": _STR},
        **_bounds("already"),
    },
}


def output_schema(name: str) -> dict[str, Any]:
    """The JSON Schema every structuredContent of tool `name` conforms to (open: more metadata may come)."""
    props: dict[str, Any] = dict(COMMON)
    tool = catalog.get(name)
    if tool is not None:
        props["output"] = {"type": "string", "description": tool.mcp.output_doc}
        props.update(tool.mcp.result_meta)
        if tool.mutates:
            props.update(_MUTATING)
    else:
        props["output"] = {"type": "string", "description": _OUTPUT[name]}
        props.update(_META[name])
    return {
        "type": "object",
        "properties": props,
        "required": ["ok", "output", "note", "workspace_mode"],
        "additionalProperties": True,
    }


def structured(
    result: ToolResult, workspace_mode: str, extra: dict[str, Any] | None = None, egress: bool = False
) -> dict[str, Any]:
    """The whole result: metadata, then the payload, its diff and egress records, and error (which a
    metadata key never overrides)."""
    out: dict[str, Any] = dict(result.meta)
    out.update(extra or {})
    out.update(ok=result.ok, output=result.output, note=result.note, workspace_mode=workspace_mode)
    if result.diff is not None:
        out["diff"] = result.diff
    else:
        out.pop("diff", None)
    if egress or result.egress:
        out["egress"] = [record.model_dump(mode="json") for record in result.egress]
    else:
        out.pop("egress", None)
    if result.error is not None:
        out["error"] = {
            "type": result.error.type.value,
            "message": result.error.message,
            "recoverable": result.error.recoverable,
        }
    else:
        out.pop("error", None)
    return out


def to_call_result(
    result: ToolResult, workspace_mode: str = "bind", extra: dict[str, Any] | None = None, egress: bool = False
) -> types.CallToolResult:
    """structuredContent: the whole result; the text block: what the model would read in `run`.
    `egress`: the box has an egress gate, so the result says what the call sent through it (an
    empty list too: nothing went out)."""
    return types.CallToolResult(
        content=[types.TextContent(text=result.for_model())],
        structured_content=structured(result, workspace_mode, extra, egress),
        is_error=not result.ok,
    )
