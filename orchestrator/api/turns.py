"""Whose command the box runs, so a cancel ends its own call and nothing else (issue 46).

The box runs one command (an exclusive call: BoxRule.exclusive, the shell's) at a time, and
killing what it runs kills every process in it. So a sandbox puts `BoxTurns` between its session's
tool registry and the box: every exclusive call, whoever makes it (the program's own, a model's in
run(), a front-end's through `parts.pipeline`), takes the box's turn here, and the call of a token
(`CallToken`: the async API's per-call handle) is known while it holds it. `cancel(token)` then:
- a call still waiting for its turn (or not yet at the box) is never sent: it ends CANCELLED;
- the call holding the turn has its command killed (by the box's agent: every process but the
  agent and the background processes' keeper; from outside, every process, if the agent does not
  answer), and ends CANCELLED with its output;
- any other call, running or waiting, is left alone.

The box's environment names the agent's shell would drop (a secret-looking name the program passed
explicitly: `env=`) are exported to each command here as well (`exports`), below the pipeline: the
policy and the transcript see the command as it was given, and the values never enter the
transcript (the session's redactor holds them too).
"""
from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..errors import ErrorType, OpenAgentsError
from ..protocol import Executor, ToolResult
from ..tools.catalog import box_rule
from ..tools.defs import shell as shell_def

if TYPE_CHECKING:
    from ..sandbox.base import Sandbox as BoxBackend


SWEEP_WAIT_S = 3.0  # a cancel waits this long for the agent's own sweep, then kills from outside


class CallToken:
    """One call's handle for cancelling it (set from another thread)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()


def cancelled_result(when: str, result: ToolResult | None = None) -> ToolResult:
    err = OpenAgentsError(ErrorType.CANCELLED, f"the call was cancelled {when}")
    if result is None:
        return ToolResult.failure(err, executor=Executor.USER)
    return ToolResult.failure(err, executor=Executor.USER, output=result.output, meta=result.meta, egress=result.egress)


class BoxTurns:
    """The session's box as its tool registry sees it (every other attribute is the box's own)."""

    def __init__(self, inner: BoxBackend, current: threading.local, exports: str = "") -> None:
        self.inner = inner
        self._current = current  # the calling thread's token (calling_as), shared with the sandbox
        self._exports = exports
        self._turn = threading.Condition()
        self._busy = False
        self._running: CallToken | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @staticmethod
    @contextlib.contextmanager
    def calling_as(current: threading.local, token: CallToken) -> Iterator[None]:
        """The calls this thread makes inside the block are `token`'s."""
        before = getattr(current, "token", None)
        current.token = token
        try:
            yield
        finally:
            current.token = before

    def call(self, tool: str, args: dict[str, Any], on_output: Callable[[str], None] | None = None) -> ToolResult:
        token: CallToken | None = getattr(self._current, "token", None)
        if self._exports and tool in (shell_def.TOOL.name, "proc_start") and isinstance(args.get("command"), str):
            args = {**args, "command": self._exports + args["command"]}
        if not box_rule(tool).exclusive:
            if token is not None and token.cancelled.is_set():
                return cancelled_result("before it ran")
            return self.inner.call(tool, args, on_output)
        with self._turn:
            while self._busy and not (token is not None and token.cancelled.is_set()):
                self._turn.wait()
            if token is not None and token.cancelled.is_set():
                return cancelled_result("before it ran: it was still waiting for the box (nothing was sent)")
            self._busy, self._running = True, token
        try:
            result = self.inner.call(tool, args, on_output)
        finally:
            with self._turn:
                self._busy, self._running = False, None
                self._turn.notify_all()
        if token is not None and token.cancelled.is_set():
            return cancelled_result("while it ran: its processes were killed", result)
        return result

    def cancel(self, token: CallToken) -> None:
        """End `token`'s call: never sent if it has not reached the box, killed if it holds the box's turn
        (the box's agent kills the command and leaves the background processes; the host kills every
        process in the box from outside when the agent does not answer within SWEEP_WAIT_S)."""
        token.cancelled.set()
        with self._turn:
            if self._running is token:
                self._kill_command()
            self._turn.notify_all()

    def _kill_command(self) -> None:
        swept: list[bool] = []

        def ask() -> None:
            result = self.inner.call("proc_sweep", {})
            swept.append(result.ok and result.meta.get("swept") is True)

        helper = threading.Thread(target=ask, name="oa-cancel-sweep", daemon=True)
        helper.start()
        helper.join(SWEEP_WAIT_S)
        if not swept or not swept[0]:
            self.inner.kill_processes()
