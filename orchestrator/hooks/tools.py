"""BeforeTool and AfterTool, as the call pipeline (pipeline.py) fires them for every call of every
front-end. BeforeTool runs before the ladder: a block refuses the call (executor user); a new
tool_input is validated again against the tool's schema (registry.prepare) and the whole round runs
again on it, so every hook sees what will run; the ladder then decides on it (a hook's allow never
skips a policy's deny: policy/approvals.py decide, which also tells the Notification hook before a
person is asked). AfterTool sees the result (box-written: bounded and marked) and may add
context the model reads with the result, or hide the result behind its reason."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import ErrorType, OpenAgentsError
from ..policy.approvals import Question
from ..protocol import ToolResult
from ..tools.registry import PreparedCall, ToolRegistry
from .engine import Hooks, clean

MAX_REWRITES = 4
INPUT_STRING_CAP = 1024 * 1024
RESULT_CAP = 64 * 1024


def _bounded(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return value if len(value) <= INPUT_STRING_CAP else value[:INPUT_STRING_CAP] + "…[cut]"
    if depth > 20:
        return None
    if isinstance(value, dict):
        return {str(k)[:1000]: _bounded(v, depth + 1) for k, v in list(value.items())[:1000]}
    if isinstance(value, list):
        return [_bounded(v, depth + 1) for v in value[:1000]]
    return value


def _fields(prepared: PreparedCall) -> dict[str, Any]:
    return {
        "tool_name": prepared.spec.name,
        "tool_input": _bounded(prepared.arguments()),
        "tool_kind": prepared.kind,
        "tool_action": prepared.action,
        "call_id": prepared.call.id,
    }


def before_tool(hooks: Hooks, registry: ToolRegistry, prepared: PreparedCall) -> tuple[PreparedCall, bool]:
    """The call as the hooks leave it, and whether one asked for a person; raises the refusal."""
    ask = False
    for _ in range(MAX_REWRITES + 1):
        verdict = hooks.fire(
            "BeforeTool",
            _fields(prepared),
            tool=prepared.spec.name,
            kind=prepared.kind,
            command=prepared.command,
            call_id=prepared.call.id,
            stop_at_rewrite=True,
        )
        ask = ask or verdict.ask
        if verdict.stop:  # fatal: the turn loop ends the session on it
            raise OpenAgentsError(
                ErrorType.HOOK_STOPPED, f"a hook stopped the session at {prepared.action}: {verdict.stop_reason}"
            )
        if verdict.blocked:
            raise OpenAgentsError(verdict.error_type, f"a hook refused {prepared.action}: {verdict.reason}")
        if verdict.tool_input is None or verdict.tool_input == prepared.arguments():
            return prepared, ask
        call = prepared.call.model_copy(
            update={"arguments": verdict.tool_input, "raw_arguments": None, "arguments_error": None}
        )
        try:
            prepared = registry.prepare(call)  # validated again: a hook's input is no better than the model's
        except OpenAgentsError as err:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"a hook's new tool_input is not valid: {err.message}"
            ) from None
    raise OpenAgentsError(
        ErrorType.HOOK_FAILED, f"the hooks rewrote the input of {prepared.action} over {MAX_REWRITES} times: refused"
    )


def after_tool(hooks: Hooks, prepared: PreparedCall, result: ToolResult) -> tuple[ToolResult, str]:
    """The result as the model will read it, and a hook's reason to stop the session (or "")."""
    output = result.output
    response = {
        "ok": result.ok,
        "output": output[:RESULT_CAP],
        "output_truncated": len(output) > RESULT_CAP,
        "box_written": True,
        "error": result.error.model_dump(mode="json") if result.error else None,
    }
    verdict = hooks.fire(
        "AfterTool",
        {**_fields(prepared), "tool_response": response},
        tool=prepared.spec.name,
        kind=prepared.kind,
        command=prepared.command,
        call_id=prepared.call.id,
    )
    notes = [result.note] if result.note else []
    if verdict.blocked:  # Gemini's AfterTool deny: the model gets the reason instead of the result
        result = result.model_copy(update={"output": f"[the result was withheld by a hook: {clean(verdict.reason)}]"})
    if verdict.context:
        notes.append("hook context (the user's hooks said):\n" + verdict.context_text())
    if verdict.stop:
        notes.append(f"[a hook asked to stop the session: {verdict.stop_reason}]")
    changed = notes != ([result.note] if result.note else [])
    return (
        result.model_copy(update={"note": "\n".join(notes)}) if changed else result
    ), verdict.stop_reason if verdict.stop else ""


def notify_permission(hooks: Hooks | None, prepared: PreparedCall) -> Callable[[Question, str], None] | None:
    """The Notification hook (`ToolPermission`), as the decision calls it just before a person is asked
    about `prepared` (policy/approvals.py decide); None when no such hook is in force."""
    if hooks is None or not hooks.active("Notification"):
        return None

    def notify(_question: Question, reason: str) -> None:
        hooks.fire(
            "Notification",
            {
                "notification_type": "ToolPermission",
                "message": f"approval asked for {prepared.action}",
                "details": {
                    "tool_name": prepared.spec.name,
                    "tool_input": _bounded(prepared.arguments()),
                    "reason": reason,
                },
            },
            trigger="ToolPermission",
            call_id=prepared.call.id,
        )

    return notify
