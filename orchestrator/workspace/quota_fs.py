"""The write quota enforced by the file system: where the host may mount (workspace/overlay.py's
`cannot_mount`: root or CAP_SYS_ADMIN, outside a user namespace), what a copy session's box writes
lands on an ext4 file system of its own, in a sparse image file in the session's directory on a
loop device, whose free space is the quota: the box gets ENOSPC, the host's disk grows by at most
the quota (plus the file system's journal). Elsewhere (bind mode, a non-root host) the quota is
watched (workspace/quota.py), as before.

    <session>/quota.img   the image (sparse: it costs the host what is written in it)
    <session>/quota/      where it is mounted (nosuid, nodev, discard: a deleted file gives the host its blocks back)
        tree/             a plain copy session's copy, bind-mounted at <session>/copy (what the box mounts)
        quarantine/       the integrity sweep's quarantine (a rename from the copy, never a copy)
        ballast           a file of ours, allocated, never written: it holds the file system's free space at the quota
    <session>/cow.img, <session>/cow/   a copy-on-write fork's: its overlay's upper and work directories in it

The box sees only `tree` (or the overlay merged over `cow/upper`), never the ballast. At each box
start (sandbox/base.py) the ballast is sized so that the box may write `write_quota` + SLACK more
(the image grows, online, when a resumed session asks for more than it has). Measured here: mkfs
of a 64 GiB sparse image 60 ms, mount 10 ms, unmount 4 ms; the image costs the host under 5 MiB
until written.

The loop device is attached with autoclear: it goes with the last unmount, or with this process if
it dies before the mount. The mounts outlive the process, as a fork's overlay does: a copy is
reviewed, applied or resumed later, by other commands. `discard` and `sessions prune` unmount them
(and so free the loop device); after a reboot the next command that needs the copy (`changes`,
`apply`, `run --resume`, `fork`) mounts it again (`ensure_mounted`, from records.open_own_record).
An image is never mounted twice: a loop device already on it is a typed refusal. No
program is looked up on the user's PATH: mkfs is taken from the system's directories only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any, Callable, TypeVar

from pydantic import BaseModel

from .. import state
from ..boxfs.private import open_private, open_private_dir
from ..errors import ErrorType, OpenAgentsError
from .overlay import _libc, cannot_mount, is_mounted, mount_lock, unmount

__all__ = [
    "SLACK",
    "QuotaFs",
    "capacity",
    "copy_into",
    "create",
    "enforced_at",
    "ensure_mounted",
    "fit",
    "quarantine_for",
    "set_headroom",
    "unmount_all",
    "unusable",
]

# free space above the quota: the watcher stops a session past the quota before the box meets ENOSPC (ext4 may
# refuse a write a little before it is full)
SLACK = 4 << 20
BLOCK = 4096
JOURNAL_MB = 16  # the journal is written in a ring: what the image costs the host beyond the data
GROW_STEP = 256 << 20  # a growth adds at least this much (it is sparse: free until written)
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # where mkfs is looked up: never the user's PATH
MKFS_TIMEOUT_S = 60.0
MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096
LOOP_SET_FD, LOOP_CLR_FD, LOOP_SET_STATUS64, LOOP_SET_CAPACITY, LOOP_CONFIGURE = 0x4C00, 0x4C01, 0x4C04, 0x4C07, 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
LO_FLAGS_AUTOCLEAR = 4
EXT4_IOC_RESIZE_FS = 0x40086610
T = TypeVar("T")


class QuotaFs(BaseModel):
    """A session's size-limited file system (kept in its record): the image, where it is mounted,
    and for a plain copy the copy's directory in it (bound at the session's copy/)."""

    image: str
    mount: str
    tree: str | None = None


def unusable() -> str | None:
    """Why this host process cannot give a session a size-limited file system (None: it can)."""
    choice = os.environ.get("OA_WRITE_QUOTA_FS", "auto").strip().lower()
    if choice in ("watch", "off", "0", "no"):
        return f"OA_WRITE_QUOTA_FS={choice}"
    why = cannot_mount()
    if why is not None:
        return why
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control is missing)"
    if _mkfs_tool() is None:
        return f"no mkfs.ext4 in {SYSTEM_PATH} (e2fsprogs)"
    return None


@functools.lru_cache(maxsize=1)
def _mkfs_tool() -> str | None:
    return shutil.which("mkfs.ext4", path=SYSTEM_PATH)


def image_size(data: int, entries: int, headroom: int) -> tuple[int, int]:
    """(bytes, inodes) of an image for a copy of `data` bytes in `entries` entries with `headroom`
    to write: generous (a file rounds up to a block, a directory takes blocks), since it is sparse
    and the ballast takes what is spare."""
    inodes = max(2 * entries + 250_000, 65_536)
    size = 2 * data + entries * 2 * BLOCK + inodes * 256 + headroom + SLACK + (JOURNAL_MB << 20) + GROW_STEP
    return (size + (1 << 20) - 1) >> 20 << 20, inodes


def create(image: Path, mount: Path, size: int, inodes: int) -> None:
    """A fresh ext4 file system of `size` bytes in the new sparse file `image`, mounted at `mount`
    (made here, empty); an OpenAgentsError (IO_ERROR) if anything refuses, and nothing left mounted."""
    try:
        fd = open_private(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        _mkfs(image, inodes)
        os.mkdir(mount, 0o700)
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"could not make the write quota's file system {image}: {err}"
        ) from None
    _mount(image, mount)


def _mkfs(image: Path, inodes: int) -> None:
    tool = _mkfs_tool()
    if tool is None:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"no mkfs.ext4 in {SYSTEM_PATH}")
    args = [
        tool,
        "-q",
        "-F",
        "-b",
        str(BLOCK),
        "-m",
        "0",
        "-N",
        str(inodes),
        "-J",
        f"size={JOURNAL_MB}",
        "-L",
        "oa-quota",
        "-O",
        "^resize_inode",
        "-E",
        "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
        str(image),
    ]
    try:
        done = subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=MKFS_TIMEOUT_S,
            check=False,
            env={"PATH": SYSTEM_PATH, "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"mkfs.ext4 failed on {image}: {err}") from None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"mkfs.ext4 failed on {image} (exit {done.returncode}): {(said or [''])[-1][:200]}"
        )


def _info64(flags: int, name: bytes) -> bytes:
    return struct.pack("=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, flags, name[:63], b"", b"", 0, 0)


def _attach(image: Path) -> tuple[int, str]:
    """A free loop device on `image`, with autoclear (it goes with its last user): (its open fd, its path)."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = open_private(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(32):  # another process may take the free device first
            number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
            path = f"/dev/loop{number}"
            loop = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                config = struct.pack("=II", backing, 0) + _info64(LO_FLAGS_AUTOCLEAR, os.fsencode(image)) + bytes(64)
                try:
                    fcntl.ioctl(loop, LOOP_CONFIGURE, config)
                except OSError as err:
                    if err.errno == errno.EBUSY:
                        os.close(loop)
                        continue
                    if err.errno not in (errno.EINVAL, errno.ENOTTY):
                        raise
                    _configure_old(loop, backing, image)  # a kernel before 5.8
                return loop, path
            except BaseException:
                os.close(loop)
                raise
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(backing)
        os.close(ctl)


