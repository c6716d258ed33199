"""Budgets for host work on box data: one object holds them all.

Every walk, read, copy, sweep, checkpoint, diff and restore of box-written data is bounded in
bytes, entries (inodes), depth and wall time. A session makes one `HostBudget` from its
limits (its `--max-wall` deadline included, so host work cannot outlive the session's clock), and
each piece of host work takes a `slice()` of it with its own caps: spending is charged to both.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..errors import ErrorType, OpenAgentsError

# Defaults for one piece of host work: generous for real repositories (the Linux kernel has ~90k
# files, 30 levels), far below what hurts a host.
MAX_ENTRIES = 1_000_000
MAX_DEPTH = 512
MAX_BYTES = 8 << 30


class BudgetExceeded(OpenAgentsError):
    """Host work on box data passed one of its bounds: the work stops, typed, never half-reported."""

    def __init__(self, what: str, limit: float, detail: str = "") -> None:
        self.what, self.limit = what, limit
        super().__init__(
            ErrorType.RESOURCE_EXHAUSTED,
            f"host work on the workspace passed its {what} budget ({limit:g}){': ' + detail if detail else ''}",
        )


@dataclass
class HostBudget:
    """Caps (None: unbounded) and what was spent. Thread-safe: a sweep and a checkpoint may share one."""

    max_bytes: int | None = MAX_BYTES
    max_entries: int | None = MAX_ENTRIES
    max_depth: int = MAX_DEPTH
    deadline: float | None = None  # time.monotonic() by which the work must end
    parent: "HostBudget | None" = None
    bytes_spent: int = 0
    entries_spent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def until(cls, seconds: float | None, **caps: int | None) -> "HostBudget":
        """A budget whose clock ends `seconds` from now (None: no clock)."""
        return cls(deadline=None if seconds is None else time.monotonic() + seconds, **caps)  # type: ignore[arg-type]

    def slice(self, seconds: float | None = None, **caps: int | None) -> "HostBudget":
        """A child budget for one piece of work: its own caps, charged to this one too, ending by
        the earlier of its own clock and this one's."""
        deadline = self.deadline
        if seconds is not None:
            mine = time.monotonic() + seconds
            deadline = mine if deadline is None else min(deadline, mine)
        depth = caps.pop("max_depth", None)
        return HostBudget(
            max_bytes=caps.get("max_bytes", self.max_bytes),
            max_entries=caps.get("max_entries", self.max_entries),
            max_depth=min(self.max_depth, depth) if depth is not None else self.max_depth,
            deadline=deadline,
            parent=self,
        )

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetExceeded("wall-time", 0, "its deadline passed")
        if self.parent is not None:
            self.parent.check_time()

    def charge_entries(self, n: int = 1) -> None:
        with self._lock:
            self.entries_spent += n
            over = self.max_entries is not None and self.entries_spent > self.max_entries
        if over:
            raise BudgetExceeded("entry", self.max_entries or 0, f"{self.entries_spent} entries")
        if self.parent is not None:
            self.parent.charge_entries(n)

    def charge_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_spent += n
            over = self.max_bytes is not None and self.bytes_spent > self.max_bytes
        if over:
            raise BudgetExceeded("byte", self.max_bytes or 0, f"{self.bytes_spent} bytes")
        if self.parent is not None:
            self.parent.charge_bytes(n)

    def check_depth(self, depth: int) -> bool:
        """Whether a directory at `depth` (the root's children are at 1) may be entered."""
        return depth <= self.max_depth
