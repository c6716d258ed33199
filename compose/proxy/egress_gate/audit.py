"""The gate's log: one JSON line per decision on stdout, and the marks the host drains it by.

The host reads these lines from Docker's copy of stdout (orchestrator/sandbox/egress.py drain()),
which Docker makes asynchronously: at the end of a tool call the last lines may not be in it yet.
So the host asks for a mark (a real-time signal, MARK_SIGNAL_BASE + a nonce, sent with `docker
kill`; the box cannot signal this container) and reads until the mark with its nonce arrives:
every line written before it is then in the log, in order. A mark is written only after the
connections open when it was asked for have ended and logged their record (at most MARK_GRACE_S):
a record the gate writes a moment after the box has its answer (a tunnel the box closed, an
upstream that was slow to close) still goes to the call that made the request. A connection still
open after the grace (a background download) is counted in the mark's `open` and logged when it ends.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from .checks import short

MARK_SIGNAL_BASE = 50  # SIGRTMIN+16 under glibc: far from what a runtime or libc uses
MARK_NONCES = 8  # the host cycles through them (orchestrator/sandbox/egress.py); each its own signal, so none coalesce
MARK_GRACE_S = 1.0

Sink = Callable[[dict[str, Any]], None]


class AuditLog:
    """Numbered JSON lines (`seq` lets a reader that fetches overlapping windows drop what it has
    seen) and the set of connections in flight, which a mark waits for."""

    def __init__(self, out: TextIO | None = None, sink: Sink | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.sink = sink  # instead of the stream: a test or bench that runs the gate in-process
        self._lock = threading.Lock()
        self._seq = 0
        self._open: set[int] = set()
        self._next_id = 0
        self._changed = threading.Condition()

    def log(self, **fields: Any) -> None:
        """One line; every string cut short (checks.short). Written before the box has its answer."""
        fields = {k: short(v) for k, v in fields.items()}
        if self.sink is not None:
            self.sink(fields)
            return
        with self._lock:
            self._seq += 1
            self.out.write(
                json.dumps({"ts": round(time.time(), 3), "seq": self._seq, "event": "egress", **fields}) + "\n"
            )
            self.out.flush()

    def opened(self) -> int:
        """A connection begins: its id, for closed()."""
        with self._changed:
            self._next_id += 1
            self._open.add(self._next_id)
            return self._next_id

    def closed(self, connection: int) -> None:
        with self._changed:
            self._open.discard(connection)
            self._changed.notify_all()

    def mark(self, nonce: int, grace: float = MARK_GRACE_S) -> None:
        """Writes the mark for `nonce` once every connection open now has ended, or after `grace`."""
        deadline = time.monotonic() + grace
        with self._changed:
            waiting = set(self._open)
            while waiting & self._open and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            still_open = len(waiting & self._open)
        self.log(decision="mark", nonce=nonce, open=still_open)

    def listen_for_marks(self) -> None:
        """Each mark signal starts a thread that writes its mark (the signal handler itself runs on
        the main thread, which accepts connections: it must not wait)."""

        def asked(signum: int, _frame: object) -> None:
            threading.Thread(target=self.mark, args=(signum - MARK_SIGNAL_BASE,), daemon=True).start()

        for nonce in range(MARK_NONCES):
            signal.signal(MARK_SIGNAL_BASE + nonce, asked)
