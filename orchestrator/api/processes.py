"""`Sandbox.start(command, cwd=, env=) -> Process`: a command that outlives the call that started it
(a server, a watcher), in the same box (issue 46). Every method of a Process is one call of the
session's pipeline (box_processes.py). What comes back is the box's: bounded by the agent (its last
MiB of output, at most 2 MiB per read) and checked here."""

from __future__ import annotations

import base64
import binascii
import codecs
import time
from os import PathLike
from typing import Any, Callable, Iterator

from ..errors import ErrorType
from ..protocol import ToolResult
from .box_processes import KILL, LIST, READ, START, WAIT, WAIT_MAX_S, WRITE
from .results import ToolError
from .tool_calls import placed, require  # require: stdin's data, encoded before the call

CHUNK = 1 << 20


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if type(value) is int else None


class Process:
    """One background process of a box: `.id` (p1, p2 ...), `.pid` (in the box), `.command`."""

    def __init__(self, box: Any, result: ToolResult, command: str) -> None:
        self._box = box
        meta = result.meta
        pid = meta.get("id")
        if not isinstance(pid, str) or not pid.startswith("p") or not pid[1:].isdigit():
            raise ToolError(ErrorType.PROTOCOL_ERROR, "the box named no process", result)
        self.id, self.pid, self.command = pid, _int(meta, "pid"), command
        self._since = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.exit_code: int | None = None
        self.running = True
        self.lost = False
        self.dropped = 0  # bytes of output the box's ring let go before they were read

    def __repr__(self) -> str:
        return (
            f"Process({self.id}, pid={self.pid}, running={self.running}, "
            f"exit_code={self.exit_code}, command={self.command[:60]!r})"
        )

    def _note(self, meta: dict[str, Any]) -> None:
        self.running = meta.get("running") is True
        self.exit_code = _int(meta, "exit_code")
        self.lost = meta.get("lost") is True

    def _read(self, wait: int) -> tuple[bytes, bool]:
        result = self._box._checked(READ, {"id": self.id, "since": self._since, "wait": wait})[1]
        meta = result.meta
        text, after = meta.get("data"), _int(meta, "next")
        if not isinstance(text, str) or after is None or len(text) > (2 * CHUNK // 3 + 1) * 4 * 2:
            raise ToolError(ErrorType.PROTOCOL_ERROR, f"{self.id}: the box's answer is malformed", result)
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ToolError(ErrorType.PROTOCOL_ERROR, f"{self.id}: the box's output is not base64", result) from None
        if after != self._since + len(data) + max(_int(meta, "dropped") or 0, 0):
            raise ToolError(ErrorType.PROTOCOL_ERROR, f"{self.id}: the box's output does not add up", result)
        self.dropped += max(_int(meta, "dropped") or 0, 0)
        self._since = after
        self._note(meta)
        return data, meta.get("output_ended") is True

    def read_bytes(self) -> bytes:
        """What it printed (stdout and stderr together) since the last read, without waiting."""
        parts = []
        while True:
            data, _ = self._read(0)
            parts.append(data)
            if not data:
                return b"".join(parts)

    def read(self) -> str:
        """read_bytes() as text (UTF-8; a character split across reads is kept for the next)."""
        return self._decoder.decode(self.read_bytes())

    def next_text(self, end: float | None = None) -> tuple[str, bool]:
        """The next output as text, waiting a few seconds at most for some (not past `end`, a
        time.monotonic()); and whether it ended (or `end` passed)."""
        left = 5 if end is None else max(0, min(5, int(end - time.monotonic())))
        data, ended = self._read(left)
        return self._decoder.decode(data, final=ended), ended or (end is not None and time.monotonic() >= end)

    def stream(self, timeout: float | None = None) -> Iterator[str]:
        """Its output as it comes, until it ended and its output closed (or `timeout` seconds)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            text, ended = self.next_text(end)
            if text:
                yield text
            if ended:
                return

    def write(self, data: str | bytes, *, close: bool = False) -> None:
        """Write to its stdin (text as UTF-8); `close=True` closes stdin after."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        require(WRITE, "data", data, (bytes, bytearray), "bytes or str")
        view = memoryview(bytes(data))
        while True:
            piece = view[:CHUNK]
            view = view[CHUNK:]
            last = not view
            self._box._checked(
                WRITE, {"id": self.id, "data": base64.b64encode(piece).decode("ascii"), "close": close and last}
            )
            if last:
                return

    def close_stdin(self) -> None:
        self.write(b"", close=True)

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.wait(0) if self.running else self.exit_code

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for it to end (at most `timeout` seconds; None: as long as it takes): its exit code
        (negative: killed by that signal), or None if it still runs when the time is up."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WAIT_MAX_S if end is None else max(0, min(WAIT_MAX_S, int(end - time.monotonic() + 0.999)))
            meta = self._box._checked(WAIT, {"id": self.id, "timeout": left})[1].meta
            self._note(meta)
            if not self.running:
                if self.lost:
                    raise ToolError(ErrorType.AGENT_LOST, f"{self.id} was lost: the box's process keeper was killed")
                return self.exit_code
            if end is not None and time.monotonic() >= end:
                return None

    def kill(self) -> int | None:
        """SIGKILL to it and everything it started; its exit code after."""
        meta = self._box._checked(KILL, {"id": self.id})[1].meta
        self._note(meta)
        return self.exit_code


class ProcessMethods:
    """`start` and `processes`; the class using it provides `_checked` and `_passed_env`."""

    def _checked(
        self, tool: str, arguments: dict[str, Any], on_output: Callable[[str], None] | None = None
    ) -> tuple[str, ToolResult]:
        raise NotImplementedError

    def _passed_env(self, env: dict[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def start(
        self, command: str, *, cwd: str | PathLike[str] | None = None, env: dict[str, str] | None = None
    ) -> Process:
        """`/bin/sh -c command` in the background, in the workspace (or `cwd`), with `env` added, as
        shell() takes them: it runs on after this call, until it ends, is killed, or the box closes.
        Its output (stdout and stderr) is kept, the last 1 MiB; at most 16 run at once in a box
        (ToolError(RESOURCE_EXHAUSTED) beyond)."""
        sent = placed(START, command, cwd, env, self._passed_env, method="start")
        return Process(self, self._checked(START, {"command": sent})[1], command)

    def processes(self) -> list[dict[str, Any]]:
        """Every background process of the box: id, pid, running, exit_code, output_bytes, command."""
        found = self._checked(LIST, {})[1].meta.get("processes")
        return [p for p in found if isinstance(p, dict)][:256] if isinstance(found, list) else []
