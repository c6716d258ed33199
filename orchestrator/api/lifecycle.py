"""What a sandbox's life cycle needs besides the session itself: Ctrl-C and SIGTERM held off while
it is taken apart, the close at interpreter exit (or collection) of one never closed, and a
program's callbacks kept from breaking a call."""
from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

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

