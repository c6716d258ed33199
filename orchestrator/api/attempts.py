"""Best-of-N from one start, the part every front-end shares (`run --attempts`, `batch`'s `attempts`).

A fresh copy session is made of the workspace (the size guard and the copy as `run` makes them),
forked N ways (workspace/fork.py), and the task runs in each fork, in its own box (a Sandbox
resuming the fork), at most `attempt_workers()` at once. Each attempt is then scored by COMMAND,
run in that attempt's own box through the shell tool's pipeline (the ladder's policies and the
shell's limits apply: a command that hangs is killed at its timeout and fails): exit 0 is a pass,
scored 1, or the number the command prints on its last line; a non-zero exit, a timeout or a
refusal fails (no score). What the command itself writes (caches, reports) is rolled back through
the attempt's checkpoints, so only the agent's work is carried. The best score is kept (ties:
fewest changed lines, then the first); the others are discarded, and so is the start's copy. When
no attempt passes, none is chosen and all are kept. N is at most MAX_ATTEMPTS (fork.py's MAX_FORKS).
"""

from __future__ import annotations

import math
import os
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..boxfs.private import create_private
from ..errors import ErrorType, OpenAgentsError
from ..tools.defs import shell as shell_def
from ..workspace.fork_limits import MAX_FORKS
from ..workspace.fork_limits import PICK_TIMEOUT_S as PICK_TIMEOUT_S

SHELL = shell_def.TOOL.name  # the pick command runs as a shell call, through the pipeline
MAX_ATTEMPTS = MAX_FORKS  # attempts of one task: each is a fork, a box and a model loop

if TYPE_CHECKING:
    from ..workspace.records import SessionRecord
    from .options import SandboxOptions
    from .sandbox import Sandbox


def attempt_workers(attempts: int) -> int:
    """Attempts run at once: one per core, at most the attempts (each is a box and a model loop)."""
    return max(1, min(attempts, os.cpu_count() or 1))


@dataclass
class Attempt:
    number: int
    session_id: str
    status: str = "error"
    score: float | None = None  # None: failed (non-zero exit, timeout, refused, the attempt's own error)
    pick_exit_code: int | None = None
    changed_lines: int = 0
    error: dict[str, str] | None = None
    pick_error: dict[str, str] | None = (
        None  # why the pick command had no exit code (refused, killed at its timeout, ...)
    )
    discarded: bool = False
    turns: int = 0


@dataclass
class BestOf:
    """The outcome of one best-of-N: every attempt (in order), their forks' records, the chosen one."""

    attempts: list[Attempt]
    forks: list[SessionRecord]
    chosen: Attempt | None = None
    cancelled: bool = False
    live: Live = field(default_factory=lambda: Live())
    futures: list[Future[None]] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None

    def record_of(self, attempt: Attempt) -> SessionRecord:
        """The attempt's fork as it is on disk now (its session has ended)."""
        return fresh(next(f for f in self.forks if f.id == attempt.session_id))


def check_attempts(attempts: object, pick: object) -> None:
    """Both or neither; N within 2..MAX_ATTEMPTS; a command that is not blank. A typed error otherwise."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS:
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"attempts is 1 to {MAX_ATTEMPTS}, not {attempts!r}")
    if pick is not None and (not isinstance(pick, str) or not pick.strip()):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "pick needs a command")
    if (attempts > 1) != (pick is not None):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "attempts N (2 or more) and a pick COMMAND go together")


def parse_score(ok: bool, exit_code: int | None, output: str) -> float | None:
    """Exit 0: the number on the output's last line if there is one, else 1. Anything else: None."""
    if not ok or exit_code != 0:
        return None
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if lines:
        try:
            value = float(lines[-1])
        except ValueError:
            return 1.0
        if math.isfinite(value):
            return value
    return 1.0


def best(attempts: list[Attempt]) -> Attempt | None:
    scored = [a for a in attempts if a.score is not None]
    if not scored:
        return None
    return min(scored, key=lambda a: (-(a.score or 0.0), a.changed_lines, a.number))


