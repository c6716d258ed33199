"""The turn loop and the tool-call scheduler.

Each call goes validating -> awaiting_approval -> scheduled -> executing -> success | error |
cancelled, and every step lands in the transcript. Read-only calls of one turn run in parallel.
The session ends on a final answer, max turns, a detected loop, a fatal error, or Ctrl-C.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Callable

from pydantic import BaseModel

from . import events as ev
from .budget import Budget, compact, default_context_window, estimate_tokens, usage_tokens
from .config import EgressRule
from .errors import ErrorType, OpenAgentsError
from .events import ToolCallState
from .models.base import Message, ModelClient, ToolCall
from .policy.approvals import ApprovalGate
from .protocol import ErrorInfo, Executor, ToolResult
from .tools.registry import PreparedCall, ToolRegistry
from .transcript import Transcript

SYSTEM_PROMPT = """You are a coding agent working on a repository mounted at /workspace inside a sandbox.
Use the tools to read, search, edit and test the code. Paths are relative to the workspace root.
The sandbox has no network. Commands run with /bin/sh -c and no standard input.
Read a file before you edit it, and pass the sha256 it showed as expected_sha256.
When the task is done, answer with a short summary and no tool call."""

MAX_PARALLEL_READS = 4
RESULT_PREVIEW_CHARS = 4000
MAX_EGRESS_SUMMARY = 500  # egress audit records kept for --output json (each bounded: sandbox/egress.py); the rest are counted


class SessionStatus(str, Enum):
    FINISHED = "finished"
    STOPPED = "stopped"
    CANCELLED = "cancelled"


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


class SessionResult(BaseModel):
    status: SessionStatus
    reason: str
    final_text: str = ""
    turns: int = 0
    error: ErrorInfo | None = None
    calls: dict[str, int] = {}  # by outcome: ok, failed, refused, cancelled
    refused_calls: list[CallOutcome] = []
    failed_calls: list[CallOutcome] = []
    tokens: dict[str, int] = {"input": 0, "output": 0}
    wall_s: float = 0.0
    # The egress audit (the transcript's `egress` events' fields, call id included): at most
    # MAX_EGRESS_SUMMARY records, then egress_omitted says how many more the transcript has.
    egress: list[dict[str, Any]] = []
    egress_omitted: int = 0

    @property
    def refused(self) -> bool:
        return bool(self.refused_calls)


class Session:
    def __init__(self, model: ModelClient, registry: ToolRegistry, gate: ApprovalGate, transcript: Transcript,
                 max_turns: int = 100, loop_limit: int = 5, cancel: threading.Event | None = None,
                 after_turn: Callable[[int, list[str]], None] | None = None, session_id: str = "", workspace_mode: str = "",
                 budget: Budget | None = None) -> None:
        """`after_turn(turn, tool names)` runs once a turn's calls are done (the session's checkpoint)."""
        self.model = model
        self.registry = registry
        self.gate = gate
        self.transcript = transcript
        self.max_turns = max_turns
        self.loop_limit = loop_limit
        self.cancel = cancel or threading.Event()
        self.messages: list[Message] = [Message(role="system", content=SYSTEM_PROMPT)]
        self._recent: deque[str] = deque(maxlen=loop_limit)
        self.after_turn = after_turn
        self.session_id = session_id
        self.workspace_mode = workspace_mode
        self.budget = budget or Budget()
        self.context_window = self.budget.context_window or default_context_window(model.family, model.name)
        self.tokens = {"input": 0, "output": 0}
        self.calls: dict[str, int] = {"ok": 0, "failed": 0, "refused": 0, "cancelled": 0}
        self.refused_calls: list[CallOutcome] = []
        self.failed_calls: list[CallOutcome] = []
        self.egress: list[dict[str, Any]] = []
        self.egress_omitted = 0
        self._actions: dict[str, str] = {}
        self._books = threading.Lock()
        self._started = time.monotonic()
        self._out_of_time = threading.Event()  # --max-wall passed: set by a timer while a call may run

    # -- the loop --------------------------------------------------------------------------
    def run(self, task: str) -> SessionResult:
        self.transcript.emit(ev.SessionStarted(task=task, model=self.model.name, family=self.model.family, session_id=self.session_id,
                                               workspace=str(self.registry.workspace), workspace_mode=self.workspace_mode, tools=self.registry.active()))
        self.messages.append(Message(role="user", content=task))
        self._started = time.monotonic()
        wall_timer = None
        if self.budget.max_wall_s is not None:  # a call still running when the time is up is killed, not waited for
            wall_timer = threading.Timer(self.budget.max_wall_s, self._wall_spent)
            wall_timer.daemon = True
            wall_timer.start()
        try:
            return self._run_turns()
        finally:
            if wall_timer is not None:
                wall_timer.cancel()

    def _wall_spent(self) -> None:
        self._out_of_time.set()
        self.registry.kill_running()

    def _run_turns(self) -> SessionResult:
        turn = 0
        try:
            while True:
                if self.cancel.is_set():
                    return self._end(SessionStatus.CANCELLED, "cancelled", turn, executor=Executor.USER)
                if turn >= self.max_turns:
                    err = OpenAgentsError(ErrorType.MAX_TURNS, f"stopped after {self.max_turns} turns")
                    return self._end(SessionStatus.STOPPED, err.message, turn, error=err)
                spent = self._over_budget()
                if spent:
                    return self._end(SessionStatus.STOPPED, spent.message, turn, error=spent)
                turn += 1
                self._compact(turn)
                tools = self.registry.declarations(self.model.family)
                self.transcript.emit(ev.ModelRequested(turn=turn, messages=len(self.messages), tools=[_tool_name(t) for t in tools],
                                                       context_tokens=estimate_tokens(self.messages)))
                try:
                    reply = self.model.complete(self.messages, tools)
                except OpenAgentsError as err:
                    return self._end(SessionStatus.STOPPED, f"the model API failed: {err.message}", turn, error=err)
                spent_in, spent_out = usage_tokens(reply.usage)
                self.tokens["input"] += spent_in
                self.tokens["output"] += spent_out
                self.transcript.emit(ev.ModelResponded(turn=turn, text=reply.text, tool_calls=[c.model_dump(exclude_none=True) for c in reply.tool_calls],
                                                       usage=reply.usage))
                self.messages.append(Message(role="assistant", content=reply.text, tool_calls=reply.tool_calls))
                if not reply.tool_calls:
                    return self._end(SessionStatus.FINISHED, "the model gave its final answer", turn, final_text=reply.text, executor=Executor.OPENAGENTS)
                spent = self._over_budget()
                if spent:  # the calls of a reply past the budget do not run
                    return self._end(SessionStatus.STOPPED, spent.message, turn, error=spent)
                looping = self._note_calls(reply.tool_calls)
                results = self._run_calls(reply.tool_calls)
                for call, result in zip(reply.tool_calls, results, strict=True):
                    self.messages.append(Message(role="tool", tool_call_id=call.id, name=call.name, content=result.for_model()))
                if self.after_turn:
                    self.after_turn(turn, [call.name for call in reply.tool_calls])
                fatal = next((r.error for r in results if r.error and not r.error.recoverable), None)
                if fatal:
                    stop = OpenAgentsError(fatal.type, fatal.message)
                    return self._end(SessionStatus.STOPPED, f"a fatal error: {fatal.type.value}: {fatal.message}", turn, error=stop)
                if looping:
                    stop = OpenAgentsError(ErrorType.LOOP_DETECTED, f"the same call ({looping}) was made {self.loop_limit} times in a row")
                    return self._end(SessionStatus.STOPPED, stop.message, turn, error=stop)
                if self.cancel.is_set():
                    return self._end(SessionStatus.CANCELLED, "cancelled", turn, executor=Executor.USER)
        except OpenAgentsError as err:  # e.g. the sandbox could not be restarted inside a call
            return self._end(SessionStatus.STOPPED, f"{err.type.value}: {err.message}", turn, error=err)
        except KeyboardInterrupt:
            self.cancel.set()
            self.registry.kill_running()
            return self._end(SessionStatus.CANCELLED, "interrupted (Ctrl-C); the running call was killed", turn, executor=Executor.USER)
        except Exception as exc:  # a bug of ours: the transcript still ends, typed, and the error goes on up
            internal = OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            self._end(SessionStatus.STOPPED, f"internal error: {internal.message}", turn, error=internal)
            raise

    def _end(self, status: SessionStatus, reason: str, turns: int, final_text: str = "", error: OpenAgentsError | None = None,
             executor: Executor = Executor.OPENAGENTS) -> SessionResult:
        info = ErrorInfo.of(error) if error else None
        wall = round(time.monotonic() - self._started, 3)
        self.transcript.emit(ev.SessionEnded(executor=executor, status=status.value, reason=reason, turns=turns,
                                             final_text=final_text, error=info.model_dump(mode="json") if info else None,
                                             tokens=dict(self.tokens), wall_s=wall))
        with self._books:
            return SessionResult(status=status, reason=reason, final_text=final_text, turns=turns, error=info, calls=dict(self.calls),
                                 refused_calls=list(self.refused_calls), failed_calls=list(self.failed_calls), tokens=dict(self.tokens), wall_s=wall,
                                 egress=list(self.egress), egress_omitted=self.egress_omitted)

    # -- budgets ---------------------------------------------------------------------------
    def _over_budget(self) -> OpenAgentsError | None:
        spent = self.tokens["input"] + self.tokens["output"]
        if self.budget.max_tokens is not None and spent >= self.budget.max_tokens:
            return OpenAgentsError(ErrorType.BUDGET_EXCEEDED, f"the token budget is spent: {spent} of {self.budget.max_tokens} tokens (--max-tokens)")
        elapsed = time.monotonic() - self._started
        if self.budget.max_wall_s is not None and elapsed >= self.budget.max_wall_s:
            return OpenAgentsError(ErrorType.BUDGET_EXCEEDED, f"the time budget is spent: {elapsed:.0f} s of {self.budget.max_wall_s:g} s (--max-wall)")
        return None

    def _compact(self, turn: int) -> None:
        elided, before, after = compact(self.messages, self.context_window)
        if elided:
            self.transcript.emit(ev.ContextCompacted(executor=Executor.OPENAGENTS, turn=turn, elided_outputs=elided, tokens_before=before,
                                                     tokens_after=after, context_window=self.context_window))

    def _note_calls(self, calls: list[ToolCall]) -> str | None:
        for call in calls:
            self._recent.append(_signature(call))
            if len(self._recent) == self.loop_limit and len(set(self._recent)) == 1:
                return call.name
        return None

    # -- one turn's calls ------------------------------------------------------------------
    def _run_calls(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Validate and approve in order (a person answers one question at a time), then execute:
        consecutive read-only calls together, everything else one by one, in the model's order."""
        results: list[ToolResult | None] = [None] * len(calls)
        approved: list[tuple[int, PreparedCall]] = []
        for i, call in enumerate(calls):
            prepared = self._validate_and_approve(call)
            if isinstance(prepared, ToolResult):
                results[i] = prepared
            else:
                approved.append((i, prepared))
        batch: list[tuple[int, PreparedCall]] = []
        for item in approved + [(-1, None)]:
            if item[1] is not None and item[1].read_only:
                batch.append(item)
                continue
            if batch:
                self._execute_batch(batch, results)
                batch = []
            if item[1] is not None:
                results[item[0]] = self._execute(item[1])
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _validate_and_approve(self, call: ToolCall) -> PreparedCall | ToolResult:
        self._state(call, ToolCallState.VALIDATING, arguments=call.arguments if call.arguments_error is None else call.raw_arguments,
                    arguments_error=call.arguments_error)
        try:
            prepared = self.registry.prepare(call)
        except OpenAgentsError as err:
            return self._finish(call, ToolResult.failure(err, executor=Executor.OPENAGENTS))
        self._state(call, ToolCallState.AWAITING_APPROVAL, kind=prepared.kind, action=prepared.action)
        outcome = self.gate.decide(prepared)
        self._actions[call.id] = prepared.action
        self.transcript.emit(ev.ApprovalDecided(executor=outcome.executor, call_id=call.id, tool=call.name, action=prepared.action,
                                                level=outcome.level.value, decision=outcome.decision, reason=outcome.reason))
        if not outcome.allowed:
            kind = ErrorType.REJECTED_BY_USER if outcome.executor == Executor.USER else ErrorType.REFUSED_BY_POLICY
            refusal = OpenAgentsError(kind, f"{prepared.action} was not approved: {outcome.reason}")
            return self._finish(call, ToolResult.failure(refusal, executor=outcome.executor))
        self._state(call, ToolCallState.SCHEDULED)
        return prepared

    def _execute_batch(self, batch: list[tuple[int, PreparedCall]], results: list[ToolResult | None]) -> None:
        if len(batch) == 1:
            results[batch[0][0]] = self._execute(batch[0][1])
            return
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_READS, len(batch))) as pool:
            for (i, _), result in zip(batch, pool.map(lambda item: self._execute(item[1]), batch), strict=True):
                results[i] = result

    def _execute(self, prepared: PreparedCall) -> ToolResult:
        call = prepared.call
        if self.cancel.is_set():
            err = OpenAgentsError(ErrorType.CANCELLED, "the session was cancelled before this call ran")
            return self._finish(call, ToolResult.failure(err, executor=Executor.USER), state=ToolCallState.CANCELLED)
        self._state(call, ToolCallState.EXECUTING)

        def streamed(text: str) -> None:
            self.transcript.notify(ev.ToolOutputStreamed(executor=Executor.RUNTIME, call_id=call.id, tool=call.name, text=text))

        result = self.registry.invoke(prepared, on_output=streamed if self.transcript.on_event is not None else None)
        if self._out_of_time.is_set():  # --max-wall passed while it ran: its processes were killed
            err = OpenAgentsError(ErrorType.BUDGET_EXCEEDED, "the time budget (--max-wall) ran out while this call ran; its processes were killed")
            cut = ToolResult.failure(err, executor=Executor.OPENAGENTS, output=result.output, meta=result.meta)
            return self._finish(call, cut, state=ToolCallState.CANCELLED)
        if self.cancel.is_set():  # cancelled while it ran: its processes were killed
            err = OpenAgentsError(ErrorType.CANCELLED, "the session was cancelled while this call ran; its processes were killed")
            cancelled = ToolResult.failure(err, executor=Executor.USER, output=result.output, meta=result.meta)
            return self._finish(call, cancelled, state=ToolCallState.CANCELLED)
        return self._finish(call, result)

    def _offer_widening(self, call: ToolCall, event: ev.EgressRecorded) -> str:
        """A request the gate refused because no rule matched: the person may allow it once or for
        the session (the gate's rules change live, this session only). A tunnel the gate did not
        open is offered as its whole host and port (the gate cannot see its paths); otherwise
        the method and the exact path. Nothing is offered for an explicit deny, a cut field, a
        session without a person, or a sandbox without a gate."""
        widen = getattr(self.registry.sandbox, "widen_egress", None)
        if not callable(widen) or not event.host or event.port is None or "…[cut" in event.host + (event.path or ""):
            return ""
        whole_host = event.tls == "tunnel" or event.method == "CONNECT" or not event.path
        path = None if whole_host else re.sub(r"([*?\[])", r"[\1]", event.path or "/")  # the exact path, not a glob
        try:
            rule = EgressRule(action="allow", host=event.host, port=event.port, methods=None if whole_host else [event.method or "GET"], path=path)
        except ValueError:
            return ""
        what = f"{event.host}:{event.port}" if whole_host else f"{event.method} {event.host}:{event.port}{event.path}"
        outcome = self.gate.widen_egress(call.id, what, {"method": event.method, "host": event.host, "port": event.port, "path": event.path})
        if outcome.allowed and not widen(rule, outcome.decision == "allow_once"):
            outcome = outcome.model_copy(update={"allowed": False, "decision": "refused", "reason": "the egress gate could not take the rule"})
        if outcome.decision != "refused" or getattr(self.gate.approver, "asks_egress", False):
            self.transcript.emit(ev.ApprovalDecided(executor=outcome.executor, call_id=call.id, tool="egress", action=f"egress {what}",
                                                    level=outcome.level.value, decision=outcome.decision, reason=outcome.reason))
        if not outcome.allowed:
            return ""
        how = "for this session" if outcome.decision == "approved_for_session" else "for one request"
        return f"the user allowed egress to {what} {how}: the refused request may be tried again"

    def _state(self, call: ToolCall, state: ToolCallState, **fields: Any) -> None:
        self.transcript.emit(ev.ToolCallChanged(call_id=call.id, tool=call.name, state=state, **fields))

    def _finish(self, call: ToolCall, result: ToolResult, state: ToolCallState | None = None) -> ToolResult:
        state = state or (ToolCallState.SUCCESS if result.ok else ToolCallState.ERROR)
        self._book(call, result, state)
        for record in result.meta.get("egress", []):
            event = ev.EgressRecorded.of(call.id, record)
            self.transcript.emit(event)
            with self._books:
                if len(self.egress) < MAX_EGRESS_SUMMARY:
                    self.egress.append(event.fields())
                else:
                    self.egress_omitted += 1
            if event.decision == "deny" and event.rule == "default deny":
                widened = self._offer_widening(call, event)
                if widened:  # the model learns it may try again
                    result = result.model_copy(update={"note": (result.note + "\n" if result.note else "") + widened})
        self._state(call, state)
        self.transcript.emit(ev.ToolCallFinished(executor=result.executor, call_id=call.id, tool=call.name, state=state, ok=result.ok,
                                                 output=result.output[:RESULT_PREVIEW_CHARS], note=result.note,
                                                 error=result.error.model_dump(mode="json") if result.error else None,
                                                 meta={k: v for k, v in result.meta.items() if k not in ("diff", "egress")},
                                                 diff=result.meta.get("diff")))
        return result


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
        with self._books:
            self.calls[outcome] += 1
            if outcome in ("refused", "failed"):
                reason = result.error.message if result.error else f"exit code {exit_code}"
                record = CallOutcome(call_id=call.id, tool=call.name, action=self._actions.get(call.id, call.name), outcome=outcome,
                                     reason=reason[:500], executor=result.executor, error_type=error_type.value if error_type else None,
                                     exit_code=exit_code)
                (self.refused_calls if outcome == "refused" else self.failed_calls).append(record)


def _tool_name(declaration: dict[str, Any]) -> str:
    name: str = declaration.get("function", declaration).get("name", "?")
    return name


def _signature(call: ToolCall) -> str:
    args = call.arguments if call.arguments_error is None else call.raw_arguments
    try:
        return call.name + ":" + json.dumps(args, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return call.name + ":" + repr(args)
