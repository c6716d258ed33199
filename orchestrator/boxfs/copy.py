"""Copying box-written files: holes kept, hard links deduplicated, every byte charged.

A sparse file of 16 MiB of holes costs no blocks; copied naively it costs 16 MiB, and each of its
hard links costs it again (the red team turned 16 MiB into 256 MiB on the state disk). So data is
cloned with FICLONE where the file system can (no bytes), else only its data segments are copied
(SEEK_DATA/SEEK_HOLE, copy_file_range in the kernel) and the holes are left as holes; a second
name of an inode already copied becomes a hard link to the first copy, never a second copy.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets

from .budget import HostBudget
from .read import open_regular

FICLONE = 0x40049409
_NO_CLONE = (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EBADF)
_NO_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)
# (source st_dev, destination st_dev) pairs where FICLONE / copy_file_range said the pair never can
# (EXDEV, EOPNOTSUPP, ENOSYS, ENOTTY): not asked again for each of a 40,000-file copy's files (a copy
# mode copy onto its quota file system met two failing calls a file). A wrong guess (a device number
# reused by another file system) costs speed only: the bytes are then copied the other way.
_NEVER = (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.ENOTTY)
_no_clone: set[tuple[int, int]] = set()
_no_range: set[tuple[int, int]] = set()
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class HardLinks:
    """Inodes already copied: (st_dev, st_ino) of the source -> (a descriptor of the directory
    its copy is in, the copy's name). Close it when the copy is done.

    Bounded in descriptors: one is held per directory (shared by every first copy in it), at most
    `max_dirs` of them, and a directory's is released once every name of each inode remembered in
    it has been met (`nlink`). Past the bound an inode is not remembered and its later names are
    copied in full: correct, it only costs bytes (charged to the budget). Without the bound, files
    whose other names are outside the tree (a pnpm store, a `cp -al` backup) held one descriptor
    each until EMFILE."""

    def __init__(self, max_dirs: int = 256) -> None:
        self.max_dirs = max_dirs
        self._seen: dict[tuple[int, int], tuple[int, bytes]] = {}
        self._left: dict[tuple[int, int], int] = {}  # names of the inode not met yet (None: unknown)
        self._dir_of: dict[tuple[int, int], tuple[int, int]] = {}
        self._dirs: dict[
            tuple[int, int], list[int]
        ] = {}  # directory (dev, ino) -> [descriptor, inodes remembered in it]

    def first(self, key: tuple[int, int]) -> tuple[int, bytes] | None:
        return self._seen.get(key)

    def remember(self, key: tuple[int, int], dir_fd: int, name: bytes, nlink: int = 0) -> None:
        """`nlink`: the inode's link count, so its directory's descriptor is released once all its
        names were met (0: unknown, kept until close)."""
        if key in self._seen:
            return
        dst = os.fstat(dir_fd)
        dkey = (dst.st_dev, dst.st_ino)
        held = self._dirs.get(dkey)
        if held is None:
            if len(self._dirs) >= self.max_dirs:
                return
            held = self._dirs[dkey] = [os.dup(dir_fd), 0]
        held[1] += 1
        self._seen[key] = (held[0], name)
        self._dir_of[key] = dkey
        if nlink:
            self._left[key] = nlink - 1

    def linked(self, key: tuple[int, int]) -> None:
        """One more name of `key` was made a link to its first copy."""
        left = self._left.get(key)
        if left is None:
            return
        if left > 1:
            self._left[key] = left - 1
            return
        del self._left[key], self._seen[key]
        dkey = self._dir_of.pop(key)
        held = self._dirs[dkey]
        held[1] -= 1
        if not held[1]:
            os.close(held[0])
            del self._dirs[dkey]

    def close(self) -> None:
        for fd, _ in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        self._seen.clear()
        self._left.clear()
        self._dir_of.clear()


def punch_copy(
    fin: int, fout: int, budget: HostBudget, size: int | None = None, reflinks: bool = True, dense: bool = False
) -> int:
    """Copy fin's content into the empty fout keeping holes; returns the bytes of data copied
    (charged to the budget; a reflink charges nothing). `size` is read by fstat when None.
    `dense`: the caller saw as many blocks as bytes (no hole to keep), so the data is copied
    from 0 to `size` without looking for holes (a file that grew holes since is copied in full:
    the bytes are charged)."""
    if size is None:
        size = os.fstat(fin).st_size
    if not size:
        return 0
    devs = (os.fstat(fin).st_dev, os.fstat(fout).st_dev)
    if reflinks and devs not in _no_clone:
        try:
            fcntl.ioctl(fout, FICLONE, fin)
            return 0
        except OSError as err:
            if err.errno not in _NO_CLONE:
                raise
            if err.errno in _NEVER:
                _no_clone.add(devs)
    if dense:
        copied = _copy_range(fin, fout, budget, 0, size, devs)
        if copied < size:
            os.ftruncate(fout, size)  # shrank while being copied: the rest is a hole
        return copied
    copied = 0
    offset = 0
    while offset < size:
        budget.check_time()
        try:
            start = os.lseek(fin, offset, os.SEEK_DATA)
        except OSError as err:
            if err.errno != errno.ENXIO:  # ENXIO: only a hole is left
                raise
            break
        if start >= size:
            break
        end = min(os.lseek(fin, start, os.SEEK_HOLE), size)
        n = _copy_range(fin, fout, budget, start, end, devs)
        copied += n
        if start + n < end:
            break
        offset = end
    os.ftruncate(fout, size)  # the trailing hole, and a file that shrank meanwhile
    return copied


def _copy_range(fin: int, fout: int, budget: HostBudget, pos: int, end: int, devs: tuple[int, int]) -> int:
    """fin's bytes [pos, end) to the same offsets of fout, in the kernel: copy_file_range, or where
    it cannot (across file systems since Linux 5.19), sendfile (a splice, no copy through Python);
    the bytes copied (fewer when fin shrank meanwhile)."""
    start = pos
    while pos < end:
        want = min(end - pos, 8 << 20)
        budget.charge_bytes(want)
        n = -1
        if devs not in _no_range:
            try:
                n = os.copy_file_range(fin, fout, want, pos, pos)
            except OSError as err:
                if err.errno not in _NO_RANGE:
                    raise
                if err.errno in _NEVER:
                    _no_range.add(devs)
        if n < 0:
            n = _send(fin, fout, want, pos)
        if n <= 0:
            break  # shrank while being copied: the rest is a hole
        pos += n
    return pos - start


def _send(fin: int, fout: int, want: int, pos: int) -> int:
    """fin's bytes at pos to fout at pos by sendfile, else by pread/pwrite (a kernel or file
    system that refuses sendfile between these files)."""
    try:
        os.lseek(fout, pos, os.SEEK_SET)
        return os.sendfile(fout, fin, pos, want)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    return os.pwrite(fout, os.pread(fin, want, pos), pos)


def copy_regular(
    src_dir_fd: int,
    name: bytes,
    dst_dir_fd: int,
    budget: HostBudget,
    *,
    mode: int,
    uid: int | None = None,
    gid: int | None = None,
    times: tuple[int, int] | None = None,
    links: HardLinks | None = None,
    reflinks: bool = True,
    rel: bytes | None = None,
) -> os.stat_result:
    """Copy the regular file src_dir_fd/name to a new dst_dir_fd/name (which must not exist)
    with the given mode (setuid/setgid never kept) and owner; a second name of an inode already
    copied through `links` becomes a hard link to its first copy. Returns the copy's stat. The
    bytes written are charged to `budget`; the entry was charged by the walk that found it."""
    fin, st = open_regular(src_dir_fd, name, rel)
    try:
        if links is not None and st.st_nlink > 1:
            first = links.first((st.st_dev, st.st_ino))
            if first is not None:
                os.link(first[1], name, src_dir_fd=first[0], dst_dir_fd=dst_dir_fd, follow_symlinks=False)
                linked = os.stat(name, dir_fd=dst_dir_fd, follow_symlinks=False)
                links.linked((st.st_dev, st.st_ino))
                return linked
        fout = os.open(name, _NEW, 0o600, dir_fd=dst_dir_fd)
        try:
            punch_copy(fin, fout, budget, st.st_size, reflinks, dense=st.st_blocks * 512 >= st.st_size)
            if uid is not None and gid is not None:
                os.fchown(fout, uid, gid)
            os.fchmod(fout, mode & 0o1777)
            if times is not None:
                os.utime(fout, ns=times)
            copied = os.fstat(fout)
        finally:
            os.close(fout)
        if links is not None and st.st_nlink > 1:
            links.remember((st.st_dev, st.st_ino), dst_dir_fd, name, st.st_nlink)
        return copied
    finally:
        os.close(fin)


def temp_name() -> bytes:
    """A fresh hidden name beside `name` for an atomic write: random, so two writers (threads,
    processes) never share one."""
    return b".oa-" + secrets.token_hex(8).encode() + b".tmp"
