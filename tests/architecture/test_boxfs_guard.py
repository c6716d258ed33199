"""Guard: fd-relative, link-refusing and tree-walking file access lives in orchestrator/boxfs/ only.

Everything the box wrote is hostile, and the rules for touching it (no link followed, no parent
swapped between a check and its use, bounded) are written once, in boxfs (its `BoxDir` handle,
`Walk`, the readers). A file elsewhere that spells openat/fstatat (`dir_fd=`), O_NOFOLLOW,
O_DIRECTORY, O_PATH, a walker (os.walk/fwalk/scandir/listdir, Path.rglob/iterdir/glob, any of them
imported by name), a tree remover or copier of its own (shutil.rmtree/copytree: boxfs.remove_path) or
boxfs's private directory flags has started its own copy of those rules, which this test refuses.

ALLOWED is short and names only host-owned files the box can never write, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"
BOXFS = ROOT / "boxfs"

FLAGS = {"O_NOFOLLOW", "O_DIRECTORY", "O_PATH"}
FD_KEYWORDS = {"dir_fd", "src_dir_fd", "dst_dir_fd"}
OS_WALKERS = {"walk", "fwalk", "scandir", "listdir"}
PATH_WALKERS = {"rglob", "iterdir", "glob"}
SHUTIL_TREES = {"rmtree", "copytree"}
PRIVATE = {"DIR_FLAGS", "FILE_FLAGS"}

# (file relative to orchestrator/, what) -> why it is not box-written data
ALLOWED: dict[tuple[str, str], str] = {
    (
        "sandbox/image.py",
        "rglob",
    ): "hashes our own package's source files (sandbox_agent/, compose/proxy/) for the image tag",
    (
        "sandbox/debootstrap.py",
        "glob",
    ): "lists the host's /etc/apt/sources.list.d for the base image's build (the host's own files)",
    (
        "sandbox/egress_tls.py",
        "shutil.rmtree",
    ): "removes the gate's CA directory, which the host made 0700 for itself and never mounts in a box",
    ("state.py", "os.scandir"): "asks whether the user's state directory (host-owned, never mounted in a box) is empty",
    (
        "workspace/quota_fs.py",
        "glob",
    ): "lists the kernel's loop devices under /sys/block (which image each is attached to: never a box's file)",
    (
        "workspace/records.py",
        "os.listdir",
    ): "lists session ids under the state directory (host-owned; the copies under it are walked by boxfs)",
    (
        "workspace/cleanup.py",
        "os.listdir",
    ): "lists a session directory's and the layers directory's top names (host-owned; each is removed by boxfs)",
    (
        "sandbox/sweep_journal.py",
        "os.listdir",
    ): "lists the sweep journal's own files in the state directory (host-owned)",
    (
        "cli/__init__.py",
        "os.listdir",
    ): "whether the sweep journal's directory (host-owned, in the state directory) holds a journal, "
    "before importing sweep_journal.py to read them",
    (
        "workspace/checkpoints/objects.py",
        "os.scandir",
    ): "sizes the checkpoint store's git object directory (host-owned, written by libgit2 for us)",
    (
        "workspace/checkpoints/objects.py",
        "iterdir",
    ): "lists the checkpoint store's pack files (host-owned, written by libgit2 for us)",
}


def _offences(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FLAGS:
            found.append((f"os.{node.attr}", node.lineno))
        elif isinstance(node, ast.Name) and node.id in FLAGS | PRIVATE:
            found.append((node.id, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in FLAGS | PRIVATE:
                    found.append((alias.name, node.lineno))
                elif (node.module, alias.name) in {("os", w) for w in OS_WALKERS} | {
                    ("shutil", t) for t in SHUTIL_TREES
                }:
                    found.append((f"{node.module}.{alias.name}", node.lineno))
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in FD_KEYWORDS:
                    found.append((f"{kw.arg}=", node.lineno))
            func = node.func
            if isinstance(func, ast.Attribute):
                if func.attr in OS_WALKERS and isinstance(func.value, ast.Name) and func.value.id == "os":
                    found.append((f"os.{func.attr}", node.lineno))
                elif func.attr in SHUTIL_TREES and isinstance(func.value, ast.Name) and func.value.id == "shutil":
                    found.append((f"shutil.{func.attr}", node.lineno))
                elif func.attr in PATH_WALKERS:
                    found.append((func.attr, node.lineno))
    return found


def test_no_file_access_of_its_own_outside_boxfs() -> None:
    bad: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted(ROOT.rglob("*.py")):
        if BOXFS in path.parents:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for what, line in _offences(path):
            if (rel, what) in ALLOWED:
                used.add((rel, what))
                continue
            bad.append(f"orchestrator/{rel}:{line}: {what}")
    assert not bad, "fd-relative or walking file access outside orchestrator/boxfs/ (use boxfs.BoxDir):\n" + "\n".join(
        bad
    )
    assert used == set(ALLOWED), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_guard_sees_each_form(tmp_path: Path) -> None:
    """The guard is not blind: every form it refuses is found in a sample."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nfrom pathlib import Path\nfrom orchestrator.boxfs.read import DIR_FLAGS\n"
        "os.open('a', os.O_RDONLY | os.O_NOFOLLOW)\nos.open('b', os.O_DIRECTORY)\nos.stat('c', dir_fd=3)\n"
        "os.rename('a', 'b', src_dir_fd=3, dst_dir_fd=4)\nos.walk('.')\nos.scandir('.')\nos.listdir(3)\n"
        "Path('.').rglob('*')\nPath('.').iterdir()\nos.open('d', os.O_PATH)\n"
        "import shutil\nfrom os import walk\nfrom shutil import copytree\nshutil.rmtree('x')\nPath('.').glob('*')\n"
    )
    kinds = {what for what, _ in _offences(sample)}
    assert kinds == {
        "DIR_FLAGS",
        "os.O_NOFOLLOW",
        "os.O_DIRECTORY",
        "os.O_PATH",
        "dir_fd=",
        "src_dir_fd=",
        "dst_dir_fd=",
        "os.walk",
        "os.scandir",
        "os.listdir",
        "rglob",
        "iterdir",
        "glob",
        "shutil.rmtree",
        "shutil.copytree",
    }
