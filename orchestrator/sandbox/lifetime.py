"""Every box a process started goes when the process goes: at exit, and on SIGTERM, SIGINT or
SIGHUP, whatever the process was doing then.

A process-wide registry holds the deployments that may still hold a box. At exit each is removed
and closed, and then, if any was still there, each backend's sweep removes whatever else carries
this process's owner labels (a box whose create call a signal cut short: its handle never came
back). Signals chain with the handlers already there: one the program installed (the CLI's, which
unwinds like Ctrl-C so that the session ends properly; an application's own) is left in place,
and the exit that follows does the rest. A signal left at its default disposition, which would end
the process with no clean-up at all, gets a handler that sweeps and then ends the process by the
same signal, as it would have been. Ignored signals stay ignored.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Holder(Protocol):
    """A deployment: what may hold a box (base.Deployment has both)."""

    def remove(self) -> None: ...

    def close(self) -> None: ...


_lock = threading.Lock()
_live: dict[int, Holder] = {}
_sweeps: dict[Callable[[], None], None] = {}  # an ordered set: each backend's "remove all of this process's"
_pid: int | None = None  # whose registry this is: a forked child inherits the dict, not the boxes
_atexit_in: int | None = None
_signals_in: int | None = None


def track(holder: Holder, sweep: Callable[[], None]) -> None:
    """`holder` may hold a box from now on; `sweep` removes everything of this process on its backend."""
    global _pid
    with _lock:
        if _pid != os.getpid():
            _live.clear()
            _sweeps.clear()
            _pid = os.getpid()
        _live[id(holder)] = holder
        _sweeps[sweep] = None
    install()


def untrack(holder: Holder) -> None:
    """`holder` holds nothing any more (its box is confirmed gone)."""
    with _lock:
        _live.pop(id(holder), None)


def tracked() -> int:
    """How many deployments of this process may still hold a box."""
    return len(_live) if _pid == os.getpid() else 0


def install() -> None:
    """The exit hook, and the signal handlers where the disposition is the default. Signal handlers
    can only be set from the main thread: called elsewhere, only the exit hook (the next call from
    the main thread adds the handlers). Idempotent per process."""
    global _atexit_in, _signals_in
    pid = os.getpid()
    with _lock:
        if _atexit_in != pid:
            atexit.register(_at_exit)
            _atexit_in = pid
        if _signals_in == pid or threading.current_thread() is not threading.main_thread():
            return
        _signals_in = pid
    for signum in SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _sweep_then_die)


def _sweep_then_die(signum: int, frame: FrameType | None) -> None:
    """The default action was to end the process on the spot: first remove its boxes, through
    connections of their own (the interrupted code may be mid-request), then end it the same way."""
    _ignore_signals()
    _run_sweeps()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _at_exit() -> None:
    if _pid != os.getpid() or not _live:
        return
    _ignore_signals()  # the clean-up runs to its end, as the CLI's own does
    for holder in list(_live.values()):
        try:
            holder.remove()
            holder.close()
        except Exception as err:  # noqa: BLE001 - the sweep below still runs
            log.warning("removing a sandbox at exit: %s: %s", type(err).__name__, err)
    _run_sweeps()


def _run_sweeps() -> None:
    if _pid != os.getpid() or not _live:
        return
    for sweep in list(_sweeps):
        try:
            sweep()
        except Exception as err:  # noqa: BLE001 - never a traceback on the way out
            log.warning("removing this process's sandboxes: %s: %s", type(err).__name__, err)


def _ignore_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            if signal.getsignal(signum) is not None:  # None: set outside Python, leave it
                signal.signal(signum, signal.SIG_IGN)
