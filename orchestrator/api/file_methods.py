"""Bytes in and out of the box as methods of a sandbox (issue 46): `read_bytes`, `write_bytes`,
`upload`, `download`. Each is one call of the session's pipeline (box_files.py: decided, hooked and
recorded like every tool call), its data moved in pieces of limits.BYTES_CHUNK; a file is at most
limits.BYTES_MAX_FILE (1 GiB): a larger one is ToolError(FILE_TOO_LARGE) before anything moves.

Paths in the box are relative to the workspace, as the tools' are. A download lands through
orchestrator/boxfs (land_file): a fresh temporary file beside the destination, renamed over it (a
link there is replaced, never followed); the box's side opens regular files only, no link followed."""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from os import PathLike
from pathlib import Path
from typing import Any, Callable

from ..boxfs import HostBudget, land_file
from ..errors import ErrorType, OpenAgentsError
from ..protocol import ToolResult
from .box_files import MAX_FILE, READ_BYTES, WRITE_BYTES, BoxFiles, Transfer
from .names import write_path
from .results import ToolError, TreeResult, WriteResult
from .tool_calls import require, tool_error
from .trees import download_tree, upload_tree

LOCAL_READ = 1 << 20


def _local(tool: str, path: Any) -> Path:
    if isinstance(path, bool) or not isinstance(path, (str, PathLike)):
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS, f"{tool}: local_path must be a path on this machine, not {type(path).__name__}"
        )
    return Path(os.fsdecode(path))


def _data(tool: str, data: Any) -> memoryview:
    if isinstance(data, str):
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS, f"{tool}: data must be bytes (for text: write_file, or data.encode())"
        )
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{tool}: data must be bytes, not {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) > MAX_FILE:
        raise ToolError(
            ErrorType.FILE_TOO_LARGE,
            f"{tool}: {len(view)} bytes; a file moved into the box is at most {MAX_FILE} bytes",
        )
    return view


