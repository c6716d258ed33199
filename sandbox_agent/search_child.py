"""A search that may backtrack runs in a forked child with a deadline, and reports to the agent as
it goes: what it found is kept when the child is killed. Any other search runs in the agent, with
the same deadline looked at between files and blocks of lines. Either way a search that passes it
says what took the time (_Stopped)."""

from __future__ import annotations

import json
import os
import signal
import time

from .paths import PathRefused
from .scan import READ_BLOCK
from .tools import ToolError

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Callable

if TYPE_CHECKING:  # imported where it is used: only a search that may backtrack pays for it
    import mmap


class _InProcess:
    """The search's reporting when it runs in the agent itself (a pattern that cannot backtrack):
    the child's deadline all the same, looked at as each file and each block of lines starts (a
    clock read, no system call); past it the search stops with what it found (_run_in_process)."""

    def __init__(self, timeout_s: float) -> None:
        self.started = time.monotonic_ns()
        self.deadline = self.started + int(timeout_s * 1e9)
        self.found: list[str] = []
        self.hits: list[dict[str, Any]] = []
        self.where, self.files, self.file_ns, self.block_ns, self.line = "", 0, 0, 0, 0

    def send(self, message: dict[str, Any]) -> None:
        self.found.append(message["m"])
        if "h" in message:
            self.hits.append(message["h"])

    def at(self, shown: str) -> None:
        now = time.monotonic_ns()
        if now > self.deadline:
            raise _OutOfTime
        self.where, self.files, self.file_ns, self.block_ns, self.line = shown, self.files + 1, now, now, 0

    def lines(self, number: int) -> None:
        now = time.monotonic_ns()
        if now > self.deadline:
            raise _OutOfTime
        self.block_ns, self.line = now, number


class _OutOfTime(Exception):
    """The in-process search passed its deadline."""


