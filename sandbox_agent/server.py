"""One JSON message per line over stdin/stdout: the container needs no network interface.

Request:  {"v": 1, "id": 7, "tool": "read_file", "args": {...}}
Ack:      {"v": 1, "id": 7, "ack": true}   (sent when the request is read, before it runs)
Chunk:    {"v": 1, "id": 7, "chunk": "..."}  (shell output while it runs, only if the request had "stream": true)
Response: {"v": 1, "id": 7, "ok": true, "output": "...", "note": "...", "meta": {...}}
      or  {"v": 1, "id": 7, "ok": false, "output": "...", "error": {"type": "...", "message": "..."}, "meta": {...}}

Each request runs in a thread of its own, so a read can answer while a command runs: an idle one
kept from an earlier request where there is one (see _Workers).

A tool's module is imported at its first call (table.py's TOOLS), or in the warm-up that follows the
agent's first tool answer (_warm_up), whichever comes first: the agent answers `hello` and a first read
without loading subprocess, the shell's machinery, the search child or the editor, which under gVisor
cost a cold start tens of milliseconds (issue 26; the shell makes the agent not dumpable when it is
first imported, before its first command).
"""

from __future__ import annotations

import os
import sys
import threading

from . import PROTOCOL_VERSION, jsonbound, limits, names, wire
from .paths import WORKSPACE, PathRefused
from .table import OPS, RULES, TOOLS  # a tool's module and function (imported at its first call), how it runs
from .tools import ToolError

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    import signal
    from collections import deque
    from typing import Any, Callable
else:  # the C modules under them: collections (keyword, operator, reprlib ...) and signal's enums cost
    import _signal as signal  # the start 3 ms under runc, 9-18 ms under gVisor (issue 26)
    from _collections import deque

_loaded: dict[str, Callable[..., dict[str, Any]]] = {}
# A tool's module may define after_answer(): run once each answer of that tool is written (the shell
# starts the next call's /bin/sh then, shell.after_answer), not before, where it would delay the answer.
_after_answer: dict[str, Callable[[], None]] = {}


def _tool(name: str) -> Callable[..., dict[str, Any]]:
    """The tool's function; its module is imported now if this is its first call (the import lock
    makes two first calls at once wait for one import)."""
    fn = _loaded.get(name)
    if fn is None:
        module_name, function = TOOLS[name][:2] if name in TOOLS else OPS[name]
        module = __import__(f"{__package__}.{module_name}", fromlist=[function])
        after = getattr(module, "after_answer", None)
        if after is not None:
            _after_answer[name] = after
        fn = _loaded[name] = getattr(module, function)
    return fn


def _warm_up() -> None:
    """Every tool's module imported, and the first shell call's /bin/sh started (shell.after_answer),
    in a thread of its own once the agent has answered its first tool call (or a hello that asks for
    it, `{"warm_up": true}`: a warm pool's box, which has the time): the first call of each
    tool then pays no import (under gVisor the shell's machinery alone is ~100 ms, and ten boxes
    importing at once slowed every call in them), in the time a model takes to answer, not on the
    first answer's path (the cold start). Nothing but the agent has run in the box before the shell's
    module is imported, whenever that is (a command runs only through it)."""
    for name in TOOLS:
        try:
            _tool(name)
        except Exception:  # noqa: BLE001 - that tool's first call imports it again and says what failed
            pass
    for after in list(_after_answer.values()):  # the shell's: the first call's /bin/sh
        after()
    _warmed.set()


_warming = threading.Lock()  # taken once, for good, by the first answer of a tool call (or a hello that asks)
_warmed = threading.Event()  # set once the warm-up is done: hello's meta says so


def _asks_warm_up(args: Any) -> bool:
    """Exactly {"warm_up": true} (not 1, which equals True in Python)."""
    return isinstance(args, dict) and len(args) == 1 and args.get("warm_up") is True


def _warm_up_once() -> None:
    if _warming.acquire(blocking=False):
        try:
            threading.Thread(target=_warm_up, name="oa-warm-up", daemon=True).start()
        except RuntimeError:  # no thread to be had (out of processes): each tool is imported at its first call
            pass


_out_lock = threading.Lock()


