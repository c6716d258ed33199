"""The workspace write quota: how much the box may grow the workspace in one session.

A per-file limit (RLIMIT_FSIZE) does not stop a thousand files, and the box writes at disk
speed (3 GiB in 4 s was measured). The host watches from outside: every POLL_S it reads the
file system's used blocks (statvfs, one system call); only when they have grown by more than the
remaining headroom does it measure the workspace itself (a walk). Past the quota it kills every
process in the box, and every later call fails with the fatal `workspace_quota_exceeded`, which
stops the session. The bound is soft by what the box can write in one poll interval plus the
kill (docs/security.md gives the measured overshoot).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from .integrity import MAX_DEPTH, walk

POLL_S = 0.1


def disk_usage(root: Path, skip: set[tuple[int, int]] | None = None, too_deep: list[str] | None = None) -> int:
    """Bytes allocated under root (st_blocks, each inode once), no symlink followed; directories
    whose identity is in `skip` (the read-only .git mounts) are not entered. The walk enters
    MAX_DEPTH levels; directories below are named in `too_deep` (their bytes are not counted)."""
    skip = skip or set()
    seen: set[tuple[int, int]] = set()
    total = 0
    for found in walk(root, enter=lambda f: (f.st.st_dev, f.st.st_ino) not in skip, too_deep=too_deep):
        key = (found.st.st_dev, found.st.st_ino)
        if key not in seen:
            seen.add(key)
            total += found.st.st_blocks * 512
    return total


def _fs_used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class WriteQuota:
    def __init__(self, workspace: Path, limit: int, start_usage: int, skip: set[tuple[int, int]] | None = None,
                 on_exceeded: Callable[[], None] | None = None) -> None:
        self.workspace = workspace
        self.limit = limit
        self.skip = skip or set()
        self.on_exceeded = on_exceeded
        self.start_usage = start_usage  # measured by the same rule as disk_usage (the baseline's walk)
        self.growth = 0
        self.unmeasured = False  # the box grew the disk with a tree deeper than the walk enters
        self.exceeded = threading.Event()
        self._trigger = _fs_used(workspace) + limit
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

    def check(self) -> bool:
        """Measure now; True when the quota is passed (then also kill, once)."""
        if self.exceeded.is_set():
            return True
        too_deep: list[str] = []
        self.growth = disk_usage(self.workspace, self.skip, too_deep) - self.start_usage
        # Called only when the file system grew past the headroom: if the walk cannot see all of the
        # workspace, what it cannot see may be that growth (files written below MAX_DEPTH levels
        # were not counted at all), so an unmeasurable workspace is over quota.
        self.unmeasured = bool(too_deep)
        if self.growth > self.limit or self.unmeasured:
            self.exceeded.set()
            if self.on_exceeded:
                self.on_exceeded()
            return True
        self._trigger = _fs_used(self.workspace) + (self.limit - self.growth)
        return False

    def poll(self) -> bool:
        """The cheap test (one statvfs); measures only when the file system grew past the headroom."""
        try:
            if not self.exceeded.is_set() and _fs_used(self.workspace) >= self._trigger:
                self.check()
        except OSError:
            pass
        return self.exceeded.is_set()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S) and not self.exceeded.is_set():
            self.poll()

    def message(self) -> str:
        if self.unmeasured and self.growth <= self.limit:
            return (f"the file system grew past the workspace's write quota of {self.limit / 2**20:.0f} MiB and the workspace holds directories "
                    f"deeper than {MAX_DEPTH} levels, which cannot be measured; every process in the sandbox was killed and the session stops")
        return (f"the session grew the workspace by {self.growth / 2**20:.0f} MiB, past its write quota of "
                f"{self.limit / 2**20:.0f} MiB; every process in the sandbox was killed and the session stops")
