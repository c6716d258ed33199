"""What an editor is shown of a file tool call: its locations (to follow the agent) and its diff.

Editors expect a diff to carry the whole old and new text of the file, and `oldText: null` only
for a file that did not exist. The old text is read just before the call runs, the new text just
after, from the box's workspace: through boxfs only (the box wrote it: no link is followed, no
FIFO blocked on, nothing read past DIFF_MAX_BYTES). A file that cannot be read that way, or is not
UTF-8 text, gets no diff at all rather than a wrong one. Paths shown are the editor's own (its cwd
joined with the workspace-relative path), even in copy mode, where the box works on a copy.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..boxfs import read_workspace_file
from ..errors import ErrorType, OpenAgentsError
from ..tools import catalog
from . import models as m

FILE_TOOLS = catalog.path_tools()  # the tools with a workspace path argument (their ToolDefs say)
EDIT_TOOLS = catalog.file_replacing()  # the tools that rewrite the file they name
DIFF_MAX_BYTES = 1024 * 1024
BOX_ROOT = "/workspace"


@dataclass(frozen=True)
class FileText:
    """A workspace file's text before or after a call: `missing` (no file), or `text`, or neither
    (unreadable, too big, not text: then no diff is claimed)."""

    text: str | None = None
    missing: bool = False

    @property
    def known(self) -> bool:
        return self.missing or self.text is not None


def workspace_rel(path: Any) -> str | None:
    """The model's path argument as a plain workspace-relative path, or None when it is not one
    (the box refuses those calls itself; nothing is shown for them)."""
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    if path == BOX_ROOT or path.startswith(BOX_ROOT + "/"):
        path = path[len(BOX_ROOT) :].lstrip("/") or "."
    if path.startswith("/"):
        return None
    rel: str = posixpath.normpath(path)
    if rel == ".." or rel.startswith("../"):
        return None
    return rel


def locations(tool: str, args: Any, editor_root: Path, line: int | None = None) -> list[m.ToolCallLocation] | None:
    """Where a file tool call points: the path, and the line where it is known."""
    if tool not in FILE_TOOLS or not isinstance(args, dict):
        return None
    rel = workspace_rel(args.get("path", "."))
    if rel is None:
        return None
    line_arg = catalog.TOOLS[tool].files.line_arg
    if line is None and line_arg is not None and isinstance(args.get(line_arg), int) and args[line_arg] >= 1:
        line = args[line_arg]
    path = editor_root if rel == "." else editor_root / rel
    return [m.ToolCallLocation(path=str(path), line=line)]


def read_text(box_root: Path, args: Any) -> FileText:
    """The file a write_file or edit_file names, as it is in the box's workspace now."""
    rel = workspace_rel(args.get("path")) if isinstance(args, dict) else None
    if rel is None or rel == ".":
        return FileText()
    try:
        raw = read_workspace_file(box_root, rel, DIFF_MAX_BYTES)
    except OpenAgentsError as err:
        return FileText(missing=err.type == ErrorType.FILE_NOT_FOUND)
    try:
        return FileText(text=raw.decode("utf-8"))
    except UnicodeDecodeError:
        return FileText()


def first_changed_line(tool: str, before: FileText, args: Any) -> int | None:
    """A tool whose ToolDef names a `match_arg` (edit_file's old_text): the 1-based line where that
    text starts in the file before the call; None for the others."""
    match_arg = catalog.TOOLS[tool].files.match_arg if tool in catalog.TOOLS else None
    old = args.get(match_arg) if isinstance(args, dict) and match_arg else None
    if before.text is None or not isinstance(old, str) or not old:
        return None
    at = before.text.find(old)
    return before.text.count("\n", 0, at) + 1 if at >= 0 else None


def diff(editor_root: Path, args: Any, before: FileText, after: FileText) -> m.DiffToolCallContent | None:
    """The whole file before and after; None when either side is not known for sure."""
    rel = workspace_rel(args.get("path")) if isinstance(args, dict) else None
    if rel is None or not before.known or after.text is None:
        return None
    return m.DiffToolCallContent(path=str(editor_root / rel), oldText=before.text, newText=after.text)
