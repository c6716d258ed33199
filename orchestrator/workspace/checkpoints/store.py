"""CheckpointStore: record after each turn, list, restore; the one object the session holds.

It owns the index and the order of a record (walk, trees, commit, pack, measure, index) and holds
the lock; the walk, the object accounting and restore are the other modules'.
"""

from __future__ import annotations

import builtins
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Literal

import pygit2

from ...boxfs import HostBudget, show, to_store
from ...boxfs.atomic import write_atomic
from ...errors import ErrorType, OpenAgentsError
from .baseline import CopyBaseline
from .dirs import _Dir
from .index import INDEX_CAP, INDEX_NAME, Checkpoint, RestoreReport, Skipped, _Index
from .objects import MODE_EXEC, MODE_LINK, _object, _StoreFull, _tree_files
from .restore import _Restorer
from .snapshot import _Snapshots
from .watcher import _Watcher

GROWTH_BYTES = 256 << 20  # what the records after the first may add to the store, by default
DISK_RESERVE = (1 << 30, 0.10)  # left free on the store's file system by a first record: 1 GiB or 10%, the larger
CHANGED_LIST_CAP = 1000  # paths listed per checkpoint; files_changed_count has the whole number
SIGNATURE = ("openagents-sandbox", "checkpoints@localhost")


