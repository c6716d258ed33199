"""What tests/unit/test_checkpoints.py shares with tests/box/test_checkpoints_box.py (and the 40,000-file
tree of tests/box/test_checkpoint_first.py and test_checkpoint_copy_baseline.py), kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def picture(ws: Path) -> dict[str, tuple]:
    """Everything restore must reproduce, .git entries aside: kind, exec bit, bytes or link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(ws):
        dirnames[:] = [d for d in dirnames if d.casefold() != ".git" and not os.path.islink(os.path.join(dirpath, d))]
        rel_dir = os.path.relpath(dirpath, ws)
        if rel_dir != ".":
            out[rel_dir] = ("dir",)
        for name in filenames + [
            d for d in os.listdir(dirpath) if os.path.islink(os.path.join(dirpath, d)) and d not in filenames
        ]:
            if name.casefold() == ".git":
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ws)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", bool(st.st_mode & 0o100), Path(path).read_bytes())
            else:
                out[rel] = ("special",)
    return out


BIG_DIRS, BIG_FILES = 200, 200  # 40,000 small files


def big_tree(root: Path, extra: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for d in range(BIG_DIRS):
        sub = root / f"d{d:03}"
        sub.mkdir()
        for f in range(BIG_FILES):
            (sub / f"f{f:03}.txt").write_bytes(b"file %d of directory %d\n" % (f, d))
    for rel, text in extra.items():
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_text(text)
    from tests.helpers import chown_tree

    chown_tree(root)
    return root
