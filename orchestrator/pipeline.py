"""One tool call's steps, the same for every caller: validate -> decide (policy, approver) ->
execute -> record. The turn loop (loop/__init__.py) runs a model's calls through it, the MCP server its
client's calls (mcp/server.py), and the ACP server its editor's session through the loop; so every
call, whoever makes it, gets the same checks, the same approval and the same transcript events.

Each call goes validating -> awaiting_approval -> scheduled -> executing -> success | error |
cancelled, and every step lands in the transcript. The record step also keeps the counts and the
refused and failed calls the end-of-run summary shows.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from pydantic import BaseModel

from . import events as ev
from .errors import ErrorType, OpenAgentsError
from .events import ToolCallState
from .hooks import tools as tool_hooks
from .hooks.engine import Hooks
from .models.base import ToolCall
from .policy.approvals import ApprovalGate
from .protocol import Executor, ToolResult
from .sandbox.egress import widening_offer
from .tools.catalog import LAND_ACTION, LAND_TOOL
from .tools.registry import PreparedCall, ToolRegistry
from .transcript import Transcript

RESULT_PREVIEW_CHARS = 4000
MAX_EGRESS_SUMMARY = (
    500  # egress audit records kept for --output json (each bounded: sandbox/egress.py); the rest are counted
)


class CallOutcome(BaseModel):
    """One call that did not simply succeed, for the end-of-run summary."""

    call_id: str
    tool: str
    action: str = ""
    outcome: str  # refused | failed | cancelled
    reason: str
    executor: Executor
    error_type: str | None = None
    exit_code: int | None = None


class CallPipeline:
    """`cancel`: set when the session is cancelled (a call not yet run does not run; one running
    is reported cancelled). `out_of_time`: set when --max-wall passed while a call ran."""

    def __init__(
        self, registry: ToolRegistry, gate: ApprovalGate, transcript: Transcript, cancel: threading.Event | None = None
    ) -> None:
        self.registry = registry
        self.gate = gate
        self.transcript = transcript
        self.cancel = cancel or threading.Event()
        self.out_of_time = threading.Event()
        self.calls: dict[str, int] = {"ok": 0, "failed": 0, "refused": 0, "cancelled": 0}
        self.refused_calls: list[CallOutcome] = []
        self.failed_calls: list[CallOutcome] = []
        self._actions: dict[str, str] = {}
        self.books = threading.Lock()
        # The egress audit (the transcript's `egress` events' fields, call id included): at most
        # MAX_EGRESS_SUMMARY records, then egress_omitted says how many more the transcript has.
        self.egress: list[dict[str, Any]] = []
        self.egress_omitted = 0
        self.hooks: Hooks | None = (
            None  # the user's hooks (hooks/): BeforeTool before the ladder, AfterTool after the run
        )
        self.stop_reason = ""  # a hook's continue: false (the turn loop ends the session on it)

    def run(self, call: ToolCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """All four steps for one call."""
        prepared = self.validate_and_decide(call)
        return prepared if isinstance(prepared, ToolResult) else self.execute(prepared, on_output)

    # -- validate, decide ------------------------------------------------------------------
    def validate_and_decide(self, call: ToolCall) -> PreparedCall | ToolResult:
        """The call validated and approved (then it is scheduled), or its recorded refusal."""
        self._state(
            call,
            ToolCallState.VALIDATING,
            arguments=call.arguments if call.arguments_error is None else call.raw_arguments,
            arguments_error=call.arguments_error,
        )
        try:
            prepared = self.registry.prepare(call)
        except OpenAgentsError as err:
            return self.finish(call, ToolResult.failure(err, executor=Executor.OPENAGENTS))
        ask = False
        if self.hooks is not None:  # before the ladder, which then decides on what the hooks left
            try:
                prepared, ask = tool_hooks.before_tool(self.hooks, self.registry, prepared)
            except OpenAgentsError as err:
                return self.finish(call, ToolResult.failure(err, executor=Executor.USER))
        rewritten = (
            prepared.arguments() if prepared.call is not call else None
        )  # a hook's new input, recorded as judged and run
        self._state(
            call, ToolCallState.AWAITING_APPROVAL, kind=prepared.kind, action=prepared.action, arguments=rewritten
        )
        outcome = self.gate.decide(prepared, ask=ask, notify=tool_hooks.notify_permission(self.hooks, prepared))
        with self.books:
            self._actions[call.id] = prepared.action
        self.transcript.emit(
            ev.ApprovalDecided(
                executor=outcome.executor,
                call_id=call.id,
                tool=call.name,
                action=prepared.action,
                level=outcome.level.value,
                decision=outcome.decision,
                reason=outcome.reason,
            )
        )
        if not outcome.allowed:
            kind = ErrorType.REJECTED_BY_USER if outcome.executor == Executor.USER else ErrorType.REFUSED_BY_POLICY
            refusal = OpenAgentsError(kind, f"{prepared.action} was not approved: {outcome.reason}")
            if (prepared.spec.name, prepared.action) == (
                LAND_TOOL,
                LAND_ACTION,
            ):  # MCP's apply_changes: every landing's one refusal
                from .workspace.review.landing import refusal as landing_refusal  # copy mode's review, not exec's

                refusal = landing_refusal(outcome)
            return self.finish(call, ToolResult.failure(refusal, executor=outcome.executor))
        self._state(call, ToolCallState.SCHEDULED)
        return prepared

    # -- execute ---------------------------------------------------------------------------
    def execute(self, prepared: PreparedCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """Run an approved call and record its result. `on_output`: a streaming call's output as it
        comes, besides the transcript's live event (which is sent when someone watches)."""
        call = prepared.call
        if self.cancel.is_set():
            err = OpenAgentsError(ErrorType.CANCELLED, "the session was cancelled before this call ran")
            return self.finish(call, ToolResult.failure(err, executor=Executor.USER), state=ToolCallState.CANCELLED)
        if self.out_of_time.is_set():  # --max-wall passed while it was being approved: it never starts
            err = OpenAgentsError(
                ErrorType.BUDGET_EXCEEDED, "the time budget (--max-wall) ran out before this call ran"
            )
            return self.finish(
                call, ToolResult.failure(err, executor=Executor.OPENAGENTS), state=ToolCallState.CANCELLED
            )
        self._state(call, ToolCallState.EXECUTING)
        watched = self.transcript.on_event is not None

        def streamed(text: str) -> None:
            if watched:
                self.transcript.notify(
                    ev.ToolOutputStreamed(executor=Executor.RUNTIME, call_id=call.id, tool=call.name, text=text)
                )
            if on_output is not None:
                on_output(text)

        result = self.registry.invoke(prepared, on_output=streamed if watched or on_output is not None else None)
        if self.out_of_time.is_set():  # --max-wall passed while it ran: its processes were killed
            err = OpenAgentsError(
                ErrorType.BUDGET_EXCEEDED,
                "the time budget (--max-wall) ran out while this call ran; its processes were killed",
            )
            cut = ToolResult.failure(
                err, executor=Executor.OPENAGENTS, output=result.output, meta=result.meta, egress=result.egress
            )
            return self.finish(call, cut, state=ToolCallState.CANCELLED)
        if self.cancel.is_set():  # cancelled while it ran: its processes were killed
            err = OpenAgentsError(
                ErrorType.CANCELLED, "the session was cancelled while this call ran; its processes were killed"
            )
            cancelled = ToolResult.failure(
                err, executor=Executor.USER, output=result.output, meta=result.meta, egress=result.egress
            )
            return self.finish(call, cancelled, state=ToolCallState.CANCELLED)
        if self.hooks is not None:
            result, stop = tool_hooks.after_tool(self.hooks, prepared, result)
            self.stop_reason = self.stop_reason or stop
        return self.finish(call, result)

    def kill_running(self) -> None:
        self.registry.kill_running()

    # -- record ----------------------------------------------------------------------------
    def _state(self, call: ToolCall, state: ToolCallState, **fields: Any) -> None:
        self.transcript.emit(ev.ToolCallChanged(call_id=call.id, tool=call.name, state=state, **fields))

    def finish(self, call: ToolCall, result: ToolResult, state: ToolCallState | None = None) -> ToolResult:
        """The record step: counted, its egress records and its result in the transcript."""
        if state is None:  # a call cancelled on its own (the API's per-call cancel: api/turns.py) is recorded cancelled
            cancelled = result.error is not None and result.error.type is ErrorType.CANCELLED
            state = (
                ToolCallState.SUCCESS if result.ok else ToolCallState.CANCELLED if cancelled else ToolCallState.ERROR
            )
        self._book(call, result, state)
        for record in result.egress:
            event = ev.EgressRecorded.of(call.id, record)
            self.transcript.emit(event)
            with self.books:
                if len(self.egress) < MAX_EGRESS_SUMMARY:
                    self.egress.append(event.fields())
                else:
                    self.egress_omitted += 1
            if event.decision == "deny" and event.rule == "default deny":
                widened = self._offer_widening(call, event)
                if widened:  # the model learns it may try again
                    result = result.model_copy(update={"note": (result.note + "\n" if result.note else "") + widened})
        self._state(call, state)
        self.transcript.emit(
            ev.ToolCallFinished(
                executor=result.executor,
                call_id=call.id,
                tool=call.name,
                state=state,
                ok=result.ok,
                output=result.output[:RESULT_PREVIEW_CHARS],
                note=result.note,
                error=result.error.model_dump(mode="json") if result.error else None,
                meta=result.meta,
                diff=result.diff,
            )
        )
        return result

    def _offer_widening(self, call: ToolCall, event: ev.EgressRecorded) -> str:
        """A request the gate refused because no rule matched: the person may allow it once or for
        the session (the gate's rules change live, this session only). What is offered and written
        is the literal request shown (sandbox/egress.py widening_offer). Nothing is offered for an
        explicit deny, a record that names no one literal request, a session without a person, or
        a sandbox without a gate."""
        widen = getattr(self.registry.sandbox, "widen_egress", None)
        offer = widening_offer(event.method, event.host, event.port, event.path, event.tls)
        if offer is None or not callable(widen):
            return ""
        rule, what = offer
        arguments = {
            "host": rule.host,
            "port": rule.port,
            "method": rule.methods[0] if rule.methods else None,
            "path": event.path if rule.path else None,
        }
        outcome = self.gate.widen_egress(call.id, what, arguments)
        if outcome.allowed and not widen(rule, outcome.decision == "allow_once"):
            outcome = outcome.model_copy(
                update={"allowed": False, "decision": "refused", "reason": "the egress gate could not take the rule"}
            )
        if outcome.decision != "refused" or getattr(self.gate.approver, "asks_egress", False):
            self.transcript.emit(
                ev.ApprovalDecided(
                    executor=outcome.executor,
                    call_id=call.id,
                    tool="egress",
                    action=f"egress {what}",
                    level=outcome.level.value,
                    decision=outcome.decision,
                    reason=outcome.reason,
                )
            )
        if not outcome.allowed:
            return ""
        how = "for this session" if outcome.decision == "approved_for_session" else "for one request"
        return f"the user allowed egress to {what} {how}: the refused request may be tried again"

    def _book(self, call: ToolCall, result: ToolResult, state: ToolCallState) -> None:
        """Counts every call's outcome once; refused and failed calls are kept with their reason."""
        exit_code = result.meta.get("exit_code")
        exit_code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
        error_type = result.error.type if result.error else None
        if state is ToolCallState.CANCELLED:
            outcome = "cancelled"
        elif error_type in (ErrorType.REJECTED_BY_USER, ErrorType.REFUSED_BY_POLICY):
            outcome = "refused"
        elif not result.ok or (exit_code is not None and exit_code != 0):
            outcome = "failed"
        else:
            outcome = "ok"
        with self.books:
            self.calls[outcome] += 1
            if outcome in ("refused", "failed"):
                reason = result.error.message if result.error else f"exit code {exit_code}"
                record = CallOutcome(
                    call_id=call.id,
                    tool=call.name,
                    action=self._actions.get(call.id, call.name),
                    outcome=outcome,
                    reason=reason[:500],
                    executor=result.executor,
                    error_type=error_type.value if error_type else None,
                    exit_code=exit_code,
                )
                (self.refused_calls if outcome == "refused" else self.failed_calls).append(record)