def _run_in_process(search: Callable[[_InProcess], dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    reporter = _InProcess(timeout_s)
    cpu = time.thread_time()  # this thread's: the agent's other threads are not the search's
    try:
        return search(reporter)
    except _OutOfTime:
        now = time.monotonic_ns()
        stopped = _Stopped(
            reporter.where,
            reporter.files,
            reporter.line,
            (now - reporter.started) / 1e9,
            (now - reporter.file_ns) / 1e9 if reporter.files else 0.0,
            (now - reporter.block_ns) / 1e9 if reporter.files else 0.0,
            time.thread_time() - cpu,
            None,
        )
    raise ToolError(
        "timeout",
        stopped.message(timeout_s, len(reporter.found)),
        output="\n".join(reporter.found),
        meta={"matches": len(reporter.found), "timed_out": True, **stopped.meta(), "hits": reporter.hits},
    )


class _Child:
    """What the search child tells its parent while it runs: each match as it is found (a pipe),
    and where it is (a shared page, PROGRESS): how many files it has started, the one it is in and
    since when, and the block of lines it is matching (its first line, since when, and the child's
    CPU time then). At the deadline the parent tells from these what took the time."""

    def __init__(self, fd: int, shared: mmap.mmap) -> None:
        self.fd, self.shared, self.files = fd, shared, 0

    def send(self, message: dict[str, Any]) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[os.write(self.fd, data) :]

    def at(self, shown: str) -> None:
        self.files += 1
        data = shown.encode("utf-8", errors="surrogateescape")[: PROGRESS_BYTES - _NAME]
        now = time.monotonic_ns().to_bytes(8, "little")
        self.shared[_NAME : _NAME + len(data)] = data
        self.shared[0:_NAME] = (
            self.files.to_bytes(8, "little") + now + now + bytes(16) + len(data).to_bytes(4, "little")
        )

    def lines(self, number: int) -> None:
        self.shared[16:40] = (
            time.monotonic_ns().to_bytes(8, "little")
            + number.to_bytes(8, "little")
            + time.process_time_ns().to_bytes(8, "little")
        )


PROGRESS_BYTES = 4096
# The shared page, 8 bytes each (little-endian): files started, when the current one was, when its
# current block of lines was, that block's first line, the child's CPU time then; then the current
# file's name's length (4 bytes) and its name.
_NAME = 44


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
    started_ns = time.monotonic_ns()
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
        stopped_ns = time.monotonic_ns()
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        cpu_s: float | None = None
        try:
            usage = os.wait4(pid, 0)[2]
            cpu_s = usage.ru_utime + usage.ru_stime
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
    progress = bytes(shared[:PROGRESS_BYTES])
    shared.close()
    if not timed_out:
        raise ToolError("io_error", "the search process ended before it answered (killed from outside?); run it again")
    stopped = _Stopped.read(progress, started_ns, stopped_ns, cpu_s)
    raise ToolError(
        "timeout",
        stopped.message(timeout_s, len(found)),
        output="\n".join(found),
        meta={"matches": len(found), "timed_out": True, **stopped.meta(), "hits": hits},
    )


class _Stopped:
    """What the search child was doing when its deadline came, from its shared page: the timeout's
    message says what was measured."""

    def __init__(
        self,
        where: str,
        files: int,
        line: int,
        elapsed: float,
        in_file: float,
        in_block: float,
        cpu: float | None,
        cpu_in_block: float | None,
    ) -> None:
        self.where, self.files, self.line = where, files, line
        self.elapsed, self.in_file, self.in_block = elapsed, in_file, in_block
        self.cpu, self.cpu_in_block = cpu, cpu_in_block

    @classmethod
    def read(cls, page: bytes, started_ns: int, stopped_ns: int, cpu: float | None) -> _Stopped:
        files, file_ns, block_ns, line, block_cpu_ns = (
            int.from_bytes(page[i : i + 8], "little") for i in range(0, 40, 8)
        )
        size = int.from_bytes(page[_NAME - 4 : _NAME], "little")
        return cls(
            page[_NAME : _NAME + size].decode("utf-8", errors="replace"),
            files,
            line,
            (stopped_ns - started_ns) / 1e9,
            (stopped_ns - file_ns) / 1e9 if files else 0.0,
            (stopped_ns - block_ns) / 1e9 if files else 0.0,
            cpu,
            None if cpu is None or not files else max(cpu - block_cpu_ns / 1e9, 0.0),
        )

    def message(self, limit_s: float, found: int) -> str:
        """Which of three things took the time: one block of one file's lines, computing (the
        pattern backtracking: a block is at most 1 MiB, which a pattern that does not backtrack
        matches in well under a second of CPU), one file (its size), or neither (the walk as a
        whole); and whether the machine let the search have the CPU."""
        head = (
            f"the search passed its {limit_s:.0f}s limit and was stopped "
            f"({found} matching line(s) found before that are in the output)"
        )
        busy = ""
        if self.cpu is not None and self.cpu < self.elapsed / 2:
            busy = f"; the machine is busy: the search had {self.cpu:.1f}s of CPU in its {self.elapsed:.1f}s"
        if (
            self.where
            and self.line
            and self.in_block >= self.elapsed / 2
            and self.cpu is not None
            and self.cpu_in_block is not None
            and self.cpu_in_block >= max(BACKTRACK_CPU_S, self.cpu / 2)
        ):
            return (
                f"{head}: matching the pattern against the lines of {self.where} from line {self.line} "
                f"on (at most {READ_BLOCK >> 20} MiB of them) took {self.cpu_in_block:.1f}s of CPU "
                f"({self.in_block:.1f}s) without finishing, after {self.files - 1} other file(s) in "
                f"{self.elapsed - self.in_file:.1f}s. That is the regular expression backtracking "
                "catastrophically (nested or adjacent quantifiers like (a+)+ or (a|a)*, or several .* "
                "on a long line): simplify the pattern, or leave that file out with the path or glob"
            )
        if self.where and self.in_file >= self.elapsed / 2:
            doing = (
                f"its lines from {self.line} on the last {self.in_block:.1f}s"
                if self.line
                else "opening it and judging its first bytes"
            )
            return (
                f"{head}: {self.where} alone took {self.in_file:.1f}s of it ({doing}){busy}; narrow the path or glob "
                "to leave it out, or simplify the pattern"
            )
        return (
            f"{head} after searching {self.files} file(s) in {self.elapsed:.1f}s (the last, {self.where or '-'}, for "
            f"{self.in_file:.1f}s): no single file took most of the time{busy}; narrow the path or glob"
        )

    def meta(self) -> dict[str, Any]:
        return {
            "searching": self.where,
            "files_searched": self.files,
            "line": self.line,
            "seconds": round(self.elapsed, 2),
            "seconds_in_file": round(self.in_file, 2),
            "seconds_in_block": round(self.in_block, 2),
            "cpu_seconds": None if self.cpu is None else round(self.cpu, 2),
        }


BACKTRACK_CPU_S = 1.0


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
