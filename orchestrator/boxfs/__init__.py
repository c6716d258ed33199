"""The one layer through which host code touches box-written files.

After the box's first command every entry of the workspace is hostile data: a symlink to a host
secret, a FIFO that blocks the reader, a device, a setuid binary, a sparse file of terabytes, a
300k-inode tree of empty files, a 1,000-deep directory chain, a name with a newline or invalid
UTF-8, a file swapped for a link between a check and its use. Host code never walks, reads,
copies, restores or shows such entries by hand: it goes through here, so the rules below are
written, and attacked (tests/attacks/test_boxfs.py), once:

- walking is iterative (never recursive), fd-relative, follows no link and is bounded by a
  `HostBudget` (entries, depth, bytes, wall time);
- reading opens regular files only (O_NOFOLLOW|O_NONBLOCK, fstat checked), size-capped;
- copying keeps holes, deduplicates hard links by inode, charges what it writes;
- restoring writes a temporary name and renames it (atomic), with owner and mode given by the
  caller, never wider than asked;
- names are bytes inside; `show()` is the one way a name reaches a person.

`BoxDir` (tree.py) is the handle consumers hold: a directory opened once, no link followed, with
every act on its entries as a method bounded by its budget. Outside this package no host code
spells openat, fstatat, `dir_fd=`, O_NOFOLLOW/O_DIRECTORY or a walker of its own
(tests/architecture/test_boxfs_guard.py fails when one does).
"""

from .budget import BudgetExceeded, HostBudget
from .copy import HardLinks, copy_regular, punch_copy
from .landing import land_file, land_tree
from .names import from_store, show, to_store
from .read import lstat_at, open_dir, open_parent, open_regular, read_at
from .restore import remove_tree, write_atomic
from .tree import BoxDir, lstat_workspace, read_workspace_file, remove_path
from .walk import Entry, Walk, kind_of

__all__ = [
    "BoxDir",
    "BudgetExceeded",
    "Entry",
    "HardLinks",
    "HostBudget",
    "Walk",
    "copy_regular",
    "from_store",
    "kind_of",
    "land_file",
    "land_tree",
    "lstat_at",
    "lstat_workspace",
    "open_dir",
    "open_parent",
    "open_regular",
    "punch_copy",
    "read_at",
    "read_workspace_file",
    "remove_path",
    "remove_tree",
    "show",
    "to_store",
    "write_atomic",
]
