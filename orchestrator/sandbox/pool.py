"""A warm pool: N sandboxes of one workspace already started, so a session starts in
milliseconds. Each claimed sandbox is replaced in the background; none is ever handed out twice."""
from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from typing import Any

from ..config import SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..integrity import Baseline
from .backend import Backend, backend_from_config
from .base import Sandbox

log = logging.getLogger(__name__)


class SandboxPool:
    def __init__(self, workspace: str | Path, config: SandboxConfig | None = None, size: int = 2, client: Any = None,
                 backend: Backend | None = None) -> None:
        """`backend`: default the one the config names; `client`: a connection handed to it (backend_from_config)."""
        if size < 1:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, "a pool needs at least one sandbox")
        self.workspace = Path(workspace)
        self.config = config or SandboxConfig()
        self.size = size
        self.backend = backend or backend_from_config(self.config, client)
        self._ready: queue.Queue[Sandbox] = queue.Queue()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        # One baseline for every box of the pool, taken before any ran: a box started later, while a
        # session's box was writing, must not count that box's plants as the user's own.
        self._baseline = Baseline.capture(self.workspace.resolve())

    def __enter__(self) -> "SandboxPool":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        for _ in range(self.size):
            self._refill()

    def claim(self, timeout: float = 120.0) -> Sandbox:
        """A started sandbox, yours to close; a replacement starts in the background."""
        try:
            box = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise OpenAgentsError(ErrorType.SANDBOX_START_FAILED, f"no pooled sandbox was ready within {timeout:.0f}s") from None
        self._refill()
        return box

    def _refill(self) -> None:
        thread = threading.Thread(target=self._start_one, daemon=True, name="oa-pool")
        self._threads.append(thread)
        thread.start()

    def _start_one(self) -> None:
        if self._closed.is_set():
            return
        box = self.backend.sandbox(self.workspace, self.config, baseline=self._baseline)
        try:
            box.start()
        except OpenAgentsError as err:
            log.error("pool: a sandbox did not start: %s", err.message)
            return
        if self._closed.is_set():
            box.close()
        else:
            self._ready.put(box)

    def close(self) -> None:
        self._closed.set()
        for thread in self._threads:
            thread.join(timeout=60)
        while not self._ready.empty():
            self._ready.get_nowait().close()