def start_forks(options: SandboxOptions, workspace: Path, attempts: int) -> list[SessionRecord]:
    """The start (a fresh copy session of `workspace`, pinned as a first session pins) forked
    `attempts` ways; the start itself is gone after, its forks hold it. Typed set-up errors. The
    start is a `run` session whichever front-end asked: each attempt resumes its fork, and only a
    run's conversation is one to continue."""
    from ..workspace import host_code
    from ..workspace.cleanup import discard_state
    from ..workspace.fork import fork_session
    from ..workspace.records import WorkspaceMode, prepare

    found = host_code.found_in(
        workspace.resolve()
    )  # what the host runs or imports from there: no attempt's apply lands on it
    host_code.guard(workspace.resolve(), WorkspaceMode.COPY, options.sandbox_config(), found=found).raise_refusal()
    start, _ = prepare(
        workspace.resolve(),
        WorkspaceMode.COPY,
        options.sandbox_config().user,
        "run",
        options.copy_limits(),
        host_code=host_code.recorded(found),
    )
    try:
        start.transcript = str(start.dir / "transcript.jsonl")
        fd = create_private(start.transcript)
        os.close(fd)
        start.model_spec, start.base_url, start.api_key_env = options.model, options.base_url, options.api_key_env
        start.policy_files = [str(Path(f).resolve()) for f in options.policy_files]
        _pin_start(start, workspace.resolve(), [str(f) for f in options.policy_files])
        start.status, start.reason, start.host_pid = "finished", f"the start of {attempts} attempts", 0
        start.save()
        return fork_session(start.id, attempts, box_on_copy=lambda path: False)  # the start never had a box
    finally:
        discard_state(start)  # the forks hold the start now


def launch(
    options: SandboxOptions, forks: list[SessionRecord], task: str, pick: str, pick_timeout: int = PICK_TIMEOUT_S
) -> BestOf:
    """Every fork starts running `task` then `pick` (at most attempt_workers() at once); `finish`
    waits, chooses and discards. On Ctrl-C the caller cancels `.live` and calls `finish` again.
    Each attempt's own failure is in its Attempt, never raised."""
    out = BestOf([Attempt(number=i + 1, session_id=f.id) for i, f in enumerate(forks)], forks)
    out.pool = ThreadPoolExecutor(max_workers=attempt_workers(len(forks)), thread_name_prefix="oa-attempt")
    out.futures = [
        out.pool.submit(_one, options, task, pick, pick_timeout, fork, attempt, out.live)
        for fork, attempt in zip(forks, out.attempts, strict=True)
    ]
    return out


def finish(out: BestOf) -> BestOf:
    """Wait for every attempt; then, unless cancelled, choose and discard the others."""
    wait(out.futures)
    if out.pool is not None:
        out.pool.shutdown()
    if out.live.stopped.is_set():
        out.cancelled = True
        return out
    out.chosen = best(out.attempts)
    if out.chosen is None:
        return out
    from ..workspace.copy_session import discard_session

    for attempt, record in zip(out.attempts, out.forks, strict=True):
        if attempt is out.chosen:
            continue
        try:
            discard_session(fresh(record))
            attempt.discarded = True
        except (OpenAgentsError, OSError) as err:
            attempt.error = attempt.error or {
                "type": ErrorType.IO_ERROR.value,
                "message": f"not discarded: {err}"[:300],
            }
    return out


def fresh(record: SessionRecord) -> SessionRecord:
    from ..workspace.copy_session import ended_copy_session

    return ended_copy_session(record.id, "use")


