"""The workspace write quota: how much the box may grow the workspace in one session, in bytes and
in entries (inodes).

A per-file limit (RLIMIT_FSIZE) does not stop a thousand files, and the box writes at disk
speed (3 GiB in 4 s was measured). Empty files cost no blocks, so a byte quota alone lets a box
exhaust the host's inodes (300k empty files in seconds): entries are counted too. The host
watches from outside: every POLL_S it reads the file system's used blocks and used inodes
(statvfs, one system call); only when either has grown by more than the remaining headroom does
it measure the workspace itself (a boxfs walk, bounded by a HostBudget: a walk that cannot finish
counts as over quota, never as fine). Past either quota it kills every process in the box, and
every later call fails with the fatal `workspace_quota_exceeded`, which stops the session. The
bound is soft by what the box can write in one poll interval plus the kill (docs/security.md
gives the measured overshoot).

A fork's copy-on-write copy (workspace/cow.py) grows on disk in its upper layer, not where the
merged view says: a one-byte change to a 100 MB file costs 100 MB (copied up), a deleted file
costs an entry (a whiteout). So for one the quota counts the upper (`layer`): the disk the fork
uses counts against it. It is only counted (blocks and entries, by a boxfs walk), never read.

Where the box's writes land on a file system of their own (workspace/quota_fs.py: a copy session
on a host that may mount), that file system stops them at the quota (ENOSPC): the bound is hard.
The watcher then measures that file system alone (`dedicated`): its used blocks and inodes are the
session's growth, with no walk, and a session past its quota stops as before.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..boxfs import BudgetExceeded, HostBudget, Walk
from ..boxfs.budget import MAX_DEPTH

POLL_S = 0.1
DEFAULT_ENTRY_QUOTA = 200_000


@dataclass
class Usage:
    """What a walk measured: bytes allocated (each inode once), entries met, and what it could not see."""

    allocated: int = 0
    entries: int = 0
    too_deep: list[bytes] = field(default_factory=list)
    unfinished: str | None = None  # the walk passed its budget: the counts are lower bounds
    passed: BudgetExceeded | None = None  # which bound it passed

    @property
    def complete(self) -> bool:
        return not self.too_deep and self.unfinished is None


def measure(root: Path, skip: set[tuple[int, int]] | None = None, budget: HostBudget | None = None) -> Usage:
    """Bytes allocated (st_blocks, each inode once) and entries under root, no symlink followed;
    directories whose identity is in `skip` (the read-only .git mounts) are not entered."""
    skip = skip or set()
    seen: set[tuple[int, int]] = set()
    usage = Usage()
    walker = Walk(root, budget or HostBudget(), enter=lambda e: e.key not in skip)
    try:
        for entry in walker.entries():
            usage.entries += 1
            if entry.key not in seen:
                seen.add(entry.key)
                usage.allocated += entry.st.st_blocks * 512
    except BudgetExceeded as err:
        usage.unfinished, usage.passed = err.message, err
    usage.too_deep = walker.too_deep
    return usage


def _fs_used(path: Path) -> tuple[int, int]:
    """(bytes, inodes) in use on the file system; inodes 0 where it does not count them (f_files 0)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, max(0, st.f_files - st.f_ffree)


