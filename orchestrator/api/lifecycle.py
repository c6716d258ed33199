"""What a sandbox's life cycle needs besides the session itself: Ctrl-C and SIGTERM held off while
it is taken apart, the close at interpreter exit (or collection) of one never closed, and a
program's callbacks kept from breaking a call."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..boxfs import remove_path
from ..workspace.copy_session import discard_session
from ..workspace.records import SANDBOX_UID, WorkspaceMode

if TYPE_CHECKING:
    from ..session import OpenSession
    from ..workspace.records import SessionRecord


def quietly(callback: Callable[[Any], None], value: Any) -> None:
    """A program's callback: what it raises is its own business, never the session's (it is called
    from the box's reader and the transcript, mid-call)."""
    try:
        callback(value)
    except Exception:  # noqa: BLE001 - see above
        pass


def close_quietly(opened: OpenSession, scratch: Path | None = None) -> None:
    """A sandbox collected, or left open at interpreter exit: its box removed, its scratch workspace too."""
    try:
        opened.finish("closed", "the program ended without closing the sandbox")
        opened.close()
    except Exception:  # noqa: BLE001 - at interpreter exit: nothing to tell
        pass
    if scratch is not None:
        try:
            close_scratch(scratch, opened.record)
        except Exception:  # noqa: BLE001 - as above
            pass


def make_scratch() -> Path:
    """An empty private directory for `Sandbox()` without a workspace. Made by root, it belongs to the
    image's unprivileged user, so it is worked on in bind mode as that user (never as uid 0)."""
    path = Path(tempfile.mkdtemp(prefix="oa-scratch-"))
    if os.geteuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
    return path


def close_scratch(scratch: Path, record: SessionRecord | None) -> None:
    """The scratch directory removed (box-written: through boxfs, no link followed); a copy session
    on it is discarded, as there is nothing left to land its changes in."""
    try:
        if record is not None and record.mode == WorkspaceMode.COPY and not record.discarded:
            discard_session(record)
    finally:
        remove_path(scratch)


_HELD = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and a front-end's SIGTERM (cli.common.terminate_as_interrupt)


def hold_interrupts() -> Any:
    """While the box is removed and the workspace swept, neither Ctrl-C nor SIGTERM cuts it short."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in _HELD]
    except ValueError:
        return None


def release_interrupts(previous: Any) -> None:
    for sig, handler in previous or []:
        signal.signal(sig, handler)


class Deadlines:
    """`idle_timeout` and `lifetime` (SandboxOptions): a daemon thread closes the sandbox once no call
    has run for `idle_timeout` seconds (a call running, or a model's run, is not idleness), or once
    it has been open `lifetime` seconds (whatever runs then is killed). It holds the sandbox weakly
    (`expire` and `working` are weak methods of it), so a sandbox dropped without close() is still
    collected, and closed then."""

    def __init__(
        self,
        expire: weakref.WeakMethod[Callable[[str], None]],
        working: weakref.WeakMethod[Callable[[], bool]],
        idle_timeout: float | None,
        lifetime: float | None,
    ) -> None:
        self._expire, self._working = expire, working
        self.idle_timeout, self.lifetime = idle_timeout, lifetime
        self._opened = self._last = time.monotonic()
        self._busy = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="oa-sandbox-deadlines", daemon=True).start()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """A call runs in the block: no idleness meanwhile, and its end counts as the last activity."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _due(self) -> tuple[float, str]:
        """Seconds until the next deadline (or a check), and why the sandbox ends now if that is 0."""
        now = time.monotonic()
        waits = [5.0]
        if self.lifetime is not None:
            left = self._opened + self.lifetime - now
            if left <= 0:
                return 0.0, f"its lifetime of {self.lifetime:g} s ended (lifetime={self.lifetime:g})"
            waits.append(left)
        if self.idle_timeout is not None:
            working = self._working()
            with self._lock:
                idle = self._busy == 0 and not (working is not None and working())
                if not idle:
                    self._last = now
                left = self._last + self.idle_timeout - now
            if left <= 0:
                return 0.0, f"no call for {self.idle_timeout:g} s (idle_timeout={self.idle_timeout:g})"
            waits.append(left)
        return max(min(waits), 0.05), ""

    def _watch(self) -> None:
        while True:
            wait, why = self._due()
            if why:
                expire = self._expire()
                if expire is not None:
                    expire(why)
                return
            if self._stop.wait(wait) or self._expire() is None:
                return
