"""Reaching one path of the real workspace or the copy from a directory fd, following nothing.

The diff and apply both look at single paths (the walk is scan's): each is reached one O_NOFOLLOW
component at a time through boxfs, and a link on the way is an OSError (ELOOP) the callers
already handle, so neither can be steered outside the tree by a symlink the box planted.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from ...boxfs import BoxDir, from_store, to_store
from ...boxfs.read import components
from ...errors import OpenAgentsError


def _unsafe(err: OpenAgentsError) -> OSError:
    """boxfs's typed refusal (a link on the way, not a regular file) as the OSError callers handle."""
    return OSError(errno.ELOOP, err.message)


def _open_dir(root_fd: int, rel: str) -> int:
    """A new fd of the directory root/rel (to_store form; "" is root), through boxfs.open_parent:
    no link followed anywhere (a symlink raises ELOOP)."""
    if not rel:
        return os.dup(root_fd)
    parent, leaf = _parent(root_fd, rel)
    try:
        return BoxDir.at(parent).sub(leaf).detach()
    finally:
        os.close(parent)


@dataclass
class _Where:
    st: os.stat_result | None = None  # the entry itself, not followed
    blocker: str | None = None  # the first parent that is not a plain directory (to_store form)
    blocker_kind: str = ""
    parent_missing: bool = False


def _locate(root_fd: int, rel: str) -> _Where:
    """What is at rel, and if a parent is not a plain directory, which one: the conflict rule tells
    a directory the user replaced from one that was never one. Each component is opened with
    boxfs's O_NOFOLLOW directory flags from its parent's fd."""
    parts = components(from_store(rel))
    here = BoxDir.at(root_fd).dup()
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                st = here.lstat(name)
            except FileNotFoundError:
                return _Where(parent_missing=True)
            if not stat.S_ISDIR(st.st_mode):
                return _Where(
                    blocker=to_store(b"/".join(parts[: i + 1])),
                    blocker_kind="a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory",
                )
            sub = here.sub(name)
            here.close()
            here = sub
        try:
            return _Where(st=here.lstat(parts[-1]))
        except FileNotFoundError:
            return _Where()
    finally:
        here.close()


def _parent(root_fd: int, rel: str) -> tuple[int, bytes]:
    """(a new fd of rel's parent, rel's last name), reached through boxfs.open_parent."""
    try:
        found = BoxDir.at(root_fd).parent_of(from_store(rel))
    except OpenAgentsError as err:
        raise _unsafe(err) from None
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "a parent directory is missing")
    return found[0].detach(), found[1]


def _open_file(root_fd: int, rel: str) -> int:
    """An fd of the regular file root/rel (boxfs.open_regular): no link followed, never blocking
    (a FIFO, socket or device is refused before it is opened)."""
    parent, leaf = _parent(root_fd, rel)
    try:
        return BoxDir.at(parent).open_file(leaf, from_store(rel))[0]
    except OpenAgentsError as err:
        raise _unsafe(err) from None
    finally:
        os.close(parent)


def _readlink(root_fd: int, rel: str) -> str:
    """The target of the symlink root/rel, in to_store form (read, never followed)."""
    parent, leaf = _parent(root_fd, rel)
    try:
        return to_store(BoxDir.at(parent).readlink(leaf))
    finally:
        os.close(parent)
