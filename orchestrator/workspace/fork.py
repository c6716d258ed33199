"""Forking an ended copy session into N independent copy sessions (`oa-sandbox fork ID -n N`).

Each fork is a normal copy session: its own record (naming its parent in `forked_from`), its own
copy of the parent's copy (at its latest state, or restored to a checkpoint turn), its own manifest
(so `changes` shows what the parent's box and the fork's box changed against the real workspace,
and `apply` checks the real workspace as the parent's would), its own checkpoint store and pinned
authority, its own box when one is started on it (`run --resume FORK`).

Where the host may mount (root or CAP_SYS_ADMIN, outside a user namespace: overlay.unusable), a
fork's copy is a kernel overlay over the parent's frozen state (workspace/cow.py): no data is
copied, and a fork costs a few directories and a mount (bench/fork.py measures both ways against
`cp -a`). Elsewhere (a non-root host) the parent's copy, box-written, is copied through
orchestrator/boxfs (copy_workspace's walk: bounded, no link followed, FIFOs/sockets/devices left
out, setuid/setgid dropped, every entry owned by the sandbox uid), data cloned with FICLONE where
the file system can, else copied (holes kept). Never a hard link to a box-written file: a fork
never shares a writable inode with its parent or a sibling, either way.

Whose session it is comes from the file system (records.open_own_record): another user's is
refused (PERMISSION_DENIED); a running, discarded, failed or bind-mode session is refused typed.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Callable

from ..boxfs import BoxDir, HostBudget, open_dir, open_regular, punch_copy
from ..boxfs.atomic import write_atomic
from ..boxfs.private import create_private, open_private
from ..errors import ErrorType, OpenAgentsError
from .cleanup import discard_state
from .copy import CopyLimits, CopyManifest, ManifestEntry, copy_workspace
from .copy_session import ended_copy_session
from .fork_limits import MAX_FORKS
from .records import SessionRecord, WorkspaceMode, new_record

TRANSCRIPT_CAP = 256 << 20  # as resume reads at most

# Whether a box still has this copy mounted: True, False, or None when nobody can tell (no daemon).
BoxCheck = Callable[[str], "bool | None"]

__all__ = ["MAX_FORKS", "BoxCheck", "fork_session"]


def fork_session(
    session_id: str,
    n: int,
    turn: int | None = None,
    limits: CopyLimits | None = None,
    live: bool = False,
    box_on_copy: BoxCheck | None = None,
) -> list[SessionRecord]:
    """Fork the caller's ended copy session `session_id` into `n` new copy sessions (at its latest
    state, or at the state after checkpoint `turn`); returns their records. All or none: a fork that
    fails removes the ones already made, and the typed error is raised. `live`: the session is this
    very process's, still open (the MCP server forking the session it serves): its box may be
    writing its copy, so the forks are data copies put back to a checkpoint (its latest unless
    `turn`), never a freeze of a copy a box has mounted.

    `box_on_copy(path)` (sandbox.docker.box_on_copy) asks whether a box still has the parent's copy
    mounted, though its session ended (a host killed before it removed its box). A freeze renames the
    copy into a shared layer, and a process still inside would follow the inode and write into every
    fork: such a box is a typed refusal; where nobody can tell (no check given, no daemon) the forks
    are data copies, which rename nothing."""
    from .records import ResumeLock

    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FORKS:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"a session forks into 1 to {MAX_FORKS} sessions at once, not {n!r}"
        )
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"--turn takes a checkpoint's turn (0 or more), not {turn!r}"
        )
    if live:
        return _fork_live(session_id, n, turn, limits or CopyLimits())
    parent = ended_copy_session(session_id, "fork")
    lock = ResumeLock(parent)  # no resume of the parent starts while its copy is being read
    try:
        parent = ended_copy_session(session_id, "fork")
        if parent.status == "failed" or not os.path.isdir(parent.box_workspace) or not parent.manifest_path.is_file():
            raise OpenAgentsError(
                ErrorType.FILE_NOT_FOUND,
                f"session {parent.id} has no copy to fork ({parent.status}: {parent.reason})"[:400],
            )
        if turn is not None:
            turn = _checkpoint_turn(parent, turn)
        lowers = _layers(parent, box_on_copy)
        manifest = CopyManifest.load(parent.manifest_path) if lowers is None else None  # an overlay fork needs no parse
        made: list[SessionRecord] = []
        try:
            for _ in range(n):
                made.append(_fork_one(parent, manifest, turn, limits or CopyLimits(), lowers))
        except BaseException:
            for record in made:
                _failed(record, "a sibling fork failed")
            raise
        return made
    finally:
        lock.release()


def _fork_live(session_id: str, n: int, turn: int | None, limits: CopyLimits) -> list[SessionRecord]:
    from .records import open_own_record

    parent = open_own_record(session_id)
    if parent.mode != WorkspaceMode.COPY or parent.discarded or parent.host_pid != os.getpid():
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {parent.id} is not this process's open copy session"
        )
    turn = _checkpoint_turn(parent, turn if turn is not None else 1 << 30, live=True)
    manifest = CopyManifest.load(parent.manifest_path)
    made: list[SessionRecord] = []
    try:
        for _ in range(n):
            made.append(_fork_one(parent, manifest, turn, limits, None))
    except BaseException:
        for record in made:
            _failed(record, "a sibling fork failed")
        raise
    return made


def _layers(parent: SessionRecord, box_on_copy: BoxCheck | None) -> list[str] | None:
    """The frozen layers the forks stand on (cow.fork_layers), None for data copies; a freeze
    that failed leaves the parent as it was, and the forks are data copies."""
    from .cow import fork_layers

    held = box_on_copy(parent.box_workspace) if box_on_copy is not None else None
    if held:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"session {parent.id} ended, but a box still runs on its copy (its process "
            "did not remove it): end that process, or `oa-sandbox gc --all` (every box of "
            "ours, live ones too); then fork",
        )
    if held is None:
        return None

    try:
        return fork_layers(parent)
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.IO_ERROR, f"could not freeze session {parent.id}'s copy for a fork: {err}"
        ) from None


def _checkpoint_turn(parent: SessionRecord, turn: int, live: bool = False) -> int:
    """The checkpoint that holds the state after `turn` (a turn that changed nothing has none: the
    one before it); `live`: an open session's, whose record does not count its turns yet."""
    from .checkpoints import CheckpointStore

    with CheckpointStore(parent.checkpoint_store, Path(parent.box_workspace)) as store:
        points = store.list()
    last = parent.turns if parent.turns is not None and not live else max((p.turn for p in points), default=0)
    if live:
        turn = min(turn, last)
    if turn > last:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {parent.id} ran {last} turn(s): there is no turn {turn} to fork from"
        )
    earlier = [p.turn for p in points if p.ok and p.turn <= turn]
    if not earlier:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"session {parent.id} has no checkpoint at or before turn {turn}"
        )
    return max(earlier)


