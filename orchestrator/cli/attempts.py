"""`oa-sandbox run --attempts N --pick 'COMMAND' TASK`: best-of-N from one start.

A fresh copy session is made of the workspace (the size guard and the copy as `run` makes them),
forked N ways (workspace/fork.py), and the task runs in each fork, in its own box, at most
`attempt_workers()` at once. Each attempt is then scored by COMMAND, run in that attempt's own box
through the shell tool's pipeline (the ladder's policies and the shell's limits apply: a command
that hangs is killed at its timeout and fails): exit 0 is a pass, scored 1, or the number the
command prints on its last line; a non-zero exit, a timeout or a refusal fails (no score). What the
command itself writes (caches, reports) is rolled back through the attempt's checkpoints, so only
the agent's work is carried. The best score is kept (ties: fewest changed lines, then the first);
the others are discarded, and so is the start's copy. With `--apply` the chosen one lands through
the sanitiser after the ladder's landing decision (`oa-sandbox apply`'s own functions). When no
attempt passes, none is chosen, all are kept, and the exit code is 1.
"""
from __future__ import annotations

import math
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..boxfs.private import create_private
from ..errors import ErrorType, OpenAgentsError
from ..terminal.render import json_line, visible
from ..terminal.summary import EXIT_CANCELLED, EXIT_OK, EXIT_REFUSED, EXIT_STOPPED
from ..tools.defs import shell as shell_def
from .common import ignore_interrupts, setup_error
from .sessions import apply_copy, landing_permit

SHELL = shell_def.TOOL.name  # the pick command runs as a shell call, through the pipeline

if TYPE_CHECKING:
    from ..api import Sandbox, SandboxOptions
    from ..workspace.records import SessionRecord

PICK_TIMEOUT_S = 600  # the pick command's shell timeout by default (--pick-timeout; clamped to the shell's own maximum)


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
    discarded: bool = False


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


