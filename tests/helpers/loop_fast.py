"""What tests/unit/test_loop_fast.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from orchestrator import events as ev
from orchestrator.config import SandboxLimits
from orchestrator.loop import TurnLoop
from orchestrator.models.base import ModelTurn
from orchestrator.models.script import ScriptedModel
from orchestrator.policy.approvals import Answer, ApprovalGate, ApprovalRequest, PermissionOption
from orchestrator.policy.ladder import Ladder
from orchestrator.protocol import BoxCall, Executor, ToolResult
from orchestrator.tools.registry import ToolRegistry
from orchestrator.transcript import Transcript

if TYPE_CHECKING:
    from orchestrator.sandbox.starts import StartQueued
    from orchestrator.workspace.integrity import Sweeper, SweepReport


class FakeSandbox:
    """Answers each call from a table; records what ran, when, and on which thread."""

    # The rest of the Box protocol: always up, never restarted; it has no workspace, so no sweeper.
    restarts = 0
    sweeper: Sweeper
    on_sweep: Callable[[SweepReport], None] | None = None
    on_start_queue: Callable[[StartQueued], None] | None = None
    config = SandboxLimits()
    started = True
    gvisor = False

    def __init__(self, delay: float = 0.0, results: dict[str, ToolResult] | None = None) -> None:
        self.delay = delay
        self.results = results or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.running = 0
        self.max_running = 0
        self.killed = 0
        self._lock = threading.Lock()
        self.release = threading.Event()
        self.block_on: str | None = None

    def start(self) -> None: ...

    def close(self) -> None: ...

    def kill_processes(self) -> None:
        self.killed += 1
        self.release.set()

    def run(self, call: BoxCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """A call as the registry sends it (its rule with it), taken here by name."""
        if on_output is None:
            return self.call(call.tool, call.args)
        return self.call(call.tool, call.args, on_output)

    def call(self, tool: str, args: dict[str, Any], on_output: Callable[[str], None] | None = None) -> ToolResult:
        with self._lock:
            self.calls.append((tool, args))
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if self.block_on and args.get("command") == self.block_on:
                self.release.wait(10)
            time.sleep(self.delay)
            return self.results.get(tool) or ToolResult(
                ok=True, output=f"{tool} {args.get('path') or args.get('command')}"
            )
        finally:
            with self._lock:
                self.running -= 1


class RecordingApprover:
    def __init__(self, answer: PermissionOption = PermissionOption.ALLOW_ONCE, on_ask=None) -> None:
        self.asked: list[str] = []
        self.answer = answer
        self.on_ask = on_ask

    def ask(self, request: ApprovalRequest) -> Answer:
        self.asked.append(request.call_id)
        if self.on_ask:
            self.on_ask(request)
        return Answer(option=self.answer, executor=Executor.USER, reason="test")


def session(
    tmp_path: Path, turns: list[ModelTurn], sandbox: FakeSandbox | None = None, approver=None, **kw
) -> tuple[TurnLoop, FakeSandbox, Transcript]:
    box = sandbox or FakeSandbox()
    transcript = Transcript(tmp_path / "t.jsonl")
    registry = ToolRegistry(box, tmp_path)
    gate = ApprovalGate(Ladder(), approver or RecordingApprover())
    return TurnLoop(ScriptedModel(turns), registry, gate, transcript, **kw), box, transcript


def typed(transcript: Transcript) -> list:
    return [e for e in map(ev.parse, transcript.events) if e is not None]
