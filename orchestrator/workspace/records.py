"""Sessions a user can name: an id, a record, and the state a session leaves outside the workspace.

    $XDG_STATE_HOME/openagents-sandbox/sessions/<id>/
        session.json        this record
        transcript.jsonl    unless --transcript put it elsewhere
        copy/               copy mode: the box's workspace
        manifest.json       copy mode: how every entry looked when the copy was taken
        checkpoints.git/    the shadow object store of the checkpoints
        quarantine/         what the integrity sweep moved out

`discard` (copy mode) removes all of it but session.json, which stays, marked discarded, so
`oa-sandbox sessions` still says the session existed and what became of it (a few hundred bytes; a
transcript given with --transcript outside this directory is the user's file and stays too).
`prune` removes whole session directories, records included. Everything under a session directory
may hold box-written entries, so it is removed through boxfs.remove_tree (no link followed).

Workspace modes: `bind` mounts the real workspace; `copy` mounts a private copy owned by the
unprivileged sandbox uid, and nothing reaches the real one until `apply`. `auto` is copy for a
root-owned workspace (every CI clone made as root) and bind otherwise, so the box never needs uid 0.
"""
from __future__ import annotations

import os
import re
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from .. import state
from ..errors import ErrorType, OpenAgentsError

if TYPE_CHECKING:
    from .copy import CopyLimits

SANDBOX_UID = 1000  # the image's unprivileged user; copies are owned by it
_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")


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
    host_uid: int | None = None  # who ran it: `sessions` lists the current user's by default
    turns: int | None = None  # how many turns the session ran, when it had turns (run); a resumed run's count on
    # What a resume takes again unless told otherwise (resume.py): the model, its endpoint and key's
    # variable (never the key), the user's policy files; the digest of the root's AGENTS.md at the start.
    model_spec: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    policy_files: list[str] = []
    context_root: str | None = None  # sha256 hex, "absent", or None (not read, or an older record)
    resumes: int = 0  # how many times the session was resumed

    @property
    def dir(self) -> Path:
        return sessions_root() / self.id

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    @property
    def checkpoint_store(self) -> Path:
        return self.dir / "checkpoints.git"

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.dir / "session.json.tmp"
        tmp.write_text(self.model_dump_json(indent=1))
        os.replace(tmp, self.dir / "session.json")

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
    return state.state_root() / "sessions"


def new_record(workspace: Path, mode: WorkspaceMode, user: str, kind: str = "run") -> SessionRecord:
    sid = state.new_id()
    box = sessions_root() / sid / "copy" if mode == WorkspaceMode.COPY else workspace
    record = SessionRecord(id=sid, created=time.time(), kind=kind, workspace=str(workspace), mode=mode, box_workspace=str(box),
                           user=user, host_pid=os.getpid(), host_uid=os.getuid())
    state.sandbox_state_dir(workspace, sid)  # refuses a state directory inside the workspace
    record.save()
    return record


def load(session_id: str) -> SessionRecord:
    if not _ID.match(session_id):
        raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"{session_id!r} is not a session id (see `oa-sandbox sessions`)")
    path = sessions_root() / session_id / "session.json"
    try:
        return SessionRecord.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise OpenAgentsError(ErrorType.FILE_NOT_FOUND, f"no session {session_id} (see `oa-sandbox sessions`)") from None
    except (OSError, ValidationError, ValueError) as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the record of session {session_id} is unreadable: {str(err)[:200]}") from None


def list_sessions(all_users: bool = True) -> list[SessionRecord]:
    """Newest first; unreadable records are passed over. Without `all_users`, only the current
    user's (the uid recorded, or for older records the owner of the record's file)."""
    out = []
    try:
        names = sorted((n for n in os.listdir(sessions_root()) if _ID.match(n)), reverse=True)
    except FileNotFoundError:
        return []
    for name in names:
        try:
            record = load(name)
        except OpenAgentsError:
            continue
        if all_users or owner_uid(record) == os.getuid():
            out.append(record)
    return out


def owner_uid(record: SessionRecord) -> int | None:
    if record.host_uid is not None:
        return record.host_uid
    try:
        return (record.dir / "session.json").stat().st_uid
    except OSError:
        return None


HEADER = f"{'ID':<22}  {'CREATED':<16}  {'MODE':<4}  {'STATUS':<20} {'FILES':>10}  WORKSPACE"


def shown_status(record: SessionRecord) -> str:
    status = record.status + (" (applied)" if record.applied else "") + (" (discarded)" if record.discarded else "")
    if record.status == "running" and not record.running():
        status = "interrupted"
    return status


def state_bytes(record: SessionRecord) -> int:
    """What the session's directory holds on disk (allocated bytes), counted through a bounded walk."""
    from ..boxfs import BudgetExceeded, HostBudget, Walk

    total = 0
    try:
        for entry in Walk(record.dir, HostBudget.until(10.0, max_entries=None, max_bytes=None)).entries():
            total += entry.st.st_blocks * 512
    except (BudgetExceeded, OSError):
        pass
    return total