def disk_room(path: Path) -> int:
    """What a first record may write on the file system of `path` and leave DISK_RESERVE free (0: none)."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return 0
    reserve = max(DISK_RESERVE[0], int(fs.f_blocks * fs.f_frsize * DISK_RESERVE[1]))
    return max(0, fs.f_bavail * fs.f_frsize - reserve)


class CheckpointStore(_Snapshots):
    """Checkpoints of one workspace in the bare repository `store` (created if missing).

    `budget_bytes` bounds the store's real size on disk; None (the default) makes it scale with the
    tree (`budget_for`): the first record may take what the workspace compresses to, as long as the
    disk keeps its reserve (DISK_RESERVE), and every later one what that first record took plus
    GROWTH_BYTES. `max_file_bytes` bounds a file's. `box_user`
    (uid, gid) is the sandbox user: a file or directory it could not read by its mode and owner is
    never stored (default: the workspace's owner, which is the box's user in both modes).
    `budget` (optional) is the session's HostBudget: each record and restore takes a slice of it
    (entries walked, bytes read and written, its deadline); without one each takes its own default.
    """

    def __init__(
        self,
        store: Path,
        workspace: Path,
        budget_bytes: int | None = None,
        max_file_bytes: int = 16 << 20,
        box_user: tuple[int, int] | None = None,
        budget: HostBudget | None = None,
    ) -> None:
        self.store, self.workspace = Path(store), Path(workspace)
        real_ws, real_store = os.path.realpath(self.workspace), os.path.realpath(self.store)
        if real_store == real_ws or real_store.startswith(real_ws.rstrip("/") + "/"):
            raise ValueError("the checkpoint store must be outside the workspace (the box writes the workspace)")
        self.fixed_budget, self.max_file_bytes = budget_bytes, max_file_bytes
        self._budget_now = budget_bytes if budget_bytes is not None else GROWTH_BYTES  # set again by each record
        self.host_budget = budget
        if box_user is None:
            ws_st = os.stat(self.workspace)
            box_user = (ws_st.st_uid, ws_st.st_gid)
        self.box_user = box_user
        self._lock = threading.RLock()
        if (self.store / "HEAD").exists():
            self.repo = self._open_repo()
        else:
            self.store.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.repo = pygit2.init_repository(str(self.store), bare=True)
            # Packing our own objects: a small delta window (the blobs are rarely alike), 2x faster.
            self.repo.config["pack.windowMemory"] = "1"
            # Only small objects are packed (_pack_loose): a big blob's loose file wastes less than a
            # block, while packing it costs a delta search and a second compression (100 similar 1 MiB
            # files took 17 s to pack, 0.6 s to store loose).
        self._index = self._load_index()
        self._root: _Dir | None = None
        self._wds: dict[int, _Dir] = {}
        self._linked: set[tuple[_Dir, str]] = set()  # files with other hard links: events may name the other path
        self._watcher: _Watcher | None = None
        self._scan_started_ns = 0
        self._hinted = False  # inside an incremental record: a surprise means a full walk
        self._pending = 0  # bytes on disk the loose objects written by this record cost at most
        self._base = 0  # the store's size on disk before them
        self._record_packs: set[Path] = set()  # packs made during this record (dropped if it is not kept)
        self._loose_at_start: set[Path] = set()  # loose objects (big blobs) of kept records, when a record began
        self._big_blobs: set[pygit2.Oid] = set()  # blobs of this record too big to pack: they stay loose
        self._packer, self._packer_fresh = None, False  # a first record's one pack, while it is written (objects.py)
        self._budget = HostBudget()
        self._first: threading.Thread | None = None  # the record started in the background (in_background)
        self._cancel = threading.Event()  # set: the background record stops at its next entry, failed (cancelled)
        self._queue_lock = threading.Lock()
        self._queued: tuple[int, Callable[[Checkpoint | None, Exception | None], object]] | None = None
        self._first_over = True  # the background thread takes no more queued records
        self.baseline: CopyBaseline | None = None  # copy mode: turn 0 read from the real workspace (baseline.py)
        self._from: CopyBaseline | None = None

    def _work_budget(self) -> HostBudget:
        return self.host_budget.slice() if self.host_budget is not None else HostBudget()

    # -- public API -------------------------------------------------------------------------

    def in_background(self, work: Callable[[], object]) -> None:
        """Run `work` (the session's first record: turn 0, or a resumed session's) on its own
        thread. Until it is over, record, restore and list wait for it (wait()), so nobody sees
        the store without it; a caller about to let anything change the workspace waits first."""
        if self._first is not None:
            raise RuntimeError("one background record at a time")
        self._cancel.clear()

        def first_then_queued() -> None:
            work()
            while True:
                with self._queue_lock:
                    queued, self._queued = self._queued, None
                    if queued is None:
                        self._first_over = True
                        return
                try:
                    point: Checkpoint | None = self.record(queued[0])
                except Exception as err:  # noqa: BLE001 - told to the caller's callback, as record() would raise it
                    queued[1](None, err)
                else:
                    queued[1](point, None)

        self._first_over = False
        self._first = threading.Thread(target=first_then_queued, name="checkpoint-first", daemon=True)
        self._first.start()

    def record_later(self, turn: int, done: Callable[[Checkpoint | None, Exception | None], object]) -> bool:
        """While the background record runs, queue the record of `turn` to run on its thread right
        after it (True), and `done(point, error)` hears how it went; a turn queued before it and not
        run yet is replaced (this record covers both turns' changes). False: nothing is running,
        record now. Copy mode's calls go on while turn 0 is read from the real workspace."""
        with self._queue_lock:
            if self._first is None or self._first_over or not self._first.is_alive():
                return False
            self._queued = (turn, done)
            return True

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Until the background record is over (True), or `stop` is set first (False)."""
        thread = self._first
        if thread is None or thread is threading.current_thread():
            return True
        while thread.is_alive():
            if stop is not None and stop.is_set():
                return False
            thread.join(0.2 if stop is not None else None)
        return True

    @property
    def recording(self) -> bool:
        """Whether the background record is still running."""
        return self._first is not None and self._first.is_alive()

    def cancel(self) -> None:
        """The background record stops at its next entry (recorded as failed: cancelled); wait() for it."""
        if self.recording:
            self._cancel.set()

    def record(self, turn: int) -> Checkpoint | None:
        """Snapshot the workspace now. Turn 0 is always recorded; a later turn returns None when
        nothing (tree, modes, skipped list) changed since the last good checkpoint or restore. A
        turn not after the last recorded one is moved just past it (parallel callers). A record
        that fails or passes the store budget returns a checkpoint whose state says so (kept in
        the index: what changed is then unknown), never None."""
        if turn < 0:
            raise ValueError("turns start at 0")
        self.wait()
        with self._lock:
            if self._index.checkpoints:
                turn = max(turn, max(c.turn for c in self._index.checkpoints) + 1)
            self._pending, self._base, self._record_packs = 0, self._index.used_bytes, set()
            self._loose_at_start = {path for _, path, _ in self._loose()}  # big blobs of kept records
            self._big_blobs = set()
            self._budget = self._work_budget()
            self._budget_now = self.budget_for()
            try:
                return self._record(turn)
            except Exception as err:  # noqa: BLE001 - typed into the index, never "no change"
                self._forget()
                self._direct_abort()
                try:
                    self._drop_loose()
                    self._unlink_packs(self._record_packs & self._packs())
                    if self.repo.references.get(f"refs/checkpoints/{turn}") is not None:
                        self.repo.references.delete(f"refs/checkpoints/{turn}")
                except (OSError, pygit2.GitError):
                    pass
                state: Literal["skipped", "failed"]
                if isinstance(err, _StoreFull):
                    state, kind = "skipped", ErrorType.RESOURCE_EXHAUSTED.value
                elif isinstance(err, OpenAgentsError):
                    state, kind = "failed", err.type.value
                elif isinstance(err, OSError):
                    state, kind = "failed", ErrorType.IO_ERROR.value
                else:
                    state, kind = "failed", ErrorType.INTERNAL_ERROR.value
                message = getattr(err, "message", None) or str(err) or type(err).__name__
                cp = Checkpoint(
                    turn=turn, created=round(time.time(), 3), state=state, error_type=kind, error=show(message[:500])
                )
                self._append(cp, None)
                return cp

    @property
    def budget_bytes(self) -> int:
        """The bytes on disk the store may hold after the record under way (budget_for)."""
        return self._budget_now

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:  # a fixed budget from now on
        self.fixed_budget = self._budget_now = value

    def budget_for(self) -> int:
        """The bytes on disk the store may hold after the next record. Fixed when given; else the
        first good record may take what the tree compresses to, short of the disk's reserve (a
        checkpoint never fills the disk), and each later one GROWTH_BYTES on top of that first."""
        if self.fixed_budget is not None:
            return self.fixed_budget
        if self._index.base_bytes and any(c.ok for c in self._index.checkpoints):
            return self._index.base_bytes + GROWTH_BYTES
        return self._index.used_bytes + max(GROWTH_BYTES, disk_room(self.store))

    def list(self) -> list[Checkpoint]:
        self.wait()
        return sorted(self._load_index().checkpoints, key=lambda c: c.turn)

    def restore(self, turn: int) -> RestoreReport:
        """Make the workspace exactly the state after `turn` (no box may run meanwhile). When any
        path restore would touch differs from the state the store last knew (the last record or
        restore), nothing is changed and the report lists the conflicts."""
        self.wait()
        with self._lock:
            self._index = self._load_index()
            cp = next((c for c in self._index.checkpoints if c.turn == turn), None)
            if cp is None:
                raise KeyError(f"no checkpoint for turn {turn}")
            if not cp.ok:
                raise OpenAgentsError(
                    ErrorType.INVALID_ARGUMENTS, f"the checkpoint after turn {turn} {cp.state}: {cp.error}"
                )
            ref = self.repo.references.get(f"refs/checkpoints/{turn}")
            if ref is None or str(ref.target) != cp.commit:
                raise ValueError(f"the store's ref for turn {turn} does not match its index")
            head = next((c for c in self._index.checkpoints if c.ok and c.commit == self._index.head), None)
            if head is None:
                raise OpenAgentsError(
                    ErrorType.INTERNAL_ERROR, "the checkpoint store does not know the workspace's last state"
                )
            self._forget()  # our own writes: the next record walks everything
            restorer = _Restorer(self, cp, head, self._work_budget())
            report = restorer.run()
            if not report.conflicts:
                self._index.head = cp.commit
                self._save_index(self._index)
            return report

    def close(self) -> None:
        if self.recording:
            self.cancel()
            self.wait()
        with self._lock:
            self._forget()

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._forget()
        except Exception:
            pass

    # -- the index ---------------------------------------------------------------------------

    def _load_index(self) -> _Index:
        path = self.store / INDEX_NAME
        try:
            with open(path, "rb") as fh:
                raw = fh.read(INDEX_CAP + 1)
        except FileNotFoundError:
            return _Index()
        if len(raw) > INDEX_CAP:
            raise ValueError(f"checkpoint index {path} is over {INDEX_CAP} bytes")
        return _Index.model_validate_json(raw)

    def _save_index(self, index: _Index) -> None:
        path = self.store / INDEX_NAME
        write_atomic(path, index.model_dump_json(), mode=0o644)

    def _append(self, cp: Checkpoint, head: str | None, used: int | None = None) -> None:
        """The index with `cp`, saved; the in-memory index changes only once the save succeeded."""
        new = self._index.model_copy(update={"checkpoints": [*self._index.checkpoints, cp]})
        if head is not None:
            new.head = head
        if used is not None:
            new.used_bytes = used
        self._save_index(new)
        self._index = new

    # -- one record ----------------------------------------------------------------------------

    def _record(self, turn: int) -> Checkpoint | None:
        root, hinted_changes = self._snapshot()
        dirs = builtins.list(root.all_dirs())  # once a record: a 40k-file tree has thousands
        skipped = sorted(
            (
                Skipped(path=to_store(d.child_rel(n)), reason=r)
                for d in dirs
                if d.skipped
                for n, (_, r) in d.skipped.items()
            ),
            key=lambda s: s.path,
        )
        meta = self._write_meta(root, dirs)
        head_cp = (
            next((c for c in self._index.checkpoints if c.ok and c.commit == self._index.head), None)
            if self._index.head
            else None
        )
        head = _object(self.repo, pygit2.Oid(hex=self._index.head), pygit2.Commit) if self._index.head else None
        last = self._index.checkpoints[-1] if self._index.checkpoints else None
        same_skips = (
            last is not None and last.ok and [s.model_dump() for s in last.skipped] == [s.model_dump() for s in skipped]
        )
        assert root.tree is not None  # _snapshot wrote every tree
        if (
            turn > 0
            and head is not None
            and head.tree_id == root.tree
            and same_skips
            and head_cp is not None
            and head_cp.meta == meta
            and head_cp.names == "store"
        ):
            self._drop_loose()  # a meta blob nobody names
            return None
        changed: list[str]
        if turn == 0:
            changed = []
        elif (
            hinted_changes is not None
            and head is not None
            and last is not None
            and last.ok
            and self._index.head == last.commit
            and head_cp is not None
            and head_cp.names == "store"
        ):
            changed = hinted_changes
        else:
            changed = self._changed(head.tree if head is not None else None, root.tree)
        sig = pygit2.Signature(*SIGNATURE)
        self._charge_object(256)
        commit = self.repo.create_commit(
            None, sig, sig, f"checkpoint after turn {turn}\n", root.tree, [head.id] if head is not None else []
        )
        self._record_packs |= self._pack_loose()
        used = self._measure()
        if used > self.budget_bytes:
            # Packed, the store is still over: this checkpoint is not kept, nor the packs of its objects.
            raise _StoreFull(self.budget_bytes, used)
        self.repo.references.create(f"refs/checkpoints/{turn}", commit, force=True)
        cp = Checkpoint(
            turn=turn,
            commit=str(commit),
            created=round(time.time(), 3),
            files_changed=changed[:CHANGED_LIST_CAP],
            files_changed_count=len(changed),
            skipped=skipped,
            meta=meta,
            names="store",
        )
        first = not any(c.ok for c in self._index.checkpoints)
        self._append(cp.model_copy(), str(commit), used)
        if first or not self._index.base_bytes:
            self._index.base_bytes = max(used, GROWTH_BYTES // 4)  # what later records grow from (saved below)
        self._merge_packs()
        self._index.used_bytes = self._measure()
        self._save_index(self._index)
        return cp

    def _write_meta(self, root: _Dir, dirs: builtins.list[_Dir]) -> str:
        """The blob of every entry whose mode or owner is not the default (0644 files, 0755
        executables and directories, the sandbox user): JSON keyed by to_store paths."""
        owner = self.box_user
        odd: dict[str, list[int]] = {}
        for d in dirs:
            if d.odd is None:
                d.odd = {}
                if d is not root and (d.meta[0] != 0o755 or d.meta[1:] != owner):
                    d.odd[to_store(d.rel)] = list(d.meta)
                for name, (_, mode, _, m) in d.files.items():
                    default = 0o777 if mode == MODE_LINK else (0o755 if mode == MODE_EXEC else 0o644)
                    if m[0] != default or m[1:] != owner:
                        d.odd[to_store(d.child_rel(name))] = list(m)
            odd.update(d.odd)
        data = json.dumps({"owner": list(owner), "modes": odd}, sort_keys=True, separators=(",", ":")).encode()
        oid = pygit2.hash(data)
        if oid not in self.repo:
            self._charge_object(len(data))
            self.repo.create_blob(data)
        return str(oid)

    def _changed(self, old: pygit2.Tree | None, new_tree: pygit2.Oid) -> builtins.list[str]:
        new = _object(self.repo, new_tree, pygit2.Tree)
        if old is None:
            return sorted(_tree_files(self.repo, new))
        # what repo.diff(old, new) runs for two trees, with its options
        paths = {
            d.new_file.path if d.status != pygit2.enums.DeltaStatus.DELETED else d.old_file.path
            for d in old.diff_to_tree(new, interhunk_lines=0).deltas
        }
        return sorted(paths)
