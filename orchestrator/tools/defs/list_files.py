"""list_files: the entries under a workspace directory (docs/tools.md#list_files)."""
from __future__ import annotations

from pydantic import Field

from sandbox_agent import limits

from ..argbase import MAX_PATH_CHARS, PathArgs
from ..tooldef import J_BOOL, J_INT, FileUse, McpFace, ToolDef


class ListFilesArgs(PathArgs):
    path: str = Field(default=".", max_length=MAX_PATH_CHARS, description="Directory relative to the workspace root.")
    recursive: bool = Field(default=True, description="List subdirectories too.")


TOOL = ToolDef(
    "list_files", "read", "sandbox", ListFilesArgs, order=20, title="List workspace files",
    description=(f"List files and directories under a workspace path (at most {limits.LIST_MAX_ENTRIES} entries; .git, node_modules, "
                 "target and dist are skipped). Directories end with '/'."),
    bounds={"max_entries": limits.LIST_MAX_ENTRIES},
    files=FileUse(path_arg=True, path_may_be_directory=True),
    mcp=McpFace(served=True, idempotent=True, output_doc="The listing, one entry a line.",
                result_meta={"entries": J_INT, "truncated": J_BOOL, "unreadable": {"type": "array"}}),
)
