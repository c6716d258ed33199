"""Bytes in and out of the box (issue 46) as host tools of the session's registry: `read_bytes` and
`write_bytes` are calls of the session's one CallPipeline, as `rollback` is (own_calls.py): the
user's BeforeTool hooks see them, the ladder decides them (a rule `tool = "write_bytes"`, or any rule
on `kind = "edit"`), the transcript records their decision and outcome. Only the program's own calls
reach them (their ids); a model's call of either is an unknown tool.

The bytes themselves never pass through the pipeline's arguments or the transcript: a call's
arguments are the path and the size (and sha256 of what is written); its data goes between the
API method and this tool by the call's id (`Transfer`), piece by piece (sandbox_agent/transfer.py):
at most limits.BYTES_CHUNK per request to the box's agent, a file at most limits.BYTES_MAX_FILE.
Every piece read is checked: its size, the file's identity against the first piece's (a file the
box changes while it is read is a typed STALE_CONTENT, never a mix of two files).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from sandbox_agent import limits

from ..errors import ErrorType, OpenAgentsError
from ..protocol import BoxCall, Executor, ToolResult
from ..tools.catalog import READ_BYTES_TOOL, WRITE_BYTES_TOOL
from ..tools.registry import HostTools, OwnHostTools, PreparedCall
from ..tools.tooldef import Approval, BoxCaller, ToolDef

READ_BYTES, WRITE_BYTES = READ_BYTES_TOOL, WRITE_BYTES_TOOL
MAX_FILE = limits.BYTES_MAX_FILE
CHUNK = limits.BYTES_CHUNK


class ReadBytesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    path: str = Field(min_length=1)
    limit: int = Field(ge=0, le=MAX_FILE)


class WriteBytesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    path: str = Field(min_length=1)
    size: int = Field(ge=0, le=MAX_FILE)
    sha256: str = Field(min_length=64, max_length=64)


# side "sandbox": what they touch is the box's (auto_approve covers them, as it covers write_file)
READ_BYTES_DEF = ToolDef(
    READ_BYTES,
    "read",
    "sandbox",
    ReadBytesArgs,
    title="Read a file's bytes from the box",
    approval=Approval(describe=lambda args: f"read the bytes of {str(args.get('path'))[:200]}"),
)
WRITE_BYTES_DEF = ToolDef(
    WRITE_BYTES,
    "edit",
    "sandbox",
    WriteBytesArgs,
    title="Write a file's bytes into the box",
    mutates=True,
    approval=Approval(describe=lambda args: f"write {args.get('size')} bytes to {str(args.get('path'))[:200]}"),
)
SPECS = {READ_BYTES: READ_BYTES_DEF, WRITE_BYTES: WRITE_BYTES_DEF}


@dataclass
class Transfer:
    """One call's data: `source(n)` gives the next at most n bytes to write (b"" at the end); `sink`
    takes each piece read, in order. `done`: the bytes moved."""

    source: Callable[[int], bytes] | None = None
    sink: Callable[[bytes], None] | None = None
    done: int = 0
    digest: Any = field(default_factory=hashlib.sha256)


def _failure(kind: ErrorType, message: str, output: str = "") -> ToolResult:
    return ToolResult.failure(OpenAgentsError(kind, message), executor=Executor.OPENAGENTS, output=output)


class BoxFiles(OwnHostTools):
    """`read_bytes` and `write_bytes`, in front of the host tools the session had (`inner`)."""

    DECLARED = (READ_BYTES_DEF, WRITE_BYTES_DEF)  # their calls validated as any tool's (ToolDef.validate)
    LISTED = False

    def __init__(self, box: Callable[[], BoxCaller], issued: set[str], inner: HostTools | None = None) -> None:
        super().__init__(inner, issued)
        self.box = box
        self._pending: dict[str, Transfer] = {}
        self._lock = threading.Lock()

    def expect(self, call_id: str, transfer: Transfer) -> None:
        with self._lock:
            self._pending[call_id] = transfer

    def forget(self, call_id: str) -> None:
        with self._lock:
            self._pending.pop(call_id, None)

    def invoke_own(self, prepared: PreparedCall) -> ToolResult:
        with self._lock:
            transfer = self._pending.get(prepared.call.id)
        if transfer is None:
            return _failure(
                ErrorType.INVALID_ARGUMENTS,
                f"{prepared.spec.name} carries no data: call it through Sandbox.{prepared.spec.name}",
            )
        if isinstance(prepared.args, ReadBytesArgs):
            return self._read(prepared.args, transfer)
        assert isinstance(prepared.args, WriteBytesArgs)
        return self._write(prepared.args, transfer)

    def _read(self, args: ReadBytesArgs, transfer: Transfer) -> ToolResult:
        assert transfer.sink is not None
        box = self.box()
        identity: Any = None
        size = -1
        while True:
            result = box.run(BoxCall("bytes_read", {"path": args.path, "offset": transfer.done, "length": CHUNK}))
            if not result.ok:
                return result
            meta = result.meta
            piece_size, text = meta.get("size"), meta.get("data")
            if type(piece_size) is not int or not isinstance(text, str) or not 0 <= piece_size <= MAX_FILE:
                return _failure(ErrorType.PROTOCOL_ERROR, f"{args.path}: the box's answer is malformed")
            if identity is None:
                identity, size = meta.get("identity"), piece_size
                if size > args.limit:
                    return _failure(
                        ErrorType.FILE_TOO_LARGE,
                        f"{args.path} is {size} bytes; the limit asked for is {args.limit} "
                        f"(at most {MAX_FILE}: read_bytes(path, limit=...))",
                    )
            elif meta.get("identity") != identity or piece_size != size:
                return _failure(
                    ErrorType.STALE_CONTENT,
                    f"{args.path} changed while it was read (after {transfer.done} bytes): read it again",
                )
            if len(text) > (CHUNK // 3 + 1) * 4:
                return _failure(ErrorType.PROTOCOL_ERROR, f"{args.path}: the box sent a piece over {CHUNK} bytes")
            try:
                data = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                return _failure(ErrorType.PROTOCOL_ERROR, f"{args.path}: the box's piece is not base64")
            if len(data) > size - transfer.done or (not data and transfer.done < size):
                return _failure(
                    ErrorType.STALE_CONTENT,
                    f"{args.path} changed while it was read (after {transfer.done} bytes): read it again",
                )
            if data:
                transfer.sink(data)
                transfer.digest.update(data)
                transfer.done += len(data)
            if transfer.done >= size:
                break
        digest = transfer.digest.hexdigest()
        return ToolResult(
            ok=True,
            output=f"read {size} bytes of {args.path} (sha256 {digest})",
            executor=Executor.RUNTIME,
            meta={"bytes": size, "sha256": digest},
        )

    def _write(self, args: WriteBytesArgs, transfer: Transfer) -> ToolResult:
        assert transfer.source is not None
        box = self.box()
        token = uuid.uuid4().hex
        while True:
            piece = transfer.source(CHUNK)
            last = transfer.done + len(piece) >= args.size
            if len(piece) > CHUNK or transfer.done + len(piece) > args.size or (not piece and not last):
                self._abort(box, args.path, token)
                return _failure(
                    ErrorType.INVALID_ARGUMENTS, f"{args.path}: the data is not the {args.size} bytes declared"
                )
            transfer.digest.update(piece)
            request = {
                "path": args.path,
                "token": token,
                "offset": transfer.done,
                "size": args.size,
                "last": last,
                "data": base64.b64encode(piece).decode("ascii"),
            }
            if last and transfer.digest.hexdigest() != args.sha256:  # the source changed under us: nothing lands
                self._abort(box, args.path, token)
                return _failure(
                    ErrorType.STALE_CONTENT, f"{args.path}: the data changed while it was sent; nothing was written"
                )
            result = box.run(BoxCall("bytes_write", request))
            if not result.ok:
                if transfer.done:
                    self._abort(box, args.path, token)
                return result
            transfer.done += len(piece)
            quota = getattr(box, "quota", None)  # the box's write quota: polled after each piece, as after a write_file
            if quota is not None and quota.poll():
                self._abort(box, args.path, token)
                return _failure(ErrorType.WORKSPACE_QUOTA_EXCEEDED, f"{args.path}: {quota.message()}")
            if last:
                break
        created = result.meta.get("created") is True
        return ToolResult(
            ok=True,
            output=f"wrote {args.size} bytes to {args.path}",
            executor=Executor.RUNTIME,
            meta={"bytes": args.size, "sha256": args.sha256, "created": created, "atomic": True},
        )

    @staticmethod
    def _abort(box: BoxCaller, path: str, token: str) -> None:
        try:  # past the box's turns (api/turns.py): a cancelled call's part file is removed all the same
            getattr(box, "inner", box).run(BoxCall("bytes_abort", {"path": path, "token": token}))
        except OpenAgentsError:  # the box is gone: its part file went with it
            pass
