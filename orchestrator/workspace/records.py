"""Sessions a user can name: an id, a record, and the state a session leaves outside the workspace.

    $XDG_STATE_HOME/openagents-sandbox/sessions/<id>/
        session.json        this record
        transcript.jsonl    unless --transcript put it elsewhere
        copy/               copy mode: the box's workspace
        quota.img, quota/   copy mode where the host may mount: the size-limited file system the copy
                            lies on (quota_fs.py)
        manifest.json       copy mode: how every entry looked when the copy was taken
        checkpoints.git/    the shadow object store of the checkpoints
        quarantine/         what the integrity sweep moved out

`discard` (copy mode; cleanup.py, with `prune`) removes all of it but session.json, which stays, marked discarded, so
`oa-sandbox sessions` still says the session existed and what became of it (a few hundred bytes; a
transcript given with --transcript outside this directory is the user's file and stays too).
`prune` removes whole session directories, records included. Everything under a session directory
may hold box-written entries, so it is removed through boxfs.remove_tree (no link followed).

Whose session a record is comes from the file system, never from the record's text: a record is the
caller's only if its session directory and its session.json are owned by the caller (fstat on what
was opened, no link followed). `host_uid` in the JSON is informational. `open_own_record` is the one
way every command that acts on a session (resume, continue, apply, changes, discard, rollback,
checkpoints, transcript, the servers) gets a record; another user's is refused (NotOwnRecord, naming
the owner). Records are read bounded (RECORD_CAP) and parsed as untrusted data.

Workspace modes: `bind` mounts the real workspace; `copy` mounts a private copy owned by the
unprivileged sandbox uid, and nothing reaches the real one until `apply`. `auto` is copy for a
root-owned workspace (every CI clone made as root) and bind otherwise, so the box never needs uid 0.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, PrivateAttr, ValidationError

from .. import state
from ..boxfs.atomic import write_atomic
from ..boxfs.private import open_private
from ..errors import ErrorType, OpenAgentsError
from . import quota_fs
from .overlay import Layers, ensure_mounted
from .quota_fs import QuotaFs

if TYPE_CHECKING:
    from .copy import CopyLimits
    from .integrity import Baseline

SANDBOX_UID = 1000  # the image's unprivileged user; copies are owned by it
_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
RECORD_CAP = 8 << 20  # bytes of session.json read at most; a record is a few KiB (its files_changed may be long)


class Pin(BaseModel):
    """A file that granted authority at the session's start (a policy, the user's config), pinned:
    its resolved path, the digest of its content then, where the copy of that content is kept (in
    the session's directory, which no box reaches), and whether it lay where a box could write it
    (then it never counted above the workspace tier)."""

    role: str  # policy | admin_policy | user_config
    path: str
    sha256: str
    pinned: str  # a file name under the session's pins/
    box_reach: bool = False


class NotOwnRecord(OpenAgentsError):
    """A session record that is not the caller's (its directory or file is another user's)."""

    def __init__(self, session_id: str, owner: int, what: str = "session") -> None:
        self.owner = owner
        super().__init__(
            ErrorType.PERMISSION_DENIED,
            f"{what} {session_id} belongs to {_user_name(owner)}, not to you "
            f"({_user_name(os.getuid())}): only its owner may use it (`oa-sandbox sessions --all-users` lists it)",
        )


def _user_name(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


class WorkspaceMode(str, Enum):
    AUTO = "auto"
    BIND = "bind"
    COPY = "copy"


class SessionRecord(BaseModel):
    id: str
    created: float
    kind: str = "run"  # run | exec | acp
    workspace: str  # the user's real workspace
    mode: WorkspaceMode
    box_workspace: str  # what the box mounts: the real workspace, or the copy
    user: str  # uid:gid the box runs as
    status: str = "running"  # running | finished | stopped | cancelled | failed
    reason: str = ""
    files_changed: list[str] = []
    transcript: str | None = None
    host_pid: int = 0
    applied: bool = False
    discarded: bool = False
    host_uid: int | None = None  # who ran it, as the writer said: informational only (ownership is the file's owner)
    turns: int | None = None  # how many turns the session ran, when it had turns (run); a resumed run's count on
    # What a resume takes again unless told otherwise (resume.py): the model, its endpoint and key's
    # variable (never the key), the user's policy files; the digest of the root's AGENTS.md at the start.
    model_spec: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    policy_files: list[str] = []
    context_root: str | None = None  # sha256 hex, "absent", or None (not read, or an older record)
    resumes: int = 0  # how many times the session was resumed
    pins: list[Pin] = []  # the authority in force at the start, pinned (policy/pins.py)
    forked_from: str | None = None  # the session this one was forked from (workspace/fork.py)
    forked_turn: int | None = None  # the parent's checkpoint turn it was forked at (None: its latest state)
    cow: Layers | None = None  # its copy is a copy-on-write overlay (workspace/cow.py): how to mount it again
    quota_fs: QuotaFs | None = (
        None  # its copy (or its overlay's upper) lies on a size-limited file system (quota_fs.py)
    )
    labels: dict[str, str] = {}  # a program's own names for it (the API's labels=; a fork keeps its parent's)
    _dir: Path | None = PrivateAttr(default=None)  # where it was read from
    _owner: int | None = PrivateAttr(default=None)  # the owner of its directory and file, by fstat
    _cow_dropped: bool = PrivateAttr(default=False)  # drop_cow() was called: save() writes no layers
    _fresh_baseline: "Baseline | None" = PrivateAttr(default=None)  # prepare()'s copy's baseline (copy_census.py)

    def take_fresh_baseline(self) -> "Baseline | None":
        """The integrity baseline counted while prepare() made this session's copy, once (the box's
        sweep then needs no walk of the copy before the first answer); None in bind mode, on resume,
        or once taken."""
        baseline, self._fresh_baseline = self._fresh_baseline, None
        return baseline

    @property
    def dir(self) -> Path:
        return self._dir or sessions_root() / self.id

    @property
    def owner(self) -> int:
        """The uid owning the record (its file and directory), as the file system says; a record
        this process made is its own."""
        return os.getuid() if self._owner is None else self._owner

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    @property
    def checkpoint_store(self) -> Path:
        return self.dir / "checkpoints.git"

    def drop_cow(self) -> None:
        """The copy is a plain directory again (a freeze undone): the next save() says so."""
        self.cow, self._cow_dropped = None, True

    def save(self) -> None:
        if self.cow is None and not self._cow_dropped:
            # A fork froze this session's copy through another object of this record (fork_session
            # reads its own): an older object saved later must not forget the layers its copy stands on.
            try:
                self.cow = read_record(self.dir, self.id).cow
            except OpenAgentsError:
                pass
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.dir / "session.json", self.model_dump_json(indent=1), mode=0o644)

    def running(self) -> bool:
        """Still owned by a live process (a record left 'running' by a killed host is not)."""
        if self.status != "running" or self.host_pid <= 0:
            return False
        try:
            os.kill(self.host_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def sessions_root() -> Path:
    """The caller's own sessions directory (state.own_dir: a shared one is used through user-UID)."""
    return state.own_subdir("sessions")