def _configure_old(loop: int, backing: int, image: Path) -> None:
    fcntl.ioctl(loop, LOOP_SET_FD, backing)
    try:
        fcntl.ioctl(loop, LOOP_SET_STATUS64, _info64(LO_FLAGS_AUTOCLEAR, os.fsencode(image)))
    except OSError:
        fcntl.ioctl(loop, LOOP_CLR_FD, 0)
        raise


def _in_use(image: Path) -> bool:
    """Whether a loop device is already attached to `image` (a mount this process cannot see, or one
    detached while busy): mounting it again would be two file systems writing one image."""
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text(encoding="utf-8", errors="replace").strip() == str(image):
                return True
        except OSError:
            continue
    return False


def _mount(image: Path, target: Path) -> None:
    import ctypes

    if _in_use(image):
        raise OpenAgentsError(
            ErrorType.IO_ERROR,
            f"{image} is still attached to a loop device that is not mounted at {target} "
            "(a box or a process may still use it): end it, then try again",
        )
    try:
        loop, device = _attach(image)
    except OSError as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not attach a loop device to {image}: {err}") from None
    try:
        if (
            _libc().mount(device.encode(), os.fsencode(target), b"ext4", MS_NOSUID | MS_NODEV, b"discard,noinit_itable")
            != 0
        ):
            code = ctypes.get_errno()
            raise OpenAgentsError(ErrorType.IO_ERROR, f"could not mount {image} at {target}: {os.strerror(code)}")
    finally:
        os.close(loop)  # the mount holds the device now; without one, autoclear detaches it


def _bind(source: Path, target: Path) -> None:
    import ctypes

    if _libc().mount(os.fsencode(source), os.fsencode(target), None, MS_BIND, None) != 0:
        code = ctypes.get_errno()
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not bind {source} at {target}: {os.strerror(code)}")


