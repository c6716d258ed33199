"""Kernel overlayfs mounts for copy-on-write forks: whether this host may make them, and making,
checking and removing one. Paths only, no session records (workspace/cow.py decides what to mount).

A fork's copy is an overlay mounted by the host at the session's `copy/` (the merged view: what the
box mounts, what `changes`, `apply`, checkpoints and the sweep read, through boxfs as any copy), over
frozen read-only layers (`layers/<id>/tree` under the state root, never written again) and the
session's own upper and work directories (`cow/upper`, `cow/work`). The upper is box-written: its
whiteouts (character devices 0/0) and opaque directories are overlayfs's business; the host never
reads it raw, only measures it (the write quota) and removes it (discard, prune).

Why the host mounts (and not Docker's local volume driver with type=overlay): the host reviews and
lands the merged view, so it needs it mounted on its side too; a volume mounted by the daemon
alone would mean a second mount made with the same privilege. The mount is made in the host's
mount namespace, where the Docker daemon sees it; it outlives the host process (a session goes on,
is reviewed or discarded in a later one); after a reboot, `Layers` (kept in the session's record)
says how to mount it again, and it is mounted again by the next command that opens the session.

It needs root or CAP_SYS_ADMIN in the initial user namespace (an overlay mounted in a user
namespace is invisible to the daemon): elsewhere forks are data copies (`usable` says why).
OA_FORK_COW=copy forces the copies (a host process in a mount namespace of its own, e.g. a
privileged container given the Docker socket, whose mounts the daemon would not see).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel

from .. import state
from ..boxfs import BoxDir, BudgetExceeded, HostBudget, Walk, punch_copy
from ..boxfs.copy import temp_name
from ..boxfs.private import open_private
from ..errors import ErrorType, OpenAgentsError

MAX_LAYERS = 32  # lower layers stacked at most (each fork of a fork that wrote adds one); past it a fork is a data copy
_OPTIONS_MAX = 4000  # the mount data is one page
_BAD_IN_PATH = (
    ",",
    ":",
    "\\",
    "\n",
    "=",
)  # separators of the mount data: such a path is not mounted, the fork is a copy
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
_CAP_SYS_ADMIN = 21

__all__ = [
    "MAX_LAYERS",
    "Layers",
    "OverlayError",
    "cannot_mount",
    "ensure_mounted",
    "fork_upper",
    "is_mounted",
    "layers_root",
    "like_root",
    "mount",
    "mount_lock",
    "mounted_lowers",
    "mounts_under",
    "unmount",
    "unusable",
]
FREEZE_BUDGET_S = 300.0
INERT = "inert"  # in a layer's directory beside its tree: the tree was made inert (cow._inert) and may be stood on


@contextlib.contextmanager
def mount_lock(session_dir: Path) -> Iterator[None]:
    """One process at a time mounts, freezes or unmounts a session's copy (an flock on the session
    directory's `cow.lock`): without it two commands opening a fork after a reboot would stack two
    overlays on one upper, or one would mount a layer a freeze was still making inert."""
    fd = open_private(session_dir / "cow.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Layers(BaseModel):
    """How a session's copy is mounted (kept in its record): the frozen layers, topmost first, and
    the session's own upper and work directories."""

    lowers: list[str]
    upper: str
    work: str

    def options(self) -> str:
        for path in (*self.lowers, self.upper, self.work):
            if any(c in path for c in _BAD_IN_PATH):
                raise OverlayError(f"the path {path!r} holds a character the mount options cannot carry")
        text = (
            f"lowerdir={':'.join(self.lowers)},upperdir={self.upper},workdir={self.work},"
            "redirect_dir=off,index=off,metacopy=off"
        )
        if len(text) > _OPTIONS_MAX or len(self.lowers) > MAX_LAYERS:
            raise OverlayError(f"{len(self.lowers)} layers do not fit one mount")
        return text


