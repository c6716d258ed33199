"""What tests/unit/test_checkpoints.py shares with tests/box/test_checkpoints_box.py, kept here
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