def bind_copy(fs: QuotaFs, copy: Path) -> None:
    """A plain copy's tree in the file system, bound at the session's copy/ (made here if missing)."""
    assert fs.tree is not None
    os.makedirs(copy, mode=0o700, exist_ok=True)
    _bind(Path(fs.tree), copy)


def ensure_mounted(fs: QuotaFs, copy: Path, session_id: str) -> None:
    """The session's file system mounted (again, after a reboot or an unmount), and a plain copy's
    tree bound at `copy`; a typed refusal if it cannot be (an unmounted copy reads as every file deleted)."""
    mount = Path(fs.mount)
    with mount_lock(mount.parent):
        if not is_mounted(mount):
            why = unusable()
            if why is not None:
                raise OpenAgentsError(
                    ErrorType.IO_ERROR,
                    f"the copy of session {session_id} lies on a size-limited file system that is not "
                    f"mounted, and this process cannot mount it ({why}); run the command as the user "
                    f"who made it (root), or `oa-sandbox discard {session_id}`",
                )
            os.makedirs(mount, mode=0o700, exist_ok=True)
            _mount(Path(fs.image), mount)
        if fs.tree is not None and not is_mounted(copy):
            bind_copy(fs, copy)


def unmount_all(fs: QuotaFs, copy: Path) -> None:
    """A plain copy's bind, then the file system (its loop device goes with it)."""
    if fs.tree is not None:
        unmount(copy)
    unmount(Path(fs.mount))


def copy_into(record: Any, headroom: int, data: int, entries: int, copy: Callable[[Path], T]) -> T:
    """A plain copy session's copy made on a file system of its own: `copy(tree)` fills the tree in
    a fresh image with room for `data` bytes in `entries` entries and `headroom` more, bound at the
    record's copy/ when done. The record names the file system before it exists (a crash leaves
    nothing that discard or prune would not find); a failure unmounts and removes it."""
    fs = QuotaFs(
        image=str(record.dir / "quota.img"), mount=str(record.dir / "quota"), tree=str(record.dir / "quota" / "tree")
    )
    record.quota_fs = fs
    record.save()
    size, inodes = image_size(data, entries, headroom)
    made = False
    try:
        create(Path(fs.image), Path(fs.mount), size, inodes)
        made = True
        out = copy(Path(fs.tree or ""))
        bind_copy(fs, Path(record.box_workspace))
        if hasattr(out, "copy_dir"):
            out.copy_dir = record.box_workspace  # the same inodes, seen where the box and every command see them
        return out
    except BaseException:
        if made:
            unmount_all(fs, Path(record.box_workspace))
        for path in (Path(fs.image), Path(fs.mount)):
            with contextlib.suppress(OSError):  # (a mount point left mounted is not removed: rmdir refuses it)
                os.rmdir(path) if path.is_dir() and not path.is_symlink() else os.unlink(path)
        record.quota_fs = None
        record.save()
        raise


def capacity(mount: Path) -> int:
    """What the box could be given on the file system at `mount`: its free space and the ballast's."""
    try:
        held = os.lstat(mount / "ballast").st_blocks * 512
    except FileNotFoundError:
        held = 0
    st = os.statvfs(mount)
    return st.f_bavail * st.f_frsize + held


def fit(record: Any, free: int) -> None:
    """A resumed session's file system made big enough to give the box `free` bytes (a resume may
    ask for a bigger quota than the session had): grown online, or, where the kernel refuses that
    (no CAP_SYS_RESOURCE), unmounted, grown by resize2fs and mounted again, with what stands on it."""
    fs: QuotaFs | None = record.quota_fs
    if fs is None:
        return
    mount, copy = Path(fs.mount), Path(record.box_workspace)
    ensure_mounted(fs, copy, record.id)
    short = free + 8 * BLOCK - capacity(mount)
    if short <= 0:
        return
    try:
        _grow(mount, short + GROW_STEP)
        return
    except OSError as err:
        if err.errno != errno.EPERM:
            raise OpenAgentsError(
                ErrorType.IO_ERROR, f"could not grow the write quota's file system {fs.image}: {err}"
            ) from None
    with mount_lock(mount.parent):
        unmount(copy, detach=False)
        unmount(mount, detach=False)
        try:
            _resize_offline(Path(fs.image), short + GROW_STEP)
        finally:
            _mount(Path(fs.image), mount)
    if fs.tree is not None:
        ensure_mounted(fs, copy, record.id)
    elif record.cow is not None:
        from .overlay import ensure_mounted as overlay_mounted

        overlay_mounted(record.cow, copy, record.id, record.user)


