"""A batch's input and output: task lines in, result lines out (JSONL both ways).

A task line names a workspace (a directory: the task works on its own copy, never on it), the task
text, and optionally the model, policy files, max_turns, max_wall, runtime, and `attempts` with
`pick` (best-of-N: batch/best_of.py); the batch's own
options fill what a line leaves out. A line that cannot be a task (not JSON, not an object, an
unknown key, a missing field, a duplicate id, a workspace that is not a directory) becomes a typed
result of its own (`status: invalid`), and the batch goes on.

Result lines are appended as each task ends and flushed at once, so a batch that is killed keeps
every result it wrote; rerunning with the same output file skips the ids already `finished` or
`stopped` (the last line of an id wins), and runs the others again (cancelled, invalid, error).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ErrorType, OpenAgentsError
from ..workspace.fork import MAX_FORKS

MAX_TASK_LINE = 1 << 20  # bytes of one task line
MAX_ID = 200

# finished / stopped are a session's own ends (summary.py); cancelled: Ctrl-C or a cancelled Ray task;
# error: no session could run (docker, image, model key, the copy); invalid: the task line itself.
Status = Literal["finished", "stopped", "cancelled", "error", "invalid"]
DONE: frozenset[str] = frozenset({"finished", "stopped"})  # a rerun with the same --out skips these


class BatchTask(BaseModel):
    """One task line, its relative paths already resolved against the tasks file's directory."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=MAX_ID)
    workspace: str
    task: str = Field(min_length=1)
    model: str | None = None
    policy: list[str] | None = None
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_wall: float | None = Field(default=None, gt=0)
    runtime: str | None = None
    attempts: int | None = Field(
        default=None, ge=1, le=MAX_FORKS
    )  # best-of-N: N attempts from one start, scored by `pick`
    pick: str | None = Field(default=None, min_length=1)


class TaskError(BaseModel):
    type: str  # an ErrorType value
    message: str


class TaskResult(BaseModel):
    """One result line."""

    id: str
    status: Status
    exit_code: int  # as `oa-sandbox run`: 0, 3 (a call refused), 1 (stopped), 2 (set-up), 130 (cancelled)
    session_id: str | None = None
    reason: str = ""
    # Names are exact (a string, or {"bytes_b64": ...}) with display forms beside them (`_shown`);
    # each list holds at most terminal.machine.MAX_LISTED items, `_total` counts them all, `_file`
    # names the JSONL file in the session's directory that holds all of them when the list is cut.
    patch: str = (
        ""  # the unified diff apply_changes would land, against the source workspace (names quoted as git does)
    )
    patch_cut: bool = False  # the patch stops short: patch_file (the session's patch.diff) holds all of it
    patch_file: str | None = None
    left_out: list[dict[str, Any]] = Field(
        default_factory=list
    )  # {path, path_shown, reason}: what apply would not carry
    left_out_total: int = 0
    left_out_file: str | None = None
    conflicts: list[dict[str, Any]] = Field(
        default_factory=list
    )  # the source changed under the task: apply would land nothing
    conflicts_total: int = 0
    conflicts_file: str | None = None
    files_changed: list[Any] = Field(default_factory=list)
    files_changed_shown: list[str] = Field(default_factory=list)
    files_changed_total: int = 0
    files_changed_file: str | None = None
    tokens: dict[str, int] = Field(default_factory=lambda: {"input": 0, "output": 0})
    turns: int = 0
    wall_s: float = 0.0
    error: TaskError | None = None
    node: str = ""  # where it ran: the host name (and the Ray node id under --engine ray)
    attempts: int = 1  # Ray: how many times the task was started (a node lost mid-task: more than one)
    retried: bool = False
    nodes_tried: list[str] = Field(default_factory=list)  # Ray: the nodes of the earlier attempts
    report_file: str | None = None  # the session's HTML report (`oa-sandbox report`'s), on the node that ran the task
    # best-of-N: {pick, chosen, attempts: [{number, session_id, status, score, changed_lines, discarded, ...}]}
    best_of: dict[str, Any] | None = None

    @classmethod
    def failed(cls, task_id: str, status: Status, err: OpenAgentsError, exit_code: int, **fields: Any) -> "TaskResult":
        return cls(
            id=task_id,
            status=status,
            exit_code=exit_code,
            reason=f"{err.type.value}: {err.message}",
            error=TaskError(type=err.type.value, message=err.message),
            **fields,
        )


