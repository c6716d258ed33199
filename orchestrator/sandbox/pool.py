"""A warm pool: N sandboxes of one workspace already started, so a session starts in
milliseconds. Each claimed sandbox is replaced in the background; none is ever handed out twice.

How fast it refills, under a burst of claims: `refill_concurrency` worker threads (default 2)
start boxes while fewer are ready or starting than `size` plus the claims waiting, so a burst is
served at up to `refill_concurrency` starts at a time (never more than the process's start gate,
starts.py, lets through): at most refill_concurrency / (one start's time) boxes a second. Measured
with 2 workers (bench/run.py, cold start section: 10 claims at once on a full pool of 2, quiet,
2026-12-06): 5.7 boxes a second under runc, 2.8 under gVisor. Each box is asked to warm up as it is
put in line (its agent imports every tool and makes its first shell: sandbox_agent/server.py).
A start that fails is not tried again at once: the workers wait 1 s, then 2, 4, ... up to 30 s,
and while starts keep failing only one attempt runs at a time; one success resets the wait. Each
failure is reported (`on_event`, typed), and a claim waiting for a box gets the failure's own typed
error: at once when it is fatal (no image, no daemon), else when its timeout passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

from ..config import SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from .backend import backend_from_config
from .base import Backend, Box
from .starts import StartQueued
from .sweep_journal import capture_baseline

log = logging.getLogger(__name__)

REFILL_CONCURRENCY = 2
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class PoolBoxReady:
    ready: int  # boxes ready now, this one included
    size: int
    waiting_claims: int


@dataclass(frozen=True)
class PoolStartFailed:
    error: OpenAgentsError
    consecutive: int  # failures in a row, this one included
    retry_in_s: float  # the workers wait this long before the next attempt


PoolEvent = Union[PoolBoxReady, PoolStartFailed, StartQueued]  # StartQueued: a refill waits for a start slot


@dataclass(frozen=True)
class PoolCounters:
    ready: int
    starting: int
    waiting_claims: int
    started: int  # boxes started since the pool was made
    failed: int  # starts that failed
    claimed: int


class SandboxPool:
    def __init__(
        self,
        workspace: str | Path,
        config: SandboxConfig | None = None,
        size: int = 2,
        client: Any = None,
        backend: Backend | None = None,
        refill_concurrency: int = REFILL_CONCURRENCY,
        on_event: Callable[[PoolEvent], None] | None = None,
    ) -> None:
        """`backend`: default the one the config names; `client`: a connection handed to it (backend_from_config).
        `on_event`: told of each box made ready, each failed start and each refill waiting for a start
        slot, from the pool's worker threads."""
        if size < 1:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, "a pool needs at least one sandbox")
        if refill_concurrency < 1:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, "a pool needs at least one refill worker")
        self.workspace = Path(workspace)
        self.config = config or SandboxConfig()
        self.size = size
        self.refill_concurrency = refill_concurrency
        self.backend = backend or backend_from_config(self.config, client)
        self.on_event = on_event
        self._cond = threading.Condition()
        self._ready: deque[Box] = deque()
        self._starting = 0
        self._waiting_claims = 0
        self._closed = False
        self._failure: OpenAgentsError | None = None  # the last start's, until one succeeds
        self._consecutive_failures = 0
        self._retry_at = 0.0
        self._started = self._failed = self._claimed = 0
        self._workers: list[threading.Thread] = []
        # One baseline for every box of the pool, taken before any ran: a box started later, while a
        # session's box was writing, must not count that box's plants as the user's own.
        self._baseline = capture_baseline(self.workspace.resolve())

    def __enter__(self) -> "SandboxPool":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        with self._cond:
            if self._workers:
                return
            self._workers = [
                threading.Thread(target=self._work, daemon=True, name=f"oa-pool-{n}")
                for n in range(self.refill_concurrency)
            ]
        for worker in self._workers:
            worker.start()

    def claim(self, timeout: float = 120.0) -> Box:
        """A started sandbox, yours to close; a replacement starts in the background. Raises the
        failed start's own typed error when the pool cannot start boxes (see the module's note)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiting_claims += 1
            self._cond.notify_all()  # a claim nobody can serve yet: the workers start one for it
            try:
                while not self._ready:
                    if self._closed:
                        raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, "the pool is closed")
                    failure = self._failure
                    if failure is not None and not failure.type.recoverable:
                        raise OpenAgentsError(failure.type, f"the pool cannot start a sandbox: {failure.message}")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        why = f": the last start failed: {failure.message}" if failure is not None else ""
                        raise OpenAgentsError(
                            failure.type if failure is not None else ErrorType.SANDBOX_START_FAILED,
                            f"no pooled sandbox was ready within {timeout:.0f}s{why}",
                        )
                    self._cond.wait(left)
                box = self._ready.popleft()
                self._claimed += 1
            finally:
                self._waiting_claims -= 1
            self._cond.notify_all()  # one fewer ready: a worker replaces it
        return box

    def counters(self) -> PoolCounters:
        with self._cond:
            return PoolCounters(
                len(self._ready), self._starting, self._waiting_claims, self._started, self._failed, self._claimed
            )

    # -- the workers -------------------------------------------------------------------------
    def _wanted(self) -> bool:
        """Under the lock: whether one more start is needed now (and not held back by a failure)."""
        short = len(self._ready) + self._starting < self.size + self._waiting_claims
        if self._consecutive_failures and self._starting:
            return False  # while starts fail, one attempt at a time probes whether they work again
        return short and time.monotonic() >= self._retry_at

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._wanted():
                    wait = self._retry_at - time.monotonic()
                    self._cond.wait(wait if wait > 0 else None)
                if self._closed:
                    return
                self._starting += 1
            try:
                self._start_one()
            finally:
                with self._cond:
                    self._starting -= 1
                    self._cond.notify_all()

    def _start_one(self) -> None:
        """One box started and put in line for a claim, or its failure reported and waited out."""
        try:
            box = self.backend.sandbox(self.workspace, self.config, baseline=self._baseline)
            box.on_start_queue = self._tell
            box.start()
        except Exception as err:  # noqa: BLE001 - a worker must outlive any failed start, typed or not
            typed = (
                err
                if isinstance(err, OpenAgentsError)
                else OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"{type(err).__name__}: {err}")
            )
            self._failed_start(typed)
            return
        try:  # best effort: the agent imports every tool now, not at a claimer's first calls
            box.call("hello", {"warm_up": True})
        except Exception:  # noqa: BLE001 - a box that did not warm up still serves; one that is lost is replaced at its next call
            log.debug("a pool box did not warm up", exc_info=True)
        box.on_start_queue = None  # the claimer's session sets its own
        with self._cond:
            closed = self._closed
            if not closed:
                self._ready.append(box)
                self._started += 1
                self._failure, self._consecutive_failures, self._retry_at = None, 0, 0.0
                ready = PoolBoxReady(len(self._ready), self.size, self._waiting_claims)
                self._cond.notify_all()
        if closed:
            box.close()
            return
        self._tell(ready)

    def _failed_start(self, err: OpenAgentsError) -> None:
        with self._cond:
            self._failed += 1
            self._consecutive_failures += 1
            delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self._consecutive_failures - 1))
            self._retry_at = time.monotonic() + delay
            self._failure = err.detached()  # kept: not the raised one, whose frames hold this pool
            event = PoolStartFailed(err, self._consecutive_failures, delay)
            self._cond.notify_all()  # waiting claims see the failure
        log.error("pool: a sandbox did not start (%s): %s; next attempt in %.0f s", err.type.value, err.message, delay)
        self._tell(event)

    def _tell(self, event: PoolEvent) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:  # noqa: BLE001 - a listener's failure must not stop the refills
            log.debug("pool: on_event failed", exc_info=True)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join(timeout=60)
        with self._cond:
            boxes, self._ready = list(self._ready), deque()
        for box in boxes:
            box.close()
