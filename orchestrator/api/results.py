"""The API's results as typed values, and its one exception.

Each tool's result keeps the call's whole `ToolResult` (`.result`) and lifts what the tool's own
metadata says into fields. Everything in them came from the box: it is bounded by the agent and
the host (protocol.py), never escaped here; a program printing it to a terminal escapes it
itself (`orchestrator.ground.text.visible`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_agent.limits import GREP_MAX_LINES, LIST_MAX_ENTRIES
from sandbox_agent.names import from_arg

from ..errors import ErrorType, OpenAgentsError
from ..protocol import ToolResult
from ..workspace.review import ApplyReport


class ToolError(OpenAgentsError):
    """A tool call that failed or was refused: `.type` (an ErrorType) says which; `.result` is the
    whole typed result (a timed-out command's partial output is in `.result.output`)."""

    def __init__(self, type: ErrorType, message: str, result: ToolResult | None = None) -> None:
        super().__init__(type, message)
        self.result = result if result is not None else ToolResult.failure(OpenAgentsError(type, message))

    @property
    def output(self) -> str:
        return self.result.output


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True)

    call_id: str
    output: str = ""  # the tool's text, as the model would read it
    note: str = ""  # the agent's and the host's notes (truncation, skipped entries)
    result: ToolResult


def _meta(result: ToolResult, key: str, kind: type, default: Any = None) -> Any:
    value = result.meta.get(key, default)
    if kind is int and isinstance(value, bool):
        return default
    return value if isinstance(value, kind) else default


class ReadResult(_Result):
    path: str
    text: str  # the lines read (output): offset and limit in lines, capped at 48 KiB
    sha256: str | None = None  # of the whole file: pass it to edit_file as expected_sha256
    total_lines: int | None = None
    first_line: int | None = None
    last_line: int | None = None
    truncated: bool = False
    binary: bool = False  # not text (or not UTF-8): `text` is empty, `output` says so, the note how to look

    @classmethod
    def of(cls, call_id: str, r: ToolResult, path: str) -> "ReadResult":
        binary = _meta(r, "binary", bool, False)
        note = r.note
        if binary:  # the program has a way to its exact bytes, which a model has not
            note = (note + " " if note else "") + f"[its exact bytes: Sandbox.read_bytes({path!r})]"
        return cls(
            call_id=call_id,
            output=r.output,
            note=note,
            result=r,
            path=path,
            text="" if binary else r.output,
            binary=binary,
            sha256=_meta(r, "sha256", str),
            total_lines=_meta(r, "total_lines", int),
            first_line=_meta(r, "first_line", int),
            last_line=_meta(r, "last_line", int),
            truncated=_meta(r, "truncated", bool, False),
        )


def _name(value: Any) -> str | None:
    """A name the agent gave in its exact form (sandbox_agent/names.py), as an os.fsdecode string
    (lone surrogates for bytes that are not UTF-8, as os.listdir gives them); None if it is not one."""
    try:
        return from_arg(value)
    except ValueError:
        return None


class ListResult(_Result):
    """`entries` are the agent's structured names (its meta's `names`), never the text split again:
    a name holding a newline or a tab is one entry, exact, and one whose bytes are not UTF-8 is an
    os.fsdecode string (lone surrogates) that read_file, list_files and grep_files take back."""

    path: str
    entries: list[str] = Field(default_factory=list)  # relative to the workspace; a directory ends with /
    truncated: bool = False  # at most 500 entries

    @classmethod
    def of(cls, call_id: str, r: ToolResult, path: str) -> "ListResult":
        names = _meta(r, "names", list, [])[:LIST_MAX_ENTRIES]
        entries = [name for name in map(_name, names) if name is not None]
        return cls(
            call_id=call_id,
            output=r.output,
            note=r.note,
            result=r,
            path=path,
            entries=entries,
            truncated=_meta(r, "truncated", bool, False),
        )


