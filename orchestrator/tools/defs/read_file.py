"""read_file: a text file of the workspace, a window of lines at a time (docs/tools.md#read_file)."""

from __future__ import annotations

from pydantic import Field

from sandbox_agent import limits

from ..argbase import ReadPathArgs
from ..tooldef import J_BOOL, J_INT, J_STR, FileUse, McpFace, ToolDef


class ReadFileArgs(ReadPathArgs):
    offset: int = Field(default=1, ge=1, le=10_000_000, description="First line to read, 1-based.")
    limit: int = Field(default=limits.READ_DEFAULT_LIMIT_LINES, ge=1, le=1_000_000, description="Most lines to read.")


TOOL = ToolDef(
    "read_file",
    "read",
    "sandbox",
    ReadFileArgs,
    order=10,
    title="Read a workspace file",
    description=(
        f"Read a text file in the workspace. Returns at most {limits.READ_CAP_BYTES // 1024} KiB; when cut, "
        "the result says which line to read on from (pass it as offset). The result shows the file's sha256: "
        "pass it to edit_file as expected_sha256 so the edit is refused if the file changed meanwhile."
    ),
    bounds={"read_cap_bytes": limits.READ_CAP_BYTES, "default_lines": limits.READ_DEFAULT_LIMIT_LINES},
    files=FileUse(path_arg=True, line_arg="offset", reads_file=True),
    mcp=McpFace(
        served=True,
        idempotent=True,
        output_doc="The file's text (lines offset.., within the read cap).",
        result_meta={
            "sha256": J_STR,
            "total_lines": J_INT,
            "first_line": J_INT,
            "last_line": J_INT,
            "truncated": J_BOOL,
            "next_offset": {"type": ["integer", "null"]},
            "bytes": J_INT,
            "binary": J_BOOL,
            "bom": J_BOOL,
            "invalid_utf8": J_BOOL,
            "encoding_guess": J_STR,
        },
    ),
)
