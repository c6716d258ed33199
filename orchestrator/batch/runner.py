"""One batch task, one session: the code both engines run (local threads and Ray tasks alike).

The task's workspace is never the box's: the session always runs in copy mode (sessions.prepare
takes the copy in the session's state directory before any box exists), and at the end the result
line says what it changed (batch/changes.py: the patch `oa-sandbox apply ID` would land). The
copy stays, so `oa-sandbox apply ID` still works after the batch. A task with `attempts`/`pick`
is a best-of-N (batch/best_of.py).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from ..api import SandboxOptions
from ..api.attempts import MAX_ATTEMPTS, PICK_TIMEOUT_S
from ..config import SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from .tasks import BatchTask, TaskError, TaskResult

if TYPE_CHECKING:
    from ..api import Sandbox


def _batch_options() -> SandboxOptions:
    return SandboxOptions(mode="copy", git=False)


class BatchSettings(BaseModel):
    """What every task gets unless its line says otherwise (the batch command's options): a session's
    options (SandboxOptions, the one options type; copy mode, no host git tool, nobody to ask) and
    best-of-N's. A task's line overrides its model, policy, max_turns, max_wall and runtime."""

    model_config = ConfigDict(extra="forbid")

    options: SandboxOptions = Field(default_factory=_batch_options)
    attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS)  # best-of-N for tasks without `attempts` (with `pick`)
    pick: str | None = Field(default=None, min_length=1)
    pick_timeout: int = Field(default=PICK_TIMEOUT_S, ge=1)

    def task_options(self, task: BatchTask) -> SandboxOptions:
        """The options of `task`'s session: these, with its line's own values over them (validated
        as any SandboxOptions; a bad one is a ValueError)."""
        base = self.options
        config = base.config or SandboxConfig()
        if task.runtime is not None:
            config = config.with_backend(runtime=task.runtime)
        given = {name: getattr(base, name) for name in base.model_fields_set}
        line = dict(
            config=config,
            mode="copy",
            git=False,
            model=task.model or base.model,
            policy_files=[Path(p) for p in task.policy] if task.policy is not None else base.policy_files,
            max_turns=task.max_turns or base.max_turns,
            max_wall_s=task.max_wall or base.max_wall_s,
        )
        return SandboxOptions(**{**given, **line})


class RunControl:
    """The engine's hold on one running task: `stop()` cancels its session (the running call is
    killed, the loop ends `cancelled`, the box is removed by the session's own close)."""

    def __init__(self, cancel: threading.Event | None = None) -> None:
        self.cancel = cancel or threading.Event()
        self._lock = threading.Lock()
        self._box: Sandbox | None = None
        self.running = False

    def attach(self, box: Sandbox | None) -> None:
        with self._lock:
            self._box = box

    def stop(self) -> None:
        self.cancel.set()
        with self._lock:
            box = self._box
        if box is not None:
            try:
                box.cancel()
                box.kill_running()
            except Exception:  # noqa: BLE001 - the box may be going already (closed); its close removes it
                pass


def this_node() -> str:
    return socket.gethostname()


def run_task(
    task: BatchTask, settings: BatchSettings, control: RunControl | None = None, node: str | None = None
) -> TaskResult:
    """Run one task to its end and say how it went; never raises for the task's own failures (a
    set-up error, a bug of ours: a typed result). KeyboardInterrupt while it runs ends it cancelled."""
    control = control or RunControl()
    began = time.monotonic()
    where = node or this_node()
    control.running = True
    try:
        result = _run(task, settings, control)
    except OpenAgentsError as err:
        result = TaskResult.failed(task.id, "error", err, exit_code=2)
    except KeyboardInterrupt:
        result = TaskResult.failed(
            task.id,
            "cancelled",
            OpenAgentsError(ErrorType.CANCELLED, "interrupted while the sandbox started"),
            exit_code=130,
        )
    except Exception as err:  # noqa: BLE001 - a bug of ours ends this task, typed, not the batch
        result = TaskResult.failed(
            task.id,
            "error",
            OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(err).__name__}: {str(err)[:500]}"),
            exit_code=2,
        )
    finally:
        control.running = False
    result.wall_s = round(time.monotonic() - began, 3)
    result.node = where
    return result


def _run(task: BatchTask, settings: BatchSettings, control: RunControl) -> TaskResult:
    from ..api import Sandbox
    from ..loop import SessionResult, SessionStatus
    from ..loop.summary import exit_code

    if control.cancel.is_set():
        raise KeyboardInterrupt
    if not (task.model or settings.options.model):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, "no model: the task line has no `model`, and the batch no --model"
        )
    try:  # nobody to ask (non-interactive); copy mode: the host git tool is off anyway
        options = settings.task_options(task)
        attempts, pick = task.attempts or settings.attempts, task.pick if task.pick is not None else settings.pick
        if attempts > 1 or pick is not None:  # best-of-N (batch/best_of.py)
            from .best_of import run_best_of

            return run_best_of(
                task.id, task.task, Path(task.workspace), options, attempts, pick, settings.pick_timeout, control.cancel
            )
        box = Sandbox(Path(task.workspace), options, kind="batch").open()
    except ValueError as err:  # a model spec or policy the session refuses
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, str(err)[:500]) from None
    outcome: SessionResult | None = None
    try:
        control.attach(box)
        if control.cancel.is_set():
            outcome = SessionResult(status=SessionStatus.CANCELLED, reason="the batch was cancelled")
        else:
            try:
                outcome = box.run_turns(task.task)
            except KeyboardInterrupt:
                outcome = SessionResult(status=SessionStatus.CANCELLED, reason="interrupted (Ctrl-C)")
    finally:
        control.attach(None)
        box.close(
            **({"status": outcome.status.value, "reason": outcome.reason} if outcome is not None else {})
        )  # box removed, copy swept, record saved
    record = box.record
    result = TaskResult(
        id=task.id,
        status=outcome.status.value,
        exit_code=exit_code(outcome),
        session_id=record.id,
        reason=outcome.reason,
        tokens=dict(outcome.tokens),
        turns=outcome.turns,
        error=TaskError(type=outcome.error.type.value, message=outcome.error.message) if outcome.error else None,
    )
    from .changes import with_changes

    return with_changes(result, record)
