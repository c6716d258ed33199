"""Where the programs the host starts for the user come from (issue 49): a hook's (hooks/), an MCP
server's (tools/mcp/launch.py), each found once, at the session's start, outside every place the
box can write, and run by those absolute paths so nothing is looked up again.

The user's PATH often has the workspace first (an active project venv, direnv's `PATH_add`,
node_modules/.bin, `.`), and the box writes the workspace: a `sh` or `python3` it drops there, or a
`.pth` file in the venv's site-packages, would run on the host at a hook's next run. So:

- its PATH (`search_path`) keeps only absolute entries the box cannot change (programs/reach.py):
  no entry that lies under a box root, or passes through one, as spelt or as any of its directories
  resolves (a link into the workspace; a workspace directory that is a link out, which the box can
  repoint);
- its program is found on that PATH (or named by an absolute path), then its `#!` line is read
  (at most 256 bytes, as the kernel reads it): the interpreter it names, and for `/usr/bin/env X`
  (or `env -S "X args"`) X found on that PATH, must lie outside every box root too; an interpreter
  that is a script itself is followed the same way, a few levels deep, as the kernel would;
- it then runs as `[interpreter, args..., script, args...]`, every program by its absolute path
  (`Resolved`). A program or interpreter that lies where the box can write is refused at the start
  (OpenAgentsError, config_invalid, naming it); one that cannot be found or run is a `problem`: a
  hook fails at its point (closed, at a Before* point), as a missing program always did; an MCP
  server is left out, named.

Nothing here reads a file under a box root: a path is checked before its `#!` line is read, and a
hook's pinned copy (policy/pins.py hook_script) lies in the session's own directory (`exempt`).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import ErrorType, OpenAgentsError
from .reach import reaches, under

SHEBANG_CAP = 256  # the kernel reads this much of a #! line (BINPRM_BUF_SIZE)
MAX_LEVELS = 4  # #! interpreters that are scripts themselves, followed this deep
WHERE = "where the sandbox can write"


@dataclass(frozen=True)
class SearchPath:
    """The PATH a hook or an MCP server gets, and each entry of the user's left out and why
    (`given`: the user's PATH it was made from)."""

    dirs: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...] = ()
    given: str | None = None

    @property
    def value(self) -> str:
        return ":".join(self.dirs)


def search_path(roots: Sequence[Path], value: str | None = None) -> SearchPath:
    """The user's PATH (`value`, default $PATH) without its relative or empty entries and without any
    entry the box could change (`reaches`); the system default's safe entries if none is left."""
    given = os.environ.get("PATH", os.defpath) if value is None else value
    kept: list[str] = []
    left_out: list[tuple[str, str]] = []
    memo: dict[str, str | None] = {}
    for entry in given.split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            left_out.append((entry, "a relative or empty entry (it names the working directory)"))
        elif reaches(entry, roots, memo):
            left_out.append((entry, WHERE))
        elif entry not in kept:
            kept.append(entry)
    if not kept:
        kept = [d for d in os.defpath.split(os.pathsep) if d and os.path.isabs(d) and not reaches(d, roots)]
    return SearchPath(tuple(kept), tuple(left_out), given)


def which(name: str, search: SearchPath) -> str | None:
    """`name` on that PATH: the absolute path as found (not yet resolved), or None."""
    for folder in search.dirs:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def found_inside(name: str, roots: Sequence[Path], value: str | None = None) -> str | None:
    """Where the user's own PATH finds `name` first, when that lies where the box can write (a
    relative entry counts from the working directory, as a lookup would), else None."""
    given = os.environ.get("PATH", os.defpath) if value is None else value
    for entry in given.split(os.pathsep):
        candidate = os.path.abspath(os.path.join(entry or ".", name))
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate if not os.path.isabs(entry) or reaches(candidate, roots) else None
    return None


