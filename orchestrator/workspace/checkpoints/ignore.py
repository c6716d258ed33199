"""`.gitignore` as the checkpoints honour it: what an ignore file names is not checkpointed, and
is listed as skipped (one entry for an ignored directory, which is not walked), never left out
silently; restore leaves it as it is and says so per path.

Gemini CLI's shadow repository applies the project's `.gitignore` the same way: build outputs and
vendored dependencies are the bulk of most large trees, and hashing them made a session's first
checkpoint cost a minute (issue 50). Only `.gitignore` files inside the workspace are read (not
`.git/info/exclude`, not the user's global excludes), through boxfs, each bounded; they are the
box's data, so parsing is bounded too (lines, patterns, components) and matching never
backtracks without bound: a name is matched by fnmatch's regex (atomic groups, no nested
repetition), a path component by component with `**` as a table of at most components x parts.
A file that cannot be read, is over its cap or is not a regular file ignores nothing: the
checkpoint then holds more, never less.

Git's rules as far as they go here: blank lines and `#` comments skipped, trailing spaces dropped
unless escaped, `!` re-includes, a trailing `/` matches directories only, a pattern with a `/`
before its end is anchored at the ignore file's directory, `**` matches any number of directories,
the last matching line wins and a deeper file's lines come after its parents'; nothing under an
ignored directory is looked at (so `!` cannot re-include inside it, as in git).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from functools import lru_cache

from ...boxfs import BoxDir
from ...errors import OpenAgentsError

IGNORE_FILE = b".gitignore"
IGNORE_CAP = 256 << 10  # bytes of one ignore file read; a longer one ignores nothing
MAX_RULES = 2000  # patterns kept of one file
MAX_DEPTH_RULES = 8000  # patterns in force in one directory (its own and its parents')
MAX_PARTS = 32  # components of one anchored pattern
IGNORED = "ignored by .gitignore: not checkpointed, and left as it is by a rollback"


@dataclass(frozen=True)
class Rule:
    base: str  # the ignore file's directory, relative to the workspace ("" at the root; os.fsdecode form)
    parts: tuple[str, ...]  # anchored: the components; not anchored: one, matched against the name
    anchored: bool
    negate: bool
    dir_only: bool


def read_rules(d_fd: int, rel: str) -> list[Rule]:
    """The rules of the ignore file in the directory open as `d_fd` (`rel`: its workspace path)."""
    try:
        data, _ = BoxDir.at(d_fd).read(
            IGNORE_FILE, IGNORE_CAP + 1, os.fsencode(f"{rel}/.gitignore" if rel else ".gitignore")
        )
    except (OSError, OpenAgentsError):
        return []
    if len(data) > IGNORE_CAP:
        return []
    return parse(data, rel)


def parse(data: bytes, base: str) -> list[Rule]:
    rules: list[Rule] = []
    for raw in data.split(b"\n"):
        line = os.fsdecode(raw.rstrip(b"\r"))
        if not line or line.startswith("#"):
            continue
        line = _strip_trailing_spaces(line)
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        parts = tuple(p for p in line.lstrip("/").split("/") if p)
        if not parts or len(parts) > MAX_PARTS:
            continue
        rules.append(Rule(base, parts, anchored, negate, dir_only))
        if len(rules) >= MAX_RULES:
            break
    return rules


def _strip_trailing_spaces(line: str) -> str:
    end = len(line)
    while end and line[end - 1] == " " and not (end >= 2 and line[end - 2] == "\\"):
        end -= 1
    return line[:end]


def ignored(rules: tuple[Rule, ...], rel: str, is_dir: bool) -> bool:
    """Whether the entry at `rel` (workspace path, os.fsdecode form) is ignored: the last rule that matches decides."""
    name = rel.rpartition("/")[2]
    for rule in reversed(rules):
        if rule.dir_only and not is_dir:
            continue
        if rule.base and not rel.startswith(rule.base + "/"):
            continue  # a rule holds under its ignore file's directory only
        if rule.anchored:
            if not _match_parts(rule.parts, tuple((rel[len(rule.base) + 1 :] if rule.base else rel).split("/"))):
                continue
        elif not _match_name(rule.parts[0], name):
            continue
        return not rule.negate
    return False


def _match_parts(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Components against components, `**` any number of them: a table, len(pattern) x len(path)."""
    n = len(path)
    can = [False] * (n + 1)  # can[j]: the pattern so far matches path[:j]
    can[0] = True
    for part in pattern:
        nxt = [False] * (n + 1)
        if part == "**":
            reached = False
            for j in range(n + 1):
                reached = reached or can[j]
                nxt[j] = reached
        else:
            for j in range(n):
                if can[j] and _match_name(part, path[j]):
                    nxt[j + 1] = True
        can = nxt
    return can[n]


def _match_name(pattern: str, name: str) -> bool:
    if not any(c in pattern for c in "*?[\\"):
        return pattern == name
    return _compiled(pattern).match(name) is not None


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    """fnmatch's regex of a git glob (its `\\x` escapes as one-character sets; `**` in a name is `*`)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(f"[{nxt}]" if nxt in "*?[\\" else nxt)  # outside a set, fnmatch takes the rest as they are
            i += 2
            continue
        if c == "*":
            while i + 1 < len(pattern) and pattern[i + 1] == "*":
                i += 1
        out.append(c)
        i += 1
    return re.compile(fnmatch.translate("".join(out)))
