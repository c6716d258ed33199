"""Whose command the box runs, so a cancel ends its own call and nothing else (issue 46).

The box runs several commands at once (at most the agent's SHELL_MAX_CONCURRENT, RESOURCE_EXHAUSTED
beyond), each in a process group of its own. So a sandbox puts `BoxTurns` between its session's
tool registry and the box: every command (BoxRule.exclusive: the shell's), whoever makes it (the
program's own, a model's in run(), a front-end's through `parts.pipeline`), is given a key here that
names it to the agent, and the key of a token's call (`CallToken`: the async API's per-call handle)
is known while it runs. `cancel(token)` then:
- a call not yet at the box is never sent: it ends CANCELLED;
- a running call has its command killed by the box's agent (its process group: what it started
  outside it goes with the sweep after the box's last running command; from outside, every process
  in the box, if the agent does not answer), and ends CANCELLED with its output;
- any other call, and the background processes, are left alone.

The box's environment names the agent's shell would drop (a secret-looking name the program passed
explicitly: `env=`) are exported to each command here as well (`exports`), below the pipeline: the
policy and the transcript see the command as it was given, and the values never enter the
transcript (the session's redactor holds them too).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any, Callable, Iterator

from ..errors import ErrorType, OpenAgentsError
from ..protocol import BoxCall, Executor, ToolResult
from ..tools.defs import shell as shell_def
from ..tools.registry import Box

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

    def __init__(
        self,
        inner: Box,
        current: threading.local,
        exports: str = "",
        session_cancel: Callable[[], threading.Event] | None = None,
    ) -> None:
        self.inner = inner
        self._current = current  # the calling thread's token (calling_as), shared with the sandbox
        self._exports = exports
        self._session_cancel = (
            session_cancel  # the pipeline's event: a run left early (kill_all) sends no command after it is set
        )
        self._turn = threading.Lock()
        self._running: dict[CallToken, str] = {}  # a running call's token -> its command's key in the box
        self._keys: set[str] = set()  # the key of every command sent or being sent

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
        return self.run(BoxCall.named(tool, args), on_output)

    def run(self, call: BoxCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        token: CallToken | None = getattr(self._current, "token", None)
        args = call.args
        if self._exports and call.tool in (shell_def.TOOL.name, "proc_start") and isinstance(args.get("command"), str):
            args = {**args, "command": self._exports + args["command"]}
        if not call.rule.exclusive:
            if token is not None and token.cancelled.is_set():
                return cancelled_result("before it ran")
            return self.inner.run(BoxCall(call.tool, args, call.rule), on_output)
        key = uuid.uuid4().hex
        with self._turn:
            if token is not None and token.cancelled.is_set():
                return cancelled_result("before it ran (nothing was sent)")
            if token is not None:
                self._running[token] = key
            self._keys.add(key)
        try:
            if (
                self._session_cancel is not None and self._session_cancel().is_set()
            ):  # after the key is known: kill_all sees one or the other
                return cancelled_result("before it ran (nothing was sent)")
            result = self.inner.run(BoxCall(call.tool, {**args, "key": key}, call.rule), on_output)
        finally:
            with self._turn:
                self._keys.discard(key)
                if token is not None:
                    self._running.pop(token, None)
        if token is not None and token.cancelled.is_set():
            return cancelled_result("while it ran: its processes were killed", result)
        return result

    def cancel(self, token: CallToken) -> None:
        """End `token`'s call: never sent if it has not reached the box, killed if it runs (the box's
        agent kills that command's process group and leaves the other commands and the background
        processes; the host kills every process in the box from outside when the agent does not answer
        within SWEEP_WAIT_S)."""
        with self._turn:
            token.cancelled.set()
            key = self._running.get(token)
        if key is not None:
            self._kill_command(key)

    def kill_all(self) -> None:
        """Kill every command sent or being sent (one the agent has not started yet never starts:
        its key is doomed), then every process in the box from outside (kill_running, a run left
        early, after the session's cancel was set)."""
        with self._turn:
            keys = list(self._keys)
        if keys:
            self._kill_command(*keys, outside=False)
        self.inner.kill_processes()

    def _kill_command(self, *keys: str, outside: bool = True) -> None:
        swept: list[bool] = []

        def ask() -> None:
            for key in keys:
                result = self.inner.run(BoxCall("proc_sweep", {"key": key}))
                swept.append(result.ok and result.meta.get("swept") is True)

        helper = threading.Thread(target=ask, name="oa-cancel-sweep", daemon=True)
        helper.start()
        helper.join(SWEEP_WAIT_S)
        if outside and (len(swept) < len(keys) or not all(swept)):
            self.inner.kill_processes()