def _shared_roots() -> list[Path]:
    """Other users' session directories in this state directory, for `--all-users` (listing only):
    a shared sessions/ itself and the user-UID directories in it that the caller may read."""
    mine = sessions_root()
    roots = []
    top = state.configured_root()
    try:
        users = [top / n / "sessions" for n in os.listdir(top) if n.startswith("user-")]
    except OSError:
        users = []
    for base in {top / "sessions", state.state_root() / "sessions", *users}:
        if base == mine:
            continue
        roots.append(base)
        try:
            names = os.listdir(base)
        except OSError:
            continue
        roots += [base / n for n in names if n.startswith("user-") and base / n != mine]
    return roots


def new_record(workspace: Path, mode: WorkspaceMode, user: str, kind: str = "run") -> SessionRecord:
    sid = state.new_id()
    box = sessions_root() / sid / "copy" if mode == WorkspaceMode.COPY else workspace
    record = SessionRecord(
        id=sid,
        created=time.time(),
        kind=kind,
        workspace=str(workspace),
        mode=mode,
        box_workspace=str(box),
        user=user,
        host_pid=os.getpid(),
        host_uid=os.getuid(),
    )
    state.sandbox_state_dir(workspace, sid)  # refuses a state directory inside the workspace
    record.save()
    return record


