"""grep_files: lines of workspace files matching a regular expression (docs/tools.md#grep_files)."""

from __future__ import annotations

from pydantic import Field

from sandbox_agent import limits

from ..argbase import ReadPath, ReadPathArgs
from ..tooldef import J_BOOL, J_INT, J_NAME, J_STR, FileUse, McpFace, ToolDef


class GrepFilesArgs(ReadPathArgs):
    pattern: str = Field(min_length=1, max_length=2000, description="Python regular expression.")
    path: ReadPath = Field(default=".", description="File or directory to search.")
    glob: str | None = Field(default=None, max_length=512, description="Only files whose name matches, e.g. '*.py'.")
    ignore_case: bool = False


TOOL = ToolDef(
    "grep_files",
    "search",
    "sandbox",
    GrepFilesArgs,
    order=30,
    title="Search workspace files",
    description="Search file contents with a regular expression; returns "
    f"path:line:text, at most {limits.GREP_MAX_LINES} matching lines.",
    bounds={
        "max_lines": limits.GREP_MAX_LINES,
        "line_chars": limits.GREP_LINE_CHARS,
        "max_line_bytes": limits.GREP_MAX_LINE_BYTES,
        "timeout_s": limits.GREP_TIMEOUT_S,
    },
    files=FileUse(path_arg=True, path_may_be_directory=True),
    mcp=McpFace(
        served=True,
        idempotent=True,
        output_doc="The matches, one `path:line: text` a line.",
        result_meta={
            "matches": J_INT,
            "truncated": J_BOOL,
            "timed_out": J_BOOL,
            "unreadable": {"type": "array"},
            "hits": {
                "type": "array",
                "description": "The matches, structured: the file's name exact (as list_files' names), "
                "the line's number and text.",
                "items": {
                    "type": "object",
                    "properties": {"path": J_NAME, "line": J_INT, "text": J_STR},
                    "required": ["path", "line", "text"],
                },
            },
        },
    ),
)
