"""A batch task with `attempts: N` and `pick: COMMAND`: best-of-N, `run --attempts`'s (api/attempts.py).

The task's workspace is copied once, forked N ways, and the task runs in every fork (on this
node: under `--engine ray` one Ray task holds all N), each scored by COMMAND in its own box; the
best is kept (ties: fewest changed lines), the others discarded. The result line is the chosen
attempt's (its session_id, patch, files), with `best_of` listing every attempt's score and which
was chosen. When none passes, none is chosen and all are kept: the task is `stopped`, exit 1.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..api.attempts import check_attempts, finish, launch, start_forks
from ..errors import ErrorType, OpenAgentsError
from .changes import with_changes
from .tasks import TaskError, TaskResult

if TYPE_CHECKING:
    from ..api import SandboxOptions


def run_best_of(
    task_id: str,
    text: str,
    workspace: Path,
    options: SandboxOptions,
    attempts: int,
    pick: str | None,
    pick_timeout: int,
    cancel: threading.Event,
) -> TaskResult:
    """The task's best-of-N to its end; typed errors for bad input (attempts without pick, N out of range).
    `cancel`: the engine's (its RunControl's), set to end every attempt."""
    check_attempts(attempts, pick)
    assert pick is not None
    forks = start_forks(options, workspace, attempts)
    out = launch(options, forks, text, pick, pick_timeout)
    done = threading.Event()

    def relay() -> None:  # the engine's cancel (Ctrl-C, a cancelled Ray task) reaches every attempt
        while not done.wait(0.2):
            if cancel.is_set():
                out.live.cancel()
                return

    watcher = threading.Thread(target=relay, name="oa-best-of-cancel", daemon=True)
    watcher.start()
    try:
        finish(out)
    finally:
        done.set()
        watcher.join()
    listed = {
        "pick": pick,
        "chosen": out.chosen.session_id if out.chosen else None,
        "attempts": [asdict(a) for a in out.attempts],
    }
    if out.cancelled:
        err = OpenAgentsError(ErrorType.CANCELLED, f"the batch was cancelled: all {attempts} attempts kept")
        return TaskResult.failed(task_id, "cancelled", err, exit_code=130, best_of=listed)
    chosen = out.chosen
    if chosen is None:
        return TaskResult(
            id=task_id,
            status="stopped",
            exit_code=1,
            best_of=listed,
            reason=f"no attempt passed the pick command: none chosen, all {attempts} kept",
            turns=max(a.turns for a in out.attempts),
        )
    result = TaskResult(
        id=task_id,
        status="finished",
        exit_code=0,
        session_id=chosen.session_id,
        best_of=listed,
        turns=chosen.turns,
        reason=f"attempt {chosen.number} of {attempts} chosen (score {chosen.score:g})",
        error=TaskError(**chosen.error) if chosen.error else None,
    )
    return with_changes(result, out.record_of(chosen))
