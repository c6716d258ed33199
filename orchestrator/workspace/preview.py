"""The diff an edit would make, shown at its approval prompt before anything is written.

The file is the box's: it is read through boxfs only (no link followed, regular files only,
capped), and the diff is text for a person, made visible by whoever prints it. It is a preview:
the agent applies the edit itself (line ends, BOM), and the result's own diff is the record.

Bounded (issue 22): the size of the edited file is computed from the match count before it is
built (an edit of 1 MiB of "a" replacing each "a" with 256 bytes used to build 256 MiB and take
765 MiB to diff), and past PREVIEW_CAP there is no preview; the diff itself runs in a child
process killed after PREVIEW_SECONDS (bounded_diff.py), and at most DIFF_CAP of it comes back.
Each refusal is one line of ours for the prompt, never the file's content.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..boxfs import read_workspace_file
from ..errors import ErrorType, OpenAgentsError
from ..tools.registry import PreparedCall
from .bounded_diff import bounded_unified_diff

PREVIEW_CAP = 1 << 20  # bytes of the current file read for a preview, and of the file the edit would make
PREVIEW_SECONDS = 2.0  # for the diff itself, once its child process has started
DIFF_CAP = 64 << 10  # bytes of diff shown (the prompt shows its first 120 lines)


@dataclass(frozen=True)
class Preview:
    text: str | None  # the unified diff (cut at DIFF_CAP when note says so); None when skipped
    note: str | None = None  # one line of ours for the prompt: why there is no diff, or that it was cut


def _size(n: int) -> str:
    """`256 MiB`, `1 MiB`, `1.5 MiB`, `64 KiB`."""
    value, unit = (n / (1 << 20), "MiB") if n >= 1 << 20 else (n / 1024, "KiB")
    return f"{value:.{0 if value >= 10 else 1}f}".removesuffix(".0") + f" {unit}"


def proposed_diff(workspace: Path, prepared: PreparedCall) -> Preview | None:
    """What a file-replacing tool's call (its ToolDef's `propose`) would change; None for other
    tools, or when no preview can be made honestly (unreadable, not text, no unique match); a
    Preview with a note and no text when it would cost too much."""
    tool = prepared.spec
    if tool.side != "sandbox" or not tool.files.replaces_file or tool.files.propose is None:
        return None
    args = prepared.arguments()
    path = args["path"]
    try:
        before = read_workspace_file(workspace, path, PREVIEW_CAP).decode("utf-8")
    except OpenAgentsError as err:
        if err.type != ErrorType.FILE_NOT_FOUND:
            return None
        before = ""
    except UnicodeDecodeError:
        return None
    # The size of the result, in characters (a lower bound of its bytes), before building it.
    proposal = tool.files.propose(before, args)
    if proposal is None:
        return None
    if proposal.size > PREVIEW_CAP:
        return Preview(
            None,
            f"preview skipped: the {proposal.verb} would make a "
            f"{_size(proposal.size)} file (previews stop at {_size(PREVIEW_CAP)})",
        )
    after = proposal.make()
    diff = bounded_unified_diff(before, after, f"a/{path}", f"b/{path}", max_bytes=DIFF_CAP, deadline_s=PREVIEW_SECONDS)
    if diff.text is None:
        return Preview(None, f"preview skipped: {diff.skipped}")
    return Preview(diff.text, f"preview cut at {_size(DIFF_CAP)}" if diff.cut else None)