class Live:
    """The attempts' open sandboxes, so Ctrl-C (or a batch's cancel) reaches every one of them."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._boxes: list[Sandbox] = []

    def add(self, box: Sandbox) -> bool:
        with self._lock:
            self._boxes.append(box)
            return not self.stopped.is_set()

    def cancel(self) -> None:
        with self._lock:
            self.stopped.set()
            boxes = list(self._boxes)
        for box in boxes:
            try:
                box.cancel()
                box.kill_running()
            except Exception:  # noqa: BLE001 - closed already, or its box is removed when the attempt closes it
                pass


def _pin_start(start: SessionRecord, workspace: Path, policy_files: list[str]) -> None:
    """What the start trusts (policy files, the workspace's own policy and its hooks, the config
    file), pinned as a first session pins it: each attempt opens its fork as a resume, and a resume
    takes hooks and policies from the pins, never afresh (without them it ran no workspace hook)."""
    from ..hooks.wiring import pinned_argv
    from ..policy import pins
    from ..policy.hook_spec import in_force
    from ..policy.load import authority_sources, load_session_policy

    policy = load_session_policy(workspace, policy_files)
    pins.save(start, authority_sources(policy, workspace, None))
    roots = pins.box_roots(workspace)
    kept, _ = in_force(list(policy.hooks), policy.hooks_trusted, workspace, roots)
    for hook in kept:  # a trusted hook's script in the workspace: its copy as of now is what every attempt runs
        try:
            pinned_argv(hook, workspace, roots, start, False)
        except OpenAgentsError:
            pass  # not pinned: each attempt then says it is not in force, as a session would


def _one(
    options: SandboxOptions, task: str, pick: str, pick_timeout: int, fork: SessionRecord, attempt: Attempt, live: Live
) -> None:
    """One attempt: the task in the fork's own box (a Sandbox resuming the fork), then the pick
    command in that box; never raises."""
    from .sandbox import Sandbox

    spec = options.model or ""
    if spec.startswith("script:"):  # a replay: `{attempt}` in its file name picks one script per attempt (tests, demos)
        spec = spec.replace("{attempt}", str(attempt.number))
    if live.stopped.is_set():
        attempt.status = "cancelled"
        return
    try:  # nobody to ask (a person is at none of N boxes), its own transcript (the fork's), no live view
        box = Sandbox(
            Path(fork.workspace),
            options,
            kind="run",
            model=spec,
            resume=fork.id,
            mode="copy",
            approver=None,
            transcript=None,
            on_record=None,
            on_event=None,
            host_tools=None,
        ).open()
    except OpenAgentsError as err:
        attempt.error = {"type": err.type.value, "message": err.message[:300]}
        return
    except Exception as err:  # noqa: BLE001 - one attempt's failure is its own result
        attempt.error = {"type": ErrorType.INTERNAL_ERROR.value, "message": f"{type(err).__name__}: {err}"[:300]}
        return
    status: dict[str, str] = {}
    try:
        if not live.add(box):
            box.cancel()
        result = box.run_turns(task)
        status = {"status": result.status.value, "reason": result.reason}
        box.record.turns = result.last_turn
        attempt.status, attempt.turns = result.status.value, result.turns
        if not live.stopped.is_set():
            _score(box, pick, pick_timeout, result.last_turn, attempt)
    except OpenAgentsError as err:
        attempt.error = {"type": err.type.value, "message": err.message[:300]}
    except Exception as err:  # noqa: BLE001
        attempt.error = {"type": ErrorType.INTERNAL_ERROR.value, "message": f"{type(err).__name__}: {err}"[:300]}
    finally:
        try:
            box.close(**status)
        except Exception as err:  # noqa: BLE001
            attempt.error = attempt.error or {
                "type": ErrorType.INTERNAL_ERROR.value,
                "message": f"closing: {err}"[:300],
            }
    if attempt.error is not None:
        attempt.score = None
    attempt.changed_lines = _changed_lines(fork)


def _score(box: Sandbox, pick: str, timeout: int, last_turn: int, attempt: Attempt) -> None:
    """COMMAND through the pipeline in the attempt's box (your own command: what would ask runs, a
    deny still wins), then the box's workspace put back to the attempt's last checkpoint."""
    from ..models.base import ToolCall

    opened = box._live()  # the API's own: the pick's checkpoint and its undo are the store's, not calls
    store = opened.checkpoints
    base = max((p.turn for p in store.list() if p.ok), default=0) if store is not None else 0
    opened.pipeline.gate.auto_approve = True
    result = opened.pipeline.run(
        ToolCall(id=f"pick_{uuid.uuid4().hex[:12]}", name=SHELL, arguments={"command": pick, "timeout": timeout})
    )
    exit_code = result.meta.get("exit_code") if isinstance(result.meta, dict) else None
    attempt.pick_exit_code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
    attempt.score = parse_score(result.ok, attempt.pick_exit_code, result.output or "")
    if (
        attempt.pick_exit_code is None and result.error is not None
    ):  # the command did not run to an exit (refused, timed out, the box): say why
        attempt.pick_error = {"type": result.error.type.value, "message": result.error.message[:300]}
    if store is None:
        return
    opened.kill_running()
    turn = max(last_turn, base) + 1
    opened.checkpoint(turn, [SHELL])
    if any(p.turn == turn and p.ok for p in store.list()):
        report = store.restore(base)
        if report.conflicts:
            raise OpenAgentsError(
                ErrorType.STALE_CONTENT,
                f"what the pick command wrote could not be rolled back ({len(report.conflicts)} file(s))",
            )


def _changed_lines(fork: SessionRecord) -> int:
    """Lines added and removed against the real workspace (the tie-break), through the review's bounded diff."""
    from ..workspace.copy import CopyManifest
    from ..workspace.review import list_changes, render_diff

    try:
        manifest = CopyManifest.load(fork.manifest_path)
        return sum(
            1
            for line in render_diff(manifest, list_changes(manifest))
            if line[:1] in ("+", "-") and not line.startswith(("+++", "---"))
        )
    except (OpenAgentsError, OSError, ValueError):
        return 0