def read_record(session_dir: Path, session_id: str) -> SessionRecord:
    """The record in `session_dir`, read as untrusted data: the directory and session.json opened
    without following a link, the file a regular one of at most RECORD_CAP bytes, its owner and
    its directory's taken by fstat on what was opened. Typed errors: FILE_NOT_FOUND, CONFIG_INVALID."""
    from ..boxfs.private import open_private_dir

    try:
        dfd = open_private_dir(session_dir)
    except FileNotFoundError:
        raise OpenAgentsError(
            ErrorType.FILE_NOT_FOUND, f"no session {session_id} (see `oa-sandbox sessions`)"
        ) from None
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the directory of session {session_id} cannot be opened "
            f"({'a link' if err.errno in (errno.ELOOP, errno.ENOTDIR) else err.strerror})",
        ) from None
    try:
        dst = os.fstat(dfd)
        try:
            fd = open_private("session.json", os.O_RDONLY | os.O_NONBLOCK, at=dfd)
        except FileNotFoundError:
            raise OpenAgentsError(
                ErrorType.FILE_NOT_FOUND, f"no session {session_id} (see `oa-sandbox sessions`)"
            ) from None
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode):
                raise OpenAgentsError(
                    ErrorType.CONFIG_INVALID, f"the record of session {session_id} is not a regular file"
                )
            if fst.st_size > RECORD_CAP:
                raise OpenAgentsError(
                    ErrorType.CONFIG_INVALID, f"the record of session {session_id} is over {RECORD_CAP} bytes"
                )
            raw = os.read(fd, RECORD_CAP + 1)
        finally:
            os.close(fd)
    except OSError as err:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the record of session {session_id} is unreadable: "
            f"{'a link' if err.errno == errno.ELOOP else err.strerror}",
        ) from None
    finally:
        os.close(dfd)
    if len(raw) > RECORD_CAP:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"the record of session {session_id} is over {RECORD_CAP} bytes"
        )
    try:
        record = SessionRecord.model_validate_json(raw)
    except (ValidationError, ValueError) as err:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"the record of session {session_id} is unreadable: {str(err)[:200]}"
        ) from None
    if record.id != session_id:
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID, f"the record in the directory of session {session_id} names another id"
        )
    record._dir = session_dir
    # Another user's if either is: a directory of theirs (they may replace the file) or a file of theirs.
    record._owner = dst.st_uid if dst.st_uid != os.getuid() else fst.st_uid
    return record


def open_own_record(session_id: str, mount: bool = True) -> SessionRecord:
    """The caller's own record of session `session_id`: the one function every command acting on a
    session goes through. INVALID_ARGUMENTS for a malformed id, FILE_NOT_FOUND, CONFIG_INVALID for
    an unreadable record, NotOwnRecord (PERMISSION_DENIED, naming the owner) for another user's.
    A copy-on-write copy (a fork's) is mounted again if it is not (a reboot, an unmount), unless
    `mount` is false (discarding needs no view of it): an IO_ERROR if it cannot be, never an
    empty directory that would read as every file deleted."""
    if not _ID.match(session_id):
        raise OpenAgentsError(
            ErrorType.INVALID_ARGUMENTS, f"{session_id!r} is not a session id (see `oa-sandbox sessions`)"
        )
    record = read_record(sessions_root() / session_id, session_id)
    if record.owner != os.getuid():
        raise NotOwnRecord(session_id, record.owner)
    if mount and not record.discarded and record.mode == WorkspaceMode.COPY:
        if record.quota_fs is not None:  # first: a fork's upper lies in it
            quota_fs.ensure_mounted(record.quota_fs, Path(record.box_workspace), record.id)
        if record.cow is not None:
            ensure_mounted(record.cow, Path(record.box_workspace), record.id, record.user)
    return record