class FileMethods:
    """The bytes methods; the class using it provides `_call` (with a call id) and `_box_files`."""

    def _call(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        on_output: Callable[[str], None] | None,
        call_id: str | None = None,
    ) -> tuple[str, ToolResult]:
        raise NotImplementedError

    def _box_files(self) -> BoxFiles:
        raise NotImplementedError

    def _transfer(self, tool: str, arguments: dict[str, Any], transfer: Transfer) -> tuple[str, ToolResult]:
        files = self._box_files()
        call_id = f"api_{uuid.uuid4().hex[:12]}"
        files.expect(call_id, transfer)
        try:
            call_id, result = self._call(tool, arguments, None, call_id=call_id)
        finally:
            files.forget(call_id)
        if not result.ok:
            raise tool_error(result)
        return call_id, result

    def read_bytes(self, path: str | PathLike[str], *, limit: int = MAX_FILE) -> bytes:
        """The exact bytes of a workspace file (any content: binary, any encoding, a byte-order mark
        kept). A file over `limit` bytes (at most 1 GiB) is ToolError(FILE_TOO_LARGE); a link, a FIFO
        or a device is refused, typed."""
        rel = write_path(READ_BYTES, path)
        parts: list[bytes] = []
        self._transfer(READ_BYTES, {"path": rel, "limit": limit}, Transfer(sink=parts.append))
        return b"".join(parts)

    def write_bytes(self, path: str | PathLike[str], data: bytes | bytearray | memoryview) -> WriteResult:
        """Create or replace a workspace file with exactly `data` (at most 1 GiB), atomically: the
        box sees the old file or the whole new one. Parent directories are made; never under .git."""
        rel = write_path(WRITE_BYTES, path)
        view = _data(WRITE_BYTES, data)
        position = 0

        def source(n: int) -> bytes:
            nonlocal position
            piece = bytes(view[position : position + n])
            position += len(piece)
            return piece

        digest = hashlib.sha256(view).hexdigest()
        return WriteResult.of(
            *self._transfer(WRITE_BYTES, {"path": rel, "size": len(view), "sha256": digest}, Transfer(source=source)),
            rel,
        )

    def upload(self, local_path: str | PathLike[str], box_path: str | PathLike[str]) -> WriteResult | TreeResult:
        """A regular file of this machine copied into the workspace at `box_path` (as write_bytes); or
        a directory: its tree (directories and regular files; links and special files left out, by
        name in TreeResult.skipped) made under `box_path`, as one archive (at most 1 GiB)."""
        local = _local("upload", local_path)
        rel = write_path(WRITE_BYTES, box_path)
        if local.is_dir():
            return upload_tree(self, local, rel)
        try:
            handle = open(local, "rb")  # noqa: SIM115 - closed below, after the call
        except OSError as err:
            raise ToolError(_local_error(err), f"upload: {local}: {err.strerror or err}") from None
        with handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(ErrorType.NOT_REGULAR_FILE, f"upload: {local} is not a regular file")
            if st.st_size > MAX_FILE:
                raise ToolError(
                    ErrorType.FILE_TOO_LARGE,
                    f"upload: {local} is {st.st_size} bytes; a file moved into the box is at most {MAX_FILE}",
                )
            digest = hashlib.sha256()
            size = 0
            while piece := handle.read(LOCAL_READ):
                digest.update(piece)
                size += len(piece)
            handle.seek(0)
            return WriteResult.of(
                *self._transfer(
                    WRITE_BYTES, {"path": rel, "size": size, "sha256": digest.hexdigest()}, Transfer(source=handle.read)
                ),
                rel,
            )

    def download(
        self, box_path: str | PathLike[str], local_path: str | PathLike[str], *, limit: int = MAX_FILE
    ) -> WriteResult | TreeResult:
        """A workspace file copied to `local_path` on this machine (replaced atomically; a link there
        is replaced, never followed). Only a regular file comes out of the box; at most `limit` bytes.
        A directory (or `local_path` an existing directory): its tree, as one archive of at most
        `limit` bytes, landed under `local_path` (directories and regular files only; see TreeResult)."""
        rel = write_path(READ_BYTES, box_path)
        local = _local("download", local_path)
        require(READ_BYTES, "limit", limit, int, "an int (bytes)")  # the host's own budget below uses it
        if not 0 <= limit <= MAX_FILE:
            raise ToolError(ErrorType.INVALID_ARGUMENTS, f"download: limit must be 0..{MAX_FILE} bytes")
        if local.is_dir():
            return download_tree(self, rel, local, limit)
        try:
            return self._download_file(rel, local, limit)
        except ToolError as err:
            if err.type is not ErrorType.IS_DIRECTORY:  # the box's: `local` is not a directory
                raise
        return download_tree(self, rel, local, limit)

    def _download_file(self, rel: str, local: Path, limit: int) -> WriteResult:
        answer: list[tuple[str, ToolResult]] = []

        def fill(write: Callable[[bytes], None]) -> None:
            answer.append(self._transfer(READ_BYTES, {"path": rel, "limit": limit}, Transfer(sink=write)))

        try:
            land_file(local, fill, HostBudget(max_bytes=limit, max_entries=1))
        except OpenAgentsError as err:
            raise err if isinstance(err, ToolError) else ToolError(err.type, f"download: {err.message}") from None
        except OSError as err:
            raise ToolError(_local_error(err), f"download: {local}: {err.strerror or err}") from None
        call_id, result = answer[0]
        return WriteResult.of(call_id, result, str(local))


def _local_error(err: OSError) -> ErrorType:
    if isinstance(err, FileNotFoundError):
        return ErrorType.FILE_NOT_FOUND
    if isinstance(err, PermissionError):
        return ErrorType.PERMISSION_DENIED
    if isinstance(err, IsADirectoryError):
        return ErrorType.IS_DIRECTORY
    if isinstance(err, NotADirectoryError):
        return ErrorType.NOT_A_DIRECTORY
    return ErrorType.IO_ERROR
