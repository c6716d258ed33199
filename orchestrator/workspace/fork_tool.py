"""`fork`, copy mode's host-side tool for the MCP client (issue 37): the session's own copy (at its
latest checkpoint, or `turn`) or an ended copy session of the same user (`session_id`) forked into
`n` new copy sessions (workspace/fork.py); their ids are the result. Installed beside `changes` and
`apply_changes` (copy_tools.py) in the session's registry, so it goes through the one CallPipeline:
validated, decided by the ladder (a rule names it `tool = "fork"`), run, and recorded.
"""

from __future__ import annotations

from typing import Any

from ..errors import ErrorType, OpenAgentsError
from ..protocol import Executor, ToolResult
from ..tools.owner import FORK, ForkArgs
from ..tools.registry import HostTools, OwnHostTools, PreparedCall
from .fork import MAX_FORKS, BoxCheck, fork_session
from .records import SessionRecord

FORK_DEF = FORK  # the declaration (tools/owner.py), by the name the MCP server reads it by
FORK_DESCRIPTION = (
    "Copy mode only: fork this session's private copy (its state after its last checkpointed call, "
    "or after checkpoint `turn`), or an ended copy session of yours (`session_id`), into `n` (1 to "
    f"{MAX_FORKS}) new, independent copy sessions; returns their ids (session_ids). Each is a "
    "normal copy session: `oa-sandbox changes/apply/discard ID`, `oa-sandbox run --resume ID`."
)
FORK_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": MAX_FORKS, "default": 1, "description": "How many forks."},
        "session_id": {"type": "string", "description": "An ended copy session of yours (default: this session)."},
        "turn": {
            "type": "integer",
            "minimum": 0,
            "description": "The state after this checkpoint turn (default: the latest).",
        },
    },
}
FORK_OUTPUT_META: dict[str, Any] = {
    "session_ids": {
        "type": "array",
        "items": {"type": "string"},
        "description": "The new sessions' ids, one per fork.",
    },
    "forked_from": {"type": "string", "description": "The session forked."},
}


class ForkTools(OwnHostTools):
    """`fork` as a host-side tool of the session's registry (registry.HostTools); `inner`: the host
    tools the session already had, kept as they were. `issued`: as CopyTools' (the owner's calls only)."""

    DECLARED = (FORK,)

    def __init__(
        self,
        record: SessionRecord,
        inner: HostTools | None = None,
        issued: set[str] | None = None,
        box_on_copy: BoxCheck | None = None,
    ) -> None:
        super().__init__(inner, issued)
        self.record = record
        self.box_on_copy = (
            box_on_copy  # for another ended session's copy (fork.fork_session): a live one is never frozen
        )

    def invoke_own(self, prepared: PreparedCall) -> ToolResult:
        args = prepared.args
        assert isinstance(args, ForkArgs)
        own = args.session_id is None or args.session_id == self.record.id
        parent = self.record.id if own else str(args.session_id)
        try:
            made = fork_session(parent, args.n, args.turn, live=own, box_on_copy=None if own else self.box_on_copy)
        except OpenAgentsError as err:
            return ToolResult.failure(err).model_copy(update={"executor": Executor.OPENAGENTS})
        except OSError as err:
            return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, f"fork failed: {err.strerror}")).model_copy(
                update={"executor": Executor.OPENAGENTS}
            )
        ids = [record.id for record in made]
        return ToolResult(
            ok=True,
            output=f"forked {parent} into {len(ids)} session(s): " + " ".join(ids),
            meta={"session_ids": ids, "forked_from": parent},
            executor=Executor.OPENAGENTS,
        )
