"""How many sandbox starts one orchestrator process runs at once: a gate every start goes through.

A hundred boxes started together do not start faster than a few at a time: the daemon serialises
most of a container's creation, and a start (create, attach, start, the agent's first answer) is
the most CPU-hungry moment of a box's life (gVisor boots a kernel). Unbounded, each start waits
behind all the others and the last ones pass their own deadline. So every start of a
SupervisedSandbox, the first one and each restart after a lost agent, takes a slot here first;
the rest wait in line, first come first served, and whoever waits is told how many are ahead.

The gate is per process (`START_GATE`): a pool, a server's sessions and a benchmark's threads all
share it. Each start brings its own limit (`SandboxLimits.start_concurrency`) and enters when it is
first in line and fewer than that many starts are in flight.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

REPORT_EVERY_S = 1.0  # a waiter hears of its place in line at most this often (and once when it gets a slot)


@dataclass(frozen=True)
class StartQueued:
    """Progress of one start waiting for a slot. `ahead`: starts in line before this one;
    `starting`: starts in flight; `limit`: this start's bound. The last report of a start that
    waited has `ahead == 0` and `slot_taken` set, with the whole wait in `waited_s`."""

    ahead: int
    starting: int
    limit: int
    waited_s: float
    slot_taken: bool = False


@dataclass(frozen=True)
class GateCounters:
    """What the gate has seen since its last reset: for tests and the benchmark, never for control."""

    in_flight: int  # starts holding a slot now
    waiting: int  # starts in line now
    peak_in_flight: int
    started: int  # slots handed out
    queued: int  # of those, how many had to wait
    longest_wait_s: float


class StartGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._line: deque[object] = deque()
        self._in_flight = 0
        self._peak = 0
        self._started = 0
        self._queued = 0
        self._longest_wait_s = 0.0

    @contextmanager
    def slot(self, limit: int, on_wait: Callable[[StartQueued], None] | None = None) -> Iterator[None]:
        """Hold one of `limit` slots for the body. `on_wait` hears of the place in line while it
        waits (never when a slot is free at once), from the waiting thread, outside the gate's lock."""
        self._enter(max(1, limit), on_wait)
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def _enter(self, limit: int, on_wait: Callable[[StartQueued], None] | None) -> None:
        ticket = object()
        began = time.monotonic()
        waited_in_line = False
        reported: tuple[int, int] | None = None  # the place last told to on_wait: (ahead, starting)
        last_report = 0.0
        with self._cond:
            self._line.append(ticket)
        try:
            while True:
                with self._cond:
                    if self._line[0] is ticket and self._in_flight < limit:
                        self._line.popleft()
                        waited = time.monotonic() - began
                        self._take(waited, waited_in_line)
                        starting = self._in_flight
                        self._cond.notify_all()  # the next in line may fit too
                        break
                    waited_in_line = True
                    now = time.monotonic()
                    place = (self._line.index(ticket), self._in_flight)
                    if on_wait is None or place == reported or now - last_report < REPORT_EVERY_S:
                        # woken by a released slot or a change in line; or, with a report pending, when it is due
                        pending = on_wait is not None and place != reported
                        self._cond.wait(timeout=REPORT_EVERY_S - (now - last_report) if pending else None)
                        continue
                reported, last_report = place, now
                _tell(
                    on_wait, StartQueued(ahead=place[0], starting=place[1], limit=limit, waited_s=round(now - began, 3))
                )
        except BaseException:  # Ctrl-C while in line: leave it, so the ones behind are not stuck
            with self._cond:
                if ticket in self._line:
                    self._line.remove(ticket)
                    self._cond.notify_all()
            raise
        if reported is not None and on_wait is not None:
            _tell(
                on_wait,
                StartQueued(ahead=0, starting=starting, limit=limit, waited_s=round(waited, 3), slot_taken=True),
            )

    def _take(self, waited: float, queued: bool) -> None:
        self._in_flight += 1
        self._peak = max(self._peak, self._in_flight)
        self._started += 1
        self._queued += queued
        self._longest_wait_s = max(self._longest_wait_s, waited)

    def counters(self) -> GateCounters:
        with self._cond:
            return GateCounters(
                self._in_flight,
                len(self._line),
                self._peak,
                self._started,
                self._queued,
                round(self._longest_wait_s, 3),
            )

    def reset_counters(self) -> None:
        """Start counting afresh (the peak becomes what is in flight now)."""
        with self._cond:
            self._peak, self._started, self._queued, self._longest_wait_s = self._in_flight, 0, 0, 0.0


def _tell(on_wait: Callable[[StartQueued], None], progress: StartQueued) -> None:
    try:
        on_wait(progress)
    except Exception:  # noqa: BLE001 - a front-end's failure must not fail or block the start
        pass


START_GATE = StartGate()
