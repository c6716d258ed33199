"""The diff an edit would make, shown at its approval prompt before anything is written.

The file is the box's: it is read through boxfs only (no link followed, regular files only,
capped), and the diff is text for a person, made visible by whoever prints it. It is a preview:
the agent applies the edit itself (line ends, BOM), and the result's own diff is the record.
"""
from __future__ import annotations

import difflib
from pathlib import Path

from .errors import ErrorType, OpenAgentsError
from .boxfs import read_workspace_file
from .tools.registry import PreparedCall

PREVIEW_CAP = 1 << 20  # bytes of the current file read for a preview


def proposed_diff(workspace: Path, prepared: PreparedCall) -> str | None:
    """A unified diff of what `write_file` or `edit_file` would change; None for other tools, or
    when no preview can be made honestly (unreadable, not text, no unique match)."""
    name = prepared.spec.name
    if prepared.spec.side != "sandbox" or name not in ("write_file", "edit_file"):
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
    if name == "write_file":
        after = args["content"]
    else:
        count = before.count(args["old_text"])
        if count == 0 or (count > 1 and not args.get("allow_multiple")):
            return None
        after = before.replace(args["old_text"], args["new_text"])
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
