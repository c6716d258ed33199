"""inotify through ctypes: which directories' entries changed since the last record.

Hints only (snapshot re-walks every path they name by the same rules), and `broken` the moment
anything may have been lost, so that a lost event costs a full walk, never a missed change.
Watches are added on a directory's fd (/proc/self/fd), never on a path the box could swap.
"""

from __future__ import annotations

import ctypes
import os
import struct

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_ONLYDIR, IN_EXCL_UNLINK, IN_ISDIR = 0x01000000, 0x04000000, 0x40000000
_WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_EXCL_UNLINK
)
_EVENT = struct.Struct("iIII")


class _Watcher:
    """One inotify instance. `broken` once anything was or may have been lost: then a full walk."""

    def __init__(self) -> None:
        self.fd = -1
        self.broken = False
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            self.fd = -1
        if self.fd < 0:
            self.fd, self.broken = -1, True

    def add(self, dir_fd: int) -> int:
        """Watch the directory open as dir_fd (its inode, not a path the box could swap)."""
        if self.fd < 0:
            return -1
        wd: int = self._libc.inotify_add_watch(self.fd, f"/proc/self/fd/{dir_fd}".encode(), _WATCH_MASK)
        if wd < 0:
            self.broken = True  # ENOSPC (watch limit) and the like: no hints for this directory
        return wd

    def remove(self, wd: int) -> None:
        if self.fd >= 0 and wd >= 0:
            self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        while self.fd >= 0:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                self.broken = True
                break
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, size = _EVENT.unpack_from(buf, off)
                raw = buf[off + _EVENT.size : off + _EVENT.size + size].split(b"\0", 1)[0]
                off += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    self.broken = True
                out.append((wd, mask, os.fsdecode(raw)))
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
