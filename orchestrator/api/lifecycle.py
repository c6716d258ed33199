"""What a sandbox's life cycle needs besides the session itself: Ctrl-C and SIGTERM held off while
it is taken apart, the close at interpreter exit (or collection) of one never closed, and a
program's callbacks kept from breaking a call."""
from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..session import OpenSession


def quietly(callback: Callable[[Any], None], value: Any) -> None:
    """A program's callback: what it raises is its own business, never the session's (it is called
    from the box's reader and the transcript, mid-call)."""
    try:
        callback(value)
    except Exception:  # noqa: BLE001 - see above
        pass


def close_quietly(opened: OpenSession) -> None:
    try:
        opened.finish("closed", "the program ended without closing the sandbox")
        opened.close()
    except Exception:  # noqa: BLE001 - at interpreter exit: nothing to tell
        pass


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

