"""Restore: the workspace made exactly one checkpoint again, or nothing changed at all.

The workspace may hold anything the box left, so restore reads it through boxfs and compares
before it writes: a path that differs from what the store last knew is a conflict, and one conflict
means nothing is touched; `.git` entries, paths the checkpoint skipped and a HEAD or commondir that
would make a directory a repository git obeys are never written. Writes are atomic, holes kept.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import stat
from pathlib import Path
from typing import Iterable, Protocol

import pygit2

from ...boxfs import BoxDir, BudgetExceeded, HostBudget, Walk, from_store, open_dir, to_store
from ...errors import ErrorType, OpenAgentsError
from ..integrity import is_git_name
from .index import Checkpoint, Conflict, RestoreReport, Skipped
from .objects import MODE_EXEC, MODE_FILE, MODE_LINK, MODE_TREE, _object


class _Store(Protocol):
    """What restore reads of a CheckpointStore (named by its parts: the store imports restore)."""

    repo: pygit2.Repository
    workspace: Path
    max_file_bytes: int


_State = tuple[
    object, ...
]  # what a path is: ("file", perm, oid[, uid, gid]), ("link", target), ("dir", perm[, uid, gid]), ("special",)


class _Picture:
    """One checkpoint as paths (workspace bytes) -> what each is, with its exact mode and owner."""

    def __init__(self, store: _Store, cp: Checkpoint, owners: bool) -> None:
        repo = store.repo
        self.blobs: dict[bytes, pygit2.Oid] = {}
        self.states: dict[bytes, _State] = {}
        modes: dict[bytes, tuple[int, int, int]] = {}
        owner: tuple[int, int]
        if cp.meta is not None:
            doc = json.loads(_object(repo, pygit2.Oid(hex=cp.meta), pygit2.Blob).data)
            owner = (int(doc["owner"][0]), int(doc["owner"][1]))
            modes = {from_store(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in doc["modes"].items()}
        else:  # an older checkpoint: 0644/0755 and the workspace's owner, as it was restored then
            ws_st = os.stat(store.workspace)
            owner = (ws_st.st_uid, ws_st.st_gid)
        self.owner = owner
        name_of = from_store if cp.names == "store" else os.fsencode
        self.skipped = {name_of(s.path) for s in cp.skipped}
        stack: list[tuple[bytes, pygit2.Tree]] = [(b"", _object(repo, pygit2.Oid(hex=cp.commit), pygit2.Commit).tree)]
        while stack:
            prefix, tree = stack.pop()
            for e in tree:
                if e.name is None:
                    continue
                name = name_of(e.name)
                if not _plain_name(name):
                    continue  # our own trees hold nothing else; a tampered store must not make restore write elsewhere
                rel = prefix + b"/" + name if prefix else name
                m = modes.get(rel)
                if e.filemode == MODE_TREE:
                    perm, uid, gid = m if m is not None else (0o755, *owner)
                    self.states[rel] = ("dir", perm, uid, gid) if owners else ("dir", perm)
                    stack.append((rel, _object(repo, e.id, pygit2.Tree)))
                elif e.filemode == MODE_LINK:
                    self.states[rel] = ("link", _object(repo, e.id, pygit2.Blob).data)
                    self.blobs[rel] = e.id
                elif e.filemode in (MODE_FILE, MODE_EXEC):
                    perm, uid, gid = m if m is not None else (0o755 if e.filemode == MODE_EXEC else 0o644, *owner)
                    self.states[rel] = ("file", perm, str(e.id), uid, gid) if owners else ("file", perm, str(e.id))
                    self.blobs[rel] = e.id


class _Opener:
    """Descriptors of directories by workspace path, each component opened O_NOFOLLOW from its
    parent; the chain last used is kept, so paths in order cost one open each."""

    def __init__(self, root_fd: int, budget: HostBudget) -> None:
        self.stack: list[tuple[bytes, BoxDir]] = [(b"", BoxDir.at(root_fd, budget))]

    def dir(self, rel: bytes) -> BoxDir:
        while len(self.stack) > 1 and not (rel == self.stack[-1][0] or rel.startswith(self.stack[-1][0] + b"/")):
            self.stack.pop()[1].close()
        path, here = self.stack[-1]
        rest = rel[len(path) :].lstrip(b"/")
        for part in rest.split(b"/") if rest else []:
            here = here.sub(part)
            path = path + b"/" + part if path else part
            self.stack.append((path, here))
        return here

    def forget(self, rel: bytes) -> None:
        """rel was removed or replaced: no descriptor of it (or under it) is used again."""
        for i, (path, _) in enumerate(self.stack):
            if i and (path == rel or path.startswith(rel + b"/")):
                for _, here in self.stack[i:]:
                    here.close()
                del self.stack[i:]
                return

    def close(self) -> None:
        while len(self.stack) > 1:
            self.stack.pop()[1].close()


def _parent_name(rel: bytes) -> tuple[bytes, bytes]:
    parent, _, name = rel.rpartition(b"/")
    return parent, name


class _Restorer:
    """Makes the workspace equal to one checkpoint, after checking nothing it would touch changed
    since the state the store last knew (`head`). Iterative, through boxfs."""

    def __init__(self, store: _Store, cp: Checkpoint, head: Checkpoint, budget: HostBudget) -> None:
        self.store, self.budget = store, budget
        self.owners = os.geteuid() == 0  # only root can give a file another owner
        self.target = _Picture(store, cp, self.owners)
        self.head = (
            self.target if head.commit == cp.commit and head.turn == cp.turn else _Picture(store, head, self.owners)
        )
        self.report = RestoreReport(skipped=list(cp.skipped))
        self.keep = self.target.skipped

    def _kept(self, rel: bytes) -> bool:
        """Never touched: .git entries anywhere on the path, and
        paths this checkpoint skipped (and what is under them)."""
        parts = rel.split(b"/")
        if any(is_git_name(os.fsdecode(p)) for p in parts):
            return True
        return any(b"/".join(parts[:i]) in self.keep for i in range(1, len(parts) + 1))

    def _current(self, root_fd: int) -> dict[bytes, _State]:
        cur: dict[bytes, _State] = {}
        walk = Walk(root_fd, self.budget, enter=lambda e: not self._kept(e.rel), sort=True)
        for e in walk.entries():
            if self._kept(e.rel):
                continue
            st = e.st
            if stat.S_ISDIR(st.st_mode):
                cur[e.rel] = (
                    ("dir", st.st_mode & 0o777, st.st_uid, st.st_gid) if self.owners else ("dir", st.st_mode & 0o777)
                )
            elif stat.S_ISLNK(st.st_mode):
                try:
                    cur[e.rel] = ("link", BoxDir.at(e.dir_fd).readlink(e.name))
                except OSError:
                    cur[e.rel] = ("special",)
            elif stat.S_ISREG(st.st_mode):
                try:
                    data, st = BoxDir.at(e.dir_fd).read(e.name, max(self.store.max_file_bytes, 1), e.rel)
                    self.budget.charge_bytes(len(data))
                    oid: str | None = str(pygit2.hash(data))
                except OpenAgentsError:
                    oid = None  # unreadable or over the cap: equal to nothing
                perm = st.st_mode & 0o777 | (st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX))
                cur[e.rel] = ("file", perm, oid, st.st_uid, st.st_gid) if self.owners else ("file", perm, oid)
            else:
                cur[e.rel] = ("special",)
        for rel, why in [(r, "too deep to walk") for r in walk.too_deep] + walk.unreadable:
            if rel == b"":
                raise OpenAgentsError(ErrorType.IO_ERROR, f"cannot list the workspace: {why}")
            self.keep.add(rel)  # not seen whole: neither compared nor touched
            self.report.skipped.append(Skipped(path=to_store(rel), reason=f"not restored: {why}"))
        return cur

    def run(self) -> RestoreReport:
        root_fd = open_dir(self.store.workspace)
        try:
            cur = self._current(root_fd)
            cur = {p: s for p, s in cur.items() if not self._kept(p)}
            want = {p: s for p, s in self.target.states.items() if not self._kept(p)}
            self._defuse(want, cur)
            touched = sorted(p for p in set(cur) | set(want) if cur.get(p) != want.get(p))
            for p in touched:
                if p in self.head.skipped or any(p.startswith(s + b"/") for s in self.head.skipped):
                    continue  # the store never knew it: nothing to compare with
                if cur.get(p) != self.head.states.get(p):
                    if p not in self.head.states:
                        why = "created in the workspace since the session's last checkpoint"
                    elif p not in cur:
                        why = "removed from the workspace since the session's last checkpoint"
                    else:
                        why = "changed in the workspace since the session's last checkpoint"
                    self.report.conflicts.append(Conflict(path=to_store(p), reason=why))
            if self.report.conflicts:
                return self.report
            self._preflight(want, touched)
            self._apply(root_fd, cur, want, touched)
            os.fsync(root_fd)
        finally:
            os.close(root_fd)
        self.report.restored.sort()
        self.report.removed.sort()
        return self.report

    def _preflight(self, want: dict[bytes, _State], touched: builtins.list[bytes]) -> None:
        """Refuse, before anything changes, a restore whose writes would pass the byte budget
        (so a budget stops it whole, not half-way)."""
        need = 0
        for p in touched:
            if p in want and want[p][0] == "file":
                need += int(self.store.repo.odb.read_header(self.target.blobs[p])[1])
        limit = self.budget.max_bytes
        if limit is not None and self.budget.bytes_spent + need > limit:
            raise BudgetExceeded("byte", limit, f"the restore would write {need} bytes; nothing was changed")

    def _defuse(self, want: dict[bytes, _State], cur: dict[bytes, _State]) -> None:
        """A directory must not come back as a bare repository (HEAD with objects/ and refs/, or a
        commondir) that the user's git obeys: a box planted it during the session, and the sweep
        defused it by moving HEAD out. Its HEAD and commondir are not restored."""
        children: dict[bytes, set[bytes]] = {}
        for p in want:
            parent, name = _parent_name(p)
            children.setdefault(parent, set()).add(name)
        for parent, names in children.items():
            staying = set()
            for p in self.keep:
                pp, name = _parent_name(p)
                if pp == parent:
                    staying.add(name)
            if _repository_shape(os.fsdecode(n) for n in names | staying):
                for name in [n for n in names if n.lower() in (b"head", b"commondir")]:
                    rel = parent + b"/" + name if parent else name
                    want.pop(rel, None)
                    self.keep.add(rel)
                    cur.pop(rel, None)
                    self.report.skipped.append(
                        Skipped(
                            path=to_store(rel),
                            reason="it would make its directory a repository git obeys "
                            "(HEAD with objects/ and refs/, or a commondir)",
                        )
                    )

    def _apply(
        self, root_fd: int, cur: dict[bytes, _State], want: dict[bytes, _State], touched: builtins.list[bytes]
    ) -> None:
        opener = _Opener(root_fd, self.budget)
        try:
            # 1. what must go (or be replaced by another kind), deepest first
            for p in sorted(
                (
                    p
                    for p in touched
                    if p in cur and (p not in want or cur[p][0] != want[p][0] or cur[p][0] == "special")
                ),
                key=lambda x: (-x.count(b"/"), x),
            ):
                parent, name = _parent_name(p)
                try:
                    here = opener.dir(parent)
                    if cur[p][0] == "dir":
                        opener.forget(p)
                        here.rmdir(name)
                        self.report.removed.append(to_store(p) + "/")
                    else:
                        here.unlink(name)
                        self.report.removed.append(to_store(p))
                except OSError as err:
                    if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        reason = "a directory holding entries never checkpointed is in its way"
                    else:
                        reason = f"cannot remove it: {err.strerror}"
                    self.report.skipped.append(Skipped(path=to_store(p), reason=reason))
            # 2. directories, files and links that must be (re)written, shallowest first
            dirs_done: builtins.list[bytes] = []
            for p in sorted((p for p in touched if p in want), key=lambda x: (x.count(b"/"), x)):
                parent, name = _parent_name(p)
                state = want[p]
                try:
                    here = opener.dir(parent)
                    there = here.lstat_or_none(name)
                    if there is not None and state[0] != "dir" and stat.S_ISDIR(there.st_mode):
                        continue  # could not be removed above: already listed
                    if state[0] == "dir":
                        if there is None or not stat.S_ISDIR(there.st_mode):
                            if there is not None:
                                continue
                            here.mkdir(name, 0o700)
                        dirs_done.append(p)
                    elif state[0] == "link":
                        self._link(here, name, p)
                    else:
                        self._file(here, name, p)
                except OSError as err:
                    self.report.skipped.append(Skipped(path=to_store(p), reason=f"cannot restore it: {err.strerror}"))
            # 3. directory modes and owners, deepest first (a 0500 directory is filled before it is closed)
            for p in sorted(dirs_done, key=lambda x: (-x.count(b"/"), x)):
                state = want[p]
                parent, name = _parent_name(p)
                try:
                    with opener.dir(parent).sub(name) as sub:
                        if self.owners:
                            os.fchown(sub.fd, int(state[2]), int(state[3]))  # type: ignore[call-overload]
                        os.fchmod(sub.fd, int(state[1]) & 0o777)  # type: ignore[call-overload]
                except OSError as err:
                    self.report.skipped.append(Skipped(path=to_store(p), reason=f"cannot set its mode: {err.strerror}"))
        finally:
            opener.close()

    def _file(self, here: BoxDir, name: bytes, rel: bytes) -> None:
        state = self.target.states[rel]
        data = _object(self.store.repo, self.target.blobs[rel], pygit2.Blob).data
        uid = gid = None
        if self.owners:
            uid, gid = int(state[3]), int(state[4])  # type: ignore[call-overload]
        here.write_atomic(name, data, mode=int(state[1]), uid=uid, gid=gid)  # type: ignore[call-overload]
        self.report.restored.append(to_store(rel))

    def _link(self, here: BoxDir, name: bytes, rel: bytes) -> None:
        target = _object(self.store.repo, self.target.blobs[rel], pygit2.Blob).data
        # replaces a file or a link itself, never through it
        here.replace_link(target, name, self.target.owner if self.owners else None, owner_required=True)
        self.report.restored.append(to_store(rel))


def _repository_shape(names: Iterable[str]) -> bool:
    """Names that make git take a directory for a repository (integrity.git_shaped, by names)."""
    folded = {n.casefold() for n in names}
    return "head" in folded and ("commondir" in folded or {"objects", "refs"} <= folded)


def _plain_name(name: bytes) -> bool:
    """Our own trees hold nothing else; a tampered store must not make restore write elsewhere."""
    return (
        bool(name)
        and name not in (b".", b"..")
        and b"/" not in name
        and b"\0" not in name
        and not is_git_name(os.fsdecode(name))
    )
