"""What the host runs and imports, and whether any of it lies where a box writes (issue 49).

The host's own Python installation is code it runs at every start: a `.pth` file in a
site-packages directory runs at every interpreter start (this command's next run, and every
Python child it starts, `-I` or not), and the entry script (`oa-sandbox`) runs as it is. The usual
layout puts a project's virtualenv in the repository (`python -m venv .venv`, uv, poetry), so a
user running `.venv/bin/oa-sandbox run --workspace .` in bind mode would hand the box what the
host runs next.

`host_paths()` lists, for the running process: sys.prefix, sys.exec_prefix and their base ones,
the interpreter (sys.executable as spelled: a venv's is a link), the entry script (sys.argv[0]),
every sys.path entry ('' is the working directory), the user site-packages when it is enabled,
the directory of every loaded module and every path a setuptools editable finder maps (an
editable install puts its packages there without putting them on sys.path), the user's config
directory and the state directory. `found_in()` says which lie in the workspace or the state
directory, each by programs/reach.py (the one answer to "can the box change what this path
names": by spelling, against the root as given and as resolved, and along its resolution: every
symbolic link met on the way is a place the box could re-point if it lies in the root, and so is
where the path ends).

`guard()` is the one decision, taken at every session's open (session.open_session: every
front-end goes through it) and shown by `oa-sandbox doctor`: in bind mode none of these may lie
in the workspace. `auto` then works on a copy, and one line says why; an explicit bind mode is
refused (HostCodeInWorkspace, naming what was found and what to do) unless host_code_read_only
(--host-code-read-only) is given: then the top-level entries that hold them are mounted read-only
in the box (sandbox/mounts.py: the daemon's own read-only bind, which no runtime writes through,
runsc's directfs included). The top-level entry is mounted, not the directory found, because the
box could rename any directory above a deeper mount point and put its own in its place; the
workspace's top is the box's own mount point, which it cannot rename. What cannot be covered that
way (the workspace itself on the import path, a top-level link, an entry not there yet) is
refused under the override too. In the state directory (where copy mode's copies lie) nothing of
the host's may lie in any mode. Copy mode's apply leaves out, and lists, every change at, under or
above these paths (`keep_out`, workspace/review/plan.py), so a box cannot land a `.pth` there either.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import state
from ..boxfs import show
from ..errors import ErrorType, OpenAgentsError
from ..programs.reach import forms, reach
from .records import WorkspaceMode, resolve_mode

if TYPE_CHECKING:
    from ..config import SandboxConfig

STATE_DIR = "the state directory"
CONFIG_DIR = "the config directory"
SHOWN = 3  # findings named in one line; `oa-sandbox doctor` lists them all


@dataclass(frozen=True)
class HostPath:
    what: str  # e.g. "sys.prefix", "a sys.path entry", "the directory of module orchestrator"
    path: str  # absolute, as the host spells it


@dataclass(frozen=True)
class Found:
    """A host path that lies in the workspace (or in the state directory)."""

    what: str
    path: str  # as the host spells it
    rels: tuple[
        str, ...
    ]  # its places under the root ('' the root itself): where it ends first, then its spelling and each link on its way
    in_state: bool = False

    @property
    def rel(self) -> str:
        return self.rels[0]

    def line(self) -> str:
        return f"{self.what} {show(self.rel) if self.rel else show(self.path) + ' (the workspace itself)'}"


class HostCodeInWorkspace(OpenAgentsError):
    """Bind mode refused: what the host runs or imports lies where the box would write (CONFIG_INVALID).
    `found`: each such path."""

    def __init__(self, message: str, found: list[Found]) -> None:
        super().__init__(ErrorType.CONFIG_INVALID, message)
        self.found = found


def host_paths() -> list[HostPath]:
    """What this process runs and imports, and where its config and state are (see the module's doc)."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    raw: dict[str, str] = {}  # path as given -> what it is (the first reason kept)

    def add(what: str, path: object) -> None:
        if not isinstance(path, str):
            if not isinstance(path, (bytes, os.PathLike)):
                return
            path = os.fsdecode(path)
        if path and path not in raw and "\0" not in path:
            raw[path] = what

    for name in ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix"):
        add(f"sys.{name}", getattr(sys, name, None))
    add("the interpreter (sys.executable)", sys.executable)
    add("the base interpreter", getattr(sys, "_base_executable", None))
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and not argv0.startswith("-"):  # -c, and -m's before it is set: no file
        add("the entry script (sys.argv[0])", argv0)
    for entry in list(sys.path):
        add("a sys.path entry", entry or cwd)
    import site

    if site.ENABLE_USER_SITE:
        add("the user site-packages", site.getusersitepackages())
    for name, module in list(sys.modules.items()):
        _module_paths(name, module, add)
    add(CONFIG_DIR, str(state.config_path().parent))
    add(STATE_DIR, str(state.configured_root()))
    out: dict[str, HostPath] = {}
    for path, what in raw.items():
        absolute = os.path.join(cwd, path)
        if absolute not in out:
            out[absolute] = HostPath(what, absolute)
    return list(out.values())


def _module_paths(name: str, module: object, add: Callable[[str, object], None]) -> None:
    try:
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            add(f"the directory of module {name}", file.rpartition("/")[0])
        for entry in list(getattr(module, "__path__", None) or ()):
            add(f"the directory of package {name}", entry)
        if name.startswith("__editable__"):  # a setuptools editable finder: its packages' places, imported or not
            for package, place in dict(getattr(module, "MAPPING", None) or {}).items():
                add(f"the editable install of {package}", place)
            for package, places in dict(getattr(module, "NAMESPACES", None) or {}).items():
                for place in list(places):
                    add(f"the editable install of {package}", place)
    except Exception:  # noqa: BLE001 - a module object of any kind (a lazy one may raise): what it does not say is not there
        return


def found_in(workspace: Path | str, paths: list[HostPath] | None = None) -> list[Found]:
    """Which of `paths` (default: host_paths()) lie in the workspace or in the state directory."""
    ws_roots, state_roots = forms(workspace), forms(state.configured_root())
    memo: dict[str, str | None] = {}
    out = []
    for host in host_paths() if paths is None else paths:
        rels = reach(host.path, ws_roots, memo)
        if rels:
            out.append(Found(host.what, host.path, rels))
        elif host.what not in (STATE_DIR, CONFIG_DIR) and (
            rels := reach(host.path, state_roots, memo)
        ):  # a config file there is refused as it is read
            out.append(Found(host.what, host.path, rels, in_state=True))
    return sorted(out, key=lambda f: (f.in_state, f.rel.count("/") + bool(f.rel), len(f.rel)))


def summary(found: list[Found], limit: int = SHOWN) -> str:
    """One line: the shallowest findings, each with how many others lie in it."""
    groups: list[list[Found]] = []
    for item in found:
        group = next(
            (g for g in groups if not g[0].rel or item.rel == g[0].rel or item.rel.startswith(g[0].rel + "/")), None
        )
        if group is None:
            groups.append([item])
        else:
            group.append(item)
    parts = [
        g[0].line() + (f" (and {len(g) - 1} more of the host's paths in it)" if len(g) > 1 else "")
        for g in groups[:limit]
    ]
    more = (
        f"; and {len(groups) - limit} more: `oa-sandbox doctor --workspace DIR` lists every one"
        if len(groups) > limit
        else ""
    )
    return "; ".join(parts) + more


def read_only_tops(workspace: Path | str, found: list[Found]) -> tuple[list[str], list[str]]:
    """The workspace's top-level entries that hold `found` (to mount read-only), and why any cannot be."""
    tops: set[str] = set()
    problems: list[str] = []
    for item in found:
        for rel in item.rels:
            top = rel.split("/", 1)[0]
            if not rel:
                problems.append(f"{item.line()} is the workspace itself")
                continue
            if top == ".git":  # every .git of the workspace is mounted read-only already (sandbox/docker.py git_mounts)
                continue
            try:
                st = os.lstat(os.path.join(workspace, top))
            except OSError:
                problems.append(f"{show(top)} ({item.what}) is not there yet: the box could make it")
                continue
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{show(top)} ({item.what}) is a symbolic link, which no read-only mount covers")
            elif stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                tops.add(top)
            else:
                problems.append(f"{show(top)} ({item.what}) is neither a directory nor a file")
    return sorted(tops), list(dict.fromkeys(problems))


@dataclass
class Guard:
    """What `guard` decided: the mode the session goes on with, the entries mounted read-only, the
    line that says why `auto` became copy, or the refusal."""

    found: list[Found]
    mode: WorkspaceMode
    read_only: list[str] = field(default_factory=list)
    note: str = ""
    error: HostCodeInWorkspace | None = None

    def raise_refusal(self) -> None:
        if self.error is not None:
            raise self.error


def guard(
    workspace: Path,
    mode: WorkspaceMode,
    config: SandboxConfig,
    *,
    fixed_bind: str = "",
    instead: str = "",
    api: bool = False,
    found: list[Found] | None = None,
) -> Guard:
    """The one decision on host code in the workspace (see the module's doc). `fixed_bind`: why the
    session is bind mode whatever `mode` says (a warm pool's box, a bind session resumed), else "";
    `instead`: what to do then rather than copy mode. `api`: the program used the Python API (its
    messages name the keywords, not the flags)."""
    found = found_in(workspace) if found is None else found
    words = _Words(api)
    if instead:
        words.copy = instead
    in_state = [f for f in found if f.in_state]
    if in_state:
        return Guard(
            found,
            mode,
            error=HostCodeInWorkspace(
                "what the host runs or imports lies in the state directory "
                f"{show(str(state.configured_root()))}, where copy mode's copies (the box's) lie: "
                f"{summary(in_state)}; set XDG_STATE_HOME to a directory apart from the host's installation",
                in_state,
            ),
        )
    in_ws = [f for f in found if not f.in_state]
    if not in_ws or (mode == WorkspaceMode.COPY and not fixed_bind):
        return Guard(found, mode)
    what = summary(in_ws)
    if mode == WorkspaceMode.AUTO and not fixed_bind:
        try:
            if resolve_mode(workspace, mode, config.user)[0] == WorkspaceMode.COPY:
                return Guard(found, mode)  # a copy anyway (a root-owned workspace)
        except OpenAgentsError:
            return Guard(found, mode)  # the session's own resolve_mode says why
        if not config.host_code_read_only:
            return Guard(
                found,
                WorkspaceMode.COPY,
                note=(
                    f"copy mode: what the host runs or imports lies inside the workspace: {what}. In bind "
                    "mode the box could change it, so the box works on a copy. For bind mode, move it out "
                    f"of the workspace, or pass {words.override} (it is then mounted read-only in the box)"
                ),
            )
    why = f"{fixed_bind}: " if fixed_bind else ""
    if not config.host_code_read_only:
        return Guard(
            found,
            mode,
            error=HostCodeInWorkspace(
                f"{why}bind mode refused: what the host runs or imports lies inside the workspace "
                f"{show(str(workspace))}: {what}. A box writing there (a .pth file in a site-packages runs "
                f"at every Python start) would run its code on the host at your next command. {words.copy}, "
                f"move the virtualenv or clone out of the workspace, or pass {words.override}{words.config} "
                f"to mount {_names(read_only_tops(workspace, in_ws)[0]) or 'it'} read-only in the box",
                in_ws,
            ),
        )
    tops, problems = read_only_tops(workspace, in_ws)
    if problems:
        return Guard(
            found,
            mode,
            error=HostCodeInWorkspace(
                f"{why}bind mode refused even with {words.override}: what the host runs or imports "
                f"lies inside the workspace {show(str(workspace))}, and {'; '.join(problems[:SHOWN])}. "
                f"{words.copy}, or run oa-sandbox from an installation outside the workspace",
                in_ws,
            ),
        )
    return Guard(found, mode, read_only=tops)


def _names(tops: list[str]) -> str:
    return ", ".join(show(t) for t in tops[:SHOWN]) + (f" and {len(tops) - SHOWN} more" if len(tops) > SHOWN else "")


class _Words:
    """The override and copy mode as the caller says them: the CLI's flags, or the API's keywords."""

    def __init__(self, api: bool) -> None:
        self.override = "host_code_read_only=True" if api else "--host-code-read-only"
        self.config = "" if api else " (host_code_read_only = true in config.toml)"
        self.copy = "Use mode='copy' (or 'auto')" if api else "Use --workspace-mode copy (or auto)"


def keep_out(workspace: Path | str, recorded: list[str] | None = None) -> dict[str, str]:
    """Workspace paths (to_store form) no landing may change, at, under or above: what the host runs
    or imports now and what the session recorded at its start (`recorded`), with what each is."""
    from ..boxfs import to_store

    out: dict[str, str] = {}
    for item in found_in(workspace):
        if not item.in_state:
            for rel in item.rels:
                out.setdefault(to_store(os.fsencode(rel)), item.what)
    for rel in recorded or []:
        out.setdefault(rel, "what the host ran or imported when the session started")
    return out


def recorded(found: list[Found]) -> list[str]:
    """`found`'s workspace paths in to_store form, for the copy's manifest (keep_out's `recorded`)."""
    from ..boxfs import to_store

    return sorted({to_store(os.fsencode(rel)) for item in found if not item.in_state for rel in item.rels})


def say(line: str) -> None:
    """A line for the person at the terminal (stderr), made visible (it may name workspace paths)."""
    from ..ground.text import visible

    sys.stderr.write(visible(f"oa-sandbox: {line}") + "\n")
    sys.stderr.flush()