class WriteQuota:
    def __init__(
        self,
        workspace: Path,
        limit: int,
        start_usage: int,
        skip: set[tuple[int, int]] | None = None,
        on_exceeded: Callable[[], None] | None = None,
        entry_limit: int | None = DEFAULT_ENTRY_QUOTA,
        start_entries: int = 0,
        budget: HostBudget | None = None,
        layer: Path | None = None,
        dedicated: Path | None = None,
    ) -> None:
        """`limit`: bytes of growth; `entry_limit`: new entries (files, directories, links), None for
        none; `start_usage`/`start_entries`: measured by the same rule (the baseline's walk);
        `budget`: bounds every measuring walk (the session's, when it has one); `layer`: the upper
        of a copy-on-write copy, measured instead of the workspace (then from now); `dedicated`: a
        file system that holds the box's writes alone (quota_fs), measured by statvfs (from now)."""
        self.workspace = workspace
        self.measured = layer or workspace
        self.limit = limit
        self.entry_limit = entry_limit
        self.skip = skip or set()
        self.on_exceeded = on_exceeded
        self.budget = budget
        self.start_usage = start_usage
        self.start_entries = start_entries
        if layer is not None:
            start = measure(layer, budget=budget.slice() if budget is not None else None)
            self.start_usage, self.start_entries = start.allocated, start.entries
        self.growth = 0
        self.entry_growth = 0
        self.unmeasured: str | None = None  # why the walk could not see all of the workspace (then it is over quota)
        self.exceeded = threading.Event()
        self.dedicated = dedicated
        if dedicated is not None:
            self.start_usage, self.start_entries = _fs_used(dedicated)
        used, inodes = _fs_used(dedicated or workspace)
        self._trigger = used + limit
        self._inode_trigger = inodes + entry_limit if entry_limit is not None and inodes else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, daemon=True, name="oa-quota")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _walk_budget(self) -> HostBudget:
        # Counting past start + limit proves the quota passed: the walk need not go further.
        cap = None if self.entry_limit is None else self.start_entries + self.entry_limit + 1
        if self.budget is not None:
            return self.budget.slice(max_entries=cap)
        return HostBudget(max_entries=cap)

    def check(self) -> bool:
        """Measure now; True when a quota is passed (then also kill, once)."""
        if self.exceeded.is_set():
            return True
        if self.dedicated is not None:
            return self._check_dedicated(self.dedicated)
        usage = measure(self.measured, self.skip, self._walk_budget())
        self.growth = usage.allocated - self.start_usage
        self.entry_growth = usage.entries - self.start_entries
        # Called only when the file system grew past the headroom: if the walk cannot see all of the
        # workspace, what it cannot see may be that growth (files written below MAX_DEPTH levels
        # were not counted at all), so an unmeasurable workspace is over quota.
        cap = self.start_entries + self.entry_limit + 1 if self.entry_limit is not None else None
        if usage.passed is not None and usage.passed.what == "entry" and usage.passed.limit == cap:
            self.entry_growth = max(
                self.entry_growth, (self.entry_limit or 0) + 1
            )  # counted past start + limit: over, measured
        elif usage.unfinished is not None:
            self.unmeasured = usage.unfinished
        elif usage.too_deep:
            self.unmeasured = (
                f"the workspace holds directories deeper than {MAX_DEPTH} levels, which cannot be measured"
            )
        over_entries = self.entry_limit is not None and self.entry_growth > self.entry_limit
        if self.growth > self.limit or over_entries or self.unmeasured:
            self.exceeded.set()
            if self.on_exceeded:
                self.on_exceeded()
            return True
        used, inodes = _fs_used(self.workspace)
        self._trigger = used + (self.limit - self.growth)
        if self._inode_trigger is not None and self.entry_limit is not None:
            self._inode_trigger = inodes + (self.entry_limit - self.entry_growth)
        return False

    def _check_dedicated(self, fs: Path) -> bool:
        used, inodes = _fs_used(fs)
        self.growth, self.entry_growth = used - self.start_usage, inodes - self.start_entries
        if self.growth > self.limit or (self.entry_limit is not None and self.entry_growth > self.entry_limit):
            self.exceeded.set()
            if self.on_exceeded:
                self.on_exceeded()
            return True
        self._trigger = used + (self.limit - self.growth)
        if self._inode_trigger is not None and self.entry_limit is not None:
            self._inode_trigger = inodes + (self.entry_limit - self.entry_growth)
        return False

    def poll(self) -> bool:
        """The cheap test (one statvfs); measures only when the file system grew past a headroom."""
        try:
            if not self.exceeded.is_set():
                used, inodes = _fs_used(self.dedicated or self.workspace)
                if used >= self._trigger or (self._inode_trigger is not None and inodes >= self._inode_trigger):
                    self.check()
        except OSError:
            pass
        return self.exceeded.is_set()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S) and not self.exceeded.is_set():
            self.poll()

    def message(self) -> str:
        killed = "every process in the sandbox was killed and the session stops"
        if self.entry_limit is not None and self.entry_growth > self.entry_limit:
            return (
                "the session created "
                f"{'more than ' if self.entry_growth == self.entry_limit + 1 else ''}"
                f"{self.entry_growth - 1 if self.entry_growth == self.entry_limit + 1 else self.entry_growth} "
                "entries (files, directories, links) in the workspace, "
                f"past its entry quota of {self.entry_limit}; {killed}"
            )
        if self.growth > self.limit:
            return (
                f"the session grew the workspace by {self.growth / 2**20:.0f} MiB, past its write quota of "
                f"{self.limit / 2**20:.0f} MiB; {killed}"
            )
        if self.unmeasured:
            return (
                f"the file system grew past the workspace's write quota ({self.limit / 2**20:.0f} MiB, "
                f"{self.entry_limit} entries) and the workspace cannot be measured: {self.unmeasured}; {killed}"
            )
        return f"the workspace passed its write quota; {killed}"
