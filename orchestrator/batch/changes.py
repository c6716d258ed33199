"""What a batch task's session changed, in its result line: its files, the patch `oa-sandbox apply
ID` would land, computed by the sanitiser itself (review.planned_changes) and rendered as
`oa-sandbox changes` renders it, what the sanitiser would leave out, its report. One task's
session (runner.py) or a best-of-N's chosen attempt (best_of.py) alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..boxfs.names import stored_shown
from ..errors import ErrorType, OpenAgentsError
from ..terminal.machine import Bounded, name_item, named
from .tasks import TaskError, TaskResult

if TYPE_CHECKING:
    from ..workspace.records import SessionRecord

MAX_PATCH_BYTES = (
    512 << 10
)  # of the patch inline in a result line (which is at most MAX_LINE_BYTES); the whole in patch_file
MAX_PATCH_FILE_BYTES = 64 << 20  # of the patch file in the session's directory (render_diff bounds it further)


def with_changes(result: TaskResult, record: SessionRecord) -> TaskResult:
    """`result` with what the session `record` changed: its files, the patch apply would land (and
    what it would leave out), its report; fitted to one result line."""
    from ..loop.summary import changed_files

    try:
        changed = [c.path for c in changed_files(record)]
    except Exception:  # noqa: BLE001 - the patch below says what changed
        changed = []
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
