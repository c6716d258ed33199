"""The glob of grep_files, read as ripgrep reads it (braces, `**`), compiled to bounded regexes."""

from __future__ import annotations

import os
import re

from .tools import ToolError

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Callable


MAX_GLOB_ALTERNATIVES = 256


def _expand_braces(pattern: str, depth: int = 0) -> list[str]:
    """`*.{ts,tsx}` -> `*.ts`, `*.tsx`, as shells and ripgrep read it; nested braces too, bounded."""
    if depth > 8:
        raise ToolError("invalid_arguments", "the glob nests braces too deeply")
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    level, parts, last = 0, [], start + 1
    for i in range(start, len(pattern)):
        ch = pattern[i]
        if ch == "{":
            level += 1
        elif ch == "}":
            level -= 1
            if level == 0:
                parts.append(pattern[last:i])
                head, tail = pattern[:start], pattern[i + 1 :]
                out: list[str] = []
                for part in parts:
                    for expanded in _expand_braces(head + part + tail, depth + 1):
                        out.append(expanded)
                        if len(out) > MAX_GLOB_ALTERNATIVES:
                            raise ToolError(
                                "invalid_arguments", f"the glob expands to more than {MAX_GLOB_ALTERNATIVES} patterns"
                            )
                return out
        elif ch == "," and level == 1:
            parts.append(pattern[last:i])
            last = i + 1
    raise ToolError("invalid_arguments", f"the glob {pattern!r} has an unclosed '{{'")


def _glob_regex(pattern: str) -> str:
    """`**` crosses directories (and `**/` may match none), `*` and `?` stay within one name."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            close = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if close < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : close]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = close
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def compile_glob(glob: str) -> Callable[[str, str], bool]:
    """A matcher of (workspace-relative path, path relative to the search root). A pattern without
    '/' matches the file's name anywhere, as ripgrep's --glob and Gemini CLI's include do."""
    if len(glob) > 1000:
        raise ToolError("invalid_arguments", "the glob is longer than 1000 characters")
    regexes = []
    for alternative in _expand_braces(glob):
        try:
            regexes.append((re.compile(_glob_regex(alternative.removeprefix("./")), re.DOTALL), "/" in alternative))
        except re.error as err:
            raise ToolError("invalid_arguments", f"the glob {glob!r} is not valid: {err}") from None

    def matches(shown: str, under_root: str) -> bool:
        name = os.path.basename(shown)
        for regex, has_slash in regexes:
            if has_slash:
                if regex.fullmatch(shown) or regex.fullmatch(under_root):
                    return True
            elif regex.fullmatch(name):
                return True
        return False

    return matches
