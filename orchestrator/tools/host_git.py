"""The client-side git tool: runs on the host over a working tree the sandbox writes, so it runs no
program and follows nothing the repository controls.

No `git` executable is started: the repository is read with libgit2 (pygit2), which runs no hooks,
filters, textconv, diff.external, fsmonitor, gpg or pager. libgit2 does honour core.worktree, gitfiles
and submodules, so: exactly WORKSPACE/.git is opened, once, at session start, and only if it is a real
directory whose work tree is exactly the workspace; libgit2 never walks the working tree itself (our
own walk in git_workdir does, without following links, opening FIFOs or descending into a directory
that holds a `.git` entry); submodules and nested repositories are opaque entries, never opened.
Ignore rules come from copies of the .gitignore files our walk read (a private shadow work tree for
a second repository handle): libgit2 never opens a workspace .gitignore, which the box could swap.
Pathspecs are plain workspace paths. Every output is built in a Bounded buffer.

status, diff and log are read-only (automatic); commit asks once. There is no push: a remote URL and
credentials would have to come from somewhere the box can not write, and nothing here needs it.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..boxfs import remove_path
from ..errors import ErrorType, OpenAgentsError
from ..protocol import Executor, ToolResult
from .argbase import PathError as _PathError
from .git_workdir import (
    MODE_GITLINK,
    MODE_LINK,
    Bounded,
    Full,
    PathProblem,
    Tree,
    Walk,
    WorkEntry,
    check_pathspec,
    quote,
)

if TYPE_CHECKING:  # libgit2 is loaded where a repository is opened: every session imports this tool's
    import pygit2  # definition, not every one has a repository (exec of a read tool: issue 50)

GIT_OUTPUT_CAP = 48 * 1024
DIFF_FILE_CAP = 256 * 1024  # a side larger than this is summarised, never read
LOG_MAX = 30
LOG_SCAN_MAX = 20_000
COMMAND_BUDGET_S = 120.0
FALLBACK_IDENTITY = ("OpenAgents", "openagents@localhost")


class GitArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    subcommand: Literal["status", "diff", "log", "commit"]
    message: str | None = Field(
        default=None, min_length=1, max_length=10_000, description="Commit message (commit only)."
    )
    paths: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="Plain workspace-relative paths (files or directories) to "
        "limit status, diff, log or commit to; no globs or ':' magic.",
    )

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if len(path) > 4096:
                raise ValueError("a path is at most 4096 characters")
            try:
                check_pathspec(path)
            except PathProblem as err:
                raise _PathError(err.kind, str(err)) from None
        return value


def parse_args(raw: dict[str, Any]) -> GitArgs:
    """Typed errors like the file tools: a bad path is path_invalid/path_outside_workspace, not a parse error."""
    try:
        return GitArgs.model_validate(raw)
    except ValidationError as err:
        for detail in err.errors():
            cause = (detail.get("ctx") or {}).get("error")
            if isinstance(cause, _PathError):
                raise OpenAgentsError(ErrorType(cause.kind), str(cause)) from None
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"invalid arguments for git: {err.errors()[0]['msg']}"
        ) from None


def action(args: GitArgs) -> str:
    return f"git {args.subcommand}"


def trusted_identity() -> tuple[str, str]:
    """The committer from the host's own git configuration (global, XDG, system), never the repository's."""
    import pygit2

    name = email = None
    for getter in (pygit2.Config.get_global_config, pygit2.Config.get_xdg_config, pygit2.Config.get_system_config):
        try:
            config = getter()
        except (OSError, pygit2.GitError):
            continue
        name = name or _config_str(config, "user.name")
        email = email or _config_str(config, "user.email")
    return (name or FALLBACK_IDENTITY[0], email or FALLBACK_IDENTITY[1])


def _config_str(config: pygit2.Config, key: str) -> str | None:
    import pygit2

    try:
        value = config[key]
    except (KeyError, pygit2.GitError):
        return None
    return value[:200] if isinstance(value, str) and value.strip() else None


@dataclass
class _State:
    head: dict[str, tuple[str, int]]
    index: dict[str, tuple[str, int]]
    walk: Walk
    opaque: list[str]  # gitlinks and directories holding a .git entry: left exactly as they are
    specs: list[str]

    def in_scope(self, path: str) -> bool:
        return any(s == "." or path == s or path.startswith(s + "/") for s in self.specs) and not any(
            path == o.rstrip("/") or path.startswith(o.rstrip("/") + "/") for o in self.opaque
        )


class HostRepo:
    """WORKSPACE/.git as it was at session start; refuses every operation if that has changed."""

    def __init__(
        self, workspace: str, repo: pygit2.Repository, git_key: tuple[int, int], identity: tuple[str, str]
    ) -> None:
        self.workspace = workspace
        self.repo = repo
        self.git_key = git_key
        self.identity = identity
        self.tree = Tree(workspace)
        self._hash_cache: dict[str, tuple[tuple[int, ...], str]] = {}
        self._shadow: str | None = None
        self._ignore_repo: pygit2.Repository | None = None
        self._hex_len = 40
        self._one_at_a_time = (
            threading.Lock()
        )  # a command's shadow work tree is per repo: reads batched in parallel take turns

    @classmethod
    def open_at_start(cls, workspace: Path | str) -> "HostRepo | None":
        """Call before the sandbox starts. None (the git tool is off) unless WORKSPACE/.git is a real
        directory holding a non-bare repository whose work tree is exactly the workspace."""
        return cls.inspect_at_start(workspace)[0]

    @classmethod
    def inspect_at_start(cls, workspace: Path | str) -> "tuple[HostRepo | None, str]":
        ws = os.path.realpath(workspace)
        git_dir = os.path.join(ws, ".git")
        try:
            st = os.lstat(git_dir)
        except OSError:
            return None, "no .git at session start"
        if not stat.S_ISDIR(st.st_mode):
            return None, ".git is not a real directory (a gitfile or a link): never followed"
        import pygit2
        from pygit2.enums import RepositoryOpenFlag

        previous = pygit2.settings.owner_validation
        # libgit2's owner check guards discovery; here the user named this workspace and nothing runs.
        pygit2.settings.owner_validation = False
        try:
            repo = pygit2.Repository(git_dir, RepositoryOpenFlag.NO_SEARCH)
        except (pygit2.GitError, OSError, KeyError) as err:
            return None, f"not a repository: {err}"
        finally:
            pygit2.settings.owner_validation = previous
        if repo.is_bare or not repo.workdir or os.path.normpath(repo.workdir) != ws:
            return None, f"the repository's work tree is {repo.workdir!r}, not the workspace (core.worktree refused)"
        if os.path.normpath(repo.path) != git_dir:
            return None, "the repository's git directory is not WORKSPACE/.git"
        planted = _config_files_in_workspace(repo, ws, git_dir)
        if planted:
            return None, f"the repository's config reads {planted!r} from the working tree, which the sandbox writes"
        host = cls(ws, repo, (st.st_dev, st.st_ino), trusted_identity())
        if not repo.head_is_unborn:
            host._hex_len = len(str(repo.head.target))
        return host, "open"

    # -- running a command -------------------------------------------------------------------

    def run(self, args: GitArgs) -> ToolResult:
        with self._one_at_a_time:
            return self._run(args)

    def _run(self, args: GitArgs) -> ToolResult:
        import pygit2

        out = Bounded(GIT_OUTPUT_CAP)
        notes: list[str] = []
        try:
            self._check_unchanged()
            specs = [check_pathspec(p) for p in args.paths] or ["."]
            deadline = time.monotonic() + COMMAND_BUDGET_S
            try:
                self._open_shadow()
                if args.subcommand == "log":
                    self._log(specs, out)
                elif args.subcommand == "commit":
                    self._commit(specs, args.message or "", out, notes, deadline)
                else:
                    state = self._state(specs, notes)
                    (self._status if args.subcommand == "status" else self._diff)(state, out, deadline)
            except Full:
                pass
            finally:
                self._close_shadow()
        except PathProblem as err:
            return ToolResult.failure(OpenAgentsError(_error_type(err.kind), str(err)))
        except OpenAgentsError as err:
            return ToolResult.failure(err)
        except (pygit2.GitError, OSError, KeyError, ValueError) as err:
            return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, f"git {args.subcommand} failed: {err}"[:500]))
        if out.cut:
            notes.append(f"output cut at {GIT_OUTPUT_CAP // 1024} KiB; pass paths to see the rest")
        shown = notes[:20] + ([f"... and {len(notes) - 20} more notes"] if len(notes) > 20 else [])
        return ToolResult(
            ok=True,
            output=out.text() or "(no output)",
            note="\n".join(shown),
            meta={"cut": out.cut},
            executor=Executor.OPENAGENTS,
        )

    def _open_shadow(self) -> None:
        """A private directory for this command's .gitignore copies, and a repository handle whose
        work tree it is (the real handle keeps the workspace as its work tree)."""
        import pygit2
        from pygit2.enums import RepositoryOpenFlag

        self._shadow = tempfile.mkdtemp(prefix="oa-git-ignore-")
        previous = pygit2.settings.owner_validation
        pygit2.settings.owner_validation = False
        try:
            repo = pygit2.Repository(self.repo.path, RepositoryOpenFlag.NO_SEARCH)
            repo.workdir = self._shadow
            self._ignore_repo = repo
        except (pygit2.GitError, OSError):
            self._ignore_repo = None
        finally:
            pygit2.settings.owner_validation = previous

    def _close_shadow(self) -> None:
        self._ignore_repo = None
        if self._shadow is not None:
            remove_path(self._shadow)
            self._shadow = None

    def _check_unchanged(self) -> None:
        try:
            st = os.lstat(os.path.join(self.workspace, ".git"))
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != self.git_key:
            raise OpenAgentsError(
                ErrorType.UNSAFE_WORKSPACE_FILE,
                ".git is no longer the directory opened at session start; the git tool refuses",
            )
        if os.path.normpath(self.repo.workdir or "") != self.workspace:
            raise OpenAgentsError(
                ErrorType.UNSAFE_WORKSPACE_FILE, "the repository's work tree is no longer the workspace"
            )

    # -- reading the three trees -------------------------------------------------------------

    def _head_map(self) -> dict[str, tuple[str, int]]:
        import pygit2

        if self.repo.head_is_unborn:
            return {}
        out: dict[str, tuple[str, int]] = {}
        stack: list[tuple[str, pygit2.Tree]] = [("", self.repo[self.repo.head.target].peel(pygit2.Tree))]
        while stack:
            prefix, tree = stack.pop()
            for entry in tree:
                path = prefix + (entry.name or "")  # a tree's entries always have a name
                if entry.filemode == 0o040000:
                    # peel: a tree-mode entry naming a blob (a crafted repository) is a GitError, caught as one
                    stack.append((path + "/", self.repo[entry.id].peel(pygit2.Tree)))
                else:
                    out[path] = (str(entry.id), entry.filemode)
        return out

    def _index_map(self) -> dict[str, tuple[str, int]]:
        index = self.repo.index
        index.read(True)
        return {e.path: (str(e.id), e.mode) for e in index}

    def _state(self, specs: list[str], notes: list[str]) -> _State:
        head, index = self._head_map(), self._index_map()
        gitlinks = {p for p, (_, mode) in {**head, **index}.items() if mode == MODE_GITLINK}
        tracked = {p for p in index if p not in gitlinks}
        tracked_dirs = {p[:i] for p in tracked for i in range(len(p)) if p[i] == "/"}
        for spec in specs:
            if (
                spec != "."
                and self.tree.check_spec(spec) is None
                and not any(p == spec or p.startswith(spec + "/") for p in {**head, **index})
            ):
                raise PathProblem("file_not_found", f"{spec!r} does not exist in the workspace or the repository")

        def skip(rel: str, is_dir: bool, ignore_ok: bool) -> bool:
            if rel in gitlinks:
                return True
            if rel in (tracked_dirs if is_dir else tracked):
                return False
            return ignore_ok and self._ignored(rel, is_dir)

        walk = Walk()
        tree = Tree(self.workspace, shadow=self._shadow)
        for spec in specs:
            tree.walk(spec, skip, walk)
        notes.extend(walk.notes)
        opaque = sorted(set(walk.opaque) | {g + "/" for g in gitlinks})
        for path in walk.opaque:
            notes.append(f"{quote(path)} holds a .git entry: a nested repository, shown as one entry and never opened")
        if walk.truncated:
            notes.append(f"more than {len(walk.files)} files: the walk stopped there")
        return _State(head, index, walk, opaque, specs)

    def _ignored(self, rel: str, is_dir: bool) -> bool:
        """Asked of a second handle on the same repository whose work tree is this command's
        shadow: libgit2 reads only the .gitignore copies the walk took (git_workdir.Tree)."""
        import pygit2

        if self._ignore_repo is None:
            return False
        try:
            return bool(self._ignore_repo.path_is_ignored(rel + "/" if is_dir else rel))
        except (pygit2.GitError, ValueError):  # ValueError: a name libgit2 cannot take (not UTF-8): never ignored
            return False

    def _work_id(self, entry: WorkEntry, known: tuple[str, int] | None) -> str | None:
        """The blob id of a working file; None when it differs from `known` for sure (size) or is not a file."""
        import pygit2

        if entry.mode == 0:
            return None
        cached = self._hash_cache.get(entry.path)
        if cached and cached[0] == entry.key:
            return cached[1]
        if known is not None and known[1] != MODE_GITLINK:
            try:
                if self.repo.odb.read_header(known[0])[1] != entry.size:
                    return None
            except (pygit2.GitError, KeyError, ValueError):
                pass
        oid = self.tree.blob_id(entry, self._hex_len)
        if len(self._hash_cache) < 200_000:
            self._hash_cache[entry.path] = (entry.key, oid)
        return oid

    def _same(self, entry: WorkEntry | None, known: tuple[str, int] | None) -> bool:
        if entry is None or known is None:
            return entry is None and known is None
        if entry.mode == 0 or entry.mode != known[1]:
            return False
        return self._work_id(entry, known) == known[0]

    # -- the commands ------------------------------------------------------------------------

    def _status(self, state: _State, out: Bounded, deadline: float) -> None:
        out.write(self._branch_line())
        paths = sorted({p for p in (*state.head, *state.index, *state.walk.files) if state.in_scope(p)})
        for path in paths:
            _check_deadline(deadline)
            head, index, work = state.head.get(path), state.index.get(path), state.walk.files.get(path)
            if index is None and head is None:
                kind = "" if work is None or work.mode else " (not a regular file: not read)"
                out.write(f"?? {quote(path)}{kind}\n")
                continue
            x = " " if head == index else ("A" if head is None else "D" if index is None else "M")
            if index is None:
                y = " "
            elif work is None:
                y = "D"
            elif work.mode == 0:
                y = "T"
            else:
                y = " " if self._same(work, index) else "M"
            if x != " " or y != " ":
                out.write(f"{x}{y} {quote(path)}{' (not a regular file: not read)' if y == 'T' else ''}\n")
        for path in state.opaque:
            if any(s == "." or path.startswith(s + "/") for s in state.specs):
                out.write(f"-- {quote(path)} (nested repository or submodule: not opened)\n")

    def _branch_line(self) -> str:
        if self.repo.head_is_unborn:
            return "## No commits yet\n"
        if self.repo.head_is_detached:
            return f"## HEAD (detached at {str(self.repo.head.target)[:10]})\n"
        return f"## {quote(self.repo.head.shorthand)}\n"

    def _diff(self, state: _State, out: Bounded, deadline: float) -> None:
        """What commit would record: HEAD to the working tree, new files included."""
        changed = []
        for path in sorted({p for p in (*state.head, *state.walk.files) if state.in_scope(p)}):
            _check_deadline(deadline)
            old, new = state.head.get(path), state.walk.files.get(path)
            if not self._same(new, old):
                changed.append((path, old, new))
        if not changed:
            out.write("(no changes against HEAD)\n")
            return
        out.write(f"{len(changed)} file(s) changed against HEAD\n")
        for path, old, new in changed:
            _check_deadline(deadline)
            self._file_patch(path, old, new, out)

    def _file_patch(self, path: str, old: tuple[str, int] | None, new: WorkEntry | None, out: Bounded) -> None:
        import pygit2

        q = quote(path)
        out.write(f"diff --git a/{q} b/{q}\n")
        if old is None:
            out.write(
                f"new file mode {new.mode:06o}\n" if new and new.mode else "new entry (not a regular file: not read)\n"
            )
        elif new is None:
            out.write(f"deleted file mode {old[1]:06o}\n")
        elif new.mode == 0:
            out.write("now not a regular file: not read\n")
            return
        elif old[1] != new.mode:
            out.write(f"old mode {old[1]:06o}\nnew mode {new.mode:06o}\n")
        if new is not None and new.mode == 0:
            return
        old_size = self.repo.odb.read_header(old[0])[1] if old else 0
        new_size = new.size if new else 0
        if max(old_size, new_size) > DIFF_FILE_CAP:
            out.write(f"binary/large, {old_size} -> {new_size} bytes\n")
            return
        old_bytes = self.repo[old[0]].read_raw() if old else b""
        new_bytes = self.tree.read_head(path, DIFF_FILE_CAP) if new else b""
        if b"\0" in old_bytes[:8000] or b"\0" in new_bytes[:8000]:
            out.write(f"binary/large, {old_size} -> {new_size} bytes\n")
            return
        # only the hunks are kept: the name (maybe not UTF-8, which libgit2 refuses) is shown by quote() above
        patch = pygit2.Patch.create_from(old_bytes, new_bytes, old_as_path="file", new_as_path="file", context_lines=3)
        text = patch.text or ""
        start = text.find("\n@@")
        out.write(f"--- {'a/' + q if old else '/dev/null'}\n+++ {'b/' + q if new else '/dev/null'}\n")
        if start >= 0:
            out.write(text[start + 1 :])

    def _log(self, specs: list[str], out: Bounded) -> None:
        from pygit2.enums import SortMode

        if self.repo.head_is_unborn:
            out.write("(no commits yet)\n")
            return
        shown = scanned = 0
        for commit in self.repo.walk(self.repo.head.target, SortMode.TIME):
            scanned += 1
            if scanned > LOG_SCAN_MAX or shown >= LOG_MAX:
                break
            if specs != ["."] and not any(self._touches(commit, s) for s in specs):
                continue
            subject = (commit.message or "").split("\n", 1)[0][:200]
            out.write(f"{str(commit.id)[:10]} {quote(subject)}\n")
            shown += 1

    @staticmethod
    def _touches(commit: pygit2.Commit, path: str) -> bool:
        def at(c: pygit2.Commit) -> str | None:
            try:
                return str(c.tree[path].id)
            except KeyError:
                return None

        mine = at(commit)
        parents = commit.parents
        return (mine is not None) if not parents else any(at(p) != mine for p in parents)

    def _commit(self, specs: list[str], message: str, out: Bounded, notes: list[str], deadline: float) -> None:
        import pygit2
        from pygit2.enums import FileMode

        state = self._state(specs, notes)
        if state.walk.truncated:
            raise OpenAgentsError(ErrorType.RESOURCE_EXHAUSTED, "too many files to commit at once; give paths")
        index = self.repo.index
        for path in sorted({p for p in (*state.index, *state.walk.files) if state.in_scope(p)}):
            _check_deadline(deadline)
            known, work = state.index.get(path), state.walk.files.get(path)
            if work is None:
                index.remove(path)
            elif work.mode == 0:
                notes.append(f"{quote(path)} is not a regular file: not committed")
            elif not _utf8(path):
                notes.append(f"{quote(path)}: the name is not valid UTF-8: not committed")
            elif not self._same(work, known):
                index.add(pygit2.IndexEntry(path, self._write_blob(work), FileMode(work.mode)))
        tree_id = index.write_tree()
        parents = [] if self.repo.head_is_unborn else [self.repo.head.target]
        if parents and self.repo[parents[0]].peel(pygit2.Tree).id == tree_id:
            out.write("nothing to commit\n")
            return
        index.write()
        name, email = self.identity
        signature = pygit2.Signature(name, email)
        oid = self.repo.create_commit("HEAD", signature, signature, message, tree_id, parents)
        out.write(f"[{quote(self.repo.head.shorthand)} {str(oid)[:10]}] {quote(message.splitlines()[0][:200])}\n")

    def _write_blob(self, work: WorkEntry) -> pygit2.Oid:
        if work.mode == MODE_LINK:
            return self.repo.create_blob(self.tree.readlink(work.path))
        fd, _ = self.tree.open_regular(work.path)
        with os.fdopen(fd, "rb") as stream:
            return self.repo.create_blob_fromiobase(stream)


def _config_files_in_workspace(repo: pygit2.Repository, ws: str, git_dir: str) -> str | None:
    """An include or excludes file the config names inside the working tree (outside .git) would let the
    box rewrite the config later (core.worktree) or hand libgit2 a FIFO; such a repository is refused."""
    for entry in repo.config:
        name = entry.name.lower()
        if not (name.endswith(".path") and name.startswith(("include.", "includeif.")) or name == "core.excludesfile"):
            continue
        value = os.path.expanduser(entry.value or "")
        real = os.path.realpath(os.path.join(git_dir, value))
        inside = real == ws or real.startswith(ws + "/")
        if inside and not (real == git_dir or real.startswith(git_dir + "/")):
            return entry.value
    return None


def _check_deadline(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise OpenAgentsError(ErrorType.TIMEOUT, f"git took longer than {COMMAND_BUDGET_S:.0f}s")


def _error_type(kind: str) -> ErrorType:
    try:
        return ErrorType(kind)
    except ValueError:
        return ErrorType.IO_ERROR


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def run_git(repo: HostRepo | None, args: GitArgs) -> ToolResult:
    if repo is None:
        return ToolResult.failure(
            OpenAgentsError(
                ErrorType.TOOL_DISABLED, "the git tool is off: the workspace had no usable .git at session start"
            )
        )
    return repo.run(args)
