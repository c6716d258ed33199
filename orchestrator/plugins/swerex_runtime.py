"""SWE-ReX's runtime on our box: `OpenAgentsRuntime` implements `swerex.runtime.abstract.AbstractRuntime`
over an `AsyncSandbox`, so every command, session call, read, write and upload is a `shell`,
`read_file` or `write_file` call of the public API (call pipeline, policy ladder, transcript).

- `execute(Command)` runs like `subprocess.run` (argv, or `/bin/sh -c` with `shell=True`; `env`
  over the box's own environment; `cwd`; stdout and stderr apart or merged) through the plug-ins'
  box program (box_script.py), with its tree kill at the timeout;
- `create_session`/`run_in_session`/`close_session`: a bash session emulated call by call
  (swerex_session.py): cwd, variables, functions and shopts carry over; interactive programs and
  `expect` do not (InteractiveUnsupportedError);
- `read_file`/`write_file`/`upload`: the box program's bounded reads and writes.

Timeouts are the box's: a command ends at 240 s (`execute` 235 s) whatever SWE-ReX asks; `None`
("no timeout") means that limit. Errors are SWE-ReX's own (CommandTimeoutError,
NonZeroExitCodeError, BashIncorrectSyntaxError, SessionExistsError, SessionDoesNotExistError,
NoExitCodeError) and Python's for files (FileNotFoundError, PermissionError, IsADirectoryError), plus
the typed ones below, all `SwerexException`s.
"""

from __future__ import annotations

import logging
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NoExitCodeError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
    SwerexException,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionRequest,
    CloseBashSessionResponse,
    CloseResponse,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
    IsAliveResponse,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from .. import AsyncSandbox, ErrorType, OpenAgentsError, ShellResult, ToolError
from ..boxfs import BoxDir
from ..ground.text import visible
from .swerex_session import SYNTAX_MARK, new_state_path, session_command
from .transport import STAGE, BoxFailure, BoxProgram, clamp_timeout, os_error

MAX_SESSION_TIMEOUT_S = 240  # the shell tool's limit, kept by the host
MAX_OUTPUT_BYTES = 16 * 1024 * 1024  # per stream of an execute(), and per read_file: box-written data the host takes
MAX_UPLOAD_FILES = 5000
MAX_UPLOAD_BYTES = 256 * 1024 * 1024
_ANSI = re.compile(r"\x1B[@-_][0-?]*[ -/]*[@-~]")  # what SWE-ReX's own BashSession strips from output
_REFUSED = (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER)


class OpenAgentsRuntimeError(SwerexException, RuntimeError):
    """A call the box could not do; `.type` is the sandbox's ErrorType (docs/api.md, errors)."""

    def __init__(self, type: ErrorType, message: str) -> None:
        super().__init__(message)
        self.type = type


class PolicyRefusedError(OpenAgentsRuntimeError, PermissionError):
    """The sandbox's policy (or its approver) refused the call; nothing ran."""


class SandboxClosedError(OpenAgentsRuntimeError):
    """A call after the deployment stopped."""


class InteractiveUnsupportedError(OpenAgentsRuntimeError, NotImplementedError):
    """An interactive program (`is_interactive_command`/`_quit`, `expect`): every call of a session
    is its own process that ends before the call returns, so nothing waits at a prompt."""


class OutputLimitError(OpenAgentsRuntimeError):
    """A stream, file or upload over the host's bound (MAX_OUTPUT_BYTES, MAX_UPLOAD_*)."""


def _translate(err: OpenAgentsError) -> Exception:
    if err.type in _REFUSED:
        return PolicyRefusedError(err.type, f"refused by the sandbox's policy: {err.message}")
    if err.type is ErrorType.SANDBOX_CLOSED:
        return SandboxClosedError(err.type, err.message)
    return OpenAgentsRuntimeError(err.type, err.message)


def _file_error(err: BoxFailure, path: str) -> Exception:
    error = os_error(err, path)
    if error is not None:
        return error
    if err.kind == "limit":
        return OutputLimitError(
            ErrorType.FILE_TOO_LARGE, f"{path}: over the host's bound of {MAX_OUTPUT_BYTES} bytes ({err.message})"
        )
    return OSError(f"{path}: {err.message}")


def _seconds(timeout: float | None, limit: int) -> int:
    return limit if timeout is None else max(1, min(math.ceil(timeout), limit))


