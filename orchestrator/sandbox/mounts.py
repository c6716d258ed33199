"""Read-only views of host paths inside a box, made so that no runtime can write through them.

A read-only *bind* mount of a directory is not enough under gVisor with directfs (runsc 20240729's
default): an open(O_TRUNC) of a file under it fails with EROFS only after the host file was emptied
(reproduced: `: > .git/config` in the box left the user's config at 0 bytes). So a directory is
mounted as an anonymous `local` volume that the daemon itself bind-mounts read-only in the host's
kernel (o=bind,ro): whatever the runtime opens through it, the host's kernel refuses to write, and
the file keeps its bytes (tested under runc and runsc: tests/attacks/test_workspace_integrity.py).
A single file stays a read-only bind mount: runsc opens it read-only, and O_TRUNC is refused before
anything is changed (measured the same way). `docker rm -v` removes an anonymous volume with its
box (reaper.remove_container); the volume holds no data, only where the daemon bound the directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from docker.types import DriverConfig, Mount

from ..errors import ErrorType, OpenAgentsError


def workspace(source: Path | str, target: str, read_only_: bool = False) -> Mount:
    """The workspace (or its copy) at `target`: read-write, or, for a policy's workspace_access =
    read-only, the daemon's own read-only bind below (no runtime writes through it)."""
    if read_only_:
        return read_only(source, target)
    return Mount(target=target, source=str(source), type="bind", read_only=False)


def read_only(source: Path | str, target: str) -> Mount:
    """`source` (a directory or a file on the host) at `target` in the box, read-only."""
    if os.path.isdir(source) and not os.path.islink(source):
        # Anonymous (no source: removed with the box), and nothing of the image copied into it (no_copy).
        return Mount(
            target=target,
            source=None,
            type="volume",
            no_copy=True,
            driver_config=DriverConfig("local", {"type": "none", "o": "bind,ro", "device": str(source)}),
        )
    return Mount(target=target, source=str(source), type="bind", read_only=True)


def host_code(workspace: Path, names: list[str], target: str) -> list[Mount]:
    """The workspace's top-level entries that hold what the host itself runs or imports, read-only
    at `target`/NAME (workspace/host_code.py, --host-code-read-only). Each must still be a directory
    or a file of its own: one that is a link now (a box of another session re-pointed it) is not
    mounted through, and the box does not start."""
    out = []
    for name in names:
        try:
            mode = os.lstat(workspace / name).st_mode
        except OSError as err:
            mode, why = 0, err.strerror or "cannot be looked at"
        else:
            why = "a link now" if stat.S_ISLNK(mode) else "neither a directory nor a file now"
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                f"the host's own code at {name!r} in the workspace is {why}: not mounted "
                "read-only, the sandbox is not started",
            )
        out.append(read_only(workspace / name, f"{target}/{name}"))
    return out
