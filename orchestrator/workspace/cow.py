"""Copy-on-write forks: the frozen layers a fork stands on, and a fork's own overlay.

Measured (bench/fork.py, 300 MB / 30k files on ext4 without reflinks): a fork by data copy costs
what `cp -a` costs and doubles the disk; a fork by overlay costs a rename, two directories and a
mount, and no data until it writes. So where the host may mount (workspace/overlay.py: root or
CAP_SYS_ADMIN, not in a user namespace) a fork is an overlay; elsewhere it is the data copy.

The parent must never change under a lower layer, so at a fork the parent's current state is
frozen first, by a rename (no data moves):
- a parent that is a plain copy: its `copy/` becomes the layer `layers/<id>/tree`, and the parent
  itself gets an overlay over it (its own upper, empty), so it goes on as before;
- a parent that is already an overlay and wrote since: it is unmounted, its upper becomes a new
  layer on top of its others, it gets a fresh upper and is mounted again;
- a parent whose upper holds nothing: its layers are used as they are.
Every fork then gets the parent's layers and an upper and work directory of its own in its own
session directory. A fork never shares a writable inode with its parent or a sibling: layers are
never written (overlayfs copies a file up into the writer's own upper first).

A frozen layer was box-written. Before it is used by anyone it is made inert as the data copy
makes a fork inert (what the end-of-session sweep would have moved out, if a host was killed
before it ran): FIFOs, sockets and devices are removed (an upper's whiteouts, devices 0/0, are
overlayfs's and stay), setuid/setgid bits are dropped, and a file hard-linked to a name outside the
layer gets an inode of its own, and every entry is the sandbox user's. This goes through boxfs:
a bounded walk, no link followed. The parent's view changes only in those entries. A layer goes
when no session that is not discarded stands on it (cleanup.discard_state, cleanup.prune).
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import state
from ..boxfs import BudgetExceeded, HostBudget, Walk
from ..config import SandboxConfig
from ..errors import OpenAgentsError
from . import quota_fs
from .cleanup import remove_entry
from .overlay import (
    MAX_LAYERS,
    Layers,
    OverlayError,
    layers_root,
    like_root,
    make_inert,
    mount,
    mount_lock,
    unmount,
    unusable,
)
from .records import SessionRecord

__all__ = ["fork_layers", "make_fork_copy"]


def fork_layers(parent: SessionRecord) -> list[str] | None:
    """The frozen layers a fork of `parent` (an ended copy session, under its resume lock) stands
    on, freezing its current state now if need be; None where forks are data copies (no
    privilege, a path the mount cannot carry, too many layers, a file system that refused)."""
    if unusable() is not None:
        return None
    with mount_lock(parent.dir):  # no other process mounts the parent's copy while it is frozen
        if parent.cow is None:
            if (
                parent.quota_fs is not None
            ):  # its copy lies on a file system of its own: no rename takes it into a layer
                return None
            return _freeze_copy(parent)
        if _empty(Path(parent.cow.upper)):
            return list(parent.cow.lowers)
        if (
            len(parent.cow.lowers) + 1 > MAX_LAYERS or parent.quota_fs is not None
        ):  # (an upper on its own file system, likewise)
            return None
        return _freeze_upper(parent)


def make_fork_copy(record: SessionRecord, lowers: list[str]) -> None:
    """The fork's copy: its own upper and work directory, and the overlay of `lowers` mounted at
    its `copy/` (saved in its record first, so a later process can mount it again)."""
    cow = record.dir / "cow"
    cow_dir(record)
    layers = Layers(lowers=lowers, upper=str(cow / "upper"), work=str(cow / "work"))
    os.mkdir(layers.upper, 0o700)
    os.mkdir(layers.work, 0o700)
    like_root(Path(layers.upper), Path(lowers[0]))
    target = Path(record.box_workspace)
    os.mkdir(target, 0o700)
    record.cow = layers
    record.save()
    mount(layers, target)


def cow_dir(record: SessionRecord) -> None:
    """The session's `cow/`, where its overlay's upper and work directories go: where the host may
    mount, a size-limited file system of its own (quota_fs: the write quota stops the box there),
    with room for the default quota until a box starts on it and sets its own."""
    cow = record.dir / "cow"
    if quota_fs.unusable() is not None:
        os.mkdir(cow, 0o700)
        return
    record.quota_fs = quota_fs.QuotaFs(image=str(record.dir / "cow.img"), mount=str(cow))
    record.save()
    size, inodes = quota_fs.image_size(0, 0, SandboxConfig.model_fields["write_quota"].default)
    quota_fs.create(Path(record.quota_fs.image), cow, size, inodes)


def _drop_cow_dir(record: SessionRecord) -> None:
    """cow/ (and its file system) gone again: a freeze undone."""
    unmount(record.dir / "cow")
    if record.quota_fs is not None:
        record.quota_fs = None
        record.save()
    remove_entry(record.dir, "cow")
    remove_entry(record.dir, "cow.img")


def _new_layer(source: Path) -> Path:
    """A new layer directory, naming what is being moved into it (a freeze cut short is finished by
    overlay.ensure_mounted)."""
    layer = layers_root() / state.new_id()
    os.mkdir(layer, 0o700)
    (layer / "source").write_text(str(source), encoding="utf-8")
    return layer / "tree"


def _freeze_copy(parent: SessionRecord) -> list[str] | None:
    target = Path(parent.box_workspace)
    if target.parent != parent.dir or not target.is_dir() or target.is_symlink():
        return None
    cow = parent.dir / "cow"
    tree = _new_layer(target)
    layers = Layers(lowers=[str(tree)], upper=str(cow / "upper"), work=str(cow / "work"))
    try:
        layers.options()
    except OverlayError:
        _drop_layer(tree.parent)
        return None
    # A plain directory, not a file system of its own (cow_dir): its upper becomes a layer by a rename
    # when the parent is forked again, so the parent's later runs have the watched quota only.
    os.mkdir(cow, 0o700)
    os.mkdir(layers.upper, 0o700)
    os.mkdir(layers.work, 0o700)
    parent.cow = layers
    parent.save()
    try:
        os.rename(target, tree)
        os.mkdir(target, 0o700)
        like_root(Path(layers.upper), tree)
        make_inert(tree, parent.user, tree.parent)
        mount(layers, target)
    except (OSError, OpenAgentsError):  # put back as it was: the parent's copy a plain directory again
        unmount(target)
        if tree.is_dir():
            if target.is_dir() and not target.is_symlink():
                os.rmdir(target)
            os.rename(tree, target)
        parent.drop_cow()
        parent.save()
        _drop_cow_dir(parent)
        _drop_layer(tree.parent)
        return None
    return [str(tree)]


def _freeze_upper(parent: SessionRecord) -> list[str] | None:
    assert parent.cow is not None
    target, old = Path(parent.box_workspace), parent.cow
    upper = Path(old.upper)
    tree = _new_layer(upper)
    layers = Layers(lowers=[str(tree), *old.lowers], upper=old.upper, work=old.work)
    try:
        layers.options()  # fits, or the fork is a data copy: nothing changed yet
    except OverlayError:
        _drop_layer(tree.parent)
        return None
    try:  # never detached: a process still in the copy would go on writing into what becomes a shared layer
        unmount(target, detach=False)
    except OverlayError:
        _drop_layer(tree.parent)
        return None
    # before the upper becomes a layer: one that cannot be made inert is never stood on, the parent goes on as it was
    try:
        make_inert(upper, parent.user, tree.parent)
    except (OSError, OpenAgentsError):
        _drop_layer(tree.parent)
        mount(old, target)
        return None
    parent.cow = layers
    parent.save()
    os.rename(upper, tree)
    os.mkdir(upper, 0o700)
    like_root(upper, tree)
    remove_entry(Path(old.work).parent, Path(old.work).name)  # overlayfs's scratch space, left from the last mount
    os.mkdir(old.work, 0o700)
    mount(layers, target)
    return list(layers.lowers)


def _empty(directory: Path) -> bool:
    try:
        return (
            next(iter(Walk(directory, HostBudget.until(10.0, max_entries=2, max_bytes=None)).entries()), None) is None
        )
    except (BudgetExceeded, OSError):
        return False


def _drop_layer(layer: Path) -> None:
    try:
        remove_entry(layer.parent, layer.name)
    except OSError:
        pass