def _failed(record: SessionRecord, why: str) -> None:
    try:
        record.status, record.reason = "failed", f"fork failed: {why}"[:500]
        discard_state(record)
    except OSError:
        pass


def _fork_one(
    parent: SessionRecord, manifest: CopyManifest | None, turn: int | None, limits: CopyLimits, lowers: list[str] | None
) -> SessionRecord:
    record = new_record(Path(parent.workspace), WorkspaceMode.COPY, parent.user, kind=parent.kind)
    try:
        for field in ("model_spec", "base_url", "api_key_env", "policy_files", "pins", "context_root", "labels"):
            setattr(record, field, getattr(parent, field))
        record.forked_from, record.forked_turn = parent.id, turn
        record.turns = parent.turns if turn is None else turn
        record.save()
        uid, gid = (int(x) for x in parent.user.split(":", 1))
        dest = Path(record.box_workspace)
        if lowers is not None:  # an overlay: what the fork sees is the parent's, inode numbers too (one file system)
            from .cow import make_fork_copy

            make_fork_copy(record, lowers)
            _same_manifest(parent.manifest_path, record.manifest_path, dest)
        else:
            assert manifest is not None
            copied = _data_copy(parent, record, dest, uid, gid, limits)
            _fork_manifest(manifest, copied, dest, uid, gid).save(record.manifest_path)
        me = os.getuid(), os.getgid()
        for name in ("pins", "checkpoints.git"):  # host-written, copied (a store's objects linked): no link followed
            if (parent.dir / name).is_dir() and not (parent.dir / name).is_symlink():
                if name == "checkpoints.git":
                    _share_store(parent.dir / name, record.dir / name, limits.copy_budget())
                else:
                    copy_workspace(parent.dir / name, record.dir / name, *me, budget=limits.copy_budget())
                os.chmod(record.dir / name, 0o700)
        record.transcript = str(record.dir / "transcript.jsonl")
        if turn is None:
            _copy_transcript(parent, record)
        else:
            _restore(record, turn)
            _new_file(record.dir, b"transcript.jsonl")  # a fresh conversation from that turn's files
        record.status, record.reason, record.host_pid = (
            "finished",
            f"forked from {parent.id}" + (f" at turn {turn}" if turn is not None else ""),
            0,
        )
        record.applied = False
        record.save()
    except OSError as err:
        _failed(record, str(err))
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not fork session {parent.id}: {err}") from None
    except BaseException as err:
        _failed(record, str(err))
        raise
    return record


