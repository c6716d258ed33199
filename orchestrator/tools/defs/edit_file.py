"""edit_file: an exact piece of text replaced in a file (docs/tools.md#edit_file)."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from pydantic import Field, model_validator

from sandbox_agent import limits

from ..argbase import PathArgs
from ..tooldef import J_BOOL, J_INT, J_STR, FileUse, McpFace, Proposal, ToolDef


class EditFileArgs(PathArgs):
    mutation: ClassVar[bool] = True
    old_text: str = Field(min_length=1, max_length=limits.EDIT_MAX_FILE_BYTES, description="Exact text to replace.")
    new_text: str = Field(max_length=limits.EDIT_MAX_FILE_BYTES, description="Replacement text.")
    allow_multiple: bool = Field(
        default=False, description="Replace every occurrence instead of requiring a unique match."
    )
    expected_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="The sha256 read_file showed; the edit is refused if the file changed since.",
    )

    @model_validator(mode="after")
    def _changes_something(self) -> "EditFileArgs":
        """An edit that changes nothing is a mistake the model should hear about (as OpenHands' editor says)."""
        if self.old_text == self.new_text:
            raise ValueError("old_text and new_text are the same; nothing would change")
        return self


def _proposal(before: str, args: Mapping[str, Any]) -> Proposal | None:
    """The size of the edited file from the match count, before it is built (issue 22)."""
    old, new = args["old_text"], args["new_text"]
    count = before.count(old)  # str.replace's own matches: left to right, not overlapping
    if count == 0 or (count > 1 and not args.get("allow_multiple")):
        return None
    return Proposal("edit", len(before) + count * (len(new) - len(old)), lambda: before.replace(old, new))


TOOL = ToolDef(
    "edit_file",
    "edit",
    "sandbox",
    EditFileArgs,
    order=50,
    title="Edit a workspace file",
    description=(
        "Replace an exact piece of text in a file. old_text must match exactly and once, unless allow_multiple is "
        "true. Line endings and a byte-order mark are kept. Prefer this to write_file for changes to existing files."
    ),
    mutates=True,
    bounds={"max_file_bytes": limits.EDIT_MAX_FILE_BYTES},
    files=FileUse(path_arg=True, replaces_file=True, match_arg="old_text", propose=_proposal),
    mcp=McpFace(
        served=True,
        output_doc="What was replaced.",
        result_meta={"sha256": J_STR, "replacements": J_INT, "diff": J_STR, "atomic": J_BOOL},
    ),
)
