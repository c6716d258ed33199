"""`oa-sandbox report ID`: one self-contained HTML page per session, for review and audit.

The page says what the agent did (a timeline of the model's answers and every tool call, with its
arguments, states, approval and who decided), what left the box (the gate's audit as the
transcript recorded it, and which credentials the gate injected, by host, never a value), the
checkpoints, and the final diff per file with what the sanitiser would leave out.

Everything on it but its frame was written by the box or the model, so (one module a job):
- `limits`: the bounds, and the one function every box-written value becomes text through
  (visible, cut, its cost counted against the page's room);
- `collect`: the transcript through transcript.read_records and events.parse, bounded as read;
- `changes`: the diff and the sanitiser's verdicts through workspace.review, the checkpoints
  through the store's index;
- `page`: Jinja2 with autoescape, no script, a CSP allowing only our stylesheet by hash.

The page is at most MAX_PAGE_BYTES: each part has its share, and a page still over it is built
again with every bound halved; what was left out is said at the top, with where the full record is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..boxfs.atomic import write_atomic
from ..workspace.records import SessionRecord
from .changes import final_changes, store_checkpoints
from .collect import Gathered, gather
from .limits import MAX_PAGE_BYTES, Limits
from .page import render

__all__ = ["MAX_PAGE_BYTES", "Limits", "build", "write"]

_EXIT = {"finished": None, "stopped": 1, "failed": 1, "cancelled": 130}


def _context(record: SessionRecord, g: Gathered, limits: Limits) -> dict[str, Any]:
    from ..ground.text import visible
    from ..workspace.records import shown_status

    calls = [e.call for e in g.entries if e.call is not None]
    refused = sum(1 for c in calls if c.refused)
    failed = sum(1 for c in calls if c.state == "error" and not c.refused)
    status = shown_status(record)
    code = _EXIT.get(record.status, None)
    exit_status = (
        ("3 (finished, a call was refused)" if refused else "0 (finished)")
        if record.status == "finished"
        else (f"{code} ({record.status})" if code is not None else f"none yet ({status})")
    )
    changes = final_changes(record, g, limits)
    checkpoints, checkpoints_left_out, source = store_checkpoints(record, g, limits)
    left_out = []
    if g.entries_left_out:
        left_out.append(f"{g.entries_left_out} timeline entries past the first {limits.max_entries}")
    if g.values_cut:
        left_out.append(
            f"{g.values_cut} texts (arguments, outputs, answers) cut shorter than their usual bound, for room"
        )
    if g.egress_left_out:
        left_out.append(f"{g.egress_left_out} egress records past the first {limits.max_egress}")
    if changes.lines_left_out:
        left_out.append(f"{changes.lines_left_out} diff lines past the page's share")
    if changes.rows_left_out:
        left_out.append(
            f"{changes.rows_left_out} entries of what the sanitiser "
            f"would leave out, past the first {limits.max_left_out}"
        )
    if checkpoints_left_out:
        left_out.append(f"{checkpoints_left_out} checkpoints past the first {limits.max_checkpoints}")
    if g.stopped:
        left_out.append(f"the transcript was not read to its end: {g.stopped}")
    transcript = record.transcript or "none left"
    model = g.model or visible(record.model_spec or "") or "not recorded"
    return {
        "record": record,
        "g": g,
        "changes": changes,
        "checkpoints": checkpoints,
        "checkpoints_source": source,
        "status": visible(status),
        "status_class": "ok" if record.status == "finished" and not refused else "bad",
        "exit_status": exit_status,
        "limit_hit": g.reason if record.status == "stopped" else "",
        "calls": len(calls) + g.entries_left_out,
        "refused": refused,
        "failed": failed,
        "transcript_path": visible(transcript),
        "session_dir": visible(str(record.dir)),
        "workspace": visible(record.workspace),
        "left_out": left_out,
        "generated": time.time(),
        "model": model,
    }


def build(record: SessionRecord, limits: Limits | None = None) -> str:
    """The page of the session `record` (loaded by the caller: who may read which record is theirs
    to decide), at most MAX_PAGE_BYTES."""
    limits = limits or Limits()
    transcript = Path(record.transcript) if record.transcript else None
    for _ in range(8):
        page = render(_context(record, gather(transcript, limits), limits))
        if len(page.encode("utf-8", "replace")) <= MAX_PAGE_BYTES:
            return page
        limits = limits.halved()
    return page


def write(record: SessionRecord, out: Path, limits: Limits | None = None, page: str | None = None) -> Path:
    """The page (built now, unless given) written atomically to `out` (a temporary file beside it,
    then renamed), mode 0644."""
    page = build(record, limits) if page is None else page
    out = Path(out)
    return write_atomic(out, page.encode("utf-8", "replace"), mode=0o644)
