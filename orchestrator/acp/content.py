"""A prompt's content blocks as the task text the model reads.

ACP agents must accept text and `resource_link` blocks (we advertise nothing more: no image,
audio or embedded context). A link is passed on by name and URI; when it is a file inside the
session's workspace, its content too, read through the sandbox's own read_file (the box's view,
with its path rules and caps) and cut at LINK_MAX_CHARS. A link to anything else (a file outside
the workspace, a URL) is named and never read: the host reads nothing the editor points at
outside the workspace on the model's behalf.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from ..protocol import ToolResult
from . import models as m

LINK_MAX_CHARS = 64 * 1024
ReadFile = Callable[[str], ToolResult]  # a workspace-relative path -> the sandbox's read_file result


class PromptError(ValueError):
    """The prompt cannot be taken (an invalid-params error for the editor)."""


def link_path(uri: str) -> str | None:
    """The local absolute path a link names (file:// URI or a bare absolute path), or None."""
    if uri.startswith("/"):
        return posixpath.normpath(uri)
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    path = unquote(parts.path)
    return posixpath.normpath(path) if path.startswith("/") and "\0" not in path else None


def inside(path: str, roots: list[Path]) -> str | None:
    """`path` relative to the first root it is lexically inside (nothing is resolved: a link in
    the workspace is the box's, and the box's read_file judges it), or None."""
    for root in roots:
        root_s = posixpath.normpath(str(root))
        if path == root_s:
            return None  # the workspace itself is a directory, not a file to read
        if path.startswith(root_s.rstrip("/") + "/"):
            return path[len(root_s.rstrip("/")) + 1 :]
    return None


def link_text(link: m.ResourceLinkBlock, roots: list[Path], read_file: ReadFile) -> str:
    title = f" - {link.title}" if link.title and link.title != link.name else ""
    head = f"[Resource link: {link.name}{title} ({link.uri})]"
    path = link_path(link.uri)
    if path is None:
        return head + "\n(not a local file: named only, not read)"
    rel = inside(path, roots)
    if rel is None:
        return head + f"\n(outside the workspace: {path} is named only, not read)"
    result = read_file(rel)
    if not result.ok:
        why = f"{result.error.type.value}: {result.error.message}" if result.error else "unreadable"
        return head + f"\n(workspace file {rel}: could not be read: {why})"
    text = result.output
    cut = ""
    if len(text) > LINK_MAX_CHARS:
        text, cut = text[:LINK_MAX_CHARS], f"\n(cut at {LINK_MAX_CHARS} characters; read_file shows the rest)"
    return head + f"\nWorkspace file {rel}, as read_file shows it:\n{text}{cut}"


def prompt_text(blocks: list[dict[str, Any]], roots: list[Path], read_file: ReadFile) -> str:
    """The model's task from the prompt's blocks, in order. Raises PromptError for a block we do
    not accept, or for a prompt with nothing in it."""
    parts: list[str] = []
    for i, raw in enumerate(blocks):
        kind = raw.get("type") if isinstance(raw, dict) else None
        try:
            if kind == "text":
                parts.append(m.TextBlock.model_validate(raw).text)
            elif kind == "resource_link":
                parts.append(link_text(m.ResourceLinkBlock.model_validate(raw), roots, read_file))
            else:
                raise PromptError(
                    f"prompt[{i}]: content of type {str(kind)[:40]!r} is not "
                    "supported (promptCapabilities: text and resource_link only)"
                )
        except ValidationError as err:
            first = err.errors(include_input=False)[0]
            raise PromptError(f"prompt[{i}]: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    text = "\n\n".join(p for p in parts if p.strip()).strip()
    if not text:
        raise PromptError("the prompt is empty")
    return text


def roots_of(cwd: str, workspace: Path) -> list[Path]:
    """The editor's cwd as it gave it and as resolved: links the editor makes may use either."""
    given = Path(os.path.normpath(cwd))
    return [given] if given == workspace else [given, workspace]