def _send(message: dict[str, Any]) -> None:
    """One message, always valid UTF-8: a name that is not UTF-8 (lone surrogates, as os gives it)
    is shown with `\\xNN` escapes wherever a tool echoed it into text (names.displayed). Raw bytes
    would make the line unreadable to the host, which would take the agent for lost; a structured
    result carries such a name losslessly in its own form (names.exact)."""
    text = wire.encode(message)
    try:
        line = text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # inside JSON strings only: each becomes an escaped backslash and its text
        line = names.displayed(text, "\\\\").encode("utf-8") + b"\n"
    with _out_lock:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def _rss_kib() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def handle(request: dict[str, Any]) -> dict[str, Any]:
    rid = request.get("id")
    base = {"v": PROTOCOL_VERSION, "id": rid}
    tool = request.get("tool")
    args = request.get("args") or {}
    if request.get("v") != PROTOCOL_VERSION:
        return {
            **base,
            "ok": False,
            "error": {
                "type": "protocol_error",
                "message": f"protocol version {request.get('v')!r} is not {PROTOCOL_VERSION}",
            },
        }
    if tool == "hello":
        return {
            **base,
            "ok": True,
            "output": "",
            "meta": {
                "pid": os.getpid(),
                "uid": os.getuid(),
                "rss_kib": _rss_kib(),
                "python": sys.version.split()[0],
                "warm": _warmed.is_set(),
            },
        }
    if not isinstance(tool, str) or (
        tool not in TOOLS and tool not in OPS
    ):  # a list as the tool would be unhashable: unknown, typed
        return {**base, "ok": False, "error": {"type": "unknown_tool", "message": f"unknown tool {tool!r}"}}
    if not isinstance(args, dict):
        return {**base, "ok": False, "error": {"type": "invalid_arguments", "message": "args must be an object"}}
    try:
        fn = _tool(tool)
        if request.get("stream") is True and RULES.get(tool, {}).get("streams") is True:
            result = fn(args, on_output=lambda text: _send({**base, "chunk": text}))
        else:
            result = fn(args)
        return {**base, "ok": True, **result}
    except PathRefused as err:
        return {**base, "ok": False, "error": {"type": err.kind, "message": str(err)}}
    except ToolError as err:
        return {
            **base,
            "ok": False,
            "output": err.output,
            "meta": err.meta,
            "error": {"type": err.kind, "message": str(err)},
        }
    except RecursionError:
        return {**base, "ok": False, "error": {"type": "invalid_arguments", "message": "arguments nest too deeply"}}
    except MemoryError:
        return {
            **base,
            "ok": False,
            "error": {"type": "resource_exhausted", "message": "the sandbox ran out of memory"},
        }
    except Exception as err:  # a bug in a tool must not kill the agent
        return {**base, "ok": False, "error": {"type": "internal_error", "message": f"{type(err).__name__}: {err}"}}


def _accept(line: bytes) -> dict[str, Any] | None:
    """Parse a request and acknowledge it before it runs: the host retries a call on a fresh agent
    only when it never saw the acknowledgement, so a call that may have run is never run twice."""
    try:
        request = jsonbound.loads(line)
        if not isinstance(request, dict):
            raise ValueError("not an object")
    except ValueError as err:
        _send(
            {
                "v": PROTOCOL_VERSION,
                "id": None,
                "ok": False,
                "error": {"type": "protocol_error", "message": f"bad request line: {err}"},
            }
        )
        return None
    if isinstance(request.get("id"), int):
        _send({"v": PROTOCOL_VERSION, "id": request["id"], "ack": True})
    return request


class _Workers:
    """Threads that finished a request wait for the next instead of ending: under gVisor starting a
    thread costs ~3 ms, more than half of a read_file's round trip. A request that finds no idle one
    gets a new thread, as before, so one still never waits for another; at most MAX_IDLE are kept."""

    MAX_IDLE = 4

    def __init__(self) -> None:
        # A deque and a condition, not queue.SimpleQueue: importing queue (and its C module) cost the
        # agent's start ~20 ms under gVisor.
        self._jobs: deque[dict[str, Any]] = deque()
        self._idle = 0
        self._lock = threading.Lock()
        self._job_waiting = threading.Condition(self._lock)

    def submit(self, request: dict[str, Any]) -> None:
        with self._lock:
            if self._idle:  # one of them is (or is about to be) waiting for a job: it takes this
                self._idle -= 1
                self._jobs.append(request)
                self._job_waiting.notify()
                return
        threading.Thread(target=self._work, args=(request,), daemon=True).start()

    def _work(self, request: dict[str, Any]) -> None:
        while True:
            _send(handle(request))
            tool = str(request.get("tool"))
            after = _after_answer.get(tool)
            if after is not None:
                after()
            if tool in TOOLS or (
                tool == "hello" and _asks_warm_up(request.get("args"))
            ):  # a pool's box asks at once (sandbox/pool.py)
                _warm_up_once()
            with self._lock:
                if self._idle >= self.MAX_IDLE:
                    return
                self._idle += 1
                while not self._jobs:
                    self._job_waiting.wait()
                request = self._jobs.popleft()


def _exit_on_signals() -> None:
    """As PID 1 we would ignore SIGTERM; exit instead, so `docker stop` and `kill 1` both end us.

    A process-directed signal lands on any thread that does not block it, and Python runs a handler
    only in the main thread, between bytecodes: with the main thread asleep in read(), a `kill 1`
    that landed on a tool's thread waited for the next request (seen: 2 in 150 under runc). The
    C-level handler also writes the signal to the wakeup fd on whichever thread it lands, so a thread
    that reads it exits at once."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    threading.Thread(target=lambda: (os.read(wake_r, 1), os._exit(0)), name="oa-signals", daemon=True).start()


def main() -> None:
    try:
        os.chdir(WORKSPACE)  # tools open paths relative to it (see paths.local)
    except OSError:
        pass
    _exit_on_signals()
    workers = _Workers()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline(limits.MAX_REQUEST_BYTES + 1)
        if not line:
            os._exit(0)
        if len(line) > limits.MAX_REQUEST_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = stdin.readline(limits.MAX_REQUEST_BYTES)
            _send(
                {
                    "v": PROTOCOL_VERSION,
                    "id": None,
                    "ok": False,
                    "error": {"type": "protocol_error", "message": "request line too long"},
                }
            )
            continue
        if line.strip() and (request := _accept(line)) is not None:
            workers.submit(request)