def list_sessions(all_users: bool = True) -> list[SessionRecord]:
    """Newest first (by the record's own start time); unreadable records are passed over. Without
    `all_users`, only the caller's (by the file system's owner, never the record's text); with it,
    also the records of other users of this state directory that the caller can read, to list only."""
    roots = list(dict.fromkeys([sessions_root()] + (_shared_roots() if all_users else [])))
    out = [record for root in roots for record in _read_records(root)[0] if all_users or record.owner == os.getuid()]
    out.sort(key=lambda r: (r.created, r.id), reverse=True)
    return out


def _read_records(root: Path) -> tuple[list[SessionRecord], bool]:
    """The records under one sessions directory that can be read, and whether any could not."""
    try:
        names = [n for n in os.listdir(root) if _ID.match(n)]
    except OSError:
        return [], False
    records, unreadable = [], False
    for name in names:
        try:
            records.append(read_record(root / name, name))
        except OpenAgentsError:
            unreadable = True
    return records, unreadable


HEADER = f"{'ID':<22}  {'CREATED':<16}  {'MODE':<4}  {'STATUS':<20} {'FILES':>10}  WORKSPACE"


def shown_status(record: SessionRecord) -> str:
    status = record.status + (" (applied)" if record.applied else "") + (" (discarded)" if record.discarded else "")
    if record.status == "running" and not record.running():
        status = "interrupted"
    return status


def state_bytes(record: SessionRecord) -> int:
    """What the session's directory holds on disk (allocated bytes), counted through a bounded walk
    that enters no mount (a fork's overlay view is its layers' blocks, not its own: its upper is counted)."""
    from ..boxfs import BudgetExceeded, HostBudget, Walk

    total = 0
    try:
        dev = os.lstat(record.dir).st_dev
        for entry in Walk(
            record.dir, HostBudget.until(10.0, max_entries=None, max_bytes=None), enter=lambda e: e.st.st_dev == dev
        ).entries():
            total += entry.st.st_blocks * 512 if entry.st.st_dev == dev else 0
    except (BudgetExceeded, OSError):
        pass
    return total


def resolve_mode(workspace: Path, mode: WorkspaceMode, user: str | None) -> tuple[WorkspaceMode, str]:
    """The mode and the uid:gid the box runs as. The box never runs as uid 0: an explicit 0 is
    refused, and a root-owned workspace is copied (auto) or refused (bind without --user)."""
    if user is not None:
        uid = user.split(":", 1)[0]
        if uid.strip() in ("0", "root"):
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                "--user 0 is refused: the sandbox never runs as uid 0 "
                "(a root-owned workspace is worked on as a copy: --workspace-mode copy)",
            )
        if not re.fullmatch(r"[0-9]+(:[0-9]+)?", user):
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"--user takes UID or UID:GID in numbers, not {user!r}")
    st = workspace.stat()
    if mode == WorkspaceMode.AUTO:
        mode = WorkspaceMode.COPY if st.st_uid == 0 else WorkspaceMode.BIND
    if user is None:
        if mode == WorkspaceMode.COPY:
            user = f"{SANDBOX_UID}:{SANDBOX_UID}"
        elif st.st_uid == 0:
            raise OpenAgentsError(
                ErrorType.CONFIG_INVALID,
                f"the workspace {workspace} is owned by root, and in bind mode the box would run "
                "as uid 0: use --workspace-mode copy (the default for root-owned workspaces), or --user UID:GID "
                "with a user that may write it",
            )
        else:
            user = f"{st.st_uid}:{st.st_gid}"
    elif ":" not in user:
        user = f"{user}:{user}"
    return mode, user


