"""The turn loop and the tool-call scheduler.

Each call's steps (validate, decide, execute, record) are the CallPipeline's (pipeline.py); the
loop asks the model, schedules a turn's calls (read-only calls of one turn run in parallel) and
decides when the session ends: a final answer, max turns, a detected loop, a fatal error, a
budget, or Ctrl-C. Its run summary (what a person and a script read at the end) is summary.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Callable

from pydantic import BaseModel

from .. import events as ev
from ..budget import Budget, compact, default_context_window, estimate_tokens, usage_tokens
from ..config import DEFAULT_MAX_TURNS
from ..errors import ErrorType, OpenAgentsError
from ..hooks import turns as hook_points
from ..models.base import Message, ModelClient, ToolCall
from ..pipeline import CallOutcome, CallPipeline
from ..policy.approvals import ApprovalGate
from ..protocol import ErrorInfo, Executor, ToolResult
from ..tools.registry import PreparedCall, ToolRegistry
from ..transcript import Transcript
from ..workspace.context_files import ContextFiles

SYSTEM_PROMPT = """You are a coding agent working on a repository mounted at /workspace inside a sandbox.
Use the tools to read, search, edit and test the code. Paths are relative to the workspace root.
{network} Commands run with /bin/sh -c and no standard input.
Read a file before you edit it, and pass the sha256 it showed as expected_sha256.
When the task is done, answer with a short summary and no tool call."""

MAX_PARALLEL_READS = 4


class SessionStatus(str, Enum):
    FINISHED = "finished"
    STOPPED = "stopped"
    CANCELLED = "cancelled"


class SessionResult(BaseModel):
    status: SessionStatus
    reason: str
    final_text: str = ""
    turns: int = 0  # of this run
    last_turn: int = (
        0  # the number of its last turn: turns count on across the runs of one session (resume, ACP prompts)
    )
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


class TurnLoop:
    def __init__(
        self,
        model: ModelClient,
        registry: ToolRegistry,
        gate: ApprovalGate,
        transcript: Transcript,
        max_turns: int = DEFAULT_MAX_TURNS,
        loop_limit: int = 5,
        cancel: threading.Event | None = None,
        after_turn: Callable[[int, list[str]], None] | None = None,
        session_id: str = "",
        workspace_mode: str = "",
        budget: Budget | None = None,
        pipeline: CallPipeline | None = None,
    ) -> None:
        """`after_turn(turn, tool names)` runs once a turn's calls are done (the session's checkpoint).
        `pipeline`: the session's call pipeline, when its opener made one (else one over these parts)."""
        self.model = model
        self.registry = registry
        self.gate = gate
        self.transcript = transcript
        self.max_turns = max_turns
        self.loop_limit = loop_limit
        self.pipeline = pipeline or CallPipeline(registry, gate, transcript, cancel)
        if cancel is not None:
            self.pipeline.cancel = cancel
        self.cancel = self.pipeline.cancel
        self.messages: list[Message] = [
            Message(role="system", content=SYSTEM_PROMPT.format(network=registry.network_sentence()))
        ]
        self._recent: deque[str] = deque(maxlen=loop_limit)
        self.after_turn = after_turn
        self.session_id = session_id
        self.workspace_mode = workspace_mode
        self.budget = budget or Budget()
        self.context_window = self.budget.context_window or default_context_window(model.family, model.name)
        self.tokens = {"input": 0, "output": 0}
        self._started = time.monotonic()
        self.turn = 0  # the last turn's number: a resumed session starts from its previous turns
        self._run_start = 0
        self.context_files: ContextFiles | None = (
            None  # AGENTS.md files (context_files.py); the root's is in the prompt already
        )

    @property
    def calls(self) -> dict[str, int]:
        return self.pipeline.calls

    @property
    def refused_calls(self) -> list[CallOutcome]:
        return self.pipeline.refused_calls

    @property
    def failed_calls(self) -> list[CallOutcome]:
        return self.pipeline.failed_calls

    # -- the loop --------------------------------------------------------------------------
    def run(self, task: str) -> SessionResult:
        self.transcript.emit(
            ev.SessionStarted(
                task=task,
                model=self.model.name,
                family=self.model.family,
                session_id=self.session_id,
                workspace=str(self.registry.workspace),
                workspace_mode=self.workspace_mode,
                tools=self.registry.active(),
                runtime=self.registry.runtime_name(),
            )
        )
        self.messages.append(Message(role="user", content=task))
        self._started = time.monotonic()
        try:
            self.messages[-1].content += hook_points.before_agent(self.pipeline.hooks, task)
        except OpenAgentsError as err:
            return self._end(SessionStatus.STOPPED, err.message, self.turn, error=err)
        wall_timer = None
        if self.budget.max_wall_s is not None:  # a call still running when the time is up is killed, not waited for
            wall_timer = threading.Timer(self.budget.max_wall_s, self._wall_spent)
            wall_timer.daemon = True
            wall_timer.start()
        try:
            result = self._run_turns()
            hook_points.after_agent(self.pipeline.hooks, task, result.status.value, result.final_text)
            return result
        finally:
            if wall_timer is not None:
                wall_timer.cancel()

    def _text_sink(self, turn: int) -> Callable[[str], None] | None:
        """Streamed text for whoever watches live (never the transcript: model_response has it whole)."""
        if self.transcript.on_event is None:
            return None
        return lambda text: self.transcript.notify(ev.ModelTextStreamed(turn=turn, text=text))

    def _wall_spent(self) -> None:
        self.pipeline.out_of_time.set()  # --max-wall passed: set by a timer while a call may run
        self._stop_host_calls()
        self.registry.kill_running()

    def _stop_host_calls(self) -> None:
        """A host-side call (an MCP server's) waiting on its server returns now; the server is killed."""
        stop = getattr(self.registry.host_tools, "kill_running", None)
        if stop is not None:
            stop()

    def _run_turns(self) -> SessionResult:
        turn = self._run_start = self.turn
        try:
            while True:
                if self.cancel.is_set():
                    return self._end(SessionStatus.CANCELLED, "cancelled", turn, executor=Executor.USER)
                if turn - self._run_start >= self.max_turns:
                    err = OpenAgentsError(ErrorType.MAX_TURNS, f"stopped after {self.max_turns} turns")
                    return self._end(SessionStatus.STOPPED, err.message, turn, error=err)
                spent = self._over_budget()
                if spent:
                    return self._end(SessionStatus.STOPPED, spent.message, turn, error=spent)
                turn += 1
                self.turn = turn
                self._compact(turn)
                tools = hook_points.select_tools(
                    self.pipeline.hooks, self.registry.declarations(self.model.family), _tool_name
                )
                hook_points.before_model(self.pipeline.hooks, self.messages, turn, self.model.name)
                context_tokens = estimate_tokens(self.messages)
                self.transcript.emit(
                    ev.ModelRequested(
                        turn=turn,
                        messages=len(self.messages),
                        tools=[_tool_name(t) for t in tools],
                        context_tokens=context_tokens,
                    )
                )
                try:
                    reply = self.model.complete(self.messages, tools, on_text=self._text_sink(turn))
                except OpenAgentsError as err:
                    return self._end(SessionStatus.STOPPED, f"the model API failed: {err.message}", turn, error=err)
                spent_in, spent_out = usage_tokens(reply.usage)
                self.tokens["input"] += spent_in
                self.tokens["output"] += spent_out
                self.transcript.emit(
                    ev.ModelResponded(
                        turn=turn,
                        text=reply.text,
                        tool_calls=[c.model_dump(exclude_none=True) for c in reply.tool_calls],
                        usage=reply.usage,
                    )
                )
                self.transcript.notify(
                    ev.BudgetSpent(
                        turn=turn,
                        tokens=dict(self.tokens),
                        max_tokens=self.budget.max_tokens,
                        wall_s=round(time.monotonic() - self._started, 3),
                        max_wall_s=self.budget.max_wall_s,
                        context_tokens=context_tokens,
                        context_window=self.context_window,
                    )
                )
                hook_points.after_model(
                    self.pipeline.hooks, reply.text, [c.model_dump(exclude_none=True) for c in reply.tool_calls], turn
                )
                self.messages.append(Message(role="assistant", content=reply.text, tool_calls=reply.tool_calls))
                if not reply.tool_calls:
                    return self._end(
                        SessionStatus.FINISHED,
                        "the model gave its final answer",
                        turn,
                        final_text=reply.text,
                        executor=Executor.OPENAGENTS,
                    )
                spent = self._over_budget()
                if spent:  # the calls of a reply past the budget do not run
                    return self._end(SessionStatus.STOPPED, spent.message, turn, error=spent)
                looping = self._note_calls(reply.tool_calls)
                results = self._run_calls(reply.tool_calls)
                for call, result in zip(reply.tool_calls, results, strict=True):
                    self.messages.append(
                        Message(role="tool", tool_call_id=call.id, name=call.name, content=result.for_model())
                    )
                if self.context_files is not None:  # AGENTS.md of the directories this turn worked in, each once
                    self.messages[0].content += self.context_files.for_calls(reply.tool_calls)
                if self.after_turn:
                    self.after_turn(turn, [call.name for call in reply.tool_calls])
                fatal = next((r.error for r in results if r.error and not r.error.recoverable), None)
                if fatal:
                    stop = OpenAgentsError(fatal.type, fatal.message)
                    return self._end(
                        SessionStatus.STOPPED, f"a fatal error: {fatal.type.value}: {fatal.message}", turn, error=stop
                    )
                if self.pipeline.stop_reason:
                    raise OpenAgentsError(
                        ErrorType.HOOK_STOPPED, f"a hook stopped the session: {self.pipeline.stop_reason}"
                    )
                if looping:
                    stop = OpenAgentsError(
                        ErrorType.LOOP_DETECTED, f"the same call ({looping}) was made {self.loop_limit} times in a row"
                    )
                    return self._end(SessionStatus.STOPPED, stop.message, turn, error=stop)
                if self.cancel.is_set():
                    return self._end(SessionStatus.CANCELLED, "cancelled", turn, executor=Executor.USER)
        except OpenAgentsError as err:  # e.g. the sandbox could not be restarted inside a call
            return self._end(SessionStatus.STOPPED, f"{err.type.value}: {err.message}", turn, error=err)
        except KeyboardInterrupt:
            self.cancel.set()
            self._stop_host_calls()
            self.registry.kill_running()
            return self._end(
                SessionStatus.CANCELLED,
                "interrupted (Ctrl-C); the running call was killed",
                turn,
                executor=Executor.USER,
            )
        except Exception as exc:  # a bug of ours: the transcript still ends, typed, and the error goes on up
            internal = OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            self._end(SessionStatus.STOPPED, f"internal error: {internal.message}", turn, error=internal)
            raise

    def _end(
        self,
        status: SessionStatus,
        reason: str,
        turns: int,
        final_text: str = "",
        error: OpenAgentsError | None = None,
        executor: Executor = Executor.OPENAGENTS,
    ) -> SessionResult:
        """`turns`: the last turn's number; the result and the record count this run's turns."""
        info = ErrorInfo.of(error) if error else None
        wall = round(time.monotonic() - self._started, 3)
        ran = turns - self._run_start
        self.transcript.emit(
            ev.SessionEnded(
                executor=executor,
                status=status.value,
                reason=reason,
                turns=ran,
                last_turn=turns,
                final_text=final_text,
                error=info.model_dump(mode="json") if info else None,
                tokens=dict(self.tokens),
                wall_s=wall,
            )
        )
        with self.pipeline.books:
            return SessionResult(
                status=status,
                reason=reason,
                final_text=final_text,
                turns=ran,
                last_turn=turns,
                error=info,
                calls=dict(self.calls),
                refused_calls=list(self.refused_calls),
                failed_calls=list(self.failed_calls),
                tokens=dict(self.tokens),
                wall_s=wall,
                egress=list(self.pipeline.egress),
                egress_omitted=self.pipeline.egress_omitted,
            )

    # -- budgets ---------------------------------------------------------------------------
    def _over_budget(self) -> OpenAgentsError | None:
        spent = self.tokens["input"] + self.tokens["output"]
        if self.budget.max_tokens is not None and spent >= self.budget.max_tokens:
            return OpenAgentsError(
                ErrorType.BUDGET_EXCEEDED,
                f"the token budget is spent: {spent} of {self.budget.max_tokens} tokens (--max-tokens)",
            )
        elapsed = time.monotonic() - self._started
        if self.budget.max_wall_s is not None and elapsed >= self.budget.max_wall_s:
            return OpenAgentsError(
                ErrorType.BUDGET_EXCEEDED,
                f"the time budget is spent: {elapsed:.0f} s of {self.budget.max_wall_s:g} s (--max-wall)",
            )
        return None

    def _compact(self, turn: int) -> None:
        elided, before, after = compact(self.messages, self.context_window)
        if elided:
            hook_points.pre_compress(self.pipeline.hooks, turn, before, self.context_window)
            self.transcript.emit(
                ev.ContextCompacted(
                    executor=Executor.OPENAGENTS,
                    turn=turn,
                    elided_outputs=elided,
                    tokens_before=before,
                    tokens_after=after,
                    context_window=self.context_window,
                )
            )

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
            prepared = self.pipeline.validate_and_decide(call)
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
                results[item[0]] = self.pipeline.execute(item[1])
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _execute_batch(self, batch: list[tuple[int, PreparedCall]], results: list[ToolResult | None]) -> None:
        if len(batch) == 1:
            results[batch[0][0]] = self.pipeline.execute(batch[0][1])
            return
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_READS, len(batch))) as pool:
            for (i, _), result in zip(batch, pool.map(lambda item: self.pipeline.execute(item[1]), batch), strict=True):
                results[i] = result


def _tool_name(declaration: dict[str, Any]) -> str:
    name: str = declaration.get("function", declaration).get("name", "?")
    return name


def _signature(call: ToolCall) -> str:
    args = call.arguments if call.arguments_error is None else call.raw_arguments
    try:
        return call.name + ":" + json.dumps(args, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return call.name + ":" + repr(args)