def run_attempts(options: SandboxOptions, workspace: Path, task: str, attempts: int, pick: str, apply_at_end: bool, output_format: str,
                 pick_timeout: int = PICK_TIMEOUT_S) -> None:
    """The whole best-of-N; ends with click's Exit (0: one chosen (and applied, with --apply), 1: none
    passed or an apply conflict, 3: the landing was refused). `options`: `run`'s, for every attempt's
    Sandbox (each resumes its fork, non-interactive)."""
    from ..workspace.copy_session import discard_session
    from ..workspace.fork import fork_session
    from ..workspace.records import WorkspaceMode, discard_state, prepare

    try:
        start, _ = prepare(workspace.resolve(), WorkspaceMode.COPY, options.sandbox_config().user, "run", options.copy_limits())
    except OpenAgentsError as err:
        raise setup_error(err) from None
    try:
        start.transcript = str(start.dir / "transcript.jsonl")
        fd = create_private(start.transcript)
        os.close(fd)
        start.model_spec, start.base_url, start.api_key_env = options.model, options.base_url, options.api_key_env
        start.policy_files = [str(Path(f).resolve()) for f in options.policy_files]
        _pin_start(start, workspace.resolve(), [str(f) for f in options.policy_files])
        start.status, start.reason, start.host_pid = "finished", f"the start of {attempts} attempts", 0
        start.save()
        forks = fork_session(start.id, attempts)
    except OpenAgentsError as err:
        raise setup_error(err) from None
    finally:
        discard_state(start)  # the forks hold the start now
    click.echo(f"oa-sandbox: {attempts} attempts from one copy of {workspace} ({attempt_workers(attempts)} at once): "
               + " ".join(f.id for f in forks), err=True)
    results = [Attempt(number=i + 1, session_id=f.id) for i, f in enumerate(forks)]
    live = _Live()
    pool = ThreadPoolExecutor(max_workers=attempt_workers(attempts), thread_name_prefix="oa-attempt")
    futures = [pool.submit(_one, options, task, pick, pick_timeout, fork, attempt, live) for fork, attempt in zip(forks, results, strict=True)]
    try:
        wait(futures)
    except KeyboardInterrupt:  # Ctrl-C: every attempt is cancelled, its box removed; all are kept
        ignore_interrupts()
        click.echo("oa-sandbox: cancelling the attempts (their boxes are removed; Ctrl-C is ignored until then)", err=True)
        live.cancel()
        wait(futures)
        pool.shutdown()
        for attempt in results:
            click.echo(f"  attempt {attempt.number}  {attempt.session_id}  {attempt.status}", err=True)
        raise click.exceptions.Exit(EXIT_CANCELLED) from None
    pool.shutdown()
    chosen = best(results)
    for attempt, record in zip(results, forks, strict=True):
        if chosen is not None and attempt is not chosen:
            try:
                discard_session(_fresh(record))
                attempt.discarded = True
            except (OpenAgentsError, OSError) as err:
                attempt.error = attempt.error or {"type": ErrorType.IO_ERROR.value, "message": f"not discarded: {err}"[:300]}
        shown = "failed" if attempt.score is None else f"{attempt.score:g}"
        click.echo(visible(f"  attempt {attempt.number}  {attempt.session_id}  {attempt.status:<9} score {shown:<8} "
                           f"{attempt.changed_lines} changed line(s)" + ("  <- chosen" if attempt is chosen else "")
                           + (f"  ({attempt.error['type']}: {attempt.error['message']})" if attempt.error else "")), err=True)
    code = EXIT_OK
    landing: dict[str, object] | None = None
    if chosen is None:
        click.echo("oa-sandbox: no attempt passed the pick command: none chosen, all kept (`oa-sandbox sessions`)", err=True)
        code = EXIT_STOPPED
    elif apply_at_end:
        record = _fresh(next(f for f in forks if f.id == chosen.session_id))
        try:
            applied, report = apply_copy(record, landing_permit(record, "run --attempts --apply"))
            landing = {"applied": len(report.applied), "left_out": len(report.left_out), "conflicts": len(report.conflicts)}
            code = EXIT_OK if applied == EXIT_OK else EXIT_STOPPED
        except OpenAgentsError as err:
            landing = {"error": err.to_dict()}
            code = EXIT_REFUSED
    else:
        click.echo(f"   chosen: {chosen.session_id}: `oa-sandbox changes {chosen.session_id}`, `oa-sandbox apply {chosen.session_id}`", err=True)
    if output_format in ("json", "stream-json"):
        click.get_current_context().meta["oa-sandbox.json-printed"] = True
        click.echo(json_line({"session_id": chosen.session_id if chosen else None, "status": "finished" if chosen else "stopped",
                              "exit_code": code, "pick": pick, "chosen": chosen.session_id if chosen else None,
                              "attempts": [asdict(a) for a in results], "landing": landing}))
    raise click.exceptions.Exit(code)


def _fresh(record: SessionRecord) -> SessionRecord:
    from ..workspace.copy_session import ended_copy_session

    return ended_copy_session(record.id, "use")


class _Live:
    """The attempts' open sessions, so Ctrl-C reaches every one of them."""

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
                box.parts.pipeline.cancel.set()
                box.kill_running()
            except Exception:  # noqa: BLE001 - closed already, or its box is removed when the attempt closes it
                pass


def _pin_start(start: SessionRecord, workspace: Path, policy_files: list[str]) -> None:
    """What the start trusts (policy files, the workspace's own policy and its hooks, the config
    file), pinned as a first session pins it: each attempt opens its fork as a resume, and a resume
    takes hooks and policies from the pins, never afresh (without them it ran no workspace hook)."""
    from ..hooks.spec import Collected, in_force
    from ..hooks.wiring import pinned_argv
    from ..policy import pins
    from ..session import load_authority

    collected = Collected()
    _, _, read = load_authority(workspace, policy_files, None, collected)
    pins.save(start, read)
    roots = pins.box_roots(workspace)
    kept, _ = in_force(collected.specs, collected.trusted, workspace, roots)
    for hook in kept:  # a trusted hook's script in the workspace: its copy as of now is what every attempt runs
        try:
            pinned_argv(hook, workspace, roots, start, False)
        except OpenAgentsError:
            pass  # not pinned: each attempt then says it is not in force, as a session would


