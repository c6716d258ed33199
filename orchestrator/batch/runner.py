"""One batch task, one session: the code both engines run (local threads and Ray tasks alike).

The task's workspace is never the box's: the session always runs in copy mode (sessions.prepare
takes the copy in the session's state directory before any box exists), and at the end the patch
is what `oa-sandbox apply ID` would land, computed by the sanitiser itself (review.planned_changes)
and rendered as `oa-sandbox changes` renders it; what the sanitiser would leave out is listed. The
copy stays, so `oa-sandbox apply ID` still works after the batch.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..boxfs.names import stored_shown
from ..config import DEFAULT_MAX_TURNS, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..terminal.machine import Bounded, name_item, named
from .tasks import BatchTask, TaskError, TaskResult

if TYPE_CHECKING:
    from ..api import Sandbox
    from ..workspace.records import SessionRecord

MAX_PATCH_BYTES = 512 << 10  # of the patch inline in a result line (which is at most MAX_LINE_BYTES); the whole in patch_file
MAX_PATCH_FILE_BYTES = 64 << 20  # of the patch file in the session's directory (render_diff bounds it further)


class BatchSettings(BaseModel):
    """What every task gets unless its line says otherwise (the batch command's options)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    policy: list[str] = Field(default_factory=list)
    auto_approve: bool = False
    max_turns: int = DEFAULT_MAX_TURNS
    max_wall: float | None = None
    max_tokens: int | None = None
    config: SandboxConfig = Field(default_factory=SandboxConfig)


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
                box.parts.session.cancel.set()
                box.kill_running()
            except Exception:  # noqa: BLE001 - the box may be going already (closed); its close removes it
                pass


def this_node() -> str:
    return socket.gethostname()


def run_task(task: BatchTask, settings: BatchSettings, control: RunControl | None = None, node: str | None = None) -> TaskResult:
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
        result = TaskResult.failed(task.id, "cancelled", OpenAgentsError(ErrorType.CANCELLED, "interrupted while the sandbox started"),
                                   exit_code=130)
    except Exception as err:  # noqa: BLE001 - a bug of ours ends this task, typed, not the batch
        result = TaskResult.failed(task.id, "error", OpenAgentsError(ErrorType.INTERNAL_ERROR, f"{type(err).__name__}: {str(err)[:500]}"),
                                   exit_code=2)
    finally:
        control.running = False
    result.wall_s = round(time.monotonic() - began, 3)
    result.node = where
    return result


def _run(task: BatchTask, settings: BatchSettings, control: RunControl) -> TaskResult:
    from ..api import Sandbox, SandboxOptions
    from ..loop import SessionResult, SessionStatus
    from ..terminal.summary import changed_files, exit_code

    if control.cancel.is_set():
        raise KeyboardInterrupt
    model = task.model or settings.model
    if not model:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, "no model: the task line has no `model`, and the batch no --model")
    config = settings.config
    if task.runtime is not None:
        config = config.with_backend(runtime=task.runtime)
    try:  # nobody to ask (non-interactive); copy mode: the host git tool is off anyway
        options = SandboxOptions(config=config, mode="copy", model=model, base_url=settings.base_url, api_key_env=settings.api_key_env,
                                 policy_files=[Path(p) for p in (task.policy if task.policy is not None else settings.policy)],
                                 max_turns=task.max_turns or settings.max_turns, auto_approve=settings.auto_approve, git=False,
                                 max_wall_s=task.max_wall or settings.max_wall, max_tokens=settings.max_tokens)
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
                outcome = box.parts.session.run(task.task)
            except KeyboardInterrupt:
                outcome = SessionResult(status=SessionStatus.CANCELLED, reason="interrupted (Ctrl-C)")
    finally:
        control.attach(None)
        box.close(**({"status": outcome.status.value, "reason": outcome.reason} if outcome is not None else {}))  # box removed, copy swept, record saved
    record = box.record
    try:
        changed = [c.path for c in changed_files(record)]
    except Exception:  # noqa: BLE001 - the patch below says what changed
        changed = []
    result = TaskResult(id=task.id, status=outcome.status.value, exit_code=exit_code(outcome), session_id=record.id,
                        reason=outcome.reason, tokens=dict(outcome.tokens), turns=outcome.turns,
                        error=TaskError(type=outcome.error.type.value, message=outcome.error.message) if outcome.error else None)
    fields: dict[str, Any] = {}
    lists = Bounded(fields, Path(record.dir) / "lists", "batch")
    lists.put("files_changed", changed, name_item, stored_shown)
    _add_patch(result, record.manifest_path, Path(record.dir), lists)
    result.report_file = _report(record)
    return _bounded(result, lists)


