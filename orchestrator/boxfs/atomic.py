"""Writing a host-owned file atomically (a record, a manifest, a pin, a report, a list, the sweep journal):
whole or not at all, never half.

A reader (a person, a later start, another process) sees the old file or the new one: the bytes
go to a new temporary file beside `path` (O_EXCL, no link followed, so a name planted there is
refused, never written through), are synced, and only then renamed over `path`; on any failure
the temporary file is removed and `path` is as it was. "Every bad input loses nothing; writes
atomic" (the project's guide): this is the one writer that does it, opening through private.py
(no link followed, the flags spelled in boxfs only).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .private import create_private, open_private_dir


def write_atomic(path: str | Path, data: str | bytes, mode: int = 0o600, durable: bool = False) -> Path:
    """`data` (text as UTF-8) as the whole content of `path`, or OSError with `path` unchanged.
    `durable`: the directory is synced too, so the new name itself survives a power loss (a journal)."""
    path = Path(path)
    tmp = path.with_name(
        f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    )  # unique: two writers never share one
    fd = create_private(tmp, mode)
    try:
        with open(fd, "wb") as fh:
            fh.write(data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def fsync_dir(path: Path) -> None:
    """A directory's entries (a name added, renamed or removed) made durable."""
    fd = open_private_dir(path, follow=True)  # only synced, never written through: the state directory may be a link
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