def _one(options: SandboxOptions, task: str, pick: str, pick_timeout: int, fork: SessionRecord, attempt: Attempt, live: _Live) -> None:
    """One attempt: the task in the fork's own box (a Sandbox resuming the fork), then the pick
    command in that box; never raises."""
    from ..api import Sandbox

    spec = options.model or ""
    if spec.startswith("script:"):  # a replay: `{attempt}` in its file name picks one script per attempt (tests, demos)
        spec = spec.replace("{attempt}", str(attempt.number))
    if live.stopped.is_set():
        attempt.status = "cancelled"
        return
    try:  # nobody to ask (a person is at none of N boxes), its own transcript (the fork's), no live view
        box = Sandbox(Path(fork.workspace), options, kind="run", model=spec, resume=fork.id, mode="copy", approver=None, transcript=None,
                      on_record=None, on_event=None, host_tools=None).open()
    except OpenAgentsError as err:
        attempt.error = {"type": err.type.value, "message": err.message[:300]}
        return
    except Exception as err:  # noqa: BLE001 - one attempt's failure is its own result
        attempt.error = {"type": ErrorType.INTERNAL_ERROR.value, "message": f"{type(err).__name__}: {err}"[:300]}
        return
    status: dict[str, str] = {}
    try:
        if not live.add(box):
            box.parts.pipeline.cancel.set()
        result = box.parts.session.run(task)
        status = {"status": result.status.value, "reason": result.reason}
        box.record.turns = result.last_turn
        attempt.status = result.status.value
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
            attempt.error = attempt.error or {"type": ErrorType.INTERNAL_ERROR.value, "message": f"closing: {err}"[:300]}
    if attempt.error is not None:
        attempt.score = None
    attempt.changed_lines = _changed_lines(fork)


def _score(box: Sandbox, pick: str, timeout: int, last_turn: int, attempt: Attempt) -> None:
    """COMMAND through the pipeline in the attempt's box (your own command: what would ask runs, a
    deny still wins), then the box's workspace put back to the attempt's last checkpoint."""
    from ..models.base import ToolCall

    opened = box.parts
    store = opened.checkpoints
    base = max((p.turn for p in store.list() if p.ok), default=0) if store is not None else 0
    opened.pipeline.gate.auto_approve = True
    result = opened.pipeline.run(ToolCall(id=f"pick_{uuid.uuid4().hex[:12]}", name=SHELL,
                                          arguments={"command": pick, "timeout": timeout}))
    exit_code = result.meta.get("exit_code") if isinstance(result.meta, dict) else None
    attempt.pick_exit_code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
    attempt.score = parse_score(result.ok, attempt.pick_exit_code, result.output or "")
    if store is None:
        return
    opened.kill_running()
    turn = max(last_turn, base) + 1
    opened.checkpoint(turn, [SHELL])
    if any(p.turn == turn and p.ok for p in store.list()):
        report = store.restore(base)
        if report.conflicts:
            raise OpenAgentsError(ErrorType.STALE_CONTENT, f"what the pick command wrote could not be rolled back ({len(report.conflicts)} file(s))")


def _changed_lines(fork: SessionRecord) -> int:
    """Lines added and removed against the real workspace (the tie-break), through the review's bounded diff."""
    from ..workspace.copy import CopyManifest
    from ..workspace.review import list_changes, render_diff

    try:
        manifest = CopyManifest.load(fork.manifest_path)
        return sum(1 for line in render_diff(manifest, list_changes(manifest))
                   if line[:1] in ("+", "-") and not line.startswith(("+++", "---")))
    except (OpenAgentsError, OSError, ValueError):
        return 0