class GrepMatch(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str  # exact, as ListResult's entries
    line: int
    text: str


class GrepResult(_Result):
    """`matches` are the agent's structured hits (its meta's `hits`), never the text split again."""

    pattern: str
    matches: list[GrepMatch] = Field(default_factory=list)  # at most 200
    truncated: bool = False

    @classmethod
    def of(cls, call_id: str, r: ToolResult, pattern: str) -> "GrepResult":
        found = []
        for hit in _meta(r, "hits", list, [])[:GREP_MAX_LINES]:
            path = _name(hit.get("path")) if isinstance(hit, dict) else None
            line, text = (hit.get("line"), hit.get("text")) if isinstance(hit, dict) else (None, None)
            if path is not None and type(line) is int and isinstance(text, str):
                found.append(GrepMatch(path=path, line=line, text=text))
        return cls(
            call_id=call_id,
            output=r.output,
            note=r.note,
            result=r,
            pattern=pattern,
            matches=found,
            truncated=_meta(r, "truncated", bool, False),
        )


class WriteResult(_Result):
    path: str
    sha256: str | None = None
    bytes: int | None = None
    created: bool = False

    @classmethod
    def of(cls, call_id: str, r: ToolResult, path: str) -> "WriteResult":
        return cls(
            call_id=call_id,
            output=r.output,
            note=r.note,
            result=r,
            path=path,
            sha256=_meta(r, "sha256", str),
            bytes=_meta(r, "bytes", int),
            created=_meta(r, "created", bool, False),
        )


class TreeResult(BaseModel):
    """A directory tree moved by upload() or download(): the files written, their bytes, and what was
    left out (links, devices, FIFOs: only directories and regular files move), by name."""

    model_config = ConfigDict(frozen=True)

    path: str
    files: int
    bytes: int
    skipped: list[str] = Field(default_factory=list)


class EditResult(_Result):
    path: str
    sha256: str | None = None
    replacements: int = 0
    diff: str | None = None

    @classmethod
    def of(cls, call_id: str, r: ToolResult, path: str) -> "EditResult":
        return cls(
            call_id=call_id,
            output=r.output,
            note=r.note,
            result=r,
            path=path,
            sha256=_meta(r, "sha256", str),
            replacements=_meta(r, "replacements", int, 0),
            diff=r.diff,
        )


class ShellResult(_Result):
    """A command that ran: a non-zero exit is a result, not an error. A timeout raises ToolError
    (type TIMEOUT) with the partial output in its result."""

    command: str
    exit_code: int | None = None
    timed_out: bool = False
    timeout_s: float | None = None
    elapsed_s: float | None = None
    output_truncated: bool = False  # head and tail kept

    @classmethod
    def of(cls, call_id: str, r: ToolResult, command: str) -> "ShellResult":
        timeout = _meta(r, "timeout_s", (int, float))  # type: ignore[arg-type]
        elapsed = _meta(r, "elapsed_s", (int, float))  # type: ignore[arg-type]
        return cls(
            call_id=call_id,
            output=r.output,
            note=r.note,
            result=r,
            command=command,
            exit_code=_meta(r, "exit_code", int),
            timed_out=_meta(r, "timed_out", bool, False),
            timeout_s=float(timeout) if timeout is not None else None,
            elapsed_s=float(elapsed) if elapsed is not None else None,
            output_truncated=_meta(r, "output_truncated", bool, False),
        )


class ChangedFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str  # shown form: valid text, whatever bytes the box put in the name
    status: str  # added | modified | deleted | type_changed ...


class Changes(BaseModel):
    """A copy session's changes against the real workspace: the unified diff, and the stat."""

    model_config = ConfigDict(frozen=True)

    files: list[ChangedFile] = Field(default_factory=list)
    diff: str = ""
    stat: str = ""

    def __bool__(self) -> bool:
        return bool(self.files)


class ApplyResult(BaseModel):
    """What landing the copy did. Any conflict: nothing was applied (`ok` false)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    applied: list[str] = Field(default_factory=list)
    left_out: list[dict[str, str]] = Field(default_factory=list)  # path, reason: what the sanitiser does not carry
    conflicts: list[dict[str, str]] = Field(
        default_factory=list
    )  # path, reason: changed in the real workspace since the copy
    already: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, report: ApplyReport) -> "ApplyResult":
        from ..workspace.review import shown

        return cls(
            ok=not report.conflicts,
            applied=[shown(p) for p in report.applied],
            left_out=[{"path": shown(lo.path), "reason": lo.reason} for lo in report.left_out],
            conflicts=[{"path": shown(c.path), "reason": c.reason} for c in report.conflicts],
            already=[shown(p) for p in report.already],
        )