@dataclass(frozen=True)
class Resolved:
    """What a hook or an MCP server runs: `argv` with every program by an absolute path, `executable`
    the real path the kernel is given. `program`: its own program (real path); `interpreter`: the one its `#!`
    line names (real path; None for a binary). `notes`: what the user's PATH would have run from
    where the box writes instead. `problem`: why it cannot run (a hook then fails at its point)."""

    argv: tuple[str, ...]
    executable: str
    program: str
    interpreter: str | None = None
    notes: tuple[str, ...] = ()
    problem: str = ""


class _Cannot(Exception):
    """It cannot run (a missing program, a #! line the kernel would refuse): a problem, not a refusal."""


def _refuse(message: str) -> OpenAgentsError:
    return OpenAgentsError(ErrorType.CONFIG_INVALID, message)


class _Resolver:
    def __init__(
        self, roots: Sequence[Path], search: SearchPath, exempt: Sequence[Path], memo: dict[str, str | None]
    ) -> None:
        self.roots, self.search = list(roots), search
        self.exempt = [Path(os.path.realpath(p)) for p in exempt]
        self.notes: list[str] = []
        self.memo = memo

    def boxed(self, path: str) -> bool:
        if self.exempt and under(os.path.realpath(path), self.exempt) is not None:
            return False  # a copy pinned in the session's own directory, which no box mounts
        return reaches(path, self.roots, self.memo)

    def find(self, name: str, what: str) -> str:
        """A bare name on the clean PATH; refused when only the box's copy would be found."""
        if "/" in name:  # env given a path: used as it is (chain checks it), never searched
            if not os.path.isabs(name):
                raise _Cannot(f"{what} {name!r} is relative: it runs in an empty directory of its own")
            return name
        found = which(name, self.search)
        inside = found_inside(name, self.roots, self.search.given)
        where = (
            (WHERE if reaches(inside, self.roots, self.memo) else "through a relative PATH entry")
            if inside is not None
            else ""
        )
        if found is None:
            if inside is not None:
                raise _refuse(
                    f"{what} {name!r} is found only at {inside}, {where}: not run (install it outside the workspace, "
                    "or name it by an absolute path outside)"
                )
            raise _Cannot(f"{what} {name!r} is not on PATH (searched {self.search.value or 'nothing'})")
        if inside is not None:
            self.notes.append(f"your PATH finds {name} at {inside}, {where}: not used; {found} runs")
        return found

    def chain(self, spelled: str, what: str, depth: int = 0) -> tuple[list[str], str, str | None]:
        """The argv prefix that runs `spelled` (its interpreters first), the real executable, and its interpreter."""
        if self.boxed(spelled):
            raise _refuse(f"{what} {spelled} lies {WHERE}: not run")
        real = os.path.realpath(spelled)
        line = self.shebang(real, spelled)
        if line is None:
            return [spelled], real, None
        if depth >= MAX_LEVELS:
            raise _Cannot(f"{spelled}: over {MAX_LEVELS} levels of #! interpreters")
        interpreter, arg = line
        if not os.path.isabs(interpreter):
            raise _Cannot(f"the #! line of {spelled} names {interpreter!r}, not an absolute path")
        if self.boxed(interpreter):
            raise _refuse(f"the interpreter on the #! line of {spelled}, {interpreter}, lies {WHERE}: not run")
        if os.path.basename(interpreter) == "env" or os.path.basename(os.path.realpath(interpreter)) == "env":
            target, extra = _env_words(arg, spelled)
            self.no_box_words([target, *extra], spelled)
            found = self.find(target, f"the interpreter of {spelled} (#!{interpreter} {arg})")
            inner, executable, _ = self.chain(found, f"the interpreter of {spelled}", depth + 1)
            return [*inner, *extra, real], executable, os.path.realpath(found)
        self.no_box_words([arg] if arg else [], spelled)
        inner, executable, _ = self.chain(interpreter, f"the interpreter of {spelled}", depth + 1)
        return [*inner, *([arg] if arg else []), real], executable, os.path.realpath(interpreter)

    def no_box_words(self, words: list[str], spelled: str) -> None:
        """A #! line's absolute words (`--require /repo/x.js`,
        `/repo/venv/bin/python3` after env) must lie outside too."""
        for word in words:
            value = word.split("=", 1)[-1] if word.startswith("-") else word
            if os.path.isabs(value) and self.boxed(value):
                raise _refuse(f"the #! line of {spelled} names {value}, {WHERE}: not run")

    @staticmethod
    def shebang(real: str, spelled: str) -> tuple[str, str | None] | None:
        """The #! line's interpreter and its one argument (as the kernel splits it), or None for a binary."""
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise _Cannot(f"{spelled} is not a file ({err.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Cannot(f"{spelled} is not a file")
            if not os.access(real, os.X_OK):
                raise _Cannot(f"{spelled} is not executable (chmod +x)")
            head = os.read(fd, SHEBANG_CAP)
        finally:
            os.close(fd)
        if not head.startswith(b"#!"):
            return None
        line = head[2:].split(b"\n", 1)[0].strip(b" \t")
        if not line:
            raise _Cannot(f"{spelled}: an empty #! line")
        parts = re.split(rb"[ \t]+", line, maxsplit=1)
        arg = parts[1].strip(b" \t") if len(parts) > 1 else b""
        return os.fsdecode(parts[0]), (os.fsdecode(arg) if arg else None)


def _env_words(arg: str | None, spelled: str) -> tuple[str, list[str]]:
    """`#!/usr/bin/env X` or `#!/usr/bin/env -S X args`: X and the args (other env options are refused)."""
    words: list[str]
    if arg is not None and (arg.startswith("-S") or arg.startswith("--split-string")):
        rest = arg[2:] if arg.startswith("-S") else arg[len("--split-string") :].lstrip("=")
        try:
            words = shlex.split(rest)
        except ValueError:
            raise _Cannot(f"the #! line of {spelled}: env -S's words do not split") from None
    else:
        words = [arg] if arg else []
    if not words or words[0].startswith("-") or "=" in words[0]:
        raise _Cannot(
            f"the #! line of {spelled} gives env no program, or options or variables other than -S: "
            "name the interpreter by its absolute path"
        )
    return words[0], words[1:]


def resolve(
    argv: Sequence[str],
    roots: Sequence[Path],
    search: SearchPath,
    exempt: Sequence[Path] = (),
    memo: dict[str, str | None] | None = None,
) -> Resolved:
    """The command as it will run (see the module's docstring). Raises OpenAgentsError
    (config_invalid) when its program or an interpreter lies where the box can write. `memo`:
    the links read so far at this start (shared by its hooks)."""
    resolver = _Resolver(roots, search, exempt, {} if memo is None else memo)
    word, rest = argv[0], list(argv[1:])
    try:
        if "/" not in word:
            spelled = resolver.find(word, "its program")
        elif not os.path.isabs(word):
            raise _Cannot(
                f"{word} is relative: it runs in an empty directory of its own, so name its program by an absolute path"
            )
        else:
            spelled = word
        prefix, executable, interpreter = resolver.chain(spelled, "its program")
        if (
            interpreter is None
            and os.path.basename(executable) == "env"
            and rest
            and not rest[0].startswith("-")
            and "=" not in rest[0]
        ):
            found = resolver.find(rest[0], "the program env runs")  # ["env", "X", ...]: X found now, as a #! line's
            prefix, executable, interpreter = resolver.chain(found, "the program env runs")
            rest = rest[1:]
    except _Cannot as why:
        return Resolved(tuple(argv), word, word, None, tuple(resolver.notes), str(why))
    return Resolved(tuple([*prefix, *rest]), executable, os.path.realpath(spelled), interpreter, tuple(resolver.notes))