def _resize_offline(image: Path, extra: int) -> None:
    tool = shutil.which("resize2fs", path=SYSTEM_PATH)
    if tool is None:
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"no resize2fs in {SYSTEM_PATH}: the write quota's file system {image} cannot grow"
        )
    fd = open_private(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = (os.fstat(fd).st_size + extra + (1 << 20) - 1) >> 20 << 20
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    done = subprocess.run(
        [tool, "-f", str(image)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=MKFS_TIMEOUT_S,
        check=False,
        env={"PATH": SYSTEM_PATH, "LC_ALL": "C"},
    )
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"resize2fs failed on {image} (exit {done.returncode}): {(said or [''])[-1][:200]}"
        )


def _ours(mount: Path) -> bool:
    """Whether `mount` is a session's size-limited file system: a loop device on `<mount>.img`, in
    the caller's sessions directory (never a file system that merely lies beside a workspace)."""
    image = mount.parent / (mount.name + ".img")
    if mount.parent.parent != state.own_subdir("sessions") or not is_mounted(mount):
        return False
    try:
        dev = os.stat(mount).st_dev
        with open(
            f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/loop/backing_file", encoding="utf-8", errors="replace"
        ) as fh:
            backing = fh.read().strip()
    except OSError:
        return False
    return backing == str(image)


def enforced_at(workspace: Path) -> Path | None:
    """The mount point of the size-limited file system that takes a box's writes on `workspace` (a
    session's copy: a plain one bound from `quota/tree`, or a fork's overlay whose upper lies in
    `cow/`), or None where the quota is only watched."""
    quota, cow = workspace.parent / "quota", workspace.parent / "cow"
    try:
        if _ours(quota) and os.stat(workspace).st_dev == os.stat(quota).st_dev:
            return quota
        if _ours(cow) and is_mounted(workspace) and os.statvfs(workspace).f_fsid == os.statvfs(cow / "upper").f_fsid:
            return cow
    except OSError:
        return None
    return None


def quarantine_for(workspace: Path) -> Path | None:
    """Where the sweep moves what it takes out of a plain copy on a size-limited file system: in
    that file system (a rename), beside the tree and out of the box's view."""
    mount = enforced_at(workspace)
    return mount / "quarantine" if mount is not None and mount.name == "quota" else None


def set_headroom(mount: Path, free: int) -> None:
    """Size the ballast so that the file system at `mount` has `free` bytes free for the box (grown
    online when it has not that much room). OpenAgentsError (IO_ERROR) if it cannot."""
    try:
        fd = open_private(mount / "ballast", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not set the write quota on {mount}: {err}") from None
    try:
        aim = free + 4 * BLOCK  # the ballast's own extent blocks come and go with its size
        for _ in range(8):
            avail = _avail(fd)
            held = os.fstat(fd).st_blocks * 512
            if avail + held < aim:
                _grow(mount, aim - avail - held + GROW_STEP)
                continue
            if free <= avail < aim + 16 * BLOCK:
                return
            target = max(0, held - (aim - avail)) // BLOCK * BLOCK
            if target < held:
                os.ftruncate(fd, target)
            elif target > held:
                os.posix_fallocate(fd, 0, target)
        if _avail(fd) < free:
            raise OSError(errno.ENOSPC, f"{_avail(fd)} bytes free, not {free}")
    except OSError as err:
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not set the write quota on {mount}: {err}") from None
    finally:
        os.close(fd)


def _avail(fd: int) -> int:
    st = os.fstatvfs(fd)
    return st.f_bavail * st.f_frsize


def _grow(mount: Path, extra: int) -> None:
    """The image, its loop device and the ext4 on it made `extra` bytes bigger, online."""
    image = mount.parent / (mount.name + ".img")
    dev = os.stat(mount).st_dev
    sysdir = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    with open(f"{sysdir}/loop/backing_file", encoding="utf-8", errors="replace") as fh:
        if fh.read().strip() != str(image):
            raise OSError(errno.EINVAL, f"{mount} is not mounted from {image}")
    with open(f"{sysdir}/uevent", encoding="utf-8", errors="replace") as fh:
        name = next((line.split("=", 1)[1].strip() for line in fh if line.startswith("DEVNAME=")), "")
    if not name.startswith("loop") or "/" in name:
        raise OSError(errno.EINVAL, f"{mount}'s device is not a loop device")
    fd = open_private(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = (os.fstat(fd).st_size + extra + (1 << 20) - 1) >> 20 << 20
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    loop = os.open(f"/dev/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(loop, LOOP_SET_CAPACITY, 0)
    finally:
        os.close(loop)
    top = open_private_dir(mount)
    try:
        fcntl.ioctl(top, EXT4_IOC_RESIZE_FS, struct.pack("=Q", size // BLOCK))
    finally:
        os.close(top)
