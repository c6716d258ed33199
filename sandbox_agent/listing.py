"""list_files, and the walk grep_files shares: no link followed, skipped directories not entered."""

from __future__ import annotations

import os

from . import limits
from .names import exact
from .paths import local, resolve
from .tools import ToolError, _arg, _display, _os_error, _path_arg

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Iterator


def _walk(
    start: str, recursive: bool = True, unreadable: list[str] | None = None, dirs_first: bool = False
) -> Iterator[tuple[os.DirEntry[str], bool]]:
    """(entry, is_dir) under `start`, depth first in name order (with `dirs_first`, a directory's
    subdirectories before its files, as Gemini CLI's ls and `tree --dirsfirst` show them; grep keeps
    plain path order). Skipped directories are neither listed nor entered, and nothing is followed
    through a symlink. The start directory must be readable; a subdirectory that is not is passed
    over and named in `unreadable`."""
    stack = [start]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                items = sorted(it, key=lambda e: (dirs_first and not e.is_dir(follow_symlinks=False), e.name))
        except OSError as err:
            if current == start:
                raise _os_error(err, _display(current)) from None
            if unreadable is not None:
                unreadable.append(_display(current))
            continue
        subdirs = []
        for entry in items:
            is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir and entry.name in limits.LIST_SKIPPED_DIRS:
                continue
            yield entry, is_dir
            if is_dir and recursive:
                subdirs.append(entry.path)
        stack.extend(reversed(subdirs))


def list_files(args: dict[str, Any]) -> dict[str, Any]:
    rel = _path_arg(args, ".")
    recursive = _arg(args, "recursive", bool, True)
    real = resolve(rel)
    if not os.path.lexists(real):
        raise ToolError("file_not_found", f"{rel}: no such file or directory")
    if not os.path.isdir(real):
        raise ToolError("not_a_directory", f"{rel} is not a directory; use read_file for a file")
    entries: list[str] = []
    unreadable: list[str] = []
    more = False
    for entry, is_dir in _walk(local(real), recursive, unreadable, dirs_first=True):
        if len(entries) >= limits.LIST_MAX_ENTRIES:
            more = True
            break
        path = _display(entry.path)
        entries.append(path + "/" if is_dir else path)
    output = "\n".join(entries)
    if more:
        output += (
            f"\n[truncated: the listing stops at {limits.LIST_MAX_ENTRIES} entries; list a subdirectory to see more]"
        )
    # `names`: the same entries, each exact (names.exact): a reader never parses them back from the text,
    # where a name holding a newline would read as two and bytes that are not UTF-8 are shown escaped.
    return {
        "output": output or "(empty directory)",
        "note": _skipped_note(unreadable),
        "meta": {
            "entries": len(entries),
            "truncated": more,
            "unreadable": unreadable[:50],
            "names": [exact(e) for e in entries],
        },
    }


def _skipped_note(unreadable: list[str]) -> str:
    if not unreadable:
        return ""
    shown = ", ".join(unreadable[:20]) + (f" and {len(unreadable) - 20} more" if len(unreadable) > 20 else "")
    return (
        f"[skipped {len(unreadable)} unreadable "
        f"director{'y' if len(unreadable) == 1 else 'ies'} (permission denied): {shown}]"
    )
