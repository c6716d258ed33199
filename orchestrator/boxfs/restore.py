"""Writing into a tree the box can see: atomic, owner and mode as asked (never wider), holes kept;
and removing a box-written tree without recursion or following a link.
"""

from __future__ import annotations

import errno
import os
import stat

from .budget import HostBudget
from .copy import punch_copy, temp_name
from .read import DIR_FLAGS

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_BLOCK = 64 << 10
_ZEROS = bytes(_BLOCK)


def _write_sparse(fd: int, data: bytes, budget: HostBudget) -> None:
    """data into the empty fd, blocks of zeros left as holes."""
    view = memoryview(data)
    for offset in range(0, len(data), _BLOCK):
        block = view[offset : offset + _BLOCK]
        if block == _ZEROS[: len(block)]:
            continue
        budget.charge_bytes(len(block))
        os.pwrite(fd, block, offset)
    os.ftruncate(fd, len(data))


def write_atomic(
    dir_fd: int,
    name: bytes | str,
    source: bytes | int,
    budget: HostBudget,
    *,
    mode: int,
    uid: int | None = None,
    gid: int | None = None,
    times: tuple[int, int] | None = None,
) -> os.stat_result:
    """Make dir_fd/name a regular file with `source` (bytes, or a readable descriptor copied from
    its start), atomically: a fresh temporary name is written, owned, moded and synced, then renamed
    over the old entry, so a crash leaves the old file or the new one, never half of one. `mode` is
    the exact permission (setuid, setgid and sticky bits are never set here). Holes are kept."""
    tmp = temp_name()
    out = os.open(tmp, _NEW, 0o600, dir_fd=dir_fd)
    try:
        try:
            if isinstance(source, bytes):
                _write_sparse(out, source, budget)
            else:
                punch_copy(source, out, budget)
            if uid is not None and gid is not None:
                os.fchown(out, uid, gid)
            os.fchmod(out, mode & 0o777)
            if times is not None:
                os.utime(out, ns=times)
            os.fsync(out)
            written = os.fstat(out)
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return written
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def remove_tree(dir_fd: int, name: bytes | str, budget: HostBudget) -> None:
    """Remove dir_fd/name and everything under it, iteratively, through O_NOFOLLOW descriptors: a
    link is removed, never followed, and depth costs no Python frames."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    # (parent fd, name, fd of the directory, its names not yet removed), innermost last
    first = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    stack: list[tuple[int, bytes | str, int, list[str]]] = []
    try:
        stack.append((dir_fd, name, first, os.listdir(first)))
    except BaseException:
        os.close(first)
        raise
    try:
        while stack:
            parent, dname, fd, names = stack[-1]
            budget.check_time()
            if not names:
                stack.pop()
                os.close(fd)
                os.rmdir(dname, dir_fd=parent)
                continue
            child = names.pop()
            budget.charge_entries()
            try:
                cst = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(cst.st_mode):
                try:
                    sub = os.open(child, DIR_FLAGS, dir_fd=fd)
                except OSError as err:
                    if err.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                        raise
                else:
                    try:
                        stack.append((fd, child, sub, os.listdir(sub)))
                    except BaseException:
                        os.close(sub)
                        raise
                    continue
            try:
                os.unlink(child, dir_fd=fd)
            except FileNotFoundError:
                pass
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)