class BadLine(BaseModel):
    """A line that is no task: its result is written as it is read."""

    line: int
    result: TaskResult


def _resolve(base: Path, path: str) -> str:
    return str((base / os.path.expanduser(path)).resolve())


def _model(base: Path, spec: str) -> str:
    kind, sep, rest = spec.partition(":")
    if kind == "script" and sep and rest and not os.path.isabs(os.path.expanduser(rest)):
        return f"script:{_resolve(base, rest)}"
    return spec


def parse_tasks(path: Path) -> list[BatchTask | BadLine]:
    """Every non-blank, non-comment line of the tasks file, in order: a task or a bad line's result.
    Relative paths (workspace, policy, a script: model) are taken from the tasks file's directory."""
    base = path.resolve().parent
    out: list[BatchTask | BadLine] = []
    seen: set[str] = set()
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.FILE_NOT_FOUND if isinstance(err, FileNotFoundError) else ErrorType.IO_ERROR,
            f"cannot read the tasks file {path}: {err.strerror}",
        ) from None
    for number, data in enumerate(raw.split(b"\n"), 1):
        text = data.decode("utf-8", errors="replace").strip()
        if not text or text.startswith("#"):
            continue
        fallback = f"line-{number}"

        def bad(
            message: str, task_id: str = fallback, kind: ErrorType = ErrorType.INVALID_ARGUMENTS, number: int = number
        ) -> BadLine:
            err = OpenAgentsError(kind, f"task line {number}: {message}")
            return BadLine(line=number, result=TaskResult.failed(task_id, "invalid", err, exit_code=2))

        if len(data) > MAX_TASK_LINE:
            out.append(bad(f"longer than {MAX_TASK_LINE} bytes"))
            continue
        try:
            obj = json.loads(text)
        except ValueError as err:
            out.append(bad(f"not JSON ({err})"))
            continue
        if not isinstance(obj, dict):
            out.append(bad(f"a JSON {type(obj).__name__}, not an object with id, workspace and task"))
            continue
        raw_id = obj.get("id")
        task_id = raw_id if isinstance(raw_id, str) and 0 < len(raw_id) <= MAX_ID else fallback
        if isinstance(obj.get("policy"), str):
            obj["policy"] = [obj["policy"]]
        try:
            task = BatchTask.model_validate(obj)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}" for e in err.errors()[:5]
            )
            out.append(bad(problems, task_id))
            continue
        if task.id in seen:
            out.append(bad(f"id {task.id!r} is used by an earlier line", f"{task.id}@line-{number}"))
            continue
        seen.add(task.id)
        task.workspace = _resolve(base, task.workspace)
        if not os.path.isdir(task.workspace):
            out.append(bad(f"workspace {task.workspace} is not a directory", task.id, ErrorType.NOT_A_DIRECTORY))
            continue
        if task.policy is not None:
            task.policy = [_resolve(base, p) for p in task.policy]
            missing = [p for p in task.policy if not os.path.isfile(p)]
            if missing:
                out.append(bad(f"policy file {missing[0]} does not exist", task.id, ErrorType.FILE_NOT_FOUND))
                continue
        if task.model is not None:
            task.model = _model(base, task.model)
        out.append(task)
    return out


def finished_ids(out: Path) -> set[str]:
    """The ids whose last result line in `out` is finished or stopped: a rerun skips them. A line
    that does not parse (a batch killed mid-write) is passed over."""
    latest: dict[str, str] = {}
    try:
        raw = out.read_bytes()
    except FileNotFoundError:
        return set()
    for data in raw.split(b"\n"):
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), str) and isinstance(obj.get("status"), str):
            latest[obj["id"]] = obj["status"]
    return {task_id for task_id, status in latest.items() if status in DONE}


class ResultWriter:
    """Appends one JSON line per result, flushed and fsynced as it is written, from any thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        size = os.fstat(self._fd).st_size
        if size:  # a line cut short by a kill: the next result starts on a line of its own
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")

    def write(self, result: TaskResult) -> None:
        """One line, at most MAX_LINE_BYTES (the runner fits the lists and patch; a result still over
        it keeps its small values only). Written with json_line: no raw control character."""
        from ..terminal.machine import fit_json

        data = (fit_json(result.model_dump(mode="json")) + "\n").encode("utf-8", "surrogatepass")
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
