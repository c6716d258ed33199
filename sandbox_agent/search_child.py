"""A search that may backtrack runs in a forked child with a deadline, and reports to the agent as
it goes: what it found is kept when the child is killed."""
from __future__ import annotations

import json
import os
import signal
import time

from .paths import PathRefused
from .tools import ToolError

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Callable

if TYPE_CHECKING:  # imported where it is used: only a search that may backtrack pays for it
    import mmap


class _InProcess:
    """The search's reporting when it runs in the agent itself: nothing to report to."""

    def send(self, message: dict[str, Any]) -> None:
        pass

    def at(self, shown: str) -> None:
        pass


class _Child:
    """What the search child tells its parent while it runs: each match as it is found (a pipe),
    and the file it is in (shared memory, no system call per file)."""

    def __init__(self, fd: int, shared: mmap.mmap) -> None:
        self.fd, self.shared = fd, shared

    def send(self, message: dict[str, Any]) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[os.write(self.fd, data):]

    def at(self, shown: str) -> None:
        data = shown.encode("utf-8", errors="surrogateescape")[:PROGRESS_BYTES - 4]
        self.shared[4:4 + len(data)] = data
        self.shared[0:4] = len(data).to_bytes(4, "little")


PROGRESS_BYTES = 4096


class _Relayed:
    """A typed failure of the search child, raised again in the agent (its type was checked where
    the child raised it)."""

    def __init__(self, type: str, message: str) -> None:
        self.kind, self.message = type, message


def _run_search(search: Callable[[_Child], dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    import mmap
    import select

    shared = mmap.mmap(-1, PROGRESS_BYTES)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: search, answer, exit; never return into the agent's threads
        code = 0
        try:
            os.close(r)
            _child_setup(w)
            try:
                payload: dict[str, Any] = {"done": search(_Child(w, shared))}
            except (ToolError, PathRefused) as err:
                payload = {"error": {"type": err.kind, "message": str(err)}}
            except MemoryError:
                payload = {"error": {"type": "resource_exhausted", "message": "the search ran out of memory"}}
            except BaseException as err:  # noqa: BLE001 - reported, typed, by the parent
                payload = {"error": {"type": "internal_error", "message": f"{type(err).__name__}: {err}"}}
            _Child(w, shared).send(payload)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not select.select([r], [], [], left)[0]:
                continue
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by the shell's clean-up (PID 1 reaps every orphan)
            pass
        os.close(r)
    messages = [json.loads(line) for line in bytes(data).split(b"\n") if line]
    for message in messages:
        if "done" in message:
            shared.close()
            done: dict[str, Any] = message["done"]  # what _search returned, relayed as JSON
            return done
        if "error" in message:
            shared.close()
            relayed = _Relayed(**message["error"])
            raise ToolError(relayed.kind, relayed.message)
    found = [m["m"] for m in messages if "m" in m]
    hits = [m["h"] for m in messages if "h" in m]
    where = bytes(shared[4:4 + int.from_bytes(shared[0:4], "little")]).decode("utf-8", errors="replace")
    shared.close()
    if not timed_out:
        raise ToolError("io_error", "the search process ended before it answered (killed from outside?); run it again")
    shown = f" while searching {where}" if where else ""
    raise ToolError("timeout", f"the search passed its {timeout_s:.0f}s limit{shown} and was stopped; {len(found)} matching "
                    "line(s) found before that are in the output. A pattern with nested or adjacent quantifiers (like (a+)+ "
                    "or (a|a)*) can backtrack catastrophically: simplify it, or narrow the path or glob",
                    output="\n".join(found), meta={"matches": len(found), "timed_out": True, "searching": where, "hits": hits})


def _child_setup(keep: int) -> None:
    """The forked child holds none of the agent's descriptors but its pipe (a running command's
    pipes would otherwise stay open until it exits) and none of its signal handling."""
    from . import paths

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = []
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass
    paths._proc_fd = None
