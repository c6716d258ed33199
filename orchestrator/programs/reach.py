"""Whether the box can change what a host path names (issue 49): the one answer for the host's own
code (workspace/host_code.py), hooks' and MCP servers' programs, their PATH, working directory and
HOME (programs/resolve.py, hooks/run.py, tools/mcp/launch.py), and the files the user's policies
come from (policy/pins.py).

A path is within the box's reach when, under a box root (the workspace, the state directory where
copy mode's copies lie), lies:
- the path as spelt (made absolute, `..` folded away);
- any symbolic link met while resolving it, at its own place (a directory entry: whoever writes that
  directory can re-point it), links in links' targets included, as the kernel follows them;
- the directory a `..` on the way leaves (the box could replace it with a link, and `..` would then
  go elsewhere), the root itself excepted (a box cannot move its own mount point);
- where it ends (its real path; from the first missing component on, as written: the box may make it).
`reach` says where (each place relative to the root: what a read-only mount or apply's keep-out
must cover), `reaches` only whether. A relative path always reaches (it names the working directory).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import state

MAX_LINKS = 40  # symbolic links followed in one path, as the kernel's ELOOP limit


def box_roots(workspace: Path | str) -> list[Path]:
    """Where a box can write: the workspace, and the state directory (a copy session's copy lies there)."""
    return [Path(os.path.realpath(workspace)), Path(os.path.realpath(state.configured_root()))]


def forms(root: Path | str) -> list[str]:
    """A root as spelt (absolute) and as it resolves: a place may be compared with either."""
    spelled = os.path.abspath(root)
    return list(dict.fromkeys([spelled, os.path.realpath(spelled)]))


def under(place: str, roots: Sequence[str | Path]) -> str | None:
    """`place` (absolute, normal) relative to the first root it lies in ('' the root itself), else None."""
    for root in roots:
        text = str(root)
        if place == text:
            return ""
        top = text.rstrip("/") + "/"
        if place.startswith(top):
            return place[len(top) :]
    return None


def _link(path: str, memo: dict[str, str | None]) -> str | None:
    """The target of `path` when it is a symbolic link, else None (not there, or not a link)."""
    if path not in memo:
        try:
            memo[path] = os.readlink(path) if stat.S_ISLNK(os.lstat(path).st_mode) else None
        except (OSError, ValueError):
            memo[path] = None
    return memo[path]


@dataclass(frozen=True)
class Route:
    """Where resolving an absolute path goes: each link met (at its own place), each directory a
    `..` left, and where it ends."""

    links: tuple[str, ...]
    left: tuple[str, ...]
    end: str


def route(path: str, memo: dict[str, str | None] | None = None) -> Route:
    """The walk the kernel makes resolving the absolute `path`, now. `memo`: links already read (one caller's)."""
    memo = {} if memo is None else memo
    links: list[str] = []
    left: list[str] = []
    pending = list(reversed(path.split("/")))
    here, hops = "/", 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            left.append(here)
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, part)
        target = _link(step, memo)
        if target is None:
            here = step
            continue
        links.append(step)
        hops += 1
        if hops > MAX_LINKS:
            here = os.path.normpath(os.path.join(step, *reversed(pending)))
            break
        if target.startswith("/"):
            here = "/"
        pending.extend(reversed(target.split("/")))
    return Route(tuple(links), tuple(left), here)


def reach(path: str, roots: Sequence[str | Path], memo: dict[str, str | None] | None = None) -> tuple[str, ...]:
    """Where under `roots` the box could change what the absolute `path` names (see the module's
    doc): each such place relative to its root, where the path ends first, then its spelling and
    each link on its way, then each directory a `..` left; () when none. Give `roots` in every form
    a place may be compared with (`forms`)."""
    walk = route(path, memo)
    places = [walk.end, os.path.abspath(path), *walk.links]
    found = [rel for rel in (under(p, roots) for p in places) if rel is not None]
    found += [
        rel for rel in (under(p, roots) for p in walk.left) if rel
    ]  # a `..` out of the root itself changes nothing
    return tuple(dict.fromkeys(found))


def reaches(path: str, roots: Sequence[str | Path], memo: dict[str, str | None] | None = None) -> bool:
    """Whether the box could change what `path` names (a relative path always could)."""
    return not os.path.isabs(path) or bool(reach(path, roots, memo))
