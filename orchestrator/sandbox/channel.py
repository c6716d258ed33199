"""JSON lines over any byte stream to the agent's stdin/stdout.

A deployment hands over an AgentStream (Docker's demultiplexes its attach socket, docker.py); a
reader thread splits lines, validates each as an AgentResponse, and completes the waiting call.
Anything malformed marks the channel broken: the agent is not trusted to recover from its own garbage.

Under gVisor a command in the box can write to the agent's stdout too (issue 22), so a line may be
a forgery. Request ids are random, so a forger cannot name another call's id; an answer for an id
that is not waiting (unknown, or answered already: one of the two was forged) breaks the channel.
"""

from __future__ import annotations

import secrets
import threading
from concurrent.futures import Future
from typing import Any, Callable, Protocol

from pydantic import ValidationError

from sandbox_agent import jsonbound, limits

from ..errors import ErrorType, OpenAgentsError
from ..protocol import AgentRequest, AgentResponse

MAX_LINE_BYTES = 32 * 1024 * 1024


class AgentStream(Protocol):
    """The agent's stdout (read) and stdin (write) as plain bytes, whatever carries them."""

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes of the agent's stdout; b"" once it ended. May raise OpenAgentsError
        (PROTOCOL_ERROR, AGENT_LOST) when the transport's own framing is broken."""

    def sendall(self, data: bytes) -> None: ...

    def close(self) -> None:
        """Unblocks a pending recv and releases the transport; called once the channel is done."""

    def stderr_tail(self) -> bytes:
        """The last bytes the agent wrote to stderr, for an error message (b"" if not kept)."""


MAX_CHUNK_CHARS = 8192  # a streamed output chunk: the agent sends at most 4096; anything longer is cut


def wait(future: Future[AgentResponse], timeout: float) -> AgentResponse:
    """future.result(timeout) for a future from Channel.request; FutureTimeout when it passes. A
    failure is raised as a copy: raised itself, the error the future keeps would gain the caller's
    frames, which hold the future (a reference cycle that keeps them for the cycle collector)."""
    error = future.exception(timeout=timeout)
    if error is None:
        return future.result()
    raise error.detached() if isinstance(error, OpenAgentsError) else error


def _new_id(*taken: Any) -> int:
    """A random 62-bit request id, unlike any in `taken`: nothing in the box can guess it."""
    while True:
        rid = secrets.randbits(62) + 1
        if not any(rid in ids for ids in taken):
            return rid


