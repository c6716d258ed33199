#!/usr/bin/env python3
"""Host work on box data, bounded: time and peak host memory of each thing the host does with a
box-written workspace, against `cp -a` of the same tree in the same run.

    python bench/hostwork.py [--empty-files 300000] [--megabytes 100] [--json PATH]

Two workspaces: one of many empty files (what costs inodes, not bytes) and one of 100 MB of data.
Each operation runs in a child process of its own, so its peak RSS (wait4's ru_maxrss) is its own:
copy (copy mode's private copy), sweep (baseline + the integrity sweep), checkpoint (turn 0 into the
shadow store), changes (the diff of a copy session with one file changed), preview (the approval
diff of an edit of the largest file) and rollback (restore turn 0 after the box changed files).
Only ratios compare: absolute figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ("copy", "sweep", "checkpoint", "changes", "preview", "rollback")


def make_empty_files(root: Path, count: int, per_dir: int = 1000) -> None:
    root.mkdir(parents=True)
    for d in range((count + per_dir - 1) // per_dir):
        sub = root / f"d{d:04d}"
        sub.mkdir()
        fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(min(per_dir, count - d * per_dir)):
                os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        finally:
            os.close(fd)


def make_data(root: Path, megabytes: int) -> None:
    root.mkdir(parents=True)
    for i in range(megabytes):
        sub = root / f"d{i // 10}"
        sub.mkdir(exist_ok=True)
        # text, so changes and the preview diff real lines
        line = f"line {i} of a generated file, to diff and to checkpoint\n".encode()
        (sub / f"f{i}.txt").write_bytes(line * ((1 << 20) // len(line)))


def largest_file(ws: Path) -> str:
    best, size = "", -1
    for dirpath, _, names in os.walk(ws):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_size > size:
                best, size = os.path.relpath(os.path.join(dirpath, name), ws), st.st_size
    return best


def child(op: str, ws: Path, scratch: Path) -> None:
    """One operation, in this (child) process. Set-up that is not the operation is done before the clock."""
    from orchestrator.sandbox.sweep_journal import capture_baseline
    from orchestrator.workspace.checkpoints import CheckpointStore
    from orchestrator.workspace.integrity import Sweeper

    started = time.monotonic()
    if op == "copy":
        from orchestrator.workspace.copy import copy_workspace

        copy_workspace(ws, scratch / "copy", 1000, 1000)
    elif op == "sweep":
        baseline = capture_baseline(ws)
        Sweeper(ws, baseline, scratch / "quarantine").sweep()
    elif op == "checkpoint":
        CheckpointStore(scratch / "store", ws).record(0)
    elif op == "changes":
        from orchestrator.workspace.copy import copy_workspace
        from orchestrator.workspace.review import list_changes, render_diff

        manifest = copy_workspace(ws, scratch / "copy", os.getuid(), os.getgid())
        target = scratch / "copy" / largest_file(ws)
        with open(target, "ab") as fh:
            fh.write(b"changed by the box\n")
        started = time.monotonic()
        for _ in render_diff(manifest, list_changes(manifest)):
            pass
    elif op == "preview":
        from orchestrator.models.base import ToolCall
        from orchestrator.tools.registry import ToolRegistry
        from orchestrator.workspace.preview import proposed_diff

        rel = largest_file(ws)
        registry = ToolRegistry(None, ws)  # type: ignore[arg-type]  # prepare() never touches the sandbox
        call = ToolCall(
            id="1",
            name="edit_file",
            arguments={"path": rel, "old_text": "line", "new_text": "LINE" * 64, "allow_multiple": True},
        )
        started = time.monotonic()
        proposed_diff(ws, registry.prepare(call))
    elif op == "rollback":
        work = scratch / "work"
        shutil.copytree(ws, work, symlinks=True)
        store = CheckpointStore(scratch / "store", work)
        store.record(0)
        for dirpath, _, names in os.walk(work):
            for name in names[:1]:
                with open(os.path.join(dirpath, name), "ab") as fh:
                    fh.write(b"x")
        store.record(1)
        started = time.monotonic()
        store.restore(0)
    print(json.dumps({"seconds": time.monotonic() - started}))


def run_child(op: str, ws: Path) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix=f"oa-hostwork-{op}-"))
    try:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", op, str(ws), str(scratch)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            return {
                "error": err.decode(errors="replace").strip().splitlines()[-1:] or ["failed"],
                "peak_mib": usage.ru_maxrss / 1024,
            }
        return {
            "seconds": json.loads(out.decode().strip().splitlines()[-1])["seconds"],
            "peak_mib": usage.ru_maxrss / 1024,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cp_a(ws: Path) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="oa-hostwork-cp-"))
    try:
        started = time.monotonic()
        proc = subprocess.Popen(["cp", "-a", str(ws), str(scratch / "copy")])
        _, status, usage = os.wait4(proc.pid, 0)
        return {"seconds": time.monotonic() - started, "peak_mib": usage.ru_maxrss / 1024}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("OP", "WS", "SCRATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--empty-files", type=int, default=300_000)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return 0
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="oa-hostwork-") as tmp:
        trees = {
            f"{args.empty_files} empty files": lambda p: make_empty_files(p, args.empty_files),
            f"{args.megabytes} MB of data": lambda p: make_data(p, args.megabytes),
        }
        for label, make in trees.items():
            ws = Path(tmp) / label.replace(" ", "-")
            make(ws)
            base = cp_a(ws)
            rows = {"cp -a": base}
            print(f"\n{label}: cp -a {base['seconds']:.2f} s, peak {base['peak_mib']:.0f} MiB")
            print(f"  {'operation':<11} {'seconds':>8} {'x cp -a':>8} {'peak MiB':>9}")
            for op in args.ops.split(","):
                row = run_child(op, ws)
                rows[op] = row
                if "error" in row:
                    print(f"  {op:<11} failed: {row['error']}")
                    continue
                print(
                    f"  {op:<11} {row['seconds']:>8.2f} "
                    f"{row['seconds'] / max(base['seconds'], 1e-6):>8.2f} {row['peak_mib']:>9.0f}"
                )
            results[label] = rows
            shutil.rmtree(ws)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