class OverlayError(OpenAgentsError):
    """A copy-on-write mount that could not be made (IO_ERROR): the caller falls back to a data copy
    where it can, or says that the session's copy cannot be reached."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorType.IO_ERROR, message)


def layers_root() -> Path:
    """Where frozen layers live: the caller's state root, the file system of its sessions (a layer
    is made by a rename, never a copy)."""
    return state.own_subdir("layers")


def unusable() -> str | None:
    """Why this host process may not make overlay forks (None: it may)."""
    choice = os.environ.get("OA_FORK_COW", "auto").strip().lower()
    if choice == "copy":
        return "OA_FORK_COW=copy"
    return cannot_mount()


def cannot_mount() -> str | None:
    """Why this host process may not make mounts the Docker daemon sees (None: it may): it needs
    CAP_SYS_ADMIN outside any user namespace. Overlay forks and the write quota's file systems
    (workspace/quota_fs.py) both ask this."""
    if not os.path.exists("/proc/self/status"):
        return "not Linux"
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            caps = next((int(line.split()[1], 16) for line in fh if line.startswith("CapEff:")), 0)
        with open("/proc/self/uid_map", encoding="ascii", errors="replace") as fh:
            uid_map = fh.read().split()
    except OSError as err:
        return f"the process's capabilities cannot be read ({err.strerror})"
    if not caps >> _CAP_SYS_ADMIN & 1:
        return "the host process may not mount (it is not root and lacks CAP_SYS_ADMIN)"
    if uid_map[:3] != ["0", "0", "4294967295"]:
        return (
            "the host process runs in a user namespace, whose mounts the engine (its daemon, its service) would not see"
        )
    return None


def make_inert(tree: Path, owner: str, layer_dir: Path) -> None:
    """Make `tree` inert (what a data-copy fork leaves out or drops: see workspace/cow.py) and mark
    its layer `layer_dir` so: only a marked layer is ever mounted (a freeze cut short is finished
    here, by ensure_mounted, before anyone stands on it)."""
    _inert(tree, owner)
    fd = open_private(layer_dir / INERT, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.close(fd)


def _inert(tree: Path, owner: str) -> None:
    """What a data-copy fork leaves out or drops, done to the layer before anyone mounts it (see the
    module's docstring); over its budget the freeze fails and the fork is a data copy."""
    uid, gid = (int(x) for x in owner.split(":", 1))
    names: dict[tuple[int, int], list[bytes]] = {}
    nlinks: dict[tuple[int, int], int] = {}
    walk = Walk(tree, HostBudget.until(FREEZE_BUDGET_S, max_entries=None, max_bytes=None))
    try:
        for entry in walk.entries():
            mode = entry.st.st_mode
            if stat.S_ISCHR(mode) and entry.st.st_rdev == 0:
                continue  # a whiteout of an upper that became a layer
            here = BoxDir.at(entry.dir_fd)
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                here.unlink(entry.name)
                continue
            if stat.S_ISREG(mode) and entry.st.st_nlink > 1:  # maybe a name of a file outside: not changed in place
                names.setdefault(entry.key, []).append(entry.rel)
                nlinks[entry.key] = entry.st.st_nlink
                continue
            _own(here, entry.name, entry.st, uid, gid)
    except BudgetExceeded as err:
        raise OpenAgentsError(ErrorType.RESOURCE_EXHAUSTED, f"the copy could not be frozen for a fork: {err}") from None
    if not walk.complete:  # what lies below was not made inert: never a layer
        raise OpenAgentsError(
            ErrorType.RESOURCE_EXHAUSTED,
            f"the copy could not be frozen for a fork: {len(walk.too_deep)} director(ies) "
            f"deeper than {walk.budget.max_depth} levels, {len(walk.unreadable)} unreadable",
        )
    with BoxDir.open(tree, HostBudget.until(FREEZE_BUDGET_S, max_entries=None, max_bytes=None)) as root:
        for key, rels in names.items():
            for rel in rels if len(rels) < nlinks[key] else rels[:1]:
                found = root.parent_of(rel)
                if found is None:
                    continue
                parent, name = found
                with parent:
                    if (
                        len(rels) < nlinks[key]
                    ):  # a name of it lies outside the layer: every name here gets its own inode
                        _own_inode(parent, name, uid, gid)
                    else:
                        _own(parent, name, parent.lstat(name), uid, gid)


def _own(here: BoxDir, name: bytes, st: os.stat_result, uid: int, gid: int) -> None:
    """The entry the sandbox user's (as a data copy makes every entry), setuid/setgid dropped."""
    if (st.st_uid, st.st_gid) != (uid, gid):
        here.lchown(name, uid, gid)
    if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        here.chmod_entry(name, lambda now: stat.S_IMODE(now.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


def _own_inode(parent: BoxDir, name: bytes, uid: int, gid: int) -> None:
    """parent/name replaced by a copy of its data under a new inode of the sandbox user's, atomically."""
    st = parent.lstat(name)
    tmp = temp_name()
    fin, _ = parent.open_file(name)
    try:
        fout = parent.create(tmp)
        try:
            punch_copy(fin, fout, parent.budget, st.st_size)
            os.fchown(fout, uid, gid)
            os.fchmod(fout, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    parent.rename(tmp, name)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def mount(layers: Layers, target: Path) -> None:
    """Mount `layers` at `target` (an empty directory), nosuid and nodev; OverlayError if the
    kernel refuses (no privilege, no overlayfs, a layer missing)."""
    import ctypes

    options = layers.options()
    for path in (*layers.lowers, layers.upper, layers.work):
        if not os.path.isdir(path) or os.path.islink(path):
            raise OverlayError(f"the layer {path} is missing")
    if _libc().mount(b"oa-fork", os.fsencode(target), b"overlay", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OverlayError(f"overlayfs refused to mount {target}: {os.strerror(code)}")


def unmount(target: Path, *, detach: bool = True) -> None:
    """Unmount `target` if it is a mount. A busy one is detached (it goes when its last user does),
    unless `detach` is false (a freeze: a process still in the copy would go on writing into what
    becomes a shared layer), where it is an OverlayError."""
    import ctypes

    if not is_mounted(target):
        return
    libc = _libc()
    path = os.fsencode(target)
    if libc.umount2(path, 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EBUSY and detach and libc.umount2(path, MNT_DETACH) == 0:
        return
    if code in (errno.EINVAL, errno.ENOENT):
        return
    raise OverlayError(f"could not unmount {target}: {os.strerror(code)}")


def is_mounted(target: Path) -> bool:
    """Whether something is mounted at `target` (its device differs from its parent's); no link followed."""
    try:
        st = os.lstat(target)
        parent = os.lstat(target.parent)
    except OSError:
        return False
    return st.st_dev != parent.st_dev


def ensure_mounted(layers: Layers, target: Path, session_id: str, owner: str) -> None:
    """The session's copy mounted (again, after a reboot or an unmount), or a typed refusal: an
    unmounted copy is an empty directory, and reviewing or applying that would say every file was
    deleted."""
    with mount_lock(target.parent):
        if not is_mounted(target):
            _mount_again(layers, target, session_id, owner)


def _mount_again(layers: Layers, target: Path, session_id: str, owner: str) -> None:
    why = unusable()
    if why is not None:
        raise OverlayError(
            f"the copy of session {session_id} is a copy-on-write overlay that is not mounted, and this process "
            f"cannot mount it ({why}); run the command as the user who forked it (root), "
            f"or `oa-sandbox discard {session_id}`"
        )
    try:
        _finish_freeze(layers, target)
        for lower in (
            layers.lowers
        ):  # a freeze cut short before its layer was made inert: made inert now, before anyone stands on it
            if not os.path.lexists(Path(lower).parent / INERT):
                make_inert(Path(lower), owner, Path(lower).parent)
        os.makedirs(target, mode=0o700, exist_ok=True)
        mount(layers, target)
    except OSError as err:
        raise OverlayError(
            f"the copy of session {session_id} could not be mounted again: {err}; "
            f"`oa-sandbox discard {session_id}` removes it"
        ) from None
    except OpenAgentsError as err:  # OverlayError, or a layer that could not be made inert
        raise OverlayError(
            f"the copy of session {session_id} could not be mounted again: {err.message}; "
            f"`oa-sandbox discard {session_id}` removes it"
        ) from None


def like_root(upper: Path, lower: Path) -> None:
    """The upper's root as the merged root looked (its owner, mode and times): overlayfs shows the
    upper's root, and the box writes as the sandbox user."""
    st = os.lstat(lower)
    os.chown(upper, st.st_uid, st.st_gid, follow_symlinks=False)
    os.chmod(upper, stat.S_IMODE(st.st_mode))
    os.utime(upper, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _finish_freeze(layers: Layers, target: Path) -> None:
    """A freeze (cow.py) cut short between saving the record and moving the frozen directory into
    its layer: the layer names what it was taking (its `source`); the move is finished now."""
    top = Path(layers.lowers[0])
    if os.path.lexists(top):
        return
    try:
        source = Path((top.parent / "source").read_text(encoding="utf-8"))
    except OSError:
        return
    if (
        source in (target, Path(layers.upper))
        and source.is_dir()
        and not source.is_symlink()
        and not is_mounted(source)
    ):
        os.rename(source, top)
        os.mkdir(source, 0o700)
        like_root(Path(layers.upper), top)


def mounted_lowers() -> set[str]:
    """Every lower layer a fork overlay mounted now stands on (from /proc/self/mountinfo): a layer
    in use is never removed, whatever the records say."""
    out: set[str] = set()
    for _point, options in _fork_mounts():
        for option in options.split(b","):
            if option.startswith(b"lowerdir="):
                out.update(os.fsdecode(p) for p in option[len(b"lowerdir=") :].split(b":"))
    return out


def _fork_mounts() -> list[tuple[bytes, bytes]]:
    """(mount point, super options) of every fork overlay (source oa-fork) mounted now."""
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(b" ")
        try:
            sep = fields.index(b"-")
        except ValueError:
            continue
        if fields[sep + 1 : sep + 3] == [b"overlay", b"oa-fork"] and len(fields) > sep + 3:
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            found.append((point, fields[sep + 3]))
    return found


def mounts_under(root: Path) -> list[Path]:
    """This project's fork overlays mounted at or under `root` (as /proc/self/mountinfo lists
    them), deepest first: what a clean-up unmounts before it removes a directory tree."""
    prefix = os.fsencode(os.path.realpath(root))
    found = [
        Path(os.fsdecode(point)) for point, _ in _fork_mounts() if point == prefix or point.startswith(prefix + b"/")
    ]
    return sorted(found, key=lambda p: -len(p.parts))


def fork_upper(workspace: Path) -> Path | None:
    """The upper layer of the fork overlay mounted at `workspace` (what its writes cost on disk, for
    the write quota), or None when `workspace` is no fork's copy."""
    if not mounts_under(workspace) or not is_mounted(workspace):
        return None
    upper = workspace.parent / "cow" / "upper"
    return upper if upper.is_dir() and not upper.is_symlink() else None
