"""The checkpoint index (checkpoints.json): what each checkpoint is, kept beside the object store.

Its own module because more than the store reads it: the session records (what `sessions` lists)
ask `store_unknown` whether what a session changed is known, from the index alone, without
opening the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from ...boxfs import from_store, show

INDEX_NAME = "checkpoints.json"
INDEX_CAP = 64 << 20  # the index is ours, but bounded all the same


class Skipped(BaseModel):
    path: str  # boxfs.to_store form (lossless); show(from_store(path)) for people
    reason: str


class Conflict(BaseModel):
    path: str
    reason: str


class Checkpoint(BaseModel):
    turn: int
    commit: str = ""  # empty unless state is "ok"
    created: float
    state: Literal["ok", "skipped", "failed"] = "ok"  # skipped: over the store budget; failed: an error
    error_type: str | None = None  # an ErrorType value when not ok
    error: str = ""
    files_changed: list[str] = Field(default_factory=list)  # vs the previous good checkpoint (or restored state)
    files_changed_count: int = 0
    skipped: list[Skipped] = Field(default_factory=list)
    meta: str | None = (
        None  # the blob of exact modes and owners; None: an older checkpoint (0644/0755, workspace owner)
    )
    names: Literal["raw", "store"] = "raw"  # how names are kept in the tree (store: boxfs.to_store)

    @property
    def ok(self) -> bool:
        return self.state == "ok"


class RestoreReport(BaseModel):
    restored: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    conflicts: list[Conflict] = Field(default_factory=list)  # any: nothing was changed


class _Index(BaseModel):
    version: int = 2
    head: str | None = None  # the commit the workspace was last known to equal (recorded or restored)
    used_bytes: int = 0  # the store's allocated bytes on disk after the last record: what the budget counts
    base_bytes: int = 0  # the store's bytes after its first good record: later records may add the growth budget
    checkpoints: list[Checkpoint] = Field(default_factory=list)


def unknown_changes(points: list[Checkpoint]) -> str | None:
    """Why what the session changed is unknown (its last checkpoint is not a good one), or None."""
    if points and not points[-1].ok:
        last = points[-1]
        what = "skipped" if last.state == "skipped" else "failed"
        return f"the checkpoint after turn {last.turn} {what} ({last.error_type}): {last.error}"
    return None


def shown_path(path: str, point: Checkpoint) -> str:
    """A path of a checkpoint's lists, for people (escaped by boxfs.show)."""
    return show(from_store(path)) if point.names == "store" else show(path)


def store_unknown(store: Path) -> str | None:
    """unknown_changes() of the store at `store`, read from its index alone (None: no index)."""
    path = Path(store) / INDEX_NAME
    try:
        with open(path, "rb") as fh:
            raw = fh.read(INDEX_CAP + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"the checkpoint index cannot be read: {err.strerror}"
    try:
        return unknown_changes(_Index.model_validate_json(raw[:INDEX_CAP]).checkpoints)
    except ValueError:
        return "the checkpoint index is not valid"
