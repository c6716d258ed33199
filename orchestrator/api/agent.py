"""An agent's run on an open sandbox: the turn loop in a worker thread, its typed events handed to the
program as they happen (the events `oa-sandbox run --output stream-json` prints, parsed), its
SessionResult at the end. Leaving the iteration early (break, an exception, Ctrl-C) cancels the
run: the call running is killed, the loop ends, and the sandbox stays open for more."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

from .. import events as ev
from ..errors import ErrorType, OpenAgentsError

if TYPE_CHECKING:
    from ..loop import SessionResult, TurnLoop

_DONE = object()


class AgentRun:
    """Iterate for `events.Event`s (sync: `for e in run`, async: `async for e in run`); `.result`
    is the SessionResult once it ended; `wait()` runs it to its end and returns that."""

    def __init__(
        self,
        session: TurnLoop,
        task: str,
        sinks: list[Callable[[dict[str, Any]], None]],
        kill: Callable[[], None],
        ended: Callable[[int], None],
    ) -> None:
        self._session, self._task, self._sinks, self._kill, self._ended = session, task, sinks, kill, ended
        self.result: SessionResult | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._events: queue.Queue[Any] = queue.Queue()
        self._consumed = False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self, sink: Callable[[dict[str, Any]], None]) -> None:
        if self._thread is not None:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, "this run was started already: an AgentRun is iterated once"
            )
        self._sinks.append(sink)
        self._session.cancel.clear()

        def work() -> None:
            try:
                self.result = self._session.run(self._task)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting side
                self._error = err
            finally:
                self._ended(self._session.turn)
                try:
                    self._sinks.remove(sink)
                except ValueError:
                    pass
                sink({"type": _DONE})

        self._thread = threading.Thread(target=work, name="oa-agent-run", daemon=True)
        self._thread.start()

    def _cancel(self) -> None:
        """The program stopped listening before the end: the run is cancelled, what runs is killed."""
        if self._thread is not None and self._thread.is_alive():
            self._session.cancel.set()
            try:
                self._kill()
            except Exception:  # noqa: BLE001 - the box may be gone; the loop ends anyway
                pass
            self._thread.join()
        self._session.cancel.clear()  # the sandbox goes on: its next calls are not cancelled

    def _joined(self) -> None:
        """The worker's last act is handing on the end: once it is seen, the worker is waited for, so
        `running` is false by the time the program can ask for another run."""
        if self._thread is not None:
            self._thread.join()

    def _outcome(self) -> SessionResult:
        if self._error is not None:
            raise self._error
        assert self.result is not None
        return self.result

    def __iter__(self) -> Iterator[ev.Event]:
        self._start(self._events.put)
        finished = False
        try:
            while True:
                record = self._events.get()
                if record.get("type") is _DONE:
                    finished = True
                    break
                typed = ev.parse(record)
                if typed is not None:
                    yield typed
        finally:
            if not finished:
                self._cancel()
        self._joined()
        self._outcome()

    def wait(self) -> SessionResult:
        """Run to the end (the events go to the sandbox's on_event only); the SessionResult."""
        if self._thread is None:
            for _ in self:
                pass
        elif self._thread.is_alive():
            self._thread.join()
        return self._outcome()

    async def __aiter__(self) -> AsyncIterator[ev.Event]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def hand_on(record: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(events.put_nowait, record)

        self._start(hand_on)
        finished = False
        try:
            while True:
                record = await events.get()
                if record.get("type") is _DONE:
                    finished = True
                    break
                typed = ev.parse(record)
                if typed is not None:
                    yield typed
        finally:
            if not finished:
                await asyncio.to_thread(self._cancel)
        await asyncio.to_thread(self._joined)
        self._outcome()

    async def wait_async(self) -> SessionResult:
        async for _ in self:
            pass
        return self._outcome()
