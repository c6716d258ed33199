"""Copy mode: the box works on a private copy, so nothing touches the user's files until they apply.

The copy is taken before the box exists, from the user's real workspace, which may itself be a
hostile clone: no symlink is followed (links are copied as links), FIFOs, sockets and devices are
left out (listed), setuid/setgid bits are dropped, every file is owned by the unprivileged
sandbox uid. The top `.git` is not copied: the real one is mounted read-only, as in bind mode.
Data is cloned with FICLONE where the file system can (reflinks: no bytes copied), else with
copy_file_range in the kernel.

The manifest records, for every entry, how the real file looked (so `apply` can tell that the
user changed it since) and how the copy looked (so `changes` can tell what the box changed).
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from typing import NamedTuple

from pydantic import BaseModel, Field

FICLONE = 0x40049409
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"))


def kind_of(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "special"


class Stamp(NamedTuple):
    """How one entry looked: enough to notice a change without reading the content."""

    kind: str
    mode: int
    size: int
    mtime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> "Stamp":
        return cls(kind_of(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)

    def same_as(self, other: "Stamp | None") -> bool:
        """Same kind, size, mtime and mode (the inode may differ: an atomic rewrite changes it)."""
        return other is not None and self[:4] == tuple(other)[:4]


class ManifestEntry(NamedTuple):
    real: Stamp  # the user's file when the copy was taken
    copy: Stamp  # the copy right after it was made


class CopyManifest(BaseModel):
    real: str
    copy_dir: str
    uid: int
    gid: int
    real_uid: int
    real_gid: int
    entries: dict[str, ManifestEntry] = Field(default_factory=dict)
    left_out: dict[str, str] = Field(default_factory=dict)  # path -> why it was not copied
    took_s: float = 0.0

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "CopyManifest":
        return cls.model_validate_json(path.read_text())


@dataclass
class _Copier:
    uid: int
    gid: int
    manifest: CopyManifest
    reflinks: bool = True
    copied_bytes: int = field(default=0)

    def copy_dir(self, src_fd: int, dst_fd: int, rel_dir: str) -> None:
        for name in sorted(os.listdir(src_fd)):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not rel_dir and name == ".git":
                continue  # the real one is mounted read-only over the copy
            try:
                st = os.lstat(name, dir_fd=src_fd)
            except OSError:
                continue
            kind = kind_of(st.st_mode)
            if kind == "special":
                self.manifest.left_out[rel] = "a FIFO, socket or device file"
                continue
            mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
            times = (st.st_atime_ns, st.st_mtime_ns)
            if kind == "symlink":
                os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
                os.chown(name, self.uid, self.gid, dir_fd=dst_fd, follow_symlinks=False)
                os.utime(name, ns=times, dir_fd=dst_fd, follow_symlinks=False)
                copied = os.lstat(name, dir_fd=dst_fd)
            elif kind == "dir":
                os.mkdir(name, 0o700, dir_fd=dst_fd)
                sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
                sub_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
                try:
                    self.copy_dir(sub_src, sub_dst, rel)
                    os.fchmod(sub_dst, mode | stat.S_IRWXU)
                    os.fchown(sub_dst, self.uid, self.gid)
                    os.utime(sub_dst, ns=times)
                    copied = os.fstat(sub_dst)
                finally:
                    os.close(sub_src)
                    os.close(sub_dst)
            else:
                copied = self._copy_file(src_fd, dst_fd, name, mode, st.st_size, times)
            self.manifest.entries[rel] = ManifestEntry(Stamp.of(st), Stamp.of(copied))

    def _copy_file(self, src_fd: int, dst_fd: int, name: str, mode: int, size: int, times: tuple[int, int]) -> os.stat_result:
        fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_fd)
        try:
            fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst_fd)
            try:
                if size:
                    self._clone(fin, fout, size)
                os.fchown(fout, self.uid, self.gid)
                os.fchmod(fout, mode)
                os.utime(fout, ns=times)
                return os.fstat(fout)
            finally:
                os.close(fout)
        finally:
            os.close(fin)

    def _clone(self, fin: int, fout: int, size: int) -> None:
        if self.reflinks:
            try:
                fcntl.ioctl(fout, FICLONE, fin)
                return
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS):
                    raise
                self.reflinks = False  # this file system has none: do not ask again
        offset = 0
        while True:  # to the end of the file, which may have grown since it was stat'ed
            try:
                n = os.copy_file_range(fin, fout, max(size - offset, 1 << 20))
            except OSError as err:
                if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL):
                    raise
                n = os.sendfile(fout, fin, None, 1 << 20)
            if n == 0:
                break
            offset += n
        self.copied_bytes += offset


def copy_workspace(real: Path, dest: Path, uid: int, gid: int) -> CopyManifest:
    """Make `dest` (which must not exist) a private copy of `real`, owned by uid:gid."""
    started = time.monotonic()
    st = os.stat(real)
    manifest = CopyManifest(real=str(real), copy_dir=str(dest), uid=uid, gid=gid, real_uid=st.st_uid, real_gid=st.st_gid)
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.mkdir(dest, 0o700)
    src_fd = os.open(real, _DIR_FLAGS)
    dst_fd = os.open(dest, _DIR_FLAGS)
    try:
        _Copier(uid, gid, manifest).copy_dir(src_fd, dst_fd, "")
        os.fchmod(dst_fd, 0o755)
        os.fchown(dst_fd, uid, gid)
    finally:
        os.close(src_fd)
        os.close(dst_fd)
    manifest.took_s = round(time.monotonic() - started, 4)
    return manifest


