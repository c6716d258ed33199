"""What tests/unit/test_review.py shares with tests/box/test_review_box.py, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.workspace.copy import CopyManifest, copy_workspace


def build(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def take_copy(real: Path, tmp_path: Path) -> tuple[CopyManifest, Path]:
    manifest = copy_workspace(real, tmp_path / "state" / "copy", os.getuid(), os.getgid())
    return manifest, Path(manifest.copy_dir)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (nothing followed): kind, mode, and content or link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            else:
                out[rel] = ("special", stat.S_IFMT(st.st_mode))
    return out
