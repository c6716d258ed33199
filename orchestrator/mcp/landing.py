"""Copy mode over MCP: what the private copy holds, and landing it, without leaving the client.

In copy mode (a root-owned workspace under `auto`, or `--workspace-mode copy`) the six tools work
on the session's private copy; nothing reaches the real workspace until it is applied. The MCP
server then offers two more tools:

- `changes`: the unified diff of the copy against the real workspace (review.list_changes and
  review.render_diff, as `oa-sandbox changes`);
- `apply_changes`: review.apply_changes, the sanitiser `oa-sandbox apply` runs: regular files,
  directories, deletions and in-workspace symlinks are carried, everything else (FIFOs, devices,
  absolute links, .git entries, box-made hard links...) is left out and listed; a path the user
  changed in the real workspace since the copy was taken is a conflict, and one conflict means
  nothing is applied (an error result listing each conflict).

Both are calls like the six tools': `CopyTools` (workspace/copy_tools.py, shared with the Python API)
gives them to the session's registry as host-side tools (the shape the user's MCP servers' tools and git
have), so each goes through the one CallPipeline: validated, decided by the ladder, run, and recorded in
the transcript with who decided and who ran it. `changes` is a read of the session's own copy (a rule
names it `tool = "changes"`, kind read: automatic by default); `apply_changes` is the landing, judged as
every front-end's landing is (tool apply_changes, kind edit, action land: the ladder's decide_landing
key): a deny rule, copy-only or read-only refuses it, typed (refused_by_policy), nothing written.

After an apply, the session goes on with the same copy. So that a later apply of a file edited
again is not taken for the user's change, the manifest's baseline of every entry that landed is
moved to what landed: the real entry as it is now, the copy's as the scan before the apply saw it
(an entry the box changed after that scan shows as changed again, never as landed).

In bind mode neither tool is listed: every change is already in the real workspace.
"""

from __future__ import annotations

from ..errors import ErrorType, OpenAgentsError
from ..ground.text import visible
from ..protocol import ToolResult
from ..workspace.copy_tools import COPY_TOOLS, CopyTools, Landing
from ..workspace.records import SessionRecord

__all__ = ["COPY_TOOLS", "CopyTools", "Landing", "bind_mode_refusal", "in_copy_note", "instructions"]

CHANGES_DESCRIPTION = (
    "Copy mode only: the unified diff of what the tools changed in this session's private copy, against the real "
    "workspace. Nothing in it is in the real workspace until apply_changes lands it. stat=true: one line per file "
    "with +/- counts."
)
APPLY_DESCRIPTION = (
    "Copy mode only: land the private copy's changes in the real workspace, through the same sanitiser as "
    "`oa-sandbox apply`: regular files, directories, deletions and symlinks inside the workspace are carried; "
    "FIFOs, devices, absolute or escaping symlinks, .git entries and hard links made in the sandbox are left out "
    "and listed. If any file changed in the real workspace since the copy was taken, nothing is applied and each "
    "conflict is listed. The session goes on with the same copy afterwards."
)


def in_copy_note(record: SessionRecord) -> str:
    """What a mutating result says in copy mode."""
    return (
        f"[copy mode: this change is in the session's private copy, not in {visible(record.workspace)}: "
        f"call apply_changes to land it (changes shows the diff), or after the session `oa-sandbox apply {record.id}`]"
    )


def instructions(record: SessionRecord) -> str:
    base = (
        "Tools run in a hardened Docker sandbox over the workspace mounted at /workspace; paths are relative to it. "
        "No network unless the user opened egress. "
    )
    if record.mode.value == "copy":
        return base + (
            f"Workspace mode: copy. The tools work on a private copy of {visible(record.workspace)} "
            f"kept in session {record.id}'s state; nothing they change reaches the real workspace "
            "until apply_changes lands it (changes shows the diff first). apply_changes carries "
            "regular files, directories, deletions and in-workspace symlinks, lists what it leaves "
            "out, and applies nothing when the user changed a file in the meantime."
        )
    return (
        base
        + f"Workspace mode: bind. The tools change {visible(record.workspace)} directly; there is nothing to apply."
    )


def bind_mode_refusal(name: str, record: SessionRecord) -> ToolResult:
    return ToolResult.failure(
        OpenAgentsError(
            ErrorType.UNKNOWN_TOOL,
            f"{name} exists only in copy mode: this session runs in bind mode, so every change is already in "
            f"{visible(record.workspace)}; there is nothing to apply",
        )
    )