def _report(record: SessionRecord) -> str | None:
    """The task's session report (issue 38), in its session's directory: bounded as every report is
    (8 MiB); a report that cannot be made costs the task nothing but this pointer."""
    from ..report import write

    try:
        return str(write(record, Path(record.dir) / "report.html"))
    except Exception:  # noqa: BLE001 - the result line stands without its report
        return None


def _bounded(result: TaskResult, lists: Bounded) -> TaskResult:
    """The result with its lists and patch fitted to one line of at most MAX_LINE_BYTES (the full
    lists and patch are in the session's directory, named by the `_file` keys)."""
    lists.out["patch"] = result.patch
    lists.text("patch", MAX_PATCH_BYTES, PATCH_CUT)
    out = lists.value()
    if out.get("patch") != result.patch:
        result.patch_cut = True
    return result.model_copy(update={k: v for k, v in out.items() if k in TaskResult.model_fields})


PATCH_CUT = "\n# patch cut: patch_file has all of it\n"


def _add_patch(result: TaskResult, manifest_path: Path, session_dir: Path, lists: Bounded) -> None:
    """The patch apply would land (names quoted as git quotes them, so `git apply` lands them), and
    what it would leave out or refuse; a failure to make it is said in the result (as its error when
    the session itself had none), never a crash. The whole patch goes to the session's patch.diff
    when the result line cannot hold it."""
    from ..boxfs import show
    from ..workspace.copy import CopyManifest
    from ..workspace.review import planned_changes, render_diff

    try:
        manifest = CopyManifest.load(manifest_path)
        carried, report = planned_changes(manifest)
        head: list[str] = []
        size = 0
        spill: _Spill | None = None
        for line in render_diff(manifest, carried, for_git=True):
            data = line + "\n"
            size += len(data.encode("utf-8", "surrogatepass"))
            if spill is None and size > MAX_PATCH_BYTES:
                spill = _Spill(session_dir / "patch.diff", head)
            if spill is not None:
                if not spill.add(data):
                    break
            else:
                head.append(data)
        if spill is not None:
            result.patch_file = spill.close()
            result.patch_cut = True
            head.append(PATCH_CUT[1:])
        result.patch = "".join(head)
        lists.put("left_out", report.left_out, lambda item: named(item.path, reason=show(item.reason)))
        lists.put("conflicts", report.conflicts, lambda item: named(item.path, reason=show(item.reason)))
    except OpenAgentsError as err:
        _patch_failed(result, err)
    except OSError as err:
        _patch_failed(result, OpenAgentsError(ErrorType.IO_ERROR, f"the patch could not be made: {err}"))


class _Spill:
    """The whole patch, written to a temporary file beside `path` and renamed over it when done."""

    def __init__(self, path: Path, head: list[str]) -> None:
        import tempfile

        self.path = path
        fd, self.tmp = tempfile.mkstemp(prefix=".patch.diff.", dir=path.parent)
        self.f = os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass")
        self.size = 0
        for data in head:
            self.add(data)

    def add(self, data: str) -> bool:
        if self.size + len(data) > MAX_PATCH_FILE_BYTES:
            self.f.write(f"# patch cut at {MAX_PATCH_FILE_BYTES} bytes\n")
            return False
        self.f.write(data)
        self.size += len(data)
        return True

    def close(self) -> str:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        return str(self.path)


def _patch_failed(result: TaskResult, err: OpenAgentsError) -> None:
    result.left_out.append({"path": "", "path_shown": "", "reason": f"no patch: {err.type.value}: {err.message}"})
    result.left_out_total = len(result.left_out)
    if result.error is None:
        result.error = TaskError(type=err.type.value, message=err.message)