def _data_copy(
    parent: SessionRecord, record: SessionRecord, dest: Path, uid: int, gid: int, limits: CopyLimits
) -> CopyManifest:
    """The parent's copy copied for a fork: where the host may mount, onto a size-limited file
    system of the fork's own (quota_fs), with room for the default quota until a box sets its own."""
    from ..config import SandboxConfig
    from . import quota_fs

    source = Path(parent.box_workspace)
    if quota_fs.unusable() is not None:
        return copy_workspace(source, dest, uid, gid, budget=limits.copy_budget(), reflinks=_clones(record.dir))
    if (
        parent.quota_fs is not None and parent.quota_fs.tree is not None
    ):  # its own file system holds it alone (and the ballast)
        st = os.statvfs(parent.quota_fs.mount)
        ballast = Path(parent.quota_fs.mount) / "ballast"
        held = ballast.lstat().st_blocks * 512 if ballast.is_file() else 0
        data, entries = (st.f_blocks - st.f_bfree) * st.f_frsize - held, st.f_files - st.f_ffree
    else:
        from .copy import measure_workspace

        size = measure_workspace(source, CopyLimits(max_bytes=1 << 62, max_entries=1 << 40))
        data, entries = size.bytes, size.entries
    return quota_fs.copy_into(
        record,
        SandboxConfig.model_fields["write_quota"].default,
        data,
        entries,
        lambda tree: copy_workspace(source, tree, uid, gid, budget=limits.copy_budget(), reflinks=False),
    )


