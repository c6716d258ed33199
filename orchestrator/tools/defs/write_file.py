"""write_file: a whole file, created or replaced atomically (docs/tools.md#write_file)."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from pydantic import Field

from sandbox_agent import limits

from ..argbase import PathArgs
from ..tooldef import J_BOOL, J_INT, J_STR, FileUse, McpFace, Proposal, ToolDef


class WriteFileArgs(PathArgs):
    mutation: ClassVar[bool] = True
    content: str = Field(max_length=limits.WRITE_MAX_BYTES, description="The whole new content of the file.")


def _proposal(before: str, args: Mapping[str, Any]) -> Proposal:
    content: str = args["content"]
    return Proposal("write", len(content), lambda: content)


TOOL = ToolDef(
    "write_file",
    "edit",
    "sandbox",
    WriteFileArgs,
    order=40,
    title="Write a workspace file",
    description="Create or replace a whole file in the workspace (never under "
    ".git). Parent directories are created. The write is atomic.",
    mutates=True,
    bounds={"max_bytes": limits.WRITE_MAX_BYTES},
    files=FileUse(path_arg=True, replaces_file=True, propose=_proposal),
    mcp=McpFace(
        served=True,
        idempotent=True,
        output_doc="What was written.",
        result_meta={"sha256": J_STR, "bytes": J_INT, "created": J_BOOL, "atomic": J_BOOL},
    ),
)
