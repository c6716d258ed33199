"""list_files: the entries under a workspace directory (docs/tools.md#list_files)."""

from __future__ import annotations

from pydantic import Field

from sandbox_agent import limits

from ..argbase import ReadPath, ReadPathArgs
from ..tooldef import J_BOOL, J_INT, J_NAME, FileUse, McpFace, ToolDef


class ListFilesArgs(ReadPathArgs):
    path: ReadPath = Field(default=".", description="Directory relative to the workspace root.")
    recursive: bool = Field(default=True, description="List subdirectories too.")


TOOL = ToolDef(
    "list_files",
    "read",
    "sandbox",
    ListFilesArgs,
    order=20,
    title="List workspace files",
    description=(
        f"List files and directories under a workspace path (at most {limits.LIST_MAX_ENTRIES} "
        "entries; .git, node_modules, target and dist are skipped). Directories end with '/'."
    ),
    bounds={"max_entries": limits.LIST_MAX_ENTRIES},
    files=FileUse(path_arg=True, path_may_be_directory=True),
    mcp=McpFace(
        served=True,
        idempotent=True,
        output_doc="The listing, one entry a line.",
        result_meta={
            "entries": J_INT,
            "truncated": J_BOOL,
            "unreadable": {"type": "array"},
            "names": {
                "type": "array",
                "items": J_NAME,
                "description": "The entries, each exact (its text, or bytes_b64 when "
                "its bytes are not UTF-8): a name holding a newline is one entry; give it back as path.",
            },
        },
    ),
)
