"""Apply's writes: the planned changes carried into the real workspace, each landing atomically.

Only this module writes to the user's workspace. Each file lands through boxfs.write_atomic (a
temp name, fsync, rename: old or new, never half), each entry is re-checked at write time (the box
may still be running), and an entry swapped since the plan is left out, never written through.
"""

from __future__ import annotations

import os
import stat

from ...boxfs import BoxDir, HostBudget, from_store
from ...errors import OpenAgentsError
from ..copy import CopyManifest
from .nofollow import _open_dir, _open_file, _parent
from .plan import _Act, _Planner
from .report import ApplyReport, Normalised
from .scan import _box_made_link


def _owner(real: os.stat_result | None, manifest: CopyManifest) -> tuple[int, int]:
    return (real.st_uid, real.st_gid) if real is not None else (manifest.real_uid, manifest.real_gid)


class _Applier(_Planner):
    """The plan, then the writes: parents before children, deletions children first, and a
    directory the box replaced last; each directory fsynced once at the end."""

    def __init__(self, manifest: CopyManifest, budget: HostBudget | None = None) -> None:
        super().__init__(manifest, budget)
        self.touched: set[str] = set()  # directories whose entries changed: fsynced once, at the end

    # -- writing

    def run(self) -> ApplyReport:
        ok = self.plan(clean=True)
        if self.report.conflicts:
            return self.report  # nothing is applied: the CLI says so and exits 1
        deletes = [a for a in ok if a.op == "delete"]
        first = [a for a in ok if a.op != "delete" and not a.replaces_dir]
        last = [a for a in ok if a.op != "delete" and a.replaces_dir]
        for act in first:  # parents before children
            self._do(act)
        for act in reversed(deletes):  # children before parents
            self._do(act)
        for act in last:  # a directory the box replaced, now emptied
            self._do(act)
        self._sync_dirs()
        return self.report

    def _sync_dirs(self) -> None:
        """Each file's data was fsynced before its rename; the renames themselves are made durable
        here, once per directory (a crash before this leaves each file old or new, never torn)."""
        for rel in sorted(self.touched):
            try:
                fd = _open_dir(self.real_fd, rel)
            except OSError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _do(self, act: _Act) -> None:
        where = act.path.rpartition("/")[0]
        try:
            parent, name = _parent(self.real_fd, act.path)
        except OSError as err:
            self.leave(act.path, f"not applied: {err.strerror}")
            return
        try:
            getattr(self, f"_{act.op}")(act, BoxDir.at(parent, self.budget), name)
            self.touched.add(where)
            self.report.applied.append(act.path)
            if act.op in ("write", "chmod") and act.mode != act.box_mode:
                self.report.normalised.append(
                    Normalised(path=act.path, box_mode=f"{act.box_mode:04o}", mode=f"{act.mode:04o}")
                )
        except _Refused as err:
            self.leave(act.path, str(err))
        except OpenAgentsError as err:  # boxfs refused an entry swapped since the check
            self.leave(act.path, f"not applied: {err.message}")
        except OSError as err:
            self.leave(act.path, f"not applied: {err.strerror}")
        finally:
            os.close(parent)

    def _mkdir(self, act: _Act, parent: BoxDir, name: bytes) -> None:
        if act.real is not None:
            parent.unlink(name)  # a file or a symlink the box turned into a directory
        parent.mkdir(name, 0o755)
        with parent.sub(name) as made:
            _chown(made.fd, *_owner(None, self.m))
            os.fchmod(made.fd, 0o755)

    def _write(self, act: _Act, parent: BoxDir, name: bytes) -> None:
        src = _open_file(self.copy_fd, act.path)
        try:
            st = os.fstat(src)
            if _box_made_link(self.m, act.path, st.st_ino, st.st_nlink):
                raise _Refused(f"a hard link ({st.st_nlink} names) made in the box is never carried")
            uid, gid = _settable(
                *_owner(act.real if act.real is not None and stat.S_ISREG(act.real.st_mode) else None, self.m)
            )
            if act.replaces_dir:
                parent.rmdir(name)  # emptied by the deletions before
            # a temp name, fsync, rename: old or new, never half; holes kept (a sparse file stays sparse)
            parent.write_atomic(name, src, mode=act.mode, uid=uid, gid=gid)
        finally:
            os.close(src)

    def _chmod(self, act: _Act, parent: BoxDir, name: bytes) -> None:
        try:
            fd = parent.open_file(name)[0]
        except OpenAgentsError:
            raise _Refused("no longer a regular file in the real workspace") from None
        try:
            os.fchmod(fd, act.mode)
        finally:
            os.close(fd)

    def _symlink(self, act: _Act, parent: BoxDir, name: bytes) -> None:
        parent.replace_link(from_store(act.target), name, _owner(act.real, self.m), act.replaces_dir)

    def _delete(self, act: _Act, parent: BoxDir, name: bytes) -> None:
        st = parent.lstat(name)
        if stat.S_ISDIR(st.st_mode):
            parent.rmdir(name)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            parent.unlink(name)
        else:
            raise _Refused("not a file, directory or symlink in the real workspace: left alone")


class _Refused(Exception):
    """Something found at write time that the plan did not allow (the box may still be running)."""


def _settable(uid: int, gid: int) -> tuple[int | None, int | None]:
    """The owner write_atomic may give a file: any as root, else only our own (None: as created)."""
    if os.geteuid() == 0 or uid == os.geteuid() and (gid == os.getegid() or gid in os.getgroups()):
        return uid, gid
    return None, None


def _chown(fd: int, uid: int, gid: int) -> None:
    try:
        os.fchown(fd, uid, gid)
    except PermissionError:
        pass  # not root: the file is ours, which is the best an unprivileged apply can do


def apply_changes(manifest: CopyManifest, budget: HostBudget | None = None) -> ApplyReport:
    """Carry the box's changes into the real workspace, sanitised; nothing at all on a conflict.

    Returns what was applied, what was left out (with why) and the conflicts; the caller exits 1
    when there are conflicts. Safe to run again after an interruption. The scan of the copy and
    the bytes written are bounded by `budget` (default: boxfs's, with the copy's depth: nothing
    apply makes is deeper than the next copy takes).
    """
    applier = _Applier(manifest, budget)
    try:
        return applier.run()
    finally:
        applier.close()