class Channel:
    def __init__(self, stream: AgentStream) -> None:
        self._stream = stream
        self._pending: dict[int, Future[AgentResponse]] = {}
        self._forgotten: set[int] = set()  # given up on (a passed deadline): a late answer is dropped
        self._received: set[int] = set()  # acknowledged by the agent, not yet answered
        self._listeners: dict[int, Callable[[str], None]] = {}  # streamed output, per request
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.broken: OpenAgentsError | None = None
        self._reader = threading.Thread(target=self._read_loop, name="oa-channel", daemon=True)
        self._reader.start()

    def request(
        self, tool: str, args: dict[str, Any], on_output: Callable[[str], None] | None = None
    ) -> tuple[int, Future[AgentResponse]]:
        """`on_output(text)` receives the output chunks the agent streams while the call runs."""
        future: Future[AgentResponse] = Future()
        with self._lock:
            if self.broken:
                raise self.broken.detached()
            rid = _new_id(self._pending, self._forgotten)
        try:
            request = AgentRequest(id=rid, tool=tool, args=args, stream=True if on_output else None)
            line = request.model_dump_json(exclude_none=True).encode() + b"\n"
        except (ValueError, RecursionError, UnicodeError) as err:
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"the arguments cannot be sent: {str(err)[:200]}"
            ) from None
        if len(line) > limits.MAX_REQUEST_BYTES:
            raise OpenAgentsError(
                ErrorType.FILE_TOO_LARGE, f"the request is {len(line)} bytes; the limit is {limits.MAX_REQUEST_BYTES}"
            )
        with self._lock:
            self._pending[rid] = future
            if on_output is not None:
                self._listeners[rid] = on_output
        try:
            with self._write_lock:
                self._stream.sendall(line)
        except OSError as err:
            self._fail(OpenAgentsError(ErrorType.AGENT_LOST, f"the agent stopped reading: {err}"))
        return rid, future

    def forget(self, rid: int) -> None:
        with self._lock:
            if self._pending.pop(rid, None) is not None:
                self._forgotten.add(rid)
            self._listeners.pop(rid, None)
            self._received.discard(rid)

    def was_received(self, rid: int) -> bool:
        """Whether the agent acknowledged the request (read it, so it may have run). Asked once a
        call failed; a request never acknowledged never ran and is safe to send again."""
        with self._lock:
            received = rid in self._received
            self._received.discard(rid)
            return received

    def close(self) -> None:
        self._fail(OpenAgentsError(ErrorType.AGENT_LOST, "the sandbox was closed"))
        self._stream.close()

    def _fail(self, err: OpenAgentsError) -> None:
        with self._lock:
            if self.broken is None:
                self.broken = err.detached()  # kept: not the one raised in the reader, whose frame holds this channel
            pending, self._pending = self._pending, {}
            self._listeners = {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self.broken)  # never raised itself: wait() raises a copy

    def _read_loop(self) -> None:
        pending_line = bytearray()
        try:
            while True:
                chunk = self._stream.recv(1 << 20)
                if not chunk:
                    raise OpenAgentsError(ErrorType.AGENT_LOST, "the agent exited" + self._stderr_hint())
                pending_line += chunk
                del chunk  # not held while the next recv waits: up to 1 MiB per idle box
                consumed = False
                while (newline := pending_line.find(b"\n")) >= 0:
                    if newline > MAX_LINE_BYTES:
                        break  # refused below, as a line still unfinished would be
                    line = bytes(pending_line[:newline])
                    del pending_line[: newline + 1]
                    consumed = True
                    if line.strip():
                        self._dispatch(line)
                if consumed:  # keep the unfinished rest, not the capacity a large read left behind
                    pending_line = bytearray(pending_line)
                if len(pending_line) > MAX_LINE_BYTES:
                    raise OpenAgentsError(
                        ErrorType.PROTOCOL_ERROR, f"the agent sent a line over {MAX_LINE_BYTES} bytes"
                    )
        except OpenAgentsError as err:
            self._fail(err)
        except OSError as err:
            self._fail(OpenAgentsError(ErrorType.AGENT_LOST, f"the connection to the agent broke: {err}"))

    def _dispatch(self, line: bytes) -> None:
        try:
            message = jsonbound.loads(line)
            if isinstance(message, dict) and message.get("ack") is True and type(message.get("id")) is int:
                with self._lock:
                    if message["id"] in self._pending:
                        self._received.add(message["id"])
                return
            if isinstance(message, dict) and "chunk" in message and type(message.get("id")) is int:
                self._chunk(message["id"], message["chunk"])
                return
            response = AgentResponse.model_validate(message)
        except (ValueError, ValidationError):
            raise OpenAgentsError(
                ErrorType.PROTOCOL_ERROR, f"the agent sent something that is not a response: {line[:120]!r}"
            ) from None
        if response.id is None:
            # The agent could not parse one of our requests: a bug on our side or a hostile agent.
            raise OpenAgentsError(
                ErrorType.PROTOCOL_ERROR,
                f"the agent rejected a request: {response.error.message if response.error else '?'}",
            )
        with self._lock:
            future = self._pending.pop(response.id, None)
            self._received.discard(response.id)
            self._listeners.pop(response.id, None)
            late = future is None and response.id in self._forgotten
            self._forgotten.discard(response.id)
        if future is None:
            if late:
                return  # the call passed its deadline and was given up on: its answer no longer counts
            raise OpenAgentsError(
                ErrorType.PROTOCOL_ERROR,
                f"the sandbox answered a call it was not asked (id {response.id}), or one "
                "already answered: a forged answer, so the sandbox is replaced",
            )
        if not future.done():
            future.set_result(response)

    def _chunk(self, rid: int, text: Any) -> None:
        """Streamed output for a call that asked for it; anything else is a protocol error. The text is
        the box's: bounded here, shown only through render.visible() by whoever listens."""
        if not isinstance(text, str):
            raise OpenAgentsError(ErrorType.PROTOCOL_ERROR, "the agent sent an output chunk that is not text")
        with self._lock:
            listener = self._listeners.get(rid)
        if listener is None:
            return  # a call that did not ask, or one already answered or forgotten: dropped
        try:
            listener(text[-MAX_CHUNK_CHARS:])
        except Exception:  # noqa: BLE001 - a front-end's failure must not break the channel
            pass

    def _stderr_hint(self) -> str:
        tail = self._stream.stderr_tail().decode("utf-8", errors="replace").strip().splitlines()[-3:]
        return f" (stderr: {' | '.join(tail)})" if tail else ""
