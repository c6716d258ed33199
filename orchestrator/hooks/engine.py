"""The hook points: which hooks match, each run in order, and the verdict their answers make.

Exit codes, as Gemini CLI's: 0 = ok, stdout (if any) is one JSON object and is honoured; 2 = block,
stderr is the reason; anything else (a crash, a kill at the timeout, a start that failed) and
stdout that is not one JSON object under the cap are a hook error (hook_failed). A hook error
fails closed at a Before* point (the call, the model request, the prompt is refused) and is
recorded at the others. What a hook prints is untrusted: parsed field by field, every text
escaped and cut before it is recorded, shown or given to the model.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError
from ..policy.hook_spec import BEFORE, HookSpec
from ..programs.reach import box_roots
from ..programs.resolve import Resolved, SearchPath, resolve, search_path
from ..protocol import Executor
from ..transcript import Transcript
from . import run as run_

TEXT_CAP = 4000  # a reason, a message, one context: escaped, then cut
CONTEXT_CAP = 16000  # all the context one point adds for the model
TIERS = {0: "default", 1: "workspace", 2: "user", 3: "admin"}


def clean(text: object, cap: int = TEXT_CAP) -> str:
    from ..ground.text import visible

    shown = visible(text if isinstance(text, str) else json.dumps(text, default=str)[:cap])
    return shown if len(shown) <= cap else shown[:cap] + "…[cut]"


@dataclass
class Verdict:
    """What the hooks of one point decided, together."""

    blocked: bool = False
    reason: str = ""
    error_type: ErrorType = ErrorType.REJECTED_BY_USER
    stop: bool = False  # continue: false
    stop_reason: str = ""
    ask: bool = False
    tool_input: dict[str, Any] | None = None  # BeforeTool's replacement (validated again by the caller)
    allowed_tools: list[str] | None = None  # BeforeToolSelection: only narrows
    context: list[str] = field(default_factory=list)

    def context_text(self) -> str:
        text = "\n".join(self.context)
        return text[:CONTEXT_CAP]


def plan(
    specs: list[HookSpec], workspace: Path, exempt: Sequence[Path] = ()
) -> tuple[list[tuple[HookSpec, Resolved]], list[str], SearchPath]:
    """Each hook's command as it will run (programs/resolve.py resolve), found now on the hook's PATH;
    one line for each refused (its program or an interpreter lies where the box can write)."""
    roots = box_roots(workspace)
    search = search_path(roots)
    kept: list[tuple[HookSpec, Resolved]] = []
    refused: list[str] = []
    memo: dict[str, str | None] = {}  # one start's links, shared by its hooks
    for hook in specs:
        try:
            kept.append((hook, resolve(hook.argv, roots, search, exempt, memo)))
        except OpenAgentsError as err:
            refused.append(f"{hook.label()}: {err.message}")
    return kept, refused, search


def secrets_of(hook: HookSpec, model_key: str | None) -> set[str]:
    """The secrets a hook's own table passes by name: a user's or admin's only (a workspace file's never)."""
    if hook.tier < 2:
        return set()
    return {*hook.secrets, *([model_key] if hook.pass_model_key and model_key else [])}


class Hooks:
    """The session's hooks, resolved once at its start (`plan`): each runs by the absolute paths found
    then, with the PATH found then. `withheld`: the secrets no hook gets unless its table names them
    in `secrets` (the model's key always is one)."""

    def __init__(
        self,
        specs: list[HookSpec],
        workspace: Path,
        transcript: Transcript,
        session_id: str = "",
        model_key: str | None = None,
        box_workspace: Path | None = None,
        withheld: Iterable[str] = (),
        exempt: Sequence[Path] = (),
    ) -> None:
        self.workspace = Path(workspace)
        self.box_workspace = Path(
            box_workspace or workspace
        )  # the tree the box works on (copy mode: the session's copy)
        self.transcript = transcript
        self.session_id = session_id
        self.model_key = model_key
        self.withheld = {*withheld, *([model_key] if model_key else [])}
        self.planned, self.refused, search = plan(list(specs), self.workspace, exempt)
        self.specs = [hook for hook, _ in self.planned]
        self.base_env = run_.base_environment(box_roots(self.workspace), search)

    def active(self, event: str) -> bool:
        return any(h.event == event for h in self.specs)

    def fire(
        self,
        event: str,
        fields: dict[str, Any],
        tool: str | None = None,
        kind: str | None = None,
        command: str | None = None,
        trigger: str | None = None,
        call_id: str | None = None,
        stop_at_rewrite: bool = False,
    ) -> Verdict:
        """Every matching hook, in order; the first block ends the round (a later hook's allow
        undoes nothing). `stop_at_rewrite`: BeforeTool's round ends at the first new tool_input
        (the caller validates it and runs the whole round again on it)."""
        verdict = Verdict()
        for hook, resolved in self.planned:
            if hook.event != event or not hook.matches(tool, kind, command, trigger):
                continue
            self._one(hook, resolved, event, fields, verdict, tool, call_id)
            if verdict.blocked or verdict.stop or (stop_at_rewrite and verdict.tool_input is not None):
                break
        return verdict

    def _payload(self, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        return {
            "hook_event_name": event,
            "session_id": self.session_id,
            "cwd": str(self.workspace),
            "box_workspace": str(self.box_workspace),
            "transcript_path": str(self.transcript.path) if getattr(self.transcript, "path", None) else "",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **fields,
        }

    def _one(
        self,
        hook: HookSpec,
        resolved: Resolved,
        event: str,
        fields: dict[str, Any],
        verdict: Verdict,
        tool: str | None,
        call_id: str | None,
    ) -> None:
        env = run_.environment(
            self.base_env,
            hook.env,
            secrets_of(hook, self.model_key),
            self.withheld,
            {"OA_HOOK_EVENT": event, "OA_SESSION_ID": self.session_id, "OA_PROJECT_DIR": str(self.workspace)},
        )
        if resolved.problem:  # found not runnable at the start: fails at its point, as a program that cannot start
            ran = run_.Ran(None, b"", b"", False, False, f"cannot run: {resolved.problem}", 0.0)
        else:
            ran = run_.run(list(resolved.argv), self._payload(event, fields), env, hook.timeout, resolved.executable)
        record: dict[str, Any] = {
            "hook_event": event,
            "hook": clean(hook.label(), 300),
            "tier": TIERS.get(hook.tier, str(hook.tier)),
            "source": clean(hook.where, 500),
            "call_id": call_id,
            "tool": tool,
            "exit_code": ran.exit_code,
            "took_s": ran.took_s,
            "argv": [clean(word, 500) for word in resolved.argv[:32]],
        }
        failed = _failure(hook, ran)
        if failed is None and ran.exit_code == 2:
            reason = clean(ran.stderr.decode("utf-8", "replace").strip() or "blocked by a hook (exit code 2)")
            verdict.blocked, verdict.reason = True, f"{hook.label()}: {reason}"
            record.update(outcome="blocked", reason=reason)
        elif failed is None:
            answer, failed = _answer(ran.stdout)
            if answer is not None:
                _apply(answer, verdict, record, hook, event)
        if failed is not None:
            record.update(
                outcome="timeout" if ran.timed_out else "error",
                reason=clean(failed),
                error_type=ErrorType.HOOK_FAILED.value,
            )
            if event in BEFORE:  # fails closed: a guard that broke lets nothing through
                verdict.blocked, verdict.error_type = True, ErrorType.HOOK_FAILED
                verdict.reason = (
                    f"{hook.label()} failed ({clean(failed, 500)}): refused, as a Before* hook that fails blocks"
                )
        self.transcript.emit(ev.HookRan(executor=Executor.USER, **record))


def _failure(hook: HookSpec, ran: run_.Ran) -> str | None:
    if ran.problem:
        return ran.problem
    if ran.timed_out:
        return f"killed at its timeout ({hook.timeout:g} s)"
    if ran.exit_code not in (0, 2):
        tail = ran.stderr.decode("utf-8", "replace").strip()[-500:]
        return f"exit code {ran.exit_code}" + (f": {tail}" if tail else "")
    if ran.stdout_over:
        return f"printed over {run_.STDOUT_CAP} bytes on stdout"
    return None


def _answer(stdout: bytes) -> tuple[dict[str, Any] | None, str | None]:
    text = stdout.decode("utf-8", "replace").strip()
    if not text:
        return {}, None
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        return None, "its stdout is not JSON (a hook prints one JSON object on stdout, its logs on stderr)"
    if not isinstance(answer, dict):
        return None, "its stdout is not a JSON object"
    return answer, None


def _apply(answer: dict[str, Any], verdict: Verdict, record: dict[str, Any], hook: HookSpec, event: str) -> None:
    """One hook's JSON answer into the verdict; unknown fields and fields of the wrong type are passed over."""
    specific = answer.get("hookSpecificOutput")
    specific = specific if isinstance(specific, dict) else {}
    decision = answer.get("decision", specific.get("permissionDecision"))
    decision = (
        decision.lower()
        if isinstance(decision, str) and decision.lower() in ("allow", "approve", "deny", "block", "ask")
        else None
    )
    reason = answer.get("reason", specific.get("permissionDecisionReason"))
    reason = clean(reason) if isinstance(reason, str) else ""
    suppress = answer.get("suppressOutput") is True
    message = answer.get("systemMessage")
    record.update(
        outcome="ok",
        decision=decision,
        reason=reason,
        system_message="" if suppress or not isinstance(message, str) else clean(message),
    )
    if decision in ("deny", "block"):
        verdict.blocked, verdict.reason = True, f"{hook.label()}: {reason or 'blocked by a hook'}"
        record["outcome"] = "blocked"
    elif decision == "ask":
        verdict.ask = True
    if answer.get("continue") is False:
        stop = answer.get("stopReason")
        verdict.stop, verdict.stop_reason = (
            True,
            f"{hook.label()}: {clean(stop) if isinstance(stop, str) else 'stopped by a hook'}",
        )
        record.update(outcome="stopped", reason=verdict.stop_reason)
    context = specific.get("additionalContext", answer.get("additionalContext"))
    if isinstance(context, str) and context:
        verdict.context.append(clean(context))
        record["context_chars"] = len(verdict.context[-1])
    new_input = specific.get("tool_input", answer.get("tool_input"))
    if event == "BeforeTool" and isinstance(new_input, dict):
        verdict.tool_input = new_input
        record["rewrote_input"] = True
    config = specific.get("toolConfig")
    names = config.get("allowedFunctionNames") if isinstance(config, dict) else None
    if event == "BeforeToolSelection" and isinstance(names, list):
        allowed = [n for n in names if isinstance(n, str)]
        verdict.allowed_tools = (
            allowed if verdict.allowed_tools is None else [n for n in verdict.allowed_tools if n in allowed]
        )
