"""Checkpoints: the workspace after each turn, in a shadow object store outside it, and rollback.

The store is a bare libgit2 repository in the session's state directory (as Gemini CLI keeps a
shadow repository); the workspace needs no `.git` and its own `.git` is never read or touched.
Everything in the workspace was written by the box, so the store is never steered by it, and
every walk, read and write of the workspace goes through `boxfs` (iterative, fd-relative, no
link followed, bounded by a `HostBudget`):

- blobs are made from the bytes boxfs read (libgit2 never opens a workspace path, so no filter,
  attribute or config of the box applies); symlinks are stored as links (their target is data);
  FIFOs, sockets, devices, files over the size cap and files or directories the sandbox user
  could not read by their mode and owner are listed as skipped, never silently left out (and a
  file the box could not read is never put into the store);
- names are kept in trees in `boxfs.to_store` form, so a name with invalid UTF-8 is stored and
  restored exactly; each file's and directory's exact permission bits and owner are kept beside
  the tree (a JSON blob named by the checkpoint) and restored exactly, never wider;
- every `.git` entry (any case) is neither recorded nor touched by restore, and restore never
  brings back the HEAD or commondir of a directory that would then be a bare repository the
  user's git obeys (the sweep defused it at session end);
- the store's real growth on disk (blobs, trees, commits, each loose object's blocks) is bounded:
  objects written are charged as they are written, loose objects are packed after each record and
  the store's allocated bytes are measured; past `budget_bytes` the checkpoint is skipped, typed
  (state "skipped", resource_exhausted), never silently; a first record (a workspace this process
  never walked: turn 0, a resumed session's) writes its objects straight into one pack instead
  (packwrite.py: no loose file, no read-back, no delta search);
- what a `.gitignore` in the workspace names is not checkpointed and is listed as skipped (an
  ignored directory as one entry, not walked); restore leaves it as it is and says so (ignore.py);
- the session records turn 0 on a background thread (in_background) while its box starts: record,
  restore and list wait for it, and in bind mode the session makes every call that may change files
  wait too; in copy mode turn 0 is read from the real workspace, which the box never writes, checked
  against the copy's manifest (baseline.py), so no call waits; close cancels it (recorded as failed:
  the changes are then unknown, never "none");
- a checkpoint that fails (any error) is kept in the index as state "failed" with its error type:
  what changed since the last good checkpoint is then unknown, and summary, `sessions` and
  `checkpoints` say so instead of "no files changed"; the next record walks everything;
- restore refuses to overwrite what changed since the store last knew the workspace (the last
  record or restore): every conflict is listed and nothing is changed; files are written
  atomically, holes kept, with the recorded mode and owner.

Thread-safe: record, restore and close hold one lock; turns are assigned when the record runs,
strictly increasing (a turn number not after the last is moved past it).

One module a job, each importing only those before it:
- `index`: the records kept in checkpoints.json (`Checkpoint`, `RestoreReport`, `store_unknown`);
- `packwrite`: a pack and its index written with the standard library;
- `objects`: the object store on disk, its budget and packing;
- `ignore`: `.gitignore` files, parsed and matched within bounds;
- `watcher`: inotify, the hints that spare a full walk;
- `dirs`: the in-memory picture of the last walk;
- `baseline`: copy mode's turn 0, from the real workspace and the copy's manifest;
- `snapshot`: walking the workspace into trees, whole or from the hints (why, and its known limit);
- `restore`: making the workspace one checkpoint again;
- `store`: `CheckpointStore`, which records and restores through them.
"""

from .baseline import CHANGED_SINCE_COPY, GONE_SINCE_COPY, CopyBaseline
from .index import Checkpoint, Conflict, RestoreReport, Skipped, shown_path, store_unknown, unknown_changes
from .objects import MODE_EXEC, MODE_FILE, MODE_LINK, MODE_TREE
from .snapshot import NOT_READABLE
from .store import CheckpointStore

__all__ = [
    "CHANGED_SINCE_COPY",
    "GONE_SINCE_COPY",
    "CopyBaseline",
    "MODE_EXEC",
    "MODE_FILE",
    "MODE_LINK",
    "MODE_TREE",
    "NOT_READABLE",
    "Checkpoint",
    "CheckpointStore",
    "Conflict",
    "RestoreReport",
    "Skipped",
    "shown_path",
    "store_unknown",
    "unknown_changes",
]
