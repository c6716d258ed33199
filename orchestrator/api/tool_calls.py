"""The six tools as typed methods of a sandbox (`Sandbox.read_file` ... `Sandbox.shell`), and `call`
for any tool by name: each makes one call through the session's pipeline (`_checked`, the Sandbox's)
and lifts the typed result out of it (results.py). The arguments are validated once, by the pipeline
against the tool's declaration (tools/argbase.py validate_model: ToolError(INVALID_ARGUMENTS) naming
the tool, the argument and the type given, before anything reaches the box). What is checked here is
only what these methods make of their own parameters before the call: a path's form (names.py), a
`cwd` and `env` folded into the command (`placed`), a callback."""

from __future__ import annotations

from os import PathLike
from typing import Any, Callable

from ..errors import ErrorType
from ..protocol import ToolResult
from ..tools.defs import edit_file as edit_def
from ..tools.defs import grep_files as grep_def
from ..tools.defs import list_files as list_def
from ..tools.defs import read_file as read_def
from ..tools.defs import shell as shell_def
from ..tools.defs import write_file as write_def
from .environment import checked, command_with
from .names import read_path, write_path
from .results import EditResult, GrepResult, ListResult, ReadResult, ShellResult, ToolError, WriteResult

# the tools' names come from their own homes (tools/defs/), as everywhere else
READ, LIST, GREP = read_def.TOOL.name, list_def.TOOL.name, grep_def.TOOL.name
WRITE, EDIT, SHELL = write_def.TOOL.name, edit_def.TOOL.name, shell_def.TOOL.name


def require(tool: str, name: str, value: Any, kinds: type | tuple[type, ...], what: str) -> None:
    """A parameter a method uses itself before the call (not one the pipeline sees as given)."""
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{tool}: {name} must be {what}, not a bool")
    if not isinstance(value, kinds):
        raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{tool}: {name} must be {what}, not {type(value).__name__}")


def placed(
    tool: str,
    command: str,
    cwd: str | PathLike[str] | None,
    env: dict[str, str] | None,
    passed_env: Callable[[dict[str, str]], dict[str, str]],
    method: str | None = None,
) -> str:
    """`command` as the box runs it with `cwd` and `env` (shell() and start() take them alike): the
    command itself when neither is given. `method`: the API method an empty cwd is named by."""
    if cwd is None and not env:
        return command  # the pipeline validates it as the tool's argument
    require(tool, "command", command, str, "a str")  # folded into another command: checked before
    place = None
    if cwd is not None:
        place = cwd.__fspath__() if isinstance(cwd, PathLike) else cwd
        require(tool, "cwd", place, str, "a str (a directory in the box)")
        if not place or "\0" in place:
            raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{method or tool}: cwd must be a non-empty path without NUL")
    return command_with(command, place, passed_env(checked(tool, env or {})))


def tool_error(result: ToolResult) -> ToolError:
    error = result.error
    kind, message = (error.type, error.message) if error is not None else (ErrorType.INTERNAL_ERROR, "the call failed")
    return ToolError(kind, message, result)


class ToolMethods:
    """The typed tool methods; the class using it provides `_call` (one call through the pipeline)."""

    def _call(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        on_output: Callable[[str], None] | None,
        call_id: str | None = None,
    ) -> tuple[str, ToolResult]:
        raise NotImplementedError

    def _passed_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` as it may enter the box (the sandbox screens it and has its secrets redacted)."""
        raise NotImplementedError

    def call(
        self, tool: str, arguments: dict[str, Any] | None = None, on_output: Callable[[str], None] | None = None
    ) -> ToolResult:
        """One call of any tool by name, through the pipeline; never raises for a tool's failure or
        a refusal (the typed result says it), only for a closed sandbox."""
        return self._call(tool, arguments, on_output)[1]

    def _checked(
        self, tool: str, arguments: dict[str, Any], on_output: Callable[[str], None] | None = None
    ) -> tuple[str, ToolResult]:
        call_id, result = self._call(tool, arguments, on_output)
        if not result.ok:
            raise tool_error(result)
        return call_id, result

    def read_file(
        self, path: str | bytes | PathLike[str] | PathLike[bytes], offset: int = 1, limit: int | None = None
    ) -> ReadResult:
        """Lines `offset`.. (1-based) of a file, at most `limit` lines and 48 KiB. `path` as
        list_files' entries give it (any name: names.read_path)."""
        rel, name = read_path(READ, path)
        args: dict[str, Any] = {"path": name, "offset": offset}
        if limit is not None:
            args["limit"] = limit
        return ReadResult.of(*self._checked(READ, args), rel)

    def list_files(
        self, path: str | bytes | PathLike[str] | PathLike[bytes] = ".", recursive: bool = True
    ) -> ListResult:
        """At most 500 entries; .git, node_modules, target, dist skipped."""
        rel, name = read_path(LIST, path)
        return ListResult.of(*self._checked(LIST, {"path": name, "recursive": recursive}), rel)

    def grep_files(
        self,
        pattern: str,
        path: str | bytes | PathLike[str] | PathLike[bytes] = ".",
        glob: str | None = None,
        ignore_case: bool = False,
    ) -> GrepResult:
        """Lines matching a Python regular expression, at most 200."""
        _, name = read_path(GREP, path)
        args: dict[str, Any] = {"pattern": pattern, "path": name, "ignore_case": ignore_case}
        if glob is not None:
            args["glob"] = glob
        return GrepResult.of(*self._checked(GREP, args), pattern)

    def write_file(self, path: str | PathLike[str], content: str) -> WriteResult:
        """The whole new content of a file (never inside .git)."""
        rel = write_path(WRITE, path)
        return WriteResult.of(*self._checked(WRITE, {"path": rel, "content": content}), rel)

    def edit_file(
        self,
        path: str | PathLike[str],
        old_text: str,
        new_text: str,
        allow_multiple: bool = False,
        expected_sha256: str | None = None,
    ) -> EditResult:
        """Replace the exact `old_text` (unique unless allow_multiple); `expected_sha256` (from read_file)
        refuses the edit if the file changed since."""
        rel = write_path(EDIT, path)
        args: dict[str, Any] = {
            "path": rel,
            "old_text": old_text,
            "new_text": new_text,
            "allow_multiple": allow_multiple,
        }
        if expected_sha256 is not None:
            args["expected_sha256"] = expected_sha256
        return EditResult.of(*self._checked(EDIT, args), rel)

    def shell(
        self,
        command: str,
        timeout: int = 60,
        on_output: Callable[[str], None] | None = None,
        *,
        cwd: str | PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> ShellResult:
        """`/bin/sh -c command` in the workspace (or `cwd`: relative to it, or absolute), no stdin;
        `timeout` seconds (at most 240, kept by the host too). `env`: variables for this command only
        (any name; secret-looking values redacted in the transcript; a model key or an egress
        credential's variable never passed: environment.py). `on_output(text)` gets the output as it
        comes. A non-zero exit is a result; a timeout raises ToolError(TIMEOUT) with the partial
        output in `.result`."""
        if on_output is not None and not callable(on_output):
            raise ToolError(ErrorType.INVALID_ARGUMENTS, "shell: on_output must be callable")
        sent = placed(SHELL, command, cwd, env, self._passed_env)
        return ShellResult.of(*self._checked(SHELL, {"command": sent, "timeout": timeout}, on_output), command)