def resolve_mode(workspace: Path, mode: WorkspaceMode, user: str | None) -> tuple[WorkspaceMode, str]:
    """The mode and the uid:gid the box runs as. The box never runs as uid 0: an explicit 0 is
    refused, and a root-owned workspace is copied (auto) or refused (bind without --user)."""
    if user is not None:
        uid = user.split(":", 1)[0]
        if uid.strip() in ("0", "root"):
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, "--user 0 is refused: the sandbox never runs as uid 0 "
                                  "(a root-owned workspace is worked on as a copy: --workspace-mode copy)")
        if not re.fullmatch(r"[0-9]+(:[0-9]+)?", user):
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"--user takes UID or UID:GID in numbers, not {user!r}")
    st = workspace.stat()
    if mode == WorkspaceMode.AUTO:
        mode = WorkspaceMode.COPY if st.st_uid == 0 else WorkspaceMode.BIND
    if user is None:
        if mode == WorkspaceMode.COPY:
            user = f"{SANDBOX_UID}:{SANDBOX_UID}"
        elif st.st_uid == 0:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"the workspace {workspace} is owned by root, and in bind mode the box would run "
                                  "as uid 0: use --workspace-mode copy (the default for root-owned workspaces), or --user UID:GID "
                                  "with a user that may write it")
        else:
            user = f"{st.st_uid}:{st.st_gid}"
    elif ":" not in user:
        user = f"{user}:{user}"
    return mode, user


def summary_line(record: SessionRecord) -> str:
    """One line under HEADER."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
    status = shown_status(record)
    from .checkpoints import store_unknown

    files = f"{len(record.files_changed):>4} files"
    if store_unknown(record.checkpoint_store):
        files = f"{'?':>4} files" if not record.files_changed else f"{len(record.files_changed):>3}+ files"  # a checkpoint failed
    return f"{record.id}  {when}  {record.mode.value:<4}  {status:<20} {files:>10}  {record.workspace}"


def _remove(parent: Path, name: str) -> None:
    """parent/name and all under it, through boxfs: box-written entries, no link followed."""
    from ..boxfs import HostBudget, open_dir, remove_tree

    fd = open_dir(parent)
    try:
        remove_tree(fd, name, HostBudget(max_entries=None, max_bytes=None))
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def discard_state(record: SessionRecord) -> None:
    """Everything of a copy session's state but its record: the copy, the manifest, the checkpoint
    store, the quarantine, its transcript when it is in the session directory. The record stays,
    marked discarded (so `sessions` still tells what became of it); the copy goes first, as the
    biggest, and a copy outside the directory (never made by this version) is removed too."""
    copy = Path(record.box_workspace)
    if record.mode == WorkspaceMode.COPY and copy.parent == record.dir:
        _remove(record.dir, copy.name)
    for name in sorted(os.listdir(record.dir)):
        if name != "session.json":
            _remove(record.dir, name)
    if record.transcript and Path(record.transcript).parent == record.dir:
        record.transcript = None
    record.discarded = True
    record.save()


def prune(older_than_s: float, all_: bool = False, now: float | None = None,
          all_users: bool = False) -> tuple[list[tuple[SessionRecord, int]], list[SessionRecord]]:
    """Remove whole session directories older than `older_than_s`: (removed with the bytes each
    held, kept). Kept: running sessions, other users' (unless `all_users`), and copy sessions
    neither applied nor discarded (their copy holds work not landed anywhere) unless `all_`."""
    now = time.time() if now is None else now
    removed: list[tuple[SessionRecord, int]] = []
    kept: list[SessionRecord] = []
    for record in list_sessions(all_users=all_users):
        if now - record.created < older_than_s:
            continue
        if record.running() or (not all_ and record.mode == WorkspaceMode.COPY and not record.applied and not record.discarded
                                and record.status != "failed"):
            kept.append(record)
            continue
        size = state_bytes(record)
        _remove(sessions_root(), record.id)
        removed.append((record, size))
    return removed, kept


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' (a bare number is days) -> seconds; ValueError otherwise."""
    match = _DURATION.match(text.lower())
    if not match:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m")
    number, unit = float(match.group(1)), match.group(2) or "d"
    return number * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[unit]


def prepare(real: Path, mode: WorkspaceMode, user: str | None, kind: str = "run",
            limits: CopyLimits | None = None) -> tuple[SessionRecord, Path | None]:
    """A record for a new session and, in copy mode, its copy (taken now, before any box exists).
    Returns the record and the .git to mount read-only over the copy (None in bind mode).
    In copy mode the workspace is measured first: over `limits` it is refused (WorkspaceTooLarge)
    before any record or copy is made."""
    from .copy import CopyLimits, WorkspaceTooLarge, copy_workspace, measure_workspace

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
        manifest = copy_workspace(real, Path(record.box_workspace), uid, gid, budget=limits.copy_budget(), progress=limits.progress,
                                  total_entries=size.entries)
    except OSError as err:
        record.status, record.reason = "failed", f"the workspace could not be copied: {err}"
        record.save()
        raise OpenAgentsError(ErrorType.IO_ERROR, f"could not copy {real} for copy mode: {err}") from None
    except OpenAgentsError as err:  # over the copy budget (RESOURCE_EXHAUSTED): typed, said as it is
        record.status, record.reason = "failed", f"the workspace could not be copied: {err}"
        record.save()
        raise
    manifest.save(record.manifest_path)
    return record, real / ".git"
