"""The stdio transport to the user's MCP servers, bounded at read time.

The SDK's own stdio client reads a whole line, however long, and parses it: a server that writes
one 50 MB line makes the host hold it (and its parse) whole. Here a line is gathered in bytes up to
MAX_MESSAGE_BYTES; a line that passes it is never finished: the server's process group is killed
at once, `on_lost` says why, and the read stream ends, so the call waiting on it fails (the
session's pending requests end with "Connection closed") and the client reports it typed. A line
within the size whose JSON values are more than MAX_MESSAGE_VALUES (counted before parsing: 4 MiB
of `[],` would parse into some 600 MiB of objects) is treated the same.

A server is its own process group (start_new_session); every way out (the server closed its
stdout, it exited or crashed, the session ends, the host killed it) ends with SIGKILL to that group,
so a child it started is not left running either (nor holds its stdout open,
keeping a call waiting). `Process.kill_group()` may be called from any thread.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import anyio
import anyio.lowlevel
from anyio.abc import Process

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # one JSON-RPC message from a server, before parsing
# And its values (an upper bound: `[`, `{` and `,` outside strings): parsed, a tiny value costs some
# 400 bytes of objects, so 4 MiB of `[],` would take some 600 MiB. 64 Ki values stay under ~40 MiB.
MAX_MESSAGE_VALUES = 64 * 1024
CHUNK = 64 * 1024
GRACE_S = 2.0  # after stdin closes, before SIGTERM (the MCP spec's shutdown), then as long to SIGKILL
_POLL_S = 0.02


_NOT_COUNTED = bytes(set(range(256)) - set(b'"[]{},'))
_PIECE = 64 * 1024


def json_values(data: bytes, cap: int) -> int:
    """An upper bound on the values in a JSON text (each `[`, `{` and `,` outside strings), counted
    without parsing: bytes-wide C passes, a 64 KiB piece at a time (sandbox_agent/jsonbound.py's way
    of finding what lies outside strings). Stops counting once past `cap`."""
    quick = data.count(b",") + data.count(b"[") + data.count(b"{")
    if quick <= cap:
        return quick
    # A backslash escapes the next character: with escaped backslashes gone, then escaped quotes,
    # each quote left opens or closes a string.
    skeleton = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_COUNTED)
    count, in_string = 0, False
    for start in range(0, len(skeleton), _PIECE):
        parts = skeleton[start : start + _PIECE].split(b'"')
        outside = b"".join(parts[1 if in_string else 0 :: 2])
        in_string ^= len(parts) % 2 == 0
        count += len(outside) - outside.count(b"]") - outside.count(b"}")
        if count > cap:
            break
    return count


@dataclass
class ServerProcess:
    """The server's process group, as far as the host knows it is still there."""

    pgid: int | None = None
    ended: bool = False  # the transport saw it exit (its pid may be reused from then on)
    killed: list[str] = field(default_factory=list)

    def kill_group(self, why: str = "") -> None:
        """SIGKILL to the whole group; a no-op once the group is known gone."""
        if why:
            self.killed.append(why)
        if self.pgid is None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)


@asynccontextmanager
async def bounded_stdio(
    command: str,
    args: list[str],
    env: dict[str, str],
    cwd: str | None,
    errlog: TextIO,
    handle: ServerProcess,
    on_lost: Callable[[str], None],
    max_message: int = MAX_MESSAGE_BYTES,
    max_values: int = MAX_MESSAGE_VALUES,
) -> AsyncIterator[TransportStreams]:
    """The SDK's Transport: (read stream, write stream) of SessionMessage, for mcp.Client."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    process: Process = await anyio.open_process(
        [command, *args], env=env, stderr=errlog, cwd=cwd, start_new_session=True
    )
    handle.pgid = process.pid
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    def parse(line: bytes) -> SessionMessage | Exception:
        try:
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError:  # never the line itself: it is the server's text, and it goes to logs
            return ValueError(f"the MCP server sent a line that is not a JSON-RPC message ({len(line)} bytes)")

    def too_big(size: int) -> None:
        on_lost(f"sent a message over the limit of {max_message} bytes (at least {size}); it was stopped")
        handle.kill_group()

    def too_many(values: int) -> None:
        on_lost(f"sent a message over the limit of {max_values} JSON values (at least {values}); it was stopped")
        handle.kill_group()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        pending = bytearray()
        try:
            async with read_writer:
                while True:
                    try:
                        chunk = await process.stdout.receive(CHUNK)
                    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        return
                    start = 0
                    while (end := chunk.find(b"\n", start)) != -1:
                        if len(pending) + end - start > max_message:
                            return too_big(len(pending) + end - start)
                        pending += chunk[start:end]
                        start = end + 1
                        line = bytes(pending)
                        pending.clear()
                        if (values := json_values(line, max_values)) > max_values:
                            return too_many(values)
                        if line.strip():
                            await read_writer.send(parse(line))
                    if len(pending) + len(chunk) - start > max_message:
                        return too_big(len(pending) + len(chunk) - start)
                    pending += chunk[start:]
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the session is gone
        finally:
            handle.kill_group()  # its stdout is closed or no longer read: the connection is over, children too

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the connection end, not a request hanging
        finally:
            writer_done.set()

    async def watch_exit() -> None:
        """A server that dies mid-call while a child of its own holds its stdout open would leave
        the reader waiting for an EOF that never comes: once it exits, its group goes too."""
        while process.returncode is None:
            await anyio.sleep(0.1)
        handle.kill_group()

    async def exited(timeout: float) -> bool:
        deadline = anyio.current_time() + timeout
        while process.returncode is None:
            if anyio.current_time() >= deadline:
                return False
            await anyio.sleep(_POLL_S)
        return True

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(0.5):
            await writer_done.wait()
        for stream in (process.stdin, process.stdout):
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                if stream is not None:
                    await stream.aclose()
        if not handle.killed and not await exited(GRACE_S):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            await exited(GRACE_S)
        handle.kill_group()  # whatever is left of the group, the server itself included
        await exited(GRACE_S)
        handle.ended = process.returncode is not None
        if handle.ended:
            handle.pgid = None
        transport = getattr(getattr(process, "_process", None), "_transport", None)
        if callable(close := getattr(transport, "close", None)):
            with suppress(PermissionError):
                close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(watch_exit)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