class OpenAgentsRuntime(AbstractRuntime):
    """The runtime of an `OpenAgentsDeployment` (or of any open `AsyncSandbox`)."""

    def __init__(self, box: AsyncSandbox, *, logger: logging.Logger | None = None) -> None:
        self.box = box
        self.program = BoxProgram(box)
        self.sessions: dict[str, str] = {}  # SWE-ReX's session name -> the box's state file
        self.logger = logger or logging.getLogger("rex-runtime.openagents")

    async def _program(self, request: dict[str, Any], timeout_s: int) -> dict[str, Any]:
        try:
            return await self.program.run(request, timeout_s)
        except TimeoutError:
            raise CommandTimeoutError(f"Timeout ({timeout_s}s) exceeded while running command") from None
        except OpenAgentsError as err:
            raise _translate(err) from None

    # -- liveness ----------------------------------------------------------------------------------
    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self.box.closed:
            return IsAliveResponse(is_alive=False, message="the sandbox is closed")
        try:
            result = await self.box.shell("true", timeout=_seconds(timeout, 30))
        except OpenAgentsError as err:
            return IsAliveResponse(is_alive=False, message=f"{err.type.value}: {visible(err.message)}")
        return IsAliveResponse(
            is_alive=result.exit_code == 0, message="" if result.exit_code == 0 else "the box did not answer"
        )

    # -- sessions ----------------------------------------------------------------------------------
    async def create_session(self, request: CreateBashSessionRequest) -> CreateBashSessionResponse:
        if request.session in self.sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        if self.box.closed:
            raise SandboxClosedError(ErrorType.SANDBOX_CLOSED, "the sandbox is closed")
        self.sessions[request.session] = new_state_path()
        output = ""
        if request.startup_source:
            sources = "\n".join(f"source {path}" for path in request.startup_source)
            action = BashAction(
                command=sources, session=request.session, timeout=max(request.startup_timeout, 10), check="silent"
            )
            output = (await self.run_in_session(action)).output
        return CreateBashSessionResponse(output=output)

    async def run_in_session(self, action: BashAction | BashInterruptAction) -> BashObservation:
        if self.box.closed:
            raise SandboxClosedError(ErrorType.SANDBOX_CLOSED, "the sandbox is closed (the deployment stopped)")
        if action.session not in self.sessions:
            raise SessionDoesNotExistError(f"session {action.session!r} does not exist")
        if isinstance(action, BashInterruptAction):
            # nothing outlives a call: a command that timed out was killed with all it started
            return BashObservation(output="", exit_code=0)
        if action.is_interactive_command or action.is_interactive_quit or action.expect:
            raise InteractiveUnsupportedError(
                ErrorType.INVALID_ARGUMENTS,
                "interactive commands and expect patterns are not supported: "
                "each call of an openagents session runs to its end (docs/api.md, SWE-ReX)",
            )
        seconds = _seconds(action.timeout, MAX_SESSION_TIMEOUT_S)
        result = await self._shell(
            session_command(action.command, self.sessions[action.session]), seconds, action.command
        )
        output = visible(_ANSI.sub("", result.output))
        lines = output.rstrip("\n").rsplit("\n", 1)
        if result.exit_code == 2 and lines[-1] == SYNTAX_MARK:
            text = lines[0] if len(lines) == 2 else ""
            raise BashIncorrectSyntaxError(
                f"Error (exit code 2) while checking bash command \n{action.command!r}\n---- Stderr ----\n{text}",
                extra_info={"bash_stdout": "", "bash_stderr": text},
            )
        if action.check == "ignore":
            return BashObservation(output=output, exit_code=None)
        if result.exit_code is None and action.check == "raise":
            raise NoExitCodeError(f"no exit code for command {action.command!r}")
        if action.check == "raise" and result.exit_code != 0:
            message = (
                f"Command {action.command!r} failed with exit code {result.exit_code}. Here is the output:\n{output!r}"
            )
            raise NonZeroExitCodeError(f"{action.error_msg}: {message}" if action.error_msg else message)
        return BashObservation(output=output, exit_code=result.exit_code)

    async def _shell(self, command: str, seconds: int, shown: str) -> ShellResult:
        try:
            return await self.box.shell(command, timeout=seconds)
        except ToolError as err:
            if err.type is ErrorType.TIMEOUT:
                partial = visible(_ANSI.sub("", err.output))[-2000:]
                raise CommandTimeoutError(
                    f"timeout after {seconds} seconds while running command {shown!r} "
                    f"(killed with everything it started; the session's state is the one before it). "
                    f"Output so far:\n{partial}"
                ) from None
            raise _translate(err) from None
        except OpenAgentsError as err:
            raise _translate(err) from None

    async def close_session(self, request: CloseBashSessionRequest) -> CloseBashSessionResponse:
        state = self.sessions.pop(request.session, None)
        if state is None:
            raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
        if not self.box.closed:
            await self._shell(f"rm -f -- {state} {state}.new", 10, "close_session")
        return CloseBashSessionResponse()

    # -- one command ----------------------------------------------------------------------------
    async def execute(self, command: Command) -> CommandResponse:
        argv: list[str]
        if command.shell:
            argv = (
                ["/bin/sh", "-c", command.command]
                if isinstance(command.command, str)
                else ["/bin/sh", "-c", *command.command]
            )
        else:
            argv = [command.command] if isinstance(command.command, str) else list(command.command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise OpenAgentsRuntimeError(ErrorType.INVALID_ARGUMENTS, "execute: an empty command")
        seconds = clamp_timeout(command.timeout)
        request = {
            "op": "exec",
            "cmd": argv,
            "cwd": command.cwd,
            "env": dict(command.env or {}),
            "timeout": seconds,
            "limit": MAX_OUTPUT_BYTES,
            "merge": command.merge_output_streams,
        }
        try:
            answer = await self._program(request, seconds)
            stdout = await self.program.fetch(answer.get("stdout"), MAX_OUTPUT_BYTES)
            stderr = await self.program.fetch(answer.get("stderr"), MAX_OUTPUT_BYTES)
        except BoxFailure as err:
            raise _file_error(err, argv[0]) from None
        except OpenAgentsError as err:
            raise _translate(err) from None
        response = CommandResponse(
            stdout=stdout.decode(errors="backslashreplace"),
            stderr=stderr.decode(errors="backslashreplace"),
            exit_code=answer.get("rc") if isinstance(answer.get("rc"), int) else None,
        )
        if answer.get("timed_out") is True:
            raise CommandTimeoutError(
                f"Timeout ({seconds}s) exceeded while running command (killed with everything it started)"
            )
        if command.check and response.exit_code != 0:
            message = (
                f"Command {command.command!r} failed with exit code {response.exit_code}. "
                f"Stdout:\n{visible(response.stdout[-2000:])!r}\nStderr:\n{visible(response.stderr[-2000:])!r}"
            )
            raise NonZeroExitCodeError(f"{command.error_msg}: {message}" if command.error_msg else message)
        return response

    # -- files ---------------------------------------------------------------------------------------
    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        data = await self._read(request.path)
        return ReadFileResponse(content=data.decode(request.encoding or "utf-8", request.errors or "strict"))

    async def _read(self, path: str) -> bytes:
        try:
            answer = await self._program({"op": "read", "path": path, "limit": MAX_OUTPUT_BYTES}, 60)
            return await self.program.fetch(answer.get("data"), MAX_OUTPUT_BYTES)
        except BoxFailure as err:
            raise _file_error(err, path) from None
        except OpenAgentsError as err:
            raise _translate(err) from None

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        await self._write(request.path, request.content.encode("utf-8"), None)
        return WriteFileResponse()

    async def _write(self, path: str, data: bytes, mode: int | None) -> None:
        try:
            request: dict[str, Any] = {"op": "write", "path": path, "data": await self.program.stage(data)}
            if mode is not None:
                request["mode"] = mode
            await self._program(request, 60)
        except BoxFailure as err:
            raise _file_error(err, path) from None
        except OpenAgentsError as err:
            raise _translate(err) from None

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """A host file or directory (the caller's data) into the box, file by file through the
        tools, modes kept; checked against the bounds before anything is written."""
        source = Path(request.source_path)
        files, dirs = _walk(source)
        target = request.target_path.rstrip("/") or "/"
        if dirs is not None:
            made = [target] + [f"{target}/{rel}" for rel in dirs]
            await self.execute(Command(command=["mkdir", "-p", "--", *made], check=True, timeout=60))
        for rel, data, mode in files:
            await self._write(f"{target}/{rel}" if rel else target, data, mode)
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Forget the sessions and remove the transport's staging directory if it is empty (so a
        copy session's review shows only what the harness changed); the deployment removes the box."""
        self.sessions.clear()
        if not self.box.closed:
            try:
                await self.box.shell(f"rmdir -- {STAGE} 2>/dev/null; true", timeout=10)
            except OpenAgentsError:  # refused by a policy, or the box went: nothing to tidy
                pass
        return CloseResponse()


def _walk(source: Path) -> tuple[list[tuple[str, bytes, int]], list[str] | None]:
    """(files as (relative name, content, mode), directories or None for a single file), bounded.
    The path the caller names is the caller's; what is below it is read through boxfs like any
    tree that may hold box-written data (it may be a workspace): no link is followed (a symlinked
    file or directory is left out), only regular files are read, names as the tree has them."""
    if not source.exists():
        raise FileNotFoundError(2, "No such file or directory", str(source))
    if not source.is_dir():
        _bound(1, source.stat().st_size)
        return [("", source.read_bytes(), stat.S_IMODE(source.stat().st_mode))], None
    files: list[tuple[str, bytes, int]] = []
    dirs: list[str] = []
    total = 0
    with BoxDir.open(source) as tree:
        for entry in tree.walk(sort=True).entries():
            if entry.is_dir:
                dirs.append(os.fsdecode(entry.rel))
            elif stat.S_ISREG(entry.st.st_mode):
                _bound(len(files) + len(dirs) + 1, total + entry.st.st_size)
                data, st = BoxDir.at(entry.dir_fd).read(entry.name, MAX_UPLOAD_BYTES - total + 1)
                total += len(data)
                _bound(len(files) + len(dirs) + 1, total)
                files.append((os.fsdecode(entry.rel), data, stat.S_IMODE(st.st_mode)))
            _bound(len(files) + len(dirs), total)
    return files, dirs


def _bound(entries: int, size: int) -> None:
    if entries > MAX_UPLOAD_FILES or size > MAX_UPLOAD_BYTES:
        raise OutputLimitError(
            ErrorType.FILE_TOO_LARGE,
            f"upload over the bound of {MAX_UPLOAD_FILES} entries or "
            f"{MAX_UPLOAD_BYTES // (1024 * 1024)} MiB: nothing was written",
        )
