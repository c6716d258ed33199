"""Copy mode's review and apply: what the box changed, shown safely, and carried back by a sanitiser.

The copy is the box's: by the time anyone reviews it, every byte, name, mode and link in it may
be an attack on the host or on the user's real workspace. So this package touches it only through
the shared layer (orchestrator/boxfs): the copy is scanned by its iterative, budgeted Walk; every
path is reached from a directory fd, one O_NOFOLLOW component at a time; nothing but directories
and regular files is opened (O_NONBLOCK, so a FIFO cannot hang it); reads are capped; files land
through `write_atomic` (holes kept: a sparse file stays sparse on the user's disk). Paths are kept
in `boxfs.to_store` form (valid text, lossless: a newline or invalid UTF-8 in a name survives the
JSON manifest and the report) and shown only through `boxfs.show`.

`apply_changes()` is a sanitiser, not a copy. It carries regular files (modes normalised, never
setuid, setgid or sticky), directories, deletions and symlinks that stay inside the workspace;
it leaves out, and lists, everything else, and a HEAD or commondir that would make a directory a
bare repository the user's git obeys (integrity.git_shaped). It checks every change against the real workspace
before it writes anything: a path the user changed since the copy was taken is a conflict, and
one conflict means nothing is applied. Each file lands atomically (a recognisable temp file in
the same directory, fsync, rename), so a kill -9 at any moment leaves every file old or new; the
next apply removes the stale temp files and skips what already landed.

One module a job, each importing only those before it:
- `scan`: what the box changed in the copy (`list_changes`, `Change`, `shown`);
- `nofollow`: reaching one path of the real workspace or the copy without following anything;
- `render`: the bounded, escaped diff a person reads (`render_diff`);
- `report`: what apply did, left out and refused (`ApplyReport`);
- `plan`: apply's decisions and checks, nothing written (`planned_changes`);
- `apply`: the writes (`apply_changes`);
- `landing`: landing a live copy more than once (MCP's apply_changes, ACP's end of every turn).
"""

from .apply import apply_changes
from .landing import apply_scanned, move_on
from .plan import MAX_SYMLINK_HOPS, TEMP_PREFIX, planned_changes
from .render import (
    DIFF_DEADLINE_S,
    IN_PROCESS_DIFF_WORK,
    MAX_DIFF_BYTES,
    MAX_DIFF_FILE_BYTES,
    MAX_FILE_LINES,
    MAX_STAT_FILES,
    MAX_TOTAL_LINES,
    render_diff,
)
from .report import ApplyReport, Conflict, LeftOut, Normalised
from .scan import Change, ChangeKind, list_changes, shown

__all__ = [
    "DIFF_DEADLINE_S",
    "IN_PROCESS_DIFF_WORK",
    "MAX_DIFF_BYTES",
    "MAX_DIFF_FILE_BYTES",
    "MAX_FILE_LINES",
    "MAX_STAT_FILES",
    "MAX_SYMLINK_HOPS",
    "MAX_TOTAL_LINES",
    "TEMP_PREFIX",
    "ApplyReport",
    "Change",
    "ChangeKind",
    "Conflict",
    "LeftOut",
    "Normalised",
    "apply_changes",
    "apply_scanned",
    "list_changes",
    "move_on",
    "planned_changes",
    "render_diff",
    "shown",
]