def summary_line(record: SessionRecord) -> str:
    """One line under HEADER."""
    try:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
    except (OverflowError, ValueError, OSError):  # another user's record may say any number
        when = f"{'?':<16}"
    status = shown_status(record)
    from .checkpoints import store_unknown

    files = f"{len(record.files_changed):>4} files"
    if record.owner == os.getuid() and store_unknown(
        record.checkpoint_store
    ):  # another user's directory is not read into
        files = (
            f"{'?':>4} files" if not record.files_changed else f"{len(record.files_changed):>3}+ files"
        )  # a checkpoint failed
    parent = f"  (fork of {record.forked_from})" if record.forked_from else ""
    return f"{record.id}  {when}  {record.mode.value:<4}  {status:<20} {files:>10}  {record.workspace}{parent}"


def prepare(
    real: Path,
    mode: WorkspaceMode,
    user: str | None,
    kind: str = "run",
    limits: CopyLimits | None = None,
    host_code: list[str] | None = None,
    write_quota: int | None = None,
) -> tuple[SessionRecord, Path | None]:
    """A record for a new session and, in copy mode, its copy (taken now, before any box exists).
    Returns the record and the .git to mount read-only over the copy (None in bind mode).
    In copy mode the workspace is measured first: over `limits` it is refused (WorkspaceTooLarge)
    before any record or copy is made. `host_code`: the workspace paths the host runs or imports
    from (workspace/host_code.py), kept in the manifest: no apply of this copy changes them.
    `write_quota`: a box will write in the copy, so where the host may mount the copy is made on a
    file system of its own with that much room (quota_fs.py)."""
    from .copy import CopyLimits, CopyManifest, WorkspaceTooLarge, copy_workspace, measure_workspace

    mode, box_user = resolve_mode(real, mode, user)
    size = None
    if mode == WorkspaceMode.COPY:
        limits = limits or CopyLimits()
        size = measure_workspace(real, limits)
        if size.over is not None:
            raise WorkspaceTooLarge(real, size, limits)
    record = new_record(real, mode, box_user, kind)
    if mode != WorkspaceMode.COPY or limits is None or size is None:
        return record, None
    uid, gid = (int(x) for x in box_user.split(":", 1))
    try:

        def copy(dest: Path) -> CopyManifest:
            assert limits is not None and size is not None
            return copy_workspace(
                real, dest, uid, gid, budget=limits.copy_budget(), progress=limits.progress, total_entries=size.entries
            )

        if write_quota is not None and quota_fs.unusable() is None:
            manifest = quota_fs.copy_into(record, write_quota, size.bytes, size.entries, copy)
        else:
            manifest = copy(Path(record.box_workspace))
    except OSError as err:
        record.status, record.reason = "failed", f"the workspace could not be copied: {err}"
        record.save()
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not copy {real} for copy mode: {err}") from None
    except OpenAgentsError as err:  # over the copy budget (RESOURCE_EXHAUSTED): typed, said as it is
        record.status, record.reason = "failed", f"the workspace could not be copied: {err}"
        record.save()
        raise
    manifest.host_code = list(host_code or [])
    manifest.save(record.manifest_path)
    record._fresh_baseline = manifest.fresh_baseline(Path(record.box_workspace))
    return record, real / ".git"


class ResumeLock:
    """Held for the resumed session's life: two resumes of one session never run at once (the
    record's `running` check alone leaves a window between the check and the record's save)."""

    def __init__(self, record: SessionRecord) -> None:
        self.fd = open_private(record.dir / "resume.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"session {record.id} is being resumed by another process"
            ) from None

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
