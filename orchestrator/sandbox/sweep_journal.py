"""Pending sweeps: a host killed before its end-of-session sweep must not leave the box's plants.

The integrity sweep runs when the box is gone (integrity.py). A host process that dies first (OOM,
SIGKILL, power loss) never runs it: the `.git` the box planted would run on the user's next `git
status`, and the next session would adopt it into its baseline as the user's own. So before a box
starts, its sweep is journaled, durably (a temporary file written, fsynced, renamed, the
directory fsynced), in `$XDG_STATE_HOME/openagents-sandbox/pending-sweeps/`: the workspace, the
baseline, the quarantine, and the owner (boot, namespaces, pid and start time, as the reaper names
owners). The journal is removed once the sweep finished. Every `oa-sandbox` command completes the
journaled sweeps whose owner is gone before anything else (after reaping that owner's boxes), and
no baseline of a workspace is taken while a sweep for it is pending (capture_baseline completes it
first; one that cannot finish refuses the new session, typed).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import state
from ..boxfs import HostBudget, from_store, to_store
from ..boxfs.atomic import fsync_dir, write_atomic
from ..boxfs.private import open_private
from ..errors import ErrorType, OpenAgentsError
from ..workspace.integrity import Baseline, Sweeper, SweepReport

log = logging.getLogger(__name__)

MAX_JOURNAL_BYTES = 64 << 20  # a baseline of many thousand repositories still fits
VERSION = 1


def journal_dir() -> Path:
    return state.own_subdir(state.PENDING_SWEEPS)


@dataclass
class Pending:
    """One journaled sweep."""

    path: Path  # the journal file
    workspace: Path
    quarantine: Path
    placeholder_mountpoint: bool
    baseline: Baseline
    owner: dict[str, str] | None  # the owner's labels (sandbox/owner.py); None: it could not be named

    def owner_gone(self) -> bool:
        from .owner import Owner, Verdict, current, verdict

        owner = Owner.from_labels(self.owner)
        if owner is None:
            return False
        try:
            return verdict(owner, current()) is Verdict.GONE
        except RuntimeError:  # this process cannot be named: it judges no owner
            return False

    def owner_pid(self) -> str:
        from .owner import Owner

        owner = Owner.from_labels(self.owner)
        return str(owner.pid) if owner else "?"


def record(
    sandbox_id: str, workspace: Path, quarantine: Path, placeholder_mountpoint: bool, baseline: Baseline
) -> Path:
    """Journal the sweep of `workspace` before its box starts; returns the journal file."""
    from .owner import labels_here

    folder = journal_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{sandbox_id}.json"
    body = json.dumps(
        {
            "version": VERSION,
            "workspace": to_store(os.fsencode(workspace)),
            "quarantine": to_store(os.fsencode(quarantine)),
            "placeholder_mountpoint": placeholder_mountpoint,
            "owner": labels_here(),
            "baseline": baseline.to_json(),
        }
    )
    return write_atomic(path, body, durable=True)


def clear(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def _load(path: Path) -> Pending | None:
    """The journal at `path`, or None: gone (its sweep finished, by its owner or by another command:
    journals are read by every process and removed by whoever finishes them, so that is no error),
    or unreadable (said once, and left for a person)."""
    try:
        with open(path, "rb") as fh:
            data: dict[str, Any] = json.loads(fh.read(MAX_JOURNAL_BYTES))
        return Pending(
            path,
            Path(os.fsdecode(from_store(data["workspace"]))),
            Path(os.fsdecode(from_store(data["quarantine"]))),
            bool(data["placeholder_mountpoint"]),
            Baseline.from_json(data["baseline"]),
            {str(k): str(v) for k, v in (data.get("owner") or {}).items()} or None,
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("unreadable pending-sweep journal %s (%s): left for a person to look at", path, err)
        return None


def pending(workspace: Path | None = None) -> list[Pending]:
    """Every journaled sweep (of `workspace` only, when given)."""
    try:
        names = sorted(n for n in os.listdir(journal_dir()) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        found = _load(journal_dir() / name)
        if found is not None and (workspace is None or _same(found.workspace, workspace)):
            out.append(found)
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def complete(entry: Pending, budget: HostBudget | None = None, shared: bool = False) -> SweepReport:
    """Run one journaled sweep now; the journal goes once the sweep finished. Two commands that
    find the same journal do not both sweep: the journal file's lock is held for the sweep, and
    whoever gets it second finds the journal gone (finished: nothing to do) or sweeps it itself."""
    try:
        fd = open_private(entry.path, os.O_RDONLY)
    except FileNotFoundError:
        return SweepReport()  # finished meanwhile, by its owner or another command
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _still(entry.path, fd):
            return SweepReport()  # finished (and removed) by the command that held the lock before us
        if not entry.workspace.is_dir():
            clear(entry.path)  # the workspace is gone (a copy-mode copy removed): nothing left to sweep
            return SweepReport()
        report = Sweeper(entry.workspace, entry.baseline, entry.quarantine, entry.placeholder_mountpoint).sweep(
            shared=shared, budget=budget
        )
        if report.complete:
            clear(entry.path)
        return report
    finally:
        os.close(fd)  # the lock goes with it


def _still(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open at `fd` (not removed, not replaced)."""
    try:
        now, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def complete_gone(workspace: Path | None = None, budget: HostBudget | None = None) -> list[tuple[Pending, SweepReport]]:
    """Complete the journaled sweeps whose owner is gone (of `workspace` only, when given). A
    workspace another live owner still runs a box on is swept as shared (its placeholder stays)."""
    entries = pending(workspace)
    done = []
    for entry in entries:
        if not entry.owner_gone():
            continue
        shared = any(
            other is not entry and _same(other.workspace, entry.workspace) and not other.owner_gone()
            for other in entries
        )
        done.append((entry, complete(entry, budget, shared)))
    return done


def complete_for(workspace: Path, budget: HostBudget | None = None) -> None:
    """Before a baseline of `workspace`: its pending sweeps of gone owners are completed; one that
    cannot finish refuses the new baseline (it would adopt what that box planted)."""
    for entry, report in complete_gone(workspace, budget):
        for line in report.lines():
            log.warning("integrity sweep left by a process that ended (pid %s): %s", entry.owner_pid(), line)
        if not report.complete:
            raise OpenAgentsError(
                ErrorType(report.error_type or ErrorType.RESOURCE_EXHAUSTED.value),
                f"the workspace {workspace} has a sweep left by a session whose host process ended, and it could not "
                f"finish ({report.unfinished}); no new session starts on it until it does. Its journal: {entry.path}",
            )


def capture_baseline(workspace: Path, budget: HostBudget | None = None) -> Baseline:
    """The baseline of `workspace`. A sweep still pending for it (its session's host process died
    before sweeping) is completed first: what that box planted is never adopted."""
    complete_for(workspace, budget)
    return Baseline._capture(workspace, budget)
