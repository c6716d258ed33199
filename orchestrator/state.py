"""Where the host keeps what a session leaves behind: outside every workspace, under the XDG
state directory (`$XDG_STATE_HOME/openagents-sandbox`, default `~/.local/state/...`).

A state directory several users share (issue 41): a directory under it that another user may write
(mode 1777 as /tmp, group-writable for another group) is used only through the caller's own
subdirectory `user-UID`, which the product makes 0700 and checks (a real directory, the caller's,
closed to others) before every use; a shared directory without the sticky bit, or one owned by
another user, is refused with a message saying why. So what the host later reads back as its own
(records, pins, sweep journals) is only ever in directories nobody else can write.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from .errors import ErrorType, OpenAgentsError

SHARED_HELP = (
    "see docs/workspaces.md, Sessions: a state directory users share is 1777 (sticky), each user's state "
    "goes in a user-UID subdirectory the product makes 0700; or set XDG_STATE_HOME to a directory of your own"
)


def config_path() -> Path:
    """The user's config file: $XDG_CONFIG_HOME/openagents-sandbox/config.toml (~/.config/... without it)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "openagents-sandbox" / "config.toml"


def configured_root() -> Path:
    """The state directory as configured, before any per-user subdirectory."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "openagents-sandbox"


def state_root() -> Path:
    """The caller's own state root: the configured one, or its user-UID subdirectory if others may write it."""
    return own_dir(configured_root())


def others_may_write(st: os.stat_result) -> bool:
    """Someone but the caller (and root) may add, rename or remove entries in this directory."""
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return True
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _own_group(st.st_gid)


def _own_group(gid: int) -> bool:
    """The caller's primary group with no other listed member (a user private group, as umask 002 makes dirs 0775)."""
    import grp
    import pwd

    if gid != os.getgid():
        return False
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
        return all(member == name for member in grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False


def own_dir(path: Path) -> Path:
    """`path`, when nobody but the caller (or root) may write it (not there yet: made now, 0700);
    else the caller's `user-UID` subdirectory of it, made 0700 and checked. Refused,
    CONFIG_INVALID with the reason: a shared directory without the sticky bit or owned by another
    user (its owner could swap the subdirectory), a subdirectory that is a link, not the caller's,
    or open to others."""
    try:
        st = os.stat(path)  # the configured path itself may be a link the user made
    except FileNotFoundError:
        # Made now, 0700, and checked as any other: one another user made first (a race) is refused, not used.
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return path  # cannot be made here: the caller's own use of it says why
        return own_dir(path) if os.path.lexists(path) else path
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"the state directory {path} cannot be used: {err.strerror}"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the state directory {path} is not a directory")
    if not others_may_write(st):
        return path
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the state directory {path} belongs to uid {st.st_uid}, not to you: "
            f"its owner could replace what you keep there; {SHARED_HELP}",
        )
    if not st.st_mode & stat.S_ISVTX:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the state directory {path} is writable by other users and not sticky "
            f"(mode {stat.S_IMODE(st.st_mode):o}): another user could rename or replace your sessions; {SHARED_HELP}",
        )
    mine = path / f"user-{uid}"
    try:
        os.mkdir(mine, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"cannot make {mine}: {err.strerror}") from None
    own = os.lstat(mine)
    if not stat.S_ISDIR(own.st_mode) or own.st_uid != uid or stat.S_IMODE(own.st_mode) & 0o077:
        what = (
            "a link"
            if stat.S_ISLNK(own.st_mode)
            else "not a directory"
            if not stat.S_ISDIR(own.st_mode)
            else f"owned by uid {own.st_uid}"
            if own.st_uid != uid
            else f"open to others (mode {stat.S_IMODE(own.st_mode):o})"
        )
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"{mine} is {what}: it is not a directory only you can use (another user "
            f"may have made it); remove it, or use another state directory; {SHARED_HELP}",
        )
    return mine


PENDING_SWEEPS = (
    "pending-sweeps"  # sandbox/sweep_journal.py's journals; every command looks there first (cli/__init__.py)
)


def own_subdir(name: str) -> Path:
    """A directory under the caller's state root (sessions, pending-sweeps, ...), by the same rule."""
    return own_dir(state_root() / name)


def new_id() -> str:
    """Sortable by time, unique across processes: 20261202-183005-4f2a9c."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"


def sandbox_state_dir(workspace: Path, sandbox_id: str) -> Path:
    """The state directory of one sandbox; refused if it would lie inside the workspace, since the
    box could then write what the host later trusts (its quarantine, its placeholder)."""
    path = own_subdir("sandboxes") / sandbox_id
    if _inside(path, workspace):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the state directory {state_root()} lies inside the workspace {workspace}; "
            "set XDG_STATE_HOME to a directory outside it",
        )
    return path


def empty_dir() -> Path:
    """An empty, read-only directory: mounted read-only at /workspace/.git when the workspace has
    none, so the box cannot plant a repository at the top for the host's or the user's git."""
    path = own_subdir("empty")
    path.mkdir(parents=True, exist_ok=True)
    if any(os.scandir(path)):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"{path} must be empty (it is mounted as the workspace's placeholder .git)"
        )
    os.chmod(path, 0o555)
    return path


def _inside(path: Path, root: Path) -> bool:
    path, root = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return path == root or root in path.parents
