"""Host side of the plug-ins' box program (box_script.py): one request, through the public API
only (`shell`, `read_bytes`, `write_bytes` of an AsyncSandbox), so every exec, read and write of a
harness meets the call pipeline, the policy ladder and the transcript.

Everything that comes back is the box's: the answer line is bounded by the shell tool (48 KiB),
parsed with a depth bound, checked field by field; staged payloads are read one bounded line at a
time, strictly base64, and never past the size the host allows; a raw one (the bytes API's) is
read in bounded pieces, at most the size the host allows."""

from __future__ import annotations

import base64
import binascii
import json
import shlex
import uuid
from dataclasses import dataclass
from typing import Any

from sandbox_agent.jsonbound import loads

from .. import AsyncSandbox, ErrorType, OpenAgentsError, ToolError
from ..ground.text import visible
from .box_script import SCRIPT

STAGE = ".oa-plugin"
MAX_COMMAND_TIMEOUT_S = 235  # the shell tool's hard limit is 240 s; the box program gets 5 s to answer
INLINE_BYTES = 24 * 1024  # payloads up to this go in the command line and the answer (base64: 32 KiB)
_MARK = "OA-PLUGIN-RESULT "


class BoxFailure(Exception):
    """The box program's typed answer: `kind` is not_found, permission, is_dir, limit, user, os."""

    def __init__(self, kind: str, message: str, size: int = 0) -> None:
        super().__init__(message)
        self.kind, self.message, self.size = kind, message, size


@dataclass
class Payload:
    data: bytes
    size: int


def os_error(err: BoxFailure, path: str) -> OSError | None:
    """Python's own exception for a file failure of the box program (what harnesses catch), or None
    for a failure that is not one of those (limit, user, os: each plug-in says it its own way)."""
    if err.kind == "not_found":
        return FileNotFoundError(2, f"No such file or directory: {err.message}", path)
    if err.kind == "permission":
        return PermissionError(13, f"Permission denied: {err.message}", path)
    if err.kind == "is_dir":
        return IsADirectoryError(21, f"Is a directory: {err.message}", path)
    return None


def clamp_timeout(timeout: int | float | None) -> int:
    """A harness's timeout in whole seconds, at least 1 and at most MAX_COMMAND_TIMEOUT_S."""
    if timeout is None:
        return MAX_COMMAND_TIMEOUT_S
    return max(1, min(int(timeout), MAX_COMMAND_TIMEOUT_S))


class BoxProgram:
    def __init__(self, box: AsyncSandbox) -> None:
        self.box = box

    async def stage(self, data: bytes) -> dict[str, Any]:
        """A payload for the box program: inline when small, else a file written with write_bytes."""
        if len(data) <= INLINE_BYTES:
            return {"inline": base64.b64encode(data).decode("ascii")}
        name = f"in-{uuid.uuid4().hex}"
        await self.box.write_bytes(f"{STAGE}/{name}", data)
        return {"raw": [name]}

    async def run(self, request: dict[str, Any], timeout_s: int = 30) -> dict[str, Any]:
        """Send one request; the answer as a dict (ok), or BoxFailure. A refusal or a tool failure is
        the API's ToolError; a shell timeout is TimeoutError."""
        request = {**request, "id": uuid.uuid4().hex[:16], "inline": INLINE_BYTES, "raw": True}
        encoded = base64.b64encode(json.dumps(request).encode()).decode("ascii")
        if len(encoded) > 40 * 1024:  # the shell tool takes a 64 KiB command: the request itself is staged
            name = f"req-{uuid.uuid4().hex}"
            await self.box.write_file(f"{STAGE}/{name}", encoded)
            encoded = "@" + name
        command = f"python3 -I -c {shlex.quote(SCRIPT)} {shlex.quote(encoded)}"
        try:
            result = await self.box.shell(command, timeout=min(timeout_s + 5, 240))
        except ToolError as err:
            if err.type is ErrorType.TIMEOUT:
                raise TimeoutError(f"the command did not end in {timeout_s} s (killed)") from None
            raise
        line = next((ln for ln in reversed(result.output.splitlines()) if ln.startswith(_MARK)), None)
        if line is None:
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, f"the box program gave no answer (exit {result.exit_code})")
        try:
            answer = loads(line[len(_MARK) :], max_depth=4)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's answer is not a JSON object")
        if "error" in answer:
            size = answer.get("size")
            # the box's words: bounded, and escaped (a harness prints exceptions to its terminal and logs)
            raise BoxFailure(
                str(answer["error"])[:40],
                visible(str(answer.get("message", ""))[:2000]),
                size if isinstance(size, int) else 0,
            )
        return answer

    async def fetch(self, spec: Any, limit: int) -> bytes:
        """A payload the box program sent back: inline, or staged lines read with read_file. At most
        `limit` bytes, whatever the box claims; the staged file is removed after."""
        if not isinstance(spec, dict):
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's payload is malformed")
        if "inline" in spec:
            return _decode(spec["inline"], limit)
        if "raw" in spec:
            return await self._fetch_raw(spec, limit)
        name, lines, size = spec.get("staged"), spec.get("lines"), spec.get("size")
        if (
            not isinstance(name, str)
            or not isinstance(lines, int)
            or not isinstance(size, int)
            or "/" in name
            or name.startswith(".")
        ):
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's payload is malformed")
        if size > limit or lines > (4 * limit) // (3 * 48000) + 2:
            raise BoxFailure("limit", f"{size} bytes", size)
        parts = []
        try:
            for number in range(1, lines + 1):
                read = await self.box.read_file(f"{STAGE}/{name}", offset=number, limit=1)
                parts.append(read.text.rstrip("\n"))
        finally:
            await self.box.shell(f"rm -f -- {shlex.quote(STAGE + '/' + name)}", timeout=10)
        data = _decode("".join(parts), limit)
        if len(data) != size:
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's payload does not match its size")
        return data

    async def _fetch_raw(self, spec: dict[str, Any], limit: int) -> bytes:
        name, size = spec.get("raw"), spec.get("size")
        if not isinstance(name, str) or not isinstance(size, int) or "/" in name or name.startswith(".") or not name:
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's payload is malformed")
        try:
            if size > limit:
                raise BoxFailure("limit", f"{size} bytes", size)
            try:
                data = await self.box.read_bytes(f"{STAGE}/{name}", limit=limit)
            except ToolError as err:
                if err.type is ErrorType.FILE_TOO_LARGE:
                    raise BoxFailure("limit", err.message, limit + 1) from None
                raise
        finally:
            await self.box.shell(f"rm -f -- {shlex.quote(STAGE + '/' + name)}", timeout=10)
        if len(data) != size:
            raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's payload does not match its size")
        return data


def _decode(text: Any, limit: int) -> bytes:
    if not isinstance(text, str) or len(text) > (limit // 3 + 1) * 4:
        raise BoxFailure("limit", "payload over the limit", limit + 1)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise OpenAgentsError(ErrorType.INTERNAL_ERROR, "the box program's payload is not base64") from None