def _clones(directory: Path) -> bool:
    """Whether the file system under `directory` clones (FICLONE): probed once per fork with two
    files of our own, so a file system without reflinks is not asked again for every file."""
    import fcntl

    from ..boxfs.copy import FICLONE

    a, b = directory / ".oa-clone-probe-a", directory / ".oa-clone-probe-b"
    try:
        fa = open_private(a, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            os.write(fa, b"\0" * 4096)
            fb = create_private(b)
            try:
                fcntl.ioctl(fb, FICLONE, fa)
                return True
            except OSError:
                return False
            finally:
                os.close(fb)
        finally:
            os.close(fa)
    except OSError:
        return True  # not known: copy_regular tries each file and falls back by itself
    finally:
        for name in (a, b):
            try:
                os.unlink(name)
            except OSError:
                pass


_OBJECT = re.compile(rb"^objects/(pack/pack-[0-9a-f]{40,64}\.(pack|idx|rev)|[0-9a-f]{2}/[0-9a-f]{38,62})$")


def _share_store(src: Path, dst: Path, budget: HostBudget) -> None:
    """The parent's checkpoint store for the fork: its git objects hard-linked (host-written, never
    in a box, never written again: git writes an object once, under its hash, and packing writes new
    packs and unlinks the old), everything else (the index of checkpoints, refs, config) copied. A
    long session's store is about its workspace's size: copied per fork, it would be the disk a
    copy-on-write fork saves."""
    import shutil

    from ..boxfs import Walk

    os.mkdir(dst, 0o700)
    for entry in Walk(src, budget, sort=True).entries():  # (the store is ours: its paths are used as paths)
        here, there = src / os.fsdecode(entry.rel), dst / os.fsdecode(entry.rel)
        if stat.S_ISDIR(entry.st.st_mode):
            os.mkdir(there, 0o700)
        elif stat.S_ISREG(entry.st.st_mode) and _OBJECT.match(entry.rel):
            os.link(here, there, follow_symlinks=False)
        elif stat.S_ISREG(entry.st.st_mode):
            shutil.copyfile(here, there, follow_symlinks=False)
            os.chmod(there, stat.S_IMODE(entry.st.st_mode) & 0o700)


def _same_manifest(parent: Path, fork: Path, dest: Path) -> None:
    """An overlay fork's manifest: the parent's (every stamp, inode numbers too, is what the fork
    sees: the layers are one file system), naming the fork's copy. The parent's file (host-written)
    is copied with its `copy_dir` replaced, not parsed: 30k entries take 0.6 s to validate; where
    the text is not as this version writes it, it is parsed and saved after all."""
    raw = parent.read_bytes()
    key = raw.find(b'"copy_dir":')
    try:
        if key < 0:
            raise ValueError("no copy_dir")
        start = key + len(b'"copy_dir":')
        _, end = json.JSONDecoder().raw_decode(raw[start : start + 65536].decode("utf-8", "strict"))
        value = raw[start : start + 65536].decode("utf-8")[:end].encode("utf-8")
        text = raw[:start] + json.dumps(str(dest), ensure_ascii=False).encode("utf-8") + raw[start + len(value) :]
    except ValueError:
        CopyManifest.load(parent).model_copy(update={"copy_dir": str(dest)}).save(fork)
        return
    write_atomic(fork, text)


def _fork_manifest(parent: CopyManifest, copied: CopyManifest, dest: Path, uid: int, gid: int) -> CopyManifest:
    """The fork's manifest: the real workspace's stamps as the parent took them (so `apply` checks the
    user's files against the same moment), the copy's stamps as the parent's copy first was (so what
    the parent's box changed is a change of the fork's too), with the fork's own inode for an entry
    the parent's box left as it was (so hard-link groups of the real tree stay groups)."""
    out = CopyManifest(
        real=parent.real,
        copy_dir=str(dest),
        uid=uid,
        gid=gid,
        real_uid=parent.real_uid,
        real_gid=parent.real_gid,
        left_out=dict(parent.left_out),
        took_s=copied.took_s,
        host_code=list(parent.host_code),
    )
    for key, entry in parent.entries.items():
        got = copied.entries.get(key)
        if got is not None and entry.copy.same_as(got.real):
            out.entries[key] = ManifestEntry(entry.real, got.copy)
        else:
            out.entries[key] = entry
    return out


def _copy_transcript(parent: SessionRecord, record: SessionRecord) -> None:
    """The parent's conversation, so `run --resume FORK` goes on from it (bounded, no link followed)."""
    if not parent.transcript or not os.path.lexists(parent.transcript):
        _new_file(record.dir, b"transcript.jsonl")
        return
    src = Path(parent.transcript)
    src_fd, dst_fd = open_dir(src.parent), open_dir(record.dir)
    try:
        _copy_named(src_fd, src.name, dst_fd)
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def _copy_named(src_fd: int, name: str, dst_fd: int) -> None:
    """The transcript (wherever --transcript put it) copied as the fork's own transcript.jsonl."""
    fin, _ = open_regular(src_fd, os.fsencode(name), None)
    try:
        fout = BoxDir.at(dst_fd).create("transcript.jsonl")
        try:
            punch_copy(fin, fout, HostBudget.until(60.0, max_bytes=TRANSCRIPT_CAP, max_entries=None))
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _new_file(directory: Path, name: bytes) -> None:
    fd = open_dir(directory)
    try:
        os.close(BoxDir.at(fd).create(name))
    finally:
        os.close(fd)


def _restore(record: SessionRecord, turn: int) -> None:
    """The fork's copy put back to the state after `turn`, through its own copy of the checkpoint store."""
    from .checkpoints import CheckpointStore

    with CheckpointStore(record.checkpoint_store, Path(record.box_workspace)) as store:
        report = store.restore(turn)
    if report.conflicts:
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS,
            f"the copy changed since its last checkpoint ({len(report.conflicts)} file(s)): "
            f"cannot fork it at turn {turn}",
        )
